//! The second stage of a frame, in arrival order: learning what it
//! reveals, filtering, and where it goes (forward, flood, tag operations
//! and VXLAN tunnels).

use std::sync::atomic::Ordering;

use crate::conntrack::ConnKey;
use crate::fragtrack::FragKey;
use crate::wire::{hides_network_layer, is_multicast, L3};
use crate::worker::{DropReason, Egress, Tunnel, Verdict, VlanOp};

use super::compile::{CompiledTenant, ALLOWS, LIMITED, OPENS};
use super::config::Attach;
use super::counters::bump;
use super::filter::{filter_ip, Clock, IpPacket};
use super::frame::{Inspected, Seen};
use super::state::{SwitchPipeline, NEIGHBOURS_MAX};

/// The tag operation that turns a frame of attachment `from` into one of `to`.
fn vlan_op(from: Attach, to: Attach) -> VlanOp {
    match (from.vlan, to.vlan) {
        (a, b) if a == b => VlanOp::Keep,
        (_, 0) => VlanOp::Strip,
        (0, b) => VlanOp::Push(b),
        (_, b) => VlanOp::Set(b),
    }
}

/// The way out to attachment `to` (not VXLAN) for a frame of attachment
/// `from` with `decap` bytes of outer headers.
fn plain_egress(from: Attach, to: Attach, decap: u16) -> Egress {
    Egress {
        port: to.port,
        vlan: vlan_op(from, to),
        decap,
        tunnel: None,
    }
}

impl SwitchPipeline {
    #[inline(always)]
    fn learn(&mut self, tenant: usize, mac: [u8; 6], attachment: usize, vtep: u32) {
        self.macs
            .learn(tenant as u32, mac, attachment as u32, vtep, self.now);
    }

    /// Remembers that `ip` is at `mac` behind `port`.
    fn neighbour(&mut self, port: usize, ip: u32, mac: [u8; 6]) {
        if ip == 0 || is_multicast(&mac) {
            return;
        }
        let key = (port as u32, ip);
        if let Some(e) = self.neighbours.get_mut(&key) {
            *e = (mac, self.now);
        } else if self.neighbours.len() < NEIGHBOURS_MAX {
            self.neighbours.insert(key, (mac, self.now));
        }
    }

    /// The way out to attachment `to` of tenant `t` for a frame of
    /// attachment `from` with `decap` bytes of outer headers: for a VXLAN
    /// attachment, through the tunnel to `vtep` (a learned destination)
    /// or, with `vtep` 0, to each of the attachment's remote VTEPs.
    #[allow(clippy::too_many_arguments)]
    fn egress(
        &self,
        t: &CompiledTenant,
        from: Attach,
        to_index: usize,
        decap: u16,
        vtep: u32,
        out: &mut Vec<Egress>,
    ) {
        let to = t.attachments[to_index];
        let e = plain_egress(from, to, decap);
        if to.vni == 0 {
            out.push(e);
            return;
        }
        let Some(local) = self.compiled.vteps.get(to.port).copied().flatten() else {
            return;
        };
        let remotes = if vtep != 0 {
            std::slice::from_ref(&vtep)
        } else {
            &t.remotes[to_index][..]
        };
        for &ip in remotes {
            let known = self
                .neighbours
                .get(&(to.port as u32, ip))
                .filter(|(_, seen)| {
                    self.now.saturating_sub(*seen) < self.compiled.mac_ageing.as_secs()
                });
            out.push(Egress {
                tunnel: Some(Tunnel {
                    src_mac: local.mac,
                    dst_mac: known.map_or([0xff; 6], |(m, _)| *m),
                    src_ip: local.ip,
                    dst_ip: ip,
                    vni: to.vni,
                    resolve: known.is_none(),
                }),
                ..e
            });
        }
    }

