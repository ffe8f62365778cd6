//! OPI's volume services (`opi_api.storage.v1.MallocVolumeService`,
//! `AioVolumeService` and `NullVolumeService`) over the volumes of
//! `dpu.v1`: an OPI volume is a view of one of our volumes, so what either
//! API makes the other shows and changes, a namespace made on it through
//! `dpu.v1` serves it, and it is stored once. As for the NVMe front end
//! ([`super::opi`]), each call checks the OPI request (errors name OPI's
//! fields), turns it into the `dpu.v1` call it stands for and runs that
//! through [`StorageService`], so validation, the backing-file policy,
//! persistence and the target's configuration are those of `dpu.v1`.
//!
//! Mapping: `mallocVolumes/{id}`, `aioVolumes/{id}` and `nullVolumes/{id}`
//! are all `volumes/{id}`, one ID space: each service sees only the
//! volumes of its kind (a volume of another kind with the ID is
//! `NOT_FOUND` there), and creating with an ID any volume has is
//! `ALREADY_EXISTS`.
//! - A `MallocVolume` is a RAM volume of `block_size * blocks_count`
//!   bytes. `metadata_size` (per-block metadata) is not offered and is
//!   refused unless 0.
//! - A `NullVolume` is a null volume of `block_size * blocks_count`
//!   bytes.
//! - An `AioVolume` whose `filename` lies under `/dev/` is a block-device
//!   volume: the device gives its size, so `blocks_count` must be 0. Any
//!   other `filename` is a file volume of `block_size * blocks_count`
//!   bytes, or, with 0 blocks, of the existing file's size.
//!
//! `block_size` is required (512 or 4096), as OPI has it. Responses give
//! `blocks_count` as the `dpu.v1` volume's size over its block size (a
//! block device's is 0 while no namespace serves it) and the UUID
//! `dpu.v1` holds.
//!
//! An update changes only `blocks_count` (`dpu.v1` `ResizeVolume`); a
//! mask naming another field whose value differs from the stored one is
//! refused naming it. A zero or empty value counts as unchanged, as in
//! [`super::opi`]. Stats are the I/O counters of the subsystem of the
//! namespace made on the volume: the target counts I/O per subsystem, not
//! per namespace, so they include that subsystem's other namespaces;
//! all zero while no namespace is made on the volume.

use dpu_proto::opi::storage::v1 as opi;
use dpu_proto::opi::storage::v1::aio_volume_service_server::AioVolumeService;
use dpu_proto::opi::storage::v1::malloc_volume_service_server::MallocVolumeService;
use dpu_proto::opi::storage::v1::null_volume_service_server::NullVolumeService;
use dpu_proto::pbjson_types::{Empty, FieldMask};
use dpu_proto::v1 as pb;
use dpu_proto::v1::storage_service_server::StorageService;
use tonic::{Code, Request, Response, Status};

use super::opi::{generated_id, gone, inner};
use super::{paginate, required, Api, PAGES};
use crate::error::{ControlError, Result};
use crate::model::Backend;
use crate::validate;

/// The kinds of volume OPI's volume services offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `MallocVolume`: a RAM volume.
    Malloc,
    /// `AioVolume`: a file or block-device volume.
    Aio,
    /// `NullVolume`: a null volume.
    Null,
}

impl Kind {
    /// OPI's collection of volumes of this kind, as its resource names
    /// spell it.
    pub fn collection(self) -> &'static str {
        match self {
            Kind::Malloc => "mallocVolumes",
            Kind::Aio => "aioVolumes",
            Kind::Null => "nullVolumes",
        }
    }

    /// The request field holding a volume of this kind.
    pub fn field(self) -> &'static str {
        match self {
            Kind::Malloc => "malloc_volume",
            Kind::Aio => "aio_volume",
            Kind::Null => "null_volume",
        }
    }

    /// The kind a stored volume's store is of.
    pub fn of_backend(b: &Backend) -> Option<Kind> {
        match b {
            Backend::Ram { .. } => Some(Kind::Malloc),
            Backend::File { .. } | Backend::BlockDevice { .. } => Some(Kind::Aio),
            Backend::Null { .. } => Some(Kind::Null),
            Backend::Rbd { .. } | Backend::Remote(_) | Backend::Volume { .. } => None,
        }
    }

    /// The kind a `dpu.v1` volume is of.
    pub fn of(v: &pb::Volume) -> Option<Kind> {
        match v.backend.as_ref()? {
            pb::volume::Backend::Ram(_) => Some(Kind::Malloc),
            pb::volume::Backend::File(_) | pb::volume::Backend::BlockDevice(_) => Some(Kind::Aio),
            pb::volume::Backend::Null(_) => Some(Kind::Null),
        }
    }

    /// The fields of this kind's message an update mask may name (`name`
    /// identifies the volume and never differs).
    fn mask_fields(self) -> &'static [&'static str] {
        match self {
            Kind::Malloc => &[
                "name",
                "block_size",
                "blocks_count",
                "metadata_size",
                "uuid",
            ],
            Kind::Aio => &["name", "block_size", "blocks_count", "uuid", "filename"],
            Kind::Null => &["name", "block_size", "blocks_count", "uuid"],
        }
    }

    /// The method path of `method` of this kind's service, as
    /// authorization and `/metrics` name it.
    fn method(self, method: Method) -> &'static str {
        use Method::*;
        match (self, method) {
            (Kind::Malloc, Create) => "/opi_api.storage.v1.MallocVolumeService/CreateMallocVolume",
            (Kind::Malloc, Delete) => "/opi_api.storage.v1.MallocVolumeService/DeleteMallocVolume",
            (Kind::Malloc, Update) => "/opi_api.storage.v1.MallocVolumeService/UpdateMallocVolume",
            (Kind::Malloc, List) => "/opi_api.storage.v1.MallocVolumeService/ListMallocVolumes",
            (Kind::Malloc, Get) => "/opi_api.storage.v1.MallocVolumeService/GetMallocVolume",
            (Kind::Malloc, Stats) => "/opi_api.storage.v1.MallocVolumeService/StatsMallocVolume",
            (Kind::Aio, Create) => "/opi_api.storage.v1.AioVolumeService/CreateAioVolume",
            (Kind::Aio, Delete) => "/opi_api.storage.v1.AioVolumeService/DeleteAioVolume",
            (Kind::Aio, Update) => "/opi_api.storage.v1.AioVolumeService/UpdateAioVolume",
            (Kind::Aio, List) => "/opi_api.storage.v1.AioVolumeService/ListAioVolumes",
            (Kind::Aio, Get) => "/opi_api.storage.v1.AioVolumeService/GetAioVolume",
            (Kind::Aio, Stats) => "/opi_api.storage.v1.AioVolumeService/StatsAioVolume",
            (Kind::Null, Create) => "/opi_api.storage.v1.NullVolumeService/CreateNullVolume",
            (Kind::Null, Delete) => "/opi_api.storage.v1.NullVolumeService/DeleteNullVolume",
            (Kind::Null, Update) => "/opi_api.storage.v1.NullVolumeService/UpdateNullVolume",
            (Kind::Null, List) => "/opi_api.storage.v1.NullVolumeService/ListNullVolumes",
            (Kind::Null, Get) => "/opi_api.storage.v1.NullVolumeService/GetNullVolume",
            (Kind::Null, Stats) => "/opi_api.storage.v1.NullVolumeService/StatsNullVolume",
        }
    }
}

