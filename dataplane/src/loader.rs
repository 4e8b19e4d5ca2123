//! Loads the XDP program (ebpf/torus_xdp.c) once per torusd and attaches it to every link,
//! through bpf_link, so the kernel detaches it when this process exits, is killed or
//! crashes. One instance serves every link: its maps (sockets, devices, routes, counters,
//! fault injection) are indexed by the link's direction. This module knows the maps'
//! layout; what goes into them is decided elsewhere (`xdp_transit`, the tests).

use std::error::Error as StdError;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};

use aya::maps::{Array, DevMap, HashMap, MapData, PerCpuArray, XskMap};
use aya::programs::{Xdp, XdpMode};
use aya::{Ebpf, EbpfLoader};
use torusnet_proto::routing::transit::{TransitMaps, Up};
use torusnet_proto::topology::Dir;

use crate::xdp_object::{Variant, PROGRAM};

/// Where the XDP program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    /// In the driver (native XDP).
    Native,
    /// In the kernel's generic path, for drivers without native XDP.
    Generic,
}

impl AttachMode {
    /// Lower-case name for reports.
    pub fn name(self) -> &'static str {
        match self {
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
        }
    }
}

/// Which mode to try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachPreference {
    /// Native, falling back to generic.
    Auto,
    /// Native only.
    Native,
    /// Generic only.
    Generic,
}

/// Why the program could not be loaded, attached or given its maps, in words an operator
/// can act on.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The kernel refused, with the reason translated.
    #[error("{ifname}: {what}")]
    Refused {
        /// The interface (or "XDP program" for the program as a whole).
        ifname: String,
        /// What went wrong and what to do.
        what: String,
    },
}

/// Why data frames went up to the poller instead of on, per reason (`transit::Up`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct XdpUp {
    /// Transit in XDP switched off.
    pub off: u64,
    /// For this server, or at the end of a source route.
    pub local: u64,
    /// Key-routed.
    pub key: u64,
    /// Intercepted on the path.
    pub intercept: u64,
    /// Path probes.
    pub probe: u64,
    /// No next hop in the view.
    pub no_route: u64,
    /// Every next link down, faulty or not usable from XDP.
    pub link_down: u64,
    /// Failing a check the engine makes (refused and counted there).
    pub check: u64,
    /// Headers beyond what XDP can read.
    pub headers: u64,
}

impl XdpUp {
    /// The count for reason `u`.
    pub fn get(&self, u: Up) -> u64 {
        match u {
            Up::Off => self.off,
            Up::Local => self.local,
            Up::Key => self.key,
            Up::Intercept => self.intercept,
            Up::Probe => self.probe,
            Up::NoRoute => self.no_route,
            Up::LinkDown => self.link_down,
            Up::Check => self.check,
            Up::Headers => self.headers,
        }
    }

    fn set(&mut self, u: Up, v: u64) {
        let slot = match u {
            Up::Off => &mut self.off,
            Up::Local => &mut self.local,
            Up::Key => &mut self.key,
            Up::Intercept => &mut self.intercept,
            Up::Probe => &mut self.probe,
            Up::NoRoute => &mut self.no_route,
            Up::LinkDown => &mut self.link_down,
            Up::Check => &mut self.check,
            Up::Headers => &mut self.headers,
        };
        *slot = v;
    }
}

/// The program's counters of one link, summed over CPUs (ebpf/torus_xdp.c, CNT_*).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct XdpCounters {
    /// Data frames redirected into the link's AF_XDP socket (up to the poller).
    pub redirected: u64,
    /// Frames passed to the kernel (control and foreign traffic).
    pub passed: u64,
    /// Torus frames too short for the header, dropped.
    pub malformed: u64,
    /// Data frames dropped by fault injection.
    pub fault_dropped: u64,
    /// Data frames for a queue with no socket (passed up, then dropped by the kernel).
    pub no_socket: u64,
    /// Control frames (also counted as passed).
    pub control: u64,
    /// Frames that arrived on this link and were forwarded in XDP.
    pub transit_in: u64,
    /// Their bytes.
    pub transit_in_bytes: u64,
    /// Frames forwarded in XDP that left by this link.
    pub transit_out: u64,
    /// Their bytes.
    pub transit_out_bytes: u64,
    /// Why data frames that arrived on this link went up instead.
    pub up: XdpUp,
}

/// Counter slots per link in the program (CNT_MAX).
const SLOTS: usize = 32;
/// The first slot of the reasons to go up (CNT_UP).
const UP_SLOT: usize = 10;
/// Counter row of frames from interfaces that are no link.
const NO_LINK: u32 = 6;

