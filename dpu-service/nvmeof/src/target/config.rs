//! What the target is told to serve: subsystems, their namespaces and
//! where each namespace's blocks live.

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dpu_os::backing::{BackingPolicy, Identity, OpenHow};

use crate::backend::{Backend, FileBackend, NullBackend, RamBackend};

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
            _ => false,
        }
    }

    /// The size a backend of `cur` bytes must be resized to, if any: a
    /// file the service did not create, or one configured with size 0,
    /// is never made smaller.
    pub(super) fn resize_to(&self, cur: u64) -> Option<u64> {
        match *self {
            Self::Ram { size } | Self::Null { size } => Some(size),
            Self::File { size, created, .. } if size != 0 && (created || size > cur) => Some(size),
            Self::File { .. } | Self::BlockDevice { .. } | Self::Rbd { .. } => None,
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
    /// Backing store.
    pub backend: BackendSpec,
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
            backend: BackendSpec::Ram { size },
        }],
        listeners,
    }
}
