//! Return buffers: the pool this application posts buffers from, and reading what peers
//! placed in them.

use crate::*;

/// A return buffer this application posted: its descriptor goes to the peer that fills it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReturnBuffer {
    /// Where it is.
    pub owner: Address,
    /// Its id.
    pub id: u32,
    /// Its size.
    pub len: u32,
    /// The secret that proves a sender was given the descriptor.
    pub cookie: u64,
}

impl ReturnBuffer {
    /// Bytes of an encoded descriptor.
    pub const ENCODED: usize = 24;

    /// The descriptor as bytes, to put in a message.
    pub fn encode(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        let (x, y, z) = self.owner.server;
        b[0..2].copy_from_slice(&x.to_le_bytes());
        b[2..4].copy_from_slice(&y.to_le_bytes());
        b[4..6].copy_from_slice(&z.to_le_bytes());
        b[6..8].copy_from_slice(&self.owner.service.to_le_bytes());
        b[8..12].copy_from_slice(&self.id.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.cookie.to_le_bytes());
        b
    }

    /// A descriptor from bytes (`None` when too short).
    pub fn decode(b: &[u8]) -> Option<ReturnBuffer> {
        let b = b.get(..24)?;
        let u16at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut c = [0u8; 8];
        c.copy_from_slice(&b[16..24]);
        Some(ReturnBuffer {
            owner: Address {
                server: (u16at(0), u16at(2), u16at(4)),
                service: u16at(6),
            },
            id: u32at(8),
            len: u32at(12),
            cookie: u64::from_le_bytes(c),
        })
    }
}

/// The pool's allocator: a bump pointer with a free list of equal-size blocks returned.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    pub(crate) next: u64,
    pub(crate) free: Vec<(u64, u32)>,
    pub(crate) buffers: HashMap<u32, (u64, u32, bool)>,
    /// Registered remote-memory regions: id -> (pool offset, length). A region handed back
    /// by the application (from C, a copy it may have altered) is checked against this.
    pub(crate) regions: HashMap<u32, (u64, u64)>,
    pub(crate) next_id: u32,
}

impl Client {
    /// `len` bytes of the pool (64-byte aligned), reusing freed blocks that fit.
    pub(crate) fn pool_alloc(&self, pool: &mut Pool, len: u64) -> Result<u64, Error> {
        let (_, pool_size) = self.region.pool();
        Ok(
            match pool.free.iter().position(|(_, l)| u64::from(*l) >= len) {
                Some(i) => pool.free.swap_remove(i).0,
                None => {
                    let at = pool.next.div_ceil(64) * 64;
                    if at + len > pool_size {
                        return Err(Error::WouldBlock);
                    }
                    pool.next = at + len;
                    at
                }
            },
        )
    }

    /// Posts a return buffer of `len` bytes in this application's pool: a message sent into
    /// it (by a peer given its descriptor) lands there directly, and [`Event::BufferFilled`]
    /// says so. One message per posting.
    pub fn post_buffer(&self, len: u32) -> Result<ReturnBuffer, Error> {
        let r = &self.region;
        let mut pool = self.pool.lock();
        let at = self.pool_alloc(&mut pool, u64::from(len))?;
        pool.next_id = pool.next_id.wrapping_add(1).max(1);
        let id = pool.next_id;
        let mut cookie = [0u8; 8];
        // SAFETY: getrandom into our 8 bytes.
        let n = unsafe { libc::getrandom(cookie.as_mut_ptr().cast(), 8, 0) };
        if n != 8 {
            return Err(Error::Io(std::io::Error::last_os_error()));
        }
        let cookie = u64::from_ne_bytes(cookie) | 1;
        pool.buffers.insert(id, (at, len, false));
        drop(pool);
        let e = Sqe {
            op: op::POST_BUFFER,
            buf_id: id,
            data_len: len,
            aux: at,
            aux2: cookie,
            ..Sqe::default()
        };
        if !self.tx.lock().push_bare(r, &e) {
            // Not posted: the block goes back to the pool rather than staying recorded as
            // a posted buffer nobody will ever fill.
            let mut pool = self.pool.lock();
            pool.buffers.remove(&id);
            pool.free.push((at, len));
            return Err(Error::WouldBlock);
        }
        self.kick();
        Ok(ReturnBuffer {
            owner: self.address(),
            id,
            len,
            cookie,
        })
    }

    /// The contents of filled return buffer `id` (a copy; the buffer is then free for
    /// another posting), or `None` if it is not filled.
    pub fn buffer(&self, id: u32, len: usize) -> Option<Vec<u8>> {
        let mut pool = self.pool.lock();
        let (at, cap, filled) = *pool.buffers.get(&id)?;
        if !filled {
            return None;
        }
        let mut out = vec![0u8; len.min(cap as usize)];
        self.region.copy_out(self.region.pool(), at, &mut out);
        pool.buffers.remove(&id);
        pool.free.push((at, cap));
        Some(out)
    }

    /// Reads filled return buffer `id` in place with `f` (no copy), then frees it.
    pub fn with_buffer<T>(&self, id: u32, len: usize, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let mut pool = self.pool.lock();
        let (at, cap, filled) = *pool.buffers.get(&id)?;
        if !filled {
            return None;
        }
        let n = len.min(cap as usize);
        let p = self.region.ptr(self.region.pool(), at, n)?;
        // SAFETY: a filled buffer belongs to this application until it is freed below;
        // torusd writes a buffer only while it is posted and unfilled.
        let out = f(unsafe { std::slice::from_raw_parts(p, n) });
        pool.buffers.remove(&id);
        pool.free.push((at, cap));
        Some(out)
    }
}
