//! The IP filter: connection tracking, the tenant's rules (through the
//! worker's flow cache) and rate limits decide whether an IP packet
//! passes.

use crate::conntrack::{ConnKey, ConnTable, Dir, Refused};
use crate::flowcache::FlowCache;
use crate::wire::FlowKey;
use crate::worker::DropReason;

use super::compile::{CompiledTenant, ALLOWS, LIMITED, OPENS};
use super::counters::RuleCells;

/// The tag of the first rule of tenant `t` matching `key`, through the
/// worker's flow cache if the tenant uses it and the cache is not resting.
#[inline]
fn classify(
    t: &CompiledTenant,
    cache: &mut FlowCache,
    key: &FlowKey,
    generation: u64,
) -> Option<u32> {
    // Hashed once, for the lookup and the fill; IPv6 keys have no set.
    let set = if t.cached {
        cache.set(t.uid, key)
    } else {
        None
    };
    let Some(set) = set.filter(|_| cache.admit(1)) else {
        return t.classifier.lookup(key).map(|r| r.tag);
    };
    let found = cache.get_in(set, t.uid, key, generation);
    cache.tally(1, usize::from(found.is_some()));
    if let Some(hit) = found {
        return hit;
    }
    let tag = t.classifier.lookup(key).map(|r| r.tag);
    cache.put_in(set, t.uid, key, generation, tag);
    tag
}

/// The worker's clocks, read once per turn, and its configuration
/// generation.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    pub(super) secs: u64,
    pub(super) micros: u64,
    pub(super) generation: u64,
}

/// What the filter looks at in an IP packet.
#[derive(Debug, Clone, Copy)]
pub(super) struct IpPacket<'k> {
    /// Its classification key.
    pub(super) key: &'k FlowKey,
    /// The tag of the first rule matching `key`, if it was looked up
    /// ahead (`Some(None)`: no rule matches).
    pub(super) tag: Option<Option<u32>>,
    /// Its connection key, if the tenant tracks connections and the
    /// packet can be tracked.
    pub(super) conn: Option<ConnKey>,
    pub(super) tcp_flags: u8,
    pub(super) len: u64,
}

/// What [`filter_ip`] decided: the rule's tag, and the drop or the
/// connection the packet passed on.
pub(super) type Filtered = (Option<u32>, Result<Option<(u32, Dir)>, DropReason>);

