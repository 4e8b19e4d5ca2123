//! Property tests of the keyspace and routing against the brute-force model in `model/`,
//! and the spec's guarantees G1 and G2.

mod model;

use std::collections::HashSet;

use proptest::prelude::*;
use torusnet_proto::keyspace::{get_servers_for_key, KeyPlacement};
use torusnet_proto::routing::{LinkView, RouteTable};
use torusnet_proto::topology::{Coord, Dims, Dir};

fn dims_strategy() -> impl Strategy<Value = (u16, u16, u16)> {
    prop_oneof![(1u16..7, 1u16..7, 1u16..7), (1u16..9, 1u16..9, Just(1u16))]
}

fn to_c(c: Coord) -> model::C {
    (c.x.into(), c.y.into(), c.z.into())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The implementation's GetServersForKey equals the model's, under random failures.
    #[test]
    fn servers_for_key_match_model(
        (x, y, z) in dims_strategy(),
        k in any::<u64>(),
        r in 0usize..12,
        down_seeds in proptest::collection::vec(any::<u32>(), 0..10),
    ) {
        let dims = Dims::new(x, y, z).unwrap();
        let n = dims.count() as u32;
        let down: HashSet<Coord> = down_seeds.iter().map(|s| dims.coord((s % n) as usize)).collect();
        let got = get_servers_for_key(dims, k, r, |c| !down.contains(&c));
        let mdown: HashSet<model::C> = down.iter().map(|c| to_c(*c)).collect();
        let want = model::servers_for_key((x.into(), y.into(), z.into()), k, r, &mdown);
        prop_assert_eq!(got.into_iter().map(to_c).collect::<Vec<_>>(), want);
        let p = KeyPlacement::new(dims, k);
        let (mh, mi) = model::home((x.into(), y.into(), z.into()), k);
        prop_assert_eq!((to_c(p.home), u64::from(p.index)), (mh, mi));
    }

    /// G1: while at least one server is reachable, every key has a root, and it is the
    /// first reachable candidate.
    #[test]
    fn g1_every_key_has_a_root(
        (x, y, z) in dims_strategy(),
        keys in proptest::collection::vec(any::<u64>(), 1..20),
        survivor in any::<u32>(),
        fail_frac in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        let dims = Dims::new(x, y, z).unwrap();
        let n = dims.count() as usize;
        let keep = dims.coord(survivor as usize % n);
        let mut rng = torusnet_proto::rng::SplitMix64::new(seed);
        let down: HashSet<Coord> = dims.coords().filter(|c| *c != keep && rng.chance(fail_frac)).collect();
        for k in keys {
            let root = torusnet_proto::keyspace::root(dims, k, |c| !down.contains(&c));
            prop_assert!(root.is_some());
            prop_assert!(!down.contains(&root.unwrap()));
        }
    }

    /// RouteTable and the direct search agree with the model on random views.
    #[test]
    fn routes_match_model(
        (x, y, z) in dims_strategy(),
        down_seeds in proptest::collection::vec(any::<u32>(), 0..4),
        link_seeds in proptest::collection::vec((any::<u32>(), 0u8..6), 0..12),
        from_seed in any::<u32>(),
    ) {
        let dims = Dims::new(x, y, z).unwrap();
        let n = dims.count() as u32;
        let md = (x.into(), y.into(), z.into());
        let mut view = LinkView::all_up(dims).unwrap();
        let mut mdown = HashSet::new();
        let mut mlinks = HashSet::new();
        for s in &down_seeds {
            let c = dims.coord((s % n) as usize);
            view.set_server(c, false).unwrap();
            mdown.insert(to_c(c));
        }
        for (s, d) in &link_seeds {
            let c = dims.coord((s % n) as usize);
            let dir = Dir::from_index(*d).unwrap();
            view.set_link(c, dir, false).unwrap();
            mlinks.insert((to_c(c), usize::from(*d)));
        }
        let from = dims.coord((from_seed % n) as usize);
        let table = RouteTable::new(&view, from).unwrap();
        for to in dims.coords() {
            let (md_dist, m_hops) = model::route(md, to_c(from), to_c(to), &mdown, &mlinks);
            let hops: Vec<usize> = table.next_hops(to).iter().map(|d| usize::from(d.index())).collect();
            prop_assert_eq!(table.distance(to), md_dist, "distance {} -> {}", from, to);
            prop_assert_eq!(&hops, &m_hops, "next hops {} -> {}", from, to);
            let (dd, dh) = view.route(from, to).unwrap();
            prop_assert_eq!(dd, md_dist);
            prop_assert_eq!(dh, table.next_hops(to));
        }
    }
}

