#!/usr/bin/env bash
# Installs torusnet on one server: the binaries, the systemd units, and this server's node
# file. Run from a build of the repository as root:
#   bash deploy/install.sh NODE_FILE        e.g. deploy/examples/rack-3x3x3/rack-1-0-2.toml
set -euo pipefail
cd "$(dirname "$0")/.."
node=${1:?usage: deploy/install.sh NODE_FILE}
[ -f "$node" ] || { echo "install.sh: no node file $node" >&2; exit 2; }
[ -x target/release/torusd ] || { echo "install.sh: build first: cargo build --release" >&2; exit 2; }
target/release/torusd --check --config "$node"
install -m 0755 target/release/torusd target/release/torusctl target/release/torus-bench /usr/local/bin/
install -d /etc/torusnet /usr/share/doc/torusnet
name=$(basename "$node" .toml)
install -m 0644 "$node" "/etc/torusnet/$name.toml"
install -m 0644 deploy/systemd/torusd@.service deploy/systemd/torusnet-control@.service /etc/systemd/system/
install -m 0644 docs/deploy.md /usr/share/doc/torusnet/
systemctl daemon-reload
echo "installed $name; start with: systemctl enable --now torusnet-control@$name torusd@$name"
