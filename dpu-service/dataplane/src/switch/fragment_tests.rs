//! IP fragments through the switch ([`decide`](super::decide)): a later
//! fragment passes only with its datagram's first; tiny and overlapping
//! fragments are refused; fragmented replies of tracked connections
//! pass; the fragment and connection tables are shared fairly.

use crate::wire::tests::build::{eth, frag4, frag6, ipv4, tcp, udp as udp_header};
use crate::wire::{ETH_IPV4, ETH_IPV6};

use super::testing::*;

/// Client 10.0.0.1 (MAC 1, port 0) and server 10.0.0.2 (MAC 2, port 1).
const CLIENT: [u8; 4] = [10, 0, 0, 1];
const SERVER: [u8; 4] = [10, 0, 0, 2];

/// A fragment of datagram `id` sent by `from` (1 client, 2 server):
/// `l4` is what it carries (the transport header for a first fragment).
fn frag(from: u8, proto: u8, l4: &[u8], id: u16, offset: u16, more: bool) -> Vec<u8> {
    let (src, dst) = if from == 1 {
        (CLIENT, SERVER)
    } else {
        (SERVER, CLIENT)
    };
    let mut f = eth(mac(3 - from), mac(from), None, ETH_IPV4);
    f.extend(frag4(ipv4(src, dst, proto, l4), id, offset, more));
    f
}

/// The three fragments of a 48-byte ICMP echo (request or reply) with
/// identifier `echo`, datagram `id`, from `from`.
fn echo(from: u8, request: bool, echo: u16, id: u16) -> [Vec<u8>; 3] {
    let [hi, lo] = echo.to_be_bytes();
    let mut first = vec![if request { 8 } else { 0 }, 0, 0, 0, hi, lo, 0, 1];
    first.extend([0x55; 8]);
    [
        frag(from, proto::ICMP, &first, id, 0, true),
        frag(from, proto::ICMP, &[0x66; 16], id, 2, true),
        frag(from, proto::ICMP, &[0x77; 16], id, 4, false),
    ]
}

/// The three fragments of a UDP datagram `sport` → `dport`, from `from`.
fn udp_datagram(from: u8, sport: u16, dport: u16, id: u16) -> [Vec<u8>; 3] {
    [
        frag(from, proto::UDP, &udp_header(sport, dport, 8), id, 0, true),
        frag(from, proto::UDP, &[0; 16], id, 2, true),
        frag(from, proto::UDP, &[0; 8], id, 4, false),
    ]
}

fn passes(p: &mut SwitchPipeline, port: usize, f: Vec<u8>) -> Result<(), DropReason> {
    match run(p, port, f).0 {
        Verdict::Drop(r) => Err(r),
        _ => Ok(()),
    }
}

