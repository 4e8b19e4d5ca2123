//! The application socket: attach, credential check, channel hand-over, and each attached
//! application's slow requests (names, acknowledgements) until its connection closes.
//!
//! Protocol: one JSON object per line. The application sends
//! `{"cmd":"attach","name":NAME,"version":1}`; torusd answers
//! `{"ok":true,"service":ID,"coord":[x,y,z],"dims":"XxYxZ"}` with three descriptors (the
//! channel's memfd, the eventfd torusd signals, the eventfd that wakes torusd), or
//! `{"error":...}` and closes. Then: `{"cmd":"resolve","name":N,"timeout_ms":T}` ->
//! `{"locations":[{"server":[x,y,z],"service":ID}...]}`, `{"cmd":"notify_acks","on":B}`,
//! `{"cmd":"weight","weight":W}` -> `{"ok":true,"weight":GRANTED,"max_weight":M}` (the
//! service's share of links, within the node file's limits: `crate::weights`),
//! `{"cmd":"add_name","name":N}` -> `{"ok":true,"service":ID}` (another name for the same
//! channel), `{"cmd":"intercept","on":B}` (its service's frames passing through shown to it
//! for a verdict), `{"cmd":"status"}`. Closing the connection detaches the application.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_client::channel::{self, Geometry, Region};
use torusnet_client::sys;
use torusnet_services::names::{is_service_name, NamesRequest, MAX_NAME, NAMES};

use crate::config::AppsConfig;
use crate::shared::{AppInfo, Command, NewApp, Shared};
use crate::weights::Weights;

/// Binds the application socket and serves it from a thread until torusd stops; the
/// thread, which removes the socket file as it ends.
pub fn start(cfg: AppsConfig, shared: Arc<Shared>) -> std::io::Result<std::thread::JoinHandle<()>> {
    if let Some(dir) = cfg.socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(&cfg.socket);
    let listener = UnixListener::bind(&cfg.socket)?;
    // Anyone may connect; the credential check refuses with a clear message instead of a
    // bare "permission denied".
    std::fs::set_permissions(&cfg.socket, std::fs::Permissions::from_mode(0o666))?;
    listener.set_nonblocking(true)?;
    let gid = cfg.group.as_deref().and_then(group_id);
    std::thread::Builder::new()
        .name("torusd-apps".into())
        .spawn(move || {
            while !shared.shutdown.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let shared = shared.clone();
                        let cfg = cfg.clone();
                        let _ = std::thread::Builder::new()
                            .name("torusd-app".into())
                            .spawn(move || serve(s, &cfg, gid, &shared));
                    }
                    // Idle: sleep until an application connects (or a quarter second).
                    Err(_) => {
                        torusnet_client::sys::wait_readable(
                            std::os::fd::AsRawFd::as_raw_fd(&listener),
                            250,
                        );
                    }
                }
            }
            let _ = std::fs::remove_file(&cfg.socket);
        })
}

/// The id of group `name`, if it exists.
fn group_id(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 16384];
    // SAFETY: getgrnam_r with our buffers; result is checked for null.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    let r = unsafe {
        libc::getgrnam_r(
            c.as_ptr(),
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut out,
        )
    };
    (r == 0 && !out.is_null()).then_some(grp.gr_gid)
}

fn say(s: &UnixStream, v: &Value) -> bool {
    let mut w = s;
    writeln!(w, "{v}").is_ok()
}

fn read_request(s: &UnixStream) -> Option<Value> {
    let (line, _) = sys::recv_line_with_fds(s, 0).ok()?;
    Some(serde_json::from_slice(&line).unwrap_or(Value::Null))
}

fn serve(s: UnixStream, cfg: &AppsConfig, gid: Option<u32>, shared: &Arc<Shared>) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
    let Some(req) = read_request(&s) else { return };
    let info = match attach(&s, &req, cfg, gid, shared) {
        Ok(info) => info,
        Err(e) => {
            say(&s, &json!({ "error": e }));
            return;
        }
    };
    // Held for the application's life: requests come rarely, or never.
    let _ = s.set_read_timeout(None);
    while let Some(req) = read_request(&s) {
        let answer = request(&req, &info, &cfg.weights, shared);
        if !say(&s, &answer) {
            break;
        }
        if info.dead.load(Ordering::Acquire) {
            break;
        }
    }
    info.dead.store(true, Ordering::Release);
    // Messages for it are refused (and reported to their senders) from now on, not handed
    // to a channel nobody reads until the poller reaps it; and the poller reaps it now.
    // Its frames pass through untouched again (were the queues full, the host would send
    // them on unchanged: no application holds them).
    if info.intercepting.load(Ordering::Acquire) {
        let _ = shared.push(Command::Intercept(info.service, false));
    }
    let mut names = vec![(info.name.clone(), info.service)];
    names.extend(info.added.lock().iter().cloned());
    for (_, id) in &names {
        shared.hosted.unhost(*id);
    }
    if let Some(first) = shared.shards.first() {
        first.wake();
    }
    // Its names leave the directory now rather than when their entries expire (which
    // they still do if this is dropped: counted).
    for (name, id) in names {
        shared.push_or_count(
            0,
            Command::Request {
                service: NAMES,
                request: Box::new(NamesRequest::Unregister { name, id }),
            },
        );
    }
}

