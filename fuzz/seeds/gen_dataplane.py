#!/usr/bin/env python3
"""Writes the seed inputs of the data-plane fuzz targets next to this
file: fuzz/seeds/<target>/<name>. Run it again after changing an input
format; the seeds are committed, so the fuzz runs (and their replay by
`cargo test -p dpu-fuzz`) need no Python."""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

A = bytes([2, 0, 0, 0, 0, 0x0A])
B = bytes([2, 0, 0, 0, 0, 0x0B])
BCAST = b"\xff" * 6


def eth(dst, src, vlan, ethertype):
    f = dst + src
    if vlan is not None:
        f += struct.pack(">HH", 0x8100, vlan)
    return f + struct.pack(">H", ethertype)


def ipv4(src, dst, proto, l4, frag=0):
    h = struct.pack(">BBHHHBBH", 0x45, 0, 20 + len(l4), 1, frag, 64, proto, 0)
    return h + bytes(src) + bytes(dst) + l4


def ipv6(src, dst, nxt, payload):
    h = struct.pack(">IHBB", 0x60000000, len(payload), nxt, 64)
    return h + src.to_bytes(16, "big") + dst.to_bytes(16, "big") + payload


def tcp(sport, dport, flags):
    return struct.pack(">HHIIBBHHH", sport, dport, 1, 0, 5 << 4, flags, 1024, 0, 0)


def udp(sport, dport, payload=b""):
    return struct.pack(">HHHH", sport, dport, 8 + len(payload), 0) + payload


def arp(src_mac, op, sender_ip, target_ip):
    return (
        struct.pack(">HHBBH", 1, 0x0800, 6, 4, op)
        + src_mac
        + bytes(sender_ip)
        + b"\0" * 6
        + bytes(target_ip)
    )


def parse_seeds():
    return {
        # Ethernet / IPv4 / TCP SYN.
        "ipv4_tcp": eth(B, A, None, 0x0800) + ipv4([10, 0, 0, 1], [10, 0, 0, 2], 6, tcp(40000, 80, 0x02)),
        # 802.1Q VLAN 10 / ARP request.
        "vlan_arp": eth(BCAST, A, 10, 0x0806) + arp(A, 1, [10, 0, 0, 1], [10, 0, 0, 9]),
        # Ethernet / IPv6 / UDP (DNS).
        "ipv6_udp": eth(B, A, None, 0x86DD) + ipv6(1, 2, 17, udp(5353, 53, b"\0" * 12)),
        # IPv6 with hop-by-hop options and a fragment header before TCP.
        "ipv6_ext": eth(B, A, 20, 0x86DD)
        + ipv6(1, 2, 0, bytes([44, 0, 0, 0, 0, 0, 0, 0]) + bytes([6, 0, 0, 0, 0, 0, 0, 1]) + tcp(1, 2, 0x10)),
        # IPv4 ICMP echo request, padded to 60 bytes.
        "icmp_echo": (eth(B, A, None, 0x0800) + ipv4([10, 0, 0, 1], [10, 0, 0, 2], 1, bytes([8, 0, 0, 0, 0x12, 0x34, 0, 1])))
        .ljust(60, b"\0"),
        # A later IPv4 fragment with IP options (IHL 6).
        "ipv4_frag_opts": eth(B, A, None, 0x0800)
        + struct.pack(">BBHHHBBH", 0x46, 0, 32, 7, 0x00B9, 64, 17, 0)
        + bytes([10, 0, 0, 1, 10, 0, 0, 2])
        + b"\x01\x01\x01\x00"
        + b"\0" * 8,
        # LLDP: another EtherType.
        "lldp": eth(bytes([0x01, 0x80, 0xC2, 0, 0, 0x0E]), A, None, 0x88CC) + b"\0" * 46,
        # SCTP over IPv4, double-tagged (QinQ).
        "qinq_sctp": eth(B, A, 30, 0x8100) + struct.pack(">HH", 40, 0x0800) + ipv4([1, 1, 1, 1], [2, 2, 2, 2], 132, b"\0" * 12),
    }


def built(port, f):
    """A built-frame record of the switch target (see fuzz/src/switch.rs)."""
    assert len(f) == 8 and port < 8
    return bytes([0x80 | port]) + bytes(f)


def fields(src, dst, vlan_i, kind, sip=0, dip=0, flags=0, ports=0, icmp=0, echo=0, extra=0,
           tun=0, remote=0, bad=0):
    """tun (into port 5): 1..3 VXLAN on VNI 100/200/300 from remote VTEP
    `remote`, with a broken outer checksum if `bad`; ARP then targets the VTEP."""
    return [dst << 3 | src, tun << 6 | kind << 3 | vlan_i, bad << 5 | remote << 4 | dip << 2 | sip,
            flags, ports, icmp, echo, extra]


