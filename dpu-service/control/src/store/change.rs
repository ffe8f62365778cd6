//! What one committed change did to the state, as the journal records it.
//!
//! [`diff`] compares the state before a change with the state after it and
//! answers the [`Op`]s that turn one into the other; [`apply`] replays
//! them. The ops are as small as the change, not as the state: a tenant's
//! rules are recorded as a splice (keep the first `keep_front` rules and
//! the last `keep_back`, put `middle` between them), so adding or deleting
//! one rule among 10,000 records one rule or none. A tenant's other fields,
//! a whole subsystem (namespaces, listeners and hosts, bounded by their
//! limits), a storage cluster, a volume and a remote controller are
//! recorded whole when they change.
//!
//! Finding the ops costs a walk down the paths of the tenant and subsystem
//! maps that the change copied (the rest the two states share, and the
//! walk skips it; rule sets that the change did not touch share their
//! allocation and compare by pointer) and, for a rule set that changed,
//! one comparison per rule, in memory; only the ops reach the disk.

use std::sync::Arc;

use imbl::ordmap::{DiffItem, Entry};

use serde::{Deserialize, Serialize};

use crate::model::{
    stored_qos, Action, Attachment, Cluster, QosLimits, RemoteController, Rule, RuleSet, State,
    Subsystem, Tenant, Timestamp, Volume,
};

/// One step of a recorded change.
///
/// Externally tagged (`{"put_tenant": {...}}`): serde reads an internally
/// tagged enum through a buffer that loses the integer keys of a
/// subsystem's namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Op {
    /// A tenant that did not exist, whole.
    PutTenant {
        /// The tenant.
        tenant: Tenant,
    },
    /// A tenant's fields other than its rules.
    TenantFields {
        /// The tenant's ID.
        id: String,
        /// New display name.
        display_name: String,
        /// New attachments.
        attachments: Vec<Attachment>,
        /// New default policy.
        default_policy: Action,
        /// Creation time (changes only when a tenant is deleted and made again).
        create_time: Timestamp,
        /// New network VLAN ID (absent from journals written before it:
        /// none).
        #[serde(default, skip_serializing_if = "is_zero")]
        vlan_id: u16,
        /// Whether its flows stay on the cores (absent from journals
        /// written before it: false).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        no_offload: bool,
    },
    /// The limits on a tenant's storage (none: all zero).
    TenantStorageQos {
        /// The tenant's ID.
        id: String,
        /// The new limits.
        #[serde(with = "stored_qos")]
        qos: QosLimits,
    },
    /// A tenant's rule set: its new version and a splice of its rules.
    Rules {
        /// The tenant's ID.
        id: String,
        /// The rule set's new version.
        version: u64,
        /// Rules kept from the front of the old list.
        keep_front: usize,
        /// Rules kept from the back of the old list.
        keep_back: usize,
        /// Rules put between them.
        middle: Vec<Rule>,
    },
    /// A tenant deleted.
    DeleteTenant {
        /// The tenant's ID.
        id: String,
    },
    /// A subsystem created or changed, whole.
    PutSubsystem {
        /// The subsystem.
        subsystem: Subsystem,
    },
    /// A subsystem deleted.
    DeleteSubsystem {
        /// The subsystem's ID.
        id: String,
    },
    /// A storage cluster created or changed, whole (with its key: the
    /// journal is mode 0600, as the snapshot).
    PutCluster {
        /// The cluster.
        cluster: Cluster,
    },
    /// A storage cluster deleted.
    DeleteCluster {
        /// The cluster's ID.
        id: String,
    },
    /// A volume created or changed, whole.
    PutVolume {
        /// The volume.
        volume: Volume,
    },
    /// A volume deleted.
    DeleteVolume {
        /// The volume's ID.
        id: String,
    },
    /// A remote controller created or changed, whole.
    PutRemoteController {
        /// The controller.
        controller: RemoteController,
    },
    /// A remote controller deleted.
    DeleteRemoteController {
        /// The controller's ID.
        id: String,
    },
    /// The counter for service-assigned IDs.
    IdSeq {
        /// Its new value.
        value: u64,
    },
}

