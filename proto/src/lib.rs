//! The sans-IO core of torusnet.
//!
//! Everything here decides something and does no I/O: no syscalls, no threads, no clock of
//! its own. Time comes in as an argument and frames come in as bytes, so the same code runs
//! under the AF_XDP dataplane, the in-memory test links, the simulator and the fuzzers.
#![warn(missing_docs)]

mod byte_run;
pub mod control;
pub mod fuzz;
pub mod harness;
pub mod keyspace;
pub mod node;
pub mod rng;
pub mod routing;
pub mod service;
pub mod sim;
pub mod time;
pub mod topology;
pub mod transport;
pub mod trees;
pub mod wire;

pub use keyspace::{Key, KeyPlacement};
pub use routing::{LinkView, RouteTable};
pub use topology::{Axis, Coord, Dims, Dir, DirSet};
