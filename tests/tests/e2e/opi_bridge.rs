//! OPI's EVPN gateway layer-2 services
//! (`opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService` and
//! `BridgePortService`) through the real binary, with the Rust clients of
//! OPI's protos. A logical bridge is a `dpu.v1` tenant with a VLAN ID and
//! a bridge port that tenant's attachment of the port guarded by the
//! port's MAC address: what OPI makes `dpu.v1` shows and the reverse,
//! the refusals name OPI's fields, lists page, and a restart keeps it
//! all; a reader is refused every change; VRFs and SVIs are
//! `UNIMPLEMENTED`. On the kernel driver, with network namespaces as
//! stations (needs root): two stations on bridge ports of one bridge
//! reach each other, a station of another bridge reaches neither, and a
//! station sending from another MAC address than its bridge port's is
//! dropped.

use anyhow::{ensure, Context, Result};
use dpu_e2e::net::{eventually, ip, metric, Host};
use dpu_e2e::{refused, Service, TEST_CONFIG};
use dpu_proto::opi::network::evpn_gw::v1alpha1 as evpn;
use dpu_proto::opi::network::opinetcommon::v1alpha1 as net;
use dpu_proto::pbjson_types::FieldMask;
use dpu_proto::v1 as pb;
use tonic::transport::Channel;
use tonic::Code;

use evpn::bridge_port_service_client::BridgePortServiceClient;
use evpn::logical_bridge_service_client::LogicalBridgeServiceClient;
use evpn::svi_service_client::SviServiceClient;
use evpn::vrf_service_client::VrfServiceClient;
use evpn::BridgePortType::{Access, Trunk};
use pb::port_service_client::PortServiceClient;
use pb::tenant_service_client::TenantServiceClient;

/// Clients of OPI's layer-2 and layer-3 services and of `dpu.v1`'s
/// tenants and ports, on one connection.
struct Clients {
    bridges: LogicalBridgeServiceClient<Channel>,
    ports: BridgePortServiceClient<Channel>,
    vrfs: VrfServiceClient<Channel>,
    svis: SviServiceClient<Channel>,
    tenants: TenantServiceClient<Channel>,
    dpu_ports: PortServiceClient<Channel>,
}

impl Clients {
    async fn connect(svc: &Service) -> Result<Clients> {
        let ch = Channel::from_shared(svc.endpoint())?.connect().await?;
        Ok(Clients {
            bridges: LogicalBridgeServiceClient::new(ch.clone()),
            ports: BridgePortServiceClient::new(ch.clone()),
            vrfs: VrfServiceClient::new(ch.clone()),
            svis: SviServiceClient::new(ch.clone()),
            tenants: TenantServiceClient::new(ch.clone()),
            dpu_ports: PortServiceClient::new(ch),
        })
    }
}

/// Runs `call` with clients connected to `svc`.
fn with_clients<T, F>(svc: &Service, call: impl FnOnce(Clients) -> F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    dpu_e2e::block_on(async { call(Clients::connect(svc).await?).await })
}

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0x0b, 0x0a];

fn v4_prefix(addr: [u8; 4], len: i32) -> net::IpPrefix {
    net::IpPrefix {
        addr: Some(net::IpAddress {
            af: net::IpAf::Inet as i32,
            v4_or_v6: Some(net::ip_address::V4OrV6::V4Addr(u32::from_be_bytes(addr))),
        }),
        len,
    }
}

fn bridge(
    id: &str,
    vlan_id: u32,
    vni: Option<u32>,
    vtep: Option<net::IpPrefix>,
) -> evpn::CreateLogicalBridgeRequest {
    evpn::CreateLogicalBridgeRequest {
        logical_bridge_id: id.into(),
        logical_bridge: Some(evpn::LogicalBridge {
            spec: Some(evpn::LogicalBridgeSpec {
                vlan_id,
                vni,
                vtep_ip_prefix: vtep,
            }),
            ..Default::default()
        }),
    }
}

