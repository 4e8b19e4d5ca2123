//! Management sockets only their owner may use. A Unix socket's permissions decide who may
//! connect, and `bind` gives it the process's umask: under a umask of 0 anyone on the
//! server could send a daemon management commands. So the socket is bound inside a fresh
//! directory nobody else may enter, made owner-only, and only then moved to its path: there
//! is no moment at which another user could connect to it.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// Binds a listening socket at `path` (replacing a stale one, creating its directory) that
/// only this process's user may connect to (mode 0600).
pub fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{}: not a file path", path.display())))?;
    let staging = dir.join(format!(
        ".bind-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::DirBuilder::new().mode(0o700).create(&staging)?;
    let bound = (|| {
        let tmp = staging.join(name);
        let listener = UnixListener::bind(&tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        let _ = std::fs::remove_file(path);
        std::fs::rename(&tmp, path)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&staging);
    bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn the_socket_is_its_owners_alone_and_answers_at_its_path() {
        let dir = std::env::temp_dir().join(format!("torusnet-sock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub/n0.sock");
        // A stale socket from an earlier run is replaced.
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        drop(UnixListener::bind(&path).unwrap());
        let l = bind_private(&path).expect("bind");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        let mut c = UnixStream::connect(&path).expect("connect");
        let (s, _) = l.accept().expect("accept");
        writeln!(&s, "hello").unwrap();
        let mut line = String::new();
        BufReader::new(&mut c).read_line(&mut line).unwrap();
        assert_eq!(line, "hello\n");
        // Nothing left beside it.
        let left: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("n0.sock")]);
        let _ = c.flush();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
