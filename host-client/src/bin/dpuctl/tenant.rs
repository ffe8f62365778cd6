//! `dpuctl tenant`: its subcommands and flags, and their handler; also the
//! parsers of the attachments `--port` and `--vxlan` give.

use clap::{ArgGroup, Args, Subcommand, ValueEnum};
use dpu_client::{pb, port_name, tenant_name, DpuClient};
use dpu_proto::text::port_attachment;

use crate::common::{all_pages, deleted, json, mask, Paging, Shown};
use crate::qos::QosArgs;
use crate::{render, Failure};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Policy {
    Allow,
    Deny,
}

#[derive(Debug, Args)]
pub struct TenantFields {
    /// Human-readable name.
    #[arg(long)]
    pub display_name: Option<String>,
    /// Verdict for packets no rule matches.
    #[arg(long, value_enum)]
    pub default_policy: Option<Policy>,
    /// Attach a port, or one VLAN of it: PORT or PORT.VLAN (repeatable),
    /// optionally with anti-spoofing: `,mac=MAC` and `,ip=PREFIX` (each
    /// repeatable) list the only source MACs and IP prefixes it may send
    /// from, e.g. `pf0vf0,mac=02:00:00:00:00:01,ip=10.0.0.1/32`.
    #[arg(
        long = "port",
        value_name = "PORT[.VLAN][,mac=MAC][,ip=PREFIX]",
        value_parser = port_attachment
    )]
    pub ports: Vec<pb::Attachment>,
    /// Attach a VXLAN network on an uplink: UPLINK:VNI, or
    /// UPLINK:VNI:VTEP[,VTEP...] with the remote VTEPs that get its
    /// flooded frames; an entry with a length (198.51.100.0/24) is an
    /// underlay prefix whose VTEPs may also send into it. VXLAN from any
    /// other address is dropped (repeatable).
    #[arg(long = "vxlan", value_name = "UPLINK:VNI[:VTEPS]", value_parser = vxlan_attachment)]
    pub vxlans: Vec<pb::Attachment>,
    /// The VLAN ID of the tenant's network on trunk ports, 1..4094,
    /// unique among tenants (OPI's logical bridge); 0 for none.
    #[arg(long, value_name = "VLAN")]
    pub vlan_id: Option<u32>,
    /// Whether the tenant's established connections may be handed to flow
    /// hardware (`dataplane.offload`): on (the default) or off, to keep
    /// every packet of the tenant on the cores.
    #[arg(long, value_name = "on|off", value_parser = clap::builder::BoolishValueParser::new())]
    pub offload: Option<bool>,
}

#[derive(Debug, Subcommand)]
pub enum TenantCmd {
    /// Creates a tenant.
    Create {
        /// Tenant ID.
        id: String,
        #[command(flatten)]
        fields: TenantFields,
    },
    /// Shows a tenant.
    Get {
        /// Tenant ID.
        id: String,
    },
    /// Lists tenants.
    List(Paging),
    /// Changes a tenant; only the fields given change.
    #[command(group(
        ArgGroup::new("change")
            .required(true)
            .multiple(true)
            .args(["display_name", "default_policy", "ports", "vxlans", "clear_attachments", "vlan_id", "offload"])
    ))]
    Update {
        /// Tenant ID.
        id: String,
        #[command(flatten)]
        fields: TenantFields,
        /// Remove every attachment (with --port/--vxlan: replace them).
        #[arg(long)]
        clear_attachments: bool,
    },
    /// Sets the limits on all the storage I/O of the tenant's storage
    /// endpoints together, on top of each namespace's and host's,
    /// replacing what it had: a limit not given is none, so no flag at all
    /// clears them. Takes effect at once, without reconnecting.
    SetStorageQos {
        /// Tenant ID.
        id: String,
        #[command(flatten)]
        qos: QosArgs,
    },
    /// Deletes a tenant.
    Delete {
        /// Tenant ID.
        id: String,
        /// Also delete its rules and release its attachments.
        #[arg(long)]
        force: bool,
    },
}

/// `--vxlan UPLINK:VNI[:VTEP,...]`.
fn vxlan_attachment(s: &str) -> Result<pb::Attachment, String> {
    let (uplink, rest) = s
        .split_once(':')
        .filter(|(u, _)| !u.is_empty())
        .ok_or("expected UPLINK:VNI[:VTEP,...]")?;
    let (vni, vteps) = rest.split_once(':').unwrap_or((rest, ""));
    let vni = vni
        .parse()
        .map_err(|_| format!("VNI {vni:?} is not a number"))?;
    // An entry with a prefix length is an underlay prefix.
    let (prefixes, vteps): (Vec<&str>, Vec<&str>) = vteps
        .split(',')
        .filter(|v| !v.is_empty())
        .partition(|v| v.contains('/'));
    Ok(pb::Attachment {
        kind: Some(pb::attachment::Kind::Vxlan(pb::VxlanAttachment {
            uplink: port_name(uplink),
            vni,
            remote_vteps: vteps.into_iter().map(str::to_string).collect(),
            underlay_prefixes: prefixes.into_iter().map(str::to_string).collect(),
        })),
    })
}

