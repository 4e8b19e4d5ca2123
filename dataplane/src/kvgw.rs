//! The memcached gateway: a TCP listener (port 11211 by default) that speaks the memcached
//! text protocol to any client and turns each command into operations of the key-value
//! service (`torusnet_services::kv`). The protocol itself (parsing, answer formats) is
//! sans-IO in `kv::memcached`; this module only moves bytes and waits for answers.
//!
//! One thread per connection, at most `max_connections` (memcached's answer beyond that:
//! `SERVER_ERROR too many open connections`, then close). A connection's commands run in
//! order, each answered before the next starts (a multi-key get asks for its keys at once),
//! so a client always reads its own writes. Bad input is answered (`ERROR`,
//! `CLIENT_ERROR ...`) and the connection stays open; every wait has a deadline.
//!
//! The gateway is generic over how it reaches the store ([`Submit`]), so the TCP baseline of
//! `torus-bench kv` runs the same gateway in front of the same service.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use torusnet_services::kv::memcached::{meta_flags, value_block, Meta, Parser, Request, StoreCmd};
use torusnet_services::kv::ops::{Mode, Op, Outcome, Ttl};
use torusnet_services::kv::{KvCounters, KvError, KvReply, KvRequest, KvStats};

/// The store on this server: the service's settings, its gateway, and disk mode.
#[derive(Debug, Clone)]
pub struct KvSettings {
    /// The service.
    pub service: torusnet_services::kv::KvConfig,
    /// The memcached gateway (`None`: none).
    pub gateway: Option<GatewayConfig>,
    /// Disk mode: the log.
    pub log: Option<std::path::PathBuf>,
}

/// Hands a request to the key-value service.
pub trait Submit: Send + Sync + 'static {
    /// Queues `req` for the service (an error: it cannot take it now).
    fn submit(&self, req: KvRequest) -> Result<(), String>;
}

/// How the gateway runs.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Where it listens.
    pub listen: SocketAddr,
    /// Most client connections at once.
    pub max_connections: usize,
    /// Largest value a client may store.
    pub max_item: usize,
    /// How long a command may wait for the store (the service answers by its own, shorter,
    /// deadline; this is the gateway's backstop).
    pub timeout: Duration,
}

/// The gateway's own counters.
#[derive(Debug, Default)]
pub struct GatewayCounters {
    /// Connections open now.
    pub connections: AtomicU64,
    /// Connections accepted since start.
    pub total_connections: AtomicU64,
    /// Connections refused (too many).
    pub rejected: AtomicU64,
    /// Commands served.
    pub commands: AtomicU64,
    /// Commands answered with an error for bad input.
    pub client_errors: AtomicU64,
}

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    /// Where it listens (the port chosen, if 0 was asked for).
    pub addr: SocketAddr,
    /// Its counters.
    pub counters: Arc<GatewayCounters>,
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Gateway {
    /// Stops accepting (connections close as their clients go).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

struct Ctx {
    cfg: GatewayConfig,
    submit: Arc<dyn Submit>,
    kv: Arc<KvCounters>,
    counters: Arc<GatewayCounters>,
    stop: Arc<AtomicBool>,
    started: SystemTime,
    /// The counts when a client last sent `stats reset` (zero before): `stats` reports the
    /// counters since then. The counters themselves go on counting, for the metrics, whose
    /// counters must never go backwards.
    reset: parking_lot::Mutex<StatCounts>,
}

/// The counts `stats` reports that `stats reset` sets back to zero, with the gauges beside.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct StatCounts {
    kv: KvStats,
    total_connections: u64,
    rejected: u64,
}

impl StatCounts {
    fn now(ctx: &Ctx) -> StatCounts {
        StatCounts {
            kv: ctx.kv.snapshot(),
            total_connections: ctx.counters.total_connections.load(Ordering::Relaxed),
            rejected: ctx.counters.rejected.load(Ordering::Relaxed),
        }
    }

