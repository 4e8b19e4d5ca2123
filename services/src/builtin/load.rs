//! `load` (service 4): checked reliable traffic to changing peers, for soak tests and demos.
//!
//! While started, the service sends reliable messages of random sizes at a steady rate to
//! one peer at a time, moving on to the next peer of its list every `dwell`. Every message
//! carries the sender's incarnation and a tag, and bytes derived from both, so the receiver
//! checks it. The sender follows each message to its end, acknowledged or failed, from the
//! transport's reports; the receiver counts what arrived, corrupt or twice.
//!
//! With a journal, every step is written down as one text line, so an oracle outside the
//! process can check the delivery contract across restarts (a killed process keeps what it
//! wrote: lines are written before the acknowledgement of the frame can leave):
//!
//! ```text
//! I <incarnation hex>                 this process started journalling
//! S <tag> <dest>                      the transport took message <tag> for <dest>
//! A <dest> <count> <last tag>         the next <count> messages to <dest> were acknowledged
//! F <dest> <reason> <tag> <tag> ...   these messages to <dest> failed
//! R <src> <src incarnation hex> <tag> ok|bad   a message arrived (bad: bytes differ)
//! ```

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::sync::mpsc::Sender;
use std::time::Duration;

use serde_json::{json, Value};
use torusnet_proto::harness::fill_payload;
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::service::{Engine, Request, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::SendError;

/// Service id of the built-in load generator.
pub const LOAD: u16 = 4;

/// Bytes of a message before its checked body: kind, incarnation, tag.
const HEAD: usize = 17;

/// What the load service is asked.
pub enum LoadRequest {
    /// Start sending (replacing a running load's settings; its messages are still followed).
    Start {
        /// The peers, visited in this order, `dwell` each.
        peers: Vec<Coord>,
        /// Messages per second.
        rate: u32,
        /// Smallest and largest message, in bytes (at least the 17-byte head).
        sizes: (usize, usize),
        /// How long each peer gets the traffic.
        dwell: Duration,
        /// Seed of the sizes.
        seed: u64,
        /// Where the journal goes (none: no journal).
        journal: Option<Box<dyn Write + Send>>,
        /// The answer: `{"ok": true}`.
        reply: Sender<Value>,
    },
    /// Stop sending (messages on their way are still followed to their end).
    Stop(Sender<Value>),
    /// The counters.
    Report(Sender<Value>),
}

impl std::fmt::Debug for LoadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadRequest::Start { peers, rate, .. } => f
                .debug_struct("Start")
                .field("peers", &peers.len())
                .field("rate", rate)
                .finish(),
            LoadRequest::Stop(_) => f.write_str("Stop"),
            LoadRequest::Report(_) => f.write_str("Report"),
        }
    }
}

/// The load service.
#[derive(Default)]
pub struct Load {
    sending: bool,
    peers: Vec<Coord>,
    cursor: usize,
    dwell: Duration,
    dwell_until: Time,
    interval: Duration,
    next_at: Time,
    sizes: (usize, usize),
    rng: Option<SplitMix64>,
    tag: u64,
    outstanding: HashMap<Coord, VecDeque<u64>>,
    seen: HashMap<(Coord, u64), HashSet<u64>>,
    journal: Option<Box<dyn Write + Send>>,
    /// The journal's `I` line is still to be written (it needs the engine's incarnation).
    journal_new: bool,
    jbuf: Vec<u8>,
    journal_error: Option<String>,
    buf: Vec<u8>,
    c: Counters,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    sent: u64,
    acked: u64,
    failed: u64,
    failed_restarted: u64,
    failed_reset: u64,
    failed_silent: u64,
    failed_unreachable: u64,
    failed_refused: u64,
    refused: u64,
    report_mismatch: u64,
    received: u64,
    bad: u64,
    duplicates: u64,
}

fn payload_seed(incarnation: u64, tag: u64) -> u64 {
    incarnation.rotate_left(17) ^ tag
}

