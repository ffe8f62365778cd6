//! The storage clusters' probe ([`StoreProbe`]), through which the control
//! plane, which links no Ceph library, checks a cluster, a change to one
//! and an RBD namespace before it stores them; and a remote NVMe/TCP
//! namespace, which it opens through [`crate::remote::probe`].
//!
//! With the `rbd` feature it connects through `dpu-rbd` (librados), as
//! the cluster's user with its key and within its timeouts, and opens
//! the image; without it, it refuses every cluster, saying so.

use std::sync::Arc;

use std::net::SocketAddr;
use std::time::Duration;

use dpu_control::model::{Cluster, RemoteNamespace};
use dpu_control::service::{RemoteNamespaceInfo, StoreProbe};

/// Why a build without the `rbd` feature refuses clusters and RBD
/// namespaces.
#[cfg_attr(feature = "rbd", allow(dead_code))]
pub const NO_RBD: &str = "this build has no RBD support (built without the `rbd` feature)";

/// The probe the service runs with.
pub fn probe() -> Arc<dyn StoreProbe> {
    #[cfg(feature = "rbd")]
    let p = Arc::new(Librados);
    #[cfg(not(feature = "rbd"))]
    let p = Arc::new(NoRbd { offline: false });
    p
}

/// The probe of a configuration check, which connects to nothing: none
/// with RBD support (each declared cluster and remote namespace is
/// checked when it is first created at startup), and without it the
/// refusal of clusters (remote namespaces pass).
pub fn offline_probe() -> Option<Arc<dyn StoreProbe>> {
    #[cfg(feature = "rbd")]
    let p = None;
    #[cfg(not(feature = "rbd"))]
    let p = Some(Arc::new(NoRbd { offline: true }) as Arc<dyn StoreProbe>);
    p
}

/// How `dpu-rbd` connects to `c`.
#[cfg(feature = "rbd")]
pub fn cluster_config(c: &Cluster) -> dpu_rbd::ClusterConfig {
    dpu_rbd::ClusterConfig {
        mon_host: c.mon_host.clone(),
        user: c.user.clone(),
        key: c.key.as_ref().map(|k| k.expose().to_string()),
        op_timeout: c.op_timeout(),
        connect_timeout: c.connect_timeout(),
    }
}

/// Connects through librados.
#[cfg(feature = "rbd")]
#[derive(Debug)]
struct Librados;

#[cfg(feature = "rbd")]
impl StoreProbe for Librados {
    fn probe_cluster(&self, c: &Cluster) -> Result<(), String> {
        dpu_rbd::Cluster::connect(&cluster_config(c))
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn probe_image(&self, c: &Cluster, pool: &str, image: &str) -> Result<u64, String> {
        let cluster = dpu_rbd::Cluster::connect(&cluster_config(c)).map_err(|e| e.to_string())?;
        cluster
            .pool(pool, None)
            .and_then(|p| p.open(image))
            .and_then(|i| i.size())
            .map_err(|e| e.to_string())
    }

    fn probe_remote(&self, r: &RemoteNamespace, block_size: u32) -> Result<(), String> {
        crate::remote::probe(r, block_size)
    }

    fn probe_remote_namespaces(
        &self,
        paths: &[SocketAddr],
        subnqn: &str,
        host_nqn: &str,
        bound: Duration,
    ) -> Result<Vec<RemoteNamespaceInfo>, String> {
        crate::remote::list_namespaces(paths, subnqn, host_nqn, bound)
    }
}

/// Refuses every cluster: this build has no RBD support. Opens remote
/// namespaces, unless `offline` (a configuration check).
#[cfg(not(feature = "rbd"))]
#[derive(Debug)]
struct NoRbd {
    offline: bool,
}

#[cfg(not(feature = "rbd"))]
impl StoreProbe for NoRbd {
    fn probe_cluster(&self, _: &Cluster) -> Result<(), String> {
        Err(NO_RBD.into())
    }

    fn probe_image(&self, _: &Cluster, _: &str, _: &str) -> Result<u64, String> {
        Err(NO_RBD.into())
    }

    fn probe_remote(&self, r: &RemoteNamespace, block_size: u32) -> Result<(), String> {
        if self.offline {
            return Ok(());
        }
        crate::remote::probe(r, block_size)
    }

    fn probe_remote_namespaces(
        &self,
        paths: &[SocketAddr],
        subnqn: &str,
        host_nqn: &str,
        bound: Duration,
    ) -> Result<Vec<RemoteNamespaceInfo>, String> {
        if self.offline {
            return Err("a configuration check connects to no remote".into());
        }
        crate::remote::list_namespaces(paths, subnqn, host_nqn, bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(mon_host: &str) -> Cluster {
        Cluster {
            id: "ceph1".into(),
            mon_host: mon_host.into(),
            user: "dpu".into(),
            key: None,
            op_timeout_secs: 1,
            connect_timeout_secs: 1,
            create_time: Default::default(),
        }
    }

    /// Monitors that do not answer are named within the connect timeout.
    #[cfg(feature = "rbd")]
    #[test]
    fn a_cluster_that_does_not_answer_is_named() {
        // A port nothing listens on: a closed port, then no answer.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let mon = format!("127.0.0.1:{port}");
        let t = std::time::Instant::now();
        let e = probe().probe_cluster(&cluster(&mon)).unwrap_err();
        assert!(e.contains(&mon), "{e}");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "{:?}",
            t.elapsed()
        );
        assert!(offline_probe().is_none());
    }

    #[cfg(not(feature = "rbd"))]
    #[test]
    fn without_rbd_every_cluster_is_refused() {
        let p = offline_probe().expect("the refusal");
        assert_eq!(p.probe_cluster(&cluster("m")).unwrap_err(), NO_RBD);
        assert_eq!(
            p.probe_image(&cluster("m"), "rbd", "i").unwrap_err(),
            NO_RBD
        );
        // A check connects to no remote namespace either.
        let r = RemoteNamespace {
            paths: vec!["127.0.0.1:1".parse().unwrap()],
            subnqn: "nqn.2024-01.io.example:far".into(),
            nsid: 1,
            host_nqn: "nqn.2024-01.io.example:me".into(),
            dhchap_secret: None,
            io_timeout_ms: 100,
            connect_timeout_ms: 100,
            queue_depth: 2,
        };
        p.probe_remote(&r, 512).unwrap();
    }
}
