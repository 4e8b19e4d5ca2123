//! The namespace torus end to end (issue 6): 27 servers with both daemons; every pair talks;
//! key-routed messages land on the root the spec names, also after a server dies (an oracle
//! checks every delivery); hostile frames from a raw socket are counted and dropped while the
//! node keeps serving. Needs root.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_e2e::{inject, mac, Torus};
use torusnet_proto::keyspace;
use torusnet_proto::topology::Coord;
use torusnet_proto::Key;

/// Waits until every live server's control process sees `live` servers and has published
/// its view to torusd.
fn wait_converged(t: &Torus, live: usize, except: &[Coord]) {
    let start = Instant::now();
    loop {
        let ok = t.dims.coords().filter(|c| !except.contains(c)).all(|c| {
            t.control(c).is_some_and(|v| {
                v["reachable"].as_u64() == Some(live as u64)
                    && v["published_version"] == v["view_version"]
            })
        });
        if ok {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(40), "no convergence");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends key probes from several servers, collects where each landed, and checks every one
/// against GetServersForKey over the live servers: returns (delivered, misdelivered).
fn probe_keys(t: &Torus, keys: &[u64], senders: &[Coord], down: &[Coord]) -> (u64, u64) {
    for c in t.dims.coords().filter(|c| !down.contains(c)) {
        t.ask(c, false, &json!({"cmd": "keys_seen", "reset": true}))
            .unwrap();
    }
    for (i, chunk) in keys.chunks(keys.len().div_ceil(senders.len())).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|k| format!("{k:016x}")).collect();
        let r = t
            .ask(
                senders[i % senders.len()],
                false,
                &json!({"cmd": "send_keys", "keys": hex}),
            )
            .unwrap();
        assert_eq!(r["sent"].as_u64(), Some(chunk.len() as u64), "{r}");
    }
    std::thread::sleep(Duration::from_millis(500));
    let (mut delivered, mut wrong) = (0u64, 0u64);
    let mut count: HashMap<u64, u64> = HashMap::new();
    for c in t.dims.coords().filter(|c| !down.contains(c)) {
        let seen = t.ask(c, false, &json!({"cmd": "keys_seen"})).unwrap();
        for (k, n) in seen.as_object().unwrap() {
            let k = u64::from_str_radix(k, 16).unwrap();
            let n = n.as_u64().unwrap();
            *count.entry(k).or_insert(0) += n;
            delivered += n;
            let root = keyspace::root(t.dims, k, |s| !down.contains(&s)).unwrap();
            if root != c {
                wrong += n;
                eprintln!("key {k:016x} delivered at {c}, its root is {root}");
            }
        }
    }
    for k in keys {
        assert_eq!(
            count.get(k).copied().unwrap_or(0),
            1,
            "key {k:016x} delivered once"
        );
    }
    (delivered, wrong)
}

#[test]
fn torus_of_27_pairs_keys_and_failover() {
    let t = Torus::up("tt", "3x3x3");
    t.start();
    wait_converged(&t, 27, &[]);
    let all: Vec<Coord> = t.dims.coords().collect();

    // Every pair exchanges messages (ping-pong, short messages, over 1 to 3 hops).
    let mut lost = 0;
    for a in &all {
        for b in &all {
            if a != b {
                let r = t
                    .ask(
                        *a,
                        false,
                        &json!({"cmd": "ping", "to": b.to_string(), "count": 2}),
                    )
                    .unwrap();
                lost += 2 - r["received"].as_u64().unwrap_or(0);
            }
        }
    }
    assert_eq!(lost, 0, "every pair of the 702 exchanged messages");
    // Frames passing through, by the XDP programs (most) and the pollers.
    let fwd: u64 = all
        .iter()
        .map(|c| {
            let v = t.ask(*c, false, &json!({"cmd": "status"})).unwrap();
            let xdp: u64 = v["links"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|l| l["xdp"]["transit_in"].as_u64().unwrap_or(0))
                .sum();
            xdp + v["engine"]["forwarded"].as_u64().unwrap_or(0)
        })
        .sum();
    assert!(fwd > 1000, "multi-hop forwarding through servers: {fwd}");

    // Key-routed messages land on the spec's root.
    let keys: Vec<u64> = (0..270)
        .map(|i| Key::from_string(&format!("item-{i}")).routing_key())
        .collect();
    let (delivered, wrong) = probe_keys(&t, &keys, &all, &[]);
    assert_eq!((delivered, wrong), (270, 0));
    // ... exactly as `torusctl key` says.
    let bin = torusnet_e2e::root().join("target/release/torusctl");
    for (i, k) in keys.iter().enumerate().take(5) {
        let out = Command::new(&bin)
            .args(["key", "--dims", "3x3x3", &format!("item-{i}")])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let root = keyspace::root(t.dims, *k, |_| true).unwrap();
        assert_eq!(v["servers"][0], json!(root.to_array()));
    }

    // A server dies: its keys move to the next candidates, everyone else's stay.
    let dead = Coord::new(1, 2, 0);
    t.kill(dead);
    wait_converged(&t, 26, &[dead]);
    let live: Vec<Coord> = all.iter().copied().filter(|c| *c != dead).collect();
    let (delivered, wrong) = probe_keys(&t, &keys, &live, &[dead]);
    assert_eq!(
        (delivered, wrong),
        (270, 0),
        "zero misdelivered after failover"
    );
    let moved = keys
        .iter()
        .filter(|k| keyspace::root(t.dims, **k, |_| true) == Some(dead))
        .count();
    eprintln!(
        "270 key-routed messages, all on their spec root; {moved} of them failed over from {dead}"
    );
}

