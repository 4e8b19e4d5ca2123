//! Network namespaces for tests, benchmarks and the namespace torus: create one, run the
//! current thread inside it, delete it when done (also when a test fails: Drop).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::process::Command;

/// A network namespace made by `ip netns add`, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

impl Netns {
    /// Creates namespace `name` (replacing a stale one of that name left by a crash).
    pub fn new(name: &str) -> io::Result<Netns> {
        let _ = ip(&["netns", "del", name]);
        ip(&["netns", "add", name])?;
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(Netns {
            name: name.to_string(),
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n NAME ARGS...`.
    pub fn ip(&self, args: &[&str]) -> io::Result<()> {
        let mut v = vec!["-n", self.name.as_str()];
        v.extend_from_slice(args);
        ip(&v)
    }

    /// Moves the calling thread into this namespace (only this thread).
    pub fn enter(&self) -> io::Result<()> {
        enter(&self.name)
    }
}

/// Moves the calling thread into the network namespace `name`.
pub fn enter(name: &str) -> io::Result<()> {
    let f = std::fs::File::open(format!("/var/run/netns/{name}"))?;
    // SAFETY: setns on a namespace fd; affects only the calling thread's network namespace.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// A veth pair `a` (in namespace `na`) <-> `b` (in namespace `nb`), both up at `mtu`.
pub fn veth_pair(na: &Netns, a: &str, nb: &Netns, b: &str, mtu: u32) -> io::Result<()> {
    let m = mtu.to_string();
    na.ip(&[
        "link",
        "add",
        a,
        "mtu",
        &m,
        "type",
        "veth",
        "peer",
        "name",
        b,
        "netns",
        nb.name(),
        "mtu",
        &m,
    ])?;
    na.ip(&["link", "set", a, "up"])?;
    nb.ip(&["link", "set", b, "up"])?;
    Ok(())
}

/// A datagram socket and an `ifreq` naming `ifname`, for interface ioctls.
pub(crate) fn ifreq_for(ifname: &str) -> io::Result<(std::os::fd::OwnedFd, libc::ifreq)> {
    if ifname.len() >= libc::IFNAMSIZ {
        return Err(io::Error::other(format!(
            "interface name {ifname:?} is too long"
        )));
    }
    // SAFETY: a throwaway datagram socket for the ioctl.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is ours.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(ifname.bytes()) {
        *d = s as libc::c_char;
    }
    Ok((fd, req))
}

/// The MAC address of interface `ifname` in the calling thread's network namespace (by
/// ioctl, since /sys shows the namespace sysfs was mounted in, not the thread's).
pub fn mac_of(ifname: &str) -> io::Result<[u8; 6]> {
    let (fd, mut req) = ifreq_for(ifname)?;
    // SAFETY: SIOCGIFHWADDR fills req.ifr_ifru with the hardware address.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("{ifname}: cannot read its MAC address: {e}"),
        ));
    }
    // SAFETY: after SIOCGIFHWADDR the union holds a sockaddr.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut m = [0u8; 6];
    for (d, s) in m.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok(m)
}

/// The index of interface `ifname` in the calling thread's network namespace.
pub fn ifindex(ifname: &str) -> io::Result<u32> {
    let name = std::ffi::CString::new(ifname)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name holds a NUL"))?;
    // SAFETY: name is a valid NUL-terminated string for the call.
    match unsafe { libc::if_nametoindex(name.as_ptr()) } {
        0 => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{ifname}: no such interface in this network namespace"),
        )),
        i => Ok(i),
    }
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in m.iter_mut() {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(m)
}

/// Formats a MAC address as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The number of RX queues a NIC uses now (ETHTOOL_GCHANNELS: RX + combined channels), in
/// the calling thread's network namespace; `None` when the driver does not say.
pub fn rx_queues(ifname: &str) -> io::Result<Option<u32>> {
    #[repr(C)]
    #[derive(Default)]
    struct Channels {
        cmd: u32,
        max_rx: u32,
        max_tx: u32,
        max_other: u32,
        max_combined: u32,
        rx_count: u32,
        tx_count: u32,
        other_count: u32,
        combined_count: u32,
    }
    let (fd, mut req) = ifreq_for(ifname)?;
    let mut ch = Channels {
        cmd: 0x3c,
        ..Channels::default()
    };
    req.ifr_ifru.ifru_data = (&mut ch as *mut Channels).cast();
    // SAFETY: SIOCETHTOOL with ETHTOOL_GCHANNELS fills `ch`, which outlives the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => Ok(None),
            _ => Err(io::Error::new(
                e.kind(),
                format!("{ifname}: channel count: {e}"),
            )),
        };
    }
    Ok(Some((ch.rx_count + ch.combined_count).max(1)))
}
