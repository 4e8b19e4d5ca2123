//! IP over the torus with programs nobody here wrote: `ping` and `ping -6` between every pair
//! of a 3x3x1 torus; on a 3x3x3 torus, `iperf3` (TCP with 1 and 8 flows, UDP) between servers
//! three hops apart, a 100 MB file over HTTP (`python3 -m http.server`, `curl`) byte-exact, and
//! iperf3 through a link cut and a server kill on its path.

use std::time::{Duration, Instant};

use torusnet_e2e::ip::{
    download, gbps, iperf, pattern, run_in, serve_http, v4, v6, wait_interfaces,
};
use torusnet_e2e::Torus;
use torusnet_proto::topology::Coord;

#[test]
fn ping_and_ping6_between_every_pair_of_a_3x3x1_torus() {
    let t = Torus::up("tip", "3x3x1");
    t.start();
    t.wait_converged(Duration::from_secs(30));
    wait_interfaces(&t);
    let all: Vec<Coord> = t.dims.coords().collect();
    let mut failed = Vec::new();
    for &a in &all {
        for &b in &all {
            if a == b {
                continue;
            }
            for (flag, addr) in [("-4", v4(&t, b)), ("-6", v6(&t, b))] {
                let out = run_in(&t, a, &["ping", flag, "-c", "1", "-W", "2", &addr]);
                if !out.status.success() {
                    failed.push(format!("{a} -> {addr}"));
                }
            }
        }
    }
    eprintln!(
        "ping and ping -6: {} of {} pairs answered",
        144 - failed.len(),
        144
    );
    assert!(failed.is_empty(), "unanswered: {failed:?}");
    // An address of the prefix without a server: the sender hears "unreachable" at once.
    let out = run_in(&t, all[0], &["ping", "-c", "1", "-W", "2", "10.77.0.200"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Unreachable"), "{text}");
}

#[test]
fn iperf3_http_and_failures_on_a_3x3x3_torus() {
    let t = Torus::up_with("tiq", "3x3x3", &["--mtu", "9000"]);
    t.start();
    t.wait_converged(Duration::from_secs(60));
    wait_interfaces(&t);
    let (a, b) = (Coord::new(0, 0, 0), Coord::new(1, 1, 1));

    // TCP, one flow and eight, three hops.
    let one = iperf(&t, a, b, 5201, &["-t", "4"]);
    let eight = iperf(&t, a, b, 5202, &["-t", "4", "-P", "8"]);
    eprintln!(
        "iperf3 TCP {a} -> {b} (3 hops): 1 flow {:.2} Gb/s, 8 flows {:.2} Gb/s",
        gbps(&one, "sum_received"),
        gbps(&eight, "sum_received")
    );
    assert!(gbps(&one, "sum_received") > 0.1, "{one}");
    assert!(gbps(&eight, "sum_received") > 0.1, "{eight}");
    // UDP at 500 Mb/s.
    let udp = iperf(
        &t,
        a,
        b,
        5203,
        &["-t", "3", "-u", "-b", "500M", "-l", "8000"],
    );
    let s = &udp["end"]["sum"];
    eprintln!(
        "iperf3 UDP: {:.2} Gb/s received, {} of {} datagrams lost",
        s["bits_per_second"].as_f64().unwrap_or(0.0) / 1e9,
        s["lost_packets"],
        s["packets"]
    );
    assert!(s["packets"].as_u64().unwrap_or(0) > 1000, "{udp}");
    assert!(s["lost_percent"].as_f64().unwrap_or(100.0) < 5.0, "{udp}");

    // 100 MB over HTTP, byte-exact.
    let dir = t.dir().join("www");
    std::fs::create_dir_all(&dir).expect("www");
    let file = dir.join("big.bin");
    let data = pattern(100 << 20);
    std::fs::write(&file, &data).expect("write the file");
    let (procs, url) = serve_http(&t, b, &dir, "big.bin");
    let got = t.dir().join("got.bin");
    let start = Instant::now();
    assert!(
        download(&t, a, &url, &got, Duration::from_secs(60)),
        "curl never got the file"
    );
    let back = std::fs::read(&got).expect("read what curl got");
    eprintln!(
        "HTTP: 100 MB in {:.2} s, byte-exact: {}",
        start.elapsed().as_secs_f64(),
        back == data
    );
    assert!(back == data, "the file differs");
    drop(procs);
    let _ = std::fs::remove_file(&got);
    let _ = std::fs::remove_file(&file);

    // iperf3 through a link cut (0,0,0's +x) and a server kill (1,1,0) on its paths.
    let t0 = Instant::now();
    let flow = std::thread::scope(|s| {
        let h = s.spawn(|| iperf(&t, a, b, 5204, &["-t", "14", "-i", "0.5"]));
        std::thread::sleep(Duration::from_secs(4));
        let out = run_in(&t, a, &["ip", "link", "set", "px", "down"]);
        assert!(out.status.success());
        eprintln!("cut 0,0,0:+x at {:.1} s", t0.elapsed().as_secs_f64());
        std::thread::sleep(Duration::from_secs(3));
        t.kill(Coord::new(1, 1, 0));
        eprintln!("killed 1,1,0 at {:.1} s", t0.elapsed().as_secs_f64());
        h.join().expect("iperf3")
    });
    let intervals: Vec<f64> = flow["intervals"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| i["sum"]["bits_per_second"].as_f64().unwrap_or(0.0))
                .collect()
        })
        .unwrap_or_default();
    let mut stall = 0usize;
    let mut run = 0usize;
    for &bps in &intervals {
        run = if bps < 1e6 { run + 1 } else { 0 };
        stall = stall.max(run);
    }
    let after: f64 =
        intervals.iter().skip(16).sum::<f64>() / intervals.len().saturating_sub(16).max(1) as f64;
    eprintln!(
        "iperf3 through the failures: {:.2} Gb/s overall, longest stall {:.1} s, {:.2} Gb/s after the kill; per 0.5 s: {:?}",
        gbps(&flow, "sum_received"),
        stall as f64 * 0.5,
        after / 1e9,
        intervals.iter().map(|b| (b / 1e8).round() / 10.0).collect::<Vec<_>>()
    );
    assert!(flow["error"].is_null(), "iperf3 failed: {}", flow["error"]);
    assert!(intervals.len() >= 27, "{flow}");
    assert!(after > 1e8, "the flow goes on after the failures");
}
