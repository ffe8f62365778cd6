//! Who may call what: client identities, their roles, and the table of
//! the permission each gRPC method needs.
//!
//! Authorization happens in one place, [`AuthzLayer`], a tower layer in
//! front of every service of the API listener. It reads the client's
//! identity from its TLS certificate ([`identity::names`]), finds its role
//! in the [`Policy`] built from the configuration, looks the method's path
//! up in [`METHODS`] and refuses with `PERMISSION_DENIED` what the role does
//! not allow, counting the refusal by method and client. What passes
//! carries its [`Caller`] (in an `Arc`) in the request's extensions: the
//! handlers of the tenant-scoped methods ([`Permission::TenantWrite`])
//! check the tenant the request names against it
//! ([`Caller::may_change_tenant`]), as only they have decoded the request.
//!
//! Roles:
//! - `admin`: every method.
//! - `reader`: [`Permission::Read`] methods (gets, lists, watches,
//!   counters, service info, health and reflection).
//! - `tenant-writer` of a set of tenants: what a reader may, and the rules,
//!   attachments, default policy and display name of those tenants; never
//!   creating or deleting a tenant, nor any storage change.

#[cfg(test)]
mod handler_tests;
mod identity;
mod layer;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

pub use identity::{names, IdentityError, Name, MAX_NAMES, MAX_NAME_LEN};
pub use layer::{Authz, AuthzLayer};

use crate::error::ControlError;

/// The label of callers with no certificate (plain text, or TLS without
/// client certificates), in refusal counts.
pub const ANONYMOUS: &str = "anonymous";
/// The label of callers whose certificate matches no configured client.
pub const UNKNOWN: &str = "unknown";
/// The method label of refused calls to paths no service serves.
pub const OTHER_METHOD: &str = "other";

/// What a method needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Reads state or counters; changes nothing.
    Read,
    /// Changes one tenant's rules or attachments (or its default policy and
    /// display name); the handler checks which tenant.
    TenantWrite,
    /// Anything else: tenants' creation and deletion, storage.
    Admin,
}

