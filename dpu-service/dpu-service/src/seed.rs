//! Storage objects declared in the configuration (`[[storage.subsystems]]`),
//! created at startup through the same `StorageService` calls a gRPC client
//! makes, so every validation and persistence rule applies.
//!
//! A declared subsystem whose ID is already in the state is left as stored:
//! once created, the state is the source of truth and changes made over
//! gRPC survive restarts.

use anyhow::{anyhow, Result};
use dpu_control::service::Api;
use dpu_proto::v1 as pb;
use dpu_proto::v1::storage_service_server::StorageService;
use tonic::Request;

use crate::config::{parse_size, SeedSubsystem, StorageConfig};

/// Creates the declared subsystems the state does not have yet. A failure
/// names the entry and the API's message, and leaves no half-made
/// subsystem behind.
pub async fn seed_storage(api: &Api, config: &StorageConfig) -> Result<()> {
    for (i, s) in config.subsystems.iter().enumerate() {
        let name = format!("subsystems/{}", s.id);
        let exists = api
            .get_subsystem(Request::new(pb::GetSubsystemRequest { name: name.clone() }))
            .await
            .is_ok();
        if exists {
            tracing::info!(
                subsystem = %s.id,
                "subsystem from the configuration is already in the state; keeping the stored one"
            );
            continue;
        }
        if let Err(e) = create(api, s).await {
            let _ = api
                .delete_subsystem(Request::new(pb::DeleteSubsystemRequest {
                    name,
                    force: true,
                }))
                .await;
            return Err(anyhow!("storage.subsystems[{i}] ({}): {e}", s.id));
        }
        tracing::info!(subsystem = %s.id, nqn = %s.nqn, "subsystem created from the configuration");
    }
    Ok(())
}

