//! The storage clusters of `dpu.v1.StorageService` (`CreateCluster` ..
//! `DeleteCluster`), the checks an RBD namespace makes before it is
//! stored, and the seams through which the service reaches what it does
//! not link: [`StoreProbe`] (the Ceph clusters, and the remote NVMe/TCP
//! targets of `remote`) and [`ServedNamespaces`] (what the NVMe-oF target
//! serves).
//!
//! A cluster, a change to one and an RBD namespace are stored only once
//! the probe has connected with them, so a cluster that is down, a key
//! that is refused or an image that does not exist is answered at the
//! call, naming the cluster's monitors or the image, not found later by
//! the target. The probe blocks (it connects), so it runs on a blocking
//! thread, and the call waits for it at most a bound derived from the
//! cluster's own timeouts.

use std::net::SocketAddr;
use std::time::Duration;

use dpu_proto::v1 as pb;

use super::{mask_paths, paginate, required, Api, PAGES};
use crate::convert;
use crate::error::{ControlError, Result};
use crate::model::{cluster_name, Backend, Cluster, Namespace, RemoteNamespace, Subsystem};
use crate::state::ClusterUpdate;
use crate::validate;

/// Connects to storage clusters for the control plane, which links no
/// Ceph library: the daemon implements it. Each call blocks for at most
/// about the cluster's connect and I/O timeouts.
pub trait StoreProbe: Send + Sync + std::fmt::Debug {
    /// Connects to `c`'s monitors as its user with its key.
    ///
    /// # Errors
    /// What failed and why, naming the monitors; never the key.
    fn probe_cluster(&self, c: &Cluster) -> std::result::Result<(), String>;

    /// Opens image `image` of pool `pool` on `c` and answers its size in
    /// bytes.
    ///
    /// # Errors
    /// As [`StoreProbe::probe_cluster`], or naming the pool or image.
    fn probe_image(&self, c: &Cluster, pool: &str, image: &str)
        -> std::result::Result<u64, String>;

    /// Opens remote namespace `r` as the target would, through the first
    /// of its paths that answers, and checks that a namespace of
    /// `block_size` bytes a block can be served on it (at least one
    /// block, a multiple of the remote's own). Blocks for at most about
    /// [`RemoteNamespace::open_bound`].
    ///
    /// # Errors
    /// What failed and why, naming the addresses tried; never the
    /// secret.
    fn probe_remote(&self, r: &RemoteNamespace, block_size: u32)
        -> std::result::Result<(), String>;

    /// Connects to the remote subsystem `subnqn` as `host_nqn` through
    /// the first of `paths` that answers and answers its active
    /// namespaces (Identify's active namespace list, then each one's
    /// Identify Namespace and identification descriptors), in NSID order,
    /// at most [`MAX_LISTED_REMOTE_NAMESPACES`]. Gives up once `bound`
    /// has passed.
    ///
    /// # Errors
    /// What failed and why, naming the addresses tried.
    fn probe_remote_namespaces(
        &self,
        paths: &[SocketAddr],
        subnqn: &str,
        host_nqn: &str,
        bound: Duration,
    ) -> std::result::Result<Vec<RemoteNamespaceInfo>, String>;
}

/// Most namespaces of a remote subsystem
/// [`StoreProbe::probe_remote_namespaces`] answers: one Identify active
/// namespace list.
pub const MAX_LISTED_REMOTE_NAMESPACES: usize = 1024;

/// A namespace of a remote subsystem, as its controller identifies it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteNamespaceInfo {
    /// Its NSID there.
    pub nsid: u32,
    /// Its NGUID (all zero: none).
    pub nguid: [u8; 16],
    /// Its EUI-64 (all zero: none).
    pub eui64: [u8; 8],
    /// Its UUID (all zero: none).
    pub uuid: [u8; 16],
    /// Bytes of one of its logical blocks.
    pub block_size: u32,
    /// Its size in logical blocks.
    pub blocks: u64,
}

