//! `torusctl daemon`: the control process of one server. It runs the control-plane state
//! machine (`proto::control`) over one AF_PACKET socket per link (EtherType 0x88B6, which the
//! XDP program passes to the kernel), persists the coordinate it is given, publishes every
//! new view to `torusd` over its management socket, and answers status queries on its own
//! socket. It holds no protocol logic.
//!
//! Why a Unix socket to torusd rather than pinned BPF maps: a push reaches the pollers at
//! once (no polling of a map version), needs no bpffs, and the same socket already carries
//! status and commands; torusd keeps its last view when this process is gone.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use torusnet_proto::control::{ControlConfig, ControlEvent, ControlNode};
use torusnet_proto::routing::LinkView;
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims, Dir, DirSet};
use torusnet_proto::wire::ETHERTYPE_CONTROL;

/// The control process's settings, read from the node file (`[control]` and the shared
/// top-level fields).
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Label.
    pub name: String,
    /// The torus.
    pub dims: Dims,
    /// Links: interface and direction (the wiring plan).
    pub links: Vec<(String, Dir)>,
    /// Unique id.
    pub node_id: u64,
    /// This server is the origin.
    pub origin: bool,
    /// Where the assigned coordinate is kept.
    pub state_file: PathBuf,
    /// This process's status socket.
    pub socket: PathBuf,
    /// torusd's management socket, to publish views to (none: do not publish).
    pub dataplane: Option<PathBuf>,
    /// Hello interval.
    pub hello: Duration,
    /// Missed hellos before a link is down.
    pub dead_after: u32,
    /// How long a (re)joining server relays before taking its keys (`[control]
    /// join_holddown_ms`; the protocol's default when absent).
    pub join_holddown: Option<Duration>,
    /// Cluster key for authenticated control frames.
    pub key: Option<Vec<u8>>,
    /// Where the control process serves Prometheus metrics (`[control] metrics`; off when
    /// absent).
    pub metrics: Option<std::net::SocketAddr>,
}

fn hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.is_empty() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

impl DaemonConfig {
    /// Reads the node file; errors are one line naming the field.
    pub fn load(path: &Path) -> Result<DaemonConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let v: toml::Value = toml::from_str(&text)
            .map_err(|e| format!("{}: {}", path.display(), e.to_string().replace('\n', " ")))?;
        let s = |k: &str| v.get(k).and_then(|x| x.as_str());
        let dims: Dims = s("dims")
            .ok_or("dims: missing")?
            .parse()
            .map_err(|e| format!("dims: {e}"))?;
        let name = s("name").ok_or("name: missing")?.to_string();
        let mut links = Vec::new();
        for l in v
            .get("link")
            .and_then(|x| x.as_array())
            .into_iter()
            .flatten()
        {
            let ifname = l
                .get("ifname")
                .and_then(|x| x.as_str())
                .ok_or("link.ifname: missing")?;
            let dir: Dir = l
                .get("dir")
                .and_then(|x| x.as_str())
                .ok_or("link.dir: missing")?
                .parse()
                .map_err(|e| format!("link {ifname}: {e}"))?;
            if !dims.has_links(dir) {
                return Err(format!(
                    "link {ifname}: direction {dir} does not exist in a {dims} torus"
                ));
            }
            links.push((ifname.to_string(), dir));
        }
        if links.is_empty() {
            return Err("no [[link]] configured".into());
        }
        let empty = toml::Value::Table(Default::default());
        let c = v.get("control").unwrap_or(&empty);
        let node_id = match c.get("node_id") {
            Some(x) => x
                .as_integer()
                .filter(|n| *n >= 0)
                .ok_or("control.node_id: a non-negative integer")? as u64,
            // Derived from the name: stable across restarts, unique in practice.
            None => torusnet_proto::Key::from_string(&name).routing_key() >> 1,
        };
        let origin = c.get("origin").and_then(|x| x.as_bool()).unwrap_or(false);
        let state_file = c
            .get("state_file")
            .and_then(|x| x.as_str())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(format!("/var/lib/torusnet/{name}.coord")));
        let socket = c
            .get("socket")
            .and_then(|x| x.as_str())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(format!("/run/torusnet/{name}-control.sock")));
        let publish = c.get("publish").and_then(|x| x.as_bool()).unwrap_or(true);
        let dataplane = publish.then(|| {
            s("socket")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(format!("/run/torusnet/{name}.sock")))
        });
        let hello_ms = c
            .get("hello_ms")
            .and_then(|x| x.as_integer())
            .unwrap_or(100);
        if !(5..=10_000).contains(&hello_ms) {
            return Err(format!("control.hello_ms: {hello_ms} is outside 5..=10000"));
        }
        let dead_after = c
            .get("dead_after")
            .and_then(|x| x.as_integer())
            .unwrap_or(3);
        if !(1..=100).contains(&dead_after) {
            return Err(format!(
                "control.dead_after: {dead_after} is outside 1..=100"
            ));
        }
        let join_holddown = match c.get("join_holddown_ms") {
            None => None,
            Some(x) => match x.as_integer() {
                Some(ms @ 0..=60_000) => Some(Duration::from_millis(ms as u64)),
                _ => {
                    return Err(format!(
                        "control.join_holddown_ms: {x} is not a whole number of ms in 0..=60000"
                    ))
                }
            },
        };
        let key = match c.get("key").and_then(|x| x.as_str()) {
            Some(k) => Some(hex(k).ok_or("control.key: hex digits")?),
            None => None,
        };
        let metrics = match c.get("metrics") {
            None => None,
            Some(m) => Some(
                m.as_str()
                    .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
                    .ok_or("control.metrics: ADDRESS:PORT (e.g. \"127.0.0.1:9465\")")?,
            ),
        };
        Ok(DaemonConfig {
            metrics,
            name,
            dims,
            links,
            node_id,
            origin,
            state_file,
            socket,
            dataplane,
            hello: Duration::from_millis(hello_ms as u64),
            dead_after: dead_after as u32,
            join_holddown,
            key,
        })
    }
}

