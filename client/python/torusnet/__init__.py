"""torusnet for Python: attach to the torusd of this server from your own process and
exchange messages across the torus (ctypes over libtorusnet_client, the C ABI).

    import torusnet
    c = torusnet.Client("/run/torusnet/n0-apps.sock", "echo")
    while True:
        ev = c.recv()                      # blocks; recv(0) does not wait, recv(0.5) waits 0.5 s
        if ev.kind == torusnet.MESSAGE:
            c.send(ev.frm, ev.data, reliable=ev.reliable)

The library is found through $TORUSNET_LIB, next to this package in a source checkout
(target/release), or by the dynamic loader as an installed system library
(libtorusnet_client.so.0, from the libtorusnet-client0 package).
"""

import ctypes
import ctypes.util
import os
from collections import namedtuple
from typing import Callable, List, Optional, Union

__version__ = "0.1.0"

__all__ = [
    "Client", "QueueReceiver", "QueueSender", "Address", "Key", "Name", "Buffer", "Region",
    "Event", "Destination",
    "TorusError", "WouldBlock", "service_id", "rm_status_name",
    "MESSAGE", "REQUEST", "ACKED", "FAILED", "PEER_RESET", "UNREACHABLE", "REACHABLE",
    "BUFFER_FILLED", "BUFFER_MISSED", "OVERFLOW", "REMOTE_DONE", "TRIPWIRE", "WRITTEN",
    "LONG_OFFER", "LONG_DONE", "LONG_PULLED", "LONG_DECLINED", "LONG_FAILED", "LONG_EXPIRED",
    "INTERCEPTED", "PASS", "CHANGE", "DROP", "MCAST_DATA", "MCAST_END", "MCAST_REPORT",
    "READ", "WRITE",
    "RM_OK", "RM_BAD_COOKIE", "RM_REVOKED", "RM_EXPIRED", "RM_OUT_OF_RANGE", "RM_NO_RIGHT",
    "RM_NO_REGION", "RM_PEER_FAILED", "RM_TIMEOUT", "RM_INVALID",
]

MESSAGE, REQUEST, ACKED, FAILED, PEER_RESET, UNREACHABLE, REACHABLE, BUFFER_FILLED, \
    BUFFER_MISSED, OVERFLOW, REMOTE_DONE, TRIPWIRE, WRITTEN, LONG_OFFER, LONG_DONE, \
    INTERCEPTED, MCAST_DATA, MCAST_END, MCAST_REPORT = range(1, 20)
"""Event kinds. REMOTE_DONE: a remote-memory operation ended (tag = its handle, reason = its
RM_* status, count = bytes moved); TRIPWIRE: a remote write touched tripwire `tag` (key =
region id, count = offset, length); WRITTEN: a notifying remote write landed whole (key =
region id, count = offset, length); LONG_OFFER: a long message offered (frm, tag = offer
id, count = its length, data = the offer's bytes for pull or decline); LONG_DONE: a long
send of this application's ended (tag = offer id, reason = LONG_*); MCAST_DATA: bytes of a
multicast to this application, in order (frm = its root, tag = the transfer, key = their
offset, count = its size, data); MCAST_END: a multicast to it ended here (tag, count = size,
reason 0 every byte delivered, 1 it ended short); MCAST_REPORT: a multicast of this
application's ended (tag = its tag, reason 0 every member has every byte, 1 not, count =
members complete, data = the root's JSON report, per member)."""

LONG_PULLED, LONG_DECLINED, LONG_FAILED, LONG_EXPIRED = range(1, 5)
"""How a long send ended."""

PASS, CHANGE, DROP = range(3)
"""Verdicts on an INTERCEPTED frame (its tag is the id): go on as it was, go on with a new
payload, go no further."""

READ, WRITE = 1, 2
"""Rights of a region or capability."""

RM_OK, RM_BAD_COOKIE, RM_REVOKED, RM_EXPIRED, RM_OUT_OF_RANGE, RM_NO_RIGHT, RM_NO_REGION, \
    RM_PEER_FAILED, RM_TIMEOUT, RM_INVALID = range(10)
"""How a remote-memory operation ended (rm_status_name gives each one's name)."""

