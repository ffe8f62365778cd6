//! Fuzzes the per-tenant switch pipeline: a fixed multi-tenant
//! configuration (whole ports, VLANs shared by tenants on different ports,
//! two VLANs of one tenant on one port, stateless and stateful rules,
//! anti-spoofing guards, an unattached port, a VTEP on port 5 with VXLAN
//! networks of some tenants, and in two of the four configurations a
//! tenant with enough rules for the flow cache) and a
//! stream of frames from any port, raw or built from a few fuzzed fields,
//! with configuration changes in between. Tables are tiny, so their
//! limits are reached.
//!
//! Whatever the frames say (forged tags, spoofed or multicast MACs,
//! garbage), the switch must never panic, and:
//! - every output (forwarded or flooded) is an attachment of the tenant
//!   the frame entered on, never that attachment itself, and a flood
//!   names no output twice; into a tunnel only toward a remote VTEP of
//!   that VXLAN attachment; decapsulated exactly when it came in VXLAN;
//! - the VTEP answers ARP for its address where it came from, takes ARP
//!   replies of the remote VTEPs its attachments name and drops others'
//!   as `UnknownVtep`, drops as `NoTenant` a VXLAN frame of nobody's VNI
//!   or anything else addressed to it, and as `UnknownVtep` a VXLAN
//!   frame from a source its attachment does not name;
//! - a frame that does not parse is `Malformed` (`FragmentInvalid` where
//!   it is a fragment that could hide its transport header), one nobody
//!   owns is `NoTenant`, but for the IP layer of a tenant switched at L2
//!   (no rules, allow by default, no address guard), which is not parsed;
//! - a guarded attachment drops exactly the frames its guard refuses, as
//!   `Spoofed`, or as `Encapsulated` where it has a guard and
//!   the network layer is behind a second tag, QinQ, MPLS or PPPoE;
//! - past its guard, a tenant with rules under a default allow drops
//!   such a hidden network layer as `Encapsulated` (or `MacLimit`);
//! - `MacLimit` drops only frames the guard admitted (the table's limits
//!   are not modelled);
//! - a tenant without stateful rules passes exactly what its first
//!   matching rule (or its default policy) allows, flow cache or not,
//!   under the configuration of the moment;
//! - the tenant counters count every frame a tenant received, once
//!   (checked for inputs that stay with the configurations without the
//!   flow-cached tenant);
//! - a second switch, given the same frames as bursts (frames in a row
//!   from one port, between turns), decides exactly the same for each.
//!
//! Input: a sequence of records, each starting with an op byte:
//! - `0x00..=0x7f`: a raw frame: input port `op & 7`, then a length byte
//!   and that many bytes;
//! - `0x80..=0xbf`: a built frame: input port `op & 7`, then 8 bytes of
//!   fields (see [`build`]); into port 5 it may come in VXLAN, or be ARP
//!   for the VTEP (see [`tunnelled`]);
//! - `0xc0..=0xff`: a worker turn; if `op & 1`, first publish
//!   configuration `(op >> 1) & 3` (at most [`MAX_PUBLISHES`] times).
//!
//! Run with `fuzz/run.sh switch` from the repository root.

use std::collections::BTreeMap;

use dpu_dataplane::classify::{AclRule, Family};
use dpu_dataplane::io::memory::MemPacket;
use dpu_dataplane::switch::{
    Attach, Guard, SwitchConfig, SwitchHandle, SwitchPipeline, SwitchRule, TenantConfig, Vtep,
    FLOW_CACHE_MIN_RULES,
};
use dpu_dataplane::wire::{
    self, is_multicast, proto, vtep_frame, ParseError, VtepFrame, ETH_ARP, ETH_IPV4, ETH_IPV6, L3,
    VXLAN_UDP_PORT,
};
use dpu_dataplane::worker::{DropReason, Egress, Pipeline, Verdict, VlanOp};

/// Ports of the switch; input ports 6 and 7 do not exist.
const PORTS: usize = 6;
/// Configuration changes one input may make; later ones are only turns.
const MAX_PUBLISHES: usize = 3;
/// The port with a VTEP, its address (192.0.2.1) and MAC address.
const VTEP_PORT: usize = 5;
const VTEP_IP: u32 = 0xc000_0201;
const VTEP_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xaa];
/// Remote VTEPs (192.0.2.2 and .3).
const REMOTES: [u32; 2] = [0xc000_0202, 0xc000_0203];
/// An underlay host no attachment names (192.0.2.99).
const STRANGER: u32 = 0xc000_0263;
/// VNIs frames may come in on: the last is nobody's.
const VNIS: [u32; 3] = [100, 200, 300];

