//! The steps of a start after the links are open: the state the threads share, remote
//! memory, IP's interface, one engine and its services per poller, the carrier watch, the
//! application socket and the memcached gateway.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use torusnet_proto::node::Node;
use torusnet_proto::service::Service;
use torusnet_proto::topology::{Coord, Dir};
use torusnet_proto::transport;

use crate::config::NodeConfig;
use crate::loader::XdpProgram;
use crate::poller::Poller;
use crate::port::Port;
use crate::rmem::Rmem;
use crate::shared::{Command, LinkInfo, ShardShared, Shared};
use crate::xdp_transit::XdpTransit;
use crate::xsk::Umem;

use super::links::OpenLinks;
use super::{KvSubmit, StartError};

/// The state every thread of this start shares, around its open links.
pub(super) fn shared(
    cfg: &NodeConfig,
    coord: Coord,
    infos: Vec<LinkInfo>,
    link_shard: [Option<usize>; 6],
    pollers: usize,
    xdp: XdpProgram,
) -> Result<Arc<Shared>, StartError> {
    let shards = (0..pollers)
        .map(|_| ShardShared::new())
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(StartError::Thread)?;
    let macs: Vec<(Dir, [u8; 6])> = infos.iter().map(|l| (l.dir, l.local_mac)).collect();
    let mut transit = XdpTransit::new(xdp, cfg.dims, coord, cfg.xdp_transit, &macs);
    let neighbors: Vec<(Dir, Option<[u8; 6]>)> =
        cfg.links.iter().map(|l| (l.dir, l.neighbor_mac)).collect();
    transit.set_neighbor_macs(&neighbors);
    transit
        .adopt_view(&cfg.view, &[None; 6])
        .map_err(|e| StartError::Link(e.to_string()))?;
    Ok(Arc::new(Shared {
        name: cfg.name.clone(),
        dims: cfg.dims,
        coord,
        mtu: cfg.mtu,
        polling: cfg.polling,
        incarnation: draw_incarnation(),
        max_message: cfg.transport.max_message,
        links: infos,
        services: Mutex::new(HashMap::new()),
        services_version: AtomicU64::new(0),
        hosted: Arc::default(),
        shutdown: AtomicBool::new(false),
        apps: crate::shared::AppsRegistry::default(),
        shards,
        link_shard,
        started: Instant::now(),
        kv: cfg
            .kv
            .as_ref()
            .map(|_| Arc::new(torusnet_services::kv::KvCounters::default())),
        kv_gateway: Mutex::new(None),
        commands_dropped: AtomicU64::new(0),
        congestion: std::sync::atomic::AtomicBool::new(cfg.transport.congestion.on),
        xdp: Some(Mutex::new(transit)),
        rmem: std::sync::OnceLock::new(),
        ip: cfg
            .ip
            .clone()
            .map(|c| (c, Arc::new(crate::ip::IpCounters::default()))),
    }))
}

/// Remote memory of this server, served by the first poller (which it wakes when an
/// embedded program asks something of it).
pub(super) fn rmem(shared: &Arc<Shared>) -> Arc<Rmem> {
    let weak = Arc::downgrade(shared);
    let c = shared.coord;
    let rm = Arc::new(Rmem::new(
        torusnet_client::channel::pack_coord(c.x, c.y, c.z),
        shared.mtu as usize - torusnet_proto::wire::TORUS_LEN,
        Box::new(move || {
            if let Some(s) = weak.upgrade() {
                if let Some(sh) = s.shards.first() {
                    sh.wake();
                }
            }
        }),
    ));
    let _ = shared.rmem.set(rm.clone());
    rm
}

/// IP's interface, when IP is configured: made before the engines, each of which writes
/// what arrives for IP into it.
pub(super) fn ip(shared: &Shared) -> Result<Option<crate::ip::IpService>, StartError> {
    let Some((ip, counters)) = &shared.ip else {
        return Ok(None);
    };
    let index = shared.dims.index(shared.coord);
    crate::ip::IpService::start(ip.clone(), index, counters.clone())
        .map(Some)
        .map_err(|e| StartError::Link(format!("IP interface {}: {e}", ip.name)))
}

/// One engine, poller and thread per poller, over the links it owns. The services live
/// with the first poller, one instance per server; the others hand it their events, and it
/// hands them sends for the peers they own.
pub(super) fn pollers(
    cfg: &NodeConfig,
    shared: &Arc<Shared>,
    links: OpenLinks,
    rm: &Arc<Rmem>,
    mut ip_service: Option<crate::ip::IpService>,
) -> Result<Vec<JoinHandle<Result<(), String>>>, StartError> {
    let ip_placer = ip_service.as_ref().map(crate::ip::IpService::placer);
    let mut handles = Vec::new();
    for (shard, (umem, ports)) in links.umems.into_iter().zip(links.ports).enumerate() {
        let node = engine(cfg, shared, rm, ip_placer.as_ref())?;
        let services = if shard == 0 {
            services(cfg, shared, rm, ip_service.take())?
        } else {
            Vec::new()
        };
        let poller = poller(cfg, shared, shard, node, umem, ports).with_services(services);
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
        handles.push(handle);
    }
    Ok(handles)
}

fn poller(
    cfg: &NodeConfig,
    shared: &Arc<Shared>,
    shard: usize,
    node: Node,
    umem: Umem,
    ports: Vec<(usize, Port)>,
) -> Poller {
    Poller::new(shard, node, umem, ports, shared.clone(), cfg.mtu as usize)
        .with_link_capacity(cfg.routing.link_capacity_bps)
        .with_transit_chunks(cfg.transit_chunks)
}

