//! A deterministic test bed for the transport: two servers joined by N links that lose,
//! reorder, duplicate and delay frames and can be cut at a chosen time, all driven by a
//! seeded RNG and a virtual clock, with an oracle that checks what the receiver got.
//!
//! The same scenario and seed give the same run, frame for frame, on every machine. Used by
//! the property tests and by `torus-bench transport`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use crate::rng::SplitMix64;
use crate::time::Time;
use crate::topology::Coord;
use crate::transport::{
    Config, Fences, LinkId, LinkSet, Outgoing, SendError, Transport, TransportEvent,
};
use crate::wire::ETH_LEN;

/// How each link treats frames.
#[derive(Debug, Clone, Copy)]
pub struct LinkModel {
    /// Probability a frame is lost.
    pub loss: f64,
    /// Probability a frame is held back by a random extra delay (so later ones overtake it).
    pub reorder: f64,
    /// Probability a frame arrives twice.
    pub dup: f64,
    /// Propagation delay.
    pub delay: Duration,
    /// Largest extra delay of a reordered frame.
    pub jitter: Duration,
    /// Line rate in bits per second.
    pub rate_bps: u64,
    /// Frames the link's transmit queue holds (room is reported while below this).
    pub queue: u32,
}

impl Default for LinkModel {
    fn default() -> LinkModel {
        LinkModel {
            loss: 0.0,
            reorder: 0.0,
            dup: 0.0,
            delay: Duration::from_micros(5),
            jitter: Duration::from_micros(50),
            rate_bps: 10_000_000_000,
            queue: 8,
        }
    }
}

/// Message sizes of a scenario.
#[derive(Debug, Clone, Copy)]
pub enum Sizes {
    /// Every message this many bytes.
    Fixed(usize),
    /// Uniform in lo..=hi bytes.
    Uniform(usize, usize),
}

/// The receiving server's own speed: frames wait in a ring of `frames` until it takes them,
/// one every `1 / rate_fps` seconds; a frame that finds the ring full is lost, as a frame
/// is when an AF_XDP receiver falls behind.
#[derive(Debug, Clone, Copy)]
pub struct RxRing {
    /// Frames the ring holds.
    pub frames: usize,
    /// Frames the receiver takes per second.
    pub rate_fps: u64,
    /// Whether the receiver states its room to its transport (receiver pacing).
    pub pacing: bool,
}

/// One experiment: what is sent over which links.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// Links between the two servers (1..=8).
    pub links: u8,
    /// How the links behave.
    pub model: LinkModel,
    /// Cut this link (both directions) at this time.
    pub cut: Option<(LinkId, Duration)>,
    /// How long after a cut the servers stop using the link (failure detection).
    pub detect: Duration,
    /// Messages from server A to server B.
    pub messages: u64,
    /// Their sizes (at least 8 bytes: the first 8 carry the message's number).
    pub sizes: Sizes,
    /// Every n-th message is backward-fenced and every n-th (offset n/2) forward-fenced;
    /// 0: no fences.
    pub fence_every: u64,
    /// Reliable messages, or short (best-effort) ones.
    pub reliable: bool,
    /// Seed of every random choice.
    pub seed: u64,
    /// Transport settings of both servers.
    pub transport: Config,
    /// Give up after this much virtual time.
    pub time_limit: Duration,
    /// Server B's receive ring and speed (None: it takes every frame as it arrives).
    pub receiver: Option<RxRing>,
}

impl Default for Scenario {
    fn default() -> Scenario {
        Scenario {
            links: 3,
            model: LinkModel::default(),
            cut: None,
            detect: Duration::from_millis(1),
            messages: 10_000,
            sizes: Sizes::Fixed(64),
            fence_every: 0,
            reliable: true,
            seed: 1,
            transport: Config::default(),
            time_limit: Duration::from_secs(120),
            receiver: None,
        }
    }
}

