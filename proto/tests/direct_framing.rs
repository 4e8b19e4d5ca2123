//! Messages written straight into their frames (`Transport::send_framing`) put on the wire
//! exactly what queueing them (`send`, and `poll_transmit` at once for those framed
//! straight) would: the same frames, byte for byte, in the same order, for any mix of
//! messages framed straight and messages that share frames or are cut into fragments, fenced
//! or not, with a window that closes and reopens. Two identical pairs
//! of transports are driven side by side, one each way, and their frames compared.

use std::time::Duration;

use torusnet_proto::wire::{HEADERS_LEN, MSG_HEADER_LEN};

/// Payload bytes of a frame at MTU 1500.
const FRAME: usize = 1514 - HEADERS_LEN;
/// The smallest message that fills more than half a frame as an aggregated message would.
const HALF: usize = FRAME / 2 + 1 - MSG_HEADER_LEN;

use torusnet_proto::rng::SplitMix64;
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::{
    Config, Fences, LinkSet, Outgoing, SendError, Transmit, Transport, TransportEvent, TxKind,
};

const A: Coord = Coord::new(0, 0, 0);
const B: Coord = Coord::new(1, 0, 0);
const MTU: usize = 1500;

fn two_links(_: Coord) -> LinkSet {
    LinkSet::first(2)
}

/// A sender and its receiver.
struct Pair {
    a: Transport,
    b: Transport,
    /// Every frame A sent, in order.
    wire: Vec<Vec<u8>>,
    /// Message bodies B delivered, in order.
    got: Vec<Vec<u8>>,
    buf: Vec<u8>,
}

impl Pair {
    fn new(window: u32) -> Pair {
        let cfg = Config {
            mtu: MTU,
            window,
            ..Config::default()
        };
        let mut p = Pair {
            a: Transport::new(A, cfg),
            b: Transport::new(B, cfg),
            wire: Vec::new(),
            got: Vec::new(),
            buf: vec![0; 14 + MTU],
        };
        p.a.connect(Time::ZERO, B).expect("connect");
        p.exchange(Time::ZERO, true);
        assert!(p.a.is_established(B) && p.b.is_established(A));
        p.wire.clear();
        p
    }

    /// What A has to send now, recorded (and handed to B when `deliver`).
    fn drain_a(&mut self, now: Time, deliver: bool) {
        while let Some(t) =
            self.a
                .poll_transmit(now, LinkSet::first(2), &two_links, &mut self.buf, None)
        {
            self.record(now, t.len, deliver);
        }
    }

    fn record(&mut self, now: Time, len: usize, deliver: bool) {
        let f = self.buf[..len].to_vec();
        if deliver {
            self.b.handle_frame(now, &f).expect("B takes A's frame");
        }
        self.wire.push(f);
    }

    /// Frames both ways until neither has any: B's ACKs reopen A's window.
    fn exchange(&mut self, now: Time, deliver: bool) {
        for _ in 0..10_000 {
            let before = self.wire.len();
            self.drain_a(now, deliver);
            let mut back = false;
            while let Some(t) =
                self.b
                    .poll_transmit(now, LinkSet::first(2), &two_links, &mut self.buf, None)
            {
                back = true;
                let f = self.buf[..t.len].to_vec();
                self.a.handle_frame(now, &f).expect("A takes B's frame");
            }
            while let Some(e) = self.b.poll_event() {
                if let TransportEvent::Message { data, .. } = e {
                    self.got.push(data);
                }
            }
            if !back && self.wire.len() == before {
                return;
            }
        }
        panic!("frames kept coming for 10000 rounds");
    }

    fn timers(&mut self, now: Time) {
        for t in [&mut self.a, &mut self.b] {
            if t.poll_timeout().is_some_and(|d| d <= now) {
                t.handle_timeout(now);
            }
        }
    }
}

fn message(data: &[u8], tag: u64, fences: Fences) -> Outgoing<'_> {
    Outgoing {
        dest: B,
        service: 9,
        from: 9,
        data,
        reliable: true,
        fences,
        tag,
    }
}

