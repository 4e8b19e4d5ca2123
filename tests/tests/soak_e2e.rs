//! Soaks of a 3x3x3 torus of namespaces. Needs root.
//!
//! The restart soak (issue 13): every server keeps checked reliable traffic going to
//! changing peers (the built-in load service, journalled) while random restarts hit it, one
//! every 6 s (TORUSNET_RESTARTS of them: 10 in the test command, 20 in scripts/soak.sh):
//! torusd, the control process or both, with SIGTERM or SIGKILL. An
//! oracle then reads every journal and checks the delivery contract: nothing delivered twice,
//! nothing corrupt, every message reported acknowledged present at its receiver, every
//! message followed to an end (acknowledged or failed); and at the end every pair of servers
//! exchanges reliable messages again.
//!
//! The platform soak: the same journalled traffic, and at the same time memcached clients
//! (pymemcache) running a register workload through six gateways, judged for linearizability
//! (scripts/kvlin.py: asserted before the faults begin and under them), multicasts back to back, an iperf3 flow and 100 MB HTTP downloads over
//! the IP service, two applications' calls accounted for exactly once, and remote writes
//! read back, while faults land every few seconds: loss on a link, duplication and
//! reordering on a link, a link taken down and up, torusd or the control process killed and
//! restarted (torusd only away from the steady servers the IP flows and applications use).
//! Every daemon's memory is compared before and after, and the steady torusds' heap from
//! warm-up to the end.
//! Its length is TORUSNET_SOAK_SECONDS (60 in the test command; scripts/soak.sh runs 600).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_e2e::ip::{gbps, iperf, wait_interfaces};
use torusnet_e2e::{env_u64, root, Daemon, Torus};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::topology::Coord;

const GAP: Duration = Duration::from_secs(6);

fn journal(t: &Torus, c: Coord) -> std::path::PathBuf {
    t.dir()
        .join(format!("journal-{}.log", c.to_string().replace(',', "-")))
}

