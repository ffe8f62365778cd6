//! Fuzzes the frame parser with arbitrary bytes. It must never panic, and
//! whatever it accepts must add up: every offset and length it reports
//! lies within the frame, the fields are the frame's bytes, a reparse gives
//! the same headers, `parse_l2` reads the same link layer and fails only
//! on a short one, Ethernet padding changes nothing, and removing or
//! adding the outer 802.1Q tag changes only the tag. The VTEP classifier
//! (`vtep_frame`) runs on the same bytes and must keep its inner frame
//! within them. Run with
//! `fuzz/run.sh parse` from the repository root.

use dpu_dataplane::wire::{
    parse, parse_l2, proto, vtep_frame, Headers, VtepFrame, ETH_ARP, ETH_HLEN, ETH_IPV4, ETH_IPV6,
    ETH_VLAN, L3, VLAN_HLEN,
};

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be128(b: &[u8], at: usize) -> u128 {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    u128::from_be_bytes(a)
}

/// Checks the Ethernet header and 802.1Q tag of accepted headers
/// against the frame's bytes.
fn check_link(frame: &[u8], h: &Headers) {
    assert!(
        frame.len() >= ETH_HLEN,
        "accepted a {}-byte frame",
        frame.len()
    );
    assert_eq!(h.dst_mac[..], frame[0..6]);
    assert_eq!(h.src_mac[..], frame[6..12]);
    let tagged = be16(frame, 12) == ETH_VLAN;
    assert_eq!(h.vlan.is_some(), tagged, "{h:?}");
    let expect_off = ETH_HLEN + if tagged { VLAN_HLEN } else { 0 };
    assert_eq!(h.l3_offset, expect_off, "{h:?}");
    assert!(h.l3_offset <= frame.len(), "{h:?}");
    if let Some(v) = h.vlan {
        assert_eq!(v, be16(frame, 14) & 0x0fff, "{h:?}");
    }
}

/// Checks what `parse` accepted against the frame's bytes.
fn check_fields(frame: &[u8], h: &Headers) {
    check_link(frame, h);
    let ethertype = be16(frame, h.l3_offset - 2);
    let l3 = &frame[h.l3_offset..];
    match h.l3 {
        L3::Ip {
            key,
            tcp_flags,
            later_fragment,
            fragment,
            ..
        } => {
            assert_eq!(
                later_fragment,
                fragment.is_some_and(|f| f.offset != 0),
                "{h:?}"
            );
            let l4 = if key.v6 {
                assert_eq!(ethertype, ETH_IPV6, "{h:?}");
                assert!(l3.len() >= 40, "{h:?}");
                assert_eq!(l3[0] >> 4, 6, "{h:?}");
                let payload = usize::from(be16(l3, 4));
                assert!(
                    40 + payload <= l3.len(),
                    "IPv6 payload beyond the frame: {h:?}"
                );
                assert_eq!(key.src, be128(l3, 8));
                assert_eq!(key.dst, be128(l3, 24));
                // Extension headers may sit in between: no fixed L4 offset.
                None
            } else {
                assert_eq!(ethertype, ETH_IPV4, "{h:?}");
                assert!(l3.len() >= 20, "{h:?}");
                assert_eq!(l3[0] >> 4, 4, "{h:?}");
                let ihl = usize::from(l3[0] & 0x0f) * 4;
                let total = usize::from(be16(l3, 2));
                assert!(
                    20 <= ihl && ihl <= total && total <= l3.len(),
                    "IPv4 lengths ihl {ihl} total {total} in {} bytes: {h:?}",
                    l3.len()
                );
                assert_eq!(key.src, u128::from(be32(l3, 12)));
                assert_eq!(key.dst, u128::from(be32(l3, 16)));
                assert_eq!(key.proto, l3[9]);
                assert_eq!(later_fragment, be16(l3, 6) & 0x1fff != 0, "{h:?}");
                let field = be16(l3, 6);
                assert_eq!(fragment.is_some(), field & 0x3fff != 0, "{h:?}");
                if let Some(f) = fragment {
                    assert_eq!(f.id, u32::from(be16(l3, 4)), "{h:?}");
                    assert_eq!((f.offset, f.more), (field & 0x1fff, field & 0x2000 != 0));
                    assert_eq!(f.proto, l3[9], "{h:?}");
                }
                Some(&l3[ihl..total])
            };
            if later_fragment {
                assert_eq!((key.src_port, key.dst_port, tcp_flags), (0, 0, 0), "{h:?}");
            }
            if tcp_flags != 0 {
                assert_eq!(key.proto, proto::TCP, "{h:?}");
            }
            match key.proto {
                proto::TCP | proto::UDP | proto::SCTP => {
                    if let (Some(l4), false) = (l4, later_fragment) {
                        assert!(l4.len() >= 8, "{h:?}");
                        assert_eq!(key.src_port, be16(l4, 0));
                        assert_eq!(key.dst_port, be16(l4, 2));
                        if key.proto == proto::TCP {
                            let doff = usize::from(l4[12] >> 4) * 4;
                            assert!(20 <= doff && doff <= l4.len(), "{h:?}");
                            assert_eq!(tcp_flags, l4[13]);
                        }
                    }
                }
                proto::ICMP | proto::ICMPV6 => {
                    assert!(key.src_port < 256 && key.dst_port < 256, "{h:?}");
                    if let (Some(l4), false) = (l4, later_fragment) {
                        assert_eq!((key.src_port, key.dst_port), (l4[0].into(), l4[1].into()));
                    }
                }
                _ => assert_eq!((key.src_port, key.dst_port), (0, 0), "{h:?}"),
            }
        }
        L3::Arp {
            op,
            sender_mac,
            sender_ip,
            target_ip,
        } => {
            assert_eq!(ethertype, ETH_ARP, "{h:?}");
            assert!(l3.len() >= 28, "{h:?}");
            assert_eq!(op, be16(l3, 6));
            assert_eq!(sender_mac[..], l3[8..14]);
            assert_eq!(sender_ip, be32(l3, 14));
            assert_eq!(target_ip, be32(l3, 24));
        }
        L3::Other(t) => {
            assert_eq!(t, ethertype, "{h:?}");
            assert!(![ETH_IPV4, ETH_IPV6, ETH_ARP].contains(&t), "{h:?}");
        }
    }
}

