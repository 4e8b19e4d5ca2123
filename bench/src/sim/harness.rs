//! What the simulator's experiments share: the simulated torus, failed servers, and paced
//! traffic (sources that send at a set rate from random phases).

use std::time::Duration;

use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::sim::{Sim, SimConfig};
use torusnet_proto::time::Time;
use torusnet_proto::topology::Dims;
use torusnet_proto::transport::{Config, SendError};

/// Servers from which a run uses every core unless told otherwise: below it a part's
/// windows last microseconds and two parts spend them waiting for each other.
const PARALLEL_FROM: u64 = 512;

/// The threads for a torus of `k`^3 servers: `asked`, or every core from [`PARALLEL_FROM`] servers up.
pub(crate) fn threads_for(asked: Option<usize>, k: u16) -> usize {
    asked.unwrap_or_else(|| {
        if u64::from(k).pow(3) >= PARALLEL_FROM {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            1
        }
    })
}

/// The simulated torus of the experiments: k x k x k, 1 Gb/s links, 1 us, MTU 9000.
pub(crate) fn cfg(k: u16, spread_by_load: bool) -> Result<SimConfig, String> {
    Ok(SimConfig {
        dims: Dims::new(k, k, k).map_err(|e| e.to_string())?,
        rate_bps: 1_000_000_000,
        delay: Duration::from_micros(1),
        queue_frames: 32,
        transport: Config {
            mtu: 9000,
            queue_bytes: 256 << 10,
            // The same frames either way; the payloads are runs the queues need not copy.
            compact_runs: true,
            ..Config::default()
        },
        spread_by_load,
    })
}

/// One tick of paced traffic: sends `batch` (each part of the torus its own sources'),
/// runs the simulator to `until`, and adds what each server received after `warm` to
/// `per_server`. Returns the packets refused as unreachable and those a full source queue
/// could not take (lost at the source).
pub(crate) fn paced_step(
    sim: &mut Sim,
    batch: &mut Vec<(usize, Target)>,
    msg: &[u8],
    opts: MsgOptions,
    until: Time,
    warm: Duration,
    per_server: &mut [u64],
) -> Result<(u64, u64), String> {
    let (mut unreachable, mut refused) = (0, 0);
    for r in sim.send_many(batch, 9, msg, opts) {
        match r {
            Ok(()) => {}
            Err(SendError::Unreachable) => unreachable += 1,
            Err(SendError::WouldBlock) => refused += 1,
            Err(e) => return Err(e.to_string()),
        }
    }
    batch.clear();
    let measuring = |at: Time| at >= Time::ZERO + warm;
    sim.run_until(until, |at, server, e| {
        if let Event::Message { data, .. } = e {
            if measuring(at) {
                per_server[server] += data.len() as u64;
            }
        }
    });
    Ok((unreachable, refused))
}

/// Payload of one all-to-all packet: one per jumbo frame.
pub(crate) const PACKET: usize = 8192;

/// Fails `pct` of the servers, picked by `rng`, as the control plane would have detected
/// (out of every view); which are down.
pub(crate) fn fail_servers(sim: &mut Sim, rng: &mut SplitMix64, pct: f64) -> Vec<bool> {
    let dims = sim.dims();
    let n = dims.count() as usize;
    let mut down = vec![false; n];
    let nfail = ((n as f64) * pct / 100.0).round() as usize;
    while down.iter().filter(|d| **d).count() < nfail {
        let i = rng.below(n as u64) as usize;
        if !down[i] {
            down[i] = true;
            sim.set_server(dims.coord(i), false);
        }
    }
    down
}

/// When each of `n` paced sources first sends, at random within one `interval`, so that
/// they do not all send in step.
pub(crate) fn phases(rng: &mut SplitMix64, n: usize, interval: f64) -> Vec<f64> {
    (0..n)
        .map(|_| rng.below(1 << 20) as f64 / f64::from(1 << 20) * interval)
        .collect()
}

/// When each of `n` sources sends its next packet: every `interval` seconds from a random
/// phase. Only the sources due are visited each tick (looking at all 4096 every 10 us was
/// a pause, on one thread, that every part waited for).
pub(crate) struct Pacer {
    next_at: Vec<f64>,
    interval: f64,
    /// The sources by phase. A source sends at its phase plus whole intervals, so they come
    /// due in this order, round after round: those due next always follow the last served
    /// (a heap of 4096 sources, popped and pushed per packet, was 3% of a run, on the one
    /// thread every part waits for).
    order: Vec<usize>,
    /// Where in `order` the next source to come due is.
    at: usize,
}

impl Pacer {
    pub(crate) fn new(rng: &mut SplitMix64, n: usize, interval: f64) -> Pacer {
        let next_at = phases(rng, n, interval);
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|a, b| next_at[*a].total_cmp(&next_at[*b]).then(a.cmp(b)));
        Pacer {
            next_at,
            interval,
            order,
            at: 0,
        }
    }

    /// The sources with packets due by `now_s`, in source order, each with how many
    /// (`out` is cleared first).
    pub(crate) fn due(&mut self, now_s: f64, out: &mut Vec<(usize, u32)>) {
        out.clear();
        // Each source once at most: one that is due sends all it owes.
        for _ in 0..self.order.len() {
            let p = self.order[self.at];
            if self.next_at[p] > now_s {
                break;
            }
            let mut count = 0;
            while self.next_at[p] <= now_s {
                self.next_at[p] += self.interval;
                count += 1;
            }
            out.push((p, count));
            self.at = (self.at + 1) % self.order.len();
        }
        if out.len() == self.order.len() {
            // Time moved on by an interval or more: every source sent, and the first due
            // now is wherever the round starts, not where the last one ended.
            let at = |k: &usize| self.next_at[self.order[*k]];
            self.at = (0..self.order.len())
                .min_by(|a, b| at(a).total_cmp(&at(b)).then(a.cmp(b)))
                .unwrap_or(0);
        }
        out.sort_unstable();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_names_exactly_the_sources_due() {
        // Against a look at every source: ticks shorter and longer than the interval.
        let mut rng = SplitMix64::new(8);
        let interval = 131e-6;
        let mut pacer = Pacer::new(&mut rng, 500, interval);
        let mut rng = SplitMix64::new(8);
        let mut next_at = phases(&mut rng, 500, interval);
        let (mut now, mut out) = (0.0, Vec::new());
        let mut sent = 0;
        for k in 0..3000u64 {
            now += [10e-6, 1e-6, 400e-6, 0.0][(k % 4) as usize];
            pacer.due(now, &mut out);
            let mut want = Vec::new();
            for (p, t) in next_at.iter_mut().enumerate() {
                let mut count = 0;
                while *t <= now {
                    *t += interval;
                    count += 1;
                }
                if count > 0 {
                    want.push((p, count));
                }
            }
            sent += want.len();
            assert_eq!(out, want, "at {now}");
        }
        assert!(sent > 10_000);
    }
}
