//! `torus-bench ip`: IP over the torus against the kernel's own IP forwarding on the same
//! veth topology, in one run: a 3x3x3 torus of namespaces (jumbo links), first with torusd
//! and its `torus0` interfaces, then with no torusnet at all and the kernel routing between
//! the namespaces (`scripts/kernel-ip.sh`: static shortest-path routes, ip_forward). The same
//! commands measure both: iperf3 TCP with 1 and 8 flows and UDP between servers three hops
//! apart, ping RTT percentiles, one hop TCP (the "link rate" of the all-to-all bound), and an
//! all-to-all TCP mesh (every server sending to every other, `torus-bench ip-mesh`), reported
//! as a fraction of the analytic bound as CamCube reported theirs (1.49 of 2.7 Gb/s).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use torusnet_proto::topology::{Coord, Dims};

/// Arguments of `torus-bench ip`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Torus size.
    #[arg(long, default_value = "3x3x3")]
    dims: String,
    /// Link MTU.
    #[arg(long, default_value_t = 9000)]
    mtu: u32,
    /// Seconds per iperf3 run.
    #[arg(long, default_value_t = 5)]
    secs: u64,
    /// Seconds of the all-to-all run.
    #[arg(long, default_value_t = 8)]
    mesh_secs: u64,
    /// Where the JSON results go.
    #[arg(long, default_value = "bench/results/ip.json")]
    out: PathBuf,
}

/// Arguments of `torus-bench ip-mesh` (one server of the all-to-all run).
#[derive(Debug, clap::Args)]
pub struct MeshArgs {
    /// Torus size.
    #[arg(long, value_parser = |s: &str| s.parse::<Dims>().map_err(|e| e.to_string()))]
    dims: Dims,
    /// This server.
    #[arg(long, value_parser = |s: &str| s.parse::<Coord>().map_err(|e| e.to_string()))]
    me: Coord,
    /// The network's first two octets (server i is NET.i/250.i%250+1).
    #[arg(long)]
    net: String,
    /// Seconds measured (after one second of warm-up).
    #[arg(long)]
    secs: u64,
    /// When to start, Unix milliseconds (every server starts together).
    #[arg(long)]
    start_at: u64,
    /// TCP port.
    #[arg(long, default_value_t = 6000)]
    port: u16,
}

const PREFIX: &str = "ipb";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn script(name: &str, args: &[&str]) -> Result<(), String> {
    let st = Command::new("bash")
        .arg(root().join("scripts").join(name))
        .args(args)
        .args(["--prefix", PREFIX])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("{name}: {e}"))?;
    st.success()
        .then_some(())
        .ok_or_else(|| format!("{name} {args:?} failed"))
}

/// The namespaces, removed when dropped.
struct Namespaces;

impl Drop for Namespaces {
    fn drop(&mut self) {
        let _ = script("netns-torus.sh", &["down"]);
    }
}

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

fn ns(dims: Dims, c: Coord) -> String {
    let _ = dims;
    format!("{PREFIX}-{}-{}-{}", c.x, c.y, c.z)
}

fn addr(net: &str, dims: Dims, c: Coord) -> String {
    let i = dims.index(c);
    format!("{net}.{}.{}", i / 250, i % 250 + 1)
}

fn in_ns(dims: Dims, c: Coord, args: &[&str]) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns(dims, c)]).args(args);
    cmd
}

fn iperf(
    dims: Dims,
    net: &str,
    from: Coord,
    to: Coord,
    port: u16,
    extra: &[&str],
) -> Result<Value, String> {
    let mut procs = Procs::default();
    let p = port.to_string();
    let dst = addr(net, dims, to);
    procs.0.push(
        in_ns(dims, to, &["iperf3", "-s", "-1", "-p", &p, "-B", &dst])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("iperf3: {e}"))?,
    );
    let mut args = vec!["iperf3", "-c", dst.as_str(), "-p", p.as_str(), "-J"];
    args.extend_from_slice(extra);
    for _ in 0..50 {
        let out = in_ns(dims, from, &args)
            .output()
            .map_err(|e| format!("iperf3: {e}"))?;
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        match v["error"].as_str() {
            Some(e) if e.contains("connect") || e.contains("refused") => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Some(e) => return Err(format!("iperf3: {e}")),
            None => return Ok(v),
        }
    }
    Err("iperf3: the server never accepted".into())
}

fn ping(dims: Dims, net: &str, from: Coord, to: Coord) -> Result<Value, String> {
    let dst = addr(net, dims, to);
    let out = in_ns(dims, from, &["ping", "-i", "0.002", "-c", "2000", &dst])
        .output()
        .map_err(|e| format!("ping: {e}"))?;
    let mut t: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map(|ms| ms * 1000.0)
        .collect();
    t.sort_by(f64::total_cmp);
    if t.is_empty() {
        return Err("ping: no replies".into());
    }
    let p = |q: f64| t[((t.len() as f64 * q) as usize).min(t.len() - 1)];
    Ok(json!({"replies": t.len(), "p50_us": p(0.5), "p90_us": p(0.9), "p99_us": p(0.99)}))
}