/// Checks what `vtep_frame` says of `frame` for a VTEP at the frame's
/// own IPv4 destination (so the VXLAN checks run, not just the address
/// test): a VXLAN frame's inner frame lies within it and has room for an
/// Ethernet header.
fn check_vtep(frame: &[u8]) {
    let ip = if frame.len() >= 34 {
        be32(frame, 30)
    } else {
        0
    };
    for vtep in [ip, 0xc000_0201] {
        if let VtepFrame::Vxlan { inner, vni, .. } = vtep_frame(frame, vtep) {
            assert!(inner + ETH_HLEN <= frame.len(), "inner frame at {inner}");
            assert!(vni < 1 << 24);
            assert_eq!(be16(frame, 12), ETH_IPV4);
        }
    }
}

/// Runs the target on one input.
pub fn run(frame: &[u8]) {
    check_vtep(frame);
    let first = parse(frame);
    // Deterministic, success or not.
    assert_eq!(parse(frame), first);
    // The link layer alone fails only on a short Ethernet header or tag,
    // and leaves the network layer's EtherType as it found it.
    match parse_l2(frame) {
        Ok(l2) => {
            check_link(frame, &l2);
            assert_eq!(l2.l3, L3::Other(be16(frame, l2.l3_offset - 2)));
            if let Ok(h) = &first {
                assert_eq!(
                    (l2.dst_mac, l2.src_mac, l2.vlan),
                    (h.dst_mac, h.src_mac, h.vlan)
                );
                assert_eq!(l2.l3_offset, h.l3_offset);
            }
        }
        Err(e) => {
            assert_eq!(first, Err(e));
            let tagged = frame.len() >= ETH_HLEN && be16(frame, 12) == ETH_VLAN;
            assert!(frame.len() < ETH_HLEN + if tagged { VLAN_HLEN } else { 0 });
        }
    }
    let Ok(h) = first else {
        return;
    };
    check_fields(frame, &h);

    // Ethernet padding (or any trailer) after the datagram changes nothing.
    for fill in [0x00, 0xff] {
        let mut padded = frame.to_vec();
        padded.extend(std::iter::repeat_n(fill, 64));
        assert_eq!(
            parse(&padded),
            Ok(h),
            "trailer {fill:#x} changed the result"
        );
    }

    if let Some(vid) = h.vlan {
        // Popping the outer tag (as VlanOp::Strip does) leaves an untagged
        // frame with the same network layer, unless another tag follows.
        if be16(frame, 16) != ETH_VLAN {
            let mut popped = frame[..12].to_vec();
            popped.extend_from_slice(&frame[16..]);
            let p = parse(&popped).expect("the frame without its tag parses");
            assert_eq!(p.vlan, None);
            assert_eq!(p.l3_offset, ETH_HLEN);
            assert_eq!((p.dst_mac, p.src_mac, p.l3), (h.dst_mac, h.src_mac, h.l3));
        }
        // Rewriting the VLAN ID (VlanOp::Set) changes only the VLAN ID.
        let mut set = frame.to_vec();
        let tci = (be16(frame, 14) & 0xf000) | (vid ^ 0x0fff);
        set[14..16].copy_from_slice(&tci.to_be_bytes());
        let s = parse(&set).expect("the frame with another VLAN ID parses");
        assert_eq!(s.vlan, Some(vid ^ 0x0fff));
        assert_eq!((s.l3_offset, s.l3), (h.l3_offset, h.l3));
    }
    // Pushing a tag (VlanOp::Push) on top of whatever is there.
    let vid = 0x0abc;
    let mut pushed = frame[..12].to_vec();
    pushed.extend_from_slice(&ETH_VLAN.to_be_bytes());
    pushed.extend_from_slice(&(0x2000u16 | vid).to_be_bytes());
    pushed.extend_from_slice(&frame[12..]);
    let p = parse(&pushed);
    if h.vlan.is_none() {
        let p = p.expect("the frame with a tag pushed parses");
        assert_eq!(p.vlan, Some(vid));
        assert_eq!(p.l3_offset, ETH_HLEN + VLAN_HLEN);
        assert_eq!((p.dst_mac, p.src_mac, p.l3), (h.dst_mac, h.src_mac, h.l3));
    } else {
        // Double-tagged: only the outer tag is read; the rest is opaque L2.
        let p = p.expect("a double-tagged frame parses");
        assert_eq!((p.vlan, p.l3), (Some(vid), L3::Other(ETH_VLAN)));
    }
}
