//! What the engine tells its driver and its application: actions for received frames,
//! drop reasons, events, message targets and options, counters.

use super::*;

/// What the driver must do with a received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxAction {
    /// Handled here (delivered, or protocol state updated): the buffer is free again.
    Consumed,
    /// Not for this server: send the (already updated) frame on one of these links, the
    /// first that has room; drop it if none has.
    Forward(DirSet),
    /// Dropped, for this reason.
    Drop(DropReason),
}

/// What a frame handed to [`Node::handle_rx_lending`] came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Received<'f> {
    /// A message for a local service, borrowed from the frame (the engine queued no copy
    /// of it): the next event, as [`Event::Message`] with the lent `reliable` and no key.
    /// A reliable one is lent only when it is whole in its frame, the next of its
    /// connection, unfenced or its fence passed, and for no placer. The frame is consumed
    /// once the caller is done with it.
    Message(transport::Lent<'f>),
    /// Anything else: what [`Node::handle_rx`] would have returned.
    Action(RxAction),
}

/// Why a frame was dropped (the per-link drop counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Not a well-formed torus frame.
    Malformed,
    /// A source coordinate outside the torus, or this server's own.
    BadSource,
    /// No live path towards its destination.
    Unreachable,
    /// Its hop budget ran out (a loop, or a path longer than the TTL).
    TtlExpired,
    /// The transport refused it (out of window, bad fragment, too many peers...).
    Transport,
    /// A frame of a connection instance that is gone (sent before a restart or a reset).
    Stale,
    /// A service on the path consumed it.
    Intercepted,
    /// A malformed source route, or one that does not end at the frame's destination.
    BadRoute,
    /// The next hop its source route names is down here (the source was told).
    PathFailed,
}

impl DropReason {
    /// Every reason, for tables.
    pub const ALL: [DropReason; 9] = [
        DropReason::Malformed,
        DropReason::BadSource,
        DropReason::Unreachable,
        DropReason::TtlExpired,
        DropReason::Transport,
        DropReason::Stale,
        DropReason::Intercepted,
        DropReason::BadRoute,
        DropReason::PathFailed,
    ];

    /// Short name for counters.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::BadSource => "bad_source",
            DropReason::Unreachable => "unreachable",
            DropReason::TtlExpired => "ttl_expired",
            DropReason::Transport => "transport",
            DropReason::Stale => "stale",
            DropReason::Intercepted => "intercepted",
            DropReason::BadRoute => "bad_route",
            DropReason::PathFailed => "path_failed",
        }
    }
}

/// A frame [`Node::poll_transmit`] wrote: the link it leaves by, its length, and whether the
/// transport kept its buffer for retransmission (then the driver holds the buffer until
/// [`Node::take_released`] names it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outbound {
    /// The link (direction) to send it on.
    pub dir: Dir,
    /// Its length in bytes, Ethernet header included.
    pub len: usize,
    /// Kept by the transport: not to be reused until released.
    pub kept: bool,
}

/// Something the application learns from the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message for a local service.
    Message {
        /// Who sent it.
        src: Coord,
        /// The service it is for.
        service: u16,
        /// Its bytes.
        data: Vec<u8>,
        /// Reliable, or short.
        reliable: bool,
        /// The routing key it was sent to, for key-routed messages.
        key: Option<u64>,
    },
    /// A server became unreachable in this server's view (CamCube's failure notification).
    Unreachable(Coord),
    /// A server became reachable again.
    Reachable(Coord),
    /// The servers that take keys changed where reachability did not: a reachable server
    /// finished joining (or began again), so the roots of some keys moved. Soft state kept
    /// at keys' roots (directories, primaries) is sent there again.
    RootsMoved,
    /// Reliable messages of `service` to `peer` were acknowledged, in send order (`count`
    /// since the last report, the last tagged `last_tag`); for services that asked.
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
    /// Messages of `service` to `peer` that will never be delivered (tags in send order).
    Failed {
        /// The server they were for.
        peer: Coord,
        /// The service that sent them.
        service: u16,
        /// Their tags.
        tags: Vec<u64>,
        /// Why.
        reason: FailReason,
    },
    /// The peer restarted or reset its connection with this server.
    PeerReset {
        /// The peer.
        peer: Coord,
        /// Restarted, or reset.
        reason: FailReason,
    },
}

impl From<transport::TransportEvent> for Event {
    fn from(e: transport::TransportEvent) -> Event {
        match e {
            transport::TransportEvent::Message {
                src,
                service,
                data,
                reliable,
            } => Event::Message {
                src,
                service,
                data,
                reliable,
                key: None,
            },
            transport::TransportEvent::Acked {
                peer,
                service,
                count,
                last_tag,
            } => Event::Acked {
                peer,
                service,
                count,
                last_tag,
            },
            transport::TransportEvent::Failed {
                peer,
                service,
                tags,
                reason,
            } => Event::Failed {
                peer,
                service,
                tags,
                reason,
            },
            transport::TransportEvent::PeerReset { peer, reason } => {
                Event::PeerReset { peer, reason }
            }
        }
    }
}

/// An event borrowed from the engine ([`Node::poll_event_ref`]): a message the transport
/// delivered is a slice of its inbox, valid until the next call on the engine; any other
/// event, messages the engine delivered itself included, is owned.
pub type EventRef<'a> = transport::EventRef<'a, Event>;

/// Where a message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A server.
    Server(Coord),
    /// The server that roots a key (re-evaluated at every hop for short messages; resolved
    /// once, at the sender, for reliable ones, which then travel to that server).
    Key(u64),
}

/// How a message is sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MsgOptions {
    /// Reliable (exactly once, any size, fences honoured) or short (one frame, best effort).
    pub reliable: bool,
    /// Ordering constraints (reliable messages).
    pub fences: Fences,
    /// Let services on the path see it (key-routed short messages).
    pub intercept: bool,
    /// The sender's name for the message, returned in its acknowledgement or failure report.
    pub tag: u64,
    /// The local service that sends it, when not the destination service itself (an
    /// application talking to another service): its acknowledgement or failure is reported
    /// to this one.
    pub from: Option<u16>,
}

/// Counters of the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Frames forwarded towards another server.
    pub forwarded: u64,
    /// Key-routed messages delivered here (this server is the key's root in its view).
    pub key_delivered: u64,
    /// Frames seen by an interceptor.
    pub intercepted: u64,
    /// Key-routed messages dropped here because no server took keys in this server's
    /// view (it was cut off, or had just restarted and knew nobody yet).
    pub key_no_root: u64,
}
