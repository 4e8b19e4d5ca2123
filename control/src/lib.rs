//! The torusnet control side: the offline queries behind `torusctl key` / `torusctl route`
//! (and, later, the control process that bootstraps coordinates and runs link state).

pub mod dpclient;
pub mod query;
