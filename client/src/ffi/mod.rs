//! The C ABI over [`Client`], declared in `client/include/torusnet.h` (remote memory in
//! `rmem`). Every function checks its pointers, never unwinds across the boundary, and
//! returns a negative `TORUS_E*` code on failure, with a message for [`torus_last_error`].

// The C names are the ABI.
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::time::Duration;

use crate::{Address, Client, Dest, Error, Event, FailReason, ReturnBuffer, SendOptions, Wait};

mod long;
mod multicast;
mod queue;
mod rmem;
pub use long::*;
pub use queue::*;
pub use rmem::*;

/// Would block: the channel is full.
pub const TORUS_EAGAIN: c_int = -1;
/// Timed out.
pub const TORUS_ETIMEDOUT: c_int = -2;
/// torusd refused (see `torus_last_error`).
pub const TORUS_EREFUSED: c_int = -3;
/// The event's data does not fit the buffer given: call again with `ev->len` bytes.
pub const TORUS_ETOOBIG: c_int = -4;
/// No server hosts the name.
pub const TORUS_ENOTFOUND: c_int = -5;
/// torusd closed the channel.
pub const TORUS_ECLOSED: c_int = -6;
/// A bad argument.
pub const TORUS_EINVAL: c_int = -7;
/// An I/O error.
pub const TORUS_EIO: c_int = -8;

/// A service on a server.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct torus_addr {
    /// Server x.
    pub x: u16,
    /// Server y.
    pub y: u16,
    /// Server z.
    pub z: u16,
    /// Service id.
    pub service: u16,
}

impl From<Address> for torus_addr {
    fn from(a: Address) -> torus_addr {
        torus_addr {
            x: a.server.0,
            y: a.server.1,
            z: a.server.2,
            service: a.service,
        }
    }
}

impl From<torus_addr> for Address {
    fn from(a: torus_addr) -> Address {
        Address {
            server: (a.x, a.y, a.z),
            service: a.service,
        }
    }
}

/// Destination kinds.
pub const TORUS_DEST_SERVICE: c_int = 0;
/// To the root of a routing key.
pub const TORUS_DEST_KEY: c_int = 1;
/// To a service by name.
pub const TORUS_DEST_NAME: c_int = 2;

/// Where a message goes.
#[repr(C)]
#[derive(Debug)]
pub struct torus_dest {
    /// `TORUS_DEST_*`.
    pub kind: c_int,
    /// For `TORUS_DEST_SERVICE`.
    pub addr: torus_addr,
    /// For `TORUS_DEST_KEY`: the routing key.
    pub key: u64,
    /// For `TORUS_DEST_KEY`: the service there.
    pub key_service: u16,
    /// For `TORUS_DEST_NAME`: a NUL-terminated name.
    pub name: *const c_char,
}

/// Send flags.
pub const TORUS_RELIABLE: c_uint = 1;
/// Backward fence.
pub const TORUS_BWD_FENCE: c_uint = 2;
/// Forward fence.
pub const TORUS_FWD_FENCE: c_uint = 4;
/// Services intercepting it on the path see it (short messages to a key).
pub const TORUS_ON_PATH: c_uint = 16;

