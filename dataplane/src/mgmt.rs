//! The management socket of `torusd`: a Unix stream socket speaking one JSON object per
//! line each way, for `torusctl`, the control process, tests and scripts. Each client gets
//! its own thread, so the control process's standing connection never blocks a status query.
//! Bad requests get `{"error": ...}`; the daemon keeps serving.
//!
//! Requests: `status`, `ping`, `bench`, `fault`, `view` (from the control process), `log`
//! (read or change the log level), `shutdown`; see docs/dataplane.md.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};
use torusnet_proto::routing::LinkView;
use torusnet_proto::topology::{Coord, Dims, Dir};

use torusnet_proto::service::Request;
use torusnet_services::builtin::{
    BenchRequest, KeysRequest, LoadRequest, PingRequest, BENCH, KEYS, LOAD, PING,
};

use crate::config::NodeConfig;
use crate::fault::Fault;
use crate::netns::parse_mac;
use crate::runtime::Dataplane;
use crate::shared::Command;

/// A torusd: its configuration and, once it has a coordinate, its running dataplane.
pub struct Daemon {
    cfg: Mutex<NodeConfig>,
    dp: Mutex<Option<Dataplane>>,
    /// The last view adopted, as logged (a change is logged at info, a repeat at debug).
    last_view: Mutex<String>,
    /// Set to stop the daemon.
    pub stop: AtomicBool,
}

impl Daemon {
    /// A daemon for `cfg`; starts the dataplane now when the coordinate is configured.
    pub fn new(cfg: NodeConfig) -> Result<Arc<Daemon>, String> {
        let dp = match cfg.coord {
            Some(_) => Some(Dataplane::start(&cfg).map_err(|e| e.to_string())?),
            None => None,
        };
        Ok(Arc::new(Daemon {
            cfg: Mutex::new(cfg),
            dp: Mutex::new(dp),
            last_view: Mutex::new(String::new()),
            stop: AtomicBool::new(false),
        }))
    }

    /// Whether the dataplane runs (or still waits for its coordinate) and no poller died.
    pub fn healthy(&self) -> bool {
        self.dp.lock().as_ref().is_none_or(|d| d.is_running())
    }

    /// A human summary of the links, for the log.
    pub fn describe(&self) -> String {
        match self.dp.lock().as_ref() {
            None => "waiting for a coordinate from the control process".into(),
            Some(d) => {
                let st = d.status();
                let links: Vec<String> = st
                    .links
                    .iter()
                    .map(|l| {
                        format!(
                            "{} on {}: XDP {} ({}), AF_XDP {}{}",
                            l.dir,
                            l.ifname,
                            l.xdp_mode,
                            l.xdp_section,
                            l.afxdp_mode,
                            if l.multi_buffer { ", multi-buffer" } else { "" }
                        )
                    })
                    .collect();
                format!("at {:?}; {}", st.coord, links.join("; "))
            }
        }
    }

    /// The status (`mgmt`'s `status` answer; metrics are made from it).
    pub fn status(&self) -> Result<Value, String> {
        match self.dp.lock().as_ref() {
            Some(dp) => serde_json::to_value(dp.status()).map_err(|e| e.to_string()),
            None => {
                let cfg = self.cfg.lock();
                Ok(
                    json!({"name": cfg.name, "dims": cfg.dims.to_string(), "waiting": "for a coordinate from the control process"}),
                )
            }
        }
    }

    /// Runs `f` on the dataplane, once it runs (an embedding program reaches the API
    /// through this while the daemon serves its management socket).
    pub fn with_dataplane<R>(&self, f: impl FnOnce(&Dataplane) -> R) -> Option<R> {
        self.dp.lock().as_ref().map(f)
    }

    /// Stops the dataplane (detaching everything).
    pub fn shutdown(&self) -> Result<(), String> {
        match self.dp.lock().take() {
            Some(d) => d.shutdown(),
            None => Ok(()),
        }
    }
}

