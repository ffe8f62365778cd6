//! The checks a namespace backed by a remote NVMe/TCP namespace makes
//! before it is stored: the state's ([`crate::model::State::check_remote`]),
//! then the probe's ([`StoreProbe::probe_remote`]), which opens the remote
//! namespace as the target would. So a remote that answers on none of its
//! paths, refuses the host or its secret, or lacks the namespace is
//! answered at the call (FAILED_PRECONDITION naming its addresses), as an
//! RBD image that does not exist is, not found later by the target; and
//! the target, which applies every storage change in turn, never waits on
//! a remote that was down from the start.
//!
//! The probe shares the storage clusters' bound ([`super::cluster::PROBES_AT_ONCE`]),
//! and the call waits for it at most [`RemoteNamespace::open_bound`] and
//! 5 s more.

use std::time::Duration;

use super::{Api, StoreProbe};
use crate::error::Result;
use crate::model::{Backend, Namespace, RemoteNamespace};

/// Slack on top of [`RemoteNamespace::open_bound`] before a call stops
/// waiting for a probe.
const PROBE_SLACK: Duration = Duration::from_secs(5);

impl Api {
    /// Checks a remote backend of a namespace to create in subsystem
    /// `sid`, beside the state's own checks (which run again when it is
    /// stored): the subsystem exists, the remote namespace backs no other
    /// namespace, and the probe opens it and finds room for a block of
    /// `ns.block_size`. Other backends pass.
    ///
    /// # Errors
    /// NOT_FOUND for an unknown subsystem, ALREADY_EXISTS for a remote
    /// namespace in use, FAILED_PRECONDITION naming the remote namespace
    /// and its addresses when it cannot be opened or served,
    /// RESOURCE_EXHAUSTED when too many probes run.
    pub(super) async fn check_remote(&self, sid: &str, ns: &Namespace) -> Result<()> {
        let Backend::Remote(r) = &ns.backend else {
            return Ok(());
        };
        {
            let state = self.ctl.state.snapshot();
            state.subsystem(sid)?;
            state.check_remote(sid, &ns.backend)?;
        }
        let name = probe_name(r);
        let limit = r.open_bound() + PROBE_SLACK;
        let silent = format!("no path answered within {} s", limit.as_secs());
        let (r, block_size) = (r.clone(), ns.block_size);
        self.run_probe(&name, limit, silent, move |p: &dyn StoreProbe| {
            p.probe_remote(&r, block_size)
        })
        .await?;
        Ok(())
    }
}

