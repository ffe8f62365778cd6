//! Storage-cluster transitions: registering, changing and deleting the
//! Ceph clusters whose RBD images back namespaces, and the checks an RBD
//! namespace makes against them.

use crate::error::{ControlError, Result};
use crate::model::{cluster_name, namespace_name, Backend, CephKey, Cluster, State};
use crate::validate::MAX_CLUSTERS;

/// Changes to a storage cluster; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct ClusterUpdate {
    /// New monitor addresses.
    pub mon_host: Option<String>,
    /// New cephx user.
    pub user: Option<String>,
    /// New key (`Some(None)`: no cephx).
    pub key: Option<Option<CephKey>>,
    /// New I/O bound, seconds.
    pub op_timeout_secs: Option<u32>,
    /// New connect bound, seconds.
    pub connect_timeout_secs: Option<u32>,
}

impl ClusterUpdate {
    /// `c` with this update applied.
    pub fn applied_to(&self, c: &Cluster) -> Cluster {
        let mut c = c.clone();
        if let Some(m) = &self.mon_host {
            c.mon_host.clone_from(m);
        }
        if let Some(u) = &self.user {
            c.user.clone_from(u);
        }
        if let Some(k) = &self.key {
            c.key.clone_from(k);
        }
        if let Some(t) = self.op_timeout_secs {
            c.op_timeout_secs = t;
        }
        if let Some(t) = self.connect_timeout_secs {
            c.connect_timeout_secs = t;
        }
        c
    }
}

impl State {
    /// The storage cluster with `id`, or NOT_FOUND.
    pub fn cluster(&self, id: &str) -> Result<&Cluster> {
        self.clusters
            .get(id)
            .ok_or_else(|| ControlError::NotFound(cluster_name(id)))
    }

    /// Registers a storage cluster; at most [`MAX_CLUSTERS`].
    pub fn create_cluster(&mut self, c: Cluster) -> Result<&Cluster> {
        if self.clusters.contains_key(&c.id) {
            return Err(ControlError::AlreadyExists(format!(
                "{} already exists",
                cluster_name(&c.id)
            )));
        }
        let n = self.clusters.len() + 1;
        if n > MAX_CLUSTERS {
            return Err(ControlError::exhausted(
                "a fixed bound",
                MAX_CLUSTERS,
                format!("{n} storage clusters"),
            ));
        }
        let id = c.id.clone();
        self.clusters.insert(id.clone(), c);
        self.cluster(&id)
    }

    /// Changes storage cluster `id`; the namespaces on it reconnect with
    /// the new settings.
    pub fn update_cluster(&mut self, id: &str, u: &ClusterUpdate) -> Result<&Cluster> {
        let c = u.applied_to(self.cluster(id)?);
        self.clusters.insert(id.to_string(), c);
        self.cluster(id)
    }

    /// Deletes storage cluster `id`, which no namespace may use:
    /// FAILED_PRECONDITION naming one that does.
    pub fn delete_cluster(&mut self, id: &str) -> Result<()> {
        self.cluster(id)?;
        if let Some((sid, nsid)) = self.index.cluster_user(id) {
            let others = match self.index.cluster_users(id).saturating_sub(1) {
                0 => "; delete it first".to_string(),
                1 => " and 1 other namespace; delete them first".to_string(),
                n => format!(" and {n} other namespaces; delete them first"),
            };
            return Err(ControlError::FailedPrecondition(format!(
                "{} backs {}{others}",
                cluster_name(id),
                namespace_name(sid, nsid)
            )));
        }
        self.clusters.remove(id);
        Ok(())
    }

    /// Namespaces backed by images of cluster `id`.
    pub fn cluster_namespaces(&self, id: &str) -> usize {
        self.index.cluster_users(id)
    }

