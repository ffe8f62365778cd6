//! Network-side validation: tenant attachments (port, VLAN, VXLAN and their
//! anti-spoofing lists), default policies, and filter rules with their rate
//! limits.

use std::collections::{HashMap, HashSet};

use dpu_proto::v1 as pb;

use super::{child_name, id, name, text};
use crate::error::{ControlError, Result};
use crate::model::{
    Action, Attachment, Claims, IpPrefix, MacAddr, PortRange, RateLimit, Rule, SourceGuard,
};

/// Most rules one tenant may hold.
pub const MAX_RULES_PER_TENANT: usize = 65_536;
/// Most attachments one tenant may hold.
pub const MAX_ATTACHMENTS_PER_TENANT: usize = 4_096;

/// Parses a rule name `tenants/{tenant}/rules/{rule}`.
pub fn rule_name<'a>(field: &str, n: &'a str) -> Result<(&'a str, &'a str)> {
    let (t, r) = child_name(field, n, "tenants", "rules")?;
    id(field, t)?;
    id(field, r)?;
    Ok((t, r))
}

/// Converts a default policy; UNSPECIFIED means deny.
pub fn default_policy(field: &str, v: i32) -> Result<Action> {
    match pb::DefaultPolicy::try_from(v) {
        Ok(pb::DefaultPolicy::Unspecified | pb::DefaultPolicy::Deny) => Ok(Action::Deny),
        Ok(pb::DefaultPolicy::Allow) => Ok(Action::Allow),
        Err(_) => Err(ControlError::invalid(
            field,
            format!("unknown policy value {v}"),
        )),
    }
}

/// Converts the attachments of a tenant (syntax only; ports and conflicts
/// with other tenants are checked against the state).
pub fn attachments(field: &str, list: &[pb::Attachment]) -> Result<Vec<Attachment>> {
    if list.len() > MAX_ATTACHMENTS_PER_TENANT {
        return Err(ControlError::invalid(
            field,
            format!(
                "{} attachments, at most {MAX_ATTACHMENTS_PER_TENANT}",
                list.len()
            ),
        ));
    }
    let out = list
        .iter()
        .enumerate()
        .map(|(i, a)| attachment(&format!("{field}[{i}]"), a))
        .collect::<Result<Vec<_>>>()?;
    let mut claims = Claims::new();
    for (i, att) in out.iter().enumerate() {
        if let Err((o, j)) = claims.insert(att, i) {
            return Err(ControlError::invalid(
                format!("{field}[{i}]"),
                format!("{att} overlaps {field}[{j}] ({o})"),
            ));
        }
    }
    Ok(out)
}

/// Converts one attachment.
pub fn attachment(field: &str, a: &pb::Attachment) -> Result<Attachment> {
    match &a.kind {
        Some(pb::attachment::Kind::Port(p)) => {
            let port = name(&format!("{field}.port.port"), &p.port, "ports")?;
            Ok(Attachment::Port {
                port: port.to_string(),
                vlan: vlan(&format!("{field}.port.vlan_id"), p.vlan_id)?,
                guard: source_guard(&format!("{field}.port"), p)?,
            })
        }
        Some(pb::attachment::Kind::Vxlan(v)) => {
            let uplink = name(&format!("{field}.vxlan.uplink"), &v.uplink, "ports")?;
            if !(1..=0x00FF_FFFF).contains(&v.vni) {
                return Err(ControlError::invalid(
                    format!("{field}.vxlan.vni"),
                    format!("{} is not in 1..=16777215", v.vni),
                ));
            }
            Ok(Attachment::Vxlan {
                uplink: uplink.to_string(),
                vni: v.vni,
                remote_vteps: remote_vteps(
                    &format!("{field}.vxlan.remote_vteps"),
                    &v.remote_vteps,
                )?,
                underlay_prefixes: underlay_prefixes(
                    &format!("{field}.vxlan.underlay_prefixes"),
                    &v.underlay_prefixes,
                )?,
            })
        }
        None => Err(ControlError::invalid(
            field,
            "one of port, vxlan is required",
        )),
    }
}

