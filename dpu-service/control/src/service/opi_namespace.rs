//! OPI's NVMe namespaces (`opi_api.storage.v1.FrontendNvmeService`'s
//! `NvmeNamespace` calls) over the namespaces of `dpu.v1`: an OPI
//! namespace is a view of one of our namespaces made on a volume, so what
//! either API makes the other shows, and it is stored once. As for
//! subsystems and controllers ([`super::opi`]), each call checks the OPI
//! request (errors name OPI's fields), turns it into the `dpu.v1` call it
//! stands for and runs that through [`StorageService`]; a refusal of that
//! call naming a `dpu.v1` field names the OPI field it came from.
//!
//! Mapping, in `nvmeSubsystems/{s}/nvmeNamespaces/{id}`:
//! - `{s}` is subsystem `subsystems/{s}`; `{id}` is the namespace's
//!   `dpu.v1` `namespace_id` (OPI's `nvme_namespace_id`, or "opi-" and 16
//!   hex digits when a create gives none). A namespace without one (made
//!   through `dpu.v1` without it) is named by its decimal NSID. Lookups
//!   take either: an ID starts with a letter, so it never reads as an
//!   NSID.
//! - `spec.host_nsid` is the NSID (0 on create: the lowest free one).
//! - `spec.volume_name_ref` is the volume the namespace is made on
//!   (`dpu.v1` backend `volume`), required on create: a volume ID
//!   (`Malloc1`) or a resource name, `volumes/{id}` or OPI's
//!   `mallocVolumes/{id}`, `aioVolumes/{id}` or `nullVolumes/{id}` (then
//!   the volume must be of that kind). `{c}n{nsid}` (`nvme0n1`), when
//!   no volume has that ID and remote controller `{c}` exists, names
//!   namespace `{nsid}` of that controller's remote subsystem: the
//!   namespace is backed by it (`dpu.v1` backend `remote`, with the
//!   controller's paths, host NQN and queue depth as they are when it is
//!   made, and the remote namespace's block size; see
//!   [`super::opi_remote`]). Responses give the volume ID, `{c}n{nsid}`
//!   for a remote namespace while a controller of its subsystem exists,
//!   and nothing for a namespace with a store of its own (made through
//!   `dpu.v1`).
//! - `spec.uuid` is the UUID; `spec.nguid` the NGUID, given as 32 hex
//!   digits or in UUID text form and answered as 32 hex digits (both
//!   generated when a create leaves them empty); `spec.eui64` the EUI-64
//!   as a big-endian 64-bit integer, 0 for none.
//! - `status` is `STATE_ENABLED` and `OPER_STATE_ONLINE` while the target
//!   serves the namespace (`NAMESPACE_STATE_SERVING`), `STATE_DISABLED`
//!   and `OPER_STATE_OFFLINE` otherwise.
//!
//! Nothing of what an OPI namespace describes changes once it exists
//! (`dpu.v1` changes only a namespace's QoS, which OPI's namespace does
//! not carry): an update whose masked fields equal the stored ones (a
//! zero or empty value counts as unchanged) answers the namespace, one
//! that would change a field is refused naming it, and `allow_missing`
//! creates a namespace that does not exist. Stats are the I/O counters of
//! the namespace's subsystem: the target counts I/O per subsystem, not
//! per namespace, so they include the subsystem's other namespaces.

use dpu_proto::opi::storage::v1 as opi;
use dpu_proto::opi::storage::v1::nvme_namespace_status::{OperState, State};
use dpu_proto::pbjson_types::{Empty, FieldMask};
use dpu_proto::v1 as pb;
use dpu_proto::v1::storage_service_server::StorageService;
use tonic::{Code, Request, Response, Status};

use super::opi::{generated_id, gone, inner, SUBSYSTEMS};
use super::opi_remote;
use super::opi_volume::Kind;
use super::{required, Api};
use crate::error::{ControlError, Result};
use crate::validate;

/// OPI's collection of namespaces under a subsystem.
pub const NAMESPACES: &str = "nvmeNamespaces";

/// Fields of an `NvmeNamespace` an update mask may name.
const SPEC_FIELDS: &[&str] = &[
    "spec.host_nsid",
    "spec.nguid",
    "spec.eui64",
    "spec.uuid",
    "spec.volume_name_ref",
];

/// What the last part of an OPI namespace name names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// A namespace without an ID, by its NSID.
    Nsid(u32),
    /// A namespace by its `namespace_id`.
    Id(String),
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Nsid(n) => write!(f, "{n}"),
            Key::Id(id) => f.write_str(id),
        }
    }
}

/// Our subsystem ID and the namespace's key in an OPI namespace name
/// (`nvmeSubsystems/{s}/nvmeNamespaces/{id or NSID}`).
pub fn namespace_key(field: &str, name: &str) -> Result<(String, Key)> {
    let (sid, last) = validate::child_name(field, name, SUBSYSTEMS, NAMESPACES)?;
    validate::id(field, sid)?;
    let key = if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        match last.parse::<u32>() {
            Ok(n) if (1..=validate::MAX_NAMESPACES).contains(&n) => Key::Nsid(n),
            _ => {
                return Err(ControlError::invalid(
                    field,
                    format!(
                        "{last:?} is no NSID (1..={}) and no namespace ID",
                        validate::MAX_NAMESPACES
                    ),
                ))
            }
        }
    } else {
        validate::id(field, last)?;
        Key::Id(last.to_string())
    };
    Ok((sid.to_string(), key))
}

