//! OPI's `opi_api.storage.v1.FrontendNvmeService` over the same state as
//! `dpu.v1`: an OPI `NvmeSubsystem` is a view of one of our subsystems,
//! so what either API makes the other shows and changes, and it is stored
//! once. Each call checks the OPI request (errors name OPI's fields),
//! turns it into the `dpu.v1` request it stands for and runs that through
//! [`StorageService`], so validation, persistence and the target's
//! configuration are those of `dpu.v1`.
//!
//! Mapping: `nvmeSubsystems/{id}` is `subsystems/{id}`; `spec.hostnqn`,
//! the one host OPI lets connect, is the allow list (empty: any host);
//! `spec.psk`, that host's TLS key in the interchange format, is its TLS
//! key (never returned); `status.firmware_revision` is what Identify
//! Controller reports. An NVMe/TCP `NvmeController`
//! (`nvmeSubsystems/{id}/nvmeControllers/{c}`) is the listener
//! `subsystems/{id}/listeners/{c}`, its `fabrics_id` the listener's address
//! and port; what a listener cannot be (a PCIe function, a fixed CNTLID,
//! queue sizes, per-controller QoS) is refused naming the field.
//! An `NvmeNamespace` (`nvmeSubsystems/{id}/nvmeNamespaces/{n}`) is a
//! namespace of the subsystem made on a volume, named by its `dpu.v1`
//! `namespace_id` or, without one, its NSID: [`super::opi_namespace`]
//! maps it.

use std::sync::atomic::{AtomicU64, Ordering};

use dpu_proto::opi::storage::v1 as opi;
use dpu_proto::opi::storage::v1::frontend_nvme_service_server::FrontendNvmeService;
use dpu_proto::pbjson_types::Empty;
use dpu_proto::v1 as pb;
use dpu_proto::v1::storage_service_server::StorageService;
use tonic::{Code, Request, Response, Status};

use super::{required, Api};
use crate::error::{ControlError, Result};
use crate::validate;

/// OPI's collection of subsystems, as its resource names spell it.
pub const SUBSYSTEMS: &str = "nvmeSubsystems";

/// Fields of an `NvmeSubsystem` an update mask may name.
const SPEC_FIELDS: &[&str] = &[
    "spec.nqn",
    "spec.serial_number",
    "spec.model_number",
    "spec.max_namespaces",
    "spec.hostnqn",
    "spec.psk",
];

/// A `dpu.v1` request carrying the OPI request's metadata and extensions
/// (the caller the authorization layer found).
pub(super) fn inner<T, U>(outer: &Request<T>, message: U) -> Request<U> {
    let mut r = Request::new(message);
    *r.metadata_mut() = outer.metadata().clone();
    *r.extensions_mut() = outer.extensions().clone();
    r
}

/// Our subsystem ID in an OPI subsystem name.
fn subsystem_id<'a>(field: &str, name: &'a str) -> std::result::Result<&'a str, Status> {
    Ok(validate::name(field, name, SUBSYSTEMS)?)
}

/// An ID for a subsystem created without one: "opi-" and 16 hex digits,
/// unique in this process (the state refuses a taken one all the same).
pub(super) fn generated_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(
        "opi-{:016x}",
        nanos.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    )
}

/// The OPI view of one of our subsystems.
pub fn subsystem_to_opi(s: pb::Subsystem) -> opi::NvmeSubsystem {
    let id = s.name.strip_prefix("subsystems/").unwrap_or(&s.name);
    let hostnqn = match (s.allow_any_host, s.allowed_hosts.as_slice()) {
        (false, [one]) => one.clone(),
        _ => String::new(),
    };
    opi::NvmeSubsystem {
        name: format!("{SUBSYSTEMS}/{id}"),
        spec: Some(opi::NvmeSubsystemSpec {
            nqn: s.nqn,
            serial_number: s.serial_number,
            model_number: s.model_number,
            max_namespaces: i64::from(s.max_namespaces),
            hostnqn,
            psk: Vec::new(),
        }),
        status: Some(opi::NvmeSubsystemStatus {
            firmware_revision: dpu_nvmeof::FIRMWARE_REVISION.to_string(),
            fru_guid: Vec::new(),
        }),
    }
}

/// An OPI spec, checked, in the terms of `dpu.v1`.
struct Spec {
    nqn: String,
    serial_number: String,
    model_number: String,
    max_namespaces: u32,
    hostnqn: String,
    /// The host's TLS key, checked, as the request gave it.
    psk: Option<String>,
}

