//! `torus-bench sim churn`: key-routed messages while servers fail and rejoin (CamCubeOS
//! paper 4.2.5, Figure 5(c)), judged by an oracle with global knowledge.
//!
//! By default every server runs its own control plane in the simulator (hellos, missed-hello
//! detection, flooded records on the simulated links), so servers learn of a failure or a
//! return at different times and briefly disagree. `--views shared` keeps the older model
//! (one view for everyone, flipped `--detect-ms` after a failure) for comparison.
//!
//! The oracle: a message for key k delivered at server s at time t is correct when s is k's
//! root among the servers that, at t, were truly alive, had taken over their keys (a
//! rejoining server takes them at the instant its control plane announced) and could be
//! reached from s over live servers; anything else is misdelivered. A message accepted by
//! a send and never delivered is dropped, with the reason counted where the frame died.

use std::time::{Duration, Instant};

use serde::Serialize;
use torusnet_proto::control::ControlConfig;
use torusnet_proto::keyspace;
use torusnet_proto::node::{DropReason, Event, MsgOptions, Target};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::routing::LinkView;
use torusnet_proto::sim::Sim;
use torusnet_proto::time::Time;
use torusnet_proto::topology::Dims;

use crate::churn_ledger::{Ledger, LedgerReport, SERVICE};

/// How servers learn of failures and returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Views {
    /// Every server runs its own control plane and learns when the news reaches it.
    Own,
    /// One view for everyone, flipped `--detect-ms` after a failure, at once on a return.
    Shared,
}

/// One churn run.
#[derive(Debug, Clone, Copy)]
pub struct ChurnOpts {
    /// Percent of servers down at any time.
    pub down_pct: f64,
    /// Failures per second (exponential gaps).
    pub rate: f64,
    /// Messages per live server per second, to random keys.
    pub msgs: f64,
    /// Simulated seconds measured (after the control planes have formed their views).
    pub seconds: f64,
    /// Shared views only: the detection delay.
    pub detect_ms: f64,
    /// How views are formed.
    pub views: Views,
    /// Own views: seconds between unchanged re-floods of a server's record.
    pub refresh_s: f64,
    /// Own views: how long a rejoining server relays before it takes its keys (0: at
    /// once, which lets servers that have not heard of its return yet keep delivering its
    /// keys: misdeliveries).
    pub holddown_ms: f64,
    /// Seed.
    pub seed: u64,
    /// Threads the simulator runs on.
    pub threads: usize,
    /// Reliable messages to keys (which follow their roots) instead of key-routed short
    /// ones, each followed to its end by [`crate::churn_ledger`].
    pub reliable: bool,
}

impl ChurnOpts {
    /// CamCube's settings (10% down, 1000 messages per server per second) at `rate`.
    #[cfg(test)]
    pub fn camcube(rate: f64, seconds: f64) -> ChurnOpts {
        ChurnOpts {
            down_pct: 10.0,
            rate,
            msgs: 1000.0,
            seconds,
            detect_ms: 300.0,
            views: Views::Own,
            refresh_s: 10.0,
            holddown_ms: 200.0,
            seed: 1,
            threads: 1,
            reliable: false,
        }
    }
}

/// What a churn run measured.
#[derive(Debug, Serialize)]
pub struct ChurnReport {
    pub servers: u64,
    pub views: Views,
    pub down_pct: f64,
    pub failures_per_s: f64,
    pub messages_per_server_per_s: f64,
    pub simulated_s: f64,
    pub failures: u64,
    pub rejoins: u64,
    /// Messages a send accepted.
    pub sent: u64,
    /// Sends refused at the source (no root in its view, or its queue full).
    pub refused_at_source: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub dropped_pct: f64,
    pub misdelivered: u64,
    /// Where dropped messages died: on a link into a server that had failed (its failure
    /// not yet known upstream), and as the engines counted them.
    pub lost_at_failed_server: u64,
    /// Still queued at their sender when it failed.
    pub lost_with_sender: u64,
    /// Dropped by their sender: no server took keys in its view.
    pub dropped_no_root: u64,
    pub dropped_unreachable: u64,
    pub dropped_ttl_expired: u64,
    pub dropped_no_room: u64,
    pub dropped_other: u64,
    /// Messages still on the way when the run ended (counted as dropped).
    pub in_flight_at_end: u64,
    /// Frames forwarded back over the link they came in on: views that disagreed.
    pub bounced: u64,
    pub control_frames: u64,
    pub events: u64,
    pub events_per_s: f64,
    pub wall_s: f64,
    /// Peak resident memory of the run, MiB.
    pub peak_mib: f64,
    /// With `--reliable`: every reliable message's end.
    #[serde(flatten)]
    pub ledger: Option<LedgerReport>,
}