/// An AF_PACKET socket on one link, for control frames only.
struct LinkSocket {
    dir: Dir,
    ifname: String,
    fd: OwnedFd,
    mac: [u8; 6],
}

fn packet_socket(ifname: &str) -> Result<(OwnedFd, [u8; 6]), String> {
    let proto = ETHERTYPE_CONTROL.to_be() as i32;
    // SAFETY: plain syscall; the fd is owned on success.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            proto,
        )
    };
    if fd < 0 {
        return Err(format!(
            "{ifname}: AF_PACKET socket: {} (needs CAP_NET_RAW)",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: fd is fresh and ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let c = std::ffi::CString::new(ifname).map_err(|_| format!("{ifname}: bad name"))?;
    // SAFETY: c is a valid C string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        return Err(format!(
            "{ifname}: no such interface in this network namespace"
        ));
    }
    // SAFETY: sockaddr_ll is plain data.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = ETHERTYPE_CONTROL.to_be();
    sa.sll_ifindex = idx as i32;
    // SAFETY: sa is a valid sockaddr_ll of the size given.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if r < 0 {
        return Err(format!(
            "{ifname}: bind: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: ifreq is plain data.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(ifname.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: SIOCGIFHWADDR fills the union with the hardware address.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } < 0 {
        return Err(format!(
            "{ifname}: MAC address: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: after SIOCGIFHWADDR the union holds a sockaddr.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok((fd, mac))
}

fn fmt_mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn read_coord(path: &Path, dims: Dims) -> Option<Coord> {
    let s = std::fs::read_to_string(path).ok()?;
    let c: Coord = s.trim().parse().ok()?;
    dims.contains(c).then_some(c)
}

fn write_coord(path: &Path, c: Coord) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{c}\n"))?;
    std::fs::rename(tmp, path)
}

/// Publishes views to torusd over a standing connection, reconnecting as needed. What was
/// published last is remembered whole (neighbour MACs included, which change without a new
/// view version when a NIC is replaced), and forgotten when the connection drops, so a
/// restarted torusd gets the current view as soon as it is back. The connection doubles as
/// torusd's heartbeat: while it is down, this server advertises no live link.
struct Publisher {
    path: PathBuf,
    conn: Option<(UnixStream, BufReader<UnixStream>)>,
    published: u64,
    /// The last message torusd accepted.
    last_msg: Option<String>,
    latency_us: Option<u64>,
    last_try: Option<Instant>,
    last_error: Option<String>,
}

impl Publisher {
    /// A publisher to torusd's control socket at `path`, not yet connected.
    fn new(path: PathBuf) -> Publisher {
        Publisher {
            path,
            conn: None,
            published: 0,
            last_msg: None,
            latency_us: None,
            last_try: None,
            last_error: None,
        }
    }

    /// One turn of the loop: starts over when torusd asked for the view, (re)connects, and
    /// tells `node` whether torusd is there (it advertises its links only while it is).
    fn tend(&mut self, republish: &AtomicBool, journal: &mut Journal, node: &mut ControlNode) {
        if republish.swap(false, Ordering::AcqRel) {
            journal.say("torusd asked for the view".into());
            self.reset();
        }
        self.check_alive();
        self.connect();
        let up = self.conn.is_some();
        // Serving once torusd has taken a view: it starts its dataplane on the first one and
        // answers only when it runs. Merely connected, it may still be attaching its links
        // (hundreds of milliseconds on a loaded host, when its neighbours may also miss this
        // server's hellos); a server that took its keys then would lose the messages for
        // them, and its neighbours, declaring its links down meanwhile, would take them too.
        // Its links are advertised from the connection on (torusd's first view shows them).
        node.set_serving(up && self.last_msg.is_some());
        if up != node.dataplane_up() {
            journal.say(if up {
                "torusd is back: links advertised".into()
            } else {
                "torusd is gone: advertising no link until it is back".into()
            });
            node.set_dataplane(up);
        }
    }

    /// Whether `msg` differs from what torusd holds.
    fn stale(&self, msg: &Value) -> bool {
        self.last_msg.as_deref() != Some(msg.to_string().as_str())
    }

    /// Forgets the connection and what it carried: the next loop publishes afresh.
    fn reset(&mut self) {
        self.conn = None;
        self.last_msg = None;
        self.last_try = None;
    }

    /// Whether the standing connection is still open (a restarted torusd closed the old one).
    fn check_alive(&mut self) {
        let Some((w, _)) = self.conn.as_ref() else {
            return;
        };
        let mut b = [0u8; 1];
        // SAFETY: peeking one byte into our buffer on our socket, without blocking.
        let n = unsafe {
            libc::recv(
                w.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        let gone = n == 0
            || (n < 0 && {
                let e = std::io::Error::last_os_error().raw_os_error();
                e != Some(libc::EAGAIN) && e != Some(libc::EWOULDBLOCK)
            });
        if gone {
            self.reset();
        }
    }

    /// Connects to torusd when not connected (at most every 200 ms); the dataplane runs
    /// once torusd has taken a view over the connection (see `tend`).
    fn connect(&mut self) {
        if self.conn.is_some()
            || self
                .last_try
                .is_some_and(|t| t.elapsed() < Duration::from_millis(200))
        {
            return;
        }
        self.last_try = Some(Instant::now());
        match UnixStream::connect(&self.path) {
            Ok(s) => {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                match s.try_clone() {
                    Ok(r) => self.conn = Some((s, BufReader::new(r))),
                    Err(e) => self.last_error = Some(e.to_string()),
                }
            }
            Err(e) => self.last_error = Some(format!("torusd at {}: {e}", self.path.display())),
        }
    }

    fn publish(&mut self, msg: &Value, version: u64) {
        let Some((w, r)) = self.conn.as_mut() else {
            return;
        };
        let t0 = Instant::now();
        let mut line = String::new();
        let ok = writeln!(w, "{msg}").is_ok() && r.read_line(&mut line).is_ok_and(|n| n > 0);
        if !ok {
            self.reset();
            self.last_error = Some("torusd connection lost".into());
            return;
        }
        match serde_json::from_str::<Value>(&line) {
            Ok(v) if v.get("ok").is_some() => {
                self.published = version;
                self.last_msg = Some(msg.to_string());
                self.latency_us = Some(t0.elapsed().as_micros() as u64);
                self.last_error = None;
            }
            Ok(v) => self.last_error = Some(v["error"].as_str().unwrap_or("refused").to_string()),
            Err(e) => self.last_error = Some(e.to_string()),
        }
    }
}

/// The view as torusd's `view` command wants it.
fn view_message(node: &ControlNode, version: u64, view: &LinkView) -> Option<Value> {
    let me = node.coord()?;
    let dims = node.dims();
    let mut down_servers = Vec::new();
    let mut down_links = Vec::new();
    for c in dims.coords() {
        if !view.is_up(c) {
            down_servers.push(c.to_string());
            continue;
        }
        let live = view.live_dirs(c);
        for d in dims.link_dirs().iter() {
            if !live.contains(d) && view.is_up(dims.neighbor(c, d)) {
                down_links.push(format!("{c}:{d}"));
            }
        }
    }
    let mut neighbors = serde_json::Map::new();
    for d in Dir::ALL {
        if let Some(n) = node.link(d).neighbor {
            neighbors.insert(d.name().to_string(), json!(fmt_mac(n.mac)));
        }
    }
    let joining: Vec<String> = view.joining().map(|c| c.to_string()).collect();
    Some(json!({
        "cmd": "view",
        "version": version,
        "dims": dims.to_string(),
        "coord": me.to_string(),
        "neighbors": neighbors,
        "down_servers": down_servers,
        "down_links": down_links,
        "joining": joining,
    }))
}

/// A packet socket on each of the server's torus links.
fn open_links(links: &[(String, Dir)]) -> Result<Vec<LinkSocket>, String> {
    let mut socks = Vec::new();
    for (ifname, dir) in links {
        let (fd, mac) = packet_socket(ifname)?;
        socks.push(LinkSocket {
            dir: *dir,
            ifname: ifname.clone(),
            fd,
            mac,
        });
    }
    Ok(socks)
}

/// The Prometheus endpoint at `addr`, rendering the status the loop publishes.
fn serve_metrics(
    addr: std::net::SocketAddr,
    status: Arc<parking_lot::Mutex<Value>>,
) -> Result<torusnet_ops::metrics::Server, String> {
    // Bound from its own thread, retrying while a killed predecessor's socket is still
    // being torn down.
    torusnet_ops::metrics::serve_retrying(addr, Duration::from_secs(10), move || {
        crate::metrics::render(&status.lock())
    })
    .map_err(|e| format!("metrics endpoint {addr}: {e}"))
}

/// Sleeps until a frame arrives on one of `fds` or `wait` has passed.
fn wait_for_frames(fds: &mut [libc::pollfd], wait: Duration) {
    // To the microsecond (ppoll): poll()'s milliseconds round a timer due in under one down
    // to zero, and the loop would spin until it fires.
    let ts = libc::timespec {
        tv_sec: wait.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(wait.subsec_nanos() as i32),
    };
    // SAFETY: fds is a valid array of pollfd; ts outlives the call.
    unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
}

/// The scheduling priority the control process asks for (a nice value): above the
/// dataplane's, whose pollers may spin, and above other programs on a loaded host.
const NICE: i32 = -10;

/// Raises this process's scheduling priority to [`NICE`] when it may (root, or
/// `CAP_SYS_NICE`; systemd's `Nice=` does it for the unit otherwise). Failure detection is
/// timing: a control process starved of the CPU for three hello intervals stops sending
/// hellos, and its neighbours declare its links down although it lives (seen on namespace
/// tori, while a restarting neighbour's dataplane pinned its memory). Its own work is a few
/// frames every hello interval, so the priority costs others nothing.
fn raise_priority() {
    // SAFETY: setpriority on this process; no memory involved.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, NICE) };
    if r != 0 {
        tracing::debug!(
            "cannot raise the scheduling priority to nice {NICE}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The publisher to torusd, when this server has a dataplane to serve; then it serves only
/// once torusd has taken a view: taking keys before that would claim what cannot be served.
fn dataplane_publisher(cfg: &DaemonConfig, node: &mut ControlNode) -> Option<Publisher> {
    let p = cfg.dataplane.clone().map(Publisher::new);
    if p.is_some() {
        node.set_serving(false);
    }
    p
}

/// Runs the control process until `stop` is set.
pub fn run(cfg: DaemonConfig, stop: Arc<AtomicBool>) -> Result<(), String> {
    raise_priority();
    let socks = open_links(&cfg.links)?;
    let persisted = read_coord(&cfg.state_file, cfg.dims);
    // The control plane's clock starts now; take-over instants travel as wall-clock times
    // measured from the same moment.
    let epoch = Instant::now();
    let cc = control_config(&cfg, persisted);
    let refresh = cc.refresh;
    let mut node = ControlNode::new(cc);

    let status = Arc::new(parking_lot::Mutex::new(
        json!({"name": cfg.name, "starting": true}),
    ));
    let listener = bind_status(&cfg.socket)?;
    // Set by a (re)started torusd asking for the current view.
    let republish = Arc::new(AtomicBool::new(false));
    {
        let status = status.clone();
        let stop = stop.clone();
        let republish = republish.clone();
        std::thread::Builder::new()
            .name("control-status".into())
            .spawn(move || serve_status(listener, status, stop, republish))
            .map_err(|e| e.to_string())?;
    }
    // Held until the loop ends: dropping it stops the endpoint.
    let _metrics = cfg
        .metrics
        .map(|addr| serve_metrics(addr, status.clone()))
        .transpose()?;
    let now = || Time::from_nanos(epoch.elapsed().as_nanos() as u64);
    let mut publisher = dataplane_publisher(&cfg, &mut node);
    // After a (re)start, publish only once the database has been refilled, so a restarted
    // control process never hands torusd a half-empty view: neighbours send their whole
    // database when a link comes up, so shortly after every link is up it is complete; at
    // the latest, the others' refreshes have refilled it after `hold`.
    let hold = refresh + cfg.hello * (cfg.dead_after + 1);
    let settle = cfg.hello * 2;
    let mut adjacent_since: Option<Instant> = None;
    let mut ready = false;
    let mut journal = Journal::new(epoch);
    if let Some(c) = persisted {
        journal.say(format!("coordinate {c} from {}", cfg.state_file.display()));
    }
    let mut last_status = Instant::now() - Duration::from_secs(1);
    let mut built_for = None;
    let mut buf = vec![0u8; 2048];
    let mut fds: Vec<libc::pollfd> = socks
        .iter()
        .map(|s| libc::pollfd {
            fd: s.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while !stop.load(Ordering::Acquire) {
        let t = now();
        let wait = node
            .poll_timeout()
            .map_or(Duration::from_millis(50), |d| d.since(t))
            .min(Duration::from_millis(50));
        wait_for_frames(&mut fds, wait);
        receive(&socks, &mut node, &mut buf, now());
        let t = now();
        if node.poll_timeout().is_some_and(|d| d <= t) {
            node.handle_timeout(t);
        }
        transmit(&socks, &mut node);
        while let Some(e) = node.poll_event() {
            journal.record(e, &cfg, &socks);
        }
        if let Some(p) = publisher.as_mut() {
            p.tend(&republish, &mut journal, &mut node);
        }
        adjacent_since = if node.adjacent() {
            adjacent_since.or(Some(Instant::now()))
        } else {
            None
        };
        ready = ready
            || epoch.elapsed() >= hold
            || adjacent_since.is_some_and(|t| t.elapsed() >= settle);
        if let (Some(p), Some((version, view))) = (publisher.as_mut(), node.view()) {
            // The message is built only when what it says may have changed (it walks the
            // whole torus; 27 daemons on two cores felt it at every turn of their loops).
            let key = (
                version,
                Dir::ALL.map(|d| node.link(d).neighbor.map(|n| n.mac)),
            );
            if ready && (p.last_msg.is_none() || built_for != Some(key)) {
                built_for = Some(key);
                if let Some(msg) = view_message(&node, version, view) {
                    if p.stale(&msg) {
                        p.publish(&msg, version);
                    }
                }
            }
        }
        if last_status.elapsed() >= Duration::from_millis(200) {
            last_status = Instant::now();
            let mut snap = snapshot(
                &cfg,
                &node,
                &socks,
                publisher.as_ref(),
                &journal.log,
                journal.refused,
                now(),
            );
            snap["problems"] = json!(journal.problems);
            *status.lock() = snap;
        }
    }
    let _ = std::fs::remove_file(&cfg.socket);
    Ok(())
}

/// What the control process tells its operator: the last lines of its log (in the status),
/// the miswirings it found (kept, while the log rolls over), and the control frames it
/// refused (counted, logged at most once every ten seconds).
struct Journal {
    epoch: Instant,
    log: VecDeque<String>,
    problems: Vec<String>,
    refused: u64,
    refuse_log: torusnet_ops::logging::RateLimit,
}

impl Journal {
    /// Lines of the log kept for the status.
    const LINES: usize = 50;

    fn new(epoch: Instant) -> Journal {
        Journal {
            epoch,
            log: VecDeque::new(),
            problems: Vec::new(),
            refused: 0,
            // A flood of bad control frames costs a line every ten seconds.
            refuse_log: torusnet_ops::logging::RateLimit::new(Duration::from_secs(10), 1),
        }
    }

    fn say(&mut self, s: String) {
        tracing::info!("{s}");
        self.log
            .push_back(format!("{:.3}s {s}", self.epoch.elapsed().as_secs_f64()));
        if self.log.len() > Self::LINES {
            self.log.pop_front();
        }
    }

    /// Logs what the control state machine reports (and persists an assigned coordinate).
    fn record(&mut self, e: ControlEvent, cfg: &DaemonConfig, socks: &[LinkSocket]) {
        match e {
            ControlEvent::CoordAssigned(c) => {
                self.say(format!("coordinate {c} assigned"));
                if let Err(e) = write_coord(&cfg.state_file, c) {
                    self.say(format!(
                        "cannot persist the coordinate to {}: {e}",
                        cfg.state_file.display()
                    ));
                }
            }
            ControlEvent::Miswired { dir, detail } => {
                let ifname = socks
                    .iter()
                    .find(|s| s.dir == dir)
                    .map_or("?", |s| s.ifname.as_str());
                let line = format!("MISWIRED interface {ifname} ({dir}): {detail}");
                if !self.problems.contains(&line) {
                    self.problems.push(line.clone());
                }
                self.say(line);
            }
            ControlEvent::LinkUp(d) => {
                let _l = tracing::info_span!("link", link = %d).entered();
                self.say(format!("link {d} up"));
            }
            ControlEvent::LinkDown(d) => {
                let _l = tracing::info_span!("link", link = %d).entered();
                self.say(format!("link {d} down"));
            }
            ControlEvent::ViewChanged(v) => {
                let _l = tracing::info_span!("view", view_version = v).entered();
                self.say(format!("view version {v}"));
            }
            ControlEvent::Refused(why) => {
                self.refused += 1;
                if let Some(held) = self.refuse_log.allow("refused", Instant::now()) {
                    tracing::warn!(
                        total = self.refused,
                        held_back = held,
                        "control frame refused: {why}"
                    );
                }
            }
        }
    }
}

/// The control state machine's settings from the daemon's, with the coordinate this server
/// held before it restarted (if it persisted one).
fn control_config(cfg: &DaemonConfig, persisted: Option<Coord>) -> ControlConfig {
    let incarnation = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(1);
    let epoch_unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut cc = ControlConfig::new(
        cfg.node_id,
        cfg.dims,
        cfg.links.iter().map(|l| l.1).collect::<DirSet>(),
    );
    cc.origin = cfg.origin;
    cc.coord = persisted;
    cc.hello = cfg.hello;
    cc.dead_after = cfg.dead_after;
    cc.key = cfg.key.clone();
    cc.incarnation = incarnation;
    cc.epoch_unix_ns = epoch_unix_ns;
    if let Some(h) = cfg.join_holddown {
        cc.join_holddown = h;
    }
    cc
}

/// Hands every control frame waiting on the links' packet sockets to the state machine.
fn receive(socks: &[LinkSocket], node: &mut ControlNode, buf: &mut [u8], now: Time) {
    for s in socks {
        loop {
            // SAFETY: reading into our buffer.
            let n = unsafe {
                libc::recv(
                    s.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                break;
            }
            let n = n as usize;
            // Our own frames echoed back by AF_PACKET: not for us.
            if n >= 12 && buf[6..12] == s.mac {
                continue;
            }
            node.handle_frame(now, s.dir, &buf[..n]);
        }
    }
}

/// Sends every frame the state machine has, addressed from the link's MAC to its
/// neighbour's (once known).
fn transmit(socks: &[LinkSocket], node: &mut ControlNode) {
    while let Some((d, mut f)) = node.poll_transmit() {
        if let Some(s) = socks.iter().find(|s| s.dir == d) {
            f[6..12].copy_from_slice(&s.mac);
            if let Some(n) = node.link(d).neighbor {
                f[0..6].copy_from_slice(&n.mac);
            }
            // SAFETY: sending our buffer on a bound packet socket.
            unsafe {
                libc::send(
                    s.fd.as_raw_fd(),
                    f.as_ptr().cast(),
                    f.len(),
                    libc::MSG_DONTWAIT,
                )
            };
        }
    }
}

fn snapshot(
    cfg: &DaemonConfig,
    node: &ControlNode,
    socks: &[LinkSocket],
    p: Option<&Publisher>,
    log: &VecDeque<String>,
    refused: u64,
    now: Time,
) -> Value {
    let links: Vec<Value> = socks
        .iter()
        .map(|s| {
            let l = node.link(s.dir);
            let state = if l.miswired.is_some() { "miswired" } else if l.up { "up" } else { "down" };
            json!({
                "ifname": s.ifname,
                "dir": s.dir.name(),
                "mac": fmt_mac(s.mac),
                "state": state,
                "neighbor": l.neighbor.map(|n| json!({"node_id": n.node_id, "coord": n.coord.map(|c| c.to_string()), "mac": fmt_mac(n.mac), "calls_link": n.dir.name()})),
                "last_hello_ms_ago": l.last_hello.map(|t| now.since(t).as_millis() as u64),
                "miswired": l.miswired,
            })
        })
        .collect();
    let down_links: Vec<String> = match node.view() {
        Some((_, view)) => {
            let dims = node.dims();
            dims.coords()
                .filter(|c| view.is_up(*c))
                .flat_map(|c| {
                    let live = view.live_dirs(c);
                    dims.link_dirs()
                        .iter()
                        .filter(move |d| !live.contains(*d) && view.is_up(dims.neighbor(c, *d)))
                        .map(move |d| format!("{c}:{d}"))
                        .collect::<Vec<_>>()
                })
                .collect()
        }
        None => Vec::new(),
    };
    let (version, unreachable, reachable) = match node.view() {
        Some((v, view)) => {
            let dims = node.dims();
            let me = node.coord().unwrap_or_default();
            let dist = view.distances_from(me).unwrap_or_default();
            let unreachable: Vec<String> = dims
                .coords()
                .filter(|c| dist.get(dims.index(*c)).is_none_or(|d| *d == u32::MAX))
                .map(|c| c.to_string())
                .collect();
            let reachable = dims.count() as usize - unreachable.len();
            (v, unreachable, reachable)
        }
        None => (0, Vec::new(), 0),
    };
    json!({
        "name": cfg.name,
        "node_id": cfg.node_id,
        "coord": node.coord().map(|c| c.to_string()),
        "dims": cfg.dims.to_string(),
        "links": links,
        "view_version": version,
        "reachable": reachable,
        "unreachable": unreachable,
        "down_links": down_links,
        "lsdb_records": node.lsdb().len(),
        "active_at_unix_us": node.active_at_unix_ns().map(|ns| ns / 1000),
        "joining": node.view().map(|(_, v)| v.joining().map(|c| c.to_string()).collect::<Vec<_>>()),
        "published_version": p.map(|p| p.published),
        "publish_latency_us": p.and_then(|p| p.latency_us),
        "publish_error": p.and_then(|p| p.last_error.clone()),
        "refused_frames": refused,
        "log": log.iter().collect::<Vec<_>>(),
    })
}

fn bind_status(path: &Path) -> Result<UnixListener, String> {
    // The control process's own user alone: it answers with the view torusd adopts.
    let l = torusnet_ops::socket::bind_private(path)
        .map_err(|e| format!("status socket {}: {e}", path.display()))?;
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    Ok(l)
}

fn serve_status(
    l: UnixListener,
    status: Arc<parking_lot::Mutex<Value>>,
    stop: Arc<AtomicBool>,
    republish: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Acquire) {
        let Ok((s, _)) = l.accept() else {
            // Idle: sleep until a client connects (or a quarter second, to see whether to
            // stop), rather than waking fifty times a second.
            let mut p = libc::pollfd {
                fd: l.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, 250) };
            continue;
        };
        let status = status.clone();
        let stop = stop.clone();
        let republish = republish.clone();
        std::thread::spawn(move || {
            let _ = s.set_nonblocking(false);
            let Ok(mut w) = s.try_clone() else { return };
            for line in BufReader::new(s).lines() {
                let Ok(line) = line else { return };
                let req: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                let ans = match req.get("cmd").and_then(Value::as_str) {
                    Some("status") => status.lock().clone(),
                    Some("shutdown") => {
                        stop.store(true, Ordering::Release);
                        json!({"ok": true})
                    }
                    Some("log") => match req.get("level").and_then(Value::as_str) {
                        Some(l) => match torusnet_ops::logging::set_level(l) {
                            Ok(l) => json!({"level": l}),
                            Err(e) => json!({"error": e}),
                        },
                        None => json!({"level": torusnet_ops::logging::level()}),
                    },
                    // A (re)started torusd: publish the current view to it now.
                    Some("publish") => {
                        republish.store(true, Ordering::Release);
                        json!({"ok": true})
                    }
                    _ => json!({"error": "unknown command (status, log, publish, shutdown)"}),
                };
                if writeln!(w, "{ans}").is_err() {
                    return;
                }
            }
        });
    }
}
