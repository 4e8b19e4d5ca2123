//! A small cluster of real `torusd` processes in network namespaces joined by veth pairs,
//! for end-to-end tests and benchmarks; torn down (processes stopped by PID, namespaces
//! deleted) when dropped, so a failing test leaves nothing behind.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::{enter, format_mac, mac_of, veth_pair, Netns};
use serde_json::Value;
use torusnet_proto::topology::{Coord, Dims, Dir};

/// The workspace's release binaries (built by scripts/test.sh before the tests run).
pub fn bin(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let p = root.join("target/release").join(name);
    assert!(
        p.exists(),
        "{} is missing: build with cargo build --release",
        p.display()
    );
    p
}

/// Sends one request to a daemon's management socket (one JSON object per line) and waits
/// up to `timeout` for its answer; an answer carrying `error` is an `Err`.
pub fn request(socket: &Path, req: &Value, timeout: Duration) -> Result<Value, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    writeln!(s, "{req}").map_err(|e| e.to_string())?;
    let mut line = String::new();
    let n = BufReader::new(&s)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if n == 0 {
        return Err(format!(
            "{}: the daemon closed the socket without answering (it stopped or was killed)",
            socket.display()
        ));
    }
    let v: Value = serde_json::from_str(&line).map_err(|e| format!("a malformed answer: {e}"))?;
    match v.get("error") {
        Some(e) => Err(e.to_string()),
        None => Ok(v),
    }
}

/// One server of a test cluster.
pub struct Server {
    /// Its coordinate.
    pub coord: Coord,
    /// Its namespace.
    pub ns: Netns,
    /// Its management socket.
    pub socket: PathBuf,
    /// (interface, direction, neighbour's namespace, neighbour's interface).
    links: Vec<(String, Dir, usize, String)>,
    child: Option<Child>,
    config: String,
}

/// A set of servers with their links.
pub struct Cluster {
    /// The torus.
    pub dims: Dims,
    /// The servers.
    pub servers: Vec<Server>,
    dir: PathBuf,
    mtu: u32,
    tag: String,
    /// Real interfaces moved into the namespaces: (namespace, interface), moved back on drop.
    adopted: Vec<(String, String)>,
}

impl Cluster {
    /// Servers at `coords` of a `dims` torus, no links yet.
    pub fn new(tag: &str, dims: Dims, coords: &[Coord], mtu: u32) -> Cluster {
        let tag = format!("{tag}{}", std::process::id() % 100_000);
        let dir = std::env::temp_dir().join(format!("torusnet-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let servers = coords
            .iter()
            .enumerate()
            .map(|(i, c)| Server {
                coord: *c,
                ns: Netns::new(&format!("{tag}n{i}")).expect("netns"),
                socket: dir.join(format!("n{i}.sock")),
                links: Vec::new(),
                child: None,
                config: String::new(),
            })
            .collect();
        Cluster {
            dims,
            servers,
            dir,
            mtu,
            tag,
            adopted: Vec::new(),
        }
    }

    /// Joins server `a` (direction `dir`) to server `b` (the opposite direction).
    pub fn link(&mut self, a: usize, dir: Dir, b: usize) {
        let ia = format!("t{a}{}", short(dir));
        let ib = format!("t{b}{}", short(dir.opposite()));
        veth_pair(&self.servers[a].ns, &ia, &self.servers[b].ns, &ib, self.mtu).expect("veth");
        self.servers[a].links.push((ia.clone(), dir, b, ib.clone()));
        self.servers[b].links.push((ib, dir.opposite(), a, ia));
    }

    /// Joins server `a` (direction `dir`) to server `b` over two existing interfaces of this
    /// machine cabled to each other (real NICs): they move into the servers' namespaces,
    /// get the cluster's MTU, and move back to the machine's namespace when the cluster is
    /// dropped. Their names stay as they are.
    pub fn adopt(
        &mut self,
        a: usize,
        if_a: &str,
        dir: Dir,
        b: usize,
        if_b: &str,
    ) -> Result<(), String> {
        let run = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| e.to_string())?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        let mtu = self.mtu.to_string();
        for (i, ifname) in [(a, if_a), (b, if_b)] {
            let ns = self.servers[i].ns.name().to_string();
            run(&["link", "set", ifname, "netns", &ns])?;
            self.adopted.push((ns.clone(), ifname.to_string()));
            run(&["-n", &ns, "link", "set", ifname, "mtu", &mtu, "up"])?;
        }
        self.servers[a]
            .links
            .push((if_a.to_string(), dir, b, if_b.to_string()));
        self.servers[b]
            .links
            .push((if_b.to_string(), dir.opposite(), a, if_a.to_string()));
        Ok(())
    }

    /// Writes every server's config (with `extra` TOML appended) and starts `torusd`s,
    /// polling adaptively.
    pub fn start(&mut self, extra: &str) {
        self.start_with(|_| format!("polling = \"adaptive\"\n{extra}"));
    }

    /// Like [`Cluster::start`], with per-server extra TOML (`polling`, `cores`, `[view]`...),
    /// which must set `polling`.
    pub fn start_with(&mut self, extra: impl Fn(usize) -> String) {
        let all: Vec<usize> = (0..self.servers.len()).collect();
        self.start_only(&all, extra);
    }

    /// Like [`Cluster::start_with`], for servers `which` only.
    pub fn start_only(&mut self, which: &[usize], extra: impl Fn(usize) -> String) {
        for &i in which {
            let s = &self.servers[i];
            let mut t = format!(
                "name = \"{}n{i}\"\ndims = \"{}\"\ncoord = \"{}\"\nmtu = {}\numem_chunks = 8192\nsocket = \"{}\"\n{}\n",
                self.tag,
                self.dims,
                s.coord,
                self.mtu,
                s.socket.display(),
                extra(i)
            );
            for (ifname, dir, peer, peer_if) in &s.links {
                let mac = in_ns(self.servers[*peer].ns.name(), peer_if);
                t += &format!(
                    "[[link]]\nifname = \"{ifname}\"\ndir = \"{dir}\"\nneighbor_mac = \"{}\"\n",
                    format_mac(mac)
                );
            }
            let path = self.config_path(i);
            std::fs::write(&path, &t).expect("write config");
            self.servers[i].config = t;
            self.spawn(i);
        }
        for &i in which {
            self.wait_ready(i);
        }
    }

    /// Server `i`'s node file.
    pub fn config_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{i}.toml"))
    }