/// What the NVMe-oF target knows of the namespaces it serves and the
/// state does not: the size of a block device or an RBD image, and
/// whether a namespace's store answers.
pub trait ServedNamespaces: Send + Sync + std::fmt::Debug {
    /// The size in bytes namespace `nsid` of the subsystem with NQN `nqn`
    /// is served with; `None` while it is not served.
    fn namespace_size(&self, nqn: &str, nsid: u32) -> Option<u64>;
    /// Whether the store of namespace `nsid` of the subsystem with NQN
    /// `nqn` answers (false: a storage cluster out of reach); `None`
    /// while the namespace is not served.
    fn namespace_reachable(&self, nqn: &str, nsid: u32) -> Option<bool>;
}

/// Probes of storage clusters and remote targets that may run at once.
/// Each holds a thread and a cluster client (librados starts about ten
/// threads) or a connection for up to the store's timeouts; API clients
/// asking for more are refused with `RESOURCE_EXHAUSTED` at once rather
/// than queued.
pub const PROBES_AT_ONCE: usize = 4;

/// The fields `UpdateCluster` changes.
const UPDATABLE: &[&str] = &[
    "mon_host",
    "user",
    "key",
    "op_timeout_secs",
    "connect_timeout_secs",
];

/// How long a call waits for the probe of `c`: its connect and I/O
/// bounds twice over (a connection, then a monitor or OSD request or
/// two), and some slack. A probe past it is abandoned to its thread.
fn probe_limit(c: &Cluster) -> Duration {
    (c.connect_timeout() + c.op_timeout()) * 2 + Duration::from_secs(5)
}

