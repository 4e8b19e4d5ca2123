#!/usr/bin/env bash
# Runs both fuzz targets for RUNS inputs each (default 50 million), starting from the seeds.
# Stable Rust works with `-s none` (no sanitizer; Rust's own checks still catch bugs).
# Needs cargo-fuzz: cargo install cargo-fuzz --locked
set -euo pipefail
cd "$(dirname "$0")"
RUNS=${RUNS:-50000000}
python3 make-seeds.py
for t in frame aggregation; do
  mkdir -p "corpus/$t"
  cargo fuzz run -s none -O "$t" "corpus/$t" "seeds/$t" -- \
    -runs="$RUNS" -max_len=9100 -len_control=0
done
