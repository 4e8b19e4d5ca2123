//! End-to-end tests of torusnet live in `tests/tests/`: real daemons in network namespaces.
//! This library holds what those tests share: a torus of namespaces made by
//! scripts/netns-torus.sh, reached through the daemons' management sockets. (Smaller
//! clusters built from Rust are `torusnet_dataplane::cluster`.)

use std::fmt::Display;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_dataplane::cluster;
use torusnet_proto::topology::Dims;

pub mod ip;

/// A whole number a test reads from the environment (a soak's length, a count of
/// restarts), else `default`; anything else set there stops the test with its name.
pub fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("{name}={s:?}: not a whole number")),
        Err(_) => default,
    }
}

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `ip` and fails the test if it fails.
pub fn ip(args: &[&str]) {
    let ok = Command::new("ip").args(args).status().expect("run ip");
    assert!(ok.success(), "ip {args:?}");
}

/// A torus of namespaces (one per server, named `<prefix>-x-y-z`), removed with everything in
/// it when dropped, so a failing test leaves nothing behind. Servers are named by anything
/// that displays as `x,y,z` (a `Coord` or a string).
pub struct Torus {
    /// The namespace prefix.
    pub prefix: String,
    /// The torus size.
    pub dims: Dims,
    /// Daemons this test (re)started itself, reaped as they exit.
    children: Mutex<Vec<Child>>,
}

/// One of a server's two daemons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Daemon {
    /// The dataplane, `torusd`.
    Torusd,
    /// The control process, `torusctl daemon`.
    Control,
}

impl Daemon {
    fn matches(self, cmdline: &str) -> bool {
        match self {
            Daemon::Torusd => cmdline.contains("/torusd "),
            Daemon::Control => cmdline.contains("torusctl daemon"),
        }
    }
}

/// Whether process `pid` runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses.
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|st| st != "Z" && st != "X"),
        Err(_) => false,
    }
}

impl Torus {
    /// Creates the namespaces and links (`netns-torus.sh up`), without starting daemons.
    pub fn up(prefix: &str, dims: &str) -> Torus {
        Torus::up_with(prefix, dims, &[])
    }

    /// As [`Torus::up`], with more options for `netns-torus.sh up` (`--front`, `--kv LINE`).
    pub fn up_with(prefix: &str, dims: &str, extra: &[&str]) -> Torus {
        // Made before `up` runs so that a half-built torus is torn down too.
        let t = Torus {
            prefix: prefix.to_string(),
            dims: dims.parse().expect("torus size"),
            children: Mutex::new(Vec::new()),
        };
        let mut args = vec!["up", dims];
        args.extend_from_slice(extra);
        t.script(&args);
        t
    }

