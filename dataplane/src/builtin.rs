//! The services built into `torusd`, run inside the poller so they measure the stack and not
//! a thread hand-off: `ping` (service 1: echo, and a ping-pong client measuring RTT) and
//! `bench` (service 2: a bulk sender and a receiver that checks every message is delivered
//! exactly once, byte-exact, with its fences respected).

use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::time::Duration;

use serde_json::{json, Value};
use torusnet_proto::harness::{fences_of, fill_payload, Oracle};
use torusnet_proto::node::{Event, MsgOptions, Node, Target};
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::SendError;

/// Service id of the built-in ping.
pub const PING: u16 = 1;
/// Service id of the built-in bench.
pub const BENCH: u16 = 2;
/// Service id of the built-in key probe: key-routed short messages, counted where they land.
pub const KEYS: u16 = 3;

/// A ping-pong run requested by the management socket.
#[derive(Debug)]
pub struct PingRequest {
    /// The server to ping.
    pub to: Coord,
    /// How many round trips.
    pub count: u32,
    /// Message size in bytes (at least 9).
    pub size: usize,
    /// Reliable messages instead of short ones.
    pub reliable: bool,
    /// Where the result goes.
    pub reply: Sender<Value>,
}

/// A bulk transfer requested by the management socket.
#[derive(Debug)]
pub struct BenchRequest {
    /// The receiving server.
    pub to: Coord,
    /// Bytes to move (rounded up to whole messages).
    pub bytes: u64,
    /// Message size.
    pub size: usize,
    /// Fence every n-th message (0: none).
    pub fence_every: u64,
    /// Reliable messages (checked exactly once), or short ones (counted; losses allowed).
    pub reliable: bool,
    /// Check every message's bytes and order at the receiver (and checksum both ends).
    /// Off for throughput measurements, where the check would cost more than the stack.
    pub verify: bool,
    /// Where the result goes.
    pub reply: Sender<Value>,
}

struct PingRun {
    req: PingRequest,
    seq: u32,
    sent_at: Option<Time>,
    rtts_ns: Vec<u64>,
    lost: u32,
    started: Time,
}

struct BenchRun {
    req: BenchRequest,
    run: u32,
    n: u64,
    next: u64,
    started: Time,
    sum: u64,
    sent_start: bool,
    ended: bool,
}

struct BenchRecv {
    run: u32,
    verify: bool,
    /// Reliable messages counted without verification.
    counted: u64,
    oracle: Oracle,
    /// Short messages received (not checked by the oracle: they may be lost).
    short: u64,
    sum: u64,
    bytes: u64,
    first: Option<Time>,
}

/// Built-in services state, driven by the poller.
#[derive(Default)]
pub struct Builtins {
    ping: Option<PingRun>,
    bench: Option<BenchRun>,
    recv: HashMap<Coord, BenchRecv>,
    runs: u32,
    buf: Vec<u8>,
    /// Key-routed probes delivered here: routing key -> count.
    keys_seen: HashMap<u64, u64>,
}

/// How long a ping waits for its echo before counting it lost.
const PING_TIMEOUT: Duration = Duration::from_millis(200);

/// A 64-bit checksum of a message, 8 bytes at a time (a byte-at-a-time hash dominated the
/// bench service's cost at jumbo sizes).
fn fnv(data: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ data.len() as u64;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        h = (h ^ w).wrapping_mul(0x100_0000_01b3).rotate_left(29);
    }
    for b in chunks.remainder() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

impl Builtins {
    /// Starts a ping-pong run (one at a time; a second is refused through its reply).
    pub fn start_ping(&mut self, now: Time, req: PingRequest, node: &mut Node) {
        if self.ping.is_some() {
            let _ = req
                .reply
                .send(json!({"error": "a ping run is already in progress"}));
            return;
        }
        self.ping = Some(PingRun {
            req,
            seq: 0,
            sent_at: None,
            rtts_ns: Vec::new(),
            lost: 0,
            started: now,
        });
        self.ping_next(now, node);
    }

    fn ping_next(&mut self, now: Time, node: &mut Node) {
        let Some(p) = self.ping.as_mut() else { return };
        if p.seq >= p.req.count {
            let Some(p) = self.ping.take() else { return };
            let mut r = p.rtts_ns.clone();
            r.sort_unstable();
            let mean = if r.is_empty() {
                0.0
            } else {
                r.iter().sum::<u64>() as f64 / r.len() as f64 / 1000.0
            };
            let _ = p.req.reply.send(json!({
                "to": p.req.to.to_array(),
                "count": p.req.count,
                "size": p.req.size,
                "reliable": p.req.reliable,
                "received": r.len(),
                "lost": p.lost,
                "rtt_us": {
                    "min": percentile(&r, 0.0),
                    "p50": percentile(&r, 0.5),
                    "p90": percentile(&r, 0.9),
                    "p99": percentile(&r, 0.99),
                    "p999": percentile(&r, 0.999),
                    "max": percentile(&r, 1.0),
                    "mean": mean,
                },
                "elapsed_s": now.since(p.started).as_secs_f64(),
                // 200 points of the RTT distribution (us), for CDF plots.
                "cdf_us": (0..200).map(|i| percentile(&r, i as f64 / 199.0)).collect::<Vec<f64>>(),
            }));
            return;
        }
        let mut msg = vec![0u8; p.req.size.max(9)];
        msg[0] = b'Q';
        msg[1..5].copy_from_slice(&p.seq.to_le_bytes());
        let opts = MsgOptions {
            reliable: p.req.reliable,
            ..MsgOptions::default()
        };
        match node.send(now, Target::Server(p.req.to), PING, &msg, opts) {
            Ok(()) => p.sent_at = Some(now),
            Err(_) => {
                // Could not even queue it: counts as lost, try the next.
                p.lost += 1;
                p.seq += 1;
                p.sent_at = None;
            }
        }
    }

