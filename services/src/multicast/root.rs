//! The root's side of a transfer: its bytes, the window it sends ahead of its slowest
//! member, what each member reported, and the report that ends the transfer.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::Sender;
use std::sync::Arc;

use serde_json::{json, Value};
use torusnet_proto::service::Engine;
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;

use super::Source;

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
    fn waits_for(&self, m: Coord, node: &dyn Engine) -> bool {
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
