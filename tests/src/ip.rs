//! IP over the torus as the tests use it: every server's torus0 addresses, programs run in a
//! server's namespace (ping, iperf3, curl, python3's http.server), and the processes a
//! test started, killed when it ends.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_proto::topology::Coord;

use crate::Torus;

/// Processes a test started, killed by PID when it ends (also when it fails).
#[derive(Default)]
pub struct Procs(pub Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Server `c`'s IPv4 address on torus0.
pub fn v4(t: &Torus, c: Coord) -> String {
    format!("10.77.0.{}", t.dims.index(c) + 1)
}

/// Server `c`'s IPv6 address on torus0.
pub fn v6(t: &Torus, c: Coord) -> String {
    format!("fd77::{:x}", t.dims.index(c) + 1)
}

/// Runs a program in server `c`'s namespace to its end.
pub fn run_in(t: &Torus, c: Coord, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", &t.ns(c)])
        .args(args)
        .output()
        .expect("run in a namespace")
}

/// Starts a program in server `c`'s namespace, its output discarded.
pub fn spawn_in(t: &Torus, c: Coord, args: &[&str]) -> Child {
    Command::new("ip")
        .args(["netns", "exec", &t.ns(c)])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start in a namespace")
}

/// Until every server's torusd shows its torus0 interface (bounded).
pub fn wait_interfaces(t: &Torus) {
    let start = Instant::now();
    for c in t.dims.coords() {
        while t
            .ask(c, false, &json!({"cmd": "status"}))
            .is_none_or(|s| s["ip"].is_null())
        {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no torus0 at {c}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// An iperf3 run from `from` to a one-off server at `to` on `port`, with the client's
/// `extra` arguments; iperf3's JSON report (its `error` set when the run failed).
pub fn iperf(t: &Torus, from: Coord, to: Coord, port: u16, extra: &[&str]) -> Value {
    let mut procs = Procs::default();
    let p = port.to_string();
    procs.0.push(spawn_in(
        t,
        to,
        &["iperf3", "-s", "-1", "-p", &p, "-B", &v4(t, to)],
    ));
    let dst = v4(t, to);
    let mut args = vec!["iperf3", "-c", dst.as_str(), "-p", p.as_str(), "-J"];
    args.extend_from_slice(extra);
    for _ in 0..50 {
        let out = run_in(t, from, &args);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let refused = v["error"]
            .as_str()
            .is_some_and(|e| e.contains("refused") || e.contains("connect"));
        if !refused {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("iperf3 server at {to} never accepted");
}

/// Gb/s of an iperf3 report's `end` section `end` (`sum_received`, `sum`).
pub fn gbps(v: &Value, end: &str) -> f64 {
    v["end"][end]["bits_per_second"].as_f64().unwrap_or(0.0) / 1e9
}

/// `len` bytes of a fixed pseudo-random pattern (files served in the tests).
pub fn pattern(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    data
}

/// python3's http.server at `at` on port 8080, serving directory `dir`; kept running
/// while the returned processes live. The URL of `name` in it.
pub fn serve_http(t: &Torus, at: Coord, dir: &Path, name: &str) -> (Procs, String) {
    let mut procs = Procs::default();
    let www = dir.to_string_lossy().into_owned();
    procs.0.push(spawn_in(
        t,
        at,
        &[
            "python3",
            "-m",
            "http.server",
            "8080",
            "--bind",
            &v4(t, at),
            "--directory",
            &www,
        ],
    ));
    (procs, format!("http://{}:8080/{name}", v4(t, at)))
}

/// curl fetching `url` from `from` into `dest`, asked again while the server is not yet
/// listening (at most 5 s); whether it ended with the whole file.
pub fn download(t: &Torus, from: Coord, url: &str, dest: &Path, limit: Duration) -> bool {
    let max = limit.as_secs().max(1).to_string();
    for _ in 0..50 {
        let out = run_in(
            t,
            from,
            &[
                "curl",
                "-sf",
                "--max-time",
                &max,
                "-o",
                &dest.to_string_lossy(),
                url,
            ],
        );
        if out.status.success() {
            return true;
        }
        // 7: could not connect (the server is starting); anything else is an answer.
        if out.status.code() != Some(7) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}