fn rule(id: &str, order: u32, family: Family, allow: bool, stateful: bool) -> SwitchRule {
    SwitchRule {
        id: id.into(),
        matches: AclRule::any(order, 0, family),
        allow,
        stateful,
        // `SwitchRule` has no `Default`: a field added there is added here.
        rate_limit: None,
    }
}

fn with(mut r: SwitchRule, f: impl FnOnce(&mut AclRule)) -> SwitchRule {
    f(&mut r.matches);
    r
}

fn tenant(
    name: &str,
    attachments: &[(usize, u16)],
    default_allow: bool,
    rules: Vec<SwitchRule>,
) -> TenantConfig {
    TenantConfig {
        name: name.into(),
        attachments: attachments
            .iter()
            .map(|&(port, vlan)| Attach::port(port, vlan))
            .collect(),
        default_allow,
        rules: rules.into(),
        ..TenantConfig::default()
    }
}

/// `t` with a VXLAN attachment on the VTEP's port for `vni`, flooding to
/// `remotes`.
fn vxlan(mut t: TenantConfig, vni: u32, remotes: &[u32]) -> TenantConfig {
    t.remote_vteps.resize(t.attachments.len(), Vec::new());
    t.attachments.push(Attach {
        port: VTEP_PORT,
        vlan: 0,
        vni,
    });
    t.remote_vteps.push(remotes.to_vec());
    t
}

/// The guard of green's first attachment: two source MACs, two IPv4
/// sources, no IPv6.
fn green_guard() -> Guard {
    Guard {
        macs: vec![mac(3), mac(6)],
        v4: vec![(0x0a00_0001, 0x0a00_0002)],
        v6: Vec::new(),
    }
}

/// The rules of the tenant that uses the flow cache: a few that decide
/// the built frames' fate (allow or deny by `variant`), the rest (simple,
/// so that publishing stays cheap) for other destination ports.
fn bulk_rules(variant: u8) -> Vec<SwitchRule> {
    let ports = [53u16, 80, 1234, 5000];
    (0..FLOW_CACHE_MIN_RULES as u32)
        .map(|i| {
            let allow = (i + u32::from(variant)) % 3 != 0;
            let family = if i % 4 == 3 { Family::V6 } else { Family::V4 };
            let mut r = rule(&format!("b{i}"), i * 3 + 1, family, allow, false);
            let m = &mut r.matches;
            m.proto = if i / 16 % 2 == 0 {
                (proto::UDP, proto::UDP)
            } else {
                (proto::TCP, proto::TCP)
            };
            if i < 32 {
                let p = ports[(i / 4 % 4) as usize];
                m.dst_port = (p, p);
                m.src = if family == Family::V6 {
                    AclRule::prefix_range((0xfd00 << 112) | u128::from(i % 4), 128, 128)
                } else {
                    AclRule::prefix_range(0x0a00_0000 | u128::from(i % 4), 32, 32)
                };
            } else {
                m.dst_port = (i as u16 * 50, i as u16 * 50 + 49);
            }
            r
        })
        .collect()
}

