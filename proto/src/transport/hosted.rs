//! The services a server hosts, as the receiver sees them: a reliable message for a service
//! nobody hosts, or for one whose queue is full, is refused, and its sender told (see
//! [`super::notice`]), instead of being acknowledged and dropped where nobody would ever
//! learn of it.
//!
//! Two bits per service id (hosted; full), shared by every poller of a dataplane
//! (applications attach, detach and fall behind on one thread while frames arrive on
//! others), read with relaxed loads per message.

use std::sync::atomic::{AtomicU64, Ordering};

use super::FailReason;

/// A set of service ids, safe to share between threads, each hosted service marked when it
/// takes no more messages for now.
#[derive(Debug)]
pub struct HostedServices {
    bits: Box<[AtomicU64]>,
    full: Box<[AtomicU64]>,
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
            bits: (0..1024).map(|_| AtomicU64::new(0)).collect(),
            full: (0..1024).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Service `id` is hosted from now on.
    pub fn host(&self, id: u16) {
        self.bits[usize::from(id >> 6)].fetch_or(1 << (id & 63), Ordering::Release);
    }

    /// Service `id` is no longer hosted (and no longer full).
    pub fn unhost(&self, id: u16) {
        self.bits[usize::from(id >> 6)].fetch_and(!(1 << (id & 63)), Ordering::Release);
        self.set_full(id, false);
    }

    /// Service `id` takes no more messages for now (its queue is full), or takes them again.
    pub fn set_full(&self, id: u16, full: bool) {
        let w = &self.full[usize::from(id >> 6)];
        if full {
            w.fetch_or(1 << (id & 63), Ordering::Release);
        } else {
            w.fetch_and(!(1 << (id & 63)), Ordering::Release);
        }
    }

    /// Whether a message for service `id` is taken now: hosted and not full.
    #[inline]
    pub fn takes(&self, id: u16) -> bool {
        let (w, b) = (usize::from(id >> 6), 1u64 << (id & 63));
        self.bits[w].load(Ordering::Acquire) & b != 0
            && self.full[w].load(Ordering::Acquire) & b == 0
    }

    /// Why a message for service `id` is refused now, if it is.
    pub fn refusal(&self, id: u16) -> Option<FailReason> {
        if !self.hosts(id) {
            Some(FailReason::NoService)
        } else if !self.takes(id) {
            Some(FailReason::ReceiverFull)
        } else {
            None
        }
    }

    /// Whether service `id` is hosted.
    #[inline]
    pub fn hosts(&self, id: u16) -> bool {
        self.bits[usize::from(id >> 6)].load(Ordering::Acquire) & (1 << (id & 63)) != 0
    }

    /// The hosted ids, in order (a word at a time: a status asks for them, and most words
    /// are empty).
    pub fn ids(&self) -> Vec<u16> {
        let mut out = Vec::new();
        for (w, bits) in self.bits.iter().enumerate() {
            let mut b = bits.load(Ordering::Acquire);
            while b != 0 {
                out.push((w * 64) as u16 + b.trailing_zeros() as u16);
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
