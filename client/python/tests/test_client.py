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


def test_remote_memory_between_two_python_applications(torus):
    """A region on 1,0,0 written and read by an application on 0,0,0 through a capability
    sent in a message; a tripwire and a notification wake the owner; a read-only window is
    refused a write, a revoked one a read, a region altered by the application is refused
    locally, a deregistered one remotely."""
    with torusnet.Client(sock("1-0-0"), "py-rm-owner") as owner, \
            torusnet.Client(sock("0-0-0"), "py-rm-writer") as writer:
        region = owner.register_region(1 << 20)
        assert len(region.cap) == 40 and region.len == 1 << 20
        wire = owner.arm_tripwire(region, 0, 8)
        owner.send(writer.address, region.cap)
        cap = recv_message(writer).data
        assert cap == region.cap

        data = os.urandom(300_000)
        op = writer.remote_write(cap, 4096, data, notify=True)
        assert writer.wait_remote(op, 15) == (torusnet.RM_OK, len(data))
        assert owner.region_read(region, 4096, len(data)) == data
        # The write touched bytes 4096.. only: the tripwire on 0..8 stays quiet; a second,
        # small write at 0 trips it.
        op = writer.remote_write(cap, 0, b"12345678")
        assert writer.wait_remote(op, 15)[0] == torusnet.RM_OK
        seen = set()
        deadline = time.time() + 10
        while seen != {torusnet.TRIPWIRE, torusnet.WRITTEN}:
            assert time.time() < deadline, f"owner events seen: {seen}"
            ev = owner.recv(0.5)
            if ev is None:
                continue
            if ev.kind == torusnet.TRIPWIRE:
                assert (ev.tag, ev.key, ev.count) == (wire, region.id, 0)
                seen.add(ev.kind)
            elif ev.kind == torusnet.WRITTEN:
                assert (ev.key, ev.count, ev.length) == (region.id, 4096, len(data))
                seen.add(ev.kind)

        mine = writer.register_region(len(data))
        op = writer.remote_read(cap, 4096, len(data), mine)
        assert writer.wait_remote(op, 15) == (torusnet.RM_OK, len(data))
        assert writer.region_read(mine, 0, len(data)) == data

        ro = owner.narrow(region.cap, 0, 4096, torusnet.READ)
        op = writer.remote_write(ro, 0, b"no")
        status, _ = writer.wait_remote(op, 15)
        assert torusnet.rm_status_name(status) == "no right"
        owner.revoke(ro)
        op = writer.remote_read(ro, 0, 16, mine)
        assert writer.wait_remote(op, 15)[0] in (torusnet.RM_REVOKED, torusnet.RM_BAD_COOKIE)
        # Only the owner narrows.
        with pytest.raises(torusnet.TorusError):
            writer.narrow(cap, 0, 16, torusnet.READ)

        forged = mine._replace(pool_offset=mine.pool_offset + 64)
        with pytest.raises(torusnet.TorusError):
            writer.region_write(forged, 0, b"x")
        with pytest.raises(torusnet.TorusError):
            writer.deregister_region(forged)

        owner.deregister_region(region)
        op = writer.remote_write(cap, 0, b"gone")
        assert writer.wait_remote(op, 15)[0] in (torusnet.RM_NO_REGION, torusnet.RM_BAD_COOKIE,
                                                 torusnet.RM_REVOKED)
        writer.deregister_region(mine)


