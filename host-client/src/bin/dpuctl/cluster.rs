//! `dpuctl cluster`: the storage clusters (Ceph) whose RBD images back
//! namespaces; its subcommands and flags, and their handler. The cephx
//! key comes from a keyring file (`--keyring-file`), never the command
//! line, and is never shown back.

use std::path::{Path, PathBuf};

use clap::{ArgGroup, Subcommand};
use dpu_client::{cluster_name, pb, DpuClient};

use crate::common::{all_pages, deleted, json, mask, Paging, Shown};
use crate::{render, Failure};

#[derive(Debug, Subcommand)]
pub enum ClusterCmd {
    /// Registers a storage cluster (Ceph). The service connects to it
    /// before answering, so a cluster it cannot reach, or that refuses
    /// the key, is refused here.
    Create {
        /// Cluster ID.
        id: String,
        /// A monitor address, e.g. 10.0.0.1:6789 or
        /// [v2:10.0.0.1:3300,v1:10.0.0.1:6789] (repeatable).
        #[arg(long = "mon", required = true, value_name = "ADDRESS")]
        mons: Vec<String>,
        /// The cephx user, without "client." (e.g. dpu).
        #[arg(long)]
        user: String,
        /// The user's keyring ([client.USER] with key = ...), or a file
        /// holding only the key; without it, the cluster has no cephx.
        #[arg(long, value_name = "PATH")]
        keyring_file: Option<PathBuf>,
        /// Bound on each I/O to the cluster, seconds (default 20).
        #[arg(long, value_name = "SECS")]
        op_timeout: Option<u32>,
        /// Bound on connecting and on each request to a monitor, seconds
        /// (default 10).
        #[arg(long, value_name = "SECS")]
        connect_timeout: Option<u32>,
    },
    /// Shows a storage cluster (whether a key is set, never the key).
    Get {
        /// Cluster ID.
        id: String,
    },
    /// Lists storage clusters.
    List(Paging),
    /// Changes a storage cluster; only the fields given change. Rotate its
    /// key with --keyring-file: the service connects with the new key
    /// before it keeps it.
    #[command(group(
        ArgGroup::new("change")
            .required(true)
            .multiple(true)
            .args(["mons", "user", "keyring_file", "no_key", "op_timeout", "connect_timeout"])
    ))]
    Update {
        /// Cluster ID.
        id: String,
        /// Replace the monitor addresses (repeatable).
        #[arg(long = "mon", value_name = "ADDRESS")]
        mons: Vec<String>,
        /// The cephx user, without "client.".
        #[arg(long)]
        user: Option<String>,
        /// The new key: a keyring with the user's section, or the key
        /// alone.
        #[arg(long, value_name = "PATH")]
        keyring_file: Option<PathBuf>,
        /// Remove the key (a cluster without cephx).
        #[arg(long, conflicts_with = "keyring_file")]
        no_key: bool,
        /// Bound on each I/O to the cluster, seconds.
        #[arg(long, value_name = "SECS")]
        op_timeout: Option<u32>,
        /// Bound on connecting and on each request to a monitor, seconds.
        #[arg(long, value_name = "SECS")]
        connect_timeout: Option<u32>,
    },
    /// Deletes a storage cluster no namespace uses.
    Delete {
        /// Cluster ID.
        id: String,
    },
}

/// Longest keyring file read: one holding many users' keys is a few KiB.
const MAX_KEYRING_FILE: u64 = 64 << 10;

/// The cephx key of `client.{user}` in the keyring (or bare key) file at
/// `path` ([`dpu_proto::text::cephx_key`]). No error quotes the file.
pub fn keyring_key(path: &Path, user: &str) -> Result<String, Failure> {
    let read = || -> std::io::Result<String> {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(path)?
            .take(MAX_KEYRING_FILE + 1)
            .read_to_string(&mut text)?;
        Ok(text)
    };
    let text = read().map_err(|e| Failure::Input(format!("{}: {e}", path.display())))?;
    if text.len() as u64 > MAX_KEYRING_FILE {
        return Err(Failure::Input(format!(
            "{}: longer than {MAX_KEYRING_FILE} bytes; not a keyring",
            path.display()
        )));
    }
    dpu_proto::text::cephx_key(&text, user)
        .map_err(|e| Failure::Input(format!("{}: {e}", path.display())))
}

