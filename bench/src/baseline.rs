//! The baselines every torusnet figure is compared with, measured on the same veth pair in
//! the same run: kernel UDP sockets (blocking and busy-polling receive) and raw AF_XDP (no
//! protocol: frames in, frames out), as ping-pong RTT and one-way throughput. Sender on core
//! 0, receiver on core 1.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use torusnet_dataplane::loader::{AttachPreference, XdpProgram};
use torusnet_dataplane::netns::{enter, mac_of};
use torusnet_dataplane::xsk::{SocketConfig, Umem, XdpDesc, XskSocket, CHUNK};
use torusnet_proto::topology::Dir;
use torusnet_proto::wire::offset;

use crate::measure::{thread_cpu, Latency, Throughput};

/// Where a baseline runs: two namespaces and the interface in each, with IPv4 addresses.
#[derive(Debug, Clone)]
pub struct Pair {
    /// Sender's namespace.
    pub ns_a: String,
    /// Receiver's namespace.
    pub ns_b: String,
    /// Sender's interface.
    pub if_a: String,
    /// Receiver's interface.
    pub if_b: String,
    /// Link MTU.
    pub mtu: u32,
    /// Torus headers (Ethernet included) the two ends write, a to b and b to a, when the
    /// frames cross forwarding servers between them (raw AF_XDP through the same
    /// forwarders as torusnet's frames); None: straight over one link.
    pub headers: Option<(Vec<u8>, Vec<u8>)>,
}

/// How long an echo server serves a ping-pong of `count` round trips at most: a minute, and
/// two milliseconds per round trip on top (a fixed minute cut off long runs of the blocking
/// UDP baseline, whose client then failed with "connection refused"). The server also stops
/// as soon as its client says it is done, having finished or failed.
fn echo_deadline(count: u32) -> Instant {
    Instant::now() + Duration::from_secs(60) + Duration::from_millis(2 * u64::from(count))
}

/// Tells an echo server its client is done when dropped, however the client ends.
struct DoneOnDrop(Arc<AtomicBool>);

