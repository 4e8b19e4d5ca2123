//! Applications on the path (CamCube's per-hop services): frames of an intercepting
//! application's service that pass through this server are held by the pollers' engines
//! (`Verdict::Hold`), shown to the application in its channel, and put back on their way
//! (as they were, or with the payload the application gave) or dropped by its verdict. A
//! frame without a verdict by its deadline goes on as it was; so do the frames held for an
//! application that detaches or whose channel has no room for them.

use std::time::Duration;

use torusnet_client::channel::{cflag, cq, verdict, Cqe, Sqe, APP_HEADER};
use torusnet_proto::service::Engine;
use torusnet_proto::time::Time;
use torusnet_proto::wire::{self, Dest, FrameView, Header, HEADERS_LEN};

use super::{pack, AppsHost};

/// How long a held frame waits for its application's verdict.
pub const DEADLINE: Duration = Duration::from_millis(20);
/// Frames one application may hold at once; beyond, they go on unchanged.
const MAX_HELD: usize = 4096;
/// Held frames taken from the pollers per turn.
const BATCH: usize = 1024;

/// A frame held for an application.
pub(super) struct Held {
    frame: Vec<u8>,
    deadline: Time,
}

impl AppsHost {
    /// Takes the frames the pollers held and shows each to its application; returns how
    /// many.
    pub(super) fn take_intercepted(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        let mut n = 0;
        while n < BATCH {
            let Some(frame) = self.shared.apps.intercepted.pop() else {
                break;
            };
            n += 1;
            let parsed = FrameView::new_checked(&frame)
                .ok()
                .and_then(|v| Header::parse(&v).ok());
            let Some(h) = parsed else {
                continue;
            };
            let app = self.owner_of(h.service);
            match app {
                Some(i) if self.apps[i].held.len() < MAX_HELD => self.show(i, now, &h, frame),
                _ => {
                    if !node.resume_on_path(now, frame) {
                        if let Some(i) = app {
                            bump(&self.apps[i].info.counters.on_path_lost);
                        }
                    }
                }
            }
        }
        n
    }

    /// Holds `frame` for application `i` and tells it.
    fn show(&mut self, i: usize, now: Time, h: &Header, frame: Vec<u8>) {
        let a = &mut self.apps[i];
        a.next_held += 1;
        let id = a.next_held;
        let key = match h.dst {
            Dest::Key(k) => Some(k),
            Dest::Server(_) => None,
        };
        // The payload is an application's message: its sending service and kind first
        // (the app header), then its bytes, which the application sees.
        let end = (HEADERS_LEN + usize::from(h.payload_len)).min(frame.len());
        let payload = frame.get(HEADERS_LEN..end).unwrap_or(&[]);
        let (src_service, body) = match payload.get(..APP_HEADER) {
            Some(ah) => (
                u16::from_be_bytes([ah[0], ah[1]]),
                payload[APP_HEADER..].to_vec(),
            ),
            None => (h.service, Vec::new()),
        };
        a.held.insert(
            id,
            Held {
                frame,
                deadline: now + DEADLINE,
            },
        );
        bump(&a.info.counters.on_path_seen);
        let e = Cqe {
            kind: cq::INTERCEPTED,
            flags: if key.is_some() { cflag::KEYED } else { 0 },
            src_service,
            dst_service: h.service,
            peer: pack(h.src),
            tag: id,
            count: key.unwrap_or(0),
            ..Cqe::default()
        };
        self.enqueue(i, e, &body);
    }

    /// Application `i`'s verdict on a frame it was shown (`data`: a new payload, when it
    /// changes the frame).
    pub(super) fn verdict(
        &mut self,
        i: usize,
        now: Time,
        node: &mut dyn Engine,
        e: &Sqe,
        data: &[u8],
    ) {
        let Some(held) = self.apps[i].held.remove(&e.tag) else {
            // Not held (any more): its deadline passed, or a guessed id.
            return;
        };
        let frame = match e.kind {
            verdict::PASS => Some(held.frame),
            verdict::CHANGE => match changed(&held.frame, data) {
                Some(f) => Some(f),
                None => {
                    // A payload no frame can carry: the frame goes on as it was.
                    self.count_bad(i);
                    Some(held.frame)
                }
            },
            verdict::DROP => {
                bump(&self.apps[i].info.counters.on_path_dropped);
                None
            }
            _ => {
                self.count_bad(i);
                Some(held.frame)
            }
        };
        if let Some(f) = frame {
            if !node.resume_on_path(now, f) {
                bump(&self.apps[i].info.counters.on_path_lost);
            }
        }
    }

    /// Frames whose deadline passed go on as they were; with `all`, every frame
    /// application `i` holds (it is leaving).
    pub(super) fn expire_held(&mut self, i: usize, now: Time, node: &mut dyn Engine, all: bool) {
        if self.apps[i].held.is_empty() {
            return;
        }
        let due: Vec<u64> = self.apps[i]
            .held
            .iter()
            .filter(|(_, h)| all || h.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            if let Some(h) = self.apps[i].held.remove(&id) {
                bump(&self.apps[i].info.counters.on_path_expired);
                if !node.resume_on_path(now, h.frame) {
                    bump(&self.apps[i].info.counters.on_path_lost);
                }
            }
        }
    }

    /// The earliest deadline of a held frame.
    pub(super) fn held_deadline(&self) -> Option<Time> {
        self.apps
            .iter()
            .flat_map(|a| a.held.values().map(|h| h.deadline))
            .min()
    }
}

/// `frame` with the application's bytes replaced by `data` (its app header kept).
fn changed(frame: &[u8], data: &[u8]) -> Option<Vec<u8>> {
    let ah = frame.get(HEADERS_LEN..HEADERS_LEN + APP_HEADER)?;
    let mut payload = Vec::with_capacity(APP_HEADER + data.len());
    payload.extend_from_slice(ah);
    payload.extend_from_slice(data);
    wire::with_payload(frame, &payload)
}

/// One more on a counter only the host writes.
fn bump(c: &std::sync::atomic::AtomicU64) {
    super::bump(c, 1);
}
