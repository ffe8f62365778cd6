//! The dpu-service daemon.
//!
//! Wires the pieces together: configuration, logging, the persisted state
//! store, the `dpu.v1` gRPC services (with health checking and reflection,
//! optionally behind mutual TLS), the Prometheus endpoint, and a graceful
//! shutdown on SIGINT/SIGTERM.
//!
//! It wires; it does not decide. It is the one crate that depends on the
//! control plane (`dpu-control`), the data plane (`dpu-dataplane`) and the
//! NVMe/TCP target (`dpu-nvmeof`): control validates, persists and
//! publishes each accepted state; [`dataplane`] and [`storage`] follow
//! those snapshots, turning them into the switch's configuration (through
//! the switch's own constructors) and the target's subsystems. Rules about
//! what a valid configuration is live in control: the configuration file
//! is checked by a dry run of control's own transitions
//! ([`config`]); the data plane's drivers open their own ports.

#![forbid(unsafe_code)]

mod config;
mod dataplane;
mod endpoint_stacks;
mod listen;
mod metrics;
mod offload;
mod rbd;
mod remote;
mod runtime;
mod storage;
mod switch_tables;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use dpu_control::model::{State, Timestamp};
use dpu_control::service::authz::AuthzLayer;
use dpu_control::service::{request_bytes, Api, Bounded, Control, ServiceFacts};
use dpu_control::store::StateHandle;
use dpu_control::telemetry::Telemetry;
use dpu_proto::opi::network::evpn_gw::v1alpha1::bridge_port_service_server::BridgePortServiceServer;
use dpu_proto::opi::network::evpn_gw::v1alpha1::logical_bridge_service_server::LogicalBridgeServiceServer;
use dpu_proto::opi::network::evpn_gw::v1alpha1::svi_service_server::SviServiceServer;
use dpu_proto::opi::network::evpn_gw::v1alpha1::vrf_service_server::VrfServiceServer;
use dpu_proto::opi::storage::v1::aio_volume_service_server::AioVolumeServiceServer;
use dpu_proto::opi::storage::v1::frontend_nvme_service_server::FrontendNvmeServiceServer;
use dpu_proto::opi::storage::v1::malloc_volume_service_server::MallocVolumeServiceServer;
use dpu_proto::opi::storage::v1::null_volume_service_server::NullVolumeServiceServer;
use dpu_proto::opi::storage::v1::nvme_remote_controller_service_server::NvmeRemoteControllerServiceServer;
use dpu_proto::v1::filter_service_server::FilterServiceServer;
use dpu_proto::v1::info_service_server::InfoServiceServer;
use dpu_proto::v1::port_service_server::PortServiceServer;
use dpu_proto::v1::storage_service_server::StorageServiceServer;
use dpu_proto::v1::telemetry_service_server::TelemetryServiceServer;
use dpu_proto::v1::tenant_service_server::TenantServiceServer;
use tokio::sync::watch;
use tonic::server::NamedService;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::config::{Cli, Config, LogFormat};

