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

mod root;
pub mod wire;

use std::collections::{HashMap, HashSet, VecDeque};
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
use root::{Outcome, RootState};
use wire::{Msg, Transfer};

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

/// The bytes a root multicasts. It reads each chunk when it first sends it and again when a
/// member asks for it, so they must stay unchanged until the transfer ends.
pub trait Source: Send + Sync + std::fmt::Debug {
    /// How many.
    fn len(&self) -> u64;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `out.len()` of them from `offset` (false: out of bounds).
    fn read(&self, offset: u64, out: &mut [u8]) -> bool;
}

impl Source for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> bool {
        let Ok(start) = usize::try_from(offset) else {
            return false;
        };
        match start
            .checked_add(out.len())
            .and_then(|end| self.get(start..end))
        {
            Some(b) => {
                out.copy_from_slice(b);
                true
            }
            None => false,
        }
    }
}

/// Where a member delivers a transfer for its service: the bytes in order, then the end.
pub trait Sink: Send + std::fmt::Debug {
    /// The transfer's bytes at `offset` (in order, each once): `false` when there is no
    /// room now (they are offered again on a later poll).
    fn deliver(&mut self, t: &Transfer, offset: u64, data: &[u8]) -> bool;
    /// The transfer ended here: every byte was delivered (`complete`), or the root gave
    /// up on it (or it was forgotten).
    fn end(&mut self, t: &Transfer, complete: bool);
}

