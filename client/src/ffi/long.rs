//! Long sends in the C ABI (`long.rs`'s calls, declared in `torusnet.h`): an offer reaches
//! C as its encoded bytes in the event's buffer, and goes back to `torus_pull` or
//! `torus_decline` as those bytes.

use std::ffi::{c_int, c_void};
use std::time::Duration;

use super::rmem::{region_of, torus_region};
use super::{bytes, code, dest_of, guard, invalid, server as peer, torus_client, torus_dest};
use super::{torus_event, TORUS_EINVAL, TORUS_EV_LONG_DONE, TORUS_EV_LONG_OFFER};
use crate::{Event, LongOffer, LongOptions};

/// Offers `len` bytes at `offset` of region `r` to `d`: the receiver pulls them with remote
/// reads within `ttl_s` seconds (0: 30). The offer's id goes to `*offer`; the bytes must stay
/// until `TORUS_EV_LONG_DONE` for it (or `TORUS_EV_FAILED` with its id as tag).
///
/// # Safety
/// `c` live, `d` and `r` valid, `offer` null or writable.
#[no_mangle]
pub unsafe extern "C" fn torus_send_long(
    c: *mut torus_client,
    d: *const torus_dest,
    r: *const torus_region,
    offset: u64,
    len: u64,
    ttl_s: u32,
    offer: *mut u64,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, each checked for null.
        let (Some(c), Some(r)) = (unsafe { c.as_ref() }, unsafe { r.as_ref() }) else {
            return invalid("null client or region");
        };
        // SAFETY: by contract.
        let Some(d) = (unsafe { dest_of(d) }) else {
            return invalid("bad destination");
        };
        let Some(r) = region_of(r) else {
            return invalid("not a region");
        };
        let opts = match ttl_s {
            0 => LongOptions::default(),
            s => LongOptions {
                ttl: Duration::from_secs(u64::from(s)),
            },
        };
        match c.c.send_long(d, &r, offset, len, opts) {
            Ok(id) => {
                // SAFETY: null or writable by contract.
                if let Some(o) = unsafe { offer.as_mut() } {
                    *o = id;
                }
                0
            }
            Err(e) => code(e),
        }
    })
}

/// Pulls an offered long message (the `TORUS_EV_LONG_OFFER`'s bytes) into region `into` at
/// `at`, then tells its sender; waits at most `timeout_ms`.
///
/// # Safety
/// `c` live, `offer` valid for `offer_len` bytes, `into` valid.
#[no_mangle]
pub unsafe extern "C" fn torus_pull(
    c: *mut torus_client,
    offer: *const c_void,
    offer_len: usize,
    into: *const torus_region,
    at: u64,
    timeout_ms: c_int,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, each checked for null.
        let (Some(c), Some(into)) = (unsafe { c.as_ref() }, unsafe { into.as_ref() }) else {
            return invalid("null client or region");
        };
        // SAFETY: by contract.
        let Some(o) = (unsafe { bytes(offer, offer_len) }).and_then(LongOffer::decode) else {
            return invalid("not an offer (the TORUS_EV_LONG_OFFER event's bytes)");
        };
        let Some(into) = region_of(into) else {
            return invalid("not a region");
        };
        let t = Duration::from_millis(timeout_ms.max(1) as u64);
        match c.c.pull(&o, &into, at, t) {
            Ok(()) => 0,
            Err(e) => code(e),
        }
    })
}

/// Declines an offered long message (its sender may reuse the buffer).
///
/// # Safety
/// `c` live, `offer` valid for `offer_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn torus_decline(
    c: *mut torus_client,
    offer: *const c_void,
    offer_len: usize,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let Some(c) = (unsafe { c.as_ref() }) else {
            return invalid("null client");
        };
        // SAFETY: by contract.
        let Some(o) = (unsafe { bytes(offer, offer_len) }).and_then(LongOffer::decode) else {
            return invalid("not an offer");
        };
        match c.c.decline(&o) {
            Ok(()) => 0,
            Err(e) => code(e),
        }
    })
}

/// Fills `ev` from a long send's event; an offer's bytes are returned for the caller's
/// buffer.
pub(super) fn fill(ev: &mut torus_event, e: &Event) -> Option<Vec<u8>> {
    match e {
        Event::LongOffer(o) => {
            ev.kind = TORUS_EV_LONG_OFFER;
            ev.from = o.from.into();
            ev.tag = o.offer;
            ev.count = o.len;
            ev.reliable = 1;
            let b = o.encode();
            ev.len = b.len();
            Some(b.to_vec())
        }
        Event::LongDone {
            peer: p,
            offer,
            end,
        } => {
            ev.kind = TORUS_EV_LONG_DONE;
            if let Some(p) = p {
                ev.from = peer(*p);
            }
            ev.tag = *offer;
            ev.reason = c_int::from(end.code());
            None
        }
        _ => None,
    }
}
