//! CLAN's message queue in the C ABI (`crate::queue`, declared in `torusnet.h`). A queue
//! takes its client's events while it waits, so each end attaches a client of its own and
//! owns it: freeing the end detaches it.

use std::ffi::{c_char, c_int, c_void};
use std::mem::ManuallyDrop;
use std::time::Duration;

use super::rmem::torus_cap;
use super::TORUS_ETOOBIG;
use super::{bytes, code, guard, invalid, set_error, str_of, TORUS_EINVAL};
use crate::queue::{QueueReceiver, QueueSender};
use crate::rmem::Capability;
use crate::Client;

/// A client a queue end owns: leaked while the end lives, so the queue may borrow it, and
/// taken back (detached) after the queue is dropped.
struct Owned(*mut Client);

impl Owned {
    /// Attaches a client for a queue end (`socket`, `name`: as `torus_attach`'s).
    ///
    /// # Safety
    /// `socket` and `name` are null or NUL-terminated strings.
    unsafe fn attach(socket: *const c_char, name: *const c_char) -> Option<Owned> {
        // SAFETY: by contract.
        let (Some(s), Some(n)) = (unsafe { str_of(socket) }, unsafe { str_of(name) }) else {
            set_error("socket and name must be UTF-8 strings");
            return None;
        };
        match Client::attach(s, n) {
            Ok(c) => Some(Owned(Box::into_raw(Box::new(c)))),
            Err(e) => {
                code(e);
                None
            }
        }
    }

    /// The client, for as long as this lives (the queue borrowing it is dropped first).
    fn client(&self) -> &'static Client {
        // SAFETY: from Box::into_raw, freed only in Drop, after the queue that borrows it.
        unsafe { &*self.0 }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: from Box::into_raw in attach; nothing borrows it any more.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

/// The receiving end of a queue, with its own client.
pub struct torus_queue_rx {
    q: ManuallyDrop<QueueReceiver<'static>>,
    /// A message that did not fit the caller's buffer, kept for the next call.
    held: Option<Vec<u8>>,
    /// Kept for its drop: the client detaches after the queue is gone.
    _client: Owned,
}

impl Drop for torus_queue_rx {
    fn drop(&mut self) {
        // SAFETY: dropped once, here, before `_client` (a field, dropped after this).
        unsafe { ManuallyDrop::drop(&mut self.q) };
    }
}

/// The sending end of a queue, with its own client.
pub struct torus_queue_tx {
    q: ManuallyDrop<QueueSender<'static>>,
    /// Kept for its drop, as the receiver's.
    _client: Owned,
}

impl Drop for torus_queue_tx {
    fn drop(&mut self) {
        // SAFETY: as for the receiver.
        unsafe { ManuallyDrop::drop(&mut self.q) };
    }
}

fn ms(t: c_int) -> Duration {
    Duration::from_millis(t.max(0) as u64)
}

/// The receiving end of a queue: a client attached as `name` at `socket` for it alone, and a
/// ring of `slots` slots of `slot` bytes in its memory; the capability to hand the sender
/// goes to `*ring`. NULL on error (`torus_last_error`).
///
/// # Safety
/// `socket` and `name` NUL-terminated strings, `ring` writable.
#[no_mangle]
pub unsafe extern "C" fn torus_queue_receiver(
    socket: *const c_char,
    name: *const c_char,
    slots: u64,
    slot: u64,
    ring: *mut torus_cap,
) -> *mut torus_queue_rx {
    guard(std::ptr::null_mut(), || {
        // SAFETY: by contract, checked for null.
        let Some(ring) = (unsafe { ring.as_mut() }) else {
            set_error("null ring");
            return std::ptr::null_mut();
        };
        // SAFETY: by contract.
        let Some(client) = (unsafe { Owned::attach(socket, name) }) else {
            return std::ptr::null_mut();
        };
        match QueueReceiver::new(client.client(), slots, slot) {
            Ok((q, cap)) => {
                ring.bytes = cap.encode();
                Box::into_raw(Box::new(torus_queue_rx {
                    q: ManuallyDrop::new(q),
                    held: None,
                    _client: client,
                }))
            }
            Err(e) => {
                code(e);
                std::ptr::null_mut()
            }
        }
    })
}

/// Gives the receiver the sender's capability for its read index (from
/// `torus_queue_sender`'s `*read`).
///
/// # Safety
/// `q` a live receiver, `read` valid.
#[no_mangle]
pub unsafe extern "C" fn torus_queue_connect(
    q: *mut torus_queue_rx,
    read: *const torus_cap,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let (Some(q), Some(read)) = (unsafe { q.as_mut() }, unsafe { read.as_ref() }) else {
            return invalid("null queue or capability");
        };
        let Some(cap) = Capability::decode(&read.bytes) else {
            return invalid("not a capability");
        };
        q.q.connect(cap);
        0
    })
}

