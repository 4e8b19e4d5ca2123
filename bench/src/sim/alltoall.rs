//! `torus-bench sim alltoall`: all-to-all throughput per server against torus size and
//! against failed servers, paced as CamCube measured it or through the reliable transport.

use std::time::{Duration, Instant};

use serde::Serialize;
use torusnet_proto::node::{MsgOptions, Target};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::sim::{all_to_all_bound, all_to_all_bound_view, Sim};
use torusnet_proto::time::Time;
use torusnet_proto::transport::SendError;

use super::harness::{cfg, fail_servers, paced_step, Pacer, PACKET};

#[derive(Debug, Clone, Serialize)]
pub(super) struct Point {
    pub(super) servers: u64,
    /// Threads the simulator ran on.
    pub(super) threads: usize,
    pub(super) failed_pct: f64,
    pub(super) load: Load,
    /// Per-server rate offered (paced load).
    pub(super) offered_gbps: f64,
    /// Mean over live servers.
    pub(super) per_server_gbps: f64,
    /// Median over live servers (CamCube's Figure 5(b) plots the median).
    pub(super) median_gbps: f64,
    /// The analytic expectation for the whole torus (what paced load offers).
    pub(super) bound_gbps: f64,
    /// The analytic expectation over the live servers and links only.
    pub(super) bound_live_gbps: f64,
    pub(super) fraction_of_bound: f64,
    pub(super) packets_offered: u64,
    /// Paced packets a server could not even queue (its send queue was full).
    pub(super) refused_at_source: u64,
    /// Packets addressed to failed servers (with `--to-failed`), refused by the engine.
    pub(super) unreachable: u64,
    pub(super) events: u64,
    pub(super) wakes: u64,
    pub(super) forwarded: u64,
    pub(super) events_per_s: f64,
    pub(super) wall_s: f64,
    pub(super) memory_per_server_kib: f64,
    /// Peak resident memory of the run, MiB.
    pub(super) peak_mib: f64,
    pub(super) dropped_no_room: u64,
    pub(super) dropped_engine: u64,
    pub(super) retransmitted_frames: u64,
    pub(super) ack_frames: u64,
}

/// How all-to-all traffic is generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(super) enum Load {
    /// CamCube's method (CamCubeOS paper 4.2.3): no flow control; every server sends
    /// unreliable 8 KB packets at the expected (analytic) per-server rate.
    Paced,
    /// Every server keeps its reliable transport's send queue full: flow control,
    /// acknowledgements and retransmission included.
    Reliable,
}

/// How an all-to-all run is driven.
#[derive(Debug, Clone, Copy)]
pub(super) struct Traffic {
    /// Simulated milliseconds (the first fifth is warm-up).
    pub(super) ms: f64,
    pub(super) seed: u64,
    pub(super) load: Load,
    /// Sources address failed servers too.
    pub(super) to_failed: bool,
    /// Forward on the least-loaded next hop (else the first with room).
    pub(super) spread: bool,
    /// Threads the simulator runs on.
    pub(super) threads: usize,
    /// Every payload byte through the engines' queues (no compacted runs).
    pub(super) real_bytes: bool,
    /// The congestion controller on (reliable load).
    pub(super) congestion: bool,
}

impl Traffic {
    #[cfg(test)]
    pub(super) fn new(ms: f64, seed: u64, load: Load) -> Traffic {
        Traffic {
            ms,
            seed,
            load,
            to_failed: false,
            spread: true,
            threads: 1,
            real_bytes: false,
            congestion: false,
        }
    }
}

