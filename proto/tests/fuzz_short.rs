//! Short runs of proto's fuzz bodies (fuzz/: `source_route`, `probe`, `control`) on inputs
//! mutated from valid ones, which are also written out as the long runs' seed corpus
//! (`TORUSNET_WRITE_SEEDS=1`). The frame parser's run is `wire_fuzz.rs`.

use std::path::Path;
use std::time::Duration;

use torusnet_proto::control::{self, ControlConfig, ControlNode};
use torusnet_proto::fuzz;
use torusnet_proto::routing::probe::{Probe, ProbeKind, PROBE_LEN};
use torusnet_proto::routing::source::{self, Route};
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims, Dir, DirSet};
use torusnet_proto::wire::{Dest, Header, Kind, HEADERS_LEN, MAX_ROUTE_HOPS};

fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn source_routes() {
    let mut seeds = Vec::new();
    for (k, dirs) in [
        vec![Dir::PlusX],
        vec![Dir::PlusX, Dir::PlusY, Dir::MinusZ],
        vec![Dir::MinusY; MAX_ROUTE_HOPS],
    ]
    .iter()
    .enumerate()
    {
        let route = Route::new(dirs).expect("a route");
        let payload = vec![k as u8; 30];
        let mut h = Header::new(
            Kind::Data,
            Coord::new(0, 0, 0),
            Dest::Server(Coord::new(2, 1, 0)),
        );
        h.payload_len = payload.len() as u16;
        let mut b = vec![0u8; HEADERS_LEN + payload.len() + MAX_ROUTE_HOPS];
        h.emit(&mut b).expect("emit");
        b[HEADERS_LEN..HEADERS_LEN + payload.len()].copy_from_slice(&payload);
        let len = source::insert(&mut b, HEADERS_LEN + payload.len(), &route).expect("insert");
        b.truncate(len);
        seeds.push(b);
    }
    fuzz::write_seeds(workspace(), "source_route", &seeds);
    fuzz::run(&seeds, 200_000, 31, source::check_untrusted);
}

#[test]
fn probes() {
    let seeds: Vec<Vec<u8>> = [
        ProbeKind::Probe,
        ProbeKind::Reply,
        ProbeKind::Failure {
            hop: 3,
            dir: Dir::MinusY,
        },
    ]
    .into_iter()
    .map(|kind| {
        let p = Probe {
            kind,
            path: 2,
            round: 77,
            avail_mbps: 9_000,
            flow_dst: Coord::new(1, 2, 3),
        };
        let mut b = vec![0u8; PROBE_LEN];
        p.emit(&mut b).expect("emit");
        b
    })
    .collect();
    fuzz::write_seeds(workspace(), "probe", &seeds);
    fuzz::run(
        &seeds,
        200_000,
        32,
        torusnet_proto::routing::probe::check_untrusted,
    );
}

/// Frames two neighbouring control planes exchange while they meet, learn their
/// coordinates and flood their records.
fn control_frames() -> Vec<Vec<u8>> {
    let dims = Dims::new(3, 3, 3).expect("dims");
    let mut a_cfg = ControlConfig::new(1, dims, DirSet::ALL);
    a_cfg.origin = true;
    let mut a = ControlNode::new(a_cfg);
    let mut b = ControlNode::new(ControlConfig::new(2, dims, DirSet::ALL));
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut now = Time::ZERO;
    while now < Time::ZERO + Duration::from_secs(3) {
        a.handle_timeout(now);
        b.handle_timeout(now);
        while let Some((d, f)) = a.poll_transmit() {
            if d == Dir::PlusX {
                b.handle_frame(now, Dir::MinusX, &f);
            }
            frames.push(f);
        }
        while let Some((d, f)) = b.poll_transmit() {
            if d == Dir::MinusX {
                a.handle_frame(now, Dir::PlusX, &f);
            }
            frames.push(f);
        }
        while a.poll_event().is_some() {}
        while b.poll_event().is_some() {}
        now = now + Duration::from_millis(10);
    }
    assert!(b.coord().is_some(), "the neighbour learnt its coordinate");
    // One of each length: hellos and records of every size met.
    frames.sort_by_key(Vec::len);
    frames.dedup_by_key(|f| f.len());
    frames
}

#[test]
fn control_planes() {
    let seeds = control_frames();
    assert!(seeds.len() >= 2, "hellos and records: {}", seeds.len());
    fuzz::write_seeds(workspace(), "control", &seeds);
    fuzz::run(&seeds, 30_000, 33, control::check_untrusted);
}
