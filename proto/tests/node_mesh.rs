//! Whole tori of sans-IO engines wired in memory: every pair exchanges reliable messages
//! over multi-hop paths, key-routed messages land on the root the spec names, failures
//! reroute traffic and notify services, and interceptors see frames on path.

use std::collections::VecDeque;

use torusnet_proto::keyspace;
use torusnet_proto::node::{
    Event, Interceptor, MsgOptions, Node, Outbound, Received, RxAction, Target, Verdict,
};
use torusnet_proto::routing::LinkView;
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims, Dir, DirSet};
use torusnet_proto::transport::{Config, Lent};
use torusnet_proto::wire::Header;

struct Mesh {
    dims: Dims,
    nodes: Vec<Node>,
    up: Vec<bool>,
    wire: VecDeque<(usize, Dir, Vec<u8>)>,
    now: Time,
}

impl Mesh {
    fn new(dims: Dims, view: &LinkView) -> Mesh {
        let nodes = dims
            .coords()
            .map(|c| Node::new(c, view.clone(), Config::default()).unwrap())
            .collect();
        Mesh {
            dims,
            nodes,
            up: vec![true; dims.count() as usize],
            wire: VecDeque::new(),
            now: Time::ZERO,
        }
    }

    fn set_view(&mut self, view: &LinkView) {
        for n in &mut self.nodes {
            n.set_view(view.clone()).unwrap();
        }
    }

    fn send_frame(&mut self, from: usize, dir: Dir, frame: Vec<u8>) {
        let c = self.dims.coord(from);
        let to = self.dims.index(self.dims.neighbor(c, dir));
        let live = self.nodes[from].view().live_dirs(c).contains(dir);
        if live && self.up[to] {
            self.wire.push_back((to, dir.opposite(), frame));
        }
    }

    /// Runs for `d` of mesh time (or until nothing moves); returns delivered events.
    fn run_for(&mut self, d: std::time::Duration) -> Vec<Vec<Event>> {
        let steps = (d.as_micros() / 100).max(1) as usize;
        self.run_steps(steps)
    }

    /// Runs until nothing moves; returns delivered events per node.
    fn run(&mut self) -> Vec<Vec<Event>> {
        self.run_steps(100_000)
    }

    fn run_steps(&mut self, steps: usize) -> Vec<Vec<Event>> {
        let mut events = vec![Vec::new(); self.nodes.len()];
        let mut buf = vec![0u8; 1514];
        for _ in 0..steps {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                if !self.up[i] {
                    continue;
                }
                loop {
                    let may = self.nodes[i].may_transmit();
                    let Some(Outbound { dir, len, .. }) =
                        self.nodes[i].poll_transmit(self.now, DirSet::ALL, &mut buf, None)
                    else {
                        break;
                    };
                    // A driver skips poll_transmit when may_transmit says no.
                    assert!(may, "node {i} sent a frame after may_transmit said none");
                    self.send_frame(i, dir, buf[..len].to_vec());
                    moved = true;
                }
            }
            while let Some((to, dir, mut frame)) = self.wire.pop_front() {
                moved = true;
                match self.nodes[to].handle_rx(self.now, dir, &mut frame) {
                    RxAction::Forward(hops) => {
                        let d = hops.iter().next().unwrap();
                        self.send_frame(to, d, frame);
                    }
                    RxAction::Consumed | RxAction::Drop(_) => {}
                }
            }
            for (i, n) in self.nodes.iter_mut().enumerate() {
                while let Some(e) = n.poll_event() {
                    events[i].push(e);
                }
            }
            self.now = self.now + std::time::Duration::from_micros(100);
            for n in &mut self.nodes {
                n.handle_timeout(self.now);
            }
            let busy = self.nodes.iter().any(|n| {
                n.has_pending() || n.transport().in_flight() > 0 || n.pending_key_messages() > 0
            });
            if !moved && !busy {
                break;
            }
        }
        // What the last timers reported.
        for (i, n) in self.nodes.iter_mut().enumerate() {
            while let Some(e) = n.poll_event() {
                events[i].push(e);
            }
        }
        events
    }
}

