//! The first stage of a frame: what it is and which tenant it belongs
//! to, parsed without touching the worker's state; the VTEP's own frames
//! (ARP, VXLAN) handled here.

use crate::conntrack::ConnKey;
use crate::wire::{
    is_multicast, network_layer, parse_l2, vtep_frame, ParseError, VtepFrame, ETH_HLEN, ETH_IPV4,
    ETH_IPV6, L3,
};
use crate::worker::{DropReason, Egress, Verdict};

use super::frame::{Inspected, Seen};
use super::state::SwitchPipeline;

impl SwitchPipeline {
    /// The first stage of a frame received on `port`: what it is and
    /// where it belongs, without touching the worker's state (the
    /// neighbour a frame to the port's VTEP reveals is returned to learn
    /// later). The VTEP answers ARP for its address in place.
    pub(super) fn inspect(&self, port: usize, packet: &mut [u8]) -> Inspected {
        let done = |v, neighbour| Inspected {
            seen: Seen::Done(v),
            neighbour,
        };
        let mut vxlan = None;
        let mut neighbour = None;
        if let Some(v) = self.compiled.vteps.get(port).copied().flatten() {
            match vtep_frame(packet, v.ip) {
                VtepFrame::Other => {}
                VtepFrame::Invalid => return done(Verdict::Drop(DropReason::NoTenant), None),
                VtepFrame::ArpReply {
                    sender_mac,
                    sender_ip,
                } => {
                    // Only the remote VTEPs the port's attachments accept
                    // are learned as neighbours.
                    if !self.compiled.is_vtep_peer(port, sender_ip) {
                        return done(Verdict::Drop(DropReason::UnknownVtep), None);
                    }
                    // Consumed: an empty flood sends nothing and counts nothing.
                    return done(Verdict::Flood, Some((sender_ip, sender_mac)));
                }
                VtepFrame::ArpRequest {
                    sender_mac,
                    sender_ip,
                } => {
                    // Answered whoever asks (as any host on the underlay
                    // does), learned only from a known remote VTEP.
                    let peer = self.compiled.is_vtep_peer(port, sender_ip);
                    // The request becomes the reply, back where it came from.
                    let a = &mut packet[ETH_HLEN..];
                    a[6..8].copy_from_slice(&2u16.to_be_bytes());
                    a[18..24].copy_from_slice(&sender_mac);
                    a[24..28].copy_from_slice(&sender_ip.to_be_bytes());
                    a[8..14].copy_from_slice(&v.mac);
                    a[14..18].copy_from_slice(&v.ip.to_be_bytes());
                    packet[0..6].copy_from_slice(&sender_mac);
                    packet[6..12].copy_from_slice(&v.mac);
                    return done(
                        Verdict::Forward(Egress::to(port)),
                        peer.then_some((sender_ip, sender_mac)),
                    );
                }
                VtepFrame::Vxlan {
                    inner,
                    vni,
                    src_ip,
                    src_mac,
                } => {
                    // Accepted only from the attachment's remote VTEPs and
                    // underlay ranges: from anyone else, a VNI is no
                    // password into its tenant.
                    let Some(&(t, a)) = self.compiled.vxlan.get(&(port as u32, vni)) else {
                        return done(Verdict::Drop(DropReason::NoTenant), None);
                    };
                    if !self.compiled.tenants[t as usize].accepts_vtep(a as usize, src_ip) {
                        return done(Verdict::Drop(DropReason::UnknownVtep), None);
                    }
                    neighbour = Some((src_ip, src_mac));
                    vxlan = Some((inner, t as usize, a as usize, src_ip));
                }
            }
        }
        let (decap, remote) = vxlan.map_or((0, 0), |(off, _, _, ip)| (off, ip));
        let frame = &packet[decap..];
        let Ok(mut h) = parse_l2(frame) else {
            return done(Verdict::Drop(DropReason::Malformed), neighbour);
        };
        let found = match vxlan {
            Some((_, t, a, _)) => Some((t, a)),
            None => self.compiled.tenant_of(port, h.vlan),
        };
        if let L3::Other(ethertype) = h.l3 {
            // The network layer, unless the frame's tenant would not look
            // at it: an IP frame of a tenant switched at L2.
            let opaque = matches!(ethertype, ETH_IPV4 | ETH_IPV6)
                && found.is_some_and(|(ti, _)| self.compiled.tenants[ti].opaque_ip);
            if !opaque {
                match network_layer(ethertype, &frame[h.l3_offset..]) {
                    Ok(l3) => h.l3 = l3,
                    Err(ParseError::Fragment(_)) => {
                        return done(Verdict::Drop(DropReason::FragmentInvalid), neighbour)
                    }
                    Err(_) => return done(Verdict::Drop(DropReason::Malformed), neighbour),
                }
            }
        }
        let Some((ti, ai)) = found else {
            return done(Verdict::Drop(DropReason::NoTenant), neighbour);
        };
        if is_multicast(&h.src_mac) {
            return done(Verdict::Drop(DropReason::Malformed), neighbour);
        }
        Inspected {
            seen: Seen::Switch {
                ti: ti as u32,
                ai: ai as u32,
                decap: decap as u16,
                remote,
                len: (packet.len() - decap) as u32,
                src_mac: h.src_mac,
                dst_mac: h.dst_mac,
                l3: h.l3,
            },
            neighbour,
        }
    }

