//! `torusd`'s configuration file (TOML): the torus, this server's place in it, its links,
//! cores, MTU, polling mode and where the link-state view comes from.
//!
//! ```toml
//! dims = "3x3x3"
//! coord = "0,0,0"          # until the control process assigns it
//! mtu = 1500
//! cores = [0]
//! polling = "adaptive"     # or "busy"
//! socket = "/run/torusnet/n000.sock"
//!
//! [[link]]
//! ifname = "tn-000-px"
//! dir = "+x"
//! neighbor_mac = "02:00:00:00:01:00"
//!
//! [dataplane]
//! xdp_transit = true       # frames passing through forwarded by the XDP program
//!
//! [weights]                # services' shares of links, by name (`crate::weights`)
//! kv = 2
//!
//! [view]                   # static view (the control process replaces it)
//! down_links = ["1,0,0:+y"]
//! down_servers = []
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;
use torusnet_proto::routing::bsr::BsrConfig;
use torusnet_proto::routing::LinkView;
use torusnet_proto::topology::{Coord, Dims, Dir, DirSet};
use torusnet_proto::transport::Config as TransportConfig;

use crate::netns::parse_mac;
use crate::weights::Weights;

/// Why a configuration was refused: one line naming the field and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {err}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        err: std::io::Error,
    },
    /// Not valid TOML, or a field of the wrong type.
    #[error("{path}: {err}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        err: String,
    },
    /// A value out of range or inconsistent with another.
    #[error("{0}")]
    Invalid(String),
}

