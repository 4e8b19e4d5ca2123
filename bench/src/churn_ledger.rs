//! The ledger of `torus-bench sim churn --reliable`: every reliable message to a key, from
//! its send to its end, judged by the churn oracle. A message ends delivered (once, or
//! more: duplicated), reported failed to its sender, or neither (lost: a bug, unless its
//! sender crashed while it was pending, which takes its records with it).

use std::collections::HashMap;

use serde::Serialize;
use torusnet_proto::node::Event;
use torusnet_proto::time::Time;

/// The service the churn's reliable messages are sent from and to.
pub const SERVICE: u16 = 4;

/// One message's story.
#[derive(Debug)]
struct Entry {
    sender: usize,
    sent: Time,
    key: u64,
    /// Servers it was delivered at, and when.
    deliveries: Vec<(usize, Time)>,
    failed: bool,
}

/// What the ledger found, for the report.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct LedgerReport {
    /// Reliable messages a send accepted.
    pub reliable_sent: u64,
    /// Delivered exactly once.
    pub reliable_delivered_once: u64,
    /// Delivered more than once; of those, the first copy at a server that failed before
    /// the second arrived (the contract's case: the failed root's copy went with it).
    pub reliable_duplicated: u64,
    pub reliable_duplicated_after_root_failed: u64,
    /// Delivered at a server that was not the key's true root then (the oracle's judgement).
    pub reliable_misdelivered: u64,
    /// Reported failed to their senders.
    pub reliable_failed: u64,
    /// Of those, failed although the oracle had a root reachable from the sender at the
    /// failure.
    pub reliable_failed_root_reachable: u64,
    /// Reported failed, yet delivered (the root took it and failed or restarted before its
    /// receipt reached the sender).
    pub reliable_failed_but_delivered: u64,
    /// Neither delivered nor reported, their sender alive throughout.
    pub reliable_lost: u64,
    /// Neither delivered nor reported: their sender crashed while they were pending.
    pub reliable_lost_with_sender: u64,
}

/// Every reliable message of a churn run.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: HashMap<u64, Entry>,
    /// When each server last crashed.
    crashed_at: HashMap<usize, Vec<Time>>,
    pub report: LedgerReport,
}

impl Ledger {
    /// Message `id` to `key` was accepted at `sender` at `t`.
    pub fn sent(&mut self, id: u64, sender: usize, key: u64, t: Time) {
        self.report.reliable_sent += 1;
        self.entries.insert(
            id,
            Entry {
                sender,
                sent: t,
                key,
                deliveries: Vec::new(),
                failed: false,
            },
        );
    }

    /// Server `i` crashed at `t`.
    pub fn crashed(&mut self, i: usize, t: Time) {
        self.crashed_at.entry(i).or_default().push(t);
    }

    /// An event at `server` at `at`; `misdelivered(key, server, at)` is the oracle's
    /// judgement of a delivery, `root_reachable(key, sender, at)` of a failure.
    pub fn event(
        &mut self,
        at: Time,
        server: usize,
        e: &Event,
        misdelivered: impl Fn(u64, usize, Time) -> bool,
        root_reachable: impl Fn(u64, usize, Time) -> bool,
    ) {
        match e {
            // The key is read from the message (the engine names it too, as `key`).
            Event::Message {
                data,
                reliable: true,
                service: SERVICE,
                ..
            } => {
                let word = |i: usize| {
                    data.get(i..i + 8).map(|b| {
                        let mut a = [0u8; 8];
                        a.copy_from_slice(b);
                        a
                    })
                };
                let (Some(id), Some(key)) = (word(0), word(8)) else {
                    return;
                };
                let (id, key) = (u64::from_le_bytes(id), u64::from_be_bytes(key));
                if misdelivered(key, server, at) {
                    self.report.reliable_misdelivered += 1;
                }
                if let Some(en) = self.entries.get_mut(&id) {
                    en.deliveries.push((server, at));
                }
            }
            Event::Failed {
                service: SERVICE,
                tags,
                ..
            } => {
                for id in tags {
                    if let Some(en) = self.entries.get_mut(id) {
                        en.failed = true;
                        self.report.reliable_failed += 1;
                        if root_reachable(en.key, en.sender, at) {
                            self.report.reliable_failed_root_reachable += 1;
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// Settles every message once the run (and the drain after it) ended.
    pub fn finish(&mut self) -> LedgerReport {
        let crashed = |i: usize, after: Time, before: Option<Time>| {
            self.crashed_at.get(&i).is_some_and(|ts| {
                ts.iter()
                    .any(|t| *t >= after && before.is_none_or(|b| *t <= b))
            })
        };
        let mut r = self.report;
        for en in self.entries.values() {
            if en.failed && !en.deliveries.is_empty() {
                r.reliable_failed_but_delivered += 1;
            }
            match en.deliveries.len() {
                0 if en.failed => {}
                0 if crashed(en.sender, en.sent, None) => r.reliable_lost_with_sender += 1,
                0 => r.reliable_lost += 1,
                1 => r.reliable_delivered_once += 1,
                _ => {
                    r.reliable_duplicated += 1;
                    let (first, t1) = en.deliveries[0];
                    let t2 = en.deliveries[1].1;
                    if crashed(first, t1, Some(t2)) {
                        r.reliable_duplicated_after_root_failed += 1;
                    }
                }
            }
        }
        r
    }
}