/// Most remote VTEPs of a VXLAN attachment.
pub const MAX_REMOTE_VTEPS: usize = 64;

/// True for an IPv4 address a tunnel endpoint may have: not unspecified,
/// broadcast, multicast or loopback.
pub fn is_unicast_v4(a: std::net::Ipv4Addr) -> bool {
    !(a.is_unspecified() || a.is_broadcast() || a.is_multicast() || a.is_loopback())
}

/// A VXLAN attachment's underlay prefixes: IPv4, not of length 0 (an
/// attachment names its underlay, it does not open to every address),
/// no repeats, at most [`MAX_REMOTE_VTEPS`].
fn underlay_prefixes(field: &str, list: &[String]) -> Result<Vec<IpPrefix>> {
    if list.len() > MAX_REMOTE_VTEPS {
        return Err(ControlError::invalid(
            field,
            format!("{} entries; at most {MAX_REMOTE_VTEPS}", list.len()),
        ));
    }
    let mut out: Vec<IpPrefix> = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let f = format!("{field}[{i}]");
        let p: IpPrefix = s
            .parse()
            .map_err(|e| ControlError::invalid(&f, format!("{s:?}: {e}")))?;
        if !p.is_ipv4() {
            return Err(ControlError::invalid(&f, format!("{p} is not IPv4")));
        }
        if p.is_empty() {
            return Err(ControlError::invalid(
                &f,
                format!("{p} would accept every address"),
            ));
        }
        if out.contains(&p) {
            return Err(ControlError::invalid(&f, format!("{p} is listed twice")));
        }
        out.push(p);
    }
    Ok(out)
}

/// A VXLAN attachment's remote VTEPs: unicast IPv4 addresses, no repeats.
fn remote_vteps(field: &str, list: &[String]) -> Result<Vec<std::net::Ipv4Addr>> {
    if list.len() > MAX_REMOTE_VTEPS {
        return Err(ControlError::invalid(
            field,
            format!("{} entries; at most {MAX_REMOTE_VTEPS}", list.len()),
        ));
    }
    let mut out: Vec<std::net::Ipv4Addr> = Vec::with_capacity(list.len());
    let mut seen = HashSet::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let f = format!("{field}[{i}]");
        let a: std::net::Ipv4Addr = s
            .parse()
            .map_err(|_| ControlError::invalid(&f, format!("{s:?} is not an IPv4 address")))?;
        if !is_unicast_v4(a) {
            return Err(ControlError::invalid(
                &f,
                format!("{a} is not a unicast address"),
            ));
        }
        if !seen.insert(a) {
            return Err(ControlError::invalid(&f, format!("{a} is listed twice")));
        }
        out.push(a);
    }
    Ok(out)
}

/// Most entries in each anti-spoofing list of an attachment.
pub const MAX_GUARD_ENTRIES: usize = 64;

/// Converts a port attachment's anti-spoofing lists (`field` names the
/// attachment).
fn source_guard(field: &str, p: &pb::PortAttachment) -> Result<SourceGuard> {
    let too_many = |list: &str, n: usize| {
        ControlError::invalid(
            format!("{field}.{list}"),
            format!("{n} entries, at most {MAX_GUARD_ENTRIES}"),
        )
    };
    if p.allowed_macs.len() > MAX_GUARD_ENTRIES {
        return Err(too_many("allowed_macs", p.allowed_macs.len()));
    }
    if p.allowed_source_prefixes.len() > MAX_GUARD_ENTRIES {
        return Err(too_many(
            "allowed_source_prefixes",
            p.allowed_source_prefixes.len(),
        ));
    }
    let mut guard = SourceGuard::default();
    let mut macs: HashMap<MacAddr, usize> = HashMap::with_capacity(p.allowed_macs.len());
    for (i, m) in p.allowed_macs.iter().enumerate() {
        let f = format!("{field}.allowed_macs[{i}]");
        let mac: MacAddr = m
            .parse()
            .map_err(|e: String| ControlError::invalid(&f, e))?;
        if let Some(j) = macs.insert(mac, i) {
            return Err(ControlError::invalid(
                f,
                format!("{mac} is also allowed_macs[{j}]"),
            ));
        }
        guard.macs.push(mac);
    }
    let mut prefixes: HashMap<IpPrefix, usize> =
        HashMap::with_capacity(p.allowed_source_prefixes.len());
    for (i, s) in p.allowed_source_prefixes.iter().enumerate() {
        let f = format!("{field}.allowed_source_prefixes[{i}]");
        let Some(pfx) = prefix(&f, s)? else {
            return Err(ControlError::invalid(f, "a prefix is required"));
        };
        if let Some(j) = prefixes.insert(pfx, i) {
            return Err(ControlError::invalid(
                f,
                format!("{pfx} is also allowed_source_prefixes[{j}]"),
            ));
        }
        guard.prefixes.push(pfx);
    }
    Ok(guard)
}

