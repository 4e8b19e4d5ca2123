//! The application side of torusnet: a process attaches to the torusd of its server, gets a
//! shared-memory channel, and sends and receives messages through it without a system call
//! per message.
//!
//! ```no_run
//! use torusnet_client::{Client, Dest, SendOptions, Wait, Event};
//! let c = Client::attach("/run/torusnet/n0-apps.sock", "echo")?;
//! loop {
//!     if let Some(Event::Message { from, data, .. }) = c.recv(Wait::Forever)? {
//!         c.send(Dest::Service(from), &data, SendOptions::reliable())?;
//!     }
//! }
//! # Ok::<(), torusnet_client::Error>(())
//! ```
//!
//! - Messages go to a server's service ([`Dest::Service`]), to the root of a routing key
//!   ([`Dest::Key`]), or to a service name, resolved across the torus ([`Dest::Name`]).
//! - Short messages (one frame, best effort) and reliable ones of any size with fences;
//!   every reliable message ends in one report: acknowledged (with [`Client::notify_acks`])
//!   or [`Event::Failed`].
//! - Long messages into the receiver's posted return buffers ([`Client::post_buffer`]).
//! - Request/response ([`Client::call`], [`Event::Request`], [`Client::respond`]).
//!
//! The channel's layout is [`channel`]; [`ffi`] is the C ABI over this API.

pub mod channel;
pub mod ffi;
pub mod queue;
mod remote;
pub mod rmem;

pub use remote::{LocalRegion, RemoteOptions};
pub mod sys;

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};

use channel::{byte_ring_alloc, cflag, cq, dest, kind, off, op, pack_coord, sflag, unpack_coord};
use channel::{Cqe, Region, Sqe};

/// A server's coordinate.
pub type Coord = (u16, u16, u16);

/// A service on a server: where a message comes from or goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Address {
    /// The server.
    pub server: Coord,
    /// The service id there.
    pub service: u16,
}

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dest {
    /// A service on a server.
    Service(Address),
    /// The server that roots a routing key, service `service` there.
    Key {
        /// The routing key.
        key: u64,
        /// The service id.
        service: u16,
    },
    /// A service by name: resolved across the torus (cached), sent to the first server
    /// that hosts it.
    Name(String),
}

/// How a message is sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendOptions {
    /// Reliable (exactly once, any size, fences, reported) or short (one frame, best effort).
    pub reliable: bool,
    /// Deliver only after every earlier message to the same server.
    pub backward_fence: bool,
    /// Deliver no later message to the same server before this one.
    pub forward_fence: bool,
    /// The caller's name for the message (returned in its acknowledgement or failure);
    /// `None`: the client numbers messages itself and returns the number.
    pub tag: Option<u64>,
}

impl SendOptions {
    /// Reliable, no fences.
    pub fn reliable() -> SendOptions {
        SendOptions {
            reliable: true,
            ..SendOptions::default()
        }
    }
    /// Short (best effort, one frame).
    pub fn short() -> SendOptions {
        SendOptions::default()
    }
}

/// How long [`Client::recv`] waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Return at once.
    NoWait,
    /// Wait up to this long.
    Timeout(Duration),
    /// Wait until something comes.
    Forever,
}

/// Why a message failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// The peer's torusd restarted: it lost what it had not acknowledged.
    PeerRestarted,
    /// The peer dropped its end of the connection.
    PeerReset,
    /// The peer made no progress in time.
    Silent,
    /// The peer is unreachable.
    Unreachable,
    /// Refused (too large, malformed, too many peers).
    Refused,
    /// No service at the peer takes it (the application is not, or no longer, attached).
    NoService,
    /// The application it was for had fallen behind (its backlog full): not delivered;
    /// sending again later may succeed.
    ReceiverFull,
}

impl FailReason {
    /// Its code in the channel (and in the C API, whose `TORUS_*` reasons are the same).
    pub(crate) fn code(self) -> u8 {
        match self {
            FailReason::PeerRestarted => channel::reason::PEER_RESTARTED,
            FailReason::PeerReset => channel::reason::PEER_RESET,
            FailReason::Silent => channel::reason::SILENT,
            FailReason::Unreachable => channel::reason::UNREACHABLE,
            FailReason::Refused => channel::reason::REFUSED,
            FailReason::NoService => channel::reason::NO_SERVICE,
            FailReason::ReceiverFull => channel::reason::RECEIVER_FULL,
        }
    }

