//! Notices a link losing or regaining its carrier as soon as the kernel does, through a
//! netlink subscription to link changes (RTMGRP_LINK), so that source-routed frames stop
//! taking a dead link, and their sources hear of it, at once: the control plane learns of
//! the same failure only after its hellos go missing.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use torusnet_proto::topology::Dir;

/// `IFF_LOWER_UP`: the driver signals carrier (not in the libc crate for every target).
const IFF_LOWER_UP: u32 = 0x1_0000;
/// How long a read waits before looking at the shutdown flag.
const READ_TIMEOUT: Duration = Duration::from_millis(200);

/// Opens the netlink socket, subscribed to link changes.
fn subscribe() -> std::io::Result<OwnedFd> {
    // SAFETY: socket() with constant arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a zeroed sockaddr_nl is valid; we fill family and groups.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    sa.nl_groups = libc::RTMGRP_LINK as u32;
    // SAFETY: sa is a valid sockaddr_nl of the size given.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: READ_TIMEOUT.as_micros() as libc::suseconds_t,
    };
    // SAFETY: tv is a valid timeval of the size given.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// The link changes in one netlink datagram: (interface index, carrier up). Malformed
/// messages end the walk; what came before them counts.
pub fn parse(buf: &[u8]) -> Vec<(i32, bool)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 16 <= buf.len() {
        let len = u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
        let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
        if len < 16 || at + len > buf.len() {
            break;
        }
        if (kind == libc::RTM_NEWLINK || kind == libc::RTM_DELLINK) && len >= 32 {
            let m = &buf[at + 16..at + 32];
            let index = i32::from_ne_bytes([m[4], m[5], m[6], m[7]]);
            let flags = u32::from_ne_bytes([m[8], m[9], m[10], m[11]]);
            let up = kind == libc::RTM_NEWLINK
                && flags & libc::IFF_UP as u32 != 0
                && flags & IFF_LOWER_UP != 0;
            out.push((index, up));
        }
        // Messages are 4-byte aligned.
        at += (len + 3) & !3;
    }
    out
}

/// Watches the carrier of `links` (interface name, direction) until `shutdown`, calling
/// `changed(dir, up)` when one changes. Runs on a thread of its own.
pub fn start(
    links: &[(String, Dir)],
    shutdown: Arc<dyn Fn() -> bool + Send + Sync>,
    changed: Box<dyn Fn(Dir, bool) + Send>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let fd = subscribe()?;
    let mut by_index = HashMap::new();
    for (name, dir) in links {
        let c = CString::new(name.as_str()).map_err(std::io::Error::other)?;
        // SAFETY: c is a valid NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
        if index != 0 {
            by_index.insert(index as i32, *dir);
        }
    }
    std::thread::Builder::new()
        .name("torusd-carrier".into())
        .spawn(move || {
            let mut up: HashMap<Dir, bool> = by_index.values().map(|d| (*d, true)).collect();
            let mut buf = vec![0u8; 32 * 1024];
            while !shutdown() {
                // SAFETY: buf is valid for its length.
                let n =
                    unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n <= 0 {
                    continue; // timeout, or ENOBUFS after a burst: read on
                }
                for (index, now_up) in parse(&buf[..n as usize]) {
                    let Some(dir) = by_index.get(&index) else {
                        continue;
                    };
                    if up.insert(*dir, now_up) != Some(now_up) {
                        changed(*dir, now_up);
                    }
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: u16, index: i32, flags: u32) -> Vec<u8> {
        let mut b = vec![0u8; 32];
        b[0..4].copy_from_slice(&32u32.to_ne_bytes());
        b[4..6].copy_from_slice(&kind.to_ne_bytes());
        b[20..24].copy_from_slice(&index.to_ne_bytes());
        b[24..28].copy_from_slice(&flags.to_ne_bytes());
        b
    }

    #[test]
    fn reads_carrier_changes_and_stops_at_garbage() {
        let up = libc::IFF_UP as u32 | IFF_LOWER_UP;
        let mut b = msg(libc::RTM_NEWLINK, 7, up);
        b.extend(msg(libc::RTM_NEWLINK, 8, libc::IFF_UP as u32));
        b.extend(msg(libc::RTM_DELLINK, 9, up));
        b.extend(msg(libc::RTM_NEWADDR, 10, up));
        assert_eq!(parse(&b), vec![(7, true), (8, false), (9, false)]);
        let mut bad = msg(libc::RTM_NEWLINK, 7, up);
        bad[0..4].copy_from_slice(&4000u32.to_ne_bytes());
        assert!(parse(&bad).is_empty());
        assert!(parse(&[1, 2, 3]).is_empty());
    }
}
