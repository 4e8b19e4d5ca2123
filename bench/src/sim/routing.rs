//! `torus-bench sim routing`: the three routing modes side by side in the simulator
//! (BCube's evaluation of BSR, section 7): link-state next hops, source routes chosen by
//! probing (BSR), and key routing, under all-to-all traffic and a skewed pattern with one
//! hot row of destinations, with 0..20% of servers and links failed. The figure is the
//! aggregate throughput over the live servers (BCube's aggregate bottleneck throughput
//! for flows that all keep sending), next to the analytic bound over what is left.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use torusnet_proto::node::{MsgOptions, Target};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::routing::bsr::BsrConfig;
use torusnet_proto::sim::{all_to_all_bound, all_to_all_bound_view, Sim};
use torusnet_proto::time::Time;
use torusnet_proto::topology::Dir;

use super::harness::PACKET;

/// How a run routes its traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Link-state next hops, the least backlogged per frame (torusnet's default).
    NextHop,
    /// Source routes: BSR probes each flow's parallel paths and keeps it on the one with
    /// the most available bandwidth.
    Source,
    /// Key routing: every packet addressed to a key its destination roots, routed by key
    /// at every hop.
    Key,
}

/// Where traffic goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Every packet to a random other live server, at the analytic all-to-all rate.
    Uniform,
    /// A quarter of the packets to the servers of one row (y = 0, z = 0), the rest
    /// uniform, at half the all-to-all rate (the row's links are the bottleneck).
    HotRow,
    /// Every server sends all its traffic to one partner (a random permutation), at half
    /// the all-to-all rate (a flow on one path must fit one link): long flows, what BSR's
    /// probing is for.
    Permutation,
}

/// One run.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    mode: Mode,
    pattern: Pattern,
    failed_pct: f64,
    servers: u64,
    live_servers: usize,
    /// Live servers that failed links cut off from the rest (they take no part).
    cut_off: usize,
    failed_links: usize,
    /// What the sources offered, Gb/s per live server.
    offered_gbps: f64,
    /// Delivered, Gb/s per live server (mean).
    per_server_gbps: f64,
    /// Delivered, Gb/s over all live servers.
    aggregate_gbps: f64,
    /// BCube's aggregate bottleneck throughput: the live servers times the rate the
    /// least-served of them received (in a permutation, its one flow's rate), Gb/s.
    abt_gbps: f64,
    /// The analytic all-to-all bound over the live servers and links, aggregate Gb/s.
    bound_live_aggregate_gbps: f64,
    /// Packets lost: refused at a full source queue, or unreachable.
    refused: u64,
    /// Probe frames sent (source routing's cost), and as a fraction of data frames.
    probes: u64,
    probe_frames_pct: f64,
    path_switches: u64,
    dropped_no_room: u64,
    events: u64,
    wall_s: f64,
}

/// A key each live server roots in `sim`'s view (found by drawing keys at random).
fn keys_rooted(sim: &Sim, rng: &mut SplitMix64) -> Vec<Option<u64>> {
    let n = sim.dims().count() as usize;
    let mut keys = vec![None; n];
    let mut missing = (0..n).filter(|i| sim.is_up(*i)).count();
    let node = (0..n).find(|i| sim.is_up(*i)).map(|i| sim.node(i));
    let Some(node) = node else { return keys };
    for _ in 0..(n * 200) {
        if missing == 0 {
            break;
        }
        let k = rng.next_u64();
        if let Some(root) = node.key_root(k) {
            let i = sim.dims().index(root);
            if keys[i].is_none() {
                keys[i] = Some(k);
                missing -= 1;
            }
        }
    }
    keys
}

/// Takes `fail_pct` of the links down, at random among those between live servers (`down`
/// marks the failed servers); returns how many it took down.
fn fail_links(sim: &mut Sim, rng: &mut SplitMix64, down: &[bool], fail_pct: f64) -> usize {
    let dims = sim.dims();
    let n = dims.count() as usize;
    let links = n * dims.link_dirs().len() as usize / 2;
    let lfail = ((links as f64) * fail_pct / 100.0).round() as usize;
    let mut failed_links = 0;
    for _ in 0..lfail * 20 {
        if failed_links == lfail {
            break;
        }
        let i = rng.below(n as u64) as usize;
        let d = Dir::ALL[rng.below(6) as usize];
        let c = dims.coord(i);
        if !down[i] && sim.view().live_dirs(c).contains(d) {
            sim.set_link(c, d, false);
            failed_links += 1;
        }
    }
    failed_links
}

