//! The UMEM: one region of memory, cut into fixed chunks, that all AF_XDP sockets of a
//! server share, so a frame received on one link can be sent on another by handing its
//! chunk address from one ring to the other, without copying. The free-chunk list lives
//! here too: the poller that owns the UMEM is its only user.

use std::io;

use torusnet_proto::transport::KeptFrames;

use super::sys::Mmap;

/// Chunk size: the largest the kernel allows (frames above it are multi-buffer).
pub const CHUNK: usize = 4096;

/// UMEM chunks of the largest frame (MTU 9000, the most the configuration takes).
pub const MAX_FRAME_CHUNKS: usize = (9000 + 14usize).div_ceil(CHUNK);

/// The shared packet memory of one server and its free chunks.
#[derive(Debug)]
pub struct Umem {
    map: Mmap,
    chunks: u32,
    free: Vec<u64>,
    slots: Option<TxSlots>,
}

/// Runs of adjacent chunks at the top of the UMEM, each one frame larger than a chunk
/// written in place: the transport builds a jumbo frame straight into a slot, and its
/// descriptors point at the slot's chunks, where chained single chunks would need the frame
/// built elsewhere and copied in pieces (one 9 KB copy per frame sent).
#[derive(Debug)]
struct TxSlots {
    /// Address of the first slot.
    start: u64,
    /// Chunks per slot.
    per: u32,
    /// Chunks of each slot the kernel still holds.
    outstanding: Vec<u32>,
    /// Slots whose frame the transport keeps for retransmission (until acknowledged).
    held: Vec<bool>,
    free: Vec<u32>,
}

impl TxSlots {
    fn bytes(&self) -> u64 {
        u64::from(self.per) * CHUNK as u64
    }

    fn index(&self, addr: u64) -> Option<usize> {
        let i = (addr.checked_sub(self.start)? / self.bytes()) as usize;
        (i < self.outstanding.len()).then_some(i)
    }

    /// Frees slot `i` if neither the kernel nor the transport holds it.
    fn settle(&mut self, i: usize) {
        if self.outstanding[i] == 0 && !self.held[i] {
            self.free.push(i as u32);
        }
    }
}

/// Reads frames kept in transmit slots back for the transport's retransmissions
/// ([`KeptFrames`]), while another slot is being written: it holds the region's address
/// rather than a borrow of the [`Umem`].
#[derive(Debug, Clone, Copy)]
pub struct SlotFrames {
    base: *const u8,
    map_len: usize,
    start: u64,
    bytes: u64,
    slots: u32,
}

impl KeptFrames for SlotFrames {
    fn copy_kept(&self, handle: u32, offset: usize, to: &mut [u8]) -> bool {
        if handle >= self.slots || offset.saturating_add(to.len()) > self.bytes as usize {
            return false;
        }
        let from = (self.start + u64::from(handle) * self.bytes) as usize + offset;
        if from + to.len() > self.map_len {
            return false;
        }
        // SAFETY: `from..from + to.len()` lies inside the live mapping (checked above); the
        // slot is held for the transport, so nothing writes it, and it is not `to`: a
        // destination that overlaps it is refused here.
        unsafe {
            let src = self.base.add(from);
            let dst = to.as_mut_ptr() as *const u8;
            if dst < src.add(to.len()) && src < dst.add(to.len()) {
                return false;
            }
            std::ptr::copy_nonoverlapping(src, to.as_mut_ptr(), to.len());
        }
        true
    }
}

impl Umem {
    /// A UMEM of `chunks` chunks of [`CHUNK`] bytes, all free.
    pub fn new(chunks: u32) -> io::Result<Umem> {
        let map = Mmap::anonymous(chunks as usize * CHUNK)?;
        let free = (0..u64::from(chunks))
            .rev()
            .map(|i| i * CHUNK as u64)
            .collect();
        Ok(Umem {
            map,
            chunks,
            free,
            slots: None,
        })
    }

