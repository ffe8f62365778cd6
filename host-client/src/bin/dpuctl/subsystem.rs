//! `dpuctl subsystem`: its subcommands and flags, and their handler; the
//! allowed hosts of a subsystem are among them (`add-host`, `remove-host`),
//! their DH-HMAC-CHAP secrets (`set-auth`, `clear-auth`), their TLS
//! keys (`set-tls-key`, `clear-tls-key`) and their QoS limits
//! (`set-host-qos`).

use std::path::{Path, PathBuf};

use clap::{ArgGroup, Subcommand, ValueEnum};
use dpu_client::{pb, subsystem_name, DpuClient};

use crate::common::{all_pages, deleted, json, mask, Paging, Shown};
use crate::qos::QosArgs;
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
        /// Which hosts must authenticate with DH-HMAC-CHAP.
        #[arg(long, value_enum)]
        auth: Option<AuthArg>,
        /// Which hosts must connect over TLS (the secure channel).
        #[arg(long, value_enum)]
        tls: Option<TlsArg>,
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
            .args(["allow_any_host", "model", "hosts", "clear_hosts", "auth", "tls"])
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
        /// Which hosts must authenticate with DH-HMAC-CHAP.
        #[arg(long, value_enum)]
        auth: Option<AuthArg>,
        /// Which hosts must connect over TLS (the secure channel).
        #[arg(long, value_enum)]
        tls: Option<TlsArg>,
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
    /// Sets the DH-HMAC-CHAP secrets of an allowed host (replacing what
    /// it had); they take effect at its next authentication. Secrets are
    /// never shown back: output says only whether one is set and its hash.
    /// Prefer the `-file` flags, which keep secrets out of shell history.
    #[command(group(ArgGroup::new("secret").required(true).args(["dhchap_secret", "dhchap_secret_file"])))]
    SetAuth {
        /// Subsystem ID.
        id: String,
        /// Host NQN, one of the subsystem's allowed hosts.
        nqn: String,
        /// The host's secret, `DHHC-1:..:..:` as `nvme gen-dhchap-key` makes it.
        #[arg(long)]
        dhchap_secret: Option<String>,
        /// A file holding the host's secret.
        #[arg(long, conflicts_with = "dhchap_secret")]
        dhchap_secret_file: Option<PathBuf>,
        /// The controller's secret, for bidirectional authentication.
        #[arg(long)]
        dhchap_ctrl_secret: Option<String>,
        /// A file holding the controller's secret.
        #[arg(long, conflicts_with = "dhchap_ctrl_secret")]
        dhchap_ctrl_secret_file: Option<PathBuf>,
        /// Allowed hash function, most preferred first (repeatable; default all):
        /// sha256, sha384, sha512.
        #[arg(long = "hash")]
        hashes: Vec<String>,
        /// Allowed DH group, most preferred first (repeatable; default all):
        /// null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192.
        #[arg(long = "dh-group")]
        dh_groups: Vec<String>,
    },
    /// Removes the DH-HMAC-CHAP secrets of a host.
    ClearAuth {
        /// Subsystem ID.
        id: String,
        /// Host NQN.
        nqn: String,
    },
    /// Sets the TLS pre-shared key of an allowed host (replacing the one
    /// it had); it takes effect at the host's next TLS handshake. The key
    /// is never shown back: output says only its hash.
    SetTlsKey {
        /// Subsystem ID.
        id: String,
        /// Host NQN, one the subsystem allows.
        nqn: String,
        /// A file holding the key, `NVMeTLSkey-1:01:..:` as `nvme
        /// gen-tls-key` prints it.
        #[arg(long)]
        psk_file: PathBuf,
        /// How the host derives the TLS PSK when its identity is version
        /// 0 (`nvme connect --tls`'s default, which carries no digest to
        /// tell): spec, or compat for libnvme's earlier derivation (Debian
        /// 13's nvme-cli 2.13).
        #[arg(long, value_enum, default_value_t = DerivationArg::Spec)]
        v0_derivation: DerivationArg,
    },
    /// Removes the TLS pre-shared key of a host.
    ClearTlsKey {
        /// Subsystem ID.
        id: String,
        /// Host NQN.
        nqn: String,
    },
    /// Sets the QoS limits of a host on the subsystem, on its I/O to all
    /// the subsystem's namespaces over all its controllers together,
    /// replacing what it had: a limit not given is none, so no flag at
    /// all clears them. The host must be allowed (on the allow list, or
    /// any with --allow-any-host). Takes effect at once, without
    /// reconnecting.
    SetHostQos {
        /// Subsystem ID.
        id: String,
        /// Host NQN.
        nqn: String,
        #[command(flatten)]
        qos: QosArgs,
    },
}