/// The largest set of `alive` servers that reach each other, as the first eight see it:
/// failed links may cut servers off, and traffic runs among these (the others are reported
/// as cut off).
fn reaching_each_other(sim: &Sim, alive: &[usize]) -> Vec<usize> {
    let dims = sim.dims();
    let mut live: Vec<usize> = Vec::new();
    for &r in alive.iter().take(8) {
        let routes = sim.node(r).routes();
        let reach: Vec<usize> = alive
            .iter()
            .copied()
            .filter(|&i| i == r || routes.is_reachable(dims.coord(i)))
            .collect();
        if reach.len() > live.len() {
            live = reach;
        }
    }
    live
}

/// A random permutation of `0..n` (Sattolo's: no fixed point when n > 1): position p sends
/// to `partner[p]`.
fn derangement(rng: &mut SplitMix64, n: usize) -> Vec<usize> {
    let mut partner: Vec<usize> = (0..n).collect();
    for p in (1..partner.len()).rev() {
        let q = rng.below(p as u64) as usize;
        partner.swap(p, q);
    }
    partner
}

/// Source routing's probes (with their replies) and path switches, over every server.
fn source_routing_counts(sim: &Sim) -> (u64, u64) {
    let (mut probes, mut switches) = (0u64, 0u64);
    for i in 0..sim.dims().count() as usize {
        let s = sim.node(i).source_stats();
        probes += s.bsr.probes + s.replies_sent;
        switches += s.bsr.switches;
    }
    (probes, switches)
}

