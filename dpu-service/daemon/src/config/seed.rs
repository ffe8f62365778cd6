//! Storage objects declared in the configuration (`[[storage.clusters]]`,
//! `[[storage.volumes]]`, `[[storage.subsystems]]`), created at startup through the same
//! `StorageService` calls a gRPC client makes, so every validation, ID
//! assignment and persistence rule applies (and a storage cluster is
//! connected to before it is stored, as over gRPC).
//!
//! As over gRPC, a namespace or listener counts as created once the NVMe/TCP
//! target serves it: one the target cannot serve (a file it cannot open, a
//! port another socket holds) is refused like an invalid one.
//!
//! A declared subsystem whose ID is already in the state is left as stored:
//! once created, the state is the source of truth and changes made over
//! gRPC survive restarts.

use anyhow::{anyhow, bail, Result};
use dpu_control::service::Api;
use dpu_proto::v1 as pb;
use dpu_proto::v1::storage_service_server::StorageService;
use tonic::{Code, Request};

use crate::config::{SeedSubsystem, StorageConfig};

/// Registers the declared storage clusters the state does not have yet,
/// then creates the declared volumes and subsystems it does not have yet,
/// each subsystem with its namespaces and listeners, in declaration
/// order.
///
/// # Errors
/// The first refusal, naming the configuration entry and the API's message.
/// A subsystem created before one of its namespaces or listeners was
/// refused is deleted again, so a corrected configuration applies at the
/// next start; clusters and subsystems completed before it are kept.
pub async fn seed_storage(api: &Api, config: &StorageConfig) -> Result<()> {
    for (i, c) in config.clusters.iter().enumerate() {
        let at = format!("storage.clusters[{i}]");
        let stored = api.get_cluster(Request::new(pb::GetClusterRequest {
            name: format!("clusters/{}", c.id),
        }));
        if already_stored(&at, "storage cluster", &c.id, stored.await)? {
            continue;
        }
        let cluster = c
            .to_proto()
            .map_err(|e| anyhow!("{at} ({:?}): {e:#}", c.id))?;
        api.create_cluster(Request::new(pb::CreateClusterRequest {
            cluster_id: c.id.clone(),
            cluster: Some(cluster),
        }))
        .await
        .map_err(|e| anyhow!("{at} ({:?}): {}", c.id, e.message()))?;
        tracing::info!(
            cluster = %c.id,
            mon_host = %c.mon_host,
            "storage cluster registered from the configuration"
        );
    }
    for (i, v) in config.volumes.iter().enumerate() {
        let at = format!("storage.volumes[{i}]");
        let stored = api.get_volume(Request::new(pb::GetVolumeRequest {
            name: format!("volumes/{}", v.id),
        }));
        if already_stored(&at, "volume", &v.id, stored.await)? {
            continue;
        }
        let volume = v
            .to_proto()
            .map_err(|e| anyhow!("{at} ({:?}): {e:#}", v.id))?;
        api.create_volume(Request::new(pb::CreateVolumeRequest {
            volume_id: v.id.clone(),
            volume: Some(volume),
        }))
        .await
        .map_err(|e| anyhow!("{at} ({:?}): {}", v.id, e.message()))?;
        tracing::info!(volume = %v.id, "volume created from the configuration");
    }
    for (i, s) in config.subsystems.iter().enumerate() {
        let at = format!("storage.subsystems[{i}]");
        let name = format!("subsystems/{}", s.id);
        let stored =
            api.get_subsystem(Request::new(pb::GetSubsystemRequest { name: name.clone() }));
        if already_stored(&at, "subsystem", &s.id, stored.await)? {
            continue;
        }
        api.create_subsystem(Request::new(pb::CreateSubsystemRequest {
            subsystem_id: s.id.clone(),
            subsystem: Some(s.to_proto()),
        }))
        .await
        .map_err(|e| anyhow!("{at} ({:?}): {}", s.id, e.message()))?;
        fill_or_undo("subsystem", &s.id, fill(api, &at, &name, s), || {
            api.delete_subsystem(Request::new(pb::DeleteSubsystemRequest {
                name: name.clone(),
                force: true,
            }))
        })
        .await?;
        tracing::info!(
            subsystem = %s.id,
            nqn = %s.nqn,
            namespaces = s.namespaces.len(),
            listeners = s.listeners.len(),
            "subsystem created from the configuration"
        );
    }
    Ok(())
}

