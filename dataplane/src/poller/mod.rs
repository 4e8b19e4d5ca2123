//! The poller: one thread that owns a server's rings, UMEM and protocol engine, and moves
//! frames between them. It holds no protocol logic: every decision is the engine's
//! (`proto::node`); this loop only reads descriptors, hands bytes over, and puts the
//! engine's answers back on the rings.
//!
//! Its state is in rooms of their own, so that a step borrows only what it needs:
//! - [`Links`](crate::transmit::Links): the ports, the UMEM, the transmit slots and the way
//!   out (frames built by the engine, frames passing through, frames for other pollers);
//! - [`delivery`]: the inboxes of embedded services and applications, with what waits for
//!   a full one, and commands for the first poller;
//! - [`services`]: the services hosted here and the engine as they see it;
//! - [`publish`]: the status snapshot, every 100 ms.
//!
//! The turn's steps are in [`Poller::run`]; receiving is in [`rx`], commands from other
//! threads in [`commands`].

mod commands;
mod delivery;
mod publish;
mod rx;
mod services;

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use torusnet_proto::node::{Event, EventRef, MsgOptions, Node, Target};
use torusnet_proto::routing::transit;
use torusnet_proto::service::Service;
use torusnet_proto::time::Time;
use torusnet_proto::topology::DirSet;
use torusnet_proto::transport::FailReason;

use crate::config::Polling;
use crate::linkload::LinkLoads;
use crate::port::Port;
use crate::shared::{Command, ShardShared, Shared};
use crate::transit::Transit;
use crate::transmit::{Links, BATCH};
use crate::xsk::Umem;
use delivery::Delivery;
use publish::Publisher;
use services::{owned_message, Routed, Services};

/// Idle turns an adaptive poller makes (yielding the core between them) before it sleeps.
const ADAPTIVE_SPIN: u32 = 16;

/// One poller of a server: its links, its UMEM, its engine.
pub struct Poller {
    shard: usize,
    shared: Arc<Shared>,
    node: Node,
    links: Links,
    delivery: Delivery,
    services: Services,
    publisher: Publisher,
    /// Frames passing through that wait for room on their next link.
    transit: Transit,
    loads: LinkLoads,
    epoch: Instant,
    turn_now: Time,
    /// A command the engine could not take yet (its queue was full).
    pending: Option<Command>,
    /// Slots the transport has just let go of (reused buffer).
    released: Vec<u32>,
    /// Reassembly of multi-buffer frames.
    scratch: Vec<u8>,
    /// Messages the engine lent from their frames this turn and this poller handed on
    /// (`Node::handle_rx_lending`): deliveries, for the turn's answer to go at once.
    lent: usize,
    carrier_down: DirSet,
    /// The XDP program moved frames over this poller's links at the last load sample.
    transit_busy: bool,
    /// The XDP program's transit byte counters of each port at the last load sample.
    xdp_moved: Vec<(u64, u64)>,
}

impl Poller {
    /// Poller `shard` over these ports (with their global link indices), all sharing `umem`.
    pub fn new(
        shard: usize,
        node: Node,
        umem: Umem,
        ports: Vec<(usize, Port)>,
        shared: Arc<Shared>,
        mtu: usize,
    ) -> Poller {
        let links = Links::new(shard, umem, ports, shared.clone(), mtu);
        let mut node = node;
        if shared.shards.len() > 1 {
            // Each poller owns the connections of some peers: a key message whose root is
            // another poller's goes to that poller.
            let owner = shared.clone();
            node.set_key_owner(Some(Box::new(move |c| owner.shard_of(c) == shard)));
        }
        // An eighth of the UMEM may wait in transit; the rest keeps the fill rings stocked.
        let transit_chunks = (links.umem.chunks() / 8) as usize;
        Poller {
            shard,
            shared,
            node,
            links,
            delivery: Delivery::default(),
            services: Services::default(),
            publisher: Publisher::new(),
            transit: Transit::new(transit_chunks),
            loads: LinkLoads::new(std::iter::empty(), 0),
            epoch: Instant::now(),
            turn_now: Time::ZERO,
            pending: None,
            released: Vec::new(),
            scratch: vec![0u8; mtu + 14],
            lent: 0,
            carrier_down: DirSet::EMPTY,
            transit_busy: false,
            xdp_moved: Vec::new(),
        }
        .with_link_capacity(10_000_000_000)
    }

