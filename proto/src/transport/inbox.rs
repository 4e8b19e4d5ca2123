//! What the transport has for the application, in the order it happened: delivered
//! messages and reports (acknowledged, failed, peer reset).
//!
//! Messages' bytes are copied once, from the frame they arrived in, into one arena that is
//! emptied whenever the queue is; a consumer that can read a borrowed message
//! ([`Inbox::pop_ref`]) costs no allocation per message. [`Inbox::pop`] hands out owned
//! events for consumers that keep them (one allocation each, as before the arena).

use std::collections::VecDeque;

use super::TransportEvent;
use crate::topology::Coord;
use crate::wire::MSG_HEADER_LEN;

/// One queued event: a message whose bytes are in the arena, or any other event as is.
#[derive(Debug)]
enum Entry {
    Message {
        src: Coord,
        service: u16,
        reliable: bool,
        start: usize,
        len: usize,
    },
    /// A whole aggregated payload (message headers included) whose messages were all
    /// released at once: handed out one message at a time, parsed again from the arena (the
    /// receiver checked them when the frame arrived).
    Batch {
        src: Coord,
        reliable: bool,
        start: usize,
        end: usize,
    },
    Owned(TransportEvent),
}

/// An event borrowed from the inbox: messages are slices of its arena, valid until the next
/// call on the transport. `E` is the owned event type of whoever hands it out (the engine
/// passes the transport's on with its own).
#[derive(Debug, PartialEq, Eq)]
pub enum EventRef<'a, E = TransportEvent> {
    /// A message arrived.
    Message {
        /// The server that sent it.
        src: Coord,
        /// The service it is for.
        service: u16,
        /// Its bytes.
        data: &'a [u8],
        /// Whether it came reliably (else as a short message).
        reliable: bool,
    },
    /// Any other event (and messages a placer handed back as owned bytes).
    Other(E),
}

impl<E: From<TransportEvent>> EventRef<'_, E> {
    /// The owned event (copies a borrowed message).
    pub fn into_owned(self) -> E {
        self.into_owned_with(<[u8]>::to_vec)
    }

    /// The owned event, a borrowed message's bytes copied by `copy` (into a recycled
    /// buffer, say, rather than a new allocation).
    pub fn into_owned_with(self, copy: impl FnOnce(&[u8]) -> Vec<u8>) -> E {
        match self {
            EventRef::Message {
                src,
                service,
                data,
                reliable,
            } => E::from(TransportEvent::Message {
                src,
                service,
                data: copy(data),
                reliable,
            }),
            EventRef::Other(e) => e,
        }
    }
}

/// The batch being handed out, taken off the queue: its messages come out of the arena
/// one per [`Inbox::pop_ref`] without touching the queue (a small message's whole delivery
/// costs a few dozen instructions; the queue's front went through its generic paths each
/// time).
#[derive(Debug, Clone, Copy)]
struct Cursor {
    src: Coord,
    reliable: bool,
    /// Where the next message's header is in the arena.
    at: usize,
    end: usize,
}

/// The transport's queue of events for the application.
#[derive(Debug, Default)]
pub struct Inbox {
    /// Before every entry: the rest of the batch being handed out.
    current: Option<Cursor>,
    entries: VecDeque<Entry>,
    bytes: Vec<u8>,
}

impl Inbox {
    /// Queues a message, copying its bytes.
    pub fn push_message(&mut self, src: Coord, service: u16, data: &[u8], reliable: bool) {
        if self.is_empty() {
            self.bytes.clear();
        }
        let start = self.bytes.len();
        self.bytes.extend_from_slice(data);
        self.entries.push_back(Entry::Message {
            src,
            service,
            reliable,
            start,
            len: data.len(),
        });
    }

    /// Queues every message of an aggregated payload (checked well-formed by the caller), in
    /// one copy.
    pub fn push_batch(&mut self, src: Coord, payload: &[u8], reliable: bool) {
        if self.is_empty() {
            self.bytes.clear();
        }
        let start = self.bytes.len();
        self.bytes.extend_from_slice(payload);
        self.entries.push_back(Entry::Batch {
            src,
            reliable,
            start,
            end: self.bytes.len(),
        });
    }

