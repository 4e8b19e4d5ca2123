//! How many UMEM chunks a link's fill ring keeps posted for the kernel to receive into.
//!
//! The kernel takes fill-ring chunks in the order they were posted, so a ring kept N chunks
//! deep receives every frame into the chunk posted N frames earlier: with N = 2048 a
//! ping-pong walks through 8 MiB of packet memory, one cold 4 KiB page per frame, and the
//! kernel's copy into it (on veth, inside the *sender's* transmit call) and the poller's read
//! of it both miss the caches and the TLB (the round trips this cost are in
//! docs/dataplane.md).
//!
//! A deep ring is only needed to absorb what arrives while the poller is away. A busy poller
//! refills every turn, so its ring needs a few turns' worth of what one turn takes: the
//! depth follows the most the kernel took between two refills (a slowly decaying peak)
//! times a margin, between a floor and the ring's full depth. An adaptive poller sleeps
//! and shares its core with others (dozens of servers on two cores), and may be away for
//! milliseconds: its rings stay full.

/// The fewest chunks a busy poller's ring keeps posted: 85 jumbo frames, more than a
/// kernel transmit batch (64 frames).
pub const MIN_DEPTH: u32 = 256;

/// The rate is measured over windows this long.
const WINDOW_NS: u64 = 1_000_000;

/// Windows of the highest rate the ring holds: how long a busy poller may be away (a long
/// turn, a preemption) before its ring runs dry.
const COVER_WINDOWS: u32 = 2;

/// The fill depth of one link.
#[derive(Debug, Clone)]
pub struct FillDepth {
    max: u32,
    follow: bool,
    /// Chunks taken per window: the highest seen, decaying by an eighth a window.
    rate: u32,
    /// Chunks taken in the current window, and when it started.
    taken: u32,
    window_start: u64,
    /// Chunks the ring held after the last refill.
    held: u32,
}

impl FillDepth {
    /// A ring at most `max` chunks deep; `follow`: size it by what the kernel takes (busy
    /// polling), else keep it at `max` (adaptive polling).
    pub fn new(max: u32, follow: bool) -> FillDepth {
        FillDepth {
            max,
            follow,
            // Start deep: the first burst finds room; the depth comes down as the traffic
            // shows it can.
            rate: max.div_ceil(COVER_WINDOWS),
            taken: 0,
            window_start: 0,
            held: 0,
        }
    }

    /// How many chunks to post now (at `now_ns`), told how many the ring still holds
    /// (posted, not yet taken by the kernel); the caller then says how many it posted
    /// ([`FillDepth::posted`]).
    pub fn want(&mut self, holding: u32, now_ns: u64) -> u32 {
        let taken = self.held.saturating_sub(holding);
        self.held = holding;
        self.target(taken, now_ns).saturating_sub(holding)
    }

    /// `n` chunks were posted after [`FillDepth::want`].
    pub fn posted(&mut self, n: u32) {
        self.held += n;
    }

    /// The chunks the link can receive into before its poller's next refill, for the
    /// receiver's window (receiver pacing), told how many the ring holds and how many are
    /// free to post: a ring kept shallow is topped up every turn, so it offers what it
    /// could be filled to. Granting only what a shallow ring holds would hold the sender
    /// to it, and the ring would never see the traffic that deepens it.
    pub fn can_take(&self, holding: u32, free: u32) -> u32 {
        if self.follow {
            self.max.min(holding.saturating_add(free)).max(holding)
        } else {
            holding
        }
    }

