//! `dpuctl namespace`: its subcommands and flags, and their handler.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{ArgGroup, Args, Subcommand};
use dpu_client::{namespace_name, parse_size, pb, subsystem_name, DpuClient};

use crate::common::{all_pages, deleted, json, Paging, Shown};
use crate::qos::QosArgs;
use crate::{render, Failure};

#[derive(Debug, Subcommand)]
pub enum NamespaceCmd {
    /// Creates a namespace backed by RAM, a file, a block device, a null
    /// store, a volume (`dpuctl volume create`), an RBD image of a storage
    /// cluster (`dpuctl cluster create`) or a namespace of a remote
    /// NVMe/TCP target.
    #[command(group(ArgGroup::new("backend").required(true)))]
    Create {
        /// Subsystem ID.
        subsystem: String,
        /// Namespace ID (lowest free if absent).
        #[arg(long)]
        nsid: Option<u32>,
        /// Memory-backed, of this size (e.g. 256M).
        #[arg(long, group = "backend", value_name = "SIZE", value_parser = parse_size)]
        ram: Option<u64>,
        /// File-backed, at this absolute path.
        #[arg(long, group = "backend", value_name = "PATH")]
        file: Option<String>,
        /// Size of a file backend (default: the existing file's size).
        #[arg(
            long,
            value_name = "SIZE",
            value_parser = parse_size,
            requires = "file",
            conflicts_with_all = ["ram", "block_device", "rbd", "remote", "null", "volume"]
        )]
        size: Option<u64>,
        /// Block-device-backed, at this path.
        #[arg(long, group = "backend", value_name = "PATH")]
        block_device: Option<String>,
        /// Backed by this RBD image of the storage cluster --cluster names
        /// (its size is the image's).
        #[arg(
            long,
            group = "backend",
            value_name = "POOL/IMAGE",
            value_parser = dpu_proto::text::rbd_image,
            requires = "cluster"
        )]
        rbd: Option<(String, String)>,
        /// The storage cluster of an --rbd image.
        #[arg(long, value_name = "CLUSTER", requires = "rbd")]
        cluster: Option<String>,
        #[command(flatten)]
        remote: Box<RemoteArgs>,
        /// A null store of this size: reads return zeros, writes are
        /// dropped (benchmarks).
        #[arg(long, group = "backend", value_name = "SIZE", value_parser = parse_size)]
        null: Option<u64>,
        /// Made on this volume (ID or volumes/ID), which no other
        /// namespace is made on; its size and block size are the volume's.
        #[arg(long, group = "backend", value_name = "VOLUME")]
        volume: Option<String>,
        /// Logical block size, 512 or 4096 (on a volume: the volume's).
        #[arg(long)]
        block_size: Option<u32>,
        /// Namespace UUID (generated if absent).
        #[arg(long)]
        uuid: Option<String>,
        /// QoS limits on the namespace's I/O, all hosts together (none
        /// if absent).
        #[command(flatten)]
        qos: Box<QosArgs>,
    },
    /// Shows a namespace.
    Get {
        /// Subsystem ID.
        subsystem: String,
        /// Namespace ID.
        nsid: u32,
    },
    /// Lists a subsystem's namespaces.
    List {
        /// Subsystem ID.
        subsystem: String,
        #[command(flatten)]
        paging: Paging,
    },
    /// Resizes a RAM-, file- or null-backed namespace (one made on a
    /// volume follows `dpuctl volume resize`).
    Resize {
        /// Subsystem ID.
        subsystem: String,
        /// Namespace ID.
        nsid: u32,
        /// New size (e.g. 1G).
        #[arg(value_name = "SIZE", value_parser = parse_size)]
        size: u64,
    },
    /// Sets the QoS limits of a namespace, on the I/O of all its hosts
    /// together, replacing what it had: a limit not given is none, so no
    /// flag at all clears them. Takes effect at once, without reconnecting.
    SetQos {
        /// Subsystem ID.
        subsystem: String,
        /// Namespace ID.
        nsid: u32,
        #[command(flatten)]
        qos: QosArgs,
    },
    /// Deletes a namespace.
    Delete {
        /// Subsystem ID.
        subsystem: String,
        /// Namespace ID.
        nsid: u32,
    },
}

/// The flags of a namespace on a remote NVMe/TCP target.
#[derive(Debug, Args)]
pub struct RemoteArgs {
    /// Backed by a namespace of the remote NVMe/TCP target at this
    /// address (an IPv6 address in brackets before the port); repeat for up to 4 paths, in order
    /// of preference. Its size is the remote namespace's.
    #[arg(
        long = "remote",
        id = "remote",
        group = "backend",
        value_name = "ADDR:PORT",
        requires = "remote_nqn",
        requires = "remote_nsid"
    )]
    pub paths: Vec<SocketAddr>,
    /// The remote subsystem's NQN.
    #[arg(
        long = "remote-nqn",
        id = "remote_nqn",
        value_name = "NQN",
        requires = "remote"
    )]
    pub nqn: Option<String>,
    /// The namespace's ID in the remote subsystem.
    #[arg(
        long = "remote-nsid",
        id = "remote_nsid",
        value_name = "N",
        requires = "remote"
    )]
    pub nsid: Option<u32>,
    /// The host NQN to connect to the remote with (default: the
    /// service's).
    #[arg(long, value_name = "NQN", requires = "remote")]
    pub host_nqn: Option<String>,
    /// A file holding the DH-HMAC-CHAP secret (`DHHC-1:..`) for a remote
    /// that requires authentication; never shown back.
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub dhchap_secret_file: Option<PathBuf>,
    /// Bound on each command to the remote, milliseconds (default 10000).
    #[arg(long, value_name = "MS", requires = "remote")]
    pub io_timeout_ms: Option<u32>,
    /// Bound on connecting on one path, milliseconds (default 3000).
    #[arg(long, value_name = "MS", requires = "remote")]
    pub connect_timeout_ms: Option<u32>,
    /// Most commands in flight to the remote, 2 to 1024 (default 128).
    #[arg(long, value_name = "N", requires = "remote")]
    pub queue_depth: Option<u32>,
}