/// The oracle's global knowledge at one moment.
struct Truth {
    dims: Dims,
    alive: Vec<bool>,
    /// When each server takes its keys (own views); `None`: it does not (yet).
    active: Vec<Option<Time>>,
    /// Connected component of each live server (over live servers; links do not fail).
    comp: Vec<u32>,
}

impl Truth {
    fn new(dims: Dims) -> Truth {
        let n = dims.count() as usize;
        Truth {
            dims,
            alive: vec![true; n],
            active: vec![Some(Time::ZERO); n],
            comp: vec![0; n],
        }
    }

    /// Recomputes the components after servers died or returned.
    fn components(&mut self) {
        let n = self.alive.len();
        self.comp = vec![u32::MAX; n];
        let mut label = 0;
        let mut stack = Vec::new();
        for s in 0..n {
            if !self.alive[s] || self.comp[s] != u32::MAX {
                continue;
            }
            self.comp[s] = label;
            stack.push(s);
            while let Some(i) = stack.pop() {
                let c = self.dims.coord(i);
                for d in self.dims.link_dirs().iter() {
                    let j = self.dims.index(self.dims.neighbor(c, d));
                    if self.alive[j] && self.comp[j] == u32::MAX {
                        self.comp[j] = label;
                        stack.push(j);
                    }
                }
            }
            label += 1;
        }
    }

    /// Whether a delivery of `key` at `server` at `t` went anywhere but its true root.
    fn misdelivered(&self, key: u64, server: usize, t: Time) -> bool {
        let here = self.comp[server];
        let root = keyspace::root(self.dims, key, |c| {
            let i = self.dims.index(c);
            self.alive[i] && self.active[i].is_some_and(|a| a <= t) && self.comp[i] == here
        });
        root != Some(self.dims.coord(server))
    }

    /// Whether `key` had a root `server` could reach at `t`.
    fn has_root(&self, key: u64, server: usize, t: Time) -> bool {
        let here = self.comp[server];
        keyspace::root(self.dims, key, |c| {
            let i = self.dims.index(c);
            self.alive[i] && self.active[i].is_some_and(|a| a <= t) && self.comp[i] == here
        })
        .is_some()
    }
}

