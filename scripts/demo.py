#!/usr/bin/env python3
"""The main job's workload on a running namespace torus (scripts/demo.sh sets it up and
tears it down): convergence, coordinates, RTT over hops, key routing checked against
`torusctl key`, a striped bulk transfer, and the same under a link cut and a server kill."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

PREFIX = sys.argv[1] if len(sys.argv) > 1 else "tn"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTL = os.path.join(ROOT, "target/release/torusctl")
STATE = f"/run/torusnet/{PREFIX}"
DIMS = (3, 3, 3)
ALL = [(x, y, z) for z in range(3) for y in range(3) for x in range(3)]


def s(c):
    return ",".join(map(str, c))


def ask(c, req, control=False, timeout=600):
    path = f"{STATE}/{c[0]}-{c[1]}-{c[2]}{'-control' if control else ''}.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as so:
        so.settimeout(timeout)
        so.connect(path)
        so.sendall((json.dumps(req) + "\n").encode())
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = so.recv(65536)
            if not chunk:
                break
            buf += chunk
    v = json.loads(buf)
    if isinstance(v, dict) and "error" in v:
        raise RuntimeError(f"{s(c)}: {v['error']}")
    return v


def try_ask(c, req, control=False):
    try:
        return ask(c, req, control, timeout=5)
    except (OSError, RuntimeError, ValueError):
        return None


def torusctl(*args):
    out = subprocess.run([CTL, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def converge(live, skip=(), limit=60):
    t0 = time.time()
    while time.time() - t0 < limit:
        ok = True
        for c in ALL:
            if c in skip:
                continue
            v = try_ask(c, {"cmd": "status"}, control=True)
            if not v or v.get("reachable") != live or v.get("published_version") != v.get("view_version"):
                ok = False
                break
        if ok:
            return time.time() - t0
        time.sleep(0.05)
    raise SystemExit("the control plane did not converge in time")


def section(title):
    print(f"\n== {title}")


def torusd_pids(c):
    pids = subprocess.run(["ip", "netns", "pids", f"{PREFIX}-{c[0]}-{c[1]}-{c[2]}"],
                          capture_output=True, text=True).stdout.split()
    out = []
    for p in pids:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if b"/torusd" in f.read():
                    out.append(int(p))
        except OSError:
            pass
    return out


def restart_torusd(src):
    """Kills one server's dataplane (SIGKILL) under a transfer to it, starts it again, and
    shows what its peers see: a failure report, not a hang; a new incarnation serving within
    a fraction of a second; a re-send that arrives whole."""
    victim = (1, 1, 0)
    section(f"torusd on {s(victim)} killed (SIGKILL) under a transfer to it, and started again")
    before = ask(victim, {"cmd": "status"})["incarnation"]
    result = {}

    def run():
        try:
            result["r"] = ask(src, {"cmd": "bench", "to": s(victim), "bytes": 2_000_000_000,
                                    "size": 65536, "timeout_ms": 60000})
        except RuntimeError as e:
            result["e"] = str(e)

    th = threading.Thread(target=run)
    th.start()
    time.sleep(0.4)
    for p in torusd_pids(victim):
        os.kill(p, 9)
    while torusd_pids(victim):
        time.sleep(0.01)
    node = f"{STATE}/{victim[0]}-{victim[1]}-{victim[2]}"
    with open(f"{node}-torusd.log", "a") as log:
        proc = subprocess.Popen(["ip", "netns", "exec", f"{PREFIX}-{victim[0]}-{victim[1]}-{victim[2]}",
                                 os.path.join(ROOT, "target/release/torusd"), "--config", f"{node}.toml"],
                                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    with open(f"{STATE}/pids", "a") as f:
        f.write(f"{proc.pid}\n")
    t0 = time.time()
    th.join()
    print(f"   the sender was told: {result.get('e', 'finished before the kill')}")
    while True:
        r = try_ask((1, 0, 0), {"cmd": "ping", "to": s(victim), "count": 1, "timeout_ms": 300})
        if r and r["received"] == 1:
            break
        if time.time() - t0 > 15:
            print("   the restarted torusd did not answer in 15 s")
            return
        time.sleep(0.01)
    took = time.time() - t0
    after = ask(victim, {"cmd": "status"})["incarnation"]
    print(f"   restarted torusd answers pings {took * 1000:.0f} ms after its start "
          f"(incarnation {before[:8]}.. -> {after[:8]}..; it asked its control process for the view)")
    r = ask(src, {"cmd": "bench", "to": s(victim), "bytes": 50_000_000, "size": 65536})
    rx = r["receiver"]
    print(f"   re-sent: {rx['delivered']} of {r['messages']} messages, {rx['duplicated']} duplicated, "
          f"checksums {'match' if rx['checksum'] == r['sender_checksum'] else 'DIFFER'}")
    t = ask(src, {"cmd": "status"})["engine"]["transport"]
    print(f"   0,0,0's transport: {t['resets']} connection resets, {t['failed_messages']} messages "
          f"reported failed, {t['stale_frames']} stale frames dropped")


def applications():
    """Applications in their own processes: an echo server in Rust on 2,2,2 found by name
    from a Python application on 0,0,0, which sends it checked messages and a call."""
    section("applications in their own processes: Python on 0,0,0 finds \"demo-echo\" (Rust, on 2,2,2) by name")
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(ROOT, "target/release"))
    with open(f"{STATE}/2-2-2-demo-echo.log", "w") as log:
        srv = subprocess.Popen(["ip", "netns", "exec", f"{PREFIX}-2-2-2",
                                os.path.join(ROOT, "target/release/examples/echo_server"),
                                f"{STATE}/2-2-2-apps.sock", "demo-echo"],
                               stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
    with open(f"{STATE}/pids", "a") as f:
        f.write(f"{srv.pid}\n")
    out = None
    for _ in range(50):
        r = subprocess.run(["ip", "netns", "exec", f"{PREFIX}-0-0-0", "python3",
                            os.path.join(ROOT, "client/python/examples/echo.py"), "client",
                            f"{STATE}/0-0-0-apps.sock", "demo-echo", "100"],
                           capture_output=True, text=True, env=env)
        if r.returncode == 0:
            out = json.loads(r.stdout.strip().splitlines()[-1])
            break
        time.sleep(0.2)
    srv.kill()
    srv.wait()
    if out is None:
        print("   the Python client did not complete")
        return
    print(f"   found at {','.join(map(str, out['server']))}; {out['reliable_ok']} of {out['count']} reliable "
          f"messages (16 B to 60 KB) echoed byte-exact over 3 hops, {out['short_back']} of {out['count']} short "
          f"ones, a call answered: {out['call_ok']}")
    print("   (shared-memory channel to torusd, no syscall per message; C and Rust clients work the same way:"
          " docs/applications.md)")
    # The echo server has exited: a message to its address is refused at 2,2,2 and reported
    # to its sender, not lost.
    for _ in range(100):
        st = try_ask((2, 2, 2), {"cmd": "status"}) or {}
        if not any(a.get("name") == "demo-echo" for a in st.get("apps") or []):
            break
        time.sleep(0.05)
    late = (
        "import json, sys, time\n"
        f"sys.path.insert(0, {os.path.join(ROOT, 'client/python')!r})\n"
        "import torusnet\n"
        f"c = torusnet.Client({STATE + '/0-0-0-apps.sock'!r}, 'demo-late')\n"
        "t0 = time.time()\n"
        "tag = c.send(torusnet.Address(2, 2, 2, torusnet.service_id('demo-echo')), b'still there?')\n"
        "ev, seen = None, []\n"
        "while time.time() - t0 < 10:\n"
        "    ev = c.recv(0.5)\n"
        "    if ev is not None:\n"
        "        seen.append([ev.kind, ev.reason])\n"
        "    if ev is not None and ev.kind == torusnet.FAILED:\n"
        "        break\n"
        "ok = ev is not None and ev.kind == torusnet.FAILED and ev.tag == tag\n"
        "print(json.dumps({'ok': ok, 'reason': ev.reason if ok else None, 'ms': (time.time() - t0) * 1000,\n"
        "                  'events': seen}))\n"
    )
    r = subprocess.run(["ip", "netns", "exec", f"{PREFIX}-0-0-0", "python3", "-c", late],
                       capture_output=True, text=True, env=env, timeout=60)
    try:
        v = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        v = {"ok": False}
    if v.get("ok") and v.get("reason") == 6:
        print(f"   after demo-echo exited, a reliable message to it was reported failed to its sender "
              f"{v['ms']:.1f} ms after the send: no service at 2,2,2 takes it (reason NoService; nothing "
              f"vanishes)")
    else:
        print(f"   a message to the exited demo-echo was not reported as expected: {r.stdout.strip()[-200:]} "
              f"{r.stderr.strip()[-200:]}")


def slow_reader():
    """An application that stops reading: what does not fit its backlog is refused at its
    server and reported to the sender (ReceiverFull); the rest arrives when it reads again."""
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(ROOT, "target/release"))
    py = f"import json, sys, time\nsys.path.insert(0, {os.path.join(ROOT, 'client/python')!r})\nimport torusnet\n"
    slow = py + (
        f"c = torusnet.Client({STATE + '/2-2-2-apps.sock'!r}, 'demo-slow')\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "n, quiet = 0, time.time()\n"
        "while time.time() - quiet < 2:\n"
        "    ev = c.recv(0.2)\n"
        "    if ev is not None and ev.kind == torusnet.MESSAGE:\n"
        "        n, quiet = n + 1, time.time()\n"
        "print(json.dumps({'delivered': n}), flush=True)\n"
    )
    flood = py + (
        f"c = torusnet.Client({STATE + '/0-0-0-apps.sock'!r}, 'demo-flood')\n"
        "to = torusnet.Address(2, 2, 2, torusnet.service_id('demo-slow'))\n"
        "sent, refused, other, data = 0, 0, [], bytes(8000)\n"
        "def take(ev):\n"
        "    global refused\n"
        "    if ev is not None and ev.kind == torusnet.FAILED:\n"
        "        if ev.reason == torusnet.RECEIVER_FULL:\n"
        "            refused += 1\n"
        "        else:\n"
        "            other.append(ev.reason)\n"
        "t0 = time.time()\n"
        "while sent < 12000 and time.time() - t0 < 60:\n"
        "    try:\n"
        "        c.send(to, data)\n"
        "        sent += 1\n"
        "    except torusnet.WouldBlock:\n"
        "        take(c.recv(0.001))\n"
        "quiet = time.time()\n"
        "while time.time() - quiet < 2:\n"
        "    ev = c.recv(0.2)\n"
        "    if ev is not None:\n"
        "        take(ev)\n"
        "        quiet = time.time()\n"
        "print(json.dumps({'sent': sent, 'refused': refused, 'other': other}), flush=True)\n"
    )
    section("an application that stops reading: \"demo-slow\" on 2,2,2 is flooded from 0,0,0")
    srv = subprocess.Popen(["ip", "netns", "exec", f"{PREFIX}-2-2-2", "python3", "-c", slow],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True, env=env)
    with open(f"{STATE}/pids", "a") as f:
        f.write(f"{srv.pid}\n")
    try:
        if srv.stdout.readline().strip() != "ready":
            print("   demo-slow did not attach")
            return
        r = subprocess.run(["ip", "netns", "exec", f"{PREFIX}-0-0-0", "python3", "-c", flood],
                           capture_output=True, text=True, env=env, timeout=120)
        srv.stdin.write("read\n")
        srv.stdin.flush()
        out, _ = srv.communicate(timeout=120)
        f = json.loads(r.stdout.strip().splitlines()[-1])
        d = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError, subprocess.TimeoutExpired, OSError) as e:
        print(f"   the flood did not complete: {e}")
        srv.kill()
        return
    total = f["refused"] + d["delivered"]
    verdict = "none lost" if total == f["sent"] and not f["other"] else f"MISMATCH (other failures {f['other']})"
    print(f"   {f['sent']} reliable messages of 8000 B sent while it did not read: {f['refused']} refused at 2,2,2 "
          f"once its 64 MiB backlog was full and reported to the sender (reason ReceiverFull), "
          f"{d['delivered']} delivered when it read again: {total} of {f['sent']}, {verdict}")


def remote_memory():
    """One-sided remote memory between applications three hops apart."""
    section("remote memory: an application on 0,0,0 writes and reads a region of one on 2,2,2 (one-sided, 3 hops)")
    r = subprocess.run([os.path.join(ROOT, "target/release/examples/remote_memory"),
                        f"{STATE}/2-2-2-apps.sock", f"{STATE}/0-0-0-apps.sock"],
                       capture_output=True, text=True, timeout=120)
    try:
        v = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        print(f"   did not complete: {(r.stderr or r.stdout).strip()[-300:]}")
        return
    mib = v["bytes"] >> 20
    print(f"   {mib} MiB in 64 KiB remote writes at {v['write_gbps']} Gb/s, read back at {v['read_gbps']} Gb/s: "
          f"byte-exact {v['read_back_exact'] and v['owner_exact']}, owner's tripwire fired {v['tripwire']}")
    print(f"   refused: a guessed cookie -> \"{v['wrong_cookie']}\", a write with a read-only capability -> "
          f"\"{v['read_only_write']}\"; CLAN's message queue: {v['queue_messages']} checked messages at "
          f"{v['queue_per_s']:.0f}/s (docs/remote-memory.md)")
    if "long_bytes" in v:
        print(f"   long send (libRIPC): 2,2,2 offered {v['long_bytes'] >> 20} MiB, 0,0,0 pulled them with remote reads "
              f"into its own memory at {v['long_gbps']} Gb/s, byte-exact {v['long_exact']}, the sender told "
              f"{v['long_end']} (it did no work while they moved)")


def app_multicast():
    """The same from an application to applications: a 50 MB file from 0,0,0, written to
    files on the 26 others (client/examples/multicast.rs), compared byte for byte."""
    exe = os.path.join(ROOT, "target/release/examples/multicast")
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(ROOT, "target/release"))
    work = tempfile.mkdtemp(prefix="torusnet-demo-mcast-", dir=os.path.join(ROOT, "target"))
    procs = []
    try:
        src = os.path.join(work, "source")
        data = os.urandom(50_000_000)
        with open(src, "wb") as f:
            f.write(data)
        members = [c for c in ALL if c != (0, 0, 0)]
        for c in members:
            out = os.path.join(work, s(c).replace(",", "-"))
            os.mkdir(out)
            procs.append((c, out, subprocess.Popen(
                ["ip", "netns", "exec", f"{PREFIX}-{c[0]}-{c[1]}-{c[2]}", exe, "receive",
                 f"{STATE}/{c[0]}-{c[1]}-{c[2]}-apps.sock", "demo-files", out, "1"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)))
        deadline = time.time() + 30
        while not all(any(a["name"] == "demo-files" for a in ask(c, {"cmd": "status"})["apps"])
                      for c in members):
            if time.time() > deadline:
                print("   application multicast: the receivers did not attach")
                return
            time.sleep(0.1)
        r = subprocess.run(["ip", "netns", "exec", f"{PREFIX}-0-0-0", exe, "send",
                            f"{STATE}/0-0-0-apps.sock", "demo-files", src],
                           capture_output=True, text=True, env=env, timeout=300)
        rep = json.loads(r.stdout.strip().splitlines()[-1])
        exact, rss = 0, 0
        for c, out, p in procs:
            line = json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1])
            rss = max(rss, line["peak_rss_kb"])
            with open(os.path.join(out, line["id"]), "rb") as f:
                exact += f.read() == data
        print(f"   from an application: {rep['completed']} of 26 member applications have the 50 MB file "
              f"({exact} written byte-exact) after {rep['report']['elapsed_s']:.1f} s; "
              f"receivers' peak memory {rss / 1024:.0f} MB (docs/applications.md)")
    except (OSError, ValueError, KeyError, IndexError, subprocess.SubprocessError) as e:
        print(f"   application multicast: {e}")
    finally:
        for _, _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)


def on_path():
    """An application on the path: frames of its service crossing its server, held for its
    verdict (pass, change, drop, answer)."""
    section("on the path: an application on 1,0,0 and 0,1,0 sees its service's frames from 0,0,0 to 1,1,0")
    # Routing key 0x8000800000000000 has its root at 1,1,0: from 0,0,0 through 1,0,0 or 0,1,0.
    key = 0x8000800000000000
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(ROOT, "target/release"))
    procs = []
    for at in ("1-0-0", "0-1-0"):
        p = subprocess.Popen([os.path.join(ROOT, "target/release/examples/on_path"),
                              f"{STATE}/{at}-apps.sock", "demo-cache", "4"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        procs.append(p)
    ready = [p.stdout.readline() for p in procs]
    if not all("intercepting" in r for r in ready):
        for p in procs:
            p.kill()
            p.wait()
        print("   the interceptors did not start")
        return
    script = (
        "import json, sys, time\n"
        f"sys.path.insert(0, {os.path.join(ROOT, 'client/python')!r})\n"
        "import torusnet\n"
        f"sink = torusnet.Client({STATE + '/1-1-0-apps.sock'!r}, 'demo-cache')\n"
        f"c = torusnet.Client({STATE + '/0-0-0-apps.sock'!r}, 'demo-asker')\n"
        f"to = torusnet.Key({key}, sink.address.service)\n"
        "kinds = ['pass', 'change', 'drop', 'get', 'slow']\n"
        "for i in range(20):\n"
        "    for k in kinds:\n"
        "        c.send(to, f'{k}:{i}'.encode(), reliable=False, on_path=True)\n"
        "got, back = [], []\n"
        "t0 = time.time()\n"
        "while time.time() - t0 < 3 and (len(got) < 60 or len(back) < 20):\n"
        "    for cl, into in ((sink, got), (c, back)):\n"
        "        ev = cl.recv(0.02)\n"
        "        if ev is not None and ev.kind == torusnet.MESSAGE:\n"
        "            into.append(ev.data.decode())\n"
        "print(json.dumps({'got': got, 'back': back}))\n"
    )
    r = subprocess.run(["python3", "-c", script], capture_output=True, text=True, env=env,
                       timeout=60)
    summaries = []
    for p in procs:
        out, _ = p.communicate(timeout=30)
        try:
            summaries.append(json.loads(out.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            summaries.append({})
    try:
        v = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"   did not complete: {(r.stderr or r.stdout).strip()[-300:]}")
        return
    total = {k: sum(s.get(k, 0) for s in summaries) for k in ("passed", "changed", "dropped",
                                                                "answered", "left")}
    kinds = {k: sum(1 for m in v["got"] if m.startswith(k)) for k in ("pass", "changed", "slow",
                                                                       "drop", "get")}
    print(f"   100 short messages to the key on the path; the interceptors (Rust, client/examples/on_path.rs) "
          f"passed {total['passed']}, changed {total['changed']}, dropped {total['dropped']}, answered "
          f"{total['answered']}, left {total['left']} without a verdict")
    print(f"   1,1,0 received {kinds['pass']} as sent, {kinds['changed']} changed on the way, {kinds['slow']} "
          f"after the 20 ms deadline, {kinds['drop'] + kinds['get']} of the dropped or answered; the sender got "
          f"{len(v['back'])} answers from the path (docs/applications.md, \"On the path\")")


def trees():
    """Multicast over the six trees, and the word count merged on path (Camdoop)."""
    section("trees: 50 MB multicast from 0,0,0 to the 26 others; a word count merged on the way to 1,1,1")
    try:
        v = ask((0, 0, 0), {"cmd": "multicast", "generate": 50_000_000, "seed": 7})
    except (OSError, RuntimeError, ValueError) as e:
        v = {"error": str(e)}
    if "error" in v:
        print(f"   multicast: {v['error']}")
    else:
        print(f"   {v['completed']} of {v['members']} members hold all 50 MB (checksums match: "
              f"{not v['checksum_mismatch']}) after {v['elapsed_s']:.1f} s, over {v['trees']} trees of depth "
              f"{v['tree_depth']} sharing no link; min {v['min_member_gbps']:.2f} Gb/s per member")
    app_multicast()
    try:
        a = ask((1, 1, 1), {"cmd": "aggregate", "words": 300_000, "vocabulary": 20_000, "seed": 3})
    except (OSError, RuntimeError, ValueError) as e:
        a = {"error": str(e)}
    if "error" in a:
        print(f"   aggregate: {a['error']}")
    else:
        print(f"   word count over {a['servers']} servers: {a['keys']} words, {a['total']} in all; "
              f"{a['agg_link_bytes'] / 1e3:.0f} kB crossed links instead of {a['raw_link_bytes'] / 1e3:.0f} kB "
              f"({a['saved'] * 100:.0f}% saved by merging on path; docs/trees.md)")


def churn():
    """Churn in the simulator: every server's own control plane, an oracle over every delivery."""
    section("churn (simulator): 64 servers with their own control planes, 8 failures/s, 10% down")
    bench = os.path.join(ROOT, "target/release/torus-bench")
    r = subprocess.run([bench, "sim", "churn", "--k", "4", "--rate", "8", "--seconds", "3", "--json"],
                       capture_output=True, text=True, timeout=300)
    try:
        p = json.loads(r.stdout)["points"][0]
    except (ValueError, KeyError, IndexError):
        print(f"   did not complete: {(r.stderr or r.stdout).strip()[-300:]}")
        return
    print(f"   {p['failures']} failures and {p['rejoins']} rejoins in {p['simulated_s']:.0f} simulated s, each "
          f"learnt by every server from its own control plane: {p['sent']} key-routed messages, "
          f"{p['misdelivered']} misdelivered, {p['dropped_pct']:.1f}% dropped "
          f"({p['lost_at_failed_server']} into a server that had died unnoticed), {p['wall_s']:.1f} s "
          "(docs/simulator.md)")


