//! A packet-level discrete-event simulator of a whole torus, driving the project's own
//! engines (`node::Node`: routing, forwarding, key routing, aggregation, the transport) over
//! simulated links with a line rate, a propagation delay, an MTU and a transmit queue, as
//! CamCube evaluated scale (CamCubeOS paper 4.1, 4.2.3-4.2.5). Nothing here re-implements a
//! protocol: it only moves frames between engines and keeps time.

mod control;
mod frame;
mod queue;

use std::collections::VecDeque;
use std::time::Duration;

use crate::control::ControlNode;
use crate::node::{DropReason, Event, MsgOptions, Node, RxAction, Target};
use crate::routing::LinkView;
use crate::time::Time;
use crate::topology::{Coord, Dims, Dir, DirSet};
use crate::transport::{Config, SendError};
use crate::wire::ETH_LEN;
use frame::{FramePool, SimFrame};

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
    /// Forward on the least-backlogged of the engine's next hops (else the first with
    /// room, in direction order: a forwarder that ignores load).
    pub spread_by_load: bool,
}

/// A frame on a link, in transmission order (a link delivers in FIFO order, so only the
/// head of each link's queue needs a place in the event heap).
#[derive(Debug)]
struct OnWire {
    arrive: Time,
    frame: SimFrame,
}

#[derive(Debug, Default)]
struct Link {
    busy_until: Time,
    wire: VecDeque<OnWire>,
    /// The server at the far end.
    far: u32,
    /// Whether the link is live in the current view (cached from the view per change).
    live: bool,
}

/// Counters of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Events processed.
    pub events: u64,
    /// Of which server wake-ups (timers, link room).
    pub wakes: u64,
    /// Frames forwarded on at once by a server they passed through.
    pub forwarded: u64,
    /// Frames put on links.
    pub frames_sent: u64,
    /// Frames dropped: no next hop had room.
    pub dropped_no_room: u64,
    /// Frames dropped by the engines (unreachable, TTL, malformed...).
    pub dropped_engine: u64,
    /// Frames lost because their link or server was down.
    pub lost_on_failure: u64,
    /// Key-routed messages still queued at a server when it failed.
    pub lost_with_sender: u64,
    /// Key-routed messages their source dropped: no server took keys in its view (engines
    /// replaced by a restart included).
    pub key_no_root: u64,
    /// Frames the engines dropped, by reason (in [`DropReason::ALL`]'s order).
    pub dropped_by: [u64; 7],
    /// Frames a server forwarded back over the link they came in on (views that disagree
    /// bounce a frame between two servers until one of them learns).
    pub bounced: u64,
    /// Control-plane frames (hellos, flooded records) put on links.
    pub control_frames: u64,
}

