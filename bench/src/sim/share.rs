//! `torus-bench sim share`: services sharing one link by weight (CamCube's fair queuing),
//! on the simulator. Two places a link is shared:
//! - at its sender: three services on one server send to its neighbour; the server's
//!   per-service queues take turns by weight;
//! - in transit: three servers in a row send to a fourth (each a service of its own), so the
//!   last link carries two servers' frames forwarded and one's own: the forwarder keeps no
//!   queue per service, and the senders' congestion controllers, whose additive steps grow
//!   with their services' weights, split it.
//!
//! Each service keeps its queue full for the whole run; the shares are of the bytes its
//! receiver took after a warm-up, with the controller off and on.

use std::time::Duration;

use serde_json::{json, Value};
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::sim::Sim;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::SendError;

use super::harness::cfg;

/// Options of `torus-bench sim share`.
#[derive(clap::Args)]
pub struct Args {
    /// Weights of the three services, comma-separated; several sets with `;`.
    #[arg(long, default_value = "1,1,1;2,1,1")]
    weights: String,
    /// Simulated milliseconds per run (the first quarter is warm-up).
    #[arg(long, default_value_t = 200.0)]
    ms: f64,
    /// Message size.
    #[arg(long, default_value_t = 65536)]
    size: usize,
    /// Link rate, Gb/s.
    #[arg(long, default_value_t = 10.0)]
    gbps: f64,
    /// Run only with the controller on (or off).
    #[arg(long, value_parser = ["on", "off", "both"], default_value = "both")]
    congestion: String,
    /// Print one JSON array.
    #[arg(long)]
    json: bool,
}

/// Where the three services share their link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// On one server, to its neighbour.
    Sender,
    /// Three servers in a row to a fourth: the last link carries forwarded frames.
    Transit,
}

/// The services of the three flows.
const SERVICES: [u16; 3] = [21, 22, 23];

/// One run: three flows of the given weights share a link placed at `place`; each flow's
/// share of the bytes received after the warm-up, and the link's use.
pub(crate) fn share(
    place: Place,
    weights: [u32; 3],
    congestion: bool,
    run: Duration,
    size: usize,
    gbps: f64,
) -> Result<Value, String> {
    // 8 x 8 x 8: three hops along x have one shortest path, so the flows meet on one link.
    let mut c = cfg(8, true)?;
    c.transport.congestion.on = congestion;
    c.rate_bps = (gbps * 1e9) as u64;
    let rate = c.rate_bps;
    let mut sim = Sim::with_threads(c, 1)?;
    // Servers on the row y = z = 0: server (x, 0, 0) is index x.
    let (senders, rx): ([usize; 3], Coord) = match place {
        Place::Sender => ([0; 3], Coord::new(1, 0, 0)),
        Place::Transit => ([0, 1, 2], Coord::new(3, 0, 0)),
    };
    let rx_i = usize::from(rx.x);
    for (k, &s) in senders.iter().enumerate() {
        sim.node_mut(s)
            .configure_service(SERVICES[k], weights[k], 1 << 20);
    }
    let msg = vec![7u8; size];
    let opts = MsgOptions {
        reliable: true,
        ..MsgOptions::default()
    };
    let mut got = [0u64; 3];
    let start = sim.now();
    let warm = start + run / 4;
    let tick = Duration::from_micros(50);
    let mut now = start;
    while now.since(start) < run {
        for (k, &s) in senders.iter().enumerate() {
            loop {
                match sim.send(s, Target::Server(rx), SERVICES[k], &msg, opts) {
                    Ok(()) => {}
                    Err(SendError::WouldBlock) => break,
                    Err(e) => return Err(format!("service {}: {e}", SERVICES[k])),
                }
            }
        }
        now = now + tick;
        sim.run_until(now, |t, at, e| {
            if let (true, Event::Message { service, data, .. }) = (at == rx_i, e) {
                if let Some(k) = SERVICES.iter().position(|s| s == service) {
                    if t >= warm {
                        got[k] += data.len() as u64;
                    }
                }
            }
        });
    }
    let total: u64 = got.iter().sum();
    let seconds = now.since(warm).as_secs_f64();
    let wsum: u32 = weights.iter().sum();
    let shares: Vec<f64> = got
        .iter()
        .map(|&g| g as f64 / total.max(1) as f64)
        .collect();
    let fair: Vec<f64> = weights
        .iter()
        .map(|&w| f64::from(w) / f64::from(wsum))
        .collect();
    let off_by = shares
        .iter()
        .zip(&fair)
        .map(|(s, f)| (s - f).abs() * 100.0)
        .fold(0.0, f64::max);
    let mut retx = 0;
    for &s in &senders {
        retx += sim.node(s).transport_stats().retransmitted_frames;
    }
    Ok(json!({
        "place": match place { Place::Sender => "sender", Place::Transit => "transit" },
        "weights": weights,
        "congestion": congestion,
        "shares": shares,
        "fair_shares": fair,
        "worst_points_off": off_by,
        "link_use": total as f64 * 8.0 / seconds / rate as f64,
        "retransmitted_frames": retx,
    }))
}

fn weights(s: &str) -> Result<Vec<[u32; 3]>, String> {
    s.split(';')
        .map(|set| {
            let w: Vec<u32> = set
                .split(',')
                .map(|x| x.trim().parse::<u32>())
                .collect::<Result<_, _>>()
                .map_err(|e| format!("--weights {set:?}: {e}"))?;
            match w.as_slice() {
                &[a, b, c] if a > 0 && b > 0 && c > 0 => Ok([a, b, c]),
                _ => Err(format!("--weights {set:?}: three weights from 1 up")),
            }
        })
        .collect()
}

/// Runs the experiment: every weight set at both places, the controller off and on.
pub fn run(a: &Args) -> Result<(), String> {
    if !(a.ms > 0.0 && a.ms.is_finite()) {
        return Err(format!("--ms must be a positive number, not {}", a.ms));
    }
    if !(a.gbps >= 0.001 && a.gbps <= 1000.0) {
        return Err(format!("--gbps must be 0.001..1000, not {}", a.gbps));
    }
    let modes: &[bool] = match a.congestion.as_str() {
        "on" => &[true],
        "off" => &[false],
        _ => &[false, true],
    };
    let run = Duration::from_secs_f64(a.ms / 1e3);
    let mut rows = Vec::new();
    for w in weights(&a.weights)? {
        for place in [Place::Sender, Place::Transit] {
            for &on in modes {
                let v = share(place, w, on, run, a.size.max(1), a.gbps)?;
                if !a.json {
                    let shares: Vec<String> = v["shares"]
                        .as_array()
                        .map(|s| {
                            s.iter()
                                .map(|x| format!("{:.1}%", x.as_f64().unwrap_or(f64::NAN) * 100.0))
                                .collect()
                        })
                        .unwrap_or_default();
                    println!(
                        "weights {:?} at the {:<7} controller {:<3}: shares {} (worst {:.1} points off), link {:.2} used, {} retransmitted",
                        w,
                        v["place"].as_str().unwrap_or(""),
                        if on { "on" } else { "off" },
                        shares.join(" "),
                        v["worst_points_off"].as_f64().unwrap_or(f64::NAN),
                        v["link_use"].as_f64().unwrap_or(f64::NAN),
                        v["retransmitted_frames"],
                    );
                }
                rows.push(v);
            }
        }
    }
    if a.json {
        println!("{}", Value::Array(rows));
    }
    Ok(())
}
