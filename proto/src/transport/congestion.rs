//! Congestion control per connection, from the fabric's own telemetry.
//!
//! Every link a data frame leaves by, at its sender and at every forwarder (the poller, the
//! XDP program, a simulated link), raises the frame's `cong` byte to that link's load in
//! hundredths of its capacity, queue included ([`crate::wire::raise_cong`]): over 100 means
//! a queue stands behind the link. The receiver echoes the highest it saw since it last told
//! its peer (`cong_echo`, in every frame to the peer that carries an acknowledgement:
//! [`Telemetry`]). The sender sets its window from the echo as HPCC does ([`Controller`]):
//! once a round trip it takes its window as the reference, and on every acknowledgement sets
//! the window to the reference scaled by target load / echoed load, plus a small additive
//! step, so the most loaded link on the path settles just under full with next to no queue,
//! and flows sharing it converge to equal windows. A path that writes no telemetry (every
//! writer writes at least 1, so an echo of 0 means none) falls back to delay: the window
//! shrinks when the smoothed round trip grows past the least one seen by half, and grows by
//! the additive step otherwise.
//!
//! Many-to-one is the same law: the links into a receiver are the last hops of every
//! sender's path, so their load is in every sender's echo, and each sender's share of them
//! shrinks with the number of senders. The window never falls below
//! [`CongestionConfig::min_window`] frames; the receiver's pacing grant (`pacing.rs`) and
//! the sender's own window still bound it from above.
//!
//! Weighted shares: a connection's additive step is multiplied by the fair-queuing weight
//! of the service whose frames it sends ([`Controller::set_weight`]). At HPCC's fixed point
//! every window sharing a link is scaled by the same factor each round, so what sets the
//! split is the additive steps: flows get windows in proportion to their weights on every
//! link of their paths, forwarders' included, with no queue per service at the forwarders
//! (the XDP program has none to give). Windows, not rates: a flow on a longer round trip
//! gets less of a link for the same window (scaling the step by the round trip evened that
//! out in a model but stood queues up under incast, so it is not done).

use crate::time::Time;

/// Settings of the congestion controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CongestionConfig {
    /// Whether windows follow the telemetry at all (off: the fixed window alone).
    pub on: bool,
    /// The load the most loaded link on a path is steered to, in hundredths (HPCC's eta).
    pub target: u8,
    /// Frames added to the window every round trip (HPCC's W_AI), times the sending
    /// service's weight: how fast flows that share a link even out.
    pub additive: f64,
    /// The least window, in frames.
    pub min_window: u32,
    /// The window a connection opens with, in frames (the sender's window if larger).
    pub initial_window: u32,
}

impl Default for CongestionConfig {
    fn default() -> CongestionConfig {
        CongestionConfig {
            on: false,
            target: 95,
            additive: 0.5,
            min_window: 1,
            // The first round trip goes out before any echo: a receiver gathering from
            // hundreds of senders takes two frames from each into its links' queues.
            initial_window: 2,
        }
    }
}

/// What a receiver keeps to echo: the highest load its peer's frames met since it last
/// told the peer, and what it told last (repeated until a frame brings news).
#[derive(Debug, Default, Clone, Copy)]
pub struct Telemetry {
    seen: u8,
    told: u8,
}

impl Telemetry {
    /// A frame from the peer met links loaded up to `cong`.
    #[inline(always)]
    pub fn on_frame(&mut self, cong: u8) {
        self.seen = self.seen.max(cong);
    }

    /// What the next frame to the peer echoes.
    #[inline(always)]
    pub fn echo(&self) -> u8 {
        if self.seen != 0 {
            self.seen
        } else {
            self.told
        }
    }

    /// What the next frame to the peer echoes, as told (the highest load starts over).
    #[inline(always)]
    pub fn take_echo(&mut self) -> u8 {
        if self.seen != 0 {
            self.told = self.seen;
            self.seen = 0;
        }
        self.told
    }
}

