//! `aggregate` (service 10): Camdoop's on-path aggregation (CamCubeOS paper 6.2). Every
//! server holds key/value records; they flow up the [`Trees`] rooted at the job's root
//! (records split over the trees by key, so all the root's links carry a share), and every
//! server merges what its children send with its own records before sending one partial
//! result to its parent: a hop forwards at most what it received plus its own, usually far
//! less, which is the traffic Camdoop saves.
//!
//! Combiners: sum, count, max, min built in; programs that run the service themselves (the
//! simulator, embedding programs) add their own with [`Aggregate::with_combiner`].
//!
//! Failures: when the view changes during a job, the root starts it again (a new epoch,
//! after the view settles) over the trees of the new view, and every server still reachable
//! contributes its records again. The records of a server that failed are lost, not
//! re-sent: the result is the job over the servers alive at the end (the oracle in the
//! tests computes exactly that).

pub mod wire;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::mpsc::Sender;
use std::time::Duration;

use serde_json::{json, Value};
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::routing::LinkView;
use torusnet_proto::service::{Engine, Request, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims};
use torusnet_proto::transport::SendError;
use torusnet_proto::trees::Trees;

use crate::builtin::fnv;
use wire::{Msg, Records};

/// Service id of the aggregation service.
pub const AGG: u16 = 10;
/// How long the view must stay unchanged before a job starts again.
const SETTLE: Duration = Duration::from_millis(200);
/// An epoch with no partial for this long starts again.
const STALL: Duration = Duration::from_secs(5);
/// Jobs a server remembers (older ones are forgotten).
const MAX_JOBS: usize = 64;

/// How two values of one key combine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Combiner {
    /// Their sum.
    Sum,
    /// How many records (each record counts 1).
    Count,
    /// The larger.
    Max,
    /// The smaller.
    Min,
    /// One registered under this name with [`Aggregate::with_combiner`].
    Named(String),
}

impl Combiner {
    /// By name: sum, count, max, min, or any other (a registered one).
    pub fn parse(s: &str) -> Combiner {
        match s {
            "sum" => Combiner::Sum,
            "count" => Combiner::Count,
            "max" => Combiner::Max,
            "min" => Combiner::Min,
            other => Combiner::Named(other.to_string()),
        }
    }
    /// Its name.
    pub fn name(&self) -> &str {
        match self {
            Combiner::Sum => "sum",
            Combiner::Count => "count",
            Combiner::Max => "max",
            Combiner::Min => "min",
            Combiner::Named(n) => n,
        }
    }
}

/// The records every server contributes to a job: the word counts of a text it generates
/// (deterministically from the seed and its coordinate), the example job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WordCount {
    /// Words of text per server.
    pub words: u32,
    /// Distinct words in the language.
    pub vocabulary: u32,
    /// Picks the texts.
    pub seed: u64,
}

