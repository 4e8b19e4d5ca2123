//! The cache role (CamCube's hot-key replicas, section 5.1): every key has `k` derived keys
//! spread uniformly over the key space; a reader sends its read to whichever is closest of
//! the key's primary and the derived keys' roots. Such a *cache server* answers from its
//! copy, or on a miss asks the primary (`cache_fill`), keeps the answer and passes it on; the
//! primary records it as a holder and invalidates its copy on the next write (and waits for
//! that before acknowledging the write). A cache server drops the copies whose primary is not
//! the key's primary any more (that server failed, or another came back), so a new primary,
//! which knows no holders, never leaves a stale copy behind. Copies are bounded in bytes and
//! evicted least recently used first.
//!
//! A copy is served only within its *lease*: [`LEASE`] from when the cache server asked for
//! it. An invalidation can go unconfirmed (the cache server's messages lost for longer than
//! the primary waits, or the transport gives up on it while the server is still alive), and
//! a write acknowledged past such a cache server would leave it serving the overwritten
//! value; instead the primary holds the write's answer until that server's lease surely ran
//! out (the lease began before the primary answered the fill, so before it sent the
//! invalidation).

use std::collections::HashMap;
use std::time::Duration;

use torusnet_proto::keyspace::Key;
use torusnet_proto::service::Engine;
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;

use super::ops::{Op, Outcome};
use super::store::Store;
use super::wire::Msg;
use super::{routing_key, Kv, KvCounters, Waits, RETRY};

/// How long a cache server keeps asking a primary for a fill.
const FILL_TIMEOUT: Duration = Duration::from_millis(1500);

/// How long a cached copy may be served, from when its fill was asked for. No longer than
/// the primary waits for an invalidation's confirmation, so a silent cache server's lease
/// has run out by the time the primary gives up on it.
pub(super) const LEASE: Duration = Duration::from_millis(1000);

/// The routing keys of `key`'s cache servers.
pub fn derived_keys(key: &[u8], k: usize) -> impl Iterator<Item = u64> + '_ {
    (0..k).map(move |i| {
        let mut b = Vec::with_capacity(key.len() + 8);
        b.extend_from_slice(b"cache:");
        b.push(i as u8);
        b.extend_from_slice(key);
        Key::from_bytes(&b).routing_key()
    })
}

/// Where a read of `key` goes: the closest (in hops from this server) of the primary and the
/// roots of the `k` derived keys; the primary when it is as close as any.
pub fn closest(node: &dyn Engine, key: &[u8], k: usize, primary: Coord) -> Option<Coord> {
    let mut best = (node.distance(primary)?, primary);
    for dk in derived_keys(key, k) {
        if let Some(c) = node.key_root(dk) {
            if let Some(d) = node.distance(c) {
                if d < best.0 {
                    best = (d, c);
                }
            }
        }
    }
    Some(best.1)
}

/// A fill in flight: readers waiting for a key the cache server asked the primary for.
#[derive(Debug)]
struct Fill {
    id: u64,
    waiters: Vec<(Coord, u64)>,
    deadline: Time,
    retry_at: Option<Time>,
    /// When this fill was first asked for: the copy's lease starts here.
    asked: Time,
    /// The newest version an invalidation named while the fill was in flight (0: none).
    /// The primary's answer and its invalidation can overtake each other on the way (the
    /// transport orders only fenced messages): an answer older than this is stale.
    invalidated: u64,
}

/// Where a cached copy came from, and until when it may be served.
#[derive(Debug, Clone, Copy)]
struct Lease {
    primary: Coord,
    until: Time,
}

/// Cached copies and fills in flight.
#[derive(Debug)]
pub struct Cache {
    copies: Store,
    /// Each copy's primary and lease.
    leases: HashMap<Vec<u8>, Lease>,
    fills: HashMap<Vec<u8>, Fill>,
    fill_ids: Waits<Vec<u8>>,
    scan_at: Option<Time>,
}