/// All-to-all at torus size k with `fail_pct` of the servers down: per-server throughput.
/// `to_failed`: sources keep addressing every other server, failed ones included (their
/// packets are refused as unreachable), as a job that does not know who failed would.
pub(super) fn alltoall(k: u16, fail_pct: f64, tr: &Traffic) -> Result<Point, String> {
    let Traffic {
        ms,
        seed,
        load,
        to_failed,
        spread,
        threads,
        real_bytes,
        congestion,
    } = *tr;
    crate::procmem::reset_peak();
    let rss0 = crate::procmem::rss_kib();
    let mut c = cfg(k, spread)?;
    c.transport.compact_runs = !real_bytes;
    c.transport.congestion.on = congestion;
    let t0 = Instant::now();
    let mut sim = Sim::with_threads(c, threads)?;
    let dims = sim.dims();
    let n = dims.count() as usize;
    let mut rng = SplitMix64::new(seed);
    let down = fail_servers(&mut sim, &mut rng, fail_pct);
    let live: Vec<usize> = (0..n).filter(|i| !down[*i]).collect();
    if live.len() < 2 {
        return Err(format!(
            "all-to-all needs two live servers; {n} servers with {fail_pct}% failed leave {}",
            live.len()
        ));
    }
    // Paced load offers the rate expected for the whole torus, failures or not (the paper
    // computes it "given N servers").
    let bound = all_to_all_bound(dims, c.rate_bps) / 1e9;
    let bound_live = all_to_all_bound_view(sim.view(), c.rate_bps) / 1e9;
    let msg = vec![0x5a_u8; PACKET];
    let opts = MsgOptions {
        reliable: load == Load::Reliable,
        ..MsgOptions::default()
    };
    // Every packet to a random other server. (Destinations in index order, all servers in
    // step, sent the whole torus's traffic along one displacement at a time: a few links
    // overloaded, the others idle.)
    let interval = PACKET as f64 * 8.0 / (bound * 1e9);
    let mut pacer = Pacer::new(&mut rng, live.len(), interval);
    let mut due: Vec<(usize, u32)> = Vec::new();
    let total = Duration::from_secs_f64(ms / 1000.0);
    let warm = total / 5;
    let tick = match load {
        Load::Paced => Duration::from_micros(10),
        Load::Reliable => Duration::from_micros(100),
    };
    let (mut offered, mut refused, mut unreachable) = (0u64, 0u64, 0u64);
    let mut per_server = vec![0u64; n];
    let mut t = Time::ZERO;
    let mut batch: Vec<(usize, Target)> = Vec::new();
    while t < Time::ZERO + total {
        let now_s = t.0 as f64 / 1e9;
        match load {
            Load::Paced => pacer.due(now_s, &mut due),
            Load::Reliable => {
                due.clear();
                due.extend((0..live.len()).map(|p| (p, 64)));
            }
        }
        for &(p, mut budget) in &due {
            let i = live[p];
            while budget > 0 {
                let d = if to_failed {
                    let d = rng.below(n as u64 - 1) as usize;
                    d + usize::from(d >= i)
                } else {
                    let q = rng.below(live.len() as u64 - 1) as usize;
                    live[q + usize::from(q >= p)]
                };
                budget -= 1;
                offered += 1;
                let to = Target::Server(dims.coord(d));
                if load == Load::Paced {
                    // Paced sends do not depend on each other's outcome: all of this tick's
                    // go out together, each part of the torus sending its own.
                    batch.push((i, to));
                    continue;
                }
                match sim.send(i, to, 9, &msg, opts) {
                    Ok(()) => {}
                    Err(SendError::Unreachable) => unreachable += 1,
                    Err(SendError::WouldBlock) => {
                        offered -= 1;
                        break;
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
        t = t + tick;
        let (u, r) = paced_step(&mut sim, &mut batch, &msg, opts, t, warm, &mut per_server)?;
        unreachable += u;
        refused += r;
    }
    let delivered_bytes: u64 = per_server.iter().sum();
    let secs = (total - warm).as_secs_f64();
    let per = delivered_bytes as f64 * 8.0 / secs / live.len() as f64 / 1e9;
    let mut each: Vec<u64> = live.iter().map(|&i| per_server[i]).collect();
    each.sort_unstable();
    let median = each
        .get(each.len() / 2)
        .map_or(0.0, |b| *b as f64 * 8.0 / secs / 1e9);
    let wall = t0.elapsed().as_secs_f64();
    let st = sim.stats();
    Ok(Point {
        servers: n as u64,
        threads,
        failed_pct: fail_pct,
        load,
        offered_gbps: match load {
            Load::Paced => bound,
            Load::Reliable => f64::NAN,
        },
        per_server_gbps: per,
        median_gbps: median,
        bound_gbps: bound,
        bound_live_gbps: bound_live,
        fraction_of_bound: per / bound.max(1e-9),
        packets_offered: offered,
        refused_at_source: refused,
        unreachable,
        events: st.events,
        wakes: st.wakes,
        forwarded: st.forwarded,
        events_per_s: st.events as f64 / wall.max(1e-9),
        wall_s: wall,
        memory_per_server_kib: (crate::procmem::rss_kib() - rss0).max(0.0) / n as f64,
        peak_mib: crate::procmem::peak_mib(),
        dropped_no_room: st.dropped_no_room,
        dropped_engine: st.dropped_engine,
        retransmitted_frames: (0..n)
            .map(|i| sim.node(i).transport_stats().retransmitted_frames)
            .sum(),
        ack_frames: (0..n)
            .map(|i| sim.node(i).transport_stats().ack_frames)
            .sum(),
    })
}
