//! Storage-side domain types: NVM subsystems, their namespaces with
//! backends, and their listeners.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use dpu_nvmeof::auth::controller::HostKeys;
use dpu_nvmeof::auth::{DhGroup, HashId, Secret, SecretError};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::qos::{self, QosLimits};
use super::{MacAddr, PskText, RemoteNamespace, SecureChannel, Timestamp, TlsRequirement};

/// Where a namespace's blocks live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Backend {
    /// Memory of the given size.
    Ram {
        /// Size in bytes.
        size_bytes: u64,
    },
    /// A regular file beneath a directory of `storage.file_dirs`.
    File {
        /// Absolute path.
        path: String,
        /// Size in bytes; 0 takes the size of the existing file.
        size_bytes: u64,
        /// The file did not exist and the service creates it, with
        /// `size_bytes`. Only such a file may be made smaller: one that
        /// existed (and a state written before this flag, which reads as
        /// false) is never truncated.
        #[serde(default)]
        created: bool,
    },
    /// A block device, size taken from the device.
    BlockDevice {
        /// Absolute path.
        path: String,
    },
    /// An RBD image of a storage cluster, size taken from the image.
    Rbd {
        /// The cluster's ID, one of the state's clusters.
        cluster: String,
        /// The image's pool.
        pool: String,
        /// The image's name.
        image: String,
    },
    /// A namespace of a remote NVMe/TCP target, size taken from it.
    Remote(RemoteNamespace),
    /// A null store of the given size: reads return zeros, writes are
    /// dropped.
    Null {
        /// Size in bytes.
        size_bytes: u64,
    },
    /// A volume of the state ([`super::Volume`]), which no other
    /// namespace is made on; only a namespace's backend is one.
    Volume {
        /// The volume's ID.
        id: String,
    },
}

impl Backend {
    /// Whether the namespace's size is its store's own, known only to
    /// what opens it (a block device, an RBD image, a remote namespace,
    /// a volume's store), not the state.
    pub fn sized_by_store(&self) -> bool {
        matches!(
            self,
            Backend::BlockDevice { .. }
                | Backend::Rbd { .. }
                | Backend::Remote(_)
                | Backend::Volume { .. }
        )
    }
}

/// A namespace of a subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    /// Namespace ID, 1..=max_namespaces.
    pub nsid: u32,
    /// Backend.
    pub backend: Backend,
    /// Logical block size, 512 or 4096.
    pub block_size: u32,
    /// Namespace UUID.
    pub uuid: [u8; 16],
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// An ID besides the NSID (the syntax of a tenant ID), unique within
    /// the subsystem; empty for none (and in a state written before it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace_id: String,
    /// IEEE Extended Unique Identifier, if it has one (none in a state
    /// written before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eui64: Option<[u8; 8]>,
    /// Limits on the namespace's I/O, all hosts together (none in a
    /// state written before them).
    #[serde(
        default,
        skip_serializing_if = "QosLimits::is_none",
        with = "qos::limits"
    )]
    pub qos: QosLimits,
}

/// NVMe-oF transport of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// NVMe/TCP.
    Tcp,
}

/// A transport address a subsystem accepts connections on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listener {
    /// Listener ID, unique within the subsystem.
    pub id: String,
    /// Transport.
    pub transport: Transport,
    /// Address to listen on.
    pub address: IpAddr,
    /// TCP port.
    pub port: u16,
    /// The tenant whose network this listener is a storage endpoint in;
    /// `None` for a listener on the service's own kernel sockets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The endpoint's MAC address, assigned by the state when the listener
    /// is created (shared by every listener of the same tenant and
    /// address); `None` without a tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
    /// Whether the listener speaks TLS; the same as every other
    /// listener's on its address and port, and none on a storage
    /// endpoint (none in a state written before it).
    #[serde(default, skip_serializing_if = "SecureChannel::is_none")]
    pub secure_channel: SecureChannel,
}

impl Listener {
    /// The storage endpoint this listener is on, as (tenant, address), or
    /// `None` for a kernel-socket listener.
    pub fn endpoint(&self) -> Option<(&str, IpAddr)> {
        Some((self.tenant.as_deref()?, self.address))
    }
}

/// Whether hosts must authenticate (DH-HMAC-CHAP) to a subsystem.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthRequirement {
    /// A host with a secret must authenticate; one without need not.
    #[default]
    HostsWithSecret,
    /// Every host must authenticate.
    Required,
    /// No host authenticates.
    Disabled,
}

