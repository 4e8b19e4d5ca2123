//! The root's side of a transfer: its bytes, the window it sends ahead of its slowest
//! member, the repairs it sends, what each member reported, and the report that ends the
//! transfer.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::Sender;
use std::sync::Arc;

use serde_json::{json, Value};
use torusnet_proto::service::Engine;
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::trees::Trees;

use super::wire::{Msg, Transfer};
use super::xfer::{Role, Xfer};
use super::{fold, view_of, Multicast, MulticastRequest, Source, FOLD_START, MAX_SIZE, STALL};

/// What a member told the root about its end of the transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    /// It delivered every byte; whether its checksum equals the root's.
    Done { at: Time, checksum_ok: bool },
    /// It cannot deliver (no application there hosts the service), and why.
    Refused { at: Time, reason: String },
}

#[derive(Debug)]
pub(super) struct RootState {
    pub(super) source: Arc<dyn Source>,
    pub(super) members: Vec<Coord>,
    pub(super) outcome: HashMap<Coord, Outcome>,
    /// Chunks each member delivered in order, as it last reported.
    pub(super) progress: HashMap<Coord, u32>,
    /// Members that had not reported and were unreachable when last looked at.
    pub(super) lost: HashSet<Coord>,
    /// Why the transfer cannot go on (its source failed), if it cannot.
    pub(super) broken: Option<String>,
    /// The checksum of the released chunks (in order: the whole transfer's once all are).
    pub(super) sum: u64,
    /// When the members that have not reported were last sent `Start` again.
    pub(super) polled: Time,
    pub(super) started: Time,
    pub(super) deadline: Time,
    pub(super) reply: Sender<Value>,
}

impl RootState {
    /// Whether `m` still holds the transfer back: a member that has not ended, is not given
    /// up, and is reachable.
    pub(super) fn waits_for(&self, m: Coord, node: &dyn Engine) -> bool {
        !self.outcome.contains_key(&m) && node.is_reachable(m)
    }

    /// The chunks the slowest member still in the transfer has delivered (`chunks` when
    /// none is left): the root sends at most a window beyond it.
    pub(super) fn floor(&self, chunks: u32, node: &dyn Engine) -> u32 {
        self.members
            .iter()
            .filter(|m| self.waits_for(**m, node))
            .map(|m| self.progress.get(m).copied().unwrap_or(0))
            .min()
            .unwrap_or(chunks)
    }

    /// Members still to be heard from (reachable ones; the unreachable are given up).
    pub(super) fn waiting(&mut self, node: &dyn Engine) -> usize {
        // A member down for a moment is waited for again once it is back (it hears `Start`
        // again): only the members unreachable now are given up.
        self.lost = self
            .members
            .iter()
            .filter(|m| !self.outcome.contains_key(m) && !node.is_reachable(**m))
            .copied()
            .collect();
        self.members
            .iter()
            .filter(|m| self.waits_for(**m, node))
            .count()
    }

    /// The report the transfer ends with: one entry per member (complete, refused, lost,
    /// incomplete) and the figures.
    pub(super) fn report(&self, now: Time, size: u64) -> Value {
        let mut per: Vec<Value> = Vec::new();
        let mut gbps: Vec<f64> = Vec::new();
        let (mut bad, mut refused, mut lost, mut incomplete) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for m in &self.members {
            let e = match self.outcome.get(m) {
                Some(Outcome::Done { at, checksum_ok }) => {
                    let s = at.since(self.started).as_secs_f64().max(1e-9);
                    gbps.push(size as f64 * 8.0 / s / 1e9);
                    if !checksum_ok {
                        bad.push(m.to_string());
                    }
                    json!({"member": m.to_string(), "outcome": "complete", "seconds": s,
                        "gbps": size as f64 * 8.0 / s / 1e9, "checksum_ok": checksum_ok})
                }
                Some(Outcome::Refused { at, reason }) => {
                    refused.push(m.to_string());
                    json!({"member": m.to_string(), "outcome": "refused", "reason": reason,
                        "seconds": at.since(self.started).as_secs_f64()})
                }
                None if self.lost.contains(m) => {
                    lost.push(m.to_string());
                    json!({"member": m.to_string(), "outcome": "lost",
                        "reason": "unreachable", "delivered_chunks": self.progress.get(m)})
                }
                None => {
                    incomplete.push(m.to_string());
                    json!({"member": m.to_string(), "outcome": "incomplete",
                        "reason": "the deadline passed", "delivered_chunks": self.progress.get(m)})
                }
            };
            per.push(e);
        }
        gbps.sort_by(f64::total_cmp);
        let completed = self
            .outcome
            .values()
            .filter(|o| matches!(o, Outcome::Done { .. }))
            .count();
        let mut v = json!({
            "size": size,
            "checksum": format!("{:016x}", self.sum),
            "members": self.members.len(),
            "completed": completed,
            "lost": lost,
            "refused": refused,
            "incomplete": incomplete,
            "checksum_mismatch": bad,
            "elapsed_s": now.since(self.started).as_secs_f64(),
            "min_member_gbps": gbps.first().copied().unwrap_or(0.0),
            "median_member_gbps": gbps.get(gbps.len() / 2).copied().unwrap_or(0.0),
            "per_member": per,
        });
        if let Some(e) = &self.broken {
            v["error"] = json!(e);
        } else if !incomplete.is_empty() {
            v["error"] = json!(format!(
                "{} member(s) incomplete at the deadline: {}",
                incomplete.len(),
                incomplete.join(" ")
            ));
        } else if !bad.is_empty() {
            v["error"] = json!("checksum mismatch");
        }
        v
    }
}

