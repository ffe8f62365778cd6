//! The index never drifts: random sequences of every transition, accepted
//! and refused, on a small space of ports, VLANs, VNIs, NQNs and paths
//! (so that overlaps, duplicates and caps are frequent), each followed by
//! a comparison with an index built from scratch and, for the claims,
//! with a scan of every attachment.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use dpu_rand::Rng;

use super::Index;
use crate::model::{
    Action, Attachment, Backend, Claims, Listener, Namespace, PortRole, PortSpec, QosLimits, Rule,
    RuleSet, State, Subsystem, Tenant, Timestamp, Transport, Volume,
};
use crate::state::{Limits, Part, PortRegistry, SubsystemUpdate, TenantUpdate};

const PORTS: [&str; 2] = ["p0", "p1"];
const TENANTS: [&str; 5] = ["a", "b", "c", "d", "e"];
const SUBSYSTEMS: [&str; 3] = ["s0", "s1", "s2"];

fn ports() -> PortRegistry {
    PORTS
        .iter()
        .map(|id| {
            (
                id.to_string(),
                PortSpec {
                    id: id.to_string(),
                    driver: "none".into(),
                    device: String::new(),
                    role: PortRole::Software,
                    vtep_address: None,
                },
            )
        })
        .collect()
}

fn attachment(rng: &mut Rng) -> Attachment {
    let port = *rng.pick(&PORTS);
    if rng.below(3) == 0 {
        Attachment::Vxlan {
            uplink: port.into(),
            vni: 1 + rng.below(3) as u32,
            remote_vteps: vec![],
            underlay_prefixes: vec![],
        }
    } else {
        // VLAN 0, the whole port, one time in four.
        Attachment::port_vlan(port, rng.below(4) as u16)
    }
}

/// Up to three attachments that do not overlap each other, as
/// validation leaves a tenant's list.
fn attachments(rng: &mut Rng) -> Vec<Attachment> {
    let want: Vec<Attachment> = (0..rng.below(4)).map(|_| attachment(rng)).collect();
    let mut claims = Claims::new();
    let keep: Vec<usize> = want
        .iter()
        .enumerate()
        .filter_map(|(i, a)| claims.insert(a, ()).ok().map(|()| i))
        .collect();
    keep.into_iter().map(|i| want[i].clone()).collect()
}

fn rule(id: String, priority: u32) -> Rule {
    Rule {
        id,
        priority,
        src: None,
        dst: None,
        src_ports: None,
        dst_ports: None,
        protocol: None,
        icmp_type: None,
        icmp_code: None,
        action: Action::Allow,
        stateful: false,
        description: String::new(),
        rate_limit: None,
    }
}

fn tenant(rng: &mut Rng, id: &str) -> Tenant {
    let rules = (0..rng.below(3) as u32)
        .map(|p| rule(format!("r{p}"), p))
        .collect();
    Tenant {
        id: id.into(),
        display_name: String::new(),
        attachments: attachments(rng),
        default_policy: Action::Deny,
        create_time: Timestamp::default(),
        rules: RuleSet {
            version: 1,
            rules: Arc::new(rules),
        },
        storage_qos: Default::default(),
        // Two VLAN IDs among four tenants: some creates collide.
        vlan_id: rng.below(3) as u16,
        no_offload: false,
    }
}

fn hosts(rng: &mut Rng) -> BTreeSet<String> {
    (0..rng.below(4)).map(|_| host(rng)).collect()
}

fn host(rng: &mut Rng) -> String {
    format!("nqn.2024-01.io.example:h{}", rng.below(4))
}

fn subsystem(rng: &mut Rng, id: &str) -> Subsystem {
    Subsystem {
        id: id.into(),
        nqn: format!("nqn.2024-01.io.example:n{}", rng.below(4)),
        serial_number: "s".into(),
        model_number: "m".into(),
        allow_any_host: false,
        allowed_hosts: hosts(rng),
        max_namespaces: 3,
        create_time: Timestamp::default(),
        namespaces: BTreeMap::new(),
        listeners: BTreeMap::new(),
        auth_requirement: Default::default(),
        host_auth: BTreeMap::new(),
        host_qos: Default::default(),
        tls_requirement: Default::default(),
        host_tls: Default::default(),
    }
}

fn namespace(rng: &mut Rng) -> (Namespace, bool) {
    let backend = match rng.below(4) {
        3 => Backend::Volume {
            id: format!("v{}", rng.below(3)),
        },
        0 => Backend::File {
            path: format!("/srv/f{}", rng.below(3)),
            size_bytes: 4096,
            created: true,
        },
        1 => Backend::BlockDevice {
            path: format!("/dev/b{}", rng.below(2)),
        },
        _ => Backend::Ram {
            size_bytes: 512 * (1 + rng.below(8)),
        },
    };
    let given = rng.below(2) == 0;
    let id = [rng.below(4) as u8; 16];
    let ns = Namespace {
        namespace_id: String::new(),
        eui64: None,
        nsid: rng.below(4) as u32,
        backend,
        block_size: 512,
        uuid: id,
        nguid: id,
        qos: Default::default(),
    };
    (ns, given)
}

