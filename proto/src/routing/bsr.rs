//! BSR path selection at a source (BCube, section 4): per flow, probe the parallel paths,
//! take the one with the most available bandwidth, re-probe now and then, and on a
//! path-failure report switch at once to another good path, without waiting for the
//! link-state view.
//!
//! A flow here is everything this server sends to one peer: the transport has one
//! connection (one window, one sequence) per peer, so one path at a time per peer is what
//! keeps a flow's frames in order. Sans-IO: the engine asks for a flow's route when it
//! sends, feeds replies and failure reports in, and sends the probes this asks for.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use rustc_hash::FxHashMap;

use super::paths::path_set_avoiding;
use super::probe::{Probe, ProbeKind};
use super::source::Route;
use super::LinkView;
use crate::time::Time;
use crate::topology::{Coord, Dir};

/// Settings of path selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BsrConfig {
    /// How often a flow in use probes its paths again.
    pub probe_interval: Duration,
    /// How long a probing round waits for replies; paths not answered by then count as
    /// failed for the round.
    pub probe_timeout: Duration,
    /// How long a link named by a failure report is avoided (the view normally learns of
    /// it well before).
    pub dead_link_hold: Duration,
    /// Paths whose available bandwidth is within this fraction (per mille) of the best
    /// count as equal, and the shortest of them wins: a longer path spends more of the
    /// torus for the same rate.
    pub equal_permille: u32,
    /// Bytes a flow sends before its paths are probed: a probing round costs two frames
    /// per path, more than a short flow carries (in an all-to-all every server has a
    /// flow to every other). Until then a flow takes the shortest path whose first link
    /// has the most room here, chosen again every probe interval.
    pub probe_after_bytes: u64,
}

impl Default for BsrConfig {
    fn default() -> BsrConfig {
        BsrConfig {
            probe_interval: Duration::from_millis(100),
            probe_timeout: Duration::from_millis(20),
            dead_link_hold: Duration::from_secs(2),
            equal_permille: 900,
            probe_after_bytes: 256 << 10,
        }
    }
}

/// A probe the engine must send: along `route` to `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOut {
    /// The flow's destination.
    pub dst: Coord,
    /// The path's index in the flow's set.
    pub path: u8,
    /// The probing round.
    pub round: u32,
    /// The path.
    pub route: Route,
}

/// Counters of path selection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BsrStats {
    /// Probes asked for.
    pub probes: u64,
    /// Replies taken.
    pub replies: u64,
    /// Path-failure reports taken.
    pub failures: u64,
    /// Times a flow changed path.
    pub switches: u64,
    /// Switches made because a path failed (a report, or the view).
    pub failovers: u64,
    /// When the latest of those happened.
    pub last_failover: Option<Time>,
}

#[derive(Debug)]
struct Flow {
    paths: Vec<Route>,
    /// The latest figure per path (Mb/s); `None` for a path that failed or never answered.
    avail: Vec<Option<u32>>,
    /// Paths that answered in the current round.
    answered: u64,
    current: usize,
    round: u32,
    /// When the current round gives up waiting (`None`: no round open).
    round_ends: Option<Time>,
    next_probe: Time,
    last_used: Time,
    /// Links failure reports named, with when they were reported.
    dead: Vec<(Coord, Dir, Time)>,
    /// Bytes this server sent on the flow, and their count and time when the current round
    /// started: the flow's own rate, which its path's links carry too.
    sent: u64,
    sent_at_round: (u64, Time),
    /// The flow's own rate over the last round, Mb/s.
    own_mbps: u32,
    /// Whether it sent enough to be probed; until then, when its default path was chosen.
    probing: bool,
    chosen_at: Time,
}

/// Path selection for every flow of one server.
#[derive(Debug)]
pub struct Bsr {
    local: Coord,
    cfg: BsrConfig,
    flows: FxHashMap<Coord, Flow>,
    out: VecDeque<ProbeOut>,
    stats: BsrStats,
    next_round: u32,
    /// The earliest timer of a probing flow: asked for on every turn of a poller and twice
    /// per server serviced in the simulator, so kept rather than searched for.
    due: Option<Time>,
}

impl Bsr {
    /// Path selection at server `local`.
    pub fn new(local: Coord, cfg: BsrConfig) -> Bsr {
        Bsr {
            local,
            cfg,
            flows: FxHashMap::default(),
            out: VecDeque::new(),
            stats: BsrStats::default(),
            next_round: 1,
            due: None,
        }
    }

