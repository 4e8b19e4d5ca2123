//! `torus-bench rmem`: remote memory next to reliable messages of the same size, on the same
//! link, in the same run. Two servers joined by one veth pair, one application attached to
//! each torusd:
//! - 64 KiB writes: remote writes into the peer's region vs reliable messages to the peer
//!   application, goodput from the first submission to the last completion;
//! - 64 B round trips: a remote read of the peer's region vs a reliable ping-pong with the
//!   peer application echoing;
//! - CLAN's message queue (`torusnet_client::queue`): 64-byte messages per second one way,
//!   and the round trip through two queues with the peer echoing;
//! - 32 MiB messages: a long send pulled by the peer with remote reads vs a pushed reliable
//!   message, goodput and the sending side's CPU (its application thread and its torusd).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_client::channel::service_id;
use torusnet_client::queue::{QueueReceiver, QueueSender};
use torusnet_client::rmem::{Capability, Status, READ, WRITE};
use torusnet_client::{Address, AttachOptions, Client, Dest, Error, Event, LongEnd};
use torusnet_client::{LocalRegion, LongOptions, RemoteOptions, SendOptions, Wait};

use crate::measure::Latency;
use crate::stack::{self, Setup};

/// Arguments of `torus-bench rmem`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// 64 KiB operations per throughput measurement.
    #[arg(long, default_value_t = 20_000)]
    ops: u64,
    /// Round trips per latency measurement.
    #[arg(long, default_value_t = 5000)]
    pings: u32,
    /// Link MTU.
    #[arg(long, default_value_t = 9000)]
    mtu: u32,
    /// Busy polling in both torusds instead of adaptive.
    #[arg(long)]
    busy: bool,
    /// Where the JSON results go.
    #[arg(long, default_value = "bench/results/rmem.json")]
    out: std::path::PathBuf,
}

const PEER: &str = "rm-bench-peer";
/// Throughput rounds of each kind.
const ROUNDS: usize = 5;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
const SIZE: usize = 64 << 10;
/// Bytes of a long message.
const LONG: usize = 32 << 20;

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into our timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// One 32 MiB message's goodput (Gb/s) and the sending side's CPU per GB moved (seconds),
/// its application thread's and its torusd's apart (torusd's includes its pollers' spinning
/// while they wait), from the send to the sender's last news of it.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct LongFigure {
    gbps: f64,
    app_cpu_s_per_gb: f64,
    torusd_cpu_s_per_gb: f64,
}

