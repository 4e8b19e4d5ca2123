//! Remote memory (MultiEdge's one-sided operations, CLAN's apertures and tripwires, libRIPC's
//! untrusting partners): applications and embedding programs register regions of their
//! memory, hand out capabilities for them, and read and write each other's regions without
//! the remote program taking part.
//!
//! - [`memory`]: what backs a region (an application's pool, or an embedding program's heap).
//! - [`table`]: regions, capabilities, tripwires, and the checks of every access.
//! - [`wire`]: the messages between torusds (service 8).
//! - this module: the shared state ([`Rmem`]: the table, operations submitted, events for
//!   owners), the [`RmemPlacer`] that writes arriving bytes straight from their frame into
//!   the region, and the [`RmemService`] that runs the protocol in the first poller.
//!
//! A write is cut into frame-sized messages (reliable, fenced as asked); at the target, each
//! lands in place from its frame when the transport may deliver it (one copy), and the
//! target answers the whole operation with one result: done, or why not. A read asks the
//! target, which answers with frame-sized messages landing in place in the initiator's
//! region. Every operation ends in exactly one completion for its owner by a deadline: done,
//! refused with the target's reason, the peer failed, or timed out.

pub mod embedded;
pub mod memory;
pub mod table;
pub mod wire;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::Serialize;
use torusnet_client::channel::unpack_coord;
use torusnet_client::rmem::{Capability, Status};
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::service::{Engine, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::{Fences, Placer, SendError};

use self::table::Table;
use self::wire::Msg;

/// Service id of remote memory.
pub const RMEM: u16 = 8;
/// An operation ends by then.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest read.
pub const MAX_READ: u64 = 64 << 20;

/// An operation for the remote-memory service.
#[derive(Debug)]
pub enum RmCommand {
    /// Write `data` at `offset` of the capability.
    Write {
        /// Who asks (its completions go to it).
        owner: u16,
        /// Its name for the operation.
        tag: u64,
        /// The capability.
        cap: Capability,
        /// Offset in the capability.
        offset: u64,
        /// The bytes, laid out as the messages that carry them (`Rmem::chunk` each).
        frames: wire::WriteFrames,
        /// Tell the region's owner when it landed.
        notify: bool,
        /// Fences.
        fences: Fences,
    },
    /// Read `len` bytes at `offset` of the capability into the owner's region `region` at
    /// `local_offset`.
    Read {
        /// Who asks.
        owner: u16,
        /// Its name for the operation.
        tag: u64,
        /// The capability.
        cap: Capability,
        /// Offset in the capability.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The local region.
        region: u32,
        /// Where in it.
        local_offset: u64,
        /// Fences.
        fences: Fences,
    },
}

/// What an owner learns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RmEvent {
    /// Its operation `tag` ended.
    Done {
        /// The operation.
        tag: u64,
        /// Whether it succeeded, and if not why.
        status: Status,
        /// Bytes moved.
        bytes: u64,
    },
    /// A write from `src` touched tripwire `id` of region `region`.
    Tripwire {
        /// The tripwire.
        id: u64,
        /// The region.
        region: u32,
        /// The write's offset.
        offset: u64,
        /// Its length.
        len: u64,
        /// Who wrote.
        src: Coord,
    },
    /// A write asking for notification landed whole.
    Written {
        /// The region.
        region: u32,
        /// The byte offset in the region where the write starts.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Who wrote.
        src: Coord,
    },
}

/// Counters of remote memory on one server.
#[derive(Debug, Default)]
pub struct RmCounters {
    writes: AtomicU64,
    reads: AtomicU64,
    done: AtomicU64,
    failed: AtomicU64,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    placed: AtomicU64,
    unplaced: AtomicU64,
    unclaimed: AtomicU64,
}

