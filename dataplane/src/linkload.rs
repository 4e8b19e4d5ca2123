//! Per-link load as the poller sees it: every few milliseconds, each link's byte counters
//! and TX queue become a moving average (`torusnet_proto::routing::load`), which the engine
//! reads for path probes and `torusctl status` shows.

use std::sync::atomic::Ordering;
use std::time::Duration;

use torusnet_proto::routing::load::{LinkLoad, LinkMeter};
use torusnet_proto::time::Time;
use torusnet_proto::topology::Dir;

use crate::counters::LinkCounters;

/// How often the links are sampled.
pub const PERIOD: Duration = Duration::from_millis(10);

/// The meters of one poller's links.
#[derive(Debug)]
pub struct LinkLoads {
    meters: Vec<(Dir, LinkMeter)>,
    next: Time,
}

impl LinkLoads {
    /// Meters for links in these directions (a poller's ports, in order), each of
    /// `capacity_bps`.
    pub fn new(dirs: impl Iterator<Item = Dir>, capacity_bps: u64) -> LinkLoads {
        LinkLoads {
            meters: dirs.map(|d| (d, LinkMeter::new(capacity_bps))).collect(),
            next: Time::ZERO,
        }
    }

    /// Whether a sample is due at `now`.
    pub fn due(&self, now: Time) -> bool {
        now >= self.next
    }

    /// Samples port `i` (its counters, the bytes the XDP program forwarded out of and in
    /// from it, and its TX queue depth); returns its averaged load, which is also published
    /// in its counters.
    pub fn sample(
        &mut self,
        now: Time,
        i: usize,
        c: &LinkCounters,
        xdp: (u64, u64),
        queue: u32,
    ) -> Option<(Dir, LinkLoad)> {
        let (dir, m) = self.meters.get_mut(i)?;
        let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        m.sample(
            now,
            g(&c.tx_bytes) + xdp.0,
            g(&c.rx_bytes) + xdp.1,
            u64::from(queue),
        );
        let l = m.load();
        c.load_tx_permille.store(l.tx_permille(), Ordering::Relaxed);
        c.load_rx_permille.store(l.rx_permille(), Ordering::Relaxed);
        c.load_queue_milli.store(l.queue_milli, Ordering::Relaxed);
        Some((*dir, l))
    }

    /// Call after sampling every port at `now`.
    pub fn sampled(&mut self, now: Time) {
        self.next = now + PERIOD;
    }
}