/// Every method of every `dpu.v1` service, with what it needs. A method
/// missing here needs [`Permission::Admin`]; a test checks that every
/// method of the proto's services is listed.
pub const METHODS: &[(&str, Permission)] = &[
    ("/dpu.v1.InfoService/GetServiceInfo", Permission::Read),
    ("/dpu.v1.TenantService/CreateTenant", Permission::Admin),
    ("/dpu.v1.TenantService/GetTenant", Permission::Read),
    ("/dpu.v1.TenantService/ListTenants", Permission::Read),
    (
        "/dpu.v1.TenantService/UpdateTenant",
        Permission::TenantWrite,
    ),
    ("/dpu.v1.TenantService/DeleteTenant", Permission::Admin),
    // A limit imposed on the tenant: not its own writer's to lift.
    (
        "/dpu.v1.TenantService/SetTenantStorageQos",
        Permission::Admin,
    ),
    ("/dpu.v1.PortService/ListPorts", Permission::Read),
    ("/dpu.v1.PortService/GetPort", Permission::Read),
    ("/dpu.v1.PortService/AttachPort", Permission::TenantWrite),
    ("/dpu.v1.PortService/DetachPort", Permission::TenantWrite),
    ("/dpu.v1.FilterService/AddRule", Permission::TenantWrite),
    ("/dpu.v1.FilterService/GetRule", Permission::Read),
    ("/dpu.v1.FilterService/DeleteRule", Permission::TenantWrite),
    ("/dpu.v1.FilterService/ListRules", Permission::Read),
    (
        "/dpu.v1.FilterService/ReplaceRules",
        Permission::TenantWrite,
    ),
    ("/dpu.v1.StorageService/CreateSubsystem", Permission::Admin),
    ("/dpu.v1.StorageService/GetSubsystem", Permission::Read),
    ("/dpu.v1.StorageService/ListSubsystems", Permission::Read),
    ("/dpu.v1.StorageService/UpdateSubsystem", Permission::Admin),
    ("/dpu.v1.StorageService/DeleteSubsystem", Permission::Admin),
    ("/dpu.v1.StorageService/AddHost", Permission::Admin),
    ("/dpu.v1.StorageService/RemoveHost", Permission::Admin),
    ("/dpu.v1.StorageService/CreateNamespace", Permission::Admin),
    ("/dpu.v1.StorageService/GetNamespace", Permission::Read),
    ("/dpu.v1.StorageService/ListNamespaces", Permission::Read),
    ("/dpu.v1.StorageService/ResizeNamespace", Permission::Admin),
    ("/dpu.v1.StorageService/DeleteNamespace", Permission::Admin),
    ("/dpu.v1.StorageService/CreateListener", Permission::Admin),
    ("/dpu.v1.StorageService/ListListeners", Permission::Read),
    ("/dpu.v1.StorageService/DeleteListener", Permission::Admin),
    ("/dpu.v1.StorageService/SetHostAuth", Permission::Admin),
    ("/dpu.v1.StorageService/ClearHostAuth", Permission::Admin),
    ("/dpu.v1.StorageService/SetHostTlsKey", Permission::Admin),
    ("/dpu.v1.StorageService/ClearHostTlsKey", Permission::Admin),
    ("/dpu.v1.StorageService/SetNamespaceQos", Permission::Admin),
    ("/dpu.v1.StorageService/SetHostQos", Permission::Admin),
    ("/dpu.v1.StorageService/CreateCluster", Permission::Admin),
    ("/dpu.v1.StorageService/GetCluster", Permission::Read),
    ("/dpu.v1.StorageService/ListClusters", Permission::Read),
    ("/dpu.v1.StorageService/UpdateCluster", Permission::Admin),
    ("/dpu.v1.StorageService/DeleteCluster", Permission::Admin),
    ("/dpu.v1.StorageService/CreateVolume", Permission::Admin),
    ("/dpu.v1.StorageService/GetVolume", Permission::Read),
    ("/dpu.v1.StorageService/ListVolumes", Permission::Read),
    ("/dpu.v1.StorageService/ResizeVolume", Permission::Admin),
    ("/dpu.v1.StorageService/DeleteVolume", Permission::Admin),
    ("/dpu.v1.TelemetryService/GetCounters", Permission::Read),
    ("/dpu.v1.TelemetryService/WatchCounters", Permission::Read),
    // OPI's NVMe front end: views of the same subsystems, so the same
    // permissions as dpu.v1's storage calls.
    (
        "/opi_api.storage.v1.FrontendNvmeService/CreateNvmeSubsystem",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/DeleteNvmeSubsystem",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/UpdateNvmeSubsystem",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/ListNvmeSubsystems",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/GetNvmeSubsystem",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/StatsNvmeSubsystem",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/CreateNvmeController",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/DeleteNvmeController",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/UpdateNvmeController",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/ListNvmeControllers",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/GetNvmeController",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/StatsNvmeController",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/CreateNvmeNamespace",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/DeleteNvmeNamespace",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/UpdateNvmeNamespace",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/ListNvmeNamespaces",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/GetNvmeNamespace",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.FrontendNvmeService/StatsNvmeNamespace",
        Permission::Read,
    ),
    // OPI's volumes: views of the same volumes, so the same permissions
    // as dpu.v1's volume calls.
    (
        "/opi_api.storage.v1.MallocVolumeService/CreateMallocVolume",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.MallocVolumeService/DeleteMallocVolume",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.MallocVolumeService/UpdateMallocVolume",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.MallocVolumeService/ListMallocVolumes",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.MallocVolumeService/GetMallocVolume",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.MallocVolumeService/StatsMallocVolume",
        Permission::Read,
    ),
    // OPI's remote NVMe controllers: the remote subsystems namespaces
    // are made from, so the permissions of dpu.v1's storage calls.
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/CreateNvmeRemoteController",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/DeleteNvmeRemoteController",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/UpdateNvmeRemoteController",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/ListNvmeRemoteControllers",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/GetNvmeRemoteController",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/ResetNvmeRemoteController",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/StatsNvmeRemoteController",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/ListNvmeRemoteNamespaces",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/GetNvmeRemoteNamespace",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/CreateNvmePath",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/DeleteNvmePath",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/UpdateNvmePath",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/ListNvmePaths",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/GetNvmePath",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.NvmeRemoteControllerService/StatsNvmePath",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.AioVolumeService/CreateAioVolume",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.AioVolumeService/DeleteAioVolume",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.AioVolumeService/UpdateAioVolume",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.AioVolumeService/ListAioVolumes",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.AioVolumeService/GetAioVolume",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.AioVolumeService/StatsAioVolume",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.NullVolumeService/CreateNullVolume",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.NullVolumeService/DeleteNullVolume",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.NullVolumeService/UpdateNullVolume",
        Permission::Admin,
    ),
    (
        "/opi_api.storage.v1.NullVolumeService/ListNullVolumes",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.NullVolumeService/GetNullVolume",
        Permission::Read,
    ),
    (
        "/opi_api.storage.v1.NullVolumeService/StatsNullVolume",
        Permission::Read,
    ),
    // OPI's EVPN gateway: logical bridges and bridge ports are views of
    // tenants and their port attachments, changed by admins as tenants
    // are; VRFs and SVIs are answered UNIMPLEMENTED, with the same
    // permissions.
    (
        "/opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService/CreateLogicalBridge",
        Permission::Admin,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService/DeleteLogicalBridge",
        Permission::Admin,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService/UpdateLogicalBridge",
        Permission::Admin,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService/ListLogicalBridges",
        Permission::Read,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService/GetLogicalBridge",
        Permission::Read,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.BridgePortService/CreateBridgePort",
        Permission::Admin,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.BridgePortService/DeleteBridgePort",
        Permission::Admin,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.BridgePortService/UpdateBridgePort",
        Permission::Admin,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.BridgePortService/ListBridgePorts",
        Permission::Read,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.BridgePortService/GetBridgePort",
        Permission::Read,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.VrfService/CreateVrf",
        Permission::Admin,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.VrfService/DeleteVrf",
        Permission::Admin,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.VrfService/UpdateVrf",
        Permission::Admin,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.VrfService/ListVrfs",
        Permission::Read,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.VrfService/GetVrf",
        Permission::Read,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.SviService/CreateSvi",
        Permission::Admin,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.SviService/DeleteSvi",
        Permission::Admin,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.SviService/UpdateSvi",
        Permission::Admin,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.SviService/ListSvis",
        Permission::Read,
    ),
    (
        "/opi_api.network.evpn_gw.v1alpha1.SviService/GetSvi",
        Permission::Read,
    ),
];