#[test]
fn hostile_frames_are_counted_and_dropped_and_the_node_keeps_serving() {
    let t = Torus::up("th", "3x3x1");
    t.start();
    wait_converged(&t, 9, &[]);
    let victim = Coord::new(0, 0, 0);
    let attacker = Coord::new(1, 0, 0);
    let (victim_mac, attacker_mac) = (mac(&t, victim, "px"), mac(&t, attacker, "mx"));
    let frame = |src_mac: [u8; 6], ethertype: u16, body: &[u8]| {
        let mut f = Vec::new();
        f.extend_from_slice(&victim_mac);
        f.extend_from_slice(&src_mac);
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(body);
        f
    };
    let mut good = vec![0u8; torusnet_proto::wire::TORUS_LEN + 10];
    good[0] = 1; // version
    good[14] = 0;
    good[15] = 10; // payload length
    let mut frames = Vec::new();
    for _ in 0..50 {
        frames.push(frame(attacker_mac, 0x88B5, &[1, 0, 0])); // truncated torus header
        let mut bad_version = good.clone();
        bad_version[0] = 9;
        frames.push(frame(attacker_mac, 0x88B5, &bad_version));
        let mut outside = good.clone();
        outside[8..10].copy_from_slice(&77u16.to_be_bytes()); // source x outside 3x3x1
        frames.push(frame(attacker_mac, 0x88B5, &outside));
        // A forged sender: the victim's own coordinate (0,0,0) as the source.
        frames.push(frame(attacker_mac, 0x88B5, &good));
        frames.push(frame([2, 9, 9, 9, 9, 9], 0x88B5, &good)); // not the neighbour's MAC
        frames.push(frame(attacker_mac, 0x0800, &[0x45; 40])); // not a torus EtherType
        frames.push(frame(attacker_mac, 0x88B6, &[b'T', b'C', 1, 2, 0, 0, 1, 2])); // truncated control
        frames.push(frame(attacker_mac, 0x88B6, &[0xde; 60])); // garbage control
    }
    inject(&t.ns(attacker), "mx", frames);
    std::thread::sleep(Duration::from_millis(400));
    let dp = t.ask(victim, false, &json!({"cmd": "status"})).unwrap();
    let px = dp["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["ifname"] == "px")
        .unwrap();
    let c = &px["counters"];
    eprintln!("victim +x counters: {c}\nxdp: {}", px["xdp"]);
    assert!(
        px["xdp"]["malformed"].as_u64().unwrap() >= 50,
        "truncated torus frames dropped in XDP"
    );
    assert!(c["drop_malformed"].as_u64().unwrap() >= 50, "bad version");
    assert!(
        c["drop_bad_source"].as_u64().unwrap() >= 100,
        "sources outside the torus, and the victim's own"
    );
    assert!(
        c["drop_bad_mac"].as_u64().unwrap() >= 50,
        "source MAC not the neighbour's"
    );
    assert!(
        px["xdp"]["passed"].as_u64().unwrap() >= 100,
        "IPv4 and control frames went to the kernel"
    );
    let ctl = t.ask(victim, true, &json!({"cmd": "status"})).unwrap();
    assert!(
        ctl["refused_frames"].as_u64().unwrap() >= 100,
        "garbage control frames refused: {}",
        ctl["refused_frames"]
    );
    // Still serving: pings through it and to it, and its view is intact.
    for to in ["0,0,0", "2,0,0"] {
        let r = t
            .ask(
                Coord::new(1, 1, 0),
                false,
                &json!({"cmd": "ping", "to": to, "count": 20}),
            )
            .unwrap();
        assert_eq!(r["received"].as_u64(), Some(20), "{r}");
    }
    assert_eq!(ctl["reachable"].as_u64(), Some(9));
}
