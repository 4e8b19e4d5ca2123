//! `torus-bench`: micro-benchmarks of torusnet, each reported against a baseline measured
//! in the same run.

use clap::{Parser, Subcommand};

mod apps;
mod baseline;
mod churn;
mod churn_ledger;
mod ip;
mod kv;
mod kvtcp;
mod measure;
mod netbench;
mod plot;
mod procmem;
mod repeats;
mod rmem;
mod route;
mod sim;
mod stack;
mod transport;
mod transport_cost;
mod trees;

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
    /// Ping-pong RTT: kernel UDP (blocking, busy poll), raw AF_XDP and torusnet, one run.
    Pingpong(netbench::PingArgs),
    /// One-way throughput: kernel UDP, raw AF_XDP and torusnet on the same link, one run.
    Oneway(netbench::FlowArgs),
    /// Two-way throughput (torusnet both ways at once; baselines one way).
    Twoway(netbench::FlowArgs),
    /// The standard suite (about 2-5 minutes here), results into bench/results/.
    Suite(netbench::SuiteArgs),
    /// Applications attached from their own process vs the embedded API, same link, same run.
    Apps(apps::Args),
    /// The key-value store under memaslap: torus vs the same store over TCP through a switch
    /// vs one memcached, set- and get-heavy, cache on and off (about 4 minutes).
    Kv(kv::Args),
    /// Multicast over the six trees vs unicast in turn and one link's rate, aggregation's
    /// link bytes; the same in the simulator at 512 servers (about 3 minutes).
    Trees(trees::Args),
    /// Remote memory (64 KiB remote writes, 64 B remote reads, the message queue) vs reliable
    /// messages of the same size on the same link (about 1 minute).
    Rmem(rmem::Args),
    /// IP over the torus (iperf3, ping, all-to-all TCP) vs the kernel's IP forwarding on the
    /// same veth topology (about 3 minutes).
    Ip(ip::Args),
    /// One server of the all-to-all TCP run (started by `ip`).
    IpMesh(ip::MeshArgs),
    /// One server of the key-value store's switch baseline (started by `kv`).
    KvNode(kvtcp::NodeArgs),
    /// Experiments on the packet-level simulator of the whole torus (same engines).
    Sim(sim::Args),
    /// Redraw the suite's SVG charts from a results file.
    Plot {
        /// The suite's JSON results.
        #[arg(long, default_value = "bench/results/suite.json")]
        from: std::path::PathBuf,
        /// Where the SVG files go.
        #[arg(long, default_value = "bench/results")]
        out: std::path::PathBuf,
    },
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Route(a) => route::run(&a),
        Cmd::Transport(a) => transport::run(&a),
        Cmd::TransportCost(a) => transport_cost::run(&a),
        Cmd::Pingpong(a) => netbench::run_ping(&a),
        Cmd::Oneway(a) => netbench::run_flow(&a, false),
        Cmd::Twoway(a) => netbench::run_flow(&a, true),
        Cmd::Suite(a) => netbench::run_suite(&a),
        Cmd::Sim(a) => sim::run(&a),
        Cmd::Kv(a) => kv::run(&a),
        Cmd::Ip(a) => ip::run(&a),
        Cmd::Rmem(a) => rmem::run(&a),
        Cmd::Trees(a) => trees::run(&a),
        Cmd::IpMesh(a) => ip::run_mesh(&a),
        Cmd::KvNode(a) => kvtcp::run_node(&a),
        Cmd::Apps(a) => apps::run(&a),
        Cmd::Plot { from, out } => std::fs::read_to_string(&from)
            .map_err(|e| format!("{}: {e}", from.display()))
            .and_then(|t| serde_json::from_str(&t).map_err(|e| format!("{}: {e}", from.display())))
            .and_then(|v: serde_json::Value| plot::suite_charts(&v, &out)),
    };
    if let Err(e) = result {
        eprintln!("torus-bench: {e}");
        std::process::exit(2);
    }
}
