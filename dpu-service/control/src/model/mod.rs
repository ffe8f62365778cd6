//! The validated domain model: what the service has accepted and persisted.
//!
//! Values of these types are only built by [`crate::validate`] (from
//! requests) or read back from the state file, so code that consumes them
//! (the data plane, the NVMe-oF target) can trust every field: IDs are well
//! formed, prefixes have no host bits, port ranges are ordered, rule
//! priorities are unique and sorted.
//!
//! [`Timestamp`] and [`State`], which both sides use, live here; the
//! network side (prefixes, attachments, tenants, rules, ports) is in
//! `network`, the storage side (subsystems, namespaces, listeners) in
//! `storage`; both are re-exported here, so every type is `model::...`.

mod claims;
mod network;
mod storage;

pub use claims::Claims;

pub use network::{
    Action, Attachment, IpPrefix, MacAddr, PortRange, PortRole, PortSpec, PrefixError, RateLimit,
    Rule, RuleSet, SourceGuard, Tenant,
};
pub use storage::{
    dh_group_by_name, hash_by_name, AuthRequirement, Backend, HostAuth, Listener, Namespace,
    SecretText, Subsystem, Transport,
};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Wall-clock time as seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub struct Timestamp {
    /// Whole seconds since 1970-01-01T00:00:00Z.
    pub secs: i64,
    /// Nanoseconds within the second, 0..1e9.
    pub nanos: u32,
}

impl Timestamp {
    /// The current wall-clock time.
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Self {
            secs: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: d.subsec_nanos(),
        }
    }
}

/// Everything the service has accepted: the content of the state file.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct State {
    /// Tenants by ID.
    pub tenants: BTreeMap<String, Tenant>,
    /// Subsystems by ID.
    pub subsystems: BTreeMap<String, Subsystem>,
    /// Counter for service-assigned IDs; never reused.
    pub id_seq: u64,
}