/// Configuration `variant` (0..4). The tenant names stay, so their
/// counters carry over from one configuration to the next.
fn config(variant: u8) -> SwitchConfig {
    let udp = |r: &mut AclRule| r.proto = (proto::UDP, proto::UDP);
    let tcp80 = |r: &mut AclRule| {
        r.proto = (proto::TCP, proto::TCP);
        r.dst_port = (80, 80);
    };
    let dns = |r: &mut AclRule| {
        r.proto = (proto::UDP, proto::UDP);
        r.dst_port = (53, 53);
    };
    let icmp = |r: &mut AclRule| r.proto = (proto::ICMP, proto::ICMP);
    let from3 = |r: &mut AclRule| r.src = AclRule::prefix_range(0x0a00_0003, 32, 32);
    let red_rules = vec![
        with(rule("deny3", 5, Family::V4, false, false), from3),
        with(rule("web", 10, Family::V4, true, true), tcp80),
        with(rule("noudp", 20, Family::Any, false, false), udp),
    ];
    let blue_rules = vec![
        with(rule("dns", 1, Family::Any, true, true), dns),
        with(rule("ping", 2, Family::V4, true, true), icmp),
        rule("v6", 3, Family::V6, true, false),
    ];
    let green_rules = vec![
        with(rule("deny3", 1, Family::V4, false, false), from3),
        with(rule("udp", 7, Family::Any, true, false), udp),
    ];
    let guarded = |mut t: TenantConfig| {
        t.guards = vec![green_guard()];
        t
    };
    let tenants = match variant & 3 {
        0 => vec![
            vxlan(
                tenant("red", &[(0, 0), (1, 0), (3, 10)], true, red_rules),
                100,
                &REMOTES[..1],
            ),
            vxlan(
                tenant("blue", &[(2, 0), (3, 20), (3, 30)], false, blue_rules),
                200,
                &REMOTES,
            ),
            guarded(tenant("green", &[(4, 10), (4, 40)], false, green_rules)),
            // Switched at L2 beside tenants that track connections.
            tenant("bulk", &[(5, 0), (3, 50)], true, Vec::new()),
        ],
        // Attachments move; rules change order and statefulness; the
        // flow-cached tenant appears.
        1 => vec![
            vxlan(
                tenant("red", &[(0, 0), (4, 10), (4, 20)], false, blue_rules),
                200,
                &REMOTES[1..],
            ),
            vxlan(
                tenant("blue", &[(2, 0), (3, 20)], true, red_rules),
                100,
                &REMOTES,
            ),
            guarded(tenant(
                "green",
                &[(1, 0), (3, 10), (3, 40)],
                true,
                green_rules,
            )),
            tenant("bulk", &[(5, 0), (3, 50)], true, bulk_rules(1)),
        ],
        // Nobody tracks connections any more.
        2 => vec![
            tenant("red", &[(0, 0), (1, 0), (3, 10)], true, Vec::new()),
            tenant("blue", &[(2, 0), (3, 20), (3, 30)], false, green_rules),
            tenant("green", &[(4, 10), (4, 40)], true, Vec::new()),
            tenant("bulk", &[], false, Vec::new()),
        ],
        // One tenant owns nearly everything; the flow-cached tenant's
        // rules flip their verdicts.
        _ => vec![
            tenant(
                "red",
                &[(0, 0), (1, 0), (2, 0), (3, 10), (3, 20), (4, 30)],
                true,
                red_rules,
            ),
            tenant("blue", &[], false, blue_rules),
            vxlan(
                tenant("green", &[(4, 50)], false, Vec::new()),
                100,
                &[REMOTES[1]],
            ),
            tenant("bulk", &[(5, 0), (4, 10)], false, bulk_rules(3)),
        ],
    };
    let mut vteps = vec![None; PORTS];
    vteps[VTEP_PORT] = Some(Vtep {
        ip: VTEP_IP,
        mac: VTEP_MAC,
    });
    SwitchConfig {
        ports: PORTS,
        vteps,
        tenants,
        // Small tables: their limits are part of what is fuzzed. The
        // tenant's and an attachment's MAC limits and reserve at the
        // table's size (the switch refuses them larger): the table binds.
        mac_table_size: 8,
        mac_per_tenant: 8,
        mac_per_attachment: 8,
        mac_reserved_per_tenant: 8,
        conntrack_max: 16,
        conntrack_per_tenant: 6,
        flow_cache_entries: 4,
        ..SwitchConfig::default()
    }
}

/// The tenant and attachment (indices) a frame on `port` with outer tag
/// `vlan` belongs to, by the configuration's definition: a VLAN
/// attachment for its tag, else the tenant owning the whole port.
fn owner(cfg: &SwitchConfig, port: usize, vlan: Option<u16>) -> Option<(usize, usize)> {
    let find = |f: &dyn Fn(&Attach) -> bool| {
        cfg.tenants.iter().enumerate().find_map(|(ti, t)| {
            t.attachments
                .iter()
                .position(|a| a.port == port && f(a))
                .map(|ai| (ti, ai))
        })
    };
    vlan.and_then(|v| find(&|a| a.vni == 0 && a.vlan != 0 && a.vlan == v))
        .or_else(|| find(&|a| a.vni == 0 && a.vlan == 0))
}

/// The tenant and attachment (indices) of VXLAN network `vni` on `port`.
fn vxlan_owner(cfg: &SwitchConfig, port: usize, vni: u32) -> Option<(usize, usize)> {
    cfg.tenants.iter().enumerate().find_map(|(ti, t)| {
        t.attachments
            .iter()
            .position(|a| a.port == port && a.vni == vni)
            .map(|ai| (ti, ai))
    })
}

