//! The services a server hosts, as the receiver sees them: a reliable message for a service
//! nobody hosts is refused, and its sender told (see [`super::notice`]), instead of being
//! acknowledged and dropped where nobody would ever learn of it.
//!
//! One bit per service id, shared by every poller of a dataplane (applications attach and
//! detach on one thread while frames arrive on others), read with one relaxed load per
//! message.

use std::sync::atomic::{AtomicU64, Ordering};

/// A set of service ids, safe to share between threads.
#[derive(Debug)]
pub struct HostedServices {
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
            bits: (0..1024).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Service `id` is hosted from now on.
    pub fn host(&self, id: u16) {
        self.bits[usize::from(id >> 6)].fetch_or(1 << (id & 63), Ordering::Release);
    }

    /// Service `id` is no longer hosted.
    pub fn unhost(&self, id: u16) {
        self.bits[usize::from(id >> 6)].fetch_and(!(1 << (id & 63)), Ordering::Release);
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
}
