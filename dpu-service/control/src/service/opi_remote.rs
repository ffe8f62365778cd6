//! OPI's `opi_api.storage.v1.NvmeRemoteControllerService` over the
//! remote controllers of the state ([`RemoteController`]) and the remote
//! namespaces `dpu.v1` serves namespaces from (`Namespace.remote`). Each
//! call checks the OPI request (errors name OPI's fields) and changes the
//! state as `dpu.v1`'s storage calls do (stored, then served by the
//! target before the call returns).
//!
//! Mapping:
//! - `nvmeRemoteControllers/{c}` is remote controller `{c}`: how to reach
//!   one remote NVMe/TCP subsystem. `queue_size` is the most commands in
//!   flight to the remote of each namespace made from it (0 on create:
//!   128; 2 ..= 1024). `multipath` DISABLE, FAILOVER or unspecified are
//!   taken and answered as FAILOVER, which is what the paths do: the
//!   first that answers serves, the next takes over when it fails;
//!   MULTIPATH (active-active) is refused. `io_queues_count` is 1 (each
//!   namespace has one I/O queue to the remote), and more is refused, as
//!   are header and data digests (`tcp.hdgst`, `tcp.ddgst`: the
//!   initiator does not compute them) and a TLS key (`tcp.psk`: no TLS to
//!   remotes).
//! - `nvmeRemoteControllers/{c}/nvmePaths/{p}` is one path: NVMe/TCP
//!   only (`trtype` TCP), `traddr` an IPv4 or IPv6 address,
//!   `fabrics.trsvcid` its port (1 ..= 65535), `fabrics.adrfam` the
//!   address's family (or unspecified), `fabrics.subnqn` the remote
//!   subsystem (required), `fabrics.hostnqn` the host NQN connected with
//!   (empty: the controller's, or with no path yet the service's own).
//!   Every path of a controller has the same subsystem and host NQN, at
//!   most four paths a controller. `source_traddr` and `source_trsvcid`
//!   are refused unless empty and 0: the service does not choose its
//!   source address.
//! - `nvmeRemoteControllers/{c}/nvmeRemoteNamespaces/{nsid}` is an active
//!   namespace of the remote subsystem, found by connecting through the
//!   controller's paths (in path-ID order, the first that answers) and
//!   asking it: its NSID, NGUID (32 hex digits), EUI-64 (a big-endian
//!   64-bit integer, 0 for none) and UUID. Nothing is stored of them.
//! - An OPI `NvmeNamespace` whose `volume_name_ref` is `{c}n{nsid}`
//!   (`nvme0n1`, as SPDK names a remote controller's namespaces), when
//!   no volume has that ID, is a `dpu.v1` namespace backed by namespace
//!   `{nsid}` of controller `{c}`'s subsystem, reached through the paths
//!   the controller has when it is made, in path-ID order, with its
//!   host NQN and queue depth ([`super::opi_namespace`] makes it). Such a
//!   namespace answers `volume_name_ref` `{c}n{nsid}` while a controller
//!   of its subsystem exists (the first by ID), else empty.
//!
//! While a namespace is backed by a controller's subsystem, the
//! controller cannot be deleted and none of its paths created, changed
//! or deleted (FAILED_PRECONDITION naming the namespace): the namespace
//! connects through the paths the controller had when it was made, and
//! would not follow. Reset
//! connects through the controller's paths and answers once one answers
//! (FAILED_PRECONDITION when none does): the namespaces' own connections
//! recover by themselves. Stats of a controller and of each of its paths
//! are the I/O counters of the subsystems serving namespaces backed by
//! its subsystem: the target counts I/O per subsystem, so they include
//! those subsystems' other namespaces; all zero while none is.
//!
//! An update changes `queue_size` of a controller, and anything of a
//! path; a masked field of a controller left zero or empty is unchanged.
//! `allow_missing` creates what an update or delete does not find.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use dpu_proto::opi::storage::v1 as opi;
use dpu_proto::opi::storage::v1::nvme_remote_controller_service_server::NvmeRemoteControllerService;
use dpu_proto::pbjson_types::{Empty, FieldMask};
use dpu_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::opi::{generated_id, gone};
use super::{num_key, paginate, required, Api, RemoteNamespaceInfo, PAGES};
use crate::error::{ControlError, Result};
use crate::model::{Backend, RemoteController, RemotePath, State};
use crate::validate;

/// OPI's collection of remote controllers.
pub const CONTROLLERS: &str = "nvmeRemoteControllers";
/// OPI's collection of a remote controller's paths.
pub const PATHS: &str = "nvmePaths";
/// OPI's collection of a remote controller's namespaces.
pub const REMOTE_NAMESPACES: &str = "nvmeRemoteNamespaces";
/// The queue depth of a controller created with `queue_size` 0.
pub const DEFAULT_QUEUE_DEPTH: u16 = 128;
/// How long listing a remote's namespaces may take on one path
/// (connecting, then each command), and in all beyond that.
const LIST_PER_PATH: Duration = Duration::from_secs(3);
const LIST_EXTRA: Duration = Duration::from_secs(10);
/// Slack on top of the listing's bound before a call stops waiting.
const LIST_SLACK: Duration = Duration::from_secs(5);

/// Fields of an `NvmeRemoteController` an update mask may name.
const CONTROLLER_FIELDS: &[&str] = &[
    "multipath",
    "io_queues_count",
    "queue_size",
    "tcp.hdgst",
    "tcp.ddgst",
    "tcp.psk",
];

/// Fields of an `NvmePath` an update mask may name.
const PATH_FIELDS: &[&str] = &[
    "trtype",
    "traddr",
    "fabrics.trsvcid",
    "fabrics.subnqn",
    "fabrics.adrfam",
    "fabrics.source_traddr",
    "fabrics.source_trsvcid",
    "fabrics.hostnqn",
];

/// Full gRPC method names, as authorization and `/metrics` name them.
mod method {
    macro_rules! m {
        ($($c:ident = $n:literal;)*) => {$(
            pub const $c: &str = concat!("/opi_api.storage.v1.NvmeRemoteControllerService/", $n);
        )*};
    }
    m! {
        CREATE = "CreateNvmeRemoteController";
        DELETE = "DeleteNvmeRemoteController";
        UPDATE = "UpdateNvmeRemoteController";
        LIST = "ListNvmeRemoteControllers";
        GET = "GetNvmeRemoteController";
        RESET = "ResetNvmeRemoteController";
        STATS = "StatsNvmeRemoteController";
        LIST_NAMESPACES = "ListNvmeRemoteNamespaces";
        GET_NAMESPACE = "GetNvmeRemoteNamespace";
        CREATE_PATH = "CreateNvmePath";
        DELETE_PATH = "DeleteNvmePath";
        UPDATE_PATH = "UpdateNvmePath";
        LIST_PATHS = "ListNvmePaths";
        GET_PATH = "GetNvmePath";
        STATS_PATH = "StatsNvmePath";
    }
}

/// Every method of the service, by its full gRPC method name.
pub const METHODS: &[&str] = &[
    method::CREATE,
    method::DELETE,
    method::UPDATE,
    method::LIST,
    method::GET,
    method::RESET,
    method::STATS,
    method::LIST_NAMESPACES,
    method::GET_NAMESPACE,
    method::CREATE_PATH,
    method::DELETE_PATH,
    method::UPDATE_PATH,
    method::LIST_PATHS,
    method::GET_PATH,
    method::STATS_PATH,
];

/// The controller ID in an OPI controller name.
fn controller_id<'a>(field: &str, name: &'a str) -> Result<&'a str> {
    validate::name(field, name, CONTROLLERS)
}

/// The controller and child IDs in a name under a controller.
fn child_ids<'a>(field: &str, name: &'a str, collection: &str) -> Result<(&'a str, &'a str)> {
    let (c, child) = validate::child_name(field, name, CONTROLLERS, collection)?;
    validate::id(field, c)?;
    Ok((c, child))
}

