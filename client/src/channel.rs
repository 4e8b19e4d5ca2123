//! The shared-memory channel between one application and torusd, defined once for both
//! sides: the region's layout, the entries of its two rings, the two byte rings that carry
//! message bytes, and the app message header that travels on the torus.
//!
//! A channel is one memfd that torusd creates and passes to the application when it
//! attaches; both map it whole. It holds:
//!
//! ```text
//! header (4 KiB)  magic, version, sizes; ring indices, each on its own cache line;
//!                 the "waiting" flags that tell the other side to signal its eventfd
//! SQ              submissions, application -> torusd: 64-byte entries (send, post buffer)
//! CQ              completions, torusd -> application: 64-byte entries (message, acked,
//!                 failed, peer reset, reachability, buffer filled ...)
//! TX data         bytes of outgoing messages, a byte ring the application fills
//! RX data         bytes of incoming messages, a byte ring torusd fills
//! pool            the application's own memory for return buffers (torusd writes into a
//!                 posted buffer, nothing else)
//! ```
//!
//! Each ring has one producer and one consumer, which share nothing but the indices: the
//! producer writes an entry, then publishes the tail with release ordering; the consumer
//! reads the tail with acquire ordering, reads the entries, then publishes its head. No
//! syscall per message: a side that goes to sleep sets its "waiting" flag first, and the
//! other side writes to its eventfd only when the flag is set.
//!
//! torusd trusts nothing in the region: every index, offset and length an application wrote
//! is checked before use, entries are copied out before they are read, and a channel whose
//! indices make no sense is closed.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// "TORUSAPP", little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TORUSAPP");
/// The layout version both sides must agree on.
pub const VERSION: u32 = 1;
/// Bytes of the header page.
pub const HEADER: usize = 4096;
/// Bytes of one ring entry.
pub const ENTRY: usize = 64;

/// Byte offsets of the header's fields.
pub mod off {
    /// u64 magic.
    pub const MAGIC: usize = 0;
    /// u32 layout version.
    pub const VERSION: usize = 8;
    /// u32 submission entries (a power of two).
    pub const SQ_ENTRIES: usize = 12;
    /// u32 completion entries (a power of two).
    pub const CQ_ENTRIES: usize = 16;
    /// u64 bytes of the TX data ring (a power of two).
    pub const TXD_SIZE: usize = 24;
    /// u64 bytes of the RX data ring (a power of two).
    pub const RXD_SIZE: usize = 32;
    /// u64 bytes of the return-buffer pool.
    pub const POOL_SIZE: usize = 40;
    /// u64 bytes of the whole region.
    pub const TOTAL: usize = 48;
    /// u32 SQ head (torusd consumes).
    pub const SQ_HEAD: usize = 64;
    /// u32 SQ tail (the application produces).
    pub const SQ_TAIL: usize = 128;
    /// u32 CQ head (the application consumes).
    pub const CQ_HEAD: usize = 192;
    /// u32 CQ tail (torusd produces).
    pub const CQ_TAIL: usize = 256;
    /// u64 TX data position torusd has consumed up to.
    pub const TXD_HEAD: usize = 320;
    /// u64 TX data position the application has written up to.
    pub const TXD_TAIL: usize = 384;
    /// u64 RX data position the application has consumed up to.
    pub const RXD_HEAD: usize = 448;
    /// u64 RX data position torusd has written up to.
    pub const RXD_TAIL: usize = 512;
    /// u32: the application sleeps on its eventfd (torusd signals after producing).
    pub const APP_WAITING: usize = 576;
    /// u32: torusd's poller sleeps (the application kicks torusd's eventfd).
    pub const TORUSD_WAITING: usize = 640;
}

/// Sizes of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Submission entries.
    pub sq_entries: u32,
    /// Completion entries.
    pub cq_entries: u32,
    /// Bytes of the TX data ring.
    pub txd_size: u64,
    /// Bytes of the RX data ring.
    pub rxd_size: u64,
    /// Bytes of the return-buffer pool.
    pub pool_size: u64,
}