/// One random run: bursts of messages sent without transmitting in between, then
/// transmitted; sometimes the peer's ACKs are held back, so the window closes.
fn run(seed: u64) -> (u64, u64, u64) {
    let mut rng = SplitMix64::new(seed);
    let (mut queued, mut direct) = (Pair::new(8), Pair::new(8));
    let mut now = Time::ZERO;
    let (mut framed, mut refused, mut small) = (0u64, 0u64, 0u64);
    let mut tag = 0u64;
    for _ in 0..400 {
        let burst = 1 + rng.next_u64() % 4;
        let deliver = !rng.next_u64().is_multiple_of(4);
        for _ in 0..burst {
            let r = rng.next_u64();
            // Over half a frame (at MTU 1500 a frame holds FRAME payload bytes; an
            // aggregated message takes 6 more for its header), small, or in fragments; now
            // and then fenced.
            let len = if r.is_multiple_of(3) {
                20 + (r >> 8) as usize % 200
            } else if r % 7 == 1 {
                FRAME + 1 + (r >> 8) as usize % 3000
            } else {
                HALF + (r >> 8) as usize % (FRAME + 1 - HALF)
            };
            let fences = Fences {
                backward: (r >> 40).is_multiple_of(7),
                forward: (r >> 44).is_multiple_of(7),
            };
            let data: Vec<u8> = (0..len).map(|i| (tag as usize * 7 + i) as u8).collect();
            tag += 1;
            let m = message(&data, tag, fences);
            queued.a.send(now, m).expect("queued");
            match direct.a.send_framing(
                now,
                m,
                LinkSet::first(2),
                &two_links,
                &mut direct.buf,
                None,
            ) {
                Ok(Some(t)) => {
                    assert_eq!(t.kind, TxKind::Data);
                    framed += 1;
                    small += u64::from(len < HALF);
                    direct.record(now, t.len, deliver);
                    // What the queueing pair sends for it at once.
                    queued.drain_a(now, deliver);
                }
                Ok(None) => {}
                Err(SendError::WouldBlock) => {
                    // Nothing taken: it cannot go now, and queued it waits as the other.
                    refused += 1;
                    direct.a.send(now, m).expect("queued after the refusal");
                }
                Err(e) => panic!("send_framing: {e}"),
            }
        }
        queued.drain_a(now, deliver);
        direct.drain_a(now, deliver);
        assert_eq!(queued.wire, direct.wire, "seed {seed}, tag {tag}");
        if !rng.next_u64().is_multiple_of(3) {
            queued.exchange(now, deliver);
            direct.exchange(now, deliver);
        }
        now = now + Duration::from_micros(300);
        queued.timers(now);
        direct.timers(now);
    }
    // Everything arrives, in the order sent.
    for _ in 0..200 {
        now = now + Duration::from_millis(5);
        for p in [&mut queued, &mut direct] {
            p.timers(now);
            p.exchange(now, true);
        }
        if queued.got.len() as u64 == tag && direct.got.len() as u64 == tag {
            break;
        }
    }
    assert_eq!(queued.wire, direct.wire, "seed {seed}");
    assert_eq!(direct.got.len() as u64, tag, "seed {seed}: all delivered");
    assert_eq!(queued.got, direct.got, "seed {seed}");
    (framed, refused, small)
}

#[test]
fn framing_straight_puts_on_the_wire_what_queueing_would() {
    let (mut framed, mut refused, mut small) = (0, 0, 0);
    for seed in 1..=6 {
        let (f, r, s) = run(seed);
        framed += f;
        refused += r;
        small += s;
    }
    // The run went every way: straight into frames (small messages too, on an idle
    // connection), and refused on a closed window.
    assert!(framed > 300, "framed straight: {framed}");
    assert!(small > 10, "small ones framed straight: {small}");
    assert!(refused > 20, "refused: {refused}");
}

/// A's `send_framing` of `m` into `buf`, on the links in `room`.
fn framing(
    a: &mut Transport,
    now: Time,
    m: Outgoing<'_>,
    room: LinkSet,
    buf: &mut [u8],
) -> Result<Option<Transmit>, SendError> {
    a.send_framing(now, m, room, &two_links, buf, None)
}

