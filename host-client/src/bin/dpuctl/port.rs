//! `dpuctl port`: its subcommands and flags, and their handler.

use clap::Subcommand;
use dpu_client::{pb, port_name, tenant_name, DpuClient};

use crate::common::{all_pages, json, Paging, Shown};
use crate::{render, Failure};

#[derive(Debug, Subcommand)]
pub enum PortCmd {
    /// Lists ports.
    List(Paging),
    /// Shows a port.
    Get {
        /// Port ID.
        id: String,
    },
    /// Attaches a port (or a VLAN of it) to a tenant.
    Attach {
        /// Port ID.
        port: String,
        /// Tenant ID.
        #[arg(long)]
        tenant: String,
        /// VLAN ID (0 or absent: the whole port).
        #[arg(long, default_value_t = 0)]
        vlan: u32,
    },
    /// Detaches a port (or a VLAN of it) from its tenant.
    Detach {
        /// Port ID.
        port: String,
        /// VLAN ID (0 or absent: the whole port).
        #[arg(long, default_value_t = 0)]
        vlan: u32,
    },
}

/// `dpuctl port ...`.
pub async fn execute(c: &DpuClient, cmd: &PortCmd) -> Result<Shown, Failure> {
    Ok(match cmd {
        PortCmd::List(Paging { page_size }) => {
            let all = all_pages(|page_token| async move {
                let r = c
                    .list_ports(pb::ListPortsRequest {
                        page_size: *page_size,
                        page_token,
                    })
                    .await?;
                Ok((r.ports, r.next_page_token))
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::ports(&all),
            }
        }
        PortCmd::Get { id } => {
            let p = c
                .get_port(pb::GetPortRequest {
                    name: port_name(id),
                })
                .await?;
            Shown {
                json: json(&p),
                text: render::ports(std::slice::from_ref(&p)),
            }
        }
        PortCmd::Attach { port, tenant, vlan } => {
            let t = c
                .attach_port(pb::AttachPortRequest {
                    port: port_name(port),
                    vlan_id: *vlan,
                    tenant: tenant_name(tenant),
                })
                .await?;
            Shown {
                json: json(&t),
                text: render::tenants(std::slice::from_ref(&t)),
            }
        }
        PortCmd::Detach { port, vlan } => {
            let t = c
                .detach_port(pb::DetachPortRequest {
                    port: port_name(port),
                    vlan_id: *vlan,
                })
                .await?;
            Shown {
                json: json(&t),
                text: render::tenants(std::slice::from_ref(&t)),
            }
        }
    })
}