impl Default for Geometry {
    /// 4096 submissions, 16384 completions, 8 MiB each way, a 16 MiB pool: about 37 MiB of
    /// address space, of which only what is used is ever backed by memory.
    fn default() -> Geometry {
        Geometry {
            sq_entries: 4096,
            cq_entries: 16384,
            txd_size: 8 << 20,
            rxd_size: 8 << 20,
            pool_size: 16 << 20,
        }
    }
}

fn page(n: u64) -> u64 {
    n.div_ceil(4096) * 4096
}

impl Geometry {
    /// Offset of the SQ.
    pub fn sq_off(&self) -> u64 {
        HEADER as u64
    }
    /// Offset of the CQ.
    pub fn cq_off(&self) -> u64 {
        self.sq_off() + page(u64::from(self.sq_entries) * ENTRY as u64)
    }
    /// Offset of the TX data ring.
    pub fn txd_off(&self) -> u64 {
        self.cq_off() + page(u64::from(self.cq_entries) * ENTRY as u64)
    }
    /// Offset of the RX data ring.
    pub fn rxd_off(&self) -> u64 {
        self.txd_off() + page(self.txd_size)
    }
    /// Offset of the pool.
    pub fn pool_off(&self) -> u64 {
        self.rxd_off() + page(self.rxd_size)
    }
    /// Bytes of the whole region.
    pub fn total(&self) -> u64 {
        self.pool_off() + page(self.pool_size)
    }

    /// Whether the sizes are ones both sides accept (powers of two, bounded).
    pub fn valid(&self) -> bool {
        let ring_ok = |n: u32| n.is_power_of_two() && (16..=1 << 20).contains(&n);
        let bytes_ok = |n: u64| n.is_power_of_two() && (1 << 16..=1 << 30).contains(&n);
        ring_ok(self.sq_entries)
            && ring_ok(self.cq_entries)
            && bytes_ok(self.txd_size)
            && bytes_ok(self.rxd_size)
            && self.pool_size <= 1 << 32
    }
}

/// Submission opcodes.
pub mod op {
    /// Send a message (or one segment of it).
    pub const SEND: u8 = 1;
    /// Post a return buffer: `buf_id`, pool offset in `aux`, length in `data_len`, cookie in
    /// `aux2`.
    pub const POST_BUFFER: u8 = 2;
    /// Take back a posted, unfilled buffer (`buf_id`).
    pub const CANCEL_BUFFER: u8 = 3;
    /// The application's verdict on frame `tag` it was shown ([`super::cq::INTERCEPTED`]):
    /// `kind` 0 let it go on, 1 let it go on with this entry's bytes as its payload, 2 drop it.
    pub const VERDICT: u8 = 4;
    /// Multicast bytes of the pool to a group: `tag` names the transfer (its report's tag),
    /// `service` is the members' service, `aux` the bytes' pool offset, `aux2` their length,
    /// `buf_id` the chunk size (0: torusd's), `total_len` the deadline in seconds (0:
    /// torusd's); the entry's data lists the members (packed coordinates, 8 bytes each;
    /// none: every other server). The bytes must stay unchanged until the report.
    pub const MULTICAST: u8 = 5;
}

/// Verdicts ([`op::VERDICT`]'s `kind`).
pub mod verdict {
    /// Let the frame go on as it is.
    pub const PASS: u8 = 0;
    /// Let it go on with the entry's bytes as its payload.
    pub const CHANGE: u8 = 1;
    /// Drop it.
    pub const DROP: u8 = 2;
}

/// Submission flags.
pub mod sflag {
    /// Reliable (else a short, best-effort message).
    pub const RELIABLE: u8 = 1;
    /// Backward fence.
    pub const BWD_FENCE: u8 = 2;
    /// Forward fence.
    pub const FWD_FENCE: u8 = 4;
    /// More segments of this message follow in the next entries.
    pub const MORE: u8 = 8;
    /// The message goes into the receiver's return buffer `buf_id` (cookie in `aux`).
    pub const INTO_BUFFER: u8 = 16;
    /// A short message to a key that services on its path may see (those that intercept).
    pub const ON_PATH: u8 = 32;
}

