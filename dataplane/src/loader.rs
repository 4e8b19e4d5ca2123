//! Loads the XDP program onto one link and keeps it there: one program instance per link,
//! so each link has its own socket map, counters and fault-injection setting. Attached
//! through bpf_link, so the kernel detaches it when this process exits, is killed or crashes.

use std::error::Error as StdError;
use std::io;
use std::os::fd::RawFd;

use aya::maps::{Array, MapData, PerCpuArray, XskMap};
use aya::programs::{Xdp, XdpMode};
use aya::{Ebpf, EbpfLoader};

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

/// Why the program could not be loaded or attached, in words an operator can act on.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The kernel refused, with the reason translated.
    #[error("{ifname}: {what}")]
    Refused {
        /// The interface.
        ifname: String,
        /// What went wrong and what to do.
        what: String,
    },
}

/// Slots of the program's per-CPU counters (ebpf/torus_xdp.c, CNT_*).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct XdpCounters {
    /// Data frames redirected into an AF_XDP socket.
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
}

/// The XDP program attached to one link.
pub struct XdpAttachment {
    ebpf: Ebpf,
    ifname: String,
    mode: AttachMode,
    variant: Variant,
}

impl std::fmt::Debug for XdpAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpAttachment")
            .field("ifname", &self.ifname)
            .field("mode", &self.mode)
            .field("variant", &self.variant)
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

impl XdpAttachment {
    /// Loads the variant the MTU needs and attaches it to `ifname`.
    pub fn attach(
        ifname: &str,
        mtu: u32,
        pref: AttachPreference,
    ) -> Result<XdpAttachment, LoadError> {
        let variant = Variant::for_mtu(mtu);
        let refuse = |what: String| LoadError::Refused {
            ifname: ifname.to_string(),
            what,
        };
        // One loader per process: creating one parses the kernel's BTF (~200 ms here), which
        // made every link of a (re)starting torusd cost that much.
        static LOADER: std::sync::OnceLock<parking_lot::Mutex<EbpfLoader<'static>>> =
            std::sync::OnceLock::new();
        let mut ebpf = LOADER
            .get_or_init(|| parking_lot::Mutex::new(EbpfLoader::new()))
            .lock()
            .load(variant.object())
            .map_err(|e| explain(ifname, mtu, variant, &e))?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| refuse(format!("program {PROGRAM} missing from the object")))?
            .try_into()
            .map_err(|e| explain(ifname, mtu, variant, &e))?;
        prog.load().map_err(|e| explain(ifname, mtu, variant, &e))?;
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
                    return Ok(XdpAttachment {
                        ebpf,
                        ifname: ifname.to_string(),
                        mode,
                        variant,
                    })
                }
                Err(e) => {
                    let err = explain(ifname, mtu, variant, &e);
                    // Only a driver without native XDP is worth a second try.
                    let retry = matches!(errno_of(&e), Some(libc::EOPNOTSUPP) | Some(libc::EINVAL));
                    last = Some(err);
                    if !retry {
                        break;
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| refuse("no attach mode to try".into())))
    }

    /// Where the program runs.
    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// Which variant is attached.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Steers the link's RX queue `queue` into the socket `fd`.
    pub fn register_socket(&mut self, queue: u32, fd: RawFd) -> Result<(), LoadError> {
        let ifname = self.ifname.clone();
        let map = self
            .ebpf
            .map_mut("xsks")
            .ok_or_else(|| LoadError::Refused {
                ifname: ifname.clone(),
                what: "map xsks missing from the object".into(),
            })?;
        let mut xsks: XskMap<&mut MapData> =
            XskMap::try_from(map).map_err(|e| LoadError::Refused {
                ifname: ifname.clone(),
                what: format!("map xsks: {e}"),
            })?;
        xsks.set(queue, fd, 0).map_err(|e| LoadError::Refused {
            ifname,
            what: format!("cannot steer queue {queue} to its socket: {e}"),
        })
    }

    /// The program's counters, summed over CPUs.
    pub fn counters(&self) -> XdpCounters {
        let mut c = XdpCounters::default();
        let Some(map) = self.ebpf.map("counters") else {
            return c;
        };
        let Ok(arr) = PerCpuArray::<&MapData, u64>::try_from(map) else {
            return c;
        };
        let sum = |i: u32| arr.get(&i, 0).map(|v| v.iter().sum::<u64>()).unwrap_or(0);
        c.redirected = sum(0);
        c.passed = sum(1);
        c.malformed = sum(2);
        c.fault_dropped = sum(3);
        c.no_socket = sum(4);
        c.control = sum(5);
        c
    }

    /// Drops data frames in the kernel with probability `p` (0 turns it off), for tests.
    pub fn set_fault_drop(&mut self, p: f64) -> Result<(), LoadError> {
        let ifname = self.ifname.clone();
        let threshold = (p.clamp(0.0, 1.0) * f64::from(u32::MAX)) as u32;
        let map = self
            .ebpf
            .map_mut("fault")
            .ok_or_else(|| LoadError::Refused {
                ifname: ifname.clone(),
                what: "map fault missing from the object".into(),
            })?;
        let mut arr: Array<&mut MapData, u32> =
            Array::try_from(map).map_err(|e| LoadError::Refused {
                ifname: ifname.clone(),
                what: format!("map fault: {e}"),
            })?;
        arr.set(0, threshold, 0).map_err(|e| LoadError::Refused {
            ifname,
            what: format!("cannot set fault injection: {e}"),
        })
    }
}