def front(c):
    """Server c's address on the clients' network (netns-torus.sh --front)."""
    i = c[0] + 3 * (c[1] + 3 * c[2])
    return f"10.88.{i // 250}.{i % 250 + 1}"


def kvcheck(*args):
    """scripts/kvcheck.py (pymemcache) in the clients' namespace: its JSON line."""
    r = subprocess.run(["ip", "netns", "exec", f"{PREFIX}-front", "python3",
                        os.path.join(ROOT, "scripts/kvcheck.py"), *args],
                       capture_output=True, text=True)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": (r.stderr or r.stdout).strip()[-300:]}


KV_KEYS = f"{STATE}/demo-kv-keys.json"


def key_value():
    """The replicated key-value store through its memcached gateways, with pymemcache."""
    section("key-value store: pymemcache writes 300 binary values through 0,0,0's memcached gateway")
    w = kvcheck("write", front((0, 0, 0)), "demo", "300", KV_KEYS)
    hosts = ",".join(front(c) for c in ALL)
    r = kvcheck("read", hosts, KV_KEYS)
    print(f"   {w.get('written', 0)} acknowledged (3 copies each, on GetServersForKey(SHA-1(key), 3)); "
          f"read back through all 27 gateways: {r.get('checked', 0)} reads, {r.get('missing', '?')} missing, "
          f"{r.get('wrong', '?')} wrong")
    # A gateway gathering a multi-get: every server's replies arrive at once.
    m = kvcheck("multiget", front((0, 0, 0)), front((1, 1, 1)), "demo-mget", "300")
    rows = m.get("hosts") or [{}]
    h = rows[0]
    if "get_many_s" in h:
        print(f"   multi-get through 1,1,1: 300 values of 1 B-200 KB ({h['bytes'] / 1e6:.1f} MB) in one get_many "
              f"{h['get_many_s']:.2f} s, one get at a time {h['singles_s']:.2f} s, "
              f"{h['wrong_or_missing']} wrong or missing")
    else:
        print(f"   multi-get failed: {h.get('error') or m.get('error')}")
    # Six clients of six gateways setting and reading four hot keys (through cache servers),
    # the history judged for linearizability by a Wing-Gong search (scripts/kvlin.py).
    gws = ",".join(front(ALL[i]) for i in (0, 4, 8, 13, 20, 26))
    r = subprocess.run(["ip", "netns", "exec", f"{PREFIX}-front", "python3",
                        os.path.join(ROOT, "scripts/kvlin.py"), gws, "4", "6", "5"],
                       capture_output=True, text=True)
    try:
        lin = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"   6 clients of 6 gateways on 4 hot keys for 5 s: {lin['ops']} operations, "
              f"linearizable: {'yes' if lin['linearizable'] else 'NO: ' + json.dumps(lin.get('violation'))[:300]}")
    except (IndexError, ValueError, KeyError):
        print(f"   linearizability check failed to run: {(r.stderr or r.stdout).strip()[-200:]}")
    st = ask((0, 0, 0), {"cmd": "status"})["kv"]["store"]
    print(f"   0,0,0's store: {st['items']} items held, {st['primary_ops']} operations ordered as primary, "
          f"cache {st['cache_hits']} hits / {st['cache_misses']} misses (docs/kv.md)")


