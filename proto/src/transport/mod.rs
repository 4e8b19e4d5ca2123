//! The reliable multi-link transport of one server, sans-IO (MultiEdge's protocol with
//! CamCube's per-link service queuing and packet aggregation).
//!
//! Call order, as in quinn-proto: the application [`Transport::send`]s messages; the driver
//! hands in every frame addressed to this server with [`Transport::handle_frame`] and calls
//! [`Transport::handle_timeout`] when [`Transport::poll_timeout`] says; whenever some links
//! have room it calls [`Transport::poll_transmit`] until it returns `None`; and it drains
//! [`Transport::poll_event`] for delivered messages. Nothing here reads a clock or touches a
//! socket, so the same code runs over AF_XDP, in-memory links and the simulator.
//!
//! - Window: fixed, in frames, per peer ([`sender`], [`receiver`]).
//! - ACKs: cumulative + 64-bit selective bitmap, piggybacked on every frame to the peer;
//!   explicit ACKs delayed until `ack_every` frames or `ack_delay`.
//! - NACKs: sent as soon as a gap is `nack_threshold` frames old (the reordering striping
//!   causes is tolerated), one NACK naming every hole in the bitmap; repeated while gaps
//!   stay open, after twice the measured NACK-to-repair time (bounded by `nack_retry`).
//! - Coarse timeout: resends the oldest unacknowledged frame when nothing has moved for an
//!   RTO (srtt + 4 rttvar, at least `min_rto`, doubling while nothing moves).
//! - Striping: each connection round-robins its frames over the usable links towards the
//!   peer (the routing next-hop set, or several direct links) that have room.
//! - Fences and fragmentation: [`delivery`].
//! - Aggregation: consecutive small messages of a service to the same peer share a frame up
//!   to the MTU, flushed as soon as a link has room (or after `agg_delay` when that is set).
//! - Fair queuing among services: [`fair_queue`].
//! - Connection instances, the SYNC handshake, resets on a peer's restart and the deadline
//!   for silent peers: [`lifecycle`]; every reliable message ends in one report to its
//!   service, acknowledged or failed: [`completion`].

pub mod byte_ring;
pub mod completion;
pub mod connection;
pub mod delivery;
mod direct;
pub mod fair_queue;
pub mod hosted;
pub mod inbox;
pub mod kept;
pub mod lifecycle;
pub mod notice;
pub mod pacing;
pub mod pool;
pub mod receiver;
pub mod sender;
pub mod seqnum;
pub mod stripe;
pub mod tags;

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use std::time::Duration;

use completion::AckedRun;
use connection::{ConnConfig, Connection};
pub use delivery::Fences;
use delivery::{DeliveryError, Release};
use fair_queue::{FairQueue, Joining, Queued, Refused};
pub use hosted::HostedServices;
pub use inbox::EventRef;
use inbox::Inbox;
use kept::KeptFrame;
pub use kept::{Keep, KeptFrames};
pub use lifecycle::FailReason;
use lifecycle::{LifecycleConfig, SyncOutcome};
pub use notice::NOTICES;
use pacing::RxPacing;
use receiver::{Arrival, RecvConfig};
use sender::SendConfig;
use tags::TagRun;

use crate::rng::SplitMix64;
use crate::time::Time;
use crate::topology::Coord;
use crate::wire::{
    self, flags, msg_flags, Dest, FrameView, Header, Kind, WireError, ETH_LEN, HEADERS_LEN,
    MSG_HEADER_LEN, TORUS_LEN,
};

/// A link of this server, numbered by the driver (in a torus: the direction, 0..=5).
pub type LinkId = u8;

/// A set of links, one bit per link id (up to 8 links).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct LinkSet(pub u8);

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

/// Settings of the transport.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Sliding window per peer, in frames. 512 by measurement (`docs/transport.md`): the
    /// knee of goodput at 100 us round trips over 3 links, and at most 4.6 MB held per
    /// peer with jumbo frames.
    pub window: u32,
    /// Explicit ACK after this many frames with nothing to piggyback on.
    pub ack_every: u32,
    /// ... or after this long.
    pub ack_delay: Duration,
    /// Reordering tolerated before a gap is NACKed (frames).
    pub nack_threshold: u32,
    /// Repeat NACKs for gaps still open after at most this long (adaptive below it).
    pub nack_retry: Duration,
    /// Shortest NACK repeat interval.
    pub nack_retry_min: Duration,
    /// Lower bound of the coarse retransmission timeout.
    pub min_rto: Duration,
    /// Upper bound of the retransmission timeout after backoff.
    pub max_rto: Duration,
    /// Timeout before a peer's round trip has been measured (a connection that has sent
    /// little, behind deep queues, must not time out spuriously).
    pub initial_rto: Duration,
    /// Link MTU: bytes after the Ethernet header (1500, or 9000 for jumbo frames).
    pub mtu: usize,
    /// Pack several small messages into one frame.
    pub aggregate: bool,
    /// Hold a partly filled aggregated frame at most this long for more messages (zero:
    /// send as soon as a link has room, which aggregates exactly what queued meanwhile).
    pub agg_delay: Duration,
    /// Largest reliable message, in bytes.
    pub max_message: usize,
    /// Bytes each service may have queued before `send` answers would-block (each message
    /// counts with its 6-byte aggregation header).
    pub queue_bytes: usize,
    /// Most peers a server keeps connections with (bounds memory under hostile input).
    pub max_peers: usize,
    /// This dataplane's incarnation, drawn at every start: SYNCs carry it, so a peer tells
    /// a restart from a reset, and connection ids are drawn from it.
    pub incarnation: u64,
    /// A connection that waits for its peer this long without any progress (no
    /// acknowledgement, no answer to its SYNC) is broken: its messages are reported failed
    /// and its memory released. Many RTOs, so loss alone never breaks a connection.
    pub broken_after: Duration,
    /// First interval between unanswered SYNCs (then doubling).
    pub sync_retry: Duration,
    /// Idle buffers for copies of sent frames kept for reuse, shared by all peers. A
    /// window's worth means a sender in steady state allocates nothing (with 64, a
    /// 512-frame window freed and allocated again every frame past the 64th); a process
    /// running thousands of engines (the simulator) keeps fewer.
    pub spare_frames: usize,
    /// Hold a queued message whose bytes are all one value as that value and its length,
    /// writing the bytes out only into the frame (frames are the same either way). For the
    /// simulator, whose benchmark payloads are such runs: thousands of engines otherwise
    /// each copy every payload into a queue of their own. Off in a dataplane, where
    /// looking would cost a pass over every message for nothing.
    pub compact_runs: bool,
    /// With `compact_runs`: a short frame whose tail is a message held as a run leaves that
    /// run unwritten in the driver's buffer and says so
    /// ([`Transport::take_declared_tail`], right after the frame). For the simulator,
    /// which carries such tails as a count anyway: writing 8 KB only to scan it back was a
    /// tenth of its run. A driver that sets it must write or carry every declared tail.
    pub declare_tails: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            window: 512,
            ack_every: 64,
            ack_delay: Duration::from_micros(200),
            nack_threshold: 3,
            nack_retry: Duration::from_millis(1),
            nack_retry_min: Duration::from_micros(20),
            min_rto: Duration::from_millis(2),
            max_rto: Duration::from_millis(200),
            initial_rto: Duration::from_millis(20),
            mtu: 1500,
            aggregate: true,
            agg_delay: Duration::ZERO,
            max_message: 64 << 20,
            queue_bytes: 1 << 20,
            max_peers: 1 << 16,
            incarnation: 0,
            broken_after: Duration::from_secs(3),
            sync_retry: Duration::from_millis(5),
            spare_frames: 512,
            compact_runs: false,
            declare_tails: false,
        }
    }
}

impl Config {
    /// Payload bytes a frame can carry at this MTU.
    pub fn max_payload(&self) -> usize {
        self.mtu.saturating_sub(TORUS_LEN)
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
    /// inside torusd is its own code, and a check per message cost 7-10 instructions of its
    /// fast path.
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
pub enum Event {
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

/// A message handed back by [`Transport::handle_parsed_lending`] (and
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

/// A service's way to take its reliable messages straight from the frame they arrived in,
/// when they may be delivered at once (remote memory writes bytes in place this way): it
/// returns what to deliver to the service instead, if anything.
pub trait Placer: Send {
    /// Takes message `data` from `src`; `now` is the frame's arrival.
    fn place(&mut self, now: Time, src: Coord, data: &[u8]) -> Option<Vec<u8>>;
}

/// The placers of a transport, by service.
#[derive(Default)]
struct Placers(Vec<(u16, Box<dyn Placer>)>);

impl std::fmt::Debug for Placers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(s, _)| s))
            .finish()
    }
}

impl Placers {
    fn get(&mut self, service: u16) -> Option<&mut Box<dyn Placer>> {
        self.0
            .iter_mut()
            .find(|(s, _)| *s == service)
            .map(|(_, p)| p)
    }
}

