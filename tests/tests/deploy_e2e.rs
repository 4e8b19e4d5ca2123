//! The preflight (issue 9): `torusctl doctor` passes inside a namespace of a running 3x3x3
//! torus, and reports each deliberately broken setting with its fix; torusd refuses a link
//! whose frames could land on a queue nobody reads. Needs root.

use std::process::{Command, Output};

use torusnet_e2e::{ip, root, Torus};

fn doctor(ns: &str, file: &str, pre: &str) -> (i32, String) {
    let bin = root().join("target/release/torusctl");
    let cmd = format!("{pre} {} doctor --config {file}", bin.display());
    let out: Output = Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", &cmd])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn doctor_passes_in_the_torus_and_names_each_broken_setting() {
    let t = Torus::up("tdoc", "3x3x3");
    t.start();
    let (ns, file) = ("tdoc-1-0-2", "/run/torusnet/tdoc/1-0-2.toml");
    // Wait for the control plane: the doctor reads the neighbours from it.
    let t0 = std::time::Instant::now();
    let (code, out) = loop {
        let (code, out) = doctor(ns, file, "");
        if (code == 0 && out.contains("node 20 at 2,0,2"))
            || t0.elapsed() > std::time::Duration::from_secs(20)
        {
            break (code, out);
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    };
    assert_eq!(code, 0, "doctor passes in a torus namespace:\n{out}");
    assert!(out.contains("0 failed"), "{out}");
    assert!(
        out.contains("link px (+x) neighbour") && out.contains("node 20 at 2,0,2"),
        "{out}"
    );
    // bpffs: not mounted in this mount namespace: a warning with the fix; mounted: ok.
    assert!(
        out.contains("WARN bpffs") && out.contains("fix: mount -t bpf bpf /sys/fs/bpf"),
        "{out}"
    );
    let (_, out) = doctor(ns, file, "mount -t bpf bpf /sys/fs/bpf &&");
    assert!(out.contains("ok   bpffs"), "{out}");

    // MTU mismatch with the node file.
    ip(&["-n", ns, "link", "set", "px", "mtu", "1400"]);
    let (code, out) = doctor(ns, file, "");
    assert_eq!(code, 1);
    assert!(
        out.contains("FAIL link px (+x) mtu") && out.contains("MTU 1400, the node file says 1500"),
        "{out}"
    );
    assert!(out.contains("fix: ip link set px mtu 1500"), "{out}");
    ip(&["-n", ns, "link", "set", "px", "mtu", "1500"]);

    // Interface down.
    ip(&["-n", ns, "link", "set", "mx", "down"]);
    let (code, out) = doctor(ns, file, "");
    assert_eq!(code, 1);
    assert!(
        out.contains("FAIL link mx (-x)")
            && out.contains("interface is down")
            && out.contains("fix: ip link set mx up"),
        "{out}"
    );
    ip(&["-n", ns, "link", "set", "mx", "up"]);

    // A link with two RX queues in use (the kernel refuses the change while XDP is attached:
    // stop the daemons first).
    t.stop();
    let ok = Command::new("ip")
        .args([
            "netns", "exec", ns, "ethtool", "-L", "py", "rx", "2", "tx", "2",
        ])
        .status()
        .unwrap();
    assert!(ok.success(), "ethtool -L on veth");
    let (code, out) = doctor(ns, file, "");
    assert_eq!(code, 1);
    assert!(
        out.contains("FAIL link py (+y) queues") && out.contains("2 RX queues"),
        "{out}"
    );
    assert!(
        out.contains("ethtool -L py combined 1") && out.contains("rx_queue_steering = true"),
        "{out}"
    );

    // A missing interface.
    let bad = "/run/torusnet/tdoc/bad.toml";
    std::fs::write(
        bad,
        std::fs::read_to_string(file)
            .unwrap()
            .replace("ifname = \"pz\"", "ifname = \"nosuch\""),
    )
    .unwrap();
    let (code, out) = doctor(ns, bad, "");
    assert_eq!(code, 1);
    assert!(
        out.contains("FAIL link nosuch (+z)") && out.contains("no such interface"),
        "{out}"
    );
}

#[test]
fn torusd_refuses_a_link_with_unread_queues() {
    let _t = Torus::up("tdq", "2x1x1");
    let ns = "tdq-0-0-0";
    assert!(Command::new("ip")
        .args(["netns", "exec", ns, "ethtool", "-L", "px", "rx", "2", "tx", "2"])
        .status()
        .unwrap()
        .success());
    let file = "/run/torusnet/tdq/0-0-0.toml";
    let text = std::fs::read_to_string(file)
        .unwrap()
        .replace("socket = ", "coord = \"0,0,0\"\nsocket = ");
    std::fs::write(file, &text).unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(root().join("target/release/torusd"))
        .args(["--config", file])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("px: 2 RX queues, but torusd reads queue 0 only"),
        "{err}"
    );
    assert!(err.contains("rx_queue_steering = true"), "{err}");
}
