//! The multicast protocol over the deterministic message-level network.

use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims};

use super::{generate, Multicast, MulticastRequest};
use crate::testnet::Net;

fn start(
    net: &mut Net<Multicast>,
    root: Coord,
    data: &Arc<Vec<u8>>,
    group: Option<Vec<Coord>>,
) -> std::sync::mpsc::Receiver<Value> {
    let (tx, rx) = channel();
    net.request(
        root,
        Box::new(MulticastRequest {
            group,
            service: 0,
            data: data.clone(),
            chunk: 4096,
            timeout: Duration::from_secs(5),
            reply: tx,
        }),
    );
    rx
}

#[test]
fn every_member_gets_every_byte_over_six_trees() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let mut net = Net::new(dims, |_| Multicast::default());
    let data = Arc::new(generate(1_000_003, 7));
    let rx = start(&mut net, Coord::new(1, 1, 1), &data, None);
    net.run(Time::from_nanos(10_000_000_000));
    let v = rx.try_recv().expect("a result");
    assert!(v.get("error").is_none(), "{v}");
    assert_eq!(v["completed"], 26);
    assert_eq!(v["trees"], 6);
    assert_eq!(v["shared_edges"], 0);
    // Each chunk crossed one link per server that got it: no stretch.
    let chunks_in: u64 = net.svc.iter().map(|s| s.stats.chunks_in).sum();
    let chunks = 1_000_003u64.div_ceil(4096);
    assert_eq!(chunks_in, chunks * 26);
    assert_eq!(net.svc.iter().map(|s| s.stats.detour_hops).sum::<u64>(), 0);
    assert_eq!(net.svc.iter().map(|s| s.stats.duplicates).sum::<u64>(), 0);
    // The root sent on all six of its links, each about a sixth of the chunks.
    assert!(
        net.svc.iter().all(|s| s.xfers.is_empty()),
        "every server forgot the transfer"
    );
}

#[test]
fn a_group_and_a_server_killed_midway() {
    let dims = Dims::new(4, 4, 2).unwrap();
    let mut net = Net::new(dims, |_| Multicast::default());
    // Narrow pipes, so the transfer is in full flow when the server dies.
    net.budget = 2;
    let data = Arc::new(generate(600_000, 3));
    let root = Coord::new(0, 0, 0);
    let group: Vec<Coord> = dims.coords().filter(|c| c.x % 2 == 1 || c.y == 3).collect();
    let rx = start(&mut net, root, &data, Some(group.clone()));
    net.run(Time::from_nanos(200_000));
    assert!(rx.try_recv().is_err(), "still running when the server dies");
    // A member in the middle of the trees dies.
    let dead = Coord::new(1, 0, 0);
    net.kill(dead);
    net.run(Time::from_nanos(10_000_000_000));
    let v = rx.try_recv().expect("a result");
    assert!(v.get("error").is_none(), "{v}");
    let lost: Vec<String> = serde_json::from_value(v["lost"].clone()).unwrap();
    let expect_done = group.iter().filter(|c| **c != dead && **c != root).count();
    assert_eq!(v["completed"].as_u64(), Some(expect_done as u64), "{v}");
    assert_eq!(lost.len(), usize::from(group.contains(&dead)));
    assert!(net.svc.iter().map(|s| s.stats.rebuilds).sum::<u64>() > 0);
}

