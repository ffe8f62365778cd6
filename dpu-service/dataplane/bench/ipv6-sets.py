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

    python3 ../shared/bench/gen_data.py acl1_1k fw2_10k
    python3 dpu-service/dataplane/bench/ipv6-sets.py acl1_1k fw2_10k
    # -> /tmp/vswitch-bench/data/{acl1_1k_v6,fw2_10k_v6}/testacl.{rules,trace}
"""

import argparse
import hashlib
import ipaddress
import os
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
    keys = 0
    with open(os.path.join(src_dir, "testacl.trace")) as f, \
            open(os.path.join(dst_dir, "testacl.trace"), "w") as out:
        for line in f:
            f5 = line.split()
            if len(f5) != 5:
                continue
            src, dst = int(f5[0]), int(f5[1])
            out.write("%s\t%s\t%s\t%s\t%s\n" % (
                v6_key(src, line.strip()), v6_key(dst, line.strip() + " d"),
                f5[2], f5[3], f5[4]))
            keys += 1
    return rules, keys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sets", nargs="+")
    ap.add_argument("--data", default="/tmp/vswitch-bench/data")
    args = ap.parse_args()
    for s in args.sets:
        src = os.path.join(args.data, s)
        if not os.path.exists(os.path.join(src, "testacl.rules")):
            sys.exit("%s: no testacl.rules (run ../shared/bench/gen_data.py %s)" % (src, s))
        rules, keys = convert(src, os.path.join(args.data, s + "_v6"))
        print("%s_v6: %d rules, %d keys" % (s, rules, keys))


if __name__ == "__main__":
    main()
