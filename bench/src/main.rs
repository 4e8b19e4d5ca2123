//! `torus-bench`: micro-benchmarks of torusnet, each reported against a baseline measured
//! in the same run.

use clap::{Parser, Subcommand};

mod route;
mod rtt;
mod transport;
mod transport_cost;

#[derive(Parser)]
#[command(
    name = "torus-bench",
    version,
    about = "Benchmarks of torusnet with same-run baselines"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Next-hop queries against a cached route table, after view changes, vs. a fresh search.
    Route(route::Args),
    /// The transport core over the deterministic lossy multi-link harness (JSON).
    Transport(transport::Args),
    /// Sender + receiver over a lossless in-memory link, for instruction counting.
    TransportCost(transport_cost::Args),
    /// Ping-pong RTT: kernel UDP, raw AF_XDP and torusd on one veth pair, in one run.
    Rtt(rtt::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Route(a) => route::run(&a),
        Cmd::Transport(a) => transport::run(&a),
        Cmd::TransportCost(a) => transport_cost::run(&a),
        Cmd::Rtt(a) => rtt::run(&a),
    };
    if let Err(e) = result {
        eprintln!("torus-bench: {e}");
        std::process::exit(2);
    }
}
