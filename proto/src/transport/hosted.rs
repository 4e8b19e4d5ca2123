//! The services a server hosts, as the receiver sees them: a reliable message for a service
//! nobody hosts, or for one whose queue is full, is refused, and its sender told (see
//! [`super::notice`]), instead of being acknowledged and dropped where nobody would ever
//! learn of it.
//!
//! Two bits per service id (hosted; full), side by side in one word, shared by every poller
//! of a dataplane (applications attach, detach and fall behind on one thread while frames
//! arrive on others): whether a message is taken is one load.

use std::sync::atomic::{AtomicU64, Ordering};

use super::FailReason;

/// Bit of a service's pair that says it is hosted; the next one up says it is full.
const HOSTED: u64 = 1;
const FULL: u64 = 2;
/// The hosted bits of a word (every other bit).
const HOSTED_BITS: u64 = 0x5555_5555_5555_5555;

/// A set of service ids, safe to share between threads, each hosted service marked when it
/// takes no more messages for now.
#[derive(Debug)]
pub struct HostedServices {
    /// 32 services a word, two bits each.
    bits: Box<[AtomicU64]>,
}

impl Default for HostedServices {
    fn default() -> HostedServices {
        HostedServices::new()
    }
}

impl HostedServices {
    /// The empty set.
    pub fn new() -> HostedServices {
        HostedServices {
            bits: (0..2048).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The word holding service `id`'s pair, and the pair's shift in it.
    #[inline]
    fn at(&self, id: u16) -> (&AtomicU64, u32) {
        (&self.bits[usize::from(id >> 5)], u32::from(id & 31) * 2)
    }

    /// Service `id`'s pair of bits.
    #[inline]
    fn pair(&self, id: u16) -> u64 {
        let (w, shift) = self.at(id);
        (w.load(Ordering::Acquire) >> shift) & (HOSTED | FULL)
    }

    /// Service `id` is hosted from now on.
    pub fn host(&self, id: u16) {
        let (w, shift) = self.at(id);
        w.fetch_or(HOSTED << shift, Ordering::Release);
    }

    /// Service `id` is no longer hosted (and no longer full).
    pub fn unhost(&self, id: u16) {
        let (w, shift) = self.at(id);
        w.fetch_and(!((HOSTED | FULL) << shift), Ordering::Release);
    }

    /// Service `id` takes no more messages for now (its queue is full), or takes them again.
    pub fn set_full(&self, id: u16, full: bool) {
        let (w, shift) = self.at(id);
        if full {
            w.fetch_or(FULL << shift, Ordering::Release);
        } else {
            w.fetch_and(!(FULL << shift), Ordering::Release);
        }
    }

    /// Whether a message for service `id` is taken now: hosted and not full.
    #[inline]
    pub fn takes(&self, id: u16) -> bool {
        self.pair(id) == HOSTED
    }

    /// Why a message for service `id` is refused now, if it is.
    pub fn refusal(&self, id: u16) -> Option<FailReason> {
        match self.pair(id) {
            HOSTED => None,
            p if p & HOSTED == 0 => Some(FailReason::NoService),
            _ => Some(FailReason::ReceiverFull),
        }
    }

    /// Whether service `id` is hosted.
    #[inline]
    pub fn hosts(&self, id: u16) -> bool {
        self.pair(id) & HOSTED != 0
    }

    /// The hosted ids, in order (a word at a time: a status asks for them, and most words
    /// are empty).
    pub fn ids(&self) -> Vec<u16> {
        let mut out = Vec::new();
        for (w, bits) in self.bits.iter().enumerate() {
            let mut b = bits.load(Ordering::Acquire) & HOSTED_BITS;
            while b != 0 {
                out.push((w * 32) as u16 + (b.trailing_zeros() / 2) as u16);
                b &= b - 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_and_go_one_by_one() {
        let h = HostedServices::new();
        assert!(h.ids().is_empty());
        for id in [0, 1, 63, 64, 1023, 1024, 65535] {
            h.host(id);
        }
        assert_eq!(h.ids(), [0, 1, 63, 64, 1023, 1024, 65535]);
        h.unhost(64);
        h.unhost(7);
        assert!(!h.hosts(64) && h.hosts(63) && h.hosts(65535));
        assert_eq!(h.ids(), [0, 1, 63, 1023, 1024, 65535]);
    }

    #[test]
    fn a_full_service_is_refused_until_it_drains() {
        let h = HostedServices::new();
        h.host(70);
        assert!(h.takes(70) && h.refusal(70).is_none());
        h.set_full(70, true);
        assert!(h.hosts(70) && !h.takes(70));
        assert_eq!(h.refusal(70), Some(FailReason::ReceiverFull));
        assert_eq!(h.refusal(71), Some(FailReason::NoService));
        h.set_full(70, false);
        assert!(h.takes(70));
        h.set_full(70, true);
        h.unhost(70);
        h.host(70);
        assert!(h.takes(70), "a service attached anew starts empty");
    }
}
