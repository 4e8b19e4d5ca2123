//! torusnet itself under measurement: real `torusd` processes in namespaces (a pair with one
//! or two links, or a line with forwarding servers), driven through their management sockets
//! and their built-in ping and bench services, with CPU time read from /proc and protocol
//! overheads from the status counters.

use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};
use torusnet_dataplane::cluster::{self, Cluster};
use torusnet_proto::topology::{Coord, Dims, Dir};
use torusnet_proto::wire::{self, Dest, Header, Kind, HEADERS_LEN};

use crate::baseline::Pair;
use crate::measure::{process_cpu, Latency, Throughput};

/// How the stack is set up.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Setup {
    /// Link MTU.
    pub mtu: u32,
    /// Links the sender stripes over: 1 or 2 go straight to the receiver; 3 to 6 are the
    /// sender's first hops in a 2x2x2 torus towards the opposite corner (3 hops away).
    pub links: u8,
    /// Forwarding servers between sender and receiver (0..=4).
    pub hops: u8,
    /// Busy polling (one core per end) or adaptive.
    pub busy: bool,
    /// Aggregation of small messages.
    pub aggregate: bool,
    /// Forwarding servers hold frames that find no room (the transit queue); off, they
    /// drop them, as before the queue existed.
    pub transit: bool,
    /// Frames passing through are forwarded by the XDP program (`[dataplane]
    /// xdp_transit`); off, by the forwarding servers' pollers.
    pub xdp_transit: bool,
}

/// A running setup: the cluster, which server sends and which receives.
pub struct Running {
    /// The servers.
    pub cluster: Cluster,
    /// Sender index.
    pub tx: usize,
    /// Receiver index.
    pub rx: usize,
    /// The receiver's coordinate.
    pub to: Coord,
    /// Addresses for the kernel baselines on the first link.
    pub pair: Pair,
    /// Links left out of every server's view (x,y,z:DIR).
    pub down: Vec<String>,
}

/// Real interfaces to run on instead of veth pairs: two ports of this machine cabled to
/// each other (they move into the namespaces and back).
#[derive(Debug, Clone)]
pub struct RealPorts {
    /// The sender's port.
    pub a: String,
    /// The receiver's port.
    pub b: String,
}

/// Two servers on the real ports `r` (a cable between two of this machine's NICs).
fn build_on_ports(tag: &str, s: &Setup, r: &RealPorts) -> Result<Running, String> {
    let dims = Dims::new(2, 1, 1).map_err(|e| e.to_string())?;
    let mut c = Cluster::new(
        tag,
        dims,
        &[Coord::new(0, 0, 0), Coord::new(1, 0, 0)],
        s.mtu,
    );
    c.adopt(0, &r.a, Dir::PlusX, 1, &r.b)?;
    for (i, addr, ifname) in [(0, "10.77.0.1/24", &r.a), (1, "10.77.0.2/24", &r.b)] {
        c.servers[i]
            .ns
            .ip(&["addr", "add", addr, "dev", ifname])
            .map_err(|e| e.to_string())?;
    }
    let pair = Pair {
        ns_a: c.servers[0].ns.name().to_string(),
        ns_b: c.servers[1].ns.name().to_string(),
        if_a: r.a.clone(),
        if_b: r.b.clone(),
        mtu: s.mtu,
        headers: None,
    };
    Ok(Running {
        cluster: c,
        tx: 0,
        rx: 1,
        to: Coord::new(1, 0, 0),
        pair,
        down: Vec::new(),
    })
}

