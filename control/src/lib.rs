//! The torusnet control side: the control process (`torusctl daemon`), the offline queries
//! behind `torusctl key` / `torusctl route`, and the clients of the daemons' sockets.
#![warn(missing_docs)]

pub mod daemon;
pub mod doctor;
pub mod dpclient;
pub mod human;
pub mod metrics;
pub mod plan;
pub mod query;
