//! The restart soak (issue 13): a 3x3x3 torus of namespaces where every server keeps checked
//! reliable traffic going to changing peers (the built-in load service, journalled) while
//! 20 random restarts hit it over about two minutes: torusd, the control process or both,
//! with SIGTERM or SIGKILL. An oracle then reads every journal and checks the delivery
//! contract: nothing delivered twice, nothing corrupt, every message reported acknowledged
//! present at its receiver, every message followed to an end (acknowledged or failed); and at
//! the end every pair of servers exchanges reliable messages again. Needs root.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_e2e::{Daemon, Torus};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::topology::Coord;

const RESTARTS: usize = 20;
const GAP: Duration = Duration::from_secs(6);

fn journal(t: &Torus, c: Coord) -> std::path::PathBuf {
    t.dir()
        .join(format!("journal-{}.log", c.to_string().replace(',', "-")))
}

fn start_load(t: &Torus, c: Coord, seed: u64) {
    let req = json!({
        "cmd": "load", "action": "start", "peers": "all", "rate": 80,
        "min": 64, "max": 6000, "dwell_ms": 300, "seed": seed,
    });
    let r = t.ask_within(c, &req, Duration::from_secs(5));
    assert!(r.is_ok(), "load start at {c}: {r:?}");
}

/// Until `c`'s torusd runs a dataplane (it has its coordinate).
fn wait_dataplane(t: &Torus, c: Coord) -> Duration {
    let start = Instant::now();
    loop {
        let st = t.ask_within(c, &json!({"cmd": "status"}), Duration::from_secs(1));
        if st.is_ok_and(|v| v["coord"].is_array()) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{c}'s torusd did not come back"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_converged(t: &Torus) {
    let start = Instant::now();
    loop {
        let ok = t.dims.coords().all(|c| {
            t.control(c).is_some_and(|v| {
                v["reachable"] == json!(27) && v["published_version"] == v["view_version"]
            })
        });
        if ok {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(40), "no convergence");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the journals say, checked.
#[derive(Debug, Default)]
struct Oracle {
    sent: u64,
    acked: u64,
    failed: HashMap<String, u64>,
    received: u64,
    duplicates: u64,
    bad: u64,
    /// Reported acknowledged, but not in the receiver's journal.
    missing: u64,
    /// Reports that do not match what was sent (counts, tags).
    mismatches: u64,
    /// Still unresolved in the last incarnation of each server.
    unresolved: u64,
    incarnations: u64,
}

fn parse_coord(s: &str) -> Coord {
    s.parse().expect("coordinate in journal")
}

fn check_journals(t: &Torus) -> Oracle {
    let mut o = Oracle::default();
    // (receiver, sender, sender incarnation, tag) -> times received.
    let mut receipts: HashMap<(Coord, Coord, String, u64), u32> = HashMap::new();
    // (sender, incarnation, receiver, tag) reported acknowledged.
    let mut acked: Vec<(Coord, String, Coord, u64)> = Vec::new();
    for me in t.dims.coords() {
        let text = std::fs::read_to_string(journal(t, me)).unwrap_or_default();
        let mut inc = String::new();
        let mut fifo: HashMap<Coord, VecDeque<u64>> = HashMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            match f.first().copied() {
                Some("I") => {
                    inc = f[1].to_string();
                    fifo.clear();
                    o.incarnations += 1;
                }
                Some("S") => {
                    o.sent += 1;
                    fifo.entry(parse_coord(f[2]))
                        .or_default()
                        .push_back(f[1].parse().expect("tag"));
                }
                Some("A") => {
                    let dest = parse_coord(f[1]);
                    let count: u64 = f[2].parse().expect("count");
                    let last: u64 = f[3].parse().expect("tag");
                    let q = fifo.entry(dest).or_default();
                    let mut popped = None;
                    for _ in 0..count {
                        match q.pop_front() {
                            Some(tag) => {
                                acked.push((me, inc.clone(), dest, tag));
                                popped = Some(tag);
                            }
                            None => o.mismatches += 1,
                        }
                    }
                    if popped != Some(last) {
                        o.mismatches += 1;
                    }
                    o.acked += count;
                }
                Some("F") => {
                    let dest = parse_coord(f[1]);
                    let q = fifo.entry(dest).or_default();
                    for tag in &f[3..] {
                        let tag: u64 = tag.parse().expect("tag");
                        match q.iter().position(|x| *x == tag) {
                            Some(i) => {
                                q.remove(i);
                            }
                            None => o.mismatches += 1,
                        }
                        *o.failed.entry(f[2].to_string()).or_insert(0) += 1;
                    }
                }
                Some("R") => {
                    o.received += 1;
                    if f[4] != "ok" {
                        o.bad += 1;
                    }
                    let key = (
                        me,
                        parse_coord(f[1]),
                        f[2].to_string(),
                        f[3].parse().expect("tag"),
                    );
                    let n = receipts.entry(key).or_insert(0);
                    *n += 1;
                    if *n > 1 {
                        o.duplicates += 1;
                    }
                }
                _ => {}
            }
        }
        o.unresolved += fifo.values().map(|q| q.len() as u64).sum::<u64>();
    }
    for (src, inc, dst, tag) in acked {
        if !receipts.contains_key(&(dst, src, inc.clone(), tag)) {
            o.missing += 1;
            if o.missing <= 5 {
                eprintln!(
                    "acknowledged but not received: {src} (incarnation {inc}) -> {dst}, tag {tag}"
                );
            }
        }
    }
    o
}

#[test]
fn twenty_random_restarts_under_checked_traffic() {
    let t = Torus::up("tsk", "3x3x3");
    // Every torusd journals its load service from its start, so nothing it receives
    // before the load is (re)started goes unrecorded.
    for c in t.dims.coords() {
        let path = journal(&t, c);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(t.node_file(c))
            .expect("node file");
        use std::io::Write;
        writeln!(f, "\n[load]\njournal = \"{}\"", path.display()).expect("append [load]");
    }
    t.start();
    wait_converged(&t);
    let all: Vec<Coord> = t.dims.coords().collect();
    for (i, c) in all.iter().enumerate() {
        start_load(&t, *c, i as u64 + 1);
    }
    let mut rng = SplitMix64::new(13);
    let mut done = Vec::new();
    let soak = Instant::now();
    for k in 0..RESTARTS {
        let due = soak + GAP * k as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let c = all[rng.below(all.len() as u64) as usize];
        let which = match rng.below(3) {
            0 => "torusd",
            1 => "control",
            _ => "both",
        };
        let sig = if rng.chance(0.5) { "TERM" } else { "KILL" };
        if which != "torusd" {
            t.signal(c, Daemon::Control, sig);
        }
        if which != "control" {
            t.signal(c, Daemon::Torusd, sig);
        }
        std::thread::sleep(Duration::from_millis(100 + rng.below(700)));
        if which != "torusd" {
            t.start_daemon(c, Daemon::Control);
        }
        let mut note = String::new();
        if which != "control" {
            t.start_daemon(c, Daemon::Torusd);
            let up = wait_dataplane(&t, c);
            start_load(&t, c, 1000 + k as u64);
            note = format!(", its dataplane back after {} ms", up.as_millis());
        }
        eprintln!(
            "{:>5.1} s: restart {} of {RESTARTS}: {which} at {c}, SIG{sig}{note}",
            soak.elapsed().as_secs_f64(),
            k + 1
        );
        done.push((c, which, sig));
    }
    std::thread::sleep(GAP);
    // Stop the traffic; everything on its way ends (acknowledged or failed) within the
    // silent-peer deadline.
    for c in &all {
        let r = t.ask_within(
            *c,
            &json!({"cmd": "load", "action": "stop"}),
            Duration::from_secs(5),
        );
        assert!(r.is_ok(), "load stop at {c}: {r:?}");
    }
    wait_converged(&t);
    let start = Instant::now();
    let mut reports: Vec<Value>;
    loop {
        reports = all
            .iter()
            .map(|c| {
                t.ask_within(
                    *c,
                    &json!({"cmd": "load", "action": "report"}),
                    Duration::from_secs(5),
                )
                .expect("load report")
            })
            .collect();
        let open: u64 = reports
            .iter()
            .map(|r| r["outstanding"].as_u64().unwrap_or(0))
            .sum();
        if open == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{open} messages never reached an end"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let o = check_journals(&t);
    eprintln!(
        "soak over {:.0} s, {} restarts: {o:?}",
        soak.elapsed().as_secs_f64(),
        done.len()
    );
    assert_eq!(done.len(), RESTARTS);
    assert!(o.sent > 10_000, "traffic flowed: {o:?}");
    assert!(o.acked > o.sent / 2, "most messages acknowledged: {o:?}");
    assert_eq!(o.duplicates, 0, "delivered twice");
    assert_eq!(o.bad, 0, "corrupt deliveries");
    assert_eq!(
        o.missing, 0,
        "reported delivered but missing at the receiver"
    );
    assert_eq!(o.mismatches, 0, "reports that do not match the sends");
    assert_eq!(
        o.unresolved, 0,
        "messages never acknowledged nor reported failed"
    );
    for r in &reports {
        assert_eq!(r["report_mismatch"], json!(0), "{r}");
        assert_eq!(r["journal_error"], Value::Null, "{r}");
    }

    // Every pair exchanges checked reliable messages again.
    let mut lost = 0;
    for a in &all {
        for b in &all {
            if a != b {
                let r = t.ask_within(
                    *a,
                    &json!({"cmd": "ping", "to": b.to_string(), "count": 2, "reliable": true}),
                    Duration::from_secs(10),
                );
                lost += 2 - r.map(|v| v["received"].as_u64().unwrap_or(0)).unwrap_or(0);
            }
        }
    }
    assert_eq!(
        lost, 0,
        "every pair exchanges reliable messages after the soak"
    );
}
