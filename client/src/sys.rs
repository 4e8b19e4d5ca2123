//! The few system calls a channel needs, on both sides: a memfd and its mapping, eventfds,
//! and file descriptors passed over a Unix socket (SCM_RIGHTS).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// A shared mapping of a whole file, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; its users synchronise through the channel protocol.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared, readable and writable.
    pub fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of a file we hold; checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast(), len })
    }

    /// The first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A new anonymous memory file of `len` bytes (zero-filled, sealed against shrinking so the
/// other side's mapping cannot be cut under it).
pub fn memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
    let c =
        std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid C string; the fd is owned on success.
    let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is fresh and ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: resizing our own file.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: sealing our own file.
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The size of a file (the memfd an application received).
pub fn file_len(fd: &OwnedFd) -> io::Result<usize> {
    // SAFETY: fstat into our struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_size as usize)
}

/// A non-blocking eventfd.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; owned on success.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is fresh.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Signals an eventfd (adds one).
pub fn signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writing 8 bytes to an eventfd; EAGAIN (counter full) is harmless.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Clears an eventfd's counter.
pub fn drain(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reading 8 bytes from a non-blocking eventfd; EAGAIN when it was zero.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

/// Waits until `fd` is readable or `timeout_ms` passes (-1: no limit); true when readable.
pub fn wait_readable(fd: RawFd, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    n > 0
}

/// Sends `line` and `fds` in one message on a Unix stream socket.
pub fn send_with_fds(sock: &UnixStream, line: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: line.as_ptr() as *mut libc::c_void,
        iov_len: line.len(),
    };
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) };
    let mut cbuf = vec![0u8; space as usize];
    // SAFETY: msghdr zeroed then filled with pointers to live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as usize;
        // SAFETY: the control buffer holds one cmsg of the right size.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c) as *mut RawFd,
                fds.len(),
            );
        }
    }
    // SAFETY: msg points at live buffers for the call's duration.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if (n as usize) < line.len() {
        // The rest of the line, without descriptors.
        use std::io::Write;
        let mut s = sock;
        s.write_all(&line[n as usize..])?;
    }
    Ok(())
}

/// Receives one line (up to `\n`) and the descriptors sent with it.
pub fn recv_line_with_fds(
    sock: &UnixStream,
    max_fds: usize,
) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut line = Vec::new();
    let mut fds = Vec::new();
    let mut buf = [0u8; 4096];
    while !line.ends_with(b"\n") {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: 1,
        };
        // One byte at a time until the descriptors have arrived (they come with the first
        // byte), so no byte after the line is consumed.
        if !fds.is_empty() || !line.is_empty() {
            iov.iov_len = 1;
        }
        let space = unsafe { libc::CMSG_SPACE((max_fds * std::mem::size_of::<RawFd>()) as u32) };
        let mut cbuf = vec![0u8; space as usize];
        // SAFETY: zeroed msghdr filled with pointers to live buffers.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as usize;
        // SAFETY: as above.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        // SAFETY: walking the control messages the kernel wrote into cbuf.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c) as *const RawFd;
                    let count =
                        ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                    for i in 0..count {
                        fds.push(OwnedFd::from_raw_fd(*data.add(i)));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        line.extend_from_slice(&buf[..n as usize]);
        if line.len() > 1 << 20 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
        }
    }
    Ok((line, fds))
}

/// The peer's credentials on a Unix socket: (pid, uid, gid) and its supplementary groups.
pub fn peer_credentials(sock: &UnixStream) -> io::Result<(i32, u32, u32, Vec<u32>)> {
    // SAFETY: getsockopt into a ucred of the right size.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![0u32; 256];
    let mut glen = (groups.len() * 4) as libc::socklen_t;
    // SAFETY: getsockopt into our buffer of glen bytes.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERGROUPS,
            groups.as_mut_ptr().cast(),
            &mut glen,
        )
    };
    if r < 0 {
        groups.clear();
    } else {
        groups.truncate(glen as usize / 4);
    }
    Ok((cred.pid, cred.uid, cred.gid, groups))
}
