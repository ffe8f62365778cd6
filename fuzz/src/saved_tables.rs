//! Fuzzes the switch's saved-tables file, the bytes a restarting service
//! reads back from its state directory (which a damaged disk, another
//! version or a hand can change): `SavedTables::decode` either refuses
//! the file or answers tables that encode and decode to themselves; the
//! tables then go through `SwitchHandle::restore` against a configuration
//! with two tenants, where every entry is counted under exactly one
//! outcome, and a pipeline made afterwards adopts from them while it
//! switches TCP segments and fragments built from the entries. Run with
//! `fuzz/run.sh saved_tables` from the repository root.
//!
//! Each input also runs with its checksum made right, or almost every
//! mutation would stop at the checksum.

use std::sync::Arc;

use dpu_dataplane::classify::{AclRule, Family};
use dpu_dataplane::switch::{
    Attach, SavedTables, SwitchConfig, SwitchHandle, SwitchRule, TenantConfig,
};
use dpu_dataplane::wire::proto;
use dpu_dataplane::worker::Pipeline;

/// Most entries a file may hold here.
const ENTRIES: usize = 4096;

/// Tenants "a" (a stateful rule for every TCP and UDP packet) and "b"
/// (default allow, no rules), one port each.
fn config() -> SwitchConfig {
    let mut a = TenantConfig {
        name: "a".into(),
        attachments: vec![Attach::port(0, 0)],
        ..TenantConfig::default()
    };
    let rules = [proto::TCP, proto::UDP]
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let mut m = AclRule::any(i as u32 + 1, 0, Family::V4);
            m.proto = (p, p);
            SwitchRule {
                id: format!("r{i}"),
                matches: m,
                allow: true,
                stateful: true,
                rate_limit: None,
            }
        })
        .collect();
    a.rules = Arc::new(rules);
    let b = TenantConfig {
        name: "b".into(),
        attachments: vec![Attach::port(1, 0)],
        default_allow: true,
        ..TenantConfig::default()
    };
    SwitchConfig {
        ports: 2,
        tenants: vec![a, b],
        conntrack_max: 64,
        conntrack_per_tenant: 64,
        conntrack_reserved_per_tenant: 0,
        fragments_max: 64,
        fragments_per_tenant: 64,
        fragments_reserved_per_tenant: 0,
        ..SwitchConfig::default()
    }
}

/// An Ethernet/IPv4 frame from `src` to `dst` carrying `l4` as protocol
/// `proto`, fragment field `frag`.
fn ipv4(src: u128, dst: u128, proto: u8, frag: u16, ident: u16, l4: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    let total = (20 + l4.len()) as u16;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&ident.to_be_bytes());
    f.extend_from_slice(&frag.to_be_bytes());
    f.extend_from_slice(&[64, proto, 0, 0]);
    f.extend_from_slice(&(src as u32).to_be_bytes());
    f.extend_from_slice(&(dst as u32).to_be_bytes());
    f.extend_from_slice(l4);
    f
}

/// Runs the target on one input as it is, and again with its last four
/// bytes replaced by the checksum of the rest, so that mutations reach
/// what lies past the checksum.
pub fn run(data: &[u8]) {
    check(data);
    if data.len() >= 4 {
        let mut fixed = data.to_vec();
        let n = fixed.len() - 4;
        let crc = crc32c::crc32c(&fixed[..n]).to_le_bytes();
        fixed[n..].copy_from_slice(&crc);
        check(&fixed);
    }
}

fn check(data: &[u8]) {
    let Ok(saved) = SavedTables::decode(data, ENTRIES) else {
        return;
    };
    assert!(saved.conns.len() + saved.frags.len() <= ENTRIES);
    let again = SavedTables::decode(&saved.encode(), ENTRIES).expect("its own encoding");
    assert_eq!(again, saved, "encode and decode disagree");

    let h = SwitchHandle::new(&config()).expect("the configuration compiles");
    let report = h.restore(
        &saved,
        saved.saved_unix.wrapping_add(data.len() as u64 % 64),
    );
    for (r, n) in [
        (report.conns, saved.conns.len()),
        (report.frags, saved.frags.len()),
    ] {
        assert_eq!(
            r.restored + r.expired + r.no_tenant + r.invalid,
            n as u64,
            "every entry is counted once"
        );
    }
    // A pipeline adopts what packets of the entries ask for, both ways.
    let mut p = h.pipeline();
    p.turn();
    let mut flood = Vec::new();
    for c in saved.conns.iter().take(64).filter(|c| !c.v6) {
        let mut l4 = [0u8; 20];
        l4[12] = 5 << 4;
        l4[13] = 0x10;
        for (src, dst, sp, dp) in [
            (c.lo, c.hi, c.lo_port, c.hi_port),
            (c.hi, c.lo, c.hi_port, c.lo_port),
        ] {
            l4[0..2].copy_from_slice(&sp.to_be_bytes());
            l4[2..4].copy_from_slice(&dp.to_be_bytes());
            let mut f = ipv4(src, dst, c.proto, 0, 1, &l4);
            flood.clear();
            let _ = p.process(0, &mut f, &mut flood);
        }
    }
    for f in saved.frags.iter().take(64).filter(|f| !f.v6) {
        let mut frame = ipv4(f.src, f.dst, f.proto, 2, f.ident as u16, &[0; 8]);
        flood.clear();
        let _ = p.process(0, &mut frame, &mut flood);
    }
    p.stopped();
    let out = h.saved_tables();
    assert!(
        out.conns.len() <= 64 && out.frags.len() <= 64,
        "within the tables"
    );
}