/// One run of `mode` under `pattern` with `fail_pct` of the servers and of the links down.
#[allow(clippy::too_many_arguments)]
pub fn run_point(
    k: u16,
    mode: Mode,
    pattern: Pattern,
    fail_pct: f64,
    ms: f64,
    seed: u64,
    threads: usize,
) -> Result<Point, String> {
    let c = super::harness::cfg(k, true)?;
    let t0 = Instant::now();
    let mut sim = Sim::with_threads(c, threads)?;
    let dims = sim.dims();
    let n = dims.count() as usize;
    // The same failures for every mode: the seed alone picks them.
    let mut rng = SplitMix64::new(seed);
    let down = super::harness::fail_servers(&mut sim, &mut rng, fail_pct);
    let failed_links = fail_links(&mut sim, &mut rng, &down, fail_pct);
    let alive: Vec<usize> = (0..n).filter(|i| !down[*i]).collect();
    let live = reaching_each_other(&sim, &alive);
    let cut_off = alive.len() - live.len();
    if live.len() < 2 {
        return Err(format!("{fail_pct}% failed leaves fewer than two servers"));
    }
    if mode == Mode::Source {
        sim.enable_source_routing(BsrConfig::default());
    }
    sim.measure_link_loads(Duration::from_millis(10));
    let mut traffic_rng = SplitMix64::new(seed ^ 0x5eed);
    let keys = keys_rooted(&sim, &mut traffic_rng);
    let hot: Vec<usize> = live
        .iter()
        .copied()
        .filter(|i| {
            let c = dims.coord(*i);
            c.y == 0 && c.z == 0
        })
        .collect();
    let bound = all_to_all_bound(dims, c.rate_bps) / 1e9;
    let bound_live = all_to_all_bound_view(sim.view(), c.rate_bps) / 1e9;
    let offered = match pattern {
        Pattern::Uniform => bound,
        Pattern::HotRow | Pattern::Permutation => bound / 2.0,
    };
    let partner = derangement(&mut traffic_rng, live.len());
    let interval = PACKET as f64 * 8.0 / (offered * 1e9);
    let mut pacer = super::harness::Pacer::new(&mut traffic_rng, live.len(), interval);
    let mut due: Vec<(usize, u32)> = Vec::new();
    let msg = vec![0x5a_u8; PACKET];
    let opts = MsgOptions::default();
    let total = Duration::from_secs_f64(ms / 1000.0);
    let warm = total / 5;
    let tick = Duration::from_micros(10);
    let mut refused = 0u64;
    let mut received = vec![0u64; n];
    let mut t = Time::ZERO;
    let mut batch: Vec<(usize, Target)> = Vec::new();
    while t < Time::ZERO + total {
        let now_s = t.0 as f64 / 1e9;
        pacer.due(now_s, &mut due);
        for &(p, count) in &due {
            let i = live[p];
            for _ in 0..count {
                let to_hot =
                    pattern == Pattern::HotRow && !hot.is_empty() && traffic_rng.chance(0.25);
                let d = if pattern == Pattern::Permutation {
                    live[partner[p]]
                } else if to_hot {
                    hot[traffic_rng.below(hot.len() as u64) as usize]
                } else {
                    let q = traffic_rng.below(live.len() as u64 - 1) as usize;
                    live[q + usize::from(q >= p)]
                };
                if d == i {
                    continue;
                }
                let to = match (mode, keys[d]) {
                    (Mode::Key, Some(key)) => Target::Key(key),
                    _ => Target::Server(dims.coord(d)),
                };
                batch.push((i, to));
            }
        }
        t = t + tick;
        let (u, r) =
            super::harness::paced_step(&mut sim, &mut batch, &msg, opts, t, warm, &mut received)?;
        refused += u + r;
    }
    let delivered: u64 = received.iter().sum();
    let secs = (total - warm).as_secs_f64();
    let aggregate = delivered as f64 * 8.0 / secs / 1e9;
    let least = live.iter().map(|&i| received[i]).min().unwrap_or(0);
    let abt = live.len() as f64 * least as f64 * 8.0 / secs / 1e9;
    let st = sim.stats();
    let (probes, switches) = source_routing_counts(&sim);
    let data_frames = (delivered / PACKET as u64).max(1);
    Ok(Point {
        mode,
        pattern,
        failed_pct: fail_pct,
        servers: n as u64,
        live_servers: live.len(),
        cut_off,
        failed_links,
        offered_gbps: offered,
        per_server_gbps: aggregate / live.len() as f64,
        aggregate_gbps: aggregate,
        abt_gbps: abt,
        bound_live_aggregate_gbps: bound_live * live.len() as f64,
        refused,
        probes,
        probe_frames_pct: 100.0 * probes as f64 / data_frames as f64,
        path_switches: switches,
        dropped_no_room: st.dropped_no_room,
        events: st.events,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

/// Options of `torus-bench sim routing`.
#[derive(clap::Args)]
pub struct Args {
    /// Torus size k (k x k x k).
    #[arg(long, default_value_t = 8)]
    k: u16,
    /// Percentages of servers, and of links, failed at random.
    #[arg(long, default_value = "0,5,10,15,20")]
    percent: String,
    /// Simulated milliseconds per run (the first fifth is warm-up).
    #[arg(long, default_value_t = 20.0)]
    ms: f64,
    /// Routing modes, comma-separated: next-hop, source, key.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "next-hop,source,key"
    )]
    modes: Vec<Mode>,
    /// Traffic patterns, comma-separated: uniform, hot-row, permutation.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "uniform,hot-row,permutation"
    )]
    patterns: Vec<Pattern>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Write SVG charts into this directory.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Seed (picks the failures, the same for every mode).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Threads to run the simulator on (default: every core for 512 servers or more).
    #[arg(long)]
    threads: Option<usize>,
}