    /// Queues an event as it is.
    pub fn push(&mut self, e: TransportEvent) {
        self.entries.push_back(Entry::Owned(e));
    }

    /// Events waiting (a batch counts once).
    pub fn len(&self) -> usize {
        self.entries.len() + usize::from(self.current.is_some())
    }

    /// Whether no event waits.
    pub fn is_empty(&self) -> bool {
        self.current.is_none() && self.entries.is_empty()
    }

    /// The next event, owned.
    pub fn pop(&mut self) -> Option<TransportEvent> {
        self.pop_ref().map(EventRef::into_owned)
    }

    /// The service the next event concerns (a message's, an acknowledgement's or a
    /// failure's), without taking it; `None` for none or another kind of event.
    pub fn next_service(&self) -> Option<u16> {
        if let Some(c) = &self.current {
            if let Some((_, service)) = msg_header(&self.bytes[c.at..c.end]) {
                return Some(service);
            }
        }
        // Past the current batch: the first entry `pop` would take (it skips a batch with
        // no message in it).
        for e in &self.entries {
            return match e {
                Entry::Batch { start, end, .. } => match msg_header(&self.bytes[*start..*end]) {
                    Some((_, service)) => Some(service),
                    None => continue,
                },
                Entry::Message { service, .. } => Some(*service),
                Entry::Owned(
                    TransportEvent::Acked { service, .. }
                    | TransportEvent::Failed { service, .. }
                    | TransportEvent::Message { service, .. },
                ) => Some(*service),
                Entry::Owned(_) => None,
            };
        }
        None
    }

    /// The next event, borrowing a message's bytes from the arena.
    #[inline]
    pub fn pop_ref(&mut self) -> Option<EventRef<'_>> {
        // The next message of the current batch, inline: the common case, kept small so
        // that it needs no frame of its own.
        if let Some(c) = &mut self.current {
            // The receiver checked these headers when the frame arrived; read the two
            // fields directly rather than through the checking iterator again.
            if let Some((len, service)) = msg_header(&self.bytes[c.at..c.end]) {
                let data = c.at + MSG_HEADER_LEN;
                c.at = data + len;
                let (src, reliable) = (c.src, c.reliable);
                if c.at >= c.end {
                    self.current = None;
                }
                return Some(EventRef::Message {
                    src,
                    service,
                    data: &self.bytes[data..data + len],
                    reliable,
                });
            }
        }
        self.pop_entry()
    }

    /// [`Inbox::pop_ref`] past the current batch: the next entry of the queue.
    #[inline(never)]
    fn pop_entry(&mut self) -> Option<EventRef<'_>> {
        self.current = None;
        loop {
            let Some(front) = self.entries.pop_front() else {
                // Nothing refers to the arena any more: reuse it from the start.
                self.bytes.clear();
                return None;
            };
            return Some(match front {
                Entry::Batch {
                    src,
                    reliable,
                    start,
                    end,
                } => {
                    // Its first message, if it has one (the receiver checked that it does).
                    let Some((len, service)) = msg_header(&self.bytes[start..end]) else {
                        continue;
                    };
                    let data = start + MSG_HEADER_LEN;
                    if data + len < end {
                        self.current = Some(Cursor {
                            src,
                            reliable,
                            at: data + len,
                            end,
                        });
                    }
                    EventRef::Message {
                        src,
                        service,
                        data: &self.bytes[data..data + len],
                        reliable,
                    }
                }
                Entry::Message {
                    src,
                    service,
                    reliable,
                    start,
                    len,
                } => EventRef::Message {
                    src,
                    service,
                    data: &self.bytes[start..start + len],
                    reliable,
                },
                Entry::Owned(e) => EventRef::Other(e),
            });
        }
    }
}

