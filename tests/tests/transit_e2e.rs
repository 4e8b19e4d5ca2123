//! Transit in XDP on real daemons: a ring of seven servers (7x1x1), where (0,0,0) to
//! (3,0,0) is three hops through (1,0,0) and (2,0,0) one way and four the other. A checked
//! transfer crosses the two forwarders in their XDP programs (their transit counters move,
//! their pollers forward nothing); a checked transfer survives a cut of a link on its path
//! and, another, the kill of a forwarder (the XDP programs' maps follow the view); a source
//! route whose next link is down still produces its path-failure report; malformed frames
//! are still refused and counted by the engine. Needs root.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_e2e::{data_frame as frame, inject, ip, mac, Daemon, Torus};
use torusnet_proto::topology::{Coord, Dir};
use torusnet_proto::wire::offset;

const FROM: Coord = Coord::new(0, 0, 0);
const TO: Coord = Coord::new(3, 0, 0);
const HOP1: Coord = Coord::new(1, 0, 0);
const HOP2: Coord = Coord::new(2, 0, 0);

fn status(t: &Torus, c: Coord) -> Value {
    t.ask(c, false, &json!({"cmd": "status"}))
        .expect("torusd status")
}

fn u(v: &Value, path: &[&str]) -> u64 {
    let mut c = v;
    for p in path {
        c = &c[*p];
    }
    c.as_u64().unwrap_or(0)
}

/// A figure summed over a server's links.
fn links_sum(v: &Value, path: &[&str]) -> u64 {
    v["links"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| u(l, path))
        .sum()
}

/// A checked bulk transfer of `bytes` from `from` to `to`.
fn bench(t: &Torus, from: Coord, to: Coord, bytes: u64) -> Value {
    t.checked_bench(from, to, bytes)
}