/// Sends one long message with `send`, waits until `ended` says it ended, and measures.
fn long_figure(
    c: &Client,
    torusd: u32,
    send: impl FnOnce() -> Result<u64, String>,
    mut ended: impl FnMut(&Event, u64) -> Result<bool, String>,
) -> Result<LongFigure, String> {
    let (cpu0, d0, t0) = (
        thread_cpu(),
        crate::measure::process_cpu(torusd),
        Instant::now(),
    );
    let id = send()?;
    loop {
        match c.recv(Wait::Timeout(Duration::from_secs(30))).map_err(e)? {
            Some(ev) if ended(&ev, id)? => break,
            Some(_) => {}
            None => return Err("no end of the long message in 30 s".into()),
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let gb = LONG as f64 / 1e9;
    Ok(LongFigure {
        gbps: LONG as f64 * 8.0 / secs / 1e9,
        app_cpu_s_per_gb: (thread_cpu() - cpu0).as_secs_f64() / gb,
        torusd_cpu_s_per_gb: (crate::measure::process_cpu(torusd) - d0).as_secs_f64() / gb,
    })
}

/// A 32 MiB reliable message pushed to the peer, until it is acknowledged.
fn pushed(c: &Client, to: Address, torusd: u32, data: &[u8]) -> Result<LongFigure, String> {
    c.notify_acks(true).map_err(e)?;
    let f = long_figure(
        c,
        torusd,
        || {
            c.send(Dest::Service(to), data, SendOptions::reliable())
                .map_err(e)
        },
        |ev, id| match ev {
            Event::Acked { last_tag, .. } => Ok(*last_tag >= id),
            Event::Failed { tag, reason, .. } if *tag == id => {
                Err(format!("the pushed message failed: {reason:?}"))
            }
            _ => Ok(false),
        },
    );
    c.notify_acks(false).map_err(e)?;
    f
}

/// A 32 MiB long send pulled by the peer, until its end comes back.
fn pulled(c: &Client, to: Address, torusd: u32, src: &LocalRegion) -> Result<LongFigure, String> {
    long_figure(
        c,
        torusd,
        || {
            c.send_long(
                Dest::Service(to),
                src,
                0,
                LONG as u64,
                LongOptions::default(),
            )
            .map_err(e)
        },
        |ev, id| match ev {
            Event::LongDone { offer, end, .. } if *offer == id => match end {
                LongEnd::Pulled => Ok(true),
                other => Err(format!("the long send ended {other:?}")),
            },
            Event::Failed { tag, reason, .. } if *tag == id => {
                Err(format!("the offer failed: {reason:?}"))
            }
            _ => Ok(false),
        },
    )
}

fn apps_socket(mgmt: &std::path::Path) -> std::path::PathBuf {
    let stem = mgmt
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    mgmt.with_file_name(format!("{stem}-apps.sock"))
}

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

/// The peer application: echoes messages starting with `E`, swallows others, answers the
/// handshake with its capabilities, and echoes through the message queue.
fn peer(socket: std::path::PathBuf, stop: Arc<AtomicBool>) -> Result<(), String> {
    let pool = AttachOptions {
        pool: LONG as u64 + (16 << 20),
    };
    let c = Client::attach_with(&socket, PEER, pool).map_err(e)?;
    let region = c.register_region(8 << 20, READ | WRITE).map_err(e)?;
    let long_into = c.register_region(LONG as u64, READ | WRITE).map_err(e)?;
    // A client per queue end: a queue owns its client's events while it waits.
    let qc = Client::attach(&socket, "rm-bench-peer-q").map_err(e)?;
    let qc_tx = Client::attach(&socket, "rm-bench-peer-qtx").map_err(e)?;
    let mut q: Option<(QueueReceiver<'_>, QueueSender<'_>)> = None;
    let (mut qrx, ring) = QueueReceiver::new(&qc, 1024, 128).map_err(e)?;
    let mut started = false;
    while !stop.load(Ordering::Acquire) {
        if let Some((rx, tx)) = q.as_mut() {
            if let Some(m) = rx.recv(Duration::from_millis(1)).map_err(e)? {
                tx.send(&m, Duration::from_secs(5)).map_err(e)?;
            }
        }
        match c.recv(Wait::Timeout(Duration::from_millis(if q.is_some() {
            0
        } else {
            50
        }))) {
            Ok(Some(Event::LongOffer(o))) => {
                c.pull(&o, &long_into, 0, Duration::from_secs(60))
                    .map_err(e)?;
            }
            Ok(Some(Event::Message { from, data, .. })) => match data.first() {
                Some(b'E') => {
                    while let Err(Error::WouldBlock) =
                        c.send(Dest::Service(from), &data, SendOptions::reliable())
                    {
                        std::thread::yield_now();
                    }
                }
                Some(b'H') => {
                    // Handshake: the region's capability and the queue's ring.
                    let mut m = vec![b'C'];
                    m.extend_from_slice(&region.cap.encode());
                    m.extend_from_slice(&ring.encode());
                    c.send(Dest::Service(from), &m, SendOptions::reliable())
                        .map_err(e)?;
                }
                Some(b'Q') if !started => {
                    // The bench's queue: its ring, and the capability of its read index.
                    let back_ring = Capability::decode(&data[1..]).ok_or("bad ring")?;
                    let their_read = Capability::decode(&data[41..]).ok_or("bad cap")?;
                    qrx.connect(their_read);
                    let (tx, my_read) =
                        QueueSender::new(&qc_tx, back_ring, 1024, 128).map_err(e)?;
                    let mut m = vec![b'R'];
                    m.extend_from_slice(&my_read.encode());
                    c.send(Dest::Service(from), &m, SendOptions::reliable())
                        .map_err(e)?;
                    let rx =
                        std::mem::replace(&mut qrx, QueueReceiver::new(&qc, 1, 8).map_err(e)?.0);
                    q = Some((rx, tx));
                    started = true;
                }
                _ => {}
            },
            Ok(_) => {}
            Err(x) => return Err(x.to_string()),
        }
    }
    Ok(())
}

fn next_message(c: &Client, timeout: Duration) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(Event::Message { data, .. }) = c
            .recv(Wait::Timeout(Duration::from_millis(50)))
            .map_err(e)?
        {
            return Ok(data);
        }
    }
    Err("no answer from the peer".into())
}

