#!/usr/bin/env bash
# Long fuzz runs: every target (or those named) for RUNS inputs each (default 50 million),
# or SECONDS seconds each when set, starting from the committed seeds (fuzz/seeds/<target>,
# written by the tests' short runs: TORUSNET_WRITE_SEEDS=1 cargo test). Stable Rust works
# with `-s none` (no sanitizer; Rust's own checks still catch bugs). Needs cargo-fuzz:
# cargo install cargo-fuzz --locked. Prints one line per target: inputs run, crashes.
#   bash fuzz/run.sh                      every target, 50 million inputs each
#   SECONDS_EACH=60 bash fuzz/run.sh      every target for a minute
#   bash fuzz/run.sh memcached kv_wire    two targets
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$HOME/.cargo/bin:$PATH"
command -v cargo-fuzz >/dev/null || { echo "fuzz/run.sh: cargo-fuzz missing (cargo install cargo-fuzz --locked)" >&2; exit 2; }
RUNS=${RUNS:-50000000}
python3 make-seeds.py
if [ $# -gt 0 ]; then targets=("$@"); else
  mapfile -t targets < <(sed -n 's/^name = "\(.*\)"/\1/p' Cargo.toml | grep -v '^torusnet-fuzz$')
fi
limit=(-runs="$RUNS")
[ -z "${SECONDS_EACH:-}" ] || limit=(-max_total_time="$SECONDS_EACH")
cargo fuzz build -s none -O
status=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  log="corpus/$t.log"
  if cargo fuzz run -s none -O "$t" "corpus/$t" "seeds/$t" -- \
      "${limit[@]}" -max_len=9100 -len_control=0 -artifact_prefix="artifacts/$t/" > "$log" 2>&1; then
    crashes=0
  else
    crashes=$(find "artifacts/$t" -type f | wc -l)
    status=1
  fi
  runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1 | awk '{ print $2 }')
  [ -n "$runs" ] || runs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
  echo "fuzz: $t: ${runs:-?} inputs, $crashes crashes (log fuzz/$log)"
done
exit $status