/// What happened in a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Distinct messages the receiver got intact.
    pub delivered: u64,
    /// Messages sent but never delivered.
    pub lost: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Messages whose bytes differ from what was sent.
    pub corrupted: u64,
    /// Deliveries that broke a fence.
    pub fence_violations: u64,
    /// Unfenced messages delivered before some earlier message.
    pub out_of_order_unfenced: u64,
    /// New data frames (both directions).
    pub data_frames: u64,
    /// Retransmitted frames.
    pub retransmitted_frames: u64,
    /// Explicit ACK frames.
    pub ack_frames: u64,
    /// NACK frames.
    pub nack_frames: u64,
    /// Short-message frames.
    pub short_frames: u64,
    /// Messages per data frame (aggregation).
    pub messages_per_frame: f64,
    /// (ACK + NACK + retransmitted) / data frames, in percent.
    pub extra_frames_pct: f64,
    /// Data frames that arrived out of order at the receiver, in percent.
    pub out_of_order_frames_pct: f64,
    /// Frames put on each link (A to B).
    pub frames_per_link: Vec<u64>,
    /// Virtual time until the last message was delivered and acknowledged.
    pub sim_time: Duration,
    /// Goodput in virtual time, Gb/s.
    pub goodput_gbps: f64,
    /// Whether the run finished before the time limit.
    pub finished: bool,
    /// Frames lost because B's receive ring was full.
    pub rx_ring_drops: u64,
}

const A: Coord = Coord::new(0, 0, 0);
const B: Coord = Coord::new(1, 0, 0);

/// A frame on its way.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: Time,
    order: u64,
    to_b: bool,
    bytes: Vec<u8>,
}

struct Links {
    /// busy_until[dir][link]: when the link's transmitter is free (dir 0: A to B).
    busy: [Vec<Time>; 2],
    heap: BinaryHeap<Reverse<InFlight>>,
    order: u64,
    rng: SplitMix64,
    model: LinkModel,
    cut: Option<(LinkId, Time)>,
    known_down: Option<(LinkId, Time)>,
    per_link: Vec<u64>,
}

impl Links {
    /// `links` idle links between A and B, as the scenario models them.
    fn new(sc: &Scenario, links: u8) -> Links {
        Links {
            busy: [
                vec![Time::ZERO; usize::from(links)],
                vec![Time::ZERO; usize::from(links)],
            ],
            heap: BinaryHeap::new(),
            order: 0,
            rng: SplitMix64::new(sc.seed),
            model: sc.model,
            cut: sc.cut.map(|(l, t)| (l, Time::ZERO + t)),
            known_down: sc.cut.map(|(l, t)| (l, Time::ZERO + t + sc.detect)),
            per_link: vec![0; usize::from(links)],
        }
    }

    fn frame_time(&self, len: usize) -> Duration {
        Duration::from_nanos(
            ((len as u128 + 24) * 8 * 1_000_000_000 / u128::from(self.model.rate_bps.max(1)))
                as u64,
        )
    }

    fn queue_span(&self, mtu: usize) -> Duration {
        self.frame_time(mtu) * self.model.queue.max(1)
    }

    /// Links usable by routing at `now` (a cut link is dropped once detected).
    fn usable(&self, n: u8, now: Time) -> LinkSet {
        let mut s = LinkSet::first(n);
        if let Some((l, t)) = self.known_down {
            if now >= t {
                s = s.without(l);
            }
        }
        s
    }

    fn room(&self, dir: usize, n: u8, now: Time, mtu: usize) -> LinkSet {
        let span = self.queue_span(mtu);
        let mut s = LinkSet::EMPTY;
        for l in 0..n {
            if self.busy[dir][usize::from(l)] <= now + span {
                s = s.with(l);
            }
        }
        s.and(self.usable(n, now))
    }

    fn send(&mut self, dir: usize, link: LinkId, now: Time, bytes: Vec<u8>) {
        let li = usize::from(link);
        let start = self.busy[dir][li].max(now);
        let end = start + self.frame_time(bytes.len());
        self.busy[dir][li] = end;
        if dir == 0 {
            self.per_link[li] += 1;
        }
        let mut arrive = end + self.model.delay;
        let cut = |t: Time| matches!(self.cut, Some((l, c)) if l == link && t >= c);
        if cut(start) || cut(arrive) || self.rng.chance(self.model.loss) {
            return;
        }
        if self.rng.chance(self.model.reorder) {
            arrive = arrive
                + Duration::from_nanos(self.rng.below(self.model.jitter.as_nanos() as u64 + 1));
        }
        if self.rng.chance(self.model.dup) {
            let later = arrive
                + Duration::from_nanos(self.rng.below(self.model.jitter.as_nanos() as u64 + 1));
            self.push(later, dir == 0, bytes.clone());
        }
        self.push(arrive, dir == 0, bytes);
    }