    /// Waits until every server's control process reaches every server and published the
    /// view it computed.
    pub fn wait_converged(&self, limit: Duration) {
        let n = json!(self.dims.count());
        let start = Instant::now();
        loop {
            let ok = self.dims.coords().all(|c| {
                self.control(c).is_some_and(|v| {
                    v["reachable"] == n && v["published_version"] == v["view_version"]
                })
            });
            if ok {
                return;
            }
            assert!(start.elapsed() < limit, "no convergence within {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The address of server `c`'s memcached gateway on the front network (`--front`).
    pub fn front_addr(&self, c: torusnet_proto::topology::Coord) -> String {
        let i = self.dims.index(c);
        format!("10.88.{}.{}", i / 250, i % 250 + 1)
    }

    /// Starts both daemons in every namespace.
    pub fn start(&self) {
        self.script(&["start"]);
    }

    /// Stops every daemon, keeping the namespaces.
    pub fn stop(&self) {
        self.script(&["stop"]);
    }

    fn script(&self, args: &[&str]) {
        let ok = Command::new("bash")
            .arg(root().join("scripts/netns-torus.sh"))
            .args(args)
            .args(["--prefix", &self.prefix])
            .status()
            .expect("run netns-torus.sh");
        assert!(ok.success(), "netns-torus.sh {args:?} failed");
    }

    fn base(c: impl Display) -> String {
        c.to_string().replace(',', "-")
    }

    /// Server `c`'s namespace.
    pub fn ns(&self, c: impl Display) -> String {
        format!("{}-{}", self.prefix, Torus::base(c))
    }

    /// Server `c`'s management socket: torusd's, or the control process's.
    pub fn sock(&self, c: impl Display, control: bool) -> PathBuf {
        PathBuf::from(format!(
            "/run/torusnet/{}/{}{}.sock",
            self.prefix,
            Torus::base(c),
            if control { "-control" } else { "" }
        ))
    }

    /// One request to server `c`'s torusd (or control process); `None` when it does not
    /// answer or answers with an error.
    pub fn ask(&self, c: impl Display, control: bool, req: &Value) -> Option<Value> {
        cluster::request(&self.sock(c, control), req, Duration::from_secs(600)).ok()
    }

    /// One request to server `c`'s torusd, answered within `limit`: the answer, or the error
    /// (torusd's, or that it did not answer).
    pub fn ask_within(
        &self,
        c: impl Display,
        req: &Value,
        limit: Duration,
    ) -> Result<Value, String> {
        cluster::request(&self.sock(c, false), req, limit)
    }

    /// A checked bulk transfer (torusd's bench service) of `bytes` from `from` to `to`,
    /// within two minutes; its report, every byte verified at the receiver.
    pub fn checked_bench(&self, from: impl Display, to: impl Display, bytes: u64) -> Value {
        let r = self
            .ask_within(
                from,
                &json!({"cmd": "bench", "to": to.to_string(), "bytes": bytes, "timeout_ms": 120_000}),
                Duration::from_secs(130),
            )
            .expect("bench");
        assert_eq!(r["receiver"]["verified"], json!(true), "{r}");
        assert_eq!(r["receiver"]["bytes"], r["bytes"], "{r}");
        r
    }

    /// Server `c`'s node file.
    pub fn node_file(&self, c: impl Display) -> PathBuf {
        PathBuf::from(format!(
            "/run/torusnet/{}/{}.toml",
            self.prefix,
            Torus::base(c)
        ))
    }

    /// The state directory of this torus (node files, logs, sockets).
    pub fn dir(&self) -> PathBuf {
        PathBuf::from(format!("/run/torusnet/{}", self.prefix))
    }

    /// PIDs of one of server `c`'s daemons.
    pub fn pids(&self, c: impl Display, which: Daemon) -> Vec<u32> {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.ns(c)])
            .output()
            .expect("run ip netns pids");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
            .filter(|p| alive(*p))
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .map(|b| which.matches(&String::from_utf8_lossy(&b).replace('\0', " ")))
                    .unwrap_or(false)
            })
            .collect()
    }

    /// Sends `signal` (e.g. "TERM", "KILL") to one of server `c`'s daemons and waits (up to
    /// 10 s) until it is gone.
    pub fn signal(&self, c: impl Display + Copy, which: Daemon, signal: &str) {
        let pids = self.pids(c, which);
        assert!(!pids.is_empty(), "no {which:?} runs at {c}");
        for p in &pids {
            let _ = Command::new("kill")
                .args([format!("-{signal}"), p.to_string()])
                .status();
        }
        let start = Instant::now();
        while pids.iter().any(|p| alive(*p)) {
            self.reap();
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{which:?} at {c} did not exit after SIG{signal}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Starts one of server `c`'s daemons again, logging beside the others; `netns-torus.sh
    /// down` stops it with the rest.
    pub fn start_daemon(&self, c: impl Display + Copy, which: Daemon) {
        self.reap();
        let bin = root().join("target/release");
        let node = self.node_file(c);
        let (exe, args, log): (PathBuf, Vec<&str>, &str) = match which {
            Daemon::Torusd => (bin.join("torusd"), vec![], "torusd"),
            Daemon::Control => (bin.join("torusctl"), vec!["daemon"], "control"),
        };
        let logf = self.dir().join(format!("{}-{log}.log", Torus::base(c)));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&logf)
            .expect("open the daemon's log");
        let err = out.try_clone().expect("clone the log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(c)])
            .arg(exe)
            .args(args)
            .arg("--config")
            .arg(node)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start the daemon");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir().join("pids"))
        {
            let _ = writeln!(f, "{}", child.id());
        }
        self.children.lock().expect("children").push(child);
    }

    /// Collects the exit status of daemons this test started that have exited.
    fn reap(&self) {
        if let Ok(mut v) = self.children.lock() {
            v.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
        }
    }

    /// Server `c`'s control-process status.
    pub fn control(&self, c: impl Display) -> Option<Value> {
        self.ask(c, true, &json!({"cmd": "status"}))
    }

    /// Kills every process in a server's namespace (both of its daemons).
    pub fn kill(&self, c: impl Display) {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.ns(c)])
            .output()
            .expect("run ip netns pids");
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
    }
}

