//! `dpu.v1.StorageService`.

use std::collections::{BTreeMap, BTreeSet};

use dpu_proto::v1 as pb;
use dpu_proto::v1::storage_service_server::StorageService;
use tonic::{Request, Response, Status};

use super::{mask_paths, num_key, paginate, required, Api, PAGES};
use crate::convert;
use crate::error::{ControlError, Result};
use crate::model::{Backend, Namespace, State, Subsystem, Timestamp};
use crate::state::{Limits, Part, SubsystemUpdate};
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
    if list.len() > validate::MAX_HOSTS_PER_SUBSYSTEM {
        return Err(ControlError::invalid(
            field,
            format!("at most {} hosts", validate::MAX_HOSTS_PER_SUBSYSTEM),
        ));
    }
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
    Ok(out)
}

/// Runs `check`, which looks at the filesystem, on a blocking thread.
pub(super) async fn blocking<T: Send + 'static>(
    check: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(check)
        .await
        .unwrap_or_else(|e| {
            Err(ControlError::Rejected(format!(
                "checking the backing failed: {e}"
            )))
        })
}

impl Api {
    /// Runs a storage change and, when the NVMe-oF target follows the
    /// state, waits until the target has applied it: once the call
    /// returns, the target serves what it answers (a deleted namespace
    /// takes no new command and the I/O that was running on it has
    /// ended; a removed host cannot connect). `change` answers the
    /// namespace or listener it created or resized, which the target must
    /// then serve; if the target cannot, the change is undone.
    ///
    /// # Errors
    /// As [`Api::change_served`].
    pub(super) async fn change_storage<T, F>(&self, change: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut State) -> Result<(T, Option<Part>)> + Send + 'static,
    {
        self.change_served(self.ctl.storage_applied.as_ref(), change)
            .await
    }

    /// Checks the file or block device of `ns`, a namespace to create,
    /// against the backing policy and the namespaces stored
    /// ([`validate::backing`]), off the runtime's threads.
    async fn check_backing(&self, ns: Namespace) -> Result<Namespace> {
        if matches!(ns.backend, Backend::Ram { .. }) {
            return Ok(ns);
        }
        let (policy, state) = (self.ctl.backing.clone(), self.ctl.state.snapshot());
        blocking(move || validate::backing("namespace", &policy, &state, ns)).await
    }

    /// Validates a (subsystem, host NQN) pair and applies `change` to it.
    async fn change_host(
        &self,
        subsystem: &str,
        host: String,
        change: for<'a> fn(&'a mut State, Limits, &str, &str) -> Result<&'a Subsystem>,
    ) -> Result<pb::Subsystem> {
        let id = validate::name("subsystem", subsystem, "subsystems")?.to_string();
        validate::nqn("host_nqn", &host)?;
        let limits = self.ctl.limits;
        self.change_storage(move |st| {
            Ok((convert::subsystem(change(st, limits, &id, &host)?), None))
        })
        .await
    }
}