impl RemoteArgs {
    /// The backend these flags give, the secret read from its file;
    /// `None` without `--remote`.
    fn backend(&self) -> Result<Option<pb::RemoteBackend>, Failure> {
        if self.paths.is_empty() {
            return Ok(None);
        }
        Ok(Some(pb::RemoteBackend {
            paths: self.paths.iter().map(ToString::to_string).collect(),
            subnqn: self.nqn.clone().unwrap_or_default(),
            nsid: self.nsid.unwrap_or(0),
            host_nqn: self.host_nqn.clone().unwrap_or_default(),
            dhchap_secret: crate::subsystem::secret(None, self.dhchap_secret_file.as_deref())?,
            dhchap_secret_set: false,
            io_timeout_ms: self.io_timeout_ms.unwrap_or(0),
            connect_timeout_ms: self.connect_timeout_ms.unwrap_or(0),
            queue_depth: self.queue_depth.unwrap_or(0),
        }))
    }
}

/// `dpuctl namespace ...`.
pub async fn execute(c: &DpuClient, cmd: &NamespaceCmd) -> Result<Shown, Failure> {
    let one = |n: pb::Namespace| Shown {
        json: json(&n),
        text: render::namespaces(std::slice::from_ref(&n)),
    };
    Ok(match cmd {
        NamespaceCmd::Create {
            subsystem,
            nsid,
            ram,
            file,
            size,
            block_device,
            rbd,
            cluster,
            remote,
            null,
            volume,
            block_size,
            uuid,
            qos,
        } => {
            if cluster.is_some() && rbd.is_none() {
                return Err(Failure::Input(
                    "--cluster names the storage cluster of an --rbd POOL/IMAGE".into(),
                ));
            }
            let backend = if let Some(r) = remote.backend()? {
                pb::namespace::Backend::Remote(r)
            } else if let Some(size_bytes) = ram {
                pb::namespace::Backend::Ram(pb::RamBackend {
                    size_bytes: *size_bytes,
                })
            } else if let Some(path) = file {
                pb::namespace::Backend::File(pb::FileBackend {
                    path: path.clone(),
                    size_bytes: size.unwrap_or(0),
                })
            } else if let Some(path) = block_device {
                pb::namespace::Backend::BlockDevice(pb::BlockDeviceBackend { path: path.clone() })
            } else if let Some((pool, image)) = rbd {
                pb::namespace::Backend::Rbd(pb::RbdBackend {
                    cluster_id: cluster
                        .as_deref()
                        .map(|c| c.strip_prefix("clusters/").unwrap_or(c).to_string())
                        .unwrap_or_default(),
                    pool: pool.clone(),
                    image: image.clone(),
                })
            } else if let Some(size_bytes) = null {
                pb::namespace::Backend::Null(pb::NullBackend {
                    size_bytes: *size_bytes,
                })
            } else if let Some(v) = volume {
                pb::namespace::Backend::Volume(v.clone())
            } else {
                return Err(Failure::Input(
                    "give one of --ram SIZE, --file PATH, --block-device PATH, --null SIZE, \
                     --volume VOLUME, --rbd POOL/IMAGE --cluster CLUSTER, \
                     --remote ADDR:PORT --remote-nqn NQN --remote-nsid N"
                        .into(),
                ));
            };
            let n = pb::Namespace {
                nsid: nsid.unwrap_or(0),
                backend: Some(backend),
                block_size: block_size.unwrap_or(0),
                uuid: uuid.clone().unwrap_or_default(),
                qos: qos.on_create(),
                ..Default::default()
            };
            one(c
                .create_namespace(pb::CreateNamespaceRequest {
                    parent: subsystem_name(subsystem),
                    namespace: Some(n),
                })
                .await?)
        }
        NamespaceCmd::Get { subsystem, nsid } => one(c
            .get_namespace(pb::GetNamespaceRequest {
                name: namespace_name(subsystem, *nsid),
            })
            .await?),
        NamespaceCmd::List { subsystem, paging } => {
            let parent = subsystem_name(subsystem);
            let all = all_pages(|page_token| {
                let parent = parent.clone();
                async move {
                    let r = c
                        .list_namespaces(pb::ListNamespacesRequest {
                            parent,
                            page_size: paging.page_size,
                            page_token,
                        })
                        .await?;
                    Ok((r.namespaces, r.next_page_token))
                }
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::namespaces(&all),
            }
        }
        NamespaceCmd::Resize {
            subsystem,
            nsid,
            size,
        } => one(c
            .resize_namespace(pb::ResizeNamespaceRequest {
                name: namespace_name(subsystem, *nsid),
                size_bytes: *size,
            })
            .await?),
        NamespaceCmd::SetQos {
            subsystem,
            nsid,
            qos,
        } => one(c
            .set_namespace_qos(pb::SetNamespaceQosRequest {
                subsystem: subsystem_name(subsystem),
                nsid: *nsid,
                qos: Some(qos.limits()),
            })
            .await?),
        NamespaceCmd::Delete { subsystem, nsid } => {
            c.delete_namespace(pb::DeleteNamespaceRequest {
                name: namespace_name(subsystem, *nsid),
            })
            .await?;
            deleted(namespace_name(subsystem, *nsid))
        }
    })
}
