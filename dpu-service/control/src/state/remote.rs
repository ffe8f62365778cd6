//! The checks a namespace backed by a remote NVMe/TCP namespace makes
//! against the state: one remote namespace backs one namespace, and a
//! subsystem is not its own remote.

use crate::error::{ControlError, Result};
use crate::model::{namespace_name, Backend, State};

impl State {
    /// Checks a remote backend of a namespace to create in subsystem `id`:
    /// the remote namespace backs no other namespace (ALREADY_EXISTS
    /// naming that one: two namespaces on one store would each cache and
    /// order writes of their own), and the remote subsystem is not `id`
    /// itself (FAILED_PRECONDITION: its I/O would wait on itself). Other
    /// backends pass.
    pub fn check_remote(&self, id: &str, b: &Backend) -> Result<()> {
        let Backend::Remote(r) = b else {
            return Ok(());
        };
        if let Some((sid, nsid)) = self.index.remote_user(&r.subnqn, r.nsid) {
            return Err(ControlError::AlreadyExists(format!(
                "namespace {} of remote subsystem {} already backs {}",
                r.nsid,
                r.subnqn,
                namespace_name(sid, nsid)
            )));
        }
        if self.index.nqn_holder(&r.subnqn) == Some(id) {
            return Err(ControlError::FailedPrecondition(format!(
                "namespace.remote.subnqn: {} is the NQN of subsystems/{id} itself",
                r.subnqn
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::error::ControlError;
    use crate::model::{Backend, Namespace, RemoteNamespace, State, Subsystem};
    use crate::state::Limits;

    const LIM: Limits = Limits::with_ram(0);

    fn subsystem(id: &str) -> Subsystem {
        crate::state::tests::subsystem(id, &format!("nqn.2024-01.io.example:{id}"), true, 8)
    }

    fn remote(subnqn: &str, nsid: u32) -> Namespace {
        Namespace {
            namespace_id: String::new(),
            eui64: None,
            nsid: 0,
            backend: Backend::Remote(RemoteNamespace {
                paths: vec!["10.0.0.1:4420".parse().unwrap()],
                subnqn: subnqn.into(),
                nsid,
                host_nqn: "nqn.2024-01.io.example:host".into(),
                dhchap_secret: None,
                io_timeout_ms: 10_000,
                connect_timeout_ms: 5_000,
                queue_depth: 128,
            }),
            block_size: 512,
            uuid: [0; 16],
            nguid: [0; 16],
            qos: Default::default(),
        }
    }

    #[test]
    fn one_remote_namespace_backs_one_namespace() {
        let mut s = State::default();
        s.create_subsystem(LIM, subsystem("a")).unwrap();
        s.create_subsystem(LIM, subsystem("b")).unwrap();
        let far = "nqn.2024-01.io.example:far";
        s.create_namespace(LIM, "a", remote(far, 1), false, false)
            .unwrap();
        // The same remote namespace again, from any subsystem, is taken.
        for sub in ["a", "b"] {
            assert_eq!(
                s.create_namespace(LIM, sub, remote(far, 1), false, false)
                    .unwrap_err(),
                ControlError::AlreadyExists(
                    "namespace 1 of remote subsystem nqn.2024-01.io.example:far already \
                     backs subsystems/a/namespaces/1"
                        .into()
                )
            );
        }
        // Another namespace of the remote, or another subsystem of ours
        // (served by this service, reached over the network) are not.
        s.create_namespace(LIM, "a", remote(far, 2), false, false)
            .unwrap();
        s.create_namespace(
            LIM,
            "a",
            remote("nqn.2024-01.io.example:b", 1),
            false,
            false,
        )
        .unwrap();
        // A subsystem is not its own remote.
        let e = s
            .create_namespace(
                LIM,
                "b",
                remote("nqn.2024-01.io.example:b", 2),
                false,
                false,
            )
            .unwrap_err();
        assert!(
            matches!(&e, ControlError::FailedPrecondition(m) if m.contains("subsystems/b itself")),
            "{e:?}"
        );
        // Its size is the remote's.
        assert!(matches!(
            s.resize_namespace(LIM, "a", 1, 1 << 20),
            Err(ControlError::FailedPrecondition(m)) if m.contains("remote")
        ));
        // Deleting the namespace frees the remote one.
        s.delete_namespace("a", 1).unwrap();
        s.create_namespace(LIM, "b", remote(far, 1), false, false)
            .unwrap();
        assert_eq!(s.index_drift(), None);
        s.delete_subsystem("b", true).unwrap();
        assert_eq!(s.index_drift(), None);
        s.create_namespace(LIM, "a", remote(far, 1), false, false)
            .unwrap();
        // A state read back indexes its remote namespaces.
        let mut back: State = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.index_drift(), None);
        assert!(matches!(
            back.create_namespace(LIM, "a", remote(far, 1), false, false),
            Err(ControlError::AlreadyExists(_))
        ));
    }
}
