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
//!
//! This file holds the [`Transport`] type, its construction and its getters; its methods
//! live by direction: `send.rs` (the application side: connections, sending, failures,
//! events), `rx.rs` (network in), `tx.rs` (network out), `timers.rs` (deadlines), and the
//! frame builders they share in `frame.rs`; `types.rs` is the public vocabulary (messages,
//! events, errors, counters), `config.rs` the settings, `placer.rs` services that take their
//! messages straight from their frames.

pub mod byte_ring;
pub mod completion;
mod config;
pub mod congestion;
pub mod connection;
pub mod delivery;
mod direct;
pub mod fair_queue;
mod frame;
pub mod hosted;
pub mod inbox;
pub mod kept;
pub mod key_gate;
pub mod lifecycle;
pub mod notice;
pub mod pacing;
mod placer;
pub mod pool;
pub mod receiver;
mod rx;
mod send;
pub mod sender;
pub mod seqnum;
pub mod stripe;
pub mod tags;
mod timers;
mod tx;
mod types;

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use std::time::Duration;

use completion::AckedRun;
use connection::{ConnConfig, Connection};
pub use delivery::Fences;
use delivery::{DeliveryError, Release};
use fair_queue::{FairQueue, Joining, Queued, Refused, Runs};
pub use hosted::HostedServices;
pub use inbox::EventRef;
use inbox::Inbox;
use kept::KeptFrame;
pub use kept::{Keep, KeptFrames};
pub use key_gate::{KeyGate, KEYED};
pub use lifecycle::FailReason;
use lifecycle::{LifecycleConfig, SyncOutcome};
pub use notice::NOTICES;
use pacing::RxPacing;
use receiver::{Arrival, RecvConfig};
use sender::{SendConfig, SMALL_FRAME};
use tags::TagRun;

use crate::rng::SplitMix64;
use crate::time::Time;
use crate::topology::Coord;
pub use config::Config;
pub use congestion::CongestionConfig;
pub use placer::Placer;
use placer::Placers;
pub use types::{
    Lent, LinkId, LinkSet, Outgoing, Paths, RecvError, SendError, Stats, Transmit, TransportEvent,
    TxKind,
};

use frame::{
    build_data_frame, build_short_frame, fence_distance, fence_flags, finish_data_frame, SentFrame,
};
use lifecycle::{sync_payload, SYNC_ANNOUNCE, SYNC_PAYLOAD};
use send::make_conn;
use timers::schedule;
use tx::grant;

use crate::wire::{
    self, flags, msg_flags, Dest, FrameView, Header, Kind, WireError, ETH_LEN, HEADERS_LEN,
    MSG_HEADER_LEN, TORUS_LEN,
};

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
    /// Services that want [`TransportEvent::Acked`].
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
    /// The engine's check of messages to a key ([`key_gate`]); without it they are taken
    /// as any message.
    key_gate: Option<Box<dyn KeyGate>>,
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
            key_gate: None,
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
        t.key_gate = self.key_gate.take();
        *self = t;
    }

    /// Installs the check messages to a key meet on arrival ([`key_gate`]).
    pub fn set_key_gate(&mut self, gate: Option<Box<dyn KeyGate>>) {
        self.key_gate = gate;
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
}
