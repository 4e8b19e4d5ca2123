//! The poller: one thread that owns a server's rings, UMEM and protocol engine, and moves
//! frames between them. It holds no protocol logic: every decision is the engine's
//! (`proto::node`); this loop only reads descriptors, hands bytes over, and puts the
//! engine's answers back on the rings.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use torusnet_proto::node::{Event, EventRef, Node, Received, RxAction, Target};
use torusnet_proto::service::{Engine, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dir, DirSet};
use torusnet_proto::transport::{FailReason, Lent, SendError};
use torusnet_proto::wire::{Dest, FrameView, Header, Kind, HEADERS_LEN};

use crate::config::Polling;
use crate::counters::{add, LinkCounters};
use crate::fill_depth::FillDepth;
use crate::linkload::LinkLoads;
use crate::loader::XdpAttachment;
use crate::runtime::{
    Command, EngineSnapshot, FlowRoute, Handoff, HandoffCounts, Inbox, RoutingStatus, ShardShared,
    Shared, TransportStatus,
};
use crate::transit::Transit;
use crate::tx_path::{TxPath, TX_QUEUE_LIMIT};
use crate::xsk::sys::XDP_PKT_CONTD;
use crate::xsk::{Umem, XdpDesc, XskSocket, CHUNK};

/// Frames handled per ring per turn, so no link starves the others.
const BATCH: u32 = 64;

/// How often the engine's counters are published for `torusctl status` and metrics.
const SNAPSHOT_EVERY: Duration = Duration::from_millis(100);

/// One link as the poller sees it.
#[derive(Debug)]
pub struct Port {
    pub(crate) dir: Dir,
    pub(crate) local_mac: [u8; 6],
    pub(crate) neighbor_mac: Option<[u8; 6]>,
    pub(crate) xsk: XskSocket,
    xdp: XdpAttachment,
    /// Descriptors put on the TX ring since the last kick.
    pub(crate) unkicked: u32,
    /// Buffers of the multi-buffer frame being received on this link (a frame may straddle
    /// two turns; each link keeps its own).
    parts: Vec<XdpDesc>,
}

impl Port {
    /// A port over a bound socket and its attached program.
    pub fn new(
        dir: Dir,
        local_mac: [u8; 6],
        neighbor_mac: Option<[u8; 6]>,
        xsk: XskSocket,
        xdp: XdpAttachment,
    ) -> Port {
        Port {
            dir,
            local_mac,
            neighbor_mac,
            xsk,
            xdp,
            unkicked: 0,
            parts: Vec::new(),
        }
    }
}

/// The poller's way out ([`TxPath`]), borrowed from its fields so that the engine (and the
/// services) can be borrowed beside it.
macro_rules! tx_path {
    ($p:ident, $reserved:expr) => {
        TxPath {
            umem: &mut $p.umem,
            ports: &mut $p.ports,
            link_idx: &$p.link_idx,
            by_dir: &$p.by_dir,
            shared: &$p.shared,
            shard: $p.shard,
            mtu: $p.mtu,
            chunks_per_frame: $p.chunks_per_frame,
            sending_slots: $p.sending_slots,
            handoffs: &mut $p.handoffs,
            reserved: $reserved,
        }
    };
}

/// The engine as hosted services see it, with this poller's links to send straight into
/// frames on (a macro, like `tx_path!`, so that it borrows the poller's fields apart and
/// leaves its services and buffers free).
macro_rules! routed_tx {
    ($p:ident) => {{
        let reserved = $p.transit.wanted();
        Routed {
            node: &mut $p.node,
            shared: &$p.shared,
            shard: $p.shard,
            tx: Some(tx_path!($p, reserved)),
        }
    }};
}

/// The engine as a hosted service sees it: sends to peers whose connections another poller
/// owns become commands for that poller (hosted services live with the first poller; every
/// connection must stay with its owner).
struct Routed<'a> {
    node: &'a mut Node,
    shared: &'a Shared,
    shard: usize,
    /// The poller's links, for messages sent straight into their frames
    /// ([`Engine::send_framing`]; `None`: they are queued).
    tx: Option<TxPath<'a>>,
}

impl<'a> Routed<'a> {
    fn new(node: &'a mut Node, shared: &'a Shared, shard: usize) -> Routed<'a> {
        Routed {
            node,
            shared,
            shard,
            tx: None,
        }
    }

    /// Sends through the engine of poller `owner` (the one [`Routed::owner`] names): this
    /// one's directly, another's as a command.
    fn send_via(
        &mut self,
        owner: usize,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: torusnet_proto::node::MsgOptions,
    ) -> Result<(), SendError> {
        if owner == self.shard {
            return self.node.send(now, target, service, data, opts);
        }
        let c = Command::Send {
            target,
            service,
            data: data.to_vec(),
            opts,
        };
        self.shared
            .push_to(owner, c)
            .map_err(|_| SendError::WouldBlock)
    }

    /// The poller whose engine holds the connection a message to `target` travels on.
    fn owner(&self, target: Target, reliable: bool) -> usize {
        match target {
            Target::Server(c) => self.shared.shard_of(c),
            Target::Key(k) if reliable => self
                .node
                .key_root(k)
                .map_or(self.shard, |r| self.shared.shard_of(r)),
            Target::Key(_) => self.shard,
        }
    }
}

