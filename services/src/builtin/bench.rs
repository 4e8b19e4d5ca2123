//! `bench` (service 2): a bulk sender and a receiver that checks every message is delivered
//! exactly once, byte-exact, with its fences respected. One run at a time per server; a run
//! ends with the receiver's report, with the transport's failure report for its messages
//! (the receiver restarted, went silent or became unreachable), or at its deadline.

use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::time::Duration;

use serde_json::{json, Value};
use torusnet_proto::harness::{fences_of, fill_payload, Oracle};
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::service::{Engine, Request, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::{Fences, Lent, SendError};

use super::fnv;

/// Service id of the built-in bench.
pub const BENCH: u16 = 2;

/// A bulk transfer.
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
    /// The run ends by then, with an error if the receiver has not reported.
    pub timeout: Duration,
    /// Where the result goes.
    pub reply: Sender<Value>,
}

#[derive(Debug)]
struct Run {
    req: BenchRequest,
    run: u32,
    n: u64,
    next: u64,
    started: Time,
    deadline: Time,
    sum: u64,
    sent_start: bool,
    ended: bool,
}

#[derive(Debug)]
struct Receiving {
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

/// The bench service: at most one sending run, and one receiving run per sender.
#[derive(Debug, Default)]
pub struct Bench {
    run: Option<Run>,
    recv: HashMap<Coord, Receiving>,
    runs: u32,
    buf: Vec<u8>,
}

/// Bytes of a data message before its body: kind and run number.
const HEAD: usize = 5;

fn body_len(size: usize) -> usize {
    size.max(13) - HEAD
}

fn rel(fences: Fences) -> MsgOptions {
    MsgOptions {
        reliable: true,
        fences,
        ..MsgOptions::default()
    }
}

impl Bench {
    fn fail(&mut self, error: String) {
        if let Some(b) = self.run.take() {
            let _ = b.req.reply.send(json!({
                "error": error,
                "to": b.req.to.to_array(),
                "messages": b.n,
                "messages_sent": b.next,
            }));
        }
    }

