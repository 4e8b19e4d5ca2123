//! Remote memory in the C ABI: regions, capabilities, one-sided writes and reads, tripwires
//! (the calls of `remote.rs`, declared in `torusnet.h`). A capability crosses the boundary as
//! its 40 encoded bytes, a region as a plain struct that the client checks against what it
//! registered before using it.

use std::ffi::{c_int, c_uint, c_void};
use std::time::{Duration, Instant};

use super::TORUS_EV_WRITTEN;
use super::{bytes, code, guard, invalid, server as peer, set_error, torus_client};
use super::{torus_event, TORUS_BWD_FENCE, TORUS_EV_REMOTE_DONE, TORUS_EV_TRIPWIRE};
use super::{TORUS_EINVAL, TORUS_ETIMEDOUT, TORUS_FWD_FENCE};
use crate::rmem::{self, Capability, Status, CAP_LEN};
use crate::{Error, Event, LocalRegion, RemoteOptions};

/// A capability: its encoding, plain bytes to pass in any message.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct torus_cap {
    /// The 40 encoded bytes.
    pub bytes: [u8; CAP_LEN],
}

impl Default for torus_cap {
    fn default() -> torus_cap {
        torus_cap {
            bytes: [0; CAP_LEN],
        }
    }
}

/// A region of this application's memory registered for remote access.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct torus_region {
    /// Its id.
    pub id: u32,
    /// Where it is in the application's pool.
    pub pool_offset: u64,
    /// Its length.
    pub len: u64,
    /// The capability for all of it.
    pub cap: torus_cap,
}

/// Remote flag: tell the region's owner when the write has landed.
pub const TORUS_NOTIFY: c_uint = 8;

fn remote_opts(flags: c_uint) -> RemoteOptions {
    RemoteOptions {
        backward_fence: flags & TORUS_BWD_FENCE != 0,
        forward_fence: flags & TORUS_FWD_FENCE != 0,
        notify: flags & TORUS_NOTIFY != 0,
    }
}

pub(super) fn region_of(r: &torus_region) -> Option<LocalRegion> {
    Some(LocalRegion {
        id: r.id,
        pool_offset: r.pool_offset,
        len: r.len,
        cap: Capability::decode(&r.cap.bytes)?,
    })
}

fn region_to_c(r: &LocalRegion) -> torus_region {
    torus_region {
        id: r.id,
        pool_offset: r.pool_offset,
        len: r.len,
        cap: torus_cap {
            bytes: r.cap.encode(),
        },
    }
}

/// # Safety
/// `p` is null or points at a `torus_cap`.
unsafe fn cap_of(p: *const torus_cap) -> Option<Capability> {
    // SAFETY: checked for null; valid by contract.
    Capability::decode(&unsafe { p.as_ref() }?.bytes)
}

/// # Safety
/// `c` is null or a live client.
unsafe fn client<'a>(c: *mut torus_client) -> Option<&'a torus_client> {
    // SAFETY: by contract.
    unsafe { c.as_ref() }
}

/// Registers `len` bytes of this application's memory as a region others may access with
/// `rights` (`TORUS_READ` | `TORUS_WRITE`); `*out` gets it with a capability for all of it.
///
/// # Safety
/// `c` live, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn torus_register_region(
    c: *mut torus_client,
    len: u64,
    rights: c_uint,
    out: *mut torus_region,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let (Some(c), Some(out)) = (unsafe { client(c) }, unsafe { out.as_mut() }) else {
            return invalid("null client or output");
        };
        let Ok(rights) = u8::try_from(rights) else {
            return invalid("rights: TORUS_READ | TORUS_WRITE");
        };
        if rights & !(rmem::READ | rmem::WRITE) != 0 {
            return invalid("rights: TORUS_READ | TORUS_WRITE");
        }
        match c.c.register_region(len, rights) {
            Ok(r) => {
                *out = region_to_c(&r);
                0
            }
            Err(e) => code(e),
        }
    })
}

/// Deregisters a region: every capability for it dies.
///
/// # Safety
/// `c` live, `r` valid.
#[no_mangle]
pub unsafe extern "C" fn torus_deregister_region(
    c: *mut torus_client,
    r: *const torus_region,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let (Some(c), Some(r)) = (unsafe { client(c) }, unsafe { r.as_ref() }) else {
            return invalid("null client or region");
        };
        let Some(r) = region_of(r) else {
            return invalid("not a region (its capability does not decode)");
        };
        match c.c.deregister_region(&r) {
            Ok(()) => 0,
            Err(e) => code(e),
        }
    })
}

