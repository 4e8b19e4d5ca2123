//! The parallel paths between two servers of a torus, which source routing probes and
//! chooses among (BCube's BuildPathSet, for a torus).
//!
//! Every first hop of the source gives one path: along an axis where the destination is
//! off, the path goes that way first and then the other axes in rotated order (x-y-z,
//! y-z-x, z-x-y), so no two share a link; along an axis where it is not, the path steps
//! aside, goes the rest of the way there, and steps back (two hops longer). Paths that
//! would leave by the long way round a ring are not offered. A path that crosses a dead
//! link or server in the view, or shares a link with a path before it, is replaced by the shortest live path that uses none of the
//! links the other paths use (BSR's breadth-first search for an alternative), if any.

use std::collections::{HashSet, VecDeque};

use super::source::Route;
use super::LinkView;
use crate::topology::{Axis, Coord, Dims, Dir};
use crate::wire::MAX_ROUTE_HOPS;

/// Steps along `axis` from `a` to `b` the short way (positive when they tie), as the
/// direction and count; `None` when they are equal.
fn along(dims: Dims, axis: Axis, a: Coord, b: Coord) -> Option<(Dir, usize)> {
    let k = usize::from(dims.along(axis));
    let (a, b) = (usize::from(a.along(axis)), usize::from(b.along(axis)));
    let fwd = (b + k - a) % k;
    let back = (k - fwd) % k;
    match (fwd, back) {
        (0, _) => None,
        (f, b) if f <= b => Some((Dir::new(axis, true), f)),
        (_, b) => Some((Dir::new(axis, false), b)),
    }
}

/// Whether `d` shortens the way from `a` to `b` along its axis (both ways do on a ring
/// where `b` is half way round).
fn is_minimal(dims: Dims, a: Coord, b: Coord, d: Dir) -> bool {
    let axis = d.axis();
    let k = usize::from(dims.along(axis));
    let (x, y) = (usize::from(a.along(axis)), usize::from(b.along(axis)));
    let fwd = (y + k - x) % k;
    let back = (k - fwd) % k;
    if fwd == 0 {
        return false;
    }
    if d.is_plus() {
        fwd <= back
    } else {
        back <= fwd
    }
}

/// The axes starting after `axis`, cyclically.
fn rotated(axis: Axis) -> [Axis; 2] {
    match axis {
        Axis::X => [Axis::Y, Axis::Z],
        Axis::Y => [Axis::Z, Axis::X],
        Axis::Z => [Axis::X, Axis::Y],
    }
}

/// The torus path leaving `src` on `first` towards `dst`, built from coordinates alone.
fn planned(dims: Dims, src: Coord, dst: Coord, first: Dir) -> Option<Vec<Dir>> {
    let axis = first.axis();
    let mut dirs = vec![first];
    let mut at = dims.neighbor(src, first);
    let minimal = is_minimal(dims, src, dst, first);
    if !minimal && src.along(axis) != dst.along(axis) {
        return None;
    }
    if minimal {
        // The rest of the way along the first hop's own axis, in its direction.
        while at.along(axis) != dst.along(axis) {
            dirs.push(first);
            at = dims.neighbor(at, first);
        }
    }
    for a in rotated(axis) {
        if let Some((d, n)) = along(dims, a, at, dst) {
            dirs.extend(std::iter::repeat_n(d, n));
            for _ in 0..n {
                at = dims.neighbor(at, d);
            }
        }
    }
    if !minimal {
        dirs.push(first.opposite());
        at = dims.neighbor(at, first.opposite());
    }
    (at == dst && dirs.len() <= MAX_ROUTE_HOPS).then_some(dirs)
}

/// The links (server, direction, both ways) a route from `src` uses.
fn links_of(dims: Dims, src: Coord, route: &Route, into: &mut HashSet<(Coord, Dir)>) {
    let mut at = src;
    for d in route.dirs() {
        let next = dims.neighbor(at, d);
        into.insert((at, d));
        into.insert((next, d.opposite()));
        at = next;
    }
}

/// The shortest live path from `src` to `dst` in `view` leaving on `first`, avoiding the
/// links in `avoid` and never passing through `src` again.
pub fn detour(
    view: &LinkView,
    src: Coord,
    dst: Coord,
    first: Dir,
    avoid: &HashSet<(Coord, Dir)>,
) -> Option<Route> {
    let dims = view.dims();
    if !view.live_dirs(src).contains(first) || avoid.contains(&(src, first)) {
        return None;
    }
    let start = dims.neighbor(src, first);
    let n = dims.count() as usize;
    // Previous hop of every visited server (its direction index, 7 = the start).
    let mut prev = vec![u8::MAX; n];
    prev[dims.index(src)] = 6;
    prev[dims.index(start)] = 7;
    let mut queue = VecDeque::from([start]);
    while let Some(at) = queue.pop_front() {
        if at == dst {
            let mut back = Vec::new();
            let mut c = dst;
            while prev[dims.index(c)] < 6 {
                let d = Dir::from_index(prev[dims.index(c)])?;
                back.push(d);
                c = dims.neighbor(c, d.opposite());
            }
            back.push(first);
            back.reverse();
            return Route::new(&back);
        }
        for d in view.live_dirs(at).iter() {
            let next = dims.neighbor(at, d);
            let i = dims.index(next);
            if prev[i] == u8::MAX && !avoid.contains(&(at, d)) {
                prev[i] = d.index();
                queue.push_back(next);
            }
        }
    }
    None
}

/// The parallel paths from `src` to `dst` under `view`, one per usable first hop, the
/// shortest first (the one source routing uses before its first probe answers). Empty
/// when `dst` is `src` or cannot be reached.
pub fn path_set(view: &LinkView, src: Coord, dst: Coord) -> Vec<Route> {
    path_set_avoiding(view, src, dst, &HashSet::new())
}

