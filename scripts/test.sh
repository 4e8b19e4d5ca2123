#!/usr/bin/env bash
# The project's test command: installs what is missing, then builds and runs every test
# (unit, property, seeded fuzz, command-line) of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --workspace --release --all-targets
cargo test --workspace --release
