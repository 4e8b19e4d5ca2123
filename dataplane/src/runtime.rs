//! The dataplane of one server as a library: start it from a configuration, register
//! services, send and receive messages, read its status, stop it. Applications talk to the
//! poller over lock-free queues; the poller thread owns the rings, the UMEM and the
//! protocol engine, so nothing on the fast path takes a lock.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use parking_lot::Mutex;
use serde::Serialize;
use torusnet_proto::node::{Event, MsgOptions, Node, Target};
use torusnet_proto::routing::LinkView;
use torusnet_proto::service::Request;
use torusnet_proto::topology::{Coord, Dims, Dir};
use torusnet_proto::transport::{self, SendError};
use torusnet_proto::wire::TORUS_LEN;

use crate::config::{NodeConfig, Polling};
use crate::counters::{LinkCounters, LinkCountersSnapshot};
use crate::loader::{AttachPreference, XdpAttachment, XdpCounters};
use crate::netns::{format_mac, mac_of};
use crate::poller::{Poller, Port};
use crate::xsk::{SocketConfig, Umem, XskSocket, CHUNK};

/// Something for the poller to do on an application's behalf.
pub enum Command {
    /// Send a message.
    Send {
        /// Where.
        target: Target,
        /// From which service (and to the same service on the other side).
        service: u16,
        /// The bytes.
        data: Vec<u8>,
        /// How.
        opts: MsgOptions,
    },
    /// Drop data frames arriving on a link with this probability, in the kernel (tests).
    SetFault {
        /// The link.
        dir: Dir,
        /// Probability, 0 turns it off.
        drop: f64,
    },
    /// Adopt a new link-state view, and the neighbours' MACs per direction (None: keep);
    /// the sender learns when it is in force.
    SetView(
        Box<LinkView>,
        [Option<[u8; 6]>; 6],
        Option<std::sync::mpsc::Sender<()>>,
    ),
    /// A request for the hosted service that owns `service` (built-in ping, bench, ...).
    Request {
        /// The service id.
        service: u16,
        /// What it is asked, in its own type.
        request: Request,
    },
    /// Report acknowledgements of `service`'s reliable messages to it (or stop).
    NotifyAcks(u16, bool),
    /// An event for service `u16`, from a poller that does not host it.
    Deliver(u16, Event),
    /// An event every service hears of, from a poller that hosts none.
    Broadcast(Event),
    /// The kernel says link `Dir` lost (false) or regained (true) its carrier.
    LinkCarrier(Dir, bool),
    /// Source routing of this server's own traffic on or off, for these services (`None`:
    /// all); the answer says whether it could be done (source routing configured).
    SetRouting(
        bool,
        Option<Vec<u16>>,
        Option<std::sync::mpsc::Sender<bool>>,
    ),
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Send {
                target,
                service,
                data,
                ..
            } => write!(f, "Send({target:?}, {service}, {} bytes)", data.len()),
            Command::SetFault { dir, drop } => write!(f, "SetFault({dir}, {drop})"),
            Command::SetView(..) => f.write_str("SetView"),
            Command::Request { service, .. } => write!(f, "Request({service})"),
            Command::NotifyAcks(s, on) => write!(f, "NotifyAcks({s}, {on})"),
            Command::Deliver(s, _) => write!(f, "Deliver({s})"),
            Command::Broadcast(_) => f.write_str("Broadcast"),
            Command::LinkCarrier(d, up) => write!(f, "LinkCarrier({d}, {up})"),
            Command::SetRouting(on, svc, _) => write!(f, "SetRouting({on}, {svc:?})"),
        }
    }
}

/// A frame one poller passes to another (pollers own disjoint links and connections).
#[derive(Debug)]
pub enum Handoff {
    /// A frame addressed to this server from a peer whose connection the receiving poller
    /// owns: run it through that poller's engine.
    Deliver(Vec<u8>),
    /// A frame to send on a link the receiving poller owns.
    Send(Dir, Vec<u8>),
}

impl Command {
    /// Copies, as many as taken, of a command every poller runs (a view: each acknowledges
    /// on the same channel; acknowledgement reports on or off); none of other commands.
    fn fan_out(&self) -> impl Iterator<Item = Command> + '_ {
        std::iter::from_fn(move || match self {
            Command::SetView(v, macs, ack) => Some(Command::SetView(v.clone(), *macs, ack.clone())),
            Command::NotifyAcks(id, on) => Some(Command::NotifyAcks(*id, *on)),
            _ => None,
        })
    }
}

/// Frames one poller passed to others, and those it dropped because the other's hand-off
/// queue was full.
#[derive(Debug, Clone, Copy, Default)]
pub struct HandoffCounts {
    /// Frames queued for another poller.
    pub passed: u64,
    /// Frames dropped: the other poller's queue was full, or (handed over to a poller
    /// whose view moved meanwhile) none of its links could take the frame on.
    pub dropped: u64,
}

/// What one poller shares with the rest of the process.
#[derive(Debug)]
pub struct ShardShared {
    pub(crate) commands: ArrayQueue<Command>,
    pub(crate) handoff: ArrayQueue<Handoff>,
    pub(crate) sleeping: AtomicBool,
    pub(crate) wake: OwnedFd,
    pub(crate) snapshot: Mutex<EngineSnapshot>,
}