impl Drop for DoneOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Whether a socket read found nothing (a non-blocking socket) or timed out (a blocking one
/// with a read timeout): the caller looks at its stop condition and reads again.
fn nothing_yet(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

fn pin(core: usize) {
    core_affinity::set_for_current(core_affinity::CoreId { id: core });
}

/// UDP ping-pong.
pub fn udp_rtt(p: &Pair, count: u32, size: usize, busy: bool) -> Result<Latency, String> {
    let (nb, na) = (p.ns_b.clone(), p.ns_a.clone());
    // The client pings only once the echo socket is bound: a datagram sent before that is
    // answered with port-unreachable, which the client's connected socket reports as
    // "connection refused" and the row failed for it.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let done = Arc::new(AtomicBool::new(false));
    let client_done = DoneOnDrop(done.clone());
    let server = std::thread::spawn(move || -> Result<(), String> {
        enter(&nb).map_err(|e| e.to_string())?;
        pin(1);
        let s = UdpSocket::bind("10.77.0.2:7777").map_err(|e| e.to_string())?;
        s.set_nonblocking(busy).map_err(|e| e.to_string())?;
        s.set_read_timeout(if busy {
            None
        } else {
            // Short, so that it sees its client done soon after a failure.
            Some(Duration::from_secs(1))
        })
        .map_err(|e| e.to_string())?;
        let _ = ready_tx.send(());
        let mut buf = vec![0u8; 65536];
        let deadline = echo_deadline(count);
        let mut served = 0;
        while served < count + 1 && Instant::now() < deadline && !done.load(Ordering::Acquire) {
            match s.recv_from(&mut buf) {
                Ok((n, from)) => {
                    s.send_to(&buf[..n], from).map_err(|e| e.to_string())?;
                    served += 1;
                }
                // Busy: nothing yet; blocking: the read timeout, to look at the flag again.
                Err(e) if nothing_yet(&e) => std::hint::spin_loop(),
                Err(e) => return Err(format!("udp echo: {e}")),
            }
        }
        Ok(())
    });
    if ready_rx.recv_timeout(Duration::from_secs(10)).is_err() {
        drop(client_done);
        return Err(match server.join() {
            Ok(Err(e)) => format!("udp echo: {e}"),
            _ => "udp echo: not ready within 10 s".into(),
        });
    }
    let client = std::thread::spawn(move || -> Result<Vec<u64>, String> {
        let _done = client_done;
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
        for i in 0..=count {
            let t = Instant::now();
            s.send(&msg).map_err(|e| e.to_string())?;
            loop {
                match s.recv(&mut buf) {
                    Ok(_) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                    Err(e) => return Err(format!("udp ping: {e}")),
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
    Ok(Latency::from_ns(rtts))
}

/// UDP one-way: the sender sends `size`-byte datagrams for `duration`; the receiver counts.
pub fn udp_throughput(
    p: &Pair,
    size: usize,
    duration: Duration,
    busy: bool,
) -> Result<Throughput, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let (nb, na) = (p.ns_b.clone(), p.ns_a.clone());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let st = stop.clone();
    let receiver = std::thread::spawn(move || -> Result<(u64, u64, Duration, Duration), String> {
        enter(&nb).map_err(|e| e.to_string())?;
        pin(1);
        let s = UdpSocket::bind("10.77.0.2:7778").map_err(|e| e.to_string())?;
        s.set_nonblocking(busy).map_err(|e| e.to_string())?;
        s.set_read_timeout(if busy {
            None
        } else {
            Some(Duration::from_millis(100))
        })
        .map_err(|e| e.to_string())?;
        let _ = ready_tx.send(());
        let mut buf = vec![0u8; 65536];
        let (mut n, mut bytes) = (0u64, 0u64);
        let mut first = None;
        let mut last = Instant::now();
        let cpu0 = thread_cpu();
        while !st.load(Ordering::Acquire) {
            match s.recv(&mut buf) {
                Ok(k) => {
                    first.get_or_insert_with(Instant::now);
                    last = Instant::now();
                    n += 1;
                    bytes += k as u64;
                }
                Err(e) if nothing_yet(&e) => std::hint::spin_loop(),
                Err(e) => return Err(format!("udp receive: {e}")),
            }
        }
        let span = first.map_or(Duration::ZERO, |f| last.duration_since(f));
        Ok((n, bytes, span, thread_cpu() - cpu0))
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .map_err(|_| "udp receiver did not start")?;
    let sender = std::thread::spawn(move || -> Result<(u64, Duration), String> {
        enter(&na).map_err(|e| e.to_string())?;
        pin(0);
        let s = UdpSocket::bind("10.77.0.1:0").map_err(|e| e.to_string())?;
        s.connect("10.77.0.2:7778").map_err(|e| e.to_string())?;
        let msg = vec![9u8; size];
        let t0 = Instant::now();
        let cpu0 = thread_cpu();
        let mut sent = 0u64;
        while t0.elapsed() < duration {
            // ENOBUFS and friends: the kernel is full, try again.
            if s.send(&msg).is_ok() {
                sent += 1;
            }
        }
        Ok((sent, thread_cpu() - cpu0))
    });
    let (sent, cpu_tx) = sender.join().map_err(|_| "udp sender panicked")??;
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Release);
    let (n, bytes, span, cpu_rx) = receiver.join().map_err(|_| "udp receiver panicked")??;
    Ok(Throughput::new(n, bytes, n, span, cpu_tx, cpu_rx).with_offered(sent))
}

/// One side of raw AF_XDP: its own UMEM, socket and XDP program.
struct RawSide {
    umem: Umem,
    xsk: XskSocket,
    _xdp: XdpProgram,
    mac: [u8; 6],
    /// The torus header its frames start with (frames to cross forwarders), if any.
    header: Option<Vec<u8>>,
}

impl RawSide {
    fn new(ifname: &str, mtu: u32, header: Option<Vec<u8>>) -> Result<RawSide, String> {
        let mut umem = Umem::new(4096).map_err(|e| e.to_string())?;
        let cfg = SocketConfig {
            need_wakeup: false,
            multi_buffer: mtu as usize + 14 > CHUNK,
            ..SocketConfig::default()
        };
        let mut xsk = XskSocket::new(&umem, None, ifname, 0, &cfg).map_err(|e| e.to_string())?;
        // The server's program, on this one link and with transit off: every torus frame
        // goes to the socket.
        let mut xdp = XdpProgram::load(mtu, 1).map_err(|e| e.to_string())?;
        xdp.attach(ifname, Dir::PlusX, AttachPreference::Auto)
            .map_err(|e| e.to_string())?;
        xdp.register_socket(Dir::PlusX, xsk.raw_fd())
            .map_err(|e| e.to_string())?;
        let n = xsk.fill.free().min(1024);
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
            header,
        })
    }

    /// Takes back sent chunks and keeps 1024 chunks in the fill ring.
    fn reclaim(&mut self) {
        let n = self.xsk.comp.available(u32::MAX);
        for i in 0..n {
            let a = self.xsk.comp.read(i);
            self.umem.release(a);
        }
        self.xsk.comp.release(n);
        let stocked = self.xsk.fill.outstanding();
        let want = 1024u32.saturating_sub(stocked).min(self.xsk.fill.free());
        let mut k = 0;
        while k < want {
            let Some(a) = self.umem.alloc() else { break };
            self.xsk.fill.write(k, a);
            k += 1;
        }
        self.xsk.fill.submit(k);
    }

    /// Writes a frame of `len` bytes (torus EtherType, broadcast destination) into fresh
    /// chunks and queues it; false when the ring or the UMEM is full.
    fn queue_frame(&mut self, len: usize, stamp: u64) -> bool {
        let parts = len.div_ceil(CHUNK) as u32;
        if self.xsk.tx.free() < parts || self.umem.free_chunks() < parts as usize {
            return false;
        }
        let mut left = len;
        for k in 0..parts {
            let Some(a) = self.umem.alloc() else {
                return false;
            };
            let n = left.min(CHUNK);
            let f = self.umem.slice_mut(a, n);
            if k == 0 {
                match &self.header {
                    Some(h) if h.len() + 8 <= n => {
                        f[..h.len()].copy_from_slice(h);
                        let payload = (len - h.len()) as u16;
                        f[offset::PAYLOAD_LEN..offset::PAYLOAD_LEN + 2]
                            .copy_from_slice(&payload.to_be_bytes());
                        f[h.len()..h.len() + 8].copy_from_slice(&stamp.to_le_bytes());
                    }
                    _ => {
                        f[0..6].copy_from_slice(&[0xff; 6]);
                        f[6..12].copy_from_slice(&self.mac);
                        f[12] = 0x88;
                        f[13] = 0xB5;
                        f[14..22].copy_from_slice(&stamp.to_le_bytes());
                    }
                }
            }
            left -= n;
            let options = if k + 1 < parts { 1 } else { 0 };
            self.xsk.tx.write(
                k,
                XdpDesc {
                    addr: a,
                    len: n as u32,
                    options,
                },
            );
        }
        self.xsk.tx.submit(parts);
        true
    }

    /// Where this side's frames carry their stamp: after the torus header, or the Ethernet
    /// one.
    fn stamp_at(&self) -> usize {
        self.header.as_ref().map_or(14, Vec::len)
    }

    /// Takes one frame off the RX ring (all its buffers): its length and stamp (0 when it
    /// is too short to hold one: a frame that is nobody's echo).
    fn take_frame(&mut self) -> Option<(usize, u64)> {
        let mut total = 0;
        let mut stamp = 0;
        let at = self.stamp_at();
        loop {
            if self.xsk.rx.available(1) == 0 {
                return if total == 0 {
                    None
                } else {
                    Some((total, stamp))
                };
            }
            let d = self.xsk.rx.read(0);
            self.xsk.rx.release(1);
            if total == 0 && d.len as usize >= at + 8 {
                let b = self.umem.slice(d.addr, at + 8);
                stamp = u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
            }
            total += d.len as usize;
            self.umem.release(d.addr);
            if d.options & 1 == 0 {
                return Some((total, stamp));
            }
        }
    }
}

/// Raw AF_XDP ping-pong with frames of `frame_len` bytes: the floor for this link (or for
/// this path through forwarding servers, with the pair's torus headers).
pub fn afxdp_rtt(p: &Pair, count: u32, frame_len: usize) -> Result<Latency, String> {
    let (na, nb, ia, ib, mtu) = (
        p.ns_a.clone(),
        p.ns_b.clone(),
        p.if_a.clone(),
        p.if_b.clone(),
        p.mtu,
    );
    let (ha, hb) = match &p.headers {
        Some((a, b)) => (Some(a.clone()), Some(b.clone())),
        None => (None, None),
    };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let done = Arc::new(AtomicBool::new(false));
    let client_done = DoneOnDrop(done.clone());
    let server = std::thread::spawn(move || -> Result<(), String> {
        enter(&nb).map_err(|e| e.to_string())?;
        pin(1);
        let mut s = RawSide::new(&ib, mtu, hb.clone())?;
        let _ = ready_tx.send(());
        let deadline = echo_deadline(count);
        // Echoes every frame with its stamp until the client is done: frames other than
        // the client's (a forwarder's own, on a path) come back with theirs, which the
        // client does not wait for.
        while Instant::now() < deadline && !done.load(Ordering::Acquire) {
            if let Some((len, stamp)) = s.take_frame() {
                while !s.queue_frame(len, stamp) {
                    s.reclaim();
                }
                s.xsk.kick_tx().map_err(|e| e.to_string())?;
            }
            s.reclaim();
        }
        Ok(())
    });
    if ready_rx.recv_timeout(Duration::from_secs(10)).is_err() {
        let why = match server.join() {
            Ok(Err(e)) => e,
            _ => "no answer in 10 s".into(),
        };
        return Err(format!("raw AF_XDP echo did not start: {why}"));
    }
    let client = std::thread::spawn(move || -> Result<Vec<u64>, String> {
        let _done = client_done;
        enter(&na).map_err(|e| e.to_string())?;
        pin(0);
        let mut c = RawSide::new(&ia, mtu, ha.clone())?;
        let mut out = Vec::with_capacity(count as usize);
        for i in 0..=count {
            let t = Instant::now();
            while !c.queue_frame(frame_len, u64::from(i)) {
                c.reclaim();
            }
            c.xsk.kick_tx().map_err(|e| e.to_string())?;
            let deadline = Instant::now() + Duration::from_secs(2);
            let stamp = u64::from(i);
            loop {
                if c.take_frame().is_some_and(|(_, s)| s == stamp) {
                    break;
                }
                if Instant::now() > deadline {
                    return Err("raw AF_XDP: no echo".into());
                }
                std::hint::spin_loop();
            }
            if i > 0 {
                out.push(t.elapsed().as_nanos() as u64);
            }
            c.reclaim();
        }
        Ok(out)
    });
    let rtts = client.join().map_err(|_| "raw client panicked")??;
    server.join().map_err(|_| "raw server panicked")??;
    Ok(Latency::from_ns(rtts))
}

/// Raw AF_XDP one-way: frames of `frame_len` bytes as fast as the sender can, counted at
/// the receiver: the ceiling for what any protocol can reach on this link.
pub fn afxdp_throughput(
    p: &Pair,
    frame_len: usize,
    duration: Duration,
) -> Result<Throughput, String> {
    let (na, nb, ia, ib, mtu) = (
        p.ns_a.clone(),
        p.ns_b.clone(),
        p.if_a.clone(),
        p.if_b.clone(),
        p.mtu,
    );
    let (ha, hb) = match &p.headers {
        Some((a, b)) => (Some(a.clone()), Some(b.clone())),
        None => (None, None),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let receiver = std::thread::spawn(move || -> Result<(u64, u64, Duration, Duration), String> {
        enter(&nb).map_err(|e| e.to_string())?;
        pin(1);
        let mut s = RawSide::new(&ib, mtu, hb.clone())?;
        let _ = ready_tx.send(());
        let (mut n, mut bytes) = (0u64, 0u64);
        let mut first = None;
        let mut last = Instant::now();
        let cpu0 = thread_cpu();
        while !st.load(Ordering::Acquire) {
            let mut got = false;
            for _ in 0..64 {
                let Some((len, _)) = s.take_frame() else {
                    break;
                };
                first.get_or_insert_with(Instant::now);
                n += 1;
                bytes += len as u64;
                got = true;
            }
            if got {
                last = Instant::now();
                s.reclaim();
            }
        }
        let span = first.map_or(Duration::ZERO, |f| last.duration_since(f));
        Ok((n, bytes, span, thread_cpu() - cpu0))
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "raw AF_XDP receiver did not start")?;
    let sender = std::thread::spawn(move || -> Result<(u64, Duration), String> {
        enter(&na).map_err(|e| e.to_string())?;
        pin(0);
        let mut c = RawSide::new(&ia, mtu, ha.clone())?;
        let t0 = Instant::now();
        let cpu0 = thread_cpu();
        let mut sent = 0u64;
        while t0.elapsed() < duration {
            let mut queued = 0;
            while queued < 64 && c.queue_frame(frame_len, sent) {
                queued += 1;
                sent += 1;
            }
            c.xsk.kick_tx().map_err(|e| e.to_string())?;
            c.reclaim();
        }
        Ok((sent, thread_cpu() - cpu0))
    });
    let (sent, cpu_tx) = sender.join().map_err(|_| "raw sender panicked")??;
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Release);
    let (n, bytes, span, cpu_rx) = receiver.join().map_err(|_| "raw receiver panicked")??;
    Ok(Throughput::new(n, bytes, n, span, cpu_tx, cpu_rx).with_offered(sent))
}