fn reliable() -> MsgOptions {
    MsgOptions {
        reliable: true,
        ..MsgOptions::default()
    }
}

#[test]
fn every_pair_exchanges_reliable_messages_over_multiple_hops() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let view = LinkView::all_up(dims).unwrap();
    let mut mesh = Mesh::new(dims, &view);
    let n = dims.count() as usize;
    for a in 0..n {
        for b in 0..n {
            if a != b {
                let data = format!("{a}->{b}").into_bytes();
                let t = Target::Server(dims.coord(b));
                mesh.nodes[a]
                    .send(Time::ZERO, t, 9, &data, reliable())
                    .unwrap();
            }
        }
    }
    let events = mesh.run();
    for (b, evs) in events.iter().enumerate() {
        let mut got: Vec<String> = evs
            .iter()
            .filter_map(|e| match e {
                Event::Message {
                    data,
                    reliable: true,
                    ..
                } => Some(String::from_utf8(data.clone()).unwrap()),
                _ => None,
            })
            .collect();
        got.sort();
        let mut want: Vec<String> = (0..n)
            .filter(|a| *a != b)
            .map(|a| format!("{a}->{b}"))
            .collect();
        want.sort();
        assert_eq!(got, want, "server {}", dims.coord(b));
    }
    let forwarded: u64 = mesh.nodes.iter().map(|n| n.stats().forwarded).sum();
    assert!(
        forwarded > 0,
        "3x3x3 pairs up to 3 hops apart need forwarding"
    );
}

#[test]
fn key_routed_messages_reach_the_spec_root_and_fail_over() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let mut view = LinkView::all_up(dims).unwrap();
    let mut mesh = Mesh::new(dims, &view);
    let keys: Vec<u64> = (0..200)
        .map(|i| torusnet_proto::Key::from_string(&format!("k{i}")).routing_key())
        .collect();
    for (i, k) in keys.iter().enumerate() {
        let from = i % 27;
        mesh.nodes[from]
            .send(
                Time::ZERO,
                Target::Key(*k),
                3,
                &k.to_be_bytes(),
                MsgOptions::default(),
            )
            .unwrap();
    }
    let check = |events: &[Vec<Event>], down: Option<Coord>| {
        let mut count = 0;
        for (i, evs) in events.iter().enumerate() {
            for e in evs {
                if let Event::Message {
                    key: Some(k), data, ..
                } = e
                {
                    assert_eq!(data, &k.to_be_bytes());
                    let root = keyspace::root(dims, *k, |c| Some(c) != down).unwrap();
                    assert_eq!(dims.coord(i), root, "key {k:016x} delivered off its root");
                    count += 1;
                }
            }
        }
        count
    };
    let events = mesh.run();
    assert_eq!(check(&events, None), keys.len());

    // A server fails: its keys move to the next candidate, per GetServersForKey.
    let dead = Coord::new(1, 1, 1);
    view.set_server(dead, false).unwrap();
    mesh.up[dims.index(dead)] = false;
    mesh.set_view(&view);
    for (i, k) in keys.iter().enumerate() {
        let from = (i * 7 + 1) % 27;
        if from != dims.index(dead) {
            mesh.nodes[from]
                .send(
                    mesh.now,
                    Target::Key(*k),
                    3,
                    &k.to_be_bytes(),
                    MsgOptions::default(),
                )
                .unwrap();
        }
    }
    let events = mesh.run();
    let unreachable = events[0]
        .iter()
        .filter(|e| **e == Event::Unreachable(dead))
        .count();
    assert_eq!(unreachable, 1, "services are told the server died");
    // Sending to it now fails at once, and blocks nothing queued behind it.
    let reliable = MsgOptions {
        reliable: true,
        ..MsgOptions::default()
    };
    assert_eq!(
        mesh.nodes[0].send(mesh.now, Target::Server(dead), 3, b"x", reliable),
        Err(torusnet_proto::transport::SendError::Unreachable)
    );
    let delivered = check(&events, Some(dead));
    assert_eq!(
        delivered,
        keys.len()
            - keys
                .iter()
                .enumerate()
                .filter(|(i, _)| (i * 7 + 1) % 27 == dims.index(dead))
                .count()
    );
}

