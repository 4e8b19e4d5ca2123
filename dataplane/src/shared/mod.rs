//! What the threads of one torusd share: the state every poller, the management socket, the
//! application listener and embedded programs reach (`Shared`), the commands and frames they
//! pass to a poller, the pollers' own queues, the inboxes of embedded services and the
//! registry of attached applications. Other modules depend on this one; it depends on none
//! of the threads that use it.

mod apps;
mod command;
mod inbox;
mod mcast_inbox;
mod shard;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use torusnet_proto::node::Target;
use torusnet_proto::topology::{Coord, Dims, Dir};

pub use apps::{AppCounters, AppInfo, AppsRegistry, NewApp};
pub use command::{Command, Handoff, HandoffCounts};
pub use inbox::ServiceInbox;
pub use mcast_inbox::{Delivery, Flushed, McastInbox};
pub use shard::ShardShared;

use crate::config::Polling;
use crate::counters::LinkCounters;

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
    /// The driver's counters of frames redirected to the link that it could not take.
    pub redirect_errors: Option<crate::nic_stats::RedirectErrors>,
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
    pub(crate) services: Mutex<HashMap<u16, Arc<ServiceInbox>>>,
    pub(crate) services_version: AtomicU64,
    /// Every service id something here takes (built-in and embedded services, attached
    /// applications): the transports refuse reliable messages for the others and tell
    /// their senders.
    pub(crate) hosted: Arc<torusnet_proto::transport::HostedServices>,
    pub(crate) shutdown: AtomicBool,
    /// Applications attached from their own processes.
    pub apps: AppsRegistry,
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
    /// Whether the congestion controller is on in every poller (`[transport] congestion`,
    /// switched at run time by the management socket).
    pub congestion: AtomicBool,
    /// The XDP program of every link, and the transit maps it forwards from (none in a
    /// detached state).
    pub xdp: Option<Mutex<crate::xdp_transit::XdpTransit>>,
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
            Command::SetView(..)
            | Command::NotifyAcks(..)
            | Command::SetWeight(..)
            | Command::SetCongestion(..)
            | Command::Intercept(..) => {
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
            apps: AppsRegistry::default(),
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
            congestion: AtomicBool::new(false),
            xdp: None,
        })
    }

    /// Runs `f` on the XDP program's transit state (nothing in a detached state); a map
    /// the kernel refused to write is logged, and the poller path stands in meanwhile.
    pub(crate) fn with_xdp<T>(
        &self,
        f: impl FnOnce(&mut crate::xdp_transit::XdpTransit) -> Result<T, crate::loader::LoadError>,
    ) -> Option<T> {
        let mut t = self.xdp.as_ref()?.lock();
        match f(&mut t) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!("XDP program: {e}");
                None
            }
        }
    }

    /// Queues a command nobody waits on for poller `shard`; counted when its queue is full.
    pub(crate) fn push_or_count(&self, shard: usize, c: Command) {
        if self.push_to(shard, c).is_err() {
            self.count_dropped_command();
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

    /// Counts a command dropped because its poller's queue was full and nobody waited.
    pub(crate) fn count_dropped_command(&self) {
        self.commands_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Wakes every poller.
    pub(crate) fn wake_all(&self) {
        for s in &self.shards {
            s.sleeping.store(true, Ordering::Release);
            s.wake();
        }
    }
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

impl LinkInfo {
    /// The neighbour's MAC, once configured or learned.
    pub fn neighbor(&self) -> Option<[u8; 6]> {
        mac_from_u64(self.neighbor_mac.load(Ordering::Relaxed))
    }

    /// Records the neighbour's MAC the control process learned.
    pub(crate) fn set_neighbor_mac(&self, m: [u8; 6]) {
        self.neighbor_mac
            .store(mac_to_u64(Some(m)), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use crossbeam_queue::ArrayQueue;

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