/// A capability for `len` bytes at `offset` of `cap` with at most `rights`, valid for
/// `ttl_s` seconds (0: until revoked), into `*out`. Only the region's owner may narrow.
///
/// # Safety
/// `c` live, `cap` valid, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn torus_narrow(
    c: *mut torus_client,
    cap: *const torus_cap,
    offset: u64,
    len: u64,
    rights: c_uint,
    ttl_s: u32,
    out: *mut torus_cap,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let (Some(c), Some(out)) = (unsafe { client(c) }, unsafe { out.as_mut() }) else {
            return invalid("null client or output");
        };
        // SAFETY: by contract.
        let Some(cap) = (unsafe { cap_of(cap) }) else {
            return invalid("not a capability");
        };
        let Ok(rights) = u8::try_from(rights) else {
            return invalid("rights: TORUS_READ | TORUS_WRITE");
        };
        let ttl = (ttl_s > 0).then(|| Duration::from_secs(u64::from(ttl_s)));
        match c.c.narrow(&cap, offset, len, rights, ttl) {
            Ok(n) => {
                out.bytes = n.encode();
                0
            }
            Err(e) => code(e),
        }
    })
}

/// Revokes `cap` and every capability narrowed from it.
///
/// # Safety
/// `c` live, `cap` valid.
#[no_mangle]
pub unsafe extern "C" fn torus_revoke(c: *mut torus_client, cap: *const torus_cap) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let Some(c) = (unsafe { client(c) }) else {
            return invalid("null client");
        };
        // SAFETY: by contract.
        let Some(cap) = (unsafe { cap_of(cap) }) else {
            return invalid("not a capability");
        };
        match c.c.revoke(&cap) {
            Ok(()) => 0,
            Err(e) => code(e),
        }
    })
}

/// Arms a tripwire on `len` bytes at `offset` of region `r`; its id goes to `*id`
/// (`TORUS_EV_TRIPWIRE` events carry it).
///
/// # Safety
/// `c` live, `r` valid, `id` writable.
#[no_mangle]
pub unsafe extern "C" fn torus_arm_tripwire(
    c: *mut torus_client,
    r: *const torus_region,
    offset: u64,
    len: u64,
    id: *mut u64,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let (Some(c), Some(r), Some(id)) = (unsafe { client(c) }, unsafe { r.as_ref() }, unsafe {
            id.as_mut()
        }) else {
            return invalid("null client, region or id");
        };
        let Some(r) = region_of(r) else {
            return invalid("not a region");
        };
        match c.c.arm_tripwire(&r, offset, len) {
            Ok(t) => {
                *id = t;
                0
            }
            Err(e) => code(e),
        }
    })
}

/// Disarms tripwire `id` of region `r`.
///
/// # Safety
/// `c` live, `r` valid.
#[no_mangle]
pub unsafe extern "C" fn torus_disarm_tripwire(
    c: *mut torus_client,
    r: *const torus_region,
    id: u64,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let (Some(c), Some(r)) = (unsafe { client(c) }, unsafe { r.as_ref() }) else {
            return invalid("null client or region");
        };
        let Some(r) = region_of(r) else {
            return invalid("not a region");
        };
        match c.c.disarm_tripwire(&r, id) {
            Ok(()) => 0,
            Err(e) => code(e),
        }
    })
}

/// Writes `len` bytes at `offset` of the bytes `cap` grants, without the remote application
/// taking part (`TORUS_BWD_FENCE`, `TORUS_FWD_FENCE`, `TORUS_NOTIFY`); the operation's
/// handle goes to `*op`. It ends in one `TORUS_EV_REMOTE_DONE` (or `torus_wait_remote`).
///
/// # Safety
/// `c` live, `cap` valid, `data` valid for `len` bytes, `op` null or writable.
#[no_mangle]
pub unsafe extern "C" fn torus_remote_write(
    c: *mut torus_client,
    cap: *const torus_cap,
    offset: u64,
    data: *const c_void,
    len: usize,
    flags: c_uint,
    op: *mut u64,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, each checked for null.
        let Some(c) = (unsafe { client(c) }) else {
            return invalid("null client");
        };
        // SAFETY: by contract.
        let Some(cap) = (unsafe { cap_of(cap) }) else {
            return invalid("not a capability");
        };
        // SAFETY: by contract.
        let Some(data) = (unsafe { bytes(data, len) }) else {
            return invalid("null data");
        };
        match c.c.remote_write(&cap, offset, data, remote_opts(flags)) {
            Ok(h) => {
                // SAFETY: null or writable by contract.
                if let Some(o) = unsafe { op.as_mut() } {
                    *o = h;
                }
                0
            }
            Err(e) => code(e),
        }
    })
}

/// Reads `len` bytes at `offset` of the bytes `cap` grants into this application's region
/// `into` at `at`; the handle goes to `*op`.
///
/// # Safety
/// `c` live, `cap` and `into` valid, `op` null or writable.
#[no_mangle]
pub unsafe extern "C" fn torus_remote_read(
    c: *mut torus_client,
    cap: *const torus_cap,
    offset: u64,
    len: u64,
    into: *const torus_region,
    at: u64,
    flags: c_uint,
    op: *mut u64,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, each checked for null.
        let (Some(c), Some(into)) = (unsafe { client(c) }, unsafe { into.as_ref() }) else {
            return invalid("null client or region");
        };
        // SAFETY: by contract.
        let Some(cap) = (unsafe { cap_of(cap) }) else {
            return invalid("not a capability");
        };
        let Some(into) = region_of(into) else {
            return invalid("not a region");
        };
        match c
            .c
            .remote_read(&cap, offset, len, &into, at, remote_opts(flags))
        {
            Ok(h) => {
                // SAFETY: null or writable by contract.
                if let Some(o) = unsafe { op.as_mut() } {
                    *o = h;
                }
                0
            }
            Err(e) => code(e),
        }
    })
}