#[test]
fn routes_go_around_a_cut_link() {
    let dims = Dims::new(3, 1, 1).unwrap();
    let mut view = LinkView::all_up(dims).unwrap();
    view.set_link(Coord::new(0, 0, 0), Dir::PlusX, false)
        .unwrap();
    let mut mesh = Mesh::new(dims, &view);
    mesh.nodes[0]
        .send(
            Time::ZERO,
            Target::Server(Coord::new(1, 0, 0)),
            1,
            b"around",
            reliable(),
        )
        .unwrap();
    let events = mesh.run();
    assert!(events[1]
        .iter()
        .any(|e| matches!(e, Event::Message { data, .. } if data == b"around")));
    // The SYNC, its answer, the message and the ACK coming back all take the long way,
    // through 2,0,0.
    assert_eq!(mesh.nodes[2].stats().forwarded, 4);
}

struct Tagger;
impl Interceptor for Tagger {
    fn on_path(&mut self, _h: &Header, payload: &mut [u8]) -> Verdict {
        if let Some(b) = payload.first_mut() {
            *b = b'!';
        }
        Verdict::Forward
    }
}

#[test]
fn interceptors_see_and_change_frames_on_path() {
    let dims = Dims::new(5, 1, 1).unwrap();
    let view = LinkView::all_up(dims).unwrap();
    let mut mesh = Mesh::new(dims, &view);
    // A key rooted at 2,0,0, sent from 0,0,0: it passes 1,0,0.
    let k = (13107u64 * 2 + 1) << 48;
    assert_eq!(keyspace::root(dims, k, |_| true), Some(Coord::new(2, 0, 0)));
    mesh.nodes[1].intercept(4, Box::new(Tagger));
    let opts = MsgOptions {
        intercept: true,
        ..MsgOptions::default()
    };
    mesh.nodes[0]
        .send(Time::ZERO, Target::Key(k), 4, b"?hello", opts)
        .unwrap();
    let events = mesh.run();
    assert!(events[2]
        .iter()
        .any(|e| matches!(e, Event::Message { data, .. } if data == b"!hello")));
    assert_eq!(mesh.nodes[1].stats().intercepted, 1);
}

struct Holder;
impl Interceptor for Holder {
    fn on_path(&mut self, _h: &Header, _payload: &mut [u8]) -> Verdict {
        Verdict::Hold
    }
}

/// An on-path hook that holds frames (a service in another thread or process decides
/// later): the engine sets each aside whole; put back changed, it goes on to its root, which
/// no hook on the way sees twice; one not put back goes nowhere.
#[test]
fn held_frames_go_on_when_put_back_changed_or_not() {
    let dims = Dims::new(5, 1, 1).unwrap();
    let view = LinkView::all_up(dims).unwrap();
    let mut mesh = Mesh::new(dims, &view);
    let k = (13107u64 * 2 + 1) << 48;
    mesh.nodes[1].intercept(4, Box::new(Holder));
    let opts = MsgOptions {
        intercept: true,
        ..MsgOptions::default()
    };
    for m in [&b"?one"[..], b"?two", b"?three"] {
        mesh.nodes[0]
            .send(Time::ZERO, Target::Key(k), 4, m, opts)
            .unwrap();
    }
    let events = mesh.run();
    assert!(keyed_short(&events[2]).is_empty(), "held at 1,0,0");
    let held = mesh.nodes[1].take_held();
    assert_eq!(held.len(), 3);
    assert!(mesh.nodes[1].take_held().is_empty());
    // The first unchanged, the second changed, the third dropped.
    let changed =
        torusnet_proto::wire::with_payload(&held[1], b"!two, changed on the way").unwrap();
    for mut f in [held[0].clone(), changed] {
        match mesh.nodes[1].resume_on_path(mesh.now, &mut f) {
            RxAction::Forward(hops) => {
                let d = hops.iter().next().unwrap();
                mesh.send_frame(1, d, f);
            }
            other => panic!("{other:?}"),
        }
    }
    let events = mesh.run();
    assert_eq!(
        keyed_short(&events[2]),
        vec![b"?one".to_vec(), b"!two, changed on the way".to_vec()]
    );
    assert!(
        mesh.nodes[1].take_held().is_empty(),
        "seen once on this server"
    );
    // Stopped: frames pass again.
    mesh.nodes[1].stop_intercepting(4);
    mesh.nodes[0]
        .send(mesh.now, Target::Key(k), 4, b"?four", opts)
        .unwrap();
    let events = mesh.run();
    assert_eq!(keyed_short(&events[2]), vec![b"?four".to_vec()]);
}

