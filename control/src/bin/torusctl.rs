//! `torusctl`: queries about a torus (keys, routes) from the command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use torusnet_control::query::{self, LinkRef};
use torusnet_proto::keyspace::Key;
use torusnet_proto::topology::{Coord, Dims};

#[derive(Parser)]
#[command(
    name = "torusctl",
    version,
    about = "Control and query a torusnet torus"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Where a key lives: its home, index and GetServersForKey(key, replicas), as JSON.
    Key {
        /// Torus dimensions, XxYxZ.
        #[arg(long, value_parser = parse_dims)]
        dims: Dims,
        /// How many servers to list (the first is the key's root).
        #[arg(long, default_value_t = 1)]
        replicas: usize,
        /// A failed server, x,y,z (repeatable).
        #[arg(long, value_parser = parse_coord)]
        down: Vec<Coord>,
        /// The key as 40 hex digits.
        #[arg(long, conflicts_with = "string", required_unless_present = "string")]
        hex: Option<String>,
        /// A string key: its SHA-1 is the key.
        string: Option<String>,
    },
    /// The next-hop set from one server to another, as JSON.
    Route {
        /// Torus dimensions, XxYxZ.
        #[arg(long, value_parser = parse_dims)]
        dims: Dims,
        /// Where the route starts, x,y,z.
        #[arg(long, value_parser = parse_coord)]
        from: Coord,
        /// Where it ends, x,y,z.
        #[arg(long, value_parser = parse_coord)]
        to: Coord,
        /// A failed server, x,y,z (repeatable).
        #[arg(long, value_parser = parse_coord)]
        down: Vec<Coord>,
        /// A failed link, x,y,z:DIR (repeatable), down in both directions.
        #[arg(long = "down-link", value_parser = parse_link)]
        down_link: Vec<LinkRef>,
    },
}

fn parse_dims(s: &str) -> Result<Dims, String> {
    s.parse().map_err(|e| format!("{e}"))
}
fn parse_coord(s: &str) -> Result<Coord, String> {
    s.parse().map_err(|e| format!("{e}"))
}
fn parse_link(s: &str) -> Result<LinkRef, String> {
    s.parse().map_err(|e| format!("{e}"))
}

fn run(cmd: Cmd) -> Result<String, String> {
    let json = match cmd {
        Cmd::Key {
            dims,
            replicas,
            down,
            hex,
            string,
        } => {
            let key = match (hex, string) {
                (Some(h), _) => Key::from_hex(&h).map_err(|e| e.to_string())?,
                (None, Some(s)) => Key::from_string(&s),
                (None, None) => return Err("give a key: --hex 40HEXDIGITS or a STRING".into()),
            };
            let a = query::key(dims, key, replicas, &down).map_err(|e| e.to_string())?;
            serde_json::to_string(&a)
        }
        Cmd::Route {
            dims,
            from,
            to,
            down,
            down_link,
        } => {
            let a = query::route(dims, from, to, &down, &down_link).map_err(|e| e.to_string())?;
            serde_json::to_string(&a)
        }
    };
    json.map_err(|e| format!("cannot encode the answer: {e}"))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                print!("{e}");
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                eprint!("{e}");
                return ExitCode::from(2);
            }
            // One clear line: clap's first line, without its usage block.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad arguments");
            eprintln!("torusctl: {}", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    match run(cli.cmd) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("torusctl: {msg}");
            ExitCode::from(2)
        }
    }
}
