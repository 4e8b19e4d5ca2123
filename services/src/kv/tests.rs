//! The store's protocol over a deterministic message-level network: servers of a small torus
//! exchange messages with a fixed delay, fail and restart on cue, and the tests check what
//! clients see (values, versions, nothing lost) and what servers hold (copies per key).

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::service::{Engine, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims};
use torusnet_proto::transport::{FailReason, SendError};

use super::ops::{Mode, Op, Outcome, Ttl};
use super::{Kv, KvConfig, KvCounters, KvReply, KvRequest, KV};

const DELAY: Duration = Duration::from_micros(20);

struct Msg {
    at: Time,
    src: Coord,
    dst: Coord,
    data: Vec<u8>,
    tag: u64,
}

/// What one server's service may do during a call: send into the network.
struct TestEngine<'a> {
    local: Coord,
    dims: Dims,
    up: &'a [bool],
    now: Time,
    out: &'a mut Vec<Msg>,
}

fn ring(a: u16, b: u16, n: u16) -> u32 {
    let d = a.abs_diff(b);
    u32::from(d.min(n - d))
}

impl Engine for TestEngine<'_> {
    fn local(&self) -> Coord {
        self.local
    }
    fn dims(&self) -> Dims {
        self.dims
    }
    fn incarnation(&self) -> u64 {
        1
    }
    fn is_reachable(&self, c: Coord) -> bool {
        self.dims.contains(c) && self.up[self.dims.index(c)]
    }
    fn distance(&self, c: Coord) -> Option<u32> {
        let (a, d) = (self.local, self.dims);
        self.is_reachable(c)
            .then(|| ring(a.x, c.x, d.x()) + ring(a.y, c.y, d.y()) + ring(a.z, c.z, d.z()))
    }
    fn send(
        &mut self,
        _now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError> {
        assert_eq!(service, KV);
        let Target::Server(dst) = target else {
            panic!("the store sends to servers");
        };
        if !self.is_reachable(dst) {
            return Err(SendError::Unreachable);
        }
        self.out.push(Msg {
            at: self.now + DELAY,
            src: self.local,
            dst,
            data: data.to_vec(),
            tag: opts.tag,
        });
        Ok(())
    }
    fn notify_acks(&mut self, _service: u16, _on: bool) {}
}

struct Net {
    dims: Dims,
    cfg: KvConfig,
    kv: Vec<Kv>,
    up: Vec<bool>,
    /// Servers whose messages vanish while the others still see them up.
    silent: Vec<bool>,
    /// Servers whose view lags: what they take to be up, until `catch_up`.
    lagging: Vec<Option<Vec<bool>>>,
    now: Time,
    wire: Vec<Msg>,
}

impl Net {
    fn new(dims: Dims, cfg: KvConfig) -> Net {
        let n = dims.count() as usize;
        let mut net = Net {
            dims,
            kv: (0..n)
                .map(|_| Kv::new(cfg.clone(), Arc::new(KvCounters::default())))
                .collect(),
            cfg,
            up: vec![true; n],
            silent: vec![false; n],
            lagging: vec![None; n],
            now: Time::from_nanos(1_000_000_000),
            wire: Vec::new(),
        };
        net.run(Duration::from_millis(5));
        net
    }

    fn with<R>(&mut self, i: usize, f: impl FnOnce(&mut Kv, &mut TestEngine<'_>) -> R) -> R {
        let mut out = Vec::new();
        let r = {
            let mut e = TestEngine {
                local: self.dims.coord(i),
                dims: self.dims,
                up: self.lagging[i].as_deref().unwrap_or(&self.up),
                now: self.now,
                out: &mut out,
            };
            f(&mut self.kv[i], &mut e)
        };
        self.wire.extend(out);
        r
    }

    fn event(&mut self, i: usize, e: Event) {
        let now = self.now;
        self.with(i, |kv, en| kv.on_event(now, &e, en));
    }

    /// Runs the network for `d`: delivers what is due, polls every server.
    fn run(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.wire.sort_by_key(|m| m.at);
            let due: Vec<Msg> = {
                let k = self.wire.iter().take_while(|m| m.at <= self.now).count();
                self.wire.drain(..k).collect()
            };
            for m in due {
                let (s, t) = (self.dims.index(m.src), self.dims.index(m.dst));
                if self.silent[t] || self.silent[s] {
                    continue;
                }
                if !self.up[t] {
                    if self.up[s] && m.tag != 0 {
                        let ev = Event::Failed {
                            peer: m.dst,
                            service: KV,
                            tags: vec![m.tag],
                            reason: FailReason::Unreachable,
                        };
                        self.event(s, ev);
                    }
                    continue;
                }
                let ev = Event::Message {
                    src: m.src,
                    service: KV,
                    data: m.data,
                    reliable: true,
                    key: None,
                };
                self.event(t, ev);
            }
            let now = self.now;
            for i in 0..self.kv.len() {
                if self.up[i] {
                    self.with(i, |kv, en| {
                        kv.poll(now, en);
                    });
                }
            }
            self.now = self.now + Duration::from_micros(10);
        }
    }