/// Checks a VLAN ID: 0 (whole port) or 1..=4094.
pub fn vlan(field: &str, v: u32) -> Result<u16> {
    u16::try_from(v)
        .ok()
        .filter(|v| *v <= 4094)
        .ok_or_else(|| ControlError::invalid(field, format!("{v} is not in 0..=4094")))
}

fn byte(field: &str, v: u32) -> Result<u8> {
    u8::try_from(v).map_err(|_| ControlError::invalid(field, format!("{v} is not in 0..=255")))
}

fn prefix(field: &str, s: &str) -> Result<Option<IpPrefix>> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|e| ControlError::invalid(field, format!("{e}")))
}

fn port_range(field: &str, r: Option<&pb::PortRange>) -> Result<Option<PortRange>> {
    let Some(r) = r else { return Ok(None) };
    let first = u16::try_from(r.first).map_err(|_| {
        ControlError::invalid(
            format!("{field}.first"),
            format!("{} is not in 0..=65535", r.first),
        )
    })?;
    let last = u16::try_from(r.last).map_err(|_| {
        ControlError::invalid(
            format!("{field}.last"),
            format!("{} is not in 0..=65535", r.last),
        )
    })?;
    if first > last {
        return Err(ControlError::invalid(
            field,
            format!("first ({first}) is greater than last ({last})"),
        ));
    }
    Ok(Some(PortRange { first, last }))
}

const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_ICMPV6: u8 = 58;
const PROTO_SCTP: u8 = 132;

