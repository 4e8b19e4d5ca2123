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
//! - Long sends pulled by their receiver with remote reads ([`Client::send_long`],
//!   [`Event::LongOffer`], [`Client::pull`]).
//! - Multicast of pool bytes to a group's applications, delivered in order
//!   ([`Client::multicast`], [`Event::MulticastData`], [`Event::MulticastReport`]).
//!
//! The channel's layout is [`channel`]; [`ffi`] is the C ABI over this API. This file holds
//! [`Client`] and its attach; the calls live by what they do: `submit.rs` (sending),
//! `receive.rs` (events), `rpc.rs` (calls), `buffers.rs` (return buffers), `control.rs`
//! (the attach socket's requests), with the vocabulary in `types.rs` and `error.rs`.
#![warn(missing_docs)]

mod buffers;
pub mod channel;
mod control;
mod error;
pub mod ffi;
mod long;
mod multicast;
pub mod queue;
mod receive;
mod remote;
pub mod rmem;
mod rpc;
mod submit;
mod types;

pub use long::{LongEnd, LongOffer, LongOptions, OFFER_LEN};
pub use multicast::{MulticastOptions, MulticastReport};
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

use buffers::Pool;
pub use buffers::ReturnBuffer;
use control::coord_of;
pub use control::MAX_NAMES;
pub use error::Error;
use receive::Parsed;
pub(crate) use receive::Rx;
use submit::Tx;
pub use types::{Address, Coord, Dest, Event, FailReason, OnPath, SendOptions, Wait};

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
    /// Service ids of the names this application added ([`Client::add_name`]).
    added: Mutex<Vec<u16>>,
    /// Its long sends that have not ended, by offer id.
    offers: Mutex<HashMap<u64, long::Outstanding>>,
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

/// How an application attaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachOptions {
    /// Bytes of its pool, the memory shared with torusd that its return buffers,
    /// remote-memory regions and long sends live in (torusd's `[apps] max_pool_mib` caps
    /// it; pages cost memory only once touched).
    pub pool: u64,
}

impl Default for AttachOptions {
    fn default() -> AttachOptions {
        AttachOptions {
            pool: channel::Geometry::default().pool_size,
        }
    }
}

impl Client {
    /// Attaches to the torusd whose application socket is `socket`, registering this
    /// application's service under `name` (found by others through [`Client::resolve`]).
    pub fn attach(socket: impl AsRef<Path>, name: &str) -> Result<Client, Error> {
        Client::attach_with(socket, name, AttachOptions::default())
    }

    /// [`Client::attach`], with options (a larger pool).
    pub fn attach_with(
        socket: impl AsRef<Path>,
        name: &str,
        opts: AttachOptions,
    ) -> Result<Client, Error> {
        let socket = socket.as_ref();
        let sock = UnixStream::connect(socket).map_err(|e| {
            Error::Refused(format!(
                "cannot reach torusd's application socket {}: {e}",
                socket.display()
            ))
        })?;
        sock.set_read_timeout(Some(Duration::from_secs(10)))?;
        let req = json!({
            "cmd": "attach",
            "name": name,
            "version": channel::VERSION,
            "pool": opts.pool,
        });
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
            tx: Mutex::new(Tx::new()),
            rx: Mutex::new(Rx::default()),
            pool: Mutex::new(Pool::default()),
            names: Mutex::new(HashMap::new()),
            added: Mutex::new(Vec::new()),
            offers: Mutex::new(HashMap::new()),
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
}