    fn from_code(c: u8) -> FailReason {
        match c {
            channel::reason::PEER_RESTARTED => FailReason::PeerRestarted,
            channel::reason::PEER_RESET => FailReason::PeerReset,
            channel::reason::SILENT => FailReason::Silent,
            channel::reason::UNREACHABLE => FailReason::Unreachable,
            channel::reason::NO_SERVICE => FailReason::NoService,
            channel::reason::RECEIVER_FULL => FailReason::ReceiverFull,
            _ => FailReason::Refused,
        }
    }
}

/// Something an application learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message.
    Message {
        /// Who sent it.
        from: Address,
        /// Its bytes.
        data: Vec<u8>,
        /// Reliable, or short.
        reliable: bool,
        /// The routing key it was sent to, if it was.
        key: Option<u64>,
    },
    /// A request for [`Client::respond`].
    Request {
        /// Who asks.
        from: Address,
        /// The call's number, to answer it.
        call: u64,
        /// Its bytes.
        data: Vec<u8>,
    },
    /// `count` reliable messages to `peer` acknowledged, in send order, the last one
    /// tagged `last_tag`.
    Acked {
        /// The server.
        peer: Coord,
        /// How many.
        count: u64,
        /// The last one's tag.
        last_tag: u64,
    },
    /// The message tagged `tag` will never be delivered.
    Failed {
        /// The server it was for.
        peer: Coord,
        /// Its tag.
        tag: u64,
        /// Why.
        reason: FailReason,
    },
    /// A server restarted or reset its connection with this one: anything kept about its
    /// state may be stale.
    PeerReset {
        /// The server.
        peer: Coord,
        /// Restarted, or reset.
        reason: FailReason,
    },
    /// A server became unreachable.
    Unreachable(Coord),
    /// A server became reachable again.
    Reachable(Coord),
    /// A posted return buffer was filled: read it with [`Client::buffer`].
    BufferFilled {
        /// The buffer.
        buffer: u32,
        /// Bytes in it.
        len: usize,
        /// Who filled it.
        from: Address,
    },
    /// A message sent into a return buffer found none posted (or too small, or taken): it
    /// was not delivered; send it normally.
    BufferMissed {
        /// The server.
        peer: Coord,
        /// The message's tag.
        tag: u64,
    },
    /// This application did not read fast enough: `dropped` incoming messages were lost.
    Overflow {
        /// How many.
        dropped: u64,
    },
    /// A remote-memory operation ended ([`Client::remote_write`], [`Client::remote_read`]).
    RemoteDone {
        /// The operation's handle.
        op: u64,
        /// How it ended.
        status: rmem::Status,
        /// Bytes moved.
        bytes: u64,
    },
    /// A remote write touched tripwire `id` of one of this application's regions.
    Tripwire {
        /// The tripwire.
        id: u64,
        /// The region.
        region: u32,
        /// The write's offset in the region.
        offset: u64,
        /// Its length.
        len: u64,
        /// The server that wrote.
        from: Coord,
    },
    /// A remote write that asked for notification landed whole in one of this
    /// application's regions.
    Written {
        /// The region.
        region: u32,
        /// Where.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The server that wrote.
        from: Coord,
    },
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The channel is full: receive, then try again.
    #[error("would block: the channel to torusd is full")]
    WouldBlock,
    /// Nothing came in time.
    #[error("timed out")]
    Timeout,
    /// torusd refused (the reason says why).
    #[error("torusd: {0}")]
    Refused(String),
    /// The message is too large.
    #[error("message of {0} bytes is too large")]
    TooLarge(usize),
    /// No server hosts the name.
    #[error("no server hosts service {0:?}")]
    NotFound(String),
    /// torusd went away (the channel is closed).
    #[error("torusd closed the channel")]
    Closed,
    /// The attach socket.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

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

/// Send-side state (the SQ and the TX data ring).
#[derive(Debug)]
struct Tx {
    sq_tail: u32,
    txd_tail: u64,
    next_tag: u64,
    /// torusd's SQ head and TX data head as last read: re-read only when the ring looks
    /// full, so a send does not touch torusd's cache lines.
    sq_head: u32,
    txd_head: u64,
}

