//! The delivery contract across restarts and silent peers, driven by hand with a virtual
//! clock: exactly once while both ends live; across a restart, what was acknowledged was
//! delivered, the rest is reported failed, and nothing reaches the new instance that was
//! meant for the old one.

use std::collections::HashSet;
use std::time::Duration;

use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::{
    Config, FailReason, Fences, LinkSet, Outgoing, RecvError, Transport, TransportEvent,
};

const A: Coord = Coord::new(0, 0, 0);
const B: Coord = Coord::new(1, 0, 0);

fn cfg(incarnation: u64) -> Config {
    Config {
        incarnation,
        broken_after: Duration::from_millis(500),
        ..Config::default()
    }
}

fn msg(data: &[u8], tag: u64) -> Outgoing<'_> {
    Outgoing {
        dest: B,
        service: 9,
        data,
        reliable: true,
        fences: Fences::default(),
        tag,
        from: 9,
    }
}

fn one_link(_: Coord) -> LinkSet {
    LinkSet::first(1)
}

/// Frames `from` has to send now, as bytes (Ethernet header included).
fn drain(from: &mut Transport, t: Time) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 1514];
    let mut out = Vec::new();
    while let Some(tx) = from.poll_transmit(t, LinkSet::first(1), &one_link, &mut buf, None) {
        out.push(buf[..tx.len].to_vec());
    }
    out
}

/// Passes frames both ways, running timers due within a few milliseconds (delayed ACKs),
/// until quiet; returns the time reached.
fn pump(a: &mut Transport, b: &mut Transport, mut t: Time) -> Time {
    let horizon = t + Duration::from_millis(5);
    loop {
        let ab = drain(a, t);
        let ba = drain(b, t);
        let moved = !ab.is_empty() || !ba.is_empty();
        for f in ab {
            let _ = b.handle_frame(t, &f);
        }
        for f in ba {
            let _ = a.handle_frame(t, &f);
        }
        if moved {
            continue;
        }
        let next = [a.poll_timeout(), b.poll_timeout()]
            .into_iter()
            .flatten()
            .filter(|x| *x <= horizon)
            .min();
        let Some(next) = next else { return t };
        t = t.max(next);
        a.handle_timeout(t);
        b.handle_timeout(t);
    }
}

fn events(t: &mut Transport) -> Vec<TransportEvent> {
    std::iter::from_fn(|| t.poll_event()).collect()
}