/// Asks the control process for the current view (it publishes it to our management socket
/// at once), from a background thread that retries for a few seconds: the control process may
/// be starting too. A torusd restarted under a running control process so serves within a
/// fraction of a second instead of waiting for the next change of the view.
pub fn ask_for_view(control_socket: &Path) {
    let path = control_socket.to_path_buf();
    let _ = std::thread::Builder::new()
        .name("torusd-askview".into())
        .spawn(move || {
            let req = json!({"cmd": "publish"});
            for _ in 0..100 {
                if crate::cluster::request(&path, &req, Duration::from_secs(1)).is_ok() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
}

/// The management server.
pub struct Mgmt {
    path: PathBuf,
    listener: UnixListener,
}

impl Mgmt {
    /// Binds the socket at `path` (replacing a stale one; creating its directory), for
    /// torusd's user alone: its commands change the dataplane.
    pub fn bind(path: &Path) -> std::io::Result<Mgmt> {
        let listener = torusnet_ops::socket::bind_private(path)?;
        listener.set_nonblocking(true)?;
        Ok(Mgmt {
            path: path.to_path_buf(),
            listener,
        })
    }

    /// Serves until the daemon is told to stop or its dataplane dies. At most
    /// [`MAX_CLIENTS`] clients at once (one thread each); more are refused with one line.
    pub fn serve(&self, d: &Arc<Daemon>) {
        let clients = Arc::new(AtomicUsize::new(0));
        while !d.stop.load(Ordering::Acquire) && d.healthy() {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    if clients.load(Ordering::Acquire) >= MAX_CLIENTS {
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
                        let _ = writeln!(
                            stream,
                            "{}",
                            json!({"error": format!("too many clients (at most {MAX_CLIENTS})")})
                        );
                        continue;
                    }
                    clients.fetch_add(1, Ordering::AcqRel);
                    let d = d.clone();
                    let c = clients.clone();
                    // The daemon's span (its server name) goes with each client's thread.
                    let span = tracing::Span::current();
                    let spawned = std::thread::Builder::new()
                        .name("torusd-mgmt".into())
                        .spawn(move || {
                            let _in = span.enter();
                            client(stream, &d);
                            c.fetch_sub(1, Ordering::AcqRel);
                        });
                    if spawned.is_err() {
                        clients.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                // Idle: sleep until a client connects (or a quarter second, to see whether to
                // stop), rather than waking fifty times a second.
                Err(_) => {
                    torusnet_client::sys::wait_readable(
                        std::os::fd::AsRawFd::as_raw_fd(&self.listener),
                        250,
                    );
                }
            }
        }
    }
}

impl Drop for Mgmt {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Most management clients served at once.
pub const MAX_CLIENTS: usize = 64;

/// A client idle this long is disconnected (the control process reconnects on its own).
const CLIENT_IDLE: Duration = Duration::from_secs(600);

fn client(stream: UnixStream, d: &Arc<Daemon>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(CLIENT_IDLE));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(req) => handle(&req, d).unwrap_or_else(|e| json!({"error": e})),
            Err(e) => json!({"error": format!("not JSON: {e}")}),
        };
        if writeln!(out, "{answer}").is_err() || d.stop.load(Ordering::Acquire) {
            return;
        }
    }
}

fn coord(req: &Value, field: &str) -> Result<Coord, String> {
    let s = req
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("missing \"{field}\": x,y,z"))?;
    s.parse().map_err(|e| format!("{field}: {e}"))
}

/// Waits for a service's answer until `limit`: a request never waits for ever.
fn wait(rx: mpsc::Receiver<Value>, limit: Duration) -> Value {
    rx.recv_timeout(limit).unwrap_or_else(|_| {
        json!({"error": format!("no answer from the poller within {:.0} s", limit.as_secs_f64())})
    })
}

/// A request's own deadline (`timeout_ms`), or `default`, at most an hour.
fn timeout(req: &Value, default: Duration) -> Result<Duration, String> {
    match req.get("timeout_ms") {
        None | Some(Value::Null) => Ok(default),
        Some(v) => {
            let ms = v
                .as_u64()
                .filter(|ms| (1..=3_600_000).contains(ms))
                .ok_or("timeout_ms: 1..=3600000")?;
            Ok(Duration::from_millis(ms))
        }
    }
}

/// Slack between a service's own deadline and the management socket's wait for it.
const SLACK: Duration = Duration::from_secs(2);

fn with_dp<T>(d: &Daemon, f: impl FnOnce(&Dataplane) -> Result<T, String>) -> Result<T, String> {
    match d.dp.lock().as_ref() {
        Some(dp) => f(dp),
        None => Err("the dataplane waits for its coordinate from the control process".into()),
    }
}

fn push(dp: &Dataplane, c: Command) -> Result<(), String> {
    dp.command(c)
        .map_err(|_| "the poller's command queue is full".to_string())
}

