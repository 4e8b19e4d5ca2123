//! The items one server holds, bounded in memory. Two uses: the *store* (keys this server is
//! primary or replica for: never evicted; a full store refuses writes) and the *cache* (copies
//! kept near readers: least recently used copies are evicted to make room).
//!
//! Deletions leave a tombstone with the deleting version for a while, so that a stale copy
//! pushed by a server catching up cannot bring a deleted item back.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use torusnet_proto::time::Time;

/// A value and what the store knows about it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Item {
    /// The bytes.
    pub value: Vec<u8>,
    /// The client's flags.
    pub flags: u32,
    /// When it expires (`None`: never).
    pub expires: Option<Time>,
    /// Its version (memcached's cas unique): grows with every write of the key.
    pub version: u64,
    /// The write that made it (requester, incarnation and operation id hashed; 0: none):
    /// a requester that retries a write after a failover finds its own write done.
    pub origin: u64,
}

impl Item {
    /// Whether it has expired at `now`.
    pub fn expired(&self, now: Time) -> bool {
        self.expires.is_some_and(|e| e <= now)
    }
}

#[derive(Debug, Clone)]
enum Entry {
    Live(Item),
    Tombstone {
        version: u64,
        origin: u64,
        until: Time,
    },
}

/// Earlier writes of one key that a requester may still retry: (origin, version) pairs,
/// oldest first. A retry found among them was done already and is not applied again.
pub type Earlier = Vec<(u64, u64)>;

/// Most earlier writes remembered per key (the newest are kept).
pub const MAX_EARLIER: usize = 64;

impl Entry {
    fn origin(&self) -> u64 {
        match self {
            Entry::Live(i) => i.origin,
            Entry::Tombstone { origin, .. } => *origin,
        }
    }
    fn version(&self) -> u64 {
        match self {
            Entry::Live(i) => i.version,
            Entry::Tombstone { version, .. } => *version,
        }
    }
    fn size(&self, key: &[u8]) -> usize {
        // Bookkeeping per entry, roughly what the maps and the item header take.
        let base = key.len() + 96;
        match self {
            Entry::Live(i) => base + i.value.len(),
            Entry::Tombstone { .. } => base,
        }
    }
}

/// Why a write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// Items in memory, at most `limit` bytes.
#[derive(Debug)]
pub struct Store {
    entries: HashMap<Vec<u8>, (Entry, u64)>,
    /// Recency: tick -> key (the cache evicts the oldest).
    order: BTreeMap<u64, Vec<u8>>,
    tick: u64,
    bytes: usize,
    /// Live entries (not tombstones).
    live: usize,
    limit: usize,
    evict: bool,
    tombstone_life: Duration,
    /// Per key, the writes before the present one within `history_us` of its version.
    earlier: HashMap<Vec<u8>, Earlier>,
    /// How far back, in versions (microseconds), earlier writes are remembered; 0: none.
    history_us: u64,
    /// Items evicted to make room.
    pub evictions: u64,
}

impl Store {
    /// A store of at most `limit` bytes; `evict`: make room by dropping the least recently
    /// used items (a cache) instead of refusing writes (a store).
    pub fn new(limit: usize, evict: bool) -> Store {
        Store {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            bytes: 0,
            live: 0,
            limit,
            evict,
            tombstone_life: Duration::from_secs(60),
            earlier: HashMap::new(),
            history_us: 0,
            evictions: 0,
        }
    }

    /// Remembers each key's earlier writes `us` back (in versions, which are microseconds):
    /// as long as a requester may retry one.
    pub fn keep_history(&mut self, us: u64) {
        self.history_us = us;
    }

    /// The version of the write of `key` with `origin`, if it is the present one or one
    /// remembered ([`Store::keep_history`]).
    pub fn wrote(&self, key: &[u8], origin: u64) -> Option<u64> {
        let (e, _) = self.entries.get(key)?;
        if e.origin() == origin {
            return Some(e.version());
        }
        self.earlier
            .get(key)?
            .iter()
            .find(|(o, _)| *o == origin)
            .map(|&(_, v)| v)
    }

    /// The earlier writes of `key` remembered here (sent with its copies).
    pub fn earlier(&self, key: &[u8]) -> Earlier {
        self.earlier.get(key).cloned().unwrap_or_default()
    }