/// How pollers wait for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Polling {
    /// Spin on the rings: lowest latency, one core each.
    Busy,
    /// Spin while there is traffic, sleep in poll() when idle (many servers per core).
    Adaptive,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLink {
    ifname: String,
    dir: String,
    neighbor_mac: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawView {
    #[serde(default)]
    down_links: Vec<String>,
    #[serde(default)]
    down_servers: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTransport {
    window: Option<u32>,
    aggregate: Option<bool>,
    agg_delay_us: Option<u64>,
    queue_bytes: Option<usize>,
    broken_after_ms: Option<u64>,
    /// Windows follow the fabric's telemetry (docs/transport.md, "Congestion control").
    congestion: Option<bool>,
}

/// `[dataplane]`: how frames move through this server.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDataplane {
    /// Frames passing through are forwarded by the XDP program itself (default on).
    xdp_transit: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    name: Option<String>,
    dims: String,
    coord: Option<String>,
    #[serde(default = "default_mtu")]
    mtu: u32,
    #[serde(default)]
    cores: Vec<usize>,
    #[serde(default = "default_polling")]
    polling: Polling,
    socket: Option<PathBuf>,
    #[serde(default)]
    link: Vec<RawLink>,
    #[serde(default)]
    view: RawView,
    #[serde(default)]
    transport: RawTransport,
    #[serde(default = "default_umem_chunks")]
    umem_chunks: u32,
    /// UMEM chunks frames passing through may hold while they wait for a link (default an
    /// eighth of the UMEM; 0: drop them when no link has room, as before the queue).
    transit_chunks: Option<u32>,
    /// The control process's section of a shared node file (only its socket is read here).
    #[serde(default)]
    control: Option<toml::Value>,
    /// The NICs steer the torus EtherType to RX queue 0 (ethtool ntuple), so torusd may
    /// start on links with several RX queues.
    #[serde(default)]
    rx_queue_steering: bool,
    /// Where torusd serves Prometheus metrics (off when absent).
    metrics: Option<String>,
    #[serde(default)]
    load: RawLoad,
    #[serde(default)]
    keys: RawLoad,
    #[serde(default)]
    apps: RawApps,
    #[serde(default)]
    kv: RawKv,
    #[serde(default)]
    ip: RawIp,
    #[serde(default)]
    routing: RawRouting,
    #[serde(default)]
    dataplane: RawDataplane,
    /// Services' fair-queuing weights by name (`crate::weights`).
    #[serde(default)]
    weights: std::collections::BTreeMap<String, i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRouting {
    /// "off" (default), "next-hop" or "source".
    mode: Option<String>,
    probe_interval_ms: Option<u64>,
    probe_timeout_ms: Option<u64>,
    link_gbps: Option<f64>,
    /// Source-route only what these services send (default: everything).
    services: Option<Vec<u16>>,
}

/// How this server routes its own reliable traffic, and the figures link loads are
/// measured against (`[routing]`).
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingSettings {
    /// `None`: source routing off (frames use the whole MTU); `Some(on)`: available, frames
    /// keep room for a route, and `on` says whether this server's own reliable traffic
    /// takes source routes from the start (`torusctl routing` switches it).
    pub source: Option<bool>,
    /// Path selection's settings.
    pub bsr: BsrConfig,
    /// Every link's capacity, bits per second (veth reports none).
    pub link_capacity_bps: u64,
    /// The services whose traffic is source-routed (`None`: everything this server sends).
    pub services: Option<Vec<u16>>,
}

fn routing_settings(raw: RawRouting) -> Result<RoutingSettings, ConfigError> {
    let bad = |s: String| ConfigError::Invalid(s);
    let source = match raw.mode.as_deref().unwrap_or("off") {
        "off" => None,
        "next-hop" => Some(false),
        "source" => Some(true),
        other => {
            return Err(bad(format!(
                "routing.mode: {other:?} is not \"off\", \"next-hop\" or \"source\""
            )))
        }
    };
    let mut bsr = BsrConfig::default();
    if let Some(ms) = raw.probe_interval_ms {
        if !(10..=60_000).contains(&ms) {
            return Err(bad(format!(
                "routing.probe_interval_ms: {ms} is outside 10..=60000"
            )));
        }
        bsr.probe_interval = std::time::Duration::from_millis(ms);
    }
    if let Some(ms) = raw.probe_timeout_ms {
        if ms == 0 || ms >= bsr.probe_interval.as_millis() as u64 {
            return Err(bad(format!(
                "routing.probe_timeout_ms: {ms} must be above 0 and below the probe interval"
            )));
        }
        bsr.probe_timeout = std::time::Duration::from_millis(ms);
    }
    let gbps = raw.link_gbps.unwrap_or(10.0);
    if !(0.001..=1000.0).contains(&gbps) {
        return Err(bad(format!(
            "routing.link_gbps: {gbps} is outside 0.001..=1000"
        )));
    }
    if raw.services.as_ref().is_some_and(Vec::is_empty) {
        return Err(bad(
            "routing.services: empty (leave it out to source-route every service)".into(),
        ));
    }
    Ok(RoutingSettings {
        source,
        bsr,
        link_capacity_bps: (gbps * 1e9) as u64,
        services: raw.services,
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIp {
    /// Bring up the TUN interface (default: yes).
    enabled: Option<bool>,
    /// Its name (default torus0).
    name: Option<String>,
    /// The torus's IPv4 prefix (default 10.77.0.0/16).
    ipv4: Option<String>,
    /// The torus's IPv6 prefix (default fd77::/64; "off": none).
    ipv6: Option<String>,
    /// The interface's MTU (default 65000).
    mtu: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKv {
    /// Run the key-value store at all (default: yes).
    enabled: Option<bool>,
    /// The memcached gateway's address (default 127.0.0.1:11211; "off": none).
    listen: Option<String>,
    /// Copies of each value.
    replicas: Option<usize>,
    /// Seconds after a failure before missing copies are re-created.
    rereplicate_after_s: Option<f64>,
    /// Reads through cache servers.
    cache: Option<bool>,
    /// Cache servers per key.
    cache_keys: Option<usize>,
    /// Memory for stored items, MiB.
    store_mb: Option<usize>,
    /// Memory for cached copies, MiB.
    cache_mb: Option<usize>,
    /// An operation's deadline, ms.
    op_timeout_ms: Option<u64>,
    /// Most gateway connections.
    max_connections: Option<usize>,
    /// Largest value, KiB.
    max_item_kb: Option<usize>,
    /// Disk mode: the store's log.
    log: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApps {
    /// Serve applications at all (default: yes).
    enabled: Option<bool>,
    /// The application socket.
    socket: Option<PathBuf>,
    /// A group whose members may attach.
    group: Option<String>,
    /// Most applications at once.
    max: Option<usize>,
    /// The most weight an application may ask for (`crate::weights`).
    max_weight: Option<u32>,
    /// The largest pool an application may ask for at attach, in MiB.
    max_pool_mib: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLoad {
    /// The built-in service's journal (appended to from the start).
    journal: Option<PathBuf>,
}

fn default_mtu() -> u32 {
    1500
}
fn default_polling() -> Polling {
    Polling::Busy
}
fn default_umem_chunks() -> u32 {
    8192
}

/// One link of this server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkConfig {
    /// The interface.
    pub ifname: String,
    /// Its direction in the torus.
    pub dir: Dir,
    /// The neighbour's MAC, when known (frames from any other source are dropped).
    pub neighbor_mac: Option<[u8; 6]>,
}

/// Where applications attach, and who may.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppsConfig {
    /// The application socket.
    pub socket: PathBuf,
    /// Members of this group may attach (root and torusd's own user always may).
    pub group: Option<String>,
    /// At most this many applications at once.
    pub max_apps: usize,
    /// Services' weights: what applications start with and may ask for.
    pub weights: Weights,
    /// The largest pool (bytes) an application may ask for at attach: the memory its
    /// return buffers and remote-memory regions live in, shared with torusd (a memfd,
    /// whose pages exist only once touched).
    pub max_pool: u64,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// A label for logs and status.
    pub name: String,
    /// The torus.
    pub dims: Dims,
    /// This server, when configured; otherwise the control process assigns it.
    pub coord: Option<Coord>,
    /// Link MTU (bytes after the Ethernet header).
    pub mtu: u32,
    /// Cores to pin pollers to (empty: not pinned).
    pub cores: Vec<usize>,
    /// How pollers wait.
    pub polling: Polling,
    /// The management socket.
    pub socket: PathBuf,
    /// This server's links.
    pub links: Vec<LinkConfig>,
    /// The initial view.
    pub view: LinkView,
    /// Transport settings.
    pub transport: TransportConfig,
    /// UMEM chunks (4 KiB each) shared by all links.
    pub umem_chunks: u32,
    /// Torus frames are steered to RX queue 0 on every link (multi-queue NICs).
    pub rx_queue_steering: bool,
    /// Where torusd serves Prometheus metrics (`None`: it does not).
    pub metrics: Option<std::net::SocketAddr>,
    /// The control process's status socket, which torusd asks for the current view when
    /// it starts (none: no control process publishes to this torusd).
    pub control_socket: Option<PathBuf>,
    /// Where the built-in load service journals from the start (`[load] journal`), so a
    /// restart oracle sees every message received, even before anyone starts the load.
    pub load_journal: Option<PathBuf>,
    /// Where the built-in key probe service journals from the start (`[keys] journal`):
    /// every probe sent and delivered, for a churn oracle.
    pub keys_journal: Option<PathBuf>,
    /// Applications in their own processes (`[apps]`): where they attach, who may.
    pub apps: Option<AppsConfig>,
    /// Services' fair-queuing weights.
    pub weights: Weights,
    /// The key-value store and its memcached gateway (`[kv]`).
    pub kv: Option<crate::kvgw::KvSettings>,
    /// IP over the torus (`[ip]`).
    pub ip: Option<crate::ip::IpConfig>,
    /// Source routing and link loads (`[routing]`).
    pub routing: RoutingSettings,
    /// UMEM chunks the transit queue may hold per poller (`None`: an eighth of its UMEM).
    pub transit_chunks: Option<u32>,
    /// Frames passing through are forwarded by the XDP program itself, not by a poller
    /// (`[dataplane] xdp_transit`, default on).
    pub xdp_transit: bool,
}

impl NodeConfig {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<NodeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
            path: path.to_path_buf(),
            err,
        })?;
        NodeConfig::parse(&text).map_err(|e| match e {
            ConfigError::Parse { err, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                err,
            },
            other => other,
        })
    }

    /// Parses and validates configuration text.
    pub fn parse(text: &str) -> Result<NodeConfig, ConfigError> {
        let raw: Raw = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<config>"),
            err: e.to_string().replace('\n', " "),
        })?;
        let bad = |s: String| ConfigError::Invalid(s);
        let dims: Dims = raw.dims.parse().map_err(|e| bad(format!("dims: {e}")))?;
        let coord: Option<Coord> = match &raw.coord {
            Some(s) => {
                let c: Coord = s.parse().map_err(|e| bad(format!("coord: {e}")))?;
                Some(dims.check(c).map_err(|e| bad(format!("coord: {e}")))?)
            }
            None => None,
        };
        if !(576..=9000).contains(&raw.mtu) {
            return Err(bad(format!("mtu: {} is outside 576..=9000", raw.mtu)));
        }
        let (links, seen) = link_settings(&raw.link, dims)?;
        let view = view_settings(&raw.view, dims, coord, seen)?;
        let ncpu = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        for c in &raw.cores {
            if *c >= ncpu {
                return Err(bad(format!(
                    "cores: core {c} does not exist (this machine has {ncpu})"
                )));
            }
        }
        let transport = transport_settings(&raw.transport, raw.mtu)?;
        if raw.umem_chunks < 256 {
            return Err(bad(format!(
                "umem_chunks: {} is below 256",
                raw.umem_chunks
            )));
        }
        let name = match (raw.name, coord) {
            (Some(n), _) => n,
            (None, Some(c)) => c.to_string().replace(',', "-"),
            (None, None) => {
                return Err(bad(
                    "name: a server without a configured coord needs a name".into(),
                ))
            }
        };
        let socket = raw
            .socket
            .unwrap_or_else(|| PathBuf::from(format!("/run/torusnet/{name}.sock")));
        let weights =
            Weights::new(raw.weights, raw.apps.max_weight).map_err(ConfigError::Invalid)?;
        let apps = apps_settings(raw.apps, &socket, &name, &weights)?;
        // The same defaults as the control process's (`torusctl daemon`).
        let control = raw.control.as_ref();
        let publishes = control
            .and_then(|c| c.get("publish"))
            .and_then(|v| v.as_bool())
            .unwrap_or(true);
        let control_socket = publishes.then(|| {
            control
                .and_then(|c| c.get("socket"))
                .and_then(|v| v.as_str())
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(format!("/run/torusnet/{name}-control.sock")))
        });
        let metrics = match raw.metrics.as_deref() {
            None => None,
            Some(a) => Some(a.parse::<std::net::SocketAddr>().map_err(|_| {
                ConfigError::Invalid(format!(
                    "metrics: '{a}' is not ADDRESS:PORT (e.g. 127.0.0.1:9464)"
                ))
            })?),
        };
        Ok(NodeConfig {
            metrics,
            name,
            dims,
            coord,
            mtu: raw.mtu,
            cores: raw.cores,
            polling: raw.polling,
            socket,
            links,
            view,
            transport,
            umem_chunks: raw.umem_chunks,
            rx_queue_steering: raw.rx_queue_steering,
            control_socket,
            load_journal: raw.load.journal,
            keys_journal: raw.keys.journal,
            apps,
            weights,
            kv: kv_settings(raw.kv)?,
            ip: ip_settings(raw.ip, dims)?,
            routing: routing_settings(raw.routing)?,
            xdp_transit: raw.dataplane.xdp_transit.unwrap_or(true),
            transit_chunks: match raw.transit_chunks {
                Some(c) if c > raw.umem_chunks / 2 => {
                    return Err(bad(format!(
                        "transit_chunks: {c} is more than half of umem_chunks ({})",
                        raw.umem_chunks
                    )))
                }
                c => c,
            },
        })
    }
}

