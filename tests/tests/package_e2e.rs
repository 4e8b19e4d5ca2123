//! The Debian package as an operator meets it: built by scripts/package-deb.sh (cargo-deb),
//! installed with dpkg, `torusd --check` passing on the example node file, man pages and
//! completions in place, then purged with nothing left behind. Skipped (with a message) on
//! a machine where a torusnet package is already installed: this test never touches one it
//! did not install.

use std::path::Path;
use std::process::{Command, Output};

use torusnet_e2e::root;

fn run(args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {args:?}: {e}"))
}

fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(
        o.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Purges the package when the test ends, also when it fails.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = run(&["dpkg", "--purge", "torusnet"]);
    }
}

#[test]
fn the_debian_package_installs_checks_and_purges_cleanly() {
    if run(&["dpkg", "-s", "torusnet"]).status.success() {
        eprintln!("a torusnet package is installed here already: not touching it, test skipped");
        return;
    }
    let script = root().join("scripts/package-deb.sh");
    let out = ok(&["bash", &script.to_string_lossy(), "--no-build"]);
    let deb = root().join(out.lines().last().expect("the package's path").trim());
    assert!(deb.exists(), "{}", deb.display());
    let contents = ok(&["dpkg-deb", "-c", &deb.to_string_lossy()]);
    let files: Vec<String> = contents
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().last())
        .map(|p| p.trim_start_matches('.').to_string())
        .collect();
    for want in [
        "/usr/bin/torusd",
        "/usr/bin/torusctl",
        "/lib/systemd/system/torusd@.service",
        "/lib/systemd/system/torusnet-control@.service",
        "/etc/torusnet/example.toml",
        "/usr/share/man/man1/torusd.1.gz",
        "/usr/share/man/man1/torusctl-ping.1.gz",
        "/usr/share/bash-completion/completions/torusctl",
        "/usr/share/doc/torusnet/keyspace.md",
    ] {
        assert!(
            files.iter().any(|f| f == want),
            "{want} not in the package:\n{contents}"
        );
    }

    let guard = Installed;
    ok(&["dpkg", "-i", &deb.to_string_lossy()]);
    let check = ok(&[
        "/usr/bin/torusd",
        "--check",
        "--config",
        "/etc/torusnet/example.toml",
    ]);
    assert!(check.contains("is valid"), "{check}");
    let v = ok(&["/usr/bin/torusctl", "--version"]);
    assert!(v.starts_with("torusctl "), "{v}");
    let unit = std::fs::read_to_string("/lib/systemd/system/torusd@.service").expect("unit");
    assert!(
        unit.contains("ExecStart=/usr/bin/torusd --config /etc/torusnet/%i.toml"),
        "{unit}"
    );
    // A broken node file is refused with one clear line.
    let bad = std::env::temp_dir().join(format!("torusnet-bad-{}.toml", std::process::id()));
    std::fs::write(&bad, "dims = \"3x3\"\n").expect("write");
    let o = run(&[
        "/usr/bin/torusd",
        "--check",
        "--config",
        &bad.to_string_lossy(),
    ]);
    let _ = std::fs::remove_file(&bad);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("torusd: "));

    drop(guard);
    assert!(
        !run(&["dpkg", "-s", "torusnet"]).status.success(),
        "still installed"
    );
    let left: Vec<&String> = files
        .iter()
        .filter(|f| Path::new(f.as_str()).exists())
        .collect();
    assert!(left.is_empty(), "left behind after purge: {left:?}");
    assert!(
        !Path::new("/etc/torusnet").exists(),
        "/etc/torusnet left behind"
    );
}
