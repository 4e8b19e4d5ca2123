//! Per-link load: a moving average of each link's utilisation in both directions and of
//! its transmit queue, from counters the driver samples. What operators read in
//! `torusctl status`, and what path probes collect as available bandwidth.

use crate::time::Time;

/// Weight of a new sample in the moving average, per mille: with samples every 10 ms,
/// about the last 50 ms count.
const WEIGHT_PERMILLE: u64 = 200;

/// The load of one link, as a moving average.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkLoad {
    /// Bits per second sent, averaged.
    pub tx_bps: u64,
    /// Bits per second received, averaged.
    pub rx_bps: u64,
    /// Frames waiting to be sent on the link, averaged (x1000).
    pub queue_milli: u64,
    /// The link's capacity, bits per second.
    pub capacity_bps: u64,
}

impl LinkLoad {
    /// Fraction of the capacity used sending, per mille.
    pub fn tx_permille(&self) -> u64 {
        permille(self.tx_bps, self.capacity_bps)
    }

    /// Fraction of the capacity used receiving, per mille.
    pub fn rx_permille(&self) -> u64 {
        permille(self.rx_bps, self.capacity_bps)
    }

    /// Capacity left sending, Mb/s.
    pub fn tx_free_mbps(&self) -> u32 {
        mbps(self.capacity_bps.saturating_sub(self.tx_bps))
    }

    /// Capacity left receiving, Mb/s.
    pub fn rx_free_mbps(&self) -> u32 {
        mbps(self.capacity_bps.saturating_sub(self.rx_bps))
    }
}

/// Frames of standing queue that count as the link's whole capacity again in its
/// telemetry level (about a round trip's worth of frames on the paths measured here).
pub const QUEUE_REF: u64 = 8;

/// A link's load as frames record it in their telemetry ([`crate::wire::raise_cong`]):
/// its transmit rate over its capacity plus its queue over [`QUEUE_REF`] frames, in
/// hundredths, at least 1 (0 means no telemetry) and at most 255. `queue_milli` is the
/// queue in thousandths of frames. The simulator's links, the poller and the XDP program's
/// levels are all this function's.
pub fn level(tx_permille: u64, queue_milli: u64) -> u8 {
    let l = tx_permille / 10 + queue_milli / 10 / QUEUE_REF;
    l.clamp(1, 255) as u8
}

impl LinkLoad {
    /// This load as a telemetry level ([`level`]), not counting as queue the first
    /// `batch_frames` frames of it: frames a driver puts out in batches (an AF_XDP transmit
    /// ring the kernel drains a batch per kick, its completions reaped a batch at a time)
    /// wait that many without any link being behind.
    pub fn level(&self, batch_frames: u64) -> u8 {
        level(
            self.tx_permille(),
            self.queue_milli.saturating_sub(batch_frames * 1000),
        )
    }
}

fn permille(part: u64, whole: u64) -> u64 {
    (u128::from(part) * 1000 / u128::from(whole.max(1))).min(1000) as u64
}

fn mbps(bps: u64) -> u32 {
    u32::try_from(bps / 1_000_000).unwrap_or(u32::MAX)
}

/// Turns one link's running byte counters and queue depth into a [`LinkLoad`].
#[derive(Debug, Clone, Copy)]
pub struct LinkMeter {
    load: LinkLoad,
    last: Option<(Time, u64, u64)>,
}

impl LinkMeter {
    /// A meter for a link of `capacity_bps`.
    pub fn new(capacity_bps: u64) -> LinkMeter {
        LinkMeter {
            load: LinkLoad {
                capacity_bps,
                ..LinkLoad::default()
            },
            last: None,
        }
    }

    /// Takes a sample: the link's byte counters since it came up and its queue now.
    pub fn sample(&mut self, now: Time, tx_bytes: u64, rx_bytes: u64, queue: u64) {
        let avg =
            |old: u64, new: u64| (old * (1000 - WEIGHT_PERMILLE) + new * WEIGHT_PERMILLE) / 1000;
        if let Some((t, tx, rx)) = self.last {
            let ns = now.since(t).as_nanos() as u64;
            if ns == 0 {
                return;
            }
            let rate = |d: u64| (u128::from(d) * 8 * 1_000_000_000 / u128::from(ns)) as u64;
            self.load.tx_bps = avg(self.load.tx_bps, rate(tx_bytes.saturating_sub(tx)));
            self.load.rx_bps = avg(self.load.rx_bps, rate(rx_bytes.saturating_sub(rx)));
        }
        self.load.queue_milli = avg(self.load.queue_milli, queue * 1000);
        self.last = Some((now, tx_bytes, rx_bytes));
    }

    /// The averaged load.
    pub fn load(&self) -> LinkLoad {
        self.load
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn converges_to_the_rate_and_reports_what_is_free() {
        let mut m = LinkMeter::new(10_000_000_000);
        let mut t = Time::ZERO;
        let mut tx = 0u64;
        for _ in 0..100 {
            m.sample(t, tx, 0, 4);
            t = t + Duration::from_millis(10);
            tx += 5_000_000; // 4 Gb/s for 10 ms
        }
        let l = m.load();
        assert!((3_990_000_000..=4_000_000_000).contains(&l.tx_bps), "{l:?}");
        assert_eq!(l.tx_permille(), 399);
        assert_eq!(l.rx_permille(), 0);
        assert_eq!(l.rx_free_mbps(), 10_000);
        assert!((6_000..=6_010).contains(&l.tx_free_mbps()));
        assert!((3_990..=4_000).contains(&l.queue_milli));
        // Same instant twice: nothing changes.
        m.sample(Time::from_nanos(t.as_nanos() - 10_000_000), tx, 0, 4);
        assert_eq!(m.load(), l);
    }
}
