//! The transport's API contract: bounded queues, refusals, bad frames, fair queuing and the
//! aggregation deadline, each driven by hand with a virtual clock.

use std::time::Duration;

use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::{
    Config, Fences, LinkSet, Outgoing, Placer, RecvError, SendError, Transport, TransportEvent,
    TxKind,
};
use torusnet_proto::wire::{self, Dest, FrameView, Header, Kind, HEADERS_LEN};

const A: Coord = Coord::new(0, 0, 0);
const B: Coord = Coord::new(1, 0, 0);

fn msg(data: &[u8], service: u16) -> Outgoing<'_> {
    Outgoing {
        dest: B,
        service,
        data,
        reliable: true,
        fences: Fences::default(),
        tag: 0,
        from: service,
    }
}

fn one_link(_: Coord) -> LinkSet {
    LinkSet::first(1)
}

/// Passes frames both ways over one lossless link until neither side has anything to send;
/// returns the frames that went from `a` to `b`.
fn pump(a: &mut Transport, b: &mut Transport, t: Time) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 1514];
    let mut out = Vec::new();
    loop {
        let mut moved = false;
        while let Some(tx) = a.poll_transmit(t, LinkSet::first(1), &one_link, &mut buf, None) {
            let _ = b.handle_frame(t, &buf[..tx.len]);
            out.push(buf[..tx.len].to_vec());
            moved = true;
        }
        while let Some(tx) = b.poll_transmit(t, LinkSet::first(1), &one_link, &mut buf, None) {
            let _ = a.handle_frame(t, &buf[..tx.len]);
            moved = true;
        }
        if !moved {
            return out;
        }
    }
}

/// Two transports with an established connection between them.
fn pair(cfg: Config) -> (Transport, Transport) {
    let mut a = Transport::new(A, cfg);
    let mut b = Transport::new(B, cfg);
    a.connect(Time::ZERO, B).unwrap();
    pump(&mut a, &mut b, Time::ZERO);
    assert!(a.is_established(B) && b.is_established(A));
    // Timer entries the handshake left behind fire (and find nothing to do).
    a.handle_timeout(Time::ZERO);
    b.handle_timeout(Time::ZERO);
    (a, b)
}

#[test]
fn queue_is_bounded_and_refusals_take_nothing() {
    let (mut a, mut b) = pair(Config {
        queue_bytes: 1000,
        ..Config::default()
    });
    let t = Time::ZERO;
    let mut sent = 0;
    while a.send(t, msg(&[1; 100], 1)).is_ok() {
        sent += 1;
    }
    // Each message counts with its 6-byte header: 9 x 106 bytes fit in 1000.
    assert_eq!(sent, 9);
    assert_eq!(a.send(t, msg(&[1; 100], 1)), Err(SendError::WouldBlock));
    assert_eq!(a.queued_messages(), 9);
    // Another service has its own queue.
    assert!(a.send(t, msg(&[1; 100], 2)).is_ok());
    let short = Outgoing {
        reliable: false,
        ..msg(&[0; 1500], 3)
    };
    assert!(matches!(a.send(t, short), Err(SendError::TooLarge { .. })));
    let to_self = Outgoing {
        dest: A,
        ..msg(b"x", 1)
    };
    assert_eq!(a.send(t, to_self), Err(SendError::ToSelf));
    // Draining the queue makes room again.
    pump(&mut a, &mut b, t);
    assert!(a.send(t, msg(&[1; 100], 1)).is_ok());
}

