//! The key-value store on a 3x3x3 torus of namespaces, through its memcached gateways, with
//! clients nobody here wrote: libmemcached's `memccapable` (the text-protocol conformance
//! tests) and pymemcache (values written through one gateway, read back byte-exact through
//! every other; a server holding keys killed while writes go on; copies counted after
//! re-replication; the server restarted and caught up).

use std::collections::HashMap;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_e2e::{root, Daemon, Torus};
use torusnet_proto::keyspace::{get_servers_for_key, Key};
use torusnet_proto::topology::Coord;

fn in_front(t: &Torus, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", &format!("{}-front", t.prefix)])
        .args(args)
        .output()
        .expect("run a client in the front namespace")
}

fn kvcheck(t: &Torus, args: &[&str]) -> (bool, Value) {
    let script = root().join("scripts/kvcheck.py");
    let script = script.to_string_lossy().into_owned();
    let mut a = vec!["python3", script.as_str()];
    a.extend_from_slice(args);
    let out = in_front(t, &a);
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| json!({"stdout": text, "stderr": String::from_utf8_lossy(&out.stderr)}));
    (out.status.success(), v)
}

fn status(t: &Torus, c: Coord) -> Option<Value> {
    t.ask(c, false, &json!({"cmd": "status"}))
}

fn held(t: &Torus, c: Coord) -> Vec<(String, u64)> {
    let v = t
        .ask_within(
            c,
            &json!({"cmd": "kv", "op": "held"}),
            Duration::from_secs(15),
        )
        .unwrap_or(Value::Null);
    v["keys"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|k| {
                    (
                        k[0].as_str().unwrap_or("").to_string(),
                        k[1].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Live copies of each key at its newest version, over the servers in `live`.
fn copies(t: &Torus, live: &[Coord]) -> HashMap<String, usize> {
    let mut newest: HashMap<String, u64> = HashMap::new();
    let mut all = Vec::new();
    for &c in live {
        for (k, v) in held(t, c) {
            let e = newest.entry(k.clone()).or_insert(v);
            *e = (*e).max(v);
            all.push((k, v));
        }
    }
    let mut n = HashMap::new();
    for (k, v) in all {
        if newest.get(&k) == Some(&v) {
            *n.entry(k).or_insert(0) += 1;
        }
    }
    n
}

fn wait_gateways(t: &Torus) {
    let start = Instant::now();
    for c in t.dims.coords() {
        while status(t, c).is_none_or(|s| s["kv"]["gateway"].is_null()) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no gateway at {c}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What a failed client run leaves to explain it: every server's store counters and the
/// end of the gateway server's log.
fn diagnose(t: &Torus, gateway: Coord) {
    for c in t.dims.coords() {
        let store = status(t, c).map(|s| s["kv"]["store"].clone());
        eprintln!("store of {c}: {store:?}");
    }
    let log = t.dir().join(format!(
        "{}-{}-{}-torusd.log",
        gateway.x, gateway.y, gateway.z
    ));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    eprintln!(
        "end of {}:\n{}",
        log.display(),
        lines[lines.len().saturating_sub(40)..].join("\n")
    );
}

/// Turns the congestion controller on or off in every torusd.
fn set_congestion(t: &Torus, on: bool) {
    for c in t.dims.coords() {
        let v = t
            .ask_within(
                c,
                &json!({"cmd": "congestion", "on": on}),
                Duration::from_secs(5),
            )
            .expect("congestion switch");
        assert_eq!(v["congestion"], json!(on), "{c}: {v}");
    }
}

/// A gateway gathering a multi-get: 300 values of 1 B .. 200 KB (15 MB) written through
/// `writer`, read back through three other gateways one get at a time and in one get_many
/// of all 300 (the replies of every server arrive at the gateway at once), with the
/// congestion controller off and on. Byte-exact and no timeout with it on; the times are
/// printed (docs/transport.md reports them: the 2x target is a benchmark's, not a test's).
fn multiget(t: &Torus, writer: Coord) {
    let readers = [
        Coord::new(1, 1, 1),
        Coord::new(2, 0, 2),
        Coord::new(0, 2, 1),
    ];
    let hosts: Vec<String> = readers.iter().map(|&c| t.front_addr(c)).collect();
    let w = t.front_addr(writer);
    for on in [false, true] {
        set_congestion(t, on);
        let prefix = if on { "mget-on" } else { "mget-off" };
        let (ok, v) = kvcheck(t, &["multiget", &w, &hosts.join(","), prefix, "300"]);
        let rows = v["hosts"].as_array().cloned().unwrap_or_default();
        for r in &rows {
            eprintln!(
                "multi-get, congestion control {}: via {} singles {:.3} s, get_many {:.3} s ({:.2}x){}",
                if on { "on" } else { "off" },
                r["host"],
                r["singles_s"].as_f64().unwrap_or(f64::NAN),
                r["get_many_s"].as_f64().unwrap_or(f64::NAN),
                r["ratio"].as_f64().unwrap_or(f64::NAN),
                r.get("error").map(|e| format!(", {e}")).unwrap_or_default(),
            );
        }
        if on {
            assert!(ok, "multi-get with congestion control: {v}");
        }
    }
    set_congestion(t, false);
}

#[test]
fn memcached_clients_failures_and_catch_up_on_a_3x3x3_torus() {
    let t = Torus::up_with(
        "tkv",
        "3x3x3",
        &["--front", "--kv", "rereplicate_after_s = 4"],
    );
    t.start();
    t.wait_converged(Duration::from_secs(60));
    wait_gateways(&t);
    let dims = t.dims;
    let all: Vec<Coord> = dims.coords().collect();
    let origin = Coord::new(0, 0, 0);

    // Conformance: every text-protocol test of memccapable, through three gateways. Its
    // timeout per read is raised from 2 s to 5 s, above the store's deadline for an
    // operation (3 s): how fast the store answers is measured by benches, not judged here.
    for c in [origin, Coord::new(1, 1, 1), Coord::new(2, 0, 2)] {
        let out = in_front(
            &t,
            &[
                "memccapable",
                "-a",
                "-t",
                "5",
                "-h",
                &t.front_addr(c),
                "-p",
                "11211",
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        let store = status(&t, c).map(|s| s["kv"]["store"].clone());
        let slow = store
            .as_ref()
            .map(|s| (s["slow_ops"].clone(), s["slowest_op_us"].clone()));
        eprintln!("memccapable via {c}:\n{text}\nslow operations, slowest (us): {slow:?}");
        if !out.status.success() {
            diagnose(&t, c);
        }
        assert!(out.status.success(), "memccapable via {c}: {text}");
        assert!(text.contains("All tests passed"), "{text}");
        assert_eq!(text.matches("[pass]").count(), 27, "{text}");
    }

    // Written through one gateway, read back byte-exact through all 27.
    let dir = t.dir();
    let first = dir.join("kv-first.json");
    let first_s = first.to_string_lossy().into_owned();
    let (ok, w) = kvcheck(
        &t,
        &["write", &t.front_addr(origin), "first", "400", &first_s],
    );
    eprintln!("write: {w}");
    assert!(ok && w["written"] == json!(400), "{w}");
    let hosts: Vec<String> = all.iter().map(|&c| t.front_addr(c)).collect();
    let (ok, r) = kvcheck(&t, &["read", &hosts.join(","), &first_s]);
    eprintln!("read through every gateway: {r}");
    assert!(ok, "{r}");
    assert_eq!(r["checked"], json!(400 * 27));
    let before = copies(&t, &all);
    assert_eq!(
        before.keys().filter(|k| k.starts_with("first-")).count(),
        400
    );
    assert!(before.values().all(|&n| n == 3), "three copies of each key");

    multiget(&t, origin);

    // The server holding the most keys (not the writer's) is killed while writes go on.
    let victim = *all
        .iter()
        .filter(|&&c| c != origin)
        .max_by_key(|&&c| held(&t, c).len())
        .expect("a victim");
    let victim_keys = held(&t, victim).len();
    eprintln!("victim {victim} holds {victim_keys} keys");
    let during = dir.join("kv-during.json");
    let during_s = during.to_string_lossy().into_owned();
    let writer_addr = t.front_addr(origin);
    let t0 = Instant::now();
    let (ok, w) = std::thread::scope(|s| {
        let writer =
            s.spawn(|| kvcheck(&t, &["writeloop", &writer_addr, "during", "8", &during_s]));
        std::thread::sleep(Duration::from_secs(2));
        t.kill(victim);
        writer.join().expect("writer")
    });
    eprintln!("writes through the failure: {w} in {:?}", t0.elapsed());
    assert!(ok && w["written"].as_u64().unwrap_or(0) > 50, "{w}");
    let live: Vec<Coord> = all.iter().copied().filter(|&c| c != victim).collect();
    let live_hosts: Vec<String> = live.iter().map(|&c| t.front_addr(c)).collect();
    let (ok, r) = kvcheck(&t, &["read", &live_hosts.join(","), &first_s, &during_s]);
    eprintln!("acknowledged values after the failure: {r}");
    assert!(ok, "{r}");
    assert_eq!(r["missing"], json!(0), "lost values: {r}");

    // Re-replication (4 s after the failure): three live copies of every key again.
    let acked = r["keys"].as_u64().unwrap_or(0) as usize;
    let start = Instant::now();
    let counted = loop {
        let n = copies(&t, &live);
        let short = n.values().filter(|&&k| k < 3).count() + acked.saturating_sub(n.len());
        if short == 0 {
            break n;
        }
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "{short} keys still have fewer than three live copies"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let total: usize = counted.values().sum();
    let rerep: u64 = live
        .iter()
        .filter_map(|&c| status(&t, c))
        .map(|s| s["kv"]["store"]["rereplicated"].as_u64().unwrap_or(0))
        .sum();
    eprintln!(
        "after re-replication: {} keys, {total} live copies (min {}), {rerep} copies re-created, {:?} after the kill",
        counted.len(),
        counted.values().min().copied().unwrap_or(0),
        start.elapsed() + Duration::from_secs(6)
    );
    assert!(rerep > 0);

    // The server comes back empty and catches up in the background.
    t.start_daemon(victim, Daemon::Control);
    t.start_daemon(victim, Daemon::Torusd);
    t.wait_converged(Duration::from_secs(60));
    let start = Instant::now();
    while status(&t, victim).is_none_or(|s| s["kv"]["store"]["caught_up"] != json!(1)) {
        assert!(start.elapsed() < Duration::from_secs(60), "no catch-up");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut keys: Vec<String> =
        serde_json::from_str::<Vec<String>>(&std::fs::read_to_string(&first).expect("first keys"))
            .expect("json");
    keys.extend(
        serde_json::from_str::<Vec<String>>(&std::fs::read_to_string(&during).expect("keys"))
            .expect("json"),
    );
    let should: usize = keys
        .iter()
        .filter(|k| {
            let kh = Key::from_bytes(k.as_bytes()).routing_key();
            get_servers_for_key(dims, kh, 3, |_| true).contains(&victim)
        })
        .count();
    let start = Instant::now();
    let mut has = 0;
    while start.elapsed() < Duration::from_secs(30) {
        has = held(&t, victim).len();
        if has >= should {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("restarted {victim}: holds {has} of the {should} keys it should hold");
    assert!(has >= should, "{has} < {should}");
    let (ok, r) = kvcheck(&t, &["read", &t.front_addr(victim), &first_s, &during_s]);
    eprintln!("through the restarted server's gateway: {r}");
    assert!(ok, "{r}");
}
