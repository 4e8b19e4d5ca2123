//! `multicast` (service 9): CamCube's file distribution (CamCubeOS paper 6.1). The root cuts
//! the bytes into chunks and sends chunk `i` down tree `i % k` of the
//! [`Trees`](torusnet_proto::trees::Trees) rooted at it (one tree per link direction, each
//! edge one link, no link carrying two trees when nothing failed), so the root sends on all
//! its links and every server receives on all of its. Every server forwards each chunk to
//! its children in that chunk's tree; members deliver the bytes in order (to an
//! application's [`Sink`], or only into a checksum).
//!
//! Memory is bounded, whatever the transfer's size: the root sends at most a window of
//! chunks (32 MiB by default) beyond what its slowest member has delivered (members report
//! their progress), and a server keeps a chunk only until it has handed it to the transport
//! for each of its children and, on a member, delivered it. So a chunk a member lacks may
//! be gone from its parents: the root, which reads its bytes from its [`Source`] for as long
//! as the transfer lasts, repairs it (`Want`).
//!
//! Reliability is per edge first: each chunk travels parent to child as a reliable message,
//! so a lost frame is re-sent by the parent's transport; a message the transport reports
//! failed (the child restarted or went silent) is queued again while the parent still holds
//! the chunk. When the view changes, every server rebuilds the trees (after a short settling
//! time) and tells each new parent what it holds of that tree (`Have`); the parent sends what
//! it holds of the rest and adopts it as a child. A member that receives nothing it can
//! deliver for a second asks the root for what it lacks of its window. Members report the
//! checksum of what they delivered to the root (or that they cannot deliver, and why); the
//! transfer ends when every member still reachable has reported, or at its deadline.
//! Relays (servers outside the group) forward but do not report.
//!
//! No control message is trusted to arrive once: a `Start` or `Done` may be reported failed
//! (the peer went silent for a while, as a starved daemon does) or refused (the peer was
//! unreachable for a moment). So the root sends `Start` again, once a second, to every
//! reachable member that has not reported, and a member that delivered everything answers
//! with its `Done` again; a parent that never heard of the transfer joins it from the
//! child's `Have`. A loss costs a second, never the transfer. Servers remember the transfers
//! that ended, so a late message does not bring one back.

mod ends;
mod member;
mod root;
pub mod wire;
mod xfer;

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::routing::LinkView;
use torusnet_proto::service::{Engine, Request, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::SendError;
use torusnet_proto::trees::Trees;

use crate::builtin::fnv;
pub use ends::{Sink, Sinks, Source};
use root::{Outcome, RootState};
use wire::{Msg, Transfer};
use xfer::{Role, Xfer};

/// Service id of the multicast service.
pub const MCAST: u16 = 9;
/// Default chunk size (bytes per message).
pub const DEFAULT_CHUNK: u32 = 256 * 1024;
/// Largest transfer.
pub const MAX_SIZE: u64 = 8 << 30;
/// Default window: bytes the root sends beyond what its slowest member delivered, and so
/// about what a server holds of one transfer at most.
pub const DEFAULT_WINDOW: u64 = 32 << 20;
/// How long the view must stay unchanged before the trees are rebuilt.
const SETTLE: Duration = Duration::from_millis(150);
/// A member that delivered nothing for this long asks the root for what it lacks.
const STALL: Duration = Duration::from_secs(1);
/// A transfer nobody has touched for this long is forgotten (its End was lost).
const IDLE: Duration = Duration::from_secs(120);
/// Transfers a server takes part in at once (beyond: new ones are ignored, and counted).
const MAX_TRANSFERS: usize = 64;
/// How often a member waiting for its sink (no room, or the last bytes not yet read) asks
/// it again.
const SINK_RETRY: Duration = Duration::from_millis(1);
/// How many ended transfers a server remembers (to ignore their late messages).
const ENDED: usize = 1024;

/// Deterministic bytes for tests and benchmarks (`seed` picks them).
pub fn generate(len: u64, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; len as usize];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for c in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
    out
}

/// A transfer's checksum: `fold(fold(START, chunk 0), chunk 1) ...`, over its chunks in
/// order (members compute it as they deliver, the root as it sends).
pub fn fold(sum: u64, chunk: &[u8]) -> u64 {
    (sum ^ fnv(chunk))
        .wrapping_mul(0x100_0000_01b3)
        .rotate_left(29)
}