/// Builds a routing key with the given home and index (the smallest 16-bit field values
/// that scale to each coordinate).
fn rk_for(dims: Dims, home: Coord, index: u16) -> u64 {
    let inv = |c: u16, n: u16| (u32::from(c) << 16).div_ceil(u32::from(n)) as u64;
    inv(home.x, dims.x()) << 48
        | inv(home.y, dims.y()) << 32
        | inv(home.z, dims.z()) << 16
        | u64::from(index)
}

/// G2, exactly: over the 48 facet/order indices, a failed home's keys land on each of its
/// one-hop neighbours equally often: 8 each of 6 in 3D, 12 each of 4 in 2D.
#[test]
fn g2_failed_home_spreads_evenly_exact() {
    for (dims, per) in [
        (Dims::new(4, 5, 3).unwrap(), 8),
        (Dims::new(5, 4, 1).unwrap(), 12),
    ] {
        for home in dims.coords() {
            let mut counts = std::collections::HashMap::new();
            for i in 0..48u16 {
                let k = rk_for(dims, home, i);
                assert_eq!(KeyPlacement::new(dims, k).home, home);
                let root = torusnet_proto::keyspace::root(dims, k, |c| c != home).unwrap();
                *counts.entry(root).or_insert(0) += 1;
            }
            let nbrs: HashSet<Coord> = dims
                .link_dirs()
                .iter()
                .map(|d| dims.neighbor(home, d))
                .collect();
            assert_eq!(counts.len(), nbrs.len(), "{dims} {home}");
            for (c, n) in counts {
                assert!(nbrs.contains(&c));
                assert_eq!(n, per, "{dims} home {home} -> {c}");
            }
        }
    }
}

/// G2, statistically, on SHA-1 keys of strings: when a server of a 3x3x3 torus fails, the
/// keys it rooted move to its six neighbours about 1/6 each, and no other key moves.
#[test]
fn g2_failed_home_spreads_evenly_sha1_keys() {
    let dims = Dims::new(3, 3, 3).unwrap();
    let failed = Coord::new(1, 1, 1);
    let nbrs: HashSet<Coord> = Dir::ALL.iter().map(|d| dims.neighbor(failed, *d)).collect();
    let mut moved = std::collections::HashMap::new();
    let mut total = 0;
    for i in 0..300_000 {
        let k = torusnet_proto::Key::from_string(&format!("key-{i}")).routing_key();
        let before = torusnet_proto::keyspace::root(dims, k, |_| true).unwrap();
        let after = torusnet_proto::keyspace::root(dims, k, |c| c != failed).unwrap();
        if before == failed {
            assert!(nbrs.contains(&after));
            *moved.entry(after).or_insert(0u32) += 1;
            total += 1;
        } else {
            assert_eq!(before, after, "a key not rooted at the failed server moved");
        }
    }
    let expect = total as f64 / 6.0;
    for (c, n) in moved {
        let dev = (f64::from(n) - expect).abs() / expect;
        assert!(
            dev < 0.06,
            "neighbour {c} got {n} of {total} keys (expected ~{expect:.0})"
        );
    }
}
