#!/usr/bin/env bash
# The fabric under many-to-one and shared-link traffic on real daemons, with the congestion
# controller off and on in one run (rounds alternate): a 3x3x3 torus of namespaces with
# memcached gateways, then bench/fabric.py (incast of 26 x 20 MB, RPCs beside a bulk flow,
# a pymemcache multi-get of 300 values). Prints medians with their spread and writes
# bench/results/fabric.json (OUT=file for another place). ROUNDS=3 by default. Needs root;
# the torus is removed at the end, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-bench/results/fabric.json}
PREFIX=tfab
cargo build --release -p torusnet-dataplane -p torusnet-control --quiet
trap 'bash scripts/netns-torus.sh down --prefix "$PREFIX" >/dev/null 2>&1 || true' EXIT
bash scripts/netns-torus.sh up 3x3x3 --prefix "$PREFIX" --front >/dev/null
bash scripts/netns-torus.sh start --prefix "$PREFIX" >/dev/null
# Every server's control process sees all 27 and every gateway answers before measuring.
for _ in $(seq 1 120); do
  n=0
  for f in /run/torusnet/$PREFIX/*-*-*-control.sock; do
    target/release/torusctl status --json --control "$f" 2>/dev/null | grep -q '"reachable":27' && n=$((n + 1))
  done
  [ "$n" -eq 27 ] && break
  sleep 0.5
done
[ "$n" -eq 27 ] || { echo "fabric: the torus did not converge" >&2; exit 1; }
for _ in $(seq 1 60); do
  ip netns exec "$PREFIX-front" python3 -c 'import socket; socket.create_connection(("10.88.0.14", 11211), 1)' 2>/dev/null && break
  sleep 0.5
done
mkdir -p "$(dirname "$OUT")"
python3 bench/fabric.py "$PREFIX" "$ROUNDS" "$OUT"
