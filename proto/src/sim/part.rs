//! One part of the simulated torus: a contiguous range of servers with their engines, the
//! links leaving them, and their own pending events.
//!
//! A part only ever changes its own servers and links. What it sends to a server of
//! another part arrives no sooner than one lookahead later (a link's propagation delay
//! plus the shortest frame's transmission time), so parts run a window of that length
//! each without looking at each other, on one thread or several, and exchange the frames
//! that crossed between them at the window's end ([`super::window`]). Events keep their
//! global ids, so every part processes exactly the events, in exactly the order, that one
//! part holding the whole torus would: the result does not depend on how many parts or
//! threads there are.

use std::collections::VecDeque;
use std::sync::Arc;

use super::frame::{FramePool, FrameSlab, SimFrame};
use super::queue::EventQueue;
use super::{is_control, Link, SimConfig, SimStats};
use crate::control::ControlNode;
use crate::node::{DropReason, Event, MsgOptions, Node, Outbound, Received, RxAction, Target};
use crate::time::Time;
use crate::topology::{Dir, DirSet};
use crate::transport::{Lent, SendError};
use crate::wire::ETH_LEN;

/// Frames a server holds in transit before it drops forwarded frames.
const TRANSIT_LIMIT: usize = 256;

/// What every part reads and none changes during a window (cheap to clone: the threads
/// that run parts each hold one).
#[derive(Clone)]
pub(super) struct Ctx {
    pub(super) cfg: SimConfig,
    /// Whether each server is up (changed only between runs).
    pub(super) up: Arc<Vec<bool>>,
    /// Transmission time of a full frame, ns.
    pub(super) frame_ns: u64,
    /// Links in the whole torus (ids below it are links; above, server wake-ups).
    pub(super) nlinks: usize,
    /// First server of every part, then the number of servers.
    pub(super) bounds: Arc<Vec<usize>>,
}

impl Ctx {
    /// The part server `i` belongs to.
    pub(super) fn part_of(&self, i: usize) -> usize {
        part_of(&self.bounds, i)
    }
}

/// The part server `i` belongs to, given every part's first server.
pub(super) fn part_of(bounds: &[usize], i: usize) -> usize {
    bounds.partition_point(|b| *b <= i).saturating_sub(1)
}

/// An arrival event's server (`far`) and frame slot, in the event's third field.
fn pack(far: u32, slot: u32) -> u64 {
    (u64::from(far) << 32) | u64::from(slot)
}

/// The server and frame slot [`pack`] put in an arrival event.
fn unpack(to: u64) -> (u32, u32) {
    ((to >> 32) as u32, to as u32)
}

/// A frame on its way to a server of another part.
#[derive(Debug)]
pub(super) struct Crossing {
    pub(super) to_part: usize,
    pub(super) link: u32,
    /// The server it goes to.
    pub(super) far: u32,
    pub(super) arrive: Time,
    pub(super) frame: SimFrame,
}

/// An event an engine produced, with the simulator event it came from (time, id): events
/// of several parts are handed out merged in that order. The last field says a message's
/// buffer is one of the pool's runs: its value, and how many of its first bytes were
/// written ([`FramePool::give_run`]).
pub(super) type Emitted = (Time, u32, usize, Event, Option<(u8, usize)>);

/// Where `data` starts in the buffer of `len` bytes at address `base`, if it lies in it
/// (a message the engine lent from the frame it was handed).
fn offset_in(base: usize, len: usize, data: &[u8]) -> Option<usize> {
    (data.as_ptr() as usize)
        .checked_sub(base)
        .filter(|at| at + data.len() <= len)
}

/// A message the engine lent from its frame, as the event it would have made of it.
fn message(src: crate::topology::Coord, service: u16, data: Vec<u8>, reliable: bool) -> Event {
    Event::Message {
        src,
        service,
        data,
        reliable,
        key: None,
    }
}