    fn push(&mut self, at: Time, to_b: bool, bytes: Vec<u8>) {
        self.order += 1;
        self.heap.push(Reverse(InFlight {
            at,
            order: self.order,
            to_b,
            bytes,
        }));
    }

    /// When some link regains room, after `now`.
    fn next_room(&self, now: Time, mtu: usize) -> Option<Time> {
        let span = self.queue_span(mtu);
        self.busy
            .iter()
            .flatten()
            .filter_map(|b| {
                let t = Time(b.0.saturating_sub(span.as_nanos() as u64));
                (t > now).then_some(t)
            })
            .min()
    }
}

/// The receiver-side oracle: which messages arrived, intact, how often, and in what order
/// (fences). Messages carry their number in their first 8 bytes and a pattern derived from
/// it ([`payload`]); the oracle knows which numbers were fenced ([`fences_of`]).
#[derive(Debug, Clone)]
pub struct Oracle {
    n: u64,
    fence_every: u64,
    count: Vec<u8>,
    below: u64,
    report: Report,
}

impl Oracle {
    /// An oracle for messages 0..n fenced every `fence_every`.
    pub fn new(n: u64, fence_every: u64) -> Oracle {
        Oracle {
            n,
            fence_every,
            count: vec![0; n as usize],
            below: 0,
            report: Report::default(),
        }
    }

    /// What it has seen so far (delivered, duplicated, corrupted, fence violations,
    /// out-of-order unfenced deliveries).
    pub fn report(&self) -> &Report {
        &self.report
    }

    fn fences(&self, id: u64) -> Fences {
        fences_of(id, self.fence_every)
    }

    fn latest_fwd_before(&self, id: u64) -> Option<u64> {
        let f = self.fence_every;
        if f < 2 || id == 0 {
            return None;
        }
        // Forward-fenced ids are k*f + f/2.
        let half = f / 2;
        let last = id - 1;
        if last < half {
            return None;
        }
        Some((last - half) / f * f + half)
    }

    /// Checks one delivered message.
    pub fn on_message(&mut self, data: &[u8], reliable: bool) {
        let Some(id) = data
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0xff; 8])))
        else {
            self.report.corrupted += 1;
            return;
        };
        if id >= self.n || !payload_matches(id, data) {
            self.report.corrupted += 1;
            return;
        }
        let i = id as usize;
        self.count[i] = self.count[i].saturating_add(1);
        if self.count[i] > 1 {
            self.report.duplicated += 1;
            return;
        }
        self.report.delivered += 1;
        if reliable {
            let f = self.fences(id);
            let mut ok = !f.backward || self.below == id;
            if let Some(j) = self.latest_fwd_before(id) {
                ok &= self.count[j as usize] > 0;
            }
            if !ok {
                self.report.fence_violations += 1;
            }
            if f == Fences::default() && id > self.below {
                self.report.out_of_order_unfenced += 1;
            }
        }
        while self.below < self.n && self.count[self.below as usize] > 0 {
            self.below += 1;
        }
    }
}

/// The fences the scenario gives message `id`.
pub fn fences_of(id: u64, fence_every: u64) -> Fences {
    match fence_every {
        0 => Fences::default(),
        1 => Fences {
            backward: true,
            forward: false,
        },
        f => Fences {
            backward: id > 0 && id.is_multiple_of(f),
            forward: id % f == f / 2,
        },
    }
}

/// The bytes of message `id`: its number, then a pattern derived from it.
pub fn payload(id: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len.max(8)];
    fill_payload(id, &mut v);
    v
}