/// Sends a request to the built-in service `service` on poller `shard`.
fn ask(d: &Daemon, shard: usize, service: u16, request: Request) -> Result<(), String> {
    with_dp(d, |dp| {
        dp.shared()
            .push_to(shard, Command::Request { service, request })
            .map_err(|_| "the poller's command queue is full".to_string())
    })
}

/// Hosted services live with the first poller.
const SERVICES: usize = 0;

/// `{"cmd":"aggregate","combiner":"sum"|"count"|"max"|"min","words":N,"vocabulary":N,
/// "seed":N,"timeout_ms":N}`: the word-count job rooted at this server.
fn aggregate(req: &Value, d: &Arc<Daemon>) -> Result<Value, String> {
    use torusnet_services::aggregate::{AggRequest, Combiner, WordCount, AGG};
    let combiner = Combiner::parse(req.get("combiner").and_then(Value::as_str).unwrap_or("sum"));
    if let Combiner::Named(n) = &combiner {
        return Err(format!(
            "combiner {n:?}: torusd has sum, count, max and min"
        ));
    }
    let num = |k: &str, default: u64, max: u64| -> Result<u64, String> {
        match req.get(k) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=max).contains(n))
                .ok_or(format!("{k}: 1..={max}")),
        }
    };
    let input = WordCount {
        // Records are made and merged in the first poller: bounded so that a job costs it
        // milliseconds per step (a 200,000-word vocabulary takes seconds on 27 servers
        // sharing two cores).
        words: num("words", 100_000, 1_000_000)? as u32,
        vocabulary: num("vocabulary", 10_000, 200_000)? as u32,
        seed: req.get("seed").and_then(Value::as_u64).unwrap_or(1),
    };
    let limit = timeout(req, Duration::from_secs(60))?;
    let (tx, rx) = mpsc::channel();
    let r = AggRequest {
        combiner,
        input,
        timeout: limit,
        reply: tx,
    };
    ask(d, SERVICES, AGG, Box::new(r))?;
    Ok(wait(rx, limit + SLACK))
}

/// `{"cmd":"multicast","group":"all"|["x,y,z",...],"file":PATH|"generate":BYTES,"seed":N,
/// "chunk":BYTES,"timeout_ms":N}` multicasts from this server; `{"cmd":"multicast",
/// "op":"status"}` shows the transfers this server takes part in.
fn multicast(req: &Value, d: &Arc<Daemon>) -> Result<Value, String> {
    use torusnet_services::multicast::{generate, MulticastRequest, StatusRequest, MCAST};
    if req.get("op").and_then(Value::as_str) == Some("status") {
        let (tx, rx) = mpsc::channel();
        ask(d, SERVICES, MCAST, Box::new(StatusRequest { reply: tx }))?;
        return Ok(wait(rx, Duration::from_secs(5)));
    }
    let group = match req.get("group") {
        None => None,
        Some(Value::String(s)) if s == "all" => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|c| {
                    c.as_str()
                        .ok_or("group: strings x,y,z")?
                        .parse::<Coord>()
                        .map_err(|e| format!("group: {e}"))
                })
                .collect::<Result<Vec<Coord>, String>>()?,
        ),
        Some(_) => return Err("group: \"all\" or a list of \"x,y,z\"".into()),
    };
    let data = match (
        req.get("file").and_then(Value::as_str),
        req.get("generate").and_then(Value::as_u64),
    ) {
        (Some(f), None) => std::fs::read(f).map_err(|e| format!("{f}: {e}"))?,
        (None, Some(n)) if n > 0 && n <= torusnet_services::multicast::MAX_SIZE => {
            generate(n, req.get("seed").and_then(Value::as_u64).unwrap_or(1))
        }
        (None, Some(n)) => return Err(format!("generate: {n} bytes is outside 1..=8 GiB")),
        _ => return Err("give \"file\": PATH or \"generate\": BYTES".into()),
    };
    let chunk = req
        .get("chunk")
        .and_then(Value::as_u64)
        .unwrap_or(u64::from(torusnet_services::multicast::DEFAULT_CHUNK))
        .clamp(1024, 1 << 20) as u32;
    let default = Duration::from_secs((data.len() as u64 / 5_000_000).clamp(60, 3600));
    let limit = timeout(req, default)?;
    let (tx, rx) = mpsc::channel();
    let r = MulticastRequest {
        group,
        service: 0,
        data: Arc::new(data),
        chunk,
        timeout: limit,
        reply: tx,
    };
    ask(d, SERVICES, MCAST, Box::new(r))?;
    Ok(wait(rx, limit + SLACK))
}

