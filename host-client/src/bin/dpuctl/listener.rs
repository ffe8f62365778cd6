//! `dpuctl listener`: its subcommands and flags, and their handler.

use clap::{Subcommand, ValueEnum};
use dpu_client::{listener_name, pb, subsystem_name, DpuClient};

use crate::common::{all_pages, deleted, json, Paging, Shown};
use crate::{render, Failure};

#[derive(Debug, Subcommand)]
pub enum ListenerCmd {
    /// Creates a listener.
    Create {
        /// Subsystem ID.
        subsystem: String,
        /// IP address to listen on.
        #[arg(long)]
        address: String,
        /// TCP port (default 4420).
        #[arg(long)]
        port: Option<u32>,
        /// Listener ID (derived from address and port if absent).
        #[arg(long)]
        id: Option<String>,
        /// Tenant whose network the listener is a storage endpoint in
        /// (`--address` is then an IPv4 or IPv6 address of that network); absent
        /// for the service's own sockets.
        #[arg(long)]
        tenant: Option<String>,
        /// Whether the listener speaks TLS; listeners on one address and
        /// port agree on it.
        #[arg(long, value_enum)]
        secure_channel: Option<SecureChannelArg>,
    },
    /// Lists a subsystem's listeners.
    List {
        /// Subsystem ID.
        subsystem: String,
        #[command(flatten)]
        paging: Paging,
    },
    /// Deletes a listener.
    Delete {
        /// Subsystem ID.
        subsystem: String,
        /// Listener ID.
        id: String,
    },
}

/// Whether a listener speaks TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SecureChannelArg {
    /// Clear text only (the default).
    None,
    /// TLS or clear text, as each host chooses.
    Allowed,
    /// TLS only.
    Required,
}

impl SecureChannelArg {
    fn proto(self) -> i32 {
        let c = match self {
            SecureChannelArg::None => pb::SecureChannel::None,
            SecureChannelArg::Allowed => pb::SecureChannel::Allowed,
            SecureChannelArg::Required => pb::SecureChannel::Required,
        };
        c as i32
    }
}

/// `dpuctl listener ...`.
pub async fn execute(c: &DpuClient, cmd: &ListenerCmd) -> Result<Shown, Failure> {
    Ok(match cmd {
        ListenerCmd::Create {
            subsystem,
            address,
            port,
            id,
            tenant,
            secure_channel,
        } => {
            let l = pb::Listener {
                transport: pb::Transport::Tcp as i32,
                address: address.clone(),
                port: port.unwrap_or(0),
                tenant: tenant.clone().unwrap_or_default(),
                secure_channel: secure_channel.map_or(0, SecureChannelArg::proto),
                ..Default::default()
            };
            let l = c
                .create_listener(pb::CreateListenerRequest {
                    parent: subsystem_name(subsystem),
                    listener_id: id.clone().unwrap_or_default(),
                    listener: Some(l),
                })
                .await?;
            Shown {
                json: json(&l),
                text: render::listeners(std::slice::from_ref(&l)),
            }
        }
        ListenerCmd::List { subsystem, paging } => {
            let parent = subsystem_name(subsystem);
            let all = all_pages(|page_token| {
                let parent = parent.clone();
                async move {
                    let r = c
                        .list_listeners(pb::ListListenersRequest {
                            parent,
                            page_size: paging.page_size,
                            page_token,
                        })
                        .await?;
                    Ok((r.listeners, r.next_page_token))
                }
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::listeners(&all),
            }
        }
        ListenerCmd::Delete { subsystem, id } => {
            c.delete_listener(pb::DeleteListenerRequest {
                name: listener_name(subsystem, id),
            })
            .await?;
            deleted(listener_name(subsystem, id))
        }
    })
}
