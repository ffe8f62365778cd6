//! What the target is told to serve: subsystems, their namespaces and
//! where each namespace's blocks live.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dpu_os::backing::{BackingPolicy, Identity, OpenHow};

use crate::backend::{Backend, FileBackend, NullBackend, RamBackend};
use crate::qos::QosLimits;

/// The target's connections to storage clusters (feature `rbd`).
#[cfg(feature = "rbd")]
pub(crate) use crate::backend::rbd::Clusters;

/// Without the `rbd` feature there are no connections to clusters.
#[cfg(not(feature = "rbd"))]
#[derive(Debug, Default)]
pub(crate) struct Clusters;

#[cfg(not(feature = "rbd"))]
impl Clusters {
    pub(crate) fn retain(&self, _used: &[&str]) {}
}

/// A Ceph cluster as the target connects to it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RbdCluster {
    /// The cluster's name in the service's configuration, for errors.
    pub name: String,
    /// Monitor addresses, as Ceph's `mon_host` takes them.
    pub mon_host: String,
    /// The cephx user, without `client.`.
    pub user: String,
    /// The user's cephx key (base64); `None` for a cluster without cephx.
    pub key: Option<String>,
    /// Bound on each I/O: one the cluster does not finish in time fails
    /// (and the host sees Namespace Not Ready, which it retries).
    pub op_timeout: Duration,
    /// Bound on connecting and on each request to a monitor.
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for RbdCluster {
    /// The key is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdCluster")
            .field("name", &self.name)
            .field("mon_host", &self.mon_host)
            .field("user", &self.user)
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// Most paths to one remote namespace.
pub const MAX_REMOTE_PATHS: usize = 4;

/// A namespace of another NVMe/TCP controller, as the target reaches it:
/// through an initiator of its own, one controller at a time on the first
/// path that answers.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteNamespace {
    /// Transport addresses of the remote subsystem, in order of
    /// preference (1 ..= [`MAX_REMOTE_PATHS`]): the first that answers
    /// serves; when it fails, the next takes over.
    pub paths: Vec<SocketAddr>,
    /// The remote subsystem's NQN.
    pub subnqn: String,
    /// The namespace's ID there.
    pub nsid: u32,
    /// The NQN the target connects with (the remote's allow list names it).
    pub host_nqn: String,
    /// The host identifier sent in Connect.
    pub host_id: [u8; 16],
    /// The DH-HMAC-CHAP secret (`DHHC-1:..`) for a remote that requires
    /// authentication; never printed.
    pub dhchap_secret: Option<String>,
    /// Bound on each command: one the remote does not complete in time
    /// takes its connection down (its commands fail as Namespace Not
    /// Ready, which hosts retry) and the connection is made again.
    pub io_timeout: Duration,
    /// Bound on bringing up a connection on one path.
    pub connect_timeout: Duration,
    /// Most commands in flight to the remote at once (its I/O queue's
    /// entries less one); more wait in their hosts' connections.
    pub queue_depth: u16,
}

impl RemoteNamespace {
    /// `subnqn`'s namespace `nsid` at `paths`, reached as `host_nqn`, with
    /// a 10-second I/O timeout, a 3-second connect timeout and 128
    /// commands in flight.
    pub fn new(paths: Vec<SocketAddr>, subnqn: &str, nsid: u32, host_nqn: &str) -> Self {
        Self {
            paths,
            subnqn: subnqn.to_owned(),
            nsid,
            host_nqn: host_nqn.to_owned(),
            host_id: host_id_of(host_nqn),
            dhchap_secret: None,
            io_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            queue_depth: 128,
        }
    }