/// [`State::remove_host`] in the shape of [`State::add_host`]: removing
/// takes no cap.
fn remove_host<'a>(st: &'a mut State, _: Limits, id: &str, host: &str) -> Result<&'a Subsystem> {
    st.remove_host(id, host)
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
            if !s.host_auth.is_empty() {
                return Err(ControlError::invalid(
                    "subsystem.host_auth",
                    "output only: set a host's secrets with SetHostAuth once it is created",
                ));
            }
            if !s.host_qos.is_empty() {
                return Err(ControlError::invalid(
                    "subsystem.host_qos",
                    "output only: set a host's QoS limits with SetHostQos once it is created",
                ));
            }
            if !s.host_tls.is_empty() {
                return Err(ControlError::invalid(
                    "subsystem.host_tls",
                    "output only: set a host's TLS key with SetHostTlsKey once it is created",
                ));
            }
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
                auth_requirement: validate::auth_requirement(
                    "subsystem.auth_requirement",
                    s.auth_requirement,
                )?,
                host_auth: BTreeMap::new(),
                host_qos: BTreeMap::new(),
                tls_requirement: validate::tls_requirement(
                    "subsystem.tls_requirement",
                    s.tls_requirement,
                )?,
                host_tls: Default::default(),
            };
            let out = convert::subsystem(&sub);
            let limits = self.ctl.limits;
            self.change_storage(move |st| st.create_subsystem(limits, sub).map(|()| ((), None)))
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
            let items = state.subsystems.iter().map(|(k, s)| (k.as_str(), s));
            let (subsystems, next_page_token) = paginate(
                items,
                req.page_size,
                &req.page_token,
                PAGES,
                convert::subsystem,
            )?;
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
                &[
                    "allow_any_host",
                    "allowed_hosts",
                    "model_number",
                    "auth_requirement",
                    "tls_requirement",
                ],
            )?;
            let mut u = SubsystemUpdate::default();
            for p in &paths {
                match p.as_str() {
                    "allow_any_host" => u.allow_any_host = Some(s.allow_any_host),
                    "allowed_hosts" => {
                        u.allowed_hosts = Some(hosts("subsystem.allowed_hosts", &s.allowed_hosts)?)
                    }
                    "auth_requirement" => {
                        u.auth_requirement = Some(validate::auth_requirement(
                            "subsystem.auth_requirement",
                            s.auth_requirement,
                        )?)
                    }
                    "tls_requirement" => {
                        u.tls_requirement = Some(validate::tls_requirement(
                            "subsystem.tls_requirement",
                            s.tls_requirement,
                        )?)
                    }
                    _ => {
                        validate::ascii_id("subsystem.model_number", &s.model_number, 40)?;
                        u.model_number = Some(s.model_number.clone());
                    }
                }
            }
            let limits = self.ctl.limits;
            let out = self
                .change_storage(move |st| {
                    Ok((
                        convert::subsystem(st.update_subsystem(limits, &id, u)?),
                        None,
                    ))
                })
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
            self.change_storage(move |st| st.delete_subsystem(&id, req.force).map(|()| ((), None)))
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
            self.change_host(&req.subsystem, req.host_nqn, remove_host)
                .await
        })
        .await
    }

    async fn set_host_auth(
        &self,
        req: Request<pb::SetHostAuthRequest>,
    ) -> Result<Response<pb::Subsystem>, Status> {
        self.write("/dpu.v1.StorageService/SetHostAuth", async {
            let req = req.into_inner();
            let id = validate::name("subsystem", &req.subsystem, "subsystems")?.to_string();
            let a = required("auth", req.auth)?;
            let (host, auth) = validate::host_auth("auth", &a)?;
            self.change_storage(move |st| {
                Ok((
                    convert::subsystem(st.set_host_auth(&id, &host, auth)?),
                    None,
                ))
            })
            .await
        })
        .await
    }

    async fn clear_host_auth(
        &self,
        req: Request<pb::ClearHostAuthRequest>,
    ) -> Result<Response<pb::Subsystem>, Status> {
        self.write("/dpu.v1.StorageService/ClearHostAuth", async {
            let req = req.into_inner();
            let id = validate::name("subsystem", &req.subsystem, "subsystems")?.to_string();
            validate::nqn("host_nqn", &req.host_nqn)?;
            self.change_storage(move |st| {
                Ok((
                    convert::subsystem(st.clear_host_auth(&id, &req.host_nqn)?),
                    None,
                ))
            })
            .await
        })
        .await
    }

    async fn set_host_tls_key(
        &self,
        req: Request<pb::SetHostTlsKeyRequest>,
    ) -> Result<Response<pb::Subsystem>, Status> {
        self.write("/dpu.v1.StorageService/SetHostTlsKey", async {
            let req = req.into_inner();
            let id = validate::name("subsystem", &req.subsystem, "subsystems")?.to_string();
            let t = required("tls", req.tls)?;
            let (host, psk) = validate::host_tls("tls", &t)?;
            self.change_storage(move |st| {
                Ok((
                    convert::subsystem(st.set_host_tls_key(&id, &host, psk)?),
                    None,
                ))
            })
            .await
        })
        .await
    }

    async fn clear_host_tls_key(
        &self,
        req: Request<pb::ClearHostTlsKeyRequest>,
    ) -> Result<Response<pb::Subsystem>, Status> {
        self.write("/dpu.v1.StorageService/ClearHostTlsKey", async {
            let req = req.into_inner();
            let id = validate::name("subsystem", &req.subsystem, "subsystems")?.to_string();
            validate::nqn("host_nqn", &req.host_nqn)?;
            self.change_storage(move |st| {
                Ok((
                    convert::subsystem(st.clear_host_tls_key(&id, &req.host_nqn)?),
                    None,
                ))
            })
            .await
        })
        .await
    }

    async fn set_namespace_qos(
        &self,
        req: Request<pb::SetNamespaceQosRequest>,
    ) -> Result<Response<pb::Namespace>, Status> {
        self.write("/dpu.v1.StorageService/SetNamespaceQos", async {
            let req = req.into_inner();
            let id = validate::name("subsystem", &req.subsystem, "subsystems")?.to_string();
            let nsid = validate::nsid("nsid", req.nsid)?;
            let qos = validate::qos("qos", req.qos.as_ref())?;
            let out = self
                .change_storage({
                    let id = id.clone();
                    move |st| {
                        let n = st.set_namespace_qos(&id, nsid, qos)?;
                        Ok((convert::namespace(&id, n), None))
                    }
                })
                .await?;
            // With the size and state the target serves it with.
            let state = self.ctl.state.snapshot();
            let served = state.subsystems.get(&id).and_then(|sub| {
                let ns = sub.namespaces.get(&nsid)?;
                Some(self.namespace_out(sub, ns))
            });
            Ok(served.unwrap_or(out))
        })
        .await
    }

    async fn set_host_qos(
        &self,
        req: Request<pb::SetHostQosRequest>,
    ) -> Result<Response<pb::Subsystem>, Status> {
        self.write("/dpu.v1.StorageService/SetHostQos", async {
            let req = req.into_inner();
            let id = validate::name("subsystem", &req.subsystem, "subsystems")?.to_string();
            validate::nqn("host_nqn", &req.host_nqn)?;
            let qos = validate::qos("qos", req.qos.as_ref())?;
            self.change_storage(move |st| {
                Ok((
                    convert::subsystem(st.set_host_qos(&id, &req.host_nqn, qos)?),
                    None,
                ))
            })
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
            let (ns, has_uuid, has_nguid) =
                validate::namespace("namespace", &n, &self.ctl.host_nqn)?;
            let ns = self.check_backing(ns).await?;
            let image_size = self.check_rbd(&ns).await?;
            self.check_remote(&id, &ns).await?;
            let limits = self.ctl.limits;
            let (out, nsid) = self
                .change_storage({
                    let id = id.clone();
                    move |st| {
                        let n = st.create_namespace(limits, &id, ns, has_uuid, has_nguid)?;
                        let part = Part::Namespace {
                            subsystem: id.clone(),
                            nsid: n.nsid,
                        };
                        Ok(((convert::namespace(&id, n), n.nsid), Some(part)))
                    }
                })
                .await?;
            // Served now: a device's, image's or remote's size is the
            // target's.
            let state = self.ctl.state.snapshot();
            let served = state.subsystems.get(&id).and_then(|sub| {
                let ns = sub.namespaces.get(&nsid)?;
                Some(self.namespace_out(sub, ns))
            });
            let mut out = served.unwrap_or(out);
            if self.ctl.served.is_none() {
                out.size_bytes = image_size.unwrap_or(out.size_bytes);
            }
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
            let sub = state.subsystem(sid)?;
            let n = sub.namespaces.get(&nsid).ok_or_else(|| {
                ControlError::NotFound(format!("subsystems/{sid}/namespaces/{nsid}"))
            })?;
            Ok(self.namespace_out(sub, n))
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
            let sub = state.subsystem(sid)?;
            let items = sub.namespaces.values().map(|n| (num_key(n.nsid), n));
            let (namespaces, next_page_token) =
                paginate(items, req.page_size, &req.page_token, PAGES, |n| {
                    self.namespace_out(sub, n)
                })?;
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
            if let Some(ns) = self
                .ctl
                .state
                .snapshot()
                .subsystem(&sid)?
                .namespaces
                .get(&nsid)
            {
                let (policy, b, size) =
                    (self.ctl.backing.clone(), ns.backend.clone(), req.size_bytes);
                blocking(move || validate::backing_resize(&policy, &b, size)).await?;
            }
            let limits = self.ctl.limits;
            let out = self
                .change_storage(move |st| {
                    let n = st.resize_namespace(limits, &sid, nsid, req.size_bytes)?;
                    let out = convert::namespace(&sid, n);
                    Ok((
                        out,
                        Some(Part::Namespace {
                            subsystem: sid,
                            nsid,
                        }),
                    ))
                })
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
            self.change_storage(move |st| st.delete_namespace(&sid, nsid).map(|()| ((), None)))
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
            let limits = self.ctl.limits;
            let out = self
                .change_storage(move |st| {
                    let l = st.create_listener(limits, &sid, listener)?;
                    let part = Part::Listener {
                        subsystem: sid.clone(),
                        id: l.id.clone(),
                    };
                    Ok((convert::listener(&sid, l), Some(part)))
                })
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
                .map(|(k, l)| (k.as_str(), l));
            let (listeners, next_page_token) =
                paginate(items, req.page_size, &req.page_token, PAGES, |l| {
                    convert::listener(sid, l)
                })?;
            Ok(pb::ListListenersResponse {
                listeners,
                next_page_token,
            })
        })
        .await
    }

    async fn create_cluster(
        &self,
        req: Request<pb::CreateClusterRequest>,
    ) -> Result<Response<pb::Cluster>, Status> {
        self.write(
            "/dpu.v1.StorageService/CreateCluster",
            self.cluster_create(req.into_inner()),
        )
        .await
    }

    async fn get_cluster(
        &self,
        req: Request<pb::GetClusterRequest>,
    ) -> Result<Response<pb::Cluster>, Status> {
        self.read("/dpu.v1.StorageService/GetCluster", async {
            self.cluster_get(req.get_ref())
        })
        .await
    }

    async fn list_clusters(
        &self,
        req: Request<pb::ListClustersRequest>,
    ) -> Result<Response<pb::ListClustersResponse>, Status> {
        self.read("/dpu.v1.StorageService/ListClusters", async {
            self.cluster_list(req.get_ref())
        })
        .await
    }

    async fn update_cluster(
        &self,
        req: Request<pb::UpdateClusterRequest>,
    ) -> Result<Response<pb::Cluster>, Status> {
        self.write(
            "/dpu.v1.StorageService/UpdateCluster",
            self.cluster_update(req.into_inner()),
        )
        .await
    }

    async fn delete_cluster(
        &self,
        req: Request<pb::DeleteClusterRequest>,
    ) -> Result<Response<pb::DeleteClusterResponse>, Status> {
        self.write("/dpu.v1.StorageService/DeleteCluster", async {
            self.cluster_delete(req.get_ref()).await?;
            Ok(pb::DeleteClusterResponse {})
        })
        .await
    }

    async fn create_volume(
        &self,
        req: Request<pb::CreateVolumeRequest>,
    ) -> Result<Response<pb::Volume>, Status> {
        self.write(
            "/dpu.v1.StorageService/CreateVolume",
            self.volume_create(req.into_inner()),
        )
        .await
    }

    async fn get_volume(
        &self,
        req: Request<pb::GetVolumeRequest>,
    ) -> Result<Response<pb::Volume>, Status> {
        self.read("/dpu.v1.StorageService/GetVolume", async {
            self.volume_get(req.get_ref())
        })
        .await
    }

    async fn list_volumes(
        &self,
        req: Request<pb::ListVolumesRequest>,
    ) -> Result<Response<pb::ListVolumesResponse>, Status> {
        self.read("/dpu.v1.StorageService/ListVolumes", async {
            self.volume_list(req.get_ref())
        })
        .await
    }

    async fn resize_volume(
        &self,
        req: Request<pb::ResizeVolumeRequest>,
    ) -> Result<Response<pb::Volume>, Status> {
        self.write(
            "/dpu.v1.StorageService/ResizeVolume",
            self.volume_resize(req.into_inner()),
        )
        .await
    }

    async fn delete_volume(
        &self,
        req: Request<pb::DeleteVolumeRequest>,
    ) -> Result<Response<pb::DeleteVolumeResponse>, Status> {
        self.write("/dpu.v1.StorageService/DeleteVolume", async {
            self.volume_delete(req.get_ref()).await?;
            Ok(pb::DeleteVolumeResponse {})
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
            self.change_storage(move |st| st.delete_listener(&sid, &lid).map(|()| ((), None)))
                .await?;
            Ok(pb::DeleteListenerResponse {})
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::sync::watch;
    use tonic::Code;

    use super::*;
    use crate::apply::Problem;
    use crate::model::Backend;
    use crate::service::testing::{follower, stored, LIMITS};
    use crate::store::StateHandle;

    /// What a stand-in NVMe-oF target cannot serve of `state`: a file
    /// namespace under a directory listed in `missing`.
    fn unservable(state: &State, missing: &Mutex<Vec<String>>) -> Vec<Problem> {
        let missing = missing.lock().unwrap();
        let mut problems = Vec::new();
        for (sid, sub) in &state.subsystems {
            for n in sub.namespaces.values() {
                if let Backend::File { path, .. } = &n.backend {
                    if missing.iter().any(|m| path.starts_with(m.as_str())) {
                        problems.push(Problem {
                            resource: convert::namespace_name(sid, n.nsid),
                            reason: format!("{path}: no such directory"),
                        });
                    }
                }
            }
        }
        problems
    }

    fn namespace(ns: pb::namespace::Backend) -> Request<pb::CreateNamespaceRequest> {
        Request::new(pb::CreateNamespaceRequest {
            parent: "subsystems/s".into(),
            namespace: Some(pb::Namespace {
                backend: Some(ns),
                block_size: 512,
                ..Default::default()
            }),
        })
    }

    fn file(path: &str, size_bytes: u64) -> Request<pb::CreateNamespaceRequest> {
        namespace(pb::namespace::Backend::File(pb::FileBackend {
            path: path.into(),
            size_bytes,
        }))
    }

    async fn create_subsystem(api: &Api) {
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

    /// A change the target reports it could not apply is undone, in the
    /// store, on disk and in the target, while a change published between
    /// it and the report stays; the call fails naming the resource and
    /// why, and succeeds again once the cause is gone.
    #[tokio::test]
    async fn a_change_the_target_cannot_apply_is_undone_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateHandle::open(Some(dir.path())).unwrap();
        let missing = Arc::new(Mutex::new(vec!["/missing/".to_string()]));
        let (pause, paused) = watch::channel(false);
        let judge = {
            let missing = missing.clone();
            move |s: &State| Ok(unservable(s, &missing))
        };
        let (applied, seen) = follower("the target", &state, judge, paused);
        let api = Api::for_tests(
            state.clone(),
            Default::default(),
            LIMITS,
            Some(applied),
            None,
        );
        create_subsystem(&api).await;
        let g = state.published().generation;

        // The target reports on both changes at once, the file
        // namespace's first.
        pause.send_replace(true);
        let broken = tokio::spawn({
            let api = api.clone();
            async move {
                api.create_namespace(file("/missing/disk.img", 1 << 20))
                    .await
            }
        });
        stored(&state, g + 1).await;
        let other = tokio::spawn({
            let api = api.clone();
            async move {
                let ram = pb::namespace::Backend::Ram(pb::RamBackend { size_bytes: 4096 });
                api.create_namespace(namespace(ram)).await
            }
        });
        stored(&state, g + 2).await;
        pause.send_replace(false);

        let other = other.await.unwrap().unwrap().into_inner();
        assert_eq!(other.name, "subsystems/s/namespaces/2");
        let err = broken.await.unwrap().unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert_eq!(
            err.message(),
            "the target could not apply it (subsystems/s/namespaces/1: \
             /missing/disk.img: no such directory); the change was undone"
        );
        let now = state.published();
        let nsids = |s: &State| {
            s.subsystems["s"]
                .namespaces
                .keys()
                .copied()
                .collect::<Vec<_>>()
        };
        assert_eq!(nsids(&now.state), [2]);
        assert_eq!(now.generation, g + 3, "the undo is a change of its own");
        let target = seen.lock().unwrap().clone();
        assert_eq!(target.generation, now.generation, "the target was told");
        assert_eq!(nsids(&target.state), [2]);
        drop(state);
        let reopened = StateHandle::open(Some(dir.path())).unwrap();
        assert_eq!(*reopened.snapshot(), *now.state, "the undo is persisted");

        // Once the directory is there, the same call succeeds.
        missing.lock().unwrap().clear();
        let ns = api
            .create_namespace(file("/missing/disk.img", 1 << 20))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ns.name, "subsystems/s/namespaces/1");

        // A resize the target cannot apply goes back to the old size.
        missing.lock().unwrap().push("/missing/".into());
        let err = api
            .resize_namespace(Request::new(pb::ResizeNamespaceRequest {
                name: ns.name.clone(),
                size_bytes: 2 << 20,
            }))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(err.message().ends_with("the change was undone"), "{err:?}");
        let got = api
            .get_namespace(Request::new(pb::GetNamespaceRequest { name: ns.name }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.size_bytes, 1 << 20);
    }

    /// The QoS calls name the field they refuse, NOT_FOUND what does not
    /// exist, FAILED_PRECONDITION a host the subsystem does not allow;
    /// what they set is in Get and List, and all-zero limits clear it.
    #[tokio::test]
    async fn qos_calls_check_their_input_and_answer_what_they_set() {
        let state = StateHandle::open(None).unwrap();
        let api = Api::for_tests(state.clone(), Default::default(), LIMITS, None, None);
        create_subsystem(&api).await;
        let ram = pb::namespace::Backend::Ram(pb::RamBackend { size_bytes: 4096 });
        let mut create = namespace(ram);
        let limits = pb::QosLimits {
            iops: 2_000,
            write_bandwidth: 50 << 20,
            ..Default::default()
        };
        if let Some(n) = create.get_mut().namespace.as_mut() {
            n.qos = Some(limits);
        }
        let ns = api.create_namespace(create).await.unwrap().into_inner();
        assert_eq!(ns.qos, Some(limits), "set on create");
        let set_ns = |subsystem: &str, nsid, qos| {
            api.set_namespace_qos(Request::new(pb::SetNamespaceQosRequest {
                subsystem: subsystem.into(),
                nsid,
                qos,
            }))
        };
        fn code<T: std::fmt::Debug>(r: Result<T, Status>) -> Code {
            r.unwrap_err().code()
        }
        let read = pb::QosLimits {
            read_iops: 10,
            ..Default::default()
        };
        let got = set_ns("subsystems/s", 1, Some(read)).await.unwrap();
        assert_eq!(got.into_inner().qos, Some(read));
        let listed = api
            .list_namespaces(Request::new(pb::ListNamespacesRequest {
                parent: "subsystems/s".into(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.namespaces[0].qos, Some(read));
        let cleared = set_ns("subsystems/s", 1, None).await.unwrap().into_inner();
        assert_eq!(cleared.qos, None);
        assert!(state.snapshot().subsystems["s"].namespaces[&1]
            .qos
            .is_none());
        assert_eq!(code(set_ns("subsystems/s", 2, None).await), Code::NotFound);
        assert_eq!(code(set_ns("subsystems/x", 1, None).await), Code::NotFound);
        assert_eq!(code(set_ns("s", 1, None).await), Code::InvalidArgument);
        assert_eq!(
            code(set_ns("subsystems/s", 0, None).await),
            Code::InvalidArgument
        );
        let over = pb::QosLimits {
            bandwidth: validate::MAX_QOS_BANDWIDTH + 1,
            ..Default::default()
        };
        let e = set_ns("subsystems/s", 1, Some(over)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().starts_with("qos.bandwidth: "), "{e:?}");

        const HOST: &str = "nqn.2024-01.io.example:h1";
        let set_host = |host: &str, qos| {
            api.set_host_qos(Request::new(pb::SetHostQosRequest {
                subsystem: "subsystems/s".into(),
                host_nqn: host.into(),
                qos,
            }))
        };
        let e = set_host(HOST, Some(read)).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("not allowed"), "{e:?}");
        assert_eq!(
            code(set_host("host", Some(read)).await),
            Code::InvalidArgument
        );
        api.add_host(Request::new(pb::AddHostRequest {
            subsystem: "subsystems/s".into(),
            host_nqn: HOST.into(),
        }))
        .await
        .unwrap();
        let sub = set_host(HOST, Some(read)).await.unwrap().into_inner();
        assert_eq!(
            sub.host_qos,
            [pb::HostQos {
                host_nqn: HOST.into(),
                qos: Some(read),
            }]
        );
        let got = api
            .get_subsystem(Request::new(pb::GetSubsystemRequest {
                name: "subsystems/s".into(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.host_qos, sub.host_qos);
        assert!(set_host(HOST, Some(pb::QosLimits::default()))
            .await
            .unwrap()
            .into_inner()
            .host_qos
            .is_empty());

        // Output only on create.
        let e = api
            .create_subsystem(Request::new(pb::CreateSubsystemRequest {
                subsystem_id: "t".into(),
                subsystem: Some(pb::Subsystem {
                    nqn: "nqn.2024-01.io.example:t".into(),
                    host_qos: sub.host_qos,
                    ..Default::default()
                }),
            }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().starts_with("subsystem.host_qos: "), "{e:?}");
    }

    #[test]
    fn serial_is_stable_and_valid() {
        let s = serial_from_nqn("nqn.2024-01.io.example:a");
        assert_eq!(s, serial_from_nqn("nqn.2024-01.io.example:a"));
        assert_ne!(s, serial_from_nqn("nqn.2024-01.io.example:b"));
        validate::ascii_id("s", &s, 20).unwrap();
    }
}