#[test]
fn bad_frames_are_refused_and_the_transport_keeps_serving() {
    let (mut a, mut b) = pair(Config::default());
    let t = Time::ZERO;
    let mut garbage = vec![0u8; 200];
    garbage[12..14].copy_from_slice(&wire::ETHERTYPE_DATA.to_be_bytes());
    assert!(matches!(
        b.handle_frame(t, &garbage),
        Err(RecvError::Wire(_))
    ));
    assert!(matches!(
        b.handle_frame(t, &garbage[..20]),
        Err(RecvError::Wire(_))
    ));

    let mut frame = vec![0u8; HEADERS_LEN];
    let h = Header::new(Kind::Data, A, Dest::Server(Coord::new(5, 5, 5)));
    h.emit(&mut frame).unwrap();
    assert_eq!(b.handle_frame(t, &frame), Err(RecvError::NotForUs));
    let h = Header::new(Kind::Data, B, Dest::Server(B));
    h.emit(&mut frame).unwrap();
    assert_eq!(b.handle_frame(t, &frame), Err(RecvError::FromSelf));
    let mut h = Header::new(Kind::Data, A, Dest::Server(B));
    h.flags = wire::flags::RELIABLE;
    h.seq = 1 << 30;
    h.emit(&mut frame).unwrap();
    assert_eq!(
        b.handle_frame(t, &frame),
        Err(RecvError::Stale),
        "no connection ids: not of this connection"
    );
    let (cid, peer) = a.connection_ids(B).unwrap();
    h.conn = cid;
    h.peer_conn = peer.unwrap();
    h.emit(&mut frame).unwrap();
    assert_eq!(b.handle_frame(t, &frame), Err(RecvError::OutOfWindow));
    // An aggregated frame with a broken message is refused whole.
    let mut agg = vec![0u8; HEADERS_LEN + 10];
    let mut h = Header::new(Kind::Data, A, Dest::Server(B));
    h.flags = wire::flags::RELIABLE | wire::flags::AGGREGATED;
    h.payload_len = 10;
    h.emit(&mut agg).unwrap();
    agg[HEADERS_LEN..HEADERS_LEN + 2].copy_from_slice(&100u16.to_be_bytes());
    assert!(matches!(b.handle_frame(t, &agg), Err(RecvError::Wire(_))));
    assert_eq!(b.stats().dropped_frames, 7);

    // After all that, a real message still gets through.
    a.send(t, msg(b"still here", 4)).unwrap();
    pump(&mut a, &mut b, t);
    assert_eq!(
        b.poll_event(),
        Some(TransportEvent::Message {
            src: A,
            service: 4,
            data: b"still here".to_vec(),
            reliable: true
        })
    );
}

#[test]
fn services_share_a_link_fairly_by_weight() {
    let (mut a, _b) = pair(Config::default());
    a.configure_service(2, 3, 1 << 20);
    let t = Time::ZERO;
    for _ in 0..200 {
        a.send(t, msg(&[1; 1400], 1)).unwrap();
        a.send(t, msg(&[2; 1400], 2)).unwrap();
    }
    let mut buf = vec![0u8; 1514];
    let mut per = [0u32; 3];
    for _ in 0..80 {
        let tx = a
            .poll_transmit(t, LinkSet::first(1), &one_link, &mut buf, None)
            .unwrap();
        let v = FrameView::new_checked(&buf[..tx.len]).unwrap();
        // Each frame carries one 1400-byte message of one service (alone, so plain: two
        // do not fit a frame).
        let h = Header::parse(&v).unwrap();
        assert!(!h.has(wire::flags::AGGREGATED));
        let svc = h.service;
        per[usize::from(svc)] += 1;
    }
    assert_eq!((per[1], per[2]), (20, 60), "weight 1 : 3");
}

#[test]
fn aggregation_deadline_holds_partial_frames() {
    let cfg = Config {
        agg_delay: Duration::from_micros(50),
        ..Config::default()
    };
    let (mut a, _b) = pair(cfg);
    let t0 = Time::ZERO;
    a.send(t0, msg(&[7; 64], 1)).unwrap();
    let mut buf = vec![0u8; 1514];
    assert!(a
        .poll_transmit(t0, LinkSet::first(1), &one_link, &mut buf, None)
        .is_none());
    assert_eq!(a.poll_timeout(), Some(t0 + Duration::from_micros(50)));
    let t1 = t0 + Duration::from_micros(10);
    for _ in 0..5 {
        a.send(t1, msg(&[7; 64], 1)).unwrap();
    }
    assert!(a
        .poll_transmit(t1, LinkSet::first(1), &one_link, &mut buf, None)
        .is_none());
    let t2 = t0 + Duration::from_micros(50);
    a.handle_timeout(t2);
    let tx = a
        .poll_transmit(t2, LinkSet::first(1), &one_link, &mut buf, None)
        .unwrap();
    assert_eq!((tx.kind, tx.messages), (TxKind::Data, 6));
    // A full frame goes at once, deadline or not.
    for _ in 0..30 {
        a.send(t2, msg(&[7; 64], 1)).unwrap();
    }
    let tx = a
        .poll_transmit(t2, LinkSet::first(1), &one_link, &mut buf, None)
        .unwrap();
    assert_eq!(
        tx.messages, 20,
        "1430 payload bytes hold 20 messages of 6 + 64"
    );
}

