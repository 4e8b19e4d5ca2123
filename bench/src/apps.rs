//! `torus-bench apps`: what attaching from a separate process costs, against the embedded
//! API, in the same run on the same link. Two servers joined by one veth pair; on the
//! receiving server an application (attached over its channel) echoes or swallows 64-byte
//! reliable messages. On the sending server, alternately:
//! - *app*: torusd runs as its own process and this process attaches to it (the channel);
//! - *embedded*: this process embeds the dataplane (`Dataplane::start`) and uses the
//!   `Service` API, the way a Rust program did before applications could attach.
//!
//! Each run measures aggregated 64-byte reliable messages per second (from the first send
//! to the last acknowledgement) and the ping-pong RTT of one 64-byte reliable message.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use torusnet_client::channel::{service_id, APP_HEADER};
use torusnet_client::{Address, Client, Dest, Error, Event, SendOptions, Wait};
use torusnet_dataplane::config::NodeConfig;
use torusnet_dataplane::runtime::{Dataplane, ServiceAt};
use torusnet_proto::node::{Event as NodeEvent, MsgOptions, Target};
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::SendError;

use crate::measure::Latency;
use crate::stack::{self, Setup};

/// Arguments of `torus-bench apps`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Messages per throughput measurement.
    #[arg(long, default_value_t = 200_000)]
    messages: u64,
    /// Round trips per latency measurement.
    #[arg(long, default_value_t = 20_000)]
    pings: u32,
    /// Alternating runs of each method (the headline is their median).
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// Busy polling in both torusds (one core each) instead of adaptive.
    #[arg(long)]
    busy: bool,
    /// Where the JSON results go.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

const PEER: &str = "bench-peer";
const EMBEDDED_SERVICE: u16 = 900;

/// One method's figures in one run.
#[derive(Debug, Clone, serde::Serialize)]
struct Figures {
    messages_per_s: f64,
    rtt: Latency,
}

fn apps_socket(mgmt: &std::path::Path) -> std::path::PathBuf {
    let stem = mgmt
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    mgmt.with_file_name(format!("{stem}-apps.sock"))
}

