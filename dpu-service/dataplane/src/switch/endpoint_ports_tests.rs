//! Storage endpoints in the switch: what reaches an endpoint's virtual
//! port, what its own frames may do, and what no other tenant can.

use super::testing::*;
use super::{Endpoint, EndpointPort};
use crate::conntrack::{ACK, SYN};
use crate::wire::tests::build::{arp, eth, ipv4, ipv6, tcp};
use crate::wire::{ETH_IPV4, ETH_IPV6};

/// Blue's and red's endpoints: the same address, MACs of their own.
const BLUE_EP: [u8; 6] = [0x02, 0xd5, 0, 0, 0, 1];
const RED_EP: [u8; 6] = [0x02, 0xd5, 0, 0, 0, 2];
const EP_IP: [u8; 4] = [10, 0, 0, 250];
/// Ports: 0 and 1 blue's (VLAN 10 on 0, all of 1), 2 red's (VLAN 10);
/// the endpoints' virtual ports follow: 3 blue's, 4 red's.
const PORTS: usize = 3;
const BLUE_PORT: usize = 3;
const RED_PORT: usize = 4;

fn endpoint(mac: [u8; 6]) -> Endpoint {
    Endpoint {
        mac,
        ip: std::net::Ipv4Addr::from(EP_IP).into(),
    }
}

/// A TCP rule of order `order` to port `dport` from `src` (`prefix`
/// bits), allowing or denying.
fn tcp_rule(id: &str, order: u32, dport: u16, src: u32, bits: u8, allow: bool) -> SwitchRule {
    let mut m = AclRule::any(order, 0, Family::V4);
    m.proto = (proto::TCP, proto::TCP);
    m.dst_port = (dport, dport);
    m.src = AclRule::prefix_range(u128::from(src), bits, 32);
    SwitchRule {
        id: id.into(),
        matches: m,
        allow,
        stateful: allow,
        rate_limit: None,
    }
}

fn config(blue_rules: Vec<SwitchRule>, blue_allows: bool) -> SwitchConfig {
    let mut blue = tenant("blue", &[(0, 10), (1, 0)], blue_allows);
    blue.rules = blue_rules.into();
    blue.endpoints = vec![endpoint(BLUE_EP)];
    let mut red = tenant("red", &[(2, 10)], true);
    red.endpoints = vec![endpoint(RED_EP)];
    SwitchConfig {
        ports: PORTS,
        tenants: vec![blue, red],
        ..SwitchConfig::default()
    }
}

fn pipeline(c: &SwitchConfig) -> (SwitchHandle, SwitchPipeline) {
    let h = SwitchHandle::new(c).unwrap();
    let mut p = h.pipeline();
    p.turn();
    (h, p)
}

/// A TCP segment from host `h` (MAC `mac(h)`, 10.0.0.h) to the endpoint.
fn to_endpoint(h: u8, dst: [u8; 6], vlan: Option<u16>, sport: u16, flags: u8) -> Vec<u8> {
    let mut f = eth(dst, mac(h), vlan, ETH_IPV4);
    f.extend(ipv4(
        [10, 0, 0, h],
        EP_IP,
        proto::TCP,
        &tcp(sport, 4420, flags),
    ));
    f
}

/// A TCP segment from endpoint `ep` to host `h`.
fn from_endpoint(ep: [u8; 6], src_ip: [u8; 4], h: u8, dport: u16, flags: u8) -> Vec<u8> {
    let mut f = eth(mac(h), ep, None, ETH_IPV4);
    f.extend(ipv4(
        src_ip,
        [10, 0, 0, h],
        proto::TCP,
        &tcp(4420, dport, flags),
    ));
    f
}

/// The ports a verdict sends a frame to.
fn outputs(v: &Verdict, flood: &[Egress]) -> Vec<usize> {
    match v {
        Verdict::Forward(e) => vec![e.port],
        Verdict::Flood => flood.iter().map(|e| e.port).collect(),
        Verdict::Drop(_) => Vec::new(),
    }
}

#[test]
fn endpoints_get_virtual_ports_after_the_drivers() {
    let (h, _) = pipeline(&config(Vec::new(), true));
    let ports = h.endpoint_ports();
    assert_eq!(
        ports,
        [
            EndpointPort {
                tenant: 0,
                endpoint: endpoint(BLUE_EP),
                port: BLUE_PORT
            },
            EndpointPort {
                tenant: 1,
                endpoint: endpoint(RED_EP),
                port: RED_PORT
            },
        ]
    );
    // Without endpoints, nothing changes.
    let (h, _) = switch(PORTS, vec![tenant("blue", &[(0, 10)], true)]);
    assert!(h.endpoint_ports().is_empty());
}