    /// The key of the connection frame `x` would be looked up under, if
    /// its tenant tracks connections.
    pub(super) fn conn_key(&self, x: &Inspected) -> Option<ConnKey> {
        let Seen::Switch {
            ti,
            l3:
                L3::Ip {
                    ref key,
                    later_fragment: false,
                    echo_id,
                    ..
                },
            ..
        } = x.seen
        else {
            return None;
        };
        let t = self.compiled.tenants.get(ti as usize)?;
        if !t.tracks {
            return None;
        }
        ConnKey::of(t.uid, key, echo_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::testing::*;

    /// A tenant with no rules that allows everything switches IP at L2:
    /// a frame whose IPv4 header is broken passes where nothing looks
    /// at it, and is dropped as malformed in a tenant with a rule, a
    /// default deny or an address guard on any attachment.
    #[test]
    fn only_what_needs_the_network_layer_parses_it() {
        let mut broken = udp(1, mac(2), None, 53);
        broken[14] = 0x43; // IHL 3: shorter than an IPv4 header
        let mut ruled = tenant("ruled", &[(2, 0), (3, 0)], true);
        ruled.rules = dns_and_deny_7().into();
        // One attachment guarded by source MAC only, the other open.
        let mut by_mac = tenant("by_mac", &[(4, 0), (9, 0)], true);
        by_mac.guards = vec![Guard {
            macs: vec![mac(1)],
            ..Guard::default()
        }];
        // A source prefix on one attachment: the whole tenant parses.
        let mut by_ip = tenant("by_ip", &[(5, 0), (6, 0)], true);
        by_ip.guards = vec![
            Guard::default(),
            Guard {
                v4: vec![(0x0a00_0000, 0x0a00_00ff)],
                ..Guard::default()
            },
        ];
        let (h, mut p) = switch(
            10,
            vec![
                tenant("open", &[(0, 0), (1, 0)], true),
                ruled,
                by_mac,
                by_ip,
                tenant("closed", &[(7, 0), (8, 0)], false),
            ],
        );
        let malformed = Verdict::Drop(DropReason::Malformed);
        let forwarded = |v: &Verdict| matches!(v, Verdict::Forward(_) | Verdict::Flood);
        assert!(forwarded(&run(&mut p, 0, broken.clone()).0), "no rules");
        assert!(forwarded(&run(&mut p, 4, broken.clone()).0), "MAC guard");
        for (port, what) in [(2, "rules"), (5, "address guard"), (7, "default deny")] {
            assert_eq!(run(&mut p, port, broken.clone()).0, malformed, "{what}");
        }
        // Unattached, it is malformed before it is nobody's.
        assert_eq!(
            SwitchHandle::new(&SwitchConfig {
                ports: 1,
                ..SwitchConfig::default()
            })
            .map(|h| run(&mut h.pipeline(), 0, broken.clone()).0)
            .unwrap(),
            malformed
        );
        // A broken ARP body and a truncated tag stay malformed everywhere.
        let mut arp = build::arp(mac(1), BCAST, None, 1, [10, 0, 0, 1], [10, 0, 0, 2]);
        arp.truncate(20);
        assert_eq!(run(&mut p, 0, arp).0, malformed);
        let mut tagged = udp(1, mac(2), Some(5), 53);
        tagged.truncate(16);
        assert_eq!(run(&mut p, 0, tagged).0, malformed);
        // A good frame passes the open tenant as before, and the rules
        // still see theirs.
        assert!(forwarded(&run(&mut p, 0, udp(1, mac(2), None, 53)).0));
        assert!(forwarded(&run(&mut p, 2, udp(1, mac(2), None, 53)).0));
        assert_eq!(
            run(&mut p, 2, udp(7, mac(2), None, 53)).0,
            Verdict::Drop(DropReason::AclDeny)
        );
        assert_eq!(h.traffic().tenants["open"].forwarded_packets, 2);
    }
}
