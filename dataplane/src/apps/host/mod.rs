//! The host of attached applications: the torusd end of their channels, run as a service in
//! the first poller, so an application's message goes from its ring to the engine in the
//! same loop that moves frames, and the engine's events for it go straight into its ring.
//!
//! Per turn, for each application: adopt new channels; read its submissions (send, post or
//! cancel a return buffer), copying each entry and its bytes out of the shared region before
//! looking at them; hand complete messages to the engine (or to the poller that owns the
//! peer's connection), stamped with the application's own service id; write waiting events
//! into its completion ring; signal its eventfd if it sleeps. A message into a return
//! buffer is written into the application's pool directly, checked against the posting
//! (id, cookie, size); without a posting it is refused and its sender told.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use torusnet_client::channel::{
    byte_ring_alloc, cflag, cq, dest, kind, off, op, pack_coord, reason, sflag, unpack_coord, Cqe,
    Region, Sqe, APP_HEADER, INTO_BUFFER_HEADER,
};
use torusnet_client::sys::{self, Mapping};
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::service::{Engine, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::{FailReason, Fences, Lent, SendError, KEYED, NOTICES};

use crate::shared::{AppInfo, NewApp, Shared};

mod notices;
mod on_path;
mod untrusted;

use notices::OwedNotices;
pub use untrusted::check_untrusted;

/// Submissions read per application per turn (so one cannot starve the others).
const BATCH: usize = 1024;
/// Events an application may leave unread beyond its ring before it counts as full: from
/// then on every transport refuses reliable messages for it (their senders are told,
/// `ReceiverFull`) and short ones are dropped here, until it has read half of them.
const BACKLOG_EVENTS: usize = 65536;
/// Bytes of those.
const BACKLOG_BYTES: usize = 64 << 20;
/// How far beyond the mark events already accepted may still queue (those in frames being
/// delivered as the mark was crossed, acknowledgements, failures) before they are dropped
/// (counted and reported to the application).
const BACKLOG_HARD: usize = 2;
/// Return buffers one application may have posted.
const MAX_POSTED: usize = 4096;
/// The largest message an application may send.
const MAX_MESSAGE: usize = 64 << 20;
/// "Return buffer missing" notices one application may owe while the transport has no room.
const MAX_OWED_NOTICES: usize = 1024;

struct Posted {
    off: u64,
    len: u32,
    cookie: u64,
}

/// A message an application submitted, ready for the engine.
struct AppMessage {
    target: Target,
    service: u16,
    data: Vec<u8>,
    opts: MsgOptions,
}

pub(super) struct App {
    pub(super) info: Arc<AppInfo>,
    /// Its service ids as last indexed (the attach name's first, then added names').
    pub(super) ids: Vec<u16>,
    pub(super) region: Region,
    /// The channel's mapping (shared with the regions registered in its pool).
    pub(super) map: Arc<Mapping>,
    efd: OwnedFd,
    sq_head: u32,
    cq_tail: u32,
    rxd_tail: u64,
    /// A message arriving in segments: its first entry and the bytes so far.
    assembling: Option<(Sqe, Vec<u8>)>,
    /// A remote-memory submission arriving in segments.
    pub(super) rm_assembling: Option<super::rmem_ops::Gathering>,
    /// A complete message the engine could not take yet.
    blocked: Option<AppMessage>,
    /// Notices it owes senders, waiting for room in the transport.
    owed: OwedNotices,
    /// Events waiting for room in the channel (message segments one by one).
    pub(super) backlog: VecDeque<(Cqe, Vec<u8>)>,
    backlog_bytes: usize,
    /// Messages dropped and not yet reported to the application.
    dropped_unreported: u64,
    /// Its backlog crossed the mark: the transports refuse its reliable messages.
    full: bool,
    posted: HashMap<u32, Posted>,
    /// Completions written this turn (signal the application if it sleeps).
    produced: bool,
    /// The TX data consumed so far (published at the end of each batch).
    pub(super) txd_done: u64,
    /// Frames held for its verdict (it intercepts its service on the path), by id.
    held: HashMap<u64, on_path::Held>,
    next_held: u64,
}

impl App {
    /// Writes one event (its bytes into the RX data ring) into the channel; false, and
    /// nothing written, when the channel has no room for it now.
    pub(super) fn write_event(&mut self, mut e: Cqe, data: &[u8]) -> bool {
        let r = self.region;
        let cq_head = r.u32(off::CQ_HEAD).load(Ordering::Acquire);
        if self.cq_tail.wrapping_sub(cq_head) >= r.geometry().cq_entries {
            return false;
        }
        if !data.is_empty() {
            let (_, rxd_size) = r.rxd();
            // The application's head is untrusted: never beyond what we wrote.
            let head = r
                .u64(off::RXD_HEAD)
                .load(Ordering::Acquire)
                .min(self.rxd_tail);
            let Some((pos, tail)) =
                byte_ring_alloc(head, self.rxd_tail, rxd_size, data.len() as u64)
            else {
                return false;
            };
            if !r.copy_in(r.rxd(), pos % rxd_size, data) {
                return false;
            }
            self.rxd_tail = tail;
            e.data_pos = pos;
            e.data_len = data.len() as u32;
            r.u64(off::RXD_TAIL).store(tail, Ordering::Release);
        }
        r.write_cqe(self.cq_tail, &e);
        self.cq_tail = self.cq_tail.wrapping_add(1);
        r.u32(off::CQ_TAIL).store(self.cq_tail, Ordering::Release);
        self.produced = true;
        true
    }
}

/// The host of all attached applications (lives in the first poller).
pub struct AppsHost {
    pub(super) shared: Arc<Shared>,
    pub(super) apps: Vec<App>,
    by_service: HashMap<u16, usize>,
    buf: Vec<u8>,
    /// Message buffers to reuse: a message the engine takes at once gives its buffer back,
    /// so the steady path allocates nothing per message.
    spare: Vec<Vec<u8>>,
    /// Applications' multicasts waiting for their reports.
    pub(super) running: Vec<super::multicast::Running>,
}

/// Adds to a counter only the host writes (a plain store: no locked instruction).
pub(super) fn bump(c: &std::sync::atomic::AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

impl AppsHost {
    /// A host for the applications that attach to this torusd.
    pub fn new(shared: Arc<Shared>) -> AppsHost {
        AppsHost {
            shared,
            apps: Vec::new(),
            by_service: HashMap::new(),
            buf: Vec::new(),
            spare: Vec::new(),
            running: Vec::new(),
        }
    }

    /// The application that owns service id `id`, if one does.
    pub(super) fn owner_of(&self, id: u16) -> Option<usize> {
        self.by_service.get(&id).copied()
    }

    fn reindex(&mut self) {
        let old = std::mem::take(&mut self.by_service);
        for a in &mut self.apps {
            let added = a.info.added.lock();
            a.ids = std::iter::once(a.info.service)
                .chain(added.iter().map(|(_, id)| *id))
                .collect();
            a.info.indexed.store(added.len(), Ordering::Release);
        }
        // An application whose connection ended is not a destination any more, even before
        // it is reaped.
        self.by_service = self
            .apps
            .iter()
            .enumerate()
            .filter(|(_, a)| !a.info.dead.load(Ordering::Acquire))
            .flat_map(|(i, a)| a.ids.iter().map(move |id| (*id, i)))
            .collect();
        // The transports refuse (and report to the sender) messages for an application
        // that is not, or no longer, attached.
        for id in old.keys().filter(|id| !self.by_service.contains_key(id)) {
            self.shared.hosted.unhost(*id);
        }
        for id in self.by_service.keys() {
            self.shared.hosted.host(*id);
        }
    }

    fn adopt(&mut self) -> usize {
        let mut n = 0;
        while let Some(NewApp {
            info,
            map,
            region,
            app_efd,
        }) = self.shared.apps.pending.pop()
        {
            info.adopted.store(true, Ordering::Release);
            if let Some(rm) = self.shared.rmem.get() {
                // Remote-memory events for it are kept from now until it exits.
                rm.add_owner(info.service);
            }
            self.apps.push(App {
                ids: vec![info.service],
                info,
                region,
                map: Arc::new(map),
                efd: app_efd,
                sq_head: 0,
                cq_tail: 0,
                rxd_tail: 0,
                assembling: None,
                rm_assembling: None,
                blocked: None,
                owed: OwedNotices::default(),
                backlog: VecDeque::new(),
                backlog_bytes: 0,
                dropped_unreported: 0,
                full: false,
                posted: HashMap::new(),
                produced: false,
                txd_done: 0,
                held: HashMap::new(),
                next_held: 0,
            });
            n += 1;
        }
        if n > 0 {
            self.reindex();
        }
        n
    }

    /// Releases the channels of applications that are gone.
    fn reap(&mut self) {
        let before = self.apps.len();
        if let Some(rm) = self.shared.rmem.get() {
            // An application that exits takes its regions and capabilities with it.
            for a in self
                .apps
                .iter()
                .filter(|a| a.info.dead.load(Ordering::Acquire))
            {
                rm.remove_owner(a.info.service);
            }
        }
        self.apps.retain(|a| !a.info.dead.load(Ordering::Acquire));
        if self.apps.len() != before {
            self.reindex();
        }
    }

    /// Queues an event for application `i`, split into segments that fit its RX ring.
    pub(super) fn enqueue(&mut self, i: usize, mut e: Cqe, data: &[u8]) {
        let a = &mut self.apps[i];
        let (_, rxd_size) = a.region.rxd();
        let seg = (rxd_size / 2) as usize;
        if e.kind == cq::MESSAGE {
            e.total_len = data.len() as u32;
        }
        let over = |events: usize, bytes: usize| {
            a.backlog.len() >= events || a.backlog_bytes + data.len() > bytes
        };
        // Short messages are best effort: they give way at the mark. Anything else was
        // accepted (a reliable message is acknowledged by now): it queues up to the hard
        // bound, which only a flood already in flight as the mark was crossed reaches.
        let short = e.kind == cq::MESSAGE && e.flags & cflag::RELIABLE == 0;
        if (short && over(BACKLOG_EVENTS, BACKLOG_BYTES))
            || over(BACKLOG_EVENTS * BACKLOG_HARD, BACKLOG_BYTES * BACKLOG_HARD)
        {
            if e.kind == cq::MESSAGE || e.kind == cq::BUFFER_FILLED {
                a.dropped_unreported += 1;
                a.info.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        if !a.full && over(BACKLOG_EVENTS, BACKLOG_BYTES) {
            a.full = true;
            a.info.counters.full_marks.fetch_add(1, Ordering::Relaxed);
            for id in &a.ids {
                self.shared.hosted.set_full(*id, true);
            }
        }
        // Nothing waits before it and the channel has room: straight in, no copy kept.
        if data.len() <= seg
            && a.backlog.is_empty()
            && a.dropped_unreported == 0
            && a.write_event(e, data)
        {
            return;
        }
        if data.len() <= seg {
            a.backlog_bytes += data.len();
            a.backlog.push_back((e, data.to_vec()));
            return;
        }
        let parts: Vec<&[u8]> = data.chunks(seg).collect();
        for (k, p) in parts.iter().enumerate() {
            let mut s = e;
            if k + 1 < parts.len() {
                s.flags |= cflag::MORE;
            }
            a.backlog_bytes += p.len();
            a.backlog.push_back((s, p.to_vec()));
        }
    }

    /// Writes as much of application `i`'s backlog as its channel has room for.
    fn flush(&mut self, i: usize) -> usize {
        let a = &mut self.apps[i];
        if a.dropped_unreported > 0 && a.backlog.len() < BACKLOG_EVENTS {
            let e = Cqe {
                kind: cq::OVERFLOW,
                count: a.dropped_unreported,
                ..Cqe::default()
            };
            a.dropped_unreported = 0;
            a.backlog.push_back((e, Vec::new()));
        }
        let mut n = 0;
        while let Some((e, data)) = a.backlog.pop_front() {
            if !a.write_event(e, &data) {
                a.backlog.push_front((e, data));
                break;
            }
            a.backlog_bytes -= data.len();
            n += 1;
        }
        if a.full && a.backlog.len() <= BACKLOG_EVENTS / 2 && a.backlog_bytes <= BACKLOG_BYTES / 2 {
            a.full = false;
            for id in &a.ids {
                self.shared.hosted.set_full(*id, false);
            }
        }
        n
    }

    /// Closes application `i`'s channel for a protocol violation.
    fn close(&mut self, i: usize, why: &str) {
        let a = &self.apps[i];
        *a.info.closed_why.lock() = Some(why.to_string());
        a.info.dead.store(true, Ordering::Release);
    }

    /// Reads application `i`'s submissions.
    fn submissions(&mut self, i: usize, now: Time, node: &mut dyn Engine) -> usize {
        if let Some(o) = self.apps[i].blocked.take() {
            if let Err(o) = self.send(i, now, node, o) {
                self.apps[i].blocked = Some(o);
                return 0;
            }
        }
        let r = self.apps[i].region;
        let geo = r.geometry();
        let tail = r.u32(off::SQ_TAIL).load(Ordering::Acquire);
        let waiting = tail.wrapping_sub(self.apps[i].sq_head);
        if waiting > geo.sq_entries {
            self.close(i, "submission ring indices out of range");
            return 0;
        }
        let mut n = 0;
        while n < BATCH && self.apps[i].sq_head != tail {
            let e = r.read_sqe(self.apps[i].sq_head);
            self.apps[i].sq_head = self.apps[i].sq_head.wrapping_add(1);
            n += 1;
            match e.op {
                op::SEND => {
                    if let Some(o) = self.take_send(i, &e) {
                        if let Err(o) = self.send(i, now, node, o) {
                            self.apps[i].blocked = Some(o);
                            break;
                        }
                    }
                }
                op::POST_BUFFER => {
                    let a = &mut self.apps[i];
                    let (_, pool_size) = r.pool();
                    let fits = e
                        .aux
                        .checked_add(u64::from(e.data_len))
                        .is_some_and(|end| end <= pool_size);
                    if fits && a.posted.len() < MAX_POSTED && e.aux2 != 0 {
                        a.posted.insert(
                            e.buf_id,
                            Posted {
                                off: e.aux,
                                len: e.data_len,
                                cookie: e.aux2,
                            },
                        );
                    } else {
                        a.info.counters.bad.fetch_add(1, Ordering::Relaxed);
                    }
                }
                op::CANCEL_BUFFER => {
                    self.apps[i].posted.remove(&e.buf_id);
                }
                op::VERDICT => {
                    let mut data = vec![0u8; (e.data_len as usize).min(65536)];
                    let (_, txd_size) = r.txd();
                    let read =
                        data.is_empty() || r.copy_out(r.txd(), e.data_pos % txd_size, &mut data);
                    let mut e = e;
                    if !read || e.data_len as usize > data.len() {
                        // Bytes outside the ring, or a payload larger than any frame's: the
                        // verdict is refused (counted), and the frame goes on as it was.
                        self.count_bad(i);
                        data.clear();
                        e.kind = torusnet_client::channel::verdict::PASS;
                    }
                    let a = &mut self.apps[i];
                    a.txd_done = a
                        .txd_done
                        .max(e.data_pos.saturating_add(u64::from(e.data_len)));
                    self.verdict(i, now, node, &e, &data);
                }
                op::MULTICAST => self.mcast_submission(i, &e),
                o if super::rmem_ops::is_rmem_op(o) => self.rm_submission(i, &e),
                _ => {
                    self.count_bad(i);
                }
            }
        }
        let done = self.apps[i].txd_done;
        if done > r.u64(off::TXD_HEAD).load(Ordering::Relaxed) {
            r.u64(off::TXD_HEAD).store(done, Ordering::Release);
        }
        r.u32(off::SQ_HEAD)
            .store(self.apps[i].sq_head, Ordering::Release);
        n
    }

    /// Copies a send entry's bytes out; returns the message when it is complete.
    fn take_send(&mut self, i: usize, e: &Sqe) -> Option<AppMessage> {
        let spare = self.spare.pop();
        // Which of its services sends: its attach name's unless it names one it added.
        let src = match e.src_service {
            0 => Some(self.apps[i].info.service),
            s if self.by_service.get(&s) == Some(&i) => Some(s),
            _ => None,
        };
        let a = &mut self.apps[i];
        let r = a.region;
        let (_, txd_size) = r.txd();
        let len = e.data_len as usize;
        let bad = |a: &mut App| {
            a.info.counters.bad.fetch_add(1, Ordering::Relaxed);
            a.assembling = None;
            None
        };
        if len as u64 > txd_size {
            return bad(a);
        }
        let (first, mut data) = match a.assembling.take() {
            Some(x) => x,
            None => {
                let Some(src) = src else {
                    return bad(a);
                };
                // The app header: who sends (stamped here, never taken from the app), kind.
                let wire_kind = if e.flags & sflag::INTO_BUFFER != 0 {
                    kind::INTO_BUFFER
                } else if kind::is_message(e.kind) {
                    e.kind
                } else {
                    return bad(a);
                };
                let mut d = spare.unwrap_or_default();
                d.clear();
                d.reserve(APP_HEADER + INTO_BUFFER_HEADER + e.total_len.min(1 << 20) as usize);
                d.extend_from_slice(&src.to_be_bytes());
                d.push(wire_kind);
                d.push(0);
                if wire_kind == kind::INTO_BUFFER {
                    d.extend_from_slice(&e.buf_id.to_le_bytes());
                    d.extend_from_slice(&e.aux.to_le_bytes());
                    d.extend_from_slice(&e.tag.to_le_bytes());
                }
                (*e, d)
            }
        };
        let at = data.len();
        if at + len > MAX_MESSAGE + APP_HEADER + INTO_BUFFER_HEADER {
            return bad(a);
        }
        data.resize(at + len, 0);
        if !r.copy_out(r.txd(), e.data_pos % txd_size, &mut data[at..]) {
            return bad(a);
        }
        // The application may reuse the bytes once the batch ends (the head only moves
        // forward).
        a.txd_done = a.txd_done.max(e.data_pos.saturating_add(len as u64));
        if e.flags & sflag::MORE != 0 {
            a.assembling = Some((first, data));
            return None;
        }
        let target = match first.dest_kind {
            dest::SERVER => {
                let (x, y, z) = unpack_coord(first.dest);
                Target::Server(Coord::new(x, y, z))
            }
            dest::KEY => Target::Key(first.dest),
            _ => return bad(a),
        };
        bump(&a.info.counters.sent, 1);
        // The sending service, as stamped in the header with the first segment.
        let from = u16::from_be_bytes([data[0], data[1]]);
        Some(AppMessage {
            target,
            service: first.service,
            data,
            opts: MsgOptions {
                reliable: first.flags & sflag::RELIABLE != 0,
                fences: Fences {
                    backward: first.flags & sflag::BWD_FENCE != 0,
                    forward: first.flags & sflag::FWD_FENCE != 0,
                },
                intercept: first.flags & sflag::ON_PATH != 0,
                tag: first.tag,
                from: Some(from),
            },
        })
    }

    /// Hands a message to the engine (which passes it to the poller that owns the peer's
    /// connection); gives it back when there is no room now.
    fn send(
        &mut self,
        i: usize,
        now: Time,
        node: &mut dyn Engine,
        o: AppMessage,
    ) -> Result<(), AppMessage> {
        // The transports' notices and the engines' key messages have service ids of their
        // own: a message an application addressed to one could pass for one of them, so it
        // is refused here.
        let sent = if o.service == NOTICES || o.service == KEYED {
            Err(reason::REFUSED)
        } else {
            // A large message goes straight into its frame when the links keep up (one copy
            // less); refused while they are full, and retried first on the next poll.
            match node.send_framing(now, o.target, o.service, &o.data, o.opts) {
                Ok(()) => Ok(()),
                Err(SendError::WouldBlock) => return Err(o),
                Err(e) => Err(reason_code(FailReason::of_send(e))),
            }
        };
        match sent {
            Ok(()) => {
                if self.spare.len() < 64 {
                    self.spare.push(o.data);
                }
                Ok(())
            }
            Err(code) => {
                let peer = match o.target {
                    Target::Server(c) => c,
                    Target::Key(_) => node.local(),
                };
                self.apps[i]
                    .info
                    .counters
                    .failed
                    .fetch_add(1, Ordering::Relaxed);
                let e = Cqe {
                    kind: cq::FAILED,
                    reason: code,
                    peer: pack(peer),
                    tag: o.opts.tag,
                    ..Cqe::default()
                };
                self.enqueue(i, e, &[]);
                Ok(())
            }
        }
    }

    /// Counts a malformed submission or message of application `i` (refused, and shown in
    /// its counters).
    pub(super) fn count_bad(&self, i: usize) {
        self.apps[i]
            .info
            .counters
            .bad
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A message for application `i` from the torus.
    fn message(&mut self, i: usize, now: Time, node: &mut dyn Engine, m: Incoming<'_>) {
        let Incoming {
            src,
            service,
            data,
            reliable,
            key,
        } = m;
        if data.len() < APP_HEADER {
            self.count_bad(i);
            return;
        }
        let src_service = u16::from_be_bytes([data[0], data[1]]);
        let app_kind = data[2];
        let body = &data[APP_HEADER..];
        match app_kind {
            kind::INTO_BUFFER => self.fill_buffer(i, now, node, src, src_service, body),
            kind::BUFFER_MISSED if body.len() >= 12 => {
                let mut t = [0u8; 8];
                t.copy_from_slice(&body[4..12]);
                let e = Cqe {
                    kind: cq::BUFFER_MISSED,
                    peer: pack(src),
                    tag: u64::from_le_bytes(t),
                    ..Cqe::default()
                };
                self.enqueue(i, e, &[]);
            }
            k if kind::is_message(k) => {
                self.apps[i]
                    .info
                    .counters
                    .received
                    .fetch_add(1, Ordering::Relaxed);
                let mut flags = 0;
                if reliable {
                    flags |= cflag::RELIABLE;
                }
                if key.is_some() {
                    flags |= cflag::KEYED;
                }
                let e = Cqe {
                    kind: cq::MESSAGE,
                    flags,
                    app_kind,
                    src_service,
                    dst_service: service,
                    peer: pack(src),
                    count: key.unwrap_or(0),
                    ..Cqe::default()
                };
                self.enqueue(i, e, body);
            }
            _ => {
                self.count_bad(i);
            }
        }
    }

    /// A message for one of application `i`'s return buffers: written into its pool, or
    /// refused with a notice to its sender.
    fn fill_buffer(
        &mut self,
        i: usize,
        now: Time,
        node: &mut dyn Engine,
        src: Coord,
        src_service: u16,
        body: &[u8],
    ) {
        if body.len() < INTO_BUFFER_HEADER {
            self.count_bad(i);
            return;
        }
        let id = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
        let mut c = [0u8; 8];
        c.copy_from_slice(&body[4..12]);
        let cookie = u64::from_le_bytes(c);
        let mut t = [0u8; 8];
        t.copy_from_slice(&body[12..20]);
        let tag = u64::from_le_bytes(t);
        let data = &body[INTO_BUFFER_HEADER..];
        // The owner may have posted the buffer just before the message arrived, its
        // submission not yet read: read its submissions before calling the buffer missing.
        if !self.apps[i].posted.contains_key(&id) {
            self.submissions(i, now, node);
        }
        let a = &mut self.apps[i];
        let fits = a
            .posted
            .get(&id)
            .is_some_and(|p| p.cookie == cookie && data.len() <= p.len as usize);
        if fits {
            if let Some(p) = a.posted.remove(&id) {
                let r = a.region;
                if r.copy_in(r.pool(), p.off, data) {
                    a.info
                        .counters
                        .buffers_filled
                        .fetch_add(1, Ordering::Relaxed);
                    let e = Cqe {
                        kind: cq::BUFFER_FILLED,
                        src_service,
                        peer: pack(src),
                        tag: u64::from(id),
                        total_len: data.len() as u32,
                        ..Cqe::default()
                    };
                    // Its bytes are in the pool: the completion carries none.
                    self.enqueue(i, e, &[]);
                    return;
                }
            }
        }
        // No such buffer (never posted, taken, too small, or a guessed cookie): the
        // sender learns it and may send the normal way. A wrong cookie is counted.
        if a.posted.get(&id).is_some_and(|p| p.cookie != cookie) {
            a.info.counters.bad.fetch_add(1, Ordering::Relaxed);
        }
        self.buf.clear();
        self.buf
            .extend_from_slice(&self.apps[i].info.service.to_be_bytes());
        self.buf.push(kind::BUFFER_MISSED);
        self.buf.push(0);
        self.buf.extend_from_slice(&id.to_le_bytes());
        self.buf.extend_from_slice(&tag.to_le_bytes());
        let opts = MsgOptions {
            reliable: true,
            from: Some(self.apps[i].info.service),
            ..MsgOptions::default()
        };
        let notice = AppMessage {
            target: Target::Server(src),
            service: src_service,
            data: self.buf.clone(),
            opts,
        };
        let a = &mut self.apps[i];
        let lost = a.owed.send(notice, &mut |o| {
            node.send_framing(now, o.target, o.service, &o.data, o.opts)
        });
        a.info
            .counters
            .notices_lost
            .fetch_add(lost, Ordering::Relaxed);
    }

    /// Sends the notices application `i` owes, as far as the transport takes them.
    fn flush_owed(&mut self, i: usize, now: Time, node: &mut dyn Engine) -> usize {
        let a = &mut self.apps[i];
        if a.owed.is_empty() {
            return 0;
        }
        let (sent, lost) = a
            .owed
            .flush(&mut |o| node.send_framing(now, o.target, o.service, &o.data, o.opts));
        a.info
            .counters
            .notices_lost
            .fetch_add(lost, Ordering::Relaxed);
        sent
    }

    /// An event for every application.
    fn broadcast(&mut self, e: Cqe) {
        for i in 0..self.apps.len() {
            self.enqueue(i, e, &[]);
        }
    }
}

/// A message from the torus for an application.
struct Incoming<'a> {
    src: Coord,
    /// The service it was sent to (one of the application's).
    service: u16,
    data: &'a [u8],
    reliable: bool,
    key: Option<u64>,
}

pub(super) fn pack(c: Coord) -> u64 {
    pack_coord(c.x, c.y, c.z)
}

fn reason_code(r: FailReason) -> u8 {
    match r {
        FailReason::PeerRestarted => reason::PEER_RESTARTED,
        FailReason::PeerReset => reason::PEER_RESET,
        FailReason::Silent => reason::SILENT,
        FailReason::Unreachable => reason::UNREACHABLE,
        FailReason::Refused => reason::REFUSED,
        FailReason::NoService => reason::NO_SERVICE,
        FailReason::ReceiverFull => reason::RECEIVER_FULL,
        // The engine sends a key message on to the key's root; an application hears of
        // one only when none took it, as unreachable.
        FailReason::NotRoot => reason::UNREACHABLE,
    }
}

impl Service for AppsHost {
    fn name(&self) -> &'static str {
        "apps"
    }

    fn ids(&self) -> &[u16] {
        &[]
    }

    fn owns(&self, id: u16) -> bool {
        self.by_service.contains_key(&id)
    }

    fn on_message_ref(&mut self, now: Time, m: &Lent<'_>, node: &mut dyn Engine) -> bool {
        // Written from the frame straight into the application's channel (or its backlog):
        // the message's one copy on the way in.
        let Some(&i) = self.by_service.get(&m.service) else {
            return false;
        };
        let msg = Incoming {
            src: m.src,
            service: m.service,
            data: m.data,
            reliable: m.reliable,
            key: None,
        };
        self.message(i, now, node, msg);
        true
    }

    fn on_event(&mut self, now: Time, e: &Event, node: &mut dyn Engine) {
        match e {
            Event::Message {
                src,
                service,
                data,
                reliable,
                key,
            } => {
                if let Some(&i) = self.by_service.get(service) {
                    let m = Incoming {
                        src: *src,
                        service: *service,
                        data,
                        reliable: *reliable,
                        key: *key,
                    };
                    self.message(i, now, node, m);
                }
            }
            Event::Acked {
                peer,
                service,
                count,
                last_tag,
            } => {
                if let Some(&i) = self.by_service.get(service) {
                    self.apps[i]
                        .info
                        .counters
                        .acked
                        .fetch_add(u64::from(*count), Ordering::Relaxed);
                    let e = Cqe {
                        kind: cq::ACKED,
                        peer: pack(*peer),
                        tag: *last_tag,
                        count: u64::from(*count),
                        ..Cqe::default()
                    };
                    self.enqueue(i, e, &[]);
                }
            }
            Event::Failed {
                peer,
                service,
                tags,
                reason: r,
            } => {
                if let Some(&i) = self.by_service.get(service) {
                    self.apps[i]
                        .info
                        .counters
                        .failed
                        .fetch_add(tags.len() as u64, Ordering::Relaxed);
                    for t in tags {
                        let e = Cqe {
                            kind: cq::FAILED,
                            reason: reason_code(*r),
                            peer: pack(*peer),
                            tag: *t,
                            ..Cqe::default()
                        };
                        self.enqueue(i, e, &[]);
                    }
                }
            }
            Event::PeerReset { peer, reason: r } => self.broadcast(Cqe {
                kind: cq::PEER_RESET,
                reason: reason_code(*r),
                peer: pack(*peer),
                ..Cqe::default()
            }),
            Event::Unreachable(c) => self.broadcast(Cqe {
                kind: cq::UNREACHABLE,
                peer: pack(*c),
                ..Cqe::default()
            }),
            Event::Reachable(c) => self.broadcast(Cqe {
                kind: cq::REACHABLE,
                peer: pack(*c),
                ..Cqe::default()
            }),
            // Applications' key messages follow their roots inside the engine; the client
            // asks for a key's servers when it needs them.
            Event::RootsMoved => {}
        }
    }

    fn poll(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        let mut n = self.adopt();
        n += self.take_intercepted(now, node);
        for i in 0..self.apps.len() {
            let leaving = self.apps[i].info.dead.load(Ordering::Acquire);
            self.expire_held(i, now, node, leaving);
        }
        if self.shared.apps.renamed.swap(false, Ordering::AcqRel) {
            self.reindex();
        }
        self.reap();
        for i in 0..self.apps.len() {
            n += self.flush_owed(i, now, node);
            n += self.submissions(i, now, node);
        }
        n += self.rm_events();
        n += self.mcast_events();
        for i in 0..self.apps.len() {
            n += self.flush(i);
            let a = &mut self.apps[i];
            if std::mem::take(&mut a.produced) {
                // Pairs with the application's store of APP_WAITING before its last look.
                fence(Ordering::SeqCst);
                if a.region.u32(off::APP_WAITING).load(Ordering::SeqCst) != 0 {
                    sys::signal(a.efd.as_raw_fd());
                }
            }
        }
        self.reap();
        n
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.held_deadline()
    }

    fn may_sleep(&mut self) -> bool {
        // Only the remote-memory events of attached applications: events for an owner that
        // has gone would keep the poller from sleeping for ever.
        let mut idle = self.shared.apps.pending.is_empty()
            && self.shared.apps.intercepted.is_empty()
            && !self
                .shared
                .rmem
                .get()
                .is_some_and(|r| r.has_events_for(self.apps.iter().map(|a| a.info.service)));
        for a in &self.apps {
            let r = a.region;
            r.u32(off::TORUSD_WAITING).store(1, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
        for (i, a) in self.apps.iter().enumerate() {
            let r = a.region;
            let tail = r.u32(off::SQ_TAIL).load(Ordering::SeqCst);
            idle &= tail == a.sq_head && a.blocked.is_none() && a.owed.is_empty();
            // Waiting events (its backlog, multicast bytes) and room for them: flush first.
            if !a.backlog.is_empty() || self.mcast_waiting(i) {
                let head = r.u32(off::CQ_HEAD).load(Ordering::Acquire);
                idle &= a.cq_tail.wrapping_sub(head) >= r.geometry().cq_entries;
            }
        }
        idle
    }

    fn woke(&mut self) {
        for a in &self.apps {
            a.region
                .u32(off::TORUSD_WAITING)
                .store(0, Ordering::Relaxed);
        }
    }
}