    /// These counts since `base` (as memcached's `stats reset` would have left them):
    /// counters from `base` on, gauges (items held, bytes, cached copies, the slowest
    /// operation) as they are.
    fn since(&self, base: &StatCounts) -> StatCounts {
        let (k, b) = (&self.kv, &base.kv);
        let d = |now: u64, then: u64| now.saturating_sub(then);
        StatCounts {
            kv: KvStats {
                ops: d(k.ops, b.ops),
                hits: d(k.hits, b.hits),
                misses: d(k.misses, b.misses),
                writes: d(k.writes, b.writes),
                timeouts: d(k.timeouts, b.timeouts),
                retries: d(k.retries, b.retries),
                primary_ops: d(k.primary_ops, b.primary_ops),
                redirects: d(k.redirects, b.redirects),
                copies_sent: d(k.copies_sent, b.copies_sent),
                copies_applied: d(k.copies_applied, b.copies_applied),
                replica_failures: d(k.replica_failures, b.replica_failures),
                not_primary: d(k.not_primary, b.not_primary),
                fetches: d(k.fetches, b.fetches),
                invalidations: d(k.invalidations, b.invalidations),
                lease_waits: d(k.lease_waits, b.lease_waits),
                cache_hits: d(k.cache_hits, b.cache_hits),
                cache_misses: d(k.cache_misses, b.cache_misses),
                cache_evictions: d(k.cache_evictions, b.cache_evictions),
                catchup_sent: d(k.catchup_sent, b.catchup_sent),
                rereplicated: d(k.rereplicated, b.rereplicated),
                flushes: d(k.flushes, b.flushes),
                refused: d(k.refused, b.refused),
                slow_ops: d(k.slow_ops, b.slow_ops),
                ..*k
            },
            total_connections: d(self.total_connections, base.total_connections),
            rejected: d(self.rejected, base.rejected),
        }
    }
}

/// Starts a gateway in front of the service reached through `submit`.
pub fn start(
    cfg: GatewayConfig,
    submit: Arc<dyn Submit>,
    kv: Arc<KvCounters>,
) -> std::io::Result<Gateway> {
    let listener = TcpListener::bind(cfg.listen)?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(GatewayCounters::default());
    let ctx = Arc::new(Ctx {
        cfg,
        submit,
        kv,
        counters: counters.clone(),
        stop: stop.clone(),
        started: SystemTime::now(),
        reset: parking_lot::Mutex::new(StatCounts::default()),
    });
    let thread = std::thread::Builder::new()
        .name("torusd-kvgw".into())
        .spawn(move || accept_loop(&listener, &ctx))?;
    Ok(Gateway {
        addr,
        counters,
        thread: Some(thread),
        stop,
    })
}

fn accept_loop(listener: &TcpListener, ctx: &Arc<Ctx>) {
    while !ctx.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let open = ctx.counters.connections.load(Ordering::Relaxed);
                if open as usize >= ctx.cfg.max_connections {
                    ctx.counters.rejected.fetch_add(1, Ordering::Relaxed);
                    let _ = s.write_all(b"SERVER_ERROR too many open connections\r\n");
                    continue;
                }
                ctx.counters.connections.fetch_add(1, Ordering::Relaxed);
                ctx.counters
                    .total_connections
                    .fetch_add(1, Ordering::Relaxed);
                let c = ctx.clone();
                let spawned = std::thread::Builder::new()
                    .name("torusd-kvconn".into())
                    .spawn(move || {
                        serve(s, &c);
                        c.counters.connections.fetch_sub(1, Ordering::Relaxed);
                    });
                if spawned.is_err() {
                    ctx.counters.connections.fetch_sub(1, Ordering::Relaxed);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                // A few wake-ups a second to see whether to stop, not a hundred.
                torusnet_client::sys::wait_readable(listener.as_raw_fd(), 250);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Serves one client until it quits, closes, or the gateway stops.
fn serve(mut s: TcpStream, ctx: &Ctx) {
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_millis(250)));
    let mut parser = Parser::new(ctx.cfg.max_item);
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    loop {
        if ctx.stop.load(Ordering::Acquire) {
            return;
        }
        let n = match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        parser.feed(&buf[..n]);
        while let Some(req) = parser.next_request() {
            ctx.counters.commands.fetch_add(1, Ordering::Relaxed);
            if matches!(req, Request::Quit) {
                let _ = s.write_all(&out);
                return;
            }
            answer(ctx, req, &mut out);
            // Large answers go out as they are made; small ones leave together.
            if out.len() >= 64 * 1024 && s.write_all(&std::mem::take(&mut out)).is_err() {
                return;
            }
        }
        if !out.is_empty() && s.write_all(&std::mem::take(&mut out)).is_err() {
            return;
        }
    }
}