/// Whether the VTEP's port knows `ip` as a remote VTEP: named by one of
/// the port's VXLAN attachments.
fn vtep_peer(cfg: &SwitchConfig, ip: u32) -> bool {
    cfg.tenants.iter().any(|t| {
        t.attachments
            .iter()
            .zip(&t.remote_vteps)
            .any(|(a, r)| a.port == VTEP_PORT && a.vni != 0 && r.contains(&ip))
    })
}

/// Why `guard` refuses a frame from `src_mac` with network layer `l3`, if
/// it does (the documented rules of `Guard`, written out again).
fn guard_refusal(guard: &Guard, src_mac: &[u8; 6], l3: &L3) -> Option<DropReason> {
    let guarded = !guard.macs.is_empty() || !guard.v4.is_empty() || !guard.v6.is_empty();
    if let L3::Other(ethertype) = l3 {
        if guarded && HIDDEN.contains(ethertype) {
            return Some(DropReason::Encapsulated);
        }
    }
    (!guard_allows(guard, src_mac, l3)).then_some(DropReason::Spoofed)
}

/// Whether `guard`'s source checks let a frame from `src_mac` with
/// network layer `l3` in.
fn guard_allows(guard: &Guard, src_mac: &[u8; 6], l3: &L3) -> bool {
    let mac_ok = |m: &[u8; 6]| guard.macs.is_empty() || guard.macs.contains(m);
    let in_v4 = |a: u32| guard.v4.iter().any(|&(lo, hi)| (lo..=hi).contains(&a));
    let prefixes = !guard.v4.is_empty() || !guard.v6.is_empty();
    if !mac_ok(src_mac) {
        return false;
    }
    match l3 {
        L3::Ip { key, .. } if prefixes => {
            if key.v6 {
                guard
                    .v6
                    .iter()
                    .any(|&(lo, hi)| (lo..=hi).contains(&key.src))
            } else {
                in_v4(key.src as u32)
            }
        }
        L3::Arp {
            sender_mac,
            sender_ip,
            ..
        } => mac_ok(sender_mac) && (!prefixes || *sender_ip == 0 || in_v4(*sender_ip)),
        _ => true,
    }
}

/// What a stateless tenant's filter must decide for a parsed frame.
fn expected_pass(t: &TenantConfig, l3: &L3) -> bool {
    match l3 {
        // A later fragment carries no transport header to filter: it
        // passes with its datagram's first fragment, and this target sends
        // none, so only a tenant with nothing to filter lets it by.
        L3::Ip {
            later_fragment: true,
            ..
        } => t.default_allow && t.rules.is_empty(),
        L3::Ip { key, .. } => t
            .rules
            .iter()
            .filter(|r| r.matches.matches(key))
            .min_by_key(|r| r.matches.order)
            .map_or(t.default_allow, |r| r.allow),
        L3::Arp { .. } => true,
        // A tenant with rules does not let a hidden network layer by.
        L3::Other(ethertype) if HIDDEN.contains(ethertype) && !t.rules.is_empty() => false,
        L3::Other(_) => t.default_allow,
    }
}

/// EtherTypes behind which the parser does not look: a second 802.1Q
/// tag, 802.1ad and pre-standard QinQ tags, MPLS, PPPoE, bridged Ethernet.
const HIDDEN: [u16; 9] = [
    0x8100, 0x88a8, 0x9100, 0x9200, 0x9300, 0x8847, 0x8848, 0x8864, 0x6558,
];

fn mac(n: u8) -> [u8; 6] {
    if n == 7 {
        [0xff; 6]
    } else {
        [2, 0, 0, 0, 0, n]
    }
}

