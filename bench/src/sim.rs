//! `torus-bench sim`: experiments on the packet-level simulator (proto/src/sim.rs), which
//! runs the project's own engines: all-to-all throughput against torus size and against
//! failed servers, and key-routed traffic under churn checked by an oracle.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use torusnet_proto::keyspace;
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::routing::LinkView;
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
        /// Failure detection delay (K hellos), ms.
        #[arg(long, default_value_t = 300.0)]
        detect_ms: f64,
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
}

fn cfg(k: u16, spread_by_load: bool) -> Result<SimConfig, String> {
    Ok(SimConfig {
        dims: Dims::new(k, k, k).map_err(|e| e.to_string())?,
        rate_bps: 1_000_000_000,
        delay: Duration::from_micros(1),
        queue_frames: 32,
        transport: Config {
            mtu: 9000,
            queue_bytes: 256 << 10,
            ..Config::default()
        },
        spread_by_load,
    })
}

#[derive(Debug, Clone, Serialize)]
struct Point {
    servers: u64,
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
    dropped_no_room: u64,
    dropped_engine: u64,
    retransmitted_frames: u64,
    ack_frames: u64,
}

fn rss_kib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0.0)
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
const PACKET: usize = 8192;

/// All-to-all at torus size k with `fail_pct` of the servers down: per-server throughput.
/// `to_failed`: sources keep addressing every other server, failed ones included (their
/// packets are refused as unreachable), as a job that does not know who failed would.
fn alltoall(
    k: u16,
    fail_pct: f64,
    ms: f64,
    seed: u64,
    load: Load,
    to_failed: bool,
    spread: bool,
) -> Result<Point, String> {
    let rss0 = rss_kib();
    let c = cfg(k, spread)?;
    let t0 = Instant::now();
    let mut sim = Sim::new(c)?;
    let dims = sim.dims();
    let n = dims.count() as usize;
    let mut rng = SplitMix64::new(seed);
    let mut down = vec![false; n];
    let nfail = ((n as f64) * fail_pct / 100.0).round() as usize;
    while down.iter().filter(|d| **d).count() < nfail {
        let i = rng.below(n as u64) as usize;
        if !down[i] {
            down[i] = true;
            sim.set_server(dims.coord(i), false);
        }
    }
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
    let mut next_at: Vec<f64> = (0..live.len())
        .map(|_| rng.below(1 << 20) as f64 / f64::from(1 << 20) * interval)
        .collect();
    let total = Duration::from_secs_f64(ms / 1000.0);
    let warm = total / 5;
    let tick = match load {
        Load::Paced => Duration::from_micros(10),
        Load::Reliable => Duration::from_micros(100),
    };
    let (mut delivered_bytes, mut offered, mut refused, mut unreachable) = (0u64, 0, 0, 0u64);
    let mut per_server = vec![0u64; n];
    let mut t = Time::ZERO;
    while t < Time::ZERO + total {
        let now_s = t.0 as f64 / 1e9;
        for (p, &i) in live.iter().enumerate() {
            let mut budget = match load {
                Load::Paced => 0,
                Load::Reliable => 64,
            };
            if load == Load::Paced {
                while next_at[p] <= now_s {
                    next_at[p] += interval;
                    budget += 1;
                }
            }
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
                match sim.send(i, Target::Server(dims.coord(d)), 9, &msg, opts) {
                    Ok(()) => {}
                    Err(SendError::Unreachable) => unreachable += 1,
                    Err(SendError::WouldBlock) if load == Load::Reliable => {
                        offered -= 1;
                        break;
                    }
                    // A paced packet the server cannot even queue is lost at the source.
                    Err(SendError::WouldBlock) => refused += 1,
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
        t = t + tick;
        let measuring = |at: Time| at >= Time::ZERO + warm;
        sim.run_until(t, |at, server, e| {
            if let Event::Message { data, .. } = e {
                if measuring(at) {
                    delivered_bytes += data.len() as u64;
                    per_server[server] += data.len() as u64;
                }
            }
        });
    }
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
        memory_per_server_kib: (rss_kib() - rss0).max(0.0) / n as f64,
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

#[derive(Debug, Serialize)]
struct ChurnReport {
    servers: u64,
    down_pct: f64,
    failures_per_s: f64,
    messages_per_server_per_s: f64,
    sent: u64,
    delivered: u64,
    dropped: u64,
    dropped_pct: f64,
    misdelivered: u64,
    wall_s: f64,
}

/// The oracle: whether a message for `key` delivered at `server` landed anywhere but the
/// key's root in `view` (the view in force when it was delivered).
fn misdelivered(view: &LinkView, key: u64, server: usize) -> bool {
    let dims = view.dims();
    keyspace::root(dims, key, |c| view.is_up(c)) != Some(dims.coord(server))
}

/// Key-routed short messages under churn. The oracle: a message delivered at server s for
/// key k is misdelivered unless s was k's root (GetServersForKey's first reachable entry) in
/// the view in force at delivery time; a message never delivered is dropped.
fn churn(
    k: u16,
    down_pct: f64,
    rate: f64,
    msgs: f64,
    seconds: f64,
    detect_ms: f64,
    seed: u64,
) -> Result<ChurnReport, String> {
    let ok = (0.0..100.0).contains(&down_pct)
        && is_positive(rate)
        && (msgs == 0.0 || is_positive(msgs))
        && (detect_ms == 0.0 || is_positive(detect_ms));
    if !ok {
        return Err(format!(
            "churn needs 0 <= --down < 100, --rate > 0, --msgs >= 0 and --detect-ms >= 0 \
             (got {down_pct}, {rate}, {msgs}, {detect_ms})"
        ));
    }
    let c = cfg(k, true)?;
    let t0 = Instant::now();
    let mut sim = Sim::new(c)?;
    let dims = sim.dims();
    let n = dims.count() as usize;
    let mut rng = SplitMix64::new(seed);
    let ndown = (((n as f64) * down_pct / 100.0).round() as usize).min(n.saturating_sub(2));
    let mut downs: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    while downs.len() < ndown {
        let i = rng.below(n as u64) as usize;
        if !downs.contains(&i) {
            downs.push_back(i);
            sim.set_server(dims.coord(i), false);
        }
    }
    // Servers that have failed but whose failure the others have not detected yet: they are
    // dead (frames to them are lost) but still in everyone's view until detection.
    let mut pending: Vec<(Time, usize)> = Vec::new();
    let tick = Duration::from_micros(500);
    let per_tick = msgs * tick.as_secs_f64();
    let mut carry = vec![0.0f64; n];
    let (mut sent, mut delivered, mut wrong) = (0u64, 0u64, 0u64);
    // Failures arrive as a Poisson process (CamCube 4.2.5: exponential inter-failure
    // times with mean 1 / failure rate).
    let gap = |rng: &mut SplitMix64| {
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        Duration::from_secs_f64(-(1.0 - u).ln() / rate.max(1e-9))
    };
    let mut next_fail = Time::ZERO + gap(&mut rng);
    let end = Time::ZERO + Duration::from_secs_f64(seconds);
    let mut t = Time::ZERO;
    let mut dead = vec![false; n];
    for &d in &downs {
        dead[d] = true;
    }
    while t < end {
        // Churn: a live server dies (detected after `detect_ms`); the longest-down rejoins.
        while t >= next_fail {
            // Failures faster than detection could kill everyone: keep two servers alive.
            let alive: Vec<usize> = (0..n).filter(|i| !dead[*i]).collect();
            if alive.len() <= 2 {
                next_fail = next_fail + gap(&mut rng);
                continue;
            }
            let victim = alive[rng.below(alive.len() as u64) as usize];
            dead[victim] = true;
            sim.crash(dims.coord(victim));
            pending.push((t + Duration::from_secs_f64(detect_ms / 1000.0), victim));
            if let Some(back) = downs.pop_front() {
                dead[back] = false;
                sim.set_server(dims.coord(back), true);
            }
            next_fail = next_fail + gap(&mut rng);
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
        for i in 0..n {
            if dead[i] || !sim.is_up(i) {
                continue;
            }
            carry[i] += per_tick;
            while carry[i] >= 1.0 {
                carry[i] -= 1.0;
                let key = rng.next_u64();
                if sim
                    .send(
                        i,
                        Target::Key(key),
                        4,
                        &key.to_be_bytes(),
                        MsgOptions::default(),
                    )
                    .is_ok()
                {
                    sent += 1;
                }
            }
        }
        t = t + tick;
        let view = sim.view().clone();
        sim.run_until(t, |_, at_server, e| {
            if let Event::Message { key: Some(key), .. } = e {
                delivered += 1;
                wrong += u64::from(misdelivered(&view, key, at_server));
            }
        });
    }
    // Let the last messages arrive.
    let view = sim.view().clone();
    sim.run_until(t + Duration::from_millis(5), |_, at_server, e| {
        if let Event::Message { key: Some(key), .. } = e {
            delivered += 1;
            wrong += u64::from(misdelivered(&view, key, at_server));
        }
    });
    let dropped = sent.saturating_sub(delivered);
    Ok(ChurnReport {
        servers: n as u64,
        down_pct,
        failures_per_s: rate,
        messages_per_server_per_s: msgs,
        sent,
        delivered,
        dropped,
        dropped_pct: 100.0 * dropped as f64 / sent.max(1) as f64,
        misdelivered: wrong,
        wall_s: t0.elapsed().as_secs_f64(),
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
        Exp::Alltoall {
            sizes,
            ms,
            load,
            first_hop,
            out,
        } => {
            let mut pts = Vec::new();
            for k in list::<u16>(sizes)? {
                let p = alltoall(
                    k,
                    0.0,
                    positive("--ms", *ms)?,
                    out.seed,
                    *load,
                    false,
                    !first_hop,
                )?;
                if !out.json {
                    println!(
                        "{:>5} servers: {:.3} Gb/s per server (bound {:.3}, {:.0}%), {} events in {:.1} s = {:.2} M events/s, {:.0} KiB/server",
                        p.servers, p.per_server_gbps, p.bound_gbps, 100.0 * p.fraction_of_bound, p.events, p.wall_s, p.events_per_s / 1e6, p.memory_per_server_kib
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
                let p = alltoall(*k, f, ms, out.seed, *load, *to_failed, !first_hop)?;
                if !out.json {
                    println!(
                        "{:>4.0}% failed: {:.3} Gb/s per live server",
                        f, p.per_server_gbps
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
            detect_ms,
            out,
        } => {
            let mut rs = Vec::new();
            for rate in list::<f64>(rate)? {
                let secs = positive("--seconds", *seconds)?;
                let r = churn(*k, *down, rate, *msgs, secs, *detect_ms, out.seed)?;
                if !out.json {
                    println!(
                        "{} servers, {:.0}% down, {} failures/s, {} msg/s each: sent {}, delivered {}, dropped {} ({:.3}%), misdelivered {} ({:.1} s)",
                        r.servers, r.down_pct, r.failures_per_s, r.messages_per_server_per_s, r.sent, r.delivered, r.dropped, r.dropped_pct, r.misdelivered, r.wall_s
                    );
                }
                rs.push(r);
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
    fn churn_misdelivers_nothing() {
        // 64 servers, 10% down, 8 failures per simulated second, 300 ms detection.
        let r = churn(4, 10.0, 8.0, 1000.0, 1.0, 300.0, 3).unwrap();
        assert!(r.sent > 50_000);
        assert_eq!(r.misdelivered, 0, "{r:?}");
        assert!(
            r.dropped > 0,
            "messages sent to a crashed, undetected root are lost"
        );
        // Each failure loses its keys for the detection delay: 8 x 0.3 s x 1/64 of the keys.
        assert!(r.dropped_pct < 15.0, "{r:?}");
    }

    #[test]
    fn paced_all_to_all_reaches_the_analytic_bound() {
        // CamCube's method on 64 servers: what is offered at the expected rate arrives.
        let p = alltoall(4, 0.0, 20.0, 1, Load::Paced, false, true).unwrap();
        assert!(p.fraction_of_bound > 0.93, "{p:?}");
        assert!(p.fraction_of_bound < 1.0, "{p:?}");
        assert_eq!(p.dropped_no_room, 0, "{p:?}");
    }

    #[test]
    fn failures_cost_throughput_and_stay_under_the_live_bound() {
        let whole = alltoall(4, 0.0, 10.0, 2, Load::Paced, false, true).unwrap();
        let failed = alltoall(4, 20.0, 10.0, 2, Load::Paced, false, true).unwrap();
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
        assert!(alltoall(2, 99.0, 1.0, 1, Load::Paced, false, true).is_err());
        assert!(churn(2, 100.0, 1.0, 10.0, 0.01, 300.0, 1).is_err());
        assert!(churn(2, 10.0, 0.0, 10.0, 0.01, 300.0, 1).is_err());
        assert!(churn(2, 10.0, f64::NAN, 10.0, 0.01, 300.0, 1).is_err());
        // Failures far faster than detection leave survivors instead of spinning.
        let r = churn(2, 50.0, 1e6, 100.0, 0.01, 300.0, 1).unwrap();
        assert_eq!(r.misdelivered, 0);
    }

    #[test]
    fn runs_are_deterministic() {
        let a = alltoall(3, 10.0, 5.0, 9, Load::Reliable, true, true).unwrap();
        let b = alltoall(3, 10.0, 5.0, 9, Load::Reliable, true, true).unwrap();
        assert_eq!(a.events, b.events);
        assert_eq!(a.per_server_gbps.to_bits(), b.per_server_gbps.to_bits());
        assert_eq!(a.unreachable, b.unreachable);
    }

    #[test]
    fn small_torus_reaches_the_analytic_bound() {
        let p = alltoall(3, 0.0, 20.0, 1, Load::Reliable, false, true).unwrap();
        assert!(p.fraction_of_bound > 0.9, "{p:?}");
        assert!(p.fraction_of_bound < 1.02, "{p:?}");
    }
}
