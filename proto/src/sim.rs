//! A packet-level discrete-event simulator of a whole torus, driving the project's own
//! engines (`node::Node`: routing, forwarding, key routing, aggregation, the transport) over
//! simulated links with a line rate, a propagation delay, an MTU and a transmit queue, as
//! CamCube evaluated scale (camcubeos.txt 4.1, 4.2.3-4.2.5). Nothing here re-implements a
//! protocol: it only moves frames between engines and keeps time.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use crate::node::{Event, MsgOptions, Node, RxAction, Target};
use crate::routing::LinkView;
use crate::time::Time;
use crate::topology::{Coord, Dims, Dir, DirSet};
use crate::transport::{Config, SendError};
use crate::wire::ETH_LEN;

/// The simulated network.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    /// The torus.
    pub dims: Dims,
    /// Line rate of every link, bits per second.
    pub rate_bps: u64,
    /// Propagation delay of every link.
    pub delay: Duration,
    /// Frames a link's transmit queue holds.
    pub queue_frames: u32,
    /// Transport settings of every server (its `mtu` is the links' MTU).
    pub transport: Config,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// A frame arrives at `node` on `dir`.
    Arrive(u32, u8, Vec<u8>),
    /// Look at `node`: timers due or links free again.
    Wake(u32),
}

#[derive(Debug, Clone, Copy, Default)]
struct Link {
    busy_until: Time,
}

/// Counters of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Events processed.
    pub events: u64,
    /// Frames put on links.
    pub frames_sent: u64,
    /// Frames dropped: no next hop had room.
    pub dropped_no_room: u64,
    /// Frames dropped by the engines (unreachable, TTL, malformed...).
    pub dropped_engine: u64,
    /// Frames lost because their link or server was down.
    pub lost_on_failure: u64,
}

/// The simulator.
pub struct Sim {
    cfg: SimConfig,
    nodes: Vec<Node>,
    up: Vec<bool>,
    links: Vec<Link>,
    heap: BinaryHeap<Reverse<(Time, u64, Kind)>>,
    seq: u64,
    now: Time,
    view: LinkView,
    /// When each node asked to be woken next (to avoid piling up wake events).
    wake_at: Vec<Option<Time>>,
    buf: Vec<u8>,
    stats: SimStats,
    frame_ns: u64,
    /// Frames in transit waiting for a next hop with room (CamCube queues forwarded packets
    /// rather than dropping them when a link is busy); bounded per server.
    transit: Vec<std::collections::VecDeque<(DirSet, Vec<u8>)>>,
}

/// Frames a server holds in transit before it drops forwarded frames.
const TRANSIT_LIMIT: usize = 256;

impl Sim {
    /// A torus with every server up and every link live.
    pub fn new(cfg: SimConfig) -> Result<Sim, String> {
        let view = LinkView::all_up(cfg.dims).map_err(|e| e.to_string())?;
        let n = cfg.dims.count() as usize;
        let mut nodes = Vec::with_capacity(n);
        for c in cfg.dims.coords() {
            nodes.push(Node::new(c, view.clone(), cfg.transport).map_err(|e| e.to_string())?);
        }
        let frame_ns = ((cfg.transport.mtu as u64 + ETH_LEN as u64 + 24) * 8 * 1_000_000_000)
            / cfg.rate_bps.max(1);
        Ok(Sim {
            cfg,
            nodes,
            up: vec![true; n],
            links: vec![Link::default(); n * 6],
            heap: BinaryHeap::new(),
            seq: 0,
            now: Time::ZERO,
            view,
            wake_at: vec![None; n],
            buf: vec![0u8; ETH_LEN + cfg.transport.mtu],
            stats: SimStats::default(),
            frame_ns,
            transit: (0..n).map(|_| std::collections::VecDeque::new()).collect(),
        })
    }

    /// The torus.
    pub fn dims(&self) -> Dims {
        self.cfg.dims
    }

    /// Simulated time now.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Counters so far.
    pub fn stats(&self) -> SimStats {
        self.stats
    }

    /// Server `i`'s engine.
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// Whether server `i` is up.
    pub fn is_up(&self, i: usize) -> bool {
        self.up[i]
    }