/// Event kinds.
pub const TORUS_EV_MESSAGE: c_int = 1;
/// A request to answer with `torus_respond`.
pub const TORUS_EV_REQUEST: c_int = 2;
/// Messages acknowledged.
pub const TORUS_EV_ACKED: c_int = 3;
/// A message failed.
pub const TORUS_EV_FAILED: c_int = 4;
/// A server restarted or reset.
pub const TORUS_EV_PEER_RESET: c_int = 5;
/// A server became unreachable.
pub const TORUS_EV_UNREACHABLE: c_int = 6;
/// A server became reachable.
pub const TORUS_EV_REACHABLE: c_int = 7;
/// A return buffer was filled.
pub const TORUS_EV_BUFFER_FILLED: c_int = 8;
/// A message into a return buffer found none.
pub const TORUS_EV_BUFFER_MISSED: c_int = 9;
/// Incoming messages were dropped.
pub const TORUS_EV_OVERFLOW: c_int = 10;
/// A remote-memory operation ended: tag = its handle, reason = its status, count = bytes.
pub const TORUS_EV_REMOTE_DONE: c_int = 11;
/// A remote write touched tripwire tag: key = region, count = offset, len = length.
pub const TORUS_EV_TRIPWIRE: c_int = 12;
/// A remote write with notification landed: key = region, count = offset, len = length.
pub const TORUS_EV_WRITTEN: c_int = 13;
/// A long message offered: from, tag = offer id, count = its length; the offer's bytes
/// (`len` of them) in the buffer, for `torus_pull` or `torus_decline`.
pub const TORUS_EV_LONG_OFFER: c_int = 14;
/// One of this application's long sends ended: tag = offer id, reason = `TORUS_LONG_*`.
pub const TORUS_EV_LONG_DONE: c_int = 15;
/// A frame of this application's service on its way through this server, held for
/// `torus_verdict`: tag = its id, from, key (keyed), its payload in the buffer.
pub const TORUS_EV_INTERCEPTED: c_int = 16;
/// Bytes of a multicast to this application: from = its root, tag = the transfer, key = the
/// bytes' offset in it, count = its size, to = the service; the bytes in the buffer, in
/// order, each once.
pub const TORUS_EV_MCAST_DATA: c_int = 17;
/// A multicast to this application ended here: from = root, tag = the transfer, count =
/// its size, reason 0 every byte delivered, 1 it ended short.
pub const TORUS_EV_MCAST_END: c_int = 18;
/// One of this application's multicasts ended: tag = its tag (`torus_multicast`'s), reason
/// 0 every member has every byte, 1 not, count = members complete; the root's report
/// (JSON, per member) in the buffer.
pub const TORUS_EV_MCAST_REPORT: c_int = 19;

/// Verdicts: the frame goes on as it was.
pub const TORUS_PASS: c_int = 0;
/// It goes on with the given payload.
pub const TORUS_CHANGE: c_int = 1;
/// It is dropped.
pub const TORUS_DROP: c_int = 2;

/// An event, as `torus_recv` fills it.
#[repr(C)]
#[derive(Debug, Default)]
pub struct torus_event {
    /// `TORUS_EV_*`.
    pub kind: c_int,
    /// The sender (message, request, buffer filled), or the server concerned.
    pub from: torus_addr,
    /// Acked: last tag; failed, missed: the tag; request: the call; buffer: its id.
    pub tag: u64,
    /// Acked: how many; overflow: dropped.
    pub count: u64,
    /// A keyed message's routing key.
    pub key: u64,
    /// Whether `key` is set.
    pub keyed: c_int,
    /// A reliable message.
    pub reliable: c_int,
    /// Failure reason: 1 restarted, 2 reset, 3 silent, 4 unreachable, 5 refused, 6 no
    /// service, 7 receiver full (the `TORUS_*` reasons of the header).
    pub reason: c_int,
    /// A message's or request's destination: which of this application's services (its
    /// attach name's or an added one's id). In what was the padding before `len`, so the
    /// struct's size and layout are those of the first ABI.
    pub to: u16,
    /// Bytes of the message (copied into the caller's buffer), or of the filled buffer.
    pub len: usize,
}

// The first ABI's layout (on 64-bit targets): `to` took padding, nothing moved.
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(std::mem::size_of::<torus_event>() == 64);
    assert!(std::mem::offset_of!(torus_event, len) == 56);
};

/// A posted return buffer's descriptor.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct torus_buffer {
    /// Where it is.
    pub owner: torus_addr,
    /// Its id.
    pub id: u32,
    /// Its size.
    pub len: u32,
    /// Its secret.
    pub cookie: u64,
}