/// How a destination is given.
pub mod dest {
    /// A server coordinate, packed by [`super::pack_coord`].
    pub const SERVER: u8 = 0;
    /// A routing key: the message goes to the key's root.
    pub const KEY: u8 = 1;
}

/// Completion kinds.
pub mod cq {
    /// A message (or one segment of one): `peer`, `src_service`, data.
    pub const MESSAGE: u8 = 1;
    /// `count` reliable messages to `peer` acknowledged, the last tagged `tag`.
    pub const ACKED: u8 = 2;
    /// The message tagged `tag` to `peer` failed (`reason`).
    pub const FAILED: u8 = 3;
    /// `peer` restarted or reset its connection with this server (`reason`).
    pub const PEER_RESET: u8 = 4;
    /// `peer` became unreachable in this server's view.
    pub const UNREACHABLE: u8 = 5;
    /// `peer` became reachable again.
    pub const REACHABLE: u8 = 6;
    /// Return buffer `tag` was filled with `data_len` bytes by `peer`'s `src_service`.
    pub const BUFFER_FILLED: u8 = 7;
    /// The message tagged `tag`, meant for a return buffer at `peer`, found none posted (or
    /// it was too small, or taken): it was not delivered.
    pub const BUFFER_MISSED: u8 = 8;
    /// `count` incoming messages were dropped because this application did not read them.
    pub const OVERFLOW: u8 = 9;
    /// A frame of this application's service passing through this server, held for its
    /// verdict ([`super::op::VERDICT`]) until a deadline: `tag` names it, `peer` and
    /// `src_service` sent it, `count` its key (with `KEYED`), its payload in the data.
    pub const INTERCEPTED: u8 = 10;
    /// Bytes of a multicast to this application's service `dst_service`: transfer `tag`
    /// from root `peer`, at offset `extra` of `extra2` bytes in all, in order, each once.
    pub const MCAST_DATA: u8 = 11;
    /// Multicast `tag` from root `peer` ended here (`extra2` bytes in all): `reason` 0 every
    /// byte was delivered, 1 it ended short (the root gave up on this server).
    pub const MCAST_END: u8 = 12;
    /// One of this application's multicasts (its `tag`) ended: the root's report (JSON) in
    /// the data; `reason` 0 every member has every byte, 1 not.
    pub const MCAST_REPORT: u8 = 13;
}

/// Completion flags.
pub mod cflag {
    /// The message came reliably.
    pub const RELIABLE: u8 = 1;
    /// More segments of this message follow.
    pub const MORE: u8 = 8;
    /// Sent to a routing key (in `count`).
    pub const KEYED: u8 = 32;
}

/// Why a message failed (the transport's reasons, numbered).
pub mod reason {
    /// The peer restarted.
    pub const PEER_RESTARTED: u8 = 1;
    /// The peer reset the connection.
    pub const PEER_RESET: u8 = 2;
    /// The peer made no progress in time.
    pub const SILENT: u8 = 3;
    /// The peer is unreachable.
    pub const UNREACHABLE: u8 = 4;
    /// Refused (too large, malformed, too many peers).
    pub const REFUSED: u8 = 5;
    /// No service at the peer takes it (the application is not, or no longer, attached).
    pub const NO_SERVICE: u8 = 6;
    /// The application it was for had fallen behind (its backlog at the peer full): not
    /// delivered; sending again later may succeed.
    pub const RECEIVER_FULL: u8 = 7;
}