/// Opens the store's disk log: reads back what it holds (`epoch_us`: this run's wall-clock
/// microseconds at time zero), rewrites it compacted (through a temporary file, so a crash
/// leaves the old or the new one), and opens it for appending.
pub fn open_log(
    path: &std::path::Path,
    epoch_us: u64,
) -> std::io::Result<(
    Vec<torusnet_services::kv::log::Record>,
    Box<dyn Write + Send>,
)> {
    use torusnet_services::kv::log;
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let (records, _good) = log::read(&bytes, epoch_us);
    let records = log::compact(records);
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        let mut w = std::io::BufWriter::new(&mut f);
        for r in &records {
            w.write_all(&r.encode(epoch_us))?;
        }
        w.flush()?;
        drop(w);
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    let f = std::fs::OpenOptions::new().append(true).open(path)?;
    Ok((records, Box::new(std::io::BufWriter::new(f))))
}

/// A management request for the store (`{"cmd": "kv", "op": ...}` on torusd's socket, and
/// `torusctl kv`): `get`, `set` (`value`, optional `ttl` seconds), `delete`, `stats`,
/// `held` (the keys this server holds), `flush`.
pub fn manage(
    submit: &dyn Submit,
    req: &serde_json::Value,
    wait: Duration,
) -> Result<serde_json::Value, String> {
    use serde_json::{json, Value};
    let op = req.get("op").and_then(Value::as_str).unwrap_or("");
    let key = || -> Result<Vec<u8>, String> {
        let k = req
            .get("key")
            .and_then(Value::as_str)
            .ok_or("kv: give a key")?;
        if k.is_empty() || k.len() > 250 || k.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err("kv: a key is 1..=250 bytes without spaces or control characters".into());
        }
        Ok(k.as_bytes().to_vec())
    };
    let one = |key: Vec<u8>, o: Op| -> Result<Outcome, String> {
        let (tx, rx) = channel();
        submit.submit(KvRequest::Op {
            key,
            op: o,
            reply: tx,
        })?;
        match rx.recv_timeout(wait) {
            Ok(r) => r.result.map_err(|e| e.to_string()),
            Err(_) => Err("kv: no answer from the store".into()),
        }
    };
    let ask_json = |mk: fn(std::sync::mpsc::Sender<Value>) -> KvRequest| -> Result<Value, String> {
        let (tx, rx) = channel();
        submit.submit(mk(tx))?;
        rx.recv_timeout(wait)
            .map_err(|_| "kv: no answer from the store".to_string())
    };
    match op {
        "get" => Ok(match one(key()?, Op::Get)? {
            Outcome::Value(i) => match String::from_utf8(i.value.clone()) {
                Ok(s) => json!({"found": true, "value": s, "flags": i.flags, "cas": i.version}),
                Err(_) => {
                    let hex: String = i.value.iter().map(|b| format!("{b:02x}")).collect();
                    json!({"found": true, "value_hex": hex, "flags": i.flags, "cas": i.version})
                }
            },
            _ => json!({"found": false}),
        }),
        "set" => {
            let value = req
                .get("value")
                .and_then(Value::as_str)
                .ok_or("kv set: give a value")?;
            let exptime = req.get("ttl").and_then(Value::as_i64).unwrap_or(0);
            let o = Op::Store {
                mode: Mode::Set,
                value: value.as_bytes().to_vec(),
                flags: 0,
                ttl: ttl(exptime, unix_now()),
                cas: None,
            };
            match one(key()?, o)? {
                Outcome::Stored(v) => Ok(json!({"stored": true, "cas": v})),
                Outcome::Error(e) => Err(format!("kv set: {e}")),
                o => Err(format!("kv set: {o:?}")),
            }
        }
        "delete" => Ok(match one(key()?, Op::Delete { cas: None })? {
            Outcome::Deleted => json!({"deleted": true}),
            _ => json!({"deleted": false}),
        }),
        "stats" => ask_json(|reply| KvRequest::Stats { reply }),
        "held" => ask_json(|reply| KvRequest::Held { reply }),
        "flush" => {
            let (tx, rx) = channel();
            submit.submit(KvRequest::Flush {
                delay: 0,
                reply: tx,
            })?;
            match rx.recv_timeout(wait) {
                Ok(Ok(())) => Ok(json!({"flushed": true})),
                Ok(Err(e)) => Err(format!("kv flush: {e}")),
                Err(_) => Err("kv: no answer from the store".into()),
            }
        }
        other => Err(format!(
            "kv: unknown op {other:?} (get, set, delete, stats, held, flush)"
        )),
    }
}