def ip_over_torus():
    """Unmodified programs over torus0: ping and iperf3 from 0,0,0 to 1,1,1 (three hops)."""
    section("IP over the torus: ping and iperf3 through torus0, 0,0,0 -> 1,1,1 (10.77.0.14, three hops)")
    r = subprocess.run(["ip", "netns", "exec", f"{PREFIX}-0-0-0", "ping", "-c", "20", "-i", "0.01", "-q",
                        "10.77.0.14"], capture_output=True, text=True)
    print("   ping: " + (r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip()))
    srv = subprocess.Popen(["ip", "netns", "exec", f"{PREFIX}-1-1-1", "iperf3", "-s", "-1", "-B", "10.77.0.14"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(f"{STATE}/pids", "a") as f:
        f.write(f"{srv.pid}\n")
    v = None
    for _ in range(30):
        r = subprocess.run(["ip", "netns", "exec", f"{PREFIX}-0-0-0", "iperf3", "-c", "10.77.0.14", "-t", "2", "-J"],
                           capture_output=True, text=True)
        try:
            v = json.loads(r.stdout)
        except ValueError:
            v = None
        if v and "error" not in v:
            break
        time.sleep(0.1)
    srv.kill()
    srv.wait()
    if v and "end" in v:
        gb = v["end"]["sum_received"]["bits_per_second"] / 1e9
        print(f"   iperf3 TCP, one flow: {gb:.2f} Gb/s (the kernel's TCP over torus0; torusd stripes it over the "
              f"links and keeps it in order: docs/ip.md)")
    else:
        print(f"   iperf3 did not run: {v}")


IFNAME = {"+x": "px", "-x": "mx", "+y": "py", "-y": "my", "+z": "pz", "-z": "mz"}
STEP = {"+x": (1, 0, 0), "-x": (-1, 0, 0), "+y": (0, 1, 0), "-y": (0, -1, 0), "+z": (0, 0, 1), "-z": (0, 0, -1)}


def source_routing():
    a, b = (0, 0, 1), (1, 1, 1)
    section(f"source routing (BSR): {s(a)} -> {s(b)} on a probed path; a link of the path cut mid-transfer")
    ask(a, {"cmd": "routing", "mode": "source"})
    result = {}

    def run():
        try:
            result["r"] = ask(a, {"cmd": "bench", "to": s(b), "bytes": 400_000_000, "size": 65536,
                                  "timeout_ms": 120_000})
        except RuntimeError as e:
            result["error"] = str(e)

    th = threading.Thread(target=run)
    th.start()
    path = None
    for _ in range(100):
        flows = ask(a, {"cmd": "status"})["engine"]["routing"]["flows"]
        path = next((f["path"].split() for f in flows if f["dst"] == s(b)), None)
        if path and len(path) >= 2:
            break
        time.sleep(0.02)
    time.sleep(0.3)
    st = ask(a, {"cmd": "status"})["engine"]
    path = next((f["path"].split() for f in st["routing"]["flows"] if f["dst"] == s(b)), path)
    mid = tuple((a[i] + STEP[path[0]][i]) % 3 for i in range(3))
    failovers = st["routing"]["failovers"]
    t0 = time.time()
    subprocess.run(["ip", "-n", f"{PREFIX}-{mid[0]}-{mid[1]}-{mid[2]}", "link", "set", IFNAME[path[1]], "down"], check=True)
    switched = viewed = None
    now = "?"
    while (switched is None or viewed is None) and time.time() - t0 < 5:
        st = ask(a, {"cmd": "status"})["engine"]
        if switched is None and st["routing"]["failovers"] > failovers:
            switched = st["routing"]["last_failover_unix_ms"] - t0 * 1000
            now = next((f["path"] for f in st["routing"]["flows"] if f["dst"] == s(b)), "?")
        if viewed is None and st["view_changed_unix_ms"] > t0 * 1000:
            viewed = st["view_changed_unix_ms"] - t0 * 1000
        time.sleep(0.02)
    th.join()
    if "error" in result:
        print(f"   the transfer failed: {result['error']}")
        subprocess.run(["ip", "-n", f"{PREFIX}-{mid[0]}-{mid[1]}-{mid[2]}", "link", "set", IFNAME[path[1]], "up"], check=True)
        raise SystemExit("source routing: the transfer across the cut did not complete")
    r = result["r"]
    rx = r["receiver"]
    fmt = lambda v: f"{v:.0f} ms" if v is not None else "not seen"
    print(f"   path {' '.join(path)}; link {s(mid)}:{path[1]} cut: the source switched to {now} {fmt(switched)} after the cut "
          f"(the server next to the cut told it), its link-state view changed {fmt(viewed)} after")
    print(f"   {r['bytes'] / 1e6:.0f} MB at {r['goodput_gbps']:.2f} Gb/s, {rx['delivered']} of {r['messages']} messages, "
          f"checksums {'match' if rx['checksum'] == r['sender_checksum'] else 'DIFFER'}")
    subprocess.run(["ip", "-n", f"{PREFIX}-{mid[0]}-{mid[1]}-{mid[2]}", "link", "set", IFNAME[path[1]], "up"], check=True)
    ask(a, {"cmd": "routing", "mode": "next-hop"})
    converge(27)


def main():
    section("control plane")
    took = converge(27)
    print(f"27 control processes converged {took:.2f} s after this check began: every server sees 27 reachable")
    print("coordinates assigned from the origin and the wiring plan (namespace -> coordinate):")
    for z in range(3):
        row = []
        for y in range(3):
            for x in range(3):
                v = ask((x, y, z), {"cmd": "status"}, control=True)
                row.append(f"{PREFIX}-{x}-{y}-{z} -> {v['coord']}")
        print("   " + "   ".join(row[:3]))
        print("   " + "   ".join(row[3:6]))
        print("   " + "   ".join(row[6:]))

    section("round-trip time over hops (torusd ping, 64 B short messages, adaptive polling, 54 daemons on 2 cores)")
    print("   3x3x3 has diameter 3: these are all the distances it has")
    print(f"   {'to':<8} {'hops':>4} {'p50 us':>8} {'per hop':>8} {'p99 us':>8} {'lost':>5}")
    src = (0, 0, 0)
    p50 = {}
    def transit_totals():
        xdp = polled = 0
        for c in ALL:
            v = ask(c, {"cmd": "status"})
            xdp += sum(l["xdp"]["transit_in"] for l in v["links"])
            polled += v["engine"]["forwarded"]
        return xdp, polled
    xdp0, polled0 = transit_totals()
    for dst in [(1, 0, 0), (1, 1, 0), (1, 1, 1), (2, 2, 2)]:
        hops = torusctl("route", "--dims", "3x3x3", "--from", s(src), "--to", s(dst))["distance"]
        r = ask(src, {"cmd": "ping", "to": s(dst), "count": 500})
        step = f"+{r['rtt_us']['p50'] - p50[hops - 1]:.1f}" if hops - 1 in p50 else ""
        p50.setdefault(hops, r["rtt_us"]["p50"])
        print(f"   {s(dst):<8} {hops:>4} {r['rtt_us']['p50']:>8.1f} {step:>8} {r['rtt_us']['p99']:>8.1f} {r['lost']:>5}")
    time.sleep(0.3)
    xdp1, polled1 = transit_totals()
    print(f"   3 hops / 1 hop: {p50[3] / p50[1]:.2f}x; frames passing through forwarded in XDP "
          f"{xdp1 - xdp0}, by pollers {polled1 - polled0}")

    names = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima"]
    keys = {n: torusctl("key", "--dims", "3x3x3", n) for n in names}

    def probe(senders, dead=()):
        for c in ALL:
            if c not in dead:
                ask(c, {"cmd": "keys_seen", "reset": True})
        for i, n in enumerate(names):
            ask(senders[i % len(senders)], {"cmd": "send_keys", "keys": [keys[n]["routing_key"]]})
        time.sleep(0.5)
        landed = {}
        for c in ALL:
            if c in dead:
                continue
            for k in ask(c, {"cmd": "keys_seen"}):
                landed[k] = c
        return landed

    section("key-routed messages (short messages routed by key at every hop)")
    landed = probe([(2, 1, 0), (0, 2, 2), (1, 0, 1)])
    print(f"   {'key':<9} {'routing key':<17} {'landed on':<10} {'torusctl key says':<18}")
    bad = 0
    for n in names:
        got = landed.get(keys[n]["routing_key"])
        want = tuple(keys[n]["servers"][0])
        ok = got == want
        bad += not ok
        print(f"   {n:<9} {keys[n]['routing_key']:<17} {s(got) if got else 'LOST':<10} {s(want):<18} {'ok' if ok else 'WRONG'}")
    print(f"   {len(names) - bad} of {len(names)} on the server the spec names")

    section("reliable bulk transfer 0,0,0 -> 1,1,1 (3 hops, striped over the first hops +x +y +z)")
    before = {l["dir"]: l["counters"]["tx_frames"] for l in ask(src, {"cmd": "status"})["links"]}
    r = ask(src, {"cmd": "bench", "to": "1,1,1", "bytes": 200_000_000, "size": 8000, "fence_every": 100})
    after = {l["dir"]: l["counters"]["tx_frames"] for l in ask(src, {"cmd": "status"})["links"]}
    rx = r["receiver"]
    print(f"   {r['bytes'] / 1e6:.0f} MB in {r['elapsed_s']:.2f} s: {r['goodput_gbps']:.2f} Gb/s goodput; "
          f"{rx['delivered']} of {r['messages']} messages delivered, {rx['duplicated']} duplicated, "
          f"{rx['corrupted']} corrupted, {rx['fence_violations']} fence violations, checksums "
          f"{'match' if rx['checksum'] == r['sender_checksum'] else 'DIFFER'}")
    print("   frames sent per link of 0,0,0: " + ", ".join(f"{d} {after[d] - before.get(d, 0)}" for d in sorted(after)))
    # Messages that fill a frame each (MTU 1500 here) are written straight into their frames.
    t0 = ask(src, {"cmd": "status"})["engine"]["transport"].get("framed_straight", 0)
    r = ask(src, {"cmd": "bench", "to": "1,1,1", "bytes": 20_000_000, "size": 1400})
    time.sleep(0.3)  # the engine's counters are published every 100 ms
    straight = ask(src, {"cmd": "status"})["engine"]["transport"].get("framed_straight", 0) - t0
    print(f"   {r['messages']} messages of 1400 B, {r['goodput_gbps']:.2f} Gb/s: {straight} of them written by the "
          f"engine straight from the sender's bytes into their frames (one userspace copy on the way out; "
          f"the rest met a queue and waited in it)")

    restart_torusd(src)
    applications()
    slow_reader()
    remote_memory()
    on_path()
    trees()
    churn()
    key_value()
    ip_over_torus()
    source_routing()

    dead = (2, 0, 2)
    section(f"the same while link 0,0,0:-x is cut and server {s(dead)} (on a shortest path, root of some keys) is killed")
    rooted = [n for n in names if tuple(keys[n]["servers"][0]) == dead]
    result = {}

    def run():
        result["r"] = ask(src, {"cmd": "bench", "to": "2,2,2", "bytes": 150_000_000, "size": 8000, "fence_every": 100})

    th = threading.Thread(target=run)
    th.start()
    time.sleep(0.3)
    subprocess.run(["ip", "-n", f"{PREFIX}-0-0-0", "link", "set", "mx", "down"], check=True)
    pids = subprocess.run(["ip", "netns", "pids", f"{PREFIX}-{dead[0]}-{dead[1]}-{dead[2]}"],
                          capture_output=True, text=True).stdout.split()
    for p in pids:
        subprocess.run(["kill", "-KILL", p])
    t_fail = time.time()
    converge(26, skip=(dead,))
    print(f"   every live server's view and dataplane follow within {time.time() - t_fail:.2f} s "
          f"(hellos every 100 ms, down after 3 missed)")
    th.join()
    r = result["r"]
    rx = r["receiver"]
    print(f"   bulk 0,0,0 -> 2,2,2 across the failures: {rx['delivered']} of {r['messages']} messages, "
          f"{rx['duplicated']} duplicated, {rx['fence_violations']} fence violations, checksums "
          f"{'match' if rx['checksum'] == r['sender_checksum'] else 'DIFFER'}, {r['goodput_gbps']:.2f} Gb/s")
    down_keys = {n: torusctl("key", "--dims", "3x3x3", "--down", s(dead), n) for n in names}
    landed = probe([(2, 1, 0), (0, 2, 2), (1, 0, 1)], dead=(dead,))
    bad = 0
    for n in names:
        got = landed.get(keys[n]["routing_key"])
        want = tuple(down_keys[n]["servers"][0])
        bad += got != want
    live = [c for c in ALL if c != dead]
    r = kvcheck("read", ",".join(front(c) for c in live), KV_KEYS)
    print(f"   the key-value store after the kill: {r.get('keys', 0)} acknowledged values read through "
          f"the 26 live gateways, {r.get('missing', '?')} lost, {r.get('wrong', '?')} wrong")
    print(f"   keys after the failure: {len(names) - bad} of {len(names)} on the server "
          f"`torusctl key --down {s(dead)}` names; {len(rooted)} moved off {s(dead)}:")
    for n in rooted:
        got = landed.get(keys[n]["routing_key"])
        print(f"     {n}: {s(dead)} -> {s(got) if got else 'LOST'} (GetServersForKey's next candidate: "
              f"{s(tuple(down_keys[n]['servers'][0]))})")

    section("counters")
    print(f"   torusctl status --config {STATE}/0-0-0.toml          (both daemons, table; --json)")
    print(f"   logs: {STATE}/*-control.log, {STATE}/*-torusd.log")
    v = ask(src, {"cmd": "status"})
    t = v["engine"]["transport"]
    print(f"   0,0,0 now: {t['data_frames']} data frames, {t['retransmitted_frames']} retransmitted, "
          f"{t['ack_frames']} ACKs, {t['nack_frames']} NACKs, {v['engine']['forwarded']} forwarded")
    fwd = red = polled = 0
    for c in ALL:
        try:
            st = ask(c, {"cmd": "status"})
        except (OSError, RuntimeError):
            continue  # the server killed above
        fwd += sum(l["xdp"]["transit_out"] for l in st["links"])
        red += sum(l["redirect_errors"] for l in st["links"])
        polled += st["engine"]["forwarded"]
    print(f"   the whole torus over the run: {fwd} frames passing through forwarded in XDP, "
          f"{red} of them into a full link (dropped, resent by the transport), {polled} forwarded by pollers")


if __name__ == "__main__":
    main()