#[test]
fn arp_for_the_endpoint_reaches_it_and_only_its_tenants() {
    let (_h, mut p) = pipeline(&config(Vec::new(), true));
    let who_has = arp(mac(1), BCAST, Some(10), 1, [10, 0, 0, 1], EP_IP);
    let (v, flood) = run(&mut p, 0, who_has.clone());
    assert_eq!(v, Verdict::Flood);
    let to_ep: Vec<_> = flood.iter().filter(|e| e.port == BLUE_PORT).collect();
    assert_eq!(to_ep.len(), 1, "{flood:?}");
    assert_eq!(
        to_ep[0].vlan,
        VlanOp::Strip,
        "the endpoint gets it untagged"
    );
    assert!(!outputs(&v, &flood).contains(&RED_PORT));
    // The same request in red's network (same VLAN ID, same addresses)
    // reaches red's endpoint and nothing of blue's.
    let (v, flood) = run(&mut p, 2, who_has);
    assert_eq!(outputs(&v, &flood), [RED_PORT]);
}

#[test]
fn unicast_to_the_endpoint_goes_to_it_alone_and_never_across_tenants() {
    let (h, mut p) = pipeline(&config(Vec::new(), true));
    // Before anything is learned: straight to the endpoint, not flooded.
    let (v, _) = run(&mut p, 0, to_endpoint(1, BLUE_EP, Some(10), 40000, SYN));
    match v {
        Verdict::Forward(e) => assert_eq!((e.port, e.vlan), (BLUE_PORT, VlanOp::Strip)),
        v => panic!("{v:?}"),
    }
    let (v, _) = run(&mut p, 1, to_endpoint(2, BLUE_EP, None, 40001, SYN));
    assert!(
        matches!(v, Verdict::Forward(e) if e.port == BLUE_PORT),
        "{v:?}"
    );
    // Red's host with blue's addresses (same VLAN ID on its own
    // attachment, same IPs, blue's endpoint MAC): never blue's endpoint.
    for f in [
        to_endpoint(1, BLUE_EP, Some(10), 40000, SYN),
        to_endpoint(1, RED_EP, Some(10), 40000, SYN),
    ] {
        let (v, flood) = run(&mut p, 2, f);
        let out = outputs(&v, &flood);
        assert!(!out.contains(&BLUE_PORT), "{v:?} {flood:?}");
        assert!(out.iter().all(|&o| o == RED_PORT), "{out:?}");
    }
    let t = h.traffic();
    assert_eq!(t.tenants["blue"].forwarded_packets, 2);
    assert_eq!(t.tenants["red"].rx_packets, 2);
}

#[test]
fn the_tenants_rules_drop_storage_traffic_before_the_endpoint() {
    // Deny TCP 4420 from 10.0.0.0/29; allow it from elsewhere.
    let rules = vec![
        tcp_rule("no-storage", 10, 4420, 0x0a00_0000, 29, false),
        tcp_rule("storage", 20, 4420, 0, 0, true),
    ];
    let (h, mut p) = pipeline(&config(rules, false));
    let (v, _) = run(&mut p, 0, to_endpoint(5, BLUE_EP, Some(10), 40000, SYN));
    assert_eq!(v, Verdict::Drop(DropReason::AclDeny));
    let (v, _) = run(&mut p, 0, to_endpoint(9, BLUE_EP, Some(10), 40000, SYN));
    assert!(
        matches!(v, Verdict::Forward(e) if e.port == BLUE_PORT),
        "{v:?}"
    );
    let t = h.traffic();
    assert_eq!(t.tenants["blue"].dropped_packets, 1);
    assert_eq!(t.rules[&("blue".into(), "no-storage".into())].packets, 1);
    assert_eq!(t.rules[&("blue".into(), "storage".into())].packets, 1);

    // The endpoint's answer passes on the connection (the default denies),
    // back to the host's port and VLAN; a connection it opens itself
    // does not.
    let (v, _) = run(
        &mut p,
        BLUE_PORT,
        from_endpoint(BLUE_EP, EP_IP, 9, 40000, SYN | ACK),
    );
    match v {
        Verdict::Forward(e) => assert_eq!((e.port, e.vlan), (0, VlanOp::Push(10))),
        v => panic!("{v:?}"),
    }
    let (v, _) = run(&mut p, BLUE_PORT, from_endpoint(BLUE_EP, EP_IP, 9, 80, SYN));
    assert_eq!(v, Verdict::Drop(DropReason::AclDeny));
    assert_eq!(h.traffic().tenants["blue"].rx_packets, 4);
}

