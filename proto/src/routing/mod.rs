//! Shortest-path routing over the live links of a link-state view (docs/keyspace.md,
//! "Shortest-path routing").
//!
//! A [`LinkView`] says which servers and links are up. A [`RouteTable`] is one server's
//! answer to "which of my links lead closer to D?" for every D, computed once per view
//! change so that the per-frame query is one table load.

pub mod bsr;
pub mod load;
pub mod paths;
pub mod probe;
pub mod source;
pub mod source_router;
pub mod transit;

use crate::keyspace;
use crate::topology::{Axis, Coord, Dims, Dir, DirSet};

/// Why a view or route table could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutingError {
    /// Per-server tables would not fit in memory for a torus this large.
    #[error("a {0} torus has too many servers for routing tables (at most {MAX_SERVERS})")]
    TooLarge(Dims),
    /// The coordinate does not lie inside the torus.
    #[error("coordinate {0} is outside the torus")]
    OutOfRange(Coord),
}

/// Largest torus (in servers) that a view can describe: 2^24, far above any rack.
pub const MAX_SERVERS: u64 = 1 << 24;

/// Distance meaning "unreachable" in distance tables.
pub const UNREACHABLE: u32 = u32::MAX;

/// A link-state view of the whole torus: which servers are up and which links are live.
///
/// Links are undirected: a link is live only when both of its ends say so and both
/// servers are up, so the view is symmetric by construction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkView {
    dims: Dims,
    /// Per server: bit d set when the link in direction d is live. Shared by copies until
    /// one changes (every engine of a simulated torus holds a copy of the same view).
    live: std::sync::Arc<Vec<u8>>,
    /// Per server: whether it is up (shared like `live`).
    up: std::sync::Arc<Vec<bool>>,
    /// Servers (dense indices, sorted) that are up and relay traffic but do not yet take
    /// keys: they (re)joined and take over their keys at an instant every server agrees on
    /// (see [`crate::control`]), so no key has two roots while the news spreads. Rarely
    /// more than a few, so a list.
    joining: Vec<u32>,
    /// Per server: the dense index of its neighbour in each direction. Fixed by the torus,
    /// so shared by every copy of the view; searches read it instead of doing coordinate
    /// arithmetic per visit.
    neighbors: std::sync::Arc<Vec<[u32; 6]>>,
}

impl LinkView {
    /// A view of `dims` with every server up and every link live.
    pub fn all_up(dims: Dims) -> Result<LinkView, RoutingError> {
        if dims.count() > MAX_SERVERS {
            return Err(RoutingError::TooLarge(dims));
        }
        let n = dims.count() as usize;
        let neighbors = dims
            .coords()
            .enumerate()
            .map(|(i, c)| Dir::ALL.map(|d| dims.neighbor_index(i, c, d) as u32))
            .collect();
        Ok(LinkView {
            dims,
            live: std::sync::Arc::new(vec![dims.link_dirs().bits(); n]),
            up: std::sync::Arc::new(vec![true; n]),
            joining: Vec::new(),
            neighbors: std::sync::Arc::new(neighbors),
        })
    }

    /// The torus this view describes.
    pub fn dims(&self) -> Dims {
        self.dims
    }

    fn idx(&self, c: Coord) -> Result<usize, RoutingError> {
        if self.dims.contains(c) {
            Ok(self.dims.index(c))
        } else {
            Err(RoutingError::OutOfRange(c))
        }
    }

    /// Marks the link from `c` along `dir` (and so the same link seen from the other end)
    /// live or down. Links along an axis of size 1 do not exist and stay down.
    pub fn set_link(&mut self, c: Coord, dir: Dir, live: bool) -> Result<(), RoutingError> {
        let a = self.idx(c)?;
        if !self.dims.has_links(dir) {
            return Ok(());
        }
        let b = self.dims.index(self.dims.neighbor(c, dir));
        let (ba, bb) = (1u8 << dir.index(), 1u8 << dir.opposite().index());
        let l = std::sync::Arc::make_mut(&mut self.live);
        if live {
            l[a] |= ba;
            l[b] |= bb;
        } else {
            l[a] &= !ba;
            l[b] &= !bb;
        }
        Ok(())
    }