#[test]
fn lost_starts_and_dones_cost_a_second_not_the_transfer() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let mut net = Net::new(dims, |_| Multicast::default());
    // The first `Start` to three members and the first `Done` from three others are reported
    // failed by the transport, as when a starved peer goes silent for a while.
    let no_start = [
        Coord::new(2, 2, 2),
        Coord::new(1, 0, 0),
        Coord::new(0, 2, 1),
    ];
    let no_done = [
        Coord::new(1, 1, 0),
        Coord::new(2, 0, 2),
        Coord::new(0, 1, 1),
    ];
    let mut lost = std::collections::HashSet::new();
    net.lose = Some(Box::new(move |src, dst, b: &[u8]| {
        let hit = match b.first() {
            Some(1) => no_start.contains(&dst),
            Some(4) => no_done.contains(&src),
            _ => false,
        };
        hit && lost.insert((src, dst, b[0]))
    }));
    let root = Coord::new(0, 0, 0);
    let data = Arc::new(generate(200_000, 4));
    let rx = start(&mut net, root, &data, None);
    net.run(Time::from_nanos(10_000_000_000));
    let v = rx.try_recv().expect("a result");
    assert!(v.get("error").is_none(), "{v}");
    assert_eq!(v["completed"], 26, "{v}");
    assert!(v["checksum_mismatch"].as_array().is_some_and(Vec::is_empty));
    let root_stats = &net.svc[dims.index(root)].stats;
    assert!(root_stats.repolled >= 6, "{root_stats:?}");
    let redone: u64 = net.svc.iter().map(|s| s.stats.redone).sum();
    assert_eq!(redone, 3);
    // Each member counts its completion once, however often it reported it.
    assert_eq!(net.svc.iter().map(|s| s.stats.completed).sum::<u64>(), 26);
    // A chunk of the ended transfer arriving late does not bring it back.
    let t = super::wire::Transfer {
        id: u64::from_str_radix(v["id"].as_str().unwrap(), 16).unwrap(),
        root,
        size: 200_000,
        chunk: 4096,
        service: 0,
    };
    let late = super::wire::Msg::Data {
        t,
        index: 0,
        data: &data[..4096],
    };
    let (a, b) = (Coord::new(1, 0, 0), Coord::new(2, 0, 0));
    net.inject(a, b, super::MCAST, late.encode());
    let now = net.now;
    net.run(now + std::time::Duration::from_millis(10));
    let s = &net.svc[dims.index(b)];
    assert!(s.xfers.is_empty());
    assert_eq!(s.stats.late, 1);
}

#[test]
fn a_server_unreachable_at_the_start_joins_and_relays() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let mut net = Net::new(dims, |_| Multicast::default());
    net.budget = 2;
    let root = Coord::new(0, 0, 0);
    // A neighbour of the root is frozen when the transfer starts: the root leaves it out
    // of the trees and of the `Start`s, and its parents' first sends to it are refused.
    let p = Coord::new(1, 0, 0);
    net.freeze(p);
    let data = Arc::new(generate(600_000, 8));
    let rx = start(&mut net, root, &data, None);
    net.run(Time::from_nanos(100_000));
    net.thaw(p);
    assert!(rx.try_recv().is_err(), "still running when it is back");
    net.run(Time::from_nanos(10_000_000_000));
    let v = rx.try_recv().expect("a result");
    assert!(v.get("error").is_none(), "{v}");
    // Back in the trees, it repaired its subtrees and completed itself.
    assert_eq!(v["completed"], 26, "{v}");
    assert_eq!(v["lost"], serde_json::json!([]), "{v}");
    assert!(net.svc[dims.index(p)].stats.chunks_out > 0, "it relays");
}

#[test]
fn a_parent_that_never_heard_of_the_transfer_joins_from_a_childs_have() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let mut net = Net::new(dims, |_| Multicast::default());
    let root = Coord::new(0, 0, 0);
    let t = super::wire::Transfer {
        id: 77,
        root,
        size: 64 * 4096,
        chunk: 4096,
        service: 0,
    };
    let view = torusnet_proto::routing::LinkView::all_up(dims).unwrap();
    let trees = torusnet_proto::trees::Trees::build(&view, root);
    // A server two levels down tree 0, its parent and grandparent there.
    let (child, parent) = dims
        .coords()
        .find_map(|c| {
            let p = trees.parent(0, c)?;
            (p != root && trees.parent(0, p) != Some(root)).then_some((c, p))
        })
        .expect("a tree deep enough");
    let grand = trees.parent(0, parent).expect("a grandparent");
    let have = super::wire::Msg::Have {
        t,
        tree: 0,
        bits: &[0u8; 2],
    };
    net.inject(child, parent, super::MCAST, have.encode());
    let now = net.now;
    net.run(now + crate::testnet::HOP * 20);
    let x = net.svc[dims.index(parent)].xfers.get(&77).expect("joined");
    assert!(x.adopted.contains(&(0, child)));
    // It asked its own parent at once, which joined the same way.
    let g = net.svc[dims.index(grand)].xfers.get(&77).expect("asked");
    assert!(g.adopted.contains(&(0, parent)));
}