/// The ops that turn `before` into `after`; empty when they are equal.
///
/// The maps' diffs skip the subtrees the two states share, so this costs
/// what the change touched (a path of each tree), not a walk over every
/// tenant and subsystem.
pub(crate) fn diff(before: &State, after: &State) -> Vec<Op> {
    let mut ops = Vec::new();
    for d in before.tenants.diff(&after.tenants) {
        match d {
            DiffItem::Add(_, t) => ops.push(Op::PutTenant { tenant: t.clone() }),
            DiffItem::Remove(id, _) => ops.push(Op::DeleteTenant { id: id.clone() }),
            DiffItem::Update {
                old: (_, was),
                new: (_, now),
            } => tenant_ops(was, now, &mut ops),
        }
    }
    for d in before.subsystems.diff(&after.subsystems) {
        match d {
            DiffItem::Add(_, s) | DiffItem::Update { new: (_, s), .. } => {
                ops.push(Op::PutSubsystem {
                    subsystem: s.clone(),
                })
            }
            DiffItem::Remove(id, _) => ops.push(Op::DeleteSubsystem { id: id.clone() }),
        }
    }
    for d in before.clusters.diff(&after.clusters) {
        match d {
            DiffItem::Add(_, c) | DiffItem::Update { new: (_, c), .. } => {
                ops.push(Op::PutCluster { cluster: c.clone() })
            }
            DiffItem::Remove(id, _) => ops.push(Op::DeleteCluster { id: id.clone() }),
        }
    }
    for d in before.volumes.diff(&after.volumes) {
        match d {
            DiffItem::Add(_, v) | DiffItem::Update { new: (_, v), .. } => {
                ops.push(Op::PutVolume { volume: v.clone() })
            }
            DiffItem::Remove(id, _) => ops.push(Op::DeleteVolume { id: id.clone() }),
        }
    }
    for d in before.remote_controllers.diff(&after.remote_controllers) {
        match d {
            DiffItem::Add(_, c) | DiffItem::Update { new: (_, c), .. } => {
                ops.push(Op::PutRemoteController {
                    controller: c.clone(),
                })
            }
            DiffItem::Remove(id, _) => ops.push(Op::DeleteRemoteController { id: id.clone() }),
        }
    }
    if before.id_seq != after.id_seq {
        ops.push(Op::IdSeq {
            value: after.id_seq,
        });
    }
    ops
}

fn tenant_ops(was: &Tenant, now: &Tenant, ops: &mut Vec<Op>) {
    if was.display_name != now.display_name
        || was.attachments != now.attachments
        || was.default_policy != now.default_policy
        || was.create_time != now.create_time
        || was.vlan_id != now.vlan_id
        || was.no_offload != now.no_offload
    {
        ops.push(Op::TenantFields {
            id: now.id.clone(),
            display_name: now.display_name.clone(),
            attachments: now.attachments.clone(),
            default_policy: now.default_policy,
            create_time: now.create_time,
            vlan_id: now.vlan_id,
            no_offload: now.no_offload,
        });
    }
    if was.storage_qos != now.storage_qos {
        ops.push(Op::TenantStorageQos {
            id: now.id.clone(),
            qos: now.storage_qos,
        });
    }
    let (old, new) = (&was.rules.rules, &now.rules.rules);
    if Arc::ptr_eq(old, new) || old == new {
        if was.rules.version != now.rules.version {
            ops.push(Op::Rules {
                id: now.id.clone(),
                version: now.rules.version,
                keep_front: old.len(),
                keep_back: 0,
                middle: Vec::new(),
            });
        }
        return;
    }
    let front = old
        .iter()
        .zip(new.iter())
        .take_while(|(a, b)| a == b)
        .count();
    let most = old.len().min(new.len()) - front;
    let back = old
        .iter()
        .rev()
        .zip(new.iter().rev())
        .take(most)
        .take_while(|(a, b)| a == b)
        .count();
    ops.push(Op::Rules {
        id: now.id.clone(),
        version: now.rules.version,
        keep_front: front,
        keep_back: back,
        middle: new[front..new.len() - back].to_vec(),
    });
}