/// Whether the declared object `what` `id` (at `at` in the
/// configuration) is in the state already, from the answer to a get:
/// then it is kept as stored, and the log says so.
///
/// # Errors
/// If the get failed other than with NOT_FOUND.
pub fn already_stored<R>(
    at: &str,
    what: &str,
    id: &str,
    got: Result<R, tonic::Status>,
) -> Result<bool> {
    match got {
        Ok(_) => {
            tracing::info!(
                "{what} {id} from the configuration is already in the state; keeping the stored one"
            );
            Ok(true)
        }
        Err(e) if e.code() == Code::NotFound => Ok(false),
        Err(e) => bail!("{at} ({id:?}): {}", e.message()),
    }
}

/// Awaits `fill`, which completes object `what` `id` just created; if it
/// fails, deletes the object again with `undo`, so a corrected
/// configuration applies at the next start, and says so in the error.
pub async fn fill_or_undo<R, U: std::future::Future<Output = Result<R, tonic::Status>>>(
    what: &str,
    id: &str,
    fill: impl std::future::Future<Output = Result<()>>,
    undo: impl FnOnce() -> U,
) -> Result<()> {
    let Err(e) = fill.await else {
        return Ok(());
    };
    Err(match undo().await {
        Ok(_) => anyhow!("{e:#} (the partly created {what} {id:?} was deleted again)"),
        Err(d) => anyhow!(
            "{e:#} (deleting the partly created {what} {id:?} failed too: {})",
            d.message()
        ),
    })
}

/// `msg` without the note [`fill_or_undo`] ends it with, saying that a
/// partly created object was deleted again (or that deleting it failed).
pub(crate) fn without_undo_note(msg: &str) -> &str {
    let note = [" (the partly created ", " (deleting the partly created "]
        .iter()
        .filter_map(|n| msg.rfind(n))
        .max();
    match note {
        Some(i) if msg.ends_with(')') => &msg[..i],
        _ => msg,
    }
}

