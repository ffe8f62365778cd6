//! The volumes of `dpu.v1.StorageService` (`CreateVolume` ..
//! `DeleteVolume`): named stores that namespaces are made on by naming
//! them. The OPI volume services (`opi`) are views of these.

use dpu_proto::v1 as pb;

use super::storage::blocking;
use super::{paginate, required, Api, PAGES};
use crate::convert;
use crate::error::Result;
use crate::model::{Backend, State, Volume};
use crate::validate;

impl Api {
    /// Volume `v` of `state` as the API answers it: with the namespace
    /// made on it, and a block device's size as the target serves it (0
    /// while no namespace serves the volume).
    pub(crate) fn volume_out(&self, state: &State, v: &Volume) -> pb::Volume {
        let user = state.index.volume_user(&v.id);
        let mut out = convert::volume(v, user);
        if v.configured_size().is_none() {
            out.size_bytes = self.volume_served_size(state, &v.id).unwrap_or(0);
        }
        out
    }

    /// The size the target serves volume `id` with, through the namespace
    /// made on it; `None` while none serves it.
    pub(crate) fn volume_served_size(&self, state: &State, id: &str) -> Option<u64> {
        let served = self.ctl.served.as_ref()?;
        // The index names the namespace: a lookup, not a walk over every
        // namespace for each volume of a page.
        let user = state.index.volume_user(id)?;
        let (sid, nsid) = validate::namespace_name("namespace", user).ok()?;
        let sub = state.subsystems.get(sid)?;
        served.namespace_size(&sub.nqn, nsid)
    }

    /// `CreateVolume`: a file or device is checked against the backing
    /// policy, the namespaces and the other volumes first.
    pub(crate) async fn volume_create(&self, req: pb::CreateVolumeRequest) -> Result<pb::Volume> {
        let v = required("volume", req.volume)?;
        let (mut volume, has_uuid) = validate::volume("volume", &req.volume_id, &v)?;
        if !matches!(volume.backend, Backend::Ram { .. } | Backend::Null { .. }) {
            let (policy, state) = (self.ctl.backing.clone(), self.ctl.state.snapshot());
            volume = blocking(move || {
                validate::backing_store("volume", &policy, &state, &mut volume.backend)?;
                Ok(volume)
            })
            .await?;
        }
        let limits = self.ctl.limits;
        let id = self
            .change_storage(move |st| {
                if volume.id.is_empty() {
                    let taken = st.volumes.clone();
                    volume.id = st.next_id("volume", |id| taken.contains_key(id));
                }
                let v = st.create_volume(limits, volume, has_uuid)?;
                Ok((v.id.clone(), None))
            })
            .await?;
        self.volume_answer(&id)
    }

    /// `GetVolume`.
    pub(crate) fn volume_get(&self, req: &pb::GetVolumeRequest) -> Result<pb::Volume> {
        let id = validate::volume_name("name", &req.name)?;
        let state = self.ctl.state.snapshot();
        Ok(self.volume_out(&state, state.volume(id)?))
    }

    /// `ListVolumes`.
    pub(crate) fn volume_list(
        &self,
        req: &pb::ListVolumesRequest,
    ) -> Result<pb::ListVolumesResponse> {
        let state = self.ctl.state.snapshot();
        let items = state.volumes.iter().map(|(k, v)| (k.as_str(), v));
        let (volumes, next_page_token) =
            paginate(items, req.page_size, &req.page_token, PAGES, |v| {
                self.volume_out(&state, v)
            })?;
        Ok(pb::ListVolumesResponse {
            volumes,
            next_page_token,
        })
    }

    /// `ResizeVolume`: the namespace made on the volume follows, and the
    /// call returns once the target serves the new size.
    pub(crate) async fn volume_resize(&self, req: pb::ResizeVolumeRequest) -> Result<pb::Volume> {
        let id = validate::volume_name("name", &req.name)?.to_string();
        let size = req.size_bytes;
        let backend = self.ctl.state.snapshot().volume(&id)?.backend.clone();
        let policy = self.ctl.backing.clone();
        blocking(move || validate::backing_resize(&policy, &backend, size)).await?;
        let limits = self.ctl.limits;
        let id = self
            .change_storage(move |st| {
                st.resize_volume(limits, &id, size)?;
                Ok((id, None))
            })
            .await?;
        self.volume_answer(&id)
    }

    /// `DeleteVolume`.
    pub(crate) async fn volume_delete(&self, req: &pb::DeleteVolumeRequest) -> Result<()> {
        let id = validate::volume_name("name", &req.name)?.to_string();
        self.change_storage(move |st| st.delete_volume(&id).map(|()| ((), None)))
            .await
    }

    /// Volume `id` as the state holds it now.
    fn volume_answer(&self, id: &str) -> Result<pb::Volume> {
        let state = self.ctl.state.snapshot();
        Ok(self.volume_out(&state, state.volume(id)?))
    }
}