/// A sender's window, as the telemetry its peer echoes sets it.
#[derive(Debug, Clone)]
pub struct Controller {
    cfg: CongestionConfig,
    /// The window, in frames.
    window: f64,
    /// The window a round trip ago, which each acknowledgement scales (HPCC's W_c).
    reference: f64,
    /// The reference is taken again once the peer acknowledges this sequence number.
    next_round: u64,
    /// The largest window allowed (the connection's own).
    max: f64,
    /// The least smoothed round trip seen, ns (the delay fallback's base).
    min_rtt_ns: u64,
    /// When the delay fallback last shrank the window.
    shrunk_at: Option<Time>,
    /// The weight the additive step is multiplied by (the sending service's).
    weight: f64,
}

impl Controller {
    /// A controller for a connection whose own window is `max` frames.
    pub fn new(cfg: CongestionConfig, max: u32) -> Controller {
        let start = if cfg.on {
            f64::from(cfg.initial_window.clamp(cfg.min_window.max(1), max.max(1)))
        } else {
            f64::from(max)
        };
        Controller {
            cfg,
            window: start,
            reference: start,
            next_round: 0,
            max: f64::from(max.max(1)),
            min_rtt_ns: u64::MAX,
            shrunk_at: None,
            weight: 1.0,
        }
    }

    /// Frames from a service of fair-queuing `weight` are being sent: the additive step
    /// grows with it, so flows sharing a link split it by weight.
    #[inline(always)]
    pub fn set_weight(&mut self, weight: u32) {
        self.weight = f64::from(weight.max(1));
    }

    /// Frames added this round: the additive step times the sending service's weight.
    #[inline]
    fn step(&self) -> f64 {
        self.cfg.additive * self.weight
    }

    /// The window now, in whole frames.
    #[inline(always)]
    pub fn window(&self) -> u32 {
        self.window.round() as u32
    }