/// A volume v0..v2: RAM, or a file some namespace may also name.
fn volume(rng: &mut Rng) -> Volume {
    let backend = match rng.below(2) {
        0 => Backend::File {
            path: format!("/srv/f{}", rng.below(3)),
            size_bytes: 4096,
            created: true,
        },
        _ => Backend::Ram {
            size_bytes: 512 * (1 + rng.below(8)),
        },
    };
    Volume {
        id: format!("v{}", rng.below(3)),
        backend,
        block_size: 512,
        uuid: [9; 16],
    }
}

/// QoS limits, now and then none (which clears).
fn qos(rng: &mut Rng) -> QosLimits {
    QosLimits {
        iops: rng.below(3) * 1_000,
        write_bandwidth: rng.below(2) << 20,
        ..QosLimits::default()
    }
}

fn listener(rng: &mut Rng) -> Listener {
    Listener {
        id: format!("l{}", rng.below(3)),
        transport: Transport::Tcp,
        address: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1 + rng.below(2) as u8)),
        port: 4420 + rng.below(3) as u16,
        // Half of them storage endpoints in a tenant's network.
        tenant: (rng.below(2) == 0).then(|| rng.pick(&TENANTS).to_string()),
        mac: None,
        secure_channel: Default::default(),
    }
}

/// Small caps, so that random changes reach them.
const LIMITS: Limits = Limits {
    ram_bytes: 8 * 512,
    tenants: 4,
    attachments_per_tenant: 3,
    attachments: 7,
    rules_per_tenant: 4,
    rules: 9,
    subsystems: 2,
    namespaces: 4,
    hosts: 5,
    listeners: 4,
    volumes: 3,
};

/// One random transition; answers the part it touched, for a later
/// revert, and whether it was accepted.
fn random_change(s: &mut State, rng: &mut Rng, p: &PortRegistry, n: u32) -> (Part, bool) {
    let t = *rng.pick(&TENANTS);
    let sid = *rng.pick(&SUBSYSTEMS);
    let tp = Part::Tenant(t.into());
    let (part, ok) = match rng.below(24) {
        0 | 1 => (tp, s.create_tenant(LIMITS, p, tenant(rng, t)).is_ok()),
        2 => {
            let u = TenantUpdate {
                attachments: Some(attachments(rng)),
                vlan_id: (rng.below(2) == 0).then(|| rng.below(3) as u16),
                ..Default::default()
            };
            (tp, s.update_tenant(LIMITS, p, t, u).is_ok())
        }
        3 | 4 => (tp, s.attach(LIMITS, p, t, attachment(rng)).is_ok()),
        5 => {
            let (port, vlan) = (*rng.pick(&PORTS), rng.below(4) as u16);
            let owner = s.index.port_vlan_holder(port, vlan).map(str::to_string);
            let ok = s.detach(port, vlan).is_ok();
            (Part::Tenant(owner.unwrap_or_default()), ok)
        }
        6 => (tp, s.delete_tenant(t, rng.below(2) == 0).is_ok()),
        7 => {
            let r = rule(format!("x{n}"), rng.below(6) as u32);
            (tp, s.add_rule(LIMITS, t, r, None).is_ok())
        }
        8 => {
            let rid = format!("r{}", rng.below(3));
            (tp, s.delete_rule(t, &rid, None).is_ok())
        }
        9 => {
            let rules = (0..rng.below(6) as u32)
                .map(|i| (None, rule(String::new(), i)))
                .collect();
            (tp, s.replace_rules(LIMITS, t, rules, None).is_ok())
        }
        10 => (tp, s.create_subsystem(LIMITS, subsystem(rng, sid)).is_ok()),
        11 => {
            let u = SubsystemUpdate {
                allowed_hosts: Some(hosts(rng)),
                ..Default::default()
            };
            (tp, s.update_subsystem(LIMITS, sid, u).is_ok())
        }
        12 => (tp, s.add_host(LIMITS, sid, &host(rng)).is_ok()),
        13 => (tp, s.remove_host(sid, &host(rng)).is_ok()),
        14 => (tp, s.delete_subsystem(sid, rng.below(2) == 0).is_ok()),
        15 | 16 => {
            let (ns, given) = namespace(rng);
            let ok = match s.create_namespace(LIMITS, sid, ns, given, given) {
                Ok(ns) => Some(ns.nsid),
                Err(_) => None,
            };
            let part = Part::Namespace {
                subsystem: sid.into(),
                nsid: ok.unwrap_or(0),
            };
            (part, ok.is_some())
        }
        17 => {
            let nsid = 1 + rng.below(3) as u32;
            let size = 512 * (1 + rng.below(8));
            let part = Part::Namespace {
                subsystem: sid.into(),
                nsid,
            };
            let ok = if rng.below(2) == 0 {
                s.resize_namespace(LIMITS, sid, nsid, size).is_ok()
            } else {
                s.delete_namespace(sid, nsid).is_ok()
            };
            (part, ok)
        }
        18 => {
            let l = listener(rng);
            let part = Part::Listener {
                subsystem: sid.into(),
                id: l.id.clone(),
            };
            (part, s.create_listener(LIMITS, sid, l).is_ok())
        }
        19 => {
            let id = listener(rng).id;
            let ok = s.delete_listener(sid, &id).is_ok();
            let part = Part::Listener {
                subsystem: sid.into(),
                id,
            };
            (part, ok)
        }
        20 => {
            let nsid = 1 + rng.below(3) as u32;
            let part = Part::Namespace {
                subsystem: sid.into(),
                nsid,
            };
            (part, s.set_namespace_qos(sid, nsid, qos(rng)).is_ok())
        }
        21 => (tp, s.set_host_qos(sid, &host(rng), qos(rng)).is_ok()),
        22 => (tp, s.create_volume(LIMITS, volume(rng), false).is_ok()),
        _ => {
            let id = format!("v{}", rng.below(3));
            let ok = if rng.below(2) == 0 {
                s.resize_volume(LIMITS, &id, 512 * (1 + rng.below(8)))
                    .is_ok()
            } else {
                s.delete_volume(&id).is_ok()
            };
            (tp, ok)
        }
    };
    (part, ok)
}