/// How long in-flight calls and open streams get to finish at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match load_config(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dpu-service: error: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = init_logging(&config) {
        eprintln!("dpu-service: error: {e:#}");
        return ExitCode::from(2);
    }
    if cli.check_config {
        return match StateHandle::open(config.state.dir.as_deref()) {
            Ok(h) => {
                let s = h.snapshot();
                println!(
                    "configuration OK; state: {} tenants, {} subsystems, {} storage clusters",
                    s.tenants.len(),
                    s.subsystems.len(),
                    s.clusters.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("dpu-service: error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // The CPUs this process may use: nothing has pinned this thread yet.
    let all = match dpu_os::affinity::current_thread_cpus() {
        Ok(all) => Some(all),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read this process's CPUs; the control plane's threads run anywhere");
            None
        }
    };
    let control = all
        .as_deref()
        .and_then(|all| runtime::control_cpus(all, &config));
    let runtime = match runtime::build("dpu-control", control.clone()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dpu-service: error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(cpus) = &control {
        runtime::keep_to(cpus);
    }
    match runtime.block_on(run(config, all)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("dpu-service: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load_config(cli: &Cli) -> Result<Config> {
    let mut config = match &cli.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    config.apply(cli)?;
    config.validate()?;
    Ok(config)
}

fn init_logging(config: &Config) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log.level)
        .with_context(|| format!("log.level {:?} is not a valid filter", config.log.level))?;
    // Colours only for a person at a terminal, and never when NO_COLOR is set.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match config.log.format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Logs configuration the state refers to but this configuration lacks. It
/// is kept, never dropped, and applies again once the port is back.
fn warn_dangling(state: &State, config: &Config) {
    for t in state.tenants.values() {
        for a in &t.attachments {
            if !config.ports.iter().any(|p| p.id == a.port()) {
                tracing::warn!(tenant = %t.id, attachment = %a, "attachment names a port the configuration does not declare; kept");
            }
        }
    }
}

fn tls_config(config: &Config) -> Result<Option<ServerTlsConfig>> {
    let g = &config.grpc;
    let (Some(cert), Some(key)) = (&g.tls_cert, &g.tls_key) else {
        return Ok(None);
    };
    let read =
        |p: &std::path::Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let mut tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(read(cert)?, read(key)?))
        .timeout(Duration::from_secs(g.handshake_timeout_secs));
    if let Some(ca) = &g.tls_client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    Ok(Some(tls))
}

async fn shutdown_signal() -> Result<&'static str> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => { r.context("waiting for SIGINT")?; Ok("SIGINT") }
        _ = term.recv() => Ok("SIGTERM"),
    }
}

/// Runs the daemon until a signal stops it; `all` are the CPUs of the
/// process, on which the data plane and the NVMe/TCP target start.
/// Descriptors kept aside from NVMe/TCP connections: state, ports,
/// backends, gRPC and metrics clients.
const SPARE_FILES: u64 = 1024;

/// Raises the open-file limit to the hard limit (each NVMe/TCP
/// connection holds a socket) and says what each plane may hold of it:
/// the NVMe/TCP target its `storage.max_connections`, the API and its
/// health listener `grpc.max_connections` each, the metrics
/// `metrics.max_connections`, and [`SPARE_FILES`] for the rest. Each
/// plane's listeners refuse connections past its share, so one plane
/// exhausting its share leaves the others theirs. When the shares do not
/// fit the limit, it says so: past the limit, connections would fail at
/// accept instead of being refused by their plane's own bound.
fn open_files(config: &Config) {
    let nvmf = config.transport().max_connections as u64;
    let api = config.grpc.max_connections as u64
        * if config.grpc.health_listen.is_some() {
            2
        } else {
            1
        };
    let metrics = if config.metrics.listen.is_some() {
        config.metrics.max_connections as u64
    } else {
        0
    };
    let need = nvmf + api + metrics + SPARE_FILES;
    match dpu_os::limits::raise_open_files() {
        Ok(l) => {
            tracing::info!(
                before = ?l.before,
                now = ?l.now,
                nvmf_tcp = nvmf,
                api,
                metrics,
                spare = SPARE_FILES,
                "open-file limit, and the most each plane holds"
            );
            if let Some(now) = l.now.filter(|&n| n < need) {
                tracing::warn!(
                    limit = now,
                    need,
                    "the open-file limit is below the planes' shares (storage.max_connections, \
                     grpc.max_connections, metrics.max_connections, and {SPARE_FILES} spare): \
                     once it is reached connections fail at accept, whichever plane holds the \
                     descriptors; raise the container's nofile limit or lower those bounds"
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
}

/// A gRPC server with the listener's HTTP/2 bounds: streams per
/// connection, keepalive pings, and the TLS handshake's time (also bounded
/// with the first call's by the listener's [`listen::Gate`]).
fn api_server(config: &Config) -> Server {
    let g = &config.grpc;
    let ping = (g.keepalive_secs > 0).then(|| Duration::from_secs(g.keepalive_secs));
    Server::builder()
        .max_concurrent_streams(g.max_streams_per_connection)
        .http2_keepalive_interval(ping)
        .http2_keepalive_timeout(Some(Duration::from_secs(g.keepalive_timeout_secs)))
        .tcp_nodelay(true)
}

async fn run(config: Config, all: Option<Vec<usize>>) -> Result<()> {
    let state = StateHandle::open(config.state.dir.as_deref())?;
    config.prepare_file_dirs()?;
    let backing = config.backing_policy()?;
    // The state directory exists by now: it may keep the host ID.
    let host_nqn = remote::default_host_nqn(
        config.storage.host_nqn.as_deref(),
        std::path::Path::new(remote::MACHINE_ID),
        config.state.dir.as_deref(),
    )?;
    let first = state.published();
    {
        let s = &first.state;
        tracing::info!(
            state_dir = ?config.state.dir,
            tenants = s.tenants.len(),
            subsystems = s.subsystems.len(),
            "state loaded"
        );
        warn_dangling(s, &config);
    }
    open_files(&config);
    let telemetry = Arc::new(Telemetry::default());
    let dp = if config.dataplane_driver().is_some() {
        let (cfg, s) = (config.clone(), first.state.clone());
        let start = move || dataplane::Dataplane::start(&cfg, &s);
        let dp = runtime::start_on(all.clone(), "the data plane", start).await??;
        telemetry.register(dp.counters());
        Some(dp)
    } else {
        tracing::info!("no port has a data-plane driver; switching is off");
        None
    };
    // Tenant, rule and attachment calls return once every worker has
    // taken their change.
    let (feed_task, switch_applied) = match &dp {
        Some(dp) => {
            let (task, applied) = dp.feed().follow(&state, first.generation);
            (Some(task), Some(applied))
        }
        None => (None, None),
    };
    let nvmf = {
        let s = first.state.clone();
        let discovery = config.storage.discovery_listen;
        let tcp = config.transport();
        let limits = config.target_limits();
        let backing = backing.clone();
        // Placement was checked with the configuration; this only fails
        // if the process's CPUs changed since.
        let start = move || storage::Storage::start(&s, discovery, &tcp, limits, backing);
        runtime::start_on(all, "the NVMe/TCP target", start)
            .await?
            .map_err(|e| anyhow::anyhow!("storage.{e}"))?
    };
    telemetry.register(nvmf.counters(state.clone()));
    // Storage calls return once the target has applied their change.
    let (nvmf_task, storage_applied) = nvmf.follow(&state, first.generation);
    // Storage endpoints in tenants' networks need the switch.
    let storage_endpoints = match &dp {
        Some(dp) => Some(
            endpoint_stacks::Endpoints::start(
                nvmf.endpoint_plan(),
                dp.switch(),
                dp.endpoint_settings(&config.transport()),
                (config.storage.endpoint_placement == config::EndpointPlacement::Worker)
                    .then(|| dp.inline_slot()),
            )
            .context("starting the storage endpoints' thread")?,
        ),
        None => None,
    };
    let ctl = Arc::new(Control {
        state,
        ports: config
            .port_specs()
            .into_iter()
            .map(|p| (p.id.clone(), p))
            .collect(),
        telemetry,
        limits: config.limits(),
        backing: Arc::new(backing),
        facts: ServiceFacts {
            version: env!("CARGO_PKG_VERSION").to_string(),
            target_triple: env!("DPU_TARGET_TRIPLE").to_string(),
            dpdk_version: match dp.as_ref().map(dataplane::Dataplane::driver) {
                #[cfg(feature = "dpdk")]
                Some("dpdk") => dpdk::version(),
                _ => String::new(),
            },
            dataplane_driver: dp
                .as_ref()
                .map_or("none", dataplane::Dataplane::driver)
                .to_string(),
            capabilities: [
                "tenants",
                "ports",
                "filter",
                "storage",
                "remote",
                "telemetry",
            ]
            .into_iter()
            .chain(cfg!(feature = "rbd").then_some("rbd"))
            .map(String::from)
            .collect(),
            start_time: Timestamp::now(),
            hostname: hostname(),
        },
        storage_applied: Some(storage_applied),
        switch_applied,
        store_probe: Some(rbd::probe()),
        served: Some(nvmf.served()),
        host_nqn,
    });
    let api = Api::new(ctl.clone());
    // Tenants first: a declared listener may be an endpoint in one.
    config::seed_tenants::seed_tenants(&api, &config.tenants).await?;
    config::seed::seed_storage(&api, &config.storage).await?;

    let tls = tls_config(&config)?;
    let authz = AuthzLayer::new(Arc::new(config.authz_policy()?), ctl.telemetry.clone());
    if config.grpc.tls_client_ca.is_some() && config.grpc.clients.is_empty() {
        tracing::warn!("grpc.clients is empty: every client certificate is refused; name the API's clients and their roles");
    }
    let grpc_addr = config.grpc.listen;
    let grpc_listener = tokio::net::TcpListener::bind(grpc_addr)
        .await
        .with_context(|| format!("binding the gRPC listener on {grpc_addr}"))?;
    let (stop_tx, stop_rx) = watch::channel(false);

    let metrics_task = match config.metrics.listen {
        Some(addr) => {
            let l = metrics::bind(addr)
                .await
                .with_context(|| format!("binding the metrics listener on {addr}"))?;
            tracing::info!(%addr, "metrics listening on http://{addr}/metrics");
            let gate = listen::Gate::new("metrics", config.metrics_limits());
            ctl.telemetry.register(gate.clone());
            Some(tokio::spawn(metrics::serve(
                l,
                gate,
                ctl.clone(),
                stop_rx.clone(),
            )))
        }
        None => None,
    };

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<InfoServiceServer<Api>>().await;
    health.set_serving::<TenantServiceServer<Api>>().await;
    health.set_serving::<PortServiceServer<Api>>().await;
    health.set_serving::<FilterServiceServer<Api>>().await;
    health.set_serving::<StorageServiceServer<Api>>().await;
    health.set_serving::<TelemetryServiceServer<Api>>().await;
    health.set_serving::<FrontendNvmeServiceServer<Api>>().await;
    health.set_serving::<MallocVolumeServiceServer<Api>>().await;
    health
        .set_serving::<NvmeRemoteControllerServiceServer<Api>>()
        .await;
    health.set_serving::<AioVolumeServiceServer<Api>>().await;
    health.set_serving::<NullVolumeServiceServer<Api>>().await;
    health
        .set_serving::<LogicalBridgeServiceServer<Api>>()
        .await;
    health.set_serving::<BridgePortServiceServer<Api>>().await;
    health.set_serving::<VrfServiceServer<Api>>().await;
    health.set_serving::<SviServiceServer<Api>>().await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(dpu_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(dpu_proto::OPI_STORAGE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(dpu_proto::OPI_NETWORK_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(dpu_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(dpu_proto::OPI_STORAGE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(dpu_proto::OPI_NETWORK_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("building the reflection service")?;

    let health_task = match config.grpc.health_listen {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the gRPC health listener on {addr}"))?;
            let bound = l.local_addr().unwrap_or(addr);
            let mut stop = stop_rx.clone();
            let gate = listen::Gate::new("grpc_health", config.api_limits());
            ctl.telemetry.register(gate.clone());
            let router = api_server(&config)
                .layer(listen::layer::CallLayer::new(gate.clone()))
                .add_service(health_service.clone());
            tracing::info!(addr = %bound, "gRPC health (plain text, health only) listening");
            Some(tokio::spawn(router.serve_with_incoming_shutdown(
                listen::incoming::Incoming::new(l, gate),
                async move {
                    let _ = stop.changed().await;
                },
            )))
        }
        None => None,
    };

    let gate = listen::Gate::new("grpc", config.api_limits());
    ctl.telemetry.register(gate.clone());
    let mut builder = api_server(&config);
    let secure = tls.is_some();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).context("TLS configuration")?;
    }
    let mut grpc_stop = stop_rx.clone();
    // Each service takes what its largest valid request needs under the
    // configured caps; lists are counted before decoding (`Bounded`).
    let limits = ctl.limits;
    let size = |name: &str| request_bytes(name, &limits);
    // Every call of the API listener is authorized by its method first.
    let router = builder
        .layer(listen::layer::CallLayer::new(gate.clone()))
        .layer(authz)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            InfoServiceServer::new(api.clone())
                .max_decoding_message_size(size(<InfoServiceServer<Api> as NamedService>::NAME)),
        )
        .add_service(Bounded::new(
            TenantServiceServer::new(api.clone())
                .max_decoding_message_size(size(<TenantServiceServer<Api> as NamedService>::NAME)),
            limits,
            ctl.telemetry.clone(),
        ))
        .add_service(
            PortServiceServer::new(api.clone())
                .max_decoding_message_size(size(<PortServiceServer<Api> as NamedService>::NAME)),
        )
        .add_service(Bounded::new(
            FilterServiceServer::new(api.clone())
                .max_decoding_message_size(size(<FilterServiceServer<Api> as NamedService>::NAME)),
            limits,
            ctl.telemetry.clone(),
        ))
        .add_service(Bounded::new(
            StorageServiceServer::new(api.clone())
                .max_decoding_message_size(size(<StorageServiceServer<Api> as NamedService>::NAME)),
            limits,
            ctl.telemetry.clone(),
        ))
        .add_service(
            TelemetryServiceServer::new(api.clone()).max_decoding_message_size(size(
                <TelemetryServiceServer<Api> as NamedService>::NAME,
            )),
        )
        // OPI's NVMe front end over the same state (docs/opi.md).
        .add_service(
            FrontendNvmeServiceServer::new(api.clone()).max_decoding_message_size(size(
                <FrontendNvmeServiceServer<Api> as NamedService>::NAME,
            )),
        )
        // OPI's volumes: views of the dpu.v1 volumes.
        .add_service(
            MallocVolumeServiceServer::new(api.clone()).max_decoding_message_size(size(
                <MallocVolumeServiceServer<Api> as NamedService>::NAME,
            )),
        )
        // OPI's remote NVMe controllers: remote subsystems namespaces are
        // made from.
        .add_service(
            NvmeRemoteControllerServiceServer::new(api.clone()).max_decoding_message_size(size(
                <NvmeRemoteControllerServiceServer<Api> as NamedService>::NAME,
            )),
        )
        .add_service(
            AioVolumeServiceServer::new(api.clone()).max_decoding_message_size(size(
                <AioVolumeServiceServer<Api> as NamedService>::NAME,
            )),
        )
        .add_service(
            NullVolumeServiceServer::new(api.clone()).max_decoding_message_size(size(
                <NullVolumeServiceServer<Api> as NamedService>::NAME,
            )),
        )
        // OPI's EVPN gateway: logical bridges and bridge ports are views
        // of tenants and their port attachments; VRFs and SVIs are
        // answered UNIMPLEMENTED.
        .add_service(
            LogicalBridgeServiceServer::new(api.clone()).max_decoding_message_size(size(
                <LogicalBridgeServiceServer<Api> as NamedService>::NAME,
            )),
        )
        .add_service(
            BridgePortServiceServer::new(api.clone()).max_decoding_message_size(size(
                <BridgePortServiceServer<Api> as NamedService>::NAME,
            )),
        )
        .add_service(
            VrfServiceServer::new(api.clone())
                .max_decoding_message_size(size(<VrfServiceServer<Api> as NamedService>::NAME)),
        )
        .add_service(
            SviServiceServer::new(api)
                .max_decoding_message_size(size(<SviServiceServer<Api> as NamedService>::NAME)),
        );
    let bound: SocketAddr = grpc_listener.local_addr().unwrap_or(grpc_addr);
    let incoming = listen::incoming::Incoming::new(grpc_listener, gate);
    let mut server = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async move {
        let _ = grpc_stop.changed().await;
    }));
    tracing::info!(
        addr = %bound,
        tls = secure,
        mtls = config.grpc.tls_client_ca.is_some(),
        clients = config.grpc.clients.len(),
        "gRPC listening"
    );

    let reason = tokio::select! {
        r = shutdown_signal() => r?,
        r = &mut server => {
            r.context("gRPC server task")?.context("gRPC server")?;
            "server stopped"
        }
    };
    tracing::info!(reason, "shutting down");
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let _ = stop_tx.send(true);
    if !server.is_finished()
        && tokio::time::timeout(SHUTDOWN_GRACE, &mut server)
            .await
            .is_err()
    {
        tracing::warn!("open calls did not finish within {SHUTDOWN_GRACE:?}; closing them");
        server.abort();
    }
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    if let Some(mut t) = health_task {
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut t).await.is_err() {
            t.abort();
        }
    }
    if let Some(t) = feed_task {
        t.abort();
    }
    nvmf_task.abort();
    if let Some(mut e) = storage_endpoints {
        tokio::task::spawn_blocking(move || e.stop())
            .await
            .context("storage endpoints' stop task")?;
    }
    tokio::task::spawn_blocking(move || nvmf.shutdown())
        .await
        .context("NVMe/TCP target stop task")?;
    if let Some(dp) = dp {
        tokio::task::spawn_blocking(move || dp.stop())
            .await
            .context("data-plane stop task")?;
    }
    tracing::info!("stopped");
    Ok(())
}