/// Where [`fold`] starts.
pub const FOLD_START: u64 = 0xcbf2_9ce4_8422_2325;

/// The checksum of `data` cut into `chunk`-byte chunks (what a member reports).
pub fn checksum(data: &[u8], chunk: u32) -> u64 {
    data.chunks(chunk.max(1) as usize).fold(FOLD_START, fold)
}

/// A multicast to start at this server (the root).
#[derive(Debug)]
pub struct MulticastRequest {
    /// The members (`None`: every other server).
    pub group: Option<Vec<Coord>>,
    /// The service members deliver to (0: none; torusd only checks the bytes).
    pub service: u16,
    /// The bytes.
    pub data: Arc<dyn Source>,
    /// Bytes per chunk.
    pub chunk: u32,
    /// The transfer ends by then.
    pub timeout: Duration,
    /// Where the result goes.
    pub reply: Sender<Value>,
}

/// Counters of the service on this server.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct McastStats {
    /// Chunks received (first copies).
    pub chunks_in: u64,
    /// Duplicate chunks received (after a repair).
    pub duplicates: u64,
    /// Chunks sent to children.
    pub chunks_out: u64,
    /// Chunk bytes sent to children.
    pub bytes_out: u64,
    /// Sends over a detour (tree edge not one link), and their extra hops.
    pub detour_hops: u64,
    /// Chunks re-sent after a failure report or a `Have`.
    pub resent: u64,
    /// Chunks the root sent straight to a member that asked for them (`Want`).
    pub repaired: u64,
    /// Malformed or out-of-range messages dropped.
    pub malformed: u64,
    /// Messages the transport refused for good (their server unreachable, ...), and chunks
    /// not sent because their child was unreachable or the chunk was no longer held: a
    /// member missing chunks asks the root, and the root sends `Start` again to members
    /// that did not report.
    pub send_failed: u64,
    /// Tree rebuilds after view changes.
    pub rebuilds: u64,
    /// Transfers completed here as a member.
    pub completed: u64,
    /// Transfers this server could not deliver as a member (no application for them).
    pub refused: u64,
    /// New transfers ignored because this server takes part in as many as it may at once.
    pub refused_transfers: u64,
    /// Times this server asked the root after a second without progress.
    pub asked: u64,
    /// `Start`s the root sent again to members that had not reported.
    pub repolled: u64,
    /// `Done`s sent again, in answer to a `Start` for a transfer delivered whole.
    pub redone: u64,
    /// Messages for transfers that had ended here, ignored.
    pub late: u64,
    /// Chunk bytes held now, over every transfer.
    pub held_bytes: u64,
    /// The most chunk bytes held at once (the service's memory, bounded by the window).
    pub held_max: u64,
}

/// The multicast service of one server.
#[derive(Debug)]
pub struct Multicast {
    xfers: HashMap<u64, Xfer>,
    order: VecDeque<u64>,
    next_id: u64,
    rebuild_at: Option<Time>,
    /// Control messages (Start, Have, Done, End, ...) waiting for room in the transport:
    /// they go before any chunk and are never dropped for want of room.
    ctl: VecDeque<(Coord, Vec<u8>)>,
    /// The transfers that ended here, newest last (at most [`ENDED`]).
    ended: VecDeque<u64>,
    /// Bytes the root sends beyond its slowest member.
    window: u64,
    /// Where members deliver transfers for services (none: such transfers are refused).
    sinks: Option<Box<dyn Sinks>>,
    /// When this service was last polled.
    last_poll: Time,
    /// Counters.
    pub stats: McastStats,
}

impl Default for Multicast {
    fn default() -> Multicast {
        Multicast::new(DEFAULT_WINDOW, None)
    }
}

fn opts(tag: u64) -> MsgOptions {
    MsgOptions {
        reliable: true,
        tag,
        ..MsgOptions::default()
    }
}

/// The view as the engine sees it: servers it can reach are up, their links live (a link
/// that is down shows as a detour in the routing, not here).
fn view_of(node: &dyn Engine) -> Option<LinkView> {
    let dims = node.dims();
    let mut v = LinkView::all_up(dims).ok()?;
    for c in dims.coords() {
        if c != node.local() && !node.is_reachable(c) {
            v.set_server(c, false).ok()?;
        }
    }
    Some(v)
}