/// A snapshot of the counters, for status.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RmStats {
    /// Regions registered here.
    pub regions: usize,
    /// Capabilities live here.
    pub capabilities: usize,
    /// Writes started here.
    pub writes: u64,
    /// Reads started here.
    pub reads: u64,
    /// Operations started here that succeeded.
    pub done: u64,
    /// Operations started here that failed.
    pub failed: u64,
    /// Bytes written into regions here by others.
    pub bytes_written: u64,
    /// Bytes read from regions here by others.
    pub bytes_read: u64,
    /// Frames whose bytes landed straight from the frame.
    pub placed: u64,
    /// Messages held by a fence first (landed from a copy).
    pub unplaced: u64,
    /// Events dropped because their owner had gone.
    pub unclaimed: u64,
    /// Accesses refused here, by reason.
    pub refused: HashMap<&'static str, u64>,
}

/// Events waiting for their owners, and the owners there are: an event for an owner that
/// has gone (an operation that ended after its application exited) has nobody to wait for,
/// and a later application given the same id must not receive it.
#[derive(Debug, Default)]
struct EventQueues {
    by_owner: HashMap<u16, VecDeque<RmEvent>>,
    owners: std::collections::HashSet<u16>,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Remote memory of one server, shared by the service, the placers of every poller, the
/// application host and embedding programs.
pub struct Rmem {
    /// Regions and capabilities.
    pub table: Mutex<Table>,
    commands: Mutex<VecDeque<RmCommand>>,
    events: Mutex<EventQueues>,
    ready: Condvar,
    /// Some owner has events waiting.
    pub pending: AtomicBool,
    /// Seals the records a placer hands the service (so no peer can forge one).
    secret: u64,
    waker: Box<dyn Fn() + Send + Sync>,
    /// Counters.
    pub counters: RmCounters,
    /// Bytes of a write each message carries (a frame's payload less the write's header).
    pub chunk: usize,
}

impl std::fmt::Debug for Rmem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rmem")
            .field("table", &*self.table.lock())
            .finish_non_exhaustive()
    }
}

impl Rmem {
    /// The remote memory of server `server` (packed), whose frames carry `frame_payload`
    /// bytes; `waker` wakes the poller of the service when an operation is submitted.
    pub fn new(server: u64, frame_payload: usize, waker: Box<dyn Fn() + Send + Sync>) -> Rmem {
        Rmem {
            chunk: frame_payload.saturating_sub(wire::WRITE_HEADER).max(64),
            table: Mutex::new(Table::new(server, Box::new(table::random_u64))),
            commands: Mutex::new(VecDeque::new()),
            events: Mutex::new(EventQueues::default()),
            ready: Condvar::new(),
            pending: AtomicBool::new(false),
            secret: table::random_u64() | 1,
            waker,
            counters: RmCounters::default(),
        }
    }

    /// Submits an operation.
    pub fn submit(&self, c: RmCommand) {
        match &c {
            RmCommand::Write { .. } => add(&self.counters.writes, 1),
            RmCommand::Read { .. } => add(&self.counters.reads, 1),
        }
        self.commands.lock().push_back(c);
        (self.waker)();
    }

    /// Queues an event for `owner`.
    pub fn push_event(&self, owner: u16, e: RmEvent) {
        if let RmEvent::Done { status, .. } = e {
            if status == Status::Ok {
                add(&self.counters.done, 1);
            } else {
                add(&self.counters.failed, 1);
            }
        }
        let mut ev = self.events.lock();
        if !ev.owners.contains(&owner) {
            add(&self.counters.unclaimed, 1);
            return;
        }
        let q = ev.by_owner.entry(owner).or_default();
        // An owner that never reads keeps a bounded queue (the oldest events go).
        if q.len() >= 65536 {
            q.pop_front();
        }
        q.push_back(e);
        self.pending.store(true, Ordering::Release);
        self.ready.notify_all();
    }

    /// Takes `owner`'s events.
    pub fn take_events(&self, owner: u16) -> Vec<RmEvent> {
        let mut ev = self.events.lock();
        let out = ev
            .by_owner
            .remove(&owner)
            .map(Vec::from)
            .unwrap_or_default();
        if ev.by_owner.is_empty() {
            self.pending.store(false, Ordering::Release);
        }
        out
    }

