//! `torus-bench sim incast`: many servers send to one at once (a gather, an aggregation
//! root, a shuffle's reducer), on the simulator, with the congestion controller on and off:
//! the aggregate goodput against the receiver's links' capacity, retransmitted frames, and
//! completion times against the ideal (all the bytes through the receiver's links).

use std::time::Duration;

use serde_json::{json, Value};
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::sim::Sim;
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::SendError;

use super::harness::{cfg, threads_for};

/// The service the incast's messages are for.
const SERVICE: u16 = 11;

/// One incast run's setting.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setting {
    /// Torus size k (k x k x k).
    pub k: u16,
    /// Servers sending.
    pub senders: usize,
    /// Bytes each sends.
    pub bytes: u64,
    /// Message size.
    pub size: usize,
    /// The congestion controller on.
    pub congestion: bool,
    /// The transport's least retransmission timeout (both ways alike).
    pub min_rto: Duration,
    /// Simulated time at most.
    pub limit: Duration,
    /// Which servers send.
    pub seed: u64,
    /// Threads.
    pub threads: Option<usize>,
}

/// Runs one incast: every sender sends its bytes to (0,0,0), as fast as its queue takes
/// them; the result as JSON.
pub(crate) fn incast(s: &Setting) -> Result<Value, String> {
    let mut c = cfg(s.k, true)?;
    c.transport.congestion.on = s.congestion;
    c.transport.min_rto = s.min_rto;
    let n = c.dims.count() as usize;
    let rate = c.rate_bps;
    let mut sim = Sim::with_threads(c, threads_for(s.threads, s.k))?;
    let rx = 0usize;
    let to = Target::Server(Coord::new(0, 0, 0));
    let mut rng = SplitMix64::new(s.seed);
    let mut others: Vec<usize> = (1..n).collect();
    for i in (1..others.len()).rev() {
        others.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let senders: Vec<usize> = others.into_iter().take(s.senders.min(n - 1)).collect();
    let msg = vec![7u8; s.size];
    let opts = MsgOptions {
        reliable: true,
        ..MsgOptions::default()
    };
    let per = s.bytes.div_ceil(s.size as u64);
    let mut left = vec![per; n];
    let mut got = vec![0u64; n];
    let mut done: Vec<Option<Time>> = vec![None; n];
    let mut remaining = senders.len();
    let start = sim.now();
    let tick = Duration::from_micros(50);
    let mut now = start;
    while remaining > 0 && now.since(start) < s.limit {
        for &i in &senders {
            while left[i] > 0 {
                match sim.send(i, to, SERVICE, &msg, opts) {
                    Ok(()) => left[i] -= 1,
                    Err(SendError::WouldBlock) => break,
                    Err(e) => return Err(format!("server {i}: {e}")),
                }
            }
        }
        now = now + tick;
        sim.run_until(now, |t, at, e| {
            if let (
                true,
                Event::Message {
                    src,
                    service: SERVICE,
                    data,
                    ..
                },
            ) = (at == rx, e)
            {
                let from = sim_index(*src, s.k);
                got[from] += data.len() as u64;
                if got[from] >= per * s.size as u64 && done[from].is_none() {
                    done[from] = Some(t);
                    remaining -= 1;
                }
            }
        });
    }
    report(&sim, s, &senders, &done, start, rate)
}

/// The dense index of `c` in a k x k x k torus.
fn sim_index(c: Coord, k: u16) -> usize {
    let k = usize::from(k);
    (usize::from(c.z) * k + usize::from(c.y)) * k + usize::from(c.x)
}

fn report(
    sim: &Sim,
    s: &Setting,
    senders: &[usize],
    done: &[Option<Time>],
    start: Time,
    rate: u64,
) -> Result<Value, String> {
    let mut times: Vec<f64> = senders
        .iter()
        .filter_map(|&i| done[i].map(|t| t.since(start).as_secs_f64() * 1e3))
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    let finished = times.len();
    let total = (senders.len() as u64 * s.bytes.div_ceil(s.size as u64) * s.size as u64) as f64;
    // Six links into the receiver at the line rate.
    let capacity = 6.0 * rate as f64;
    let ideal_ms = total * 8.0 / capacity * 1e3;
    let last = times.last().copied().unwrap_or(f64::NAN);
    let p99 = times
        .get((times.len() * 99).div_ceil(100).saturating_sub(1))
        .copied()
        .unwrap_or(f64::NAN);
    let (mut data, mut retx) = (0u64, 0u64);
    for &i in senders {
        let t = sim.node(i).transport_stats();
        data += t.data_frames;
        retx += t.retransmitted_frames;
    }
    let st = sim.stats();
    let r = sim.node(0).transport_stats();
    Ok(json!({
        "k": s.k,
        "senders": senders.len(),
        "bytes_each": s.bytes,
        "message_bytes": s.size,
        "congestion": s.congestion,
        "finished": finished,
        "ideal_ms": ideal_ms,
        "last_ms": last,
        "p50_ms": times.get(times.len() / 2).copied().unwrap_or(f64::NAN),
        "p99_ms": p99,
        "p99_over_ideal": p99 / ideal_ms,
        "goodput_over_capacity": if finished == senders.len() { ideal_ms / last } else { f64::NAN },
        "data_frames": data,
        "retransmitted_frames": retx,
        "retransmitted_pct": 100.0 * retx as f64 / data.max(1) as f64,
        "dropped_no_room": st.dropped_no_room,
        "receiver_nacks": r.nack_frames,
        "receiver_duplicates": r.duplicate_frames,
        "receiver_out_of_order": r.out_of_order_frames,
    }))
}
