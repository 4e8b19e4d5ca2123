//! Echo client: finds the echo service by name, sends it checked messages (reliable and
//! short) and a request, and prints what came back.
//!
//! `echo_client SOCKET [NAME] [COUNT]`.

use std::time::{Duration, Instant};

use torusnet_client::{Client, Dest, Error, Event, SendOptions, Wait};

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let socket = args
        .next()
        .unwrap_or_else(|| "/run/torusnet/torus-apps.sock".into());
    let name = args.next().unwrap_or_else(|| "echo".into());
    let count: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let c = Client::attach(&socket, &format!("echo-client-{}", std::process::id()))?;
    let at = c.resolve(&name, Duration::from_secs(2))?;
    let server = *at.first().ok_or_else(|| Error::NotFound(name.clone()))?;
    println!(
        "{name} runs at {:?} (service {})",
        server.server, server.service
    );
    let mut ok = 0;
    let t0 = Instant::now();
    for i in 0..count {
        let msg = format!("hello {i}").into_bytes();
        c.send(Dest::Service(server), &msg, SendOptions::reliable())?;
        loop {
            match c.recv(Wait::Timeout(Duration::from_secs(2)))? {
                Some(Event::Message { data, .. }) if data == msg => {
                    ok += 1;
                    break;
                }
                Some(_) => continue,
                None => {
                    eprintln!("no echo for message {i}");
                    break;
                }
            }
        }
    }
    let rtt = t0.elapsed() / count.max(1) as u32;
    println!(
        "{ok} of {count} reliable echoes, {:.1} us per round trip",
        rtt.as_secs_f64() * 1e6
    );
    let reply = c.call(Dest::Service(server), b"request", Duration::from_secs(2))?;
    println!("call: {:?}", String::from_utf8_lossy(&reply));
    Ok(())
}
