//! The receiver's delivery gate, in message-number order: reassembles fragmented messages
//! and releases complete ones to the application as soon as their fences allow. Unfenced
//! messages go at once, in any order; a backward fence waits for every earlier message; a
//! forward fence holds every later message until it has gone.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Fence flags of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fences {
    /// Deliver only after every earlier message of the connection.
    pub backward: bool,
    /// Deliver no later message of the connection before this one.
    pub forward: bool,
}

/// A message released to the application (what a `Vec<Released>` collects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// Its message number in the connection.
    pub msn: u64,
    /// The service it is for.
    pub service: u16,
    /// Its bytes.
    pub data: Vec<u8>,
}

/// Where released messages go, in release order. The bytes are borrowed (from the frame
/// they arrived in, or from the gate when a fence held them): the receiver copies them once,
/// where it keeps them.
pub trait Release {
    /// Message `msn` of `service` may be delivered now.
    fn release(&mut self, msn: u64, service: u16, data: &[u8]);
}

impl Release for Vec<Released> {
    fn release(&mut self, msn: u64, service: u16, data: &[u8]) {
        self.push(Released {
            msn,
            service,
            data: data.to_vec(),
        });
    }
}

/// Why a fragment was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// The message would exceed the largest message size.
    #[error("reassembled message would exceed {0} bytes")]
    TooLarge(usize),
    /// Fragments of one message disagree (service, fences or last index).
    #[error("fragments of one message disagree")]
    Inconsistent,
}

#[derive(Debug)]
struct Waiting {
    service: u16,
    data: Vec<u8>,
    backward: bool,
    wait_for: Option<u64>,
}

#[derive(Debug)]
struct Partial {
    service: u16,
    fences: Fences,
    wait_for: Option<u64>,
    frags: BTreeMap<u32, Vec<u8>>,
    last: Option<u32>,
    bytes: usize,
}

/// Delivery state of one connection's receive side.
#[derive(Debug, Default)]
pub struct Delivery {
    /// Every message below this has been delivered.
    below: u64,
    /// Delivered messages at or above `below`.
    done: BTreeSet<u64>,
    /// Complete messages held by a fence.
    waiting: BTreeMap<u64, Waiting>,
    /// Fragmented messages being reassembled.
    partial: HashMap<u64, Partial>,
    max_message: usize,
}

impl Delivery {
    /// An empty gate; reassembled messages may be at most `max_message` bytes.
    pub fn new(max_message: usize) -> Delivery {
        Delivery {
            max_message,
            ..Delivery::default()
        }
    }

    /// The lowest message number not yet delivered (for widening wire numbers).
    pub fn base(&self) -> u64 {
        self.below
    }

    /// Whether message `msn` has been delivered.
    pub fn is_delivered(&self, msn: u64) -> bool {
        msn < self.below || self.done.contains(&msn)
    }

    /// Messages complete but held by fences.
    pub fn held(&self) -> usize {
        self.waiting.len()
    }

    /// Offers a whole message; releases it and anything it unblocks into `out`, or keeps a
    /// copy while a fence holds it. `wait_for` is the latest forward-fenced message before it
    /// (if any).
    pub fn offer(
        &mut self,
        msn: u64,
        service: u16,
        data: &[u8],
        fences: Fences,
        wait_for: Option<u64>,
        out: &mut impl Release,
    ) {
        if msn == self.below && self.waiting.is_empty() && wait_for.is_none_or(|j| j < msn) {
            // The next message in order with nothing held (the common case): no set to search
            // or update.
            self.mark(msn);
            out.release(msn, service, data);
            return;
        }
        if self.is_delivered(msn) || self.waiting.contains_key(&msn) {
            return;
        }
        if self.may_deliver(msn, fences.backward, wait_for) {
            self.mark(msn);
            out.release(msn, service, data);
            self.release_waiting(out);
        } else {
            self.waiting.insert(
                msn,
                Waiting {
                    service,
                    data: data.to_vec(),
                    backward: fences.backward,
                    wait_for,
                },
            );
        }
    }

    /// Whether messages `msn..` may all be released at once, none of them fenced: `msn` is
    /// the next in order and nothing is held or was delivered out of order.
    pub fn can_release_run(&self, msn: u64) -> bool {
        msn == self.below && self.waiting.is_empty() && self.done.is_empty()
    }

    /// Releases messages `msn..msn + n` (after [`Delivery::can_release_run`] said yes, for
    /// unfenced messages): the caller hands them to the application itself.
    pub fn release_run(&mut self, msn: u64, n: u64) {
        debug_assert!(self.can_release_run(msn));
        self.below = msn + n;
    }

