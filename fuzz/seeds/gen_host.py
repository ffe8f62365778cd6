#!/usr/bin/env python3
"""Writes the seed inputs of the `host` fuzz target (the host side of
NVMe/TCP against a controller) next to this file: fuzz/seeds/host/<name>.
Each is a session a controller could send: CapsuleResps, C2HData and
R2Ts for the commands the target keeps in flight (fuzz/src/host.rs).
Run it again after changing the input format; the seeds are committed."""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# Mode byte: bit 2, the ICResp is made right (no digests); bit 3 clear,
# writes go through R2T.
MODE = 0x04


def pdu(kind, flags, psh, data=b""):
    hlen = 8 + len(psh)
    pdo = hlen if data else 0
    return struct.pack("<BBBBI", kind, flags, hlen, pdo, hlen + len(data)) + psh + data


def capsule_resp(cid, status=0):
    return pdu(0x05, 0, struct.pack("<IIHHHH", 0, 0, 0, 1, cid, status << 1))


def c2h_data(cid, offset, data, last=True, success=True):
    flags = (0x04 if last else 0) | (0x08 if success else 0)
    return pdu(0x07, flags, struct.pack("<HHIII", cid, 0, offset, len(data), 0), data)


def r2t(cid, ttag, offset, length):
    return pdu(0x09, 0, struct.pack("<HHIII", cid, ttag, offset, length, 0))


def chunks(stream):
    """The input's framing: a length byte (1..=255) before each piece."""
    out = bytearray([MODE])
    for i in range(0, len(stream), 255):
        piece = stream[i : i + 255]
        out.append(len(piece))
        out += piece
    return bytes(out)


SEEDS = {
    # Every command answered as a controller would.
    "session": capsule_resp(3)
    + c2h_data(0, 0, bytes(range(256)) * 16)
    + r2t(1, 1, 0, 8192)
    + r2t(1, 2, 8192, 8192)
    + capsule_resp(1)
    + c2h_data(2, 0, b"\x11" * 512, last=True, success=False)
    + capsule_resp(2)
    + r2t(4, 3, 0, 8192)
    + capsule_resp(4)
    + capsule_resp(5, status=0x82),
    # Reads in two pieces, out of order.
    "split-read": c2h_data(0, 2048, b"\x22" * 2048, last=False, success=False)
    + c2h_data(0, 0, b"\x33" * 2048, last=True, success=True),
    # A C2HData past its command's buffer: refused.
    "past-buffer": c2h_data(0, 4000, b"\x44" * 200),
}

if __name__ == "__main__":
    d = os.path.join(HERE, "host")
    os.makedirs(d, exist_ok=True)
    for name, stream in SEEDS.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(chunks(stream))
