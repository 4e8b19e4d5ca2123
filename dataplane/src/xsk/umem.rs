//! The UMEM: one region of memory, cut into fixed chunks, that all AF_XDP sockets of a
//! server share, so a frame received on one link can be sent on another by handing its
//! chunk address from one ring to the other, without copying. The free-chunk list lives
//! here too: the poller that owns the UMEM is its only user.

use std::io;

use super::sys::Mmap;

/// Chunk size: the largest the kernel allows (frames above it are multi-buffer).
pub const CHUNK: usize = 4096;

/// The shared packet memory of one server and its free chunks.
#[derive(Debug)]
pub struct Umem {
    map: Mmap,
    chunks: u32,
    free: Vec<u64>,
}

impl Umem {
    /// A UMEM of `chunks` chunks of [`CHUNK`] bytes, all free.
    pub fn new(chunks: u32) -> io::Result<Umem> {
        let map = Mmap::anonymous(chunks as usize * CHUNK)?;
        let free = (0..u64::from(chunks))
            .rev()
            .map(|i| i * CHUNK as u64)
            .collect();
        Ok(Umem { map, chunks, free })
    }

    /// Start address of the region (for XDP_UMEM_REG).
    pub fn addr(&self) -> u64 {
        self.map.ptr() as u64
    }

    /// Size of the region in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Number of chunks.
    pub fn chunks(&self) -> u32 {
        self.chunks
    }

    /// A free chunk's address, if any.
    pub fn alloc(&mut self) -> Option<u64> {
        self.free.pop()
    }

    /// Returns a chunk (any address inside it) to the free list.
    pub fn release(&mut self, addr: u64) {
        self.free.push(addr - addr % CHUNK as u64);
    }

    /// Free chunks.
    pub fn free_chunks(&self) -> usize {
        self.free.len()
    }

    fn check(&self, addr: u64, len: usize) -> bool {
        (addr as usize)
            .checked_add(len)
            .is_some_and(|end| end <= self.map.len())
    }

    /// The bytes at `addr..addr+len` (empty if out of range, which a sane kernel never
    /// gives us).
    pub fn slice(&self, addr: u64, len: usize) -> &[u8] {
        if !self.check(addr, len) {
            return &[];
        }
        // SAFETY: in range of the live mapping; the chunk is ours while we hold its address.
        unsafe { std::slice::from_raw_parts(self.map.ptr().add(addr as usize), len) }
    }

    /// The bytes at `addr..addr+len`, writable.
    pub fn slice_mut(&mut self, addr: u64, len: usize) -> &mut [u8] {
        if !self.check(addr, len) {
            return &mut [];
        }
        // SAFETY: as above, and &mut self makes it exclusive on our side.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr().add(addr as usize), len) }
    }
}