EAGAIN, ETIMEDOUT, EREFUSED, ETOOBIG, ENOTFOUND, ECLOSED, EINVAL, EIO = range(-1, -9, -1)

PEER_RESTARTED, PEER_RESET, SILENT, PEER_UNREACHABLE, REFUSED, NO_SERVICE, RECEIVER_FULL = \
    range(1, 8)
"""Why a message failed (a FAILED Event's reason); NO_SERVICE: the peer took it but no
application there is attached as its service; RECEIVER_FULL: the application it was for had
fallen behind (its backlog full), so it was not delivered (sending again later may work)."""

_RELIABLE, _BWD, _FWD, _NOTIFY, _ON_PATH = 1, 2, 4, 8, 16
_CAP_LEN = 40

Address = namedtuple("Address", "x y z service")
"""A service on a server."""
Key = namedtuple("Key", "key service")
"""The root of a routing key, service `service` there."""
Name = namedtuple("Name", "name")
"""A service by name, resolved across the torus."""
Buffer = namedtuple("Buffer", "owner id len cookie")
"""A posted return buffer's descriptor (send it to the peer that should fill it)."""
Region = namedtuple("Region", "id pool_offset len cap")
"""A region of this application's memory registered for remote access; `cap` (40 bytes) is
the capability for all of it: narrow it before handing it out, in any message."""
Event = namedtuple("Event", "kind frm tag count key reliable reason data length to")
"""An event: kind (MESSAGE ...), frm (Address), tag, count, key, reliable, reason, data
(bytes of a message or request), length, to (a message's or request's destination: which of
this application's service ids, its attach name's or one from add_name)."""

Destination = Union[Address, Key, Name, str]
"""Where a message goes: a service on a server, a key's root, or a name (as Name or str)."""


def service_id(name: str) -> int:
    """The service id of application `name`, the same on every server (FNV-1a of the
    name into 1024..65535)."""
    h = 0x811C9DC5
    for b in name.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return 1024 + h % (65535 - 1024 + 1)