/// A 2x2x2 torus: from 0,0,0 every one of the six links leads towards 1,1,1 (those beyond
/// `s.links` are taken down once torusd runs).
fn build_cube(tag: &str, s: &Setup) -> Result<Running, String> {
    let dims = Dims::new(2, 2, 2).map_err(|e| e.to_string())?;
    let coords: Vec<Coord> = dims.coords().collect();
    let mut c = Cluster::new(tag, dims, &coords, s.mtu);
    for (i, co) in coords.iter().enumerate() {
        for d in [Dir::PlusX, Dir::PlusY, Dir::PlusZ] {
            let j = dims.index(dims.neighbor(*co, d));
            // Size 2: the + and - links of a server both go to the same neighbour.
            if i < j {
                c.link(i, d, j);
                c.link(i, d.opposite(), j);
            }
        }
    }
    let to = Coord::new(1, 1, 1);
    let down: Vec<String> = Dir::ALL[usize::from(s.links.min(6))..]
        .iter()
        .map(|d| format!("0,0,0:{d}"))
        .collect();
    c.servers[0]
        .ns
        .ip(&["addr", "add", "10.77.0.1/24", "dev", "t0px"])
        .map_err(|e| e.to_string())?;
    c.servers[1]
        .ns
        .ip(&["addr", "add", "10.77.0.2/24", "dev", "t1mx"])
        .map_err(|e| e.to_string())?;
    let pair = Pair {
        ns_a: c.servers[0].ns.name().to_string(),
        ns_b: c.servers[1].ns.name().to_string(),
        if_a: "t0px".into(),
        if_b: "t1mx".into(),
        mtu: s.mtu,
        headers: None,
    };
    Ok(Running {
        cluster: c,
        tx: 0,
        rx: dims.index(to),
        to,
        pair,
        down,
    })
}

impl Running {
    /// The two ends of a line of forwarding servers as a pair for raw AF_XDP: the sender's
    /// first link and the receiver's last, frames carrying torus headers from one end to the
    /// other, which the forwarders pass on as they pass torusnet's (None: no forwarder).
    pub fn path_pair(&self) -> Option<Pair> {
        let n = self.cluster.servers.len();
        if n < 3 || self.rx != n - 1 || self.cluster.dims.y() != 1 || self.cluster.dims.z() != 1 {
            return None;
        }
        let ns = |i: usize| self.cluster.servers[i].ns.name().to_string();
        let (if_a, if_b) = ("t0px".to_string(), format!("t{}mx", n - 1));
        let header = |from: usize, to: usize, out: &str, peer: usize, peer_if: &str| {
            let src = self.cluster.servers[from].coord;
            let dst = self.cluster.servers[to].coord;
            let mut h = Header::new(Kind::Data, src, Dest::Server(dst));
            h.ttl = wire::DEFAULT_TTL;
            let mut buf = vec![0u8; HEADERS_LEN];
            h.emit(&mut buf).ok()?;
            let (me, them) = (
                cluster::in_ns(&ns(from), out),
                cluster::in_ns(&ns(peer), peer_if),
            );
            wire::emit_eth(&mut buf, them, me).ok()?;
            Some(buf)
        };
        let a = header(0, n - 1, &if_a, 1, "t1mx")?;
        let b = header(n - 1, 0, &if_b, n - 2, &format!("t{}px", n - 2))?;
        Some(Pair {
            ns_a: ns(0),
            ns_b: ns(n - 1),
            if_a,
            if_b,
            mtu: self.pair.mtu,
            headers: Some((a, b)),
        })
    }
}

/// Builds the namespaces and links of `s` (torusd not started yet).
pub fn build(tag: &str, s: &Setup, real: Option<&RealPorts>) -> Result<Running, String> {
    let hops = s.hops.min(4);
    if let Some(r) = real {
        return build_on_ports(tag, s, r);
    }
    if s.links > 2 {
        return build_cube(tag, s);
    }
    let (cluster, to) = if hops == 0 {
        let dims = Dims::new(2, 1, 1).map_err(|e| e.to_string())?;
        let mut c = Cluster::new(
            tag,
            dims,
            &[Coord::new(0, 0, 0), Coord::new(1, 0, 0)],
            s.mtu,
        );
        c.link(0, Dir::PlusX, 1);
        if s.links >= 2 {
            c.link(0, Dir::MinusX, 1);
        }
        (c, Coord::new(1, 0, 0))
    } else {
        // A line of hops + 2 servers along x (a ring with its closing link left out).
        let n = u16::from(hops) + 2;
        let dims = Dims::new(n, 1, 1).map_err(|e| e.to_string())?;
        let coords: Vec<Coord> = (0..n).map(|x| Coord::new(x, 0, 0)).collect();
        let mut c = Cluster::new(tag, dims, &coords, s.mtu);
        for i in 0..usize::from(n) - 1 {
            c.link(i, Dir::PlusX, i + 1);
        }
        (c, Coord::new(n - 1, 0, 0))
    };
    let rx = usize::from(to.x);
    // Kernel baselines use the sender's first link and the receiver's side of the first hop.
    let ns_a = cluster.servers[0].ns.name().to_string();
    let ns_b = cluster.servers[1].ns.name().to_string();
    cluster.servers[0]
        .ns
        .ip(&["addr", "add", "10.77.0.1/24", "dev", "t0px"])
        .map_err(|e| e.to_string())?;
    cluster.servers[1]
        .ns
        .ip(&["addr", "add", "10.77.0.2/24", "dev", "t1mx"])
        .map_err(|e| e.to_string())?;
    let pair = Pair {
        ns_a,
        ns_b,
        if_a: "t0px".into(),
        if_b: "t1mx".into(),
        mtu: s.mtu,
        headers: None,
    };
    Ok(Running {
        cluster,
        tx: 0,
        rx,
        to,
        pair,
        down: Vec::new(),
    })
}

