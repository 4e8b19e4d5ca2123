//! Source routing (BSR) across tori of sans-IO engines wired in memory: reliable traffic
//! follows the routes its sources chose, probes steer a flow off a loaded path, a cut link
//! on the path moves the flow before any view changes, and malformed routes are refused.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use torusnet_proto::node::{DropReason, Event, MsgOptions, Node, Outbound, RxAction, Target};
use torusnet_proto::routing::bsr::BsrConfig;
use torusnet_proto::routing::load::LinkLoad;
use torusnet_proto::routing::LinkView;
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims, Dir, DirSet};
use torusnet_proto::transport::Config;
use torusnet_proto::wire::{self, offset, Dest, Header, Kind, HEADERS_LEN};

const STEP: Duration = Duration::from_micros(50);

struct Mesh {
    dims: Dims,
    nodes: Vec<Node>,
    /// Links that lose every frame (server index, direction), both ways.
    cut: HashSet<(usize, Dir)>,
    wire: VecDeque<(usize, Dir, Vec<u8>)>,
    now: Time,
    drops: Vec<DropReason>,
    /// Data frames sent by their source, per service: (with a route, without).
    sent_by_service: std::collections::HashMap<u16, (usize, usize)>,
}

impl Mesh {
    fn new(dims: Dims) -> Mesh {
        Mesh::configured(dims, |_| {})
    }

    /// A mesh whose engines are configured by `setup` before source routing is enabled.
    fn configured(dims: Dims, setup: impl Fn(&mut Node)) -> Mesh {
        let view = LinkView::all_up(dims).unwrap();
        let nodes = dims
            .coords()
            .map(|c| {
                let mut n = Node::new(c, view.clone(), Config::default()).unwrap();
                setup(&mut n);
                n.enable_source_routing(BsrConfig {
                    probe_after_bytes: 0,
                    ..BsrConfig::default()
                });
                n
            })
            .collect();
        Mesh {
            dims,
            nodes,
            cut: HashSet::new(),
            wire: VecDeque::new(),
            now: Time::ZERO,
            drops: Vec::new(),
            sent_by_service: std::collections::HashMap::new(),
        }
    }

    fn idx(&self, c: Coord) -> usize {
        self.dims.index(c)
    }

    /// Cuts the link leaving `c` along `dir`: both ends see their carrier go (the view is
    /// not told).
    fn cut(&mut self, c: Coord, dir: Dir) {
        let far = self.dims.neighbor(c, dir);
        let (a, b) = (self.idx(c), self.idx(far));
        self.cut.insert((a, dir));
        self.cut.insert((b, dir.opposite()));
        self.nodes[a].set_link_up(dir, false);
        self.nodes[b].set_link_up(dir.opposite(), false);
    }

    fn send_frame(&mut self, from: usize, dir: Dir, frame: Vec<u8>) {
        if self.cut.contains(&(from, dir)) {
            return;
        }
        let c = self.dims.coord(from);
        let to = self.idx(self.dims.neighbor(c, dir));
        self.wire.push_back((to, dir.opposite(), frame));
    }

    /// One step of every engine; the events delivered in it.
    fn step(&mut self, events: &mut [Vec<Event>]) -> bool {
        let mut buf = vec![0u8; 9014];
        let mut moved = false;
        for i in 0..self.nodes.len() {
            while let Some(Outbound { dir, len, .. }) =
                self.nodes[i].poll_transmit(self.now, DirSet::ALL, &mut buf, None)
            {
                assert!(len <= 1514, "a frame of {len} bytes exceeds the MTU");
                if buf[offset::KIND] == Kind::Data as u8 {
                    let svc = u16::from_be_bytes([buf[offset::SERVICE], buf[offset::SERVICE + 1]]);
                    let e = self.sent_by_service.entry(svc).or_default();
                    if buf[offset::ROUTE_LEN] > 0 {
                        e.0 += 1;
                    } else {
                        e.1 += 1;
                    }
                }
                self.send_frame(i, dir, buf[..len].to_vec());
                moved = true;
            }
        }
        while let Some((to, dir, mut frame)) = self.wire.pop_front() {
            moved = true;
            match self.nodes[to].handle_rx(self.now, dir, &mut frame) {
                RxAction::Forward(hops) => {
                    let routed = frame[offset::ROUTE_LEN] > 0;
                    assert!(
                        !routed || hops.len() == 1,
                        "source-routed frames take one link"
                    );
                    let d = hops.iter().next().unwrap();
                    self.send_frame(to, d, frame);
                }
                RxAction::Drop(why) => self.drops.push(why),
                RxAction::Consumed => {}
            }
        }
        for (i, n) in self.nodes.iter_mut().enumerate() {
            while let Some(e) = n.poll_event() {
                events[i].push(e);
            }
        }
        self.now = self.now + STEP;
        for n in &mut self.nodes {
            n.handle_timeout(self.now);
        }
        moved
    }

