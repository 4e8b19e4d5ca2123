//! Echo server: attaches as a named service and sends every message back to its sender,
//! and answers every request with the same bytes.
//!
//! `echo_server SOCKET [NAME]` (NAME defaults to "echo").

use std::time::Duration;

use torusnet_client::{Client, Dest, Error, Event, SendOptions, Wait};

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let socket = args
        .next()
        .unwrap_or_else(|| "/run/torusnet/torus-apps.sock".into());
    let name = args.next().unwrap_or_else(|| "echo".into());
    let c = Client::attach(&socket, &name)?;
    eprintln!(
        "echo_server: {name} is service {} at {:?}",
        c.service_id(),
        c.local()
    );
    loop {
        let event = c.serve(Wait::Timeout(Duration::from_secs(1)), |_from, req| {
            req.to_vec()
        })?;
        if let Some(Event::Message {
            from,
            data,
            reliable,
            ..
        }) = event
        {
            let opts = if reliable {
                SendOptions::reliable()
            } else {
                SendOptions::short()
            };
            // A full channel: wait for room rather than drop the echo.
            loop {
                match c.send(Dest::Service(from), &data, opts) {
                    Err(Error::WouldBlock) => std::thread::sleep(Duration::from_micros(50)),
                    r => {
                        r?;
                        break;
                    }
                }
            }
        }
    }
}
