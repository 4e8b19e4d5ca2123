//! Multicast and on-path aggregation over the six trees of a 3x3x3 torus of namespaces
//! (MTU 9000): 200 MB to all 26 others byte-exact (each member's checksum against the
//! root's), again with a server killed midway (the rest complete), three concurrent
//! multicasts sharing the links evenly, and the word-count job equal to a single-process
//! computation of it, also with a server killed midway (its records are lost: the oracle
//! counts the servers alive at the end).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_e2e::Torus;
use torusnet_proto::topology::{Coord, Dims};
use torusnet_services::aggregate::{digest, oracle, Combiner, WordCount};

fn ask(t: &Torus, at: &str, req: &Value, limit: Duration) -> Value {
    t.ask_within(at, req, limit)
        .unwrap_or_else(|e| panic!("{at}: {req}: {e}"))
}

fn multicast(t: &Torus, at: &str, bytes: u64, seed: u64) -> Value {
    ask(
        t,
        at,
        // Ten times what the slowest of these takes here (about 12 s): a transfer that
        // stalls fails the test in two minutes, with the members it left incomplete.
        &json!({"cmd": "multicast", "generate": bytes, "seed": seed, "timeout_ms": 120_000}),
        Duration::from_secs(140),
    )
}

fn aggregate(t: &Torus, at: &str, input: &WordCount) -> Value {
    ask(
        t,
        at,
        &json!({"cmd": "aggregate", "combiner": "sum", "words": input.words, "vocabulary": input.vocabulary, "seed": input.seed, "timeout_ms": 120_000}),
        Duration::from_secs(130),
    )
}

fn summary(v: &Value) -> String {
    format!(
        "completed {} of {} in {:.2} s, min {:.3} Gb/s per member, lost {}, error {}",
        v["completed"],
        v["members"],
        v["elapsed_s"].as_f64().unwrap_or(0.0),
        v["min_member_gbps"].as_f64().unwrap_or(0.0),
        v["lost"],
        v["error"]
    )
}

#[test]
fn multicast_and_aggregation_over_six_trees() {
    let t = Torus::up_with("ttr", "3x3x3", &["--mtu", "9000"]);
    t.start();
    t.wait_converged(Duration::from_secs(60));
    let dims = Dims::new(3, 3, 3).unwrap();
    let mut alive: HashSet<Coord> = dims.coords().collect();

    // The word count, against the oracle.
    let input = WordCount {
        words: 300_000,
        vocabulary: 20_000,
        seed: 5,
    };
    let v = aggregate(&t, "0,0,0", &input);
    eprintln!("aggregation: {v}");
    assert!(v.get("error").is_none(), "{v}");
    let want = oracle(dims, &input, &Combiner::Sum, &alive);
    assert_eq!(v["digest"], format!("{:016x}", digest(&want)));
    assert_eq!(v["servers"], 27);
    assert!(v["agg_link_bytes"].as_f64() < v["raw_link_bytes"].as_f64());

    // Three concurrent multicasts from three roots, each whole at all 26 others. That they
    // share the links evenly is proved in simulated time
    // (services::multicast::tests::concurrent_transfers_share_the_links); here, on two
    // cores shared by 54 daemons, their rates are printed, not judged (a wall-clock ratio
    // within 10% failed once in ten runs while the machine was building).
    let roots = ["0,0,0", "1,2,0", "2,1,2"];
    let results: Vec<Value> = std::thread::scope(|s| {
        let hs: Vec<_> = roots
            .iter()
            .enumerate()
            .map(|(k, r)| {
                let t = &t;
                s.spawn(move || multicast(t, r, 60_000_000, k as u64 + 10))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("multicast thread"))
            .collect()
    });
    let rates: Vec<f64> = results
        .iter()
        .map(|v| {
            eprintln!("concurrent: {}", summary(v));
            assert!(v.get("error").is_none(), "{v}");
            assert_eq!(v["completed"], 26);
            60e6 * 8.0 / v["elapsed_s"].as_f64().unwrap_or(f64::MAX) / 1e9
        })
        .collect();
    let (lo, hi) = rates
        .iter()
        .fold((f64::MAX, 0.0f64), |(a, b), r| (a.min(*r), b.max(*r)));
    eprintln!(
        "three concurrent multicasts, Gb/s each: {rates:.3?} (slowest/fastest {:.2})",
        lo / hi
    );

    // 200 MB to everyone, byte-exact.
    let v = multicast(&t, "0,0,0", 200_000_000, 1);
    eprintln!("200 MB: {}", summary(&v));
    assert!(v.get("error").is_none(), "{v}");
    assert_eq!(v["completed"], 26);
    assert_eq!(v["shared_edges"], 0);
    assert!(v["checksum_mismatch"].as_array().is_some_and(Vec::is_empty));

    // Again, with a server killed midway: the others complete.
    let dead = "2,2,2";
    let v = std::thread::scope(|s| {
        let h = s.spawn(|| multicast(&t, "0,0,0", 200_000_000, 2));
        std::thread::sleep(Duration::from_millis(1500));
        t.kill(dead);
        h.join().expect("multicast thread")
    });
    alive.remove(&Coord::new(2, 2, 2));
    eprintln!("200 MB, {dead} killed midway: {}", summary(&v));
    assert!(v.get("error").is_none(), "{v}");
    assert_eq!(v["completed"], 25, "{v}");
    assert_eq!(v["lost"], json!([dead]), "{v}");

    // The word count with a server killed midway: its records are lost, nothing else.
    // A large vocabulary, so the job runs for seconds.
    let input = WordCount {
        words: 1_000_000,
        vocabulary: 100_000,
        seed: 9,
    };
    let dead2 = "2,0,1";
    let t0 = Instant::now();
    let v = std::thread::scope(|s| {
        let h = s.spawn(|| aggregate(&t, "1,1,1", &input));
        std::thread::sleep(Duration::from_millis(700));
        t.kill(dead2);
        h.join().expect("aggregate thread")
    });
    eprintln!(
        "aggregation, {dead2} killed midway, {:?}: {v}",
        t0.elapsed()
    );
    assert!(v.get("error").is_none(), "{v}");
    alive.remove(&Coord::new(2, 0, 1));
    let restarted = v["restarts"].as_u64().unwrap_or(0) >= 1;
    assert!(restarted, "the kill came mid-job: {v}");
    let want = oracle(dims, &input, &Combiner::Sum, &alive);
    assert_eq!(v["servers"], 25);
    assert_eq!(v["digest"], format!("{:016x}", digest(&want)), "{v}");
}