/// The key-routed short messages among `events`.
fn keyed_short(events: &[Event]) -> Vec<Vec<u8>> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Message {
                key: Some(_),
                reliable: false,
                data,
                ..
            } => Some(data.clone()),
            _ => None,
        })
        .collect()
}

/// A short message received with `handle_rx_lending` comes back borrowed from its frame,
/// the same message `handle_rx` would have queued; with an event queued ahead of it, it is
/// queued behind that one instead, so the order of events never changes.
#[test]
fn lent_messages_are_those_handle_rx_queues_and_never_overtake() {
    let dims = Dims::new(3, 1, 1).unwrap();
    let view = LinkView::all_up(dims).unwrap();
    let (a, b) = (Coord::new(0, 0, 0), Coord::new(1, 0, 0));
    let mut tx = Node::new(a, view.clone(), Config::default()).unwrap();
    let mut rx = Node::new(b, view, Config::default()).unwrap();
    let short = MsgOptions::default();
    let mut frames = Vec::new();
    let mut buf = vec![0u8; 9014];
    for (k, len) in [(1u8, 1400usize), (2, 40), (3, 300)] {
        tx.send(Time::ZERO, Target::Server(b), 5, &vec![k; len], short)
            .unwrap();
        let Outbound { dir, len: n, .. } = tx
            .poll_transmit(Time::ZERO, DirSet::ALL, &mut buf, None)
            .unwrap();
        frames.push((dir, buf[..n].to_vec()));
    }
    // Nothing queued: lent, and nothing left to poll.
    let (dir, mut f) = frames.remove(0);
    match rx.handle_rx_lending(Time::ZERO, dir.opposite(), &mut f) {
        Received::Message(Lent {
            src,
            service,
            data,
            reliable,
        }) => {
            assert_eq!((src, service, reliable), (a, 5, false));
            assert_eq!(data, &vec![1u8; 1400][..]);
        }
        other => panic!("not lent: {other:?}"),
    }
    assert!(rx.poll_event().is_none());
    // The second is queued (handle_rx); the third must then wait behind it.
    let (dir, mut f) = frames.remove(0);
    assert_eq!(
        rx.handle_rx(Time::ZERO, dir.opposite(), &mut f),
        RxAction::Consumed
    );
    let (dir, mut f) = frames.remove(0);
    assert_eq!(
        rx.handle_rx_lending(Time::ZERO, dir.opposite(), &mut f),
        Received::Action(RxAction::Consumed)
    );
    let got: Vec<Vec<u8>> = std::iter::from_fn(|| rx.poll_event())
        .filter_map(|e| match e {
            Event::Message { data, .. } => Some(data),
            _ => None,
        })
        .collect();
    assert_eq!(got, vec![vec![2u8; 40], vec![3u8; 300]]);
    assert_eq!(rx.transport_stats().messages_delivered, 3);
}

/// What one receiver handed its services, in order: (service, bytes, reliable).
type Deliveries = Vec<(u16, Vec<u8>, bool)>;