/// Receive-side state (the CQ and the RX data ring).
#[derive(Debug, Default)]
pub(crate) struct Rx {
    /// Events read but not yet returned (while `call` waited for its reply).
    pub(crate) pending: VecDeque<Event>,
    /// RPC replies waiting for their `call`.
    replies: HashMap<u64, Vec<u8>>,
    /// A message arriving in segments.
    partial: Option<(Cqe, Vec<u8>)>,
    /// Capabilities torusd answered with, by request tag.
    pub(crate) caps: HashMap<u64, Result<rmem::Capability, rmem::Status>>,
}

/// The pool's allocator: a bump pointer with a free list of equal-size blocks returned.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    next: u64,
    free: Vec<(u64, u32)>,
    buffers: HashMap<u32, (u64, u32, bool)>,
    next_id: u32,
}

/// An application attached to torusd.
pub struct Client {
    sock: Mutex<UnixStream>,
    // Field order matters for drop: the region points into the mapping.
    pub(crate) region: Region,
    _map: sys::Mapping,
    app_efd: OwnedFd,
    torusd_efd: OwnedFd,
    service: u16,
    name: String,
    local: Coord,
    /// The torus's size: a destination outside it is refused at once.
    dims: Coord,
    tx: Mutex<Tx>,
    rx: Mutex<Rx>,
    pub(crate) pool: Mutex<Pool>,
    names: Mutex<HashMap<String, Vec<Address>>>,
    next_call: AtomicU64,
    spin: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("name", &self.name)
            .field("service", &self.service)
            .field("local", &self.local)
            .finish()
    }
}

/// How long `recv` spins before it sleeps, by default: long enough to catch a reply that is
/// microseconds away, short enough not to burn a core while idle.
const DEFAULT_SPIN: Duration = Duration::from_micros(50);

fn read_line(sock: &UnixStream) -> Result<Value, Error> {
    let (line, _) = sys::recv_line_with_fds(sock, 0).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Closed
        } else {
            Error::Io(e)
        }
    })?;
    let v: Value = serde_json::from_slice(&line)
        .map_err(|e| Error::Refused(format!("torusd answered non-JSON: {e}")))?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        return Err(Error::Refused(e.to_string()));
    }
    Ok(v)
}

fn coord_of(v: &Value) -> Option<Coord> {
    let a = v.as_array()?;
    let g = |i: usize| a.get(i)?.as_u64().and_then(|n| u16::try_from(n).ok());
    Some((g(0)?, g(1)?, g(2)?))
}

