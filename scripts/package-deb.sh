#!/usr/bin/env bash
# Builds the Debian packages: torusnet (target/debian/torusnet_VERSION_ARCH.deb) with
# cargo-deb: the binaries, systemd unit templates pointing at /usr/bin, an example node
# file as /etc/torusnet/example.toml, man pages and shell completions generated from the
# commands' own definitions, and the docs; and, for application developers,
# libtorusnet-client0 and libtorusnet-client-dev (scripts/package-client-deb.sh).
# Prints every package's path, torusnet's on the last line.
#   bash scripts/package-deb.sh             (builds first)
#   bash scripts/package-deb.sh --no-build  (packages what target/release holds)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
if [ "${1:-}" != "--no-build" ]; then
  bash scripts/install-deps.sh --packaging >/dev/null
  cargo build --release --workspace --quiet
fi
command -v cargo-deb >/dev/null || { echo "package-deb: cargo-deb missing (scripts/install-deps.sh installs it)" >&2; exit 2; }
for b in torusd torusctl torus-bench; do
  [ -x target/release/$b ] || { echo "package-deb: target/release/$b missing: build first" >&2; exit 2; }
done
out=target/deb
rm -rf "$out"
mkdir -p "$out/systemd" "$out/man" "$out/completions/bash" "$out/completions/zsh" "$out/completions/fish"
for u in deploy/systemd/*.service; do
  sed 's|/usr/local/bin/|/usr/bin/|g; s|file:/usr/share/doc/torusnet/deploy.md|file:/usr/share/doc/torusnet/deploy.md man:torusd(1) man:torusctl(1)|' \
    "$u" > "$out/systemd/$(basename "$u")"
done
target/release/torusctl man --out "$out/man" >/dev/null
target/release/torusd --man > "$out/man/torusd.1"
gzip -9n "$out"/man/*.1
for b in torusctl torusd; do
  if [ $b = torusctl ]; then gen() { target/release/torusctl completions "$1"; }
  else gen() { target/release/torusd --completions "$1"; }; fi
  gen bash > "$out/completions/bash/$b"
  gen zsh > "$out/completions/zsh/_$b"
  gen fish > "$out/completions/fish/$b.fish"
done
bash scripts/package-client-deb.sh
# Stripped: the release profile keeps debug info for perf, which the package does not need.
cargo deb -p torusnet-dataplane --no-build --strip --quiet --output target/debian/ >&2
ls -t target/debian/torusnet_*.deb | awk 'NR == 1'
