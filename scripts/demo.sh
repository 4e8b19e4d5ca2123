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
# The processes of this run: whatever runs in the torus's namespaces (daemons, applications,
# iperf3) and anything naming its state directory, taken before the namespaces go.
ran=$( { for ns in $(ip netns list | awk -v p="^$PREFIX-" '$1 ~ p { print $1 }'); do
           ip netns pids "$ns"; done; pgrep -f "/run/torusnet/$PREFIX/"; } 2>/dev/null | sort -un)
cleanup
trap - EXIT
left=$(ip netns list | grep -c "^$PREFIX-" || true)
alive=()
for pid in $ran; do
  state=$(sed -n 's/.*) \(.\).*/\1/p' "/proc/$pid/stat" 2>/dev/null || true)
  if [ -n "$state" ] && [ "$state" != Z ]; then alive+=("$pid"); fi
done
echo "done: $left namespaces left; of the $(echo "$ran" | grep -c .) processes that ran in the torus, ${#alive[@]} still running"
if [ "$left" -ne 0 ] || [ ${#alive[@]} -ne 0 ]; then
  for pid in "${alive[@]}"; do ps -o pid=,args= -p "$pid" >&2 || true; done
  exit 1
fi
