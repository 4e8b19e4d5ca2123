//! The suite's rows measured several times: headline rows run five times, interleaved, and
//! report the run with the median figure and the spread; a run whose own baselines fail
//! their sanity check is measured again rather than quoted.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

/// One row of the suite: measures once (its argument names the run's namespaces).
pub(crate) type Step = Box<dyn Fn(&str) -> Result<Value, String>>;

/// The number at `path` in a result (NaN when absent).
pub(crate) fn f(v: &Value, path: &[&str]) -> f64 {
    let mut c = v;
    for p in path {
        c = &c[*p];
    }
    c.as_f64().unwrap_or(f64::NAN)
}

/// Runs of each headline row.
const HEADLINE_RUNS: usize = 5;

/// Times a run whose baselines fail their sanity check is measured again.
const SANITY_RETRIES: usize = 2;

/// How far raw AF_XDP may trail kernel UDP before a run's baselines count as insane: at
/// 8-9 KB both are bound by the same copies and measure equal within noise (407,511 vs
/// 408,524 messages/s in one run), which is not a stall.
const SANITY_MARGIN: f64 = 0.9;

/// Why a run's own baselines cannot be quoted, if they cannot: raw AF_XDP, which does less
/// than the kernel's UDP, measured clearly slower than it (the machine stalled in that
/// baseline's turn), makes every ratio to it meaningless.
fn insane_baseline(v: &Value) -> Option<String> {
    let raw_rate = f(v, &["raw_afxdp", "messages_per_s"]);
    let udp_rate =
        f(v, &["udp_busy_poll", "messages_per_s"]).max(f(v, &["udp_blocking", "messages_per_s"]));
    if !raw_rate.is_nan() && !udp_rate.is_nan() && raw_rate < SANITY_MARGIN * udp_rate {
        return Some(format!(
            "raw AF_XDP {raw_rate:.0} messages/s below kernel UDP's {udp_rate:.0}"
        ));
    }
    let raw_p50 = f(v, &["raw_afxdp", "p50"]);
    let udp_p50 = f(v, &["udp_busy_poll", "p50"]);
    if !raw_p50.is_nan() && !udp_p50.is_nan() && SANITY_MARGIN * raw_p50 > udp_p50 {
        return Some(format!(
            "raw AF_XDP p50 {raw_p50:.1} us above kernel UDP busy poll's {udp_p50:.1} us"
        ));
    }
    None
}

/// Runs every row once, and the headline rows `HEADLINE_RUNS` times, interleaved; returns
/// each row's runs.
/// Runs every step once and the headline ones (`headline(name)`) `HEADLINE_RUNS` times,
/// each run named by `tag()`.
pub(crate) fn run_steps(
    steps: &[(String, Step)],
    started: std::time::Instant,
    headline: impl Fn(&str) -> bool,
    tag: impl Fn() -> String,
) -> Vec<Vec<Value>> {
    let bar = ProgressBar::new(steps.len() as u64);
    if std::io::stderr().is_terminal() {
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    // This machine is noisy: the headline rows run HEADLINE_RUNS times, interleaved with
    // each other (A B C D A B C D ...) so that a slow spell hits every row alike, and
    // report the run with the median figure and the spread of all runs.
    let mut runs: Vec<Vec<Value>> = vec![Vec::new(); steps.len()];
    for round in 0..HEADLINE_RUNS {
        for (k, (name, f)) in steps.iter().enumerate() {
            if round > 0 && !headline(name) {
                continue;
            }
            bar.set_message(name.clone());
            let mut v = f(&tag()).unwrap_or_else(|e| json!({"error": e}));
            // A run whose own baselines are not sane is measured again, not quoted.
            let mut insane = Vec::new();
            while let Some(why) = insane_baseline(&v) {
                insane.push(why);
                if insane.len() > SANITY_RETRIES {
                    v = json!({"error": format!("baselines failed their sanity check {} times", insane.len()), "insane": insane});
                    break;
                }
                v = f(&tag()).unwrap_or_else(|e| json!({"error": e}));
            }
            if let (false, Some(o)) = (insane.is_empty(), v.as_object_mut()) {
                o.entry("remeasured").or_insert(json!(insane));
            }
            if !std::io::stderr().is_terminal() {
                eprintln!(
                    "torus-bench suite: {name} done ({:.0} s)",
                    started.elapsed().as_secs_f64()
                );
            }
            runs[k].push(v);
            if round == 0 {
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    runs
}

/// One row's result from its runs: the run with the median key figure, with every run's
/// figure and the spread added; a failed run counts as failed and is listed, and the row
/// fails only when every run failed.
pub(crate) fn median_run(key: Option<&[&str]>, mut runs: Vec<Value>) -> Value {
    let Some(key) = key else {
        return runs.pop().unwrap_or(Value::Null);
    };
    let errors: Vec<Value> = runs
        .iter()
        .filter_map(|r| r.get("error").cloned())
        .collect();
    let mut ok: Vec<(f64, Value)> = runs
        .into_iter()
        .filter_map(|r| {
            let x = f(&r, key);
            (!x.is_nan()).then_some((x, r))
        })
        .collect();
    if ok.is_empty() {
        return json!({"error": errors.first().cloned().unwrap_or_else(|| json!("no run produced the figure")), "failed_runs": errors});
    }
    ok.sort_by(|a, b| a.0.total_cmp(&b.0));
    let figures: Vec<f64> = ok.iter().map(|(x, _)| *x).collect();
    let (lo, hi) = (figures[0], figures[figures.len() - 1]);
    let mid = ok.len() / 2;
    let mut v = ok.swap_remove(mid).1;
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "repeats".into(),
            json!({"figure": key.join("."), "runs": figures, "min": lo, "max": hi, "failed_runs": errors}),
        );
    }
    v
}
