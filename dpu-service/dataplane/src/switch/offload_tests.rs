//! The switch with flow hardware in front of it: the model NIC carries an
//! established connection, and loses it to a FIN, a rule change and age.

use std::time::Instant;

use crate::offload::model::{ModelLimits, ModelNic};
use crate::offload::{OffloadConfig, OffloadLink, OffloadStatus, Offloader};

use super::testing::*;

/// Tenant "t" on ports 0 and 1; stations 1 (10.0.0.1, port 0) and 2
/// (10.0.0.2, port 1); TCP from 1 to 2's port 80 allowed statefully,
/// everything else denied.
fn config(allow_web: bool) -> SwitchConfig {
    let mut t = tenant("t", &[(0, 0), (1, 0)], false);
    let mut web = AclRule::any(10, 0, Family::V4);
    web.proto = (proto::TCP, proto::TCP);
    web.dst_port = (80, 80);
    t.rules = vec![SwitchRule {
        id: "web".into(),
        matches: web,
        allow: allow_web,
        stateful: true,
        rate_limit: None,
    }]
    .into();
    SwitchConfig {
        ports: 2,
        tenants: vec![t],
        ..SwitchConfig::default()
    }
}

fn seg(from: u8, flags: u8) -> Vec<u8> {
    seg_on(from, 40000, flags)
}

/// A segment of the connection from station 1's port `sport` to station
/// 2's port 80, sent by station `from`.
fn seg_on(from: u8, sport: u16, flags: u8) -> Vec<u8> {
    let (src, dst, a, b) = if from == 1 {
        (1, 2, sport, 80)
    } else {
        (2, 1, 80, sport)
    };
    let mut f = build::eth(mac(dst), mac(src), None, crate::wire::ETH_IPV4);
    f.extend(build::ipv4(
        [10, 0, 0, src],
        [10, 0, 0, dst],
        proto::TCP,
        &build::tcp(a, b, flags),
    ));
    f
}

/// Runs `frame` in on `port` as a burst of one: its verdict, and whether
/// the model NIC carried it (the switch's tenant counters did not move).
fn send(p: &mut SwitchPipeline, h: &SwitchHandle, port: usize, frame: Vec<u8>) -> (Verdict, bool) {
    let rx = |h: &SwitchHandle| h.traffic().tenants["t"].rx_packets;
    let before = rx(h);
    let mut burst = vec![crate::io::memory::MemPacket(frame)];
    let mut flood = Vec::new();
    let mut out = None;
    p.process_burst(port, &mut burst, &mut flood, |_, v, _| out = Some(*v));
    let after = rx(h);
    (out.unwrap(), after == before)
}

