//! What a running dataplane reports about itself: the status of its links, the snapshot
//! each poller publishes of its engine, and the whole status `torusctl status`, `--json` and
//! the Prometheus endpoint read. Plain data: it is built by the pollers and the runtime and
//! serialised by the management socket; nothing here acts.

use serde::Serialize;
use torusnet_proto::transport;

use crate::config::Polling;
use crate::counters::LinkCountersSnapshot;
use crate::loader::XdpCounters;

/// What the poller publishes about the engine every 100 ms.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineSnapshot {
    /// Transport counters.
    pub transport: TransportStatus,
    /// Forwarding and key-routing counters.
    pub forwarded: u64,
    /// Key-routed messages delivered here.
    pub key_delivered: u64,
    /// Frames seen by on-path services.
    pub intercepted: u64,
    /// Key-routed messages dropped at their source: no server took keys in its view.
    pub key_no_root: u64,
    /// XDP program counters per link (link index, counters).
    pub xdp: Vec<(usize, XdpCounters)>,
    /// The kernel's AF_XDP socket statistics per link (link index, counters).
    pub xsk: Vec<(usize, XskStats)>,
    /// Servers unreachable in this server's view.
    pub unreachable: Vec<[u16; 3]>,
    /// Version of the view in use (counts adopted views).
    pub view_version: u64,
    /// Free UMEM chunks.
    pub umem_free: usize,
    /// Free transmit slots (jumbo frames are built and kept in them; docs/dataplane.md).
    pub tx_slots_free: usize,
    /// Transmit slots whose frames the transport keeps until they are acknowledged.
    pub tx_slots_kept: usize,
    /// Events dropped because a service did not read its inbox.
    pub inbox_overflow: u64,
    /// Messages that arrived for a service nobody on this server hosts or attached as.
    pub no_service: u64,
    /// Frames passed between pollers (copied).
    pub handoffs: u64,
    /// Frames a poller could not pass to another (its queue full) or pass on after taking
    /// them over; reliable senders resend them.
    pub handoff_dropped: u64,
    /// Commands dropped because a poller's queue was full and nobody waited for them.
    pub commands_dropped: u64,
    /// Pollers running.
    pub pollers: usize,
    /// The transport's smoothed RTT per peer (the first 1024 measured).
    pub rtt: Vec<PeerRtt>,
    /// Source routing at this server.
    pub routing: RoutingStatus,
    /// When the view in use was adopted (Unix time, ms).
    pub view_changed_unix_ms: u64,
    /// Links whose carrier the kernel reports down.
    pub carrier_down: Vec<String>,
}

/// Source routing at one server, for `torusctl status`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RoutingStatus {
    /// "off", "next-hop" or "source": how this server's own traffic is routed.
    pub mode: &'static str,
    /// The services source-routed in "source" mode (empty: all).
    pub services: Vec<u16>,
    /// Frames sent with a route of this server's choosing.
    pub routed_sent: u64,
    /// Source-routed frames passed on here by their route.
    pub forwarded: u64,
    /// Source-routed frames refused: a malformed route.
    pub bad_route: u64,
    /// Source-routed frames whose next link was down here.
    pub path_failed: u64,
    /// Path-failure reports sent to sources.
    pub failures_sent: u64,
    /// Probes answered here.
    pub replies_sent: u64,
    /// Probes sent by this server's path selection.
    pub probes: u64,
    /// Probe replies it took.
    pub replies: u64,
    /// Path-failure reports it took.
    pub failures: u64,
    /// Times a flow changed path.
    pub switches: u64,
    /// Of those, because a path failed.
    pub failovers: u64,
    /// When the latest failover happened (Unix time, ms; 0: never).
    pub last_failover_unix_ms: u64,
    /// The path each flow uses (the first 256).
    pub flows: Vec<FlowRoute>,
}

/// The path a flow uses.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FlowRoute {
    /// The flow's destination, x,y,z.
    pub dst: String,
    /// Its path, as directions.
    pub path: String,
    /// The available bandwidth the last probe of that path found, Mb/s.
    pub avail_mbps: Option<u32>,
    /// Every path of the flow's set and what its last probe found (Mb/s; none: failed or
    /// not probed yet).
    pub paths: Vec<(String, Option<u32>)>,
}

/// A peer's smoothed round-trip time.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PeerRtt {
    /// The peer, x,y,z.
    pub peer: String,
    /// Microseconds.
    pub srtt_us: f64,
}

/// The kernel's drop counters of one AF_XDP socket (XDP_STATISTICS).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct XskStats {
    /// Dropped for other reasons.
    pub rx_dropped: u64,
    /// Dropped: the RX ring was full (the poller fell behind).
    pub rx_ring_full: u64,
    /// Times the fill ring was empty (no chunk to receive into).
    pub rx_fill_ring_empty: u64,
    /// TX descriptors the kernel refused.
    pub tx_invalid: u64,
}