    /// Sends one key-routed probe per routing key (short messages, routed by key at every
    /// hop); returns how many the engine took.
    pub fn send_keys(&mut self, now: Time, keys: &[u64], node: &mut Node) -> usize {
        keys.iter()
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
            .count()
    }

    /// The probes delivered here so far (routing key in hex -> count); cleared if `reset`.
    pub fn keys_seen(&mut self, reset: bool) -> Value {
        let m: serde_json::Map<String, Value> = self
            .keys_seen
            .iter()
            .map(|(k, n)| (format!("{k:016x}"), json!(n)))
            .collect();
        if reset {
            self.keys_seen.clear();
        }
        Value::Object(m)
    }

    /// Starts a bulk transfer (one at a time).
    pub fn start_bench(&mut self, now: Time, req: BenchRequest) {
        if self.bench.is_some() {
            let _ = req
                .reply
                .send(json!({"error": "a bench run is already in progress"}));
            return;
        }
        self.runs += 1;
        let body = req.size.max(13) - 5;
        let n = req.bytes.div_ceil(body as u64).max(1);
        self.bench = Some(BenchRun {
            req,
            run: self.runs,
            n,
            next: 0,
            started: now,
            sum: 0,
            sent_start: false,
            ended: false,
        });
    }

    /// Handles an event for a built-in service; returns it back when it is not theirs.
    pub fn on_event(&mut self, now: Time, e: Event, node: &mut Node) -> Option<Event> {
        let Event::Message {
            src, service, data, ..
        } = &e
        else {
            return Some(e);
        };
        match (*service, data.first()) {
            (PING, Some(b'Q')) => {
                let mut echo = data.clone();
                echo[0] = b'R';
                let reliable = matches!(e, Event::Message { reliable: true, .. });
                let opts = MsgOptions {
                    reliable,
                    ..MsgOptions::default()
                };
                let _ = node.send(now, Target::Server(*src), PING, &echo, opts);
                None
            }
            (PING, Some(b'R')) => {
                if let Some(p) = self.ping.as_mut() {
                    let seq = data
                        .get(1..5)
                        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    if seq == Some(p.seq) && *src == p.req.to {
                        if let Some(t) = p.sent_at.take() {
                            p.rtts_ns.push(now.since(t).as_nanos() as u64);
                        }
                        p.seq += 1;
                        self.ping_next(now, node);
                    }
                }
                None
            }
            (KEYS, _) => {
                if let Event::Message { key: Some(k), .. } = e {
                    *self.keys_seen.entry(k).or_insert(0) += 1;
                }
                None
            }
            (BENCH, Some(k)) => {
                let k = *k;
                self.bench_message(now, *src, k, data, node);
                None
            }
            _ => Some(e),
        }
    }

