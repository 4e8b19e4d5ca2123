//! The transport's public vocabulary: links, messages to send, what it reports, frames it
//! hands out, counters.

use super::*;

/// A link of this server, numbered by the driver (in a torus: the direction, 0..=5).
pub type LinkId = u8;

/// A set of links, one bit per link id (up to 8 links).
///
/// In a torus a link id is its direction, so a [`DirSet`](crate::topology::DirSet) converts
/// into the same bits (`LinkSet::from`); the transport keeps its own type because it also
/// runs over links that are not torus directions (two servers wired by several links).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct LinkSet(pub u8);

impl From<crate::topology::DirSet> for LinkSet {
    fn from(dirs: crate::topology::DirSet) -> LinkSet {
        LinkSet(dirs.bits())
    }
}

impl LinkSet {
    /// How many link ids a set can hold.
    pub const CAPACITY: u8 = 8;
    /// No link.
    pub const EMPTY: LinkSet = LinkSet(0);

    /// Links 0..n.
    pub fn first(n: u8) -> LinkSet {
        LinkSet(if n >= 8 { 0xff } else { (1u8 << n) - 1 })
    }
    /// Whether `l` is in the set.
    pub fn contains(self, l: LinkId) -> bool {
        l < 8 && self.0 & (1 << l) != 0
    }
    /// The set with `l` added.
    #[must_use]
    pub fn with(self, l: LinkId) -> LinkSet {
        LinkSet(self.0 | (1 << (l % 8)))
    }
    /// The set without `l`.
    #[must_use]
    pub fn without(self, l: LinkId) -> LinkSet {
        LinkSet(self.0 & !(1 << (l % 8)))
    }
    /// Links in both sets.
    #[must_use]
    pub fn and(self, o: LinkSet) -> LinkSet {
        LinkSet(self.0 & o.0)
    }
    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The links, in id order.
    pub fn iter(self) -> impl Iterator<Item = LinkId> {
        (0..8).filter(move |l| self.contains(*l))
    }
}

/// Which links lead towards a peer: the routing next-hop set in a torus, or every direct
/// link between two servers.
pub trait Paths {
    /// The usable links towards `peer` (empty when unreachable), for the connection's own
    /// frames (ACKs, NACKs, SYNCs, retransmissions).
    fn links_to(&self, peer: Coord) -> LinkSet;

    /// The usable links for data frames of `service` towards `peer` (a service may be
    /// routed differently from the rest: source routing per service).
    fn links_for(&self, peer: Coord, service: u16) -> LinkSet {
        let _ = service;
        self.links_to(peer)
    }
}

impl<F: Fn(Coord) -> LinkSet> Paths for F {
    fn links_to(&self, peer: Coord) -> LinkSet {
        self(peer)
    }
}

/// A message for [`Transport::send`].
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// The server it goes to.
    pub dest: Coord,
    /// The service it is for (on the receiving server).
    pub service: u16,
    /// The service on this server that sends it: its queue carries the message, and its
    /// acknowledgement or failure is reported to it (built-in services send to their own
    /// id; an application's messages go to other services).
    pub from: u16,
    /// Its bytes.
    pub data: &'a [u8],
    /// Reliable (any size, exactly once, fences honoured) or short (one frame, best effort).
    pub reliable: bool,
    /// Ordering constraints (reliable messages only).
    pub fences: Fences,
    /// The sender's name for the message, returned in its acknowledgement or failure report.
    pub tag: u64,
}

/// Why [`Transport::send`] refused a message; the message was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The service's queue is full: try again after [`Transport::poll_transmit`] drained it.
    #[error("send queue full")]
    WouldBlock,
    /// Too large: a short message must fit one frame, a reliable one `max_message`.
    #[error("message of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The message's length.
        len: usize,
        /// The limit for its kind.
        max: usize,
    },
    /// Messages to this server itself do not go through the transport.
    #[error("destination is this server")]
    ToSelf,
    /// No live path leads to the destination in the current view (it is down or cut off):
    /// queued, the message would block its service's queue behind it.
    #[error("destination unreachable")]
    Unreachable,
    /// A new peer beyond `max_peers`.
    #[error("too many peers")]
    TooManyPeers,
    /// The service id is the transport's own ([`NOTICES`]): refused where messages from
    /// outside torusd enter (an application's). The transport does not look: every service
    /// inside torusd is its own code, and a check per message would cost its fast path.
    #[error("service {0} is reserved for the transport")]
    Reserved(u16),
    /// A reliable message for a service on this server itself that does not take it now
    /// (not hosted, or full): refused at the send, since no transport will see it.
    #[error("the service here does not take it: {0}")]
    NotTaken(FailReason),
}