/// A poller's protocol engine: routing as configured, the placers that write arriving data
/// straight where it belongs (remote memory, IP), the room each built-in service may take.
fn engine(
    cfg: &NodeConfig,
    shared: &Arc<Shared>,
    rm: &Arc<Rmem>,
    ip_placer: Option<&crate::ip::IpPlacer>,
) -> Result<Node, StartError> {
    let transport = transport::Config {
        incarnation: shared.incarnation,
        ..cfg.transport
    };
    let mut node = Node::new(shared.coord, cfg.view.clone(), transport)
        .map_err(|e| StartError::Engine(e.to_string()))?;
    if let Some(on) = cfg.routing.source {
        node.enable_source_routing(cfg.routing.bsr);
        node.set_source_routing(on);
        node.set_source_services(cfg.routing.services.clone());
    }
    if let Some(placer) = ip_placer {
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
    for (service, weight) in cfg.weights.builtin() {
        node.set_service_weight(service, weight);
    }
    Ok(node)
}

/// The services the first poller hosts: the built-in ones, remote memory, multicast and
/// aggregation, and, as configured, applications' channels, the key-value store and IP.
fn services(
    cfg: &NodeConfig,
    shared: &Arc<Shared>,
    rm: &Arc<Rmem>,
    ip_service: Option<crate::ip::IpService>,
) -> Result<Vec<Box<dyn Service>>, StartError> {
    let mut services = torusnet_services::builtin::all(
        journal("load", &cfg.load_journal)?,
        journal("keys", &cfg.keys_journal)?,
    );
    services.push(Box::new(crate::rmem::RmemService::new(rm.clone())));
    // Members deliver multicasts to the applications attached here (when they may attach).
    let sinks: Option<Box<dyn torusnet_services::multicast::Sinks>> = cfg
        .apps
        .is_some()
        .then(|| Box::new(crate::apps::multicast::AppSinks::new(shared.clone())) as _);
    services.push(Box::new(torusnet_services::multicast::Multicast::new(
        torusnet_services::multicast::DEFAULT_WINDOW,
        sinks,
    )));
    services.push(Box::new(torusnet_services::aggregate::Aggregate::default()));
    if cfg.apps.is_some() {
        services.push(Box::new(crate::apps::host::AppsHost::new(shared.clone())));
    }
    if let (Some(k), Some(counters)) = (&cfg.kv, &shared.kv) {
        services.push(Box::new(kv_service(k, counters.clone())?));
    }
    if let Some(svc) = ip_service {
        services.push(Box::new(svc));
    }
    Ok(services)
}

/// A journal file a built-in service appends to, when configured.
fn journal(
    what: &str,
    path: &Option<std::path::PathBuf>,
) -> Result<Option<torusnet_services::builtin::Journal>, StartError> {
    path.as_ref()
        .map(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map(|f| Box::new(f) as torusnet_services::builtin::Journal)
                .map_err(|e| StartError::Engine(format!("{what}.journal {}: {e}", p.display())))
        })
        .transpose()
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

/// Tells every poller when the kernel says a link lost or regained its carrier. Without
/// netlink, source routing learns of dead links from the view alone.
pub(super) fn watch_carriers(cfg: &NodeConfig, shared: &Arc<Shared>) {
    let links: Vec<(String, Dir)> = cfg
        .links
        .iter()
        .map(|l| (l.ifname.clone(), l.dir))
        .collect();
    let weak = Arc::downgrade(shared);
    let done = Arc::downgrade(shared);
    let carrier = crate::carrier::start(
        &links,
        Arc::new(move || {
            done.upgrade()
                .is_none_or(|s| s.shutdown.load(Ordering::Acquire))
        }),
        Box::new(move |dir, up| {
            if let Some(s) = weak.upgrade() {
                s.with_xdp(|x| x.set_carrier(dir, up));
                for sh in &s.shards {
                    tell_carrier(sh, dir, up);
                }
            }
        }),
    );
    if let Err(e) = carrier {
        tracing::warn!("cannot watch link carriers (netlink): {e}");
    }
}

/// Queues a carrier change for one poller. Full queues are drained within a turn: it waits
/// a little for room, and counts nothing when it gives up after 100 ms, because the view
/// the control process floods next says the same.
fn tell_carrier(sh: &ShardShared, dir: Dir, up: bool) {
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

/// The application socket, when applications are configured.
pub(super) fn apps(
    cfg: &NodeConfig,
    shared: &Arc<Shared>,
) -> Result<Option<JoinHandle<()>>, StartError> {
    let Some(a) = &cfg.apps else {
        return Ok(None);
    };
    crate::apps::listener::start(a.clone(), shared.clone())
        .map(Some)
        .map_err(|e| StartError::Link(format!("application socket {}: {e}", a.socket.display())))
}

/// The memcached gateway, when the key-value store has one.
pub(super) fn gateway(
    cfg: &NodeConfig,
    shared: &Arc<Shared>,
) -> Result<Option<crate::kvgw::Gateway>, StartError> {
    let (Some(k), Some(counters)) = (&cfg.kv, &shared.kv) else {
        return Ok(None);
    };
    let Some(g) = &k.gateway else {
        return Ok(None);
    };
    let submit = Arc::new(KvSubmit::new(shared.clone()));
    let gw = crate::kvgw::start(g.clone(), submit, counters.clone())
        .map_err(|e| StartError::Link(format!("memcached gateway {}: {e}", g.listen)))?;
    *shared.kv_gateway.lock() = Some((gw.addr, gw.counters.clone()));
    Ok(Some(gw))
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
