//! Buffers for the copies of sent frames the sender keeps until they are acknowledged,
//! recycled across all of a server's connections.
//!
//! The pool is per transport, not per connection: a server talking to thousands of peers
//! would otherwise park a jumbo buffer in every idle connection (a 4096-server torus doing
//! all-to-all held gigabytes that way), while the frames actually in flight at once are
//! bounded by the links, not by the number of peers.

/// Recycled frame buffers, at most `limit` kept.
#[derive(Debug)]
pub struct BufferPool {
    free: Vec<Vec<u8>>,
    limit: usize,
}

impl BufferPool {
    /// An empty pool that keeps up to `limit` buffers.
    pub fn new(limit: usize) -> BufferPool {
        BufferPool {
            free: Vec::new(),
            limit,
        }
    }

    /// An empty buffer, recycled when one is free.
    pub fn take(&mut self) -> Vec<u8> {
        let mut b = self.take_any();
        b.clear();
        b
    }

    /// A recycled buffer as it was given back (length and contents unspecified), for a
    /// caller that overwrites it anyway and would only pay for zeroing it again.
    pub fn take_any(&mut self) -> Vec<u8> {
        self.free.pop().unwrap_or_default()
    }

    /// Returns a buffer for reuse (dropped when the pool is full).
    pub fn give(&mut self, b: Vec<u8>) {
        if self.free.len() < self.limit {
            self.free.push(b);
        }
    }

    /// Buffers waiting for reuse.
    pub fn len(&self) -> usize {
        self.free.len()
    }

    /// Whether no buffer waits for reuse.
    pub fn is_empty(&self) -> bool {
        self.free.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycles_cleared_buffers_up_to_the_limit() {
        let mut p = BufferPool::new(2);
        for _ in 0..3 {
            p.give(vec![1, 2, 3]);
        }
        assert_eq!(p.len(), 2);
        let b = p.take();
        assert!(b.is_empty());
        assert!(b.capacity() >= 3);
        p.take();
        assert!(p.is_empty());
        assert_eq!(p.take().capacity(), 0);
    }
}
