//! End-to-end tests of torusnet live in `tests/tests/`: real daemons in network namespaces.
//! This library holds what those tests share: a torus of namespaces made by
//! scripts/netns-torus.sh, reached through the daemons' management sockets. (Smaller
//! clusters built from Rust are `torusnet_dataplane::cluster`.)

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use torusnet_dataplane::cluster;
use torusnet_proto::topology::Dims;

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
}

impl Torus {
    /// Creates the namespaces and links (`netns-torus.sh up`), without starting daemons.
    pub fn up(prefix: &str, dims: &str) -> Torus {
        // Made before `up` runs so that a half-built torus is torn down too.
        let t = Torus {
            prefix: prefix.to_string(),
            dims: dims.parse().expect("torus size"),
        };
        t.script(&["up", dims]);
        t
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
    }
}
