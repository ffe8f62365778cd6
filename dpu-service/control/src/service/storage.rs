//! `dpu.v1.StorageService`.

use std::collections::{BTreeMap, BTreeSet};

use dpu_proto::v1 as pb;
use dpu_proto::v1::storage_service_server::StorageService;
use tonic::{Request, Response, Status};

use super::{mask_paths, num_key, paginate, required, Api, PAGES};
use crate::convert;
use crate::error::{ControlError, Result};
use crate::model::{State, Subsystem, Timestamp};
use crate::state::SubsystemUpdate;
use crate::validate::{self, DISCOVERY_NQN};

const DEFAULT_MODEL: &str = "dpu-service";

/// A stable 16-character serial number derived from the NQN (FNV-1a).
fn serial_from_nqn(nqn: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in nqn.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016X}")
}

fn hosts(field: &str, list: &[String]) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for (i, h) in list.iter().enumerate() {
        validate::nqn(&format!("{field}[{i}]"), h)?;
        if !out.insert(h.clone()) {
            return Err(ControlError::invalid(
                format!("{field}[{i}]"),
                format!("{h} is listed twice"),
            ));
        }
    }
    if out.len() > validate::MAX_HOSTS_PER_SUBSYSTEM {
        return Err(ControlError::invalid(
            field,
            format!("at most {} hosts", validate::MAX_HOSTS_PER_SUBSYSTEM),
        ));
    }
    Ok(out)
}

impl Api {
    /// Runs a storage change and, when the NVMe-oF target follows the
    /// state, waits until the target has applied it: once the call
    /// returns, the target serves what it answers (a deleted namespace
    /// takes no new command and the I/O that was running on it has
    /// ended; a removed host cannot connect). `served` names the resource
    /// the change created or resized, which the target must then serve.
    ///
    /// # Errors
    /// The change's own error (nothing changed), or
    /// [`ControlError::NotApplied`] (the change is stored).
    async fn change_storage<T, F>(&self, change: F, served: fn(&T) -> Option<&str>) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut State) -> Result<T> + Send + 'static,
    {
        let (out, generation) = self.ctl.state.mutate_numbered(change).await?;
        if let Some(target) = &self.ctl.storage_applied {
            let names: Vec<&str> = served(&out).into_iter().collect();
            target.wait(generation, &names).await?;
        }
        Ok(out)
    }

    /// Validates a (subsystem, host NQN) pair and applies `change` to it.
    async fn change_host(
        &self,
        subsystem: &str,
        host: String,
        change: for<'a> fn(&'a mut State, &str, &str) -> Result<&'a Subsystem>,
    ) -> Result<pb::Subsystem> {
        let id = validate::name("subsystem", subsystem, "subsystems")?.to_string();
        validate::nqn("host_nqn", &host)?;
        self.change_storage(
            move |st| change(st, &id, &host).map(convert::subsystem),
            |_| None,
        )
        .await
    }
}

#[tonic::async_trait]
impl StorageService for Api {
    async fn create_subsystem(
        &self,
        req: Request<pb::CreateSubsystemRequest>,
    ) -> Result<Response<pb::Subsystem>, Status> {
        self.write("/dpu.v1.StorageService/CreateSubsystem", async {
            let req = req.into_inner();
            validate::id("subsystem_id", &req.subsystem_id)?;
            let s = required("subsystem", req.subsystem)?;
            validate::nqn("subsystem.nqn", &s.nqn)?;
            if s.nqn == DISCOVERY_NQN {
                return Err(ControlError::invalid(
                    "subsystem.nqn",
                    "the discovery NQN is reserved for the discovery controller",
                ));
            }
            let serial = if s.serial_number.is_empty() {
                serial_from_nqn(&s.nqn)
            } else {
                s.serial_number
            };
            validate::ascii_id("subsystem.serial_number", &serial, 20)?;
            let model = if s.model_number.is_empty() {
                DEFAULT_MODEL.to_string()
            } else {
                s.model_number
            };
            validate::ascii_id("subsystem.model_number", &model, 40)?;
            let sub = Subsystem {
                id: req.subsystem_id,
                nqn: s.nqn,
                serial_number: serial,
                model_number: model,
                allow_any_host: s.allow_any_host,
                allowed_hosts: hosts("subsystem.allowed_hosts", &s.allowed_hosts)?,
                max_namespaces: validate::max_namespaces(
                    "subsystem.max_namespaces",
                    s.max_namespaces,
                )?,
                create_time: Timestamp::now(),
                namespaces: BTreeMap::new(),
                listeners: BTreeMap::new(),
            };
            let out = convert::subsystem(&sub);
            self.change_storage(move |st| st.create_subsystem(sub), |_| None)
                .await?;
            Ok(out)
        })
        .await
    }