#[test]
fn unreachable_peer_holds_its_messages_only() {
    let (mut a, _b) = pair(Config::default());
    let c = Coord::new(0, 1, 0);
    let t = Time::ZERO;
    a.send(
        t,
        Outgoing {
            dest: c,
            ..msg(b"to c", 1)
        },
    )
    .unwrap();
    a.send(t, msg(b"to b", 2)).unwrap();
    let paths = |p: Coord| {
        if p == B {
            LinkSet::first(1)
        } else {
            LinkSet::EMPTY
        }
    };
    let mut buf = vec![0u8; 1514];
    let tx = a
        .poll_transmit(t, LinkSet::first(1), &paths, &mut buf, None)
        .unwrap();
    let v = FrameView::new_checked(&buf[..tx.len]).unwrap();
    assert_eq!(v.dst(), Dest::Server(B));
    assert!(a
        .poll_transmit(t, LinkSet::first(1), &paths, &mut buf, None)
        .is_none());
    assert_eq!(a.queued_messages(), 1);
}

/// Records what it is handed; answers even first bytes with a message of its own and odd
/// ones with nothing.
struct LogPlacer(std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>);

impl Placer for LogPlacer {
    fn place(&mut self, _now: Time, _src: Coord, data: &[u8]) -> Option<Vec<u8>> {
        if let Ok(mut seen) = self.0.lock() {
            seen.push(data.to_vec());
        }
        let first = *data.first()?;
        (first % 2 == 0).then(|| vec![b'p', first])
    }
}

fn messages(t: &mut Transport) -> Vec<(u16, Vec<u8>)> {
    std::iter::from_fn(|| t.poll_event())
        .filter_map(|e| match e {
            TransportEvent::Message { service, data, .. } => Some((service, data)),
            _ => None,
        })
        .collect()
}

/// A service's placer takes its messages straight from their frames, in delivery order, and
/// what it returns (if anything) is delivered instead; other services' messages in the same
/// frame come through the inbox; a message a fence holds is placed only when the fence lets
/// it go.
#[test]
fn placers_take_their_messages_in_delivery_order() {
    let (mut a, mut b) = pair(Config::default());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    b.set_placer(5, Box::new(LogPlacer(seen.clone())));
    let t = Time::ZERO;
    // One sending service, messages for two: they share a frame.
    for (service, data) in [(5u16, [0u8]), (6, [b'x']), (5, [1]), (5, [2])] {
        let m = Outgoing {
            from: 1,
            ..msg(&data, service)
        };
        a.send(t, m).unwrap();
    }
    let frames = pump(&mut a, &mut b, t);
    assert_eq!(frames.len(), 1, "one aggregated frame");
    assert_eq!(
        messages(&mut b),
        [
            (5, b"p\x00".to_vec()),
            (6, b"x".to_vec()),
            (5, b"p\x02".to_vec())
        ]
    );
    assert_eq!(*seen.lock().unwrap(), [vec![0], vec![1], vec![2]]);

    // A backward-fenced message for the placer overtakes the message before it: held, and
    // placed once that one has been delivered.
    seen.lock().unwrap().clear();
    let mut buf = vec![0u8; 1514];
    a.send(t, msg(b"first", 6)).unwrap();
    let f1 = a
        .poll_transmit(t, LinkSet::first(1), &one_link, &mut buf, None)
        .map(|tx| buf[..tx.len].to_vec())
        .unwrap();
    let fenced = Outgoing {
        fences: Fences {
            backward: true,
            forward: false,
        },
        ..msg(&[4], 5)
    };
    a.send(t, fenced).unwrap();
    let f2 = a
        .poll_transmit(t, LinkSet::first(1), &one_link, &mut buf, None)
        .map(|tx| buf[..tx.len].to_vec())
        .unwrap();
    b.handle_frame(t, &f2).unwrap();
    assert!(seen.lock().unwrap().is_empty(), "held by its fence");
    assert!(messages(&mut b).is_empty());
    b.handle_frame(t, &f1).unwrap();
    assert_eq!(
        messages(&mut b),
        [(6, b"first".to_vec()), (5, b"p\x04".to_vec())]
    );
    assert_eq!(*seen.lock().unwrap(), [vec![4]]);
}