/// Turns `p` until `f` holds of the offloader's status (bounded).
fn settle(
    p: &mut SwitchPipeline,
    o: &Offloader,
    f: impl Fn(&OffloadStatus) -> bool,
) -> OffloadStatus {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        p.turn();
        let s = o.status();
        if f(&s) || Instant::now() > end {
            return s;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A switch of `cfg` with the model NIC in front, its offloader run
/// with `offload`, and worker 0's pipeline, turned once.
fn offloaded(
    cfg: &SwitchConfig,
    offload: OffloadConfig,
) -> (SwitchHandle, Offloader, SwitchPipeline) {
    offloaded_with(cfg, offload, 0)
}

/// As [`offloaded`], flows of stateless verdicts offered after
/// `stateless_after` packets.
fn offloaded_with(
    cfg: &SwitchConfig,
    offload: OffloadConfig,
    stateless_after: u16,
) -> (SwitchHandle, Offloader, SwitchPipeline) {
    let h = SwitchHandle::new(cfg).unwrap();
    let (nic, models) = ModelNic::new(ModelLimits::default(), 1);
    let (o, lanes) = Offloader::start(nic, offload, 1).unwrap();
    h.attach_offload(OffloadLink::each(
        lanes,
        Some(models),
        Duration::from_secs(30),
        stateless_after,
    ));
    let mut p = h.pipeline();
    p.turn();
    (h, o, p)
}

/// Every flow out of hardware after configuration `g`, as the daemon asks
/// before it acknowledges a change, while the worker turns meanwhile, as
/// a real one does.
fn invalidate_turning(
    o: &Offloader,
    p: &mut SwitchPipeline,
    g: u64,
) -> Result<usize, crate::offload::OffloadError> {
    std::thread::scope(|s| {
        let j = s.spawn(|| o.invalidate(None, g));
        while !j.is_finished() {
            p.turn();
            std::thread::sleep(Duration::from_micros(100));
        }
        j.join().unwrap()
    })
}

const ACK: u8 = 0x10;
const PSH_ACK: u8 = 0x18;

#[test]
fn an_established_connection_goes_to_the_model_and_comes_back() {
    let cfg = OffloadConfig {
        poll: Duration::from_millis(5),
        ..OffloadConfig::default()
    };
    let (h, o, mut p) = offloaded(&config(true), cfg);
    let fwd = |port| Verdict::Forward(Egress::to(port));
    // The handshake, in software; nothing offered before it completes.
    assert_eq!(send(&mut p, &h, 0, seg(1, 0x02)), (fwd(1), false));
    assert_eq!(send(&mut p, &h, 1, seg(2, 0x12)), (fwd(0), false));
    assert_eq!(o.status().offloaded, 0);
    // The opener's ACK: established, and its direction is offered.
    assert_eq!(send(&mut p, &h, 0, seg(1, ACK)), (fwd(1), false));
    let s = settle(&mut p, &o, |s| s.offloaded == 1);
    assert_eq!(s.offloaded, 1, "{s:?}");
    // The reply direction is offered at its first segment.
    assert_eq!(send(&mut p, &h, 1, seg(2, ACK)), (fwd(0), false));
    settle(&mut p, &o, |s| s.offloaded == 2);
    p.turn();
    // Both directions now go by in the model, as the switch sent them.
    for _ in 0..5 {
        assert_eq!(send(&mut p, &h, 0, seg(1, PSH_ACK)), (fwd(1), true));
        assert_eq!(send(&mut p, &h, 1, seg(2, ACK)), (fwd(0), true));
    }
    let s = settle(&mut p, &o, |s| {
        s.tenants.first().is_some_and(|t| t.carried.packets == 10)
    });
    assert_eq!(s.tenants[0].carried.packets, 10, "{s:?}");
    assert_eq!(s.tenants[0].flows, 2);

    // A FIN reaches software, which withdraws both directions.
    assert_eq!(send(&mut p, &h, 0, seg(1, 0x11)), (fwd(1), false));
    let s = settle(&mut p, &o, |s| s.withdrawn == 2);
    assert_eq!((s.withdrawn, s.in_use), (2, 0), "{s:?}");
    p.turn();
    assert_eq!(send(&mut p, &h, 1, seg(2, ACK)), (fwd(0), false));
    assert_eq!(
        o.status().offloaded,
        2,
        "a closing connection is not offered again"
    );
}

#[test]
fn a_rule_change_takes_the_flows_out_before_it_is_acknowledged() {
    let (h, o, mut p) = offloaded(&config(true), OffloadConfig::default());
    send(&mut p, &h, 0, seg(1, 0x02));
    send(&mut p, &h, 1, seg(2, 0x12));
    send(&mut p, &h, 0, seg(1, ACK));
    settle(&mut p, &o, |s| s.offloaded == 1);
    p.turn();
    assert!(
        send(&mut p, &h, 0, seg(1, PSH_ACK)).1,
        "carried by the model"
    );

    // The rule now denies: published, taken by the worker, then the
    // flows leave hardware; only then is the change acknowledged.
    let g = h.publish(&config(false)).unwrap().generation;
    p.turn();
    assert!(h.taken(g));
    let removed = invalidate_turning(&o, &mut p, g);
    assert_eq!(removed, Ok(1));
    let (v, carried) = send(&mut p, &h, 0, seg(1, PSH_ACK));
    assert!(!carried);
    assert_eq!(v, Verdict::Drop(DropReason::AclDeny));
    p.turn();
    assert_eq!(o.status().invalidated, 1);
}

#[test]
fn a_second_connection_is_offered_after_the_first_closed() {
    let (h, o, mut p) = offloaded(&config(true), OffloadConfig::default());
    for (round, sport) in [40000u16, 40001].into_iter().enumerate() {
        send(&mut p, &h, 0, seg_on(1, sport, 0x02));
        send(&mut p, &h, 1, seg_on(2, sport, 0x12));
        send(&mut p, &h, 0, seg_on(1, sport, ACK));
        send(&mut p, &h, 1, seg_on(2, sport, PSH_ACK));
        let want = 2 * (round as u64 + 1);
        let s = settle(&mut p, &o, |s| s.offloaded == want);
        assert_eq!(s.offloaded, want, "round {round}: {s:?}");
        assert!(send(&mut p, &h, 0, seg_on(1, sport, PSH_ACK)).1);
        send(&mut p, &h, 0, seg_on(1, sport, 0x11));
        send(&mut p, &h, 1, seg_on(2, sport, 0x11));
        send(&mut p, &h, 0, seg_on(1, sport, ACK));
        settle(&mut p, &o, |s| s.withdrawn == want);
    }
}

#[test]
fn a_station_that_moves_takes_its_flows_out_of_hardware() {
    let mut cfg = config(true);
    cfg.ports = 3;
    cfg.tenants[0].attachments.push(Attach::port(2, 0));
    let (h, o, mut p) = offloaded(&cfg, OffloadConfig::default());
    // Learn both stations, then the connection.
    send(&mut p, &h, 1, seg(2, 0x04 | ACK));
    send(&mut p, &h, 0, seg(1, 0x02));
    send(&mut p, &h, 1, seg(2, 0x12));
    send(&mut p, &h, 0, seg(1, ACK));
    send(&mut p, &h, 1, seg(2, ACK));
    settle(&mut p, &o, |s| s.offloaded == 2);
    p.turn();
    assert!(
        send(&mut p, &h, 0, seg(1, PSH_ACK)).1,
        "to station 2, in hardware"
    );
    // Station 2 shows up behind port 2: both flows naming it leave.
    let (v, carried) = send(&mut p, &h, 2, seg(2, ACK));
    assert!(!carried);
    assert_eq!(v, Verdict::Forward(Egress::to(0)));
    let s = settle(&mut p, &o, |s| s.withdrawn == 2);
    assert_eq!((s.withdrawn, s.in_use), (2, 0), "{s:?}");
    p.turn();
    // The next segment to it is switched to its new port.
    let (v, carried) = send(&mut p, &h, 0, seg(1, PSH_ACK));
    assert!(!carried);
    assert_eq!(v, Verdict::Forward(Egress::to(2)));
}

#[test]
fn a_tenant_that_opts_out_offers_nothing() {
    let mut cfg = config(true);
    cfg.tenants[0].no_offload = true;
    let (h, o, mut p) = offloaded(&cfg, OffloadConfig::default());
    send(&mut p, &h, 0, seg(1, 0x02));
    send(&mut p, &h, 1, seg(2, 0x12));
    for _ in 0..3 {
        assert_eq!(
            send(&mut p, &h, 0, seg(1, ACK)),
            (Verdict::Forward(Egress::to(1)), false)
        );
        assert!(!send(&mut p, &h, 1, seg(2, ACK)).1);
    }
    for _ in 0..20 {
        p.turn();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(o.status().offloaded, 0);
}

#[test]
fn a_refused_offer_leaves_its_connection_to_software() {
    let cfg = OffloadConfig {
        table: 1,
        per_tenant: 1,
        reserved: 0,
        ..OffloadConfig::default()
    };
    let (h, o, mut p) = offloaded(&config(true), cfg);
    send(&mut p, &h, 0, seg(1, 0x02));
    send(&mut p, &h, 1, seg(2, 0x12));
    send(&mut p, &h, 0, seg(1, ACK));
    settle(&mut p, &o, |s| s.offloaded == 1);
    // The reply direction has no room: refused and handed back; the
    // connection is not offered again at every segment.
    assert!(!send(&mut p, &h, 1, seg(2, ACK)).1);
    settle(&mut p, &o, |s| s.over_quota == 1);
    for _ in 0..5 {
        p.turn();
    }
    for _ in 0..10 {
        assert!(!send(&mut p, &h, 1, seg(2, ACK)).1);
        p.turn();
    }
    std::thread::sleep(Duration::from_millis(20));
    p.turn();
    assert_eq!(o.status().over_quota, 1, "offered again: {:?}", o.status());
}

/// A UDP datagram from station `from` (port `sport`) to the other
/// station's port 53.
fn udp(from: u8, sport: u16) -> Vec<u8> {
    let to = 3 - from;
    let mut f = build::eth(mac(to), mac(from), None, crate::wire::ETH_IPV4);
    f.extend(build::ipv4(
        [10, 0, 0, from],
        [10, 0, 0, to],
        proto::UDP,
        &build::udp(sport, 53, 16),
    ));
    f
}

#[test]
fn a_denied_flow_is_dropped_in_the_model_after_its_count() {
    let cfg = OffloadConfig {
        poll: Duration::from_millis(5),
        ..OffloadConfig::default()
    };
    let (h, o, mut p) = offloaded_with(&config(true), cfg, 3);
    let deny = Verdict::Drop(DropReason::AclDeny);
    // Only TCP to port 80 is allowed: the first three datagrams are
    // denied here, the third offers the flow as a drop.
    for _ in 0..3 {
        assert_eq!(send(&mut p, &h, 0, udp(1, 5000)), (deny, false));
    }
    let s = settle(&mut p, &o, |s| s.offloaded == 1);
    assert_eq!(s.offloaded, 1, "{s:?}");
    p.turn();
    // Then the model drops the flow before the switch sees it.
    for _ in 0..5 {
        assert_eq!(send(&mut p, &h, 0, udp(1, 5000)), (deny, true));
    }
    // Another flow of the same stations is its own.
    assert_eq!(send(&mut p, &h, 0, udp(1, 5001)), (deny, false));
    let s = settle(&mut p, &o, |s| {
        s.tenants.first().is_some_and(|t| t.dropped.packets == 5)
    });
    assert_eq!(s.tenants[0].dropped.packets, 5, "{s:?}");
    assert_eq!(s.tenants[0].carried.packets, 0, "dropped, not carried");
    // SYNs to a port no rule allows: a drop rule drops every segment,
    // the SYNs too.
    let syn = || seg_on(2, 22, 0x02);
    for _ in 0..3 {
        assert_eq!(send(&mut p, &h, 1, syn()), (deny, false));
    }
    settle(&mut p, &o, |s| s.offloaded == 2);
    p.turn();
    assert_eq!(send(&mut p, &h, 1, syn()), (deny, true));
}

#[test]
fn a_connection_that_opens_withdraws_a_drop_of_its_5_tuple() {
    let cfg = OffloadConfig {
        poll: Duration::from_millis(5),
        ..OffloadConfig::default()
    };
    let (h, o, mut p) = offloaded_with(&config(true), cfg, 2);
    let deny = Verdict::Drop(DropReason::AclDeny);
    // Station 2's segments to station 1's port 40000, before any
    // connection: denied, then dropped in the model.
    for _ in 0..2 {
        assert_eq!(send(&mut p, &h, 1, seg(2, ACK)), (deny, false));
    }
    settle(&mut p, &o, |s| s.offloaded == 1);
    p.turn();
    assert_eq!(send(&mut p, &h, 1, seg(2, ACK)), (deny, true));
    // Station 1 opens that very connection: the drop leaves hardware,
    // and the answer reaches the switch, which lets it by.
    assert_eq!(
        send(&mut p, &h, 0, seg(1, 0x02)),
        (Verdict::Forward(Egress::to(1)), false)
    );
    let s = settle(&mut p, &o, |s| s.withdrawn == 1);
    assert_eq!((s.withdrawn, s.in_use), (1, 0), "{s:?}");
    p.turn();
    assert_eq!(
        send(&mut p, &h, 1, seg(2, 0x12)),
        (Verdict::Forward(Egress::to(0)), false)
    );
}

#[test]
fn an_opted_out_tenant_keeps_its_denied_flows_on_the_cores() {
    let mut cfg = config(true);
    cfg.tenants[0].no_offload = true;
    let (h, o, mut p) = offloaded_with(&cfg, OffloadConfig::default(), 1);
    for _ in 0..10 {
        assert_eq!(
            send(&mut p, &h, 0, udp(1, 5000)),
            (Verdict::Drop(DropReason::AclDeny), false)
        );
        p.turn();
    }
    assert_eq!(o.status().offloaded, 0);
}

/// The tenant of [`config`], with a stateless rule allowing UDP to port
/// 53 (rate-limited with `limited`).
fn config_udp(limited: bool) -> SwitchConfig {
    let mut cfg = config(true);
    let mut dns = AclRule::any(20, 0, Family::V4);
    dns.proto = (proto::UDP, proto::UDP);
    dns.dst_port = (53, 53);
    let mut rules = cfg.tenants[0].rules.to_vec();
    rules.push(SwitchRule {
        id: "dns".into(),
        matches: dns,
        allow: true,
        stateful: false,
        rate_limit: limited.then_some(crate::switch::RateLimit {
            per_second: 1_000_000,
            bits: false,
            burst: 1_000,
        }),
    });
    cfg.tenants[0].rules = rules.into();
    cfg
}

#[test]
fn a_flow_a_stateless_rule_allows_goes_to_the_model_after_its_count() {
    let cfg = OffloadConfig {
        poll: Duration::from_millis(5),
        ..OffloadConfig::default()
    };
    let (h, o, mut p) = offloaded_with(&config_udp(false), cfg, 3);
    let fwd = Verdict::Forward(Egress::to(1));
    for _ in 0..3 {
        assert_eq!(send(&mut p, &h, 0, udp(1, 5000)), (fwd, false));
    }
    settle(&mut p, &o, |s| s.offloaded == 1);
    p.turn();
    for _ in 0..4 {
        assert_eq!(send(&mut p, &h, 0, udp(1, 5000)), (fwd, true));
    }
    let s = settle(&mut p, &o, |s| {
        s.tenants.first().is_some_and(|t| t.carried.packets == 4)
    });
    assert_eq!(s.tenants[0].carried.packets, 4, "{s:?}");
    // They count as matches of the rule that allowed them.
    let names = h.rule_names();
    let dns = s
        .rules
        .iter()
        .find(|r| {
            names
                .get(&r.rule)
                .is_some_and(|(t, id)| t == "t" && id == "dns")
        })
        .unwrap_or_else(|| panic!("no count for rule dns: {s:?}"));
    assert_eq!(dns.matched.packets, 4);
    // Its rule changes to a deny: out of hardware before the change is
    // acknowledged, and denied on the cores again.
    let mut deny = config_udp(false);
    let mut rules = deny.tenants[0].rules.to_vec();
    rules[1].allow = false;
    deny.tenants[0].rules = rules.into();
    let g = h.publish(&deny).unwrap().generation;
    p.turn();
    let removed = invalidate_turning(&o, &mut p, g);
    assert_eq!(removed, Ok(1));
    assert_eq!(
        send(&mut p, &h, 0, udp(1, 5000)),
        (Verdict::Drop(DropReason::AclDeny), false)
    );
}

#[test]
fn a_rate_limited_allow_stays_on_the_cores() {
    let (h, o, mut p) = offloaded_with(&config_udp(true), OffloadConfig::default(), 1);
    for _ in 0..10 {
        assert_eq!(
            send(&mut p, &h, 0, udp(1, 5000)),
            (Verdict::Forward(Egress::to(1)), false)
        );
        p.turn();
    }
    assert_eq!(o.status().offloaded, 0, "its bucket is on the cores");
}

#[test]
fn rule_ids_stay_with_their_rules_and_are_never_given_twice() {
    let h = SwitchHandle::new(&config_udp(false)).unwrap();
    let id_of = |h: &SwitchHandle, rule: &str| {
        h.rule_names()
            .into_iter()
            .find(|(_, (t, r))| t == "t" && r == rule)
            .map(|(id, _)| id)
    };
    let (web, dns) = (id_of(&h, "web").unwrap(), id_of(&h, "dns").unwrap());
    assert_ne!(web, dns);
    // dns removed: forgotten; web keeps its ID.
    h.publish(&config(true)).unwrap();
    assert_eq!(id_of(&h, "dns"), None);
    assert_eq!(id_of(&h, "web"), Some(web));
    // dns again: a new ID, so counts of the old one never reach it.
    h.publish(&config_udp(false)).unwrap();
    let again = id_of(&h, "dns").unwrap();
    assert!(again != dns && again != web);
}