    async fn get_subsystem(
        &self,
        req: Request<pb::GetSubsystemRequest>,
    ) -> Result<Response<pb::Subsystem>, Status> {
        self.read("/dpu.v1.StorageService/GetSubsystem", async {
            let id = validate::name("name", &req.get_ref().name, "subsystems")?;
            Ok(convert::subsystem(self.ctl.state.snapshot().subsystem(id)?))
        })
        .await
    }

    async fn list_subsystems(
        &self,
        req: Request<pb::ListSubsystemsRequest>,
    ) -> Result<Response<pb::ListSubsystemsResponse>, Status> {
        self.read("/dpu.v1.StorageService/ListSubsystems", async {
            let req = req.into_inner();
            let state = self.ctl.state.snapshot();
            let items = state
                .subsystems
                .iter()
                .map(|(k, s)| (k.clone(), convert::subsystem(s)));
            let (subsystems, next_page_token) =
                paginate(items, req.page_size, &req.page_token, PAGES)?;
            Ok(pb::ListSubsystemsResponse {
                subsystems,
                next_page_token,
            })
        })
        .await
    }

    async fn update_subsystem(
        &self,
        req: Request<pb::UpdateSubsystemRequest>,
    ) -> Result<Response<pb::Subsystem>, Status> {
        self.write("/dpu.v1.StorageService/UpdateSubsystem", async {
            let req = req.into_inner();
            let s = required("subsystem", req.subsystem)?;
            let id = validate::name("subsystem.name", &s.name, "subsystems")?.to_string();
            let paths = mask_paths(
                req.update_mask.as_ref(),
                &["allow_any_host", "allowed_hosts", "model_number"],
            )?;
            let mut u = SubsystemUpdate::default();
            for p in &paths {
                match p.as_str() {
                    "allow_any_host" => u.allow_any_host = Some(s.allow_any_host),
                    "allowed_hosts" => {
                        u.allowed_hosts = Some(hosts("subsystem.allowed_hosts", &s.allowed_hosts)?)
                    }
                    _ => {
                        validate::ascii_id("subsystem.model_number", &s.model_number, 40)?;
                        u.model_number = Some(s.model_number.clone());
                    }
                }
            }
            let out = self
                .change_storage(
                    move |st| st.update_subsystem(&id, u).map(convert::subsystem),
                    |_| None,
                )
                .await?;
            Ok(out)
        })
        .await
    }

    async fn delete_subsystem(
        &self,
        req: Request<pb::DeleteSubsystemRequest>,
    ) -> Result<Response<pb::DeleteSubsystemResponse>, Status> {
        self.write("/dpu.v1.StorageService/DeleteSubsystem", async {
            let req = req.into_inner();
            let id = validate::name("name", &req.name, "subsystems")?.to_string();
            self.change_storage(move |st| st.delete_subsystem(&id, req.force), |_| None)
                .await?;
            Ok(pb::DeleteSubsystemResponse {})
        })
        .await
    }

    async fn add_host(
        &self,
        req: Request<pb::AddHostRequest>,
    ) -> Result<Response<pb::Subsystem>, Status> {
        self.write("/dpu.v1.StorageService/AddHost", async {
            let req = req.into_inner();
            self.change_host(&req.subsystem, req.host_nqn, State::add_host)
                .await
        })
        .await
    }

    async fn remove_host(
        &self,
        req: Request<pb::RemoveHostRequest>,
    ) -> Result<Response<pb::Subsystem>, Status> {
        self.write("/dpu.v1.StorageService/RemoveHost", async {
            let req = req.into_inner();
            self.change_host(&req.subsystem, req.host_nqn, State::remove_host)
                .await
        })
        .await
    }

    async fn create_namespace(
        &self,
        req: Request<pb::CreateNamespaceRequest>,
    ) -> Result<Response<pb::Namespace>, Status> {
        self.write("/dpu.v1.StorageService/CreateNamespace", async {
            let req = req.into_inner();
            let id = validate::name("parent", &req.parent, "subsystems")?.to_string();
            let n = required("namespace", req.namespace)?;
            let (ns, has_uuid, has_nguid) = validate::namespace("namespace", &n)?;
            let limits = self.ctl.limits;
            let out = self
                .change_storage(
                    move |st| {
                        st.create_namespace(limits, &id, ns, has_uuid, has_nguid)
                            .map(|n| convert::namespace(&id, n))
                    },
                    |n| Some(&n.name),
                )
                .await?;
            Ok(out)
        })
        .await
    }

