//! Prometheus metrics: families built from a daemon's status, rendered in the text
//! exposition format (version 0.0.4), and a small HTTP server answering `GET /metrics` on a
//! configured address. It serves one client at a time with short deadlines, so a scraper
//! that stalls or sends garbage gets an error or is dropped and costs the daemon nothing else.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a family measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (resets when the daemon restarts).
    Counter,
    /// Goes up and down.
    Gauge,
}

#[derive(Debug)]
struct Family {
    help: String,
    kind: Kind,
    samples: Vec<(String, f64)>,
}

/// Metric families being collected for one scrape.
#[derive(Debug, Default)]
pub struct Exposition {
    families: BTreeMap<String, Family>,
}

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `s` as a metric-name part: anything but `[a-zA-Z0-9_]` becomes `_`.
pub fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Exposition {
    /// Empty.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Adds a sample of family `name` (created with `help` and `kind` on first use); a name
    /// that is not a valid metric name is skipped.
    pub fn add(&mut self, name: &str, kind: Kind, help: &str, labels: &[(&str, &str)], value: f64) {
        if !valid_name(name) || labels.iter().any(|(k, _)| !valid_name(k)) {
            return;
        }
        let mut l = String::new();
        if !labels.is_empty() {
            l.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    l.push(',');
                }
                let _ = write!(l, "{k}=\"{}\"", escape(v));
            }
            l.push('}');
        }
        self.families
            .entry(name.to_string())
            .or_insert_with(|| Family {
                help: help.replace('\n', " "),
                kind,
                samples: Vec::new(),
            })
            .samples
            .push((l, value));
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, f) in &self.families {
            let kind = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
            };
            let _ = writeln!(out, "# HELP {name} {}", f.help.replace('\\', "\\\\"));
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, v) in &f.samples {
                if v.is_finite() {
                    let _ = writeln!(out, "{name}{labels} {v}");
                }
            }
        }
        out
    }

    /// Every numeric leaf of a JSON object as a sample of `prefix_<path>` with `labels`
    /// (booleans as 0/1; strings, nulls and arrays skipped: callers label arrays themselves).
    /// Families named in `counters` (by their path's last part) are counters; others gauges.
    pub fn add_json(
        &mut self,
        prefix: &str,
        v: &serde_json::Value,
        labels: &[(&str, &str)],
        counters: &dyn Fn(&str) -> bool,
    ) {
        let Some(obj) = v.as_object() else { return };
        for (k, x) in obj {
            let name = format!("{prefix}_{}", sanitize(k));
            match x {
                serde_json::Value::Number(n) => {
                    if let Some(f) = n.as_f64() {
                        let kind = if counters(k) {
                            Kind::Counter
                        } else {
                            Kind::Gauge
                        };
                        let help =
                            format!("{} ({})", k.replace('_', " "), prefix.replace('_', " "));
                        let name = if kind == Kind::Counter && !name.ends_with("_total") {
                            format!("{name}_total")
                        } else {
                            name
                        };
                        self.add(&name, kind, &help, labels, f);
                    }
                }
                serde_json::Value::Bool(b) => {
                    self.add(
                        &name,
                        Kind::Gauge,
                        &k.replace('_', " "),
                        labels,
                        f64::from(u8::from(*b)),
                    );
                }
                serde_json::Value::Object(_) => self.add_json(&name, x, labels, counters),
                _ => {}
            }
        }
    }
}

/// A running metrics endpoint; stops when dropped.
pub struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The address it listens on (the port the kernel chose for port 0).
    pub addr: SocketAddr,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("addr", &self.addr).finish()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Longest a scraper may take to send its request.
const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Largest request read.
const MAX_REQUEST: usize = 8192;

/// Serves `render()` at `GET /metrics` on `addr` from a thread of its own.
pub fn serve(
    addr: SocketAddr,
    render: impl Fn() -> String + Send + 'static,
) -> std::io::Result<Server> {
    let listener = TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            while !s.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((stream, _)) => answer(stream, &render),
                    Err(_) => wait_readable(listener.as_raw_fd(), 250),
                }
            }
        })?;
    Ok(Server {
        stop,
        thread: Some(thread),
        addr,
    })
}

/// As [`serve`], but binding from the endpoint's own thread, retrying for `within` while the
/// address is in use: a daemon restarted at once after a kill starts while the kernel still
/// tears down its predecessor's socket (a killed process's threads exit one by one), and its
/// dataplane must not wait for that. Gives up with an error in the log.
pub fn serve_retrying(
    addr: SocketAddr,
    within: Duration,
    render: impl Fn() -> String + Send + 'static,
) -> std::io::Result<Server> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            let start = Instant::now();
            let listener = loop {
                match TcpListener::bind(addr).and_then(|l| l.set_nonblocking(true).map(|()| l)) {
                    Ok(l) => break l,
                    Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && start.elapsed() < within => {
                        if s.load(Ordering::Acquire) {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(e) => {
                        tracing::error!(address = %addr, "metrics endpoint: {e}; no metrics are served");
                        return;
                    }
                }
            };
            tracing::info!(address = %addr, "serving Prometheus metrics at /metrics");
            while !s.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((stream, _)) => answer(stream, &render),
                    Err(_) => wait_readable(listener.as_raw_fd(), 250),
                }
            }
        })?;
    Ok(Server {
        stop,
        thread: Some(thread),
        addr,
    })
}