    fn push(&mut self, at: Time, k: Kind) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, k)));
    }

    fn wake(&mut self, node: usize, at: Time) {
        if self.wake_at[node].is_some_and(|t| t <= at && t >= self.now) {
            return;
        }
        self.wake_at[node] = Some(at);
        self.push(at, Kind::Wake(node as u32));
    }

    /// Sends a message from server `i` (the engine decides everything else).
    pub fn send(
        &mut self,
        i: usize,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError> {
        if !self.up[i] {
            return Err(SendError::WouldBlock);
        }
        let now = self.now;
        let r = self.nodes[i].send(now, target, service, data, opts);
        self.wake(i, now);
        r
    }

    /// Crashes server `c`: it stops at once (frames to it are lost), but nobody knows yet:
    /// the views change only when [`Sim::set_server`] reports the failure (detection).
    pub fn crash(&mut self, c: Coord) {
        let i = self.cfg.dims.index(c);
        self.up[i] = false;
        self.stats.lost_on_failure += self.transit[i].len() as u64;
        self.transit[i].clear();
    }

    /// Fails or restores server `c` in everyone's view (as the control plane would after
    /// detecting it); a failed server also stops, a restored one starts afresh.
    pub fn set_server(&mut self, c: Coord, up: bool) {
        let i = self.cfg.dims.index(c);
        if self.view.is_up(c) == up && self.up[i] == up {
            return;
        }
        if up {
            if let Ok(n) = Node::new(c, self.view.clone(), self.cfg.transport) {
                self.nodes[i] = n;
            }
            self.up[i] = true;
        } else {
            self.crash(c);
        }
        let _ = self.view.set_server(c, up);
        for j in 0..self.nodes.len() {
            if self.up[j] {
                let _ = self.nodes[j].set_view(self.view.clone());
                let now = self.now;
                self.wake(j, now);
            }
        }
    }

    /// The current view.
    pub fn view(&self) -> &LinkView {
        &self.view
    }

    /// Links of `i` with room. The server's own frames may fill a quarter of a queue; frames in
    /// transit may use all of it, so a busy server cannot starve the traffic it forwards
    /// (which would be dropped and retransmitted end to end).
    fn room(&self, i: usize, transit: bool) -> DirSet {
        let mut r = DirSet::EMPTY;
        let frames = if transit {
            self.cfg.queue_frames
        } else {
            self.cfg.queue_frames / 4
        };
        let limit = self.frame_ns * u64::from(frames.max(1));
        for d in self.cfg.dims.link_dirs().iter() {
            let l = &self.links[i * 6 + usize::from(d.index())];
            if l.busy_until.0 <= self.now.0 + limit {
                r = r.with(d);
            }
        }
        r
    }

    /// When a link of `i` gets room again (the earliest), if one is full.
    fn next_room(&self, i: usize) -> Option<Time> {
        let frames = if self.transit[i].is_empty() {
            self.cfg.queue_frames / 4
        } else {
            self.cfg.queue_frames
        };
        let limit = self.frame_ns * u64::from(frames.max(1));
        self.cfg
            .dims
            .link_dirs()
            .iter()
            .map(|d| {
                self.links[i * 6 + usize::from(d.index())]
                    .busy_until
                    .0
                    .saturating_sub(limit)
            })
            .filter(|t| *t > self.now.0)
            .min()
            .map(Time)
    }

    fn transmit(&mut self, i: usize, dir: Dir, frame: Vec<u8>) {
        let dims = self.cfg.dims;
        let c = dims.coord(i);
        let j = dims.index(dims.neighbor(c, dir));
        let l = &mut self.links[i * 6 + usize::from(dir.index())];
        let start = l.busy_until.max(self.now);
        let tx = ((frame.len() as u64 + 24) * 8 * 1_000_000_000) / self.cfg.rate_bps.max(1);
        l.busy_until = Time(start.0 + tx);
        let arrive = Time(start.0 + tx) + self.cfg.delay;
        self.stats.frames_sent += 1;
        if !self.up[j] || !self.view.live_dirs(c).contains(dir) {
            self.stats.lost_on_failure += 1;
            return;
        }
        self.push(
            arrive,
            Kind::Arrive(j as u32, dir.opposite().index(), frame),
        );
    }

    /// Lets server `i` act: timers, then frames while its links have room.
    fn service(&mut self, i: usize) {
        if !self.up[i] {
            return;
        }
        let now = self.now;
        if self.nodes[i].poll_timeout().is_some_and(|t| t <= now) {
            self.nodes[i].handle_timeout(now);
        }
        // Frames in transit first, in order, each on a next hop with room.
        let mut k = 0;
        while k < self.transit[i].len() {
            let room = self.room(i, true);
            if room.is_empty() {
                break;
            }
            let hops = self.transit[i][k].0;
            match hops.iter().find(|h| room.contains(*h)) {
                Some(h) => {
                    if let Some((_, frame)) = self.transit[i].remove(k) {
                        self.transmit(i, h, frame);
                    }
                }
                None => k += 1,
            }
        }
        loop {
            let room = self.room(i, false);
            if room.is_empty() {
                break;
            }
            let mut buf = std::mem::take(&mut self.buf);
            let out = self.nodes[i].poll_transmit(now, room, &mut buf);
            match out {
                Some((dir, len)) => {
                    let frame = buf[..len].to_vec();
                    self.buf = buf;
                    self.transmit(i, dir, frame);
                }
                None => {
                    self.buf = buf;
                    break;
                }
            }
        }
        let mut next = self.nodes[i].poll_timeout().filter(|t| *t > now);
        if self.nodes[i].has_pending() || !self.transit[i].is_empty() {
            if let Some(r) = self.next_room(i) {
                next = Some(next.map_or(r, |n| n.min(r)));
            }
        }
        if let Some(t) = next {
            self.wake(i, t);
        }
    }

    /// Runs until simulated time `until`, handing every event the engines produce to
    /// `on_event(sim_time, server, event)`.
    pub fn run_until(&mut self, until: Time, mut on_event: impl FnMut(Time, usize, Event)) {
        while let Some(Reverse((t, _, _))) = self.heap.peek() {
            if *t > until {
                break;
            }
            let Some(Reverse((t, _, k))) = self.heap.pop() else {
                break;
            };
            self.now = t;
            self.stats.events += 1;
            match k {
                Kind::Arrive(n, d, mut frame) => {
                    let n = n as usize;
                    if !self.up[n] {
                        self.stats.lost_on_failure += 1;
                        continue;
                    }
                    let Some(dir) = Dir::from_index(d) else {
                        continue;
                    };
                    match self.nodes[n].handle_rx(t, dir, &mut frame) {
                        RxAction::Consumed => {}
                        RxAction::Drop(_) => self.stats.dropped_engine += 1,
                        RxAction::Forward(hops) => {
                            let room = self.room(n, true);
                            match hops.iter().find(|h| room.contains(*h)) {
                                Some(h) if self.transit[n].is_empty() => self.transmit(n, h, frame),
                                _ if self.transit[n].len() < TRANSIT_LIMIT => {
                                    self.transit[n].push_back((hops, frame));
                                }
                                _ => self.stats.dropped_no_room += 1,
                            }
                        }
                    }
                    while let Some(e) = self.nodes[n].poll_event() {
                        on_event(t, n, e);
                    }
                    self.service(n);
                }
                Kind::Wake(n) => {
                    let n = n as usize;
                    if self.wake_at[n] == Some(t) {
                        self.wake_at[n] = None;
                    }
                    self.service(n);
                    while let Some(e) = self.nodes[n].poll_event() {
                        on_event(t, n, e);
                    }
                }
            }
        }
        self.now = self.now.max(until);
    }
}

/// The expected all-to-all throughput per server (bits/s): every server's links carry its
/// share of everyone's traffic, so it is links x rate / the mean hop count to the others.
pub fn all_to_all_bound(dims: Dims, rate_bps: u64) -> f64 {
    let Ok(view) = LinkView::all_up(dims) else {
        return 0.0;
    };
    let Ok(d) = view.distances_from(Coord::new(0, 0, 0)) else {
        return 0.0;
    };
    let n = dims.count() as f64;
    let mean = d.iter().map(|x| f64::from(*x)).sum::<f64>() / (n - 1.0).max(1.0);
    f64::from(dims.link_dirs().len()) * rate_bps as f64 / mean.max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_matches_the_papers_figures() {
        let g = |k: u16| all_to_all_bound(Dims::new(k, k, k).unwrap(), 1_000_000_000) / 1e9;
        assert!((g(3) - 2.89).abs() < 0.01, "{}", g(3));
        assert!((g(8) - 1.0).abs() < 0.01, "{}", g(8));
        assert!((g(16) - 0.5).abs() < 0.01, "{}", g(16));
    }
}