impl Multicast {
    /// `Want`: a member lacks chunks of its window that its parents may no longer hold; the
    /// root sends them straight to it.
    pub(super) fn on_want(
        &mut self,
        src: Coord,
        t: &Transfer,
        from: u32,
        bits: &[u8],
        node: &dyn Engine,
    ) {
        let window = self.window_chunks(t.chunk);
        let Some(x) = self.xfers.get_mut(&t.id) else {
            return;
        };
        if x.t != *t || x.root().is_none() {
            self.stats.malformed += 1;
            return;
        }
        // A Want also says how far the member got: its Progress may have been lost, and a
        // window held back by a lost report would never move again.
        if let Some(r) = x.root_mut() {
            if r.members.contains(&src) {
                let p = r.progress.entry(src).or_insert(0);
                *p = (*p).max(from);
            }
        }
        let n = (bits.len() as u64 * 8).min(u64::from(window)) as u32;
        for j in 0..n {
            let held = bits[j as usize / 8] & (1 << (j % 8)) != 0;
            let Some(i) = from.checked_add(j) else { break };
            if !held && x.queue(src, i) {
                self.stats.repaired += 1;
            }
        }
        self.release(t.id, node);
    }

    /// `Progress`: a member delivered `delivered` chunks in order; the window may move.
    pub(super) fn on_progress(&mut self, src: Coord, id: u64, delivered: u32, node: &dyn Engine) {
        let Some(r) = self.xfers.get_mut(&id).and_then(Xfer::root_mut) else {
            return;
        };
        if r.members.contains(&src) {
            let p = r.progress.entry(src).or_insert(0);
            *p = (*p).max(delivered);
        }
        self.release(id, node);
    }

    /// `Done` or `Refused`: a member's end of the transfer (its first report counts).
    pub(super) fn on_outcome(
        &mut self,
        now: Time,
        src: Coord,
        id: u64,
        node: &mut dyn Engine,
        outcome: impl FnOnce(&RootState) -> Outcome,
    ) {
        let Some(r) = self.xfers.get_mut(&id).and_then(Xfer::root_mut) else {
            return;
        };
        if r.members.contains(&src) && !r.outcome.contains_key(&src) {
            let o = outcome(r);
            r.outcome.insert(src, o);
        }
        self.release(id, node);
        self.maybe_finish(now, id, node);
    }

    pub(super) fn start(&mut self, now: Time, req: MulticastRequest, node: &mut dyn Engine) {
        let me = node.local();
        let size = req.data.len();
        let chunk = req.chunk.clamp(1024, 1 << 20);
        if size == 0 || size > MAX_SIZE {
            let _ = req
                .reply
                .send(json!({"error": format!("size {size}: 1 byte to {MAX_SIZE}")}));
            return;
        }
        let mut members: Vec<Coord> = match &req.group {
            Some(g) => g.iter().copied().filter(|c| *c != me).collect(),
            None => node.dims().coords().filter(|c| *c != me).collect(),
        };
        members.sort_unstable_by_key(|c| c.to_array());
        members.dedup();
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
    pub(super) fn release(&mut self, id: u64, node: &dyn Engine) {
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

    /// The root ends a transfer every reachable member has reported on, or at its deadline.
    pub(super) fn maybe_finish(&mut self, now: Time, id: u64, node: &mut dyn Engine) {
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

    /// The root sends `Start` again to every reachable member that has not reported.
    pub(super) fn repoll(&mut self, now: Time, node: &dyn Engine) {
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
            // Relays too: one that missed its Start (unreachable when the transfer began, or
            // the message lost) keeps what it receives until it knows it only relays.
            let me = node.local();
            for c in node.dims().coords() {
                if c != me && node.is_reachable(c) && !r.members.contains(&c) {
                    let msg = Msg::Start { t, member: false };
                    self.ctl.push_back((c, msg.encode()));
                }
            }
        }
    }
}