    /// Sets aside `slots` runs of `per` adjacent chunks at the top of the region for frames
    /// transmitted from one place ([`Umem::alloc_slot`]); the chunks left are the free list's.
    /// At most half the chunks go to slots. Returns the slots made. Call once, before any
    /// chunk is handed out.
    pub fn reserve_tx_slots(&mut self, slots: u32, per: u32) -> u32 {
        if per < 2 || self.slots.is_some() {
            return 0;
        }
        let slots = slots.min(self.chunks / 2 / per);
        if slots == 0 {
            return 0;
        }
        let general = self.chunks - slots * per;
        let start = u64::from(general) * CHUNK as u64;
        self.free.retain(|&a| a < start);
        self.chunks = general;
        self.slots = Some(TxSlots {
            start,
            per,
            outstanding: vec![0; slots as usize],
            held: vec![false; slots as usize],
            free: (0..slots).rev().collect(),
        });
        slots
    }

    /// A free slot's address (its first chunk's), if any: [`Umem::slot_len`] writable bytes.
    pub fn alloc_slot(&mut self) -> Option<u64> {
        let s = self.slots.as_mut()?;
        let i = s.free.pop()?;
        Some(s.start + u64::from(i) * s.bytes())
    }

    /// Bytes in a slot (0 without slots).
    pub fn slot_len(&self) -> usize {
        self.slots.as_ref().map_or(0, |s| s.bytes() as usize)
    }

    /// Free slots.
    pub fn free_slots(&self) -> usize {
        self.slots.as_ref().map_or(0, |s| s.free.len())
    }

    /// The slot at `base` was handed to the kernel as `chunks` descriptors, one per chunk
    /// from its first, and `held` for the transport (its frame kept for retransmission): it
    /// is free again when all of them have been released and the transport lets it go
    /// ([`Umem::unhold`]).
    pub fn commit_slot(&mut self, base: u64, chunks: u32, held: bool) {
        let Some(s) = self.slots.as_mut() else { return };
        if let Some(i) = s.index(base) {
            s.outstanding[i] = chunks.min(s.per);
            s.held[i] = held;
            s.settle(i);
        }
    }

    /// The name the transport knows the slot at `base` by.
    pub fn slot_handle(&self, base: u64) -> Option<u32> {
        let s = self.slots.as_ref()?;
        s.index(base).map(|i| i as u32)
    }

    /// The transport no longer keeps slot `handle`'s frame.
    pub fn unhold(&mut self, handle: u32) {
        let Some(s) = self.slots.as_mut() else { return };
        let i = handle as usize;
        if s.held.get(i) == Some(&true) {
            s.held[i] = false;
            s.settle(i);
        }
    }

    /// Slots held for the transport.
    pub fn held_slots(&self) -> usize {
        self.slots
            .as_ref()
            .map_or(0, |s| s.held.iter().filter(|h| **h).count())
    }

