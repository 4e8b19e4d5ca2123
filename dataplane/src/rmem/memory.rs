//! The memory behind a region: part of an application's pool (mapped by torusd and by the
//! application) or, for a program embedding the dataplane, memory it allocated. Remote
//! operations copy into and out of it with plain copies: as with RDMA, the owner coordinates
//! its own reads with remote writes (notifications, tripwires, the message queue's indices).

use std::cell::UnsafeCell;
use std::sync::Arc;

use torusnet_client::sys::Mapping;

/// Bytes a region's operations copy into and out of.
pub trait Memory: Send + Sync {
    /// Its length.
    fn len(&self) -> u64;
    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `data` in at `off` (false: out of bounds, nothing copied).
    fn write(&self, off: u64, data: &[u8]) -> bool;
    /// Copies `out.len()` bytes out from `off` (false: out of bounds).
    fn read(&self, off: u64, out: &mut [u8]) -> bool;
}

fn within(off: u64, n: usize, len: u64) -> bool {
    off.checked_add(n as u64).is_some_and(|end| end <= len)
}

/// A part of an application's pool, kept mapped as long as a region uses it (an application
/// that exits leaves its mapping to the last region entry that drops it).
pub struct PoolMemory {
    map: Arc<Mapping>,
    base: u64,
    len: u64,
}

impl PoolMemory {
    /// Bytes `base .. base + len` of `map` (`None`: outside the mapping).
    pub fn new(map: Arc<Mapping>, base: u64, len: u64) -> Option<PoolMemory> {
        within(base, len as usize, map.len() as u64).then_some(PoolMemory { map, base, len })
    }
}

impl Memory for PoolMemory {
    fn len(&self) -> u64 {
        self.len
    }
    fn write(&self, off: u64, data: &[u8]) -> bool {
        if !within(off, data.len(), self.len) {
            return false;
        }
        // SAFETY: bounds checked against the region, which lies inside the live mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.map.ptr().add((self.base + off) as usize),
                data.len(),
            );
        }
        true
    }
    fn read(&self, off: u64, out: &mut [u8]) -> bool {
        if !within(off, out.len(), self.len) {
            return false;
        }
        // SAFETY: as in `write`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.ptr().add((self.base + off) as usize),
                out.as_mut_ptr(),
                out.len(),
            );
        }
        true
    }
}

/// Memory a program embedding the dataplane registers (zeroed at first).
pub struct HeapMemory {
    bytes: UnsafeCell<Box<[u8]>>,
}

// SAFETY: all access goes through raw copies of checked ranges; as with any remote memory,
// concurrent readers and writers of the same bytes coordinate through the protocol above it.
unsafe impl Sync for HeapMemory {}
// SAFETY: as above.
unsafe impl Send for HeapMemory {}

impl HeapMemory {
    /// `len` zeroed bytes.
    pub fn new(len: usize) -> HeapMemory {
        HeapMemory {
            bytes: UnsafeCell::new(vec![0u8; len].into_boxed_slice()),
        }
    }

    fn ptr(&self) -> *mut u8 {
        // SAFETY: only the pointer is taken; the box is never moved or reallocated.
        unsafe { (*self.bytes.get()).as_mut_ptr() }
    }
}

impl Memory for HeapMemory {
    fn len(&self) -> u64 {
        // SAFETY: the length never changes.
        unsafe { (&*self.bytes.get()).len() as u64 }
    }
    fn write(&self, off: u64, data: &[u8]) -> bool {
        if !within(off, data.len(), self.len()) {
            return false;
        }
        // SAFETY: bounds checked.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr().add(off as usize), data.len())
        };
        true
    }
    fn read(&self, off: u64, out: &mut [u8]) -> bool {
        if !within(off, out.len(), self.len()) {
            return false;
        }
        // SAFETY: bounds checked.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr().add(off as usize), out.as_mut_ptr(), out.len())
        };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_stay_inside() {
        let m = HeapMemory::new(16);
        assert!(m.write(12, b"abcd"));
        assert!(!m.write(13, b"abcd"));
        assert!(!m.write(u64::MAX, b"a"));
        let mut out = [0u8; 4];
        assert!(m.read(12, &mut out));
        assert_eq!(&out, b"abcd");
        assert!(!m.read(14, &mut out));
    }
}