/// Writes message `id`'s bytes into `buf` (at least 8 bytes): its number, then a pattern
/// derived from it, 8 bytes at a time (cheap enough for gigabytes).
pub fn fill_payload(id: u64, buf: &mut [u8]) {
    buf[..8].copy_from_slice(&id.to_le_bytes());
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf[8..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// Whether `data` is exactly message `id`'s bytes (compared a word at a time).
pub fn payload_matches(id: u64, data: &[u8]) -> bool {
    if data.len() < 8 || data[..8] != id.to_le_bytes() {
        return false;
    }
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut chunks = data[8..].chunks_exact(8);
    for c in &mut chunks {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        if w != x {
            return false;
        }
    }
    let rest = chunks.remainder();
    if rest.is_empty() {
        return true;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rest == &x.to_le_bytes()[..rest.len()]
}

/// B takes frames from its ring at its own speed (and, pacing, tells A how much room the
/// ring has).
fn take_from_ring(
    b: &mut Transport,
    rx: RxRing,
    ring: &mut std::collections::VecDeque<Vec<u8>>,
    rx_free_at: &mut Time,
    now: Time,
) {
    let per_frame = Duration::from_nanos(1_000_000_000 / rx.rate_fps.max(1));
    while *rx_free_at <= now {
        let Some(f) = ring.pop_front() else {
            break;
        };
        let _ = b.handle_frame(now, &f);
        *rx_free_at = now + per_frame;
    }
    if rx.pacing {
        b.set_rx_room(now, (rx.frames - ring.len()) as u32);
    }
}

/// A queues the scenario's next messages until its queue is full or all are sent (a
/// message refused for room is kept in `pending` for the next turn).
fn feed(
    a: &mut Transport,
    sc: &Scenario,
    now: Time,
    next_id: &mut u64,
    pending: &mut Option<Vec<u8>>,
    sizes: &mut SplitMix64,
) {
    while *next_id < sc.messages {
        let data = pending.take().unwrap_or_else(|| {
            let len = match sc.sizes {
                Sizes::Fixed(n) => n,
                Sizes::Uniform(lo, hi) => lo + sizes.below((hi - lo + 1) as u64) as usize,
            };
            payload(*next_id, len.max(8))
        });
        let m = Outgoing {
            dest: B,
            service: 7,
            data: &data,
            reliable: sc.reliable,
            fences: fences_of(*next_id, sc.fence_every),
            tag: *next_id,
            from: 7,
        };
        match a.send(now, m) {
            Ok(()) => *next_id += 1,
            Err(SendError::WouldBlock) => {
                *pending = Some(data);
                break;
            }
            Err(_) => {
                // Too large for a short message: counted as lost.
                *next_id += 1;
            }
        }
    }
}

/// Completes the oracle's report `r` (its time already set) with both ends' counts.
fn finish(
    mut r: Report,
    sc: &Scenario,
    a: &Transport,
    b: &Transport,
    per_link: Vec<u64>,
) -> Report {
    let (sa, sb) = (a.stats(), b.stats());
    r.lost = sc.messages - r.delivered;
    r.data_frames = sa.data_frames + sb.data_frames;
    r.retransmitted_frames = sa.retransmitted_frames + sb.retransmitted_frames;
    r.ack_frames = sa.ack_frames + sb.ack_frames;
    r.nack_frames = sa.nack_frames + sb.nack_frames;
    r.short_frames = sa.short_frames + sb.short_frames;
    let frames = if sc.reliable {
        sa.data_frames
    } else {
        sa.short_frames
    };
    let msgs = if sc.reliable {
        sa.messages_sent
    } else {
        sa.short_messages_sent
    };
    r.messages_per_frame = msgs as f64 / frames.max(1) as f64;
    r.extra_frames_pct = 100.0 * (r.ack_frames + r.nack_frames + r.retransmitted_frames) as f64
        / r.data_frames.max(1) as f64;
    r.out_of_order_frames_pct =
        100.0 * sb.out_of_order_frames as f64 / sb.frames_received.max(1) as f64;
    r.frames_per_link = per_link;
    let bytes: f64 = match sc.sizes {
        Sizes::Fixed(n) => (n.max(8) as f64) * r.delivered as f64,
        Sizes::Uniform(lo, hi) => ((lo + hi) as f64 / 2.0).max(8.0) * r.delivered as f64,
    };
    r.goodput_gbps = bytes * 8.0 / r.sim_time.as_nanos().max(1) as f64;
    r
}

/// Runs a scenario to the end (or its time limit) and reports what happened.
pub fn run(sc: &Scenario) -> Report {
    let links = sc.links.clamp(1, LinkSet::CAPACITY);
    let mtu = sc.transport.mtu;
    let mut a = Transport::new(A, sc.transport);
    let mut b = Transport::new(B, sc.transport);
    let mut net = Links::new(sc, links);
    let mut sizes = SplitMix64::new(sc.seed ^ 0x5151);
    let mut oracle = Oracle::new(sc.messages, sc.fence_every);
    let mut next_id = 0u64;
    let mut pending: Option<Vec<u8>> = None;
    let mut buf = vec![0u8; ETH_LEN + mtu];
    let mut now = Time::ZERO;
    let limit = Time::ZERO + sc.time_limit;
    let mut last_delivery = Time::ZERO;
    let mut same_now = 0u32;

    let mut ring: std::collections::VecDeque<Vec<u8>> = std::collections::VecDeque::new();
    let mut rx_free_at = Time::ZERO;
    let mut rx_ring_drops = 0u64;

    loop {
        // Frames that have arrived.
        while net.heap.peek().is_some_and(|f| f.0.at <= now) {
            let Some(Reverse(f)) = net.heap.pop() else {
                break;
            };
            match (f.to_b, sc.receiver) {
                (true, Some(rx)) => {
                    if ring.len() >= rx.frames {
                        rx_ring_drops += 1;
                    } else {
                        ring.push_back(f.bytes);
                    }
                }
                // Frames the transport refuses are counted in its stats; the run goes on.
                (true, None) => {
                    let _ = b.handle_frame(now, &f.bytes);
                }
                (false, _) => {
                    let _ = a.handle_frame(now, &f.bytes);
                }
            }
        }
        if let Some(rx) = sc.receiver {
            take_from_ring(&mut b, rx, &mut ring, &mut rx_free_at, now);
        }
        for node in [&mut a, &mut b] {
            if node.poll_timeout().is_some_and(|t| t <= now) {
                node.handle_timeout(now);
            }
        }
        // A sends, B only acknowledges; both transmit while links have room.
        for dir in 0..2 {
            loop {
                if dir == 0 {
                    feed(&mut a, sc, now, &mut next_id, &mut pending, &mut sizes);
                }
                let room = net.room(dir, links, now, mtu);
                let usable = net.usable(links, now);
                let paths = move |_: Coord| usable;
                let node = if dir == 0 { &mut a } else { &mut b };
                // A driver skips the call when the transport says it has nothing: it must
                // never have had a frame then.
                let may = node.may_transmit();
                let Some(t) = node.poll_transmit(now, room, &paths, &mut buf, None) else {
                    break;
                };
                assert!(may, "a frame came out after may_transmit said none");
                net.send(dir, t.link, now, buf[..t.len].to_vec());
            }
        }
        while let Some(e) = b.poll_event() {
            if let TransportEvent::Message { data, reliable, .. } = e {
                oracle.on_message(&data, reliable);
                last_delivery = now;
            }
        }
        while a.poll_event().is_some() {}

        let all_sent = next_id >= sc.messages && a.queued_messages() == 0;
        let done = if sc.reliable {
            all_sent && oracle.report.delivered == sc.messages && a.in_flight() == 0
        } else {
            all_sent && net.heap.is_empty()
        };
        if done {
            oracle.report.finished = true;
            break;
        }
        // A timer due already (set while transmitting) runs before time moves on.
        let due_now = [a.poll_timeout(), b.poll_timeout()]
            .into_iter()
            .flatten()
            .any(|t| t <= now);
        if due_now && same_now < 4 {
            same_now += 1;
            continue;
        }
        same_now = 0;
        let candidates = [
            net.heap.peek().map(|f| f.0.at),
            a.poll_timeout(),
            b.poll_timeout(),
            net.next_room(now, mtu),
            net.known_down.map(|(_, t)| t).filter(|t| *t > now),
            (!ring.is_empty()).then_some(rx_free_at),
        ];
        let next = candidates.into_iter().flatten().filter(|t| *t > now).min();
        match next {
            Some(t) if t <= limit => now = t,
            _ => break,
        }
    }

    let mut r = oracle.report;
    r.rx_ring_drops = rx_ring_drops;
    r.sim_time = last_delivery.since(Time::ZERO).max(now.since(Time::ZERO));
    finish(r, sc, &a, &b, net.per_link)
}