impl Client {
    /// Attaches to the torusd whose application socket is `socket`, registering this
    /// application's service under `name` (found by others through [`Client::resolve`]).
    pub fn attach(socket: impl AsRef<Path>, name: &str) -> Result<Client, Error> {
        let socket = socket.as_ref();
        let sock = UnixStream::connect(socket).map_err(|e| {
            Error::Refused(format!(
                "cannot reach torusd's application socket {}: {e}",
                socket.display()
            ))
        })?;
        sock.set_read_timeout(Some(Duration::from_secs(10)))?;
        let req = json!({"cmd": "attach", "name": name, "version": channel::VERSION});
        {
            use std::io::Write;
            let mut s = &sock;
            writeln!(s, "{req}")?;
        }
        let (line, fds) = sys::recv_line_with_fds(&sock, 4).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Error::Closed
            } else {
                Error::Io(e)
            }
        })?;
        let v: Value = serde_json::from_slice(&line)
            .map_err(|e| Error::Refused(format!("torusd answered non-JSON: {e}")))?;
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            return Err(Error::Refused(e.to_string()));
        }
        let mut fds = fds.into_iter();
        let (Some(mem), Some(app_efd), Some(torusd_efd)) = (fds.next(), fds.next(), fds.next())
        else {
            return Err(Error::Refused("torusd sent no channel".into()));
        };
        let len = sys::file_len(&mem)?;
        let map = sys::Mapping::map(&mem, len)?;
        // SAFETY: the mapping lives as long as the client (field `_map`, dropped after use).
        let region = unsafe { Region::open(map.ptr(), map.len()) }
            .map_err(|e| Error::Refused(e.to_string()))?;
        let service = v["service"]
            .as_u64()
            .and_then(|s| u16::try_from(s).ok())
            .ok_or_else(|| Error::Refused("no service id in the answer".into()))?;
        let local = coord_of(&v["coord"]).ok_or_else(|| Error::Refused("no coordinate".into()))?;
        let dims = v["dims"]
            .as_str()
            .and_then(|d| {
                let mut it = d.split('x').map(|n| n.parse::<u16>().ok());
                Some((it.next()??, it.next()??, it.next().unwrap_or(Some(1))?))
            })
            .ok_or_else(|| Error::Refused("no torus size in the answer".into()))?;
        Ok(Client {
            sock: Mutex::new(sock),
            region,
            _map: map,
            app_efd,
            torusd_efd,
            service,
            name: name.to_string(),
            local,
            dims,
            tx: Mutex::new(Tx {
                sq_tail: 0,
                txd_tail: 0,
                next_tag: 1,
                sq_head: 0,
                txd_head: 0,
            }),
            rx: Mutex::new(Rx::default()),
            pool: Mutex::new(Pool::default()),
            names: Mutex::new(HashMap::new()),
            next_call: AtomicU64::new(1),
            spin: DEFAULT_SPIN,
        })
    }

    /// Spins this long in [`Client::recv`] before sleeping (`Duration::MAX`: busy polling,
    /// never sleep).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// This application's service id (the same for its name on every server).
    pub fn service_id(&self) -> u16 {
        self.service
    }

    /// The name it registered.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This server.
    pub fn local(&self) -> Coord {
        self.local
    }

    /// This application's own address.
    pub fn address(&self) -> Address {
        Address {
            server: self.local,
            service: self.service,
        }
    }

    /// One request on the attach socket (names, acknowledgements), answered within `limit`.
    fn request(&self, req: Value, limit: Duration) -> Result<Value, Error> {
        let s = self.sock.lock();
        s.set_read_timeout(Some(limit))?;
        {
            use std::io::Write;
            let mut w = &*s;
            writeln!(w, "{req}").map_err(|_| Error::Closed)?;
        }
        read_line(&s).map_err(|e| match e {
            Error::Io(io)
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Error::Timeout
            }
            other => other,
        })
    }

    /// The servers that host service `name`, across the torus.
    pub fn resolve(&self, name: &str, timeout: Duration) -> Result<Vec<Address>, Error> {
        let v = self.request(
            json!({"cmd": "resolve", "name": name, "timeout_ms": timeout.as_millis() as u64}),
            timeout + Duration::from_secs(1),
        )?;
        let mut out = Vec::new();
        for l in v["locations"].as_array().into_iter().flatten() {
            if let (Some(server), Some(service)) = (
                coord_of(&l["server"]),
                l["service"].as_u64().and_then(|s| u16::try_from(s).ok()),
            ) {
                out.push(Address { server, service });
            }
        }
        self.names.lock().insert(name.to_string(), out.clone());
        Ok(out)
    }

    /// Forgets what `resolve` cached for `name` (its host moved).
    pub fn forget(&self, name: &str) {
        self.names.lock().remove(name);
    }

    /// Asks for [`Event::Acked`] reports of this application's reliable messages.
    pub fn notify_acks(&self, on: bool) -> Result<(), Error> {
        self.request(
            json!({"cmd": "notify_acks", "on": on}),
            Duration::from_secs(5),
        )?;
        Ok(())
    }

    fn target(&self, to: &Dest) -> Result<(u8, u64, u16), Error> {
        if let Dest::Service(a) = to {
            let (x, y, z) = a.server;
            if x >= self.dims.0 || y >= self.dims.1 || z >= self.dims.2 {
                return Err(Error::Refused(format!(
                    "server {:?} is outside the {}x{}x{} torus",
                    a.server, self.dims.0, self.dims.1, self.dims.2
                )));
            }
        }
        Ok(match to {
            Dest::Service(a) => (
                dest::SERVER,
                pack_coord(a.server.0, a.server.1, a.server.2),
                a.service,
            ),
            Dest::Key { key, service } => (dest::KEY, *key, *service),
            Dest::Name(n) => {
                let cached = self.names.lock().get(n).and_then(|v| v.first().copied());
                let a = match cached {
                    Some(a) => a,
                    None => *self
                        .resolve(n, Duration::from_secs(2))?
                        .first()
                        .ok_or_else(|| Error::NotFound(n.clone()))?,
                };
                (
                    dest::SERVER,
                    pack_coord(a.server.0, a.server.1, a.server.2),
                    a.service,
                )
            }
        })
    }

    /// Sends a message; returns its tag. `WouldBlock` when the channel is full (receive,
    /// then try again). A message larger than half the TX data ring goes in segments.
    pub fn send(&self, to: Dest, data: &[u8], opts: SendOptions) -> Result<u64, Error> {
        self.submit(to, data, opts, kind::DATA, None)
    }

    /// Sends a message into a return buffer another application posted (its descriptor
    /// came in a message). If the buffer is gone when the message arrives, the message is
    /// not delivered and this application gets [`Event::BufferMissed`].
    pub fn send_to_buffer(
        &self,
        buf: &ReturnBuffer,
        data: &[u8],
        opts: SendOptions,
    ) -> Result<u64, Error> {
        if data.len() > buf.len as usize {
            return Err(Error::TooLarge(data.len()));
        }
        let to = Dest::Service(buf.owner);
        self.submit(
            to,
            data,
            SendOptions {
                reliable: true,
                ..opts
            },
            kind::DATA,
            Some((buf.id, buf.cookie)),
        )
    }

    fn submit(
        &self,
        to: Dest,
        data: &[u8],
        opts: SendOptions,
        app_kind: u8,
        into: Option<(u32, u64)>,
    ) -> Result<u64, Error> {
        let (dest_kind, dest, service) = self.target(&to)?;
        if data.len() > u32::MAX as usize {
            return Err(Error::TooLarge(data.len()));
        }
        let mut flags = 0u8;
        if opts.reliable {
            flags |= sflag::RELIABLE;
        }
        if opts.backward_fence {
            flags |= sflag::BWD_FENCE;
        }
        if opts.forward_fence {
            flags |= sflag::FWD_FENCE;
        }
        if into.is_some() {
            flags |= sflag::INTO_BUFFER;
        }
        let tag = self.next_tag(opts.tag);
        let mut e = Sqe {
            op: op::SEND,
            flags,
            dest_kind,
            kind: app_kind,
            service,
            tag,
            dest,
            total_len: data.len() as u32,
            ..Sqe::default()
        };
        if let Some((id, cookie)) = into {
            e.buf_id = id;
            e.aux = cookie;
        }
        self.submit_entry(e, data)?;
        Ok(tag)
    }

    /// A tag for a submission: `want`, or the next unused one.
    pub(crate) fn next_tag(&self, want: Option<u64>) -> u64 {
        let mut tx = self.tx.lock();
        let tag = want.unwrap_or(tx.next_tag);
        tx.next_tag = tx.next_tag.max(tag) + 1;
        tag
    }

    /// Submits `template` with `data` in the TX data ring, in segments (MORE) when it is
    /// larger than half the ring.
    pub(crate) fn submit_entry(&self, template: Sqe, data: &[u8]) -> Result<(), Error> {
        let r = &self.region;
        let (_, txd_size) = r.txd();
        let seg = (txd_size / 2) as usize;
        let mut tx = self.tx.lock();
        let flags = template.flags;
        let nseg = data.len().div_ceil(seg).max(1);
        let entries = r.geometry().sq_entries;
        for i in 0..nseg {
            let part = &data[(i * seg).min(data.len())..((i + 1) * seg).min(data.len())];
            let last = i + 1 == nseg;
            // Space in both rings; the first segment refuses at once, later ones wait for
            // torusd to make room (the message is already half submitted).
            let mut deadline = None;
            let mut fresh = false;
            let (pos, new_tail) = loop {
                let sq_room = tx.sq_tail.wrapping_sub(tx.sq_head) < entries;
                let alloc = byte_ring_alloc(tx.txd_head, tx.txd_tail, txd_size, part.len() as u64);
                if let (true, Some(a)) = (sq_room, alloc) {
                    break a;
                }
                if !fresh {
                    tx.sq_head = r.u32(off::SQ_HEAD).load(Ordering::Acquire);
                    tx.txd_head = r.u64(off::TXD_HEAD).load(Ordering::Acquire);
                    fresh = true;
                    continue;
                }
                fresh = false;
                if i == 0 {
                    return Err(Error::WouldBlock);
                }
                let d = *deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(10));
                if Instant::now() > d {
                    return Err(Error::Timeout);
                }
                self.kick();
                std::thread::yield_now();
            };
            r.copy_in(r.txd(), pos % txd_size, part);
            let e = Sqe {
                flags: if last { flags } else { flags | sflag::MORE },
                data_pos: pos,
                data_len: part.len() as u32,
                ..template
            };
            r.write_sqe(tx.sq_tail, &e);
            tx.sq_tail = tx.sq_tail.wrapping_add(1);
            tx.txd_tail = new_tail;
            r.u32(off::SQ_TAIL).store(tx.sq_tail, Ordering::Release);
        }
        drop(tx);
        self.kick();
        Ok(())
    }

    /// Wakes torusd's poller if it sleeps (a syscall only then).
    fn kick(&self) {
        fence(Ordering::SeqCst);
        if self.region.u32(off::TORUSD_WAITING).load(Ordering::SeqCst) != 0 {
            sys::signal(self.torusd_efd.as_raw_fd());
        }
    }

    /// The next event: at once ([`Wait::NoWait`]), within a time, or whenever it comes.
    pub fn recv(&self, wait: Wait) -> Result<Option<Event>, Error> {
        let deadline = match wait {
            Wait::NoWait => Some(Instant::now()),
            Wait::Timeout(d) => Some(Instant::now() + d),
            Wait::Forever => None,
        };
        loop {
            if let Some(e) = self.poll_event()? {
                return Ok(Some(e));
            }
            if !self.wait_cq(deadline)? {
                return Ok(None);
            }
        }
    }

    /// Waits until the CQ has an entry (true) or `deadline` passes (false): spins for a
    /// while, then sleeps on the eventfd after telling torusd to signal it.
    fn wait_cq(&self, deadline: Option<Instant>) -> Result<bool, Error> {
        let r = &self.region;
        let ready = || {
            r.u32(off::CQ_HEAD).load(Ordering::Acquire)
                != r.u32(off::CQ_TAIL).load(Ordering::Acquire)
        };
        let start = Instant::now();
        loop {
            if ready() {
                return Ok(true);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(false);
            }
            if now.duration_since(start) < self.spin {
                std::hint::spin_loop();
                continue;
            }
            // Announce the sleep, look once more (torusd may have produced meanwhile), wait.
            r.u32(off::APP_WAITING).store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if !ready() {
                let ms = match deadline {
                    Some(d) => (d.saturating_duration_since(now).as_millis() as i32).clamp(1, 1000),
                    None => 1000,
                };
                sys::wait_readable(self.app_efd.as_raw_fd(), ms);
                sys::drain(self.app_efd.as_raw_fd());
            }
            r.u32(off::APP_WAITING).store(0, Ordering::SeqCst);
            if self.closed() {
                return Err(Error::Closed);
            }
        }
    }

    /// Whether torusd closed the attach socket (it went away, or detached us).
    fn closed(&self) -> bool {
        let s = self.sock.lock();
        let mut b = [0u8; 1];
        // SAFETY: peeking one byte without blocking on our socket.
        let n = unsafe {
            libc::recv(
                s.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n == 0
    }

    /// Takes one event if one is ready: queued ones first, then the CQ.
    fn poll_event(&self) -> Result<Option<Event>, Error> {
        let mut rx = self.rx.lock();
        if let Some(e) = rx.pending.pop_front() {
            return Ok(Some(e));
        }
        loop {
            let Some(e) = self.read_cq(&mut rx) else {
                return Ok(None);
            };
            match e {
                Parsed::Event(e) => return Ok(Some(e)),
                Parsed::Reply(call, data) => {
                    rx.replies.insert(call, data);
                }
                Parsed::Nothing => {}
            }
        }
    }

    /// Reads one CQ entry (and its bytes), if any.
    fn read_cq(&self, rx: &mut Rx) -> Option<Parsed> {
        let r = &self.region;
        let head = r.u32(off::CQ_HEAD).load(Ordering::Relaxed);
        let tail = r.u32(off::CQ_TAIL).load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        let e = r.read_cqe(head);
        let (_, rxd_size) = r.rxd();
        let mut data = Vec::new();
        if e.data_len > 0 {
            data.resize(e.data_len as usize, 0);
            r.copy_out(r.rxd(), e.data_pos % rxd_size, &mut data);
            r.u64(off::RXD_HEAD)
                .store(e.data_pos + u64::from(e.data_len), Ordering::Release);
        }
        r.u32(off::CQ_HEAD)
            .store(head.wrapping_add(1), Ordering::Release);
        Some(self.parse(rx, e, data))
    }

    fn parse(&self, rx: &mut Rx, e: Cqe, data: Vec<u8>) -> Parsed {
        let peer = unpack_coord(e.peer);
        let from = Address {
            server: peer,
            service: e.src_service,
        };
        match e.kind {
            cq::MESSAGE => {
                // Segments of one message arrive back to back.
                let (first, mut whole) = match rx.partial.take() {
                    Some((f, mut buf)) => {
                        buf.extend_from_slice(&data);
                        (f, buf)
                    }
                    None => (e, data),
                };
                if e.flags & cflag::MORE != 0 {
                    rx.partial = Some((first, whole));
                    return Parsed::Nothing;
                }
                let reliable = first.flags & cflag::RELIABLE != 0;
                let key = (first.flags & cflag::KEYED != 0).then_some(first.count);
                match first.app_kind {
                    kind::RPC_REQUEST | kind::RPC_REPLY if whole.len() >= 8 => {
                        let mut c = [0u8; 8];
                        c.copy_from_slice(&whole[..8]);
                        let call = u64::from_le_bytes(c);
                        whole.drain(..8);
                        if first.app_kind == kind::RPC_REQUEST {
                            Parsed::Event(Event::Request {
                                from,
                                call,
                                data: whole,
                            })
                        } else {
                            Parsed::Reply(call, whole)
                        }
                    }
                    _ => Parsed::Event(Event::Message {
                        from,
                        data: whole,
                        reliable,
                        key,
                    }),
                }
            }
            cq::ACKED => Parsed::Event(Event::Acked {
                peer,
                count: e.count,
                last_tag: e.tag,
            }),
            cq::FAILED => Parsed::Event(Event::Failed {
                peer,
                tag: e.tag,
                reason: FailReason::from_code(e.reason),
            }),
            cq::PEER_RESET => Parsed::Event(Event::PeerReset {
                peer,
                reason: FailReason::from_code(e.reason),
            }),
            cq::UNREACHABLE => Parsed::Event(Event::Unreachable(peer)),
            cq::REACHABLE => Parsed::Event(Event::Reachable(peer)),
            cq::BUFFER_FILLED => {
                let id = e.tag as u32;
                if let Some(b) = self.pool.lock().buffers.get_mut(&id) {
                    b.2 = true;
                }
                Parsed::Event(Event::BufferFilled {
                    buffer: id,
                    len: e.total_len as usize,
                    from,
                })
            }
            cq::BUFFER_MISSED => Parsed::Event(Event::BufferMissed { peer, tag: e.tag }),
            cq::OVERFLOW => Parsed::Event(Event::Overflow { dropped: e.count }),
            rmem::cq::RM_DONE => Parsed::Event(Event::RemoteDone {
                op: e.tag,
                status: rmem::Status::from_code(e.reason),
                bytes: e.count,
            }),
            rmem::cq::RM_CAP => {
                let r = match rmem::Capability::decode(&data) {
                    Some(c) if e.reason == 0 => Ok(c),
                    _ => Err(rmem::Status::from_code(e.reason.max(9))),
                };
                rx.caps.insert(e.tag, r);
                Parsed::Nothing
            }
            rmem::cq::RM_TRIPWIRE => Parsed::Event(Event::Tripwire {
                id: e.tag,
                region: e.extra as u32,
                offset: e.count,
                len: u64::from(e.total_len),
                from: peer,
            }),
            rmem::cq::RM_WRITTEN => Parsed::Event(Event::Written {
                region: e.extra as u32,
                offset: e.count,
                len: u64::from(e.total_len),
                from: peer,
            }),
            _ => Parsed::Nothing,
        }
    }

    /// Sends a request and waits for its reply (other events meanwhile are kept for
    /// [`Client::recv`]). A request the transport reports failed ends the call at once.
    pub fn call(&self, to: Dest, request: &[u8], timeout: Duration) -> Result<Vec<u8>, Error> {
        let call = self.next_call.fetch_add(1, Ordering::Relaxed);
        let mut msg = Vec::with_capacity(8 + request.len());
        msg.extend_from_slice(&call.to_le_bytes());
        msg.extend_from_slice(request);
        let deadline = Instant::now() + timeout;
        let tag = loop {
            match self.submit(
                to.clone(),
                &msg,
                SendOptions::reliable(),
                kind::RPC_REQUEST,
                None,
            ) {
                Ok(t) => break t,
                Err(Error::WouldBlock) if Instant::now() < deadline => {
                    // Make room by reading what came in.
                    self.stash_one()?;
                }
                Err(e) => return Err(e),
            }
        };
        loop {
            {
                let mut rx = self.rx.lock();
                while let Some(p) = self.read_cq(&mut rx) {
                    match p {
                        Parsed::Event(e) => rx.pending.push_back(e),
                        Parsed::Reply(c, d) => {
                            rx.replies.insert(c, d);
                        }
                        Parsed::Nothing => {}
                    }
                }
                if let Some(reply) = rx.replies.remove(&call) {
                    return Ok(reply);
                }
                let failed = rx
                    .pending
                    .iter()
                    .position(|e| matches!(e, Event::Failed { tag: t, .. } if *t == tag));
                if let Some(i) = failed {
                    if let Some(Event::Failed { peer, reason, .. }) = rx.pending.remove(i) {
                        return Err(Error::Refused(format!(
                            "the request to {peer:?} failed: {reason:?}"
                        )));
                    }
                }
            }
            if !self.wait_cq(Some(deadline))? {
                return Err(Error::Timeout);
            }
        }
    }

    /// Reads what the CQ holds into the stash until `f` finds what it waits for, or the
    /// deadline passes.
    pub(crate) fn wait_until<T>(
        &self,
        deadline: Instant,
        mut f: impl FnMut(&mut Rx) -> Option<T>,
    ) -> Result<T, Error> {
        loop {
            {
                let mut rx = self.rx.lock();
                while let Some(p) = self.read_cq(&mut rx) {
                    match p {
                        Parsed::Event(e) => rx.pending.push_back(e),
                        Parsed::Reply(c, d) => {
                            rx.replies.insert(c, d);
                        }
                        Parsed::Nothing => {}
                    }
                }
                if let Some(t) = f(&mut rx) {
                    return Ok(t);
                }
            }
            if !self.wait_cq(Some(deadline))? {
                return Err(Error::Timeout);
            }
        }
    }

    /// Reads one CQ entry into the stash (to free channel space while sending).
    fn stash_one(&self) -> Result<(), Error> {
        let mut rx = self.rx.lock();
        match self.read_cq(&mut rx) {
            Some(Parsed::Event(e)) => rx.pending.push_back(e),
            Some(Parsed::Reply(c, d)) => {
                rx.replies.insert(c, d);
            }
            Some(Parsed::Nothing) => {}
            None => {
                drop(rx);
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Answers a request ([`Event::Request`]).
    pub fn respond(&self, to: Address, call: u64, response: &[u8]) -> Result<u64, Error> {
        let mut msg = Vec::with_capacity(8 + response.len());
        msg.extend_from_slice(&call.to_le_bytes());
        msg.extend_from_slice(response);
        self.submit(
            Dest::Service(to),
            &msg,
            SendOptions::reliable(),
            kind::RPC_REPLY,
            None,
        )
    }

    /// Serves requests with `handler` until `wait` passes with nothing to do; other events
    /// are returned to the caller as they come (`Ok(Some(event))`).
    pub fn serve(
        &self,
        wait: Wait,
        mut handler: impl FnMut(Address, &[u8]) -> Vec<u8>,
    ) -> Result<Option<Event>, Error> {
        loop {
            match self.recv(wait)? {
                Some(Event::Request { from, call, data }) => {
                    let out = handler(from, &data);
                    loop {
                        match self.respond(from, call, &out) {
                            Err(Error::WouldBlock) => self.stash_one()?,
                            r => {
                                r?;
                                break;
                            }
                        }
                    }
                }
                other => return Ok(other),
            }
        }
    }

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
        let mut tx = self.tx.lock();
        tx.sq_head = r.u32(off::SQ_HEAD).load(Ordering::Acquire);
        if tx.sq_tail.wrapping_sub(tx.sq_head) >= r.geometry().sq_entries {
            return Err(Error::WouldBlock);
        }
        let e = Sqe {
            op: op::POST_BUFFER,
            buf_id: id,
            data_len: len,
            aux: at,
            aux2: cookie,
            ..Sqe::default()
        };
        r.write_sqe(tx.sq_tail, &e);
        tx.sq_tail = tx.sq_tail.wrapping_add(1);
        r.u32(off::SQ_TAIL).store(tx.sq_tail, Ordering::Release);
        drop(tx);
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

enum Parsed {
    Event(Event),
    Reply(u64, Vec<u8>),
    Nothing,
}