/// The next message, waiting up to `timeout_ms`: 1 with its bytes in `buf` and its length
/// in `*len`, 0 when none came, `TORUS_ETOOBIG` (kept for the next call; `*len` says how
/// big) or an error.
///
/// # Safety
/// `q` a live receiver, `buf` writable for `cap` bytes, `len` writable.
#[no_mangle]
pub unsafe extern "C" fn torus_queue_recv(
    q: *mut torus_queue_rx,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
    timeout_ms: c_int,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let (Some(q), Some(len)) = (unsafe { q.as_mut() }, unsafe { len.as_mut() }) else {
            return invalid("null queue or length");
        };
        let m = match q.held.take() {
            Some(m) => m,
            None => match q.q.recv(ms(timeout_ms)) {
                Ok(Some(m)) => m,
                Ok(None) => return 0,
                Err(e) => return code(e),
            },
        };
        *len = m.len();
        if m.len() > cap || (buf.is_null() && !m.is_empty()) {
            q.held = Some(m);
            set_error("the message does not fit the buffer");
            return TORUS_ETOOBIG;
        }
        if !m.is_empty() {
            // SAFETY: buf writable for cap >= m.len() bytes by contract.
            unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), buf.cast(), m.len()) };
        }
        1
    })
}

/// Frees a receiver (its client detaches).
///
/// # Safety
/// `q` came from `torus_queue_receiver` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn torus_queue_receiver_free(q: *mut torus_queue_rx) {
    if !q.is_null() {
        // SAFETY: by contract it came from Box::into_raw.
        drop(unsafe { Box::from_raw(q) });
    }
}

/// The sending end of a queue: a client attached as `name` at `socket` for it alone,
/// writing into the ring `ring` (the receiver's capability) of `slots` slots of `slot`
/// bytes; the capability for its read index, to hand the receiver, goes to `*read`.
///
/// # Safety
/// `socket` and `name` NUL-terminated strings, `ring` valid, `read` writable.
#[no_mangle]
pub unsafe extern "C" fn torus_queue_sender(
    socket: *const c_char,
    name: *const c_char,
    ring: *const torus_cap,
    slots: u64,
    slot: u64,
    read: *mut torus_cap,
) -> *mut torus_queue_tx {
    guard(std::ptr::null_mut(), || {
        // SAFETY: by contract, each checked for null.
        let (Some(ring), Some(read)) = (unsafe { ring.as_ref() }, unsafe { read.as_mut() }) else {
            set_error("null ring or output");
            return std::ptr::null_mut();
        };
        let Some(ring) = Capability::decode(&ring.bytes) else {
            set_error("not a capability");
            return std::ptr::null_mut();
        };
        // SAFETY: by contract.
        let Some(client) = (unsafe { Owned::attach(socket, name) }) else {
            return std::ptr::null_mut();
        };
        match QueueSender::new(client.client(), ring, slots, slot) {
            Ok((q, cap)) => {
                read.bytes = cap.encode();
                Box::into_raw(Box::new(torus_queue_tx {
                    q: ManuallyDrop::new(q),
                    _client: client,
                }))
            }
            Err(e) => {
                code(e);
                std::ptr::null_mut()
            }
        }
    })
}

/// What a sender call does with its message.
enum Put {
    Push,
    Send,
}

/// # Safety
/// `q` null or a live sender, `data` valid for `len` bytes.
unsafe fn put(
    q: *mut torus_queue_tx,
    data: *const c_void,
    len: usize,
    t: c_int,
    how: Put,
) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let Some(q) = (unsafe { q.as_mut() }) else {
            return invalid("null queue");
        };
        // SAFETY: by contract.
        let Some(data) = (unsafe { bytes(data, len) }) else {
            return invalid("null data");
        };
        let r = match how {
            Put::Push => q.q.push(data, ms(t)),
            Put::Send => q.q.send(data, ms(t)),
        };
        match r {
            Ok(()) => 0,
            Err(e) => code(e),
        }
    })
}

/// Writes a message into the next slot without announcing it (`torus_queue_publish` does),
/// waiting up to `timeout_ms` for room.
///
/// # Safety
/// `q` a live sender, `data` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn torus_queue_push(
    q: *mut torus_queue_tx,
    data: *const c_void,
    len: usize,
    timeout_ms: c_int,
) -> c_int {
    // SAFETY: by contract.
    unsafe { put(q, data, len, timeout_ms, Put::Push) }
}

/// Pushes and publishes one message.
///
/// # Safety
/// `q` a live sender, `data` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn torus_queue_send(
    q: *mut torus_queue_tx,
    data: *const c_void,
    len: usize,
    timeout_ms: c_int,
) -> c_int {
    // SAFETY: by contract.
    unsafe { put(q, data, len, timeout_ms, Put::Send) }
}

/// Announces every message pushed so far.
///
/// # Safety
/// `q` a live sender.
#[no_mangle]
pub unsafe extern "C" fn torus_queue_publish(q: *mut torus_queue_tx) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let Some(q) = (unsafe { q.as_mut() }) else {
            return invalid("null queue");
        };
        match q.q.publish() {
            Ok(()) => 0,
            Err(e) => code(e),
        }
    })
}

/// Waits up to `timeout_ms` until every write so far has completed.
///
/// # Safety
/// `q` a live sender.
#[no_mangle]
pub unsafe extern "C" fn torus_queue_flush(q: *mut torus_queue_tx, timeout_ms: c_int) -> c_int {
    guard(TORUS_EINVAL, || {
        // SAFETY: by contract, checked for null.
        let Some(q) = (unsafe { q.as_mut() }) else {
            return invalid("null queue");
        };
        match q.q.flush(ms(timeout_ms)) {
            Ok(()) => 0,
            Err(e) => code(e),
        }
    })
}

/// Frees a sender (its client detaches).
///
/// # Safety
/// `q` came from `torus_queue_sender` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn torus_queue_sender_free(q: *mut torus_queue_tx) {
    if !q.is_null() {
        // SAFETY: by contract it came from Box::into_raw.
        drop(unsafe { Box::from_raw(q) });
    }
}
