#!/usr/bin/env bash
# Whether two builds of torus-bench give the simulator's experiments the same figures
# (all-to-all, failures, routing, churn, at small sizes), wall-clock fields left out: the
# check a refactoring of the engines must pass. The simulator is deterministic, so any
# difference is a change of behaviour.
#   bench/sim-same.sh OLD/torus-bench NEW/torus-bench
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 OLD-torus-bench NEW-torus-bench" >&2; exit 2; }
figures() {
    local b=$1
    {
        "$b" sim alltoall --sizes 3,4 --ms 5 --json
        "$b" sim failures --k 4 --ms 5 --json
        "$b" sim routing --k 4 --ms 3 --json
        "$b" sim churn --k 4 --seconds 2 --json
    } | python3 -c '
import json, sys
WALL = {"wall_s", "events_per_s", "peak_mib", "memory_per_server_kib", "threads"}
def strip(o):
    if isinstance(o, dict):
        return {k: strip(v) for k, v in o.items() if k not in WALL}
    if isinstance(o, list):
        return [strip(x) for x in o]
    return o
for line in sys.stdin:
    if line.startswith("{"):
        print(json.dumps(strip(json.loads(line)), sort_keys=True))
'
}
old=$(mktemp) new=$(mktemp)
trap 'rm -f "$old" "$new"' EXIT
figures "$1" >"$old"
figures "$2" >"$new"
if [ ! -s "$old" ]; then
    echo "no figures from $1" >&2
    exit 1
fi
if cmp -s "$old" "$new"; then
    echo "same figures: $(wc -l <"$old") experiments"
else
    diff "$old" "$new" | head -20
    echo "the figures differ" >&2
    exit 1
fi