    /// Counters.
    pub fn stats(&self) -> BsrStats {
        self.stats
    }

    /// The route frames to `dst` take now, starting the flow when it is new. A flow that
    /// has not yet sent [`BsrConfig::probe_after_bytes`] takes the shortest path whose
    /// first link has the most room here (`free`, Mb/s per direction), chosen again every
    /// probe interval; after that its paths are probed, and until the probes answer it
    /// keeps its path, as BSR's source does not hold packets while it selects. `None` when
    /// no path leads there.
    pub fn route(
        &mut self,
        now: Time,
        view: &LinkView,
        dst: Coord,
        free: &[u32; 6],
    ) -> Option<Route> {
        let interval = self.cfg.probe_interval;
        if let Some(f) = self.flows.get_mut(&dst) {
            f.last_used = now;
            if !f.probing && now.since(f.chosen_at) >= interval {
                f.current = default_path(&f.paths, free);
                f.chosen_at = now;
            }
            return f.paths.get(f.current).copied();
        }
        let paths = path_set_avoiding(view, self.local, dst, &HashSet::new());
        let current = default_path(&paths, free);
        let first = *paths.get(current)?;
        let n = paths.len();
        let probing = self.cfg.probe_after_bytes == 0;
        self.flows.insert(
            dst,
            Flow {
                paths,
                avail: vec![None; n],
                answered: 0,
                current,
                round: 0,
                round_ends: None,
                next_probe: now,
                last_used: now,
                dead: Vec::new(),
                sent: 0,
                sent_at_round: (0, now),
                own_mbps: 0,
                probing,
                chosen_at: now,
            },
        );
        if probing {
            self.start_round(now, view, dst);
            self.refresh_due();
        }
        Some(first)
    }

    /// This server put `bytes` on the flow to `dst` (its own load on its path, which
    /// probes of that path must not count against it).
    pub fn on_sent(&mut self, dst: Coord, bytes: usize) {
        let after = self.cfg.probe_after_bytes;
        if let Some(f) = self.flows.get_mut(&dst) {
            f.sent += bytes as u64;
            if !f.probing && f.sent >= after {
                // Due now: the next timer run starts its first round.
                f.probing = true;
                f.next_probe = Time::ZERO;
                f.sent_at_round = (f.sent, f.chosen_at);
                self.due = Some(Time::ZERO);
            }
        }
    }

    /// The path in use towards `dst` and its index, if the flow exists.
    pub fn current(&self, dst: Coord) -> Option<(usize, Route)> {
        let f = self.flows.get(&dst)?;
        Some((f.current, *f.paths.get(f.current)?))
    }

