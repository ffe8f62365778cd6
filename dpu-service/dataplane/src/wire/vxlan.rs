//! VXLAN (RFC 7348) written on the way out: a frame put into a tunnel
//! behind outer Ethernet, IPv4, UDP and VXLAN headers, or, while the
//! remote VTEP's MAC address is not known, replaced by the ARP request
//! that asks for it. The reading side, a frame received on the VTEP's
//! uplink, is [`vtep_frame`](super::vtep_frame).

use crate::io::Packet;
use crate::worker::Tunnel;

use super::parse::{ip_checksum, VXLAN_UDP_PORT};

/// Outer Ethernet, IPv4 (no options), UDP and VXLAN headers.
pub const VXLAN_OVERHEAD: usize = 14 + 20 + 8 + 8;

/// Puts the frame in `pkt` into the VXLAN tunnel `t`, or turns it into
/// an ARP request for the remote VTEP if `t.resolve`; false if the buffer
/// has no room (the frame may then only be dropped).
pub(crate) fn apply_tunnel<P: Packet>(pkt: &mut P, t: &Tunnel) -> bool {
    if t.resolve {
        // who-has dst_ip tell src_ip, broadcast; the old frame's bytes
        // beyond the ARP packet stay as padding.
        if pkt.len() < 42 && !pkt.prepend(42 - pkt.len()) {
            return false;
        }
        let d = pkt.data_mut();
        d[0..6].copy_from_slice(&[0xff; 6]);
        d[6..12].copy_from_slice(&t.src_mac);
        d[12..14].copy_from_slice(&[0x08, 0x06]);
        d[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        d[22..28].copy_from_slice(&t.src_mac);
        d[28..32].copy_from_slice(&t.src_ip.to_be_bytes());
        d[32..38].copy_from_slice(&[0; 6]);
        d[38..42].copy_from_slice(&t.dst_ip.to_be_bytes());
        return true;
    }
    let inner = pkt.len();
    if inner + VXLAN_OVERHEAD - 14 > usize::from(u16::MAX) || !pkt.prepend(VXLAN_OVERHEAD) {
        return false;
    }
    let d = pkt.data_mut();
    // The UDP source port spreads flows over the underlay's paths: a hash
    // of the inner addresses, in the dynamic range (RFC 7348 5).
    let mut h: u32 = 0x811c_9dc5;
    for &b in &d[VXLAN_OVERHEAD..(VXLAN_OVERHEAD + 14 + 20).min(d.len())] {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    let sport = 0xc000 | (h as u16 & 0x3fff);
    d[0..6].copy_from_slice(&t.dst_mac);
    d[6..12].copy_from_slice(&t.src_mac);
    d[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip_len = (inner + VXLAN_OVERHEAD - 14) as u16;
    let ip = &mut d[14..34];
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[4..6].copy_from_slice(&[0, 0]);
    ip[6..8].copy_from_slice(&[0x40, 0]); // don't fragment
    ip[8] = 64;
    ip[9] = 17;
    ip[10..12].copy_from_slice(&[0, 0]);
    ip[12..16].copy_from_slice(&t.src_ip.to_be_bytes());
    ip[16..20].copy_from_slice(&t.dst_ip.to_be_bytes());
    let sum = ip_checksum(ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let udp = &mut d[34..42];
    udp[0..2].copy_from_slice(&sport.to_be_bytes());
    udp[2..4].copy_from_slice(&VXLAN_UDP_PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&(ip_len - 20).to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]); // no checksum (RFC 7348 5)
    let vx = &mut d[42..50];
    vx[0..4].copy_from_slice(&[0x08, 0, 0, 0]);
    vx[4..8].copy_from_slice(&(t.vni << 8).to_be_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::apply_vlan;
    use crate::worker::VlanOp;

    /// A frame put into a VXLAN tunnel gets outer headers a kernel
    /// accepts (checked against the RFC 7348 layout and the IPv4
    /// checksum), and decapsulation plus a tag push gives back the inner
    /// frame, tagged; an unresolved VTEP turns the frame into an ARP
    /// request.
    #[test]
    fn tunnel_operations_encapsulate_decapsulate_and_resolve() {
        use crate::io::memory::MemPacket;
        let t = Tunnel {
            src_mac: [2, 0, 0, 0, 0, 0xaa],
            dst_mac: [2, 0, 0, 0, 0, 0xbb],
            src_ip: 0xc000_0201,
            dst_ip: 0xc000_0202,
            vni: 0x12_3456,
            resolve: false,
        };
        let inner: Vec<u8> = (0..60).collect();
        let mut p = MemPacket(inner.clone());
        assert!(apply_tunnel(&mut p, &t));
        let d = &p.0;
        assert_eq!(d.len(), 60 + VXLAN_OVERHEAD);
        assert_eq!(&d[0..6], &t.dst_mac);
        assert_eq!(&d[6..14], &[2, 0, 0, 0, 0, 0xaa, 0x08, 0x00]);
        assert_eq!(ip_checksum(&d[14..34]), 0, "header checksum verifies");
        assert_eq!(u16::from_be_bytes([d[16], d[17]]), 60 + 36);
        assert_eq!((d[23], &d[26..34]), (17, &[192, 0, 2, 1, 192, 0, 2, 2][..]));
        assert!(u16::from_be_bytes([d[34], d[35]]) >= 0xc000);
        assert_eq!(&d[36..40], &[0x12, 0xb5, 0, 60 + 16]);
        assert_eq!(&d[42..50], &[0x08, 0, 0, 0, 0x12, 0x34, 0x56, 0]);
        assert_eq!(&d[50..], &inner[..]);
        // Decapsulate and tag.
        let mut back = MemPacket(d.clone());
        assert!(back.trim_front(VXLAN_OVERHEAD) && apply_vlan(&mut back, VlanOp::Push(9)));
        assert_eq!(&back.0[..12], &inner[..12]);
        assert_eq!(&back.0[16..], &inner[12..]);
        // Unresolved: an ARP request, who-has 192.0.2.2 tell 192.0.2.1.
        let mut q = MemPacket(vec![0x55; 20]);
        assert!(apply_tunnel(&mut q, &Tunnel { resolve: true, ..t }));
        assert_eq!(q.0.len(), 42);
        assert_eq!(
            &q.0[..14],
            &[255, 255, 255, 255, 255, 255, 2, 0, 0, 0, 0, 0xaa, 8, 6]
        );
        assert_eq!(&q.0[20..22], &[0, 1]);
        assert_eq!(&q.0[28..32], &[192, 0, 2, 1]);
        assert_eq!(&q.0[38..42], &[192, 0, 2, 2]);
    }
}