/// One sender streams reliable messages (fenced and not, some fragmented, some alone in
/// their queue) and short ones to one receiver over a link that reorders and duplicates
/// frames; the receiver takes every frame with `handle_rx_lending` when `lending`, else
/// with `handle_rx`, and drains its events after most frames (not all: a service that falls
/// behind leaves events waiting). Seeded: both ways see the same frames in the same order.
fn deliveries(lending: bool, seed: u64) -> (Deliveries, u64, usize) {
    let dims = Dims::new(3, 1, 1).unwrap();
    let view = LinkView::all_up(dims).unwrap();
    let (a, b) = (Coord::new(0, 0, 0), Coord::new(1, 0, 0));
    let mut tx = Node::new(a, view.clone(), Config::default()).unwrap();
    let mut rx = Node::new(b, view, Config::default()).unwrap();
    let mut rng = torusnet_proto::rng::SplitMix64::new(seed);
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1514];
    let mut now = Time::ZERO;
    let mut sent = 0u32;
    let mut lent_reliable = 0;
    let record = |e: Event, got: &mut Deliveries| {
        if let Event::Message {
            service,
            data,
            reliable,
            ..
        } = e
        {
            got.push((service, data, reliable));
        }
    };
    for _round in 0..4000 {
        // A few messages a round: sometimes one alone, sometimes a burst to aggregate.
        let burst = 1 + rng.next_u64() % 4;
        for _ in 0..burst {
            if sent >= 600 {
                break;
            }
            let r = rng.next_u64();
            let len = match r % 5 {
                0 => 3000 + (r >> 8) as usize % 2000,
                1 => 600,
                _ => 8 + (r >> 8) as usize % 120,
            };
            let opts = MsgOptions {
                reliable: !r.is_multiple_of(7),
                fences: torusnet_proto::transport::Fences {
                    backward: (r >> 20).is_multiple_of(9),
                    forward: (r >> 24).is_multiple_of(11),
                },
                tag: u64::from(sent),
                ..MsgOptions::default()
            };
            let mut m = vec![(sent % 251) as u8; len];
            m[..4].copy_from_slice(&sent.to_le_bytes());
            let short_too_big = !opts.reliable && len > 1300;
            if short_too_big {
                continue;
            }
            if tx.send(now, Target::Server(b), 7, &m, opts).is_ok() {
                sent += 1;
            }
        }
        // Frames from the sender, shuffled a little and sometimes repeated.
        let mut out = Vec::new();
        while let Some(Outbound { dir, len: n, .. }) =
            tx.poll_transmit(now, DirSet::ALL, &mut buf, None)
        {
            out.push((dir, buf[..n].to_vec()));
            if rng.next_u64().is_multiple_of(20) {
                out.push((dir, buf[..n].to_vec()));
            }
        }
        for k in (1..out.len()).rev() {
            if rng.next_u64().is_multiple_of(3) {
                let j = (rng.next_u64() % (k as u64 + 1)) as usize;
                out.swap(k, j);
            }
        }
        for (dir, mut f) in out {
            if lending {
                match rx.handle_rx_lending(now, dir.opposite(), &mut f) {
                    Received::Message(Lent {
                        service,
                        data,
                        reliable,
                        ..
                    }) => {
                        lent_reliable += usize::from(reliable);
                        got.push((service, data.to_vec(), reliable));
                    }
                    Received::Action(_) => {}
                }
            } else {
                rx.handle_rx(now, dir.opposite(), &mut f);
            }
            // Sometimes the services fall behind: events wait while more frames arrive,
            // and nothing lent may overtake them.
            if !rng.next_u64().is_multiple_of(3) {
                while let Some(e) = rx.poll_event() {
                    record(e, &mut got);
                }
            }
        }
        // The receiver's handshake, ACKs and NACKs back, in order.
        while let Some(Outbound { dir, len: n, .. }) =
            rx.poll_transmit(now, DirSet::ALL, &mut buf, None)
        {
            let mut f = buf[..n].to_vec();
            tx.handle_rx(now, dir.opposite(), &mut f);
        }
        now = now + std::time::Duration::from_micros(20);
        for n in [&mut tx, &mut rx] {
            if n.poll_timeout().is_some_and(|t| t <= now) {
                n.handle_timeout(now);
            }
        }
        while let Some(e) = rx.poll_event() {
            record(e, &mut got);
        }
        while tx.poll_event().is_some() {}
    }
    (got, rx.transport_stats().messages_delivered, lent_reliable)
}

