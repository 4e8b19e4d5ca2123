#!/usr/bin/env python3
"""Checks torusnet's key-value store through its memcached gateways with pymemcache, a client
nobody here wrote. Values are derived from their keys (binary bytes, 1 B .. 8 KB), so any
reader can tell a byte-exact value from a wrong one.

  kvcheck.py write HOST PREFIX COUNT OUT       write COUNT keys through HOST; OUT lists the
                                               acknowledged ones
  kvcheck.py writeloop HOST PREFIX SECONDS OUT keep writing new keys for SECONDS (through a
                                               failure); OUT lists the acknowledged ones
  kvcheck.py read HOSTS KEYFILE...             read every listed key through every host
                                               (comma-separated); prints one JSON line
  kvcheck.py multiget WRITER HOSTS PREFIX COUNT
                                               write COUNT values of 1 B .. 200 KB through
                                               WRITER, then through each of HOSTS read them
                                               all one get at a time and in one get_many,
                                               timed and checked, then deletes them;
                                               prints one JSON line

Exit status 0 when every acknowledged key reads back byte-exact everywhere.
"""

import hashlib
import json
import sys
import time

from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheError


def value(key: str) -> bytes:
    h = hashlib.sha256(key.encode()).digest()
    n = 1 + int.from_bytes(h[:2], "little") % 8192
    out = bytearray()
    block = h
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:n])


def client(host: str) -> Client:
    return Client((host, 11211), connect_timeout=5, timeout=10)


def write(host: str, prefix: str, count: int, out: str) -> int:
    c = client(host)
    acked, failed = [], 0
    for i in range(count):
        k = f"{prefix}-{i}"
        try:
            if c.set(k, value(k), noreply=False):
                acked.append(k)
            else:
                failed += 1
        except (MemcacheError, OSError):
            failed += 1
            c = client(host)
    json.dump(acked, open(out, "w"))
    print(json.dumps({"written": len(acked), "failed": failed}))
    return 0


def writeloop(host: str, prefix: str, seconds: float, out: str) -> int:
    c = client(host)
    acked, failed, i = [], 0, 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        k = f"{prefix}-{i}"
        i += 1
        try:
            if c.set(k, value(k), noreply=False):
                acked.append(k)
            else:
                failed += 1
        except (MemcacheError, OSError):
            failed += 1
            c = client(host)
    json.dump(acked, open(out, "w"))
    print(json.dumps({"written": len(acked), "failed": failed}))
    return 0


def read(hosts: str, files: list) -> int:
    keys = []
    for f in files:
        keys += json.load(open(f))
    missing, wrong, errors, checked = 0, 0, 0, 0
    examples = []
    for host in hosts.split(","):
        c = client(host)
        for at in range(0, len(keys), 50):
            batch = keys[at:at + 50]
            try:
                got = c.get_many(batch)
            except (MemcacheError, OSError) as e:
                errors += 1
                examples.append(f"{host}: {e}")
                c = client(host)
                continue
            for k in batch:
                checked += 1
                v = got.get(k)
                if v is None:
                    missing += 1
                    if len(examples) < 5:
                        examples.append(f"{host}: {k} missing")
                elif v != value(k):
                    wrong += 1
                    if len(examples) < 5:
                        examples.append(f"{host}: {k} wrong")
    print(json.dumps({"hosts": len(hosts.split(",")), "keys": len(keys), "checked": checked,
                      "missing": missing, "wrong": wrong, "errors": errors,
                      "examples": examples}))
    return 0 if missing == wrong == errors == 0 else 1


def big_value(key: str, i: int, count: int) -> bytes:
    """Value i of count: 1 B .. 200 KB, cubically spread (most small, a few large), its bytes
    derived from the key."""
    n = max(1, int(204800 * (i / max(1, count - 1)) ** 3))
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (n // len(seed) + 1))[:n]


def multiget(writer: str, hosts: str, prefix: str, count: int) -> int:
    keys = [f"{prefix}-{i}" for i in range(count)]
    want = {k: big_value(k, i, count) for i, k in enumerate(keys)}
    c = Client((writer, 11211), connect_timeout=5, timeout=30)
    for k in keys:
        if not c.set(k, want[k], noreply=False):
            print(json.dumps({"error": f"set {k} refused"}))
            return 1
    c.close()
    out, ok = [], True
    for host in hosts.split(","):
        # pymemcache's own default timeout would cut a slow answer short: generous, so the
        # gateway's own deadline (SERVER_ERROR timed out) is what a slow multi-get meets.
        r = Client((host, 11211), connect_timeout=5, timeout=30)
        row = {"host": host, "keys": count, "bytes": sum(len(v) for v in want.values())}
        t0 = time.monotonic()
        bad = 0
        try:
            for k in keys:
                if r.get(k) != want[k]:
                    bad += 1
            row["singles_s"] = time.monotonic() - t0
            t0 = time.monotonic()
            got = r.get_many(keys)
            row["get_many_s"] = time.monotonic() - t0
            bad += sum(1 for k in keys if got.get(k) != want[k])
        except (MemcacheError, OSError) as e:
            row["error"] = str(e)
            ok = False
        row["wrong_or_missing"] = bad
        ok = ok and bad == 0
        if "get_many_s" in row:
            row["ratio"] = row["get_many_s"] / max(row["singles_s"], 1e-9)
        r.close()
        out.append(row)
    # Gone again, so the values take no part in what the caller checks next.
    c = Client((writer, 11211), connect_timeout=5, timeout=30)
    deleted = sum(1 for k in keys if c.delete(k, noreply=False))
    print(json.dumps({"ok": ok, "hosts": out, "deleted": deleted}))
    return 0 if ok else 1


def main(argv):
    if len(argv) >= 6 and argv[1] == "write":
        return write(argv[2], argv[3], int(argv[4]), argv[5])
    if len(argv) >= 6 and argv[1] == "writeloop":
        return writeloop(argv[2], argv[3], float(argv[4]), argv[5])
    if len(argv) >= 6 and argv[1] == "multiget":
        return multiget(argv[2], argv[3], argv[4], int(argv[5]))
    if len(argv) >= 4 and argv[1] == "read":
        return read(argv[2], argv[3:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
