//! The primary role: a key's first server in `GetServersForKey(key, r)` orders every
//! operation on it, one at a time per key. A write is applied here, copied to the replicas
//! and to be invalidated at the cache servers that hold it, and answered when every one of
//! them confirmed, failed or ran out of time; reads wait behind writes of their key, so no
//! read sees a write before it is acknowledged.
//!
//! A key this server has not held as primary since the last view change is *fetched* first:
//! the other holders (the next `r` candidates) send what they have, and the newest copy
//! wins. That is how a new primary learns of the last acknowledged write, and of a write it
//! missed while it was away, before it answers or orders anything. The key's cache servers
//! drop their copies in the same step: the holders the previous primary knew of are not
//! known here, and a cache server whose view lags would otherwise serve its copy past this
//! primary's first acknowledged write.
//!
//! A cache server that does not confirm its invalidation cannot refuse it: the write goes on,
//! but its answer (and everything after it on the key) waits until that server's lease on
//! its copy has surely run out ([`cache::LEASE`] from when the invalidation was sent).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use torusnet_proto::service::Engine;
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;

use super::ops::{apply, Change, Op, Outcome};
use super::store::{Copy, Item};
use super::wire::Msg;
use super::{cache, log, routing_key, Kv, KvCounters, Waits};

/// How long a primary waits for a replica's confirmation or a holder's copy (the transport
/// reports a failed peer sooner; this covers one that failed after taking the message).
const CONFIRM_TIMEOUT: Duration = Duration::from_millis(1500);

/// An operation queued at the primary.
#[derive(Debug)]
struct Job {
    from: Coord,
    id: u64,
    op: Op,
    cache_fill: bool,
    /// A read whose holders confirmed this server as the key's primary, and sent what they
    /// have, since it reached the front of the queue.
    checked: bool,
}

#[derive(Debug)]
enum Busy {
    Idle,
    /// Asking the other holders for their copies (ids outstanding; `refused`: a holder
    /// takes another server for the key's primary).
    Fetching {
        ids: HashSet<u64>,
        refused: bool,
    },
    /// A write waits for replicas and cache servers (ids outstanding; `refused` as above).
    Writing {
        job: Job,
        outcome: Outcome,
        ids: HashSet<u64>,
        refused: bool,
    },
}

#[derive(Debug)]
struct KeyWork {
    busy: Busy,
    queue: VecDeque<Job>,
    /// Until when the busy step may not end: a cache server that did not confirm its
    /// invalidation may serve its copy until its lease runs out.
    hold: Option<Time>,
}

/// What a confirmation or copy id is for.
#[derive(Debug, Clone)]
pub(super) enum Wait {
    /// A write's copy, for this key.
    Write(Vec<u8>),
    /// A cache server's invalidation, for this key (a write's, or a take-over's); its lease
    /// on its copy ends by the time given.
    Invalidation(Vec<u8>, Time),
    /// A fetch for this key.
    Fetch(Vec<u8>),
    /// A copy sent to a server catching up.
    CatchUp,
    /// A copy re-created after a failure.
    Rereplicate,
}

/// The primary's state.
#[derive(Debug, Default)]
pub(super) struct Primary {
    work: HashMap<Vec<u8>, KeyWork>,
    /// Confirmations and copies awaited, by message id.
    pub(super) waits: Waits<(Wait, Time)>,
    /// Keys held as primary continuously since the last view change.
    fresh: HashSet<Vec<u8>>,
    /// Cache servers holding a copy of each key.
    holders: HashMap<Vec<u8>, HashSet<Coord>>,
    /// Keys with a wait due (a deadline to check).
    deadlines: Option<Time>,
}

impl Primary {
    pub(super) fn next_due(&self) -> Option<Time> {
        self.deadlines
    }

    pub(super) fn due_by(&mut self, t: Time) {
        self.deadlines = Some(self.deadlines.map_or(t, |d| d.min(t)));
    }

    /// After a view change no key is fresh, and cache copies registered for keys this server
    /// no longer orders are forgotten (their cache servers drop them on their own).
    pub(super) fn view_changed(&mut self, node: &dyn Engine) {
        self.fresh.clear();
        let me = node.local();
        self.holders
            .retain(|k, _| node.key_root(routing_key(k)) == Some(me));
    }
}