/// A client as C sees it: the Rust client and an event that did not fit the caller's buffer.
pub struct torus_client {
    c: Client,
    held: Option<Event>,
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

fn code(e: Error) -> c_int {
    set_error(&e.to_string());
    match e {
        Error::WouldBlock => TORUS_EAGAIN,
        Error::Timeout => TORUS_ETIMEDOUT,
        Error::Refused(_) => TORUS_EREFUSED,
        Error::TooLarge(_) => TORUS_ETOOBIG,
        Error::NotFound(_) => TORUS_ENOTFOUND,
        Error::Closed => TORUS_ECLOSED,
        Error::Io(_) => TORUS_EIO,
    }
}

fn invalid(what: &str) -> c_int {
    set_error(what);
    TORUS_EINVAL
}

fn wait_of(timeout_ms: c_int) -> Wait {
    match timeout_ms {
        t if t < 0 => Wait::Forever,
        0 => Wait::NoWait,
        t => Wait::Timeout(Duration::from_millis(t as u64)),
    }
}

/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn str_of<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// # Safety
/// `d` is null or points at a valid `torus_dest`.
unsafe fn dest_of(d: *const torus_dest) -> Option<Dest> {
    // SAFETY: checked for null; valid by contract.
    let d = unsafe { d.as_ref() }?;
    match d.kind {
        TORUS_DEST_SERVICE => Some(Dest::Service(d.addr.into())),
        TORUS_DEST_KEY => Some(Dest::Key {
            key: d.key,
            service: d.key_service,
        }),
        // SAFETY: `name` is a NUL-terminated string by contract.
        TORUS_DEST_NAME => Some(Dest::Name(unsafe { str_of(d.name) }?.to_string())),
        _ => None,
    }
}

/// # Safety
/// `p` is null or valid for `len` bytes.
unsafe fn bytes<'a>(p: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and valid for len bytes by contract.
    Some(unsafe { std::slice::from_raw_parts(p.cast(), len) })
}

fn opts(flags: c_uint) -> SendOptions {
    // The sending service rides in the upper half (`TORUS_FROM(service)`).
    let from = (flags >> 16) as u16;
    SendOptions {
        reliable: flags & TORUS_RELIABLE != 0,
        backward_fence: flags & TORUS_BWD_FENCE != 0,
        forward_fence: flags & TORUS_FWD_FENCE != 0,
        tag: None,
        from: (from != 0).then_some(from),
        on_path: flags & TORUS_ON_PATH != 0,
    }
}

fn guard<T>(default: T, f: impl FnOnce() -> T) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_error("internal error (panic) in the torusnet client");
        default
    })
}

/// The last error's message on this thread (never null).
#[no_mangle]
pub extern "C" fn torus_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// Attaches to torusd's application socket `socket` as service `name`; null on error.
///
/// # Safety
/// `socket` and `name` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn torus_attach(
    socket: *const c_char,
    name: *const c_char,
) -> *mut torus_client {
    // SAFETY: by contract.
    unsafe { attach_with(socket, name, crate::AttachOptions::default()) }
}

/// # Safety
/// `socket` and `name` are null or NUL-terminated strings.
unsafe fn attach_with(
    socket: *const c_char,
    name: *const c_char,
    opts: crate::AttachOptions,
) -> *mut torus_client {
    guard(std::ptr::null_mut(), || {
        // SAFETY: the caller passes NUL-terminated strings.
        let (Some(s), Some(n)) = (unsafe { str_of(socket) }, unsafe { str_of(name) }) else {
            set_error("socket and name must be UTF-8 strings");
            return std::ptr::null_mut();
        };
        match Client::attach_with(s, n, opts) {
            Ok(c) => Box::into_raw(Box::new(torus_client { c, held: None })),
            Err(e) => {
                code(e);
                std::ptr::null_mut()
            }
        }
    })
}

/// Attaches as `torus_attach` does, with a pool of `pool` bytes (return buffers, regions
/// and long sends live there; torusd caps it at its `[apps] max_pool_mib`).
///
/// # Safety
/// `socket` and `name` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn torus_attach_pool(
    socket: *const c_char,
    name: *const c_char,
    pool: u64,
) -> *mut torus_client {
    // SAFETY: by contract.
    unsafe { attach_with(socket, name, crate::AttachOptions { pool }) }
}

/// Detaches and frees the client (its service is unregistered).
///
/// # Safety
/// `c` came from `torus_attach` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn torus_detach(c: *mut torus_client) {
    if !c.is_null() {
        // SAFETY: by contract `c` came from Box::into_raw in torus_attach.
        drop(unsafe { Box::from_raw(c) });
    }
}

