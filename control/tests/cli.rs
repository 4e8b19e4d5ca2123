//! `torusctl key` and `torusctl route` as a user runs them: the paper's example, randomized
//! checks against the independent brute-force model, and bad input.

#[path = "../../proto/tests/model/mod.rs"]
mod model;

use std::collections::HashSet;
use std::process::{Command, Output};

use serde_json::Value;
use torusnet_proto::rng::SplitMix64;

fn torusctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_torusctl"))
        .args(args)
        .output()
        .expect("run torusctl")
}

fn json(args: &[&str]) -> Value {
    let out = torusctl(args);
    assert!(
        out.status.success(),
        "torusctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn coord_json(c: model::C) -> Value {
    serde_json::json!([c.0, c.1, c.2])
}

#[test]
fn paper_example_5x5() {
    // Routing key 0x6667_6667_0000_0000: home (2,2) in 5x5, w = 0 so facet 0, order xyz.
    let v = json(&[
        "key",
        "--dims",
        "5x5x1",
        "--replicas",
        "5",
        "--hex",
        "0000000000000000000000006667666700000000",
    ]);
    assert_eq!(v["routing_key"], "6667666700000000");
    assert_eq!(v["home"], serde_json::json!([2, 2, 0]));
    assert_eq!(v["index"], 0);
    assert_eq!(
        v["servers"],
        serde_json::json!([[2, 2, 0], [3, 2, 0], [2, 3, 0], [4, 2, 0], [3, 3, 0]])
    );
    // With the home and its first candidate down, the root moves down the sequence.
    let v = json(&[
        "key",
        "--dims",
        "5x5x1",
        "--replicas",
        "2",
        "--down",
        "2,2,0",
        "--down",
        "3,2,0",
        "--hex",
        "0000000000000000000000006667666700000000",
    ]);
    assert_eq!(v["servers"], serde_json::json!([[2, 3, 0], [4, 2, 0]]));
}

#[test]
fn string_keys_are_sha1() {
    let v = json(&["key", "--dims", "4x4x4", "abc"]);
    assert_eq!(v["key"], "a9993e364706816aba3e25717850c26c9cd0d89d");
    assert_eq!(v["routing_key"], "7850c26c9cd0d89d");
    let home = model::home((4, 4, 4), 0x7850c26c9cd0d89d).0;
    assert_eq!(v["home"], coord_json(home));
    assert_eq!(v["servers"].as_array().map(Vec::len), Some(1));
}

#[test]
fn keys_match_brute_force_model() {
    let mut rng = SplitMix64::new(0x5eed);
    for case in 0..60 {
        let d = if case % 3 == 0 {
            (1 + rng.below(9) as u32, 1 + rng.below(9) as u32, 1)
        } else {
            (
                1 + rng.below(6) as u32,
                1 + rng.below(6) as u32,
                1 + rng.below(6) as u32,
            )
        };
        let servers = model::all(d);
        let ndown = rng.below(4) as usize;
        let down: HashSet<model::C> = (0..ndown)
            .map(|_| servers[rng.below(servers.len() as u64) as usize])
            .collect();
        let mut key = [0u8; 20];
        rng.fill(&mut key);
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        let r = 1 + rng.below(8) as usize;
        let dims = format!("{}x{}x{}", d.0, d.1, d.2);
        let rs = r.to_string();
        let mut args = vec!["key", "--dims", &dims, "--replicas", &rs, "--hex", &hex];
        let down_s: Vec<String> = down
            .iter()
            .map(|c| format!("{},{},{}", c.0, c.1, c.2))
            .collect();
        for s in &down_s {
            args.extend(["--down", s]);
        }
        let v = json(&args);
        let k = u64::from_be_bytes(key[12..].try_into().unwrap());
        let want: Vec<Value> = model::servers_for_key(d, k, r, &down)
            .into_iter()
            .map(coord_json)
            .collect();
        assert_eq!(v["servers"], Value::Array(want), "case {case}: {args:?}");
        let (home, index) = model::home(d, k);
        assert_eq!(v["home"], coord_json(home));
        assert_eq!(v["index"], index);
    }
}

#[test]
fn routes_match_brute_force_model() {
    let names = ["+x", "-x", "+y", "-y", "+z", "-z"];
    let mut rng = SplitMix64::new(0xbeef);
    for case in 0..80 {
        let d = (
            1 + rng.below(5) as u32,
            1 + rng.below(5) as u32,
            1 + rng.below(4) as u32,
        );
        let servers = model::all(d);
        let pick = |rng: &mut SplitMix64| servers[rng.below(servers.len() as u64) as usize];
        let from = pick(&mut rng);
        let to = pick(&mut rng);
        let down: HashSet<model::C> = (0..rng.below(3)).map(|_| pick(&mut rng)).collect();
        let dims_arr = [d.0, d.1, d.2];
        let links: HashSet<(model::C, usize)> = (0..rng.below(6))
            .map(|_| (pick(&mut rng), rng.below(6) as usize))
            .filter(|(_, dir)| dims_arr[dir / 2] > 1)
            .collect();
        let dims = format!("{}x{}x{}", d.0, d.1, d.2);
        let fs = format!("{},{},{}", from.0, from.1, from.2);
        let ts = format!("{},{},{}", to.0, to.1, to.2);
        let mut owned = Vec::new();
        for c in &down {
            owned.push("--down".to_string());
            owned.push(format!("{},{},{}", c.0, c.1, c.2));
        }
        for (c, dir) in &links {
            owned.push("--down-link".to_string());
            owned.push(format!("{},{},{}:{}", c.0, c.1, c.2, names[*dir]));
        }
        let mut args = vec!["route", "--dims", &dims, "--from", &fs, "--to", &ts];
        args.extend(owned.iter().map(String::as_str));
        let v = json(&args);
        let (dist, hops) = model::route(d, from, to, &down, &links);
        assert_eq!(
            v["distance"],
            serde_json::json!(dist),
            "case {case}: {args:?}"
        );
        let want: Vec<&str> = hops.iter().map(|h| names[*h]).collect();
        assert_eq!(
            v["next_hops"],
            serde_json::json!(want),
            "case {case}: {args:?}"
        );
        assert_eq!(v["from"], coord_json(from));
        assert_eq!(v["to"], coord_json(to));
    }
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let cases: &[&[&str]] = &[
        &["key", "--dims", "4x4x0", "abc"],
        &["key", "--dims", "4x4x4x4", "abc"],
        &["key", "--dims", "4x4x4", "--hex", "abcd"],
        &[
            "key",
            "--dims",
            "4x4x4",
            "--hex",
            "g000000000000000000000000000000000000000",
        ],
        &["key", "--dims", "4x4x4", "--down", "4,0,0", "abc"],
        &["key", "--dims", "4x4x4"],
        &[
            "route", "--dims", "4x4x4", "--from", "0,0,0", "--to", "4,0,0",
        ],
        &["route", "--dims", "4x4x4", "--from", "0,0", "--to", "a,b,c"],
        &[
            "route",
            "--dims",
            "4x4x4",
            "--from",
            "0,0,0",
            "--to",
            "1,1,1",
            "--down-link",
            "0,0,0:+q",
        ],
        &[
            "route",
            "--dims",
            "4x4x1",
            "--from",
            "0,0,0",
            "--to",
            "1,1,0",
            "--down-link",
            "0,0,0:+z",
        ],
        &["route", "--dims", "4x4x4", "--from", "0,0,0"],
        &["frobnicate"],
    ];
    for args in cases {
        let out = torusctl(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("torusctl: "), "{args:?}: {err}");
    }
}

#[test]
fn unreachable_and_self_routes() {
    let v = json(&[
        "route", "--dims", "3x3x3", "--from", "0,0,0", "--to", "1,1,1", "--down", "1,1,1",
    ]);
    assert_eq!(v["distance"], Value::Null);
    assert_eq!(v["next_hops"], serde_json::json!([]));
    let v = json(&[
        "route", "--dims", "3x3x3", "--from", "2,2,2", "--to", "2,2,2",
    ]);
    assert_eq!(v["distance"], 0);
    assert_eq!(v["next_hops"], serde_json::json!([]));
}
