//! The switch configuration of a bench set's `rules.json` (from
//! ../shared/bench/gen_data.py), shared by the benchmarks that load one.

use dpu_dataplane::classify::{AclRule, Family};
use dpu_dataplane::switch::{Attach, SwitchConfig, SwitchRule, TenantConfig};

/// An IPv4 or IPv6 prefix's address range, and whether it is IPv6.
fn prefix(s: &str) -> ((u128, u128), bool) {
    let (addr, len) = s.split_once('/').expect("CIDR prefix");
    let len = len.parse().expect("prefix length");
    match addr.parse().expect("IP address") {
        std::net::IpAddr::V4(a) => (AclRule::prefix_range(u32::from(a).into(), len, 32), false),
        std::net::IpAddr::V6(a) => (AclRule::prefix_range(a.into(), len, 128), true),
    }
}

/// The switch configuration of a bench set's `rules.json` (format
/// `vswitch-bench-rules/1`): one tenant per VLAN, attached to that VLAN on
/// both ports, rules in list order; `flow_cache` entries of flow cache
/// (0: none). A rule with IPv6 prefixes (`bench/ipv6-sets.py` writes a
/// set's IPv6 form, wildcards as `::/0`) is an IPv6 rule.
pub fn switch_config(path: &str, flow_cache: usize) -> SwitchConfig {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let doc: serde_json::Value = serde_json::from_str(&text).expect("rules.json");
    assert_eq!(
        doc["format"], "vswitch-bench-rules/1",
        "{path}: unknown format"
    );
    let range = |v: &serde_json::Value| -> (u16, u16) {
        (
            v[0].as_u64().expect("port") as u16,
            v[1].as_u64().expect("port") as u16,
        )
    };
    let tenants = doc["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .map(|t| TenantConfig {
            name: t["name"].as_str().expect("name").to_string(),
            attachments: t["attachments"]
                .as_array()
                .expect("attachments")
                .iter()
                .map(|a| {
                    Attach::port(
                        a["port"].as_u64().expect("port") as usize,
                        a["vlan"].as_u64().expect("vlan") as u16,
                    )
                })
                .collect(),
            default_allow: t["default_action"] == "allow",
            rules: t["rules"]
                .as_array()
                .expect("rules")
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let (src, v6) = prefix(r["src"].as_str().expect("src"));
                    let (dst, _) = prefix(r["dst"].as_str().expect("dst"));
                    let family = if v6 { Family::V6 } else { Family::V4 };
                    let mut m = AclRule::any(i as u32, 0, family);
                    m.src = src;
                    m.dst = dst;
                    m.src_port = range(&r["sport"]);
                    m.dst_port = range(&r["dport"]);
                    if let Some(p) = r["proto"].as_u64() {
                        m.proto = (p as u8, p as u8);
                    }
                    SwitchRule {
                        id: format!("r{i}"),
                        matches: m,
                        allow: r["action"] == "allow",
                        // Not in the harness's format: a set may add it.
                        stateful: r["stateful"] == true,
                        rate_limit: None,
                    }
                })
                .collect::<Vec<_>>()
                .into(),
            ..TenantConfig::default()
        })
        .collect();
    SwitchConfig {
        ports: 2,
        tenants,
        flow_cache_entries: flow_cache,
        ..SwitchConfig::default()
    }
}