fn gbps(v: &Value, end: &str) -> f64 {
    (v["end"][end]["bits_per_second"].as_f64().unwrap_or(0.0) / 1e7).round() / 100.0
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Every server sends to every other at once; per-server received Gb/s.
fn mesh(a: &Args, dims: Dims, net: &str) -> Result<Value, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let start_at = (unix_ms() + 3000).to_string();
    let secs = a.mesh_secs.to_string();
    let mut procs = Procs::default();
    for c in dims.coords() {
        let child = in_ns(dims, c, &[])
            .arg(&me)
            .args([
                "ip-mesh",
                "--dims",
                &a.dims,
                "--me",
                &c.to_string(),
                "--net",
                net,
            ])
            .args(["--secs", &secs, "--start-at", &start_at])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("ip-mesh: {e}"))?;
        procs.0.push(child);
    }
    let mut per = Vec::new();
    for c in &mut procs.0 {
        let mut s = String::new();
        if let Some(o) = c.stdout.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        let v: Value = serde_json::from_str(s.trim()).unwrap_or(Value::Null);
        per.push(v["received_gbps"].as_f64().unwrap_or(0.0));
    }
    per.sort_by(f64::total_cmp);
    let median = per.get(per.len() / 2).copied().unwrap_or(0.0);
    Ok(json!({
        "median_gbps": (median * 100.0).round() / 100.0,
        "min_gbps": (per.first().copied().unwrap_or(0.0) * 100.0).round() / 100.0,
        "max_gbps": (per.last().copied().unwrap_or(0.0) * 100.0).round() / 100.0,
        "total_gbps": (per.iter().sum::<f64>() * 100.0).round() / 100.0,
    }))
}

fn measure(a: &Args, dims: Dims, net: &str, label: &str) -> Result<Value, String> {
    let (src, far, near) = (
        Coord::new(0, 0, 0),
        Coord::new(1, 1, 1),
        Coord::new(1, 0, 0),
    );
    let t = a.secs.to_string();
    let one = iperf(dims, net, src, far, 5201, &["-t", &t])?;
    let eight = iperf(dims, net, src, far, 5202, &["-t", &t, "-P", "8"])?;
    let udp = iperf(
        dims,
        net,
        src,
        far,
        5203,
        &["-t", &t, "-u", "-b", "0", "-l", "8000"],
    )?;
    let hop = iperf(dims, net, src, near, 5204, &["-t", &t])?;
    let rtt = ping(dims, net, src, far)?;
    let m = mesh(a, dims, net)?;
    let s = &udp["end"]["sum"];
    let v = json!({
        "tcp_1_flow_gbps": gbps(&one, "sum_received"),
        "tcp_8_flows_gbps": gbps(&eight, "sum_received"),
        // The client's sum is what it sent; what arrived is that less the receiver's loss.
        "udp_gbps": (s["bits_per_second"].as_f64().unwrap_or(0.0)
            * (1.0 - s["lost_percent"].as_f64().unwrap_or(100.0) / 100.0)
            / 1e7)
            .round()
            / 100.0,
        "udp_lost_percent": s["lost_percent"],
        "tcp_1_hop_gbps": gbps(&hop, "sum_received"),
        "rtt_3_hops": rtt,
        "all_to_all": m,
    });
    eprintln!("  {label:<8} {v}");
    Ok(v)
}

fn ratio(x: &Value, y: &Value) -> Value {
    match (x.as_f64(), y.as_f64()) {
        (Some(a), Some(b)) if b > 0.0 => json!((a / b * 1000.0).round() / 1000.0),
        _ => Value::Null,
    }
}