/// Replays `ops` on `state`.
///
/// # Errors
/// A description of the first op that does not fit the state (a tenant
/// that should exist and does not, or the reverse; a splice longer than
/// the rules it keeps). `state` may then be partly changed.
pub(crate) fn apply(state: &mut State, ops: Vec<Op>) -> Result<(), String> {
    for op in ops {
        match op {
            Op::PutTenant { tenant } => match state.tenants.entry(tenant.id.clone()) {
                Entry::Occupied(_) => return Err(format!("tenant {} created twice", tenant.id)),
                Entry::Vacant(v) => {
                    v.insert(tenant);
                }
            },
            Op::TenantFields {
                id,
                display_name,
                attachments,
                default_policy,
                create_time,
                vlan_id,
                no_offload,
            } => {
                let t = tenant(state, &id)?;
                t.display_name = display_name;
                t.attachments = attachments;
                t.default_policy = default_policy;
                t.create_time = create_time;
                t.vlan_id = vlan_id;
                t.no_offload = no_offload;
            }
            Op::TenantStorageQos { id, qos } => tenant(state, &id)?.storage_qos = qos,
            Op::Rules {
                id,
                version,
                keep_front,
                keep_back,
                middle,
            } => {
                let t = tenant(state, &id)?;
                let old = &t.rules.rules;
                let kept = keep_front.checked_add(keep_back);
                if kept.is_none_or(|k| k > old.len()) {
                    return Err(format!(
                        "tenants/{id}: keeps {keep_front} + {keep_back} of {} rules",
                        old.len()
                    ));
                }
                let rules = if keep_front == old.len() && middle.is_empty() {
                    old.clone()
                } else {
                    let mut new = Vec::with_capacity(keep_front + middle.len() + keep_back);
                    new.extend_from_slice(&old[..keep_front]);
                    new.extend(middle);
                    new.extend_from_slice(&old[old.len() - keep_back..]);
                    Arc::new(new)
                };
                t.rules = RuleSet { version, rules };
            }
            Op::DeleteTenant { id } => {
                if state.tenants.remove(&id).is_none() {
                    return Err(format!("tenants/{id} deleted but does not exist"));
                }
            }
            Op::PutSubsystem { subsystem } => {
                state.subsystems.insert(subsystem.id.clone(), subsystem);
            }
            Op::DeleteSubsystem { id } => {
                if state.subsystems.remove(&id).is_none() {
                    return Err(format!("subsystems/{id} deleted but does not exist"));
                }
            }
            Op::PutCluster { cluster } => {
                state.clusters.insert(cluster.id.clone(), cluster);
            }
            Op::DeleteCluster { id } => {
                if state.clusters.remove(&id).is_none() {
                    return Err(format!("clusters/{id} deleted but does not exist"));
                }
            }
            Op::PutVolume { volume } => {
                state.volumes.insert(volume.id.clone(), volume);
            }
            Op::DeleteVolume { id } => {
                if state.volumes.remove(&id).is_none() {
                    return Err(format!("volumes/{id} deleted but does not exist"));
                }
            }
            Op::PutRemoteController { controller } => {
                state
                    .remote_controllers
                    .insert(controller.id.clone(), controller);
            }
            Op::DeleteRemoteController { id } => {
                if state.remote_controllers.remove(&id).is_none() {
                    return Err(format!(
                        "nvmeRemoteControllers/{id} deleted but does not exist"
                    ));
                }
            }
            Op::IdSeq { value } => state.id_seq = value,
        }
    }
    Ok(())
}

/// Whether a VLAN ID is 0 (none), for `skip_serializing_if`.
fn is_zero(v: &u16) -> bool {
    *v == 0
}

