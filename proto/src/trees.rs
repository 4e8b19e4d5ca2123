//! Spanning trees rooted at one server for multicast and aggregation (CamCube's file
//! distribution and Camdoop, CamCubeOS paper 6.1-6.2): one tree per link direction of the
//! torus (six in 3D), built so that every tree edge is one physical link and, when nothing
//! has failed, no directed link carries two trees; a root then sends on all its links at
//! once and every server receives on all of its.
//!
//! The trees grow together, one server per tree per round: tree *t* extends from the
//! earliest of its servers that still has an unused outgoing link to a server it lacks,
//! trying its own direction first and then the others in a rotated order. On full tori
//! this packs the trees edge-disjointly (`tests` check sizes 2 to 8 per axis); with
//! servers or links down it may not, and a server no unused link reaches joins over a link
//! another tree uses (counted in [`Trees::shared_edges`]). The trees are a pure function of
//! the view and the root, so every server computes the same trees from the same view.

use crate::routing::LinkView;
use crate::topology::{Coord, Dims, Dir};

/// The trees of one root in one view.
#[derive(Debug, Clone)]
pub struct Trees {
    dims: Dims,
    root: Coord,
    dirs: Vec<Dir>,
    /// `parent[t][i]`: the parent of server `i` in tree `t` and the link direction from the
    /// parent to it (`None`: the root, or a server the tree does not reach).
    parent: Vec<Vec<Option<(u32, Dir)>>>,
    children: Vec<Vec<Vec<u32>>>,
    shared: usize,
}