    /// Waits up to `timeout` for an event of `owner` (an embedding program's event queue).
    pub fn wait_event(&self, owner: u16, timeout: Duration) -> Option<RmEvent> {
        let deadline = Instant::now() + timeout;
        let mut ev = self.events.lock();
        loop {
            if let Some(q) = ev.by_owner.get_mut(&owner) {
                if let Some(e) = q.pop_front() {
                    return Some(e);
                }
            }
            if self.ready.wait_until(&mut ev, deadline).timed_out() {
                return None;
            }
        }
    }

    /// Forgets `owner` (it exited): its regions and capabilities, its events.
    pub fn remove_owner(&self, owner: u16) {
        self.table.lock().remove_owner(owner);
        let mut ev = self.events.lock();
        ev.by_owner.remove(&owner);
        ev.owners.remove(&owner);
        // With the last owner's events gone nothing is pending: a flag left set kept an
        // idle poller from ever sleeping once the applications that owned regions had exited.
        if ev.by_owner.is_empty() {
            self.pending.store(false, Ordering::Release);
        }
    }

    /// `owner` is here (an application attached, an embedding program took a handle): its
    /// events are kept for it until it takes them or goes.
    pub fn add_owner(&self, owner: u16) {
        self.events.lock().owners.insert(owner);
    }

    /// Whether any of `owners` has events waiting (a poller asks about the applications it
    /// serves; an embedding program's events wait for it to read them, without a poller).
    pub fn has_events_for(&self, owners: impl IntoIterator<Item = u16>) -> bool {
        if !self.pending.load(Ordering::Acquire) {
            return false;
        }
        let ev = self.events.lock();
        owners
            .into_iter()
            .any(|o| ev.by_owner.get(&o).is_some_and(|q| !q.is_empty()))
    }

    /// The counters.
    pub fn stats(&self) -> RmStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let t = self.table.lock();
        let (regions, capabilities) = t.sizes();
        let refused = (0..10u8)
            .filter(|s| t.refused[usize::from(*s)] > 0)
            .map(|s| (Status::from_code(s).name(), t.refused[usize::from(s)]))
            .collect();
        RmStats {
            regions,
            capabilities,
            writes: g(&c.writes),
            reads: g(&c.reads),
            done: g(&c.done),
            failed: g(&c.failed),
            bytes_written: g(&c.bytes_written),
            bytes_read: g(&c.bytes_read),
            placed: g(&c.placed),
            unplaced: g(&c.unplaced),
            unclaimed: g(&c.unclaimed),
            refused,
        }
    }

    /// Applies a write or read-data message (from its frame, or from a copy when a fence
    /// held it) and returns the record for the service.
    fn land(&self, src: Coord, m: &Msg<'_>) -> Option<Vec<u8>> {
        match *m {
            Msg::Write {
                op,
                cookie,
                owner,
                region,
                offset,
                pos: _,
                op_len,
                notify,
                data,
            } => {
                let r =
                    self.table
                        .lock()
                        .write(cookie, owner, region, offset, data, Instant::now());
                Some(match r {
                    Ok(l) => {
                        add(&self.counters.bytes_written, data.len() as u64);
                        Msg::Landed {
                            secret: self.secret,
                            op,
                            owner,
                            region,
                            offset,
                            len: data.len() as u64,
                            op_len,
                            notify,
                            tripwires: l.tripwires,
                        }
                        .encode()
                    }
                    Err(status) => Msg::Refused {
                        secret: self.secret,
                        op,
                        status,
                    }
                    .encode(),
                })
            }
            Msg::ReadData { op, pos, data } => {
                let r = self.table.lock().land_read(op, src, pos, data);
                let (got, status) = match r {
                    Ok(g) => (g, Status::Ok),
                    Err(s) => (0, s),
                };
                Some(
                    Msg::ReadLanded {
                        secret: self.secret,
                        op,
                        got,
                        status,
                    }
                    .encode(),
                )
            }
            _ => None,
        }
    }
}

