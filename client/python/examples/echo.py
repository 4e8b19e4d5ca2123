#!/usr/bin/env python3
"""Echo in Python over torusnet.

    echo.py server SOCKET NAME           echo every message and answer every request
    echo.py client SOCKET NAME COUNT     find NAME, send COUNT checked reliable messages and
                                         COUNT short ones, make a call; print one JSON line;
                                         exit 0 when every reliable echo came back intact
"""
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torusnet  # noqa: E402


def payload(i, n):
    out = b""
    k = 0
    while len(out) < n:
        out += hashlib.sha256(f"{i}:{k}".encode()).digest()
        k += 1
    return out[:n]


def server(sock, name):
    with torusnet.Client(sock, name) as c:
        while True:
            ev = c.serve(lambda frm, data: data, timeout=1.0)
            if ev is not None and ev.kind == torusnet.MESSAGE:
                while True:
                    try:
                        c.send(ev.frm, ev.data, reliable=ev.reliable)
                        break
                    except torusnet.WouldBlock:
                        time.sleep(0.0001)


def client(sock, name, count):
    with torusnet.Client(sock, f"{name}-py-client-{os.getpid()}") as c:
        at = c.resolve(name)
        if not at:
            print(f"{name} not found", file=sys.stderr)
            return 1
        dest = at[0]
        ok = bad = short_back = 0
        t0 = time.monotonic()
        for i in range(count):
            msg = payload(i, 16 + (i * 7919) % 60000)
            c.send(dest, msg)
            while True:
                ev = c.recv(3.0)
                if ev is None:
                    bad += 1
                    break
                if ev.kind != torusnet.MESSAGE:
                    continue
                if ev.data == msg:
                    ok += 1
                else:
                    bad += 1
                break
        rtt = (time.monotonic() - t0) / max(count, 1) * 1e6
        for i in range(count):
            msg = payload(1000000 + i, 64)
            c.send(dest, msg, reliable=False)
            ev = c.recv(0.2)
            if ev is not None and ev.kind == torusnet.MESSAGE and ev.data == msg:
                short_back += 1
        reply = c.call(dest, b"ping from Python", timeout=3.0)
        call_ok = reply == b"ping from Python"
        print(json.dumps({"lang": "python", "server": list(dest[:3]), "reliable_ok": ok,
                          "reliable_bad": bad, "short_back": short_back, "count": count,
                          "call_ok": call_ok, "rtt_us": round(rtt, 1)}))
        return 0 if ok == count and call_ok else 1


if __name__ == "__main__":
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    mode, sock, name = sys.argv[1:4]
    if mode == "server":
        server(sock, name)
    else:
        sys.exit(client(sock, name, int(sys.argv[4]) if len(sys.argv) > 4 else 10))
