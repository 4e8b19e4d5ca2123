//! torusd end to end (issue 4): a checked 1 GiB transfer striped over two jumbo links with
//! 2% in-kernel loss; multi-hop forwarding through a middle server; ping-pong RTT.
//! Needs root.

use serde_json::{json, Value};
use torusnet_dataplane::cluster::Cluster;
use torusnet_proto::topology::{Coord, Dims, Dir};

fn u(v: &Value, path: &[&str]) -> u64 {
    let mut c = v;
    for p in path {
        c = &c[*p];
    }
    c.as_u64().unwrap_or(0)
}

/// A checked bench run from server 0 to 1,0,0: every message delivered exactly once, in
/// fence order, byte-exact (by checksum). The bench's answer.
fn checked_bench(c: &Cluster, bytes: u64, size: u64, fence_every: u64) -> Value {
    let r = c
        .ctl(0, &json!({"cmd": "bench", "to": "1,0,0", "bytes": bytes, "size": size, "fence_every": fence_every}))
        .unwrap_or_else(|e| panic!("bench: {e}\n{}\n{}", c.log(0), c.log(1)));
    eprintln!("bench, {size} B: {r}");
    let rx = &r["receiver"];
    assert_eq!(u(rx, &["delivered"]), u(&r, &["messages"]), "{r}");
    assert_eq!(u(rx, &["duplicated"]), 0, "{r}");
    assert_eq!(u(rx, &["corrupted"]), 0, "{r}");
    assert_eq!(u(rx, &["fence_violations"]), 0, "{r}");
    assert_eq!(
        rx["checksum"], r["sender_checksum"],
        "byte-exact by checksum"
    );
    r
}