/// The filter's decision on IP packet `p` of tenant `t` at `clock`: the
/// tag of the rule that matched, if one was looked up and matched, and
/// whether the packet passes, with the connection (slot and direction)
/// it passed as part of, if it did on a known connection's state. A matching rule's rate limit is taken from
/// `rules` (the worker's cells of the tenant's rules).
#[inline(always)]
pub(super) fn filter_ip(
    t: &CompiledTenant,
    rules: &[RuleCells],
    conns: &mut ConnTable,
    cache: &mut FlowCache,
    clock: Clock,
    p: IpPacket<'_>,
) -> Filtered {
    let Clock {
        secs: now,
        generation,
        ..
    } = clock;
    let IpPacket {
        key,
        conn,
        tcp_flags,
        len,
        ..
    } = p;
    let opens = |tag: u32| t.actions[tag as usize] & OPENS != 0;
    if let Some(ck) = conn {
        let found = match conns.find(&ck, now) {
            None if conns.carries() => conns.adopt(&ck, now, generation),
            found => found,
        };
        if let Some((slot, dir)) = found {
            let current = conns.checked_at(slot, generation)
                || classify(t, cache, &conns.orig(slot), generation).is_some_and(opens);
            if current {
                conns.set_generation(slot, generation);
                let fits = conns.track(slot, dir, tcp_flags, now);
                return (
                    None,
                    fits.then_some(Some((slot, dir)))
                        .ok_or(DropReason::ConntrackInvalid),
                );
            }
            // The rules that let it open no longer do.
            conns.remove(slot);
        }
    }
    let found = match p.tag {
        Some(found) => found,
        None => classify(t, cache, key, generation),
    };
    let Some(tag) = found else {
        return (
            None,
            t.default_allow.then_some(None).ok_or(DropReason::AclDeny),
        );
    };
    let actions = t.actions[tag as usize];
    if actions & ALLOWS == 0 {
        return (Some(tag), Err(DropReason::AclDeny));
    }
    if actions & LIMITED != 0 {
        if let Some(b) = &t.limits[tag as usize] {
            if !b.take(&rules[tag as usize], clock.micros, len) {
                return (Some(tag), Err(DropReason::RateLimited));
            }
        }
    }
    let passed = match conn {
        Some(ck) if opens(tag) => match conns.open(ck, *key, tcp_flags, now, generation) {
            Ok(_) => Ok(None),
            Err(Refused::Invalid) => Err(DropReason::ConntrackInvalid),
            Err(Refused::TenantFull | Refused::TableFull) => Err(DropReason::TableFull),
        },
        _ => Ok(None),
    };
    (Some(tag), passed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::testing::*;

    /// Enough random rules for the flow cache: UDP to one of ports
    /// 50-57, from one of 10.0.0.0-7 or anywhere, allow or deny.
    fn cacheable_rules(rng: &mut dpu_rand::Rng) -> Vec<SwitchRule> {
        (0..FLOW_CACHE_MIN_RULES as u32 + 4)
            .map(|i| {
                let mut m = AclRule::any(i, 0, Family::V4);
                m.proto = (proto::UDP, proto::UDP);
                let d = 50 + rng.below(8) as u16;
                m.dst_port = (d, d);
                if rng.below(2) == 0 {
                    m.src = AclRule::prefix_range(0x0a00_0000 | rng.below(8) as u128, 32, 32);
                }
                SwitchRule {
                    id: format!("r{i}"),
                    matches: m,
                    allow: rng.below(2) == 0,
                    stateful: false,
                    rate_limit: None,
                }
            })
            .collect()
    }

    /// A tenant with enough rules to use the flow cache: every verdict
    /// agrees with a first-match scan of the rules in force, through many
    /// rule changes, while the same 64 flows keep coming back.
    #[test]
    fn cached_verdicts_follow_every_rule_change() {
        let mut rng = dpu_rand::Rng::new(0xcac4e);
        let mut t = tenant("t", &[(0, 0), (1, 0)], false);
        let config = |t: &TenantConfig| SwitchConfig {
            ports: 2,
            tenants: vec![t.clone()],
            flow_cache_entries: 4096,
            ..SwitchConfig::default()
        };
        let h = SwitchHandle::new(&config(&t)).unwrap();
        let mut p = h.pipeline();
        for round in 0..40 {
            t.rules = cacheable_rules(&mut rng).into();

            h.publish(&config(&t)).unwrap();
            p.turn();
            assert!(p.compiled.tenants[0].cached);
            for _ in 0..300 {
                let (src, dport) = (rng.below(8) as u8, 50 + rng.below(8) as u16);
                let key = FlowKey {
                    src: 0x0a00_0000 | u128::from(src),
                    dst: 0x0a00_0063,
                    src_port: 5000,
                    dst_port: dport,
                    proto: proto::UDP,
                    v6: false,
                };
                let want = t
                    .rules
                    .iter()
                    .find(|r| r.matches.matches(&key))
                    .is_some_and(|r| r.allow);
                let frame = build::udp4(
                    mac(1),
                    mac(2),
                    None,
                    [10, 0, 0, src],
                    [10, 0, 0, 99],
                    5000,
                    dport,
                );
                let got = !matches!(run(&mut p, 0, frame).0, Verdict::Drop(_));
                assert_eq!(got, want, "round {round}: {key:?}");
            }
        }
    }

    /// A flow cache far too small for its flows goes to rest and comes
    /// back, one by one and in bursts, and no verdict changes on the way.
    #[test]
    fn a_thrashed_flow_cache_rests_without_changing_a_verdict() {
        use crate::flowcache::{REST, WINDOW};
        use crate::io::memory::MemPacket;
        let mut rng = dpu_rand::Rng::new(0x7e57);
        let mut t = tenant("t", &[(0, 0), (1, 0)], false);
        t.rules = cacheable_rules(&mut rng).into();
        let h = SwitchHandle::new(&SwitchConfig {
            ports: 2,
            tenants: vec![t.clone()],
            flow_cache_entries: 4,
            ..SwitchConfig::default()
        })
        .unwrap();
        let mut p = h.pipeline();
        p.turn();
        assert!(p.compiled.tenants[0].cached);
        // Flow `n`: new source ports while `n` grows; 4 flows repeat.
        let frame = |n: u32| {
            let (src, dport) = (n % 8, 50 + (n / 8 % 8) as u16);
            let key = FlowKey {
                src: 0x0a00_0000 | u128::from(src),
                dst: 0x0a00_0063,
                src_port: 1024 + (n / 64) as u16,
                dst_port: dport,
                proto: proto::UDP,
                v6: false,
            };
            let f = build::udp4(
                mac(1),
                mac(2),
                None,
                [10, 0, 0, src as u8],
                [10, 0, 0, 99],
                key.src_port,
                dport,
            );
            let want = t
                .rules
                .iter()
                .find(|r| r.matches.matches(&key))
                .is_some_and(|r| r.allow);
            (f, want)
        };
        let passes = |v: &Verdict| !matches!(v, Verdict::Drop(_));
        // One by one: every frame a new flow, until well past a rest.
        let total = 2 * WINDOW + REST;
        for n in 0..total {
            let (f, want) = frame(n);
            assert_eq!(passes(&run(&mut p, 0, f).0), want, "frame {n}");
        }
        assert!(
            p.cache.stats().rests >= 2,
            "rested {} times",
            p.cache.stats().rests
        );
        // In bursts: new flows still, then the same four (one set).
        let rests = p.cache.stats().rests;
        for (phase, flows) in [(0, total), (1, 4)] {
            for b in 0..(2 * WINDOW + REST) / BURST as u32 {
                let ns: Vec<u32> = (0..BURST as u32)
                    .map(|i| match phase {
                        0 => total + b * BURST as u32 + i,
                        _ => i % flows,
                    })
                    .collect();
                let mut burst: Vec<MemPacket> = ns.iter().map(|&n| MemPacket(frame(n).0)).collect();
                let mut got = Vec::new();
                p.process_burst(0, &mut burst, &mut Vec::new(), |_, v, _| {
                    got.push(passes(v))
                });
                let want: Vec<bool> = ns.iter().map(|&n| frame(n).1).collect();
                assert_eq!(got, want, "phase {phase} burst {b}");
            }
            if phase == 0 {
                assert!(p.cache.stats().rests > rests, "rests in bursts too");
            }
        }
        let settled = p.cache.stats().rests;
        for _ in 0..4 * WINDOW {
            let (f, want) = frame(3);
            assert_eq!(passes(&run(&mut p, 0, f).0), want);
        }
        assert_eq!(
            p.cache.stats().rests,
            settled,
            "a cache that hits stays in use"
        );
        // The handle sees the counts a second later, and keeps them once
        // the pipeline is gone.
        let seen = p.cache.stats();
        assert!(seen.hits >= 4 * WINDOW as u64 && seen.lookups > seen.hits);
        assert_eq!(
            h.flow_cache(),
            FlowCacheStats::default(),
            "not a second yet"
        );
        p.epoch -= Duration::from_secs(1);
        p.turn();
        assert_eq!(h.flow_cache(), seen);
        let mut q = h.pipeline();
        q.turn();
        drop(p);
        assert_eq!(h.flow_cache(), seen, "kept when it is dropped");
    }

    /// Port 0 may send only from MAC 1 and 10.0.0.1; port 1 is open.
    #[test]
    fn spoofed_sources_are_dropped_on_guarded_attachments() {
        let mut t = tenant("t", &[(0, 0), (1, 0)], true);
        t.guards = vec![Guard {
            macs: vec![mac(1)],
            v4: vec![(0x0a00_0001, 0x0a00_0001)],
            v6: Vec::new(),
        }];
        let (h, mut p) = switch(2, vec![t]);
        let spoofed = Verdict::Drop(DropReason::Spoofed);
        let passed = |p: u16| {
            Verdict::Forward(Egress {
                vlan: VlanOp::Keep,
                ..Egress::to(usize::from(p))
            })
        };
        let udp_from =
            |m: u8, ip: u8| build::udp4(mac(m), BCAST, None, [10, 0, 0, ip], [10, 0, 0, 2], 1, 2);
        assert_eq!(run(&mut p, 0, udp_from(1, 1)).0, passed(1));
        assert_eq!(run(&mut p, 0, udp_from(5, 1)).0, spoofed, "MAC");
        assert_eq!(run(&mut p, 0, udp_from(1, 7)).0, spoofed, "IPv4 source");
        // No IPv6 prefix listed: IPv6 is refused once prefixes are.
        let mut v6 = build::eth(BCAST, mac(1), None, crate::wire::ETH_IPV6);
        v6.extend(build::ipv6(1, 2, proto::UDP, &build::udp(1, 2, 4)));
        assert_eq!(run(&mut p, 0, v6.clone()).0, spoofed, "IPv6");
        // ARP: sender MAC and address are checked; a probe (0.0.0.0) passes.
        let arp = |ip: [u8; 4]| build::arp(mac(1), BCAST, None, 1, ip, [10, 0, 0, 2]);
        assert_eq!(run(&mut p, 0, arp([10, 0, 0, 1])).0, passed(1));
        assert_eq!(run(&mut p, 0, arp([0, 0, 0, 0])).0, passed(1));
        assert_eq!(
            run(&mut p, 0, arp([10, 0, 0, 9])).0,
            spoofed,
            "ARP sender IP"
        );
        let mut forged = arp([10, 0, 0, 1]);
        forged[14 + 8 + 5] = 5; // the sender MAC inside the ARP body
        assert_eq!(run(&mut p, 0, forged).0, spoofed, "ARP sender MAC");
        // The open attachment takes anything.
        assert_eq!(run(&mut p, 1, udp_from(5, 7)).0, passed(0));
        assert_eq!(run(&mut p, 1, v6).0, passed(0));
        let c = h.traffic().tenants["t"];
        assert_eq!((c.rx_packets, c.dropped_packets), (10, 5));
    }

    #[test]
    fn rules_first_match_then_default() {
        let mut t = tenant("t1", &[(0, 0), (1, 0)], false);
        t.rules = dns_and_deny_7().into();
        let (_h, mut p) = switch(2, vec![t]);
        let to_1 = Verdict::Forward(Egress {
            vlan: VlanOp::Keep,
            ..Egress::to(1)
        });
        assert_eq!(run(&mut p, 0, udp(1, mac(2), None, 53)).0, to_1);
        assert_eq!(
            run(&mut p, 0, udp(1, mac(2), None, 80)).0,
            Verdict::Drop(DropReason::AclDeny)
        );
        // Order 5 (deny 10.0.0.7) comes before order 10 (allow DNS).
        assert_eq!(
            run(&mut p, 0, udp(7, mac(2), None, 53)).0,
            Verdict::Drop(DropReason::AclDeny)
        );
        // ARP passes a default-deny tenant; other EtherTypes do not.
        let arp = build::arp(mac(1), BCAST, None, 1, [10, 0, 0, 1], [10, 0, 0, 2]);
        assert_eq!(run(&mut p, 0, arp).0, to_1);
        let mut other = build::eth(BCAST, mac(1), None, 0x88b5);
        other.extend_from_slice(&[0; 46]);
        assert_eq!(run(&mut p, 0, other).0, Verdict::Drop(DropReason::AclDeny));
        // A denied frame teaches nothing: mac(7) stays unknown.
        let now = p.now;
        assert_eq!(p.macs.lookup(0, 1, mac(7), now, u64::MAX), None);
        assert_eq!(
            p.macs.lookup(0, 1, mac(1), now, u64::MAX),
            Some((0, 0)),
            "an allowed one does"
        );
    }

    mod stateful {
        use super::*;
        use crate::conntrack::{ACK, FIN, RST, SYN};
        use crate::wire::tests::build::{eth, ipv4, tcp};
        use crate::wire::ETH_IPV4;

        /// Client 10.0.0.1 (MAC 1) and server 10.0.0.2 (MAC 2).
        const CLIENT: [u8; 4] = [10, 0, 0, 1];
        const SERVER: [u8; 4] = [10, 0, 0, 2];

        fn tcp4(from: u8, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
            let (src, dst) = if from == 1 {
                (CLIENT, SERVER)
            } else {
                (SERVER, CLIENT)
            };
            let mut f = eth(mac(3 - from), mac(from), None, ETH_IPV4);
            f.extend(ipv4(src, dst, proto::TCP, &tcp(sport, dport, flags)));
            f
        }

        fn udp4(from: u8, sport: u16, dport: u16) -> Vec<u8> {
            let (src, dst) = if from == 1 {
                (CLIENT, SERVER)
            } else {
                (SERVER, CLIENT)
            };
            build::udp4(mac(from), mac(3 - from), None, src, dst, sport, dport)
        }

        fn ping(from: u8, request: bool, id: u16) -> Vec<u8> {
            let (src, dst) = if from == 1 {
                (CLIENT, SERVER)
            } else {
                (SERVER, CLIENT)
            };
            let [hi, lo] = id.to_be_bytes();
            let ty = if request { 8 } else { 0 };
            let mut f = eth(mac(3 - from), mac(from), None, ETH_IPV4);
            f.extend(ipv4(src, dst, proto::ICMP, &[ty, 0, 0, 0, hi, lo, 0, 1]));
            f
        }

        /// Stateful allows from the client (port 0) to the server (port
        /// 1): TCP to port 80, UDP to port 53, ICMP echo requests.
        fn rules() -> Vec<SwitchRule> {
            let client = AclRule::prefix_range(0x0a00_0001, 32, 32);
            let mut web = AclRule::any(10, 0, Family::V4);
            web.src = client;
            web.proto = (proto::TCP, proto::TCP);
            web.dst_port = (80, 80);
            let mut dns = AclRule::any(20, 0, Family::V4);
            dns.src = client;
            dns.proto = (proto::UDP, proto::UDP);
            dns.dst_port = (53, 53);
            let mut echo = AclRule::any(30, 0, Family::V4);
            echo.src = client;
            echo.proto = (proto::ICMP, proto::ICMP);
            echo.src_port = (8, 8);
            [("web", web), ("dns", dns), ("echo", echo)]
                .into_iter()
                .map(|(id, matches)| SwitchRule {
                    id: id.into(),
                    matches,
                    allow: true,
                    stateful: true,
                    rate_limit: None,
                })
                .collect()
        }

        fn config(tenants: Vec<TenantConfig>) -> SwitchConfig {
            SwitchConfig {
                ports: 4,
                tenants,
                ..SwitchConfig::default()
            }
        }

        /// Tenant "a" on ports 0 (client) and 1 (server), default deny;
        /// tenant "b" on ports 2 and 3 with the same addresses, no rules.
        fn setup() -> (SwitchHandle, SwitchPipeline, TenantConfig) {
            let mut a = tenant("a", &[(0, 0), (1, 0)], false);
            a.rules = rules().into();
            let b = tenant("b", &[(2, 0), (3, 0)], false);
            let (h, p) = switch(4, vec![a.clone(), b]);
            (h, p, a)
        }

        fn passes(p: &mut SwitchPipeline, port: usize, f: Vec<u8>) -> Result<(), DropReason> {
            match run(p, port, f).0 {
                Verdict::Drop(r) => Err(r),
                _ => Ok(()),
            }
        }

        #[test]
        fn replies_of_allowed_connections_pass_and_nothing_else() {
            let (h, mut p, _) = setup();
            use DropReason::{AclDeny, ConntrackInvalid};
            // Nothing from the server side opens anything.
            assert_eq!(
                passes(&mut p, 1, tcp4(2, 80, 40000, SYN | ACK)),
                Err(AclDeny)
            );
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, ACK)), Err(AclDeny));
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, RST)), Err(AclDeny));
            // A lone ACK or RST toward the allowed port opens nothing either.
            assert_eq!(
                passes(&mut p, 0, tcp4(1, 40000, 80, ACK)),
                Err(ConntrackInvalid)
            );
            assert_eq!(
                passes(&mut p, 0, tcp4(1, 40000, 80, RST)),
                Err(ConntrackInvalid)
            );
            assert_eq!(p.conns.len(), 0);

            // A handshake, data both ways, a close.
            assert_eq!(passes(&mut p, 0, tcp4(1, 40000, 80, SYN)), Ok(()));
            assert_eq!(
                passes(&mut p, 1, tcp4(2, 80, 40000, ACK)),
                Err(ConntrackInvalid)
            );
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, SYN | ACK)), Ok(()));
            assert_eq!(passes(&mut p, 0, tcp4(1, 40000, 80, ACK)), Ok(()));
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, ACK)), Ok(()));
            assert_eq!(passes(&mut p, 0, tcp4(1, 40000, 80, FIN | ACK)), Ok(()));
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, FIN | ACK)), Ok(()));
            assert_eq!(passes(&mut p, 0, tcp4(1, 40000, 80, ACK)), Ok(()));
            // Another port of the same hosts is not part of it.
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40001, ACK)), Err(AclDeny));
            assert_eq!(passes(&mut p, 1, tcp4(2, 22, 40000, ACK)), Err(AclDeny));

            // UDP: the reply passes, the server cannot start its own flow.
            assert_eq!(passes(&mut p, 0, udp4(1, 5353, 53)), Ok(()));
            assert_eq!(passes(&mut p, 1, udp4(2, 53, 5353)), Ok(()));
            assert_eq!(passes(&mut p, 1, udp4(2, 53, 5354)), Err(AclDeny));
            // ICMP echo: the reply with the request's identifier passes.
            assert_eq!(passes(&mut p, 0, ping(1, true, 7)), Ok(()));
            assert_eq!(passes(&mut p, 1, ping(2, false, 7)), Ok(()));
            assert_eq!(passes(&mut p, 1, ping(2, false, 8)), Err(AclDeny));
            assert_eq!(passes(&mut p, 1, ping(2, true, 7)), Err(AclDeny));

            // Tenant "b" has hosts with the same addresses: a's connections
            // do nothing for it.
            assert_eq!(passes(&mut p, 3, udp4(2, 53, 5353)), Err(AclDeny));
            assert_eq!(passes(&mut p, 3, ping(2, false, 7)), Err(AclDeny));

            p.store_gauges();
            let t = h.traffic();
            assert_eq!(t.tenants["a"].conntrack_entries, 3);
            assert_eq!(t.tenants["b"].conntrack_entries, 0);
            assert_eq!(t.rules[&("a".to_string(), "web".to_string())].packets, 3);
        }

        #[test]
        fn a_rule_change_keeps_only_connections_the_new_rules_open() {
            let (h, mut p, a) = setup();
            assert_eq!(passes(&mut p, 0, udp4(1, 5353, 53)), Ok(()));
            assert_eq!(passes(&mut p, 0, tcp4(1, 40000, 80, SYN)), Ok(()));
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, SYN | ACK)), Ok(()));
            assert_eq!(passes(&mut p, 0, tcp4(1, 40000, 80, ACK)), Ok(()));

            // A new rule in front that leaves both allowed: both stay.
            let mut a2 = a.clone();
            let mut ssh = AclRule::any(1, 0, Family::V4);
            ssh.proto = (proto::TCP, proto::TCP);
            ssh.dst_port = (22, 22);
            std::sync::Arc::make_mut(&mut a2.rules).push(SwitchRule {
                id: "no-ssh".into(),
                matches: ssh,
                allow: false,
                stateful: false,
                rate_limit: None,
            });
            let b = tenant("b", &[(2, 0), (3, 0)], false);
            h.publish(&config(vec![a2.clone(), b.clone()])).unwrap();
            p.turn();
            assert_eq!(passes(&mut p, 1, udp4(2, 53, 5353)), Ok(()));
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, ACK)), Ok(()));

            // "web" goes: its connection goes with it, mid-stream, both
            // ways; DNS stays.
            std::sync::Arc::make_mut(&mut a2.rules).retain(|r| r.id != "web");
            h.publish(&config(vec![a2, b])).unwrap();
            p.turn();
            assert_eq!(
                passes(&mut p, 1, tcp4(2, 80, 40000, ACK)),
                Err(DropReason::AclDeny)
            );
            assert_eq!(
                passes(&mut p, 0, tcp4(1, 40000, 80, ACK)),
                Err(DropReason::AclDeny)
            );
            assert_eq!(passes(&mut p, 1, udp4(2, 53, 5353)), Ok(()));
            assert_eq!(p.conns.len(), 1);
        }

        #[test]
        fn a_full_tenant_table_refuses_only_that_tenant() {
            let mut a = tenant("a", &[(0, 0), (1, 0)], false);
            a.rules = rules().into();
            // The same rules, for a tenant on ports 2 and 3.
            let mut b = tenant("b", &[(2, 0), (3, 0)], false);
            b.rules = rules().into();
            let h = SwitchHandle::new(&SwitchConfig {
                conntrack_per_tenant: 3,
                conntrack_max: 100,
                ..config(vec![a, b])
            })
            .unwrap();
            let mut p = h.pipeline();
            p.turn();
            for port in 0..3 {
                assert_eq!(passes(&mut p, 0, udp4(1, 6000 + port, 53)), Ok(()));
            }
            assert_eq!(
                passes(&mut p, 0, udp4(1, 6003, 53)),
                Err(DropReason::TableFull)
            );
            // Its existing connections still work; tenant "b" still opens.
            assert_eq!(passes(&mut p, 1, udp4(2, 53, 6000)), Ok(()));
            assert_eq!(passes(&mut p, 2, udp4(1, 6003, 53)), Ok(()));
            assert_eq!(passes(&mut p, 3, udp4(2, 53, 6003)), Ok(()));
        }

        #[test]
        fn removed_tenants_and_rules_free_their_connections() {
            let (h, mut p, a) = setup();
            for port in 0..10 {
                assert_eq!(passes(&mut p, 0, udp4(1, 6000 + port, 53)), Ok(()));
            }
            assert_eq!(p.conns.len(), 10);
            // Same tenant, no stateful rule left: the sweep frees them.
            let mut a2 = a.clone();
            for r in std::sync::Arc::make_mut(&mut a2.rules).iter_mut() {
                r.stateful = false;
            }
            h.publish(&config(vec![a2])).unwrap();
            // The sweep walks the table a few buckets per turn.
            let mut turns = 0;
            while !p.conns.is_empty() && turns < 100_000 {
                p.turn();
                turns += 1;
            }
            assert_eq!(p.conns.len(), 0);
            p.store_gauges();
            assert_eq!(h.traffic().tenants["a"].conntrack_entries, 0);
        }
    }
}