    /// `c` fails; every server but the lagging ones learns it at once.
    fn crash(&mut self, c: Coord) {
        let i = self.dims.index(c);
        self.up[i] = false;
        for j in 0..self.kv.len() {
            if self.up[j] && self.lagging[j].is_none() {
                self.event(j, Event::Unreachable(c));
            }
        }
    }

    /// Server `i` keeps its present view while the others' views change.
    fn lag(&mut self, i: usize) {
        self.lagging[i] = Some(self.up.clone());
    }

    /// Server `i`'s view catches up: it learns of the failures it missed.
    fn catch_up(&mut self, i: usize) {
        let Some(old) = self.lagging[i].take() else {
            return;
        };
        let gone: Vec<Coord> = (0..self.kv.len())
            .filter(|&j| old[j] && !self.up[j])
            .map(|j| self.dims.coord(j))
            .collect();
        for c in gone {
            self.event(i, Event::Unreachable(c));
        }
    }

    /// Every other server's view drops `c` (its control process is gone, its hellos with
    /// it) while `c` itself, its view unchanged, still exchanges messages with them.
    fn cut_off(&mut self, c: Coord) {
        let i = self.dims.index(c);
        let mut without = self.up.clone();
        without[i] = false;
        for j in 0..self.kv.len() {
            if j != i && self.up[j] {
                self.lagging[j] = Some(without.clone());
                self.event(j, Event::Unreachable(c));
            }
        }
    }

    fn restart(&mut self, c: Coord) {
        let i = self.dims.index(c);
        self.kv[i] = Kv::new(self.cfg.clone(), Arc::new(KvCounters::default()));
        self.rejoin(c);
    }

    /// `c` comes back with what it held (it was cut off, not restarted).
    fn rejoin(&mut self, c: Coord) {
        let i = self.dims.index(c);
        self.up[i] = true;
        for j in 0..self.kv.len() {
            if self.up[j] && j != i {
                self.event(i, Event::Reachable(self.dims.coord(j)));
                self.event(j, Event::Reachable(c));
            }
        }
        for j in 0..self.kv.len() {
            if self.up[j] && j != i {
                self.event(j, Event::Reachable(c));
            }
        }
    }

    fn submit(&mut self, at: Coord, key: &[u8], op: Op) -> Receiver<KvReply> {
        let (tx, rx) = channel();
        let now = self.now;
        let req = Box::new(KvRequest::Op {
            key: key.to_vec(),
            op,
            reply: tx,
        });
        let i = self.dims.index(at);
        self.with(i, |kv, en| kv.on_request(now, req, en).ok());
        rx
    }