/// One link's row of per-CPU counters, as the program lays it out.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawCounters {
    c: [u64; SLOTS],
}
// SAFETY: plain old data, every bit pattern valid.
unsafe impl aya::Pod for RawCounters {}

/// The program's struct link.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawLink {
    local_mac: [u8; 6],
    neighbor_mac: [u8; 6],
    neighbor_known: u8,
    level: u8,
    pad: u16,
}
// SAFETY: plain old data, every bit pattern valid.
unsafe impl aya::Pod for RawLink {}

/// The program's struct transit.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawTransit {
    dims: [u16; 3],
    local: [u16; 3],
    on: u8,
    usable: u8,
    congested: u8,
    pad: u8,
}
// SAFETY: plain old data, every bit pattern valid.
unsafe impl aya::Pod for RawTransit {}

/// One interface the program is attached to.
#[derive(Debug, Clone)]
struct Attached {
    dir: Dir,
    ifname: String,
    mode: AttachMode,
}

/// The XDP program of one torusd, attached to its links.
pub struct XdpProgram {
    ebpf: Ebpf,
    variant: Variant,
    attached: Vec<Attached>,
}

impl std::fmt::Debug for XdpProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpProgram")
            .field("variant", &self.variant)
            .field("attached", &self.attached)
            .finish()
    }
}

/// The errno somewhere in an error's source chain.
fn errno_of(e: &(dyn StdError + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<io::Error>() {
            if let Some(n) = io.raw_os_error() {
                return Some(n);
            }
        }
        cur = c.source();
    }
    None
}

