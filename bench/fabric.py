#!/usr/bin/env python3
"""The fabric's many-to-one and shared-link figures on real daemons, the congestion controller
off and on in the same run (`torusctl congestion`, every server switched between rounds),
rounds alternating off/on, medians with the spread. Run by bench/fabric.sh on a 3x3x3
namespace torus it made (prefix P, memcached gateways on the front network):

  incast     26 servers each send a checked 20 MB transfer (torusctl bench) to 1,1,1 at once:
             aggregate goodput, data frames retransmitted, receiver's duplicates, frames lost
             at receive rings
  shared     64 B reliable pings and a 400 MB bulk flow on one 2-hop path (0,0,0 -> 1,1,0):
             ping p50/p99 alone and beside the flow, the flow's rate alone and beside them
  multiget   pymemcache writes 300 values of 1 B-200 KB (15 MB) through 0,0,0's gateway and
             reads them through 1,1,1's one get at a time and in one get_many

  fabric.py PREFIX ROUNDS OUT.json
"""

import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTL = os.path.join(ROOT, "target/release/torusctl")
ALL = [(x, y, z) for z in range(3) for y in range(3) for x in range(3)]


def sock(prefix, c):
    return f"/run/torusnet/{prefix}/{c[0]}-{c[1]}-{c[2]}.sock"


def ctl(*args, timeout=600):
    r = subprocess.run([CTL, *args], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"torusctl {' '.join(args)}: {(r.stderr or r.stdout).strip()[-300:]}")
    return json.loads(r.stdout)


def status(prefix, c):
    return ctl("status", "--json", "--socket", sock(prefix, c))["dataplane"]


def congestion(prefix, on):
    for c in ALL:
        v = ctl("congestion", "--socket", sock(prefix, c), "on" if on else "off")
        if v.get("congestion") != on:
            raise RuntimeError(f"{c}: congestion switch answered {v}")


def totals(prefix):
    """Data frames, retransmitted frames and frames lost at receive rings, all servers."""
    data = retx = lost = 0
    for c in ALL:
        s = status(prefix, c)
        t = s["engine"]["transport"]
        data += t["data_frames"]
        retx += t["retransmitted_frames"]
        lost += sum(l["xsk"]["rx_dropped"] for l in s["links"])
    return data, retx, lost


