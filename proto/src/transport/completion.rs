//! What a connection has sent and the peer has not acknowledged yet, message by message, so
//! that every reliable message a service handed to the transport ends in exactly one report
//! to it: acknowledged, or failed (the peer restarted, reset the connection, fell silent, or
//! became unreachable).
//!
//! Messages of one service to one peer leave their service queue in the order they were sent
//! and are acknowledged in frame order, so both reports come in send order per (service,
//! peer), and an acknowledgement can be a count.
//!
//! At least the last [`RETAINED`] records stay after their acknowledgement, so that a peer's
//! notice that it refused a message (no service there took it) still finds the message's
//! tag: the notice may arrive just after the acknowledgement of its frame.

use std::collections::VecDeque;

use super::tags::TagRun;

/// Messages of one service framed whole into one frame (their last fragments are on the
/// wire) and not yet acknowledged, with tags that form one run: an aggregated frame of a
/// service's messages is one record, not one per message (about a tenth of the transport's
/// work per small message went to a record each).
#[derive(Debug, Clone, Copy)]
struct Sent {
    tags: TagRun,
    /// Sequence number of the frame that carries their last bytes.
    last_seq: u64,
    /// Message number (in the connection) of the first; the others follow it.
    first_msn: u64,
    service: u16,
}

impl Sent {
    /// The tag of message `msn`, if this record holds it.
    fn tag_of(&self, msn: u64) -> Option<u64> {
        let k = msn.checked_sub(self.first_msn)?;
        (k < u64::from(self.tags.len())).then(|| self.tags.tag(k as u32))
    }
}

/// Acknowledged records kept for late notices (between this many and twice as many): a
/// notice is sent as soon as its frame arrives, so it trails the acknowledgement by about a
/// round trip.
pub const RETAINED: usize = 256;

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

/// The messages of one connection not acknowledged yet, after the latest acknowledged
/// ones (kept for notices), in framing order.
#[derive(Debug, Default)]
pub struct Completions {
    /// Records in framing order: the first `acked` are acknowledged (kept for notices), the
    /// rest are not. (One queue, a boundary moving through it: moving each record to a queue
    /// of its own cost more than the rest of the acknowledgement.)
    sent: VecDeque<Sent>,
    acked: usize,
    /// Messages framed and not acknowledged.
    messages: usize,
}

impl Completions {
    /// Records that message `msn`'s last byte went out in frame `last_seq`, with others of
    /// the same frame.
    #[inline]
    pub fn on_framed(&mut self, service: u16, tag: u64, msn: u64, last_seq: u64) {
        self.on_framed_run(service, TagRun::one(tag), msn, last_seq);
    }

    /// Records messages of `service` tagged `tags`, numbered from `first_msn` on, whose last
    /// bytes went out in frame `last_seq`.
    #[inline]
    pub fn on_framed_run(&mut self, service: u16, tags: TagRun, first_msn: u64, last_seq: u64) {
        self.messages += tags.len() as usize;
        let unacked = self.sent.len() > self.acked;
        if let Some(b) = self.sent.back_mut().filter(|_| unacked) {
            // Only the messages right after the record's join it: their numbers follow on.
            if b.service == service
                && b.last_seq == last_seq
                && b.first_msn + u64::from(b.tags.len()) == first_msn
            {
                if let Some(run) = b.tags.then(tags) {
                    b.tags = run;
                    return;
                }
            }
        }
        self.sent.push_back(Sent {
            tags,
            last_seq,
            first_msn,
            service,
        });
    }

    /// [`Completions::on_framed`] for a message that is the only one to end in frame
    /// `last_seq` (it cannot extend a run of an earlier frame, so nothing is compared).
    #[inline]
    pub fn on_framed_alone(&mut self, service: u16, tag: u64, msn: u64, last_seq: u64) {
        self.messages += 1;
        self.sent.push_back(Sent {
            tags: TagRun::one(tag),
            last_seq,
            first_msn: msn,
            service,
        });
    }

    /// Every frame below `una` is acknowledged: retires the messages they carried, adding
    /// one run per service (in order) to `out`.
    pub fn on_acked(&mut self, una: u64, out: &mut Vec<AckedRun>) {
        while let Some(s) = self.sent.get(self.acked).copied() {
            if s.last_seq >= una {
                break;
            }
            self.acked += 1;
            let count = s.tags.len();
            self.messages -= count as usize;
            let last_tag = s.tags.last();
            // Runs of one service are the common case: its entry is the last one.
            if let Some(r) = out.last_mut().filter(|r| r.service == s.service) {
                r.count = r.count.saturating_add(count);
                r.last_tag = last_tag;
                continue;
            }
            match out.iter_mut().find(|r| r.service == s.service) {
                Some(r) => {
                    r.count = r.count.saturating_add(count);
                    r.last_tag = last_tag;
                }
                None => out.push(AckedRun {
                    service: s.service,
                    count,
                    last_tag,
                }),
            }
        }
        if self.acked > 2 * RETAINED {
            self.sent.drain(..self.acked - RETAINED);
            self.acked = RETAINED;
        }
    }