/// A contiguous range of servers and everything they own.
pub(super) struct Part {
    /// Its first server.
    pub(super) lo: usize,
    pub(super) nodes: Vec<Node>,
    /// The links leaving its servers, six per server.
    pub(super) links: Vec<Link>,
    /// Frames on links into its servers (from its own servers or, once handed over, from
    /// other parts') and frames waiting in its servers' transit queues. A frame passed on
    /// stays in its slot from link to link: only its slot's number moves (moving the
    /// 128-byte frame out and back at every hop was a tenth of a hop's instructions).
    pub(super) frames: FrameSlab,
    /// Pending events `(time, id, to)`: `id` below `nlinks` is a frame arriving over that
    /// link, `to` its server and `frames` slot ([`pack`]); above it, a wake-up of server
    /// `id - nlinks`.
    /// Ties go by id (a link's frames arrive at distinct times), so a run is deterministic.
    pub(super) heap: EventQueue,
    pub(super) now: Time,
    /// When each server asked to be woken next (to avoid piling up wake events).
    pub(super) wake_at: Vec<Option<Time>>,
    pub(super) pool: FramePool,
    pub(super) stats: SimStats,
    /// Frames in transit waiting for a next hop with room (CamCube queues forwarded
    /// packets rather than dropping them when a link is busy), by slot in `frames`;
    /// bounded per server.
    pub(super) transit: Vec<VecDeque<(DirSet, u32)>>,
    /// Its servers' own control planes, when the simulator runs them; else empty.
    pub(super) control: Vec<ControlNode>,
    /// Its links whose far end is in another part (local indices).
    boundary: Vec<usize>,
    /// Frames sent to other parts this window.
    pub(super) outbox: Vec<Crossing>,
    /// Events its engines produced this window.
    pub(super) events: Vec<Emitted>,
}