    /// A reader of kept slots for the transport's retransmissions.
    pub fn slot_frames(&self) -> SlotFrames {
        let (start, bytes, slots) = self.slots.as_ref().map_or((0, 0, 0), |s| {
            (s.start, s.bytes(), s.outstanding.len() as u32)
        });
        SlotFrames {
            base: self.map.ptr(),
            map_len: self.map.len(),
            start,
            bytes,
            slots,
        }
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

    /// Number of chunks, outside the transmit slots.
    pub fn chunks(&self) -> u32 {
        self.chunks
    }

    /// A free chunk's address, if any.
    pub fn alloc(&mut self) -> Option<u64> {
        self.free.pop()
    }

    /// Returns a chunk (any address inside it) to the free list, or to its slot.
    pub fn release(&mut self, addr: u64) {
        if let Some(s) = self.slots.as_mut() {
            if addr >= s.start {
                if let Some(i) = s.index(addr) {
                    // A release the slot does not expect (a confused kernel) changes nothing.
                    if s.outstanding[i] > 0 {
                        s.outstanding[i] -= 1;
                        s.settle(i);
                    }
                }
                return;
            }
        }
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
        // SAFETY: the chunk is ours while we hold its address, and the slice borrows the
        // UMEM mutably, so no other slice is made while it lives.
        unsafe { self.held_mut(addr, len) }
    }

    /// The bytes at `addr..addr+len` of a chunk the caller holds (taken off a ring, not
    /// released), writable, borrowing nothing of the UMEM: while a message in a received
    /// frame is read where it lies, the same poller may take other chunks and write frames
    /// into them (an answer sent straight into its frame), which `slice_mut` would forbid.
    ///
    /// # Safety
    ///
    /// Until the slice is dropped the caller keeps holding the chunk (neither releases it
    /// nor puts it on a ring), makes no other slice of it, and keeps the UMEM alive.
    pub unsafe fn held_mut<'a>(&self, addr: u64, len: usize) -> &'a mut [u8] {
        if !self.check(addr, len) {
            return &mut [];
        }
        // SAFETY: in range of the live mapping; the caller's hold makes these bytes
        // exclusive to the slice (every other slice is of a chunk the UMEM hands out or was
        // given, never of a held one).
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr().add(addr as usize), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_adjacent_chunks_apart_from_the_free_list() {
        let mut u = Umem::new(64).expect("umem");
        assert_eq!(u.reserve_tx_slots(8, 3), 8);
        assert_eq!(u.chunks(), 64 - 24);
        assert_eq!(u.free_chunks(), 40);
        assert_eq!(u.slot_len(), 3 * CHUNK);
        let mut seen = Vec::new();
        while let Some(a) = u.alloc() {
            assert!(a < 40 * CHUNK as u64);
            seen.push(a);
        }
        assert_eq!(seen.len(), 40);
        let base = u.alloc_slot().expect("slot");
        let first = 40 * CHUNK as u64;
        assert!(base >= first && (base - first).is_multiple_of(3 * CHUNK as u64));
        assert_eq!(u.slice_mut(base, u.slot_len()).len(), 3 * CHUNK);
        assert_eq!(u.free_slots(), 7);
    }

    #[test]
    fn a_slot_is_free_again_when_every_chunk_it_sent_is_back() {
        let mut u = Umem::new(64).expect("umem");
        u.reserve_tx_slots(2, 3);
        let a = u.alloc_slot().expect("slot");
        let b = u.alloc_slot().expect("slot");
        assert_eq!(u.alloc_slot(), None);
        u.commit_slot(a, 3, false);
        u.commit_slot(b, 1, false);
        u.release(b + 10);
        assert_eq!(u.free_slots(), 1);
        u.release(a);
        u.release(a + CHUNK as u64);
        assert_eq!(u.free_slots(), 1);
        // Released twice by mistake: counted once.
        u.release(b);
        assert_eq!(u.free_slots(), 1);
        u.release(a + 2 * CHUNK as u64 + 5);
        assert_eq!(u.free_slots(), 2);
        // General chunks are untouched by slot traffic.
        assert_eq!(u.free_chunks(), 64 - 6);
        // A slot not used is given back whole.
        let c = u.alloc_slot().expect("slot");
        u.commit_slot(c, 0, false);
        assert_eq!(u.free_slots(), 2);
    }

    #[test]
    fn slots_take_at_most_half_and_only_for_multi_chunk_frames() {
        let mut u = Umem::new(60).expect("umem");
        assert_eq!(u.reserve_tx_slots(1000, 3), 10);
        assert_eq!(u.chunks(), 30);
        let mut v = Umem::new(60).expect("umem");
        assert_eq!(v.reserve_tx_slots(10, 1), 0);
        assert_eq!(v.alloc_slot(), None);
        assert_eq!(v.chunks(), 60);
    }

    #[test]
    fn a_held_slot_waits_for_the_transport_and_reads_back() {
        let mut u = Umem::new(64).expect("umem");
        u.reserve_tx_slots(2, 3);
        let a = u.alloc_slot().expect("slot");
        let h = u.slot_handle(a).expect("handle");
        u.slice_mut(a, 20).copy_from_slice(&[9u8; 20]);
        u.commit_slot(a, 1, true);
        u.release(a);
        // The kernel is done, the transport is not.
        assert_eq!(u.free_slots(), 1);
        assert_eq!(u.held_slots(), 1);
        let frames = u.slot_frames();
        let b = u.alloc_slot().expect("slot");
        let to = u.slice_mut(b, 6);
        assert!(frames.copy_kept(h, 14, to));
        assert_eq!(to, &[9u8; 6]);
        // Reading a slot into itself is refused.
        let to = u.slice_mut(a, 6);
        assert!(!frames.copy_kept(h, 0, to));
        assert!(!frames.copy_kept(7, 0, &mut [0u8; 4]));
        u.unhold(h);
        assert_eq!(u.free_slots(), 1);
        assert_eq!(u.held_slots(), 0);
        // Released by the transport before the kernel: free when the kernel is done too.
        u.commit_slot(b, 2, true);
        u.unhold(u.slot_handle(b).expect("handle"));
        u.release(b);
        assert_eq!(u.free_slots(), 1);
        u.release(b + CHUNK as u64);
        assert_eq!(u.free_slots(), 2);
    }
}
