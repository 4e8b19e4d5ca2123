//! What a connection has sent and the peer has not acknowledged yet, message by message, so
//! that every reliable message a service handed to the transport ends in exactly one report
//! to it: acknowledged, or failed (the peer restarted, reset the connection, fell silent, or
//! became unreachable).
//!
//! Messages of one service to one peer leave their service queue in the order they were sent
//! and are acknowledged in frame order, so both reports come in send order per (service,
//! peer), and an acknowledgement can be a count.

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
    service: u16,
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
    messages: usize,
}

impl Completions {
    /// Records that a message's last byte went out in frame `last_seq`, with others of the
    /// same frame.
    #[inline]
    pub fn on_framed(&mut self, service: u16, tag: u64, last_seq: u64) {
        self.on_framed_run(service, TagRun::one(tag), last_seq);
    }

    /// Records messages of `service` tagged `tags` whose last bytes went out in frame
    /// `last_seq`.
    #[inline]
    pub fn on_framed_run(&mut self, service: u16, tags: TagRun, last_seq: u64) {
        self.messages += tags.len() as usize;
        if let Some(b) = self.sent.back_mut() {
            if b.service == service && b.last_seq == last_seq {
                if let Some(run) = b.tags.then(tags) {
                    b.tags = run;
                    return;
                }
            }
        }
        self.sent.push_back(Sent {
            tags,
            last_seq,
            service,
        });
    }

    /// [`Completions::on_framed`] for a message that is the only one to end in frame
    /// `last_seq` (it cannot extend a run of an earlier frame, so nothing is compared).
    #[inline]
    pub fn on_framed_alone(&mut self, service: u16, tag: u64, last_seq: u64) {
        self.messages += 1;
        self.sent.push_back(Sent {
            tags: TagRun::one(tag),
            last_seq,
            service,
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
    }

    /// Takes every unacknowledged message (service, tag), in framing order.
    pub fn drain(&mut self) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.messages = 0;
        self.sent
            .drain(..)
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

    /// Against a list of every message: the same acknowledgements and the same failures,
    /// whatever the tags (equal, counting up, counting down, random) and frames.
    #[test]
    fn runs_report_what_a_list_would() {
        let mut rng = crate::rng::SplitMix64::new(3);
        for _ in 0..200 {
            let mut c = Completions::default();
            let mut model: VecDeque<(u16, u64, u64)> = VecDeque::new();
            let (mut seq, mut tag, mut una) = (0u64, 0u64, 0u64);
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
                                c.on_framed_alone(service, tag, seq);
                                model.push_back((service, tag, seq));
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
                                c.on_framed_run(service, run, seq);
                                for t in run.iter() {
                                    model.push_back((service, t, seq));
                                }
                                tag = run.last();
                            }
                            _ => {
                                c.on_framed(service, tag, seq);
                                model.push_back((service, tag, seq));
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
            }
            let left: Vec<(u16, u64)> = c.drain().collect();
            let want: Vec<(u16, u64)> = model.iter().map(|m| (m.0, m.1)).collect();
            assert_eq!(left, want);
            assert!(c.is_empty());
        }
    }
}
