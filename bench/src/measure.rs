//! What a benchmark measures, and how it is summarised: latency percentiles (an
//! hdrhistogram) and a CDF, throughput (messages, goodput, frames per second), CPU time per
//! side.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Round-trip times of one method, microseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    /// Samples.
    pub samples: u64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
    /// 200 points of the distribution, for CDF plots.
    pub cdf: Vec<f64>,
}

impl Latency {
    /// From raw nanosecond samples.
    pub fn from_ns(samples: Vec<u64>) -> Latency {
        // Constant, valid bounds: 1 ns to 60 s at 3 significant figures.
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
        for s in &samples {
            let _ = h.record((*s).max(1));
        }
        let q = |x: f64| h.value_at_quantile(x) as f64 / 1000.0;
        Latency {
            samples: h.len(),
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            p999: q(0.999),
            max: h.max() as f64 / 1000.0,
            cdf: (0..200).map(|i| q(i as f64 / 199.0)).collect(),
        }
    }
}

/// One-way throughput of one method.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Throughput {
    /// Messages delivered.
    pub messages: u64,
    /// Payload bytes delivered.
    pub bytes: u64,
    /// Frames on the wire (data frames for torusd).
    pub frames: u64,
    /// Seconds from the first to the last delivery.
    pub seconds: f64,
    /// Messages per second.
    pub messages_per_s: f64,
    /// Goodput, Gb/s.
    pub goodput_gbps: f64,
    /// Frames per second.
    pub frames_per_s: f64,
    /// Sender CPU seconds.
    pub cpu_tx_s: f64,
    /// Receiver CPU seconds.
    pub cpu_rx_s: f64,
    /// Sender + receiver CPU nanoseconds per message.
    pub cpu_ns_per_message: f64,
    /// Messages the sender offered (for lossy methods).
    pub offered: u64,
}

impl Throughput {
    /// From counts over a span, with the CPU time of each side.
    pub fn new(
        messages: u64,
        bytes: u64,
        frames: u64,
        span: Duration,
        cpu_tx: Duration,
        cpu_rx: Duration,
    ) -> Throughput {
        let s = span.as_secs_f64().max(1e-9);
        Throughput {
            messages,
            bytes,
            frames,
            seconds: span.as_secs_f64(),
            messages_per_s: messages as f64 / s,
            goodput_gbps: bytes as f64 * 8.0 / s / 1e9,
            frames_per_s: frames as f64 / s,
            cpu_tx_s: cpu_tx.as_secs_f64(),
            cpu_rx_s: cpu_rx.as_secs_f64(),
            cpu_ns_per_message: (cpu_tx + cpu_rx).as_nanos() as f64 / messages.max(1) as f64,
            offered: messages,
        }
    }

    /// Records how many messages the sender offered.
    pub fn with_offered(mut self, offered: u64) -> Throughput {
        self.offered = offered;
        self
    }
}

/// CPU time the calling thread has used.
pub fn thread_cpu() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD on the calling thread.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time process `pid` has used (user + system), from /proc; zero once it is gone.
pub fn process_cpu(pid: u32) -> Duration {
    torusnet_ops::process::cpu_time(pid).unwrap_or_default()
}
