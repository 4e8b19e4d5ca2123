//! `ping` (service 1): echoes every request, and runs ping-pong clients measuring round trips,
//! one request in flight at a time. A request unanswered for 200 ms, or reported failed by
//! the transport, counts as lost; the whole run ends by its deadline.

use std::sync::mpsc::Sender;
use std::time::Duration;

use serde_json::{json, Value};
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::service::{Engine, Request, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::{Lent, SendError};

use super::percentile_us;

/// Service id of the built-in ping.
pub const PING: u16 = 1;

/// How long a ping waits for its echo before counting it lost.
const PING_TIMEOUT: Duration = Duration::from_millis(200);

/// A ping-pong run.
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
    /// The run ends by then, with what it measured so far and an error.
    pub timeout: Duration,
    /// Where the result goes.
    pub reply: Sender<Value>,
}

#[derive(Debug)]
struct Run {
    req: PingRequest,
    seq: u32,
    sent_at: Option<Time>,
    rtts_ns: Vec<u64>,
    lost: u32,
    started: Time,
    deadline: Time,
}

/// The ping service: an echo server and at most one client run.
#[derive(Debug, Default)]
pub struct Ping {
    run: Option<Run>,
    buf: Vec<u8>,
}

impl Ping {
    fn finish(&mut self, now: Time, error: Option<String>) {
        let Some(p) = self.run.take() else { return };
        let mut r = p.rtts_ns.clone();
        r.sort_unstable();
        let mean = if r.is_empty() {
            0.0
        } else {
            r.iter().sum::<u64>() as f64 / r.len() as f64 / 1000.0
        };
        let mut v = json!({
            "to": p.req.to.to_array(),
            "count": p.req.count,
            "size": p.req.size,
            "reliable": p.req.reliable,
            "received": r.len(),
            "lost": p.lost,
            "rtt_us": {
                "min": percentile_us(&r, 0.0),
                "p50": percentile_us(&r, 0.5),
                "p90": percentile_us(&r, 0.9),
                "p99": percentile_us(&r, 0.99),
                "p999": percentile_us(&r, 0.999),
                "max": percentile_us(&r, 1.0),
                "mean": mean,
            },
            "elapsed_s": now.since(p.started).as_secs_f64(),
            // 200 points of the RTT distribution (us), for CDF plots.
            "cdf_us": (0..200).map(|i| percentile_us(&r, i as f64 / 199.0)).collect::<Vec<f64>>(),
        });
        if let Some(e) = error {
            v["error"] = json!(e);
        }
        let _ = p.req.reply.send(v);
    }

    /// Sends the next request of the run, or ends the run when all were sent.
    fn next(&mut self, now: Time, node: &mut dyn Engine) {
        let Some(p) = self.run.as_mut() else { return };
        if p.seq >= p.req.count {
            self.finish(now, None);
            return;
        }
        self.buf.clear();
        self.buf.resize(p.req.size.max(9), 0);
        self.buf[0] = b'Q';
        self.buf[1..5].copy_from_slice(&p.seq.to_le_bytes());
        let opts = MsgOptions {
            reliable: p.req.reliable,
            tag: u64::from(p.seq),
            ..MsgOptions::default()
        };
        match send_now(node, now, p.req.to, &self.buf, opts) {
            Ok(()) => p.sent_at = Some(now),
            Err(_) => {
                // Could not even queue it: lost; the next goes at the next poll.
                p.lost += 1;
                p.seq += 1;
                p.sent_at = None;
            }
        }
    }

    fn lost_current(&mut self, now: Time, node: &mut dyn Engine) {
        if let Some(p) = self.run.as_mut() {
            p.lost += 1;
            p.seq += 1;
            p.sent_at = None;
        }
        self.next(now, node);
    }