/// Lands remote-memory bytes straight from their frame (registered with every poller's
/// transport).
pub struct RmemPlacer(pub Arc<Rmem>);

impl Placer for RmemPlacer {
    fn place(&mut self, _now: Time, src: Coord, data: &[u8]) -> Option<Vec<u8>> {
        match Msg::decode(data) {
            Some(m @ (Msg::Write { .. } | Msg::ReadData { .. })) => {
                add(&self.0.counters.placed, 1);
                self.0.land(src, &m)
            }
            // Anything else goes to the service as it came.
            _ => Some(data.to_vec()),
        }
    }
}

#[derive(Debug)]
enum Kind {
    Write,
    Read { len: u64 },
}

#[derive(Debug)]
struct Op {
    owner: u16,
    tag: u64,
    peer: Coord,
    kind: Kind,
    deadline: Time,
}

/// A write arriving here: bytes landed so far.
#[derive(Debug)]
struct Arriving {
    landed: u64,
    start: u64,
    at: Time,
}

/// A message waiting for the transport: its own bytes, or one message of a write's
/// [`wire::WriteFrames`] (shared by all of them).
enum Out {
    Owned(Vec<u8>),
    Part(Arc<Vec<u8>>, std::ops::Range<usize>),
}

impl Out {
    fn bytes(&self) -> &[u8] {
        match self {
            Out::Owned(v) => v,
            Out::Part(b, r) => b.get(r.clone()).unwrap_or(&[]),
        }
    }
}

/// The remote-memory service of one server (in the first poller).
pub struct RmemService {
    rm: Arc<Rmem>,
    chunk: usize,
    next_op: u64,
    ops: HashMap<u64, Op>,
    arriving: HashMap<(Coord, u64), Arriving>,
    /// Operations arriving here already refused (their later messages are ignored).
    refused: HashMap<(Coord, u64), Time>,
    outbox: VecDeque<(Coord, Out, MsgOptions)>,
    scan_at: Time,
}

impl std::fmt::Debug for RmemService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RmemService")
            .field("ops", &self.ops.len())
            .finish_non_exhaustive()
    }
}

fn coord(packed: u64) -> Coord {
    let (x, y, z) = unpack_coord(packed);
    Coord::new(x, y, z)
}

fn rel(tag: u64, fences: Fences) -> MsgOptions {
    MsgOptions {
        reliable: true,
        fences,
        tag,
        ..MsgOptions::default()
    }
}

impl RmemService {
    /// The service of `rm` (writes in messages of `rm.chunk` bytes).
    pub fn new(rm: Arc<Rmem>) -> RmemService {
        RmemService {
            chunk: rm.chunk,
            rm,
            next_op: table::random_u64() >> 16 | 1,
            ops: HashMap::new(),
            arriving: HashMap::new(),
            refused: HashMap::new(),
            outbox: VecDeque::new(),
            scan_at: Time::ZERO,
        }
    }

    fn finish(&mut self, op: u64, status: Status, bytes: u64) {
        if let Some(o) = self.ops.remove(&op) {
            if matches!(o.kind, Kind::Read { .. }) {
                self.rm.table.lock().reads.remove(&op);
            }
            self.rm.push_event(
                o.owner,
                RmEvent::Done {
                    tag: o.tag,
                    status,
                    bytes: if status == Status::Ok { bytes } else { 0 },
                },
            );
        }
    }

    fn send(&mut self, to: Coord, data: Vec<u8>, opts: MsgOptions) {
        self.outbox.push_back((to, Out::Owned(data), opts));
    }

    /// Ends an operation before anything was sent for it (its arguments are bad, or there
    /// is nothing to do), with `status` and no bytes.
    fn end_at_once(&self, owner: u16, tag: u64, status: Status) {
        self.rm.push_event(
            owner,
            RmEvent::Done {
                tag,
                status,
                bytes: 0,
            },
        );
    }

