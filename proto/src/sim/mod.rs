//! A packet-level discrete-event simulator of a whole torus, driving the project's own
//! engines (`node::Node`: routing, forwarding, key routing, aggregation, the transport) over
//! simulated links with a line rate, a propagation delay, an MTU and a transmit queue, as
//! CamCube evaluated scale (CamCubeOS paper 4.1, 4.2.3-4.2.5). Nothing here re-implements a
//! protocol: it only moves frames between engines and keeps time.

mod control;
mod frame;
mod part;
mod queue;
mod window;
mod workers;

use std::sync::Arc;
use std::time::Duration;

use crate::node::{DropReason, Event, MsgOptions, Node, Target};
use crate::routing::bsr::BsrConfig;
use crate::routing::load::LinkMeter;
use crate::routing::LinkView;
use crate::time::Time;
use crate::topology::{Coord, Dims, Dir};
use crate::transport::{Config, SendError};
use crate::wire::ETH_LEN;
use part::{Ctx, Part};
use workers::Workers;

/// Spare frame buffers each simulated engine keeps ([`Config::spare_frames`]).
const SIM_SPARE_FRAMES: usize = 64;

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

/// A directed link: when it is free to send again, and where it goes. The frames on it
/// wait in their part's [`frame::FrameSlab`], each with its arrival in the event queue.
#[derive(Debug, Default)]
struct Link {
    busy_until: Time,
    /// The server at the far end.
    far: u32,
    /// Whether the link is live in the current view (cached from the view per change).
    live: bool,
    /// Bytes put on the link (frames with their preamble and gap), for its load figure.
    tx_bytes: u64,
    /// The fraction of time it has been sending lately, per mille (frames' telemetry).
    util: u64,
    /// When its last frame started.
    last_start: Time,
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
    /// Frames the engines dropped, by reason (in [`crate::node::DropReason::ALL`]'s order).
    pub dropped_by: [u64; DropReason::ALL.len()],
    /// Frames a server forwarded back over the link they came in on (views that disagree
    /// bounce a frame between two servers until one of them learns).
    pub bounced: u64,
    /// Control-plane frames (hellos, flooded records) put on links.
    pub control_frames: u64,
}

impl SimStats {
    /// Adds `o`'s counts to these.
    fn add(&mut self, o: &SimStats) {
        self.events += o.events;
        self.wakes += o.wakes;
        self.forwarded += o.forwarded;
        self.frames_sent += o.frames_sent;
        self.dropped_no_room += o.dropped_no_room;
        self.dropped_engine += o.dropped_engine;
        self.lost_on_failure += o.lost_on_failure;
        self.lost_with_sender += o.lost_with_sender;
        self.key_no_root += o.key_no_root;
        for (a, b) in self.dropped_by.iter_mut().zip(o.dropped_by) {
            *a += b;
        }
        self.bounced += o.bounced;
        self.control_frames += o.control_frames;
    }
}

/// The simulator.
pub struct Sim {
    /// The network, which servers are up and where the parts begin: what the parts read
    /// during a run (the parts' threads get clones; `up` is copied on change only if one
    /// still holds it).
    ctx: Ctx,
    /// The servers, in contiguous ranges, each with its links and pending events.
    parts: Vec<Part>,
    /// Threads that run the parts.
    threads: usize,
    /// The threads beside the caller's that run parts, when there are several.
    workers: Option<Workers>,
    now: Time,
    view: LinkView,
    /// Events of servers serviced outside a run (by [`Sim::send`], [`Sim::send_many`]),
    /// taken from their engines at once and handed out by the next run.
    pending: Vec<(u32, Event)>,
    /// Counts of engines replaced by restarts.
    retired: SimStats,
    /// The settings every control plane starts from.
    control_template: Option<crate::control::ControlConfig>,
    /// Path selection every engine runs for its own traffic (source routing), when set.
    source_routing: Option<BsrConfig>,
    /// One meter per directed link (server index x 6 + direction), the next sample time and
    /// the period: engines read their links' loads as torusd's pollers measure them.
    meters: Option<(Vec<LinkMeter>, Time, Duration)>,
}

