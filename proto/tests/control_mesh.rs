//! The control plane of whole tori, simulated: coordinates from the wiring plan alone,
//! miswiring reported precisely, link and server failures detected and converged in every
//! server's view within K hello intervals plus flooding.

use std::time::Duration;

use torusnet_proto::control::{ControlConfig, ControlEvent, ControlNode};
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims, Dir};

struct Net {
    nodes: Vec<ControlNode>,
    alive: Vec<bool>,
    /// (node, dir) -> (peer node, peer dir); None: unplugged.
    wire: Vec<[Option<(usize, Dir)>; 6]>,
    now: Time,
}

impl Net {
    fn torus(dims: Dims, origin: Option<usize>) -> Net {
        let n = dims.count() as usize;
        let nodes = (0..n)
            .map(|i| {
                let mut c = ControlConfig::new(100 + i as u64, dims, dims.link_dirs());
                c.origin = origin == Some(i);
                ControlNode::new(c)
            })
            .collect();
        let wire = (0..n)
            .map(|i| {
                let mut w = [None; 6];
                for d in dims.link_dirs().iter() {
                    let j = dims.index(dims.neighbor(dims.coord(i), d));
                    w[usize::from(d.index())] = Some((j, d.opposite()));
                }
                w
            })
            .collect();
        Net {
            nodes,
            alive: vec![true; n],
            wire,
            now: Time::ZERO,
        }
    }

    fn step(&mut self, dt: Duration) -> Vec<(usize, ControlEvent)> {
        let mut events = Vec::new();
        let mut frames = Vec::new();
        for (i, node) in self.nodes.iter_mut().enumerate() {
            if !self.alive[i] {
                continue;
            }
            if node.poll_timeout().is_some_and(|t| t <= self.now) {
                node.handle_timeout(self.now);
            }
            while let Some((d, mut f)) = node.poll_transmit() {
                // The driver sets the source MAC: here, the node index.
                f[6..12].copy_from_slice(&(i as u64).to_be_bytes()[2..]);
                if let Some((j, pd)) = self.wire[i][usize::from(d.index())] {
                    frames.push((j, pd, f));
                }
            }
            while let Some(e) = node.poll_event() {
                events.push((i, e));
            }
        }
        for (j, pd, f) in frames {
            if self.alive[j] {
                self.nodes[j].handle_frame(self.now, pd, &f);
            }
        }
        self.now = self.now + dt;
        events
    }

    fn run(&mut self, d: Duration) -> Vec<(usize, ControlEvent)> {
        let mut all = Vec::new();
        let end = self.now + d;
        while self.now < end {
            all.extend(self.step(Duration::from_millis(5)));
        }
        all
    }

    fn cut(&mut self, i: usize, d: Dir) {
        if let Some((j, pd)) = self.wire[i][usize::from(d.index())].take() {
            self.wire[j][usize::from(pd.index())] = None;
        }
    }
}

#[test]
fn coordinates_from_the_wiring_plan_alone() {
    for (dims, origin) in [
        (Dims::new(3, 3, 3).unwrap(), Some(0)),
        (Dims::new(3, 3, 3).unwrap(), None),
        (Dims::new(4, 2, 1).unwrap(), None),
    ] {
        let mut net = Net::torus(dims, origin);
        // Long enough for records to be refreshed (and not age out) several times.
        net.run(Duration::from_secs(10));
        for (i, n) in net.nodes.iter().enumerate() {
            assert_eq!(n.coord(), Some(dims.coord(i)), "{dims} node {i}");
            let (_, view) = n.view().expect("a view");
            for c in dims.coords() {
                assert_eq!(
                    view.live_dirs(c),
                    dims.link_dirs(),
                    "{dims}: {c} seen from node {i}"
                );
            }
        }
    }
}

#[test]
fn miswiring_is_reported_with_the_link_and_what_was_seen() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let mut net = Net::torus(dims, Some(0));
    // Plug node 0's +x cable into node 1's +y port instead of its -x port.
    let (a, b) = (0usize, 1usize);
    let old_b = net.wire[b][usize::from(Dir::PlusY.index())].take();
    if let Some((c, cd)) = old_b {
        net.wire[c][usize::from(cd.index())] = None;
    }
    net.wire[b][usize::from(Dir::MinusX.index())] = None;
    net.wire[a][usize::from(Dir::PlusX.index())] = Some((b, Dir::PlusY));
    net.wire[b][usize::from(Dir::PlusY.index())] = Some((a, Dir::PlusX));
    let events = net.run(Duration::from_secs(3));
    let report = events
        .iter()
        .find_map(|(i, e)| match e {
            ControlEvent::Miswired { dir, detail } if *i == a && *dir == Dir::PlusX => {
                Some(detail.clone())
            }
            _ => None,
        })
        .expect("node 0 reports its +x link");
    assert!(
        report.contains("expected the neighbour to call this link -x, it calls it +y"),
        "{report}"
    );
    assert!(
        !net.nodes[a].link(Dir::PlusX).up,
        "a miswired link is not used"
    );
}