/// Transport counters, serialisable.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct TransportStatus {
    /// New reliable data frames sent.
    pub data_frames: u64,
    /// Retransmitted frames.
    pub retransmitted_frames: u64,
    /// New reliable frames kept in their transmit slot for retransmission, not copied.
    pub kept_frames: u64,
    /// New reliable frames a hosted service's message was written into straight, never
    /// queued (one copy of a jumbo message instead of two).
    pub framed_straight: u64,
    /// Explicit ACKs sent.
    pub ack_frames: u64,
    /// NACKs sent.
    pub nack_frames: u64,
    /// Short-message frames sent.
    pub short_frames: u64,
    /// Reliable messages sent.
    pub messages_sent: u64,
    /// Messages delivered to local services.
    pub messages_delivered: u64,
    /// Duplicate frames received.
    pub duplicate_frames: u64,
    /// Frames received out of order.
    pub out_of_order_frames: u64,
    /// Frames in flight.
    pub in_flight: u64,
    /// Frames of a connection instance gone on either side, dropped.
    pub stale_frames: u64,
    /// SYNC frames sent.
    pub sync_frames: u64,
    /// Connections reset because the peer restarted or reset.
    pub resets: u64,
    /// Connections given up (silent peer, or unreachable).
    pub broken: u64,
    /// Messages reported failed to their services.
    pub failed_messages: u64,
    /// Reliable messages refused here because no service takes them (their senders told).
    pub refused_no_service: u64,
    /// Reliable messages refused here because their application had fallen behind (their
    /// senders told).
    pub refused_full: u64,
    /// Messages of services here that a peer refused (no service there): reported failed.
    pub refused_by_peers: u64,
    /// Refusals that could not be matched to a message's tag, or not sent.
    pub notices_unmatched: u64,
    /// Peers with a connection.
    pub peers: u64,
}

impl TransportStatus {
    pub(crate) fn from(s: transport::Stats, in_flight: u64, peers: u64) -> TransportStatus {
        TransportStatus {
            data_frames: s.data_frames,
            retransmitted_frames: s.retransmitted_frames,
            kept_frames: s.kept_frames,
            framed_straight: s.framed_straight,
            ack_frames: s.ack_frames,
            nack_frames: s.nack_frames,
            short_frames: s.short_frames,
            messages_sent: s.messages_sent,
            messages_delivered: s.messages_delivered,
            duplicate_frames: s.duplicate_frames,
            out_of_order_frames: s.out_of_order_frames,
            in_flight,
            stale_frames: s.stale_frames,
            sync_frames: s.sync_frames,
            resets: s.resets,
            broken: s.broken,
            failed_messages: s.failed_messages,
            refused_no_service: s.refused_no_service,
            refused_full: s.refused_full,
            refused_by_peers: s.refused_by_peers,
            notices_unmatched: s.notices_unmatched,
            peers,
        }
    }
}

impl EngineSnapshot {
    /// Adds up the pollers' snapshots (the view-related fields are the same in all; the
    /// first poller's are kept).
    pub fn merge(mut v: Vec<EngineSnapshot>) -> EngineSnapshot {
        let pollers = v.len().max(1);
        let Some(mut total) = v.first().cloned() else {
            return EngineSnapshot::default();
        };
        for s in v.drain(1..) {
            let (a, b) = (&mut total.transport, s.transport);
            a.data_frames += b.data_frames;
            a.retransmitted_frames += b.retransmitted_frames;
            a.kept_frames += b.kept_frames;
            a.framed_straight += b.framed_straight;
            a.ack_frames += b.ack_frames;
            a.nack_frames += b.nack_frames;
            a.short_frames += b.short_frames;
            a.messages_sent += b.messages_sent;
            a.messages_delivered += b.messages_delivered;
            a.duplicate_frames += b.duplicate_frames;
            a.out_of_order_frames += b.out_of_order_frames;
            a.in_flight += b.in_flight;
            a.stale_frames += b.stale_frames;
            a.sync_frames += b.sync_frames;
            a.resets += b.resets;
            a.broken += b.broken;
            a.failed_messages += b.failed_messages;
            a.refused_no_service += b.refused_no_service;
            a.refused_full += b.refused_full;
            a.refused_by_peers += b.refused_by_peers;
            a.notices_unmatched += b.notices_unmatched;
            a.peers += b.peers;
            total.forwarded += s.forwarded;
            total.key_delivered += s.key_delivered;
            total.intercepted += s.intercepted;
            total.key_no_root += s.key_no_root;
            total.xdp.extend(s.xdp);
            total.xsk.extend(s.xsk);
            total.umem_free += s.umem_free;
            total.tx_slots_free += s.tx_slots_free;
            total.tx_slots_kept += s.tx_slots_kept;
            total.inbox_overflow += s.inbox_overflow;
            total.no_service += s.no_service;
            total.handoffs += s.handoffs;
            total.handoff_dropped += s.handoff_dropped;
            total.rtt.extend(s.rtt);
            let (a, b) = (&mut total.routing, s.routing);
            a.routed_sent += b.routed_sent;
            a.forwarded += b.forwarded;
            a.bad_route += b.bad_route;
            a.path_failed += b.path_failed;
            a.failures_sent += b.failures_sent;
            a.replies_sent += b.replies_sent;
            a.probes += b.probes;
            a.replies += b.replies;
            a.failures += b.failures;
            a.switches += b.switches;
            a.failovers += b.failovers;
            a.last_failover_unix_ms = a.last_failover_unix_ms.max(b.last_failover_unix_ms);
            a.flows.extend(b.flows);
        }
        total.pollers = pollers;
        total
    }
}

