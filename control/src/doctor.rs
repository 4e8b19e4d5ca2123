//! `torusctl doctor`: a preflight for a server about to run torusnet. One line per check,
//! ok / warn / fail, each with the fix; exit status 0 when nothing fails. It changes nothing
//! on the machine (the zero-copy probe binds a socket to a queue nobody uses and closes it).

use std::path::Path;
use std::process::Command;

use serde::Serialize;
use serde_json::Value;

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Fine.
    Ok,
    /// Works, but not as well as it could, or needs attention.
    Warn,
    /// torusnet will not work (well) until fixed.
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Outcome.
    pub level: Level,
    /// What was found.
    pub detail: String,
    /// How to fix it (empty when ok).
    pub fix: String,
}

fn check(name: &str, level: Level, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        name: name.to_string(),
        level,
        detail: detail.into(),
        fix: fix.into(),
    }
}

/// A link to check: interface and the MTU the node file gives it.
#[derive(Debug, Clone)]
pub struct LinkToCheck {
    /// Interface.
    pub ifname: String,
    /// Its direction, for messages.
    pub dir: String,
}

/// What the doctor is told about the node (from its node file, if any).
#[derive(Debug, Clone, Default)]
pub struct Node {
    /// Links.
    pub links: Vec<LinkToCheck>,
    /// Configured MTU.
    pub mtu: Option<u32>,
    /// Configured cores.
    pub cores: Vec<usize>,
    /// The control process's status socket (for the neighbours' view of each link).
    pub control_socket: Option<std::path::PathBuf>,
    /// The node file declares that the torus EtherType is steered to queue 0.
    pub steered: bool,
}

impl Node {
    /// Reads the parts of a node file the doctor needs.
    pub fn from_file(path: &Path) -> Result<Node, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let v: toml::Value = toml::from_str(&text)
            .map_err(|e| format!("{}: {}", path.display(), e.to_string().replace('\n', " ")))?;
        let links = v
            .get("link")
            .and_then(|x| x.as_array())
            .into_iter()
            .flatten()
            .filter_map(|l| {
                Some(LinkToCheck {
                    ifname: l.get("ifname")?.as_str()?.to_string(),
                    dir: l
                        .get("dir")
                        .and_then(|d| d.as_str())
                        .unwrap_or("?")
                        .to_string(),
                })
            })
            .collect();
        let name = v.get("name").and_then(|x| x.as_str()).unwrap_or("");
        let control_socket = v
            .get("control")
            .and_then(|c| c.get("socket"))
            .and_then(|s| s.as_str())
            .map(std::path::PathBuf::from)
            .or_else(|| {
                (!name.is_empty())
                    .then(|| std::path::PathBuf::from(format!("/run/torusnet/{name}-control.sock")))
            });
        Ok(Node {
            links,
            mtu: v
                .get("mtu")
                .and_then(|x| x.as_integer())
                .map(|m| m as u32)
                .or(Some(1500)),
            cores: v
                .get("cores")
                .and_then(|x| x.as_array())
                .into_iter()
                .flatten()
                .filter_map(|c| c.as_integer().map(|c| c as usize))
                .collect(),
            control_socket,
            steered: v
                .get("rx_queue_steering")
                .and_then(|x| x.as_bool())
                .unwrap_or(false),
        })
    }
}