    /// The depth to refill to, told how many chunks the kernel took since the last refill.
    fn target(&mut self, taken: u32, now_ns: u64) -> u32 {
        if !self.follow {
            return self.max;
        }
        self.taken = self.taken.saturating_add(taken);
        let elapsed = now_ns.saturating_sub(self.window_start);
        if elapsed >= WINDOW_NS {
            // Per window, even when the refills came late (a long turn).
            let r = (u64::from(self.taken) * WINDOW_NS / elapsed) as u32;
            self.rate = r.max(self.rate - self.rate / 8);
            self.taken = 0;
            self.window_start = now_ns;
        }
        // A burst raises the depth within its window, at once.
        self.rate
            .max(self.taken)
            .saturating_mul(COVER_WINDOWS)
            .clamp(MIN_DEPTH.min(self.max), self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Refills every `step` ns for `ms` milliseconds, the kernel taking `per` chunks
    /// between two; the last target.
    fn run(d: &mut FillDepth, now: &mut u64, ms: u64, step: u64, per: u32) -> u32 {
        let mut t = 0;
        let end = *now + ms * MS;
        while *now < end {
            *now += step;
            t = d.target(per, *now);
        }
        t
    }

    #[test]
    fn adaptive_pollers_keep_their_rings_full() {
        let mut d = FillDepth::new(2048, false);
        for taken in [0, 1, 500, 0] {
            assert_eq!(d.target(taken, 0), 2048);
        }
    }

    #[test]
    fn a_quiet_link_comes_down_to_the_floor_and_a_burst_takes_it_back_up() {
        let mut d = FillDepth::new(2048, true);
        let mut now = 0;
        // Starts full.
        assert_eq!(d.target(0, now), 2048);
        // A ping-pong: a frame every 6 us, one chunk each: 167 a millisecond, two
        // milliseconds' worth posted.
        assert_eq!(run(&mut d, &mut now, 100, 6_000, 1), 332);
        // A frame every 20 us: below the floor.
        assert_eq!(run(&mut d, &mut now, 100, 20_000, 1), MIN_DEPTH);
        // A jumbo stream: 250 000 frames a second of 3 chunks, refilled every 20 us: 750 a
        // millisecond: most of the way within its first millisecond, then two
        // milliseconds' worth.
        assert!(run(&mut d, &mut now, 1, 20_000, 15) >= 1000);
        assert_eq!(run(&mut d, &mut now, 10, 20_000, 15), 1500);
        // A burst within a window raises it at once.
        assert_eq!(d.target(1000, now + 1), 2048);
    }

    #[test]
    fn the_depth_falls_slowly() {
        let mut d = FillDepth::new(4096, true);
        let mut now = 0;
        run(&mut d, &mut now, 2, 10_000, 20);
        let mut seen = vec![d.target(0, now)];
        for _ in 0..40 {
            seen.push(run(&mut d, &mut now, 1, 10_000, 0));
        }
        // An eighth a millisecond: never more than that at once, down to the floor.
        for w in seen.windows(2) {
            assert!(w[1] <= w[0] && w[1] >= w[0] - w[0] / 8 - 1, "{seen:?}");
        }
        assert_eq!(seen.last(), Some(&MIN_DEPTH));
    }

    #[test]
    fn what_to_post_follows_what_the_kernel_took() {
        let mut d = FillDepth::new(2048, true);
        // An empty ring is filled to the start depth.
        assert_eq!(d.want(0, 0), 2048);
        d.posted(2048);
        // Quiet for a long while: nothing to post, and the depth comes down (the ring holds
        // more than it needs; what the kernel takes is not replaced until it does).
        for k in 1..=1000 {
            assert_eq!(d.want(2048, k * 100_000), 0);
        }
        // The kernel takes 1930 at once: a burst, so the depth goes back up.
        assert_eq!(d.want(118, 100 * MS + 1), 2048 - 118);
        d.posted(2048 - 118);
    }

    #[test]
    fn a_shallow_ring_offers_what_it_could_be_filled_to() {
        let busy = FillDepth::new(2048, true);
        assert_eq!(busy.can_take(128, 10_000), 2048);
        assert_eq!(busy.can_take(128, 500), 628, "no more than the free chunks");
        let adaptive = FillDepth::new(2048, false);
        assert_eq!(
            adaptive.can_take(2000, 10_000),
            2000,
            "what it holds while away"
        );
    }

    #[test]
    fn a_small_ring_is_its_own_floor() {
        let mut d = FillDepth::new(64, true);
        assert_eq!(d.target(0, 0), 64);
        assert_eq!(d.target(1000, 1), 64);
    }
}