/// The methods each volume service has.
#[derive(Debug, Clone, Copy)]
enum Method {
    Create,
    Delete,
    Update,
    List,
    Get,
    Stats,
}

/// What OPI's three volume messages hold, as one value: the fields a
/// kind lacks (`metadata_size` but for malloc, `filename` but for aio)
/// are 0 and empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpiVolume {
    /// `{collection}/{id}`.
    pub name: String,
    /// Logical block size in bytes.
    pub block_size: i64,
    /// Size in blocks.
    pub blocks_count: i64,
    /// Per-block metadata bytes (malloc).
    pub metadata_size: i64,
    /// Volume UUID, RFC 4122 text form.
    pub uuid: String,
    /// The file or block device (aio).
    pub filename: String,
}

impl From<opi::MallocVolume> for OpiVolume {
    fn from(v: opi::MallocVolume) -> Self {
        OpiVolume {
            name: v.name,
            block_size: v.block_size,
            blocks_count: v.blocks_count,
            metadata_size: v.metadata_size,
            uuid: v.uuid,
            filename: String::new(),
        }
    }
}

impl From<OpiVolume> for opi::MallocVolume {
    fn from(v: OpiVolume) -> Self {
        opi::MallocVolume {
            name: v.name,
            block_size: v.block_size,
            blocks_count: v.blocks_count,
            metadata_size: v.metadata_size,
            uuid: v.uuid,
        }
    }
}

impl From<opi::AioVolume> for OpiVolume {
    fn from(v: opi::AioVolume) -> Self {
        OpiVolume {
            name: v.name,
            block_size: v.block_size,
            blocks_count: v.blocks_count,
            metadata_size: 0,
            uuid: v.uuid,
            filename: v.filename,
        }
    }
}

impl From<OpiVolume> for opi::AioVolume {
    fn from(v: OpiVolume) -> Self {
        opi::AioVolume {
            name: v.name,
            block_size: v.block_size,
            blocks_count: v.blocks_count,
            uuid: v.uuid,
            filename: v.filename,
        }
    }
}

impl From<opi::NullVolume> for OpiVolume {
    fn from(v: opi::NullVolume) -> Self {
        OpiVolume {
            name: v.name,
            block_size: v.block_size,
            blocks_count: v.blocks_count,
            metadata_size: 0,
            uuid: v.uuid,
            filename: String::new(),
        }
    }
}

impl From<OpiVolume> for opi::NullVolume {
    fn from(v: OpiVolume) -> Self {
        opi::NullVolume {
            name: v.name,
            block_size: v.block_size,
            blocks_count: v.blocks_count,
            uuid: v.uuid,
        }
    }
}

/// Where block devices live: an aio `filename` under it is a block
/// device, any other a file.
const DEVICES: &str = "/dev/";

/// Our volume ID in an OPI volume name of `kind`
/// (`mallocVolumes/Malloc1`): a volume ID, which takes upper case.
fn volume_id<'a>(kind: Kind, field: &str, name: &'a str) -> Result<&'a str> {
    let id = name
        .strip_prefix(kind.collection())
        .and_then(|rest| rest.strip_prefix('/'))
        .ok_or_else(|| {
            ControlError::invalid(
                field,
                format!("expected \"{}/{{id}}\", got {name:?}", kind.collection()),
            )
        })?;
    validate::volume_id(field, id)?;
    Ok(id)
}