/// The volume an OPI `volume_name_ref` names: its ID, and the kind its
/// OPI collection says it is of (`None` for a bare ID or `volumes/{id}`).
pub fn volume_ref(field: &str, s: &str) -> Result<(String, Option<Kind>)> {
    if s.is_empty() {
        return Err(ControlError::invalid(
            field,
            "is required: the volume the namespace serves",
        ));
    }
    for kind in [Kind::Malloc, Kind::Aio, Kind::Null] {
        if let Some(id) = s
            .strip_prefix(kind.collection())
            .and_then(|r| r.strip_prefix('/'))
        {
            return Ok((validate::volume_ref(field, id)?, Some(kind)));
        }
    }
    Ok((validate::volume_ref(field, s)?, None))
}

/// An NGUID as 32 hex digits or in UUID text form (8-4-4-4-12).
pub fn nguid(field: &str, s: &str) -> Result<[u8; 16]> {
    if s.contains('-') {
        validate::uuid(field, s)
    } else {
        validate::hex16(field, s)
    }
}

/// OPI's EUI-64, a 64-bit integer, as its 8 bytes (big-endian); 0 is none.
pub fn eui64_bytes(v: i64) -> Option<[u8; 8]> {
    (v != 0).then(|| v.to_be_bytes())
}

/// Lower-case hex digits of `b`.
fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An OPI namespace spec, checked, in the terms of `dpu.v1`. `None` and 0
/// are what the request left empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The NSID, 0 for none given.
    pub nsid: u32,
    /// The UUID.
    pub uuid: Option<[u8; 16]>,
    /// The NGUID.
    pub nguid: Option<[u8; 16]>,
    /// The EUI-64.
    pub eui64: Option<[u8; 8]>,
    /// The volume's ID and the kind its reference says it is of.
    pub volume: Option<(String, Option<Kind>)>,
}

impl Spec {
    /// Checks `s` (errors name `field`'s members); `volume_name_ref` may
    /// be empty here (a create requires it).
    pub fn check(field: &str, s: &opi::NvmeNamespaceSpec) -> Result<Spec> {
        let f = |m: &str| format!("{field}.{m}");
        let nsid = u32::try_from(s.host_nsid)
            .ok()
            .filter(|n| *n <= validate::MAX_NAMESPACES)
            .ok_or_else(|| {
                ControlError::invalid(
                    f("host_nsid"),
                    format!(
                        "{} is not in 0..={} (0: the lowest free)",
                        s.host_nsid,
                        validate::MAX_NAMESPACES
                    ),
                )
            })?;
        let uuid = match s.uuid.as_str() {
            "" => None,
            u => Some(validate::uuid(&f("uuid"), u)?),
        };
        let nguid = match s.nguid.as_str() {
            "" => None,
            n => Some(nguid(&f("nguid"), n)?),
        };
        let volume = match s.volume_name_ref.as_str() {
            "" => None,
            v => Some(volume_ref(&f("volume_name_ref"), v)?),
        };
        Ok(Spec {
            nsid,
            uuid,
            nguid,
            eui64: eui64_bytes(s.eui64),
            volume,
        })
    }

    /// The `dpu.v1` namespace it describes, with ID `namespace_id`.
    pub fn namespace(&self, namespace_id: String) -> pb::Namespace {
        pb::Namespace {
            nsid: self.nsid,
            backend: self
                .volume
                .as_ref()
                .map(|(id, _)| pb::namespace::Backend::Volume(id.clone())),
            uuid: self
                .uuid
                .as_ref()
                .map(crate::convert::uuid_text)
                .unwrap_or_default(),
            nguid: self.nguid.as_ref().map(|n| hex(n)).unwrap_or_default(),
            namespace_id,
            eui64: self.eui64.as_ref().map(|e| hex(e)).unwrap_or_default(),
            ..Default::default()
        }
    }
}

/// The OPI view of one of our namespaces.
pub fn namespace_to_opi(n: pb::Namespace) -> opi::NvmeNamespace {
    // "subsystems/{s}/namespaces/{nsid}"
    let sid = n.name.split('/').nth(1).unwrap_or_default();
    let last = if n.namespace_id.is_empty() {
        n.nsid.to_string()
    } else {
        n.namespace_id.clone()
    };
    let eui64 = match validate::eui64("eui64", &n.eui64) {
        Ok(b) => i64::from_be_bytes(b),
        Err(_) => 0,
    };
    let volume_name_ref = match n.backend {
        Some(pb::namespace::Backend::Volume(v)) => v,
        _ => String::new(),
    };
    let serving = n.state == pb::NamespaceState::Serving as i32;
    opi::NvmeNamespace {
        name: format!("{SUBSYSTEMS}/{sid}/{NAMESPACES}/{last}"),
        spec: Some(opi::NvmeNamespaceSpec {
            host_nsid: i32::try_from(n.nsid).unwrap_or(i32::MAX),
            nguid: n.nguid,
            eui64,
            uuid: n.uuid,
            volume_name_ref,
        }),
        status: Some(opi::NvmeNamespaceStatus {
            state: if serving {
                State::Enabled
            } else {
                State::Disabled
            } as i32,
            oper_state: if serving {
                OperState::Online
            } else {
                OperState::Offline
            } as i32,
        }),
    }
}

