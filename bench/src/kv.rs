//! `torus-bench kv`: the key-value store under a memcached load generator nobody here wrote
//! (libmemcached's `memaslap`, installed as `memcaslap`), in one run, three ways:
//!
//! - **torus**: torusd on a torus of namespaces (`netns-torus.sh --front`), clients reaching
//!   the 27 gateways over the front bridge;
//! - **switch**: the same `Kv` service and gateway over kernel TCP through that bridge
//!   (`torus-bench kv-node`, CamCube's switch baseline), the torus links unused;
//! - **memcached**: one stock memcached, no replication.
//!
//! Each with a set-heavy (90% set) and a get-heavy (90% get) mix, the torus and the switch
//! each with the cache on and off. memaslap reports operations per second, and per command
//! a log2 histogram of latencies, from which percentiles are read (interpolated inside
//! their power-of-two bucket: a percentile is good to within its bucket). Results go to
//! bench/results/kv.json with the ratios against CamCube's.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_proto::topology::Dims;

/// Arguments of `torus-bench kv`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Torus size.
    #[arg(long, default_value = "3x3x3")]
    dims: String,
    /// Seconds per load run.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// Value size in bytes (CamCube's thumbnails were about 3.5 KB).
    #[arg(long, default_value_t = 3584)]
    value: usize,
    /// memaslap threads.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// memaslap concurrent connections.
    #[arg(long, default_value_t = 32)]
    concurrency: u32,
    /// Where the JSON results go.
    #[arg(long, default_value = "bench/results/kv.json")]
    out: PathBuf,
}

const PREFIX: &str = "kvb";

/// The namespaces of one setup, removed when dropped.
struct Namespaces;

impl Namespaces {
    fn up(dims: &str, kv: &[&str]) -> Result<Namespaces, String> {
        let ns = Namespaces;
        let mut args = vec!["up", dims, "--front"];
        for l in kv {
            args.push("--kv");
            args.push(l);
        }
        script(&args)?;
        Ok(ns)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        let _ = script(&["down"]);
    }
}

/// Processes this benchmark started, killed by PID when dropped.
#[derive(Default)]
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn script(args: &[&str]) -> Result<(), String> {
    let st = Command::new("bash")
        .arg(root().join("scripts/netns-torus.sh"))
        .args(args)
        .args(["--prefix", PREFIX])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("netns-torus.sh: {e}"))?;
    st.success()
        .then_some(())
        .ok_or_else(|| format!("netns-torus.sh {args:?} failed"))
}

fn ns(i: usize, dims: Dims) -> String {
    let c = dims.coord(i);
    format!("{PREFIX}-{}-{}-{}", c.x, c.y, c.z)
}

fn front(i: usize) -> String {
    format!("10.88.{}.{}", i / 250, i % 250 + 1)
}

fn in_front(args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &format!("{PREFIX}-front")])
        .args(args);
    c
}

