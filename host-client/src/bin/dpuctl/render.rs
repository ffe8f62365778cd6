//! Text renderings of `dpu.v1` messages for `--output table`.

use dpu_client::pb;

use crate::qos;
use crate::table::{fields, Table};

/// The enum value's name without its prefix, lower-case (`DEFAULT_POLICY_DENY` → `deny`).
fn enum_name(full: &str, prefix: &str) -> String {
    full.strip_prefix(prefix)
        .unwrap_or(full)
        .to_ascii_lowercase()
}

/// The last segment of a resource name.
fn id(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

fn or_any(s: &str) -> String {
    if s.is_empty() {
        "any".into()
    } else {
        s.to_string()
    }
}

fn time(t: Option<&dpu_proto::pbjson_types::Timestamp>) -> String {
    t.and_then(|t| serde_json::to_value(t).ok())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn attachment(a: &pb::Attachment) -> String {
    match &a.kind {
        Some(pb::attachment::Kind::Port(p)) => {
            // The syntax of dpuctl's --port.
            let mut out = id(&p.port).to_string();
            if p.vlan_id != 0 {
                out += &format!(".{}", p.vlan_id);
            }
            for m in &p.allowed_macs {
                out += &format!(",mac={m}");
            }
            for ip in &p.allowed_source_prefixes {
                out += &format!(",ip={ip}");
            }
            out
        }
        Some(pb::attachment::Kind::Vxlan(v))
            if v.remote_vteps.is_empty() && v.underlay_prefixes.is_empty() =>
        {
            format!("{}:vni{}", id(&v.uplink), v.vni)
        }
        Some(pb::attachment::Kind::Vxlan(v)) => {
            let from: Vec<&str> = v
                .remote_vteps
                .iter()
                .chain(&v.underlay_prefixes)
                .map(String::as_str)
                .collect();
            format!("{}:vni{}:{}", id(&v.uplink), v.vni, from.join(","))
        }
        None => "?".into(),
    }
}

/// Service information as key/value lines.
pub fn info(i: &pb::ServiceInfo) -> String {
    fields(&[
        ("version", i.version.clone()),
        ("api", i.api_version.clone()),
        ("target", i.target_triple.clone()),
        ("dpdk", or_none(&i.dpdk_version)),
        ("dataplane", i.dataplane_driver.clone()),
        ("capabilities", i.capabilities.join(", ")),
        ("started", time(i.start_time.as_ref())),
        ("hostname", i.hostname.clone()),
    ])
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

fn or_none(s: &str) -> String {
    if s.is_empty() {
        "none".into()
    } else {
        s.to_string()
    }
}

/// Tenants, one row each.
pub fn tenants(list: &[pb::Tenant]) -> String {
    let mut t = Table::new(&[
        "TENANT",
        "POLICY",
        "VLAN",
        "RULES",
        "VERSION",
        "ATTACHMENTS",
        "STORAGE QOS",
        "DISPLAY NAME",
    ]);
    for x in list {
        let policy = pb::DefaultPolicy::try_from(x.default_policy)
            .map(|p| enum_name(p.as_str_name(), "DEFAULT_POLICY_"))
            .unwrap_or_default();
        let atts: Vec<String> = x.attachments.iter().map(attachment).collect();
        t.row(vec![
            id(&x.name).into(),
            policy,
            match x.vlan_id {
                0 => "-".into(),
                v => v.to_string(),
            },
            x.rule_count.to_string(),
            x.rule_set_version.to_string(),
            if atts.is_empty() {
                "-".into()
            } else {
                atts.join(",")
            },
            qos::text(x.storage_qos.as_ref()),
            x.display_name.clone(),
        ]);
    }
    t.render()
}

/// Ports, one row each.
pub fn ports(list: &[pb::Port]) -> String {
    let mut t = Table::new(&[
        "PORT", "ROLE", "DRIVER", "LINK", "RX PKTS", "TX PKTS", "TENANTS",
    ]);
    for p in list {
        let role = pb::PortRole::try_from(p.role)
            .map(|r| enum_name(r.as_str_name(), "PORT_ROLE_"))
            .unwrap_or_default();
        let link = pb::LinkState::try_from(p.link_state)
            .map(|l| enum_name(l.as_str_name(), "LINK_STATE_"))
            .unwrap_or_default()
            .replace("unspecified", "unknown");
        let c = p.counters.unwrap_or_default();
        let bindings: Vec<String> = p
            .bindings
            .iter()
            .map(|b| match (b.vlan_id, b.vni) {
                (0, 0) => id(&b.tenant).to_string(),
                (v, 0) => format!("{}@vlan{v}", id(&b.tenant)),
                (_, n) => format!("{}@vni{n}", id(&b.tenant)),
            })
            .collect();
        t.row(vec![
            id(&p.name).into(),
            role,
            p.driver.clone(),
            link,
            c.rx_packets.to_string(),
            c.tx_packets.to_string(),
            if bindings.is_empty() {
                "-".into()
            } else {
                bindings.join(",")
            },
        ]);
    }
    t.render()
}

fn range(r: Option<&pb::PortRange>) -> String {
    match r {
        None => "any".into(),
        Some(r) if r.first == r.last => r.first.to_string(),
        Some(r) => format!("{}-{}", r.first, r.last),
    }
}

fn proto_name(p: Option<u32>) -> String {
    match p {
        None => "any".into(),
        Some(1) => "icmp".into(),
        Some(6) => "tcp".into(),
        Some(17) => "udp".into(),
        Some(58) => "icmpv6".into(),
        Some(132) => "sctp".into(),
        Some(n) => n.to_string(),
    }
}

/// A rate limit as `RATE/BURST` (`10Mbps/125000B`, `100pps/10`), or `-`.
fn rate(l: Option<&pb::RateLimit>) -> String {
    let si = |v: u64| match v {
        v if v >= 1_000_000_000 && v % 1_000_000_000 == 0 => format!("{}G", v / 1_000_000_000),
        v if v >= 1_000_000 && v % 1_000_000 == 0 => format!("{}M", v / 1_000_000),
        v if v >= 1_000 && v % 1_000 == 0 => format!("{}k", v / 1_000),
        v => v.to_string(),
    };
    match l {
        None => "-".into(),
        Some(l) if l.bits_per_second > 0 => {
            format!("{}bps/{}B", si(l.bits_per_second), l.burst)
        }
        Some(l) => format!("{}pps/{}", si(l.packets_per_second), l.burst),
    }
}

/// Rules in evaluation order, one row each.
pub fn rules(list: &[pb::FilterRule]) -> String {
    let mut t = Table::new(&[
        "PRIO",
        "RULE",
        "ACTION",
        "PROTO",
        "SRC",
        "SPORT",
        "DST",
        "DPORT",
        "ICMP",
        "STATEFUL",
        "RATE",
        "DESCRIPTION",
    ]);
    for r in list {
        let action = pb::RuleAction::try_from(r.action)
            .map(|a| enum_name(a.as_str_name(), "RULE_ACTION_"))
            .unwrap_or_default();
        let icmp = match (r.icmp_type, r.icmp_code) {
            (None, _) => "-".to_string(),
            (Some(t), None) => t.to_string(),
            (Some(t), Some(c)) => format!("{t}/{c}"),
        };
        t.row(vec![
            r.priority.to_string(),
            id(&r.name).into(),
            action,
            proto_name(r.ip_protocol),
            or_any(&r.src_prefix),
            range(r.src_ports.as_ref()),
            or_any(&r.dst_prefix),
            range(r.dst_ports.as_ref()),
            icmp,
            if r.stateful {
                "yes".into()
            } else {
                "no".into()
            },
            rate(r.rate_limit.as_ref()),
            r.description.clone(),
        ]);
    }
    t.render()
}

/// Subsystems, one row each.
pub fn subsystems(list: &[pb::Subsystem]) -> String {
    let mut t = Table::new(&[
        "SUBSYSTEM",
        "NQN",
        "SERIAL",
        "HOSTS",
        "NAMESPACES",
        "LISTENERS",
        "AUTH",
        "TLS",
        "HOST QOS",
    ]);
    for s in list {
        let hosts = if s.allow_any_host {
            "any".to_string()
        } else if s.allowed_hosts.is_empty() {
            "none".to_string()
        } else {
            s.allowed_hosts.join(",")
        };
        t.row(vec![
            id(&s.name).into(),
            s.nqn.clone(),
            s.serial_number.clone(),
            hosts,
            s.namespace_count.to_string(),
            s.listener_count.to_string(),
            auth(s),
            tls(s),
            qos::hosts_text(&s.host_qos),
        ]);
    }
    t.render()
}

/// A subsystem's authentication: who must authenticate, then each host
/// with a secret as `host=secret:HH[+ctrl:HH]` (the hash indicators;
/// secrets themselves never reach the client).
fn auth(s: &pb::Subsystem) -> String {
    let who = match pb::AuthRequirement::try_from(s.auth_requirement) {
        Ok(pb::AuthRequirement::Required) => "required",
        Ok(pb::AuthRequirement::Disabled) => "disabled",
        _ => "hosts-with-secret",
    };
    let mut out = who.to_string();
    for a in &s.host_auth {
        out.push_str(&format!(" {}=secret:{:02}", a.host_nqn, a.secret_hash));
        if a.ctrl_secret_set {
            out.push_str(&format!("+ctrl:{:02}", a.ctrl_secret_hash));
        }
    }
    out
}

/// A subsystem's secure channel: who must use TLS, then each host with
/// a key as `host=psk:HH` (the hash indicator; keys themselves never
/// reach the client), `host=psk:HH/compat` for one whose version 0
/// identities derive as libnvme did.
fn tls(s: &pb::Subsystem) -> String {
    let who = match pb::TlsRequirement::try_from(s.tls_requirement) {
        Ok(pb::TlsRequirement::Required) => "required",
        Ok(pb::TlsRequirement::Disabled) => "disabled",
        _ => "hosts-with-key",
    };
    let mut out = who.to_string();
    for k in &s.host_tls {
        out.push_str(&format!(" {}=psk:{:02}", k.host_nqn, k.psk_hash));
        if k.v0_derivation == pb::TlsDerivation::Compat as i32 {
            out.push_str("/compat");
        }
    }
    out
}

/// A listener's secure channel by the name `--secure-channel` takes.
fn secure_channel(l: &pb::Listener) -> String {
    match pb::SecureChannel::try_from(l.secure_channel) {
        Ok(pb::SecureChannel::Allowed) => "allowed",
        Ok(pb::SecureChannel::Required) => "required",
        Ok(pb::SecureChannel::Unspecified | pb::SecureChannel::None) => "none",
        Err(_) => "?",
    }
    .to_string()
}

/// A byte count with a binary unit.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut u = 0;
    while v >= 1024 && v.is_multiple_of(1024) && u + 1 < UNITS.len() {
        v /= 1024;
        u += 1;
    }
    format!("{v} {}", UNITS[u])
}

/// Namespaces, one row each.
pub fn namespaces(list: &[pb::Namespace]) -> String {
    let mut t = Table::new(&["NSID", "BACKEND", "SIZE", "BLOCK", "STATE", "QOS", "UUID"]);
    for n in list {
        let backend = match &n.backend {
            Some(pb::namespace::Backend::Ram(_)) => "ram".to_string(),
            Some(pb::namespace::Backend::File(f)) => format!("file:{}", f.path),
            Some(pb::namespace::Backend::BlockDevice(b)) => format!("bdev:{}", b.path),
            Some(pb::namespace::Backend::Rbd(r)) => {
                format!("rbd:{}:{}/{}", r.cluster_id, r.pool, r.image)
            }
            Some(pb::namespace::Backend::Remote(r)) => {
                format!("remote {} {} nsid {}", r.paths.join(","), r.subnqn, r.nsid)
            }
            Some(pb::namespace::Backend::Null(_)) => "null".to_string(),
            Some(pb::namespace::Backend::Volume(v)) => format!("volume:{v}"),
            None => "?".into(),
        };
        t.row(vec![
            n.nsid.to_string(),
            backend,
            bytes(n.size_bytes),
            n.block_size.to_string(),
            match n.state() {
                pb::NamespaceState::Unspecified => "-",
                pb::NamespaceState::Serving => "serving",
                pb::NamespaceState::NotServed => "not served",
                pb::NamespaceState::Unreachable => "unreachable",
            }
            .into(),
            qos::text(n.qos.as_ref()),
            n.uuid.clone(),
        ]);
    }
    t.render()
}

/// Volumes, one row each, with the namespace made on each (`-` for
/// none). A block device's size is `-` while no namespace serves it.
pub fn volumes(list: &[pb::Volume]) -> String {
    let mut t = Table::new(&["VOLUME", "BACKEND", "SIZE", "BLOCK", "NAMESPACE", "UUID"]);
    for v in list {
        let backend = match &v.backend {
            Some(pb::volume::Backend::Ram(_)) => "ram".to_string(),
            Some(pb::volume::Backend::File(f)) => format!("file:{}", f.path),
            Some(pb::volume::Backend::BlockDevice(b)) => format!("bdev:{}", b.path),
            Some(pb::volume::Backend::Null(_)) => "null".to_string(),
            None => "?".into(),
        };
        let size = match (&v.backend, v.size_bytes) {
            (Some(pb::volume::Backend::BlockDevice(_)), 0) => "-".to_string(),
            (_, n) => bytes(n),
        };
        t.row(vec![
            id(&v.name).into(),
            backend,
            size,
            v.block_size.to_string(),
            or_dash(&v.namespace),
            v.uuid.clone(),
        ]);
    }
    t.render()
}

/// Storage clusters, one row each: whether a key is set, never a key.
pub fn clusters(list: &[pb::Cluster]) -> String {
    let mut t = Table::new(&[
        "CLUSTER",
        "MONITORS",
        "USER",
        "KEY",
        "OP TIMEOUT",
        "CONNECT TIMEOUT",
        "NAMESPACES",
        "CREATED",
    ]);
    for c in list {
        t.row(vec![
            id(&c.name).into(),
            c.mon_host.clone(),
            c.user.clone(),
            if c.key_set { "set" } else { "none" }.into(),
            format!("{} s", c.op_timeout_secs),
            format!("{} s", c.connect_timeout_secs),
            c.namespace_count.to_string(),
            time(c.create_time.as_ref()),
        ]);
    }
    t.render()
}

/// Listeners, one row each.
pub fn listeners(list: &[pb::Listener]) -> String {
    let mut t = Table::new(&[
        "LISTENER",
        "TRANSPORT",
        "ADDRESS",
        "PORT",
        "TENANT",
        "MAC",
        "SECURE CHANNEL",
    ]);
    for l in list {
        let tr = pb::Transport::try_from(l.transport)
            .map(|x| enum_name(x.as_str_name(), "TRANSPORT_"))
            .unwrap_or_default();
        t.row(vec![
            id(&l.name).into(),
            tr,
            l.address.clone(),
            l.port.to_string(),
            or_dash(&l.tenant),
            or_dash(&l.mac),
            secure_channel(l),
        ]);
    }
    t.render()
}

/// `dpuctl offload status`: the table's use, what happened to the flows
/// offered, and each tenant's flows.
pub fn offload(o: &pb::OffloadCounters) -> String {
    let mut out = format!(
        "provider {}: {} of {} flows in hardware\n\n",
        o.provider, o.in_use, o.capacity
    );
    let mut f = Table::new(&["FLOWS", "COUNT"]);
    for (what, n) in [
        ("installed", o.offloaded),
        ("withdrawn (closed)", o.withdrawn),
        ("aged", o.aged),
        ("invalidated (changes)", o.invalidated),
        ("refused: unsupported", o.unsupported),
        ("refused: table full", o.table_full),
        ("refused: insert failed", o.insert_failed),
        ("refused: over quota", o.over_quota),
        ("refused: rate limited", o.rate_limited),
        ("refused: queue full", o.queue_full),
        ("refused: stale", o.stale),
        ("errors: remove", o.remove_failed),
        ("errors: commit", o.commit_failed),
    ] {
        f.row(vec![what.into(), n.to_string()]);
    }
    out.push_str(&f.render());
    let mut t = Table::new(&["TENANT", "FLOWS", "PACKETS", "BYTES", "DROPPED"]);
    for x in &o.tenants {
        t.row(vec![
            id(&x.tenant).into(),
            x.flows.to_string(),
            x.packets.to_string(),
            x.bytes.to_string(),
            x.dropped_packets.to_string(),
        ]);
    }
    out.push('\n');
    out.push_str(&t.render());
    if !o.last_error.is_empty() {
        out.push_str(&format!("\nlast error: {}\n", o.last_error));
    }
    if !o.last_unsupported.is_empty() {
        out.push_str(&format!("\nlast unsupported: {}\n", o.last_unsupported));
    }
    out
}

/// A counter snapshot: one table per kind of object.
pub fn counters(s: &pb::CounterSnapshot) -> String {
    let mut out = format!("counters at {}\n\n", time(s.time.as_ref()));
    let mut p = Table::new(&[
        "PORT",
        "RX PKTS",
        "RX BYTES",
        "TX PKTS",
        "TX BYTES",
        "RX MISSED",
        "RX ERR",
        "TX ERR",
    ]);
    for e in &s.ports {
        let c = e.counters.unwrap_or_default();
        p.row(
            [
                c.rx_packets,
                c.rx_bytes,
                c.tx_packets,
                c.tx_bytes,
                c.rx_missed,
                c.rx_errors,
                c.tx_errors,
            ]
            .iter()
            .map(u64::to_string)
            .fold(vec![id(&e.port).to_string()], |mut v, x| {
                v.push(x);
                v
            }),
        );
    }
    out.push_str(&p.render());
    let mut t = Table::new(&[
        "TENANT",
        "RX PKTS",
        "RX BYTES",
        "FORWARDED",
        "DROPPED",
        "CONNTRACK",
        "OFFLOADED",
    ]);
    for x in &s.tenants {
        t.row(vec![
            id(&x.tenant).into(),
            x.rx_packets.to_string(),
            x.rx_bytes.to_string(),
            x.forwarded_packets.to_string(),
            x.dropped_packets.to_string(),
            x.conntrack_entries.to_string(),
            x.offloaded_packets.to_string(),
        ]);
    }
    out.push('\n');
    out.push_str(&t.render());
    let mut r = Table::new(&["RULE", "PACKETS", "BYTES", "LAST HIT"]);
    for x in &s.rules {
        let name = x
            .rule
            .strip_prefix("tenants/")
            .unwrap_or(&x.rule)
            .replace("/rules/", "/");
        let last = time(x.last_hit_time.as_ref());
        r.row(vec![
            name,
            x.packets.to_string(),
            x.bytes.to_string(),
            if last.is_empty() {
                "never".into()
            } else {
                last
            },
        ]);
    }
    out.push('\n');
    out.push_str(&r.render());
    let mut d = Table::new(&["DROP REASON", "PACKETS"]);
    for x in &s.drops {
        let reason = pb::DropReason::try_from(x.reason)
            .map(|r| enum_name(r.as_str_name(), "DROP_REASON_"))
            .unwrap_or_default();
        d.row(vec![reason, x.packets.to_string()]);
    }
    out.push('\n');
    out.push_str(&d.render());
    let mut ss = Table::new(&[
        "SUBSYSTEM",
        "CONNECTIONS",
        "READS",
        "WRITES",
        "READ BYTES",
        "WRITE BYTES",
        "ERRORS",
        "AUTH OK",
        "AUTH FAILED",
        "AUTH RATE-LIMITED",
        "AUTH BUSY",
    ]);
    for x in &s.subsystems {
        ss.row(vec![
            id(&x.subsystem).into(),
            x.connections.to_string(),
            x.read_ops.to_string(),
            x.write_ops.to_string(),
            x.read_bytes.to_string(),
            x.write_bytes.to_string(),
            x.errors.to_string(),
            x.auth_succeeded.to_string(),
            x.auth_failed.to_string(),
            x.auth_rate_limited.to_string(),
            x.auth_busy.to_string(),
        ]);
    }
    out.push('\n');
    out.push_str(&ss.render());
    // A service from before the target's counters sends none: no table
    // rather than a table of zeros.
    if let Some(t) = &s.nvmf_target {
        out.push('\n');
        out.push_str(&nvmf_target(t));
    }
    let fc = s.flow_cache.unwrap_or_default();
    let mut f = Table::new(&["FLOW CACHE", "LOOKUPS", "HITS", "RESTS"]);
    f.row(vec![
        "all workers".into(),
        fc.lookups.to_string(),
        fc.hits.to_string(),
        fc.rests.to_string(),
    ]);
    out.push('\n');
    out.push_str(&f.render());
    out
}

/// The NVMe/TCP target's own counters, one row each.
fn nvmf_target(c: &pb::NvmfTargetCounters) -> String {
    let mut t = Table::new(&["NVME/TCP TARGET", "COUNT"]);
    let rows = [
        ("connections accepted", c.connections_accepted),
        ("connections open", c.open_connections),
        ("refused: max connections", c.refused_max_connections),
        (
            "refused: max connections per address",
            c.refused_max_connections_per_address,
        ),
        ("closed: handshake timeout", c.handshake_timeouts),
        ("closed: PDU timeout", c.pdu_timeouts),
        ("closed: write timeout", c.write_timeouts),
        ("protocol errors", c.protocol_errors),
        ("connects refused", c.connects_refused),
        ("keep-alive timeouts", c.keep_alive_timeouts),
        ("write buffer waits", c.write_buffer_waits),
        ("controllers revoked", c.controllers_revoked),
        ("idle timeouts", c.idle_timeouts),
        (
            "refused: max connections per host",
            c.refused_max_connections_per_host,
        ),
        (
            "endpoint buffers: reserved bytes",
            c.endpoint_buffer_reserved_bytes,
        ),
        (
            "endpoint buffers: shared bytes",
            c.endpoint_buffer_shared_bytes,
        ),
        ("TLS handshakes", c.tls_handshakes),
        ("TLS refused: unknown key", c.tls_refused_unknown_key),
        ("TLS refused: failed", c.tls_failed),
        ("TLS refused: timeout", c.tls_timeouts),
        ("TLS refused: busy", c.tls_busy),
        ("TLS refused: clear text", c.tls_clear_text_refused),
        ("connects refused: without TLS", c.connects_without_tls),
        (
            "connects refused: TLS identity mismatch",
            c.connects_identity_mismatch,
        ),
    ];
    for (what, n) in rows {
        t.row(vec![what.into(), n.to_string()]);
    }
    for (group, queues) in c.poll_group_queues.iter().enumerate() {
        t.row(vec![
            format!("poll group {group}: I/O queues"),
            queues.to_string(),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names() {
        assert_eq!(bytes(64 << 20), "64 MiB");
        assert_eq!(bytes(1000), "1000 B");
        assert_eq!(bytes(1536), "1536 B");
        assert_eq!(enum_name("RULE_ACTION_ALLOW", "RULE_ACTION_"), "allow");
        assert_eq!(id("tenants/a/rules/r"), "r");
    }

    /// A cluster's KEY column says whether one is set, and never prints
    /// a key, even from a service that sent one; an RBD namespace shows
    /// its cluster and image.
    #[test]
    fn clusters_show_no_key() {
        let c = pb::Cluster {
            name: "clusters/ceph1".into(),
            mon_host: "10.0.0.1:6789".into(),
            user: "dpu".into(),
            key: "AQCAmWZmQOIBABAAEBESExQVFhcYGRobHB0eHw==".into(),
            key_set: true,
            op_timeout_secs: 20,
            connect_timeout_secs: 10,
            namespace_count: 2,
            ..Default::default()
        };
        let out = clusters(&[c]);
        assert!(!out.contains("AQCAmW"), "{out}");
        let row = out.lines().nth(1).unwrap();
        for cell in ["ceph1", "10.0.0.1:6789", "dpu", "set", "20 s", "10 s", "2"] {
            assert!(row.contains(cell), "{cell}: {row}");
        }
        let n = pb::Namespace {
            nsid: 1,
            backend: Some(pb::namespace::Backend::Rbd(pb::RbdBackend {
                cluster_id: "ceph1".into(),
                pool: "rbd".into(),
                image: "vol1".into(),
            })),
            size_bytes: 1 << 30,
            state: pb::NamespaceState::Unreachable.into(),
            ..Default::default()
        };
        let out = namespaces(&[n]);
        assert!(
            out.contains("rbd:ceph1:rbd/vol1")
                && out.contains("1 GiB")
                && out.contains("unreachable"),
            "{out}"
        );
    }

    /// Volumes show their store, size, block size and the namespace made
    /// on them; namespaces on a volume or a null store say so.
    #[test]
    fn volumes_and_what_is_made_on_them() {
        let v = |name: &str, backend, size_bytes, namespace: &str| pb::Volume {
            name: name.into(),
            backend: Some(backend),
            block_size: 4096,
            uuid: format!("uuid-{}", id(name)),
            size_bytes,
            namespace: namespace.into(),
        };
        let out = volumes(&[
            v(
                "volumes/v1",
                pb::volume::Backend::Ram(pb::RamBackend {
                    size_bytes: 64 << 20,
                }),
                64 << 20,
                "subsystems/vol/namespaces/2",
            ),
            v(
                "volumes/v2",
                pb::volume::Backend::Null(pb::NullBackend {
                    size_bytes: 1 << 40,
                }),
                1 << 40,
                "",
            ),
            v(
                "volumes/v3",
                pb::volume::Backend::BlockDevice(pb::BlockDeviceBackend {
                    path: "/dev/nvme0n1".into(),
                }),
                0,
                "",
            ),
            v(
                "volumes/v4",
                pb::volume::Backend::File(pb::FileBackend {
                    path: "/srv/v4.img".into(),
                    size_bytes: 4096,
                }),
                4096,
                "",
            ),
        ]);
        let rows: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            [
                vec!["VOLUME", "BACKEND", "SIZE", "BLOCK", "NAMESPACE", "UUID"],
                vec![
                    "v1",
                    "ram",
                    "64",
                    "MiB",
                    "4096",
                    "subsystems/vol/namespaces/2",
                    "uuid-v1"
                ],
                vec!["v2", "null", "1", "TiB", "4096", "-", "uuid-v2"],
                vec!["v3", "bdev:/dev/nvme0n1", "-", "4096", "-", "uuid-v3"],
                vec!["v4", "file:/srv/v4.img", "4", "KiB", "4096", "-", "uuid-v4"],
            ],
            "{out}"
        );
        let n = |nsid, backend| pb::Namespace {
            nsid,
            backend: Some(backend),
            size_bytes: 1 << 20,
            ..Default::default()
        };
        let out = namespaces(&[
            n(1, pb::namespace::Backend::Volume("v1".into())),
            n(
                2,
                pb::namespace::Backend::Null(pb::NullBackend {
                    size_bytes: 1 << 20,
                }),
            ),
        ]);
        let backends: Vec<&str> = out
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().nth(1).unwrap())
            .collect();
        assert_eq!(backends, ["volume:v1", "null"], "{out}");
    }

    /// A remote namespace shows its paths, its subsystem and NSID, and
    /// how it is served; never a secret, even from a service that sent
    /// one.
    #[test]
    fn remote_namespaces_show_where_they_are() {
        let n = |nsid, state: pb::NamespaceState| pb::Namespace {
            nsid,
            backend: Some(pb::namespace::Backend::Remote(pb::RemoteBackend {
                paths: vec!["10.0.0.1:4420".into(), "[fd00::1]:4421".into()],
                subnqn: "nqn.2024-01.io.example:far".into(),
                nsid: 7,
                host_nqn: "nqn.2024-01.io.example:dpu".into(),
                dhchap_secret: "DHHC-1:00:c2VjcmV0:".into(),
                dhchap_secret_set: true,
                ..Default::default()
            })),
            size_bytes: 1 << 30,
            block_size: 4096,
            state: state.into(),
            ..Default::default()
        };
        let out = namespaces(&[
            n(1, pb::NamespaceState::Serving),
            n(2, pb::NamespaceState::NotServed),
            n(3, pb::NamespaceState::Unreachable),
        ]);
        assert!(!out.contains("c2VjcmV0"), "{out}");
        let rows: Vec<&str> = out.lines().skip(1).collect();
        for (row, state) in rows.iter().zip(["serving", "not served", "unreachable"]) {
            assert!(
                row.contains(
                    "remote 10.0.0.1:4420,[fd00::1]:4421 nqn.2024-01.io.example:far nsid 7"
                ) && row.contains("1 GiB")
                    && row.contains(state),
                "{state}: {row}"
            );
        }
    }

    /// The AUTH column: the requirement, then each host with a secret by
    /// its hash indicators; the secret text is never printed, even from a
    /// service that sent one.
    #[test]
    fn subsystem_auth_shows_hashes_only() {
        let s = pb::Subsystem {
            name: "subsystems/vol".into(),
            auth_requirement: pb::AuthRequirement::Required as i32,
            host_auth: vec![
                pb::HostAuth {
                    host_nqn: "nqn.h1".into(),
                    dhchap_secret: "DHHC-1:01:c2VjcmV0:".into(),
                    secret_set: true,
                    secret_hash: 1,
                    ctrl_secret_set: true,
                    ctrl_secret_hash: 2,
                    ..Default::default()
                },
                pb::HostAuth {
                    host_nqn: "nqn.h2".into(),
                    secret_set: true,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let out = subsystems(&[s]);
        assert!(
            out.contains("required nqn.h1=secret:01+ctrl:02 nqn.h2=secret:00"),
            "{out}"
        );
        assert!(!out.contains("c2VjcmV0"), "{out}");
        assert!(subsystems(&[pb::Subsystem::default()]).contains("hosts-with-secret"));
    }

    /// The TLS column: the requirement, then each host with a key by its
    /// hash; the key text is never printed, even from a service that
    /// sent one. Listeners show their secure channel.
    #[test]
    fn subsystem_tls_shows_hashes_only() {
        let s = pb::Subsystem {
            name: "subsystems/vol".into(),
            tls_requirement: pb::TlsRequirement::Required as i32,
            host_tls: vec![
                pb::HostTls {
                    host_nqn: "nqn.h1".into(),
                    psk: "NVMeTLSkey-1:01:c2VjcmV0:".into(),
                    psk_hash: 1,
                    v0_derivation: pb::TlsDerivation::Spec as i32,
                },
                pb::HostTls {
                    host_nqn: "nqn.h2".into(),
                    psk: String::new(),
                    psk_hash: 2,
                    v0_derivation: pb::TlsDerivation::Compat as i32,
                },
            ],
            ..Default::default()
        };
        let out = subsystems(&[s]);
        assert!(
            out.contains("required nqn.h1=psk:01 nqn.h2=psk:02/compat"),
            "{out}"
        );
        assert!(!out.contains("c2VjcmV0"), "{out}");
        assert!(subsystems(&[pb::Subsystem::default()]).contains("hosts-with-key"));
        let l = |c: pb::SecureChannel| pb::Listener {
            name: "subsystems/vol/listeners/l".into(),
            secure_channel: c as i32,
            ..Default::default()
        };
        let out = listeners(&[
            l(pb::SecureChannel::Required),
            l(pb::SecureChannel::Unspecified),
        ]);
        assert!(out.contains("SECURE CHANNEL"), "{out}");
        let rows: Vec<&str> = out.lines().skip(1).collect();
        assert!(rows[0].trim_end().ends_with("required"), "{out}");
        assert!(rows[1].trim_end().ends_with("none"), "{out}");
    }

    /// A namespace's QOS column and a subsystem's HOST QOS column show
    /// the limits as the flags that set them, `-` for none.
    #[test]
    fn qos_columns() {
        let n = |nsid, qos| pb::Namespace {
            nsid,
            backend: Some(pb::namespace::Backend::Ram(pb::RamBackend {
                size_bytes: 4096,
            })),
            size_bytes: 4096,
            uuid: format!("uuid-{nsid}"),
            qos,
            ..Default::default()
        };
        let out = namespaces(&[
            n(
                1,
                Some(pb::QosLimits {
                    iops: 1000,
                    read_bandwidth: 200 << 20,
                    ..Default::default()
                }),
            ),
            n(2, None),
        ]);
        let col = |row: &str, cells: &[&str]| {
            let got: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(got, cells, "{out}");
        };
        let lines: Vec<&str> = out.lines().collect();
        col(
            lines[0],
            &["NSID", "BACKEND", "SIZE", "BLOCK", "STATE", "QOS", "UUID"],
        );
        col(
            lines[1],
            &[
                "1",
                "ram",
                "4",
                "KiB",
                "0",
                "-",
                "iops=1000,read-bandwidth=200MiB/s",
                "uuid-1",
            ],
        );
        col(lines[2], &["2", "ram", "4", "KiB", "0", "-", "-", "uuid-2"]);
        let s = pb::Subsystem {
            name: "subsystems/vol".into(),
            host_qos: vec![pb::HostQos {
                host_nqn: "nqn.h1".into(),
                qos: Some(pb::QosLimits {
                    write_iops: 50,
                    ..Default::default()
                }),
            }],
            ..Default::default()
        };
        let out = subsystems(&[s]);
        assert!(out.lines().next().unwrap().ends_with("HOST QOS"), "{out}");
        assert!(
            out.lines()
                .nth(1)
                .unwrap()
                .ends_with("nqn.h1[write-iops=50]"),
            "{out}"
        );
        let t = |name: &str, storage_qos| pb::Tenant {
            name: name.into(),
            default_policy: pb::DefaultPolicy::Deny as i32,
            display_name: "Blue team".into(),
            storage_qos,
            ..Default::default()
        };
        let out = tenants(&[
            t(
                "tenants/blue",
                Some(pb::QosLimits {
                    iops: 5000,
                    write_bandwidth: 100 << 20,
                    ..Default::default()
                }),
            ),
            t("tenants/red", None),
        ]);
        let lines: Vec<&str> = out.lines().collect();
        col(
            lines[0],
            &[
                "TENANT",
                "POLICY",
                "VLAN",
                "RULES",
                "VERSION",
                "ATTACHMENTS",
                "STORAGE",
                "QOS",
                "DISPLAY",
                "NAME",
            ],
        );
        col(
            lines[1],
            &[
                "blue",
                "deny",
                "-",
                "0",
                "0",
                "-",
                "iops=5000,write-bandwidth=100MiB/s",
                "Blue",
                "team",
            ],
        );
        col(
            lines[2],
            &["red", "deny", "-", "0", "0", "-", "-", "Blue", "team"],
        );
        assert!(subsystems(&[pb::Subsystem::default()])
            .lines()
            .nth(1)
            .unwrap()
            .ends_with(" -"));
    }

    #[test]
    fn counters_end_with_the_flow_cache() {
        let s = pb::CounterSnapshot {
            flow_cache: Some(pb::FlowCacheCounters {
                lookups: 1200,
                hits: 1100,
                rests: 3,
            }),
            ..Default::default()
        };
        let text = counters(&s);
        let last = text.lines().last().unwrap();
        let cells: Vec<&str> = last.split_whitespace().collect();
        assert_eq!(cells, ["all", "workers", "1200", "1100", "3"], "{text}");
    }

    #[test]
    fn counters_show_the_nvmf_target() {
        let s = pb::CounterSnapshot {
            nvmf_target: Some(pb::NvmfTargetCounters {
                connections_accepted: 12,
                write_timeouts: 3,
                refused_max_connections_per_address: 4,
                poll_group_queues: vec![5, 0],
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = counters(&s);
        let row = |what: &str| {
            text.lines()
                .find(|l| l.starts_with(what))
                .map(|l| l[what.len()..].trim().to_string())
        };
        assert_eq!(row("connections accepted").as_deref(), Some("12"), "{text}");
        assert_eq!(row("closed: write timeout").as_deref(), Some("3"));
        assert_eq!(
            row("refused: max connections per address").as_deref(),
            Some("4")
        );
        assert_eq!(row("poll group 0: I/O queues").as_deref(), Some("5"));
        assert_eq!(row("poll group 1: I/O queues").as_deref(), Some("0"));
    }

    #[test]
    fn rule_rows() {
        let r = pb::FilterRule {
            name: "tenants/a/rules/web".into(),
            priority: 10,
            dst_prefix: "10.0.0.0/8".into(),
            dst_ports: Some(pb::PortRange {
                first: 80,
                last: 443,
            }),
            ip_protocol: Some(6),
            action: pb::RuleAction::Allow as i32,
            stateful: true,
            ..Default::default()
        };
        let text = rules(&[r]);
        let row = text.lines().nth(1).unwrap();
        for want in ["10", "web", "allow", "tcp", "10.0.0.0/8", "80-443", "yes"] {
            assert!(row.contains(want), "{row}");
        }
    }
}