impl Drop for Torus {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(root().join("scripts/netns-torus.sh"))
            .args(["down", "--prefix", &self.prefix])
            .status();
        // `down` stopped the daemons this test started too: collect them.
        if let Ok(mut v) = self.children.lock() {
            for c in v.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Sends raw frames (the test's own, hostile ones too) out of `ifname` in namespace `ns`.
pub fn inject(ns: &str, ifname: &str, frames: Vec<Vec<u8>>) {
    let (ns, ifname) = (ns.to_string(), ifname.to_string());
    std::thread::spawn(move || {
        torusnet_dataplane::netns::enter(&ns).unwrap();
        // SAFETY: a raw packet socket for the test's own frames.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                (libc::ETH_P_ALL as u16).to_be() as i32,
            )
        };
        assert!(fd >= 0);
        let c = std::ffi::CString::new(ifname).unwrap();
        // SAFETY: plain syscalls on our socket.
        unsafe {
            let mut sa: libc::sockaddr_ll = std::mem::zeroed();
            sa.sll_family = libc::AF_PACKET as u16;
            sa.sll_ifindex = libc::if_nametoindex(c.as_ptr()) as i32;
            assert!(
                libc::bind(
                    fd,
                    (&sa as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32
                ) == 0
            );
            for f in &frames {
                libc::send(fd, f.as_ptr().cast(), f.len(), 0);
            }
            libc::close(fd);
        }
    })
    .join()
    .unwrap();
}

pub fn mac(t: &Torus, c: torusnet_proto::topology::Coord, ifname: &str) -> [u8; 6] {
    let out = Command::new("ip")
        .args(["-n", &t.ns(c), "-j", "link", "show", ifname])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    torusnet_dataplane::netns::parse_mac(v[0]["address"].as_str().unwrap()).unwrap()
}

/// A data frame with an 8-byte payload from `src` to `dst`, as a server whose MAC is
/// `victim` receives it from its neighbour `attacker`; source-routed along `dirs` (its next
/// hop `next`) when `dirs` is not empty. What the tests inject, hostile frames made from it.
pub fn data_frame(
    victim: [u8; 6],
    attacker: [u8; 6],
    src: torusnet_proto::topology::Coord,
    dst: torusnet_proto::topology::Coord,
    dirs: &[torusnet_proto::topology::Dir],
    next: u8,
) -> Vec<u8> {
    use torusnet_proto::routing::source::{self, Route};
    use torusnet_proto::wire::{self, offset, Dest, Header, Kind, HEADERS_LEN};
    let mut h = Header::new(Kind::Data, src, Dest::Server(dst));
    h.payload_len = 8;
    let mut b = vec![0u8; HEADERS_LEN + 8 + dirs.len()];
    h.emit(&mut b).expect("room for the headers");
    wire::emit_eth(&mut b, victim, attacker).expect("room for the addresses");
    if let Some(route) = Route::new(dirs) {
        let len = source::insert(&mut b, HEADERS_LEN + 8, &route).expect("room for the route");
        b.truncate(len);
        b[offset::ROUTE_NEXT] = next;
    }
    b
}