def raw(port, frame):
    assert len(frame) < 256 and port < 8
    return bytes([port, len(frame)]) + frame


def switch_seeds():
    # vlan_i: 0 none, 1: 10, 2: 20, 3: 30, 4: 40; kind: 0 UDP, 1 TCP, 2 ICMP,
    # 3 ARP, 4 UDP6, 5 TCP6, 6 ICMP6, 7 other. MAC 7 is broadcast.
    # ports: sport index | dport index << 2 over [53, 80, 1234, 5000].
    learn = b"".join(
        [
            built(0, fields(1, 7, 0, 3, sip=1, dip=2)),  # red ARP broadcast on port 0
            built(1, fields(2, 1, 0, 3, sip=2, dip=1, flags=1)),  # reply from port 1
            built(0, fields(1, 2, 0, 1, sip=1, dip=2, flags=0x02, ports=1 << 2 | 3)),  # TCP SYN to :80
            built(1, fields(2, 1, 0, 1, sip=2, dip=1, flags=0x12, ports=3 << 2 | 1)),  # SYN-ACK back
            built(0, fields(1, 2, 0, 1, sip=1, dip=2, flags=0x10, ports=1 << 2 | 3)),  # ACK
            built(3, fields(3, 1, 1, 0, sip=3, dip=1, ports=2)),  # tagged 10 on the uplink, denied source
            built(2, fields(4, 7, 0, 0, sip=1, dip=2, ports=2 | 0 << 2)),  # blue DNS query, broadcast
            built(3, fields(5, 4, 2, 0, sip=2, dip=1, ports=0 | 2 << 2)),  # DNS reply on VLAN 20
            built(2, fields(4, 5, 0, 2, sip=1, dip=2, icmp=0, echo=7)),  # blue ping
            built(3, fields(5, 4, 3, 2, sip=2, dip=1, icmp=1, echo=7)),  # pong on VLAN 30
            built(4, fields(6, 7, 1, 0, sip=1, dip=3)),  # green on port 4 VLAN 10
            built(4, fields(3, 6, 4, 4, sip=3, dip=1)),  # green UDP6 on VLAN 40
            built(5, fields(1, 2, 0, 0)),  # unattached port
            built(6, fields(1, 2, 0, 0)),  # no such port
            bytes([0xC0]),  # turn
        ]
    )
    changes = learn + bytes([0xC3]) + learn + bytes([0xC5]) + learn + bytes([0xC7]) + learn + bytes([0xC1]) + learn
    frames = parse_seeds()
    raws = b"".join(raw(p, frames[n]) for p, n in [(0, "ipv4_tcp"), (3, "vlan_arp"), (2, "ipv6_udp"), (4, "ipv6_ext"), (1, "icmp_echo"), (0, "lldp")])
    vxlan = b"".join(
        [
            built(5, fields(1, 7, 0, 0, sip=1, dip=2, tun=1)),  # red broadcast in VNI 100
            built(0, fields(2, 1, 0, 0, sip=2, dip=1)),  # answer to it: into the tunnel
            built(5, fields(1, 7, 0, 3, sip=1, dip=2, tun=1)),  # ARP request for the VTEP
            built(5, fields(1, 7, 0, 3, sip=1, dip=2, flags=1, tun=1)),  # ARP reply to it
            built(5, fields(3, 7, 0, 0, tun=2, remote=1)),  # blue VNI 200 from the other VTEP
            built(5, fields(3, 7, 0, 0, tun=3)),  # VNI 300: nobody's
            built(5, fields(3, 7, 0, 0, tun=1, bad=1)),  # broken outer checksum
            bytes([0xC0]),
        ]
    )
    vxlan += bytes([0xC3]) + vxlan
    # Configuration 2 switches red (ports 0 and 1) at L2: a broken IPv4
    # header passes there, and is malformed again under configuration 1.
    broken = bytearray(frames["ipv4_tcp"])
    broken[14] = 0x43
    l2 = bytes([0xC5]) + raw(0, bytes(broken)) + raw(1, bytes(broken)) + bytes([0xC3]) + raw(0, bytes(broken))
    # Decisions remembered by link-layer header, then a station that moves
    # within a burst: under configuration 0 bulk (port 5, port 3 VLAN 50)
    # beside tenants that track connections; under configuration 2 red
    # (port 3 VLAN 10) behind a frame of blue (VLAN 20) that needs rules.
    turn = bytes([0xC0])
    memo = b"".join(
        [
            built(5, fields(2, 1, 0, 0)), turn,
            built(3, fields(1, 2, 5, 0)), built(3, fields(1, 2, 5, 0)), built(3, fields(1, 2, 5, 0)), turn,
            built(3, fields(1, 2, 5, 0)), built(3, fields(2, 4, 5, 0)), built(3, fields(1, 2, 5, 0)), turn,
            bytes([0xC5]),
            built(1, fields(2, 1, 0, 0)), turn,
            built(3, fields(1, 2, 1, 0)), built(3, fields(1, 2, 1, 0)), built(3, fields(1, 2, 1, 0)), turn,
            built(3, fields(4, 5, 2, 0)), built(3, fields(1, 2, 1, 0)), built(3, fields(2, 4, 1, 0)),
            built(3, fields(1, 2, 1, 0)), turn,
        ]
    )
    # Fragments that could hide a TCP header from the filter: a first
    # fragment with 8 bytes of it, and a later one overlapping it.
    tiny = eth(B, A, None, 0x0800) + ipv4([10, 0, 0, 1], [10, 0, 0, 2], 6, tcp(40000, 80, 0x02)[:8], frag=0x2000)
    overlap = eth(B, A, None, 0x0800) + ipv4([10, 0, 0, 1], [10, 0, 0, 2], 6, b"\0" * 16, frag=0x0001)
    fragments = raw(0, tiny) + raw(1, overlap) + raw(3, tiny) + turn + bytes([0xC5]) + raw(0, tiny) + turn
    return {
        "learn": learn,
        "changes": changes,
        "raw": raws,
        "vxlan": vxlan,
        "l2": l2,
        "memo": memo,
        "fragments": fragments,
    }