/// 64 KiB reliable messages, goodput in Gb/s.
fn messages(c: &Client, to: Address, n: u64) -> Result<f64, String> {
    c.notify_acks(true).map_err(e)?;
    let data = vec![b'S'; SIZE];
    let t0 = Instant::now();
    let (mut sent, mut acked) = (0u64, 0u64);
    while acked < n {
        while sent < n {
            match c.send(Dest::Service(to), &data, SendOptions::reliable()) {
                Ok(_) => sent += 1,
                Err(Error::WouldBlock) => break,
                Err(x) => return Err(x.to_string()),
            }
        }
        let mut wait = Wait::Timeout(Duration::from_millis(1));
        while let Some(ev) = c.recv(wait).map_err(e)? {
            wait = Wait::NoWait;
            match ev {
                Event::Acked { count, .. } => acked += count,
                Event::Failed { tag, .. } => return Err(format!("message {tag} failed")),
                _ => {}
            }
        }
        if t0.elapsed() > Duration::from_secs(120) {
            return Err("messages: too slow".into());
        }
    }
    c.notify_acks(false).map_err(e)?;
    Ok(n as f64 * SIZE as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9)
}

/// 64 KiB remote writes, goodput in Gb/s.
fn writes(c: &Client, cap: &Capability, n: u64) -> Result<f64, String> {
    let data = vec![b'W'; SIZE];
    let slots = cap.len / SIZE as u64;
    let t0 = Instant::now();
    let (mut sent, mut done) = (0u64, 0u64);
    while done < n {
        while sent < n && sent - done < 256 {
            let off = (sent % slots) * SIZE as u64;
            match c.remote_write(cap, off, &data, RemoteOptions::default()) {
                Ok(_) => sent += 1,
                Err(Error::WouldBlock) => break,
                Err(x) => return Err(x.to_string()),
            }
        }
        let mut wait = Wait::Timeout(Duration::from_millis(1));
        while let Some(ev) = c.recv(wait).map_err(e)? {
            wait = Wait::NoWait;
            if let Event::RemoteDone { status, op, .. } = ev {
                if status != Status::Ok {
                    return Err(format!("write {op}: {}", status.name()));
                }
                done += 1;
            }
        }
        if t0.elapsed() > Duration::from_secs(120) {
            return Err("writes: too slow".into());
        }
    }
    Ok(n as f64 * SIZE as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9)
}

fn ping_pong(c: &Client, to: Address, n: u32) -> Result<Latency, String> {
    let m = {
        let mut m = vec![0x5a; 64];
        m[0] = b'E';
        m
    };
    let mut rtts = Vec::with_capacity(n as usize);
    for i in 0..n + 1000 {
        let t = Instant::now();
        c.send(Dest::Service(to), &m, SendOptions::reliable())
            .map_err(e)?;
        next_message(c, Duration::from_secs(2))?;
        if i >= 1000 {
            rtts.push(t.elapsed().as_nanos() as u64);
        }
    }
    Ok(Latency::from_ns(rtts))
}

fn remote_reads(c: &Client, cap: &Capability, n: u32) -> Result<Latency, String> {
    let local = c.register_region(4096, WRITE).map_err(e)?;
    let mut rtts = Vec::with_capacity(n as usize);
    for i in 0..n + 1000 {
        let t = Instant::now();
        let op = c
            .remote_read(cap, 0, 64, &local, 0, RemoteOptions::default())
            .map_err(e)?;
        let (s, _) = c.wait_remote(op, Duration::from_secs(2)).map_err(e)?;
        if s != Status::Ok {
            return Err(format!("read: {}", s.name()));
        }
        if i >= 1000 {
            rtts.push(t.elapsed().as_nanos() as u64);
        }
    }
    Ok(Latency::from_ns(rtts))
}

