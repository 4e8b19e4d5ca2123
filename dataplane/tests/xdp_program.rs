//! One routing decision, two executors, the C side: the XDP program (ebpf/torus_xdp.c),
//! run by the kernel's test runner (BPF_PROG_TEST_RUN) on frames of every kind under maps
//! written from random views, decides exactly as `transit::decide` (which the engine's
//! tests hold to the engine's own forwarding): the same verdict, the same link, the same
//! bytes leaving, the same reason counted for a frame that goes up. Both variants: plain at
//! MTU 1500, and frags at 9000 with multi-buffer frames. Needs root: it makes a network
//! namespace with six veth pairs for the program's links (removed again, also on failure).

use torusnet_dataplane::loader::{AttachPreference, XdpProgram};
use torusnet_dataplane::netns::{ifindex, veth_pair, Netns};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::routing::transit::{decide, Sample, Up, Verdict};
use torusnet_proto::topology::{Dims, Dir};
use torusnet_proto::wire::{offset, ETHERTYPE_DATA, HEADERS_LEN};

const XDP_REDIRECT: u32 = 4;
const XDP_PASS: u32 = 2;

/// Makes `frame` a jumbo frame (about `to` bytes) by growing its payload.
fn grow(rng: &mut SplitMix64, frame: &mut Vec<u8>, to: usize) {
    let route = usize::from(frame[offset::ROUTE_LEN]);
    let len = to - HEADERS_LEN - route;
    frame.resize(HEADERS_LEN + route, 0);
    let mut payload = vec![0u8; len];
    rng.fill(&mut payload);
    frame.extend_from_slice(&payload);
    frame[offset::PAYLOAD_LEN..offset::PAYLOAD_LEN + 2]
        .copy_from_slice(&(len as u16).to_be_bytes());
}

fn run(mtu: u32, seed: u64) -> (u64, u64) {
    let ns = Netns::new(&format!("tnxp{}m{mtu}", std::process::id())).expect("netns");
    for d in Dir::ALL {
        let i = d.index();
        veth_pair(&ns, &format!("va{i}"), &ns, &format!("vb{i}"), mtu).expect("veth");
    }
    ns.enter().expect("enter netns");
    let mut rng = SplitMix64::new(seed);
    let (mut forwarded, mut up) = (0u64, 0u64);
    for (x, y, z, fail) in [
        (3, 3, 3, 0.1),
        (4, 4, 1, 0.1),
        (2, 2, 2, 0.1),
        (5, 3, 2, 0.2),
        (8, 8, 8, 0.05),
    ] {
        let dims = Dims::new(x, y, z).unwrap();
        let mut prog = XdpProgram::load(mtu, dims.count()).expect("load");
        let mut ifindices = [0u32; 6];
        for d in Dir::ALL {
            let name = format!("va{}", d.index());
            prog.attach(&name, d, AttachPreference::Auto)
                .expect("attach");
            ifindices[usize::from(d.index())] = ifindex(&name).expect("ifindex");
        }
        for _ in 0..6 {
            let s = Sample::new(&mut rng, dims, fail);
            let all: Vec<u32> = (0..dims.count() as u32).collect();
            prog.write_transit(&s.maps, &all).expect("maps");
            for _ in 0..300 {
                let (input, mut frame) = s.frame(&mut rng);
                if frame.len() < HEADERS_LEN
                    || u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE_DATA
                {
                    continue;
                }
                if mtu > 3000 && rng.chance(0.5) {
                    let to = 4000 + rng.below(5000) as usize;
                    grow(&mut rng, &mut frame, to);
                }
                let before = prog.counters(Some(input));
                let (action, out) = prog
                    .run_once(&frame, ifindices[usize::from(input.index())])
                    .expect("test run");
                let after = prog.counters(Some(input));
                let mut model = frame.clone();
                let len = model.len();
                match decide(&s.maps, input, &mut model, len) {
                    Verdict::Forward(dir) => {
                        forwarded += 1;
                        assert_eq!(action, XDP_REDIRECT, "to {dir}: {frame:?}");
                        assert_eq!(out, model, "to {dir}: {frame:?}");
                        assert_eq!(after.transit_in, before.transit_in + 1);
                    }
                    Verdict::Up(u) => {
                        up += 1;
                        // No socket is bound: up is a pass to the kernel here.
                        assert_eq!(action, XDP_PASS, "{u:?}: {frame:?}");
                        assert_eq!(out, frame, "{u:?}");
                        assert_eq!(after.up.get(u), before.up.get(u) + 1, "{u:?}: {frame:?}");
                        for other in Up::ALL.into_iter().filter(|o| *o != u) {
                            assert_eq!(after.up.get(other), before.up.get(other));
                        }
                    }
                }
            }
        }
        drop(prog);
    }
    (forwarded, up)
}

#[test]
fn the_c_program_decides_as_the_rust_one() {
    assert!(is_root(), "this test loads XDP programs and needs root");
    let (f, u) = run(1500, 48);
    eprintln!("plain: {f} forwarded, {u} up, as the Rust decided");
    assert!(f > 2_000 && u > 1_000, "plain: {f} forwarded, {u} up");
    let (f, u) = run(9000, 49);
    eprintln!("frags: {f} forwarded, {u} up, as the Rust decided");
    assert!(f > 2_000 && u > 1_000, "frags: {f} forwarded, {u} up");
}

fn is_root() -> bool {
    extern "C" {
        fn geteuid() -> u32;
    }
    // SAFETY: geteuid has no preconditions.
    unsafe { geteuid() == 0 }
}
