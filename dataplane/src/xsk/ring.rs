//! The four single-producer single-consumer rings an AF_XDP socket shares with the kernel:
//! fill and TX (we produce), RX and completion (we consume). Indices are free-running u32s
//! published with release stores and read with acquire loads, as the kernel does.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering};

use super::sys::{Mmap, RingOffset, XDP_RING_NEED_WAKEUP};

/// One mapped ring of `T` (a descriptor or a UMEM address).
#[derive(Debug)]
pub struct Ring<T: Copy> {
    _map: Mmap,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut T,
    mask: u32,
    size: u32,
    /// Our copy of our own index (producer for producer rings, consumer for consumer rings).
    cached_own: u32,
    /// Our last view of the kernel's index.
    cached_peer: u32,
}

// SAFETY: the ring is owned by one thread at a time; the raw pointers point into a mapping
// the ring owns.
unsafe impl<T: Copy> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// Maps the ring of `size` entries described by `off` at page offset `pgoff`.
    pub fn map(
        fd: &impl AsRawFd,
        off: &RingOffset,
        size: u32,
        pgoff: i64,
        name: &str,
    ) -> io::Result<Ring<T>> {
        let len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        let map = Mmap::ring(fd, len, pgoff, name)?;
        let base = map.ptr();
        // SAFETY: the offsets come from the kernel for this mapping and lie inside it.
        let r = unsafe {
            Ring {
                producer: base.add(off.producer as usize).cast(),
                consumer: base.add(off.consumer as usize).cast(),
                flags: base.add(off.flags as usize).cast(),
                descs: base.add(off.desc as usize).cast(),
                mask: size - 1,
                size,
                cached_own: 0,
                cached_peer: 0,
                _map: map,
            }
        };
        Ok(r)
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping, aligned by the kernel.
        unsafe { &*self.producer }
    }
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }

    /// Whether the kernel asked to be woken (need_wakeup mode).
    pub fn needs_wakeup(&self) -> bool {
        // SAFETY: as above.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & XDP_RING_NEED_WAKEUP != 0
    }

    /// Entries in the ring.
    pub fn size(&self) -> u32 {
        self.size
    }

    // ---- producer side (fill, TX) ----

    /// Free slots we may produce into now.
    pub fn free(&mut self) -> u32 {
        self.cached_peer = self.consumer().load(Ordering::Acquire);
        self.size - self.cached_own.wrapping_sub(self.cached_peer)
    }

    /// Writes `v` into the next free slot (the caller checked [`Ring::free`]); not visible to
    /// the kernel until [`Ring::submit`].
    pub fn write(&mut self, i: u32, v: T) {
        let idx = self.cached_own.wrapping_add(i) & self.mask;
        // SAFETY: idx is within the ring; the slot is ours until submitted.
        unsafe { self.descs.add(idx as usize).write(v) };
    }

    /// Publishes `n` written slots to the kernel.
    pub fn submit(&mut self, n: u32) {
        self.cached_own = self.cached_own.wrapping_add(n);
        self.producer().store(self.cached_own, Ordering::Release);
    }

    /// Slots produced and not yet consumed by the kernel.
    pub fn outstanding(&mut self) -> u32 {
        self.cached_peer = self.consumer().load(Ordering::Acquire);
        self.cached_own.wrapping_sub(self.cached_peer)
    }

    // ---- consumer side (RX, completion) ----

    /// Entries ready to consume (at most `max`).
    pub fn available(&mut self, max: u32) -> u32 {
        let mut n = self.cached_peer.wrapping_sub(self.cached_own);
        if n == 0 {
            self.cached_peer = self.producer().load(Ordering::Acquire);
            n = self.cached_peer.wrapping_sub(self.cached_own);
        }
        n.min(max)
    }

    /// Reads entry `i` of those available.
    pub fn read(&self, i: u32) -> T {
        let idx = self.cached_own.wrapping_add(i) & self.mask;
        // SAFETY: idx is within the ring and the kernel published this entry.
        unsafe { self.descs.add(idx as usize).read() }
    }

    /// Hands `n` consumed entries back to the kernel.
    pub fn release(&mut self, n: u32) {
        self.cached_own = self.cached_own.wrapping_add(n);
        self.consumer().store(self.cached_own, Ordering::Release);
    }
}