    /// The second stage of a frame received on `port`, in arrival order:
    /// learns what it reveals and decides its fate, pushing a flood's
    /// outputs onto `flood`. `tag` is its classification if it was
    /// looked up ahead, `conn` its [`SwitchPipeline::conn_key`].
    pub(super) fn decide(
        &mut self,
        port: usize,
        x: &Inspected,
        tag: Option<Option<u32>>,
        conn: Option<ConnKey>,
        flood: &mut Vec<Egress>,
    ) -> Verdict {
        if let Some((ip, mac)) = x.neighbour {
            self.neighbour(port, ip, mac);
        }
        let (ti, ai, decap, remote, len, src_mac, dst_mac, l3) = match x.seen {
            Seen::Done(v) => return v,
            // Fresh: `settle` decides stale ones itself.
            Seen::Recalled { decision, len, .. } => {
                return self.forward_recalled(decision, u64::from(len))
            }
            Seen::Switch {
                ti,
                ai,
                decap,
                remote,
                len,
                src_mac,
                dst_mac,
                ref l3,
            } => (
                ti as usize,
                ai as usize,
                decap,
                remote,
                u64::from(len),
                src_mac,
                dst_mac,
                l3,
            ),
        };
        let t = &self.compiled.tenants[ti];
        let shard = &self.compiled.shards[self.shard];
        let cells = &shard.tenants[ti];
        bump(&cells.rx_packets, 1);
        bump(&cells.rx_bytes, len);
        if let Some(g) = &t.guards[ai] {
            if let Err(reason) = g.check(&src_mac, l3) {
                bump(&cells.dropped, 1);
                return Verdict::Drop(reason);
            }
        }
        if t.endpoint(&src_mac).is_some_and(|at| at != ai) {
            // An endpoint's MAC from anywhere but its own port.
            bump(&cells.dropped, 1);
            return Verdict::Drop(DropReason::Spoofed);
        }
        if !self.macs.admits(ti as u32, src_mac, ai as u32) {
            bump(&cells.dropped, 1);
            return Verdict::Drop(DropReason::MacLimit);
        }
        // Where it came from, as a flow rule in hardware would match it.
        let arrival = || super::offload::Arrival {
            tenant: t.uid,
            port,
            vlan: t.attachments[ai].vlan,
            src_mac,
            dst_mac,
        };
        // The connection the packet passed as part of, if any.
        let mut tracked = None;
        // With flow hardware in front: it passed on a stateless verdict
        // (no connection, no rate limit).
        let mut stateless_pass = false;
        // The tag of the rule whose verdict it got, if one.
        let mut rule_tag = None;
        let passed = match *l3 {
            L3::Ip {
                key,
                fragment: Some(f),
                ..
            } if f.offset != 0 => {
                // No transport header to filter: it passes with its
                // datagram's first fragment, where a filter could refuse
                // that.
                let open = t.default_allow && t.order.is_empty();
                if open || self.frags.passes(&FragKey::of(t.uid, &key, &f), self.now) {
                    Ok(())
                } else {
                    Err(DropReason::FragmentUnknown)
                }
            }
            L3::Ip {
                key,
                tcp_flags,
                fragment,
                ..
            } => {
                let clock = Clock {
                    secs: self.now,
                    micros: self.now_us,
                    generation: self.generation,
                };
                let rules = &shard.rules[ti];
                let (rule, passed) = filter_ip(
                    t,
                    rules,
                    &mut self.conns,
                    &mut self.cache,
                    clock,
                    IpPacket {
                        key: &key,
                        tag,
                        conn,
                        tcp_flags,
                        len,
                    },
                );
                rule_tag = rule;
                if let Some(tag) = rule {
                    let rc = &shard.rules[ti][tag as usize];
                    bump(&rc.packets, 1);
                    bump(&rc.bytes, len);
                    rc.last_hit.store(self.unix_now, Ordering::Relaxed);
                }
                if let (Some(tag), Ok(None), Some(link)) =
                    (rule, &passed, self.offload.as_deref_mut())
                {
                    if t.actions[tag as usize] & OPENS != 0 {
                        // A connection opened: a stateless rule of its
                        // 5-tuple must not outlive the decision.
                        super::offload::opened(link, t.uid, &key);
                    }
                }
                stateless_pass = self.offload.is_some()
                    && fragment.is_none()
                    && matches!(passed, Ok(None))
                    && rule.map_or(t.default_allow, |tag| {
                        let a = t.actions[tag as usize];
                        a & ALLOWS != 0 && a & (OPENS | LIMITED) == 0
                    });
                let passed = passed.map(|c| tracked = c);
                match fragment {
                    // A first fragment that passed: its later ones may.
                    Some(f) if passed.is_ok() && !(t.default_allow && t.order.is_empty()) => self
                        .frags
                        .admit(&FragKey::of(t.uid, &key, &f), self.now)
                        .map_err(|_| DropReason::FragmentTableFull),
                    _ => passed,
                }
            }
            L3::Arp { .. } => Ok(()),
            // A tenant with rules filters its IP: a network layer hidden
            // behind a second tag, QinQ, MPLS or PPPoE would slip past
            // them under a default allow.
            L3::Other(ethertype)
                if t.default_allow && !t.order.is_empty() && hides_network_layer(ethertype) =>
            {
                Err(DropReason::Encapsulated)
            }
            L3::Other(_) if t.default_allow => Ok(()),
            L3::Other(_) => Err(DropReason::AclDeny),
        };
        if let Err(reason) = passed {
            bump(&cells.dropped, 1);
            if let (
                DropReason::AclDeny,
                L3::Ip {
                    key,
                    fragment: None,
                    ..
                },
                Some(link),
                false,
                0,
                0,
            ) = (
                reason,
                *l3,
                self.offload.as_deref_mut(),
                t.no_offload,
                decap,
                remote,
            ) {
                let denied = super::offload::StatelessPacket {
                    at: arrival(),
                    key,
                    rule: t.rule_id(rule_tag),
                };
                super::offload::stateless_step(link, self.generation, self.now, &denied, None);
            }
            return Verdict::Drop(reason);
        }
        bump(&cells.forwarded, 1);
        let from = t.attachments[ai];
        let to = if is_multicast(&dst_mac) {
            None
        } else if let Some(at) = t.endpoint(&dst_mac) {
            // An endpoint is where its MAC is, learned or not.
            Some((at, 0))
        } else {
            let ageing = self.compiled.mac_ageing.as_secs();
            self.macs
                .lookup(ti as u32, ai as u32, dst_mac, self.now, ageing)
                .map(|(a, vtep)| (a as usize, vtep))
        };
        let start = flood.len();
        let offloads = tracked.is_some() || stateless_pass;
        if let (true, Some(link), false) = (offloads, self.offload.as_deref_mut(), t.no_offload) {
            // A connection's packet, or a stateless verdict's, with flow
            // hardware in front: offered or withdrawn there.
            let out = match to {
                Some((o, _)) if o != ai && t.attachments[o].vni == 0 => Some(o),
                None if t.attachments.len() == 2 && t.attachments[1 - ai].vni == 0 => Some(1 - ai),
                _ => None,
            };
            let egress = out
                .filter(|_| decap == 0 && remote == 0)
                .map(|o| plain_egress(from, t.attachments[o], 0));
            let at = arrival();
            match (tracked, *l3) {
                (Some((slot, dir)), _) => {
                    let seen = super::offload::Passed {
                        at,
                        l3: *l3,
                        slot,
                        dir,
                    };
                    super::offload::offload_step(
                        link,
                        &mut self.conns,
                        self.generation,
                        &seen,
                        egress,
                    );
                }
                (None, L3::Ip { key, .. }) => {
                    let seen = super::offload::StatelessPacket {
                        at,
                        key,
                        rule: t.rule_id(rule_tag),
                    };
                    super::offload::stateless_step(
                        link,
                        self.generation,
                        self.now,
                        &seen,
                        Some(egress),
                    );
                }
                _ => {}
            }
        }
        match to {
            Some((o, _)) if o == ai => {} // same segment: filtered
            Some((o, _)) if t.attachments[o].vni == 0 => {
                // The common cases, built in place: a learned destination,
                // or a flood with one way out.
                let e = plain_egress(from, t.attachments[o], decap);
                self.learn(ti, src_mac, ai, remote);
                return Verdict::Forward(e);
            }
            None if t.attachments.len() == 2 && t.attachments[1 - ai].vni == 0 => {
                let e = plain_egress(from, t.attachments[1 - ai], decap);
                self.learn(ti, src_mac, ai, remote);
                return Verdict::Forward(e);
            }
            Some((o, vtep)) => self.egress(t, from, o, decap, vtep, flood),
            None => {
                for i in 0..t.attachments.len() {
                    if i != ai {
                        self.egress(t, from, i, decap, 0, flood);
                    }
                }
            }
        }
        // One way out is a forward: no copy.
        let verdict = match flood[start..] {
            [one] => {
                flood.truncate(start);
                Verdict::Forward(one)
            }
            _ => Verdict::Flood,
        };
        self.learn(ti, src_mac, ai, remote);
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::testing::*;

    #[test]
    fn floods_within_the_tenant_then_learns() {
        // t1: ports 0 and 1 whole, VLAN 10 on uplink 3; t2: port 2, VLAN 20 on 3.
        let (_h, mut p) = switch(
            4,
            vec![
                tenant("t1", &[(0, 0), (1, 0), (3, 10)], true),
                tenant("t2", &[(2, 0), (3, 20)], true),
            ],
        );
        let (v, flood) = run(&mut p, 0, udp(1, BCAST, None, 53));
        assert_eq!(v, Verdict::Flood);
        assert_eq!(
            flood,
            vec![
                Egress {
                    vlan: VlanOp::Keep,
                    ..Egress::to(1)
                },
                Egress {
                    vlan: VlanOp::Push(10),
                    ..Egress::to(3)
                }
            ]
        );
        // The reply from the uplink, tagged 10, goes straight back, untagged.
        let (v, _) = run(&mut p, 3, udp(9, mac(1), Some(10), 53));
        assert_eq!(
            v,
            Verdict::Forward(Egress {
                vlan: VlanOp::Strip,
                ..Egress::to(0)
            })
        );
        // The same MAC in t2 is a different station: unknown there, and
        // flooded to t2's one other attachment (a forward, no copy).
        let (v, flood) = run(&mut p, 3, udp(9, mac(1), Some(20), 53));
        assert_eq!(
            v,
            Verdict::Forward(Egress {
                vlan: VlanOp::Strip,
                ..Egress::to(2)
            })
        );
        assert!(flood.is_empty());
        // Unattached VLAN: nobody's.
        assert_eq!(
            run(&mut p, 3, udp(9, mac(1), Some(30), 53)).0,
            Verdict::Drop(DropReason::NoTenant)
        );
        assert_eq!(
            run(&mut p, 3, udp(9, mac(1), None, 53)).0,
            Verdict::Drop(DropReason::NoTenant)
        );
        // Garbage and a multicast source.
        assert_eq!(
            run(&mut p, 0, vec![1, 2, 3]).0,
            Verdict::Drop(DropReason::Malformed)
        );
        let mut f = udp(1, mac(2), None, 53);
        f[6] = 1;
        assert_eq!(run(&mut p, 0, f).0, Verdict::Drop(DropReason::Malformed));
    }

    /// VXLAN: the uplink's VTEP answers ARP for its address; a tenant's
    /// flood reaches its remote VTEPs (an ARP request first while a
    /// VTEP's MAC is unknown); frames from a VNI are decapsulated into
    /// that VNI's tenant only, and replies to a learned station go back
    /// through the tunnel it came from.
    #[test]
    fn vxlan_networks_switch_within_their_tenant() {
        use crate::io::memory::MemPacket;
        use crate::wire::apply_tunnel;
        const LOCAL: u32 = 0xc000_0201; // 192.0.2.1
        const REMOTE: u32 = 0xc000_0202;
        let up_mac = [2, 0, 0, 0, 0, 0xaa];
        let remote_mac = [2, 0, 0, 0, 0, 0xbb];
        let mut t = tenant("t", &[(0, 0)], true);
        t.attachments.push(Attach {
            port: 1,
            vlan: 0,
            vni: 100,
        });
        t.remote_vteps = vec![vec![], vec![REMOTE]];
        let mut u = tenant("u", &[(2, 0)], true);
        u.attachments.push(Attach {
            port: 1,
            vlan: 0,
            vni: 200,
        });
        u.remote_vteps = vec![vec![], vec![REMOTE]];
        let mut cfg = SwitchConfig {
            ports: 3,
            vteps: vec![
                None,
                Some(Vtep {
                    ip: LOCAL,
                    mac: up_mac,
                }),
            ],
            tenants: vec![t, u],
            ..SwitchConfig::default()
        };
        let h = SwitchHandle::new(&cfg).unwrap();
        let mut p = h.pipeline();
        p.turn();
        let from_remote = |vni: u32, inner: Vec<u8>| {
            let mut f = MemPacket(inner);
            assert!(apply_tunnel(
                &mut f,
                &Tunnel {
                    src_mac: remote_mac,
                    dst_mac: up_mac,
                    src_ip: REMOTE,
                    dst_ip: LOCAL,
                    vni,
                    resolve: false,
                }
            ));
            f.0
        };
        let tunnel = |dst_mac: [u8; 6], resolve: bool| Tunnel {
            src_mac: up_mac,
            dst_mac,
            src_ip: LOCAL,
            dst_ip: REMOTE,
            vni: 100,
            resolve,
        };
        // A broadcast before the remote VTEP is known: resolve it.
        let (v, _) = run(&mut p, 0, udp(1, BCAST, None, 53));
        let want = |t: Tunnel| Egress {
            vlan: VlanOp::Keep,
            tunnel: Some(t),
            ..Egress::to(1)
        };
        assert_eq!(v, Verdict::Forward(want(tunnel(BCAST, true))));
        // The remote VTEP asks for ours: answered in place, and learnt.
        let mut arp = vec![0xff; 6];
        arp.extend_from_slice(&remote_mac);
        arp.extend_from_slice(&[8, 6, 0, 1, 8, 0, 6, 4, 0, 1]);
        arp.extend_from_slice(&remote_mac);
        arp.extend_from_slice(&REMOTE.to_be_bytes());
        arp.extend_from_slice(&[0; 6]);
        arp.extend_from_slice(&LOCAL.to_be_bytes());
        let mut reply = arp.clone();
        let mut flood = Vec::new();
        assert_eq!(
            p.process(1, &mut reply, &mut flood),
            Verdict::Forward(Egress::to(1))
        );
        assert_eq!(&reply[0..12], &[remote_mac, up_mac].concat()[..]);
        assert_eq!(&reply[20..22], &[0, 2]);
        assert_eq!(
            &reply[22..32],
            &[&up_mac[..], &LOCAL.to_be_bytes()].concat()[..]
        );
        assert_eq!(&reply[32..42], &arp[22..32]);
        // Now the flood goes through the tunnel.
        let (v, _) = run(&mut p, 0, udp(1, BCAST, None, 53));
        assert_eq!(v, Verdict::Forward(want(tunnel(remote_mac, false))));
        // VNI 100 from the remote: decapsulated to t's port, and mac(9)
        // learnt behind the remote VTEP.
        let inner = udp(9, mac(1), None, 53);
        let (v, _) = run(&mut p, 1, from_remote(100, inner.clone()));
        assert_eq!(
            v,
            Verdict::Forward(Egress {
                decap: VXLAN_OVERHEAD as u16,
                ..Egress::to(0)
            })
        );
        let (v, _) = run(&mut p, 0, udp(1, mac(9), None, 53));
        assert_eq!(v, Verdict::Forward(want(tunnel(remote_mac, false))));
        // VNI 200 is u's: mac(1) is unknown there, it goes to u's port only.
        let (v, _) = run(&mut p, 1, from_remote(200, inner.clone()));
        assert_eq!(
            v,
            Verdict::Forward(Egress {
                decap: VXLAN_OVERHEAD as u16,
                ..Egress::to(2)
            })
        );
        // An unknown VNI, a bad outer checksum, another port: nobody's.
        let (v, _) = run(&mut p, 1, from_remote(300, inner.clone()));
        assert_eq!(v, Verdict::Drop(DropReason::NoTenant));
        let mut bad = from_remote(100, inner.clone());
        bad[24] ^= 1;
        assert_eq!(run(&mut p, 1, bad).0, Verdict::Drop(DropReason::NoTenant));
        let mut other_port = from_remote(100, inner.clone());
        other_port[36..38].copy_from_slice(&4790u16.to_be_bytes());
        let sum = crate::wire::ip_checksum(&other_port[14..34]);
        assert_eq!(sum, 0, "only the UDP port changed");
        assert_eq!(
            run(&mut p, 1, other_port).0,
            Verdict::Drop(DropReason::NoTenant)
        );
        // Frames on the uplink not for the VTEP: no tenant owns the port.
        assert_eq!(
            run(&mut p, 1, inner.clone()).0,
            Verdict::Drop(DropReason::NoTenant)
        );
        // Configuration errors.
        cfg.tenants[1].attachments[1].vni = 100;
        assert!(matches!(
            SwitchHandle::new(&cfg),
            Err(ConfigError::VniOverlap { vni: 100, .. })
        ));
        cfg.tenants[1].attachments[1] = Attach {
            port: 2,
            vlan: 0,
            vni: 7,
        };
        assert!(matches!(
            SwitchHandle::new(&cfg),
            Err(ConfigError::NoVtep {
                port: 2,
                vni: 7,
                ..
            })
        ));
        cfg.tenants[1].attachments[1] = Attach {
            port: 1,
            vlan: 0,
            vni: 1 << 24,
        };
        assert!(matches!(
            SwitchHandle::new(&cfg),
            Err(ConfigError::BadVni { .. })
        ));
    }

    /// One tenant's MAC flood: its new sources beyond its limits are
    /// dropped and counted, while another tenant's stations stay learned
    /// (its unicast forwarded, not flooded) and its new stations are
    /// still learned from its reserve. A station moving to a full
    /// attachment is refused too.
    #[test]
    fn a_mac_flood_stays_within_its_tenant() {
        let (h, mut p) = {
            let h = SwitchHandle::new(&SwitchConfig {
                ports: 6,
                tenants: vec![
                    tenant("flood", &[(0, 0), (1, 0), (2, 0)], true),
                    tenant("calm", &[(3, 0), (4, 0), (5, 0)], true),
                ],
                mac_table_size: 64,
                mac_per_tenant: 48,
                mac_per_attachment: 40,
                mac_reserved_per_tenant: 16,
                ..SwitchConfig::default()
            })
            .unwrap();
            let mut p = h.pipeline();
            p.turn();
            (h, p)
        };
        // calm's stations 1 and 2, learned.
        run(&mut p, 3, udp(1, BCAST, None, 53));
        run(&mut p, 4, udp(2, BCAST, None, 53));
        let known = |p: &mut SwitchPipeline| {
            (
                run(p, 3, udp(1, mac(2), None, 53)).0,
                run(p, 4, udp(2, mac(1), None, 53)).0,
            )
        };
        let before = known(&mut p);
        assert_eq!(
            before,
            (
                Verdict::Forward(Egress::to(4)),
                Verdict::Forward(Egress::to(3))
            )
        );
        // flood sends from 1,000 random sources on port 0.
        let mut rng = dpu_rand::Rng::new(0xf100d);
        let (mut passed, mut limited) = (0, 0);
        for _ in 0..1000 {
            let mut f = udp(7, BCAST, None, 53);
            let r = rng.below(1 << 40);
            f[6..12].copy_from_slice(&[
                2,
                (r >> 32) as u8,
                (r >> 24) as u8,
                (r >> 16) as u8,
                (r >> 8) as u8,
                r as u8,
            ]);
            match run(&mut p, 0, f).0 {
                Verdict::Drop(DropReason::MacLimit) => limited += 1,
                Verdict::Flood => passed += 1,
                v => panic!("{v:?}"),
            }
        }
        // The attachment's limit, then nothing more.
        assert_eq!(passed, 40);
        assert_eq!(limited, 960);
        assert_eq!(p.macs.tenant_len(0), 40);
        // From another attachment: up to the tenant's limit, less what
        // the others' reserve keeps (64 - 16 = 48, the tenant's limit).
        let mut more = 0;
        for i in 0..100u8 {
            let mut f = udp(7, BCAST, None, 53);
            f[6..12].copy_from_slice(&[2, 9, 9, 9, 9, i]);
            more += usize::from(run(&mut p, 1, f).0 == Verdict::Flood);
        }
        assert_eq!(more, 8);
        assert_eq!(p.macs.tenant_len(0), 48);
        // calm is untouched: its unicast still forwarded, and a new
        // station of it learned.
        assert_eq!(known(&mut p), before);
        assert_eq!(run(&mut p, 5, udp(3, BCAST, None, 53)).0, Verdict::Flood);
        assert_eq!(
            run(&mut p, 3, udp(1, mac(3), None, 53)).0,
            Verdict::Forward(Egress::to(5))
        );
        // A known station of flood still passes; it may not move to
        // port 0, whose attachment is full.
        let mut f = udp(7, BCAST, None, 53);
        f[6..12].copy_from_slice(&[2, 9, 9, 9, 9, 0]);
        assert_eq!(run(&mut p, 1, f.clone()).0, Verdict::Flood);
        assert_eq!(run(&mut p, 0, f).0, Verdict::Drop(DropReason::MacLimit));
        let t = h.traffic();
        assert_eq!(t.tenants["calm"].dropped_packets, 0);
        assert_eq!(t.tenants["flood"].dropped_packets, 960 + 92 + 1);
    }

    /// On an attachment whose guard lists source prefixes, a frame whose
    /// network layer the parser cannot see (behind a second 802.1Q tag,
    /// an 802.1ad or pre-standard QinQ tag, MPLS, PPPoE) is dropped as
    /// `Encapsulated`; the same frames pass where no address guard would
    /// look, and a frame the guard can read is still checked.
    #[test]
    fn stacked_tags_do_not_pass_an_address_guard() {
        use crate::wire::{ETH_IPV4, ETH_MPLS, ETH_PPPOE, ETH_QINQ, ETH_VLAN};
        let mut guarded = tenant("guarded", &[(0, 0), (1, 0), (2, 10)], true);
        let g = Guard {
            v4: vec![(0x0a00_0001, 0x0a00_0001)],
            ..Guard::default()
        };
        guarded.guards = vec![g.clone(), Guard::default(), g];
        let (h, mut p) = switch(5, vec![guarded, tenant("open", &[(3, 0), (4, 0)], true)]);
        // 10.0.0.66 spoofed behind the outer header `outer` (ethertype,
        // and the bytes between it and IPv4).
        let hidden = |vlan: Option<u16>, outer: u16, between: &[u8]| {
            let mut f = build::eth(mac(9), mac(1), vlan, outer);
            f.extend_from_slice(between);
            f.extend(build::ipv4(
                [10, 0, 0, 66],
                [10, 0, 0, 99],
                proto::UDP,
                &[0x13, 0x88, 0, 53, 0, 8, 0, 0],
            ));
            f
        };
        let tag = |v: u16, inner: u16| [v.to_be_bytes(), inner.to_be_bytes()].concat();
        let cases = [
            ("802.1Q in 802.1Q", ETH_VLAN, tag(10, ETH_IPV4)),
            ("802.1ad", ETH_QINQ, tag(10, ETH_IPV4)),
            (
                "802.1ad over 802.1Q",
                ETH_QINQ,
                [tag(10, ETH_VLAN), tag(11, ETH_IPV4)].concat(),
            ),
            ("0x9100", 0x9100, tag(10, ETH_IPV4)),
            ("MPLS", ETH_MPLS, vec![0, 1, 0x11, 64]),
            ("PPPoE", ETH_PPPOE, vec![0x11, 0, 0, 1, 0, 30, 0, 0x21]),
        ];
        let enc = Verdict::Drop(DropReason::Encapsulated);
        let mut refused = 0;
        for (what, outer, between) in &cases {
            // A whole-port attachment: with one outer tag the parser
            // reads, or (but for 802.1Q, which it reads) untagged.
            assert_eq!(
                run(&mut p, 0, hidden(Some(5), *outer, between)).0,
                enc,
                "{what}"
            );
            if *outer != ETH_VLAN {
                assert_eq!(
                    run(&mut p, 0, hidden(None, *outer, between)).0,
                    enc,
                    "{what}"
                );
                refused += 1;
            }
            refused += 2;
            // A VLAN attachment: behind its own tag.
            assert_eq!(
                run(&mut p, 2, hidden(Some(10), *outer, between)).0,
                enc,
                "{what}"
            );
            // Unguarded: switched as before.
            assert_eq!(
                run(&mut p, 1, hidden(Some(5), *outer, between)).0,
                Verdict::Flood,
                "{what}"
            );
            assert!(
                matches!(
                    run(&mut p, 3, hidden(Some(5), *outer, between)).0,
                    Verdict::Forward(_)
                ),
                "{what}"
            );
        }
        // One tag the parser reads: the guard sees the spoofed source.
        assert_eq!(
            run(&mut p, 0, hidden(Some(5), ETH_IPV4, &[])).0,
            Verdict::Drop(DropReason::Spoofed)
        );
        // And the real source passes, with a tag or without.
        assert_eq!(run(&mut p, 0, udp(1, BCAST, None, 53)).0, Verdict::Flood);
        assert_eq!(
            run(&mut p, 2, udp(1, BCAST, Some(10), 53)).0,
            Verdict::Flood
        );
        assert_eq!(h.traffic().tenants["guarded"].dropped_packets, refused + 1);
    }

    /// VXLAN enters an attachment only from the remote VTEPs it names or
    /// an underlay range it accepts: a stranger that knows a VNI is
    /// dropped and counted, its inner source is not learned (the tenant's
    /// unicast to that MAC is not tunnelled to it), and the VTEP learns
    /// no neighbour from it, by VXLAN or ARP, for any VNI.
    #[test]
    fn vxlan_enters_only_from_known_vteps() {
        use crate::io::memory::MemPacket;
        use crate::wire::apply_tunnel;
        const LOCAL: u32 = 0xc000_0201; // 192.0.2.1
        const REMOTE: u32 = 0xc000_0202; // 192.0.2.2
        const STRANGER: u32 = 0xc000_0263; // 192.0.2.99
        const RANGE: (u32, u32) = (0xc633_6400, 0xc633_64ff); // 198.51.100.0/24
        let up_mac = [2, 0, 0, 0, 0, 0xaa];
        let mut t = tenant("t", &[(0, 0)], true);
        t.attachments.push(Attach {
            port: 1,
            vlan: 0,
            vni: 100,
        });
        t.remote_vteps = vec![vec![], vec![REMOTE]];
        let mut w = tenant("w", &[(2, 0)], true);
        w.attachments.push(Attach {
            port: 1,
            vlan: 0,
            vni: 300,
        });
        w.vtep_prefixes = vec![vec![], vec![RANGE]];
        let mut cfg = SwitchConfig {
            ports: 3,
            vteps: vec![
                None,
                Some(Vtep {
                    ip: LOCAL,
                    mac: up_mac,
                }),
            ],
            tenants: vec![t, w],
            ..SwitchConfig::default()
        };
        let h = SwitchHandle::new(&cfg).unwrap();
        let mut p = h.pipeline();
        p.turn();
        let from = |src_ip: u32, vni: u32, inner: Vec<u8>| {
            let mut f = MemPacket(inner);
            assert!(apply_tunnel(
                &mut f,
                &Tunnel {
                    src_mac: mac(0xee),
                    dst_mac: up_mac,
                    src_ip,
                    dst_ip: LOCAL,
                    vni,
                    resolve: false,
                }
            ));
            f.0
        };
        let unknown = Verdict::Drop(DropReason::UnknownVtep);
        // The stranger claims t's gateway mac(1) on t's VNI: refused.
        assert_eq!(
            run(&mut p, 1, from(STRANGER, 100, udp(1, BCAST, None, 53))).0,
            unknown
        );
        assert!(!p.neighbours.contains_key(&(1, STRANGER)));
        // t's unicast to mac(1) is still flooded to the configured
        // remote, not tunnelled to the stranger.
        let (v, _) = run(&mut p, 0, udp(2, mac(1), None, 53));
        let Verdict::Forward(Egress {
            tunnel: Some(tun), ..
        }) = v
        else {
            panic!("{v:?}")
        };
        assert_eq!(tun.dst_ip, REMOTE);
        // The configured remote is accepted, and learned from.
        let (v, _) = run(&mut p, 1, from(REMOTE, 100, udp(9, mac(2), None, 53)));
        assert_eq!(
            v,
            Verdict::Forward(Egress {
                decap: VXLAN_OVERHEAD as u16,
                ..Egress::to(0)
            })
        );
        assert!(p.neighbours.contains_key(&(1, REMOTE)));
        // A stranger on a VNI nobody has: nobody's, and not a neighbour.
        assert_eq!(
            run(&mut p, 1, from(STRANGER, 555, udp(1, BCAST, None, 53))).0,
            Verdict::Drop(DropReason::NoTenant)
        );
        assert!(!p.neighbours.contains_key(&(1, STRANGER)));
        // The stranger's ARP: a request is answered (any host would),
        // neither it nor a reply makes it a neighbour, the reply counted.
        let arp = |op: u16, ip: u32| {
            build::arp(
                mac(0xee),
                if op == 1 { BCAST } else { up_mac },
                None,
                op,
                ip.to_be_bytes(),
                LOCAL.to_be_bytes(),
            )
        };
        let (v, _) = run(&mut p, 1, arp(1, STRANGER));
        assert_eq!(v, Verdict::Forward(Egress::to(1)));
        assert_eq!(run(&mut p, 1, arp(2, STRANGER)).0, unknown);
        assert!(!p.neighbours.contains_key(&(1, STRANGER)));
        // A host of w's underlay range is accepted on w's VNI only.
        let inside = RANGE.0 + 7;
        let (v, _) = run(&mut p, 1, from(inside, 300, udp(5, BCAST, None, 53)));
        assert_eq!(
            v,
            Verdict::Forward(Egress {
                decap: VXLAN_OVERHEAD as u16,
                ..Egress::to(2)
            })
        );
        assert!(p.neighbours.contains_key(&(1, inside)));
        assert_eq!(
            run(&mut p, 1, from(inside, 100, udp(5, BCAST, None, 53))).0,
            unknown
        );
        assert_eq!(
            run(&mut p, 1, from(RANGE.1 + 1, 300, udp(5, BCAST, None, 53))).0,
            unknown
        );
        // w's reply to mac(5) goes back to the host it came from.
        let (v, _) = run(&mut p, 2, udp(6, mac(5), None, 53));
        let Verdict::Forward(Egress {
            tunnel: Some(tun), ..
        }) = v
        else {
            panic!("{v:?}")
        };
        assert_eq!(tun.dst_ip, inside);
        let traffic = h.traffic();
        assert_eq!(traffic.tenants["t"].rx_packets, 2, "only t's own frames");
        // A range whose start is past its end is refused.
        cfg.tenants[1].vtep_prefixes = vec![vec![], vec![(RANGE.1, RANGE.0)]];
        assert!(matches!(
            SwitchHandle::new(&cfg),
            Err(ConfigError::BadVtepPrefix { vni: 300, .. })
        ));
    }

    /// Random tenants on random ports, VLANs and VXLAN networks, random
    /// frames from anywhere (forged tags, spoofed and broadcast MACs,
    /// VXLAN on any VNI from any remote VTEP): every output is an
    /// attachment of the input's tenant, never the input itself.
    #[test]
    fn random_traffic_never_leaves_its_tenant() {
        const VTEP: u32 = 0xc000_0201;
        const REMOTES: [u32; 2] = [0xc000_0202, 0xc000_0203];
        const STRANGER: u32 = 0xc000_0263;
        // Outputs into a tunnel, and out of one, and VXLAN refused: all
        // must be exercised.
        let (mut encapsulated, mut decapsulated, mut refused) = (0, 0, 0);
        let mut rng = dpu_rand::Rng::new(0x5eed);
        for round in 0..200 {
            let ports = 1 + rng.below(5) as usize;
            let mut used = std::collections::HashSet::new();
            let mut tenants = Vec::new();
            for t in 0..1 + rng.below(4) {
                let mut att = Vec::new();
                for _ in 0..1 + rng.below(4) {
                    let port = rng.index(ports);
                    let vlan = *rng.pick(&[0u16, 10, 20, 30]);
                    let whole_taken = used.contains(&(port, 0));
                    let any_vlan = (1..4095).any(|v| used.contains(&(port, v)));
                    let ok =
                        !used.contains(&(port, vlan)) && !whole_taken && (vlan != 0 || !any_vlan);
                    if ok {
                        used.insert((port, vlan));
                        att.push((port, vlan));
                    }
                }
                let mut t = tenant(&format!("t{t}"), &att, rng.below(2) == 0);
                // VXLAN networks on port 0's VTEP, flooding to some of
                // two remote VTEPs.
                t.remote_vteps = vec![Vec::new(); t.attachments.len()];
                let vni = *rng.pick(&[100, 200, 300]);
                if rng.below(2) == 0 && used.insert((0, 5000 + vni as u16)) {
                    t.attachments.push(Attach {
                        port: 0,
                        vlan: 0,
                        vni,
                    });
                    let remotes = [REMOTES[0], REMOTES[1]];
                    let n = rng.below(3) as usize;
                    t.remote_vteps.push(remotes[..n].to_vec());
                }
                if rng.below(2) == 0 {
                    // Stateful DNS: replies pass only for the tenant that asked.
                    let mut dns = AclRule::any(1, 0, Family::V4);
                    dns.proto = (proto::UDP, proto::UDP);
                    dns.dst_port = (53, 53);
                    std::sync::Arc::make_mut(&mut t.rules).push(SwitchRule {
                        id: "dns".into(),
                        matches: dns,
                        allow: true,
                        stateful: true,
                        rate_limit: None,
                    });
                }
                tenants.push(t);
            }
            let vteps = vtep_on_port_0(ports, VTEP);
            let h = SwitchHandle::new(&SwitchConfig {
                ports,
                vteps,
                tenants: tenants.clone(),
                ..SwitchConfig::default()
            })
            .unwrap();
            let mut p = h.pipeline();
            p.turn();
            // (tenant, client host) pairs that have asked 10.0.0.99.
            let mut asked = std::collections::HashSet::new();
            let vxlan_owner = |port: usize, vni: u32| -> Option<(usize, Attach)> {
                tenants.iter().enumerate().find_map(|(ti, t)| {
                    t.attachments
                        .iter()
                        .find(|a| a.port == port && a.vni == vni)
                        .map(|a| (ti, *a))
                })
            };
            let owner = |port: usize, vlan: Option<u16>| -> Option<(usize, Attach)> {
                tenants
                    .iter()
                    .enumerate()
                    .find_map(|(ti, t)| {
                        let a = t.attachments.iter().find(|a| {
                            a.port == port
                                && a.vni == 0
                                && vlan.is_some_and(|v| v == a.vlan && a.vlan != 0)
                        });
                        a.map(|a| (ti, *a))
                    })
                    .or_else(|| {
                        tenants.iter().enumerate().find_map(|(ti, t)| {
                            t.attachments
                                .iter()
                                .find(|a| a.port == port && a.vlan == 0 && a.vni == 0)
                                .map(|a| (ti, *a))
                        })
                    })
            };
            for _ in 0..200 {
                let port = rng.index(ports);
                let vlan = *rng.pick(&[None, Some(10), Some(20), Some(30), Some(40)]);
                let dst = if rng.below(3) == 0 {
                    BCAST
                } else {
                    mac(rng.below(6) as u8)
                };
                let src = rng.below(6) as u8;
                // A question from host `src`, or an answer to host `peer`.
                let peer = rng.below(6) as u8;
                let answer = rng.below(2) == 0;
                let frame = if answer {
                    build::udp4(
                        mac(src),
                        dst,
                        vlan,
                        [10, 0, 0, 99],
                        [10, 0, 0, peer],
                        53,
                        5000,
                    )
                } else {
                    udp(src, dst, vlan, 53)
                };
                // Some frames come through port 0's VTEP, from a remote
                // VTEP or a stranger, on a VNI that may be nobody's.
                let vni = *rng.pick(&[0, 0, 100, 200, 300, 400]);
                let src_ip = *rng.pick(&[REMOTES[0], REMOTES[1], STRANGER]);
                let (port, frame) = if vni == 0 {
                    (port, frame)
                } else {
                    let mut f = crate::io::memory::MemPacket(frame);
                    let t = Tunnel {
                        src_mac: mac(0xbb),
                        dst_mac: mac(0xaa),
                        src_ip,
                        dst_ip: VTEP,
                        vni,
                        resolve: false,
                    };
                    assert!(crate::wire::apply_tunnel(&mut f, &t));
                    (0, f.0)
                };
                let ingress = if vni == 0 {
                    owner(port, vlan)
                } else {
                    vxlan_owner(0, vni)
                };
                let (v, flood) = run(&mut p, port, frame);
                // VXLAN enters only from the attachment's remote VTEPs.
                if let (true, Some((ti, a))) = (vni != 0, ingress) {
                    let t = &tenants[ti];
                    let ai = t.attachments.iter().position(|x| *x == a).unwrap();
                    if !t.remote_vteps[ai].contains(&src_ip) {
                        assert_eq!(v, Verdict::Drop(DropReason::UnknownVtep), "round {round}");
                        refused += 1;
                        continue;
                    }
                }
                if let Some((ti, _)) = ingress {
                    let t = &tenants[ti];
                    if !t.default_allow && !t.rules.is_empty() {
                        let passed = !matches!(v, Verdict::Drop(_));
                        if answer {
                            assert_eq!(
                                passed,
                                asked.contains(&(ti, peer)),
                                "round {round}: tenant {ti}'s answer to {peer}"
                            );
                        } else {
                            assert!(passed, "round {round}: tenant {ti}'s question");
                            asked.insert((ti, src));
                        }
                    }
                }
                let outs = match v {
                    Verdict::Forward(e) => vec![e],
                    Verdict::Flood => flood,
                    Verdict::Drop(_) => continue,
                };
                let (ti, from) = ingress
                    .unwrap_or_else(|| panic!("round {round}: forwarded from nobody's port"));
                for e in outs {
                    let out_tag = match e.vlan {
                        VlanOp::Keep => vlan,
                        VlanOp::Strip => None,
                        VlanOp::Push(v) | VlanOp::Set(v) => Some(v),
                    };
                    assert_eq!(e.decap > 0, vni != 0, "round {round}: {e:?}");
                    encapsulated += usize::from(e.tunnel.is_some());
                    decapsulated += usize::from(e.decap > 0);
                    let (to, at) = match e.tunnel {
                        Some(t) => {
                            assert!(REMOTES.contains(&t.dst_ip), "round {round}: {t:?}");
                            vxlan_owner(e.port, t.vni)
                        }
                        None => owner(e.port, out_tag),
                    }
                    .expect("output attached to nobody");
                    assert_eq!(to, ti, "round {round}: tenant {ti} leaked to tenant {to}");
                    assert_ne!(at, from, "round {round}: sent back where it came from");
                }
            }
        }
        assert!(
            encapsulated > 100 && decapsulated > 100 && refused > 100,
            "{encapsulated} {decapsulated} {refused}"
        );
    }
}
