//! One routing decision, two executors: the XDP program forwards a frame passing through
//! only as the engine would. For servers under views with failed links and servers on
//! several tori, and frames of every kind towards every server (hostile ones among them),
//! whenever `transit::decide` (the program's decision, which the dataplane's tests prove
//! the C program makes) forwards a frame, the engine's `handle_rx` forwards it too, on a
//! next-hop set holding the chosen link, with the same header bytes; and a frame the
//! engine would drop or keep never leaves from XDP.

use torusnet_proto::node::{Node, RxAction};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::routing::transit::{decide, Sample, Up, Verdict};
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Dims, DirSet};
use torusnet_proto::transport::Config;
use torusnet_proto::wire::{flags, offset};

#[test]
fn the_xdp_program_forwards_only_as_the_engine_would() {
    let mut rng = SplitMix64::new(43);
    let (mut next_hop, mut routed, mut up) = (0u64, 0u64, [0u64; 9]);
    for (x, y, z, fail) in [
        (3, 3, 3, 0.0),
        (3, 3, 3, 0.15),
        (4, 4, 1, 0.1),
        (2, 2, 2, 0.1),
        (5, 3, 2, 0.2),
        (8, 8, 8, 0.05),
        (16, 1, 1, 0.1),
    ] {
        let dims = Dims::new(x, y, z).unwrap();
        for _ in 0..12 {
            let s = Sample::new(&mut rng, dims, fail);
            let mut engine = Node::new(s.maps.local, s.view.clone(), Config::default()).unwrap();
            for _ in 0..400 {
                let (input, frame) = s.frame(&mut rng);
                let mut xdp = frame.clone();
                let len = xdp.len();
                let verdict = decide(&s.maps, input, &mut xdp, len);
                let Verdict::Forward(dir) = verdict else {
                    if let Verdict::Up(u) = verdict {
                        up[u as usize] += 1;
                    }
                    continue;
                };
                let mut theirs = frame.clone();
                match engine.handle_rx(Time::ZERO, input, &mut theirs) {
                    RxAction::Forward(hops) => {
                        assert!(hops.contains(dir), "{dir} not in {hops:?}: {frame:?}");
                        if hops.len() > 1 {
                            // Among equal next hops a loaded one only while none is free.
                            let free = hops.minus(s.maps.congested);
                            let usable = DirSet::from_bits(free.bits() & s.maps.usable.bits());
                            assert!(usable.is_empty() || usable.contains(dir));
                        }
                    }
                    other => panic!("XDP forwards on {dir}, the engine {other:?}: {frame:?}"),
                }
                // The same bytes leave, but for what the driver writes on the way out in
                // both paths: the Ethernet addresses, the link's load into the telemetry.
                let cong = offset::CONG;
                assert_eq!(xdp[12..cong], theirs[12..cong], "{frame:?}");
                assert_eq!(xdp[cong + 1..], theirs[cong + 1..], "{frame:?}");
                let level = s.maps.levels[usize::from(dir.index())];
                assert_eq!(xdp[cong], frame[cong].max(level));
                let m = s.maps.macs[usize::from(dir.index())];
                assert_eq!(xdp[0..6], m.neighbor.unwrap());
                assert_eq!(xdp[6..12], m.local);
                let fl = u16::from_be_bytes([frame[offset::FLAGS], frame[offset::FLAGS + 1]]);
                if fl & flags::SOURCE_ROUTED != 0 {
                    routed += 1;
                } else {
                    next_hop += 1;
                }
            }
        }
    }
    // Not vacuous: most passing frames are forwarded, both ways, and every reason to go up
    // but a frame's headers beyond what XDP reads (no sample is multi-buffer) occurs.
    eprintln!("forwarded by next hops {next_hop}, by source routes {routed}; up {up:?}");
    assert!(next_hop > 6_000 && routed > 1_000, "{next_hop} {routed}");
    for u in Up::ALL {
        if u != Up::Headers {
            assert!(up[u as usize] > 0, "{u:?} never seen: {up:?}");
        }
    }
}