/// The update-mask paths of an `UpdateNvmeNamespace` request, `*` (or
/// none) meaning every field; `name` (which identifies the namespace)
/// and `status` (output only) are ignored, and a path that is no field
/// is refused.
pub fn update_paths(mask: Option<&FieldMask>) -> Result<Vec<&'static str>> {
    let paths = mask.map(|m| m.paths.as_slice()).unwrap_or_default();
    if paths.is_empty() || paths.iter().any(|p| p == "*") {
        return Ok(SPEC_FIELDS.to_vec());
    }
    let mut out = Vec::new();
    for p in paths {
        if p == "name" || p == "status" || p.starts_with("status.") {
            continue;
        }
        if p == "spec" {
            out.extend_from_slice(SPEC_FIELDS);
            continue;
        }
        let f = SPEC_FIELDS
            .iter()
            .copied()
            .find(|f| f == p || f.strip_prefix("spec.") == Some(p.as_str()))
            .ok_or_else(|| {
                ControlError::invalid(
                    "update_mask",
                    format!("{p:?} is not a field of NvmeNamespace"),
                )
            })?;
        out.push(f);
    }
    Ok(out)
}

/// The first of the masked fields `paths` that `wanted` would change in
/// `current` (the namespace as it is stored); an empty or zero value is
/// no change.
pub fn changed_field(
    paths: &[&'static str],
    wanted: &Spec,
    current: &pb::Namespace,
) -> Option<&'static str> {
    let cur_uuid = validate::uuid("uuid", &current.uuid).ok();
    let cur_nguid = validate::hex16("nguid", &current.nguid).ok();
    let cur_eui64 = validate::eui64("eui64", &current.eui64).ok();
    let cur_volume = match &current.backend {
        Some(pb::namespace::Backend::Volume(v)) => Some(v.as_str()),
        _ => None,
    };
    let changes = |p: &str| match p {
        "spec.host_nsid" => wanted.nsid != 0 && wanted.nsid != current.nsid,
        "spec.uuid" => wanted.uuid.is_some() && wanted.uuid != cur_uuid,
        "spec.nguid" => wanted.nguid.is_some() && wanted.nguid != cur_nguid,
        "spec.eui64" => wanted.eui64.is_some() && wanted.eui64 != cur_eui64,
        "spec.volume_name_ref" => wanted
            .volume
            .as_ref()
            .is_some_and(|(id, _)| Some(id.as_str()) != cur_volume),
        _ => false,
    };
    paths.iter().copied().find(|p| changes(p))
}

/// `status` with the `dpu.v1` namespace fields it names at its start
/// renamed to the OPI fields they came from.
fn opi_fields(status: Status) -> Status {
    const RENAMED: &[(&str, &str)] = &[
        ("namespace.nsid", "nvme_namespace.spec.host_nsid"),
        ("namespace.uuid", "nvme_namespace.spec.uuid"),
        ("namespace.nguid", "nvme_namespace.spec.nguid"),
        ("namespace.eui64", "nvme_namespace.spec.eui64"),
        ("namespace.volume", "nvme_namespace.spec.volume_name_ref"),
        ("namespace.namespace_id", "nvme_namespace_id"),
    ];
    let m = status.message();
    // A remote backend comes from the remote controller the volume
    // reference names.
    if let Some(rest) = m.strip_prefix("namespace.remote.") {
        return Status::new(
            status.code(),
            format!("nvme_namespace.spec.volume_name_ref: remote.{rest}"),
        );
    }
    for (ours, theirs) in RENAMED {
        if let Some(rest) = m.strip_prefix(ours) {
            if rest.starts_with([':', ' ']) {
                return Status::new(status.code(), format!("{theirs}{rest}"));
            }
        }
    }
    status
}

impl Api {
    /// The OPI view of `n`: [`namespace_to_opi`], with `volume_name_ref`
    /// `{c}n{nsid}` for a namespace backed by a remote namespace of
    /// controller `{c}`'s subsystem.
    fn opi_ns_view(&self, n: pb::Namespace) -> opi::NvmeNamespace {
        let remote = self.opi_remote_ref(&n);
        let mut o = namespace_to_opi(n);
        if let (Some(r), Some(spec)) = (remote, o.spec.as_mut()) {
            spec.volume_name_ref = r;
        }
        o
    }

    /// The `volume_name_ref` OPI shows for `n` when a remote namespace
    /// backs it and a controller of its subsystem exists.
    fn opi_remote_ref(&self, n: &pb::Namespace) -> Option<String> {
        let Some(pb::namespace::Backend::Remote(r)) = &n.backend else {
            return None;
        };
        opi_remote::remote_ref_of(&self.ctl.state.snapshot(), &r.subnqn, r.nsid)
    }

    /// `n` as an update compares with what OPI gives: a remote backend
    /// shown as `{c}n{nsid}` is that volume reference.
    fn opi_ns_comparable(&self, mut n: pb::Namespace) -> pb::Namespace {
        if let Some(r) = self.opi_remote_ref(&n) {
            n.backend = Some(pb::namespace::Backend::Volume(r));
        }
        n
    }

    /// Namespace `key` of subsystem `sid`, as `dpu.v1` shows it.
    fn opi_namespace(&self, sid: &str, key: &Key) -> std::result::Result<pb::Namespace, Status> {
        let state = self.ctl.state.snapshot();
        let sub = state.subsystem(sid)?;
        let found = match key {
            Key::Nsid(n) => sub.namespaces.get(n),
            Key::Id(id) => sub.namespaces.values().find(|n| n.namespace_id == *id),
        };
        let n = found.ok_or_else(|| {
            ControlError::NotFound(format!("{SUBSYSTEMS}/{sid}/{NAMESPACES}/{key}"))
        })?;
        Ok(self.namespace_out(sub, n))
    }

