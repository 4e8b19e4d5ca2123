#!/usr/bin/env bash
# The project's test command: installs what is missing, then builds and runs every test
# (unit, property, seeded fuzz, command-line, and, as root, the network-namespace tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --packaging
# The repository stands alone: no file points outside it.
python3 scripts/check-links.py
# Arrows between the top-level modules of each crate run one way (no import cycle), and no
# source file or function grows past what a newcomer reads in one sitting (1000 / 120 lines).
python3 scripts/check-house.py . --sizes --strict
export PATH="$HOME/.cargo/bin:$PATH"
# The end-to-end tests start the release binaries, so build everything first.
cargo build --workspace --release --all-targets
cargo test --workspace --release --exclude torusnet-e2e
# The client crate as crates.io would get it (built from its packaged sources alone), and
# its documentation without a warning.
cargo package -p torusnet-client --allow-dirty --quiet
RUSTDOCFLAGS="-D warnings" cargo doc -p torusnet-client --no-deps --quiet
# One namespace torus at a time: dozens of daemons share this machine's cores.
cargo test --release -p torusnet-e2e -- --test-threads 1
# The Python binding against real daemons (the C and Python examples also run in apps_e2e).
python3 -m pytest -q client/python/tests
