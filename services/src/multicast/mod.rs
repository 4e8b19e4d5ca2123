//! `multicast` (service 9): CamCube's file distribution (CamCubeOS paper 6.1). The root cuts
//! the bytes into chunks and sends chunk `i` down tree `i % k` of the
//! [`Trees`](torusnet_proto::trees::Trees) rooted at it (one tree per link direction, each
//! edge one link, no link carrying two trees when nothing failed), so the root sends on all
//! its links and every server receives on all of its. Every server keeps what it receives
//! and forwards each chunk to its children in that chunk's tree.
//!
//! Reliability is per edge, not end to end: each chunk travels parent to child as a
//! reliable message, so a lost frame is re-sent by the parent's transport; a message the
//! transport reports failed (the child restarted or went silent) is queued again while the
//! child is still a child. When the view changes, every server rebuilds the trees (after a
//! short settling time) and tells each new parent what it holds of that tree (`Have`); the
//! parent sends what is missing and adopts it as a child. Members report the checksum of
//! what they hold to the root; the transfer ends when every member still reachable has
//! reported, or at its deadline. Relays (servers outside the group) forward but do not
//! report. Until the view settles, an edge whose link failed is carried over a detour by
//! the routing (the extra hops are counted).
//!
//! No control message is trusted to arrive once: a `Start` or `Done` may be reported failed
//! (the peer went silent for a while, as a starved daemon does) or refused (the peer was
//! unreachable for a moment). So the root sends `Start` again, once a second, to every
//! reachable member that has not reported, and a member that holds everything answers
//! with its `Done` again; a member that lacks chunks asks its parents again every second;
//! a parent that never heard of the transfer joins it from the child's `Have`. A loss
//! costs a second, never the transfer. Servers remember the transfers that ended, so a
//! late message does not bring one back.

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

use crate::builtin::fnv as checksum;
use wire::{Msg, Transfer};

/// Service id of the multicast service.
pub const MCAST: u16 = 9;
/// Default chunk size (bytes per message).
pub const DEFAULT_CHUNK: u32 = 256 * 1024;
/// Largest transfer a server accepts (it keeps all of it in memory).
pub const MAX_SIZE: u64 = 8 << 30;
/// How long the view must stay unchanged before the trees are rebuilt.
const SETTLE: Duration = Duration::from_millis(150);
/// A member that received nothing for this long asks its parents for what it lacks.
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

/// A multicast to start at this server (the root).
#[derive(Debug)]
pub struct MulticastRequest {
    /// The members (`None`: every other server).
    pub group: Option<Vec<Coord>>,
    /// The bytes.
    pub data: Arc<Vec<u8>>,
    /// Bytes per chunk.
    pub chunk: u32,
    /// The transfer ends by then.
    pub timeout: Duration,
    /// Where the result goes.
    pub reply: Sender<Value>,
}

#[derive(Debug)]
enum Buf {
    Shared(Arc<Vec<u8>>),
    Own(Vec<u8>),
}

impl Buf {
    fn bytes(&self) -> &[u8] {
        match self {
            Buf::Shared(a) => a,
            Buf::Own(v) => v,
        }
    }
}

#[derive(Debug)]
struct RootState {
    members: Vec<Coord>,
    done: HashMap<Coord, (Time, bool)>,
    /// Members that had not reported and were unreachable when last looked at.
    lost: HashSet<Coord>,
    /// When the members that have not reported were last sent `Start` again.
    polled: Time,
    started: Time,
    deadline: Time,
    reply: Sender<Value>,
}

#[derive(Debug)]
struct Xfer {
    t: Transfer,
    buf: Buf,
    have: Vec<bool>,
    missing: u32,
    member: Option<bool>,
    done_sent: bool,
    /// The checksum of the bytes, once all are held (a `Done` may have to be sent again).
    sum: Option<u64>,
    trees: Option<Trees>,
    adopted: HashSet<(usize, Coord)>,
    out: VecDeque<(Coord, u32)>,
    touched: Time,
    /// When a chunk last arrived (or the parents were last asked): a transfer that stops
    /// progressing asks its parents again.
    stalled_at: Time,
    root: Option<RootState>,
}

impl Xfer {
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
    /// Malformed or out-of-range messages dropped.
    pub malformed: u64,
    /// Messages the transport refused for good (their server unreachable, ...), and chunks
    /// not sent because their child was unreachable: a member missing chunks asks its
    /// parents again, and the root sends `Start` again to members that did not report.
    pub send_failed: u64,
    /// Tree rebuilds after view changes.
    pub rebuilds: u64,
    /// Transfers completed here as a member.
    pub completed: u64,
    /// Times this server asked its parents again after a second without progress.
    pub asked: u64,
    /// `Start`s the root sent again to members that had not reported.
    pub repolled: u64,
    /// `Done`s sent again, in answer to a `Start` for a transfer held whole.
    pub redone: u64,
    /// Messages for transfers that had ended here, ignored.
    pub late: u64,
}