/// Runs the sweep and prints a table (or JSON), and charts with `--plot`.
pub fn run(a: &Args) -> Result<(), String> {
    let percents: Vec<f64> = a
        .percent
        .split(',')
        .map(|p| {
            p.trim()
                .parse::<f64>()
                .map_err(|e| format!("--percent {p}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    if percents.iter().any(|p| !(0.0..50.0).contains(p)) {
        return Err("--percent: failure percentages go from 0 to under 50".into());
    }
    if !(a.ms > 0.0 && a.ms.is_finite()) {
        return Err(format!("--ms: {} is not a positive duration", a.ms));
    }
    let mut pts = Vec::new();
    for &pattern in &a.patterns {
        for &f in &percents {
            for &mode in &a.modes {
                let threads = super::harness::threads_for(a.threads, a.k);
                let p = run_point(a.k, mode, pattern, f, a.ms, a.seed, threads)?;
                if !a.json {
                    println!(
                        "{:>8} {:>9} {:>4.0}% failed: {:>7.1} Gb/s aggregate, ABT {:.1} ({:.3} per live server, {:.0}% of the live bound {:.1}); probes {:.2}% of data frames, {} path switches; {:.1} s",
                        format!("{:?}", pattern), format!("{:?}", mode), f, p.aggregate_gbps, p.abt_gbps, p.per_server_gbps,
                        100.0 * p.aggregate_gbps / p.bound_live_aggregate_gbps.max(1e-9), p.bound_live_aggregate_gbps,
                        p.probe_frames_pct, p.path_switches, p.wall_s
                    );
                }
                pts.push(p);
            }
        }
    }
    if a.json {
        println!(
            "{}",
            json!({"experiment": "routing", "servers": u64::from(a.k).pow(3), "simulated_ms": a.ms, "points": pts})
        );
    }
    if let Some(dir) = &a.plot {
        for &pattern in &a.patterns {
            let series: Vec<(&str, Vec<(f64, f64)>)> = a
                .modes
                .iter()
                .map(|m| {
                    let name = match m {
                        Mode::NextHop => "next hops",
                        Mode::Source => "source routes (BSR)",
                        Mode::Key => "key routing",
                    };
                    let pts: Vec<(f64, f64)> = pts
                        .iter()
                        .filter(|p| p.mode == *m && p.pattern == pattern)
                        .map(|p| (p.failed_pct, p.aggregate_gbps))
                        .collect();
                    (name, pts)
                })
                .collect();
            let (file, title) = match pattern {
                Pattern::Uniform => (
                    "sim-routing-uniform.svg",
                    "All-to-all: aggregate throughput vs failed servers and links",
                ),
                Pattern::HotRow => (
                    "sim-routing-hotrow.svg",
                    "Hot row: aggregate throughput vs failed servers and links",
                ),
                Pattern::Permutation => (
                    "sim-routing-permutation.svg",
                    "Permutation (long flows): aggregate throughput vs failed servers and links",
                ),
            };
            crate::plot::xy_chart(
                &dir.join(file),
                title,
                "failed servers and links (%)",
                "aggregate Gb/s",
                &series,
                false,
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use torusnet_proto::topology::Coord;

    #[test]
    fn every_mode_delivers_and_long_flows_are_probed() {
        for mode in [Mode::NextHop, Mode::Source, Mode::Key] {
            let p = run_point(4, mode, Pattern::Uniform, 10.0, 5.0, 3, 1).unwrap();
            assert!(
                p.aggregate_gbps > 0.5 * p.bound_live_aggregate_gbps,
                "{mode:?}: {p:?}"
            );
            // Short flows (a few packets to each of 57 peers) are not worth a probe.
            assert_eq!(p.probes, 0, "{p:?}");
            let p = run_point(4, mode, Pattern::Permutation, 10.0, 10.0, 3, 1).unwrap();
            assert!(p.aggregate_gbps > 0.0, "{p:?}");
            assert_eq!(p.probes > 0, mode == Mode::Source, "{p:?}");
        }
    }

    #[test]
    fn keys_are_found_for_every_live_server() {
        let c = crate::sim::harness::cfg(4, true).unwrap();
        let mut sim = Sim::new(c).unwrap();
        sim.set_server(Coord::new(1, 1, 1), false);
        let keys = keys_rooted(&sim, &mut SplitMix64::new(1));
        let dims = sim.dims();
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(k.is_some(), i != dims.index(Coord::new(1, 1, 1)), "{i}");
            if let Some(k) = k {
                assert_eq!(sim.node(0).key_root(*k), Some(dims.coord(i)));
            }
        }
    }
}