def rules_seeds():
    # The rules target decodes its input with `arbitrary`; any bytes do.
    return {
        "ramp": bytes(range(256)),
        "sparse": bytes([0, 1, 2, 3, 0, 0, 0, 0, 255, 255, 1, 0] * 16),
    }


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def saved_tables(tenants, conns, frags, saved_unix=1_700_000_000):
    """A saved-tables file (dpu-service/dataplane/src/switch/saved.rs):
    conns are (tenant, lo, hi, lo_port, hi_port, sport, dport, proto,
    flags, state, fins, ttl), frags (tenant, src, dst, ident, proto, v6,
    ttl)."""
    out = b"DPUSWTAB" + struct.pack("<IIQIIII", 1, 0, saved_unix, len(tenants),
                                    len(conns), len(frags), 0)
    for t in tenants:
        out += struct.pack("<H", len(t)) + t.encode()
    for (t, lo, hi, lp, hp, sp, dp, proto, flags, state, fins, ttl) in conns:
        out += struct.pack("<I", t) + lo.to_bytes(16, "little") + hi.to_bytes(16, "little")
        out += struct.pack("<HHHHBBBBI", lp, hp, sp, dp, proto, flags, state, fins, ttl)
    for (t, src, dst, ident, proto, v6, ttl) in frags:
        out += struct.pack("<I", t) + src.to_bytes(16, "little") + dst.to_bytes(16, "little")
        out += struct.pack("<IBBHI", ident, proto, v6, 0, ttl)
    return out + struct.pack("<I", crc32c(out))


def saved_tables_seeds():
    c, s = 0x0A000001, 0x0A000002
    web = (0, c, s, 40000, 80, 40000, 80, 6, 2, 3, 0, 7000)
    return {
        "empty": saved_tables([], [], []),
        "web": saved_tables(["a"], [web], [(0, c, s, 77, 17, 0, 20)]),
        "mixed": saved_tables(
            ["a", "b", "gone"],
            [
                web,
                (0, c, s, 5000, 53, 5000, 53, 17, 6, 0, 0, 100),
                (0, c, s, 9, 0, 8, 0, 1, 2, 0, 0, 20),
                (1, c, s, 1, 2, 1, 2, 6, 0, 1, 0, 30),
                (2, c, s, 3, 4, 3, 4, 6, 2, 4, 1, 30),
                (7, c, s, 3, 4, 3, 4, 6, 2, 9, 0, 30),
            ],
            [(1, c, s, 5, 17, 0, 9), (0, 1 << 40, s, 6, 6, 0, 9)],
        ),
    }


def main():
    for target, seeds in [
        ("parse", parse_seeds()),
        ("switch", switch_seeds()),
        ("rules", rules_seeds()),
        ("saved_tables", saved_tables_seeds()),
    ]:
        d = os.path.join(HERE, target)
        os.makedirs(d, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