#[test]
fn the_endpoint_sends_only_from_its_own_addresses() {
    let (h, mut p) = pipeline(&config(Vec::new(), true));
    // Learn host 1 on port 0, VLAN 10.
    run(&mut p, 0, to_endpoint(1, BLUE_EP, Some(10), 40000, SYN));
    let (v, _) = run(
        &mut p,
        BLUE_PORT,
        from_endpoint(BLUE_EP, EP_IP, 1, 40000, SYN | ACK),
    );
    assert!(matches!(v, Verdict::Forward(e) if e.port == 0), "{v:?}");
    for f in [
        from_endpoint(mac(7), EP_IP, 1, 40000, ACK),
        from_endpoint(BLUE_EP, [10, 0, 0, 251], 1, 40000, ACK),
        arp(mac(7), BCAST, None, 1, EP_IP, [10, 0, 0, 1]),
        arp(BLUE_EP, BCAST, None, 1, [10, 0, 0, 9], [10, 0, 0, 1]),
    ] {
        let (v, _) = run(&mut p, BLUE_PORT, f);
        assert_eq!(v, Verdict::Drop(DropReason::Spoofed));
    }
    // Its ARP for a host is flooded to the tenant's ports, not to red.
    let (v, flood) = run(
        &mut p,
        BLUE_PORT,
        arp(BLUE_EP, BCAST, None, 1, EP_IP, [10, 0, 0, 3]),
    );
    let mut out = outputs(&v, &flood);
    out.sort_unstable();
    assert_eq!(out, [0, 1]);
    assert_eq!(h.traffic().tenants["blue"].dropped_packets, 4);
}

#[test]
fn a_host_cannot_take_the_endpoints_mac() {
    let (_h, mut p) = pipeline(&config(Vec::new(), true));
    // Host on port 1 sends with the endpoint's MAC: dropped, not learned.
    let mut f = eth(mac(1), BLUE_EP, None, ETH_IPV4);
    f.extend(ipv4(
        EP_IP,
        [10, 0, 0, 1],
        proto::TCP,
        &tcp(4420, 40000, ACK),
    ));
    let (v, _) = run(&mut p, 1, f);
    assert_eq!(v, Verdict::Drop(DropReason::Spoofed));
    let (v, _) = run(&mut p, 0, to_endpoint(1, BLUE_EP, Some(10), 40000, SYN));
    assert!(
        matches!(v, Verdict::Forward(e) if e.port == BLUE_PORT),
        "{v:?}"
    );
}

#[test]
fn bad_endpoints_are_refused() {
    let mut c = config(Vec::new(), true);
    c.tenants[1].endpoints[0].mac = BLUE_EP;
    assert!(matches!(
        SwitchHandle::new(&c),
        Err(ConfigError::BadEndpoint { tenant, .. }) if tenant == "red"
    ));
    let mut c = config(Vec::new(), true);
    c.tenants[0].endpoints.push(Endpoint {
        mac: [0x02, 0xd5, 0, 0, 0, 9],
        ..endpoint(BLUE_EP)
    });
    assert!(matches!(
        SwitchHandle::new(&c),
        Err(ConfigError::BadEndpoint { .. })
    ));
    for mac in [[0x03, 0, 0, 0, 0, 1], [0; 6]] {
        let mut c = config(Vec::new(), true);
        c.tenants[0].endpoints[0].mac = mac;
        assert!(matches!(
            SwitchHandle::new(&c),
            Err(ConfigError::BadEndpoint { .. })
        ));
    }
    let mut c = config(Vec::new(), true);
    c.tenants[0].endpoints[0].ip = std::net::Ipv4Addr::UNSPECIFIED.into();
    assert!(matches!(
        SwitchHandle::new(&c),
        Err(ConfigError::BadEndpoint { .. })
    ));
}