/// Converts a filter rule. `rule_id` is the already-checked ID to give it.
pub fn rule(field: &str, rule_id: &str, r: &pb::FilterRule) -> Result<Rule> {
    let f = |s: &str| format!("{field}.{s}");
    let src = prefix(&f("src_prefix"), &r.src_prefix)?;
    let dst = prefix(&f("dst_prefix"), &r.dst_prefix)?;
    if let (Some(s), Some(d)) = (src, dst) {
        if s.is_ipv4() != d.is_ipv4() {
            return Err(ControlError::invalid(
                f("dst_prefix"),
                format!("{d} and src_prefix {s} are of different IP families"),
            ));
        }
    }
    let family_v4 = src.or(dst).map(|p| p.is_ipv4());
    let protocol = r
        .ip_protocol
        .map(|p| byte(&f("ip_protocol"), p))
        .transpose()?;
    let src_ports = port_range(&f("src_ports"), r.src_ports.as_ref())?;
    let dst_ports = port_range(&f("dst_ports"), r.dst_ports.as_ref())?;
    for (name, set) in [
        ("src_ports", src_ports.is_some()),
        ("dst_ports", dst_ports.is_some()),
    ] {
        if set && !matches!(protocol, Some(PROTO_TCP | PROTO_UDP | PROTO_SCTP)) {
            return Err(ControlError::invalid(
                f(name),
                "port ranges need ip_protocol 6 (TCP), 17 (UDP) or 132 (SCTP)",
            ));
        }
    }
    let icmp_type = r.icmp_type.map(|t| byte(&f("icmp_type"), t)).transpose()?;
    let icmp_code = r.icmp_code.map(|c| byte(&f("icmp_code"), c)).transpose()?;
    if icmp_code.is_some() && icmp_type.is_none() {
        return Err(ControlError::invalid(f("icmp_code"), "requires icmp_type"));
    }
    if icmp_type.is_some() {
        match (protocol, family_v4) {
            (Some(PROTO_ICMP), Some(false)) => {
                return Err(ControlError::invalid(
                    f("ip_protocol"),
                    "ICMP (1) with IPv6 prefixes; use 58 (ICMPv6)",
                ))
            }
            (Some(PROTO_ICMPV6), Some(true)) => {
                return Err(ControlError::invalid(
                    f("ip_protocol"),
                    "ICMPv6 (58) with IPv4 prefixes; use 1 (ICMP)",
                ))
            }
            (Some(PROTO_ICMP | PROTO_ICMPV6), _) => {}
            _ => {
                return Err(ControlError::invalid(
                    f("icmp_type"),
                    "needs ip_protocol 1 (ICMP) or 58 (ICMPv6)",
                ))
            }
        }
    }
    let action = match pb::RuleAction::try_from(r.action) {
        Ok(pb::RuleAction::Allow) => Action::Allow,
        Ok(pb::RuleAction::Deny) => Action::Deny,
        Ok(pb::RuleAction::Unspecified) => {
            return Err(ControlError::invalid(
                f("action"),
                "is required (ALLOW or DENY)",
            ))
        }
        Err(_) => {
            return Err(ControlError::invalid(
                f("action"),
                format!("unknown action value {}", r.action),
            ))
        }
    };
    if r.stateful && action == Action::Deny {
        return Err(ControlError::invalid(
            f("stateful"),
            "only ALLOW rules can be stateful",
        ));
    }
    text(&f("description"), &r.description)?;
    let rate_limit = r
        .rate_limit
        .as_ref()
        .map(|l| rate_limit(&f("rate_limit"), l))
        .transpose()?;
    if rate_limit.is_some() && action == Action::Deny {
        return Err(ControlError::invalid(
            f("rate_limit"),
            "only ALLOW rules can be rate-limited",
        ));
    }
    Ok(Rule {
        id: rule_id.to_string(),
        priority: r.priority,
        src,
        dst,
        src_ports,
        dst_ports,
        protocol,
        icmp_type,
        icmp_code,
        action,
        stateful: r.stateful,
        description: r.description.clone(),
        rate_limit,
    })
}

/// Rules of a replacement rule set, each with the ID it keeps, if any.
pub type KeptRules = Vec<(Option<String>, Rule)>;

/// Checks a `ReplaceRules` request: the tenant ID, and each rule with the
/// ID its `name` keeps (`None`: the service assigns one).
///
/// # Errors
/// The first invalid field, or a rule name of another tenant.
pub fn replace_rules(req: &pb::ReplaceRulesRequest) -> Result<(String, KeptRules)> {
    let tid = name("parent", &req.parent, "tenants")?.to_string();
    let mut rules = Vec::with_capacity(req.rules.len());
    for (i, r) in req.rules.iter().enumerate() {
        let field = format!("rules[{i}]");
        let rid = if r.name.is_empty() {
            None
        } else {
            let (owner, rid) = rule_name(&format!("{field}.name"), &r.name)?;
            if owner != tid {
                return Err(ControlError::invalid(
                    format!("{field}.name"),
                    format!("names a rule of tenants/{owner}, not of tenants/{tid}"),
                ));
            }
            Some(rid.to_string())
        };
        let checked = rule(&field, rid.as_deref().unwrap_or(""), r)?;
        rules.push((rid, checked));
    }
    Ok((tid, rules))
}

/// Highest packet rate a rule may be limited to (1 G packets/s).
pub const MAX_RATE_PPS: u64 = 1_000_000_000;
/// Highest bit rate a rule may be limited to (1 Tbit/s).
pub const MAX_RATE_BPS: u64 = 1_000_000_000_000;

