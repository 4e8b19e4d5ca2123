//! A deterministic message-level network for testing services: every server of a small
//! torus runs its own instance of a service, reliable messages take one tick per hop, a
//! sender's queue holds a bounded number of messages (then `WouldBlock`), servers fail or
//! freeze on cue (their neighbours' messages to them are reported failed, everyone is told
//! they are unreachable, and after a freeze reachable again), servers join and finish
//! joining on cue (they take keys only then), key-routed messages go to their key's root,
//! and chosen messages are reported failed instead of delivered (as a transport does when
//! its peer went silent).

use std::collections::VecDeque;
use std::time::Duration;

use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::service::{Engine, Request, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims};
use torusnet_proto::transport::{FailReason, SendError};

/// One tick per hop.
pub const HOP: Duration = Duration::from_micros(10);

struct InFlight {
    at: Time,
    src: Coord,
    dst: Coord,
    service: u16,
    data: Vec<u8>,
    tag: u64,
}

/// What a service sees of the network during one call.
struct NetEngine<'a> {
    local: Coord,
    dims: Dims,
    up: &'a [bool],
    joining: &'a [bool],
    now: Time,
    out: &'a mut Vec<InFlight>,
    queued: usize,
    budget: usize,
    /// Messages sent, and the link-hops they crossed.
    hops: &'a mut u64,
}

fn ring(a: u16, b: u16, n: u16) -> u32 {
    let d = a.abs_diff(b);
    u32::from(d.min(n - d))
}

impl Engine for NetEngine<'_> {
    fn local(&self) -> Coord {
        self.local
    }
    fn dims(&self) -> Dims {
        self.dims
    }
    fn incarnation(&self) -> u64 {
        1
    }
    fn is_reachable(&self, c: Coord) -> bool {
        self.dims.contains(c) && self.up[self.dims.index(c)]
    }
    fn takes_keys(&self, c: Coord) -> bool {
        self.is_reachable(c) && !self.joining[self.dims.index(c)]
    }
    fn distance(&self, c: Coord) -> Option<u32> {
        let (a, d) = (self.local, self.dims);
        self.is_reachable(c)
            .then(|| ring(a.x, c.x, d.x()) + ring(a.y, c.y, d.y()) + ring(a.z, c.z, d.z()))
    }
    fn send(
        &mut self,
        _now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError> {
        let dst = match target {
            Target::Server(c) => c,
            Target::Key(k) => self.key_root(k).ok_or(SendError::Unreachable)?,
        };
        if !self.is_reachable(dst) {
            return Err(SendError::Unreachable);
        }
        if self.queued >= self.budget {
            return Err(SendError::WouldBlock);
        }
        self.queued += 1;
        let hops = self.distance(dst).unwrap_or(1).max(1);
        *self.hops += u64::from(hops) * data.len() as u64;
        self.out.push(InFlight {
            at: self.now + HOP * hops,
            src: self.local,
            dst,
            service,
            data: data.to_vec(),
            tag: opts.tag,
        });
        Ok(())
    }
    fn notify_acks(&mut self, _service: u16, _on: bool) {}
}

/// Picks the messages to report failed instead of delivering: (source, destination,
/// bytes).
pub type LossFn = Box<dyn FnMut(Coord, Coord, &[u8]) -> bool>;

/// The network and one service instance per server.
pub struct Net<S: Service> {
    /// The torus.
    pub dims: Dims,
    /// Which servers are up.
    pub up: Vec<bool>,
    /// Which servers are still joining (reachable, but taking no keys).
    pub joining: Vec<bool>,
    /// The services, by server index.
    pub svc: Vec<S>,
    /// Now.
    pub now: Time,
    flight: VecDeque<InFlight>,
    /// Messages a server may have in flight at once (its transport's queue).
    pub budget: usize,
    /// Payload bytes times hops crossed, over the whole run.
    pub byte_hops: u64,
    /// Messages this picks are reported failed to their sender (reason `Silent`).
    pub lose: Option<LossFn>,
}

impl<S: Service> Net<S> {
    /// A torus of `dims` running `make(coord)` on every server.
    pub fn new(dims: Dims, make: impl Fn(Coord) -> S) -> Net<S> {
        Net {
            dims,
            up: vec![true; dims.count() as usize],
            joining: vec![false; dims.count() as usize],
            svc: dims.coords().map(make).collect(),
            now: Time::ZERO,
            flight: VecDeque::new(),
            budget: 64,
            byte_hops: 0,
            lose: None,
        }
    }

