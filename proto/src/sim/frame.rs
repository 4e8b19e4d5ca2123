//! Frames as the simulator holds them while they travel, and the buffers they live in.
//!
//! A simulated torus of thousands of servers has millions of frames queued on its links at
//! once; holding each as its MTU's worth of bytes cost gigabytes (32768 servers: 14 GB),
//! though a server a frame passes through reads only its headers. So a frame's trailing
//! run of one byte value (the payload of benchmark traffic) is kept as a count, and the
//! engines forward such a frame from its headers alone
//! ([`Node::handle_rx_head`](crate::node::Node::handle_rx_head)); the bytes are rebuilt,
//! exactly, only where the frame is read. Nothing is approximated: an engine sees the
//! same bytes either way.

use crate::byte_run::trailing_run;
use crate::transport::pool::BufferPool;
use crate::wire::HEADERS_LEN;

/// Frames up to this size (ACKs, NACKs, short messages, compacted frames' heads) live in
/// small buffers, so queued small frames do not each hold a jumbo buffer.
const SMALL_FRAME: usize = 256;
/// Buffers each class of the pool keeps.
const POOL_LIMIT: usize = 4096;
/// Trailing runs shorter than this are kept as bytes: compacting them saves less than the
/// work of rebuilding them.
const MIN_RUN: usize = 512;

/// Frame buffers kept for reuse, in two size classes: allocating and freeing a 9 KB
/// buffer per hop cost more than forwarding it.
#[derive(Debug)]
pub(super) struct FramePool {
    full: BufferPool,
    small: BufferPool,
    /// Buffers every byte of which is one value, by value ([`FramePool::run_buf`]).
    runs: Vec<(u8, Vec<Vec<u8>>)>,
}

impl Default for FramePool {
    fn default() -> FramePool {
        FramePool {
            full: BufferPool::new(POOL_LIMIT),
            small: BufferPool::new(POOL_LIMIT),
            runs: Vec::new(),
        }
    }
}

impl FramePool {
    /// A buffer of exactly `len` bytes (contents unspecified).
    pub(super) fn take(&mut self, len: usize) -> Vec<u8> {
        let class = if len <= SMALL_FRAME {
            &mut self.small
        } else {
            &mut self.full
        };
        let mut b = class.take_any();
        b.resize(len, 0);
        b
    }

    /// An empty buffer with room for `len` bytes.
    fn empty(&mut self, len: usize) -> Vec<u8> {
        let class = if len <= SMALL_FRAME {
            &mut self.small
        } else {
            &mut self.full
        };
        let mut b = class.take_any();
        b.clear();
        b.reserve(len);
        b
    }

    /// A buffer holding a copy of `data`.
    pub(super) fn copy_of(&mut self, data: &[u8]) -> Vec<u8> {
        let mut b = self.empty(data.len());
        b.extend_from_slice(data);
        b
    }

    /// Returns a buffer for reuse.
    pub(super) fn give(&mut self, b: Vec<u8>) {
        if b.capacity() == 0 {
            return;
        }
        if b.capacity() <= SMALL_FRAME {
            self.small.give(b);
        } else {
            self.full.give(b);
        }
    }

    /// Returns a frame's buffer, if it has one, for reuse.
    pub(super) fn give_frame(&mut self, f: SimFrame) {
        if f.spilled {
            self.give(f.spill);
        }
    }

    /// The frame `buf[..len]` as it travels: compacted when its tail is a long run of one
    /// byte value, else in a buffer of its size. `buf` comes from [`FramePool::take`] and
    /// is given back or kept.
    pub(super) fn frame(&mut self, mut buf: Vec<u8>, len: usize) -> SimFrame {
        // Runs too short to be worth rebuilding stay bytes; small frames move to a small
        // buffer (or into the frame itself) either way.
        let run = Some(trailing_run(&buf[..len], HEADERS_LEN))
            .filter(|r| *r >= MIN_RUN)
            .unwrap_or(0);
        if run > 0 || len <= SMALL_FRAME {
            let fill = buf[..len].last().copied().unwrap_or(0);
            let keep = len - run;
            let mut f = self.head_of(&buf[..keep]);
            self.give(buf);
            f.run = run as u32;
            f.fill = fill;
            return f;
        }
        buf.truncate(len);
        SimFrame::whole(buf)
    }