/// Opens the [`Sink`]s of the services on this server (torusd: its applications).
pub trait Sinks: Send + std::fmt::Debug {
    /// The sink of transfer `t` for `t.service`, or why none can take it (reported to the
    /// root).
    fn open(&mut self, t: &Transfer) -> Result<Box<dyn Sink>, String>;
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

/// What this server is in a transfer.
#[derive(Debug)]
enum Role {
    /// Not told yet (its `Start` is on its way, or lost): it keeps what it receives.
    Unknown,
    /// It forwards only.
    Relay,
    /// It delivers (to its sink, if the transfer names a service) and reports.
    Member(Option<Box<dyn Sink>>),
    /// A member that cannot deliver: it forwards only.
    Refused(String),
    /// The source.
    Root(Box<RootState>),
}

/// A chunk this server holds, and how many of its sends are still queued.
#[derive(Debug)]
struct Held {
    data: Vec<u8>,
    sends: u32,
}

#[derive(Debug)]
struct Xfer {
    t: Transfer,
    role: Role,
    /// Chunks received at some time (the root: all).
    have: Vec<bool>,
    missing: u32,
    /// Chunks held now.
    held: HashMap<u32, Held>,
    /// Chunks delivered in order (a member), or released into the trees (the root).
    delivered: u32,
    /// The checksum of the chunks delivered.
    sum: u64,
    /// `delivered` as last reported to the root.
    reported: u32,
    done_sent: bool,
    ended: bool,
    trees: Option<Trees>,
    adopted: HashSet<(usize, Coord)>,
    out: VecDeque<(Coord, u32)>,
    touched: Time,
    /// When a chunk last arrived or was delivered (or the root was last asked): a member
    /// that stops progressing asks the root.
    stalled_at: Time,
}

impl Xfer {
    fn new(t: Transfer, role: Role, now: Time, trees: Option<Trees>) -> Xfer {
        let chunks = t.size.div_ceil(u64::from(t.chunk.max(1))) as u32;
        let root = matches!(role, Role::Root(_));
        Xfer {
            t,
            role,
            have: vec![root; chunks as usize],
            missing: if root { 0 } else { chunks },
            held: HashMap::new(),
            delivered: 0,
            sum: FOLD_START,
            reported: 0,
            done_sent: root,
            ended: false,
            trees,
            adopted: HashSet::new(),
            out: VecDeque::new(),
            touched: now,
            stalled_at: now,
        }
    }
    fn chunks(&self) -> u32 {
        self.have.len() as u32
    }
    fn chunk_range(&self, i: u32) -> std::ops::Range<usize> {
        let start = i as u64 * u64::from(self.t.chunk);
        let end = (start + u64::from(self.t.chunk)).min(self.t.size);
        start as usize..end as usize
    }
    fn tree_of(&self, i: u32) -> usize {
        let k = self.trees.as_ref().map_or(1, Trees::count).max(1);
        i as usize % k
    }
    fn children(&self, tree: usize, me: Coord) -> Vec<Coord> {
        let mut c = self
            .trees
            .as_ref()
            .map(|t| t.children(tree, me))
            .unwrap_or_default();
        for (t, a) in &self.adopted {
            if *t == tree && !c.contains(a) {
                c.push(*a);
            }
        }
        c
    }
    fn root(&self) -> Option<&RootState> {
        match &self.role {
            Role::Root(r) => Some(r),
            _ => None,
        }
    }
    fn root_mut(&mut self) -> Option<&mut RootState> {
        match &mut self.role {
            Role::Root(r) => Some(r),
            _ => None,
        }
    }
    fn is_member(&self) -> bool {
        matches!(self.role, Role::Member(_))
    }
    /// Whether this server can send chunk `i`: the root once released, another server while
    /// it holds it.
    fn can_send(&self, i: u32) -> bool {
        match &self.role {
            Role::Root(_) => i < self.delivered,
            _ => self.held.contains_key(&i),
        }
    }
    /// The `Data` message carrying chunk `i` (`None`: not held, or the source failed).
    fn data_msg(&self, i: u32) -> Option<Vec<u8>> {
        let r = self.chunk_range(i);
        match &self.role {
            Role::Root(root) if i < self.delivered => Msg::data_with(&self.t, i, r.len(), |out| {
                root.source.read(r.start as u64, out)
            }),
            Role::Root(_) => None,
            _ => self.held.get(&i).map(|h| {
                Msg::Data {
                    t: self.t,
                    index: i,
                    data: &h.data,
                }
                .encode()
            }),
        }
    }
    /// Queues chunk `i` for `to` (counted against the chunk, which is kept until sent).
    fn queue(&mut self, to: Coord, i: u32) -> bool {
        if !self.can_send(i) {
            return false;
        }
        if let Some(h) = self.held.get_mut(&i) {
            h.sends += 1;
        }
        self.out.push_back((to, i));
        true
    }
    /// One queued send of chunk `i` is over (sent or dropped): the chunk goes once nothing
    /// else needs it.
    fn sent(&mut self, i: u32, bytes: &mut u64) {
        if let Some(h) = self.held.get_mut(&i) {
            h.sends = h.sends.saturating_sub(1);
        }
        self.settle(i, bytes);
    }
    /// Lets go of chunk `i` if no send of it is queued and this server has no other use
    /// for it (a member: delivered; a relay: none; not yet told: keep it).
    fn settle(&mut self, i: u32, bytes: &mut u64) {
        let done = match self.role {
            Role::Member(_) => i < self.delivered,
            Role::Unknown => false,
            _ => true,
        };
        if done && self.held.get(&i).is_some_and(|h| h.sends == 0) {
            if let Some(h) = self.held.remove(&i) {
                *bytes = bytes.saturating_sub(h.data.len() as u64);
            }
        }
    }
    /// The window a member asks the root for: from its first undelivered chunk on.
    fn want(&self, window: u32) -> Vec<u8> {
        let from = self.delivered;
        let n = window.min(self.chunks() - from);
        let mut bits = vec![0u8; n.div_ceil(8) as usize];
        for j in 0..n {
            if self.held.contains_key(&(from + j)) || self.have[(from + j) as usize] {
                bits[j as usize / 8] |= 1 << (j % 8);
            }
        }
        bits
    }
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
            stats: McastStats::default(),
        }
    }

    /// The window in chunks of `chunk` bytes.
    fn window_chunks(&self, chunk: u32) -> u32 {
        (self.window / u64::from(chunk.max(1))).clamp(4, u64::from(u32::MAX)) as u32
    }

    fn start(&mut self, now: Time, req: MulticastRequest, node: &mut dyn Engine) {
        let me = node.local();
        let size = req.data.len();
        let chunk = req.chunk.clamp(1024, 1 << 20);
        if size == 0 || size > MAX_SIZE {
            let _ = req
                .reply
                .send(json!({"error": format!("size {size}: 1 byte to {MAX_SIZE}")}));
            return;
        }
        let members: Vec<Coord> = match &req.group {
            Some(g) => g.iter().copied().filter(|c| *c != me).collect(),
            None => node.dims().coords().filter(|c| *c != me).collect(),
        };
        if let Some(bad) = members.iter().find(|c| !node.dims().contains(**c)) {
            let _ = req
                .reply
                .send(json!({"error": format!("{bad} is not in the torus")}));
            return;
        }
        self.next_id += 1;
        let id = (me
            .to_array()
            .iter()
            .fold(0u64, |a, v| a << 16 | u64::from(*v))
            << 16)
            ^ (now.as_nanos() << 8)
            ^ self.next_id;
        let t = Transfer {
            id,
            root: me,
            size,
            chunk,
            service: req.service,
        };
        let trees = view_of(node).map(|v| Trees::build(&v, me));
        let r = RootState {
            source: req.data,
            members: members.clone(),
            outcome: HashMap::new(),
            progress: HashMap::new(),
            lost: HashSet::new(),
            broken: None,
            sum: FOLD_START,
            polled: now,
            started: now,
            deadline: now + req.timeout,
            reply: req.reply,
        };
        let x = Xfer::new(t, Role::Root(Box::new(r)), now, trees);
        // Every reachable server learns whether it is a member; then the chunks, tree by
        // tree in turn, so all the root's links start at once.
        let group: HashSet<Coord> = members.iter().copied().collect();
        for c in node.dims().coords() {
            if c != me && node.is_reachable(c) {
                let m = Msg::Start {
                    t,
                    member: group.contains(&c),
                };
                self.ctl.push_back((c, m.encode()));
            }
        }
        self.xfers.insert(id, x);
        self.order.push_back(id);
        self.release(id, node);
        if members.is_empty() {
            self.maybe_finish(now, id, node);
        }
    }

    /// The root releases chunks into the trees, in order, up to a window beyond its
    /// slowest member.
    fn release(&mut self, id: u64, node: &dyn Engine) {
        let me = node.local();
        let Some(x) = self.xfers.get_mut(&id) else {
            return;
        };
        let window = (self.window / u64::from(x.t.chunk.max(1))).clamp(4, u64::from(u32::MAX));
        let chunks = x.chunks();
        let Some(r) = x.root() else { return };
        let until = (u64::from(r.floor(chunks, node)) + window).min(u64::from(chunks)) as u32;
        let mut scratch = Vec::new();
        while x.delivered < until {
            let i = x.delivered;
            let range = x.chunk_range(i);
            scratch.resize(range.len(), 0);
            if let Some(r) = x.root_mut() {
                if !r.source.read(range.start as u64, &mut scratch) {
                    // The transfer ends at the next poll, with this error.
                    r.broken = Some(format!("the source could not be read at {}", range.start));
                    r.deadline = Time::ZERO;
                    return;
                }
                r.sum = fold(r.sum, &scratch);
            }
            x.delivered = i + 1;
            let tree = x.tree_of(i);
            for c in x.children(tree, me) {
                x.queue(c, i);
            }
        }
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
            {
                self.stats.malformed += 1;
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
        let me = node.local();
        let Some(m) = Msg::decode(data) else {
            self.stats.malformed += 1;
            return;
        };
        match m {
            Msg::Start { t, member } => {
                if !self.join(now, &t, node) {
                    return;
                }
                let Some(x) = self.xfers.get_mut(&t.id) else {
                    return;
                };
                x.touched = now;
                if matches!(x.role, Role::Unknown) {
                    x.role = if !member {
                        Role::Relay
                    } else if t.service == 0 {
                        Role::Member(None)
                    } else {
                        match self.sinks.as_mut().map(|s| s.open(&t)) {
                            Some(Ok(sink)) => Role::Member(Some(sink)),
                            Some(Err(e)) => Role::Refused(e),
                            None => Role::Refused(format!(
                                "this server delivers multicasts to no service (asked for {})",
                                t.service
                            )),
                        }
                    };
                    if let Role::Refused(reason) = &x.role {
                        self.stats.refused += 1;
                        let m = Msg::Refused { id: t.id, reason }.encode();
                        self.ctl.push_back((t.root, m));
                    }
                } else if let Role::Refused(reason) = &x.role {
                    // The root asks again: it did not hear why.
                    let m = Msg::Refused { id: t.id, reason }.encode();
                    self.ctl.push_back((t.root, m));
                } else if x.is_member() && x.done_sent {
                    // The root has not heard our `Done`: it was lost.
                    x.done_sent = false;
                    self.stats.redone += 1;
                    self.stats.completed = self.stats.completed.saturating_sub(1);
                }
                self.deliver(now, t.id);
            }
            Msg::Data { t, index, data } => {
                if !self.join(now, &t, node) {
                    return;
                }
                let Some(x) = self.xfers.get_mut(&t.id) else {
                    return;
                };
                x.touched = now;
                if index >= x.chunks() || data.len() != x.chunk_range(index).len() {
                    self.stats.malformed += 1;
                    return;
                }
                if x.have[index as usize] || x.root().is_some() {
                    self.stats.duplicates += 1;
                    return;
                }
                x.have[index as usize] = true;
                x.missing -= 1;
                x.stalled_at = now;
                x.held.insert(
                    index,
                    Held {
                        data: data.to_vec(),
                        sends: 0,
                    },
                );
                self.stats.held_bytes += data.len() as u64;
                self.stats.held_max = self.stats.held_max.max(self.stats.held_bytes);
                let tree = x.tree_of(index);
                for c in x.children(tree, me) {
                    x.queue(c, index);
                }
                self.stats.chunks_in += 1;
                // A relay's chunk with no children to go to goes at once.
                x.settle(index, &mut self.stats.held_bytes);
                self.deliver(now, t.id);
            }
            Msg::Have { t, tree, bits } => {
                if !self.join(now, &t, node) {
                    return;
                }
                let Some(x) = self.xfers.get_mut(&t.id) else {
                    return;
                };
                let tree = usize::from(tree);
                let k = x.trees.as_ref().map_or(1, Trees::count).max(1);
                if tree >= k {
                    self.stats.malformed += 1;
                    return;
                }
                x.touched = now;
                if x.root().is_none() && x.missing == x.chunks() && x.adopted.is_empty() {
                    // Joined just now, from a child's request: this server's own parents
                    // have never sent it anything, so it asks them at once.
                    x.stalled_at = now;
                    Self::ask_parents(&mut self.ctl, x, me);
                }
                x.adopted.insert((tree, src));
                let mut i = tree as u32;
                let mut j = 0usize;
                while i < x.chunks() {
                    let held = bits.get(j / 8).is_some_and(|b| b & (1 << (j % 8)) != 0);
                    if !held && x.queue(src, i) {
                        self.stats.resent += 1;
                    }
                    i += k as u32;
                    j += 1;
                }
            }
            Msg::Want { t, from, bits } => {
                let window = self.window_chunks(t.chunk);
                let Some(x) = self.xfers.get_mut(&t.id) else {
                    return;
                };
                if x.t != t || x.root().is_none() {
                    self.stats.malformed += 1;
                    return;
                }
                let n = (bits.len() as u64 * 8).min(u64::from(window)) as u32;
                for j in 0..n {
                    let held = bits[j as usize / 8] & (1 << (j % 8)) != 0;
                    let Some(i) = from.checked_add(j) else { break };
                    if !held && x.queue(src, i) {
                        self.stats.repaired += 1;
                    }
                }
            }
            Msg::Progress { id, delivered } => {
                let Some(r) = self.xfers.get_mut(&id).and_then(Xfer::root_mut) else {
                    return;
                };
                if r.members.contains(&src) {
                    let p = r.progress.entry(src).or_insert(0);
                    *p = (*p).max(delivered);
                }
                self.release(id, node);
            }
            Msg::Done { id, checksum } => {
                let Some(r) = self.xfers.get_mut(&id).and_then(Xfer::root_mut) else {
                    return;
                };
                if r.members.contains(&src) {
                    let ok = checksum == r.sum;
                    r.outcome.entry(src).or_insert(Outcome::Done {
                        at: now,
                        checksum_ok: ok,
                    });
                }
                self.release(id, node);
                self.maybe_finish(now, id, node);
            }
            Msg::Refused { id, reason } => {
                let Some(r) = self.xfers.get_mut(&id).and_then(Xfer::root_mut) else {
                    return;
                };
                if r.members.contains(&src) {
                    r.outcome.entry(src).or_insert(Outcome::Refused {
                        at: now,
                        reason: reason.to_string(),
                    });
                }
                self.release(id, node);
                self.maybe_finish(now, id, node);
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

    /// A member delivers what it holds in order, reports its progress, and tells the root
    /// once it delivered everything; a relay lets go of what it has forwarded.
    fn deliver(&mut self, now: Time, id: u64) {
        let window = match self.xfers.get(&id) {
            Some(x) => self.window_chunks(x.t.chunk),
            None => return,
        };
        let Some(x) = self.xfers.get_mut(&id) else {
            return;
        };
        let chunks = x.chunks();
        match &mut x.role {
            Role::Member(sink) => {
                let start = x.delivered;
                while let Some(h) = x.held.get(&x.delivered) {
                    let offset = u64::from(x.delivered) * u64::from(x.t.chunk);
                    if let Some(s) = sink.as_mut() {
                        if !s.deliver(&x.t, offset, &h.data) {
                            break;
                        }
                    }
                    x.sum = fold(x.sum, &h.data);
                    if h.sends == 0 {
                        if let Some(h) = x.held.remove(&x.delivered) {
                            self.stats.held_bytes =
                                self.stats.held_bytes.saturating_sub(h.data.len() as u64);
                        }
                    }
                    x.delivered += 1;
                }
                if x.delivered > start {
                    x.stalled_at = now;
                }
                let step = (window / 4).max(1);
                if x.delivered >= x.reported + step
                    || (x.delivered == chunks && x.reported < x.delivered)
                {
                    x.reported = x.delivered;
                    let m = Msg::Progress {
                        id,
                        delivered: x.delivered,
                    };
                    self.ctl.push_back((x.t.root, m.encode()));
                }
                if x.delivered == chunks && !x.done_sent {
                    x.done_sent = true;
                    self.stats.completed += 1;
                    let m = Msg::Done {
                        id,
                        checksum: x.sum,
                    }
                    .encode();
                    self.ctl.push_back((x.t.root, m));
                    if !x.ended {
                        x.ended = true;
                        if let Some(s) = sink.as_mut() {
                            s.end(&x.t, true);
                        }
                    }
                }
            }
            Role::Relay | Role::Refused(_) => {
                let gone: Vec<u32> = x
                    .held
                    .iter()
                    .filter(|(_, h)| h.sends == 0)
                    .map(|(i, _)| *i)
                    .collect();
                for i in gone {
                    if let Some(h) = x.held.remove(&i) {
                        self.stats.held_bytes =
                            self.stats.held_bytes.saturating_sub(h.data.len() as u64);
                    }
                }
            }
            Role::Unknown | Role::Root(_) => {}
        }
    }

    /// Drops a transfer here (it ended, or was forgotten): its sink hears it ended.
    fn forget(&mut self, id: u64) {
        if let Some(mut x) = self.xfers.remove(&id) {
            let held: u64 = x.held.values().map(|h| h.data.len() as u64).sum();
            self.stats.held_bytes = self.stats.held_bytes.saturating_sub(held);
            if let Role::Member(Some(s)) = &mut x.role {
                if !x.ended {
                    s.end(&x.t, false);
                }
            }
        }
        self.order.retain(|i| *i != id);
    }

    /// The root ends a transfer every reachable member has reported on, or at its deadline.
    fn maybe_finish(&mut self, now: Time, id: u64, node: &mut dyn Engine) {
        let Some(x) = self.xfers.get_mut(&id) else {
            return;
        };
        let Role::Root(r) = &mut x.role else { return };
        if r.waiting(node) > 0 && now < r.deadline {
            return;
        }
        let Some(x) = self.xfers.remove(&id) else {
            return;
        };
        let Role::Root(r) = x.role else { return };
        let mut v = r.report(now, x.t.size);
        v["id"] = json!(format!("{id:016x}"));
        v["root"] = json!(x.t.root.to_string());
        v["chunk"] = json!(x.t.chunk);
        v["service"] = json!(x.t.service);
        let trees = x.trees.as_ref();
        v["trees"] = json!(trees.map_or(0, Trees::count));
        v["tree_depth"] =
            json!(trees.map_or(0, |t| (0..t.count()).map(|k| t.depth(k)).max().unwrap_or(0)));
        v["shared_edges"] = json!(trees.map_or(0, Trees::shared_edges));
        let _ = r.reply.send(v);
        for c in node.dims().coords() {
            if c != node.local() && node.is_reachable(c) {
                self.ctl.push_back((c, Msg::End { id }.encode()));
            }
        }
        self.order.retain(|i| *i != id);
        self.remember_ended(id);
    }

    fn remember_ended(&mut self, id: u64) {
        if self.ended.len() >= ENDED {
            self.ended.pop_front();
        }
        self.ended.push_back(id);
    }

    /// The root sends `Start` again to every reachable member that has not reported.
    fn repoll(&mut self, now: Time, node: &dyn Engine) {
        for x in self.xfers.values_mut() {
            let t = x.t;
            let Some(r) = x.root_mut() else { continue };
            if now.since(r.polled) < STALL {
                continue;
            }
            r.polled = now;
            for m in &r.members {
                if !r.outcome.contains_key(m) && node.is_reachable(*m) {
                    let msg = Msg::Start { t, member: true };
                    self.ctl.push_back((*m, msg.encode()));
                    self.stats.repolled += 1;
                }
            }
        }
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

    /// Tells this server's parent in every tree what it holds of that tree's chunks, for
    /// the trees it lacks chunks of.
    fn ask_parents(ctl: &mut VecDeque<(Coord, Vec<u8>)>, x: &Xfer, me: Coord) {
        let Some(trees) = x.trees.as_ref() else {
            return;
        };
        let k = trees.count().max(1);
        for t in 0..k {
            let Some(p) = trees.parent(t, me) else {
                continue;
            };
            let mut bits = Vec::new();
            let mut lacking = false;
            let mut i = t as u32;
            let mut j = 0usize;
            while i < x.chunks() {
                if j / 8 >= bits.len() {
                    bits.push(0u8);
                }
                if x.have[i as usize] {
                    bits[j / 8] |= 1 << (j % 8);
                } else {
                    lacking = true;
                }
                i += k as u32;
                j += 1;
            }
            if lacking {
                ctl.push_back((
                    p,
                    Msg::Have {
                        t: x.t,
                        tree: t as u8,
                        bits: &bits,
                    }
                    .encode(),
                ));
            }
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
                None if x.delivered < x.chunks() || x.missing > 0 => Some(x.stalled_at + STALL),
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