    /// Lets frames in transit hold at most `chunks` UMEM chunks (0: drop them when no link
    /// has room).
    pub fn with_transit_chunks(mut self, chunks: Option<u32>) -> Poller {
        if let Some(c) = chunks {
            self.transit = Transit::new(c as usize);
        }
        self
    }

    /// Measures link loads against `capacity_bps` per link.
    pub fn with_link_capacity(mut self, capacity_bps: u64) -> Poller {
        self.loads = LinkLoads::new(self.links.ports.iter().map(|p| p.dir), capacity_bps);
        self
    }

    /// Hosts `services` in this poller: events for their ids go to them, not to inboxes.
    pub fn with_services(mut self, services: Vec<Box<dyn Service>>) -> Poller {
        self.services = Services::new(services, &self.shared);
        self
    }

    /// The time of the current loop turn: read once per turn (a clock read per frame cost
    /// a tenth of the poller's time).
    fn now(&self) -> Time {
        self.turn_now
    }

    fn tick(&mut self) {
        self.turn_now = Time::from_nanos(self.epoch.elapsed().as_nanos() as u64);
    }

    fn me(&self) -> &ShardShared {
        &self.shared.shards[self.shard]
    }

    /// Runs until shutdown.
    pub fn run(mut self) -> Result<(), String> {
        for i in 0..self.links.ports.len() {
            self.links.refill(i, self.now().as_nanos());
        }
        if self.shard == 0 {
            // Peers that held connections with a previous start of this server drop them now.
            self.node.announce();
        }
        let mut idle_turns = 0u32;
        while !self.shared.shutdown.load(Ordering::Acquire) {
            if self.turn() > 0 {
                idle_turns = 0;
                continue;
            }
            idle_turns += 1;
            match self.shared.polling {
                Polling::Busy => std::hint::spin_loop(),
                Polling::Adaptive if idle_turns > ADAPTIVE_SPIN => self.sleep(),
                // Between turns, let whatever else wants this core run: adaptive pollers
                // share cores (many servers per machine), and a spinning poller only delays
                // the one that has the work it waits for.
                // SAFETY: sched_yield has no preconditions.
                Polling::Adaptive => unsafe {
                    libc::sched_yield();
                },
            }
        }
        self.publish();
        Ok(())
    }

    /// One turn of the loop: commands and hand-offs in, frames received, timers, events
    /// delivered, services polled, frames sent, rings completed and refilled. How much work
    /// it found.
    fn turn(&mut self) -> usize {
        self.tick();
        let mut work = 0usize;
        work += self.take_commands();
        work += self.take_handoffs();
        for i in 0..self.links.ports.len() {
            work += self.receive(i);
        }
        work += self.pass_held();
        self.node.take_released(&mut self.released);
        self.links.unhold(&mut self.released);
        self.state_rx_room();
        let now = self.now();
        if self.node.poll_timeout().is_some_and(|t| t <= now) {
            self.node.handle_timeout(now);
        }
        work += self.hand_off_key_messages();
        // Events before transmitting: a service has a message before the ACK of its
        // frame can leave (the delivery contract, docs/transport.md).
        let delivered = self.deliver_events() + std::mem::take(&mut self.lent);
        work += delivered;
        if delivered > 0 {
            // What the services answered goes now, not after every service's poll: a
            // request's answer waits for no other work (the round-trip time).
            work += self.transmit();
        }
        work += self.poll_services();
        self.sample_loads();
        work += self.transmit();
        let now_ns = self.now().as_nanos();
        for i in 0..self.links.ports.len() {
            self.links.complete(i);
            self.links.refill(i, now_ns);
        }
        // The turn's clock, not another read: a clock read is 5-7% of a busy poller's
        // time (perf, ping-pong), and idle turns set how soon a frame is noticed.
        if self.publisher.due(self.now()) {
            self.publish();
        }
        work
    }