    /// Marks server `c` up or down. A down server is unreachable and relays nothing; its
    /// links keep their own state, so they are usable again as soon as it comes back.
    pub fn set_server(&mut self, c: Coord, up: bool) -> Result<(), RoutingError> {
        let i = self.idx(c)?;
        if self.up[i] != up {
            std::sync::Arc::make_mut(&mut self.up)[i] = up;
        }
        Ok(())
    }

    /// The view a link-state database describes, on this view's torus: server `i` is up
    /// when `advertised[i]` is `Some` (it has a record), and a link is live when the
    /// records of both its ends list it. One pass over the neighbour table, which a copy
    /// of this view shares.
    pub fn from_advertised(&self, advertised: &[Option<DirSet>]) -> LinkView {
        let n = self.up.len();
        let (mut live, mut up) = (vec![0; n], vec![false; n]);
        let exists = self.dims.link_dirs().bits();
        for i in 0..n {
            let Some(mine) = advertised.get(i).copied().flatten() else {
                continue;
            };
            up[i] = true;
            let mut bits = 0u8;
            for d in DirSet::from_bits(mine.bits() & exists).iter() {
                let j = self.neighbors[i][usize::from(d.index())] as usize;
                let theirs = advertised.get(j).copied().flatten();
                if theirs.is_some_and(|o| o.contains(d.opposite())) {
                    bits |= 1 << d.index();
                }
            }
            live[i] = bits;
        }
        LinkView {
            dims: self.dims,
            live: std::sync::Arc::new(live),
            up: std::sync::Arc::new(up),
            joining: Vec::new(),
            neighbors: self.neighbors.clone(),
        }
    }

    /// Whether every server is up, every link of the torus live and nobody joining: then
    /// shortest paths follow from coordinates alone and need no table.
    pub fn is_full(&self) -> bool {
        let all = self.dims.link_dirs().bits();
        self.joining.is_empty() && self.up.iter().all(|u| *u) && self.live.iter().all(|l| *l == all)
    }

