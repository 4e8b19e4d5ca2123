//! `torusd`: the torusnet dataplane of one server.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use clap::Parser;
use torusnet_dataplane::config::NodeConfig;
use torusnet_dataplane::mgmt::{Daemon, Mgmt};

#[derive(Parser)]
#[command(
    name = "torusd",
    version,
    about = "The torusnet AF_XDP dataplane of one server"
)]
struct Args {
    /// The node's configuration file (TOML).
    #[arg(long)]
    config: PathBuf,
    /// Check the configuration and exit.
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                print!("{e}");
                return ExitCode::SUCCESS;
            }
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad arguments");
            eprintln!("torusd: {}", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    let cfg = match NodeConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("torusd: {e}");
            return ExitCode::from(2);
        }
    };
    if args.check {
        let at = cfg
            .coord
            .map_or("a coordinate from the control process".to_string(), |c| {
                c.to_string()
            });
        println!(
            "torusd: {} is valid ({} at {at} in {})",
            args.config.display(),
            cfg.name,
            cfg.dims
        );
        return ExitCode::SUCCESS;
    }
    let mgmt = match Mgmt::bind(&cfg.socket) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("torusd: management socket {}: {e}", cfg.socket.display());
            return ExitCode::from(1);
        }
    };
    let (name, socket) = (cfg.name.clone(), cfg.socket.clone());
    if let Some(c) = &cfg.control_socket {
        torusnet_dataplane::mgmt::ask_for_view(c);
    }
    let daemon = match Daemon::new(cfg) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("torusd: {e}");
            return ExitCode::from(1);
        }
    };
    {
        let d = daemon.clone();
        if let Err(e) = ctrlc::set_handler(move || d.stop.store(true, Ordering::Release)) {
            eprintln!("torusd: cannot install the signal handler: {e}");
            return ExitCode::from(1);
        }
    }
    eprintln!(
        "torusd {name}: {} (management socket {})",
        daemon.describe(),
        socket.display()
    );
    mgmt.serve(&daemon);
    let crashed = !daemon.healthy();
    match daemon.shutdown() {
        Ok(()) if !crashed => ExitCode::SUCCESS,
        Ok(()) => {
            eprintln!("torusd {name}: a poller stopped unexpectedly");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("torusd {name}: {e}");
            ExitCode::from(1)
        }
    }
}
