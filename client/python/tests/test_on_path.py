"""Applications on the path (CamCube's per-hop services) against real daemons: a 5x1x1 torus
of namespaces, a key rooted at 2,0,0 that messages from 0,0,0 reach through 1,0,0, where an
application intercepts its service: in Python, in C (client/examples/c/on_path.c) and in
Rust (client/examples/on_path.rs), it lets frames pass, changes them, drops them, answers
them, and leaves one without a verdict (it goes on at the deadline). Needs root and a
release build."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import torusnet  # noqa: E402

PREFIX = "tpo"
STATE = f"/run/torusnet/{PREFIX}"
NETNS = os.path.join(ROOT, "scripts", "netns-torus.sh")
# A key whose root in a 5x1x1 torus is 2,0,0: from 0,0,0 it passes through 1,0,0.
KEY = (13107 * 2 + 1) << 48
NAME = "op-cache"


def sock(c):
    return f"{STATE}/{c}-apps.sock"


@pytest.fixture(scope="module")
def line():
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    subprocess.run(["bash", NETNS, "up", "5x1x1", "--prefix", PREFIX], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        subprocess.run(["bash", NETNS, "start", "--prefix", PREFIX], check=True,
                       stdout=subprocess.DEVNULL)
        deadline = time.time() + 30
        while not all(os.path.exists(sock(f"{x}-0-0")) for x in range(3)):
            assert time.time() < deadline, "torusd never opened its application socket"
            time.sleep(0.1)
        # The views settle: a key-routed probe reaches its root.
        with torusnet.Client(sock("2-0-0"), NAME) as sink, \
                torusnet.Client(sock("0-0-0"), "op-probe") as c:
            while True:
                c.send(torusnet.Key(KEY, sink.address.service), b"probe", reliable=False)
                ev = sink.recv(0.2)
                if ev is not None and ev.kind == torusnet.MESSAGE:
                    break
                assert time.time() < deadline, "key-routed messages never reached 2,0,0"
        yield
    finally:
        subprocess.run(["bash", NETNS, "down", "--prefix", PREFIX],
                       stdout=subprocess.DEVNULL)


MESSAGES = [b"pass:1", b"change:2", b"drop:3", b"get:4", b"slow:5"]


def round_trip(start_interceptor):
    """Sends MESSAGES on the path from 0,0,0; returns what 2,0,0 received, what came back
    to the sender, and what the interceptor said of its work, with it running meanwhile."""
    with torusnet.Client(sock("2-0-0"), NAME) as sink, \
            torusnet.Client(sock("0-0-0"), "op-client") as client:
        stop = start_interceptor()
        try:
            to = torusnet.Key(KEY, sink.address.service)
            for m in MESSAGES:
                client.send(to, m, reliable=False, on_path=True)
            got, back = [], []
            deadline = time.time() + 5
            while time.time() < deadline and (len(got) < 3 or not back):
                for c, into in ((sink, got), (client, back)):
                    ev = c.recv(0.05)
                    if ev is not None and ev.kind == torusnet.MESSAGE:
                        into.append(ev.data)
        finally:
            summary = stop()
    return sorted(got), back, summary


def check(got, back):
    assert got == [b"changed:2", b"pass:1", b"slow:5"], got
    assert back == [b"answer:4"], back


def test_a_python_application_on_the_path(line):
    done = threading.Event()
    seen = []

    def start():
        c = torusnet.Client(sock("1-0-0"), NAME)
        c.intercept(True)

        def run():
            while not done.is_set():
                ev = c.recv(0.05)
                if ev is None or ev.kind != torusnet.INTERCEPTED:
                    continue
                seen.append(ev.data)
                if ev.data.startswith(b"pass:"):
                    c.verdict(ev.tag, torusnet.PASS)
                elif ev.data.startswith(b"change:"):
                    c.verdict(ev.tag, torusnet.CHANGE, b"changed:" + ev.data[7:])
                elif ev.data.startswith(b"drop:"):
                    c.verdict(ev.tag, torusnet.DROP)
                elif ev.data.startswith(b"get:"):
                    assert ev.key == KEY and ev.frm[:3] == (0, 0, 0)
                    c.send(ev.frm, b"answer:" + ev.data[4:], reliable=False)
                    c.verdict(ev.tag, torusnet.DROP)
        t = threading.Thread(target=run)
        t.start()

        def stop():
            done.set()
            t.join()
            c.close()
        return stop

    got, back, _ = round_trip(start)
    check(got, back)
    assert sorted(seen) == sorted(MESSAGES), seen


def run_program(argv):
    def start():
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ,
                                      LD_LIBRARY_PATH=os.path.join(ROOT, "target", "release")))
        assert json.loads(p.stdout.readline())["intercepting"]

        def stop():
            out, _ = p.communicate(timeout=30)
            return json.loads(out.strip().splitlines()[-1])
        return stop
    return start


def test_a_c_application_on_the_path(line, tmp_path):
    exe = str(tmp_path / "on_path")
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-I",
                    os.path.join(ROOT, "client", "include"),
                    os.path.join(ROOT, "client", "examples", "c", "on_path.c"),
                    "-L", os.path.join(ROOT, "target", "release"), "-ltorusnet_client",
                    "-o", exe], check=True)
    got, back, summary = round_trip(run_program([exe, sock("1-0-0"), NAME, "3"]))
    check(got, back)
    assert summary == {"passed": 1, "changed": 1, "dropped": 1, "answered": 1, "left": 1}


def test_a_rust_application_on_the_path(line):
    exe = os.path.join(ROOT, "target", "release", "examples", "on_path")
    got, back, summary = round_trip(run_program([exe, sock("1-0-0"), NAME, "3"]))
    check(got, back)
    assert summary == {"passed": 1, "changed": 1, "dropped": 1, "answered": 1, "left": 1}