    /// Marks server `c` as joining (it relays but takes no keys yet) or as taking keys.
    pub fn set_joining(&mut self, c: Coord, joining: bool) -> Result<(), RoutingError> {
        let i = self.idx(c)? as u32;
        match (self.joining.binary_search(&i), joining) {
            (Err(at), true) => self.joining.insert(at, i),
            (Ok(at), false) => {
                self.joining.remove(at);
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether server `c` is joining: reachable, but not yet the root of any key.
    pub fn is_joining(&self, c: Coord) -> bool {
        self.idx(c)
            .is_ok_and(|i| self.joining.binary_search(&(i as u32)).is_ok())
    }

    /// The joining servers.
    pub fn joining(&self) -> impl Iterator<Item = Coord> + '_ {
        self.joining.iter().map(|i| self.dims.coord(*i as usize))
    }

    /// Whether server `c` is up (false outside the torus).
    pub fn is_up(&self, c: Coord) -> bool {
        self.idx(c).map(|i| self.up[i]).unwrap_or(false)
    }

    /// The live links of server `c`: those marked live whose both ends are up.
    pub fn live_dirs(&self, c: Coord) -> DirSet {
        let Ok(i) = self.idx(c) else {
            return DirSet::EMPTY;
        };
        self.live_dirs_at(i)
    }

    fn live_dirs_at(&self, i: usize) -> DirSet {
        if !self.up[i] {
            return DirSet::EMPTY;
        }
        DirSet::from_bits(self.live[i])
            .iter()
            .filter(|d| self.up[self.neighbors[i][usize::from(d.index())] as usize])
            .collect()
    }

    /// Hop counts from `from` to every server over live links, indexed densely
    /// ([`Dims::index`]); [`UNREACHABLE`] where there is no path. All unreachable when
    /// `from` itself is down.
    pub fn distances_from(&self, from: Coord) -> Result<Vec<u32>, RoutingError> {
        let mut dist = Vec::new();
        let mut queue = Vec::new();
        self.bfs(self.idx(from)?, &mut dist, &mut queue);
        Ok(dist)
    }

    /// Breadth-first search from dense index `src` into `dist`, reusing `queue`.
    fn bfs(&self, src: usize, dist: &mut Vec<u32>, queue: &mut Vec<u32>) {
        dist.clear();
        dist.resize(self.up.len(), UNREACHABLE);
        queue.clear();
        if !self.up[src] {
            return;
        }
        dist[src] = 0;
        queue.push(src as u32);
        let mut head = 0;
        while let Some(&i) = queue.get(head) {
            head += 1;
            let i = i as usize;
            let next = dist[i] + 1;
            let live = self.live[i];
            for (d, &j) in self.neighbors[i].iter().enumerate() {
                let j = j as usize;
                if live & (1 << d) != 0 && self.up[j] && dist[j] == UNREACHABLE {
                    dist[j] = next;
                    queue.push(j as u32);
                }
            }
        }
    }

    /// The next-hop set from `from` towards `to` and the distance, computed directly (one
    /// search from `to`). For repeated queries from one server use a [`RouteTable`].
    pub fn route(&self, from: Coord, to: Coord) -> Result<(Option<u32>, DirSet), RoutingError> {
        let fi = self.idx(from)?;
        let dist = self.distances_from(to)?;
        let d = dist[fi];
        if d == UNREACHABLE {
            return Ok((None, DirSet::EMPTY));
        }
        let hops = self
            .live_dirs_at(fi)
            .iter()
            .filter(|dir| {
                let n = self.dims.index(self.dims.neighbor(from, *dir));
                d > 0 && dist[n] == d - 1
            })
            .collect();
        Ok((Some(d), hops))
    }
}

/// One server's routing table under one view: distance and next-hop set towards every
/// server, so that a query is a single indexed load.
#[derive(Debug, Clone)]
pub struct RouteTable {
    dims: Dims,
    local: Coord,
    dist: Vec<u32>,
    hops: Vec<DirSet>,
    /// The view's joining servers (dense indices, sorted).
    joining: Vec<u32>,
    /// The view was full ([`LinkView::is_full`]): distances and next hops are computed from
    /// coordinates and the tables are empty. A simulated torus of 32768 engines could not
    /// hold 5 bytes per server per server, nor afford a search per engine and neighbour.
    full: bool,
}

impl RouteTable {
    /// The table of server `local` under `view`.
    pub fn new(view: &LinkView, local: Coord) -> Result<RouteTable, RoutingError> {
        view.idx(local)?;
        let mut t = RouteTable {
            dims: view.dims,
            local,
            dist: Vec::new(),
            hops: Vec::new(),
            joining: Vec::new(),
            full: false,
        };
        t.absorb(view);
        Ok(t)
    }

    /// Recomputes the table for a changed view of the same torus: one search from this
    /// server and one from each distinct live neighbour.
    pub fn absorb(&mut self, view: &LinkView) {
        debug_assert_eq!(view.dims, self.dims);
        let n = self.dims.count() as usize;
        let li = self.dims.index(self.local);
        self.joining.clone_from(&view.joining);
        self.full = view.is_full();
        if self.full {
            self.dist = Vec::new();
            self.hops = Vec::new();
            return;
        }
        // Search space is temporary: kept per table it cost 8 bytes per server per server,
        // which a simulated torus of thousands of engines could not afford.
        let (mut scratch_dist, mut scratch_queue) = (Vec::new(), Vec::new());
        view.bfs(li, &mut self.dist, &mut scratch_queue);
        self.hops.clear();
        self.hops.resize(n, DirSet::EMPTY);
        let live = view.live_dirs_at(li);
        let mut done = DirSet::EMPTY;
        for dir in live.iter() {
            if done.contains(dir) {
                continue;
            }
            let nb = self.dims.neighbor(self.local, dir);
            // In a torus of size 2 along an axis, +a and -a reach the same neighbour.
            let same: DirSet = live
                .iter()
                .filter(|d| self.dims.neighbor(self.local, *d) == nb)
                .collect();
            done = done.union(same);
            view.bfs(self.dims.index(nb), &mut scratch_dist, &mut scratch_queue);
            for ((h, &d), &dn) in self.hops.iter_mut().zip(&self.dist).zip(&scratch_dist) {
                if d != UNREACHABLE && d > 0 && dn == d - 1 {
                    *h = h.union(same);
                }
            }
        }
    }

    /// The server this table belongs to.
    pub fn local(&self) -> Coord {
        self.local
    }

    /// The torus this table routes in.
    pub fn dims(&self) -> Dims {
        self.dims
    }

    /// Links of this server that lie on a shortest path to `dst`: empty when `dst` is
    /// unreachable, outside the torus, or this server itself.
    #[inline]
    pub fn next_hops(&self, dst: Coord) -> DirSet {
        if !self.dims.contains(dst) {
            return DirSet::EMPTY;
        }
        if self.full {
            return self.full_route(dst).1;
        }
        self.hops[self.dims.index(dst)]
    }

    /// Distance and next hops in a full torus: along each axis, the shorter way round (both
    /// ways when they tie, as on an even ring at half the way).
    #[inline]
    fn full_route(&self, dst: Coord) -> (u32, DirSet) {
        let mut dist = 0;
        let mut hops = DirSet::EMPTY;
        for axis in Axis::ALL {
            let k = u32::from(self.dims.along(axis));
            let (a, b) = (
                u32::from(self.local.along(axis)),
                u32::from(dst.along(axis)),
            );
            // Both below k: a subtraction, not a division (six of which were most of a
            // hop's routing; a hop in a simulated torus of thousands does little else).
            let fwd = if b >= a { b - a } else { b + k - a };
            let back = if fwd == 0 { 0 } else { k - fwd };
            dist += fwd.min(back);
            if fwd != 0 && fwd <= back {
                hops = hops.with(Dir::new(axis, true));
            }
            if back != 0 && back <= fwd {
                hops = hops.with(Dir::new(axis, false));
            }
        }
        (dist, hops)
    }

    /// Hop count to `dst` over live links, `None` when unreachable.
    #[inline]
    pub fn distance(&self, dst: Coord) -> Option<u32> {
        if !self.dims.contains(dst) {
            return None;
        }
        if self.full {
            return Some(self.full_route(dst).0);
        }
        let d = self.dist[self.dims.index(dst)];
        (d != UNREACHABLE).then_some(d)
    }

    /// Whether `dst` is reachable from this server in the absorbed view.
    #[inline]
    pub fn is_reachable(&self, dst: Coord) -> bool {
        self.distance(dst).is_some()
    }

    /// Whether `c` may be the root of keys in this server's view: reachable and not
    /// joining.
    #[inline]
    pub fn takes_keys(&self, c: Coord) -> bool {
        self.is_reachable(c)
            && (self.joining.is_empty()
                || self
                    .joining
                    .binary_search(&(self.dims.index(c) as u32))
                    .is_err())
    }

    /// The root of routing key `k` in this server's view.
    #[inline]
    pub fn key_root(&self, routing_key: u64) -> Option<Coord> {
        keyspace::root(self.dims, routing_key, |c| self.takes_keys(c))
    }

    /// Where a frame for routing key `k` goes from here: its root and the next-hop set
    /// towards it (empty when the root is this server or there is none).
    #[inline]
    pub fn route_key(&self, routing_key: u64) -> Option<(Coord, DirSet)> {
        let root = self.key_root(routing_key)?;
        Some((root, self.next_hops(root)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_from_advertised_links_is_the_one_built_link_by_link() {
        let mut rng = crate::rng::SplitMix64::new(5);
        for dims in [Dims::new(4, 4, 2).unwrap(), Dims::new(2, 3, 1).unwrap()] {
            let base = LinkView::all_up(dims).unwrap();
            for _ in 0..50 {
                let adv: Vec<Option<DirSet>> = dims
                    .coords()
                    .map(|_| (rng.below(5) != 0).then(|| DirSet::from_bits(rng.below(64) as u8)))
                    .collect();
                let mut want = LinkView::all_up(dims).unwrap();
                for c in dims.coords() {
                    let mine = adv[dims.index(c)];
                    if mine.is_none() {
                        want.set_server(c, false).unwrap();
                    }
                    for d in dims.link_dirs().iter() {
                        let other = adv[dims.index(dims.neighbor(c, d))];
                        if !(mine.is_some_and(|m| m.contains(d))
                            && other.is_some_and(|o| o.contains(d.opposite())))
                        {
                            want.set_link(c, d, false).unwrap();
                        }
                    }
                }
                assert_eq!(base.from_advertised(&adv), want);
            }
        }
    }

    #[test]
    fn routes_from_coordinates_in_a_full_torus_are_the_searched_ones() {
        for (x, y, z) in [
            (4, 4, 4),
            (5, 3, 2),
            (2, 2, 2),
            (6, 1, 1),
            (3, 4, 1),
            (1, 1, 1),
        ] {
            let dims = Dims::new(x, y, z).unwrap();
            let view = LinkView::all_up(dims).unwrap();
            assert!(view.is_full());
            for from in dims.coords() {
                let t = RouteTable::new(&view, from).unwrap();
                assert!(t.full && t.hops.is_empty());
                for to in dims.coords() {
                    let (d, hops) = view.route(from, to).unwrap();
                    assert_eq!(
                        (t.distance(to), t.next_hops(to)),
                        (d, hops),
                        "{from} -> {to}"
                    );
                }
            }
            // One link down: back to searched tables.
            if dims.count() > 1 {
                let mut v = view.clone();
                let c = Coord::new(0, 0, 0);
                let d = dims.link_dirs().iter().next().unwrap();
                v.set_link(c, d, false).unwrap();
                assert!(!v.is_full());
                assert!(!RouteTable::new(&v, c).unwrap().full);
            }
        }
    }

    #[test]
    fn next_hops_in_a_full_torus() {
        let dims = Dims::new(4, 4, 4).unwrap();
        let view = LinkView::all_up(dims).unwrap();
        let t = RouteTable::new(&view, Coord::new(0, 0, 0)).unwrap();
        assert_eq!(t.distance(Coord::new(2, 1, 3)), Some(4));
        let want: DirSet = [Dir::PlusX, Dir::MinusX, Dir::PlusY, Dir::MinusZ]
            .into_iter()
            .collect();
        assert_eq!(t.next_hops(Coord::new(2, 1, 3)), want);
        assert_eq!(t.next_hops(Coord::new(0, 0, 0)), DirSet::EMPTY);
        assert_eq!(t.distance(Coord::new(0, 0, 0)), Some(0));
        assert_eq!(
            view.route(Coord::new(0, 0, 0), Coord::new(2, 1, 3))
                .unwrap(),
            (Some(4), want)
        );
    }

    #[test]
    fn failures_reroute_and_isolate() {
        let dims = Dims::new(3, 1, 1).unwrap();
        let mut view = LinkView::all_up(dims).unwrap();
        let a = Coord::new(0, 0, 0);
        let b = Coord::new(1, 0, 0);
        view.set_link(a, Dir::PlusX, false).unwrap();
        let t = RouteTable::new(&view, a).unwrap();
        assert_eq!(t.distance(b), Some(2));
        assert_eq!(t.next_hops(b), DirSet::EMPTY.with(Dir::MinusX));
        view.set_server(Coord::new(2, 0, 0), false).unwrap();
        let t = RouteTable::new(&view, a).unwrap();
        assert_eq!(t.distance(b), None);
        assert!(t.next_hops(b).is_empty());
        assert!(!view.is_up(Coord::new(2, 0, 0)));
    }

    #[test]
    fn size_two_axis_has_two_links_to_one_neighbour() {
        let dims = Dims::new(2, 1, 1).unwrap();
        let mut view = LinkView::all_up(dims).unwrap();
        let a = Coord::new(0, 0, 0);
        let b = Coord::new(1, 0, 0);
        let t = RouteTable::new(&view, a).unwrap();
        assert_eq!(t.next_hops(b).len(), 2);
        view.set_link(a, Dir::PlusX, false).unwrap();
        let t = RouteTable::new(&view, a).unwrap();
        assert_eq!(t.next_hops(b), DirSet::EMPTY.with(Dir::MinusX));
    }
}