    /// Adds earlier writes of `key` another server remembers.
    pub fn learn(&mut self, key: &[u8], from: &[(u64, u64)]) {
        if self.history_us == 0 || from.is_empty() {
            return;
        }
        let e = self.earlier.entry(key.to_vec()).or_default();
        for w in from {
            if !e.contains(w) {
                e.push(*w);
            }
        }
        self.prune(key);
    }

    /// Keeps `key`'s earlier writes within the horizon and the bound, oldest first, and
    /// none that is the present write.
    fn prune(&mut self, key: &[u8]) {
        let Some(e) = self.earlier.get_mut(key) else {
            return;
        };
        let (now_o, now_v) = self
            .entries
            .get(key)
            .map_or((0, 0), |(x, _)| (x.origin(), x.version()));
        let horizon = self.history_us;
        e.retain(|&(o, v)| o != now_o && v.saturating_add(horizon) >= now_v);
        e.sort_unstable_by_key(|&(_, v)| v);
        if e.len() > MAX_EARLIER {
            e.drain(..e.len() - MAX_EARLIER);
        }
        if e.is_empty() {
            self.earlier.remove(key);
        }
    }

    /// Live items (expired ones may still be counted until touched).
    pub fn items(&self) -> usize {
        self.live
    }

    /// Bytes accounted.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn touch(&mut self, key: &[u8]) {
        if let Some((_, t)) = self.entries.get_mut(key) {
            self.order.remove(t);
            self.tick += 1;
            *t = self.tick;
            self.order.insert(self.tick, key.to_vec());
        }
    }

    /// The live item at `key` at `now` (an expired one is dropped).
    pub fn get(&mut self, key: &[u8], now: Time) -> Option<&Item> {
        let expired = match self.entries.get(key) {
            Some((Entry::Live(i), _)) => i.expired(now),
            _ => return None,
        };
        if expired {
            self.remove(key);
            return None;
        }
        self.touch(key);
        match self.entries.get(key) {
            Some((Entry::Live(i), _)) => Some(i),
            _ => None,
        }
    }

    /// The highest version this store has seen for `key` (live or deleted), 0 if none.
    pub fn version(&self, key: &[u8]) -> u64 {
        self.entries.get(key).map_or(0, |(e, _)| e.version())
    }

    fn insert(&mut self, key: &[u8], e: Entry) -> Result<(), Full> {
        let need = e.size(key);
        let old = self.entries.get(key).map_or(0, |(o, _)| o.size(key));
        while self.bytes + need > self.limit + old {
            if !self.evict {
                return Err(Full);
            }
            let Some((&t, victim)) = self.order.iter().next() else {
                return Err(Full);
            };
            let victim = victim.clone();
            self.order.remove(&t);
            if victim == key {
                continue;
            }
            if let Some((v, _)) = self.entries.remove(&victim) {
                self.bytes -= v.size(&victim);
                self.live -= usize::from(matches!(v, Entry::Live(_)));
                self.evictions += 1;
            }
        }
        if let Some((o, t)) = self.entries.remove(key) {
            if self.history_us > 0 && o.origin() != 0 && o.origin() != e.origin() {
                self.earlier
                    .entry(key.to_vec())
                    .or_default()
                    .push((o.origin(), o.version()));
            }
            self.bytes -= o.size(key);
            self.live -= usize::from(matches!(o, Entry::Live(_)));
            self.order.remove(&t);
        }
        self.live += usize::from(matches!(e, Entry::Live(_)));
        self.tick += 1;
        self.bytes += need;
        self.order.insert(self.tick, key.to_vec());
        self.entries.insert(key.to_vec(), (e, self.tick));
        self.prune(key);
        Ok(())
    }

    /// Stores `item` at `key`.
    pub fn put(&mut self, key: &[u8], item: Item) -> Result<(), Full> {
        self.insert(key, Entry::Live(item))
    }

    /// Deletes `key` at `version` (by write `origin`), leaving a tombstone until `now` + its
    /// lifetime.
    pub fn delete(&mut self, key: &[u8], version: u64, origin: u64, now: Time) {
        let until = now + self.tombstone_life;
        // A tombstone always fits: it replaces something at least as large, or makes room.
        let _ = self.insert(
            key,
            Entry::Tombstone {
                version,
                origin,
                until,
            },
        );
    }

    /// The origin of the last write of `key` (live or deleted), 0 if none.
    pub fn origin(&self, key: &[u8]) -> u64 {
        match self.entries.get(key) {
            Some((Entry::Live(i), _)) => i.origin,
            Some((Entry::Tombstone { origin, .. }, _)) => *origin,
            None => 0,
        }
    }

    /// Whether `key` is deleted (a tombstone is here).
    pub fn is_deleted(&self, key: &[u8]) -> bool {
        matches!(self.entries.get(key), Some((Entry::Tombstone { .. }, _)))
    }

    /// Forgets every entry older than version `floor` (flush_all).
    pub fn remove_below(&mut self, floor: u64) -> usize {
        let old: Vec<Vec<u8>> = self
            .entries
            .iter()
            .filter(|(_, (e, _))| e.version() < floor)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &old {
            self.remove(k);
        }
        old.len()
    }

    /// Every key held (live or deleted).
    pub fn keys(&self) -> Vec<Vec<u8>> {
        self.entries.keys().cloned().collect()
    }

    /// Live keys with their versions.
    pub fn live(&self) -> impl Iterator<Item = (&[u8], u64)> + '_ {
        self.entries.iter().filter_map(|(k, (e, _))| match e {
            Entry::Live(i) => Some((k.as_slice(), i.version)),
            Entry::Tombstone { .. } => None,
        })
    }

    /// Applies a copy sent by a primary: only when it is newer than what is here, so copies
    /// that arrive late or twice change nothing. Returns whether it was applied.
    pub fn apply_copy(&mut self, key: &[u8], copy: Copy, now: Time) -> Result<bool, Full> {
        let v = copy.version();
        if v <= self.version(key) && self.entries.contains_key(key) {
            return Ok(false);
        }
        match copy {
            Copy::Item(i) => self.put(key, i)?,
            Copy::Deleted { version, origin } => self.delete(key, version, origin, now),
        }
        Ok(true)
    }

    /// Forgets `key` entirely (a cache invalidation).
    pub fn remove(&mut self, key: &[u8]) {
        self.earlier.remove(key);
        if let Some((e, t)) = self.entries.remove(key) {
            self.bytes -= e.size(key);
            self.live -= usize::from(matches!(e, Entry::Live(_)));
            self.order.remove(&t);
        }
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.earlier.clear();
        self.live = 0;
        self.order.clear();
        self.bytes = 0;
    }

    /// Drops expired items and old tombstones.
    pub fn sweep(&mut self, now: Time) {
        let dead: Vec<Vec<u8>> = self
            .entries
            .iter()
            .filter(|(_, (e, _))| match e {
                Entry::Live(i) => i.expired(now),
                Entry::Tombstone { until, .. } => *until <= now,
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in dead {
            self.remove(&k);
        }
    }

    /// Every key with what a copy of it would carry.
    pub fn copies(&self) -> impl Iterator<Item = (&[u8], Copy)> + '_ {
        self.entries.iter().map(|(k, (e, _))| {
            let c = match e {
                Entry::Live(i) => Copy::Item(i.clone()),
                Entry::Tombstone {
                    version, origin, ..
                } => Copy::Deleted {
                    version: *version,
                    origin: *origin,
                },
            };
            (k.as_slice(), c)
        })
    }

    /// The copy of one key, if the store has anything for it.
    pub fn copy_of(&self, key: &[u8]) -> Option<Copy> {
        self.entries.get(key).map(|(e, _)| match e {
            Entry::Live(i) => Copy::Item(i.clone()),
            Entry::Tombstone {
                version, origin, ..
            } => Copy::Deleted {
                version: *version,
                origin: *origin,
            },
        })
    }
}