/// The OPI services the API listener serves, whose methods [`METHODS`]
/// lists too.
pub const OPI_SERVICES: &[&str] = &[
    "opi_api.storage.v1.FrontendNvmeService",
    "opi_api.storage.v1.MallocVolumeService",
    "opi_api.storage.v1.AioVolumeService",
    "opi_api.storage.v1.NullVolumeService",
    "opi_api.storage.v1.NvmeRemoteControllerService",
    "opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService",
    "opi_api.network.evpn_gw.v1alpha1.BridgePortService",
    "opi_api.network.evpn_gw.v1alpha1.VrfService",
    "opi_api.network.evpn_gw.v1alpha1.SviService",
];

/// Services every method of which only reads: health checking and
/// reflection, by path prefix.
pub const READ_SERVICES: &[&str] = &[
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
];

/// What a call to `path` needs, and the method label it is counted under
/// (`path` itself for a known method, [`OTHER_METHOD`] otherwise, so that
/// labels stay few whatever paths clients send).
pub fn permission(path: &str) -> (Permission, &'static str) {
    if let Some((m, p)) = METHODS.iter().find(|(m, _)| *m == path) {
        return (*p, m);
    }
    if let Some(service) = READ_SERVICES.iter().find(|s| path.starts_with(*s)) {
        return (Permission::Read, service);
    }
    (Permission::Admin, OTHER_METHOD)
}

/// A role a client is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Every method.
    Admin,
    /// Read methods only.
    Reader,
    /// Read methods, and changes to the named tenants' rules and
    /// attachments.
    TenantWriter(BTreeSet<String>),
}

impl Role {
    /// The role that allows what either allows.
    #[must_use]
    pub fn union(self, other: Role) -> Role {
        match (self, other) {
            (Role::Admin, _) | (_, Role::Admin) => Role::Admin,
            (Role::TenantWriter(mut a), Role::TenantWriter(b)) => {
                a.extend(b);
                Role::TenantWriter(a)
            }
            (Role::TenantWriter(a), Role::Reader) | (Role::Reader, Role::TenantWriter(a)) => {
                Role::TenantWriter(a)
            }
            (Role::Reader, Role::Reader) => Role::Reader,
        }
    }

