//! `torus-bench kv-node`: one server of the key-value store's *switch baseline* (CamCube's
//! comparison: the same store over TCP through a switch). The very same `Kv` service and
//! memcached gateway run here, but servers talk over kernel TCP, a full mesh across one
//! bridge, instead of the torus: every server is one hop from every other, so the cache's
//! closest-server rule sends reads to the primary unless this server is a cache server of
//! the key itself.
//!
//! Framing between servers: `len u32 | payload`, after a hello (`index u16`) on each
//! connection. One thread owns the service (as a poller would); one reader thread per
//! incoming connection hands it messages. Write errors make a peer unreachable; nothing
//! else fails here (the baseline measures speed, the torus e2e tests measure failures).

use std::io::{BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use torusnet_dataplane::kvgw::{self, GatewayConfig, Submit};
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::service::{Engine, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims};
use torusnet_proto::transport::SendError;
use torusnet_services::kv::{Kv, KvConfig, KvCounters, KvRequest, KV};

/// Arguments of `torus-bench kv-node`.
#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    /// Torus dimensions (the same key space as the torus run).
    #[arg(long, value_parser = |s: &str| s.parse::<Dims>().map_err(|e| e.to_string()))]
    dims: Dims,
    /// This server, x,y,z.
    #[arg(long, value_parser = |s: &str| s.parse::<Coord>().map_err(|e| e.to_string()))]
    me: Coord,
    /// The switch network's first two octets: server i is NET.(i/250).(i%250+1).
    #[arg(long, default_value = "10.88")]
    net: String,
    /// Port of the servers' mesh.
    #[arg(long, default_value_t = 7000)]
    port: u16,
    /// The memcached gateway's address.
    #[arg(long, default_value = "0.0.0.0:11211")]
    listen: SocketAddr,
    /// Reads go straight to the primary.
    #[arg(long)]
    no_cache: bool,
}

enum Input {
    Msg(Coord, Vec<u8>),
    Req(KvRequest),
}

struct ToLoop(Sender<Input>);

impl Submit for ToLoop {
    fn submit(&self, req: KvRequest) -> Result<(), String> {
        self.0
            .send(Input::Req(req))
            .map_err(|_| "the store stopped".to_string())
    }
}

/// Servers in one full mesh: everyone one hop away.
struct Mesh {
    me: Coord,
    dims: Dims,
    out: Vec<Option<BufWriter<TcpStream>>>,
}

impl Engine for Mesh {
    fn local(&self) -> Coord {
        self.me
    }
    fn dims(&self) -> Dims {
        self.dims
    }
    fn incarnation(&self) -> u64 {
        1
    }
    fn is_reachable(&self, c: Coord) -> bool {
        c == self.me || (self.dims.contains(c) && self.out[self.dims.index(c)].is_some())
    }
    fn distance(&self, c: Coord) -> Option<u32> {
        if c == self.me {
            Some(0)
        } else {
            self.is_reachable(c).then_some(1)
        }
    }
    fn send(
        &mut self,
        _now: Time,
        target: Target,
        _service: u16,
        data: &[u8],
        _opts: MsgOptions,
    ) -> Result<(), SendError> {
        let Target::Server(c) = target else {
            return Err(SendError::Unreachable);
        };
        if !self.dims.contains(c) {
            return Err(SendError::Unreachable);
        }
        let i = self.dims.index(c);
        let Some(w) = &mut self.out[i] else {
            return Err(SendError::Unreachable);
        };
        let ok = w
            .write_all(&(data.len() as u32).to_le_bytes())
            .and_then(|()| w.write_all(data));
        if ok.is_err() {
            self.out[i] = None;
            return Err(SendError::Unreachable);
        }
        Ok(())
    }
    fn notify_acks(&mut self, _service: u16, _on: bool) {}
}

fn addr(net: &str, i: usize, port: u16) -> String {
    format!("{net}.{}.{}:{port}", i / 250, i % 250 + 1)
}