/// memcached's exptime: 0 never, negative already expired, up to 30 days relative, beyond
/// that a Unix time.
pub fn ttl(exptime: i64, unix_now: i64) -> Ttl {
    const MONTH: i64 = 60 * 60 * 24 * 30;
    match exptime {
        0 => Ttl::Never,
        e if e < 0 => Ttl::Expired,
        e if e > MONTH => {
            let rel = e - unix_now;
            if rel <= 0 {
                Ttl::Expired
            } else {
                Ttl::Secs(u32::try_from(rel).unwrap_or(u32::MAX - 2))
            }
        }
        e => Ttl::Secs(e as u32),
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Asks the store; the answer or why there is none.
fn ask(ctx: &Ctx, key: &[u8], op: Op) -> Receiver<KvReply> {
    let (tx, rx) = channel();
    let req = KvRequest::Op {
        key: key.to_vec(),
        op,
        reply: tx.clone(),
    };
    if let Err(e) = ctx.submit.submit(req) {
        let _ = tx.send(KvReply {
            result: Err(KvError::Refused(e)),
            now: torusnet_proto::time::Time::ZERO,
        });
    }
    rx
}

fn wait(ctx: &Ctx, rx: &Receiver<KvReply>) -> Result<KvReply, KvError> {
    match rx.recv_timeout(ctx.cfg.timeout) {
        Ok(r) => r.result.clone().map(|_| r),
        Err(_) => Err(KvError::Timeout),
    }
}

fn run(ctx: &Ctx, key: &[u8], op: Op) -> Result<KvReply, KvError> {
    wait(ctx, &ask(ctx, key, op))
}

fn server_error(out: &mut Vec<u8>, e: &KvError) {
    out.extend_from_slice(format!("SERVER_ERROR {e}\r\n").as_bytes());
}

fn outcome(r: &KvReply) -> &Outcome {
    match &r.result {
        Ok(o) => o,
        Err(_) => &Outcome::NotFound,
    }
}

/// Remaining lifetime in seconds (-1: none), for meta `t`.
fn ttl_left(item: &torusnet_services::kv::store::Item, r: &KvReply) -> i64 {
    match item.expires {
        None => -1,
        Some(t) if t <= r.now => 0,
        Some(t) => t.since(r.now).as_secs_f64().ceil() as i64,
    }
}

fn answer(ctx: &Ctx, req: Request, out: &mut Vec<u8>) {
    match req {
        Request::Get { keys, cas } => gets(ctx, &keys, Op::Get, cas, out),
        Request::Gat { exptime, keys, cas } => {
            let t = ttl(exptime, unix_now());
            gets(ctx, &keys, Op::GetAndTouch(t), cas, out);
        }
        Request::Store {
            cmd,
            key,
            flags,
            exptime,
            data,
            cas,
            noreply,
        } => {
            let line = store(ctx, cmd, &key, flags, exptime, data, cas);
            reply(out, &line, noreply);
        }
        Request::Delete { key, noreply } => reply(out, &delete(ctx, &key), noreply),
        Request::Arith {
            key,
            incr,
            delta,
            noreply,
        } => reply(out, &arith(ctx, &key, incr, delta), noreply),
        Request::Touch {
            key,
            exptime,
            noreply,
        } => reply(out, &touch(ctx, &key, exptime), noreply),
        Request::FlushAll { delay, noreply } => reply(out, &flush_all(ctx, delay), noreply),
        Request::Stats(arg) => stats(ctx, arg.as_deref(), out),
        Request::Version => {
            out.extend_from_slice(
                format!("VERSION 1.6.0-torusnet-{}\r\n", env!("CARGO_PKG_VERSION")).as_bytes(),
            );
        }
        Request::Verbosity { noreply } => {
            if !noreply {
                out.extend_from_slice(b"OK\r\n");
            }
        }
        Request::Quit => {}
        Request::MetaGet { key, meta } => meta_get(ctx, &key, &meta, out),
        Request::MetaSet { key, data, meta } => meta_set(ctx, &key, data, &meta, out),
        Request::MetaDelete { key, meta } => meta_delete(ctx, &key, &meta, out),
        Request::MetaArith { key, meta } => meta_arith(ctx, &key, &meta, out),
        Request::MetaNoop => out.extend_from_slice(b"MN\r\n"),
        Request::Refused(line) => {
            ctx.counters.client_errors.fetch_add(1, Ordering::Relaxed);
            out.extend_from_slice(line.as_bytes());
        }
    }
}

/// Writes `line` unless the client asked for no reply.
fn reply(out: &mut Vec<u8>, line: &str, noreply: bool) {
    if !noreply {
        out.extend_from_slice(line.as_bytes());
    }
}

/// `set`, `add`, `replace`, `append`, `prepend`, `cas`: the answer line.
fn store(
    ctx: &Ctx,
    cmd: StoreCmd,
    key: &[u8],
    flags: u32,
    exptime: i64,
    data: Vec<u8>,
    cas: Option<u64>,
) -> String {
    let mode = match cmd {
        StoreCmd::Set | StoreCmd::Cas => Mode::Set,
        StoreCmd::Add => Mode::Add,
        StoreCmd::Replace => Mode::Replace,
        StoreCmd::Append => Mode::Append,
        StoreCmd::Prepend => Mode::Prepend,
    };
    let op = Op::Store {
        mode,
        value: data,
        flags,
        ttl: ttl(exptime, unix_now()),
        cas,
    };
    match run(ctx, key, op) {
        Ok(r) => match outcome(&r) {
            Outcome::Stored(_) => "STORED\r\n".to_string(),
            Outcome::NotStored => "NOT_STORED\r\n".into(),
            Outcome::Exists => "EXISTS\r\n".into(),
            Outcome::NotFound => "NOT_FOUND\r\n".into(),
            Outcome::Error(e) => format!("SERVER_ERROR {e}\r\n"),
            o => format!("SERVER_ERROR unexpected {o:?}\r\n"),
        },
        Err(e) => format!("SERVER_ERROR {e}\r\n"),
    }
}

/// `delete`: the answer line.
fn delete(ctx: &Ctx, key: &[u8]) -> String {
    match run(ctx, key, Op::Delete { cas: None }) {
        Ok(r) => match outcome(&r) {
            Outcome::Deleted => "DELETED\r\n".to_string(),
            _ => "NOT_FOUND\r\n".into(),
        },
        Err(e) => format!("SERVER_ERROR {e}\r\n"),
    }
}

/// `incr` and `decr`: the answer line.
fn arith(ctx: &Ctx, key: &[u8], incr: bool, delta: u64) -> String {
    let op = Op::Arith {
        incr,
        delta,
        init: None,
    };
    match run(ctx, key, op) {
        Ok(r) => match outcome(&r) {
            Outcome::Number(n, _) => format!("{n}\r\n"),
            Outcome::NonNumeric => {
                "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n".into()
            }
            Outcome::Error(e) => format!("SERVER_ERROR {e}\r\n"),
            _ => "NOT_FOUND\r\n".into(),
        },
        Err(e) => format!("SERVER_ERROR {e}\r\n"),
    }
}

/// `touch`: the answer line.
fn touch(ctx: &Ctx, key: &[u8], exptime: i64) -> String {
    match run(ctx, key, Op::Touch(ttl(exptime, unix_now()))) {
        Ok(r) => match outcome(&r) {
            Outcome::Touched => "TOUCHED\r\n".to_string(),
            _ => "NOT_FOUND\r\n".into(),
        },
        Err(e) => format!("SERVER_ERROR {e}\r\n"),
    }
}

/// `flush_all`, on every server: the answer line.
fn flush_all(ctx: &Ctx, delay: i64) -> String {
    let delay = match ttl(delay, unix_now()) {
        Ttl::Secs(s) => s,
        _ => 0,
    };
    let (tx, rx) = channel();
    match ctx.submit.submit(KvRequest::Flush { delay, reply: tx }) {
        Err(e) => format!("SERVER_ERROR {e}\r\n"),
        Ok(()) => match rx.recv_timeout(ctx.cfg.timeout) {
            Ok(Ok(())) => "OK\r\n".into(),
            Ok(Err(e)) => format!("SERVER_ERROR flush incomplete: {e}\r\n"),
            Err(_) => "SERVER_ERROR flush timed out\r\n".into(),
        },
    }
}

/// `md` (meta delete): writes its answer.
fn meta_delete(ctx: &Ctx, key: &[u8], meta: &Meta, out: &mut Vec<u8>) {
    let r = run(ctx, key, Op::Delete { cas: meta.compare });
    let code = match &r {
        Err(e) => return server_error(out, e),
        Ok(r) => match outcome(r) {
            Outcome::Deleted => "HD",
            Outcome::Exists => "EX",
            _ => "NF",
        },
    };
    if !(meta.quiet && code == "HD") {
        let f = meta_flags(
            &Meta {
                cas: false,
                ..meta.clone()
            },
            key,
            0,
            0,
            0,
            0,
        );
        out.extend_from_slice(format!("{code}{f}\r\n").as_bytes());
    }
}

fn gets(ctx: &Ctx, keys: &[Vec<u8>], op: Op, cas: bool, out: &mut Vec<u8>) {
    // All keys at once: they live on different primaries.
    let waits: Vec<Receiver<KvReply>> = keys.iter().map(|k| ask(ctx, k, op.clone())).collect();
    let mut block = Vec::new();
    for (k, rx) in keys.iter().zip(&waits) {
        match wait(ctx, rx) {
            Ok(r) => {
                if let Outcome::Value(i) = outcome(&r) {
                    value_block(&mut block, k, i.flags, &i.value, cas.then_some(i.version));
                }
            }
            Err(e) => return server_error(out, &e),
        }
    }
    out.extend_from_slice(&block);
    out.extend_from_slice(b"END\r\n");
}

fn meta_get(ctx: &Ctx, key: &[u8], meta: &Meta, out: &mut Vec<u8>) {
    let op = match meta.set_ttl {
        Some(t) => Op::GetAndTouch(ttl(t, unix_now())),
        None => Op::Get,
    };
    let r = match run(ctx, key, op) {
        Ok(r) => r,
        Err(e) => return server_error(out, &e),
    };
    match outcome(&r) {
        Outcome::Value(i) => {
            let f = meta_flags(
                meta,
                key,
                i.flags,
                i.value.len(),
                i.version,
                ttl_left(i, &r),
            );
            if meta.value {
                out.extend_from_slice(format!("VA {}{f}\r\n", i.value.len()).as_bytes());
                out.extend_from_slice(&i.value);
                out.extend_from_slice(b"\r\n");
            } else {
                out.extend_from_slice(format!("HD{f}\r\n").as_bytes());
            }
        }
        _ => {
            if !meta.quiet {
                out.extend_from_slice(b"EN\r\n");
            }
        }
    }
}

fn meta_set(ctx: &Ctx, key: &[u8], data: Vec<u8>, meta: &Meta, out: &mut Vec<u8>) {
    let mode = match meta.mode {
        None | Some(b'S' | b's') => Mode::Set,
        Some(b'E' | b'e') => Mode::Add,
        Some(b'A' | b'a') => Mode::Append,
        Some(b'P' | b'p') => Mode::Prepend,
        Some(b'R' | b'r') => Mode::Replace,
        Some(_) => {
            out.extend_from_slice(b"CLIENT_ERROR invalid mode for ms\r\n");
            return;
        }
    };
    let op = Op::Store {
        mode,
        value: data,
        flags: meta.set_flags.unwrap_or(0),
        ttl: ttl(meta.set_ttl.unwrap_or(0), unix_now()),
        cas: meta.compare,
    };
    let r = match run(ctx, key, op) {
        Ok(r) => r,
        Err(e) => return server_error(out, &e),
    };
    let (code, cas) = match outcome(&r) {
        Outcome::Stored(v) => ("HD", *v),
        Outcome::NotStored => ("NS", 0),
        Outcome::Exists => ("EX", 0),
        Outcome::NotFound => ("NF", 0),
        Outcome::Error(e) => {
            out.extend_from_slice(format!("SERVER_ERROR {e}\r\n").as_bytes());
            return;
        }
        _ => ("NS", 0),
    };
    if meta.quiet && code == "HD" {
        return;
    }
    let m = Meta {
        cas: meta.cas && cas != 0,
        flags: false,
        size: false,
        ttl: false,
        ..meta.clone()
    };
    let f = meta_flags(&m, key, 0, 0, cas, 0);
    out.extend_from_slice(format!("{code}{f}\r\n").as_bytes());
}

fn meta_arith(ctx: &Ctx, key: &[u8], meta: &Meta, out: &mut Vec<u8>) {
    let incr = match meta.mode {
        None | Some(b'I' | b'i' | b'+') => true,
        Some(b'D' | b'd' | b'-') => false,
        Some(_) => {
            out.extend_from_slice(b"CLIENT_ERROR invalid mode for ma\r\n");
            return;
        }
    };
    let init = meta
        .vivify
        .map(|t| (meta.initial.unwrap_or(0), ttl(t, unix_now())));
    let op = Op::Arith {
        incr,
        delta: meta.delta.unwrap_or(1),
        init,
    };
    let r = match run(ctx, key, op) {
        Ok(r) => r,
        Err(e) => return server_error(out, &e),
    };
    match outcome(&r) {
        Outcome::Number(n, v) => {
            if meta.quiet && !meta.value {
                return;
            }
            let m = Meta {
                flags: false,
                size: false,
                ttl: false,
                ..meta.clone()
            };
            let f = meta_flags(&m, key, 0, 0, *v, -1);
            if meta.value {
                let s = n.to_string();
                out.extend_from_slice(format!("VA {}{f}\r\n{s}\r\n", s.len()).as_bytes());
            } else {
                out.extend_from_slice(format!("HD{f}\r\n").as_bytes());
            }
        }
        Outcome::NonNumeric => out
            .extend_from_slice(b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"),
        Outcome::Error(e) => out.extend_from_slice(format!("SERVER_ERROR {e}\r\n").as_bytes()),
        _ => {
            if !meta.quiet {
                out.extend_from_slice(b"NF\r\n");
            }
        }
    }
}

fn stats(ctx: &Ctx, arg: Option<&str>, out: &mut Vec<u8>) {
    match arg {
        None | Some("") => {}
        Some("reset") => {
            *ctx.reset.lock() = StatCounts::now(ctx);
            out.extend_from_slice(b"RESET\r\n");
            return;
        }
        Some(_) => {
            // Sub-statistics (slabs, items, ...) have no meaning here: none to report.
            out.extend_from_slice(b"END\r\n");
            return;
        }
    }
    let since = StatCounts::now(ctx).since(&ctx.reset.lock());
    let k = since.kv;
    let g = &ctx.counters;
    let up = ctx.started.elapsed().map_or(0, |d| d.as_secs());
    let mut line = |name: &str, v: String| {
        out.extend_from_slice(format!("STAT {name} {v}\r\n").as_bytes());
    };
    line("pid", std::process::id().to_string());
    line("uptime", up.to_string());
    line("time", unix_now().to_string());
    line(
        "version",
        format!("1.6.0-torusnet-{}", env!("CARGO_PKG_VERSION")),
    );
    line(
        "pointer_size",
        (8 * std::mem::size_of::<usize>()).to_string(),
    );
    line(
        "curr_connections",
        g.connections.load(Ordering::Relaxed).to_string(),
    );
    line("total_connections", since.total_connections.to_string());
    line("rejected_connections", since.rejected.to_string());
    line("cmd_get", (k.hits + k.misses).to_string());
    line("cmd_set", k.writes.to_string());
    line("get_hits", k.hits.to_string());
    line("get_misses", k.misses.to_string());
    line("curr_items", k.items.to_string());
    line("bytes", k.bytes.to_string());
    line("evictions", k.cache_evictions.to_string());
    line("torus_timeouts", k.timeouts.to_string());
    line("torus_retries", k.retries.to_string());
    line("torus_slow_ops", k.slow_ops.to_string());
    line("torus_slowest_op_us", k.slowest_op_us.to_string());
    line("torus_cache_hits", k.cache_hits.to_string());
    line("torus_cache_misses", k.cache_misses.to_string());
    line("torus_cache_items", k.cache_items.to_string());
    line("torus_copies_sent", k.copies_sent.to_string());
    line("torus_rereplicated", k.rereplicated.to_string());
    line("torus_caught_up", k.caught_up.to_string());
    out.extend_from_slice(b"END\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nobody;
    impl Submit for Nobody {
        fn submit(&self, _: KvRequest) -> Result<(), String> {
            Err("no store in this test".into())
        }
    }

    /// Sends `cmd` and reads the answer up to its last line (`END` or `RESET`).
    fn ask(c: &mut TcpStream, cmd: &str) -> String {
        c.write_all(cmd.as_bytes()).expect("write");
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !(got.ends_with(b"END\r\n") || got.ends_with(b"RESET\r\n")) {
            let n = c.read(&mut buf).expect("read");
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    fn stat(text: &str, name: &str) -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    }

    #[test]
    fn stats_reset_sets_the_counters_back_to_zero_and_keeps_the_gauges() {
        let cfg = GatewayConfig {
            listen: "127.0.0.1:0".parse().expect("addr"),
            max_connections: 8,
            max_item: 1 << 20,
            timeout: Duration::from_secs(1),
        };
        let gw = start(cfg, Arc::new(Nobody), Arc::new(KvCounters::default())).expect("start");
        let timeout = Some(Duration::from_secs(5));
        let connect = || {
            let c = TcpStream::connect(gw.addr).expect("connect");
            c.set_read_timeout(timeout).expect("timeout");
            c
        };
        let extra: Vec<TcpStream> = (0..3).map(|_| connect()).collect();
        let mut c = connect();
        let before = ask(&mut c, "stats\r\n");
        assert_eq!(stat(&before, "total_connections"), 4, "{before}");
        assert_eq!(ask(&mut c, "stats reset\r\n"), "RESET\r\n");
        let after = ask(&mut c, "stats\r\n");
        assert_eq!(stat(&after, "total_connections"), 0, "{after}");
        // A gauge is not a count since the reset: the four connections are still open.
        assert_eq!(stat(&after, "curr_connections"), 4, "{after}");
        let _late = connect();
        // Accepted in the gateway's own time: until it counts the fifth open connection.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        let mut later = ask(&mut c, "stats\r\n");
        while stat(&later, "curr_connections") < 5 {
            assert!(std::time::Instant::now() < until, "{later}");
            std::thread::sleep(Duration::from_millis(5));
            later = ask(&mut c, "stats\r\n");
        }
        assert_eq!(stat(&later, "total_connections"), 1, "{later}");
        // The counters themselves (the metrics') never went back.
        assert_eq!(gw.counters.total_connections.load(Ordering::Relaxed), 5);
        drop(extra);
        gw.stop();
    }

    #[test]
    fn counts_since_a_reset_keep_the_gauges() {
        let now = StatCounts {
            kv: KvStats {
                hits: 10,
                misses: 4,
                items: 7,
                bytes: 700,
                slowest_op_us: 90,
                ..KvStats::default()
            },
            total_connections: 5,
            rejected: 1,
        };
        let s = now.since(&now);
        assert_eq!(
            (s.kv.hits, s.kv.misses, s.total_connections, s.rejected),
            (0, 0, 0, 0)
        );
        assert_eq!((s.kv.items, s.kv.bytes, s.kv.slowest_op_us), (7, 700, 90));
        // Counters below their base (a restarted store) read as zero, not as a wrap.
        let base = StatCounts {
            kv: KvStats {
                hits: 20,
                ..KvStats::default()
            },
            ..StatCounts::default()
        };
        assert_eq!(now.since(&base).kv.hits, 0);
    }

    #[test]
    fn exptimes_follow_memcached() {
        let now = 1_800_000_000;
        assert_eq!(ttl(0, now), Ttl::Never);
        assert_eq!(ttl(-1, now), Ttl::Expired);
        assert_eq!(ttl(10, now), Ttl::Secs(10));
        assert_eq!(ttl(60 * 60 * 24 * 30, now), Ttl::Secs(2_592_000));
        assert_eq!(ttl(now + 100, now), Ttl::Secs(100));
        assert_eq!(ttl(now - 1, now), Ttl::Expired);
    }
}
