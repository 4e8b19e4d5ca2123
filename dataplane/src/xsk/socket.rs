//! One AF_XDP socket bound to one queue of one interface, with its four rings. The first
//! socket of a server registers the UMEM; the others share it (XDP_SHARED_UMEM), each with
//! its own fill and completion rings, since they sit on other interfaces.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use super::ring::Ring;
use super::sys::{self, MmapOffsets, SockaddrXdp, UmemReg, XdpDesc, XdpStatistics};
use super::umem::{Umem, CHUNK};

/// How the socket moves frames between the NIC and the UMEM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyMode {
    /// Try zero-copy, fall back to copy when the driver cannot (veth cannot).
    Auto,
    /// Copy mode only.
    Copy,
    /// Zero-copy only (fail otherwise).
    ZeroCopy,
}

/// Settings of a socket.
#[derive(Debug, Clone, Copy)]
pub struct SocketConfig {
    /// Entries of each ring (a power of two).
    pub ring_size: u32,
    /// Copy or zero-copy.
    pub mode: CopyMode,
    /// Let the kernel sleep and be woken (need_wakeup).
    pub need_wakeup: bool,
    /// Multi-buffer frames (XDP_USE_SG), needed above one chunk.
    pub multi_buffer: bool,
    /// Frames per TX kick in copy mode (XDP_MAX_TX_SKB_BUDGET), where the kernel has it.
    pub tx_budget: Option<u32>,
}

impl Default for SocketConfig {
    fn default() -> SocketConfig {
        SocketConfig {
            ring_size: 2048,
            mode: CopyMode::Auto,
            need_wakeup: true,
            multi_buffer: false,
            tx_budget: Some(64),
        }
    }
}

/// What the kernel gave us, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketInfo {
    /// Zero-copy in use.
    pub zero_copy: bool,
    /// Multi-buffer enabled.
    pub multi_buffer: bool,
    /// Shares another socket's UMEM.
    pub shared_umem: bool,
    /// The TX budget the kernel accepted (None: not available on this kernel).
    pub tx_budget: Option<u32>,
}

/// An AF_XDP socket and its rings.
#[derive(Debug)]
pub struct XskSocket {
    fd: OwnedFd,
    /// Frames received (descriptors into the UMEM).
    pub rx: Ring<XdpDesc>,
    /// Frames to send.
    pub tx: Ring<XdpDesc>,
    /// Free chunks handed to the kernel for receiving.
    pub fill: Ring<u64>,
    /// Chunks the kernel has finished sending.
    pub comp: Ring<u64>,
    info: SocketInfo,
    /// Interface name.
    pub ifname: String,
    /// Queue id.
    pub queue: u32,
}

impl XskSocket {
    /// Creates a socket on `ifname` queue `queue`. With `share = None` it registers `umem`;
    /// otherwise it shares the UMEM already registered by `share`.
    pub fn new(
        umem: &Umem,
        share: Option<&XskSocket>,
        ifname: &str,
        queue: u32,
        cfg: &SocketConfig,
    ) -> io::Result<XskSocket> {
        let ifindex = sys::ifindex(ifname)?;
        let fd = sys::socket()?;
        if share.is_none() {
            let reg = UmemReg {
                addr: umem.addr(),
                len: umem.len() as u64,
                chunk_size: CHUNK as u32,
                headroom: 0,
                flags: 0,
                tx_metadata_len: 0,
            };
            sys::setsockopt(&fd, sys::XDP_UMEM_REG, &reg, "setsockopt(XDP_UMEM_REG)")?;
        }
        let n = cfg.ring_size;
        sys::setsockopt(
            &fd,
            sys::XDP_UMEM_FILL_RING,
            &n,
            "setsockopt(XDP_UMEM_FILL_RING)",
        )?;
        sys::setsockopt(
            &fd,
            sys::XDP_UMEM_COMPLETION_RING,
            &n,
            "setsockopt(XDP_UMEM_COMPLETION_RING)",
        )?;
        sys::setsockopt(&fd, sys::XDP_RX_RING, &n, "setsockopt(XDP_RX_RING)")?;
        sys::setsockopt(&fd, sys::XDP_TX_RING, &n, "setsockopt(XDP_TX_RING)")?;
        let off: MmapOffsets =
            sys::getsockopt(&fd, sys::XDP_MMAP_OFFSETS, "getsockopt(XDP_MMAP_OFFSETS)")?;
        let rx = Ring::map(&fd, &off.rx, n, sys::XDP_PGOFF_RX_RING, "mmap(RX ring)")?;
        let tx = Ring::map(&fd, &off.tx, n, sys::XDP_PGOFF_TX_RING, "mmap(TX ring)")?;
        let fill = Ring::map(
            &fd,
            &off.fr,
            n,
            sys::XDP_UMEM_PGOFF_FILL_RING,
            "mmap(fill ring)",
        )?;
        let comp = Ring::map(
            &fd,
            &off.cr,
            n,
            sys::XDP_UMEM_PGOFF_COMPLETION_RING,
            "mmap(completion ring)",
        )?;

        bind(&fd, ifindex, queue, share, cfg, ifname)?;
        let mut zero_copy = false;
        if let Ok(opts) = sys::getsockopt::<u32>(&fd, sys::XDP_OPTIONS, "getsockopt(XDP_OPTIONS)") {
            zero_copy = opts & sys::XDP_OPTIONS_ZEROCOPY != 0;
        }
        let tx_budget = cfg.tx_budget.and_then(|b| {
            sys::setsockopt(
                &fd,
                sys::XDP_MAX_TX_SKB_BUDGET,
                &b,
                "setsockopt(XDP_MAX_TX_SKB_BUDGET)",
            )
            .ok()
            .map(|()| b)
        });
        let multi_buffer = match share {
            Some(o) => o.info.multi_buffer,
            None => cfg.multi_buffer,
        };
        Ok(XskSocket {
            fd,
            rx,
            tx,
            fill,
            comp,
            info: SocketInfo {
                zero_copy,
                multi_buffer,
                shared_umem: share.is_some(),
                tx_budget,
            },
            ifname: ifname.to_string(),
            queue,
        })
    }