/// The controller and path IDs in an OPI path name.
fn path_ids<'a>(field: &str, name: &'a str) -> Result<(&'a str, &'a str)> {
    let (c, p) = child_ids(field, name, PATHS)?;
    validate::id(field, p)?;
    Ok((c, p))
}

/// The controller ID and NSID in an OPI remote namespace name.
fn remote_namespace_ids<'a>(field: &str, name: &'a str) -> Result<(&'a str, u32)> {
    let (c, n) = child_ids(field, name, REMOTE_NAMESPACES)?;
    let nsid = nsid_text(n).ok_or_else(|| {
        ControlError::invalid(field, format!("{n:?} is not an NSID (1 to 4294967294)"))
    })?;
    Ok((c, nsid))
}

/// An NSID in decimal, 1 ..= 0xfffffffe.
fn nsid_text(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.starts_with('0') {
        return None;
    }
    s.parse::<u32>().ok().filter(|n| *n != u32::MAX)
}

/// The controller ID and NSID a `volume_name_ref` of the form
/// `{controller}n{nsid}` names (`nvme0n1`), if it has that form.
pub fn remote_ref(s: &str) -> Option<(&str, u32)> {
    let (c, n) = s.rsplit_once('n')?;
    let nsid = nsid_text(n)?;
    validate::id("c", c).ok()?;
    Some((c, nsid))
}

/// The `volume_name_ref` OPI shows for a namespace backed by namespace
/// `nsid` of remote subsystem `subnqn`: `{c}n{nsid}` for the first
/// controller (by ID) of that subsystem, `None` when there is none.
pub fn remote_ref_of(state: &State, subnqn: &str, nsid: u32) -> Option<String> {
    state
        .remote_controllers
        .values()
        .find(|c| c.subnqn() == Some(subnqn))
        .map(|c| format!("{}n{nsid}", c.id))
}

/// The OPI view of remote controller `c`.
pub fn controller_to_opi(c: &RemoteController) -> opi::NvmeRemoteController {
    opi::NvmeRemoteController {
        name: format!("{CONTROLLERS}/{}", c.id),
        multipath: opi::NvmeMultipath::Failover as i32,
        io_queues_count: 1,
        queue_size: i64::from(c.queue_depth),
        tcp: Some(opi::TcpController::default()),
    }
}

/// The OPI view of path `pid` of controller `cid`.
pub fn path_to_opi(cid: &str, pid: &str, p: &RemotePath) -> opi::NvmePath {
    let adrfam = match p.addr.ip() {
        IpAddr::V4(_) => opi::NvmeAddressFamily::Ipv4,
        IpAddr::V6(_) => opi::NvmeAddressFamily::Ipv6,
    };
    opi::NvmePath {
        name: format!("{CONTROLLERS}/{cid}/{PATHS}/{pid}"),
        trtype: opi::NvmeTransportType::Tcp as i32,
        traddr: p.addr.ip().to_string(),
        fabrics: Some(opi::FabricsPath {
            trsvcid: i64::from(p.addr.port()),
            subnqn: p.subnqn.clone(),
            adrfam: adrfam as i32,
            source_traddr: String::new(),
            source_trsvcid: 0,
            hostnqn: p.host_nqn.clone(),
        }),
    }
}

/// Lower-case hex digits of `b`.
fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The OPI view of namespace `n` of controller `cid`'s subsystem.
pub fn remote_namespace_to_opi(cid: &str, n: &RemoteNamespaceInfo) -> opi::NvmeRemoteNamespace {
    let none = |b: &[u8]| b.iter().all(|x| *x == 0);
    opi::NvmeRemoteNamespace {
        name: format!("{CONTROLLERS}/{cid}/{REMOTE_NAMESPACES}/{}", n.nsid),
        nsid: i32::try_from(n.nsid).unwrap_or(i32::MAX),
        nguid: if none(&n.nguid) {
            String::new()
        } else {
            hex(&n.nguid)
        },
        eui64: i64::from_be_bytes(n.eui64),
        uuid: if none(&n.uuid) {
            String::new()
        } else {
            crate::convert::uuid_text(&n.uuid)
        },
    }
}

/// The fields an update names: those of the mask (a message's name
/// names all its fields), or all of `fields` for `*` or no mask; `name`
/// is ignored and a path that is no field is refused.
fn update_paths(
    mask: Option<&FieldMask>,
    fields: &'static [&'static str],
    message: &str,
) -> Result<Vec<&'static str>> {
    let paths = mask.map(|m| m.paths.as_slice()).unwrap_or_default();
    if paths.is_empty() || paths.iter().any(|p| p == "*") {
        return Ok(fields.to_vec());
    }
    let mut out = Vec::new();
    for p in paths {
        if p == "name" {
            continue;
        }
        let prefix = format!("{p}.");
        let before = out.len();
        out.extend(
            fields
                .iter()
                .copied()
                .filter(|f| *f == p || f.starts_with(&prefix)),
        );
        if out.len() == before {
            return Err(ControlError::invalid(
                "update_mask",
                format!(
                    "{p:?} is not a field of {message}; fields: {}",
                    fields.join(", ")
                ),
            ));
        }
    }
    Ok(out)
}

/// Checks the masked `fields` of OPI controller `c` (errors name
/// `nvme_remote_controller.*`) and answers the queue depth it asks for,
/// `None` when `queue_size` is not masked or 0.
pub fn controller_spec(c: &opi::NvmeRemoteController, fields: &[&str]) -> Result<Option<u16>> {
    let f = |s: &str| format!("nvme_remote_controller.{s}");
    let tcp = c.tcp.clone().unwrap_or_default();
    let mut depth = None;
    for field in fields {
        match *field {
            "multipath" => match opi::NvmeMultipath::try_from(c.multipath) {
                Ok(
                    opi::NvmeMultipath::Unspecified
                    | opi::NvmeMultipath::Disable
                    | opi::NvmeMultipath::Failover,
                ) => {}
                _ => {
                    return Err(ControlError::invalid(
                        f("multipath"),
                        "only NVME_MULTIPATH_FAILOVER (or DISABLE) is offered: one path \
                         serves at a time, the next takes over when it fails; active-active \
                         multipath is not",
                    ))
                }
            },
            "io_queues_count" if !(0..=1).contains(&c.io_queues_count) => {
                return Err(ControlError::invalid(
                    f("io_queues_count"),
                    format!(
                        "{} is not offered: each namespace has one I/O queue to the remote \
                         (give 0 or 1)",
                        c.io_queues_count
                    ),
                ))
            }
            "queue_size" => {
                depth = match c.queue_size {
                    0 => None,
                    q => Some(
                        u16::try_from(q)
                            .ok()
                            .filter(|q| {
                                (validate::MIN_REMOTE_QUEUE_DEPTH
                                    ..=validate::MAX_REMOTE_QUEUE_DEPTH)
                                    .contains(&u32::from(*q))
                            })
                            .ok_or_else(|| {
                                ControlError::invalid(
                                    f("queue_size"),
                                    format!(
                                        "{q} is out of range ({} to {}; 0: {DEFAULT_QUEUE_DEPTH})",
                                        validate::MIN_REMOTE_QUEUE_DEPTH,
                                        validate::MAX_REMOTE_QUEUE_DEPTH
                                    ),
                                )
                            })?,
                    ),
                }
            }
            "tcp.hdgst" | "tcp.ddgst" => {
                let (on, which) = if *field == "tcp.hdgst" {
                    (tcp.hdgst, "header")
                } else {
                    (tcp.ddgst, "data")
                };
                if on {
                    return Err(ControlError::invalid(
                        f(field),
                        format!(
                            "NVMe/TCP {which} digests are not offered to remotes: the \
                             initiator does not compute them"
                        ),
                    ));
                }
            }
            "tcp.psk" if !tcp.psk.is_empty() => {
                return Err(ControlError::invalid(
                    f("tcp.psk"),
                    "TLS to remote targets is not offered: leave it empty",
                ))
            }
            _ => {}
        }
    }
    Ok(depth)
}