/// Makes every torusd journal its load service from its start, so nothing it receives
/// before the load is (re)started goes unrecorded.
fn journal_loads(t: &Torus) {
    for c in t.dims.coords() {
        let path = journal(t, c);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(t.node_file(c))
            .expect("node file");
        use std::io::Write;
        writeln!(f, "\n[load]\njournal = \"{}\"", path.display()).expect("append [load]");
    }
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
fn random_restarts_under_checked_traffic() {
    let restarts = env_u64("TORUSNET_RESTARTS", 10);
    let t = Torus::up("tsk", "3x3x3");
    journal_loads(&t);
    t.start();
    wait_converged(&t);
    let all: Vec<Coord> = t.dims.coords().collect();
    for (i, c) in all.iter().enumerate() {
        start_load(&t, *c, i as u64 + 1);
    }
    let mut rng = SplitMix64::new(13);
    let mut done = Vec::new();
    let soak = Instant::now();
    for k in 0..restarts {
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
            start_load(&t, c, 1000 + k);
            note = format!(", its dataplane back after {} ms", up.as_millis());
        }
        eprintln!(
            "{:>5.1} s: restart {} of {restarts}: {which} at {c}, SIG{sig}{note}",
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
    assert_eq!(done.len() as u64, restarts);
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

/// A count from the environment variable `name` (a soak's length), else `default`.
/// Resident memory of every daemon now, by (server, daemon, pid), in KiB.
fn rss(t: &Torus) -> HashMap<(Coord, &'static str, u32), u64> {
    let mut out = HashMap::new();
    for c in t.dims.coords() {
        for (which, name) in [(Daemon::Torusd, "torusd"), (Daemon::Control, "control")] {
            for p in t.pids(c, which) {
                let kb = std::fs::read_to_string(format!("/proc/{p}/status"))
                    .ok()
                    .and_then(|s| {
                        s.lines()
                            .find(|l| l.starts_with("VmRSS:"))
                            .and_then(|l| l.split_whitespace().nth(1))
                            .and_then(|v| v.parse().ok())
                    });
                if let Some(kb) = kb {
                    out.insert((c, name, p), kb);
                }
            }
        }
    }
    out
}

/// The memory of the torusd at `servers` (`{"cmd":"memory"}`, `trim` as it says), in MiB:
/// resident, the heap in use, the heap the allocator holds; then how long the trim took, in
/// microseconds (0 when not asked); in their order.
fn memory_of(t: &Torus, servers: &[Coord], trim: bool) -> Vec<[u64; 4]> {
    servers
        .iter()
        .map(|c| {
            let m = t
                .ask_within(
                    *c,
                    &json!({"cmd": "memory", "trim": trim}),
                    Duration::from_secs(5),
                )
                .unwrap_or_default();
            let mib = |k: &str, unit: u64| m[k].as_u64().unwrap_or(0) / unit;
            [
                mib("rss_kib", 1024),
                mib("heap_in_use", 1 << 20),
                mib("heap_held", 1 << 20),
                mib("trim_us", 1),
            ]
        })
        .collect()
}

/// What the workloads between steady servers saw.
struct Ran {
    ip: Value,
    http: Downloads,
    calls: Calls,
    rmem: RemoteWrites,
}

/// scripts/kvlin.py in the front namespace: `seconds` of the register workload through
/// `gateways`, judged; its JSON line.
fn kvlin(t: &Torus, gateways: &[String], seconds: u64, seed: u64) -> Value {
    let script = root().join("scripts/kvlin.py");
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &format!("{}-front", t.prefix), "python3"])
        .arg(&script)
        .args([
            &gateways.join(","),
            "4",
            "6",
            &seconds.to_string(),
            &seed.to_string(),
        ])
        .output()
        .expect("run kvlin.py");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text.lines().last().unwrap_or_default().to_string();
    serde_json::from_str::<Value>(&line).unwrap_or_else(|e| {
        panic!(
            "kvlin.py: {e}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Servers whose torusd the platform soak never kills: the ends of its IP flows and of
/// its applications' exchanges (a TCP connection, and an application's channel, end with
/// their torusd). Their links and control processes take faults like any other's, and the
/// servers between them are killed like any other.
const STEADY: [usize; 8] = [1, 25, 2, 24, 3, 23, 5, 21];

fn apps_sock(t: &Torus, c: Coord) -> std::path::PathBuf {
    t.dir()
        .join(format!("{}-apps.sock", c.to_string().replace(',', "-")))
}

fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Two applications' calls, accounted for exactly once.
#[derive(Debug, Default)]
struct Calls {
    made: u64,
    answered: u64,
    /// Answers that were not the request's bytes.
    wrong: u64,
    /// Calls that ended with an error, by the error.
    failed: HashMap<String, u64>,
    /// Requests the serving application ran.
    ran: u64,
    /// Requests it ran more than once.
    ran_twice: u64,
    /// Calls answered that the server never ran.
    answered_unrun: u64,
}

/// Applications at `server` and `client` (in their own threads here, attached through the
/// application sockets) exchanging calls until `until`: the server answers each request
/// with its bytes and counts every request id it runs; every call ends answered or with an
/// error, and nothing is run twice.
fn calls(t: &Torus, server: Coord, client: Coord, until: Instant) -> Calls {
    use std::sync::atomic::{AtomicBool, Ordering};
    use torusnet_client::{Client, Dest, Wait};
    let stop = AtomicBool::new(false);
    let srv = Client::attach(apps_sock(t, server), "soak-calls").expect("attach the server");
    let cli = Client::attach(apps_sock(t, client), "soak-caller").expect("attach the caller");
    let to = srv.address();
    std::thread::scope(|s| {
        let runs = s.spawn(|| {
            let mut runs: HashMap<u64, u64> = HashMap::new();
            while !stop.load(Ordering::Relaxed) {
                let r = srv.serve(Wait::Timeout(Duration::from_millis(100)), |_, req| {
                    if let Some(id) = req.get(..8) {
                        let id = u64::from_le_bytes(id.try_into().unwrap_or_default());
                        *runs.entry(id).or_default() += 1;
                    }
                    req.to_vec()
                });
                assert!(r.is_ok(), "the serving application: {r:?}");
            }
            runs
        });
        let mut out = Calls::default();
        let mut answered = Vec::new();
        let mut id = 0u64;
        while Instant::now() < until {
            let mut req = id.to_le_bytes().to_vec();
            req.extend(bytes(id, 16 + (id as usize * 7919) % 4000));
            out.made += 1;
            match cli.call(Dest::Service(to), &req, Duration::from_secs(3)) {
                Ok(reply) if reply == req => {
                    out.answered += 1;
                    answered.push(id);
                }
                Ok(_) => out.wrong += 1,
                Err(e) => {
                    *out.failed.entry(e.to_string()).or_default() += 1;
                    // Whatever happened to that call, the next is not held up by it.
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            id += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let runs = runs.join().expect("server thread");
        out.ran = runs.len() as u64;
        out.ran_twice = runs.values().filter(|&&n| n > 1).count() as u64;
        out.answered_unrun = answered.iter().filter(|i| !runs.contains_key(i)).count() as u64;
        out
    })
}

/// Remote writes read back.
#[derive(Debug, Default)]
struct RemoteWrites {
    writes: u64,
    reads: u64,
    /// Reads (and, at the end, the owner's own bytes) equal to the last write that
    /// succeeded.
    matched: u64,
    /// Reads that differed from it.
    differed: u64,
    /// Operations that ended with an error, by status.
    failed: HashMap<String, u64>,
}

/// An owner at `owner` registers a region; an initiator at `initiator` writes 64 KiB blocks
/// of it one-sided, reads each back and compares, until `until`; then the owner's bytes are
/// compared with every block's last write that succeeded. A failed write leaves its block
/// unknown until it is written again.
fn remote_writes(t: &Torus, owner: Coord, initiator: Coord, until: Instant) -> RemoteWrites {
    use torusnet_client::rmem::{Status, READ, WRITE};
    use torusnet_client::{Client, RemoteOptions};
    const BLOCK: usize = 64 << 10;
    const BLOCKS: usize = 16;
    let own = Client::attach(apps_sock(t, owner), "soak-rmem-owner").expect("attach the owner");
    let ini = Client::attach(apps_sock(t, initiator), "soak-rmem").expect("attach the initiator");
    let region = own
        .register_region((BLOCK * BLOCKS) as u64, READ | WRITE)
        .expect("register the region");
    let local = ini
        .register_region(BLOCK as u64, READ | WRITE)
        .expect("register the read-back region");
    let mut out = RemoteWrites::default();
    let mut last: Vec<Option<u64>> = vec![None; BLOCKS];
    let fail = |out: &mut RemoteWrites, what: &str, s: String| {
        *out.failed.entry(format!("{what}: {s}")).or_default() += 1;
    };
    let mut k = 0u64;
    while Instant::now() < until {
        let b = (k as usize * 7) % BLOCKS;
        let at = (b * BLOCK) as u64;
        let data = bytes(k + 1, BLOCK);
        out.writes += 1;
        let wrote = ini
            .remote_write(&region.cap, at, &data, RemoteOptions::default())
            .and_then(|op| ini.wait_remote(op, Duration::from_secs(20)));
        match wrote {
            Ok((Status::Ok, _)) => last[b] = Some(k + 1),
            Ok((st, _)) => {
                last[b] = None;
                fail(&mut out, "write", st.name().to_string());
            }
            Err(e) => {
                last[b] = None;
                fail(&mut out, "write", e.to_string());
            }
        }
        if let Some(seed) = last[b] {
            out.reads += 1;
            let read = ini
                .remote_read(
                    &region.cap,
                    at,
                    BLOCK as u64,
                    &local,
                    0,
                    RemoteOptions::default(),
                )
                .and_then(|op| ini.wait_remote(op, Duration::from_secs(20)));
            match read {
                Ok((Status::Ok, _)) => {
                    let mut back = vec![0u8; BLOCK];
                    if ini.region_read(&local, 0, &mut back) && back == bytes(seed, BLOCK) {
                        out.matched += 1;
                    } else {
                        out.differed += 1;
                    }
                }
                Ok((st, _)) => fail(&mut out, "read", st.name().to_string()),
                Err(e) => fail(&mut out, "read", e.to_string()),
            }
        }
        k += 1;
    }
    for (b, seed) in last.iter().enumerate() {
        if let Some(seed) = seed {
            let mut mine = vec![0u8; BLOCK];
            if own.region_read(&region, (b * BLOCK) as u64, &mut mine)
                && mine == bytes(*seed, BLOCK)
            {
                out.matched += 1;
            } else {
                out.differed += 1;
            }
        }
    }
    out
}

/// Downloads over HTTP of a 100 MB file, each compared with the file.
#[derive(Debug, Default)]
struct Downloads {
    whole: u64,
    differed: u64,
    failed: u64,
    seconds: Vec<f64>,
}

/// python3's http.server at `server` serving 100 MB, fetched with curl from `client` over
/// and over until `until`.
fn downloads(t: &Torus, server: Coord, client: Coord, until: Instant) -> Downloads {
    use torusnet_e2e::ip::{download, pattern, serve_http};
    let dir = t.dir().join("www");
    std::fs::create_dir_all(&dir).expect("www");
    let data = pattern(100 << 20);
    std::fs::write(dir.join("big.bin"), &data).expect("write the file");
    let (procs, url) = serve_http(t, server, &dir, "big.bin");
    let got = t.dir().join("got.bin");
    let mut out = Downloads::default();
    while Instant::now() + Duration::from_secs(5) < until {
        let start = Instant::now();
        let _ = std::fs::remove_file(&got);
        if !download(t, client, &url, &got, Duration::from_secs(120)) {
            out.failed += 1;
            continue;
        }
        out.seconds.push(start.elapsed().as_secs_f64());
        if std::fs::read(&got).is_ok_and(|b| b == data) {
            out.whole += 1;
        } else {
            out.differed += 1;
        }
    }
    drop(procs);
    let _ = std::fs::remove_file(&got);
    let _ = std::fs::remove_file(dir.join("big.bin"));
    out
}

const IFNAMES: [&str; 6] = ["px", "mx", "py", "my", "pz", "mz"];
const LINKS: [&str; 6] = ["+x", "-x", "+y", "-y", "+z", "-z"];

#[test]
fn the_platform_under_faults() {
    let secs = env_u64("TORUSNET_SOAK_SECONDS", 60);
    let t = Torus::up_with("tpf", "3x3x3", &["--front"]);
    journal_loads(&t);
    t.start();
    wait_converged(&t);
    let all: Vec<Coord> = t.dims.coords().collect();
    let start_gw = Instant::now();
    for c in &all {
        while t
            .ask_within(*c, &json!({"cmd": "status"}), Duration::from_secs(2))
            .map_or(true, |s| s["kv"]["gateway"].is_null())
        {
            assert!(
                start_gw.elapsed() < Duration::from_secs(30),
                "no gateway at {c}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for (i, c) in all.iter().enumerate() {
        start_load(&t, *c, i as u64 + 1);
    }
    wait_interfaces(&t);
    std::thread::sleep(Duration::from_secs(5));
    let warm = rss(&t);

    let gateways: Vec<String> = [0usize, 4, 8, 13, 20, 26]
        .iter()
        .map(|i| t.front_addr(all[*i]))
        .collect();
    // Without faults first: the register history of six clients through six gateways (the
    // cache servers in play) must be linearizable.
    let quiet = kvlin(&t, &gateways, 5, 3);
    eprintln!(
        "key-value register workload, no faults: {} operations, linearizable {}",
        quiet["ops"], quiet["linearizable"]
    );
    assert_eq!(quiet["linearizable"], json!(true), "{quiet}");
    let until = Instant::now() + Duration::from_secs(secs);
    let steady: Vec<Coord> = STEADY.iter().map(|&i| all[i]).collect();
    let ip_secs = (secs * 3 / 4).max(10).to_string();
    let (kv, mcasts, faults, ran, steady_rss) = std::thread::scope(|s| {
        // The register workload under faults, judged for linearizability.
        let kv = s.spawn(|| kvlin(&t, &gateways, secs, 7));
        // An iperf3 flow and HTTP downloads over the IP service, applications' calls and
        // remote writes, each between two steady servers.
        let ipf = s.spawn(|| iperf(&t, steady[0], steady[1], 5301, &["-t", &ip_secs]));
        let http = s.spawn(|| downloads(&t, steady[2], steady[3], until));
        let rpc = s.spawn(|| calls(&t, steady[4], steady[5], until));
        let rm = s.spawn(|| remote_writes(&t, steady[6], steady[7], until));
        // Multicasts of 8 MB from changing roots, back to back.
        let mc = s.spawn(|| {
            let mut results = Vec::new();
            let mut k = 0u64;
            while Instant::now() < until {
                let root = all[(k as usize * 7 + 3) % all.len()];
                let r = t.ask_within(
                    root,
                    &json!({"cmd": "multicast", "generate": 8_000_000u64, "seed": k, "timeout_ms": 30_000}),
                    Duration::from_secs(40),
                );
                results.push((root, r));
                k += 1;
            }
            results
        });
        // The faults.
        let mut rng = SplitMix64::new(17);
        let mut faults: HashMap<&'static str, u64> = HashMap::new();
        // The steady servers' torusd are never restarted: their memory over the run, at the
        // start, once warmed up (a quarter of the run, at most a minute), then every minute.
        let mut steady_rss = vec![(0u64, memory_of(&t, &steady, false))];
        let began = Instant::now();
        let warm_secs = (secs / 4).min(60);
        while Instant::now() + Duration::from_secs(4) < until {
            std::thread::sleep(Duration::from_secs(2));
            let at = began.elapsed().as_secs();
            let due = match steady_rss.len() {
                1 => warm_secs,
                _ => steady_rss.last().map_or(0, |m| m.0) / 60 * 60 + 60,
            };
            if at >= due {
                steady_rss.push((at, memory_of(&t, &steady, false)));
            }
            let c = all[rng.below(all.len() as u64) as usize];
            let d = rng.below(6) as usize;
            match rng.below(5) {
                0 => {
                    let set = |drop: f64| {
                        t.ask_within(
                            c,
                            &json!({"cmd": "fault", "link": LINKS[d], "drop": drop}),
                            Duration::from_secs(5),
                        )
                    };
                    if set(0.05).is_ok() {
                        std::thread::sleep(Duration::from_secs(2));
                        let _ = set(0.0);
                        *faults.entry("loss 5% on a link for 2 s").or_default() += 1;
                    }
                }
                1 => {
                    let ip = |state: &str| {
                        std::process::Command::new("ip")
                            .args(["-n", &t.ns(c), "link", "set", "dev", IFNAMES[d], state])
                            .status()
                            .expect("ip link")
                    };
                    ip("down");
                    std::thread::sleep(Duration::from_millis(1500));
                    ip("up");
                    *faults.entry("link down for 1.5 s").or_default() += 1;
                }
                2 => {
                    // Not a steady server: the next one in index order that is not.
                    let mut c = c;
                    while steady.contains(&c) {
                        c = all[(t.dims.index(c) + 1) % all.len()];
                    }
                    t.signal(c, Daemon::Torusd, "KILL");
                    std::thread::sleep(Duration::from_millis(300));
                    t.start_daemon(c, Daemon::Torusd);
                    wait_dataplane(&t, c);
                    start_load(&t, c, 5000 + rng.below(1000));
                    *faults.entry("torusd killed and restarted").or_default() += 1;
                }
                3 => {
                    let set = |p: f64| {
                        t.ask_within(
                            c,
                            &json!({"cmd": "fault", "link": LINKS[d], "duplicate": p, "reorder": p}),
                            Duration::from_secs(5),
                        )
                    };
                    if set(0.05).is_ok() {
                        std::thread::sleep(Duration::from_secs(2));
                        let _ = set(0.0);
                        *faults
                            .entry("duplication and reordering 5% on a link for 2 s")
                            .or_default() += 1;
                    }
                }
                _ => {
                    t.signal(c, Daemon::Control, "KILL");
                    std::thread::sleep(Duration::from_millis(300));
                    t.start_daemon(c, Daemon::Control);
                    *faults
                        .entry("control process killed and restarted")
                        .or_default() += 1;
                }
            }
        }
        steady_rss.push((began.elapsed().as_secs(), memory_of(&t, &steady, false)));
        let ran = Ran {
            ip: ipf.join().expect("iperf3 thread"),
            http: http.join().expect("HTTP thread"),
            calls: rpc.join().expect("calls thread"),
            rmem: rm.join().expect("remote writes thread"),
        };
        (
            kv.join().expect("kv thread"),
            mc.join().expect("multicast thread"),
            faults,
            ran,
            steady_rss,
        )
    });

    // The traffic stops and everything on its way ends.
    wait_converged(&t);
    for c in &all {
        let r = t.ask_within(
            *c,
            &json!({"cmd": "load", "action": "stop"}),
            Duration::from_secs(5),
        );
        assert!(r.is_ok(), "load stop at {c}: {r:?}");
    }
    let start = Instant::now();
    loop {
        let open: u64 = all
            .iter()
            .map(|c| {
                t.ask_within(
                    *c,
                    &json!({"cmd": "load", "action": "report"}),
                    Duration::from_secs(5),
                )
                .map_or(1, |r| r["outstanding"].as_u64().unwrap_or(0))
            })
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
    let end = rss(&t);

    // The report.
    eprintln!("platform soak, {secs} s; faults: {faults:?}");
    eprintln!("reliable traffic (journals): {o:?}");
    eprintln!(
        "key-value register workload: {} operations {}, linearizable {}",
        kv["ops"], kv["counts"], kv["linearizable"]
    );
    let mut mc_ok = 0;
    let mut mc_err = Vec::new();
    for (root, r) in &mcasts {
        match r {
            Ok(v) if v["error"].is_null() => {
                let lost = v["lost"].as_array().map_or(0, Vec::len) as u64;
                assert_eq!(
                    v["completed"].as_u64().unwrap_or(0) + lost,
                    26,
                    "a multicast from {root} lost track of a member: {v}"
                );
                mc_ok += 1;
            }
            Ok(v) => mc_err.push(format!("{root}: {}", v["error"])),
            Err(e) => mc_err.push(format!("{root}: {e}")),
        }
    }
    eprintln!(
        "multicasts: {} of {} ended whole at every member alive, {} with an error: {mc_err:?}",
        mc_ok,
        mcasts.len(),
        mc_err.len()
    );
    eprintln!(
        "iperf3 {} -> {} over the IP service: {:.2} Gb/s received, error {}",
        steady[0],
        steady[1],
        gbps(&ran.ip, "sum_received"),
        ran.ip["error"]
    );
    eprintln!(
        "HTTP downloads of 100 MB {} -> {}: {:?}",
        steady[2], steady[3], ran.http
    );
    eprintln!(
        "applications' calls {} -> {}: {:?}",
        steady[5], steady[4], ran.calls
    );
    eprintln!(
        "remote writes {} -> {}: {:?}",
        steady[7], steady[6], ran.rmem
    );
    eprintln!(
        "steady torusd memory over the run, [resident, heap in use, heap held MiB, trim us], servers {}:",
        steady
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    for (at, m) in &steady_rss {
        eprintln!("  at {at} s: {m:?}");
    }
    let trimmed = memory_of(&t, &steady, true);
    eprintln!("  after the allocator gave back its free memory: {trimmed:?}");
    // The program's own memory once warmed up against the end: what it holds must not grow
    // with time (resident memory may, while the allocator keeps freed blocks). Not against
    // the start: traffic in flight and the stores' contents fill the heap in the first
    // seconds (19 -> 51 MiB in a 60 s run, where start and end were all it compared).
    let warm_heap = &steady_rss[1.min(steady_rss.len() - 1)].1;
    let end_heap = &steady_rss[steady_rss.len() - 1].1;
    let heap_grew: Vec<_> = warm_heap
        .iter()
        .zip(end_heap)
        .zip(&steady)
        .filter(|((w, e), _)| e[1] > w[1] * 3 / 2 + 16)
        .map(|((w, e), c)| (c.to_string(), w[1], e[1]))
        .collect();
    let mut grew = Vec::new();
    for (k, before) in &warm {
        if let Some(after) = end.get(k) {
            eprintln!(
                "rss {} {} (pid {}): {} -> {} MiB",
                k.0,
                k.1,
                k.2,
                before / 1024,
                after / 1024
            );
            // Allowance for caches that fill as traffic spreads (the store, the
            // directory): growth beyond it, in a minute, is a leak.
            if *after > before * 2 + 64 * 1024 {
                grew.push((k.0, k.1, *before, *after));
            }
        }
    }

    assert_eq!(kv["linearizable"], json!(true), "{kv}");
    assert!(kv["ops"].as_u64().unwrap_or(0) > 100, "{kv}");
    assert_eq!(o.duplicates, 0, "delivered twice: {o:?}");
    assert_eq!(o.bad, 0, "corrupt deliveries: {o:?}");
    assert_eq!(o.missing, 0, "acknowledged but missing: {o:?}");
    assert_eq!(
        o.mismatches, 0,
        "reports that do not match the sends: {o:?}"
    );
    assert_eq!(o.unresolved, 0, "never acknowledged nor failed: {o:?}");
    assert!(o.sent > 1000, "traffic flowed: {o:?}");
    assert!(!mcasts.is_empty(), "no multicast ran");
    assert!(grew.is_empty(), "memory grew: {grew:?}");
    assert!(heap_grew.is_empty(), "the heap in use grew: {heap_grew:?}");
    assert!(ran.ip["error"].is_null(), "iperf3 failed: {}", ran.ip);
    assert!(gbps(&ran.ip, "sum_received") > 0.01, "{}", ran.ip);
    let h = &ran.http;
    assert!(h.whole > 0 && h.differed == 0 && h.failed == 0, "{h:?}");
    let c = &ran.calls;
    assert_eq!(c.ran_twice, 0, "a request run twice: {c:?}");
    assert_eq!(c.wrong, 0, "a wrong answer: {c:?}");
    assert_eq!(
        c.answered_unrun, 0,
        "an answer the server never gave: {c:?}"
    );
    assert_eq!(
        c.made,
        c.answered + c.wrong + c.failed.values().sum::<u64>(),
        "{c:?}"
    );
    assert!(c.answered > 100, "{c:?}");
    let r = &ran.rmem;
    assert_eq!(
        r.differed, 0,
        "remote memory differed from its last write: {r:?}"
    );
    assert!(r.matched > 10, "{r:?}");
    assert!(faults.values().sum::<u64>() >= secs / 8, "{faults:?}");
}
