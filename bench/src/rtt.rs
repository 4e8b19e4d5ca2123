//! `torus-bench rtt`: ping-pong round-trip time on one veth pair between two namespaces, in
//! one run, four ways: kernel UDP (blocking receive), kernel UDP (busy-polling receive), raw
//! AF_XDP (no protocol: the floor for this link), and torusd's built-in ping (the whole
//! stack, busy polling, one core per side).

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use torusnet_dataplane::cluster::Cluster;
use torusnet_dataplane::loader::{AttachPreference, XdpAttachment};
use torusnet_dataplane::netns::{enter, mac_of};
use torusnet_dataplane::xsk::{SocketConfig, Umem, XdpDesc, XskSocket};
use torusnet_proto::topology::{Coord, Dims, Dir};
use torusnet_proto::wire::{HEADERS_LEN, MSG_HEADER_LEN};

/// Options of `torus-bench rtt`.
#[derive(clap::Args)]
pub struct Args {
    /// Round trips per method.
    #[arg(long, default_value_t = 20_000)]
    count: u32,
    /// Message size in bytes.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Latency percentiles of one method, microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Rtt {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
    /// Round trips measured.
    pub samples: usize,
}

fn summarize(mut ns: Vec<u64>) -> Rtt {
    ns.sort_unstable();
    let p = |q: f64| {
        if ns.is_empty() {
            return 0.0;
        }
        ns[((ns.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0
    };
    Rtt {
        p50: p(0.5),
        p90: p(0.9),
        p99: p(0.99),
        p999: p(0.999),
        max: p(1.0),
        samples: ns.len(),
    }
}

fn pin(core: usize) {
    core_affinity::set_for_current(core_affinity::CoreId { id: core });
}

fn udp(ns_a: &str, ns_b: &str, count: u32, size: usize, busy: bool) -> Result<Rtt, String> {
    let (nb, na) = (ns_b.to_string(), ns_a.to_string());
    let server = std::thread::spawn(move || -> Result<(), String> {
        enter(&nb).map_err(|e| e.to_string())?;
        pin(1);
        let s = UdpSocket::bind("10.77.0.2:7777").map_err(|e| e.to_string())?;
        s.set_nonblocking(busy).map_err(|e| e.to_string())?;
        s.set_read_timeout(if busy {
            None
        } else {
            Some(Duration::from_secs(5))
        })
        .map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 65536];
        let mut served = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while served < count + 1 && Instant::now() < deadline {
            match s.recv_from(&mut buf) {
                Ok((n, from)) => {
                    s.send_to(&buf[..n], from).map_err(|e| e.to_string())?;
                    served += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => return Err(format!("udp server: {e}")),
            }
        }
        Ok(())
    });
    let client = std::thread::spawn(move || -> Result<Vec<u64>, String> {
        enter(&na).map_err(|e| e.to_string())?;
        pin(0);
        let s = UdpSocket::bind("10.77.0.1:0").map_err(|e| e.to_string())?;
        s.connect("10.77.0.2:7777").map_err(|e| e.to_string())?;
        s.set_nonblocking(busy).map_err(|e| e.to_string())?;
        s.set_read_timeout(if busy {
            None
        } else {
            Some(Duration::from_secs(2))
        })
        .map_err(|e| e.to_string())?;
        let msg = vec![7u8; size];
        let mut buf = vec![0u8; 65536];
        let mut out = Vec::with_capacity(count as usize);
        // One warm-up round trip (ARP, caches), not measured.
        for i in 0..=count {
            let t = Instant::now();
            s.send(&msg).map_err(|e| e.to_string())?;
            loop {
                match s.recv(&mut buf) {
                    Ok(_) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                    Err(e) => return Err(format!("udp client: {e}")),
                }
            }
            if i > 0 {
                out.push(t.elapsed().as_nanos() as u64);
            }
        }
        Ok(out)
    });
    let rtts = client.join().map_err(|_| "udp client panicked")??;
    server.join().map_err(|_| "udp server panicked")??;
    Ok(summarize(rtts))
}

/// One side of the raw AF_XDP ping-pong: its own UMEM, socket and XDP program.
struct RawSide {
    umem: Umem,
    xsk: XskSocket,
    _xdp: XdpAttachment,
    mac: [u8; 6],
}

impl RawSide {
    fn new(ifname: &str) -> Result<RawSide, String> {
        let mut umem = Umem::new(1024).map_err(|e| e.to_string())?;
        let cfg = SocketConfig {
            need_wakeup: false,
            ..SocketConfig::default()
        };
        let mut xsk = XskSocket::new(&umem, None, ifname, 0, &cfg).map_err(|e| e.to_string())?;
        let mut xdp = XdpAttachment::attach(ifname, 1500, AttachPreference::Auto)
            .map_err(|e| e.to_string())?;
        xdp.register_socket(0, xsk.raw_fd())
            .map_err(|e| e.to_string())?;
        let n = xsk.fill.free().min(512);
        for i in 0..n {
            let a = umem.alloc().ok_or("UMEM exhausted")?;
            xsk.fill.write(i, a);
        }
        xsk.fill.submit(n);
        let mac = mac_of(ifname).map_err(|e| e.to_string())?;
        Ok(RawSide {
            umem,
            xsk,
            _xdp: xdp,
            mac,
        })
    }

    fn reclaim(&mut self) {
        let n = self.xsk.comp.available(u32::MAX);
        for i in 0..n {
            let a = self.xsk.comp.read(i);
            self.umem.release(a);
        }
        self.xsk.comp.release(n);
        // Keep half the UMEM in the fill ring, the rest for sending.
        let stocked = self.xsk.fill.outstanding();
        let free = 512u32.saturating_sub(stocked).min(self.xsk.fill.free());
        let mut k = 0;
        while k < free {
            let Some(a) = self.umem.alloc() else { break };
            self.xsk.fill.write(k, a);
            k += 1;
        }
        self.xsk.fill.submit(k);
    }

    fn send(&mut self, d: XdpDesc) -> Result<(), String> {
        while self.xsk.tx.free() == 0 {
            self.reclaim();
        }
        self.xsk.tx.write(0, d);
        self.xsk.tx.submit(1);
        self.xsk.kick_tx().map_err(|e| e.to_string())
    }

    /// Spins until a frame arrives, up to `timeout`.
    fn recv(&mut self, timeout: Duration) -> Option<XdpDesc> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.xsk.rx.available(1) == 1 {
                let d = self.xsk.rx.read(0);
                self.xsk.rx.release(1);
                return Some(d);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::hint::spin_loop();
        }
    }
}

fn raw_afxdp(
    ns_a: &str,
    if_a: &str,
    ns_b: &str,
    if_b: &str,
    count: u32,
    frame_len: usize,
) -> Result<Rtt, String> {
    let (na, nb, ia, ib) = (
        ns_a.to_string(),
        ns_b.to_string(),
        if_a.to_string(),
        if_b.to_string(),
    );
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || -> Result<(), String> {
        enter(&nb).map_err(|e| e.to_string())?;
        pin(1);
        let mut s = RawSide::new(&ib)?;
        let _ = ready_tx.send(());
        let mut served = 0;
        while served < count + 1 {
            let Some(d) = s.recv(Duration::from_secs(5)) else {
                return Err("raw AF_XDP server: nothing arrived".into());
            };
            // Swap the MAC addresses in place and send the same chunk back: no copy.
            let f = s.umem.slice_mut(d.addr, d.len as usize);
            let mut dst = [0u8; 6];
            dst.copy_from_slice(&f[6..12]);
            f[6..12].copy_from_slice(&s.mac);
            f[0..6].copy_from_slice(&dst);
            s.send(d)?;
            s.reclaim();
            served += 1;
        }
        Ok(())
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "raw AF_XDP server did not start")?;
    let client = std::thread::spawn(move || -> Result<Vec<u64>, String> {
        enter(&na).map_err(|e| e.to_string())?;
        pin(0);
        let mut c = RawSide::new(&ia)?;
        // Broadcast destination: a veth hands any frame to its peer, so no address
        // resolution is needed.
        let peer = [0xffu8; 6];
        let mut out = Vec::with_capacity(count as usize);
        for i in 0..=count {
            let a = c.umem.alloc().ok_or("UMEM exhausted")?;
            let f = c.umem.slice_mut(a, frame_len);
            f.fill(0);
            f[0..6].copy_from_slice(&peer);
            f[6..12].copy_from_slice(&c.mac);
            f[12] = 0x88;
            f[13] = 0xB5;
            let t = Instant::now();
            c.send(XdpDesc {
                addr: a,
                len: frame_len as u32,
                options: 0,
            })?;
            let Some(d) = c.recv(Duration::from_secs(2)) else {
                return Err("raw AF_XDP client: no echo".into());
            };
            if i > 0 {
                out.push(t.elapsed().as_nanos() as u64);
            }
            c.umem.release(d.addr);
            c.reclaim();
        }
        Ok(out)
    });
    let rtts = client.join().map_err(|_| "raw client panicked")??;
    server.join().map_err(|_| "raw server panicked")??;
    Ok(summarize(rtts))
}

fn torusd(c: &mut Cluster, count: u32, size: usize) -> Result<Rtt, String> {
    c.start_with(|i| format!("polling = \"busy\"\ncores = [{}]\n", i % 2));
    // Warm-up round trips (caches, first-time allocations), not reported.
    c.ctl(
        0,
        &json!({"cmd": "ping", "to": "1,0,0", "count": 1000, "size": size}),
    )?;
    let r = c.ctl(
        0,
        &json!({"cmd": "ping", "to": "1,0,0", "count": count, "size": size}),
    )?;
    let g = |k: &str| r["rtt_us"][k].as_f64().unwrap_or(0.0);
    Ok(Rtt {
        p50: g("p50"),
        p90: g("p90"),
        p99: g("p99"),
        p999: g("p999"),
        max: g("max"),
        samples: r["received"].as_u64().unwrap_or(0) as usize,
    })
}

#[derive(Serialize)]
struct Report {
    size: usize,
    count: u32,
    udp_blocking: Rtt,
    udp_busy_poll: Rtt,
    raw_afxdp: Rtt,
    torusd: Rtt,
    torusd_p50_vs_raw_afxdp: f64,
    torusd_p50_vs_udp_busy_poll: f64,
    torusd_p50_vs_udp_blocking: f64,
}

/// Runs the four ping-pongs and prints the comparison.
pub fn run(a: &Args) -> Result<(), String> {
    let dims = Dims::new(2, 1, 1).map_err(|e| e.to_string())?;
    let mut c = Cluster::new(
        "rtt",
        dims,
        &[Coord::new(0, 0, 0), Coord::new(1, 0, 0)],
        1500,
    );
    c.link(0, Dir::PlusX, 1);
    let (na, nb) = (
        c.servers[0].ns.name().to_string(),
        c.servers[1].ns.name().to_string(),
    );
    c.servers[0]
        .ns
        .ip(&["addr", "add", "10.77.0.1/24", "dev", "t0px"])
        .map_err(|e| e.to_string())?;
    c.servers[1]
        .ns
        .ip(&["addr", "add", "10.77.0.2/24", "dev", "t1mx"])
        .map_err(|e| e.to_string())?;
    let udp_blocking = udp(&na, &nb, a.count, a.size, false)?;
    let udp_busy_poll = udp(&na, &nb, a.count, a.size, true)?;
    // The same bytes on the wire as torusd's short message: headers + message header + data.
    let frame_len = HEADERS_LEN + MSG_HEADER_LEN + a.size;
    let raw = raw_afxdp(&na, "t0px", &nb, "t1mx", a.count, frame_len)?;
    let td = torusd(&mut c, a.count, a.size)?;
    let r = Report {
        size: a.size,
        count: a.count,
        udp_blocking,
        udp_busy_poll,
        raw_afxdp: raw,
        torusd: td,
        torusd_p50_vs_raw_afxdp: td.p50 / raw.p50.max(1e-9),
        torusd_p50_vs_udp_busy_poll: td.p50 / udp_busy_poll.p50.max(1e-9),
        torusd_p50_vs_udp_blocking: td.p50 / udp_blocking.p50.max(1e-9),
    };
    if a.json {
        println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!(
        "ping-pong RTT, {} B messages, {} round trips each, one veth pair, one core per side",
        a.size, a.count
    );
    println!(
        "{:<22} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "method (us)", "p50", "p90", "p99", "p99.9", "max"
    );
    for (name, x) in [
        ("kernel UDP, blocking", &r.udp_blocking),
        ("kernel UDP, busy poll", &r.udp_busy_poll),
        ("raw AF_XDP", &r.raw_afxdp),
        ("torusd (busy)", &r.torusd),
    ] {
        println!(
            "{:<22} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>9.1}",
            name, x.p50, x.p90, x.p99, x.p999, x.max
        );
    }
    println!(
        "torusd p50 = {:.2}x raw AF_XDP, {:.2}x UDP busy poll, {:.2}x UDP blocking",
        r.torusd_p50_vs_raw_afxdp, r.torusd_p50_vs_udp_busy_poll, r.torusd_p50_vs_udp_blocking
    );
    Ok(())
}
