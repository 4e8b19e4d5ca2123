//! The dataplane of one server as a library: start it from a configuration, register
//! services, send and receive messages, read its status, stop it. Applications talk to the
//! pollers over lock-free queues ([`crate::shared`]); each poller thread owns its rings,
//! its UMEM and its protocol engine, so nothing on the fast path takes a lock.
//!
//! A start is a list of steps ([`Dataplane::start`]): the links opened ([`links`]), then
//! the shared state, remote memory, IP, the pollers, the carrier watch, the application
//! socket and the gateway ([`start`]).

mod links;
mod service;
mod start;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

pub use service::{ServiceAt, ServiceHandle};

use crate::config::NodeConfig;
use crate::netns::format_mac;
use crate::shared::{Command, LinkInfo, ServiceInbox, Shared};
use crate::status::{EngineSnapshot, KvStatus, LinkStatus, Status};

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
        let nshards = links::pollers(cfg);
        let mut open = links::open(cfg, nshards)?;
        let infos = std::mem::take(&mut open.infos);
        let xdp = open
            .xdp
            .take()
            .ok_or_else(|| StartError::Link("the XDP program was not loaded".into()))?;
        let shared = start::shared(cfg, coord, infos, open.link_shard, nshards, xdp)?;
        let rm = start::rmem(&shared);
        let ip = start::ip(&shared)?;
        let mut dp = Dataplane {
            pollers: start::pollers(cfg, &shared, open, &rm, ip)?,
            shared,
            gateway: None,
            apps: None,
        };
        // From here a failure drops `dp`, which stops the pollers it started.
        start::watch_carriers(cfg, &dp.shared);
        dp.apps = start::apps(cfg, &dp.shared)?;
        dp.gateway = start::gateway(cfg, &dp.shared)?;
        Ok(dp)
    }

    /// Registers service `id` (or returns the existing registration) with an inbox of
    /// 65536 events. Ids 1..=63 belong to torusd's own services (their events never reach
    /// an inbox) and 1024 and up to attached applications: embedded services take 64..=1023.
    ///
    /// # Panics
    /// When no eventfd can be made (the process is out of file descriptors).
    pub fn service(&self, id: u16) -> ServiceHandle {
        let mut s = self.shared.services.lock();
        let inbox = s
            .entry(id)
            .or_insert_with(|| Arc::new(ServiceInbox::new().expect("an eventfd for the inbox")))
            .clone();
        self.shared.services_version.fetch_add(1, Ordering::Release);
        self.shared.hosted.host(id);
        ServiceHandle {
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
        let mut engine = EngineSnapshot::merge(
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
            .map(|(i, l)| link_status(i, l, &engine))
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
            xdp_transit: s.xdp.as_ref().is_some_and(|x| x.lock().is_on()),
            congestion: s.congestion.load(Ordering::Relaxed),
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

impl Drop for Dataplane {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The status of link `i`, with its poller's counters of it.
fn link_status(i: usize, l: &LinkInfo, engine: &EngineSnapshot) -> LinkStatus {
    LinkStatus {
        dir: l.dir.name().to_string(),
        ifname: l.ifname.clone(),
        mac: format_mac(l.local_mac),
        neighbor_mac: l.neighbor().map(format_mac),
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
        redirect_errors: l.redirect_errors.as_ref().map_or(0, |r| r.read()),
        poller: l.poller,
    }
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