impl ShardShared {
    fn new() -> std::io::Result<ShardShared> {
        // SAFETY: eventfd returns a new descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ShardShared {
            commands: ArrayQueue::new(1 << 16),
            handoff: ArrayQueue::new(1 << 14),
            sleeping: AtomicBool::new(false),
            // SAFETY: fd is a fresh descriptor.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            snapshot: Mutex::new(EngineSnapshot::default()),
        })
    }

    /// Queues `h` for this poller and wakes it. A full queue turns the frame away, as a
    /// full ring would (a reliable sender resends it): counted in `counts` either way.
    pub(crate) fn hand_off(&self, h: Handoff, counts: &mut HandoffCounts) -> bool {
        match self.handoff.push(h) {
            Ok(()) => {
                counts.passed += 1;
                self.wake();
                true
            }
            Err(_) => {
                counts.dropped += 1;
                false
            }
        }
    }

    /// Wakes this poller if it sleeps in poll().
    pub(crate) fn wake(&self) {
        // Pairs with the poller's fence between announcing its sleep and its last look at
        // the queues: without both, a command pushed in between waits for the poller's
        // timer.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes to our eventfd.
            unsafe {
                libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8);
            }
        }
    }
}

/// A service's inbox: events the poller delivers, waiting for the application.
#[derive(Debug)]
pub struct Inbox {
    pub(crate) queue: ArrayQueue<Event>,
    /// The service sleeps on `efd`: the poller signals it after pushing.
    pub(crate) waiting: AtomicBool,
    pub(crate) efd: OwnedFd,
}

impl Inbox {
    fn new() -> std::io::Result<Inbox> {
        Ok(Inbox {
            queue: ArrayQueue::new(1 << 16),
            waiting: AtomicBool::new(false),
            efd: torusnet_client::sys::eventfd()?,
        })
    }

    /// Wakes the service if it sleeps (called by the poller after pushing).
    pub(crate) fn notify(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) {
            torusnet_client::sys::signal(self.efd.as_raw_fd());
        }
    }
}

/// What `start` could not do.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Setting up a link failed.
    #[error("{0}")]
    Link(String),
    /// The protocol engine refused the configuration.
    #[error("{0}")]
    Engine(String),
    /// The poller thread could not be started.
    #[error("cannot start the poller thread: {0}")]
    Thread(std::io::Error),
}

/// Static facts about one link, and its counters.
#[derive(Debug)]
pub struct LinkInfo {
    /// Its direction.
    pub dir: Dir,
    /// Its interface.
    pub ifname: String,
    /// Our MAC on it.
    pub local_mac: [u8; 6],
    /// The neighbour's MAC (configured, or learned from the control process): 48 bits, with
    /// bit 63 set when known.
    pub neighbor_mac: AtomicU64,
    /// Native or generic XDP.
    pub xdp_mode: &'static str,
    /// `xdp` or `xdp.frags`.
    pub xdp_section: &'static str,
    /// Zero-copy AF_XDP.
    pub zero_copy: bool,
    /// Multi-buffer frames.
    pub multi_buffer: bool,
    /// Socket shares the server's UMEM.
    pub shared_umem: bool,
    /// Frames per TX kick, where the kernel has the option.
    pub tx_budget: Option<u32>,
    /// The poller that owns it.
    pub poller: usize,
    /// Counters.
    pub counters: LinkCounters,
}

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

/// State shared by the poller and everyone else.
#[derive(Debug)]
pub struct Shared {
    /// Server label.
    pub name: String,
    /// The torus.
    pub dims: Dims,
    /// This server.
    pub coord: Coord,
    /// Link MTU.
    pub mtu: u32,
    /// How the poller waits.
    pub polling: Polling,
    /// This start of the dataplane (random, non-zero): peers tell a restart by it.
    pub incarnation: u64,
    /// Largest reliable message.
    pub max_message: usize,
    /// The links.
    pub links: Vec<LinkInfo>,
    pub(crate) services: Mutex<HashMap<u16, Arc<Inbox>>>,
    pub(crate) services_version: AtomicU64,
    /// Every service id something here takes (built-in and embedded services, attached
    /// applications): the transports refuse reliable messages for the others and tell
    /// their senders.
    pub(crate) hosted: Arc<torusnet_proto::transport::HostedServices>,
    pub(crate) shutdown: AtomicBool,
    /// Applications attached from their own processes.
    pub apps: crate::apps::AppsRegistry,
    /// One per poller.
    pub shards: Vec<ShardShared>,
    /// Which poller owns the link in each direction.
    pub(crate) link_shard: [Option<usize>; 6],
    pub(crate) started: Instant,
    /// The key-value store's counters, when it runs.
    pub kv: Option<Arc<torusnet_services::kv::KvCounters>>,
    /// IP over the torus, when it runs: its settings and counters.
    pub ip: Option<(crate::ip::IpConfig, Arc<crate::ip::IpCounters>)>,
    /// Remote memory (set once the dataplane is built).
    pub rmem: std::sync::OnceLock<Arc<crate::rmem::Rmem>>,
    /// The memcached gateway: its address and counters.
    pub kv_gateway: Mutex<Option<(std::net::SocketAddr, Arc<crate::kvgw::GatewayCounters>)>>,
    /// Commands dropped because a poller's command queue was full and nobody waited for
    /// the answer (a name's unregistration after its application left, a fan-out that lost
    /// a race for the last places).
    pub(crate) commands_dropped: AtomicU64,
}