    /// Checks what can be checked without the remote: paths, NQNs, NSID,
    /// secret, timeouts and queue depth.
    ///
    /// # Errors
    /// A sentence naming what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.paths.is_empty() || self.paths.len() > MAX_REMOTE_PATHS {
            return Err(format!(
                "a remote namespace has 1 to {MAX_REMOTE_PATHS} paths, not {}",
                self.paths.len()
            ));
        }
        for (i, p) in self.paths.iter().enumerate() {
            if p.port() == 0 || p.ip().is_unspecified() {
                return Err(format!("remote path {p} is not an address to connect to"));
            }
            if self.paths[..i].contains(p) {
                return Err(format!("remote path {p} is given twice"));
            }
        }
        for (what, nqn) in [("remote NQN", &self.subnqn), ("host NQN", &self.host_nqn)] {
            if nqn.is_empty() || nqn.len() > 223 || !nqn.is_ascii() {
                return Err(format!("{what} must be 1 to 223 ASCII characters"));
            }
        }
        if self.nsid == 0 || self.nsid == u32::MAX {
            return Err(format!("remote NSID {} is not a namespace", self.nsid));
        }
        if let Some(s) = &self.dhchap_secret {
            crate::auth::Secret::parse(s)
                .map_err(|e| format!("remote DH-HMAC-CHAP secret: {e}"))?;
        }
        if self.io_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err("remote timeouts must be above zero".into());
        }
        if !(2..=1024).contains(&self.queue_depth) {
            return Err(format!(
                "remote queue depth {} is outside 2..=1024",
                self.queue_depth
            ));
        }
        Ok(())
    }
}

/// A host identifier that stays the same for the same host NQN: its
/// UUID when it is a `nqn.2014-08.org.nvmexpress:uuid:` NQN, else bytes of
/// its SHA-256.
pub fn host_id_of(host_nqn: &str) -> [u8; 16] {
    use sha2::Digest;
    let mut id = [0u8; 16];
    if let Some(uuid) = host_nqn.strip_prefix("nqn.2014-08.org.nvmexpress:uuid:") {
        let hex: String = uuid.chars().filter(|c| *c != '-').collect();
        if hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit()) {
            for (i, b) in id.iter_mut().enumerate() {
                *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0);
            }
            return id;
        }
    }
    id.copy_from_slice(&sha2::Sha256::digest(host_nqn.as_bytes())[..16]);
    id
}

impl std::fmt::Debug for RemoteNamespace {
    /// The secret is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteNamespace")
            .field("paths", &self.paths)
            .field("subnqn", &self.subnqn)
            .field("nsid", &self.nsid)
            .field("host_nqn", &self.host_nqn)
            .field(
                "dhchap_secret",
                &self.dhchap_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("io_timeout", &self.io_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("queue_depth", &self.queue_depth)
            .finish()
    }
}

/// Where a namespace's blocks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSpec {
    /// Memory of `size` bytes (allocated as written).
    Ram {
        /// Size in bytes.
        size: u64,
    },
    /// A regular file beneath a directory the target's
    /// [`BackingPolicy`] allows.
    File {
        /// Path of the file.
        path: PathBuf,
        /// Size in bytes; 0 takes the file's own size. A smaller file is
        /// grown to it.
        size: u64,
        /// The service creates the file (it is created with `size`
        /// bytes if missing) and may make it smaller. Without it, the
        /// file must exist and is never made smaller: its size is at
        /// least `size`.
        created: bool,
    },
    /// A block device the target's [`BackingPolicy`] allows, opened
    /// exclusively; its size is the device's.
    BlockDevice {
        /// Path of the device node.
        path: PathBuf,
    },
    /// Reads return zeros, writes vanish (benchmarks).
    Null {
        /// Size in bytes.
        size: u64,
    },
    /// An RBD image of a Ceph cluster; its size is the image's, and
    /// follows it when another client resizes it. Needs the `rbd` feature.
    Rbd {
        /// The cluster.
        cluster: RbdCluster,
        /// The pool.
        pool: String,
        /// The image.
        image: String,
    },
    /// A namespace of another NVMe/TCP controller; its size is the
    /// remote namespace's, and follows it. The namespace's block size must
    /// be a multiple of the remote's.
    Remote(RemoteNamespace),
    /// Memory that the target's user holds ([`HeldStore`]), resized to
    /// `size` bytes: it outlives the namespaces made on it one after
    /// another, as a RAM volume's contents do.
    Held {
        /// The store.
        store: HeldStore,
        /// Size in bytes.
        size: u64,
    },
}