#[test]
fn a_message_that_shares_frames_or_meets_a_queue_waits() {
    let mut p = Pair::new(64);
    let small = [1u8; 100];
    let large = [2u8; 1430];
    let now = Time::ZERO;
    let mut buf = vec![0u8; 14 + MTU];
    // Nothing waits and nothing is in flight: a small message goes alone at once, as the
    // next frame would have carried it (Nagle's rule).
    let t = framing(
        &mut p.a,
        now,
        message(&small, 0, Fences::default()),
        LinkSet::first(2),
        &mut buf,
    )
    .expect("taken")
    .expect("an idle connection's small message goes straight");
    assert_eq!((t.kind, t.messages), (TxKind::Data, 1));
    p.b.handle_frame(now, &buf[..t.len]).expect("B takes it");
    // With that frame in flight, the next waits to share a frame with what follows.
    let r = framing(
        &mut p.a,
        now,
        message(&small, 1, Fences::default()),
        LinkSet::first(2),
        &mut buf,
    );
    assert_eq!(r, Ok(None), "a small message waits to share its frame");
    let r = framing(
        &mut p.a,
        now,
        message(&large, 2, Fences::default()),
        LinkSet::first(2),
        &mut buf,
    );
    assert_eq!(
        r,
        Err(SendError::WouldBlock),
        "a large one behind its own service's queued message waits until it has gone"
    );
    let other = Outgoing {
        from: 10,
        ..message(&large, 2, Fences::default())
    };
    let r = framing(&mut p.a, now, other, LinkSet::first(2), &mut buf);
    assert_eq!(
        r,
        Ok(None),
        "another service's large one queues behind it for its fair turn"
    );
    p.exchange(now, true);
    assert_eq!(p.got, vec![small.to_vec(), small.to_vec(), large.to_vec()]);
    assert!(!p.a.may_transmit(), "nothing waits at A");
    // Nothing waits now: it goes straight; with no link to send on, it is refused.
    let r = framing(
        &mut p.a,
        now,
        message(&large, 3, Fences::default()),
        LinkSet::EMPTY,
        &mut buf,
    );
    assert_eq!(r, Err(SendError::WouldBlock));
    let t = framing(
        &mut p.a,
        now,
        message(&large, 3, Fences::default()),
        LinkSet::first(2),
        &mut buf,
    )
    .expect("taken")
    .expect("framed straight");
    assert_eq!((t.kind, t.messages), (TxKind::Data, 1));
    p.b.handle_frame(now, &buf[..t.len]).expect("B takes it");
    p.exchange(now, true);
    assert_eq!(p.got.len(), 4);
    assert_eq!(p.got[3], large.to_vec());
    // The line between large messages (straight whenever nothing waits) and small ones
    // (straight only on an idle connection): more than half of a frame's FRAME payload
    // bytes, with a message header, as aggregated.
    for (len, large) in [
        (HALF - 1, false),
        (HALF, true),
        (FRAME, true),
        (FRAME + 1, false),
    ] {
        assert_eq!(p.a.frames_straight(len, true), large, "{len} bytes");
    }
    // Each sent on an idle connection (B's delayed ACK has come back): straight, but for
    // one that needs fragments.
    let mut now = now;
    for (len, straight) in [
        (HALF - 1, true),
        (HALF, true),
        (FRAME, true),
        (FRAME + 1, false),
    ] {
        now = now + Duration::from_millis(1);
        p.timers(now);
        p.exchange(now, true);
        let data = vec![3u8; len];
        let r = framing(
            &mut p.a,
            now,
            message(&data, 4, Fences::default()),
            LinkSet::first(2),
            &mut buf,
        )
        .expect("taken");
        assert_eq!(r.is_some(), straight, "{len} bytes");
        if let Some(t) = r {
            p.b.handle_frame(now, &buf[..t.len]).expect("B takes it");
        }
        p.exchange(now, true);
        assert_eq!(p.got.last(), Some(&data));
    }
}
