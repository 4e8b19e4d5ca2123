//! `torus-bench sim`: experiments on the packet-level simulator (proto/src/sim/), which
//! runs the project's own engines: all-to-all throughput against torus size and against
//! failed servers, and key-routed traffic under churn checked by an oracle.

use std::time::{Duration, Instant};

use crate::churn::{churn, ChurnOpts, ChurnReport, Views};
use serde::Serialize;
use serde_json::json;
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::sim::{all_to_all_bound, all_to_all_bound_view, Sim, SimConfig};
use torusnet_proto::time::Time;
use torusnet_proto::topology::Dims;
use torusnet_proto::transport::{Config, SendError};

/// Options of `torus-bench sim`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    exp: Exp,
}

#[derive(clap::Subcommand)]
enum Exp {
    /// All-to-all throughput per server against torus size, with the analytic bound.
    Alltoall {
        /// Tori to simulate (k for k x k x k), comma-separated.
        #[arg(long, default_value = "3,4,6,8")]
        sizes: String,
        /// Simulated milliseconds per torus (the first 20% are warm-up).
        #[arg(long, default_value_t = 20.0)]
        ms: f64,
        /// How traffic is generated.
        #[arg(long, value_enum, default_value_t = Load::Paced)]
        load: Load,
        /// Forward on the first next hop with room instead of the least backlogged.
        #[arg(long)]
        first_hop: bool,
        #[command(flatten)]
        out: Out,
    },
    /// All-to-all throughput at one size with 0..N% of servers failed at random.
    Failures {
        /// Torus size k (k x k x k).
        #[arg(long, default_value_t = 8)]
        k: u16,
        /// Failure percentages, comma-separated.
        #[arg(long, default_value = "0,5,10,15,20")]
        percent: String,
        /// Simulated milliseconds per point (the first 20% are warm-up).
        #[arg(long, default_value_t = 20.0)]
        ms: f64,
        /// How traffic is generated.
        #[arg(long, value_enum, default_value_t = Load::Paced)]
        load: Load,
        /// Forward on the first next hop with room instead of the least backlogged.
        #[arg(long)]
        first_hop: bool,
        /// Sources keep addressing failed servers too (those packets are lost).
        #[arg(long)]
        to_failed: bool,
        #[command(flatten)]
        out: Out,
    },
    /// The routing modes (next hops, source routes by BSR, key routing) under all-to-all and
    /// a hot row, with 0..20% of servers and links failed: aggregate throughput.
    Routing(crate::sim_routing::Args),
    /// Key-routed messages under churn: servers fail and rejoin; an oracle checks where
    /// every message landed.
    Churn {
        /// Torus size k (k x k x k).
        #[arg(long, default_value_t = 8)]
        k: u16,
        /// Fraction of servers down at any time, percent.
        #[arg(long, default_value_t = 10.0)]
        down: f64,
        /// Failures per second, comma-separated for a sweep (exponential gaps; the server
        /// down longest rejoins at each failure, so the down fraction holds).
        #[arg(long, default_value = "2")]
        rate: String,
        /// Messages per server per second to random keys.
        #[arg(long, default_value_t = 1000.0)]
        msgs: f64,
        /// Simulated seconds.
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        /// How servers learn of failures: each from its own control plane (hellos and
        /// flooding on the simulated links), or one view shared by all.
        #[arg(long, value_enum, default_value_t = Views::Own)]
        views: Views,
        /// Shared views: failure detection delay (K hellos), ms.
        #[arg(long, default_value_t = 300.0)]
        detect_ms: f64,
        /// Own views: seconds between unchanged re-floods of each server's record (changes
        /// flood at once; records expire after three of these).
        #[arg(long, default_value_t = 10.0)]
        refresh_s: f64,
        /// Own views: how long a rejoining server relays before taking its keys, ms (0
        /// shows what the hold-down prevents).
        #[arg(long, default_value_t = 200.0)]
        holddown_ms: f64,
        #[command(flatten)]
        out: Out,
    },
}