/// This client's own address (its server and service id).
///
/// # Safety
/// `c` is a live client.
#[no_mangle]
pub unsafe extern "C" fn torus_address(c: *const torus_client) -> torus_addr {
    // SAFETY: valid by contract (null gives a zero address).
    match unsafe { c.as_ref() } {
        Some(c) => c.c.address().into(),
        None => torus_addr::default(),
    }
}

/// Sends a message (`TORUS_RELIABLE`, fences); its tag goes to `*tag` if not null.
///
/// # Safety
/// `c` is a live client, `d` a valid destination, `data` valid for `len` bytes, `tag` null
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn torus_send(
    c: *mut torus_client,
    d: *const torus_dest,
    data: *const c_void,
    len: usize,
    flags: c_uint,
    tag: *mut u64,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: all by the caller's contract, each checked for null.
        let Some(c) = (unsafe { c.as_mut() }) else {
            return invalid("null client");
        };
        let Some(d) = (unsafe { dest_of(d) }) else {
            return invalid("bad destination");
        };
        let Some(data) = (unsafe { bytes(data, len) }) else {
            return invalid("null data");
        };
        match c.c.send(d, data, opts(flags)) {
            Ok(t) => {
                // SAFETY: null or writable by contract.
                if let Some(out) = unsafe { tag.as_mut() } {
                    *out = t;
                }
                0
            }
            Err(e) => code(e),
        }
    })
}

/// A server as an address (service 0).
fn server(p: (u16, u16, u16)) -> torus_addr {
    torus_addr {
        x: p.0,
        y: p.1,
        z: p.2,
        service: 0,
    }
}

fn fill(ev: &mut torus_event, e: &Event) -> Option<Vec<u8>> {
    *ev = torus_event::default();
    let peer = server;
    let reason = |r: FailReason| i32::from(r.code());
    match e {
        Event::Message {
            from,
            data,
            reliable,
            key,
            to,
        } => {
            ev.kind = TORUS_EV_MESSAGE;
            ev.from = (*from).into();
            ev.reliable = c_int::from(*reliable);
            ev.keyed = c_int::from(key.is_some());
            ev.key = key.unwrap_or(0);
            ev.to = *to;
            ev.len = data.len();
            return Some(data.clone());
        }
        Event::Request {
            from,
            call,
            data,
            to,
        } => {
            ev.kind = TORUS_EV_REQUEST;
            ev.from = (*from).into();
            ev.to = *to;
            ev.tag = *call;
            ev.reliable = 1;
            ev.len = data.len();
            return Some(data.clone());
        }
        Event::Acked {
            peer: p,
            count,
            last_tag,
        } => {
            ev.kind = TORUS_EV_ACKED;
            ev.from = peer(*p);
            ev.count = *count;
            ev.tag = *last_tag;
        }
        Event::Failed {
            peer: p,
            tag,
            reason: r,
        } => {
            ev.kind = TORUS_EV_FAILED;
            ev.from = peer(*p);
            ev.tag = *tag;
            ev.reason = reason(*r);
        }
        Event::PeerReset { peer: p, reason: r } => {
            ev.kind = TORUS_EV_PEER_RESET;
            ev.from = peer(*p);
            ev.reason = reason(*r);
        }
        Event::Unreachable(p) => {
            ev.kind = TORUS_EV_UNREACHABLE;
            ev.from = peer(*p);
        }
        Event::Reachable(p) => {
            ev.kind = TORUS_EV_REACHABLE;
            ev.from = peer(*p);
        }
        Event::BufferFilled { buffer, len, from } => {
            ev.kind = TORUS_EV_BUFFER_FILLED;
            ev.from = (*from).into();
            ev.tag = u64::from(*buffer);
            ev.len = *len;
        }
        Event::BufferMissed { peer: p, tag } => {
            ev.kind = TORUS_EV_BUFFER_MISSED;
            ev.from = peer(*p);
            ev.tag = *tag;
        }
        Event::Overflow { dropped } => {
            ev.kind = TORUS_EV_OVERFLOW;
            ev.count = *dropped;
        }
        Event::RemoteDone { .. } | Event::Tripwire { .. } | Event::Written { .. } => {
            rmem::fill(ev, e);
        }
        Event::LongOffer(_) | Event::LongDone { .. } => return long::fill(ev, e),
        Event::MulticastData { .. } | Event::MulticastEnd { .. } | Event::MulticastReport(_) => {
            return multicast::fill(ev, e)
        }
        Event::Intercepted {
            id,
            from,
            key,
            data,
        } => {
            ev.kind = TORUS_EV_INTERCEPTED;
            ev.from = (*from).into();
            ev.tag = *id;
            ev.keyed = c_int::from(key.is_some());
            ev.key = key.unwrap_or(0);
            ev.len = data.len();
            return Some(data.clone());
        }
    }
    None
}

