//! Buffers for the copies of sent frames the sender keeps until they are acknowledged,
//! recycled across all of a server's connections.
//!
//! The pool is per transport, not per connection: a server talking to thousands of peers
//! would otherwise park a jumbo buffer in every idle connection (a 4096-server torus doing
//! all-to-all held gigabytes that way), while the frames actually in flight at once are
//! bounded by the links, not by the number of peers.

use super::kept::KeptFrame;

/// Recycled frame buffers, at most `limit` kept, and the driver's buffers the transport is
/// done with.
#[derive(Debug)]
pub struct BufferPool {
    free: Vec<Vec<u8>>,
    limit: usize,
    /// Handles of driver-kept frames no longer needed, until the driver takes them.
    released: Vec<u32>,
}

impl BufferPool {
    /// An empty pool that keeps up to `limit` buffers.
    pub fn new(limit: usize) -> BufferPool {
        BufferPool {
            free: Vec::new(),
            limit,
            released: Vec::new(),
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

    /// A retired frame: a copy goes back for reuse, a driver's buffer to the list the
    /// driver takes ([`BufferPool::take_released`]).
    pub fn give_frame(&mut self, f: KeptFrame) {
        match f {
            KeptFrame::Owned(b) => self.give(b),
            KeptFrame::Driver { handle, .. } => self.released.push(handle),
        }
    }

    /// Moves the handles of the driver's buffers no longer needed into `out`.
    pub fn take_released(&mut self, out: &mut Vec<u32>) {
        out.append(&mut self.released);
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