/// A block size as OPI gives it, checked: 512 or 4096.
fn block_size(field: &str, b: i64) -> Result<u32> {
    match b {
        512 => Ok(512),
        4096 => Ok(4096),
        0 => Err(ControlError::invalid(
            field,
            "required: 512 or 4096 (bytes per logical block)",
        )),
        b => Err(ControlError::invalid(
            field,
            format!("{b} is not a block size the target serves: 512 or 4096"),
        )),
    }
}

/// `blocks_count` blocks of `block_size` bytes, in bytes; `field` names
/// the count. A negative count, or a product past 64 bits, is refused.
fn size_bytes(field: &str, block_size: u32, blocks_count: i64) -> Result<u64> {
    let blocks = u64::try_from(blocks_count)
        .map_err(|_| ControlError::invalid(field, format!("{blocks_count} is negative")))?;
    blocks.checked_mul(u64::from(block_size)).ok_or_else(|| {
        ControlError::invalid(
            field,
            format!("{blocks_count} blocks of {block_size} bytes do not fit in 64 bits"),
        )
    })
}

/// An OPI volume of `kind` to create, checked (errors name the fields of
/// the request's `kind.field()`), as the `dpu.v1` volume it stands for.
pub fn volume_spec(kind: Kind, v: &OpiVolume) -> Result<pb::Volume> {
    let f = |s: &str| format!("{}.{s}", kind.field());
    let bs = block_size(&f("block_size"), v.block_size)?;
    if v.metadata_size != 0 {
        return Err(ControlError::invalid(
            f("metadata_size"),
            "per-block metadata is not offered: give 0",
        ));
    }
    if !v.uuid.is_empty() {
        validate::uuid(&f("uuid"), &v.uuid)?;
    }
    let size = size_bytes(&f("blocks_count"), bs, v.blocks_count)?;
    let sized = || {
        if size == 0 {
            Err(ControlError::invalid(
                f("blocks_count"),
                "must be greater than 0",
            ))
        } else {
            Ok(size)
        }
    };
    let backend = match kind {
        Kind::Malloc => pb::volume::Backend::Ram(pb::RamBackend {
            size_bytes: sized()?,
        }),
        Kind::Null => pb::volume::Backend::Null(pb::NullBackend {
            size_bytes: sized()?,
        }),
        Kind::Aio if v.filename.is_empty() => {
            return Err(ControlError::invalid(
                f("filename"),
                "required: the file, or the block device under /dev/",
            ))
        }
        Kind::Aio if v.filename.starts_with(DEVICES) => {
            if size != 0 {
                return Err(ControlError::invalid(
                    f("blocks_count"),
                    format!(
                        "give 0: {} is a block device, whose size is the device's",
                        v.filename
                    ),
                ));
            }
            pb::volume::Backend::BlockDevice(pb::BlockDeviceBackend {
                path: v.filename.clone(),
            })
        }
        Kind::Aio => pb::volume::Backend::File(pb::FileBackend {
            path: v.filename.clone(),
            size_bytes: size,
        }),
    };
    Ok(pb::Volume {
        backend: Some(backend),
        block_size: bs,
        uuid: v.uuid.clone(),
        ..Default::default()
    })
}

/// The OPI view, as `kind`, of one of our volumes.
pub fn volume_to_opi(kind: Kind, v: &pb::Volume) -> OpiVolume {
    let id = v.name.strip_prefix("volumes/").unwrap_or(&v.name);
    let blocks = v
        .size_bytes
        .checked_div(u64::from(v.block_size))
        .unwrap_or(0);
    let filename = match &v.backend {
        Some(pb::volume::Backend::File(f)) => f.path.clone(),
        Some(pb::volume::Backend::BlockDevice(d)) => d.path.clone(),
        _ => String::new(),
    };
    OpiVolume {
        name: format!("{}/{id}", kind.collection()),
        block_size: i64::from(v.block_size),
        blocks_count: i64::try_from(blocks).unwrap_or(i64::MAX),
        metadata_size: 0,
        uuid: v.uuid.clone(),
        filename,
    }
}

/// The fields of `kind`'s message an update names: those of the mask,
/// or all for `*` or no mask; a path that is no field is refused.
pub fn update_paths(kind: Kind, mask: Option<&FieldMask>) -> Result<Vec<&'static str>> {
    let fields = kind.mask_fields();
    let paths = mask.map(|m| m.paths.as_slice()).unwrap_or_default();
    if paths.is_empty() || paths.iter().any(|p| p == "*") {
        return Ok(fields.to_vec());
    }
    paths
        .iter()
        .map(|p| {
            fields.iter().copied().find(|f| f == p).ok_or_else(|| {
                ControlError::invalid(
                    "update_mask",
                    format!(
                        "{p:?} is not a field of {}; fields: {}",
                        kind.field(),
                        fields.join(", ")
                    ),
                )
            })
        })
        .collect()
}

