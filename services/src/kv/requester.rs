//! The requester role: operations of this server's own clients (its memcached gateway, the
//! management socket). Each goes to the key's primary, or for a read with the cache on, to the
//! closest of the primary and the key's cache servers; it is sent again after a redirect or a
//! failed send (the view is changing) and answered exactly once, by its deadline.

use std::sync::mpsc::Sender;

use torusnet_proto::service::Engine;
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;

use super::ops::{Op, Outcome};
use super::wire::Msg;
use super::{cache, routing_key, Kv, KvCounters, KvError, KvReply, Waits, RETRY, SLOW_OP};

/// An operation in flight.
#[derive(Debug)]
pub(super) struct Pending {
    key: Vec<u8>,
    kh: u64,
    op: Op,
    reply: Sender<KvReply>,
    submitted: Time,
    deadline: Time,
    sent_to: Option<Coord>,
    retry_at: Option<Time>,
    /// The cache server failed it once: go to the primary.
    bypass_cache: bool,
}

/// Operations in flight, by id.
#[derive(Debug, Default)]
pub(super) struct Requests {
    pending: Waits<Pending>,
    /// No deadline or retry is due before this (so polls need not look at every operation).
    scan_at: Option<Time>,
}

impl Requests {
    pub(super) fn contains(&self, id: u64) -> bool {
        self.pending.contains_key(&id)
    }

    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }

    pub(super) fn next_due(&self) -> Option<Time> {
        self.scan_at
    }

    fn due_by(&mut self, t: Time) {
        self.scan_at = Some(self.scan_at.map_or(t, |s| s.min(t)));
    }
}

impl Kv {
    /// Takes an operation from a client of this server.
    pub(super) fn submit(
        &mut self,
        now: Time,
        node: &mut dyn Engine,
        key: Vec<u8>,
        op: Op,
        reply: Sender<KvReply>,
    ) {
        KvCounters::add(&self.counters.ops, 1);
        if op.writes() {
            KvCounters::add(&self.counters.writes, 1);
        }
        if key.is_empty() || key.len() > 250 {
            let _ = reply.send(KvReply {
                result: Err(KvError::Refused("key length must be 1..=250".into())),
                now,
            });
            return;
        }
        let id = self.new_id();
        let kh = routing_key(&key);
        self.requests.due_by(now + self.cfg.op_timeout);
        self.requests.pending.insert(
            id,
            Pending {
                key,
                kh,
                op,
                reply,
                submitted: now,
                deadline: now + self.cfg.op_timeout,
                sent_to: None,
                retry_at: None,
                bypass_cache: false,
            },
        );
        self.dispatch(now, node, id);
    }

    /// Sends operation `id` where it should go in the current view.
    fn dispatch(&mut self, now: Time, node: &mut dyn Engine, id: u64) {
        let Some(p) = self.requests.pending.get_mut(&id) else {
            return;
        };
        let Some(primary) = node.key_root(p.kh) else {
            p.retry_at = Some(now + RETRY);
            self.requests.due_by(now + RETRY);
            return;
        };
        let mut to = primary;
        let mut via_cache = false;
        if self.cfg.cache && p.op == Op::Get && !p.bypass_cache {
            if let Some(c) = cache::closest(node, &p.key, self.cfg.cache_keys, primary) {
                to = c;
                via_cache = c != primary;
            }
        }
        p.sent_to = Some(to);
        p.retry_at = None;
        let msg = Msg::Req {
            id,
            cache_fill: false,
            via_cache,
            key: p.key.clone(),
            op: p.op.clone(),
        };
        self.out.send(now, to, &msg, id);
    }

    /// The answer to operation `id`.
    pub(super) fn answered(&mut self, now: Time, id: u64, outcome: Outcome) {
        let Some(p) = self.requests.pending.remove(&id) else {
            return;
        };
        match (&p.op, &outcome) {
            (Op::Get | Op::GetAndTouch(_), Outcome::Value(_)) => {
                KvCounters::add(&self.counters.hits, 1);
            }
            (Op::Get | Op::GetAndTouch(_), _) => KvCounters::add(&self.counters.misses, 1),
            _ => {}
        }
        self.took(now, &p);
        let _ = p.reply.send(KvReply {
            result: Ok(outcome),
            now,
        });
    }

    /// Records how long an operation took to be answered.
    fn took(&self, now: Time, p: &Pending) {
        let d = now.since(p.submitted);
        KvCounters::max(&self.counters.slowest_op_us, d.as_micros() as u64);
        if d > SLOW_OP {
            KvCounters::add(&self.counters.slow_ops, 1);
        }
    }

    /// Operation `id` was redirected, or its send failed: try again shortly.
    pub(super) fn retry_later(&mut self, now: Time, id: u64) {
        if let Some(p) = self.requests.pending.get_mut(&id) {
            if p.retry_at.is_none() {
                KvCounters::add(&self.counters.retries, 1);
                p.retry_at = Some(now + RETRY);
                p.bypass_cache = true;
                p.sent_to = None;
                self.requests.due_by(now + RETRY);
            }
        }
    }

    /// Operations sent to a server that failed or restarted (`gone`), or that is no longer
    /// reachable, are sent again: the server may have taken one and never answer it (a write
    /// it did is found done by its origin when retried).
    pub(super) fn requests_view_changed(
        &mut self,
        now: Time,
        node: &dyn Engine,
        gone: Option<Coord>,
    ) {
        let lost: Vec<u64> = self
            .requests
            .pending
            .iter()
            .filter(|(_, p)| {
                p.sent_to
                    .is_some_and(|c| Some(c) == gone || !node.is_reachable(c))
            })
            .map(|(&id, _)| id)
            .collect();
        for id in lost {
            self.retry_later(now, id);
        }
    }

    /// Answers what is past its deadline and re-sends what is due.
    pub(super) fn poll_requests(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        if self.requests.scan_at.is_none_or(|t| t > now) {
            return 0;
        }
        let mut due = Vec::new();
        let mut expired = Vec::new();
        let mut next: Option<Time> = None;
        for (&id, p) in &self.requests.pending {
            if p.deadline <= now {
                expired.push(id);
                continue;
            } else if p.retry_at.is_some_and(|r| r <= now) {
                due.push(id);
            }
            let t = p
                .retry_at
                .filter(|&r| r > now)
                .map_or(p.deadline, |r| r.min(p.deadline));
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        self.requests.scan_at = next;
        let n = due.len() + expired.len();
        for id in expired {
            if let Some(p) = self.requests.pending.remove(&id) {
                KvCounters::add(&self.counters.timeouts, 1);
                self.took(now, &p);
                let _ = p.reply.send(KvReply {
                    result: Err(KvError::Timeout),
                    now,
                });
            }
        }
        for id in due {
            self.dispatch(now, node, id);
        }
        n
    }
}