    async fn get_namespace(
        &self,
        req: Request<pb::GetNamespaceRequest>,
    ) -> Result<Response<pb::Namespace>, Status> {
        self.read("/dpu.v1.StorageService/GetNamespace", async {
            let (sid, nsid) = validate::namespace_name("name", &req.get_ref().name)?;
            let state = self.ctl.state.snapshot();
            let n = state.subsystem(sid)?.namespaces.get(&nsid).ok_or_else(|| {
                ControlError::NotFound(format!("subsystems/{sid}/namespaces/{nsid}"))
            })?;
            Ok(convert::namespace(sid, n))
        })
        .await
    }

    async fn list_namespaces(
        &self,
        req: Request<pb::ListNamespacesRequest>,
    ) -> Result<Response<pb::ListNamespacesResponse>, Status> {
        self.read("/dpu.v1.StorageService/ListNamespaces", async {
            let req = req.into_inner();
            let sid = validate::name("parent", &req.parent, "subsystems")?;
            let state = self.ctl.state.snapshot();
            let items = state
                .subsystem(sid)?
                .namespaces
                .values()
                .map(|n| (num_key(n.nsid), convert::namespace(sid, n)));
            let (namespaces, next_page_token) =
                paginate(items, req.page_size, &req.page_token, PAGES)?;
            Ok(pb::ListNamespacesResponse {
                namespaces,
                next_page_token,
            })
        })
        .await
    }

    async fn resize_namespace(
        &self,
        req: Request<pb::ResizeNamespaceRequest>,
    ) -> Result<Response<pb::Namespace>, Status> {
        self.write("/dpu.v1.StorageService/ResizeNamespace", async {
            let req = req.into_inner();
            let (sid, nsid) = validate::namespace_name("name", &req.name)?;
            let sid = sid.to_string();
            let limits = self.ctl.limits;
            let out = self
                .change_storage(
                    move |st| {
                        st.resize_namespace(limits, &sid, nsid, req.size_bytes)
                            .map(|n| convert::namespace(&sid, n))
                    },
                    |n| Some(&n.name),
                )
                .await?;
            Ok(out)
        })
        .await
    }

    async fn delete_namespace(
        &self,
        req: Request<pb::DeleteNamespaceRequest>,
    ) -> Result<Response<pb::DeleteNamespaceResponse>, Status> {
        self.write("/dpu.v1.StorageService/DeleteNamespace", async {
            let (sid, nsid) = validate::namespace_name("name", &req.get_ref().name)?;
            let sid = sid.to_string();
            self.change_storage(move |st| st.delete_namespace(&sid, nsid), |_| None)
                .await?;
            Ok(pb::DeleteNamespaceResponse {})
        })
        .await
    }

    async fn create_listener(
        &self,
        req: Request<pb::CreateListenerRequest>,
    ) -> Result<Response<pb::Listener>, Status> {
        self.write("/dpu.v1.StorageService/CreateListener", async {
            let req = req.into_inner();
            let sid = validate::name("parent", &req.parent, "subsystems")?.to_string();
            let l = required("listener", req.listener)?;
            let listener = validate::listener("listener", &req.listener_id, &l)?;
            let out = self
                .change_storage(
                    move |st| {
                        st.create_listener(&sid, listener)
                            .map(|l| convert::listener(&sid, l))
                    },
                    |l| Some(&l.name),
                )
                .await?;
            Ok(out)
        })
        .await
    }

    async fn list_listeners(
        &self,
        req: Request<pb::ListListenersRequest>,
    ) -> Result<Response<pb::ListListenersResponse>, Status> {
        self.read("/dpu.v1.StorageService/ListListeners", async {
            let req = req.into_inner();
            let sid = validate::name("parent", &req.parent, "subsystems")?;
            let state = self.ctl.state.snapshot();
            let items = state
                .subsystem(sid)?
                .listeners
                .iter()
                .map(|(k, l)| (k.clone(), convert::listener(sid, l)));
            let (listeners, next_page_token) =
                paginate(items, req.page_size, &req.page_token, PAGES)?;
            Ok(pb::ListListenersResponse {
                listeners,
                next_page_token,
            })
        })
        .await
    }

    async fn delete_listener(
        &self,
        req: Request<pb::DeleteListenerRequest>,
    ) -> Result<Response<pb::DeleteListenerResponse>, Status> {
        self.write("/dpu.v1.StorageService/DeleteListener", async {
            let (sid, lid) = validate::listener_name("name", &req.get_ref().name)?;
            let (sid, lid) = (sid.to_string(), lid.to_string());
            self.change_storage(move |st| st.delete_listener(&sid, &lid), |_| None)
                .await?;
            Ok(pb::DeleteListenerResponse {})
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_is_stable_and_valid() {
        let s = serial_from_nqn("nqn.2024-01.io.example:a");
        assert_eq!(s, serial_from_nqn("nqn.2024-01.io.example:a"));
        assert_ne!(s, serial_from_nqn("nqn.2024-01.io.example:b"));
        validate::ascii_id("s", &s, 20).unwrap();
    }
}