#[derive(clap::Args)]
struct Out {
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Write an SVG chart into this directory.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Threads to run the simulator on (the torus is split into as many parts, run in
    /// parallel windows; the result is the same whatever the number). Default: every core
    /// for tori of 512 servers or more, one below.
    #[arg(long)]
    threads: Option<usize>,
    /// Carry every payload byte through the engines' send queues, for verification: the
    /// figures must not change (by default a queued payload whose bytes are all one value
    /// is held as that value, and written out only into its frame).
    #[arg(long)]
    real_bytes: bool,
}

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

#[derive(Debug, Clone, Serialize)]
struct Point {
    servers: u64,
    /// Threads the simulator ran on.
    threads: usize,
    failed_pct: f64,
    load: Load,
    /// Per-server rate offered (paced load).
    offered_gbps: f64,
    /// Mean over live servers.
    per_server_gbps: f64,
    /// Median over live servers (CamCube's Figure 5(b) plots the median).
    median_gbps: f64,
    /// The analytic expectation for the whole torus (what paced load offers).
    bound_gbps: f64,
    /// The analytic expectation over the live servers and links only.
    bound_live_gbps: f64,
    fraction_of_bound: f64,
    packets_offered: u64,
    /// Paced packets a server could not even queue (its send queue was full).
    refused_at_source: u64,
    /// Packets addressed to failed servers (with `--to-failed`), refused by the engine.
    unreachable: u64,
    events: u64,
    wakes: u64,
    forwarded: u64,
    events_per_s: f64,
    wall_s: f64,
    memory_per_server_kib: f64,
    /// Peak resident memory of the run, MiB.
    peak_mib: f64,
    dropped_no_room: u64,
    dropped_engine: u64,
    retransmitted_frames: u64,
    ack_frames: u64,
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

/// How all-to-all traffic is generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
enum Load {
    /// CamCube's method (CamCubeOS paper 4.2.3): no flow control; every server sends
    /// unreliable 8 KB packets at the expected (analytic) per-server rate.
    Paced,
    /// Every server keeps its reliable transport's send queue full: flow control,
    /// acknowledgements and retransmission included.
    Reliable,
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

/// All-to-all at torus size k with `fail_pct` of the servers down: per-server throughput.
/// `to_failed`: sources keep addressing every other server, failed ones included (their
/// packets are refused as unreachable), as a job that does not know who failed would.
/// How an all-to-all run is driven.
#[derive(Debug, Clone, Copy)]
struct Traffic {
    /// Simulated milliseconds (the first fifth is warm-up).
    ms: f64,
    seed: u64,
    load: Load,
    /// Sources address failed servers too.
    to_failed: bool,
    /// Forward on the least-loaded next hop (else the first with room).
    spread: bool,
    /// Threads the simulator runs on.
    threads: usize,
    /// Every payload byte through the engines' queues (no compacted runs).
    real_bytes: bool,
}

impl Traffic {
    #[cfg(test)]
    fn new(ms: f64, seed: u64, load: Load) -> Traffic {
        Traffic {
            ms,
            seed,
            load,
            to_failed: false,
            spread: true,
            threads: 1,
            real_bytes: false,
        }
    }
}

fn alltoall(k: u16, fail_pct: f64, tr: &Traffic) -> Result<Point, String> {
    let Traffic {
        ms,
        seed,
        load,
        to_failed,
        spread,
        threads,
        real_bytes,
    } = *tr;
    crate::procmem::reset_peak();
    let rss0 = crate::procmem::rss_kib();
    let mut c = cfg(k, spread)?;
    c.transport.compact_runs = !real_bytes;
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

fn list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<T>()
                .map_err(|_| format!("bad list item {x:?}"))
        })
        .collect()
}

/// Re-runs this process with glibc's allocator asking for transparent huge pages, unless
/// the environment already says (`GLIBC_TUNABLES=glibc.malloc.hugetlb=0` keeps 4 KB pages).
/// The simulator touches a few header bytes of frames spread over hundreds of megabytes,
/// so with 4 KB pages nearly every hop also misses the TLB: 512 servers for one simulated
/// second took 69.6 s with 4 KB pages and 56.7 s with huge pages here.
fn with_huge_pages() {
    use std::os::unix::process::CommandExt;
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if tunables.contains("glibc.malloc.hugetlb") {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let value = if tunables.is_empty() {
        "glibc.malloc.hugetlb=1".to_string()
    } else {
        format!("{tunables}:glibc.malloc.hugetlb=1")
    };
    // exec returns only when it failed; the run then goes on with 4 KB pages.
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("GLIBC_TUNABLES", value)
        .exec();
    eprintln!("torus-bench: running without huge pages: {err}");
}

/// A finite number above zero (durations, rates).
fn is_positive(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

/// Checks what every experiment shares: a simulated duration that is a positive number.
fn positive(what: &str, v: f64) -> Result<f64, String> {
    if is_positive(v) {
        Ok(v)
    } else {
        Err(format!("{what} must be a positive number, not {v}"))
    }
}

/// Runs one experiment.
pub fn run(a: &Args) -> Result<(), String> {
    with_huge_pages();
    match &a.exp {
        Exp::Routing(r) => crate::sim_routing::run(r)?,
        Exp::Alltoall {
            sizes,
            ms,
            load,
            first_hop,
            out,
        } => {
            let mut pts = Vec::new();
            for k in list::<u16>(sizes)? {
                let tr = Traffic {
                    ms: positive("--ms", *ms)?,
                    seed: out.seed,
                    load: *load,
                    to_failed: false,
                    spread: !first_hop,
                    threads: threads_for(out.threads, k),
                    real_bytes: out.real_bytes,
                };
                let p = alltoall(k, 0.0, &tr)?;
                if !out.json {
                    println!(
                        "{:>5} servers: {:.3} Gb/s per server (bound {:.3}, {:.0}%), {} events in {:.1} s on {} thread{} = {:.2} M events/s, {:.0} KiB/server, peak {:.0} MiB",
                        p.servers, p.per_server_gbps, p.bound_gbps, 100.0 * p.fraction_of_bound, p.events, p.wall_s, p.threads, if p.threads == 1 { "" } else { "s" }, p.events_per_s / 1e6, p.memory_per_server_kib, p.peak_mib
                    );
                }
                pts.push(p);
            }
            if out.json {
                println!(
                    "{}",
                    json!({"experiment": "alltoall", "simulated_ms": ms, "points": pts})
                );
            }
            if let Some(dir) = &out.plot {
                crate::plot::xy_chart(
                    &dir.join("sim-alltoall.svg"),
                    "All-to-all throughput per server vs torus size (1 Gb/s links)",
                    "servers",
                    "Gb/s per server",
                    &[
                        (
                            "simulated",
                            pts.iter()
                                .map(|p| (p.servers as f64, p.per_server_gbps))
                                .collect(),
                        ),
                        (
                            "analytic bound",
                            pts.iter()
                                .map(|p| (p.servers as f64, p.bound_gbps))
                                .collect(),
                        ),
                    ],
                    true,
                )?;
            }
        }
        Exp::Failures {
            k,
            percent,
            ms,
            load,
            first_hop,
            to_failed,
            out,
        } => {
            let mut pts = Vec::new();
            for f in list::<f64>(percent)? {
                if !(0.0..100.0).contains(&f) {
                    return Err(format!(
                        "failure percentages go from 0 to under 100, not {f}"
                    ));
                }
                let ms = positive("--ms", *ms)?;
                let tr = Traffic {
                    ms,
                    seed: out.seed,
                    load: *load,
                    to_failed: *to_failed,
                    spread: !first_hop,
                    threads: threads_for(out.threads, *k),
                    real_bytes: out.real_bytes,
                };
                let p = alltoall(*k, f, &tr)?;
                if !out.json {
                    println!(
                        "{:>4.0}% failed: {:.3} Gb/s per live server; {} events in {:.1} s = {:.2} M events/s, peak {:.0} MiB",
                        f, p.per_server_gbps, p.events, p.wall_s, p.events_per_s / 1e6, p.peak_mib
                    );
                }
                pts.push(p);
            }
            let base = pts.first().map_or(1.0, |p| p.per_server_gbps.max(1e-9));
            if out.json {
                println!(
                    "{}",
                    json!({"experiment": "failures", "servers": u64::from(*k).pow(3), "points": pts, "relative": pts.iter().map(|p| p.per_server_gbps / base).collect::<Vec<_>>()})
                );
            } else if let Some(p) = pts.last() {
                println!(
                    "throughput at {:.0}% failed = {:.0}% of no failures",
                    p.failed_pct,
                    100.0 * p.per_server_gbps / base
                );
            }
            if let Some(dir) = &out.plot {
                crate::plot::xy_chart(
                    &dir.join("sim-failures.svg"),
                    "All-to-all throughput vs failed servers",
                    "failed servers (%)",
                    "Gb/s per live server",
                    &[
                        (
                            "simulated",
                            pts.iter()
                                .map(|p| (p.failed_pct, p.per_server_gbps))
                                .collect(),
                        ),
                        (
                            "analytic, live servers",
                            pts.iter()
                                .map(|p| (p.failed_pct, p.bound_live_gbps))
                                .collect(),
                        ),
                    ],
                    false,
                )?;
            }
        }
        Exp::Churn {
            k,
            down,
            rate,
            msgs,
            seconds,
            views,
            detect_ms,
            refresh_s,
            holddown_ms,
            out,
        } => {
            let mut rs: Vec<ChurnReport> = Vec::new();
            for rate in list::<f64>(rate)? {
                let o = ChurnOpts {
                    down_pct: *down,
                    rate,
                    msgs: *msgs,
                    seconds: positive("--seconds", *seconds)?,
                    detect_ms: *detect_ms,
                    views: *views,
                    refresh_s: *refresh_s,
                    holddown_ms: *holddown_ms,
                    seed: out.seed,
                    threads: threads_for(out.threads, *k),
                };
                let r = churn(&o, cfg(*k, true)?)?;
                if !out.json {
                    println!(
                        "{} servers, {:?} views, {:.0}% down, {} failures/s ({} failures, {} rejoins in {} s), {} msg/s each: sent {}, delivered {}, misdelivered {}, dropped {} ({:.3}%: {} into failed servers, {} with their sender, {} no root at the sender, {} unreachable, {} TTL, {} no room, {} other, {} in flight), {} bounced, refused at source {}; {:.1} s wall, {:.2} M events/s, peak {:.0} MiB",
                        r.servers, r.views, r.down_pct, r.failures_per_s, r.failures, r.rejoins, r.simulated_s,
                        r.messages_per_server_per_s, r.sent, r.delivered, r.misdelivered, r.dropped,
                        r.dropped_pct, r.lost_at_failed_server, r.lost_with_sender, r.dropped_no_root, r.dropped_unreachable,
                        r.dropped_ttl_expired, r.dropped_no_room, r.dropped_other, r.in_flight_at_end,
                        r.bounced, r.refused_at_source, r.wall_s, r.events_per_s / 1e6, r.peak_mib
                    );
                }
                rs.push(r);
            }
            if !out.json {
                println!(
                    "CamCube (Figure 5(c), 512 servers, 10 simulated minutes): 0 misdelivered; \
                     under 1% dropped at 2 failures/s, 27.41% at 15 failures/s"
                );
            }
            if out.json {
                println!(
                    "{}",
                    json!({"experiment": "churn", "simulated_s": seconds, "points": rs})
                );
            }
            if let Some(dir) = &out.plot {
                let pct = |f: fn(&ChurnReport) -> u64| -> Vec<(f64, f64)> {
                    rs.iter()
                        .map(|r| (r.failures_per_s, 100.0 * f(r) as f64 / r.sent.max(1) as f64))
                        .collect()
                };
                crate::plot::xy_chart(
                    &dir.join("sim-churn.svg"),
                    "Key-routed messages under churn (10% of servers down)",
                    "failures per second",
                    "% of messages sent",
                    &[
                        ("dropped", pct(|r| r.dropped)),
                        ("misdelivered", pct(|r| r.misdelivered)),
                    ],
                    false,
                )?;
            }
        }
    }
    Ok(())
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

    #[test]
    fn churn_with_own_control_planes_misdelivers_nothing() {
        // 64 servers, each with its own control plane: they learn of failures and returns
        // at different times, and the oracle judges against the truth.
        let o = ChurnOpts::camcube(8.0, 3.0);
        let r = churn(&o, cfg(4, true).unwrap()).unwrap();
        assert!(r.failures >= 10 && r.rejoins >= 10, "{r:?}");
        assert!(r.sent > 100_000, "{r:?}");
        assert_eq!(r.misdelivered, 0, "{r:?}");
        assert!(
            r.lost_at_failed_server > 0,
            "messages to a crashed, undetected root are lost: {r:?}"
        );
        assert!(r.dropped_pct < 15.0, "{r:?}");
        assert!(r.control_frames > 0);
        // Without the hold-down, servers that have not heard of a return yet keep
        // delivering the returning server's keys: the oracle sees it.
        let no_hold = churn(
            &ChurnOpts {
                holddown_ms: 0.0,
                ..o
            },
            cfg(4, true).unwrap(),
        )
        .unwrap();
        assert!(no_hold.misdelivered > 0, "{no_hold:?}");
        // The same seed, the same run, on one thread or two.
        let again = churn(&o, cfg(4, true).unwrap()).unwrap();
        let two = churn(&ChurnOpts { threads: 2, ..o }, cfg(4, true).unwrap()).unwrap();
        for x in [&again, &two] {
            assert_eq!(
                (x.sent, x.delivered, x.dropped, x.events, x.control_frames),
                (r.sent, r.delivered, r.dropped, r.events, r.control_frames)
            );
        }
    }

    #[test]
    fn churn_with_a_shared_view_misdelivers_nothing() {
        let o = ChurnOpts {
            views: Views::Shared,
            ..ChurnOpts::camcube(8.0, 1.0)
        };
        let r = churn(&o, cfg(4, true).unwrap()).unwrap();
        assert!(r.sent > 50_000);
        assert_eq!(r.misdelivered, 0, "{r:?}");
        assert!(
            r.dropped > 0,
            "messages sent to a crashed, undetected root are lost"
        );
        assert!(r.dropped_pct < 15.0, "{r:?}");
    }

    #[test]
    fn paced_all_to_all_reaches_the_analytic_bound() {
        // CamCube's method on 64 servers: what is offered at the expected rate arrives.
        let p = alltoall(4, 0.0, &Traffic::new(20.0, 1, Load::Paced)).unwrap();
        assert!(p.fraction_of_bound > 0.93, "{p:?}");
        assert!(p.fraction_of_bound < 1.0, "{p:?}");
        assert_eq!(p.dropped_no_room, 0, "{p:?}");
    }

    #[test]
    fn failures_cost_throughput_and_stay_under_the_live_bound() {
        let whole = alltoall(4, 0.0, &Traffic::new(10.0, 2, Load::Paced)).unwrap();
        let failed = alltoall(4, 20.0, &Traffic::new(10.0, 2, Load::Paced)).unwrap();
        assert!(failed.bound_live_gbps < whole.bound_live_gbps, "{failed:?}");
        assert!(failed.per_server_gbps < whole.per_server_gbps, "{failed:?}");
        assert!(
            failed.per_server_gbps <= failed.bound_live_gbps,
            "{failed:?}"
        );
        assert!(
            failed.per_server_gbps > 0.5 * failed.bound_live_gbps,
            "{failed:?}"
        );
    }

    #[test]
    fn impossible_settings_are_refused_not_looped_on() {
        assert!(alltoall(2, 99.0, &Traffic::new(1.0, 1, Load::Paced)).is_err());
        // No threads, or more parts than servers.
        for threads in [0, 9] {
            let tr = Traffic {
                threads,
                ..Traffic::new(1.0, 1, Load::Paced)
            };
            let e = alltoall(2, 0.0, &tr).unwrap_err();
            assert!(e.contains("threads"), "{e}");
        }
        let c = || cfg(2, true).unwrap();
        let o = ChurnOpts::camcube(1.0, 0.01);
        assert!(churn(
            &ChurnOpts {
                down_pct: 100.0,
                ..o
            },
            c()
        )
        .is_err());
        assert!(churn(&ChurnOpts { rate: 0.0, ..o }, c()).is_err());
        assert!(churn(
            &ChurnOpts {
                rate: f64::NAN,
                ..o
            },
            c()
        )
        .is_err());
        assert!(churn(
            &ChurnOpts {
                refresh_s: 0.0,
                ..o
            },
            c()
        )
        .is_err());
        // Failures far faster than detection leave survivors instead of spinning.
        for views in [Views::Own, Views::Shared] {
            let r = churn(
                &ChurnOpts {
                    down_pct: 50.0,
                    rate: 1e6,
                    msgs: 100.0,
                    views,
                    ..o
                },
                c(),
            )
            .unwrap();
            assert_eq!(r.misdelivered, 0);
        }
    }

    /// Everything a run reports but its wall time, memory and thread count.
    fn outcome(p: &Point) -> String {
        let mut v = serde_json::to_value(p).unwrap();
        for k in [
            "threads",
            "wall_s",
            "events_per_s",
            "memory_per_server_kib",
            "peak_mib",
        ] {
            v.as_object_mut().unwrap().remove(k);
        }
        v.to_string()
    }

    #[test]
    fn large_tori_use_every_core_unless_told() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(threads_for(None, 4), 1);
        assert_eq!(threads_for(None, 8), cores);
        assert_eq!(threads_for(Some(1), 16), 1);
        assert_eq!(threads_for(Some(3), 4), 3);
    }

    #[test]
    fn runs_are_deterministic_whatever_the_threads() {
        let tr = Traffic {
            to_failed: true,
            ..Traffic::new(5.0, 9, Load::Reliable)
        };
        let a = alltoall(4, 10.0, &tr).unwrap();
        let b = alltoall(4, 10.0, &tr).unwrap();
        assert_eq!(outcome(&a), outcome(&b));
        assert!(a.events > 10_000 && a.unreachable > 0, "{a:?}");
        // The torus in two and in three parts, run on as many threads: the same run.
        for threads in [2, 3] {
            let p = alltoall(4, 10.0, &Traffic { threads, ..tr }).unwrap();
            assert_eq!(p.threads, threads);
            assert_eq!(outcome(&a), outcome(&p), "{threads} threads");
        }
        let paced = Traffic::new(3.0, 4, Load::Paced);
        let one = alltoall(6, 0.0, &paced).unwrap();
        let two = alltoall(
            6,
            0.0,
            &Traffic {
                threads: 2,
                ..paced
            },
        )
        .unwrap();
        assert_eq!(outcome(&one), outcome(&two));
    }

    /// Queues that hold runs compactly hand the engines exactly the frames of queues that
    /// copy every byte: the figures are the same to the event.
    #[test]
    fn compacted_payloads_change_nothing() {
        for load in [Load::Paced, Load::Reliable] {
            let tr = Traffic::new(4.0, 3, load);
            let compact = alltoall(4, 10.0, &tr).unwrap();
            let real = alltoall(
                4,
                10.0,
                &Traffic {
                    real_bytes: true,
                    ..tr
                },
            )
            .unwrap();
            assert!(compact.events > 10_000, "{compact:?}");
            assert_eq!(outcome(&compact), outcome(&real), "{load:?}");
        }
    }

    #[test]
    fn small_torus_reaches_the_analytic_bound() {
        let p = alltoall(3, 0.0, &Traffic::new(20.0, 1, Load::Reliable)).unwrap();
        assert!(p.fraction_of_bound > 0.9, "{p:?}");
        assert!(p.fraction_of_bound < 1.02, "{p:?}");
    }
}