/// Receives the next event: 1 with `*ev` filled (a message's bytes copied into `buf`),
/// 0 when nothing came within `timeout_ms` (0: do not wait, negative: no limit), or an
/// error. `TORUS_ETOOBIG`: the message needs `ev->len` bytes; it is kept for the next call.
///
/// # Safety
/// `c` is a live client, `ev` writable, `buf` null or writable for `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn torus_recv(
    c: *mut torus_client,
    ev: *mut torus_event,
    buf: *mut c_void,
    cap: usize,
    timeout_ms: c_int,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let Some(c) = (unsafe { c.as_mut() }) else {
            return invalid("null client");
        };
        let Some(ev) = (unsafe { ev.as_mut() }) else {
            return invalid("null event");
        };
        let e = match c.held.take() {
            Some(e) => e,
            None => match c.c.recv(wait_of(timeout_ms)) {
                Ok(Some(e)) => e,
                Ok(None) => return 0,
                Err(e) => return code(e),
            },
        };
        if let Some(data) = fill(ev, &e) {
            if data.len() > cap || (buf.is_null() && !data.is_empty()) {
                c.held = Some(e);
                set_error("the message does not fit the buffer");
                return TORUS_ETOOBIG;
            }
            if !data.is_empty() {
                // SAFETY: buf is writable for cap >= data.len() bytes by contract.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.cast(), data.len()) };
            }
        }
        1
    })
}

/// Resolves service `name`: fills up to `max` addresses, returns how many (0: none).
///
/// # Safety
/// `c` is a live client, `name` a NUL-terminated string, `out` writable for `max` entries.
#[no_mangle]
pub unsafe extern "C" fn torus_resolve(
    c: *mut torus_client,
    name: *const c_char,
    out: *mut torus_addr,
    max: usize,
    timeout_ms: c_int,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let Some(c) = (unsafe { c.as_ref() }) else {
            return invalid("null client");
        };
        let Some(n) = (unsafe { str_of(name) }) else {
            return invalid("bad name");
        };
        if out.is_null() && max > 0 {
            return invalid("null output");
        }
        match c
            .c
            .resolve(n, Duration::from_millis(timeout_ms.max(1) as u64))
        {
            Ok(v) => {
                let k = v.len().min(max);
                for (i, a) in v.iter().take(k).enumerate() {
                    // SAFETY: out is writable for max >= k entries.
                    unsafe { *out.add(i) = (*a).into() };
                }
                k as c_int
            }
            Err(e) => code(e),
        }
    })
}

/// Adds service name `name` to this application; its service id goes to `*service`.
///
/// # Safety
/// `c` is a live client, `name` a NUL-terminated string, `service` null or writable.
#[no_mangle]
pub unsafe extern "C" fn torus_add_name(
    c: *mut torus_client,
    name: *const c_char,
    service: *mut u16,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let Some(c) = (unsafe { c.as_ref() }) else {
            return invalid("null client");
        };
        let Some(n) = (unsafe { str_of(name) }) else {
            return invalid("bad name");
        };
        match c.c.add_name(n) {
            Ok(id) => {
                // SAFETY: null or writable by contract.
                if let Some(o) = unsafe { service.as_mut() } {
                    *o = id;
                }
                0
            }
            Err(e) => code(e),
        }
    })
}