    /// The frame `buf[..len]` whose bytes from `at` on were not written and are all `fill`
    /// (the engine declared them: [`crate::transport::Config::declare_tails`]): carried as a
    /// run without writing or scanning them, or written out when too short to be worth it.
    pub(super) fn frame_declared(
        &mut self,
        mut buf: Vec<u8>,
        len: usize,
        at: usize,
        fill: u8,
    ) -> SimFrame {
        let at = at.min(len);
        if len - at < MIN_RUN {
            buf[at..len].fill(fill);
            return self.frame(buf, len);
        }
        let mut f = self.head_of(&buf[..at]);
        self.give(buf);
        f.run = (len - at) as u32;
        f.fill = fill;
        f
    }

    /// A frame of exactly the bytes `b`: in the frame itself when they fit.
    fn head_of(&mut self, b: &[u8]) -> SimFrame {
        let mut f = SimFrame::default();
        if b.len() <= INLINE {
            f.inline[..b.len()].copy_from_slice(b);
            f.inline_len = b.len() as u8;
        } else {
            let mut head = self.take(b.len());
            head.copy_from_slice(b);
            f.spill = head;
            f.spilled = true;
        }
        f
    }

    /// A buffer of at least `len` bytes, every one `fill`. Kept that way between uses
    /// ([`FramePool::give_run`] writes back only what was written over), so that a frame
    /// whose tail is a run is rebuilt by writing its head over the front of one, and a
    /// message that is such a run is handed out in one: neither writes its 8 KB (a fresh
    /// write of every delivered frame and message was a tenth of a run, mostly its
    /// buffers' cache misses).
    pub(super) fn run_buf(&mut self, fill: u8, len: usize) -> Vec<u8> {
        let mut b = self
            .runs
            .iter_mut()
            .find(|(f, _)| *f == fill)
            .and_then(|(_, bufs)| bufs.pop())
            .unwrap_or_default();
        if b.len() < len {
            b.resize(len, fill);
        }
        b
    }

    /// Takes back a buffer of [`FramePool::run_buf`] whose first `dirty` bytes were
    /// written over (its other bytes are still `fill`).
    pub(super) fn give_run(&mut self, mut b: Vec<u8>, fill: u8, dirty: usize) {
        let dirty = dirty.min(b.len());
        b[..dirty].fill(fill);
        let k = match self.runs.iter().position(|(f, _)| *f == fill) {
            Some(k) => k,
            None => {
                self.runs.push((fill, Vec::new()));
                self.runs.len() - 1
            }
        };
        if self.runs[k].1.len() < POOL_LIMIT {
            self.runs[k].1.push(b);
        }
    }

    /// The bytes of compacted frame `f` in a buffer of [`FramePool::run_buf`] (of at least
    /// its length: the frame is its first `f.len()` bytes), with how many bytes of it were
    /// written (its head) and the run's value.
    pub(super) fn expand_on_run(&mut self, f: SimFrame) -> (Vec<u8>, usize, u8) {
        let (head, fill) = (f.head().len(), f.fill);
        let mut b = self.run_buf(fill, f.len());
        b[..head].copy_from_slice(f.head());
        self.give_frame(f);
        (b, head, fill)
    }

    /// The whole bytes of `f`, in a buffer of the pool.
    pub(super) fn expand(&mut self, f: SimFrame) -> Vec<u8> {
        if f.spilled && f.run == 0 {
            return f.spill;
        }
        let len = f.len();
        // Written once: head, then the run (no zeroing first).
        let mut b = self.empty(len);
        b.extend_from_slice(f.head());
        b.resize(len, f.fill);
        self.give_frame(f);
        b
    }
}

/// Bytes of a frame's head held in the frame itself: a compacted jumbo frame's headers
/// (78 bytes and a message header) and short frames fit, so the frames on the links need
/// no buffer of their own and the simulator reads a frame where its event points.
const INLINE: usize = 96;

/// A frame in flight: its head (in the frame itself when it fits, else in `spill`), then
/// `run` bytes of value `fill`. Two cache lines, aligned, so that a frame is fetched with
/// two prefetches one event before it is read.
#[derive(Debug)]
#[repr(align(64))]
pub(super) struct SimFrame {
    inline: [u8; INLINE],
    spill: Vec<u8>,
    run: u32,
    inline_len: u8,
    spilled: bool,
    fill: u8,
}

