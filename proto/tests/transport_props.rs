//! The transport over the deterministic harness: exactly-once, byte-exact delivery with
//! every fence respected, under loss up to 20%, reordering, duplication and a link cut,
//! across many seeds; and the overhead and striping figures the design promises.

use std::time::Duration;

use proptest::prelude::*;
use torusnet_proto::harness::{self, LinkModel, Scenario, Sizes};
use torusnet_proto::transport::Config;

fn check(sc: &Scenario) -> harness::Report {
    let r = harness::run(sc);
    assert!(r.finished, "did not finish: {r:?}\n{sc:?}");
    assert_eq!(r.delivered, sc.messages, "{r:?}\n{sc:?}");
    assert_eq!(r.duplicated, 0, "{r:?}");
    assert_eq!(r.corrupted, 0, "{r:?}");
    assert_eq!(r.fence_violations, 0, "{r:?}");
    r
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn exactly_once_byte_exact_fences_held(
        links in 1u8..=4,
        loss in 0.0f64..=0.2,
        reorder in 0.0f64..=0.3,
        dup in 0.0f64..=0.05,
        cut_at_us in proptest::option::of(50u64..3000),
        fence_every in prop_oneof![Just(0u64), Just(1), Just(2), Just(7), Just(100)],
        jumbo in any::<bool>(),
        big in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mtu = if jumbo { 9000 } else { 1500 };
        let sc = Scenario {
            links,
            model: LinkModel { loss, reorder, dup, ..LinkModel::default() },
            // A cut needs a second link to carry on over.
            cut: cut_at_us.filter(|_| links >= 2).map(|t| (links - 1, Duration::from_micros(t))),
            messages: 1500,
            // Large messages are fragmented over several frames.
            sizes: if big { Sizes::Uniform(8, 3 * mtu) } else { Sizes::Uniform(8, 200) },
            fence_every,
            seed,
            transport: Config { mtu, ..Config::default() },
            ..Scenario::default()
        };
        check(&sc);
    }
}

#[test]
fn issue_example_run() {
    // torus-bench transport --links 3 --loss 0.05 --reorder 0.2 --dup 0.01
    //   --messages 100000 --size 64 --fence-every 100 --seed 7
    let sc = Scenario {
        links: 3,
        model: LinkModel {
            loss: 0.05,
            reorder: 0.2,
            dup: 0.01,
            ..LinkModel::default()
        },
        messages: 100_000,
        sizes: Sizes::Fixed(64),
        fence_every: 100,
        seed: 7,
        ..Scenario::default()
    };
    let r = check(&sc);
    assert!(
        r.messages_per_frame > 10.0,
        "aggregation packs 64-byte messages: {r:?}"
    );
}

#[test]
fn extra_frames_under_ten_percent_at_one_percent_loss() {
    for seed in 1..=5 {
        for size in [64usize, 1000, 8000] {
            let sc = Scenario {
                links: 3,
                model: LinkModel {
                    loss: 0.01,
                    ..LinkModel::default()
                },
                messages: 30_000,
                sizes: Sizes::Fixed(size),
                seed,
                transport: Config {
                    mtu: if size > 1400 { 9000 } else { 1500 },
                    ..Config::default()
                },
                ..Scenario::default()
            };
            let r = check(&sc);
            assert!(
                r.extra_frames_pct < 10.0,
                "seed {seed} size {size}: {:.2}% extra frames ({r:?})",
                r.extra_frames_pct
            );
        }
    }
}

#[test]
fn stripes_evenly_and_survives_a_cut() {
    let sc = Scenario {
        links: 4,
        messages: 40_000,
        sizes: Sizes::Fixed(1000),
        ..Scenario::default()
    };
    let r = check(&sc);
    let (min, max) = (
        r.frames_per_link.iter().min().copied().unwrap_or(0),
        r.frames_per_link.iter().max().copied().unwrap_or(0),
    );
    assert!(
        max - min <= 1,
        "round robin over 4 links: {:?}",
        r.frames_per_link
    );

    let cut = Scenario {
        cut: Some((2, Duration::from_micros(500))),
        ..sc
    };
    let r = check(&cut);
    let on_cut = r.frames_per_link[2];
    assert!(
        on_cut < r.frames_per_link[0] / 4,
        "the cut link is left: {:?}",
        r.frames_per_link
    );
    assert!(r.retransmitted_frames > 0);
}

#[test]
fn short_messages_are_best_effort() {
    let sc = Scenario {
        links: 2,
        model: LinkModel {
            loss: 0.1,
            ..LinkModel::default()
        },
        reliable: false,
        messages: 20_000,
        sizes: Sizes::Fixed(100),
        ..Scenario::default()
    };
    let r = harness::run(&sc);
    assert!(r.finished);
    assert_eq!(r.duplicated + r.corrupted, 0);
    assert_eq!(r.retransmitted_frames + r.ack_frames + r.nack_frames, 0);
    // About 10% lost, none retried.
    assert!(r.lost > 1000 && r.lost < 3000, "{r:?}");
}

/// Receiver pacing: a receiver slower than the link, behind a small ring, loses frames and
/// has them sent again unless it grants its senders only the room it has; with pacing it
/// loses none, and the run is no slower.
#[test]
fn a_slow_receiver_slows_its_sender_instead_of_losing_frames() {
    for (links, size, mtu, ring, fps) in [
        (3u8, 64usize, 1500usize, 256usize, 400_000u64),
        (1, 9000, 9000, 128, 100_000),
    ] {
        let sc = |pacing: bool| Scenario {
            links,
            messages: if size > 1000 { 10_000 } else { 100_000 },
            sizes: Sizes::Fixed(size),
            transport: Config {
                mtu,
                ..Config::default()
            },
            receiver: Some(harness::RxRing {
                frames: ring,
                rate_fps: fps,
                pacing,
            }),
            ..Scenario::default()
        };
        let paced = check(&sc(true));
        let unpaced = check(&sc(false));
        assert_eq!(paced.rx_ring_drops, 0, "{paced:?}");
        assert_eq!(paced.retransmitted_frames, 0, "{paced:?}");
        assert!(paced.extra_frames_pct < 5.0, "{paced:?}");
        assert!(
            unpaced.rx_ring_drops > 0,
            "the model is slow enough to matter: {unpaced:?}"
        );
        assert!(unpaced.retransmitted_frames > 0, "{unpaced:?}");
        assert!(paced.sim_time <= unpaced.sim_time, "{paced:?}\n{unpaced:?}");
    }
}

/// Pacing and a receiver that keeps up: the grant is the whole window, and the run is the
/// same as without pacing.
#[test]
fn pacing_costs_nothing_when_the_receiver_keeps_up() {
    let sc = |pacing: bool| Scenario {
        messages: 50_000,
        receiver: Some(harness::RxRing {
            frames: 2048,
            rate_fps: 100_000_000,
            pacing,
        }),
        ..Scenario::default()
    };
    let paced = check(&sc(true));
    let plain = check(&sc(false));
    assert_eq!(paced.rx_ring_drops, 0);
    assert_eq!(paced.retransmitted_frames, 0);
    assert_eq!(paced.sim_time, plain.sim_time, "{paced:?}\n{plain:?}");
    assert_eq!(paced.data_frames, plain.data_frames);
}
