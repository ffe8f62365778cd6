//! `dpuctl subsystem`: its subcommands and flags, and their handler; the
//! allowed hosts of a subsystem are among them (`add-host`, `remove-host`).

use clap::{ArgGroup, Subcommand};
use dpu_client::{pb, subsystem_name, DpuClient};

use crate::common::{all_pages, deleted, json, mask, Paging, Shown};
use crate::{render, Failure};

#[derive(Debug, Subcommand)]
pub enum SubsystemCmd {
    /// Creates a subsystem.
    Create {
        /// Subsystem ID.
        id: String,
        /// NVMe Qualified Name.
        #[arg(long)]
        nqn: String,
        /// Serial number (generated if absent).
        #[arg(long)]
        serial: Option<String>,
        /// Model number.
        #[arg(long)]
        model: Option<String>,
        /// Let any host connect.
        #[arg(long)]
        allow_any_host: bool,
        /// Allowed host NQN (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Largest namespace ID.
        #[arg(long)]
        max_namespaces: Option<u32>,
    },
    /// Shows a subsystem.
    Get {
        /// Subsystem ID.
        id: String,
    },
    /// Lists subsystems.
    List(Paging),
    /// Changes a subsystem; only the fields given change.
    #[command(group(
        ArgGroup::new("change")
            .required(true)
            .multiple(true)
            .args(["allow_any_host", "model", "hosts", "clear_hosts"])
    ))]
    Update {
        /// Subsystem ID.
        id: String,
        /// Let any host connect (true/false).
        #[arg(long)]
        allow_any_host: Option<bool>,
        /// Model number.
        #[arg(long)]
        model: Option<String>,
        /// Replace the allow list with these hosts (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Empty the allow list.
        #[arg(long)]
        clear_hosts: bool,
    },
    /// Deletes a subsystem.
    Delete {
        /// Subsystem ID.
        id: String,
        /// Also delete its namespaces and listeners.
        #[arg(long)]
        force: bool,
    },
    /// Allows a host NQN.
    AddHost {
        /// Subsystem ID.
        id: String,
        /// Host NQN.
        nqn: String,
    },
    /// Removes a host NQN from the allow list.
    RemoveHost {
        /// Subsystem ID.
        id: String,
        /// Host NQN.
        nqn: String,
    },
}

/// `dpuctl subsystem ...`.
pub async fn execute(c: &DpuClient, cmd: &SubsystemCmd) -> Result<Shown, Failure> {
    let one = |s: pb::Subsystem| Shown {
        json: json(&s),
        text: render::subsystems(std::slice::from_ref(&s)),
    };
    Ok(match cmd {
        SubsystemCmd::Create {
            id,
            nqn,
            serial,
            model,
            allow_any_host,
            hosts,
            max_namespaces,
        } => {
            let s = pb::Subsystem {
                nqn: nqn.clone(),
                serial_number: serial.clone().unwrap_or_default(),
                model_number: model.clone().unwrap_or_default(),
                allow_any_host: *allow_any_host,
                allowed_hosts: hosts.clone(),
                max_namespaces: max_namespaces.unwrap_or(0),
                ..Default::default()
            };
            one(c
                .create_subsystem(pb::CreateSubsystemRequest {
                    subsystem_id: id.clone(),
                    subsystem: Some(s),
                })
                .await?)
        }
        SubsystemCmd::Get { id } => one(c
            .get_subsystem(pb::GetSubsystemRequest {
                name: subsystem_name(id),
            })
            .await?),
        SubsystemCmd::List(Paging { page_size }) => {
            let all = all_pages(|page_token| async move {
                let r = c
                    .list_subsystems(pb::ListSubsystemsRequest {
                        page_size: *page_size,
                        page_token,
                    })
                    .await?;
                Ok((r.subsystems, r.next_page_token))
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::subsystems(&all),
            }
        }
        SubsystemCmd::Update {
            id,
            allow_any_host,
            model,
            hosts,
            clear_hosts,
        } => {
            let mut paths = Vec::new();
            if allow_any_host.is_some() {
                paths.push("allow_any_host");
            }
            if model.is_some() {
                paths.push("model_number");
            }
            if *clear_hosts || !hosts.is_empty() {
                paths.push("allowed_hosts");
            }
            if paths.is_empty() {
                return Err(Failure::Input(
                    "nothing to update: give --allow-any-host, --model, --host or --clear-hosts"
                        .into(),
                ));
            }
            let s = pb::Subsystem {
                name: subsystem_name(id),
                allow_any_host: allow_any_host.unwrap_or(false),
                model_number: model.clone().unwrap_or_default(),
                allowed_hosts: hosts.clone(),
                ..Default::default()
            };
            one(c
                .update_subsystem(pb::UpdateSubsystemRequest {
                    subsystem: Some(s),
                    update_mask: mask(&paths),
                })
                .await?)
        }
        SubsystemCmd::Delete { id, force } => {
            c.delete_subsystem(pb::DeleteSubsystemRequest {
                name: subsystem_name(id),
                force: *force,
            })
            .await?;
            deleted(subsystem_name(id))
        }
        SubsystemCmd::AddHost { id, nqn } => one(c
            .add_host(pb::AddHostRequest {
                subsystem: subsystem_name(id),
                host_nqn: nqn.clone(),
            })
            .await?),
        SubsystemCmd::RemoveHost { id, nqn } => one(c
            .remove_host(pb::RemoveHostRequest {
                subsystem: subsystem_name(id),
                host_nqn: nqn.clone(),
            })
            .await?),
    })
}