/// The `[[link]]` tables: each direction once, existing in the torus, with its
/// neighbour's MAC when given; and the set of directions configured.
fn link_settings(raw: &[RawLink], dims: Dims) -> Result<(Vec<LinkConfig>, DirSet), ConfigError> {
    let bad = |s: String| ConfigError::Invalid(s);
    let mut links = Vec::new();
    let mut seen = DirSet::EMPTY;
    for l in raw {
        let dir: Dir = l
            .dir
            .parse()
            .map_err(|e| bad(format!("link {}: {e}", l.ifname)))?;
        if !dims.has_links(dir) {
            return Err(bad(format!(
                "link {}: direction {dir} does not exist in a {dims} torus",
                l.ifname
            )));
        }
        if seen.contains(dir) {
            return Err(bad(format!(
                "link {}: direction {dir} configured twice",
                l.ifname
            )));
        }
        seen = seen.with(dir);
        let neighbor_mac = match &l.neighbor_mac {
            Some(m) => Some(parse_mac(m).ok_or_else(|| {
                bad(format!(
                    "link {}: neighbor_mac {m:?} is not aa:bb:cc:dd:ee:ff",
                    l.ifname
                ))
            })?),
            None => None,
        };
        links.push(LinkConfig {
            ifname: l.ifname.clone(),
            dir,
            neighbor_mac,
        });
    }
    if links.is_empty() {
        return Err(bad(
            "no [[link]] configured: a server needs at least one link".into(),
        ));
    }
    Ok((links, seen))
}