/// Reliable messages lent from their frames are exactly the ones, in exactly the order,
/// that `handle_rx` would have queued: fences, fragments, aggregation, reordering and
/// duplicates change nothing about what a service is handed.
#[test]
fn lending_hands_out_what_queueing_would_in_the_same_order() {
    for seed in 1..=4 {
        let (queued, nq, _) = deliveries(false, seed);
        let (lent, nl, lent_reliable) = deliveries(true, seed);
        // Not vacuous: many reliable messages were lent, many others queued.
        assert!(lent_reliable > 50, "seed {seed}: {lent_reliable} lent");
        assert!(
            queued.len() > 400,
            "seed {seed}: only {} delivered",
            queued.len()
        );
        assert!(
            queued.iter().filter(|m| m.2).count() > 300,
            "seed {seed}: too few reliable"
        );
        assert_eq!(queued.len(), lent.len(), "seed {seed}");
        for (k, (q, l)) in queued.iter().zip(&lent).enumerate() {
            assert_eq!(q, l, "seed {seed}: delivery {k} differs");
        }
        assert_eq!(nq, nl, "seed {seed}: delivered counts");
    }
}

/// The root of `k` when every server in `down` is down, and the one after it.
fn roots(dims: Dims, k: u64, down: &[Coord]) -> Coord {
    keyspace::root(dims, k, |c| !down.contains(&c)).unwrap()
}

/// Deliveries of reliable key messages, by server index: (server, key, data).
fn keyed_deliveries(events: &[Vec<Event>]) -> Vec<(usize, u64, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, evs) in events.iter().enumerate() {
        for e in evs {
            if let Event::Message {
                key: Some(k),
                data,
                reliable: true,
                ..
            } = e
            {
                out.push((i, *k, data.clone()));
            }
        }
    }
    out
}

/// A reliable message to a key whose root fails before it arrives is sent again to the
/// key's next root, without its sender's help, and delivered there once; its sender hears
/// one acknowledgement, with its own tag and service.
#[test]
fn a_reliable_key_message_follows_its_root_when_the_root_fails() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let mut view = LinkView::all_up(dims).unwrap();
    let mut mesh = Mesh::new(dims, &view);
    let sender = 0usize;
    mesh.nodes[sender].notify_acks(40, true);
    // Keys whose root is not the sender, and the root of the first.
    let keys: Vec<u64> = (0..400u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .filter(|k| roots(dims, *k, &[]) != dims.coord(sender))
        .take(60)
        .collect();
    let dead = roots(dims, keys[0], &[]);
    // The root dies silently: its frames are lost; the views still show it.
    mesh.up[dims.index(dead)] = false;
    let opts = MsgOptions {
        reliable: true,
        tag: 0,
        from: Some(40),
        ..MsgOptions::default()
    };
    for (t, k) in keys.iter().enumerate() {
        let o = MsgOptions {
            tag: 1000 + t as u64,
            ..opts
        };
        mesh.nodes[sender]
            .send(mesh.now, Target::Key(*k), 41, &k.to_le_bytes(), o)
            .unwrap();
    }
    let before = mesh.run_for(std::time::Duration::from_millis(20));
    // The control plane declares it dead: what it holds is sent to the new roots.
    view.set_server(dead, false).unwrap();
    mesh.set_view(&view);
    let after = mesh.run();
    let all: Vec<Vec<Event>> = before
        .into_iter()
        .zip(after)
        .map(|(mut a, b)| {
            a.extend(b);
            a
        })
        .collect();
    let got = keyed_deliveries(&all);
    for k in &keys {
        let at: Vec<usize> = got.iter().filter(|g| g.1 == *k).map(|g| g.0).collect();
        let root = roots(dims, *k, &[dead]);
        assert_eq!(
            at,
            vec![dims.index(root)],
            "key {k:016x}: delivered once, at its root"
        );
        let data = &got.iter().find(|g| g.1 == *k).unwrap().2;
        assert_eq!(data, &k.to_le_bytes());
    }
    // Every message reported once, acknowledged, to its sending service with its tag.
    let mut acked = 0;
    let mut tags = Vec::new();
    for e in &all[sender] {
        match e {
            Event::Acked {
                service,
                count,
                last_tag,
                ..
            } => {
                assert_eq!(*service, 40);
                acked += count;
                tags.push(*last_tag);
            }
            Event::Failed { .. } => panic!("a key message failed: {e:?}"),
            _ => {}
        }
    }
    assert_eq!(acked as usize, keys.len());
    assert!(tags
        .iter()
        .all(|t| (1000..1000 + keys.len() as u64).contains(t)));
    assert!(mesh.nodes[sender].keyed_stats().resent > 0);
    assert_eq!(mesh.nodes[sender].pending_key_messages(), 0);
}

