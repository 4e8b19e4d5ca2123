//! The Debian package as an operator meets it: built by scripts/package-deb.sh (cargo-deb),
//! installed with dpkg, `torusd --check` passing on the example node file, man pages and
//! completions in place, then purged with nothing left behind. Skipped (with a message) on
//! a machine where a torusnet package is already installed: this test never touches one it
//! did not install.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

use torusnet_e2e::root;

/// Runs a command as an operator or developer would, outside the checkout's build: cargo
/// puts `target/release` on the test's `LD_LIBRARY_PATH`, where a checkout's copy of the
/// client library may be found first.
fn run(args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("TORUSNET_LIB")
        .env_remove("PYTHONPATH")
        .output()
        .unwrap_or_else(|e| panic!("run {args:?}: {e}"))
}

/// Held by each test for its whole run: both install and purge with dpkg, which takes one
/// lock for its database, and both write the same packages into target/debian. Run side by
/// side, they once shared one build tree and one test's script emptied the other's
/// (scripts/package-client-deb.sh now builds in a private tree and renames into place).
static PACKAGING: Mutex<()> = Mutex::new(());

/// Takes [`PACKAGING`], also after the other test panicked while holding it.
fn packaging() -> MutexGuard<'static, ()> {
    PACKAGING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
    let _serial = packaging();
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

/// The client packages purged, and the scratch directory removed, when the test ends (also
/// when it fails).
struct ClientInstalled {
    scratch: std::path::PathBuf,
}