/// The message queue's figures: messages per second one way (echoed back), then the round
/// trip through the peer's echo queue.
fn queue_figures(
    c: &Client,
    sock: &std::path::Path,
    to: Address,
    ring: Capability,
    pings: u32,
) -> Result<(f64, Latency), String> {
    let qc = Client::attach(sock, "rm-bench-q").map_err(e)?;
    let (tx, my_read) = QueueSender::new(&qc, ring, 1024, 128).map_err(e)?;
    let qc_rx = Client::attach(sock, "rm-bench-qrx").map_err(e)?;
    let (rx, back_ring) = QueueReceiver::new(&qc_rx, 1024, 128).map_err(e)?;
    let mut m = vec![b'Q'];
    m.extend_from_slice(&back_ring.encode());
    m.extend_from_slice(&my_read.encode());
    c.send(Dest::Service(to), &m, SendOptions::reliable())
        .map_err(e)?;
    let ans = next_message(c, Duration::from_secs(5))?;
    let their_read = Capability::decode(ans.get(1..).unwrap_or(&[])).ok_or("bad queue answer")?;
    let (mut tx, mut rx) = (tx, rx);
    rx.connect(their_read);
    let n = 20_000u64;
    let msg = [7u8; 64];
    let t0 = Instant::now();
    let mut back = 0u64;
    // Never blocked on room while echoes wait to be read: the peer may be waiting for
    // room in our ring just as we wait for room in its.
    let mut sent = 0u64;
    while back < n {
        let before = (sent, back);
        while sent < n {
            match tx.push(&msg, Duration::ZERO) {
                Ok(()) => sent += 1,
                Err(Error::Timeout | Error::WouldBlock) => break,
                Err(x) => return Err(x.to_string()),
            }
            if sent.is_multiple_of(16) {
                tx.publish().map_err(e)?;
            }
        }
        tx.publish().map_err(e)?;
        while let Some(_m) = rx.recv(Duration::ZERO).map_err(e)? {
            back += 1;
        }
        if (sent, back) == before {
            if t0.elapsed() > Duration::from_secs(60) {
                return Err(format!("queue: {back} of {n} echoed"));
            }
            if rx.recv(Duration::from_millis(1)).map_err(e)?.is_some() {
                back += 1;
            }
        }
    }
    let q_rate = n as f64 / t0.elapsed().as_secs_f64();
    let mut rtts = Vec::new();
    for i in 0..pings.min(5000) + 500 {
        let t = Instant::now();
        tx.send(&msg, Duration::from_secs(5)).map_err(e)?;
        if rx.recv(Duration::from_secs(2)).map_err(e)?.is_none() {
            return Err("queue: no echo".into());
        }
        if i >= 500 {
            rtts.push(t.elapsed().as_nanos() as u64);
        }
    }
    let q_rtt = Latency::from_ns(rtts);
    Ok((q_rate, q_rtt))
}

/// Runs the comparison and writes the figures.
/// Rounds of a 32 MiB message pushed and pulled (a long send), alternating; medians.
fn long_figures(c: &Client, to: Address, sender_torusd: u32) -> Result<Value, String> {
    let long_data: Vec<u8> = (0..LONG).map(|i| (i * 7 + (i >> 12)) as u8).collect();
    let src = c.register_region(LONG as u64, READ).map_err(e)?;
    if !c.region_write(&src, 0, &long_data) {
        return Err("cannot fill the long send's region".into());
    }
    let (mut push, mut pull) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        push.push(pushed(c, to, sender_torusd, &long_data)?);
        pull.push(pulled(c, to, sender_torusd, &src)?);
        let (p, q) = (push[round], pull[round]);
        eprintln!(
            "round {}: 32 MiB pushed {:.2} Gb/s (CPU-s/GB app {:.3}, torusd {:.3}), long send pulled {:.2} Gb/s (app {:.3}, torusd {:.3})",
            round + 1,
            p.gbps,
            p.app_cpu_s_per_gb,
            p.torusd_cpu_s_per_gb,
            q.gbps,
            q.app_cpu_s_per_gb,
            q.torusd_cpu_s_per_gb
        );
    }
    let med = |v: &[LongFigure], f: fn(&LongFigure) -> f64| {
        median(&mut v.iter().map(f).collect::<Vec<_>>())
    };
    let (push_g, pull_g) = (med(&push, |f| f.gbps), med(&pull, |f| f.gbps));
    let (push_a, pull_a) = (
        med(&push, |f| f.app_cpu_s_per_gb),
        med(&pull, |f| f.app_cpu_s_per_gb),
    );
    let (push_d, pull_d) = (
        med(&push, |f| f.torusd_cpu_s_per_gb),
        med(&pull, |f| f.torusd_cpu_s_per_gb),
    );
    eprintln!(
        "32 MiB (median): pushed {push_g:.2} Gb/s (CPU-s/GB app {push_a:.3}, torusd {push_d:.3}), long send {pull_g:.2} Gb/s (app {pull_a:.3}, torusd {pull_d:.3})"
    );
    Ok(json!({
        "pushed_gbps": push_g,
        "pulled_gbps": pull_g,
        "pulled_over_pushed": pull_g / push_g.max(1e-9),
        "pushed_app_cpu_s_per_gb": push_a,
        "pulled_app_cpu_s_per_gb": pull_a,
        "app_cpu_pulled_over_pushed": pull_a / push_a.max(1e-9),
        "pushed_torusd_cpu_s_per_gb": push_d,
        "pulled_torusd_cpu_s_per_gb": pull_d,
        "torusd_cpu_pulled_over_pushed": pull_d / push_d.max(1e-9),
        "pushed_rounds": push,
        "pulled_rounds": pull,
    }))
}

