#!/usr/bin/env bash
# Compares two builds of torus-bench by the suite, run alternately (A, B, A, B, ...), so that
# both see the same noise of this machine; prints, per suite row, each build's headline (the
# torusnet figure over the same run's raw AF_XDP baseline: goodput for throughput rows, p50
# for RTT rows) as the median over the runs with its spread, and B's median over A's.
#   bash bench/ab-suite.sh OLD_BIN NEW_BIN [RUNS]   (default 3 runs each; ~2.5 min a suite)
# Results stay in a scratch directory (printed); the committed bench/results are untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bash bench/ab-suite.sh OLD_BIN NEW_BIN [RUNS]" >&2; exit 2; }
a=$1 b=$2 runs=${3:-3}
for bin in "$a" "$b"; do
  [ -x "$bin" ] || { echo "ab-suite: $bin is not an executable" >&2; exit 2; }
done
case $runs in '' | *[!0-9]*) echo "ab-suite: RUNS must be a number" >&2; exit 2 ;; esac
out=$(mktemp -d /tmp/torusnet-ab.XXXXXX)
echo "ab-suite: A=$a B=$b, $runs runs each, results in $out" >&2
for i in $(seq 1 "$runs"); do
  for side in A B; do
    bin=$a
    [ $side = B ] && bin=$b
    "$bin" suite --out "$out/$side$i" >"$out/$side$i.log" 2>&1 \
      || { echo "ab-suite: run $side$i failed (see $out/$side$i.log)" >&2; exit 1; }
    echo "ab-suite: run $side$i done" >&2
  done
done
python3 bench/ab_summary.py "$out" "$runs"