/// `{"cmd":"ping","to":C,"count":N,"size":B,"reliable":b}`: round trips to server `to`.
fn ping(req: &Value, d: &Arc<Daemon>) -> Result<Value, String> {
    let to = coord(req, "to")?;
    let count = req
        .get("count")
        .and_then(Value::as_u64)
        .unwrap_or(100)
        .clamp(1, 10_000_000) as u32;
    let size = req
        .get("size")
        .and_then(Value::as_u64)
        .unwrap_or(64)
        .clamp(9, 8000) as usize;
    let reliable = req
        .get("reliable")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let limit = timeout(
        req,
        (Duration::from_secs(10) + Duration::from_millis(u64::from(count)))
            .min(Duration::from_secs(3600)),
    )?;
    let (tx, rx) = mpsc::channel();
    let p = PingRequest {
        to,
        count,
        size,
        reliable,
        timeout: limit,
        reply: tx,
    };
    ask(d, SERVICES, PING, Box::new(p))?;
    Ok(wait(rx, limit + SLACK))
}

/// `{"cmd":"bench","to":C,"bytes":N,"size":B,...}`: a one-way stream to server `to`, measured.
fn bench(req: &Value, d: &Arc<Daemon>) -> Result<Value, String> {
    let to = coord(req, "to")?;
    let bytes = req.get("bytes").and_then(Value::as_u64).unwrap_or(1 << 30);
    let size = req
        .get("size")
        .and_then(Value::as_u64)
        .unwrap_or(65536)
        .clamp(13, 64 << 20) as usize;
    let fence_every = req.get("fence_every").and_then(Value::as_u64).unwrap_or(0);
    let reliable = req.get("reliable").and_then(Value::as_bool).unwrap_or(true);
    let verify = req.get("verify").and_then(Value::as_bool).unwrap_or(true);
    // By default, no slower than 10 MB/s and at least a minute.
    let default = Duration::from_secs((bytes / 10_000_000).clamp(60, 3600));
    let limit = timeout(req, default)?;
    let (tx, rx) = mpsc::channel();
    let b = BenchRequest {
        to,
        bytes,
        size,
        fence_every,
        reliable,
        verify,
        timeout: limit,
        reply: tx,
    };
    ask(d, SERVICES, BENCH, Box::new(b))?;
    Ok(wait(rx, limit + SLACK))
}

/// `{"cmd":"fault","link":"+x","drop":P,"duplicate":P,"reorder":P}`: injects faults on a
/// link (each a probability per frame, absent for 0): frames arriving dropped, frames
/// leaving sent twice or held back behind the next one. All zero turns them off.
fn fault(req: &Value, d: &Arc<Daemon>) -> Result<Value, String> {
    let link = req
        .get("link")
        .and_then(Value::as_str)
        .ok_or("missing \"link\": +x ... -z")?;
    let dir: Dir = link.parse().map_err(|e| format!("link: {e}"))?;
    let p = |name: &str| -> Result<f64, String> {
        match req.get(name) {
            None => Ok(0.0),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| format!("{name}: {v} is not a probability")),
        }
    };
    if ["drop", "duplicate", "reorder"]
        .iter()
        .all(|k| req.get(k).is_none())
    {
        return Err("say at least one of \"drop\", \"duplicate\", \"reorder\": 0..1".into());
    }
    let fault = Fault::new(p("drop")?, p("duplicate")?, p("reorder")?)?;
    with_dp(d, |dp| push(dp, Command::SetFault { dir, fault }))?;
    Ok(json!({"ok": true}))
}

/// `{"cmd":"congestion","on":B}`: the congestion controller on or off in every poller
/// (every connection's window starts over); without `on`, whether it is on.
fn congestion(req: &Value, d: &Arc<Daemon>) -> Result<Value, String> {
    let shared = with_dp(d, |dp| Ok(dp.shared().clone()))?;
    match req.get("on") {
        None => {}
        Some(Value::Bool(on)) => {
            shared
                .push(Command::SetCongestion(*on))
                .map_err(|_| "torusd is busy (a poller's command queue is full): try again")?;
            shared.congestion.store(*on, Ordering::Relaxed);
        }
        Some(v) => return Err(format!("on: {v} is not true or false")),
    }
    Ok(json!({"ok": true, "congestion": shared.congestion.load(Ordering::Relaxed)}))
}