/// OPI path `p`, checked (errors name `nvme_path.*`), as the path it
/// stands for; an empty `hostnqn` is `default_host_nqn`.
pub fn path_spec(p: &opi::NvmePath, default_host_nqn: &str) -> Result<RemotePath> {
    let f = |s: &str| format!("nvme_path.{s}");
    if opi::NvmeTransportType::try_from(p.trtype) != Ok(opi::NvmeTransportType::Tcp) {
        return Err(ControlError::invalid(
            f("trtype"),
            "only NVME_TRANSPORT_TYPE_TCP is offered: remotes are reached over NVMe/TCP",
        ));
    }
    let ip: IpAddr = p.traddr.parse().map_err(|_| {
        ControlError::invalid(
            f("traddr"),
            format!("{:?} is not an IPv4 or IPv6 address", p.traddr),
        )
    })?;
    if ip.is_unspecified() || ip.is_multicast() {
        return Err(ControlError::invalid(
            f("traddr"),
            format!("{ip} is not an address to connect to"),
        ));
    }
    let fabrics = required(&f("fabrics"), p.fabrics.as_ref())?;
    let port = u16::try_from(fabrics.trsvcid)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| {
            ControlError::invalid(
                f("fabrics.trsvcid"),
                format!("{} is not a TCP port (1 to 65535)", fabrics.trsvcid),
            )
        })?;
    match (opi::NvmeAddressFamily::try_from(fabrics.adrfam), ip) {
        (Ok(opi::NvmeAddressFamily::Unspecified), _)
        | (Ok(opi::NvmeAddressFamily::Ipv4), IpAddr::V4(_))
        | (Ok(opi::NvmeAddressFamily::Ipv6), IpAddr::V6(_)) => {}
        _ => {
            return Err(ControlError::invalid(
                f("fabrics.adrfam"),
                "must be IPV4 or IPV6, as traddr is",
            ))
        }
    }
    if fabrics.subnqn.is_empty() {
        return Err(ControlError::invalid(
            f("fabrics.subnqn"),
            "is required: the remote subsystem's NQN",
        ));
    }
    validate::remote_nqn(&f("fabrics.subnqn"), &fabrics.subnqn)?;
    if fabrics.subnqn == validate::DISCOVERY_NQN {
        return Err(ControlError::invalid(
            f("fabrics.subnqn"),
            "the discovery subsystem has no namespaces",
        ));
    }
    let host_nqn = if fabrics.hostnqn.is_empty() {
        default_host_nqn.to_string()
    } else {
        validate::remote_nqn(&f("fabrics.hostnqn"), &fabrics.hostnqn)?;
        fabrics.hostnqn.clone()
    };
    if !fabrics.source_traddr.is_empty() {
        return Err(ControlError::invalid(
            f("fabrics.source_traddr"),
            "not offered: the system chooses the source address; leave it empty",
        ));
    }
    if fabrics.source_trsvcid != 0 {
        return Err(ControlError::invalid(
            f("fabrics.source_trsvcid"),
            "not offered: the system chooses the source port; give 0",
        ));
    }
    Ok(RemotePath {
        addr: SocketAddr::new(ip, port),
        subnqn: fabrics.subnqn.clone(),
        host_nqn,
    })
}

/// `now` (a path as OPI shows it) with the masked `fields` taken from
/// `wanted`.
fn merge_path(now: &opi::NvmePath, wanted: &opi::NvmePath, fields: &[&str]) -> opi::NvmePath {
    let mut out = now.clone();
    let w = wanted.fabrics.clone().unwrap_or_default();
    let o = out.fabrics.get_or_insert_with(Default::default);
    for field in fields {
        match *field {
            "trtype" => out.trtype = wanted.trtype,
            "traddr" => out.traddr.clone_from(&wanted.traddr),
            "fabrics.trsvcid" => o.trsvcid = w.trsvcid,
            "fabrics.subnqn" => o.subnqn.clone_from(&w.subnqn),
            "fabrics.adrfam" => o.adrfam = w.adrfam,
            "fabrics.source_traddr" => o.source_traddr.clone_from(&w.source_traddr),
            "fabrics.source_trsvcid" => o.source_trsvcid = w.source_trsvcid,
            "fabrics.hostnqn" => o.hostnqn.clone_from(&w.hostnqn),
            _ => {}
        }
    }
    out
}

/// Sums the I/O counters of the subsystems serving namespaces backed by
/// remote subsystem `subnqn`.
fn stats_of(
    state: &State,
    counters: &crate::telemetry::Counters,
    subnqn: Option<&str>,
) -> opi::VolumeStats {
    let Some(subnqn) = subnqn else {
        return opi::VolumeStats::default();
    };
    let (mut rb, mut ro, mut wb, mut wo) = (0u64, 0u64, 0u64, 0u64);
    for (sid, s) in &state.subsystems {
        let uses = s
            .namespaces
            .values()
            .any(|n| matches!(&n.backend, Backend::Remote(r) if r.subnqn == subnqn));
        if !uses {
            continue;
        }
        let c = counters.subsystems.get(sid).copied().unwrap_or_default();
        rb = rb.saturating_add(c.read_bytes);
        ro = ro.saturating_add(c.read_ops);
        wb = wb.saturating_add(c.write_bytes);
        wo = wo.saturating_add(c.write_ops);
    }
    let n = |v: u64| i32::try_from(v).unwrap_or(i32::MAX);
    opi::VolumeStats {
        read_bytes_count: n(rb),
        read_ops_count: n(ro),
        write_bytes_count: n(wb),
        write_ops_count: n(wo),
        ..Default::default()
    }
}

impl Api {
    /// Remote controller `id` as the state holds it now.
    fn remote_controller(&self, id: &str) -> Result<RemoteController> {
        Ok(self.ctl.state.snapshot().remote_controller(id)?.clone())
    }

    /// The active namespaces of controller `c`'s subsystem, asked of the
    /// remote through its paths.
    ///
    /// # Errors
    /// FAILED_PRECONDITION when the controller has no path, none
    /// answers, or the service connects to no remote;
    /// RESOURCE_EXHAUSTED when too many probes run.
    pub(super) async fn remote_namespaces(
        &self,
        c: &RemoteController,
    ) -> Result<Vec<RemoteNamespaceInfo>> {
        let name = crate::model::remote_controller_name(&c.id);
        let (Some(subnqn), Some(host_nqn)) = (c.subnqn(), c.host_nqn()) else {
            return Err(ControlError::FailedPrecondition(format!(
                "{name} has no path: create one (CreateNvmePath) first"
            )));
        };
        let paths = c.addresses();
        let count = u32::try_from(paths.len()).unwrap_or(u32::MAX);
        let bound = LIST_PER_PATH * count + LIST_EXTRA;
        let limit = bound + LIST_SLACK;
        let silent = format!("no path answered within {} s", limit.as_secs());
        let (subnqn, host_nqn) = (subnqn.to_string(), host_nqn.to_string());
        let listed = self
            .run_probe(
                &format!("{name} ({subnqn} at {})", addresses(&paths)),
                limit,
                silent,
                move |p| p.probe_remote_namespaces(&paths, &subnqn, &host_nqn, bound),
            )
            .await?;
        listed.ok_or_else(|| {
            ControlError::FailedPrecondition(format!(
                "{name}: this service connects to no remote target (it has no probe)"
            ))
        })
    }

