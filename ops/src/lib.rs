//! What operators plug torusnet's daemons into: [`logging`] (tracing with levels, filters,
//! structured fields, rate limits, journald-friendly output) and [`metrics`] (Prometheus
//! text exposition over a small HTTP endpoint), and [`process`] (a process's CPU time).

pub mod logging;
pub mod metrics;
pub mod process;