impl WordCount {
    /// The word indices of server `c`'s text: a skewed choice from the vocabulary, as
    /// natural text is (the minimum of two uniform picks favours common words).
    fn draws(&self, dims: Dims, c: Coord) -> impl Iterator<Item = u64> {
        let mut rng = torusnet_proto::rng::SplitMix64::new(
            self.seed ^ (dims.index(c) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let v = u64::from(self.vocabulary.max(1));
        (0..self.words).map(move |_| {
            let a = rng.below(v);
            let b = rng.below(v);
            a.min(b)
        })
    }

    /// The words server `c` of `dims` counts, as text.
    pub fn text(&self, dims: Dims, c: Coord) -> Vec<String> {
        self.draws(dims, c).map(|w| format!("w{w}")).collect()
    }

    /// Server `c`'s records: each word once, its occurrences (1 each) merged by
    /// `combiner`. Counted by index first, so a million words cost milliseconds, not a
    /// million strings.
    pub fn records(
        &self,
        dims: Dims,
        c: Coord,
        combiner: &Combiner,
        f: &dyn Fn(&Combiner, u64, u64) -> u64,
    ) -> Records {
        let mut counts = vec![0u32; self.vocabulary.max(1) as usize];
        for w in self.draws(dims, c) {
            counts[w as usize] += 1;
        }
        let mut r = Records::new();
        for (w, n) in counts.iter().enumerate().filter(|(_, n)| **n > 0) {
            let v = match combiner {
                Combiner::Sum | Combiner::Count => u64::from(*n),
                _ => (1..*n).fold(1, |v, _| f(combiner, v, 1)),
            };
            r.insert(format!("w{w}"), v);
        }
        r
    }
}

/// A job to start at this server (the root).
#[derive(Debug)]
pub struct AggRequest {
    /// How values combine.
    pub combiner: Combiner,
    /// What every server contributes.
    pub input: WordCount,
    /// The job ends by then.
    pub timeout: Duration,
    /// Where the result goes.
    pub reply: Sender<Value>,
}

#[derive(Debug)]
struct RootJob {
    started: Time,
    deadline: Time,
    reply: Sender<Value>,
    restart_at: Option<Time>,
    restarts: u32,
    /// Complete, waiting for the view to settle before answering.
    check_at: Option<Time>,
    /// When the current epoch last moved (launched, or a partial arrived).
    moved: Time,
}

#[derive(Debug)]
struct Job {
    epoch: u32,
    root: Coord,
    combiner: Combiner,
    input: WordCount,
    trees: Option<Trees>,
    /// Per tree: what arrived from children (child -> its partial), and whether sent up.
    got: Vec<HashMap<Coord, (Records, wire::Tally)>>,
    sent: Vec<bool>,
    local: Option<Records>,
    root_job: Option<RootJob>,
}

/// Counters of the service on this server.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct AggStats {
    /// Partial results sent to parents.
    pub partials_sent: u64,
    /// Their bytes.
    pub bytes_sent: u64,
    /// Records received from children.
    pub records_in: u64,
    /// Records sent to parents.
    pub records_out: u64,
    /// Malformed messages dropped.
    pub malformed: u64,
    /// Messages the transport refused for good (their server unreachable, ...): a parent
    /// that lost a child's partial answers without it at its deadline.
    pub send_failed: u64,
}

type CombineFn = fn(u64, u64) -> u64;

/// The aggregation service of one server.
#[derive(Debug, Default)]
pub struct Aggregate {
    jobs: HashMap<u64, Job>,
    order: VecDeque<u64>,
    next: u64,
    custom: BTreeMap<String, CombineFn>,
    ctl: VecDeque<(Coord, Vec<u8>)>,
    /// When the view last changed.
    last_change: Time,
    /// Partials that came before their job's Start.
    #[allow(clippy::type_complexity)]
    early: Vec<(u64, Coord, u32, u8, wire::Tally, Records)>,
    /// Counters.
    pub stats: AggStats,
}

fn opts() -> MsgOptions {
    MsgOptions {
        reliable: true,
        ..MsgOptions::default()
    }
}

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

/// The tree a key's records travel up.
fn tree_of(key: &str, k: usize) -> usize {
    (fnv(key.as_bytes()) % k.max(1) as u64) as usize
}

impl Aggregate {
    /// The service with a combiner of its own under `name`.
    pub fn with_combiner(mut self, name: &str, f: CombineFn) -> Aggregate {
        self.custom.insert(name.to_string(), f);
        self
    }

    fn combine(&self, c: &Combiner, a: u64, b: u64) -> u64 {
        match c {
            Combiner::Sum | Combiner::Count => a.saturating_add(b),
            Combiner::Max => a.max(b),
            Combiner::Min => a.min(b),
            Combiner::Named(n) => self.custom.get(n).map_or(a.saturating_add(b), |f| f(a, b)),
        }
    }

    /// Merges `from` into `into` with the job's combiner.
    fn merge(&self, c: &Combiner, into: &mut Records, from: &Records) {
        for (k, v) in from {
            match into.get_mut(k) {
                Some(x) => *x = self.combine(c, *x, *v),
                None => {
                    into.insert(k.clone(), *v);
                }
            }
        }
    }