impl Cache {
    /// A cache of at most `bytes`.
    pub fn new(bytes: usize) -> Cache {
        Cache {
            copies: Store::new(bytes, true),
            leases: HashMap::new(),
            fills: HashMap::new(),
            fill_ids: Waits::new(),
            scan_at: None,
        }
    }

    /// Copies held.
    pub fn items(&self) -> usize {
        self.copies.items()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.copies.bytes()
    }

    /// Copies evicted for room.
    pub fn evictions(&self) -> u64 {
        self.copies.evictions
    }

    /// Whether `id` is a fill of this cache.
    pub fn is_fill(&self, id: u64) -> bool {
        self.fill_ids.contains_key(&id)
    }

    /// Drops the copy of `key` if it is older than `version`; whether it did. A fill of
    /// `key` in flight remembers the version, so an older answer to it is not kept.
    pub fn invalidate(&mut self, key: &[u8], version: u64) -> bool {
        if let Some(f) = self.fills.get_mut(key) {
            f.invalidated = f.invalidated.max(version);
        }
        let old = self
            .copies
            .copy_of(key)
            .is_some_and(|c| c.version() < version);
        if old {
            self.drop_copy(key);
        }
        old
    }

    fn drop_copy(&mut self, key: &[u8]) {
        self.copies.remove(key);
        self.leases.remove(key);
    }

    /// The copy of `key`, if its lease has not run out (an expired one is dropped).
    fn leased(&mut self, key: &[u8], now: Time) -> Option<super::store::Item> {
        if self.leases.get(key).is_some_and(|l| l.until > now) {
            return self.copies.get(key, now).cloned();
        }
        if self.copies.copy_of(key).is_some() {
            self.drop_copy(key);
        }
        None
    }

    /// Drops everything (flush_all).
    pub fn clear(&mut self) {
        self.copies.clear();
        self.leases.clear();
    }

    /// Drops copies whose primary is not the key's primary in the new view.
    pub fn view_changed(&mut self, node: &dyn Engine) {
        let stale: Vec<Vec<u8>> = self
            .leases
            .iter()
            .filter(|(k, l)| node.key_root(routing_key(k)) != Some(l.primary))
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            self.drop_copy(&k);
        }
    }

    /// Drops expired copies and copies whose lease ran out, and the bookkeeping of evicted
    /// ones.
    pub fn sweep(&mut self, now: Time) {
        self.copies.sweep(now);
        let ended: Vec<Vec<u8>> = self
            .leases
            .iter()
            .filter(|(k, l)| l.until <= now || self.copies.copy_of(k).is_none())
            .map(|(k, _)| k.clone())
            .collect();
        for k in ended {
            self.drop_copy(&k);
        }
    }

    pub(super) fn next_due(&self) -> Option<Time> {
        self.scan_at
    }

    fn due_by(&mut self, t: Time) {
        self.scan_at = Some(self.scan_at.map_or(t, |s| s.min(t)));
    }
}

impl Kv {
    /// A read sent to this server as one of the key's cache servers.
    pub(super) fn cache_request(
        &mut self,
        now: Time,
        node: &mut dyn Engine,
        from: Coord,
        id: u64,
        key: Vec<u8>,
    ) {
        let kh = routing_key(&key);
        let primary = node.key_root(kh);
        if primary == Some(node.local()) {
            // The view moved the key here: serve it as its primary.
            self.primary_request(now, node, from, id, false, key, Op::Get);
            return;
        }
        if let Some(item) = self.cache.leased(&key, now) {
            KvCounters::add(&self.counters.cache_hits, 1);
            let m = Msg::Resp {
                id,
                outcome: Outcome::Value(item),
            };
            self.out.send(now, from, &m, 0);
            return;
        }
        KvCounters::add(&self.counters.cache_misses, 1);
        if let Some(f) = self.cache.fills.get_mut(&key) {
            f.waiters.push((from, id));
            return;
        }
        let fid = self.new_id();
        let deadline = now + FILL_TIMEOUT;
        self.cache.fills.insert(
            key.clone(),
            Fill {
                id: fid,
                waiters: vec![(from, id)],
                deadline,
                retry_at: None,
                asked: now,
                invalidated: 0,
            },
        );
        self.cache.fill_ids.insert(fid, key.clone());
        self.cache.due_by(deadline);
        self.send_fill(now, node, &key);
    }