impl Spec {
    fn check(field: &str, s: opi::NvmeSubsystemSpec) -> Result<Spec> {
        validate::nqn(&format!("{field}.nqn"), &s.nqn)?;
        if !s.serial_number.is_empty() {
            validate::ascii_id(&format!("{field}.serial_number"), &s.serial_number, 20)?;
        }
        if !s.model_number.is_empty() {
            validate::ascii_id(&format!("{field}.model_number"), &s.model_number, 40)?;
        }
        let max_namespaces = u32::try_from(s.max_namespaces)
            .map_err(|_| {
                ControlError::invalid(
                    format!("{field}.max_namespaces"),
                    format!("{} is not in 0..=1024", s.max_namespaces),
                )
            })
            .and_then(|v| validate::max_namespaces(&format!("{field}.max_namespaces"), v))?;
        if !s.hostnqn.is_empty() {
            validate::nqn(&format!("{field}.hostnqn"), &s.hostnqn)?;
        }
        let psk = if s.psk.is_empty() {
            None
        } else {
            if s.hostnqn.is_empty() {
                return Err(ControlError::invalid(
                    format!("{field}.psk"),
                    "a TLS key is a host's: set spec.hostnqn too",
                ));
            }
            let text = String::from_utf8(s.psk).map_err(|_| {
                ControlError::invalid(
                    format!("{field}.psk"),
                    "not a key in the interchange format (NVMeTLSkey-1:..)",
                )
            })?;
            let t = pb::HostTls {
                host_nqn: s.hostnqn.clone(),
                psk: text.trim().to_string(),
                ..Default::default()
            };
            validate::host_tls(field, &t)?;
            Some(t.psk)
        };
        Ok(Spec {
            nqn: s.nqn,
            serial_number: s.serial_number,
            model_number: s.model_number,
            max_namespaces,
            hostnqn: s.hostnqn,
            psk,
        })
    }

    /// The `dpu.v1` subsystem it describes.
    fn subsystem(&self) -> pb::Subsystem {
        pb::Subsystem {
            nqn: self.nqn.clone(),
            serial_number: self.serial_number.clone(),
            model_number: self.model_number.clone(),
            max_namespaces: self.max_namespaces,
            allow_any_host: self.hostnqn.is_empty(),
            allowed_hosts: if self.hostnqn.is_empty() {
                Vec::new()
            } else {
                vec![self.hostnqn.clone()]
            },
            ..Default::default()
        }
    }
}

/// OPI's collection of controllers under a subsystem.
pub const CONTROLLERS: &str = "nvmeControllers";

/// Our subsystem and listener IDs in an OPI controller name.
fn controller_ids<'a>(
    field: &str,
    name: &'a str,
) -> std::result::Result<(&'a str, &'a str), Status> {
    let (sid, cid) = validate::child_name(field, name, SUBSYSTEMS, CONTROLLERS)?;
    validate::id(field, sid)?;
    validate::id(field, cid)?;
    Ok((sid, cid))
}

/// The OPI view of one of our listeners: an NVMe/TCP controller.
pub fn controller_to_opi(l: pb::Listener) -> opi::NvmeController {
    // "subsystems/{s}/listeners/{l}"
    let mut parts = l.name.split('/');
    let (sid, lid) = (
        parts.nth(1).unwrap_or_default(),
        parts.nth(1).unwrap_or_default(),
    );
    let adrfam = if l.address.contains(':') {
        opi::NvmeAddressFamily::Ipv6
    } else {
        opi::NvmeAddressFamily::Ipv4
    };
    opi::NvmeController {
        name: format!("{SUBSYSTEMS}/{sid}/{CONTROLLERS}/{lid}"),
        spec: Some(opi::NvmeControllerSpec {
            trtype: opi::NvmeTransportType::Tcp as i32,
            endpoint: Some(opi::nvme_controller_spec::Endpoint::FabricsId(
                opi::FabricsEndpoint {
                    traddr: l.address,
                    trsvcid: l.port.to_string(),
                    adrfam: adrfam as i32,
                },
            )),
            ..Default::default()
        }),
        // It exists: its socket listens (or its storage endpoint serves).
        status: Some(opi::NvmeControllerStatus { active: true }),
    }
}