    /// Creates namespace `id` (its `namespace_id`) of subsystem `sid` from
    /// a checked OPI spec through `dpu.v1` `CreateNamespace`.
    async fn opi_create_namespace<T>(
        &self,
        outer: &Request<T>,
        sid: &str,
        id: String,
        spec: Spec,
    ) -> std::result::Result<opi::NvmeNamespace, Status> {
        let field = "nvme_namespace.spec.volume_name_ref";
        let Some((volume, kind)) = &spec.volume else {
            return Err(ControlError::invalid(
                field,
                "is required: the volume the namespace serves",
            )
            .into());
        };
        if let Some(kind) = kind {
            let state = self.ctl.state.snapshot();
            let is = state
                .volumes
                .get(volume)
                .and_then(|v| Kind::of_backend(&v.backend));
            if is.is_some_and(|is| is != *kind) {
                return Err(ControlError::invalid(
                    field,
                    format!("volumes/{volume} is no volume of {}", kind.collection()),
                )
                .into());
            }
        }
        let mut namespace = spec.namespace(id);
        let is_volume = self.ctl.state.snapshot().volumes.contains_key(volume);
        if let (None, false, Some((cid, nsid))) = (kind, is_volume, opi_remote::remote_ref(volume))
        {
            if let Some((remote, block_size)) = self.opi_remote_backend(field, cid, nsid).await? {
                namespace.backend = Some(pb::namespace::Backend::Remote(remote));
                namespace.block_size = block_size.unwrap_or(0);
            }
        }
        let created = StorageService::create_namespace(
            self,
            inner(
                outer,
                pb::CreateNamespaceRequest {
                    parent: format!("subsystems/{sid}"),
                    namespace: Some(namespace),
                },
            ),
        )
        .await
        .map_err(opi_fields)?;
        Ok(self.opi_ns_view(created.into_inner()))
    }