    /// Sleeps in poll() on every socket and the wake eventfd until traffic, a command or
    /// the engine's next timer.
    fn sleep(&mut self) {
        let now = self.now();
        let timer = self
            .node
            .poll_timeout()
            .into_iter()
            .chain(self.services.list.iter().filter_map(|s| s.poll_timeout()))
            .min()
            .map(|t| t.since(now))
            .unwrap_or(Duration::from_millis(100));
        // To the microsecond: a millisecond poll() timeout rounds sub-millisecond timers
        // (delayed ACKs, retransmission) down to zero, and the poller spins in system calls
        // until they fire, stealing the cores of every other server on the machine.
        let mut timer = timer.min(Duration::from_millis(100));
        if !self.transit.is_empty() {
            // Frames in transit wait for TX room, which no descriptor we poll announces.
            timer = timer.min(Duration::from_micros(50));
        }
        if self.transit_busy {
            // Frames passing through in XDP wake nobody: sample the links' load on time.
            timer = timer.min(crate::linkload::PERIOD);
        }
        let ts = libc::timespec {
            tv_sec: timer.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(timer.subsec_nanos() as i32),
        };
        let mut fds: Vec<libc::pollfd> = self
            .links
            .ports
            .iter()
            .map(|p| p.xsk.as_raw_fd())
            .chain(std::iter::once(self.me().wake.as_raw_fd()))
            .chain(self.services.list.iter().flat_map(|s| s.wake_fds()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        self.me().sleeping.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        let mut quiet = self.me().commands.is_empty()
            && self.me().handoff.is_empty()
            && self.delivery.nothing_for_first();
        for svc in &mut self.services.list {
            quiet &= svc.may_sleep();
        }
        if quiet && !self.shared.shutdown.load(Ordering::Acquire) {
            // SAFETY: fds is a valid array of pollfd of the given length; ts outlives the call.
            unsafe {
                libc::ppoll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    &ts,
                    std::ptr::null(),
                )
            };
        }
        self.me().sleeping.store(false, Ordering::Release);
        for svc in &mut self.services.list {
            svc.woke();
        }
        let mut buf = 0u64;
        // SAFETY: draining our eventfd (8 bytes); EAGAIN when nothing was written is fine.
        unsafe {
            libc::read(self.me().wake.as_raw_fd(), (&mut buf as *mut u64).cast(), 8);
        }
    }

    /// Samples every link's load when due and tells the engine.
    fn sample_loads(&mut self) {
        let now = self.now();
        if !self.loads.due(now) {
            return;
        }
        let mut xdp = self.shared.xdp.as_ref().map(|x| x.lock());
        let mut busy = false;
        for i in 0..self.links.ports.len() {
            let queue = self.links.ports[i].xsk.tx.outstanding();
            let dir = self.links.ports[i].dir;
            // (Nothing passes through in XDP while transit there is off: no map read.)
            let moved = match xdp.as_ref() {
                Some(x) if x.is_on() => {
                    let c = x.counters(dir);
                    (c.transit_out_bytes, c.transit_in_bytes)
                }
                _ => (0, 0),
            };
            let Some((dir, load)) = self
                .loads
                .sample(now, i, self.links.counters(i), moved, queue)
            else {
                continue;
            };
            // Busy while the program moved bytes since the last sample (the counters are
            // totals: compared with their value then, not with zero).
            if self.xdp_moved.len() <= i {
                self.xdp_moved.resize(i + 1, (0, 0));
            }
            busy |= moved != self.xdp_moved[i];
            self.xdp_moved[i] = moved;
            self.node.set_link_load(dir, load);
            let level = load.level(u64::from(crate::transmit::BATCH));
            self.links.set_level(i, level);
            if let Some(x) = xdp.as_mut() {
                let was = x.maps().congested.contains(dir);
                let marked = x
                    .set_congested(dir, transit::congested(&load, was))
                    .and_then(|()| x.set_level(dir, level));
                if let Err(e) = marked {
                    tracing::warn!("XDP program: {e}");
                }
            }
        }
        // While frames pass through in XDP, the meters (and the links they mark loaded)
        // follow them even when this poller has nothing else to do.
        self.transit_busy = busy;
        self.loads.sampled(now);
    }

    /// Asks the engine for frames while links have room and chunks are free.
    fn transmit(&mut self) -> usize {
        let mut sent = self.drain_transit();
        // Links frames in transit wait for are theirs first.
        let reserved = self.transit.wanted();
        for _ in 0..BATCH * self.links.ports.len().max(1) as u32 {
            // Asked first, before a chunk is taken and the links' room worked out: after a
            // round trip's answer the engine usually has nothing more, and the kick waits.
            if !self.node.may_transmit() {
                break;
            }
            let now = self.now();
            let node = &mut self.node;
            let room = self.links.room(reserved);
            if !self.links.ready(room)
                || !self.links.send_one(room, |room, buf, keep| {
                    node.poll_transmit(now, room, buf, keep)
                })
            {
                break;
            }
            sent += 1;
        }
        self.links.kick();
        sent
    }

    /// Tells the engine how many more frames this poller's rings can take (receiver
    /// pacing), in whole frames.
    fn state_rx_room(&mut self) {
        let chunks = self.links.rx_room_chunks();
        let now = self.now();
        self.node
            .set_rx_room(now, chunks / self.links.chunks_per_frame.max(1));
    }

    /// Counts a message the engine lent from its frame as delivered and, when no hosted
    /// service read it in place ([`Services::take_lent`]), hands on its copy as
    /// `deliver_events` would have handed it on as the next event.
    fn hand_on_lent(&mut self, copied: Option<(u16, Event)>) {
        self.lent += 1;
        let Some((service, e)) = copied else {
            return;
        };
        self.delivery.refresh_inboxes(&self.shared);
        if let Some(Event::Message { data, .. }) = self.dispatch(service, e) {
            self.delivery.msg_buf = data;
        }
    }

    /// Hands the engine's events to the hosted services and the applications' inboxes.
    fn deliver_events(&mut self) -> usize {
        self.delivery.refresh_inboxes(&self.shared);
        let mut n = self.delivery.retry_waiting(&self.shared);
        loop {
            let e = match self.node.poll_event_ref() {
                None => break,
                Some(EventRef::Message {
                    src,
                    service,
                    data,
                    reliable,
                }) => {
                    let hosted = self.services.owner(service).is_some();
                    let buf = &mut self.delivery.msg_buf;
                    owned_message(buf, hosted, src, service, data, reliable)
                }
                Some(EventRef::Other(e)) => e,
            };
            n += 1;
            match &e {
                Event::Message { service, .. }
                | Event::Acked { service, .. }
                | Event::Failed { service, .. } => {
                    let s = *service;
                    if let Some(Event::Message { data, .. }) = self.dispatch(s, e) {
                        self.delivery.msg_buf = data;
                    }
                }
                // Every poller's engine sees the view change; the first tells everyone.
                Event::Unreachable(_) | Event::Reachable(_) | Event::RootsMoved
                    if self.shard != 0 => {}
                // Services live with the first poller: a reset another one saw goes there.
                Event::PeerReset { .. } if self.shard != 0 => {
                    self.delivery
                        .send_to_first(&self.shared, Command::Broadcast(e));
                }
                Event::Unreachable(_)
                | Event::Reachable(_)
                | Event::RootsMoved
                | Event::PeerReset { .. } => {
                    self.broadcast(e);
                }
            }
        }
        n
    }

    /// An event for service `id`: to the hosted service that owns it (which reads it by
    /// reference: the event comes back, for its buffer to be reused), or to its inbox.
    /// Passes the frames applications' on-path hooks held to the applications' host; a
    /// frame that finds its queue full goes on unchanged.
    fn pass_held(&mut self) -> usize {
        let held = self.node.take_held();
        let n = held.len();
        let mut passed = false;
        for f in held {
            match self.shared.apps.intercepted.push(f) {
                Ok(()) => passed = true,
                Err(mut f) => {
                    let now = self.now();
                    if let torusnet_proto::node::RxAction::Forward(hops) =
                        self.node.resume_on_path(now, &mut f)
                    {
                        self.links.send_on(hops, f);
                    }
                }
            }
        }
        if passed {
            self.shared.shards[0].wake();
        }
        n
    }

    /// Passes reliable messages to keys whose roots' connections are other pollers' to
    /// those pollers (as sends to the key: the engine there follows the root from then on).
    /// One that finds the other poller's queue full is reported failed to its sender.
    fn hand_off_key_messages(&mut self) -> usize {
        let handoffs = self.node.take_keyed_handoffs();
        let n = handoffs.len();
        for h in handoffs {
            let owner = self
                .node
                .key_root(h.key)
                .map_or(self.shard, |r| self.shared.shard_of(r));
            let c = Command::Send {
                target: Target::Key(h.key),
                service: h.service,
                data: h.data,
                opts: MsgOptions {
                    reliable: true,
                    tag: h.tag,
                    from: Some(h.from),
                    ..MsgOptions::default()
                },
            };
            if self.shared.push_to(owner, c).is_err() {
                let ev = Event::Failed {
                    peer: self.shared.coord,
                    service: h.from,
                    tags: vec![h.tag],
                    reason: FailReason::Refused,
                };
                let _ = self.dispatch(h.from, ev);
            }
        }
        n
    }

    fn dispatch(&mut self, id: u16, e: Event) -> Option<Event> {
        if let Some(i) = self.services.owner(id) {
            let now = self.now();
            let mut engine = Routed::new(&mut self.node, &self.shared, self.shard);
            self.services.list[i].on_event(now, &e, &mut engine);
            return Some(e);
        }
        if self.delivery.has_inbox(id) || self.shard == 0 {
            self.delivery.push_event(&self.shared, id, e);
            return None;
        }
        // Hosted applications live with the first poller: hand it the event.
        self.delivery
            .send_to_first(&self.shared, Command::Deliver(id, e));
        None
    }

    /// An event every service and application hears of.
    fn broadcast(&mut self, e: Event) {
        let now = self.now();
        for svc in &mut self.services.list {
            let mut engine = Routed::new(&mut self.node, &self.shared, self.shard);
            svc.on_event(now, &e, &mut engine);
        }
        for s in self.delivery.inbox_ids() {
            self.delivery.push_event(&self.shared, s, e.clone());
        }
    }

    /// Lets every hosted service send what is due.
    fn poll_services(&mut self) -> usize {
        let now = self.now();
        let mut n = 0;
        for svc in &mut self.services.list {
            let reserved = self.transit.wanted();
            let mut engine = Routed::sending(
                &mut self.node,
                &self.shared,
                self.shard,
                &mut self.links,
                reserved,
            );
            n += svc.poll(now, &mut engine);
        }
        n
    }

    /// Publishes this poller's snapshot for the status.
    fn publish(&mut self) {
        let now = self.now();
        let snap = self.publisher.snapshot(
            now,
            &self.node,
            &self.links,
            &self.delivery,
            self.carrier_down,
        );
        *self.me().snapshot.lock() = snap;
    }
}