/// Waits until every gateway in `servers` answers memcached's ping.
fn wait_gateways(servers: &str, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let ok = in_front(&["memcping", &format!("--servers={servers}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(format!(
                "gateways {servers} did not answer within {limit:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Percentiles from memaslap's log2 histogram: bucket b holds latencies in
/// [2^(b-1), 2^b) microseconds; inside a bucket, interpolated geometrically.
fn percentile(buckets: &[(u32, u64)], p: f64) -> f64 {
    let total: u64 = buckets.iter().map(|b| b.1).sum();
    if total == 0 {
        return 0.0;
    }
    let want = p * total as f64;
    let mut seen = 0.0;
    for &(b, n) in buckets {
        let n = n as f64;
        if seen + n >= want && n > 0.0 {
            let frac = (want - seen) / n;
            let lo = 2f64.powi(b as i32 - 1);
            return lo * 2f64.powf(frac);
        }
        seen += n;
    }
    buckets.last().map_or(0.0, |b| 2f64.powi(b.0 as i32))
}

/// One command's figures from a memaslap report block.
fn block(text: &str, title: &str) -> Value {
    let Some(at) = text.find(&format!("{title} Statistics (")) else {
        return Value::Null;
    };
    let rest = &text[at..];
    let events: u64 = rest
        .split_once('(')
        .and_then(|(_, r)| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let avg: f64 = rest
        .lines()
        .find_map(|l| l.trim().strip_prefix("Avg:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    let mut buckets = Vec::new();
    let mut in_dist = false;
    for l in rest.lines().skip(1) {
        let l = l.trim();
        if l.starts_with("Log2 Dist:") {
            in_dist = true;
            continue;
        }
        if in_dist {
            let Some((label, counts)) = l.split_once(':') else {
                break;
            };
            let Ok(base) = label.trim().parse::<u32>() else {
                break;
            };
            for (k, c) in counts.split_whitespace().enumerate() {
                buckets.push((base + k as u32, c.parse::<u64>().unwrap_or(0)));
            }
        }
    }
    json!({
        "ops": events,
        "avg_us": avg,
        "p50_us": percentile(&buckets, 0.50).round(),
        "p95_us": percentile(&buckets, 0.95).round(),
        "p99_us": percentile(&buckets, 0.99).round(),
    })
}

/// One memaslap run against `servers`; `set` is the set proportion.
fn load(a: &Args, servers: &str, set: f64) -> Result<Value, String> {
    let cfg = std::env::temp_dir().join(format!("torus-bench-kv-{}.cfg", std::process::id()));
    std::fs::write(
        &cfg,
        format!(
            "key\n32 32 1\nvalue\n{v} {v} 1\ncmd\n0 {set}\n1 {get}\n",
            v = a.value,
            get = 1.0 - set
        ),
    )
    .map_err(|e| e.to_string())?;
    let out = in_front(&[
        "memcaslap",
        &format!("--servers={servers}"),
        &format!("--threads={}", a.threads),
        &format!("--concurrency={}", a.concurrency),
        &format!("--time={}s", a.secs),
        &format!("--stat_freq={}s", a.secs),
        "--win_size=1k",
        &format!("--cfg_cmd={}", cfg.display()),
    ])
    .output()
    .map_err(|e| format!("memcaslap: {e}"))?;
    let _ = std::fs::remove_file(&cfg);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let tps: f64 = text
        .lines()
        .rev()
        .find_map(|l| l.split_once("TPS:"))
        .and_then(|(_, r)| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            format!(
                "memcaslap said: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let misses: u64 = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("get_misses:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Ok(json!({
        "ops_per_s": tps,
        "get": block(&text, "Get"),
        "set": block(&text, "Set"),
        "get_misses": misses,
    }))
}

fn mixes(a: &Args, servers: &str, label: &str) -> Result<Value, String> {
    let mut r = serde_json::Map::new();
    for (name, set) in [("set_heavy", 0.9), ("get_heavy", 0.1)] {
        let v = load(a, servers, set)?;
        eprintln!(
            "  {label:<22} {name:<9} {:>9.0} ops/s  get p50 {:>6} us p95 {:>6} us  set p50 {:>6} us p95 {:>6} us",
            v["ops_per_s"].as_f64().unwrap_or(0.0),
            v["get"]["p50_us"],
            v["get"]["p95_us"],
            v["set"]["p50_us"],
            v["set"]["p95_us"],
        );
        r.insert(name.into(), v);
    }
    Ok(Value::Object(r))
}

fn all_servers(n: usize) -> String {
    (0..n)
        .map(|i| format!("{}:11211", front(i)))
        .collect::<Vec<_>>()
        .join(",")
}

fn torus(a: &Args, dims: Dims, cache: bool) -> Result<Value, String> {
    let kv = format!("cache = {cache}");
    let _ns = Namespaces::up(&a.dims, &[&kv])?;
    script(&["start"])?;
    let n = dims.count() as usize;
    let servers = all_servers(n);
    wait_gateways(&servers, Duration::from_secs(90))?;
    // The control plane settles (views published) before the load starts.
    std::thread::sleep(Duration::from_secs(3));
    let r = mixes(
        a,
        &servers,
        &format!("torus, cache {}", if cache { "on" } else { "off" }),
    );
    let _ = script(&["stop"]);
    r
}

fn switch(a: &Args, dims: Dims, cache: bool) -> Result<Value, String> {
    let _ns = Namespaces::up(&a.dims, &[])?;
    let n = dims.count() as usize;
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut procs = Procs::default();
    for i in 0..n {
        let c = dims.coord(i);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns(i, dims)])
            .arg(&me)
            .args(["kv-node", "--dims", &a.dims, "--me", &c.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if !cache {
            cmd.arg("--no-cache");
        }
        procs
            .0
            .push(cmd.spawn().map_err(|e| format!("kv-node: {e}"))?);
    }
    let servers = all_servers(n);
    wait_gateways(&servers, Duration::from_secs(90))?;
    mixes(
        a,
        &servers,
        &format!("switch, cache {}", if cache { "on" } else { "off" }),
    )
}

fn memcached(a: &Args, dims: Dims) -> Result<Value, String> {
    let _ns = Namespaces::up(&a.dims, &[])?;
    let mut procs = Procs::default();
    let child = Command::new("ip")
        .args(["netns", "exec", &ns(0, dims)])
        .args([
            "memcached",
            "-u",
            "root",
            "-t",
            "2",
            "-m",
            "2048",
            "-p",
            "11211",
        ])
        .args(["-l", &front(0)])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("memcached: {e}"))?;
    procs.0.push(child);
    let servers = format!("{}:11211", front(0));
    wait_gateways(&servers, Duration::from_secs(20))?;
    mixes(a, &servers, "memcached (one)")
}

fn ratio(a: &Value, b: &Value) -> Value {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) if y > 0.0 => json!((x / y * 1000.0).round() / 1000.0),
        _ => Value::Null,
    }
}

/// Runs every setup and writes the results.
pub fn run(a: &Args) -> Result<(), String> {
    let dims: Dims = a.dims.parse().map_err(|e| format!("--dims: {e}"))?;
    eprintln!(
        "kv: {} servers, {} s per run, {} B values, memaslap {} threads x {} connections",
        dims.count(),
        a.secs,
        a.value,
        a.threads,
        a.concurrency
    );
    let t_on = torus(a, dims, true)?;
    let t_off = torus(a, dims, false)?;
    let s_on = switch(a, dims, true)?;
    let s_off = switch(a, dims, false)?;
    let mc = memcached(a, dims)?;
    let ours = json!({
        "insert_throughput_torus_over_switch": ratio(&t_off["set_heavy"]["ops_per_s"], &s_off["set_heavy"]["ops_per_s"]),
        "cached_lookup_p50_torus_over_switch": ratio(&t_on["get_heavy"]["get"]["p50_us"], &s_on["get_heavy"]["get"]["p50_us"]),
        "cached_lookup_p95_torus_over_switch": ratio(&t_on["get_heavy"]["get"]["p95_us"], &s_on["get_heavy"]["get"]["p95_us"]),
        "get_heavy_throughput_torus_over_switch": ratio(&t_on["get_heavy"]["ops_per_s"], &s_on["get_heavy"]["ops_per_s"]),
        "cache_effect_torus_get_heavy": ratio(&t_on["get_heavy"]["ops_per_s"], &t_off["get_heavy"]["ops_per_s"]),
        "torus_set_heavy_over_memcached": ratio(&t_off["set_heavy"]["ops_per_s"], &mc["set_heavy"]["ops_per_s"]),
        "torus_get_heavy_over_memcached": ratio(&t_on["get_heavy"]["ops_per_s"], &mc["get_heavy"]["ops_per_s"]),
    });
    let camcube = json!({
        "insert_throughput_torus_over_switch": 1.93,
        "cached_lookup_p50_torus_over_switch": (0.83f64 / 0.95 * 1000.0).round() / 1000.0,
        "cached_lookup_p95_torus_over_switch": (1.70f64 / 2.22 * 1000.0).round() / 1000.0,
    });
    let v = json!({
        "setup": {
            "dims": a.dims, "secs": a.secs, "value_bytes": a.value, "key_bytes": 32,
            "threads": a.threads, "concurrency": a.concurrency, "replicas": 3,
            "load_generator": "memaslap (libmemcached-tools memcaslap), text protocol",
            "percentiles": "from memaslap's log2 histograms, interpolated within a bucket",
            "machine": format!("{} cores", std::thread::available_parallelism().map_or(0, |n| n.get())),
        },
        "torus": {"cache_on": t_on, "cache_off": t_off},
        "switch": {"cache_on": s_on, "cache_off": s_off},
        "memcached": mc,
        "ratios": ours,
        "camcube_ratios": camcube,
    });
    if let Some(d) = a.out.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    std::fs::write(
        &a.out,
        serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", a.out.display()))?;
    println!(
        "{}",
        serde_json::to_string_pretty(&v["ratios"]).unwrap_or_default()
    );
    eprintln!("kv: results in {}", a.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memaslap_reports_are_read() {
        let text = "Get Statistics (100 events)\n   Min:        12\n   Max:      7074\n   Avg:       153\n   Log2 Dist:\n       4:        0       50       40       10\n\nSet Statistics (0 events)\n";
        let b = block(text, "Get");
        assert_eq!(b["ops"], json!(100));
        assert_eq!(b["avg_us"], json!(153.0));
        // Half the events are in bucket 5, [16, 32): the median is at its top.
        assert_eq!(b["p50_us"], json!(32.0));
        let p95 = b["p95_us"].as_f64().unwrap_or(0.0);
        assert!((64.0..128.0).contains(&p95), "{p95}");
    }
}
