//! The AF_XDP kernel ABI (linux/if_xdp.h) and the few syscalls around it, with errors that
//! say which call failed.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Address family of XDP sockets.
pub const AF_XDP: i32 = 44;
/// Socket option level of XDP sockets.
pub const SOL_XDP: i32 = 283;

/// getsockopt: ring offsets in the mmap regions.
pub const XDP_MMAP_OFFSETS: i32 = 1;
/// setsockopt: RX ring size.
pub const XDP_RX_RING: i32 = 2;
/// setsockopt: TX ring size.
pub const XDP_TX_RING: i32 = 3;
/// setsockopt: register a UMEM.
pub const XDP_UMEM_REG: i32 = 4;
/// setsockopt: fill ring size.
pub const XDP_UMEM_FILL_RING: i32 = 5;
/// setsockopt: completion ring size.
pub const XDP_UMEM_COMPLETION_RING: i32 = 6;
/// getsockopt: drop statistics.
pub const XDP_STATISTICS: i32 = 7;
/// getsockopt: options (zero-copy or not).
pub const XDP_OPTIONS: i32 = 8;
/// setsockopt: frames the kernel sends per TX kick in copy mode (Linux 6.17+).
pub const XDP_MAX_TX_SKB_BUDGET: i32 = 9;

/// bind flag: share the UMEM of another socket.
pub const XDP_SHARED_UMEM: u16 = 1 << 0;
/// bind flag: force copy mode.
pub const XDP_COPY: u16 = 1 << 1;
/// bind flag: force zero-copy mode.
pub const XDP_ZEROCOPY: u16 = 1 << 2;
/// bind flag: the kernel may sleep; wake it when the ring flag says so.
pub const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
/// bind flag: multi-buffer frames.
pub const XDP_USE_SG: u16 = 1 << 4;
/// Ring flag: the kernel needs a wakeup.
pub const XDP_RING_NEED_WAKEUP: u32 = 1 << 0;
/// XDP_OPTIONS flag: the socket runs zero-copy.
pub const XDP_OPTIONS_ZEROCOPY: u32 = 1 << 0;
/// Descriptor option: more buffers of this frame follow.
pub const XDP_PKT_CONTD: u32 = 1 << 0;

/// mmap offset of the RX ring.
pub const XDP_PGOFF_RX_RING: i64 = 0;
/// mmap offset of the TX ring.
pub const XDP_PGOFF_TX_RING: i64 = 0x8000_0000;
/// mmap offset of the fill ring.
pub const XDP_UMEM_PGOFF_FILL_RING: i64 = 0x1_0000_0000;
/// mmap offset of the completion ring.
pub const XDP_UMEM_PGOFF_COMPLETION_RING: i64 = 0x1_8000_0000;

/// `struct sockaddr_xdp`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct SockaddrXdp {
    /// AF_XDP.
    pub family: u16,
    /// Bind flags.
    pub flags: u16,
    /// Interface index.
    pub ifindex: u32,
    /// Queue id.
    pub queue_id: u32,
    /// Socket whose UMEM to share (with XDP_SHARED_UMEM).
    pub shared_umem_fd: u32,
}

/// `struct xdp_umem_reg` (with the 6.8+ tx_metadata_len field, zero here).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UmemReg {
    /// Start of the UMEM area.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// Chunk size (a power of two, 2048 or 4096).
    pub chunk_size: u32,
    /// Headroom the kernel leaves before each frame.
    pub headroom: u32,
    /// UMEM flags.
    pub flags: u32,
    /// TX metadata length (unused).
    pub tx_metadata_len: u32,
}

/// `struct xdp_ring_offset`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RingOffset {
    /// Offset of the producer index.
    pub producer: u64,
    /// Offset of the consumer index.
    pub consumer: u64,
    /// Offset of the descriptor array.
    pub desc: u64,
    /// Offset of the flags word.
    pub flags: u64,
}

/// `struct xdp_mmap_offsets`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MmapOffsets {
    /// RX ring.
    pub rx: RingOffset,
    /// TX ring.
    pub tx: RingOffset,
    /// Fill ring.
    pub fr: RingOffset,
    /// Completion ring.
    pub cr: RingOffset,
}