impl AuthRequirement {
    /// What [`dpu_nvmeof::Target::set_auth_required`] takes for it.
    pub fn target_policy(self) -> Option<bool> {
        match self {
            Self::HostsWithSecret => None,
            Self::Required => Some(true),
            Self::Disabled => Some(false),
        }
    }
}

/// A DH-HMAC-CHAP secret in its `DHHC-1:` text form, checked by
/// [`Secret::parse`] before it is stored. Its `Debug` shows no key, and
/// the text is wiped when dropped; only the state file (mode 0600) holds
/// it, never a response, the log or a metric.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretText(Zeroizing<String>);

impl SecretText {
    /// Parses `text` and keeps it with what it parsed to.
    ///
    /// # Errors
    /// As [`Secret::parse`]; the error never carries key bytes.
    pub fn parse(text: &str) -> Result<(Self, Secret), SecretError> {
        let secret = Secret::parse(text)?;
        Ok((Self(Zeroizing::new(text.trim().to_string())), secret))
    }

    /// The parsed secret.
    ///
    /// # Errors
    /// As [`Secret::parse`]: only for a state file edited by hand.
    pub fn secret(&self) -> Result<Secret, SecretError> {
        Secret::parse(&self.0)
    }

    /// The hash indicator (0 to 3) of the secret.
    pub fn hash_indicator(&self) -> u8 {
        self.secret().map_or(0, |s| s.hash_indicator())
    }

    /// The text, for the one who authenticates with it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretText(<{} hidden bytes>)", self.0.len())
    }
}

/// The DH-HMAC-CHAP settings of one allowed host of a subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostAuth {
    /// The host's secret.
    pub secret: SecretText,
    /// The controller's secret, for bidirectional authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctrl_secret: Option<SecretText>,
    /// Hash functions allowed, by name, most preferred first; empty: all.
    #[serde(default)]
    pub hashes: Vec<String>,
    /// DH groups allowed, by name, most preferred first; empty: all.
    #[serde(default)]
    pub dh_groups: Vec<String>,
}

impl HostAuth {
    /// The keys the NVMe-oF target authenticates the host with.
    ///
    /// # Errors
    /// A secret, hash or DH group that does not parse: only for a state
    /// file edited by hand, since requests are checked before they are
    /// stored.
    pub fn host_keys(&self) -> Result<HostKeys, String> {
        let secret = self.secret.secret().map_err(|e| format!("secret: {e}"))?;
        let ctrl = match &self.ctrl_secret {
            Some(c) => Some(c.secret().map_err(|e| format!("ctrl_secret: {e}"))?),
            None => None,
        };
        let mut keys = HostKeys::new(secret, ctrl);
        if !self.hashes.is_empty() {
            keys.hashes = self
                .hashes
                .iter()
                .map(|n| hash_by_name(n).ok_or_else(|| format!("unknown hash {n:?}")))
                .collect::<Result<_, _>>()?;
        }
        if !self.dh_groups.is_empty() {
            keys.dh_groups = self
                .dh_groups
                .iter()
                .map(|n| dh_group_by_name(n).ok_or_else(|| format!("unknown DH group {n:?}")))
                .collect::<Result<_, _>>()?;
        }
        Ok(keys)
    }
}

/// The hash function called `name` ("sha256", "sha384", "sha512").
pub fn hash_by_name(name: &str) -> Option<HashId> {
    HashId::ALL.into_iter().find(|h| h.name() == name)
}

/// The DH group called `name` ("null", "ffdhe2048" .. "ffdhe8192").
pub fn dh_group_by_name(name: &str) -> Option<DhGroup> {
    DhGroup::ALL.into_iter().find(|g| g.name() == name)
}

/// An NVM subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subsystem {
    /// Subsystem ID.
    pub id: String,
    /// NVMe Qualified Name, unique across subsystems.
    pub nqn: String,
    /// Serial number, 1..=20 printable ASCII characters.
    pub serial_number: String,
    /// Model number, 1..=40 printable ASCII characters.
    pub model_number: String,
    /// Any host may connect.
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect.
    pub allowed_hosts: BTreeSet<String>,
    /// Largest namespace ID accepted.
    pub max_namespaces: u32,
    /// When the subsystem was created.
    pub create_time: Timestamp,
    /// Namespaces by NSID.
    pub namespaces: BTreeMap<u32, Namespace>,
    /// Listeners by ID.
    pub listeners: BTreeMap<String, Listener>,
    /// Whether hosts must authenticate.
    #[serde(default)]
    pub auth_requirement: AuthRequirement,
    /// DH-HMAC-CHAP settings by host NQN, each of a host in
    /// `allowed_hosts`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_auth: BTreeMap<String, HostAuth>,
    /// QoS limits by host NQN, each of a host the subsystem allows
    /// ([`Subsystem::allows_host`]), none all zero; at most
    /// [`crate::validate::MAX_HOSTS_PER_SUBSYSTEM`] of them (none in a
    /// state written before them).
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        with = "qos::by_host"
    )]
    pub host_qos: BTreeMap<String, QosLimits>,
    /// Whether hosts must connect over TLS.
    #[serde(default, skip_serializing_if = "is_default")]
    pub tls_requirement: TlsRequirement,
    /// TLS PSKs by host NQN, each of a host the subsystem allows
    /// ([`Subsystem::allows_host`]); at most
    /// [`crate::validate::MAX_HOSTS_PER_SUBSYSTEM`] of them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_tls: BTreeMap<String, PskText>,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