impl Drop for ClientInstalled {
    fn drop(&mut self) {
        let _ = run(&[
            "dpkg",
            "--purge",
            "libtorusnet-client-dev",
            "libtorusnet-client0",
        ]);
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// Applications this test started in the torus, killed when it ends.
struct Apps(Vec<std::process::Child>);

impl Drop for Apps {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Every file (not directory) a package holds, as installed paths.
fn package_files(deb: &Path) -> Vec<String> {
    ok(&["dpkg-deb", "-c", &deb.to_string_lossy()])
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split(" -> ").next())
        .filter_map(|l| l.split_whitespace().last())
        .map(|p| p.trim_start_matches('.').to_string())
        .collect()
}

/// Until `name` is attached at the server behind `status_of` and resolves from `from`.
fn wait_resolves(t: &torusnet_e2e::Torus, from: &Path, name: &str) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let c = torusnet_client::Client::attach(from, &format!("pkg-resolver-{name}"))
        .expect("attach a resolver");
    loop {
        if c.resolve(name, std::time::Duration::from_millis(500))
            .is_ok_and(|v| !v.is_empty())
        {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "{name} never resolved ({:?})",
            t.dir()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// As an application developer on a server where torusnet's packages are installed: the
/// client packages built and installed with dpkg, the C example (from the -dev package's
/// documentation) built with pkg-config and no path into the checkout, the Python package
/// built as a wheel and installed with pip into a fresh virtual environment, both run
/// against real daemons in a namespace torus, then everything purged with nothing left.
#[test]
fn application_developers_build_against_the_installed_packages() {
    let _serial = packaging();
    for p in ["libtorusnet-client0", "libtorusnet-client-dev"] {
        if run(&["dpkg", "-s", p]).status.success() {
            eprintln!("{p} is installed here already: not touching it, test skipped");
            return;
        }
    }
    if Path::new("/usr/include/torusnet.h").exists() {
        eprintln!("/usr/include/torusnet.h exists (not ours): test skipped");
        return;
    }
    let script = root().join("scripts/package-client-deb.sh");
    let out = ok(&["bash", &script.to_string_lossy()]);
    let debs: Vec<std::path::PathBuf> = out.lines().map(|l| root().join(l.trim())).collect();
    assert_eq!(debs.len(), 2, "{out}");
    let mut files = Vec::new();
    for deb in &debs {
        files.extend(package_files(deb));
    }
    for want in [
        "/usr/include/torusnet.h",
        "/usr/share/doc/libtorusnet-client-dev/examples/echo.c",
    ] {
        assert!(files.iter().any(|f| f == want), "{want} not in {files:?}");
    }
    for want in [
        "libtorusnet_client.so.0",
        "libtorusnet_client.so",
        "pkgconfig/torusnet.pc",
    ] {
        assert!(
            files.iter().any(|f| f.ends_with(&format!("/{want}"))),
            "{want} not in {files:?}"
        );
    }

    let scratch = std::env::temp_dir().join(format!("torusnet-appdev-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).expect("scratch directory");
    let guard = ClientInstalled {
        scratch: scratch.clone(),
    };
    let s = |p: &str| scratch.join(p).to_string_lossy().into_owned();
    let mut install = vec!["dpkg", "-i"];
    let deb_paths: Vec<String> = debs
        .iter()
        .map(|d| d.to_string_lossy().into_owned())
        .collect();
    install.extend(deb_paths.iter().map(String::as_str));
    ok(&install);

    // C: pkg-config knows the library; the example builds from the installed files alone.
    let flags = ok(&["pkg-config", "--cflags", "--libs", "torusnet"]);
    assert!(flags.contains("-ltorusnet_client"), "{flags}");
    assert!(
        !flags.contains("/work") && !flags.contains("target"),
        "{flags}"
    );
    ok(&[
        "cp",
        "/usr/share/doc/libtorusnet-client-dev/examples/echo.c",
        &s("echo.c"),
    ]);
    let build = format!(
        "cd {} && cc -O2 -Wall -Werror -o echo echo.c $(pkg-config --cflags --libs torusnet)",
        scratch.display()
    );
    ok(&["sh", "-c", &build]);
    let ldd = ok(&["ldd", &s("echo")]);
    let line = ldd
        .lines()
        .find(|l| l.contains("libtorusnet_client.so.0"))
        .unwrap_or_else(|| panic!("echo does not need libtorusnet_client.so.0:\n{ldd}"));
    assert!(
        line.contains("=> /usr/lib/") || line.contains("=> /lib/"),
        "the installed library is not the one loaded: {line}"
    );

    // Python: a wheel built from the package's source, installed with pip into a fresh venv.
    ok(&[
        "cp",
        "-r",
        &root().join("client/python").to_string_lossy(),
        &s("py"),
    ]);
    let _ = std::fs::remove_dir_all(scratch.join("py/tests"));
    ok(&["python3", "-m", "venv", &s("venv")]);
    let pip = s("venv/bin/pip");
    ok(&[
        &pip,
        "wheel",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "-w",
        &s("wheels"),
        &s("py"),
    ]);
    let wheel = std::fs::read_dir(scratch.join("wheels"))
        .expect("wheels")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("a wheel");
    ok(&[
        &pip,
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &wheel.to_string_lossy(),
    ]);
    let python = s("venv/bin/python");
    let probe = ok(&[
        &python,
        "-c",
        "import torusnet; print(torusnet.__file__); print(torusnet._lib._name); \
         print(torusnet.__version__)",
    ]);
    let lines: Vec<&str> = probe.lines().collect();
    assert!(
        lines.first().is_some_and(|f| f.starts_with(&s("venv"))),
        "{probe}"
    );
    assert_eq!(lines.get(1), Some(&"libtorusnet_client.so.0"), "{probe}");
    ok(&[
        "cp",
        &root()
            .join("client/python/examples/echo.py")
            .to_string_lossy(),
        &s("echo.py"),
    ]);

    // Both against real daemons, one hop apart, with nothing from the checkout on their paths.
    let t = torusnet_e2e::Torus::up("tpk", "2x1x1");
    t.start();
    t.wait_converged(std::time::Duration::from_secs(40));
    let sock = |c: &str| t.dir().join(format!("{c}-apps.sock"));
    let (here, there) = (sock("0-0-0"), sock("1-0-0"));
    let mut apps = Apps(Vec::new());
    for argv in [
        vec![
            s("echo"),
            "server".into(),
            there.to_string_lossy().into(),
            "echo-c".into(),
        ],
        vec![
            python.clone(),
            s("echo.py"),
            "server".into(),
            there.to_string_lossy().into(),
            "echo-py".into(),
        ],
    ] {
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &t.ns("1,0,0")])
            .args(&argv)
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("TORUSNET_LIB")
            .env_remove("PYTHONPATH")
            .current_dir(&scratch)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn an echo server");
        apps.0.push(child);
    }
    for name in ["echo-c", "echo-py"] {
        wait_resolves(&t, &here, name);
    }
    for (client, server) in [
        (vec![s("echo"), "client".into()], "echo-py"),
        (
            vec![python.clone(), s("echo.py"), "client".into()],
            "echo-c",
        ),
    ] {
        let o = std::process::Command::new("timeout")
            .args(["120", "ip", "netns", "exec", &t.ns("0,0,0")])
            .args(&client)
            .args([here.to_string_lossy().as_ref(), server, "100"])
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("TORUSNET_LIB")
            .env_remove("PYTHONPATH")
            .current_dir(&scratch)
            .output()
            .expect("run an echo client");
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{client:?} -> {server}: {text} / {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}: {text}"));
        eprintln!("{client:?} -> {server}: {v}");
        assert_eq!(v["reliable_ok"], serde_json::json!(100), "{v}");
        assert_eq!(v["reliable_bad"], serde_json::json!(0), "{v}");
        assert_eq!(v["call_ok"], serde_json::json!(true), "{v}");
    }
    drop(apps);
    drop(t);

    // Purged: dpkg knows nothing of them and no file of theirs is left.
    drop(guard);
    for p in ["libtorusnet-client0", "libtorusnet-client-dev"] {
        let l = run(&["dpkg", "-l", p]);
        let text = String::from_utf8_lossy(&l.stdout);
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("ii") || l.starts_with("rc")),
            "{p} still known to dpkg:\n{text}"
        );
    }
    let left: Vec<&String> = files
        .iter()
        .filter(|f| Path::new(f.as_str()).symlink_metadata().is_ok())
        .collect();
    assert!(left.is_empty(), "left behind after purge: {left:?}");
    assert!(!scratch.exists(), "{} left behind", scratch.display());
}
