//! `torus-bench sim`: experiments on the packet-level simulator (proto/src/sim/), which
//! runs the project's own engines: all-to-all throughput against torus size and against
//! failed servers, and key-routed traffic under churn checked by an oracle.

mod alltoall;
mod harness;
mod incast;
mod routing;
mod share;

use serde_json::json;

use crate::churn::{churn, ChurnOpts, ChurnReport, Views};
use alltoall::{alltoall, Load, Traffic};
use harness::{cfg, threads_for};

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
        /// The transport's congestion controller on (with `--load reliable`).
        #[arg(long)]
        congestion: bool,
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
    Routing(routing::Args),
    /// Services sharing a link by weight, at its sender and in transit, with the
    /// congestion controller off and on: each service's share of the bytes.
    Share(share::Args),
    /// Many-to-one: servers send to one server at once, with the congestion controller
    /// off and on: aggregate goodput against the receiver's links, retransmissions,
    /// completion times against the ideal.
    Incast {
        /// Torus size k (k x k x k).
        #[arg(long, default_value_t = 8)]
        k: u16,
        /// Senders, comma-separated for a sweep.
        #[arg(long, default_value = "64,511")]
        senders: String,
        /// Bytes each sender sends.
        #[arg(long, default_value_t = 1_000_000)]
        bytes: u64,
        /// Message size.
        #[arg(long, default_value_t = 65536)]
        size: usize,
        /// Simulated seconds at most per run.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Run only with the controller on (or off).
        #[arg(long, value_parser = ["on", "off", "both"], default_value = "both")]
        congestion: String,
        /// The transport's least retransmission timeout, ms, both ways alike. 6 by default:
        /// the simulated links are 1 Gb/s, and the 2 ms that suits this machine's links (10
        /// times faster) is less than a queue of 32 of their jumbo frames.
        #[arg(long, default_value_t = 6.0)]
        min_rto_ms: f64,
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
        /// Reliable messages to keys (they follow their roots; each is followed to its end:
        /// delivered once, duplicated, failed, lost) instead of key-routed short ones.
        #[arg(long)]
        reliable: bool,
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
        Exp::Routing(r) => routing::run(r),
        Exp::Share(a) => share::run(a),
        Exp::Incast {
            k,
            senders,
            bytes,
            size,
            seconds,
            congestion,
            min_rto_ms,
            out,
        } => {
            let modes: &[bool] = match congestion.as_str() {
                "on" => &[true],
                "off" => &[false],
                _ => &[false, true],
            };
            let mut rows = Vec::new();
            for n in list::<usize>(senders)? {
                for &on in modes {
                    let s = incast::Setting {
                        k: *k,
                        senders: n,
                        bytes: *bytes,
                        size: (*size).max(1),
                        congestion: on,
                        min_rto: std::time::Duration::from_secs_f64(
                            positive("--min-rto-ms", *min_rto_ms)? / 1e3,
                        ),
                        limit: std::time::Duration::from_secs_f64(positive("--seconds", *seconds)?),
                        seed: out.seed,
                        threads: out.threads,
                    };
                    let started = std::time::Instant::now();
                    let v = incast::incast(&s)?;
                    if !out.json {
                        println!(
                            "{:>4} senders, controller {:<3}: {}/{} finished, last {:.1} ms (ideal {:.1}), p99 {:.2}x ideal, goodput {:.2} of the receiver's links, retransmitted {:.2}% ({} dropped for room) [{:.1} s]",
                            n, if on { "on" } else { "off" }, v["finished"], n, v["last_ms"].as_f64().unwrap_or(f64::NAN), v["ideal_ms"].as_f64().unwrap_or(f64::NAN),
                            v["p99_over_ideal"].as_f64().unwrap_or(f64::NAN), v["goodput_over_capacity"].as_f64().unwrap_or(f64::NAN),
                            v["retransmitted_pct"].as_f64().unwrap_or(f64::NAN), v["dropped_no_room"], started.elapsed().as_secs_f64()
                        );
                    }
                    rows.push(v);
                }
            }
            if out.json {
                println!("{}", serde_json::Value::Array(rows));
            }
            Ok(())
        }
        Exp::Alltoall {
            sizes,
            ms,
            load,
            first_hop,
            congestion,
            out,
        } => {
            let tr = Traffic {
                congestion: *congestion,
                ..traffic(*ms, *load, *first_hop, false, out)
            };
            sweep_sizes(sizes, tr, out)
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
            let base = traffic(*ms, *load, *first_hop, *to_failed, out);
            sweep_failures(*k, percent, base, out)
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
            reliable,
            out,
        } => {
            let base = ChurnOpts {
                down_pct: *down,
                rate: 0.0,
                msgs: *msgs,
                seconds: *seconds,
                detect_ms: *detect_ms,
                views: *views,
                refresh_s: *refresh_s,
                holddown_ms: *holddown_ms,
                seed: out.seed,
                threads: threads_for(out.threads, *k),
                reliable: *reliable,
            };
            sweep_churn(*k, rate, base, out)
        }
    }
}

/// The traffic an all-to-all experiment drives (its `ms` checked, and its threads chosen,
/// per point).
fn traffic(ms: f64, load: Load, first_hop: bool, to_failed: bool, out: &Out) -> Traffic {
    Traffic {
        ms,
        seed: out.seed,
        load,
        to_failed,
        spread: !first_hop,
        threads: 1,
        real_bytes: out.real_bytes,
        congestion: false,
    }
}

/// All-to-all throughput per server at each torus size of `sizes`.
fn sweep_sizes(sizes: &str, base: Traffic, out: &Out) -> Result<(), String> {
    let mut pts = Vec::new();
    for k in list::<u16>(sizes)? {
        let tr = Traffic {
            ms: positive("--ms", base.ms)?,
            threads: threads_for(out.threads, k),
            ..base
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
            json!({"experiment": "alltoall", "simulated_ms": base.ms, "points": pts})
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
    Ok(())
}

/// All-to-all throughput of a `k`-ary 3-cube at each failed percentage of `percent`.
fn sweep_failures(k: u16, percent: &str, base: Traffic, out: &Out) -> Result<(), String> {
    let mut pts = Vec::new();
    for f in list::<f64>(percent)? {
        if !(0.0..100.0).contains(&f) {
            return Err(format!(
                "failure percentages go from 0 to under 100, not {f}"
            ));
        }
        let tr = Traffic {
            ms: positive("--ms", base.ms)?,
            threads: threads_for(out.threads, k),
            ..base
        };
        let p = alltoall(k, f, &tr)?;
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
            json!({"experiment": "failures", "servers": u64::from(k).pow(3), "points": pts, "relative": pts.iter().map(|p| p.per_server_gbps / base).collect::<Vec<_>>()})
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
    Ok(())
}

/// Key-routed messages under churn at each failure rate of `rates`.
fn sweep_churn(k: u16, rates: &str, base: ChurnOpts, out: &Out) -> Result<(), String> {
    let mut rs: Vec<ChurnReport> = Vec::new();
    for rate in list::<f64>(rates)? {
        let o = ChurnOpts {
            rate,
            seconds: positive("--seconds", base.seconds)?,
            ..base
        };
        let r = churn(&o, cfg(k, true)?)?;
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
            json!({"experiment": "churn", "simulated_s": base.seconds, "points": rs})
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::alltoall::Point;
    use super::*;

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
