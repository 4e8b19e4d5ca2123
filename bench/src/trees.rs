//! `torus-bench trees`: multicast and aggregation over the six trees, with their baselines
//! in the same run.
//!
//! - On a 3x3x3 torus of namespaces (MTU 9000): a multicast from 0,0,0 to the 26 others,
//!   per member, against the same bytes sent by reliable unicast transfers to each member in
//!   turn, and against the raw rate of one link (a transfer to a neighbour); the word-count
//!   job's link bytes against every server sending its records to the root.
//! - In the simulator (`--sim`, 8x8x8 by default, 1 Gb/s links as CamCube's): per-member
//!   multicast throughput as a fraction of the six-link maximum, three concurrent instances,
//!   and the aggregation's link bytes at that scale.

use std::collections::HashSet;
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_proto::sim::{Sim, SimConfig};
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims};
use torusnet_proto::transport::Config;
use torusnet_services::aggregate::{AggRequest, Aggregate, Combiner, WordCount, AGG};
use torusnet_services::multicast::{generate, Multicast, MulticastRequest, MCAST};

/// Arguments of `torus-bench trees`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Bytes multicast on the namespace torus.
    #[arg(long, default_value_t = 100_000_000)]
    bytes: u64,
    /// Only the simulator experiments.
    #[arg(long)]
    sim_only: bool,
    /// Servers per axis in the simulator.
    #[arg(long, default_value_t = 8)]
    sim_k: u16,
    /// Alternating rounds of a multicast from torusctl and the same bytes from an
    /// application to applications (medians compared).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Bytes multicast in the simulator.
    #[arg(long, default_value_t = 16_000_000)]
    sim_bytes: u64,
    /// Where the JSON results go.
    #[arg(long, default_value = "bench/results/trees.json")]
    out: std::path::PathBuf,
}

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

/// Asks a server of the namespace torus (by coordinate) a management request.
type Ask<'a> = dyn Fn(&str, Value, u64) -> Result<Value, String> + 'a;

