//! OPI's EVPN gateway layer-2 services
//! (`opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService` and
//! `BridgePortService`) over the tenants of `dpu.v1`: a logical bridge
//! is a tenant's layer-2 network and a bridge port is a port attached to
//! it, so what either API makes the other shows and changes, and it is
//! stored once. Each call checks the OPI request (errors name OPI's
//! fields) and makes its change to the state in one step, which, as a
//! `dpu.v1` tenant call does, returns once the switch has taken it; a
//! change the switch refuses is undone.
//!
//! Mapping:
//! - `logicalBridges/{id}` is the tenant `tenants/{id}` whose VLAN ID
//!   (`dpu.v1` `Tenant.vlan_id`) is not 0: `spec.vlan_id` is that VLAN ID
//!   (required, 1 to 4094, one tenant's each). A bridge is made as a
//!   tenant whose default policy allows (a bridge forwards; `dpu.v1`'s
//!   filter rules may filter it later). With `spec.vni`, the tenant also
//!   gets the VXLAN attachment of that VNI on the port whose configured
//!   `vtep_address` is `spec.vtep_ip_prefix`'s address; the VTEPs of the
//!   prefix's network may send into it. Without `spec.vtep_ip_prefix`,
//!   the one port with a VTEP address is taken. The view's
//!   `vtep_ip_prefix` is that port's VTEP address with the length of the
//!   attachment's underlay prefix (32 without one). Deleting a bridge
//!   deletes its tenant, with its VXLAN attachment and its filter rules;
//!   it is refused while a port is attached to it (a bridge port).
//! - `bridgePorts/{id}` is the configured port `ports/{id}` (not an
//!   uplink) as the bridges' tenants hold it. An `ACCESS` bridge port of
//!   one bridge is the whole port attached to its tenant; a `TRUNK`
//!   bridge port is the port's VLAN of each bridge (the bridge's VLAN ID)
//!   attached to that bridge's tenant. Each attachment lets through only
//!   frames from `spec.mac_address` (its source guard); the view takes
//!   the MAC address from there. A port attachment a bridge's tenant
//!   holds, however it was made, shows as a bridge port.
//!
//! Logical bridges and bridge ports have no state of their own: each
//! answer is derived from the tenants, and their status is
//! `oper_status` UP. An update changes nothing a bridge's tenant holds:
//! a masked field whose value differs from the stored one is refused
//! naming it (zero and empty values count as unchanged); a bridge
//! port's update replaces its MAC address, type and bridges in one
//! change. `VrfService` and `SviService` are answered `UNIMPLEMENTED`:
//! the switch does not route.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use dpu_proto::opi::network::evpn_gw::v1alpha1 as evpn;
use dpu_proto::opi::network::opinetcommon::v1alpha1 as net;
use dpu_proto::pbjson_types::{Empty, FieldMask};
use evpn::bridge_port_service_server::BridgePortService;
use evpn::logical_bridge_service_server::LogicalBridgeService;
use evpn::svi_service_server::SviService;
use evpn::vrf_service_server::VrfService;
use tonic::{Request, Response, Status};

use super::opi::{generated_id, gone};
use super::{paginate, required, Api, PAGES};
use crate::error::{ControlError, Result};
use crate::model::{
    Action, Attachment, IpPrefix, MacAddr, PortRole, RuleSet, SourceGuard, State, Tenant, Timestamp,
};
use crate::state::{Part, PortRegistry};
use crate::validate;

/// OPI's collection of logical bridges, as its resource names spell it.
pub const BRIDGES: &str = "logicalBridges";

/// OPI's collection of bridge ports, as its resource names spell it.
pub const BRIDGE_PORTS: &str = "bridgePorts";

/// Fields of a `LogicalBridge` an update mask may name (`name`
/// identifies the bridge and never differs).
const BRIDGE_FIELDS: &[&str] = &["name", "spec.vlan_id", "spec.vni", "spec.vtep_ip_prefix"];

/// Fields of a `BridgePort` an update mask may name.
const PORT_FIELDS: &[&str] = &[
    "name",
    "spec.mac_address",
    "spec.ptype",
    "spec.logical_bridges",
];

/// Why VRFs and SVIs are not served.
const NO_ROUTING: &str = "routing is not offered: the switch forwards within a tenant's \
    layer-2 network (a logical bridge) only; use dpu.v1's TenantService and FilterService \
    for what crosses it";

/// The fields of `all` a mask names: those of the mask, or all for `*`
/// or no mask; a path may leave out `spec.`; one that is no field of
/// `message` is refused.
fn mask_fields(
    all: &'static [&'static str],
    message: &str,
    mask: Option<&FieldMask>,
) -> Result<Vec<&'static str>> {
    let paths = mask.map(|m| m.paths.as_slice()).unwrap_or_default();
    if paths.is_empty() || paths.iter().any(|p| p == "*") {
        return Ok(all.to_vec());
    }
    paths
        .iter()
        .map(|p| {
            all.iter()
                .copied()
                .find(|f| f == p || f.strip_prefix("spec.") == Some(p.as_str()))
                .ok_or_else(|| {
                    ControlError::invalid(
                        "update_mask",
                        format!(
                            "{p:?} is not a field of {message}; fields: {}",
                            all.join(", ")
                        ),
                    )
                })
        })
        .collect()
}

/// A logical bridge's spec, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeSpec {
    /// The tenant's VLAN ID, 1..=4094.
    pub vlan_id: u16,
    /// The VXLAN network, if any: its VNI and the VTEP address with its
    /// prefix length, when given.
    pub vxlan: Option<(u32, Option<(Ipv4Addr, u8)>)>,
}

/// An IPv4 address and prefix length from OPI's `IPPrefix`; `field`
/// names it.
pub fn ipv4_prefix(field: &str, p: &net::IpPrefix) -> Result<(Ipv4Addr, u8)> {
    let addr = p
        .addr
        .as_ref()
        .ok_or_else(|| ControlError::invalid(format!("{field}.addr"), "is required"))?;
    let v4 = match (net::IpAf::try_from(addr.af), &addr.v4_or_v6) {
        (
            Ok(net::IpAf::Inet | net::IpAf::Unspecified),
            Some(net::ip_address::V4OrV6::V4Addr(a)),
        ) => Ipv4Addr::from(*a),
        _ => {
            return Err(ControlError::invalid(
                format!("{field}.addr"),
                "a VTEP address is an IPv4 address (af IP_AF_INET, v4_addr)",
            ))
        }
    };
    let len = u8::try_from(p.len)
        .ok()
        .filter(|l| (1..=32).contains(l))
        .ok_or_else(|| {
            ControlError::invalid(
                format!("{field}.len"),
                format!("{} is not in 1..=32", p.len),
            )
        })?;
    Ok((v4, len))
}

/// OPI's `IPPrefix` of an IPv4 address and prefix length.
pub fn ipv4_prefix_to_opi(addr: Ipv4Addr, len: u8) -> net::IpPrefix {
    net::IpPrefix {
        addr: Some(net::IpAddress {
            af: net::IpAf::Inet as i32,
            v4_or_v6: Some(net::ip_address::V4OrV6::V4Addr(u32::from(addr))),
        }),
        len: i32::from(len),
    }
}

/// The network of `addr/len`: its host bits cleared.
fn network(addr: Ipv4Addr, len: u8) -> Result<IpPrefix> {
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    IpPrefix::new(Ipv4Addr::from(u32::from(addr) & mask).into(), len)
        .map_err(|e| ControlError::invalid("logical_bridge.spec.vtep_ip_prefix", e.to_string()))
}

/// A logical bridge's spec, checked; errors name the fields of
/// `logical_bridge.spec`.
pub fn bridge_spec(s: &evpn::LogicalBridgeSpec) -> Result<BridgeSpec> {
    let vlan_id = match validate::vlan("logical_bridge.spec.vlan_id", s.vlan_id)? {
        0 => {
            return Err(ControlError::invalid(
                "logical_bridge.spec.vlan_id",
                "required: the bridge's VLAN ID, 1 to 4094",
            ))
        }
        v => v,
    };
    let vtep = s
        .vtep_ip_prefix
        .as_ref()
        .map(|p| ipv4_prefix("logical_bridge.spec.vtep_ip_prefix", p))
        .transpose()?;
    let vxlan = match (s.vni, vtep) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(ControlError::invalid(
                "logical_bridge.spec.vtep_ip_prefix",
                "a VTEP is a VXLAN network's: set spec.vni too",
            ))
        }
        (Some(vni), vtep) => {
            if !(1..=0x00FF_FFFF).contains(&vni) {
                return Err(ControlError::invalid(
                    "logical_bridge.spec.vni",
                    format!("{vni} is not in 1..=16777215"),
                ));
            }
            Some((vni, vtep))
        }
    };
    Ok(BridgeSpec { vlan_id, vxlan })
}

