//! `dpu.v1.PortService`.

use dpu_proto::v1 as pb;
use dpu_proto::v1::port_service_server::PortService;
use tonic::{Request, Response, Status};

use super::{caller, may_change_tenant, paginate, Api, PAGES};
use crate::convert;
use crate::error::ControlError;
use crate::model::{Attachment, PortSpec, State};
use crate::telemetry::Counters;
use crate::validate;

impl Api {
    /// A port message with live status and counters from the data plane.
    fn port_message(&self, p: &PortSpec, state: &State, c: &Counters) -> pb::Port {
        let mut m = convert::port(p, state);
        if let Some(s) = c.port_status.get(&p.id) {
            m.link_state = match s.link_up {
                Some(true) => pb::LinkState::Up,
                Some(false) => pb::LinkState::Down,
                None => pb::LinkState::Unspecified,
            } as i32;
            m.speed_mbps = s.speed_mbps;
            m.mac_address.clone_from(&s.mac_address);
            m.mtu = s.mtu;
        }
        if let Some(pc) = c.ports.get(&p.id) {
            m.counters = Some(*pc);
        }
        m
    }
}

#[tonic::async_trait]
impl PortService for Api {
    async fn list_ports(
        &self,
        req: Request<pb::ListPortsRequest>,
    ) -> Result<Response<pb::ListPortsResponse>, Status> {
        self.read("/dpu.v1.PortService/ListPorts", async {
            let req = req.into_inner();
            let state = self.ctl.state.snapshot();
            let counters = self.ctl.telemetry.collect();
            let items = self.ctl.ports.values().map(|p| (p.id.as_str(), p));
            let (ports, next_page_token) =
                paginate(items, req.page_size, &req.page_token, PAGES, |p| {
                    self.port_message(p, &state, &counters)
                })?;
            Ok(pb::ListPortsResponse {
                ports,
                next_page_token,
            })
        })
        .await
    }

    async fn get_port(
        &self,
        req: Request<pb::GetPortRequest>,
    ) -> Result<Response<pb::Port>, Status> {
        self.read("/dpu.v1.PortService/GetPort", async {
            let id = validate::name("name", &req.get_ref().name, "ports")?;
            let p = self
                .ctl
                .ports
                .get(id)
                .ok_or_else(|| ControlError::NotFound(format!("ports/{id}")))?;
            Ok(self.port_message(p, &self.ctl.state.snapshot(), &self.ctl.telemetry.collect()))
        })
        .await
    }

    async fn attach_port(
        &self,
        req: Request<pb::AttachPortRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        const METHOD: &str = "/dpu.v1.PortService/AttachPort";
        self.write(METHOD, async {
            let who = caller(&req);
            let req = req.into_inner();
            let port = validate::name("port", &req.port, "ports")?.to_string();
            let vlan = validate::vlan("vlan_id", req.vlan_id)?;
            let tid = validate::name("tenant", &req.tenant, "tenants")?.to_string();
            self.may_change_tenant(who.as_deref(), METHOD, &tid)?;
            let ctl = self.ctl.clone();
            let t = self
                .change_tenant(move |s| {
                    let t = s.attach(
                        ctl.limits,
                        &ctl.ports,
                        &tid,
                        Attachment::port_vlan(&port, vlan),
                    )?;
                    Ok((convert::tenant(t), tid))
                })
                .await?;
            Ok(t)
        })
        .await
    }

    async fn detach_port(
        &self,
        req: Request<pb::DetachPortRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        const METHOD: &str = "/dpu.v1.PortService/DetachPort";
        self.write(METHOD, async {
            let who = caller(&req);
            let req = req.into_inner();
            let port = validate::name("port", &req.port, "ports")?.to_string();
            let vlan = validate::vlan("vlan_id", req.vlan_id)?;
            let telemetry = self.ctl.telemetry.clone();
            let t = self
                .change_tenant(move |s| {
                    // The attachment's tenant is known only here: check it
                    // before anything changes.
                    let owner = s
                        .tenants
                        .values()
                        .find(|t| t.attachments.iter().any(|a| a.is_port_vlan(&port, vlan)));
                    // (One nobody holds is not found, which any reader
                    // could learn from the tenants' listing.)
                    if let Some(owner) = owner {
                        may_change_tenant(&telemetry, who.as_deref(), METHOD, &owner.id)?;
                    }
                    let t = s.detach(&port, vlan)?;
                    Ok((convert::tenant(t), t.id.clone()))
                })
                .await?;
            Ok(t)
        })
        .await
    }
}