/// The starting view: every link up but this server's unconfigured directions (nothing is
/// plugged in there) and the links and servers `[view]` names down.
fn view_settings(
    raw: &RawView,
    dims: Dims,
    coord: Option<Coord>,
    seen: DirSet,
) -> Result<LinkView, ConfigError> {
    let bad = |s: String| ConfigError::Invalid(s);
    let mut view = LinkView::all_up(dims).map_err(|e| bad(format!("dims: {e}")))?;
    // Our own unconfigured directions are down: nothing is plugged in there.
    if let Some(coord) = coord {
        for d in dims.link_dirs().iter() {
            if !seen.contains(d) {
                view.set_link(coord, d, false)
                    .map_err(|e| bad(e.to_string()))?;
            }
        }
    }
    for s in &raw.down_links {
        let (c, d) = s
            .split_once(':')
            .ok_or_else(|| bad(format!("view.down_links: {s:?} is not x,y,z:DIR")))?;
        let c: Coord = c
            .parse()
            .map_err(|e| bad(format!("view.down_links: {e}")))?;
        let d: Dir = d
            .parse()
            .map_err(|e| bad(format!("view.down_links: {e}")))?;
        dims.check(c)
            .map_err(|e| bad(format!("view.down_links: {e}")))?;
        view.set_link(c, d, false).map_err(|e| bad(e.to_string()))?;
    }
    for s in &raw.down_servers {
        let c: Coord = s
            .parse()
            .map_err(|e| bad(format!("view.down_servers: {e}")))?;
        dims.check(c)
            .map_err(|e| bad(format!("view.down_servers: {e}")))?;
        view.set_server(c, false).map_err(|e| bad(e.to_string()))?;
    }
    Ok(view)
}