/// Waits until 0,0,0 reaches every server (a minute at most).
fn wait_converged(ask: &Ask<'_>) -> Result<(), String> {
    let t0 = Instant::now();
    loop {
        let st = ask("0,0,0", json!({"cmd": "status"}), 5).unwrap_or(Value::Null);
        if st["engine"]["unreachable"]
            .as_array()
            .is_some_and(Vec::is_empty)
            && st["engine"]["view_version"].as_u64() > Some(0)
        {
            break;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            return Err("the torus did not converge".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// The same bytes by unicast from 0,0,0 to each member in turn: the seconds it took, and
/// the rate the last member and the mean member saw.
fn unicast_in_turn(ask: &Ask<'_>, bytes: u64) -> Result<(f64, f64, f64), String> {
    let t1 = Instant::now();
    let mut unicast_each = Vec::new();
    for c in Dims::new(3, 3, 3)
        .map_err(e)?
        .coords()
        .filter(|c| *c != Coord::new(0, 0, 0))
    {
        let v = ask(
            "0,0,0",
            json!({"cmd": "bench", "to": c.to_string(), "bytes": bytes, "size": 262_144, "verify": false}),
            600,
        )?;
        unicast_each.push(v["goodput_gbps"].as_f64().unwrap_or(0.0));
    }
    let unicast_s = t1.elapsed().as_secs_f64();
    // Each member's copy done when its turn ended: the last waits for all 26.
    let unicast_per_member = bytes as f64 * 8.0 / unicast_s / 1e9;
    let unicast_mean_member = {
        // Member k finishes after k transfers: the mean completion time over members.
        let mut acc = 0.0;
        let mut sum_s = 0.0;
        for g in &unicast_each {
            acc += bytes as f64 * 8.0 / (g * 1e9).max(1.0);
            sum_s += acc;
        }
        bytes as f64 * 8.0 / (sum_s / unicast_each.len().max(1) as f64) / 1e9
    };
    Ok((unicast_s, unicast_per_member, unicast_mean_member))
}

/// One multicast of the file at `src` from an application on 0,0,0 to an application on
/// each of the 26 others (`target/release/examples/multicast`, which a release build of the
/// examples makes): the root's report.
fn app_multicast(prefix: &str, ask: &Ask<'_>, src: &std::path::Path) -> Result<Value, String> {
    use std::process::{Command, Stdio};
    let exe = std::env::current_dir()
        .map_err(e)?
        .join("target/release/examples/multicast");
    if !exe.exists() {
        return Err(format!(
            "{} is missing: cargo build --release --examples",
            exe.display()
        ));
    }
    let apps = |c: &str| format!("/run/torusnet/{prefix}/{}-apps.sock", c.replace(',', "-"));
    let ns = |c: &str| format!("{prefix}-{}", c.replace(',', "-"));
    struct Kill(Vec<std::process::Child>);
    impl Drop for Kill {
        fn drop(&mut self) {
            for c in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let members: Vec<String> = Dims::new(3, 3, 3)
        .map_err(e)?
        .coords()
        .filter(|c| *c != Coord::new(0, 0, 0))
        .map(|c| c.to_string())
        .collect();
    let mut kids = Kill(Vec::new());
    for m in &members {
        let c = Command::new("ip")
            .args(["netns", "exec", &ns(m)])
            .arg(&exe)
            .args(["receive", &apps(m), "mc-bench", "-", "1"])
            .stdout(Stdio::null())
            .spawn()
            .map_err(e)?;
        kids.0.push(c);
    }
    let t0 = Instant::now();
    for m in &members {
        while !ask(m, json!({"cmd": "status"}), 5)?["apps"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x["name"] == json!("mc-bench")))
        {
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(format!("{m}: the receiver never attached"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let out = Command::new("ip")
        .args(["netns", "exec", &ns("0,0,0")])
        .arg(&exe)
        .args(["send", &apps("0,0,0"), "mc-bench"])
        .arg(src)
        .output()
        .map_err(e)?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.lines().last().unwrap_or_default())
        .map_err(|x| format!("the sender: {x}: {text}"))?;
    for c in &mut kids.0 {
        let _ = c.wait();
    }
    kids.0.clear();
    if v["ok"] != json!(true) {
        return Err(format!("the application multicast: {v}"));
    }
    Ok(v["report"].clone())
}

fn median_spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let m = v.get(v.len() / 2).copied().unwrap_or(0.0);
    (
        m,
        v.first().copied().unwrap_or(0.0),
        v.last().copied().unwrap_or(0.0),
    )
}

/// Medians and spreads (median, min, max) of alternating rounds.
struct Rounds {
    ctl: (f64, f64, f64),
    app: (f64, f64, f64),
    ctl_min_gbps: Vec<f64>,
}

/// The same bytes multicast from torusctl (torusd's own buffer, checksums at the members)
/// and from an application (its pool, to applications that take every byte), alternating.
fn torusctl_vs_application(a: &Args, prefix: &str, ask: &Ask<'_>) -> Result<Rounds, String> {
    let src = std::env::current_dir()
        .map_err(e)?
        .join(format!("target/bench-mcast-{}", std::process::id()));
    struct Rm(std::path::PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _rm = Rm(src.clone());
    std::fs::write(&src, torusnet_services::multicast::generate(a.bytes, 3)).map_err(e)?;
    let (mut from_ctl, mut from_app, mut ctl_min_gbps) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..a.rounds.max(1) {
        let c = ask(
            "0,0,0",
            json!({"cmd": "multicast", "generate": a.bytes, "seed": 3}),
            600,
        )?;
        if let Some(err) = c.get("error") {
            return Err(format!("multicast: {err}"));
        }
        let p = app_multicast(prefix, ask, &src)?;
        let (cs, ps) = (
            c["elapsed_s"].as_f64().unwrap_or(0.0),
            p["elapsed_s"].as_f64().unwrap_or(0.0),
        );
        eprintln!("round {round}: torusctl {cs:.2} s, application {ps:.2} s");
        from_ctl.push(cs);
        ctl_min_gbps.push(c["min_member_gbps"].as_f64().unwrap_or(0.0));
        from_app.push(ps);
    }
    let ctl = median_spread(&mut from_ctl);
    let app = median_spread(&mut from_app);
    let ((ctl_s, ctl_lo, ctl_hi), (app_s, app_lo, app_hi)) = (ctl, app);
    eprintln!(
        "multicast of {} MB to 26, median of {}: torusctl {ctl_s:.2} s ({ctl_lo:.2}-{ctl_hi:.2}), application to applications {app_s:.2} s ({app_lo:.2}-{app_hi:.2}): {:.2}x the time",
        a.bytes / 1_000_000,
        a.rounds.max(1),
        app_s / ctl_s.max(1e-9)
    );
    Ok(Rounds {
        ctl,
        app,
        ctl_min_gbps,
    })
}

/// The namespace experiments.
fn namespaces(a: &Args) -> Result<Value, String> {
    let prefix = format!("bt{}", std::process::id() % 10000);
    let root = std::env::current_dir().map_err(e)?;
    let script = root.join("scripts/netns-torus.sh");
    let sh = |args: &[&str]| -> Result<(), String> {
        let st = std::process::Command::new("bash")
            .arg(&script)
            .args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .map_err(e)?;
        st.success()
            .then_some(())
            .ok_or(format!("netns-torus.sh {args:?} failed"))
    };
    // Torn down however this ends.
    struct Down(std::path::PathBuf, String);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = std::process::Command::new("bash")
                .arg(&self.0)
                .args(["down", "--prefix", &self.1])
                .stdout(std::process::Stdio::null())
                .status();
        }
    }
    let _down = Down(script.clone(), prefix.clone());
    sh(&["up", "3x3x3", "--prefix", &prefix, "--mtu", "9000"])?;
    sh(&["start", "--prefix", &prefix])?;
    let sock = |c: &str| format!("/run/torusnet/{prefix}/{}.sock", c.replace(',', "-"));
    let ask = |c: &str, req: Value, secs: u64| -> Result<Value, String> {
        torusnet_dataplane::cluster::request(
            std::path::Path::new(&sock(c)),
            &req,
            Duration::from_secs(secs),
        )
    };
    wait_converged(&ask)?;
    std::thread::sleep(Duration::from_secs(1));
    // A first multicast warms the torus up (its first transfer after convergence ran at
    // less than half the rate of the next ones): not counted.
    let warm = ask(
        "0,0,0",
        json!({"cmd": "multicast", "generate": a.bytes, "seed": 3}),
        600,
    )?;
    if let Some(err) = warm.get("error") {
        return Err(format!("multicast: {err}"));
    }
    let (unicast_s, unicast_per_member, unicast_mean_member) = unicast_in_turn(&ask, a.bytes)?;
    eprintln!("unicast to each in turn: {unicast_s:.2} s, {unicast_per_member:.3} Gb/s for the last member");
    // One link's raw rate: a transfer to a neighbour.
    let link = ask(
        "0,0,0",
        json!({"cmd": "bench", "to": "1,0,0", "bytes": a.bytes, "size": 262_144, "verify": false}),
        600,
    )?;
    let link_gbps = link["goodput_gbps"].as_f64().unwrap_or(0.0);
    eprintln!("one link (0,0,0 -> 1,0,0): {link_gbps:.3} Gb/s");
    let agg = ask(
        "0,0,0",
        json!({"cmd": "aggregate", "words": 300_000, "vocabulary": 20_000, "seed": 1}),
        120,
    )?;
    eprintln!(
        "word count: {:.1} kB on links vs {:.1} kB sending every record to the root",
        agg["agg_link_bytes"].as_f64().unwrap_or(0.0) / 1e3,
        agg["raw_link_bytes"].as_f64().unwrap_or(0.0) / 1e3
    );
    let rounds = torusctl_vs_application(a, &prefix, &ask)?;
    let (ctl_s, ctl_lo, ctl_hi) = rounds.ctl;
    let (app_s, app_lo, app_hi) = rounds.app;
    let mut ctl_min_gbps = rounds.ctl_min_gbps;
    let (min, _, _) = median_spread(&mut ctl_min_gbps);
    eprintln!(
        "multicast {} MB to 26 from torusctl: min {min:.3} Gb/s per member (median of {})",
        a.bytes / 1_000_000,
        a.rounds.max(1)
    );
    Ok(json!({
        "from_torusctl_s": {"median": ctl_s, "min": ctl_lo, "max": ctl_hi},
        "from_application_s": {"median": app_s, "min": app_lo, "max": app_hi},
        "application_over_torusctl_time": app_s / ctl_s.max(1e-9),
        "torus": "3x3x3 namespaces, MTU 9000",
        "bytes": a.bytes,
        "multicast_min_member_gbps": min,
        "multicast_elapsed_s": ctl_s,
        "unicast_in_turn_s": unicast_s,
        "unicast_in_turn_last_member_gbps": unicast_per_member,
        "unicast_in_turn_mean_member_gbps": unicast_mean_member,
        "multicast_over_unicast_last_member": min / unicast_per_member.max(1e-9),
        "one_link_gbps": link_gbps,
        "multicast_over_one_link": min / link_gbps.max(1e-9),
        "aggregation": agg,
    }))
}

fn sim_config(k: u16) -> Result<SimConfig, String> {
    Ok(SimConfig {
        dims: Dims::new(k, k, k).map_err(e)?,
        rate_bps: 1_000_000_000,
        delay: Duration::from_micros(1),
        queue_frames: 32,
        transport: Config {
            mtu: 9000,
            queue_bytes: 256 << 10,
            ..Config::default()
        },
        spread_by_load: true,
    })
}

fn sim_multicast(k: u16, bytes: u64, roots: &[Coord]) -> Result<Vec<Value>, String> {
    let cfg = sim_config(k)?;
    let mut sim = Sim::new(cfg)?;
    let n = cfg.dims.count() as usize;
    for i in 0..n {
        sim.node_mut(i).configure_service(MCAST, 1, 2 << 20);
    }
    let mut svc: Vec<Multicast> = (0..n).map(|_| Multicast::default()).collect();
    let mut rxs = Vec::new();
    for (j, r) in roots.iter().enumerate() {
        let (tx, rx) = channel();
        let i = cfg.dims.index(*r);
        let req = MulticastRequest {
            group: None,
            service: 0,
            data: Arc::new(generate(bytes, j as u64 + 1)),
            chunk: 64 * 1024,
            timeout: Duration::from_secs(60),
            reply: tx,
        };
        let now = sim.now();
        let mut eng = sim.engine(i);
        torusnet_proto::service::Service::on_request(&mut svc[i], now, Box::new(req), &mut eng)
            .map_err(|_| "the multicast service refused the request".to_string())?;
        rxs.push(rx);
    }
    let wall = Instant::now();
    sim.run_services(
        Time::from_nanos(60_000_000_000),
        Duration::from_micros(20),
        &mut svc,
    );
    eprintln!(
        "  ({} events in {:.1} s)",
        sim.stats().events,
        wall.elapsed().as_secs_f64()
    );
    rxs.into_iter()
        .map(|rx| rx.try_recv().map_err(|_| "no multicast result".to_string()))
        .collect()
}

fn sim_aggregate(k: u16, input: WordCount) -> Result<Value, String> {
    let cfg = sim_config(k)?;
    let mut sim = Sim::new(cfg)?;
    let n = cfg.dims.count() as usize;
    for i in 0..n {
        sim.node_mut(i).configure_service(AGG, 1, 4 << 20);
    }
    let mut svc: Vec<Aggregate> = (0..n).map(|_| Aggregate::default()).collect();
    let (tx, rx) = channel();
    let root = cfg.dims.index(Coord::new(k / 2, k / 2, k / 2));
    let req = AggRequest {
        combiner: Combiner::Sum,
        input,
        timeout: Duration::from_secs(60),
        reply: tx,
    };
    let now = sim.now();
    let mut eng = sim.engine(root);
    torusnet_proto::service::Service::on_request(&mut svc[root], now, Box::new(req), &mut eng)
        .map_err(|_| "the aggregation service refused the request".to_string())?;
    sim.run_services(
        Time::from_nanos(60_000_000_000),
        Duration::from_micros(20),
        &mut svc,
    );
    let v = rx
        .try_recv()
        .map_err(|_| "no aggregation result".to_string())?;
    let all: HashSet<Coord> = cfg.dims.coords().collect();
    let want = torusnet_services::aggregate::oracle(cfg.dims, &input, &Combiner::Sum, &all);
    let ok = v["digest"]
        == json!(format!(
            "{:016x}",
            torusnet_services::aggregate::digest(&want)
        ));
    Ok(json!({"result": v, "equals_oracle": ok}))
}

/// The simulator experiments.
fn simulated(a: &Args) -> Result<Value, String> {
    let k = a.sim_k;
    let servers = u64::from(k).pow(3);
    let max_gbps = 6.0; // six 1 Gb/s links into every member
    eprintln!("simulator: {k}x{k}x{k} ({servers} servers), 1 Gb/s links, MTU 9000");
    let one = sim_multicast(k, a.sim_bytes, &[Coord::new(0, 0, 0)])?;
    let single = &one[0];
    let frac = single["min_member_gbps"].as_f64().unwrap_or(0.0) / max_gbps;
    eprintln!(
        "  one multicast of {} MB to {}: min {:.3} Gb/s per member = {:.1}% of the six-link maximum",
        a.sim_bytes / 1_000_000,
        servers - 1,
        single["min_member_gbps"].as_f64().unwrap_or(0.0),
        frac * 100.0
    );
    // Every server keeps every transfer whole: three at full size would not fit in memory
    // at 512 servers, so each of the three carries a quarter.
    let three = sim_multicast(
        k,
        a.sim_bytes / 4,
        &[
            Coord::new(0, 0, 0),
            Coord::new(k / 2, k / 3, 1),
            Coord::new(k - 1, k / 2, k / 2),
        ],
    )?;
    let split: Vec<f64> = three
        .iter()
        .map(|v| v["min_member_gbps"].as_f64().unwrap_or(0.0))
        .collect();
    eprintln!("  three concurrent: min per member {split:.3?} Gb/s");
    let agg = sim_aggregate(
        k,
        WordCount {
            words: 20_000,
            vocabulary: 5_000,
            seed: 2,
        },
    )?;
    eprintln!(
        "  word count over {servers}: {:.1} MB on links vs {:.1} MB to the root directly, equals the oracle: {}",
        agg["result"]["agg_link_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        agg["result"]["raw_link_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        agg["equals_oracle"]
    );
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("per_member");
        }
        v
    };
    Ok(json!({
        "dims": format!("{k}x{k}x{k}"),
        "servers": servers,
        "link_gbps": 1.0,
        "bytes": a.sim_bytes,
        "single": strip(single),
        "single_fraction_of_six_links": frac,
        "three_concurrent_bytes_each": a.sim_bytes / 4,
        "three_concurrent_min_member_gbps": split,
        "three": three.iter().map(strip).collect::<Vec<_>>(),
        "aggregation": agg,
    }))
}

/// Runs the experiments and writes the figures.
pub fn run(a: &Args) -> Result<(), String> {
    let ns = if a.sim_only {
        Value::Null
    } else {
        namespaces(a)?
    };
    let sim = simulated(a)?;
    let v = json!({"namespaces": ns, "simulator": sim});
    if let Some(d) = a.out.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&v).map_err(e)?)
        .map_err(|x| format!("{}: {x}", a.out.display()))?;
    println!(
        "{}",
        json!({"sim_fraction_of_six_links": v["simulator"]["single_fraction_of_six_links"], "multicast_over_unicast": v["namespaces"]["multicast_over_unicast_last_member"]})
    );
    Ok(())
}