    fn call(&mut self, i: usize, f: impl FnOnce(&mut S, Time, &mut dyn Engine)) {
        let mut out = Vec::new();
        let local = self.dims.coord(i);
        let queued = self.flight.iter().filter(|m| m.src == local).count();
        let mut hops = 0u64;
        {
            let mut e = NetEngine {
                local,
                dims: self.dims,
                up: &self.up,
                joining: &self.joining,
                now: self.now,
                out: &mut out,
                queued,
                budget: self.budget,
                hops: &mut hops,
            };
            f(&mut self.svc[i], self.now, &mut e);
        }
        self.byte_hops += hops;
        self.flight.extend(out);
    }

    /// Hands server `c` a request.
    pub fn request(&mut self, c: Coord, r: Request) {
        let i = self.dims.index(c);
        self.call(i, |s, now, e| {
            let _ = s.on_request(now, r, e);
        });
    }

    /// Fails server `c`: what it had in flight is gone, what others sent it is reported
    /// failed to them, and every server is told.
    pub fn kill(&mut self, c: Coord) {
        self.flight.retain(|m| m.src != c);
        self.freeze(c);
    }

    /// Stops server `c` for a while (a starved or paused daemon that keeps its state): what
    /// others sent it is reported failed to them, every server is told it is unreachable,
    /// and it is not polled until [`Net::thaw`].
    pub fn freeze(&mut self, c: Coord) {
        let i = self.dims.index(c);
        self.up[i] = false;
        let (gone, keep): (Vec<InFlight>, Vec<InFlight>) =
            self.flight.drain(..).partition(|m| m.dst == c);
        self.flight = keep.into();
        for m in gone {
            self.fail(m, FailReason::Unreachable);
        }
        self.tell_all(&Event::Unreachable(c));
    }

    /// Server `c` runs again after [`Net::freeze`]: every server is told it is reachable.
    pub fn thaw(&mut self, c: Coord) {
        let i = self.dims.index(c);
        self.up[i] = true;
        self.tell_all(&Event::Reachable(c));
    }

    /// Server `c` begins or finishes joining: it takes keys only when not joining, and every
    /// server is told the roots moved.
    pub fn set_joining(&mut self, c: Coord, joining: bool) {
        let i = self.dims.index(c);
        if self.joining[i] != joining {
            self.joining[i] = joining;
            self.tell_all(&Event::RootsMoved);
        }
    }

    /// Puts a message from `src` to `dst` on the wire, due now (a late or forged one).
    pub fn inject(&mut self, src: Coord, dst: Coord, service: u16, data: Vec<u8>) {
        self.flight.push_back(InFlight {
            at: self.now,
            src,
            dst,
            service,
            data,
            tag: 0,
        });
    }

    fn fail(&mut self, m: InFlight, reason: FailReason) {
        let j = self.dims.index(m.src);
        if !self.up[j] {
            return;
        }
        let ev = Event::Failed {
            peer: m.dst,
            service: m.service,
            tags: vec![m.tag],
            reason,
        };
        self.call(j, |s, now, e| s.on_event(now, &ev, e));
    }

    fn tell_all(&mut self, ev: &Event) {
        for j in 0..self.up.len() {
            if self.up[j] {
                self.call(j, |s, now, e| s.on_event(now, ev, e));
            }
        }
    }

    /// Runs until `until` (or nothing is left to do): delivers what is due, polls every
    /// live server.
    pub fn run(&mut self, until: Time) {
        while self.now < until {
            let now = self.now;
            let due: Vec<InFlight> = {
                let (d, k): (Vec<InFlight>, Vec<InFlight>) =
                    self.flight.drain(..).partition(|m| m.at <= now);
                self.flight = k.into();
                d
            };
            for m in due {
                let j = self.dims.index(m.dst);
                if !self.up[j] {
                    continue;
                }
                if let Some(lose) = self.lose.as_mut() {
                    if lose(m.src, m.dst, &m.data) {
                        self.fail(m, FailReason::Silent);
                        continue;
                    }
                }
                let ev = Event::Message {
                    src: m.src,
                    service: m.service,
                    data: m.data,
                    reliable: true,
                    key: None,
                };
                self.call(j, |s, now, e| s.on_event(now, &ev, e));
            }
            let mut busy = !self.flight.is_empty();
            for j in 0..self.up.len() {
                if self.up[j] {
                    let mut w = 0;
                    self.call(j, |s, now, e| w = s.poll(now, e));
                    busy |= w > 0 || self.svc[j].poll_timeout().is_some_and(|t| t <= now + HOP);
                }
            }
            if !busy {
                // Jump to the next timer.
                let next = (0..self.up.len())
                    .filter(|j| self.up[*j])
                    .filter_map(|j| self.svc[j].poll_timeout())
                    .min();
                match next {
                    Some(t) if t > self.now && t < until => self.now = t,
                    _ => return,
                }
            } else {
                self.now = self.now + HOP;
            }
        }
    }
}