/// The simulator.
pub struct Sim {
    cfg: SimConfig,
    nodes: Vec<Node>,
    up: Vec<bool>,
    links: Vec<Link>,
    /// Pending events, `(time, id, address)`: `id` below `links.len()` is the head frame of
    /// that link arriving (`address` locates its bytes, only to prefetch them); above it, a
    /// wake-up of server `id - links.len()`. Ties go by id, so a run is deterministic.
    heap: queue::EventQueue,
    now: Time,
    view: LinkView,
    /// When each node asked to be woken next (to avoid piling up wake events).
    wake_at: Vec<Option<Time>>,
    pool: FramePool,
    /// Servers serviced outside a run (by [`Sim::send`]), whose events are still to be
    /// handed out.
    serviced: Vec<u32>,
    stats: SimStats,
    frame_ns: u64,
    /// Frames in transit waiting for a next hop with room (CamCube queues forwarded packets
    /// rather than dropping them when a link is busy); bounded per server.
    transit: Vec<VecDeque<(DirSet, SimFrame)>>,
    /// Every server's own control plane, when the simulator runs them
    /// ([`Sim::enable_control`]); empty when every server shares the simulator's view.
    control: Vec<ControlNode>,
    /// The settings every control plane starts from.
    control_template: Option<crate::control::ControlConfig>,
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
            links: (0..n * 6)
                .map(|id| {
                    let (c, d) = (cfg.dims.coord(id / 6), Dir::ALL[id % 6]);
                    Link {
                        far: cfg.dims.neighbor_index(id / 6, c, d) as u32,
                        live: view.live_dirs(c).contains(d),
                        ..Link::default()
                    }
                })
                .collect(),
            heap: queue::EventQueue::default(),
            now: Time::ZERO,
            view,
            wake_at: vec![None; n],
            pool: FramePool::default(),
            serviced: Vec::new(),
            stats: SimStats::default(),
            frame_ns,
            transit: (0..n).map(|_| VecDeque::new()).collect(),
            control: Vec::new(),
            control_template: None,
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
        let mut s = self.stats;
        s.key_no_root += self
            .nodes
            .iter()
            .map(|n| n.stats().key_no_root)
            .sum::<u64>();
        s
    }

    /// Server `i`'s engine.
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// Whether server `i` is up.
    pub fn is_up(&self, i: usize) -> bool {
        self.up[i]
    }

    /// Server `i`'s engine, to configure it (service weights and queues).
    pub fn node_mut(&mut self, i: usize) -> &mut Node {
        &mut self.nodes[i]
    }

    /// Server `i` as a service hosted on it sees the engine: what it sends goes out through
    /// the simulator at once. Services run in the simulator exactly as in torusd.
    pub fn engine(&mut self, i: usize) -> SimEngine<'_> {
        SimEngine { sim: self, i }
    }

    fn wake(&mut self, node: usize, at: Time) {
        if self.wake_at[node].is_some_and(|t| t <= at && t >= self.now) {
            return;
        }
        self.wake_at[node] = Some(at);
        self.heap.push((at, (self.links.len() + node) as u32, 0));
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
        // Serviced at once, not through a wake-up event at the same instant (that was a
        // fifth of all events); what it delivers locally is handed out by the next run.
        self.service(i);
        self.serviced.push(i as u32);
        r
    }

    /// Crashes server `c`: it stops at once (frames to it are lost), but nobody knows yet:
    /// the views change only when [`Sim::set_server`] reports the failure (detection).
    pub fn crash(&mut self, c: Coord) {
        let i = self.cfg.dims.index(c);
        self.up[i] = false;
        self.stats.lost_with_sender += self.nodes[i].queued_key_messages() as u64;
        self.stats.lost_on_failure += self.transit[i].len() as u64;
        for (_, f) in std::mem::take(&mut self.transit[i]) {
            self.pool.give_frame(f);
        }
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
        for d in Dir::ALL {
            let id = i * 6 + usize::from(d.index());
            let live = self.view.live_dirs(c).contains(d);
            self.links[id].live = live;
            let far = self.links[id].far as usize;
            self.links[far * 6 + usize::from(d.opposite().index())].live = live;
        }
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

    /// Frames of backlog a link may hold for frames in transit, and for the server's own:
    /// a quarter of the queue, so that traffic passing through always finds room and is not
    /// dropped to be retransmitted end to end because a busy server filled its links.
    fn limit(&self, transit: bool) -> u64 {
        let q = u64::from(self.cfg.queue_frames.max(1));
        if transit {
            q
        } else {
            (q / 4).max(1)
        }
    }

    /// Links of `i` with room in their transmit queue for transit or own frames.
    fn room(&self, i: usize, transit: bool) -> DirSet {
        let limit = self.frame_ns * self.limit(transit);
        let mut r = DirSet::EMPTY;
        for d in self.cfg.dims.link_dirs().iter() {
            let l = &self.links[i * 6 + usize::from(d.index())];
            if l.busy_until.0 <= self.now.0 + limit {
                r = r.with(d);
            }
        }
        r
    }

    /// Of the next hops `hops` of server `i` with room, the one with the shortest backlog:
    /// shortest paths in a torus tie (every dimension a packet still has to cross, and both
    /// ways round an even ring at half the way), and spreading over the ties by load is
    /// what lets all-to-all traffic use every link.
    fn least_loaded(&self, i: usize, hops: DirSet, room: DirSet) -> Option<Dir> {
        let mut with_room = hops.iter().filter(|h| room.contains(*h));
        if !self.cfg.spread_by_load {
            return with_room.next();
        }
        with_room.min_by_key(|h| self.links[i * 6 + usize::from(h.index())].busy_until)
    }

    /// When a full link of `i` has drained half of what `transit` or own frames may fill,
    /// the earliest. Waking for every single free slot would cost an event per frame sent;
    /// refilling in batches, as a NIC's transmit ring is, still never lets the link idle.
    fn next_room(&self, i: usize, transit: bool) -> Option<Time> {
        let refill = self.frame_ns * (self.limit(transit) / 2).max(1);
        self.cfg
            .dims
            .link_dirs()
            .iter()
            .map(|d| {
                self.links[i * 6 + usize::from(d.index())]
                    .busy_until
                    .0
                    .saturating_sub(refill)
            })
            .filter(|t| *t > self.now.0)
            .min()
            .map(Time)
    }

    /// Passes on the first frame in transit at `i` that has a next hop with room.
    fn send_transit(&mut self, i: usize, room: DirSet) -> bool {
        let Some((k, h)) = self.transit[i]
            .iter()
            .enumerate()
            .find_map(|(k, (hops, _))| Some((k, self.least_loaded(i, *hops, room)?)))
        else {
            return false;
        };
        match self.transit[i].remove(k) {
            Some((_, frame)) => {
                self.transmit(i, h, frame);
                true
            }
            None => false,
        }
    }

    /// Lets the engine of `i` put out one frame of its own on a link in `room`.
    fn send_own(&mut self, i: usize, room: DirSet) -> bool {
        let now = self.now;
        let mut buf = self.pool.take(ETH_LEN + self.cfg.transport.mtu);
        match self.nodes[i].poll_transmit(now, room, &mut buf) {
            Some((dir, len)) => {
                let f = self.pool.frame(buf, len);
                self.transmit(i, dir, f);
                true
            }
            None => {
                self.pool.give(buf);
                false
            }
        }
    }

    fn transmit(&mut self, i: usize, dir: Dir, frame: SimFrame) {
        let id = i * 6 + usize::from(dir.index());
        let l = &mut self.links[id];
        let j = l.far as usize;
        let start = l.busy_until.max(self.now);
        let tx = ((frame.len() as u64 + 24) * 8 * 1_000_000_000) / self.cfg.rate_bps.max(1);
        l.busy_until = Time(start.0 + tx);
        let arrive = Time(start.0 + tx) + self.cfg.delay;
        self.stats.frames_sent += 1;
        let control = is_control(&frame.head);
        self.stats.control_frames += u64::from(control);
        if !self.up[j] || !l.live {
            // A hello into a dead server is how its death is noticed, not a loss of data.
            self.stats.lost_on_failure += u64::from(!control);
            self.pool.give_frame(frame);
            return;
        }
        if l.wire.is_empty() {
            self.heap
                .push((arrive, id as u32, frame.head.as_ptr() as usize));
        }
        l.wire.push_back(OnWire { arrive, frame });
    }

    /// Lets server `i` act: timers, then frames while its links have room.
    fn service(&mut self, i: usize) {
        if !self.up[i] {
            return;
        }
        let now = self.now;
        self.run_control(i);
        if self.nodes[i].poll_timeout().is_some_and(|t| t <= now) {
            self.nodes[i].handle_timeout(now);
        }
        // Frames in transit and the server's own take turns for link room, as CamCube's
        // per-link scheduler shares a link among services; own frames only up to their
        // smaller share of the queue.
        let (mut transit, mut own) = (true, true);
        while transit || own {
            if transit {
                let room = self.room(i, true);
                transit =
                    !room.is_empty() && !self.transit[i].is_empty() && self.send_transit(i, room);
            }
            if own {
                let room = self.room(i, false);
                own = !room.is_empty() && self.send_own(i, room);
            }
        }
        let mut next = self.nodes[i].poll_timeout().filter(|t| *t > now);
        if let Some(t) = self.control_timeout(i) {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        let waits = [
            (!self.transit[i].is_empty()).then(|| self.next_room(i, true)),
            self.nodes[i]
                .has_pending()
                .then(|| self.next_room(i, false)),
        ];
        for r in waits.into_iter().flatten().flatten() {
            next = Some(next.map_or(r, |n| n.min(r)));
        }
        if let Some(t) = next {
            self.wake(i, t);
        }
    }

    /// Runs until simulated time `until`, handing every event the engines produce to
    /// `on_event(sim_time, server, event)`.
    pub fn run_until(&mut self, until: Time, mut on_event: impl FnMut(Time, usize, Event)) {
        for n in std::mem::take(&mut self.serviced) {
            let n = n as usize;
            while let Some(e) = self.nodes[n].poll_event() {
                on_event(self.now, n, e);
            }
        }
        while let Some((t, id, _)) = self.heap.peek() {
            if t > until {
                break;
            }
            self.now = t;
            self.stats.events += 1;
            let id = id as usize;
            if id >= self.links.len() {
                self.heap.pop();
                let n = id - self.links.len();
                self.stats.wakes += 1;
                if self.wake_at[n] == Some(t) {
                    self.wake_at[n] = None;
                }
                self.service(n);
                while let Some(e) = self.nodes[n].poll_event() {
                    on_event(t, n, e);
                }
                continue;
            }
            self.heap.pop();
            let l = &mut self.links[id];
            let frame = l.wire.pop_front().map(|w| w.frame);
            if let Some(next) = l.wire.front() {
                self.heap
                    .push((next.arrive, id as u32, next.frame.head.as_ptr() as usize));
            }
            self.touch_next();
            if let Some(frame) = frame {
                self.arrive(t, id, frame, &mut on_event);
            }
        }
        self.now = self.now.max(until);
    }

    /// Runs until `until` with `svc[i]` hosted on server `i`, as torusd hosts its services:
    /// every `step` of simulated time, each service gets the events for its ids (and the
    /// view's) and is polled when its timer is due. Returns the other events.
    pub fn run_services<S: crate::service::Service>(
        &mut self,
        until: Time,
        step: Duration,
        svc: &mut [S],
    ) -> Vec<(Time, usize, Event)> {
        let mut other = Vec::new();
        while self.now < until {
            let next = (self.now + step).min(until);
            let mut evs = Vec::new();
            self.run_until(next, |t, i, e| evs.push((t, i, e)));
            let now = self.now;
            for (t, i, e) in evs {
                let mine = match &e {
                    Event::Message { service, .. }
                    | Event::Acked { service, .. }
                    | Event::Failed { service, .. } => svc.get(i).is_some_and(|s| s.owns(*service)),
                    _ => true,
                };
                if !self.up[i] || i >= svc.len() {
                    continue;
                }
                if mine {
                    let mut eng = self.engine(i);
                    svc[i].on_event(now, &e, &mut eng);
                }
                if !matches!(
                    e,
                    Event::Message { .. } | Event::Acked { .. } | Event::Failed { .. }
                ) || !mine
                {
                    other.push((t, i, e));
                }
            }
            let mut any = false;
            for i in 0..svc.len().min(self.nodes.len()) {
                if !self.up[i] {
                    continue;
                }
                match svc[i].poll_timeout() {
                    Some(t) if t <= now => {
                        let mut eng = self.engine(i);
                        svc[i].poll(now, &mut eng);
                        any = true;
                    }
                    Some(_) => any = true,
                    None => {}
                }
            }
            if !any && self.heap.is_empty() && self.serviced.is_empty() {
                break;
            }
        }
        other
    }

    /// Starts loading the header of the frame the next event delivers. Frames wait on links
    /// long enough to leave the cache, so reading a header is a memory miss per hop; issued
    /// one event ahead, it overlaps with this event's work instead of stalling the next.
    fn touch_next(&mut self) {
        if let Some((_, _, at)) = self.heap.peek() {
            if at != 0 {
                prefetch(at as *const u8);
            }
        }
    }

    /// Hands a frame that crossed link `id` to the server at its far end.
    fn arrive(
        &mut self,
        t: Time,
        id: usize,
        frame: SimFrame,
        on_event: &mut impl FnMut(Time, usize, Event),
    ) {
        let Some(dir) = Dir::from_index((id % 6) as u8) else {
            return;
        };
        let n = self.links[id].far as usize;
        if !self.up[n] {
            self.stats.lost_on_failure += u64::from(!is_control(&frame.head));
            self.pool.give_frame(frame);
            return;
        }
        if !self.control.is_empty() {
            if is_control(&frame.head) {
                self.control[n].handle_frame(t, dir.opposite(), &frame.head);
                self.pool.give_frame(frame);
                self.service(n);
                return;
            }
            // A take-over instant due now is honoured before the frame is judged.
            if self.control_due(n) {
                self.run_control(n);
            }
        }
        // A frame held as its head is judged on it when the engine can (passing through);
        // otherwise it is rebuilt and handed over whole.
        let mut frame = frame;
        let len = frame.len();
        let by_head = if frame.is_compact() {
            self.nodes[n].handle_rx_head(&mut frame.head, len)
        } else {
            None
        };
        let (action, frame) = match by_head {
            Some(a) => (a, frame),
            None => {
                let mut whole = self.pool.expand(frame);
                let a = self.nodes[n].handle_rx(t, dir.opposite(), &mut whole);
                (a, SimFrame::whole(whole))
            }
        };
        let mut passed_on = false;
        match action {
            RxAction::Consumed => self.pool.give_frame(frame),
            RxAction::Drop(why) => {
                self.stats.dropped_engine += 1;
                if let Some(k) = DropReason::ALL.iter().position(|r| *r == why) {
                    self.stats.dropped_by[k] += 1;
                }
                self.pool.give_frame(frame);
            }
            RxAction::Forward(hops) => {
                let room = self.room(n, true);
                match self.least_loaded(n, hops, room) {
                    Some(h) if self.transit[n].is_empty() => {
                        self.stats.bounced += u64::from(h == dir.opposite());
                        self.stats.forwarded += 1;
                        self.transmit(n, h, frame);
                        passed_on = true;
                    }
                    _ if self.transit[n].len() < TRANSIT_LIMIT => {
                        self.transit[n].push_back((hops, frame));
                    }
                    _ => {
                        self.stats.dropped_no_room += 1;
                        self.pool.give_frame(frame);
                    }
                }
            }
        }
        while let Some(e) = self.nodes[n].poll_event() {
            on_event(t, n, e);
        }
        // A frame passed straight on changes nothing the server's own traffic or timers
        // depend on; servicing the server for it would only cost time.
        if !passed_on {
            self.service(n);
        }
    }
}

/// Whether `frame` is a control-plane frame (its EtherType).
fn is_control(frame: &[u8]) -> bool {
    frame.get(12..14) == Some(&crate::wire::ETHERTYPE_CONTROL.to_be_bytes()[..])
}

/// One server of the simulator as an [`Engine`](crate::service::Engine) for its services.
pub struct SimEngine<'a> {
    sim: &'a mut Sim,
    i: usize,
}