/// Starts torusd everywhere for `s`: the ends pinned to cores 0 and 1 when busy polling;
/// forwarding servers always adaptive (two cores hold only two busy pollers).
pub fn start(r: &mut Running, s: &Setup) {
    let all: Vec<usize> = (0..r.cluster.servers.len()).collect();
    start_only(r, s, &all);
}

/// Starts torusd on the servers between the ends only (none for a pair).
pub fn start_forwarders(r: &mut Running, s: &Setup) {
    let (tx, rx) = (r.tx, r.rx);
    let between: Vec<usize> = (0..r.cluster.servers.len())
        .filter(|i| *i != tx && *i != rx)
        .collect();
    start_only(r, s, &between);
}

/// Starts torusd on the two ends only.
pub fn start_ends(r: &mut Running, s: &Setup) {
    let ends = [r.tx, r.rx];
    start_only(r, s, &ends);
}

/// Starts torusd on servers `which` for `s`.
fn start_only(r: &mut Running, s: &Setup, which: &[usize]) {
    let n = r.cluster.servers.len();
    let mut down = r.down.clone();
    if s.hops > 0 && s.links <= 2 {
        down.push(format!("{},0,0:+x", n - 1));
    }
    let (tx, rx) = (r.tx, r.rx);
    r.cluster.start_only(which, |i| {
        let mut t = String::new();
        if s.busy && (i == tx || i == rx) {
            t += &format!(
                "polling = \"busy\"\ncores = [{}]\n",
                if i == tx { 0 } else { 1 }
            );
        } else {
            t += "polling = \"adaptive\"\n";
        }
        if !s.transit {
            t += "transit_chunks = 0\n";
        }
        t += &format!("[dataplane]\nxdp_transit = {}\n", s.xdp_transit);
        if !s.aggregate {
            t += "[transport]\naggregate = false\n";
        }
        if !down.is_empty() {
            let list: Vec<String> = down.iter().map(|d| format!("\"{d}\"")).collect();
            t += &format!("[view]\ndown_links = [{}]\n", list.join(", "));
        }
        t
    });
}

/// Ping-pong through torusd's built-in ping service.
pub fn ping(r: &Running, count: u32, size: usize, reliable: bool) -> Result<Latency, String> {
    let req = |count: u32| json!({"cmd": "ping", "to": r.to.to_string(), "count": count, "size": size, "reliable": reliable});
    r.cluster.ctl(r.tx, &req(500))?;
    let v = r.cluster.ctl(r.tx, &req(count))?;
    let g = |k: &str| v["rtt_us"][k].as_f64().unwrap_or(0.0);
    Ok(Latency {
        samples: v["received"].as_u64().unwrap_or(0),
        p50: g("p50"),
        p90: g("p90"),
        p99: g("p99"),
        p999: g("p999"),
        max: g("max"),
        cdf: v["cdf_us"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default(),
    })
}

/// Protocol overheads over a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Overheads {
    /// (ACK + NACK + retransmitted) frames as a percentage of data frames.
    pub extra_frames_pct: f64,
    /// Retransmitted frames as a percentage of data frames.
    pub retransmitted_pct: f64,
    /// Frames that arrived out of order at the receiver, in percent.
    pub out_of_order_pct: f64,
    /// Messages per data frame.
    pub messages_per_frame: f64,
    /// Frames passing through a server dropped there for lack of room on their next link
    /// (every server of the setup).
    pub no_room_drops: u64,
    /// Frames passing through that waited for room in a server's transit queue.
    pub forward_waited: u64,
    /// Frames the kernel dropped on their way into a server's AF_XDP sockets (RX ring full,
    /// no fill chunk, other), every server of the setup: the receiver or a forwarder fell
    /// behind.
    pub ring_drops: u64,
    /// Of those, for want of a fill-ring chunk (the server's UMEM was held elsewhere).
    pub fill_empty_drops: u64,
    /// Frames the XDP programs of the servers forwarded by themselves.
    pub xdp_forwarded: u64,
    /// Frames an XDP program redirected to a link that could not take them (dropped; the
    /// transport repairs them).
    pub redirect_errors: u64,
}