impl Default for SimFrame {
    fn default() -> SimFrame {
        SimFrame {
            inline: [0; INLINE],
            spill: Vec::new(),
            run: 0,
            inline_len: 0,
            spilled: false,
            fill: 0,
        }
    }
}

impl SimFrame {
    /// A frame held as all of its bytes.
    pub(super) fn whole(bytes: Vec<u8>) -> SimFrame {
        SimFrame {
            spill: bytes,
            spilled: true,
            ..SimFrame::default()
        }
    }

    /// Its first bytes (all of them when it is not compacted).
    pub(super) fn head(&self) -> &[u8] {
        if self.spilled {
            &self.spill
        } else {
            &self.inline[..usize::from(self.inline_len)]
        }
    }

    /// Its first bytes, to be changed in place (TTL, hop count) as it is passed on.
    pub(super) fn head_mut(&mut self) -> &mut [u8] {
        if self.spilled {
            &mut self.spill
        } else {
            &mut self.inline[..usize::from(self.inline_len)]
        }
    }

    /// Its length on the wire.
    pub(super) fn len(&self) -> usize {
        self.head().len() + self.run as usize
    }

    /// Whether only its head is held.
    pub(super) fn is_compact(&self) -> bool {
        self.run > 0
    }
}

/// The frames on the links of a part, each in a slot an event names until it arrives:
/// frames sit in one array rather than in a queue per link, so an arrival reads one place
/// the event queue already knows (and prefetches), not a link's queue first.
#[derive(Debug, Default)]
pub(super) struct FrameSlab {
    slots: Vec<SimFrame>,
    free: Vec<u32>,
}

impl FrameSlab {
    /// Puts `f` in a free slot; its number.
    #[inline]
    pub(super) fn insert(&mut self, f: SimFrame) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = f;
                i
            }
            None => {
                self.slots.push(f);
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// Takes the frame out of slot `i`, freeing it (an empty frame for a slot not in use).
    #[inline]
    pub(super) fn take(&mut self, i: u32) -> SimFrame {
        match self.slots.get_mut(i as usize) {
            Some(s) => {
                self.free.push(i);
                std::mem::take(s)
            }
            None => SimFrame::default(),
        }
    }

    /// The frame in slot `i` (one in use: a slot is named only while it holds a frame).
    pub(super) fn get(&self, i: u32) -> &SimFrame {
        &self.slots[i as usize]
    }

    /// The frame in slot `i`, to be changed in place.
    pub(super) fn get_mut(&mut self, i: u32) -> &mut SimFrame {
        &mut self.slots[i as usize]
    }

    /// Starts loading slot `i` into the cache.
    pub(super) fn prefetch(&self, i: u32) {
        if let Some(s) = self.slots.get(i as usize) {
            let p = (s as *const SimFrame).cast::<u8>();
            super::prefetch(p);
            super::prefetch(p.wrapping_add(64));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_back_byte_for_byte() {
        let mut pool = FramePool::default();
        let mut rng = crate::rng::SplitMix64::new(3);
        for _ in 0..2000 {
            let len = 1 + rng.below(9100) as usize;
            let cut = rng.below(len as u64 + 1) as usize;
            let fill = rng.below(256) as u8;
            let mut want: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
            want[cut..].fill(fill);
            let mut buf = pool.take(9100);
            buf[..len].copy_from_slice(&want);
            let f = pool.frame(buf, len);
            assert_eq!(f.len(), len);
            if f.is_compact() {
                assert!(f.head().len() >= HEADERS_LEN && f.head().len() <= len - MIN_RUN);
            }
            assert_eq!(pool.expand(f), want);
        }
    }

    #[test]
    fn a_frame_is_two_cache_lines() {
        assert_eq!(std::mem::size_of::<SimFrame>(), 128);
        let mut slab = FrameSlab::default();
        let a = slab.insert(SimFrame::whole(vec![1, 2, 3]));
        let b = slab.insert(SimFrame::whole(vec![4]));
        assert_eq!(slab.take(a).head(), &[1, 2, 3]);
        // A freed slot is used again.
        assert_eq!(slab.insert(SimFrame::whole(vec![5])), a);
        assert_eq!(slab.take(b).head(), &[4]);
        assert_eq!(slab.take(a).head(), &[5]);
    }
}