/// What a primary sends a replica for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Copy {
    /// The item.
    Item(Item),
    /// Deleted at this version (by write `origin`).
    Deleted {
        /// The deleting version.
        version: u64,
        /// The deleting write.
        origin: u64,
    },
}

impl Copy {
    /// Its version.
    pub fn version(&self) -> u64 {
        match self {
            Copy::Item(i) => i.version,
            Copy::Deleted { version, .. } => *version,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(n: usize, version: u64) -> Item {
        Item {
            value: vec![1; n],
            flags: 0,
            expires: None,
            version,
            origin: 0,
        }
    }

    #[test]
    fn earlier_writes_are_remembered_within_the_horizon_and_the_bound() {
        let mut s = Store::new(1 << 20, false);
        s.keep_history(1000);
        let w = |origin, version| Item {
            origin,
            ..item(4, version)
        };
        s.put(b"k", w(11, 100)).unwrap();
        s.put(b"k", w(12, 200)).unwrap();
        s.delete(b"k", 300, 13, Time::ZERO);
        assert_eq!(s.wrote(b"k", 11), Some(100));
        assert_eq!(s.wrote(b"k", 12), Some(200));
        assert_eq!(s.wrote(b"k", 13), Some(300), "the present write");
        assert_eq!(s.wrote(b"k", 14), None);
        // Past the horizon, forgotten.
        s.put(b"k", w(15, 1250)).unwrap();
        assert_eq!(s.wrote(b"k", 11), None);
        assert_eq!(s.wrote(b"k", 12), None);
        assert_eq!(s.wrote(b"k", 13), Some(300));
        // Learnt from another server, and bounded (the newest kept).
        let many: Earlier = (0..100).map(|i| (1000 + i, 1100 + i)).collect();
        s.learn(b"k", &many);
        assert_eq!(s.earlier(b"k").len(), MAX_EARLIER);
        assert_eq!(s.wrote(b"k", 1099), Some(1199));
        assert_eq!(s.wrote(b"k", 1000), None);
        // A store that keeps no history (a cache) remembers only the present write.
        let mut c = Store::new(1 << 20, true);
        c.put(b"k", w(11, 100)).unwrap();
        c.put(b"k", w(12, 200)).unwrap();
        assert_eq!(c.wrote(b"k", 11), None);
        c.learn(b"k", &many);
        assert!(c.earlier(b"k").is_empty());
        // Forgetting a key forgets its history.
        s.remove(b"k");
        assert!(s.earlier(b"k").is_empty());
    }

    #[test]
    fn a_store_refuses_and_a_cache_evicts_the_least_recent() {
        let now = Time::ZERO;
        let mut s = Store::new(1000, false);
        s.put(b"a", item(500, 1)).unwrap();
        assert_eq!(s.put(b"b", item(500, 1)), Err(Full));
        let mut c = Store::new(1000, true);
        c.put(b"a", item(300, 1)).unwrap();
        c.put(b"b", item(300, 1)).unwrap();
        assert!(c.get(b"a", now).is_some());
        c.put(b"c", item(300, 1)).unwrap();
        assert!(c.get(b"b", now).is_none(), "b was the least recently used");
        assert!(c.get(b"a", now).is_some() && c.get(b"c", now).is_some());
        assert_eq!(c.evictions, 1);
    }

    #[test]
    fn copies_apply_only_when_newer_and_tombstones_win() {
        let now = Time::ZERO;
        let mut s = Store::new(1 << 20, false);
        assert!(s.apply_copy(b"k", Copy::Item(item(3, 5)), now).unwrap());
        assert!(!s.apply_copy(b"k", Copy::Item(item(3, 4)), now).unwrap());
        assert!(s
            .apply_copy(
                b"k",
                Copy::Deleted {
                    version: 6,
                    origin: 1
                },
                now
            )
            .unwrap());
        assert!(
            !s.apply_copy(b"k", Copy::Item(item(3, 5)), now).unwrap(),
            "no resurrection"
        );
        assert!(s.get(b"k", now).is_none());
        assert_eq!(s.version(b"k"), 6);
        assert_eq!(s.origin(b"k"), 1);
        assert!(s.is_deleted(b"k"));
        s.put(b"j", item(3, 9)).unwrap();
        assert_eq!(
            s.remove_below(7),
            1,
            "flush drops what is older than its floor"
        );
        assert_eq!(s.keys(), vec![b"j".to_vec()]);
    }

    #[test]
    fn expired_items_are_gone() {
        let mut s = Store::new(1 << 20, false);
        let mut i = item(1, 1);
        i.expires = Some(Time::from_nanos(10));
        s.put(b"k", i).unwrap();
        assert!(s.get(b"k", Time::from_nanos(9)).is_some());
        assert!(s.get(b"k", Time::from_nanos(10)).is_none());
        assert_eq!(s.bytes(), 0);
    }
}
