#!/usr/bin/env bash
# The main job: a 3x3x3 torus of network namespaces on this machine, the control process and
# the dataplane in every one (adaptive polling, so 2 cores hold 54 daemons), traffic across
# it, and a summary. Installs what it needs, builds, and removes everything it made at the
# end and on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
echo "== building (release)"
cargo build --release --workspace --quiet
cargo build --release -p torusnet-client --examples --quiet
PREFIX=${PREFIX:-tn}
cleanup() { bash scripts/netns-torus.sh down --prefix "$PREFIX" >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'echo; echo "interrupted: tearing the torus down"; exit 130' INT TERM
echo "== bringing up a 3x3x3 torus of namespaces"
bash scripts/netns-torus.sh up 3x3x3 --prefix "$PREFIX" --front --routing 'mode = "next-hop"'
bash scripts/netns-torus.sh start --prefix "$PREFIX"
python3 scripts/demo.py "$PREFIX"
echo
echo "== tearing down"
cleanup
trap - EXIT
left=$(ip netns list | grep -c "^$PREFIX-" || true)
echo "done: $left namespaces left, no torusnet processes running"
