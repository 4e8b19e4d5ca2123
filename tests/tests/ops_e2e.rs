//! Operating a torus of namespaces as an operator would: every daemon's metrics endpoint
//! scraped with curl and judged by prometheus_client's parser (neither written here); a
//! counter moving when traffic flows; `torusctl ping` and `bench` printing human summaries,
//! and the same JSON as before with `--json`; log levels changed at run time taking effect.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use torusnet_e2e::{root, Torus};

fn run(args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {args:?}: {e}"))
}

/// `curl` inside server `c`'s namespace; the body.
fn scrape(t: &Torus, c: &str, port: u16) -> String {
    let url = format!("http://127.0.0.1:{port}/metrics");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = run(&[
            "ip",
            "netns",
            "exec",
            &t.ns(c),
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--fail",
            &url,
        ]);
        if o.status.success() {
            return String::from_utf8_lossy(&o.stdout).into_owned();
        }
        assert!(
            Instant::now() < deadline,
            "curl {url} at {c}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// prometheus_client's verdict on `text`.
fn parse(text: &str) -> Value {
    let mut p = Command::new("python3")
        .arg(root().join("scripts/promcheck.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    {
        use std::io::Write;
        p.stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write");
    }
    let o = p.wait_with_output().expect("promcheck");
    let v: Value = serde_json::from_slice(&o.stdout).expect("promcheck's JSON");
    assert!(
        o.status.success(),
        "the parser refused the metrics: {v}\n{text}"
    );
    v
}

/// Sum of a family's samples whose key contains `filter`.
fn sum(v: &Value, name: &str, filter: &str) -> f64 {
    v["values"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(&format!("{name}{{")) && k.contains(filter))
        .filter_map(|(_, x)| x.as_f64())
        .sum()
}

fn torusctl(args: &[&str]) -> Output {
    Command::new(root().join("target/release/torusctl"))
        .args(args)
        .output()
        .expect("run torusctl")
}

#[test]
fn metrics_human_output_and_log_levels() {
    let t = Torus::up("tops", "3x3x1");
    t.start();
    t.wait_converged(Duration::from_secs(60));
    let all: Vec<String> = (0..3)
        .flat_map(|y| (0..3).map(move |x| format!("{x},{y},0")))
        .collect();

    // Every daemon's endpoint, judged by the parser.
    for c in &all {
        // torusd takes the converged view from its control process a moment later.
        let deadline = Instant::now() + Duration::from_secs(10);
        let dp = loop {
            let v = parse(&scrape(&t, c, 9464));
            if sum(&v, "torusnet_reachable_servers", "") == 9.0 || Instant::now() > deadline {
                break v;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // The control process refreshes its status every 200 ms; links settle after the view.
        let deadline = Instant::now() + Duration::from_secs(10);
        let ctl = loop {
            let v = parse(&scrape(&t, c, 9465));
            if sum(&v, "torusnet_control_link_up", "") == 4.0 || Instant::now() > deadline {
                break v;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(sum(&dp, "torusnet_dataplane_up", ""), 1.0, "{c}: {dp}");
        assert_eq!(sum(&dp, "torusnet_reachable_servers", ""), 9.0, "{c}");
        assert!(sum(&dp, "torusnet_link_rx_frames_total", "link=+x") >= 0.0);
        assert_eq!(
            dp["types"]["torusnet_link_rx_frames"], "counter",
            "{c}: {}",
            dp["types"]
        );
        assert_eq!(
            sum(&ctl, "torusnet_control_link_up", ""),
            4.0,
            "{c}: four links up"
        );
        assert!(sum(&ctl, "torusnet_control_view_version", "") >= 1.0);
    }

    // A counter moves when traffic flows; the human summary reads like ping(8).
    let sock = t.sock("0,0,0", false);
    let sock = sock.to_string_lossy().into_owned();
    let before = parse(&scrape(&t, "0,0,0", 9464));
    let o = torusctl(&[
        "ping",
        "--socket",
        &sock,
        "--to",
        "1,1,0",
        "--count",
        "200",
        "--reliable",
    ]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    eprintln!("{out}");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.starts_with("PING 1,1,0 (64-byte reliable messages"),
        "{out}"
    );
    assert!(out.contains("200 sent, 200 received, 0 lost"), "{out}");
    assert!(out.contains("rtt min/p50/p90/p99/max/mean = "), "{out}");
    assert!(!out.contains('{'), "no JSON without --json: {out}");
    // The pollers publish their counters every 100 ms.
    std::thread::sleep(Duration::from_millis(400));
    let after = parse(&scrape(&t, "0,0,0", 9464));
    let (b, a) = (
        sum(&before, "torusnet_transport_data_frames_total", ""),
        sum(&after, "torusnet_transport_data_frames_total", ""),
    );
    assert!(a >= b + 200.0, "reliable data frames {b} -> {a}");
    assert!(
        sum(&after, "torusnet_link_tx_frames_total", "")
            > sum(&before, "torusnet_link_tx_frames_total", ""),
        "frames sent on the links"
    );
    assert!(
        sum(&after, "torusnet_peer_srtt_seconds", "peer=1,1,0") > 0.0,
        "an RTT estimate to the peer"
    );

    // --json: the answer as before (scripts keep working).
    let o = torusctl(&[
        "ping", "--socket", &sock, "--to", "1,0,0", "--count", "20", "--json",
    ]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("ping --json is JSON");
    assert_eq!(v["received"], 20);
    assert_eq!(v["cdf_us"].as_array().map(Vec::len), Some(200));
    let o = torusctl(&[
        "bench", "--socket", &sock, "--to", "2,2,0", "--bytes", "2000000",
    ]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    eprintln!("{out}");
    assert!(
        out.starts_with("BENCH to 2,2,0") && out.contains("every byte checked"),
        "{out}"
    );

    // Log levels at run time: torusd logs each management request at debug only.
    let log = t.dir().join("0-0-0-torusd.log");
    let lines = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("management request"))
            .count()
    };
    let quiet = lines();
    let _ = t.ask("0,0,0", false, &serde_json::json!({"cmd": "status"}));
    assert_eq!(lines(), quiet, "no debug lines at info");
    let o = torusctl(&["log", "--socket", &sock, "debug"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "log level: debug"
    );
    let _ = t.ask("0,0,0", false, &serde_json::json!({"cmd": "status"}));
    assert!(lines() > quiet, "debug lines once the level is debug");
    let o = torusctl(&["log", "--socket", &sock, "info"]);
    assert!(o.status.success());
    let loud = lines();
    let _ = t.ask("0,0,0", false, &serde_json::json!({"cmd": "status"}));
    assert_eq!(lines(), loud, "quiet again at info");
    let o = torusctl(&["log", "--socket", &sock, "no=such=[level"]);
    assert!(!o.status.success(), "a bad level is refused");
    assert!(String::from_utf8_lossy(&o.stderr).contains("log level"));
    let ctl = t.sock("0,0,0", true);
    let o = torusctl(&["log", "--control", &ctl.to_string_lossy(), "debug"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "log level: debug"
    );
    let o = torusctl(&["log", "--control", &ctl.to_string_lossy()]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "log level: debug"
    );
    // The daemons' logs carry levels and fields.
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("INFO"), "{text}");
    assert!(text.contains("server="), "structured fields: {text}");

    // A hostile scraper gets an error and the endpoint keeps serving.
    let o = run(&[
        "ip",
        "netns",
        "exec",
        &t.ns("0,0,0"),
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-X",
        "DELETE",
        "http://127.0.0.1:9464/metrics",
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "405");
    parse(&scrape(&t, "0,0,0", 9464));
}
