#!/usr/bin/env bash
# The main job. Today it exercises the sans-IO core on a 3x3x3 torus through torusctl:
# where keys live, how they fail over when a server dies, and which links lead where.
# (The namespace torus with live traffic replaces this as the dataplane lands.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --workspace --quiet
T=target/release/torusctl
DIMS=3x3x3

field() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

echo "== torusnet on a $DIMS torus (offline core) =="
echo
echo "-- keys: root and two replicas (GetServersForKey(key, 3)) --"
for k in alpha bravo charlie delta echo; do
  $T key --dims $DIMS --replicas 3 "$k" |
    field "'  %-8s routing key %s  home %s  index %2d  servers %s' % ('$k', d['routing_key'], tuple(d['home']), d['index'], [tuple(s) for s in d['servers']])"
done
echo
home=$($T key --dims $DIMS alpha | field "','.join(map(str, d['home']))")
echo "-- server $home fails: alpha's keys fail over along its candidate sequence --"
$T key --dims $DIMS --replicas 3 --down "$home" alpha |
  field "'  alpha now rooted at %s, replicas %s' % (tuple(d['servers'][0]), [tuple(s) for s in d['servers'][1:]])"
echo
echo "-- routes from 0,0,0: distance and next-hop set --"
for to in 1,0,0 1,1,0 1,1,1 2,2,2; do
  $T route --dims $DIMS --from 0,0,0 --to $to |
    field "'  to %-7s %d hops via %s' % ('$to', d['distance'], ' '.join(d['next_hops']))"
done
echo "-- the same with link 0,0,0:+x and server 1,1,0 down --"
for to in 1,0,0 1,1,0 1,1,1; do
  $T route --dims $DIMS --from 0,0,0 --to $to --down-link 0,0,0:+x --down 1,1,0 |
    field "'  to %-7s %s' % ('$to', 'unreachable' if d['distance'] is None else '%d hops via %s' % (d['distance'], ' '.join(d['next_hops'])))"
done
echo
echo "-- routing table speed (16x16x16, cached next-hop query vs a fresh search) --"
target/release/torus-bench route --changes 5 --queries 100000
