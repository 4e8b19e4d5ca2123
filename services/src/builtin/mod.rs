//! The services built into `torusd`, run inside its pollers so that they measure the stack
//! and not a thread hand-off. Each ends every run it starts: with a result, a failure report
//! from the transport, or its deadline, so "already in progress" never outlives its run.

pub mod bench;
pub mod keys;
pub mod load;
pub mod ping;

use std::time::Duration;

use torusnet_proto::service::Service;

pub use bench::{Bench, BenchRequest, BENCH};
pub use keys::{Keys, KeysRequest, KEYS};
pub use load::{Load, LoadRequest, LOAD};
pub use ping::{Ping, PingRequest, PING};

/// A journal a built-in service writes from the start.
pub type Journal = Box<dyn std::io::Write + Send>;

/// One instance of every built-in service, for a poller to host; the load and key services
/// write their journals from the start when given one.
pub fn all(load_journal: Option<Journal>, keys_journal: Option<Journal>) -> Vec<Box<dyn Service>> {
    vec![
        Box::new(Ping::default()),
        Box::new(Bench::default()),
        Box::new(match keys_journal {
            Some(j) => Keys::with_journal(j),
            None => Keys::default(),
        }),
        Box::new(match load_journal {
            Some(j) => Load::with_journal(j),
            None => Load::default(),
        }),
        Box::new(crate::names::Names::default()),
    ]
}

/// A 64-bit checksum of a message, 8 bytes at a time (a byte-at-a-time hash dominated the
/// bench service's cost at jumbo sizes).
pub fn fnv(data: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ data.len() as u64;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        h = (h ^ w).wrapping_mul(0x100_0000_01b3).rotate_left(29);
    }
    for b in chunks.remainder() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// The `p` percentile of sorted nanoseconds, in microseconds.
pub fn percentile_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

/// Seconds, for messages.
pub fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}