    /// `CreateNvmeNamespace`.
    pub(super) async fn opi_ns_create(
        &self,
        req: Request<opi::CreateNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<opi::NvmeNamespace>, Status> {
        let r = req.get_ref();
        let sid = validate::name("parent", &r.parent, SUBSYSTEMS)?.to_string();
        let id = if r.nvme_namespace_id.is_empty() {
            generated_id()
        } else {
            validate::id("nvme_namespace_id", &r.nvme_namespace_id)?;
            r.nvme_namespace_id.clone()
        };
        let n = required("nvme_namespace", r.nvme_namespace.as_ref())?;
        let spec = Spec::check(
            "nvme_namespace.spec",
            required("nvme_namespace.spec", n.spec.as_ref())?,
        )?;
        Ok(Response::new(
            self.opi_create_namespace(&req, &sid, id, spec).await?,
        ))
    }

    /// `DeleteNvmeNamespace`.
    pub(super) async fn opi_ns_delete(
        &self,
        req: Request<opi::DeleteNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        let (sid, key) = namespace_key("name", &req.get_ref().name)?;
        let deleted = match self.opi_namespace(&sid, &key) {
            Ok(n) => {
                StorageService::delete_namespace(
                    self,
                    inner(&req, pb::DeleteNamespaceRequest { name: n.name }),
                )
                .await
            }
            Err(e) => Err(e),
        };
        gone(deleted, req.get_ref().allow_missing)
    }

    /// `UpdateNvmeNamespace`: see the module's documentation.
    pub(super) async fn opi_ns_update(
        &self,
        req: Request<opi::UpdateNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<opi::NvmeNamespace>, Status> {
        let r = req.get_ref();
        let n = required("nvme_namespace", r.nvme_namespace.as_ref())?;
        let (sid, key) = namespace_key("nvme_namespace.name", &n.name)?;
        let paths = update_paths(r.update_mask.as_ref())?;
        let spec = Spec::check(
            "nvme_namespace.spec",
            required("nvme_namespace.spec", n.spec.as_ref())?,
        )?;
        let current = match self.opi_namespace(&sid, &key) {
            Ok(c) => c,
            Err(e) if e.code() == Code::NotFound && r.allow_missing => {
                let (id, spec) = match key {
                    Key::Id(id) => (id, spec),
                    Key::Nsid(nsid) if spec.nsid == 0 || spec.nsid == nsid => {
                        (String::new(), Spec { nsid, ..spec })
                    }
                    Key::Nsid(nsid) => {
                        return Err(ControlError::invalid(
                            "nvme_namespace.spec.host_nsid",
                            format!("differs from the NSID the name gives ({nsid})"),
                        )
                        .into())
                    }
                };
                return Ok(Response::new(
                    self.opi_create_namespace(&req, &sid, id, spec).await?,
                ));
            }
            Err(e) => return Err(e),
        };
        if let Some(path) = changed_field(&paths, &spec, &self.opi_ns_comparable(current.clone())) {
            return Err(ControlError::invalid(
                format!("nvme_namespace.{path}"),
                "cannot change once the namespace exists: delete it and create another",
            )
            .into());
        }
        Ok(Response::new(self.opi_ns_view(current)))
    }

    /// `ListNvmeNamespaces`: a page of `dpu.v1` `ListNamespaces`.
    pub(super) async fn opi_ns_list(
        &self,
        req: Request<opi::ListNvmeNamespacesRequest>,
    ) -> std::result::Result<Response<opi::ListNvmeNamespacesResponse>, Status> {
        let r = req.get_ref();
        let sid = validate::name("parent", &r.parent, SUBSYSTEMS)?;
        let page = StorageService::list_namespaces(
            self,
            inner(
                &req,
                pb::ListNamespacesRequest {
                    parent: format!("subsystems/{sid}"),
                    page_size: r.page_size,
                    page_token: r.page_token.clone(),
                },
            ),
        )
        .await?
        .into_inner();
        Ok(Response::new(opi::ListNvmeNamespacesResponse {
            nvme_namespaces: page
                .namespaces
                .into_iter()
                .map(|n| self.opi_ns_view(n))
                .collect(),
            next_page_token: page.next_page_token,
        }))
    }

    /// `GetNvmeNamespace`.
    pub(super) async fn opi_ns_get(
        &self,
        req: Request<opi::GetNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<opi::NvmeNamespace>, Status> {
        let (sid, key) = namespace_key("name", &req.get_ref().name)?;
        Ok(Response::new(
            self.opi_ns_view(self.opi_namespace(&sid, &key)?),
        ))
    }

    /// `StatsNvmeNamespace`: the I/O counters of the namespace's
    /// subsystem (the target counts I/O per subsystem, not per
    /// namespace), in OPI's 32-bit fields, saturating.
    pub(super) async fn opi_ns_stats(
        &self,
        req: Request<opi::StatsNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<opi::StatsNvmeNamespaceResponse>, Status> {
        let (sid, key) = namespace_key("name", &req.get_ref().name)?;
        self.opi_namespace(&sid, &key)?;
        let c = self
            .ctl
            .telemetry
            .collect()
            .subsystems
            .remove(&sid)
            .unwrap_or_default();
        let n = |v: u64| i32::try_from(v).unwrap_or(i32::MAX);
        Ok(Response::new(opi::StatsNvmeNamespaceResponse {
            stats: Some(opi::VolumeStats {
                read_bytes_count: n(c.read_bytes),
                read_ops_count: n(c.read_ops),
                write_bytes_count: n(c.write_bytes),
                write_ops_count: n(c.write_ops),
                ..Default::default()
            }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pydpu's spec: NGUID in UUID text form, EUI-64 as an integer.
    fn pydpu() -> opi::NvmeNamespaceSpec {
        opi::NvmeNamespaceSpec {
            host_nsid: 1,
            nguid: "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb".into(),
            eui64: 1_967_554_867_335_598_546,
            uuid: "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb".into(),
            volume_name_ref: "Malloc1".into(),
        }
    }

    const BYTES: [u8; 16] = [
        0x1b, 0x4e, 0x28, 0xba, 0x2f, 0xa1, 0x11, 0xd2, 0x88, 0x3f, 0xb9, 0xa7, 0x61, 0xbd, 0xe3,
        0xfb,
    ];

    #[test]
    fn an_nguid_is_read_in_either_form() {
        assert_eq!(
            nguid("f", "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb").unwrap(),
            BYTES
        );
        assert_eq!(
            nguid("f", "1b4e28ba2fa111d2883fb9a761bde3fb").unwrap(),
            BYTES
        );
        assert_eq!(
            nguid("f", "1B4E28BA2FA111D2883FB9A761BDE3FB").unwrap(),
            BYTES
        );
        for bad in [
            "1b4e28ba-2fa1-11d2-883f-b9a761bde3f",
            "1b4e28ba2fa111d2883fb9a761bde3",
            "1b4e28ba-2fa111d2-883f-b9a761bde3fb",
            "xyz",
        ] {
            let e = nguid("nvme_namespace.spec.nguid", bad).unwrap_err();
            assert!(
                e.to_string().starts_with("nvme_namespace.spec.nguid:"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn an_eui64_is_its_integers_big_endian_bytes() {
        assert_eq!(
            eui64_bytes(1_967_554_867_335_598_546),
            Some([0x1b, 0x4e, 0x28, 0xba, 0x2f, 0xa1, 0x11, 0xd2])
        );
        assert_eq!(eui64_bytes(0), None);
        assert_eq!(eui64_bytes(-1), Some([0xff; 8]));
        assert_eq!(eui64_bytes(1), Some([0, 0, 0, 0, 0, 0, 0, 1]));
    }

    #[test]
    fn names_give_an_id_or_an_nsid() {
        let key = |n: &str| namespace_key("name", n).map_err(|e| e.to_string());
        assert_eq!(
            key("nvmeSubsystems/s1/nvmeNamespaces/opi-1b4e28ba-2fa1").unwrap(),
            ("s1".to_string(), Key::Id("opi-1b4e28ba-2fa1".into()))
        );
        assert_eq!(
            key("nvmeSubsystems/s1/nvmeNamespaces/3").unwrap(),
            ("s1".to_string(), Key::Nsid(3))
        );
        for bad in [
            "nvmeSubsystems/s1/nvmeNamespaces/0",
            "nvmeSubsystems/s1/nvmeNamespaces/1025",
            "nvmeSubsystems/s1/nvmeNamespaces/99999999999",
            "nvmeSubsystems/s1/nvmeNamespaces/Ns1",
            "nvmeSubsystems/s1/nvmeNamespaces/",
            "nvmeSubsystems/S1/nvmeNamespaces/ns",
            "subsystems/s1/namespaces/1",
            "nvmeSubsystems/s1/nvmeControllers/ns",
            "nvmeSubsystems/s1/nvmeNamespaces/ns/x",
        ] {
            let e = key(bad).unwrap_err();
            assert!(e.starts_with("name:"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_volume_is_named_by_id_or_by_any_collection() {
        let v = |s: &str| volume_ref("f", s).map_err(|e| e.to_string());
        assert_eq!(v("Malloc1").unwrap(), ("Malloc1".to_string(), None));
        assert_eq!(v("volumes/v1").unwrap(), ("v1".to_string(), None));
        assert_eq!(
            v("mallocVolumes/Malloc1").unwrap(),
            ("Malloc1".to_string(), Some(Kind::Malloc))
        );
        assert_eq!(
            v("aioVolumes/d").unwrap(),
            ("d".to_string(), Some(Kind::Aio))
        );
        assert_eq!(
            v("nullVolumes/n").unwrap(),
            ("n".to_string(), Some(Kind::Null))
        );
        for bad in ["", "mallocVolumes/", "mallocVolumes/a/b", "1abc", "x y"] {
            assert!(v(bad).unwrap_err().starts_with("f:"), "{bad}");
        }
    }

    #[test]
    fn pydpus_spec_is_the_dpu_v1_namespace_it_stands_for() {
        let s = Spec::check("nvme_namespace.spec", &pydpu()).unwrap();
        let n = s.namespace("opi-ns".into());
        assert_eq!(n.nsid, 1);
        assert_eq!(
            n.backend,
            Some(pb::namespace::Backend::Volume("Malloc1".into()))
        );
        assert_eq!(n.uuid, "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb");
        assert_eq!(n.nguid, "1b4e28ba2fa111d2883fb9a761bde3fb");
        assert_eq!(n.eui64, "1b4e28ba2fa111d2");
        assert_eq!(n.namespace_id, "opi-ns");
        // What dpu.v1 takes of it.
        let (m, has_uuid, has_nguid) = validate::namespace("namespace", &n, "").unwrap();
        assert!(has_uuid && has_nguid);
        assert_eq!((m.uuid, m.nguid), (BYTES, BYTES));

        // Empty is left to dpu.v1 to choose.
        let s = Spec::check("s", &opi::NvmeNamespaceSpec::default()).unwrap();
        let n = s.namespace(String::new());
        assert_eq!((n.nsid, n.backend, n.uuid.as_str()), (0, None, ""));
        assert_eq!((n.nguid.as_str(), n.eui64.as_str()), ("", ""));
    }

    #[test]
    fn a_bad_spec_is_refused_naming_opis_field() {
        for (f, field) in [
            (
                (|s: &mut opi::NvmeNamespaceSpec| s.host_nsid = -1)
                    as fn(&mut opi::NvmeNamespaceSpec),
                "host_nsid",
            ),
            (|s| s.host_nsid = 1025, "host_nsid"),
            (
                |s| s.uuid = "1b4e28ba2fa111d2883fb9a761bde3fb".into(),
                "uuid",
            ),
            (|s| s.nguid = "1b4e28ba".into(), "nguid"),
            (
                |s| s.volume_name_ref = "aioVolumes/".into(),
                "volume_name_ref",
            ),
            (|s| s.volume_name_ref = "-x".into(), "volume_name_ref"),
        ] {
            let mut s = pydpu();
            f(&mut s);
            let e = Spec::check("nvme_namespace.spec", &s)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("nvme_namespace.spec.{field}:")),
                "{field}: {e}"
            );
        }
        // The dpu.v1 call's refusals name OPI's fields.
        let s = opi_fields(Status::already_exists(
            "namespace.uuid is used by another namespace",
        ));
        assert_eq!(s.code(), Code::AlreadyExists);
        assert_eq!(
            s.message(),
            "nvme_namespace.spec.uuid is used by another namespace"
        );
        let s = opi_fields(Status::failed_precondition(
            "namespace.volume: subsystems/s/namespaces/1 is made on volumes/v already",
        ));
        assert!(s
            .message()
            .starts_with("nvme_namespace.spec.volume_name_ref: "));
        let s = opi_fields(Status::invalid_argument(
            "namespace.nsid: 9 exceeds max_namespaces",
        ));
        assert!(s.message().starts_with("nvme_namespace.spec.host_nsid: "));
        let s = opi_fields(Status::already_exists("namespace.namespace_id: taken"));
        assert!(s.message().starts_with("nvme_namespace_id: "));
        let s = opi_fields(Status::not_found("subsystems/s"));
        assert_eq!(s.message(), "subsystems/s");
    }

    #[test]
    fn the_view_names_by_id_or_nsid_and_says_whether_it_serves() {
        let ours = pb::Namespace {
            name: "subsystems/s1/namespaces/2".into(),
            nsid: 2,
            backend: Some(pb::namespace::Backend::Volume("Malloc1".into())),
            uuid: "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb".into(),
            nguid: "1b4e28ba2fa111d2883fb9a761bde3fb".into(),
            namespace_id: "opi-ns".into(),
            eui64: "1b4e28ba2fa111d2".into(),
            state: pb::NamespaceState::Serving as i32,
            ..Default::default()
        };
        let o = namespace_to_opi(ours.clone());
        assert_eq!(o.name, "nvmeSubsystems/s1/nvmeNamespaces/opi-ns");
        let spec = o.spec.clone().unwrap();
        assert_eq!(spec.host_nsid, 2);
        assert_eq!(spec.eui64, 1_967_554_867_335_598_546);
        assert_eq!(spec.volume_name_ref, "Malloc1");
        assert_eq!(spec.uuid, ours.uuid);
        let st = o.status.unwrap();
        assert_eq!(
            (st.state, st.oper_state),
            (
                opi::nvme_namespace_status::State::Enabled as i32,
                opi::nvme_namespace_status::OperState::Online as i32
            )
        );
        // The view's spec checks as the namespace it shows, unchanged.
        let again = Spec::check("s", &spec).unwrap();
        assert_eq!(changed_field(SPEC_FIELDS, &again, &ours), None);
        assert_eq!(
            again.namespace("opi-ns".into()),
            pb::Namespace {
                name: String::new(),
                state: 0,
                ..ours.clone()
            }
        );

        let bare = pb::Namespace {
            namespace_id: String::new(),
            eui64: String::new(),
            backend: Some(pb::namespace::Backend::Ram(pb::RamBackend {
                size_bytes: 4096,
            })),
            state: pb::NamespaceState::NotServed as i32,
            ..ours
        };
        let o = namespace_to_opi(bare);
        assert_eq!(o.name, "nvmeSubsystems/s1/nvmeNamespaces/2");
        let spec = o.spec.unwrap();
        assert_eq!((spec.eui64, spec.volume_name_ref.as_str()), (0, ""));
        let st = o.status.unwrap();
        assert_eq!(
            (st.state, st.oper_state),
            (
                opi::nvme_namespace_status::State::Disabled as i32,
                opi::nvme_namespace_status::OperState::Offline as i32
            )
        );
    }

    #[test]
    fn an_update_may_repeat_but_not_change() {
        let current = Spec::check("s", &pydpu())
            .unwrap()
            .namespace("opi-ns".into());
        let current = pb::Namespace { nsid: 1, ..current };
        let all = update_paths(None).unwrap();
        let same = Spec::check("s", &pydpu()).unwrap();
        assert_eq!(changed_field(&all, &same, &current), None);
        // Empty and zero are no change.
        let empty = Spec::check("s", &opi::NvmeNamespaceSpec::default()).unwrap();
        assert_eq!(changed_field(&all, &empty, &current), None);
        for (f, path) in [
            (
                (|s: &mut opi::NvmeNamespaceSpec| s.host_nsid = 2)
                    as fn(&mut opi::NvmeNamespaceSpec),
                "spec.host_nsid",
            ),
            (|s| s.eui64 = 7, "spec.eui64"),
            (
                |s| s.uuid = "f81d4fae-7dec-11d0-a765-00a0c91e6bf6".into(),
                "spec.uuid",
            ),
            (
                |s| s.nguid = "f81d4fae7dec11d0a76500a0c91e6bf6".into(),
                "spec.nguid",
            ),
            (
                |s| s.volume_name_ref = "mallocVolumes/Malloc2".into(),
                "spec.volume_name_ref",
            ),
        ] {
            let mut s = pydpu();
            f(&mut s);
            let wanted = Spec::check("s", &s).unwrap();
            assert_eq!(changed_field(&all, &wanted, &current), Some(path));
            // Not when the mask leaves the field out.
            let others: Vec<_> = all.iter().copied().filter(|p| *p != path).collect();
            assert_eq!(changed_field(&others, &wanted, &current), None, "{path}");
        }
        // The same volume by another of its names is no change.
        let mut s = pydpu();
        s.volume_name_ref = "volumes/Malloc1".into();
        assert_eq!(
            changed_field(&all, &Spec::check("s", &s).unwrap(), &current),
            None
        );
    }

    /// Through the services: pydpu's create on a volume made through
    /// dpu.v1, seen by both APIs under its ID and NSID; one namespace per
    /// volume and per ID; updates that repeat and that would change;
    /// `allow_missing`; deletes.
    #[tokio::test]
    async fn namespaces_made_through_opi_are_dpu_v1_namespaces() {
        use dpu_proto::opi::storage::v1::frontend_nvme_service_server::FrontendNvmeService;

        let state = crate::store::StateHandle::open(None).unwrap();
        let api = Api::for_tests(
            state,
            Default::default(),
            crate::service::testing::LIMITS,
            None,
            None,
        );
        for id in ["Malloc1", "Malloc2"] {
            StorageService::create_volume(
                &api,
                Request::new(pb::CreateVolumeRequest {
                    volume_id: id.into(),
                    volume: Some(pb::Volume {
                        backend: Some(pb::volume::Backend::Ram(pb::RamBackend {
                            size_bytes: 64 << 10,
                        })),
                        ..Default::default()
                    }),
                }),
            )
            .await
            .unwrap();
        }
        api.create_nvme_subsystem(Request::new(opi::CreateNvmeSubsystemRequest {
            nvme_subsystem_id: "opi1".into(),
            nvme_subsystem: Some(opi::NvmeSubsystem {
                spec: Some(opi::NvmeSubsystemSpec {
                    nqn: "nqn.2022-09.io.spdk:opi1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }))
        .await
        .unwrap();
        let create = |id: &str, spec: opi::NvmeNamespaceSpec| {
            Request::new(opi::CreateNvmeNamespaceRequest {
                parent: "nvmeSubsystems/opi1".into(),
                nvme_namespace_id: id.into(),
                nvme_namespace: Some(opi::NvmeNamespace {
                    spec: Some(spec),
                    ..Default::default()
                }),
            })
        };
        const NAME: &str = "nvmeSubsystems/opi1/nvmeNamespaces/opi-ns1";
        let made = api
            .create_nvme_namespace(create("opi-ns1", pydpu()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(made.name, NAME);
        let spec = made.spec.clone().unwrap();
        assert_eq!((spec.host_nsid, spec.eui64), (1, 1_967_554_867_335_598_546));
        assert_eq!(spec.volume_name_ref, "Malloc1");
        assert_eq!(spec.nguid, "1b4e28ba2fa111d2883fb9a761bde3fb");

        // dpu.v1 sees it, with its ID and EUI-64.
        let ours = StorageService::get_namespace(
            &api,
            Request::new(pb::GetNamespaceRequest {
                name: "subsystems/opi1/namespaces/1".into(),
            }),
        )
        .await
        .unwrap()
        .into_inner();
        assert_eq!(
            (ours.namespace_id.as_str(), ours.eui64.as_str()),
            ("opi-ns1", "1b4e28ba2fa111d2")
        );
        assert_eq!(
            ours.backend,
            Some(pb::namespace::Backend::Volume("Malloc1".into()))
        );
        // OPI finds it by its ID and by its NSID.
        for name in [NAME, "nvmeSubsystems/opi1/nvmeNamespaces/1"] {
            let got = api
                .get_nvme_namespace(Request::new(opi::GetNvmeNamespaceRequest {
                    name: name.into(),
                }))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(got, made, "{name}");
        }

        // The volume serves one namespace; an ID is one namespace's.
        let mut other = pydpu();
        other.uuid.clear();
        other.nguid.clear();
        other.host_nsid = 0;
        let e = api
            .create_nvme_namespace(create("opi-ns2", other.clone()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(
            e.message()
                .starts_with("nvme_namespace.spec.volume_name_ref"),
            "{e:?}"
        );
        other.volume_name_ref = "mallocVolumes/Malloc2".into();
        let e = api
            .create_nvme_namespace(create("opi-ns1", other.clone()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
        assert!(e.message().starts_with("nvme_namespace_id"), "{e:?}");
        other.volume_name_ref = "nullVolumes/Malloc2".into();
        let e = api
            .create_nvme_namespace(create("opi-ns2", other.clone()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message()
                .starts_with("nvme_namespace.spec.volume_name_ref"),
            "{e:?}"
        );
        let mut none = pydpu();
        none.volume_name_ref.clear();
        let e = api
            .create_nvme_namespace(create("opi-ns2", none))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message()
                .starts_with("nvme_namespace.spec.volume_name_ref"),
            "{e:?}"
        );

        // An update repeating the spec answers the namespace; one changing
        // it is refused by field; allow_missing creates, under an NSID
        // name too.
        let update = |name: &str, spec: opi::NvmeNamespaceSpec, allow_missing| {
            Request::new(opi::UpdateNvmeNamespaceRequest {
                nvme_namespace: Some(opi::NvmeNamespace {
                    name: name.into(),
                    spec: Some(spec),
                    ..Default::default()
                }),
                update_mask: Some(FieldMask {
                    paths: vec!["*".into()],
                }),
                allow_missing,
            })
        };
        let same = api
            .update_nvme_namespace(update(NAME, pydpu(), false))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(same, made);
        let mut moved = pydpu();
        moved.eui64 = 5;
        let e = api
            .update_nvme_namespace(update(NAME, moved, false))
            .await
            .unwrap_err();
        assert!(
            e.message().starts_with("nvme_namespace.spec.eui64:"),
            "{e:?}"
        );
        let up = api
            .update_nvme_namespace(update(
                "nvmeSubsystems/opi1/nvmeNamespaces/7",
                other.clone(),
                true,
            ))
            .await
            .map(Response::into_inner);
        assert!(
            matches!(&up, Err(e) if e.code() == Code::InvalidArgument),
            "nullVolumes/Malloc2 is a RAM volume: {up:?}"
        );
        other.volume_name_ref = "Malloc2".into();
        let up = api
            .update_nvme_namespace(update(
                "nvmeSubsystems/opi1/nvmeNamespaces/7",
                other.clone(),
                true,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(up.name, "nvmeSubsystems/opi1/nvmeNamespaces/7");
        assert_eq!(up.spec.map(|s| s.host_nsid), Some(7));

        let list = api
            .list_nvme_namespaces(Request::new(opi::ListNvmeNamespacesRequest {
                parent: "nvmeSubsystems/opi1".into(),
                page_size: 1,
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(list.nvme_namespaces, [made]);
        assert!(!list.next_page_token.is_empty());
        let stats = api
            .stats_nvme_namespace(Request::new(opi::StatsNvmeNamespaceRequest {
                name: NAME.into(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(stats.stats.map(|s| s.read_ops_count), Some(0));

        // Deletes: by ID and by NSID; again only when allowed to miss.
        for name in [NAME, "nvmeSubsystems/opi1/nvmeNamespaces/7"] {
            let delete = |allow_missing| {
                Request::new(opi::DeleteNvmeNamespaceRequest {
                    name: name.into(),
                    allow_missing,
                })
            };
            api.delete_nvme_namespace(delete(false)).await.unwrap();
            let e = api.delete_nvme_namespace(delete(false)).await.unwrap_err();
            assert_eq!(e.code(), Code::NotFound, "{e:?}");
            api.delete_nvme_namespace(delete(true)).await.unwrap();
        }
        let e = api
            .get_nvme_namespace(Request::new(opi::GetNvmeNamespaceRequest {
                name: NAME.into(),
            }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
    }

    #[test]
    fn update_masks_name_spec_fields_with_or_without_the_prefix() {
        let mask = |p: &[&str]| FieldMask {
            paths: p.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(update_paths(Some(&mask(&["*"]))).unwrap(), SPEC_FIELDS);
        assert_eq!(update_paths(Some(&mask(&["spec"]))).unwrap(), SPEC_FIELDS);
        assert_eq!(
            update_paths(Some(&mask(&["name", "eui64", "spec.uuid"]))).unwrap(),
            ["spec.eui64", "spec.uuid"]
        );
        let e = update_paths(Some(&mask(&["spec.colour"]))).unwrap_err();
        assert!(e.to_string().starts_with("update_mask:"), "{e}");
    }
}