/// Runs both setups and writes the results.
pub fn run(a: &Args) -> Result<(), String> {
    let dims: Dims = a.dims.parse().map_err(|e| format!("--dims: {e}"))?;
    let mtu = a.mtu.to_string();
    eprintln!(
        "ip: {} servers, MTU {}, {} s per iperf3 run",
        dims.count(),
        a.mtu,
        a.secs
    );
    // Frames passing through forwarded by the XDP programs (the default), then by the
    // forwarding servers' pollers, as before transit in XDP.
    let on_torus = |xdp: bool, label: &str| -> Result<Value, String> {
        let _ns = Namespaces;
        let line = format!("xdp_transit = {xdp}");
        script(
            "netns-torus.sh",
            &["up", &a.dims, "--mtu", &mtu, "--dataplane", &line],
        )?;
        script("netns-torus.sh", &["start"])?;
        // Every torus0 up and the views published.
        std::thread::sleep(Duration::from_secs(8));
        measure(a, dims, "10.77", label)
    };
    let torus = on_torus(true, "torus")?;
    let by_pollers = on_torus(false, "torus, forwarded by pollers")?;
    let kernel = {
        let _ns = Namespaces;
        script("netns-torus.sh", &["up", &a.dims, "--mtu", &mtu])?;
        script("kernel-ip.sh", &["up"])?;
        measure(a, dims, "10.78", "kernel")?
    };
    let bound = |v: &Value| {
        let rate = v["tcp_1_hop_gbps"].as_f64().unwrap_or(0.0) * 1e9;
        torusnet_proto::sim::all_to_all_bound(dims, rate as u64) / 1e9
    };
    let (bt, bk) = (bound(&torus), bound(&kernel));
    let frac = |v: &Value, b: f64| {
        let m = v["all_to_all"]["median_gbps"].as_f64().unwrap_or(0.0);
        json!((m / b.max(1e-9) * 1000.0).round() / 1000.0)
    };
    let v = json!({
        "setup": {"dims": a.dims, "mtu": a.mtu, "secs": a.secs, "pair": "0,0,0 -> 1,1,1 (3 hops)",
                  "tools": "iperf3, ping (iputils), torus-bench ip-mesh for all-to-all",
                  "bound": "links x one-hop TCP rate / mean hop count, per server"},
        "torus": torus,
        "torus_forwarded_by_pollers": by_pollers,
        "kernel": kernel,
        "ratios_torus_over_kernel": {
            "tcp_1_flow": ratio(&torus["tcp_1_flow_gbps"], &kernel["tcp_1_flow_gbps"]),
            "tcp_8_flows": ratio(&torus["tcp_8_flows_gbps"], &kernel["tcp_8_flows_gbps"]),
            "udp": ratio(&torus["udp_gbps"], &kernel["udp_gbps"]),
            "rtt_p50": ratio(&torus["rtt_3_hops"]["p50_us"], &kernel["rtt_3_hops"]["p50_us"]),
            "all_to_all_median": ratio(&torus["all_to_all"]["median_gbps"], &kernel["all_to_all"]["median_gbps"]),
        },
        "ratios_forwarded_by_pollers_over_kernel": {
            "tcp_1_flow": ratio(&by_pollers["tcp_1_flow_gbps"], &kernel["tcp_1_flow_gbps"]),
            "rtt_p50": ratio(&by_pollers["rtt_3_hops"]["p50_us"], &kernel["rtt_3_hops"]["p50_us"]),
            "all_to_all_median": ratio(&by_pollers["all_to_all"]["median_gbps"], &kernel["all_to_all"]["median_gbps"]),
        },
        "all_to_all_fraction_of_bound": {
            "torus": frac(&torus, bt), "torus_bound_gbps": (bt * 100.0).round() / 100.0,
            "kernel": frac(&kernel, bk), "kernel_bound_gbps": (bk * 100.0).round() / 100.0,
            "camcube": (1.49f64 / 2.7 * 1000.0).round() / 1000.0,
        },
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
        serde_json::to_string_pretty(&v["ratios_torus_over_kernel"]).unwrap_or_default()
    );
    println!(
        "{}",
        serde_json::to_string_pretty(&v["ratios_forwarded_by_pollers_over_kernel"])
            .unwrap_or_default()
    );
    println!(
        "{}",
        serde_json::to_string_pretty(&v["all_to_all_fraction_of_bound"]).unwrap_or_default()
    );
    eprintln!("ip: results in {}", a.out.display());
    Ok(())
}

/// One server of the all-to-all run: receives from everyone, sends to everyone, prints the
/// Gb/s it received during the measured seconds.
pub fn run_mesh(a: &MeshArgs) -> Result<(), String> {
    let dims = a.dims;
    let me_i = dims.index(dims.check(a.me).map_err(|e| e.to_string())?);
    let listener = TcpListener::bind(("0.0.0.0", a.port)).map_err(|e| e.to_string())?;
    let start = Duration::from_millis(a.start_at.saturating_sub(unix_ms()));
    let t0 = Instant::now() + start;
    let (m0, m1) = (
        t0 + Duration::from_secs(1),
        t0 + Duration::from_secs(1 + a.secs),
    );
    let end = m1 + Duration::from_millis(500);
    let counted = Arc::new(AtomicU64::new(0));
    let c = counted.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = vec![0u8; 256 << 10];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    let now = Instant::now();
                    if now >= m0 && now < m1 {
                        c.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    std::thread::sleep(t0.saturating_duration_since(Instant::now()));
    let mut senders = Vec::new();
    for (i, to) in dims.coords().enumerate() {
        if i == me_i {
            continue;
        }
        let dst = format!("{}:{}", addr(&a.net, dims, to), a.port);
        senders.push(std::thread::spawn(move || {
            let s = loop {
                match TcpStream::connect(&dst) {
                    Ok(s) => break Some(s),
                    Err(_) if Instant::now() < m0 => std::thread::sleep(Duration::from_millis(20)),
                    Err(_) => break None,
                }
            };
            let Some(mut s) = s else { return };
            let buf = vec![0x5au8; 128 << 10];
            while Instant::now() < end {
                if s.write_all(&buf).is_err() {
                    return;
                }
            }
        }));
    }
    for s in senders {
        let _ = s.join();
    }
    let gbps = counted.load(Ordering::Relaxed) as f64 * 8.0 / a.secs as f64 / 1e9;
    println!(
        "{}",
        json!({"server": a.me.to_string(), "received_gbps": gbps})
    );
    Ok(())
}
