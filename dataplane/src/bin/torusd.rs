//! `torusd`: the torusnet dataplane of one server.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Parser;
use torusnet_dataplane::config::NodeConfig;
use torusnet_dataplane::mgmt::Mgmt;
use torusnet_dataplane::runtime::Dataplane;

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
            eprintln!(
                "torusd: {}",
                text.lines()
                    .next()
                    .unwrap_or("bad arguments")
                    .trim_start_matches("error: ")
            );
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
        println!(
            "torusd: {} is valid ({} at {} in {})",
            args.config.display(),
            cfg.name,
            cfg.coord,
            cfg.dims
        );
        return ExitCode::SUCCESS;
    }
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        if let Err(e) = ctrlc::set_handler(move || stop.store(true, Ordering::Release)) {
            eprintln!("torusd: cannot install the signal handler: {e}");
            return ExitCode::from(1);
        }
    }
    let mgmt = match Mgmt::bind(&cfg.socket) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("torusd: management socket {}: {e}", cfg.socket.display());
            return ExitCode::from(1);
        }
    };
    let dp = match Dataplane::start(&cfg) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("torusd: {e}");
            return ExitCode::from(1);
        }
    };
    let st = dp.status();
    for l in &st.links {
        eprintln!(
            "torusd {}: link {} on {}: XDP {} ({}), AF_XDP {}{}{}",
            st.name,
            l.dir,
            l.ifname,
            l.xdp_mode,
            l.xdp_section,
            l.afxdp_mode,
            if l.multi_buffer { ", multi-buffer" } else { "" },
            if l.shared_umem {
                ", shared UMEM"
            } else {
                ", own UMEM"
            },
        );
    }
    eprintln!(
        "torusd {}: serving at {} on {}",
        st.name,
        cfg.coord,
        cfg.socket.display()
    );
    mgmt.serve(&dp, &stop);
    let crashed = !dp.is_running();
    match dp.shutdown() {
        Ok(()) if !crashed => ExitCode::SUCCESS,
        Ok(()) => {
            eprintln!("torusd: the poller stopped unexpectedly");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("torusd: {e}");
            ExitCode::from(1)
        }
    }
}