    fn spawn(&mut self, i: usize) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("n{i}.log")))
            .expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", self.servers[i].ns.name()])
            .arg(bin("torusd"))
            .arg("--config")
            .arg(self.config_path(i))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn torusd");
        self.servers[i].child = Some(child);
    }

    /// Stops server `i`'s torusd (SIGTERM, then SIGKILL after 3 s) and waits for it.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut c) = self.servers[i].child.take() {
            // SAFETY: sending a signal to a process we started.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts server `i`'s torusd again with its node file, and waits until it answers.
    pub fn restart(&mut self, i: usize) {
        self.stop(i);
        self.spawn(i);
        self.wait_ready(i);
    }

    fn wait_ready(&mut self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(c) = self.servers[i].child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("torusd n{i} exited ({st}): {}", self.log(i));
                }
            }
            if self.ctl(i, &serde_json::json!({"cmd": "status"})).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("torusd n{i} not ready: {}", self.log(i));
    }

    /// Server `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("n{i}.log"))).unwrap_or_default()
    }

    /// Sends one management request to server `i`.
    pub fn ctl(&self, i: usize, req: &Value) -> Result<Value, String> {
        request(&self.servers[i].socket, req, Duration::from_secs(900))
    }

    /// Server `i`'s torusd process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.servers[i].child.as_ref().map(|c| c.id())
    }

    /// Kills server `i`'s torusd (SIGKILL: a crash, not a shutdown).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.servers[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn short(d: Dir) -> &'static str {
    ["px", "mx", "py", "my", "pz", "mz"][usize::from(d.index())]
}

/// The MAC of interface `ifname` in namespace `ns`.
pub fn in_ns(ns: &str, ifname: &str) -> [u8; 6] {
    let (ns, ifname) = (ns.to_string(), ifname.to_string());
    std::thread::spawn(move || {
        enter(&ns).expect("enter netns");
        mac_of(&ifname).expect("mac")
    })
    .join()
    .expect("mac thread")
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Stop everything first, then give real interfaces back before the namespaces go
        // (deleting a namespace would move a physical NIC back anyway, but a veth would die).
        let adopted = std::mem::take(&mut self.adopted);
        let give_back = move || {
            for (ns, ifname) in &adopted {
                let _ = Command::new("ip")
                    .args(["-n", ns, "link", "set", ifname, "netns", "1"])
                    .status();
            }
        };
        for s in &mut self.servers {
            if let Some(mut c) = s.child.take() {
                // `ip netns exec` runs torusd as its child; SIGTERM the pair, then make sure.
                // SAFETY: sending a signal to a process we started.
                unsafe {
                    libc::kill(c.id() as i32, libc::SIGTERM);
                }
                let deadline = Instant::now() + Duration::from_secs(3);
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = c.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        give_back();
        // Namespaces go with the servers (Netns drop); the temp dir with logs stays only on
        // failure, for reading.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