    fn start(&mut self, now: Time, r: AggRequest, node: &mut dyn Engine) {
        if let Combiner::Named(n) = &r.combiner {
            if !self.custom.contains_key(n) {
                let _ = r.reply.send(json!({"error": format!("no combiner named {n:?} here (sum, count, max, min)")}));
                return;
            }
        }
        self.next += 1;
        let me = node.local();
        let id = (me
            .to_array()
            .iter()
            .fold(0u64, |a, v| a << 16 | u64::from(*v))
            << 16)
            ^ (now.as_nanos() << 8)
            ^ self.next;
        let job = Job {
            epoch: 0,
            root: me,
            combiner: r.combiner,
            input: r.input,
            trees: None,
            got: Vec::new(),
            sent: Vec::new(),
            local: None,
            root_job: Some(RootJob {
                started: now,
                deadline: now + r.timeout,
                reply: r.reply,
                restart_at: None,
                restarts: 0,
                check_at: None,
                moved: now,
            }),
        };
        self.jobs.insert(id, job);
        self.order.push_back(id);
        self.launch(now, id, node);
    }

    /// The root (re)starts a job: a new epoch, told to every reachable server.
    fn launch(&mut self, now: Time, id: u64, node: &mut dyn Engine) {
        let me = node.local();
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        j.epoch += 1;
        let m = Msg::Start {
            id,
            epoch: j.epoch,
            root: me,
            combiner: j.combiner.name().to_string(),
            input: j.input,
        }
        .encode();
        for c in node.dims().coords() {
            if c != me && node.is_reachable(c) {
                self.ctl.push_back((c, m.clone()));
            }
        }
        self.begin(now, id, node);
    }

    /// A server joins epoch `j.epoch` of a job: new trees, its own records, nothing
    /// received yet.
    fn begin(&mut self, now: Time, id: u64, node: &mut dyn Engine) {
        let me = node.local();
        let dims = node.dims();
        let Some(j) = self.jobs.get(&id) else { return };
        let (combiner, input) = (j.combiner.clone(), j.input);
        let local = if j.local.is_some() {
            None
        } else {
            let f = |c: &Combiner, a: u64, b: u64| self.combine(c, a, b);
            Some(input.records(dims, me, &combiner, &f))
        };
        let trees = view_of(node).map(|v| Trees::build(&v, j.root));
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        if let Some(l) = local {
            j.local = Some(l);
        }
        let k = trees.as_ref().map_or(1, Trees::count).max(1);
        j.trees = trees;
        j.got = vec![HashMap::new(); k];
        j.sent = vec![false; k];
        self.progress(now, id, node);
    }

    /// Sends every tree's partial whose children have all reported; the root answers once
    /// every tree is complete.
    fn progress(&mut self, now: Time, id: u64, node: &mut dyn Engine) {
        let me = node.local();
        let Some(j) = self.jobs.get(&id) else { return };
        let Some(trees) = j.trees.as_ref() else {
            return;
        };
        let k = trees.count().max(1);
        let mut ready = Vec::new();
        for t in 0..k {
            if j.sent[t] {
                continue;
            }
            let children = trees.children(t, me);
            if children
                .iter()
                .all(|c| j.got[t].contains_key(c) || !node.is_reachable(*c))
            {
                ready.push(t);
            }
        }
        if ready.is_empty() {
            return;
        }
        let dist_root = node.distance(j.root).unwrap_or(0);
        let mut outs = Vec::new();
        for t in &ready {
            let t = *t;
            // Own records of this tree's keys, then the children's partials.
            let mut merged = Records::new();
            let mut tally = wire::Tally::default();
            if let Some(l) = &j.local {
                let mine: Records = l
                    .iter()
                    .filter(|(w, _)| tree_of(w, k) == t)
                    .map(|(w, v)| (w.clone(), *v))
                    .collect();
                let raw = wire::records_len(&mine) as u64;
                tally.servers += 1;
                tally.raw_byte_hops += raw * u64::from(dist_root);
                merged = mine;
            }
            for (recs, tl) in j.got[t].values() {
                self.merge(&j.combiner, &mut merged, recs);
                tally.servers += tl.servers;
                tally.raw_byte_hops += tl.raw_byte_hops;
                tally.agg_byte_hops += tl.agg_byte_hops;
            }
            outs.push((t, merged, tally));
        }
        let is_root = j.root == me;
        let parents: Vec<Option<Coord>> = ready.iter().map(|t| trees.parent(*t, me)).collect();
        let epoch = j.epoch;
        if let Some(j) = self.jobs.get_mut(&id) {
            for t in &ready {
                j.sent[*t] = true;
            }
        }
        if is_root {
            // The root keeps its per-tree results until all are in.
            if let Some(j) = self.jobs.get_mut(&id) {
                for (t, merged, tally) in outs {
                    j.got[t].insert(me, (merged, tally));
                }
            }
            self.maybe_answer(now, id, node);
            return;
        }
        for ((t, merged, mut tally), parent) in outs.into_iter().zip(parents) {
            let Some(p) = parent else { continue };
            let hops = u64::from(node.distance(p).unwrap_or(1));
            let n = merged.len() as u64;
            let len = wire::records_len(&merged) as u64;
            tally.agg_byte_hops += len * hops;
            let m = Msg::Partial {
                id,
                epoch,
                tree: t as u8,
                tally,
                records: merged,
            }
            .encode();
            self.stats.partials_sent += 1;
            self.stats.bytes_sent += m.len() as u64;
            self.stats.records_out += n;
            self.ctl.push_back((p, m));
        }
    }