/// Waits until `c`'s torusd has adopted a view in which link `dir` of `at` is `live`.
fn wait_link(t: &Torus, c: Coord, at: Coord, dir: Dir, live: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(v) = t.control(c) {
            let name = json!(format!("{at}:{dir}"));
            let down = v["down_links"]
                .as_array()
                .is_some_and(|l| l.contains(&name));
            if down != live && v["published_version"] == v["view_version"] {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "{c} never saw {at}:{dir} {}",
        if live { "up" } else { "down" }
    );
}

#[test]
fn transit_in_xdp_carries_checked_transfers_through_cuts_and_kills() {
    let t = Torus::up("xt", "7x1x1");
    t.start();
    t.wait_converged(Duration::from_secs(60));

    // 1. Three hops, the forwarders' pollers idle: every frame passing through goes in XDP.
    let data = |v: &Value| u(v, &["engine", "transport", "data_frames"]);
    let (b0, b1, b2) = (status(&t, FROM), status(&t, HOP1), status(&t, HOP2));
    let r = bench(&t, FROM, TO, 300_000_000);
    // Status is published every 100 ms.
    std::thread::sleep(Duration::from_millis(300));
    let (a0, a1, a2) = (status(&t, FROM), status(&t, HOP1), status(&t, HOP2));
    let sent = data(&a0) - data(&b0);
    let xdp = |a: &Value, b: &Value| {
        links_sum(a, &["xdp", "transit_in"]) - links_sum(b, &["xdp", "transit_in"])
    };
    let polled =
        |a: &Value, b: &Value| u(a, &["engine", "forwarded"]) - u(b, &["engine", "forwarded"]);
    eprintln!(
        "3 hops: {:.2} Gb/s; forwarded in XDP at (1,0,0) {} and (2,0,0) {}, by their pollers {} and {} (the sender's data frames {sent})",
        r["goodput_gbps"].as_f64().unwrap_or(0.0),
        xdp(&a1, &b1),
        xdp(&a2, &b2),
        polled(&a1, &b1),
        polled(&a2, &b2),
    );
    assert_eq!(a1["xdp_transit"], json!(true));
    for (a, b) in [(&a1, &b1), (&a2, &b2)] {
        // Every data frame (and the ACKs coming back).
        assert!(
            sent > 200_000 && xdp(a, b) >= sent,
            "{} of {sent}",
            xdp(a, b)
        );
        assert!(
            polled(a, b) < xdp(a, b) / 100,
            "{} by the poller",
            polled(a, b)
        );
        assert_eq!(links_sum(a, &["redirect_errors"]), 0);
    }

    // 2. A link on the path cut mid-transfer: the maps follow the view, the transfer ends
    //    whole by the other way round.
    std::thread::scope(|s| {
        let h = s.spawn(|| bench(&t, FROM, TO, 1_500_000_000));
        std::thread::sleep(Duration::from_millis(300));
        ip(&["-n", &t.ns(HOP1), "link", "set", "px", "down"]);
        let r = h.join().expect("bench thread");
        eprintln!(
            "link (1,0,0)+x cut 300 ms in: {:.2} Gb/s, whole",
            r["goodput_gbps"].as_f64().unwrap_or(0.0)
        );
    });
    // While it is down, a source route from (0,0,0) through it: the forwarder before the
    //    cut reports the path failure to the source (the frame went up from XDP to do so).
    wait_link(&t, HOP1, HOP1, Dir::PlusX, false);
    let (vm, am) = (mac(&t, HOP1, "mx"), mac(&t, FROM, "px"));
    let routed = frame(vm, am, FROM, TO, &[Dir::PlusX, Dir::PlusX, Dir::PlusX], 1);
    std::thread::sleep(Duration::from_millis(300));
    let before = status(&t, HOP1);
    inject(&t.ns(FROM), "px", vec![routed; 20]);
    std::thread::sleep(Duration::from_millis(500));
    let after = status(&t, HOP1);
    let d = |p: &[&str]| u(&after, p) - u(&before, p);
    let failed = d(&["engine", "routing", "path_failed"]);
    let reported = d(&["engine", "routing", "failures_sent"]);
    let up = links_sum(&after, &["xdp", "up", "link_down"])
        - links_sum(&before, &["xdp", "up", "link_down"]);
    eprintln!("source route through the cut: 20 injected, {up} up from XDP, {failed} path failures, {reported} reported");
    assert!(up >= 19 && failed >= 19, "{up} {failed}");
    assert!(reported >= 1, "no path-failure report");
    ip(&["-n", &t.ns(HOP1), "link", "set", "px", "up"]);
    wait_link(&t, FROM, HOP1, Dir::PlusX, true);

    // 3. A forwarder killed mid-transfer: the same.
    std::thread::scope(|s| {
        let h = s.spawn(|| bench(&t, FROM, TO, 1_500_000_000));
        std::thread::sleep(Duration::from_millis(300));
        t.kill(HOP2);
        let r = h.join().expect("bench thread");
        eprintln!(
            "(2,0,0) killed 300 ms in: {:.2} Gb/s, whole",
            r["goodput_gbps"].as_f64().unwrap_or(0.0)
        );
    });
    t.start_daemon(HOP2, Daemon::Control);
    t.start_daemon(HOP2, Daemon::Torusd);
    t.wait_converged(Duration::from_secs(60));

    // 4. Malformed frames passing through are still refused and counted by the engine: a
    //    bad version, reserved flags, a payload longer than the frame, a source outside the
    //    torus; each goes up from XDP (`check`) and is dropped as malformed or bad source.
    let good = frame(vm, am, FROM, TO, &[], 0);
    let mut bad = Vec::new();
    for _ in 0..25 {
        let mut v = good.clone();
        v[offset::VERSION] = 7;
        bad.push(v);
        let mut r = good.clone();
        r[offset::FLAGS] |= 0x80;
        bad.push(r);
        let mut l = good.clone();
        l[offset::PAYLOAD_LEN] = 0x40;
        bad.push(l);
        let mut s = good.clone();
        s[offset::SRC..offset::SRC + 2].copy_from_slice(&9u16.to_be_bytes());
        bad.push(s);
    }
    std::thread::sleep(Duration::from_millis(300));
    let before = status(&t, HOP1);
    inject(&t.ns(FROM), "px", bad);
    std::thread::sleep(Duration::from_millis(500));
    let after = status(&t, HOP1);
    let checked =
        links_sum(&after, &["xdp", "up", "check"]) - links_sum(&before, &["xdp", "up", "check"]);
    let refused = ["drop_malformed", "drop_bad_source"]
        .iter()
        .map(|k| links_sum(&after, &["counters", k]) - links_sum(&before, &["counters", k]))
        .sum::<u64>();
    eprintln!("malformed: 100 injected, {checked} sent up by XDP, {refused} refused by the engine");
    assert!(checked >= 95 && refused >= 95, "{checked} {refused}");
    let r = bench(&t, FROM, TO, 50_000_000);
    assert!(r["goodput_gbps"].as_f64().unwrap_or(0.0) > 0.0);
}