impl Part {
    pub(super) fn new(lo: usize, nodes: Vec<Node>, links: Vec<Link>) -> Part {
        let n = nodes.len();
        let boundary = (0..links.len())
            .filter(|k| {
                let far = links[*k].far as usize;
                far < lo || far >= lo + n
            })
            .collect();
        Part {
            boundary,
            lo,
            nodes,
            links,
            frames: FrameSlab::default(),
            heap: EventQueue::default(),
            now: Time::ZERO,
            wake_at: vec![None; n],
            pool: FramePool::default(),
            stats: SimStats::default(),
            transit: (0..n).map(|_| VecDeque::new()).collect(),
            control: Vec::new(),
            outbox: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Servers it holds.
    pub(super) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether global server `i` is one of its own.
    fn owns(&self, i: usize) -> bool {
        i >= self.lo && i < self.lo + self.nodes.len()
    }

    /// Asks for server `li` (local index) to be serviced at `at`.
    pub(super) fn wake(&mut self, ctx: &Ctx, li: usize, at: Time) {
        if self.wake_at[li].is_some_and(|t| t <= at && t >= self.now) {
            return;
        }
        self.wake_at[li] = Some(at);
        self.heap.push((at, (ctx.nlinks + self.lo + li) as u32, 0));
    }

    /// The earliest time a frame not yet sent could start on a link to another part: a
    /// frame goes out behind what its link still has to send. (`u64::MAX`: no such link.)
    pub(super) fn boundary_free(&self) -> u64 {
        self.boundary
            .iter()
            .map(|k| self.links[*k].busy_until.0)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The earliest pending event's time.
    pub(super) fn next_time(&mut self) -> Option<Time> {
        self.heap.peek().map(|e| e.0)
    }

    /// Frames of backlog a link may hold for frames in transit, and for the server's own:
    /// a quarter of the queue, so that traffic passing through always finds room and is not
    /// dropped to be retransmitted end to end because a busy server filled its links.
    fn limit(ctx: &Ctx, transit: bool) -> u64 {
        let q = u64::from(ctx.cfg.queue_frames.max(1));
        if transit {
            q
        } else {
            (q / 4).max(1)
        }
    }

    /// Links of `li` with room in their transmit queue for transit or own frames.
    fn room(&self, ctx: &Ctx, li: usize, transit: bool) -> DirSet {
        let limit = ctx.frame_ns * Self::limit(ctx, transit);
        let mut r = DirSet::EMPTY;
        for d in ctx.cfg.dims.link_dirs().iter() {
            let l = &self.links[li * 6 + usize::from(d.index())];
            if l.busy_until.0 <= self.now.0 + limit {
                r = r.with(d);
            }
        }
        r
    }

    /// Of the next hops `hops` of server `li` with room, the one with the shortest backlog:
    /// shortest paths in a torus tie (every dimension a packet still has to cross, and both
    /// ways round an even ring at half the way), and spreading over the ties by load is
    /// what lets all-to-all traffic use every link.
    fn least_loaded(&self, ctx: &Ctx, li: usize, hops: DirSet, room: DirSet) -> Option<Dir> {
        let mut with_room = hops.iter().filter(|h| room.contains(*h));
        if !ctx.cfg.spread_by_load {
            return with_room.next();
        }
        with_room.min_by_key(|h| self.links[li * 6 + usize::from(h.index())].busy_until)
    }

    /// [`Part::least_loaded`] of `hops` among the links of `li` with room for a frame in
    /// transit, looking at those links only (the room of all six, then the choice, was a
    /// tenth of a hop).
    fn hop_for_transit(&self, ctx: &Ctx, li: usize, hops: DirSet) -> Option<Dir> {
        let limit = self.now.0 + ctx.frame_ns * Self::limit(ctx, true);
        let links = ctx.cfg.dims.link_dirs();
        let mut best: Option<(Time, Dir)> = None;
        for h in hops.iter().filter(|h| links.contains(*h)) {
            let busy = self.links[li * 6 + usize::from(h.index())].busy_until;
            if busy.0 > limit {
                continue;
            }
            if !ctx.cfg.spread_by_load {
                return Some(h);
            }
            // The first of equals, as `least_loaded` takes.
            if best.is_none_or(|(b, _)| busy < b) {
                best = Some((busy, h));
            }
        }
        best.map(|(_, h)| h)
    }

    /// When a full link of `li` has drained half of what `transit` or own frames may fill,
    /// the earliest. Waking for every single free slot would cost an event per frame sent;
    /// refilling in batches, as a NIC's transmit ring is, still never lets the link idle.
    fn next_room(&self, ctx: &Ctx, li: usize, transit: bool) -> Option<Time> {
        let refill = ctx.frame_ns * (Self::limit(ctx, transit) / 2).max(1);
        ctx.cfg
            .dims
            .link_dirs()
            .iter()
            .map(|d| {
                self.links[li * 6 + usize::from(d.index())]
                    .busy_until
                    .0
                    .saturating_sub(refill)
            })
            .filter(|t| *t > self.now.0)
            .min()
            .map(Time)
    }

    /// Passes on the first frame in transit at `li` that has a next hop with room.
    fn send_transit(&mut self, ctx: &Ctx, li: usize, room: DirSet) -> bool {
        let Some((k, h)) = self.transit[li]
            .iter()
            .enumerate()
            .find_map(|(k, (hops, _))| Some((k, self.least_loaded(ctx, li, *hops, room)?)))
        else {
            return false;
        };
        match self.transit[li].remove(k) {
            Some((_, slot)) => {
                self.transmit_slot(ctx, li, h, slot);
                true
            }
            None => false,
        }
    }

    /// Lets the engine of `li` put out one frame of its own on a link in `room`.
    fn send_own(&mut self, ctx: &Ctx, li: usize, room: DirSet) -> bool {
        let now = self.now;
        let mut buf = self.pool.take(ETH_LEN + ctx.cfg.transport.mtu);
        match self.nodes[li].poll_transmit(now, room, &mut buf, None) {
            Some(Outbound { dir, len, .. }) => {
                let f = match self.nodes[li].take_declared_tail() {
                    Some((at, fill)) => self.pool.frame_declared(buf, len, at, fill),
                    None => self.pool.frame(buf, len),
                };
                self.transmit(ctx, li, dir, f);
                true
            }
            None => {
                self.pool.give(buf);
                false
            }
        }
    }

    /// Puts `frame` on link `dir` of `li`: behind what the link is still sending, then a
    /// propagation delay to the far end.
    pub(super) fn transmit(&mut self, ctx: &Ctx, li: usize, dir: Dir, frame: SimFrame) {
        let slot = self.frames.insert(frame);
        self.transmit_slot(ctx, li, dir, slot);
    }

    /// [`Part::transmit`] for the frame in `slot` of `frames`.
    fn transmit_slot(&mut self, ctx: &Ctx, li: usize, dir: Dir, slot: u32) {
        let local = li * 6 + usize::from(dir.index());
        let id = (self.lo * 6 + local) as u32;
        let j = self.links[local].far as usize;
        let same_part = self.owns(j);
        let (len, control) = {
            let f = self.frames.get(slot);
            (f.len() as u64, is_control(f.head()))
        };
        let l = &mut self.links[local];
        let start = l.busy_until.max(self.now);
        let wire = super::wire_bytes(len);
        let tx = (wire * 8 * 1_000_000_000) / ctx.cfg.rate_bps.max(1);
        // Telemetry: the link's load as this frame finds it, its exact queue and how busy
        // it has been (a standing queue means it sends all the time).
        let queued = start.0 - self.now.0;
        let busy = if queued > 0 {
            1000
        } else {
            let gap = self.now.0.saturating_sub(l.last_start.0).max(1);
            (1000 * tx / gap.max(tx)).min(1000)
        };
        l.util = (l.util * 7 + busy) / 8;
        l.last_start = start;
        let level = crate::routing::load::level(l.util, queued * 1000 / ctx.frame_ns.max(1));
        l.busy_until = Time(start.0 + tx);
        l.tx_bytes += wire;
        let arrive = Time(start.0 + tx) + ctx.cfg.delay;
        crate::wire::raise_cong(self.frames.get_mut(slot).head_mut(), level);
        self.stats.frames_sent += 1;
        self.stats.control_frames += u64::from(control);
        if !ctx.up[j] || !l.live {
            // A hello into a dead server is how its death is noticed, not a loss of data.
            self.stats.lost_on_failure += u64::from(!control);
            self.drop_slot(slot);
            return;
        }
        if !same_part {
            self.outbox.push(Crossing {
                to_part: ctx.part_of(j),
                link: id,
                far: j as u32,
                arrive,
                frame: self.frames.take(slot),
            });
            return;
        }
        self.heap.push((arrive, id, pack(j as u32, slot)));
    }

    /// Frees `slot` of `frames`, its frame's buffer back to the pool.
    fn drop_slot(&mut self, slot: u32) {
        let f = self.frames.take(slot);
        self.pool.give_frame(f);
    }

    /// Puts a frame on its way over link `link` (global id) into `far`, one of this part's
    /// servers, to arrive at `arrive`: sent by one of its own servers, or by another part's.
    pub(super) fn accept(&mut self, link: u32, far: u32, arrive: Time, frame: SimFrame) {
        let slot = self.frames.insert(frame);
        self.heap.push((arrive, link, pack(far, slot)));
    }

    /// Sends a message from server `li` and lets it act at once (the engine decides
    /// everything else).
    /// `run`: the value every byte of `data` has, if the caller looked.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send(
        &mut self,
        ctx: &Ctx,
        li: usize,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
        run: Option<u8>,
    ) -> Result<(), SendError> {
        if !ctx.up[self.lo + li] {
            return Err(SendError::WouldBlock);
        }
        let r = self.nodes[li].send_hinted(self.now, target, service, data, opts, run);
        // Serviced at once, not through a wake-up event at the same instant (that was a
        // fifth of all events); what it delivers locally is handed out by the next run.
        self.service(ctx, li);
        r
    }

    /// Lets server `li` act: timers, then frames while its links have room.
    pub(super) fn service(&mut self, ctx: &Ctx, li: usize) {
        if !ctx.up[self.lo + li] {
            return;
        }
        let now = self.now;
        self.run_control(ctx, li);
        if self.nodes[li].poll_timeout().is_some_and(|t| t <= now) {
            self.nodes[li].handle_timeout(now);
        }
        // Frames in transit and the server's own take turns for link room, as CamCube's
        // per-link scheduler shares a link among services; own frames only up to their
        // smaller share of the queue.
        let (mut transit, mut own) = (true, true);
        while transit || own {
            if transit {
                let room = self.room(ctx, li, true);
                transit = !room.is_empty()
                    && !self.transit[li].is_empty()
                    && self.send_transit(ctx, li, room);
            }
            if own {
                let room = self.room(ctx, li, false);
                own = !room.is_empty() && self.send_own(ctx, li, room);
            }
        }
        let mut next = self.nodes[li].poll_timeout().filter(|t| *t > now);
        if let Some(t) = self.control_timeout(li) {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        let waits = [
            (!self.transit[li].is_empty()).then(|| self.next_room(ctx, li, true)),
            self.nodes[li]
                .has_pending()
                .then(|| self.next_room(ctx, li, false)),
        ];
        for r in waits.into_iter().flatten().flatten() {
            next = Some(next.map_or(r, |n| n.min(r)));
        }
        if let Some(t) = next {
            self.wake(ctx, li, t);
        }
    }

    /// Moves the events server `li`'s engine produced outside a run (a send) into `out`,
    /// named by the server's index, for the next run to hand out.
    pub(super) fn take_events(&mut self, ctx: &Ctx, li: usize, out: &mut Vec<(u32, Event)>) {
        let i = self.lo + li;
        if !ctx.up[i] {
            return;
        }
        while let Some(e) = self.nodes[li].poll_event() {
            out.push((i as u32, e));
        }
    }

    /// Moves the events server `li`'s engine produced into this window's list.
    fn collect(&mut self, t: Time, key: u32, li: usize) {
        // Messages are read by reference and copied into recycled buffers (given back by
        // `Sim::run_until` once handed out): a fresh 8 KB allocation per delivered message
        // cost more than the copy, and grew the heap page by page.
        let (nodes, pool) = (&mut self.nodes, &mut self.pool);
        while let Some(e) = nodes[li].poll_event_ref() {
            let e = e.into_owned_with(|data| pool.copy_of(data));
            self.events.push((t, key, self.lo + li, e, None));
        }
    }

    /// Processes every pending event due at or before `end`.
    pub(super) fn run_window(&mut self, ctx: &Ctx, end: Time) {
        while let Some((t, id, to)) = self.heap.peek() {
            if t > end {
                break;
            }
            self.heap.pop();
            self.now = t;
            self.stats.events += 1;
            let gid = id as usize;
            if gid >= ctx.nlinks {
                let li = gid - ctx.nlinks - self.lo;
                self.stats.wakes += 1;
                if self.wake_at[li] == Some(t) {
                    self.wake_at[li] = None;
                }
                self.service(ctx, li);
                self.collect(t, id, li);
                continue;
            }
            let (far, slot) = unpack(to);
            self.touch_next(ctx);
            self.arrive(ctx, t, gid, far as usize, slot);
        }
        self.now = self.now.max(end);
    }

    /// Starts loading what the next events read: the frame, and the state of the server it
    /// reaches (the lines its engine judges a passing frame with, its transit queue, its
    /// links). Frames wait on links, and a server waits between two frames through it, long
    /// enough to leave the cache, so each is a memory miss per hop; issued ahead, they
    /// overlap with this event's work instead of stalling the next. Two events ahead for the
    /// server (one event's work is about as long as a miss), and the next frame again in case
    /// it was not known then (a new bucket). (Prefetching the engine's first bytes instead of
    /// the lines it reads gained nothing: the engine is kilobytes, and the fields a hop reads
    /// lie far into it.)
    fn touch_next(&mut self, ctx: &Ctx) {
        if let Some(e) = self.heap.peek() {
            self.touch(ctx, e, false);
        }
        if let Some(e) = self.heap.peek_second() {
            self.touch(ctx, e, true);
        }
    }

    /// Starts loading what a send from server `li` reads: its engine's send lines and
    /// its links.
    pub(super) fn prefetch_sender(&self, li: usize) {
        if let Some(node) = self.nodes.get(li) {
            for p in node.send_lines() {
                super::prefetch(p);
            }
        }
        if let Some(l) = self.links.get(li * 6..li * 6 + 6) {
            let p: *const u8 = l.as_ptr().cast();
            super::prefetch(p);
            super::prefetch(p.wrapping_add(64));
            super::prefetch(p.wrapping_add(128));
        }
    }

    /// Prefetches the frame of event `e` and, `all`, its server's lines.
    fn touch(&self, ctx: &Ctx, (_, id, to): super::queue::Entry, all: bool) {
        if (id as usize) >= ctx.nlinks {
            return;
        }
        let (far, slot) = unpack(to);
        self.frames.prefetch(slot);
        if !all {
            return;
        }
        let Some(n) = (far as usize).checked_sub(self.lo) else {
            return;
        };
        if let Some(node) = self.nodes.get(n) {
            for p in node.rx_head_lines() {
                super::prefetch(p);
            }
        }
        if let Some(t) = self.transit.get(n) {
            super::prefetch(std::ptr::from_ref(t).cast());
        }
        if let Some(l) = self.links.get(n * 6..n * 6 + 6) {
            let p: *const u8 = l.as_ptr().cast();
            super::prefetch(p);
            super::prefetch(p.wrapping_add(64));
            super::prefetch(p.wrapping_add(128));
        }
    }

    /// Hands the frame in `slot`, which crossed link `gid`, to the server at its far end
    /// (one of ours).
    fn arrive(&mut self, ctx: &Ctx, t: Time, gid: usize, far: usize, slot: u32) {
        let (Some(dir), Some(n)) = (
            Dir::from_index((gid % 6) as u8),
            far.checked_sub(self.lo).filter(|n| *n < self.nodes.len()),
        ) else {
            self.drop_slot(slot);
            return;
        };
        let key = gid as u32;
        if !ctx.up[far] {
            self.stats.lost_on_failure += u64::from(!is_control(self.frames.get(slot).head()));
            self.drop_slot(slot);
            return;
        }
        if !self.control.is_empty() {
            if is_control(self.frames.get(slot).head()) {
                let frame = self.frames.take(slot);
                self.control[n].handle_frame(t, dir.opposite(), frame.head());
                self.pool.give_frame(frame);
                self.service(ctx, n);
                return;
            }
            // A take-over instant due now is honoured before the frame is judged.
            if self.control_due(n) {
                self.run_control(ctx, n);
            }
        }
        // A frame held as its head is judged on it, where it lies, when the engine can
        // (passing through); otherwise it is rebuilt and handed over whole.
        let by_head = {
            let frame = self.frames.get_mut(slot);
            let len = frame.len();
            if frame.is_compact() {
                self.nodes[n].handle_rx_head(frame.head_mut(), len)
            } else {
                None
            }
        };
        let passed_on = match by_head {
            // An engine that judged a frame by its headers produced no event (it only
            // passes frames on or drops them); looking would cost two memory misses a hop.
            Some(action) => self.act(ctx, n, dir, action, slot),
            None => {
                let frame = self.frames.take(slot);
                let (action, frame) = self.receive(t, key, dir, n, frame);
                let slot = self.frames.insert(frame);
                let passed_on = self.act(ctx, n, dir, action, slot);
                self.collect(t, key, n);
                passed_on
            }
        };
        // A frame passed straight on changes nothing the server's own traffic or timers
        // depend on; servicing the server for it would only cost time.
        if !passed_on {
            self.service(ctx, n);
        }
    }

    /// Does what server `n`'s engine decided for the frame in `slot`, which came in over
    /// `dir`; whether the frame went straight onto a link.
    fn act(&mut self, ctx: &Ctx, n: usize, dir: Dir, action: RxAction, slot: u32) -> bool {
        match action {
            RxAction::Consumed => self.drop_slot(slot),
            RxAction::Drop(why) => {
                self.stats.dropped_engine += 1;
                if let Some(k) = DropReason::ALL.iter().position(|r| *r == why) {
                    self.stats.dropped_by[k] += 1;
                }
                self.drop_slot(slot);
            }
            RxAction::Forward(hops) => match self.hop_for_transit(ctx, n, hops) {
                Some(h) if self.transit[n].is_empty() => {
                    self.stats.bounced += u64::from(h == dir.opposite());
                    self.stats.forwarded += 1;
                    self.transmit_slot(ctx, n, h, slot);
                    return true;
                }
                _ if self.transit[n].len() < TRANSIT_LIMIT => {
                    self.transit[n].push_back((hops, slot));
                }
                _ => {
                    self.stats.dropped_no_room += 1;
                    self.drop_slot(slot);
                }
            },
        }
        false
    }

    /// Server `n`'s engine receives `frame` whole (it is for this server, or an
    /// interceptor reads it): what it decided, and the frame as it is now.
    fn receive(
        &mut self,
        t: Time,
        key: u32,
        dir: Dir,
        n: usize,
        frame: SimFrame,
    ) -> (RxAction, SimFrame) {
        if frame.is_compact() && !Node::rx_may_write_past_header(frame.head()) {
            return self.receive_on_run(t, key, dir, n, frame);
        }
        let far = self.lo + n;
        let mut whole = self.pool.expand(frame);
        let (base, whole_len) = (whole.as_ptr() as usize, whole.len());
        let a = match self.nodes[n].handle_rx_lending(t, dir.opposite(), &mut whole) {
            Received::Message(Lent {
                src,
                service,
                data,
                reliable,
            }) => {
                // The message becomes the event in the frame's own buffer, moved
                // to its front while the buffer is still in the cache (a copy into
                // another buffer, long cold, cost about 6% of the run).
                let len = data.len();
                let at = offset_in(base, whole_len, data);
                let data = match at {
                    Some(at) => {
                        whole.copy_within(at..at + len, 0);
                        whole.truncate(len);
                        // The frame, its buffer gone with the event, is nothing now.
                        std::mem::take(&mut whole)
                    }
                    None => self.pool.copy_of(data),
                };
                self.events
                    .push((t, key, far, message(src, service, data, reliable), None));
                RxAction::Consumed
            }
            Received::Action(a) => a,
        };
        (a, SimFrame::whole(whole))
    }

    /// Hands compacted frame `frame`, which crossed link `key` in direction `dir`, to
    /// server `n` whole, rebuilt on a buffer of its run's value: its head is written over
    /// the front, and a message it carries is handed out in another such buffer, only its
    /// bytes that lay in the head written. The engine writes nothing past the header of
    /// such a frame ([`Node::rx_may_write_past_header`]), so both buffers are the run
    /// again once their written bytes are.
    fn receive_on_run(
        &mut self,
        t: Time,
        key: u32,
        dir: Dir,
        n: usize,
        frame: SimFrame,
    ) -> (RxAction, SimFrame) {
        let len = frame.len();
        let (mut whole, head, fill) = self.pool.expand_on_run(frame);
        let base = whole.as_ptr() as usize;
        let action = match self.nodes[n].handle_rx_lending(t, dir.opposite(), &mut whole[..len]) {
            Received::Message(Lent {
                src,
                service,
                data,
                reliable,
            }) => {
                let size = data.len();
                let at = offset_in(base, len, data);
                let (data, run) = match at {
                    Some(at) => {
                        let written = head.saturating_sub(at).min(size);
                        let mut m = self.pool.run_buf(fill, size);
                        m.truncate(size);
                        m[..written].copy_from_slice(&whole[at..at + written]);
                        (m, Some((fill, written)))
                    }
                    None => (self.pool.copy_of(data), None),
                };
                let far = self.lo + n;
                self.events
                    .push((t, key, far, message(src, service, data, reliable), run));
                RxAction::Consumed
            }
            Received::Action(a) => a,
        };
        if let RxAction::Forward(_) = action {
            // Passed on whole (an interceptor's frame): the buffer leaves the runs.
            whole.truncate(len);
            return (action, SimFrame::whole(whole));
        }
        self.pool.give_run(whole, fill, head);
        (action, SimFrame::default())
    }

    /// Server `li` fails: what it held in transit is lost with it.
    pub(super) fn crash(&mut self, li: usize) {
        self.stats.lost_with_sender += self.nodes[li].queued_key_messages() as u64;
        self.stats.lost_on_failure += self.transit[li].len() as u64;
        for (_, slot) in std::mem::take(&mut self.transit[li]) {
            self.drop_slot(slot);
        }
    }
}