/// Random frames of both tenants and both endpoints, with each other's
/// MACs, VLAN IDs and addresses, through bursts and one by one: an
/// endpoint's port only ever gets frames of its own tenant, and an
/// endpoint's frames only ever leave through its tenant's ports.
#[test]
fn random_traffic_never_reaches_another_tenants_endpoint() {
    use crate::wire::tests::build::udp4;
    let mut rng = dpu_rand::Rng::new(0xe9d5);
    let rules = vec![tcp_rule("storage", 20, 4420, 0, 0, true)];
    let (_h, mut p) = pipeline(&config(rules, rng.below(2) == 0));
    // Whose each port is.
    let owner = |port: usize| match port {
        0 | 1 | BLUE_PORT => "blue",
        _ => "red",
    };
    let macs = [BLUE_EP, RED_EP, BCAST, mac(1), mac(2), mac(3)];
    let ips = [EP_IP, [10, 0, 0, 1], [10, 0, 0, 2], [10, 0, 0, 9]];
    let mut reached = [0usize; 2];
    for i in 0..20_000 {
        let port = rng.below(5) as usize;
        let src = match port {
            BLUE_PORT if rng.below(4) != 0 => BLUE_EP,
            RED_PORT if rng.below(4) != 0 => RED_EP,
            _ => *rng.pick(&macs),
        };
        let dst = *rng.pick(&macs);
        let vlan = *rng.pick(&[None, Some(10), Some(20)]);
        let (sip, dip) = (*rng.pick(&ips), *rng.pick(&ips));
        let f = match rng.below(4) {
            0 => arp(src, dst, vlan, 1 + rng.below(2) as u16, sip, dip),
            1 => udp4(src, dst, vlan, sip, dip, 5000, 4420),
            _ => {
                let mut f = eth(dst, src, vlan, ETH_IPV4);
                let flags = *rng.pick(&[SYN, SYN | ACK, ACK]);
                let (sp, dp) = if rng.below(2) == 0 {
                    (40000, 4420)
                } else {
                    (4420, 40000)
                };
                f.extend(ipv4(sip, dip, proto::TCP, &tcp(sp, dp, flags)));
                f
            }
        };
        let (v, flood) = run(&mut p, port, f);
        for out in outputs(&v, &flood) {
            assert_eq!(
                owner(out),
                owner(port),
                "frame {i} from port {port} to {out}"
            );
            if out >= BLUE_PORT {
                reached[out - BLUE_PORT] += 1;
            }
        }
        if i % 1000 == 999 {
            p.turn();
        }
    }
    // Both endpoints were reached, many times.
    assert!(reached.iter().all(|&n| n > 200), "{reached:?}");
}

#[test]
fn an_endpoint_keeps_its_queues_when_others_come_and_go() {
    let c = config(Vec::new(), true);
    let (h, mut p) = pipeline(&c);
    let links = h.endpoint_links();
    assert_eq!(links.len(), 2);
    assert_eq!(
        links
            .iter()
            .map(|l| (l.tenant.as_str(), l.port))
            .collect::<Vec<_>>(),
        [("blue", BLUE_PORT), ("red", RED_PORT)]
    );
    let red = links[1].queues.clone();
    // The pipeline hands the worker the same queues by virtual port.
    let table = p.endpoints().unwrap().clone();
    assert!(std::ptr::eq(table.get(RED_PORT).unwrap(), &*red));

    // Blue's endpoint goes: red's moves to port 3 with its queues.
    let mut c2 = c.clone();
    c2.tenants[0].endpoints.clear();
    h.publish(&c2).unwrap();
    p.turn();
    let links = h.endpoint_links();
    assert_eq!(links.len(), 1);
    assert_eq!(
        (links[0].tenant.as_str(), links[0].port),
        ("red", BLUE_PORT)
    );
    assert!(std::sync::Arc::ptr_eq(&links[0].queues, &red));
    let table = p.endpoints().unwrap();
    assert!(std::ptr::eq(table.get(BLUE_PORT).unwrap(), &*red));
    assert!(table.get(RED_PORT).is_none());

    // Red's endpoint at another address is another endpoint: new queues.
    let mut c3 = c2.clone();
    c3.tenants[1].endpoints[0].ip = std::net::Ipv4Addr::from(u32::from_be_bytes(EP_IP) + 1).into();
    h.publish(&c3).unwrap();
    assert!(!std::sync::Arc::ptr_eq(&h.endpoint_links()[0].queues, &red));
    // None left: no table at all.
    c3.tenants[1].endpoints.clear();
    h.publish(&c3).unwrap();
    p.turn();
    assert!(p.endpoints().is_none() && h.endpoint_links().is_empty());
}

/// An IPv6 endpoint's address (blue's and red's alike) and a host's.
const EP_IP6: u128 = 0xfd00_0001_0000_0000_0000_0000_0000_0250;
const HOST_IP6: u128 = 0xfd00_0001_0000_0000_0000_0000_0000_0001;

/// Blue's and red's endpoints at [`EP_IP6`].
fn config6() -> SwitchConfig {
    let mut c = config(Vec::new(), true);
    for t in &mut c.tenants {
        t.endpoints[0].ip = std::net::Ipv6Addr::from(EP_IP6).into();
    }
    c
}

