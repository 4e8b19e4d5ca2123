//! `torusctl`: queries about a torus (keys, routes) from the command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use torusnet_control::query::{self, LinkRef};
use torusnet_control::{dpclient, human};
use torusnet_proto::keyspace::Key;
use torusnet_proto::topology::{Coord, Dims};

#[derive(Parser)]
#[command(
    name = "torusctl",
    version,
    about = "Control and query a torusnet torus"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Where a key lives: its home, index and GetServersForKey(key, replicas), as JSON.
    Key {
        /// Torus dimensions, XxYxZ.
        #[arg(long, value_parser = parse_dims)]
        dims: Dims,
        /// How many servers to list (the first is the key's root).
        #[arg(long, default_value_t = 1)]
        replicas: usize,
        /// A failed server, x,y,z (repeatable).
        #[arg(long, value_parser = parse_coord)]
        down: Vec<Coord>,
        /// The key as 40 hex digits.
        #[arg(long, conflicts_with = "string", required_unless_present = "string")]
        hex: Option<String>,
        /// A string key: its SHA-1 is the key.
        string: Option<String>,
        /// A short summary instead of the JSON object (the key-space spec fixes JSON as
        /// this query's output, so JSON stays the default).
        #[arg(long)]
        human: bool,
    },
    /// The next-hop set from one server to another, as JSON.
    Route {
        /// Torus dimensions, XxYxZ.
        #[arg(long, value_parser = parse_dims)]
        dims: Dims,
        /// Where the route starts, x,y,z.
        #[arg(long, value_parser = parse_coord)]
        from: Coord,
        /// Where it ends, x,y,z.
        #[arg(long, value_parser = parse_coord)]
        to: Coord,
        /// A failed server, x,y,z (repeatable).
        #[arg(long, value_parser = parse_coord)]
        down: Vec<Coord>,
        /// A failed link, x,y,z:DIR (repeatable), down in both directions.
        #[arg(long = "down-link", value_parser = parse_link)]
        down_link: Vec<LinkRef>,
        /// A one-line summary instead of the JSON object (JSON stays the default, as the
        /// key-space spec fixes it).
        #[arg(long)]
        human: bool,
    },
    /// This server's control process and dataplane: coordinate, links, neighbours, view,
    /// counters (table, or --json).
    Status {
        /// The node file: finds both daemons' sockets.
        #[arg(long)]
        config: Option<PathBuf>,
        /// torusd's management socket.
        #[arg(long)]
        socket: Option<PathBuf>,
        /// The control process's status socket.
        #[arg(long)]
        control: Option<PathBuf>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Preflight of this server: kernel, privileges, bpffs, each link (up, MTU, driver XDP,
    /// zero-copy, queues, offloads), cores and IRQs, clock. Changes nothing; exit 0 unless a
    /// check fails.
    Doctor {
        /// The node file (links, MTU, cores).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// The cabling list of a torus; with --out, a node file per server too.
    Plan {
        /// Torus dimensions, XxYxZ.
        #[arg(value_parser = parse_dims)]
        dims: Dims,
        /// Host name prefix.
        #[arg(long, default_value = "torus")]
        prefix: String,
        /// Port (interface) names per direction, +x,-x,+y,-y,+z,-z.
        #[arg(long, default_value = "px,mx,py,my,pz,mz")]
        ports: String,
        /// Link MTU for the node files.
        #[arg(long, default_value_t = 9000)]
        mtu: u32,
        /// Write a node file per server into this directory.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run the control process of one server (coordinates, neighbours, link state).
    Daemon {
        /// The node file.
        #[arg(long)]
        config: PathBuf,
        /// Log filter: error, warn, info, debug, trace, or per module; default `RUST_LOG`,
        /// else info. Changeable at run time with `torusctl log`.
        #[arg(long)]
        log_level: Option<String>,
    },
    /// Show or change a running daemon's log level (torusd's with --socket, the control
    /// process's with --control).
    Log {
        /// torusd's management socket.
        #[arg(long, required_unless_present = "control")]
        socket: Option<PathBuf>,
        /// The control process's status socket.
        #[arg(long)]
        control: Option<PathBuf>,
        /// The new filter (error, warn, info, debug, trace, or per module); omitted: show it.
        level: Option<String>,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write man pages for torusctl and its commands into a directory.
    Man {
        /// Where the pages go.
        #[arg(long, default_value = ".")]
        out: PathBuf,
    },
    /// Ping-pong through torusd's built-in ping service: a summary as ping(8) prints
    /// (--json: the whole answer).
    Ping {
        /// torusd's management socket.
        #[arg(long)]
        socket: PathBuf,
        /// The server to ping, x,y,z.
        #[arg(long, value_parser = parse_coord)]
        to: Coord,
        /// Round trips.
        #[arg(long, default_value_t = 1000)]
        count: u64,
        /// Message size in bytes.
        #[arg(long, default_value_t = 64)]
        size: u64,
        /// Reliable messages instead of short ones.
        #[arg(long)]
        reliable: bool,
        /// Give up after this many milliseconds (default: 10 s plus 1 ms per round trip).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
        timeout_ms: Option<u64>,
        /// Print the whole answer as JSON (percentiles and a 200-point CDF).
        #[arg(long)]
        json: bool,
    },
    /// A checked bulk transfer through torusd's built-in bench service: a summary
    /// (--json: the whole answer).
    Bench {
        /// torusd's management socket (the sender).
        #[arg(long)]
        socket: PathBuf,
        /// The receiving server, x,y,z.
        #[arg(long, value_parser = parse_coord)]
        to: Coord,
        /// Bytes to move.
        #[arg(long, default_value_t = 1 << 30)]
        bytes: u64,
        /// Message size.
        #[arg(long, default_value_t = 65536)]
        size: u64,
        /// Fence every n-th message (0: none).
        #[arg(long, default_value_t = 0)]
        fence_every: u64,
        /// Give up after this many milliseconds (default: the time 10 MB/s would take, at
        /// least a minute).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
        timeout_ms: Option<u64>,
        /// Print the whole answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Multicast a file (or generated bytes) from this server to a group over one tree per
    /// link direction: a summary per member (--json: the whole answer).
    Multicast {
        /// torusd's management socket (the root).
        #[arg(long)]
        socket: PathBuf,
        /// A member, x,y,z (repeatable; default: every other server).
        #[arg(long, value_parser = parse_coord)]
        group: Vec<Coord>,
        /// Generated bytes instead of a file (tests, benchmarks).
        #[arg(long, conflicts_with = "file", required_unless_present = "file")]
        generate: Option<u64>,
        /// The generator's seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Bytes per chunk.
        #[arg(long, default_value_t = 262_144)]
        chunk: u64,
        /// Give up after this many milliseconds.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
        timeout_ms: Option<u64>,
        /// Print the whole answer as JSON.
        #[arg(long)]
        json: bool,
        /// The file (torusd reads it: give a path it can read).
        file: Option<PathBuf>,
    },
    /// Run the word-count aggregation job rooted at this server (Camdoop): every server
    /// counts the words of a text it generates, partial counts merge on the way up the
    /// trees (--json: the whole answer).
    Aggregate {
        /// torusd's management socket (the root).
        #[arg(long)]
        socket: PathBuf,
        /// sum, count, max or min.
        #[arg(long, default_value = "sum")]
        combiner: String,
        /// Words of text per server.
        #[arg(long, default_value_t = 100_000)]
        words: u64,
        /// Distinct words.
        #[arg(long, default_value_t = 10_000)]
        vocabulary: u64,
        /// Picks the texts.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Print the whole answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The key-value store through one server: get prints the value (exit 1 if missing),
    /// set and delete print what happened, stats and held print JSON.
    Kv {
        /// torusd's management socket.
        #[arg(long)]
        socket: PathBuf,
        #[command(subcommand)]
        op: KvOp,
    },
    /// Inject faults on one of torusd's links (tests): data frames arriving dropped (in
    /// the kernel), frames leaving sent twice or held back behind the next one. Each
    /// probability defaults to 0; all zero turns the faults off.
    Fault {
        /// torusd's management socket.
        #[arg(long)]
        socket: PathBuf,
        /// The link, +x .. -z.
        #[arg(long)]
        link: String,
        /// Drop probability.
        #[arg(long, default_value_t = 0.0)]
        drop: f64,
        /// Duplication probability.
        #[arg(long, default_value_t = 0.0)]
        duplicate: f64,
        /// Reordering probability.
        #[arg(long, default_value_t = 0.0)]
        reorder: f64,
    },
    /// Turn the congestion controller on or off in a running torusd (every connection's
    /// window starts over), or say whether it is on.
    Congestion {
        /// torusd's management socket.
        #[arg(long)]
        socket: PathBuf,
        /// on or off (absent: ask).
        #[arg(value_parser = ["on", "off"])]
        state: Option<String>,
    },
    /// Switch how this server's own reliable traffic is routed: by source routes chosen by
    /// probing (BSR) or by link-state next hops. Needs `[routing] mode` set in the node file.
    Routing {
        /// torusd's management socket.
        #[arg(long)]
        socket: PathBuf,
        /// `source` or `next-hop`.
        #[arg(long, value_parser = ["source", "next-hop"])]
        mode: String,
        /// Source-route only what these services send, comma-separated ids (default: all).
        #[arg(long, value_delimiter = ',')]
        services: Vec<u16>,
    },
}

#[derive(Subcommand)]
enum KvOp {
    /// Print a key's value.
    Get {
        /// The key.
        key: String,
        /// Print JSON (value, flags, cas).
        #[arg(long)]
        json: bool,
    },
    /// Store a value.
    Set {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// Lifetime in seconds (0: for ever).
        #[arg(long, default_value_t = 0)]
        ttl: i64,
    },
    /// Remove a key.
    Delete {
        /// The key.
        key: String,
    },
    /// The store's counters on this server (JSON).
    Stats,
    /// The keys this server holds, with versions and roles (JSON).
    Held,
    /// Drop every item on every server.
    Flush,
}

fn parse_dims(s: &str) -> Result<Dims, String> {
    s.parse().map_err(|e| format!("{e}"))
}
fn parse_coord(s: &str) -> Result<Coord, String> {
    s.parse().map_err(|e| format!("{e}"))
}
fn parse_link(s: &str) -> Result<LinkRef, String> {
    s.parse().map_err(|e| format!("{e}"))
}

fn run(cmd: Cmd) -> Result<String, String> {
    let json = match cmd {
        Cmd::Key {
            dims,
            replicas,
            down,
            hex,
            string,
            human,
        } => {
            let key = match (hex, string) {
                (Some(h), _) => Key::from_hex(&h).map_err(|e| e.to_string())?,
                (None, Some(s)) => Key::from_string(&s),
                (None, None) => return Err("give a key: --hex 40HEXDIGITS or a STRING".into()),
            };
            let a = query::key(dims, key, replicas, &down).map_err(|e| e.to_string())?;
            if human {
                let v = serde_json::to_value(&a).map_err(|e| e.to_string())?;
                return Ok(human::key(&v, replicas));
            }
            serde_json::to_string(&a)
        }
        Cmd::Route {
            dims,
            from,
            to,
            down,
            down_link,
            human,
        } => {
            let a = query::route(dims, from, to, &down, &down_link).map_err(|e| e.to_string())?;
            if human {
                let v = serde_json::to_value(&a).map_err(|e| e.to_string())?;
                return Ok(human::route(&v));
            }
            serde_json::to_string(&a)
        }
        Cmd::Status {
            config,
            socket,
            control,
            json,
        } => return status(config, socket, control, json),
        Cmd::Doctor { config, json } => {
            let node = match config {
                Some(c) => torusnet_control::doctor::Node::from_file(&c)?,
                None => torusnet_control::doctor::Node::default(),
            };
            let checks = torusnet_control::doctor::run(&node);
            let failed = checks
                .iter()
                .any(|c| c.level == torusnet_control::doctor::Level::Fail);
            let out = if json {
                serde_json::json!({"ok": !failed, "checks": checks}).to_string()
            } else {
                torusnet_control::doctor::render(&checks)
                    .trim_end()
                    .to_string()
            };
            if failed {
                return Err(format!("{out}\nDOCTOR_FAILED"));
            }
            return Ok(out);
        }
        Cmd::Plan {
            dims,
            prefix,
            ports,
            mtu,
            out,
        } => {
            let p: Vec<String> = ports.split(',').map(|s| s.trim().to_string()).collect();
            let ports: [String; 6] = p
                .try_into()
                .map_err(|_| "--ports takes six names: +x,-x,+y,-y,+z,-z".to_string())?;
            if !(576..=9000).contains(&mtu) {
                return Err(format!("--mtu {mtu} is outside 576..=9000"));
            }
            if let Some(dir) = out {
                std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                for c in dims.coords() {
                    let f = dir.join(format!("{}.toml", torusnet_control::plan::host(&prefix, c)));
                    std::fs::write(
                        &f,
                        torusnet_control::plan::node_file(dims, c, &prefix, &ports, mtu),
                    )
                    .map_err(|e| format!("{}: {e}", f.display()))?;
                }
            }
            return Ok(torusnet_control::plan::render(dims, &prefix, &ports)
                .trim_end()
                .to_string());
        }
        Cmd::Daemon { config, log_level } => {
            torusnet_ops::logging::init(log_level.as_deref())
                .map_err(|e| format!("--log-level: {e}"))?;
            let cfg = torusnet_control::daemon::DaemonConfig::load(&config)?;
            let span = tracing::info_span!("control", server = %cfg.name);
            let _entered = span.enter();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s = stop.clone();
            ctrlc::set_handler(move || s.store(true, std::sync::atomic::Ordering::Release))
                .map_err(|e| format!("cannot install the signal handler: {e}"))?;
            tracing::info!("starting");
            if let Err(e) = torusnet_control::daemon::run(cfg, stop) {
                tracing::error!("{e}");
                return Err(e);
            }
            tracing::info!("stopped");
            return Ok(String::new());
        }
        Cmd::Log {
            socket,
            control,
            level,
        } => {
            let req = match &level {
                Some(l) => serde_json::json!({"cmd": "log", "level": l}),
                None => serde_json::json!({"cmd": "log"}),
            };
            let path = socket.or(control).ok_or("give --socket or --control")?;
            let v = dpclient::request(&path, &req, Duration::from_secs(5))?;
            if let Some(e) = v["error"].as_str() {
                return Err(e.to_string());
            }
            return Ok(format!("log level: {}", v["level"].as_str().unwrap_or("?")));
        }
        Cmd::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "torusctl", &mut out);
            return String::from_utf8(out).map_err(|e| e.to_string());
        }
        Cmd::Man { out } => {
            std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
            let cmd = Cli::command();
            let mut written = Vec::new();
            let mut page = |c: &clap::Command, name: String| -> Result<(), String> {
                let mut buf = Vec::new();
                // A one-shot command: the few leaked names live until it exits anyway.
                let leaked: &'static str = name.clone().leak();
                clap_mangen::Man::new(c.clone().name(leaked))
                    .render(&mut buf)
                    .map_err(|e| e.to_string())?;
                let f = out.join(format!("{name}.1"));
                std::fs::write(&f, buf).map_err(|e| format!("{}: {e}", f.display()))?;
                written.push(f.display().to_string());
                Ok(())
            };
            page(&cmd, "torusctl".into())?;
            for sub in cmd.get_subcommands() {
                page(sub, format!("torusctl-{}", sub.get_name()))?;
            }
            return Ok(written.join("\n"));
        }
        Cmd::Ping {
            socket,
            to,
            count,
            size,
            reliable,
            timeout_ms,
            json,
        } => {
            let limit = timeout_ms.unwrap_or(10_000 + count.min(3_590_000));
            let req = serde_json::json!({"cmd": "ping", "to": to.to_string(), "count": count, "size": size, "reliable": reliable, "timeout_ms": limit});
            let v = dpclient::request(&socket, &req, Duration::from_millis(limit + 5000))?;
            return if json {
                Ok(v.to_string())
            } else {
                human::ping(&v)
            };
        }
        Cmd::Bench {
            socket,
            to,
            bytes,
            size,
            fence_every,
            timeout_ms,
            json,
        } => {
            let limit = timeout_ms.unwrap_or((bytes / 10_000).clamp(60_000, 3_600_000));
            let req = serde_json::json!({"cmd": "bench", "to": to.to_string(), "bytes": bytes, "size": size, "fence_every": fence_every, "timeout_ms": limit});
            let v = dpclient::request(&socket, &req, Duration::from_millis(limit + 5000))?;
            return if json {
                Ok(v.to_string())
            } else {
                human::bench(&v)
            };
        }
        Cmd::Multicast {
            socket,
            group,
            generate,
            seed,
            chunk,
            timeout_ms,
            json,
            file,
        } => {
            let mut req = serde_json::json!({"cmd": "multicast", "seed": seed, "chunk": chunk});
            if !group.is_empty() {
                req["group"] =
                    serde_json::json!(group.iter().map(|c| c.to_string()).collect::<Vec<_>>());
            }
            match (file, generate) {
                (Some(f), _) => {
                    let abs =
                        std::fs::canonicalize(&f).map_err(|e| format!("{}: {e}", f.display()))?;
                    req["file"] = serde_json::json!(abs);
                }
                (None, Some(n)) => req["generate"] = serde_json::json!(n),
                (None, None) => return Err("give a FILE or --generate BYTES".into()),
            }
            if let Some(t) = timeout_ms {
                req["timeout_ms"] = serde_json::json!(t);
            }
            let limit = Duration::from_millis(timeout_ms.unwrap_or(3_600_000) + 10_000);
            let v = dpclient::request(&socket, &req, limit)?;
            return if json {
                Ok(v.to_string())
            } else {
                human::multicast(&v)
            };
        }
        Cmd::Aggregate {
            socket,
            combiner,
            words,
            vocabulary,
            seed,
            json,
        } => {
            let req = serde_json::json!({"cmd": "aggregate", "combiner": combiner, "words": words, "vocabulary": vocabulary, "seed": seed});
            let v = dpclient::request(&socket, &req, Duration::from_secs(90))?;
            return if json {
                Ok(v.to_string())
            } else {
                human::aggregate(&v)
            };
        }
        Cmd::Kv { socket, op } => return kv(&socket, op),
        Cmd::Routing {
            socket,
            mode,
            services,
        } => {
            let services = (!services.is_empty()).then_some(services);
            let req = serde_json::json!({"cmd": "routing", "mode": mode, "services": services});
            return dpclient::request(&socket, &req, Duration::from_secs(10))
                .map(|v| v.to_string());
        }
        Cmd::Congestion { socket, state } => {
            let req = match state.as_deref() {
                Some(s) => serde_json::json!({"cmd": "congestion", "on": s == "on"}),
                None => serde_json::json!({"cmd": "congestion"}),
            };
            return dpclient::request(&socket, &req, Duration::from_secs(5)).map(|v| v.to_string());
        }
        Cmd::Fault {
            socket,
            link,
            drop,
            duplicate,
            reorder,
        } => {
            let req = serde_json::json!({"cmd": "fault", "link": link, "drop": drop,
                "duplicate": duplicate, "reorder": reorder});
            return dpclient::request(&socket, &req, Duration::from_secs(5)).map(|v| v.to_string());
        }
    };
    json.map_err(|e| format!("cannot encode the answer: {e}"))
}

/// One key-value operation; `Err` (exit 1) for a missing key, as scripts expect.
fn kv(socket: &std::path::Path, op: KvOp) -> Result<String, String> {
    use serde_json::json;
    let req = match &op {
        KvOp::Get { key, .. } => json!({"cmd": "kv", "op": "get", "key": key}),
        KvOp::Set { key, value, ttl } => {
            json!({"cmd": "kv", "op": "set", "key": key, "value": value, "ttl": ttl})
        }
        KvOp::Delete { key } => json!({"cmd": "kv", "op": "delete", "key": key}),
        KvOp::Stats => json!({"cmd": "kv", "op": "stats"}),
        KvOp::Held => json!({"cmd": "kv", "op": "held"}),
        KvOp::Flush => json!({"cmd": "kv", "op": "flush"}),
    };
    let v = dpclient::request(socket, &req, Duration::from_secs(15))?;
    match op {
        KvOp::Get { json: true, .. } => Ok(v.to_string()),
        KvOp::Get { key, .. } => match (v["found"].as_bool(), v["value"].as_str()) {
            (Some(true), Some(s)) => Ok(s.to_string()),
            (Some(true), None) => Ok(v["value_hex"].as_str().unwrap_or("").to_string()),
            _ => Err(format!("NOT_FOUND {key}")),
        },
        KvOp::Set { .. } => Ok(format!("STORED cas {}", v["cas"])),
        KvOp::Delete { key } => match v["deleted"].as_bool() {
            Some(true) => Ok("DELETED".into()),
            _ => Err(format!("NOT_FOUND {key}")),
        },
        KvOp::Flush => Ok("OK".into()),
        KvOp::Stats | KvOp::Held => Ok(v.to_string()),
    }
}

/// Queries whichever daemons the arguments name (both, from a node file).
fn status(
    config: Option<PathBuf>,
    socket: Option<PathBuf>,
    control: Option<PathBuf>,
    json: bool,
) -> Result<String, String> {
    let (mut socket, mut control) = (socket, control);
    if let Some(c) = config {
        let d = torusnet_control::daemon::DaemonConfig::load(&c)?;
        socket = socket.or(d.dataplane);
        control = control.or(Some(d.socket));
    }
    if socket.is_none() && control.is_none() {
        return Err("give --config NODE.toml, or --socket and/or --control".into());
    }
    let req = serde_json::json!({"cmd": "status"});
    let t = Duration::from_secs(5);
    let ctl = control.map(|c| dpclient::request(&c, &req, t));
    let dp = socket.map(|s| dpclient::request(&s, &req, t));
    if json {
        let v = serde_json::json!({
            "control": ctl.as_ref().map(|r| r.clone().unwrap_or_else(|e| serde_json::json!({"error": e}))),
            "dataplane": dp.as_ref().map(|r| r.clone().unwrap_or_else(|e| serde_json::json!({"error": e}))),
        });
        return Ok(v.to_string());
    }
    let mut out = String::new();
    match ctl {
        Some(Ok(v)) => out += &dpclient::render_control(&v),
        Some(Err(e)) => out += &format!("control process: {e}\n"),
        None => {}
    }
    match dp {
        Some(Ok(v)) if v.get("waiting").is_some() => {
            out += "dataplane: waiting for a coordinate from the control process\n"
        }
        Some(Ok(v)) => out += &dpclient::render_status(&v),
        Some(Err(e)) => out += &format!("dataplane: {e}\n"),
        None => {}
    }
    Ok(out.trim_end().to_string())
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                print!("{e}");
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                eprint!("{e}");
                return ExitCode::from(2);
            }
            // One clear line: clap's first line, without its usage block.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad arguments");
            eprintln!("torusctl: {}", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    match run(cli.cmd) {
        Ok(out) => {
            if !out.is_empty() {
                use std::io::Write;
                // A closed pipe (torusctl ... | head) is not an error worth a panic.
                let _ = writeln!(std::io::stdout(), "{out}");
            }
            ExitCode::SUCCESS
        }
        Err(msg) if msg.ends_with("DOCTOR_FAILED") => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stdout(),
                "{}",
                msg.trim_end_matches("DOCTOR_FAILED").trim_end()
            );
            ExitCode::from(1)
        }
        Err(msg) => {
            eprintln!("torusctl: {msg}");
            ExitCode::from(2)
        }
    }
}