/// The tenant other than `owner` whose attachment overlaps `a`, found by
/// comparing with every attachment.
fn scan(s: &State, owner: &str, a: &Attachment) -> Option<String> {
    s.tenants
        .values()
        .filter(|t| t.id != owner)
        .find(|t| t.attachments.iter().any(|o| o.conflicts_with(a)))
        .map(|t| t.id.clone())
}

#[test]
fn random_changes_never_drift() {
    let p = ports();
    let (mut accepted, mut refused, mut reverted) = (0u32, 0u32, 0u32);
    for seed in 1..=64u64 {
        let mut rng = Rng::new(seed);
        let mut s = State::default();
        for n in 0..300u32 {
            let before = s.clone();
            let (part, ok) = random_change(&mut s, &mut rng, &p, n);
            if ok {
                accepted += 1;
                // Undo it now and then, through the checks of revert.
                if rng.below(8) == 0 {
                    let after = s.clone();
                    if s.revert(LIMITS, &part, &before, &after).is_ok() {
                        reverted += 1;
                    }
                }
            } else {
                refused += 1;
                assert_eq!(
                    s, before,
                    "seed {seed} step {n}: a refusal changed the state"
                );
            }
            for sub in s.subsystems.values() {
                assert!(
                    sub.host_qos
                        .iter()
                        .all(|(h, q)| sub.allows_host(h) && !q.is_none()),
                    "seed {seed} step {n}: QoS of a host {} does not allow: {:?}",
                    sub.id,
                    sub.host_qos
                );
            }
            if let Some(d) = s.index_drift() {
                panic!(
                    "seed {seed} step {n}: index drifted\nheld:  {:?}\nfresh: {:?}",
                    d.0, d.1
                );
            }
            let a = attachment(&mut rng);
            let owner = *rng.pick(&TENANTS);
            let found = s.index.claimant(owner, &a).map(str::to_string);
            assert_eq!(found, scan(&s, owner, &a), "seed {seed} step {n}: {a}");
        }
        // What is read back is indexed as what was built.
        let text = serde_json::to_string(&s).unwrap();
        let back: State = serde_json::from_str(&text).unwrap();
        assert_eq!(back.index, s.index, "seed {seed}");
    }
    // The sequences exercised both outcomes and the undo.
    eprintln!("{accepted} accepted, {refused} refused, {reverted} reverted");
    assert!(accepted > 3_000 && refused > 3_000, "{accepted} {refused}");
    assert!(reverted > 300, "{reverted}");
}

/// A state whose maps are changed directly is indexed again by
/// `reindex`, and until then the drift shows.
#[test]
fn reindex_catches_up_with_direct_changes() {
    let p = ports();
    let mut rng = Rng::new(7);
    let mut s = State::default();
    s.create_tenant(LIMITS, &p, tenant(&mut rng, "a")).unwrap();
    let mut t = tenant(&mut rng, "b");
    t.attachments = vec![Attachment::port_vlan("p1", 3)];
    s.tenants.insert("b".into(), t);
    assert!(s.index_drift().is_some());
    s.reindex();
    assert!(s.index_drift().is_none());
    assert_eq!(s.index, Index::build(&s));
    assert!(s
        .attach(LIMITS, &p, "a", Attachment::port_vlan("p1", 0))
        .is_err());
}