/// Memory that the target's user opens and keeps, not a namespace: a
/// namespace made on it serves it, and a later namespace on the same
/// store finds what the earlier one wrote. Clones share the memory; two
/// stores are the same when they share it.
#[derive(Clone)]
pub struct HeldStore {
    name: String,
    store: Arc<RamBackend>,
}

impl HeldStore {
    /// `size` bytes of memory, allocated as written, known in logs and
    /// errors as `name`.
    pub fn ram(name: impl Into<String>, size: u64) -> HeldStore {
        HeldStore {
            name: name.into(),
            store: Arc::new(RamBackend::new(size)),
        }
    }

    /// What the store is known as.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its size in bytes now.
    pub fn len(&self) -> u64 {
        self.store.len()
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes it `size` bytes long (a namespace serving it tells its hosts
    /// when the target is next given the new size).
    pub fn resize(&self, size: u64) -> io::Result<()> {
        self.store.resize(size)
    }
}

impl PartialEq for HeldStore {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.store, &other.store)
    }
}

impl Eq for HeldStore {}

impl std::fmt::Debug for HeldStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldStore")
            .field("name", &self.name)
            .field("len", &self.len())
            .finish()
    }
}

impl BackendSpec {
    /// True if `other` names the same backing store (possibly resized).
    pub(super) fn same_store(&self, other: &BackendSpec) -> bool {
        match (self, other) {
            (Self::Ram { .. }, Self::Ram { .. }) | (Self::Null { .. }, Self::Null { .. }) => true,
            (Self::File { path: a, .. }, Self::File { path: b, .. }) => a == b,
            (Self::BlockDevice { path: a }, Self::BlockDevice { path: b }) => a == b,
            (
                Self::Rbd {
                    cluster: c1,
                    pool: p1,
                    image: i1,
                },
                Self::Rbd {
                    cluster: c2,
                    pool: p2,
                    image: i2,
                },
            ) => c1.name == c2.name && p1 == p2 && i1 == i2,
            // Other paths, another identity or other bounds: another
            // connection, so another backend.
            (Self::Remote(a), Self::Remote(b)) => a == b,
            (Self::Held { store: a, .. }, Self::Held { store: b, .. }) => a == b,
            _ => false,
        }
    }

    /// The size a backend of `cur` bytes must be resized to, if any: a
    /// file the service did not create, or one configured with size 0,
    /// is never made smaller.
    pub(super) fn resize_to(&self, cur: u64) -> Option<u64> {
        match *self {
            Self::Ram { size } | Self::Null { size } | Self::Held { size, .. } => Some(size),
            Self::File { size, created, .. } if size != 0 && (created || size > cur) => Some(size),
            Self::File { .. } | Self::BlockDevice { .. } | Self::Rbd { .. } | Self::Remote(_) => {
                None
            }
        }
        .filter(|s| *s != cur)
    }

    /// The cluster this store lives on, if any.
    pub(super) fn cluster(&self) -> Option<&RbdCluster> {
        match self {
            Self::Rbd { cluster, .. } => Some(cluster),
            _ => None,
        }
    }

