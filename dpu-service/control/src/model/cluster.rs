//! Storage clusters: the Ceph clusters whose RBD images back namespaces
//! ([`super::Backend::Rbd`]), registered once and named by ID.

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::Timestamp;

/// A cephx key in its base64 text form, checked by
/// [`crate::validate::cephx_key`] before it is stored. Kept as a
/// DH-HMAC-CHAP secret is ([`super::SecretText`]): its `Debug` shows no
/// key, the text is wiped when dropped, and only the state file (mode
/// 0600) holds it, never a response, the log or a metric.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CephKey(Zeroizing<String>);

impl CephKey {
    /// Keeps `text`, which the caller has checked.
    pub(crate) fn new(text: &str) -> Self {
        Self(Zeroizing::new(text.to_string()))
    }

    /// The key, for the one who connects with it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for CephKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CephKey(<{} hidden bytes>)", self.0.len())
    }
}

/// A storage cluster: how to reach a Ceph cluster and as whom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cluster {
    /// Cluster ID, as in `clusters/{id}`.
    pub id: String,
    /// Monitor addresses as Ceph's `mon_host` takes them.
    pub mon_host: String,
    /// The cephx user, without `client.`.
    pub user: String,
    /// The user's cephx key; `None` for a cluster without cephx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<CephKey>,
    /// Bound on each I/O to the cluster, seconds.
    pub op_timeout_secs: u32,
    /// Bound on connecting and on each request to a monitor, seconds.
    pub connect_timeout_secs: u32,
    /// When the cluster was registered.
    pub create_time: Timestamp,
}

impl Cluster {
    /// Bound on each I/O to the cluster.
    pub fn op_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(self.op_timeout_secs))
    }

    /// Bound on connecting and on each request to a monitor.
    pub fn connect_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(self.connect_timeout_secs))
    }
}

/// The resource name of cluster `id`.
pub fn cluster_name(id: &str) -> String {
    format!("clusters/{id}")
}
