//! Logs torusd's state changes by comparing successive status snapshots, off the pollers'
//! path: servers becoming unreachable or reachable, the view version, connection resets
//! (a peer restarted or went silent), messages reported failed, and frames refused per link
//! and cause, rate-limited so a flood of bad frames costs a line every ten seconds.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use torusnet_ops::logging::RateLimit;

use crate::mgmt::Daemon;

/// How often the status is compared.
const PERIOD: Duration = Duration::from_millis(500);

/// What the last snapshot said.
#[derive(Debug, Default)]
pub struct Watch {
    first: bool,
    unreachable: BTreeSet<String>,
    view_version: u64,
    resets: u64,
    failed: u64,
    drops: HashMap<(String, String), u64>,
    limit: Option<RateLimit>,
}

fn coords(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_array())
        .map(|c| {
            c.iter()
                .map(|x| x.as_u64().unwrap_or(0).to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

impl Watch {
    /// Nothing seen yet.
    pub fn new() -> Watch {
        Watch {
            first: true,
            limit: Some(RateLimit::new(Duration::from_secs(10), 1)),
            ..Watch::default()
        }
    }

    /// Compares `status` with the last one and logs what changed.
    pub fn observe(&mut self, status: &Value, now: Instant) {
        if status.get("waiting").is_some() {
            return;
        }
        let engine = &status["engine"];
        let unreachable = coords(&engine["unreachable"]);
        let version = engine["view_version"].as_u64().unwrap_or(0);
        let t = &engine["transport"];
        let resets = t["resets"].as_u64().unwrap_or(0);
        let failed = t["failed_messages"].as_u64().unwrap_or(0);
        if !self.first {
            for s in unreachable.difference(&self.unreachable) {
                tracing::warn!(peer = %s, "server unreachable in this server's view");
            }
            for s in self.unreachable.difference(&unreachable) {
                tracing::info!(peer = %s, "server reachable again");
            }
            if version != self.view_version {
                tracing::debug!(view_version = version, "pollers adopted view");
            }
            if resets > self.resets {
                tracing::info!(
                    resets = resets - self.resets,
                    "connections reset (a peer restarted or went silent)"
                );
            }
            if failed > self.failed {
                tracing::warn!(
                    messages = failed - self.failed,
                    "messages reported failed to their senders"
                );
            }
        }
        for l in status["links"].as_array().into_iter().flatten() {
            let link = l["dir"].as_str().unwrap_or("?").to_string();
            let Some(c) = l["counters"].as_object() else {
                continue;
            };
            for (cause, n) in c.iter().filter(|(k, _)| k.starts_with("drop_")) {
                let n = n.as_u64().unwrap_or(0);
                let key = (link.clone(), cause.clone());
                let before = self.drops.insert(key, n).unwrap_or(n);
                if self.first || n <= before {
                    continue;
                }
                let what = format!("{link} {cause}");
                let allowed = self.limit.as_mut().and_then(|r| r.allow(&what, now));
                if let Some(held) = allowed {
                    tracing::warn!(
                        link = %link,
                        cause = cause.trim_start_matches("drop_"),
                        frames = n - before,
                        total = n,
                        "frames refused (later ones within 10 s are summed into the next line; {held} lines held back)"
                    );
                }
            }
        }
        self.first = false;
        self.unreachable = unreachable;
        self.view_version = version;
        self.resets = resets;
        self.failed = failed;
    }
}

/// Watches `d` from a thread of its own until it stops.
pub fn spawn(d: Arc<Daemon>) -> std::io::Result<std::thread::JoinHandle<()>> {
    let span = tracing::Span::current();
    std::thread::Builder::new()
        .name("torusd-watch".into())
        .spawn(move || {
            let _in = span.enter();
            let mut w = Watch::new();
            while !d.stop.load(Ordering::Acquire) {
                if let Ok(st) = d.status() {
                    w.observe(&st, Instant::now());
                }
                std::thread::sleep(PERIOD);
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(unreachable: &[[u16; 3]], drops: u64) -> Value {
        serde_json::json!({
            "engine": {"unreachable": unreachable, "view_version": 1,
                       "transport": {"resets": 0, "failed_messages": 0}},
            "links": [{"dir": "+x", "counters": {"drop_malformed": drops, "rx_frames": 5}}]
        })
    }

    #[test]
    fn remembers_what_it_saw() {
        let mut w = Watch::new();
        let t = Instant::now();
        w.observe(&st(&[], 0), t);
        w.observe(&st(&[[1, 0, 0]], 10), t);
        assert!(w.unreachable.contains("1,0,0"));
        assert_eq!(
            w.drops[&("+x".to_string(), "drop_malformed".to_string())],
            10
        );
        w.observe(&st(&[], 10), t);
        assert!(w.unreachable.is_empty());
    }
}