/// Which hosts of a subsystem must authenticate.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum AuthArg {
    /// Hosts that have a secret (the default).
    HostsWithSecret,
    /// Every host: one without a secret cannot connect.
    Required,
    /// None, secrets or not.
    Disabled,
}

impl AuthArg {
    fn proto(self) -> i32 {
        let r = match self {
            AuthArg::HostsWithSecret => pb::AuthRequirement::Unspecified,
            AuthArg::Required => pb::AuthRequirement::Required,
            AuthArg::Disabled => pb::AuthRequirement::Disabled,
        };
        r as i32
    }
}

/// Which hosts of a subsystem must connect over TLS.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TlsArg {
    /// Hosts that have a key (the default).
    HostsWithKey,
    /// Every host: one without a key cannot connect.
    Required,
    /// None, keys or not.
    Disabled,
}

impl TlsArg {
    fn proto(self) -> i32 {
        let r = match self {
            TlsArg::HostsWithKey => pb::TlsRequirement::Unspecified,
            TlsArg::Required => pb::TlsRequirement::Required,
            TlsArg::Disabled => pb::TlsRequirement::Disabled,
        };
        r as i32
    }
}

/// How a host derives the TLS PSK of a version 0 identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DerivationArg {
    /// As the NVMe specification says (the default).
    Spec,
    /// As libnvme long did (Debian 13's nvme-cli 2.13).
    Compat,
}

impl DerivationArg {
    fn proto(self) -> i32 {
        let d = match self {
            DerivationArg::Spec => pb::TlsDerivation::Spec,
            DerivationArg::Compat => pb::TlsDerivation::Compat,
        };
        d as i32
    }
}

/// Longest secret file read: a `DHHC-1` secret is at most about 100 bytes.
const MAX_SECRET_FILE: u64 = 4096;