/// What the receiver learnt checking an aggregated frame's messages.
#[derive(Debug, Clone, Copy)]
struct Batch {
    /// How many messages the frame carries (0 when not aggregated).
    messages: u32,
    /// None of them is fenced or for a service with a placer: they may be released as a
    /// whole when they are next in order.
    plain: bool,
}

/// Where a connection's delivery gate releases messages: to the service's placer when it
/// has one (in delivery order, so a placer never sees a message before one a fence put ahead
/// of it), else into the inbox, copied once from the frame.
///
/// A message for a service this server does not host, or whose queue is full, is not
/// delivered: it is listed in `refused` for a notice to its sender. A notice from the peer
/// is listed in `notices`.
struct Deliver<'a> {
    now: Time,
    src: Coord,
    placers: &'a mut Placers,
    inbox: &'a mut Inbox,
    delivered: &'a mut u64,
    hosted: Option<&'a HostedServices>,
    refused: &'a mut Vec<(u16, u64, FailReason)>,
    notices: &'a mut Vec<(u16, u64, FailReason)>,
    bad_notices: &'a mut u64,
}

impl Release for Deliver<'_> {
    fn release(&mut self, msn: u64, service: u16, data: &[u8]) {
        if service == NOTICES {
            match notice::decode(data) {
                Some((reason, entries)) => self
                    .notices
                    .extend(entries.map(|(s, msn)| (s, msn, reason))),
                None => *self.bad_notices += 1,
            }
            return;
        }
        if let Some(reason) = self.hosted.and_then(|h| h.refusal(service)) {
            self.refused.push((service, msn, reason));
            return;
        }
        *self.delivered += 1;
        match self.placers.get(service) {
            Some(p) => {
                if let Some(data) = p.place(self.now, self.src, data) {
                    self.inbox.push(Event::Message {
                        src: self.src,
                        service,
                        data,
                        reliable: true,
                    });
                }
            }
            None => self.inbox.push_message(self.src, service, data, true),
        }
    }
}

/// Connection deadlines, earliest first (see [`Transport::note`]).
type Deadlines = std::collections::BinaryHeap<std::cmp::Reverse<(Time, Coord)>>;

/// The reliable transport of one server.
#[derive(Debug)]
pub struct Transport {
    placers: Placers,
    local: Coord,
    cfg: Config,
    /// Boxed: a connection is most of a kilobyte, and lookups probe several entries; in
    /// place they would stride through cache lines of other connections.
    /// Only peers with reliable traffic have one: a server sending short messages to
    /// thousands of peers keeps nothing per peer for them.
    conns: FxHashMap<Coord, Box<Connection>>,
    /// Striping of short (unreliable) frames, which belong to no connection.
    short_stripe: stripe::Stripe,
    /// Peers with retransmissions, NACKs or ACKs to send.
    urgent: VecDeque<Coord>,
    queues: FairQueue,
    events: Inbox,
    stats: Stats,
    /// The latest time the driver told us about (aggregation deadlines before it are due
    /// already and wait only for link room, not for a timer).
    last_now: Time,
    /// Connection deadlines, earliest first; an entry may be stale (the connection's timer
    /// moved since), which only costs a look when it comes up. Scanning every connection
    /// for every timer query cost O(peers) per frame with hundreds of peers.
    deadlines: Deadlines,
    /// Buffers for the copies of sent frames, shared by all connections.
    pool: pool::BufferPool,
    /// Scratch list of peers whose timers are due (kept to avoid an allocation per call).
    due: Vec<Coord>,
    /// Draws connection ids.
    rng: SplitMix64,
    /// Services that want [`Event::Acked`].
    notify: rustc_hash::FxHashSet<u16>,
    /// Scratch for acknowledged runs.
    acked: Vec<AckedRun>,
    /// Peers still to be told of this start ([`Transport::announce`]).
    announce: VecDeque<Coord>,
    /// Receiver pacing: the room the driver stated, shared among active senders.
    pacing: RxPacing,
    /// Peers told a small grant, to be told at once when room returns.
    starved: Vec<Coord>,
    /// The unwritten tail of the frame built last ([`Config::declare_tails`]).
    declared: Option<(usize, u8)>,
    /// The services this server hosts, when the driver says ([`Transport::set_hosted`]);
    /// without it every service counts as hosted.
    hosted: Option<std::sync::Arc<HostedServices>>,
    /// Scratch: messages of the frame in hand refused (no service, or its queue full), and
    /// entries of notices it carried.
    refused: Vec<(u16, u64, FailReason)>,
    notices: Vec<(u16, u64, FailReason)>,
    notice_buf: Vec<u8>,
    /// Scratch: (service, tag, why) of messages of ours the peer's notices named.
    refused_by_peer: Vec<(u16, u64, FailReason)>,
}

/// Bytes of a SYNC payload: the sender's incarnation (u64) and flags (u8).
const SYNC_PAYLOAD: usize = 9;
/// SYNC flag: an announcement of a (re)start, not a handshake (no connection id).
const SYNC_ANNOUNCE: u8 = 1;

/// A SYNC's incarnation and flags.
fn sync_payload(view: &FrameView<'_>) -> Option<(u64, u8)> {
    let p = view.payload();
    let inc = u64::from_be_bytes(p.get(..8)?.try_into().ok()?);
    Some((inc, *p.get(8)?))
}

impl Transport {
    /// The transport of server `local`.
    pub fn new(local: Coord, cfg: Config) -> Transport {
        Transport {
            placers: Placers::default(),
            local,
            cfg,
            conns: FxHashMap::default(),
            short_stripe: stripe::Stripe::default(),
            urgent: VecDeque::new(),
            queues: {
                let q = if cfg.compact_runs {
                    FairQueue::compacting(cfg.queue_bytes)
                } else {
                    FairQueue::new(cfg.queue_bytes)
                };
                // Messages that will share a frame share a queue entry.
                if cfg.aggregate {
                    q.grouping(cfg.max_payload())
                } else {
                    q
                }
            },
            events: Inbox::default(),
            stats: Stats::default(),
            last_now: Time::ZERO,
            deadlines: std::collections::BinaryHeap::new(),
            pool: pool::BufferPool::new(cfg.spare_frames),
            due: Vec::new(),
            rng: SplitMix64::new(
                cfg.incarnation
                    ^ (u64::from(local.x) << 32 | u64::from(local.y) << 16 | u64::from(local.z))
                        .wrapping_mul(0x9E37_79B9_7F4A_7C15),
            ),
            notify: Default::default(),
            acked: Vec::new(),
            announce: VecDeque::new(),
            pacing: RxPacing::new(cfg.window),
            starved: Vec::new(),
            declared: None,
            hosted: None,
            refused: Vec::new(),
            notices: Vec::new(),
            notice_buf: Vec::new(),
            refused_by_peer: Vec::new(),
        }
    }

    /// This transport with other settings (source routing shrinks the frame size): what its
    /// setters configured (placers, service weights and queue limits, acknowledgement
    /// notices, the hosted set) carries over, so the order in which a driver configures it
    /// does not matter. Connections and queued messages do not: call it before any traffic.
    pub fn reconfigure(&mut self, cfg: Config) {
        let mut t = Transport::new(self.local, cfg);
        t.placers = std::mem::take(&mut self.placers);
        t.queues.take_settings(&self.queues);
        t.notify = std::mem::take(&mut self.notify);
        t.hosted = self.hosted.take();
        *self = t;
    }

    /// Why a reliable message for `service` would be refused here now, if it would (never
    /// without a hosted set).
    pub fn refusal(&self, service: u16) -> Option<FailReason> {
        self.hosted.as_deref().and_then(|h| h.refusal(service))
    }

    /// From now on, reliable messages for services outside `hosted` are refused and their
    /// senders told ([`FailReason::NoService`]); `None`: every service counts as hosted.
    pub fn set_hosted(&mut self, hosted: Option<std::sync::Arc<HostedServices>>) {
        self.hosted = hosted;
    }

    // ---- getters ----

