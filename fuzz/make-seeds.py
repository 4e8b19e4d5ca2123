#!/usr/bin/env python3
"""Writes seed inputs for the fuzz targets: valid torus frames of every kind, plain and
aggregated, so the fuzzer starts past the header checks (layout: docs/wire.md)."""
import os
import random
import struct

here = os.path.dirname(os.path.abspath(__file__))
rng = random.Random(7)


def messages(n):
    out = b""
    for _ in range(n):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        out += struct.pack(">HHBB", len(data), rng.randrange(65536), rng.randrange(4), 0) + data
    return out


def frame(kind, flags, payload, key=None):
    eth = bytes([2] * 6 + [4] * 6) + struct.pack(">H", 0x88B6 if kind == 3 else 0x88B5)
    dst = struct.pack(">Q", key) if key is not None else struct.pack(">HHHH", 1, 2, 3, 0)
    if key is not None:
        flags |= 1 << 3
    hdr = struct.pack(">BBHBBH", 1, kind, flags, 64, 0, 9)
    hdr += struct.pack(">HHH", 0, 1, 2) + struct.pack(">H", len(payload)) + dst
    hdr += struct.pack(">IIIIIIQ", 5, 100, 90, 7, 0, 0, 0xF0F0)
    # peer connection id, route length and next hop, receive window, telemetry and its echo
    hdr += struct.pack(">IBBHBB", 11, 0, 0, 16, 40, 90)
    assert len(hdr) == 66
    return eth + hdr + payload


seeds = []
for kind in range(4):
    seeds.append(frame(kind, 0, b""))
    seeds.append(frame(kind, 0x10 | 0x80, b"hello torus", key=0x0123456789ABCDEF))
    agg = messages(rng.randrange(1, 8))
    seeds.append(frame(kind, 0x04 | 0x10, agg))
for i, s in enumerate(seeds):
    open(os.path.join(here, "seeds/frame", f"seed{i:02}"), "wb").write(s)
for i in range(8):
    open(os.path.join(here, "seeds/aggregation", f"seed{i:02}"), "wb").write(messages(i + 1))