/// A neighbour solicitation for `target` from `src` (MAC `src_mac`), to
/// the target's solicited-node group.
fn solicit(src_mac: [u8; 6], vlan: Option<u16>, src: u128, target: u128) -> Vec<u8> {
    let group = 0xff02_0000_0000_0000_0000_0001_ff00_0000 | (target & 0xff_ffff);
    let g = group.to_be_bytes();
    let mut f = eth(
        [0x33, 0x33, g[12], g[13], g[14], g[15]],
        src_mac,
        vlan,
        ETH_IPV6,
    );
    let mut icmp = vec![135, 0, 0, 0, 0, 0, 0, 0];
    icmp.extend(target.to_be_bytes());
    icmp.extend([1, 1]);
    icmp.extend(src_mac);
    f.extend(ipv6(src, group, 58, &icmp));
    f
}

/// A TCP segment between the IPv6 endpoint `ep` (from `src`) and host 1.
fn from_endpoint6(ep: [u8; 6], src: u128, flags: u8) -> Vec<u8> {
    let mut f = eth(mac(1), ep, None, ETH_IPV6);
    f.extend(ipv6(src, HOST_IP6, proto::TCP, &tcp(4420, 40000, flags)));
    f
}

#[test]
fn an_ipv6_endpoint_is_solicited_in_its_tenant_and_sends_as_itself_alone() {
    let (h, mut p) = pipeline(&config6());
    // A host's solicitation reaches blue's endpoint untagged, never red's.
    let ns = solicit(mac(1), Some(10), HOST_IP6, EP_IP6);
    let (v, flood) = run(&mut p, 0, ns.clone());
    let to_ep: Vec<_> = flood.iter().filter(|e| e.port == BLUE_PORT).collect();
    assert_eq!(v, Verdict::Flood);
    assert_eq!(to_ep.len(), 1, "{flood:?}");
    assert_eq!(to_ep[0].vlan, VlanOp::Strip);
    assert!(!outputs(&v, &flood).contains(&RED_PORT));
    // The same solicitation in red's network reaches red's endpoint alone.
    let (v, flood) = run(&mut p, 2, ns);
    assert_eq!(outputs(&v, &flood), [RED_PORT]);
    // A segment to blue's endpoint goes to it alone, and red's copy of it
    // never reaches blue's.
    let to_ep6 = |vlan| {
        let mut f = eth(BLUE_EP, mac(1), vlan, ETH_IPV6);
        f.extend(ipv6(HOST_IP6, EP_IP6, proto::TCP, &tcp(40000, 4420, SYN)));
        f
    };
    let (v, _) = run(&mut p, 0, to_ep6(Some(10)));
    assert!(
        matches!(v, Verdict::Forward(e) if e.port == BLUE_PORT),
        "{v:?}"
    );
    let (v, flood) = run(&mut p, 2, to_ep6(Some(10)));
    assert!(!outputs(&v, &flood).contains(&BLUE_PORT), "{v:?} {flood:?}");

    // The endpoint answers from its own address; its advertisement and
    // its own solicitations pass.
    let (v, _) = run(
        &mut p,
        BLUE_PORT,
        from_endpoint6(BLUE_EP, EP_IP6, SYN | ACK),
    );
    assert!(matches!(v, Verdict::Forward(e) if e.port == 0), "{v:?}");
    let (v, flood) = run(
        &mut p,
        BLUE_PORT,
        solicit(BLUE_EP, None, EP_IP6, HOST_IP6 + 1),
    );
    let mut out = outputs(&v, &flood);
    out.sort_unstable();
    assert_eq!(out, [0, 1]);
    // Any other source, and IPv4 or ARP at all, is spoofing.
    let before = h.traffic().tenants["blue"].dropped_packets;
    let mut v4 = eth(mac(1), BLUE_EP, None, ETH_IPV4);
    v4.extend(ipv4(
        EP_IP,
        [10, 0, 0, 1],
        proto::TCP,
        &tcp(4420, 40000, ACK),
    ));
    for f in [
        from_endpoint6(BLUE_EP, EP_IP6 + 1, ACK),
        solicit(BLUE_EP, None, HOST_IP6 + 7, HOST_IP6),
        v4,
        arp(BLUE_EP, BCAST, None, 1, EP_IP, [10, 0, 0, 1]),
    ] {
        let (v, _) = run(&mut p, BLUE_PORT, f);
        assert_eq!(v, Verdict::Drop(DropReason::Spoofed));
    }
    assert_eq!(h.traffic().tenants["blue"].dropped_packets, before + 4);
}