    /// The server this transport belongs to.
    pub fn local(&self) -> Coord {
        self.local
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Messages waiting in service queues.
    pub fn queued_messages(&self) -> usize {
        self.queues.total()
    }

    /// Frames in flight to all peers.
    pub fn in_flight(&self) -> u64 {
        self.conns.values().map(|c| c.send.in_flight()).sum()
    }

    /// Bytes held: queued messages, frames kept for retransmission.
    pub fn held_bytes(&self) -> usize {
        self.queues.total_bytes()
            + self
                .conns
                .values()
                .map(|c| c.send.held_bytes())
                .sum::<usize>()
    }

    /// The smoothed round-trip time to every peer with a measurement (at most `max`).
    pub fn rtts(&self, max: usize) -> Vec<(Coord, Duration)> {
        self.conns
            .iter()
            .filter_map(|(p, c)| c.send.srtt().map(|r| (*p, r)))
            .take(max)
            .collect()
    }

    /// The smoothed round-trip time to `peer`, once measured.
    pub fn srtt(&self, peer: Coord) -> Option<Duration> {
        self.conns.get(&peer).and_then(|c| c.send.srtt())
    }

    // ---- application ----

    /// Lets `service` take its whole reliable messages straight from their frames.
    pub fn set_placer(&mut self, service: u16, placer: Box<dyn Placer>) {
        self.placers.0.retain(|(s, _)| *s != service);
        self.placers.0.push((service, placer));
    }

    /// Sets a service's fair-queuing weight (frames per turn) and queue limit in bytes.
    pub fn configure_service(&mut self, service: u16, weight: u32, queue_bytes: usize) {
        self.queues.configure(service, weight, queue_bytes);
    }

    /// Whether `service` gets an [`Event::Acked`] as its reliable messages are acknowledged
    /// (failures are always reported).
    pub fn notify_acks(&mut self, service: u16, on: bool) {
        if on {
            self.notify.insert(service);
        } else {
            self.notify.remove(&service);
        }
    }

    /// The driver can take `frames` more frames now (receiver pacing, [`pacing`]): shared
    /// among the peers sending to this server and granted to them in every acknowledgement.
    /// A driver that never calls this grants nothing, and senders' own windows apply.
    pub fn set_rx_room(&mut self, now: Time, frames: u32) {
        self.pacing.set_room(frames);
        if self.pacing.count_due(now) {
            let n = self
                .conns
                .values()
                .filter(|c| RxPacing::is_active(c.pace.last_data, now))
                .count();
            self.pacing.set_active(now, n as u32);
        }
        if !self.starved.is_empty() && self.pacing.room_returned() {
            for peer in std::mem::take(&mut self.starved) {
                if let Some(c) = self.conns.get_mut(&peer) {
                    c.pace.starved = false;
                    c.pace.window_update = true;
                }
                self.mark_urgent(peer);
            }
        }
    }

    /// The connection id of the current instance with `peer`, and the peer's as known.
    pub fn connection_ids(&self, peer: Coord) -> Option<(u32, Option<u32>)> {
        self.conns
            .get(&peer)
            .map(|c| (c.life.cid(), c.life.peer_cid()))
    }

    /// Peers with a connection (for reports).
    pub fn peers(&self) -> usize {
        self.conns.len()
    }

    /// Opens the connection with `peer` ahead of any message (the handshake takes a round
    /// trip; sends made meanwhile wait for it).
    pub fn connect(&mut self, now: Time, peer: Coord) -> Result<(), SendError> {
        if peer == self.local {
            return Err(SendError::ToSelf);
        }
        if !self.conns.contains_key(&peer) {
            if self.conns.len() >= self.cfg.max_peers {
                return Err(SendError::TooManyPeers);
            }
            let c = self.new_conn(peer);
            self.conns.insert(peer, c);
        }
        if let Some(c) = self.conns.get_mut(&peer) {
            if !c.life.established() {
                c.life.want_sync(now);
                c.life.set_waiting(now, true, false);
                self.mark_urgent(peer);
                self.note(peer);
            }
        }
        Ok(())
    }

    /// Whether the connection with `peer` is established (its SYNC was answered).
    pub fn is_established(&self, peer: Coord) -> bool {
        self.conns.get(&peer).is_some_and(|c| c.life.established())
    }

    /// Ends the connection with `peer` (the peer became unreachable): every message not
    /// acknowledged is reported failed, its memory is released, and a later send starts a
    /// new instance.
    pub fn abort(&mut self, peer: Coord, reason: FailReason) {
        let mut failed: Vec<(u16, u64)> = Vec::new();
        if let Some(mut c) = self.conns.remove(&peer) {
            failed.extend(c.sent.drain());
            c.send.release(&mut self.pool);
            self.stats.broken += 1;
        }
        // Short messages to it wait in the queues without a connection.
        failed.extend(self.queues.remove_dest(peer));
        self.report_failed(peer, failed, reason);
    }

    /// The peer's instance changed: both streams start over, and what was not acknowledged
    /// (framed or still queued) is reported failed.
    fn reset_conn(&mut self, peer: Coord, reason: FailReason) {
        let Some(c) = self.conns.get_mut(&peer) else {
            return;
        };
        let mut failed: Vec<(u16, u64)> = c.sent.drain().collect();
        c.reset_streams(&mut self.pool);
        c.queued = 0;
        failed.extend(self.queues.remove_dest(peer));
        self.stats.resets += 1;
        self.report_failed(peer, failed, reason);
        self.events.push(Event::PeerReset { peer, reason });
    }

    /// One [`Event::Failed`] per service, tags in send order.
    fn report_failed(&mut self, peer: Coord, failed: Vec<(u16, u64)>, reason: FailReason) {
        let mut by_service: Vec<(u16, Vec<u64>)> = Vec::new();
        // A notice that did not arrive concerns nobody here: the peer it was for is gone.
        for (service, tag) in failed.into_iter().filter(|(s, _)| *s != NOTICES) {
            match by_service.iter_mut().find(|(s, _)| *s == service) {
                Some((_, tags)) => tags.push(tag),
                None => by_service.push((service, vec![tag])),
            }
        }
        for (service, tags) in by_service {
            self.stats.failed_messages += tags.len() as u64;
            self.events.push(Event::Failed {
                peer,
                service,
                tags,
                reason,
            });
        }
    }

    /// Marks `peer` as having something urgent (SYNC, retransmission, ACK, NACK) to send.
    fn mark_urgent(&mut self, peer: Coord) {
        if let Some(c) = self.conns.get_mut(&peer) {
            if !c.urgent {
                c.urgent = true;
                self.urgent.push_back(peer);
            }
        }
    }

    /// Queues a message. Refused (nothing taken) when the service's queue is full.
    #[inline(always)]
    pub fn send(&mut self, now: Time, m: Outgoing<'_>) -> Result<(), SendError> {
        self.send_hinted(now, m, None)
    }

    /// Where the state a send reads lives: see [`crate::node::Node::send_lines`].
    pub(crate) fn send_lines(&self) -> [*const u8; 4] {
        [
            std::ptr::from_ref(&self.cfg).cast(),
            std::ptr::from_ref(&self.queues).cast(),
            std::ptr::from_ref(&self.stats).cast(),
            self.queues.first_queue(),
        ]
    }

    /// [`Transport::send`], with `run` the value every byte of the message has if the
    /// caller looked (once for many sends of the same bytes, as the simulator does): a
    /// compacting queue then does not look again.
    ///
    /// Always inline: the join is a few dozen instructions, and the compiler, left to
    /// choose, stopped inlining it once a second caller appeared in a crate (a call per
    /// message, 342 -> 381 instructions in `bench/transport-cost.sh`).
    #[inline(always)]
    pub(crate) fn send_hinted(
        &mut self,
        now: Time,
        m: Outgoing<'_>,
        run: Option<u8>,
    ) -> Result<(), SendError> {
        debug_assert!(run.is_none_or(|v| m.data.iter().all(|b| *b == v)));
        // A small message joining the group behind it needs none of the checks of a new
        // entry: the group's first message passed them for the same peer, and the group fits
        // a frame. Kept apart from them, so that it is a few dozen instructions inline.
        let unfenced = !(m.reliable && (m.fences.backward || m.fences.forward));
        if unfenced
            && self.queues.try_join(
                m.from,
                &Joining {
                    dest: m.dest,
                    service: m.service,
                    reliable: m.reliable,
                    tag: m.tag,
                    data: m.data,
                },
            )
        {
            return Ok(());
        }
        self.send_new_entry(now, m, run)
    }

    /// [`Transport::send_hinted`] for a message that opens a queue entry of its own.
    #[inline(never)]
    fn send_new_entry(
        &mut self,
        now: Time,
        m: Outgoing<'_>,
        run: Option<u8>,
    ) -> Result<(), SendError> {
        if m.dest == self.local {
            return Err(SendError::ToSelf);
        }
        let max = if m.reliable {
            self.cfg.max_message
        } else {
            self.cfg.max_payload().saturating_sub(MSG_HEADER_LEN)
        };
        if m.data.len() > max || m.data.len() > u32::MAX as usize {
            return Err(SendError::TooLarge {
                len: m.data.len(),
                max,
            });
        }
        let q = Queued {
            tags: TagRun::one(m.tag),
            service: m.service,
            dest: m.dest,
            len: m.data.len() as u32,
            reliable: m.reliable,
            fences: if m.reliable {
                m.fences
            } else {
                Fences::default()
            },
            enqueued: now,
            run,
            groupable: false,
        };
        // The connection is looked up only for a message that opens a queue entry: one that
        // joins the group behind it (most small messages, aggregating) goes to the same
        // peer, whose connection that group's first message found or opened.
        let (conns, urgent, deadlines) = (&mut self.conns, &mut self.urgent, &mut self.deadlines);
        let (rng, cfg) = (&mut self.rng, &self.cfg);
        let admit = || -> Result<(), SendError> {
            // Short messages need no connection: nothing about them is acknowledged.
            if !m.reliable {
                return Ok(());
            }
            let peers = conns.len();
            let c = match conns.get_mut(&m.dest) {
                Some(c) => c,
                None => {
                    if peers >= cfg.max_peers {
                        return Err(SendError::TooManyPeers);
                    }
                    conns
                        .entry(m.dest)
                        .or_insert_with(|| make_conn(rng, cfg, m.dest))
                }
            };
            c.queued += 1;
            if !c.life.established() {
                // Nothing goes before the handshake: ask for it, and start the deadline.
                c.life.want_sync(now);
                c.life.set_waiting(now, true, false);
                if !c.urgent {
                    c.urgent = true;
                    urgent.push_back(m.dest);
                }
                schedule(deadlines, c);
            }
            Ok(())
        };
        match self.queues.push_admitting(m.from, q, m.data, admit) {
            Ok(()) => Ok(()),
            Err(Refused::Full) => Err(SendError::WouldBlock),
            Err(Refused::Admit(e)) => Err(e),
        }
    }

    fn new_conn(&mut self, peer: Coord) -> Box<Connection> {
        make_conn(&mut self.rng, &self.cfg, peer)
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop()
    }

    /// The next event, a message's bytes borrowed from the transport (no allocation): for
    /// consumers that copy what they keep.
    #[inline]
    pub fn poll_event_ref(&mut self) -> Option<EventRef<'_>> {
        self.events.pop_ref()
    }