/// The attaching peer's pid and uid, when it may attach: root, torusd's own user, or a
/// member of the `[apps] group`.
fn admit_peer(s: &UnixStream, cfg: &AppsConfig, gid: Option<u32>) -> Result<(i32, u32), String> {
    let (pid, uid, pgid, groups) =
        sys::peer_credentials(s).map_err(|e| format!("cannot read the peer's credentials: {e}"))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let member = gid.is_some_and(|g| pgid == g || groups.contains(&g));
    if uid != 0 && uid != me && !member {
        return Err(match &cfg.group {
            Some(g) => format!(
                "user {uid} may not attach to torusd: root, torusd's user and members of group {g:?} may"
            ),
            None => format!(
                "user {uid} may not attach to torusd: only root and torusd's user may (set [apps] group in its node file to let a group in)"
            ),
        });
    }
    Ok((pid, uid))
}

/// The service name an attach request asks for, once the request is checked (its command,
/// the channel layout's version, the name's form).
fn attach_name(req: &Value) -> Result<&str, String> {
    if req.get("cmd").and_then(Value::as_str) != Some("attach") {
        return Err("the first request must be {\"cmd\":\"attach\",\"name\":...}".into());
    }
    if req.get("version").and_then(Value::as_u64) != Some(u64::from(channel::VERSION)) {
        return Err(format!(
            "channel layout version mismatch: torusd speaks {}",
            channel::VERSION
        ));
    }
    let name = req
        .get("name")
        .and_then(Value::as_str)
        .ok_or("attach: missing \"name\"")?;
    if !is_service_name(name) {
        return Err(format!(
            "bad service name {name:?}: 1..={MAX_NAME} bytes, no spaces or control characters"
        ));
    }
    Ok(name)
}

/// The pool an attach request asks for (`"pool"`, bytes; the default otherwise), rounded up
/// to whole pages, within `[apps] max_pool_mib`.
fn attach_pool(req: &Value, cfg: &AppsConfig) -> Result<u64, String> {
    let Some(v) = req.get("pool") else {
        return Ok(Geometry::default().pool_size);
    };
    let asked = v.as_u64().ok_or("attach: \"pool\" is a number of bytes")?;
    if asked > cfg.max_pool {
        return Err(format!(
            "a pool of {asked} bytes is more than this torusd gives an application ({} MiB: [apps] max_pool_mib)",
            cfg.max_pool >> 20
        ));
    }
    Ok(asked.div_ceil(4096) * 4096)
}

/// Lists `info` among the attached applications, unless its service id is taken or the
/// host is full (applications that died are forgotten first).
fn enlist(shared: &Shared, cfg: &AppsConfig, info: &Arc<AppInfo>) -> Result<(), String> {
    let (name, service) = (info.name.as_str(), info.service);
    let mut apps = shared.apps.apps.lock();
    apps.retain(|a| !a.dead.load(Ordering::Acquire));
    if let Some(a) = apps.iter().find(|a| a.owns(service)) {
        return Err(if a.name == name {
            format!("service {name:?} is attached already (pid {})", a.pid)
        } else {
            format!(
                "service {name:?} would get id {service}, taken by {:?} on this server: choose another name",
                a.name
            )
        });
    }
    if apps.len() >= cfg.max_apps {
        return Err(format!(
            "{} applications are attached, the most this torusd takes",
            apps.len()
        ));
    }
    apps.push(info.clone());
    Ok(())
}