/// App message kinds, in the 4-byte header torusd puts before every app message on the torus.
pub mod kind {
    /// A plain message.
    pub const DATA: u8 = 0;
    /// A message into a return buffer: buffer id u32, cookie u64, sender's tag u64 follow.
    pub const INTO_BUFFER: u8 = 1;
    /// From torusd: the message tagged (u64 after the buffer id) found no return buffer.
    pub const BUFFER_MISSED: u8 = 2;
    /// An RPC request (the client library's framing in the data).
    pub const RPC_REQUEST: u8 = 3;
    /// An RPC reply.
    pub const RPC_REPLY: u8 = 4;
    /// A long send's offer (libRIPC): offer id u64, length u64, a read-only capability
    /// (40 bytes) for the bytes, which the receiver pulls with remote reads.
    pub const LONG_OFFER: u8 = 5;
    /// A long send's end, from its receiver: offer id u64, how it ended u8.
    pub const LONG_DONE: u8 = 6;

    /// Whether an application may send a message of kind `k` and torusd hands it to the
    /// application it is for as a message (the kinds torusd itself writes, into-buffer
    /// and buffer-missed, are not).
    pub fn is_message(k: u8) -> bool {
        matches!(k, DATA | RPC_REQUEST | RPC_REPLY | LONG_OFFER | LONG_DONE)
    }
}

/// Bytes of the app header on the torus: source service u16, kind u8, flags u8.
pub const APP_HEADER: usize = 4;
/// Extra header bytes of an into-buffer message: buffer id u32, cookie u64, tag u64.
pub const INTO_BUFFER_HEADER: usize = 20;

/// First service id given to applications; ids below are torusd's own services.
pub const FIRST_APP_SERVICE: u16 = 1024;

/// The service id a name gets, the same on every server, so that a message to a name needs
/// only the servers that host it: FNV-1a of the name, folded into the application range.
pub fn service_id(name: &str) -> u16 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let span = u32::from(u16::MAX - FIRST_APP_SERVICE) + 1;
    FIRST_APP_SERVICE + (h % span) as u16
}

/// Packs a coordinate into a u64 (x | y << 16 | z << 32).
pub fn pack_coord(x: u16, y: u16, z: u16) -> u64 {
    u64::from(x) | u64::from(y) << 16 | u64::from(z) << 32
}

/// The coordinate packed by [`pack_coord`].
pub fn unpack_coord(v: u64) -> (u16, u16, u16) {
    (v as u16, (v >> 16) as u16, (v >> 32) as u16)
}

/// A submission entry, as laid out in the SQ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Sqe {
    /// [`op`].
    pub op: u8,
    /// [`sflag`].
    pub flags: u8,
    /// [`dest`].
    pub dest_kind: u8,
    /// [`kind`] of the app message.
    pub kind: u8,
    /// Destination service id.
    pub service: u16,
    /// The sending service: 0 for the application's attach name, else one of the names it
    /// added (torusd refuses any other).
    pub src_service: u16,
    /// The application's name for the message (returned in its reports).
    pub tag: u64,
    /// The destination: a packed coordinate or a routing key.
    pub dest: u64,
    /// Where the bytes start in the TX data ring (a position, not reduced modulo the size).
    pub data_pos: u64,
    /// Bytes of this segment.
    pub data_len: u32,
    /// Bytes of the whole message (in its first segment).
    pub total_len: u32,
    /// Return buffer id.
    pub buf_id: u32,
    /// Reserved.
    pub pad2: u32,
    /// POST_BUFFER: offset in the pool; INTO_BUFFER: the buffer's cookie.
    pub aux: u64,
    /// POST_BUFFER: the cookie.
    pub aux2: u64,
}

/// A completion entry, as laid out in the CQ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Cqe {
    /// [`cq`].
    pub kind: u8,
    /// [`cflag`].
    pub flags: u8,
    /// [`kind`] of the app message.
    pub app_kind: u8,
    /// [`reason`] of a failure or reset.
    pub reason: u8,
    /// The sender's service id.
    pub src_service: u16,
    /// A message's or request's destination: which of the application's services (its
    /// attach name's, or one it added) it was sent to.
    pub dst_service: u16,
    /// The peer server, packed.
    pub peer: u64,
    /// A tag (see [`cq`]).
    pub tag: u64,
    /// A count, or the routing key of a keyed message.
    pub count: u64,
    /// Where the bytes start in the RX data ring (a position).
    pub data_pos: u64,
    /// Bytes of this segment.
    pub data_len: u32,
    /// Bytes of the whole message.
    pub total_len: u32,
    /// Reserved.
    pub extra: u64,
    /// Reserved.
    pub extra2: u64,
}

