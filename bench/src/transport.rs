//! `torus-bench transport`: the transport core over the deterministic lossy multi-link
//! harness, one JSON object per run (see proto/src/harness.rs).

use std::time::Duration;

use serde::Serialize;
use torusnet_proto::harness::{self, LinkModel, RxRing, Scenario, Sizes};
use torusnet_proto::transport::Config;

/// Options of `torus-bench transport`.
#[derive(clap::Args)]
pub struct Args {
    /// Links between the two servers (1..=8).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=8))]
    links: u8,
    /// Probability a frame is lost.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    loss: f64,
    /// Probability a frame is delayed so later frames overtake it.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    reorder: f64,
    /// Probability a frame arrives twice.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    dup: f64,
    /// Propagation delay per link, microseconds.
    #[arg(long, default_value_t = 5)]
    delay_us: u64,
    /// Line rate per link, Gb/s.
    #[arg(long, default_value_t = 10.0)]
    rate_gbps: f64,
    /// Cut a link at a time: LINK@MILLISECONDS, e.g. 1@2.
    #[arg(long, value_parser = parse_cut)]
    cut: Option<(u8, u64)>,
    /// Messages to send.
    #[arg(long, default_value_t = 100_000)]
    messages: u64,
    /// Message size in bytes (at least 8), or LO-HI for uniform sizes.
    #[arg(long, default_value = "64", value_parser = parse_sizes)]
    size: Sizes,
    /// Fence every n-th message (backward; forward at offset n/2); 0: none.
    #[arg(long, default_value_t = 0)]
    fence_every: u64,
    /// Send short (unreliable) messages instead of reliable ones.
    #[arg(long)]
    short: bool,
    /// Link MTU (1500 or 9000).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u16).range(200..=9000))]
    mtu: u16,
    /// Window in frames.
    #[arg(long, default_value_t = Config::default().window, value_parser = clap::value_parser!(u32).range(1..=65536))]
    window: u32,
    /// Turn aggregation off.
    #[arg(long)]
    no_aggregation: bool,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The receiver takes frames from a ring of this many frames at its own speed
    /// (`--rx-rate-fps`); frames that find it full are lost.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    rx_ring: Option<u32>,
    /// Frames per second the receiver takes from its ring (with `--rx-ring`).
    #[arg(long, default_value_t = 500_000, value_parser = clap::value_parser!(u64).range(1..))]
    rx_rate_fps: u64,
    /// The receiver does not state its room to its transport (no receiver pacing).
    #[arg(long)]
    no_pacing: bool,
}

fn probability(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|_| format!("not a number: {s}"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("a probability is between 0 and 1, got {p}"))
    }
}

fn parse_cut(s: &str) -> Result<(u8, u64), String> {
    let (l, t) = s
        .split_once('@')
        .ok_or("expected LINK@MILLISECONDS, e.g. 1@2")?;
    let l: u8 = l.parse().map_err(|_| format!("bad link {l:?}"))?;
    let t: u64 = t.parse().map_err(|_| format!("bad time {t:?}"))?;
    Ok((l, t))
}

fn parse_sizes(s: &str) -> Result<Sizes, String> {
    let num = |x: &str| x.parse::<usize>().map_err(|_| format!("bad size {x:?}"));
    match s.split_once('-') {
        Some((lo, hi)) => {
            let (lo, hi) = (num(lo)?, num(hi)?);
            if lo < 8 || hi < lo {
                return Err("sizes are LO-HI with 8 <= LO <= HI".into());
            }
            Ok(Sizes::Uniform(lo, hi))
        }
        None => {
            let n = num(s)?;
            if n < 8 {
                return Err("messages carry an 8-byte number: size at least 8".into());
            }
            Ok(Sizes::Fixed(n))
        }
    }
}

#[derive(Serialize)]
struct Out {
    delivered: u64,
    lost: u64,
    duplicated: u64,
    corrupted: u64,
    fence_violations: u64,
    out_of_order_unfenced: u64,
    data_frames: u64,
    retransmitted_frames: u64,
    ack_frames: u64,
    nack_frames: u64,
    short_frames: u64,
    messages_per_frame: f64,
    extra_frames_pct: f64,
    out_of_order_frames_pct: f64,
    frames_per_link: Vec<u64>,
    sim_time_us: f64,
    goodput_gbps: f64,
    finished: bool,
    rx_ring_drops: u64,
}

/// Builds the scenario the options describe.
pub fn scenario(a: &Args) -> Result<Scenario, String> {
    if let Some((l, _)) = a.cut {
        if l >= a.links {
            return Err(format!(
                "--cut names link {l}, but there are {} links (0..{})",
                a.links, a.links
            ));
        }
    }
    Ok(Scenario {
        links: a.links,
        model: LinkModel {
            loss: a.loss,
            reorder: a.reorder,
            dup: a.dup,
            delay: Duration::from_micros(a.delay_us),
            rate_bps: (a.rate_gbps * 1e9) as u64,
            ..LinkModel::default()
        },
        cut: a.cut.map(|(l, ms)| (l, Duration::from_millis(ms))),
        messages: a.messages,
        sizes: a.size,
        fence_every: a.fence_every,
        reliable: !a.short,
        seed: a.seed,
        transport: Config {
            mtu: usize::from(a.mtu),
            window: a.window,
            aggregate: !a.no_aggregation,
            ..Config::default()
        },
        receiver: a.rx_ring.map(|frames| RxRing {
            frames: frames as usize,
            rate_fps: a.rx_rate_fps,
            pacing: !a.no_pacing,
        }),
        ..Scenario::default()
    })
}

pub fn run(a: &Args) -> Result<(), String> {
    let r = harness::run(&scenario(a)?);
    let out = Out {
        delivered: r.delivered,
        lost: r.lost,
        duplicated: r.duplicated,
        corrupted: r.corrupted,
        fence_violations: r.fence_violations,
        out_of_order_unfenced: r.out_of_order_unfenced,
        data_frames: r.data_frames,
        retransmitted_frames: r.retransmitted_frames,
        ack_frames: r.ack_frames,
        nack_frames: r.nack_frames,
        short_frames: r.short_frames,
        messages_per_frame: round(r.messages_per_frame),
        extra_frames_pct: round(r.extra_frames_pct),
        out_of_order_frames_pct: round(r.out_of_order_frames_pct),
        frames_per_link: r.frames_per_link,
        sim_time_us: round(r.sim_time.as_nanos() as f64 / 1000.0),
        goodput_gbps: round(r.goodput_gbps),
        finished: r.finished,
        rx_ring_drops: r.rx_ring_drops,
    };
    println!(
        "{}",
        serde_json::to_string(&out).map_err(|e| e.to_string())?
    );
    Ok(())
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