/// The VXLAN attachment of VNI `vni` for `vtep` (the VTEP address and
/// its prefix length, or the one port with a VTEP address when `None`):
/// on the port whose VTEP address it is, open to the VTEPs of its
/// network.
pub fn vxlan_attachment(
    ports: &PortRegistry,
    vni: u32,
    vtep: Option<(Ipv4Addr, u8)>,
) -> Result<Attachment> {
    let (uplink, underlay_prefixes) = match vtep {
        Some((addr, len)) => {
            let port = ports
                .values()
                .find(|p| p.vtep_address == Some(addr))
                .ok_or_else(|| {
                    ControlError::FailedPrecondition(format!(
                        "logical_bridge.spec.vtep_ip_prefix: no port has the VTEP address {addr} \
                         (vtep_address in the port's configuration)"
                    ))
                })?;
            (port.id.clone(), vec![network(addr, len)?])
        }
        None => {
            let mut with = ports.values().filter(|p| p.vtep_address.is_some());
            match (with.next(), with.next()) {
                (Some(p), None) => (p.id.clone(), Vec::new()),
                (None, _) => {
                    return Err(ControlError::FailedPrecondition(
                        "logical_bridge.spec.vni: no port has a VTEP address \
                         (vtep_address in the port's configuration)"
                            .into(),
                    ))
                }
                (Some(_), Some(_)) => {
                    return Err(ControlError::FailedPrecondition(
                        "logical_bridge.spec.vtep_ip_prefix: required, as more than one port \
                         has a VTEP address"
                            .into(),
                    ))
                }
            }
        }
    };
    Ok(Attachment::Vxlan {
        uplink,
        vni,
        remote_vteps: Vec::new(),
        underlay_prefixes,
    })
}

/// The tenant a logical bridge `id` of `spec` is made as.
pub fn bridge_tenant(ports: &PortRegistry, id: &str, spec: &BridgeSpec) -> Result<Tenant> {
    let attachments = match spec.vxlan {
        Some((vni, vtep)) => vec![vxlan_attachment(ports, vni, vtep)?],
        None => Vec::new(),
    };
    Ok(Tenant {
        id: id.to_string(),
        display_name: String::new(),
        attachments,
        default_policy: Action::Allow,
        create_time: Timestamp::now(),
        rules: RuleSet::default(),
        storage_qos: Default::default(),
        vlan_id: spec.vlan_id,
        no_offload: false,
    })
}

/// The OPI view of tenant `t` as a logical bridge (whether it is one,
/// its VLAN ID not 0, is the caller's check).
pub fn bridge_to_opi(ports: &PortRegistry, t: &Tenant) -> evpn::LogicalBridge {
    let vxlan = t.attachments.iter().find_map(|a| match a {
        Attachment::Vxlan {
            uplink,
            vni,
            underlay_prefixes,
            ..
        } => Some((uplink, *vni, underlay_prefixes.first())),
        Attachment::Port { .. } => None,
    });
    let vtep_ip_prefix = vxlan.and_then(|(uplink, _, underlay)| {
        let addr = ports.get(uplink)?.vtep_address?;
        Some(ipv4_prefix_to_opi(addr, underlay.map_or(32, IpPrefix::len)))
    });
    evpn::LogicalBridge {
        name: format!("{BRIDGES}/{}", t.id),
        spec: Some(evpn::LogicalBridgeSpec {
            vlan_id: u32::from(t.vlan_id),
            vni: vxlan.map(|(_, vni, _)| vni),
            vtep_ip_prefix,
        }),
        status: Some(evpn::LogicalBridgeStatus {
            oper_status: evpn::LbOperStatus::Up as i32,
            components: Vec::new(),
        }),
    }
}

