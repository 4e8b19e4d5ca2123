//! What operators plug torusnet's daemons into: [`logging`] (tracing with levels, filters,
//! structured fields, rate limits, journald-friendly output) and [`metrics`] (Prometheus
//! text exposition over a small HTTP endpoint).

pub mod logging;
pub mod metrics;