const _: () = assert!(std::mem::size_of::<Sqe>() == ENTRY);
const _: () = assert!(std::mem::size_of::<Cqe>() == ENTRY);

/// A mapped channel region, seen through raw pointers: both processes write it, so nothing
/// here hands out references into it; entries and bytes are copied in and out.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    base: *mut u8,
    len: usize,
    geo: Geometry,
}

// SAFETY: the region is shared memory accessed only through atomics and raw copies; which
// side may write what is fixed by the ring protocol, not by Rust ownership.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

/// Why a region was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    /// Too small, wrong magic or version, or sizes out of range.
    #[error("not a torusnet channel: {0}")]
    Invalid(&'static str),
}

impl Region {
    /// Views `len` mapped bytes at `base` as a channel whose header is already written.
    ///
    /// # Safety
    /// `base..base + len` must stay mapped (readable and writable) for the region's life.
    pub unsafe fn open(base: *mut u8, len: usize) -> Result<Region, RegionError> {
        if len < HEADER {
            return Err(RegionError::Invalid("shorter than its header"));
        }
        let r = Region {
            base,
            len,
            geo: Geometry::default(),
        };
        if r.load_u64_plain(off::MAGIC) != MAGIC {
            return Err(RegionError::Invalid("bad magic"));
        }
        if r.load_u32_plain(off::VERSION) != VERSION {
            return Err(RegionError::Invalid("another layout version"));
        }
        let geo = Geometry {
            sq_entries: r.load_u32_plain(off::SQ_ENTRIES),
            cq_entries: r.load_u32_plain(off::CQ_ENTRIES),
            txd_size: r.load_u64_plain(off::TXD_SIZE),
            rxd_size: r.load_u64_plain(off::RXD_SIZE),
            pool_size: r.load_u64_plain(off::POOL_SIZE),
        };
        if !geo.valid() || geo.total() > len as u64 {
            return Err(RegionError::Invalid("sizes out of range"));
        }
        Ok(Region { base, len, geo })
    }

    /// Writes a fresh header for `geo` into `len` mapped, zeroed bytes at `base`.
    ///
    /// # Safety
    /// As [`Region::open`]; nobody else may use the region yet.
    pub unsafe fn init(base: *mut u8, len: usize, geo: Geometry) -> Result<Region, RegionError> {
        if !geo.valid() || geo.total() > len as u64 {
            return Err(RegionError::Invalid("sizes out of range"));
        }
        let r = Region { base, len, geo };
        r.store_u64_plain(off::MAGIC, MAGIC);
        r.store_u32_plain(off::VERSION, VERSION);
        r.store_u32_plain(off::SQ_ENTRIES, geo.sq_entries);
        r.store_u32_plain(off::CQ_ENTRIES, geo.cq_entries);
        r.store_u64_plain(off::TXD_SIZE, geo.txd_size);
        r.store_u64_plain(off::RXD_SIZE, geo.rxd_size);
        r.store_u64_plain(off::POOL_SIZE, geo.pool_size);
        r.store_u64_plain(off::TOTAL, geo.total());
        Ok(r)
    }