pub fn run(a: &Args) -> Result<(), String> {
    let s = Setup {
        mtu: a.mtu,
        links: 1,
        hops: 0,
        busy: a.busy,
        aggregate: true,
        transit: true,
        xdp_transit: true,
    };
    let tag = format!("br{}", std::process::id() % 10000);
    let mut r = stack::build(&tag, &s, None)?;
    stack::start(&mut r, &s);
    let stop = Arc::new(AtomicBool::new(false));
    let peer_sock = apps_socket(&r.cluster.servers[r.rx].socket);
    let p = {
        let stop = stop.clone();
        std::thread::spawn(move || peer(peer_sock, stop))
    };
    let to = Address {
        server: (r.to.x, r.to.y, r.to.z),
        service: service_id(PEER),
    };
    let sock = apps_socket(&r.cluster.servers[r.tx].socket);
    let pool = AttachOptions {
        pool: LONG as u64 + (16 << 20),
    };
    let c = Client::attach_with(&sock, "rm-bench", pool).map_err(e)?;
    let sender_torusd = r.cluster.pid(r.tx).unwrap_or(0);
    // The handshake (the peer may still be attaching).
    let mut hello = None;
    for _ in 0..100 {
        let _ = c.send(Dest::Service(to), b"H", SendOptions::reliable());
        if let Ok(m) = next_message(&c, Duration::from_millis(200)) {
            if m.first() == Some(&b'C') && m.len() >= 81 {
                hello = Some(m);
                break;
            }
        }
    }
    let hello = hello.ok_or("the peer application never answered")?;
    let cap = Capability::decode(&hello[1..]).ok_or("bad capability")?;
    let ring = Capability::decode(&hello[41..]).ok_or("bad ring")?;
    let result = (|| -> Result<Value, String> {
        // Alternating rounds, medians: the two share the machine with four busy threads,
        // and one round of either swings by a third from scheduling alone.
        let (mut ms, mut ws) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            ms.push(messages(&c, to, a.ops / ROUNDS as u64)?);
            ws.push(writes(&c, &cap, a.ops / ROUNDS as u64)?);
            eprintln!(
                "round {}: 64 KiB reliable messages {:.2} Gb/s, remote writes {:.2} Gb/s",
                round + 1,
                ms[round],
                ws[round]
            );
        }
        let (msg_gbps, wr_gbps) = (median(&mut ms), median(&mut ws));
        eprintln!("64 KiB (median): reliable messages {msg_gbps:.2} Gb/s, remote writes {wr_gbps:.2} Gb/s");
        let pp = ping_pong(&c, to, a.pings)?;
        let rd = remote_reads(&c, &cap, a.pings)?;
        eprintln!(
            "64 B round trip p50: ping-pong {:.1} us, remote read {:.1} us",
            pp.p50, rd.p50
        );
        let long = long_figures(&c, to, sender_torusd)?;
        let (q_rate, q_rtt) = queue_figures(&c, &sock, to, ring, a.pings)?;
        eprintln!(
            "message queue: {q_rate:.0} messages/s (echoed), RTT p50 {:.1} us",
            q_rtt.p50
        );
        Ok(json!({
            "setup": {"mtu": a.mtu, "links": 1, "busy": a.busy, "ops": a.ops, "rounds": ROUNDS, "size": SIZE},
            "reliable_messages_64k_gbps": msg_gbps,
            "reliable_messages_64k_gbps_rounds": ms,
            "remote_writes_64k_gbps_rounds": ws,
            "remote_writes_64k_gbps": wr_gbps,
            "write_over_messages": wr_gbps / msg_gbps.max(1e-9),
            "ping_pong_64b": pp,
            "remote_read_64b": rd,
            "read_rtt_over_ping_pong_p50": rd.p50 / pp.p50.max(1e-9),
            "queue_messages_per_s_echoed": q_rate,
            "queue_rtt": q_rtt,
            "long_32m": long,
        }))
    })();
    stop.store(true, Ordering::Release);
    let _ = p.join();
    let v = result?;
    if let Some(d) = a.out.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&v).map_err(e)?)
        .map_err(|x| format!("{}: {x}", a.out.display()))?;
    println!(
        "{}",
        json!({"write_over_messages": v["write_over_messages"], "read_rtt_over_ping_pong_p50": v["read_rtt_over_ping_pong_p50"], "long_pulled_over_pushed": v["long_32m"]["pulled_over_pushed"], "long_app_cpu_pulled_over_pushed": v["long_32m"]["app_cpu_pulled_over_pushed"]})
    );
    Ok(())
}