/// `{"cmd":"routing","mode":"source"|"next-hop","services":[N,...]}`: how this server's
/// own traffic (or these services') is routed from now on (source routing must be
/// configured).
fn routing(req: &Value, d: &Arc<Daemon>) -> Result<Value, String> {
    let on = match req.get("mode").and_then(Value::as_str) {
        Some("source") => true,
        Some("next-hop") => false,
        _ => return Err("mode: \"source\" or \"next-hop\"".into()),
    };
    let services = match req.get("services") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) if !a.is_empty() => Some(
            a.iter()
                .map(|v| v.as_u64().and_then(|n| u16::try_from(n).ok()))
                .collect::<Option<Vec<u16>>>()
                .ok_or("services: service ids 0..65535")?,
        ),
        Some(_) => return Err("services: a non-empty list of service ids".into()),
    };
    let rx = with_dp(d, |dp| {
        let (tx, rx) = mpsc::channel();
        let shards = dp.shared().shards.len();
        for shard in 0..shards {
            dp.shared()
                .push_to(
                    shard,
                    Command::SetRouting(on, services.clone(), Some(tx.clone())),
                )
                .map_err(|_| "the poller's command queue is full".to_string())?;
        }
        Ok((rx, shards))
    })?;
    let (rx, shards) = rx;
    for _ in 0..shards {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(true) => {}
            Ok(false) => {
                return Err(
                    "source routing is not configured here ([routing] mode = \"next-hop\" or \"source\")"
                        .into(),
                )
            }
            Err(_) => return Err("no answer from the poller within 5 s".into()),
        }
    }
    Ok(json!({"ok": true, "mode": if on { "source" } else { "next-hop" }}))
}

/// `{"cmd":"send_keys","keys":[hex,...]}`: one key-routed message to each key.
fn send_keys(req: &Value, d: &Arc<Daemon>) -> Result<Value, String> {
    let keys = req
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("missing \"keys\": [16 hex digits, ...]")?
        .iter()
        .map(|k| {
            k.as_str()
                .and_then(|s| u64::from_str_radix(s, 16).ok())
                .ok_or("keys: 16 hex digits each")
        })
        .collect::<Result<Vec<u64>, _>>()?;
    let (tx, rx) = mpsc::channel();
    ask(d, SERVICES, KEYS, Box::new(KeysRequest::Send(keys, tx)))?;
    Ok(wait(rx, Duration::from_secs(10)))
}

/// `{"cmd":"probe_keys","rate":N,"seed":S,"reliable":B}`: continuous key-routed probes
/// (rate 0 stops); reliable ones are reliable messages to the keys.
fn probe_keys(req: &Value, d: &Arc<Daemon>) -> Result<Value, String> {
    let rate = req
        .get("rate")
        .and_then(Value::as_u64)
        .filter(|r| *r <= 100_000)
        .ok_or("\"rate\": probes per second, 0..=100000 (0 stops)")?;
    let seed = req.get("seed").and_then(Value::as_u64).unwrap_or(1);
    let reliable = match req.get("reliable") {
        None => false,
        Some(v) => v.as_bool().ok_or("\"reliable\": true or false")?,
    };
    let (tx, rx) = mpsc::channel();
    let probe = KeysRequest::Probe {
        rate: rate as u32,
        seed,
        reliable,
        reply: tx,
    };
    ask(d, SERVICES, KEYS, Box::new(probe))?;
    Ok(wait(rx, Duration::from_secs(10)))
}