impl Sim {
    /// A torus with every server up and every link live, run on one thread.
    pub fn new(cfg: SimConfig) -> Result<Sim, String> {
        Sim::with_threads(cfg, 1)
    }

    /// A torus with every server up and every link live, its servers split into `threads`
    /// parts run in parallel windows (see the `part` module). A run gives the same result
    /// whatever the number of threads.
    pub fn with_threads(mut cfg: SimConfig, threads: usize) -> Result<Sim, String> {
        // Thousands of engines share this process's memory: each keeps few spare frame
        // buffers (a server of its own keeps a window's worth, to allocate nothing).
        cfg.transport.spare_frames = cfg.transport.spare_frames.min(SIM_SPARE_FRAMES);
        // Every frame an engine builds here is taken by `Part::send_own`, which carries a
        // declared tail as the run it is (with `compact_runs`; without, none is declared).
        cfg.transport.declare_tails = true;
        let view = LinkView::all_up(cfg.dims).map_err(|e| e.to_string())?;
        let n = cfg.dims.count() as usize;
        if threads == 0 || threads > n {
            return Err(format!(
                "{threads} threads for {n} servers: 1 to {n} (one part of the torus each)"
            ));
        }
        if threads > 1 && window::lookahead(&cfg) == 0 {
            return Err("parallel runs need links with a propagation delay".into());
        }
        let frame_ns = ((cfg.transport.mtu as u64 + ETH_LEN as u64 + 24) * 8 * 1_000_000_000)
            / cfg.rate_bps.max(1);
        let bounds: Vec<usize> = (0..=threads).map(|p| p * n / threads).collect();
        let mut parts = Vec::with_capacity(threads);
        for w in bounds.windows(2) {
            let (lo, hi) = (w[0], w[1]);
            let mut nodes = Vec::with_capacity(hi - lo);
            for i in lo..hi {
                let c = cfg.dims.coord(i);
                nodes.push(Node::new(c, view.clone(), cfg.transport).map_err(|e| e.to_string())?);
            }
            let links = (lo * 6..hi * 6)
                .map(|id| {
                    let (c, d) = (cfg.dims.coord(id / 6), Dir::ALL[id % 6]);
                    Link {
                        far: cfg.dims.neighbor_index(id / 6, c, d) as u32,
                        live: view.live_dirs(c).contains(d),
                        ..Link::default()
                    }
                })
                .collect();
            parts.push(Part::new(lo, nodes, links));
        }
        Ok(Sim {
            ctx: Ctx {
                cfg,
                up: Arc::new(vec![true; n]),
                frame_ns,
                nlinks: n * 6,
                bounds: Arc::new(bounds),
            },
            parts,
            threads,
            workers: (threads > 1).then(|| Workers::new(threads)),
            now: Time::ZERO,
            view,
            pending: Vec::new(),
            retired: SimStats::default(),
            control_template: None,
            source_routing: None,
            meters: None,
        })
    }

    /// Makes every engine source-route its own traffic (BSR path selection), now and
    /// after restarts. Call before any traffic.
    pub fn enable_source_routing(&mut self, cfg: BsrConfig) {
        self.source_routing = Some(cfg);
        for p in &mut self.parts {
            for n in &mut p.nodes {
                n.enable_source_routing(cfg);
            }
        }
    }

    /// Measures every link's load every `every` of simulated time (at the end of the run
    /// step in which it falls due) and gives each engine its links' figures, as torusd's
    /// pollers do every 10 ms.
    pub fn measure_link_loads(&mut self, every: Duration) {
        let n = self.ctx.cfg.dims.count() as usize * 6;
        self.meters = Some((
            vec![LinkMeter::new(self.ctx.cfg.rate_bps); n],
            self.now,
            every,
        ));
    }

