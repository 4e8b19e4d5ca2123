//! The receiving half of a connection's sliding window: which frames have arrived, the
//! cumulative and selective acknowledgement to send back, when an explicit (delayed) ACK is
//! due, and when a gap is old enough to NACK.

use std::time::Duration;

use super::seqnum;
use crate::time::Time;

/// What the receive window made of an arriving frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// First copy of a frame inside the window: process its messages.
    New,
    /// A frame already received: discard it (and re-acknowledge).
    Duplicate,
    /// A sequence number beyond the window: a broken or hostile sender; discard.
    OutOfWindow,
}

/// Settings of the receive side.
#[derive(Debug, Clone, Copy)]
pub struct RecvConfig {
    /// Window in frames (the sender never has more in flight).
    pub window: u32,
    /// Send an explicit ACK after this many new frames with no ACK sent.
    pub ack_every: u32,
    /// ... or this long after the first unacknowledged frame.
    pub ack_delay: Duration,
    /// A missing frame is NACKed once a frame this many sequence numbers after it arrived
    /// (tolerates the reordering that striping over several links causes).
    pub nack_threshold: u32,
    /// Repeat a NACK for gaps still open after at most this long (sooner once the time a
    /// NACK takes to be answered has been measured: twice that, but at least
    /// `nack_retry_min`).
    pub nack_retry: Duration,
    /// Lower bound of the NACK repeat interval.
    pub nack_retry_min: Duration,
}

/// A delayed ACK waits at most this many `ack_delay`s after the first frame it covers.
const ACK_DELAY_CAP: u32 = 4;

/// Receive-side window state of one connection.
#[derive(Debug)]
pub struct RecvWindow {
    cfg: RecvConfig,
    /// Every frame below this has arrived.
    cum: u64,
    /// One past the highest sequence number that has arrived.
    highest: u64,
    /// Arrival bits for sequence numbers [cum, cum + ring bits), indexed modulo the ring.
    ring: Vec<u64>,
    mask: u64,
    /// New frames since the last ACK went out (explicit or piggybacked).
    unacked: u32,
    /// When the delayed ACK goes: `ack_delay` after the latest frame while frames keep
    /// coming, but never later than [`ACK_DELAY_CAP`] delays after the first unacknowledged.
    ack_deadline: Option<Time>,
    /// When the first frame no ACK has covered arrived.
    ack_first: Option<Time>,
    ack_now: bool,
    /// Gaps below this have been NACKed at `last_nack`.
    nacked_upto: u64,
    last_nack: Option<Time>,
    /// Smoothed time from a NACK to the retransmission it asked for.
    repair: Option<Duration>,
    /// Reordering seen on the path: how far behind the newest frame an original (not
    /// retransmitted) frame arrived. Striping over links that send in bursts reorders by
    /// tens of frames; NACKing inside that distance would only cause spurious repairs.
    reorder: u64,
    /// In-order arrivals since the reordering estimate last decayed.
    calm: u32,
    /// `ack_delay` and its cap ([`ACK_DELAY_CAP`] delays) in nanoseconds: every frame
    /// moves the delayed ACK, and `Time + Duration` converts through 128 bits each time.
    ack_delay_ns: u64,
    ack_cap_ns: u64,
}

impl RecvWindow {
    /// An empty window expecting sequence number 0.
    pub fn new(cfg: RecvConfig) -> RecvWindow {
        let bits = u64::from(cfg.window.max(64)).next_power_of_two();
        RecvWindow {
            cfg,
            cum: 0,
            highest: 0,
            ring: vec![0; (bits / 64) as usize],
            mask: bits - 1,
            unacked: 0,
            ack_deadline: None,
            ack_first: None,
            ack_now: false,
            nacked_upto: 0,
            last_nack: None,
            repair: None,
            reorder: 0,
            calm: 0,
            ack_delay_ns: u64::try_from(cfg.ack_delay.as_nanos()).unwrap_or(u64::MAX),
            ack_cap_ns: u64::try_from(cfg.ack_delay.as_nanos())
                .unwrap_or(u64::MAX)
                .saturating_mul(u64::from(ACK_DELAY_CAP)),
        }
    }