/// Why a frame handed to [`Transport::handle_frame`] was dropped. The transport's state is
/// unchanged by a dropped frame (beyond counters) and it keeps serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// Not a well-formed torus frame.
    #[error("malformed frame: {0}")]
    Wire(#[from] WireError),
    /// Addressed to another server or to a key: the caller routes those.
    #[error("frame is not addressed to this server")]
    NotForUs,
    /// Claims to come from this server.
    #[error("frame claims to come from this server")]
    FromSelf,
    /// A control frame, which the transport does not handle.
    #[error("unexpected frame kind")]
    UnexpectedKind,
    /// A new peer beyond `max_peers`.
    #[error("too many peers")]
    TooManyPeers,
    /// A sequence number outside the receive window.
    #[error("sequence number outside the receive window")]
    OutOfWindow,
    /// A fragment that does not fit its message.
    #[error("bad fragment: {0}")]
    Fragment(#[from] DeliveryError),
    /// A frame of a connection instance that is gone on either side (sent before a restart
    /// or a reset): dropped, and the peer is told with a SYNC.
    #[error("frame of a stale connection instance")]
    Stale,
    /// A SYNC without its incarnation.
    #[error("SYNC frame without an incarnation")]
    BadSync,
}

/// Something the application learns from the transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportEvent {
    /// A message arrived.
    Message {
        /// The server that sent it.
        src: Coord,
        /// The service it is for.
        service: u16,
        /// Its bytes.
        data: Vec<u8>,
        /// Whether it came reliably (else as a short message).
        reliable: bool,
    },
    /// Reliable messages of `service` to `peer` were acknowledged, in send order: `count` of
    /// them since the last report, the last one tagged `last_tag`. Only for services that
    /// asked ([`Transport::notify_acks`]).
    Acked {
        /// The server they went to.
        peer: Coord,
        /// The service that sent them.
        service: u16,
        /// How many.
        count: u32,
        /// The tag of the last one.
        last_tag: u64,
    },
    /// Messages of `service` to `peer` that this connection will never deliver: they were
    /// not acknowledged when the connection ended. (They may have reached a peer that then
    /// lost them; they were never re-sent to a new instance of it.)
    Failed {
        /// The server they were for.
        peer: Coord,
        /// The service that sent them.
        service: u16,
        /// Their tags, in send order.
        tags: Vec<u64>,
        /// Why.
        reason: FailReason,
    },
    /// The peer's end of the connection changed (it restarted, or dropped the connection):
    /// whatever a service kept about the peer's state may be stale.
    PeerReset {
        /// The peer.
        peer: Coord,
        /// Restarted, or reset.
        reason: FailReason,
    },
}

/// A message handed back by [`Transport::handle_parsed`] (with `lend`) (and
/// `Node::handle_rx_lending`), borrowed from the frame it arrived in, instead of queued in
/// the inbox: the receiver copies it once, where the consumer keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lent<'f> {
    /// The server that sent it.
    pub src: Coord,
    /// The service it is for.
    pub service: u16,
    /// Its bytes, in the frame.
    pub data: &'f [u8],
    /// Reliable (delivered in its connection's order, acknowledged) or short.
    pub reliable: bool,
}

/// What [`Transport::poll_transmit`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// The link to send it on.
    pub link: LinkId,
    /// Frame length: `buf[..len]`, Ethernet header included (the MAC addresses are left for
    /// the driver, which knows the link's neighbour).
    pub len: usize,
    /// What the frame is.
    pub kind: TxKind,
    /// Messages it carries.
    pub messages: u32,
    /// For a data frame, the service that sent its messages (whose routing mode applies);
    /// `None` for the connection's own frames (ACK, NACK, SYNC, retransmissions).
    pub service: Option<u16>,
    /// The transport keeps the buffer the frame was built in (the [`Keep`] handle offered):
    /// the driver holds it until [`Transport::take_released`] names it.
    pub kept: bool,
}

/// Kinds of frame the transport sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxKind {
    /// New reliable data.
    Data,
    /// A reliable frame sent again.
    Retransmit,
    /// An explicit acknowledgement.
    Ack,
    /// A negative acknowledgement.
    Nack,
    /// Short (unreliable) messages.
    Short,
    /// Connection setup or reset.
    Sync,
}

/// Counters of one transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// New reliable data frames sent.
    pub data_frames: u64,
    /// Reliable frames sent again.
    pub retransmitted_frames: u64,
    /// New reliable data frames kept for retransmission in the driver's buffer instead of a
    /// copy ([`Keep`]).
    pub kept_frames: u64,
    /// New reliable data frames written straight from the sender's bytes, never queued
    /// ([`Transport::send_framing`]).
    pub framed_straight: u64,
    /// Explicit ACK frames sent.
    pub ack_frames: u64,
    /// NACK frames sent.
    pub nack_frames: u64,
    /// Short-message frames sent.
    pub short_frames: u64,
    /// Reliable messages framed (a fragmented message counts once).
    pub messages_sent: u64,
    /// Short messages framed.
    pub short_messages_sent: u64,
    /// Frames handed in.
    pub frames_received: u64,
    /// Reliable frames received twice.
    pub duplicate_frames: u64,
    /// Frames that arrived beyond the lowest missing one (out of order).
    pub out_of_order_frames: u64,
    /// Frames dropped as malformed or unexpected.
    pub dropped_frames: u64,
    /// Messages delivered to the application.
    pub messages_delivered: u64,
    /// Frames of a connection instance gone on either side, dropped.
    pub stale_frames: u64,
    /// SYNC frames sent.
    pub sync_frames: u64,
    /// Connections reset because the peer's instance changed.
    pub resets: u64,
    /// Connections given up: silent, or the peer unreachable.
    pub broken: u64,
    /// Messages reported failed to their services.
    pub failed_messages: u64,
    /// Reliable messages refused here because no service takes them (their senders are
    /// sent a notice).
    pub refused_no_service: u64,
    /// Reliable messages refused here because their service's queue was full (their
    /// senders are sent a notice).
    pub refused_full: u64,
    /// Messages of this server's services a peer refused (no service there, or its queue
    /// full), reported failed.
    pub refused_by_peers: u64,
    /// Refused messages no service could be told of: a notice naming a message whose record
    /// is gone, an unreadable notice, or one that could not be sent.
    pub notices_unmatched: u64,
}