    fn op(&mut self, at: Coord, key: &[u8], op: Op) -> Outcome {
        self.op_result(at, key, op)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The answer to `op`, an error included.
    fn op_result(&mut self, at: Coord, key: &[u8], op: Op) -> Result<Outcome, super::KvError> {
        let rx = self.submit(at, key, op);
        for _ in 0..100_000 {
            if let Ok(r) = rx.try_recv() {
                return r.result;
            }
            self.run(Duration::from_micros(50));
        }
        panic!("no answer");
    }

    fn set(&mut self, at: Coord, key: &[u8], value: &[u8]) -> u64 {
        match self.op(at, key, store(Mode::Set, value)) {
            Outcome::Stored(v) => v,
            o => panic!("set: {o:?}"),
        }
    }

    fn get(&mut self, at: Coord, key: &[u8]) -> Option<Vec<u8>> {
        match self.op(at, key, Op::Get) {
            Outcome::Value(i) => Some(i.value),
            Outcome::NotFound => None,
            o => panic!("get: {o:?}"),
        }
    }

    fn held(&mut self, i: usize) -> Value {
        let (tx, rx) = channel();
        let now = self.now;
        self.with(i, |kv, en| {
            kv.on_request(now, Box::new(KvRequest::Held { reply: tx }), en)
                .ok()
        });
        rx.recv().unwrap_or(Value::Null)
    }

    /// How many live servers hold each key (at its newest version).
    fn copies(&mut self) -> BTreeMap<String, usize> {
        let mut newest: HashMap<String, u64> = HashMap::new();
        let mut all = Vec::new();
        for i in 0..self.kv.len() {
            if !self.up[i] {
                continue;
            }
            let h = self.held(i);
            for k in h["keys"].as_array().cloned().unwrap_or_default() {
                let key = k[0].as_str().unwrap_or("").to_string();
                let v = k[1].as_u64().unwrap_or(0);
                let e = newest.entry(key.clone()).or_insert(v);
                *e = (*e).max(v);
                all.push((key, v));
            }
        }
        let mut out = BTreeMap::new();
        for (k, v) in all {
            if newest.get(&k) == Some(&v) {
                *out.entry(k).or_insert(0) += 1;
            }
        }
        out
    }

    fn stats(&self, i: usize) -> super::KvStats {
        self.kv[i].counters.snapshot()
    }
}

fn store(mode: Mode, v: &[u8]) -> Op {
    Op::Store {
        mode,
        value: v.to_vec(),
        flags: 0,
        ttl: Ttl::Never,
        cas: None,
    }
}

fn cfg() -> KvConfig {
    KvConfig {
        rereplicate_after: Duration::from_secs(2),
        epoch_us: 1_000_000,
        ..KvConfig::default()
    }
}

fn d333() -> Dims {
    Dims::new(3, 3, 3).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_value_written_anywhere_reads_back_everywhere_with_r_copies() {
    let mut net = Net::new(d333(), cfg());
    let a = Coord::new(0, 0, 0);
    let mut versions = Vec::new();
    for k in 0..30 {
        versions.push(net.set(
            a,
            format!("key{k}").as_bytes(),
            format!("value{k}").as_bytes(),
        ));
    }
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "versions grow");
    for i in 0..27 {
        let c = net.dims.coord(i);
        for k in [0, 7, 29] {
            let v = net.get(c, format!("key{k}").as_bytes());
            assert_eq!(v.as_deref(), Some(format!("value{k}").as_bytes()));
        }
    }
    let copies = net.copies();
    assert_eq!(copies.len(), 30);
    assert!(copies.values().all(|&n| n == 3), "{copies:?}");
}

#[test]
fn memcached_semantics_hold_through_the_primary() {
    let mut net = Net::new(d333(), cfg());
    let (a, b) = (Coord::new(1, 1, 1), Coord::new(2, 0, 1));
    assert!(matches!(
        net.op(a, b"n", store(Mode::Add, b"5")),
        Outcome::Stored(_)
    ));
    assert_eq!(net.op(b, b"n", store(Mode::Add, b"6")), Outcome::NotStored);
    let incr = Op::Arith {
        incr: true,
        delta: 10,
        init: None,
    };
    assert!(matches!(net.op(b, b"n", incr), Outcome::Number(15, _)));
    let Outcome::Value(item) = net.op(a, b"n", Op::Get) else {
        panic!()
    };
    let stale = Op::Store {
        mode: Mode::Set,
        value: b"x".to_vec(),
        flags: 0,
        ttl: Ttl::Never,
        cas: Some(item.version - 1),
    };
    assert_eq!(net.op(b, b"n", stale), Outcome::Exists);
    let fresh = Op::Store {
        mode: Mode::Set,
        value: b"x".to_vec(),
        flags: 0,
        ttl: Ttl::Never,
        cas: Some(item.version),
    };
    assert!(matches!(net.op(b, b"n", fresh), Outcome::Stored(v) if v > item.version));
    assert_eq!(net.op(a, b"n", Op::Delete { cas: None }), Outcome::Deleted);
    assert_eq!(net.get(b, b"n"), None);
    assert_eq!(
        net.op(b, b"n", store(Mode::Append, b"y")),
        Outcome::NotStored
    );
}

#[test]
fn a_failed_primary_loses_nothing_and_copies_come_back() {
    let mut net = Net::new(d333(), cfg());
    let a = Coord::new(0, 0, 0);
    for k in 0..100 {
        net.set(a, format!("k{k}").as_bytes(), format!("v{k}").as_bytes());
    }
    // The server holding the most keys fails.
    let before = net.copies();
    assert!(before.values().all(|&n| n == 3));
    let per_server: Vec<usize> = (0..27)
        .map(|i| net.held(i)["keys"].as_array().map_or(0, Vec::len))
        .collect();
    let victim = (0..27).max_by_key(|&i| per_server[i]).unwrap_or(0);
    let vc = net.dims.coord(victim);
    assert_ne!(vc, a);
    net.crash(vc);
    let mut lost = 0;
    for k in 0..100 {
        let at = net.dims.coord((k * 7) % 27);
        let at = if at == vc { a } else { at };
        if net.get(at, format!("k{k}").as_bytes()) != Some(format!("v{k}").into_bytes()) {
            lost += 1;
        }
    }
    assert_eq!(lost, 0);
    // Writes go on meanwhile, to the new replica sets.
    for k in 0..10 {
        net.set(a, format!("k{k}").as_bytes(), b"new");
    }
    net.run(Duration::from_secs(3));
    let after = net.copies();
    assert_eq!(after.len(), 100);
    assert!(after.values().all(|&n| n >= 3), "{after:?}");
    let rerep: u64 = (0..27).map(|i| net.stats(i).rereplicated).sum();
    assert!(rerep >= per_server[victim] as u64 - 10, "{rerep}");
    // It comes back empty and catches up.
    net.restart(vc);
    net.run(Duration::from_millis(500));
    assert_eq!(net.stats(victim).caught_up, 1);
    let held = net.held(victim)["keys"].as_array().map_or(0, Vec::len);
    assert!(
        held >= per_server[victim],
        "{held} < {}",
        per_server[victim]
    );
    for k in 0..100 {
        let want = if k < 10 {
            b"new".to_vec()
        } else {
            format!("v{k}").into_bytes()
        };
        assert_eq!(net.get(vc, format!("k{k}").as_bytes()), Some(want));
    }
}

#[test]
fn a_write_retried_after_its_primary_failed_is_applied_once() {
    let mut net = Net::new(d333(), cfg());
    let a = Coord::new(0, 0, 0);
    // A key whose primary is not `a`, and not `a`'s replica set either.
    let key = (0..)
        .map(|k| format!("ctr{k}"))
        .find(|k| {
            let kh = super::routing_key(k.as_bytes());
            let up = vec![true; 27];
            let mut out = Vec::new();
            let e = TestEngine {
                local: a,
                dims: net.dims,
                up: &up,
                now: net.now,
                out: &mut out,
            };
            !e.servers_for_key(kh, 3).contains(&a)
        })
        .unwrap_or_default();
    net.set(a, key.as_bytes(), b"100");
    let kh = super::routing_key(key.as_bytes());
    let primary = net.with(0, |_, e| e.key_root(kh)).unwrap_or(a);
    let incr = Op::Arith {
        incr: true,
        delta: 1,
        init: None,
    };
    let rx = net.submit(a, key.as_bytes(), incr);
    // The primary takes it, replicates, and fails before its answer leaves.
    let pi = net.dims.index(primary);
    for _ in 0..1000 {
        net.run(Duration::from_micros(10));
        if net.stats(pi).copies_sent > 0 && net.wire.iter().any(|m| m.src == primary && m.dst == a)
        {
            break;
        }
    }
    net.wire.retain(|m| !(m.src == primary && m.dst == a));
    net.crash(primary);
    let mut out = None;
    for _ in 0..10_000 {
        net.run(Duration::from_micros(100));
        if let Ok(r) = rx.try_recv() {
            out = Some(r.result);
            break;
        }
    }
    assert!(matches!(out, Some(Ok(Outcome::Number(101, _)))), "{out:?}");
    assert_eq!(net.get(a, key.as_bytes()), Some(b"101".to_vec()));
}

#[test]
fn cached_reads_see_every_acknowledged_write() {
    let mut net = Net::new(d333(), cfg());
    let w = Coord::new(0, 0, 0);
    for k in 0..20 {
        net.set(w, format!("hot{k}").as_bytes(), b"one");
    }
    for _ in 0..3 {
        for i in 0..27 {
            let c = net.dims.coord(i);
            for k in 0..20 {
                assert_eq!(
                    net.get(c, format!("hot{k}").as_bytes()),
                    Some(b"one".to_vec())
                );
            }
        }
    }
    let hits: u64 = (0..27).map(|i| net.stats(i).cache_hits).sum();
    assert!(hits > 0, "reads were served by cache servers");
    for k in 0..20 {
        net.set(w, format!("hot{k}").as_bytes(), b"two");
    }
    let inval: u64 = (0..27).map(|i| net.stats(i).invalidations).sum();
    assert!(inval > 0);
    for i in 0..27 {
        let c = net.dims.coord(i);
        for k in 0..20 {
            assert_eq!(
                net.get(c, format!("hot{k}").as_bytes()),
                Some(b"two".to_vec())
            );
        }
    }
}

#[test]
fn a_cache_server_whose_view_lags_never_serves_a_copy_older_than_an_acknowledged_write() {
    let mut net = Net::new(d333(), cfg());
    let key = b"hot";
    net.set(Coord::new(0, 0, 0), key, b"one");
    for i in 0..27 {
        assert_eq!(net.get(net.dims.coord(i), key), Some(b"one".to_vec()));
    }
    let primary = net.with(0, |_, en| en.key_root(super::routing_key(key)));
    let primary = primary.expect("a primary");
    let p = net.dims.index(primary);
    // A cache server that is not the key's next primary (whose lagging view would only
    // redirect the write).
    let next = net.with(0, |_, en| en.servers_for_key(super::routing_key(key), 2));
    let c = (0..27)
        .find(|&i| !next.contains(&net.dims.coord(i)) && net.kv[i].cache.items() > 0)
        .expect("a cache server holds a copy");
    // The primary fails; the cache server's view still shows it while a write is
    // acknowledged by the new primary.
    net.lag(c);
    net.crash(primary);
    let writer = (0..27)
        .find(|&i| i != p && i != c)
        .map(|i| net.dims.coord(i));
    let writer = writer.expect("a writer");
    net.set(writer, key, b"two");
    // Every live server reads it, the cache server's view still lagging: no read may see the
    // overwritten value, then or once the view caught up.
    let readers: Vec<(Receiver<KvReply>, usize)> = (0..27)
        .filter(|&i| i != p)
        .map(|i| (net.submit(net.dims.coord(i), key, Op::Get), i))
        .collect();
    net.run(Duration::from_millis(300));
    net.catch_up(c);
    net.run(Duration::from_secs(4));
    for (rx, i) in readers {
        let r = rx.try_recv().expect("every read ends");
        match r.result {
            Ok(Outcome::Value(item)) => assert_eq!(item.value, b"two", "read at {i}"),
            other => panic!("read at {i}: {other:?}"),
        }
    }
}

#[test]
fn a_retried_write_that_was_overwritten_meanwhile_is_not_applied_again() {
    // A requester retries a write with the same id when its first attempt's answer was a
    // redirect (a holder refused) or never came, though the write may have landed. Here the
    // retry reaches the primary after a newer write was acknowledged.
    let mut net = Net::new(d333(), cfg());
    let key = b"reg";
    let primary = net.with(0, |_, en| en.key_root(super::routing_key(key)));
    let primary = primary.expect("a primary");
    let p = net.dims.index(primary);
    let q = net.dims.coord((p + 1) % 27);
    let other = net.dims.coord((p + 2) % 27);
    let rx = net.submit(q, key, store(Mode::Set, b"first"));
    // Requests leave when the requester is polled.
    net.run(Duration::from_micros(10));
    let retry = net
        .wire
        .iter()
        .find(|m| m.src == q && m.dst == primary)
        .map(|m| Msg {
            at: m.at,
            src: m.src,
            dst: m.dst,
            data: m.data.clone(),
            tag: m.tag,
        })
        .expect("the request on the wire");
    net.run(Duration::from_millis(50));
    assert!(matches!(
        rx.try_recv().map(|r| r.result),
        Ok(Ok(Outcome::Stored(_)))
    ));
    net.set(other, key, b"second");
    let mut retry = retry;
    retry.at = net.now;
    net.wire.push(retry);
    net.run(Duration::from_millis(50));
    for i in 0..27 {
        let at = net.dims.coord(i);
        assert_eq!(net.get(at, key), Some(b"second".to_vec()), "read at {at}");
    }
}

#[test]
fn a_cached_copy_is_served_only_within_its_lease() {
    let mut net = Net::new(d333(), cfg());
    let key = b"hot";
    net.set(Coord::new(0, 0, 0), key, b"one");
    let read_all = |net: &mut Net| {
        for i in 0..27 {
            assert_eq!(net.get(net.dims.coord(i), key), Some(b"one".to_vec()));
        }
    };
    let counts = |net: &Net| -> (u64, u64) {
        (0..27).fold((0, 0), |(h, m), i| {
            let s = net.stats(i);
            (h + s.cache_hits, m + s.cache_misses)
        })
    };
    read_all(&mut net);
    read_all(&mut net);
    let (hits, misses) = counts(&net);
    assert!(hits > 0 && misses > 0, "{hits} hits, {misses} misses");
    // Within the lease the second round was served from the copies; past it every cache
    // server asks the primary again.
    net.run(super::cache::LEASE);
    read_all(&mut net);
    let (_, again) = counts(&net);
    assert_eq!(again, 2 * misses, "each cache server filled once more");
}

#[test]
fn a_cache_server_whose_invalidation_went_unanswered_serves_no_older_copy() {
    // A cache server that neither confirms an invalidation nor is reported failed (its
    // messages lost for longer than the primary waits, as under loss on a loaded link):
    // the write is turned back, its retry acknowledged, and the cache server, heard again,
    // must not serve its copy of the overwritten value.
    let mut net = Net::new(d333(), cfg());
    let key = b"hot";
    net.set(Coord::new(0, 0, 0), key, b"one");
    for i in 0..27 {
        assert_eq!(net.get(net.dims.coord(i), key), Some(b"one".to_vec()));
    }
    let kh = super::routing_key(key);
    let holders = net.with(0, |_, en| en.servers_for_key(kh, 3));
    let c = (0..27)
        .find(|&i| !holders.contains(&net.dims.coord(i)) && net.kv[i].cache.items() > 0)
        .expect("a cache server holds a copy");
    let writer = (0..27)
        .find(|&i| i != c && !holders.contains(&net.dims.coord(i)))
        .map(|i| net.dims.coord(i))
        .expect("a writer");
    net.silent[c] = true;
    let rx = net.submit(writer, key, store(Mode::Set, b"two"));
    net.run(Duration::from_millis(2500));
    net.silent[c] = false;
    net.run(Duration::from_secs(3));
    let w = rx.try_recv().expect("the write ended");
    assert!(
        matches!(w.result, Ok(Outcome::Stored(_))),
        "the write: {:?}",
        w.result
    );
    for i in 0..27 {
        let at = net.dims.coord(i);
        assert_eq!(net.get(at, key), Some(b"two".to_vec()), "read at {at}");
    }
}

#[test]
fn a_primary_the_others_no_longer_see_answers_nothing_from_its_copy() {
    let mut net = Net::new(d333(), cfg());
    let key = b"k";
    net.set(Coord::new(0, 0, 0), key, b"one");
    let primary = net.with(0, |_, en| en.key_root(super::routing_key(key)));
    let primary = primary.expect("a primary");
    net.cut_off(primary);
    let writer = net.dims.coord((net.dims.index(primary) + 1) % 27);
    net.set(writer, key, b"two");
    // The cut-off primary still takes itself for the key's primary.
    let r = net.op_result(primary, key, Op::Get);
    assert!(
        !matches!(&r, Ok(Outcome::Value(i)) if i.value == b"one"),
        "a read at the cut-off primary saw the overwritten value: {r:?}"
    );
    let w = net.op_result(primary, key, store(Mode::Set, b"three"));
    assert!(w.is_err(), "a write there was acknowledged: {w:?}");
    let not_primary = net.stats(net.dims.index(primary)).not_primary;
    assert!(not_primary > 0, "counted");
    // The rest of the torus goes on: a write there may or may not have landed.
    let v = net.get(writer, key);
    assert!(
        v == Some(b"two".to_vec()) || v == Some(b"three".to_vec()),
        "{v:?}"
    );
}

#[test]
fn flush_all_empties_every_server_and_versions_keep_growing() {
    let mut net = Net::new(d333(), cfg());
    let a = Coord::new(2, 2, 2);
    let v1 = net.set(a, b"x", b"1");
    let (tx, rx) = channel();
    let now = net.now;
    net.with(net.dims.index(a), |kv, e| {
        kv.on_request(
            now,
            Box::new(KvRequest::Flush {
                delay: 0,
                reply: tx,
            }),
            e,
        )
        .ok()
    });
    net.run(Duration::from_millis(5));
    assert_eq!(rx.try_recv(), Ok(Ok(())));
    assert_eq!(net.get(a, b"x"), None);
    assert!(net.copies().is_empty());
    let v2 = net.set(a, b"x", b"2");
    assert!(v2 > v1);
}

#[test]
fn operations_end_by_their_deadline_when_no_server_answers() {
    let mut net = Net::new(Dims::new(2, 1, 1).unwrap_or_else(|e| panic!("{e}")), cfg());
    let a = Coord::new(0, 0, 0);
    // Find a key rooted on the other server, then cut it off without telling `a`.
    let key = (0..)
        .map(|k| format!("far{k}"))
        .find(|k| net.with(0, |_, e| e.key_root(super::routing_key(k.as_bytes()))) != Some(a))
        .unwrap_or_default();
    // A quick answer first: not slow.
    net.set(a, key.as_bytes(), b"v");
    let quick = net.stats(0);
    assert_eq!(quick.slow_ops, 0);
    assert!(quick.slowest_op_us < 1000, "{quick:?}");
    net.silent[1] = true;
    let rx = net.submit(a, key.as_bytes(), Op::Get);
    net.run(net.cfg.op_timeout + Duration::from_millis(10));
    let r = rx.try_recv().map(|r| r.result);
    assert_eq!(r, Ok(Err(super::KvError::Timeout)));
    // The timed-out operation is the slowest, counted slow.
    let s = net.stats(0);
    assert_eq!((s.timeouts, s.slow_ops), (1, 1), "{s:?}");
    assert!(
        s.slowest_op_us >= net.cfg.op_timeout.as_micros() as u64,
        "{s:?}"
    );
}

#[test]
fn a_primary_that_comes_back_never_serves_what_changed_while_it_was_away() {
    let mut net = Net::new(d333(), cfg());
    let a = Coord::new(0, 0, 0);
    let key = b"moving";
    net.set(a, key, b"old");
    let kh = super::routing_key(key);
    let p = net.with(0, |_, e| e.key_root(kh)).unwrap_or(a);
    assert_ne!(p, a);
    net.crash(p);
    net.set(a, key, b"new");
    net.rejoin(p);
    // At once, through the returning primary and through everyone else.
    assert_eq!(net.get(p, key), Some(b"new".to_vec()));
    for i in 0..27 {
        let c = net.dims.coord(i);
        assert_eq!(net.get(c, key), Some(b"new".to_vec()), "via {c:?}");
    }
    assert!(net.stats(net.dims.index(p)).fetches > 0);
}

/// A `Write` whose bytes the test can read back after the service is gone.
#[derive(Clone, Default)]
struct SharedLog(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for SharedLog {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn in_disk_mode_a_restarted_server_holds_what_it_held() {
    let mut net = Net::new(d333(), cfg());
    let victim = Coord::new(1, 2, 0);
    let vi = net.dims.index(victim);
    let log = SharedLog::default();
    let now = net.now;
    let kv = std::mem::replace(
        &mut net.kv[vi],
        Kv::new(cfg(), Arc::new(KvCounters::default())),
    );
    net.kv[vi] = kv.with_log(Vec::new(), Box::new(log.clone()), now);
    let a = Coord::new(0, 0, 0);
    for k in 0..60 {
        net.set(a, format!("d{k}").as_bytes(), format!("{k}").as_bytes());
    }
    let keys = |v: Value| -> Vec<(String, u64)> {
        v["keys"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|k| {
                        (
                            k[0].as_str().unwrap_or("").to_string(),
                            k[1].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let held = keys(net.held(vi));
    assert!(!held.is_empty());
    net.crash(victim);
    let bytes = log.0.lock().map(|b| b.clone()).unwrap_or_default();
    let (records, _) = super::log::read(&bytes, cfg().epoch_us);
    net.kv[vi] = Kv::new(cfg(), Arc::new(KvCounters::default())).with_log(
        super::log::compact(records),
        Box::new(SharedLog::default()),
        net.now,
    );
    // Before it is back in anyone's view, it holds what it held.
    assert_eq!(keys(net.held(vi)), held);
}
