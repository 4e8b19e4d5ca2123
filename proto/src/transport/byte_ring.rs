//! A growable ring of bytes: a service queue's message bytes, written at the back as
//! messages are sent and read from the front as they are framed. Copies in and out are at
//! most two `memcpy`s each (a `VecDeque<u8>` went through its generic iterator paths, about
//! a hundred instructions per small message); the ring never shrinks while it holds
//! bytes, so a queue in steady use allocates nothing.
//!
//! An emptied ring (of modest size) hands its storage to a per-thread spare list and takes
//! one back when written again. A thread serving many queues that each send now and then
//! (a poller's services, a simulated torus of thousands of servers) then writes messages
//! into the few buffers it used last, still in its cache, rather than into each queue's
//! own, long cold: in the simulator that copy was the largest single cost. Idle queues
//! hold no storage.

use std::cell::RefCell;

/// Storage sizes (powers of two) kept on the spare list: from 2^8 to 2^16 bytes.
const MIN_SHIFT: u32 = 8;
const MAX_SHIFT: u32 = 16;
/// Spare buffers kept per size, per thread.
const SPARES: usize = 32;

thread_local! {
    /// Emptied rings' storage, by size (`log2(len) - MIN_SHIFT`), most recently used last.
    static SPARE: RefCell<[Vec<Vec<u8>>; (MAX_SHIFT - MIN_SHIFT + 1) as usize]> =
        RefCell::new(Default::default());
}

/// The spare list's slot for storage of `cap` bytes, if it keeps that size.
fn spare_slot(cap: usize) -> Option<usize> {
    let shift = cap.trailing_zeros();
    (cap.is_power_of_two() && (MIN_SHIFT..=MAX_SHIFT).contains(&shift))
        .then(|| (shift - MIN_SHIFT) as usize)
}

/// Bytes in first-in, first-out order.
#[derive(Debug, Default)]
pub struct ByteRing {
    /// Storage; its length is the capacity, a power of two (or zero).
    buf: Vec<u8>,
    /// Where the oldest byte is.
    head: usize,
    /// Bytes held.
    len: usize,
}

impl ByteRing {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no byte is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `data`, growing the storage when it is full.
    pub fn push(&mut self, data: &[u8]) {
        let need = self.len + data.len();
        if need > self.buf.len() {
            self.grow(need);
        }
        let cap = self.buf.len();
        let tail = (self.head + self.len) & (cap - 1);
        let first = data.len().min(cap - tail);
        self.buf[tail..tail + first].copy_from_slice(&data[..first]);
        if first < data.len() {
            self.buf[..data.len() - first].copy_from_slice(&data[first..]);
        }
        self.len = need;
    }

    /// Appends a message in wire form: its fixed-size header, then its bytes (one capacity
    /// check, and the header written in place rather than through a `memcpy` call).
    #[inline]
    pub fn push_message<const H: usize>(&mut self, header: &[u8; H], data: &[u8]) {
        let need = self.len + H + data.len();
        if need > self.buf.len() {
            self.grow(need);
        }
        let cap = self.buf.len();
        let tail = (self.head + self.len) & (cap - 1);
        if tail + H + data.len() <= cap {
            self.buf[tail..tail + H].copy_from_slice(header);
            self.buf[tail + H..tail + H + data.len()].copy_from_slice(data);
            self.len = need;
        } else {
            self.push(header);
            self.push(data);
        }
    }

    /// Moves the oldest `out.len()` bytes into `out` (which must not be longer than what is
    /// held).
    pub fn take(&mut self, out: &mut [u8]) {
        let n = out.len().min(self.len);
        if n == 0 {
            return;
        }
        self.take_into(&mut out[..n]);
        self.len -= n;
        self.head = (self.head + n) & (self.buf.len() - 1);
        if self.len == 0 {
            self.emptied();
        }
    }