impl Load {
    /// A load service journalling from the start, so that messages received before anyone
    /// starts the load are written down too.
    pub fn with_journal(journal: Box<dyn Write + Send>) -> Load {
        Load {
            journal: Some(journal),
            journal_new: true,
            ..Load::default()
        }
    }

    fn header(&mut self, node: &dyn Engine) {
        if self.journal_new {
            self.journal_new = false;
            let inc = node.incarnation();
            self.line(format_args!("I {inc:x}"));
        }
    }

    fn line(&mut self, args: std::fmt::Arguments<'_>) {
        if self.journal.is_some() {
            let _ = self.jbuf.write_fmt(args);
            self.jbuf.push(b'\n');
        }
    }

    fn flush(&mut self) {
        if self.jbuf.is_empty() {
            return;
        }
        if let Some(j) = self.journal.as_mut() {
            if let Err(e) = j.write_all(&self.jbuf) {
                self.journal_error = Some(e.to_string());
            }
        }
        self.jbuf.clear();
    }

    fn report(&self) -> Value {
        let c = self.c;
        json!({
            "sending": self.sending,
            "sent": c.sent,
            "acked": c.acked,
            "failed": c.failed,
            "failed_by_reason": {
                "peer_restarted": c.failed_restarted,
                "peer_reset": c.failed_reset,
                "silent": c.failed_silent,
                "unreachable": c.failed_unreachable,
                "refused": c.failed_refused,
            },
            "outstanding": self.outstanding.values().map(VecDeque::len).sum::<usize>(),
            "refused": c.refused,
            "report_mismatch": c.report_mismatch,
            "received": c.received,
            "bad": c.bad,
            "duplicates": c.duplicates,
            "journal_error": self.journal_error,
        })
    }

