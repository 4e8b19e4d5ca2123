#!/usr/bin/env python3
"""A register workload on torusnet's key-value store through its memcached gateways, with
pymemcache (a client nobody here wrote), judged for linearizability by a Wing-Gong search.

  kvlin.py HOSTS KEYS CLIENTS SECONDS [SEED]

CLIENTS threads, client i talking to gateway HOSTS[i % n] (comma-separated), each doing
sets of unique values and gets on KEYS keys for SECONDS. Every operation is recorded with
the time it was invoked and the time its answer came. An operation without an answer (a
timeout, an error, a dropped connection) is indeterminate: a set may have taken effect at
any moment after it was invoked, or never; a get without an answer says nothing and is left
out. The history of each key must then be linearizable as one register (Wing and Gong's
search, with Lowe's memoisation of (operations done, value) states): some order of the
operations, each placed between its invocation and its answer, in which every get returns
the value of the last set before it.

Prints one JSON line: operations per kind and outcome, per-key history sizes, and
"linearizable": true, or false with the operations of one key around the point no order of
them gets past (the violation).
Exit status 0 when linearizable.
"""

import json
import os
import random
import sys
import threading
import time

from pymemcache.client.base import Client

INF = float("inf")
# States the search may visit per key before it gives up and says so (a history this
# tangled is a finding of its own).
MAX_STATES = 3_000_000


def client(host):
    return Client((host, 11211), connect_timeout=3, timeout=4)


def worker(i, hosts, keys, until, seed, out):
    rng = random.Random(seed * 1000 + i)
    host = hosts[i % len(hosts)]
    c = client(host)
    n = 0
    while time.monotonic() < until:
        key = rng.choice(keys)
        if rng.random() < 0.5:
            n += 1
            val = f"c{i}-{n}"
            op = {"client": i, "key": key, "kind": "set", "value": val, "host": host}
            op["invoke"] = time.monotonic()
            try:
                ok = c.set(key, val.encode(), noreply=False)
                op["response"] = time.monotonic()
                op["ok"] = bool(ok)
                if not ok:
                    op["response"] = INF
            except Exception as e:  # a timeout or an error: indeterminate
                op["response"] = INF
                op["ok"] = False
                op["error"] = type(e).__name__
                c = client(host)
        else:
            op = {"client": i, "key": key, "kind": "get", "host": host}
            op["invoke"] = time.monotonic()
            try:
                v = c.get(key)
                op["response"] = time.monotonic()
                op["value"] = None if v is None else v.decode()
                op["ok"] = True
            except Exception as e:
                op["response"] = INF
                op["ok"] = False
                op["error"] = type(e).__name__
                c = client(host)
        out.append(op)


def relevant(ops):
    """The operations the search needs: gets with an answer, sets with an answer, and sets
    without one whose value some get returned. A set without an answer that nobody read can
    always be taken as never having happened (placing it only adds constraints), and leaving
    such sets out keeps the search small when faults leave hundreds of them."""
    read = {o["value"] for o in ops if o["kind"] == "get" and o["ok"]}
    return [o for o in ops
            if (o["kind"] == "get" and o["ok"])
            or (o["kind"] == "set" and (o["response"] != INF or o["value"] in read))]


def linearizable(ops):
    """Wing-Gong search over one key's operations (gets without an answer left out), with
    Lowe's memoisation. A state is (i, placed, value): every operation before the i-th (by
    invocation) is placed or dropped, `placed` marks those after it already placed, `value`
    is the register's. An operation may go next when it was invoked before every unplaced
    operation with an answer had answered; a set without an answer may also be dropped (it
    never took effect) once it is the first unplaced. Returns (True, None), or (False, i) with
    the furthest i any order reached; (None, i) when the search gave up."""
    ops = sorted(relevant(ops), key=lambda o: o["invoke"])
    n = len(ops)
    inv = [o["invoke"] for o in ops]
    resp = [o["response"] for o in ops]

    def advance(i, placed):
        while placed & 1:
            placed >>= 1
            i += 1
        return i, placed

    seen = set()
    stack = [(0, 0, None)]
    furthest = 0
    while stack:
        if len(seen) > MAX_STATES:
            return None, furthest
        i, placed, val = stack.pop()
        furthest = max(furthest, i)
        if i == n:
            return True, None
        # The unplaced operations invoked before the earliest answer among them.
        m = INF
        cands = []
        j = i
        while j < n and inv[j] <= m:
            if not placed >> (j - i) & 1:
                cands.append(j)
                m = min(m, resp[j])
            j += 1
        nexts = []
        for j in cands:
            if inv[j] > m:
                continue
            o = ops[j]
            if o["kind"] == "get":
                if o["value"] != val:
                    continue
                nv = val
            else:
                nv = o["value"]
            ni, np = advance(i, placed | 1 << (j - i))
            nexts.append((resp[j], (ni, np, nv)))
        if resp[i] == INF:
            ni, np = advance(i, placed | 1)
            nexts.append((INF, (ni, np, val)))
        # The earliest answer is tried first: a linearizable history goes straight through.
        for _, st in sorted(nexts, key=lambda x: x[0], reverse=True):
            if st not in seen:
                seen.add(st)
                stack.append(st)
    return False, furthest


def stuck_window(ops, at):
    """The operations around the point no order got past: a few placed before it and those
    concurrent with it."""
    ops = sorted(relevant(ops), key=lambda o: o["invoke"])
    return ops[max(0, at - 6):at + 10]


def main():
    hosts = sys.argv[1].split(",")
    keys = [f"lin-{k}" for k in range(int(sys.argv[2]))]
    clients = int(sys.argv[3])
    seconds = float(sys.argv[4])
    seed = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    # Start from absent keys: a value left from an earlier run would read as a stale write.
    c = client(hosts[0])
    for k in keys:
        try:
            c.delete(k, noreply=False)
        except Exception:
            pass
    until = time.monotonic() + seconds
    history = []
    threads = [threading.Thread(target=worker, args=(i, hosts, keys, until, seed, history))
               for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counts = {}
    for o in history:
        outcome = "ok" if o["ok"] else ("indeterminate" if o["kind"] == "set" else "failed")
        k = f"{o['kind']}_{outcome}"
        counts[k] = counts.get(k, 0) + 1
    result = {"ops": len(history), "counts": counts, "keys": {}, "linearizable": True}
    # "linearizable": true, false (with "violation"), or null when a search gave up.
    for k in keys:
        ops = [o for o in history if o["key"] == k]
        good, at = linearizable(ops)
        result["keys"][k] = {"ops": len(ops), "linearizable": good}
        if good is None:
            if result["linearizable"] is True:
                result["linearizable"] = None
            continue
        if not good:
            result["linearizable"] = False
        if not good and "violation" not in result:
            w = stuck_window(ops, at)
            t0 = w[0]["invoke"]
            result["violation"] = {
                "key": k,
                "history": [
                    {"client": o["client"], "kind": o["kind"], "value": o.get("value"),
                     "host": o["host"], "invoke_ms": round((o["invoke"] - t0) * 1e3, 3),
                     "response_ms": None if o["response"] == INF
                     else round((o["response"] - t0) * 1e3, 3)}
                    for o in w
                ],
            }
    dump = os.environ.get("KVLIN_HISTORY")
    if dump:
        with open(dump, "w") as f:
            json.dump([{**o, "response": None if o["response"] == INF else o["response"]}
                       for o in history], f)
    print(json.dumps(result))
    return 0 if result["linearizable"] is True else 1


if __name__ == "__main__":
    sys.exit(main())
