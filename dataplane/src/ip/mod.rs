//! IP over the torus: every torusd brings up a TUN interface (`torus0`), so the kernel's own
//! TCP/IP stack, sockets and tools (ping, iperf3, ssh, curl) work across the torus unchanged
//! (CamCube's TCP/IP service, section 6.3 of its paper; CLAN's bridging).
//!
//! - [`addr`]: server i is host i + 1 of an IPv4 and an IPv6 prefix; one flat network, one
//!   prefix route each.
//! - [`packet`]: where a packet goes; ICMP "host unreachable" for addresses without a live
//!   server.
//! - [`tun`]: the interface, with the kernel's offloads (64 KiB TCP segments pass whole).
//!
//! The service (`ip`, id 7, in the first poller) reads packets from the interface and sends
//! each as one reliable message to the server that owns its destination address, with a
//! backward fence: the transport stripes the frames of every flow over all next-hop links and
//! puts them back in order, and delivers the packets between two servers in the order they
//! were read, so TCP never sees the reordering striping causes. The destination's service
//! writes the packet into its interface. A packet the transport cannot take now (its queue
//! for the service is full) is dropped and counted, as a router drops on a full queue, and TCP
//! backs off; small packets share frames (the transport's aggregation). A packet that arrives
//! is written into the interface by the transport's placer for IP ([`IpPlacer`], on every
//! poller's engine) as it is released in order, from the frame or the reassembled segment:
//! not copied into the engine's inbox and again for the service first.

pub mod addr;
pub mod packet;
pub mod tun;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::service::{Engine, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::{Fences, Placer, SendError};

use self::addr::{Prefix4, Prefix6};
use self::packet::{classify, Dest, VNET_HDR};
use self::tun::Tun;

/// Service id of IP over the torus.
pub const IP: u16 = 7;

/// How the interface is set up (`[ip]` in the node file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// The interface's name.
    pub name: String,
    /// The torus's IPv4 prefix.
    pub v4: Prefix4,
    /// The torus's IPv6 prefix (none: IPv4 only).
    pub v6: Option<Prefix6>,
    /// The interface's MTU.
    pub mtu: u32,
}

/// Counters of the IP service.
#[derive(Debug, Default)]
pub struct IpCounters {
    sent: AtomicU64,
    sent_bytes: AtomicU64,
    segments: AtomicU64,
    received: AtomicU64,
    received_bytes: AtomicU64,
    congested: AtomicU64,
    unreachable: AtomicU64,
    group: AtomicU64,
    outside: AtomicU64,
    malformed: AtomicU64,
    failed: AtomicU64,
    write_errors: AtomicU64,
}

/// A snapshot of [`IpCounters`], with the interface's addresses.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IpStats {
    /// The interface.
    pub interface: String,
    /// Its IPv4 address.
    pub ipv4: String,
    /// Its IPv6 address.
    pub ipv6: Option<String>,
    /// Its MTU.
    pub mtu: u32,
    /// Packets read from the interface and sent over the torus.
    pub sent: u64,
    /// Their bytes.
    pub sent_bytes: u64,
    /// Of them, large segments the kernel will cut at the destination (TSO/GSO).
    pub segments: u64,
    /// Packets received from the torus and written to the interface.
    pub received: u64,
    /// Their bytes.
    pub received_bytes: u64,
    /// Dropped: the transport's queue for IP was full (TCP backs off).
    pub congested: u64,
    /// Dropped with an ICMP "host unreachable": no live server has the address.
    pub unreachable: u64,
    /// Dropped: broadcast or multicast.
    pub group: u64,
    /// Dropped: outside the torus's prefixes.
    pub outside: u64,
    /// Dropped: not IP, or from the torus not a packet.
    pub malformed: u64,
    /// Sent but reported failed by the transport (the destination restarted or failed).
    pub failed: u64,
    /// The interface refused a received packet.
    pub write_errors: u64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// How long the service waits after finding the interface empty before it reads again while
/// the poller is busy (reads are system calls; a sleeping poller is woken by the interface).
const READ_PAUSE: Duration = Duration::from_micros(20);
/// Packets read per turn.
const BURST: usize = 64;

/// The IP service of one server.
#[derive(Debug)]
pub struct IpService {
    tun: Arc<Tun>,
    cfg: IpConfig,
    counters: Arc<IpCounters>,
    buf: Vec<u8>,
    next_read: Time,
}

impl IpService {
    /// Creates and configures the interface for server number `index`.
    pub fn start(
        cfg: IpConfig,
        index: usize,
        counters: Arc<IpCounters>,
    ) -> std::io::Result<IpService> {
        let tun = Tun::create(&cfg.name)?;
        tun.configure(
            cfg.mtu,
            (cfg.v4.addr(index), cfg.v4.mask()),
            cfg.v6.map(|p| (p.addr(index), p.len)),
        )?;
        Ok(IpService {
            tun: Arc::new(tun),
            cfg,
            counters,
            buf: vec![0u8; VNET_HDR + 128 * 1024],
            next_read: Time::ZERO,
        })
    }

    /// The placer that writes the packets arriving for IP into this service's interface,
    /// for every poller's engine ([`torusnet_proto::node::Node::set_placer`]).
    pub fn placer(&self) -> IpPlacer {
        IpPlacer {
            tun: self.tun.clone(),
            counters: self.counters.clone(),
        }
    }