    /// The `dpu.v1` remote backend of namespace `nsid` of controller
    /// `cid`'s subsystem, made with the controller's paths, host NQN and
    /// queue depth, and the remote namespace's block size (`None`
    /// without a probe); `None` when no such controller exists.
    ///
    /// # Errors
    /// As [`Api::remote_namespaces`]; FAILED_PRECONDITION naming
    /// `field` when the remote has no such namespace or its blocks are
    /// not 512 or 4096 bytes.
    pub(super) async fn opi_remote_backend(
        &self,
        field: &str,
        cid: &str,
        nsid: u32,
    ) -> Result<Option<(pb::RemoteBackend, Option<u32>)>> {
        let Ok(c) = self.remote_controller(cid) else {
            return Ok(None);
        };
        let (Some(subnqn), Some(host_nqn)) = (c.subnqn(), c.host_nqn()) else {
            return Err(ControlError::FailedPrecondition(format!(
                "{field}: {} has no path: create one (CreateNvmePath) first",
                crate::model::remote_controller_name(cid)
            )));
        };
        let backend = pb::RemoteBackend {
            paths: c.addresses().iter().map(ToString::to_string).collect(),
            subnqn: subnqn.to_string(),
            nsid,
            host_nqn: host_nqn.to_string(),
            queue_depth: u32::from(c.queue_depth),
            ..Default::default()
        };
        let block_size = if self.ctl.store_probe.is_some() {
            let listed = self.remote_namespaces(&c).await?;
            let n = listed.iter().find(|n| n.nsid == nsid).ok_or_else(|| {
                ControlError::FailedPrecondition(format!(
                    "{field}: {subnqn} has no active namespace {nsid}"
                ))
            })?;
            if !matches!(n.block_size, 512 | 4096) {
                return Err(ControlError::FailedPrecondition(format!(
                    "{field}: namespace {nsid} of {subnqn} has {}-byte blocks; namespaces \
                     are served with 512 or 4096",
                    n.block_size
                )));
            }
            Some(n.block_size)
        } else {
            None
        };
        Ok(Some((backend, block_size)))
    }

    /// Creates controller `id` (generated when empty).
    async fn opi_controller_create(
        &self,
        id: &str,
        c: &opi::NvmeRemoteController,
    ) -> Result<opi::NvmeRemoteController> {
        let id = if id.is_empty() {
            generated_id()
        } else {
            validate::id("nvme_remote_controller_id", id)?;
            id.to_string()
        };
        let depth = controller_spec(c, CONTROLLER_FIELDS)?.unwrap_or(DEFAULT_QUEUE_DEPTH);
        let made = self
            .change_storage(move |st| {
                let c = st.create_remote_controller(RemoteController {
                    id,
                    queue_depth: depth,
                    paths: Default::default(),
                })?;
                Ok((controller_to_opi(c), None))
            })
            .await?;
        Ok(made)
    }

    /// Puts path `pid` (generated when empty and `create`) of controller
    /// `cid` from OPI path `p`.
    async fn opi_path_put(
        &self,
        cid: &str,
        pid: &str,
        p: &opi::NvmePath,
        create: bool,
    ) -> Result<opi::NvmePath> {
        let pid = if pid.is_empty() {
            generated_id()
        } else {
            validate::id("nvme_path_id", pid)?;
            pid.to_string()
        };
        let current = self.remote_controller(cid)?;
        let default_host = current
            .host_nqn()
            .map_or_else(|| self.ctl.host_nqn.clone(), str::to_string);
        let path = path_spec(p, &default_host)?;
        let cid = cid.to_string();
        self.change_storage(move |st| {
            let p = st.put_remote_path(&cid, &pid, path, create)?;
            Ok((path_to_opi(&cid, &pid, p), None))
        })
        .await
    }

    /// The stats of controller `cid`'s subsystem.
    fn opi_remote_stats(&self, cid: &str) -> Result<opi::VolumeStats> {
        let state = self.ctl.state.snapshot();
        let c = state.remote_controller(cid)?;
        let counters = self.ctl.telemetry.collect();
        Ok(stats_of(&state, &counters, c.subnqn()))
    }
}

