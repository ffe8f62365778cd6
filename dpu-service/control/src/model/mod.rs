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
//! `storage`, the storage clusters RBD namespaces live on in `cluster`,
//! the remote NVMe/TCP namespaces that back namespaces in `remote`, the
//! QoS limits of namespaces, hosts and tenants' storage in `qos`, the
//! secure channel's settings and keys in `tls`, the volumes namespaces
//! are made on in `volume`, the remote NVMe/TCP subsystems namespaces
//! are made from by name in `remote_controller`; all are re-exported
//! here, so every type is `model::...`.

mod claims;
mod cluster;
mod index;
mod network;
mod qos;
mod remote;
mod remote_controller;
mod storage;
mod tls;
mod volume;

pub use claims::Claims;
pub use cluster::{cluster_name, CephKey, Cluster};
pub use index::Index;
/// `#[serde(with)]` for [`QosLimits`] in the state file's form.
pub(crate) use qos::limits as stored_qos;
pub use qos::QosLimits;
pub use remote::RemoteNamespace;
pub use remote_controller::{
    remote_controller_name, RemoteController, RemotePath, MAX_CONTROLLER_PATHS,
    MAX_REMOTE_CONTROLLERS,
};

pub use network::{
    Action, Attachment, IpPrefix, MacAddr, PortRange, PortRole, PortSpec, PrefixError, RateLimit,
    Rule, RuleSet, SourceGuard, Tenant,
};
pub use storage::{
    dh_group_by_name, hash_by_name, listener_name, namespace_name, AuthRequirement, Backend,
    HostAuth, Listener, Namespace, SecretText, Subsystem, Transport,
};
pub use tls::{PskText, SecureChannel, TlsDerivation, TlsRequirement};
pub use volume::{volume_name, Volume};

use serde::{Deserialize, Serialize};

/// The ordered map of the state's tenants and subsystems, and of its
/// index: persistent, so that copying a state (as the store does for
/// every change, to leave the published one untouched until the change
/// is durable) shares every node the change does not touch, and costs
/// nothing until the copy is changed, and then a path of the tree.
pub type Map<K, V> = imbl::OrdMap<K, V>;

/// The ordered set counterpart of [`Map`].
pub type Set<T> = imbl::OrdSet<T>;

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
///
/// Besides what is stored, a state carries an index of it that its
/// checks look up ([`Index`]): the transitions of
/// [`crate::state`] keep it up to date, reading a state back builds it,
/// and code that changes `tenants`, `subsystems` or `clusters` directly
/// calls [`State::reindex`] afterwards. States compare by what is stored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(from = "Stored")]
pub struct State {
    /// Tenants by ID.
    pub tenants: Map<String, Tenant>,
    /// Subsystems by ID.
    pub subsystems: Map<String, Subsystem>,
    /// Storage clusters by ID (absent from states written before them).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub clusters: Map<String, Cluster>,
    /// Volumes by ID (absent from states written before them).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub volumes: Map<String, Volume>,
    /// Remote controllers by ID (absent from states written before them).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub remote_controllers: Map<String, RemoteController>,
    /// Counter for service-assigned IDs; never reused.
    pub id_seq: u64,
    /// Derived from the above; never stored.
    #[serde(skip)]
    pub(crate) index: Index,
}

impl PartialEq for State {
    fn eq(&self, other: &Self) -> bool {
        self.tenants == other.tenants
            && self.subsystems == other.subsystems
            && self.clusters == other.clusters
            && self.volumes == other.volumes
            && self.remote_controllers == other.remote_controllers
            && self.id_seq == other.id_seq
    }
}

impl Eq for State {}

/// A [`State`] as stored, before its index is built.
#[derive(Deserialize)]
struct Stored {
    tenants: Map<String, Tenant>,
    subsystems: Map<String, Subsystem>,
    #[serde(default)]
    clusters: Map<String, Cluster>,
    #[serde(default)]
    volumes: Map<String, Volume>,
    #[serde(default)]
    remote_controllers: Map<String, RemoteController>,
    id_seq: u64,
}

impl From<Stored> for State {
    fn from(s: Stored) -> State {
        let mut state = State {
            tenants: s.tenants,
            subsystems: s.subsystems,
            clusters: s.clusters,
            volumes: s.volumes,
            remote_controllers: s.remote_controllers,
            id_seq: s.id_seq,
            index: Default::default(),
        };
        state.reindex();
        state
    }
}