    fn sample_link_loads(&mut self) {
        let Some((mut meters, next, every)) = self.meters.take() else {
            return;
        };
        if self.now >= next {
            let now = self.now;
            let frame_ns = self.ctx.frame_ns.max(1);
            for (gid, meter) in meters.iter_mut().enumerate() {
                let (i, d) = (gid / 6, Dir::ALL[gid % 6]);
                let (p, li) = self.at(i);
                let l = &self.parts[p].links[li * 6 + gid % 6];
                let (tx, far) = (l.tx_bytes, l.far as usize);
                let queue = l.busy_until.0.saturating_sub(now.0) / frame_ns;
                let (q, lf) = self.at(far);
                let rx = self.parts[q].links[lf * 6 + usize::from(d.opposite().index())].tx_bytes;
                meter.sample(now, tx, rx, queue);
                let load = meter.load();
                self.parts[p].nodes[li].set_link_load(d, load);
            }
            self.meters = Some((meters, now + every, every));
        } else {
            self.meters = Some((meters, next, every));
        }
    }

    /// The torus.
    pub fn dims(&self) -> Dims {
        self.ctx.cfg.dims
    }

    /// Threads (and parts of the torus) the simulator runs on.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Simulated time now.
    pub fn now(&self) -> Time {
        self.now
    }

    /// The part server `i` is in, and its index there.
    fn at(&self, i: usize) -> (usize, usize) {
        let p = part::part_of(&self.ctx.bounds, i);
        (p, i - self.ctx.bounds[p])
    }

    /// Counters so far.
    pub fn stats(&self) -> SimStats {
        let mut s = self.retired;
        for p in &self.parts {
            s.add(&p.stats);
            s.key_no_root += p.nodes.iter().map(|n| n.stats().key_no_root).sum::<u64>();
        }
        s
    }

    /// Server `i`'s engine.
    pub fn node(&self, i: usize) -> &Node {
        let (p, li) = self.at(i);
        &self.parts[p].nodes[li]
    }

    /// Whether server `i` is up.
    pub fn is_up(&self, i: usize) -> bool {
        self.ctx.up[i]
    }

    /// Server `i`'s engine, to configure it (service weights and queues).
    pub fn node_mut(&mut self, i: usize) -> &mut Node {
        let (p, li) = self.at(i);
        &mut self.parts[p].nodes[li]
    }