    fn start(&mut self, now: Time, node: &dyn Engine, c: RmCommand) {
        let op = self.next_op;
        self.next_op = self.next_op.wrapping_add(1).max(1);
        match c {
            RmCommand::Write {
                owner,
                tag,
                cap,
                offset,
                frames,
                notify,
                fences,
            } => {
                let peer = coord(cap.server);
                let Some(base) = cap.offset.checked_add(offset) else {
                    self.end_at_once(owner, tag, Status::Invalid);
                    return;
                };
                if !node.dims().contains(peer) {
                    self.end_at_once(owner, tag, Status::Invalid);
                    return;
                }
                self.ops.insert(
                    op,
                    Op {
                        owner,
                        tag,
                        peer,
                        kind: Kind::Write,
                        deadline: now + OP_TIMEOUT,
                    },
                );
                let (buf, ranges) =
                    frames.seal(op, cap.cookie, cap.owner, cap.region, base, notify);
                let buf = Arc::new(buf);
                for r in ranges {
                    self.outbox
                        .push_back((peer, Out::Part(buf.clone(), r), rel(op, fences)));
                }
            }
            RmCommand::Read {
                owner,
                tag,
                cap,
                offset,
                len,
                region,
                local_offset,
                fences,
            } => {
                let peer = coord(cap.server);
                let ok = len <= MAX_READ
                    && node.dims().contains(peer)
                    && self.rm.table.lock().has(owner, region, local_offset, len);
                let Some(base) = cap.offset.checked_add(offset).filter(|_| ok) else {
                    self.end_at_once(owner, tag, Status::Invalid);
                    return;
                };
                if len == 0 {
                    self.end_at_once(owner, tag, Status::Ok);
                    return;
                }
                self.rm.table.lock().reads.insert(
                    op,
                    table::ReadDest {
                        src: peer,
                        owner,
                        region,
                        offset: local_offset,
                        len,
                        got: 0,
                    },
                );
                self.ops.insert(
                    op,
                    Op {
                        owner,
                        tag,
                        peer,
                        kind: Kind::Read { len },
                        deadline: now + OP_TIMEOUT,
                    },
                );
                let m = Msg::Read {
                    op,
                    cookie: cap.cookie,
                    owner: cap.owner,
                    region: cap.region,
                    offset: base,
                    len,
                };
                self.send(peer, m.encode(), rel(op, fences));
            }
        }
    }

    fn record(&mut self, now: Time, src: Coord, rec: Msg<'_>) {
        match rec {
            Msg::Landed {
                op,
                owner,
                region,
                offset,
                len,
                op_len,
                notify,
                tripwires,
                ..
            } => {
                if self.refused.contains_key(&(src, op)) {
                    return;
                }
                for id in tripwires {
                    self.rm.push_event(
                        owner,
                        RmEvent::Tripwire {
                            id,
                            region,
                            offset,
                            len,
                            src,
                        },
                    );
                }
                let a = self.arriving.entry((src, op)).or_insert(Arriving {
                    landed: 0,
                    start: offset,
                    at: now,
                });
                a.landed += len;
                a.start = a.start.min(offset);
                if a.landed >= op_len {
                    let start = a.start;
                    self.arriving.remove(&(src, op));
                    if notify {
                        self.rm.push_event(
                            owner,
                            RmEvent::Written {
                                region,
                                offset: start,
                                len: op_len,
                                src,
                            },
                        );
                    }
                    let m = Msg::Result {
                        op,
                        status: Status::Ok,
                        bytes: op_len,
                    };
                    self.send(src, m.encode(), rel(0, Fences::default()));
                }
            }
            Msg::Refused { op, status, .. } => {
                self.arriving.remove(&(src, op));
                if self.refused.insert((src, op), now).is_none() {
                    let m = Msg::Result {
                        op,
                        status,
                        bytes: 0,
                    };
                    self.send(src, m.encode(), rel(0, Fences::default()));
                }
            }
            Msg::ReadLanded {
                op, got, status, ..
            } => {
                let Some(o) = self.ops.get(&op) else { return };
                if o.peer != src {
                    return;
                }
                match (status, &o.kind) {
                    (Status::Ok, Kind::Read { len }) if got >= *len => {
                        let len = *len;
                        self.finish(op, Status::Ok, len);
                    }
                    (Status::Ok, _) => {}
                    (s, _) => self.finish(op, s, 0),
                }
            }
            _ => {}
        }
    }

