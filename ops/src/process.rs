//! What a process has used: its CPU time, read from /proc (behind the benchmarks' CPU cost
//! per message and the tests that check an idle daemon sleeps), and its memory as the kernel
//! and the allocator see it (behind the soaks' check that nothing grows).

use std::time::Duration;

/// CPU time process `pid` has used so far (user and system, all threads); `None` when it
/// cannot be read (the process is gone). Read from the process's CPU-time clock
/// (`clock_getcpuclockid`), to the nanosecond; `/proc/PID/stat`, in clock ticks (10 ms),
/// when that clock cannot be had.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    clock_time(pid).or_else(|| stat_time(pid))
}

fn clock_time(pid: u32) -> Option<Duration> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: writes one clockid_t into `clock`.
    if unsafe { libc::clock_getcpuclockid(pid, &mut clock) } != 0 {
        return None;
    }
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: reads the clock into our timespec.
    if unsafe { libc::clock_gettime(clock, &mut t) } != 0 {
        return None;
    }
    Some(Duration::new(
        u64::try_from(t.tv_sec).ok()?,
        u32::try_from(t.tv_nsec).ok()?,
    ))
}

fn stat_time(pid: u32) -> Option<Duration> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok());
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    // utime and stime are fields 14 and 15 of the line, 11 and 12 counted from the state.
    let t = ticks(11)? + ticks(12)?;
    Some(Duration::from_nanos(t * 1_000_000_000 / hz))
}

/// This process's memory: what the kernel keeps resident, and what the allocator (glibc's
/// malloc, every arena) lends to the program and holds without lending. Resident memory can
/// grow while the program's own use does not: freed blocks stay in the allocator's arenas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident set size, KiB (/proc/self/status VmRSS).
    pub rss_kib: u64,
    /// Bytes the program has allocated and not freed.
    pub heap_in_use: u64,
    /// Bytes the allocator has from the system, lent or not.
    pub heap_held: u64,
}

impl Memory {
    /// As JSON, for the management socket.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "rss_kib": self.rss_kib,
            "heap_in_use": self.heap_in_use,
            "heap_held": self.heap_held,
        })
    }
}

/// This process's memory now ([`Memory`]); the allocator's figures are 0 where it is not
/// glibc's.
pub fn memory() -> Memory {
    let rss_kib = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0);
    let (heap_in_use, heap_held) = heap();
    Memory {
        rss_kib,
        heap_in_use,
        heap_held,
    }
}

#[cfg(target_env = "gnu")]
fn heap() -> (u64, u64) {
    // SAFETY: mallinfo2 only reads the allocator's statistics (under its arenas' locks).
    let m = unsafe { libc::mallinfo2() };
    let mapped = m.hblkhd as u64;
    (m.uordblks as u64 + mapped, m.arena as u64 + mapped)
}

#[cfg(not(target_env = "gnu"))]
fn heap() -> (u64, u64) {
    (0, 0)
}

/// Gives the allocator's free memory back to the system where it can (glibc's
/// `malloc_trim`); whether any was released.
pub fn trim() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim has no preconditions.
        unsafe { libc::malloc_trim(0) != 0 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_used_some_cpu_and_a_missing_one_none() {
        let spin = (0..5_000_000u64).fold(0u64, |a, x| a.wrapping_add(x * x));
        assert!(spin > 0);
        assert!(cpu_time(std::process::id()).is_some());
        assert_eq!(cpu_time(u32::MAX), None);
    }

    #[test]
    fn cpu_time_reads_finely_and_agrees_with_the_ticks() {
        let me = std::process::id();
        let a = cpu_time(me).expect("own clock");
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let b = cpu_time(me).expect("own clock");
        assert!(b > a, "{a:?} -> {b:?}");
        // The ticks count the same time, to a tick or two.
        let ticks = stat_time(me).expect("stat");
        let slack = Duration::from_millis(50);
        assert!(
            ticks <= b + slack && b <= ticks + slack,
            "{ticks:?} vs {b:?}"
        );
    }

    #[test]
    fn memory_in_use_follows_what_the_program_holds() {
        let before = memory();
        assert!(before.rss_kib > 0);
        let block: Vec<u8> = vec![7; 64 << 20];
        let during = memory();
        assert!(
            during.heap_in_use >= before.heap_in_use + (60 << 20),
            "{before:?} -> {during:?}"
        );
        assert!(during.heap_held >= during.heap_in_use);
        drop(std::hint::black_box(block));
        let after = memory();
        assert!(
            after.heap_in_use + (60 << 20) <= during.heap_in_use,
            "{during:?} -> {after:?}"
        );
        let _ = trim();
    }
}