    /// Whether the role allows methods needing `p` (for
    /// [`Permission::TenantWrite`], on some tenant).
    pub fn allows(&self, p: Permission) -> bool {
        match self {
            Role::Admin => true,
            Role::Reader => p == Permission::Read,
            Role::TenantWriter(_) => p != Permission::Admin,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Admin => f.write_str("admin"),
            Role::Reader => f.write_str("reader"),
            Role::TenantWriter(t) => {
                let t: Vec<&str> = t.iter().map(String::as_str).collect();
                write!(f, "tenant-writer of {}", t.join(", "))
            }
        }
    }
}

/// The configured clients and their roles.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    clients: BTreeMap<Name, Role>,
    /// Configuration order of the names, for picking a caller's label.
    order: Vec<Name>,
    anonymous: Option<Role>,
}

impl Policy {
    /// A policy giving `clients` their roles and callers without a
    /// certificate `anonymous` (`None`: nothing).
    ///
    /// # Errors
    /// When a name is given twice.
    pub fn new(
        clients: impl IntoIterator<Item = (Name, Role)>,
        anonymous: Option<Role>,
    ) -> Result<Policy, String> {
        let mut p = Policy {
            anonymous,
            ..Policy::default()
        };
        for (name, role) in clients {
            if p.clients.insert(name.clone(), role).is_some() {
                return Err(format!("client {name} is named twice"));
            }
            p.order.push(name);
        }
        Ok(p)
    }

    /// The caller presenting a certificate with `names`, or, with `None`,
    /// no certificate. Its role joins the roles of every configured name
    /// its certificate carries; its label is the first of those in
    /// configuration order, or [`UNKNOWN`] / [`ANONYMOUS`].
    pub fn caller(&self, names: Option<&[Name]>) -> Caller {
        let Some(names) = names else {
            return Caller {
                label: ANONYMOUS.to_string(),
                names: String::new(),
                role: self.anonymous.clone(),
            };
        };
        let mut role: Option<Role> = None;
        for n in names {
            if let Some(r) = self.clients.get(n) {
                role = Some(match role {
                    Some(have) => have.union(r.clone()),
                    None => r.clone(),
                });
            }
        }
        let label = self
            .order
            .iter()
            .find(|n| names.contains(n))
            .map_or_else(|| UNKNOWN.to_string(), ToString::to_string);
        let shown: Vec<String> = names.iter().take(4).map(ToString::to_string).collect();
        let mut shown = shown.join(", ");
        if names.len() > 4 {
            shown.push_str(", …");
        }
        Caller {
            label,
            names: shown,
            role,
        }
    }
}

/// A caller: its label, the names it showed and its role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The configured name it matched, or [`UNKNOWN`] or [`ANONYMOUS`];
    /// the refusal counters' `client` label.
    pub label: String,
    /// Its certificate's names, for messages (at most four shown).
    pub names: String,
    /// Its role; `None`: none.
    pub role: Option<Role>,
}

impl Caller {
    /// Whether the caller may call a method needing `p`.
    pub fn allows(&self, p: Permission) -> bool {
        self.role.as_ref().is_some_and(|r| r.allows(p))
    }

    /// Who the caller is, for messages: the names it showed and, when it
    /// matched a configured client, which.
    pub fn describe(&self) -> String {
        if self.names.is_empty() {
            return format!("client {}", self.label);
        }
        if self.label == UNKNOWN {
            return format!("unknown client ({})", self.names);
        }
        format!("client {} ({})", self.label, self.names)
    }

    /// The refusal of `method` to this caller.
    pub fn refusal(&self, method: &str) -> String {
        let role = match &self.role {
            Some(r) => format!("role {r}"),
            None => "no role".to_string(),
        };
        format!("{} with {role} may not call {method}", self.describe())
    }