/// A server that is not a key's root in its own view refuses a reliable message to the key
/// before any service sees it; the sender keeps trying until its view moves, then delivers
/// at the root; and when no root takes it by the deadline it reports it failed, once.
#[test]
fn a_key_message_is_taken_only_by_a_root_and_fails_only_at_its_deadline() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let full = LinkView::all_up(dims).unwrap();
    let mut mesh = Mesh::new(dims, &full);
    let sender = 0usize;
    mesh.nodes[sender].notify_acks(40, true);
    let k = (1..1000u64)
        .map(|i| i.wrapping_mul(0x2545_F491_4F6C_DD1D))
        .find(|k| {
            let a = roots(dims, *k, &[]);
            a != dims.coord(sender) && roots(dims, *k, &[a]) != dims.coord(sender)
        })
        .unwrap();
    let a = roots(dims, k, &[]);
    let b = roots(dims, k, &[a]);
    // The sender believes the root `a` is down; `b` and everyone else know it is up.
    let mut stale = full.clone();
    stale.set_server(a, false).unwrap();
    mesh.nodes[sender].set_view(stale.clone()).unwrap();
    let opts = MsgOptions {
        reliable: true,
        tag: 7,
        from: Some(40),
        ..MsgOptions::default()
    };
    mesh.nodes[sender]
        .send(mesh.now, Target::Key(k), 41, b"first", opts)
        .unwrap();
    // Run a while: `b` refuses, the sender tries again and again (nobody delivers).
    for _ in 0..20 {
        let evs = mesh.run_for(std::time::Duration::from_millis(5));
        assert!(
            keyed_deliveries(&evs).is_empty(),
            "{b} is not the root in its view"
        );
    }
    assert_eq!(mesh.nodes[sender].pending_key_messages(), 1);
    // The sender's view catches up: delivered at `a`, once.
    mesh.nodes[sender].set_view(full.clone()).unwrap();
    let evs = mesh.run();
    let got = keyed_deliveries(&evs);
    assert_eq!(got, vec![(dims.index(a), k, b"first".to_vec())]);
    assert!(evs[sender].iter().any(|e| matches!(
        e,
        Event::Acked {
            service: 40,
            last_tag: 7,
            ..
        }
    )));

    // Never: the sender's view stays stale; after the deadline, one failure report.
    mesh.nodes[sender].set_view(stale).unwrap();
    let opts = MsgOptions { tag: 8, ..opts };
    mesh.nodes[sender]
        .send(mesh.now, Target::Key(k), 41, b"second", opts)
        .unwrap();
    let start = mesh.now;
    let evs = mesh.run();
    assert!(keyed_deliveries(&evs).is_empty());
    let failed: Vec<&Event> = evs[sender]
        .iter()
        .filter(|e| matches!(e, Event::Failed { .. }))
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(matches!(
        failed[0],
        Event::Failed { service: 40, tags, reason: torusnet_proto::transport::FailReason::Unreachable, .. }
            if tags == &vec![8]
    ));
    let took = mesh.now.since(start);
    assert!(
        took >= torusnet_proto::node::KEYED_DEADLINE,
        "failed after {took:?}, before its deadline"
    );
    assert_eq!(mesh.nodes[sender].pending_key_messages(), 0);
}

