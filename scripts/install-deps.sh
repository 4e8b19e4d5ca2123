#!/usr/bin/env bash
# Installs the system packages torusnet builds and runs with, only those missing
# (idempotent; runs apt-get update at most once). Needs root on a Debian-like machine.
# --packaging: also cargo-deb, for scripts/package-deb.sh (the test command passes it).
set -euo pipefail

PACKAGES=(
  clang llvm          # compiles the XDP program (ebpf/) to BPF bytecode
  gcc libc6-dev       # compiles the C example the application tests run
  python3 python3-pip python3-venv # the Python binding, its tests, its pip install test
  dpkg-dev binutils   # the client library's Debian packages (dpkg-deb, objdump, strip)
  util-linux          # setpriv: the tests attach as an unprivileged user
  libelf-dev m4 zlib1g-dev pkg-config   # libxdp/libbpf, built from source by xsk-rs
  iproute2 ethtool    # namespaces, veth pairs, link settings in scripts and tests
  libmemcached-tools  # memccapable (conformance) and memcslap (load) against the kv gateways
  memcached           # the stock server the kv benchmark compares with
  iputils-ping iperf3 curl   # real clients of IP over the torus in the tests and benchmarks
)

missing=()
for p in "${PACKAGES[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: need root to install ${missing[*]} (run with sudo)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python modules from PyPI when missing: pytest (the binding's tests), pymemcache (a memcached
# client nobody here wrote, against the kv gateways), prometheus_client (its parser judges
# the daemons' metrics).
for m in pytest pymemcache prometheus_client; do
  if ! python3 -c "import $m" 2>/dev/null; then
    echo "install-deps: installing $m"
    pkg=${m//_/-}
    python3 -m pip install --quiet --disable-pip-version-check "$pkg" 2>/dev/null \
      || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$pkg"
  fi
done

export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null; then
  echo "install-deps: cargo not found; install a Rust toolchain (1.95 stable)" >&2
  exit 1
fi
# cargo-deb builds the Debian package (scripts/package-deb.sh, and its test): only with
# --packaging, so the main job does not wait for it.
if [ "${1:-}" = "--packaging" ] && ! command -v cargo-deb >/dev/null; then
  echo "install-deps: installing cargo-deb (about a minute)"
  cargo install cargo-deb --locked --quiet
fi
