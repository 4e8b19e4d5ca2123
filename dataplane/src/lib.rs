//! The torusnet dataplane: the XDP program that steers torus frames into AF_XDP sockets,
//! the sockets, the pollers that move frames between them and the protocol engine, and
//! the runtime of `torusd` (its layout: ARCHITECTURE.md at the repository's root).
#![warn(missing_docs)]

pub mod apps;
pub mod carrier;
pub mod cluster;
pub mod config;
pub mod counters;
pub mod fault;
pub mod fill_depth;
pub mod ip;
pub mod kvgw;
pub mod linkload;
pub mod loader;
pub mod metrics;
pub mod mgmt;
pub mod netns;
pub mod nic_stats;
pub mod poller;
pub mod port;
pub mod rmem;
pub mod runtime;
pub mod shared;
pub mod status;
pub mod transit;
mod transmit;
pub mod watch;
pub mod weights;
pub mod xdp_object;
pub mod xdp_transit;
pub mod xsk;
