//! Remote controllers: how to reach a remote NVMe/TCP subsystem (its
//! paths, the NQN it has and the host NQN to connect with, the commands
//! in flight), kept by name so that namespaces backed by its namespaces
//! can be made by naming it, as OPI's `NvmeRemoteController` models it.
//!
//! A controller with paths names one remote subsystem: every path has the
//! same subsystem NQN and the same host NQN. A namespace made from a
//! controller copies the controller's paths, NQNs and queue depth into its
//! own remote backend ([`super::RemoteNamespace`]) when it is made, so a
//! controller changed afterwards does not change the namespaces made
//! before; while a namespace is backed by its subsystem, the controller
//! cannot be deleted, nor its last path, nor its subsystem NQN changed.
//!
//! The transitions ([`State::create_remote_controller`] ..
//! [`State::delete_remote_path`]) live here beside the model.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::{namespace_name, State};
use crate::error::{ControlError, Result};

/// Most remote controllers the service keeps.
pub const MAX_REMOTE_CONTROLLERS: usize = 1024;

/// Most paths of one remote controller: the remote backend's
/// [`dpu_nvmeof::target::MAX_REMOTE_PATHS`].
pub const MAX_CONTROLLER_PATHS: usize = dpu_nvmeof::target::MAX_REMOTE_PATHS;

/// A remote NVMe/TCP subsystem and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteController {
    /// Controller ID.
    pub id: String,
    /// Most commands in flight to the remote at once, for namespaces made
    /// from it (2 ..= 1024).
    pub queue_depth: u16,
    /// Its paths by path ID; namespaces made from it try them in path-ID
    /// order (0 ..= [`MAX_CONTROLLER_PATHS`]).
    #[serde(default)]
    pub paths: BTreeMap<String, RemotePath>,
}

/// One path to a remote subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemotePath {
    /// The remote's NVMe/TCP address and port.
    pub addr: SocketAddr,
    /// The remote subsystem's NQN (the same on every path of a
    /// controller).
    pub subnqn: String,
    /// The host NQN connected with (the same on every path of a
    /// controller).
    pub host_nqn: String,
}

impl RemoteController {
    /// The remote subsystem's NQN; `None` while it has no path.
    pub fn subnqn(&self) -> Option<&str> {
        self.paths.values().next().map(|p| p.subnqn.as_str())
    }

    /// The host NQN its paths connect with; `None` while it has no path.
    pub fn host_nqn(&self) -> Option<&str> {
        self.paths.values().next().map(|p| p.host_nqn.as_str())
    }

    /// Its paths' addresses in path-ID order.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.paths.values().map(|p| p.addr).collect()
    }
}

/// The resource name of remote controller `id`, as OPI names it.
pub fn remote_controller_name(id: &str) -> String {
    format!("nvmeRemoteControllers/{id}")
}

impl State {
    /// The remote controller with `id`, or NOT_FOUND.
    pub fn remote_controller(&self, id: &str) -> Result<&RemoteController> {
        self.remote_controllers
            .get(id)
            .ok_or_else(|| ControlError::NotFound(remote_controller_name(id)))
    }

    /// The namespace backed by a namespace of the remote subsystem
    /// `subnqn`, if any, by its resource name.
    pub fn remote_subsystem_user(&self, subnqn: &str) -> Option<String> {
        self.index
            .remote_subsystem_user(subnqn)
            .map(|(sid, nsid)| namespace_name(sid, nsid))
    }

    /// Creates remote controller `c` (at most
    /// [`MAX_REMOTE_CONTROLLERS`]), with the paths it has (checked as
    /// [`State::put_remote_path`] checks one).
    ///
    /// # Errors
    /// ALREADY_EXISTS for a taken ID, RESOURCE_EXHAUSTED past the cap.
    pub fn create_remote_controller(&mut self, c: RemoteController) -> Result<&RemoteController> {
        if self.remote_controllers.contains_key(&c.id) {
            return Err(ControlError::AlreadyExists(format!(
                "{} already exists",
                remote_controller_name(&c.id)
            )));
        }
        let n = self.remote_controllers.len() + 1;
        if n > MAX_REMOTE_CONTROLLERS {
            return Err(ControlError::exhausted(
                "remote controllers",
                MAX_REMOTE_CONTROLLERS,
                format!("{n} remote controllers"),
            ));
        }
        check_paths(&c)?;
        let id = c.id.clone();
        Ok(self.remote_controllers.entry(id).or_insert(c))
    }