impl Api {
    /// Runs `probe` on cluster `c` off the runtime's threads; `Ok(None)`
    /// when the service has no probe (nothing to check against).
    ///
    /// # Errors
    /// FAILED_PRECONDITION naming the cluster and why the probe failed, or
    /// that it did not answer in time.
    async fn probe<T: Send + 'static>(
        &self,
        c: &Cluster,
        probe: impl FnOnce(&dyn StoreProbe, &Cluster) -> std::result::Result<T, String> + Send + 'static,
    ) -> Result<Option<T>> {
        let limit = probe_limit(c);
        let silent = format!(
            "the monitors at {} gave no answer within {} s",
            c.mon_host,
            limit.as_secs()
        );
        let c = c.clone();
        self.run_probe(&cluster_name(&c.id), limit, silent, move |p| probe(p, &c))
            .await
    }

    /// Runs `probe` of the store `name` names off the runtime's threads,
    /// waiting for it at most `limit`; `Ok(None)` when the service has no
    /// probe (nothing to check against). At most [`PROBES_AT_ONCE`] run at
    /// once.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED past [`PROBES_AT_ONCE`]; FAILED_PRECONDITION
    /// naming the store and why the probe failed, or `silent` when it did
    /// not answer within `limit`.
    pub(super) async fn run_probe<T: Send + 'static>(
        &self,
        name: &str,
        limit: Duration,
        silent: String,
        probe: impl FnOnce(&dyn StoreProbe) -> std::result::Result<T, String> + Send + 'static,
    ) -> Result<Option<T>> {
        let Some(p) = self.ctl.store_probe.clone() else {
            return Ok(None);
        };
        // Held by the probe itself, so one the caller stopped waiting for
        // still counts until it ends.
        let Ok(permit) = self.probes.clone().try_acquire_owned() else {
            return Err(ControlError::exhausted(
                "storage cluster probes at once",
                PROBES_AT_ONCE,
                format!("a probe of {name}, while others wait on their stores"),
            ));
        };
        let run = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            probe(&*p)
        });
        match tokio::time::timeout(limit, run).await {
            Ok(Ok(Ok(v))) => Ok(Some(v)),
            Ok(Ok(Err(why))) => Err(ControlError::FailedPrecondition(format!("{name}: {why}"))),
            Ok(Err(e)) => Err(ControlError::FailedPrecondition(format!(
                "{name}: probing it failed: {e}"
            ))),
            Err(_) => Err(ControlError::FailedPrecondition(format!(
                "{name}: {silent}"
            ))),
        }
    }

    /// Checks an RBD backend of a namespace to create, beside the state's
    /// own checks (which run again when it is stored): the cluster exists,
    /// the image backs no other namespace, and the probe opens it and
    /// finds at least one block of `block_size`. Answers the image's size
    /// (`None` without a probe). Other backends pass.
    ///
    /// # Errors
    /// NOT_FOUND for an unknown cluster, ALREADY_EXISTS for an image in
    /// use, FAILED_PRECONDITION naming the cluster and the image when it
    /// cannot be opened or is too small.
    pub(super) async fn check_rbd(&self, ns: &Namespace) -> Result<Option<u64>> {
        let Backend::Rbd {
            cluster,
            pool,
            image,
        } = &ns.backend
        else {
            return Ok(None);
        };
        let state = self.ctl.state.snapshot();
        state.check_image(&ns.backend)?;
        let c = state.cluster(cluster)?;
        let (p, i) = (pool.clone(), image.clone());
        let size = self
            .probe(c, move |probe, c| probe.probe_image(c, &p, &i))
            .await?;
        if let Some(size) = size.filter(|s| *s < u64::from(ns.block_size)) {
            return Err(ControlError::FailedPrecondition(format!(
                "{}: image {pool}/{image} is {size} bytes, less than one {}-byte block",
                cluster_name(cluster),
                ns.block_size
            )));
        }
        Ok(size)
    }

    /// Namespace `ns` of subsystem `sub` as a message, with the size its
    /// store is served with where only the target knows it (a block
    /// device, an RBD image, a remote namespace): 0 while it is not
    /// served.
    pub(super) fn namespace_out(&self, sub: &Subsystem, ns: &Namespace) -> pb::Namespace {
        let mut out = convert::namespace(&sub.id, ns);
        if let Some(served) = &self.ctl.served {
            if ns.backend.sized_by_store() {
                out.size_bytes = served.namespace_size(&sub.nqn, ns.nsid).unwrap_or(0);
            }
            out.state = match served.namespace_reachable(&sub.nqn, ns.nsid) {
                Some(true) => pb::NamespaceState::Serving,
                Some(false) => pb::NamespaceState::Unreachable,
                None => pb::NamespaceState::NotServed,
            }
            .into();
        }
        out
    }

    /// `CreateCluster`.
    pub(super) async fn cluster_create(
        &self,
        req: pb::CreateClusterRequest,
    ) -> Result<pb::Cluster> {
        let c = required("cluster", req.cluster)?;
        let cluster = validate::cluster("cluster", &req.cluster_id, &c)?;
        // What the state would refuse, before the probe takes its time.
        if self.ctl.state.snapshot().clusters.contains_key(&cluster.id) {
            return Err(ControlError::AlreadyExists(format!(
                "{} already exists",
                cluster_name(&cluster.id)
            )));
        }
        self.probe(&cluster, |p, c| p.probe_cluster(c)).await?;
        self.ctl
            .state
            .mutate(move |st| Ok(convert::cluster(st.create_cluster(cluster)?, 0)))
            .await
    }

    /// `GetCluster`.
    pub(super) fn cluster_get(&self, req: &pb::GetClusterRequest) -> Result<pb::Cluster> {
        let id = validate::cluster_name("name", &req.name)?;
        let state = self.ctl.state.snapshot();
        Ok(convert::cluster(
            state.cluster(id)?,
            state.cluster_namespaces(id),
        ))
    }

    /// `ListClusters`.
    pub(super) fn cluster_list(
        &self,
        req: &pb::ListClustersRequest,
    ) -> Result<pb::ListClustersResponse> {
        let state = self.ctl.state.snapshot();
        let items = state.clusters.iter().map(|(k, c)| (k.as_str(), c));
        let (clusters, next_page_token) =
            paginate(items, req.page_size, &req.page_token, PAGES, |c| {
                convert::cluster(c, state.cluster_namespaces(&c.id))
            })?;
        Ok(pb::ListClustersResponse {
            clusters,
            next_page_token,
        })
    }

    /// `UpdateCluster`: the changed cluster is probed before it is stored.
    pub(super) async fn cluster_update(
        &self,
        req: pb::UpdateClusterRequest,
    ) -> Result<pb::Cluster> {
        let c = required("cluster", req.cluster)?;
        let id = validate::cluster_name("cluster.name", &c.name)?.to_string();
        let paths = mask_paths(req.update_mask.as_ref(), UPDATABLE)?;
        let mut u = ClusterUpdate::default();
        for p in &paths {
            match p.as_str() {
                "mon_host" => {
                    validate::mon_host("cluster.mon_host", &c.mon_host)?;
                    u.mon_host = Some(c.mon_host.trim().to_string());
                }
                "user" => {
                    validate::ceph_user("cluster.user", &c.user)?;
                    u.user = Some(c.user.clone());
                }
                "key" => u.key = Some(validate::cephx_key("cluster.key", &c.key)?),
                "op_timeout_secs" => {
                    u.op_timeout_secs = Some(
                        validate::timeout("cluster.op_timeout_secs", c.op_timeout_secs)?
                            .unwrap_or(validate::DEFAULT_OP_TIMEOUT_SECS),
                    )
                }
                _ => {
                    u.connect_timeout_secs = Some(
                        validate::timeout("cluster.connect_timeout_secs", c.connect_timeout_secs)?
                            .unwrap_or(validate::DEFAULT_CONNECT_TIMEOUT_SECS),
                    )
                }
            }
        }
        let next = u.applied_to(self.ctl.state.snapshot().cluster(&id)?);
        self.probe(&next, |p, c| p.probe_cluster(c)).await?;
        self.change_storage(move |st| {
            let users = st.cluster_namespaces(&id);
            let out = convert::cluster(st.update_cluster(&id, &u)?, users);
            Ok((out, None))
        })
        .await
    }

    /// `DeleteCluster`.
    pub(super) async fn cluster_delete(&self, req: &pb::DeleteClusterRequest) -> Result<()> {
        let id = validate::cluster_name("name", &req.name)?.to_string();
        self.ctl
            .state
            .mutate(move |st| st.delete_cluster(&id))
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use dpu_proto::v1::storage_service_server::StorageService;
    use tonic::{Code, Request};

    use super::*;
    use crate::store::StateHandle;

    const KEY: &str = "AQCAmWZmQOIBABAAEBESExQVFhcYGRobHB0eHw==";
    const NEW_KEY: &str = "AQCAmWZmQOIBABAAICEiIyQlJicoKSorLC0uLw==";

    /// A stand-in Ceph: monitors that answer unless `down`, a key it
    /// accepts, its images and their sizes; it records the keys it was
    /// shown.
    #[derive(Debug)]
    struct Ceph {
        down: Mutex<bool>,
        /// Probes wait while set, as on monitors that do not answer.
        stall: std::sync::atomic::AtomicBool,
        accepts: Mutex<String>,
        images: Mutex<BTreeMap<String, u64>>,
        seen: Mutex<Vec<Option<String>>>,
    }

    impl StoreProbe for Ceph {
        fn probe_cluster(&self, c: &Cluster) -> std::result::Result<(), String> {
            let key = c.key.as_ref().map(|k| k.expose().to_string());
            self.seen.lock().unwrap().push(key.clone());
            let t = std::time::Instant::now();
            while self.stall.load(std::sync::atomic::Ordering::Acquire)
                && t.elapsed() < Duration::from_secs(10)
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            if *self.down.lock().unwrap() {
                return Err(format!(
                    "connect to the monitors at {}: Connection timed out (os error 110)",
                    c.mon_host
                ));
            }
            if key.as_deref() != Some(self.accepts.lock().unwrap().as_str()) {
                return Err(format!(
                    "connect to the monitors at {}: Permission denied (os error 13)",
                    c.mon_host
                ));
            }
            Ok(())
        }

        fn probe_image(
            &self,
            c: &Cluster,
            pool: &str,
            image: &str,
        ) -> std::result::Result<u64, String> {
            self.probe_cluster(c)?;
            let name = format!("{pool}/{image}");
            self.images
                .lock()
                .unwrap()
                .get(&name)
                .copied()
                .ok_or_else(|| format!("open image {name}: No such file or directory (os error 2)"))
        }

        fn probe_remote(&self, r: &RemoteNamespace, _: u32) -> std::result::Result<(), String> {
            Err(format!("{}: not a remote target", r.addresses()))
        }

        fn probe_remote_namespaces(
            &self,
            paths: &[SocketAddr],
            _: &str,
            _: &str,
            _: Duration,
        ) -> std::result::Result<Vec<RemoteNamespaceInfo>, String> {
            Err(format!("{paths:?}: not a remote target"))
        }
    }

    /// What the target serves: every namespace at 7 MiB, namespace 1's
    /// store out of reach.
    #[derive(Debug)]
    struct Served;

    impl ServedNamespaces for Served {
        fn namespace_size(&self, _: &str, _: u32) -> Option<u64> {
            Some(7 << 20)
        }
        fn namespace_reachable(&self, _: &str, nsid: u32) -> Option<bool> {
            Some(nsid != 1)
        }
    }

    fn api(served: bool) -> (Api, Arc<Ceph>, StateHandle) {
        let ceph = Arc::new(Ceph {
            down: Mutex::new(false),
            stall: Default::default(),
            accepts: Mutex::new(KEY.into()),
            images: Mutex::new(BTreeMap::from([
                ("rbd/vol1".to_string(), 1 << 30),
                ("rbd/vol2".to_string(), 8 << 20),
                ("rbd/tiny".to_string(), 100),
            ])),
            seen: Mutex::default(),
        });
        let state = StateHandle::open(None).unwrap();
        let api = Api::with_probe_for_tests(
            state.clone(),
            ceph.clone(),
            served.then(|| Arc::new(Served) as Arc<dyn ServedNamespaces>),
        );
        (api, ceph, state)
    }

    fn create(id: &str, key: &str) -> Request<pb::CreateClusterRequest> {
        Request::new(pb::CreateClusterRequest {
            cluster_id: id.into(),
            cluster: Some(pb::Cluster {
                mon_host: "127.0.0.1:6789".into(),
                user: "dpu".into(),
                key: key.into(),
                ..Default::default()
            }),
        })
    }

    fn rbd(cluster: &str, image: &str) -> Request<pb::CreateNamespaceRequest> {
        Request::new(pb::CreateNamespaceRequest {
            parent: "subsystems/s".into(),
            namespace: Some(pb::Namespace {
                backend: Some(pb::namespace::Backend::Rbd(pb::RbdBackend {
                    cluster_id: cluster.into(),
                    pool: "rbd".into(),
                    image: image.into(),
                })),
                ..Default::default()
            }),
        })
    }

    async fn subsystem(api: &Api) {
        api.create_subsystem(Request::new(pb::CreateSubsystemRequest {
            subsystem_id: "s".into(),
            subsystem: Some(pb::Subsystem {
                nqn: "nqn.2024-01.io.example:s".into(),
                ..Default::default()
            }),
        }))
        .await
        .unwrap();
    }

    /// No answer of any call carries a key, and no refusal quotes one.
    fn keyless(shown: &str) {
        for k in [KEY, NEW_KEY] {
            assert!(!shown.contains(&k[..16]), "a key in {shown}");
        }
    }

    #[tokio::test]
    async fn a_cluster_is_stored_once_it_answers_and_never_shows_its_key() {
        let (api, ceph, state) = api(false);
        *ceph.down.lock().unwrap() = true;
        let e = api.create_cluster(create("ceph1", KEY)).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert_eq!(
            e.message(),
            "clusters/ceph1: connect to the monitors at 127.0.0.1:6789: \
             Connection timed out (os error 110)"
        );
        assert!(state.snapshot().clusters.is_empty(), "nothing stored");
        *ceph.down.lock().unwrap() = false;
        // The wrong key is refused by the cluster.
        let e = api
            .create_cluster(create("ceph1", NEW_KEY))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        keyless(e.message());
        let c = api
            .create_cluster(create("ceph1", KEY))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(c.name, "clusters/ceph1");
        assert!(c.key.is_empty() && c.key_set);
        assert_eq!((c.op_timeout_secs, c.connect_timeout_secs), (20, 10));
        let e = api.create_cluster(create("ceph1", KEY)).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists);
        let got = api
            .get_cluster(Request::new(pb::GetClusterRequest {
                name: "clusters/ceph1".into(),
            }))
            .await
            .unwrap()
            .into_inner();
        let listed = api
            .list_clusters(Request::new(pb::ListClustersRequest::default()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.clusters, std::slice::from_ref(&got));
        keyless(&format!("{got:?}{listed:?}{:?}", state.snapshot()));
        // Malformed input is refused before anything is probed.
        let seen = ceph.seen.lock().unwrap().len();
        for (req, field) in [
            (create("ceph2", &KEY[..39]), "cluster.key"),
            (
                Request::new(pb::CreateClusterRequest {
                    cluster_id: "ceph2".into(),
                    cluster: Some(pb::Cluster {
                        user: "dpu".into(),
                        ..Default::default()
                    }),
                }),
                "cluster.mon_host",
            ),
        ] {
            let e = api.create_cluster(req).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().starts_with(field), "{}", e.message());
            keyless(e.message());
        }
        assert_eq!(ceph.seen.lock().unwrap().len(), seen);
    }

    #[tokio::test]
    async fn a_key_is_rotated_once_the_cluster_takes_it() {
        let (api, ceph, state) = api(false);
        api.create_cluster(create("ceph1", KEY)).await.unwrap();
        let update = |key: &str, paths: &[&str]| {
            Request::new(pb::UpdateClusterRequest {
                cluster: Some(pb::Cluster {
                    name: "clusters/ceph1".into(),
                    key: key.into(),
                    op_timeout_secs: 5,
                    ..Default::default()
                }),
                update_mask: Some(dpu_proto::pbjson_types::FieldMask {
                    paths: paths.iter().map(|p| p.to_string()).collect(),
                }),
            })
        };
        // The cluster does not take the new key yet: nothing changes.
        let e = api
            .update_cluster(update(NEW_KEY, &["key"]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert_eq!(
            ceph.seen
                .lock()
                .unwrap()
                .last()
                .cloned()
                .flatten()
                .as_deref(),
            Some(NEW_KEY),
            "the new key was tried"
        );
        let key = |s: &StateHandle| {
            s.snapshot().clusters["ceph1"]
                .key
                .as_ref()
                .map(|k| k.expose().to_string())
        };
        assert_eq!(key(&state).as_deref(), Some(KEY));
        *ceph.accepts.lock().unwrap() = NEW_KEY.into();
        let c = api
            .update_cluster(update(NEW_KEY, &["key", "op_timeout_secs"]))
            .await
            .unwrap()
            .into_inner();
        assert!(c.key.is_empty() && c.key_set);
        assert_eq!(c.op_timeout_secs, 5);
        assert_eq!(key(&state).as_deref(), Some(NEW_KEY));
        for (req, code) in [
            (update(NEW_KEY, &["name"]), Code::InvalidArgument),
            (update(NEW_KEY, &[]), Code::InvalidArgument),
            (update("AQ==", &["key"]), Code::InvalidArgument),
        ] {
            let e = api.update_cluster(req).await.unwrap_err();
            assert_eq!(e.code(), code, "{e:?}");
            keyless(e.message());
        }
        let mut r = update(NEW_KEY, &["connect_timeout_secs"]);
        r.get_mut().cluster.as_mut().unwrap().connect_timeout_secs = 301;
        let e = api.update_cluster(r).await.unwrap_err();
        assert!(
            e.message().starts_with("cluster.connect_timeout_secs"),
            "{e:?}"
        );
        let mut r = update(NEW_KEY, &["key"]);
        r.get_mut().cluster.as_mut().unwrap().name = "clusters/nope".into();
        assert_eq!(
            api.update_cluster(r).await.unwrap_err().code(),
            Code::NotFound
        );
    }

    #[tokio::test]
    async fn rbd_namespaces_need_their_cluster_and_image() {
        let (api, ceph, _state) = api(false);
        subsystem(&api).await;
        let e = api
            .create_namespace(rbd("ceph1", "vol1"))
            .await
            .unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (Code::NotFound, "clusters/ceph1 not found")
        );
        api.create_cluster(create("ceph1", KEY)).await.unwrap();
        let e = api
            .create_namespace(rbd("ceph1", "nope"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert_eq!(
            e.message(),
            "clusters/ceph1: open image rbd/nope: No such file or directory (os error 2)"
        );
        let e = api
            .create_namespace(rbd("ceph1", "tiny"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("rbd/tiny is 100 bytes"), "{e:?}");
        let ns = api
            .create_namespace(rbd("ceph1", "vol1"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ns.name, "subsystems/s/namespaces/1");
        assert_eq!(ns.size_bytes, 1 << 30, "the image's size");
        let e = api
            .create_namespace(rbd("ceph1", "vol1"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists);
        assert!(e.message().contains("subsystems/s/namespaces/1"), "{e:?}");
        // A cluster that went down since is named at the next namespace.
        *ceph.down.lock().unwrap() = true;
        let e = api
            .create_namespace(rbd("ceph1", "vol2"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("127.0.0.1:6789"), "{e:?}");
        // In use, the cluster stays.
        let delete = || {
            Request::new(pb::DeleteClusterRequest {
                name: "clusters/ceph1".into(),
            })
        };
        let e = api.delete_cluster(delete()).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("subsystems/s/namespaces/1"), "{e:?}");
        let got = api
            .get_cluster(Request::new(pb::GetClusterRequest {
                name: "clusters/ceph1".into(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.namespace_count, 1);
        api.delete_namespace(Request::new(pb::DeleteNamespaceRequest {
            name: ns.name.clone(),
        }))
        .await
        .unwrap();
        api.delete_cluster(delete()).await.unwrap();
        assert_eq!(
            api.delete_cluster(delete()).await.unwrap_err().code(),
            Code::NotFound
        );
    }

    /// Get and List show the size the target serves a device or an image
    /// with; RAM and files their own.
    #[tokio::test]
    async fn sizes_only_the_target_knows_come_from_it() {
        let (api, _ceph, _state) = api(true);
        subsystem(&api).await;
        api.create_cluster(create("ceph1", KEY)).await.unwrap();
        let made = api
            .create_namespace(rbd("ceph1", "vol1"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(made.size_bytes, 7 << 20);
        api.create_namespace(Request::new(pb::CreateNamespaceRequest {
            parent: "subsystems/s".into(),
            namespace: Some(pb::Namespace {
                backend: Some(pb::namespace::Backend::Ram(pb::RamBackend {
                    size_bytes: 4096,
                })),
                ..Default::default()
            }),
        }))
        .await
        .unwrap();
        let got = api
            .get_namespace(Request::new(pb::GetNamespaceRequest {
                name: made.name.clone(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.size_bytes, 7 << 20);
        let listed = api
            .list_namespaces(Request::new(pb::ListNamespacesRequest {
                parent: "subsystems/s".into(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        let sizes: Vec<u64> = listed.namespaces.iter().map(|n| n.size_bytes).collect();
        assert_eq!(sizes, [7 << 20, 4096]);
        // And how each is served: the image's cluster out of reach.
        let states: Vec<_> = listed.namespaces.iter().map(|n| n.state()).collect();
        assert_eq!(
            states,
            [pb::NamespaceState::Unreachable, pb::NamespaceState::Serving]
        );
    }

    /// Probes on monitors that do not answer take a few threads, no more:
    /// a client asking for another meanwhile is refused at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn probes_at_once_are_bounded() {
        use std::sync::atomic::Ordering;
        let (api, ceph, _state) = api(false);
        ceph.stall.store(true, Ordering::Release);
        let held: Vec<_> = (0..PROBES_AT_ONCE)
            .map(|i| {
                let api = api.clone();
                tokio::spawn(async move { api.create_cluster(create(&format!("c{i}"), KEY)).await })
            })
            .collect();
        let t = std::time::Instant::now();
        while ceph.seen.lock().unwrap().len() < PROBES_AT_ONCE {
            assert!(t.elapsed() < Duration::from_secs(10), "the probes started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let e = api.create_cluster(create("more", KEY)).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("clusters/more"), "{}", e.message());
        assert_eq!(
            ceph.seen.lock().unwrap().len(),
            PROBES_AT_ONCE,
            "never probed"
        );
        ceph.stall.store(false, Ordering::Release);
        for h in held {
            h.await
                .unwrap()
                .expect("the held probes end and their clusters are made");
        }
        api.create_cluster(create("more", KEY))
            .await
            .expect("room again");
    }
}