impl crate::service::Engine for SimEngine<'_> {
    fn local(&self) -> Coord {
        self.sim.nodes[self.i].local()
    }
    fn dims(&self) -> Dims {
        self.sim.cfg.dims
    }
    fn incarnation(&self) -> u64 {
        self.sim.nodes[self.i].transport().config().incarnation
    }
    fn is_reachable(&self, c: Coord) -> bool {
        self.sim.nodes[self.i].routes().is_reachable(c)
    }
    fn takes_keys(&self, c: Coord) -> bool {
        self.sim.nodes[self.i].routes().takes_keys(c)
    }
    fn distance(&self, c: Coord) -> Option<u32> {
        self.sim.nodes[self.i].routes().distance(c)
    }
    fn key_root(&self, key: u64) -> Option<Coord> {
        self.sim.nodes[self.i].key_root(key)
    }
    fn send(
        &mut self,
        _now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError> {
        self.sim.send(self.i, target, service, data, opts)
    }
    fn notify_acks(&mut self, service: u16, on: bool) {
        self.sim.nodes[self.i].notify_acks(service, on);
    }
}

/// Asks the CPU to start loading the cache line at `p`.
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it never faults and reads nothing the program sees,
    // whatever the address; SSE is part of the x86_64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
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

/// The expected all-to-all throughput per live server (bits/s) under `view`, with failed
/// servers and links: the live links' capacity shared by every live pair's traffic, which
/// crosses the mean shortest-path hop count between live servers.
pub fn all_to_all_bound_view(view: &LinkView, rate_bps: u64) -> f64 {
    let dims = view.dims();
    let live: Vec<Coord> = dims.coords().filter(|c| view.is_up(*c)).collect();
    if live.len() < 2 {
        return 0.0;
    }
    let (mut hops, mut pairs, mut links) = (0u64, 0u64, 0u64);
    for &c in &live {
        links += view.live_dirs(c).len() as u64;
        if let Ok(d) = view.distances_from(c) {
            for &o in &live {
                let x = d[dims.index(o)];
                if o != c && x != crate::routing::UNREACHABLE {
                    hops += u64::from(x);
                    pairs += 1;
                }
            }
        }
    }
    if hops == 0 {
        return 0.0;
    }
    // Per live server: its share of directed link capacity over the mean path length.
    (links as f64 / live.len() as f64) * rate_bps as f64 / (hops as f64 / pairs as f64)
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
        // With nobody failed the per-view bound is the same figure.
        let dims = Dims::new(4, 4, 4).unwrap();
        let v = LinkView::all_up(dims).unwrap();
        let a = all_to_all_bound(dims, 1_000_000_000);
        assert!((all_to_all_bound_view(&v, 1_000_000_000) - a).abs() < 1.0);
        // Failed servers take their links with them and lengthen paths: less per server.
        let mut w = v.clone();
        w.set_server(Coord::new(1, 1, 1), false).unwrap();
        w.set_server(Coord::new(2, 3, 0), false).unwrap();
        let b = all_to_all_bound_view(&w, 1_000_000_000);
        assert!(b < a && b > 0.8 * a, "{b} vs {a}");
    }
}