/// Stateful allows from the client: ICMP echo requests, UDP to port 53.
fn client_rules() -> Vec<SwitchRule> {
    let client = AclRule::prefix_range(0x0a00_0001, 32, 32);
    let mut ping = AclRule::any(10, 0, Family::V4);
    ping.src = client;
    ping.proto = (proto::ICMP, proto::ICMP);
    ping.src_port = (8, 8);
    let mut dns = AclRule::any(20, 0, Family::V4);
    dns.src = client;
    dns.proto = (proto::UDP, proto::UDP);
    dns.dst_port = (53, 53);
    [("ping", ping), ("dns", dns)]
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

/// Tenant "a" (ports 0, 1), default deny with [`client_rules`]; tenant
/// "b" (ports 2, 3), the same addresses, default deny, no rules.
fn setup(config: SwitchConfig) -> (SwitchHandle, SwitchPipeline) {
    let mut a = tenant("a", &[(0, 0), (1, 0)], false);
    a.rules = client_rules().into();
    let b = tenant("b", &[(2, 0), (3, 0)], false);
    let h = SwitchHandle::new(&SwitchConfig {
        ports: 4,
        tenants: vec![a, b],
        ..config
    })
    .unwrap();
    let mut p = h.pipeline();
    p.turn();
    (h, p)
}

#[test]
fn fragmented_replies_of_tracked_connections_pass_on_default_deny() {
    let (_h, mut p) = setup(SwitchConfig::default());
    // A fragmented ping and its fragmented reply.
    for f in echo(1, true, 7, 100) {
        assert_eq!(passes(&mut p, 0, f), Ok(()));
    }
    for f in echo(2, false, 7, 200) {
        assert_eq!(passes(&mut p, 1, f), Ok(()));
    }
    // A fragmented DNS query and its fragmented answer.
    for f in udp_datagram(1, 5353, 53, 101) {
        assert_eq!(passes(&mut p, 0, f), Ok(()));
    }
    for f in udp_datagram(2, 53, 5353, 201) {
        assert_eq!(passes(&mut p, 1, f), Ok(()));
    }
    // The server starting something of its own: the first fragment is
    // denied, and the rest with it.
    let [first, rest @ ..] = udp_datagram(2, 53, 9999, 202);
    assert_eq!(passes(&mut p, 1, first), Err(DropReason::AclDeny));
    for f in rest {
        assert_eq!(passes(&mut p, 1, f), Err(DropReason::FragmentUnknown));
    }
    // Tenant "b" has the same addresses and datagram IDs: a's datagrams
    // do nothing for it.
    let [_, later, last] = echo(2, false, 7, 200);
    assert_eq!(passes(&mut p, 3, later), Err(DropReason::FragmentUnknown));
    assert_eq!(passes(&mut p, 3, last), Err(DropReason::FragmentUnknown));
}

/// In any order: a later fragment before its first is dropped (nothing
/// is held back), one after it passes, whatever their own order.
#[test]
fn later_fragments_pass_only_after_their_first_in_any_order() {
    let mut rng = dpu_rand::Rng::new(0xf4a9);
    let (_h, mut p) = setup(SwitchConfig::default());
    for id in 0..200u16 {
        let mut order = [0usize, 1, 2];
        rng.shuffle(&mut order);
        let frags = echo(1, true, id, 1000 + id);
        let mut first_seen = false;
        for &i in &order {
            let want = if i == 0 || first_seen {
                Ok(())
            } else {
                Err(DropReason::FragmentUnknown)
            };
            first_seen |= i == 0;
            assert_eq!(passes(&mut p, 0, frags[i].clone()), want, "{order:?}");
        }
    }
}

/// A later ICMP fragment looks like an echo reply (type 0) to a filter
/// that classifies it: a rule allowing echo replies must not let it by.
#[test]
fn fragmented_icmp_is_not_an_echo_reply() {
    let mut a = tenant("a", &[(0, 0), (1, 0)], false);
    let mut reply = AclRule::any(1, 0, Family::V4);
    reply.proto = (proto::ICMP, proto::ICMP);
    reply.src_port = (0, 0);
    a.rules = vec![SwitchRule {
        id: "echo-reply".into(),
        matches: reply,
        allow: true,
        stateful: false,
        rate_limit: None,
    }]
    .into();
    let (_h, mut p) = switch(2, vec![a]);
    // Parts of an ICMP error or of anything else, without a first.
    let later = frag(2, proto::ICMP, &[0; 16], 9, 2, false);
    assert_eq!(passes(&mut p, 1, later), Err(DropReason::FragmentUnknown));
    // A real, fragmented echo reply passes whole.
    for f in echo(2, false, 1, 10) {
        assert_eq!(passes(&mut p, 1, f), Ok(()));
    }
}

/// A port deny on a default-allow tenant: fragments of a datagram to the
/// denied port do not get by; other datagrams pass whole.
#[test]
fn a_port_deny_is_not_bypassed_by_fragments() {
    let mut a = tenant("a", &[(0, 0), (1, 0)], true);
    let mut deny = AclRule::any(1, 0, Family::V4);
    deny.proto = (proto::UDP, proto::UDP);
    deny.dst_port = (9999, 9999);
    a.rules = vec![SwitchRule {
        id: "no-9999".into(),
        matches: deny,
        allow: false,
        stateful: false,
        rate_limit: None,
    }]
    .into();
    let (h, mut p) = switch(2, vec![a]);
    let [first, rest @ ..] = udp_datagram(1, 5000, 9999, 1);
    assert_eq!(passes(&mut p, 0, first), Err(DropReason::AclDeny));
    for f in rest {
        assert_eq!(passes(&mut p, 0, f), Err(DropReason::FragmentUnknown));
    }
    for f in udp_datagram(1, 5000, 80, 2) {
        assert_eq!(passes(&mut p, 0, f), Ok(()));
    }
    let c = h.traffic().tenants["a"];
    assert_eq!((c.forwarded_packets, c.dropped_packets), (3, 3));
}

/// RFC 1858 and 3128 through the switch: a tiny first fragment and an
/// overlapping one that would rewrite an allowed TCP header into another
/// are dropped, on tenants that filter and on tenants that do not.
#[test]
fn tiny_and_overlapping_fragments_are_dropped() {
    let mut a = tenant("a", &[(0, 0), (1, 0)], true);
    let mut ssh = AclRule::any(1, 0, Family::V4);
    ssh.proto = (proto::TCP, proto::TCP);
    ssh.dst_port = (22, 22);
    a.rules = vec![SwitchRule {
        id: "no-ssh".into(),
        matches: ssh,
        allow: false,
        stateful: false,
        rate_limit: None,
    }]
    .into();
    let (_h, mut p) = switch(2, vec![a]);
    let invalid = Err(DropReason::FragmentInvalid);
    // The ports in one fragment, the flags in the next.
    let syn = tcp(40000, 80, 0x02);
    assert_eq!(
        passes(&mut p, 0, frag(1, proto::TCP, &syn[..8], 1, 0, true)),
        invalid
    );
    // A benign first fragment to port 80, then one at offset 1 whose
    // bytes would turn the destination port into 22 where reassembly
    // lets later data win.
    assert_eq!(
        passes(&mut p, 0, frag(1, proto::TCP, &syn, 2, 0, true)),
        Ok(())
    );
    let mut over = tcp(40000, 22, 0x02);
    over.drain(..8);
    assert_eq!(
        passes(&mut p, 0, frag(1, proto::TCP, &over, 2, 1, false)),
        invalid
    );
    // IPv6, alike.
    let mut f = eth(mac(2), mac(1), None, ETH_IPV6);
    f.extend(frag6(1, 2, proto::TCP, 3, 0, true, &syn[..16]));
    assert_eq!(passes(&mut p, 0, f), invalid);
}

#[test]
fn ipv6_fragments_follow_their_first() {
    let mut a = tenant("a", &[(0, 0), (1, 0)], true);
    let mut deny = AclRule::any(1, 0, Family::V6);
    deny.proto = (proto::UDP, proto::UDP);
    deny.dst_port = (9999, 9999);
    a.rules = vec![SwitchRule {
        id: "no-9999".into(),
        matches: deny,
        allow: false,
        stateful: false,
        rate_limit: None,
    }]
    .into();
    let (_h, mut p) = switch(2, vec![a]);
    let v6 = |dport: u16, id: u32, offset: u16, more: bool| {
        let mut f = eth(mac(2), mac(1), None, ETH_IPV6);
        let data = if offset == 0 {
            udp_header(5000, dport, 8)
        } else {
            vec![0; 16]
        };
        f.extend(frag6(1, 2, proto::UDP, id, offset, more, &data));
        f
    };
    assert_eq!(
        passes(&mut p, 0, v6(9999, 1, 0, true)),
        Err(DropReason::AclDeny)
    );
    assert_eq!(
        passes(&mut p, 0, v6(9999, 1, 2, false)),
        Err(DropReason::FragmentUnknown)
    );
    assert_eq!(passes(&mut p, 0, v6(53, 2, 0, true)), Ok(()));
    assert_eq!(passes(&mut p, 0, v6(53, 2, 2, false)), Ok(()));
    // The other datagram's ID is not this one's.
    assert_eq!(
        passes(&mut p, 0, v6(53, 3, 2, false)),
        Err(DropReason::FragmentUnknown)
    );
}

/// The fragment table is bounded per tenant, keeps each tenant's
/// reserve from the others, and forgets datagrams after the timeout.
#[test]
fn the_fragment_table_is_bounded_shared_and_aged() {
    let mut a = tenant("a", &[(0, 0), (1, 0)], false);
    a.rules = client_rules().into();
    let mut b = tenant("b", &[(2, 0), (3, 0)], false);
    b.rules = client_rules().into();
    let h = SwitchHandle::new(&SwitchConfig {
        ports: 4,
        tenants: vec![a, b],
        fragments_max: 8,
        fragments_per_tenant: 6,
        fragments_reserved_per_tenant: 2,
        fragment_timeout: Duration::from_secs(5),
        ..SwitchConfig::default()
    })
    .unwrap();
    let mut p = h.pipeline();
    p.turn();
    // 8 entries, 2 reserved for each tenant, a pool of 4.
    // Tenant "a" floods first fragments: 6, its cap.
    for id in 0..6 {
        let [first, ..] = echo(1, true, id, id);
        assert_eq!(passes(&mut p, 0, first), Ok(()), "{id}");
    }
    let [first, ..] = echo(1, true, 6, 6);
    assert_eq!(passes(&mut p, 0, first), Err(DropReason::FragmentTableFull));
    // Tenant "b" still has its reserve, 2 (the pool is gone).
    for id in 0..2 {
        let [first, second, _] = echo(1, true, id, id);
        assert_eq!(passes(&mut p, 2, first), Ok(()));
        assert_eq!(passes(&mut p, 2, second), Ok(()));
    }
    let [first, ..] = echo(1, true, 9, 9);
    assert_eq!(passes(&mut p, 2, first), Err(DropReason::FragmentTableFull));
    // Five seconds on, a's datagrams are forgotten: their later
    // fragments are dropped, and new datagrams fit again.
    p.epoch -= Duration::from_secs(5);
    p.turn();
    let [_, later, _] = echo(1, true, 0, 0);
    assert_eq!(passes(&mut p, 0, later), Err(DropReason::FragmentUnknown));
    let mut turns = 0;
    while !p.frags.is_empty() && turns < 10_000 {
        p.turn();
        turns += 1;
    }
    assert!(p.frags.is_empty(), "the sweep ages them all");
    for id in 20..26 {
        let [first, ..] = echo(1, true, id, id);
        assert_eq!(passes(&mut p, 0, first), Ok(()), "{id}");
    }
}

/// Connection-table fairness: two tenants flood new connections until
/// they are refused; a third still opens its reserve's worth, and the
/// flooders' refusals are theirs alone.
#[test]
fn a_connection_flood_never_takes_another_tenants_reserve() {
    let tenants: Vec<TenantConfig> = (0..3)
        .map(|i| {
            let mut t = tenant(&format!("t{i}"), &[(2 * i, 0), (2 * i + 1, 0)], false);
            t.rules = client_rules().into();
            t
        })
        .collect();
    let h = SwitchHandle::new(&SwitchConfig {
        ports: 6,
        tenants,
        conntrack_max: 40,
        conntrack_per_tenant: 30,
        conntrack_reserved_per_tenant: 8,
        ..SwitchConfig::default()
    })
    .unwrap();
    let mut p = h.pipeline();
    p.turn();
    let query = |sport: u16| build::udp4(mac(1), mac(2), None, CLIENT, SERVER, sport, 53);
    // 40 entries, 8 reserved for each of 3 tenants, a pool of 16: t0
    // takes its reserve and the pool, t1 its reserve only.
    let mut opened = [0; 2];
    for (flooder, n) in opened.iter_mut().enumerate() {
        for sport in 1000..1100 {
            match passes(&mut p, 2 * flooder, query(sport)) {
                Ok(()) => *n += 1,
                Err(r) => assert_eq!(r, DropReason::TableFull),
            }
        }
    }
    assert_eq!(opened, [24, 8]);
    // t2 opens its reserve: 8 connections, whose replies pass.
    for sport in 2000..2008 {
        assert_eq!(passes(&mut p, 4, query(sport)), Ok(()), "{sport}");
        let reply = build::udp4(mac(2), mac(1), None, SERVER, CLIENT, 53, sport);
        assert_eq!(passes(&mut p, 5, reply), Ok(()));
    }
    assert_eq!(passes(&mut p, 4, query(2008)), Err(DropReason::TableFull));
    p.store_gauges();
    let t = h.traffic();
    assert_eq!(t.tenants["t2"].conntrack_entries, 8);
    assert_eq!(p.conns.len(), 40);
}