    fn send_fill(&mut self, now: Time, node: &mut dyn Engine, key: &[u8]) {
        let Some(f) = self.cache.fills.get_mut(key) else {
            return;
        };
        match node.key_root(routing_key(key)) {
            Some(p) => {
                f.retry_at = None;
                let m = Msg::Req {
                    id: f.id,
                    cache_fill: true,
                    via_cache: false,
                    key: key.to_vec(),
                    op: Op::Get,
                };
                let id = f.id;
                self.out.send(now, p, &m, id);
            }
            None => {
                f.retry_at = Some(now + RETRY);
                self.cache.due_by(now + RETRY);
            }
        }
    }

    /// The primary's answer to fill `id`: keep the copy, answer the readers.
    pub(super) fn fill_answered(
        &mut self,
        now: Time,
        node: &mut dyn Engine,
        primary: Coord,
        id: u64,
        outcome: Outcome,
    ) {
        let Some(key) = self.cache.fill_ids.remove(&id) else {
            return;
        };
        let Some(mut f) = self.cache.fills.remove(&key) else {
            return;
        };
        // A write was acknowledged after this answer left the primary (its invalidation came
        // first): the answer may be older than what some waiters must see. Ask again for
        // all of them, within the same deadline.
        let current = match &outcome {
            Outcome::Value(item) => item.version >= f.invalidated,
            _ => f.invalidated == 0,
        };
        if !current {
            let fid = self.new_id();
            f.id = fid;
            f.asked = now;
            f.invalidated = 0;
            f.retry_at = None;
            self.cache.fills.insert(key.clone(), f);
            self.cache.fill_ids.insert(fid, key.clone());
            self.send_fill(now, node, &key);
            return;
        }
        let until = f.asked + LEASE;
        if let Outcome::Value(item) = &outcome {
            // Kept only while the answer's sender is still the key's primary here, and its
            // lease has time left.
            if node.key_root(routing_key(&key)) == Some(primary)
                && until > now
                && self.cache.copies.put(&key, item.clone()).is_ok()
            {
                self.cache
                    .leases
                    .insert(key.clone(), Lease { primary, until });
            }
        }
        for (to, rid) in f.waiters {
            let m = Msg::Resp {
                id: rid,
                outcome: outcome.clone(),
            };
            self.out.send(now, to, &m, 0);
        }
    }

    /// Fill `id` was redirected or failed: ask again shortly.
    pub(super) fn fill_failed(&mut self, now: Time, id: u64) {
        let Some(key) = self.cache.fill_ids.get(&id) else {
            return;
        };
        if let Some(f) = self.cache.fills.get_mut(key) {
            f.retry_at = Some(now + RETRY);
            self.cache.due_by(now + RETRY);
        }
    }

    /// Re-sends fills that are due; fills past their deadline send their readers elsewhere.
    pub(super) fn poll_fills(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        if self.cache.scan_at.is_none_or(|t| t > now) {
            return 0;
        }
        let mut expired = Vec::new();
        let mut due = Vec::new();
        let mut next: Option<Time> = None;
        for (k, f) in &self.cache.fills {
            if f.deadline <= now {
                expired.push(k.clone());
                continue;
            }
            if f.retry_at.is_some_and(|r| r <= now) {
                due.push(k.clone());
            }
            let t = f
                .retry_at
                .filter(|&r| r > now)
                .map_or(f.deadline, |r| r.min(f.deadline));
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        self.cache.scan_at = next;
        let n = expired.len() + due.len();
        for k in expired {
            if let Some(f) = self.cache.fills.remove(&k) {
                self.cache.fill_ids.remove(&f.id);
                for (to, rid) in f.waiters {
                    self.out.send(now, to, &Msg::Redirect { id: rid }, 0);
                }
            }
        }
        for k in due {
            self.send_fill(now, node, &k);
        }
        n
    }
}
