//! What a connection has sent and the peer has not acknowledged yet, message by message, so
//! that every reliable message a service handed to the transport ends in exactly one report
//! to it: acknowledged, or failed (the peer restarted, reset the connection, fell silent, or
//! became unreachable).
//!
//! Messages of one service to one peer leave their service queue in the order they were sent
//! and are acknowledged in frame order, so both reports come in send order per (service,
//! peer), and an acknowledgement can be a count.

use std::collections::VecDeque;

/// Messages of one service framed whole into one frame (their last fragments are on the
/// wire) and not yet acknowledged, whose tags are all one value or count up by one: an
/// aggregated frame of a service's messages is one entry, not one per message (about a
/// tenth of the transport's work per small message went to an entry each).
#[derive(Debug, Clone, Copy)]
struct Sent {
    first_tag: u64,
    /// Sequence number of the frame that carries their last bytes.
    last_seq: u64,
    count: u32,
    service: u16,
    /// 0: every tag is `first_tag`; 1: they count up from it.
    step: u8,
}

impl Sent {
    fn last_tag(&self) -> u64 {
        self.tag(self.count - 1)
    }

    fn tag(&self, k: u32) -> u64 {
        if self.step == 0 {
            self.first_tag
        } else {
            self.first_tag.wrapping_add(u64::from(k))
        }
    }

    /// Whether `count` messages of `service` in frame `seq`, tagged from `first` by `step`,
    /// continue this run, and with which step the two go on as one.
    fn joins(&self, service: u16, first: u64, step: u8, count: u32, seq: u64) -> Option<u8> {
        if self.service != service
            || self.last_seq != seq
            || self.count.checked_add(count).is_none()
        {
            return None;
        }
        let common = match (self.count > 1, count > 1) {
            (true, true) if self.step != step => return None,
            (true, _) => self.step,
            (false, true) => step,
            (false, false) => {
                let d = first.wrapping_sub(self.first_tag);
                if d > 1 {
                    return None;
                }
                d as u8
            }
        };
        (first == self.last_tag().wrapping_add(u64::from(common))).then_some(common)
    }
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
        self.on_framed_run(service, tag, 0, 1, last_seq);
    }

    /// Records `count` messages of `service` whose last bytes went out in frame `last_seq`,
    /// tagged from `first_tag` on, all alike (`step` 0) or counting up (1).
    #[inline]
    pub fn on_framed_run(
        &mut self,
        service: u16,
        first_tag: u64,
        step: u8,
        count: u32,
        last_seq: u64,
    ) {
        if count == 0 {
            return;
        }
        if let Some(b) = self.sent.back_mut() {
            if let Some(common) = b.joins(service, first_tag, step, count, last_seq) {
                b.step = common;
                b.count += count;
                self.messages += count as usize;
                return;
            }
        }
        self.messages += count as usize;
        self.sent.push_back(Sent {
            first_tag,
            last_seq,
            count,
            service,
            step: if count > 1 { step } else { 0 },
        });
    }

    /// [`Completions::on_framed`] for a message that is the only one to end in frame
    /// `last_seq` (it cannot extend a run of an earlier frame, so nothing is compared).
    #[inline]
    pub fn on_framed_alone(&mut self, service: u16, tag: u64, last_seq: u64) {
        self.messages += 1;
        self.sent.push_back(Sent {
            first_tag: tag,
            step: 0,
            count: 1,
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
            self.messages -= s.count as usize;
            let last_tag = s.last_tag();
            // Runs of one service are the common case: its entry is the last one.
            if let Some(r) = out.last_mut().filter(|r| r.service == s.service) {
                r.count = r.count.saturating_add(s.count);
                r.last_tag = last_tag;
                continue;
            }
            match out.iter_mut().find(|r| r.service == s.service) {
                Some(r) => {
                    r.count = r.count.saturating_add(s.count);
                    r.last_tag = last_tag;
                }
                None => out.push(AckedRun {
                    service: s.service,
                    count: s.count,
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
            .flat_map(|s| (0..s.count).map(move |k| (s.service, s.tag(k))))
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
                                let step = rng.below(2) as u8;
                                let count = rng.below(5) as u32;
                                c.on_framed_run(service, tag, step, count, seq);
                                for k in 0..count {
                                    let t = tag.wrapping_add(u64::from(step) * u64::from(k));
                                    model.push_back((service, t, seq));
                                }
                                if count > 0 {
                                    tag = tag.wrapping_add(u64::from(step) * u64::from(count - 1));
                                }
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