/// How a refusal names remote namespace `r`: its NSID, its subsystem and
/// every address.
fn probe_name(r: &RemoteNamespace) -> String {
    format!(
        "remote namespace {} of {} at {}",
        r.nsid,
        r.subnqn,
        r.addresses()
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use dpu_proto::v1 as pb;
    use dpu_proto::v1::storage_service_server::StorageService;
    use tonic::{Code, Request};

    use super::*;
    use crate::model::Cluster;
    use crate::service::cluster::PROBES_AT_ONCE;
    use crate::service::testing::HOST_NQN;
    use crate::service::ServedNamespaces;
    use crate::store::StateHandle;

    const SECRET: &str = "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:";
    const FAR: &str = "nqn.2024-01.io.example:far";

    /// A stand-in remote target: it answers unless `down`, serves 4 KiB
    /// blocks, and records what it was asked to open.
    #[derive(Debug, Default)]
    struct Far {
        down: AtomicBool,
        /// Probes wait while set, as on a remote that does not answer.
        stall: AtomicBool,
        seen: Mutex<Vec<(RemoteNamespace, u32)>>,
    }

    impl StoreProbe for Far {
        fn probe_cluster(&self, _: &Cluster) -> std::result::Result<(), String> {
            Err("no clusters here".into())
        }

        fn probe_image(&self, _: &Cluster, _: &str, _: &str) -> std::result::Result<u64, String> {
            Err("no clusters here".into())
        }

        fn probe_remote(
            &self,
            r: &RemoteNamespace,
            block_size: u32,
        ) -> std::result::Result<(), String> {
            self.seen.lock().unwrap().push((r.clone(), block_size));
            let t = std::time::Instant::now();
            while self.stall.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(5));
            }
            if self.down.load(Ordering::Acquire) {
                return Err(r
                    .paths
                    .iter()
                    .map(|p| format!("connect to {p}: Connection refused (os error 111)"))
                    .collect::<Vec<_>>()
                    .join("; "));
            }
            if block_size < 4096 {
                return Err(format!(
                    "block size {block_size} is not a multiple of the remote's 4096"
                ));
            }
            Ok(())
        }

        fn probe_remote_namespaces(
            &self,
            paths: &[std::net::SocketAddr],
            _: &str,
            _: &str,
            _: Duration,
        ) -> std::result::Result<Vec<crate::service::RemoteNamespaceInfo>, String> {
            Err(format!("{paths:?}: not listed here"))
        }
    }

    /// What the target serves: every namespace at 7 MiB; namespace 1's
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

    fn api_over(state: &StateHandle, served: bool) -> (Api, Arc<Far>) {
        let far = Arc::new(Far::default());
        let api = Api::with_probe_for_tests(
            state.clone(),
            far.clone(),
            served.then(|| Arc::new(Served) as Arc<dyn ServedNamespaces>),
        );
        (api, far)
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

    fn remote(nsid: u32, secret: &str) -> Request<pb::CreateNamespaceRequest> {
        Request::new(pb::CreateNamespaceRequest {
            parent: "subsystems/s".into(),
            namespace: Some(pb::Namespace {
                backend: Some(pb::namespace::Backend::Remote(pb::RemoteBackend {
                    paths: vec!["127.0.0.1:4420".into(), "[::1]:4421".into()],
                    subnqn: FAR.into(),
                    nsid,
                    dhchap_secret: secret.into(),
                    ..Default::default()
                })),
                block_size: 4096,
                ..Default::default()
            }),
        })
    }

    fn get(nsid: u32) -> Request<pb::GetNamespaceRequest> {
        Request::new(pb::GetNamespaceRequest {
            name: format!("subsystems/s/namespaces/{nsid}"),
        })
    }

    /// A remote that answers on none of its paths is refused at the call,
    /// naming every address, and nothing is stored; one that answers is
    /// stored with the service's host NQN, opened with its secret.
    #[tokio::test]
    async fn a_remote_is_opened_before_it_is_stored() {
        let state = StateHandle::open(None).unwrap();
        let (api, far) = api_over(&state, false);
        subsystem(&api).await;
        far.down.store(true, Ordering::Release);
        let e = api.create_namespace(remote(1, SECRET)).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(
            e.message().starts_with(
                "remote namespace 1 of nqn.2024-01.io.example:far at 127.0.0.1:4420, [::1]:4421: "
            ),
            "{}",
            e.message()
        );
        assert!(e.message().contains("connect to [::1]:4421"), "{e:?}");
        assert!(!e.message().contains(&SECRET[10..40]), "{e:?}");
        assert!(state.snapshot().subsystems["s"].namespaces.is_empty());
        // Refused by the probe for what only the remote knows.
        far.down.store(false, Ordering::Release);
        let mut small = remote(1, "");
        small.get_mut().namespace.as_mut().unwrap().block_size = 512;
        let e = api.create_namespace(small).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("multiple of the remote's"), "{e:?}");

        let made = api
            .create_namespace(remote(1, SECRET))
            .await
            .unwrap()
            .into_inner();
        let Some(pb::namespace::Backend::Remote(r)) = &made.backend else {
            panic!("{made:?}")
        };
        assert_eq!(r.host_nqn, HOST_NQN);
        assert_eq!((r.dhchap_secret.as_str(), r.dhchap_secret_set), ("", true));
        assert_eq!(
            (r.io_timeout_ms, r.connect_timeout_ms, r.queue_depth),
            (10_000, 3_000, 128)
        );
        let (opened, block_size) = far.seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(block_size, 4096);
        assert_eq!(opened.host_nqn, HOST_NQN);
        assert_eq!(opened.dhchap_secret.unwrap().expose(), SECRET);
        // Checked against the state before the probe: one remote
        // namespace backs one namespace.
        let probes = far.seen.lock().unwrap().len();
        let e = api.create_namespace(remote(1, "")).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists);
        assert!(e.message().contains("subsystems/s/namespaces/1"), "{e:?}");
        let mut elsewhere = remote(2, "");
        elsewhere.get_mut().parent = "subsystems/nope".into();
        let e = api.create_namespace(elsewhere).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        assert_eq!(far.seen.lock().unwrap().len(), probes, "not probed");
        // Its size is the remote's.
        let e = api
            .resize_namespace(Request::new(pb::ResizeNamespaceRequest {
                name: made.name.clone(),
                size_bytes: 1 << 20,
            }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
    }

    /// The secret is persisted (the state file holds it, and a restart
    /// reads it back) and never answered: Get and List show only that one
    /// is set, and the host NQN used.
    #[tokio::test]
    async fn the_secret_is_persisted_and_never_answered() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateHandle::open(Some(dir.path())).unwrap();
        let (api, _far) = api_over(&state, false);
        subsystem(&api).await;
        api.create_namespace(remote(1, SECRET)).await.unwrap();
        api.create_namespace(remote(2, "")).await.unwrap();
        let listed = api
            .list_namespaces(Request::new(pb::ListNamespacesRequest {
                parent: "subsystems/s".into(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        let got = api.get_namespace(get(1)).await.unwrap().into_inner();
        for n in listed.namespaces.iter().chain([&got]) {
            let shown = format!("{n:?}");
            assert!(!shown.contains(&SECRET[10..40]), "{shown}");
            let Some(pb::namespace::Backend::Remote(r)) = &n.backend else {
                panic!("{n:?}")
            };
            assert_eq!(r.host_nqn, HOST_NQN);
            assert_eq!(r.dhchap_secret_set, n.nsid == 1);
        }
        let before = state.snapshot();
        drop(api);
        drop(state);
        // The journal's records are binary-framed JSON.
        let on_disk: String = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|f| {
                String::from_utf8_lossy(&std::fs::read(f.unwrap().path()).unwrap()).into_owned()
            })
            .collect();
        assert!(on_disk.contains(SECRET), "the state files keep the secret");
        let back = StateHandle::open(Some(dir.path())).unwrap();
        assert_eq!(*back.snapshot(), *before);
        let Backend::Remote(r) = &back.snapshot().subsystems["s"].namespaces[&1].backend else {
            panic!("not remote")
        };
        assert_eq!(r.dhchap_secret.as_ref().unwrap().expose(), SECRET);
        assert_eq!(back.snapshot().index_drift(), None);
    }

    /// Get and List show the size the target serves a remote namespace
    /// with, and how: SERVING, or UNREACHABLE while the remote does not
    /// answer, as for RBD namespaces.
    #[tokio::test]
    async fn get_shows_how_the_target_serves_it() {
        let state = StateHandle::open(None).unwrap();
        let (api, _far) = api_over(&state, true);
        subsystem(&api).await;
        let made = api
            .create_namespace(remote(1, ""))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(made.size_bytes, 7 << 20);
        api.create_namespace(remote(2, "")).await.unwrap();
        let mut got = Vec::new();
        for nsid in [1, 2] {
            let n = api.get_namespace(get(nsid)).await.unwrap().into_inner();
            assert_eq!(n.size_bytes, 7 << 20);
            got.push(n.state());
        }
        assert_eq!(
            got,
            [pb::NamespaceState::Unreachable, pb::NamespaceState::Serving]
        );
    }

    /// Probes of remotes that do not answer share the bound of cluster
    /// probes: a client asking for another meanwhile is refused at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn remote_probes_at_once_are_bounded() {
        let state = StateHandle::open(None).unwrap();
        let (api, far) = api_over(&state, false);
        subsystem(&api).await;
        far.stall.store(true, Ordering::Release);
        let held: Vec<_> = (1..=PROBES_AT_ONCE)
            .map(|i| {
                let api = api.clone();
                let nsid = u32::try_from(i).unwrap();
                tokio::spawn(async move { api.create_namespace(remote(nsid, "")).await })
            })
            .collect();
        let t = std::time::Instant::now();
        while far.seen.lock().unwrap().len() < PROBES_AT_ONCE {
            assert!(t.elapsed() < Duration::from_secs(10), "the probes started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let e = api.create_namespace(remote(99, "")).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(
            e.message().contains("remote namespace 99"),
            "{}",
            e.message()
        );
        far.stall.store(false, Ordering::Release);
        for h in held {
            h.await.unwrap().expect("the held probes end");
        }
        api.create_namespace(remote(99, ""))
            .await
            .expect("room again");
    }
}