    // ---- network in ----

    /// Handles a frame addressed to this server (Ethernet header included).
    pub fn handle_frame(&mut self, now: Time, frame: &[u8]) -> Result<(), RecvError> {
        self.stats.frames_received += 1;
        let r = self.handle_frame_inner(now, frame);
        if r.is_err() {
            self.stats.dropped_frames += 1;
        }
        r
    }

    /// Handles a frame addressed to this server that the caller has checked and parsed
    /// already (the engine does, to route it): the same as [`Transport::handle_frame`]
    /// without parsing the header a second time.
    pub fn handle_parsed(
        &mut self,
        now: Time,
        h: &Header,
        view: FrameView<'_>,
    ) -> Result<(), RecvError> {
        self.handle_parsed_lending(now, h, view, false).map(|_| ())
    }

    /// As [`Transport::handle_parsed`], but a message that nothing is queued ahead of is
    /// not copied into the inbox when `lend` is set: it is returned, borrowed from the
    /// frame, for the caller to hand on in its place (as the next event it would have
    /// polled). A short message is lent as the only one of its frame; a reliable one when
    /// it is whole in a plain frame, the next of its connection with no fence to wait for,
    /// and no placer, notice or refusal would take it (it counts as delivered, and its
    /// frame's acknowledgement may leave). Receiving a jumbo frame's message then costs no
    /// copy inside the engine.
    pub fn handle_parsed_lending<'f>(
        &mut self,
        now: Time,
        h: &Header,
        view: FrameView<'f>,
        lend: bool,
    ) -> Result<Option<Lent<'f>>, RecvError> {
        self.stats.frames_received += 1;
        let r = self.handle_view(now, *h, view, lend);
        if r.is_err() {
            self.stats.dropped_frames += 1;
        }
        r
    }

    fn handle_frame_inner(&mut self, now: Time, frame: &[u8]) -> Result<(), RecvError> {
        let view = FrameView::new_checked(frame)?;
        let h = Header::parse(&view)?;
        self.handle_view(now, h, view, false).map(|_| ())
    }

    fn handle_view<'f>(
        &mut self,
        now: Time,
        h: Header,
        view: FrameView<'f>,
        lend: bool,
    ) -> Result<Option<Lent<'f>>, RecvError> {
        if h.dst != Dest::Server(self.local) {
            return Err(RecvError::NotForUs);
        }
        if h.src == self.local {
            return Err(RecvError::FromSelf);
        }
        if h.kind == Kind::Control {
            return Err(RecvError::UnexpectedKind);
        }
        let aggregated = h.has(flags::AGGREGATED);
        let mut batch = Batch {
            messages: 0,
            plain: true,
        };
        if aggregated {
            // Check every message first: a frame is accepted (and acknowledged) whole or
            // not at all, so a bad one is never half-delivered.
            if self.placers.0.is_empty() && self.hosted.is_none() {
                let (count, union, notices) = wire::check_messages(view.payload(), NOTICES)?;
                batch.messages = count;
                batch.plain =
                    union & (msg_flags::BWD_FENCE | msg_flags::FWD_FENCE) == 0 && !notices;
            } else {
                // A message with a placer, for a service not hosted, or a notice is taken
                // one at a time.
                let hosted = self.hosted.as_deref();
                for m in view.messages() {
                    let m = m?;
                    batch.messages += 1;
                    if m.flags & (msg_flags::BWD_FENCE | msg_flags::FWD_FENCE) != 0
                        || m.service == NOTICES
                        || hosted.is_some_and(|h| !h.takes(m.service))
                        || self.placers.get(m.service).is_some()
                    {
                        batch.plain = false;
                    }
                }
            }
            if batch.messages == 0 {
                return Err(RecvError::Wire(WireError::MessageOverrun { at: 0, len: 0 }));
            }
        }
        if h.kind == Kind::Data && !h.has(flags::RELIABLE) {
            if lend && self.events.is_empty() {
                // One message (alone, or the only one of an aggregated frame) is lent.
                let one = if aggregated {
                    (batch.messages == 1)
                        .then(|| view.messages().next())
                        .flatten()
                        .and_then(Result::ok)
                        .map(|m| (m.service, m.data))
                } else {
                    Some((h.service, view.payload()))
                };
                if let Some((service, data)) = one {
                    self.stats.messages_delivered += 1;
                    return Ok(Some(Lent {
                        src: h.src,
                        service,
                        data,
                        reliable: false,
                    }));
                }
            }
            self.deliver_short(&h, &view, batch);
            return Ok(None);
        }
        if h.kind == Kind::Sync && sync_payload(&view).is_some_and(|(_, f)| f & SYNC_ANNOUNCE != 0)
        {
            return self.handle_announce(&h, &view).map(|()| None);
        }
        // One lookup of the connection per frame: it is held to the end. (Not through
        // `entry`, which prepares an insertion every time and cost three lookups' worth.)
        let peers = self.conns.len();
        let conn = match self.conns.get_mut(&h.src) {
            Some(c) => c,
            None => {
                if peers >= self.cfg.max_peers {
                    return Err(RecvError::TooManyPeers);
                }
                self.conns
                    .entry(h.src)
                    .or_insert_with(|| make_conn(&mut self.rng, &self.cfg, h.src))
            }
        };
        if h.kind == Kind::Sync {
            return self.handle_sync(now, &h, &view).map(|()| None);
        }
        if !conn.life.accepts(h.conn, h.peer_conn) {
            // Sent to, or by, an instance that is gone: tell the peer who we are now.
            self.stats.stale_frames += 1;
            conn.life.want_sync(now);
            if !conn.urgent {
                conn.urgent = true;
                self.urgent.push_back(h.src);
            }
            schedule(&mut self.deadlines, conn);
            return Err(RecvError::Stale);
        }
        if h.has(flags::ACK_VALID) {
            let sack = h.has(flags::SACK_VALID).then_some(h.sack);
            let retired = conn
                .send
                .on_ack(now, h.ack, sack, h.kind == Kind::Nack, &mut self.pool)
                .unwrap_or(0);
            conn.send.on_window(h.ack, h.rwnd);
            if retired > 0 {
                conn.life.set_waiting(now, waits(conn), true);
                let mut acked = std::mem::take(&mut self.acked);
                acked.clear();
                conn.sent.on_acked(conn.send.una(), &mut acked);
                for r in &acked {
                    if self.notify.contains(&r.service) {
                        self.events.push(Event::Acked {
                            peer: h.src,
                            service: r.service,
                            count: r.count,
                            last_tag: r.last_tag,
                        });
                    }
                }
                self.acked = acked;
            }
        }
        let mut result = Ok(());
        let mut lent = None;
        if h.kind == Kind::Data {
            conn.pace.last_data = Some(now);
            let before = conn.recv.cum_ack();
            match conn.recv.on_frame(now, h.seq, h.has(flags::RETRANSMIT)) {
                Arrival::New => {
                    if conn.recv.cum_ack() == before {
                        self.stats.out_of_order_frames += 1;
                    }
                    // Lent when nothing is queued ahead of it and nothing would take it
                    // apart from an application's inbox (a placer, a notice, a refusal);
                    // `lone_in_order` goes last, for it marks the message delivered.
                    let lends = lend
                        && self.events.is_empty()
                        && h.service != NOTICES
                        && self.placers.get(h.service).is_none()
                        && self
                            .hosted
                            .as_deref()
                            .and_then(|x| x.refusal(h.service))
                            .is_none()
                        && lone_in_order(conn, &h);
                    if lends {
                        self.stats.messages_delivered += 1;
                        lent = Some(Lent {
                            src: h.src,
                            service: h.service,
                            data: view.payload(),
                            reliable: true,
                        });
                    } else {
                        let mut sink = Deliver {
                            now,
                            src: h.src,
                            placers: &mut self.placers,
                            inbox: &mut self.events,
                            delivered: &mut self.stats.messages_delivered,
                            hosted: self.hosted.as_deref(),
                            refused: &mut self.refused,
                            notices: &mut self.notices,
                            bad_notices: &mut self.stats.notices_unmatched,
                        };
                        result = Self::deliver_reliable(conn, &h, &view, batch, &mut sink);
                    }
                }
                Arrival::Duplicate => self.stats.duplicate_frames += 1,
                Arrival::OutOfWindow => result = Err(RecvError::OutOfWindow),
            }
        }
        // The peer refused messages of ours: the services that sent them learn which, below.
        // (A notice names the service a message was for; the number alone finds it.)
        if !self.notices.is_empty() {
            for (_, msn, why) in self.notices.drain(..) {
                self.stats.refused_by_peers += 1;
                match conn.sent.tag_of(msn) {
                    Some((service, tag)) => self.refused_by_peer.push((service, tag, why)),
                    None => self.stats.notices_unmatched += 1,
                }
            }
        }
        let needs = conn.send.has_retransmit() || conn.recv.ack_due(now) || conn.recv.nack_due(now);
        if needs && !conn.urgent {
            conn.urgent = true;
            self.urgent.push_back(h.src);
        }
        schedule(&mut self.deadlines, conn);
        if !(self.refused.is_empty() && self.refused_by_peer.is_empty()) {
            self.settle_refusals(now, h.src);
        }
        result.map(|()| lent)
    }

    /// After a frame from `peer`: reports the messages of ours its notices named, and tells
    /// it which of its messages this server refused (no service takes them, or its queue is
    /// full), one notice per reason. A notice that cannot be queued (the queue is full, the
    /// peer unreachable) is counted in `notices_unmatched`: the peer's messages were refused
    /// all the same.
    #[cold]
    fn settle_refusals(&mut self, now: Time, peer: Coord) {
        if !self.refused_by_peer.is_empty() {
            let failed = std::mem::take(&mut self.refused_by_peer);
            for reason in notice::REASONS {
                let these = notice::of_reason(&failed, reason);
                if !these.is_empty() {
                    self.report_failed(peer, these, reason);
                }
            }
        }
        let refused = std::mem::take(&mut self.refused);
        let mut buf = std::mem::take(&mut self.notice_buf);
        for reason in notice::REASONS {
            let these = notice::of_reason(&refused, reason);
            match reason {
                FailReason::ReceiverFull => self.stats.refused_full += these.len() as u64,
                _ => self.stats.refused_no_service += these.len() as u64,
            }
            self.send_notices(now, peer, reason, &these, &mut buf);
        }
        self.notice_buf = buf;
        self.refused = refused;
        self.refused.clear();
    }

    /// Queues notices naming `refused` (all for `reason`) to `peer`.
    fn send_notices(
        &mut self,
        now: Time,
        peer: Coord,
        reason: FailReason,
        refused: &[(u16, u64)],
        buf: &mut Vec<u8>,
    ) {
        for chunk in refused.chunks(notice::MAX_ENTRIES) {
            notice::encode(reason, chunk, buf);
            let m = Outgoing {
                dest: peer,
                service: NOTICES,
                from: NOTICES,
                data: buf,
                reliable: true,
                fences: Fences::default(),
                tag: 0,
            };
            if self.send_hinted(now, m, None).is_err() {
                self.stats.notices_unmatched += chunk.len() as u64;
            }
        }
    }

    /// A SYNC from the peer: learn its instance, reset when it changed, answer when it does
    /// not know ours.
    fn handle_sync(
        &mut self,
        now: Time,
        h: &Header,
        view: &FrameView<'_>,
    ) -> Result<(), RecvError> {
        let Some((inc, _)) = sync_payload(view) else {
            return Err(RecvError::BadSync);
        };
        let Some(conn) = self.conns.get_mut(&h.src) else {
            return Err(RecvError::TooManyPeers);
        };
        match conn.life.on_sync(now, h.conn, h.peer_conn, inc) {
            SyncOutcome::Stale => {
                self.stats.stale_frames += 1;
                return Err(RecvError::Stale);
            }
            SyncOutcome::Reset(reason) => self.reset_conn(h.src, reason),
            SyncOutcome::Known | SyncOutcome::Adopted => {}
        }
        if let Some(conn) = self.conns.get_mut(&h.src) {
            conn.send.on_sync_window(h.rwnd);
            let waiting = waits(conn);
            conn.life.set_waiting(now, waiting, true);
            if conn.life.sync_due(now) {
                self.mark_urgent(h.src);
            }
        }
        self.note(h.src);
        Ok(())
    }

    /// A peer announced its (re)start: a connection with an older incarnation of it is reset
    /// at once (its messages reported failed) instead of when it next talks to the new one.
    /// Peers without a connection keep no state for it.
    fn handle_announce(&mut self, h: &Header, view: &FrameView<'_>) -> Result<(), RecvError> {
        let Some((inc, _)) = sync_payload(view) else {
            return Err(RecvError::BadSync);
        };
        let Some(conn) = self.conns.get_mut(&h.src) else {
            return Ok(());
        };
        if let Some(reason) = conn.life.on_announce(inc) {
            self.reset_conn(h.src, reason);
        }
        Ok(())
    }

    /// Announces this (re)started dataplane to `peers` (one SYNC frame each, best effort),
    /// so that peers holding a connection with an earlier incarnation reset it now: the
    /// first messages they send after the restart then reach the new instance instead of
    /// failing against the old one.
    pub fn announce(&mut self, peers: impl IntoIterator<Item = Coord>) {
        let local = self.local;
        self.announce
            .extend(peers.into_iter().filter(|p| *p != local));
    }

    fn poll_announce(
        &mut self,
        room: LinkSet,
        paths: &impl Paths,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        for _ in 0..self.announce.len() {
            let peer = self.announce.pop_front()?;
            let usable = paths.links_to(peer);
            if usable.is_empty() {
                // Unreachable now: it will learn of the restart from the handshake.
                continue;
            }
            let Some(link) = usable.and(room).iter().next() else {
                self.announce.push_back(peer);
                continue;
            };
            let mut h = Header::new(Kind::Sync, self.local, Dest::Server(peer));
            h.payload_len = SYNC_PAYLOAD as u16;
            h.emit(buf).ok()?;
            buf[HEADERS_LEN..HEADERS_LEN + 8].copy_from_slice(&self.cfg.incarnation.to_be_bytes());
            buf[HEADERS_LEN + 8] = SYNC_ANNOUNCE;
            self.stats.sync_frames += 1;
            return Some(Transmit {
                kept: false,
                link,
                len: HEADERS_LEN + SYNC_PAYLOAD,
                kind: TxKind::Sync,
                messages: 0,
                service: None,
            });
        }
        None
    }

    fn deliver_short(&mut self, h: &Header, view: &FrameView<'_>, batch: Batch) {
        if h.has(flags::AGGREGATED) {
            self.stats.messages_delivered += u64::from(batch.messages);
            self.events.push_batch(h.src, view.payload(), false);
        } else {
            self.stats.messages_delivered += 1;
            self.events
                .push_message(h.src, h.service, view.payload(), false);
        }
    }

    /// Offers a reliable data frame's messages to the connection's delivery gate, which
    /// releases into `sink` what its fences allow.
    fn deliver_reliable(
        conn: &mut Connection,
        h: &Header,
        view: &FrameView<'_>,
        batch: Batch,
        sink: &mut Deliver<'_>,
    ) -> Result<(), RecvError> {
        let base = seqnum::expand(h.msn, conn.delivery.base());
        let frame_wait =
            (h.fence != 0 && u64::from(h.fence) <= base).then(|| base - u64::from(h.fence));
        if h.has(flags::AGGREGATED)
            && batch.plain
            && frame_wait.is_none_or(|j| j < base)
            && conn.delivery.can_release_run(base)
        {
            // The next messages in order, none fenced or placed: released together, the
            // payload copied once (the common case of a stream of small messages).
            conn.delivery.release_run(base, u64::from(batch.messages));
            *sink.delivered += u64::from(batch.messages);
            sink.inbox.push_batch(sink.src, view.payload(), true);
            return Ok(());
        }
        if h.has(flags::AGGREGATED) {
            let mut wait_for = frame_wait;
            for (k, m) in view.messages().flatten().enumerate() {
                let msn = base + k as u64;
                let fences = Fences {
                    backward: m.flags & msg_flags::BWD_FENCE != 0,
                    forward: m.flags & msg_flags::FWD_FENCE != 0,
                };
                conn.delivery
                    .offer(msn, m.service, m.data, fences, wait_for, sink);
                if fences.forward {
                    wait_for = Some(msn);
                }
            }
            return Ok(());
        }
        let fences = Fences {
            backward: h.has(flags::BWD_FENCE),
            forward: h.has(flags::FWD_FENCE),
        };
        let (first, last) = (h.has(flags::FRAG_FIRST), h.has(flags::FRAG_LAST));
        if first && last && h.frag == 0 {
            conn.delivery
                .offer(base, h.service, view.payload(), fences, frame_wait, sink);
            Ok(())
        } else {
            conn.delivery
                .offer_fragment(
                    base,
                    h.frag,
                    last,
                    h.service,
                    view.payload(),
                    fences,
                    frame_wait,
                    sink,
                )
                .map_err(RecvError::from)
        }
    }

    // ---- timers ----

    /// Records `peer`'s current deadline (after anything that may have moved it).
    ///
    /// A connection keeps at most one live entry in the heap, its earliest: a deadline that
    /// moved later leaves the earlier entry to fire early and find nothing to do, which is
    /// cheaper than an entry per change (a busy peer changes its timers with every frame).
    fn note(&mut self, peer: Coord) {
        if let Some(c) = self.conns.get_mut(&peer) {
            schedule(&mut self.deadlines, c);
        }
    }

    /// The next time [`Transport::handle_timeout`] must be called, if any (possibly early:
    /// a stale deadline makes a call that finds nothing to do).
    pub fn poll_timeout(&self) -> Option<Time> {
        let mut t: Option<Time> = self.deadlines.peek().map(|r| r.0 .0);
        let mut fold = |x: Option<Time>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        if !self.cfg.agg_delay.is_zero() {
            for i in 0..self.queues.services() {
                let due = self
                    .queues
                    .queue(i)
                    .head()
                    .map(|h| h.enqueued + self.cfg.agg_delay);
                fold(due.filter(|t| *t > self.last_now));
            }
        }
        t
    }

    /// Runs the timers due at `now`: retransmission timeouts, delayed ACKs, NACK retries.
    pub fn handle_timeout(&mut self, now: Time) {
        self.last_now = self.last_now.max(now);
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        while let Some(std::cmp::Reverse((t, peer))) = self.deadlines.peek().copied() {
            if t > now {
                break;
            }
            self.deadlines.pop();
            // Only the connection's live entry counts; others were superseded by it.
            if let Some(c) = self.conns.get_mut(&peer) {
                if c.timer == Some(t) {
                    c.timer = None;
                    due.push(peer);
                }
            }
        }
        for &peer in &due {
            if self.conns.get(&peer).is_some_and(|c| c.life.broken(now)) {
                self.abort(peer, FailReason::Silent);
                continue;
            }
            if let Some(c) = self.conns.get_mut(&peer) {
                c.send.on_timeout(now);
                let needs = c.send.has_retransmit()
                    || c.recv.ack_due(now)
                    || c.recv.nack_due(now)
                    || c.life.sync_due(now);
                if needs && !c.urgent {
                    c.urgent = true;
                    self.urgent.push_back(peer);
                }
            }
            self.note(peer);
        }
        self.due = due;
    }

    // ---- network out ----

    /// Writes the next frame to send into `buf` (which must hold `mtu + 14` bytes), on one
    /// of the links in `room` (those with space in their TX ring). Retransmissions, NACKs
    /// and due ACKs go first, then data in fair-queuing order.
    pub fn poll_transmit(
        &mut self,
        now: Time,
        room: LinkSet,
        paths: &impl Paths,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        self.poll_transmit_keeping(now, room, paths, buf, None)
    }

    /// As [`Transport::poll_transmit`], for a driver that can keep the buffer: a new
    /// reliable frame built in `buf` is kept there (`Transmit::kept`) instead of copied, when
    /// `keep` offers a handle; retransmissions of kept frames are read back through `keep`.
    /// A driver that passes `keep` once must pass it on every call while it has kept frames.
    pub fn poll_transmit_keeping(
        &mut self,
        now: Time,
        room: LinkSet,
        paths: &impl Paths,
        buf: &mut [u8],
        keep: Option<Keep<'_>>,
    ) -> Option<Transmit> {
        self.last_now = self.last_now.max(now);
        self.declared = None;
        if room.is_empty() || buf.len() < ETH_LEN + self.cfg.mtu.max(TORUS_LEN) {
            return None;
        }
        if let Some(t) = self.poll_announce(room, paths, buf) {
            return Some(t);
        }
        if let Some(t) = self.poll_urgent(now, room, paths, buf, keep) {
            return Some(t);
        }
        self.poll_data(now, room, paths, buf, keep)
    }

    /// Whether [`Transport::poll_transmit`] might have a frame: a restart to announce, a
    /// peer with an ACK, NACK, handshake or retransmission to send, or a message queued.
    /// `false` means it has none, so a driver need not find it a buffer and a link to ask;
    /// `true` may still come to nothing (no room, a closed window). A round trip's answer
    /// leaves without that last fruitless call before its kick.
    #[inline]
    pub fn may_transmit(&self) -> bool {
        !(self.announce.is_empty() && self.urgent.is_empty() && self.queues.is_empty())
    }

    /// Where the frame built by the last `poll_transmit` call stops being written, and the
    /// value its bytes from there to its end have ([`Config::declare_tails`]; `None`: every
    /// byte written).
    pub fn take_declared_tail(&mut self) -> Option<(usize, u8)> {
        self.declared.take()
    }

    /// Moves the handles of the driver's buffers the transport no longer keeps (their frames
    /// were acknowledged, or their connection reset) into `out`: the driver may reuse them.
    pub fn take_released(&mut self, out: &mut Vec<u32>) {
        self.pool.take_released(out);
    }

    fn poll_urgent(
        &mut self,
        now: Time,
        room: LinkSet,
        paths: &impl Paths,
        buf: &mut [u8],
        keep: Option<Keep<'_>>,
    ) -> Option<Transmit> {
        for _ in 0..self.urgent.len() {
            let peer = self.urgent.pop_front()?;
            let Some(c) = self.conns.get_mut(&peer) else {
                continue;
            };
            let usable = paths.links_to(peer).and(room);
            let established = c.life.established();
            let piggyback_soon = c.queued > 0 && c.send.can_send() && !c.recv.ack_overdue(now);
            let sync = c.life.sync_due(now);
            let nack = established && c.recv.nack_due(now);
            let ack =
                established && (c.recv.ack_due(now) || c.pace.window_update) && !piggyback_soon;
            if !c.send.has_retransmit() && !nack && !ack && !sync {
                c.urgent = false;
                continue;
            }
            let Some(link) = c.next_link(usable) else {
                self.urgent.push_back(peer);
                continue;
            };
            let local = self.local;
            grant(&self.pacing, &mut self.starved, c);
            // A frame to send again is copied into `buf` first: from the transport's copy,
            // or read back from the driver (a kept frame the driver cannot give back is left
            // for the timeout; an ACK goes instead).
            let resent = if sync {
                None
            } else {
                match c.send.next_retransmit(now) {
                    Some(KeptFrame::Owned(b)) => {
                        buf.get_mut(ETH_LEN..ETH_LEN + b.len()).map(|to| {
                            to.copy_from_slice(b);
                            b.len()
                        })
                    }
                    Some(&KeptFrame::Driver { handle, len }) => keep.and_then(|k| {
                        let len = len as usize;
                        let to = buf.get_mut(ETH_LEN..ETH_LEN + len)?;
                        k.frames.copy_kept(handle, ETH_LEN, to).then_some(len)
                    }),
                    None => None,
                }
            };
            let t = if sync {
                let mut h = Header::new(Kind::Sync, local, Dest::Server(peer));
                h.conn = c.life.cid();
                h.peer_conn = c.life.peer_cid().unwrap_or(0);
                h.payload_len = SYNC_PAYLOAD as u16;
                // The handshake carries the first grant: a sender that knew none would
                // open with a whole window, more than a small receive ring holds.
                h.rwnd = c.pace.granted;
                h.emit(buf).ok()?;
                buf[HEADERS_LEN..HEADERS_LEN + 8]
                    .copy_from_slice(&self.cfg.incarnation.to_be_bytes());
                buf[HEADERS_LEN + 8] = 0;
                c.life.on_sync_sent(now);
                self.stats.sync_frames += 1;
                Transmit {
                    kept: false,
                    link,
                    len: HEADERS_LEN + SYNC_PAYLOAD,
                    kind: TxKind::Sync,
                    messages: 0,
                    service: None,
                }
            } else if let Some(n) = resent {
                let len = ETH_LEN + n;
                buf[wire::offset::ETHERTYPE..wire::offset::ETHERTYPE + 2]
                    .copy_from_slice(&wire::ETHERTYPE_DATA.to_be_bytes());
                refresh_ack(buf, c);
                let fl =
                    u16::from_be_bytes([buf[wire::offset::FLAGS], buf[wire::offset::FLAGS + 1]])
                        | flags::RETRANSMIT;
                buf[wire::offset::FLAGS..wire::offset::FLAGS + 2]
                    .copy_from_slice(&fl.to_be_bytes());
                self.stats.retransmitted_frames += 1;
                Transmit {
                    kept: false,
                    link,
                    len,
                    kind: TxKind::Retransmit,
                    messages: 0,
                    service: None,
                }
            } else {
                let kind = if nack { Kind::Nack } else { Kind::Ack };
                let mut h = Header::new(kind, local, Dest::Server(peer));
                h.conn = c.life.cid();
                h.peer_conn = c.life.peer_cid().unwrap_or(0);
                h.flags = flags::ACK_VALID | flags::SACK_VALID;
                h.ack = seqnum::truncate(c.recv.cum_ack());
                h.sack = c.recv.sack_bits();
                h.rwnd = c.pace.granted;
                h.emit(buf).ok()?;
                if nack {
                    c.recv.on_nack_sent(now);
                    self.stats.nack_frames += 1;
                } else {
                    c.recv.on_ack_sent();
                    self.stats.ack_frames += 1;
                }
                Transmit {
                    kept: false,
                    link,
                    len: HEADERS_LEN,
                    kind: if nack { TxKind::Nack } else { TxKind::Ack },
                    messages: 0,
                    service: None,
                }
            };
            let still = c.send.has_retransmit()
                || c.life.sync_due(now)
                || (c.life.established()
                    && (c.recv.nack_due(now) || c.recv.ack_due(now) || c.pace.window_update));
            if still {
                self.urgent.push_back(peer);
            } else {
                c.urgent = false;
            }
            schedule(&mut self.deadlines, c);
            return Some(t);
        }
        None
    }

    fn poll_data(
        &mut self,
        now: Time,
        room: LinkSet,
        paths: &impl Paths,
        buf: &mut [u8],
        keep: Option<Keep<'_>>,
    ) -> Option<Transmit> {
        let n = self.queues.services();
        let start = self.queues.order().next().unwrap_or(0);
        for k in 0..n {
            let qi = (start + k) % n.max(1);
            let Some(head) = self.queues.queue(qi).head().copied() else {
                continue;
            };
            let from = self.queues.queue(qi).service;
            let usable = paths.links_for(head.dest, from).and(room);
            if usable.is_empty() {
                continue;
            }
            if !self.cfg.agg_delay.is_zero()
                && self.cfg.aggregate
                && now < head.enqueued + self.cfg.agg_delay
                && !frame_would_fill(self.queues.queue(qi), &self.cfg)
            {
                continue;
            }
            let t = if head.reliable {
                let Some(conn) = self.conns.get_mut(&head.dest) else {
                    continue;
                };
                if !(conn.life.established() && conn.send.can_send()) {
                    continue;
                }
                let link = conn.next_link(usable)?;
                grant(&self.pacing, &mut self.starved, conn);
                let t = build_data_frame(
                    self.local,
                    &self.cfg,
                    now,
                    conn,
                    self.queues.queue_mut(qi),
                    link,
                    buf,
                    &mut self.stats,
                    &mut self.pool,
                    keep.and_then(|k| k.handle),
                );
                schedule(&mut self.deadlines, conn);
                t
            } else {
                let link = self.short_stripe.next(usable)?;
                build_short_frame(
                    self.local,
                    &self.cfg,
                    self.queues.queue_mut(qi),
                    link,
                    buf,
                    &mut self.stats,
                    &mut self.declared,
                )
            };
            self.queues.used_turn(qi);
            return Some(t);
        }
        None
    }
}

