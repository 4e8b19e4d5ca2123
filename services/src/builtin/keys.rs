//! `keys` (service 3): key-routed probes. A probe is a short message to a routing key,
//! routed by key at every hop; the server that delivers it counts it under its key, so a test
//! can check that every key landed on its root (`torusctl key`) and nowhere else.
//!
//! Probing can also run continuously (random keys at a steady rate), and with a journal
//! every probe sent and every probe delivered is written down at once, one line each, with
//! the wall-clock time, so an oracle outside the process can judge each delivery against
//! which servers were alive at that moment, across kills and restarts:
//!
//! ```text
//! S <key hex> <unix us>            the engine took a probe for <key>
//! R <key hex> <unix us>            the engine took a reliable probe for <key>
//! D <key hex> <src> <unix us>      a probe for <key> from <src> was delivered here
//! F <key hex> <reason> <unix us>   the reliable probe for <key> was reported failed
//! ```
//!
//! A reliable probe is a reliable message to the key (it follows the key's root: the
//! engine's `keyed` contract), its tag the key itself, so that its failure names it.

use std::collections::HashMap;
use std::io::Write;
use std::sync::mpsc::Sender;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::service::{Engine, Request, Service};
use torusnet_proto::time::Time;

/// Service id of the built-in key probe.
pub const KEYS: u16 = 3;

/// What the key service is asked.
#[derive(Debug)]
pub enum KeysRequest {
    /// Send one probe per routing key; the reply says how many the engine took.
    Send(Vec<u64>, Sender<Value>),
    /// Report the probes delivered here (routing key in hex -> count); clear them if set.
    Seen(bool, Sender<Value>),
    /// Probe random keys continuously at `rate` per second (0 stops), from `seed`.
    Probe {
        /// Probes per second.
        rate: u32,
        /// Seed of the keys (mixed with the engine's incarnation, so a restarted server
        /// draws new keys).
        seed: u64,
        /// Reliable messages to the keys instead of key-routed short ones.
        reliable: bool,
        /// The answer: what was sent so far.
        reply: Sender<Value>,
    },
}

/// The key probe service.
#[derive(Default)]
pub struct Keys {
    seen: HashMap<u64, u64>,
    journal: Option<Box<dyn Write + Send>>,
    journal_error: Option<String>,
    rng: Option<SplitMix64>,
    interval: Duration,
    next_at: Time,
    sent: u64,
    refused: u64,
    /// Probing sends reliable messages to keys.
    reliable: bool,
    /// Reliable probes reported failed.
    failed: u64,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("seen", &self.seen.len())
            .field("probing", &self.rng.is_some())
            .field("sent", &self.sent)
            .finish()
    }
}

/// Wall-clock microseconds: the journal is read against the times a test killed and
/// restarted servers, which only a shared clock relates.
fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Keys {
    /// A key service journalling from the start, so that probes delivered before anyone
    /// starts probing (right after a restart) are written down too.
    pub fn with_journal(journal: Box<dyn Write + Send>) -> Keys {
        Keys {
            journal: Some(journal),
            ..Keys::default()
        }
    }

    /// Writes one journal line at once: a process killed a moment later keeps it.
    fn line(&mut self, args: std::fmt::Arguments<'_>) {
        if let Some(j) = self.journal.as_mut() {
            let mut l = Vec::with_capacity(48);
            let _ = l.write_fmt(args);
            l.push(b'\n');
            if let Err(e) = j.write_all(&l) {
                self.journal_error = Some(e.to_string());
            }
        }
    }
}

impl Service for Keys {
    fn name(&self) -> &'static str {
        "keys"
    }

    fn ids(&self) -> &[u16] {
        &[KEYS]
    }

    fn on_event(&mut self, _now: Time, e: &Event, _node: &mut dyn Engine) {
        if let Event::Failed {
            service: KEYS,
            tags,
            reason,
            ..
        } = e
        {
            for k in tags {
                self.failed += 1;
                let t = unix_us();
                self.line(format_args!("F {k:016x} {} {t}", reason.name()));
            }
            return;
        }
        if let Event::Message {
            service: KEYS,
            key: Some(k),
            src,
            ..
        } = e
        {
            *self.seen.entry(*k).or_insert(0) += 1;
            let t = unix_us();
            self.line(format_args!("D {k:016x} {src} {t}"));
        }
    }

    fn on_request(
        &mut self,
        now: Time,
        request: Request,
        node: &mut dyn Engine,
    ) -> Result<(), Request> {
        match *request.downcast::<KeysRequest>()? {
            KeysRequest::Send(keys, reply) => {
                let sent = keys
                    .iter()
                    .filter(|k| {
                        node.send(
                            now,
                            Target::Key(**k),
                            KEYS,
                            &k.to_be_bytes(),
                            MsgOptions::default(),
                        )
                        .is_ok()
                    })
                    .count();
                let _ = reply.send(json!({ "sent": sent }));
            }
            KeysRequest::Probe {
                rate,
                seed,
                reliable,
                reply,
            } => {
                self.reliable = reliable;
                if rate == 0 {
                    self.rng = None;
                } else {
                    self.rng = Some(SplitMix64::new(seed ^ node.incarnation()));
                    self.interval = Duration::from_nanos(1_000_000_000 / u64::from(rate));
                    self.next_at = now;
                }
                let _ = reply.send(json!({
                    "probing": rate > 0,
                    "reliable": self.reliable,
                    "sent": self.sent,
                    "refused": self.refused,
                    "failed": self.failed,
                    "journal_error": self.journal_error,
                }));
            }
            KeysRequest::Seen(reset, reply) => {
                let m: serde_json::Map<String, Value> = self
                    .seen
                    .iter()
                    .map(|(k, n)| (format!("{k:016x}"), json!(n)))
                    .collect();
                if reset {
                    self.seen.clear();
                }
                let _ = reply.send(Value::Object(m));
            }
        }
        Ok(())
    }

    fn poll(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        if self.rng.is_none() {
            return 0;
        }
        // After a stall, do not make up for lost time in one burst.
        if now.since(self.next_at) > Duration::from_millis(100) {
            self.next_at = now;
        }
        let mut n = 0;
        while self.next_at <= now && n < 64 {
            let Some(k) = self.rng.as_mut().map(SplitMix64::next_u64) else {
                break;
            };
            self.next_at = self.next_at + self.interval;
            let opts = MsgOptions {
                reliable: self.reliable,
                tag: k,
                ..MsgOptions::default()
            };
            match node.send(now, Target::Key(k), KEYS, &k.to_be_bytes(), opts) {
                Ok(()) => {
                    self.sent += 1;
                    let t = unix_us();
                    let kind = if self.reliable { 'R' } else { 'S' };
                    self.line(format_args!("{kind} {k:016x} {t}"));
                    n += 1;
                }
                // No root in this server's view, or its queue is full: never taken.
                Err(_) => self.refused += 1,
            }
        }
        n
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.rng.is_some().then_some(self.next_at)
    }
}