/// Intercepts (`on` non-zero) or stops intercepting this application's service on the
/// path: its frames sent with `TORUS_ON_PATH` that pass through this server come as
/// `TORUS_EV_INTERCEPTED` for a verdict.
///
/// # Safety
/// `c` is a live client.
#[no_mangle]
pub unsafe extern "C" fn torus_intercept(c: *mut torus_client, on: c_int) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let Some(c) = (unsafe { c.as_ref() }) else {
            return invalid("null client");
        };
        match c.c.intercept(on != 0) {
            Ok(()) => 0,
            Err(e) => code(e),
        }
    })
}

/// The verdict on intercepted frame `id`: `TORUS_PASS`, `TORUS_CHANGE` (with `len` bytes of
/// new payload at `data`) or `TORUS_DROP`.
///
/// # Safety
/// `c` is a live client, `data` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn torus_verdict(
    c: *mut torus_client,
    id: u64,
    verdict: c_int,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let Some(c) = (unsafe { c.as_ref() }) else {
            return invalid("null client");
        };
        // SAFETY: by contract.
        let Some(data) = (unsafe { bytes(data, len) }) else {
            return invalid("null data");
        };
        let v = match verdict {
            TORUS_PASS => crate::OnPath::Pass,
            TORUS_CHANGE => crate::OnPath::Change(data),
            TORUS_DROP => crate::OnPath::Drop,
            _ => return invalid("verdict: TORUS_PASS, TORUS_CHANGE or TORUS_DROP"),
        };
        match c.c.verdict(id, v) {
            Ok(()) => 0,
            Err(e) => code(e),
        }
    })
}

/// Forgets what `torus_resolve` (or a send to a name) cached for `name`.
///
/// # Safety
/// `c` is a live client, `name` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn torus_forget(c: *mut torus_client, name: *const c_char) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let Some(c) = (unsafe { c.as_ref() }) else {
            return invalid("null client");
        };
        let Some(n) = (unsafe { str_of(name) }) else {
            return invalid("bad name");
        };
        c.c.forget(n);
        0
    })
}

/// Sends a request and waits for its reply, copied into `resp` (its length in
/// `*resp_len`); `TORUS_ETOOBIG` when it does not fit (`*resp_len` says how much it needs).
///
/// # Safety
/// `c` live, `d` valid, `req` valid for `len` bytes, `resp` writable for `cap` bytes,
/// `resp_len` writable.
#[no_mangle]
pub unsafe extern "C" fn torus_call(
    c: *mut torus_client,
    d: *const torus_dest,
    req: *const c_void,
    len: usize,
    resp: *mut c_void,
    cap: usize,
    resp_len: *mut usize,
    timeout_ms: c_int,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, each checked for null.
        let Some(c) = (unsafe { c.as_ref() }) else {
            return invalid("null client");
        };
        let Some(d) = (unsafe { dest_of(d) }) else {
            return invalid("bad destination");
        };
        let Some(req) = (unsafe { bytes(req, len) }) else {
            return invalid("null request");
        };
        let Some(rl) = (unsafe { resp_len.as_mut() }) else {
            return invalid("null resp_len");
        };
        match c
            .c
            .call(d, req, Duration::from_millis(timeout_ms.max(1) as u64))
        {
            Ok(r) => {
                *rl = r.len();
                if r.len() > cap || (resp.is_null() && !r.is_empty()) {
                    set_error("the reply does not fit the buffer");
                    return TORUS_ETOOBIG;
                }
                if !r.is_empty() {
                    // SAFETY: resp writable for cap >= r.len() bytes.
                    unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), resp.cast(), r.len()) };
                }
                0
            }
            Err(e) => code(e),
        }
    })
}

/// Answers request `call` from `to` (a `TORUS_EV_REQUEST`'s `from` and `tag`).
///
/// # Safety
/// `c` live, `data` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn torus_respond(
    c: *mut torus_client,
    to: torus_addr,
    call: u64,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract.
        let Some(c) = (unsafe { c.as_ref() }) else {
            return invalid("null client");
        };
        let Some(data) = (unsafe { bytes(data, len) }) else {
            return invalid("null data");
        };
        match c.c.respond(to.into(), call, data) {
            Ok(_) => 0,
            Err(e) => code(e),
        }
    })
}

