//! An independent brute-force model of docs/keyspace.md, written from the spec's text with
//! none of the crate's code: plain tuples, full candidate sequences built with linear
//! searches, and breadth-first searches over an explicit adjacency list. Slow and obvious,
//! so that the real implementation can be checked against it.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet, VecDeque};

pub type C = (u32, u32, u32);

/// Home server and index of routing key `k` in a torus `d`.
pub fn home(d: C, k: u64) -> (C, u64) {
    let x = (((k >> 48) & 0xFFFF) * d.0 as u64) >> 16;
    let y = (((k >> 32) & 0xFFFF) * d.1 as u64) >> 16;
    let z = (((k >> 16) & 0xFFFF) * d.2 as u64) >> 16;
    ((x as u32, y as u32, z as u32), (k & 0xFFFF) % 48)
}

fn step(d: C, s: C, axis: usize, plus: bool) -> C {
    let dims = [d.0, d.1, d.2];
    let mut v = [s.0, s.1, s.2];
    v[axis] = if plus {
        (v[axis] + 1) % dims[axis]
    } else {
        (v[axis] + dims[axis] - 1) % dims[axis]
    };
    (v[0], v[1], v[2])
}

/// The whole candidate sequence, exactly as the spec words it.
pub fn candidates(d: C, k: u64) -> Vec<C> {
    let (h, i) = home(d, k);
    let f = i % 8;
    let o = i / 8;
    let perms = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    let order = perms[o as usize];
    let mut c = vec![h];
    let mut taken = 0;
    while taken < c.len() {
        let s = c[taken];
        taken += 1;
        for &a in &order {
            let plus = (f >> a) & 1 == 0;
            let n = step(d, s, a, plus);
            if !c.contains(&n) {
                c.push(n);
            }
        }
    }
    c
}

/// GetServersForKey with `down` servers failed and every other server reachable.
pub fn servers_for_key(d: C, k: u64, r: usize, down: &HashSet<C>) -> Vec<C> {
    candidates(d, k)
        .into_iter()
        .filter(|c| !down.contains(c))
        .take(r)
        .collect()
}

/// Every server of the torus.
pub fn all(d: C) -> Vec<C> {
    let mut v = Vec::new();
    for z in 0..d.2 {
        for y in 0..d.1 {
            for x in 0..d.0 {
                v.push((x, y, z));
            }
        }
    }
    v
}

/// Live adjacency: (server, direction 0..5) -> neighbour, for up servers and live links.
pub fn adjacency(
    d: C,
    down: &HashSet<C>,
    down_links: &HashSet<(C, usize)>,
) -> HashMap<C, Vec<(usize, C)>> {
    let dims = [d.0, d.1, d.2];
    let mut adj = HashMap::new();
    for s in all(d) {
        let mut v = Vec::new();
        for dir in 0..6usize {
            let axis = dir / 2;
            if dims[axis] < 2 {
                continue;
            }
            let n = step(d, s, axis, dir % 2 == 0);
            let back = dir ^ 1;
            if down.contains(&s) || down.contains(&n) {
                continue;
            }
            if down_links.contains(&(s, dir)) || down_links.contains(&(n, back)) {
                continue;
            }
            v.push((dir, n));
        }
        adj.insert(s, v);
    }
    adj
}

/// Hop counts from `src` over the adjacency (absent = unreachable).
pub fn bfs(adj: &HashMap<C, Vec<(usize, C)>>, src: C, down: &HashSet<C>) -> HashMap<C, u32> {
    let mut dist = HashMap::new();
    if down.contains(&src) {
        return dist;
    }
    dist.insert(src, 0);
    let mut q = VecDeque::from([src]);
    while let Some(s) = q.pop_front() {
        let ds = dist[&s];
        for &(_, n) in &adj[&s] {
            if let std::collections::hash_map::Entry::Vacant(e) = dist.entry(n) {
                e.insert(ds + 1);
                q.push_back(n);
            }
        }
    }
    dist
}

/// Distance and next-hop directions (sorted 0..5) from `a` to `b`.
pub fn route(
    d: C,
    a: C,
    b: C,
    down: &HashSet<C>,
    down_links: &HashSet<(C, usize)>,
) -> (Option<u32>, Vec<usize>) {
    let adj = adjacency(d, down, down_links);
    let from_b = bfs(&adj, b, down);
    let Some(&dab) = from_b.get(&a) else {
        return (None, vec![]);
    };
    let mut hops: Vec<usize> = adj[&a]
        .iter()
        .filter(|(_, n)| dab > 0 && from_b.get(n) == Some(&(dab - 1)))
        .map(|(dir, _)| *dir)
        .collect();
    hops.sort();
    hops.dedup();
    (Some(dab), hops)
}