    fn on_message(&mut self, src: Coord, data: &[u8]) {
        if data.len() < HEAD || data[0] != b'L' {
            self.c.bad += 1;
            return;
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&data[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let (inc, tag) = (word(1), word(9));
        self.buf.clear();
        self.buf.resize(data.len() - HEAD, 0);
        fill_payload(payload_seed(inc, tag), &mut self.buf);
        let ok = self.buf[..] == data[HEAD..];
        self.c.received += 1;
        if !ok {
            self.c.bad += 1;
        }
        if !self.seen.entry((src, inc)).or_default().insert(tag) {
            self.c.duplicates += 1;
        }
        self.line(format_args!(
            "R {src} {inc:x} {tag} {}",
            if ok { "ok" } else { "bad" }
        ));
    }

    fn on_acked(&mut self, peer: Coord, count: u32, last_tag: u64) {
        let q = self.outstanding.entry(peer).or_default();
        let mut last = None;
        for _ in 0..count {
            last = q.pop_front();
        }
        if last != Some(last_tag) {
            self.c.report_mismatch += 1;
        }
        self.c.acked += u64::from(count);
        self.line(format_args!("A {peer} {count} {last_tag}"));
    }

    fn on_failed(&mut self, peer: Coord, tags: &[u64], reason: &str) {
        let q = self.outstanding.entry(peer).or_default();
        for t in tags {
            match q.iter().position(|x| x == t) {
                Some(i) => {
                    q.remove(i);
                }
                None => self.c.report_mismatch += 1,
            }
        }
        let n = tags.len() as u64;
        self.c.failed += n;
        match reason {
            "peer_restarted" => self.c.failed_restarted += n,
            "peer_reset" => self.c.failed_reset += n,
            "silent" => self.c.failed_silent += n,
            "unreachable" => self.c.failed_unreachable += n,
            _ => self.c.failed_refused += n,
        }
        let list: Vec<String> = tags.iter().map(u64::to_string).collect();
        self.line(format_args!("F {peer} {reason} {}", list.join(" ")));
    }

    /// The peer to send to now, moving on when its dwell is over.
    fn dest(&mut self, now: Time, local: Coord) -> Option<Coord> {
        if self.peers.is_empty() {
            return None;
        }
        if now >= self.dwell_until {
            self.cursor = (self.cursor + 1) % self.peers.len();
            self.dwell_until = now + self.dwell;
        }
        let d = self.peers[self.cursor];
        (d != local).then_some(d)
    }

    fn skip_peer(&mut self, now: Time) {
        self.dwell_until = now;
    }
}

impl Service for Load {
    fn name(&self) -> &'static str {
        "load"
    }

    fn ids(&self) -> &[u16] {
        &[LOAD]
    }

    fn on_event(&mut self, _now: Time, e: &Event, node: &mut dyn Engine) {
        self.header(node);
        match e {
            Event::Message {
                src,
                data,
                service: LOAD,
                reliable: true,
                ..
            } => self.on_message(*src, data),
            Event::Acked {
                peer,
                service: LOAD,
                count,
                last_tag,
            } => self.on_acked(*peer, *count, *last_tag),
            Event::Failed {
                peer,
                service: LOAD,
                tags,
                reason,
            } => self.on_failed(*peer, tags, reason.name()),
            _ => {}
        }
    }

    fn on_request(
        &mut self,
        now: Time,
        request: Request,
        node: &mut dyn Engine,
    ) -> Result<(), Request> {
        match *request.downcast::<LoadRequest>()? {
            LoadRequest::Start {
                peers,
                rate,
                sizes,
                dwell,
                seed,
                journal,
                reply,
            } => {
                node.notify_acks(LOAD, true);
                let inc = node.incarnation();
                if journal.is_some() {
                    self.flush();
                    self.journal = journal;
                    self.journal_new = true;
                }
                self.header(node);
                self.peers = peers;
                self.cursor = 0;
                self.dwell = dwell.max(Duration::from_millis(1));
                self.dwell_until = now + self.dwell;
                self.interval = Duration::from_nanos(1_000_000_000 / u64::from(rate.max(1)));
                self.next_at = now;
                let lo = sizes.0.max(HEAD);
                self.sizes = (lo, sizes.1.max(lo));
                self.rng = Some(SplitMix64::new(seed ^ inc));
                self.sending = true;
                let _ = reply.send(json!({"ok": true, "incarnation": format!("{inc:x}")}));
            }
            LoadRequest::Stop(reply) => {
                self.sending = false;
                let _ = reply.send(json!({"ok": true}));
            }
            LoadRequest::Report(reply) => {
                let _ = reply.send(self.report());
            }
        }
        Ok(())
    }

    fn poll(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        self.header(node);
        let mut n = 0;
        if self.sending {
            // After a stall, do not make up for lost time in one burst.
            if now.since(self.next_at) > Duration::from_millis(100) {
                self.next_at = now;
            }
            let inc = node.incarnation();
            let local = node.local();
            while self.next_at <= now && n < 64 {
                let Some(dest) = self.dest(now, local) else {
                    self.skip_peer(now);
                    break;
                };
                let Some(rng) = self.rng.as_mut() else { break };
                let (lo, hi) = self.sizes;
                let len = lo + rng.below((hi - lo + 1) as u64) as usize;
                let tag = self.tag;
                self.buf.clear();
                self.buf.resize(len, 0);
                self.buf[0] = b'L';
                self.buf[1..9].copy_from_slice(&inc.to_le_bytes());
                self.buf[9..HEAD].copy_from_slice(&tag.to_le_bytes());
                fill_payload(payload_seed(inc, tag), &mut self.buf[HEAD..]);
                let opts = MsgOptions {
                    reliable: true,
                    tag,
                    ..MsgOptions::default()
                };
                match node.send(now, Target::Server(dest), LOAD, &self.buf, opts) {
                    Ok(()) => {
                        self.tag += 1;
                        self.c.sent += 1;
                        self.outstanding.entry(dest).or_default().push_back(tag);
                        self.line(format_args!("S {tag} {dest}"));
                        self.next_at = self.next_at + self.interval;
                        n += 1;
                    }
                    Err(SendError::WouldBlock) => break,
                    Err(_) => {
                        // Unreachable in this server's view (or refused): not taken, so
                        // nothing to follow; try the next peer.
                        self.c.refused += 1;
                        self.skip_peer(now);
                        break;
                    }
                }
            }
        }
        self.flush();
        n
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.sending.then_some(self.next_at)
    }
}
