#!/usr/bin/env bash
# The kernel's own IP forwarding on a torus of namespaces made by `netns-torus.sh up` (with no
# daemons started): the baseline of IP over the torus, on the same veth links.
#
#   kernel-ip.sh up [--prefix P]      server i gets 10.78.i/250.i%250+1 on lo; every other
#                                     server is routed over the first hop of a shortest path
#                                     (dimension order, the shorter way round each ring);
#                                     ip_forward on, reverse-path filtering off
#
# Removed with the namespaces (`netns-torus.sh down`).
set -euo pipefail
cmd=${1:-}
shift || true
prefix=tn
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
    *) echo "kernel-ip.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "$cmd" = up ] || { sed -n '2,11p' "$0" >&2; exit 2; }
state=/run/torusnet/$prefix
[ -f "$state/dims" ] || { echo "kernel-ip.sh: no torus with prefix $prefix" >&2; exit 2; }
read -r X Y Z _ < "$state/dims"
addr() { local i=$(($1 + X * ($2 + Y * $3))); echo "10.78.$((i / 250)).$((i % 250 + 1))"; }
# The direction of the first hop from a to b along one ring of size n: 1 (+) or -1 (-).
step() {
  local a=$1 b=$2 n=$3
  local fwd=$(((b - a + n) % n))
  if [ $((2 * fwd)) -le "$n" ]; then echo 1; else echo -1; fi
}
dev() { [ "$1" = 1 ] && echo "p$2" || echo "m$2"; }
for ((z = 0; z < Z; z++)); do for ((y = 0; y < Y; y++)); do for ((x = 0; x < X; x++)); do
  ns="$prefix-$x-$y-$z"
  me=$(addr $x $y $z)
  batch=$(mktemp)
  {
    echo "addr add $me/32 dev lo"
    for ((c = 0; c < Z; c++)); do for ((b = 0; b < Y; b++)); do for ((a = 0; a < X; a++)); do
      [ "$a$b$c" = "$x$y$z" ] && continue
      # Dimension order: fix x first, then y, then z.
      if [ "$a" != "$x" ]; then s=$(step $x $a $X); d=$(dev $s x); hop=$(addr $(((x + s + X) % X)) $y $z)
      elif [ "$b" != "$y" ]; then s=$(step $y $b $Y); d=$(dev $s y); hop=$(addr $x $(((y + s + Y) % Y)) $z)
      else s=$(step $z $c $Z); d=$(dev $s z); hop=$(addr $x $y $(((z + s + Z) % Z)))
      fi
      echo "route add $(addr $a $b $c)/32 via $hop dev $d onlink src $me"
    done; done; done
  } > "$batch"
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
  for i in $(ip -n "$ns" -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do
    ip netns exec "$ns" sysctl -qw "net.ipv4.conf.$i.rp_filter=0" 2>/dev/null || true
  done
  ip -n "$ns" -batch "$batch"
  rm -f "$batch"
done; done; done
echo "kernel-ip: ${X}x${Y}x${Z} servers at 10.78.0.1.., routed by the kernel over the torus links"
