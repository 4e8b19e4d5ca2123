//! The control process end to end (issue 5), on a 3x3x3 torus of namespaces made by
//! scripts/netns-torus.sh with 27 `torusctl daemon`s and 27 `torusd`s: coordinates from the
//! wiring plan alone, a miswired cable reported precisely, and a link cut plus a server kill
//! detected in every view, measured, with traffic flowing around them. Needs root.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_dataplane::cluster::request;
use torusnet_e2e::{ip, Torus};

fn all() -> Vec<String> {
    let mut v = Vec::new();
    for z in 0..3 {
        for y in 0..3 {
            for x in 0..3 {
                v.push(format!("{x},{y},{z}"));
            }
        }
    }
    v
}

/// Waits until `ok` holds for every server's control status (skipping `except`).
fn wait_all(
    t: &Torus,
    except: &[&str],
    limit: Duration,
    ok: impl Fn(&str, &Value) -> bool,
) -> Duration {
    let start = Instant::now();
    while start.elapsed() < limit {
        let done = all()
            .iter()
            .filter(|c| !except.contains(&c.as_str()))
            .all(|c| t.control(c).is_some_and(|v| ok(c, &v)));
        if done {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("not converged within {limit:?}");
}

#[test]
fn coordinates_from_the_wiring_plan_and_a_miswired_cable() {
    let t = Torus::up("tcw", "3x3x3");
    // Swap two cables at 1,0,0: the one from 0,0,0's +x goes into its +y port (instead of
    // -x), and the one from 1,1,0's -y into its -x port (instead of +y).
    ip(&["-n", &t.ns("0,0,0"), "link", "del", "px"]);
    ip(&["-n", &t.ns("1,1,0"), "link", "del", "my"]);
    ip(&[
        "-n",
        &t.ns("0,0,0"),
        "link",
        "add",
        "px",
        "type",
        "veth",
        "peer",
        "name",
        "py",
        "netns",
        &t.ns("1,0,0"),
    ]);
    ip(&[
        "-n",
        &t.ns("1,1,0"),
        "link",
        "add",
        "my",
        "type",
        "veth",
        "peer",
        "name",
        "mx",
        "netns",
        &t.ns("1,0,0"),
    ]);
    for (c, i) in [
        ("0,0,0", "px"),
        ("1,0,0", "py"),
        ("1,1,0", "my"),
        ("1,0,0", "mx"),
    ] {
        ip(&["-n", &t.ns(c), "link", "set", i, "up"]);
    }
    t.start();
    let took = wait_all(&t, &[], Duration::from_secs(30), |c, v| {
        v["coord"].as_str() == Some(c)
    });
    eprintln!("27 coordinates assigned from the wiring plan in {took:?}");
    for c in all() {
        let v = t.control(&c).unwrap();
        assert_eq!(v["coord"].as_str(), Some(c.as_str()));
        let persisted =
            std::fs::read_to_string(format!("/run/torusnet/tcw/{}.coord", c.replace(',', "-")))
                .unwrap();
        assert_eq!(persisted.trim(), c, "persisted");
    }
    // The coordinates can be settled through other cables before a hello has crossed the
    // miswired one (its state is "down" until then, no hello heard): wait for one.
    let start = Instant::now();
    let (v, px) = loop {
        let v = t.control("0,0,0").unwrap();
        let px = v["links"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["ifname"] == "px")
            .unwrap()
            .clone();
        if px["state"] != "down" || start.elapsed() > Duration::from_secs(10) {
            break (v, px);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(px["state"], "miswired", "{px}");
    let why = px["miswired"].as_str().unwrap();
    assert!(
        why.contains("expected the neighbour to call this link -x, it calls it +y"),
        "{why}"
    );
    let problems = v["problems"].to_string();
    assert!(problems.contains("MISWIRED interface px (+x): expected the neighbour to call this link -x, it calls it +y"), "{problems}");
    // 1,0,0 tells the same from its side once a hello from 0,0,0 has crossed.
    let want =
        "MISWIRED interface py (+y): expected the neighbour to call this link -y, it calls it +x";
    let start = Instant::now();
    let problems = loop {
        let problems = t.control("1,0,0").unwrap()["problems"].to_string();
        if problems.contains(want) || start.elapsed() > Duration::from_secs(10) {
            break problems;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(problems.contains(want), "{problems}");
}

#[test]
fn link_cut_and_server_kill_converge_and_traffic_goes_around() {
    let t = Torus::up("tcf", "3x3x3");
    t.start();
    wait_all(&t, &[], Duration::from_secs(30), |_, v| {
        v["reachable"].as_u64() == Some(27) && v["published_version"] == v["view_version"]
    });
    // Traffic from 0,0,0 to 2,2,2 (3 hops, six shortest paths) while things break.
    let sock = t.sock("0,0,0", false);
    let bench = std::thread::spawn(move || {
        let req = json!({"cmd": "bench", "to": "2,2,2", "bytes": 60_000_000u64, "size": 4000, "fence_every": 20});
        request(&sock, &req, Duration::from_secs(300)).expect("bench")
    });
    std::thread::sleep(Duration::from_millis(300));

    // Cut a link next to the sender: 0,0,0's +z.
    ip(&["-n", &t.ns("0,0,0"), "link", "set", "pz", "down"]);
    let t_link = wait_all(&t, &[], Duration::from_secs(10), |_, v| link_down(v));
    // Kill a server on the way: 1,1,1 (both daemons).
    t.kill("1,1,1");
    let t_server = wait_all(&t, &["1,1,1"], Duration::from_secs(10), |_, v| {
        v["unreachable"]
            .as_array()
            .is_some_and(|u| u.iter().any(|x| x == "1,1,1"))
    });
    eprintln!("3x3x3 namespaces: link cut seen by all 27 in {t_link:?}, server kill by the other 26 in {t_server:?}");
    let r = bench.join().unwrap();
    eprintln!("bench across the failures: {r}");
    let rx = &r["receiver"];
    assert_eq!(rx["delivered"], r["messages"], "{r}");
    assert_eq!(rx["duplicated"], 0);
    assert_eq!(rx["corrupted"], 0);
    assert_eq!(rx["fence_violations"], 0);
    assert_eq!(rx["checksum"], r["sender_checksum"]);
    // How fast is a measurement (printed above, recorded in docs/control.md), not a
    // condition: K = 3 hellos of 100 ms, one more tick, flooding and this test's polling
    // of 27 sockets take ~0.7 s here, and a bound on it breaks when 54 daemons share two
    // loaded cores. What the test checks is that every view converges within the
    // deadlines above and that the transfer is intact.
    let dp = t.ask("2,2,2", false, &json!({"cmd": "status"})).unwrap();
    assert!(
        dp["engine"]["unreachable"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == &json!([1, 1, 1])),
        "the dataplane follows the view"
    );
}

/// Whether this status's view has 0,0,0's +z link down (named from either end).
fn link_down(v: &Value) -> bool {
    v["down_links"]
        .as_array()
        .is_some_and(|d| d.iter().any(|x| x == "0,0,0:+z" || x == "0,0,2:-z"))
}

#[test]
fn control_process_restart_does_not_disturb_traffic() {
    let t = Torus::up("tcr", "3x3x1");
    t.start();
    let nine: Vec<String> = all().into_iter().filter(|c| c.ends_with(",0")).collect();
    let ready = |t: &Torus| {
        nine.iter().all(|c| {
            t.control(c).is_some_and(|v| {
                v["reachable"].as_u64() == Some(9) && v["published_version"] == v["view_version"]
            })
        })
    };
    let start = Instant::now();
    while !ready(&t) {
        assert!(start.elapsed() < Duration::from_secs(30), "no convergence");
        std::thread::sleep(Duration::from_millis(20));
    }
    let lat: Vec<u64> = nine
        .iter()
        .filter_map(|c| t.control(c).and_then(|v| v["publish_latency_us"].as_u64()))
        .collect();
    eprintln!("view publish latency (control -> torusd adopted by its pollers), us: {lat:?}");
    let dp_before = t.ask("1,1,0", false, &json!({"cmd": "status"})).unwrap();
    let sock = t.sock("0,0,0", false);
    let bench = std::thread::spawn(move || {
        let req = json!({"cmd": "bench", "to": "2,2,0", "bytes": 40_000_000u64, "size": 4000, "fence_every": 20});
        request(&sock, &req, Duration::from_secs(300)).expect("bench")
    });
    std::thread::sleep(Duration::from_millis(200));
    // Kill only the control process of 1,1,0 and start it again at once.
    let ns = t.ns("1,1,0");
    let out = Command::new("ip")
        .args(["netns", "pids", &ns])
        .output()
        .unwrap();
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline.contains("daemon") {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
    }
    let bin = torusnet_e2e::root().join("target/release/torusctl");
    let log = std::fs::File::create("/run/torusnet/tcr/1-1-0-control2.log").unwrap();
    // Killed on drop, so a failing assertion below does not leave it running.
    let _child = KillOnDrop(
        Command::new("ip")
            .args(["netns", "exec", &ns])
            .arg(bin)
            .args(["daemon", "--config", "/run/torusnet/tcr/1-1-0.toml"])
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let r = bench.join().unwrap();
    let rx = &r["receiver"];
    assert_eq!(rx["delivered"], r["messages"], "{r}");
    assert_eq!(rx["duplicated"], 0);
    assert_eq!(rx["fence_violations"], 0);
    assert_eq!(rx["checksum"], r["sender_checksum"]);
    // The restarted process answers once it is up (it may still be starting).
    let t0 = Instant::now();
    let v = loop {
        if let Some(v) = t.control("1,1,0").filter(|v| v.get("coord").is_some()) {
            break v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "restarted control process: {}",
            std::fs::read_to_string("/run/torusnet/tcr/1-1-0-control2.log").unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        v["coord"], "1,1,0",
        "the restarted process kept its coordinate"
    );
    let dp_after = t.ask("1,1,0", false, &json!({"cmd": "status"})).unwrap();
    assert_eq!(
        dp_after["engine"]["unreachable"],
        json!([]),
        "torusd kept a full view"
    );
    assert!(
        dp_after["uptime_s"].as_f64() > dp_before["uptime_s"].as_f64(),
        "torusd was not restarted"
    );
    eprintln!("bench while 1,1,0's control process restarted: {r}");
}

/// A child process that is killed and reaped when the test ends, also by a panic.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
