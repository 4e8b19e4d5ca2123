//! Multicast in the C ABI (`multicast.rs`'s call and events, declared in `torusnet.h`):
//! members are given as an array of `torus_addr` (their `service` ignored), the service as
//! a name; data, ends and reports arrive as `torus_event`s.

use std::ffi::{c_char, c_int};
use std::time::Duration;

use super::rmem::{region_of, torus_region};
use super::{code, guard, invalid, server as peer, str_of, torus_addr, torus_client, torus_event};
use super::{TORUS_EINVAL, TORUS_EV_MCAST_DATA, TORUS_EV_MCAST_END, TORUS_EV_MCAST_REPORT};
use crate::{Event, MulticastOptions};

/// Multicasts `len` bytes at `offset` of region `r` to the applications hosting service
/// `service` on the `n` servers of `group` (`n` 0: every other server), cut into `chunk`
/// bytes (0: torusd's), ending within `timeout_s` seconds (0: 600). The transfer's tag goes
/// to `*tag`; its end comes as `TORUS_EV_MCAST_REPORT` with that tag, and the bytes must
/// stay as they are until then.
///
/// # Safety
/// `c` live, `r` valid, `group` valid for `n` entries (or null with `n` 0), `service` a
/// NUL-terminated string, `tag` null or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn torus_multicast(
    c: *mut torus_client,
    group: *const torus_addr,
    n: usize,
    service: *const c_char,
    r: *const torus_region,
    offset: u64,
    len: u64,
    chunk: u32,
    timeout_s: u32,
    tag: *mut u64,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, each checked for null.
        let (Some(c), Some(r)) = (unsafe { c.as_ref() }, unsafe { r.as_ref() }) else {
            return invalid("null client or region");
        };
        let Some(r) = region_of(r) else {
            return invalid("not a region");
        };
        // SAFETY: by contract.
        let Some(service) = (unsafe { str_of(service) }) else {
            return invalid("service: not a string");
        };
        let members: Vec<crate::Coord> = if n == 0 {
            Vec::new()
        } else if group.is_null() || n > 1 << 16 {
            return invalid("group: null, or more than 65536 members");
        } else {
            // SAFETY: valid for n entries by contract.
            let g = unsafe { std::slice::from_raw_parts(group, n) };
            g.iter().map(|a| (a.x, a.y, a.z)).collect()
        };
        let opts = MulticastOptions {
            chunk,
            timeout: match timeout_s {
                0 => MulticastOptions::default().timeout,
                s => Duration::from_secs(u64::from(s)),
            },
        };
        match c.c.multicast(&members, service, &r, offset, len, opts) {
            Ok(t) => {
                // SAFETY: null or writable by contract.
                if let Some(o) = unsafe { tag.as_mut() } {
                    *o = t;
                }
                0
            }
            Err(e) => code(e),
        }
    })
}

/// Fills `ev` for a multicast event; the bytes for the caller's buffer, if any.
pub(super) fn fill(ev: &mut torus_event, e: &Event) -> Option<Vec<u8>> {
    match e {
        Event::MulticastData {
            id,
            root,
            to,
            offset,
            size,
            data,
        } => {
            ev.kind = TORUS_EV_MCAST_DATA;
            ev.from = peer(*root);
            ev.tag = *id;
            ev.key = *offset;
            ev.count = *size;
            ev.to = *to;
            ev.reliable = 1;
            ev.len = data.len();
            Some(data.clone())
        }
        Event::MulticastEnd {
            id,
            root,
            complete,
            size,
        } => {
            ev.kind = TORUS_EV_MCAST_END;
            ev.from = peer(*root);
            ev.tag = *id;
            ev.count = *size;
            ev.reason = c_int::from(!*complete);
            None
        }
        Event::MulticastReport(r) => {
            ev.kind = TORUS_EV_MCAST_REPORT;
            ev.tag = r.tag;
            ev.reason = c_int::from(!r.ok);
            ev.count = r.completed.len() as u64;
            ev.len = r.json.len();
            Some(r.json.clone().into_bytes())
        }
        _ => None,
    }
}
