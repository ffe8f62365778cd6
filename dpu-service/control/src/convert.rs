//! Domain values to `dpu.v1` messages (the direction that cannot fail).

use dpu_proto::pbjson_types::Timestamp as PbTimestamp;
use dpu_proto::v1 as pb;

use crate::model::{
    cluster_name, volume_name, Action, Attachment, AuthRequirement, Backend, Cluster, HostAuth,
    Listener, Namespace, PortRole, PortSpec, PskText, QosLimits, RemoteNamespace, Rule,
    SecureChannel, State, Subsystem, Tenant, Timestamp, TlsDerivation, TlsRequirement, Transport,
    Volume,
};

/// A timestamp as a protobuf `Timestamp`.
pub fn timestamp(t: Timestamp) -> PbTimestamp {
    PbTimestamp {
        seconds: t.secs,
        nanos: i32::try_from(t.nanos).unwrap_or(0),
    }
}

/// An attachment as a protobuf message.
pub fn attachment(a: &Attachment) -> pb::Attachment {
    let kind = match a {
        Attachment::Port { port, vlan, guard } => pb::attachment::Kind::Port(pb::PortAttachment {
            port: format!("ports/{port}"),
            vlan_id: u32::from(*vlan),
            allowed_macs: guard.macs.iter().map(ToString::to_string).collect(),
            allowed_source_prefixes: guard.prefixes.iter().map(ToString::to_string).collect(),
        }),
        Attachment::Vxlan {
            uplink,
            vni,
            remote_vteps,
            underlay_prefixes,
        } => pb::attachment::Kind::Vxlan(pb::VxlanAttachment {
            uplink: format!("ports/{uplink}"),
            vni: *vni,
            remote_vteps: remote_vteps.iter().map(ToString::to_string).collect(),
            underlay_prefixes: underlay_prefixes.iter().map(ToString::to_string).collect(),
        }),
    };
    pb::Attachment { kind: Some(kind) }
}

/// A tenant as a protobuf message.
pub fn tenant(t: &Tenant) -> pb::Tenant {
    pb::Tenant {
        name: format!("tenants/{}", t.id),
        display_name: t.display_name.clone(),
        attachments: t.attachments.iter().map(attachment).collect(),
        default_policy: match t.default_policy {
            Action::Allow => pb::DefaultPolicy::Allow,
            Action::Deny => pb::DefaultPolicy::Deny,
        } as i32,
        create_time: Some(timestamp(t.create_time)),
        rule_set_version: t.rules.version,
        rule_count: u32::try_from(t.rules.rules.len()).unwrap_or(u32::MAX),
        storage_qos: (!t.storage_qos.is_none()).then(|| qos(&t.storage_qos)),
        vlan_id: u32::from(t.vlan_id),
        no_offload: t.no_offload,
    }
}

/// A rule of tenant `tenant_id` as a protobuf message.
pub fn rule(tenant_id: &str, r: &Rule) -> pb::FilterRule {
    let range = |p: Option<crate::model::PortRange>| {
        p.map(|p| pb::PortRange {
            first: u32::from(p.first),
            last: u32::from(p.last),
        })
    };
    pb::FilterRule {
        name: format!("tenants/{tenant_id}/rules/{}", r.id),
        priority: r.priority,
        src_prefix: r.src.map(|p| p.to_string()).unwrap_or_default(),
        dst_prefix: r.dst.map(|p| p.to_string()).unwrap_or_default(),
        src_ports: range(r.src_ports),
        dst_ports: range(r.dst_ports),
        ip_protocol: r.protocol.map(u32::from),
        icmp_type: r.icmp_type.map(u32::from),
        icmp_code: r.icmp_code.map(u32::from),
        action: match r.action {
            Action::Allow => pb::RuleAction::Allow,
            Action::Deny => pb::RuleAction::Deny,
        } as i32,
        stateful: r.stateful,
        description: r.description.clone(),
        rate_limit: r.rate_limit.map(|l| pb::RateLimit {
            packets_per_second: if l.bits { 0 } else { l.per_second },
            bits_per_second: if l.bits { l.per_second } else { 0 },
            burst: l.burst,
        }),
    }
}

/// A port role as the protobuf enum value.
pub fn port_role(r: PortRole) -> pb::PortRole {
    match r {
        PortRole::Unspecified => pb::PortRole::Unspecified,
        PortRole::Uplink => pb::PortRole::Uplink,
        PortRole::HostPf => pb::PortRole::HostPf,
        PortRole::Vf => pb::PortRole::Vf,
        PortRole::Sf => pb::PortRole::Sf,
        PortRole::Software => pb::PortRole::Software,
    }
}