fn tenant<'a>(state: &'a mut State, id: &str) -> Result<&'a mut Tenant, String> {
    state
        .tenants
        .get_mut(id)
        .ok_or_else(|| format!("tenants/{id} changed but does not exist"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(priority: u32) -> Rule {
        Rule {
            id: format!("r{priority}"),
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

    fn state(rules: Vec<Rule>) -> State {
        let mut s = State::default();
        s.tenants.insert(
            "a".into(),
            Tenant {
                id: "a".into(),
                display_name: "a".into(),
                attachments: vec![],
                default_policy: Action::Deny,
                create_time: Timestamp::default(),
                rules: RuleSet {
                    version: 1,
                    rules: Arc::new(rules),
                },
                storage_qos: Default::default(),
                vlan_id: 0,
                no_offload: false,
            },
        );
        s
    }

    fn splice(ops: &[Op]) -> (usize, usize, usize) {
        match ops {
            [Op::Rules {
                keep_front,
                keep_back,
                middle,
                ..
            }] => (*keep_front, *keep_back, middle.len()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rule_changes_are_splices_of_what_changed() {
        let before = state((0..10_000).map(|p| rule(p * 2)).collect());
        let with = |f: &dyn Fn(&mut Vec<Rule>)| {
            let mut s = before.clone();
            let t = s.tenants.get_mut("a").unwrap();
            let mut rules = t.rules.rules.as_ref().clone();
            f(&mut rules);
            t.rules = RuleSet {
                version: 2,
                rules: Arc::new(rules),
            };
            s
        };
        for (after, expected) in [
            (with(&|r| r.insert(5_000, rule(9_999))), (5_000, 5_000, 1)),
            (with(&|r| r.push(rule(99_999))), (10_000, 0, 1)),
            (with(&|r| r.insert(0, rule(1))), (0, 10_000, 1)),
            (
                with(&|r| {
                    r.remove(17);
                }),
                (17, 9_982, 0),
            ),
            (with(&|r| r[3].description = "x".into()), (3, 9_996, 1)),
            (with(&|r| r.clear()), (0, 0, 0)),
            (with(&|_| {}), (10_000, 0, 0)),
        ] {
            let ops = diff(&before, &after);
            assert_eq!(splice(&ops), expected);
            let mut replayed = before.clone();
            apply(&mut replayed, ops).unwrap();
            assert_eq!(replayed, after);
        }
        assert!(diff(&before, &before.clone()).is_empty());
    }

    /// A tenant's storage limits are recorded on their own, and replay.
    #[test]
    fn storage_limits_are_an_op_of_their_own() {
        let before = state(vec![rule(1)]);
        let mut after = before.clone();
        after.tenants.get_mut("a").unwrap().storage_qos = QosLimits {
            iops: 7,
            ..QosLimits::default()
        };
        let ops = diff(&before, &after);
        assert!(
            matches!(&ops[..], [Op::TenantStorageQos { id, qos }] if id == "a" && qos.iops == 7),
            "{ops:?}"
        );
        let json = serde_json::to_string(&ops).unwrap();
        assert_eq!(
            json,
            r#"[{"tenant_storage_qos":{"id":"a","qos":{"iops":7}}}]"#
        );
        let read: Vec<Op> = serde_json::from_str(&json).unwrap();
        let mut replayed = before.clone();
        apply(&mut replayed, read).unwrap();
        assert_eq!(replayed, after);
        let mut cleared = after.clone();
        apply(&mut cleared, diff(&after, &before)).unwrap();
        assert_eq!(cleared, before);
    }

    /// A tenant's network VLAN ID is one of its fields, and replays; a
    /// journal written before it reads as none.
    #[test]
    fn a_tenants_vlan_id_is_recorded() {
        let before = state(vec![rule(1)]);
        let mut after = before.clone();
        after.tenants.get_mut("a").unwrap().vlan_id = 10;
        let ops = diff(&before, &after);
        assert!(
            matches!(&ops[..], [Op::TenantFields { vlan_id: 10, .. }]),
            "{ops:?}"
        );
        let mut replayed = before.clone();
        apply(
            &mut replayed,
            serde_json::from_str(&serde_json::to_string(&ops).unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!(replayed, after);
        let old = r#"[{"tenant_fields":{"id":"a","display_name":"","attachments":[],"default_policy":"deny","create_time":{"secs":0,"nanos":0}}}]"#;
        let read: Vec<Op> = serde_json::from_str(old).unwrap();
        assert!(matches!(
            &read[..],
            [Op::TenantFields {
                vlan_id: 0,
                no_offload: false,
                ..
            }]
        ));
        // Opting out of offload is one of its fields too.
        let mut out = after.clone();
        out.tenants.get_mut("a").unwrap().no_offload = true;
        let ops = diff(&after, &out);
        assert!(
            matches!(
                &ops[..],
                [Op::TenantFields {
                    no_offload: true,
                    ..
                }]
            ),
            "{ops:?}"
        );
        let mut replayed = after.clone();
        apply(
            &mut replayed,
            serde_json::from_str(&serde_json::to_string(&ops).unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!(replayed, out);
    }

    /// Volumes are recorded whole, and replay.
    #[test]
    fn volumes_are_recorded_and_replayed() {
        let before = state(vec![]);
        let mut after = before.clone();
        let v = Volume {
            id: "v1".into(),
            backend: crate::model::Backend::Ram { size_bytes: 4096 },
            block_size: 512,
            uuid: [3; 16],
        };
        after.volumes.insert("v1".into(), v);
        let ops = diff(&before, &after);
        assert!(matches!(&ops[..], [Op::PutVolume { .. }]), "{ops:?}");
        let json = serde_json::to_string(&ops).unwrap();
        let mut replayed = before.clone();
        apply(&mut replayed, serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(replayed, after);
        let back = diff(&after, &before);
        assert!(matches!(&back[..], [Op::DeleteVolume { id }] if id == "v1"));
        apply(&mut replayed, back).unwrap();
        assert_eq!(replayed, before);
        let gone = vec![Op::DeleteVolume { id: "v1".into() }];
        assert!(apply(&mut replayed, gone)
            .unwrap_err()
            .contains("volumes/v1"));
    }

    /// Remote controllers are recorded whole, and replay; a state
    /// written before them reads as having none.
    #[test]
    fn remote_controllers_are_recorded_and_replayed() {
        let before = state(vec![]);
        let mut after = before.clone();
        let mut c = RemoteController {
            id: "nvme0".into(),
            queue_depth: 64,
            paths: Default::default(),
        };
        c.paths.insert(
            "p1".into(),
            crate::model::RemotePath {
                addr: "[fd00::1]:4420".parse().unwrap(),
                subnqn: "nqn.2024-01.io.example:far".into(),
                host_nqn: "nqn.2024-01.io.example:me".into(),
            },
        );
        after.remote_controllers.insert("nvme0".into(), c.clone());
        let ops = diff(&before, &after);
        assert!(
            matches!(&ops[..], [Op::PutRemoteController { controller }] if *controller == c),
            "{ops:?}"
        );
        let json = serde_json::to_string(&ops).unwrap();
        let mut replayed = before.clone();
        apply(&mut replayed, serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(replayed, after);
        // A change of one path is the controller again.
        let mut changed = after.clone();
        changed
            .remote_controllers
            .get_mut("nvme0")
            .unwrap()
            .queue_depth = 8;
        let ops = diff(&after, &changed);
        apply(&mut replayed, ops).unwrap();
        assert_eq!(replayed, changed);
        assert_ne!(replayed, after);
        let back = diff(&changed, &before);
        assert!(matches!(&back[..], [Op::DeleteRemoteController { id }] if id == "nvme0"));
        apply(&mut replayed, back).unwrap();
        assert_eq!(replayed, before);
        let gone = vec![Op::DeleteRemoteController { id: "nvme0".into() }];
        assert!(apply(&mut replayed, gone)
            .unwrap_err()
            .contains("nvmeRemoteControllers/nvme0"));
        // The state file: kept, and absent when there are none.
        let text = serde_json::to_string(&changed).unwrap();
        assert!(text.contains("\"remote_controllers\""), "{text}");
        assert_eq!(serde_json::from_str::<State>(&text).unwrap(), changed);
        let none = serde_json::to_string(&before).unwrap();
        assert!(!none.contains("remote_controllers"), "{none}");
    }

    #[test]
    fn splices_that_do_not_fit_are_refused() {
        let mut s = state((0..3).map(rule).collect());
        let op = |front, back| Op::Rules {
            id: "a".into(),
            version: 2,
            keep_front: front,
            keep_back: back,
            middle: vec![],
        };
        assert!(apply(&mut s, vec![op(2, 2)])
            .unwrap_err()
            .contains("keeps 2 + 2 of 3"));
        assert!(apply(&mut s, vec![op(usize::MAX, 1)]).is_err());
        let err = apply(&mut s, vec![Op::DeleteTenant { id: "b".into() }]).unwrap_err();
        assert!(err.contains("tenants/b"), "{err}");
        let t = s.tenants["a"].clone();
        assert!(apply(&mut s, vec![Op::PutTenant { tenant: t }]).is_err());
    }
}