/// `[transport]`: the transport's settings over its defaults, each checked.
fn transport_settings(raw: &RawTransport, mtu: u32) -> Result<TransportConfig, ConfigError> {
    let bad = |s: String| ConfigError::Invalid(s);
    let mut transport = TransportConfig {
        mtu: mtu as usize,
        ..TransportConfig::default()
    };
    if let Some(w) = raw.window {
        if w == 0 || w > 65536 {
            return Err(bad(format!("transport.window: {w} is outside 1..=65536")));
        }
        transport.window = w;
    }
    if let Some(a) = raw.aggregate {
        transport.aggregate = a;
    }
    if let Some(d) = raw.agg_delay_us {
        transport.agg_delay = std::time::Duration::from_micros(d);
    }
    if let Some(q) = raw.queue_bytes {
        transport.queue_bytes = q;
    }
    if let Some(ms) = raw.broken_after_ms {
        if !(100..=600_000).contains(&ms) {
            return Err(bad(format!(
                "transport.broken_after_ms: {ms} is outside 100..=600000"
            )));
        }
        transport.broken_after = std::time::Duration::from_millis(ms);
    }
    if let Some(on) = raw.congestion {
        transport.congestion.on = on;
    }
    Ok(transport)
}

/// `[apps]`: the application socket (beside the management socket `socket` by default:
/// `X.sock` -> `X-apps.sock`), its group and how many applications it serves; `None` when
/// applications are turned off.
fn apps_settings(
    raw: RawApps,
    socket: &std::path::Path,
    name: &str,
    weights: &Weights,
) -> Result<Option<AppsConfig>, ConfigError> {
    let max_apps = raw.max.unwrap_or(64);
    if !(1..=4096).contains(&max_apps) {
        return Err(ConfigError::Invalid(format!(
            "apps.max: {max_apps} is outside 1..=4096"
        )));
    }
    let max_pool_mib = raw.max_pool_mib.unwrap_or(1024);
    if !(16..=4096).contains(&max_pool_mib) {
        return Err(ConfigError::Invalid(format!(
            "apps.max_pool_mib: {max_pool_mib} is outside 16..=4096"
        )));
    }
    let apps_socket = raw.socket;
    let apps_group = raw.group;
    let apps_on = raw.enabled.unwrap_or(true);
    Ok(apps_on.then(|| AppsConfig {
        socket: apps_socket.unwrap_or_else(|| {
            let stem = socket.file_stem().map(|s| s.to_string_lossy().into_owned());
            socket.with_file_name(format!(
                "{}-apps.sock",
                stem.unwrap_or_else(|| name.to_string())
            ))
        }),
        group: apps_group,
        max_apps,
        weights: weights.clone(),
        max_pool: max_pool_mib << 20,
    }))
}

