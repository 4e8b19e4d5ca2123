//! What a connection has sent and the peer has not acknowledged yet, message by message, so
//! that every reliable message a service handed to the transport ends in exactly one report
//! to it: acknowledged, or failed (the peer restarted, reset the connection, fell silent, or
//! became unreachable).
//!
//! Messages of one service to one peer leave their service queue in the order they were sent
//! and are acknowledged in frame order, so both reports come in send order per (service,
//! peer), and an acknowledgement can be a count.

use std::collections::VecDeque;

/// A message framed whole (its last fragment is on the wire) and not yet acknowledged.
#[derive(Debug, Clone, Copy)]
struct Sent {
    tag: u64,
    service: u16,
    /// Sequence number of the frame that carries its last byte.
    last_seq: u64,
}

/// Messages acknowledged by one ACK, for one service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckedRun {
    /// The service that sent them.
    pub service: u16,
    /// How many.
    pub count: u32,
    /// The tag of the last one.
    pub last_tag: u64,
}

/// The unacknowledged messages of one connection, in framing order.
#[derive(Debug, Default)]
pub struct Completions {
    sent: VecDeque<Sent>,
}

impl Completions {
    /// Records that a message's last byte went out in frame `last_seq`.
    pub fn on_framed(&mut self, service: u16, tag: u64, last_seq: u64) {
        self.sent.push_back(Sent {
            tag,
            service,
            last_seq,
        });
    }

    /// Every frame below `una` is acknowledged: retires the messages they carried, adding
    /// one run per service (in order) to `out`.
    pub fn on_acked(&mut self, una: u64, out: &mut Vec<AckedRun>) {
        while let Some(s) = self.sent.front().copied() {
            if s.last_seq >= una {
                break;
            }
            self.sent.pop_front();
            // Runs of one service are the common case: its entry is the last one.
            if let Some(r) = out.last_mut().filter(|r| r.service == s.service) {
                r.count += 1;
                r.last_tag = s.tag;
                continue;
            }
            match out.iter_mut().find(|r| r.service == s.service) {
                Some(r) => {
                    r.count += 1;
                    r.last_tag = s.tag;
                }
                None => out.push(AckedRun {
                    service: s.service,
                    count: 1,
                    last_tag: s.tag,
                }),
            }
        }
    }

    /// Takes every unacknowledged message (service, tag), in framing order.
    pub fn drain(&mut self) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.sent.drain(..).map(|s| (s.service, s.tag))
    }

    /// Messages framed and not acknowledged.
    pub fn len(&self) -> usize {
        self.sent.len()
    }

    /// Whether every framed message is acknowledged.
    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_retire_in_order_per_service() {
        let mut c = Completions::default();
        c.on_framed(1, 10, 0);
        c.on_framed(2, 20, 0);
        c.on_framed(1, 11, 1);
        c.on_framed(1, 12, 3);
        let mut out = Vec::new();
        c.on_acked(2, &mut out);
        assert_eq!(
            out,
            [
                AckedRun {
                    service: 1,
                    count: 2,
                    last_tag: 11
                },
                AckedRun {
                    service: 2,
                    count: 1,
                    last_tag: 20
                }
            ]
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c.drain().collect::<Vec<_>>(), [(1, 12)]);
        assert!(c.is_empty());
    }
}
