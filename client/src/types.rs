//! What an application names and is told: addresses, destinations, send options, waits,
//! failure reasons and events.

use crate::*;

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
    /// Which of this application's services sends it: one of the names it added
    /// ([`Client::add_name`]'s id); `None`: its attach name.
    pub from: Option<u16>,
    /// Applications intercepting its service on servers it passes through see it
    /// ([`Client::intercept`]; short messages to a key).
    pub on_path: bool,
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

    /// Whether the failure says what was cached about the peer's services may be stale:
    /// the service is not there, or the server restarted, reset or cannot be reached.
    pub(crate) fn service_gone(self) -> bool {
        matches!(
            self,
            FailReason::NoService
                | FailReason::PeerRestarted
                | FailReason::PeerReset
                | FailReason::Unreachable
        )
    }

    pub(crate) fn from_code(c: u8) -> FailReason {
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
        /// Which of this application's services it was sent to (its attach name's id, or
        /// one from [`Client::add_name`]).
        to: u16,
    },
    /// A request for [`Client::respond`].
    Request {
        /// Who asks.
        from: Address,
        /// The call's number, to answer it.
        call: u64,
        /// Its bytes.
        data: Vec<u8>,
        /// Which of this application's services it was sent to.
        to: u16,
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
        /// The byte offset in the region where the write starts.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The server that wrote.
        from: Coord,
    },
    /// A long message offered to this application: pull it ([`Client::pull`]) or decline
    /// it ([`Client::decline`]) before its deadline.
    LongOffer(crate::LongOffer),
    /// A frame of this application's service passing through this server (it intercepts:
    /// [`Client::intercept`]), held for its verdict ([`Client::verdict`]) until a deadline,
    /// after which it goes on as it was.
    Intercepted {
        /// The frame's name, for the verdict.
        id: u64,
        /// Who sent it.
        from: Address,
        /// The key it goes to, if it is key-routed.
        key: Option<u64>,
        /// Its payload.
        data: Vec<u8>,
    },
    /// Bytes of a multicast to this application's service, in order, each once.
    MulticastData {
        /// The transfer (the same in its [`Event::MulticastEnd`]).
        id: u64,
        /// Its root (sender's server).
        root: Coord,
        /// Which of this application's services it is for.
        to: u16,
        /// Where these bytes start in the transfer.
        offset: u64,
        /// The transfer's size.
        size: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// A multicast to this application ended here.
    MulticastEnd {
        /// The transfer.
        id: u64,
        /// Its root.
        root: Coord,
        /// Every byte was delivered (else the root gave up on this server).
        complete: bool,
        /// The transfer's size.
        size: u64,
    },
    /// One of this application's multicasts ended: its bytes may be changed again.
    MulticastReport(crate::MulticastReport),
    /// One of this application's long sends ended: its buffer may be reused.
    LongDone {
        /// The receiver's server (none when it expired without an answer).
        peer: Option<Coord>,
        /// The offer's id ([`Client::send_long`]'s).
        offer: u64,
        /// How.
        end: crate::LongEnd,
    },
}

/// What an intercepting application does with a frame it was shown ([`Event::Intercepted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnPath<'a> {
    /// It goes on as it was.
    Pass,
    /// It goes on with this payload.
    Change(&'a [u8]),
    /// It goes no further.
    Drop,
}