    fn bit(&self, seq: u64) -> bool {
        let i = seq & self.mask;
        self.ring[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, seq: u64, on: bool) {
        let i = seq & self.mask;
        let w = &mut self.ring[(i / 64) as usize];
        if on {
            *w |= 1 << (i % 64);
        } else {
            *w &= !(1 << (i % 64));
        }
    }

    /// Records frame `seq_wire` arriving at `now`; `retransmit` when the sender marked it so
    /// (it then measures how long NACKs take to be answered).
    pub fn on_frame(&mut self, now: Time, seq_wire: u32, retransmit: bool) -> Arrival {
        let seq = seqnum::expand(seq_wire, self.cum);
        if seq == self.cum && self.highest == self.cum && !retransmit {
            // The next frame, nothing after it seen (the common case on a lossless link):
            // the window moves on by one, no bit of the ring set and cleared again.
            self.cum += 1;
            self.highest = self.cum;
            self.calm += 1;
            if self.calm >= 256 && self.reorder > 0 {
                self.reorder -= 1;
                self.calm = 0;
            }
            self.count_unacked(now);
            return Arrival::New;
        }
        if seq < self.cum || (seq - self.cum <= self.mask && self.bit(seq)) {
            // The peer did not see our ACK: answer at once.
            self.ack_now = true;
            return Arrival::Duplicate;
        }
        if seq - self.cum >= u64::from(self.cfg.window) || seq - self.cum > self.mask {
            return Arrival::OutOfWindow;
        }
        self.set(seq, true);
        if !retransmit && seq + 1 < self.highest {
            // An original frame overtaken by later ones: the path reorders this much.
            self.reorder = self
                .reorder
                .max(self.highest - seq)
                .min(u64::from(self.cfg.window / 2));
            self.calm = 0;
        } else {
            self.calm += 1;
            if self.calm >= 256 && self.reorder > 0 {
                self.reorder -= 1;
                self.calm = 0;
            }
        }
        if retransmit && seq < self.nacked_upto {
            if let Some(t) = self.last_nack {
                let sample = now.since(t);
                self.repair = Some(match self.repair {
                    Some(r) => (r * 7 + sample) / 8,
                    None => sample,
                });
            }
        }
        self.highest = self.highest.max(seq + 1);
        while self.cum < self.highest && self.bit(self.cum) {
            self.set(self.cum, false);
            self.cum += 1;
        }
        self.count_unacked(now);
        Arrival::New
    }

    /// A new frame arrived at `now`: an ACK is due after `ack_every` of them, or later.
    fn count_unacked(&mut self, now: Time) {
        self.unacked += 1;
        if self.unacked >= self.cfg.ack_every {
            self.ack_now = true;
        } else {
            // A stream that keeps coming is acknowledged by count (every `ack_every` frames),
            // not every `ack_delay`: at jumbo-frame rates the count takes longer than the
            // delay, and a timer from the first frame sent an ACK every 40 frames instead of
            // 64. A frame that ends a burst is acknowledged `ack_delay` after it, as before.
            let first = *self.ack_first.get_or_insert(now);
            self.ack_deadline = Some(Time(
                now.0
                    .saturating_add(self.ack_delay_ns)
                    .min(first.0.saturating_add(self.ack_cap_ns)),
            ));
        }
    }

    /// The cumulative acknowledgement: the next sequence number expected.
    pub fn cum_ack(&self) -> u64 {
        self.cum
    }

    /// Selective-ack bitmap: bit i = frame `cum + 1 + i` has arrived.
    pub fn sack_bits(&self) -> u64 {
        let mut bits = 0u64;
        let span = self.highest.saturating_sub(self.cum + 1).min(64);
        for i in 0..span {
            if self.bit(self.cum + 1 + i) {
                bits |= 1 << i;
            }
        }
        bits
    }

    /// Whether any frame has arrived that no ACK has covered yet.
    pub fn has_unacked(&self) -> bool {
        self.unacked > 0 || self.ack_now
    }

    /// The sender asked for an acknowledgement at once (its window is full).
    pub fn ack_at_once(&mut self) {
        self.ack_now = true;
    }

    /// Whether an explicit ACK must go out now (count reached, timer fired or duplicate).
    pub fn ack_due(&self, now: Time) -> bool {
        self.ack_now || self.ack_deadline.is_some_and(|d| now >= d)
    }

    /// Whether the delayed-ACK timer (not the count) has expired: piggybacking may no
    /// longer wait for data.
    pub fn ack_overdue(&self, now: Time) -> bool {
        self.ack_deadline.is_some_and(|d| now >= d)
    }

    /// An ACK (explicit, NACK, or piggybacked on data) carrying the current state went out.
    pub fn on_ack_sent(&mut self) {
        self.unacked = 0;
        self.ack_deadline = None;
        self.ack_first = None;
        self.ack_now = false;
    }

    /// The first open gap old enough to report, if a NACK is due now: a gap is reported
    /// once, when `nack_threshold` later frames have arrived, and again after `nack_retry`.
    pub fn nack_due(&self, now: Time) -> bool {
        let threshold = self.threshold();
        if self.highest <= self.cum + threshold {
            return false;
        }
        // Frames count as missing up to `nack_threshold` below the highest arrival, and a
        // NACK can name them only up to 64 past cum (the bitmap's reach).
        let limit = (self.highest - threshold).min(self.cum + 65);
        let retry = self
            .last_nack
            .is_some_and(|t| now.since(t) >= self.nack_retry());
        if retry {
            return true;
        }
        // A new gap past what was NACKed already?
        let from = self.nacked_upto.max(self.cum);
        (from..limit).any(|s| !self.bit(s))
    }

    /// How many frames past a gap must arrive before it counts as a loss: the configured
    /// threshold, or the reordering the path has shown, whichever is larger.
    pub fn threshold(&self) -> u64 {
        u64::from(self.cfg.nack_threshold).max(self.reorder + 1)
    }

    /// How long to wait before repeating a NACK for gaps still open.
    pub fn nack_retry(&self) -> Duration {
        match self.repair {
            Some(r) => (r * 2).clamp(self.cfg.nack_retry_min, self.cfg.nack_retry),
            None => self.cfg.nack_retry,
        }
    }

    /// A NACK carrying the current state went out.
    pub fn on_nack_sent(&mut self, now: Time) {
        // Only the gaps the bitmap could name count as reported: cum itself and the 64
        // frames after it. Gaps further out get their own NACK as cum moves up.
        self.nacked_upto = self
            .highest
            .saturating_sub(self.threshold())
            .min(self.cum + 65);
        self.last_nack = Some(now);
        self.on_ack_sent();
    }

    /// Whether a gap is old enough to NACK (past the reordering threshold); only then does
    /// the NACK retry timer matter (a tail loss is left to the sender's timeout).
    fn gaps_open(&self) -> bool {
        self.highest > self.cum + self.threshold()
    }

    /// The earliest time this window needs attention (delayed ACK or NACK retry).
    pub fn poll_timeout(&self) -> Option<Time> {
        let retry = if self.gaps_open() {
            self.last_nack.map(|t| t + self.nack_retry())
        } else {
            None
        };
        match (self.ack_deadline, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> RecvConfig {
        RecvConfig {
            window: 128,
            ack_every: 4,
            ack_delay: Duration::from_micros(100),
            nack_threshold: 2,
            nack_retry: Duration::from_millis(1),
            nack_retry_min: Duration::from_micros(10),
        }
    }

    #[test]
    fn cumulative_and_selective() {
        let mut r = RecvWindow::new(cfg());
        let t = Time::ZERO;
        assert_eq!(r.on_frame(t, 0, false), Arrival::New);
        assert_eq!(r.on_frame(t, 2, false), Arrival::New);
        assert_eq!(r.on_frame(t, 3, false), Arrival::New);
        assert_eq!(r.cum_ack(), 1);
        assert_eq!(r.sack_bits(), 0b11);
        assert_eq!(r.on_frame(t, 2, false), Arrival::Duplicate);
        assert_eq!(r.on_frame(t, 0, false), Arrival::Duplicate);
        assert_eq!(r.on_frame(t, 1000, false), Arrival::OutOfWindow);
        assert_eq!(r.on_frame(t, 1, false), Arrival::New);
        assert_eq!(r.cum_ack(), 4);
        assert_eq!(r.sack_bits(), 0);
    }

    #[test]
    fn delayed_ack_by_count_and_timer() {
        let mut r = RecvWindow::new(cfg());
        let t = Time::ZERO;
        r.on_frame(t, 0, false);
        assert!(!r.ack_due(t));
        assert!(r.ack_due(t + Duration::from_micros(100)));
        r.on_frame(t, 1, false);
        r.on_frame(t, 2, false);
        r.on_frame(t, 3, false);
        assert!(r.ack_due(t));
        r.on_ack_sent();
        assert!(!r.ack_due(t));
        assert_eq!(r.poll_timeout(), None);
    }

    #[test]
    fn nack_after_threshold_then_retry() {
        let mut r = RecvWindow::new(cfg());
        let t = Time::ZERO;
        r.on_frame(t, 0, false);
        r.on_frame(t, 2, false);
        assert!(
            !r.nack_due(t),
            "one frame past the gap is within the reorder threshold"
        );
        r.on_frame(t, 3, false);
        assert!(r.nack_due(t));
        r.on_nack_sent(t);
        assert!(!r.nack_due(t));
        r.on_frame(t, 4, false);
        assert!(!r.nack_due(t), "same gap, not yet time to retry");
        assert!(r.nack_due(t + Duration::from_millis(1)));
        r.on_frame(t, 1, false);
        assert_eq!(r.cum_ack(), 5);
        assert!(!r.nack_due(t + Duration::from_millis(5)));
    }

    /// Against the set of frames received: the cumulative ACK, the selective bits and
    /// new-or-duplicate agree, whatever mix of frames in order (the fast path), ahead of
    /// a gap, repeated and re-sent arrives.
    #[test]
    fn acks_agree_with_the_frames_received() {
        let mut rng = crate::rng::SplitMix64::new(9);
        for _ in 0..50 {
            let mut w = RecvWindow::new(cfg());
            let mut got = std::collections::BTreeSet::new();
            let mut now = Time::ZERO;
            for _ in 0..2_000 {
                let cum = w.cum_ack();
                let seq = match rng.below(4) {
                    0 | 1 => cum,
                    2 => cum + rng.below(40),
                    _ => cum.saturating_sub(rng.below(5)),
                };
                now = now + Duration::from_micros(1);
                let a = w.on_frame(now, seqnum::truncate(seq), rng.below(5) == 0);
                let fresh = got.insert(seq);
                assert_eq!(a == Arrival::New, fresh, "seq {seq}");
                let want_cum = (0..).find(|s| !got.contains(s)).unwrap_or(0);
                assert_eq!(w.cum_ack(), want_cum);
                let mut bits = 0u64;
                for i in 0..64 {
                    if got.contains(&(want_cum + 1 + i)) {
                        bits |= 1 << i;
                    }
                }
                assert_eq!(w.sack_bits(), bits);
            }
        }
    }
}