/// Creates the namespaces and listeners of the just created subsystem
/// `name`, declared at `at`, and sets its hosts' QoS limits and TLS keys.
async fn fill(api: &Api, at: &str, name: &str, s: &SeedSubsystem) -> Result<()> {
    for (j, n) in s.namespaces.iter().enumerate() {
        let at = format!("{at}.namespaces[{j}]");
        let namespace = n.to_proto().map_err(|e| anyhow!("{at}: {e:#}"))?;
        api.create_namespace(Request::new(pb::CreateNamespaceRequest {
            parent: name.to_string(),
            namespace: Some(namespace),
        }))
        .await
        .map_err(|e| anyhow!("{at}: {}", e.message()))?;
    }
    for (j, l) in s.listeners.iter().enumerate() {
        api.create_listener(Request::new(pb::CreateListenerRequest {
            parent: name.to_string(),
            listener_id: l.id.clone().unwrap_or_default(),
            listener: Some(l.to_proto()),
        }))
        .await
        .map_err(|e| anyhow!("{at}.listeners[{j}]: {}", e.message()))?;
    }
    for (host, q) in &s.host_qos {
        let at = format!("{at}.host_qos.{host:?}");
        let qos = q.to_proto("qos").map_err(|e| anyhow!("{at}: {e:#}"))?;
        api.set_host_qos(Request::new(pb::SetHostQosRequest {
            subsystem: name.to_string(),
            host_nqn: host.clone(),
            qos: Some(qos),
        }))
        .await
        .map_err(|e| anyhow!("{at}: {}", e.message()))?;
    }
    for (host, t) in &s.host_tls {
        let at = format!("{at}.host_tls.{host:?}");
        let tls = t.to_proto(host).map_err(|e| anyhow!("{at}: {e:#}"))?;
        api.set_host_tls_key(Request::new(pb::SetHostTlsKeyRequest {
            subsystem: name.to_string(),
            tls: Some(tls),
        }))
        .await
        .map_err(|e| anyhow!("{at}: {}", e.message()))?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use dpu_control::apply::Applied;
    use dpu_control::model::Backend;
    use dpu_control::service::{Control, ServiceFacts};
    use dpu_control::state::{Limits, PortRegistry};
    use dpu_control::store::StateHandle;
    use dpu_control::telemetry::Telemetry;

    use super::*;
    use crate::config::Config;

    /// The service's host NQN in tests.
    pub(crate) const HOST_NQN: &str = "nqn.2024-01.io.example:dpu";

    /// An API over a fresh in-memory state with `ports`, RAM namespaces
    /// limited to `ram_bytes` (the declared-tenant tests use it too).
    pub(crate) fn api_with(ports: PortRegistry, ram_bytes: u64) -> (Api, StateHandle) {
        let state = StateHandle::open(None).expect("in-memory state");
        (api_over(&state, ports, ram_bytes, None, None), state)
    }

    /// An API over `state` with `ports`, RAM namespaces limited to
    /// `ram_bytes`, its storage calls waiting for `storage_applied` and
    /// its tenant calls for `switch_applied`.
    pub(crate) fn api_over(
        state: &StateHandle,
        ports: PortRegistry,
        ram_bytes: u64,
        storage_applied: Option<Applied>,
        switch_applied: Option<Applied>,
    ) -> Api {
        let ctl = Arc::new(Control {
            state: state.clone(),
            ports,
            telemetry: Arc::new(Telemetry::default()),
            limits: Limits::with_ram(ram_bytes),
            backing: Arc::new(backing()),
            facts: ServiceFacts::default(),
            storage_applied,
            switch_applied,
            store_probe: None,
            served: None,
            host_nqn: HOST_NQN.into(),
        });
        Api::new(ctl)
    }

    /// The backing policy of tests: files anywhere (without symbolic
    /// links), any device under `/dev`.
    pub(crate) fn backing() -> dpu_os::backing::BackingPolicy {
        dpu_os::backing::BackingPolicy::new(vec!["/".into()], vec!["/dev/*".into()], None)
            .expect("a valid policy")
    }

    /// An API over a fresh in-memory state, RAM namespaces limited to 64 MiB.
    fn api() -> (Api, StateHandle) {
        api_with(Default::default(), 64 << 20)
    }

    /// `[storage]` of a configuration that passes its checks.
    fn storage(text: &str) -> StorageConfig {
        let c: Config = toml::from_str(text).expect("config parses");
        c.validate().expect("config is valid");
        c.storage
    }

    /// `[storage]` of a configuration, unchecked: what the API refuses.
    fn unchecked(text: &str) -> StorageConfig {
        toml::from_str::<Config>(text)
            .expect("config parses")
            .storage
    }

    /// `[storage]` with a RAM limit of its own (the API's is 64 MiB).
    const HEAD: &str = r#"
[storage]
ram_limit = "4GiB"
discovery_listen = "127.0.0.1:8009"
file_dirs = ["/nonexistent"]
block_devices = ["/dev/nonexistent"]
"#;

    /// The development subsystem, with a 16 MiB RAM namespace.
    const DEV: &str = r#"
[[storage.subsystems]]
id = "dev"
nqn = "nqn.2024-01.io.dpu-service:dev"
allow_any_host = true
[[storage.subsystems.namespaces]]
ram = "16MiB"
block_size = 512
[[storage.subsystems.listeners]]
address = "127.0.0.1"
port = 4420
"#;

    /// [`HEAD`] and `subsystems`.
    fn with(subsystems: &str) -> String {
        format!("{HEAD}{subsystems}")
    }

    #[tokio::test]
    async fn creates_subsystem_namespace_and_listener() {
        let (api, state) = api();
        seed_storage(&api, &storage(&with(DEV))).await.unwrap();
        let s = state.snapshot();
        assert_eq!(s.subsystems.len(), 1);
        let sub = &s.subsystems["dev"];
        assert_eq!(sub.nqn, "nqn.2024-01.io.dpu-service:dev");
        assert!(sub.allow_any_host);
        assert!(sub.allowed_hosts.is_empty());
        assert_eq!(sub.model_number, "dpu-service", "the API's default");
        assert_eq!(sub.namespaces.len(), 1);
        let ns = &sub.namespaces[&1];
        assert_eq!(
            ns.backend,
            Backend::Ram {
                size_bytes: 16 << 20
            }
        );
        assert_eq!(ns.block_size, 512);
        assert_ne!(ns.uuid, [0; 16], "the API generated a UUID");
        assert_eq!(sub.listeners.len(), 1);
        let (lid, l) = sub.listeners.iter().next().unwrap();
        assert_eq!(lid, "tcp-127-0-0-1-4420", "the API derived the ID");
        assert_eq!(l.address.to_string(), "127.0.0.1");
        assert_eq!(l.port, 4420);
    }

    #[tokio::test]
    async fn every_declared_field_reaches_the_state() {
        let (api, state) = api();
        let cfg = storage(&with(
            r#"
[[storage.subsystems]]
id = "full"
nqn = "nqn.2024-01.io.example:full"
serial_number = "SN-1"
model_number = "Model X"
allowed_hosts = ["nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950e"]
max_namespaces = 4
host_qos = { "nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950e" = { iops = 5000, write_bandwidth = 104857600 } }
[[storage.subsystems.namespaces]]
nsid = 3
ram = "8MiB"
block_size = 4096
uuid = "123e4567-e89b-12d3-a456-426614174000"
nguid = "00112233445566778899aabbccddeeff"
qos = { iops = 1000, read_iops = 600, write_iops = 400, bandwidth = "1G", read_bandwidth = "200M", write_bandwidth = "100MiB" }
[[storage.subsystems.namespaces]]
file = "/nonexistent/dpu-seed-test.img"
size = "1GiB"
[[storage.subsystems.namespaces]]
block_device = "/dev/nonexistent"
[[storage.subsystems.listeners]]
id = "data"
address = "::1"
port = 4421
transport = "tcp"
"#,
        ));
        seed_storage(&api, &cfg).await.unwrap();
        let s = state.snapshot();
        let sub = &s.subsystems["full"];
        assert_eq!(sub.serial_number, "SN-1");
        assert_eq!(sub.model_number, "Model X");
        assert!(!sub.allow_any_host);
        assert_eq!(sub.allowed_hosts.len(), 1);
        assert_eq!(sub.max_namespaces, 4);
        assert_eq!(
            sub.namespaces.keys().copied().collect::<Vec<_>>(),
            [1, 2, 3],
            "nsid 3 as given, then the lowest free ones"
        );
        let n3 = &sub.namespaces[&3];
        assert_eq!(n3.block_size, 4096);
        assert_eq!(
            n3.qos,
            dpu_control::model::QosLimits {
                iops: 1_000,
                read_iops: 600,
                write_iops: 400,
                bandwidth: 1 << 30,
                read_bandwidth: 200 << 20,
                write_bandwidth: 100 << 20,
            }
        );
        assert!(sub.namespaces[&1].qos.is_none(), "none unless declared");
        assert_eq!(
            sub.host_qos
                .iter()
                .map(|(h, q)| (h.as_str(), q.iops, q.write_bandwidth))
                .collect::<Vec<_>>(),
            [(
                "nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950e",
                5_000,
                100 << 20
            )]
        );
        assert_eq!(n3.uuid[..2], [0x12, 0x3e]);
        assert_eq!(n3.nguid[15], 0xff);
        assert_eq!(
            sub.namespaces[&1].backend,
            Backend::File {
                path: "/nonexistent/dpu-seed-test.img".into(),
                size_bytes: 1 << 30,
                created: true,
            }
        );
        assert_eq!(
            sub.namespaces[&2].backend,
            Backend::BlockDevice {
                path: "/dev/nonexistent".into()
            }
        );
        let l = &sub.listeners["data"];
        assert_eq!(l.address.to_string(), "::1");
        assert_eq!(l.port, 4421);
    }

    #[tokio::test]
    async fn seeding_again_keeps_the_stored_subsystem() {
        let (api, state) = api();
        let cfg = storage(&with(DEV));
        seed_storage(&api, &cfg).await.unwrap();
        let created = state.snapshot().subsystems["dev"].clone();

        // Seeding again (a restart) changes nothing.
        seed_storage(&api, &cfg).await.unwrap();
        assert_eq!(state.snapshot().subsystems["dev"], created);

        // Changed over gRPC, then seeded again: kept as stored, not
        // completed from the configuration.
        api.add_host(Request::new(pb::AddHostRequest {
            subsystem: "subsystems/dev".into(),
            host_nqn: "nqn.2014-08.org.nvmexpress:uuid:h".into(),
        }))
        .await
        .unwrap();
        api.delete_namespace(Request::new(pb::DeleteNamespaceRequest {
            name: "subsystems/dev/namespaces/1".into(),
        }))
        .await
        .unwrap();
        seed_storage(&api, &cfg).await.unwrap();
        let s = state.snapshot();
        assert_eq!(s.subsystems.len(), 1);
        let sub = &s.subsystems["dev"];
        assert!(sub
            .allowed_hosts
            .contains("nqn.2014-08.org.nvmexpress:uuid:h"));
        assert!(
            sub.namespaces.is_empty(),
            "the deleted namespace stays deleted"
        );
        assert_eq!(sub.listeners.len(), 1);
        assert_eq!(sub.create_time, created.create_time);
    }

    #[tokio::test]
    async fn ram_over_the_limit_is_an_error_and_leaves_nothing_behind() {
        let (api, state) = api();
        // Passes the configuration's checks (its ram_limit is larger); the
        // API's 64 MiB limit refuses it.
        let cfg = storage(&with(&DEV.replace("16MiB", "1GiB")));
        let e = format!("{:#}", seed_storage(&api, &cfg).await.unwrap_err());
        assert!(
            e.starts_with("storage.subsystems[0].namespaces[0]: "),
            "{e}"
        );
        assert!(
            e.ends_with("(the partly created subsystem \"dev\" was deleted again)"),
            "{e}"
        );
        assert!(
            e.contains("RAM") || e.contains("ram"),
            "the API's message: {e}"
        );
        assert!(state.snapshot().subsystems.is_empty());
        // A corrected configuration applies next time.
        seed_storage(&api, &storage(&with(DEV))).await.unwrap();
        assert_eq!(state.snapshot().subsystems["dev"].namespaces.len(), 1);
    }

    #[tokio::test]
    async fn nsid_above_max_namespaces_is_an_error_and_leaves_nothing_behind() {
        let (api, state) = api();
        let cfg = unchecked(&with(
            &DEV.replace(
                "allow_any_host = true",
                "allow_any_host = true\nmax_namespaces = 2",
            )
            .replace("block_size = 512", "block_size = 512\nnsid = 3"),
        ));
        let e = format!("{:#}", seed_storage(&api, &cfg).await.unwrap_err());
        assert!(e.contains("storage.subsystems[0].namespaces[0]: "), "{e}");
        assert!(e.contains("exceeds max_namespaces 2"), "{e}");
        assert!(state.snapshot().subsystems.is_empty());
    }

    #[tokio::test]
    async fn a_refused_listener_removes_the_partial_subsystem() {
        let (api, state) = api();
        let cfg = unchecked(&with(&format!(
            "{DEV}[[storage.subsystems.listeners]]\naddress = \"127.0.0.1\"\nport = 4420\n"
        )));
        let e = format!("{:#}", seed_storage(&api, &cfg).await.unwrap_err());
        assert!(e.contains("storage.subsystems[0].listeners[1]: "), "{e}");
        assert!(e.contains("already"), "{e}");
        assert!(state.snapshot().subsystems.is_empty());
    }

    #[tokio::test]
    async fn a_refused_subsystem_leaves_the_stored_ones_alone() {
        let (api, state) = api();
        seed_storage(&api, &storage(&with(DEV))).await.unwrap();
        // Another ID with the NQN the stored subsystem uses.
        let cfg = storage(&with(&DEV.replace("id = \"dev\"", "id = \"other\"")));
        let e = format!("{:#}", seed_storage(&api, &cfg).await.unwrap_err());
        assert!(e.starts_with("storage.subsystems[0] (\"other\"): "), "{e}");
        assert!(e.contains("already used by subsystems/dev"), "{e}");
        let s = state.snapshot();
        assert_eq!(s.subsystems.len(), 1);
        assert_eq!(s.subsystems["dev"].namespaces.len(), 1);
    }

    #[tokio::test]
    async fn complete_subsystems_before_a_failure_are_kept() {
        let (api, state) = api();
        let big = DEV
            .replace("id = \"dev\"", "id = \"big\"")
            .replace(":dev\"", ":big\"")
            .replace("16MiB", "60MiB");
        let cfg = storage(&with(&format!("{DEV}{big}")));
        let e = format!("{:#}", seed_storage(&api, &cfg).await.unwrap_err());
        assert!(e.contains("storage.subsystems[1].namespaces[0]: "), "{e}");
        let s = state.snapshot();
        assert_eq!(s.subsystems.keys().collect::<Vec<_>>(), ["dev"]);
    }

    /// Declared clusters are registered before the subsystems whose RBD
    /// namespaces name them, with the key of the keyring file; seeding
    /// again keeps the stored ones (a key rotated over gRPC stays).
    #[tokio::test]
    async fn clusters_come_before_the_namespaces_on_them() {
        const KEY: &str = "AQCAmWZmQOIBABAAEBESExQVFhcYGRobHB0eHw==";
        let dir = tempfile::tempdir().unwrap();
        let keyring = dir.path().join("key");
        // The file of `ceph auth get-key`: the key alone.
        std::fs::write(&keyring, format!("{KEY}\n")).unwrap();
        let text = with(&format!(
            r#"
[[storage.clusters]]
id = "ceph1"
mon_host = "[v2:10.0.0.1:3300,v1:10.0.0.1:6789]"
user = "dpu"
keyring_file = "{}"
op_timeout_secs = 30

[[storage.subsystems]]
id = "dev"
nqn = "nqn.2024-01.io.dpu-service:dev"
[[storage.subsystems.namespaces]]
rbd = "rbd/vol1"
cluster = "ceph1"
block_size = 4096
"#,
            keyring.display()
        ));
        let (api, state) = api();
        // What the API takes without connecting (a build without RBD
        // would refuse the cluster in the configuration's check).
        let cfg = unchecked(&text);
        seed_storage(&api, &cfg).await.unwrap();
        let s = state.snapshot();
        let c = &s.clusters["ceph1"];
        assert_eq!(c.mon_host, "[v2:10.0.0.1:3300,v1:10.0.0.1:6789]");
        assert_eq!(c.key.as_ref().unwrap().expose(), KEY);
        assert_eq!((c.op_timeout_secs, c.connect_timeout_secs), (30, 10));
        assert_eq!(
            s.subsystems["dev"].namespaces[&1].backend,
            Backend::Rbd {
                cluster: "ceph1".into(),
                pool: "rbd".into(),
                image: "vol1".into()
            }
        );
        // Changed over gRPC, then seeded again: the stored one stays.
        api.update_cluster(Request::new(pb::UpdateClusterRequest {
            cluster: Some(pb::Cluster {
                name: "clusters/ceph1".into(),
                ..Default::default()
            }),
            update_mask: Some(dpu_proto::pbjson_types::FieldMask {
                paths: vec!["key".into()],
            }),
        }))
        .await
        .unwrap();
        std::fs::remove_file(&keyring).unwrap();
        seed_storage(&api, &cfg).await.unwrap();
        assert!(state.snapshot().clusters["ceph1"].key.is_none());
    }

    /// A declared remote namespace reaches the state with every field,
    /// its secret read from its file and the service's host NQN where it
    /// names none.
    #[tokio::test]
    async fn remote_namespaces_are_declared_with_their_secret_file() {
        const SECRET: &str = "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:";
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("far.key");
        std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
        let text = with(&format!(
            r#"
[[storage.subsystems]]
id = "dev"
nqn = "nqn.2024-01.io.dpu-service:dev"
[[storage.subsystems.namespaces]]
block_size = 4096
remote = {{ paths = ["10.0.0.1:4420", "[fd00::1]:4420"], nqn = "nqn.2024-01.io.example:far", nsid = 3, dhchap_secret_file = "{}", io_timeout_ms = 2000, connect_timeout_ms = 1000, queue_depth = 64 }}
[[storage.subsystems.namespaces]]
[storage.subsystems.namespaces.remote]
paths = ["10.0.0.2:4420"]
nqn = "nqn.2024-01.io.example:far"
nsid = 4
host_nqn = "nqn.2024-01.io.example:other-host"
"#,
            secret.display()
        ));
        let (api, state) = api();
        seed_storage(&api, &storage(&text)).await.unwrap();
        let s = state.snapshot();
        let ns = &s.subsystems["dev"].namespaces;
        let Backend::Remote(r) = &ns[&1].backend else {
            panic!("{:?}", ns[&1])
        };
        assert_eq!(ns[&1].block_size, 4096);
        assert_eq!(r.addresses(), "10.0.0.1:4420, [fd00::1]:4420");
        assert_eq!(
            (r.subnqn.as_str(), r.nsid),
            ("nqn.2024-01.io.example:far", 3)
        );
        assert_eq!(r.host_nqn, HOST_NQN);
        assert_eq!(r.dhchap_secret.as_ref().unwrap().expose(), SECRET);
        assert_eq!(
            (r.io_timeout_ms, r.connect_timeout_ms, r.queue_depth),
            (2000, 1000, 64)
        );
        let Backend::Remote(r) = &ns[&2].backend else {
            panic!("{:?}", ns[&2])
        };
        assert_eq!(r.host_nqn, "nqn.2024-01.io.example:other-host");
        assert!(r.dhchap_secret.is_none());
        assert_eq!(
            (r.io_timeout_ms, r.connect_timeout_ms, r.queue_depth),
            (10_000, 3_000, 128)
        );
    }

    /// A declared subsystem's TLS requirement, its hosts' keys (read
    /// from their files) and its listeners' secure channels reach the
    /// state.
    #[tokio::test]
    async fn tls_is_declared_with_key_files() {
        const PSK: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
        const H: &str = "nqn.2024-01.io.example:h";
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("h.psk");
        std::fs::write(&key, format!("  {PSK}\n")).unwrap();
        let text = with(&format!(
            r#"
[[storage.subsystems]]
id = "dev"
nqn = "nqn.2024-01.io.dpu-service:dev"
allowed_hosts = ["{H}"]
tls_requirement = "disabled"
host_tls = {{ "{H}" = {{ psk_file = "{}", v0_derivation = "compat" }} }}
[[storage.subsystems.listeners]]
address = "127.0.0.1"
port = 4420
secure_channel = "allowed"
[[storage.subsystems.listeners]]
address = "127.0.0.1"
port = 4421
"#,
            key.display()
        ));
        let (api, state) = api();
        seed_storage(&api, &storage(&text)).await.unwrap();
        let s = state.snapshot();
        let sub = &s.subsystems["dev"];
        assert_eq!(
            sub.tls_requirement,
            dpu_control::model::TlsRequirement::Disabled
        );
        assert_eq!(sub.host_tls.len(), 1);
        assert_eq!(sub.host_tls[H].hash_code(), 1);
        assert_eq!(
            sub.host_tls[H],
            dpu_control::model::PskText::parse(PSK)
                .unwrap()
                .0
                .with_v0_derivation(dpu_control::model::TlsDerivation::Compat),
            "read trimmed, with its derivation"
        );
        use dpu_control::model::SecureChannel;
        assert_eq!(
            sub.listeners["tcp-127-0-0-1-4420"].secure_channel,
            SecureChannel::Allowed
        );
        assert_eq!(
            sub.listeners["tcp-127-0-0-1-4421"].secure_channel,
            SecureChannel::None
        );
    }

    #[tokio::test]
    async fn nothing_declared_is_nothing_done() {
        let (api, state) = api();
        seed_storage(&api, &StorageConfig::default()).await.unwrap();
        assert!(state.snapshot().subsystems.is_empty());
    }
}