    fn maybe_answer(&mut self, now: Time, id: u64, node: &mut dyn Engine) {
        let me = node.local();
        let Some(j) = self.jobs.get(&id) else { return };
        let Some(r) = j.root_job.as_ref() else { return };
        let done = j.sent.iter().all(|s| *s) && j.got.iter().all(|g| g.contains_key(&me));
        // A result is final once the view it was computed in has held for a while: a view
        // still changing (a server just lost, a transient partition) starts a new epoch.
        let settled = r.restart_at.is_none() && now >= self.last_change + SETTLE;
        if !(done && settled) && now < r.deadline {
            if done && r.restart_at.is_none() {
                let at = self.last_change + SETTLE;
                if let Some(r) = self.jobs.get_mut(&id).and_then(|j| j.root_job.as_mut()) {
                    r.check_at = Some(at);
                }
            }
            return;
        }
        // Every tree's result must hold every server this root can reach: less means some
        // server saw other trees than its parent (views that disagreed for a moment); a new
        // epoch over the settled view puts it right.
        let expected = node
            .dims()
            .coords()
            .filter(|c| *c == me || node.is_reachable(*c))
            .count() as u64;
        // A root that can reach nobody in a torus of many is far more likely cut off for a
        // moment (its own daemon starved, every peer timed out at once) than the last server
        // alive: it waits for the others, up to its deadline, rather than report a job over
        // itself alone (the end-to-end test saw that once).
        if expected == 1 && node.dims().count() > 1 && now < r.deadline {
            if let Some(r) = self.jobs.get_mut(&id).and_then(|j| j.root_job.as_mut()) {
                r.check_at = Some(now + SETTLE);
            }
            return;
        }
        let short = j
            .got
            .iter()
            .any(|g| g.get(&me).is_none_or(|(_, tl)| tl.servers < expected));
        if done && short && now < r.deadline {
            if let Some(r) = self.jobs.get_mut(&id).and_then(|j| j.root_job.as_mut()) {
                r.restart_at = Some(now + SETTLE);
                r.check_at = None;
            }
            return;
        }
        let Some(j) = self.jobs.remove(&id) else {
            return;
        };
        self.order.retain(|i| *i != id);
        let Some(r) = j.root_job else { return };
        let mut all = Records::new();
        let mut tally = wire::Tally::default();
        for g in &j.got {
            if let Some((recs, tl)) = g.get(&me) {
                self.merge(&j.combiner, &mut all, recs);
                tally.servers = tally.servers.max(tl.servers);
                tally.raw_byte_hops += tl.raw_byte_hops;
                tally.agg_byte_hops += tl.agg_byte_hops;
            }
        }
        let mut v = json!({
            "id": format!("{id:016x}"),
            "root": me.to_string(),
            "combiner": j.combiner.name(),
            "epoch": j.epoch,
            "restarts": r.restarts,
            "servers": tally.servers,
            "keys": all.len(),
            "total": all.values().fold(0u64, |a, v| a.saturating_add(*v)),
            "digest": format!("{:016x}", digest(&all)),
            "agg_link_bytes": tally.agg_byte_hops,
            "raw_link_bytes": tally.raw_byte_hops,
            "saved": 1.0 - tally.agg_byte_hops as f64 / (tally.raw_byte_hops.max(1)) as f64,
            "elapsed_s": now.since(r.started).as_secs_f64(),
            "top": top(&all, 5),
        });
        if !done {
            v["error"] = json!("the job did not complete by its deadline");
        }
        let _ = r.reply.send(v);
    }