    /// Checks that the caller may change tenant `tenant` by `method`.
    ///
    /// # Errors
    /// [`ControlError::PermissionDenied`] naming the caller, the method and
    /// the tenant.
    pub fn may_change_tenant(&self, method: &str, tenant: &str) -> Result<(), ControlError> {
        match &self.role {
            Some(Role::Admin) => Ok(()),
            Some(Role::TenantWriter(t)) if t.contains(tenant) => Ok(()),
            _ => Err(ControlError::denied(
                "tenant",
                format!("{} on tenant {tenant:?}", self.refusal(method)),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(t: &[&str]) -> Role {
        Role::TenantWriter(t.iter().map(|s| s.to_string()).collect())
    }

    /// Every method of every service in the proto is in the table, and
    /// the table names nothing else: a new RPC cannot slip through
    /// unclassified.
    #[test]
    fn every_proto_method_is_classified() {
        use prost::Message;
        let set = prost_types::FileDescriptorSet::decode(dpu_proto::FILE_DESCRIPTOR_SET)
            .expect("the proto's descriptor set decodes");
        let mut in_proto = BTreeSet::new();
        for file in &set.file {
            for s in &file.service {
                for m in &s.method {
                    in_proto.insert(format!("/{}.{}/{}", file.package(), s.name(), m.name()));
                }
            }
        }
        assert!(in_proto.len() >= 30, "{in_proto:?}");
        let mut opi = prost_types::FileDescriptorSet::decode(dpu_proto::OPI_STORAGE_DESCRIPTOR_SET)
            .expect("OPI's descriptor set decodes");
        let network = prost_types::FileDescriptorSet::decode(dpu_proto::OPI_NETWORK_DESCRIPTOR_SET)
            .expect("OPI's network descriptor set decodes");
        opi.file.extend(network.file);
        let mut served = BTreeSet::new();
        for file in &opi.file {
            for s in &file.service {
                let name = format!("{}.{}", file.package(), s.name());
                if OPI_SERVICES.contains(&name.as_str()) {
                    served.insert(name);
                    for m in &s.method {
                        in_proto.insert(format!("/{}.{}/{}", file.package(), s.name(), m.name()));
                    }
                }
            }
        }
        assert_eq!(
            served.len(),
            OPI_SERVICES.len(),
            "an OPI service listed is in no descriptor set: {served:?}"
        );
        let table: BTreeSet<String> = METHODS.iter().map(|(m, _)| m.to_string()).collect();
        assert_eq!(table.len(), METHODS.len(), "a method is listed twice");
        let missing: Vec<_> = in_proto.difference(&table).collect();
        assert!(
            missing.is_empty(),
            "methods with no permission: {missing:?}"
        );
        let extra: Vec<_> = table.difference(&in_proto).collect();
        assert!(
            extra.is_empty(),
            "listed methods the proto lacks: {extra:?}"
        );
    }

    #[test]
    fn methods_need_what_the_table_says() {
        assert_eq!(
            permission("/dpu.v1.FilterService/ReplaceRules"),
            (
                Permission::TenantWrite,
                "/dpu.v1.FilterService/ReplaceRules"
            )
        );
        assert_eq!(
            permission("/dpu.v1.TenantService/DeleteTenant").0,
            Permission::Admin
        );
        assert_eq!(
            permission("/grpc.health.v1.Health/Watch"),
            (Permission::Read, "/grpc.health.v1.Health/")
        );
        assert_eq!(
            permission("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo").0,
            Permission::Read
        );
        // Unknown paths need admin and share one label.
        assert_eq!(
            permission("/dpu.v1.TenantService/Nope"),
            (Permission::Admin, OTHER_METHOD)
        );
        assert_eq!(permission("/x/y"), (Permission::Admin, OTHER_METHOD));
        // Every storage change is admin's.
        for (m, p) in METHODS {
            if m.starts_with("/dpu.v1.StorageService/")
                && !m.contains("/Get")
                && !m.contains("/List")
            {
                assert_eq!(*p, Permission::Admin, "{m}");
            }
        }
    }

    #[test]
    fn roles_allow_what_they_should() {
        use Permission::*;
        assert!(Role::Admin.allows(Admin) && Role::Admin.allows(TenantWrite));
        assert!(Role::Reader.allows(Read));
        assert!(!Role::Reader.allows(TenantWrite) && !Role::Reader.allows(Admin));
        let w = writer(&["red"]);
        assert!(w.allows(Read) && w.allows(TenantWrite) && !w.allows(Admin));
        assert_eq!(Role::Reader.union(w.clone()), w);
        assert_eq!(w.clone().union(Role::Admin), Role::Admin);
        assert_eq!(w.union(writer(&["blue"])), writer(&["blue", "red"]));
    }

    fn policy() -> Policy {
        Policy::new(
            [
                (Name::Cn("ops".into()), Role::Admin),
                (Name::Dns("mon.example.org".into()), Role::Reader),
                (
                    Name::Uri("spiffe://example.org/red".into()),
                    writer(&["red"]),
                ),
                (Name::Cn("red-and-blue".into()), writer(&["blue"])),
            ],
            None,
        )
        .unwrap()
    }

    #[test]
    fn callers_get_the_roles_of_their_names() {
        let p = policy();
        let c = p.caller(Some(&[Name::Cn("ops".into())]));
        assert_eq!((c.label.as_str(), c.role), ("cn:ops", Some(Role::Admin)));
        // A DNS name is not a common name.
        let c = p.caller(Some(&[Name::Cn("mon.example.org".into())]));
        assert_eq!((c.label.as_str(), c.role.clone()), (UNKNOWN, None));
        assert!(!c.allows(Permission::Read));
        assert!(c
            .refusal("/m")
            .contains("unknown client (cn:mon.example.org)"));
        // Several names join their roles; the label is the first configured.
        let c = p.caller(Some(&[
            Name::Cn("red-and-blue".into()),
            Name::Uri("spiffe://example.org/red".into()),
        ]));
        assert_eq!(c.label, "uri:spiffe://example.org/red");
        assert_eq!(c.role, Some(writer(&["blue", "red"])));
        assert!(c.may_change_tenant("/m", "blue").is_ok());
        assert!(c.may_change_tenant("/m", "red").is_ok());
        let e = c
            .may_change_tenant("/dpu.v1.FilterService/AddRule", "green")
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        let msg = e.to_string();
        assert!(
            msg.contains("uri:spiffe://example.org/red")
                && msg.contains("/dpu.v1.FilterService/AddRule")
                && msg.contains("\"green\""),
            "{msg}"
        );
        // Readers and callers with no role change no tenant.
        let r = p.caller(Some(&[Name::Dns("mon.example.org".into())]));
        assert!(r.allows(Permission::Read) && !r.allows(Permission::TenantWrite));
        assert!(r.may_change_tenant("/m", "red").is_err());
        // Without a certificate: the anonymous role, here none.
        let a = p.caller(None);
        assert_eq!((a.label.as_str(), a.role), (ANONYMOUS, None));
        let open = Policy::new([], Some(Role::Admin)).unwrap();
        assert!(open.caller(None).may_change_tenant("/m", "any").is_ok());
    }

    #[test]
    fn a_name_given_twice_is_refused() {
        let e = Policy::new(
            [
                (Name::Cn("a".into()), Role::Admin),
                (Name::Cn("a".into()), Role::Reader),
            ],
            None,
        )
        .unwrap_err();
        assert!(e.contains("cn:a"), "{e}");
    }

    #[test]
    fn configured_names_parse() {
        assert_eq!(Name::parse("cn:ops"), Ok(Name::Cn("ops".into())));
        assert_eq!(Name::parse("dns:a.b"), Ok(Name::Dns("a.b".into())));
        assert_eq!(
            Name::parse("spiffe://td/ns/x"),
            Ok(Name::Uri("spiffe://td/ns/x".into()))
        );
        assert_eq!(
            Name::parse("uri:https://x/y"),
            Ok(Name::Uri("https://x/y".into()))
        );
        for bad in [
            "ops",
            "cn:",
            "spiffe:///path",
            "uri:spiffe://",
            "cn:a\u{1b}[2J",
        ] {
            assert!(Name::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Name::parse(&format!("cn:{}", "a".repeat(MAX_NAME_LEN + 1))).is_err());
        assert_eq!(
            Name::Uri("spiffe://td/x".into()).to_string(),
            "uri:spiffe://td/x"
        );
    }

    #[test]
    fn certificate_names_are_read() {
        let n = names(include_bytes!("testdata/spiffe.der")).unwrap();
        assert_eq!(
            n,
            vec![
                Name::Cn("ops".into()),
                Name::Dns("ops.example.org".into()),
                Name::Uri("spiffe://example.org/ns/ops/sa/admin".into()),
            ]
        );
        let n = names(include_bytes!("testdata/cn-only.der")).unwrap();
        assert_eq!(n, vec![Name::Cn("monitoring".into())]);
    }

    #[test]
    fn malformed_certificates_are_errors() {
        assert!(matches!(names(b""), Err(IdentityError::Certificate(_))));
        let good = include_bytes!("testdata/spiffe.der");
        for cut in [1, good.len() / 2, good.len() - 1] {
            assert!(names(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut flipped = good.to_vec();
        for b in flipped.iter_mut().skip(20).take(8) {
            *b ^= 0xff;
        }
        // Never a panic; either an error or some names.
        let _ = names(&flipped);
    }
}