/// What an update of `now` (the stored volume, as OPI shows it) to
/// `wanted` over `paths` changes: the new size in bytes when the block
/// count changes, `None` when nothing does. A named field other than
/// `blocks_count` whose value differs is refused naming it; a zero or
/// empty value counts as unchanged. `device`: the volume is a block
/// device, whose size is the device's.
pub fn update_size(
    kind: Kind,
    paths: &[&str],
    wanted: &OpiVolume,
    now: &OpiVolume,
    device: bool,
) -> Result<Option<u64>> {
    let f = |s: &str| format!("{}.{s}", kind.field());
    let fixed = |field: &str, current: &dyn std::fmt::Display| {
        ControlError::invalid(
            f(field),
            format!("cannot be changed (it is {current}); delete the volume and create another"),
        )
    };
    for path in paths {
        match *path {
            "block_size" if wanted.block_size != 0 && wanted.block_size != now.block_size => {
                return Err(fixed("block_size", &now.block_size));
            }
            "uuid" if !wanted.uuid.is_empty() && !wanted.uuid.eq_ignore_ascii_case(&now.uuid) => {
                return Err(fixed("uuid", &now.uuid));
            }
            "filename" if !wanted.filename.is_empty() && wanted.filename != now.filename => {
                return Err(fixed("filename", &now.filename));
            }
            "metadata_size" if wanted.metadata_size != 0 => {
                return Err(ControlError::invalid(
                    f("metadata_size"),
                    "per-block metadata is not offered: give 0",
                ));
            }
            _ => {}
        }
    }
    if !paths.contains(&"blocks_count") {
        return Ok(None);
    }
    if wanted.blocks_count < 0 {
        return Err(ControlError::invalid(
            f("blocks_count"),
            format!("{} is negative", wanted.blocks_count),
        ));
    }
    if wanted.blocks_count == 0 || wanted.blocks_count == now.blocks_count {
        return Ok(None);
    }
    if device {
        return Err(ControlError::invalid(
            f("blocks_count"),
            format!(
                "{} is a block device, whose size is the device's: it cannot be resized",
                now.filename
            ),
        ));
    }
    let bs = u32::try_from(now.block_size).unwrap_or(0);
    Ok(Some(size_bytes(
        &f("blocks_count"),
        bs,
        wanted.blocks_count,
    )?))
}

/// `dpu.v1`'s refusal `e` of a call made for an OPI request of `kind`,
/// naming the OPI fields its field stands for: the store's path is
/// `filename`, its size `blocks_count`.
fn opi_fields(kind: Kind, e: Status) -> Status {
    let f = kind.field();
    let renames = [
        ("volume_id:", format!("{f}_id:")),
        ("volume.file.path:", format!("{f}.filename:")),
        ("volume.block_device.path:", format!("{f}.filename:")),
        ("volume.file.size_bytes:", format!("{f}.blocks_count:")),
        ("volume.ram.size_bytes:", format!("{f}.blocks_count:")),
        ("volume.null.size_bytes:", format!("{f}.blocks_count:")),
        ("size_bytes:", format!("{f}.blocks_count:")),
        ("volume.block_size:", format!("{f}.block_size:")),
        ("volume.uuid:", format!("{f}.uuid:")),
    ];
    for (from, to) in renames {
        if let Some(rest) = e.message().strip_prefix(from) {
            return Status::new(e.code(), format!("{to}{rest}"));
        }
    }
    e
}

/// The refusal of a name of `kind` whose volume does not exist, or is of
/// another kind.
fn not_found(kind: Kind, id: &str) -> Status {
    ControlError::NotFound(format!("{}/{id}", kind.collection())).into()
}

impl Api {
    /// Volume `id` as `dpu.v1` shows it, if it is of `kind`; NOT_FOUND
    /// naming the OPI name otherwise.
    async fn opi_volume<T>(
        &self,
        outer: &Request<T>,
        kind: Kind,
        id: &str,
    ) -> std::result::Result<pb::Volume, Status> {
        let got = StorageService::get_volume(
            self,
            inner(
                outer,
                pb::GetVolumeRequest {
                    name: format!("volumes/{id}"),
                },
            ),
        )
        .await;
        match got {
            Ok(v) if Kind::of(v.get_ref()) == Some(kind) => Ok(v.into_inner()),
            Ok(_) => Err(not_found(kind, id)),
            Err(e) if e.code() == Code::NotFound => Err(not_found(kind, id)),
            Err(e) => Err(e),
        }
    }

    /// Creates volume `id` (generated when empty) from the OPI volume
    /// `v` of `kind`.
    async fn opi_volume_create<T>(
        &self,
        outer: &Request<T>,
        kind: Kind,
        id: &str,
        v: &OpiVolume,
    ) -> std::result::Result<OpiVolume, Status> {
        let id = if id.is_empty() {
            generated_id()
        } else {
            validate::volume_id(&format!("{}_id", kind.field()), id)?;
            id.to_string()
        };
        let volume = volume_spec(kind, v)?;
        let created = StorageService::create_volume(
            self,
            inner(
                outer,
                pb::CreateVolumeRequest {
                    volume_id: id,
                    volume: Some(volume),
                },
            ),
        )
        .await
        .map_err(|e| opi_fields(kind, e))?;
        Ok(volume_to_opi(kind, created.get_ref()))
    }

    /// Deletes the volume named `name` if it is of `kind`.
    async fn opi_volume_delete<T>(
        &self,
        _outer: &Request<T>,
        kind: Kind,
        name: &str,
        allow_missing: bool,
    ) -> std::result::Result<Response<Empty>, Status> {
        let id = volume_id(kind, "name", name)?.to_string();
        // The kind is checked in the same change as the deletion: another
        // kind's volume is missing here, and never deleted.
        let deleted = self
            .change_storage(move |st| {
                match st.volumes.get(&id).map(|v| Kind::of_backend(&v.backend)) {
                    Some(Some(k)) if k == kind => {}
                    _ => {
                        return Err(ControlError::NotFound(format!(
                            "{}/{id}",
                            kind.collection()
                        )))
                    }
                }
                st.delete_volume(&id).map(|()| ((), None))
            })
            .await
            .map_err(Status::from);
        gone(deleted, allow_missing)
    }

