//! What a process has used, read from /proc: the CPU time behind the benchmarks' CPU cost per
//! message and the tests that check an idle daemon sleeps.

use std::time::Duration;

/// CPU time process `pid` has used so far (user and system, all threads); `None` when it
/// cannot be read (the process is gone).
pub fn cpu_time(pid: u32) -> Option<Duration> {
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
}