/// Length and service of the message at the start of `b`, if it is all there.
fn msg_header(b: &[u8]) -> Option<(usize, u16)> {
    let h = b.get(..MSG_HEADER_LEN)?;
    let len = usize::from(u16::from_be_bytes([h[0], h[1]]));
    let service = u16::from_be_bytes([h[2], h[3]]);
    (b.len() >= MSG_HEADER_LEN + len).then_some((len, service))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::FailReason;

    #[test]
    fn events_come_out_in_order_and_the_arena_is_reused() {
        let mut q = Inbox::default();
        let a = Coord::new(1, 0, 0);
        q.push_message(a, 7, b"one", true);
        q.push(TransportEvent::PeerReset {
            peer: a,
            reason: FailReason::PeerRestarted,
        });
        q.push_message(a, 8, b"two", false);
        assert_eq!(q.len(), 3);
        assert_eq!(
            q.pop_ref(),
            Some(EventRef::Message {
                src: a,
                service: 7,
                data: b"one",
                reliable: true
            })
        );
        assert!(matches!(q.pop(), Some(TransportEvent::PeerReset { .. })));
        assert_eq!(
            q.pop(),
            Some(TransportEvent::Message {
                src: a,
                service: 8,
                data: b"two".to_vec(),
                reliable: false
            })
        );
        assert_eq!(q.pop_ref(), None);
        let cap = q.bytes.capacity();
        for _ in 0..100 {
            q.push_message(a, 1, b"again", true);
            assert!(q.pop_ref().is_some());
            assert!(q.pop_ref().is_none());
        }
        assert_eq!(
            q.bytes.capacity(),
            cap,
            "the arena does not grow when drained"
        );
    }

    #[test]
    fn a_batch_hands_out_its_messages_one_by_one_in_order() {
        let mut q = Inbox::default();
        let a = Coord::new(0, 1, 0);
        let mut payload = vec![0u8; 64];
        let mut w = crate::wire::MessageWriter::new(&mut payload);
        assert!(w.push(3, 0, b"first"));
        assert!(w.push(4, 0, b""));
        assert!(w.push(5, 0, b"third"));
        let n = w.len();
        q.push_message(a, 9, b"before", true);
        q.push_batch(a, &payload[..n], true);
        q.push_message(a, 9, b"after", false);
        let got: Vec<(u16, Vec<u8>)> = std::iter::from_fn(|| q.pop())
            .map(|e| match e {
                TransportEvent::Message { service, data, .. } => (service, data),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            [
                (9, b"before".to_vec()),
                (3, b"first".to_vec()),
                (4, vec![]),
                (5, b"third".to_vec()),
                (9, b"after".to_vec())
            ]
        );
    }

    /// Events queued while a batch is partly handed out come after the rest of it, and the
    /// arena is not reused while the batch still reads from it.
    #[test]
    fn a_batch_partly_handed_out_stays_first() {
        let mut q = Inbox::default();
        let a = Coord::new(2, 0, 0);
        let mut payload = vec![0u8; 64];
        let mut w = crate::wire::MessageWriter::new(&mut payload);
        assert!(w.push(1, 0, b"a"));
        assert!(w.push(2, 0, b"bb"));
        assert!(w.push(3, 0, b"ccc"));
        let n = w.len();
        q.push_batch(a, &payload[..n], true);
        assert_eq!(q.len(), 1);
        let first = q.pop();
        assert!(matches!(
            first,
            Some(TransportEvent::Message { service: 1, .. })
        ));
        assert!(!q.is_empty());
        q.push_message(a, 9, b"later", true);
        assert_eq!(q.len(), 2);
        let rest: Vec<(u16, Vec<u8>)> = std::iter::from_fn(|| q.pop())
            .map(|e| match e {
                TransportEvent::Message { service, data, .. } => (service, data),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            rest,
            [
                (2, b"bb".to_vec()),
                (3, b"ccc".to_vec()),
                (9, b"later".to_vec())
            ]
        );
        assert!(q.is_empty());
    }
}