/// Asks for (or stops) `TORUS_EV_ACKED` reports.
///
/// # Safety
/// `c` live.
#[no_mangle]
pub unsafe extern "C" fn torus_notify_acks(c: *mut torus_client, on: c_int) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract.
        let Some(c) = (unsafe { c.as_ref() }) else {
            return invalid("null client");
        };
        match c.c.notify_acks(on != 0) {
            Ok(()) => 0,
            Err(e) => code(e),
        }
    })
}

/// Asks for fair-queuing weight `weight`; the weight granted (at most the node file's
/// `[apps] max_weight`) goes to `*granted`.
///
/// # Safety
/// `c` live, `granted` writable.
#[no_mangle]
pub unsafe extern "C" fn torus_request_weight(
    c: *mut torus_client,
    weight: u32,
    granted: *mut u32,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract.
        let Some(c) = (unsafe { c.as_ref() }) else {
            return invalid("null client");
        };
        if granted.is_null() {
            return invalid("null granted");
        }
        match c.c.request_weight(weight) {
            Ok(w) => {
                // SAFETY: checked non-null; writable by contract.
                unsafe { granted.write(w) };
                0
            }
            Err(e) => code(e),
        }
    })
}

/// Posts a return buffer of `len` bytes; its descriptor goes to `*out`.
///
/// # Safety
/// `c` live, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn torus_post_buffer(
    c: *mut torus_client,
    len: u32,
    out: *mut torus_buffer,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract.
        let Some(c) = (unsafe { c.as_ref() }) else {
            return invalid("null client");
        };
        let Some(out) = (unsafe { out.as_mut() }) else {
            return invalid("null output");
        };
        match c.c.post_buffer(len) {
            Ok(b) => {
                *out = torus_buffer {
                    owner: b.owner.into(),
                    id: b.id,
                    len: b.len,
                    cookie: b.cookie,
                };
                0
            }
            Err(e) => code(e),
        }
    })
}

/// Sends a message into another application's return buffer `b`.
///
/// # Safety
/// `c` live, `b` valid, `data` valid for `len` bytes, `tag` null or writable.
#[no_mangle]
pub unsafe extern "C" fn torus_send_to_buffer(
    c: *mut torus_client,
    b: *const torus_buffer,
    data: *const c_void,
    len: usize,
    flags: c_uint,
    tag: *mut u64,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let Some(c) = (unsafe { c.as_ref() }) else {
            return invalid("null client");
        };
        let Some(b) = (unsafe { b.as_ref() }) else {
            return invalid("null buffer");
        };
        let Some(data) = (unsafe { bytes(data, len) }) else {
            return invalid("null data");
        };
        let rb = ReturnBuffer {
            owner: b.owner.into(),
            id: b.id,
            len: b.len,
            cookie: b.cookie,
        };
        match c.c.send_to_buffer(&rb, data, opts(flags)) {
            Ok(t) => {
                // SAFETY: null or writable.
                if let Some(o) = unsafe { tag.as_mut() } {
                    *o = t;
                }
                0
            }
            Err(e) => code(e),
        }
    })
}

/// Copies filled return buffer `id` (`len` bytes, from its `TORUS_EV_BUFFER_FILLED`) into
/// `out` and frees it for another posting.
///
/// # Safety
/// `c` live, `out` writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn torus_read_buffer(
    c: *mut torus_client,
    id: u32,
    out: *mut c_void,
    len: usize,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract.
        let Some(c) = (unsafe { c.as_ref() }) else {
            return invalid("null client");
        };
        if out.is_null() && len > 0 {
            return invalid("null output");
        }
        let copied = c.c.with_buffer(id, len, |b| {
            if !b.is_empty() {
                // SAFETY: out writable for len >= b.len() bytes.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out.cast(), b.len()) };
            }
            b.len()
        });
        match copied {
            Some(n) => n as c_int,
            None => invalid("no filled buffer with that id"),
        }
    })
}
