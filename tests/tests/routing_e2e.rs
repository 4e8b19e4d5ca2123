//! Source routing (BCube's BSR) on real daemons: a 4x4x1 torus of namespaces where every
//! torusd source-routes its reliable traffic. Malformed source routes are refused and
//! counted; probes steer a transfer off a link a competing transfer loads (both throughputs
//! reported, against link-state next hops); a checked transfer survives a link cut on its
//! path, its source switching paths long before the link-state view changes (both times
//! reported). Needs root.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_e2e::{data_frame as routed_frame, inject, ip, mac, Torus};
use torusnet_proto::topology::{Coord, Dir};
use torusnet_proto::wire::{offset, HEADERS_LEN};

fn status(t: &Torus, c: Coord) -> Value {
    t.ask(c, false, &json!({"cmd": "status"}))
        .expect("torusd status")
}

fn routing(t: &Torus, c: Coord) -> Value {
    status(t, c)["engine"]["routing"].clone()
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

fn set_mode(t: &Torus, c: Coord, mode: &str) {
    let r = t.ask_within(
        c,
        &json!({"cmd": "routing", "mode": mode}),
        Duration::from_secs(10),
    );
    assert!(r.is_ok(), "routing {mode}: {r:?}");
}

/// A checked bulk transfer of `bytes` from `from` to `to`: its goodput, Gb/s.
fn bench(t: &Torus, from: Coord, to: Coord, bytes: u64) -> f64 {
    t.checked_bench(from, to, bytes)["goodput_gbps"]
        .as_f64()
        .unwrap_or(0.0)
}

/// The path `from`'s flow to `to` uses, as directions.
fn path_of(t: &Torus, from: Coord, to: Coord) -> Option<Vec<Dir>> {
    let r = routing(t, from);
    let f = r["flows"]
        .as_array()?
        .iter()
        .find(|f| f["dst"] == json!(to.to_string()))?
        .clone();
    f["path"]
        .as_str()?
        .split(' ')
        .map(|d| d.parse().ok())
        .collect()
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[test]
fn source_routes_refuse_bad_routes_avoid_loaded_links_and_survive_a_cut() {
    let t = Torus::up_with(
        "sr",
        "4x4x1",
        &[
            "--routing",
            "mode = \"source\"",
            "--routing",
            "link_gbps = 4",
        ],
    );
    t.start();
    t.wait_converged(Duration::from_secs(60));

    // 1. Malformed source routes arriving at (1,0,0) from (0,0,0) are refused and counted.
    let victim = Coord::new(1, 0, 0);
    let attacker = Coord::new(0, 0, 0);
    let (vm, am) = (mac(&t, victim, "mx"), mac(&t, attacker, "px"));
    let dst = Coord::new(3, 0, 0);
    let good = routed_frame(
        vm,
        am,
        attacker,
        dst,
        &[Dir::PlusX, Dir::PlusX, Dir::PlusX],
        1,
    );
    let mut frames = Vec::new();
    for _ in 0..40 {
        let mut bad_dir = good.clone();
        bad_dir[HEADERS_LEN + 1] = 9;
        frames.push(bad_dir);
        let mut past = good.clone();
        past[offset::ROUTE_NEXT] = 4;
        frames.push(past);
        let mut long = good.clone();
        long[offset::ROUTE_LEN] = 200;
        frames.push(long);
        // A route that ends here, though the frame is for (3,0,0).
        frames.push(routed_frame(vm, am, attacker, dst, &[Dir::PlusX], 1));
    }
    let before = status(&t, victim);
    inject(&t.ns(attacker), "px", frames);
    std::thread::sleep(Duration::from_millis(500));
    let after = status(&t, victim);
    let bad_routes = |v: &Value| -> u64 {
        v["links"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| u(&l["counters"], "drop_bad_route"))
            .sum()
    };
    let refused = bad_routes(&after) - bad_routes(&before);
    eprintln!("malformed source routes: 160 injected, {refused} refused and counted as bad_route");
    assert!(refused >= 150, "{refused} of 160 counted");
    let r = t
        .ask(
            attacker,
            false,
            &json!({"cmd": "ping", "to": "2,0,0", "count": 20}),
        )
        .unwrap();
    assert_eq!(r["received"].as_u64(), Some(20), "still serving: {r}");

    // 2. A competing transfer loads (1,1,0)->(2,1,0); a transfer from (0,1,0) to (2,1,0)
    //    by next hops stripes over +x (through that link) and -x, by source routes it is
    //    steered onto one path off it.
    let (a, b) = (Coord::new(0, 1, 0), Coord::new(2, 1, 0));
    let (ca, cb) = (Coord::new(1, 1, 0), Coord::new(2, 1, 0));
    let bytes = 400_000_000;
    // Whether a path from `a` crosses the loaded link.
    let crosses = |path: &[Dir]| -> bool {
        let mut at = a;
        path.iter().any(|d| {
            let next = t.dims.neighbor(at, *d);
            let hit = at == ca && next == cb;
            at = next;
            hit
        })
    };
    // Runs the transfer beside the competitor; with source routes, samples the flow's path
    // every 50 ms while it runs.
    let run = |mode: &str| -> (f64, f64, Vec<Vec<Dir>>) {
        set_mode(&t, a, mode);
        std::thread::scope(|s| {
            let h = s.spawn(|| bench(&t, ca, cb, bytes * 2));
            // Let the competitor fill its link and the probes see it.
            std::thread::sleep(Duration::from_millis(400));
            let mine = s.spawn(|| bench(&t, a, b, bytes));
            let mut samples = Vec::new();
            while !mine.is_finished() {
                if let Some(p) = path_of(&t, a, b) {
                    samples.push(p);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (mine.join().unwrap(), h.join().unwrap(), samples)
        })
    };
    // The competitor goes by next hops: its one next hop is the link to load (by source
    // routes it could step aside itself).
    set_mode(&t, ca, "next-hop");
    let (nh, nh_comp, _) = run("next-hop");
    let (sr, sr_comp, samples) = run("source");
    // The first probing round closes within a few tens of ms of the flow passing 256 KiB;
    // status snapshots lag by up to 100 ms: judge the samples after the first 300 ms.
    // (A faster machine may finish sooner: then the last samples are judged.)
    let skip = 6.min(samples.len().saturating_sub(4));
    let judged: Vec<&Vec<Dir>> = samples.iter().skip(skip).collect();
    let off = judged.iter().filter(|p| !crosses(p)).count();
    eprintln!(
        "transfer (0,1,0)->(2,1,0) beside a competing transfer on (1,1,0)->(2,1,0): \
         next hops {nh:.2} Gb/s (competitor {nh_comp:.2}), source routes {sr:.2} Gb/s \
         (competitor {sr_comp:.2}); the source-routed flow was off the loaded link in {off} \
         of {} samples after its first 300 ms (paths seen: {:?})",
        judged.len(),
        samples.iter().collect::<std::collections::BTreeSet<_>>()
    );
    assert!(
        !judged.is_empty(),
        "the source-routed flow's path in the status"
    );
    assert!(
        off * 4 >= judged.len() * 3,
        "probes kept the flow off the loaded link in only {off} of {} samples",
        judged.len()
    );

    // Per service: with only service 4000 source-routed, the bench service's transfer goes
    // by next hops (no frame of it carries a route); with the bench service (2) listed, it
    // is source-routed again.
    // Status snapshots are published every 100 ms: wait for the last transfer's to land.
    let routed = |c: Coord| {
        std::thread::sleep(Duration::from_millis(300));
        u(&routing(&t, c), "routed_sent")
    };
    let r = t.ask_within(
        a,
        &json!({"cmd": "routing", "mode": "source", "services": [4000]}),
        Duration::from_secs(10),
    );
    assert!(r.is_ok(), "{r:?}");
    let before = routed(a);
    bench(&t, a, b, 50_000_000);
    let other = routed(a) - before;
    let r = t.ask_within(
        a,
        &json!({"cmd": "routing", "mode": "source", "services": [2]}),
        Duration::from_secs(10),
    );
    assert!(r.is_ok(), "{r:?}");
    let before = routed(a);
    bench(&t, a, b, 50_000_000);
    let listed = routed(a) - before;
    eprintln!("per service: {other} frames routed with only service 4000 listed, {listed} with the bench service listed");
    assert_eq!(other, 0, "the bench service was not to be source-routed");
    assert!(listed > 1000, "{listed}");
    let bad = t.ask_within(
        a,
        &json!({"cmd": "routing", "mode": "source", "services": []}),
        Duration::from_secs(10),
    );
    assert!(bad.is_err(), "an empty list is refused: {bad:?}");

    // 3. A checked transfer survives a cut of a link on its path; its source switches paths
    //    long before the link-state view changes.
    let (s, d) = (Coord::new(0, 0, 0), Coord::new(2, 1, 0));
    // The flow may still move to another of its equal paths between the last look at its
    // path and the cut (its source re-probes), and then nothing fails over; an attempt that
    // saw no failover is made again (at most three), on a link restored and a view healed.
    let mut attempt = 0;
    let cut = loop {
        attempt += 1;
        let cut = std::thread::scope(|sc| {
            let h = sc.spawn(|| bench(&t, s, d, 1_500_000_000));
            // The path to cut is one the flow has kept for a while: its source re-probes and
            // may move among the six equal paths, and a status snapshot is up to 100 ms old, so
            // a path read once could be left just before the cut (then nothing fails over; seen
            // once in CI-like runs). Two snapshots 300 ms apart must agree.
            let start = Instant::now();
            let mut last: Option<Vec<Dir>> = None;
            let path = loop {
                let p = path_of(&t, s, d).filter(|p| p.len() >= 2);
                if p.is_some() && p == last {
                    break p.unwrap_or_default();
                }
                last = p;
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "no steady flow seen"
                );
                std::thread::sleep(Duration::from_millis(300));
            };
            // The path's second link, cut at the server it leaves.
            let mid = t.dims.neighbor(s, path[0]);
            let ifname = match path[1] {
                Dir::PlusX => "px",
                Dir::MinusX => "mx",
                Dir::PlusY => "py",
                Dir::MinusY => "my",
                Dir::PlusZ => "pz",
                Dir::MinusZ => "mz",
            };
            let failovers_before = u(&routing(&t, s), "failovers");
            let t0 = unix_ms();
            ip(&["-n", &t.ns(mid), "link", "set", ifname, "down"]);
            let (mut switched, mut viewed) = (None, None);
            let start = Instant::now();
            while (switched.is_none() || viewed.is_none())
                && start.elapsed() < Duration::from_secs(10)
            {
                let st = status(&t, s);
                let r = &st["engine"]["routing"];
                if switched.is_none() && u(r, "failovers") > failovers_before {
                    switched = Some(u(r, "last_failover_unix_ms").saturating_sub(t0));
                }
                let v = u(&st["engine"], "view_changed_unix_ms");
                if viewed.is_none() && v > t0 {
                    viewed = Some(v - t0);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let goodput = h.join().unwrap();
            ip(&["-n", &t.ns(mid), "link", "set", ifname, "up"]);
            (path, switched, viewed, goodput, t0)
        });
        let (path, switched, viewed, goodput, t0) = &cut;
        eprintln!(
            "attempt {attempt}: link cut on path {path:?}: the source switched paths {switched:?} \
         ms after the cut, its link-state view changed {viewed:?} ms after; the 1.5 GB \
         transfer completed checked at {goodput:.2} Gb/s"
        );
        if switched.is_some() || attempt == 3 {
            break cut;
        }
        // The link is up again: wait for the source's view to have it back (a change after
        // the one the cut made) before the next attempt.
        let down_seen = t0 + viewed.unwrap_or(0);
        let start = Instant::now();
        while u(&status(&t, s)["engine"], "view_changed_unix_ms") <= down_seen {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the view never healed"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let (_, switched, viewed, _, _) = cut;
    let switched = switched.expect("the source switched paths");
    assert!(switched <= 50, "switch within 50 ms: {switched} ms");
    if let Some(v) = viewed {
        assert!(switched < v, "faster than the view ({switched} vs {v} ms)");
    }
    let st = routing(&t, s);
    assert!(
        u(&st, "failures") >= 1,
        "a path-failure report reached the source: {st}"
    );
}