/// Builds a frame from 8 bytes of fields: source and destination MAC
/// (7 is broadcast), outer tag, kind (UDP, TCP, ICMP over IPv4, ARP, UDP,
/// TCP, ICMPv6 over IPv6, another EtherType), addresses, TCP flags, ports,
/// ICMP type and echo identifier.
fn build(f: [u8; 8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(96);
    b.extend_from_slice(&mac(f[0] >> 3 & 7));
    b.extend_from_slice(&mac(f[0] & 7));
    let vlan = [
        None,
        Some(10),
        Some(20),
        Some(30),
        Some(40),
        Some(50),
        Some(0),
        Some(4095),
    ];
    if let Some(v) = vlan[usize::from(f[1] & 7)] {
        b.extend_from_slice(&[0x81, 0x00]);
        b.extend_from_slice(&(v | u16::from(f[7] & 0xe0) << 8).to_be_bytes());
    }
    let ip4 = |i: u8| [10, 0, 0, i & 3];
    let ip6 = |i: u8| (0xfd00_u128 << 112) | u128::from(i & 3);
    let (src_i, dst_i) = (f[2] & 3, f[2] >> 2 & 3);
    let ports = [53u16, 80, 1234, 5000];
    let (sport, dport) = (
        ports[usize::from(f[4] & 3)],
        ports[usize::from(f[4] >> 2 & 3)],
    );
    let l4 = |p: u8| -> Vec<u8> {
        match p {
            proto::TCP => {
                let mut t = vec![0u8; 20];
                t[0..2].copy_from_slice(&sport.to_be_bytes());
                t[2..4].copy_from_slice(&dport.to_be_bytes());
                t[12] = 5 << 4;
                t[13] = f[3];
                t
            }
            proto::UDP => {
                let mut u = vec![0u8; 8];
                u[0..2].copy_from_slice(&sport.to_be_bytes());
                u[2..4].copy_from_slice(&dport.to_be_bytes());
                u[4..6].copy_from_slice(&8u16.to_be_bytes());
                u
            }
            _ => {
                // Echo request / reply, or the type as given.
                let ty = match (f[5] & 3, p) {
                    (0, proto::ICMP) => 8,
                    (1, proto::ICMP) => 0,
                    (0, _) => 128,
                    (1, _) => 129,
                    _ => f[5],
                };
                vec![ty, f[3], 0, 0, 0, f[6], 0, 1]
            }
        }
    };
    let kind = f[1] >> 3 & 7;
    match kind {
        0..=2 => {
            let p = [proto::UDP, proto::TCP, proto::ICMP][usize::from(kind)];
            let l4 = l4(p);
            b.extend_from_slice(&ETH_IPV4.to_be_bytes());
            let total = (20 + l4.len()) as u16;
            b.extend_from_slice(&[0x45, 0]);
            b.extend_from_slice(&total.to_be_bytes());
            // A later fragment now and then.
            let frag: u16 = if f[7] & 0x1f == 1 { 0x00b9 } else { 0 };
            b.extend_from_slice(&[0, 1]);
            b.extend_from_slice(&frag.to_be_bytes());
            b.extend_from_slice(&[64, p, 0, 0]);
            b.extend_from_slice(&ip4(src_i));
            b.extend_from_slice(&ip4(dst_i));
            b.extend_from_slice(&l4);
        }
        3 => {
            b.extend_from_slice(&ETH_ARP.to_be_bytes());
            b.extend_from_slice(&[0, 1, 8, 0, 6, 4]);
            b.extend_from_slice(&(u16::from(f[3] & 1) + 1).to_be_bytes());
            b.extend_from_slice(&mac(f[0] & 7));
            b.extend_from_slice(&ip4(src_i));
            b.extend_from_slice(&[0; 6]);
            b.extend_from_slice(&ip4(dst_i));
        }
        4..=6 => {
            let p = [proto::UDP, proto::TCP, proto::ICMPV6][usize::from(kind - 4)];
            let l4 = l4(p);
            b.extend_from_slice(&ETH_IPV6.to_be_bytes());
            b.extend_from_slice(&[0x60, 0, 0, 0]);
            b.extend_from_slice(&(l4.len() as u16).to_be_bytes());
            b.extend_from_slice(&[p, 64]);
            b.extend_from_slice(&ip6(src_i).to_be_bytes());
            b.extend_from_slice(&ip6(dst_i).to_be_bytes());
            b.extend_from_slice(&l4);
        }
        _ => {
            b.extend_from_slice(&0x88b5u16.to_be_bytes());
            b.extend_from_slice(&[0; 46]);
        }
    }
    // Ethernet padding.
    b.extend(std::iter::repeat_n(0, usize::from(f[7] & 3) * 8));
    b
}

/// A built frame `frame` (fields `f`) as it enters the VTEP's port: as
/// it is if `f[1] >> 6` is 0; else, for ARP, a request or reply to the
/// VTEP's address; for any other frame, the frame in VXLAN from a remote
/// VTEP (`f[2] >> 4 & 1`) on `VNIS[f[1] >> 6 - 1]`, with a broken outer
/// checksum if `f[2] >> 5 & 1`.
fn tunnelled(mut frame: Vec<u8>, f: [u8; 8]) -> Vec<u8> {
    let sel = usize::from(f[1] >> 6);
    if sel == 0 {
        return frame;
    }
    if frame.len() >= 42 && frame[12..14] == ETH_ARP.to_be_bytes() {
        frame[38..42].copy_from_slice(&VTEP_IP.to_be_bytes());
        return frame;
    }
    let mut b = Vec::with_capacity(frame.len() + 50);
    b.extend_from_slice(&VTEP_MAC);
    b.extend_from_slice(&mac(5));
    b.extend_from_slice(&ETH_IPV4.to_be_bytes());
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((36 + frame.len()) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = proto::UDP;
    let src = match f[2] >> 6 {
        3 => STRANGER,
        _ => REMOTES[usize::from(f[2] >> 4 & 1)],
    };
    ip[12..16].copy_from_slice(&src.to_be_bytes());
    ip[16..20].copy_from_slice(&VTEP_IP.to_be_bytes());
    let sum = wire::ip_checksum(&ip) ^ u16::from(f[2] >> 5 & 1);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    b.extend_from_slice(&ip);
    b.extend_from_slice(&49152u16.to_be_bytes());
    b.extend_from_slice(&VXLAN_UDP_PORT.to_be_bytes());
    b.extend_from_slice(&((16 + frame.len()) as u16).to_be_bytes());
    b.extend_from_slice(&[0, 0, 0x08, 0, 0, 0]);
    b.extend_from_slice(&(VNIS[sel - 1] << 8).to_be_bytes());
    b.extend_from_slice(&frame);
    b
}

/// Expected tenant counters: received, forwarded, dropped.
type Counts = BTreeMap<String, (u64, u64, u64)>;

fn check(
    cfg: &SwitchConfig,
    port: usize,
    frame: &[u8],
    verdict: Verdict,
    flood: &[Egress],
    counts: &mut Counts,
) {
    // What the VTEP takes, and where a VXLAN frame's inner frame starts.
    let (mut decap, mut network) = (0, None);
    if port == VTEP_PORT {
        match vtep_frame(frame, VTEP_IP) {
            VtepFrame::Other => {}
            VtepFrame::Invalid => {
                assert_eq!(verdict, Verdict::Drop(DropReason::NoTenant));
                return;
            }
            VtepFrame::ArpRequest { .. } => {
                assert_eq!(verdict, Verdict::Forward(Egress::to(port)), "ARP reply");
                return;
            }
            VtepFrame::ArpReply { sender_ip, .. } => {
                if vtep_peer(cfg, sender_ip) {
                    assert_eq!((verdict, flood.len()), (Verdict::Flood, 0), "ARP taken");
                } else {
                    assert_eq!(verdict, Verdict::Drop(DropReason::UnknownVtep), "ARP");
                }
                return;
            }
            VtepFrame::Vxlan {
                inner, vni, src_ip, ..
            } => {
                let Some(o) = vxlan_owner(cfg, port, vni) else {
                    assert_eq!(verdict, Verdict::Drop(DropReason::NoTenant), "VNI {vni}");
                    return;
                };
                if !cfg.tenants[o.0].remote_vteps[o.1].contains(&src_ip) {
                    assert_eq!(
                        verdict,
                        Verdict::Drop(DropReason::UnknownVtep),
                        "VNI {vni} from {src_ip:#x}"
                    );
                    return;
                }
                (decap, network) = (inner, Some(o));
            }
        }
    }
    let Ok(l2) = wire::parse_l2(&frame[decap..]) else {
        assert_eq!(verdict, Verdict::Drop(DropReason::Malformed));
        return;
    };
    let found = network.or_else(|| owner(cfg, port, l2.vlan));
    // IP is switched at L2, unparsed, where nothing would look at it.
    let opaque = matches!(l2.l3, L3::Other(ETH_IPV4 | ETH_IPV6))
        && found.is_some_and(|(ti, _)| {
            let t = &cfg.tenants[ti];
            t.rules.is_empty()
                && t.default_allow
                && t.guards
                    .iter()
                    .take(t.attachments.len())
                    .all(|g| g.v4.is_empty() && g.v6.is_empty())
        });
    let h = match opaque {
        true => l2,
        false => match wire::parse(&frame[decap..]) {
            Ok(h) => h,
            Err(e) => {
                let reason = match e {
                    ParseError::Fragment(_) => DropReason::FragmentInvalid,
                    _ => DropReason::Malformed,
                };
                assert_eq!(verdict, Verdict::Drop(reason), "{e:?}");
                return;
            }
        },
    };
    let Some((ti, ai)) = found else {
        assert_eq!(verdict, Verdict::Drop(DropReason::NoTenant), "{h:?}");
        return;
    };
    if is_multicast(&h.src_mac) {
        assert_eq!(verdict, Verdict::Drop(DropReason::Malformed), "{h:?}");
        return;
    }
    let t = &cfg.tenants[ti];
    let from = t.attachments[ai];
    let c = counts.entry(t.name.clone()).or_default();
    c.0 += 1;
    let refusal = t
        .guards
        .get(ai)
        .and_then(|g| guard_refusal(g, &h.src_mac, &h.l3));
    let admitted = refusal.is_none();
    // Past the guard, a tenant with rules under a default allow refuses a
    // network layer it cannot filter.
    let hidden_from_rules = admitted
        && t.default_allow
        && !t.rules.is_empty()
        && matches!(h.l3, L3::Other(e) if HIDDEN.contains(&e));
    assert_eq!(
        verdict == Verdict::Drop(DropReason::Spoofed),
        refusal == Some(DropReason::Spoofed),
        "{} on {from:?}: {verdict:?} for {h:?}",
        t.name
    );
    if refusal == Some(DropReason::Encapsulated) {
        assert_eq!(
            verdict,
            Verdict::Drop(DropReason::Encapsulated),
            "{} on {from:?}: {h:?}",
            t.name
        );
    } else if verdict == Verdict::Drop(DropReason::Encapsulated) {
        assert!(
            hidden_from_rules,
            "{} on {from:?}: {verdict:?} for {h:?}",
            t.name
        );
    } else if hidden_from_rules {
        assert_eq!(
            verdict,
            Verdict::Drop(DropReason::MacLimit),
            "{} on {from:?}: {h:?}",
            t.name
        );
    }
    let stateless = !t.rules.iter().any(|r| r.stateful && r.allow);
    let outs = match verdict {
        Verdict::Forward(e) => vec![e],
        Verdict::Flood => flood.to_vec(),
        Verdict::Drop(r) => {
            assert!(
                !matches!(r, DropReason::NoTenant | DropReason::Malformed),
                "{r:?} for a frame of {} on {from:?}: {h:?}",
                t.name
            );
            c.2 += 1;
            if r == DropReason::MacLimit {
                assert!(admitted, "{r:?} for a refused frame: {h:?}");
                return;
            }
            if admitted && stateless {
                assert!(
                    !expected_pass(t, &h.l3),
                    "{} dropped ({r:?}) what its rules allow: {h:?}",
                    t.name
                );
            }
            return;
        }
    };
    c.1 += 1;
    if stateless {
        assert!(
            expected_pass(t, &h.l3),
            "{} passed what its rules deny: {h:?}",
            t.name
        );
    }
    for (i, e) in outs.iter().enumerate() {
        assert!(e.port < PORTS, "output to port {}", e.port);
        assert!(!outs[..i].contains(e), "{e:?} twice in {outs:?}");
        assert_eq!(usize::from(e.decap), decap, "outer headers stripped: {e:?}");
        let out_tag = match e.vlan {
            VlanOp::Keep => h.vlan,
            VlanOp::Strip => None,
            VlanOp::Push(v) | VlanOp::Set(v) => Some(v),
        };
        if matches!(e.vlan, VlanOp::Strip | VlanOp::Set(_)) {
            assert!(h.vlan.is_some(), "{:?} on an untagged frame", e.vlan);
        }
        let (to, at) = match e.tunnel {
            Some(tun) => {
                assert_eq!(
                    (e.port, tun.src_ip, tun.src_mac),
                    (VTEP_PORT, VTEP_IP, VTEP_MAC),
                    "{e:?}"
                );
                // Flooded to the attachment's remote VTEPs, or unicast to
                // where a station was learned.
                assert!(REMOTES.contains(&tun.dst_ip), "{e:?}");
                vxlan_owner(cfg, e.port, tun.vni)
            }
            None => owner(cfg, e.port, out_tag),
        }
        .unwrap_or_else(|| panic!("{e:?} of a frame from {from:?} reaches nobody: {h:?}"));
        assert_eq!(
            cfg.tenants[to].name, t.name,
            "a frame of {} on {from:?} leaked to {} at {:?}: {h:?}",
            t.name, cfg.tenants[to].name, cfg.tenants[to].attachments[at]
        );
        assert_ne!((to, at), (ti, ai), "sent back where it came from: {h:?}");
    }
}

/// Frames in a row from one port, waiting to be given as one burst to
/// the second switch, and what the first decided for each.
#[derive(Default)]
struct Burst {
    port: usize,
    frames: Vec<MemPacket>,
    decided: Vec<(Vec<u8>, Verdict, Vec<Egress>)>,
}

impl Burst {
    /// Gives the frames to `q` as one burst; each must be decided as the
    /// first switch decided it, bytes included.
    fn flush(&mut self, q: &mut SwitchPipeline) {
        let mut flood = Vec::new();
        let mut i = 0;
        let decided = &self.decided;
        q.process_burst(self.port, &mut self.frames, &mut flood, |pkt, v, f| {
            let (bytes, verdict, outs) = &decided[i];
            assert_eq!(
                (*v, f),
                (*verdict, outs.as_slice()),
                "frame {i} of a burst of {}",
                decided.len()
            );
            assert_eq!(&pkt.0, bytes, "frame {i}: bytes");
            i += 1;
        });
        assert_eq!(i, decided.len(), "frames decided");
        self.decided.clear();
    }
}

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let mut cfg = config(0);
    let handle = SwitchHandle::new(&cfg).expect("the fuzz configuration compiles");
    let mut p = handle.pipeline();
    p.turn();
    let handle_b = SwitchHandle::new(&cfg).expect("the fuzz configuration compiles");
    let mut q = handle_b.pipeline();
    q.turn();
    let mut burst = Burst::default();
    let mut counts = Counts::new();
    let mut flood = Vec::new();
    let mut rest = data;
    let mut publishes = 0;
    let mut bulk = false;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        let port = usize::from(op & 7);
        let mut frame = match op {
            0x00..=0x7f => {
                let Some((&len, tail)) = rest.split_first() else {
                    break;
                };
                let n = usize::from(len).min(tail.len());
                rest = &tail[n..];
                tail[..n].to_vec()
            }
            0x80..=0xbf => {
                let Some((f, tail)) = rest.split_first_chunk::<8>() else {
                    break;
                };
                rest = tail;
                let frame = build(*f);
                if port == VTEP_PORT {
                    tunnelled(frame, *f)
                } else {
                    frame
                }
            }
            _ => {
                // Publishing compiles a configuration (4096-entry VLAN
                // tables): a few per input keep runs fast.
                burst.flush(&mut q);
                if op & 1 == 1 && publishes < MAX_PUBLISHES {
                    publishes += 1;
                    cfg = config(op >> 1 & 3);
                    bulk |= cfg
                        .tenants
                        .iter()
                        .any(|t| t.rules.len() >= FLOW_CACHE_MIN_RULES);
                    handle
                        .publish(&cfg)
                        .expect("the fuzz configuration compiles");
                    handle_b
                        .publish(&cfg)
                        .expect("the fuzz configuration compiles");
                }
                p.turn();
                q.turn();
                continue;
            }
        };
        let original = frame.clone();
        flood.clear();
        let verdict = p.process(port, &mut frame, &mut flood);
        check(&cfg, port, &original, verdict, &flood, &mut counts);
        if port != burst.port || burst.frames.len() == 64 {
            burst.flush(&mut q);
            burst.port = port;
        }
        burst.frames.push(MemPacket(original));
        burst.decided.push((frame, verdict, flood.clone()));
    }
    burst.flush(&mut q);
    // Reading counters is quadratic in the rules of a tenant (each rule ID
    // is looked up in a list): skip it once the 1,024-rule tenant was
    // there, or every such input would cost half a second.
    if bulk {
        return;
    }
    let traffic = handle.traffic();
    for t in &cfg.tenants {
        let (rx, fwd, drop) = counts.get(&t.name).copied().unwrap_or_default();
        let got = traffic.tenants.get(&t.name).copied().unwrap_or_default();
        assert_eq!(
            (got.rx_packets, got.forwarded_packets, got.dropped_packets),
            (rx, fwd, drop),
            "counters of {}",
            t.name
        );
    }
}