/// A configured port, with the tenants bound to it in `state`, as a
/// protobuf message. Live fields (link, counters) are filled by the caller.
pub fn port(p: &PortSpec, state: &State) -> pb::Port {
    let bindings = state
        .tenants
        .values()
        .flat_map(|t| t.attachments.iter().map(move |a| (t, a)))
        .filter(|(_, a)| a.port() == p.id)
        .map(|(t, a)| {
            let (vlan_id, vni) = match a {
                Attachment::Port { vlan, .. } => (u32::from(*vlan), 0),
                Attachment::Vxlan { vni, .. } => (0, *vni),
            };
            pb::PortBinding {
                vlan_id,
                vni,
                tenant: format!("tenants/{}", t.id),
            }
        })
        .collect();
    pb::Port {
        name: format!("ports/{}", p.id),
        driver: p.driver.clone(),
        device: p.device.clone(),
        role: port_role(p.role) as i32,
        link_state: pb::LinkState::Unspecified as i32,
        speed_mbps: 0,
        mac_address: String::new(),
        mtu: 0,
        bindings,
        counters: Some(pb::PortCounters::default()),
    }
}

/// A subsystem as a protobuf message.
pub fn subsystem(s: &Subsystem) -> pb::Subsystem {
    pb::Subsystem {
        name: format!("subsystems/{}", s.id),
        nqn: s.nqn.clone(),
        serial_number: s.serial_number.clone(),
        model_number: s.model_number.clone(),
        allow_any_host: s.allow_any_host,
        allowed_hosts: s.allowed_hosts.iter().cloned().collect(),
        max_namespaces: s.max_namespaces,
        create_time: Some(timestamp(s.create_time)),
        namespace_count: u32::try_from(s.namespaces.len()).unwrap_or(u32::MAX),
        listener_count: u32::try_from(s.listeners.len()).unwrap_or(u32::MAX),
        auth_requirement: match s.auth_requirement {
            AuthRequirement::HostsWithSecret => pb::AuthRequirement::Unspecified,
            AuthRequirement::Required => pb::AuthRequirement::Required,
            AuthRequirement::Disabled => pb::AuthRequirement::Disabled,
        } as i32,
        host_auth: s
            .host_auth
            .iter()
            .map(|(host, a)| host_auth(host, a))
            .collect(),
        host_qos: s
            .host_qos
            .iter()
            .map(|(host, q)| pb::HostQos {
                host_nqn: host.clone(),
                qos: Some(qos(q)),
            })
            .collect(),
        tls_requirement: match s.tls_requirement {
            TlsRequirement::HostsWithKey => pb::TlsRequirement::Unspecified,
            TlsRequirement::Required => pb::TlsRequirement::Required,
            TlsRequirement::Disabled => pb::TlsRequirement::Disabled,
        } as i32,
        host_tls: s
            .host_tls
            .iter()
            .map(|(host, k)| host_tls(host, k))
            .collect(),
    }
}

/// One host's TLS key as a protobuf message: its hash indicator, never
/// the key.
pub fn host_tls(host: &str, k: &PskText) -> pb::HostTls {
    pb::HostTls {
        host_nqn: host.to_string(),
        psk: String::new(),
        psk_hash: u32::from(k.hash_code()),
        v0_derivation: match k.v0_derivation() {
            TlsDerivation::Spec => pb::TlsDerivation::Spec,
            TlsDerivation::Compat => pb::TlsDerivation::Compat,
        } as i32,
    }
}

/// QoS limits as a protobuf message.
pub fn qos(q: &QosLimits) -> pb::QosLimits {
    pb::QosLimits {
        iops: q.iops,
        read_iops: q.read_iops,
        write_iops: q.write_iops,
        bandwidth: q.bandwidth,
        read_bandwidth: q.read_bandwidth,
        write_bandwidth: q.write_bandwidth,
    }
}