fn explain(ifname: &str, mtu: u32, variant: Variant, e: &(dyn StdError + 'static)) -> LoadError {
    let what = match errno_of(e) {
        Some(libc::ERANGE) => format!(
            "the kernel refuses '{}' XDP at this MTU ({mtu}): the peer MTU is too large for \
             single-buffer XDP; use the xdp.frags variant (MTU above 3000) or lower the MTU",
            variant.section()
        ),
        Some(libc::EPERM) | Some(libc::EACCES) => {
            "missing privileges to load XDP (run as root, or grant CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON)".to_string()
        }
        Some(libc::EBUSY) | Some(libc::EEXIST) => {
            "another XDP program is already attached to this interface (detach it: ip link set dev IF xdp off)".to_string()
        }
        Some(libc::ENODEV) | Some(libc::ENOENT) => "no such interface in this network namespace".to_string(),
        Some(libc::EOPNOTSUPP) => "the driver does not support XDP in this mode".to_string(),
        _ => format!("{e}"),
    };
    LoadError::Refused {
        ifname: ifname.to_string(),
        what,
    }
}

/// The last `n` lines of a log.
fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn refused(what: impl Into<String>) -> LoadError {
    LoadError::Refused {
        ifname: "XDP program".into(),
        what: what.into(),
    }
}

impl XdpProgram {
    /// Loads the variant the MTU needs, its route map sized for a torus of `servers`
    /// servers. Attached nowhere yet; transit switched off until maps are written.
    pub fn load(mtu: u32, servers: u64) -> Result<XdpProgram, LoadError> {
        let variant = Variant::for_mtu(mtu);
        let name = "XDP program";
        // One loader per process: creating one parses the kernel's BTF (~200 ms here), which
        // made every (re)start of a torusd cost that much.
        static LOADER: std::sync::OnceLock<parking_lot::Mutex<EbpfLoader<'static>>> =
            std::sync::OnceLock::new();
        let routes = u32::try_from(servers.max(1))
            .map_err(|_| refused(format!("{servers} servers: too many for the route map")))?;
        let mut ebpf = {
            let mut loader = LOADER
                .get_or_init(|| parking_lot::Mutex::new(EbpfLoader::new()))
                .lock();
            loader
                .map_max_entries("routes", routes)
                .load(variant.object())
                .map_err(|e| explain(name, mtu, variant, &e))?
        };
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| refused(format!("program {PROGRAM} missing from the object")))?
            .try_into()
            .map_err(|e| explain(name, mtu, variant, &e))?;
        prog.load().map_err(|e| match e {
            // The verifier refuses with EACCES: its log says why, not a privilege.
            aya::programs::ProgramError::LoadError { verifier_log, .. } => refused(format!(
                "the kernel's verifier refused the program: {}",
                tail(&verifier_log.to_string(), 12)
            )),
            e => explain(name, mtu, variant, &e),
        })?;
        Ok(XdpProgram {
            ebpf,
            variant,
            attached: Vec::new(),
        })
    }

    /// Attaches the program to `ifname`, the link in direction `dir`: frames arriving there
    /// are counted in its row, frames forwarded to `dir` leave by it.
    pub fn attach(
        &mut self,
        ifname: &str,
        dir: Dir,
        pref: AttachPreference,
    ) -> Result<AttachMode, LoadError> {
        let variant = self.variant;
        let ifindex = crate::netns::ifindex(ifname).map_err(|e| LoadError::Refused {
            ifname: ifname.into(),
            what: e.to_string(),
        })?;
        let d = u32::from(dir.index());
        let map_err = |what: String| LoadError::Refused {
            ifname: ifname.into(),
            what,
        };
        let mut ports: HashMap<&mut MapData, u32, u32> = self.map_mut("ports")?;
        ports
            .insert(ifindex, d, 0)
            .map_err(|e| map_err(format!("map ports: {e}")))?;
        let mut egress: DevMap<&mut MapData> = self.map_mut("egress")?;
        egress
            .set(d, ifindex, None, 0)
            .map_err(|e| map_err(format!("map egress: {e}")))?;
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| refused(format!("program {PROGRAM} missing from the object")))?
            .try_into()
            .map_err(|e| explain(ifname, 0, variant, &e))?;
        let order: &[AttachMode] = match pref {
            AttachPreference::Auto => &[AttachMode::Native, AttachMode::Generic],
            AttachPreference::Native => &[AttachMode::Native],
            AttachPreference::Generic => &[AttachMode::Generic],
        };
        let mut last = None;
        for &mode in order {
            let m = match mode {
                AttachMode::Native => XdpMode::Driver,
                AttachMode::Generic => XdpMode::Skb,
            };
            match prog.attach(ifname, m) {
                Ok(_) => {
                    self.attached.push(Attached {
                        dir,
                        ifname: ifname.to_string(),
                        mode,
                    });
                    return Ok(mode);
                }
                Err(e) => {
                    let err = explain(ifname, 0, variant, &e);
                    // Only a driver without native XDP is worth a second try.
                    let retry = matches!(errno_of(&e), Some(libc::EOPNOTSUPP) | Some(libc::EINVAL));
                    last = Some(err);
                    if !retry {
                        break;
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| map_err("no attach mode to try".into())))
    }

    /// Which variant is loaded.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// The interfaces it is attached to: each link's direction, interface and mode.
    pub fn attached(&self) -> impl Iterator<Item = (Dir, &str, AttachMode)> + '_ {
        self.attached
            .iter()
            .map(|a| (a.dir, a.ifname.as_str(), a.mode))
    }

    /// A map of the program, typed.
    fn map_mut<'a, M>(&'a mut self, name: &str) -> Result<M, LoadError>
    where
        M: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
    {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| refused(format!("map {name} missing from the object")))?;
        M::try_from(map).map_err(|e| refused(format!("map {name}: {e}")))
    }

    fn map<'a, M>(&'a self, name: &str) -> Result<M, LoadError>
    where
        M: TryFrom<&'a aya::maps::Map, Error = aya::maps::MapError>,
    {
        let map = self
            .ebpf
            .map(name)
            .ok_or_else(|| refused(format!("map {name} missing from the object")))?;
        M::try_from(map).map_err(|e| refused(format!("map {name}: {e}")))
    }

    /// Steers link `dir`'s RX queue 0 into the socket `fd`.
    pub fn register_socket(&mut self, dir: Dir, fd: RawFd) -> Result<(), LoadError> {
        let mut xsks: XskMap<&mut MapData> = self.map_mut("xsks")?;
        xsks.set(u32::from(dir.index()), fd, 0)
            .map_err(|e| refused(format!("cannot steer link {dir} to its socket: {e}")))
    }

    /// The counters of link `dir` (None: of frames from interfaces that are no link),
    /// summed over CPUs.
    pub fn counters(&self, dir: Option<Dir>) -> XdpCounters {
        let mut c = XdpCounters::default();
        let Ok(arr) = self.map::<PerCpuArray<&MapData, RawCounters>>("counters") else {
            return c;
        };
        let row = dir.map_or(NO_LINK, |d| u32::from(d.index()));
        let Ok(per_cpu) = arr.get(&row, 0) else {
            return c;
        };
        let sum = |i: usize| per_cpu.iter().map(|r| r.c[i]).sum::<u64>();
        c.redirected = sum(0);
        c.passed = sum(1);
        c.malformed = sum(2);
        c.fault_dropped = sum(3);
        c.no_socket = sum(4);
        c.control = sum(5);
        c.transit_in = sum(6);
        c.transit_in_bytes = sum(7);
        c.transit_out = sum(8);
        c.transit_out_bytes = sum(9);
        for u in Up::ALL {
            c.up.set(u, sum(UP_SLOT + u as usize));
        }
        c
    }

    /// Drops data frames arriving on link `dir` in the kernel with probability `p` (0
    /// turns it off), for tests.
    pub fn set_fault_drop(&mut self, dir: Dir, p: f64) -> Result<(), LoadError> {
        let threshold = (p.clamp(0.0, 1.0) * f64::from(u32::MAX)) as u32;
        let mut arr: Array<&mut MapData, u32> = self.map_mut("fault")?;
        arr.set(u32::from(dir.index()), threshold, 0)
            .map_err(|e| refused(format!("cannot set fault injection: {e}")))
    }

    /// Writes the transit settings and links of `maps` and the route entries of the
    /// destinations in `routes` (dense indices; all of them after a load).
    pub fn write_transit(&mut self, maps: &TransitMaps, routes: &[u32]) -> Result<(), LoadError> {
        let mut table: Array<&mut MapData, u8> = self.map_mut("routes")?;
        for &i in routes {
            let hops = maps.routes.get(i as usize).copied().unwrap_or(0);
            table
                .set(i, hops, 0)
                .map_err(|e| refused(format!("map routes, entry {i}: {e}")))?;
        }
        let mut links: Array<&mut MapData, RawLink> = self.map_mut("links")?;
        for d in Dir::ALL {
            let m = maps.macs[usize::from(d.index())];
            let raw = RawLink {
                local_mac: m.local,
                neighbor_mac: m.neighbor.unwrap_or_default(),
                neighbor_known: u8::from(m.neighbor.is_some()),
                level: maps.levels[usize::from(d.index())],
                pad: 0,
            };
            links
                .set(u32::from(d.index()), raw, 0)
                .map_err(|e| refused(format!("map links: {e}")))?;
        }
        let raw = RawTransit {
            dims: [maps.dims.x(), maps.dims.y(), maps.dims.z()],
            local: maps.local.to_array(),
            on: u8::from(maps.on),
            usable: maps.usable.bits(),
            congested: maps.congested.bits(),
            pad: 0,
        };
        let mut t: Array<&mut MapData, RawTransit> = self.map_mut("transit")?;
        t.set(0, raw, 0)
            .map_err(|e| refused(format!("map transit: {e}")))
    }

    /// Runs the program once on `frame` as if it arrived on interface `ifindex` (RX queue
    /// 0), in the kernel's test runner (BPF_PROG_TEST_RUN; nothing is sent, a redirect is
    /// only decided): the action and the frame as the program left it. For tests.
    pub fn run_once(&self, frame: &[u8], ifindex: u32) -> io::Result<(u32, Vec<u8>)> {
        let prog: &Xdp = self
            .ebpf
            .program(PROGRAM)
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| io::Error::other("program missing"))?;
        let fd = prog.fd().map_err(io::Error::other)?;
        let mut out = vec![0u8; frame.len() + 256];
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex.
        let ctx: [u32; 6] = [0, frame.len() as u32, 0, ifindex, 0, 0];
        let mut attr = TestRunAttr {
            prog_fd: fd.as_fd().as_raw_fd() as u32,
            data_size_in: frame.len() as u32,
            data_size_out: out.len() as u32,
            data_in: frame.as_ptr() as u64,
            data_out: out.as_mut_ptr() as u64,
            repeat: 1,
            ctx_size_in: std::mem::size_of_val(&ctx) as u32,
            ctx_in: ctx.as_ptr() as u64,
            ..TestRunAttr::default()
        };
        const BPF_PROG_TEST_RUN: libc::c_long = 10;
        // SAFETY: attr is a valid bpf_attr prefix for BPF_PROG_TEST_RUN of the size passed;
        // the pointers in it stay valid (frame, out, ctx) for the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_TEST_RUN,
                &mut attr as *mut TestRunAttr,
                std::mem::size_of::<TestRunAttr>() as u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        out.truncate(attr.data_size_out as usize);
        Ok((attr.retval, out))
    }
}

/// The kernel's bpf_attr for BPF_PROG_TEST_RUN.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}