/// The origin of a write: who asked, and its id there.
fn origin(from: Coord, id: u64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (from, id).hash(&mut h);
    h.finish() | 1
}

impl Kv {
    /// An operation for a key this server may be the primary of.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn primary_request(
        &mut self,
        now: Time,
        node: &mut dyn Engine,
        from: Coord,
        id: u64,
        cache_fill: bool,
        key: Vec<u8>,
        op: Op,
    ) {
        if node.key_root(routing_key(&key)) != Some(node.local()) {
            KvCounters::add(&self.counters.redirects, 1);
            self.out.send(now, from, &Msg::Redirect { id }, 0);
            return;
        }
        let w = self.primary.work.entry(key.clone()).or_insert(KeyWork {
            busy: Busy::Idle,
            queue: VecDeque::new(),
            hold: None,
        });
        w.queue.push_back(Job {
            from,
            id,
            op,
            cache_fill,
            checked: false,
        });
        self.advance(now, node, &key);
    }

    /// Runs the jobs of `key` until one has to wait.
    fn advance(&mut self, now: Time, node: &mut dyn Engine, key: &[u8]) {
        loop {
            let Some(w) = self.primary.work.get_mut(key) else {
                return;
            };
            if !matches!(w.busy, Busy::Idle) {
                return;
            }
            let Some(job) = w.queue.pop_front() else {
                self.primary.work.remove(key);
                return;
            };
            let me = node.local();
            let kh = routing_key(key);
            if node.key_root(kh) != Some(me) {
                KvCounters::add(&self.counters.redirects, 1);
                self.out
                    .send(now, job.from, &Msg::Redirect { id: job.id }, 0);
                continue;
            }
            // Writes need no check here: a replica that takes another server for the
            // primary refuses the copy, and the write is not acknowledged. A read is
            // answered from this copy only once the holders confirmed this server as the
            // primary (a server cut off from the others' views, its control process gone,
            // would otherwise answer with what changed since at another primary).
            let fresh = self.primary.fresh.contains(key);
            if !fresh || (!job.op.writes() && !job.checked) {
                let holders: Vec<Coord> = node
                    .servers_for_key(kh, self.cfg.replicas + 1)
                    .into_iter()
                    .filter(|&c| c != me)
                    .collect();
                let caches = if fresh {
                    Vec::new()
                } else {
                    self.cache_roots(node, key)
                };
                if !holders.is_empty() || !caches.is_empty() {
                    if !fresh {
                        KvCounters::add(&self.counters.fetches, 1);
                    }
                    let deadline = now + CONFIRM_TIMEOUT;
                    let mut ids = HashSet::new();
                    let wait = (Wait::Fetch(key.to_vec()), deadline);
                    for h in holders {
                        let id = self.new_id();
                        ids.insert(id);
                        self.primary.waits.insert(id, wait.clone());
                        let m = Msg::Fetch {
                            id,
                            key: key.to_vec(),
                        };
                        self.out.send(now, h, &m, id);
                    }
                    // The previous primary's cache holders are unknown here, and a cache
                    // server whose view still shows that primary would keep serving its
                    // copy after this server acknowledged a newer write. So every server
                    // that may hold a copy drops it before anything is ordered here.
                    let lease = Wait::Invalidation(key.to_vec(), now + cache::LEASE);
                    for c in caches {
                        let id = self.new_id();
                        ids.insert(id);
                        self.primary.waits.insert(id, (lease.clone(), deadline));
                        KvCounters::add(&self.counters.invalidations, 1);
                        let m = Msg::Invalidate {
                            id,
                            version: u64::MAX,
                            key: key.to_vec(),
                        };
                        self.out.send(now, c, &m, id);
                    }
                    self.primary.due_by(deadline);
                    if let Some(w) = self.primary.work.get_mut(key) {
                        w.queue.push_front(job);
                        w.busy = Busy::Fetching {
                            ids,
                            refused: false,
                        };
                    }
                    return;
                }
                self.primary.fresh.insert(key.to_vec());
            }
            KvCounters::add(&self.counters.primary_ops, 1);
            if let Some((ids, outcome)) = self.run(now, node, key, &job) {
                let deadline = now + CONFIRM_TIMEOUT;
                self.primary.due_by(deadline);
                if let Some(w) = self.primary.work.get_mut(key) {
                    w.busy = Busy::Writing {
                        outcome,
                        job,
                        ids,
                        refused: false,
                    };
                }
                return;
            }
        }
    }

    /// Runs one job. A write that has to wait for confirmations returns their ids and its
    /// outcome, to be answered when they are in; everything else is answered now.
    fn run(
        &mut self,
        now: Time,
        node: &mut dyn Engine,
        key: &[u8],
        job: &Job,
    ) -> Option<(HashSet<u64>, Outcome)> {
        let origin = origin(job.from, job.id);
        let done = job
            .op
            .writes()
            .then(|| self.store.wrote(key, origin))
            .flatten();
        if let Some(version) = done {
            // A retry of a write done already (its answer was lost with a failed primary, or
            // a replica refused it), perhaps overwritten since: applied again, it would
            // bring back what later acknowledged writes replaced. The key's present copy
            // goes to the replicas again: the answer waits for them as the first one did,
            // so a refused write is not acknowledged here.
            let outcome = self.replay(key, &job.op, version, now);
            let Some(copy) = self.store.copy_of(key) else {
                self.respond(now, job, outcome);
                return None;
            };
            return self.replicate(now, node, key, job, outcome, copy);
        }
        let cur: Option<Item> = self.store.get(key, now).cloned();
        let version = (self.store.version(key) + 1)
            .max(self.clock(now))
            .max(self.floor);
        let (outcome, change) = apply(cur.as_ref(), &job.op, now, version);
        let copy = match change {
            Change::None => {
                if job.cache_fill && matches!(outcome, Outcome::Value(_)) {
                    self.primary
                        .holders
                        .entry(key.to_vec())
                        .or_default()
                        .insert(job.from);
                }
                self.respond(now, job, outcome);
                return None;
            }
            Change::Put(mut item) => {
                item.origin = origin;
                if self.store.put(key, item.clone()).is_err() {
                    KvCounters::add(&self.counters.refused, 1);
                    let o = Outcome::Error("out of memory storing object".into());
                    self.respond(now, job, o);
                    return None;
                }
                Copy::Item(item)
            }
            Change::Delete(v) => {
                self.store.delete(key, v, origin, now);
                Copy::Deleted { version: v, origin }
            }
        };
        self.record(log::Record::Copy {
            key: key.to_vec(),
            copy: copy.clone(),
        });
        self.replicate(now, node, key, job, outcome, copy)
    }

    /// Sends `copy` of `key` to the replicas and invalidates the cached copies; the ids to
    /// wait for before `outcome` answers `job` (none: answered now).
    fn replicate(
        &mut self,
        now: Time,
        node: &mut dyn Engine,
        key: &[u8],
        job: &Job,
        outcome: Outcome,
        copy: Copy,
    ) -> Option<(HashSet<u64>, Outcome)> {
        let version = copy.version();
        let me = node.local();
        let kh = routing_key(key);
        let replicas: Vec<Coord> = node
            .servers_for_key(kh, self.cfg.replicas)
            .into_iter()
            .filter(|&c| c != me)
            .collect();
        let caches: Vec<Coord> = self
            .primary
            .holders
            .remove(key)
            .map(|h| h.into_iter().filter(|&c| c != me).collect())
            .unwrap_or_default();
        if replicas.is_empty() && caches.is_empty() {
            self.respond(now, job, outcome);
            return None;
        }
        let deadline = now + CONFIRM_TIMEOUT;
        let mut ids = HashSet::new();
        for r in replicas {
            let id = self.new_id();
            ids.insert(id);
            self.primary
                .waits
                .insert(id, (Wait::Write(key.to_vec()), deadline));
            KvCounters::add(&self.counters.copies_sent, 1);
            let m = Msg::Repl {
                id,
                key: key.to_vec(),
                copy: copy.clone(),
                earlier: self.store.earlier(key),
            };
            self.out.send(now, r, &m, id);
        }
        let lease = Wait::Invalidation(key.to_vec(), now + cache::LEASE);
        for c in caches {
            let id = self.new_id();
            ids.insert(id);
            self.primary.waits.insert(id, (lease.clone(), deadline));
            KvCounters::add(&self.counters.invalidations, 1);
            let m = Msg::Invalidate {
                id,
                version,
                key: key.to_vec(),
            };
            self.out.send(now, c, &m, id);
        }
        Some((ids, outcome))
    }

    /// The servers other than this one that may hold a cached copy of `key`: the roots of
    /// its derived keys in this view (the cache servers readers choose from).
    fn cache_roots(&self, node: &dyn Engine, key: &[u8]) -> Vec<Coord> {
        if !self.cfg.cache {
            return Vec::new();
        }
        let me = node.local();
        let mut roots: Vec<Coord> = cache::derived_keys(key, self.cfg.cache_keys)
            .filter_map(|dk| node.key_root(dk))
            .filter(|&c| c != me)
            .collect();
        roots.sort_unstable();
        roots.dedup();
        roots
    }

    /// The answer to a write found done already.
    fn replay(&mut self, key: &[u8], op: &Op, version: u64, now: Time) -> Outcome {
        match op {
            Op::Delete { .. } => Outcome::Deleted,
            Op::Touch(_) => Outcome::Touched,
            Op::GetAndTouch(_) => match self.store.get(key, now) {
                Some(i) => Outcome::Value(i.clone()),
                None => Outcome::NotFound,
            },
            Op::Arith { .. } => {
                let n = self
                    .store
                    .get(key, now)
                    .and_then(|i| std::str::from_utf8(&i.value).ok()?.parse().ok())
                    .unwrap_or(0);
                Outcome::Number(n, version)
            }
            Op::Store { .. } | Op::Get => Outcome::Stored(version),
        }
    }

    fn respond(&mut self, now: Time, job: &Job, outcome: Outcome) {
        let m = Msg::Resp {
            id: job.id,
            outcome,
        };
        self.out.send(now, job.from, &m, 0);
    }

    /// A replica, cache server or catching-up server confirmed message `id`.
    pub(super) fn confirmed(&mut self, now: Time, node: &mut dyn Engine, id: u64, applied: bool) {
        let Some((wait, _)) = self.primary.waits.remove(&id) else {
            return;
        };
        match wait {
            Wait::Write(key) | Wait::Fetch(key) | Wait::Invalidation(key, _) => {
                self.finished(now, node, &key, id)
            }
            Wait::CatchUp => {}
            Wait::Rereplicate => {
                if applied {
                    KvCounters::add(&self.counters.rereplicated, 1);
                }
            }
        }
    }

    /// A holder refused message `id` (its view shows another primary for the key), or
    /// neither answered nor was reported failed in time.
    pub(super) fn refused(&mut self, now: Time, node: &mut dyn Engine, id: u64) {
        let Some((wait, _)) = self.primary.waits.remove(&id) else {
            return;
        };
        let key = match wait {
            Wait::Write(k) | Wait::Fetch(k) => k,
            Wait::Invalidation(k, until) => return self.lease_wait(now, node, &k, id, until),
            Wait::CatchUp | Wait::Rereplicate => return,
        };
        if let Some(w) = self.primary.work.get_mut(&key) {
            match &mut w.busy {
                Busy::Fetching { refused, .. } | Busy::Writing { refused, .. } => *refused = true,
                Busy::Idle => {}
            }
        }
        self.finished(now, node, &key, id);
    }

    /// Invalidation `id` of `key` was not confirmed: its cache server may serve its copy
    /// until `until`, and the key's busy step ends no sooner.
    fn lease_wait(&mut self, now: Time, node: &mut dyn Engine, key: &[u8], id: u64, until: Time) {
        KvCounters::add(&self.counters.lease_waits, 1);
        if let Some(w) = self.primary.work.get_mut(key) {
            w.hold = Some(w.hold.map_or(until, |h| h.max(until)));
        }
        self.finished(now, node, key, id);
    }

    /// Message `id` to `peer` will not be confirmed.
    pub(super) fn unconfirmed(&mut self, now: Time, node: &mut dyn Engine, peer: Coord, id: u64) {
        let _ = peer;
        let Some((wait, _)) = self.primary.waits.remove(&id) else {
            return;
        };
        match wait {
            Wait::Write(key) => {
                KvCounters::add(&self.counters.replica_failures, 1);
                self.finished(now, node, &key, id);
            }
            Wait::Fetch(key) => self.finished(now, node, &key, id),
            // Reported failed is no proof the server is gone (the transport gives up on a
            // silent peer): its copy may still be served until its lease ends.
            Wait::Invalidation(key, until) => self.lease_wait(now, node, &key, id, until),
            Wait::CatchUp | Wait::Rereplicate => {}
        }
    }

    /// A holder's copy of `key` (or none) for fetch `id`.
    pub(super) fn fetched(
        &mut self,
        now: Time,
        node: &mut dyn Engine,
        id: u64,
        copy: Option<Copy>,
        earlier: &[(u64, u64)],
    ) {
        let Some((Wait::Fetch(key), _)) = self.primary.waits.remove(&id) else {
            return;
        };
        if let Some(c) = copy {
            self.take_copy(now, &key, c);
        }
        self.store.learn(&key, earlier);
        self.finished(now, node, &key, id);
    }

    /// Confirmation, copy or failure `id` of `key`'s busy step is in.
    fn finished(&mut self, now: Time, node: &mut dyn Engine, key: &[u8], id: u64) {
        let Some(w) = self.primary.work.get_mut(key) else {
            return;
        };
        match &mut w.busy {
            Busy::Fetching { ids, .. } | Busy::Writing { ids, .. } => {
                ids.remove(&id);
            }
            Busy::Idle => return,
        }
        self.settle(now, node, key);
    }

    /// Ends `key`'s busy step once nothing is outstanding and no lease holds it: answers the
    /// write (or turns it back), or takes the fetched key as fresh; then runs what waits.
    fn settle(&mut self, now: Time, node: &mut dyn Engine, key: &[u8]) {
        let Some(w) = self.primary.work.get_mut(key) else {
            return;
        };
        match &w.busy {
            Busy::Fetching { ids, .. } | Busy::Writing { ids, .. } if ids.is_empty() => {}
            _ => return,
        }
        if let Some(h) = w.hold {
            if h > now {
                self.primary.due_by(h);
                return;
            }
            w.hold = None;
        }
        match std::mem::replace(&mut w.busy, Busy::Idle) {
            Busy::Writing {
                job,
                outcome,
                refused,
                ..
            } => {
                if refused {
                    // Applied here and perhaps at some replicas, but not acknowledged: the
                    // requester asks again, where its view then shows the primary.
                    self.turn_back(now, &job);
                } else {
                    self.respond(now, &job, outcome);
                }
            }
            Busy::Fetching { refused: true, .. } => {
                // Another server orders this key in some holder's view: nothing waiting
                // here is answered from this copy; the requesters ask again.
                let jobs = std::mem::take(&mut w.queue);
                self.primary.work.remove(key);
                for job in jobs {
                    self.turn_back(now, &job);
                }
                return;
            }
            Busy::Fetching { .. } => {
                if let Some(front) = w.queue.front_mut() {
                    front.checked = true;
                }
                self.primary.fresh.insert(key.to_vec());
            }
            Busy::Idle => {}
        }
        self.advance(now, node, key);
    }

    /// Sends a job some holder refused back to its requester, which asks again where its
    /// view then shows the primary.
    fn turn_back(&mut self, now: Time, job: &Job) {
        KvCounters::add(&self.counters.not_primary, 1);
        self.out
            .send(now, job.from, &Msg::Redirect { id: job.id }, 0);
    }

    /// Gives up on confirmations past their deadline.
    pub(super) fn poll_primary(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        if self.primary.deadlines.is_none_or(|d| d > now) {
            return 0;
        }
        let late: Vec<u64> = self
            .primary
            .waits
            .iter()
            .filter(|(_, (_, d))| *d <= now)
            .map(|(&id, _)| id)
            .collect();
        let n = late.len();
        // Silence is not consent: a holder that takes another server for the primary
        // cannot answer a server its view no longer shows (its refusal has no route), so a
        // holder neither heard nor reported failed by the transport counts as refusing.
        for id in late {
            self.refused(now, node, id);
        }
        let held: Vec<Vec<u8>> = self
            .primary
            .work
            .iter()
            .filter(|(_, w)| w.hold.is_some_and(|h| h <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in &held {
            self.settle(now, node, key);
        }
        let waits = self.primary.waits.values().map(|(_, d)| *d);
        let holds = self.primary.work.values().filter_map(|w| w.hold);
        self.primary.deadlines = waits.chain(holds).filter(|&d| d > now).min();
        n + held.len()
    }
}
