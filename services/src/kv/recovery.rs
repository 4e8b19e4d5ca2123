//! Recovery: a server that starts, or comes back, is sent in the background what it should
//! hold (*catch-up*: every other server pushes the keys it has for which the newcomer is one
//! of `GetServersForKey(key, r)`), and `rereplicate_after` a server failed, primaries copy
//! their keys to the replica sets of the new view, so every key has `r` copies again. A
//! server that restarts sooner causes no migration beyond its own catch-up. Pushes go a
//! slice at a time, so operations go on meanwhile.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use torusnet_proto::service::Engine;
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;

use super::outbox::Outbox;
use super::primary::Wait;
use super::store::Store;
use super::wire::Msg;
use super::{routing_key, Kv, KvCounters};

/// Keys looked at per poll by a push.
const SLICE: usize = 256;
/// A push pauses while this many messages wait for the engine.
const BACKLOG: usize = 512;
/// How long a starting server waits for the others' catch-up before it stops counting.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a push's copy waits for its confirmation (for the re-replication count).
const PUSH_CONFIRM: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Keys the target should hold, then `CatchUpDone`.
    CatchUp(Coord),
    /// Keys this server is primary for, to their replicas.
    Rereplicate,
}

#[derive(Debug)]
struct Push {
    kind: Kind,
    keys: Vec<Vec<u8>>,
    pos: usize,
}

/// Pushes in progress, failed servers, and this server's own catch-up.
#[derive(Debug, Default)]
pub(super) struct Recovery {
    pushes: VecDeque<Push>,
    /// Failed servers: since when, and whether their copies were re-created.
    down: HashMap<Coord, (Time, bool)>,
    /// Servers whose catch-up this server waits for.
    pub(super) awaiting: HashSet<Coord>,
    catch_up_until: Option<Time>,
    pub(super) started: bool,
}

impl Recovery {
    /// At start: ask every reachable server for what this one should hold.
    pub(super) fn start(&mut self, now: Time, node: &dyn Engine, out: &mut Outbox, floor: u64) {
        self.started = true;
        let me = node.local();
        out.set_local(me);
        for c in node.dims().coords() {
            if c != me && node.is_reachable(c) {
                self.awaiting.insert(c);
                out.send(now, c, &Msg::CatchUp { floor }, 0);
            }
        }
        self.catch_up_until = Some(now + CATCH_UP_TIMEOUT);
    }

    /// Whether every server asked at start has answered (or the wait is over).
    pub(super) fn caught_up(&self) -> bool {
        self.started && self.awaiting.is_empty()
    }

    /// `c` sent everything this server should hold from it.
    pub(super) fn done_from(&mut self, c: Coord) {
        self.awaiting.remove(&c);
    }

    /// Starts (or restarts) pushing to `c` what it should hold.
    pub(super) fn push_to(&mut self, c: Coord, store: &Store) {
        self.pushes.retain(|p| p.kind != Kind::CatchUp(c));
        self.pushes.push_back(Push {
            kind: Kind::CatchUp(c),
            keys: store.keys(),
            pos: 0,
        });
    }

    /// `c` failed.
    pub(super) fn server_down(&mut self, now: Time, c: Coord) {
        self.down.entry(c).or_insert((now, false));
        self.awaiting.remove(&c);
        self.pushes.retain(|p| p.kind != Kind::CatchUp(c));
    }

    /// `c` is back: it gets what it should hold.
    pub(super) fn server_up(&mut self, c: Coord, store: &Store) {
        self.down.remove(&c);
        self.push_to(c, store);
    }

    pub(super) fn next_due(&self, after: Duration) -> Option<Time> {
        let rerep = self
            .down
            .values()
            .filter(|(_, done)| !done)
            .map(|(t, _)| *t + after)
            .min();
        let catch = self.catch_up_until.filter(|_| !self.awaiting.is_empty());
        if !self.pushes.is_empty() {
            return Some(Time::ZERO);
        }
        [rerep, catch].into_iter().flatten().min()
    }
}

impl Kv {
    /// Starts re-replication when due, and pushes a slice of keys.
    pub(super) fn poll_recovery(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        let mut work = 0;
        let after = self.cfg.rereplicate_after;
        let mut start = false;
        for (since, done) in self.recovery.down.values_mut() {
            if !*done && *since + after <= now {
                *done = true;
                start = true;
            }
        }
        if start {
            self.recovery.pushes.retain(|p| p.kind != Kind::Rereplicate);
            self.recovery.pushes.push_back(Push {
                kind: Kind::Rereplicate,
                keys: self.store.keys(),
                pos: 0,
            });
            work += 1;
        }
        if self
            .recovery
            .catch_up_until
            .is_some_and(|t| t <= now && !self.recovery.awaiting.is_empty())
        {
            self.recovery.awaiting.clear();
        }
        if self.out.backlog() >= BACKLOG {
            return work;
        }
        let Some(mut push) = self.recovery.pushes.pop_front() else {
            return work;
        };
        let me = node.local();
        let end = (push.pos + SLICE).min(push.keys.len());
        for i in push.pos..end {
            let key = std::mem::take(&mut push.keys[i]);
            let Some(copy) = self.store.copy_of(&key) else {
                continue;
            };
            let kh = routing_key(&key);
            let holders = node.servers_for_key(kh, self.cfg.replicas);
            let (targets, wait): (Vec<Coord>, Wait) = match push.kind {
                Kind::CatchUp(c) => (
                    holders.into_iter().filter(|&h| h == c).collect(),
                    Wait::CatchUp,
                ),
                Kind::Rereplicate if holders.first() == Some(&me) => {
                    (holders.into_iter().skip(1).collect(), Wait::Rereplicate)
                }
                Kind::Rereplicate => (Vec::new(), Wait::Rereplicate),
            };
            for t in targets {
                let id = self.new_id();
                self.primary
                    .waits
                    .insert(id, (wait.clone(), now + PUSH_CONFIRM));
                self.primary.due_by(now + PUSH_CONFIRM);
                KvCounters::add(&self.counters.copies_sent, 1);
                if matches!(push.kind, Kind::CatchUp(_)) {
                    KvCounters::add(&self.counters.catchup_sent, 1);
                }
                let m = Msg::Repl {
                    id,
                    key: key.clone(),
                    copy: copy.clone(),
                    earlier: self.store.earlier(&key),
                };
                self.out.send(now, t, &m, id);
            }
            work += 1;
        }
        push.pos = end;
        if push.pos < push.keys.len() {
            self.recovery.pushes.push_front(push);
        } else if let Kind::CatchUp(c) = push.kind {
            let floor = self.floor;
            self.out.send(now, c, &Msg::CatchUpDone { floor }, 0);
        }
        work
    }
}