    /// Drops the oldest `n` bytes.
    pub fn skip(&mut self, n: usize) {
        let n = n.min(self.len);
        if n == 0 {
            return;
        }
        self.len -= n;
        self.head = (self.head + n) & (self.buf.len() - 1);
        if self.len == 0 {
            self.emptied();
        }
    }

    /// An emptied ring starts over at the front (so the next messages lie in one piece),
    /// its storage given to the thread's spare list when that keeps its size.
    fn emptied(&mut self) {
        self.head = 0;
        if let Some(slot) = spare_slot(self.buf.len()) {
            let buf = std::mem::take(&mut self.buf);
            SPARE.with(|s| {
                let mut s = s.borrow_mut();
                if s[slot].len() < SPARES {
                    s[slot].push(buf);
                }
            });
        }
    }

    fn grow(&mut self, need: usize) {
        let cap = need.next_power_of_two().max(1 << MIN_SHIFT);
        let n = self.len;
        // An empty ring takes spare storage of the size it needs (its contents are never
        // read before being written), else new storage; bytes held move to the front.
        let spare = if n == 0 {
            spare_slot(cap).and_then(|slot| SPARE.with(|s| s.borrow_mut()[slot].pop()))
        } else {
            None
        };
        let mut buf = spare.unwrap_or_else(|| vec![0u8; cap]);
        self.take_into(&mut buf[..n]);
        self.buf = buf;
        self.head = 0;
        self.len = n;
    }

    /// Moves every byte held to `out` (exactly as long) without releasing the storage.
    fn take_into(&mut self, out: &mut [u8]) {
        let n = out.len();
        if n == 0 {
            return;
        }
        let cap = self.buf.len();
        let first = n.min(cap - self.head);
        out[..first].copy_from_slice(&self.buf[self.head..self.head + first]);
        if first < n {
            out[first..n].copy_from_slice(&self.buf[..n - first]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_emptied_ring_lends_its_storage_to_the_next_one_written() {
        let mut a = ByteRing::default();
        a.push(&[1u8; 5000]);
        let storage = a.buf.as_ptr();
        let mut out = vec![0u8; 5000];
        a.take(&mut out);
        assert!(a.buf.is_empty() && a.is_empty());
        let mut b = ByteRing::default();
        b.push(&[2u8; 6000]);
        assert_eq!(b.buf.as_ptr(), storage);
        // The first ring, written again, gets storage of its own and keeps its bytes.
        a.push(&[3u8; 100]);
        assert_ne!(a.buf.as_ptr(), storage);
        let mut out = vec![0u8; 100];
        a.take(&mut out);
        assert_eq!(out, vec![3u8; 100]);
        let mut out = vec![0u8; 6000];
        b.take(&mut out);
        assert_eq!(out, vec![2u8; 6000]);
    }

    #[test]
    fn wraps_grows_and_keeps_order() {
        let mut r = ByteRing::default();
        let mut model = std::collections::VecDeque::new();
        let mut next = 0u8;
        let mut rng = crate::rng::SplitMix64::new(7);
        for _ in 0..20_000 {
            if !rng.next_u64().is_multiple_of(3) {
                let n = (rng.next_u64() % 300) as usize;
                let data: Vec<u8> = (0..n)
                    .map(|_| {
                        next = next.wrapping_add(1);
                        next
                    })
                    .collect();
                if n >= 4 && rng.next_u64().is_multiple_of(2) {
                    let header: [u8; 4] = [data[0], data[1], data[2], data[3]];
                    r.push_message(&header, &data[4..]);
                } else {
                    r.push(&data);
                }
                model.extend(data);
            } else {
                let n = (rng.next_u64() % 400) as usize % (model.len() + 1);
                let mut out = vec![0u8; n];
                if rng.next_u64().is_multiple_of(4) {
                    r.skip(n);
                    model.drain(..n);
                } else {
                    r.take(&mut out);
                    let want: Vec<u8> = model.drain(..n).collect();
                    assert_eq!(out, want);
                }
            }
            assert_eq!(r.len(), model.len());
        }
    }
}