/// Key-routed short messages under churn on the torus of `cfg`; see the module comment
/// for the oracle.
pub fn churn(o: &ChurnOpts, cfg: torusnet_proto::sim::SimConfig) -> Result<ChurnReport, String> {
    let ok = (0.0..100.0).contains(&o.down_pct)
        && is_positive(o.rate)
        && is_positive(o.seconds)
        && (o.msgs == 0.0 || is_positive(o.msgs))
        && (o.detect_ms == 0.0 || is_positive(o.detect_ms))
        && is_positive(o.refresh_s)
        && (0.0..=60_000.0).contains(&o.holddown_ms);
    if !ok {
        return Err(format!(
            "churn needs 0 <= --down < 100, --rate > 0, --seconds > 0, --msgs >= 0, \
             --detect-ms >= 0, --refresh-s > 0 and 0 <= --holddown-ms <= 60000 \
             (got {}, {}, {}, {}, {}, {}, {})",
            o.down_pct, o.rate, o.seconds, o.msgs, o.detect_ms, o.refresh_s, o.holddown_ms
        ));
    }
    let own = o.views == Views::Own;
    crate::procmem::reset_peak();
    let t0 = Instant::now();
    let mut sim = Sim::with_threads(cfg, o.threads)?;
    let dims = sim.dims();
    let n = dims.count() as usize;
    if own {
        let mut c = ControlConfig::new(0, dims, dims.link_dirs());
        c.refresh = Duration::from_secs_f64(o.refresh_s);
        c.max_age = c.refresh * 3;
        c.join_holddown = Duration::from_secs_f64(o.holddown_ms / 1000.0);
        sim.enable_control(&c);
    }
    let mut rng = SplitMix64::new(o.seed);
    let mut truth = Truth::new(dims);
    let mut ledger = Ledger::default();
    let ndown = (((n as f64) * o.down_pct / 100.0).round() as usize).min(n.saturating_sub(2));
    // Servers down, longest-down first: each failure brings the longest-down back, so the
    // down fraction holds.
    let mut downs: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    while downs.len() < ndown {
        let i = rng.below(n as u64) as usize;
        if !downs.contains(&i) {
            downs.push_back(i);
            truth.alive[i] = false;
            if own {
                sim.crash(dims.coord(i));
            } else {
                sim.set_server(dims.coord(i), false);
            }
        }
    }
    truth.components();
    // Own views: let hellos find the neighbours, the records flood and the first failures
    // be detected before anything is measured.
    let warm = if own {
        Duration::from_secs(2)
    } else {
        Duration::ZERO
    };
    sim.run_until(Time::ZERO + warm, |_, _, _| {});
    let base = sim.stats();
    // Shared views: failed servers whose failure nobody has detected yet.
    let mut pending: Vec<(Time, usize)> = Vec::new();
    let tick = Duration::from_micros(500);
    let per_tick = o.msgs * tick.as_secs_f64();
    let mut carry = vec![0.0f64; n];
    let (mut sent, mut refused, mut delivered, mut wrong) = (0u64, 0u64, 0u64, 0u64);
    let (mut failures, mut rejoins) = (0u64, 0u64);
    let gap = |rng: &mut SplitMix64| {
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        Duration::from_secs_f64(-(1.0 - u).ln() / o.rate)
    };
    let start = sim.now();
    let mut next_fail = start + gap(&mut rng);
    let end = start + Duration::from_secs_f64(o.seconds);
    let mut t = start;
    while t < end {
        let mut changed = false;
        while t >= next_fail {
            next_fail = next_fail + gap(&mut rng);
            // Failures faster than detection could kill everyone: keep two servers alive.
            let alive: Vec<usize> = (0..n).filter(|i| truth.alive[*i]).collect();
            if alive.len() <= 2 {
                continue;
            }
            let victim = alive[rng.below(alive.len() as u64) as usize];
            truth.alive[victim] = false;
            sim.crash(dims.coord(victim));
            ledger.crashed(victim, t);
            failures += 1;
            changed = true;
            if let Some(back) = downs.pop_front() {
                truth.alive[back] = true;
                rejoins += 1;
                if own {
                    sim.restart(dims.coord(back));
                } else {
                    sim.set_server(dims.coord(back), true);
                }
            }
            if own {
                downs.push_back(victim);
            } else {
                pending.push((t + Duration::from_secs_f64(o.detect_ms / 1000.0), victim));
            }
        }
        pending.retain(|(at, v)| {
            if *at <= t {
                sim.set_server(dims.coord(*v), false);
                downs.push_back(*v);
                false
            } else {
                true
            }
        });
        if changed {
            truth.components();
        }
        if own {
            for i in 0..n {
                truth.active[i] = sim.control(i).and_then(|c| c.active_at());
            }
        }
        for (i, carry) in carry.iter_mut().enumerate() {
            // A restarted server's applications wait until its dataplane has a view in which
            // some server takes keys.
            let ready = truth.alive[i] && sim.is_up(i) && sim.node(i).key_root(0).is_some();
            if !ready {
                continue;
            }
            *carry += per_tick;
            while *carry >= 1.0 {
                *carry -= 1.0;
                let key = rng.next_u64();
                if o.reliable {
                    let id = sent + refused + 1;
                    let mut data = id.to_le_bytes().to_vec();
                    data.extend_from_slice(&key.to_be_bytes());
                    let opts = MsgOptions {
                        reliable: true,
                        tag: id,
                        from: Some(SERVICE),
                        ..MsgOptions::default()
                    };
                    match sim.send(i, Target::Key(key), SERVICE, &data, opts) {
                        Ok(()) => {
                            sent += 1;
                            ledger.sent(id, i, key, t);
                        }
                        Err(_) => refused += 1,
                    }
                    continue;
                }
                let opts = MsgOptions::default();
                match sim.send(i, Target::Key(key), 4, &key.to_be_bytes(), opts) {
                    Ok(()) => sent += 1,
                    Err(_) => refused += 1,
                }
            }
        }
        t = t + tick;
        let shared = (!own).then(|| sim.view().clone());
        sim.run_until(t, |at, server, e| {
            let judge = |key: u64, server: usize, at: Time| match &shared {
                Some(v) => shared_misdelivered(v, key, server),
                None => truth.misdelivered(key, server, at),
            };
            if let Event::Message { key: Some(key), .. } = e {
                delivered += 1;
                wrong += u64::from(judge(*key, server, at));
            }
            ledger.event(at, server, e, judge, |k, s, at| truth.has_root(k, s, at));
        });
    }
    // Let the last messages arrive (no churn meanwhile); reliable ones until every one has
    // ended (their deadline).
    let shared = (!own).then(|| sim.view().clone());
    let drain = if o.reliable {
        torusnet_proto::node::KEYED_DEADLINE + Duration::from_secs(1)
    } else {
        Duration::from_millis(5)
    };
    sim.run_until(t + drain, |at, server, e| {
        let judge = |key: u64, server: usize, at: Time| match &shared {
            Some(v) => shared_misdelivered(v, key, server),
            None => truth.misdelivered(key, server, at),
        };
        if let Event::Message { key: Some(key), .. } = e {
            delivered += 1;
            wrong += u64::from(judge(*key, server, at));
        }
        ledger.event(at, server, e, judge, |k, s, at| truth.has_root(k, s, at));
    });
    let st = sim.stats();
    let by = |r: DropReason| {
        DropReason::ALL
            .iter()
            .position(|x| *x == r)
            .map_or(0, |k| st.dropped_by[k] - base.dropped_by[k])
    };
    let dropped = sent.saturating_sub(delivered);
    let lost = st.lost_on_failure - base.lost_on_failure;
    let (unreachable, ttl, no_room) = (
        by(DropReason::Unreachable),
        by(DropReason::TtlExpired),
        st.dropped_no_room - base.dropped_no_room,
    );
    let engine = st.dropped_engine - base.dropped_engine;
    let with_sender = st.lost_with_sender - base.lost_with_sender;
    let no_root = st.key_no_root - base.key_no_root;
    let counted = lost + engine + no_room + with_sender + no_root;
    let wall = t0.elapsed().as_secs_f64();
    Ok(ChurnReport {
        servers: n as u64,
        views: o.views,
        down_pct: o.down_pct,
        failures_per_s: o.rate,
        messages_per_server_per_s: o.msgs,
        simulated_s: o.seconds,
        failures,
        rejoins,
        sent,
        refused_at_source: refused,
        delivered,
        dropped,
        dropped_pct: 100.0 * dropped as f64 / sent.max(1) as f64,
        misdelivered: wrong,
        lost_at_failed_server: lost,
        lost_with_sender: with_sender,
        dropped_no_root: no_root,
        dropped_unreachable: unreachable,
        dropped_ttl_expired: ttl,
        dropped_no_room: no_room,
        dropped_other: engine - unreachable - ttl,
        in_flight_at_end: dropped.saturating_sub(counted),
        bounced: st.bounced - base.bounced,
        control_frames: st.control_frames - base.control_frames,
        events: st.events,
        events_per_s: st.events as f64 / wall.max(1e-9),
        wall_s: wall,
        peak_mib: crate::procmem::peak_mib(),
        ledger: o.reliable.then(|| ledger.finish()),
    })
}

/// The shared-view oracle: the root in the view in force at delivery.
fn shared_misdelivered(view: &LinkView, key: u64, server: usize) -> bool {
    let dims = view.dims();
    keyspace::root(dims, key, |c| view.is_up(c)) != Some(dims.coord(server))
}

fn is_positive(v: f64) -> bool {
    v.is_finite() && v > 0.0
}
