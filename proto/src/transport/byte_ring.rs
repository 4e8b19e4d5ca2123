//! A growable ring of bytes: a service queue's message bytes, written at the back as
//! messages are sent and read from the front as they are framed. Copies in and out are at
//! most two `memcpy`s each (a `VecDeque<u8>` went through its generic iterator paths, about
//! a hundred instructions per small message); the ring never shrinks, so a queue in steady
//! use allocates nothing.

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
        if data.is_empty() {
            // An empty ring has no storage yet: nothing to place, and no index to mask.
            return;
        }
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
    #[inline(always)]
    pub fn push_message<const H: usize>(&mut self, header: &[u8; H], data: &[u8]) {
        let need = self.len + H + data.len();
        let cap = self.buf.len();
        let tail = (self.head + self.len) & cap.wrapping_sub(1);
        // The common case, small enough to inline into every send: room, and no wrap.
        if need <= cap && tail + H + data.len() <= cap {
            self.buf[tail..tail + H].copy_from_slice(header);
            self.buf[tail + H..tail + H + data.len()].copy_from_slice(data);
            self.len = need;
        } else {
            self.push_message_slow(header, data);
        }
    }

    /// [`ByteRing::push_message`] when the ring grows or the message wraps around its end.
    #[cold]
    #[inline(never)]
    fn push_message_slow<const H: usize>(&mut self, header: &[u8; H], data: &[u8]) {
        let need = self.len + H + data.len();
        if need > self.buf.len() {
            self.grow(need);
        }
        self.push(header);
        self.push(data);
    }

    /// Moves the oldest `out.len()` bytes into `out` (which must not be longer than what is
    /// held).
    pub fn take(&mut self, out: &mut [u8]) {
        let n = out.len().min(self.len);
        let cap = self.buf.len();
        if n == 0 {
            return;
        }
        let first = n.min(cap - self.head);
        out[..first].copy_from_slice(&self.buf[self.head..self.head + first]);
        if first < n {
            out[first..n].copy_from_slice(&self.buf[..n - first]);
        }
        self.len -= n;
        // An emptied ring starts over at the front, so the next messages lie in one piece.
        self.head = if self.len == 0 {
            0
        } else {
            (self.head + n) & (cap - 1)
        };
    }

    /// Copies the bytes `at..at + out.len()` from the oldest into `out`, leaving them held
    /// (they must be).
    pub fn peek(&self, at: usize, out: &mut [u8]) {
        let cap = self.buf.len();
        debug_assert!(at + out.len() <= self.len);
        for (k, b) in out.iter_mut().enumerate() {
            *b = self.buf[(self.head + at + k) & (cap - 1)];
        }
    }

    /// Drops the oldest `n` bytes.
    pub fn skip(&mut self, n: usize) {
        let n = n.min(self.len);
        self.len -= n;
        self.head = if self.len == 0 {
            0
        } else {
            (self.head + n) & (self.buf.len() - 1)
        };
    }

    fn grow(&mut self, need: usize) {
        let cap = need.next_power_of_two().max(256);
        let mut buf = vec![0u8; cap];
        let n = self.len;
        self.take(&mut buf[..n]);
        self.buf = buf;
        self.head = 0;
        self.len = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
