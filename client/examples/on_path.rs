//! An on-path service (CamCube's per-hop API): an application that intercepts its service
//! on its server and acts on each frame passing through by what it carries:
//! `pass:...` goes on as it was, `change:...` goes on as `changed:...`, `drop:...` goes no
//! further, `get:K` is answered from its cache (`answer:K` to the sender) and dropped, and
//! anything else gets no verdict (it goes on as it was at the deadline).
//!
//! `on_path SOCKET NAME SECONDS`: intercepts for that long, then prints one JSON line of
//! what it did.

use std::time::{Duration, Instant};

use torusnet_client::{Client, Dest, Error, Event, OnPath, SendOptions, Wait};

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let (Some(sock), Some(name), Some(secs)) = (args.next(), args.next(), args.next()) else {
        eprintln!("usage: on_path SOCKET NAME SECONDS");
        std::process::exit(2);
    };
    let secs: u64 = secs.parse().unwrap_or(5);
    let c = Client::attach(&sock, &name)?;
    c.intercept(true)?;
    println!("{{\"intercepting\":true}}");
    let (mut passed, mut changed, mut dropped, mut answered, mut left) = (0, 0, 0, 0, 0);
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        let Some(Event::Intercepted { id, from, data, .. }) =
            c.recv(Wait::Timeout(Duration::from_millis(100)))?
        else {
            continue;
        };
        if data.starts_with(b"pass:") {
            c.verdict(id, OnPath::Pass)?;
            passed += 1;
        } else if let Some(rest) = data.strip_prefix(b"change:") {
            let mut new = b"changed:".to_vec();
            new.extend_from_slice(rest);
            c.verdict(id, OnPath::Change(&new))?;
            changed += 1;
        } else if data.starts_with(b"drop:") {
            c.verdict(id, OnPath::Drop)?;
            dropped += 1;
        } else if let Some(k) = data.strip_prefix(b"get:") {
            let mut answer = b"answer:".to_vec();
            answer.extend_from_slice(k);
            c.send(Dest::Service(from), &answer, SendOptions::short())?;
            c.verdict(id, OnPath::Drop)?;
            answered += 1;
        } else {
            left += 1;
        }
    }
    println!(
        "{{\"passed\":{passed},\"changed\":{changed},\"dropped\":{dropped},\"answered\":{answered},\"left\":{left}}}"
    );
    Ok(())
}
