//! The TUN interface: created by torusd in its network namespace (and gone when torusd
//! exits), with the kernel's offloads on, an MTU, its addresses and up. Everything here is
//! ioctls on file descriptors; no `ip` command runs.
//!
//! With IFF_VNET_HDR and TUNSETOFFLOAD (checksum, TSO for IPv4 and IPv6, UDP segmentation
//! when the kernel has it), the kernel hands torusd whole 64 KiB TCP segments with their
//! checksums still to be finished, and takes them back the same way at the destination: one
//! read and one write per 64 KiB, not per 1500-byte packet.

use std::ffi::CString;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_TSO6: libc::c_uint = 0x04;
const TUN_F_TSO_ECN: libc::c_uint = 0x08;
const TUN_F_USO4: libc::c_uint = 0x20;
const TUN_F_USO6: libc::c_uint = 0x40;

/// An open TUN interface.
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
    /// Its name.
    pub name: String,
    /// Offloads the kernel accepted (TUN_F_* bits).
    pub offloads: u32,
}

fn last() -> io::Error {
    io::Error::last_os_error()
}

fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "interface name {name:?} must be 1..{} bytes",
                libc::IFNAMSIZ
            ),
        ));
    }
    // SAFETY: ifreq is plain data.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(r)
}

fn dgram(family: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the fd is owned on success.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(last());
    }
    // SAFETY: fresh fd, ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sockaddr4(a: Ipv4Addr) -> libc::sockaddr {
    // SAFETY: sockaddr_in is plain data, and fits in sockaddr.
    unsafe {
        let mut sin: libc::sockaddr_in = std::mem::zeroed();
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_addr.s_addr = u32::from(a).to_be();
        std::mem::transmute_copy(&sin)
    }
}

impl Tun {
    /// Creates interface `name` (IFF_TUN, no packet information, vnet headers) with the
    /// offloads the kernel has.
    pub fn create(name: &str) -> io::Result<Tun> {
        let path = CString::new("/dev/net/tun").map_err(io::Error::other)?;
        // SAFETY: a valid C string.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::new(
                last().kind(),
                format!("/dev/net/tun: {} (needs CAP_NET_ADMIN)", last()),
            ));
        }
        // SAFETY: fresh fd, ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut r = ifreq(name)?;
        r.ifr_ifru.ifru_flags = IFF_TUN | IFF_NO_PI | IFF_VNET_HDR;
        // SAFETY: TUNSETIFF reads and fills the ifreq.
        if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut r) } < 0 {
            return Err(io::Error::new(
                last().kind(),
                format!("creating {name}: {}", last()),
            ));
        }
        let base = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
        let mut offloads = 0;
        for flags in [base | TUN_F_USO4 | TUN_F_USO6, base, 0] {
            // SAFETY: TUNSETOFFLOAD takes the flags by value.
            if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETOFFLOAD, flags as libc::c_ulong) } == 0 {
                offloads = flags;
                break;
            }
        }
        Ok(Tun {
            fd,
            name: name.to_string(),
            offloads,
        })
    }

    /// Sets the MTU, the addresses (each with its prefix route) and brings it up.
    pub fn configure(
        &self,
        mtu: u32,
        v4: (Ipv4Addr, Ipv4Addr),
        v6: Option<(Ipv6Addr, u8)>,
    ) -> io::Result<()> {
        let s = dgram(libc::AF_INET)?;
        let ctx = |what: &str| {
            let e = last();
            io::Error::new(e.kind(), format!("{} {what}: {e}", self.name))
        };
        let mut r = ifreq(&self.name)?;
        r.ifr_ifru.ifru_mtu = mtu as libc::c_int;
        // SAFETY: SIOCSIFMTU reads the ifreq.
        if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSIFMTU, &r) } < 0 {
            return Err(ctx("MTU"));
        }
        let mut r = ifreq(&self.name)?;
        r.ifr_ifru.ifru_addr = sockaddr4(v4.0);
        // SAFETY: SIOCSIFADDR reads the ifreq.
        if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSIFADDR, &r) } < 0 {
            return Err(ctx("IPv4 address"));
        }
        let mut r = ifreq(&self.name)?;
        r.ifr_ifru.ifru_netmask = sockaddr4(v4.1);
        // SAFETY: SIOCSIFNETMASK reads the ifreq.
        if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSIFNETMASK, &r) } < 0 {
            return Err(ctx("netmask"));
        }
        let mut r = ifreq(&self.name)?;
        // SAFETY: SIOCGIFFLAGS fills the ifreq.
        if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut r) } < 0 {
            return Err(ctx("flags"));
        }
        // SAFETY: the union holds the flags SIOCGIFFLAGS wrote.
        unsafe {
            r.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        }
        // SAFETY: SIOCSIFFLAGS reads the ifreq.
        if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &r) } < 0 {
            return Err(ctx("up"));
        }
        if let Some((a, len)) = v6 {
            let mut r = ifreq(&self.name)?;
            // SAFETY: SIOCGIFINDEX fills the ifreq.
            if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFINDEX, &mut r) } < 0 {
                return Err(ctx("index"));
            }
            // SAFETY: the union holds the index SIOCGIFINDEX wrote.
            let index = unsafe { r.ifr_ifru.ifru_ifindex };
            let s6 = dgram(libc::AF_INET6)?;
            let req = libc::in6_ifreq {
                ifr6_addr: libc::in6_addr {
                    s6_addr: a.octets(),
                },
                ifr6_prefixlen: u32::from(len),
                ifr6_ifindex: index,
            };
            // SAFETY: SIOCSIFADDR on an AF_INET6 socket reads an in6_ifreq.
            if unsafe { libc::ioctl(s6.as_raw_fd(), libc::SIOCSIFADDR, &req) } < 0 {
                return Err(ctx("IPv6 address"));
            }
        }
        Ok(())
    }

    /// The file descriptor (non-blocking), for poll.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Reads one packet (vnet header first) into `buf`; `Ok(None)` when none waits.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: reading into our buffer.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = last();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(n as usize))
    }

    /// Hands one packet (vnet header first) to the kernel.
    pub fn write(&self, pkt: &[u8]) -> io::Result<()> {
        // SAFETY: writing from our buffer.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), pkt.as_ptr().cast(), pkt.len()) };
        if n < 0 {
            return Err(last());
        }
        Ok(())
    }
}