/// Checks an update of the bridge `now` (as OPI shows it) to `wanted`
/// over `paths`: a named field whose value differs is refused naming
/// it; zero and empty values count as unchanged.
pub fn check_bridge_update(
    paths: &[&str],
    wanted: &evpn::LogicalBridgeSpec,
    now: &evpn::LogicalBridgeSpec,
) -> Result<()> {
    let fixed = |field: &str, current: String| {
        ControlError::invalid(
            format!("logical_bridge.{field}"),
            format!("cannot be changed (it is {current}); delete the bridge and create another"),
        )
    };
    for path in paths {
        match *path {
            "spec.vlan_id" if wanted.vlan_id != 0 && wanted.vlan_id != now.vlan_id => {
                return Err(fixed(path, now.vlan_id.to_string()));
            }
            "spec.vni" if wanted.vni.is_some() && wanted.vni != now.vni => {
                return Err(fixed(
                    path,
                    now.vni.map_or_else(|| "unset".into(), |v| v.to_string()),
                ));
            }
            "spec.vtep_ip_prefix"
                if wanted.vtep_ip_prefix.is_some()
                    && wanted.vtep_ip_prefix != now.vtep_ip_prefix =>
            {
                let current = match &now.vtep_ip_prefix {
                    Some(p) => match ipv4_prefix(path, p) {
                        Ok((a, l)) => format!("{a}/{l}"),
                        Err(_) => "unset".into(),
                    },
                    None => "unset".into(),
                };
                return Err(fixed(path, current));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A bridge port's type, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortType {
    /// The whole port, on one bridge.
    Access,
    /// The VLAN of each bridge on the port.
    Trunk,
}

/// A bridge port's spec, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgePortSpec {
    /// The one source MAC address the port's attachments let through.
    pub mac: MacAddr,
    /// Access or trunk.
    pub ptype: PortType,
    /// The bridges' IDs (the tenants'), in the order given.
    pub bridges: Vec<String>,
}

/// A bridge port's spec, checked; errors name the fields of
/// `bridge_port.spec`.
pub fn bridge_port_spec(s: &evpn::BridgePortSpec) -> Result<BridgePortSpec> {
    const MAC: &str = "bridge_port.spec.mac_address";
    let bytes: [u8; 6] = s.mac_address.as_slice().try_into().map_err(|_| {
        ControlError::invalid(
            MAC,
            format!(
                "required: the port's station's MAC address, 6 bytes (got {})",
                s.mac_address.len()
            ),
        )
    })?;
    let mac: MacAddr = MacAddr(bytes)
        .to_string()
        .parse()
        .map_err(|e: String| ControlError::invalid(MAC, e))?;
    let ptype = match evpn::BridgePortType::try_from(s.ptype) {
        Ok(evpn::BridgePortType::Access) => PortType::Access,
        Ok(evpn::BridgePortType::Trunk) => PortType::Trunk,
        _ => {
            return Err(ControlError::invalid(
                "bridge_port.spec.ptype",
                format!(
                    "{} is not a bridge port type: BRIDGE_PORT_TYPE_ACCESS or \
                     BRIDGE_PORT_TYPE_TRUNK",
                    s.ptype
                ),
            ))
        }
    };
    const BRIDGES_FIELD: &str = "bridge_port.spec.logical_bridges";
    match (ptype, s.logical_bridges.len()) {
        (PortType::Access, 1) | (PortType::Trunk, 1..) => {}
        (PortType::Access, n) => {
            return Err(ControlError::invalid(
                BRIDGES_FIELD,
                format!("an access port is on exactly one logical bridge, not {n}"),
            ))
        }
        (PortType::Trunk, _) => {
            return Err(ControlError::invalid(
                BRIDGES_FIELD,
                "a trunk port is on at least one logical bridge",
            ))
        }
    }
    let mut bridges: Vec<String> = Vec::with_capacity(s.logical_bridges.len());
    for (i, name) in s.logical_bridges.iter().enumerate() {
        let field = format!("{BRIDGES_FIELD}[{i}]");
        let id = validate::name(&field, name, BRIDGES)?;
        if let Some(j) = bridges.iter().position(|b| b == id) {
            return Err(ControlError::invalid(
                field,
                format!("{name} is also logical_bridges[{j}]"),
            ));
        }
        bridges.push(id.to_string());
    }
    Ok(BridgePortSpec {
        mac,
        ptype,
        bridges,
    })
}

/// Checks that port `id` may be a bridge port: configured, not an
/// uplink. `field` names the port in the request.
fn check_bridge_port(ports: &PortRegistry, field: &str, id: &str) -> Result<()> {
    match ports.get(id) {
        None => Err(ControlError::FailedPrecondition(format!(
            "{field}: {id:?} is not a configured port"
        ))),
        Some(p) if p.role == PortRole::Uplink => Err(ControlError::FailedPrecondition(format!(
            "{field}: ports/{id} is an uplink; a bridge port is a host-facing port"
        ))),
        Some(_) => Ok(()),
    }
}

/// One port attachment a bridge's tenant holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    /// The tenant's (the bridge's) ID.
    tenant: String,
    /// The VLAN, 0 for the whole port.
    vlan: u16,
    /// Its source guard.
    guard: SourceGuard,
}

/// The port attachments of the bridges' tenants, by port.
fn held_by_bridges(state: &State) -> BTreeMap<&str, Vec<Held>> {
    let mut out: BTreeMap<&str, Vec<Held>> = BTreeMap::new();
    for t in state.tenants.values().filter(|t| t.vlan_id != 0) {
        for a in &t.attachments {
            if let Attachment::Port { port, vlan, guard } = a {
                out.entry(port.as_str()).or_default().push(Held {
                    tenant: t.id.clone(),
                    vlan: *vlan,
                    guard: guard.clone(),
                });
            }
        }
    }
    out
}

/// The port attachments of port `port` the bridges' tenants hold.
fn held_on(state: &State, port: &str) -> Vec<Held> {
    let mut out = Vec::new();
    for t in state.tenants.values().filter(|t| t.vlan_id != 0) {
        for a in &t.attachments {
            if let Attachment::Port {
                port: p,
                vlan,
                guard,
            } = a
            {
                if p == port {
                    out.push(Held {
                        tenant: t.id.clone(),
                        vlan: *vlan,
                        guard: guard.clone(),
                    });
                }
            }
        }
    }
    out
}

/// The OPI view of port `port` as a bridge port, from the attachments
/// `held` on it: a whole-port one is an access port, VLAN ones a trunk.
fn bridge_port_to_opi(port: &str, held: &[Held]) -> evpn::BridgePort {
    let ptype = if held.iter().any(|h| h.vlan == 0) {
        evpn::BridgePortType::Access
    } else {
        evpn::BridgePortType::Trunk
    };
    let mac = held
        .iter()
        .find_map(|h| h.guard.macs.first())
        .map(|m| m.0.to_vec())
        .unwrap_or_default();
    evpn::BridgePort {
        name: format!("{BRIDGE_PORTS}/{port}"),
        spec: Some(evpn::BridgePortSpec {
            mac_address: mac,
            ptype: ptype as i32,
            logical_bridges: held
                .iter()
                .map(|h| format!("{BRIDGES}/{}", h.tenant))
                .collect(),
        }),
        status: Some(evpn::BridgePortStatus {
            oper_status: evpn::BpOperStatus::Up as i32,
            components: Vec::new(),
        }),
    }
}

/// Attaches port `port` as the bridge port `spec` describes, in `s`:
/// each bridge's tenant gets the port (access) or the port's VLAN of the
/// bridge (trunk), guarded by the MAC address. Answers the tenants
/// changed.
fn attach_bridge_port(
    s: &mut State,
    limits: crate::state::Limits,
    ports: &PortRegistry,
    port: &str,
    spec: &BridgePortSpec,
) -> Result<Vec<String>> {
    for (i, b) in spec.bridges.iter().enumerate() {
        let vlan = match s.tenants.get(b) {
            Some(t) if t.vlan_id != 0 => t.vlan_id,
            _ => {
                return Err(ControlError::NotFound(format!(
                    "bridge_port.spec.logical_bridges[{i}]: {BRIDGES}/{b}"
                )))
            }
        };
        let att = Attachment::Port {
            port: port.to_string(),
            vlan: match spec.ptype {
                PortType::Access => 0,
                PortType::Trunk => vlan,
            },
            guard: SourceGuard {
                macs: vec![spec.mac],
                prefixes: Vec::new(),
            },
        };
        s.attach(limits, ports, b, att)?;
    }
    Ok(spec.bridges.clone())
}

/// Removes every port attachment of port `port` the bridges' tenants
/// hold, in `s`; refuses one another tenant holds. Answers the tenants
/// changed (none: the port is no bridge port).
fn detach_bridge_port(s: &mut State, port: &str) -> Result<Vec<String>> {
    if let Some(t) = other_holder(s, port) {
        return Err(ControlError::FailedPrecondition(format!(
            "ports/{port} is attached to tenants/{t}, which is no logical bridge; \
             detach it through dpu.v1's PortService"
        )));
    }
    let held = held_on(s, port);
    let mut tenants = Vec::new();
    for h in held {
        s.detach(port, h.vlan)?;
        if !tenants.contains(&h.tenant) {
            tenants.push(h.tenant);
        }
    }
    Ok(tenants)
}

/// A tenant that is no bridge and holds an attachment of port `port`.
fn other_holder(s: &State, port: &str) -> Option<String> {
    s.tenants
        .values()
        .filter(|t| t.vlan_id == 0)
        .find(|t| t.attachments.iter().any(|a| a.port() == port))
        .map(|t| t.id.clone())
}

/// The refusal of a name of a missing bridge.
fn no_bridge(id: &str) -> ControlError {
    ControlError::NotFound(format!("{BRIDGES}/{id}"))
}

/// The refusal of a name of a port that is no bridge port.
fn no_bridge_port(id: &str) -> ControlError {
    ControlError::NotFound(format!("{BRIDGE_PORTS}/{id}"))
}

/// The state's refusal `e` of a bridge's tenant, naming OPI's fields.
fn bridge_fields(id: &str, e: ControlError) -> ControlError {
    match e {
        ControlError::AlreadyExists(m) => match m.strip_prefix("tenant.vlan_id:") {
            Some(rest) => {
                ControlError::AlreadyExists(format!("logical_bridge.spec.vlan_id:{rest}"))
            }
            None if m.starts_with(&format!("tenants/{id} ")) => ControlError::AlreadyExists(
                format!("{BRIDGES}/{id}: {m} (a logical bridge is a tenant)"),
            ),
            None => ControlError::AlreadyExists(m),
        },
        e => e,
    }
}

impl Api {
    /// Creates logical bridge `id` of `spec`.
    async fn bridge_create(
        &self,
        id: String,
        spec: &evpn::LogicalBridgeSpec,
    ) -> std::result::Result<evpn::LogicalBridge, Status> {
        let spec = bridge_spec(spec)?;
        let tenant = bridge_tenant(&self.ctl.ports, &id, &spec)?;
        let ctl = self.ctl.clone();
        let out = bridge_to_opi(&self.ctl.ports, &tenant);
        self.change_tenant(move |s| {
            let id = tenant.id.clone();
            s.create_tenant(ctl.limits, &ctl.ports, tenant)
                .map_err(|e| bridge_fields(&id, e))
                .map(|()| ((), id))
        })
        .await?;
        Ok(out)
    }

    /// Logical bridge `id` as OPI shows it.
    fn bridge_get(&self, id: &str) -> Result<evpn::LogicalBridge> {
        let state = self.ctl.state.snapshot();
        match state.tenants.get(id) {
            Some(t) if t.vlan_id != 0 => Ok(bridge_to_opi(&self.ctl.ports, t)),
            _ => Err(no_bridge(id)),
        }
    }

    /// Bridge port `id` as OPI shows it.
    fn bridge_port_get(&self, id: &str) -> Result<evpn::BridgePort> {
        let held = held_on(&self.ctl.state.snapshot(), id);
        if held.is_empty() || !self.ctl.ports.contains_key(id) {
            return Err(no_bridge_port(id));
        }
        Ok(bridge_port_to_opi(id, &held))
    }

    /// Makes port `id` the bridge port `spec` describes, in one change.
    async fn bridge_port_create(
        &self,
        id: String,
        spec: BridgePortSpec,
    ) -> std::result::Result<evpn::BridgePort, Status> {
        check_bridge_port(&self.ctl.ports, "bridge_port_id", &id)?;
        let ctl = self.ctl.clone();
        let port = id;
        let made = self
            .change_served(self.ctl.switch_applied.as_ref(), move |s| {
                if !held_on(s, &port).is_empty() {
                    return Err(ControlError::AlreadyExists(format!(
                        "{BRIDGE_PORTS}/{port} already exists"
                    )));
                }
                if let Some(t) = other_holder(s, &port) {
                    return Err(ControlError::FailedPrecondition(format!(
                        "bridge_port_id: ports/{port} is attached to tenants/{t}, which is no \
                         logical bridge"
                    )));
                }
                let tenants = attach_bridge_port(s, ctl.limits, &ctl.ports, &port, &spec)?;
                let view = bridge_port_to_opi(&port, &held_on(s, &port));
                Ok((view, Some(Part::Tenants(tenants))))
            })
            .await?;
        Ok(made)
    }
}

/// Runs an OPI call of `api` by `method`, counting it, on a result of
/// the control plane's.
async fn call<T>(
    api: &Api,
    method: &'static str,
    f: impl std::future::Future<Output = std::result::Result<T, Status>>,
) -> std::result::Result<Response<T>, Status> {
    api.opi_call(method, async { f.await.map(Response::new) })
        .await
}

#[tonic::async_trait]
impl LogicalBridgeService for Api {
    async fn create_logical_bridge(
        &self,
        req: Request<evpn::CreateLogicalBridgeRequest>,
    ) -> std::result::Result<Response<evpn::LogicalBridge>, Status> {
        call(
            self,
            "/opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService/CreateLogicalBridge",
            async {
                let r = req.into_inner();
                let id = if r.logical_bridge_id.is_empty() {
                    generated_id()
                } else {
                    validate::id("logical_bridge_id", &r.logical_bridge_id)?;
                    r.logical_bridge_id
                };
                let b = required("logical_bridge", r.logical_bridge)?;
                let spec = required("logical_bridge.spec", b.spec)?;
                self.bridge_create(id, &spec).await
            },
        )
        .await
    }

    async fn list_logical_bridges(
        &self,
        req: Request<evpn::ListLogicalBridgesRequest>,
    ) -> std::result::Result<Response<evpn::ListLogicalBridgesResponse>, Status> {
        call(
            self,
            "/opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService/ListLogicalBridges",
            async {
                let r = req.get_ref();
                let state = self.ctl.state.snapshot();
                let items = state
                    .tenants
                    .iter()
                    .filter(|(_, t)| t.vlan_id != 0)
                    .map(|(k, t)| (k.as_str(), t));
                let (logical_bridges, next_page_token) =
                    paginate(items, r.page_size, &r.page_token, PAGES, |t| {
                        bridge_to_opi(&self.ctl.ports, t)
                    })?;
                Ok(evpn::ListLogicalBridgesResponse {
                    logical_bridges,
                    next_page_token,
                })
            },
        )
        .await
    }

    async fn get_logical_bridge(
        &self,
        req: Request<evpn::GetLogicalBridgeRequest>,
    ) -> std::result::Result<Response<evpn::LogicalBridge>, Status> {
        call(
            self,
            "/opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService/GetLogicalBridge",
            async {
                let id = validate::name("name", &req.get_ref().name, BRIDGES)?;
                Ok(self.bridge_get(id)?)
            },
        )
        .await
    }

    async fn delete_logical_bridge(
        &self,
        req: Request<evpn::DeleteLogicalBridgeRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        self.opi_call(
            "/opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService/DeleteLogicalBridge",
            async {
                let r = req.into_inner();
                let id = validate::name("name", &r.name, BRIDGES)?.to_string();
                let deleted = self
                    .change_tenant(move |s| {
                        let t = match s.tenants.get(&id) {
                            Some(t) if t.vlan_id != 0 => t,
                            _ => return Err(no_bridge(&id)),
                        };
                        if let Some(port) = t.attachments.iter().find_map(|a| match a {
                            Attachment::Port { port, .. } => Some(port.clone()),
                            Attachment::Vxlan { .. } => None,
                        }) {
                            return Err(ControlError::FailedPrecondition(format!(
                                "{BRIDGES}/{id} has {BRIDGE_PORTS}/{port}; delete the bridge \
                                 port (or take the bridge out of it) first"
                            )));
                        }
                        s.delete_tenant(&id, true).map(|()| ((), id))
                    })
                    .await
                    .map_err(Status::from);
                gone(deleted, r.allow_missing)
            },
        )
        .await
    }

    async fn update_logical_bridge(
        &self,
        req: Request<evpn::UpdateLogicalBridgeRequest>,
    ) -> std::result::Result<Response<evpn::LogicalBridge>, Status> {
        call(
            self,
            "/opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService/UpdateLogicalBridge",
            async {
                let r = req.into_inner();
                let b = required("logical_bridge", r.logical_bridge)?;
                let id = validate::name("logical_bridge.name", &b.name, BRIDGES)?.to_string();
                let paths = mask_fields(BRIDGE_FIELDS, "LogicalBridge", r.update_mask.as_ref())?;
                let wanted = b.spec.unwrap_or_default();
                match self.bridge_get(&id) {
                    Ok(now) => {
                        check_bridge_update(
                            &paths,
                            &wanted,
                            &now.spec.clone().unwrap_or_default(),
                        )?;
                        Ok(now)
                    }
                    Err(ControlError::NotFound(_)) if r.allow_missing => {
                        self.bridge_create(id, &wanted).await
                    }
                    Err(e) => Err(e.into()),
                }
            },
        )
        .await
    }
}

#[tonic::async_trait]
impl BridgePortService for Api {
    async fn create_bridge_port(
        &self,
        req: Request<evpn::CreateBridgePortRequest>,
    ) -> std::result::Result<Response<evpn::BridgePort>, Status> {
        call(
            self,
            "/opi_api.network.evpn_gw.v1alpha1.BridgePortService/CreateBridgePort",
            async {
                let r = req.into_inner();
                if r.bridge_port_id.is_empty() {
                    return Err(ControlError::invalid(
                        "bridge_port_id",
                        "required: the ID of the configured port to bridge",
                    )
                    .into());
                }
                validate::id("bridge_port_id", &r.bridge_port_id)?;
                let p = required("bridge_port", r.bridge_port)?;
                let spec = bridge_port_spec(&required("bridge_port.spec", p.spec)?)?;
                self.bridge_port_create(r.bridge_port_id, spec).await
            },
        )
        .await
    }

    async fn list_bridge_ports(
        &self,
        req: Request<evpn::ListBridgePortsRequest>,
    ) -> std::result::Result<Response<evpn::ListBridgePortsResponse>, Status> {
        call(
            self,
            "/opi_api.network.evpn_gw.v1alpha1.BridgePortService/ListBridgePorts",
            async {
                let r = req.get_ref();
                let state = self.ctl.state.snapshot();
                let held = held_by_bridges(&state);
                let items = self
                    .ctl
                    .ports
                    .keys()
                    .filter_map(|id| held.get(id.as_str()).map(|h| (id.as_str(), (id, h))));
                let (bridge_ports, next_page_token) =
                    paginate(items, r.page_size, &r.page_token, PAGES, |(id, h)| {
                        bridge_port_to_opi(id, h)
                    })?;
                Ok(evpn::ListBridgePortsResponse {
                    bridge_ports,
                    next_page_token,
                })
            },
        )
        .await
    }

    async fn get_bridge_port(
        &self,
        req: Request<evpn::GetBridgePortRequest>,
    ) -> std::result::Result<Response<evpn::BridgePort>, Status> {
        call(
            self,
            "/opi_api.network.evpn_gw.v1alpha1.BridgePortService/GetBridgePort",
            async {
                let id = validate::name("name", &req.get_ref().name, BRIDGE_PORTS)?;
                Ok(self.bridge_port_get(id)?)
            },
        )
        .await
    }

    async fn delete_bridge_port(
        &self,
        req: Request<evpn::DeleteBridgePortRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        self.opi_call(
            "/opi_api.network.evpn_gw.v1alpha1.BridgePortService/DeleteBridgePort",
            async {
                let r = req.into_inner();
                let id = validate::name("name", &r.name, BRIDGE_PORTS)?.to_string();
                let deleted = self
                    .change_served(self.ctl.switch_applied.as_ref(), move |s| {
                        let tenants = detach_bridge_port(s, &id)?;
                        if tenants.is_empty() {
                            return Err(no_bridge_port(&id));
                        }
                        Ok(((), Some(Part::Tenants(tenants))))
                    })
                    .await
                    .map_err(Status::from);
                gone(deleted, r.allow_missing)
            },
        )
        .await
    }

    async fn update_bridge_port(
        &self,
        req: Request<evpn::UpdateBridgePortRequest>,
    ) -> std::result::Result<Response<evpn::BridgePort>, Status> {
        call(
            self,
            "/opi_api.network.evpn_gw.v1alpha1.BridgePortService/UpdateBridgePort",
            async {
                let r = req.into_inner();
                let p = required("bridge_port", r.bridge_port)?;
                let id = validate::name("bridge_port.name", &p.name, BRIDGE_PORTS)?.to_string();
                let paths = mask_fields(PORT_FIELDS, "BridgePort", r.update_mask.as_ref())?;
                let wanted = p.spec.unwrap_or_default();
                let now = match self.bridge_port_get(&id) {
                    Ok(now) => now.spec.unwrap_or_default(),
                    Err(ControlError::NotFound(_)) if r.allow_missing => {
                        let spec = bridge_port_spec(&wanted)?;
                        return self.bridge_port_create(id, spec).await;
                    }
                    Err(e) => return Err(e.into()),
                };
                let next = merge_port_spec(&paths, &wanted, &now);
                if next == now {
                    return Ok(self.bridge_port_get(&id)?);
                }
                let spec = bridge_port_spec(&next)?;
                check_bridge_port(&self.ctl.ports, "bridge_port.name", &id)?;
                let ctl = self.ctl.clone();
                let port = id;
                Ok(self
                    .change_served(self.ctl.switch_applied.as_ref(), move |s| {
                        let mut tenants = detach_bridge_port(s, &port)?;
                        if tenants.is_empty() {
                            return Err(no_bridge_port(&port));
                        }
                        for t in attach_bridge_port(s, ctl.limits, &ctl.ports, &port, &spec)? {
                            if !tenants.contains(&t) {
                                tenants.push(t);
                            }
                        }
                        let view = bridge_port_to_opi(&port, &held_on(s, &port));
                        Ok((view, Some(Part::Tenants(tenants))))
                    })
                    .await?)
            },
        )
        .await
    }
}

/// The spec an update of the bridge port `now` to `wanted` over `paths`
/// asks for: each masked field that is set replaces the stored one
/// (zero and empty values count as unchanged).
pub fn merge_port_spec(
    paths: &[&str],
    wanted: &evpn::BridgePortSpec,
    now: &evpn::BridgePortSpec,
) -> evpn::BridgePortSpec {
    let mut next = now.clone();
    if paths.contains(&"spec.mac_address") && !wanted.mac_address.is_empty() {
        next.mac_address.clone_from(&wanted.mac_address);
    }
    if paths.contains(&"spec.ptype") && wanted.ptype != 0 {
        next.ptype = wanted.ptype;
    }
    if paths.contains(&"spec.logical_bridges") && !wanted.logical_bridges.is_empty() {
        next.logical_bridges.clone_from(&wanted.logical_bridges);
    }
    next
}

/// Refuses a call of the layer-3 services.
fn no_routing(method: &str) -> Status {
    Status::unimplemented(format!("{method}: {NO_ROUTING}"))
}

/// Answers `UNIMPLEMENTED` for the VRF and SVI methods, counting them.
macro_rules! unrouted {
    ($api:expr, $service:literal, $method:literal) => {
        $api.opi_call(
            concat!("/opi_api.network.evpn_gw.v1alpha1.", $service, "/", $method),
            async { Err(no_routing($method)) },
        )
        .await
    };
}

#[tonic::async_trait]
impl VrfService for Api {
    async fn create_vrf(
        &self,
        _req: Request<evpn::CreateVrfRequest>,
    ) -> std::result::Result<Response<evpn::Vrf>, Status> {
        unrouted!(self, "VrfService", "CreateVrf")
    }

    async fn list_vrfs(
        &self,
        _req: Request<evpn::ListVrfsRequest>,
    ) -> std::result::Result<Response<evpn::ListVrfsResponse>, Status> {
        unrouted!(self, "VrfService", "ListVrfs")
    }

    async fn get_vrf(
        &self,
        _req: Request<evpn::GetVrfRequest>,
    ) -> std::result::Result<Response<evpn::Vrf>, Status> {
        unrouted!(self, "VrfService", "GetVrf")
    }

    async fn delete_vrf(
        &self,
        _req: Request<evpn::DeleteVrfRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        unrouted!(self, "VrfService", "DeleteVrf")
    }

    async fn update_vrf(
        &self,
        _req: Request<evpn::UpdateVrfRequest>,
    ) -> std::result::Result<Response<evpn::Vrf>, Status> {
        unrouted!(self, "VrfService", "UpdateVrf")
    }
}

#[tonic::async_trait]
impl SviService for Api {
    async fn create_svi(
        &self,
        _req: Request<evpn::CreateSviRequest>,
    ) -> std::result::Result<Response<evpn::Svi>, Status> {
        unrouted!(self, "SviService", "CreateSvi")
    }

    async fn list_svis(
        &self,
        _req: Request<evpn::ListSvisRequest>,
    ) -> std::result::Result<Response<evpn::ListSvisResponse>, Status> {
        unrouted!(self, "SviService", "ListSvis")
    }

    async fn get_svi(
        &self,
        _req: Request<evpn::GetSviRequest>,
    ) -> std::result::Result<Response<evpn::Svi>, Status> {
        unrouted!(self, "SviService", "GetSvi")
    }

    async fn delete_svi(
        &self,
        _req: Request<evpn::DeleteSviRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        unrouted!(self, "SviService", "DeleteSvi")
    }

    async fn update_svi(
        &self,
        _req: Request<evpn::UpdateSviRequest>,
    ) -> std::result::Result<Response<evpn::Svi>, Status> {
        unrouted!(self, "SviService", "UpdateSvi")
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;
    use tonic::Code;

    use super::*;
    use crate::apply::Problem;
    use crate::model::PortSpec;
    use crate::service::testing::{follower, LIMITS};
    use crate::store::StateHandle;

    const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
    /// The MAC address the stand-in switch refuses.
    const MAC_BAD: [u8; 6] = [2, 0, 0, 0, 0, 0x66];

    fn port(id: &str, role: PortRole, vtep: Option<&str>) -> (String, PortSpec) {
        (
            id.to_string(),
            PortSpec {
                id: id.into(),
                driver: "none".into(),
                device: String::new(),
                role,
                vtep_address: vtep.map(|v| v.parse().unwrap()),
            },
        )
    }

    /// An uplink with a VTEP, a second one with another, and four VFs.
    fn ports() -> PortRegistry {
        [
            port("p0", PortRole::Uplink, Some("192.0.2.1")),
            port("p1", PortRole::Uplink, Some("198.51.100.1")),
            port("pf0vf0", PortRole::Vf, None),
            port("pf0vf1", PortRole::Vf, None),
            port("pf0vf2", PortRole::Vf, None),
            port("pf0vf3", PortRole::Vf, None),
        ]
        .into()
    }

    fn v4(addr: &str, len: i32) -> net::IpPrefix {
        ipv4_prefix_to_opi(addr.parse().unwrap(), u8::try_from(len).unwrap())
    }

    fn spec(
        vlan_id: u32,
        vni: Option<u32>,
        vtep: Option<net::IpPrefix>,
    ) -> evpn::LogicalBridgeSpec {
        evpn::LogicalBridgeSpec {
            vlan_id,
            vni,
            vtep_ip_prefix: vtep,
        }
    }

    /// The field an INVALID_ARGUMENT names.
    fn refused_field(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Err(ControlError::InvalidArgument { field, .. }) => field,
            other => panic!("not INVALID_ARGUMENT: {other:?}"),
        }
    }

    #[test]
    fn a_bridge_spec_is_checked_with_opis_field_names() {
        assert_eq!(
            bridge_spec(&spec(10, None, None)).unwrap(),
            BridgeSpec {
                vlan_id: 10,
                vxlan: None
            }
        );
        assert_eq!(
            bridge_spec(&spec(4094, Some(100), Some(v4("192.0.2.1", 24)))).unwrap(),
            BridgeSpec {
                vlan_id: 4094,
                vxlan: Some((100, Some(("192.0.2.1".parse().unwrap(), 24))))
            }
        );
        for (s, field) in [
            (spec(0, None, None), "logical_bridge.spec.vlan_id"),
            (spec(4095, None, None), "logical_bridge.spec.vlan_id"),
            (spec(10, Some(0), None), "logical_bridge.spec.vni"),
            (spec(10, Some(1 << 24), None), "logical_bridge.spec.vni"),
            (
                spec(10, None, Some(v4("192.0.2.1", 24))),
                "logical_bridge.spec.vtep_ip_prefix",
            ),
            (
                spec(
                    10,
                    Some(5),
                    Some(v4("192.0.2.1", 24)).map(|mut p| {
                        p.len = 33;
                        p
                    }),
                ),
                "logical_bridge.spec.vtep_ip_prefix.len",
            ),
            (
                spec(10, Some(5), Some(v4("192.0.2.1", 0))),
                "logical_bridge.spec.vtep_ip_prefix.len",
            ),
            (
                spec(
                    10,
                    Some(5),
                    Some(net::IpPrefix {
                        addr: Some(net::IpAddress {
                            af: net::IpAf::Inet6 as i32,
                            v4_or_v6: Some(net::ip_address::V4OrV6::V6Addr(vec![0; 16])),
                        }),
                        len: 64,
                    }),
                ),
                "logical_bridge.spec.vtep_ip_prefix.addr",
            ),
            (
                spec(10, Some(5), Some(net::IpPrefix { addr: None, len: 8 })),
                "logical_bridge.spec.vtep_ip_prefix.addr",
            ),
        ] {
            assert_eq!(refused_field(bridge_spec(&s)), field, "{s:?}");
        }
    }

    #[test]
    fn a_vxlan_network_goes_on_the_port_with_the_vtep_address() {
        let ports = ports();
        let a = vxlan_attachment(&ports, 100, Some(("192.0.2.1".parse().unwrap(), 24))).unwrap();
        assert_eq!(
            a,
            Attachment::Vxlan {
                uplink: "p0".into(),
                vni: 100,
                remote_vteps: Vec::new(),
                underlay_prefixes: vec!["192.0.2.0/24".parse().unwrap()],
            }
        );
        let b = vxlan_attachment(&ports, 7, Some(("198.51.100.1".parse().unwrap(), 32))).unwrap();
        assert_eq!(b.port(), "p1");
        let e =
            vxlan_attachment(&ports, 7, Some(("203.0.113.9".parse().unwrap(), 24))).unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(
            e.to_string().starts_with(
                "logical_bridge.spec.vtep_ip_prefix: no port has the VTEP address 203.0.113.9"
            ),
            "{e}"
        );
        // Without an address: the one port with a VTEP, if there is one.
        let e = vxlan_attachment(&ports, 7, None).unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.to_string().contains("vtep_ip_prefix: required"), "{e}");
        let one: PortRegistry = [
            port("p0", PortRole::Uplink, Some("192.0.2.1")),
            port("pf0vf0", PortRole::Vf, None),
        ]
        .into();
        assert_eq!(vxlan_attachment(&one, 7, None).unwrap().port(), "p0");
        let none: PortRegistry = [port("pf0vf0", PortRole::Vf, None)].into();
        let e = vxlan_attachment(&none, 7, None).unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(
            e.to_string().starts_with("logical_bridge.spec.vni: "),
            "{e}"
        );

        // The view: the VTEP address with the underlay prefix's length.
        let s = bridge_spec(&spec(10, Some(100), Some(v4("192.0.2.1", 24)))).unwrap();
        let t = bridge_tenant(&ports, "lb1", &s).unwrap();
        assert_eq!((t.vlan_id, t.default_policy), (10, Action::Allow));
        assert_eq!(t.attachments, vec![a]);
        let view = bridge_to_opi(&ports, &t);
        assert_eq!(view.name, "logicalBridges/lb1");
        assert_eq!(
            view.spec,
            Some(spec(10, Some(100), Some(v4("192.0.2.1", 24))))
        );
        assert_eq!(
            view.status.unwrap().oper_status,
            evpn::LbOperStatus::Up as i32
        );
        let t =
            bridge_tenant(&one, "lb2", &bridge_spec(&spec(20, Some(7), None)).unwrap()).unwrap();
        assert_eq!(
            bridge_to_opi(&one, &t).spec,
            Some(spec(20, Some(7), Some(v4("192.0.2.1", 32))))
        );
    }

    #[test]
    fn a_bridge_port_spec_is_checked_with_opis_field_names() {
        let ok = |mac: &[u8], ptype: evpn::BridgePortType, bridges: &[&str]| evpn::BridgePortSpec {
            mac_address: mac.to_vec(),
            ptype: ptype as i32,
            logical_bridges: bridges.iter().map(|b| b.to_string()).collect(),
        };
        use evpn::BridgePortType::{Access, Trunk, Unspecified};
        assert_eq!(
            bridge_port_spec(&ok(&MAC_A, Access, &["logicalBridges/lb1"])).unwrap(),
            BridgePortSpec {
                mac: MacAddr(MAC_A),
                ptype: PortType::Access,
                bridges: vec!["lb1".into()],
            }
        );
        let trunk = bridge_port_spec(&ok(
            &MAC_B,
            Trunk,
            &["logicalBridges/lb2", "logicalBridges/lb1"],
        ))
        .unwrap();
        assert_eq!(
            (trunk.ptype, trunk.bridges),
            (PortType::Trunk, vec!["lb2".into(), "lb1".into()])
        );
        let mut bad = ok(&MAC_A, Access, &["logicalBridges/lb1"]);
        bad.ptype = 7;
        for (s, field) in [
            (
                ok(&MAC_A[..5], Access, &["logicalBridges/lb1"]),
                "bridge_port.spec.mac_address",
            ),
            (
                ok(&[], Access, &["logicalBridges/lb1"]),
                "bridge_port.spec.mac_address",
            ),
            (
                ok(&[1, 0, 0x5e, 0, 0, 1], Access, &["logicalBridges/lb1"]),
                "bridge_port.spec.mac_address",
            ),
            (
                ok(&[0; 6], Access, &["logicalBridges/lb1"]),
                "bridge_port.spec.mac_address",
            ),
            (
                ok(&MAC_A, Unspecified, &["logicalBridges/lb1"]),
                "bridge_port.spec.ptype",
            ),
            (bad, "bridge_port.spec.ptype"),
            (ok(&MAC_A, Access, &[]), "bridge_port.spec.logical_bridges"),
            (
                ok(
                    &MAC_A,
                    Access,
                    &["logicalBridges/lb1", "logicalBridges/lb2"],
                ),
                "bridge_port.spec.logical_bridges",
            ),
            (ok(&MAC_A, Trunk, &[]), "bridge_port.spec.logical_bridges"),
            (
                ok(&MAC_A, Access, &["tenants/lb1"]),
                "bridge_port.spec.logical_bridges[0]",
            ),
            (
                ok(&MAC_A, Trunk, &["logicalBridges/lb1", "logicalBridges/lb1"]),
                "bridge_port.spec.logical_bridges[1]",
            ),
        ] {
            assert_eq!(refused_field(bridge_port_spec(&s)), field, "{s:?}");
        }
    }

    #[test]
    fn an_update_changes_nothing_a_bridge_holds() {
        let mask = |p: &[&str]| FieldMask {
            paths: p.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(
            mask_fields(BRIDGE_FIELDS, "LogicalBridge", None).unwrap(),
            BRIDGE_FIELDS
        );
        assert_eq!(
            mask_fields(BRIDGE_FIELDS, "LogicalBridge", Some(&mask(&["*"]))).unwrap(),
            BRIDGE_FIELDS
        );
        assert_eq!(
            mask_fields(BRIDGE_FIELDS, "LogicalBridge", Some(&mask(&["vni"]))).unwrap(),
            ["spec.vni"]
        );
        assert_eq!(
            refused_field(mask_fields(
                PORT_FIELDS,
                "BridgePort",
                Some(&mask(&["spec.vni"]))
            )),
            "update_mask"
        );
        let now = spec(10, Some(100), Some(v4("192.0.2.1", 24)));
        check_bridge_update(BRIDGE_FIELDS, &now, &now).unwrap();
        // Zero and empty values count as unchanged.
        check_bridge_update(BRIDGE_FIELDS, &spec(0, None, None), &now).unwrap();
        // A field not named is not compared.
        check_bridge_update(&["spec.vni"], &spec(11, Some(100), None), &now).unwrap();
        for (wanted, field) in [
            (spec(11, None, None), "logical_bridge.spec.vlan_id"),
            (spec(10, Some(101), None), "logical_bridge.spec.vni"),
            (
                spec(10, None, Some(v4("192.0.2.1", 25))),
                "logical_bridge.spec.vtep_ip_prefix",
            ),
        ] {
            assert_eq!(
                refused_field(check_bridge_update(BRIDGE_FIELDS, &wanted, &now)),
                field
            );
        }
        let e = check_bridge_update(
            BRIDGE_FIELDS,
            &spec(10, Some(5), None),
            &spec(10, None, None),
        )
        .unwrap_err();
        assert!(e.to_string().contains("it is unset"), "{e}");

        let port_now = evpn::BridgePortSpec {
            mac_address: MAC_A.to_vec(),
            ptype: evpn::BridgePortType::Access as i32,
            logical_bridges: vec!["logicalBridges/lb1".into()],
        };
        let wanted = evpn::BridgePortSpec {
            mac_address: MAC_B.to_vec(),
            ptype: 0,
            logical_bridges: vec!["logicalBridges/lb2".into()],
        };
        let next = merge_port_spec(&["spec.logical_bridges"], &wanted, &port_now);
        assert_eq!(
            (
                next.mac_address.as_slice(),
                next.logical_bridges[0].as_str()
            ),
            (&MAC_A[..], "logicalBridges/lb2")
        );
        let next = merge_port_spec(PORT_FIELDS, &wanted, &port_now);
        assert_eq!(
            (next.mac_address.as_slice(), next.ptype),
            (&MAC_B[..], evpn::BridgePortType::Access as i32)
        );
    }

    fn create_bridge(
        id: &str,
        s: evpn::LogicalBridgeSpec,
    ) -> Request<evpn::CreateLogicalBridgeRequest> {
        Request::new(evpn::CreateLogicalBridgeRequest {
            logical_bridge_id: id.into(),
            logical_bridge: Some(evpn::LogicalBridge {
                spec: Some(s),
                ..Default::default()
            }),
        })
    }

    fn create_port(
        id: &str,
        mac: [u8; 6],
        ptype: evpn::BridgePortType,
        bridges: &[&str],
    ) -> Request<evpn::CreateBridgePortRequest> {
        Request::new(evpn::CreateBridgePortRequest {
            bridge_port_id: id.into(),
            bridge_port: Some(evpn::BridgePort {
                spec: Some(evpn::BridgePortSpec {
                    mac_address: mac.to_vec(),
                    ptype: ptype as i32,
                    logical_bridges: bridges
                        .iter()
                        .map(|b| format!("logicalBridges/{b}"))
                        .collect(),
                }),
                ..Default::default()
            }),
        })
    }

    fn guarded(port: &str, vlan: u16, mac: [u8; 6]) -> Attachment {
        Attachment::Port {
            port: port.into(),
            vlan,
            guard: SourceGuard {
                macs: vec![MacAddr(mac)],
                prefixes: Vec::new(),
            },
        }
    }

    /// Refused with `code` and a message containing `text`.
    fn refused<T: std::fmt::Debug>(r: std::result::Result<T, Status>, code: Code, text: &str) {
        match r {
            Err(e) if e.code() == code && e.message().contains(text) => {}
            other => panic!("wanted {code:?} naming {text:?}, got {other:?}"),
        }
    }

    /// Through the services, over a state in memory: bridges are tenants
    /// with VLAN IDs, bridge ports their guarded attachments, each call
    /// one change, and the refusals name what they refuse.
    #[tokio::test]
    async fn bridges_are_tenants_and_bridge_ports_their_attachments() {
        use evpn::BridgePortType::{Access, Trunk};
        let state = StateHandle::open(None).unwrap();
        let api = Api::for_tests(state.clone(), ports(), LIMITS, None, None);
        let lb1 = api
            .create_logical_bridge(create_bridge(
                "lb1",
                spec(10, Some(100), Some(v4("192.0.2.1", 24))),
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(lb1.name, "logicalBridges/lb1");
        api.create_logical_bridge(create_bridge("lb2", spec(20, None, None)))
            .await
            .unwrap();
        let t = state.snapshot().tenants["lb1"].clone();
        assert_eq!((t.vlan_id, t.default_policy), (10, Action::Allow));
        assert_eq!(t.attachments[0].port(), "p0");
        refused(
            api.create_logical_bridge(create_bridge("lb3", spec(10, None, None)))
                .await,
            Code::AlreadyExists,
            "logical_bridge.spec.vlan_id: VLAN 10 is the network of tenants/lb1",
        );
        refused(
            api.create_logical_bridge(create_bridge("lb1", spec(30, None, None)))
                .await,
            Code::AlreadyExists,
            "logicalBridges/lb1",
        );
        refused(
            api.create_logical_bridge(create_bridge("Bad", spec(30, None, None)))
                .await,
            Code::InvalidArgument,
            "logical_bridge_id",
        );
        let made = api
            .create_logical_bridge(create_bridge("", spec(30, None, None)))
            .await
            .unwrap()
            .into_inner();
        assert!(made.name.starts_with("logicalBridges/opi-"), "{made:?}");
        // A tenant without a VLAN ID is no bridge.
        state
            .mutate(|s| {
                let mut t = bridge_tenant(&ports(), "plain", &bridge_spec(&spec(40, None, None))?)?;
                t.vlan_id = 0;
                t.attachments = vec![Attachment::port_vlan("pf0vf2", 0)];
                s.create_tenant(LIMITS, &ports(), t)
            })
            .await
            .unwrap();
        let page = api
            .list_logical_bridges(Request::new(evpn::ListLogicalBridgesRequest {
                page_size: 2,
                page_token: String::new(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(page.logical_bridges.len(), 2);
        let rest = api
            .list_logical_bridges(Request::new(evpn::ListLogicalBridgesRequest {
                page_size: 2,
                page_token: page.next_page_token,
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(rest.logical_bridges.len(), 1, "{rest:?}");
        assert!(rest.next_page_token.is_empty());
        refused(
            api.get_logical_bridge(Request::new(evpn::GetLogicalBridgeRequest {
                name: "logicalBridges/plain".into(),
            }))
            .await,
            Code::NotFound,
            "logicalBridges/plain",
        );

        // Bridge ports.
        let p = api
            .create_bridge_port(create_port("pf0vf0", MAC_A, Access, &["lb1"]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(p.name, "bridgePorts/pf0vf0");
        assert_eq!(
            p.spec,
            Some(evpn::BridgePortSpec {
                mac_address: MAC_A.to_vec(),
                ptype: Access as i32,
                logical_bridges: vec!["logicalBridges/lb1".into()],
            })
        );
        api.create_bridge_port(create_port("pf0vf1", MAC_B, Trunk, &["lb2", "lb1"]))
            .await
            .unwrap();
        let s = state.snapshot();
        assert_eq!(
            s.tenants["lb1"].attachments[1..],
            [guarded("pf0vf0", 0, MAC_A), guarded("pf0vf1", 10, MAC_B)]
        );
        assert_eq!(s.tenants["lb2"].attachments, [guarded("pf0vf1", 20, MAC_B)]);
        for (req, code, text) in [
            (
                create_port("pf0vf0", MAC_B, Access, &["lb2"]),
                Code::AlreadyExists,
                "bridgePorts/pf0vf0",
            ),
            (
                create_port("pf0vf2", MAC_B, Access, &["lb2"]),
                Code::FailedPrecondition,
                "tenants/plain",
            ),
            (
                create_port("p0", MAC_B, Access, &["lb2"]),
                Code::FailedPrecondition,
                "bridge_port_id: ports/p0 is an uplink",
            ),
            (
                create_port("pf9", MAC_B, Access, &["lb2"]),
                Code::FailedPrecondition,
                "bridge_port_id: \"pf9\"",
            ),
            (
                create_port("pf0vf3", MAC_B, Access, &["nope"]),
                Code::NotFound,
                "bridge_port.spec.logical_bridges[0]: logicalBridges/nope",
            ),
            (
                create_port("pf0vf3", MAC_B, Trunk, &["lb2", "plain"]),
                Code::NotFound,
                "bridge_port.spec.logical_bridges[1]: logicalBridges/plain",
            ),
        ] {
            refused(api.create_bridge_port(req).await, code, text);
        }
        let page = api
            .list_bridge_ports(Request::new(evpn::ListBridgePortsRequest {
                page_size: 1,
                page_token: String::new(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(page.bridge_ports[0].name, "bridgePorts/pf0vf0");
        let rest = api
            .list_bridge_ports(Request::new(evpn::ListBridgePortsRequest {
                page_size: 1,
                page_token: page.next_page_token,
            }))
            .await
            .unwrap()
            .into_inner();
        let trunk = &rest.bridge_ports[0];
        assert_eq!(trunk.name, "bridgePorts/pf0vf1");
        let ts = trunk.spec.as_ref().unwrap();
        assert_eq!(ts.ptype, Trunk as i32);
        assert_eq!(
            ts.logical_bridges,
            ["logicalBridges/lb1", "logicalBridges/lb2"]
        );
        assert!(rest.next_page_token.is_empty(), "pf0vf2 is no bridge port");

        // A bridge with a bridge port stays; its VXLAN network goes with it.
        refused(
            api.delete_logical_bridge(Request::new(evpn::DeleteLogicalBridgeRequest {
                name: "logicalBridges/lb1".into(),
                allow_missing: false,
            }))
            .await,
            Code::FailedPrecondition,
            "bridgePorts/pf0vf0",
        );
        // Update: the port moves to lb2 with another MAC address, in one
        // change.
        let g = state.published().generation;
        let moved = api
            .update_bridge_port(Request::new(evpn::UpdateBridgePortRequest {
                bridge_port: Some(evpn::BridgePort {
                    name: "bridgePorts/pf0vf0".into(),
                    spec: Some(evpn::BridgePortSpec {
                        mac_address: MAC_BAD.to_vec(),
                        ptype: 0,
                        logical_bridges: vec!["logicalBridges/lb2".into()],
                    }),
                    status: None,
                }),
                update_mask: Some(FieldMask {
                    paths: vec!["mac_address".into(), "spec.logical_bridges".into()],
                }),
                allow_missing: false,
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(state.published().generation, g + 1, "one change");
        assert_eq!(moved.spec.unwrap().logical_bridges, ["logicalBridges/lb2"]);
        let s = state.snapshot();
        assert!(s.tenants["lb1"]
            .attachments
            .iter()
            .all(|a| a.port() != "pf0vf0"));
        assert!(s.tenants["lb2"]
            .attachments
            .contains(&guarded("pf0vf0", 0, MAC_BAD)));
        for name in ["bridgePorts/pf0vf0", "bridgePorts/pf0vf1"] {
            api.delete_bridge_port(Request::new(evpn::DeleteBridgePortRequest {
                name: name.into(),
                allow_missing: false,
            }))
            .await
            .unwrap();
        }
        refused(
            api.delete_bridge_port(Request::new(evpn::DeleteBridgePortRequest {
                name: "bridgePorts/pf0vf0".into(),
                allow_missing: false,
            }))
            .await,
            Code::NotFound,
            "bridgePorts/pf0vf0",
        );
        api.delete_bridge_port(Request::new(evpn::DeleteBridgePortRequest {
            name: "bridgePorts/pf0vf0".into(),
            allow_missing: true,
        }))
        .await
        .unwrap();
        refused(
            api.delete_bridge_port(Request::new(evpn::DeleteBridgePortRequest {
                name: "bridgePorts/pf0vf2".into(),
                allow_missing: true,
            }))
            .await,
            Code::FailedPrecondition,
            "tenants/plain",
        );
        let s = state.snapshot();
        assert_eq!(s.tenants["lb2"].attachments, []);
        api.delete_logical_bridge(Request::new(evpn::DeleteLogicalBridgeRequest {
            name: "logicalBridges/lb1".into(),
            allow_missing: false,
        }))
        .await
        .unwrap();
        assert!(!state.snapshot().tenants.contains_key("lb1"));
        // Another tenant's deletion is no bridge's.
        refused(
            api.delete_logical_bridge(Request::new(evpn::DeleteLogicalBridgeRequest {
                name: "logicalBridges/plain".into(),
                allow_missing: false,
            }))
            .await,
            Code::NotFound,
            "logicalBridges/plain",
        );
        api.delete_logical_bridge(Request::new(evpn::DeleteLogicalBridgeRequest {
            name: "logicalBridges/plain".into(),
            allow_missing: true,
        }))
        .await
        .unwrap();
        assert!(state.snapshot().tenants.contains_key("plain"));

        // Update: identical values answer the bridge, others are refused,
        // allow_missing creates.
        let update = |name: &str, s: evpn::LogicalBridgeSpec, allow_missing| {
            api.update_logical_bridge(Request::new(evpn::UpdateLogicalBridgeRequest {
                logical_bridge: Some(evpn::LogicalBridge {
                    name: name.into(),
                    spec: Some(s),
                    status: None,
                }),
                update_mask: None,
                allow_missing,
            }))
        };
        let same = update("logicalBridges/lb2", spec(20, None, None), false)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(same.spec, Some(spec(20, None, None)));
        refused(
            update("logicalBridges/lb2", spec(21, None, None), false).await,
            Code::InvalidArgument,
            "logical_bridge.spec.vlan_id",
        );
        refused(
            update("logicalBridges/lb9", spec(90, None, None), false).await,
            Code::NotFound,
            "logicalBridges/lb9",
        );
        update("logicalBridges/lb9", spec(90, None, None), true)
            .await
            .unwrap();
        assert_eq!(state.snapshot().tenants["lb9"].vlan_id, 90);

        refused(
            api.create_vrf(Request::new(evpn::CreateVrfRequest::default()))
                .await,
            Code::Unimplemented,
            "routing is not offered",
        );
        refused(
            api.list_svis(Request::new(evpn::ListSvisRequest::default()))
                .await,
            Code::Unimplemented,
            "routing is not offered",
        );
    }

    /// A stand-in for the switch: it refuses a state in which a port
    /// attachment lets through `MAC_BAD`, naming that attachment's
    /// tenant.
    fn judge(s: &State) -> std::result::Result<Vec<Problem>, (String, Vec<String>)> {
        for t in s.tenants.values() {
            if t.attachments.iter().any(
                |a| matches!(a, Attachment::Port { guard, .. } if guard.macs == [MacAddr(MAC_BAD)]),
            ) {
                return Err((
                    format!("tenant {} takes the bad MAC", t.id),
                    vec![format!("tenants/{}", t.id)],
                ));
            }
        }
        Ok(Vec::new())
    }

    /// A bridge port change the switch refuses is undone in every tenant
    /// it touched, whichever order they must be put back in.
    #[tokio::test]
    async fn a_refused_bridge_port_change_is_undone_in_every_tenant() {
        use evpn::BridgePortType::{Access, Trunk};
        let state = StateHandle::open(None).unwrap();
        let (_pause, paused) = watch::channel(false);
        let (applied, _seen) = follower("the switch", &state, judge, paused);
        let api = Api::for_tests(state.clone(), ports(), LIMITS, None, Some(applied));
        for (id, vlan) in [("lb1", 10), ("lb2", 20)] {
            api.create_logical_bridge(create_bridge(id, spec(vlan, None, None)))
                .await
                .unwrap();
        }
        let before = state.snapshot();
        let e = api
            .create_bridge_port(create_port("pf0vf1", MAC_BAD, Trunk, &["lb1", "lb2"]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Internal, "{e:?}");
        assert!(e.message().contains("the change was undone"), "{e:?}");
        assert_eq!(state.snapshot().tenants, before.tenants, "both undone");

        // Moving a port from lb1 to lb2: lb2 must give it back before
        // lb1 can take it again.
        api.create_bridge_port(create_port("pf0vf0", MAC_A, Access, &["lb1"]))
            .await
            .unwrap();
        let held = state.snapshot();
        let e = api
            .update_bridge_port(Request::new(evpn::UpdateBridgePortRequest {
                bridge_port: Some(evpn::BridgePort {
                    name: "bridgePorts/pf0vf0".into(),
                    spec: Some(evpn::BridgePortSpec {
                        mac_address: MAC_BAD.to_vec(),
                        ptype: Access as i32,
                        logical_bridges: vec!["logicalBridges/lb2".into()],
                    }),
                    status: None,
                }),
                update_mask: None,
                allow_missing: false,
            }))
            .await
            .unwrap_err();
        assert!(e.message().contains("the change was undone"), "{e:?}");
        let now = state.snapshot();
        assert_eq!(
            now.tenants["lb1"].attachments,
            held.tenants["lb1"].attachments
        );
        assert_eq!(now.tenants["lb2"].attachments, []);
    }
}
