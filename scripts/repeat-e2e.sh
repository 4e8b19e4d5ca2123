#!/usr/bin/env bash
# Runs one end-to-end test file N times in a row and stops at the first failure: the proof
# that a test once flaky now passes (a flake is a bug; this finds it or shows it gone).
#   bash scripts/repeat-e2e.sh trees_e2e 20
# Needs root and a release build (cargo build --workspace --release --all-targets). Each
# run's output is kept in target/repeat/NAME-K.log.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: repeat-e2e.sh TEST_FILE [RUNS]}
runs=${2:-20}
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -p torusnet-e2e --tests --quiet
bin=$(cargo test --release -p torusnet-e2e --test "$name" --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' | tail -1)
[ -x "$bin" ] || { echo "repeat-e2e: no test binary for $name" >&2; exit 2; }
mkdir -p target/repeat
for k in $(seq 1 "$runs"); do
  start=$(date +%s)
  if "$bin" --test-threads 1 > "target/repeat/$name-$k.log" 2>&1; then
    echo "repeat-e2e: $name run $k/$runs passed ($(( $(date +%s) - start )) s)"
  else
    echo "repeat-e2e: $name run $k/$runs FAILED (target/repeat/$name-$k.log):" >&2
    grep -E "panicked|assert|Error|error" "target/repeat/$name-$k.log" | head -20 >&2
    exit 1
  fi
done
echo "repeat-e2e: $name passed $runs runs in a row"
