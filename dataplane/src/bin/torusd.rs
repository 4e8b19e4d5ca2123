//! `torusd`: the torusnet dataplane of one server.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use clap::{CommandFactory, Parser};
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
    #[arg(long, required_unless_present_any = ["man", "completions"])]
    config: Option<PathBuf>,
    /// Check the configuration and exit.
    #[arg(long)]
    check: bool,
    /// Log filter: error, warn, info, debug, trace, or per module
    /// (`torusnet_dataplane=debug,info`); default `RUST_LOG`, else info. Changeable at run
    /// time: `torusctl log --socket S LEVEL`.
    #[arg(long)]
    log_level: Option<String>,
    /// Print torusd's man page (roff) and exit.
    #[arg(long)]
    man: bool,
    /// Print a completion script for SHELL (bash, zsh, fish, ...) and exit.
    #[arg(long, value_name = "SHELL")]
    completions: Option<clap_complete::Shell>,
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
    if args.man {
        let mut out = std::io::stdout();
        return match clap_mangen::Man::new(Args::command()).render(&mut out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("torusd: {e}");
                ExitCode::from(1)
            }
        };
    }
    if let Some(shell) = args.completions {
        clap_complete::generate(
            shell,
            &mut Args::command(),
            "torusd",
            &mut std::io::stdout(),
        );
        return ExitCode::SUCCESS;
    }
    let Some(config) = args.config else {
        eprintln!("torusd: --config is required");
        return ExitCode::from(2);
    };
    let cfg = match NodeConfig::load(&config) {
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
            config.display(),
            cfg.name,
            cfg.dims
        );
        return ExitCode::SUCCESS;
    }
    if let Err(e) = torusnet_ops::logging::init(args.log_level.as_deref()) {
        eprintln!("torusd: --log-level: {e}");
        return ExitCode::from(2);
    }
    let span = tracing::info_span!("torusd", server = %cfg.name);
    let _entered = span.enter();
    let mgmt = match Mgmt::bind(&cfg.socket) {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(socket = %cfg.socket.display(), "management socket: {e}");
            return ExitCode::from(1);
        }
    };
    let (socket, metrics_addr) = (cfg.socket.clone(), cfg.metrics);
    if let Some(c) = &cfg.control_socket {
        torusnet_dataplane::mgmt::ask_for_view(c);
    }
    let daemon = match Daemon::new(cfg) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!("cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    {
        let d = daemon.clone();
        if let Err(e) = ctrlc::set_handler(move || d.stop.store(true, Ordering::Release)) {
            tracing::error!("cannot install the signal handler: {e}");
            return ExitCode::from(1);
        }
    }
    // Held until exit: dropping it stops the endpoint.
    let _metrics = match metrics_addr {
        Some(addr) => {
            let d = daemon.clone();
            let render = move || match d.status() {
                Ok(v) => torusnet_dataplane::metrics::render(&v),
                Err(e) => format!("# status unavailable: {}\n", e.replace('\n', " ")),
            };
            // Bound from its own thread: the dataplane serves at once after a restart even
            // while the previous process's socket is still being torn down.
            match torusnet_ops::metrics::serve_retrying(
                addr,
                std::time::Duration::from_secs(10),
                render,
            ) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::error!(address = %addr, "metrics endpoint: {e}");
                    return ExitCode::from(1);
                }
            }
        }
        None => None,
    };
    if let Err(e) = torusnet_dataplane::watch::spawn(daemon.clone()) {
        tracing::warn!("state changes will not be logged: {e}");
    }
    tracing::info!(socket = %socket.display(), "started: {}", daemon.describe());
    mgmt.serve(&daemon);
    let crashed = !daemon.healthy();
    match daemon.shutdown() {
        Ok(()) if !crashed => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Ok(()) => {
            tracing::error!("a poller stopped unexpectedly");
            ExitCode::from(1)
        }
        Err(e) => {
            tracing::error!("shutdown: {e}");
            ExitCode::from(1)
        }
    }
}