    /// The flow's paths and their latest available bandwidth (Mb/s), for reports.
    pub fn paths(&self, dst: Coord) -> Vec<(Route, Option<u32>)> {
        self.flows
            .get(&dst)
            .map(|f| {
                f.paths
                    .iter()
                    .copied()
                    .zip(f.avail.iter().copied())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Flows being kept.
    pub fn flows(&self) -> usize {
        self.flows.len()
    }

    /// Every flow's destination and the path it uses, for reports.
    pub fn routes(&self) -> impl Iterator<Item = (Coord, Route)> + '_ {
        self.flows
            .iter()
            .filter_map(|(d, f)| Some((*d, *f.paths.get(f.current)?)))
    }

    /// Whether probes wait to be sent.
    pub fn has_probes(&self) -> bool {
        !self.out.is_empty()
    }

    /// The next probe to send.
    pub fn poll_probe(&mut self) -> Option<ProbeOut> {
        self.out.pop_front()
    }

    /// Takes a probe reply or a failure report addressed to this server. `reporter` is the
    /// server that sent the frame (the destination for a reply, the server that could not
    /// forward for a failure).
    pub fn on_probe(&mut self, now: Time, view: &LinkView, reporter: Coord, p: &Probe) {
        match p.kind {
            ProbeKind::Reply => self.on_reply(now, view, p),
            ProbeKind::Failure { dir, .. } => self.on_failure(now, view, p.flow_dst, reporter, dir),
            ProbeKind::Probe => {}
        }
        self.refresh_due();
    }

    fn on_reply(&mut self, now: Time, view: &LinkView, p: &Probe) {
        let Some(f) = self.flows.get_mut(&p.flow_dst) else {
            return;
        };
        let i = usize::from(p.path);
        if p.round != f.round || i >= f.paths.len() || f.round_ends.is_none() {
            return;
        }
        self.stats.replies += 1;
        // The flow's own traffic loads every link of the path it is on: the path has that
        // much more for the flow than the probe saw, or the flow would flee its own load.
        let own = if i == f.current { f.own_mbps } else { 0 };
        f.avail[i] = Some(p.avail_mbps.saturating_add(own));
        f.answered |= 1 << i;
        if f.answered.count_ones() as usize == f.paths.len() {
            self.close_round(now, view, p.flow_dst);
        }
    }

    /// A server on the flow's path could not take link `dir` of server `at`: every path
    /// through that link is failed, and the flow moves at once to the best remaining one
    /// and probes again.
    fn on_failure(&mut self, now: Time, view: &LinkView, dst: Coord, at: Coord, dir: Dir) {
        if self.flows.contains_key(&dst) {
            self.stats.failures += 1;
        }
        self.fail_link(now, view, dst, at, dir);
    }

    fn fail_link(&mut self, now: Time, view: &LinkView, dst: Coord, at: Coord, dir: Dir) {
        let dims = view.dims();
        let local = self.local;
        let Some(f) = self.flows.get_mut(&dst) else {
            return;
        };
        if !f.dead.iter().any(|(c, d, _)| *c == at && *d == dir) {
            f.dead.push((at, dir, now));
        }
        let uses = |r: &Route| {
            let mut from = local;
            r.dirs().any(|d| {
                let hit = from == at && d == dir;
                from = dims.neighbor(from, d);
                hit
            })
        };
        for (r, a) in f.paths.iter().zip(f.avail.iter_mut()) {
            if uses(r) {
                *a = None;
            }
        }
        if f.paths.get(f.current).is_some_and(uses) {
            let before = f.current;
            if let Some(best) = best_path(f, self.cfg.equal_permille, |r| !uses(r)) {
                f.current = best;
            } else {
                // Nothing known to be good: rebuild the set around the dead link.
                f.paths = rebuilt(view, local, dst, &f.dead);
                f.avail = vec![None; f.paths.len()];
                f.current = 0;
            }
            if f.current != before || f.paths.get(before).is_some_and(uses) {
                self.stats.switches += 1;
                self.stats.failovers += 1;
                self.stats.last_failover = Some(now);
            }
        }
        self.start_round(now, view, dst);
    }

    /// Link `dir` of server `at` went down (this server's own, seen by its driver): every
    /// flow through it moves at once.
    pub fn on_link_down(&mut self, now: Time, view: &LinkView, at: Coord, dir: Dir) {
        let dsts: Vec<Coord> = self.flows.keys().copied().collect();
        for dst in dsts {
            self.fail_link(now, view, dst, at, dir);
        }
        self.refresh_due();
    }

    /// The view changed: flows whose path it shows broken move to another at once, and
    /// every flow gets a path set rebuilt for the new view (probed, for flows that probe).
    pub fn on_view(&mut self, now: Time, view: &LinkView) {
        let local = self.local;
        let dsts: Vec<Coord> = self.flows.keys().copied().collect();
        for dst in dsts {
            let Some(f) = self.flows.get_mut(&dst) else {
                continue;
            };
            let live = f
                .paths
                .get(f.current)
                .is_some_and(|r| r.is_live(view, local));
            if !live {
                if let Some(best) =
                    best_path(f, self.cfg.equal_permille, |r| r.is_live(view, local))
                {
                    f.current = best;
                } else {
                    f.paths = rebuilt(view, local, dst, &f.dead);
                    f.avail = vec![None; f.paths.len()];
                    f.current = 0;
                }
                self.stats.switches += 1;
                self.stats.failovers += 1;
                self.stats.last_failover = Some(now);
            }
            if f.probing {
                self.start_round(now, view, dst);
            } else {
                let hold = self.cfg.dead_link_hold;
                refresh_paths(f, view, local, dst, hold, now);
            }
        }
        self.refresh_due();
    }

    /// When [`Bsr::handle_timeout`] must run next.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.due
    }

    fn refresh_due(&mut self) {
        self.due = self
            .flows
            .values()
            .filter(|f| f.probing)
            .map(|f| f.round_ends.unwrap_or(f.next_probe))
            .min();
    }

    /// Closes rounds that waited long enough, starts the rounds that are due, and forgets
    /// flows unused for two probe intervals.
    pub fn handle_timeout(&mut self, now: Time, view: &LinkView) {
        let idle = self.cfg.probe_interval * 2;
        self.flows.retain(|_, f| now.since(f.last_used) <= idle);
        let due: Vec<(Coord, bool)> = self
            .flows
            .iter()
            .filter(|(_, f)| f.probing)
            .filter_map(|(d, f)| match f.round_ends {
                Some(t) if t <= now => Some((*d, true)),
                None if f.next_probe <= now => Some((*d, false)),
                _ => None,
            })
            .collect();
        for (dst, closing) in due {
            if closing {
                self.close_round(now, view, dst);
            } else {
                self.start_round(now, view, dst);
            }
        }
        self.refresh_due();
    }

    fn start_round(&mut self, now: Time, view: &LinkView, dst: Coord) {
        let local = self.local;
        let hold = self.cfg.dead_link_hold;
        let Some(f) = self.flows.get_mut(&dst) else {
            return;
        };
        if !refresh_paths(f, view, local, dst, hold, now) {
            // Unreachable for now: keep what there is; the transport reports failures.
            f.round_ends = None;
            f.next_probe = now + self.cfg.probe_interval;
            return;
        }
        let (sent, at) = f.sent_at_round;
        let ns = now.since(at).as_nanos().max(1);
        f.own_mbps = u32::try_from(u128::from(f.sent - sent) * 8 * 1000 / ns).unwrap_or(u32::MAX);
        f.sent_at_round = (f.sent, now);
        self.next_round = self.next_round.wrapping_add(1).max(1);
        f.round = self.next_round;
        f.answered = 0;
        f.round_ends = Some(now + self.cfg.probe_timeout);
        for (i, route) in f.paths.iter().enumerate() {
            self.stats.probes += 1;
            self.out.push_back(ProbeOut {
                dst,
                path: i as u8,
                round: f.round,
                route: *route,
            });
        }
    }

    fn close_round(&mut self, now: Time, _view: &LinkView, dst: Coord) {
        let Some(f) = self.flows.get_mut(&dst) else {
            return;
        };
        for (i, a) in f.avail.iter_mut().enumerate() {
            if f.answered & (1 << i) == 0 {
                *a = None;
            }
        }
        f.round_ends = None;
        f.next_probe = now + self.cfg.probe_interval;
        let before = f.current;
        if let Some(best) = best_path(f, self.cfg.equal_permille, |_| true) {
            f.current = best;
        }
        if f.current != before {
            self.stats.switches += 1;
        }
    }
}

/// The path in `paths` whose first link has the most room (`free`, Mb/s per direction),
/// the shortest among those within a tenth of the roomiest (a longer path spends more of
/// the torus), then the first.
fn default_path(paths: &[Route], free: &[u32; 6]) -> usize {
    let room = |r: &Route| u64::from(free[usize::from(r.first().index())]);
    let best = paths.iter().map(room).max().unwrap_or(0);
    paths
        .iter()
        .enumerate()
        .filter(|(_, r)| room(r) * 10 >= best * 9)
        .min_by_key(|(i, r)| (r.len(), *i))
        .map_or(0, |(i, _)| i)
}

/// Rebuilds a flow's path set for `view` and the links reported dead (forgotten after
/// `hold`), keeping the current path and every path's last figure where they remain; false
/// (and nothing changed) when no path is left.
fn refresh_paths(
    f: &mut Flow,
    view: &LinkView,
    local: Coord,
    dst: Coord,
    hold: Duration,
    now: Time,
) -> bool {
    f.dead.retain(|(_, _, t)| now.since(*t) < hold);
    let fresh = rebuilt(view, local, dst, &f.dead);
    if fresh.is_empty() {
        return false;
    }
    if fresh != f.paths {
        let current = f.paths.get(f.current).copied();
        let old: Vec<(Route, Option<u32>)> = f
            .paths
            .iter()
            .copied()
            .zip(f.avail.iter().copied())
            .collect();
        f.avail = fresh
            .iter()
            .map(|r| old.iter().find(|(o, _)| o == r).and_then(|(_, a)| *a))
            .collect();
        f.current = current
            .and_then(|c| fresh.iter().position(|r| *r == c))
            .unwrap_or(0);
        f.paths = fresh;
    }
    true
}

/// The paths from `local` to `dst` under `view` without the links in `dead`.
fn rebuilt(view: &LinkView, local: Coord, dst: Coord, dead: &[(Coord, Dir, Time)]) -> Vec<Route> {
    let dead: HashSet<(Coord, Dir)> = dead.iter().map(|(c, d, _)| (*c, *d)).collect();
    path_set_avoiding(view, local, dst, &dead)
}

/// The best of the flow's paths that `ok` accepts: the most available bandwidth, and among
/// those within `equal_permille` of it the current path, then the shortest. Paths with no
/// figure count only when none has one (the shortest of them, then).
fn best_path(f: &Flow, equal_permille: u32, ok: impl Fn(&Route) -> bool) -> Option<usize> {
    let candidates = || {
        f.paths
            .iter()
            .enumerate()
            .filter(|(_, r)| ok(r))
            .map(|(i, r)| (i, r.len(), f.avail[i]))
    };
    let max = candidates().filter_map(|(_, _, a)| a).max();
    let Some(max) = max else {
        // Nothing measured: the shortest acceptable path (not one known failed).
        return candidates()
            .min_by_key(|(i, len, _)| (*len, *i))
            .map(|c| c.0);
    };
    let floor = (u64::from(max) * u64::from(equal_permille) / 1000) as u32;
    candidates()
        .filter(|(_, _, a)| a.is_some_and(|a| a >= floor))
        .min_by_key(|(i, len, _)| (*i != f.current, *len, *i))
        .map(|c| c.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Dims;

    fn reply(out: &ProbeOut, mbps: u32) -> Probe {
        Probe {
            kind: ProbeKind::Reply,
            path: out.path,
            round: out.round,
            avail_mbps: mbps,
            flow_dst: out.dst,
        }
    }

    const FREE: [u32; 6] = [u32::MAX; 6];

    fn setup() -> (LinkView, Bsr, Coord) {
        let view = LinkView::all_up(Dims::new(4, 4, 1).unwrap()).unwrap();
        let cfg = BsrConfig {
            probe_after_bytes: 0,
            ..BsrConfig::default()
        };
        (
            view,
            Bsr::new(Coord::new(0, 0, 0), cfg),
            Coord::new(1, 0, 0),
        )
    }

    #[test]
    fn short_flows_take_the_roomiest_shortest_path_without_probing() {
        let view = LinkView::all_up(Dims::new(4, 4, 1).unwrap()).unwrap();
        let mut b = Bsr::new(Coord::new(0, 0, 0), BsrConfig::default());
        let dst = Coord::new(1, 1, 0);
        let t0 = Time::ZERO;
        // +x is busy here: the flow starts on the +y-first shortest path.
        let mut free = FREE;
        free[usize::from(Dir::PlusX.index())] = 100;
        let r = b.route(t0, &view, dst, &free).unwrap();
        assert_eq!((r.len(), r.first()), (2, Dir::PlusY));
        assert!(b.poll_probe().is_none() && b.poll_timeout().is_none());
        // Within the interval it keeps its path; after it, the choice is made again.
        free = FREE;
        free[usize::from(Dir::PlusY.index())] = 100;
        assert_eq!(b.route(t0, &view, dst, &free).unwrap().first(), Dir::PlusY);
        let later = t0 + Duration::from_millis(100);
        assert_eq!(
            b.route(later, &view, dst, &free).unwrap().first(),
            Dir::PlusX
        );
        // Once it has sent enough, its paths are probed.
        b.on_sent(dst, 300 << 10);
        let due = b.poll_timeout().unwrap();
        b.handle_timeout(due.max(later), &view);
        assert!(b.poll_probe().is_some());
    }

    #[test]
    fn picks_the_path_with_the_most_available_bandwidth() {
        let (view, mut b, dst) = setup();
        let t0 = Time::ZERO;
        let first = b.route(t0, &view, dst, &FREE).unwrap();
        assert_eq!(first.len(), 1);
        let probes: Vec<ProbeOut> = std::iter::from_fn(|| b.poll_probe()).collect();
        assert!(probes.len() >= 3);
        // The shortest path is loaded; a side step is idle.
        for p in &probes {
            let mbps = if p.path == 0 { 1_000 } else { 9_000 };
            b.on_probe(t0, &view, dst, &reply(p, mbps));
        }
        let (i, r) = b.current(dst).unwrap();
        assert_ne!(i, 0);
        assert_eq!(r.len(), 3);
        assert_eq!(b.stats().switches, 1);
        // Equal figures: the shortest wins, but the current one is kept among equals.
        b.handle_timeout(t0 + Duration::from_millis(100), &view);
        for p in std::iter::from_fn(|| b.poll_probe()).collect::<Vec<_>>() {
            b.on_probe(t0, &view, dst, &reply(&p, 9_000));
        }
        assert_eq!(b.current(dst).unwrap().0, i);
    }

    #[test]
    fn a_flow_does_not_flee_its_own_load() {
        let (view, mut b, dst) = setup();
        let t0 = Time::ZERO;
        b.route(t0, &view, dst, &FREE).unwrap();
        for p in std::iter::from_fn(|| b.poll_probe()).collect::<Vec<_>>() {
            b.on_probe(t0, &view, dst, &reply(&p, 10_000));
        }
        assert_eq!(b.current(dst).unwrap().0, 0);
        // 100 MB in 100 ms: 8 Gb/s of its own on path 0, which its probe sees as used.
        b.on_sent(dst, 100_000_000);
        b.handle_timeout(t0 + Duration::from_millis(100), &view);
        for p in std::iter::from_fn(|| b.poll_probe()).collect::<Vec<_>>() {
            let mbps = if p.path == 0 { 2_000 } else { 10_000 };
            b.on_probe(t0, &view, dst, &reply(&p, mbps));
        }
        assert_eq!(b.current(dst).unwrap().0, 0, "{:?}", b.paths(dst));
        assert_eq!(b.stats().switches, 0);
    }

    #[test]
    fn a_failure_report_moves_the_flow_at_once() {
        let (view, mut b, _) = setup();
        let dst = Coord::new(2, 1, 0);
        let t0 = Time::ZERO;
        let r = b.route(t0, &view, dst, &FREE).unwrap();
        while b.poll_probe().is_some() {}
        // The first hop's far end cannot go on.
        let at = view.dims().neighbor(Coord::new(0, 0, 0), r.first());
        let fail = Probe {
            kind: ProbeKind::Failure {
                hop: 1,
                dir: r.dir(1).unwrap(),
            },
            path: 0,
            round: 0,
            avail_mbps: 0,
            flow_dst: dst,
        };
        b.on_probe(t0, &view, at, &fail);
        let (_, now) = b.current(dst).unwrap();
        assert_ne!(now, r);
        assert_eq!(b.stats().failovers, 1);
        // It probes again, and no path of the new round crosses the dead link.
        let probes: Vec<ProbeOut> = std::iter::from_fn(|| b.poll_probe()).collect();
        assert!(!probes.is_empty());
        for p in &probes {
            let servers: Vec<Coord> = p.route.servers(view.dims(), Coord::new(0, 0, 0)).collect();
            let mut from = Coord::new(0, 0, 0);
            for (d, to) in p.route.dirs().zip(servers) {
                assert!(!(from == at && d == r.dir(1).unwrap()));
                from = to;
            }
        }
    }

    #[test]
    fn unanswered_paths_fail_at_the_round_deadline_and_idle_flows_are_dropped() {
        let (view, mut b, dst) = setup();
        let t0 = Time::ZERO;
        b.route(t0, &view, dst, &FREE).unwrap();
        let probes: Vec<ProbeOut> = std::iter::from_fn(|| b.poll_probe()).collect();
        // Only the last path answers.
        let last = probes.last().unwrap();
        b.on_probe(t0, &view, dst, &reply(last, 500));
        let deadline = b.poll_timeout().unwrap();
        assert_eq!(deadline, t0 + Duration::from_millis(20));
        b.handle_timeout(deadline, &view);
        assert_eq!(b.current(dst).unwrap().0, usize::from(last.path));
        // Unused for two intervals: forgotten.
        b.handle_timeout(t0 + Duration::from_millis(300), &view);
        assert_eq!(b.flows(), 0);
    }

    #[test]
    fn a_view_that_breaks_the_path_moves_the_flow() {
        let (mut view, mut b, dst) = setup();
        let t0 = Time::ZERO;
        let r = b.route(t0, &view, dst, &FREE).unwrap();
        view.set_link(Coord::new(0, 0, 0), r.first(), false)
            .unwrap();
        b.on_view(t0, &view);
        let (_, now) = b.current(dst).unwrap();
        assert!(now.is_live(&view, Coord::new(0, 0, 0)));
        assert_eq!(b.stats().failovers, 1);
    }
}