/// Whether the run of messages at the queue's head that could share one frame fills it.
fn frame_would_fill(q: &fair_queue::ServiceQueue, cfg: &Config) -> bool {
    let Some(h) = q.head() else {
        return false;
    };
    if q.head_progress().sent != 0 {
        // A message going out in fragments: never aggregated.
        return false;
    }
    let room = cfg.max_payload();
    let mut used = 0usize;
    for m in q.iter() {
        if m.dest != h.dest || m.reliable != h.reliable {
            break;
        }
        used += MSG_HEADER_LEN + m.len as usize;
        if used >= room {
            return true;
        }
    }
    false
}

/// Writes the piggybacked acknowledgement of `c` into a frame in `buf` and notes it sent.
fn refresh_ack(buf: &mut [u8], c: &mut Connection) {
    let mut fl = u16::from_be_bytes([buf[wire::offset::FLAGS], buf[wire::offset::FLAGS + 1]]);
    fl |= flags::ACK_VALID | flags::SACK_VALID;
    buf[wire::offset::FLAGS..wire::offset::FLAGS + 2].copy_from_slice(&fl.to_be_bytes());
    let ack = seqnum::truncate(c.recv.cum_ack());
    buf[wire::offset::ACK..wire::offset::ACK + 4].copy_from_slice(&ack.to_be_bytes());
    buf[wire::offset::SACK..wire::offset::SACK + 8]
        .copy_from_slice(&c.recv.sack_bits().to_be_bytes());
    buf[wire::offset::RWND..wire::offset::RWND + 2].copy_from_slice(&c.pace.granted.to_be_bytes());
    c.recv.on_ack_sent();
}