async fn create(api: &Api, s: &SeedSubsystem) -> Result<()> {
    let status = |what: String| move |e: tonic::Status| anyhow!("{what}: {}", e.message());
    api.create_subsystem(Request::new(pb::CreateSubsystemRequest {
        subsystem_id: s.id.clone(),
        subsystem: Some(pb::Subsystem {
            nqn: s.nqn.clone(),
            serial_number: s.serial_number.clone(),
            model_number: s.model_number.clone(),
            allow_any_host: s.allow_any_host,
            allowed_hosts: s.allowed_hosts.clone(),
            max_namespaces: s.max_namespaces,
            ..Default::default()
        }),
    }))
    .await
    .map_err(status("creating the subsystem".into()))?;
    let parent = format!("subsystems/{}", s.id);
    for (j, n) in s.namespaces.iter().enumerate() {
        let backend = match (&n.ram, &n.file, &n.block_device) {
            (Some(r), None, None) => pb::namespace::Backend::Ram(pb::RamBackend {
                size_bytes: parse_size(r)?,
            }),
            (None, Some(f), None) => pb::namespace::Backend::File(pb::FileBackend {
                path: f.clone(),
                size_bytes: n.size.as_deref().map(parse_size).transpose()?.unwrap_or(0),
            }),
            (None, None, Some(b)) => {
                pb::namespace::Backend::BlockDevice(pb::BlockDeviceBackend { path: b.clone() })
            }
            _ => {
                return Err(anyhow!(
                    "namespaces[{j}]: give exactly one of ram, file, block_device"
                ))
            }
        };
        api.create_namespace(Request::new(pb::CreateNamespaceRequest {
            parent: parent.clone(),
            namespace: Some(pb::Namespace {
                nsid: n.nsid,
                backend: Some(backend),
                block_size: n.block_size,
                ..Default::default()
            }),
        }))
        .await
        .map_err(status(format!("namespaces[{j}]")))?;
    }
    for (j, l) in s.listeners.iter().enumerate() {
        api.create_listener(Request::new(pb::CreateListenerRequest {
            parent: parent.clone(),
            listener_id: l.id.clone(),
            listener: Some(pb::Listener {
                transport: pb::Transport::Tcp as i32,
                address: l.address.to_string(),
                port: u32::from(l.port),
                ..Default::default()
            }),
        }))
        .await
        .map_err(status(format!("listeners[{j}]")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use dpu_control::model::{Backend, Timestamp};
    use dpu_control::service::{Control, ServiceFacts};
    use dpu_control::state::Limits;
    use dpu_control::store::StateHandle;
    use dpu_control::telemetry::Telemetry;

    use super::*;
    use crate::config::Config;

    fn api() -> (Api, StateHandle) {
        let state = StateHandle::open(None).expect("in-memory state");
        let ctl = Arc::new(Control {
            state: state.clone(),
            ports: Default::default(),
            telemetry: Arc::new(Telemetry::default()),
            limits: Limits {
                ram_bytes: 64 << 20,
            },
            facts: ServiceFacts {
                version: String::new(),
                target_triple: String::new(),
                dpdk_version: String::new(),
                dataplane_driver: String::new(),
                capabilities: Vec::new(),
                start_time: Timestamp::now(),
                hostname: String::new(),
            },
        });
        (Api::new(ctl), state)
    }

    fn storage(text: &str) -> StorageConfig {
        let c: Config = toml::from_str(text).expect("config parses");
        c.validate().expect("config is valid");
        c.storage
    }

    const ONE: &str = r#"
[storage]
discovery_listen = "127.0.0.1:8009"
[[storage.subsystems]]
id = "dev"
nqn = "nqn.2024-01.io.dpu-service:dev"
allow_any_host = true
[[storage.subsystems.namespaces]]
ram = "16MiB"
[[storage.subsystems.listeners]]
address = "127.0.0.1"
port = 4420
"#;

    #[tokio::test]
    async fn creates_what_the_state_lacks_and_keeps_what_it_has() {
        let (api, state) = api();
        let cfg = storage(ONE);
        assert_eq!(
            cfg.discovery_listen,
            Some("127.0.0.1:8009".parse().unwrap())
        );
        seed_storage(&api, &cfg).await.unwrap();
        let s = state.snapshot();
        let sub = &s.subsystems["dev"];
        assert!(sub.allow_any_host);
        assert_eq!(
            sub.namespaces[&1].backend,
            Backend::Ram {
                size_bytes: 16 << 20
            }
        );
        assert_eq!(sub.listeners.values().next().unwrap().port, 4420);

        // Changed over gRPC, then seeded again (a restart): kept as stored.
        api.add_host(Request::new(pb::AddHostRequest {
            subsystem: "subsystems/dev".into(),
            host_nqn: "nqn.2014-08.org.nvmexpress:uuid:h".into(),
        }))
        .await
        .unwrap();
        seed_storage(&api, &cfg).await.unwrap();
        let s = state.snapshot();
        assert_eq!(s.subsystems.len(), 1);
        assert!(s.subsystems["dev"]
            .allowed_hosts
            .contains("nqn.2014-08.org.nvmexpress:uuid:h"));
        assert_eq!(s.subsystems["dev"].namespaces.len(), 1);
    }

    #[tokio::test]
    async fn a_failing_entry_is_an_error_and_leaves_nothing_behind() {
        let (api, state) = api();
        let cfg = storage(&ONE.replace("16MiB", "1GiB"));
        let e = seed_storage(&api, &cfg).await.unwrap_err().to_string();
        assert!(
            e.starts_with("storage.subsystems[0] (dev): namespaces[0]:"),
            "{e}"
        );
        assert!(state.snapshot().subsystems.is_empty());
    }

    #[test]
    fn bad_namespace_declarations_are_rejected() {
        for (bad, why) in [
            ("ram = \"1M\"\nfile = \"/x\"", "exactly one of"),
            ("block_size = 512", "exactly one of"),
            ("ram = \"1M\"\nsize = \"2M\"", "size goes with file"),
            ("ram = \"lots\"", "size \"lots\""),
        ] {
            let text = format!(
                "[[storage.subsystems]]\nid = \"a\"\nnqn = \"nqn.2024-01.x:a\"\n[[storage.subsystems.namespaces]]\n{bad}\n"
            );
            let c: Config = toml::from_str(&text).unwrap();
            let e = format!("{:#}", c.validate().unwrap_err());
            assert!(
                e.contains("storage.subsystems[0].namespaces[0]") && e.contains(why),
                "{e}"
            );
        }
        let unknown = "[[storage.subsystems]]\nid = \"a\"\nnqn = \"n\"\ncolour = \"red\"\n";
        assert!(toml::from_str::<Config>(unknown).is_err());
    }
}
