"""The Python binding against real daemons: a 2x1x1 torus of network namespaces (made and
removed by scripts/netns-torus.sh), an echo server in Rust on one server, and Python
applications on the other. Needs root and a release build (cargo build --release)."""

import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import torusnet  # noqa: E402

PREFIX = "tpy"
STATE = f"/run/torusnet/{PREFIX}"
NETNS = os.path.join(ROOT, "scripts", "netns-torus.sh")


def sock(c):
    return f"{STATE}/{c}-apps.sock"


@pytest.fixture(scope="module")
def torus():
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    subprocess.run(["bash", NETNS, "up", "2x1x1", "--prefix", PREFIX], check=True,
                   stdout=subprocess.DEVNULL)
    procs = []
    try:
        subprocess.run(["bash", NETNS, "start", "--prefix", PREFIX], check=True,
                       stdout=subprocess.DEVNULL)
        deadline = time.time() + 30
        while not (os.path.exists(sock("0-0-0")) and os.path.exists(sock("1-0-0"))):
            assert time.time() < deadline, "torusd never opened its application socket"
            time.sleep(0.1)
        echo = subprocess.Popen(
            ["ip", "netns", "exec", f"{PREFIX}-1-0-0",
             os.path.join(ROOT, "target", "release", "examples", "echo_server"),
             sock("1-0-0"), "py-echo"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(echo)
        # The echo server's name reaches the directory.
        with torusnet.Client(sock("0-0-0"), "fixture-probe") as c:
            while True:
                if c.resolve("py-echo", timeout=1.0):
                    break
                assert time.time() < deadline, "py-echo never resolved"
                time.sleep(0.1)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
        subprocess.run(["bash", NETNS, "down", "--prefix", PREFIX],
                       stdout=subprocess.DEVNULL)


def recv_message(c, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        ev = c.recv(0.5)
        if ev is not None and ev.kind == torusnet.MESSAGE:
            return ev
    raise AssertionError("no message in time")


def test_attach_and_address(torus):
    with torusnet.Client(sock("0-0-0"), "py-a") as c:
        a = c.address
        assert (a.x, a.y, a.z) == (0, 0, 0)
        assert a.service >= 1024


def test_bad_socket_is_a_clear_error(torus):
    with pytest.raises(torusnet.TorusError) as e:
        torusnet.Client("/nonexistent/apps.sock", "x")
    assert "cannot reach" in str(e.value)


def test_a_name_attached_twice_is_refused(torus):
    with torusnet.Client(sock("0-0-0"), "py-twice"):
        with pytest.raises(torusnet.TorusError) as e:
            torusnet.Client(sock("0-0-0"), "py-twice")
        assert "attached already" in str(e.value)


def test_resolve_reliable_short_and_call(torus):
    with torusnet.Client(sock("0-0-0"), "py-b") as c:
        at = c.resolve("py-echo")
        assert len(at) == 1 and at[0][:3] == (1, 0, 0)
        big = os.urandom(200_000)
        c.send(at[0], big)
        assert recv_message(c).data == big
        c.send(torusnet.Name("py-echo"), b"short", reliable=False)
        ev = recv_message(c)
        assert ev.data == b"short" and not ev.reliable
        assert c.call(at[0], b"question") == b"question"


def test_weights_are_granted_within_the_operators_limit(torus):
    with torusnet.Client(sock("0-0-0"), "py-w") as c:
        assert c.request_weight(3) == 3
        # Beyond [apps] max_weight (8 unless the node file says otherwise): the limit.
        assert c.request_weight(1000) == 8
        with pytest.raises(torusnet.TorusError):
            c.request_weight(0)


def test_acknowledgements_and_failures(torus):
    with torusnet.Client(sock("0-0-0"), "py-c") as c:
        c.notify_acks(True)
        at = c.resolve("py-echo")[0]
        tags = [c.send(at, b"x" * 100) for _ in range(20)]
        acked = 0
        deadline = time.time() + 5
        while acked < 20 and time.time() < deadline:
            ev = c.recv(0.5)
            if ev is not None and ev.kind == torusnet.ACKED:
                acked += ev.count
                assert ev.tag in tags
        assert acked == 20
        # A server outside the torus: the send is refused at once.
        with pytest.raises(torusnet.TorusError):
            c.send(torusnet.Address(9, 9, 9, at.service), b"nowhere")


def test_a_message_nobody_takes_is_reported_failed(torus):
    with torusnet.Client(sock("0-0-0"), "py-d") as c:
        at = c.resolve("py-echo")[0]
        assert at.service == torusnet.service_id("py-echo")
        # No application on 1,0,0 is attached as "py-nobody": the message is refused there
        # and reported to its sender, with its tag.
        tag = c.send(torusnet.Address(1, 0, 0, torusnet.service_id("py-nobody")), b"hello?")
        deadline = time.time() + 10
        while True:
            assert time.time() < deadline, "no report for a message nobody took"
            ev = c.recv(0.5)
            if ev is not None and ev.kind == torusnet.FAILED:
                break
        assert (ev.tag, ev.reason) == (tag, torusnet.NO_SERVICE)
        assert (ev.frm.x, ev.frm.y, ev.frm.z) == (1, 0, 0)


def test_a_reader_that_stops_refuses_and_every_message_is_accounted_for(torus):
    """12000 reliable messages of 8000 B (96 MB) for an application that does not read:
    beyond its 64 MiB backlog they are refused at its server and reported to the sender
    (RECEIVER_FULL); the rest arrives, whole, when it reads again."""
    with torusnet.Client(sock("1-0-0"), "py-slow") as slow, \
            torusnet.Client(sock("0-0-0"), "py-flood") as flood:
        to = slow.address
        data, sent, tags, refused = os.urandom(8000), 0, set(), set()

        def take(ev):
            if ev is not None and ev.kind == torusnet.FAILED:
                assert ev.reason == torusnet.RECEIVER_FULL, ev
                assert ev.tag in tags and ev.tag not in refused
                refused.add(ev.tag)

        deadline = time.time() + 60
        while sent < 12000:
            assert time.time() < deadline, "the flood did not go out"
            try:
                tags.add(flood.send(to, data))
                sent += 1
            except torusnet.WouldBlock:
                take(flood.recv(0.001))
        # It reads only once the refusals have begun (the rest of the flood may still be
        # on its way).
        deadline = time.time() + 20
        while not refused and time.time() < deadline:
            take(flood.recv(0.1))
        delivered = 0
        deadline = time.time() + 60
        while delivered + len(refused) < sent:
            assert time.time() < deadline, f"{delivered} delivered, {len(refused)} refused of {sent}"
            ev = slow.recv(0.01)
            while ev is not None:
                assert ev.kind != torusnet.OVERFLOW, "an accepted message was dropped"
                if ev.kind == torusnet.MESSAGE:
                    assert ev.data == data
                    delivered += 1
                ev = slow.recv(0)
            ev = flood.recv(0)
            while ev is not None:
                take(ev)
                ev = flood.recv(0)
        assert refused and delivered + len(refused) == sent


def test_return_buffer_between_two_python_applications(torus):
    with torusnet.Client(sock("1-0-0"), "py-owner") as owner, \
            torusnet.Client(sock("0-0-0"), "py-writer") as writer:
        buf = owner.post_buffer(1 << 16)
        data = os.urandom(50_000)
        writer.send_to_buffer(buf, data)
        deadline = time.time() + 5
        while True:
            ev = owner.recv(0.5)
            if ev is not None and ev.kind == torusnet.BUFFER_FILLED:
                break
            assert time.time() < deadline, "the buffer was never filled"
        assert ev.tag == buf.id and ev.length == len(data)
        assert owner.read_buffer(buf.id, ev.length) == data
        # Spent: the writer is told its message found no buffer.
        writer.send_to_buffer(buf, b"again")
        deadline = time.time() + 5
        while True:
            ev = writer.recv(0.5)
            if ev is not None and ev.kind == torusnet.BUFFER_MISSED:
                break
            assert time.time() < deadline, "no BUFFER_MISSED"


def test_recv_without_waiting_returns_none(torus):
    with torusnet.Client(sock("0-0-0"), "py-idle") as c:
        assert c.recv(0) is None
        t = time.monotonic()
        assert c.recv(0.2) is None
        assert time.monotonic() - t >= 0.15
