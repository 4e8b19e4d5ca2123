//! Compiles the XDP program in ../ebpf with clang, twice: plain `xdp` and `xdp.frags`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"))
        .join("../ebpf/torus_xdp.c");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-env-changed=CLANG");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    for (name, extra) in [
        ("torus_xdp.o", None),
        ("torus_xdp_frags.o", Some("-DTORUS_FRAGS")),
    ] {
        let mut cmd = Command::new(&clang);
        cmd.args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-c"])
            .arg(&src)
            .arg("-o")
            .arg(out.join(name));
        if let Some(flag) = extra {
            cmd.arg(flag);
        }
        match cmd.status() {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("clang failed ({s}) compiling {}", src.display()),
            Err(e) => panic!(
                "cannot run {clang} ({e}): the XDP program needs clang; \
                 run scripts/install-deps.sh (or set CLANG)"
            ),
        }
    }
}