/// Time until every live server's view satisfies `ok`.
fn converge(net: &mut Net, ok: impl Fn(&torusnet_proto::routing::LinkView) -> bool) -> Duration {
    let start = net.now;
    for _ in 0..2000 {
        net.step(Duration::from_millis(1));
        let done = net
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| net.alive[*i])
            .all(|(_, n)| n.view().is_some_and(|(_, v)| ok(v)));
        if done {
            return net.now.since(start);
        }
    }
    panic!("no convergence in 2 s");
}

#[test]
fn failures_converge_within_k_hellos_plus_flooding() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let mut net = Net::torus(dims, Some(0));
    net.run(Duration::from_secs(2));
    let bound = Duration::from_millis(100) * 4 + Duration::from_millis(50);

    let a = Coord::new(1, 1, 1);
    net.cut(dims.index(a), Dir::PlusY);
    let t_link = converge(&mut net, |v| !v.live_dirs(a).contains(Dir::PlusY));
    assert!(t_link <= bound, "link cut converged in {t_link:?}");

    let dead = Coord::new(2, 0, 1);
    net.alive[dims.index(dead)] = false;
    let t_server = converge(&mut net, |v| {
        dims.link_dirs()
            .iter()
            .all(|d| !v.live_dirs(dims.neighbor(dead, d)).contains(d.opposite()))
    });
    assert!(t_server <= bound, "server death converged in {t_server:?}");
    eprintln!("3x3x3: link cut converged in {t_link:?}, server death in {t_server:?} (hello 100 ms, K = 3)");
}

#[test]
fn a_cluster_key_keeps_an_impostor_out() {
    let dims = Dims::new(3, 1, 1).unwrap();
    let mut net = Net::torus(dims, Some(0));
    let key = b"cluster secret".to_vec();
    for (i, n) in net.nodes.iter_mut().enumerate() {
        let mut c = ControlConfig::new(100 + i as u64, dims, dims.link_dirs());
        c.origin = i == 0;
        // Server 2 does not know the key: an impostor on the cable.
        c.key = (i != 2).then(|| key.clone());
        *n = ControlNode::new(c);
    }
    let events = net.run(Duration::from_secs(3));
    let refused = events
        .iter()
        .filter(|(i, e)| {
            *i != 2 && matches!(e, ControlEvent::Refused(why) if why.contains("unauthenticated"))
        })
        .count();
    assert!(refused > 0, "frames without the key are refused");
    assert_eq!(net.nodes[1].coord(), Some(Coord::new(1, 0, 0)));
    let (_, v) = net.nodes[0].view().unwrap();
    assert!(!v.is_up(Coord::new(2, 0, 0)), "and is not in anyone's view");
}

#[test]
fn a_rejoining_server_takes_its_keys_at_one_instant_everyone_knows() {
    let dims = Dims::new(3, 3, 1).unwrap();
    let mut net = Net::torus(dims, Some(0));
    net.run(Duration::from_secs(2));
    let x = 4;
    let xc = dims.coord(x);
    net.alive[x] = false;
    net.run(Duration::from_secs(1));
    assert!(net
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != x)
        .all(|(_, n)| n.view().is_some_and(|(_, v)| v.live_dirs(xc).is_empty())));
    // Restarted: a fresh control plane with its persisted coordinate, a newer incarnation.
    let mut c = ControlConfig::new(100 + x as u64, dims, dims.link_dirs());
    c.coord = Some(xc);
    c.incarnation = 1 << 40;
    net.nodes[x] = ControlNode::new(c);
    net.alive[x] = true;
    let mut active_at = None;
    let start = net.now;
    // Every live view says "joining" (reachable, no keys) from when it learns of the
    // return until the announced instant, then "taking keys": nobody flips early or late.
    while net.now.since(start) < Duration::from_secs(2) {
        // The nodes acted at `t`; the clock has moved on by the step.
        let t = net.now;
        net.step(Duration::from_millis(1));
        if active_at.is_none() {
            active_at = net.nodes[x].active_at();
        }
        for (i, n) in net.nodes.iter().enumerate() {
            let Some((_, v)) = n.view() else { continue };
            if v.live_dirs(xc).is_empty() {
                // Not (yet) reachable in this view; and a server cut off takes no keys.
                assert!(i != x || v.is_joining(xc));
                continue;
            }
            let a = active_at.expect("reachable only once it announced when it takes keys");
            assert_eq!(
                v.is_joining(xc),
                t < a,
                "server {i} at {t:?}, take-over at {a:?}"
            );
        }
    }
    let a = active_at.expect("rejoined");
    assert!(a.since(start) >= Duration::from_millis(200));
    assert!(net.nodes.iter().all(|n| n
        .view()
        .is_some_and(|(_, v)| !v.is_joining(xc) && !v.live_dirs(xc).is_empty())));
}