    fn on_message(&mut self, now: Time, src: Coord, data: &[u8], node: &mut dyn Engine) {
        let Some(&kind) = data.first() else { return };
        let run = data
            .get(1..HEAD)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .unwrap_or(0);
        let body = data.get(HEAD..).unwrap_or(&[]);
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
                    Receiving {
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
                if let Some(r) = self.recv.get_mut(&src).filter(|r| r.run == run) {
                    r.first.get_or_insert(now);
                    r.short += 1;
                    r.bytes += body.len() as u64;
                }
            }
            b'D' => {
                if let Some(r) = self.recv.get_mut(&src).filter(|r| r.run == run) {
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
            b'E' => {
                let Some(r) = self.recv.remove(&src).filter(|r| r.run == run) else {
                    return;
                };
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
                // If it cannot be queued the sender's run ends at its deadline.
                let _ = node.send(
                    now,
                    Target::Server(src),
                    BENCH,
                    &msg,
                    rel(Fences::default()),
                );
            }
            b'Y' => {
                let Some(b) = self.run.as_ref() else { return };
                if b.run != run || src != b.req.to {
                    return;
                }
                let Some(b) = self.run.take() else { return };
                let receiver: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                let secs = now.since(b.started).as_secs_f64();
                let body_size = body_len(b.req.size);
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
}

impl Service for Bench {
    fn name(&self) -> &'static str {
        "bench"
    }

    fn ids(&self) -> &[u16] {
        &[BENCH]
    }

    fn on_event(&mut self, now: Time, e: &Event, node: &mut dyn Engine) {
        match e {
            Event::Message {
                src,
                data,
                service: BENCH,
                ..
            } => self.on_message(now, *src, data, node),
            Event::Failed {
                peer,
                service: BENCH,
                tags,
                reason,
            } if self.run.as_ref().is_some_and(|b| b.req.to == *peer) => {
                self.fail(format!(
                    "{} messages to {peer} failed: {reason}; the transfer is incomplete",
                    tags.len()
                ));
            }
            _ => {}
        }
    }

    fn on_message_ref(&mut self, now: Time, m: &Lent<'_>, node: &mut dyn Engine) -> bool {
        // Checked and counted where it arrived: nothing of it is kept.
        if m.service != BENCH {
            return false;
        }
        self.on_message(now, m.src, m.data, node);
        true
    }

    fn on_request(
        &mut self,
        now: Time,
        request: Request,
        _node: &mut dyn Engine,
    ) -> Result<(), Request> {
        let req = request.downcast::<BenchRequest>()?;
        if self.run.is_some() {
            let _ = req
                .reply
                .send(json!({"error": "a bench run is already in progress"}));
            return Ok(());
        }
        self.runs += 1;
        let n = req.bytes.div_ceil(body_len(req.size) as u64).max(1);
        let deadline = now + req.timeout;
        self.run = Some(Run {
            req: *req,
            run: self.runs,
            n,
            next: 0,
            started: now,
            deadline,
            sum: 0,
            sent_start: false,
            ended: false,
        });
        Ok(())
    }

    fn poll(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        let Some(b) = self.run.as_mut() else {
            return 0;
        };
        if now >= b.deadline {
            let msg = format!(
                "bench to {} did not finish within {} ({} of {} messages sent, no report from the receiver)",
                b.req.to,
                super::secs(b.req.timeout),
                b.next,
                b.n
            );
            self.fail(msg);
            return 1;
        }
        let to = Target::Server(b.req.to);
        let mut n = 0;
        if !b.sent_start {
            // Start: forward-fenced, so no data overtakes it.
            let mut s = vec![b'S'];
            s.extend_from_slice(&b.run.to_le_bytes());
            s.extend_from_slice(&b.n.to_le_bytes());
            s.extend_from_slice(&(body_len(b.req.size) as u64).to_le_bytes());
            s.extend_from_slice(&b.req.fence_every.to_le_bytes());
            s.push(u8::from(b.req.verify));
            let f = Fences {
                backward: false,
                forward: true,
            };
            match node.send(now, to, BENCH, &s, rel(f)) {
                Ok(()) => b.sent_start = true,
                Err(SendError::WouldBlock) => return 0,
                Err(e) => {
                    let msg = format!("bench to {}: {e}", b.req.to);
                    self.fail(msg);
                    return 1;
                }
            }
        }
        let body = body_len(b.req.size);
        self.buf.resize(HEAD + body, 0);
        self.buf[0] = if b.req.reliable { b'D' } else { b'd' };
        self.buf[1..HEAD].copy_from_slice(&b.run.to_le_bytes());
        if !b.req.verify && b.next == 0 {
            fill_payload(0, &mut self.buf[HEAD..]);
        }
        let mut error = None;
        while b.next < b.n && n < 512 {
            if b.req.verify {
                fill_payload(b.next, &mut self.buf[HEAD..]);
            } else {
                // Unverified: the same bytes each time, numbered.
                self.buf[HEAD..HEAD + 8].copy_from_slice(&b.next.to_le_bytes());
            }
            let opts = if b.req.reliable {
                MsgOptions {
                    tag: b.next,
                    ..rel(fences_of(b.next, b.req.fence_every))
                }
            } else {
                MsgOptions::default()
            };
            // Straight into its frame when it fills one (a jumbo message: one copy, not
            // two); refused while the links are full, and tried again on the next poll.
            match node.send_framing(now, to, BENCH, &self.buf, opts) {
                Ok(()) => {
                    if b.req.verify {
                        b.sum = b.sum.wrapping_add(fnv(&self.buf[HEAD..]));
                    }
                    b.next += 1;
                    n += 1;
                }
                Err(SendError::WouldBlock) => break,
                Err(e) => {
                    error = Some(format!("bench to {}: {e}", b.req.to));
                    break;
                }
            }
        }
        if let Some(e) = error {
            self.fail(e);
            return n + 1;
        }
        if b.next == b.n && !b.ended {
            let mut e = vec![b'E'];
            e.extend_from_slice(&b.run.to_le_bytes());
            let f = Fences {
                backward: true,
                forward: false,
            };
            if node.send(now, to, BENCH, &e, rel(f)).is_ok() {
                b.ended = true;
            }
        }
        n
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.run.as_ref().map(|b| b.deadline)
    }
}