    fn message(&mut self, now: Time, src: Coord, data: &[u8]) {
        let Some(m) = Msg::decode(data) else { return };
        match m {
            Msg::Write { .. } | Msg::ReadData { .. } => {
                // Held by a fence: it lands from this copy.
                add(&self.rm.counters.unplaced, 1);
                if let Some(rec) = self.rm.land(src, &m) {
                    if let Some(r) = Msg::decode(&rec) {
                        self.record(now, src, r);
                    }
                }
            }
            Msg::Landed { secret, .. }
            | Msg::Refused { secret, .. }
            | Msg::ReadLanded { secret, .. } => {
                // Only this process's placers make these.
                if secret == self.rm.secret {
                    self.record(now, src, m);
                }
            }
            Msg::Read {
                op,
                cookie,
                owner,
                region,
                offset,
                len,
            } => {
                if len > MAX_READ {
                    let m = Msg::Result {
                        op,
                        status: Status::Invalid,
                        bytes: 0,
                    };
                    self.send(src, m.encode(), rel(0, Fences::default()));
                    return;
                }
                // Checked once, whole (all or nothing), and read under the same lock, each
                // frame-sized piece straight into its message; sent once the lock is gone.
                let chunk = (self.chunk + wire::WRITE_HEADER - wire::READ_DATA_HEADER) as u64;
                let pieces = {
                    let mut t = self.rm.table.lock();
                    t.check_read(cookie, owner, region, offset, len, Instant::now())
                        .and_then(|()| {
                            let mut out = Vec::new();
                            let mut pos = 0;
                            while pos < len {
                                let n = (len - pos).min(chunk);
                                let mut m = wire::read_data_message(op, pos, n as usize);
                                let at = offset.saturating_add(pos);
                                t.copy_out(owner, region, at, &mut m[wire::READ_DATA_HEADER..])?;
                                out.push(m);
                                pos += n;
                            }
                            Ok(out)
                        })
                };
                match pieces {
                    Ok(pieces) => {
                        add(&self.rm.counters.bytes_read, len);
                        for m in pieces {
                            self.send(src, m, rel(0, Fences::default()));
                        }
                    }
                    Err(status) => {
                        let m = Msg::Result {
                            op,
                            status,
                            bytes: 0,
                        };
                        self.send(src, m.encode(), rel(0, Fences::default()));
                    }
                }
            }
            Msg::Result { op, status, bytes } => {
                let Some(o) = self.ops.get(&op) else { return };
                if o.peer != src {
                    return;
                }
                // A read's success is its bytes landing; its Result only says why not.
                if status != Status::Ok || matches!(o.kind, Kind::Write) {
                    self.finish(op, status, bytes);
                }
            }
        }
    }

    /// Fails every operation waiting on `peer`.
    fn peer_gone(&mut self, peer: Coord) {
        let gone: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, o)| o.peer == peer)
            .map(|(k, _)| *k)
            .collect();
        for op in gone {
            self.finish(op, Status::PeerFailed, 0);
        }
        self.arriving.retain(|(s, _), _| *s != peer);
    }
}