fn bridge_port(
    id: &str,
    mac: &[u8],
    ptype: evpn::BridgePortType,
    bridges: &[&str],
) -> evpn::CreateBridgePortRequest {
    evpn::CreateBridgePortRequest {
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
    }
}

fn get_bridge(name: &str) -> evpn::GetLogicalBridgeRequest {
    evpn::GetLogicalBridgeRequest { name: name.into() }
}

fn get_port(name: &str) -> evpn::GetBridgePortRequest {
    evpn::GetBridgePortRequest { name: name.into() }
}

fn get_tenant(name: &str) -> pb::GetTenantRequest {
    pb::GetTenantRequest { name: name.into() }
}

/// The port attachments of a `dpu.v1` tenant.
fn port_attachments(t: &pb::Tenant) -> Vec<pb::PortAttachment> {
    t.attachments
        .iter()
        .filter_map(|a| match &a.kind {
            Some(pb::attachment::Kind::Port(p)) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

/// What OPI and `dpu.v1` show of the bridges and ports, to compare
/// across a restart.
async fn both_views(c: &mut Clients) -> Result<String> {
    let bridges = c
        .bridges
        .list_logical_bridges(evpn::ListLogicalBridgesRequest::default())
        .await?
        .into_inner();
    let ports = c
        .ports
        .list_bridge_ports(evpn::ListBridgePortsRequest::default())
        .await?
        .into_inner();
    let mut tenants = c
        .tenants
        .list_tenants(pb::ListTenantsRequest::default())
        .await?
        .into_inner();
    // What a restart changes: nothing of the tenants but these.
    for t in &mut tenants.tenants {
        t.create_time = None;
    }
    Ok(format!("{bridges:?}\n{ports:?}\n{tenants:?}"))
}

#[test]
fn opi_bridges_and_bridge_ports_are_dpu_v1_tenants_and_attachments() -> Result<()> {
    let mut svc = Service::start()?;
    let before = with_clients(&svc, |mut c| async move {
        // OPI makes, dpu.v1 shows.
        let lb1 = c
            .bridges
            .create_logical_bridge(bridge("lb1", 10, None, None))
            .await?
            .into_inner();
        ensure!(lb1.name == "logicalBridges/lb1", "{lb1:?}");
        ensure!(
            lb1.status.as_ref().map(|s| s.oper_status) == Some(evpn::LbOperStatus::Up as i32),
            "{lb1:?}"
        );
        c.bridges
            .create_logical_bridge(bridge("lb2", 20, None, None))
            .await?;
        let t = c
            .tenants
            .get_tenant(get_tenant("tenants/lb1"))
            .await?
            .into_inner();
        ensure!(
            t.vlan_id == 10 && t.default_policy == pb::DefaultPolicy::Allow as i32,
            "{t:?}"
        );
        let p = c
            .ports
            .create_bridge_port(bridge_port("pf0vf0", &MAC_A, Access, &["lb1"]))
            .await?
            .into_inner();
        ensure!(
            p.name == "bridgePorts/pf0vf0"
                && p.spec.as_ref().map(|s| s.mac_address.as_slice()) == Some(&MAC_A[..]),
            "{p:?}"
        );
        let t = c
            .tenants
            .get_tenant(get_tenant("tenants/lb1"))
            .await?
            .into_inner();
        let atts = port_attachments(&t);
        ensure!(
            atts.len() == 1
                && atts[0].port == "ports/pf0vf0"
                && atts[0].vlan_id == 0
                && atts[0].allowed_macs == ["02:00:00:00:0b:0a"],
            "{t:?}"
        );

        // dpu.v1 makes, OPI shows: a tenant with a VLAN ID is a bridge,
        // its VLAN attachment a trunk bridge port.
        c.tenants
            .create_tenant(pb::CreateTenantRequest {
                tenant_id: "blue".into(),
                tenant: Some(pb::Tenant {
                    vlan_id: 30,
                    default_policy: pb::DefaultPolicy::Deny as i32,
                    ..Default::default()
                }),
            })
            .await?;
        c.dpu_ports
            .attach_port(pb::AttachPortRequest {
                port: "ports/pf0vf1".into(),
                vlan_id: 30,
                tenant: "tenants/blue".into(),
            })
            .await?;
        let blue = c
            .bridges
            .get_logical_bridge(get_bridge("logicalBridges/blue"))
            .await?
            .into_inner();
        ensure!(
            blue.spec.as_ref().map(|s| (s.vlan_id, s.vni)) == Some((30, None)),
            "{blue:?}"
        );
        let trunk = c
            .ports
            .get_bridge_port(get_port("bridgePorts/pf0vf1"))
            .await?
            .into_inner();
        let spec = trunk.spec.context("no spec")?;
        ensure!(
            spec.ptype == Trunk as i32
                && spec.logical_bridges == ["logicalBridges/blue"]
                && spec.mac_address.is_empty(),
            "{spec:?}"
        );
        // A tenant without a VLAN ID is no bridge.
        c.tenants
            .create_tenant(pb::CreateTenantRequest {
                tenant_id: "plain".into(),
                tenant: Some(pb::Tenant {
                    default_policy: pb::DefaultPolicy::Deny as i32,
                    ..Default::default()
                }),
            })
            .await?;
        refused(
            c.bridges
                .get_logical_bridge(get_bridge("logicalBridges/plain"))
                .await,
            Code::NotFound,
            "logicalBridges/plain",
        )?;

        // Refusals name OPI's fields.
        refused(
            c.bridges
                .create_logical_bridge(bridge("lb3", 20, None, None))
                .await,
            Code::AlreadyExists,
            "logical_bridge.spec.vlan_id",
        )?;
        refused(
            c.bridges
                .create_logical_bridge(bridge("lb3", 0, None, None))
                .await,
            Code::InvalidArgument,
            "logical_bridge.spec.vlan_id",
        )?;
        refused(
            c.bridges
                .create_logical_bridge(bridge("lb3", 40, Some(100), None))
                .await,
            Code::FailedPrecondition,
            "logical_bridge.spec.vni: no port has a VTEP address",
        )?;
        refused(
            c.bridges
                .create_logical_bridge(bridge("lb3", 40, None, Some(v4_prefix([192, 0, 2, 1], 24))))
                .await,
            Code::InvalidArgument,
            "logical_bridge.spec.vtep_ip_prefix",
        )?;
        refused(
            c.ports
                .create_bridge_port(bridge_port("p0", &MAC_A, Access, &["lb2"]))
                .await,
            Code::FailedPrecondition,
            "bridge_port_id: ports/p0 is an uplink",
        )?;
        refused(
            c.ports
                .create_bridge_port(bridge_port("pf0vf0", &MAC_A, Access, &["lb2"]))
                .await,
            Code::AlreadyExists,
            "bridgePorts/pf0vf0",
        )?;
        refused(
            c.ports
                .create_bridge_port(bridge_port(
                    "pf0vf1",
                    &[1, 0, 0x5e, 0, 0, 1],
                    Access,
                    &["lb2"],
                ))
                .await,
            Code::InvalidArgument,
            "bridge_port.spec.mac_address",
        )?;
        refused(
            c.ports
                .create_bridge_port(bridge_port("pf0vf1", &MAC_A, Access, &["lb1", "lb2"]))
                .await,
            Code::InvalidArgument,
            "bridge_port.spec.logical_bridges",
        )?;
        refused(
            c.bridges
                .delete_logical_bridge(evpn::DeleteLogicalBridgeRequest {
                    name: "logicalBridges/lb1".into(),
                    allow_missing: false,
                })
                .await,
            Code::FailedPrecondition,
            "bridgePorts/pf0vf0",
        )?;
        refused(
            c.bridges
                .update_logical_bridge(evpn::UpdateLogicalBridgeRequest {
                    logical_bridge: Some(evpn::LogicalBridge {
                        name: "logicalBridges/lb1".into(),
                        spec: Some(evpn::LogicalBridgeSpec {
                            vlan_id: 11,
                            ..Default::default()
                        }),
                        status: None,
                    }),
                    update_mask: Some(FieldMask {
                        paths: vec!["spec.vlan_id".into()],
                    }),
                    allow_missing: false,
                })
                .await,
            Code::InvalidArgument,
            "logical_bridge.spec.vlan_id",
        )?;
        refused(
            c.vrfs.create_vrf(evpn::CreateVrfRequest::default()).await,
            Code::Unimplemented,
            "routing is not offered",
        )?;
        refused(
            c.svis.list_svis(evpn::ListSvisRequest::default()).await,
            Code::Unimplemented,
            "routing is not offered",
        )?;

        // Paging: lb1, lb2, blue, in ID order, two at a time.
        let page = c
            .bridges
            .list_logical_bridges(evpn::ListLogicalBridgesRequest {
                page_size: 2,
                page_token: String::new(),
            })
            .await?
            .into_inner();
        let rest = c
            .bridges
            .list_logical_bridges(evpn::ListLogicalBridgesRequest {
                page_size: 2,
                page_token: page.next_page_token.clone(),
            })
            .await?
            .into_inner();
        let names: Vec<&str> = page
            .logical_bridges
            .iter()
            .chain(&rest.logical_bridges)
            .map(|b| b.name.as_str())
            .collect();
        ensure!(
            names
                == [
                    "logicalBridges/blue",
                    "logicalBridges/lb1",
                    "logicalBridges/lb2"
                ]
                && !page.next_page_token.is_empty()
                && rest.next_page_token.is_empty(),
            "{page:?} {rest:?}"
        );
        let page = c
            .ports
            .list_bridge_ports(evpn::ListBridgePortsRequest {
                page_size: 1,
                page_token: String::new(),
            })
            .await?
            .into_inner();
        ensure!(
            page.bridge_ports.len() == 1 && !page.next_page_token.is_empty(),
            "{page:?}"
        );
        both_views(&mut c).await
    })?;

    svc.restart()?;
    with_clients(&svc, |mut c| async move {
        let after = both_views(&mut c).await?;
        ensure!(
            after == before,
            "before the restart:\n{before}\nafter:\n{after}"
        );

        // Delete: the bridge port goes from the tenant, then the bridge
        // with its tenant.
        c.ports
            .delete_bridge_port(evpn::DeleteBridgePortRequest {
                name: "bridgePorts/pf0vf0".into(),
                allow_missing: false,
            })
            .await?;
        let t = c
            .tenants
            .get_tenant(get_tenant("tenants/lb1"))
            .await?
            .into_inner();
        ensure!(port_attachments(&t).is_empty(), "{t:?}");
        refused(
            c.ports
                .get_bridge_port(get_port("bridgePorts/pf0vf0"))
                .await,
            Code::NotFound,
            "bridgePorts/pf0vf0",
        )?;
        c.ports
            .delete_bridge_port(evpn::DeleteBridgePortRequest {
                name: "bridgePorts/pf0vf0".into(),
                allow_missing: true,
            })
            .await?;
        c.bridges
            .delete_logical_bridge(evpn::DeleteLogicalBridgeRequest {
                name: "logicalBridges/lb1".into(),
                allow_missing: false,
            })
            .await?;
        refused(
            c.tenants.get_tenant(get_tenant("tenants/lb1")).await,
            Code::NotFound,
            "tenants/lb1",
        )?;
        c.bridges
            .delete_logical_bridge(evpn::DeleteLogicalBridgeRequest {
                name: "logicalBridges/lb1".into(),
                allow_missing: true,
            })
            .await?;
        Ok(())
    })?;
    // OPI's calls (since the restart) are counted as dpu.v1's are.
    let m = svc.http_get("/metrics")?.1;
    ensure!(
        m.contains("opi_api.network.evpn_gw.v1alpha1.BridgePortService/DeleteBridgePort"),
        "the OPI calls are not counted:\n{m}"
    );
    Ok(())
}

#[test]
fn a_reader_reads_bridges_and_changes_none() -> Result<()> {
    let config = format!("{TEST_CONFIG}\n[grpc]\nanonymous_role = \"reader\"\n");
    let svc = Service::start_config(&config, &[])?;
    with_clients(&svc, |mut c| async move {
        let listed = c
            .bridges
            .list_logical_bridges(evpn::ListLogicalBridgesRequest::default())
            .await?
            .into_inner();
        ensure!(listed.logical_bridges.is_empty(), "{listed:?}");
        c.ports
            .list_bridge_ports(evpn::ListBridgePortsRequest::default())
            .await?;
        refused(
            c.bridges
                .create_logical_bridge(bridge("lb1", 10, None, None))
                .await,
            Code::PermissionDenied,
            "",
        )?;
        refused(
            c.ports
                .create_bridge_port(bridge_port("pf0vf0", &MAC_A, Access, &["lb1"]))
                .await,
            Code::PermissionDenied,
            "",
        )?;
        refused(
            c.bridges
                .delete_logical_bridge(evpn::DeleteLogicalBridgeRequest {
                    name: "logicalBridges/lb1".into(),
                    allow_missing: true,
                })
                .await,
            Code::PermissionDenied,
            "",
        )?;
        refused(
            c.vrfs.create_vrf(evpn::CreateVrfRequest::default()).await,
            Code::PermissionDenied,
            "",
        )?;
        let t = c
            .tenants
            .list_tenants(pb::ListTenantsRequest::default())
            .await?
            .into_inner();
        ensure!(t.tenants.is_empty(), "a reader made a tenant: {t:?}");
        Ok(())
    })
}

/// A MAC address as the kernel prints it, as bytes.
fn mac_bytes(s: &str) -> Result<[u8; 6]> {
    let v: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16))
        .collect::<std::result::Result<_, _>>()?;
    v.try_into()
        .map_err(|v| anyhow::anyhow!("{s} is not a MAC address: {v:?}"))
}

/// The acceptance test: a logical bridge and bridge ports made through
/// OPI carry traffic between two stations of the tenant they map to,
/// a station of another bridge reaches neither, and a station sending
/// from another MAC address than its bridge port's is dropped. On the
/// kernel driver, beside an uplink with a VTEP whose VXLAN network a
/// bridge made through OPI gets.
#[test]
fn opi_bridge_ports_carry_their_bridges_traffic_only() -> Result<()> {
    let a = Host::new("ba", "10.236.0.1/24")?;
    let b = Host::new("bb", "10.236.0.2/24")?;
    let c = Host::new("bc", "10.236.0.3/24")?;
    let underlay = Host::new("bu", "192.0.2.2/24")?;
    let mut config = "[dataplane]\nworkers = 1\nidle = \"backoff\"\nmbufs = 4096\n".to_string();
    config += &format!(
        "\n[[ports]]\nid = \"p0\"\nrole = \"uplink\"\ndriver = \"kernel\"\ndevice = \"{}\"\nvtep_address = \"192.0.2.1\"\n",
        underlay.port_if
    );
    for (id, h) in [("pf0vf0", &a), ("pf0vf1", &b), ("pf0vf2", &c)] {
        config += &format!(
            "\n[[ports]]\nid = \"{id}\"\nrole = \"vf\"\ndriver = \"kernel\"\ndevice = \"{}\"\n",
            h.port_if
        );
    }
    let svc = Service::start_config(&config, &[])?;
    let macs = [
        mac_bytes(&crate::switch::host_mac(&a)?)?,
        mac_bytes(&crate::switch::host_mac(&b)?)?,
        mac_bytes(&crate::switch::host_mac(&c)?)?,
    ];
    ensure!(!a.ping("10.236.0.2"), "crossed without a bridge");
    with_clients(&svc, |mut cl| async move {
        let lb1 = cl
            .bridges
            .create_logical_bridge(bridge(
                "lb1",
                100,
                Some(5100),
                Some(v4_prefix([192, 0, 2, 1], 24)),
            ))
            .await?
            .into_inner();
        ensure!(
            lb1.spec
                == Some(evpn::LogicalBridgeSpec {
                    vlan_id: 100,
                    vni: Some(5100),
                    vtep_ip_prefix: Some(v4_prefix([192, 0, 2, 1], 24)),
                }),
            "{lb1:?}"
        );
        let t = cl
            .tenants
            .get_tenant(get_tenant("tenants/lb1"))
            .await?
            .into_inner();
        let vx = t.attachments.iter().find_map(|a| match &a.kind {
            Some(pb::attachment::Kind::Vxlan(v)) => Some(v.clone()),
            _ => None,
        });
        ensure!(
            vx.as_ref().is_some_and(|v| v.uplink == "ports/p0"
                && v.vni == 5100
                && v.underlay_prefixes == ["192.0.2.0/24"]),
            "{t:?}"
        );
        refused(
            cl.bridges
                .create_logical_bridge(bridge(
                    "lb3",
                    300,
                    Some(5300),
                    Some(v4_prefix([198, 51, 100, 1], 24)),
                ))
                .await,
            Code::FailedPrecondition,
            "logical_bridge.spec.vtep_ip_prefix: no port has the VTEP address 198.51.100.1",
        )?;
        cl.bridges
            .create_logical_bridge(bridge("lb2", 200, None, None))
            .await?;
        for (port, mac, lb) in [
            ("pf0vf0", macs[0], "lb1"),
            ("pf0vf1", macs[1], "lb1"),
            ("pf0vf2", macs[2], "lb2"),
        ] {
            cl.ports
                .create_bridge_port(bridge_port(port, &mac, Access, &[lb]))
                .await?;
        }
        Ok(())
    })?;

    eventually("the stations of lb1 to reach each other", || {
        a.ping("10.236.0.2")
    })?;
    ensure!(b.ping("10.236.0.1"), "B does not reach A");
    ensure!(!c.ping("10.236.0.1"), "lb2's station reached A");
    ensure!(!c.ping("10.236.0.2"), "lb2's station reached B");

    // Another source MAC on A's interface: dropped at its bridge port.
    let spoofed = || -> u64 {
        svc.http_get("/metrics").map_or(0, |(_, body)| {
            metric(&body, "dpu_dropped_packets_total{reason=\"spoofed\"}")
        })
    };
    let before = spoofed();
    ip(&[
        "-n",
        &a.ns.name,
        "link",
        "set",
        "dev",
        &format!("{}p", a.port_if),
        "address",
        "02:00:00:00:99:01",
    ])?;
    ensure!(!a.ping("10.236.0.2"), "a forged source MAC got through");
    eventually("spoofed drops to be counted", || spoofed() >= before + 2)?;

    // The bridge port takes the new MAC address: A gets through again.
    with_clients(&svc, |mut cl| async move {
        cl.ports
            .update_bridge_port(evpn::UpdateBridgePortRequest {
                bridge_port: Some(evpn::BridgePort {
                    name: "bridgePorts/pf0vf0".into(),
                    spec: Some(evpn::BridgePortSpec {
                        mac_address: vec![0x02, 0, 0, 0, 0x99, 0x01],
                        ..Default::default()
                    }),
                    status: None,
                }),
                update_mask: Some(FieldMask {
                    paths: vec!["spec.mac_address".into()],
                }),
                allow_missing: false,
            })
            .await?;
        Ok(())
    })?;
    eventually("A to reach B from its new MAC address", || {
        a.ping("10.236.0.2")
    })?;
    ensure!(!c.ping("10.236.0.1"), "lb2's station reached A");
    Ok(())
}