#[test]
fn concurrent_transfers_share_the_links() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let mut net = Net::new(dims, |_| Multicast::default());
    let rxs: Vec<_> = [
        Coord::new(0, 0, 0),
        Coord::new(1, 2, 0),
        Coord::new(2, 1, 2),
    ]
    .iter()
    .enumerate()
    .map(|(k, r)| {
        let data = Arc::new(generate(300_000, k as u64));
        start(&mut net, *r, &data, None)
    })
    .collect();
    net.run(Time::from_nanos(10_000_000_000));
    let secs: Vec<f64> = rxs
        .iter()
        .map(|rx| {
            let v = rx.try_recv().expect("a result");
            assert!(v.get("error").is_none(), "{v}");
            v["elapsed_s"].as_f64().unwrap()
        })
        .collect();
    let (lo, hi) = secs
        .iter()
        .fold((f64::MAX, 0.0f64), |(a, b), s| (a.min(*s), b.max(*s)));
    assert!(hi / lo < 1.2, "the three finish together: {secs:?}");
}

#[test]
fn hostile_messages_change_nothing() {
    let dims = Dims::new(3, 3, 1).unwrap();
    let mut net = Net::new(dims, |_| Multicast::default());
    let mut rng = torusnet_proto::rng::SplitMix64::new(5);
    let me = Coord::new(1, 1, 0);
    for _ in 0..5000 {
        let n = rng.below(200) as usize;
        let mut b: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
        if let Some(f) = b.first_mut() {
            *f = 1 + (*f % 5);
        }
        let ev = torusnet_proto::node::Event::Message {
            src: Coord::new(0, 0, 0),
            service: super::MCAST,
            data: b,
            reliable: true,
            key: None,
        };
        let i = dims.index(me);
        let s = &mut net.svc[i];
        // A message-level engine without a network: nothing it sends matters here.
        struct Quiet(Dims, Coord);
        impl torusnet_proto::service::Engine for Quiet {
            fn local(&self) -> Coord {
                self.1
            }
            fn dims(&self) -> Dims {
                self.0
            }
            fn incarnation(&self) -> u64 {
                1
            }
            fn is_reachable(&self, _c: Coord) -> bool {
                true
            }
            fn distance(&self, _c: Coord) -> Option<u32> {
                Some(1)
            }
            fn send(
                &mut self,
                _: Time,
                _: torusnet_proto::node::Target,
                _: u16,
                _: &[u8],
                _: torusnet_proto::node::MsgOptions,
            ) -> Result<(), torusnet_proto::transport::SendError> {
                Ok(())
            }
            fn notify_acks(&mut self, _: u16, _: bool) {}
        }
        torusnet_proto::service::Service::on_event(s, Time::ZERO, &ev, &mut Quiet(dims, me));
    }
    let s = &net.svc[dims.index(me)];
    assert!(s.stats.malformed > 0);
    assert!(s.xfers.values().all(|x| x.t.size <= super::MAX_SIZE));
}

#[test]
fn a_message_the_transport_refuses_for_good_is_counted() {
    // A control message queued for a server that is then unreachable: refused by the
    // transport for a reason other than a full queue, and counted.
    let dims = Dims::new(3, 3, 1).unwrap();
    let mut net = Net::new(dims, |_| Multicast::default());
    let gone = Coord::new(2, 2, 0);
    net.kill(gone);
    net.svc[0].ctl.push_back((gone, vec![0u8; 16]));
    net.run(Time::from_nanos(1_000_000));
    assert!(net.svc[0].ctl.is_empty());
    assert_eq!(net.svc[0].stats.send_failed, 1);
}

/// What each server's sink was given, and whether (and how) it ended.
type Got = Arc<std::sync::Mutex<std::collections::HashMap<Coord, (Vec<u8>, Option<bool>)>>>;