/// Every attachment given, ports first.
pub fn attachments(f: &TenantFields) -> Vec<pb::Attachment> {
    f.ports.iter().chain(&f.vxlans).cloned().collect()
}

fn policy(p: Option<Policy>) -> i32 {
    match p {
        Some(Policy::Allow) => pb::DefaultPolicy::Allow as i32,
        Some(Policy::Deny) => pb::DefaultPolicy::Deny as i32,
        None => pb::DefaultPolicy::Unspecified as i32,
    }
}

/// `dpuctl tenant ...`.
pub async fn execute(c: &DpuClient, cmd: &TenantCmd) -> Result<Shown, Failure> {
    let one = |t: pb::Tenant| Shown {
        json: json(&t),
        text: render::tenants(std::slice::from_ref(&t)),
    };
    Ok(match cmd {
        TenantCmd::Create { id, fields } => {
            let t = pb::Tenant {
                display_name: fields.display_name.clone().unwrap_or_default(),
                attachments: attachments(fields),
                default_policy: policy(fields.default_policy),
                vlan_id: fields.vlan_id.unwrap_or(0),
                no_offload: fields.offload == Some(false),
                ..Default::default()
            };
            one(c
                .create_tenant(pb::CreateTenantRequest {
                    tenant_id: id.clone(),
                    tenant: Some(t),
                })
                .await?)
        }
        TenantCmd::Get { id } => one(c
            .get_tenant(pb::GetTenantRequest {
                name: tenant_name(id),
            })
            .await?),
        TenantCmd::List(Paging { page_size }) => {
            let all = all_pages(|page_token| async move {
                let r = c
                    .list_tenants(pb::ListTenantsRequest {
                        page_size: *page_size,
                        page_token,
                    })
                    .await?;
                Ok((r.tenants, r.next_page_token))
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::tenants(&all),
            }
        }
        TenantCmd::Update {
            id,
            fields,
            clear_attachments,
        } => {
            let mut paths = Vec::new();
            if fields.display_name.is_some() {
                paths.push("display_name");
            }
            if fields.default_policy.is_some() {
                paths.push("default_policy");
            }
            if *clear_attachments || !fields.ports.is_empty() || !fields.vxlans.is_empty() {
                paths.push("attachments");
            }
            if fields.vlan_id.is_some() {
                paths.push("vlan_id");
            }
            if fields.offload.is_some() {
                paths.push("no_offload");
            }
            if paths.is_empty() {
                return Err(Failure::Input(
                    "nothing to update: give --display-name, --default-policy, --port, --vxlan, --vlan-id, --offload or --clear-attachments".into(),
                ));
            }
            let t = pb::Tenant {
                name: tenant_name(id),
                display_name: fields.display_name.clone().unwrap_or_default(),
                attachments: attachments(fields),
                default_policy: policy(fields.default_policy),
                vlan_id: fields.vlan_id.unwrap_or(0),
                no_offload: fields.offload == Some(false),
                ..Default::default()
            };
            one(c
                .update_tenant(pb::UpdateTenantRequest {
                    tenant: Some(t),
                    update_mask: mask(&paths),
                })
                .await?)
        }
        TenantCmd::SetStorageQos { id, qos } => one(c
            .set_tenant_storage_qos(pb::SetTenantStorageQosRequest {
                tenant: tenant_name(id),
                qos: Some(qos.limits()),
            })
            .await?),
        TenantCmd::Delete { id, force } => {
            c.delete_tenant(pb::DeleteTenantRequest {
                name: tenant_name(id),
                force: *force,
            })
            .await?;
            deleted(tenant_name(id))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse() {
        // PORT[.VLAN], ranges, protocols and rates: see dpu_proto::text.
        assert!(
            matches!(vxlan_attachment("p0:5001").unwrap().kind, Some(pb::attachment::Kind::Vxlan(v)) if v.uplink == "ports/p0" && v.vni == 5001)
        );
        assert!(
            matches!(vxlan_attachment("p0:7:192.0.2.2,192.0.2.3").unwrap().kind, Some(pb::attachment::Kind::Vxlan(v)) if v.vni == 7 && v.remote_vteps == ["192.0.2.2", "192.0.2.3"])
        );
        assert!(
            matches!(vxlan_attachment("p0:7:192.0.2.2,198.51.100.0/24").unwrap().kind, Some(pb::attachment::Kind::Vxlan(v)) if v.remote_vteps == ["192.0.2.2"] && v.underlay_prefixes == ["198.51.100.0/24"])
        );
        assert!(vxlan_attachment("p0").is_err());
        assert!(vxlan_attachment(":5").is_err());
    }
}