/// An engine that owns only some peers' connections (one poller of several) hands a key
/// message whose root is another's to the driver, whole, instead of opening a connection it
/// does not own; the engine that owns the root sends it and reports it.
#[test]
fn a_key_message_for_a_root_another_engine_owns_is_handed_off() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let view = LinkView::all_up(dims).unwrap();
    let mut mesh = Mesh::new(dims, &view);
    let sender = 0usize;
    let k = (1..1000u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .find(|k| roots(dims, *k, &[]) != dims.coord(sender))
        .unwrap();
    let root = roots(dims, k, &[]);
    // This engine owns every peer but the root.
    mesh.nodes[sender].set_key_owner(Some(Box::new(move |c| c != root)));
    let opts = MsgOptions {
        reliable: true,
        tag: 99,
        from: Some(40),
        ..MsgOptions::default()
    };
    mesh.nodes[sender]
        .send(mesh.now, Target::Key(k), 41, b"over there", opts)
        .unwrap();
    let handed = mesh.nodes[sender].take_keyed_handoffs();
    assert_eq!(
        handed,
        vec![torusnet_proto::node::KeyedHandoff {
            key: k,
            service: 41,
            from: 40,
            tag: 99,
            data: b"over there".to_vec(),
        }]
    );
    assert!(mesh.nodes[sender].take_keyed_handoffs().is_empty());
    assert_eq!(
        mesh.nodes[sender].transport().in_flight(),
        0,
        "no connection opened"
    );
    // The owning engine (here the same server's, owning all) sends it: delivered at the root.
    mesh.nodes[sender].set_key_owner(None);
    mesh.nodes[sender].notify_acks(40, true);
    let h = &handed[0];
    let o = MsgOptions {
        tag: h.tag,
        from: Some(h.from),
        ..opts
    };
    mesh.nodes[sender]
        .send(mesh.now, Target::Key(h.key), h.service, &h.data, o)
        .unwrap();
    let evs = mesh.run();
    assert_eq!(
        keyed_deliveries(&evs),
        vec![(dims.index(root), k, b"over there".to_vec())]
    );
    assert!(evs[sender].iter().any(|e| matches!(
        e,
        Event::Acked {
            service: 40,
            last_tag: 99,
            ..
        }
    )));
}

#[test]
fn services_hear_when_roots_move_without_a_reachability_change() {
    let dims = Dims::new(3, 3, 1).unwrap();
    let joiner = Coord::new(1, 1, 0);
    let mut view = LinkView::all_up(dims).unwrap();
    view.set_joining(joiner, true).unwrap();
    let mut mesh = Mesh::new(dims, &view);
    mesh.run();
    let moved = |events: &[Vec<Event>]| {
        events
            .iter()
            .map(|e| e.iter().filter(|e| **e == Event::RootsMoved).count())
            .collect::<Vec<_>>()
    };
    // It finishes joining: everyone is told once; nobody became reachable or unreachable.
    view.set_joining(joiner, false).unwrap();
    mesh.set_view(&view);
    let events = mesh.run();
    assert_eq!(moved(&events), vec![1; 9]);
    assert!(events
        .iter()
        .flatten()
        .all(|e| !matches!(e, Event::Reachable(_) | Event::Unreachable(_))));
    // The same view again, and a view where only the joiner's reachability changes: no
    // RootsMoved (Unreachable says it).
    mesh.set_view(&view);
    assert_eq!(moved(&mesh.run()), vec![0; 9]);
    view.set_server(joiner, false).unwrap();
    mesh.set_view(&view);
    assert_eq!(moved(&mesh.run()), vec![0; 9]);
}
