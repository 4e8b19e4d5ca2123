#!/usr/bin/env bash
# Instructions per 64-byte message through the transport core (sender + receiver, lossless
# in-memory link), with and without aggregation, and per ping-pong round trip, counted by
# valgrind's callgrind: counts are repeatable on a noisy machine where times are not. The
# figure is marginal: the difference between runs of N and 2N messages (round trips) divided
# by N, so setup and teardown cancel out.
# Writes bench/results/transport-cost.txt with the top functions of the aggregated run.
# BIN=path/to/torus-bench measures another build (compare two by their counts), and
# OUT=file writes there instead.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
export PATH="$HOME/.cargo/bin:$PATH"
if [ -z "${BIN:-}" ]; then
  cargo build --release -p torusnet-bench --quiet
  BIN=target/release/torus-bench
fi
OUT=${OUT:-bench/results/transport-cost.txt}
N=${N:-100000}
SIZE=${SIZE:-64}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

count() { # mode messages -> total instructions
  local f="$out/cg.$1.$2"
  local flag=""
  [ "$1" = off ] && flag="--no-aggregation"
  [ "$1" = pingpong ] && flag="--pingpong"
  valgrind --tool=callgrind --callgrind-out-file="$f" "$BIN" transport-cost \
    --messages "$2" --size "$SIZE" $flag >/dev/null 2>"$f.log"
  grep -E '^(summary|totals):' "$f" | head -1 | awk '{print $2}'
}

mkdir -p "$(dirname "$OUT")"
{
  echo "transport core, instructions per ${SIZE}-byte message (sender + receiver), callgrind"
  echo "machine: $(uname -r), $(nproc) cores, $(rustc --version)"
  for mode in on off; do
    a=$(count "$mode" "$N")
    b=$(count "$mode" $((2 * N)))
    per=$(( (b - a) / N ))
    echo "aggregation $mode: $per instructions/message  (N=$N: $a, 2N: $b)"
  done
  # One message at a time, answered before the next (the RTT rows): what the transport
  # adds to a round trip, both ends, both directions.
  a=$(count pingpong "$N")
  b=$(count pingpong $((2 * N)))
  echo "ping-pong: $(( (b - a) / N )) instructions/round trip  (N=$N: $a, 2N: $b)"
  echo
  echo "top functions (inclusive), aggregation on, 2N messages:"
  callgrind_annotate --inclusive=yes "$out/cg.on.$((2 * N))" 2>/dev/null |
    grep -E 'torusnet|memcpy|malloc|free|realloc' | head -25
} | tee "$OUT"
