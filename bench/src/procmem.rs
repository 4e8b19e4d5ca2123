//! This process's memory as the kernel counts it (`/proc/self/status`), for the memory
//! figures of simulator runs: resident now, and the peak since the last reset.

/// A `/proc/self/status` field in KiB (0 when unreadable: a figure, not a failure).
fn status_kib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0.0)
}

/// Resident memory now, KiB.
pub fn rss_kib() -> f64 {
    status_kib("VmRSS:")
}

/// Peak resident memory since [`reset_peak`] (or since the process started), MiB.
pub fn peak_mib() -> f64 {
    status_kib("VmHWM:") / 1024.0
}

/// Starts a new peak: the kernel sets the high-water mark back to the current resident
/// size (`clear_refs` value 5), so each run of a sweep reports its own peak.
pub fn reset_peak() {
    // Without it (an old kernel), the peak is the process's so far, still an upper bound.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}