def test_remote_memory_from_c(torus, tmp_path):
    """client/examples/c/rmem.c: the same calls from C, 1 MiB written and read back across
    the link."""
    exe = str(tmp_path / "rmem")
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-I", os.path.join(ROOT, "client", "include"),
                    os.path.join(ROOT, "client", "examples", "c", "rmem.c"),
                    "-L", os.path.join(ROOT, "target", "release"), "-ltorusnet_client",
                    "-o", exe], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(ROOT, "target", "release"))
    r = subprocess.run([exe, sock("1-0-0"), sock("0-0-0"), str(1 << 20)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = __import__("json").loads(r.stdout)
    assert out["ok"] and out["landed"] and out["read_back"] and out["tripwire"], out
    assert out["read_only_write"] == "no right" and out["forged_region_refused"] == 1, out


def test_a_name_follows_its_service_when_it_moves(torus):
    """A client resolves (and caches) "py-mover" on 1,0,0; the service moves to 0,0,0.
    A send to the name fails (nobody at 1,0,0 any more) and the client forgets the cached
    location by itself: the next send reaches 0,0,0. A call, with the cache stale again,
    lands too: the old server says nobody is there, the client resolves again and sends
    the request there, once."""
    import threading

    def serve(c, stop, tag, got):
        while not stop.is_set():
            ev = c.serve(lambda frm, data: tag + data, timeout=0.1)
            if ev is not None and ev.kind == torusnet.MESSAGE:
                got.append(ev.data)

    def move(to, tag, got):
        c = torusnet.Client(sock(to), "py-mover")
        stop = threading.Event()
        t = threading.Thread(target=serve, args=(c, stop, tag, got))
        t.start()

        def end():
            stop.set()
            t.join()
            c.close()
        return end

    with torusnet.Client(sock("0-0-0"), "py-caller") as caller:
        got = []
        end = move("1-0-0", b"one:", got)
        deadline = time.time() + 10
        while not caller.resolve("py-mover"):
            assert time.time() < deadline, "py-mover never resolved"
            time.sleep(0.1)
        assert caller.call("py-mover", b"hi") == b"one:hi"
        end()

        got = []
        end = move("0-0-0", b"two:", got)
        try:
            tag = caller.send("py-mover", b"lost")
            deadline = time.time() + 10
            while True:
                assert time.time() < deadline, "no failure for the send to the old place"
                ev = caller.recv(0.5)
                if ev is not None and ev.kind == torusnet.FAILED and ev.tag == tag:
                    assert ev.reason == torusnet.NO_SERVICE
                    break
            caller.send("py-mover", b"found")
            deadline = time.time() + 10
            while got != [b"found"]:
                assert time.time() < deadline, f"the mover got {got}"
                time.sleep(0.05)
        finally:
            end()

        got = []
        end = move("1-0-0", b"three:", got)
        try:
            # The caller's cache says 0,0,0, where nobody is now.
            assert caller.call("py-mover", b"hi", timeout=10) == b"three:hi"
            assert caller.call("py-mover", b"again") == b"three:again"
        finally:
            end()


def test_one_application_under_several_names(torus):
    """An application adds names: messages to each reach it, marked with the name
    they were for; it sends as an added name; a name taken on its server is refused, and so
    is a seventeenth; when it detaches, its added names go with it."""
    with torusnet.Client(sock("1-0-0"), "py-multi") as multi, \
            torusnet.Client(sock("0-0-0"), "py-multi-peer") as peer:
        b = multi.add_name("py-multi-b")
        assert b == torusnet.service_id("py-multi-b")
        deadline = time.time() + 10
        while not peer.resolve("py-multi-b"):
            assert time.time() < deadline, "the added name never resolved"
            time.sleep(0.1)
        at = peer.resolve("py-multi-b")[0]
        assert at[:3] == (1, 0, 0) and at.service == b
        peer.send("py-multi", b"to the first name")
        peer.send("py-multi-b", b"to the second name")
        got = {}
        while len(got) < 2:
            ev = recv_message(multi)
            got[ev.to] = ev.data
        assert got == {multi.address.service: b"to the first name", b: b"to the second name"}
        # Sent as the added name: the peer sees it from that service.
        multi.send(peer.address, b"from b", from_service=b)
        ev = recv_message(peer)
        assert ev.data == b"from b" and ev.frm.service == b
        # Not one of its names: refused at once, nothing sent.
        with pytest.raises(torusnet.TorusError):
            multi.send(peer.address, b"x", from_service=torusnet.service_id("py-echo"))
        # A name another application on its server has, or one it has: refused.
        with pytest.raises(torusnet.TorusError, match="taken"):
            multi.add_name("py-echo")
        with pytest.raises(torusnet.TorusError, match="already"):
            multi.add_name("py-multi-b")
        for k in range(15):
            multi.add_name(f"py-multi-{k}")
        with pytest.raises(torusnet.TorusError, match="at most 16"):
            multi.add_name("py-multi-too-many")
    with torusnet.Client(sock("0-0-0"), "py-multi-after") as c:
        # Gone with the application: a message to the added name is refused at 1,0,0.
        tag = c.send(torusnet.Address(1, 0, 0, b), b"anyone?")
        deadline = time.time() + 10
        while True:
            assert time.time() < deadline, "no report for a message to a departed name"
            ev = c.recv(0.5)
            if ev is not None and ev.kind == torusnet.FAILED and ev.tag == tag:
                assert ev.reason == torusnet.NO_SERVICE
                break
        # And a new application can take it.
        with torusnet.Client(sock("1-0-0"), "py-multi-b") as again:
            assert again.address.service == b


def test_long_send_pulled_by_its_receiver(torus):
    """libRIPC's long send: 256 MB offered from 0,0,0, pulled by the receiver on 1,0,0 with
    remote reads into its own region, byte-exact; the sender learns it may reuse the bytes.
    A declined offer and one nobody pulls (expired at its deadline, then refused to a late
    pull) end too."""
    n = 256 << 20
    with torusnet.Client(sock("0-0-0"), "py-long-tx", pool=n + (16 << 20)) as tx, \
            torusnet.Client(sock("1-0-0"), "py-long-rx", pool=n + (16 << 20)) as rx:
        src = tx.register_region(n, torusnet.READ)
        data = os.urandom(n)
        tx.region_write(src, 0, data)
        dst = rx.register_region(n)
        t0 = time.monotonic()
        offer_id = tx.send_long(rx.address, src, 0, n)
        ev = rx.recv(10)
        while ev is not None and ev.kind != torusnet.LONG_OFFER:
            ev = rx.recv(10)
        assert ev is not None and ev.tag == offer_id and ev.count == n
        rx.pull(ev.data, dst, 0, timeout=60)
        elapsed = time.monotonic() - t0
        got = rx.region_read(dst, 0, n)
        assert got == data, "the long message arrived byte-exact"
        del got
        ev = tx.recv(10)
        while ev is not None and ev.kind != torusnet.LONG_DONE:
            ev = tx.recv(10)
        assert ev is not None and (ev.tag, ev.reason) == (offer_id, torusnet.LONG_PULLED)
        print(f"long send of {n >> 20} MiB pulled in {elapsed:.2f} s "
              f"({n * 8 / elapsed / 1e9:.2f} Gb/s)")

        # Declined: the sender hears it.
        offer_id = tx.send_long(rx.address, src, 0, 4096)
        ev = rx.recv(10)
        assert ev is not None and ev.kind == torusnet.LONG_OFFER
        rx.decline(ev.data)
        ev = tx.recv(10)
        assert ev is not None and (ev.kind, ev.tag, ev.reason) == \
            (torusnet.LONG_DONE, offer_id, torusnet.LONG_DECLINED)

        # Nobody pulls: it expires at its deadline (1 s), and a late pull is refused.
        offer_id = tx.send_long(rx.address, src, 0, 4096, ttl=1)
        ev = rx.recv(10)
        assert ev is not None and ev.kind == torusnet.LONG_OFFER
        late = ev.data
        t0 = time.monotonic()
        ev = tx.recv(10)
        assert ev is not None and (ev.kind, ev.tag, ev.reason) == \
            (torusnet.LONG_DONE, offer_id, torusnet.LONG_EXPIRED)
        assert 0.5 < time.monotonic() - t0 < 5
        with pytest.raises(torusnet.TorusError):
            rx.pull(late, dst, 0, timeout=5)
        # The late pull told the sender, whose offer had ended: nothing more for it.
        ev = tx.recv(0.5)
        assert ev is None or ev.kind != torusnet.LONG_DONE or ev.tag != offer_id


def test_clan_message_queue_from_python(torus):
    """CLAN's message queue through the C ABI: 3000 checked messages from 0,0,0 into a ring
    on 1,0,0, pushed in batches and published, the receiver's read index flowing back."""
    with torusnet.QueueReceiver(sock("1-0-0"), "py-q-rx", slots=64, slot=256) as rx, \
            torusnet.QueueSender(sock("0-0-0"), "py-q-tx", rx.ring, slots=64, slot=256) as tx:
        rx.connect(tx.read)
        n, got = 3000, []
        msgs = [os.urandom(1 + k % 250) for k in range(n)]
        import threading

        def read():
            while len(got) < n:
                m = rx.recv(5.0)
                if m is None:
                    return
                got.append(m)

        t = threading.Thread(target=read)
        t.start()
        for k in range(0, n, 10):
            for m in msgs[k:k + 10]:
                tx.push(m)
            tx.publish()
        tx.flush()
        t.join(30)
        assert got == msgs
        # Too large for a slot: refused at once.
        with pytest.raises(torusnet.TorusError):
            tx.send(b"x" * 300)


def test_reliable_messages_to_keys_reach_their_roots_with_their_keys(torus):
    """The same service on both servers; 40 reliable messages to random keys from a third
    application: each arrives once, at one of the two (its key's root), carrying its key;
    the sender hears every one acknowledged."""
    import random
    rng = random.Random(46)
    with torusnet.Client(sock("0-0-0"), "py-keyed") as a, \
            torusnet.Client(sock("1-0-0"), "py-keyed") as b, \
            torusnet.Client(sock("0-0-0"), "py-keyed-tx") as tx:
        tx.notify_acks(True)
        service = a.address.service
        keys = [rng.getrandbits(64) for _ in range(40)]
        tags = {tx.send(torusnet.Key(k, service), k.to_bytes(8, "big")): k for k in keys}
        got, acked = {}, set()
        deadline = time.time() + 10
        while (len(got) < len(keys) or len(acked) < len(keys)) and time.time() < deadline:
            for c, where in ((a, (0, 0, 0)), (b, (1, 0, 0))):
                ev = c.recv(0)
                while ev is not None:
                    if ev.kind == torusnet.MESSAGE:
                        k = int.from_bytes(ev.data, "big")
                        assert ev.key == k and ev.reliable, ev
                        assert k not in got, f"key {k:x} delivered twice"
                        got[k] = where
                    ev = c.recv(0)
            ev = tx.recv(0.01)
            while ev is not None:
                assert ev.kind != torusnet.FAILED, ev
                if ev.kind == torusnet.ACKED:
                    acked.add(ev.tag)
                ev = tx.recv(0)
        assert sorted(got) == sorted(keys)
        # Both servers root some of 40 random keys.
        assert set(got.values()) == {(0, 0, 0), (1, 0, 0)}
        assert acked == set(tags), "every message acknowledged once its root took it"
