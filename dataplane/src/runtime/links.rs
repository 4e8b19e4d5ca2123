//! The first step of a start: the server's XDP program loaded, every configured link opened
//! (the program attached to it, its AF_XDP socket bound in its poller's UMEM), links dealt
//! to pollers.

use std::sync::atomic::AtomicU64;

use crate::config::{NodeConfig, Polling};
use crate::counters::LinkCounters;
use crate::loader::{AttachPreference, XdpProgram};
use crate::netns::mac_of;
use crate::port::Port;
use crate::shared::{mac_to_u64, LinkInfo};
use crate::xsk::{SocketConfig, Umem, XskSocket, CHUNK};

use super::StartError;

/// The links of a server, opened: per poller its UMEM and ports (with their global link
/// indices), and the facts about each link every thread may read.
pub(super) struct OpenLinks {
    pub(super) umems: Vec<Umem>,
    pub(super) ports: Vec<Vec<(usize, Port)>>,
    pub(super) infos: Vec<LinkInfo>,
    /// Which poller owns the link in each direction.
    pub(super) link_shard: [Option<usize>; 6],
    /// The XDP program, attached to every link (taken into the shared state).
    pub(super) xdp: Option<XdpProgram>,
}

/// The poller that serves the configuration's `link`-th link: links go to pollers round
/// robin. The UMEMs are sized by it before the links are opened, so both ask here.
fn poller_of(link: usize, pollers: usize) -> usize {
    link % pollers.max(1)
}

/// Pollers a configuration runs: one per configured core, at most one per link, at least
/// one.
pub(super) fn pollers(cfg: &NodeConfig) -> usize {
    cfg.cores.len().clamp(1, cfg.links.len().max(1))
}

/// Opens every link of `cfg` for `nshards` pollers.
pub(super) fn open(cfg: &NodeConfig, nshards: usize) -> Result<OpenLinks, StartError> {
    let chunks_per_frame = (cfg.mtu as usize + 14).div_ceil(CHUNK);
    let sock_cfg = SocketConfig {
        multi_buffer: chunks_per_frame > 1,
        need_wakeup: cfg.polling == Polling::Adaptive,
        ..SocketConfig::default()
    };
    let umems = umems(cfg, nshards, chunks_per_frame)?;
    check_queues(cfg)?;
    let mut ports: Vec<Vec<(usize, Port)>> = (0..nshards).map(|_| Vec::new()).collect();
    let mut infos = Vec::new();
    let mut link_shard = [None; 6];
    let mut xdp =
        XdpProgram::load(cfg.mtu, cfg.dims.count()).map_err(|e| StartError::Link(e.to_string()))?;
    for (idx, l) in cfg.links.iter().enumerate() {
        let shard = poller_of(idx, nshards);
        link_shard[usize::from(l.dir.index())] = Some(shard);
        let local_mac = mac_of(&l.ifname).map_err(|e| StartError::Link(e.to_string()))?;
        let mode = xdp
            .attach(&l.ifname, l.dir, AttachPreference::Auto)
            .map_err(|e| StartError::Link(e.to_string()))?;
        let share = ports[shard].first().map(|p| &p.1.xsk);
        let xsk = XskSocket::new(&umems[shard], share, &l.ifname, 0, &sock_cfg)
            .map_err(|e| StartError::Link(format!("{}: {e}", l.ifname)))?;
        xdp.register_socket(l.dir, xsk.raw_fd())
            .map_err(|e| StartError::Link(e.to_string()))?;
        let info = xsk.info();
        infos.push(LinkInfo {
            dir: l.dir,
            ifname: l.ifname.clone(),
            local_mac,
            neighbor_mac: AtomicU64::new(mac_to_u64(l.neighbor_mac)),
            xdp_mode: mode.name(),
            xdp_section: xdp.variant().section(),
            zero_copy: info.zero_copy,
            multi_buffer: info.multi_buffer,
            // The first socket of a poller registers the UMEM the others share.
            shared_umem: true,
            tx_budget: info.tx_budget,
            poller: shard,
            counters: LinkCounters::default(),
            redirect_errors: crate::nic_stats::RedirectErrors::new(&l.ifname).ok(),
        });
        let port = Port::new(l.dir, local_mac, l.neighbor_mac, xsk);
        ports[shard].push((idx, port));
    }
    Ok(OpenLinks {
        umems,
        ports,
        infos,
        link_shard,
        xdp: Some(xdp),
    })
}

/// One UMEM per poller: its share of the configured chunks, and the transmit slots jumbo
/// frames are sent from on top.
fn umems(
    cfg: &NodeConfig,
    nshards: usize,
    chunks_per_frame: usize,
) -> Result<Vec<Umem>, StartError> {
    let mut umems = Vec::new();
    for shard in 0..nshards {
        let links = (0..cfg.links.len())
            .filter(|l| poller_of(*l, nshards) == shard)
            .count();
        let slots = crate::transmit::tx_slots(links, chunks_per_frame as u32);
        umems.push(
            Umem::new(cfg.umem_chunks / nshards as u32 + slots * chunks_per_frame as u32)
                .map_err(|e| StartError::Link(format!("UMEM: {e}")))?,
        );
    }
    Ok(umems)
}

/// One socket per link reads RX queue 0: refuses links where torus frames could land on
/// other queues that nobody reads.
fn check_queues(cfg: &NodeConfig) -> Result<(), StartError> {
    for l in &cfg.links {
        let q = crate::netns::rx_queues(&l.ifname).map_err(|e| StartError::Link(e.to_string()))?;
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
    Ok(())
}