    /// The counters with the addresses of server `index`.
    pub fn stats(cfg: &IpConfig, index: usize, c: &IpCounters) -> IpStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IpStats {
            interface: cfg.name.clone(),
            ipv4: format!("{}/{}", cfg.v4.addr(index), cfg.v4.len),
            ipv6: cfg.v6.map(|p| format!("{}/{}", p.addr(index), p.len)),
            mtu: cfg.mtu,
            sent: g(&c.sent),
            sent_bytes: g(&c.sent_bytes),
            segments: g(&c.segments),
            received: g(&c.received),
            received_bytes: g(&c.received_bytes),
            congested: g(&c.congested),
            unreachable: g(&c.unreachable),
            group: g(&c.group),
            outside: g(&c.outside),
            malformed: g(&c.malformed),
            failed: g(&c.failed),
            write_errors: g(&c.write_errors),
        }
    }

    /// Tells the sender of `n` bytes in `buf` that its destination has no live server.
    fn refuse(&mut self, n: usize, node: &dyn Engine) {
        let _ = node;
        add(&self.counters.unreachable, 1);
        let from6 = self
            .cfg
            .v6
            .map_or(std::net::Ipv6Addr::UNSPECIFIED, |p| p.router());
        if let Some(icmp) = packet::unreachable(&self.buf[..n], self.cfg.v4.router(), from6) {
            let _ = self.tun.write(&icmp);
        }
    }

    fn forward(&mut self, now: Time, n: usize, node: &mut dyn Engine) {
        let dims = node.dims();
        let count = dims.count() as usize;
        let v6 = self.cfg.v6.unwrap_or(Prefix6 {
            net: std::net::Ipv6Addr::UNSPECIFIED,
            len: 128,
        });
        match classify(&self.buf[..n], &self.cfg.v4, &v6, count) {
            Dest::Server(i) => {
                let to = dims.coord(i);
                if to == node.local() || !node.is_reachable(to) {
                    return self.refuse(n, node);
                }
                let opts = MsgOptions {
                    reliable: true,
                    fences: Fences {
                        backward: true,
                        forward: false,
                    },
                    ..MsgOptions::default()
                };
                match node.send(now, Target::Server(to), IP, &self.buf[..n], opts) {
                    Ok(()) => {
                        add(&self.counters.sent, 1);
                        add(&self.counters.sent_bytes, (n - VNET_HDR) as u64);
                        if self.buf[1] != packet::GSO_NONE {
                            add(&self.counters.segments, 1);
                        }
                    }
                    Err(SendError::WouldBlock) => add(&self.counters.congested, 1),
                    Err(_) => self.refuse(n, node),
                }
            }
            Dest::NoServer => self.refuse(n, node),
            Dest::Group => add(&self.counters.group, 1),
            Dest::Outside => add(&self.counters.outside, 1),
            Dest::Malformed => add(&self.counters.malformed, 1),
        }
    }
}

impl Service for IpService {
    fn name(&self) -> &'static str {
        "ip"
    }

    fn ids(&self) -> &[u16] {
        &[IP]
    }

    fn on_event(&mut self, _now: Time, event: &Event, _node: &mut dyn Engine) {
        match event {
            Event::Message {
                service: IP,
                data,
                reliable: true,
                ..
            } => write_received(&self.tun, &self.counters, data),
            Event::Failed {
                service: IP, tags, ..
            } => add(&self.counters.failed, tags.len() as u64),
            _ => {}
        }
    }

    fn poll(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        if now < self.next_read {
            return 0;
        }
        let mut work = 0;
        while work < BURST {
            match self.tun.read(&mut self.buf) {
                Ok(Some(n)) => {
                    self.forward(now, n, node);
                    work += 1;
                }
                Ok(None) | Err(_) => {
                    self.next_read = now + READ_PAUSE;
                    break;
                }
            }
        }
        work
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }

    fn woke(&mut self) {
        // The interface may be what woke the poller: read it at once.
        self.next_read = Time::ZERO;
    }

    fn wake_fds(&self) -> Vec<i32> {
        vec![self.tun.fd()]
    }
}

/// Writes a packet that arrived over the torus (vnet header first) into the interface, or
/// counts why not.
fn write_received(tun: &Tun, counters: &IpCounters, data: &[u8]) {
    let version = data.get(VNET_HDR).map(|b| b >> 4);
    if data.len() < VNET_HDR + 20 || !matches!(version, Some(4 | 6)) {
        add(&counters.malformed, 1);
        return;
    }
    match tun.write(data) {
        Ok(()) => {
            add(&counters.received, 1);
            add(&counters.received_bytes, (data.len() - VNET_HDR) as u64);
        }
        Err(_) => add(&counters.write_errors, 1),
    }
}

/// Takes the packets for IP straight from the frames (or the reassembled segment) they
/// arrive in, as the transport releases them in order, and writes them into the interface:
/// a 64 KiB segment was otherwise copied twice more on its way to the service (into the
/// engine's inbox, then for the service). The service itself sees none of them.
#[derive(Debug, Clone)]
pub struct IpPlacer {
    tun: Arc<Tun>,
    counters: Arc<IpCounters>,
}

impl Placer for IpPlacer {
    fn place(&mut self, _now: Time, _src: Coord, data: &[u8]) -> Option<Vec<u8>> {
        write_received(&self.tun, &self.counters, data);
        None
    }
}