impl Multicast {
    /// A multicast service whose roots send `window` bytes beyond their slowest member, and
    /// whose members deliver transfers for services to `sinks`.
    pub fn new(window: u64, sinks: Option<Box<dyn Sinks>>) -> Multicast {
        Multicast {
            xfers: HashMap::new(),
            order: VecDeque::new(),
            next_id: 0,
            rebuild_at: None,
            ctl: VecDeque::new(),
            ended: VecDeque::new(),
            window,
            sinks,
            last_poll: Time::ZERO,
            stats: McastStats::default(),
        }
    }

    /// The window in chunks of `chunk` bytes.
    fn window_chunks(&self, chunk: u32) -> u32 {
        (self.window / u64::from(chunk.max(1))).clamp(4, u64::from(u32::MAX)) as u32
    }

    /// Whether transfer `t` is known here, joining it if it is new and well-formed.
    fn join(&mut self, now: Time, t: &Transfer, node: &dyn Engine) -> bool {
        if !self.xfers.contains_key(&t.id) {
            if self.ended.contains(&t.id) {
                self.stats.late += 1;
                return false;
            }
            let chunks = t.size.div_ceil(u64::from(t.chunk.max(1)));
            if t.size == 0
                || t.size > MAX_SIZE
                || t.chunk < 1024
                || t.chunk > 1 << 20
                || chunks > u64::from(u32::MAX)
                || t.root == node.local()
                || !node.dims().contains(t.root)
            {
                self.stats.malformed += 1;
                return false;
            }
            if self.xfers.len() >= MAX_TRANSFERS {
                self.stats.refused_transfers += 1;
                return false;
            }
            let trees = view_of(node).map(|v| Trees::build(&v, t.root));
            self.xfers
                .insert(t.id, Xfer::new(*t, Role::Unknown, now, trees));
            self.order.push_back(t.id);
        }
        self.xfers.get(&t.id).is_some_and(|x| x.t == *t)
    }

    fn on_message(&mut self, now: Time, src: Coord, data: &[u8], node: &mut dyn Engine) {
        let Some(m) = Msg::decode(data) else {
            self.stats.malformed += 1;
            return;
        };
        match m {
            Msg::Start { t, member } => self.on_start(now, &t, member, node),
            Msg::Data { t, index, data } => self.on_data(now, &t, index, data, node),
            Msg::Have { t, tree, bits } => self.on_have(now, src, &t, tree, bits, node),
            Msg::Want { t, from, bits } => self.on_want(src, &t, from, bits, node),
            Msg::Progress { id, delivered } => self.on_progress(src, id, delivered, node),
            Msg::Done { id, checksum } => {
                let ok = |r: &RootState| checksum == r.sum;
                self.on_outcome(now, src, id, node, |r| Outcome::Done {
                    at: now,
                    checksum_ok: ok(r),
                });
            }
            Msg::Refused { id, reason } => {
                self.on_outcome(now, src, id, node, |_| Outcome::Refused {
                    at: now,
                    reason: reason.to_string(),
                });
            }
            Msg::End { id } => {
                if self.xfers.get(&id).is_some_and(|x| x.root().is_none()) {
                    self.forget(id);
                }
                if !self.ended.contains(&id) {
                    self.remember_ended(id);
                }
            }
        }
    }

    fn remember_ended(&mut self, id: u64) {
        if self.ended.len() >= ENDED {
            self.ended.pop_front();
        }
        self.ended.push_back(id);
    }

    /// New trees from the settled view; each new parent learns what its child holds.
    fn rebuild(&mut self, now: Time, node: &mut dyn Engine) {
        let me = node.local();
        self.stats.rebuilds += 1;
        let view = view_of(node);
        let ids: Vec<u64> = self.xfers.keys().copied().collect();
        for id in ids {
            let Some(x) = self.xfers.get_mut(&id) else {
                continue;
            };
            x.trees = view.as_ref().map(|v| Trees::build(v, x.t.root));
            x.adopted.retain(|(_, c)| node.is_reachable(*c));
            if x.root().is_some() || x.missing == 0 {
                continue;
            }
            // Every parent hears what this server still lacks of its tree: a new parent
            // never sent it anything, and an old one may have forwarded by other trees (a
            // server that joined the transfer after the failure built its trees from the
            // new view already).
            x.stalled_at = now;
            Self::ask_parents(&mut self.ctl, x, me);
        }
        let roots: Vec<u64> = self
            .xfers
            .iter()
            .filter(|(_, x)| x.root().is_some())
            .map(|(k, _)| *k)
            .collect();
        for id in roots {
            // A member given up no longer holds the window back.
            self.release(id, node);
            self.maybe_finish(now, id, node);
        }
    }