fn kernel_version() -> Option<(u32, u32)> {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let mut it = r.trim().split(['.', '-']);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn cap_eff() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("CapEff:"))
                .and_then(|l| u64::from_str_radix(l[7..].trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// `ip -d -j link show dev IF` as JSON (in the caller's network namespace).
fn link_json(ifname: &str) -> Option<Value> {
    let out = Command::new("ip")
        .args(["-d", "-j", "link", "show", "dev", ifname])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v.get(0).cloned()
}

fn ethtool(args: &[&str]) -> Option<String> {
    let out = Command::new("ethtool").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Drivers with native XDP (and, for some, AF_XDP zero-copy) in mainline Linux.
const NATIVE_XDP: &[&str] = &[
    "veth",
    "virtio_net",
    "ixgbe",
    "ixgbevf",
    "i40e",
    "ice",
    "igb",
    "igc",
    "mlx4_en",
    "mlx5_core",
    "bnxt_en",
    "ena",
    "nfp",
    "qede",
    "thunder",
    "tun",
    "stmmac",
    "sfc",
    "enetc",
    "fec",
    "mvneta",
    "mvpp2",
    "hv_netvsc",
    "gve",
    "idpf",
];

/// The control process's view of the links (for neighbour checks), if it runs.
fn control_status(path: &Path) -> Option<Value> {
    let req = serde_json::json!({"cmd": "status"});
    crate::dpclient::request(path, &req, std::time::Duration::from_secs(2)).ok()
}

/// Runs every check for `node`.
pub fn run(node: &Node) -> Vec<Check> {
    let mut out = Vec::new();
    kernel_check(&mut out);
    af_xdp_check(&mut out);
    if Path::new("/sys/kernel/btf/vmlinux").exists() {
        out.push(check("btf", Level::Ok, "kernel BTF present", ""));
    } else {
        out.push(check("btf", Level::Warn, "no /sys/kernel/btf/vmlinux", "torusnet's XDP program needs no CO-RE; BTF helps bpftool show its maps (CONFIG_DEBUG_INFO_BTF=y)"));
    }
    privileges_check(&mut out);
    memlock_check(&mut out);
    bpffs_check(&mut out);
    let ctl = node.control_socket.as_deref().and_then(control_status);
    for l in &node.links {
        link_checks(node, l, ctl.as_ref(), &mut out);
    }
    core_checks(node, &mut out);
    clocksource_check(&mut out);
    out
}

/// The checks of one link: state and MTU, its neighbour, driver, zero-copy, queues, offloads.
fn link_checks(node: &Node, l: &LinkToCheck, ctl: Option<&Value>, out: &mut Vec<Check>) {
    let name = format!("link {} ({})", l.ifname, l.dir);
    let Some(j) = link_json(&l.ifname) else {
        out.push(check(
            &name,
            Level::Fail,
            "no such interface in this network namespace",
            "check the [[link]] ifname, or run the doctor in the server's namespace",
        ));
        return;
    };
    let flags: Vec<&str> = j["flags"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let up = flags.contains(&"UP");
    let carrier = j["operstate"].as_str() == Some("UP") || flags.contains(&"LOWER_UP");
    if !up {
        out.push(check(
            &name,
            Level::Fail,
            "interface is down",
            format!("ip link set {} up", l.ifname),
        ));
    } else if !carrier {
        out.push(check(
            &name,
            Level::Fail,
            "interface is up but has no carrier (cable, or the neighbour's port is down)",
            "check the cable and the neighbour's port",
        ));
    } else {
        out.push(check(&name, Level::Ok, "up, carrier", ""));
    }
    let mtu = j["mtu"].as_u64().unwrap_or(0) as u32;
    match node.mtu {
        Some(m) if m != mtu => out.push(check(
            &format!("{name} mtu"),
            Level::Fail,
            format!("MTU {mtu}, the node file says {m}"),
            format!("ip link set {} mtu {m}", l.ifname),
        )),
        _ => out.push(check(
            &format!("{name} mtu"),
            Level::Ok,
            format!("MTU {mtu}"),
            "",
        )),
    }
    if let Some(c) = ctl {
        neighbour_check(c, l, &name, out);
    }
    let driver = xdp_check(l, &name, out);
    zero_copy_check(l, &name, &driver, out);
    queues_check(node, l, &name, out);
    offloads_check(l, &name, out);
}

/// The kernel's version: AF_XDP, and multi-buffer for jumbo frames.
fn kernel_check(out: &mut Vec<Check>) {
    match kernel_version() {
        Some((a, b)) if (a, b) >= (6, 6) => out.push(check(
            "kernel",
            Level::Ok,
            format!("Linux {a}.{b}: AF_XDP with multi-buffer"),
            "",
        )),
        Some((a, b)) if (a, b) >= (5, 11) => out.push(check(
            "kernel",
            Level::Warn,
            format!("Linux {a}.{b}: AF_XDP without multi-buffer (no jumbo frames above 4 KiB)"),
            "use Linux 6.6 or later for MTU 9000",
        )),
        Some((a, b)) => out.push(check(
            "kernel",
            Level::Fail,
            format!("Linux {a}.{b} is too old"),
            "use Linux 6.6 or later",
        )),
        None => out.push(check(
            "kernel",
            Level::Warn,
            "cannot read the kernel version",
            "",
        )),
    }
}

/// Whether this kernel creates AF_XDP sockets for us.
fn af_xdp_check(out: &mut Vec<Check>) {
    // SAFETY: creating and closing a socket changes nothing.
    let fd = unsafe { libc::socket(44, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd >= 0 {
        // SAFETY: closing what we opened.
        unsafe { libc::close(fd) };
        out.push(check("af_xdp", Level::Ok, "AF_XDP sockets available", ""));
    } else {
        let e = std::io::Error::last_os_error();
        let (lvl, fix) = match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => {
                (Level::Fail, "run as root or grant CAP_NET_RAW")
            }
            _ => (Level::Fail, "build the kernel with CONFIG_XDP_SOCKETS=y"),
        };
        out.push(check(
            "af_xdp",
            lvl,
            format!("cannot create an AF_XDP socket: {e}"),
            fix,
        ));
    }
}

/// The capabilities torusd needs (or root).
fn privileges_check(out: &mut Vec<Check>) {
    let caps = cap_eff();
    let has = |bit: u32| caps & (1u64 << bit) != 0;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let needed = [
        (12, "CAP_NET_ADMIN"),
        (13, "CAP_NET_RAW"),
        (39, "CAP_BPF"),
        (38, "CAP_PERFMON"),
    ];
    let missing: Vec<&str> = needed
        .iter()
        .filter(|(b, _)| !has(*b) && !has(21))
        .map(|(_, n)| *n)
        .collect();
    if missing.is_empty() {
        out.push(check(
            "privileges",
            Level::Ok,
            if root {
                "running as root"
            } else {
                "capabilities present"
            },
            "",
        ));
    } else {
        out.push(check(
            "privileges",
            Level::Fail,
            format!("missing {}", missing.join(", ")),
            "run as root, or use the systemd units in deploy/systemd (AmbientCapabilities)",
        ));
    }
}

/// Whether the UMEM can be locked in memory.
fn memlock_check(out: &mut Vec<Check>) {
    // SAFETY: getrlimit fills the struct we pass.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) };
    let memcg = kernel_version().is_some_and(|v| v >= (5, 11));
    if rl.rlim_cur == libc::RLIM_INFINITY || memcg || rl.rlim_cur >= 64 << 20 {
        out.push(check(
            "memlock",
            Level::Ok,
            if memcg {
                "BPF memory is charged to the cgroup (Linux 5.11+)".into()
            } else {
                format!("memlock limit {} bytes", rl.rlim_cur)
            },
            "",
        ));
    } else {
        out.push(check(
            "memlock",
            Level::Fail,
            format!(
                "memlock limit {} bytes is too low for the UMEM",
                rl.rlim_cur
            ),
            "ulimit -l unlimited (LimitMEMLOCK=infinity in the unit)",
        ));
    }
}

/// Whether bpffs is mounted where tools look for it.
fn bpffs_check(out: &mut Vec<Check>) {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf") && l.contains(" bpf "))
    {
        out.push(check(
            "bpffs",
            Level::Ok,
            "bpffs mounted at /sys/fs/bpf",
            "",
        ));
    } else {
        out.push(check("bpffs", Level::Warn, "bpffs is not mounted at /sys/fs/bpf (torusd pins nothing, but bpftool and other tools want it)", "mount -t bpf bpf /sys/fs/bpf"));
    }
}

/// The poller cores: they exist, and no link's IRQ runs on them.
fn core_checks(node: &Node, out: &mut Vec<Check>) {
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    for c in &node.cores {
        if *c >= ncpu {
            out.push(check(
                "cores",
                Level::Fail,
                format!("core {c} does not exist ({ncpu} cores)"),
                "fix cores = [...] in the node file",
            ));
        }
    }
    if !node.cores.is_empty() && node.cores.iter().all(|c| *c < ncpu) {
        let irqs = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
        let mut shared = Vec::new();
        for line in irqs.lines() {
            if node.links.iter().any(|l| line.contains(&l.ifname)) {
                if let Some(irq) = line.split(':').next().map(str::trim) {
                    let aff = std::fs::read_to_string(format!("/proc/irq/{irq}/smp_affinity_list"))
                        .unwrap_or_default();
                    if node
                        .cores
                        .iter()
                        .any(|c| aff.trim().split(',').any(|p| p.trim() == c.to_string()))
                    {
                        shared.push(irq.to_string());
                    }
                }
            }
        }
        if shared.is_empty() {
            out.push(check(
                "cores",
                Level::Ok,
                format!(
                    "pollers on cores {:?}, no link IRQ pinned there",
                    node.cores
                ),
                "",
            ));
        } else {
            out.push(check("cores", Level::Warn, format!("IRQs {} of the link NICs may run on the poller cores", shared.join(" ")), "pin them elsewhere: echo N > /proc/irq/IRQ/smp_affinity_list (and stop irqbalance)"));
        }
    }
}

/// The clock source (reading the clock is on every poller's turn).
fn clocksource_check(out: &mut Vec<Check>) {
    let cs =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .unwrap_or_default();
    let cs = cs.trim();
    if cs == "tsc" || cs.is_empty() {
        out.push(check(
            "clocksource",
            Level::Ok,
            if cs.is_empty() {
                "unknown (sysfs not readable)".into()
            } else {
                cs.to_string()
            },
            "",
        ));
    } else {
        out.push(check(
            "clocksource",
            Level::Warn,
            format!("{cs}: reading the clock costs more than with tsc"),
            "use tsc if the CPU has a stable one (clocksource=tsc)",
        ));
    }
}

/// What the control process heard from the link's neighbour (miswired, up, silent).
fn neighbour_check(c: &Value, l: &LinkToCheck, name: &str, out: &mut Vec<Check>) {
    let cl = c["links"].as_array().and_then(|a| {
        a.iter()
            .find(|x| x["ifname"].as_str() == Some(l.ifname.as_str()))
    });
    if let Some(cl) = cl {
        if let Some(m) = cl["miswired"].as_str() {
            out.push(check(
                &format!("{name} neighbour"),
                Level::Fail,
                format!("miswired: {m}"),
                "fix the cabling (torusctl plan prints the intended one)",
            ));
        } else if cl["state"] == "up" {
            let n = &cl["neighbor"];
            out.push(check(
                &format!("{name} neighbour"),
                Level::Ok,
                format!(
                    "node {} at {}",
                    n["node_id"],
                    n["coord"].as_str().unwrap_or("?")
                ),
                "",
            ));
        } else {
            out.push(check(
                &format!("{name} neighbour"),
                Level::Warn,
                "no hellos from the neighbour (its control process may not run)",
                "start torusctl daemon on the neighbour",
            ));
        }
    }
}

/// The link's driver and whether it has native XDP; returns the driver's name.
fn xdp_check(l: &LinkToCheck, name: &str, out: &mut Vec<Check>) -> String {
    let driver = ethtool(&["-i", &l.ifname])
        .and_then(|s| {
            s.lines()
                .find(|x| x.starts_with("driver:"))
                .map(|x| x[7..].trim().to_string())
        })
        .unwrap_or_default();
    if NATIVE_XDP.contains(&driver.as_str()) {
        out.push(check(
            &format!("{name} xdp"),
            Level::Ok,
            format!("driver {driver}: native XDP"),
            "",
        ));
    } else {
        out.push(check(
            &format!("{name} xdp"),
            Level::Warn,
            format!(
                "driver {}: no native XDP known; torusd falls back to generic mode (slower)",
                if driver.is_empty() { "?" } else { &driver }
            ),
            "use a NIC whose driver has native XDP",
        ));
    }
    driver
}

/// Whether the link's driver takes AF_XDP zero-copy.
fn zero_copy_check(l: &LinkToCheck, name: &str, driver: &str, out: &mut Vec<Check>) {
    match zero_copy_probe(&l.ifname) {
        Ok(true) => out.push(check(
            &format!("{name} zero-copy"),
            Level::Ok,
            "AF_XDP zero-copy possible",
            "",
        )),
        Ok(false) => out.push(check(
            &format!("{name} zero-copy"),
            Level::Warn,
            format!("driver {driver} refuses AF_XDP zero-copy: copy mode will be used"),
            "a NIC with zero-copy AF_XDP (ice, i40e, mlx5, ...) saves a copy per frame",
        )),
        Err(e) => out.push(check(
            &format!("{name} zero-copy"),
            Level::Ok,
            format!("not probed: {e}"),
            "",
        )),
    }
}

/// Whether every torus frame reaches the queue a socket reads.
fn queues_check(node: &Node, l: &LinkToCheck, name: &str, out: &mut Vec<Check>) {
    // The queues in use now (ethtool -l "Current": RX + combined), not those allocated.
    let rxq = ethtool(&["-l", &l.ifname])
        .and_then(|t| {
            let cur = t.split("Current hardware settings:").nth(1)?;
            let num = |k: &str| {
                cur.lines()
                    .find(|x| x.trim_start().starts_with(k))
                    .and_then(|x| x.split(':').nth(1))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            };
            Some((num("RX:") + num("Combined:")).max(1))
        })
        .unwrap_or(1);
    if rxq <= 1 || node.steered {
        out.push(check(
            &format!("{name} queues"),
            Level::Ok,
            if rxq <= 1 {
                "one RX queue in use".to_string()
            } else {
                format!("{rxq} RX queues, torus EtherType steered to queue 0")
            },
            "",
        ));
    } else {
        out.push(check(&format!("{name} queues"), Level::Fail, format!("{rxq} RX queues: torus frames could land on queues no socket reads"), format!("ethtool -L {} combined 1; or steer: ethtool -N {} flow-type ether proto 0x88b5 action 0 and set rx_queue_steering = true", l.ifname, l.ifname)));
    }
}

/// Receive offloads that merge frames (XDP and the protocol refuse them).
fn offloads_check(l: &LinkToCheck, name: &str, out: &mut Vec<Check>) {
    if let Some(k) = ethtool(&["-k", &l.ifname]) {
        let on = |feat: &str| {
            k.lines()
                .any(|x| x.trim_start().starts_with(feat) && x.contains(": on"))
        };
        if on("large-receive-offload:") {
            out.push(check(
                &format!("{name} offloads"),
                Level::Fail,
                "LRO is on: XDP refuses it and merged frames break the protocol",
                format!("ethtool -K {} lro off", l.ifname),
            ));
        } else if on("rx-gro-hw:") {
            out.push(check(
                &format!("{name} offloads"),
                Level::Warn,
                "hardware GRO is on",
                format!("ethtool -K {} rx-gro-hw off", l.ifname),
            ));
        } else {
            out.push(check(
                &format!("{name} offloads"),
                Level::Ok,
                "no LRO / hardware GRO",
                "",
            ));
        }
    }
}

/// Tries a zero-copy bind on queue 0 with a throwaway UMEM: Ok(true) if the driver allows
/// it, Ok(false) if it refuses zero-copy, Err when the probe could not run (queue busy...).
fn zero_copy_probe(ifname: &str) -> Result<bool, String> {
    let c = std::ffi::CString::new(ifname).map_err(|_| "bad name".to_string())?;
    // SAFETY: plain syscalls on descriptors and memory we own, all released below.
    unsafe {
        let idx = libc::if_nametoindex(c.as_ptr());
        if idx == 0 {
            return Err("no such interface".into());
        }
        let fd = libc::socket(44, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err("no AF_XDP socket".into());
        }
        let len = 64 * 4096usize;
        let mem = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        let result = (|| {
            if mem == libc::MAP_FAILED {
                return Err("no memory".to_string());
            }
            #[repr(C)]
            struct Reg {
                addr: u64,
                len: u64,
                chunk: u32,
                headroom: u32,
                flags: u32,
                tx_meta: u32,
            }
            let reg = Reg {
                addr: mem as u64,
                len: len as u64,
                chunk: 4096,
                headroom: 0,
                flags: 0,
                tx_meta: 0,
            };
            let so = |opt: i32, v: *const libc::c_void, l: usize| {
                libc::setsockopt(fd, 283, opt, v, l as u32)
            };
            if so(4, (&reg as *const Reg).cast(), std::mem::size_of::<Reg>()) < 0 {
                return Err("UMEM registration refused".into());
            }
            let n: u32 = 64;
            for opt in [5, 6, 2] {
                if so(opt, (&n as *const u32).cast(), 4) < 0 {
                    return Err("ring setup refused".into());
                }
            }
            #[repr(C)]
            struct Sxdp {
                family: u16,
                flags: u16,
                ifindex: u32,
                queue: u32,
                shared: u32,
            }
            let sa = Sxdp {
                family: 44,
                flags: 1 << 2,
                ifindex: idx,
                queue: 0,
                shared: 0,
            };
            if libc::bind(
                fd,
                (&sa as *const Sxdp).cast(),
                std::mem::size_of::<Sxdp>() as u32,
            ) == 0
            {
                return Ok(true);
            }
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => Ok(false),
                Some(libc::EBUSY) => Err("queue 0 is in use (torusd running?)".into()),
                _ => Err(std::io::Error::last_os_error().to_string()),
            }
        })();
        libc::close(fd);
        if mem != libc::MAP_FAILED {
            libc::munmap(mem, len);
        }
        result
    }
}

/// The report as lines for people.
pub fn render(checks: &[Check]) -> String {
    let mut s = String::new();
    for c in checks {
        let tag = match c.level {
            Level::Ok => "ok  ",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        s += &format!("{tag} {:<24} {}", c.name, c.detail);
        if !c.fix.is_empty() && c.level != Level::Ok {
            s += &format!("\n     {:<24} fix: {}", "", c.fix);
        }
        s += "\n";
    }
    let fails = checks.iter().filter(|c| c.level == Level::Fail).count();
    let warns = checks.iter().filter(|c| c.level == Level::Warn).count();
    s += &format!(
        "{fails} failed, {warns} warnings, {} ok\n",
        checks.len() - fails - warns
    );
    s
}
