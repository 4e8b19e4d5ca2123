//! The aggregation protocol over the deterministic message-level network, against the
//! single-process oracle.

use std::collections::HashSet;
use std::sync::mpsc::channel;
use std::time::Duration;

use serde_json::Value;
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims};

use super::wire::{Msg, Records, Tally};
use super::{digest, oracle, AggRequest, Aggregate, Combiner, WordCount};
use crate::testnet::Net;

const INPUT: WordCount = WordCount {
    words: 5000,
    vocabulary: 2000,
    seed: 11,
};

fn run_job(
    net: &mut Net<Aggregate>,
    root: Coord,
    combiner: Combiner,
    kill: Option<(u64, Coord)>,
) -> Value {
    let (tx, rx) = channel();
    net.request(
        root,
        Box::new(AggRequest {
            combiner,
            input: INPUT,
            timeout: Duration::from_secs(5),
            reply: tx,
        }),
    );
    if let Some((at, c)) = kill {
        net.run(Time::from_nanos(at));
        assert!(rx.try_recv().is_err(), "still running when the server dies");
        net.kill(c);
    }
    net.run(Time::from_nanos(20_000_000_000));
    rx.try_recv().expect("a result")
}

#[test]
fn word_count_equals_the_oracle_and_saves_traffic() {
    let dims = Dims::new(3, 3, 3).unwrap();
    for combiner in [Combiner::Sum, Combiner::Max, Combiner::Count] {
        let mut net = Net::new(dims, |_| Aggregate::default());
        let v = run_job(&mut net, Coord::new(1, 1, 1), combiner.clone(), None);
        assert!(v.get("error").is_none(), "{v}");
        let all: HashSet<Coord> = dims.coords().collect();
        let want = oracle(dims, &INPUT, &combiner, &all);
        assert_eq!(
            v["digest"],
            format!("{:016x}", digest(&want)),
            "{combiner:?}: {v}"
        );
        assert_eq!(v["keys"], want.len());
        assert_eq!(v["servers"], 27);
        let (agg, raw) = (
            v["agg_link_bytes"].as_f64().unwrap(),
            v["raw_link_bytes"].as_f64().unwrap(),
        );
        assert!(
            agg < raw * 0.6,
            "aggregation on path saves traffic: {agg} vs {raw}"
        );
    }
}

#[test]
fn a_user_combiner() {
    let dims = Dims::new(3, 3, 1).unwrap();
    fn bor(a: u64, b: u64) -> u64 {
        a | b << 1
    }
    let mut net = Net::new(dims, |_| {
        Aggregate::default().with_combiner("shift-or", bor)
    });
    let v = run_job(
        &mut net,
        Coord::new(0, 0, 0),
        Combiner::Named("shift-or".into()),
        None,
    );
    assert!(v.get("error").is_none(), "{v}");
    let mut net2 = Net::new(dims, |_| Aggregate::default());
    let refused = run_job(
        &mut net2,
        Coord::new(0, 0, 0),
        Combiner::Named("nope".into()),
        None,
    );
    assert!(refused["error"].as_str().unwrap().contains("no combiner"));
}

#[test]
fn a_server_killed_midway_loses_its_records_only() {
    let dims = Dims::new(4, 4, 2).unwrap();
    let mut net = Net::new(dims, |_| Aggregate::default());
    net.budget = 1;
    let dead = Coord::new(1, 0, 0);
    let v = run_job(
        &mut net,
        Coord::new(0, 0, 0),
        Combiner::Sum,
        Some((30_000, dead)),
    );
    assert!(v.get("error").is_none(), "{v}");
    let alive: HashSet<Coord> = dims.coords().filter(|c| *c != dead).collect();
    let want = oracle(dims, &INPUT, &Combiner::Sum, &alive);
    assert_eq!(v["digest"], format!("{:016x}", digest(&want)), "{v}");
    assert_eq!(v["servers"], 31);
    assert!(v["restarts"].as_u64().unwrap() >= 1);
}

#[test]
fn messages_round_trip_and_garbage_is_refused() {
    let mut records = Records::new();
    records.insert("w1".into(), 5);
    records.insert("ünïcode".into(), 7);
    let all = [
        Msg::Start {
            id: 1,
            epoch: 2,
            root: Coord::new(1, 2, 3),
            combiner: "sum".into(),
            input: INPUT,
        },
        Msg::Partial {
            id: 1,
            epoch: 2,
            tree: 3,
            tally: Tally {
                servers: 4,
                agg_byte_hops: 5,
                raw_byte_hops: 6,
            },
            records,
        },
    ];
    for m in &all {
        assert_eq!(Msg::decode(&m.encode()).as_ref(), Some(m));
    }
    let mut rng = torusnet_proto::rng::SplitMix64::new(2);
    for _ in 0..20_000 {
        let n = rng.below(80) as usize;
        let mut b: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
        if let Some(f) = b.first_mut() {
            *f = 1 + (*f & 1);
        }
        let _ = Msg::decode(&b);
    }
    // A record count far beyond the bytes is refused before any allocation.
    let mut lie = vec![2u8];
    lie.extend_from_slice(&[0u8; 8 + 4 + 1 + 24]);
    lie.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Msg::decode(&lie).is_none());
}

/// A root that for a moment can reach nobody (its own daemon starved, say: every other
/// server looks unreachable from it) does not report a job over itself alone; once the others
/// are back it finishes over all of them.
#[test]
fn a_root_cut_off_for_a_moment_waits_for_the_others() {
    let dims = Dims::new(3, 3, 1).unwrap();
    let mut net = Net::new(dims, |_| Aggregate::default());
    let root = Coord::new(0, 0, 0);
    let (tx, rx) = channel();
    net.request(
        root,
        Box::new(AggRequest {
            combiner: Combiner::Sum,
            input: INPUT,
            timeout: Duration::from_secs(5),
            reply: tx,
        }),
    );
    net.run(Time::from_nanos(20_000));
    let others: Vec<Coord> = dims.coords().filter(|c| *c != root).collect();
    for c in &others {
        net.freeze(*c);
    }
    // Well past the time the view must hold before a result is final.
    net.run(Time::from_nanos(1_000_000_000));
    assert!(rx.try_recv().is_err(), "no result over the root alone");
    for c in &others {
        net.thaw(*c);
    }
    net.run(Time::from_nanos(20_000_000_000));
    let v = rx.try_recv().expect("a result");
    assert!(v.get("error").is_none(), "{v}");
    assert_eq!(v["servers"], 9, "{v}");
    let all: HashSet<Coord> = dims.coords().collect();
    let want = oracle(dims, &INPUT, &Combiner::Sum, &all);
    assert_eq!(v["digest"], format!("{:016x}", digest(&want)), "{v}");
}

#[test]
fn a_message_the_transport_refuses_for_good_is_counted() {
    // A control message queued for a server that is then unreachable: refused by the
    // transport for a reason other than a full queue, and counted.
    let dims = Dims::new(3, 3, 1).unwrap();
    let mut net = Net::new(dims, |_| Aggregate::default());
    let gone = Coord::new(2, 2, 0);
    net.kill(gone);
    net.svc[0].ctl.push_back((gone, vec![0u8; 16]));
    net.run(Time::from_nanos(1_000_000));
    assert!(net.svc[0].ctl.is_empty());
    assert_eq!(net.svc[0].stats.send_failed, 1);
}