    fn run_until(&mut self, events: &mut [Vec<Event>], done: impl Fn(&[Vec<Event>]) -> bool) {
        for _ in 0..200_000 {
            self.step(events);
            if done(events) {
                return;
            }
        }
        panic!("not done within 10 simulated seconds");
    }
}

fn reliable() -> MsgOptions {
    MsgOptions {
        reliable: true,
        ..MsgOptions::default()
    }
}

fn received(evs: &[Event]) -> Vec<Vec<u8>> {
    evs.iter()
        .filter_map(|e| match e {
            Event::Message {
                data,
                reliable: true,
                ..
            } => Some(data.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn every_pair_exchanges_reliable_messages_on_source_routes() {
    let dims = Dims::new(4, 4, 1).unwrap();
    let mut mesh = Mesh::new(dims);
    let n = dims.count() as usize;
    for a in 0..n {
        for b in (0..n).filter(|b| *b != a) {
            let data = format!("{a}->{b}").into_bytes();
            mesh.nodes[a]
                .send(
                    Time::ZERO,
                    Target::Server(dims.coord(b)),
                    9,
                    &data,
                    reliable(),
                )
                .unwrap();
        }
    }
    let mut events = vec![Vec::new(); n];
    mesh.run_until(&mut events, |ev| {
        ev.iter().all(|e| received(e).len() == n - 1)
    });
    for (b, evs) in events.iter().enumerate() {
        let mut got: Vec<String> = received(evs)
            .into_iter()
            .map(|d| String::from_utf8(d).unwrap())
            .collect();
        got.sort();
        let mut want: Vec<String> = (0..n)
            .filter(|a| *a != b)
            .map(|a| format!("{a}->{b}"))
            .collect();
        want.sort();
        assert_eq!(got, want);
    }
    let routed: u64 = mesh
        .nodes
        .iter()
        .map(|n| n.source_stats().routed_sent)
        .sum();
    let forwarded: u64 = mesh.nodes.iter().map(|n| n.source_stats().forwarded).sum();
    let replies: u64 = mesh
        .nodes
        .iter()
        .map(|n| n.source_stats().replies_sent)
        .sum();
    assert!(routed >= (n * (n - 1)) as u64, "{routed}");
    assert!(forwarded > 0 && replies > 0, "{forwarded} {replies}");
    assert!(mesh.drops.is_empty(), "{:?}", mesh.drops);
}

#[test]
fn probes_move_a_flow_off_a_loaded_path() {
    let dims = Dims::new(4, 4, 1).unwrap();
    let mut mesh = Mesh::new(dims);
    let (src, dst) = (Coord::new(0, 0, 0), Coord::new(2, 1, 0));
    let (s, d) = (mesh.idx(src), mesh.idx(dst));
    // Every link reports its figures; the shortest paths' middle servers are busy.
    let busy = LinkLoad {
        tx_bps: 9_000_000_000,
        rx_bps: 9_000_000_000,
        queue_milli: 0,
        capacity_bps: 10_000_000_000,
    };
    let idle = LinkLoad {
        capacity_bps: 10_000_000_000,
        ..LinkLoad::default()
    };
    for (i, node) in mesh.nodes.iter_mut().enumerate() {
        let c = dims.coord(i);
        let hot = c == Coord::new(1, 0, 0) || c == Coord::new(0, 1, 0);
        for dir in Dir::ALL {
            node.set_link_load(dir, if hot { busy } else { idle });
        }
    }
    mesh.nodes[s]
        .send(Time::ZERO, Target::Server(dst), 9, b"first", reliable())
        .unwrap();
    let first = mesh.nodes[s].source_routing().route_to(dst).unwrap();
    assert_eq!(first.len(), 3, "the flow starts on a shortest path");
    let mut events = vec![Vec::new(); mesh.nodes.len()];
    for _ in 0..400 {
        mesh.step(&mut events);
    }
    let now = mesh.nodes[s].source_routing().route_to(dst).unwrap();
    let visited: Vec<Coord> = now.servers(dims, src).collect();
    assert!(
        !visited.contains(&Coord::new(1, 0, 0)) && !visited.contains(&Coord::new(0, 1, 0)),
        "{now:?} crosses a busy server"
    );
    mesh.nodes[s]
        .send(mesh.now, Target::Server(dst), 9, b"second", reliable())
        .unwrap();
    mesh.run_until(&mut events, |ev| received(&ev[d]).len() == 2);
    assert_eq!(
        received(&events[d]),
        vec![b"first".to_vec(), b"second".to_vec()]
    );
}

#[test]
fn a_cut_link_moves_the_flow_before_the_view_changes() {
    let dims = Dims::new(4, 4, 1).unwrap();
    let mut mesh = Mesh::new(dims);
    let (src, dst) = (Coord::new(0, 0, 0), Coord::new(3, 2, 0));
    let (s, d) = (mesh.idx(src), mesh.idx(dst));
    let total = 2000usize;
    let mut events = vec![Vec::new(); mesh.nodes.len()];
    let mut sent = 0usize;
    let mut cut_at = None;
    let mut moved_at = None;
    let mut before = None;
    while received(&events[d]).len() < total {
        while sent < total {
            let mut data = vec![7u8; 1200];
            data[..4].copy_from_slice(&(sent as u32).to_be_bytes());
            match mesh.nodes[s].send(mesh.now, Target::Server(dst), 9, &data, reliable()) {
                Ok(()) => sent += 1,
                Err(_) => break,
            }
        }
        mesh.step(&mut events);
        let got = received(&events[d]).len();
        if cut_at.is_none() && got >= total / 4 {
            // Cut the route's second link, in the middle of the path.
            let r = mesh.nodes[s].source_routing().route_to(dst).unwrap();
            let mid = r.servers(dims, src).next().unwrap();
            mesh.cut(mid, r.dir(1).unwrap());
            before = Some(r);
            cut_at = Some(mesh.now);
        }
        if let (Some(_), None, Some(b)) = (cut_at, moved_at, before) {
            if mesh.nodes[s].source_routing().route_to(dst) != Some(b) {
                moved_at = Some(mesh.now);
            }
        }
        assert!(
            mesh.now < Time::ZERO + Duration::from_secs(10),
            "transfer stuck"
        );
    }
    // Exactly once (the transport orders only fenced messages; the ones lost on the cut
    // link come again later).
    let mut got: Vec<u32> = received(&events[d])
        .iter()
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    got.sort_unstable();
    got.dedup();
    assert_eq!(got.len(), total, "every message exactly once");
    let switch = moved_at.unwrap() - cut_at.unwrap();
    assert!(
        switch <= Duration::from_millis(5),
        "switched after {switch:?}"
    );
    let st = mesh.nodes[s].source_stats();
    assert!(st.bsr.failovers >= 1 && st.bsr.failures >= 1, "{st:?}");
    assert!(mesh.drops.contains(&DropReason::PathFailed));
    let reports: u64 = mesh
        .nodes
        .iter()
        .map(|n| n.source_stats().failures_sent)
        .sum();
    assert!(reports >= 1);
    eprintln!("switched {switch:?} after the cut; {reports} failure reports");
}

#[test]
fn malformed_routes_are_refused_and_counted() {
    let dims = Dims::new(4, 4, 1).unwrap();
    let mut mesh = Mesh::new(dims);
    let mut h = Header::new(
        Kind::Data,
        Coord::new(0, 0, 0),
        Dest::Server(Coord::new(2, 0, 0)),
    );
    h.payload_len = 4;
    h.route_len = 2;
    let mut good = vec![0u8; HEADERS_LEN + 6];
    h.emit(&mut good).unwrap();
    good[HEADERS_LEN] = Dir::PlusX.index();
    good[HEADERS_LEN + 1] = Dir::PlusX.index();
    let mut bad_dir = good.clone();
    bad_dir[HEADERS_LEN + 1] = 9;
    let mut too_long = good.clone();
    too_long[offset::ROUTE_LEN] = 40;
    let mut past_end = good.clone();
    past_end[offset::ROUTE_NEXT] = 3;
    let mut no_flag = good.clone();
    no_flag[offset::FLAGS + 1] &= !(wire::flags::SOURCE_ROUTED as u8);
    no_flag[offset::FLAGS] &= !((wire::flags::SOURCE_ROUTED >> 8) as u8);
    // A route ending elsewhere than the frame's destination.
    let mut wrong_end = good.clone();
    wrong_end[offset::ROUTE_NEXT] = 2;
    let node = &mut mesh.nodes[1]; // (1,0,0)
    for (name, mut f) in [
        ("bad direction", bad_dir),
        ("too long", too_long),
        ("next past the end", past_end),
        ("fields without the flag", no_flag),
        ("ends elsewhere", wrong_end),
    ] {
        let a = node.handle_rx(Time::ZERO, Dir::MinusX, &mut f);
        assert_eq!(a, RxAction::Drop(DropReason::BadRoute), "{name}");
    }
    let mut ok = good.clone();
    assert_eq!(
        node.handle_rx(Time::ZERO, Dir::MinusX, &mut ok),
        RxAction::Forward(DirSet::EMPTY.with(Dir::PlusX))
    );
    assert_eq!(node.source_stats().bad_route, 1);
}

#[test]
fn a_flood_of_probes_is_answered_within_a_bound() {
    use torusnet_proto::routing::probe::{Probe, ProbeKind, PROBE_LEN};
    let dims = Dims::new(4, 4, 1).unwrap();
    let mut mesh = Mesh::new(dims);
    let (src, dst) = (Coord::new(0, 0, 0), Coord::new(1, 0, 0));
    let mut h = Header::new(Kind::Probe, src, Dest::Server(dst));
    h.payload_len = PROBE_LEN as u16;
    let mut f = vec![0u8; HEADERS_LEN + PROBE_LEN];
    h.emit(&mut f).unwrap();
    Probe {
        kind: ProbeKind::Probe,
        path: 0,
        round: 1,
        avail_mbps: 1000,
        flow_dst: dst,
    }
    .emit(&mut f[HEADERS_LEN..])
    .unwrap();
    let node = &mut mesh.nodes[1];
    for _ in 0..10_000 {
        let mut g = f.clone();
        assert_eq!(
            node.handle_rx(Time::ZERO, Dir::MinusX, &mut g),
            RxAction::Consumed
        );
    }
    assert_eq!(
        node.source_stats().replies_sent,
        4096,
        "answers queued at most"
    );
    // A garbage probe payload is ignored.
    let mut g = f.clone();
    g[HEADERS_LEN] = 9;
    assert_eq!(
        node.handle_rx(Time::ZERO, Dir::MinusX, &mut g),
        RxAction::Consumed
    );
}

#[test]
fn only_the_services_chosen_are_source_routed() {
    let dims = Dims::new(4, 4, 1).unwrap();
    let mut mesh = Mesh::new(dims);
    let (src, dst) = (Coord::new(0, 0, 0), Coord::new(2, 1, 0));
    let (s, d) = (mesh.idx(src), mesh.idx(dst));
    mesh.nodes[s].set_source_services(Some(vec![9]));
    for i in 0..200u32 {
        for svc in [9u16, 7] {
            let mut data = vec![1u8; 1200];
            data[..4].copy_from_slice(&i.to_be_bytes());
            mesh.nodes[s]
                .send(Time::ZERO, Target::Server(dst), svc, &data, reliable())
                .unwrap();
        }
    }
    let mut events = vec![Vec::new(); mesh.nodes.len()];
    mesh.run_until(&mut events, |ev| received(&ev[d]).len() == 400);
    let (routed9, plain9) = mesh.sent_by_service[&9];
    let (routed7, plain7) = mesh.sent_by_service[&7];
    assert!(
        routed9 >= 200 && plain9 == 0,
        "service 9: {routed9} routed, {plain9} not"
    );
    assert!(
        routed7 == 0 && plain7 >= 200,
        "service 7: {routed7} routed, {plain7} not"
    );
    // Service 9's frames kept to one path: its source had one route for the peer.
    assert!(mesh.nodes[s].source_routing().route_to(dst).is_some());
}

/// Enabling source routing rebuilds the transport with smaller frames; what the driver set
/// on it before (service queue limits, the hosted services) still applies afterwards.
#[test]
fn settings_made_before_source_routing_survive_it() {
    use std::sync::Arc;
    use torusnet_proto::transport::{FailReason, HostedServices, SendError};
    let dims = Dims::new(3, 1, 1).unwrap();
    let hosted = Arc::new(HostedServices::new());
    hosted.host(7);
    let mut m = Mesh::configured(dims, |n| {
        n.configure_service(7, 1, 1000);
        n.set_hosted(Some(hosted.clone()));
    });
    let to = Target::Server(Coord::new(1, 0, 0));
    let mut accepted = 0;
    let blocked = loop {
        match m.nodes[0].send(m.now, to, 7, &[1u8; 300], reliable()) {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted < 100, "the 1000-byte queue limit was lost");
    };
    assert!(matches!(blocked, SendError::WouldBlock), "{blocked:?}");
    assert!(
        accepted <= 4,
        "{accepted} messages of 300 B in a 1000 B queue"
    );
    let opts = MsgOptions {
        tag: 77,
        ..reliable()
    };
    m.nodes[0]
        .send(m.now, to, 8, b"nobody hosts 8", opts)
        .unwrap();
    let mut events = vec![Vec::new(); 3];
    m.run_until(&mut events, |ev| {
        ev[0].iter().any(|e| matches!(e, Event::Failed { .. }))
            && received(&ev[1]).len() == accepted
    });
    let failed: Vec<_> = events[0]
        .iter()
        .filter_map(|e| match e {
            Event::Failed {
                service,
                tags,
                reason,
                ..
            } => Some((*service, tags.clone(), *reason)),
            _ => None,
        })
        .collect();
    assert_eq!(failed, [(8, vec![77], FailReason::NoService)]);
}
