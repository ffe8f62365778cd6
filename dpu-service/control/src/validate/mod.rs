//! Request validation: turns `dpu.v1` messages into domain values, or into
//! an `INVALID_ARGUMENT` error that names the offending field.
//!
//! Only syntax and ranges are checked here. Checks against the current
//! state (does the port exist, is the priority taken) belong to
//! [`crate::state`], which sees the whole state. One exception looks at
//! the filesystem: [`backing`] checks a namespace's file or device against
//! the service's backing policy.
//!
//! What both halves share lives here: IDs, resource names and free text.
//! The network side (tenants, attachments, filter rules) is in `network`,
//! the storage side (subsystems, namespaces, volumes, listeners) in `storage`, the
//! storage clusters (monitors, cephx users and keys, pool and image names)
//! in `cluster`, the remote namespaces that back namespaces (paths, NQNs,
//! secrets, bounds) in `remote`, the QoS limits of namespaces and hosts
//! in `qos`; all are re-exported here, so every check is `validate::...`.

mod backing;
mod cluster;
mod network;
mod qos;
mod remote;
mod storage;

pub use backing::{backing, resize as backing_resize, store as backing_store};
pub use cluster::{
    ceph_user, cephx_key, cluster, cluster_name, mon_host, rbd_name, timeout,
    DEFAULT_CONNECT_TIMEOUT_SECS, DEFAULT_OP_TIMEOUT_SECS, MAX_CLUSTERS, MAX_MONITORS,
    MAX_MON_HOST_LEN, MAX_RBD_NAME_LEN, MAX_TIMEOUT_SECS, MAX_USER_LEN,
};

pub use network::{
    attachment, attachments, default_policy, is_unicast_v4, replace_rules, rule, rule_name, vlan,
    KeptRules, MAX_ATTACHMENTS_PER_TENANT, MAX_GUARD_ENTRIES, MAX_RATE_BPS, MAX_RATE_PPS,
    MAX_REMOTE_VTEPS, MAX_RULES_PER_TENANT,
};
pub use qos::{qos, MAX_QOS_BANDWIDTH, MAX_QOS_IOPS};
pub use remote::{
    remote, remote_nqn, MAX_REMOTE_QUEUE_DEPTH, MAX_REMOTE_TIMEOUT_MS, MIN_REMOTE_QUEUE_DEPTH,
};
pub use storage::{
    ascii_id, auth_requirement, eui64, hex16, host_auth, host_tls, listener, listener_name,
    max_namespaces, namespace, namespace_name, nqn, nsid, secure_channel, tls_requirement, uuid,
    volume, volume_id, volume_name, volume_ref, DEFAULT_MAX_NAMESPACES, DEFAULT_NVME_TCP_PORT,
    DISCOVERY_NQN, MAX_HOSTS_PER_SUBSYSTEM, MAX_NAMESPACES, MAX_NQN_LEN,
};

use crate::error::{ControlError, Result};

/// Longest accepted display name or description, in bytes.
pub const MAX_TEXT_LEN: usize = 256;

/// Checks a resource ID: 1..=63 characters of `[a-z0-9-]`, starting with a
/// letter and not ending with `-`.
pub fn id(field: &str, id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 63
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && !id.ends_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ControlError::invalid(
            field,
            format!(
                "{id:?} is not a valid ID: use 1 to 63 characters of a-z, 0-9 and '-', \
                 starting with a letter and not ending with '-'"
            ),
        ))
    }
}

/// Parses `"{collection}/{id}"` and returns the ID.
pub fn name<'a>(field: &str, name: &'a str, collection: &str) -> Result<&'a str> {
    match name.split_once('/') {
        Some((c, rest)) if c == collection && !rest.contains('/') => {
            id(field, rest)?;
            Ok(rest)
        }
        _ => Err(ControlError::invalid(
            field,
            format!("expected \"{collection}/{{id}}\", got {name:?}"),
        )),
    }
}

/// Parses `"{collection}/{parent}/{child_collection}/{child}"`.
pub fn child_name<'a>(
    field: &str,
    name: &'a str,
    collection: &str,
    child_collection: &str,
) -> Result<(&'a str, &'a str)> {
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        [c, parent, cc, child] if *c == collection && *cc == child_collection => {
            Ok((parent, child))
        }
        _ => Err(ControlError::invalid(
            field,
            format!("expected \"{collection}/{{id}}/{child_collection}/{{id}}\", got {name:?}"),
        )),
    }
}

/// Checks free text: at most [`MAX_TEXT_LEN`] bytes, no control characters.
pub fn text(field: &str, s: &str) -> Result<()> {
    if s.len() > MAX_TEXT_LEN {
        return Err(ControlError::invalid(
            field,
            format!("{} bytes, at most {MAX_TEXT_LEN} allowed", s.len()),
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(ControlError::invalid(
            field,
            "control characters are not allowed",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn field_of(e: ControlError) -> String {
        match e {
            ControlError::InvalidArgument { field, .. } => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn ids() {
        for good in ["a", "t1", "tenant-a", "a-b-c", &"a".repeat(63)] {
            id("x", good).unwrap();
        }
        for bad in [
            "",
            "1a",
            "-a",
            "a-",
            "A",
            "a_b",
            "a b",
            "é",
            &"a".repeat(64),
        ] {
            assert!(id("x", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn names() {
        assert_eq!(name("n", "tenants/t1", "tenants").unwrap(), "t1");
        assert!(name("n", "tenants/t1/x", "tenants").is_err());
        assert!(name("n", "ports/t1", "tenants").is_err());
        assert!(name("n", "t1", "tenants").is_err());
        assert_eq!(rule_name("n", "tenants/a/rules/r1").unwrap(), ("a", "r1"));
        assert!(rule_name("n", "tenants/a/rules/").is_err());
        assert_eq!(
            namespace_name("n", "subsystems/s/namespaces/7").unwrap(),
            ("s", 7)
        );
        for bad in [
            "subsystems/s/namespaces/0",
            "subsystems/s/namespaces/07",
            "subsystems/s/namespaces/x",
            "subsystems/s/namespaces/1025",
        ] {
            assert!(namespace_name("n", bad).is_err(), "{bad}");
        }
        assert_eq!(
            listener_name("n", "subsystems/s/listeners/l").unwrap(),
            ("s", "l")
        );
    }
}