    /// The sizes.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    fn load_u32_plain(&self, at: usize) -> u32 {
        self.u32(at).load(Ordering::Relaxed)
    }
    fn load_u64_plain(&self, at: usize) -> u64 {
        self.u64(at).load(Ordering::Relaxed)
    }
    fn store_u32_plain(&self, at: usize, v: u32) {
        self.u32(at).store(v, Ordering::Relaxed)
    }
    fn store_u64_plain(&self, at: usize, v: u64) {
        self.u64(at).store(v, Ordering::Relaxed)
    }

    /// The header's u32 at `at` (one of [`off`]).
    pub fn u32(&self, at: usize) -> &AtomicU32 {
        assert!(at.is_multiple_of(4) && at + 4 <= HEADER);
        // SAFETY: in bounds of the header (checked), aligned (the mapping is page-aligned),
        // and only ever accessed atomically.
        unsafe { &*(self.base.add(at) as *const AtomicU32) }
    }

    /// The header's u64 at `at` (one of [`off`]).
    pub fn u64(&self, at: usize) -> &AtomicU64 {
        assert!(at.is_multiple_of(8) && at + 8 <= HEADER);
        // SAFETY: as for `u32`.
        unsafe { &*(self.base.add(at) as *const AtomicU64) }
    }

    fn entry_ptr(&self, ring_off: u64, entries: u32, index: u32) -> *mut u8 {
        let slot = u64::from(index & (entries - 1));
        // In bounds: geometry checked against the mapping's length at open/init.
        // SAFETY: ring_off + slot * ENTRY + ENTRY <= total <= len.
        unsafe { self.base.add((ring_off + slot * ENTRY as u64) as usize) }
    }

    /// Copies SQ entry `index` (taken modulo the ring) out of the region.
    pub fn read_sqe(&self, index: u32) -> Sqe {
        let p = self.entry_ptr(self.geo.sq_off(), self.geo.sq_entries, index);
        // SAFETY: an in-bounds 64-byte slot; read unaligned-tolerant, as a copy.
        unsafe { std::ptr::read_volatile(p as *const Sqe) }
    }

    /// Writes SQ entry `index`.
    pub fn write_sqe(&self, index: u32, e: &Sqe) {
        let p = self.entry_ptr(self.geo.sq_off(), self.geo.sq_entries, index);
        // SAFETY: an in-bounds 64-byte slot this side owns until it publishes the tail.
        unsafe { std::ptr::write_volatile(p as *mut Sqe, *e) }
    }

    /// Copies CQ entry `index` out of the region.
    pub fn read_cqe(&self, index: u32) -> Cqe {
        let p = self.entry_ptr(self.geo.cq_off(), self.geo.cq_entries, index);
        // SAFETY: as for `read_sqe`.
        unsafe { std::ptr::read_volatile(p as *const Cqe) }
    }

    /// Writes CQ entry `index`.
    pub fn write_cqe(&self, index: u32, e: &Cqe) {
        let p = self.entry_ptr(self.geo.cq_off(), self.geo.cq_entries, index);
        // SAFETY: as for `write_sqe`.
        unsafe { std::ptr::write_volatile(p as *mut Cqe, *e) }
    }

    /// The byte range `[off, off + len)` of the region, if it lies inside `area` (an
    /// (offset, size) pair of the layout).
    fn span(&self, area: (u64, u64), at: u64, len: usize) -> Option<*mut u8> {
        let (a_off, a_size) = area;
        let end = at.checked_add(len as u64)?;
        if end > a_size {
            return None;
        }
        // SAFETY: area lies within the mapping (geometry checked), and [at, end) within area.
        Some(unsafe { self.base.add((a_off + at) as usize) })
    }

    /// The TX data ring as (offset, size).
    pub fn txd(&self) -> (u64, u64) {
        (self.geo.txd_off(), self.geo.txd_size)
    }
    /// The RX data ring as (offset, size).
    pub fn rxd(&self) -> (u64, u64) {
        (self.geo.rxd_off(), self.geo.rxd_size)
    }
    /// The pool as (offset, size).
    pub fn pool(&self) -> (u64, u64) {
        (self.geo.pool_off(), self.geo.pool_size)
    }

    /// Copies `out.len()` bytes from `area` at `at` into `out`; false (nothing copied) when
    /// out of bounds.
    pub fn copy_out(&self, area: (u64, u64), at: u64, out: &mut [u8]) -> bool {
        match self.span(area, at, out.len()) {
            Some(p) => {
                // SAFETY: p..p+len is inside the mapping; out is ours. The other side may be
                // writing these bytes: the copy then holds garbage, never UB of ours.
                unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
                true
            }
            None => false,
        }
    }

    /// Copies `data` into `area` at `at`; false (nothing written) when out of bounds.
    pub fn copy_in(&self, area: (u64, u64), at: u64, data: &[u8]) -> bool {
        match self.span(area, at, data.len()) {
            Some(p) => {
                // SAFETY: p..p+len is inside the mapping.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
                true
            }
            None => false,
        }
    }

    /// A pointer to `len` bytes of `area` at `at`, for a reader that owns them by protocol
    /// (the application reading its filled return buffer).
    pub fn ptr(&self, area: (u64, u64), at: u64, len: usize) -> Option<*const u8> {
        self.span(area, at, len).map(|p| p as *const u8)
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never, for a valid region).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Where a message of `len` bytes goes in a byte ring of `size` whose writer is at `tail` and
/// reader at `head` (positions): the position to write at, and the new tail; `None` when it
/// does not fit now. A message never wraps: when the end of the ring is too close, the
/// writer skips to the start (the skipped bytes are freed with the message).
pub fn byte_ring_alloc(head: u64, tail: u64, size: u64, len: u64) -> Option<(u64, u64)> {
    if len > size {
        return None;
    }
    let used = tail.checked_sub(head)?;
    if used > size {
        return None;
    }
    let at_end = size - tail % size;
    let (start, need) = if len <= at_end {
        (tail, len)
    } else {
        (tail + at_end, at_end + len)
    };
    (used + need <= size).then_some((start, start + len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_page_aligned_and_validated() {
        let g = Geometry::default();
        assert!(g.valid());
        for o in [
            g.sq_off(),
            g.cq_off(),
            g.txd_off(),
            g.rxd_off(),
            g.pool_off(),
        ] {
            assert_eq!(o % 4096, 0);
        }
        assert!(!Geometry {
            sq_entries: 1000,
            ..g
        }
        .valid());
    }

    #[test]
    fn byte_ring_never_wraps_a_message() {
        let size = 100;
        assert_eq!(byte_ring_alloc(0, 0, size, 60), Some((0, 60)));
        // 40 left at the end; 50 goes to the start once 60 are freed.
        assert_eq!(byte_ring_alloc(0, 60, size, 50), None);
        assert_eq!(byte_ring_alloc(60, 60, size, 50), Some((100, 150)));
        assert_eq!(byte_ring_alloc(0, 0, size, 101), None);
        // A corrupt head (beyond the tail) is refused.
        assert_eq!(byte_ring_alloc(70, 60, size, 1), None);
    }

    #[test]
    fn service_ids_are_stable_and_in_range() {
        assert_eq!(service_id("echo"), service_id("echo"));
        assert!(service_id("echo") >= FIRST_APP_SERVICE);
        assert_ne!(service_id("echo"), service_id("ohce"));
        assert_eq!(unpack_coord(pack_coord(1, 2, 3)), (1, 2, 3));
    }

    #[test]
    fn entries_round_trip_through_a_region() {
        let g = Geometry {
            sq_entries: 16,
            cq_entries: 16,
            txd_size: 1 << 16,
            rxd_size: 1 << 16,
            pool_size: 4096,
        };
        let mut mem = vec![0u64; g.total() as usize / 8];
        let base = mem.as_mut_ptr() as *mut u8;
        // SAFETY: `mem` outlives the region in this test.
        let r = unsafe { Region::init(base, mem.len() * 8, g) }.unwrap();
        // SAFETY: as above.
        let r2 = unsafe { Region::open(base, mem.len() * 8) }.unwrap();
        assert_eq!(r2.geometry(), g);
        let e = Sqe {
            op: op::SEND,
            tag: 7,
            data_len: 3,
            ..Sqe::default()
        };
        r.write_sqe(17, &e);
        assert_eq!(r2.read_sqe(1), e);
        assert!(r.copy_in(r.txd(), 10, b"abc"));
        let mut out = [0u8; 3];
        assert!(r2.copy_out(r2.txd(), 10, &mut out));
        assert_eq!(&out, b"abc");
        assert!(!r.copy_in(r.txd(), (1 << 16) - 1, b"ab"), "out of the area");
    }
}
