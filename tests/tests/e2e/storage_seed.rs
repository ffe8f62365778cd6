//! Storage declared in the configuration (`[[storage.subsystems]]`):
//! created on the first start through the `StorageService`, kept as stored
//! on later starts, and a start that cannot create it fails.

use anyhow::{ensure, Context, Result};
use dpu_client::{pb, subsystem_name, ClientConfig, DpuClient};
use dpu_e2e::{free_port, Service};

/// A configuration declaring subsystem "seeded" (one 8 MiB RAM namespace,
/// one listener on `port`), then `more`.
fn config(port: u16, more: &str) -> String {
    format!(
        r#"
[log]
level = "info,dpu_control=debug"

[storage]
ram_limit = "64MiB"

[[storage.subsystems]]
id = "seeded"
nqn = "nqn.2024-01.io.dpu-service:seeded"
allow_any_host = true

[[storage.subsystems.namespaces]]
ram = "8MiB"
block_size = 512

[[storage.subsystems.listeners]]
address = "127.0.0.1"
port = {port}
{more}"#
    )
}

/// Subsystems as `ListSubsystems` returns them, each with its namespaces
/// and listeners.
async fn storage(
    svc: &Service,
) -> Result<Vec<(pb::Subsystem, Vec<pb::Namespace>, Vec<pb::Listener>)>> {
    let c = DpuClient::connect(ClientConfig {
        endpoint: svc.endpoint(),
        ..ClientConfig::default()
    })
    .await?;
    let subs = c
        .list_subsystems(pb::ListSubsystemsRequest::default())
        .await?
        .subsystems;
    let mut out = Vec::new();
    for s in subs {
        let ns = c
            .list_namespaces(pb::ListNamespacesRequest {
                parent: s.name.clone(),
                ..Default::default()
            })
            .await?
            .namespaces;
        let ls = c
            .list_listeners(pb::ListListenersRequest {
                parent: s.name.clone(),
                ..Default::default()
            })
            .await?
            .listeners;
        out.push((s, ns, ls));
    }
    Ok(out)
}

#[tokio::test]
async fn declared_storage_is_created_once_and_kept() -> Result<()> {
    let port = free_port();
    let mut svc = Service::start_config(&config(port, ""), &[])?;
    let first = storage(&svc).await?;
    ensure!(first.len() == 1, "one subsystem: {first:?}");
    let (s, ns, ls) = &first[0];
    assert_eq!(s.name, subsystem_name("seeded"));
    assert_eq!(s.nqn, "nqn.2024-01.io.dpu-service:seeded");
    assert!(s.allow_any_host);
    assert_eq!((s.namespace_count, s.listener_count), (1, 1));
    assert_eq!(ns.len(), 1);
    assert_eq!(ns[0].name, "subsystems/seeded/namespaces/1");
    assert_eq!(ns[0].size_bytes, 8 << 20);
    assert_eq!(ns[0].block_size, 512);
    assert_eq!(ls.len(), 1);
    assert_eq!(
        (ls[0].address.as_str(), ls[0].port),
        ("127.0.0.1", u32::from(port))
    );

    // Changed over gRPC; a restart on the same state keeps the stored
    // subsystem as it is: nothing duplicated, nothing reverted.
    let c = DpuClient::connect(ClientConfig {
        endpoint: svc.endpoint(),
        ..ClientConfig::default()
    })
    .await?;
    c.add_host(pb::AddHostRequest {
        subsystem: subsystem_name("seeded"),
        host_nqn: "nqn.2014-08.org.nvmexpress:uuid:e2e".into(),
    })
    .await?;
    svc.restart()?;
    let log = svc.log_text();
    ensure!(
        log.contains(
            "subsystem seeded from the configuration is already in the state; keeping the stored one"
        ),
        "log:\n{log}"
    );
    let second = storage(&svc).await?;
    ensure!(second.len() == 1, "still one subsystem: {second:?}");
    let (s2, ns2, ls2) = &second[0];
    assert_eq!(s2.allowed_hosts, ["nqn.2014-08.org.nvmexpress:uuid:e2e"]);
    assert_eq!(
        s2.create_time, s.create_time,
        "the stored one, not a new one"
    );
    assert_eq!(ns2, ns, "same namespace (same UUID and NGUID)");
    assert_eq!(ls2, ls);
    Ok(())
}

#[tokio::test]
async fn declared_storage_the_service_refuses_stops_the_start() -> Result<()> {
    let mut svc = Service::start_config(&config(free_port(), ""), &[])?;
    svc.signal("TERM")?;
    // Now the configuration declares another subsystem with the NQN of the
    // stored one: its checks cannot know, the API refuses it.
    let path = svc
        .args
        .iter()
        .skip_while(|a| *a != "--config")
        .nth(1)
        .context("the service has a --config argument")?
        .clone();
    std::fs::write(
        &path,
        r#"
[[storage.subsystems]]
id = "twin"
nqn = "nqn.2024-01.io.dpu-service:seeded"
"#,
    )?;
    let err = format!("{:#}", svc.start_again().unwrap_err());
    ensure!(
        err.contains("exited during start: exit status: 1"),
        "the service must not start: {err}"
    );
    ensure!(
        err.contains(
            "storage.subsystems[0] (\"twin\"): NQN nqn.2024-01.io.dpu-service:seeded is already used by subsystems/seeded"
        ),
        "the error names the entry and the API's message: {err}"
    );
    Ok(())
}