/// An OPI controller spec, checked (errors name `field`'s members), as
/// the `dpu.v1` listener it stands for.
pub fn controller_spec(field: &str, s: opi::NvmeControllerSpec) -> Result<pb::Listener> {
    let bad = |f: &str, why: &str| ControlError::invalid(format!("{field}.{f}"), why.to_string());
    match opi::NvmeTransportType::try_from(s.trtype) {
        Ok(opi::NvmeTransportType::Tcp | opi::NvmeTransportType::Unspecified) => {}
        _ => {
            return Err(bad(
                "trtype",
                "only NVME_TRANSPORT_TYPE_TCP is served: the target is NVMe/TCP",
            ))
        }
    }
    if s.nvme_controller_id.is_some_and(|c| c != 0) {
        return Err(bad(
            "nvme_controller_id",
            "leave it unset: the target gives each host connection its own controller \
             and CNTLID (the dynamic controller model)",
        ));
    }
    for (f, v) in [
        ("max_nsq", s.max_nsq),
        ("max_ncq", s.max_ncq),
        ("sqes", s.sqes),
        ("cqes", s.cqes),
        ("max_namespaces", s.max_namespaces),
    ] {
        if v != 0 {
            return Err(bad(
                f,
                "not settable per controller: the target grants queues as hosts ask \
                 (max_namespaces is the subsystem's)",
            ));
        }
    }
    for (f, q) in [("min_limit", &s.min_limit), ("max_limit", &s.max_limit)] {
        if q.as_ref().is_some_and(|q| *q != opi::QosLimit::default()) {
            return Err(bad(
                f,
                "QoS limits are per namespace, per host of a subsystem and per tenant \
                 here (dpu.v1 SetNamespaceQos, SetHostQos, SetTenantStorageQos), not per \
                 controller",
            ));
        }
    }
    let fabrics = match s.endpoint {
        Some(opi::nvme_controller_spec::Endpoint::FabricsId(f)) => f,
        Some(opi::nvme_controller_spec::Endpoint::PcieId(_)) => {
            return Err(bad(
                "pcie_id",
                "this service presents no PCIe functions to the host; give fabrics_id \
                 (NVMe/TCP)",
            ))
        }
        None => return Err(bad("fabrics_id", "required: where the controller listens")),
    };
    let addr: std::net::IpAddr = fabrics.traddr.parse().map_err(|_| {
        bad(
            "fabrics_id.traddr",
            &format!("{:?} is not an IPv4 or IPv6 address", fabrics.traddr),
        )
    })?;
    match (opi::NvmeAddressFamily::try_from(fabrics.adrfam), addr) {
        (Ok(opi::NvmeAddressFamily::Unspecified), _)
        | (Ok(opi::NvmeAddressFamily::Ipv4), std::net::IpAddr::V4(_))
        | (Ok(opi::NvmeAddressFamily::Ipv6), std::net::IpAddr::V6(_)) => {}
        _ => {
            return Err(bad(
                "fabrics_id.adrfam",
                "must be IPV4 or IPV6, as traddr is",
            ))
        }
    }
    let port = if fabrics.trsvcid.is_empty() {
        0
    } else {
        match fabrics.trsvcid.parse::<u16>() {
            Ok(p) if p > 0 => u32::from(p),
            _ => {
                return Err(bad(
                    "fabrics_id.trsvcid",
                    &format!("{:?} is not a TCP port (1..65535)", fabrics.trsvcid),
                ))
            }
        }
    };
    Ok(pb::Listener {
        transport: pb::Transport::Tcp as i32,
        address: fabrics.traddr,
        port,
        ..Default::default()
    })
}

/// An OPI subsystem spec, checked (errors name `field`'s members), as the
/// `dpu.v1` subsystem it stands for and its host's TLS key, if it has one.
pub fn subsystem_spec(
    field: &str,
    spec: opi::NvmeSubsystemSpec,
) -> Result<(pb::Subsystem, Option<String>)> {
    let s = Spec::check(field, spec)?;
    Ok((s.subsystem(), s.psk))
}

/// What a delete answers: done, or done already when the caller allows
/// the resource to be missing.
pub(super) fn gone<T>(
    deleted: std::result::Result<T, Status>,
    allow_missing: bool,
) -> std::result::Result<Response<Empty>, Status> {
    match deleted {
        Ok(_) => Ok(Response::new(Empty {})),
        Err(e) if e.code() == Code::NotFound && allow_missing => Ok(Response::new(Empty {})),
        Err(e) => Err(e),
    }
}

impl Api {
    /// Runs an OPI call and counts it by method and code on `/metrics`,
    /// as `dpu.v1`'s calls are (the `dpu.v1` calls it makes count too).
    pub(super) async fn opi_call<T>(
        &self,
        method: &'static str,
        f: impl std::future::Future<Output = std::result::Result<Response<T>, Status>>,
    ) -> std::result::Result<Response<T>, Status> {
        let r = f.await;
        let code = r.as_ref().map_or_else(Status::code, |_| Code::Ok);
        self.ctl.telemetry.observe_request(method, code);
        r
    }