impl Trees {
    /// The trees rooted at `root` over the live servers and links of `view`.
    pub fn build(view: &LinkView, root: Coord) -> Trees {
        let dims = view.dims();
        let n = dims.count() as usize;
        let dirs: Vec<Dir> = dims.link_dirs().iter().collect();
        let k = dirs.len().max(1);
        let mut parent = vec![vec![None; n]; k];
        let mut in_tree = vec![vec![false; n]; k];
        let mut frontier: Vec<std::collections::VecDeque<u32>> = vec![Default::default(); k];
        // Directed links taken: server index * 6 + direction.
        let mut used = vec![false; n * 6];
        let ri = dims.index(root);
        if view.is_up(root) {
            for t in 0..k {
                in_tree[t][ri] = true;
                frontier[t].push_back(ri as u32);
            }
        }
        let order: Vec<Vec<Dir>> = (0..k)
            .map(|t| {
                let own = dirs[t];
                let mut rest: Vec<Dir> = dirs.iter().copied().filter(|d| *d != own).collect();
                if !rest.is_empty() {
                    let r = t % rest.len();
                    rest.rotate_left(r);
                }
                std::iter::once(own).chain(rest).collect()
            })
            .collect();
        let live: Vec<crate::topology::DirSet> =
            (0..n).map(|i| view.live_dirs(dims.coord(i))).collect();
        let mut progress = true;
        while progress {
            progress = false;
            for t in 0..k {
                'extend: while let Some(&u) = frontier[t].front() {
                    let uc = dims.coord(u as usize);
                    for d in &order[t] {
                        if !live[u as usize].contains(*d) {
                            continue;
                        }
                        let v = dims.index(dims.neighbor(uc, *d));
                        let e = u as usize * 6 + usize::from(d.index());
                        if in_tree[t][v] || used[e] {
                            continue;
                        }
                        used[e] = true;
                        in_tree[t][v] = true;
                        parent[t][v] = Some((u, *d));
                        frontier[t].push_back(v as u32);
                        progress = true;
                        break 'extend;
                    }
                    // Nothing left to take from `u` for this tree.
                    frontier[t].pop_front();
                }
            }
        }
        // Servers no unused link reached: join over any live link, breadth first.
        let mut shared = 0;
        for t in 0..k {
            let mut queue: std::collections::VecDeque<u32> =
                (0..n as u32).filter(|i| in_tree[t][*i as usize]).collect();
            while let Some(u) = queue.pop_front() {
                let uc = dims.coord(u as usize);
                for d in &order[t] {
                    if !live[u as usize].contains(*d) {
                        continue;
                    }
                    let v = dims.index(dims.neighbor(uc, *d));
                    if in_tree[t][v] {
                        continue;
                    }
                    in_tree[t][v] = true;
                    parent[t][v] = Some((u, *d));
                    shared += 1;
                    queue.push_back(v as u32);
                }
            }
        }
        let mut children = vec![vec![Vec::new(); n]; k];
        for (t, p) in parent.iter().enumerate() {
            for (v, e) in p.iter().enumerate() {
                if let Some((u, _)) = e {
                    children[t][*u as usize].push(v as u32);
                }
            }
        }
        Trees {
            dims,
            root,
            dirs,
            parent,
            children,
            shared,
        }
    }

    /// How many trees (one per link direction).
    pub fn count(&self) -> usize {
        self.parent.len()
    }

    /// The root.
    pub fn root(&self) -> Coord {
        self.root
    }

    /// The direction tree `t` starts along.
    pub fn dir(&self, t: usize) -> Option<Dir> {
        self.dirs.get(t).copied()
    }

    /// `c`'s parent in tree `t` (`None`: the root, or not in the tree).
    pub fn parent(&self, t: usize, c: Coord) -> Option<Coord> {
        let i = self.idx(c)?;
        self.parent
            .get(t)?
            .get(i)?
            .map(|(p, _)| self.dims.coord(p as usize))
    }

    /// `c`'s children in tree `t`.
    pub fn children(&self, t: usize, c: Coord) -> Vec<Coord> {
        match (self.idx(c), self.children.get(t)) {
            (Some(i), Some(ch)) => ch[i].iter().map(|v| self.dims.coord(*v as usize)).collect(),
            _ => Vec::new(),
        }
    }

    /// Whether tree `t` reaches `c`.
    pub fn reaches(&self, t: usize, c: Coord) -> bool {
        c == self.root && self.parent.get(t).is_some() || self.parent(t, c).is_some()
    }

    /// Servers tree `t` reaches (the root included).
    pub fn size(&self, t: usize) -> usize {
        self.parent
            .get(t)
            .map_or(0, |p| p.iter().filter(|e| e.is_some()).count() + 1)
    }

    /// Tree edges over a directed link another tree also uses (0 when nothing failed).
    pub fn shared_edges(&self) -> usize {
        self.shared
    }

    /// The depth of tree `t` (hops from the root to its farthest server).
    pub fn depth(&self, t: usize) -> usize {
        let Some(p) = self.parent.get(t) else {
            return 0;
        };
        (0..p.len())
            .map(|mut i| {
                let mut d = 0;
                while let Some((u, _)) = p[i] {
                    i = u as usize;
                    d += 1;
                    if d > p.len() {
                        break;
                    }
                }
                d
            })
            .max()
            .unwrap_or(0)
    }

    fn idx(&self, c: Coord) -> Option<usize> {
        self.dims.contains(c).then(|| self.dims.index(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn check(view: &LinkView, root: Coord) -> Trees {
        let tr = Trees::build(view, root);
        let dims = view.dims();
        let live: Vec<Coord> = dims.coords().filter(|c| view.is_up(*c)).collect();
        let mut links = HashSet::new();
        for t in 0..tr.count() {
            assert_eq!(tr.size(t), live.len(), "tree {t} spans every live server");
            for c in &live {
                if *c == root {
                    assert_eq!(tr.parent(t, *c), None);
                    continue;
                }
                let (p, d) = tr.parent[t][dims.index(*c)].expect("a parent");
                let pc = dims.coord(p as usize);
                assert_eq!(dims.neighbor(pc, d), *c, "every edge is one link");
                assert!(view.live_dirs(pc).contains(d), "over a live link");
                assert!(tr.children(t, pc).contains(c));
                let fresh = links.insert((p, d.index()));
                assert!(
                    fresh || tr.shared_edges() > 0,
                    "a directed link in two trees"
                );
            }
        }
        tr
    }

    #[test]
    fn full_tori_get_edge_disjoint_trees() {
        for (x, y, z) in [
            (3, 3, 3),
            (4, 4, 4),
            (3, 3, 1),
            (5, 5, 5),
            (8, 8, 8),
            (4, 3, 2),
            (2, 2, 2),
            (6, 4, 3),
        ] {
            let dims = Dims::new(x, y, z).unwrap();
            let view = LinkView::all_up(dims).unwrap();
            for root in [Coord::new(0, 0, 0), Coord::new(x - 1, y / 2, z - 1)] {
                let tr = check(&view, root);
                assert_eq!(tr.shared_edges(), 0, "{x}x{y}x{z} from {root}");
                assert_eq!(tr.count(), dims.link_dirs().iter().count());
            }
        }
    }

    #[test]
    fn failures_keep_every_live_server_in_every_tree() {
        let dims = Dims::new(4, 4, 4).unwrap();
        let mut view = LinkView::all_up(dims).unwrap();
        view.set_server(Coord::new(1, 0, 0), false).unwrap();
        view.set_server(Coord::new(2, 2, 2), false).unwrap();
        view.set_link(Coord::new(0, 0, 0), Dir::ALL[2], false)
            .unwrap();
        let tr = check(&view, Coord::new(0, 0, 0));
        assert!(!tr.reaches(0, Coord::new(1, 0, 0)));
        // The same view gives the same trees (every server computes them alone).
        let again = Trees::build(&view, Coord::new(0, 0, 0));
        for t in 0..tr.count() {
            for c in dims.coords() {
                assert_eq!(tr.parent(t, c), again.parent(t, c));
            }
        }
    }
}
