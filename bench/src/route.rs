//! Routing benchmark: how long a next-hop query takes once a view change is absorbed into a
//! [`RouteTable`], how long absorbing takes, and the same query answered from scratch (one
//! breadth-first search) as the same-run baseline.

use std::hint::black_box;
use std::time::Instant;

use serde::Serialize;
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::routing::{LinkView, RouteTable};
use torusnet_proto::topology::{Coord, Dims, Dir};

/// Options of `torus-bench route`.
#[derive(clap::Args)]
pub struct Args {
    /// Torus dimensions.
    #[arg(long, default_value = "16x16x16")]
    dims: String,
    /// View changes (one more link down each) to absorb.
    #[arg(long, default_value_t = 20)]
    changes: usize,
    /// Next-hop queries timed after each change.
    #[arg(long, default_value_t = 200_000)]
    queries: usize,
    /// Seed for the failed links and query targets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    dims: String,
    servers: u64,
    changes: usize,
    queries_per_change: usize,
    next_hop_ns: f64,
    key_route_ns: f64,
    absorb_us: f64,
    baseline_fresh_search_ns: f64,
    speedup_vs_fresh_search: f64,
}

pub fn run(a: &Args) -> Result<(), String> {
    let dims: Dims = a.dims.parse().map_err(|e| format!("{e}"))?;
    let mut rng = SplitMix64::new(a.seed);
    let mut view = LinkView::all_up(dims).map_err(|e| e.to_string())?;
    let local = Coord::new(0, 0, 0);
    let mut table = RouteTable::new(&view, local).map_err(|e| e.to_string())?;
    let n = dims.count();
    let targets: Vec<Coord> = (0..a.queries)
        .map(|_| dims.coord(rng.below(n) as usize))
        .collect();
    let keys: Vec<u64> = (0..a.queries).map(|_| rng.next_u64()).collect();
    let dirs = dims.link_dirs();
    let (mut absorb_ns, mut query_ns, mut key_ns) = (0u128, 0u128, 0u128);
    for _ in 0..a.changes {
        let at = dims.coord(rng.below(n) as usize);
        let d = Dir::ALL[rng.below(6) as usize];
        if dirs.contains(d) {
            view.set_link(at, d, false).map_err(|e| e.to_string())?;
        }
        let t = Instant::now();
        table.absorb(&view);
        absorb_ns += t.elapsed().as_nanos();

        let t = Instant::now();
        let mut acc = 0u32;
        for &dst in &targets {
            acc = acc.wrapping_add(u32::from(
                black_box(&table).next_hops(black_box(dst)).bits(),
            ));
        }
        query_ns += t.elapsed().as_nanos();
        black_box(acc);

        let t = Instant::now();
        for &k in &keys {
            if let Some((root, hops)) = black_box(&table).route_key(black_box(k)) {
                acc = acc.wrapping_add(u32::from(hops.bits()) + u32::from(root.x));
            }
        }
        key_ns += t.elapsed().as_nanos();
        black_box(acc);
    }
    // Baseline: answer each query with a fresh search over the same final view.
    let base_queries = 200.min(a.queries);
    let t = Instant::now();
    for &dst in &targets[..base_queries] {
        black_box(view.route(local, dst).map_err(|e| e.to_string())?);
    }
    let base_ns = t.elapsed().as_nanos() as f64 / base_queries.max(1) as f64;
    let total_q = (a.changes * a.queries).max(1) as f64;
    let next_hop_ns = query_ns as f64 / total_q;
    let r = Report {
        dims: dims.to_string(),
        servers: n,
        changes: a.changes,
        queries_per_change: a.queries,
        next_hop_ns,
        key_route_ns: key_ns as f64 / total_q,
        absorb_us: absorb_ns as f64 / a.changes.max(1) as f64 / 1000.0,
        baseline_fresh_search_ns: base_ns,
        speedup_vs_fresh_search: base_ns / next_hop_ns.max(1e-9),
    };
    if a.json {
        println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
    } else {
        println!(
            "routing on a {} torus ({} servers), {} view changes",
            r.dims, r.servers, r.changes
        );
        println!(
            "  next-hop query (cached table)   {:>10.1} ns",
            r.next_hop_ns
        );
        println!(
            "  key route (root + next hops)    {:>10.1} ns",
            r.key_route_ns
        );
        println!("  absorb one view change          {:>10.1} us", r.absorb_us);
        println!(
            "  baseline: fresh search / query  {:>10.1} ns",
            r.baseline_fresh_search_ns
        );
        println!(
            "  speedup vs baseline             {:>10.0} x",
            r.speedup_vs_fresh_search
        );
    }
    Ok(())
}