/// A reliable message for a service the receiver does not host is not delivered there: the
/// receiver's transport names it to the sender's, which reports it failed (`NoService`) with
/// its tag to the service that sent it, whether it was aggregated with messages that were
/// delivered or fragmented over frames.
#[test]
fn messages_for_services_nobody_hosts_are_reported_to_their_senders() {
    use std::sync::Arc;
    use torusnet_proto::transport::{FailReason, HostedServices};
    let (mut a, mut b) = pair(Config::default());
    let hosted = Arc::new(HostedServices::new());
    hosted.host(5);
    b.set_hosted(Some(hosted.clone()));
    let t = Time::ZERO;
    let send = |a: &mut Transport, from: u16, service: u16, data: &[u8], tag: u64| {
        let m = Outgoing {
            from,
            tag,
            ..msg(data, service)
        };
        a.send(t, m).unwrap();
    };
    for (service, data, tag) in [
        (5u16, b"a", 10u64),
        (9, b"b", 11),
        (9, b"c", 12),
        (5, b"d", 13),
    ] {
        send(&mut a, 1, service, data, tag);
    }
    send(&mut a, 2, 9, &[7u8; 4000], 20);
    pump(&mut a, &mut b, t);
    assert_eq!(
        messages(&mut b),
        [(5, b"a".to_vec()), (5, b"d".to_vec())],
        "only the hosted service's messages are delivered"
    );
    assert_eq!(b.stats().refused_no_service, 3);
    let failed: Vec<(u16, Vec<u64>, FailReason)> = std::iter::from_fn(|| a.poll_event())
        .filter_map(|e| match e {
            TransportEvent::Failed {
                peer,
                service,
                tags,
                reason,
            } => {
                assert_eq!(peer, B);
                Some((service, tags, reason))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        failed,
        [
            (1, vec![11, 12], FailReason::NoService),
            (2, vec![20], FailReason::NoService)
        ]
    );
    assert_eq!(
        (a.stats().refused_by_peers, a.stats().notices_unmatched),
        (3, 0)
    );

    // Once the service is there, its messages are delivered and nothing fails.
    hosted.host(9);
    send(&mut a, 1, 9, b"e", 14);
    pump(&mut a, &mut b, t);
    assert_eq!(messages(&mut b), [(9, b"e".to_vec())]);
    assert!(
        std::iter::from_fn(|| a.poll_event()).all(|e| !matches!(e, TransportEvent::Failed { .. }))
    );

    // A service that has fallen behind (its queue full) refuses what comes meanwhile, with
    // its own reason, in the same frame as a message for a service nobody hosts; once it
    // has room again it takes messages.
    hosted.set_full(9, true);
    send(&mut a, 3, 9, b"f", 30);
    send(&mut a, 3, 8, b"g", 31);
    send(&mut a, 3, 5, b"h", 32);
    pump(&mut a, &mut b, t);
    assert_eq!(messages(&mut b), [(5, b"h".to_vec())]);
    assert_eq!(
        (b.stats().refused_full, b.stats().refused_no_service),
        (1, 4)
    );
    let mut failed: Vec<(Vec<u64>, FailReason)> = std::iter::from_fn(|| a.poll_event())
        .filter_map(|e| match e {
            TransportEvent::Failed { tags, reason, .. } => Some((tags, reason)),
            _ => None,
        })
        .collect();
    failed.sort_by_key(|f| f.0.clone());
    assert_eq!(
        failed,
        [
            (vec![30], FailReason::ReceiverFull),
            (vec![31], FailReason::NoService)
        ]
    );
    hosted.set_full(9, false);
    send(&mut a, 3, 9, b"i", 33);
    pump(&mut a, &mut b, t);
    assert_eq!(messages(&mut b), [(9, b"i".to_vec())]);
}

#[test]
fn a_small_message_does_not_wait_for_a_bulk_flows_congestion_window() {
    let mut cfg = Config::default();
    cfg.congestion.on = true;
    let (mut a, _b) = pair(cfg);
    let t = Time::ZERO;
    for _ in 0..20 {
        a.send(t, msg(&[1; 1400], 1)).unwrap();
    }
    let mut buf = vec![0u8; 1514];
    let mut bulk = 0;
    while a
        .poll_transmit(t, LinkSet::first(1), &one_link, &mut buf, None)
        .is_some()
    {
        bulk += 1;
    }
    assert_eq!(
        bulk, cfg.congestion.initial_window,
        "the window opens at its start"
    );
    // A request from another service goes now, past the full congestion window; the bulk
    // flow's next frame still waits for an acknowledgement.
    a.send(t, msg(&[2; 64], 2)).unwrap();
    let tx = a
        .poll_transmit(t, LinkSet::first(1), &one_link, &mut buf, None)
        .expect("the small message is framed");
    let v = FrameView::new_checked(&buf[..tx.len]).unwrap();
    assert_eq!(Header::parse(&v).unwrap().service, 2);
    assert!(a
        .poll_transmit(t, LinkSet::first(1), &one_link, &mut buf, None)
        .is_none());
}