/// Sets the receive window `c` is granted in the next frame to it (receiver pacing); a
/// small grant puts the peer on the list of those told at once when room returns.
fn grant(p: &RxPacing, starved: &mut Vec<Coord>, c: &mut Connection) {
    let g = p.grant();
    c.pace.granted = g;
    c.pace.window_update = false;
    if p.is_small(g) && !c.pace.starved {
        c.pace.starved = true;
        starved.push(c.peer);
    }
}

/// A fresh connection with `peer`, its instance id drawn from `rng`.
fn make_conn(rng: &mut SplitMix64, cfg: &Config, peer: Coord) -> Box<Connection> {
    let cid = loop {
        let v = rng.next_u64() as u32;
        if v != 0 {
            break v;
        }
    };
    let conn_cfg = ConnConfig {
        send: SendConfig {
            window: cfg.window,
            min_rto: cfg.min_rto,
            max_rto: cfg.max_rto,
            initial_rto: cfg.initial_rto,
        },
        recv: RecvConfig {
            window: cfg.window,
            // At most a quarter window between ACKs, so the sender never stalls on a
            // full window waiting for the delayed-ACK timer.
            ack_every: cfg.ack_every.min((cfg.window / 4).max(1)),
            ack_delay: cfg.ack_delay,
            nack_threshold: cfg.nack_threshold,
            nack_retry: cfg.nack_retry,
            nack_retry_min: cfg.nack_retry_min,
        },
        life: LifecycleConfig {
            broken_after: cfg.broken_after,
            sync_retry: cfg.sync_retry,
        },
        max_message: cfg.max_message,
    };
    Box::new(Connection::new(peer, cid, conn_cfg))
}

