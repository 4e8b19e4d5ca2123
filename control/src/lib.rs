//! The torusnet control side: the control process (`torusctl daemon`), the offline queries
//! behind `torusctl key` / `torusctl route`, and the clients of the daemons' sockets.

pub mod daemon;
pub mod dpclient;
pub mod query;