/// The multicast service of one server.
#[derive(Debug, Default)]
pub struct Multicast {
    xfers: HashMap<u64, Xfer>,
    order: VecDeque<u64>,
    next_id: u64,
    rebuild_at: Option<Time>,
    /// Control messages (Start, Have, Done, End) waiting for room in the transport: they
    /// go before any chunk and are never dropped for want of room.
    ctl: VecDeque<(Coord, Vec<u8>)>,
    /// The transfers that ended here, newest last (at most [`ENDED`]).
    ended: VecDeque<u64>,
    /// Counters.
    pub stats: McastStats,
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
    fn start(&mut self, now: Time, req: MulticastRequest, node: &mut dyn Engine) {
        let me = node.local();
        let size = req.data.len() as u64;
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
            checksum: checksum(&req.data),
        };
        let chunks = size.div_ceil(u64::from(chunk)) as u32;
        let trees = view_of(node).map(|v| Trees::build(&v, me));
        let mut x = Xfer {
            t,
            buf: Buf::Shared(req.data),
            have: vec![true; chunks as usize],
            missing: 0,
            member: Some(false),
            done_sent: true,
            sum: Some(t.checksum),
            trees,
            adopted: HashSet::new(),
            out: VecDeque::new(),
            touched: now,
            stalled_at: now,
            root: Some(RootState {
                members: members.clone(),
                done: HashMap::new(),
                lost: HashSet::new(),
                polled: now,
                started: now,
                deadline: now + req.timeout,
                reply: req.reply,
            }),
        };
        // Every reachable server learns whether it is a member; then the chunks, tree by
        // tree in turn, so all the root's links start at once.
        let group: HashSet<Coord> = members.iter().copied().collect();
        let everyone: Vec<Coord> = node
            .dims()
            .coords()
            .filter(|c| *c != me && node.is_reachable(*c))
            .collect();
        for c in everyone {
            let m = Msg::Start {
                t,
                member: group.contains(&c),
            }
            .encode();
            self.ctl.push_back((c, m));
        }
        for i in 0..chunks {
            let tree = x.tree_of(i);
            for c in x.children(tree, me) {
                x.out.push_back((c, i));
            }
        }
        self.xfers.insert(id, x);
        self.order.push_back(id);
    }

    fn xfer_for(&mut self, now: Time, t: &Transfer, node: &dyn Engine) -> Option<&mut Xfer> {
        if !self.xfers.contains_key(&t.id) {
            if self.ended.contains(&t.id) {
                self.stats.late += 1;
                return None;
            }
            let chunks = t.size.div_ceil(u64::from(t.chunk.max(1)));
            if t.size == 0
                || t.size > MAX_SIZE
                || t.chunk < 1024
                || t.chunk > 1 << 20
                || chunks > u64::from(u32::MAX)
            {
                self.stats.malformed += 1;
                return None;
            }
            let view = view_of(node);
            self.xfers.insert(
                t.id,
                Xfer {
                    t: *t,
                    buf: Buf::Own(vec![0u8; t.size as usize]),
                    have: vec![false; chunks as usize],
                    missing: chunks as u32,
                    member: None,
                    done_sent: false,
                    sum: None,
                    trees: view.map(|v| Trees::build(&v, t.root)),
                    adopted: HashSet::new(),
                    out: VecDeque::new(),
                    touched: now,
                    stalled_at: now,
                    root: None,
                },
            );
            self.order.push_back(t.id);
        }
        let x = self.xfers.get_mut(&t.id)?;
        (x.t == *t).then_some(x)
    }

    fn on_message(&mut self, now: Time, src: Coord, data: &[u8], node: &mut dyn Engine) {
        let me = node.local();
        let Some(m) = Msg::decode(data) else {
            self.stats.malformed += 1;
            return;
        };
        match m {
            Msg::Start { t, member } => {
                let Some(x) = self.xfer_for(now, &t, node) else {
                    return;
                };
                x.member = Some(member);
                x.touched = now;
                if member && x.done_sent && x.missing == 0 {
                    // The root has not heard our `Done`: it was lost.
                    x.done_sent = false;
                    self.stats.redone += 1;
                    self.stats.completed = self.stats.completed.saturating_sub(1);
                }
                self.maybe_done(t.id);
            }
            Msg::Data { t, index, data } => {
                let Some(x) = self.xfer_for(now, &t, node) else {
                    return;
                };
                x.touched = now;
                if index >= x.chunks() || data.len() != x.chunk_range(index).len() {
                    self.stats.malformed += 1;
                    return;
                }
                if x.have[index as usize] {
                    self.stats.duplicates += 1;
                    return;
                }
                let r = x.chunk_range(index);
                if let Buf::Own(b) = &mut x.buf {
                    b[r].copy_from_slice(data);
                }
                x.have[index as usize] = true;
                x.missing -= 1;
                x.stalled_at = now;
                let tree = x.tree_of(index);
                for c in x.children(tree, me) {
                    x.out.push_back((c, index));
                }
                self.stats.chunks_in += 1;
                self.maybe_done(t.id);
            }
            Msg::Have { t, tree, bits } => {
                if self.xfer_for(now, &t, node).is_none() {
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
                if x.root.is_none() && x.missing == x.chunks() && x.adopted.is_empty() {
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
                    if !held && x.have[i as usize] {
                        x.out.push_back((src, i));
                        self.stats.resent += 1;
                    }
                    i += k as u32;
                    j += 1;
                }
            }
            Msg::Done { id, checksum } => {
                let Some(x) = self.xfers.get_mut(&id) else {
                    return;
                };
                let Some(r) = x.root.as_mut() else { return };
                if r.members.contains(&src) {
                    r.done.entry(src).or_insert((now, checksum == x.t.checksum));
                }
                self.maybe_finish(now, id, node);
            }
            Msg::End { id } => {
                if self.xfers.get(&id).is_some_and(|x| x.root.is_none()) {
                    self.xfers.remove(&id);
                    self.order.retain(|i| *i != id);
                }
                if !self.ended.contains(&id) {
                    self.remember_ended(id);
                }
            }
        }
    }

    /// A member that holds everything tells the root.
    fn maybe_done(&mut self, id: u64) {
        let Some(x) = self.xfers.get_mut(&id) else {
            return;
        };
        if x.missing > 0 || x.done_sent || x.member != Some(true) {
            return;
        }
        x.done_sent = true;
        self.stats.completed += 1;
        let sum = *x.sum.get_or_insert_with(|| checksum(x.buf.bytes()));
        let m = Msg::Done { id, checksum: sum }.encode();
        let root = x.t.root;
        self.ctl.push_back((root, m));
    }

    /// The root ends a transfer every reachable member completed, or at its deadline.
    fn maybe_finish(&mut self, now: Time, id: u64, node: &mut dyn Engine) {
        let Some(x) = self.xfers.get_mut(&id) else {
            return;
        };
        let Some(r) = x.root.as_mut() else { return };
        // A member down for a moment is waited for again once it is back (it hears `Start`
        // again): only the members unreachable now are given up.
        r.lost = r
            .members
            .iter()
            .filter(|m| !r.done.contains_key(m) && !node.is_reachable(**m))
            .copied()
            .collect();
        let waiting = r
            .members
            .iter()
            .filter(|m| !r.done.contains_key(m) && !r.lost.contains(m))
            .count();
        if waiting > 0 && now < r.deadline {
            return;
        }
        let Some(x) = self.xfers.remove(&id) else {
            return;
        };
        let Some(r) = x.root else { return };
        let size = x.t.size as f64;
        let mut per: Vec<Value> = Vec::new();
        let mut gbps: Vec<f64> = Vec::new();
        let mut bad = Vec::new();
        for m in &r.members {
            if let Some((at, ok)) = r.done.get(m) {
                let s = at.since(r.started).as_secs_f64().max(1e-9);
                gbps.push(size * 8.0 / s / 1e9);
                if !ok {
                    bad.push(m.to_string());
                }
                per.push(json!({"member": m.to_string(), "seconds": s, "gbps": size * 8.0 / s / 1e9, "checksum_ok": ok}));
            }
        }
        gbps.sort_by(f64::total_cmp);
        let incomplete: Vec<String> = r
            .members
            .iter()
            .filter(|m| !r.done.contains_key(m) && !r.lost.contains(m))
            .map(|m| m.to_string())
            .collect();
        let lost: Vec<String> = r.lost.iter().map(|m| m.to_string()).collect();
        let trees = x.trees.as_ref();
        let mut v = json!({
            "id": format!("{id:016x}"),
            "root": x.t.root.to_string(),
            "size": x.t.size,
            "chunk": x.t.chunk,
            "checksum": format!("{:016x}", x.t.checksum),
            "members": r.members.len(),
            "completed": r.done.len(),
            "lost": lost,
            "incomplete": incomplete,
            "checksum_mismatch": bad,
            "elapsed_s": now.since(r.started).as_secs_f64(),
            "min_member_gbps": gbps.first().copied().unwrap_or(0.0),
            "median_member_gbps": gbps.get(gbps.len() / 2).copied().unwrap_or(0.0),
            "trees": trees.map_or(0, Trees::count),
            "tree_depth": trees.map_or(0, |t| (0..t.count()).map(|k| t.depth(k)).max().unwrap_or(0)),
            "shared_edges": trees.map_or(0, Trees::shared_edges),
            "per_member": per,
        });
        if !incomplete.is_empty() {
            v["error"] = json!(format!(
                "{} member(s) incomplete at the deadline: {}",
                incomplete.len(),
                incomplete.join(" ")
            ));
        } else if !bad.is_empty() {
            v["error"] = json!("checksum mismatch");
        }
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
            let Some(r) = x.root.as_mut() else { continue };
            if now.since(r.polled) < STALL {
                continue;
            }
            r.polled = now;
            for m in &r.members {
                if !r.done.contains_key(m) && node.is_reachable(*m) {
                    let msg = Msg::Start {
                        t: x.t,
                        member: true,
                    };
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
            let new = view.as_ref().map(|v| Trees::build(v, x.t.root));
            let k = new.as_ref().map_or(0, Trees::count);
            let old_parents: Vec<Option<Coord>> = (0..k)
                .map(|t| x.trees.as_ref().and_then(|tr| tr.parent(t, me)))
                .collect();
            x.trees = new;
            x.adopted.retain(|(_, c)| node.is_reachable(*c));
            if x.root.is_some() || x.missing == 0 {
                continue;
            }
            // Every parent hears what this server still lacks of its tree: a new parent
            // never sent it anything, and an old one may have forwarded by other trees (a
            // server that joined the transfer after the failure built its trees from the
            // new view already).
            let _ = old_parents;
            x.stalled_at = now;
            Self::ask_parents(&mut self.ctl, x, me);
        }
        let roots: Vec<u64> = self
            .xfers
            .iter()
            .filter(|(_, x)| x.root.is_some())
            .map(|(k, _)| *k)
            .collect();
        for id in roots {
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
            if !x.have[i as usize] {
                continue;
            }
            if !node.is_reachable(c) {
                self.stats.send_failed += 1;
                continue;
            }
            let r = x.chunk_range(i);
            let m = Msg::Data {
                t: x.t,
                index: i,
                data: &x.buf.bytes()[r.clone()],
            }
            .encode();
            let tag = (id & 0xffff_ffff) << 32 | u64::from(i);
            match node.send(now, Target::Server(c), MCAST, &m, opts(tag)) {
                Ok(()) => {
                    sent += 1;
                    self.stats.chunks_out += 1;
                    self.stats.bytes_out += r.len() as u64;
                    if let Some(d) = node.distance(c) {
                        self.stats.detour_hops += u64::from(d.saturating_sub(1));
                    }
                }
                Err(SendError::WouldBlock) => {
                    x.out.push_front((c, i));
                    break;
                }
                Err(_) => self.stats.send_failed += 1,
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
                json!({
                    "id": format!("{:016x}", x.t.id),
                    "root": x.t.root.to_string(),
                    "size": x.t.size,
                    "missing_chunks": x.missing,
                    "member": x.member,
                    "queued": x.out.len(),
                })
            })
            .collect();
        json!({"stats": self.stats, "transfers": xfers})
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
                        if node.is_reachable(*peer) && i < x.chunks() {
                            x.out.push_back((*peer, i));
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
        let me = node.local();
        for x in self.xfers.values_mut() {
            if x.root.is_none() && x.missing > 0 && now.since(x.stalled_at) >= STALL {
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
            .filter(|(_, x)| x.root.as_ref().is_some_and(|r| now >= r.deadline))
            .map(|(k, _)| *k)
            .collect();
        for id in late {
            self.maybe_finish(now, id, node);
            work += 1;
        }
        let idle: Vec<u64> = self
            .xfers
            .iter()
            .filter(|(_, x)| x.root.is_none() && now.since(x.touched) >= IDLE)
            .map(|(k, _)| *k)
            .collect();
        for id in idle {
            self.xfers.remove(&id);
            self.order.retain(|i| *i != id);
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
            .filter_map(|x| match &x.root {
                Some(r) => Some(r.deadline.min(r.polled + STALL)),
                None if x.missing > 0 => Some(x.stalled_at + STALL),
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