fn handle(req: &Value, d: &Arc<Daemon>) -> Result<Value, String> {
    let cmd = req.get("cmd").and_then(Value::as_str).unwrap_or("");
    tracing::debug!(cmd, "management request");
    match cmd {
        "status" => d.status(),
        "memory" => {
            // `trim`: give the allocator's free memory back first (tells retention by the
            // allocator from memory the program still holds).
            let asked = req.get("trim").and_then(Value::as_bool) == Some(true);
            let t = std::time::Instant::now();
            let trimmed = asked && torusnet_ops::process::trim();
            let mut v = torusnet_ops::process::memory().to_json();
            v["trimmed"] = json!(trimmed);
            if asked {
                v["trim_us"] = json!(t.elapsed().as_micros() as u64);
            }
            Ok(v)
        }
        "log" => match req.get("level").and_then(Value::as_str) {
            Some(l) => torusnet_ops::logging::set_level(l).map(|l| json!({"level": l})),
            None => Ok(json!({"level": torusnet_ops::logging::level()})),
        },
        "kv" => {
            // Not under the dataplane's lock: an operation may wait for its deadline.
            let shared = with_dp(d, |dp| Ok(dp.shared().clone()))?;
            if shared.kv.is_none() {
                return Err("the key-value store is off ([kv] enabled = false)".into());
            }
            let submit = crate::runtime::KvSubmit::new(shared);
            crate::kvgw::manage(&submit, req, Duration::from_secs(10))
        }
        "ping" => ping(req, d),
        "bench" => bench(req, d),
        "multicast" => multicast(req, d),
        "aggregate" => aggregate(req, d),
        "fault" => fault(req, d),
        "congestion" => congestion(req, d),
        "routing" => routing(req, d),
        "send_keys" => send_keys(req, d),
        "keys_seen" => {
            let reset = req.get("reset").and_then(Value::as_bool).unwrap_or(false);
            let (tx, rx) = mpsc::channel();
            ask(d, SERVICES, KEYS, Box::new(KeysRequest::Seen(reset, tx)))?;
            Ok(wait(rx, Duration::from_secs(10)))
        }
        "probe_keys" => probe_keys(req, d),
        "load" => load(req, d),
        "view" => apply_view(req, d),
        "shutdown" => {
            d.stop.store(true, Ordering::Release);
            Ok(json!({"ok": true}))
        }
        other => Err(format!(
            "unknown command {other:?} (status, log, kv, ping, bench, multicast, aggregate, fault, congestion, routing, send_keys, keys_seen, probe_keys, load, view, shutdown)"
        )),
    }
}

/// The built-in load generator: `{"cmd":"load","action":"start","peers":"all"|[...],"rate":N,
/// "min":B,"max":B,"dwell_ms":N,"seed":N,"journal":PATH}`, `"stop"`, `"report"`.
fn load(req: &Value, d: &Arc<Daemon>) -> Result<Value, String> {
    let action = req
        .get("action")
        .and_then(Value::as_str)
        .unwrap_or("report");
    let (me, dims) = with_dp(d, |dp| Ok((dp.shared().coord, dp.shared().dims)))?;
    let limit = Duration::from_secs(10);
    let (tx, rx) = mpsc::channel();
    let r = match action {
        "start" => {
            let peers: Vec<Coord> = match req.get("peers") {
                None => dims.coords().filter(|c| *c != me).collect(),
                Some(Value::String(s)) if s == "all" => {
                    dims.coords().filter(|c| *c != me).collect()
                }
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|p| {
                        let c: Coord = p
                            .as_str()
                            .ok_or("peers: strings x,y,z")?
                            .parse()
                            .map_err(|e| format!("peers: {e}"))?;
                        dims.check(c).map_err(|e| format!("peers: {e}"))
                    })
                    .collect::<Result<_, String>>()?,
                Some(_) => return Err("peers: \"all\" or a list of x,y,z".into()),
            };
            let num = |k: &str, def: u64, lo: u64, hi: u64| -> Result<u64, String> {
                match req.get(k) {
                    None => Ok(def),
                    Some(v) => v
                        .as_u64()
                        .filter(|x| (lo..=hi).contains(x))
                        .ok_or(format!("{k}: {lo}..={hi}")),
                }
            };
            let rate = num("rate", 100, 1, 1_000_000)? as u32;
            let min = num("min", 64, 17, 64 << 20)? as usize;
            let max = num("max", 4096, 17, 64 << 20)? as usize;
            if min > max {
                return Err(format!("min {min} is above max {max}"));
            }
            let dwell = Duration::from_millis(num("dwell_ms", 500, 1, 3_600_000)?);
            let seed = num("seed", 1, 0, u64::MAX)?;
            let journal: Option<Box<dyn std::io::Write + Send>> =
                match req.get("journal").and_then(Value::as_str) {
                    Some(path) => Some(Box::new(
                        std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(path)
                            .map_err(|e| format!("journal {path}: {e}"))?,
                    )),
                    None => None,
                };
            LoadRequest::Start {
                peers,
                rate,
                sizes: (min, max),
                dwell,
                seed,
                journal,
                reply: tx,
            }
        }
        "stop" => LoadRequest::Stop(tx),
        "report" => LoadRequest::Report(tx),
        other => {
            return Err(format!(
                "load: unknown action {other:?} (start, stop, report)"
            ))
        }
    };
    ask(d, SERVICES, LOAD, Box::new(r))?;
    Ok(wait(rx, limit))
}