    /// The socket descriptor (for the XSKMAP and poll()).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// What the kernel granted.
    pub fn info(&self) -> SocketInfo {
        self.info
    }

    /// Kernel drop statistics of this socket.
    pub fn statistics(&self) -> io::Result<XdpStatistics> {
        sys::getsockopt(&self.fd, sys::XDP_STATISTICS, "getsockopt(XDP_STATISTICS)")
    }

    /// Asks the kernel to send what the TX ring holds.
    pub fn kick_tx(&self) -> io::Result<()> {
        sys::kick_tx(self.raw_fd())
    }

    /// Wakes the kernel's RX side if it asked for it.
    pub fn wake_rx(&self) {
        if self.fill.needs_wakeup() {
            sys::kick_rx(self.raw_fd());
        }
    }
}

impl AsRawFd for XskSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// bind(), retrying EBUSY for a while: a queue whose previous socket just closed stays busy
/// for a moment (seen here: more than 3 s once, when the previous owner was a process that
/// had just exited).
/// Binds `fd` to `queue` of `ifindex`: sharing `share`'s UMEM, or on its own in zero-copy
/// mode when the driver has it and `cfg` allows, else in copy mode.
fn bind(
    fd: &OwnedFd,
    ifindex: u32,
    queue: u32,
    share: Option<&XskSocket>,
    cfg: &SocketConfig,
    ifname: &str,
) -> io::Result<()> {
    let mut addr = SockaddrXdp {
        family: sys::AF_XDP as u16,
        flags: 0,
        ifindex,
        queue_id: queue,
        shared_umem_fd: 0,
    };
    match share {
        Some(owner) => {
            // Shared sockets inherit the owner's mode and flags; the kernel refuses any.
            addr.flags = sys::XDP_SHARED_UMEM;
            addr.shared_umem_fd = owner.fd.as_raw_fd() as u32;
            bind_retry(fd, &addr)?;
        }
        None => {
            let mut base = 0;
            if cfg.need_wakeup {
                base |= sys::XDP_USE_NEED_WAKEUP;
            }
            if cfg.multi_buffer {
                base |= sys::XDP_USE_SG;
            }
            let try_zc = matches!(cfg.mode, CopyMode::Auto | CopyMode::ZeroCopy);
            let mut bound = false;
            if try_zc {
                addr.flags = base | sys::XDP_ZEROCOPY;
                match bind_retry(fd, &addr) {
                    Ok(()) => bound = true,
                    Err(e) if cfg.mode == CopyMode::ZeroCopy => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("{ifname}: zero-copy refused by the driver ({e})"),
                        ))
                    }
                    Err(_) => {}
                }
            }
            if !bound {
                addr.flags = base | sys::XDP_COPY;
                bind_retry(fd, &addr).map_err(|e| explain_bind(ifname, queue, e))?;
            }
        }
    }
    Ok(())
}

fn bind_retry(fd: &OwnedFd, addr: &SockaddrXdp) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match sys::bind(fd, addr) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

fn explain_bind(ifname: &str, queue: u32, e: io::Error) -> io::Error {
    let why = match e.raw_os_error() {
        Some(libc::EBUSY) => "the queue is busy: another AF_XDP socket is bound to it".to_string(),
        Some(libc::EPERM) => "missing privileges (needs CAP_NET_RAW and CAP_BPF, or root)".to_string(),
        Some(libc::EINVAL) => format!(
            "the kernel refused the bind (queue {queue} may not exist, or multi-buffer is not supported here)"
        ),
        _ => e.to_string(),
    };
    io::Error::new(e.kind(), format!("{ifname} queue {queue}: {why} ({e})"))
}