    /// An acknowledgement arrived: the peer has everything below `una` (we have sent
    /// everything below `next`), echoing `echo`; `srtt_ns` is the smoothed round trip so
    /// far. Returns the new window.
    pub fn on_ack(
        &mut self,
        now: Time,
        echo: u8,
        una: u64,
        next: u64,
        srtt_ns: Option<u64>,
    ) -> u32 {
        if !self.cfg.on {
            return self.window();
        }
        let round = una >= self.next_round;
        if round {
            self.reference = self.window;
            self.next_round = next;
        }
        let floor = f64::from(self.cfg.min_window.max(1));
        if echo != 0 {
            // HPCC: W = W_c / (U / eta) + W_AI, the additive step spread over a round.
            let u = f64::from(echo) / 100.0;
            let step = if round { self.step() } else { 0.0 };
            self.window = (self.reference * f64::from(self.cfg.target) / 100.0 / u.max(0.01)
                + step)
                .clamp(floor, self.max);
            return self.window();
        }
        // No telemetry on the path: by delay.
        let Some(srtt) = srtt_ns else {
            return self.window();
        };
        self.min_rtt_ns = self.min_rtt_ns.min(srtt);
        let base = self.min_rtt_ns;
        let target = base + base / 2;
        if srtt > target {
            let once_a_round = self
                .shrunk_at
                .is_none_or(|t| now.0.saturating_sub(t.0) >= srtt);
            if once_a_round {
                let over = (srtt - target) as f64 / srtt as f64;
                self.window = (self.window * (1.0 - 0.8 * over).max(0.5)).max(floor);
                self.shrunk_at = Some(now);
            }
        } else if round {
            self.window = (self.window + self.step()).min(self.max);
        }
        self.window()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctl() -> Controller {
        let on = CongestionConfig {
            on: true,
            ..CongestionConfig::default()
        };
        Controller::new(on, 512)
    }

    #[test]
    fn a_loaded_path_shrinks_the_window_and_a_free_one_grows_it() {
        let mut c = Controller::new(
            CongestionConfig {
                on: true,
                initial_window: 64,
                ..CongestionConfig::default()
            },
            512,
        );
        assert_eq!(c.window(), 64);
        // The bottleneck at twice its capacity: the window halves (to eta).
        let w = c.on_ack(Time(1), 200, 1, 64, Some(100_000));
        assert_eq!(w, (64.0f64 * 0.95 / 2.0 + 0.5).round() as u32);
        // Next round: a link at 10%: the window grows towards the top at once.
        let w = c.on_ack(Time(2), 10, 64, 100, Some(100_000));
        assert!(w > 250, "{w}");
        let w = c.on_ack(Time(3), 1, 100, 400, Some(100_000));
        assert_eq!(w, 512);
    }

    #[test]
    fn flows_sharing_a_link_even_out() {
        // Two flows through one link of capacity 100 frames a round: their windows add
        // up to the link's load, which both see.
        let (mut a, mut b) = (ctl(), ctl());
        assert_eq!(a.window(), 2);
        a.window = 90.0;
        b.window = 10.0;
        let (mut ua, mut ub) = (0u64, 0u64);
        for round in 0..400u64 {
            let load = ((a.window + b.window) * 100.0 / 100.0) as u64;
            let echo = load.clamp(1, 255) as u8;
            ua += a.window as u64;
            ub += b.window as u64;
            a.on_ack(Time(round), echo, ua, ua + a.window as u64, Some(100_000));
            b.on_ack(Time(round), echo, ub, ub + b.window as u64, Some(100_000));
        }
        let (wa, wb) = (a.window, b.window);
        assert!((wa - wb).abs() < 0.2 * (wa + wb), "{wa} {wb}");
        assert!((80.0..=110.0).contains(&(wa + wb)), "{wa} {wb}");
    }

    #[test]
    fn weights_split_a_shared_link() {
        // Three flows through one link of 100 frames a round, weights 2:1:1, starting
        // anywhere: their windows settle in proportion to the weights.
        let mut flows = [ctl(), ctl(), ctl()];
        let weights = [2u32, 1, 1];
        for (f, &w) in flows.iter_mut().zip(&weights) {
            f.set_weight(w);
        }
        flows[1].window = 70.0;
        let mut acked = [0u64; 3];
        let mut sums = [0.0f64; 3];
        for round in 0..2000u64 {
            let load: f64 = flows.iter().map(|f| f.window).sum();
            let echo = (load as u64).clamp(1, 255) as u8;
            for (i, f) in flows.iter_mut().enumerate() {
                acked[i] += f.window as u64;
                f.on_ack(
                    Time(round),
                    echo,
                    acked[i],
                    acked[i] + f.window as u64,
                    Some(100_000),
                );
                if round >= 1000 {
                    sums[i] += f.window;
                }
            }
        }
        let total: f64 = sums.iter().sum();
        let shares: Vec<f64> = sums.iter().map(|s| s / total).collect();
        for (share, want) in shares.iter().zip([0.5, 0.25, 0.25]) {
            assert!((share - want).abs() < 0.02, "{shares:?}");
        }
    }

    #[test]
    fn without_telemetry_delay_steers() {
        let mut c = ctl();
        for i in 1..20 {
            c.on_ack(Time(i * 1000), 0, i * 10, i * 10 + 64, Some(10_000));
        }
        let before = c.window();
        // The round trip triples: the window shrinks, once a round.
        let w = c.on_ack(Time(100_000), 0, 300, 400, Some(30_000));
        assert!(w < before, "{w} {before}");
        let again = c.on_ack(Time(100_001), 0, 301, 400, Some(30_000));
        assert_eq!(again, w);
    }

    #[test]
    fn off_is_the_fixed_window() {
        let mut c = Controller::new(CongestionConfig::default(), 512);
        assert_eq!(c.on_ack(Time(1), 250, 1, 2, Some(1)), 512);
    }

    #[test]
    fn echoes_repeat_until_news() {
        let mut t = Telemetry::default();
        assert_eq!(t.take_echo(), 0);
        t.on_frame(40);
        t.on_frame(70);
        t.on_frame(20);
        assert_eq!(t.take_echo(), 70);
        assert_eq!(t.take_echo(), 70);
        t.on_frame(30);
        assert_eq!(t.take_echo(), 30);
    }
}
