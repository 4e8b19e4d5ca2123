#!/usr/bin/env bash
# A torus of network namespaces on this machine, joined by veth pairs.
#
#   netns-torus.sh up DIMS [--mtu N] [--prefix P] [--key HEX] [--front] [--kv LINE]... [--routing LINE]... [--dataplane LINE]...
#                                                                make it (replacing an old one of that prefix)
#   netns-torus.sh start [--prefix P] [--polling busy|adaptive] start torusctl daemon + torusd in every namespace
#   netns-torus.sh stop  [--prefix P]                            stop the daemons it started
#   netns-torus.sh down  [--prefix P]                            stop them and remove everything it made
#   netns-torus.sh list  [--prefix P]                            namespaces and config files
#
# Server (x,y,z) lives in namespace P-x-y-z; its link in direction +x is the interface "px"
# there, -x is "mx", and so on for y and z, so `ip -n P-1-0-2 link` reads as a wiring plan.
# A 3x3x3 torus is 27 namespaces and 81 veth pairs; an axis of size 2 has two links between
# the same two servers (+x of one to -x of the other, and back), an axis of size 1 none.
# Everything made is listed in /run/torusnet/P/manifest; `down` removes what is listed there
# and nothing else, also after a crash. Node files (read by torusd and torusctl daemon) are
# /run/torusnet/P/x-y-z.toml; logs are beside them.
#
# --front adds the clients' network: namespace P-front holds a bridge (10.88.255.254/16) with
# a veth "front" into every server (server number i, in x-then-y-then-z order, is
# 10.88.i/250.i%250+1), and the memcached gateways listen on it. --kv adds a line to every
# node file's [kv] section (e.g. --kv 'rereplicate_after_s = 5'), --routing one to its
# [routing] section (e.g. --routing 'mode = "source"'), --dataplane one to its [dataplane]
# section (e.g. --dataplane 'xdp_transit = false').
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}
shift || true
prefix=tn
mtu=1500
dims=
key=
polling=adaptive
front=0
kvlines=()
routinglines=()
dataplanelines=()
while [ $# -gt 0 ]; do
  case "$1" in
    --mtu) mtu=${2:?--mtu needs a value}; shift 2 ;;
    --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
    --key) key=${2:?--key needs hex digits}; shift 2 ;;
    --polling) polling=${2:?--polling needs busy or adaptive}; shift 2 ;;
    --front) front=1; shift ;;
    --kv) kvlines+=("${2:?--kv needs a line}"); shift 2 ;;
    --routing) routinglines+=("${2:?--routing needs a line}"); shift 2 ;;
    --dataplane) dataplanelines+=("${2:?--dataplane needs a line}"); shift 2 ;;
    -*) echo "netns-torus.sh: unknown option $1" >&2; exit 2 ;;
    *) if [ -z "$dims" ]; then dims=$1; shift; else echo "netns-torus.sh: unexpected $1" >&2; exit 2; fi ;;
  esac
done
case "$prefix" in
  *[!a-z0-9]*|"") echo "netns-torus.sh: --prefix must be lower-case letters and digits" >&2; exit 2 ;;
esac
[ ${#prefix} -le 8 ] || { echo "netns-torus.sh: --prefix is at most 8 characters" >&2; exit 2; }
case "$polling" in busy|adaptive) ;; *) echo "netns-torus.sh: --polling is busy or adaptive" >&2; exit 2 ;; esac
state=/run/torusnet/$prefix
bin=${TORUS_BIN:-$here/target/release}

# Whether PID runs one of our binaries. (Read whole, not piped into `grep -q`: under
# pipefail a writer cut off by grep's early exit would make the answer "no".)
ours() {
  local cmd
  cmd=$(tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null) || return 1
  case $cmd in *torusd* | *torusctl*) return 0 ;; *) return 1 ;; esac
}

