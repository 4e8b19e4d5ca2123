"""Multicast between applications against real daemons: a 3x3x1 torus of namespaces. A
Python application on 0,0,0 multicasts 6 MB of its region to a group of five servers, where
Python applications (in this process) and a C application (client/examples/c/multicast.c)
receive the bytes in order; one member hosts no such application and is reported refused,
with the reason. Then the C program multicasts a file to Python members. Needs root and a
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

PREFIX = "tmc"
STATE = f"/run/torusnet/{PREFIX}"
NETNS = os.path.join(ROOT, "scripts", "netns-torus.sh")
SERVICE = "mc-files"
ENV = dict(os.environ, LD_LIBRARY_PATH=os.path.join(ROOT, "target", "release"))


def sock(c):
    return f"{STATE}/{c}-apps.sock"


@pytest.fixture(scope="module")
def torus():
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    subprocess.run(["bash", NETNS, "up", "3x3x1", "--prefix", PREFIX], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        subprocess.run(["bash", NETNS, "start", "--prefix", PREFIX], check=True,
                       stdout=subprocess.DEVNULL)
        deadline = time.time() + 30
        names = [f"{x}-{y}-0" for x in range(3) for y in range(3)]
        while not all(os.path.exists(sock(n)) for n in names):
            assert time.time() < deadline, "torusd never opened its application socket"
            time.sleep(0.1)
        # The views settle: a reliable message from 0,0,0 reaches 2,2,0.
        with torusnet.Client(sock("2-2-0"), "mc-probe-sink") as sink, \
                torusnet.Client(sock("0-0-0"), "mc-probe") as c:
            while True:
                try:
                    c.send(torusnet.Address(2, 2, 0, sink.address.service), b"probe")
                except torusnet.TorusError:
                    pass
                ev = sink.recv(0.3)
                if ev is not None and ev.kind == torusnet.MESSAGE:
                    break
                assert time.time() < deadline, "0,0,0 never reached 2,2,0"
        yield
    finally:
        subprocess.run(["bash", NETNS, "down", "--prefix", PREFIX],
                       stdout=subprocess.DEVNULL)


def c_example(tmp_path):
    """client/examples/c/multicast.c, compiled against the library."""
    exe = str(tmp_path / "multicast")
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-I",
                    os.path.join(ROOT, "client", "include"),
                    os.path.join(ROOT, "client", "examples", "c", "multicast.c"),
                    "-L", os.path.join(ROOT, "target", "release"), "-ltorusnet_client",
                    "-o", exe], check=True)
    return exe


def receive_all(c, out):
    """A Python member: the bytes in order, then the end."""
    got = bytearray()
    while True:
        ev = c.recv(60)
        assert ev is not None, "nothing for a minute"
        if ev.kind == torusnet.MCAST_DATA:
            assert ev.key == len(got), "in order, each byte once"
            got += ev.data
        elif ev.kind == torusnet.MCAST_END:
            out.append((ev.reason, ev.count, bytes(got), ev.frm[:3]))
            return


def test_python_multicasts_to_python_and_c_members_and_hears_of_each(torus, tmp_path):
    data = os.urandom(6_000_000)
    exe = c_example(tmp_path)
    out_file = str(tmp_path / "c-member")
    c_member = subprocess.Popen([exe, "receive", sock("2-2-0"), SERVICE, out_file],
                                stdout=subprocess.PIPE, text=True, env=ENV)
    assert json.loads(c_member.stdout.readline())["attached"]
    py_members = [torusnet.Client(sock(c), SERVICE) for c in ("1-0-0", "0-2-0", "1-1-0")]
    results = {}
    threads = []
    for m, name in zip(py_members, ("1,0,0", "0,2,0", "1,1,0")):
        results[name] = []
        t = threading.Thread(target=receive_all, args=(m, results[name]))
        t.start()
        threads.append(t)
    try:
        with torusnet.Client(sock("0-0-0"), "mc-py-sender", pool=8 << 20) as s:
            r = s.register_region(len(data), torusnet.READ)
            s.region_write(r, 0, data)
            group = [(1, 0, 0), (0, 2, 0), (1, 1, 0), (2, 2, 0), (2, 1, 0)]
            tag = s.multicast(group, SERVICE, r, 0, len(data), chunk=64 * 1024, timeout=60)
            deadline = time.time() + 90
            while True:
                ev = s.recv(1)
                assert time.time() < deadline, "no report"
                if ev is not None and ev.kind == torusnet.MCAST_REPORT and ev.tag == tag:
                    break
        report = json.loads(ev.data)
        # 2,1,0 hosts no such application: the transfer is not whole everywhere.
        assert ev.reason == 1 and ev.count == 4, report
        outcome = {p["member"]: p for p in report["per_member"]}
        assert outcome["2,1,0"]["outcome"] == "refused", report
        assert "no application" in outcome["2,1,0"]["reason"], report
        for m in ("1,0,0", "0,2,0", "1,1,0", "2,2,0"):
            assert outcome[m]["outcome"] == "complete" and outcome[m]["checksum_ok"], report
        for t in threads:
            t.join(30)
        for name, got in results.items():
            assert got == [(0, len(data), data, (0, 0, 0))], name
        line = json.loads(c_member.communicate(timeout=30)[0].strip().splitlines()[-1])
        assert line["ok"] and line["received"] == len(data), line
        with open(out_file, "rb") as f:
            assert f.read() == data
    finally:
        c_member.kill()
        for m in py_members:
            m.close()


def test_c_multicasts_a_file_to_python_members(torus, tmp_path):
    data = os.urandom(3_000_000)
    src = tmp_path / "source"
    src.write_bytes(data)
    exe = c_example(tmp_path)
    members = {"2,0,0": "2-0-0", "0,1,0": "0-1-0"}
    clients = {m: torusnet.Client(sock(s), SERVICE) for m, s in members.items()}
    results = {m: [] for m in members}
    threads = [threading.Thread(target=receive_all, args=(clients[m], results[m]))
               for m in members]
    for t in threads:
        t.start()
    try:
        p = subprocess.run([exe, "send", sock("1-2-0"), SERVICE, str(src), *members],
                           capture_output=True, text=True, env=ENV, timeout=120)
        line = json.loads(p.stdout.strip().splitlines()[-1])
        assert p.returncode == 0 and line["ok"] and line["completed"] == 2, line
        for t in threads:
            t.join(30)
        for m, got in results.items():
            assert got == [(0, len(data), data, (1, 2, 0))], m
    finally:
        for c in clients.values():
            c.close()


def test_a_member_that_leaves_midway_is_reported_and_the_others_complete(torus):
    data = os.urandom(8_000_000)
    stays = torusnet.Client(sock("0-1-0"), SERVICE)
    leaves = torusnet.Client(sock("1-1-0"), SERVICE)
    got = []
    t = threading.Thread(target=receive_all, args=(stays, got))
    t.start()
    try:
        with torusnet.Client(sock("2-2-0"), "mc-py-sender-2", pool=10 << 20) as s:
            r = s.register_region(len(data), torusnet.READ)
            s.region_write(r, 0, data)
            tag = s.multicast([(0, 1, 0), (1, 1, 0)], SERVICE, r, 0, len(data),
                              chunk=64 * 1024, timeout=60)
            # The second member reads its first bytes, then detaches.
            while True:
                ev = leaves.recv(30)
                assert ev is not None, "no bytes for the member that leaves"
                if ev.kind == torusnet.MCAST_DATA:
                    break
            leaves.close()
            deadline = time.time() + 90
            while True:
                ev = s.recv(1)
                assert time.time() < deadline, "no report"
                if ev is not None and ev.kind == torusnet.MCAST_REPORT and ev.tag == tag:
                    break
        report = json.loads(ev.data)
        outcome = {p["member"]: p for p in report["per_member"]}
        assert outcome["0,1,0"]["outcome"] == "complete", report
        assert outcome["1,1,0"]["outcome"] == "refused", report
        assert "left" in outcome["1,1,0"]["reason"], report
        t.join(30)
        assert got == [(0, len(data), data, (2, 2, 0))]
    finally:
        stays.close()
        leaves.close()
