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