impl Subsystem {
    /// The tenant whose network serves this subsystem, or `None` for one
    /// served on the service's own sockets. A subsystem is served in one
    /// place: every listener of it names the same tenant, or none does
    /// (`State::create_listener` refuses the rest). Of a state file that
    /// holds both, the first tenant by name serves it.
    pub fn serving_tenant(&self) -> Option<&str> {
        self.listeners
            .values()
            .filter_map(|l| l.tenant.as_deref())
            .min()
    }

    /// Why a new listener in `tenant`'s network (`None`: on the service's
    /// own `address`) cannot join this subsystem's listeners, or `None`
    /// if it can: a subsystem is served in one place.
    pub fn serving_conflict(&self, tenant: Option<&str>, address: IpAddr) -> Option<String> {
        if self.listeners.is_empty() {
            return None;
        }
        let serving = self.serving_tenant();
        (serving != tenant).then(|| self.conflict(serving, tenant, address))
    }

    /// The first listener of this subsystem that is not where the
    /// subsystem is served, and why: `None` when it is served in one
    /// place, as the state allows.
    pub fn misplaced_listener(&self) -> Option<(&Listener, String)> {
        self.listeners
            .values()
            .find_map(|l| Some((l, self.listener_conflict(l)?)))
    }

    /// Why listener `l` of this subsystem is not where the subsystem is
    /// served, or `None` if it is.
    pub fn listener_conflict(&self, l: &Listener) -> Option<String> {
        let serving = self.serving_tenant();
        let tenant = l.tenant.as_deref();
        (tenant != serving).then(|| self.conflict(serving, tenant, l.address))
    }

    fn conflict(&self, serving: Option<&str>, tenant: Option<&str>, address: IpAddr) -> String {
        let served = match serving {
            Some(t) => format!("in tenant {t}'s network"),
            None => "on the service's own addresses".to_string(),
        };
        let also = match tenant {
            Some(t) => format!("in tenant {t}'s"),
            None => format!("on the service's own address {address}"),
        };
        format!(
            "subsystem {} is served {served}; it cannot also listen {also}",
            self.id
        )
    }

    /// True if `host_nqn` may connect to this subsystem.
    pub fn allows_host(&self, host_nqn: &str) -> bool {
        self.allow_any_host || self.allowed_hosts.contains(host_nqn)
    }
}

/// The resource name of namespace `nsid` of subsystem `sid`.
pub fn namespace_name(sid: &str, nsid: u32) -> String {
    format!("subsystems/{sid}/namespaces/{nsid}")
}

/// The resource name of listener `lid` of subsystem `sid`.
pub fn listener_name(sid: &str, lid: &str) -> String {
    format!("subsystems/{sid}/listeners/{lid}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A namespace stored before it had an ID or an EUI-64 reads with
    /// neither, and one without them is stored as it was.
    #[test]
    fn a_namespace_without_id_or_eui64_reads_and_writes_as_before() {
        let old = r#"{"nsid":3,"backend":{"kind":"ram","size_bytes":4096},"block_size":512,
            "uuid":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"nguid":[2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2]}"#;
        let n: Namespace = serde_json::from_str(old).unwrap();
        assert_eq!((n.nsid, n.namespace_id.as_str(), n.eui64), (3, "", None));
        let text = serde_json::to_string(&n).unwrap();
        assert!(
            !text.contains("namespace_id") && !text.contains("eui64"),
            "{text}"
        );
        let named = Namespace {
            namespace_id: "opi-ns".into(),
            eui64: Some([0x1b, 0x4e, 0x28, 0xba, 0x2f, 0xa1, 0x11, 0xd2]),
            ..n
        };
        let text = serde_json::to_string(&named).unwrap();
        assert_eq!(serde_json::from_str::<Namespace>(&text).unwrap(), named);
    }
}