    /// Sends queued chunks, one per transfer in turn (so concurrent transfers share the
    /// links), until the transport's queue for this service is full.
    fn send_some(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        let mut sent = 0;
        while let Some((c, m)) = self.ctl.pop_front() {
            match node.send(now, Target::Server(c), MCAST, &m, opts(0)) {
                Ok(()) => sent += 1,
                Err(SendError::WouldBlock) => {
                    self.ctl.push_front((c, m));
                    return sent;
                }
                Err(_) => self.stats.send_failed += 1,
            }
        }
        let mut idle_rounds = 0;
        while idle_rounds < self.order.len() && sent < 4096 {
            let Some(id) = self.order.pop_front() else {
                break;
            };
            self.order.push_back(id);
            let Some(x) = self.xfers.get_mut(&id) else {
                idle_rounds += 1;
                continue;
            };
            let Some((c, i)) = x.out.pop_front() else {
                idle_rounds += 1;
                continue;
            };
            idle_rounds = 0;
            if !node.is_reachable(c) {
                self.stats.send_failed += 1;
                x.sent(i, &mut self.stats.held_bytes);
                continue;
            }
            let Some(m) = x.data_msg(i) else {
                self.stats.send_failed += 1;
                x.sent(i, &mut self.stats.held_bytes);
                continue;
            };
            let len = (m.len() - wire::DATA_HEADER) as u64;
            let tag = (id & 0xffff_ffff) << 32 | u64::from(i);
            match node.send(now, Target::Server(c), MCAST, &m, opts(tag)) {
                Ok(()) => {
                    sent += 1;
                    self.stats.chunks_out += 1;
                    self.stats.bytes_out += len;
                    if let Some(d) = node.distance(c) {
                        self.stats.detour_hops += u64::from(d.saturating_sub(1));
                    }
                    x.sent(i, &mut self.stats.held_bytes);
                }
                Err(SendError::WouldBlock) => {
                    x.out.push_front((c, i));
                    break;
                }
                Err(_) => {
                    self.stats.send_failed += 1;
                    x.sent(i, &mut self.stats.held_bytes);
                }
            }
        }
        sent
    }

    /// A transfer's status at this server (for `torusctl` and tests).
    pub fn status(&self) -> Value {
        let xfers: Vec<Value> = self
            .xfers
            .values()
            .map(|x| {
                let role = match &x.role {
                    Role::Unknown => "unknown",
                    Role::Relay => "relay",
                    Role::Member(_) => "member",
                    Role::Refused(_) => "refused",
                    Role::Root(_) => "root",
                };
                json!({
                    "id": format!("{:016x}", x.t.id),
                    "root": x.t.root.to_string(),
                    "size": x.t.size,
                    "service": x.t.service,
                    "role": role,
                    "missing_chunks": x.missing,
                    "delivered_chunks": x.delivered,
                    "held_chunks": x.held.len(),
                    "queued": x.out.len(),
                })
            })
            .collect();
        json!({"stats": self.stats, "transfers": xfers, "window": self.window})
    }
}