/// What happened to frames on their way, over every link of every server: counters read
/// before and after a run.
#[derive(Debug, Clone, Copy)]
struct Ways {
    no_room: u64,
    waited: u64,
    rings: u64,
    fill_empty: u64,
    xdp: u64,
    redirect_errors: u64,
}

impl Ways {
    fn read(r: &Running) -> Ways {
        Ways {
            no_room: link_total(r, "drop_no_room"),
            waited: link_total(r, "forward_waited"),
            rings: link_sum(r, &RING_DROPS),
            fill_empty: link_sum(r, &[RING_DROPS[2]]),
            xdp: link_sum(r, &[&["xdp", "transit_out"]]),
            redirect_errors: link_sum(r, &[&["redirect_errors"]]),
        }
    }

    /// The counts since `before`.
    fn since(&self, before: &Ways) -> Ways {
        Ways {
            no_room: self.no_room.saturating_sub(before.no_room),
            waited: self.waited.saturating_sub(before.waited),
            rings: self.rings.saturating_sub(before.rings),
            fill_empty: self.fill_empty.saturating_sub(before.fill_empty),
            xdp: self.xdp.saturating_sub(before.xdp),
            redirect_errors: self.redirect_errors.saturating_sub(before.redirect_errors),
        }
    }
}

/// The sum of a link counter over every link of every server.
fn link_total(r: &Running, key: &str) -> u64 {
    link_sum(r, &[&["counters", key]])
}

/// The sum of some per-link figures (paths into a link's status) over every server.
fn link_sum(r: &Running, paths: &[&[&str]]) -> u64 {
    (0..r.cluster.servers.len())
        .filter_map(|i| counters(r, i).ok())
        .map(|v| {
            v["links"]
                .as_array()
                .map(|l| {
                    l.iter()
                        .map(|x| paths.iter().map(|p| n(x, p) as u64).sum::<u64>())
                        .sum::<u64>()
                })
                .unwrap_or(0)
        })
        .sum()
}

const RING_DROPS: [&[&str]; 3] = [
    &["xsk", "rx_dropped"],
    &["xsk", "rx_ring_full"],
    &["xsk", "rx_fill_ring_empty"],
];

fn counters(r: &Running, i: usize) -> Result<Value, String> {
    r.cluster.ctl(i, &json!({"cmd": "status"}))
}

fn n(v: &Value, path: &[&str]) -> f64 {
    let mut c = v;
    for p in path {
        c = &c[*p];
    }
    c.as_f64().unwrap_or(0.0)
}

/// Longer than the interval at which a daemon publishes its counters (100 ms): frame counts
/// read after this long include everything sent before.
const SNAPSHOT_SETTLE: Duration = Duration::from_millis(250);