    /// The service that sent message `msn` (a number is the connection's, whatever the
    /// service) and its tag, unacknowledged or among the latest acknowledged ones.
    pub fn tag_of(&self, msn: u64) -> Option<(u16, u64)> {
        self.sent
            .iter()
            .rev()
            .find_map(|s| Some((s.service, s.tag_of(msn)?)))
    }

    /// Takes every unacknowledged message (service, tag), in framing order. The connection
    /// ends or starts over (message numbers with it): acknowledged records go too.
    pub fn drain(&mut self) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.messages = 0;
        let acked = std::mem::take(&mut self.acked);
        self.sent
            .drain(..)
            .skip(acked)
            .flat_map(|s| (0..s.tags.len()).map(move |k| (s.service, s.tags.tag(k))))
    }

    /// Messages framed and not acknowledged.
    pub fn len(&self) -> usize {
        self.messages
    }

    /// Whether every framed message is acknowledged.
    pub fn is_empty(&self) -> bool {
        self.messages == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_retire_in_order_per_service() {
        let mut c = Completions::default();
        c.on_framed(1, 10, 0, 0);
        c.on_framed(2, 20, 1, 0);
        c.on_framed(1, 11, 2, 1);
        c.on_framed(1, 12, 3, 3);
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
        // Acknowledged or not, a message is found by its number.
        assert_eq!(c.tag_of(1), Some((2, 20)));
        assert_eq!(c.tag_of(3), Some((1, 12)));
        assert_eq!(c.tag_of(4), None);
        assert_eq!(c.drain().collect::<Vec<_>>(), [(1, 12)]);
        assert!(c.is_empty());
    }

    /// Against a list of every message: the same acknowledgements and the same failures,
    /// whatever the tags (equal, counting up, counting down, random) and frames.
    #[test]
    fn runs_report_what_a_list_would() {
        let mut rng = crate::rng::SplitMix64::new(3);
        for _ in 0..200 {
            let mut c = Completions::default();
            let mut model: VecDeque<(u16, u64, u64)> = VecDeque::new();
            // Every message framed: (service, tag, msn), to look tags up by number.
            let mut numbered: Vec<(u16, u64, u64)> = Vec::new();
            let (mut seq, mut tag, mut una, mut msn) = (0u64, 0u64, 0u64, 0u64);
            for _ in 0..300 {
                match rng.below(10) {
                    0..=5 => {
                        let service = 1 + rng.below(2) as u16;
                        tag = match rng.below(4) {
                            0 => tag,
                            1 => tag.wrapping_add(1),
                            2 => tag.wrapping_sub(1),
                            _ => rng.next_u64() % 4,
                        };
                        match rng.below(4) {
                            0 => {
                                // Alone in a frame of its own.
                                seq += 1;
                                c.on_framed_alone(service, tag, msn, seq);
                                model.push_back((service, tag, seq));
                                numbered.push((service, tag, msn));
                                msn += 1;
                                seq += 1;
                            }
                            1 => {
                                // A run, as a queue's group hands them over.
                                let step = rng.below(2);
                                let count = 1 + rng.below(4) as u32;
                                let mut run = TagRun::one(tag);
                                for k in 1..count {
                                    run = run
                                        .then(TagRun::one(tag.wrapping_add(step * u64::from(k))))
                                        .unwrap();
                                }
                                c.on_framed_run(service, run, msn, seq);
                                for t in run.iter() {
                                    model.push_back((service, t, seq));
                                    numbered.push((service, t, msn));
                                    msn += 1;
                                }
                                tag = run.last();
                            }
                            _ => {
                                c.on_framed(service, tag, msn, seq);
                                model.push_back((service, tag, seq));
                                numbered.push((service, tag, msn));
                                msn += 1;
                            }
                        }
                    }
                    6 | 7 => seq += 1,
                    8 => {
                        una = (una + rng.below(3)).min(seq + 1);
                        let mut got = Vec::new();
                        c.on_acked(una, &mut got);
                        let mut want: Vec<AckedRun> = Vec::new();
                        while model.front().is_some_and(|m| m.2 < una) {
                            let Some((service, tag, _)) = model.pop_front() else {
                                break;
                            };
                            match want.iter_mut().find(|r| r.service == service) {
                                Some(r) => {
                                    r.count += 1;
                                    r.last_tag = tag;
                                }
                                None => want.push(AckedRun {
                                    service,
                                    count: 1,
                                    last_tag: tag,
                                }),
                            }
                        }
                        assert_eq!(got, want);
                    }
                    _ => {}
                }
                assert_eq!(c.len(), model.len());
                // Every unacknowledged message is found by its number, and so are the
                // acknowledged ones while their records are retained.
                let unacked = numbered.len() - model.len();
                let recent = numbered.len().saturating_sub(40);
                for (i, &(service, tag, m)) in numbered.iter().enumerate().skip(recent) {
                    let found = c.tag_of(m);
                    if i >= unacked {
                        assert_eq!(found, Some((service, tag)));
                    } else {
                        assert!(found.is_none_or(|f| f == (service, tag)));
                    }
                }
            }
            let left: Vec<(u16, u64)> = c.drain().collect();
            let want: Vec<(u16, u64)> = model.iter().map(|m| (m.0, m.1)).collect();
            assert_eq!(left, want);
            assert!(c.is_empty());
        }
    }
}