    /// Server `i` as a service hosted on it sees the engine: what it sends goes out through
    /// the simulator at once. Services run in the simulator exactly as in torusd.
    pub fn engine(&mut self, i: usize) -> SimEngine<'_> {
        SimEngine { sim: self, i }
    }

    fn wake(&mut self, i: usize, at: Time) {
        let (p, li) = self.at(i);
        self.parts[p].wake(&self.ctx, li, at);
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
        let (p, li) = self.at(i);
        let r = self.parts[p].send(&self.ctx, li, target, service, data, opts, None);
        self.parts[p].take_events(&self.ctx, li, &mut self.pending);
        r
    }

    /// Sends `data` from many servers at once: `sends[k]` is a source and its target, and
    /// the `k`th result is what [`Sim::send`] would have returned for it. Each part sends
    /// for its own servers, in parallel; the outcome is that of the sends one by one in
    /// order (a send changes only its source and the links leaving it).
    pub fn send_many(
        &mut self,
        sends: &[(usize, Target)],
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Vec<Result<(), SendError>> {
        let mut mine: Vec<Vec<(usize, usize, Target)>> = vec![Vec::new(); self.parts.len()];
        for (k, &(i, target)) in sends.iter().enumerate() {
            let (p, li) = self.at(i);
            mine[p].push((k, li, target));
        }
        // Every source sends the same bytes: whether they are a run is looked at once, not
        // by each engine's compacting queue.
        let run = (self.ctx.cfg.transport.compact_runs
            && data.len() >= crate::transport::fair_queue::MIN_RUN)
            .then(|| crate::byte_run::run_value(data))
            .flatten();
        let (ctx, parts) = (self.ctx.clone(), &mut self.parts);
        // Each part also takes its senders' events (the engines are in its cache now;
        // polling them later, one after another on one thread, was a serial pause for all).
        let send = move |p: usize, part: &mut Part, data: &[u8]| {
            let mut events = Vec::new();
            let results = mine[p]
                .iter()
                .enumerate()
                .map(|(at, &(k, li, target))| {
                    // The sources' engines are long out of the cache: their lines are
                    // loaded two sends ahead.
                    if let Some(&(_, ahead, _)) = mine[p].get(at + 2) {
                        part.prefetch_sender(ahead);
                    }
                    let r = part.send(&ctx, li, target, service, data, opts, run);
                    part.take_events(&ctx, li, &mut events);
                    (k, r)
                })
                .collect::<Vec<_>>();
            (results, events)
        };
        let done = match &self.workers {
            Some(w) => {
                // The workers outlive this call: they get their own copy of the message.
                let data: Arc<[u8]> = data.into();
                w.each_part(parts, move |p, part| send(p, part, &data))
            }
            None => (0..parts.len())
                .map(|p| send(p, &mut parts[p], data))
                .collect(),
        };
        let mut out = vec![Ok(()); sends.len()];
        for (results, events) in done {
            for (k, r) in results {
                out[k] = r;
            }
            self.pending.extend(events);
        }
        out
    }

    /// Crashes server `c`: it stops at once (frames to it are lost), but nobody knows yet:
    /// the views change only when [`Sim::set_server`] reports the failure (detection).
    pub fn crash(&mut self, c: Coord) {
        let i = self.ctx.cfg.dims.index(c);
        Arc::make_mut(&mut self.ctx.up)[i] = false;
        let (p, li) = self.at(i);
        self.parts[p].crash(li);
    }

    /// Fails or restores server `c` in everyone's view (as the control plane would after
    /// detecting it); a failed server also stops, a restored one starts afresh.
    pub fn set_server(&mut self, c: Coord, up: bool) {
        let i = self.ctx.cfg.dims.index(c);
        if self.view.is_up(c) == up && self.ctx.up[i] == up {
            return;
        }
        if up {
            if let Ok(mut n) = Node::new(c, self.view.clone(), self.ctx.cfg.transport) {
                if let Some(b) = self.source_routing {
                    n.enable_source_routing(b);
                }
                *self.node_mut(i) = n;
            }
            Arc::make_mut(&mut self.ctx.up)[i] = true;
        } else {
            self.crash(c);
        }
        let _ = self.view.set_server(c, up);
        self.publish_view(i);
    }

    /// Fails or restores the link leaving `c` along `dir` in everyone's view (as the
    /// control plane would after detecting it): frames on it are lost from then on.
    pub fn set_link(&mut self, c: Coord, dir: Dir, up: bool) {
        if self.view.set_link(c, dir, up).is_ok() {
            self.publish_view(self.ctx.cfg.dims.index(c));
        }
    }

    /// The view changed around server `i`: its links' cached liveness follows, and every
    /// live engine adopts the view.
    fn publish_view(&mut self, i: usize) {
        let c = self.ctx.cfg.dims.coord(i);
        for d in Dir::ALL {
            let live = self.view.live_dirs(c).contains(d);
            let (p, li) = self.at(i);
            let l = &mut self.parts[p].links[li * 6 + usize::from(d.index())];
            l.live = live;
            let far = l.far as usize;
            let (q, lf) = self.at(far);
            self.parts[q].links[lf * 6 + usize::from(d.opposite().index())].live = live;
        }
        for j in 0..self.ctx.up.len() {
            if self.ctx.up[j] {
                let v = self.view.clone();
                let _ = self.node_mut(j).set_view(v);
                let now = self.now;
                self.wake(j, now);
            }
        }
    }

    /// The current view.
    pub fn view(&self) -> &LinkView {
        &self.view
    }

    /// Runs until simulated time `until`, handing every event the engines produce to
    /// `on_event(sim_time, server, event)`. Events are lent, not given: a message's buffer
    /// goes back to the simulator for the next one (keep what you need by copying it).
    pub fn run_until(&mut self, until: Time, mut on_event: impl FnMut(Time, usize, &Event)) {
        // By server (each server's in the order they came), whatever the parts' order.
        let mut pending = std::mem::take(&mut self.pending);
        pending.sort_by_key(|(i, _)| *i);
        for (i, e) in pending {
            on_event(self.now, i as usize, &e);
        }
        let lookahead = window::lookahead(&self.ctx.cfg);
        window::run(
            &mut self.parts,
            &self.ctx,
            until,
            lookahead,
            self.workers.as_ref(),
        );
        for (t, _, i, e, run) in window::merged_events(&mut self.parts) {
            on_event(t, i, &e);
            if let Event::Message { data, .. } = e {
                let (p, _) = self.at(i);
                match run {
                    Some((fill, written)) => self.parts[p].pool.give_run(data, fill, written),
                    None => self.parts[p].pool.give(data),
                }
            }
        }
        self.now = self.now.max(until);
        for p in &mut self.parts {
            p.now = self.now;
        }
        self.sample_link_loads();
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
            self.run_until(next, |t, i, e| evs.push((t, i, e.clone())));
            let now = self.now;
            for (t, i, e) in evs {
                let mine = match &e {
                    Event::Message { service, .. }
                    | Event::Acked { service, .. }
                    | Event::Failed { service, .. } => svc.get(i).is_some_and(|s| s.owns(*service)),
                    _ => true,
                };
                if !self.ctx.up[i] || i >= svc.len() {
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
            for i in 0..svc.len().min(self.ctx.up.len()) {
                if !self.ctx.up[i] {
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
            if !any && self.idle() && self.pending.is_empty() {
                break;
            }
        }
        other
    }

    /// Whether nothing is pending anywhere: no event, no frame between parts.
    fn idle(&mut self) -> bool {
        self.parts
            .iter_mut()
            .all(|p| p.heap.is_empty() && p.outbox.is_empty())
    }
}

/// Bytes a frame of `len` bytes (from its destination MAC, without checksum) occupies on
/// the wire: Ethernet pads it to 60, and adds a 4-byte checksum, an 8-byte preamble and a
/// 12-byte gap. The padding also makes the shortest frame's time the parallel runs'
/// lookahead longer (a hello is 56 bytes).
fn wire_bytes(len: u64) -> u64 {
    len.max(60) + 24
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
        self.sim.node(self.i).local()
    }
    fn dims(&self) -> Dims {
        self.sim.ctx.cfg.dims
    }
    fn incarnation(&self) -> u64 {
        self.sim.node(self.i).transport().config().incarnation
    }
    fn is_reachable(&self, c: Coord) -> bool {
        self.sim.node(self.i).routes().is_reachable(c)
    }
    fn takes_keys(&self, c: Coord) -> bool {
        self.sim.node(self.i).routes().takes_keys(c)
    }
    fn distance(&self, c: Coord) -> Option<u32> {
        self.sim.node(self.i).routes().distance(c)
    }
    fn key_root(&self, key: u64) -> Option<Coord> {
        self.sim.node(self.i).key_root(key)
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
        self.sim.node_mut(self.i).notify_acks(service, on);
    }
}

/// Asks the CPU to start loading the cache line at `p`.
#[inline(always)]
pub(super) fn prefetch(p: *const u8) {
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

    #[test]
    fn messages_of_runs_arrive_byte_for_byte() {
        // Payloads that are long runs of one value after a few other bytes (0 to 200),
        // as the simulator carries as runs and hands out on buffers of their value, mixed
        // with other values and sizes: each arrives exactly as sent, however often the
        // buffers are used again.
        let cfg = SimConfig {
            dims: Dims::new(3, 3, 1).unwrap(),
            rate_bps: 1_000_000_000,
            delay: Duration::from_micros(1),
            queue_frames: 32,
            transport: Config {
                mtu: 9000,
                compact_runs: true,
                ..Config::default()
            },
            spread_by_load: true,
        };
        let mut sim = Sim::new(cfg).unwrap();
        let n = sim.dims().count() as usize;
        let mut rng = crate::rng::SplitMix64::new(5);
        let mut sent = Vec::new();
        let mut got = Vec::new();
        for round in 0..40u64 {
            for k in 0..6 {
                let src = rng.below(n as u64) as usize;
                let dst = (src + 1 + rng.below(n as u64 - 1) as usize) % n;
                let prefix = [0, 1, 17, 50, 90, 200][k];
                let fill = [9u8, 9, 0, 255, 9, 42][k];
                let len = prefix + 600 + rng.below(7800) as usize;
                let data: Vec<u8> = (0..len)
                    .map(|i| if i < prefix { (i as u8) ^ 0x5a } else { fill })
                    .collect();
                let to = Target::Server(sim.dims().coord(dst));
                sim.send(src, to, 7, &data, MsgOptions::default()).unwrap();
                sent.push((dst, data));
            }
            let until = sim.now() + Duration::from_micros(200 + round);
            sim.run_until(until, |_, server, e| {
                if let Event::Message { data, .. } = e {
                    got.push((server, data.clone()));
                }
            });
        }
        let until = sim.now() + Duration::from_millis(5);
        sim.run_until(until, |_, server, e| {
            if let Event::Message { data, .. } = e {
                got.push((server, data.clone()));
            }
        });
        sent.sort();
        got.sort();
        assert_eq!(got.len(), sent.len());
        assert!(got == sent, "a message arrived changed");
    }

    #[test]
    fn a_source_routed_frame_on_a_failed_link_is_counted_as_path_failed() {
        // Frames already on their source route when a link of it fails reach the server
        // before that link, which drops them as `PathFailed`: the drop table has a place
        // for every reason, this one included.
        let cfg = SimConfig {
            dims: Dims::new(4, 4, 1).unwrap(),
            rate_bps: 1_000_000_000,
            delay: Duration::from_micros(5),
            queue_frames: 64,
            transport: Config::default(),
            spread_by_load: true,
        };
        let mut sim = Sim::new(cfg).unwrap();
        sim.enable_source_routing(BsrConfig::default());
        let dims = sim.dims();
        let (src, dst) = (Coord::new(0, 0, 0), Coord::new(2, 2, 0));
        let s = dims.index(src);
        let data = vec![3u8; 1200];
        let opts = MsgOptions {
            reliable: true,
            ..MsgOptions::default()
        };
        let mut delivered = 0usize;
        let mut sent = 0usize;
        let mut cut = false;
        while sim.now() < Time::ZERO + Duration::from_millis(200) {
            while sent < 3000 && sim.send(s, Target::Server(dst), 9, &data, opts).is_ok() {
                sent += 1;
            }
            let until = sim.now() + Duration::from_micros(20);
            sim.run_until(until, |_, _, e| {
                if matches!(e, Event::Message { .. }) {
                    delivered += 1;
                }
            });
            if !cut && delivered > 200 {
                // The route's second link, in the middle of the path.
                let r = sim.node(s).source_routing().route_to(dst).unwrap();
                let mid = r.servers(dims, src).next().unwrap();
                sim.set_link(mid, r.dir(1).unwrap(), false);
                cut = true;
            }
            if delivered == sent && sent == 3000 {
                break;
            }
        }
        let st = sim.stats();
        let k = DropReason::ALL
            .iter()
            .position(|r| *r == DropReason::PathFailed)
            .unwrap();
        assert!(st.dropped_by[k] > 0, "{st:?}");
        assert_eq!(delivered, 3000, "every reliable message arrives: {st:?}");
    }
}