fn wait_readable(fd: i32, ms: i32) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) };
}

/// Reads one request (up to the end of its headers) and answers it.
fn answer(mut s: TcpStream, render: &dyn Fn() -> String) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_write_timeout(Some(REQUEST_DEADLINE));
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || buf.len() > MAX_REQUEST {
            return reply(
                &mut s,
                "408 Request Timeout",
                "text/plain",
                "request incomplete\n",
            );
        }
        let _ = s.set_read_timeout(Some(left));
        match s.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => {
                return reply(
                    &mut s,
                    "408 Request Timeout",
                    "text/plain",
                    "request incomplete\n",
                )
            }
        }
    }
    let line =
        String::from_utf8_lossy(buf.split(|b| *b == b'\n').next().unwrap_or(&[])).into_owned();
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some("GET"), Some(path)) if path == "/metrics" || path.starts_with("/metrics?") => {
            let body = render();
            reply(
                &mut s,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                &body,
            )
        }
        (Some("GET"), Some(_)) => reply(&mut s, "404 Not Found", "text/plain", "try /metrics\n"),
        (Some(_), Some(_)) => reply(&mut s, "405 Method Not Allowed", "text/plain", "GET only\n"),
        _ => reply(&mut s, "400 Bad Request", "text/plain", "not HTTP\n"),
    }
}

fn reply(s: &mut TcpStream, status: &str, ctype: &str, body: &str) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_grouped_with_help_and_type() {
        let mut e = Exposition::new();
        e.add(
            "torusnet_link_rx_frames_total",
            Kind::Counter,
            "frames",
            &[("link", "+x")],
            5.0,
        );
        e.add("torusnet_view_version", Kind::Gauge, "view", &[], 3.0);
        e.add(
            "torusnet_link_rx_frames_total",
            Kind::Counter,
            "frames",
            &[("link", "-\"x")],
            7.0,
        );
        e.add("bad name", Kind::Gauge, "skipped", &[], 1.0);
        let t = e.render();
        assert_eq!(
            t.matches("# TYPE torusnet_link_rx_frames_total counter")
                .count(),
            1
        );
        assert!(t.contains("torusnet_link_rx_frames_total{link=\"+x\"} 5\n"));
        assert!(t.contains("torusnet_link_rx_frames_total{link=\"-\\\"x\"} 7\n"));
        assert!(!t.contains("bad name"));
    }

    #[test]
    fn json_leaves_become_samples() {
        let v =
            serde_json::json!({"rx_frames": 3, "up": true, "name": "x", "xdp": {"drop_bad": 2}});
        let mut e = Exposition::new();
        e.add_json("torusnet_link", &v, &[("link", "+y")], &|k| k != "up");
        let t = e.render();
        assert!(t.contains("torusnet_link_rx_frames_total{link=\"+y\"} 3"));
        assert!(t.contains("torusnet_link_up{link=\"+y\"} 1"));
        assert!(t.contains("torusnet_link_xdp_drop_bad_total{link=\"+y\"} 2"));
        assert!(!t.contains("name"));
    }

    #[test]
    fn waits_for_a_predecessor_to_let_go_of_the_address() {
        let held = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = held.local_addr().expect("addr");
        let s =
            serve_retrying(addr, Duration::from_secs(5), || "up 1\n".to_string()).expect("spawn");
        std::thread::sleep(Duration::from_millis(300));
        drop(held);
        let deadline = Instant::now() + Duration::from_secs(5);
        let body = loop {
            if let Ok(mut c) = TcpStream::connect(s.addr) {
                c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").expect("send");
                let mut out = String::new();
                let _ = c.read_to_string(&mut out);
                if out.starts_with("HTTP/1.1 200") {
                    break out;
                }
            }
            assert!(Instant::now() < deadline, "never served");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(body.ends_with("up 1\n"));
    }

    #[test]
    fn serves_metrics_and_refuses_the_rest() {
        let s = serve("127.0.0.1:0".parse().unwrap(), || {
            "a_metric 1\n".to_string()
        })
        .expect("bind");
        let ask = |req: &[u8]| {
            let mut c = TcpStream::connect(s.addr).expect("connect");
            c.write_all(req).expect("send");
            let mut out = String::new();
            let _ = c.read_to_string(&mut out);
            out
        };
        let ok = ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("a_metric 1\n"),
            "{ok}"
        );
        assert!(ask(b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(ask(b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert!(ask(b"\x00\x01garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        // A client that sends half a request and stalls is cut off; the next one is served.
        let mut stall = TcpStream::connect(s.addr).expect("connect");
        stall.write_all(b"GET /met").expect("send");
        assert!(ask(b"GET /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 200"));
    }
}