/// `dpuctl cluster ...`.
pub async fn execute(c: &DpuClient, cmd: &ClusterCmd) -> Result<Shown, Failure> {
    let one = |x: pb::Cluster| Shown {
        json: json(&x),
        text: render::clusters(std::slice::from_ref(&x)),
    };
    Ok(match cmd {
        ClusterCmd::Create {
            id,
            mons,
            user,
            keyring_file,
            op_timeout,
            connect_timeout,
        } => {
            let key = match keyring_file {
                Some(f) => keyring_key(f, user)?,
                None => String::new(),
            };
            let x = pb::Cluster {
                mon_host: mons.join(","),
                user: user.clone(),
                key,
                op_timeout_secs: op_timeout.unwrap_or(0),
                connect_timeout_secs: connect_timeout.unwrap_or(0),
                ..Default::default()
            };
            one(c
                .create_cluster(pb::CreateClusterRequest {
                    cluster_id: id.clone(),
                    cluster: Some(x),
                })
                .await?)
        }
        ClusterCmd::Get { id } => one(c
            .get_cluster(pb::GetClusterRequest {
                name: cluster_name(id),
            })
            .await?),
        ClusterCmd::List(Paging { page_size }) => {
            let all = all_pages(|page_token| async move {
                let r = c
                    .list_clusters(pb::ListClustersRequest {
                        page_size: *page_size,
                        page_token,
                    })
                    .await?;
                Ok((r.clusters, r.next_page_token))
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::clusters(&all),
            }
        }
        ClusterCmd::Update {
            id,
            mons,
            user,
            keyring_file,
            no_key,
            op_timeout,
            connect_timeout,
        } => {
            let mut paths = Vec::new();
            let mut x = pb::Cluster {
                name: cluster_name(id),
                ..Default::default()
            };
            if !mons.is_empty() {
                paths.push("mon_host");
                x.mon_host = mons.join(",");
            }
            if let Some(u) = user {
                paths.push("user");
                x.user.clone_from(u);
            }
            if let Some(f) = keyring_file {
                // The key of the user the cluster will have.
                let user = match user {
                    Some(u) => u.clone(),
                    None => {
                        c.get_cluster(pb::GetClusterRequest {
                            name: cluster_name(id),
                        })
                        .await?
                        .user
                    }
                };
                paths.push("key");
                x.key = keyring_key(f, &user)?;
            }
            if *no_key {
                paths.push("key");
            }
            if let Some(t) = op_timeout {
                paths.push("op_timeout_secs");
                x.op_timeout_secs = *t;
            }
            if let Some(t) = connect_timeout {
                paths.push("connect_timeout_secs");
                x.connect_timeout_secs = *t;
            }
            one(c
                .update_cluster(pb::UpdateClusterRequest {
                    cluster: Some(x),
                    update_mask: mask(&paths),
                })
                .await?)
        }
        ClusterCmd::Delete { id } => {
            c.delete_cluster(pb::DeleteClusterRequest {
                name: cluster_name(id),
            })
            .await?;
            deleted(cluster_name(id))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "AQCAmWZmQOIBABAAEBESExQVFhcYGRobHB0eHw==";

    /// The key of the user's section of a keyring, or of a file holding
    /// only the key; anything else is INVALID_ARGUMENT (exit 5) naming the
    /// file, never quoting it.
    #[test]
    fn keys_from_keyring_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("ceph.client.dpu.keyring");
        let write = |text: &str| std::fs::write(&f, text).unwrap();
        write(&format!(
            "[client.dpu]\n\tkey = {KEY}\n\tcaps mon = \"profile rbd\"\n\tcaps osd = \"profile rbd pool=rbd\"\n"
        ));
        assert_eq!(keyring_key(&f, "dpu").unwrap(), KEY);
        let refused = |user: &str| match keyring_key(&f, user).unwrap_err() {
            Failure::Input(m) => {
                assert!(m.starts_with(&f.display().to_string()), "{m}");
                assert!(!m.contains(&KEY[..16]), "the key is quoted: {m}");
                m
            }
            other => panic!("{other}"),
        };
        // A keyring without the user's section names the ones it has.
        let m = refused("admin");
        assert!(
            m.contains("no [client.admin] section") && m.contains("[client.dpu]"),
            "{m}"
        );
        // `ceph auth get-key` output: the key alone, for any user.
        write(&format!("{KEY}\n"));
        assert_eq!(keyring_key(&f, "admin").unwrap(), KEY);
        // Malformed: two keys, a section without one, an empty file.
        write(&format!("{KEY}\n{KEY}\n"));
        refused("dpu");
        write("[client.dpu]\n\tcaps mon = \"allow r\"\n");
        assert!(refused("dpu").ends_with("[client.dpu] has no key"));
        write("");
        assert!(refused("dpu").contains("empty"));
        write(&"x".repeat(70_000));
        assert!(refused("dpu").contains("not a keyring"));
        let missing = dir.path().join("none");
        assert!(matches!(
            keyring_key(&missing, "dpu"),
            Err(Failure::Input(_))
        ));
    }
}