    fn on_message(&mut self, now: Time, src: Coord, data: &[u8], node: &mut dyn Engine) {
        let Some(m) = Msg::decode(data) else {
            self.stats.malformed += 1;
            return;
        };
        match m {
            Msg::Start {
                id,
                epoch,
                root,
                combiner,
                input,
            } => {
                if src != root || input.words > 10_000_000 || input.vocabulary == 0 {
                    self.stats.malformed += 1;
                    return;
                }
                let fresh = match self.jobs.get(&id) {
                    Some(j) => epoch > j.epoch,
                    None => true,
                };
                if !fresh {
                    return;
                }
                let local = self.jobs.remove(&id).and_then(|j| j.local);
                self.jobs.insert(
                    id,
                    Job {
                        epoch,
                        root,
                        combiner: Combiner::parse(&combiner),
                        input,
                        trees: None,
                        got: Vec::new(),
                        sent: Vec::new(),
                        local,
                        root_job: None,
                    },
                );
                self.order.retain(|i| *i != id);
                self.order.push_back(id);
                while self.order.len() > MAX_JOBS {
                    if let Some(old) = self.order.pop_front() {
                        self.jobs.remove(&old);
                    }
                }
                self.begin(now, id, node);
                let early: Vec<_> = {
                    let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.early)
                        .into_iter()
                        .partition(|e| e.0 == id);
                    self.early = rest;
                    mine
                };
                for (_, src, epoch, tree, tally, records) in early {
                    self.take_partial(now, id, src, epoch, tree, tally, records, node);
                }
            }
            Msg::Partial {
                id,
                epoch,
                tree,
                tally,
                records,
            } => {
                let known = self.jobs.get(&id).map(|j| j.epoch);
                match known {
                    // A child heard of the new epoch first: it starts here too (the job is
                    // the same, only the trees and the epoch are new).
                    Some(e) if epoch > e => {
                        if let Some(j) = self.jobs.get_mut(&id) {
                            j.epoch = epoch;
                        }
                        self.begin(now, id, node);
                    }
                    Some(e) if epoch < e => return,
                    Some(_) => {}
                    // Before the Start: kept until it comes (a few, bounded).
                    None => {
                        if self.early.len() < 4096 {
                            self.early.push((id, src, epoch, tree, tally, records));
                        }
                        return;
                    }
                }
                self.take_partial(now, id, src, epoch, tree, tally, records, node);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn take_partial(
        &mut self,
        now: Time,
        id: u64,
        src: Coord,
        epoch: u32,
        tree: u8,
        tally: wire::Tally,
        records: Records,
        node: &mut dyn Engine,
    ) {
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        let t = usize::from(tree);
        if epoch != j.epoch || t >= j.got.len() {
            return;
        }
        self.stats.records_in += records.len() as u64;
        j.got[t].insert(src, (records, tally));
        if let Some(r) = j.root_job.as_mut() {
            r.moved = now;
        }
        self.progress(now, id, node);
    }

    /// Jobs in progress here (for status).
    pub fn status(&self) -> Value {
        json!({"stats": self.stats, "jobs": self.jobs.len()})
    }
}

/// A digest of a result that does not depend on the order records arrived in.
pub fn digest(r: &Records) -> u64 {
    let sorted: BTreeMap<&String, &u64> = r.iter().collect();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for (k, v) in sorted {
        h = (h ^ fnv(k.as_bytes()))
            .wrapping_mul(0x100_0000_01b3)
            .rotate_left(17);
        h = (h ^ *v).wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn top(r: &Records, n: usize) -> Value {
    let mut v: Vec<(&String, &u64)> = r.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    json!(v
        .into_iter()
        .take(n)
        .map(|(k, v)| json!([k, v]))
        .collect::<Vec<_>>())
}

/// The job computed in one process: the oracle of the tests (servers `alive`).
pub fn oracle(
    dims: Dims,
    input: &WordCount,
    combiner: &Combiner,
    alive: &HashSet<Coord>,
) -> Records {
    let svc = Aggregate::default();
    let f = |c: &Combiner, a: u64, b: u64| svc.combine(c, a, b);
    let mut all = Records::new();
    for c in dims.coords().filter(|c| alive.contains(c)) {
        let r = input.records(dims, c, combiner, &f);
        svc.merge(combiner, &mut all, &r);
    }
    all
}

impl Service for Aggregate {
    fn name(&self) -> &'static str {
        "aggregate"
    }

    fn ids(&self) -> &[u16] {
        &[AGG]
    }

    fn on_event(&mut self, now: Time, event: &Event, node: &mut dyn Engine) {
        match event {
            Event::Message { src, data, .. } => self.on_message(now, *src, data, node),
            Event::Unreachable(_) | Event::Reachable(_) => {
                self.last_change = now;
                // Roots start their jobs again once the view settles; everyone else waits
                // for the new epoch (a child that vanished no longer holds up a parent).
                for j in self.jobs.values_mut() {
                    if let Some(r) = j.root_job.as_mut() {
                        r.restart_at = Some(now + SETTLE);
                    }
                }
                let ids: Vec<u64> = self.jobs.keys().copied().collect();
                for id in ids {
                    self.progress(now, id, node);
                }
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
        match request.downcast::<AggRequest>() {
            Ok(r) => {
                self.start(now, *r, node);
                Ok(())
            }
            Err(r) => Err(r),
        }
    }

    fn poll(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        let mut work = 0;
        // An epoch that stopped moving (a parent waiting for a child that sent its partial
        // elsewhere) starts again.
        for j in self.jobs.values_mut() {
            if let Some(r) = j.root_job.as_mut() {
                if r.restart_at.is_none() && r.check_at.is_none() && now >= r.moved + STALL {
                    r.restart_at = Some(now);
                }
            }
        }
        let due: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| {
                j.root_job
                    .as_ref()
                    .is_some_and(|r| r.restart_at.is_some_and(|t| now >= t))
            })
            .map(|(k, _)| *k)
            .collect();
        for id in due {
            if let Some(r) = self.jobs.get_mut(&id).and_then(|j| j.root_job.as_mut()) {
                r.restart_at = None;
                r.check_at = None;
                r.moved = now;
                r.restarts += 1;
            }
            self.launch(now, id, node);
            work += 1;
        }
        let late: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| {
                j.root_job
                    .as_ref()
                    .is_some_and(|r| now >= r.deadline || r.check_at.is_some_and(|t| now >= t))
            })
            .map(|(k, _)| *k)
            .collect();
        for id in late {
            self.maybe_answer(now, id, node);
            work += 1;
        }
        while let Some((c, m)) = self.ctl.pop_front() {
            match node.send(now, Target::Server(c), AGG, &m, opts()) {
                Ok(()) => work += 1,
                Err(SendError::WouldBlock) => {
                    self.ctl.push_front((c, m));
                    break;
                }
                Err(_) => self.stats.send_failed += 1,
            }
        }
        work
    }

    fn poll_timeout(&self) -> Option<Time> {
        if !self.ctl.is_empty() {
            return Some(Time::ZERO);
        }
        self.jobs
            .values()
            .filter_map(|j| j.root_job.as_ref())
            .flat_map(|r| {
                [
                    Some(r.deadline),
                    r.restart_at,
                    r.check_at,
                    Some(r.moved + STALL),
                ]
            })
            .flatten()
            .min()
    }
}

#[cfg(test)]
mod tests;