impl Service for RmemService {
    fn name(&self) -> &'static str {
        "rmem"
    }

    fn ids(&self) -> &[u16] {
        &[RMEM]
    }

    fn on_event(&mut self, now: Time, event: &Event, _node: &mut dyn Engine) {
        match event {
            Event::Message {
                src,
                service: RMEM,
                data,
                reliable: true,
                ..
            } => self.message(now, *src, data),
            Event::Failed {
                service: RMEM,
                tags,
                ..
            } => {
                for &op in tags {
                    if op != 0 {
                        self.finish(op, Status::PeerFailed, 0);
                    }
                }
            }
            Event::Unreachable(peer) => self.peer_gone(*peer),
            Event::PeerReset { peer, .. } => self.peer_gone(*peer),
            _ => {}
        }
    }

    fn poll(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        let mut work = 0;
        let cmds: Vec<RmCommand> = {
            let mut q = self.rm.commands.lock();
            let n = q.len().min(1024);
            q.drain(..n).collect()
        };
        for c in cmds {
            self.start(now, node, c);
            work += 1;
        }
        while let Some((to, data, opts)) = self.outbox.front() {
            match node.send(now, Target::Server(*to), RMEM, data.bytes(), *opts) {
                Ok(()) => {}
                Err(SendError::WouldBlock) => break,
                Err(_) => {
                    let op = opts.tag;
                    if op != 0 {
                        self.finish(op, Status::PeerFailed, 0);
                    }
                }
            }
            self.outbox.pop_front();
            work += 1;
        }
        if now >= self.scan_at {
            self.scan_at = now + Duration::from_millis(100);
            let late: Vec<u64> = self
                .ops
                .iter()
                .filter(|(_, o)| o.deadline <= now)
                .map(|(k, _)| *k)
                .collect();
            for op in late {
                self.finish(op, Status::Timeout, 0);
                work += 1;
            }
            let old = now
                .as_nanos()
                .saturating_sub(OP_TIMEOUT.as_nanos() as u64 * 3);
            self.refused.retain(|_, t| t.as_nanos() >= old);
            self.arriving.retain(|_, a| a.at.as_nanos() >= old);
        }
        work
    }

    fn may_sleep(&mut self) -> bool {
        // Checked after the poller announced its sleep: a submission after this wakes it.
        self.outbox.is_empty() && self.rm.commands.lock().is_empty()
    }

    fn poll_timeout(&self) -> Option<Time> {
        if !self.outbox.is_empty() || !self.rm.commands.lock().is_empty() {
            return Some(Time::ZERO);
        }
        (!self.ops.is_empty()).then_some(self.scan_at)
    }
}

#[cfg(test)]
mod pending_tests {
    use super::*;

    fn rm() -> Rmem {
        Rmem::new(1, 8000, Box::new(|| {}))
    }

    fn done(tag: u64) -> RmEvent {
        RmEvent::Done {
            tag,
            status: Status::Ok,
            bytes: 0,
        }
    }

    #[test]
    fn removing_the_last_owner_with_events_clears_pending() {
        let r = rm();
        r.add_owner(5);
        r.push_event(5, done(1));
        assert!(r.pending.load(Ordering::Acquire));
        assert!(r.has_events_for([5]));
        r.remove_owner(5);
        assert!(!r.pending.load(Ordering::Acquire));
        assert!(!r.has_events_for([5]));
    }

    #[test]
    fn events_for_an_owner_that_has_gone_are_dropped_and_counted() {
        let r = rm();
        r.add_owner(7);
        r.remove_owner(7);
        // An operation of owner 7 ended after owner 7 was gone: nobody waits for its end,
        // and a later owner 7 must not receive it.
        r.push_event(7, done(2));
        assert!(!r.pending.load(Ordering::Acquire));
        assert_eq!(r.stats().unclaimed, 1);
        r.add_owner(7);
        assert!(r.take_events(7).is_empty());
        r.add_owner(3);
        r.push_event(3, done(3));
        assert!(r.has_events_for([3, 4]) && !r.has_events_for([4]));
        assert_eq!(r.take_events(3).len(), 1);
        assert!(!r.has_events_for([3, 4]));
    }
}