/// Sinks that keep what they are given (per server), refuse every third offer (no room:
/// offered again later), and, on `refuse_at`, refuse to open at all.
#[derive(Debug)]
struct Keep {
    at: Coord,
    got: Got,
    refuse: bool,
    /// Its application leaves after this many offers.
    leaves_after: Option<u64>,
}

#[derive(Debug)]
struct KeepSink {
    at: Coord,
    got: Got,
    offers: u64,
    leaves_after: Option<u64>,
    flush_polls: u32,
}

impl super::Sinks for Keep {
    fn open(&mut self, t: &super::wire::Transfer) -> Result<Box<dyn super::Sink>, String> {
        if self.refuse {
            return Err(format!("no application hosts service {} here", t.service));
        }
        Ok(Box::new(KeepSink {
            at: self.at,
            got: self.got.clone(),
            offers: 0,
            leaves_after: self.leaves_after,
            flush_polls: 0,
        }))
    }
}

impl super::Sink for KeepSink {
    fn deliver(
        &mut self,
        _t: &super::wire::Transfer,
        offset: u64,
        data: &[u8],
    ) -> Result<bool, String> {
        self.offers += 1;
        if self.leaves_after.is_some_and(|n| self.offers > n) {
            return Err("its application left".into());
        }
        if self.offers.is_multiple_of(3) {
            return Ok(false);
        }
        let mut g = self.got.lock().unwrap();
        let e = g.entry(self.at).or_default();
        assert_eq!(e.0.len() as u64, offset, "in order, each byte once");
        e.0.extend_from_slice(data);
        Ok(true)
    }
    fn flushed(&mut self, _t: &super::wire::Transfer) -> Result<bool, String> {
        // The receiver takes a few polls to read the last bytes.
        self.flush_polls += 1;
        Ok(self.flush_polls > 3)
    }
    fn end(&mut self, _t: &super::wire::Transfer, complete: bool) {
        let mut g = self.got.lock().unwrap();
        let e = g.entry(self.at).or_default();
        assert!(e.1.is_none(), "ends once");
        e.1 = Some(complete);
    }
}

#[test]
fn members_deliver_in_order_into_their_sinks_with_memory_bounded_by_the_window() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let got = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let refuser = Coord::new(2, 1, 0);
    let leaver = Coord::new(1, 2, 2);
    let window = 16 * 4096;
    let mut net = Net::new(dims, |c| {
        let sinks = Keep {
            at: c,
            got: got.clone(),
            refuse: c == refuser,
            leaves_after: (c == leaver).then_some(100),
        };
        Multicast::new(window, Some(Box::new(sinks)))
    });
    let data = Arc::new(generate(2_000_000, 11));
    let root = Coord::new(0, 0, 0);
    let (tx, rx) = channel();
    net.request(
        root,
        Box::new(MulticastRequest {
            group: None,
            service: 1025,
            data: data.clone(),
            chunk: 4096,
            timeout: Duration::from_secs(20),
            reply: tx,
        }),
    );
    net.run(Time::from_nanos(30_000_000_000));
    let v = rx.try_recv().expect("a result");
    assert!(v.get("error").is_none(), "{v}");
    assert_eq!(v["completed"], 24, "{v}");
    let mut refused: Vec<String> = serde_json::from_value(v["refused"].clone()).unwrap();
    refused.sort();
    assert_eq!(
        refused,
        vec![leaver.to_string(), refuser.to_string()],
        "{v}"
    );
    let per = v["per_member"].as_array().unwrap();
    let r = per
        .iter()
        .find(|p| p["member"] == refuser.to_string())
        .unwrap();
    assert_eq!(r["outcome"], "refused");
    assert!(
        r["reason"].as_str().unwrap().contains("service 1025"),
        "{r}"
    );
    let l = per
        .iter()
        .find(|p| p["member"] == leaver.to_string())
        .unwrap();
    assert!(l["reason"].as_str().unwrap().contains("left"), "{l}");
    let got = got.lock().unwrap();
    // The one that left took the bytes it was offered before, in order, and never ended.
    let (part, end) = got.get(&leaver).expect("some bytes");
    assert!(part.len() < data.len() && data.starts_with(part));
    assert_eq!(*end, None);
    for c in dims
        .coords()
        .filter(|c| *c != root && *c != refuser && *c != leaver)
    {
        let (bytes, end) = got.get(&c).expect("delivered");
        assert!(bytes == &*data, "{c}: every byte, in order");
        assert_eq!(*end, Some(true), "{c}");
    }
    assert!(!got.contains_key(&refuser));
    // What any server held at once stayed within twice the window, on a transfer 30 times
    // its size.
    for (i, s) in net.svc.iter().enumerate() {
        assert!(
            s.stats.held_max <= 2 * window,
            "{}: held {} bytes at once",
            dims.coord(i),
            s.stats.held_max
        );
        assert_eq!(s.stats.held_bytes, 0, "nothing left held");
    }
    assert!(net.svc.iter().all(|s| s.xfers.is_empty()));
}

