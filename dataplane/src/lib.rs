//! The torusnet dataplane: the XDP program that steers torus frames into AF_XDP sockets,
//! and (as it grows) the sockets, pollers and runtime of `torusd`.

pub mod apps;
pub mod carrier;
pub mod cluster;
pub mod config;
pub mod counters;
pub mod fill_depth;
pub mod ip;
pub mod kvgw;
pub mod linkload;
pub mod loader;
pub mod metrics;
pub mod mgmt;
pub mod netns;
pub mod poller;
pub mod rmem;
pub mod runtime;
pub mod transit;
mod tx_path;
pub mod watch;
pub mod xdp_object;
pub mod xsk;