fn ip_settings(raw: RawIp, dims: Dims) -> Result<Option<crate::ip::IpConfig>, ConfigError> {
    let bad = |s: String| ConfigError::Invalid(s);
    if !raw.enabled.unwrap_or(true) {
        return Ok(None);
    }
    let name = raw.name.unwrap_or_else(|| "torus0".into());
    if name.is_empty() || name.len() > 15 || name.contains(['/', ' ']) {
        return Err(bad(format!(
            "ip.name: {name:?} is not an interface name (1-15 characters)"
        )));
    }
    let v4: crate::ip::addr::Prefix4 = raw
        .ipv4
        .as_deref()
        .unwrap_or("10.77.0.0/16")
        .parse()
        .map_err(|e| bad(format!("ip.ipv4: {e}")))?;
    if v4.hosts() < dims.count() {
        return Err(bad(format!(
            "ip.ipv4: /{} numbers {} hosts, the torus has {} servers",
            v4.len,
            v4.hosts(),
            dims.count()
        )));
    }
    let v6 = match raw.ipv6.as_deref() {
        Some("off") => None,
        s => Some(
            s.unwrap_or("fd77::/64")
                .parse::<crate::ip::addr::Prefix6>()
                .map_err(|e| bad(format!("ip.ipv6: {e}")))?,
        ),
    };
    let mtu = raw.mtu.unwrap_or(65000);
    if !(1280..=65535).contains(&mtu) {
        return Err(bad(format!("ip.mtu: {mtu} is outside 1280..=65535")));
    }
    Ok(Some(crate::ip::IpConfig { name, v4, v6, mtu }))
}

