#!/usr/bin/env python3
"""IPv6 versions of the classifier benchmark's rule sets and traces.

For each set named, reads the `dpdk-test-acl` files that
../shared/bench/gen_data.py wrote (DATA/<set>/testacl.rules and
testacl.trace) and writes DATA/<set>_v6/ with the same rules and keys in
IPv6, in the format `dpdk-test-acl --ipv6` reads, which
`benches/classify.rs` reads too.

The mapping keeps every answer: an IPv4 prefix a/len with len > 0
becomes 2001:db8:<a>::/(32 + len), the IPv4 address in bits 95..64 under
the documentation prefix; a wildcard (/0) stays ::/0. A key's IPv4
address a becomes 2001:db8:<a>:<h>, where <h> is 64 bits derived from
the whole 5-tuple, so the interface identifiers differ from key to key
as real hosts' do. A key then matches a rule's IPv6 form exactly when
it matches the IPv4 rule, so the first matching rule of every key is the
one of the IPv4 set, and so is the verdict. Ports, protocol and their
ranges are unchanged.

The switch's inputs follow when the IPv4 set has them: rules.json with
the same tenants and the prefixes mapped as above, expected.csv as it
is (the verdicts are the same), and traffic.pcap with every frame's
IPv4 header replaced by an IPv6 one carrying its key's addresses (the
frames are in the trace's order), TCP and UDP checksums recomputed.

    python3 ../shared/bench/gen_data.py acl1_1k fw2_10k
    python3 dpu-service/dataplane/bench/ipv6-sets.py acl1_1k fw2_10k
    # -> /tmp/vswitch-bench/data/{acl1_1k_v6,fw2_10k_v6}/
    #    testacl.{rules,trace}, rules.json, expected.csv, traffic.pcap
"""

import argparse
import hashlib
import ipaddress
import json
import os
import shutil
import struct
import sys

DOC = 0x2001_0DB8


def v6_prefix(text):
    """'a.b.c.d/len' as its IPv6 form 'addr/len'."""
    addr, length = text.split("/")
    length = int(length)
    if length == 0:
        return "::/0"
    a = int(ipaddress.IPv4Address(addr))
    v6 = ipaddress.IPv6Address((DOC << 96) | (a << 64))
    return "%s/%d" % (v6, 32 + length)


def v6_key(a, fields):
    """The IPv6 form of the IPv4 address `a` of the key with `fields`."""
    h = hashlib.blake2b(("%d %s" % (a, fields)).encode(), digest_size=8).digest()
    return str(ipaddress.IPv6Address((DOC << 96) | (a << 64) | int.from_bytes(h, "big")))


def checksum(data):
    """The Internet checksum of `data` (RFC 1071)."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def v6_frame(frame, src, dst):
    """`frame` (Ethernet, one 802.1Q tag, IPv4, TCP or UDP) with an IPv6
    header from `src` to `dst` (IPv6 address text) in place of the IPv4
    one, and its TCP or UDP checksum recomputed."""
    assert frame[12:14] == b"\x81\x00" and frame[16:18] == b"\x08\x00", "VLAN-tagged IPv4"
    ip = frame[18:]
    ihl = (ip[0] & 0x0F) * 4
    total, proto = struct.unpack("!H", ip[2:4])[0], ip[9]
    l4 = bytearray(ip[ihl:total])
    s, d = ipaddress.IPv6Address(src).packed, ipaddress.IPv6Address(dst).packed
    at = {6: 16, 17: 6}[proto]
    l4[at:at + 2] = b"\0\0"
    pseudo = s + d + struct.pack("!IxxxB", len(l4), proto)
    c = checksum(pseudo + bytes(l4))
    if proto == 17 and c == 0:
        c = 0xFFFF
    l4[at:at + 2] = struct.pack("!H", c)
    v6 = struct.pack("!IHBB", 6 << 28, len(l4), proto, 64) + s + d
    return frame[:16] + b"\x86\xdd" + v6 + bytes(l4)


def convert_switch(src_dir, dst_dir, keys):
    """rules.json, expected.csv and traffic.pcap of the IPv6 form, when
    the IPv4 set has them; `keys` is each frame's (source, destination)
    in IPv6. Returns the frames written."""
    rules_json = os.path.join(src_dir, "rules.json")
    pcap = os.path.join(src_dir, "traffic.pcap")
    if not (os.path.exists(rules_json) and os.path.exists(pcap)):
        return 0
    with open(rules_json) as f:
        doc = json.load(f)
    for t in doc["tenants"]:
        for r in t["rules"]:
            r["src"], r["dst"] = v6_prefix(r["src"]), v6_prefix(r["dst"])
    with open(os.path.join(dst_dir, "rules.json"), "w") as f:
        json.dump(doc, f, indent=1)
    shutil.copyfile(os.path.join(src_dir, "expected.csv"), os.path.join(dst_dir, "expected.csv"))
    frames = 0
    with open(pcap, "rb") as f, open(os.path.join(dst_dir, "traffic.pcap"), "wb") as out:
        out.write(f.read(24))
        while True:
            head = f.read(16)
            if len(head) < 16:
                break
            sec, usec, incl, _ = struct.unpack("<IIII", head)
            frame = v6_frame(f.read(incl), *keys[frames])
            out.write(struct.pack("<IIII", sec, usec, len(frame), len(frame)) + frame)
            frames += 1
    if frames != len(keys):
        sys.exit("%s: %d frames for %d keys" % (pcap, frames, len(keys)))
    return frames


def convert(src_dir, dst_dir):
    os.makedirs(dst_dir, exist_ok=True)
    rules = 0
    with open(os.path.join(src_dir, "testacl.rules")) as f, \
            open(os.path.join(dst_dir, "testacl.rules"), "w") as out:
        for line in f:
            if not line.startswith("@"):
                out.write(line)
                continue
            fields = line[1:].rstrip("\n").split("\t")
            fields[0] = v6_prefix(fields[0])
            fields[1] = v6_prefix(fields[1])
            out.write("@" + "\t".join(fields) + "\n")
            rules += 1
    keys = []
    with open(os.path.join(src_dir, "testacl.trace")) as f, \
            open(os.path.join(dst_dir, "testacl.trace"), "w") as out:
        for line in f:
            f5 = line.split()
            if len(f5) != 5:
                continue
            src, dst = int(f5[0]), int(f5[1])
            key = (v6_key(src, line.strip()), v6_key(dst, line.strip() + " d"))
            out.write("%s\t%s\t%s\t%s\t%s\n" % (key + tuple(f5[2:])))
            keys.append(key)
    return rules, len(keys), convert_switch(src_dir, dst_dir, keys)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sets", nargs="+")
    ap.add_argument("--data", default="/tmp/vswitch-bench/data")
    args = ap.parse_args()
    for s in args.sets:
        src = os.path.join(args.data, s)
        if not os.path.exists(os.path.join(src, "testacl.rules")):
            sys.exit("%s: no testacl.rules (run ../shared/bench/gen_data.py %s)" % (src, s))
        rules, keys, frames = convert(src, os.path.join(args.data, s + "_v6"))
        print("%s_v6: %d rules, %d keys, %d frames" % (s, rules, keys, frames))


if __name__ == "__main__":
    main()