/// Paths as text, joined by ", ".
fn addresses(paths: &[SocketAddr]) -> String {
    paths
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `Ok` of a `Result` of ours, as a gRPC answer.
fn answer<T>(r: Result<T>) -> std::result::Result<Response<T>, Status> {
    r.map(Response::new).map_err(Status::from)
}

#[tonic::async_trait]
impl NvmeRemoteControllerService for Api {
    async fn create_nvme_remote_controller(
        &self,
        req: Request<opi::CreateNvmeRemoteControllerRequest>,
    ) -> std::result::Result<Response<opi::NvmeRemoteController>, Status> {
        self.opi_call(method::CREATE, async {
            let r = req.get_ref();
            let c = required("nvme_remote_controller", r.nvme_remote_controller.as_ref())?;
            answer(
                self.opi_controller_create(&r.nvme_remote_controller_id, c)
                    .await,
            )
        })
        .await
    }

    async fn delete_nvme_remote_controller(
        &self,
        req: Request<opi::DeleteNvmeRemoteControllerRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        self.opi_call(method::DELETE, async {
            let r = req.get_ref();
            let id = controller_id("name", &r.name)?.to_string();
            let deleted = self
                .change_storage(move |st| st.delete_remote_controller(&id).map(|()| ((), None)))
                .await
                .map_err(Status::from);
            gone(deleted, r.allow_missing)
        })
        .await
    }

    async fn update_nvme_remote_controller(
        &self,
        req: Request<opi::UpdateNvmeRemoteControllerRequest>,
    ) -> std::result::Result<Response<opi::NvmeRemoteController>, Status> {
        self.opi_call(method::UPDATE, async {
            let r = req.get_ref();
            let c = required("nvme_remote_controller", r.nvme_remote_controller.as_ref())?;
            let id = controller_id("nvme_remote_controller.name", &c.name)?.to_string();
            let fields = update_paths(
                r.update_mask.as_ref(),
                CONTROLLER_FIELDS,
                "NvmeRemoteController",
            )?;
            let depth = controller_spec(c, &fields)?;
            match self.remote_controller(&id) {
                Ok(_) => {}
                Err(ControlError::NotFound(_)) if r.allow_missing => {
                    return answer(self.opi_controller_create(&id, c).await);
                }
                Err(e) => return Err(e.into()),
            }
            let Some(depth) = depth else {
                return answer(self.remote_controller(&id).map(|c| controller_to_opi(&c)));
            };
            answer(
                self.change_storage(move |st| {
                    let c = st.set_remote_queue_depth(&id, depth)?;
                    Ok((controller_to_opi(c), None))
                })
                .await,
            )
        })
        .await
    }

    async fn list_nvme_remote_controllers(
        &self,
        req: Request<opi::ListNvmeRemoteControllersRequest>,
    ) -> std::result::Result<Response<opi::ListNvmeRemoteControllersResponse>, Status> {
        self.opi_call(method::LIST, async {
            let r = req.get_ref();
            let state = self.ctl.state.snapshot();
            let items = state
                .remote_controllers
                .iter()
                .map(|(k, c)| (k.as_str(), c));
            let (nvme_remote_controllers, next_page_token) =
                paginate(items, r.page_size, &r.page_token, PAGES, controller_to_opi)?;
            Ok(Response::new(opi::ListNvmeRemoteControllersResponse {
                nvme_remote_controllers,
                next_page_token,
            }))
        })
        .await
    }

    async fn get_nvme_remote_controller(
        &self,
        req: Request<opi::GetNvmeRemoteControllerRequest>,
    ) -> std::result::Result<Response<opi::NvmeRemoteController>, Status> {
        self.opi_call(method::GET, async {
            let id = controller_id("name", &req.get_ref().name)?;
            answer(self.remote_controller(id).map(|c| controller_to_opi(&c)))
        })
        .await
    }

    async fn reset_nvme_remote_controller(
        &self,
        req: Request<opi::ResetNvmeRemoteControllerRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        self.opi_call(method::RESET, async {
            let id = controller_id("name", &req.get_ref().name)?;
            let c = self.remote_controller(id)?;
            if self.ctl.store_probe.is_some() {
                self.remote_namespaces(&c).await?;
            }
            Ok(Response::new(Empty {}))
        })
        .await
    }

    async fn stats_nvme_remote_controller(
        &self,
        req: Request<opi::StatsNvmeRemoteControllerRequest>,
    ) -> std::result::Result<Response<opi::StatsNvmeRemoteControllerResponse>, Status> {
        self.opi_call(method::STATS, async {
            let id = controller_id("name", &req.get_ref().name)?;
            let stats = self.opi_remote_stats(id)?;
            Ok(Response::new(opi::StatsNvmeRemoteControllerResponse {
                stats: Some(stats),
            }))
        })
        .await
    }

    async fn list_nvme_remote_namespaces(
        &self,
        req: Request<opi::ListNvmeRemoteNamespacesRequest>,
    ) -> std::result::Result<Response<opi::ListNvmeRemoteNamespacesResponse>, Status> {
        self.opi_call(method::LIST_NAMESPACES, async {
            let r = req.get_ref();
            let id = controller_id("parent", &r.parent)?;
            // The page's size and token are checked before connecting.
            paginate(
                std::iter::empty::<(&str, ())>(),
                r.page_size,
                &r.page_token,
                PAGES,
                |()| (),
            )?;
            let c = self.remote_controller(id)?;
            let listed = self.remote_namespaces(&c).await?;
            let items = listed.iter().map(|n| (num_key(n.nsid), n));
            let (nvme_remote_namespaces, next_page_token) =
                paginate(items, r.page_size, &r.page_token, PAGES, |n| {
                    remote_namespace_to_opi(id, n)
                })?;
            Ok(Response::new(opi::ListNvmeRemoteNamespacesResponse {
                nvme_remote_namespaces,
                next_page_token,
            }))
        })
        .await
    }

    async fn get_nvme_remote_namespace(
        &self,
        req: Request<opi::GetNvmeRemoteNamespaceRequest>,
    ) -> std::result::Result<Response<opi::NvmeRemoteNamespace>, Status> {
        self.opi_call(method::GET_NAMESPACE, async {
            let name = &req.get_ref().name;
            let (id, nsid) = remote_namespace_ids("name", name)?;
            let c = self.remote_controller(id)?;
            let listed = self.remote_namespaces(&c).await?;
            let n = listed
                .iter()
                .find(|n| n.nsid == nsid)
                .ok_or_else(|| ControlError::NotFound(name.clone()))?;
            Ok(Response::new(remote_namespace_to_opi(id, n)))
        })
        .await
    }

    async fn create_nvme_path(
        &self,
        req: Request<opi::CreateNvmePathRequest>,
    ) -> std::result::Result<Response<opi::NvmePath>, Status> {
        self.opi_call(method::CREATE_PATH, async {
            let r = req.get_ref();
            let cid = controller_id("parent", &r.parent)?;
            let p = required("nvme_path", r.nvme_path.as_ref())?;
            answer(self.opi_path_put(cid, &r.nvme_path_id, p, true).await)
        })
        .await
    }

    async fn delete_nvme_path(
        &self,
        req: Request<opi::DeleteNvmePathRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        self.opi_call(method::DELETE_PATH, async {
            let r = req.get_ref();
            let (cid, pid) = path_ids("name", &r.name)?;
            let (cid, pid) = (cid.to_string(), pid.to_string());
            let deleted = self
                .change_storage(move |st| st.delete_remote_path(&cid, &pid).map(|()| ((), None)))
                .await
                .map_err(Status::from);
            gone(deleted, r.allow_missing)
        })
        .await
    }

    async fn update_nvme_path(
        &self,
        req: Request<opi::UpdateNvmePathRequest>,
    ) -> std::result::Result<Response<opi::NvmePath>, Status> {
        self.opi_call(method::UPDATE_PATH, async {
            let r = req.get_ref();
            let p = required("nvme_path", r.nvme_path.as_ref())?;
            let (cid, pid) = path_ids("nvme_path.name", &p.name)?;
            let fields = update_paths(r.update_mask.as_ref(), PATH_FIELDS, "NvmePath")?;
            let c = self.remote_controller(cid)?;
            let Some(now) = c.paths.get(pid) else {
                if r.allow_missing {
                    return answer(self.opi_path_put(cid, pid, p, true).await);
                }
                return Err(ControlError::NotFound(p.name.clone()).into());
            };
            let merged = merge_path(&path_to_opi(cid, pid, now), p, &fields);
            answer(self.opi_path_put(cid, pid, &merged, false).await)
        })
        .await
    }

    async fn list_nvme_paths(
        &self,
        req: Request<opi::ListNvmePathsRequest>,
    ) -> std::result::Result<Response<opi::ListNvmePathsResponse>, Status> {
        self.opi_call(method::LIST_PATHS, async {
            let r = req.get_ref();
            let cid = controller_id("parent", &r.parent)?;
            let c = self.remote_controller(cid)?;
            let items = c.paths.iter().map(|(k, p)| (k.as_str(), (k, p)));
            let (nvme_paths, next_page_token) =
                paginate(items, r.page_size, &r.page_token, PAGES, |(k, p)| {
                    path_to_opi(cid, k, p)
                })?;
            Ok(Response::new(opi::ListNvmePathsResponse {
                nvme_paths,
                next_page_token,
            }))
        })
        .await
    }

    async fn get_nvme_path(
        &self,
        req: Request<opi::GetNvmePathRequest>,
    ) -> std::result::Result<Response<opi::NvmePath>, Status> {
        self.opi_call(method::GET_PATH, async {
            let name = &req.get_ref().name;
            let (cid, pid) = path_ids("name", name)?;
            let c = self.remote_controller(cid)?;
            let p = c
                .paths
                .get(pid)
                .ok_or_else(|| ControlError::NotFound(name.clone()))?;
            Ok(Response::new(path_to_opi(cid, pid, p)))
        })
        .await
    }

    async fn stats_nvme_path(
        &self,
        req: Request<opi::StatsNvmePathRequest>,
    ) -> std::result::Result<Response<opi::StatsNvmePathResponse>, Status> {
        self.opi_call(method::STATS_PATH, async {
            let name = &req.get_ref().name;
            let (cid, pid) = path_ids("name", name)?;
            if !self.remote_controller(cid)?.paths.contains_key(pid) {
                return Err(ControlError::NotFound(name.clone()).into());
            }
            let stats = self.opi_remote_stats(cid)?;
            Ok(Response::new(opi::StatsNvmePathResponse {
                stats: Some(stats),
            }))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use dpu_proto::opi::storage::v1::frontend_nvme_service_server::FrontendNvmeService;
    use dpu_proto::v1::storage_service_server::StorageService;
    use tonic::Code;

    use super::*;
    use crate::model::{Cluster, RemoteNamespace};
    use crate::service::testing::HOST_NQN;
    use crate::service::StoreProbe;
    use crate::store::StateHandle;

    const FAR: &str = "nqn.2024-01.io.example:far";

    /// A stand-in remote subsystem with namespaces 1 and 2 (512-byte
    /// blocks); it answers unless `down`, and records the paths it was
    /// reached through.
    #[derive(Debug, Default)]
    struct Far {
        down: AtomicBool,
        seen: Mutex<Vec<(Vec<SocketAddr>, String, String)>>,
    }

    fn info(nsid: u32) -> RemoteNamespaceInfo {
        RemoteNamespaceInfo {
            nsid,
            nguid: [nsid as u8; 16],
            eui64: if nsid == 1 {
                [0, 0, 0, 0, 0, 0, 1, 2]
            } else {
                [0; 8]
            },
            uuid: [0x10 + nsid as u8; 16],
            block_size: 512,
            blocks: 2048,
        }
    }

    impl StoreProbe for Far {
        fn probe_cluster(&self, _: &Cluster) -> std::result::Result<(), String> {
            Err("no clusters here".into())
        }

        fn probe_image(&self, _: &Cluster, _: &str, _: &str) -> std::result::Result<u64, String> {
            Err("no clusters here".into())
        }

        fn probe_remote(&self, r: &RemoteNamespace, _: u32) -> std::result::Result<(), String> {
            if self.down.load(Ordering::Acquire) || r.subnqn != FAR {
                return Err("connection refused".into());
            }
            Ok(())
        }

        fn probe_remote_namespaces(
            &self,
            paths: &[SocketAddr],
            subnqn: &str,
            host_nqn: &str,
            bound: Duration,
        ) -> std::result::Result<Vec<RemoteNamespaceInfo>, String> {
            assert!(bound >= LIST_PER_PATH, "{bound:?}");
            self.seen
                .lock()
                .unwrap()
                .push((paths.to_vec(), subnqn.into(), host_nqn.into()));
            if self.down.load(Ordering::Acquire) || subnqn != FAR {
                return Err(format!("no path answered ({paths:?})"));
            }
            Ok(vec![info(1), info(2)])
        }
    }

    fn api() -> (Api, Arc<Far>, StateHandle) {
        let state = StateHandle::open(None).unwrap();
        let far = Arc::new(Far::default());
        let api = Api::with_probe_for_tests(state.clone(), far.clone(), None);
        (api, far, state)
    }

    fn path(traddr: &str, port: i64, subnqn: &str) -> opi::NvmePath {
        opi::NvmePath {
            trtype: opi::NvmeTransportType::Tcp as i32,
            traddr: traddr.into(),
            fabrics: Some(opi::FabricsPath {
                trsvcid: port,
                subnqn: subnqn.into(),
                adrfam: opi::NvmeAddressFamily::Ipv4 as i32,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The field a refusal names, from its `field: reason` text.
    fn refused_field<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Err(ControlError::InvalidArgument { field, .. }) => field,
            other => panic!("not INVALID_ARGUMENT: {other:?}"),
        }
    }

    #[test]
    fn controllers_refuse_what_is_not_offered_by_field() {
        let c = |f: fn(&mut opi::NvmeRemoteController)| {
            let mut c = opi::NvmeRemoteController::default();
            f(&mut c);
            controller_spec(&c, CONTROLLER_FIELDS)
        };
        assert_eq!(c(|_| {}).unwrap(), None);
        assert_eq!(c(|c| c.queue_size = 64).unwrap(), Some(64));
        c(|c| c.multipath = opi::NvmeMultipath::Failover as i32).unwrap();
        c(|c| c.multipath = opi::NvmeMultipath::Disable as i32).unwrap();
        c(|c| c.io_queues_count = 1).unwrap();
        for (f, field) in [
            (
                (|c: &mut opi::NvmeRemoteController| {
                    c.multipath = opi::NvmeMultipath::Multipath as i32
                }) as fn(&mut opi::NvmeRemoteController),
                "nvme_remote_controller.multipath",
            ),
            (|c| c.multipath = 99, "nvme_remote_controller.multipath"),
            (
                |c| c.io_queues_count = 2,
                "nvme_remote_controller.io_queues_count",
            ),
            (|c| c.queue_size = 1, "nvme_remote_controller.queue_size"),
            (|c| c.queue_size = 1025, "nvme_remote_controller.queue_size"),
            (|c| c.queue_size = -1, "nvme_remote_controller.queue_size"),
            (
                |c| {
                    c.tcp = Some(opi::TcpController {
                        hdgst: true,
                        ..Default::default()
                    })
                },
                "nvme_remote_controller.tcp.hdgst",
            ),
            (
                |c| {
                    c.tcp = Some(opi::TcpController {
                        ddgst: true,
                        ..Default::default()
                    })
                },
                "nvme_remote_controller.tcp.ddgst",
            ),
            (
                |c| {
                    c.tcp = Some(opi::TcpController {
                        psk: b"NVMeTLSkey-1:01:x".to_vec(),
                        ..Default::default()
                    })
                },
                "nvme_remote_controller.tcp.psk",
            ),
        ] {
            assert_eq!(refused_field(c(f)), field);
        }
        // Only masked fields are looked at.
        let digests = opi::NvmeRemoteController {
            tcp: Some(opi::TcpController {
                hdgst: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(controller_spec(&digests, &["queue_size"]).unwrap(), None);
    }

    #[test]
    fn paths_refuse_what_is_not_offered_by_field() {
        let ok = path_spec(&path("10.0.0.1", 4420, FAR), HOST_NQN).unwrap();
        assert_eq!(ok.addr, "10.0.0.1:4420".parse().unwrap());
        assert_eq!((ok.subnqn.as_str(), ok.host_nqn.as_str()), (FAR, HOST_NQN));
        let mut v6 = path("fd00::1", 4420, FAR);
        v6.fabrics.as_mut().unwrap().adrfam = opi::NvmeAddressFamily::Ipv6 as i32;
        v6.fabrics.as_mut().unwrap().hostnqn = "nqn.2024-01.io.example:me".into();
        let p = path_spec(&v6, HOST_NQN).unwrap();
        assert_eq!(p.host_nqn, "nqn.2024-01.io.example:me");
        // The view checks back as the path it shows.
        let o = path_to_opi("nvme0", "p1", &p);
        assert_eq!(o.name, "nvmeRemoteControllers/nvme0/nvmePaths/p1");
        assert_eq!(path_spec(&o, HOST_NQN).unwrap(), p);
        let refused = |f: fn(&mut opi::NvmePath)| {
            let mut p = path("10.0.0.1", 4420, FAR);
            f(&mut p);
            refused_field(path_spec(&p, HOST_NQN))
        };
        assert_eq!(
            refused(|p| p.trtype = opi::NvmeTransportType::Rdma as i32),
            "nvme_path.trtype"
        );
        assert_eq!(refused(|p| p.trtype = 0), "nvme_path.trtype");
        assert_eq!(
            refused(|p| p.traddr = "far.example".into()),
            "nvme_path.traddr"
        );
        assert_eq!(refused(|p| p.traddr = "0.0.0.0".into()), "nvme_path.traddr");
        assert_eq!(refused(|p| p.fabrics = None), "nvme_path.fabrics");
        let fab = |f: fn(&mut opi::FabricsPath)| {
            let mut p = path("10.0.0.1", 4420, FAR);
            f(p.fabrics.as_mut().unwrap());
            refused_field(path_spec(&p, HOST_NQN))
        };
        assert_eq!(fab(|f| f.trsvcid = 0), "nvme_path.fabrics.trsvcid");
        assert_eq!(fab(|f| f.trsvcid = 65536), "nvme_path.fabrics.trsvcid");
        assert_eq!(
            fab(|f| f.adrfam = opi::NvmeAddressFamily::Ipv6 as i32),
            "nvme_path.fabrics.adrfam"
        );
        assert_eq!(fab(|f| f.subnqn.clear()), "nvme_path.fabrics.subnqn");
        assert_eq!(
            fab(|f| f.subnqn = validate::DISCOVERY_NQN.into()),
            "nvme_path.fabrics.subnqn"
        );
        assert_eq!(
            fab(|f| f.hostnqn = "a b".into()),
            "nvme_path.fabrics.hostnqn"
        );
        assert_eq!(
            fab(|f| f.source_traddr = "10.0.0.9".into()),
            "nvme_path.fabrics.source_traddr"
        );
        assert_eq!(
            fab(|f| f.source_trsvcid = 5),
            "nvme_path.fabrics.source_trsvcid"
        );
    }

    /// Each of the service's 15 methods is in the authorization table:
    /// reads (Get, List, Stats) with the read permission, the rest admin.
    #[test]
    fn every_method_is_authorized() {
        use crate::service::authz::{Permission, METHODS as TABLE};
        assert_eq!(METHODS.len(), 15);
        for m in METHODS {
            let found = TABLE.iter().find(|(t, _)| t == m).map(|(_, p)| *p);
            let name = m.rsplit('/').next().unwrap_or_default();
            let read = ["Get", "List", "Stats"].iter().any(|v| name.starts_with(v));
            let wanted = if read {
                Permission::Read
            } else {
                Permission::Admin
            };
            assert_eq!(found, Some(wanted), "{m}");
        }
    }

    #[test]
    fn names_masks_and_references() {
        assert_eq!(remote_ref("nvme0n1"), Some(("nvme0", 1)));
        assert_eq!(remote_ref("nvme-anvme2n17"), Some(("nvme-anvme2", 17)));
        for no in [
            "nvme0",
            "Malloc1",
            "nvme0n0",
            "nvme0n01",
            "n1",
            "nvme0n4294967295",
            "Nvme0n1",
        ] {
            assert_eq!(remote_ref(no), None, "{no}");
        }
        assert_eq!(
            remote_namespace_ids("name", "nvmeRemoteControllers/c/nvmeRemoteNamespaces/7").unwrap(),
            ("c", 7)
        );
        assert_eq!(
            refused_field(remote_namespace_ids(
                "name",
                "nvmeRemoteControllers/c/nvmeRemoteNamespaces/x"
            )),
            "name"
        );
        assert_eq!(
            refused_field(path_ids("name", "nvmeRemoteControllers/c/paths/p")),
            "name"
        );
        let mask = |p: &[&str]| FieldMask {
            paths: p.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(
            update_paths(Some(&mask(&["*"])), PATH_FIELDS, "NvmePath").unwrap(),
            PATH_FIELDS
        );
        assert_eq!(
            update_paths(Some(&mask(&["name", "tcp"])), CONTROLLER_FIELDS, "c").unwrap(),
            ["tcp.hdgst", "tcp.ddgst", "tcp.psk"]
        );
        assert_eq!(
            refused_field(update_paths(
                Some(&mask(&["colour"])),
                PATH_FIELDS,
                "NvmePath"
            )),
            "update_mask"
        );
        // A masked path merge takes only the masked fields.
        let now = path("10.0.0.1", 4420, FAR);
        let wanted = path("10.0.0.2", 4421, "nqn.2024-01.io.example:b");
        let m = merge_path(&now, &wanted, &["fabrics.trsvcid"]);
        assert_eq!(m.traddr, "10.0.0.1");
        assert_eq!(m.fabrics.as_ref().unwrap().trsvcid, 4421);
        assert_eq!(m.fabrics.unwrap().subnqn, FAR);
        // The namespace view: hex NGUID, big-endian EUI-64, UUID text.
        let n = remote_namespace_to_opi("nvme0", &info(1));
        assert_eq!(n.name, "nvmeRemoteControllers/nvme0/nvmeRemoteNamespaces/1");
        assert_eq!(n.nguid, "01010101010101010101010101010101");
        assert_eq!(n.eui64, 0x0102);
        assert_eq!(n.uuid, "11111111-1111-1111-1111-111111111111");
        let bare = remote_namespace_to_opi(
            "c",
            &RemoteNamespaceInfo {
                nsid: 3,
                ..Default::default()
            },
        );
        assert_eq!(
            (bare.nguid.as_str(), bare.uuid.as_str(), bare.eui64),
            ("", "", 0)
        );
    }

    async fn create_controller(
        api: &Api,
        id: &str,
    ) -> std::result::Result<opi::NvmeRemoteController, Status> {
        api.create_nvme_remote_controller(Request::new(opi::CreateNvmeRemoteControllerRequest {
            nvme_remote_controller: Some(opi::NvmeRemoteController::default()),
            nvme_remote_controller_id: id.into(),
        }))
        .await
        .map(Response::into_inner)
    }

    async fn create_path(
        api: &Api,
        id: &str,
        p: opi::NvmePath,
    ) -> std::result::Result<opi::NvmePath, Status> {
        api.create_nvme_path(Request::new(opi::CreateNvmePathRequest {
            parent: "nvmeRemoteControllers/nvme0".into(),
            nvme_path: Some(p),
            nvme_path_id: id.into(),
        }))
        .await
        .map(Response::into_inner)
    }

    /// Through the service: a controller and its paths, the remote's two
    /// namespaces, a namespace made from `nvme0n1`, and the refusals
    /// while it exists.
    #[tokio::test]
    async fn a_controller_lists_the_remotes_namespaces_and_backs_one() {
        let (api, far, state) = api();
        let c = create_controller(&api, "nvme0").await.unwrap();
        assert_eq!(c.name, "nvmeRemoteControllers/nvme0");
        assert_eq!((c.queue_size, c.io_queues_count), (128, 1));
        assert_eq!(
            create_controller(&api, "nvme0").await.unwrap_err().code(),
            Code::AlreadyExists
        );
        // No path yet: nothing to list.
        let list = |page_size, page_token: &str| {
            Request::new(opi::ListNvmeRemoteNamespacesRequest {
                parent: "nvmeRemoteControllers/nvme0".into(),
                page_size,
                page_token: page_token.into(),
            })
        };
        let e = api
            .list_nvme_remote_namespaces(list(0, ""))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

        let p2 = create_path(&api, "p2", path("10.0.0.2", 4420, FAR))
            .await
            .unwrap();
        assert_eq!(p2.fabrics.as_ref().unwrap().hostnqn, HOST_NQN);
        create_path(&api, "p1", path("10.0.0.1", 4420, FAR))
            .await
            .unwrap();
        let e = create_path(
            &api,
            "p3",
            path("10.0.0.3", 4420, "nqn.2024-01.io.example:b"),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(
            e.message().starts_with("nvme_path.fabrics.subnqn:"),
            "{e:?}"
        );
        let mut digest = path("10.0.0.3", 4420, FAR);
        digest.fabrics.as_mut().unwrap().source_trsvcid = 9;
        let e = create_path(&api, "p3", digest).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message().starts_with("nvme_path.fabrics.source_trsvcid:"),
            "{e:?}"
        );

        // The remote's namespaces, paged, through the paths in ID order.
        let page = api
            .list_nvme_remote_namespaces(list(1, ""))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            page.nvme_remote_namespaces,
            [remote_namespace_to_opi("nvme0", &info(1))]
        );
        let rest = api
            .list_nvme_remote_namespaces(list(1, &page.next_page_token))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            rest.nvme_remote_namespaces,
            [remote_namespace_to_opi("nvme0", &info(2))]
        );
        assert!(rest.next_page_token.is_empty());
        let (paths, subnqn, host) = far.seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(
            paths,
            [
                "10.0.0.1:4420".parse::<SocketAddr>().unwrap(),
                "10.0.0.2:4420".parse().unwrap()
            ]
        );
        assert_eq!((subnqn.as_str(), host.as_str()), (FAR, HOST_NQN));
        let get = |nsid: u32| {
            Request::new(opi::GetNvmeRemoteNamespaceRequest {
                name: format!("nvmeRemoteControllers/nvme0/nvmeRemoteNamespaces/{nsid}"),
            })
        };
        let two = api
            .get_nvme_remote_namespace(get(2))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(two.nguid, "02020202020202020202020202020202");
        let e = api.get_nvme_remote_namespace(get(3)).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);

        // A namespace made from nvme0n1.
        api.create_nvme_subsystem(Request::new(opi::CreateNvmeSubsystemRequest {
            nvme_subsystem_id: "s1".into(),
            nvme_subsystem: Some(opi::NvmeSubsystem {
                spec: Some(opi::NvmeSubsystemSpec {
                    nqn: "nqn.2024-01.io.example:s1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }))
        .await
        .unwrap();
        let ns_spec = |r: &str| opi::NvmeNamespaceSpec {
            volume_name_ref: r.into(),
            ..Default::default()
        };
        let create_ns = |id: &str, r: &str| {
            Request::new(opi::CreateNvmeNamespaceRequest {
                parent: "nvmeSubsystems/s1".into(),
                nvme_namespace_id: id.into(),
                nvme_namespace: Some(opi::NvmeNamespace {
                    spec: Some(ns_spec(r)),
                    ..Default::default()
                }),
            })
        };
        let e = api
            .create_nvme_namespace(create_ns("r9", "nvme0n9"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(
            e.message()
                .starts_with("nvme_namespace.spec.volume_name_ref:"),
            "{e:?}"
        );
        let made = api
            .create_nvme_namespace(create_ns("r1", "nvme0n1"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(made.spec.as_ref().unwrap().volume_name_ref, "nvme0n1");
        let ours = StorageService::get_namespace(
            &api,
            Request::new(pb::GetNamespaceRequest {
                name: "subsystems/s1/namespaces/1".into(),
            }),
        )
        .await
        .unwrap()
        .into_inner();
        let Some(pb::namespace::Backend::Remote(r)) = ours.backend else {
            panic!("{ours:?}")
        };
        assert_eq!(r.paths, ["10.0.0.1:4420", "10.0.0.2:4420"]);
        assert_eq!(
            (r.subnqn.as_str(), r.nsid, r.host_nqn.as_str()),
            (FAR, 1, HOST_NQN)
        );
        assert_eq!((r.queue_depth, ours.block_size), (128, 512));
        // An update repeating the reference is no change.
        let same = api
            .update_nvme_namespace(Request::new(opi::UpdateNvmeNamespaceRequest {
                nvme_namespace: Some(opi::NvmeNamespace {
                    name: "nvmeSubsystems/s1/nvmeNamespaces/r1".into(),
                    spec: Some(ns_spec("nvme0n1")),
                    ..Default::default()
                }),
                update_mask: None,
                allow_missing: false,
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(same, made);

        // While it exists: the controller, its last path and its
        // subsystem stay.
        let delete = |allow_missing| {
            Request::new(opi::DeleteNvmeRemoteControllerRequest {
                name: "nvmeRemoteControllers/nvme0".into(),
                allow_missing,
            })
        };
        let e = api
            .delete_nvme_remote_controller(delete(false))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("subsystems/s1/namespaces/1"), "{e:?}");
        let delete_path = |p: &str| {
            Request::new(opi::DeleteNvmePathRequest {
                name: format!("nvmeRemoteControllers/nvme0/nvmePaths/{p}"),
                allow_missing: false,
            })
        };
        for p in ["p1", "p2"] {
            let e = api.delete_nvme_path(delete_path(p)).await.unwrap_err();
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            assert!(e.message().contains("subsystems/s1/namespaces/1"), "{e:?}");
        }
        // Nor does a path change under it: the namespace would not follow.
        let update_path = |p: opi::NvmePath, mask: &[&str]| {
            Request::new(opi::UpdateNvmePathRequest {
                nvme_path: Some(opi::NvmePath {
                    name: "nvmeRemoteControllers/nvme0/nvmePaths/p2".into(),
                    ..p
                }),
                update_mask: Some(FieldMask {
                    paths: mask.iter().map(|s| s.to_string()).collect(),
                }),
                allow_missing: false,
            })
        };
        for (p, mask) in [
            (path("10.0.0.7", 0, ""), &["traddr"][..]),
            (
                path("10.0.0.7", 4420, "nqn.2024-01.io.example:b"),
                &["fabrics.subnqn"][..],
            ),
        ] {
            let e = api
                .update_nvme_path(update_path(p, mask))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            assert!(e.message().contains("paths it was made with"), "{e:?}");
        }
        let e = create_path(&api, "p3", path("10.0.0.3", 4420, FAR))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

        // Stats: the subsystem's counters (none counted here).
        let stats = api
            .stats_nvme_remote_controller(Request::new(opi::StatsNvmeRemoteControllerRequest {
                name: "nvmeRemoteControllers/nvme0".into(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(stats.stats, Some(opi::VolumeStats::default()));
        // Reset answers while a path answers, and not when none does.
        let reset = || {
            Request::new(opi::ResetNvmeRemoteControllerRequest {
                name: "nvmeRemoteControllers/nvme0".into(),
            })
        };
        api.reset_nvme_remote_controller(reset()).await.unwrap();
        far.down.store(true, Ordering::Release);
        let e = api.reset_nvme_remote_controller(reset()).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        far.down.store(false, Ordering::Release);

        // Queue depth updates; unmasked refusals are not looked at.
        let up = api
            .update_nvme_remote_controller(Request::new(opi::UpdateNvmeRemoteControllerRequest {
                nvme_remote_controller: Some(opi::NvmeRemoteController {
                    name: "nvmeRemoteControllers/nvme0".into(),
                    queue_size: 32,
                    multipath: opi::NvmeMultipath::Multipath as i32,
                    ..Default::default()
                }),
                update_mask: Some(FieldMask {
                    paths: vec!["queue_size".into()],
                }),
                allow_missing: false,
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(up.queue_size, 32);
        assert_eq!(state.snapshot().remote_controllers["nvme0"].queue_depth, 32);

        // Once the namespace is gone, so may the controller be; its
        // namespace no longer shows a reference without it.
        api.delete_nvme_remote_controller(delete(false))
            .await
            .unwrap_err();
        api.delete_nvme_namespace(Request::new(opi::DeleteNvmeNamespaceRequest {
            name: "nvmeSubsystems/s1/nvmeNamespaces/r1".into(),
            allow_missing: false,
        }))
        .await
        .unwrap();
        api.delete_nvme_remote_controller(delete(false))
            .await
            .unwrap();
        let e = api
            .delete_nvme_remote_controller(delete(false))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        api.delete_nvme_remote_controller(delete(true))
            .await
            .unwrap();
        let listed = api
            .list_nvme_remote_controllers(Request::new(
                opi::ListNvmeRemoteControllersRequest::default(),
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(listed.nvme_remote_controllers.is_empty());
    }

    /// Four paths a controller; the fifth is refused.
    #[tokio::test]
    async fn a_fifth_path_is_refused() {
        let (api, _, _) = api();
        create_controller(&api, "nvme0").await.unwrap();
        for i in 1..=4 {
            create_path(
                &api,
                &format!("p{i}"),
                path(&format!("10.0.0.{i}"), 4420, FAR),
            )
            .await
            .unwrap();
        }
        let e = create_path(&api, "p5", path("10.0.0.5", 4420, FAR))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        let paths = api
            .list_nvme_paths(Request::new(opi::ListNvmePathsRequest {
                parent: "nvmeRemoteControllers/nvme0".into(),
                page_size: 3,
                page_token: String::new(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(paths.nvme_paths.len(), 3);
        assert!(!paths.next_page_token.is_empty());
        // A controller made again by an update with allow_missing.
        let made = api
            .update_nvme_remote_controller(Request::new(opi::UpdateNvmeRemoteControllerRequest {
                nvme_remote_controller: Some(opi::NvmeRemoteController {
                    name: "nvmeRemoteControllers/nvme1".into(),
                    queue_size: 16,
                    ..Default::default()
                }),
                update_mask: None,
                allow_missing: true,
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (made.name.as_str(), made.queue_size),
            ("nvmeRemoteControllers/nvme1", 16)
        );
    }
}