/// Records `c`'s current deadline in `deadlines` ([`Transport::note`] for a connection in
/// hand: the paths that run per frame have it already, and a second lookup by peer cost
/// a hash per frame).
#[inline]
fn schedule(deadlines: &mut Deadlines, c: &mut Connection) {
    let earliest = |a: Option<Time>, b: Option<Time>| match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    };
    let t = earliest(
        earliest(c.send.poll_timeout(), c.recv.poll_timeout()),
        c.life.poll_timeout(),
    );
    if let Some(t) = t {
        if c.timer.is_none_or(|r| t < r) {
            c.timer = Some(t);
            deadlines.push(std::cmp::Reverse((t, c.peer)));
        }
    }
}

/// Frames the short (unreliable) message at the head of `q` (and, aggregating, the short
/// messages after it to the same peer) into `buf` for `link`. Nothing is kept: short frames
/// are neither numbered nor acknowledged, and belong to no connection.
fn build_short_frame(
    local: Coord,
    cfg: &Config,
    q: &mut fair_queue::ServiceQueue,
    link: LinkId,
    buf: &mut [u8],
    stats: &mut Stats,
    declared: &mut Option<(usize, u8)>,
) -> Transmit {
    let from = q.service;
    let declare = cfg.declare_tails && cfg.compact_runs;
    let mut t = Transmit {
        kept: false,
        link,
        len: 0,
        kind: TxKind::Short,
        messages: 0,
        service: None,
    };
    let Some(head) = q.head().copied() else {
        return t;
    };
    let room = cfg.max_payload();
    let mut h = Header::new(Kind::Data, local, Dest::Server(head.dest));
    h.service = head.service;
    let payload = &mut buf[HEADERS_LEN..ETH_LEN + cfg.mtu];
    // A short message always fits one frame with its header (sends check it), so the head
    // is taken whole, alone or with the short messages to the same peer behind it.
    let (plen, messages, tail) = if cfg.aggregate {
        h.flags |= flags::AGGREGATED;
        let plan = q.plan_aggregate(room, |_, _| {});
        let tail = q.take_planned(&plan, &mut payload[..plan.bytes], declare);
        (plan.bytes, plan.messages as usize, tail)
    } else {
        let len = (head.len as usize).min(room);
        let tail = q.take_declaring(&mut payload[..len], declare);
        (len, 1, tail)
    };
    *declared = tail.map(|(at, v)| (HEADERS_LEN + at, v));
    h.payload_len = plen as u16;
    let _ = h.emit(buf);
    stats.short_frames += 1;
    stats.short_messages_sent += messages as u64;
    t.len = HEADERS_LEN + plen;
    t.messages = messages as u32;
    t.service = Some(from);
    t
}