fn delivered(evs: &[TransportEvent]) -> Vec<Vec<u8>> {
    evs.iter()
        .filter_map(|e| match e {
            TransportEvent::Message { data, .. } => Some(data.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_restarted_receiver_never_sees_the_old_stream_and_the_sender_learns_what_failed() {
    let t = Time::ZERO;
    let mut a = Transport::new(A, cfg(1));
    let mut b = Transport::new(B, cfg(2));
    a.notify_acks(9, true);
    // Ten messages delivered and acknowledged.
    for i in 0..10u64 {
        a.send(t, msg(&i.to_be_bytes(), i)).unwrap();
    }
    pump(&mut a, &mut b, t);
    assert_eq!(delivered(&events(&mut b)).len(), 10);
    let acked: u32 = events(&mut a)
        .iter()
        .map(|e| match e {
            TransportEvent::Acked {
                count, last_tag, ..
            } => {
                assert!(*last_tag <= 9);
                *count
            }
            _ => 0,
        })
        .sum();
    assert_eq!(acked, 10);

    // Five more go out, but B dies before it sees them.
    for i in 10..15u64 {
        a.send(t, msg(&i.to_be_bytes(), i)).unwrap();
    }
    let lost = drain(&mut a, t);
    assert!(!lost.is_empty());
    let mut b = Transport::new(B, cfg(3));
    // The old stream's frames reach the new B: refused, not taken for a new stream.
    for f in &lost {
        assert_eq!(b.handle_frame(t, f), Err(RecvError::Stale));
    }
    assert!(b.stats().stale_frames >= 1);
    // The new B's answers tell A, which reports the five as failed.
    pump(&mut a, &mut b, t);
    assert!(
        delivered(&events(&mut b)).is_empty(),
        "nothing of the old stream delivered"
    );
    let evs = events(&mut a);
    let failed: Vec<u64> = evs
        .iter()
        .flat_map(|e| match e {
            TransportEvent::Failed {
                tags, reason, peer, ..
            } => {
                assert_eq!(*peer, B);
                assert_eq!(*reason, FailReason::PeerRestarted);
                tags.clone()
            }
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(failed, (10..15).collect::<Vec<u64>>());
    assert!(evs
        .iter()
        .any(|e| matches!(e, TransportEvent::PeerReset { peer, .. } if *peer == B)));

    // Re-sending reaches the new B, once each.
    for i in 10..15u64 {
        a.send(t, msg(&i.to_be_bytes(), 100 + i)).unwrap();
    }
    pump(&mut a, &mut b, t);
    let got: HashSet<Vec<u8>> = delivered(&events(&mut b)).into_iter().collect();
    assert_eq!(got.len(), 5);
}

#[test]
fn a_restarted_sender_is_announced_and_its_old_frames_are_refused() {
    let t = Time::ZERO;
    let mut a = Transport::new(A, cfg(1));
    let mut b = Transport::new(B, cfg(2));
    b.notify_acks(9, true);
    a.send(t, msg(b"first life", 0)).unwrap();
    pump(&mut a, &mut b, t);
    assert_eq!(delivered(&events(&mut b)), [b"first life".to_vec()]);
    // B has something in flight to A when A dies.
    b.send(
        t,
        Outgoing {
            dest: A,
            ..msg(b"to the old A", 7)
        },
    )
    .unwrap();
    let old_b_frames = drain(&mut b, t);
    // A stale frame of A's old stream, still in flight.
    a.send(t, msg(b"from the old A", 1)).unwrap();
    let old_a_frames = drain(&mut a, t);

    let mut a = Transport::new(A, cfg(11));
    a.announce([B]);
    pump(&mut a, &mut b, t);
    let evs = events(&mut b);
    assert!(evs.iter().any(|e| matches!(
        e,
        TransportEvent::Failed { tags, reason: FailReason::PeerRestarted, .. } if tags == &[7]
    )));
    for f in &old_a_frames {
        assert!(b.handle_frame(t, f).is_err(), "old A's frame refused");
    }
    for f in &old_b_frames {
        assert!(a.handle_frame(t, f).is_err(), "frame for the old A refused");
    }
    assert!(delivered(&events(&mut a)).is_empty());
    assert!(delivered(&events(&mut b)).is_empty());
    // The new A talks to B at once.
    a.send(t, msg(b"second life", 0)).unwrap();
    pump(&mut a, &mut b, t);
    assert_eq!(delivered(&events(&mut b)), [b"second life".to_vec()]);
}

#[test]
fn a_silent_peer_breaks_the_connection_and_releases_it() {
    let mut t = Time::ZERO;
    let mut a = Transport::new(A, cfg(1));
    let mut b = Transport::new(B, cfg(2));
    a.send(t, msg(b"hello", 0)).unwrap();
    t = pump(&mut a, &mut b, t);
    let _ = events(&mut b);
    // B goes silent: A's frames go nowhere, its retransmissions too.
    for i in 1..=4u64 {
        a.send(t, msg(&[7; 3000], i)).unwrap();
    }
    let mut failed = Vec::new();
    let mut frames = 0;
    while t < Time::ZERO + Duration::from_secs(2) {
        frames += drain(&mut a, t).len();
        if let Some(next) = a.poll_timeout() {
            t = next.max(t + Duration::from_micros(1));
            a.handle_timeout(t);
        } else {
            break;
        }
        for e in events(&mut a) {
            if let TransportEvent::Failed { tags, reason, .. } = e {
                assert_eq!(reason, FailReason::Silent);
                failed.extend(tags);
            }
        }
        if !failed.is_empty() {
            break;
        }
    }
    assert_eq!(failed, [1, 2, 3, 4]);
    assert!(
        t >= Time::ZERO + Duration::from_millis(500) && t < Time::ZERO + Duration::from_secs(1)
    );
    assert_eq!(a.in_flight(), 0, "nothing held for the dead peer");
    assert_eq!(a.held_bytes(), 0);
    assert_eq!(a.peers(), 0);
    assert!(frames > 3, "retransmitted meanwhile, then stopped");
    assert_eq!(a.poll_timeout(), None, "no timer runs for ever");
    // B comes back to life (same instance): the new connection resets B's side, and
    // messages flow again.
    a.send(t, msg(b"again", 5)).unwrap();
    pump(&mut a, &mut b, t);
    assert_eq!(delivered(&events(&mut b)), [b"again".to_vec()]);
}

#[test]
fn an_unanswered_handshake_fails_its_messages() {
    let mut t = Time::ZERO;
    let mut a = Transport::new(A, cfg(1));
    a.send(t, msg(b"into the void", 3)).unwrap();
    let mut syncs = 0;
    loop {
        syncs += drain(&mut a, t).len();
        let Some(next) = a.poll_timeout() else { break };
        t = next;
        a.handle_timeout(t);
        let evs = events(&mut a);
        if let Some(TransportEvent::Failed { tags, reason, .. }) = evs.first() {
            assert_eq!(
                (tags.as_slice(), *reason),
                (&[3u64][..], FailReason::Silent)
            );
            break;
        }
        assert!(t < Time::ZERO + Duration::from_secs(5), "never gave up");
    }
    assert!(
        (3..=20).contains(&syncs),
        "SYNCs retried with backoff: {syncs}"
    );
}
