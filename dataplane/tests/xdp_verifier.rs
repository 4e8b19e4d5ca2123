//! The kernel's verifier accepts both variants of the XDP program on a veth, each at the
//! MTU it is for (plain at 1500, frags at 9000 where the plain one is refused).
//! Needs root: it makes a network namespace (removed again, also on failure).

use std::process::Command;

use torusnet_dataplane::xdp_object::Variant;

/// A network namespace that is deleted when dropped.
struct Netns(String);

impl Netns {
    fn new(name: &str) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", name]).status();
        ip(&["netns", "add", name]);
        Netns(name.to_string())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn try_ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn kernel_accepts_both_variants() {
    assert_eq!(
        unsafe { libc_geteuid() },
        0,
        "this test loads XDP programs and needs root"
    );
    let ns = Netns::new(&format!("tnxdp{}", std::process::id()));
    let dir = std::env::temp_dir().join(format!("torusnet-xdp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let n = ns.0.as_str();
    ip(&[
        "-n", n, "link", "add", "va", "type", "veth", "peer", "name", "vb",
    ]);
    ip(&["-n", n, "link", "set", "va", "up"]);
    ip(&["-n", n, "link", "set", "vb", "up"]);
    for (variant, mtu) in [(Variant::Plain, "1500"), (Variant::Frags, "9000")] {
        let obj = dir.join(format!("{}.o", variant.section()));
        std::fs::write(&obj, variant.object()).expect("write object");
        let obj = obj.to_string_lossy().into_owned();
        ip(&["-n", n, "link", "set", "vb", "mtu", mtu]);
        ip(&["-n", n, "link", "set", "va", "mtu", mtu]);
        if variant == Variant::Frags {
            // The reason the frags variant exists: the plain one is refused at this MTU.
            let plain = dir.join("plain.o");
            std::fs::write(&plain, Variant::Plain.object()).expect("write object");
            let p = plain.to_string_lossy().into_owned();
            assert!(
                !try_ip(&["-n", n, "link", "set", "dev", "va", "xdp", "obj", &p, "sec", "xdp"]),
                "plain XDP unexpectedly accepted with a 9000-byte peer MTU"
            );
        }
        ip(&[
            "-n",
            n,
            "link",
            "set",
            "dev",
            "va",
            "xdp",
            "obj",
            &obj,
            "sec",
            variant.section(),
        ]);
        let show = ip(&["-n", n, "link", "show", "va"]);
        assert!(show.contains("prog/xdp"), "{show}");
        assert!(show.contains("torus_xdp"), "{show}");
        ip(&["-n", n, "link", "set", "dev", "va", "xdp", "off"]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