/// `struct xdp_desc`: one buffer of a frame in the UMEM.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XdpDesc {
    /// Offset in the UMEM.
    pub addr: u64,
    /// Bytes.
    pub len: u32,
    /// XDP_PKT_CONTD and friends.
    pub options: u32,
}

/// `struct xdp_statistics`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XdpStatistics {
    /// Dropped for other reasons.
    pub rx_dropped: u64,
    /// Dropped: invalid descriptor.
    pub rx_invalid_descs: u64,
    /// TX descriptors refused as invalid.
    pub tx_invalid_descs: u64,
    /// Dropped: RX ring full.
    pub rx_ring_full: u64,
    /// Times the fill ring was empty.
    pub rx_fill_ring_empty_descs: u64,
    /// Times the TX ring was empty at a kick.
    pub tx_ring_empty_descs: u64,
}

fn err(call: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{call}: {e}"))
}

/// A new AF_XDP socket.
pub fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the fd is owned on success.
    let fd = unsafe { libc::socket(AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(err("socket(AF_XDP)"));
    }
    // SAFETY: fd is a fresh, valid descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// setsockopt(SOL_XDP, opt, value).
pub fn setsockopt<T>(fd: &impl AsRawFd, opt: i32, value: &T, name: &str) -> io::Result<()> {
    // SAFETY: value points to a live T of the size given.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            SOL_XDP,
            opt,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(err(name));
    }
    Ok(())
}

/// getsockopt(SOL_XDP, opt) into a T.
pub fn getsockopt<T: Default>(fd: &impl AsRawFd, opt: i32, name: &str) -> io::Result<T> {
    let mut v = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: v is a live T and len its size.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            SOL_XDP,
            opt,
            (&mut v as *mut T).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(err(name));
    }
    Ok(v)
}

/// bind() an AF_XDP socket.
pub fn bind(fd: &impl AsRawFd, addr: &SockaddrXdp) -> io::Result<()> {
    // SAFETY: addr is a valid sockaddr_xdp of the size given.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (addr as *const SockaddrXdp).cast(),
            std::mem::size_of::<SockaddrXdp>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(err("bind(AF_XDP)"));
    }
    Ok(())
}

/// Kicks the kernel to send what the TX ring holds (copy mode needs it).
pub fn kick_tx(fd: RawFd) -> io::Result<()> {
    // SAFETY: a zero-length sendto with no buffer and no address.
    let r = unsafe {
        libc::sendto(
            fd,
            std::ptr::null(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null(),
            0,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        // The kernel is busy or out of buffers: the next kick retries.
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::ENOBUFS) | Some(libc::ENETDOWN) => {
                return Ok(())
            }
            _ => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("sendto(AF_XDP kick): {e}"),
                ))
            }
        }
    }
    Ok(())
}

/// Wakes the kernel to refill RX from the fill ring (need_wakeup mode).
pub fn kick_rx(fd: RawFd) {
    // SAFETY: a zero-length, non-blocking recvfrom; the result does not matter.
    unsafe {
        libc::recvfrom(
            fd,
            std::ptr::null_mut(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
    }
}

/// A memory mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mmap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; who may touch which part is the owner's business.
unsafe impl Send for Mmap {}

impl Mmap {
    /// Anonymous memory of `len` bytes, populated now (the UMEM).
    pub fn anonymous(len: usize) -> io::Result<Mmap> {
        // SAFETY: a fresh anonymous private mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(err("mmap(UMEM)"));
        }
        Ok(Mmap { ptr: p.cast(), len })
    }

    /// A ring of socket `fd` at page offset `off`.
    pub fn ring(fd: &impl AsRawFd, len: usize, off: i64, name: &str) -> io::Result<Mmap> {
        // SAFETY: mapping a ring the kernel set up for this socket.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(err(name));
        }
        Ok(Mmap { ptr: p.cast(), len })
    }

    /// Start of the mapping.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length of the mapping.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what mmap returned.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// The index of interface `name`.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name has a NUL"))?;
    // SAFETY: c is a valid C string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface named {name:?} in this network namespace"),
        ));
    }
    Ok(i)
}