    /// Updates the volume `v` of `kind` names: only its block count
    /// changes; `allow_missing` creates it.
    async fn opi_volume_update<T>(
        &self,
        outer: &Request<T>,
        kind: Kind,
        v: &OpiVolume,
        mask: Option<&FieldMask>,
        allow_missing: bool,
    ) -> std::result::Result<OpiVolume, Status> {
        let id = volume_id(kind, &format!("{}.name", kind.field()), &v.name)?;
        let paths = update_paths(kind, mask)?;
        let current = match self.opi_volume(outer, kind, id).await {
            Ok(c) => c,
            Err(e) if e.code() == Code::NotFound && allow_missing => {
                return self.opi_volume_create(outer, kind, id, v).await;
            }
            Err(e) => return Err(e),
        };
        let device = matches!(current.backend, Some(pb::volume::Backend::BlockDevice(_)));
        let now = volume_to_opi(kind, &current);
        let Some(size) = update_size(kind, &paths, v, &now, device)? else {
            return Ok(now);
        };
        let resized = StorageService::resize_volume(
            self,
            inner(
                outer,
                pb::ResizeVolumeRequest {
                    name: format!("volumes/{id}"),
                    size_bytes: size,
                },
            ),
        )
        .await
        .map_err(|e| match e.code() {
            Code::NotFound => not_found(kind, id),
            _ => opi_fields(kind, e),
        })?;
        Ok(volume_to_opi(kind, resized.get_ref()))
    }

    /// A page of the volumes of `kind`, in ascending ID order.
    fn opi_volume_list(
        &self,
        kind: Kind,
        page_size: i32,
        page_token: &str,
    ) -> Result<(Vec<OpiVolume>, String)> {
        let state = self.ctl.state.snapshot();
        let items = state
            .volumes
            .iter()
            .filter(|(_, v)| Kind::of_backend(&v.backend) == Some(kind))
            .map(|(k, v)| (k.as_str(), v));
        paginate(items, page_size, page_token, PAGES, |v| {
            volume_to_opi(kind, &self.volume_out(&state, v))
        })
    }

    /// The I/O counters of the volume `name` of `kind`: its namespace's
    /// subsystem's, zeros while no namespace is made on it.
    async fn opi_volume_stats<T>(
        &self,
        outer: &Request<T>,
        kind: Kind,
        name: &str,
    ) -> std::result::Result<opi::VolumeStats, Status> {
        let id = volume_id(kind, "name", name)?;
        self.opi_volume(outer, kind, id).await?;
        let state = self.ctl.state.snapshot();
        // The index names the namespace made on the volume.
        let subsystem = state
            .index
            .volume_user(id)
            .and_then(|user| validate::namespace_name("namespace", user).ok())
            .map(|(sid, _)| sid.to_string());
        let Some(sid) = subsystem else {
            return Ok(opi::VolumeStats::default());
        };
        let c = self
            .ctl
            .telemetry
            .collect()
            .subsystems
            .remove(&sid)
            .unwrap_or_default();
        let n = |v: u64| i32::try_from(v).unwrap_or(i32::MAX);
        Ok(opi::VolumeStats {
            read_bytes_count: n(c.read_bytes),
            read_ops_count: n(c.read_ops),
            write_bytes_count: n(c.write_bytes),
            write_ops_count: n(c.write_ops),
            ..Default::default()
        })
    }
}

/// One of OPI's three volume services, each call checked and run by the
/// kind-generic methods above; they differ only in their messages'
/// names.
macro_rules! volume_service {
    (
        $service:ident, $kind:expr, $msg:ident, $field:ident, $id:ident, $list:ident,
        $create:ident($create_req:ident),
        $delete:ident($delete_req:ident),
        $update:ident($update_req:ident),
        $list_fn:ident($list_req:ident) -> $list_resp:ident,
        $get:ident($get_req:ident),
        $stats:ident($stats_req:ident) -> $stats_resp:ident $(,)?
    ) => {
        #[tonic::async_trait]
        impl $service for Api {
            async fn $create(
                &self,
                req: Request<opi::$create_req>,
            ) -> std::result::Result<Response<opi::$msg>, Status> {
                let kind = $kind;
                self.opi_call(kind.method(Method::Create), async {
                    let r = req.get_ref();
                    let v = required(kind.field(), r.$field.clone())?;
                    let out = self
                        .opi_volume_create(&req, kind, &r.$id, &v.into())
                        .await?;
                    Ok(Response::new(out.into()))
                })
                .await
            }

            async fn $delete(
                &self,
                req: Request<opi::$delete_req>,
            ) -> std::result::Result<Response<Empty>, Status> {
                let kind = $kind;
                self.opi_call(kind.method(Method::Delete), async {
                    let r = req.get_ref();
                    self.opi_volume_delete(&req, kind, &r.name, r.allow_missing)
                        .await
                })
                .await
            }

            async fn $update(
                &self,
                req: Request<opi::$update_req>,
            ) -> std::result::Result<Response<opi::$msg>, Status> {
                let kind = $kind;
                self.opi_call(kind.method(Method::Update), async {
                    let r = req.get_ref();
                    let v = required(kind.field(), r.$field.clone())?;
                    let out = self
                        .opi_volume_update(
                            &req,
                            kind,
                            &v.into(),
                            r.update_mask.as_ref(),
                            r.allow_missing,
                        )
                        .await?;
                    Ok(Response::new(out.into()))
                })
                .await
            }

            async fn $list_fn(
                &self,
                req: Request<opi::$list_req>,
            ) -> std::result::Result<Response<opi::$list_resp>, Status> {
                let kind = $kind;
                self.opi_call(kind.method(Method::List), async {
                    let r = req.get_ref();
                    let (page, next_page_token) =
                        self.opi_volume_list(kind, r.page_size, &r.page_token)?;
                    Ok(Response::new(opi::$list_resp {
                        $list: page.into_iter().map(Into::into).collect(),
                        next_page_token,
                    }))
                })
                .await
            }

            async fn $get(
                &self,
                req: Request<opi::$get_req>,
            ) -> std::result::Result<Response<opi::$msg>, Status> {
                let kind = $kind;
                self.opi_call(kind.method(Method::Get), async {
                    let id = volume_id(kind, "name", &req.get_ref().name)?;
                    let v = self.opi_volume(&req, kind, id).await?;
                    Ok(Response::new(volume_to_opi(kind, &v).into()))
                })
                .await
            }

            async fn $stats(
                &self,
                req: Request<opi::$stats_req>,
            ) -> std::result::Result<Response<opi::$stats_resp>, Status> {
                let kind = $kind;
                self.opi_call(kind.method(Method::Stats), async {
                    let stats = self
                        .opi_volume_stats(&req, kind, &req.get_ref().name)
                        .await?;
                    Ok(Response::new(opi::$stats_resp { stats: Some(stats) }))
                })
                .await
            }
        }
    };
}