/// Converts a rule's rate limit; a zero burst becomes a tenth of a
/// second's worth, at least one packet (one 1514-byte frame).
fn rate_limit(field: &str, l: &pb::RateLimit) -> Result<RateLimit> {
    let (per_second, bits, max, min_burst) = match (l.packets_per_second, l.bits_per_second) {
        (p, 0) if p > 0 => (p, false, MAX_RATE_PPS, 1),
        (0, b) if b > 0 => (b, true, MAX_RATE_BPS, 1514),
        _ => {
            return Err(ControlError::invalid(
                field,
                "give exactly one of packets_per_second, bits_per_second",
            ))
        }
    };
    if per_second > max {
        let which = if bits {
            "bits_per_second"
        } else {
            "packets_per_second"
        };
        return Err(ControlError::invalid(
            format!("{field}.{which}"),
            format!("{per_second} is more than {max}"),
        ));
    }
    let tenth = if bits {
        per_second / 80
    } else {
        per_second / 10
    };
    let burst = if l.burst == 0 {
        tenth.max(min_burst)
    } else {
        l.burst
    };
    // A second of the highest rate, in the unit of the burst.
    let max_burst = if bits { MAX_RATE_BPS / 8 } else { MAX_RATE_PPS };
    if burst > max_burst {
        return Err(ControlError::invalid(
            format!("{field}.burst"),
            format!("{burst} is more than {max_burst}"),
        ));
    }
    Ok(RateLimit {
        per_second,
        bits,
        burst,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::tests::field_of;

    fn tcp_rule() -> pb::FilterRule {
        pb::FilterRule {
            priority: 10,
            src_prefix: "10.0.0.0/8".into(),
            dst_prefix: "192.168.1.0/24".into(),
            dst_ports: Some(pb::PortRange {
                first: 80,
                last: 443,
            }),
            ip_protocol: Some(6),
            action: pb::RuleAction::Allow as i32,
            stateful: true,
            ..Default::default()
        }
    }

    #[test]
    fn rule_ok() {
        let r = rule("rule", "r1", &tcp_rule()).unwrap();
        assert_eq!(
            r.dst_ports,
            Some(PortRange {
                first: 80,
                last: 443
            })
        );
        assert_eq!(r.protocol, Some(6));
        assert!(r.stateful);
    }

    #[test]
    fn rule_errors_name_the_field() {
        type Mutate = Box<dyn Fn(&mut pb::FilterRule)>;
        let cases: Vec<(&str, Mutate)> = vec![
            (
                "rule.src_prefix",
                Box::new(|r| r.src_prefix = "10.0.0.1/8".into()),
            ),
            (
                "rule.dst_prefix",
                Box::new(|r| r.dst_prefix = "2001:db8::/32".into()),
            ),
            (
                "rule.dst_ports",
                Box::new(|r| r.dst_ports = Some(pb::PortRange { first: 9, last: 8 })),
            ),
            (
                "rule.dst_ports.last",
                Box::new(|r| {
                    r.dst_ports = Some(pb::PortRange {
                        first: 9,
                        last: 70000,
                    })
                }),
            ),
            ("rule.dst_ports", Box::new(|r| r.ip_protocol = Some(1))),
            ("rule.ip_protocol", Box::new(|r| r.ip_protocol = Some(256))),
            ("rule.icmp_type", Box::new(|r| r.icmp_type = Some(8))),
            (
                "rule.icmp_code",
                Box::new(|r| {
                    r.dst_ports = None;
                    r.ip_protocol = Some(1);
                    r.icmp_code = Some(0)
                }),
            ),
            ("rule.action", Box::new(|r| r.action = 0)),
            ("rule.action", Box::new(|r| r.action = 99)),
            (
                "rule.stateful",
                Box::new(|r| r.action = pb::RuleAction::Deny as i32),
            ),
            (
                "rule.description",
                Box::new(|r| r.description = "x".repeat(300)),
            ),
        ];
        for (want, mutate) in cases {
            let mut r = tcp_rule();
            mutate(&mut r);
            assert_eq!(field_of(rule("rule", "r1", &r).unwrap_err()), want);
        }
    }

    #[test]
    fn icmp_family_must_match() {
        let mut r = pb::FilterRule {
            priority: 1,
            src_prefix: "2001:db8::/32".into(),
            ip_protocol: Some(1),
            icmp_type: Some(128),
            action: pb::RuleAction::Allow as i32,
            ..Default::default()
        };
        assert_eq!(
            field_of(rule("rule", "r", &r).unwrap_err()),
            "rule.ip_protocol"
        );
        r.ip_protocol = Some(58);
        rule("rule", "r", &r).unwrap();
    }

    #[test]
    fn attachments_overlap_within_request() {
        let p = |port: &str, vlan| pb::Attachment {
            kind: Some(pb::attachment::Kind::Port(pb::PortAttachment {
                port: port.into(),
                vlan_id: vlan,
                ..Default::default()
            })),
        };
        attachments(
            "a",
            &[p("ports/p0", 10), p("ports/p0", 20), p("ports/p1", 0)],
        )
        .unwrap();
        assert_eq!(
            field_of(attachments("a", &[p("ports/p0", 10), p("ports/p0", 0)]).unwrap_err()),
            "a[1]"
        );
        assert_eq!(
            field_of(attachments("a", &[p("ports/p0", 4095)]).unwrap_err()),
            "a[0].port.vlan_id"
        );
        assert_eq!(
            field_of(attachments("a", &[p("p0", 1)]).unwrap_err()),
            "a[0].port.port"
        );
    }

    #[test]
    fn vxlan_remote_vteps() {
        let v = |vni, remotes: &[&str]| pb::Attachment {
            kind: Some(pb::attachment::Kind::Vxlan(pb::VxlanAttachment {
                uplink: "ports/p0".into(),
                vni,
                remote_vteps: remotes.iter().map(|s| s.to_string()).collect(),
                underlay_prefixes: Vec::new(),
            })),
        };
        let a = attachment("a", &v(100, &["192.0.2.2", "198.51.100.7"])).unwrap();
        assert_eq!(
            a,
            Attachment::Vxlan {
                uplink: "p0".into(),
                vni: 100,
                remote_vteps: vec![
                    "192.0.2.2".parse().unwrap(),
                    "198.51.100.7".parse().unwrap()
                ],
                underlay_prefixes: Vec::new(),
            }
        );
        let field = |a: pb::Attachment| field_of(attachment("a", &a).unwrap_err());
        assert_eq!(field(v(0, &[])), "a.vxlan.vni");
        assert_eq!(field(v(1 << 24, &[])), "a.vxlan.vni");
        assert_eq!(
            field(v(5, &["192.0.2.2", "nope"])),
            "a.vxlan.remote_vteps[1]"
        );
        assert_eq!(field(v(5, &["2001:db8::1"])), "a.vxlan.remote_vteps[0]");
        assert_eq!(field(v(5, &["224.0.0.1"])), "a.vxlan.remote_vteps[0]");
        assert_eq!(field(v(5, &["0.0.0.0"])), "a.vxlan.remote_vteps[0]");
        assert_eq!(
            field(v(5, &["192.0.2.2", "192.0.2.2"])),
            "a.vxlan.remote_vteps[1]"
        );
        let many: Vec<String> = (1..=65).map(|i| format!("10.0.0.{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(field(v(5, &many)), "a.vxlan.remote_vteps");
    }

    #[test]
    fn vxlan_underlay_prefixes() {
        let v = |prefixes: &[&str]| pb::Attachment {
            kind: Some(pb::attachment::Kind::Vxlan(pb::VxlanAttachment {
                uplink: "ports/p0".into(),
                vni: 100,
                remote_vteps: vec!["192.0.2.2".into()],
                underlay_prefixes: prefixes.iter().map(|s| s.to_string()).collect(),
            })),
        };
        let Attachment::Vxlan {
            underlay_prefixes, ..
        } = attachment("a", &v(&["198.51.100.0/24", "192.0.2.7"])).unwrap()
        else {
            panic!("not VXLAN")
        };
        assert_eq!(
            underlay_prefixes,
            vec![
                "198.51.100.0/24".parse().unwrap(),
                "192.0.2.7/32".parse().unwrap()
            ]
        );
        let field = |a: pb::Attachment| field_of(attachment("a", &a).unwrap_err());
        for bad in [
            &["nope"][..],
            &["2001:db8::/32"],
            &["0.0.0.0/0"],
            &["198.51.100.1/24"],
            &["10.0.0.0/8", "10.0.0.0/8"],
        ] {
            let at = bad.len() - 1;
            assert_eq!(
                field(v(bad)),
                format!("a.vxlan.underlay_prefixes[{at}]"),
                "{bad:?}"
            );
        }
        let many: Vec<String> = (1..=65).map(|i| format!("10.0.{i}.0/24")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(field(v(&many)), "a.vxlan.underlay_prefixes");
    }

    #[test]
    fn anti_spoofing_lists() {
        let p = |macs: &[&str], prefixes: &[&str]| pb::Attachment {
            kind: Some(pb::attachment::Kind::Port(pb::PortAttachment {
                port: "ports/p0".into(),
                vlan_id: 0,
                allowed_macs: macs.iter().map(|s| s.to_string()).collect(),
                allowed_source_prefixes: prefixes.iter().map(|s| s.to_string()).collect(),
            })),
        };
        let a = attachment(
            "a",
            &p(&["02:00:00:00:00:01"], &["10.0.0.5/32", "fe80::/10"]),
        )
        .unwrap();
        let Attachment::Port { guard, .. } = a else {
            panic!()
        };
        assert_eq!(guard.macs.len(), 1);
        assert_eq!(guard.prefixes.len(), 2);
        let err = |macs: &[&str], prefixes: &[&str]| {
            let e = attachment("a", &p(macs, prefixes)).unwrap_err();
            (field_of(e.clone()), e.to_string())
        };
        let (f, e) = err(&["01:00:5e:00:00:01"], &[]);
        assert_eq!(f, "a.port.allowed_macs[0]");
        assert!(e.contains("multicast"), "{e}");
        let (f, e) = err(&["02:00:00:00:00:01", "02:00:00:00:00:01"], &[]);
        assert_eq!(f, "a.port.allowed_macs[1]");
        assert!(e.contains("allowed_macs[0]"), "{e}");
        let (f, e) = err(&[], &["10.0.0.5/24"]);
        assert_eq!(f, "a.port.allowed_source_prefixes[0]");
        assert!(e.contains("did you mean 10.0.0.0/24"), "{e}");
        assert_eq!(err(&[], &[""]).0, "a.port.allowed_source_prefixes[0]");
        let many: Vec<String> = (0..65).map(|i| format!("02:00:00:00:01:{i:02x}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(err(&many, &[]).0, "a.port.allowed_macs");
    }

    #[test]
    fn rate_limits() {
        let limited = |pps: u64, bps: u64, burst: u64| pb::FilterRule {
            rate_limit: Some(pb::RateLimit {
                packets_per_second: pps,
                bits_per_second: bps,
                burst,
            }),
            ..tcp_rule()
        };
        let r = rule("r", "x", &limited(1000, 0, 0)).unwrap();
        assert_eq!(
            r.rate_limit,
            Some(RateLimit {
                per_second: 1000,
                bits: false,
                burst: 100
            }),
            "a tenth of a second by default"
        );
        let r = rule("r", "x", &limited(0, 8_000, 0)).unwrap();
        assert_eq!(r.rate_limit.unwrap().burst, 1514, "at least one frame");
        let r = rule("r", "x", &limited(3, 0, 0)).unwrap();
        assert_eq!(r.rate_limit.unwrap().burst, 1, "at least one packet");
        for (l, want) in [
            (limited(0, 0, 0), "r.rate_limit"),
            (limited(5, 5, 0), "r.rate_limit"),
            (
                limited(MAX_RATE_PPS + 1, 0, 0),
                "r.rate_limit.packets_per_second",
            ),
            (
                limited(0, MAX_RATE_BPS + 1, 0),
                "r.rate_limit.bits_per_second",
            ),
            (limited(10, 0, MAX_RATE_PPS + 1), "r.rate_limit.burst"),
        ] {
            assert_eq!(field_of(rule("r", "x", &l).unwrap_err()), want);
        }
        let deny = pb::FilterRule {
            action: pb::RuleAction::Deny as i32,
            stateful: false,
            ..limited(10, 0, 0)
        };
        let e = rule("r", "x", &deny).unwrap_err();
        assert!(e.to_string().contains("only ALLOW"), "{e}");
    }
}