/// One-way transfer of `bytes` in `size`-byte messages (reliable or short), both ways at
/// once when `two_way`.
pub fn transfer(
    r: &Running,
    bytes: u64,
    size: usize,
    reliable: bool,
    two_way: bool,
) -> Result<(Throughput, Overheads), String> {
    let (tx, rx) = (r.tx, r.rx);
    let from = r.cluster.servers[tx].coord;
    // What came before is in the daemons' published counters.
    std::thread::sleep(SNAPSHOT_SETTLE);
    let (a0, b0) = (counters(r, tx)?, counters(r, rx)?);
    let ways0 = Ways::read(r);
    let pids = (
        r.cluster.pid(tx).unwrap_or(0),
        r.cluster.pid(rx).unwrap_or(0),
    );
    let (c0a, c0b) = (process_cpu(pids.0), process_cpu(pids.1));
    // Throughput runs do not verify payloads (the e2e tests do): checking every byte would
    // cost more than the stack being measured, and the raw AF_XDP baseline touches none.
    let req = |to: Coord| json!({"cmd": "bench", "to": to.to_string(), "bytes": bytes, "size": size, "reliable": reliable, "fence_every": 0, "verify": false});
    let back = if two_way {
        let sock = r.cluster.servers[rx].socket.clone();
        let q = req(from);
        Some(std::thread::spawn(move || {
            cluster::request(&sock, &q, Duration::from_secs(600))
        }))
    } else {
        None
    };
    let v = r.cluster.ctl(tx, &req(r.to))?;
    let w = match back {
        Some(h) => Some(h.join().map_err(|_| "reverse transfer panicked")??),
        None => None,
    };
    let (c1a, c1b) = (process_cpu(pids.0), process_cpu(pids.1));
    // And so is the whole transfer: a run shorter than the publishing interval counted a
    // part of its frames (a fast machine moved a 64 B row in 0.12 s and reported 400
    // messages per 9000-byte frame).
    std::thread::sleep(SNAPSHOT_SETTLE);
    let (a1, b1) = (counters(r, tx)?, counters(r, rx)?);
    let ways = Ways::read(r).since(&ways0);
    let check = |v: &Value| -> Result<(), String> {
        let rx = &v["receiver"];
        if reliable && rx["delivered"] != v["messages"] {
            return Err(format!("reliable transfer not exact: {v}"));
        }
        Ok(())
    };
    check(&v)?;
    let secs = n(&v, &["elapsed_s"]);
    let mut msgs = if reliable {
        n(&v, &["messages"])
    } else {
        n(&v, &["receiver", "short_received"])
    };
    let mut payload = n(&v, &["receiver", "bytes"]);
    if let Some(w) = &w {
        check(w)?;
        msgs += if reliable {
            n(w, &["messages"])
        } else {
            n(w, &["receiver", "short_received"])
        };
        payload += n(w, &["receiver", "bytes"]);
    }
    let d = |a: &Value, b: &Value, k: &str| {
        n(b, &["engine", "transport", k]) - n(a, &["engine", "transport", k])
    };
    let mut data = d(&a0, &a1, "data_frames") + d(&a0, &a1, "short_frames");
    let mut extra = d(&a0, &a1, "retransmitted_frames")
        + d(&b0, &b1, "ack_frames")
        + d(&b0, &b1, "nack_frames");
    let mut retx = d(&a0, &a1, "retransmitted_frames");
    if two_way {
        data += d(&b0, &b1, "data_frames") + d(&b0, &b1, "short_frames");
        extra += d(&b0, &b1, "retransmitted_frames")
            + d(&a0, &a1, "ack_frames")
            + d(&a0, &a1, "nack_frames");
        retx += d(&b0, &b1, "retransmitted_frames");
    }
    let rx_frames: f64 = b1["links"]
        .as_array()
        .map(|l| l.iter().map(|x| n(x, &["counters", "rx_frames"])).sum())
        .unwrap_or(0.0)
        - b0["links"]
            .as_array()
            .map(|l| l.iter().map(|x| n(x, &["counters", "rx_frames"])).sum())
            .unwrap_or(0.0);
    let ooo = d(&b0, &b1, "out_of_order_frames");
    let t = Throughput::new(
        msgs as u64,
        payload as u64,
        data as u64,
        Duration::from_secs_f64(secs),
        c1a - c0a,
        c1b - c0b,
    );
    let o = Overheads {
        extra_frames_pct: 100.0 * extra / data.max(1.0),
        retransmitted_pct: 100.0 * retx / data.max(1.0),
        out_of_order_pct: 100.0 * ooo / rx_frames.max(1.0),
        messages_per_frame: msgs / data.max(1.0),
        no_room_drops: ways.no_room,
        forward_waited: ways.waited,
        ring_drops: ways.rings,
        fill_empty_drops: ways.fill_empty,
        xdp_forwarded: ways.xdp,
        redirect_errors: ways.redirect_errors,
    };
    Ok((t, o))
}