volume_service!(
    MallocVolumeService, Kind::Malloc, MallocVolume, malloc_volume, malloc_volume_id, malloc_volumes,
    create_malloc_volume(CreateMallocVolumeRequest),
    delete_malloc_volume(DeleteMallocVolumeRequest),
    update_malloc_volume(UpdateMallocVolumeRequest),
    list_malloc_volumes(ListMallocVolumesRequest) -> ListMallocVolumesResponse,
    get_malloc_volume(GetMallocVolumeRequest),
    stats_malloc_volume(StatsMallocVolumeRequest) -> StatsMallocVolumeResponse,
);

volume_service!(
    AioVolumeService, Kind::Aio, AioVolume, aio_volume, aio_volume_id, aio_volumes,
    create_aio_volume(CreateAioVolumeRequest),
    delete_aio_volume(DeleteAioVolumeRequest),
    update_aio_volume(UpdateAioVolumeRequest),
    list_aio_volumes(ListAioVolumesRequest) -> ListAioVolumesResponse,
    get_aio_volume(GetAioVolumeRequest),
    stats_aio_volume(StatsAioVolumeRequest) -> StatsAioVolumeResponse,
);

volume_service!(
    NullVolumeService, Kind::Null, NullVolume, null_volume, null_volume_id, null_volumes,
    create_null_volume(CreateNullVolumeRequest),
    delete_null_volume(DeleteNullVolumeRequest),
    update_null_volume(UpdateNullVolumeRequest),
    list_null_volumes(ListNullVolumesRequest) -> ListNullVolumesResponse,
    get_null_volume(GetNullVolumeRequest),
    stats_null_volume(StatsNullVolumeRequest) -> StatsNullVolumeResponse,
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::testing::LIMITS;
    use crate::store::StateHandle;

    fn opi_volume(block_size: i64, blocks_count: i64) -> OpiVolume {
        OpiVolume {
            block_size,
            blocks_count,
            ..Default::default()
        }
    }

    /// The field a refusal names, from its `field: reason` text.
    fn refused_field(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Err(ControlError::InvalidArgument { field, .. }) => field,
            other => panic!("not INVALID_ARGUMENT: {other:?}"),
        }
    }

    #[test]
    fn each_kind_is_the_dpu_v1_store_it_stands_for() {
        let v = volume_spec(Kind::Malloc, &opi_volume(4096, 16)).unwrap();
        assert_eq!(
            v.backend,
            Some(pb::volume::Backend::Ram(pb::RamBackend {
                size_bytes: 65536
            }))
        );
        assert_eq!(v.block_size, 4096);
        let v = volume_spec(Kind::Null, &opi_volume(512, 3)).unwrap();
        assert_eq!(
            v.backend,
            Some(pb::volume::Backend::Null(pb::NullBackend {
                size_bytes: 1536
            }))
        );
        let mut aio = opi_volume(512, 8);
        aio.filename = "/var/lib/dpu/volumes/a.img".into();
        aio.uuid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into();
        let v = volume_spec(Kind::Aio, &aio).unwrap();
        assert_eq!(
            v.backend,
            Some(pb::volume::Backend::File(pb::FileBackend {
                path: aio.filename.clone(),
                size_bytes: 4096
            }))
        );
        assert_eq!(v.uuid, aio.uuid);
        // 0 blocks: the existing file's size.
        aio.blocks_count = 0;
        let v = volume_spec(Kind::Aio, &aio).unwrap();
        assert!(
            matches!(v.backend, Some(pb::volume::Backend::File(ref f)) if f.size_bytes == 0),
            "{v:?}"
        );
        aio.filename = "/dev/nvme0n1".into();
        let v = volume_spec(Kind::Aio, &aio).unwrap();
        assert_eq!(
            v.backend,
            Some(pb::volume::Backend::BlockDevice(pb::BlockDeviceBackend {
                path: "/dev/nvme0n1".into()
            }))
        );
    }

    #[test]
    fn refusals_name_opis_fields() {
        let refused = |kind: Kind, v: OpiVolume| refused_field(volume_spec(kind, &v));
        assert_eq!(
            refused(Kind::Malloc, opi_volume(0, 8)),
            "malloc_volume.block_size"
        );
        assert_eq!(
            refused(Kind::Null, opi_volume(1000, 8)),
            "null_volume.block_size"
        );
        assert_eq!(
            refused(Kind::Malloc, opi_volume(512, 0)),
            "malloc_volume.blocks_count"
        );
        assert_eq!(
            refused(Kind::Null, opi_volume(512, -1)),
            "null_volume.blocks_count"
        );
        let mut v = opi_volume(512, 8);
        v.metadata_size = 8;
        assert_eq!(refused(Kind::Malloc, v), "malloc_volume.metadata_size");
        let mut v = opi_volume(512, 8);
        v.uuid = "not-a-uuid".into();
        assert_eq!(refused(Kind::Malloc, v), "malloc_volume.uuid");
        assert_eq!(
            refused(Kind::Aio, opi_volume(512, 8)),
            "aio_volume.filename"
        );
        let mut v = opi_volume(512, 8);
        v.filename = "/dev/sda".into();
        assert_eq!(refused(Kind::Aio, v), "aio_volume.blocks_count");
    }

    #[test]
    fn a_size_past_64_bits_is_refused_not_wrapped() {
        let e = volume_spec(Kind::Malloc, &opi_volume(4096, i64::MAX)).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("malloc_volume.blocks_count: 9223372036854775807 blocks"),
            "{e}"
        );
        let mut aio = opi_volume(512, i64::MAX);
        aio.filename = "/srv/a.img".into();
        assert_eq!(
            refused_field(volume_spec(Kind::Aio, &aio)),
            "aio_volume.blocks_count"
        );
        // The largest count that fits passes.
        let most = i64::try_from(u64::MAX / 4096).unwrap();
        volume_spec(Kind::Null, &opi_volume(4096, most)).unwrap();
    }

    #[test]
    fn the_view_counts_blocks_and_names_the_kinds_collection() {
        let v = pb::Volume {
            name: "volumes/v1".into(),
            backend: Some(pb::volume::Backend::File(pb::FileBackend {
                path: "/srv/v1.img".into(),
                size_bytes: 8192,
            })),
            block_size: 4096,
            uuid: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into(),
            size_bytes: 8192,
            namespace: String::new(),
        };
        assert_eq!(Kind::of(&v), Some(Kind::Aio));
        let o = volume_to_opi(Kind::Aio, &v);
        assert_eq!(o.name, "aioVolumes/v1");
        assert_eq!((o.block_size, o.blocks_count), (4096, 2));
        assert_eq!(o.filename, "/srv/v1.img");
        assert_eq!(o.uuid, v.uuid);
        let a: opi::AioVolume = o.clone().into();
        assert_eq!(OpiVolume::from(a), o);
        // Back to the spec it came from.
        let spec = volume_spec(Kind::Aio, &o).unwrap();
        assert_eq!(spec.backend, v.backend);
        // A block device nothing serves yet has 0 blocks; a block size of
        // 0 never divides.
        let dev = pb::Volume {
            name: "volumes/d".into(),
            backend: Some(pb::volume::Backend::BlockDevice(pb::BlockDeviceBackend {
                path: "/dev/sdb".into(),
            })),
            ..Default::default()
        };
        let o = volume_to_opi(Kind::Aio, &dev);
        assert_eq!((o.blocks_count, o.filename.as_str()), (0, "/dev/sdb"));
        let m = volume_to_opi(
            Kind::Malloc,
            &pb::Volume {
                name: "volumes/m".into(),
                backend: Some(pb::volume::Backend::Ram(pb::RamBackend {
                    size_bytes: 1024,
                })),
                block_size: 512,
                size_bytes: 1024,
                ..Default::default()
            },
        );
        assert_eq!((m.name.as_str(), m.blocks_count), ("mallocVolumes/m", 2));
    }

    #[test]
    fn an_update_changes_only_the_block_count() {
        let mask = |p: &[&str]| FieldMask {
            paths: p.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(
            update_paths(Kind::Null, None).unwrap(),
            ["name", "block_size", "blocks_count", "uuid"]
        );
        assert_eq!(
            update_paths(Kind::Aio, Some(&mask(&["*"]))).unwrap(),
            Kind::Aio.mask_fields()
        );
        assert_eq!(
            update_paths(Kind::Malloc, Some(&mask(&["blocks_count"]))).unwrap(),
            ["blocks_count"]
        );
        assert_eq!(
            refused_field(update_paths(Kind::Null, Some(&mask(&["filename"])))),
            "update_mask"
        );

        let now = OpiVolume {
            name: "mallocVolumes/m".into(),
            block_size: 512,
            blocks_count: 8,
            uuid: "0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0".into(),
            ..Default::default()
        };
        let all = Kind::Malloc.mask_fields();
        let mut grow = now.clone();
        grow.blocks_count = 16;
        assert_eq!(
            update_size(Kind::Malloc, all, &grow, &now, false).unwrap(),
            Some(8192)
        );
        // Unchanged, or not named: nothing to do.
        assert_eq!(
            update_size(Kind::Malloc, all, &now, &now, false).unwrap(),
            None
        );
        assert_eq!(
            update_size(Kind::Malloc, &["uuid"], &grow, &now, false).unwrap(),
            None
        );
        // Zero and empty values count as unchanged; the UUID's case does
        // not matter.
        let mut sparse = OpiVolume {
            blocks_count: 16,
            ..Default::default()
        };
        assert_eq!(
            update_size(Kind::Malloc, all, &sparse, &now, false).unwrap(),
            Some(8192)
        );
        sparse.uuid = now.uuid.to_lowercase();
        assert_eq!(
            update_size(Kind::Malloc, all, &sparse, &now, false).unwrap(),
            Some(8192)
        );
        // Another field that differs is refused by name.
        let mut bs = grow.clone();
        bs.block_size = 4096;
        assert_eq!(
            refused_field(update_size(Kind::Malloc, all, &bs, &now, false)),
            "malloc_volume.block_size"
        );
        let e = update_size(Kind::Malloc, &["block_size"], &bs, &now, false).unwrap_err();
        assert!(e.to_string().contains("delete"), "{e}");
        let mut md = now.clone();
        md.metadata_size = 16;
        assert_eq!(
            refused_field(update_size(Kind::Malloc, all, &md, &now, false)),
            "malloc_volume.metadata_size"
        );
        let mut neg = now.clone();
        neg.blocks_count = -2;
        assert_eq!(
            refused_field(update_size(Kind::Malloc, all, &neg, &now, false)),
            "malloc_volume.blocks_count"
        );
        let mut huge = now.clone();
        huge.blocks_count = i64::MAX;
        assert_eq!(
            refused_field(update_size(Kind::Malloc, all, &huge, &now, false)),
            "malloc_volume.blocks_count"
        );
        // A block device: its file name is fixed, its size the device's.
        let dev = OpiVolume {
            name: "aioVolumes/d".into(),
            block_size: 512,
            filename: "/dev/sdb".into(),
            ..Default::default()
        };
        let mut moved = dev.clone();
        moved.filename = "/dev/sdc".into();
        assert_eq!(
            refused_field(update_size(
                Kind::Aio,
                Kind::Aio.mask_fields(),
                &moved,
                &dev,
                true
            )),
            "aio_volume.filename"
        );
        let mut sized = dev.clone();
        sized.blocks_count = 100;
        assert_eq!(
            refused_field(update_size(
                Kind::Aio,
                &["blocks_count"],
                &sized,
                &dev,
                true
            )),
            "aio_volume.blocks_count"
        );
    }

    #[test]
    fn dpu_v1_refusals_are_renamed_to_opis_fields() {
        let e = opi_fields(
            Kind::Aio,
            Status::permission_denied("volume.file.path: /etc/passwd is outside"),
        );
        assert_eq!(e.code(), Code::PermissionDenied);
        assert_eq!(e.message(), "aio_volume.filename: /etc/passwd is outside");
        let e = opi_fields(
            Kind::Malloc,
            Status::failed_precondition("RAM namespaces and volumes would use 9 bytes"),
        );
        assert_eq!(e.message(), "RAM namespaces and volumes would use 9 bytes");
        let e = opi_fields(Kind::Null, Status::invalid_argument("size_bytes: 3 is not"));
        assert_eq!(e.message(), "null_volume.blocks_count: 3 is not");
    }

    /// Through the services: one ID space, each kind seeing only its own
    /// volumes, and a delete of another kind's name never deleting.
    #[tokio::test]
    async fn each_service_sees_only_its_kind() {
        let state = StateHandle::open(None).unwrap();
        let api = Api::for_tests(state.clone(), Default::default(), LIMITS, None, None);
        let malloc = opi::MallocVolume {
            block_size: 512,
            blocks_count: 8,
            ..Default::default()
        };
        let m = MallocVolumeService::create_malloc_volume(
            &api,
            Request::new(opi::CreateMallocVolumeRequest {
                malloc_volume: Some(malloc),
                malloc_volume_id: "v1".into(),
            }),
        )
        .await
        .unwrap()
        .into_inner();
        assert_eq!((m.name.as_str(), m.blocks_count), ("mallocVolumes/v1", 8));
        assert_eq!(m.uuid.len(), 36, "{m:?}");

        let e = NullVolumeService::get_null_volume(
            &api,
            Request::new(opi::GetNullVolumeRequest {
                name: "nullVolumes/v1".into(),
            }),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        assert!(e.message().contains("nullVolumes/v1"), "{e:?}");
        let e = NullVolumeService::create_null_volume(
            &api,
            Request::new(opi::CreateNullVolumeRequest {
                null_volume: Some(opi::NullVolume {
                    block_size: 512,
                    blocks_count: 8,
                    ..Default::default()
                }),
                null_volume_id: "v1".into(),
            }),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
        NullVolumeService::delete_null_volume(
            &api,
            Request::new(opi::DeleteNullVolumeRequest {
                name: "nullVolumes/v1".into(),
                allow_missing: true,
            }),
        )
        .await
        .unwrap();
        assert!(state.snapshot().volumes.contains_key("v1"));
        let listed = NullVolumeService::list_null_volumes(
            &api,
            Request::new(opi::ListNullVolumesRequest::default()),
        )
        .await
        .unwrap()
        .into_inner();
        assert!(listed.null_volumes.is_empty(), "{listed:?}");
        let stats = MallocVolumeService::stats_malloc_volume(
            &api,
            Request::new(opi::StatsMallocVolumeRequest {
                name: "mallocVolumes/v1".into(),
            }),
        )
        .await
        .unwrap()
        .into_inner();
        assert_eq!(stats.stats, Some(opi::VolumeStats::default()));
    }
}
