//! Services that run beside the torusnet engine, each a sans-IO state machine implementing
//! [`torusnet_proto::service::Service`]: torusd hosts them in its pollers, and tests drive
//! them over in-memory engines.
//!
//! - [`builtin`]: `ping` (echo and RTT), `bench` (a checked bulk transfer), `keys` (key-routed
//!   probes counted where they land) and `load` (checked reliable traffic to changing peers,
//!   journalled for an oracle).
//! - [`kv`]: a replicated key-value store with hot-key cache servers, on the key space, and
//!   the memcached protocol its gateways speak.
//! - [`aggregate`]: Camdoop's on-path aggregation up the same trees.
//! - [`multicast`]: CamCube's file distribution over one spanning tree per link direction.
//! - [`names`]: the directory of service names on the key space (where an application's
//!   service runs, for applications attached from their own processes).
#![warn(missing_docs)]

pub mod aggregate;
pub mod builtin;
pub mod kv;
pub mod multicast;
pub mod names;
/// The services' test network, public because fuzz bodies (`names::check_untrusted`) run a
/// service on it too.
pub mod testnet;