    /// Creates subsystem `id` from a checked OPI spec, then sets its
    /// host's TLS key if the spec has one (undoing the creation if that
    /// fails).
    async fn opi_create<T>(
        &self,
        outer: &Request<T>,
        id: String,
        spec: Spec,
    ) -> std::result::Result<opi::NvmeSubsystem, Status> {
        let created = StorageService::create_subsystem(
            self,
            inner(
                outer,
                pb::CreateSubsystemRequest {
                    subsystem_id: id.clone(),
                    subsystem: Some(spec.subsystem()),
                },
            ),
        )
        .await?
        .into_inner();
        let Some(psk) = spec.psk else {
            return Ok(subsystem_to_opi(created));
        };
        let keyed = StorageService::set_host_tls_key(
            self,
            inner(
                outer,
                pb::SetHostTlsKeyRequest {
                    subsystem: format!("subsystems/{id}"),
                    tls: Some(pb::HostTls {
                        host_nqn: spec.hostnqn,
                        psk,
                        ..Default::default()
                    }),
                },
            ),
        )
        .await;
        match keyed {
            Ok(s) => Ok(subsystem_to_opi(s.into_inner())),
            Err(e) => {
                let _ = StorageService::delete_subsystem(
                    self,
                    inner(
                        outer,
                        pb::DeleteSubsystemRequest {
                            name: format!("subsystems/{id}"),
                            force: true,
                        },
                    ),
                )
                .await;
                Err(e)
            }
        }
    }

    async fn opi_create_controller<T>(
        &self,
        outer: &Request<T>,
        sid: &str,
        cid: String,
        listener: pb::Listener,
    ) -> std::result::Result<opi::NvmeController, Status> {
        Ok(controller_to_opi(
            StorageService::create_listener(
                self,
                inner(
                    outer,
                    pb::CreateListenerRequest {
                        parent: format!("subsystems/{sid}"),
                        listener_id: cid,
                        listener: Some(listener),
                    },
                ),
            )
            .await?
            .into_inner(),
        ))
    }

    /// Listener `cid` of subsystem `sid`, as `dpu.v1` shows it.
    fn listener(&self, sid: &str, cid: &str) -> std::result::Result<pb::Listener, Status> {
        let state = self.ctl.state.snapshot();
        let l =
            state.subsystem(sid)?.listeners.get(cid).ok_or_else(|| {
                ControlError::NotFound(format!("listener {cid} of subsystem {sid}"))
            })?;
        Ok(crate::convert::listener(sid, l))
    }

    async fn opi_get<T>(
        &self,
        outer: &Request<T>,
        id: &str,
    ) -> std::result::Result<pb::Subsystem, Status> {
        Ok(StorageService::get_subsystem(
            self,
            inner(
                outer,
                pb::GetSubsystemRequest {
                    name: format!("subsystems/{id}"),
                },
            ),
        )
        .await?
        .into_inner())
    }
}

/// The update-mask paths of an `UpdateNvmeSubsystem` request, `*` (or
/// none) meaning every field; a path that is no settable field is refused.
pub fn update_paths(
    mask: Option<&dpu_proto::pbjson_types::FieldMask>,
) -> Result<Vec<&'static str>> {
    let paths = mask.map(|m| m.paths.as_slice()).unwrap_or_default();
    if paths.is_empty() || paths.iter().any(|p| p == "*") {
        return Ok(SPEC_FIELDS.to_vec());
    }
    paths
        .iter()
        .map(|p| {
            SPEC_FIELDS
                .iter()
                .copied()
                .find(|f| f == p || f.strip_prefix("spec.") == Some(p.as_str()))
                .ok_or_else(|| {
                    ControlError::invalid(
                        "update_mask",
                        format!("{p:?} is not a field of NvmeSubsystem that can be set"),
                    )
                })
        })
        .collect()
}

