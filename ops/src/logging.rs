//! Logs of the daemons: `tracing` events with structured fields (server, link, peer), a
//! level filter in `RUST_LOG` syntax set by `--log-level`, `RUST_LOG`, or at run time through
//! the management socket, and output that suits journald under systemd (no timestamps or
//! colours: the journal adds its own) and people on a terminal otherwise.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot_free::Mutex;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter, Registry};

/// `std::sync::Mutex` without poisoning worries (a panic while logging must not stop logs).
mod parking_lot_free {
    pub struct Mutex<T>(std::sync::Mutex<T>);
    impl<T> Mutex<T> {
        pub const fn new(t: T) -> Self {
            Mutex(std::sync::Mutex::new(t))
        }
        pub fn lock(&self) -> std::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|p| p.into_inner())
        }
    }
}

/// The level used when neither `--log-level` nor `RUST_LOG` says.
pub const DEFAULT_LEVEL: &str = "info";

struct Handle {
    reload: reload::Handle<EnvFilter, Registry>,
    current: Mutex<String>,
}

static HANDLE: OnceLock<Handle> = OnceLock::new();

/// Parses a filter (`info`, `debug`, `torusnet_dataplane=debug,warn`, ...), with a clear error.
pub fn parse_filter(spec: &str) -> Result<EnvFilter, String> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err("an empty log level (try error, warn, info, debug or trace)".into());
    }
    EnvFilter::try_new(spec).map_err(|e| format!("log level '{spec}': {e}"))
}

/// Whether stderr goes to the journal (systemd sets `JOURNAL_STREAM` for the units' output).
fn under_journald() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some()
}

/// Installs the process's logger: `level` (from `--log-level`) over `RUST_LOG` over
/// [`DEFAULT_LEVEL`]. A second call changes nothing and succeeds.
pub fn init(level: Option<&str>) -> Result<(), String> {
    let spec = match level {
        Some(l) => l.to_string(),
        None => std::env::var("RUST_LOG")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_LEVEL.to_string()),
    };
    let filter = parse_filter(&spec)?;
    if HANDLE.get().is_some() {
        return Ok(());
    }
    let (filter, reload) = reload::Layer::new(filter);
    let journald = under_journald();
    // SAFETY: isatty only reads the descriptor's state.
    let tty = unsafe { libc::isatty(2) } == 1;
    let layer = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(tty && !journald)
        .with_target(false);
    let registry = tracing_subscriber::registry().with(filter);
    let installed = if journald {
        registry.with(layer.without_time()).try_init()
    } else {
        registry.with(layer).try_init()
    };
    if installed.is_ok() {
        let _ = HANDLE.set(Handle {
            reload,
            current: Mutex::new(spec),
        });
    }
    Ok(())
}

/// Changes the level of a running process; returns the new filter as written.
pub fn set_level(spec: &str) -> Result<String, String> {
    let filter = parse_filter(spec)?;
    let h = HANDLE
        .get()
        .ok_or("logging is not set up in this process")?;
    h.reload
        .reload(filter)
        .map_err(|e| format!("cannot change the log level: {e}"))?;
    let spec = spec.trim().to_string();
    *h.current.lock() = spec.clone();
    tracing::info!(level = %spec, "log level changed");
    Ok(spec)
}

/// The level in force (`None`: logging not set up).
pub fn level() -> Option<String> {
    HANDLE.get().map(|h| h.current.lock().clone())
}

/// At most `burst` events per key per `period`; what it holds back is counted and reported
/// with the next event let through, so a flood of bad frames costs a line every period, not
/// a disk.
#[derive(Debug)]
pub struct RateLimit {
    period: Duration,
    burst: u32,
    keys: HashMap<String, (Instant, u32, u64)>,
}

impl RateLimit {
    /// `burst` events per `period` per key.
    pub fn new(period: Duration, burst: u32) -> RateLimit {
        RateLimit {
            period,
            burst: burst.max(1),
            keys: HashMap::new(),
        }
    }

    /// Whether an event for `key` at `now` may be logged: `Some(suppressed since the last
    /// one let through)`, or `None` (count it and stay quiet).
    pub fn allow(&mut self, key: &str, now: Instant) -> Option<u64> {
        if self.keys.len() > 4096 && !self.keys.contains_key(key) {
            // Keys come from bounded sets (links, causes); a flood of new ones is dropped.
            return None;
        }
        let e = self.keys.entry(key.to_string()).or_insert((now, 0, 0));
        if now.duration_since(e.0) >= self.period {
            e.0 = now;
            e.1 = 0;
        }
        if e.1 < self.burst {
            e.1 += 1;
            let held = e.2;
            e.2 = 0;
            Some(held)
        } else {
            e.2 += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_or_say_why() {
        assert!(parse_filter("debug").is_ok());
        assert!(parse_filter("torusnet_dataplane=trace,warn").is_ok());
        assert!(parse_filter("").is_err());
        assert!(parse_filter("loud=[[").is_err());
    }

    #[test]
    fn a_flood_costs_a_line_per_period() {
        let mut r = RateLimit::new(Duration::from_secs(10), 2);
        let t = Instant::now();
        assert_eq!(r.allow("bad frame +x", t), Some(0));
        assert_eq!(r.allow("bad frame +x", t), Some(0));
        for _ in 0..1000 {
            assert_eq!(r.allow("bad frame +x", t), None);
        }
        assert_eq!(r.allow("bad frame -x", t), Some(0), "keys are separate");
        assert_eq!(
            r.allow("bad frame +x", t + Duration::from_secs(11)),
            Some(1000)
        );
    }

    #[test]
    fn levels_change_at_run_time() {
        init(Some("warn")).expect("init");
        assert_eq!(level().as_deref(), Some("warn"));
        assert_eq!(set_level("debug").as_deref(), Ok("debug"));
        assert!(tracing::enabled!(tracing::Level::DEBUG));
        assert!(set_level("nonsense=[").is_err());
        assert_eq!(
            level().as_deref(),
            Some("debug"),
            "a bad level changes nothing"
        );
        set_level("warn").expect("back");
        assert!(!tracing::enabled!(tracing::Level::DEBUG));
    }
}