impl Engine for Routed<'_> {
    fn local(&self) -> torusnet_proto::topology::Coord {
        self.node.local()
    }
    fn dims(&self) -> torusnet_proto::topology::Dims {
        self.node.dims()
    }
    fn incarnation(&self) -> u64 {
        Engine::incarnation(&*self.node)
    }
    fn is_reachable(&self, c: torusnet_proto::topology::Coord) -> bool {
        self.node.routes().is_reachable(c)
    }
    fn takes_keys(&self, c: torusnet_proto::topology::Coord) -> bool {
        self.node.routes().takes_keys(c)
    }
    fn distance(&self, c: torusnet_proto::topology::Coord) -> Option<u32> {
        self.node.routes().distance(c)
    }
    fn key_root(&self, key: u64) -> Option<torusnet_proto::topology::Coord> {
        self.node.key_root(key)
    }
    #[inline]
    fn send(
        &mut self,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: torusnet_proto::node::MsgOptions,
    ) -> Result<(), SendError> {
        let owner = self.owner(target, opts.reliable);
        self.send_via(owner, now, target, service, data, opts)
    }
    fn send_framing(
        &mut self,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: torusnet_proto::node::MsgOptions,
    ) -> Result<(), SendError> {
        // Most small messages (a stream's, with frames in flight) are queued: they are sent
        // without working out the links' room or taking a buffer.
        let straight = self.node.frames_straight(data.len(), opts.reliable);
        let owner = self.owner(target, opts.reliable);
        let (node, tx) = (&mut *self.node, self.tx.as_mut());
        match tx {
            Some(tx) if straight && owner == self.shard => {
                send_straight(node, tx, now, target, service, data, opts)
            }
            // Another poller's peer: it frames the message when it takes it over.
            _ => self.send_via(owner, now, target, service, data, opts),
        }
    }
    fn notify_acks(&mut self, service: u16, on: bool) {
        // Reports come from every poller's engine. Nothing waits for an answer here (the
        // service asked from inside a poller): a full queue is counted.
        if self.shared.push(Command::NotifyAcks(service, on)).is_err() {
            self.shared.commands_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// [`Node::send_framing`] with a buffer from `tx`: a message that goes straight is written
/// into a frame on one of `tx`'s links, other messages are taken as `send` takes them;
/// `Err(WouldBlock)` also when it would go straight but cannot go at once.
#[allow(clippy::too_many_arguments)]
fn send_straight(
    node: &mut Node,
    tx: &mut TxPath<'_>,
    now: Time,
    target: Target,
    service: u16,
    data: &[u8],
    opts: torusnet_proto::node::MsgOptions,
) -> Result<(), SendError> {
    let room = tx.room();
    if !tx.ready(room) {
        // No buffer or link now: the engine still takes what it would queue.
        return node
            .send_framing(now, target, service, data, opts, room, &mut [], None)
            .map(|_| ());
    }
    let mut taken = Ok(());
    tx.send_one(room, |room, buf, keep| {
        match node.send_framing(now, target, service, data, opts, room, buf, keep) {
            Ok(frame) => frame,
            Err(e) => {
                taken = Err(e);
                None
            }
        }
    });
    taken
}

/// Idle turns an adaptive poller makes (yielding the core between them) before it sleeps.
const ADAPTIVE_SPIN: u32 = 16;

/// One poller of a server: its links, its UMEM, its engine.
pub struct Poller {
    shard: usize,
    node: Node,
    umem: Umem,
    ports: Vec<Port>,
    /// Global link index (into `Shared::links`) of each port.
    link_idx: Vec<usize>,
    handoffs: HandoffCounts,
    by_dir: [Option<usize>; 6],
    shared: Arc<Shared>,
    epoch: Instant,
    mtu: usize,
    chunks_per_frame: u32,
    /// Transmit slots kept free of retransmission copies ([`sending_slots`]).
    sending_slots: usize,
    /// Slots the transport has just let go of (reused buffer).
    released: Vec<u32>,
    /// How deep each port's fill ring is kept.
    fill: Vec<FillDepth>,
    /// A command the engine could not take yet (its queue was full).
    pending: Option<Command>,
    inboxes: HashMap<u16, Arc<Inbox>>,
    inbox_version: u64,
    /// Events for services whose inbox was full.
    overflow: VecDeque<(u16, Event)>,
    overflow_drops: u64,
    /// Commands for the first poller (events for the services and applications it hosts)
    /// that found its queue full: retried in order every turn rather than dropped.
    to_first: VecDeque<Command>,
    /// Embedded services whose inbox this poller found full, with how many of their events
    /// wait in `overflow`: marked full in the hosted set, so transports refuse their
    /// reliable messages (senders told) until they catch up.
    full_inboxes: Vec<(u16, usize)>,
    /// Messages for a service nobody on this server hosts or attached as.
    no_service: u64,
    /// Reassembly of multi-buffer frames and building of jumbo frames.
    scratch: Vec<u8>,
    /// The buffer a message for a hosted service is copied into (services read events by
    /// reference, so it comes back and is reused: no allocation per message).
    msg_buf: Vec<u8>,
    /// Messages the engine lent from their frames this turn and this poller handed on
    /// (`Node::handle_rx_lending`): deliveries, for the turn's answer to go at once.
    lent: usize,
    view_version: u64,
    /// When the engine's snapshot was last published (None: not yet).
    last_snapshot: Option<Time>,
    /// Services hosted in this poller (the built-in ones), and which owns each service id.
    services: Vec<Box<dyn Service>>,
    service_of: HashMap<u16, usize>,
    turn_now: Time,
    loads: LinkLoads,
    /// Unix time (ms) of the poller's epoch, to report its instants.
    epoch_unix_ms: u64,
    view_changed_unix_ms: u64,
    carrier_down: DirSet,
    /// Frames passing through that wait for room on their next link.
    transit: Transit,
}

/// Transmit slots a poller with `ports` links needs when its frames span
/// `chunks_per_frame` chunks (none for single-chunk frames): every port's TX queue full
/// while a batch is built ([`sending_slots`]), and a window of frames the transport keeps
/// for retransmission where they were sent ([`KEPT_SLOTS`]). Its UMEM holds them on top of
/// the chunks configured for receiving and forwarding.
pub fn tx_slots(ports: usize, chunks_per_frame: u32) -> u32 {
    if chunks_per_frame < 2 {
        return 0;
    }
    sending_slots(ports, chunks_per_frame) + KEPT_SLOTS
}

/// Slots that are never kept for retransmission, so that frames (ACKs above all) can always
/// be sent: kept frames are freed by acknowledgements, which need frames sent both ways.
fn sending_slots(ports: usize, chunks_per_frame: u32) -> u32 {
    ports.max(1) as u32 * (TX_QUEUE_LIMIT / chunks_per_frame + 1) + BATCH
}

/// Jumbo frames kept in their slots for retransmission, at most: one default window (512
/// frames) in flight; beyond it, the transport keeps copies.
const KEPT_SLOTS: u32 = 512;

impl Poller {
    /// Poller `shard` over these ports (with their global link indices), all sharing `umem`.
    pub fn new(
        shard: usize,
        node: Node,
        mut umem: Umem,
        ports: Vec<(usize, Port)>,
        shared: Arc<Shared>,
        mtu: usize,
    ) -> Poller {
        let (link_idx, ports): (Vec<usize>, Vec<Port>) = ports.into_iter().unzip();
        let chunks_per_frame = (mtu + 14).div_ceil(CHUNK) as u32;
        umem.reserve_tx_slots(tx_slots(ports.len(), chunks_per_frame), chunks_per_frame);
        let sending_slots = sending_slots(ports.len(), chunks_per_frame) as usize;
        let mut by_dir = [None; 6];
        for (i, p) in ports.iter().enumerate() {
            by_dir[usize::from(p.dir.index())] = Some(i);
        }
        let ring = ports.first().map(|p| p.xsk.fill.size()).unwrap_or(2048);
        // An eighth of the UMEM may wait in transit; the rest keeps the fill rings stocked.
        let transit_chunks = (umem.chunks() / 8) as usize;
        let fill_max = ring
            .min(umem.chunks() / (2 * ports.len().max(1) as u32))
            .max(16);
        // Busy pollers refill every turn and keep their rings only as deep as the traffic
        // needs (cold chunks cost every round trip); adaptive ones may be away, and keep
        // theirs full.
        let follow = matches!(shared.polling, Polling::Busy);
        let fill = vec![FillDepth::new(fill_max, follow); ports.len()];
        Poller {
            shard,
            node,
            umem,
            ports,
            link_idx,
            handoffs: HandoffCounts::default(),
            by_dir,
            shared,
            epoch: Instant::now(),
            mtu,
            chunks_per_frame,
            sending_slots,
            released: Vec::new(),
            fill,
            pending: None,
            inboxes: HashMap::new(),
            inbox_version: u64::MAX,
            overflow: VecDeque::new(),
            overflow_drops: 0,
            full_inboxes: Vec::new(),
            to_first: VecDeque::new(),
            no_service: 0,
            scratch: vec![0u8; mtu + 14],
            msg_buf: Vec::new(),
            lent: 0,
            view_version: 1,
            last_snapshot: None,
            services: Vec::new(),
            service_of: HashMap::new(),
            turn_now: Time::ZERO,
            loads: LinkLoads::new(std::iter::empty(), 0),
            epoch_unix_ms: unix_ms(),
            view_changed_unix_ms: unix_ms(),
            carrier_down: DirSet::EMPTY,
            transit: Transit::new(transit_chunks),
        }
        .with_link_capacity(10_000_000_000)
    }

    /// Sends a frame passing through on one of `hops`, or holds it until a link has room
    /// (behind frames already waiting for those links, so none overtakes another); drops
    /// it, counted, only when the transit queue is full.
    fn forward_or_hold(&mut self, from: usize, hops: DirSet, descs: &[XdpDesc]) {
        let queued_before = self.transit.wanted().bits() & hops.bits() != 0;
        if !queued_before && self.forward(from, hops, descs) {
            return;
        }
        if self.transit.push(hops, descs, from) {
            add(&self.counters(from).forward_waited, 1);
        } else if !(queued_before && self.forward(from, hops, descs)) {
            add(&self.counters(from).drop_no_room, 1);
            self.release_parts(descs);
        }
    }

    /// Sends what waits in transit, oldest first, on links that have room now.
    fn drain_transit(&mut self) -> usize {
        if self.transit.is_empty() {
            return 0;
        }
        let mut t = std::mem::replace(&mut self.transit, Transit::new(0));
        let dead = self.carrier_down;
        let n = t.drain(|hops, descs, from| {
            // Every link it could take lost its carrier: it would wait for ever.
            if hops.bits() & !dead.bits() == 0 {
                add(&self.counters(from).drop_no_room, 1);
                self.release_parts(descs);
                return true;
            }
            self.forward(from, hops, descs)
        });
        self.transit = t;
        n
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
        self.loads = LinkLoads::new(self.ports.iter().map(|p| p.dir), capacity_bps);
        self
    }

    /// Samples every link's load when due and tells the engine.
    fn sample_loads(&mut self) {
        let now = self.now();
        if !self.loads.due(now) {
            return;
        }
        for i in 0..self.ports.len() {
            let queue = self.ports[i].xsk.tx.outstanding();
            let c = &self.shared.links[self.link_idx[i]].counters;
            if let Some((dir, load)) = self.loads.sample(now, i, c, queue) {
                self.node.set_link_load(dir, load);
            }
        }
        self.loads.sampled(now);
    }

    /// The Unix time (ms) of an engine instant.
    fn unix_ms_of(&self, t: Time) -> u64 {
        self.epoch_unix_ms + t.as_nanos() / 1_000_000
    }

    /// Hosts `services` in this poller: events for their ids go to them, not to inboxes.
    pub fn with_services(mut self, services: Vec<Box<dyn Service>>) -> Poller {
        for (i, svc) in services.iter().enumerate() {
            for id in svc.ids() {
                self.service_of.insert(*id, i);
                self.shared.hosted.host(*id);
            }
        }
        self.services = services;
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

    fn counters(&self, port: usize) -> &LinkCounters {
        &self.shared.links[self.link_idx[port]].counters
    }

    fn me(&self) -> &ShardShared {
        &self.shared.shards[self.shard]
    }

    /// Runs until shutdown.
    pub fn run(mut self) -> Result<(), String> {
        for i in 0..self.ports.len() {
            self.refill(i);
        }
        if self.shard == 0 {
            // Peers that held connections with a previous start of this server drop them now.
            self.node.announce();
        }
        let mut idle_turns = 0u32;
        while !self.shared.shutdown.load(Ordering::Acquire) {
            self.tick();
            let mut work = 0usize;
            work += self.take_commands();
            work += self.take_handoffs();
            for i in 0..self.ports.len() {
                work += self.receive(i);
            }
            self.unhold_released();
            self.state_rx_room();
            let now = self.now();
            if self.node.poll_timeout().is_some_and(|t| t <= now) {
                self.node.handle_timeout(now);
            }
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
            for i in 0..self.ports.len() {
                self.complete(i);
                self.refill(i);
            }
            // The turn's clock, not another read: a clock read is 5-7% of a busy poller's
            // time (perf, ping-pong), and idle turns set how soon a frame is noticed.
            if self
                .last_snapshot
                .is_none_or(|t| self.now().since(t) >= SNAPSHOT_EVERY)
            {
                self.publish();
            }
            if work > 0 {
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

    /// Sleeps in poll() on every socket and the wake eventfd until traffic, a command or
    /// the engine's next timer.
    fn sleep(&mut self) {
        let now = self.now();
        let timer = self
            .node
            .poll_timeout()
            .into_iter()
            .chain(self.services.iter().filter_map(|s| s.poll_timeout()))
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
        let ts = libc::timespec {
            tv_sec: timer.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(timer.subsec_nanos() as i32),
        };
        let mut fds: Vec<libc::pollfd> = self
            .ports
            .iter()
            .map(|p| libc::pollfd {
                fd: p.xsk.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        fds.push(libc::pollfd {
            fd: self.me().wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for svc in &self.services {
            fds.extend(svc.wake_fds().into_iter().map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            }));
        }
        self.me().sleeping.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        let mut quiet = self.me().commands.is_empty()
            && self.me().handoff.is_empty()
            && self.to_first.is_empty();
        for svc in &mut self.services {
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
        for svc in &mut self.services {
            svc.woke();
        }
        let mut buf = 0u64;
        // SAFETY: draining our eventfd (8 bytes); EAGAIN when nothing was written is fine.
        unsafe {
            libc::read(self.me().wake.as_raw_fd(), (&mut buf as *mut u64).cast(), 8);
        }
    }

    fn take_commands(&mut self) -> usize {
        let mut n = 0;
        for _ in 0..256 {
            let cmd = match self.pending.take() {
                Some(c) => c,
                None => match self.me().commands.pop() {
                    Some(c) => c,
                    None => break,
                },
            };
            match cmd {
                Command::Send {
                    target,
                    service,
                    data,
                    opts,
                } => {
                    let now = self.now();
                    // A reliable message to a key goes to the key's root: the poller that
                    // owns the connection with the root sends it.
                    if let (Target::Key(k), true) = (target, opts.reliable) {
                        if let Some(root) = self.node.key_root(k) {
                            let owner = self.shared.shard_of(root);
                            if owner != self.shard {
                                let c = Command::Send {
                                    target: Target::Server(root),
                                    service,
                                    data,
                                    opts,
                                };
                                if let Err(c) = self.shared.shards[owner].commands.push(c) {
                                    self.pending = Some(c);
                                    break;
                                }
                                self.shared.shards[owner].wake();
                                n += 1;
                                continue;
                            }
                        }
                    }
                    // A message handed over by another poller (its peer's connection is this
                    // one's) goes straight into its frame when it can go at once; else it is
                    // queued, so that commands behind it never wait for a closed window.
                    let mut sent = Err(SendError::WouldBlock);
                    if self.node.frames_straight(data.len(), opts.reliable) {
                        let reserved = self.transit.wanted();
                        let node = &mut self.node;
                        let mut tx = tx_path!(self, reserved);
                        sent = send_straight(node, &mut tx, now, target, service, &data, opts);
                    }
                    if sent == Err(SendError::WouldBlock) {
                        sent = self.node.send(now, target, service, &data, opts);
                    }
                    match sent {
                        Ok(()) => n += 1,
                        Err(SendError::WouldBlock) => {
                            // The engine's queue is full: hold it, take no more for now.
                            self.pending = Some(Command::Send {
                                target,
                                service,
                                data,
                                opts,
                            });
                            break;
                        }
                        // The application's send already returned: it learns of the failure
                        // from its inbox, like any other.
                        Err(e) => {
                            let peer = match target {
                                Target::Server(c) => c,
                                Target::Key(_) => self.shared.coord,
                            };
                            let reason = FailReason::of_send(e);
                            let from = opts.from.unwrap_or(service);
                            let ev = Event::Failed {
                                peer,
                                service: from,
                                tags: vec![opts.tag],
                                reason,
                            };
                            let _ = self.dispatch(from, ev);
                            n += 1;
                        }
                    }
                }
                Command::SetFault { dir, drop } => {
                    if let Some(i) = self.by_dir[usize::from(dir.index())] {
                        let _ = self.ports[i].xdp.set_fault_drop(drop);
                    }
                    n += 1;
                }
                Command::Request { service, request } => {
                    let now = self.now();
                    if let Some(&i) = self.service_of.get(&service) {
                        // A request the service does not understand is dropped; its sender's
                        // wait has a deadline.
                        let mut engine = Routed::new(&mut self.node, &self.shared, self.shard);
                        let _ = self.services[i].on_request(now, request, &mut engine);
                    }
                    n += 1;
                }
                Command::NotifyAcks(service, on) => {
                    self.node.notify_acks(service, on);
                    n += 1;
                }
                Command::Deliver(service, e) => {
                    let _ = self.dispatch(service, e);
                    n += 1;
                }
                Command::Broadcast(e) => {
                    self.broadcast(e);
                    n += 1;
                }
                Command::LinkCarrier(dir, up) => {
                    self.node.set_link_up(dir, up);
                    self.carrier_down = if up {
                        self.carrier_down.without(dir)
                    } else {
                        self.carrier_down.with(dir)
                    };
                    n += 1;
                }
                Command::SetRouting(on, services, reply) => {
                    let ok = self.node.set_source_routing(on);
                    if ok {
                        self.node.set_source_services(services);
                    }
                    if let Some(r) = reply {
                        let _ = r.send(ok);
                    }
                    n += 1;
                }
                Command::SetView(view, macs, ack) => {
                    if self.node.set_view(*view).is_ok() {
                        self.view_version += 1;
                        self.view_changed_unix_ms = unix_ms();
                    }
                    for (k, p) in self.ports.iter_mut().enumerate() {
                        if let Some(m) = macs[usize::from(p.dir.index())] {
                            p.neighbor_mac = Some(m);
                            let l = &self.shared.links[self.link_idx[k]];
                            l.neighbor_mac
                                .store(crate::runtime::mac_to_u64(Some(m)), Ordering::Relaxed);
                        }
                    }
                    if let Some(a) = ack {
                        let _ = a.send(());
                    }
                    n += 1;
                }
            }
        }
        n
    }

    /// Reads up to a batch of frames from port `i` and acts on each.
    fn receive(&mut self, i: usize) -> usize {
        let avail = self.ports[i].xsk.rx.available(BATCH);
        if avail == 0 {
            return 0;
        }
        let dir = self.ports[i].dir;
        let mut frames = 0;
        for k in 0..avail {
            let d = self.ports[i].xsk.rx.read(k);
            if d.options & XDP_PKT_CONTD != 0 || !self.ports[i].parts.is_empty() {
                self.ports[i].parts.push(d);
                if d.options & XDP_PKT_CONTD != 0 {
                    continue;
                }
            }
            frames += 1;
            if self.ports[i].parts.is_empty() {
                self.rx_single(i, dir, d);
            } else {
                self.rx_multi(i, dir);
            }
        }
        self.ports[i].xsk.rx.release(avail);
        frames
    }

    fn check_mac(&self, i: usize, frame: &[u8]) -> bool {
        match self.ports[i].neighbor_mac {
            Some(m) => frame.len() >= 12 && frame[6..12] == m,
            None => true,
        }
    }

    fn rx_single(&mut self, i: usize, dir: Dir, d: XdpDesc) {
        let c = self.counters(i);
        add(&c.rx_frames, 1);
        add(&c.rx_bytes, u64::from(d.len));
        let now = self.now();
        let frame = self.umem.slice(d.addr, d.len as usize);
        if !self.check_mac(i, frame) {
            add(&self.counters(i).drop_bad_mac, 1);
            self.umem.release(d.addr);
            return;
        }
        if let Some(owner) = self.foreign_owner(frame) {
            let bytes = frame.to_vec();
            self.hand_off(owner, Handoff::Deliver(bytes));
            self.umem.release(d.addr);
            return;
        }
        let lend = self.may_lend();
        let action = if lend {
            // SAFETY: the chunk came off the RX ring and stays ours until it is released
            // below, after the last use of `frame` and of the message lent from it; the
            // services' answers are written only into chunks the UMEM hands out.
            let frame = unsafe { self.umem.held_mut(d.addr, d.len as usize) };
            match self.node.handle_rx_lending(now, dir, frame) {
                Received::Message(m) => {
                    // The services read the message where it lies and may answer straight
                    // into a frame of their own (a round trip's answer skips the queue).
                    let mut engine = routed_tx!(self);
                    let hosts = (&self.service_of, &mut self.services[..]);
                    let copied = take_lent(hosts, &mut engine, now, &m, &mut self.msg_buf);
                    self.umem.release(d.addr);
                    self.hand_on_lent(copied);
                    return;
                }
                Received::Action(a) => a,
            }
        } else {
            let frame = self.umem.slice_mut(d.addr, d.len as usize);
            self.node.handle_rx(now, dir, frame)
        };
        match action {
            RxAction::Consumed => self.umem.release(d.addr),
            RxAction::Drop(r) => {
                self.counters(i).drop(r);
                self.umem.release(d.addr);
            }
            RxAction::Forward(hops) => self.forward_or_hold(i, hops, &[d]),
        }
    }

    fn rx_multi(&mut self, i: usize, dir: Dir) {
        let parts = std::mem::take(&mut self.ports[i].parts);
        let total: usize = parts.iter().map(|p| p.len as usize).sum();
        let c = self.counters(i);
        add(&c.rx_frames, 1);
        add(&c.rx_bytes, total as u64);
        if total > self.scratch.len() {
            add(&self.counters(i).drop_malformed, 1);
            self.release_parts(&parts);
            self.recycle_parts(i, parts);
            return;
        }
        if self.forward_by_head(i, &parts, total) {
            self.recycle_parts(i, parts);
            return;
        }
        let mut at = 0;
        for p in &parts {
            let s = self.umem.slice(p.addr, p.len as usize);
            self.scratch[at..at + s.len()].copy_from_slice(s);
            at += s.len();
        }
        if !self.check_mac(i, &self.scratch[..total]) {
            add(&self.counters(i).drop_bad_mac, 1);
            self.release_parts(&parts);
        } else {
            if let Some(owner) = self.foreign_owner(&self.scratch[..total]) {
                let bytes = self.scratch[..total].to_vec();
                self.hand_off(owner, Handoff::Deliver(bytes));
                self.release_parts(&parts);
                self.recycle_parts(i, parts);
                return;
            }
            let now = self.now();
            let mut scratch = std::mem::take(&mut self.scratch);
            let action = if self.may_lend() {
                match self.node.handle_rx_lending(now, dir, &mut scratch[..total]) {
                    Received::Message(m) => {
                        let mut engine = routed_tx!(self);
                        let hosts = (&self.service_of, &mut self.services[..]);
                        let copied = take_lent(hosts, &mut engine, now, &m, &mut self.msg_buf);
                        self.scratch = scratch;
                        self.release_parts(&parts);
                        self.recycle_parts(i, parts);
                        self.hand_on_lent(copied);
                        return;
                    }
                    Received::Action(a) => a,
                }
            } else {
                self.node.handle_rx(now, dir, &mut scratch[..total])
            };
            match action {
                RxAction::Consumed => self.release_parts(&parts),
                RxAction::Drop(r) => {
                    self.counters(i).drop(r);
                    self.release_parts(&parts);
                }
                RxAction::Forward(hops) => {
                    // The header (TTL) changed in the scratch copy; it lies in the first
                    // buffer, so write that buffer back and move all of them.
                    let first = parts[0];
                    let n = first.len as usize;
                    self.umem
                        .slice_mut(first.addr, n)
                        .copy_from_slice(&scratch[..n]);
                    self.forward_or_hold(i, hops, &parts);
                }
            }
            self.scratch = scratch;
        }
        self.recycle_parts(i, parts);
    }

    /// Handles a multi-buffer frame passing through (or dropped) from its first buffer
    /// alone, which holds its headers: a jumbo frame forwarded is moved between rings
    /// without being copied into one piece. False when the frame is for this server, an
    /// interceptor reads it, or the first buffer is not all headers and neighbour: the
    /// caller then assembles it.
    fn forward_by_head(&mut self, i: usize, parts: &[XdpDesc], total: usize) -> bool {
        let Some(&first) = parts.first() else {
            return false;
        };
        let n = first.len as usize;
        if n < HEADERS_LEN || !self.check_mac(i, self.umem.slice(first.addr, n)) {
            return false;
        }
        let head = self.umem.slice_mut(first.addr, n);
        let Some(action) = self.node.handle_rx_head(head, total) else {
            return false;
        };
        match action {
            RxAction::Forward(hops) => self.forward_or_hold(i, hops, parts),
            RxAction::Drop(r) => {
                self.counters(i).drop(r);
                self.release_parts(parts);
            }
            RxAction::Consumed => self.release_parts(parts),
        }
        true
    }

    fn release_parts(&mut self, parts: &[XdpDesc]) {
        for p in parts {
            self.umem.release(p.addr);
        }
    }

    /// Gives the (emptied) parts vector back to port `i`, keeping its allocation.
    fn recycle_parts(&mut self, i: usize, mut parts: Vec<XdpDesc>) {
        parts.clear();
        self.ports[i].parts = parts;
    }

    /// Moves a received frame's descriptors to the TX ring of the first next-hop link with
    /// room, rewriting the Ethernet addresses for that link. No copy: the UMEM is shared.
    fn forward(&mut self, from: usize, hops: DirSet, descs: &[XdpDesc]) -> bool {
        let need = descs.len() as u32;
        for d in hops.iter() {
            let Some(o) = self.by_dir[usize::from(d.index())] else {
                continue;
            };
            if self.ports[o].xsk.tx.outstanding() + need > TX_QUEUE_LIMIT {
                add(&self.counters(o).tx_ring_full, 1);
                continue;
            }
            self.push_tx(o, descs);
            add(&self.counters(from).forwarded, 1);
            return true;
        }
        // No link of ours can take it: a link of another poller (copied across).
        for d in hops.iter() {
            let Some(owner) = self.shared.link_shard[usize::from(d.index())] else {
                continue;
            };
            if owner == self.shard || self.shared.shards[owner].handoff.is_full() {
                continue;
            }
            let mut bytes = Vec::new();
            for x in descs {
                bytes.extend_from_slice(self.umem.slice(x.addr, x.len as usize));
            }
            for x in descs {
                self.umem.release(x.addr);
            }
            // A full queue (another poller may have filled it since the check above)
            // drops the frame, counted as a hand-off dropped.
            if self.hand_off(owner, Handoff::Send(d, bytes)) {
                add(&self.counters(from).forwarded, 1);
            }
            return true;
        }
        false
    }

    /// The poller that must handle `frame` instead of this one: a frame for this server
    /// from a peer whose connection another poller owns.
    fn foreign_owner(&self, frame: &[u8]) -> Option<usize> {
        if self.shared.shards.len() <= 1 {
            return None;
        }
        let h = FrameView::new_checked(frame)
            .and_then(|v| Header::parse(&v))
            .ok()?;
        if h.dst != Dest::Server(self.shared.coord) || h.kind == Kind::Control {
            return None;
        }
        let owner = self.shared.shard_of(h.src);
        (owner != self.shard).then_some(owner)
    }

    fn hand_off(&mut self, owner: usize, h: Handoff) -> bool {
        tx_path!(self, DirSet::EMPTY).hand_off(owner, h)
    }

    /// Frames other pollers passed to this one.
    fn take_handoffs(&mut self) -> usize {
        let mut n = 0;
        while n < BATCH as usize {
            let Some(h) = self.me().handoff.pop() else {
                break;
            };
            n += 1;
            match h {
                Handoff::Deliver(mut bytes) => {
                    let now = self.now();
                    if let RxAction::Forward(hops) =
                        self.node.handle_rx(now, Dir::PlusX, &mut bytes)
                    {
                        // The view moved while it was handed over: send it on from here.
                        match hops
                            .iter()
                            .find(|d| self.by_dir[usize::from(d.index())].is_some())
                        {
                            Some(d) => self.send_bytes(d, &bytes),
                            None => self.handoffs.dropped += 1,
                        }
                    }
                }
                Handoff::Send(dir, bytes) => self.send_bytes(dir, &bytes),
            }
        }
        n
    }

    /// Copies a whole frame into fresh chunks and puts it on our link `dir`.
    fn send_bytes(&mut self, dir: Dir, bytes: &[u8]) {
        let Some(o) = self.by_dir[usize::from(dir.index())] else {
            self.handoffs.dropped += 1;
            return;
        };
        let need = bytes.len().div_ceil(CHUNK) as u32;
        if self.ports[o].xsk.tx.free() < need || self.umem.free_chunks() < need as usize {
            add(&self.counters(o).tx_ring_full, 1);
            return;
        }
        let mut descs: Vec<XdpDesc> = Vec::new();
        for part in bytes.chunks(CHUNK) {
            let Some(addr) = self.umem.alloc() else {
                // Counted free above, so not expected; give back what was taken.
                for d in &descs {
                    self.umem.release(d.addr);
                }
                add(&self.counters(o).tx_ring_full, 1);
                return;
            };
            self.umem.slice_mut(addr, part.len()).copy_from_slice(part);
            descs.push(XdpDesc {
                addr,
                len: part.len() as u32,
                options: XDP_PKT_CONTD,
            });
        }
        if let Some(last) = descs.last_mut() {
            last.options = 0;
        }
        self.push_tx(o, &descs);
    }

    /// Puts a frame's descriptors on port `o`'s TX ring with the link's MAC addresses.
    fn push_tx(&mut self, o: usize, descs: &[XdpDesc]) {
        tx_path!(self, DirSet::EMPTY).push(o, descs);
    }

    /// Asks the engine for frames while links have room and chunks are free.
    fn transmit(&mut self) -> usize {
        let mut sent = self.drain_transit();
        // Links frames in transit wait for are theirs first.
        let reserved = self.transit.wanted();
        for _ in 0..BATCH * self.ports.len().max(1) as u32 {
            // Asked first, before a chunk is taken and the links' room worked out: after a
            // round trip's answer the engine usually has nothing more, and the kick waits.
            if !self.node.may_transmit() {
                break;
            }
            let now = self.now();
            let node = &mut self.node;
            let mut tx = tx_path!(self, reserved);
            let room = tx.room();
            if !tx.ready(room)
                || !tx.send_one(room, |room, buf, keep| {
                    node.poll_transmit_keeping(now, room, buf, keep)
                })
            {
                break;
            }
            sent += 1;
        }
        for p in &mut self.ports {
            // Copy mode sends only during a kick, and at most the TX budget per kick: keep
            // kicking while descriptors wait, not only when new ones were added (a full ring
            // with nobody kicking stalls the link). Zero-copy kicks when the ring asks.
            let waiting = p.unkicked > 0 || p.xsk.tx.outstanding() > 0;
            if waiting && (!p.xsk.info().zero_copy || p.xsk.tx.needs_wakeup()) {
                let _ = p.xsk.kick_tx();
            }
            p.unkicked = 0;
        }
        sent
    }

    /// Frees the transmit slots whose frames the transport no longer keeps (acknowledged,
    /// or their connection ended).
    fn unhold_released(&mut self) {
        self.node.take_released(&mut self.released);
        for h in self.released.drain(..) {
            self.umem.unhold(h);
        }
    }

    /// Tells the engine how many more frames this poller's rings can take (receiver
    /// pacing): per port, the fill chunks the kernel can receive into before the next
    /// refill ([`FillDepth::can_take`]) and the room left in the RX ring, whichever is
    /// less, in whole frames.
    fn state_rx_room(&mut self) {
        let mut chunks = 0u32;
        let free = self.umem.free_chunks() as u32;
        for (p, depth) in self.ports.iter_mut().zip(&self.fill) {
            let fill = depth.can_take(p.xsk.fill.outstanding(), free);
            let rx_room = p.xsk.rx.size() - p.xsk.rx.available(u32::MAX);
            chunks = chunks.saturating_add(fill.min(rx_room));
        }
        let now = self.now();
        self.node
            .set_rx_room(now, chunks / self.chunks_per_frame.max(1));
    }

    /// Takes back chunks the kernel has finished sending.
    fn complete(&mut self, i: usize) {
        let n = self.ports[i].xsk.comp.available(u32::MAX);
        for k in 0..n {
            let a = self.ports[i].xsk.comp.read(k);
            self.umem.release(a);
        }
        self.ports[i].xsk.comp.release(n);
    }

    /// Keeps port `i`'s fill ring stocked with free chunks.
    fn refill(&mut self, i: usize) {
        let outstanding = self.ports[i].xsk.fill.outstanding();
        let now = self.now().as_nanos();
        let want = self.fill[i]
            .want(outstanding, now)
            .min(self.ports[i].xsk.fill.free());
        if want == 0 {
            return;
        }
        let mut n = 0;
        while n < want {
            let Some(a) = self.umem.alloc() else {
                add(&self.counters(i).fill_starved, 1);
                break;
            };
            self.ports[i].xsk.fill.write(n, a);
            n += 1;
        }
        if n > 0 {
            self.fill[i].posted(n);
            self.ports[i].xsk.fill.submit(n);
            self.ports[i].xsk.wake_rx();
        }
    }

    /// Whether a message the engine lends may go to its consumer at once: nothing of this
    /// poller's waits to be handed on before it (events held for a full inbox, commands for
    /// the first poller), so lending keeps every service's order. The engine checks its
    /// own queue.
    fn may_lend(&self) -> bool {
        self.overflow.is_empty() && self.to_first.is_empty()
    }

    /// Counts a message the engine lent from its frame as delivered and, when no hosted
    /// service read it in place ([`take_lent`]), hands on its copy as `deliver_events`
    /// would have handed it on as the next event.
    fn hand_on_lent(&mut self, copied: Option<(u16, Event)>) {
        self.lent += 1;
        let Some((service, e)) = copied else {
            return;
        };
        self.refresh_inboxes();
        if let Some(Event::Message { data, .. }) = self.dispatch(service, e) {
            self.msg_buf = data;
        }
    }

    /// Takes a fresh copy of the applications' inboxes when they changed.
    fn refresh_inboxes(&mut self) {
        let v = self.shared.services_version.load(Ordering::Acquire);
        if v != self.inbox_version {
            self.inboxes = self.shared.services.lock().clone();
            self.inbox_version = v;
        }
    }

    /// Hands the engine's events to the hosted services and the applications' inboxes.
    fn deliver_events(&mut self) -> usize {
        self.refresh_inboxes();
        let mut n = 0;
        if !self.to_first.is_empty() {
            n += self.retry_to_first();
        }
        // Every waiting event is pushed again: those that find no room count anew.
        for f in &mut self.full_inboxes {
            f.1 = 0;
        }
        for _ in 0..self.overflow.len() {
            let Some((s, e)) = self.overflow.pop_front() else {
                break;
            };
            self.push_event(s, e);
        }
        if !self.full_inboxes.is_empty() {
            self.unmark_caught_up();
        }
        loop {
            let e = match self.node.poll_event_ref() {
                None => break,
                Some(EventRef::Message {
                    src,
                    service,
                    data,
                    reliable,
                }) => {
                    let hosted = owner_of(&self.service_of, &self.services, service).is_some();
                    owned_message(&mut self.msg_buf, hosted, src, service, data, reliable)
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
                        self.msg_buf = data;
                    }
                }
                // Every poller's engine sees the view change; the first tells everyone.
                Event::Unreachable(_) | Event::Reachable(_) if self.shard != 0 => {}
                // Services live with the first poller: a reset another one saw goes there.
                Event::PeerReset { .. } if self.shard != 0 => {
                    self.send_to_first(Command::Broadcast(e));
                }
                Event::Unreachable(_) | Event::Reachable(_) | Event::PeerReset { .. } => {
                    self.broadcast(e);
                }
            }
        }
        n
    }

    /// An event for service `id`: to the hosted service that owns it (which reads it by
    /// reference: the event comes back, for its buffer to be reused), or to its inbox.
    fn dispatch(&mut self, id: u16, e: Event) -> Option<Event> {
        if let Some(i) = owner_of(&self.service_of, &self.services, id) {
            let now = self.now();
            let mut engine = Routed::new(&mut self.node, &self.shared, self.shard);
            self.services[i].on_event(now, &e, &mut engine);
            return Some(e);
        }
        if self.inboxes.contains_key(&id) || self.shard == 0 {
            self.push_event(id, e);
            return None;
        }
        // Hosted applications live with the first poller: hand it the event.
        self.send_to_first(Command::Deliver(id, e));
        None
    }

    /// Hands a command to the first poller, behind any that wait for room in its queue.
    fn send_to_first(&mut self, c: Command) {
        if self.to_first.is_empty() {
            match self.shared.shards[0].commands.push(c) {
                Ok(()) => self.shared.shards[0].wake(),
                Err(c) => self.to_first.push_back(c),
            }
        } else if self.to_first.len() < 1 << 20 {
            self.to_first.push_back(c);
        } else {
            self.overflow_drops += 1;
        }
    }

    /// Retries the commands waiting for room in the first poller's queue, in order.
    fn retry_to_first(&mut self) -> usize {
        let mut n = 0;
        while let Some(c) = self.to_first.pop_front() {
            if let Err(c) = self.shared.shards[0].commands.push(c) {
                self.to_first.push_front(c);
                break;
            }
            n += 1;
        }
        if n > 0 {
            self.shared.shards[0].wake();
        }
        n
    }

    /// An event every service and application hears of.
    fn broadcast(&mut self, e: Event) {
        let now = self.now();
        for svc in &mut self.services {
            let mut engine = Routed::new(&mut self.node, &self.shared, self.shard);
            svc.on_event(now, &e, &mut engine);
        }
        let ids: Vec<u16> = self.inboxes.keys().copied().collect();
        for s in ids {
            self.push_event(s, e.clone());
        }
    }

    /// Lets every hosted service send what is due.
    fn poll_services(&mut self) -> usize {
        let now = self.now();
        let mut n = 0;
        for svc in &mut self.services {
            let mut engine = routed_tx!(self);
            n += svc.poll(now, &mut engine);
        }
        n
    }

    fn push_event(&mut self, service: u16, e: Event) {
        let Some(inbox) = self.inboxes.get(&service) else {
            // No such service here: nobody to deliver to. Counted apart from overflow, so an
            // application that sends to a name not (or no longer) attached can be told why.
            if matches!(e, Event::Message { .. }) {
                self.no_service += 1;
            } else {
                self.overflow_drops += 1;
            }
            return;
        };
        match inbox.queue.push(e) {
            Ok(()) => inbox.notify(),
            Err(e) => {
                // The service has fallen behind: what it has not been sent yet is refused
                // from now on (its senders told); what was accepted waits here.
                let k = match self.full_inboxes.iter().position(|f| f.0 == service) {
                    Some(k) => k,
                    None => {
                        self.full_inboxes.push((service, 0));
                        self.shared.hosted.set_full(service, true);
                        self.full_inboxes.len() - 1
                    }
                };
                if self.overflow.len() < 1 << 20 {
                    self.full_inboxes[k].1 += 1;
                    self.overflow.push_back((service, e));
                } else {
                    self.overflow_drops += 1;
                }
            }
        }
    }

    /// Lifts the full mark of the embedded services that have read half their inbox and have
    /// nothing left waiting here.
    #[cold]
    fn unmark_caught_up(&mut self) {
        let (inboxes, hosted) = (&self.inboxes, &self.shared.hosted);
        self.full_inboxes.retain(|&(s, waiting)| {
            let behind = waiting > 0
                || inboxes
                    .get(&s)
                    .is_some_and(|i| i.queue.len() > i.queue.capacity() / 2);
            if !behind {
                hosted.set_full(s, false);
            }
            behind
        });
    }

    fn publish(&mut self) {
        self.last_snapshot = Some(self.now());
        let t = self.node.transport_stats();
        let ns = self.node.stats();
        let dims = self.node.dims();
        let unreachable = dims
            .coords()
            .filter(|c| !self.node.routes().is_reachable(*c))
            .map(|c| c.to_array())
            .collect();
        let snap = EngineSnapshot {
            transport: TransportStatus::from(
                t,
                self.node.transport().in_flight(),
                self.node.transport().peers() as u64,
            ),
            forwarded: ns.forwarded,
            key_delivered: ns.key_delivered,
            intercepted: ns.intercepted,
            key_no_root: ns.key_no_root,
            xdp: self
                .ports
                .iter()
                .zip(&self.link_idx)
                .map(|(p, i)| (*i, p.xdp.counters()))
                .collect(),
            xsk: self
                .ports
                .iter()
                .zip(&self.link_idx)
                .map(|(p, i)| {
                    let st = p.xsk.statistics().unwrap_or_default();
                    let x = crate::runtime::XskStats {
                        rx_dropped: st.rx_dropped,
                        rx_ring_full: st.rx_ring_full,
                        rx_fill_ring_empty: st.rx_fill_ring_empty_descs,
                        tx_invalid: st.tx_invalid_descs,
                    };
                    (*i, x)
                })
                .collect(),
            unreachable,
            view_version: self.view_version,
            umem_free: self.umem.free_chunks(),
            tx_slots_free: self.umem.free_slots(),
            tx_slots_kept: self.umem.held_slots(),
            inbox_overflow: self.overflow_drops,
            no_service: self.no_service,
            handoffs: self.handoffs.passed,
            handoff_dropped: self.handoffs.dropped,
            // The process's, not a poller's: filled in by the status.
            commands_dropped: 0,
            pollers: 1,
            rtt: self
                .node
                .transport()
                .rtts(1024)
                .into_iter()
                .map(|(p, d)| crate::runtime::PeerRtt {
                    peer: p.to_string(),
                    srtt_us: d.as_secs_f64() * 1e6,
                })
                .collect(),
            routing: self.routing_status(),
            view_changed_unix_ms: self.view_changed_unix_ms,
            carrier_down: self.carrier_down.iter().map(|d| d.to_string()).collect(),
        };
        *self.me().snapshot.lock() = snap;
    }

    fn routing_status(&self) -> RoutingStatus {
        let s = self.node.source_stats();
        let src = self.node.source_routing();
        let mode = match (src.bsr(), src.is_enabled()) {
            (None, _) => "off",
            (Some(_), false) => "next-hop",
            (Some(_), true) => "source",
        };
        let flows = src
            .bsr()
            .map(|b| {
                b.routes()
                    .take(256)
                    .map(|(dst, r)| FlowRoute {
                        dst: dst.to_string(),
                        path: r.dirs().map(|d| d.name()).collect::<Vec<_>>().join(" "),
                        avail_mbps: b
                            .paths(dst)
                            .into_iter()
                            .find(|(p, _)| *p == r)
                            .and_then(|(_, a)| a),
                        paths: b
                            .paths(dst)
                            .into_iter()
                            .map(|(p, a)| {
                                let names: Vec<&str> = p.dirs().map(|d| d.name()).collect();
                                (names.join(" "), a)
                            })
                            .collect(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        RoutingStatus {
            mode,
            services: src.services().map(<[u16]>::to_vec).unwrap_or_default(),
            routed_sent: s.routed_sent,
            forwarded: s.forwarded,
            bad_route: s.bad_route,
            path_failed: s.path_failed,
            failures_sent: s.failures_sent,
            replies_sent: s.replies_sent,
            probes: s.bsr.probes,
            replies: s.bsr.replies,
            failures: s.bsr.failures,
            switches: s.bsr.switches,
            failovers: s.bsr.failovers,
            last_failover_unix_ms: s.bsr.last_failover.map_or(0, |t| self.unix_ms_of(t)),
            flows,
        }
    }
}

/// The Unix time now, ms.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Offers lent message `m` to the hosted service that owns its id, to read where it lies
/// (`Service::on_message_ref`); when no hosted service takes it so, copies it
/// ([`owned_message`]: its one copy on the way in, straight from the frame into the
/// buffer its consumer reads) and returns that as the event to hand on, with its service. A free function:
/// `m` borrows the poller's UMEM or scratch buffer while the services and the engine are
/// used.
fn take_lent(
    (service_of, services): (&HashMap<u16, usize>, &mut [Box<dyn Service>]),
    engine: &mut Routed<'_>,
    now: Time,
    m: &Lent<'_>,
    buf: &mut Vec<u8>,
) -> Option<(u16, Event)> {
    let owner = owner_of(service_of, services, m.service);
    if let Some(i) = owner {
        if services[i].on_message_ref(now, m, engine) {
            return None;
        }
    }
    let e = owned_message(buf, owner.is_some(), m.src, m.service, m.data, m.reliable);
    Some((m.service, e))
}

/// A received message as the owned event the poller hands on: copied into `buf` when a
/// hosted service will read it (it comes back after, and the buffer is reused), else into
/// a buffer of its own (an application's inbox keeps it).
fn owned_message(
    buf: &mut Vec<u8>,
    hosted: bool,
    src: Coord,
    service: u16,
    data: &[u8],
    reliable: bool,
) -> Event {
    let data = if hosted {
        let mut b = std::mem::take(buf);
        b.clear();
        b.extend_from_slice(data);
        b
    } else {
        data.to_vec()
    };
    Event::Message {
        src,
        service,
        data,
        reliable,
        key: None,
    }
}

/// The hosted service that owns service id `id`, if any.
fn owner_of(
    service_of: &HashMap<u16, usize>,
    services: &[Box<dyn Service>],
    id: u16,
) -> Option<usize> {
    service_of
        .get(&id)
        .copied()
        .or_else(|| services.iter().position(|s| s.owns(id)))
}