class TorusError(Exception):
    """A torusnet call failed: `code` is the TORUS_E* value, the message says why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class WouldBlock(TorusError):
    """The channel is full: receive, then try again."""


class _Addr(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint16), ("y", ctypes.c_uint16), ("z", ctypes.c_uint16),
                ("service", ctypes.c_uint16)]


class _Dest(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("addr", _Addr), ("key", ctypes.c_uint64),
                ("key_service", ctypes.c_uint16), ("name", ctypes.c_char_p)]


class _Event(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("frm", _Addr), ("tag", ctypes.c_uint64),
                ("count", ctypes.c_uint64), ("key", ctypes.c_uint64), ("keyed", ctypes.c_int),
                ("reliable", ctypes.c_int), ("reason", ctypes.c_int), ("to", ctypes.c_uint16),
                ("len", ctypes.c_size_t)]


class _Buffer(ctypes.Structure):
    _fields_ = [("owner", _Addr), ("id", ctypes.c_uint32), ("len", ctypes.c_uint32),
                ("cookie", ctypes.c_uint64)]


class _Cap(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint8 * _CAP_LEN)]


class _Region(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("pool_offset", ctypes.c_uint64),
                ("len", ctypes.c_uint64), ("cap", _Cap)]


# The library's SONAME: the major version this binding speaks.
_SONAME = "libtorusnet_client.so.0"


def _load_library() -> ctypes.CDLL:
    env = os.environ.get("TORUSNET_LIB")
    if env:
        return ctypes.CDLL(env)
    # In a source checkout (client/python/torusnet), the workspace's own build comes first.
    here = os.path.dirname(os.path.abspath(__file__))
    p = os.path.normpath(os.path.join(here, "../../../target/release/libtorusnet_client.so"))
    if os.path.exists(p):
        return ctypes.CDLL(p)
    # Installed: the dynamic loader finds the SONAME on the system's library path.
    try:
        return ctypes.CDLL(_SONAME)
    except OSError:
        pass
    found = ctypes.util.find_library("torusnet_client")
    if found:
        return ctypes.CDLL(found)
    raise OSError(_SONAME + " not found: install the libtorusnet-client0 package, build the "
                  "workspace (cargo build --release), or set TORUSNET_LIB to the library's path")


_lib = _load_library()
_P = ctypes.c_void_p
_lib.torus_last_error.restype = ctypes.c_char_p
_lib.torus_attach.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
_lib.torus_attach.restype = _P
_lib.torus_attach_pool.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64]
_lib.torus_attach_pool.restype = _P
_lib.torus_detach.argtypes = [_P]
_lib.torus_address.argtypes = [_P]
_lib.torus_address.restype = _Addr
_lib.torus_send.argtypes = [_P, ctypes.POINTER(_Dest), ctypes.c_char_p, ctypes.c_size_t,
                            ctypes.c_uint, ctypes.POINTER(ctypes.c_uint64)]
_lib.torus_recv.argtypes = [_P, ctypes.POINTER(_Event), ctypes.c_void_p, ctypes.c_size_t,
                            ctypes.c_int]
_lib.torus_resolve.argtypes = [_P, ctypes.c_char_p, ctypes.POINTER(_Addr), ctypes.c_size_t,
                               ctypes.c_int]
_lib.torus_call.argtypes = [_P, ctypes.POINTER(_Dest), ctypes.c_char_p, ctypes.c_size_t,
                            ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                            ctypes.c_int]
_lib.torus_respond.argtypes = [_P, _Addr, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
_lib.torus_notify_acks.argtypes = [_P, ctypes.c_int]
_lib.torus_request_weight.argtypes = [_P, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)]
_lib.torus_post_buffer.argtypes = [_P, ctypes.c_uint32, ctypes.POINTER(_Buffer)]
_lib.torus_send_to_buffer.argtypes = [_P, ctypes.POINTER(_Buffer), ctypes.c_char_p,
                                      ctypes.c_size_t, ctypes.c_uint,
                                      ctypes.POINTER(ctypes.c_uint64)]
_lib.torus_read_buffer.argtypes = [_P, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
_lib.torus_forget.argtypes = [_P, ctypes.c_char_p]
_lib.torus_add_name.argtypes = [_P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint16)]
_lib.torus_intercept.argtypes = [_P, ctypes.c_int]
_lib.torus_verdict.argtypes = [_P, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p,
                               ctypes.c_size_t]
_PR, _PC, _U64, _PU64 = ctypes.POINTER(_Region), ctypes.POINTER(_Cap), ctypes.c_uint64, \
    ctypes.POINTER(ctypes.c_uint64)
_lib.torus_register_region.argtypes = [_P, _U64, ctypes.c_uint, _PR]
_lib.torus_deregister_region.argtypes = [_P, _PR]
_lib.torus_narrow.argtypes = [_P, _PC, _U64, _U64, ctypes.c_uint, ctypes.c_uint32, _PC]
_lib.torus_revoke.argtypes = [_P, _PC]
_lib.torus_arm_tripwire.argtypes = [_P, _PR, _U64, _U64, _PU64]
_lib.torus_disarm_tripwire.argtypes = [_P, _PR, _U64]
_lib.torus_remote_write.argtypes = [_P, _PC, _U64, ctypes.c_char_p, ctypes.c_size_t,
                                    ctypes.c_uint, _PU64]
_lib.torus_remote_read.argtypes = [_P, _PC, _U64, _U64, _PR, _U64, ctypes.c_uint, _PU64]
_lib.torus_wait_remote.argtypes = [_P, _U64, ctypes.c_int, ctypes.POINTER(ctypes.c_int), _PU64]
_lib.torus_rm_status_name.argtypes = [ctypes.c_int]
_lib.torus_rm_status_name.restype = ctypes.c_char_p
_lib.torus_region_write.argtypes = [_P, _PR, _U64, ctypes.c_char_p, ctypes.c_size_t]
_lib.torus_region_read.argtypes = [_P, _PR, _U64, ctypes.c_void_p, ctypes.c_size_t]
_lib.torus_send_long.argtypes = [_P, ctypes.POINTER(_Dest), _PR, _U64, _U64, ctypes.c_uint32,
                                 _PU64]
_lib.torus_pull.argtypes = [_P, ctypes.c_char_p, ctypes.c_size_t, _PR, _U64, ctypes.c_int]
_lib.torus_decline.argtypes = [_P, ctypes.c_char_p, ctypes.c_size_t]
_lib.torus_multicast.argtypes = [_P, ctypes.POINTER(_Addr), ctypes.c_size_t, ctypes.c_char_p,
                                 _PR, _U64, _U64, ctypes.c_uint32, ctypes.c_uint32, _PU64]
_lib.torus_queue_receiver.argtypes = [ctypes.c_char_p, ctypes.c_char_p, _U64, _U64, _PC]
_lib.torus_queue_receiver.restype = _P
_lib.torus_queue_connect.argtypes = [_P, _PC]
_lib.torus_queue_recv.argtypes = [_P, ctypes.c_void_p, ctypes.c_size_t,
                                  ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
_lib.torus_queue_receiver_free.argtypes = [_P]
_lib.torus_queue_sender.argtypes = [ctypes.c_char_p, ctypes.c_char_p, _PC, _U64, _U64, _PC]
_lib.torus_queue_sender.restype = _P
_lib.torus_queue_push.argtypes = [_P, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
_lib.torus_queue_send.argtypes = [_P, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
_lib.torus_queue_publish.argtypes = [_P]
_lib.torus_queue_flush.argtypes = [_P, ctypes.c_int]
_lib.torus_queue_sender_free.argtypes = [_P]


def rm_status_name(status: int) -> str:
    """The name of a remote-memory status ("ok", "revoked", ...)."""
    return _lib.torus_rm_status_name(status).decode()


def _cap(cap: bytes) -> _Cap:
    if len(cap) != _CAP_LEN:
        raise TorusError(EINVAL, f"a capability is {_CAP_LEN} bytes, not {len(cap)}")
    c = _Cap()
    ctypes.memmove(c.bytes, bytes(cap), _CAP_LEN)
    return c


def _region(r: Region) -> _Region:
    return _Region(r.id, r.pool_offset, r.len, _cap(r.cap))


def _remote_flags(notify: bool, backward_fence: bool, forward_fence: bool) -> int:
    return (_NOTIFY if notify else 0) | (_BWD if backward_fence else 0) | \
        (_FWD if forward_fence else 0)


def _check(r: int) -> int:
    if r < 0:
        msg = _lib.torus_last_error().decode(errors="replace")
        if r == EAGAIN:
            raise WouldBlock(r, msg)
        raise TorusError(r, msg)
    return r


def _addr(a: _Addr) -> Address:
    return Address(a.x, a.y, a.z, a.service)


def _ms(timeout: Optional[float]) -> int:
    if timeout is None:
        return -1
    return max(0, int(timeout * 1000)) if timeout > 0 else 0


class Client:
    """An application attached to torusd under a service name (a context manager)."""

    def __init__(self, socket: str, name: str, pool: Optional[int] = None) -> None:
        """Attaches as `name`; `pool`: bytes of the memory shared with torusd that return
        buffers, regions and long sends live in (16 MiB unless asked; torusd caps it)."""
        if pool is None:
            self._c = _lib.torus_attach(socket.encode(), name.encode())
        else:
            self._c = _lib.torus_attach_pool(socket.encode(), name.encode(), pool)
        if not self._c:
            raise TorusError(EREFUSED, _lib.torus_last_error().decode(errors="replace"))
        self._buf = ctypes.create_string_buffer(1 << 16)
        self.name = name

    def close(self) -> None:
        """Detaches (the service is unregistered)."""
        if self._c:
            _lib.torus_detach(self._c)
            self._c = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    @property
    def address(self) -> Address:
        """This application's Address (its server and service id)."""
        return _addr(_lib.torus_address(self._c))

    def _dest(self, to: "Destination") -> _Dest:
        d = _Dest()
        if isinstance(to, Name) or isinstance(to, str):
            d.kind = 2
            d.name = (to.name if isinstance(to, Name) else to).encode()
        elif isinstance(to, Key):
            d.kind = 1
            d.key = to.key
            d.key_service = to.service
        else:
            d.kind = 0
            d.addr = _Addr(to[0], to[1], to[2], to[3])
        return d

    def send(self, to: "Destination", data: bytes, reliable: bool = True,
             backward_fence: bool = False, forward_fence: bool = False,
             from_service: Optional[int] = None, on_path: bool = False) -> int:
        """Sends `data` (bytes) to an Address, a Key or a Name (or a name as str); returns
        its tag. `from_service`: send as one of the names added with add_name (its id), not
        the attach name. `on_path`: applications intercepting its service on the servers it
        passes see it (a short message to a Key). Raises WouldBlock when the channel is full."""
        flags = (_RELIABLE if reliable else 0) | (_BWD if backward_fence else 0) | \
            (_FWD if forward_fence else 0) | (_ON_PATH if on_path else 0) | \
            ((from_service or 0) & 0xFFFF) << 16
        tag = ctypes.c_uint64()
        d = self._dest(to)
        _check(_lib.torus_send(self._c, ctypes.byref(d), bytes(data), len(data), flags,
                               ctypes.byref(tag)))
        return tag.value

    def recv(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next Event, or None when nothing came within `timeout` seconds (None: wait
        for ever, 0: do not wait)."""
        ev = _Event()
        while True:
            r = _lib.torus_recv(self._c, ctypes.byref(ev), self._buf, len(self._buf),
                                _ms(timeout))
            if r == ETOOBIG:
                self._buf = ctypes.create_string_buffer(max(ev.len, 2 * len(self._buf)))
                continue
            _check(r)
            if r == 0:
                return None
            data = self._buf.raw[:ev.len] \
                if ev.kind in (MESSAGE, REQUEST, LONG_OFFER, INTERCEPTED, MCAST_DATA,
                               MCAST_REPORT) else b""
            # A tripwire's or a notifying write's region id is in `key` too, as is the
            # offset of a multicast's bytes.
            key = ev.key if ev.keyed or ev.kind in (TRIPWIRE, WRITTEN, MCAST_DATA) else None
            return Event(ev.kind, _addr(ev.frm), ev.tag, ev.count, key, bool(ev.reliable),
                         ev.reason, data, ev.len, ev.to)

    def resolve(self, name: str, timeout: float = 2.0) -> List[Address]:
        """The Addresses of the servers hosting service `name`."""
        out = (_Addr * 64)()
        n = _check(_lib.torus_resolve(self._c, name.encode(), out, 64, _ms(timeout) or 1))
        return [_addr(out[i]) for i in range(n)]

    def add_name(self, name: str) -> int:
        """Adds service name `name` to this application (at most 16): messages and
        requests to it arrive here too (their event's `to` is its id), others resolve it,
        send(..., from_service=id) sends as it. Returns its service id; the name goes when
        the application detaches."""
        out = ctypes.c_uint16()
        _check(_lib.torus_add_name(self._c, name.encode(), ctypes.byref(out)))
        return out.value

    def intercept(self, on: bool = True) -> None:
        """Intercepts (or stops) this application's service on the path: its frames sent
        with on_path that pass through this server come as INTERCEPTED events (tag = id)
        for a verdict; one without a verdict in 20 ms goes on as it was."""
        _check(_lib.torus_intercept(self._c, 1 if on else 0))

    def verdict(self, frame: int, action: int, data: bytes = b"") -> None:
        """The verdict on an INTERCEPTED frame: PASS, CHANGE (with `data` as its new
        payload) or DROP. To answer it, send the answer and DROP it."""
        _check(_lib.torus_verdict(self._c, frame, action, bytes(data), len(data)))

    def forget(self, name: str) -> None:
        """Forgets what resolve (or a send to the name) cached for `name`. A failure that
        says the service is gone from a server (no service, unreachable, restarted) forgets
        it by itself, so the next send to the name resolves it again."""
        _check(_lib.torus_forget(self._c, name.encode()))

    def call(self, to: "Destination", request: bytes, timeout: float = 2.0) -> bytes:
        """Sends a request and returns its reply (bytes). A call to a name whose server
        says the service is not there is sent again to where the name resolves now."""
        d = self._dest(to)
        cap = 1 << 16
        while True:
            resp = ctypes.create_string_buffer(cap)
            n = ctypes.c_size_t()
            r = _lib.torus_call(self._c, ctypes.byref(d), bytes(request), len(request), resp,
                                cap, ctypes.byref(n), _ms(timeout) or 1)
            if r == ETOOBIG:
                cap = n.value
                continue
            _check(r)
            return resp.raw[:n.value]

    def respond(self, to: Address, call: int, data: bytes) -> None:
        """Answers a REQUEST event (its `frm` and `tag`)."""
        a = _Addr(to[0], to[1], to[2], to[3])
        _check(_lib.torus_respond(self._c, a, call, bytes(data), len(data)))

    def serve(self, handler: Callable[[Address, bytes], bytes],
              timeout: Optional[float] = None) -> Optional[Event]:
        """Answers requests with handler(frm, data) -> bytes until another event comes
        (returned) or `timeout` passes with nothing (None returned)."""
        while True:
            ev = self.recv(timeout)
            if ev is None or ev.kind != REQUEST:
                return ev
            self.respond(ev.frm, ev.tag, handler(ev.frm, ev.data))

    def notify_acks(self, on: bool = True) -> None:
        """Asks for ACKED events for this application's reliable messages."""
        _check(_lib.torus_notify_acks(self._c, 1 if on else 0))

    def request_weight(self, weight: int) -> int:
        """Asks for fair-queuing weight `weight` (this application's share of the links it
        shares with other services); returns the weight granted, at most the node file's
        `[apps] max_weight`."""
        granted = ctypes.c_uint32()
        _check(_lib.torus_request_weight(self._c, weight, ctypes.byref(granted)))
        return granted.value

    def post_buffer(self, length: int) -> Buffer:
        """Posts a return buffer of `length` bytes; returns its Buffer descriptor."""
        b = _Buffer()
        _check(_lib.torus_post_buffer(self._c, length, ctypes.byref(b)))
        return Buffer(_addr(b.owner), b.id, b.len, b.cookie)

    def send_to_buffer(self, buf: Buffer, data: bytes, reliable: bool = True) -> int:
        """Sends `data` into another application's posted Buffer."""
        b = _Buffer(_Addr(*buf.owner), buf.id, buf.len, buf.cookie)
        tag = ctypes.c_uint64()
        _check(_lib.torus_send_to_buffer(self._c, ctypes.byref(b), bytes(data), len(data),
                                         _RELIABLE if reliable else 0, ctypes.byref(tag)))
        return tag.value

    def read_buffer(self, buffer_id: int, length: int) -> bytes:
        """The bytes of a filled return buffer (from its BUFFER_FILLED event); frees it."""
        out = ctypes.create_string_buffer(max(length, 1))
        n = _check(_lib.torus_read_buffer(self._c, buffer_id, out, length))
        return out.raw[:n]

    # Remote memory.

    def register_region(self, length: int, rights: int = READ | WRITE) -> Region:
        """Registers `length` bytes of this application's memory for remote access with
        `rights` (READ | WRITE); returns the Region with a capability for all of it."""
        r = _Region()
        _check(_lib.torus_register_region(self._c, length, rights, ctypes.byref(r)))
        return Region(r.id, r.pool_offset, r.len, bytes(r.cap.bytes))

    def deregister_region(self, region: Region) -> None:
        """Deregisters a region: every capability for it dies."""
        r = _region(region)
        _check(_lib.torus_deregister_region(self._c, ctypes.byref(r)))

    def narrow(self, cap: bytes, offset: int, length: int, rights: int,
               ttl: Optional[int] = None) -> bytes:
        """A capability for `length` bytes at `offset` of `cap` with at most `rights`, valid
        for `ttl` seconds (None: until revoked). Only the region's owner may narrow."""
        c, out = _cap(cap), _Cap()
        _check(_lib.torus_narrow(self._c, ctypes.byref(c), offset, length, rights, ttl or 0,
                                 ctypes.byref(out)))
        return bytes(out.bytes)

    def revoke(self, cap: bytes) -> None:
        """Revokes `cap` and every capability narrowed from it."""
        c = _cap(cap)
        _check(_lib.torus_revoke(self._c, ctypes.byref(c)))

    def arm_tripwire(self, region: Region, offset: int, length: int) -> int:
        """Arms a tripwire: a remote write touching those bytes raises a TRIPWIRE event
        whose tag is the id returned."""
        r, out = _region(region), ctypes.c_uint64()
        _check(_lib.torus_arm_tripwire(self._c, ctypes.byref(r), offset, length,
                                       ctypes.byref(out)))
        return out.value

    def disarm_tripwire(self, region: Region, tripwire: int) -> None:
        """Disarms a tripwire."""
        r = _region(region)
        _check(_lib.torus_disarm_tripwire(self._c, ctypes.byref(r), tripwire))

    def remote_write(self, cap: bytes, offset: int, data: bytes, notify: bool = False,
                     backward_fence: bool = False, forward_fence: bool = False) -> int:
        """Writes `data` at `offset` of what `cap` grants, without its owner taking part;
        returns the operation's handle (it ends in one REMOTE_DONE, or wait_remote)."""
        c, op = _cap(cap), ctypes.c_uint64()
        _check(_lib.torus_remote_write(self._c, ctypes.byref(c), offset, bytes(data),
                                       len(data), _remote_flags(notify, backward_fence,
                                                                forward_fence),
                                       ctypes.byref(op)))
        return op.value

    def remote_read(self, cap: bytes, offset: int, length: int, into: Region, at: int = 0,
                    backward_fence: bool = False, forward_fence: bool = False) -> int:
        """Reads `length` bytes at `offset` of what `cap` grants into this application's
        region `into` at `at`; returns the operation's handle."""
        c, r, op = _cap(cap), _region(into), ctypes.c_uint64()
        _check(_lib.torus_remote_read(self._c, ctypes.byref(c), offset, length,
                                      ctypes.byref(r), at,
                                      _remote_flags(False, backward_fence, forward_fence),
                                      ctypes.byref(op)))
        return op.value

    def wait_remote(self, op: int, timeout: Optional[float] = None) -> "tuple[int, int]":
        """Waits for operation `op` to end: (its RM_* status, bytes moved). None: up to the
        operation's own deadline. Other events meanwhile are kept for recv."""
        status, moved = ctypes.c_int(), ctypes.c_uint64()
        _check(_lib.torus_wait_remote(self._c, op, -1 if timeout is None else _ms(timeout),
                                      ctypes.byref(status), ctypes.byref(moved)))
        return status.value, moved.value

    def region_write(self, region: Region, offset: int, data: bytes) -> None:
        """Copies `data` into this application's own region at `offset`."""
        r = _region(region)
        _check(_lib.torus_region_write(self._c, ctypes.byref(r), offset, bytes(data),
                                       len(data)))

    def region_read(self, region: Region, offset: int, length: int) -> bytes:
        """Copies `length` bytes out of this application's own region at `offset`."""
        r, out = _region(region), ctypes.create_string_buffer(max(length, 1))
        _check(_lib.torus_region_read(self._c, ctypes.byref(r), offset, out, length))
        return out.raw[:length]

    # Multicast.

    def multicast(self, group: List[tuple], service: str, region: Region, offset: int,
                  length: int, chunk: int = 0, timeout: int = 600) -> int:
        """Multicasts `length` bytes at `offset` of this application's region to the
        applications hosting service `service` on the servers of `group` ((x, y, z) tuples;
        empty: every other server), in chunks of `chunk` bytes (0: torusd's), within
        `timeout` seconds. Returns its tag; MCAST_REPORT with that tag ends it, and the bytes
        must stay as they are until then."""
        g = (_Addr * max(len(group), 1))(*[_Addr(c[0], c[1], c[2], 0) for c in group])
        r, out = _region(region), ctypes.c_uint64()
        _check(_lib.torus_multicast(self._c, g, len(group), service.encode(), ctypes.byref(r),
                                    offset, length, chunk, timeout, ctypes.byref(out)))
        return out.value

    # Long send (libRIPC).

    def send_long(self, to: "Destination", region: Region, offset: int, length: int,
                  ttl: Optional[int] = None) -> int:
        """Offers `length` bytes at `offset` of this application's region to `to`; the
        receiver pulls them with remote reads within `ttl` seconds (None: 30). Returns the
        offer's id; the bytes must stay until LONG_DONE for it (or FAILED with its id)."""
        d, r, out = self._dest(to), _region(region), ctypes.c_uint64()
        _check(_lib.torus_send_long(self._c, ctypes.byref(d), ctypes.byref(r), offset, length,
                                    ttl or 0, ctypes.byref(out)))
        return out.value

    def pull(self, offer: bytes, into: Region, at: int = 0, timeout: float = 60.0) -> None:
        """Pulls an offered long message (a LONG_OFFER event's data) into this
        application's region `into` at `at`, then tells the sender."""
        r = _region(into)
        _check(_lib.torus_pull(self._c, bytes(offer), len(offer), ctypes.byref(r), at,
                               _ms(timeout) or 1))

    def decline(self, offer: bytes) -> None:
        """Declines an offered long message: its sender may reuse the bytes."""
        _check(_lib.torus_decline(self._c, bytes(offer), len(offer)))


class QueueReceiver:
    """The receiving end of CLAN's message queue (a context manager): a client of its own
    attached as `name`, and a ring of `slots` slots of `slot` bytes in its memory. Hand
    `ring` (a capability, bytes) to the sender, and connect() the sender's `read`."""

    def __init__(self, socket: str, name: str, slots: int = 256, slot: int = 128) -> None:
        ring = _Cap()
        self._q = _lib.torus_queue_receiver(socket.encode(), name.encode(), slots, slot,
                                            ctypes.byref(ring))
        if not self._q:
            raise TorusError(EREFUSED, _lib.torus_last_error().decode(errors="replace"))
        self.ring = bytes(ring.bytes)
        self._buf = ctypes.create_string_buffer(slot)

    def connect(self, read: bytes) -> None:
        """Takes the sender's capability for its read index."""
        c = _cap(read)
        _check(_lib.torus_queue_connect(self._q, ctypes.byref(c)))

    def recv(self, timeout: float = 1.0) -> Optional[bytes]:
        """The next message, or None when none came within `timeout` seconds."""
        n = ctypes.c_size_t()
        while True:
            r = _lib.torus_queue_recv(self._q, self._buf, len(self._buf), ctypes.byref(n),
                                      _ms(timeout))
            if r == ETOOBIG:
                self._buf = ctypes.create_string_buffer(n.value)
                continue
            _check(r)
            return self._buf.raw[:n.value] if r == 1 else None

    def close(self) -> None:
        """Frees the queue; its client detaches."""
        if self._q:
            _lib.torus_queue_receiver_free(self._q)
            self._q = None

    def __enter__(self) -> "QueueReceiver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class QueueSender:
    """The sending end of CLAN's message queue (a context manager): a client of its own
    attached as `name`, writing into the receiver's `ring`; hand `read` (a capability,
    bytes) to the receiver's connect()."""

    def __init__(self, socket: str, name: str, ring: bytes, slots: int = 256,
                 slot: int = 128) -> None:
        c, read = _cap(ring), _Cap()
        self._q = _lib.torus_queue_sender(socket.encode(), name.encode(), ctypes.byref(c),
                                          slots, slot, ctypes.byref(read))
        if not self._q:
            raise TorusError(EREFUSED, _lib.torus_last_error().decode(errors="replace"))
        self.read = bytes(read.bytes)

    def push(self, data: bytes, timeout: float = 10.0) -> None:
        """Writes a message into the next slot without announcing it (publish does)."""
        _check(_lib.torus_queue_push(self._q, bytes(data), len(data), _ms(timeout)))

    def publish(self) -> None:
        """Announces every message pushed so far."""
        _check(_lib.torus_queue_publish(self._q))

    def send(self, data: bytes, timeout: float = 10.0) -> None:
        """Pushes and publishes one message."""
        _check(_lib.torus_queue_send(self._q, bytes(data), len(data), _ms(timeout)))

    def flush(self, timeout: float = 10.0) -> None:
        """Waits until every write so far has completed."""
        _check(_lib.torus_queue_flush(self._q, _ms(timeout)))

    def close(self) -> None:
        """Frees the queue; its client detaches."""
        if self._q:
            _lib.torus_queue_sender_free(self._q)
            self._q = None

    def __enter__(self) -> "QueueSender":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
