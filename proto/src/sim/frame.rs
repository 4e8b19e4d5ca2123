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
}

impl Default for FramePool {
    fn default() -> FramePool {
        FramePool {
            full: BufferPool::new(POOL_LIMIT),
            small: BufferPool::new(POOL_LIMIT),
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

    /// Returns a buffer for reuse.
    pub(super) fn give(&mut self, b: Vec<u8>) {
        if b.capacity() <= SMALL_FRAME {
            self.small.give(b);
        } else {
            self.full.give(b);
        }
    }

    /// Returns a frame's buffer for reuse.
    pub(super) fn give_frame(&mut self, f: SimFrame) {
        self.give(f.head);
    }

    /// The frame `buf[..len]` as it travels: compacted when its tail is a long run of one
    /// byte value, else in a buffer of its size. `buf` comes from [`FramePool::take`] and
    /// is given back or kept.
    pub(super) fn frame(&mut self, mut buf: Vec<u8>, len: usize) -> SimFrame {
        // Runs too short to be worth rebuilding stay bytes; small frames move to a small
        // buffer either way.
        let run = Some(trailing_run(&buf[..len], HEADERS_LEN))
            .filter(|r| *r >= MIN_RUN)
            .unwrap_or(0);
        if run > 0 || len <= SMALL_FRAME {
            let fill = buf[..len].last().copied().unwrap_or(0);
            let keep = len - run;
            let mut head = self.take(keep);
            head.copy_from_slice(&buf[..keep]);
            self.give(buf);
            return SimFrame {
                head,
                run: run as u32,
                fill,
            };
        }
        buf.truncate(len);
        SimFrame::whole(buf)
    }

    /// The whole bytes of `f`, rebuilt into a full buffer when it was compacted.
    pub(super) fn expand(&mut self, f: SimFrame) -> Vec<u8> {
        if f.run == 0 {
            return f.head;
        }
        let len = f.len();
        let mut b = self.take(len);
        b[..f.head.len()].copy_from_slice(&f.head);
        b[f.head.len()..].fill(f.fill);
        self.give(f.head);
        b
    }
}

/// A frame in flight: `head`, then `run` bytes of value `fill`.
#[derive(Debug)]
pub(super) struct SimFrame {
    /// The frame's first bytes (all of them when `run` is 0); at least its headers when
    /// compacted.
    pub(super) head: Vec<u8>,
    run: u32,
    fill: u8,
}

impl SimFrame {
    /// A frame held as all of its bytes.
    pub(super) fn whole(bytes: Vec<u8>) -> SimFrame {
        SimFrame {
            head: bytes,
            run: 0,
            fill: 0,
        }
    }

    /// Its length on the wire.
    pub(super) fn len(&self) -> usize {
        self.head.len() + self.run as usize
    }

    /// Whether only its head is held.
    pub(super) fn is_compact(&self) -> bool {
        self.run > 0
    }
}

/// Length of the run of bytes equal to the last one at the end of `b`, not reaching into
/// `b[..floor]`.
fn trailing_run(b: &[u8], floor: usize) -> usize {
    let Some(&last) = b.last() else { return 0 };
    let body = b.get(floor..).unwrap_or(&[]);
    let word = u64::from_ne_bytes([last; 8]);
    let mut chunks = body.rchunks_exact(8);
    let mut run = 0;
    // Whole words first (the compiler compares eight bytes at a time), then the rest.
    for c in chunks.by_ref() {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        if u64::from_ne_bytes(w) != word {
            return run + c.iter().rev().take_while(|x| **x == last).count();
        }
        run += 8;
    }
    run + chunks
        .remainder()
        .iter()
        .rev()
        .take_while(|x| **x == last)
        .count()
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
                assert!(f.head.len() >= HEADERS_LEN && f.head.len() <= len - MIN_RUN);
            }
            assert_eq!(pool.expand(f), want);
        }
    }

    #[test]
    fn runs_are_measured_from_the_end_and_stop_at_the_floor() {
        assert_eq!(trailing_run(&[1, 2, 3, 3, 3], 0), 3);
        assert_eq!(trailing_run(&[3; 20], 5), 15);
        let mut b = vec![7u8; 100];
        b[50] = 1;
        assert_eq!(trailing_run(&b, 0), 49);
        assert_eq!(trailing_run(&[], 0), 0);
        assert_eq!(trailing_run(&[9], 4), 0);
    }
}