/// Status of one link, for `torusctl status` and `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct LinkStatus {
    /// Direction.
    pub dir: String,
    /// Interface.
    pub ifname: String,
    /// Our MAC.
    pub mac: String,
    /// Neighbour's MAC.
    pub neighbor_mac: Option<String>,
    /// native / generic.
    pub xdp_mode: &'static str,
    /// xdp / xdp.frags.
    pub xdp_section: &'static str,
    /// zero-copy / copy.
    pub afxdp_mode: &'static str,
    /// Multi-buffer enabled.
    pub multi_buffer: bool,
    /// Socket shares the server's UMEM (forwarding moves descriptors).
    pub shared_umem: bool,
    /// TX budget the kernel accepted.
    pub tx_budget: Option<u32>,
    /// The poller (and core) that owns it.
    pub poller: usize,
    /// Counters.
    pub counters: LinkCountersSnapshot,
    /// XDP program counters.
    pub xdp: XdpCounters,
    /// Frames the XDP program redirected to this link that the driver could not take
    /// (its ring full): dropped, repaired by the transport.
    pub redirect_errors: u64,
    /// The kernel's AF_XDP socket drop counters.
    pub xsk: XskStats,
}

/// The whole status of a running dataplane.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// Label.
    pub name: String,
    /// Coordinate.
    pub coord: [u16; 3],
    /// Dimensions.
    pub dims: String,
    /// MTU.
    pub mtu: u32,
    /// busy / adaptive.
    pub polling: Polling,
    /// This start's incarnation, in hex.
    pub incarnation: String,
    /// Seconds since start.
    pub uptime_s: f64,
    /// Links.
    pub links: Vec<LinkStatus>,
    /// Frames passing through are forwarded by the XDP program (`[dataplane] xdp_transit`).
    pub xdp_transit: bool,
    /// Windows follow the fabric's telemetry (`[transport] congestion`, or switched).
    pub congestion: bool,
    /// Engine counters.
    pub engine: EngineSnapshot,
    /// Applications attached from their own processes.
    pub apps: Vec<AppStatus>,
    /// The service ids this server takes reliable messages for (others are refused and
    /// reported to their senders).
    pub services: Vec<u16>,
    /// The key-value store, when it runs.
    pub kv: Option<KvStatus>,
    /// IP over the torus, when it runs.
    pub ip: Option<crate::ip::IpStats>,
    /// Remote memory.
    pub rmem: Option<crate::rmem::RmStats>,
}

/// The key-value store's part of the status.
#[derive(Debug, Clone, Serialize)]
pub struct KvStatus {
    /// The memcached gateway's address (`None`: no gateway).
    pub gateway: Option<String>,
    /// Client connections open now.
    pub connections: u64,
    /// Commands the gateway served.
    pub commands: u64,
    /// The store's counters.
    pub store: torusnet_services::kv::KvStats,
}

/// One application in `torusctl status`.
#[derive(Debug, Clone, Serialize)]
pub struct AppStatus {
    /// Its service name.
    pub name: String,
    /// Its service id.
    pub service: u16,
    /// Its process.
    pub pid: i32,
    /// Its user.
    pub uid: u32,
    /// Seconds since it attached.
    pub attached_s: f64,
    /// The names it added after its attach name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub added_names: Vec<String>,
    /// Its fair-queuing weight: frames per turn on a link it shares.
    pub weight: u32,
    /// Messages it sent.
    pub sent: u64,
    /// Messages delivered to it.
    pub received: u64,
    /// Of its messages, acknowledged (when it asked for reports).
    pub acked: u64,
    /// Of its messages, failed.
    pub failed: u64,
    /// Incoming messages dropped because it did not read them.
    pub dropped: u64,
    /// Times it fell so far behind that reliable messages for it were refused.
    pub full_marks: u64,
    /// Malformed submissions refused.
    pub bad: u64,
    /// Return buffers filled.
    pub buffers_filled: u64,
    /// "Return buffer missing" notices it owed senders and could not send.
    pub notices_lost: u64,
    /// Frames of its service passing through shown to it (it intercepts on the path).
    pub on_path_seen: u64,
    /// Of those, dropped by its verdict.
    pub on_path_dropped: u64,
    /// Of those, sent on unchanged at the deadline (or as it left).
    pub on_path_expired: u64,
    /// Held frames that no link took when they were put back.
    pub on_path_lost: u64,
    /// Multicast bytes delivered into its channel.
    pub multicast_bytes: u64,
}
