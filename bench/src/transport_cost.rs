//! `torus-bench transport-cost`: pushes messages through a sender and a receiver joined by
//! a lossless in-memory link, with no simulated network in between, so that an instruction
//! counter (bench/transport-cost.sh runs it under callgrind) sees only the transport core.

use std::hint::black_box;
use std::time::Duration;

use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::{
    Config, EventRef, Fences, LinkSet, Outgoing, SendError, Transport,
};

/// Options of `torus-bench transport-cost`.
#[derive(clap::Args)]
pub struct Args {
    /// Messages to push through.
    #[arg(long, default_value_t = 200_000)]
    messages: u64,
    /// Message size in bytes.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Turn aggregation off (one message per frame).
    #[arg(long)]
    no_aggregation: bool,
    /// Link MTU.
    #[arg(long, default_value_t = 1500)]
    mtu: usize,
}

pub fn run(a: &Args) -> Result<(), String> {
    let cfg = Config {
        aggregate: !a.no_aggregation,
        mtu: a.mtu,
        ..Config::default()
    };
    let src = Coord::new(0, 0, 0);
    let dst = Coord::new(1, 0, 0);
    let mut tx = Transport::new(src, cfg);
    let mut rx = Transport::new(dst, cfg);
    let links = |_: Coord| LinkSet::first(2);
    let mut buf = vec![0u8; 14 + a.mtu];
    let data = vec![0x5a; a.size];
    let mut now = Time::ZERO;
    let (mut delivered, mut bytes) = (0u64, 0u64);
    let mut sent = 0u64;
    while delivered < a.messages {
        while sent < a.messages {
            let m = Outgoing {
                dest: dst,
                service: 1,
                data: &data,
                reliable: true,
                fences: Fences::default(),
                tag: sent,
                from: 1,
            };
            match tx.send(now, m) {
                Ok(()) => sent += 1,
                Err(SendError::WouldBlock) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        while let Some(t) = tx.poll_transmit(now, LinkSet::first(2), &links, &mut buf) {
            rx.handle_frame(now, &buf[..t.len])
                .map_err(|e| e.to_string())?;
        }
        // Read by reference, as the dataplane's hosted services do: no allocation per message.
        while let Some(e) = rx.poll_event_ref() {
            if let EventRef::Message { data, .. } = e {
                delivered += 1;
                bytes += data.len() as u64;
            }
        }
        // The receiver's delayed ACKs fire as time moves on.
        now = now + Duration::from_micros(50);
        for t in [&mut tx, &mut rx] {
            if t.poll_timeout().is_some_and(|d| d <= now) {
                t.handle_timeout(now);
            }
        }
        while let Some(t) = rx.poll_transmit(now, LinkSet::first(2), &links, &mut buf) {
            tx.handle_frame(now, &buf[..t.len])
                .map_err(|e| e.to_string())?;
        }
    }
    let s = tx.stats();
    println!(
        "{{\"messages\":{},\"bytes\":{},\"data_frames\":{},\"retransmitted_frames\":{},\"ack_frames\":{},\"messages_per_frame\":{:.2}}}",
        black_box(delivered),
        bytes,
        s.data_frames,
        s.retransmitted_frames,
        rx.stats().ack_frames,
        s.messages_sent as f64 / s.data_frames.max(1) as f64
    );
    Ok(())
}