/// Waits up to `timeout_ms` (negative: up to the operation's own deadline) for remote
/// operation `op` to end: 0 with its `TORUS_RM_*` status in `*status` and the bytes it moved
/// in `*moved`, or `TORUS_ETIMEDOUT`. Other events meanwhile are kept for `torus_recv`.
///
/// # Safety
/// `c` live, `status` and `moved` null or writable.
#[no_mangle]
pub unsafe extern "C" fn torus_wait_remote(
    c: *mut torus_client,
    op: u64,
    timeout_ms: c_int,
    status: *mut c_int,
    moved: *mut u64,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let Some(c) = (unsafe { client(c) }) else {
            return invalid("null client");
        };
        // Every operation ends by torusd's deadline (10 s); a little more covers the
        // completion's way back.
        let limit = if timeout_ms < 0 {
            Duration::from_secs(15)
        } else {
            Duration::from_millis(timeout_ms as u64)
        };
        let start = Instant::now();
        match c.c.wait_remote(op, limit) {
            Ok((s, n)) => {
                // SAFETY: null or writable by contract.
                if let Some(o) = unsafe { status.as_mut() } {
                    *o = s as c_int;
                }
                // SAFETY: as above.
                if let Some(o) = unsafe { moved.as_mut() } {
                    *o = n;
                }
                0
            }
            Err(Error::Timeout) => {
                set_error(&format!(
                    "operation {op} did not end within {:?}",
                    start.elapsed()
                ));
                TORUS_ETIMEDOUT
            }
            Err(e) => code(e),
        }
    })
}

/// A remote-memory status's name (`"ok"`, `"revoked"`, ...; never null).
#[no_mangle]
pub extern "C" fn torus_rm_status_name(status: c_int) -> *const std::ffi::c_char {
    u8::try_from(status)
        .map_or(Status::Invalid, Status::from_code)
        .c_name()
        .as_ptr()
}

/// Copies `len` bytes into this application's own region `r` at `offset`.
///
/// # Safety
/// `c` live, `r` valid, `data` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn torus_region_write(
    c: *mut torus_client,
    r: *const torus_region,
    offset: u64,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let (Some(c), Some(r)) = (unsafe { client(c) }, unsafe { r.as_ref() }) else {
            return invalid("null client or region");
        };
        // SAFETY: by contract.
        let Some(data) = (unsafe { bytes(data, len) }) else {
            return invalid("null data");
        };
        match region_of(r) {
            Some(r) if c.c.region_write(&r, offset, data) => 0,
            _ => invalid("not a registered region, or the bytes do not fit it"),
        }
    })
}

/// Copies `len` bytes out of this application's own region `r` at `offset`.
///
/// # Safety
/// `c` live, `r` valid, `out` writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn torus_region_read(
    c: *mut torus_client,
    r: *const torus_region,
    offset: u64,
    out: *mut c_void,
    len: usize,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let (Some(c), Some(r)) = (unsafe { client(c) }, unsafe { r.as_ref() }) else {
            return invalid("null client or region");
        };
        if out.is_null() && len > 0 {
            return invalid("null output");
        }
        let mut buf = vec![0u8; len];
        match region_of(r) {
            Some(r) if c.c.region_read(&r, offset, &mut buf) => {
                if len > 0 {
                    // SAFETY: out writable for len bytes by contract.
                    unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), out.cast(), len) };
                }
                0
            }
            _ => invalid("not a registered region, or the bytes do not fit it"),
        }
    })
}

/// Fills `ev` from a remote-memory event.
pub(super) fn fill(ev: &mut torus_event, e: &Event) {
    match e {
        Event::RemoteDone { op, status, bytes } => {
            ev.kind = TORUS_EV_REMOTE_DONE;
            ev.tag = *op;
            ev.reason = *status as c_int;
            ev.count = *bytes;
        }
        Event::Tripwire {
            id,
            region,
            offset,
            len,
            from,
        } => {
            ev.kind = TORUS_EV_TRIPWIRE;
            ev.from = peer(*from);
            ev.tag = *id;
            ev.key = u64::from(*region);
            ev.count = *offset;
            ev.len = *len as usize;
        }
        Event::Written {
            region,
            offset,
            len,
            from,
        } => {
            ev.kind = TORUS_EV_WRITTEN;
            ev.from = peer(*from);
            ev.key = u64::from(*region);
            ev.count = *offset;
            ev.len = *len as usize;
        }
        _ => {}
    }
}
