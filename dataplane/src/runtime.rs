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
use torusnet_proto::topology::{Coord, Dims, Dir};
use torusnet_proto::transport::{self, SendError};
use torusnet_proto::wire::TORUS_LEN;

use crate::builtin::{BenchRequest, PingRequest};
use crate::config::{NodeConfig, Polling};
use crate::counters::{LinkCounters, LinkCountersSnapshot};
use crate::loader::{AttachPreference, XdpAttachment, XdpCounters};
use crate::netns::{format_mac, mac_of};
use crate::poller::{Poller, Port};
use crate::xsk::{SocketConfig, Umem, XskSocket, CHUNK};

/// Something for the poller to do on an application's behalf.
#[derive(Debug)]
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
    /// Adopt a new link-state view.
    SetView(Box<LinkView>),
    /// Run the built-in ping-pong client.
    Ping(PingRequest),
    /// Run the built-in bulk transfer.
    Bench(BenchRequest),
}

/// A service's inbox: events the poller delivers, waiting for the application.
#[derive(Debug)]
pub struct Inbox {
    pub(crate) queue: ArrayQueue<Event>,
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
    /// The neighbour's MAC, if configured.
    pub neighbor_mac: Option<[u8; 6]>,
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
    /// XDP program counters per link, in link order.
    pub xdp: Vec<XdpCounters>,
    /// Servers unreachable in this server's view.
    pub unreachable: Vec<[u16; 3]>,
    /// Version of the view in use (counts adopted views).
    pub view_version: u64,
    /// Free UMEM chunks.
    pub umem_free: usize,
    /// Events dropped because a service did not read its inbox.
    pub inbox_overflow: u64,
}

/// Transport counters, serialisable.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct TransportStatus {
    /// New reliable data frames sent.
    pub data_frames: u64,
    /// Retransmitted frames.
    pub retransmitted_frames: u64,
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
}

impl TransportStatus {
    pub(crate) fn from(s: transport::Stats, in_flight: u64) -> TransportStatus {
        TransportStatus {
            data_frames: s.data_frames,
            retransmitted_frames: s.retransmitted_frames,
            ack_frames: s.ack_frames,
            nack_frames: s.nack_frames,
            short_frames: s.short_frames,
            messages_sent: s.messages_sent,
            messages_delivered: s.messages_delivered,
            duplicate_frames: s.duplicate_frames,
            out_of_order_frames: s.out_of_order_frames,
            in_flight,
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
    /// The links.
    pub links: Vec<LinkInfo>,
    pub(crate) commands: ArrayQueue<Command>,
    pub(crate) services: Mutex<HashMap<u16, Arc<Inbox>>>,
    pub(crate) services_version: AtomicU64,
    pub(crate) shutdown: AtomicBool,
    pub(crate) sleeping: AtomicBool,
    pub(crate) wake: OwnedFd,
    pub(crate) snapshot: Mutex<EngineSnapshot>,
    pub(crate) started: Instant,
}

impl Shared {
    /// Wakes the poller if it sleeps in poll().
    pub(crate) fn wake(&self) {
        if self.sleeping.load(Ordering::Acquire) {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes to our eventfd.
            unsafe {
                libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8);
            }
        }
    }
}

/// A running dataplane.
#[derive(Debug)]
pub struct Dataplane {
    shared: Arc<Shared>,
    poller: Option<JoinHandle<Result<(), String>>>,
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
    /// (the transport's own back-pressure reaches here through it).
    pub fn send(&self, target: Target, data: &[u8], opts: MsgOptions) -> Result<(), SendError> {
        let max_short = self.shared.mtu as usize - TORUS_LEN - 6;
        if !opts.reliable && data.len() > max_short {
            return Err(SendError::TooLarge {
                len: data.len(),
                max: max_short,
            });
        }
        let c = Command::Send {
            target,
            service: self.id,
            data: data.to_vec(),
            opts,
        };
        self.shared
            .commands
            .push(c)
            .map_err(|_| SendError::WouldBlock)?;
        self.shared.wake();
        Ok(())
    }