    fn bench_message(&mut self, now: Time, src: Coord, kind: u8, data: &[u8], node: &mut Node) {
        let run = data
            .get(1..5)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .unwrap_or(0);
        let body = data.get(5..).unwrap_or(&[]);
        match kind {
            b'S' if body.len() >= 24 => {
                let g = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().unwrap_or([0; 8]));
                let (n, fence_every) = (g(0), g(16));
                let verify = body.get(24).is_none_or(|v| *v != 0);
                if n > 1 << 28 {
                    return;
                }
                self.recv.insert(
                    src,
                    BenchRecv {
                        run,
                        verify,
                        counted: 0,
                        oracle: Oracle::new(if verify { n } else { 0 }, fence_every),
                        short: 0,
                        sum: 0,
                        bytes: 0,
                        first: None,
                    },
                );
            }
            b'd' => {
                if let Some(r) = self.recv.get_mut(&src) {
                    if r.run == run {
                        r.first.get_or_insert(now);
                        r.short += 1;
                        r.bytes += body.len() as u64;
                    }
                }
            }
            b'D' => {
                if let Some(r) = self.recv.get_mut(&src) {
                    if r.run == run {
                        r.first.get_or_insert(now);
                        r.bytes += body.len() as u64;
                        if r.verify {
                            r.oracle.on_message(body, true);
                            r.sum = r.sum.wrapping_add(fnv(body));
                        } else {
                            r.counted += 1;
                        }
                    }
                }
            }
            b'E' => {
                if let Some(r) = self.recv.remove(&src) {
                    let rep = r.oracle.report();
                    let secs = r.first.map(|f| now.since(f).as_secs_f64()).unwrap_or(0.0);
                    let v = json!({
                        "verified": r.verify,
                        "short_received": r.short,
                        "delivered": if r.verify { rep.delivered } else { r.counted },
                        "duplicated": rep.duplicated,
                        "corrupted": rep.corrupted,
                        "fence_violations": rep.fence_violations,
                        "out_of_order_unfenced": rep.out_of_order_unfenced,
                        "bytes": r.bytes,
                        "checksum": format!("{:016x}", r.sum),
                        "receive_s": secs,
                    });
                    let mut msg = vec![b'Y'];
                    msg.extend_from_slice(&run.to_le_bytes());
                    msg.extend_from_slice(v.to_string().as_bytes());
                    let opts = MsgOptions {
                        reliable: true,
                        ..MsgOptions::default()
                    };
                    let _ = node.send(now, Target::Server(src), BENCH, &msg, opts);
                }
            }
            b'Y' => {
                let Some(b) = self.bench.as_ref() else { return };
                if b.run != run || src != b.req.to {
                    return;
                }
                let Some(b) = self.bench.take() else { return };
                let receiver: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                let secs = now.since(b.started).as_secs_f64();
                let body_size = b.req.size.max(13) - 5;
                // Short messages may be lost: goodput counts what arrived.
                let arrived = if b.req.reliable {
                    b.n
                } else {
                    receiver["short_received"].as_u64().unwrap_or(0)
                };
                let bytes = arrived * body_size as u64;
                let _ = b.req.reply.send(json!({
                    "to": b.req.to.to_array(),
                    "reliable": b.req.reliable,
                    "messages": b.n,
                    "messages_per_s": arrived as f64 / secs.max(1e-9),
                    "message_size": b.req.size,
                    "bytes": bytes,
                    "fence_every": b.req.fence_every,
                    "elapsed_s": secs,
                    "goodput_gbps": bytes as f64 * 8.0 / secs.max(1e-9) / 1e9,
                    "sender_checksum": format!("{:016x}", b.sum),
                    "receiver": receiver,
                }));
            }
            _ => {}
        }
    }

    /// Pushes as much of a running transfer into the engine as it takes now; returns how
    /// many messages went in.
    pub fn poll(&mut self, now: Time, node: &mut Node) -> usize {
        if let Some(p) = self.ping.as_mut() {
            if p.sent_at.is_some_and(|t| now.since(t) > PING_TIMEOUT) {
                p.lost += 1;
                p.seq += 1;
                p.sent_at = None;
                self.ping_next(now, node);
            }
        }
        let Some(b) = self.bench.as_mut() else {
            return 0;
        };
        let to = Target::Server(b.req.to);
        let rel = |fences| MsgOptions {
            reliable: true,
            fences,
            intercept: false,
        };
        let mut n = 0;
        if !b.sent_start {
            // Start: forward-fenced, so no data overtakes it.
            let mut s = vec![b'S'];
            s.extend_from_slice(&b.run.to_le_bytes());
            s.extend_from_slice(&b.n.to_le_bytes());
            s.extend_from_slice(&((b.req.size.max(13) - 5) as u64).to_le_bytes());
            s.extend_from_slice(&b.req.fence_every.to_le_bytes());
            s.push(u8::from(b.req.verify));
            let f = torusnet_proto::transport::Fences {
                backward: false,
                forward: true,
            };
            if node.send(now, to, BENCH, &s, rel(f)).is_err() {
                return 0;
            }
            b.sent_start = true;
        }
        let body = b.req.size.max(13) - 5;
        self.buf.resize(5 + body, 0);
        self.buf[0] = if b.req.reliable { b'D' } else { b'd' };
        self.buf[1..5].copy_from_slice(&b.run.to_le_bytes());
        if !b.req.verify && b.next == 0 {
            fill_payload(0, &mut self.buf[5..]);
        }
        while b.next < b.n && n < 512 {
            if b.req.verify {
                fill_payload(b.next, &mut self.buf[5..]);
            } else {
                // Unverified: the same bytes each time, numbered.
                self.buf[5..13].copy_from_slice(&b.next.to_le_bytes());
            }
            let fences = fences_of(b.next, b.req.fence_every);
            let opts = if b.req.reliable {
                rel(fences)
            } else {
                MsgOptions::default()
            };
            match node.send(now, to, BENCH, &self.buf, opts) {
                Ok(()) => {
                    if b.req.verify {
                        b.sum = b.sum.wrapping_add(fnv(&self.buf[5..]));
                    }
                    b.next += 1;
                    n += 1;
                }
                Err(SendError::WouldBlock) => break,
                Err(_) => break,
            }
        }
        if b.next == b.n && !b.ended {
            let mut e = vec![b'E'];
            e.extend_from_slice(&b.run.to_le_bytes());
            let f = torusnet_proto::transport::Fences {
                backward: true,
                forward: false,
            };
            if node.send(now, to, BENCH, &e, rel(f)).is_ok() {
                b.ended = true;
            }
        }
        n
    }
}