fn kv_settings(raw: RawKv) -> Result<Option<crate::kvgw::KvSettings>, ConfigError> {
    use std::time::Duration;
    let bad = |s: String| ConfigError::Invalid(s);
    if !raw.enabled.unwrap_or(true) {
        return Ok(None);
    }
    let mut service = torusnet_services::kv::KvConfig::default();
    if let Some(r) = raw.replicas {
        if !(1..=7).contains(&r) {
            return Err(bad(format!("kv.replicas: {r} is outside 1..=7")));
        }
        service.replicas = r;
    }
    if let Some(t) = raw.rereplicate_after_s {
        if !(0.0..=86_400.0).contains(&t) {
            return Err(bad(format!(
                "kv.rereplicate_after_s: {t} is outside 0..=86400"
            )));
        }
        service.rereplicate_after = Duration::from_secs_f64(t);
    }
    if let Some(c) = raw.cache {
        service.cache = c;
    }
    if let Some(k) = raw.cache_keys {
        if k > 16 {
            return Err(bad(format!("kv.cache_keys: {k} is outside 0..=16")));
        }
        service.cache_keys = k;
    }
    if let Some(m) = raw.store_mb {
        if !(1..=1 << 20).contains(&m) {
            return Err(bad(format!("kv.store_mb: {m} is outside 1..=1048576")));
        }
        service.store_bytes = m << 20;
    }
    if let Some(m) = raw.cache_mb {
        if m > 1 << 20 {
            return Err(bad(format!("kv.cache_mb: {m} is outside 0..=1048576")));
        }
        service.cache_bytes = m << 20;
    }
    if let Some(ms) = raw.op_timeout_ms {
        if !(50..=600_000).contains(&ms) {
            return Err(bad(format!(
                "kv.op_timeout_ms: {ms} is outside 50..=600000"
            )));
        }
        service.op_timeout = Duration::from_millis(ms);
    }
    let max_connections = raw.max_connections.unwrap_or(1024);
    if !(1..=65_536).contains(&max_connections) {
        return Err(bad(format!(
            "kv.max_connections: {max_connections} is outside 1..=65536"
        )));
    }
    let max_item = raw.max_item_kb.unwrap_or(1024);
    if !(1..=32 * 1024).contains(&max_item) {
        return Err(bad(format!(
            "kv.max_item_kb: {max_item} is outside 1..=32768"
        )));
    }
    let listen = raw.listen.unwrap_or_else(|| "127.0.0.1:11211".into());
    let gateway = if listen == "off" {
        None
    } else {
        let addr: std::net::SocketAddr = listen.parse().map_err(|_| {
            bad(format!(
                "kv.listen: {listen:?} is not an address like 0.0.0.0:11211 (or \"off\")"
            ))
        })?;
        Some(crate::kvgw::GatewayConfig {
            listen: addr,
            max_connections,
            max_item: max_item << 10,
            timeout: service.op_timeout + Duration::from_secs(2),
        })
    };
    Ok(Some(crate::kvgw::KvSettings {
        service,
        gateway,
        log: raw.log,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        dims = "2x1x1"
        coord = "0,0,0"
        mtu = 9000
        polling = "adaptive"
        [[link]]
        ifname = "a0"
        dir = "+x"
        neighbor_mac = "02:00:00:00:00:01"
    "#;

    #[test]
    fn parses_and_marks_unplugged_directions_down() {
        let c = NodeConfig::parse(GOOD).unwrap();
        assert_eq!(c.mtu, 9000);
        assert_eq!(c.polling, Polling::Adaptive);
        assert_eq!(c.links[0].neighbor_mac, Some([2, 0, 0, 0, 0, 1]));
        assert_eq!(
            c.view.live_dirs(c.coord.unwrap()),
            DirSet::EMPTY.with(Dir::PlusX)
        );
    }

    #[test]
    fn weights_by_name_reach_built_in_services_and_applications() {
        let c = NodeConfig::parse(&format!(
            "{GOOD}\n[weights]\nkv = 3\n\"analytics\" = 5\n[apps]\nmax_weight = 4"
        ))
        .unwrap();
        assert_eq!(
            c.weights.builtin().collect::<Vec<_>>(),
            vec![(torusnet_services::kv::KV, 3)]
        );
        let apps = c.apps.expect("apps on");
        assert_eq!(apps.weights.at_attach("analytics"), 5);
        assert_eq!(apps.weights.grant("other", 9), Ok(4));
    }

    #[test]
    fn routing_is_off_unless_configured() {
        let c = NodeConfig::parse(GOOD).unwrap();
        assert_eq!(c.routing.source, None);
        assert_eq!(c.routing.link_capacity_bps, 10_000_000_000);
        let text = format!(
            "{GOOD}\n[routing]\nmode = \"source\"\nprobe_interval_ms = 50\nlink_gbps = 2.5"
        );
        let c = NodeConfig::parse(&text).unwrap();
        assert_eq!(c.routing.source, Some(true));
        assert_eq!(c.routing.bsr.probe_interval.as_millis(), 50);
        assert_eq!(c.routing.link_capacity_bps, 2_500_000_000);
    }

    #[test]
    fn refuses_bad_values_with_the_field_named() {
        let cases = [
            (GOOD.replace("2x1x1", "2x0x1"), "dims"),
            (GOOD.replace("\"0,0,0\"", "\"5,0,0\""), "coord"),
            (GOOD.replace("9000", "70000"), "mtu"),
            (GOOD.replace("\"+x\"", "\"+y\""), "does not exist"),
            (GOOD.replace("02:00:00:00:00:01", "zz"), "neighbor_mac"),
            (GOOD.replace("polling = \"adaptive\"", "polling = \"lazy\""), "polling"),
            (GOOD.replace("mtu = 9000", "mtu = 9000\nbogus = 1"), "bogus"),
            (GOOD.replace("[[link]]\n        ifname = \"a0\"\n        dir = \"+x\"\n        neighbor_mac = \"02:00:00:00:00:01\"", ""), "no [[link]]"),
            (format!("{GOOD}\n[routing]\nmode = \"bsr\""), "routing.mode"),
            (format!("{GOOD}\n[routing]\nprobe_interval_ms = 1"), "routing.probe_interval_ms"),
            (format!("{GOOD}\n[routing]\nprobe_timeout_ms = 500"), "routing.probe_timeout_ms"),
            (format!("{GOOD}\n[routing]\nlink_gbps = 0"), "routing.link_gbps"),
            (GOOD.replace("mtu = 9000", "mtu = 9000\ntransit_chunks = 9000"), "transit_chunks"),
            (format!("{GOOD}\n[weights]\nkv = 0"), "weights.kv"),
            (format!("{GOOD}\n[weights]\nkv = -1"), "weights"),
            (format!("{GOOD}\n[apps]\nmax_weight = 99"), "apps.max_weight"),
        ];
        for (text, want) in cases {
            let e = NodeConfig::parse(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }
}