    /// Sets the queue depth of remote controller `id`.
    ///
    /// # Errors
    /// NOT_FOUND.
    pub fn set_remote_queue_depth(&mut self, id: &str, depth: u16) -> Result<&RemoteController> {
        self.remote_controller(id)?;
        let c = self
            .remote_controllers
            .get_mut(id)
            .ok_or_else(|| ControlError::NotFound(remote_controller_name(id)))?;
        c.queue_depth = depth;
        Ok(c)
    }

    /// Deletes remote controller `id`.
    ///
    /// # Errors
    /// NOT_FOUND; FAILED_PRECONDITION naming the namespace while one is
    /// backed by a namespace of its subsystem.
    pub fn delete_remote_controller(&mut self, id: &str) -> Result<()> {
        let c = self.remote_controller(id)?;
        if let Some(subnqn) = c.subnqn() {
            if let Some(user) = self.remote_subsystem_user(subnqn) {
                return Err(ControlError::FailedPrecondition(format!(
                    "{}: {user} is backed by a namespace of {subnqn}; delete it first",
                    remote_controller_name(id)
                )));
            }
        }
        self.remote_controllers.remove(id);
        Ok(())
    }

    /// Puts path `pid` of remote controller `cid`: a new one when
    /// `create`, else the existing one replaced.
    ///
    /// # Errors
    /// NOT_FOUND for an unknown controller (or path, when not `create`);
    /// ALREADY_EXISTS for a path ID taken (when `create`);
    /// RESOURCE_EXHAUSTED past [`MAX_CONTROLLER_PATHS`];
    /// FAILED_PRECONDITION for a subsystem or host NQN other than the
    /// controller's other paths have, an address another path has, or
    /// any path put while a namespace is backed by the controller's
    /// subsystem (it connects through the paths it was made with, which
    /// would no longer be the controller's).
    pub fn put_remote_path(
        &mut self,
        cid: &str,
        pid: &str,
        path: RemotePath,
        create: bool,
    ) -> Result<&RemotePath> {
        let c = self.remote_controller(cid)?;
        let name = format!("{}/nvmePaths/{pid}", remote_controller_name(cid));
        match (create, c.paths.contains_key(pid)) {
            (true, true) => {
                return Err(ControlError::AlreadyExists(format!(
                    "{name} already exists"
                )))
            }
            (false, false) => return Err(ControlError::NotFound(name)),
            _ => {}
        }
        if create && c.paths.len() >= MAX_CONTROLLER_PATHS {
            return Err(ControlError::exhausted(
                "paths of a remote controller",
                MAX_CONTROLLER_PATHS,
                format!(
                    "{} paths of {}",
                    c.paths.len() + 1,
                    remote_controller_name(cid)
                ),
            ));
        }
        if let Some(was) = c.subnqn() {
            if let Some(user) = self.remote_subsystem_user(was) {
                return Err(backed_paths_fixed(&name, &user, was));
            }
        }
        let mut next = c.clone();
        next.paths.insert(pid.to_string(), path);
        check_paths(&next)?;
        self.remote_controllers.insert(cid.to_string(), next);
        self.remote_controllers
            .get(cid)
            .and_then(|c| c.paths.get(pid))
            .ok_or(ControlError::NotFound(name))
    }

    /// Deletes path `pid` of remote controller `cid`.
    ///
    /// # Errors
    /// NOT_FOUND; FAILED_PRECONDITION while a namespace is backed by a
    /// namespace of the controller's subsystem (as for
    /// [`State::put_remote_path`]).
    pub fn delete_remote_path(&mut self, cid: &str, pid: &str) -> Result<()> {
        let c = self.remote_controller(cid)?;
        let name = format!("{}/nvmePaths/{pid}", remote_controller_name(cid));
        let Some(p) = c.paths.get(pid) else {
            return Err(ControlError::NotFound(name));
        };
        if let Some(user) = self.remote_subsystem_user(&p.subnqn) {
            return Err(backed_paths_fixed(&name, &user, &p.subnqn));
        }
        let mut next = c.clone();
        next.paths.remove(pid);
        self.remote_controllers.insert(cid.to_string(), next);
        Ok(())
    }
}

/// The refusal of a change to path `name` while namespace `user` is
/// backed by a namespace of `subnqn`. A namespace made from a controller
/// connects through the paths the controller had then; a path added,
/// moved or deleted afterwards would be shown as the controller's but not
/// used by the namespace, so no path changes under it: the namespace is
/// deleted first (and made again from the controller's new paths).
fn backed_paths_fixed(name: &str, user: &str, subnqn: &str) -> ControlError {
    ControlError::FailedPrecondition(format!(
        "{name}: {user} is backed by a namespace of {subnqn} and connects through the paths \
         it was made with; the controller's paths cannot change under it (delete the \
         namespace first)"
    ))
}

