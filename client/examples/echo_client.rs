//! Echo client: finds a service by name, sends it `COUNT` checked reliable messages (16 B to
//! 60 KB, so many span several frames) and `COUNT` short ones, makes a call, and prints one
//! JSON line; exits 0 when every reliable echo came back intact.
//!
//! `echo_client SOCKET NAME COUNT`.

use std::time::{Duration, Instant};

use torusnet_client::{Client, Dest, Error, Event, SendOptions, Wait};

fn payload(i: u64, n: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let socket = args
        .next()
        .unwrap_or_else(|| "/run/torusnet/torus-apps.sock".into());
    let name = args.next().unwrap_or_else(|| "echo".into());
    let count: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let c = Client::attach(
        &socket,
        &format!("{name}-rust-client-{}", std::process::id()),
    )?;
    let at = c.resolve(&name, Duration::from_secs(2))?;
    let server = *at.first().ok_or_else(|| Error::NotFound(name.clone()))?;
    let (mut ok, mut bad, mut short_back) = (0u64, 0u64, 0u64);
    let t0 = Instant::now();
    for i in 0..count {
        let msg = payload(i, 16 + (i as usize * 7919) % 60000);
        c.send(Dest::Service(server), &msg, SendOptions::reliable())?;
        loop {
            match c.recv(Wait::Timeout(Duration::from_secs(3)))? {
                Some(Event::Message { data, .. }) => {
                    if data == msg {
                        ok += 1;
                    } else {
                        bad += 1;
                    }
                    break;
                }
                Some(_) => continue,
                None => {
                    bad += 1;
                    break;
                }
            }
        }
    }
    let rtt = t0.elapsed().as_secs_f64() * 1e6 / count.max(1) as f64;
    for i in 0..count {
        let msg = payload(1_000_000 + i, 64);
        c.send(Dest::Service(server), &msg, SendOptions::short())?;
        if let Some(Event::Message { data, .. }) =
            c.recv(Wait::Timeout(Duration::from_millis(200)))?
        {
            short_back += u64::from(data == msg);
        }
    }
    let reply = c.call(
        Dest::Service(server),
        b"ping from Rust",
        Duration::from_secs(3),
    )?;
    let call_ok = reply == b"ping from Rust";
    println!(
        "{{\"lang\":\"rust\",\"server\":[{},{},{}],\"reliable_ok\":{ok},\"reliable_bad\":{bad},\"short_back\":{short_back},\"count\":{count},\"call_ok\":{call_ok},\"rtt_us\":{rtt:.1}}}",
        server.server.0, server.server.1, server.server.2
    );
    if ok == count && call_ok {
        Ok(())
    } else {
        std::process::exit(1)
    }
}