    /// Opens the store, a file or device through `policy`, an image
    /// through `clusters`; answers the file or device opened, if any.
    pub(super) fn open(
        &self,
        policy: &BackingPolicy,
        clusters: &Clusters,
    ) -> io::Result<(Arc<dyn Backend>, Option<Identity>)> {
        let file = |b: FileBackend| {
            let id = b.identity();
            (Arc::new(b) as Arc<dyn Backend>, Some(id))
        };
        Ok(match self {
            Self::Ram { size } => (Arc::new(RamBackend::new(*size)), None),
            Self::File {
                path,
                size,
                created,
            } => {
                let open = |direct| {
                    let how = OpenHow {
                        create: *created,
                        direct,
                    };
                    Ok(policy.open_file(path, how)?)
                };
                let grow = (*size != 0).then_some(*size);
                file(FileBackend::open_by(path, &open, grow, *created)?)
            }
            Self::BlockDevice { path } => {
                let open = |direct| Ok(policy.open_block_device(path, direct)?);
                file(FileBackend::open_by(path, &open, None, false)?)
            }
            Self::Null { size } => (Arc::new(NullBackend::new(*size)), None),
            #[cfg(feature = "rbd")]
            Self::Rbd {
                cluster,
                pool,
                image,
            } => {
                let link = clusters.connect(cluster)?;
                let b = crate::backend::rbd::RbdBackend::open(&link, &cluster.name, pool, image)?;
                (Arc::new(b), None)
            }
            Self::Remote(r) => (Arc::new(crate::backend::RemoteBackend::open(r)?), None),
            Self::Held { store, size } => {
                if store.len() != *size {
                    store.resize(*size)?;
                }
                (store.store.clone() as Arc<dyn Backend>, None)
            }
            #[cfg(not(feature = "rbd"))]
            Self::Rbd { cluster, .. } => {
                let _ = clusters;
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "cluster {}: this build has no RBD support (built without the `rbd` feature)",
                        cluster.name
                    ),
                ));
            }
        })
    }
}

/// A namespace as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceConfig {
    /// Namespace ID (1-based).
    pub nsid: u32,
    /// Logical block size: 512 or 4096.
    pub block_size: u32,
    /// Namespace UUID.
    pub uuid: [u8; 16],
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// IEEE Extended Unique Identifier, if it has one: Identify Namespace
    /// and the Namespace Identification Descriptor list report it.
    pub eui64: Option<[u8; 8]>,
    /// Backing store.
    pub backend: BackendSpec,
    /// Limits on the namespace's I/O, all hosts together.
    pub qos: QosLimits,
}

/// A subsystem as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemConfig {
    /// NVMe Qualified Name.
    pub nqn: String,
    /// Serial number (up to 20 ASCII characters).
    pub serial: String,
    /// Model number (up to 40 ASCII characters).
    pub model: String,
    /// Any host may connect.
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect.
    pub allowed_hosts: BTreeSet<String>,
    /// Largest namespace ID.
    pub max_namespaces: u32,
    /// Namespaces.
    pub namespaces: Vec<NamespaceConfig>,
    /// Transport addresses the subsystem is exported on.
    pub listeners: Vec<SocketAddr>,
    /// Limits on the I/O of each host named, all its controllers and
    /// namespaces on the subsystem together.
    pub host_qos: BTreeMap<String, QosLimits>,
}

/// Everything the target serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetConfig {
    /// Subsystems.
    pub subsystems: Vec<SubsystemConfig>,
    /// The discovery controller's own listener (it also answers on every
    /// subsystem listener).
    pub discovery: Option<SocketAddr>,
}

impl TargetConfig {
    /// Every address the transport must listen on.
    pub fn listen_addrs(&self) -> BTreeSet<SocketAddr> {
        self.subsystems
            .iter()
            .flat_map(|s| s.listeners.iter().copied())
            .chain(self.discovery)
            .collect()
    }
}

/// A subsystem for unit tests: any host, one RAM namespace of `size`
/// bytes in 512-byte blocks, served on `listeners`.
#[cfg(test)]
pub(crate) fn ram_subsystem(nqn: &str, size: u64, listeners: Vec<SocketAddr>) -> SubsystemConfig {
    SubsystemConfig {
        nqn: nqn.into(),
        serial: "SN1".into(),
        model: "test".into(),
        allow_any_host: true,
        allowed_hosts: BTreeSet::new(),
        max_namespaces: 8,
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            block_size: 512,
            uuid: [1; 16],
            nguid: [2; 16],
            eui64: None,
            backend: BackendSpec::Ram { size },
            qos: Default::default(),
        }],
        listeners,
        host_qos: Default::default(),
    }
}