/// Checks that `c`'s paths name one subsystem, as one host, at distinct
/// addresses, and are at most [`MAX_CONTROLLER_PATHS`].
fn check_paths(c: &RemoteController) -> Result<()> {
    if c.paths.len() > MAX_CONTROLLER_PATHS {
        return Err(ControlError::exhausted(
            "paths of a remote controller",
            MAX_CONTROLLER_PATHS,
            format!(
                "{} paths of {}",
                c.paths.len(),
                remote_controller_name(&c.id)
            ),
        ));
    }
    let mut seen: Vec<(&str, &RemotePath)> = Vec::with_capacity(c.paths.len());
    for (id, p) in &c.paths {
        for (other, q) in &seen {
            if q.subnqn != p.subnqn {
                return Err(ControlError::FailedPrecondition(format!(
                    "nvme_path.fabrics.subnqn: {} differs from {}, which path {other} of {} \
                     has: a controller's paths reach one subsystem",
                    p.subnqn,
                    q.subnqn,
                    remote_controller_name(&c.id)
                )));
            }
            if q.host_nqn != p.host_nqn {
                return Err(ControlError::FailedPrecondition(format!(
                    "nvme_path.fabrics.hostnqn: {} differs from {}, which path {other} of {} \
                     connects as",
                    p.host_nqn,
                    q.host_nqn,
                    remote_controller_name(&c.id)
                )));
            }
            if q.addr == p.addr {
                return Err(ControlError::FailedPrecondition(format!(
                    "nvme_path.traddr: {} is path {other}'s address already (path {id})",
                    p.addr
                )));
            }
        }
        seen.push((id, p));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Backend, Namespace, RemoteNamespace};
    use crate::state::Limits;

    const FAR: &str = "nqn.2024-01.io.example:far";
    const ME: &str = "nqn.2024-01.io.example:me";

    fn path(addr: &str, subnqn: &str) -> RemotePath {
        RemotePath {
            addr: addr.parse().unwrap(),
            subnqn: subnqn.into(),
            host_nqn: ME.into(),
        }
    }

    fn controller(id: &str) -> RemoteController {
        RemoteController {
            id: id.into(),
            queue_depth: 128,
            paths: BTreeMap::new(),
        }
    }

    fn code(e: ControlError) -> tonic::Code {
        e.code()
    }

    #[test]
    fn paths_name_one_subsystem_and_are_at_most_four() {
        let mut s = State::default();
        s.create_remote_controller(controller("nvme0")).unwrap();
        assert_eq!(
            code(s.create_remote_controller(controller("nvme0")).unwrap_err()),
            tonic::Code::AlreadyExists
        );
        for i in 0..4 {
            s.put_remote_path(
                "nvme0",
                &format!("p{i}"),
                path(&format!("10.0.0.{}:4420", i + 1), FAR),
                true,
            )
            .unwrap();
        }
        let e = s
            .put_remote_path("nvme0", "p4", path("10.0.0.9:4420", FAR), true)
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
        assert!(
            e.to_string().contains("paths of a remote controller"),
            "{e}"
        );
        s.delete_remote_path("nvme0", "p3").unwrap();
        // Another subsystem, another host, an address taken.
        let e = s
            .put_remote_path(
                "nvme0",
                "p3",
                path("10.0.0.9:4420", "nqn.2024-01.io.example:other"),
                true,
            )
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(
            e.to_string().starts_with("nvme_path.fabrics.subnqn:"),
            "{e}"
        );
        let mut other_host = path("10.0.0.9:4420", FAR);
        other_host.host_nqn = "nqn.2024-01.io.example:you".into();
        let e = s
            .put_remote_path("nvme0", "p3", other_host, true)
            .unwrap_err();
        assert!(
            e.to_string().starts_with("nvme_path.fabrics.hostnqn:"),
            "{e}"
        );
        let e = s
            .put_remote_path("nvme0", "p3", path("10.0.0.1:4420", FAR), true)
            .unwrap_err();
        assert!(e.to_string().starts_with("nvme_path.traddr:"), "{e}");
        // Replacing the only path may change the subsystem while no
        // namespace uses it.
        let mut one = State::default();
        one.create_remote_controller(controller("c")).unwrap();
        one.put_remote_path("c", "a", path("10.0.0.1:4420", FAR), true)
            .unwrap();
        one.put_remote_path(
            "c",
            "a",
            path("10.0.0.1:4420", "nqn.2024-01.io.example:b"),
            false,
        )
        .unwrap();
        assert_eq!(
            one.remote_controller("c").unwrap().subnqn(),
            Some("nqn.2024-01.io.example:b")
        );
        assert_eq!(
            code(
                one.put_remote_path("c", "zz", path("10.0.0.2:4420", FAR), false)
                    .unwrap_err()
            ),
            tonic::Code::NotFound
        );
        assert_eq!(
            code(
                one.put_remote_path("x", "a", path("10.0.0.2:4420", FAR), true)
                    .unwrap_err()
            ),
            tonic::Code::NotFound
        );
    }

    #[test]
    fn controllers_are_capped() {
        let mut s = State::default();
        for i in 0..MAX_REMOTE_CONTROLLERS {
            s.create_remote_controller(controller(&format!("c{i}")))
                .unwrap();
        }
        let e = s
            .create_remote_controller(controller("one-more"))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.to_string().contains("remote controllers"), "{e}");
    }

    /// While a namespace is backed by the controller's subsystem, neither
    /// the controller nor any of its paths change.
    #[test]
    fn a_used_controller_stays() {
        let mut s = State::default();
        s.create_remote_controller(controller("nvme0")).unwrap();
        s.put_remote_path("nvme0", "a", path("10.0.0.1:4420", FAR), true)
            .unwrap();
        s.put_remote_path("nvme0", "b", path("10.0.0.2:4420", FAR), true)
            .unwrap();
        let lim = Limits::with_ram(0);
        let sub = crate::state::tests::subsystem("s", "nqn.2024-01.io.example:s", true, 8);
        s.create_subsystem(lim, sub).unwrap();
        let ns = Namespace {
            namespace_id: String::new(),
            eui64: None,
            nsid: 0,
            backend: Backend::Remote(RemoteNamespace {
                paths: vec!["10.0.0.1:4420".parse().unwrap()],
                subnqn: FAR.into(),
                nsid: 7,
                host_nqn: ME.into(),
                dhchap_secret: None,
                io_timeout_ms: 1_000,
                connect_timeout_ms: 1_000,
                queue_depth: 8,
            }),
            block_size: 512,
            uuid: [0; 16],
            nguid: [0; 16],
            qos: Default::default(),
        };
        s.create_namespace(lim, "s", ns, false, false).unwrap();
        assert_eq!(
            s.remote_subsystem_user(FAR).as_deref(),
            Some("subsystems/s/namespaces/1")
        );
        assert_eq!(s.remote_subsystem_user("nqn.2024-01.io.example:fa"), None);
        let e = s.delete_remote_controller("nvme0").unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.to_string().contains("subsystems/s/namespaces/1"), "{e}");
        // No path goes, comes or changes under it: the namespace would
        // not follow.
        for pid in ["a", "b"] {
            let e = s.delete_remote_path("nvme0", pid).unwrap_err();
            assert_eq!(e.code(), tonic::Code::FailedPrecondition);
            assert!(e.to_string().contains("subsystems/s/namespaces/1"), "{e}");
        }
        for (pid, p, create) in [
            (
                "b",
                path("10.0.0.2:4420", "nqn.2024-01.io.example:b"),
                false,
            ),
            ("b", path("10.0.0.3:4420", FAR), false),
            ("c", path("10.0.0.4:4420", FAR), true),
        ] {
            let e = s.put_remote_path("nvme0", pid, p, create).unwrap_err();
            assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
            assert!(e.to_string().contains("paths it was made with"), "{e}");
        }
        assert_eq!(s.remote_controller("nvme0").unwrap().paths.len(), 2);
        // A controller of another subsystem changes freely meanwhile.
        s.create_remote_controller(controller("nvme1")).unwrap();
        s.put_remote_path(
            "nvme1",
            "a",
            path("10.0.0.5:4420", "nqn.2024-01.io.example:b"),
            true,
        )
        .unwrap();
        s.delete_remote_path("nvme1", "a").unwrap();
        s.set_remote_queue_depth("nvme0", 16).unwrap();
        assert_eq!(s.remote_controller("nvme0").unwrap().queue_depth, 16);
        s.delete_namespace("s", 1).unwrap();
        s.delete_remote_path("nvme0", "a").unwrap();
        s.delete_remote_controller("nvme0").unwrap();
        assert_eq!(
            code(s.delete_remote_controller("nvme0").unwrap_err()),
            tonic::Code::NotFound
        );
    }
}