#[tonic::async_trait]
impl FrontendNvmeService for Api {
    async fn create_nvme_subsystem(
        &self,
        req: Request<opi::CreateNvmeSubsystemRequest>,
    ) -> std::result::Result<Response<opi::NvmeSubsystem>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/CreateNvmeSubsystem",
            async {
                let r = req.get_ref().clone();
                let id = if r.nvme_subsystem_id.is_empty() {
                    generated_id()
                } else {
                    validate::id("nvme_subsystem_id", &r.nvme_subsystem_id)?;
                    r.nvme_subsystem_id
                };
                let s = required("nvme_subsystem", r.nvme_subsystem)?;
                let spec = Spec::check(
                    "nvme_subsystem.spec",
                    required("nvme_subsystem.spec", s.spec)?,
                )?;
                Ok(Response::new(self.opi_create(&req, id, spec).await?))
            },
        )
        .await
    }

    async fn delete_nvme_subsystem(
        &self,
        req: Request<opi::DeleteNvmeSubsystemRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/DeleteNvmeSubsystem",
            async {
                let id = subsystem_id("name", &req.get_ref().name)?.to_string();
                let deleted = StorageService::delete_subsystem(
                    self,
                    inner(
                        &req,
                        pb::DeleteSubsystemRequest {
                            name: format!("subsystems/{id}"),
                            force: false,
                        },
                    ),
                )
                .await;
                gone(deleted, req.get_ref().allow_missing)
            },
        )
        .await
    }

    async fn update_nvme_subsystem(
        &self,
        req: Request<opi::UpdateNvmeSubsystemRequest>,
    ) -> std::result::Result<Response<opi::NvmeSubsystem>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/UpdateNvmeSubsystem",
            async {
                let r = req.get_ref().clone();
                let s = required("nvme_subsystem", r.nvme_subsystem)?;
                let id = subsystem_id("nvme_subsystem.name", &s.name)?.to_string();
                let paths = update_paths(r.update_mask.as_ref())?;
                let spec = Spec::check(
                    "nvme_subsystem.spec",
                    required("nvme_subsystem.spec", s.spec)?,
                )?;
                let current = match self.opi_get(&req, &id).await {
                    Ok(c) => c,
                    Err(e) if e.code() == Code::NotFound && r.allow_missing => {
                        return Ok(Response::new(self.opi_create(&req, id, spec).await?));
                    }
                    Err(e) => return Err(e),
                };
                let now = subsystem_to_opi(current.clone()).spec.unwrap_or_default();
                // What our subsystems cannot change: refused unless unchanged.
                for (path, same) in [
                    ("spec.nqn", spec.nqn == now.nqn),
                    (
                        "spec.serial_number",
                        spec.serial_number.is_empty() || spec.serial_number == now.serial_number,
                    ),
                    (
                        "spec.max_namespaces",
                        spec.max_namespaces == 0
                            || i64::from(spec.max_namespaces) == now.max_namespaces,
                    ),
                ] {
                    if paths.contains(&path) && !same {
                        return Err(ControlError::invalid(
                            format!("nvme_subsystem.{path}"),
                            "cannot change once the subsystem exists",
                        )
                        .into());
                    }
                }
                let mut mask = Vec::new();
                let mut next = current;
                if paths.contains(&"spec.model_number") && !spec.model_number.is_empty() {
                    mask.push("model_number".to_string());
                    next.model_number.clone_from(&spec.model_number);
                }
                if paths.contains(&"spec.hostnqn") {
                    mask.extend(["allow_any_host".to_string(), "allowed_hosts".to_string()]);
                    let wanted = spec.subsystem();
                    next.allow_any_host = wanted.allow_any_host;
                    next.allowed_hosts = wanted.allowed_hosts;
                }
                let mut out = if mask.is_empty() {
                    next
                } else {
                    next.name = format!("subsystems/{id}");
                    StorageService::update_subsystem(
                        self,
                        inner(
                            &req,
                            pb::UpdateSubsystemRequest {
                                subsystem: Some(next),
                                update_mask: Some(dpu_proto::pbjson_types::FieldMask {
                                    paths: mask,
                                }),
                            },
                        ),
                    )
                    .await?
                    .into_inner()
                };
                if let (true, Some(psk)) = (paths.contains(&"spec.psk"), spec.psk) {
                    out = StorageService::set_host_tls_key(
                        self,
                        inner(
                            &req,
                            pb::SetHostTlsKeyRequest {
                                subsystem: format!("subsystems/{id}"),
                                tls: Some(pb::HostTls {
                                    host_nqn: spec.hostnqn,
                                    psk,
                                    ..Default::default()
                                }),
                            },
                        ),
                    )
                    .await?
                    .into_inner();
                }
                Ok(Response::new(subsystem_to_opi(out)))
            },
        )
        .await
    }

    async fn list_nvme_subsystems(
        &self,
        req: Request<opi::ListNvmeSubsystemsRequest>,
    ) -> std::result::Result<Response<opi::ListNvmeSubsystemsResponse>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/ListNvmeSubsystems",
            async {
                let r = req.get_ref();
                let page = StorageService::list_subsystems(
                    self,
                    inner(
                        &req,
                        pb::ListSubsystemsRequest {
                            page_size: r.page_size,
                            page_token: r.page_token.clone(),
                        },
                    ),
                )
                .await?
                .into_inner();
                Ok(Response::new(opi::ListNvmeSubsystemsResponse {
                    nvme_subsystems: page.subsystems.into_iter().map(subsystem_to_opi).collect(),
                    next_page_token: page.next_page_token,
                }))
            },
        )
        .await
    }

    async fn get_nvme_subsystem(
        &self,
        req: Request<opi::GetNvmeSubsystemRequest>,
    ) -> std::result::Result<Response<opi::NvmeSubsystem>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/GetNvmeSubsystem",
            async {
                let id = subsystem_id("name", &req.get_ref().name)?.to_string();
                Ok(Response::new(subsystem_to_opi(
                    self.opi_get(&req, &id).await?,
                )))
            },
        )
        .await
    }

    /// The subsystem's I/O counters (all its namespaces and hosts) in
    /// OPI's 32-bit fields, saturating. Deallocations and latencies are
    /// not counted by the target: those fields stay 0.
    async fn stats_nvme_subsystem(
        &self,
        req: Request<opi::StatsNvmeSubsystemRequest>,
    ) -> std::result::Result<Response<opi::StatsNvmeSubsystemResponse>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/StatsNvmeSubsystem",
            async {
                let id = subsystem_id("name", &req.get_ref().name)?.to_string();
                self.opi_get(&req, &id).await?;
                // This subsystem's counters only: no snapshot of everything.
                let c = self
                    .ctl
                    .telemetry
                    .collect()
                    .subsystems
                    .remove(&id)
                    .unwrap_or_default();
                let n = |v: u64| i32::try_from(v).unwrap_or(i32::MAX);
                Ok(Response::new(opi::StatsNvmeSubsystemResponse {
                    stats: Some(opi::VolumeStats {
                        read_bytes_count: n(c.read_bytes),
                        read_ops_count: n(c.read_ops),
                        write_bytes_count: n(c.write_bytes),
                        write_ops_count: n(c.write_ops),
                        ..Default::default()
                    }),
                }))
            },
        )
        .await
    }

    async fn create_nvme_controller(
        &self,
        req: Request<opi::CreateNvmeControllerRequest>,
    ) -> std::result::Result<Response<opi::NvmeController>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/CreateNvmeController",
            async {
                let r = req.get_ref().clone();
                let sid = subsystem_id("parent", &r.parent)?.to_string();
                if !r.nvme_controller_id.is_empty() {
                    validate::id("nvme_controller_id", &r.nvme_controller_id)?;
                }
                let c = required("nvme_controller", r.nvme_controller)?;
                let listener = controller_spec(
                    "nvme_controller.spec",
                    required("nvme_controller.spec", c.spec)?,
                )?;
                Ok(Response::new(
                    self.opi_create_controller(&req, &sid, r.nvme_controller_id, listener)
                        .await?,
                ))
            },
        )
        .await
    }

    async fn delete_nvme_controller(
        &self,
        req: Request<opi::DeleteNvmeControllerRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/DeleteNvmeController",
            async {
                let (sid, cid) = controller_ids("name", &req.get_ref().name)?;
                let deleted = StorageService::delete_listener(
                    self,
                    inner(
                        &req,
                        pb::DeleteListenerRequest {
                            name: format!("subsystems/{sid}/listeners/{cid}"),
                        },
                    ),
                )
                .await;
                gone(deleted, req.get_ref().allow_missing)
            },
        )
        .await
    }

    /// A listener cannot change: an update that changes nothing answers
    /// the controller, one that would is refused naming the field;
    /// `allow_missing` creates.
    async fn update_nvme_controller(
        &self,
        req: Request<opi::UpdateNvmeControllerRequest>,
    ) -> std::result::Result<Response<opi::NvmeController>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/UpdateNvmeController",
            async {
                let r = req.get_ref().clone();
                let c = required("nvme_controller", r.nvme_controller)?;
                let (sid, cid) = controller_ids("nvme_controller.name", &c.name)?;
                let wanted = controller_spec(
                    "nvme_controller.spec",
                    required("nvme_controller.spec", c.spec)?,
                )?;
                let current = match self.listener(sid, cid) {
                    Ok(l) => l,
                    Err(e) if e.code() == Code::NotFound && r.allow_missing => {
                        let (sid, cid) = (sid.to_string(), cid.to_string());
                        return Ok(Response::new(
                            self.opi_create_controller(&req, &sid, cid, wanted).await?,
                        ));
                    }
                    Err(e) => return Err(e),
                };
                let port = if wanted.port == 0 { 4420 } else { wanted.port };
                let same_addr = wanted.address.parse::<std::net::IpAddr>().ok()
                    == current.address.parse::<std::net::IpAddr>().ok();
                if !same_addr || port != current.port {
                    return Err(ControlError::invalid(
                        "nvme_controller.spec.fabrics_id",
                        format!(
                        "a controller's address cannot change (it is {}:{}): delete it and create \
                         another",
                        current.address, current.port
                    ),
                    )
                    .into());
                }
                Ok(Response::new(controller_to_opi(current)))
            },
        )
        .await
    }

    async fn list_nvme_controllers(
        &self,
        req: Request<opi::ListNvmeControllersRequest>,
    ) -> std::result::Result<Response<opi::ListNvmeControllersResponse>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/ListNvmeControllers",
            async {
                let r = req.get_ref();
                let sid = subsystem_id("parent", &r.parent)?.to_string();
                let page = StorageService::list_listeners(
                    self,
                    inner(
                        &req,
                        pb::ListListenersRequest {
                            parent: format!("subsystems/{sid}"),
                            page_size: r.page_size,
                            page_token: r.page_token.clone(),
                        },
                    ),
                )
                .await?
                .into_inner();
                Ok(Response::new(opi::ListNvmeControllersResponse {
                    nvme_controllers: page.listeners.into_iter().map(controller_to_opi).collect(),
                    next_page_token: page.next_page_token,
                }))
            },
        )
        .await
    }

    async fn get_nvme_controller(
        &self,
        req: Request<opi::GetNvmeControllerRequest>,
    ) -> std::result::Result<Response<opi::NvmeController>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/GetNvmeController",
            async {
                let (sid, cid) = controller_ids("name", &req.get_ref().name)?;
                Ok(Response::new(controller_to_opi(self.listener(sid, cid)?)))
            },
        )
        .await
    }

    /// The target counts I/O per subsystem and namespace, not per
    /// listener: refused, saying where the counts are.
    async fn stats_nvme_controller(
        &self,
        req: Request<opi::StatsNvmeControllerRequest>,
    ) -> std::result::Result<Response<opi::StatsNvmeControllerResponse>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/StatsNvmeController",
            async {
                let (sid, cid) = controller_ids("name", &req.get_ref().name)?;
                self.listener(sid, cid)?;
                Err(Status::unimplemented(
                "the target counts I/O per subsystem, not per listener: StatsNvmeSubsystem gives \
                 the subsystem's",
            ))
            },
        )
        .await
    }

    async fn create_nvme_namespace(
        &self,
        req: Request<opi::CreateNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<opi::NvmeNamespace>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/CreateNvmeNamespace",
            self.opi_ns_create(req),
        )
        .await
    }

    async fn delete_nvme_namespace(
        &self,
        req: Request<opi::DeleteNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/DeleteNvmeNamespace",
            self.opi_ns_delete(req),
        )
        .await
    }

    async fn update_nvme_namespace(
        &self,
        req: Request<opi::UpdateNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<opi::NvmeNamespace>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/UpdateNvmeNamespace",
            self.opi_ns_update(req),
        )
        .await
    }

    async fn list_nvme_namespaces(
        &self,
        req: Request<opi::ListNvmeNamespacesRequest>,
    ) -> std::result::Result<Response<opi::ListNvmeNamespacesResponse>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/ListNvmeNamespaces",
            self.opi_ns_list(req),
        )
        .await
    }

    async fn get_nvme_namespace(
        &self,
        req: Request<opi::GetNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<opi::NvmeNamespace>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/GetNvmeNamespace",
            self.opi_ns_get(req),
        )
        .await
    }

    /// The counters of the namespace's subsystem (see
    /// [`super::opi_namespace`]).
    async fn stats_nvme_namespace(
        &self,
        req: Request<opi::StatsNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<opi::StatsNvmeNamespaceResponse>, Status> {
        self.opi_call(
            "/opi_api.storage.v1.FrontendNvmeService/StatsNvmeNamespace",
            self.opi_ns_stats(req),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_masks_name_spec_fields_with_or_without_the_prefix() {
        let mask = |p: &[&str]| dpu_proto::pbjson_types::FieldMask {
            paths: p.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(update_paths(None).unwrap(), SPEC_FIELDS);
        assert_eq!(update_paths(Some(&mask(&["*"]))).unwrap(), SPEC_FIELDS);
        assert_eq!(
            update_paths(Some(&mask(&["model_number", "spec.hostnqn"]))).unwrap(),
            ["spec.model_number", "spec.hostnqn"]
        );
        let e = update_paths(Some(&mask(&["spec.colour"]))).unwrap_err();
        assert!(e.to_string().contains("update_mask"), "{e}");
    }

    #[test]
    fn a_spec_is_checked_with_opis_field_names() {
        let spec = |f: fn(&mut opi::NvmeSubsystemSpec)| {
            let mut s = opi::NvmeSubsystemSpec {
                nqn: "nqn.2022-09.io.spdk:opi1".into(),
                ..Default::default()
            };
            f(&mut s);
            Spec::check("nvme_subsystem.spec", s)
                .err()
                .map(|e| e.to_string())
        };
        assert_eq!(spec(|_| {}), None);
        for (f, field) in [
            (
                (|s: &mut opi::NvmeSubsystemSpec| s.nqn = "nope".into())
                    as fn(&mut opi::NvmeSubsystemSpec),
                "nvme_subsystem.spec.nqn",
            ),
            (
                |s| s.max_namespaces = -1,
                "nvme_subsystem.spec.max_namespaces",
            ),
            (
                |s| s.max_namespaces = 5000,
                "nvme_subsystem.spec.max_namespaces",
            ),
            (
                |s| s.serial_number = "x".repeat(21),
                "nvme_subsystem.spec.serial_number",
            ),
            (|s| s.hostnqn = "host".into(), "nvme_subsystem.spec.hostnqn"),
            (
                |s| s.psk = b"NVMeTLSkey-1:01:x:".to_vec(),
                "nvme_subsystem.spec.psk",
            ),
        ] {
            let e = spec(f).unwrap_or_default();
            assert!(e.contains(field), "{field}: {e}");
        }
        // A key needs its host; a good key with one passes.
        let e = spec(|s| {
            s.psk = b"NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:".to_vec()
        });
        assert!(e.unwrap_or_default().contains("spec.hostnqn"));
        assert_eq!(
            spec(|s| {
                s.hostnqn = "nqn.2014-08.org.nvmexpress:uuid:1".into();
                s.psk =
                    b"NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:".to_vec();
            }),
            None
        );
    }

    #[test]
    fn a_controller_is_a_tcp_listener_and_the_rest_is_refused_by_name() {
        let tcp =
            |traddr: &str, trsvcid: &str, adrfam: opi::NvmeAddressFamily| opi::NvmeControllerSpec {
                trtype: opi::NvmeTransportType::Tcp as i32,
                endpoint: Some(opi::nvme_controller_spec::Endpoint::FabricsId(
                    opi::FabricsEndpoint {
                        traddr: traddr.into(),
                        trsvcid: trsvcid.into(),
                        adrfam: adrfam as i32,
                    },
                )),
                ..Default::default()
            };
        let l =
            controller_spec("c", tcp("127.0.0.1", "4420", opi::NvmeAddressFamily::Ipv4)).unwrap();
        assert_eq!((l.address.as_str(), l.port), ("127.0.0.1", 4420));
        let l = controller_spec("c", tcp("::1", "", opi::NvmeAddressFamily::Unspecified)).unwrap();
        assert_eq!((l.address.as_str(), l.port), ("::1", 0));
        let refused = |s: opi::NvmeControllerSpec, field: &str| {
            let e = controller_spec("c", s).unwrap_err().to_string();
            assert!(e.starts_with(&format!("c.{field}:")), "{field}: {e}");
        };
        let ok = || tcp("10.0.0.1", "4420", opi::NvmeAddressFamily::Ipv4);
        refused(
            tcp("10.0.0.1", "4420", opi::NvmeAddressFamily::Ipv6),
            "fabrics_id.adrfam",
        );
        refused(
            tcp("host", "4420", opi::NvmeAddressFamily::Ipv4),
            "fabrics_id.traddr",
        );
        refused(
            tcp("10.0.0.1", "0", opi::NvmeAddressFamily::Ipv4),
            "fabrics_id.trsvcid",
        );
        refused(
            tcp("10.0.0.1", "x", opi::NvmeAddressFamily::Ipv4),
            "fabrics_id.trsvcid",
        );
        let mut s = ok();
        s.trtype = opi::NvmeTransportType::Rdma as i32;
        refused(s, "trtype");
        let mut s = ok();
        s.nvme_controller_id = Some(3);
        refused(s, "nvme_controller_id");
        let mut s = ok();
        s.max_nsq = 8;
        refused(s, "max_nsq");
        let mut s = ok();
        s.max_limit = Some(opi::QosLimit {
            rw_iops_kiops: 1,
            ..Default::default()
        });
        refused(s, "max_limit");
        let mut s = ok();
        s.min_limit = Some(opi::QosLimit::default());
        controller_spec("c", s).unwrap();
        let mut s = ok();
        s.endpoint = Some(opi::nvme_controller_spec::Endpoint::PcieId(
            opi::PciEndpoint::default(),
        ));
        refused(s, "pcie_id");
        let mut s = ok();
        s.endpoint = None;
        refused(s, "fabrics_id");

        let c = controller_to_opi(pb::Listener {
            name: "subsystems/s1/listeners/tcp0".into(),
            address: "::1".into(),
            port: 4420,
            ..Default::default()
        });
        assert_eq!(c.name, "nvmeSubsystems/s1/nvmeControllers/tcp0");
        match c.spec.and_then(|s| s.endpoint) {
            Some(opi::nvme_controller_spec::Endpoint::FabricsId(f)) => {
                assert_eq!((f.traddr.as_str(), f.trsvcid.as_str()), ("::1", "4420"));
                assert_eq!(f.adrfam, opi::NvmeAddressFamily::Ipv6 as i32);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_view_names_opis_collection_and_its_one_host() {
        let s = subsystem_to_opi(pb::Subsystem {
            name: "subsystems/opi-1".into(),
            nqn: "nqn.2022-09.io.spdk:opi1".into(),
            allowed_hosts: vec!["nqn.2014-08.org.nvmexpress:uuid:1".into()],
            max_namespaces: 10,
            ..Default::default()
        });
        assert_eq!(s.name, "nvmeSubsystems/opi-1");
        let spec = s.spec.unwrap();
        assert_eq!(spec.hostnqn, "nqn.2014-08.org.nvmexpress:uuid:1");
        assert_eq!(spec.max_namespaces, 10);
        assert!(generated_id().starts_with("opi-"));
        validate::id("x", &generated_id()).unwrap();
    }
}