/// The receiving application: echoes messages that start with `E`, swallows the rest.
fn peer(socket: std::path::PathBuf, stop: Arc<AtomicBool>) -> Result<(), String> {
    let mut c = Client::attach(&socket, PEER).map_err(|e| e.to_string())?;
    c.set_spin(spin(a_busy()));
    while !stop.load(Ordering::Acquire) {
        match c.recv(Wait::Timeout(Duration::from_millis(100))) {
            Ok(Some(Event::Message { from, data, .. })) if data.first() == Some(&b'E') => {
                while let Err(Error::WouldBlock) =
                    c.send(Dest::Service(from), &data, SendOptions::reliable())
                {
                    std::thread::yield_now();
                }
            }
            // Echoes still on their way when the sender's torusd stops between methods
            // are reported failed: expected.
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

/// How long applications spin before sleeping: on a two-core machine whose cores the
/// pollers need, a spinning application only delays them (the kernel's time slice is
/// milliseconds), so with adaptive polling they sleep at once.
fn spin(busy: bool) -> Duration {
    if busy {
        Duration::from_micros(20)
    } else {
        Duration::ZERO
    }
}

fn a_busy() -> bool {
    BUSY.load(Ordering::Relaxed)
}

static BUSY: AtomicBool = AtomicBool::new(false);

fn msg(kind: u8) -> Vec<u8> {
    let mut m = vec![0x5a; 64];
    m[0] = kind;
    m
}

/// The separate-process method: attach to the sender's torusd.
fn app_run(socket: &std::path::Path, to: Address, a: &Args) -> Result<Figures, String> {
    let mut c = Client::attach(socket, "bench-app").map_err(|e| e.to_string())?;
    c.set_spin(spin(a.busy));
    c.notify_acks(true).map_err(|e| e.to_string())?;
    let sink = msg(b'S');
    let t0 = Instant::now();
    let (mut sent, mut acked) = (0u64, 0u64);
    let deadline = t0 + Duration::from_secs(120);
    while acked < a.messages {
        if Instant::now() > deadline {
            return Err(format!("app: only {acked} of {} acknowledged", a.messages));
        }
        while sent < a.messages {
            match c.send(Dest::Service(to), &sink, SendOptions::reliable()) {
                Ok(_) => sent += 1,
                Err(Error::WouldBlock) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        // The channel is full: wait for reports instead of spinning (a spinning sender takes
        // the core the pollers need on a small machine).
        let mut wait = Wait::Timeout(Duration::from_millis(1));
        while let Some(e) = c.recv(wait).map_err(|e| e.to_string())? {
            wait = Wait::NoWait;
            match e {
                Event::Acked { count, .. } => acked += count,
                Event::Failed { tag, reason, .. } => {
                    return Err(format!("app: message {tag} failed: {reason:?}"))
                }
                _ => {}
            }
        }
    }
    let rate = a.messages as f64 / t0.elapsed().as_secs_f64();
    let ping = msg(b'E');
    let mut rtts = Vec::with_capacity(a.pings as usize);
    for i in 0..a.pings + 1000 {
        let t = Instant::now();
        c.send(Dest::Service(to), &ping, SendOptions::reliable())
            .map_err(|e| e.to_string())?;
        loop {
            match c
                .recv(Wait::Timeout(Duration::from_secs(2)))
                .map_err(|e| e.to_string())?
            {
                Some(Event::Message { .. }) => break,
                Some(_) => continue,
                None => return Err("app: no echo in 2 s".into()),
            }
        }
        // The first thousand warm up.
        if i >= 1000 {
            rtts.push(t.elapsed().as_nanos() as u64);
        }
    }
    Ok(Figures {
        messages_per_s: rate,
        rtt: Latency::from_ns(rtts),
    })
}

/// The embedded method: this process runs the sender's dataplane and uses its API.
fn embedded_run(
    ns: &str,
    config: &std::path::Path,
    to: Address,
    a: &Args,
) -> Result<Figures, String> {
    torusnet_dataplane::netns::enter(ns).map_err(|e| e.to_string())?;
    let mut cfg = NodeConfig::load(config).map_err(|e| e.to_string())?;
    cfg.apps = None;
    let dp = Dataplane::start(&cfg).map_err(|e| e.to_string())?;
    let svc = dp.service(EMBEDDED_SERVICE);
    svc.notify_acks(true).map_err(|e| e.to_string())?;
    let target = Target::Server(Coord::new(to.server.0, to.server.1, to.server.2));
    // What an application's message looks like on the torus: the app header first.
    let framed = |m: Vec<u8>| {
        let mut f = Vec::with_capacity(APP_HEADER + m.len());
        f.extend_from_slice(&EMBEDDED_SERVICE.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&m);
        f
    };
    let opts = MsgOptions {
        reliable: true,
        from: Some(EMBEDDED_SERVICE),
        ..MsgOptions::default()
    };
    let at = ServiceAt::new(target, to.service);
    // The first messages wait for the handshake with the peer: warm up.
    let warm = framed(msg(b'E'));
    svc.send_blocking(at, &warm, opts, Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    let until = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    loop {
        match svc.recv_timeout(Duration::from_millis(100)) {
            Some(NodeEvent::Message { .. }) => break,
            Some(e) => seen.push(format!("{e:?}")),
            None if Instant::now() > until => {
                let st = serde_json::to_string(&dp.status().engine.transport).unwrap_or_default();
                return Err(format!(
                    "embedded: no echo to the warm-up (events {seen:?}, transport {st})"
                ));
            }
            None => {}
        }
    }
    let sink = framed(msg(b'S'));
    let t0 = Instant::now();
    let (mut sent, mut acked) = (0u64, 0u64);
    let deadline = t0 + Duration::from_secs(120);
    while acked < a.messages {
        if Instant::now() > deadline {
            return Err(format!(
                "embedded: only {acked} of {} acknowledged",
                a.messages
            ));
        }
        while sent < a.messages {
            match svc.send(at, &sink, MsgOptions { tag: sent, ..opts }) {
                Ok(()) => sent += 1,
                Err(SendError::WouldBlock) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        let mut first = svc.recv_timeout(Duration::from_millis(1));
        while let Some(e) = first.take().or_else(|| svc.recv()) {
            match e {
                NodeEvent::Acked { count, .. } => acked += u64::from(count),
                NodeEvent::Failed { reason, .. } => return Err(format!("embedded: {reason}")),
                _ => {}
            }
        }
    }
    // The warm-up's acknowledgement may come with the last ones.
    let rate = a.messages as f64 / t0.elapsed().as_secs_f64();
    let ping = framed(msg(b'E'));
    let mut rtts = Vec::with_capacity(a.pings as usize);
    for i in 0..a.pings + 1000 {
        let t = Instant::now();
        svc.send_blocking(at, &ping, opts, Duration::from_secs(2))
            .map_err(|e| e.to_string())?;
        loop {
            match svc.recv_timeout(Duration::from_secs(2)) {
                Some(NodeEvent::Message { .. }) => break,
                Some(_) => continue,
                None => return Err("embedded: no echo in 2 s".into()),
            }
        }
        if i >= 1000 {
            rtts.push(t.elapsed().as_nanos() as u64);
        }
    }
    dp.shutdown().map_err(|e| e.to_string())?;
    Ok(Figures {
        messages_per_s: rate,
        rtt: Latency::from_ns(rtts),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Prints the medians of the alternating runs, and writes every run's figures.
fn report(a: &Args, app: &[Figures], emb: &[Figures]) -> Result<(), String> {
    let m = |v: &[Figures], f: fn(&Figures) -> f64| median(v.iter().map(f).collect());
    let (app_rate, emb_rate) = (m(app, |f| f.messages_per_s), m(emb, |f| f.messages_per_s));
    let (app_p50, emb_p50) = (m(app, |f| f.rtt.p50), m(emb, |f| f.rtt.p50));
    let (app_p99, emb_p99) = (m(app, |f| f.rtt.p99), m(emb, |f| f.rtt.p99));
    println!(
        "64 B reliable, one veth link, {} polling, median of {} alternating runs:",
        if a.busy { "busy" } else { "adaptive" },
        a.runs
    );
    println!("  method     messages/s   RTT p50 us   RTT p99 us");
    println!("  app        {app_rate:>10.0}   {app_p50:>10.1}   {app_p99:>10.1}");
    println!("  embedded   {emb_rate:>10.0}   {emb_p50:>10.1}   {emb_p99:>10.1}");
    println!(
        "  app / embedded: {:.2}x messages/s; RTT p50 {:+.1} us",
        app_rate / emb_rate,
        app_p50 - emb_p50
    );
    let v = json!({
        "polling": if a.busy { "busy" } else { "adaptive" },
        "messages": a.messages,
        "pings": a.pings,
        "app": app,
        "embedded": emb,
        "median": {
            "app_messages_per_s": app_rate,
            "embedded_messages_per_s": emb_rate,
            "ratio": app_rate / emb_rate,
            "app_rtt_p50_us": app_p50,
            "embedded_rtt_p50_us": emb_p50,
            "rtt_p50_difference_us": app_p50 - emb_p50,
            "app_rtt_p99_us": app_p99,
            "embedded_rtt_p99_us": emb_p99,
        },
    });
    if let Some(out) = &a.out {
        std::fs::write(out, serde_json::to_string_pretty(&v).unwrap_or_default())
            .map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(())
}

/// Runs the comparison and prints (and writes) the figures.
pub fn run(a: &Args) -> Result<(), String> {
    let s = Setup {
        mtu: 1500,
        links: 1,
        hops: 0,
        busy: a.busy,
        aggregate: true,
        transit: true,
        xdp_transit: true,
    };
    BUSY.store(a.busy, Ordering::Relaxed);
    let tag = format!("ba{}", std::process::id() % 10000);
    let mut r = stack::build(&tag, &s, None)?;
    stack::start(&mut r, &s);
    let stop = Arc::new(AtomicBool::new(false));
    let peer_sock = apps_socket(&r.cluster.servers[r.rx].socket);
    let p = {
        let stop = stop.clone();
        std::thread::spawn(move || peer(peer_sock, stop))
    };
    std::thread::sleep(Duration::from_millis(300));
    let to = Address {
        server: (r.to.x, r.to.y, r.to.z),
        service: service_id(PEER),
    };
    let app_sock = apps_socket(&r.cluster.servers[r.tx].socket);
    let ns = r.cluster.servers[r.tx].ns.name().to_string();
    let config = r.cluster.config_path(r.tx);
    let mut app = Vec::new();
    let mut emb = Vec::new();
    for run in 0..a.runs {
        let f = app_run(&app_sock, to, a)?;
        eprintln!(
            "run {}: app      {:>10.0} msg/s, RTT p50 {:.1} us p99 {:.1} us",
            run + 1,
            f.messages_per_s,
            f.rtt.p50,
            f.rtt.p99
        );
        app.push(f);
        r.cluster.stop(r.tx);
        let (ns2, cfg2) = (ns.clone(), config.clone());
        let e = {
            // A thread of its own: it enters the sender's namespace.
            let args = Args {
                messages: a.messages,
                pings: a.pings,
                runs: a.runs,
                busy: a.busy,
                out: None,
            };
            let r2 = std::thread::spawn(move || embedded_run(&ns2, &cfg2, to, &args))
                .join()
                .map_err(|_| "embedded run panicked".to_string())?;
            if r2.is_err() {
                let st = r.cluster.ctl(r.rx, &json!({"cmd": "status"}));
                eprintln!(
                    "receiver: {:?}",
                    st.map(|v| (v["apps"].clone(), v["engine"]["transport"].clone()))
                );
                if p.is_finished() {
                    eprintln!("the peer application thread has stopped");
                }
            }
            r2?
        };
        eprintln!(
            "run {}: embedded {:>10.0} msg/s, RTT p50 {:.1} us p99 {:.1} us",
            run + 1,
            e.messages_per_s,
            e.rtt.p50,
            e.rtt.p99
        );
        emb.push(e);
        r.cluster.restart(r.tx);
    }
    stop.store(true, Ordering::Release);
    match p.join() {
        Ok(Err(e)) => eprintln!("the peer application stopped: {e}"),
        Err(_) => eprintln!("the peer application panicked"),
        Ok(Ok(())) => {}
    }
    report(a, &app, &emb)
}
