//! flush_all: every reachable server drops every item older than the flush (its version
//! floor, on the version clock), now or after a delay, and answers when it has scheduled it.
//! A server that was away learns the floor from the catch-up and fetch messages, so a flushed
//! item does not come back with it.

use std::sync::mpsc::Sender;
use std::time::Duration;

use torusnet_proto::service::Engine;
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;

use super::wire::Msg;
use super::{Kv, KvCounters, KvError, Waits};

/// A flush_all of this server's client, waiting for every server.
#[derive(Debug)]
struct Waiting {
    ids: Vec<u64>,
    reply: Sender<Result<(), KvError>>,
    deadline: Time,
}

/// Flushes asked for here, and one scheduled here.
#[derive(Debug, Default)]
pub(super) struct Flushes {
    asked: Vec<Waiting>,
    ids: Waits<()>,
    /// A delayed flush: when, and its floor.
    scheduled: Option<(Time, u64)>,
}

impl Flushes {
    pub(super) fn contains(&self, id: u64) -> bool {
        self.ids.contains_key(&id)
    }

    pub(super) fn next_due(&self) -> Option<Time> {
        let a = self.asked.iter().map(|w| w.deadline).min();
        [a, self.scheduled.map(|(t, _)| t)]
            .into_iter()
            .flatten()
            .min()
    }
}

impl Kv {
    /// A client's flush_all: sent to every reachable server, this one included.
    pub(super) fn flush_all(
        &mut self,
        now: Time,
        node: &mut dyn Engine,
        delay: u32,
        reply: Sender<Result<(), KvError>>,
    ) {
        KvCounters::add(&self.counters.flushes, 1);
        let me = node.local();
        let targets: Vec<Coord> = node
            .dims()
            .coords()
            .filter(|&c| c == me || node.is_reachable(c))
            .collect();
        let mut ids = Vec::new();
        for t in targets {
            let id = self.new_id();
            ids.push(id);
            self.flushes.ids.insert(id, ());
            self.out.send(now, t, &Msg::Flush { id, delay }, id);
        }
        self.flushes.asked.push(Waiting {
            ids,
            reply,
            deadline: now + self.cfg.op_timeout,
        });
    }

    /// Another server's (or this one's) flush_all.
    pub(super) fn flush_request(&mut self, now: Time, from: Coord, id: u64, delay: u32) {
        let at = now + Duration::from_secs(u64::from(delay));
        let floor = self.clock(at);
        if delay == 0 {
            self.apply_floor(floor);
        } else if self.flushes.scheduled.is_none_or(|(_, f)| f < floor) {
            self.flushes.scheduled = Some((at, floor));
        }
        self.out.send(now, from, &Msg::Flushed { id }, 0);
    }

    /// Server answered (or failed) flush `id`.
    pub(super) fn flush_answered(&mut self, now: Time, id: u64) {
        if self.flushes.ids.remove(&id).is_none() {
            return;
        }
        for w in &mut self.flushes.asked {
            w.ids.retain(|&i| i != id);
        }
        self.poll_flushes(now);
    }

    /// Answers finished flushes and runs a scheduled one.
    pub(super) fn poll_flushes(&mut self, now: Time) -> usize {
        let mut n = 0;
        if let Some((at, floor)) = self.flushes.scheduled {
            if at <= now {
                self.flushes.scheduled = None;
                self.apply_floor(floor);
                n += 1;
            }
        }
        let mut i = 0;
        while i < self.flushes.asked.len() {
            let w = &self.flushes.asked[i];
            if w.ids.is_empty() || w.deadline <= now {
                let w = self.flushes.asked.swap_remove(i);
                for id in &w.ids {
                    self.flushes.ids.remove(id);
                }
                let r = if w.ids.is_empty() {
                    Ok(())
                } else {
                    Err(KvError::Timeout)
                };
                let _ = w.reply.send(r);
                n += 1;
            } else {
                i += 1;
            }
        }
        n
    }
}