impl Shared {
    /// The poller that owns the connection with `peer` (and runs commands for it).
    pub fn shard_of(&self, peer: Coord) -> usize {
        if self.shards.len() <= 1 || !self.dims.contains(peer) {
            return 0;
        }
        self.dims.index(peer) % self.shards.len()
    }

    /// Queues a command for the poller that should run it, and wakes that poller; the
    /// command back when that poller's queue is full. A command every poller must run (a
    /// view, acknowledgement reports on or off) is queued for all of them or, when one's
    /// queue is full, for none.
    pub(crate) fn push(&self, c: Command) -> Result<(), Command> {
        let shard = match &c {
            Command::Send {
                target: Target::Server(d),
                ..
            } => self.shard_of(*d),
            Command::SetFault { dir, .. } => self.link_shard[usize::from(dir.index())].unwrap_or(0),
            Command::SetView(..) | Command::NotifyAcks(..) => {
                // Room first: a fan-out half done would leave pollers disagreeing.
                if self.shards.iter().any(|s| s.commands.is_full()) {
                    return Err(c);
                }
                let copies: Vec<Command> = c.fan_out().take(self.shards.len() - 1).collect();
                // The first poller's first: when even it finds no room, nobody has it.
                let first = &self.shards[0];
                first.commands.push(c)?;
                first.wake();
                for (s, copy) in self.shards[1..].iter().zip(copies) {
                    // Another thread took the last places since the check: counted (the
                    // queues hold 65536 commands, one request of each kind at a time).
                    if s.commands.push(copy).is_err() {
                        self.commands_dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    s.wake();
                }
                return Ok(());
            }
            _ => 0,
        };
        let sh = &self.shards[shard];
        sh.commands.push(c)?;
        sh.wake();
        Ok(())
    }

    /// The state of a process with `pollers` pollers and no links, dataplane or services:
    /// what tests and fuzz bodies run a part of torusd against.
    pub(crate) fn detached(dims: Dims, coord: Coord, pollers: usize) -> std::io::Result<Shared> {
        Ok(Shared {
            name: "detached".into(),
            dims,
            coord,
            mtu: 1500,
            polling: Polling::Adaptive,
            incarnation: 1,
            max_message: 1 << 20,
            links: Vec::new(),
            services: Mutex::new(HashMap::new()),
            services_version: AtomicU64::new(0),
            hosted: Arc::default(),
            shutdown: AtomicBool::new(false),
            apps: crate::apps::AppsRegistry::default(),
            shards: (0..pollers)
                .map(|_| ShardShared::new())
                .collect::<std::io::Result<_>>()?,
            link_shard: [None; 6],
            started: Instant::now(),
            kv: None,
            ip: None,
            rmem: std::sync::OnceLock::new(),
            kv_gateway: Mutex::new(None),
            commands_dropped: AtomicU64::new(0),
        })
    }

    /// Queues a command nobody waits on for poller `shard`; counted when its queue is full.
    pub(crate) fn push_or_count(&self, shard: usize, c: Command) {
        if self.push_to(shard, c).is_err() {
            self.commands_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queues a command for poller `shard` in particular.
    pub fn push_to(&self, shard: usize, c: Command) -> Result<(), Command> {
        let Some(sh) = self.shards.get(shard) else {
            return Err(c);
        };
        sh.commands.push(c)?;
        sh.wake();
        Ok(())
    }

    /// Wakes every poller.
    pub(crate) fn wake_all(&self) {
        for s in &self.shards {
            s.sleeping.store(true, Ordering::Release);
            s.wake();
        }
    }
}

/// A running dataplane.
#[derive(Debug)]
pub struct Dataplane {
    shared: Arc<Shared>,
    pollers: Vec<JoinHandle<Result<(), String>>>,
    gateway: Option<crate::kvgw::Gateway>,
    /// The application socket's thread: joined on stop, so that its socket file is gone
    /// when the dataplane is (a process exiting right after left it behind).
    apps: Option<JoinHandle<()>>,
}

/// A registered service: send messages, receive its events.
#[derive(Debug, Clone)]
pub struct Service {
    id: u16,
    shared: Arc<Shared>,
    inbox: Arc<Inbox>,
}

impl Service {
    /// The service id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// Queues a message for the poller; `WouldBlock` when the queue to the poller is full
    /// (the transport's own back-pressure reaches here through it). A message taken ends in
    /// one report to this service when it was reliable and acknowledgements were asked for
    /// ([`Service::notify_acks`]), and in an [`Event::Failed`] whenever it cannot be
    /// delivered, naming it by `opts.tag`.
    pub fn send(&self, target: Target, data: &[u8], opts: MsgOptions) -> Result<(), SendError> {
        self.send_to(target, self.id, data, opts)
    }

    /// Sends to service `service` at the target (another service than this one's id there);
    /// reports still come to this service.
    pub fn send_to(
        &self,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError> {
        let max = if opts.reliable {
            self.shared.max_message
        } else {
            self.shared.mtu as usize - TORUS_LEN - 6
        };
        if data.len() > max {
            return Err(SendError::TooLarge {
                len: data.len(),
                max,
            });
        }
        if let Target::Server(c) = target {
            if !self.shared.dims.contains(c) {
                return Err(SendError::Unreachable);
            }
        }
        let c = Command::Send {
            target,
            service,
            data: data.to_vec(),
            opts: MsgOptions {
                from: Some(self.id),
                ..opts
            },
        };
        self.shared.push(c).map_err(|_| SendError::WouldBlock)
    }

    /// Sends, retrying while the queue is full, up to `timeout`.
    pub fn send_blocking(
        &self,
        target: Target,
        data: &[u8],
        opts: MsgOptions,
        timeout: Duration,
    ) -> Result<(), SendError> {
        self.send_to_blocking(target, self.id, data, opts, timeout)
    }

    /// [`Service::send_to`], retrying while the queue is full, up to `timeout`.
    pub fn send_to_blocking(
        &self,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
        timeout: Duration,
    ) -> Result<(), SendError> {
        let deadline = Instant::now() + timeout;
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            match self.send_to(target, service, data, opts) {
                Err(SendError::WouldBlock) if Instant::now() < deadline => {
                    if backoff.is_completed() {
                        std::thread::sleep(Duration::from_micros(50));
                    } else {
                        backoff.snooze();
                    }
                }
                r => return r,
            }
        }
    }

    /// Asks for [`Event::Acked`] reports of this service's reliable messages (or stops them).
    pub fn notify_acks(&self, on: bool) -> Result<(), SendError> {
        self.shared
            .push(Command::NotifyAcks(self.id, on))
            .map_err(|_| SendError::WouldBlock)
    }

    /// The next event, if one is waiting.
    pub fn recv(&self) -> Option<Event> {
        self.inbox.queue.pop()
    }

    /// The next event, waiting up to `timeout`.
    /// Spins briefly, then sleeps on the inbox's eventfd until the poller pushes. It never
    /// yields the processor while waiting: on a machine whose cores the pollers keep busy, a
    /// yielding thread waits a whole time slice for its turn, long after its event came.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Event> {
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            if let Some(e) = self.inbox.queue.pop() {
                return Some(e);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            if spins < 256 {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            self.inbox.waiting.store(true, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            if let Some(e) = self.inbox.queue.pop() {
                self.inbox.waiting.store(false, Ordering::SeqCst);
                return Some(e);
            }
            let ms = (deadline - now).as_millis().clamp(1, 1000) as i32;
            torusnet_client::sys::wait_readable(self.inbox.efd.as_raw_fd(), ms);
            torusnet_client::sys::drain(self.inbox.efd.as_raw_fd());
            self.inbox.waiting.store(false, Ordering::SeqCst);
        }
    }
}

/// A random non-zero incarnation for this start of the dataplane, from the kernel's random
/// pool (the clock as a fallback, so a start never fails for lack of randomness).
fn draw_incarnation() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let v = if n == 8 {
        u64::from_ne_bytes(b)
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            ^ u64::from(std::process::id()) << 32
    };
    v.max(1)
}

/// A MAC packed for an atomic: 48 bits, bit 63 = known.
pub(crate) fn mac_to_u64(m: Option<[u8; 6]>) -> u64 {
    m.map_or(0, |m| {
        let mut b = [0u8; 8];
        b[2..].copy_from_slice(&m);
        u64::from_be_bytes(b) | 1 << 63
    })
}

/// The MAC packed by [`mac_to_u64`].
pub(crate) fn mac_from_u64(v: u64) -> Option<[u8; 6]> {
    (v >> 63 == 1).then(|| {
        let b = (v & !(1 << 63)).to_be_bytes();
        let mut m = [0u8; 6];
        m.copy_from_slice(&b[2..]);
        m
    })
}

/// Adds up the pollers' snapshots (the view-related fields are the same in all; the first
/// poller's are kept).
fn merge(mut v: Vec<EngineSnapshot>) -> EngineSnapshot {
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
    /// Engine counters.
    pub engine: EngineSnapshot,
    /// Applications attached from their own processes.
    pub apps: Vec<crate::apps::AppStatus>,
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

impl Dataplane {
    /// Sets up every link (XDP program, socket in its poller's shared UMEM) and starts one
    /// poller per configured core (one unpinned poller when no core is configured). Links
    /// are dealt to pollers in configuration order; each poller owns its links' rings, a
    /// UMEM shared by them, and the connections of the peers hashed to it.
    pub fn start(cfg: &NodeConfig) -> Result<Dataplane, StartError> {
        let coord = cfg.coord.ok_or_else(|| {
            StartError::Engine(
                "no coordinate: configure coord, or let the control process assign it".into(),
            )
        })?;
        let nshards = cfg.cores.len().clamp(1, cfg.links.len().max(1));
        let chunks_per_frame = (cfg.mtu as usize + 14).div_ceil(CHUNK);
        let sock_cfg = SocketConfig {
            multi_buffer: chunks_per_frame > 1,
            need_wakeup: cfg.polling == Polling::Adaptive,
            ..SocketConfig::default()
        };
        let mut umems = Vec::new();
        for shard in 0..nshards {
            // Links go to pollers round-robin (below); jumbo frames are sent from slots
            // that come on top of the configured chunks.
            let links = (0..cfg.links.len())
                .filter(|l| poller_of(*l, nshards) == shard)
                .count();
            let slots = crate::poller::tx_slots(links, chunks_per_frame as u32);
            umems.push(
                Umem::new(cfg.umem_chunks / nshards as u32 + slots * chunks_per_frame as u32)
                    .map_err(|e| StartError::Link(format!("UMEM: {e}")))?,
            );
        }
        let mut ports: Vec<Vec<(usize, Port)>> = (0..nshards).map(|_| Vec::new()).collect();
        let mut infos = Vec::new();
        let mut link_shard = [None; 6];
        // One socket per link reads RX queue 0: refuse links where torus frames could land
        // on other queues that nobody reads.
        for l in &cfg.links {
            let q =
                crate::netns::rx_queues(&l.ifname).map_err(|e| StartError::Link(e.to_string()))?;
            if let Some(n) = q.filter(|n| *n > 1) {
                if !cfg.rx_queue_steering {
                    return Err(StartError::Link(format!(
                        "{}: {n} RX queues, but torusd reads queue 0 only: set one queue \
                         (ethtool -L {} combined 1), or steer the torus EtherType to queue 0 \
                         (ethtool -N {} flow-type ether proto 0x88b5 action 0) and set \
                         rx_queue_steering = true",
                        l.ifname, l.ifname, l.ifname
                    )));
                }
            }
        }
        for (idx, l) in cfg.links.iter().enumerate() {
            let shard = poller_of(idx, nshards);
            link_shard[usize::from(l.dir.index())] = Some(shard);
            let local_mac = mac_of(&l.ifname).map_err(|e| StartError::Link(e.to_string()))?;
            let mut xdp = XdpAttachment::attach(&l.ifname, cfg.mtu, AttachPreference::Auto)
                .map_err(|e| StartError::Link(e.to_string()))?;
            let share = ports[shard].first().map(|p| &p.1.xsk);
            let xsk = XskSocket::new(&umems[shard], share, &l.ifname, 0, &sock_cfg)
                .map_err(|e| StartError::Link(format!("{}: {e}", l.ifname)))?;
            xdp.register_socket(0, xsk.raw_fd())
                .map_err(|e| StartError::Link(e.to_string()))?;
            let info = xsk.info();
            infos.push(LinkInfo {
                dir: l.dir,
                ifname: l.ifname.clone(),
                local_mac,
                neighbor_mac: AtomicU64::new(mac_to_u64(l.neighbor_mac)),
                xdp_mode: xdp.mode().name(),
                xdp_section: xdp.variant().section(),
                zero_copy: info.zero_copy,
                multi_buffer: info.multi_buffer,
                // The first socket of a poller registers the UMEM the others share.
                shared_umem: true,
                tx_budget: info.tx_budget,
                poller: shard,
                counters: LinkCounters::default(),
            });
            let port = Port::new(l.dir, local_mac, l.neighbor_mac, xsk, xdp);
            ports[shard].push((idx, port));
        }
        let mut shards = Vec::new();
        for _ in 0..nshards {
            shards.push(ShardShared::new().map_err(StartError::Thread)?);
        }
        let incarnation = draw_incarnation();
        let transport = transport::Config {
            incarnation,
            ..cfg.transport
        };
        let shared = Arc::new(Shared {
            name: cfg.name.clone(),
            dims: cfg.dims,
            coord,
            mtu: cfg.mtu,
            polling: cfg.polling,
            incarnation,
            max_message: transport.max_message,
            links: infos,
            services: Mutex::new(HashMap::new()),
            services_version: AtomicU64::new(0),
            hosted: Arc::default(),
            shutdown: AtomicBool::new(false),
            apps: crate::apps::AppsRegistry::default(),
            shards,
            link_shard,
            started: Instant::now(),
            kv: cfg
                .kv
                .as_ref()
                .map(|_| Arc::new(torusnet_services::kv::KvCounters::default())),
            kv_gateway: Mutex::new(None),
            commands_dropped: AtomicU64::new(0),
            rmem: std::sync::OnceLock::new(),
            ip: cfg
                .ip
                .clone()
                .map(|c| (c, Arc::new(crate::ip::IpCounters::default()))),
        });
        let weak = Arc::downgrade(&shared);
        let rm = Arc::new(crate::rmem::Rmem::new(
            torusnet_client::channel::pack_coord(coord.x, coord.y, coord.z),
            cfg.mtu as usize - torusnet_proto::wire::TORUS_LEN,
            Box::new(move || {
                if let Some(s) = weak.upgrade() {
                    if let Some(sh) = s.shards.first() {
                        sh.wake();
                    }
                }
            }),
        ));
        let _ = shared.rmem.set(rm.clone());
        // IP's interface, before the engines: each engine writes what arrives for IP into it.
        let mut ip_service = match &shared.ip {
            Some((ip, counters)) => {
                let index = cfg.dims.index(coord);
                Some(
                    crate::ip::IpService::start(ip.clone(), index, counters.clone())
                        .map_err(|e| StartError::Link(format!("IP interface {}: {e}", ip.name)))?,
                )
            }
            None => None,
        };
        let ip_placer = ip_service.as_ref().map(crate::ip::IpService::placer);
        let mut pollers = Vec::new();
        for (shard, (umem, ports)) in umems.into_iter().zip(ports).enumerate() {
            let mut node = Node::new(coord, cfg.view.clone(), transport)
                .map_err(|e| StartError::Engine(e.to_string()))?;
            if let Some(on) = cfg.routing.source {
                node.enable_source_routing(cfg.routing.bsr);
                node.set_source_routing(on);
                node.set_source_services(cfg.routing.services.clone());
            }
            if let Some(placer) = &ip_placer {
                // Room for a few dozen 64 KiB segments per peer before IP drops.
                node.configure_service(crate::ip::IP, 1, 4 << 20);
                node.set_placer(crate::ip::IP, Box::new(placer.clone()));
            }
            node.set_placer(
                crate::rmem::RMEM,
                Box::new(crate::rmem::RmemPlacer(rm.clone())),
            );
            node.set_hosted(Some(shared.hosted.clone()));
            node.configure_service(crate::rmem::RMEM, 1, 8 << 20);
            // A few dozen chunks queued: the service keeps the rest until there is room.
            node.configure_service(torusnet_services::multicast::MCAST, 1, 4 << 20);
            node.configure_service(torusnet_services::aggregate::AGG, 1, 4 << 20);
            let journal = |what: &str, path: &Option<std::path::PathBuf>| {
                path.as_ref()
                    .map(|p| {
                        std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(p)
                            .map(|f| Box::new(f) as torusnet_services::builtin::Journal)
                            .map_err(|e| {
                                StartError::Engine(format!("{what}.journal {}: {e}", p.display()))
                            })
                    })
                    .transpose()
            };
            let (load_journal, keys_journal) = (
                journal("load", &cfg.load_journal)?,
                journal("keys", &cfg.keys_journal)?,
            );
            // Services live with the first poller, one instance per server; the others hand
            // it their events, and it hands them sends for the peers they own.
            let mut services = Vec::new();
            if shard == 0 {
                services = torusnet_services::builtin::all(load_journal, keys_journal);
                services.push(Box::new(crate::rmem::RmemService::new(rm.clone())));
                services.push(Box::new(torusnet_services::multicast::Multicast::default()));
                services.push(Box::new(torusnet_services::aggregate::Aggregate::default()));
                if cfg.apps.is_some() {
                    services.push(Box::new(crate::apps::host::AppsHost::new(shared.clone())));
                }
                if let (Some(k), Some(counters)) = (&cfg.kv, &shared.kv) {
                    services.push(Box::new(kv_service(k, counters.clone())?));
                }
                if let Some(svc) = ip_service.take() {
                    services.push(Box::new(svc));
                }
            }
            let poller = Poller::new(shard, node, umem, ports, shared.clone(), cfg.mtu as usize)
                .with_services(services)
                .with_link_capacity(cfg.routing.link_capacity_bps)
                .with_transit_chunks(cfg.transit_chunks);
            let core = cfg.cores.get(shard).copied();
            let handle = std::thread::Builder::new()
                .name(format!("torusd-poll{shard}"))
                .spawn(move || {
                    if let Some(c) = core {
                        core_affinity::set_for_current(core_affinity::CoreId { id: c });
                    }
                    poller.run()
                })
                .map_err(StartError::Thread)?;
            pollers.push(handle);
        }
        let links: Vec<(String, Dir)> = cfg
            .links
            .iter()
            .map(|l| (l.ifname.clone(), l.dir))
            .collect();
        let weak = Arc::downgrade(&shared);
        let done = Arc::downgrade(&shared);
        let carrier = crate::carrier::start(
            &links,
            Arc::new(move || {
                done.upgrade()
                    .is_none_or(|s| s.shutdown.load(Ordering::Acquire))
            }),
            Box::new(move |dir, up| {
                if let Some(s) = weak.upgrade() {
                    for sh in &s.shards {
                        // Full queues are drained within a turn: wait a little for room.
                        let mut c = Command::LinkCarrier(dir, up);
                        for _ in 0..1000 {
                            match sh.commands.push(c) {
                                Ok(()) => break,
                                Err(back) => {
                                    c = back;
                                    std::thread::sleep(Duration::from_micros(100));
                                }
                            }
                        }
                        sh.wake();
                    }
                }
            }),
        );
        if let Err(e) = carrier {
            // Source routing then learns of dead links from the view alone.
            tracing::warn!("cannot watch link carriers (netlink): {e}");
        }
        let mut apps = None;
        if let Some(a) = &cfg.apps {
            let h = crate::apps::listener::start(a.clone(), shared.clone()).map_err(|e| {
                shared.shutdown.store(true, Ordering::Release);
                shared.wake_all();
                StartError::Link(format!("application socket {}: {e}", a.socket.display()))
            })?;
            apps = Some(h);
        }
        let mut gateway = None;
        if let (Some(k), Some(counters)) = (&cfg.kv, &shared.kv) {
            if let Some(g) = &k.gateway {
                let submit = Arc::new(KvSubmit(shared.clone()));
                let gw = crate::kvgw::start(g.clone(), submit, counters.clone()).map_err(|e| {
                    shared.shutdown.store(true, Ordering::Release);
                    shared.wake_all();
                    StartError::Link(format!("memcached gateway {}: {e}", g.listen))
                })?;
                *shared.kv_gateway.lock() = Some((gw.addr, gw.counters.clone()));
                gateway = Some(gw);
            }
        }
        Ok(Dataplane {
            shared,
            pollers,
            gateway,
            apps,
        })
    }

    /// Registers service `id` (or returns the existing registration) with an inbox of
    /// 65536 events. Ids 1..=63 belong to torusd's own services (their events never reach
    /// an inbox) and 1024 and up to attached applications: embedded services take 64..=1023.
    ///
    /// # Panics
    /// When no eventfd can be made (the process is out of file descriptors).
    pub fn service(&self, id: u16) -> Service {
        let mut s = self.shared.services.lock();
        let inbox = s
            .entry(id)
            .or_insert_with(|| Arc::new(Inbox::new().expect("an eventfd for the inbox")))
            .clone();
        self.shared.services_version.fetch_add(1, Ordering::Release);
        self.shared.hosted.host(id);
        Service {
            id,
            shared: self.shared.clone(),
            inbox,
        }
    }

    /// Remote memory owned by embedded service `id` (64..=1023, as for [`Dataplane::service`]):
    /// regions of the program's memory, capabilities, one-sided reads and writes, tripwires.
    /// Everything it registered is revoked when the handle drops.
    pub fn remote_memory(&self, id: u16) -> Option<crate::rmem::embedded::RemoteMemory> {
        if !(64..1024).contains(&id) {
            return None;
        }
        let rm = self.shared.rmem.get()?.clone();
        Some(crate::rmem::embedded::RemoteMemory::new(rm, id))
    }

    /// Queues a command for the poller that should run it.
    pub fn command(&self, c: Command) -> Result<(), Command> {
        self.shared.push(c)
    }

    /// The shared state (links, counters).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Whether every poller is still running.
    pub fn is_running(&self) -> bool {
        !self.pollers.is_empty() && self.pollers.iter().all(|h| !h.is_finished())
    }

    /// A status report.
    pub fn status(&self) -> Status {
        let s = &self.shared;
        let mut engine = merge(
            s.shards
                .iter()
                .map(|sh| sh.snapshot.lock().clone())
                .collect(),
        );
        engine.commands_dropped = s.commands_dropped.load(Ordering::Relaxed);
        let links = s
            .links
            .iter()
            .enumerate()
            .map(|(i, l)| LinkStatus {
                dir: l.dir.name().to_string(),
                ifname: l.ifname.clone(),
                mac: format_mac(l.local_mac),
                neighbor_mac: mac_from_u64(l.neighbor_mac.load(Ordering::Relaxed)).map(format_mac),
                xdp_mode: l.xdp_mode,
                xdp_section: l.xdp_section,
                afxdp_mode: if l.zero_copy { "zero-copy" } else { "copy" },
                multi_buffer: l.multi_buffer,
                shared_umem: l.shared_umem,
                tx_budget: l.tx_budget,
                counters: l.counters.snapshot(),
                xdp: engine
                    .xdp
                    .iter()
                    .find(|(k, _)| *k == i)
                    .map(|x| x.1)
                    .unwrap_or_default(),
                xsk: engine
                    .xsk
                    .iter()
                    .find(|(k, _)| *k == i)
                    .map(|x| x.1)
                    .unwrap_or_default(),
                poller: l.poller,
            })
            .collect();
        Status {
            name: s.name.clone(),
            coord: s.coord.to_array(),
            dims: s.dims.to_string(),
            mtu: s.mtu,
            polling: s.polling,
            incarnation: format!("{:016x}", s.incarnation),
            uptime_s: s.started.elapsed().as_secs_f64(),
            links,
            engine,
            apps: s.apps.status(),
            services: s.hosted.ids(),
            rmem: s.rmem.get().map(|r| r.stats()),
            ip: s
                .ip
                .as_ref()
                .map(|(c, n)| crate::ip::IpService::stats(c, s.dims.index(s.coord), n)),
            kv: s.kv.as_ref().map(|k| {
                let gw = s.kv_gateway.lock().clone();
                KvStatus {
                    gateway: gw.as_ref().map(|(a, _)| a.to_string()),
                    connections: gw
                        .as_ref()
                        .map_or(0, |(_, c)| c.connections.load(Ordering::Relaxed)),
                    commands: gw
                        .as_ref()
                        .map_or(0, |(_, c)| c.commands.load(Ordering::Relaxed)),
                    store: k.snapshot(),
                }
            }),
        }
    }

    /// Stops the poller and detaches everything (also done on drop).
    pub fn shutdown(mut self) -> Result<(), String> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), String> {
        if let Some(g) = self.gateway.take() {
            g.stop();
        }
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.wake_all();
        let mut result = Ok(());
        for h in self.pollers.drain(..) {
            let r = h
                .join()
                .map_err(|_| "a poller panicked".to_string())
                .and_then(|r| r);
            if result.is_ok() {
                result = r;
            }
        }
        // It looks at the shutdown flag at least every quarter second.
        if let Some(h) = self.apps.take() {
            if h.join().is_err() && result.is_ok() {
                result = Err("the application socket's thread panicked".to_string());
            }
        }
        result
    }
}

/// The key-value service of this server, from its settings (and its disk log, in disk mode).
fn kv_service(
    k: &crate::kvgw::KvSettings,
    counters: Arc<torusnet_services::kv::KvCounters>,
) -> Result<torusnet_services::kv::Kv, StartError> {
    use torusnet_services::kv::{Kv, KvConfig};
    // Versions follow the wall clock from the poller's time zero (it starts right after).
    let epoch_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let cfg = KvConfig {
        epoch_us,
        ..k.service.clone()
    };
    let kv = Kv::new(cfg, counters);
    Ok(match &k.log {
        Some(path) => {
            let (records, log) = crate::kvgw::open_log(path, epoch_us)
                .map_err(|e| StartError::Engine(format!("kv.log {}: {e}", path.display())))?;
            kv.with_log(records, log, torusnet_proto::time::Time::ZERO)
        }
        None => kv,
    })
}

/// The way to the key-value store from outside the pollers (the gateway, the management
/// socket): a request to the service in the first poller.
pub struct KvSubmit(Arc<Shared>);

impl KvSubmit {
    /// Requests go to this dataplane's store.
    pub fn new(shared: Arc<Shared>) -> KvSubmit {
        KvSubmit(shared)
    }
}

impl crate::kvgw::Submit for KvSubmit {
    fn submit(&self, req: torusnet_services::kv::KvRequest) -> Result<(), String> {
        let c = Command::Request {
            service: torusnet_services::kv::KV,
            request: Box::new(req),
        };
        self.0
            .push_to(0, c)
            .map_err(|_| "the poller's command queue is full".to_string())
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The poller that serves the configuration's `link`-th link: links go to pollers round
/// robin. The UMEMs are sized by it before the links are opened, so both ask here.
fn poller_of(link: usize, pollers: usize) -> usize {
    link % pollers.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(pollers: usize) -> Shared {
        Shared::detached("2x2x1".parse().expect("dims"), Coord::new(0, 0, 0), pollers)
            .expect("eventfd")
    }

    fn fill(q: &ArrayQueue<Command>) {
        while q.push(Command::NotifyAcks(1, true)).is_ok() {}
    }

    #[test]
    fn a_command_for_every_poller_goes_to_all_or_to_none() {
        let s = shared(3);
        fill(&s.shards[2].commands);
        let before: Vec<usize> = s.shards.iter().map(|sh| sh.commands.len()).collect();
        assert!(s.push(Command::NotifyAcks(7, true)).is_err());
        let after: Vec<usize> = s.shards.iter().map(|sh| sh.commands.len()).collect();
        assert_eq!(before, after, "no poller got it");
        // With room everywhere, every poller gets it.
        while s.shards[2].commands.pop().is_some() {}
        assert!(s.push(Command::NotifyAcks(7, false)).is_ok());
        for sh in &s.shards {
            assert!(matches!(
                sh.commands.pop(),
                Some(Command::NotifyAcks(7, false))
            ));
        }
        assert_eq!(s.commands_dropped.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_command_nobody_waits_for_is_counted_when_its_queue_is_full() {
        let s = shared(1);
        fill(&s.shards[0].commands);
        s.push_or_count(0, Command::NotifyAcks(9, true));
        assert_eq!(s.commands_dropped.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_full_hand_off_queue_counts_the_frame_it_turns_away() {
        let shard = ShardShared::new().expect("eventfd");
        let mut counts = HandoffCounts::default();
        let cap = shard.handoff.capacity();
        for _ in 0..cap {
            assert!(shard.hand_off(Handoff::Deliver(vec![1]), &mut counts));
        }
        assert!(!shard.hand_off(Handoff::Send(Dir::PlusX, vec![2]), &mut counts));
        assert_eq!((counts.passed, counts.dropped), (cap as u64, 1));
        // Room again once the owner takes one.
        assert!(shard.handoff.pop().is_some());
        assert!(shard.hand_off(Handoff::Deliver(vec![3]), &mut counts));
        assert_eq!((counts.passed, counts.dropped), (cap as u64 + 1, 1));
    }
}