/// A view request as the control process sends it, read and checked.
#[derive(Debug)]
struct ViewUpdate {
    dims: Dims,
    /// Where the control process places this server.
    me: Coord,
    view: LinkView,
    /// The neighbours' MAC addresses by direction, those given.
    macs: [Option<[u8; 6]>; 6],
    /// What changed, for the log.
    summary: String,
}

/// Reads a view request (`{"cmd":"view","dims":..,"coord":..,"down_servers":[..],
/// "down_links":[..],"joining":[..],"neighbors":{..}}`): every field checked against the
/// torus it names.
fn parse_view(req: &Value) -> Result<ViewUpdate, String> {
    let dims: Dims = req
        .get("dims")
        .and_then(Value::as_str)
        .ok_or("missing \"dims\"")?
        .parse()
        .map_err(|e| format!("dims: {e}"))?;
    let me = dims
        .check(coord(req, "coord")?)
        .map_err(|e| format!("coord: {e}"))?;
    let mut view = LinkView::all_up(dims).map_err(|e| e.to_string())?;
    for s in req
        .get("down_servers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let c: Coord = s
            .as_str()
            .ok_or("down_servers: strings x,y,z")?
            .parse()
            .map_err(|e| format!("down_servers: {e}"))?;
        view.set_server(dims.check(c).map_err(|e| e.to_string())?, false)
            .map_err(|e| e.to_string())?;
    }
    for s in req
        .get("down_links")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = s.as_str().ok_or("down_links: strings x,y,z:DIR")?;
        let (c, dir) = s
            .split_once(':')
            .ok_or_else(|| format!("down_links: {s:?}"))?;
        let c: Coord = c.parse().map_err(|e| format!("down_links: {e}"))?;
        let dir: Dir = dir.parse().map_err(|e| format!("down_links: {e}"))?;
        view.set_link(dims.check(c).map_err(|e| e.to_string())?, dir, false)
            .map_err(|e| e.to_string())?;
    }
    // Servers that relay but do not take keys yet (absent from older control processes).
    for s in req
        .get("joining")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let c: Coord = s
            .as_str()
            .ok_or("joining: strings x,y,z")?
            .parse()
            .map_err(|e| format!("joining: {e}"))?;
        view.set_joining(dims.check(c).map_err(|e| e.to_string())?, true)
            .map_err(|e| e.to_string())?;
    }
    let summary = format!(
        "servers down {}, links down {}, joining {}",
        req.get("down_servers").unwrap_or(&Value::Null),
        req.get("down_links").unwrap_or(&Value::Null),
        req.get("joining").unwrap_or(&Value::Null)
    );
    let mut macs = [None; 6];
    if let Some(n) = req.get("neighbors").and_then(Value::as_object) {
        for (k, v) in n {
            let dir: Dir = k.parse().map_err(|e| format!("neighbors: {e}"))?;
            let m = v
                .as_str()
                .and_then(parse_mac)
                .ok_or_else(|| format!("neighbors: bad MAC for {k}"))?;
            macs[usize::from(dir.index())] = Some(m);
        }
    }
    Ok(ViewUpdate {
        dims,
        me,
        view,
        macs,
        summary,
    })
}

/// The fuzz body of the management socket's requests (`fuzz/`'s `mgmt`, and a short run in
/// the tests): lines of any bytes parse as JSON or not without a panic, and a view request,
/// the largest request torusd reads (the control process sends it), is refused or yields
/// a view of the torus it names, with this server in it.
pub fn check_untrusted(data: &[u8]) {
    for line in data.split(|b| *b == b'\n') {
        let Ok(req) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        let _ = coord(&req, "to");
        let _ = timeout(&req, Duration::from_secs(1));
        if let Ok(v) = parse_view(&req) {
            assert_eq!(v.view.dims(), v.dims);
            assert!(v.dims.contains(v.me), "{} outside {}", v.me, v.dims);
        }
    }
}