fn attach(
    s: &UnixStream,
    req: &Value,
    cfg: &AppsConfig,
    gid: Option<u32>,
    shared: &Arc<Shared>,
) -> Result<Arc<AppInfo>, String> {
    let (pid, uid) = admit_peer(s, cfg, gid)?;
    let name = attach_name(req)?;
    let pool_size = attach_pool(req, cfg)?;
    let service = channel::service_id(name);
    let info = Arc::new(AppInfo {
        name: name.to_string(),
        service,
        pid,
        uid,
        attached: Instant::now(),
        adopted: Default::default(),
        dead: Default::default(),
        closed_why: Default::default(),
        counters: Default::default(),
        added: Default::default(),
        indexed: Default::default(),
        intercepting: Default::default(),
        weight: cfg.weights.at_attach(name).into(),
    });
    enlist(shared, cfg, &info)?;
    let fail = |e: String| {
        info.dead.store(true, Ordering::Release);
        e
    };
    let geo = Geometry {
        pool_size,
        ..Geometry::default()
    };
    let len = geo.total() as usize;
    let mem = sys::memfd(&format!("torusnet-app-{name}"), len)
        .map_err(|e| fail(format!("cannot create the channel: {e}")))?;
    let map =
        sys::Mapping::map(&mem, len).map_err(|e| fail(format!("cannot map the channel: {e}")))?;
    // SAFETY: the mapping lives in NewApp with the region, for as long as the host uses it.
    let region =
        unsafe { Region::init(map.ptr(), map.len(), geo) }.map_err(|e| fail(e.to_string()))?;
    let app_efd = sys::eventfd().map_err(|e| fail(format!("eventfd: {e}")))?;
    let wake = shared.shards[0].wake.as_raw_fd();
    let new = NewApp {
        info: info.clone(),
        map,
        region,
        app_efd: app_efd
            .try_clone()
            .map_err(|e| fail(format!("eventfd: {e}")))?,
    };
    if shared.apps.pending.push(new).is_err() {
        return Err(fail(
            "torusd is busy adopting other applications: try again".into(),
        ));
    }
    shared.shards[0].wake();
    wait_adopted(&info, shared).map_err(fail)?;
    // Its name in the directory before the application hears it is attached: a name others
    // could never resolve would be a silent failure.
    let register = Command::Request {
        service: NAMES,
        request: Box::new(NamesRequest::Register {
            name: name.to_string(),
            id: service,
        }),
    };
    if shared.push_to(0, register).is_err() {
        return Err(fail(
            "torusd is busy (its first poller's command queue is full): try again".into(),
        ));
    }
    // Its weight, in every poller, before it can send: an earlier application of the same
    // name may have asked for another.
    let weight = info.weight.load(Ordering::Relaxed);
    if shared.push(Command::SetWeight(service, weight)).is_err() {
        return Err(fail(
            "torusd is busy (a poller's command queue is full): try again".into(),
        ));
    }
    let answer = json!({
        "ok": true,
        "service": service,
        "coord": shared.coord.to_array(),
        "dims": shared.dims.to_string(),
    });
    let line = format!("{answer}\n");
    sys::send_with_fds(
        s,
        line.as_bytes(),
        &[mem.as_raw_fd(), app_efd.as_raw_fd(), wake],
    )
    .map_err(|e| fail(format!("cannot pass the channel: {e}")))?;
    Ok(info)
}

/// How long the listener waits for the first poller to take a new channel. A poller turns
/// every few microseconds when busy and wakes at once when kicked; seconds mean it is stuck.
const ADOPT_DEADLINE: Duration = Duration::from_secs(5);

