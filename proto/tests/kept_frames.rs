//! Frames the driver keeps: a driver that offers its buffers (`poll_transmit`) gets
//! reliable frames kept where they were built instead of copied, reads them back for every
//! retransmission, and gets every buffer back once its frame is acknowledged or its
//! connection ends. Driven by hand over a link that loses frames, with a virtual clock.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::{
    Config, FailReason, Fences, Keep, KeptFrames, LinkSet, Outgoing, Transport, TransportEvent,
    TxKind,
};

const A: Coord = Coord::new(0, 0, 0);
const B: Coord = Coord::new(1, 0, 0);
const MTU: usize = 1500;

fn one_link(_: Coord) -> LinkSet {
    LinkSet::first(1)
}

/// The driver's buffers the transport keeps, by handle, as they were when it kept them.
#[derive(Default)]
struct Store {
    kept: RefCell<HashMap<u32, Vec<u8>>>,
    reads: RefCell<u32>,
}

impl KeptFrames for Store {
    fn copy_kept(&self, handle: u32, offset: usize, to: &mut [u8]) -> bool {
        let kept = self.kept.borrow();
        let Some(b) = kept.get(&handle) else {
            return false;
        };
        let Some(from) = b.get(offset..offset + to.len()) else {
            return false;
        };
        to.copy_from_slice(from);
        *self.reads.borrow_mut() += 1;
        true
    }
}

/// A sends to B with kept frames; every `lose`-th frame from A is lost on its way (the
/// first transmission only, and never a retransmission, so the test ends).
struct Run {
    a: Transport,
    b: Transport,
    store: Store,
    next_handle: u32,
    released: Vec<u32>,
    sent_frames: u32,
    lost: u32,
    retransmitted: u32,
    now: Time,
}

impl Run {
    fn new() -> Run {
        let cfg = Config {
            mtu: MTU,
            ..Config::default()
        };
        let mut r = Run {
            a: Transport::new(A, cfg),
            b: Transport::new(B, cfg),
            store: Store::default(),
            next_handle: 0,
            released: Vec::new(),
            sent_frames: 0,
            lost: 0,
            retransmitted: 0,
            now: Time::ZERO,
        };
        r.a.connect(Time::ZERO, B).expect("connect");
        r.pump(0);
        assert!(r.a.is_established(B) && r.b.is_established(A));
        r
    }

    /// Moves frames both ways until neither side sends; frames from A are lost every
    /// `lose` (0: none).
    fn pump(&mut self, lose: u32) {
        let mut buf = vec![0u8; MTU + 14];
        loop {
            let mut moved = false;
            loop {
                // A fresh buffer each time, scribbled over: what the transport keeps must
                // come from the store, never from a buffer it was handed earlier.
                buf.fill(0xa5);
                let handle = self.next_handle;
                let keep = Keep {
                    handle: Some(handle),
                    frames: &self.store,
                };
                let Some(tx) = self.a.poll_transmit(
                    self.now,
                    LinkSet::first(1),
                    &one_link,
                    &mut buf,
                    Some(keep),
                ) else {
                    break;
                };
                moved = true;
                if tx.kept {
                    assert_eq!(tx.kind, TxKind::Data);
                    self.store
                        .kept
                        .borrow_mut()
                        .insert(handle, buf[..tx.len].to_vec());
                    self.next_handle += 1;
                }
                if tx.kind == TxKind::Retransmit {
                    self.retransmitted += 1;
                }
                self.sent_frames += 1;
                let lost =
                    lose > 0 && tx.kind == TxKind::Data && self.sent_frames.is_multiple_of(lose);
                if lost {
                    self.lost += 1;
                } else {
                    let _ = self.b.handle_frame(self.now, &buf[..tx.len]);
                }
            }
            while let Some(tx) =
                self.b
                    .poll_transmit(self.now, LinkSet::first(1), &one_link, &mut buf, None)
            {
                let _ = self.a.handle_frame(self.now, &buf[..tx.len]);
                moved = true;
            }
            self.a.take_released(&mut self.released);
            for h in self.released.drain(..) {
                assert!(
                    self.store.kept.borrow_mut().remove(&h).is_some(),
                    "released twice or never kept: {h}"
                );
            }
            if !moved {
                return;
            }
        }
    }

    /// Advances the clock by `d`, firing both sides' timers.
    fn tick(&mut self, d: Duration) {
        self.now = self.now + d;
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
    }
}

fn msg(data: &[u8]) -> Outgoing<'_> {
    Outgoing {
        dest: B,
        service: 3,
        data,
        reliable: true,
        fences: Fences::default(),
        tag: 0,
        from: 3,
    }
}

/// Messages of a few sizes (aggregated, whole, fragmented), every seventh frame lost: all
/// arrive intact, the lost ones repaired from the kept frames, and every kept
/// buffer comes back once acknowledged.
#[test]
fn kept_frames_are_resent_from_the_driver_and_all_released() {
    let mut r = Run::new();
    let mut want = Vec::new();
    for i in 0..400u32 {
        let len = [40usize, 700, 1400, 5000][i as usize % 4];
        let data: Vec<u8> = (0..len).map(|k| (k as u32 * 31 + i) as u8).collect();
        r.a.send(r.now, msg(&data)).expect("send");
        want.push(data);
        if i % 16 == 15 {
            r.pump(7);
        }
    }
    let mut got = Vec::new();
    for _ in 0..2000 {
        r.pump(7);
        got.extend(
            std::iter::from_fn(|| r.b.poll_event()).filter_map(|e| match e {
                TransportEvent::Message { data, .. } => Some(data),
                _ => None,
            }),
        );
        if got.len() == want.len() && r.store.kept.borrow().is_empty() {
            break;
        }
        r.tick(Duration::from_millis(1));
    }
    assert!(r.lost > 10, "frames were lost: {}", r.lost);
    assert!(
        r.retransmitted >= r.lost,
        "{} lost, {} resent",
        r.lost,
        r.retransmitted
    );
    assert!(*r.store.reads.borrow() >= r.lost, "resent from the store");
    assert_eq!(got.len(), want.len());
    // Messages without fences may overtake each other (a lost fragment delays its message
    // only): the same messages, each intact.
    got.sort();
    want.sort();
    assert!(got == want, "delivered messages differ");
    assert!(
        r.store.kept.borrow().is_empty(),
        "{} buffers never released",
        r.store.kept.borrow().len()
    );
}

/// A connection that ends gives back every buffer it kept.
#[test]
fn an_aborted_connection_releases_its_kept_frames() {
    let mut r = Run::new();
    for _ in 0..20 {
        r.a.send(r.now, msg(&[7u8; 1400])).expect("send");
    }
    // Every frame from A lost: nothing is acknowledged, all stay kept.
    r.pump(1);
    let kept = r.store.kept.borrow().len();
    assert!(kept >= 20, "{kept} kept");
    r.a.abort(B, FailReason::Unreachable);
    r.pump(1);
    assert!(r.store.kept.borrow().is_empty());
}

/// A driver that offers no handle gets the copying behaviour: nothing is kept.
#[test]
fn without_a_handle_the_transport_keeps_its_own_copy() {
    let mut r = Run::new();
    r.a.send(r.now, msg(&[1u8; 100])).expect("send");
    let mut buf = vec![0u8; MTU + 14];
    let keep = Keep {
        handle: None,
        frames: &r.store,
    };
    let tx =
        r.a.poll_transmit(r.now, LinkSet::first(1), &one_link, &mut buf, Some(keep))
            .expect("a frame");
    assert_eq!(tx.kind, TxKind::Data);
    assert!(!tx.kept);
}
