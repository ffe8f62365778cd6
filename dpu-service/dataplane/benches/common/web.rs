//! What the offload benchmarks share: a tenant whose stateful rule lets
//! a client reach a server's port 80, and the TCP frames of their
//! connections.

use dpu_dataplane::classify::{AclRule, Family};
use dpu_dataplane::switch::{Attach, SwitchConfig, SwitchHandle, SwitchRule, TenantConfig};

pub const SYN: u8 = 0x02;
pub const SYN_ACK: u8 = 0x12;
pub const ACK: u8 = 0x10;
pub const PSH_ACK: u8 = 0x18;

/// A TCP/IPv4 frame of connection `flow`: from the client (address
/// `client`, MAC :01, port 1024 + flow) to the server (10.0.0.2:80, MAC
/// :02), or back; with `tags` (the client's VLAN, the server's) a tagged
/// 68-byte frame, else a 64-byte one.
pub fn tcp_frame(
    client: u32,
    flow: u32,
    back: bool,
    flags: u8,
    tags: Option<(u16, u16)>,
) -> Vec<u8> {
    let tag = usize::from(tags.is_some()) * 4;
    let mut f = vec![0u8; 64 + tag];
    let (dst, src) = if back { (1, 2) } else { (2, 1) };
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, dst]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, src]);
    if let Some((c, s)) = tags {
        f[12..14].copy_from_slice(&[0x81, 0x00]);
        f[14..16].copy_from_slice(&(if back { s } else { c }).to_be_bytes());
    }
    f[12 + tag..14 + tag].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[14 + tag..34 + tag];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&50u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 6;
    let (a, b) = (client, 0x0a00_0002u32);
    let (s, d) = if back { (b, a) } else { (a, b) };
    ip[12..16].copy_from_slice(&s.to_be_bytes());
    ip[16..20].copy_from_slice(&d.to_be_bytes());
    let client = 1024 + (flow % 60_000) as u16;
    let (sp, dp) = if back { (80, client) } else { (client, 80) };
    let tcp = &mut f[34 + tag..54 + tag];
    tcp[0..2].copy_from_slice(&sp.to_be_bytes());
    tcp[2..4].copy_from_slice(&dp.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = flags;
    f
}

/// The switch of one tenant "bench" with `attachments` on `ports` ports,
/// whose stateful rule allows TCP to port 80, with room for `flows`
/// connections.
pub fn web_switch(ports: usize, attachments: Vec<Attach>, flows: usize) -> SwitchHandle {
    let mut web = AclRule::any(1, 0, Family::V4);
    web.proto = (6, 6);
    web.dst_port = (80, 80);
    SwitchHandle::new(&SwitchConfig {
        ports,
        tenants: vec![TenantConfig {
            name: "bench".into(),
            attachments,
            rules: vec![SwitchRule {
                id: "web".into(),
                matches: web,
                allow: true,
                stateful: true,
                rate_limit: None,
            }]
            .into(),
            ..TenantConfig::default()
        }],
        conntrack_max: (flows * 2).max(1024),
        conntrack_per_tenant: (flows * 2).max(1024),
        ..SwitchConfig::default()
    })
    .expect("configuration compiles")
}