def incast(prefix):
    dest = (1, 1, 1)
    before = totals(prefix)
    dup0 = status(prefix, dest)["engine"]["transport"]["duplicate_frames"]
    t0 = time.monotonic()
    procs = [subprocess.Popen([CTL, "bench", "--socket", sock(prefix, c), "--to", "1,1,1",
                               "--bytes", "20000000", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in ALL if c != dest]
    outs = [p.communicate(timeout=600) for p in procs]
    elapsed = time.monotonic() - t0
    exact = 0
    for out, _ in outs:
        try:
            v = json.loads(out)
            exact += bool(v["receiver"]["verified"]) and v["receiver"]["corrupted"] == 0
        except (ValueError, KeyError, TypeError):
            pass
    after = totals(prefix)
    dup = status(prefix, dest)["engine"]["transport"]["duplicate_frames"] - dup0
    data, retx, lost = (a - b for a, b in zip(after, before))
    return {"gbps": 26 * 20e6 * 8 / elapsed / 1e9, "retransmitted_pct": 100 * retx / max(data, 1),
            "duplicates_at_receiver": dup, "retransmitted": retx, "lost_at_rings": lost,
            "byte_exact": exact}


def ping(prefix, c, to):
    v = ctl("ping", "--socket", sock(prefix, c), "--to", to, "--count", "3000", "--reliable",
            "--json")
    return v["rtt_us"]["p50"], v["rtt_us"]["p99"]


def shared(prefix):
    src = (0, 0, 0)
    alone = ping(prefix, src, "1,1,0")
    solo = ctl("bench", "--socket", sock(prefix, src), "--to", "1,1,0", "--bytes", "400000000",
               "--json")["goodput_gbps"]
    bulk = subprocess.Popen([CTL, "bench", "--socket", sock(prefix, src), "--to", "1,1,0",
                             "--bytes", "400000000", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    beside = ping(prefix, src, "1,1,0")
    out, _ = bulk.communicate(timeout=600)
    with_pings = json.loads(out)["goodput_gbps"]
    return {"rpc_p50_alone_us": alone[0], "rpc_p99_alone_us": alone[1],
            "rpc_p50_beside_us": beside[0], "rpc_p99_beside_us": beside[1],
            "rpc_p99_ratio": beside[1] / alone[1],
            "bulk_alone_gbps": solo, "bulk_beside_gbps": with_pings,
            "bulk_ratio": with_pings / solo}


def front(c):
    i = c[0] + 3 * (c[1] + 3 * c[2])
    return f"10.88.{i // 250}.{i % 250 + 1}"


def multiget(prefix, k):
    r = subprocess.run(["ip", "netns", "exec", f"{prefix}-front", "python3",
                        os.path.join(ROOT, "scripts/kvcheck.py"), "multiget", front((0, 0, 0)),
                        front((1, 1, 1)), f"fabric-{k}-{os.getpid()}", "300"],
                       capture_output=True, text=True, timeout=600)
    v = json.loads(r.stdout.strip().splitlines()[-1])
    h = v["hosts"][0]
    return {"singles_s": h.get("singles_s"), "get_many_s": h.get("get_many_s"),
            "ratio": h.get("ratio"), "wrong_or_missing": h["wrong_or_missing"],
            "error": h.get("error")}


def summary(rows, key):
    xs = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": len(xs)}


def main(argv):
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    prefix, rounds, out = argv[1], int(argv[2]), argv[3]
    runs = {name: {"off": [], "on": []} for name in ("incast", "shared", "multiget")}
    for k in range(rounds):
        for on in (False, True):
            mode = "on" if on else "off"
            congestion(prefix, on)
            runs["incast"][mode].append(incast(prefix))
            runs["shared"][mode].append(shared(prefix))
            runs["multiget"][mode].append(multiget(prefix, f"{k}-{mode}"))
            print(f"fabric: round {k + 1}/{rounds}, controller {mode}: "
                  f"incast {runs['incast'][mode][-1]['gbps']:.2f} Gb/s, "
                  f"{runs['incast'][mode][-1]['retransmitted_pct']:.1f}% retransmitted; "
                  f"RPC p99 beside bulk {runs['shared'][mode][-1]['rpc_p99_beside_us']:.0f} us; "
                  f"get_many {runs['multiget'][mode][-1]['get_many_s']:.2f} s", flush=True)
    congestion(prefix, False)
    keys = {"incast": ["gbps", "retransmitted_pct", "duplicates_at_receiver", "lost_at_rings"],
            "shared": ["rpc_p50_alone_us", "rpc_p99_alone_us", "rpc_p50_beside_us",
                       "rpc_p99_beside_us", "rpc_p99_ratio", "bulk_alone_gbps", "bulk_ratio"],
            "multiget": ["singles_s", "get_many_s", "ratio"]}
    report = {"rounds": rounds, "runs": runs,
              "medians": {name: {mode: {k: summary(runs[name][mode], k) for k in ks}
                                 for mode in ("off", "on")} for name, ks in keys.items()}}
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\n{'figure':<40} {'off: median (min-max)':>26} {'on: median (min-max)':>26}")
    for name, ks in keys.items():
        for k in ks:
            cells = []
            for mode in ("off", "on"):
                s = report["medians"][name][mode][k]
                cells.append("-" if s is None else
                             f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})")
            print(f"{name + ' ' + k:<40} {cells[0]:>26} {cells[1]:>26}")
    bad = sum(r["wrong_or_missing"] + bool(r["error"]) for m in runs["multiget"].values()
              for r in m) + sum(26 - r["byte_exact"] for m in runs["incast"].values() for r in m)
    print(f"\nfabric: {bad} transfers or values not byte-exact; written {out}")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