#[test]
fn gigabyte_over_two_jumbo_links_with_two_percent_loss() {
    let dims = Dims::new(2, 1, 1).unwrap();
    let mut c = Cluster::new(
        "tg",
        dims,
        &[Coord::new(0, 0, 0), Coord::new(1, 0, 0)],
        9000,
    );
    c.link(0, Dir::PlusX, 1);
    c.link(0, Dir::MinusX, 1);
    c.start("");
    for link in ["+x", "-x"] {
        for i in 0..2 {
            c.ctl(i, &json!({"cmd": "fault", "link": link, "drop": 0.02}))
                .unwrap();
        }
    }
    let r = checked_bench(&c, 1 << 30, 65536, 64);
    assert!(u(&r["receiver"], &["bytes"]) >= 1 << 30);
    let a = c.ctl(0, &json!({"cmd": "status"})).unwrap();
    let b = c.ctl(1, &json!({"cmd": "status"})).unwrap();
    let dropped: u64 = b["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| u(l, &["xdp", "fault_dropped"]))
        .sum();
    assert!(dropped > 0, "the kernel dropped frames");
    assert!(u(&a, &["engine", "transport", "retransmitted_frames"]) > 0);
    // The jumbo frames were kept in their UMEM slots, not copied, and were resent from
    // there; once everything is acknowledged no slot stays held.
    assert!(
        u(&a, &["engine", "transport", "kept_frames"]) > 10_000,
        "{a}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let s = c.ctl(0, &json!({"cmd": "status"})).unwrap();
        let kept = u(&s, &["engine", "tx_slots_kept"]);
        if kept == 0 {
            assert!(u(&s, &["engine", "tx_slots_free"]) > 0);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{kept} transmit slots still held 5 s after the transfer: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for l in a["links"].as_array().unwrap() {
        assert!(
            u(l, &["counters", "tx_frames"]) > 50_000,
            "striped over both links: {l}"
        );
        assert_eq!(l["xdp_section"], "xdp.frags");
        assert_eq!(l["multi_buffer"], true);
    }
    // Messages that fill a jumbo frame each go straight from the bench's bytes into their
    // frame (never queued), through the same loss: still exactly once, in order, intact.
    let r = checked_bench(&c, 200 << 20, 8900, 50);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let s = c.ctl(0, &json!({"cmd": "status"})).unwrap();
    let straight = u(&s, &["engine", "transport", "framed_straight"]);
    eprintln!("framed straight: {straight}");
    assert!(
        straight > u(&r, &["messages"]) / 2,
        "most 8900 B messages framed straight: {straight} of {}",
        u(&r, &["messages"])
    );
    // A round trip's small messages go straight too (nothing waits, nothing in flight):
    // the requests at 0,0,0, and the echoes at 1,0,0, written while the services read the
    // request where it arrived.
    for link in ["+x", "-x"] {
        for i in 0..2 {
            c.ctl(i, &json!({"cmd": "fault", "link": link, "drop": 0.0}))
                .unwrap();
        }
    }
    let framed = |i: usize| {
        let s = c.ctl(i, &json!({"cmd": "status"})).unwrap();
        u(&s, &["engine", "transport", "framed_straight"])
    };
    let before = [framed(0), framed(1)];
    let p = c
        .ctl(
            0,
            &json!({"cmd": "ping", "to": "1,0,0", "count": 2000, "reliable": true}),
        )
        .unwrap();
    assert_eq!(u(&p, &["received"]), 2000, "{p}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    for (i, b) in before.into_iter().enumerate() {
        let n = framed(i) - b;
        eprintln!("reliable ping: server {i} framed {n} of 2000 messages straight");
        assert!(n > 1000, "server {i}: {n} of 2000 framed straight");
    }
}

#[test]
fn line_of_three_forwards_through_the_middle() {
    // A 3x1x1 ring with the 2,0,0 <-> 0,0,0 link missing: a line A - B - C.
    let dims = Dims::new(3, 1, 1).unwrap();
    let coords = [
        Coord::new(0, 0, 0),
        Coord::new(1, 0, 0),
        Coord::new(2, 0, 0),
    ];
    let mut c = Cluster::new("tl", dims, &coords, 1500);
    c.link(0, Dir::PlusX, 1);
    c.link(1, Dir::PlusX, 2);
    // Without the key-value store, whose catch-up at start would deliver messages to B;
    // B's poller forwards (transit in XDP off): the poller's path for frames passing
    // through, which moves descriptors within its UMEM (transit_e2e tests the XDP path).
    c.start("[view]\ndown_links = [\"2,0,0:+x\"]\n\n[kv]\nenabled = false\n\n[dataplane]\nxdp_transit = false\n");
    let r = c
        .ctl(0, &json!({"cmd": "bench", "to": "2,0,0", "bytes": 50u64 << 20, "size": 8192, "fence_every": 16}))
        .unwrap_or_else(|e| panic!("bench: {e}\n{}", c.log(1)));
    let rx = &r["receiver"];
    assert_eq!(u(rx, &["delivered"]), u(&r, &["messages"]), "{r}");
    assert_eq!(
        u(rx, &["fence_violations"]) + u(rx, &["duplicated"]) + u(rx, &["corrupted"]),
        0
    );
    let b = c.ctl(1, &json!({"cmd": "status"})).unwrap();
    let fwd: u64 = b["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| u(l, &["counters", "forwarded"]))
        .sum();
    assert!(fwd > 6000, "B forwarded A's frames and C's ACKs: {fwd}");
    for l in b["links"].as_array().unwrap() {
        assert_eq!(
            l["shared_umem"], true,
            "forwarding moves descriptors in one UMEM"
        );
    }
    assert_eq!(
        u(&b, &["engine", "transport", "messages_delivered"]),
        0,
        "nothing was for B"
    );
    let p = c
        .ctl(0, &json!({"cmd": "ping", "to": "2,0,0", "count": 200}))
        .unwrap();
    assert_eq!(u(&p, &["received"]), 200, "{p}");
}

#[test]
fn two_pollers_per_server_share_the_links() {
    let dims = Dims::new(2, 1, 1).unwrap();
    let mut c = Cluster::new(
        "tp",
        dims,
        &[Coord::new(0, 0, 0), Coord::new(1, 0, 0)],
        1500,
    );
    c.link(0, Dir::PlusX, 1);
    c.link(0, Dir::MinusX, 1);
    c.start_with(|_| "polling = \"adaptive\"\ncores = [0, 1]\n".to_string());
    checked_bench(&c, 100 << 20, 4000, 10);
    let a = c.ctl(0, &json!({"cmd": "status"})).unwrap();
    assert_eq!(u(&a, &["engine", "pollers"]), 2);
    let pollers: Vec<u64> = a["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| u(l, &["poller"]))
        .collect();
    assert_eq!(pollers, [0, 1], "one link per poller");
    for l in a["links"].as_array().unwrap() {
        assert!(
            u(l, &["counters", "tx_frames"]) > 10_000,
            "both links carry data: {l}"
        );
    }
    assert!(
        u(&a, &["engine", "handoffs"]) > 0,
        "frames crossed between pollers"
    );
    // Messages that fill a frame each go straight into their frames, whichever poller
    // owns the peer's connection and the link: exactly once, in fence order, intact.
    let r = checked_bench(&c, 20 << 20, 1400, 10);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let a = c.ctl(0, &json!({"cmd": "status"})).unwrap();
    let straight = u(&a, &["engine", "transport", "framed_straight"]);
    eprintln!(
        "two pollers, 1400 B: {straight} of {} framed straight",
        u(&r, &["messages"])
    );
    assert!(straight > 0, "{a}");
}

#[test]
fn a_crashed_torusd_leaves_no_xdp_program_behind() {
    let dims = Dims::new(2, 1, 1).unwrap();
    let mut c = Cluster::new(
        "tk",
        dims,
        &[Coord::new(0, 0, 0), Coord::new(1, 0, 0)],
        1500,
    );
    c.link(0, Dir::PlusX, 1);
    c.start("");
    let show = |c: &Cluster| {
        let out = std::process::Command::new("ip")
            .args(["-n", c.servers[0].ns.name(), "link", "show", "t0px"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(show(&c).contains("prog/xdp"), "attached while running");
    c.kill(0); // SIGKILL: no cleanup code runs
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while show(&c).contains("prog/xdp") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        !show(&c).contains("prog/xdp"),
        "bpf_link detached it: {}",
        show(&c)
    );
}