/// A view published by the control process: the first one starts a dataplane that waited
/// for its coordinate; later ones are adopted by every poller before the answer goes back.
fn apply_view(req: &Value, d: &Arc<Daemon>) -> Result<Value, String> {
    let t0 = Instant::now();
    let ViewUpdate {
        dims,
        me,
        view,
        macs,
        summary,
    } = parse_view(req)?;
    let changed = {
        let mut last = d.last_view.lock();
        let changed = *last != summary;
        *last = summary.clone();
        changed
    };
    if changed {
        tracing::info!(coord = %me, "view adopted: {summary}");
    } else {
        tracing::debug!(coord = %me, "view re-published unchanged");
    }
    {
        let mut cfg = d.cfg.lock();
        if dims != cfg.dims {
            return Err(format!(
                "the control process runs a {dims} torus, this dataplane {}",
                cfg.dims
            ));
        }
        if let Some(c) = cfg.coord {
            if c != me {
                return Err(format!(
                    "the control process places this server at {me}, the config at {c}"
                ));
            }
        }
        let mut dp = d.dp.lock();
        if dp.is_none() {
            cfg.coord = Some(me);
            cfg.view = view;
            for l in cfg.links.iter_mut() {
                if let Some(m) = macs[usize::from(l.dir.index())] {
                    l.neighbor_mac = Some(m);
                }
            }
            *dp = Some(Dataplane::start(&cfg).map_err(|e| {
                tracing::error!(coord = %me, "cannot start the dataplane: {e}");
                e.to_string()
            })?);
            tracing::info!(coord = %me, "coordinate from the control process: dataplane started");
            return Ok(
                json!({"ok": true, "started": true, "applied_us": t0.elapsed().as_micros() as u64}),
            );
        }
    }
    let (tx, rx) = mpsc::channel();
    let pollers = with_dp(d, |dp| {
        // The XDP program follows the view first: both executors of the one routing
        // decision change within this request.
        dp.shared().with_xdp(|x| x.adopt_view(&view, &macs));
        push(dp, Command::SetView(Box::new(view), macs, Some(tx)))?;
        Ok(dp.status().engine.pollers.max(1))
    })?;
    for _ in 0..pollers {
        rx.recv_timeout(Duration::from_secs(2))
            .map_err(|_| "the pollers did not adopt the view in time".to_string())?;
    }
    Ok(json!({"ok": true, "applied_us": t0.elapsed().as_micros() as u64}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_request_is_read_whole_or_refused() {
        let good = json!({
            "cmd": "view", "dims": "3x3x3", "coord": "1,2,0",
            "down_servers": ["2,2,2"], "down_links": ["0,0,0:+x"], "joining": ["1,1,1"],
            "neighbors": {"+x": "02:00:00:00:00:01", "-y": "02:00:00:00:00:02"},
        });
        let v = parse_view(&good).expect("a good view");
        assert_eq!(
            (v.dims, v.me),
            ("3x3x3".parse().unwrap(), Coord::new(1, 2, 0))
        );
        assert!(!v.view.is_up(Coord::new(2, 2, 2)));
        assert_eq!(v.macs.iter().filter(|m| m.is_some()).count(), 2);
        for (field, bad) in [
            ("coord", json!("3,0,0")),
            ("dims", json!("0x3x3")),
            ("down_servers", json!(["9,9,9"])),
            ("down_links", json!(["0,0,0:+w"])),
            ("joining", json!([7])),
            ("neighbors", json!({"+x": "02:00"})),
        ] {
            let mut r = good.clone();
            r[field] = bad;
            assert!(parse_view(&r).is_err(), "{field}: {r}");
        }
    }

    #[test]
    fn a_short_fuzz_run() {
        let seeds: Vec<Vec<u8>> = [
            r#"{"cmd":"view","dims":"3x3x3","coord":"1,2,0","down_servers":["2,2,2"],"down_links":["0,0,0:+x"],"joining":["1,1,1"],"neighbors":{"+x":"02:00:00:00:00:01"}}"#,
            r#"{"cmd":"view","dims":"16x16x16","coord":"15,15,15","down_links":["15,15,15:-z","0,0,0:+y"]}"#,
            r#"{"cmd":"bench","to":"1,0,0","bytes":1000000,"timeout_ms":5000}"#,
            r#"{"cmd":"ping","to":"2,2,2","count":10,"reliable":true}"#,
            "{\"cmd\":\"status\"}\n{\"cmd\":\"log\",\"level\":\"debug\"}",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
        let ws = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        torusnet_proto::fuzz::write_seeds(&ws, "mgmt", &seeds);
        torusnet_proto::fuzz::run(&seeds, 100_000, 28, check_untrusted);
    }
}