/// [`path_set`] with the links in `dead` (server, direction) taken as down, though the
/// view may not know yet: links a path-failure report named.
pub fn path_set_avoiding(
    view: &LinkView,
    src: Coord,
    dst: Coord,
    dead: &HashSet<(Coord, Dir)>,
) -> Vec<Route> {
    let dims = view.dims();
    if src == dst || !dims.contains(src) || !dims.contains(dst) {
        return Vec::new();
    }
    let mut planned_routes: Vec<(Dir, Option<Route>)> = dims
        .link_dirs()
        .iter()
        .map(|d| {
            let r = planned(dims, src, dst, d).and_then(|p| Route::new(&p));
            (d, r)
        })
        .collect();
    // Minimal first hops first, then the side steps; within each, by direction.
    planned_routes.sort_by_key(|(d, r)| (r.map_or(usize::MAX, |r| r.len()), d.index()));
    let mut used = HashSet::new();
    for &(c, d) in dead {
        used.insert((c, d));
        used.insert((dims.neighbor(c, d), d.opposite()));
    }
    let mut out: Vec<Route> = Vec::new();
    let mut broken = Vec::new();
    for (d, r) in planned_routes {
        let Some(r) = r else { continue };
        let mut mine = HashSet::new();
        links_of(dims, src, &r, &mut mine);
        // On rings of two, both side steps of an axis reach the same row: one of them
        // takes a detour instead of sharing its links.
        if r.is_live(view, src) && used.is_disjoint(&mine) {
            used.extend(mine);
            out.push(r);
        } else {
            broken.push(d);
        }
    }
    for d in broken {
        if let Some(r) = detour(view, src, dst, d, &used) {
            links_of(dims, src, &r, &mut used);
            out.push(r);
        }
    }
    out.sort_by_key(|r| r.len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ends_right(view: &LinkView, src: Coord, dst: Coord, set: &[Route]) {
        let dims = view.dims();
        let mut used = HashSet::new();
        for r in set {
            assert_eq!(r.end(dims, src), dst, "{r:?}");
            assert!(r.is_live(view, src), "{r:?}");
            let mut mine = HashSet::new();
            links_of(dims, src, r, &mut mine);
            assert!(used.is_disjoint(&mine), "{r:?} shares a link");
            used.extend(mine);
            let visited: HashSet<Coord> = r.servers(dims, src).collect();
            assert_eq!(visited.len(), r.len(), "{r:?} visits a server twice");
            assert!(!visited.contains(&src));
        }
    }

    #[test]
    fn paths_are_edge_disjoint_and_end_at_the_destination() {
        for (x, y, z) in [(3, 3, 3), (4, 4, 1), (8, 8, 8), (5, 3, 2), (2, 2, 2)] {
            let dims = Dims::new(x, y, z).unwrap();
            let view = LinkView::all_up(dims).unwrap();
            for src in dims.coords().step_by(5) {
                for dst in dims.coords().step_by(3) {
                    let set = path_set(&view, src, dst);
                    if src == dst {
                        assert!(set.is_empty());
                        continue;
                    }
                    assert!(!set.is_empty());
                    ends_right(&view, src, dst, &set);
                    let shortest = set[0].len();
                    let hops: u32 = Axis::ALL
                        .iter()
                        .filter_map(|a| along(dims, *a, src, dst).map(|(_, n)| n as u32))
                        .sum();
                    assert_eq!(shortest as u32, hops);
                    // Rings of two force detours round shared links; elsewhere every path
                    // is the shortest or a side step.
                    if x.min(y) >= 3 && (z == 1 || z >= 3) {
                        assert!(set.iter().all(|r| r.len() <= shortest + 2), "{set:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_3d_torus_offers_six_paths_between_neighbours_on_one_axis() {
        let dims = Dims::new(8, 8, 8).unwrap();
        let view = LinkView::all_up(dims).unwrap();
        let set = path_set(&view, Coord::new(0, 0, 0), Coord::new(2, 0, 0));
        // +x direct; four side steps; -x would go the long way round.
        assert_eq!(set.len(), 5);
        let set = path_set(&view, Coord::new(0, 0, 0), Coord::new(2, 3, 1));
        assert_eq!(set.iter().filter(|r| r.len() == 6).count(), 3);
    }

    #[test]
    fn broken_paths_are_replaced_by_live_detours() {
        let dims = Dims::new(4, 4, 1).unwrap();
        let mut view = LinkView::all_up(dims).unwrap();
        let (src, dst) = (Coord::new(0, 0, 0), Coord::new(2, 0, 0));
        view.set_link(Coord::new(1, 0, 0), Dir::PlusX, false)
            .unwrap();
        let set = path_set(&view, src, dst);
        assert!(!set.is_empty());
        ends_right(&view, src, dst, &set);
        // The direct path is gone; the other way round and the side steps are left.
        assert!(set.len() >= 3, "{set:?}");
        let dead = HashSet::from([(Coord::new(0, 1, 0), Dir::PlusX)]);
        let around = path_set_avoiding(&view, src, dst, &dead);
        for r in &around {
            let mut at = src;
            for d in r.dirs() {
                assert!(!(at == Coord::new(0, 1, 0) && d == Dir::PlusX), "{r:?}");
                at = dims.neighbor(at, d);
            }
        }
        view.set_server(Coord::new(1, 0, 0), false).unwrap();
        view.set_server(Coord::new(0, 1, 0), false).unwrap();
        view.set_server(Coord::new(0, 3, 0), false).unwrap();
        view.set_server(Coord::new(3, 0, 0), false).unwrap();
        assert!(path_set(&view, src, dst).is_empty());
    }
}