/// Waits until the host has taken `info`'s channel, kicking the first poller meanwhile.
fn wait_adopted(info: &AppInfo, shared: &Arc<Shared>) -> Result<(), String> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(50);
    while !info.adopted.load(Ordering::Acquire) {
        if info.dead.load(Ordering::Acquire) {
            return Err("torusd closed the channel before handing it over".into());
        }
        if start.elapsed() > ADOPT_DEADLINE {
            return Err(format!(
                "torusd's first poller did not take the channel within {ADOPT_DEADLINE:?}: try again"
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
        shared.shards[0].wake();
    }
    Ok(())
}

fn request(req: &Value, info: &AppInfo, weights: &Weights, shared: &Arc<Shared>) -> Value {
    match req.get("cmd").and_then(Value::as_str) {
        Some("resolve") => {
            let Some(name) = req.get("name").and_then(Value::as_str) else {
                return json!({"error": "resolve: missing \"name\""});
            };
            let ms = req
                .get("timeout_ms")
                .and_then(Value::as_u64)
                .unwrap_or(1000)
                .clamp(1, 60_000);
            let (tx, rx) = mpsc::channel();
            let r = NamesRequest::Lookup {
                name: name.to_string(),
                timeout: Duration::from_millis(ms),
                reply: tx,
            };
            let c = Command::Request {
                service: NAMES,
                request: Box::new(r),
            };
            if shared.push_to(0, c).is_err() {
                return json!({"error": "torusd is busy: try again"});
            }
            rx.recv_timeout(Duration::from_millis(ms) + Duration::from_secs(1))
                .unwrap_or_else(|_| json!({"error": "no answer from the name directory in time"}))
        }
        Some("notify_acks") => {
            let on = req.get("on").and_then(Value::as_bool).unwrap_or(true);
            match shared.push(Command::NotifyAcks(info.service, on)) {
                Ok(()) => json!({"ok": true}),
                Err(_) => json!({"error": "torusd is busy: try again"}),
            }
        }
        Some("weight") => {
            let Some(asked) = req.get("weight").and_then(Value::as_u64) else {
                return json!({"error": "weight: missing \"weight\" (1 or more)"});
            };
            match weights.grant(&info.name, asked) {
                Err(e) => json!({"error": e}),
                Ok(w) => {
                    // Every name of the application weighs the same: one share, however
                    // it is addressed.
                    let all = info
                        .services()
                        .into_iter()
                        .all(|id| shared.push(Command::SetWeight(id, w)).is_ok());
                    if all {
                        info.weight.store(w, Ordering::Relaxed);
                        json!({"ok": true, "weight": w, "max_weight": weights.max_app()})
                    } else {
                        json!({"error": "torusd is busy: try again"})
                    }
                }
            }
        }
        Some("intercept") => {
            let on = req.get("on").and_then(Value::as_bool).unwrap_or(true);
            match shared.push(Command::Intercept(info.service, on)) {
                Ok(()) => {
                    info.intercepting.store(on, Ordering::Release);
                    json!({"ok": true, "intercepting": on})
                }
                Err(_) => json!({"error": "torusd is busy: try again"}),
            }
        }
        Some("add_name") => match add_name(req, info, shared) {
            Ok(id) => json!({"ok": true, "service": id}),
            Err(e) => json!({ "error": e }),
        },
        Some("status") => json!({
            "name": info.name,
            "added_names": info.added.lock().iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
            "service": info.service,
            "weight": info.weight.load(Ordering::Relaxed),
            "closed": *info.closed_why.lock(),
        }),
        _ => json!({
            "error": "unknown request (resolve, notify_acks, weight, add_name, intercept, status)"
        }),
    }
}

/// Adds a name to attached application `info`: checked as an attach name is, unique on this
/// server, indexed by the host before the answer (so a message to it is delivered from the
/// moment the application hears it may be used), in the directory, weighted as the
/// application. Returns its service id.
fn add_name(req: &Value, info: &AppInfo, shared: &Arc<Shared>) -> Result<u16, String> {
    let name = req
        .get("name")
        .and_then(Value::as_str)
        .ok_or("add_name: missing \"name\"")?;
    if !is_service_name(name) {
        return Err(format!(
            "bad service name {name:?}: 1..={MAX_NAME} bytes, no spaces or control characters"
        ));
    }
    let service = channel::service_id(name);
    let count = {
        let apps = shared.apps.apps.lock();
        if let Some(a) = apps
            .iter()
            .find(|a| !a.dead.load(Ordering::Acquire) && a.owns(service))
        {
            return Err(if a.name == info.name && a.pid == info.pid {
                format!("{name:?} is one of this application's names already")
            } else {
                format!(
                    "service {name:?} would get id {service}, taken by {:?} on this server: choose another name",
                    a.name
                )
            });
        }
        let mut added = info.added.lock();
        if added.len() >= torusnet_client::MAX_NAMES {
            return Err(format!(
                "an application may add at most {} names",
                torusnet_client::MAX_NAMES
            ));
        }
        // Under the registry's lock: no other attach or added name can take the id now.
        added.push((name.to_string(), service));
        added.len()
    };
    let undo = || {
        info.added.lock().retain(|(_, id)| *id != service);
        shared.apps.renamed.store(true, Ordering::Release);
        shared.shards[0].wake();
    };
    shared.apps.renamed.store(true, Ordering::Release);
    let start = Instant::now();
    while info.indexed.load(Ordering::Acquire) < count {
        if start.elapsed() > ADOPT_DEADLINE {
            undo();
            return Err(format!(
                "torusd's first poller did not take the name within {ADOPT_DEADLINE:?}: try again"
            ));
        }
        shared.shards[0].wake();
        std::thread::sleep(Duration::from_micros(200));
    }
    let weight = info.weight.load(Ordering::Relaxed);
    let register = Command::Request {
        service: NAMES,
        request: Box::new(NamesRequest::Register {
            name: name.to_string(),
            id: service,
        }),
    };
    if shared.push(Command::SetWeight(service, weight)).is_err()
        || shared.push_to(0, register).is_err()
    {
        undo();
        return Err("torusd is busy (a poller's command queue is full): try again".into());
    }
    Ok(service)
}