    /// A request to echo, or the echo of ours.
    fn on_ping(
        &mut self,
        now: Time,
        src: Coord,
        data: &[u8],
        reliable: bool,
        node: &mut dyn Engine,
    ) {
        match data.first() {
            Some(b'Q') => {
                // Built in the service's own buffer: no allocation per echo on the path
                // of every round trip.
                self.buf.clear();
                self.buf.extend_from_slice(data);
                self.buf[0] = b'R';
                let opts = MsgOptions {
                    reliable,
                    ..MsgOptions::default()
                };
                // An echo that cannot be queued is a lost pong, as on any network.
                let _ = send_now(node, now, src, &self.buf, opts);
            }
            Some(b'R') => {
                let seq = data
                    .get(1..5)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                let Some(p) = self.run.as_mut() else { return };
                if seq == Some(p.seq) && src == p.req.to {
                    if let Some(t) = p.sent_at.take() {
                        p.rtts_ns.push(now.since(t).as_nanos() as u64);
                    }
                    p.seq += 1;
                    self.next(now, node);
                }
            }
            _ => {}
        }
    }
}

/// Sends a request or an echo: straight into its frame when it can go at once (a round
/// trip's message usually can: nothing else waits, nothing is in flight), else queued.
fn send_now(
    node: &mut dyn Engine,
    now: Time,
    to: Coord,
    data: &[u8],
    opts: MsgOptions,
) -> Result<(), SendError> {
    match node.send_framing(now, Target::Server(to), PING, data, opts) {
        // A large one that cannot go at once waits in the queue instead.
        Err(SendError::WouldBlock) => node.send(now, Target::Server(to), PING, data, opts),
        r => r,
    }
}

impl Service for Ping {
    fn name(&self) -> &'static str {
        "ping"
    }

    fn ids(&self) -> &[u16] {
        &[PING]
    }

    fn on_event(&mut self, now: Time, e: &Event, node: &mut dyn Engine) {
        match e {
            Event::Message {
                src,
                data,
                reliable,
                service: PING,
                ..
            } => self.on_ping(now, *src, data, *reliable, node),
            Event::Failed {
                peer,
                service: PING,
                tags,
                ..
            } => {
                let current = self.run.as_ref().is_some_and(|p| {
                    *peer == p.req.to && p.sent_at.is_some() && tags.contains(&u64::from(p.seq))
                });
                if current {
                    self.lost_current(now, node);
                }
            }
            _ => {}
        }
    }

    fn on_message_ref(&mut self, now: Time, m: &Lent<'_>, node: &mut dyn Engine) -> bool {
        // Read where it arrived: an echo is built in the service's own buffer anyway.
        if m.service != PING {
            return false;
        }
        self.on_ping(now, m.src, m.data, m.reliable, node);
        true
    }

    fn on_request(
        &mut self,
        now: Time,
        request: Request,
        node: &mut dyn Engine,
    ) -> Result<(), Request> {
        let req = request.downcast::<PingRequest>()?;
        if self.run.is_some() {
            let _ = req
                .reply
                .send(json!({"error": "a ping run is already in progress"}));
            return Ok(());
        }
        let deadline = now + req.timeout;
        self.run = Some(Run {
            req: *req,
            seq: 0,
            sent_at: None,
            rtts_ns: Vec::new(),
            lost: 0,
            started: now,
            deadline,
        });
        self.next(now, node);
        Ok(())
    }

    fn poll(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        let Some(p) = self.run.as_ref() else { return 0 };
        if now >= p.deadline {
            let msg = format!(
                "ping to {} did not finish within {} ({} of {} answered)",
                p.req.to,
                super::secs(p.req.timeout),
                p.rtts_ns.len(),
                p.req.count
            );
            self.finish(now, Some(msg));
            return 1;
        }
        match p.sent_at {
            Some(t) if now.since(t) > PING_TIMEOUT => {
                self.lost_current(now, node);
                1
            }
            // The previous request could not be queued: try the next one now.
            None => {
                self.next(now, node);
                1
            }
            Some(_) => 0,
        }
    }

    fn poll_timeout(&self) -> Option<Time> {
        let p = self.run.as_ref()?;
        let lost_at = p
            .sent_at
            .map(|t| t + PING_TIMEOUT + Duration::from_nanos(1));
        Some(lost_at.map_or(p.deadline, |t| t.min(p.deadline)))
    }
}