impl Service for Multicast {
    fn name(&self) -> &'static str {
        "multicast"
    }

    fn ids(&self) -> &[u16] {
        &[MCAST]
    }

    fn on_event(&mut self, now: Time, event: &Event, node: &mut dyn Engine) {
        match event {
            Event::Message { src, data, .. } => self.on_message(now, *src, data, node),
            Event::Failed {
                peer,
                service,
                tags,
                ..
            } if *service == MCAST => {
                for tag in tags {
                    let (idl, i) = (tag >> 32, (*tag & 0xffff_ffff) as u32);
                    if let Some(x) = self
                        .xfers
                        .values_mut()
                        .find(|x| x.t.id & 0xffff_ffff == idl)
                    {
                        // Sent again while this server holds it; else the member asks
                        // the root.
                        if node.is_reachable(*peer) && i < x.chunks() && x.queue(*peer, i) {
                            self.stats.resent += 1;
                        }
                    }
                }
            }
            Event::Unreachable(_) | Event::Reachable(_) | Event::PeerReset { .. } => {
                self.rebuild_at = Some(now + SETTLE);
            }
            _ => {}
        }
    }

    fn on_request(
        &mut self,
        now: Time,
        request: Request,
        node: &mut dyn Engine,
    ) -> Result<(), Request> {
        match request.downcast::<MulticastRequest>() {
            Ok(r) => {
                self.start(now, *r, node);
                Ok(())
            }
            Err(r) => match r.downcast::<StatusRequest>() {
                Ok(s) => {
                    let _ = s.reply.send(self.status());
                    Ok(())
                }
                Err(r) => Err(r),
            },
        }
    }

    fn poll(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        self.last_poll = now;
        let mut work = 0;
        if self.rebuild_at.is_some_and(|t| now >= t) {
            self.rebuild_at = None;
            self.rebuild(now, node);
            work += 1;
        }
        // Members whose sink had no room try again; members stuck on a chunk they lack
        // ask the root for their window; relays ask their parents.
        let ids: Vec<u64> = self.xfers.keys().copied().collect();
        for id in ids {
            self.deliver(now, id);
            let me = node.local();
            let window = match self.xfers.get(&id) {
                Some(x) => self.window_chunks(x.t.chunk),
                None => continue,
            };
            let Some(x) = self.xfers.get_mut(&id) else {
                continue;
            };
            if x.root().is_some() || now.since(x.stalled_at) < STALL {
                continue;
            }
            if x.is_member() && x.delivered < x.chunks() && !x.held.contains_key(&x.delivered) {
                x.stalled_at = now;
                self.stats.asked += 1;
                let m = Msg::Want {
                    t: x.t,
                    from: x.delivered,
                    bits: &x.want(window),
                }
                .encode();
                self.ctl.push_back((x.t.root, m));
            } else if !x.is_member() && x.missing > 0 {
                x.stalled_at = now;
                self.stats.asked += 1;
                Self::ask_parents(&mut self.ctl, x, me);
            }
        }
        self.repoll(now, node);
        work += self.send_some(now, node);
        let late: Vec<u64> = self
            .xfers
            .iter()
            .filter(|(_, x)| x.root().is_some_and(|r| now >= r.deadline))
            .map(|(k, _)| *k)
            .collect();
        for id in late {
            self.maybe_finish(now, id, node);
            work += 1;
        }
        let idle: Vec<u64> = self
            .xfers
            .iter()
            .filter(|(_, x)| x.root().is_none() && now.since(x.touched) >= IDLE)
            .map(|(k, _)| *k)
            .collect();
        for id in idle {
            self.forget(id);
            self.remember_ended(id);
        }
        work
    }

    fn poll_timeout(&self) -> Option<Time> {
        if !self.ctl.is_empty() || self.xfers.values().any(|x| !x.out.is_empty()) {
            return Some(Time::ZERO);
        }
        let deadline = self
            .xfers
            .values()
            .filter_map(|x| match x.root() {
                Some(r) => Some(r.deadline.min(r.polled + STALL)),
                // A member waiting for its sink (room, or the last bytes read) asks it again
                // shortly; the sink wakes nobody.
                None if x.is_member()
                    && ((x.delivered == x.chunks() && !x.done_sent)
                        || x.held.contains_key(&x.delivered)) =>
                {
                    Some(self.last_poll + SINK_RETRY)
                }
                // A member missing its next chunk, or a relay missing chunks: the stall timer.
                None if (x.is_member() && x.delivered < x.chunks()) || x.missing > 0 => {
                    Some(x.stalled_at + STALL)
                }
                None => None,
            })
            .min();
        match (self.rebuild_at, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Asks for [`Multicast::status`].
#[derive(Debug)]
pub struct StatusRequest {
    /// Where it goes.
    pub reply: Sender<Value>,
}

#[cfg(test)]
mod tests;