/// The secret given on the command line or in a file (trimmed), if any.
pub(crate) fn secret(given: Option<&String>, file: Option<&Path>) -> Result<String, Failure> {
    if let Some(s) = given {
        return Ok(s.clone());
    }
    let Some(path) = file else {
        return Ok(String::new());
    };
    let read = || -> std::io::Result<String> {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(path)?
            .take(MAX_SECRET_FILE + 1)
            .read_to_string(&mut text)?;
        Ok(text)
    };
    let text = read().map_err(|e| Failure::Input(format!("{}: {e}", path.display())))?;
    if text.len() as u64 > MAX_SECRET_FILE {
        return Err(Failure::Input(format!(
            "{}: longer than {MAX_SECRET_FILE} bytes; not a secret",
            path.display()
        )));
    }
    Ok(text.trim().to_string())
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
            auth,
            tls,
        } => {
            let s = pb::Subsystem {
                nqn: nqn.clone(),
                serial_number: serial.clone().unwrap_or_default(),
                model_number: model.clone().unwrap_or_default(),
                allow_any_host: *allow_any_host,
                allowed_hosts: hosts.clone(),
                max_namespaces: max_namespaces.unwrap_or(0),
                auth_requirement: auth.map_or(0, AuthArg::proto),
                tls_requirement: tls.map_or(0, TlsArg::proto),
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
            auth,
            tls,
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
            if auth.is_some() {
                paths.push("auth_requirement");
            }
            if tls.is_some() {
                paths.push("tls_requirement");
            }
            if paths.is_empty() {
                return Err(Failure::Input(
                    "nothing to update: give --allow-any-host, --model, --host, --clear-hosts, --auth or --tls"
                        .into(),
                ));
            }
            let s = pb::Subsystem {
                name: subsystem_name(id),
                allow_any_host: allow_any_host.unwrap_or(false),
                model_number: model.clone().unwrap_or_default(),
                allowed_hosts: hosts.clone(),
                auth_requirement: auth.map_or(0, AuthArg::proto),
                tls_requirement: tls.map_or(0, TlsArg::proto),
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
        SubsystemCmd::SetAuth {
            id,
            nqn,
            dhchap_secret,
            dhchap_secret_file,
            dhchap_ctrl_secret,
            dhchap_ctrl_secret_file,
            hashes,
            dh_groups,
        } => {
            let auth = pb::HostAuth {
                host_nqn: nqn.clone(),
                dhchap_secret: secret(dhchap_secret.as_ref(), dhchap_secret_file.as_deref())?,
                dhchap_ctrl_secret: secret(
                    dhchap_ctrl_secret.as_ref(),
                    dhchap_ctrl_secret_file.as_deref(),
                )?,
                hashes: hashes.clone(),
                dh_groups: dh_groups.clone(),
                ..Default::default()
            };
            one(c
                .set_host_auth(pb::SetHostAuthRequest {
                    subsystem: subsystem_name(id),
                    auth: Some(auth),
                })
                .await?)
        }
        SubsystemCmd::ClearAuth { id, nqn } => one(c
            .clear_host_auth(pb::ClearHostAuthRequest {
                subsystem: subsystem_name(id),
                host_nqn: nqn.clone(),
            })
            .await?),
        SubsystemCmd::SetTlsKey {
            id,
            nqn,
            psk_file,
            v0_derivation,
        } => {
            let tls = pb::HostTls {
                host_nqn: nqn.clone(),
                psk: secret(None, Some(psk_file))?,
                psk_hash: 0,
                v0_derivation: v0_derivation.proto(),
            };
            one(c
                .set_host_tls_key(pb::SetHostTlsKeyRequest {
                    subsystem: subsystem_name(id),
                    tls: Some(tls),
                })
                .await?)
        }
        SubsystemCmd::ClearTlsKey { id, nqn } => one(c
            .clear_host_tls_key(pb::ClearHostTlsKeyRequest {
                subsystem: subsystem_name(id),
                host_nqn: nqn.clone(),
            })
            .await?),
        SubsystemCmd::SetHostQos { id, nqn, qos } => one(c
            .set_host_qos(pb::SetHostQosRequest {
                subsystem: subsystem_name(id),
                host_nqn: nqn.clone(),
                qos: Some(qos.limits()),
            })
            .await?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A secret comes from the command line or from a file, trimmed; a
    /// file that cannot be a secret is refused without reading it all.
    #[test]
    fn secrets_from_flags_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k");
        std::fs::write(&f, "DHHC-1:00:abc:\n").unwrap();
        assert_eq!(secret(None, Some(&f)).unwrap(), "DHHC-1:00:abc:");
        assert_eq!(secret(Some(&"s".to_string()), None).unwrap(), "s");
        assert_eq!(secret(None, None).unwrap(), "");
        let missing = secret(None, Some(&dir.path().join("none"))).unwrap_err();
        assert!(matches!(missing, Failure::Input(_)), "{missing}");
        std::fs::write(&f, vec![b'a'; 5000]).unwrap();
        assert!(matches!(
            secret(None, Some(&f)).unwrap_err(),
            Failure::Input(m) if m.contains("not a secret")
        ));
    }
}