/// One host's DH-HMAC-CHAP settings as a protobuf message: whether each
/// secret is set and its hash indicator, never the secret.
pub fn host_auth(host: &str, a: &HostAuth) -> pb::HostAuth {
    pb::HostAuth {
        host_nqn: host.to_string(),
        dhchap_secret: String::new(),
        dhchap_ctrl_secret: String::new(),
        hashes: a.hashes.clone(),
        dh_groups: a.dh_groups.clone(),
        secret_set: true,
        secret_hash: u32::from(a.secret.hash_indicator()),
        ctrl_secret_set: a.ctrl_secret.is_some(),
        ctrl_secret_hash: a
            .ctrl_secret
            .as_ref()
            .map_or(0, |c| u32::from(c.hash_indicator())),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A UUID in RFC 4122 text form.
pub fn uuid_text(u: &[u8; 16]) -> String {
    let h = hex(u);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

pub use crate::model::{listener_name, namespace_name};

/// A storage cluster, with the number of namespaces on it, as a protobuf
/// message: whether a key is set, never the key.
pub fn cluster(c: &Cluster, namespaces: usize) -> pb::Cluster {
    pb::Cluster {
        name: cluster_name(&c.id),
        mon_host: c.mon_host.clone(),
        user: c.user.clone(),
        key: String::new(),
        key_set: c.key.is_some(),
        op_timeout_secs: c.op_timeout_secs,
        connect_timeout_secs: c.connect_timeout_secs,
        create_time: Some(timestamp(c.create_time)),
        namespace_count: u32::try_from(namespaces).unwrap_or(u32::MAX),
    }
}

/// A remote namespace as a protobuf message: whether a DH-HMAC-CHAP
/// secret is set, never the secret; the host NQN it connects with.
pub fn remote(r: &RemoteNamespace) -> pb::RemoteBackend {
    pb::RemoteBackend {
        paths: r.paths.iter().map(ToString::to_string).collect(),
        subnqn: r.subnqn.clone(),
        nsid: r.nsid,
        host_nqn: r.host_nqn.clone(),
        dhchap_secret: String::new(),
        dhchap_secret_set: r.dhchap_secret.is_some(),
        io_timeout_ms: r.io_timeout_ms,
        connect_timeout_ms: r.connect_timeout_ms,
        queue_depth: u32::from(r.queue_depth),
    }
}

/// Volume `v` as a protobuf message, with the namespace made on it
/// (`user`, a resource name) if any. A block device's size is 0 here, as
/// a namespace's is in [`namespace`].
pub fn volume(v: &Volume, user: Option<&str>) -> pb::Volume {
    let backend = match &v.backend {
        Backend::Ram { size_bytes } => Some(pb::volume::Backend::Ram(pb::RamBackend {
            size_bytes: *size_bytes,
        })),
        Backend::Null { size_bytes } => Some(pb::volume::Backend::Null(pb::NullBackend {
            size_bytes: *size_bytes,
        })),
        Backend::File {
            path, size_bytes, ..
        } => Some(pb::volume::Backend::File(pb::FileBackend {
            path: path.clone(),
            size_bytes: *size_bytes,
        })),
        Backend::BlockDevice { path } => {
            Some(pb::volume::Backend::BlockDevice(pb::BlockDeviceBackend {
                path: path.clone(),
            }))
        }
        // The state holds no volume of another kind.
        Backend::Rbd { .. } | Backend::Remote(_) | Backend::Volume { .. } => None,
    };
    pb::Volume {
        name: volume_name(&v.id),
        backend,
        block_size: v.block_size,
        uuid: uuid_text(&v.uuid),
        size_bytes: v.configured_size().unwrap_or(0),
        namespace: user.unwrap_or_default().to_string(),
    }
}

/// A namespace of subsystem `sid` as a protobuf message. A block device's,
/// RBD image's or remote namespace's size is 0 here: only what serves it
/// knows it (the service asks, [`crate::service::ServedNamespaces`]).
pub fn namespace(sid: &str, n: &Namespace) -> pb::Namespace {
    let (backend, size) = match &n.backend {
        Backend::Ram { size_bytes } => (
            pb::namespace::Backend::Ram(pb::RamBackend {
                size_bytes: *size_bytes,
            }),
            *size_bytes,
        ),
        Backend::File {
            path, size_bytes, ..
        } => (
            pb::namespace::Backend::File(pb::FileBackend {
                path: path.clone(),
                size_bytes: *size_bytes,
            }),
            *size_bytes,
        ),
        Backend::BlockDevice { path } => (
            pb::namespace::Backend::BlockDevice(pb::BlockDeviceBackend { path: path.clone() }),
            0,
        ),
        Backend::Rbd {
            cluster,
            pool,
            image,
        } => (
            pb::namespace::Backend::Rbd(pb::RbdBackend {
                cluster_id: cluster.clone(),
                pool: pool.clone(),
                image: image.clone(),
            }),
            0,
        ),
        Backend::Remote(r) => (pb::namespace::Backend::Remote(remote(r)), 0),
        Backend::Null { size_bytes } => (
            pb::namespace::Backend::Null(pb::NullBackend {
                size_bytes: *size_bytes,
            }),
            *size_bytes,
        ),
        Backend::Volume { id } => (pb::namespace::Backend::Volume(id.clone()), 0),
    };
    pb::Namespace {
        name: namespace_name(sid, n.nsid),
        nsid: n.nsid,
        backend: Some(backend),
        block_size: n.block_size,
        uuid: uuid_text(&n.uuid),
        nguid: hex(&n.nguid),
        size_bytes: size,
        // The target's to say (service::cluster's namespace_out).
        state: pb::NamespaceState::Unspecified.into(),
        qos: (!n.qos.is_none()).then(|| qos(&n.qos)),
        namespace_id: n.namespace_id.clone(),
        eui64: n.eui64.map(|e| hex(&e)).unwrap_or_default(),
    }
}

/// A listener of subsystem `sid` as a protobuf message.
pub fn listener(sid: &str, l: &Listener) -> pb::Listener {
    pb::Listener {
        name: listener_name(sid, &l.id),
        transport: match l.transport {
            Transport::Tcp => pb::Transport::Tcp,
        } as i32,
        address: l.address.to_string(),
        port: u32::from(l.port),
        tenant: l.tenant.clone().unwrap_or_default(),
        mac: l.mac.map(|m| m.to_string()).unwrap_or_default(),
        // None as unspecified, as a request that sets none leaves it.
        secure_channel: match l.secure_channel {
            SecureChannel::None => pb::SecureChannel::Unspecified,
            SecureChannel::Allowed => pb::SecureChannel::Allowed,
            SecureChannel::Required => pb::SecureChannel::Required,
        } as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_text_form() {
        let u = [
            0xf8, 0x1d, 0x4f, 0xae, 0x7d, 0xec, 0x11, 0xd0, 0xa7, 0x65, 0x00, 0xa0, 0xc9, 0x1e,
            0x6b, 0xf6,
        ];
        assert_eq!(uuid_text(&u), "f81d4fae-7dec-11d0-a765-00a0c91e6bf6");
        assert_eq!(crate::validate::uuid("u", &uuid_text(&u)).unwrap(), u);
    }

    /// A remote namespace goes out as it came in, with the host NQN used
    /// and whether a secret is set instead of the secret.
    #[test]
    fn remote_round_trips_through_validation_without_its_secret() {
        const SECRET: &str = "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:";
        const HOST: &str = "nqn.2024-01.io.example:dpu";
        let given = pb::RemoteBackend {
            paths: vec!["10.0.0.1:4420".into(), "[fd00::2]:4421".into()],
            subnqn: "nqn.2024-01.io.example:far".into(),
            nsid: 7,
            host_nqn: String::new(),
            dhchap_secret: SECRET.into(),
            dhchap_secret_set: false,
            io_timeout_ms: 0,
            connect_timeout_ms: 2_000,
            queue_depth: 32,
        };
        let r = crate::validate::remote("r", &given, HOST).unwrap();
        let out = remote(&r);
        assert_eq!(
            out,
            pb::RemoteBackend {
                host_nqn: HOST.into(),
                dhchap_secret: String::new(),
                dhchap_secret_set: true,
                io_timeout_ms: 10_000,
                ..given.clone()
            }
        );
        // What a client sends back (a Get's answer with its secret again)
        // validates to the same namespace.
        let again = pb::RemoteBackend {
            dhchap_secret: SECRET.into(),
            ..out
        };
        assert_eq!(crate::validate::remote("r", &again, "").unwrap(), r);
        let n = Namespace {
            namespace_id: String::new(),
            eui64: None,
            nsid: 1,
            backend: Backend::Remote(r),
            block_size: 4096,
            uuid: [1; 16],
            nguid: [2; 16],
            qos: QosLimits::default(),
        };
        let out = namespace("vol", &n);
        assert_eq!(out.qos, None, "no limits");
        assert_eq!(out.size_bytes, 0, "the target's to say");
        assert!(!format!("{out:?}").contains(&SECRET[10..40]));
        assert!(matches!(
            out.backend,
            Some(pb::namespace::Backend::Remote(pb::RemoteBackend {
                dhchap_secret_set: true,
                ..
            }))
        ));
    }

    /// A namespace's ID and EUI-64 go out as they came in, through
    /// validation; a namespace without them has neither.
    #[test]
    fn namespace_id_and_eui64_round_trip_through_validation() {
        let given = pb::Namespace {
            nsid: 2,
            backend: Some(pb::namespace::Backend::Volume("Malloc1".into())),
            uuid: "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb".into(),
            nguid: "1b4e28ba2fa111d2883fb9a761bde3fb".into(),
            namespace_id: "opi-ns1".into(),
            eui64: "1b4e28ba2fa111d2".into(),
            ..Default::default()
        };
        let (n, ..) = crate::validate::namespace("namespace", &given, "").unwrap();
        assert_eq!(n.eui64, Some(0x1b4e_28ba_2fa1_11d2_u64.to_be_bytes()));
        let out = namespace("s", &n);
        assert_eq!(out.name, "subsystems/s/namespaces/2");
        assert_eq!(
            (out.namespace_id.as_str(), out.eui64.as_str()),
            ("opi-ns1", "1b4e28ba2fa111d2")
        );
        assert_eq!(
            (out.uuid.as_str(), out.nguid.as_str()),
            (given.uuid.as_str(), given.nguid.as_str())
        );
        let again = crate::validate::namespace("namespace", &out, "").unwrap().0;
        assert_eq!(again, n);
        let bare = pb::Namespace {
            namespace_id: String::new(),
            eui64: String::new(),
            ..given
        };
        let out = namespace(
            "s",
            &crate::validate::namespace("namespace", &bare, "")
                .unwrap()
                .0,
        );
        assert_eq!((out.namespace_id.as_str(), out.eui64.as_str()), ("", ""));
    }

    /// Limits go out as they came in, through validation; a
    /// subsystem's by host, in NQN order.
    #[test]
    fn qos_round_trips_through_validation() {
        let given = pb::QosLimits {
            iops: 1,
            read_iops: 2,
            write_iops: 3,
            bandwidth: 4,
            read_bandwidth: 5,
            write_bandwidth: 6,
        };
        let q = crate::validate::qos("qos", Some(&given)).unwrap();
        assert_eq!(qos(&q), given);
        let s = Subsystem {
            host_qos: [("nqn.b".to_string(), q), ("nqn.a".to_string(), q)].into(),
            tls_requirement: TlsRequirement::Required,
            ..crate::state::tests::subsystem("s", "nqn.2024-01.io.example:s", true, 1)
        };
        let out = subsystem(&s);
        assert_eq!(
            out.host_qos,
            ["nqn.a", "nqn.b"].map(|h| pb::HostQos {
                host_nqn: h.into(),
                qos: Some(given),
            })
        );
        assert_eq!(out.tls_requirement, pb::TlsRequirement::Required as i32);
    }

    /// Hosts' TLS keys go out in host NQN order with their hash, never
    /// the key.
    #[test]
    fn host_tls_keys_go_out_without_the_key() {
        const PSK: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
        let (k, _) = PskText::parse(PSK).unwrap();
        let s = Subsystem {
            tls_requirement: TlsRequirement::HostsWithKey,
            host_tls: [
                (
                    "nqn.b".to_string(),
                    k.clone().with_v0_derivation(TlsDerivation::Compat),
                ),
                ("nqn.a".to_string(), k),
            ]
            .into(),
            ..crate::state::tests::subsystem("s", "nqn.2024-01.io.example:s", true, 1)
        };
        let out = subsystem(&s);
        assert_eq!(
            out.host_tls,
            [
                ("nqn.a", pb::TlsDerivation::Spec),
                ("nqn.b", pb::TlsDerivation::Compat)
            ]
            .map(|(h, d)| pb::HostTls {
                host_nqn: h.into(),
                psk: String::new(),
                psk_hash: 1,
                v0_derivation: d as i32,
            })
        );
        assert_eq!(out.tls_requirement, pb::TlsRequirement::Unspecified as i32);
        assert!(!format!("{out:?}").contains(&PSK[16..40]));
    }

    #[test]
    fn rule_round_trips_through_validation() {
        let pbr = pb::FilterRule {
            name: String::new(),
            priority: 7,
            src_prefix: "2001:db8::/48".into(),
            dst_prefix: String::new(),
            src_ports: Some(pb::PortRange {
                first: 1024,
                last: 65535,
            }),
            dst_ports: None,
            ip_protocol: Some(17),
            icmp_type: None,
            icmp_code: None,
            action: pb::RuleAction::Allow as i32,
            stateful: true,
            description: "dns".into(),
            rate_limit: Some(pb::RateLimit {
                packets_per_second: 0,
                bits_per_second: 8_000_000,
                burst: 20_000,
            }),
        };
        let r = crate::validate::rule("rule", "r", &pbr).unwrap();
        let back = rule("t", &r);
        assert_eq!(
            back,
            pb::FilterRule {
                name: "tenants/t/rules/r".into(),
                ..pbr
            }
        );
    }
}
