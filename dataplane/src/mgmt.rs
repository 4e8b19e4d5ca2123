//! The management socket of `torusd`: a Unix stream socket speaking one JSON object per
//! line each way, for `torusctl status` and friends, tests and scripts. Bad requests get
//! an error object; the daemon keeps serving.
//!
//! Requests: `{"cmd":"status"}`, `{"cmd":"ping","to":"x,y,z","count":N,"size":B,"reliable":false}`,
//! `{"cmd":"bench","to":"x,y,z","bytes":N,"size":B,"fence_every":F}`,
//! `{"cmd":"fault","link":"+x","drop":0.02}`, `{"cmd":"shutdown"}`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use torusnet_proto::topology::{Coord, Dir};

use crate::builtin::{BenchRequest, PingRequest};
use crate::runtime::{Command, Dataplane};

/// The management server of one dataplane.
pub struct Mgmt {
    path: PathBuf,
    listener: UnixListener,
}

impl Mgmt {
    /// Binds the socket at `path` (replacing a stale one; creating its directory).
    pub fn bind(path: &Path) -> std::io::Result<Mgmt> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        Ok(Mgmt {
            path: path.to_path_buf(),
            listener,
        })
    }

    /// Serves requests until `stop` is set (checked every 50 ms) or a client asks to shut
    /// down, which sets `stop`.
    pub fn serve(&self, dp: &Dataplane, stop: &Arc<AtomicBool>) {
        while !stop.load(Ordering::Acquire) && dp.is_running() {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    let _ = stream.set_nonblocking(false);
                    self.client(stream, dp, stop);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn client(&self, stream: UnixStream, dp: &Dataplane, stop: &Arc<AtomicBool>) {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(600)));
        let Ok(mut out) = stream.try_clone() else {
            return;
        };
        let reader = BufReader::new(stream);
        for line in reader.lines() {
            let Ok(line) = line else { return };
            if line.trim().is_empty() {
                continue;
            }
            let answer = match serde_json::from_str::<Value>(&line) {
                Ok(req) => handle(&req, dp, stop),
                Err(e) => json!({"error": format!("not JSON: {e}")}),
            };
            if writeln!(out, "{answer}").is_err() {
                return;
            }
            if stop.load(Ordering::Acquire) {
                return;
            }
        }
    }
}

impl Drop for Mgmt {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn coord(req: &Value, field: &str) -> Result<Coord, String> {
    let s = req
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("missing \"{field}\": x,y,z"))?;
    s.parse().map_err(|e| format!("{field}: {e}"))
}

fn wait(rx: mpsc::Receiver<Value>, secs: u64) -> Value {
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| json!({"error": "no answer from the poller in time"}))
}

fn handle(req: &Value, dp: &Dataplane, stop: &Arc<AtomicBool>) -> Value {
    let cmd = req.get("cmd").and_then(Value::as_str).unwrap_or("");
    let r: Result<Value, String> = (|| match cmd {
        "status" => serde_json::to_value(dp.status()).map_err(|e| e.to_string()),
        "ping" => {
            let to = coord(req, "to")?;
            let count = req
                .get("count")
                .and_then(Value::as_u64)
                .unwrap_or(100)
                .clamp(1, 10_000_000) as u32;
            let size = req
                .get("size")
                .and_then(Value::as_u64)
                .unwrap_or(64)
                .clamp(9, 8000) as usize;
            let reliable = req
                .get("reliable")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let (tx, rx) = mpsc::channel();
            dp.command(Command::Ping(PingRequest {
                to,
                count,
                size,
                reliable,
                reply: tx,
            }))
            .map_err(|_| "the poller's command queue is full".to_string())?;
            Ok(wait(rx, 600))
        }
        "bench" => {
            let to = coord(req, "to")?;
            let bytes = req.get("bytes").and_then(Value::as_u64).unwrap_or(1 << 30);
            let size = req
                .get("size")
                .and_then(Value::as_u64)
                .unwrap_or(65536)
                .clamp(13, 64 << 20) as usize;
            let fence_every = req.get("fence_every").and_then(Value::as_u64).unwrap_or(0);
            let (tx, rx) = mpsc::channel();
            dp.command(Command::Bench(BenchRequest {
                to,
                bytes,
                size,
                fence_every,
                reply: tx,
            }))
            .map_err(|_| "the poller's command queue is full".to_string())?;
            Ok(wait(rx, 1800))
        }
        "fault" => {
            let link = req
                .get("link")
                .and_then(Value::as_str)
                .ok_or("missing \"link\": +x ... -z")?;
            let dir: Dir = link.parse().map_err(|e| format!("link: {e}"))?;
            let drop = req
                .get("drop")
                .and_then(Value::as_f64)
                .ok_or("missing \"drop\": 0..1")?;
            if !(0.0..=1.0).contains(&drop) {
                return Err(format!("drop: {drop} is not a probability"));
            }
            dp.command(Command::SetFault { dir, drop })
                .map_err(|_| "the poller's command queue is full".to_string())?;
            Ok(json!({"ok": true}))
        }
        "shutdown" => {
            stop.store(true, Ordering::Release);
            Ok(json!({"ok": true}))
        }
        other => Err(format!(
            "unknown command {other:?} (status, ping, bench, fault, shutdown)"
        )),
    })();
    r.unwrap_or_else(|e| json!({"error": e}))
}
