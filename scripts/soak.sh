#!/usr/bin/env bash
# The long platform soak: a 3x3x3 torus under faults (loss, duplication and reordering on
# links, links down and up, torusd and control processes killed and restarted) for SECONDS
# (default 600) while journalled reliable traffic, a memcached register workload judged for
# linearizability, multicasts, iperf3 and HTTP downloads over the IP service, applications'
# calls and remote writes run; prints its report (tests/tests/soak_e2e.rs,
# the_platform_under_faults).
# The test command runs the same soak for 60 s. With --all, the long versions of the other
# soaks first: 20 restarts under checked traffic (10 in the test command) and 90 s of
# churn (60). Needs root.
#   sudo bash scripts/soak.sh [--all] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --workspace --release --all-targets --quiet
if [ "${1:-}" = "--all" ]; then
  shift
  TORUSNET_RESTARTS=20 cargo test --release -p torusnet-e2e --test soak_e2e \
    random_restarts_under_checked_traffic -- --nocapture --test-threads 1
  TORUSNET_CHURN_SECONDS=90 cargo test --release -p torusnet-e2e --test churn_e2e \
    -- --nocapture --test-threads 1
fi
TORUSNET_SOAK_SECONDS=${1:-600} cargo test --release -p torusnet-e2e --test soak_e2e \
  the_platform_under_faults -- --nocapture --test-threads 1