fn reader(mut s: TcpStream, dims: Dims, tx: Sender<Input>) {
    let mut hello = [0u8; 2];
    if s.read_exact(&mut hello).is_err() {
        return;
    }
    let i = usize::from(u16::from_le_bytes(hello));
    if i >= dims.count() as usize {
        return;
    }
    let src = dims.coord(i);
    let mut len = [0u8; 4];
    loop {
        if s.read_exact(&mut len).is_err() {
            return;
        }
        let n = u32::from_le_bytes(len) as usize;
        if n > 64 << 20 {
            return;
        }
        let mut data = vec![0u8; n];
        if s.read_exact(&mut data).is_err() || tx.send(Input::Msg(src, data)).is_err() {
            return;
        }
    }
}

/// Runs one server until killed.
pub fn run_node(a: &NodeArgs) -> Result<(), String> {
    let dims = a.dims;
    let me_i = dims.index(dims.check(a.me).map_err(|e| e.to_string())?);
    let (tx, rx): (Sender<Input>, Receiver<Input>) = channel();
    let listener = TcpListener::bind(("0.0.0.0", a.port)).map_err(|e| e.to_string())?;
    let t = tx.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            let _ = s.set_nodelay(true);
            let t = t.clone();
            std::thread::spawn(move || reader(s, dims, t));
        }
    });
    // Connect to everyone (they start at about the same time).
    let mut out: Vec<Option<BufWriter<TcpStream>>> = (0..dims.count()).map(|_| None).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, slot) in out.iter_mut().enumerate() {
        if i == me_i {
            continue;
        }
        let to = addr(&a.net, i, a.port);
        let s = loop {
            match TcpStream::connect(&to) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => return Err(format!("{to}: {e}")),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let _ = s.set_nodelay(true);
        let mut w = BufWriter::with_capacity(256 << 10, s);
        w.write_all(&(me_i as u16).to_le_bytes())
            .and_then(|()| w.flush())
            .map_err(|e| format!("{to}: {e}"))?;
        *slot = Some(w);
    }
    let counters = Arc::new(KvCounters::default());
    let epoch_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let cfg = KvConfig {
        cache: !a.no_cache,
        epoch_us,
        ..KvConfig::default()
    };
    let mut kv = Kv::new(cfg.clone(), counters.clone());
    let gw = kvgw::start(
        GatewayConfig {
            listen: a.listen,
            max_connections: 4096,
            max_item: 1 << 20,
            timeout: cfg.op_timeout + Duration::from_secs(2),
        },
        Arc::new(ToLoop(tx)),
        counters,
    )
    .map_err(|e| format!("gateway {}: {e}", a.listen))?;
    eprintln!("kv-node {} ready (gateway {})", a.me, gw.addr);
    let mut mesh = Mesh {
        me: a.me,
        dims,
        out,
    };
    let start = Instant::now();
    let now = || Time::from_nanos(start.elapsed().as_nanos() as u64);
    loop {
        let t = now();
        let wait = kv
            .poll_timeout()
            .map_or(Duration::from_millis(20), |d| d.since(t))
            .min(Duration::from_millis(20));
        let first = if wait.is_zero() {
            rx.try_recv().ok()
        } else {
            match rx.recv_timeout(wait) {
                Ok(i) => Some(i),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
        };
        let mut next = first;
        let mut n = 0;
        while let Some(input) = next {
            let t = now();
            match input {
                Input::Msg(src, data) => {
                    let ev = Event::Message {
                        src,
                        service: KV,
                        data,
                        reliable: true,
                        key: None,
                    };
                    kv.on_event(t, &ev, &mut mesh);
                }
                Input::Req(r) => {
                    let _ = kv.on_request(t, Box::new(r), &mut mesh);
                }
            }
            n += 1;
            next = if n < 1024 { rx.try_recv().ok() } else { None };
        }
        kv.poll(now(), &mut mesh);
        for w in mesh.out.iter_mut().flatten() {
            let _ = w.flush();
        }
    }
}