    /// Sends, retrying while the queue is full, up to `timeout`.
    pub fn send_blocking(
        &self,
        target: Target,
        data: &[u8],
        opts: MsgOptions,
        timeout: Duration,
    ) -> Result<(), SendError> {
        let deadline = Instant::now() + timeout;
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            match self.send(target, data, opts) {
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

    /// The next event, if one is waiting.
    pub fn recv(&self) -> Option<Event> {
        self.inbox.queue.pop()
    }

    /// The next event, waiting up to `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Event> {
        let deadline = Instant::now() + timeout;
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            if let Some(e) = self.inbox.queue.pop() {
                return Some(e);
            }
            if Instant::now() >= deadline {
                return None;
            }
            if backoff.is_completed() {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                backoff.snooze();
            }
        }
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
    /// Counters.
    pub counters: LinkCountersSnapshot,
    /// XDP program counters.
    pub xdp: XdpCounters,
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
    /// Seconds since start.
    pub uptime_s: f64,
    /// Links.
    pub links: Vec<LinkStatus>,
    /// Engine counters.
    pub engine: EngineSnapshot,
}

impl Dataplane {
    /// Sets up every link (XDP program, socket in the shared UMEM) and starts the poller.
    pub fn start(cfg: &NodeConfig) -> Result<Dataplane, StartError> {
        let chunks_per_frame = (cfg.mtu as usize + 14).div_ceil(CHUNK);
        let umem =
            Umem::new(cfg.umem_chunks).map_err(|e| StartError::Link(format!("UMEM: {e}")))?;
        let sock_cfg = SocketConfig {
            multi_buffer: chunks_per_frame > 1,
            need_wakeup: cfg.polling == Polling::Adaptive,
            ..SocketConfig::default()
        };
        let mut ports: Vec<Port> = Vec::new();
        let mut infos = Vec::new();
        for l in &cfg.links {
            let local_mac = mac_of(&l.ifname).map_err(|e| StartError::Link(e.to_string()))?;
            let mut xdp = XdpAttachment::attach(&l.ifname, cfg.mtu, AttachPreference::Auto)
                .map_err(|e| StartError::Link(e.to_string()))?;
            let share = ports.first().map(|p| &p.xsk);
            let xsk = XskSocket::new(&umem, share, &l.ifname, 0, &sock_cfg)
                .map_err(|e| StartError::Link(format!("{}: {e}", l.ifname)))?;
            xdp.register_socket(0, xsk.raw_fd())
                .map_err(|e| StartError::Link(e.to_string()))?;
            let info = xsk.info();
            infos.push(LinkInfo {
                dir: l.dir,
                ifname: l.ifname.clone(),
                local_mac,
                neighbor_mac: l.neighbor_mac,
                xdp_mode: xdp.mode().name(),
                xdp_section: xdp.variant().section(),
                zero_copy: info.zero_copy,
                multi_buffer: info.multi_buffer,
                shared_umem: info.shared_umem || ports.is_empty(),
                tx_budget: info.tx_budget,
                counters: LinkCounters::default(),
            });
            ports.push(Port::new(l.dir, local_mac, l.neighbor_mac, xsk, xdp));
        }
        let node = Node::new(cfg.coord, cfg.view.clone(), cfg.transport)
            .map_err(|e| StartError::Engine(e.to_string()))?;
        // SAFETY: eventfd returns a new descriptor we own.
        let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(StartError::Thread(std::io::Error::last_os_error()));
        }
        let shared = Arc::new(Shared {
            name: cfg.name.clone(),
            dims: cfg.dims,
            coord: cfg.coord,
            mtu: cfg.mtu,
            polling: cfg.polling,
            links: infos,
            commands: ArrayQueue::new(1 << 16),
            services: Mutex::new(HashMap::new()),
            services_version: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            // SAFETY: wake is a fresh descriptor.
            wake: unsafe { OwnedFd::from_raw_fd(wake) },
            snapshot: Mutex::new(EngineSnapshot::default()),
            started: Instant::now(),
        });
        let core = cfg.cores.first().copied();
        let poller = Poller::new(node, umem, ports, shared.clone(), cfg.mtu as usize);
        let handle = std::thread::Builder::new()
            .name(format!("torusd-poll-{}", cfg.name))
            .spawn(move || {
                if let Some(c) = core {
                    core_affinity::set_for_current(core_affinity::CoreId { id: c });
                }
                poller.run()
            })
            .map_err(StartError::Thread)?;
        Ok(Dataplane {
            shared,
            poller: Some(handle),
        })
    }

    /// Registers service `id` (or returns the existing registration) with an inbox of
    /// `capacity` events.
    pub fn service(&self, id: u16) -> Service {
        let mut s = self.shared.services.lock();
        let inbox = s
            .entry(id)
            .or_insert_with(|| {
                Arc::new(Inbox {
                    queue: ArrayQueue::new(1 << 16),
                })
            })
            .clone();
        self.shared.services_version.fetch_add(1, Ordering::Release);
        Service {
            id,
            shared: self.shared.clone(),
            inbox,
        }
    }

    /// Queues a command for the poller.
    pub fn command(&self, c: Command) -> Result<(), Command> {
        self.shared.commands.push(c)?;
        self.shared.wake();
        Ok(())
    }

    /// The shared state (links, counters).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Whether the poller is still running.
    pub fn is_running(&self) -> bool {
        self.poller.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// A status report.
    pub fn status(&self) -> Status {
        let s = &self.shared;
        let engine = s.snapshot.lock().clone();
        let links = s
            .links
            .iter()
            .enumerate()
            .map(|(i, l)| LinkStatus {
                dir: l.dir.name().to_string(),
                ifname: l.ifname.clone(),
                mac: format_mac(l.local_mac),
                neighbor_mac: l.neighbor_mac.map(format_mac),
                xdp_mode: l.xdp_mode,
                xdp_section: l.xdp_section,
                afxdp_mode: if l.zero_copy { "zero-copy" } else { "copy" },
                multi_buffer: l.multi_buffer,
                shared_umem: l.shared_umem,
                tx_budget: l.tx_budget,
                counters: l.counters.snapshot(),
                xdp: engine.xdp.get(i).copied().unwrap_or_default(),
            })
            .collect();
        Status {
            name: s.name.clone(),
            coord: s.coord.to_array(),
            dims: s.dims.to_string(),
            mtu: s.mtu,
            polling: s.polling,
            uptime_s: s.started.elapsed().as_secs_f64(),
            links,
            engine,
        }
    }

    /// Stops the poller and detaches everything (also done on drop).
    pub fn shutdown(mut self) -> Result<(), String> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), String> {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.sleeping.store(true, Ordering::Release);
        self.shared.wake();
        match self.poller.take() {
            Some(h) => h.join().map_err(|_| "the poller panicked".to_string())?,
            None => Ok(()),
        }
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
