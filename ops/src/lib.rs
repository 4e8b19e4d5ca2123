//! What operators plug torusnet's daemons into: [`logging`] (tracing with levels, filters,
//! structured fields, rate limits, journald-friendly output), [`metrics`] (Prometheus
//! text exposition over a small HTTP endpoint), [`process`] (a process's CPU time) and
//! [`socket`] (management sockets only their owner may use).
#![warn(missing_docs)]

pub mod logging;
pub mod metrics;
pub mod process;
pub mod socket;