    /// Checks an RBD backend of a namespace to create: its cluster exists
    /// (NOT_FOUND naming it) and its image backs no other namespace
    /// (ALREADY_EXISTS naming that one). Other backends pass.
    pub fn check_image(&self, b: &Backend) -> Result<()> {
        let Backend::Rbd {
            cluster,
            pool,
            image,
        } = b
        else {
            return Ok(());
        };
        self.cluster(cluster)?;
        if let Some((sid, nsid)) = self.index.image_user(cluster, pool, image) {
            return Err(ControlError::AlreadyExists(format!(
                "image {pool}/{image} of {} already backs {}",
                cluster_name(cluster),
                namespace_name(sid, nsid)
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Namespace, Subsystem, Timestamp};
    use crate::state::{Limits, Part};
    use crate::store::StateHandle;

    const KEY: &str = "AQCAmWZmQOIBABAAEBESExQVFhcYGRobHB0eHw==";

    pub(crate) fn ceph(id: &str) -> Cluster {
        Cluster {
            id: id.into(),
            mon_host: "10.0.0.1:6789".into(),
            user: "dpu".into(),
            key: crate::validate::cephx_key("key", KEY).unwrap(),
            op_timeout_secs: 20,
            connect_timeout_secs: 10,
            create_time: Timestamp::now(),
        }
    }

    fn subsystem(id: &str) -> Subsystem {
        crate::state::tests::subsystem(id, &format!("nqn.2024-01.io.example:{id}"), true, 8)
    }

    fn rbd(cluster: &str, image: &str) -> Namespace {
        Namespace {
            namespace_id: String::new(),
            eui64: None,
            nsid: 0,
            backend: Backend::Rbd {
                cluster: cluster.into(),
                pool: "rbd".into(),
                image: image.into(),
            },
            block_size: 512,
            uuid: [0; 16],
            nguid: [0; 16],
            qos: Default::default(),
        }
    }

    const LIM: Limits = Limits::with_ram(0);

    #[test]
    fn clusters_and_the_namespaces_on_them() {
        let mut s = State::default();
        s.create_subsystem(LIM, subsystem("a")).unwrap();
        // A namespace names a cluster that exists.
        assert!(matches!(
            s.create_namespace(LIM, "a", rbd("ceph1", "vol1"), false, false),
            Err(ControlError::NotFound(m)) if m == "clusters/ceph1"
        ));
        s.create_cluster(ceph("ceph1")).unwrap();
        assert!(matches!(
            s.create_cluster(ceph("ceph1")),
            Err(ControlError::AlreadyExists(_))
        ));
        s.create_namespace(LIM, "a", rbd("ceph1", "vol1"), false, false)
            .unwrap();
        // One image, one namespace; the same name on another cluster is
        // another image.
        let e = s
            .create_namespace(LIM, "a", rbd("ceph1", "vol1"), false, false)
            .unwrap_err();
        assert_eq!(
            e,
            ControlError::AlreadyExists(
                "image rbd/vol1 of clusters/ceph1 already backs subsystems/a/namespaces/1".into()
            )
        );
        s.create_cluster(ceph("ceph2")).unwrap();
        s.create_namespace(LIM, "a", rbd("ceph2", "vol1"), false, false)
            .unwrap();
        s.create_namespace(LIM, "a", rbd("ceph1", "vol2"), false, false)
            .unwrap();
        assert_eq!(s.cluster_namespaces("ceph1"), 2);
        // Its size is the image's.
        assert!(matches!(
            s.resize_namespace(LIM, "a", 1, 1 << 20),
            Err(ControlError::FailedPrecondition(m)) if m.contains("rbd resize")
        ));
        // A cluster in use stays, naming a namespace on it.
        let e = s.delete_cluster("ceph1").unwrap_err();
        assert_eq!(
            e,
            ControlError::FailedPrecondition(
                "clusters/ceph1 backs subsystems/a/namespaces/1 and 1 other namespace; \
                 delete them first"
                    .into()
            )
        );
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        s.delete_namespace("a", 1).unwrap();
        assert_eq!(
            s.delete_cluster("ceph1").unwrap_err().to_string(),
            "clusters/ceph1 backs subsystems/a/namespaces/3; delete it first"
        );
        s.delete_namespace("a", 3).unwrap();
        assert_eq!(s.index_drift(), None);
        s.delete_cluster("ceph1").unwrap();
        assert!(matches!(
            s.delete_cluster("ceph1"),
            Err(ControlError::NotFound(m)) if m == "clusters/ceph1"
        ));
        // Deleting a subsystem frees its images.
        s.delete_subsystem("a", true).unwrap();
        s.delete_cluster("ceph2").unwrap();
        assert_eq!(s.index_drift(), None);
    }

    #[test]
    fn a_deleted_rbd_namespace_comes_back_only_to_its_cluster() {
        let mut s = State::default();
        s.create_subsystem(LIM, subsystem("a")).unwrap();
        s.create_cluster(ceph("ceph1")).unwrap();
        let ns = s
            .create_namespace(LIM, "a", rbd("ceph1", "vol1"), false, false)
            .unwrap()
            .clone();
        let before = s.clone();
        s.delete_namespace("a", ns.nsid).unwrap();
        let after = s.clone();
        let part = Part::Namespace {
            subsystem: "a".into(),
            nsid: ns.nsid,
        };
        let mut gone = s.clone();
        gone.delete_cluster("ceph1").unwrap();
        assert!(matches!(
            gone.revert(LIM, &part, &before, &after),
            Err(ControlError::NotFound(_))
        ));
        s.revert(LIM, &part, &before, &after).unwrap();
        assert_eq!(s.subsystems["a"].namespaces[&ns.nsid], ns);
    }

    #[test]
    fn clusters_are_bounded() {
        let mut s = State::default();
        for i in 0..MAX_CLUSTERS {
            s.create_cluster(ceph(&format!("c{i}"))).unwrap();
        }
        let e = s.create_cluster(ceph("one-more")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
        assert_eq!(
            e.to_string(),
            "65 storage clusters: the limit is 64 (a fixed bound)"
        );
        assert_eq!(s.clusters.len(), MAX_CLUSTERS);
    }

    #[test]
    fn updates_change_what_they_name() {
        let mut s = State::default();
        s.create_cluster(ceph("ceph1")).unwrap();
        let u = ClusterUpdate {
            key: Some(None),
            op_timeout_secs: Some(5),
            ..Default::default()
        };
        let c = s.update_cluster("ceph1", &u).unwrap();
        assert_eq!((c.key.is_none(), c.op_timeout_secs), (true, 5));
        assert_eq!(
            (c.mon_host.as_str(), c.connect_timeout_secs),
            ("10.0.0.1:6789", 10)
        );
        assert!(matches!(
            s.update_cluster("nope", &u),
            Err(ControlError::NotFound(_))
        ));
    }

    /// A cluster's key is kept as a host secret is: in the state file and
    /// journal (mode 0600), back after a restart, and in no `Debug`.
    #[test]
    fn keys_are_persisted_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateHandle::open(Some(dir.path())).unwrap();
        state
            .mutate_blocking(|s| s.create_cluster(ceph("ceph1")).map(drop))
            .unwrap();
        state
            .mutate_blocking(|s| {
                s.create_subsystem(LIM, subsystem("a"))?;
                s.create_namespace(LIM, "a", rbd("ceph1", "vol1"), false, false)
                    .map(drop)
            })
            .unwrap();
        let rotated: &str = "AQCAmWZmQOIBABAAICEiIyQlJicoKSorLC0uLw==";
        state
            .mutate_blocking(|s| {
                let u = ClusterUpdate {
                    key: Some(crate::validate::cephx_key("key", rotated)?),
                    ..Default::default()
                };
                s.update_cluster("ceph1", &u).map(drop)
            })
            .unwrap();
        let journal = std::fs::read(dir.path().join(crate::store::JOURNAL_FILE)).unwrap();
        assert!(String::from_utf8_lossy(&journal).contains(rotated));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(crate::store::JOURNAL_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let kept = state.snapshot();
        drop(state);
        let back = StateHandle::open(Some(dir.path())).unwrap().snapshot();
        assert_eq!(*back, *kept);
        let c = back.cluster("ceph1").unwrap();
        assert_eq!(c.key.as_ref().unwrap().expose(), rotated);
        assert_eq!(back.index_drift(), None, "images are indexed on reload");
        assert!(matches!(
            back.check_image(&rbd("ceph1", "vol1").backend),
            Err(ControlError::AlreadyExists(_))
        ));
        assert!(!format!("{back:?}").contains(&rotated[..20]));
        // Deleted, the cluster is gone after a restart too.
        let state = StateHandle::open(Some(dir.path())).unwrap();
        state
            .mutate_blocking(|s| {
                s.delete_subsystem("a", true)?;
                s.delete_cluster("ceph1")
            })
            .unwrap();
        drop(state);
        let back = StateHandle::open(Some(dir.path())).unwrap().snapshot();
        assert!(back.clusters.is_empty());
    }

    /// A state file written before clusters existed reads as one without.
    #[test]
    fn older_states_have_no_clusters() {
        let old = r#"{"tenants":{},"subsystems":{},"id_seq":3}"#;
        let s: State = serde_json::from_str(old).unwrap();
        assert!(s.clusters.is_empty());
        assert_eq!(s.id_seq, 3);
        // Nor does a state without clusters write any.
        assert!(!serde_json::to_string(&s).unwrap().contains("clusters"));
    }
}