#[test]
fn a_member_repairs_from_the_root_what_its_parents_no_longer_hold() {
    let dims = Dims::new(4, 4, 2).unwrap();
    let window = 16 * 4096;
    let mut net = Net::new(dims, |_| Multicast::new(window, None));
    net.budget = 2;
    let data = Arc::new(generate(1_500_000, 3));
    let root = Coord::new(0, 0, 0);
    let rx = start(&mut net, root, &data, None);
    net.run(Time::from_nanos(2_000_000));
    assert!(rx.try_recv().is_err(), "still running when the server dies");
    // A server in the middle of the trees dies: its subtrees' new parents let go of the
    // chunks they forwarded long ago.
    let dead = Coord::new(1, 0, 0);
    net.kill(dead);
    net.run(Time::from_nanos(60_000_000_000));
    let v = rx.try_recv().expect("a result");
    assert!(v.get("error").is_none(), "{v}");
    assert_eq!(v["completed"].as_u64(), Some(30), "{v}");
    assert!(v["checksum_mismatch"].as_array().is_some_and(Vec::is_empty));
    assert_eq!(v["lost"], serde_json::json!([dead.to_string()]));
    let repaired = net.svc[dims.index(root)].stats.repaired;
    assert!(repaired > 0, "the root repaired: {:?}", net.svc[0].stats);
    for s in &net.svc {
        assert!(s.stats.held_max <= 2 * window, "{:?}", s.stats);
    }
}

#[test]
fn lost_progress_reports_and_a_relay_without_its_start_cost_seconds_not_the_transfer() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let window = 16 * 4096;
    let mut net = Net::new(dims, |_| Multicast::new(window, None));
    let root = Coord::new(0, 0, 0);
    let relay = Coord::new(1, 0, 0);
    // The first 60 progress reports are lost (two or three per member: without them the
    // window would never move), and so is the relay's first Start.
    let mut relay_started = false;
    let mut progress_lost = 0;
    net.lose = Some(Box::new(move |_src, dst, b: &[u8]| match b.first() {
        Some(6) if progress_lost < 60 => {
            progress_lost += 1;
            true
        }
        Some(1) if dst == relay && !relay_started => {
            relay_started = true;
            true
        }
        _ => false,
    }));
    let data = Arc::new(generate(1_000_000, 21));
    let group: Vec<Coord> = dims.coords().filter(|c| *c != relay).collect();
    let rx = start(&mut net, root, &data, Some(group));
    net.run(Time::from_nanos(60_000_000_000));
    let v = rx.try_recv().expect("a result");
    assert!(v.get("error").is_none(), "{v}");
    assert_eq!(v["completed"], 25, "{v}");
    assert!(v["checksum_mismatch"].as_array().is_some_and(Vec::is_empty));
    // The window moved on the members' Wants, and the relay let go of what it forwarded
    // once it learnt it only relays.
    for (i, s) in net.svc.iter().enumerate() {
        assert!(
            s.stats.held_max <= 2 * window,
            "{}: {:?}",
            dims.coord(i),
            s.stats
        );
    }
}
