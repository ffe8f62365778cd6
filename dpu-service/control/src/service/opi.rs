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
//! Controller reports. Controllers and namespaces are not mapped yet:
//! their calls answer `UNIMPLEMENTED` naming the `dpu.v1` calls that do
//! the same.

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
fn inner<T, U>(outer: &Request<T>, message: U) -> Request<U> {
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
fn generated_id() -> String {
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
fn to_opi(s: pb::Subsystem) -> opi::NvmeSubsystem {
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

/// What the calls not mapped yet answer.
fn not_mapped(what: &str, instead: &str) -> Status {
    Status::unimplemented(format!(
        "OPI {what} are not mapped onto this service yet; dpu.v1.StorageService {instead} \
         does the same"
    ))
}

impl Api {
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
            return Ok(to_opi(created));
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
            Ok(s) => Ok(to_opi(s.into_inner())),
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

/// The update-mask paths of a request, `*` (or none) meaning every field.
fn update_paths(mask: Option<&dpu_proto::pbjson_types::FieldMask>) -> Result<Vec<&'static str>> {
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
    }

    async fn delete_nvme_subsystem(
        &self,
        req: Request<opi::DeleteNvmeSubsystemRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
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
        match deleted {
            Ok(_) => Ok(Response::new(Empty {})),
            Err(e) if e.code() == Code::NotFound && req.get_ref().allow_missing => {
                Ok(Response::new(Empty {}))
            }
            Err(e) => Err(e),
        }
    }

    async fn update_nvme_subsystem(
        &self,
        req: Request<opi::UpdateNvmeSubsystemRequest>,
    ) -> std::result::Result<Response<opi::NvmeSubsystem>, Status> {
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
        let now = to_opi(current.clone()).spec.unwrap_or_default();
        // What our subsystems cannot change: refused unless unchanged.
        for (path, same) in [
            ("spec.nqn", spec.nqn == now.nqn),
            (
                "spec.serial_number",
                spec.serial_number.is_empty() || spec.serial_number == now.serial_number,
            ),
            (
                "spec.max_namespaces",
                spec.max_namespaces == 0 || i64::from(spec.max_namespaces) == now.max_namespaces,
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
                        update_mask: Some(dpu_proto::pbjson_types::FieldMask { paths: mask }),
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
        Ok(Response::new(to_opi(out)))
    }

    async fn list_nvme_subsystems(
        &self,
        req: Request<opi::ListNvmeSubsystemsRequest>,
    ) -> std::result::Result<Response<opi::ListNvmeSubsystemsResponse>, Status> {
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
            nvme_subsystems: page.subsystems.into_iter().map(to_opi).collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn get_nvme_subsystem(
        &self,
        req: Request<opi::GetNvmeSubsystemRequest>,
    ) -> std::result::Result<Response<opi::NvmeSubsystem>, Status> {
        let id = subsystem_id("name", &req.get_ref().name)?.to_string();
        Ok(Response::new(to_opi(self.opi_get(&req, &id).await?)))
    }

    /// The subsystem's I/O counters (all its namespaces and hosts) in
    /// OPI's 32-bit fields, saturating. Deallocations and latencies are
    /// not counted by the target: those fields stay 0.
    async fn stats_nvme_subsystem(
        &self,
        req: Request<opi::StatsNvmeSubsystemRequest>,
    ) -> std::result::Result<Response<opi::StatsNvmeSubsystemResponse>, Status> {
        let id = subsystem_id("name", &req.get_ref().name)?.to_string();
        self.opi_get(&req, &id).await?;
        let name = format!("subsystems/{id}");
        let c = self
            .ctl
            .telemetry
            .snapshot(&self.ctl.state.snapshot(), &self.ctl.ports, None)
            .subsystems
            .into_iter()
            .find(|c| c.subsystem == name)
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
    }

    async fn create_nvme_controller(
        &self,
        _: Request<opi::CreateNvmeControllerRequest>,
    ) -> std::result::Result<Response<opi::NvmeController>, Status> {
        Err(not_mapped("controllers", "CreateListener"))
    }

    async fn delete_nvme_controller(
        &self,
        _: Request<opi::DeleteNvmeControllerRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        Err(not_mapped("controllers", "DeleteListener"))
    }

    async fn update_nvme_controller(
        &self,
        _: Request<opi::UpdateNvmeControllerRequest>,
    ) -> std::result::Result<Response<opi::NvmeController>, Status> {
        Err(not_mapped(
            "controllers",
            "CreateListener and DeleteListener",
        ))
    }

    async fn list_nvme_controllers(
        &self,
        _: Request<opi::ListNvmeControllersRequest>,
    ) -> std::result::Result<Response<opi::ListNvmeControllersResponse>, Status> {
        Err(not_mapped("controllers", "ListListeners"))
    }

    async fn get_nvme_controller(
        &self,
        _: Request<opi::GetNvmeControllerRequest>,
    ) -> std::result::Result<Response<opi::NvmeController>, Status> {
        Err(not_mapped("controllers", "ListListeners"))
    }

    async fn stats_nvme_controller(
        &self,
        _: Request<opi::StatsNvmeControllerRequest>,
    ) -> std::result::Result<Response<opi::StatsNvmeControllerResponse>, Status> {
        Err(not_mapped("controllers", "TelemetryService.GetCounters"))
    }

    async fn create_nvme_namespace(
        &self,
        _: Request<opi::CreateNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<opi::NvmeNamespace>, Status> {
        Err(not_mapped("namespaces", "CreateNamespace"))
    }

    async fn delete_nvme_namespace(
        &self,
        _: Request<opi::DeleteNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        Err(not_mapped("namespaces", "DeleteNamespace"))
    }

    async fn update_nvme_namespace(
        &self,
        _: Request<opi::UpdateNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<opi::NvmeNamespace>, Status> {
        Err(not_mapped(
            "namespaces",
            "ResizeNamespace and SetNamespaceQos",
        ))
    }

    async fn list_nvme_namespaces(
        &self,
        _: Request<opi::ListNvmeNamespacesRequest>,
    ) -> std::result::Result<Response<opi::ListNvmeNamespacesResponse>, Status> {
        Err(not_mapped("namespaces", "ListNamespaces"))
    }

    async fn get_nvme_namespace(
        &self,
        _: Request<opi::GetNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<opi::NvmeNamespace>, Status> {
        Err(not_mapped("namespaces", "GetNamespace"))
    }

    async fn stats_nvme_namespace(
        &self,
        _: Request<opi::StatsNvmeNamespaceRequest>,
    ) -> std::result::Result<Response<opi::StatsNvmeNamespaceResponse>, Status> {
        Err(not_mapped("namespaces", "TelemetryService.GetCounters"))
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
    fn the_view_names_opis_collection_and_its_one_host() {
        let s = to_opi(pb::Subsystem {
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