/// Frames the reliable message at the head of `q` (and, aggregating, the reliable messages
/// after it to the same peer) into `buf` for `link`, and records the frame in the send
/// window.
#[allow(clippy::too_many_arguments)]
fn build_data_frame(
    local: Coord,
    cfg: &Config,
    now: Time,
    conn: &mut Connection,
    q: &mut fair_queue::ServiceQueue,
    link: LinkId,
    buf: &mut [u8],
    stats: &mut Stats,
    pool: &mut pool::BufferPool,
    keep: Option<u32>,
) -> Transmit {
    // The queue is the sending service's: reports go to it; each message names its own
    // destination service.
    let from = q.service;
    let Some(head) = q.head().copied() else {
        return Transmit {
            kept: false,
            link,
            len: 0,
            kind: TxKind::Data,
            messages: 0,
            service: None,
        };
    };
    let dest = head.dest;
    let room = cfg.max_payload();
    let mut h = Header::new(Kind::Data, local, Dest::Server(dest));
    h.service = head.service;
    // The sequence number this frame will carry.
    let seq = conn.send.next_seq();
    h.flags |= flags::RELIABLE;
    h.conn = conn.life.cid();
    h.peer_conn = conn.life.peer_cid().unwrap_or(0);
    let payload = &mut buf[HEADERS_LEN..ETH_LEN + cfg.mtu];
    let mut messages = 0u32;
    let prog = q.head_progress();
    let whole_fits = prog.sent == 0 && head.len as usize + MSG_HEADER_LEN <= room;
    let plen;
    // A message that would travel alone (alone in its queue, or with nothing after it that
    // fits beside it) goes in a plain frame: planning a frame of one and checking its
    // message header on arrival cost a round trip more than the frame's own work
    // (docs/transport.md, "CPU cost"), and only a plain frame's message can be lent to
    // the receiver's consumer straight from the frame.
    if cfg.aggregate && whole_fits && q.head_shares_frame(room) {
        h.flags |= flags::AGGREGATED;
        let mut first_msn = None;
        let fence_before = conn.last_fwd;
        // Per entry, not per message: a group's messages take consecutive numbers.
        let plan = q.plan_aggregate(room, |m, k| {
            let msn = conn.next_msn;
            conn.next_msn += u64::from(k);
            first_msn.get_or_insert(msn);
            if m.fences.forward {
                // Fenced messages are never grouped: this one is `msn`.
                conn.last_fwd = Some(msn);
            }
            conn.sent.on_framed_run(from, m.tags.head(k), msn, seq);
        });
        // The messages wait in wire form: the run is one copy.
        q.take_planned(&plan, &mut payload[..plan.bytes], false);
        // A group the frame took the first messages of stays queued.
        conn.queued = conn.queued.saturating_sub(plan.entries);
        messages = plan.messages;
        plen = plan.bytes;
        if let Some(msn) = first_msn {
            h.msn = seqnum::truncate(msn);
            h.fence = fence_distance(msn, fence_before);
        }
    } else if prog.sent == 0 && head.len as usize <= room {
        // One whole message, unaggregated.
        let len = head.len as usize;
        q.take(&mut payload[..len]);
        plen = len;
        messages = 1;
        conn.queued = conn.queued.saturating_sub(1);
        let msn = conn.next_msn;
        conn.next_msn += 1;
        conn.sent.on_framed_alone(from, head.tags.first(), msn, seq);
        h.flags |= flags::FRAG_FIRST | flags::FRAG_LAST | fence_flags(head.fences);
        h.msn = seqnum::truncate(msn);
        h.fence = fence_distance(msn, conn.last_fwd);
        if head.fences.forward {
            conn.last_fwd = Some(msn);
        }
    } else {
        // A fragment of a message larger than one frame.
        let (msn, wait_for) = match prog.msn {
            Some(m) => (m, prog.wait_for),
            None => {
                let m = conn.next_msn;
                conn.next_msn += 1;
                let w = conn.last_fwd;
                if head.fences.forward {
                    conn.last_fwd = Some(m);
                }
                q.set_head_msn(m, w);
                (m, w)
            }
        };
        let frag = prog.sent / room as u32;
        let left = (head.len - prog.sent) as usize;
        let len = left.min(room);
        if prog.sent == 0 {
            h.flags |= flags::FRAG_FIRST;
        }
        if left <= room {
            h.flags |= flags::FRAG_LAST;
            messages = 1;
            conn.queued = conn.queued.saturating_sub(1);
            conn.sent.on_framed_alone(from, head.tags.first(), msn, seq);
        }
        h.flags |= fence_flags(head.fences);
        h.msn = seqnum::truncate(msn);
        h.frag = frag;
        h.fence = match wait_for {
            Some(w) => (msn - w) as u32,
            None => 0,
        };
        q.take(&mut payload[..len]);
        plen = len;
    }
    let sent = SentFrame {
        link,
        plen,
        messages,
        from,
    };
    finish_data_frame(now, h, conn, sent, buf, stats, pool, keep)
}

/// What a data frame being finished carries: its link, payload length, how many whole
/// messages end in it and the queue (service) that sent them.
#[derive(Clone, Copy)]
struct SentFrame {
    link: LinkId,
    plen: usize,
    messages: u32,
    from: u16,
}

/// Completes a data frame whose payload is written and whose header `h` has its message
/// fields: the sequence number and the piggybacked ACK, the header written, the frame
/// recorded in the send window (kept in the driver's buffer `keep`, or copied) and counted.
///
/// Always inline: it is the tail of both ways of building a data frame, and as a call of
/// its own (eight arguments) it cost about 50 instructions per frame (`bench/transport-cost.sh`,
/// unaggregated).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn finish_data_frame(
    now: Time,
    mut h: Header,
    conn: &mut Connection,
    f: SentFrame,
    buf: &mut [u8],
    stats: &mut Stats,
    pool: &mut pool::BufferPool,
    keep: Option<u32>,
) -> Transmit {
    let SentFrame {
        link,
        plen,
        messages,
        from,
    } = f;
    h.payload_len = plen as u16;
    let len = HEADERS_LEN + plen;
    h.seq = seqnum::truncate(conn.send.next_seq());
    h.flags |= flags::ACK_VALID | flags::SACK_VALID;
    h.ack = seqnum::truncate(conn.recv.cum_ack());
    h.sack = conn.recv.sack_bits();
    h.rwnd = conn.pace.granted;
    conn.recv.on_ack_sent();
    // Emit cannot fail: buf was checked to hold a whole frame.
    let _ = h.emit(buf);
    let frame = match keep {
        // Kept where it was built: the driver holds the buffer until it is released.
        Some(handle) => {
            stats.kept_frames += 1;
            KeptFrame::Driver {
                handle,
                len: (len - ETH_LEN) as u32,
            }
        }
        None => {
            let mut copy = pool.take();
            copy.extend_from_slice(&buf[ETH_LEN..len]);
            KeptFrame::Owned(copy)
        }
    };
    conn.send.on_sent_frame(now, frame);
    conn.life.set_waiting(now, true, false);
    stats.data_frames += 1;
    stats.messages_sent += u64::from(messages);
    Transmit {
        kept: keep.is_some(),
        link,
        len,
        kind: TxKind::Data,
        messages,
        service: Some(from),
    }
}

/// Whether a connection waits for its peer: frames unacknowledged, or messages held for the
/// handshake.
fn waits(c: &Connection) -> bool {
    c.send.in_flight() > 0 || (c.queued > 0 && !c.life.established())
}

fn fence_flags(f: Fences) -> u16 {
    (if f.backward { flags::BWD_FENCE } else { 0 }) | (if f.forward { flags::FWD_FENCE } else { 0 })
}

/// Whether the reliable frame `h` holds one whole message that is the next of its
/// connection, with no fence to wait for and nothing held or delivered out of order: then
/// it is marked delivered here, and the caller hands it out as it is (lent from the frame).
fn lone_in_order(conn: &mut Connection, h: &Header) -> bool {
    if h.has(flags::AGGREGATED)
        || !h.has(flags::FRAG_FIRST)
        || !h.has(flags::FRAG_LAST)
        || h.frag != 0
    {
        return false;
    }
    let base = seqnum::expand(h.msn, conn.delivery.base());
    let frame_wait =
        (h.fence != 0 && u64::from(h.fence) <= base).then(|| base - u64::from(h.fence));
    if frame_wait.is_none_or(|j| j < base) && conn.delivery.can_release_run(base) {
        conn.delivery.release_run(base, 1);
        return true;
    }
    false
}

/// The wire fence field: distance back from `msn` to the latest forward-fenced message.
fn fence_distance(msn: u64, last_fwd: Option<u64>) -> u32 {
    match last_fwd {
        Some(j) if j < msn => u32::try_from(msn - j).unwrap_or(0),
        _ => 0,
    }
}