    /// Offers fragment `frag` of message `msn` (`last` when it is the final one); a
    /// completed message is offered as a whole.
    #[allow(clippy::too_many_arguments)]
    pub fn offer_fragment(
        &mut self,
        msn: u64,
        frag: u32,
        last: bool,
        service: u16,
        data: &[u8],
        fences: Fences,
        wait_for: Option<u64>,
        out: &mut impl Release,
    ) -> Result<(), DeliveryError> {
        if self.is_delivered(msn) || self.waiting.contains_key(&msn) {
            return Ok(());
        }
        let max = self.max_message;
        let p = self.partial.entry(msn).or_insert_with(|| Partial {
            service,
            fences,
            wait_for,
            frags: BTreeMap::new(),
            last: None,
            bytes: 0,
        });
        if p.service != service || p.fences != fences || (last && p.last.is_some_and(|l| l != frag))
        {
            return Err(DeliveryError::Inconsistent);
        }
        if p.frags.contains_key(&frag) {
            return Ok(());
        }
        if p.bytes + data.len() > max || p.last.is_some_and(|l| frag > l) {
            self.partial.remove(&msn);
            return Err(DeliveryError::TooLarge(max));
        }
        p.bytes += data.len();
        p.frags.insert(frag, data.to_vec());
        if last {
            p.last = Some(frag);
        }
        let complete = p
            .last
            .is_some_and(|l| p.frags.len() as u64 == u64::from(l) + 1);
        if complete {
            if let Some(p) = self.partial.remove(&msn) {
                let mut whole = Vec::with_capacity(p.bytes);
                for (_, f) in p.frags {
                    whole.extend_from_slice(&f);
                }
                self.offer(msn, p.service, &whole, p.fences, p.wait_for, out);
            }
        }
        Ok(())
    }

    fn may_deliver(&self, msn: u64, backward: bool, wait_for: Option<u64>) -> bool {
        (!backward || self.below == msn) && wait_for.is_none_or(|j| self.is_delivered(j))
    }

    fn mark(&mut self, msn: u64) {
        if msn == self.below {
            self.below += 1;
            // In-order delivery leaves `done` empty: nothing to search.
            while !self.done.is_empty() && self.done.remove(&self.below) {
                self.below += 1;
            }
        } else {
            self.done.insert(msn);
        }
    }

    fn release_waiting(&mut self, out: &mut impl Release) {
        while !self.waiting.is_empty() {
            let ready = self
                .waiting
                .iter()
                .find(|(m, w)| self.may_deliver(**m, w.backward, w.wait_for))
                .map(|(m, _)| *m);
            let Some(msn) = ready else {
                return;
            };
            if let Some(w) = self.waiting.remove(&msn) {
                self.mark(msn);
                out.release(msn, w.service, &w.data);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Fences = Fences {
        backward: false,
        forward: false,
    };
    const BWD: Fences = Fences {
        backward: true,
        forward: false,
    };

    fn msns(out: &[Released]) -> Vec<u64> {
        out.iter().map(|r| r.msn).collect()
    }

    #[test]
    fn unfenced_go_at_once_backward_waits() {
        let mut d = Delivery::new(1 << 20);
        let mut out = Vec::new();
        d.offer(2, 1, &[2], NONE, None, &mut out);
        assert_eq!(msns(&out), [2]);
        d.offer(3, 1, &[3], BWD, None, &mut out);
        assert_eq!(msns(&out), [2], "3 waits for 0 and 1");
        d.offer(0, 1, &[0], NONE, None, &mut out);
        d.offer(1, 1, &[1], NONE, None, &mut out);
        assert_eq!(msns(&out), [2, 0, 1, 3]);
        assert_eq!(d.base(), 4);
        d.offer(1, 1, &[1], NONE, None, &mut out);
        assert_eq!(out.len(), 4, "duplicates are dropped");
    }

    #[test]
    fn forward_fence_holds_later_messages() {
        let mut d = Delivery::new(1 << 20);
        let mut out = Vec::new();
        // Message 1 is forward-fenced; 2 and 3 carry wait_for = 1 and arrive first.
        d.offer(2, 1, &[], NONE, Some(1), &mut out);
        d.offer(3, 1, &[], NONE, Some(1), &mut out);
        assert!(out.is_empty());
        d.offer(
            1,
            1,
            &[],
            Fences {
                backward: false,
                forward: true,
            },
            None,
            &mut out,
        );
        assert_eq!(msns(&out), [1, 2, 3]);
        assert!(!d.is_delivered(0));
    }

    #[test]
    fn fragments_reassemble_in_order() {
        let mut d = Delivery::new(100);
        let mut out = Vec::new();
        d.offer_fragment(0, 2, true, 5, b"ef", NONE, None, &mut out)
            .unwrap();
        d.offer_fragment(0, 0, false, 5, b"ab", NONE, None, &mut out)
            .unwrap();
        assert!(out.is_empty());
        d.offer_fragment(0, 0, false, 5, b"ab", NONE, None, &mut out)
            .unwrap();
        d.offer_fragment(0, 1, false, 5, b"cd", NONE, None, &mut out)
            .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].data, b"abcdef");
        assert_eq!(
            d.offer_fragment(1, 0, false, 5, &[0; 101], NONE, None, &mut out),
            Err(DeliveryError::TooLarge(100))
        );
        assert_eq!(
            d.offer_fragment(2, 0, false, 5, b"x", NONE, None, &mut out),
            Ok(())
        );
        assert_eq!(
            d.offer_fragment(2, 1, false, 6, b"x", NONE, None, &mut out),
            Err(DeliveryError::Inconsistent)
        );
    }
}
