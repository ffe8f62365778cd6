//! Helpers the switch's tests share: tenants, pipelines and frames.

pub(super) use std::time::Duration;

pub(super) use crate::classify::{AclRule, Family};
pub(super) use crate::flowcache::FlowCacheStats;
pub(super) use crate::wire::tests::build;
pub(super) use crate::wire::{proto, FlowKey, VXLAN_OVERHEAD};
pub(super) use crate::worker::{DropReason, Egress, Pipeline, Tunnel, Verdict, VlanOp, BURST};

pub(super) use super::compile::FLOW_CACHE_MIN_RULES;
pub(super) use super::compile::{Compiled, ALLOWS};
pub(super) use super::config::{
    Attach, ConfigError, Guard, SwitchConfig, SwitchRule, TenantConfig, Vtep,
};
pub(super) use super::handle::SwitchHandle;
pub(super) use super::state::SwitchPipeline;

pub(super) const BCAST: [u8; 6] = [0xff; 6];

pub(super) fn mac(n: u8) -> [u8; 6] {
    [2, 0, 0, 0, 0, n]
}

pub(super) fn tenant(
    name: &str,
    attachments: &[(usize, u16)],
    default_allow: bool,
) -> TenantConfig {
    TenantConfig {
        name: name.into(),
        attachments: attachments
            .iter()
            .map(|&(port, vlan)| Attach::port(port, vlan))
            .collect(),
        default_allow,
        ..TenantConfig::default()
    }
}

pub(super) fn switch(ports: usize, tenants: Vec<TenantConfig>) -> (SwitchHandle, SwitchPipeline) {
    let h = SwitchHandle::new(&SwitchConfig {
        ports,
        tenants,
        ..SwitchConfig::default()
    })
    .unwrap();
    let mut p = h.pipeline();
    p.turn();
    (h, p)
}

pub(super) fn run(
    p: &mut SwitchPipeline,
    port: usize,
    mut frame: Vec<u8>,
) -> (Verdict, Vec<Egress>) {
    let mut flood = Vec::new();
    let v = p.process(port, &mut frame, &mut flood);
    (v, flood)
}

pub(super) fn udp(src: u8, dst: [u8; 6], vlan: Option<u16>, dport: u16) -> Vec<u8> {
    build::udp4(
        mac(src),
        dst,
        vlan,
        [10, 0, 0, src],
        [10, 0, 0, 99],
        5000,
        dport,
    )
}

/// Order 10 "dns" allows UDP to port 53; order 5 "deny7" denies
/// everything from 10.0.0.7 (and so comes first).
pub(super) fn dns_and_deny_7() -> Vec<SwitchRule> {
    let mut dns = AclRule::any(10, 0, Family::V4);
    dns.proto = (proto::UDP, proto::UDP);
    dns.dst_port = (53, 53);
    let mut deny = AclRule::any(5, 0, Family::V4);
    deny.src = AclRule::prefix_range(0x0a00_0007, 32, 32);
    vec![
        SwitchRule {
            id: "dns".into(),
            matches: dns,
            allow: true,
            stateful: false,
            rate_limit: None,
        },
        SwitchRule {
            id: "deny7".into(),
            matches: deny,
            allow: false,
            stateful: false,
            rate_limit: None,
        },
    ]
}

/// The verdict of tenant `ti` of `c` for `key`: the matching rule's ID
/// and action.
pub(super) fn verdict(c: &Compiled, ti: usize, key: &FlowKey) -> Option<(String, bool)> {
    let t = &c.tenants[ti];
    let tag = t.classifier.lookup(key)?.tag as usize;
    let r = t.slots[tag].as_ref().expect("a live slot");
    assert_eq!(t.actions[tag] & ALLOWS != 0, r.allow);
    Some((r.id.to_string(), r.allow))
}

/// Per port of `ports`: a VTEP with address `ip` (MAC 0xaa) on port 0.
pub(super) fn vtep_on_port_0(ports: usize, ip: u32) -> Vec<Option<Vtep>> {
    let mut vteps = vec![None; ports];
    vteps[0] = Some(Vtep { ip, mac: mac(0xaa) });
    vteps
}