stop_daemons() {
  [ -f "$state/pids" ] || return 0
  # Only PIDs we recorded, and only if they still run our binaries.
  while read -r pid; do
    if [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && ours "$pid"; then
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done < "$state/pids"
  for _ in $(seq 50); do
    alive=0
    while read -r pid; do
      [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && alive=1
    done < "$state/pids"
    [ $alive = 0 ] && break
    sleep 0.1
  done
  while read -r pid; do
    if [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && ours "$pid"; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done < "$state/pids"
  rm -f "$state/pids"
}

down() {
  stop_daemons
  if [ -f "$state/manifest" ]; then
    while read -r kind name; do
      [ "$kind" = netns ] && ip netns del "$name" 2>/dev/null || true
    done < "$state/manifest"
  fi
  rm -rf "$state"
}

up() {
  [ -n "$dims" ] || { echo "netns-torus.sh: up needs DIMS, e.g. 3x3x3 or 4x4" >&2; exit 2; }
  IFS=x read -r X Y Z <<< "$dims"
  Z=${Z:-1}
  for v in "$X" "$Y" "$Z"; do
    case "$v" in ''|*[!0-9]*) echo "netns-torus.sh: malformed DIMS $dims (expected XxYxZ)" >&2; exit 2 ;; esac
    [ "$v" -ge 1 ] || { echo "netns-torus.sh: DIMS $dims: each axis at least 1" >&2; exit 2; }
  done
  n=$((X * Y * Z))
  [ $n -le 512 ] || { echo "netns-torus.sh: $n servers is more than this machine should hold (512)" >&2; exit 2; }
  [ "$mtu" -ge 576 ] && [ "$mtu" -le 9000 ] || { echo "netns-torus.sh: --mtu is 576..9000" >&2; exit 2; }
  down
  mkdir -p "$state"
  echo "$X $Y $Z $mtu" > "$state/dims"
  ns() { echo "$prefix-$1-$2-$3"; }
  for ((z = 0; z < Z; z++)); do for ((y = 0; y < Y; y++)); do for ((x = 0; x < X; x++)); do
    name=$(ns $x $y $z)
    ip netns add "$name"
    echo "netns $name" >> "$state/manifest"
    ip -n "$name" link set lo up
  done; done; done
  # One veth pair per link: the + side of each server to the - side of its neighbour.
  for ((z = 0; z < Z; z++)); do for ((y = 0; y < Y; y++)); do for ((x = 0; x < X; x++)); do
    a=$(ns $x $y $z)
    [ "$X" -ge 2 ] && ip -n "$a" link add px mtu "$mtu" type veth peer name mx netns "$(ns $(((x + 1) % X)) $y $z)" mtu "$mtu"
    [ "$Y" -ge 2 ] && ip -n "$a" link add py mtu "$mtu" type veth peer name my netns "$(ns $x $(((y + 1) % Y)) $z)" mtu "$mtu"
    [ "$Z" -ge 2 ] && ip -n "$a" link add pz mtu "$mtu" type veth peer name mz netns "$(ns $x $y $(((z + 1) % Z)))" mtu "$mtu"
    true
  done; done; done
  if [ $front = 1 ]; then
    ip netns add "$prefix-front"
    echo "netns $prefix-front" >> "$state/manifest"
    ip -n "$prefix-front" link set lo up
    ip -n "$prefix-front" link add br0 type bridge
    ip -n "$prefix-front" addr add 10.88.255.254/16 dev br0
    ip -n "$prefix-front" link set br0 up
  fi
  idx=0
  for ((z = 0; z < Z; z++)); do for ((y = 0; y < Y; y++)); do for ((x = 0; x < X; x++)); do
    name=$(ns $x $y $z)
    if [ $front = 1 ]; then
      ip -n "$name" link add front type veth peer name "f$idx" netns "$prefix-front"
      ip -n "$name" addr add "10.88.$((idx / 250)).$((idx % 250 + 1))/16" dev front
      ip -n "$name" link set front up
      ip -n "$prefix-front" link set "f$idx" master br0 up
    fi
    f="$state/$x-$y-$z.toml"
    # 64 MiB of UMEM per server (128 MiB with jumbo frames), touched only as frames arrive:
    # every link's fill ring (2048 chunks) stocked, with room beside, while 54 daemons share
    # two cores. With 4096 a gateway gathering a 15 MB multi-get found a ring empty and lost
    # 1,500-1,800 frames each time (rx_fill_ring_empty), repaired by retransmission: get_many
    # took 1-2.6 s instead of 0.1 s (docs/transport.md).
    chunks=16384
    [ "$mtu" -gt 3000 ] && chunks=32768
    {
      echo "# Node file of server $x,$y,$z (namespace $name), read by torusd and torusctl daemon."
      echo "# No coord: the control process assigns it from the origin and the wiring plan."
      echo "name = \"$name\""
      echo "dims = \"${X}x${Y}x${Z}\""
      echo "mtu = $mtu"
      echo "polling = \"$polling\""
      echo "umem_chunks = $chunks"
      echo "socket = \"$state/$x-$y-$z.sock\""
      echo "# Prometheus metrics on the namespace's own loopback (curl from inside it)."
      echo "metrics = \"127.0.0.1:9464\""
      for d in px:+x mx:-x py:+y my:-y pz:+z mz:-z; do
        ifname=${d%%:*}
        if ip -n "$name" link show "$ifname" >/dev/null 2>&1; then
          ip -n "$name" link set "$ifname" up
          printf '\n[[link]]\nifname = "%s"\ndir = "%s"\n' "$ifname" "${d#*:}"
        fi
      done
      printf '\n[control]\nnode_id = %d\norigin = %s\n' "$idx" "$([ $idx = 0 ] && echo true || echo false)"
      echo "state_file = \"$state/$x-$y-$z.coord\""
      echo "socket = \"$state/$x-$y-$z-control.sock\""
      echo "metrics = \"127.0.0.1:9465\""
      [ -n "$key" ] && echo "key = \"$key\""
      if [ $front = 1 ] || [ ${#kvlines[@]} -gt 0 ]; then
        printf '\n[kv]\n'
        [ $front = 1 ] && echo 'listen = "0.0.0.0:11211"'
        for l in "${kvlines[@]}"; do echo "$l"; done
      fi
      if [ ${#routinglines[@]} -gt 0 ]; then
        printf '\n[routing]\n'
        for l in "${routinglines[@]}"; do echo "$l"; done
      fi
      if [ ${#dataplanelines[@]} -gt 0 ]; then
        printf '\n[dataplane]\n'
        for l in "${dataplanelines[@]}"; do echo "$l"; done
      fi
    } > "$f"
    idx=$((idx + 1))
  done; done; done
  pairs=$(ip -all netns exec ip -o link show type veth 2>/dev/null | grep -c '^[0-9]' || true)
  echo "netns-torus: $n servers in namespaces $prefix-X-Y-Z, $((pairs / 2)) veth pairs, MTU $mtu; node files in $state"
}

start() {
  [ -f "$state/dims" ] || { echo "netns-torus.sh: no torus with prefix $prefix (run up first)" >&2; exit 2; }
  [ -x "$bin/torusd" ] && [ -x "$bin/torusctl" ] || { echo "netns-torus.sh: build first (cargo build --release)" >&2; exit 2; }
  mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true
  for f in "$state"/*-*-*.toml; do
    base=${f%.toml}
    name=$(sed -n 's/^name = "\(.*\)"/\1/p' "$f")
    ip netns exec "$name" "$bin/torusctl" daemon --config "$f" > "$base-control.log" 2>&1 &
    echo $! >> "$state/pids"
    ip netns exec "$name" "$bin/torusd" --config "$f" > "$base-torusd.log" 2>&1 &
    echo $! >> "$state/pids"
  done
  echo "netns-torus: started $(wc -l < "$state/pids") daemons (logs in $state)"
}

case "$cmd" in
  up) up ;;
  start) start ;;
  stop) stop_daemons ;;
  down) down ;;
  list) [ -f "$state/manifest" ] && cat "$state/manifest"; ls "$state" 2>/dev/null || true ;;
  *) sed -n '2,10p' "$0" >&2; exit 2 ;;
esac
