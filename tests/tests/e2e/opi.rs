//! OPI's NVMe front end (`opi_api.storage.v1.FrontendNvmeService`) through
//! the real binary, driven by pydpu from PyPI (`tests/python/opi_client.py`:
//! a client generated from OPI's protos, not ours): pydpu's own CLI
//! sequence, create/get/list with paging/stats/update/delete, the
//! refusals naming OPI's fields, an NVMe/TCP controller that a host then
//! discovers and does I/O through (counted in OPI's stats). What OPI made is a `dpu.v1` subsystem
//! that `dpuctl` shows and changes, and OPI sees the change; it survives
//! a restart; a caller with the reader role reads through OPI and is
//! refused every change, as through `dpu.v1`; many callers at once and
//! oversized requests are held to the service's limits. OPI's namespaces
//! are `dpu.v1` namespaces on volumes: pydpu's objects and CLI sequence
//! on volume `Malloc1`, each API seeing what the other made, a host doing
//! I/O on a namespace OPI made and reading its EUI-64, one namespace per
//! volume, and a restart keeping them.

use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dpu_e2e::{binary, free_port, nvmf_perf_iops, Service, TEST_CONFIG};
use dpu_nvmeof::host::{self, Controller, ControllerOptions, HostIdentity, QueueOptions, Transfer};
use dpu_proto::opi::storage::v1 as opi;
use dpu_proto::v1 as pb;

const H1: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-0000000000d1";
const H3: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-0000000000d3";

/// `tests/python/opi_client.py` with `args` against `svc`.
fn opi_client(svc: &Service, args: &[&str]) -> Result<String> {
    let script = dpu_e2e::repo_root().join("tests/python/run.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("opi-client")
        .args(["--target", &svc.grpc.to_string()])
        .args(args)
        .output()
        .context("running tests/python/run.sh opi-client")?;
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success(),
        "the OPI client failed:\n{text}\n{}",
        svc.log_text()
    );
    Ok(text)
}

/// OPI's front-end client on `svc`, for one call.
type Client =
    opi::frontend_nvme_service_client::FrontendNvmeServiceClient<tonic::transport::Channel>;

/// Runs `call` with a client of OPI's front end connected to `svc`.
fn with_client<T, F>(svc: &Service, call: impl FnOnce(Client) -> F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    dpu_e2e::block_on(async { call(Client::connect(svc.endpoint()).await?).await })
}

/// The subsystem `name` as OPI's `GetNvmeSubsystem` shows it.
fn opi_get(svc: &Service, name: &str) -> Result<opi::NvmeSubsystem> {
    let req = opi::GetNvmeSubsystemRequest { name: name.into() };
    with_client(svc, |mut c| async move {
        Ok(c.get_nvme_subsystem(req).await?.into_inner())
    })
}

/// The counters OPI's `StatsNvmeSubsystem` gives for `name`.
fn opi_stats(svc: &Service, name: &str) -> Result<opi::VolumeStats> {
    let req = opi::StatsNvmeSubsystemRequest { name: name.into() };
    with_client(svc, |mut c| async move {
        c.stats_nvme_subsystem(req)
            .await?
            .into_inner()
            .stats
            .context("no stats")
    })
}

#[test]
fn pydpu_drives_subsystems_that_dpu_v1_shares() -> Result<()> {
    let mut svc = Service::start()?;
    // Two ports bound and released by this process: the one next to a
    // free port is often an outgoing connection's (Linux gives bind and
    // connect ports of opposite parity).
    let port = free_port();
    let other = std::iter::repeat_with(free_port)
        .find(|&p| p != port)
        .context("no second free port")?;
    let out = opi_client(
        &svc,
        &[
            "--keep",
            "opi-kept",
            "--port",
            &port.to_string(),
            "--other-port",
            &other.to_string(),
        ],
    )?;
    ensure!(out.contains("admin sequence OK"), "{out}");

    // The controller OPI made listens: the discovery log names the
    // subsystem there, and its allowed host does I/O once dpu.v1 gave it
    // a namespace.
    let perf = Command::new(binary("nvmf-perf")?)
        .args([
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--hostnqn",
            H1,
            "--discover",
        ])
        .output()?;
    let text = String::from_utf8_lossy(&perf.stdout);
    ensure!(
        perf.status.success() && text.contains(&format!("{port} nqn.2022-09.io.spdk:opi-kept")),
        "discovery through the OPI controller:\n{text}\n{}",
        String::from_utf8_lossy(&perf.stderr)
    );
    svc.dpuctl_ok(&["namespace", "create", "opi-kept", "--ram", "16M"])?;
    let iops = nvmf_perf_iops(
        port,
        "nqn.2022-09.io.spdk:opi-kept",
        &[
            "--hostnqn",
            H1,
            "--job",
            "randwrite:4k:8",
            "--job",
            "randread:4k:8",
            "--time",
            "1",
        ],
    )?;
    ensure!(iops > 100.0, "{iops:.0} IOPS through the OPI controller");
    let stats = opi_stats(&svc, "nvmeSubsystems/opi-kept")?;
    ensure!(
        stats.write_ops_count > 100 && stats.read_ops_count > 100,
        "OPI's stats do not show the I/O: {stats:?}"
    );

    // dpu.v1 sees what OPI made: its NQN, model and its one host.
    let s = svc.dpuctl_json(&["subsystem", "get", "opi-kept"])?;
    ensure!(
        s["nqn"] == "nqn.2022-09.io.spdk:opi-kept" && s["modelNumber"] == "OPI Model",
        "{s}"
    );
    ensure!(s["allowedHosts"] == serde_json::json!([H1]), "{s}");
    // Only it is left of what the client made.
    let list = svc.dpuctl_json(&["subsystem", "list"])?;
    ensure!(list.as_array().map(Vec::len) == Some(1), "{list}");

    // A change through dpu.v1 shows through OPI.
    svc.dpuctl_ok(&["subsystem", "update", "opi-kept", "--model", "Changed"])?;
    let o = opi_get(&svc, "nvmeSubsystems/opi-kept")?;
    let spec = o.spec.context("no spec")?;
    ensure!(
        spec.model_number == "Changed" && spec.hostnqn == H1,
        "{spec:?}"
    );
    // Two hosts are no longer OPI's one host: hostnqn is empty then.
    svc.dpuctl_ok(&["subsystem", "add-host", "opi-kept", H3])?;
    let spec = opi_get(&svc, "nvmeSubsystems/opi-kept")?
        .spec
        .context("no spec")?;
    ensure!(spec.hostnqn.is_empty(), "{spec:?}");

    // OPI's calls are counted by method and code, as dpu.v1's are.
    let m = svc.http_get("/metrics")?.1;
    for want in [
        "dpu_grpc_requests_total{method=\"/opi_api.storage.v1.FrontendNvmeService/CreateNvmeController\",code=\"Ok\"}",
        "dpu_grpc_requests_total{method=\"/opi_api.storage.v1.FrontendNvmeService/CreateNvmeController\",code=\"InvalidArgument\"}",
        "dpu_grpc_requests_total{method=\"/opi_api.storage.v1.FrontendNvmeService/StatsNvmeSubsystem\",code=\"Ok\"}",
    ] {
        ensure!(m.contains(want), "{want} is not on /metrics");
    }

    // Stored once: after a restart both APIs still have it.
    svc.restart()?;
    let o = opi_get(&svc, "nvmeSubsystems/opi-kept")?;
    ensure!(
        o.spec.map(|s| s.model_number) == Some("Changed".into()),
        "after restart"
    );
    Ok(())
}

#[test]
fn a_reader_reads_through_opi_and_changes_nothing() -> Result<()> {
    let config = format!("{TEST_CONFIG}\n[grpc]\nanonymous_role = \"reader\"\n");
    let svc = Service::start_config(&config, &[])?;
    let out = opi_client(&svc, &["--reader"])?;
    ensure!(out.contains("reader sequence OK"), "{out}");
    // The refusals are counted as dpu.v1's are.
    let m = svc.http_get("/metrics")?.1;
    ensure!(
        m.contains("opi_api.storage.v1.FrontendNvmeService/CreateNvmeSubsystem"),
        "the refused OPI call is not counted:\n{m}"
    );
    Ok(())
}

/// Numerous and hostile OPI callers are held to the same bounds as
/// `dpu.v1`'s: 64 connections racing to create subsystems past
/// `limits.max_subsystems` get exactly that many and
/// `RESOURCE_EXHAUSTED` naming the key for the rest; controllers past
/// `limits.max_listeners` likewise; a request over the size the service
/// decodes is refused before it is decoded; a huge page size is capped
/// and a negative one refused by name; and the service answers throughout.
#[test]
fn opi_callers_are_held_to_the_service_limits() -> Result<()> {
    let config = format!("{TEST_CONFIG}\n[limits]\nmax_subsystems = 4\nmax_listeners = 2\n");
    let svc = Service::start_config(&config, &[])?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let endpoint = svc.endpoint();
    let codes = rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..64 {
            let endpoint = endpoint.clone();
            tasks.push(tokio::spawn(async move {
                // A connection of its own each.
                let mut c = Client::connect(endpoint).await?;
                let r = c
                    .create_nvme_subsystem(opi::CreateNvmeSubsystemRequest {
                        nvme_subsystem_id: format!("race-{i}"),
                        nvme_subsystem: Some(opi::NvmeSubsystem {
                            spec: Some(opi::NvmeSubsystemSpec {
                                nqn: format!("nqn.2022-09.io.spdk:race{i}"),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                    })
                    .await;
                anyhow::Ok(
                    r.map(|_| ())
                        .map_err(|e| (e.code(), e.message().to_string())),
                )
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await??);
        }
        anyhow::Ok(out)
    })?;
    let made = codes.iter().filter(|r| r.is_ok()).count();
    ensure!(
        made == 4,
        "{made} subsystems made past a cap of 4: {codes:?}"
    );
    for r in codes.iter().filter_map(|r| r.as_ref().err()) {
        ensure!(
            r.0 == tonic::Code::ResourceExhausted && r.1.contains("limits.max_subsystems"),
            "{r:?}"
        );
    }
    let list = svc.dpuctl_json(&["subsystem", "list"])?;
    ensure!(list.as_array().map(Vec::len) == Some(4), "{list}");
    // One the race made (which ones win is the race's).
    let winner = format!(
        "nvmeSubsystems/race-{}",
        codes.iter().position(Result::is_ok).context("none made")?
    );

    rt.block_on(async {
        let mut c = Client::connect(endpoint.clone()).await?;
        // Controllers past max_listeners.
        let mut refused = None;
        for i in 0..3 {
            let r = c
                .create_nvme_controller(opi::CreateNvmeControllerRequest {
                    parent: winner.clone(),
                    nvme_controller_id: format!("tcp{i}"),
                    nvme_controller: Some(opi::NvmeController {
                        spec: Some(opi::NvmeControllerSpec {
                            endpoint: Some(opi::nvme_controller_spec::Endpoint::FabricsId(
                                opi::FabricsEndpoint {
                                    traddr: "127.0.0.1".into(),
                                    trsvcid: free_port().to_string(),
                                    ..Default::default()
                                },
                            )),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                })
                .await;
            if let Err(e) = r {
                refused = Some((i, e));
                break;
            }
        }
        let (i, e) = refused.context("a third listener was made past a cap of 2")?;
        ensure!(
            i == 2
                && e.code() == tonic::Code::ResourceExhausted
                && e.message().contains("limits.max_listeners"),
            "controller {i}: {e:?}"
        );
        // A request larger than the service decodes: refused undecoded.
        let e = c
            .create_nvme_subsystem(opi::CreateNvmeSubsystemRequest {
                nvme_subsystem_id: "big".into(),
                nvme_subsystem: Some(opi::NvmeSubsystem {
                    spec: Some(opi::NvmeSubsystemSpec {
                        nqn: "nqn.2022-09.io.spdk:big".into(),
                        psk: vec![b'A'; 4 << 20],
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .await
            .expect_err("a 4 MiB request was decoded");
        ensure!(
            matches!(
                e.code(),
                tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
            ),
            "{e:?}"
        );
        // Page sizes: capped, and a negative one refused by name.
        let page = c
            .list_nvme_subsystems(opi::ListNvmeSubsystemsRequest {
                page_size: i32::MAX,
                ..Default::default()
            })
            .await?
            .into_inner();
        ensure!(page.nvme_subsystems.len() == 4, "{page:?}");
        let e = c
            .list_nvme_subsystems(opi::ListNvmeSubsystemsRequest {
                page_size: -1,
                ..Default::default()
            })
            .await
            .expect_err("a negative page size");
        ensure!(
            e.code() == tonic::Code::InvalidArgument && e.message().contains("page_size"),
            "{e:?}"
        );
        // Still answering.
        c.get_nvme_subsystem(opi::GetNvmeSubsystemRequest {
            name: winner.clone(),
        })
        .await?;
        anyhow::Ok(())
    })?;
    Ok(())
}

/// A `dpu.v1` storage client on `svc`, for one call.
type Storage = pb::storage_service_client::StorageServiceClient<tonic::transport::Channel>;

/// Runs `call` with a `dpu.v1` storage client connected to `svc`.
fn with_storage<T, F>(svc: &Service, call: impl FnOnce(Storage) -> F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    dpu_e2e::block_on(async { call(Storage::connect(svc.endpoint()).await?).await })
}

/// The EUI-64 OPI's client gives a namespace (pydpu's).
const EUI64: i64 = 1_967_554_867_335_598_546;

/// Namespace `name` as OPI's `GetNvmeNamespace` shows it.
fn opi_namespace(svc: &Service, name: &str) -> Result<opi::NvmeNamespace> {
    let req = opi::GetNvmeNamespaceRequest { name: name.into() };
    with_client(svc, |mut c| async move {
        Ok(c.get_nvme_namespace(req).await?.into_inner())
    })
}

/// Namespace `name` as `dpu.v1`'s `GetNamespace` shows it.
fn dpu_namespace(svc: &Service, name: &str) -> Result<pb::Namespace> {
    let req = pb::GetNamespaceRequest { name: name.into() };
    with_storage(svc, |mut c| async move {
        Ok(c.get_namespace(req).await?.into_inner())
    })
}

/// A namespace OPI's way: on volume `volume`, with pydpu's EUI-64.
fn opi_create_namespace(parent: &str, id: &str, volume: &str) -> opi::CreateNvmeNamespaceRequest {
    opi::CreateNvmeNamespaceRequest {
        parent: parent.into(),
        nvme_namespace_id: id.into(),
        nvme_namespace: Some(opi::NvmeNamespace {
            spec: Some(opi::NvmeNamespaceSpec {
                volume_name_ref: volume.into(),
                eui64: EUI64,
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// Host H1 on subsystem `nqn` at 127.0.0.1:`port`: namespace 1's EUI-64
/// from Identify Namespace and from the Namespace Identification
/// Descriptor list, after writing a block pattern to it and reading it
/// back.
fn host_io(port: u16, nqn: &str) -> Result<([u8; 8], [u8; 8])> {
    let opts = ControllerOptions {
        kato: Duration::from_secs(10),
        queue: QueueOptions {
            timeout: Some(Duration::from_secs(20)),
            ..QueueOptions::default()
        },
    };
    let me = HostIdentity::new(H1, [0xd1; 16]);
    let addr = ("127.0.0.1", port);
    let mut ctrl = Controller::connect(TcpStream::connect(addr)?, &me, nqn, &opts)?;
    ensure!(ctrl.set_io_queues(1)? >= 1);
    let mut io = ctrl.io_queue(TcpStream::connect(addr)?, 1, 16)?;
    let block = ctrl.identify_namespace(1)?.block_size as usize;
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    let nlb = (data.len() / block - 1) as u16;
    let w = io.call(host::write(1, 8, nlb), Transfer::Write(data.clone()))?;
    ensure!(w.is_success(), "write: {:?}", w.status());
    let r = io.call(host::read(1, 8, nlb), Transfer::Read(vec![0; data.len()]))?;
    ensure!(
        r.is_success() && r.data == data,
        "read back: {:?}",
        r.status()
    );
    let mut eui = |cns: u8, at: usize| -> Result<[u8; 8]> {
        let d = ctrl
            .admin()
            .call(host::identify(cns, 1), Transfer::Read(vec![0; 4096]))?;
        ensure!(d.is_success(), "identify {cns}: {:?}", d.status());
        Ok(d.data[at..at + 8].try_into()?)
    };
    // EUI64 is bytes 120..128 of Identify Namespace; an EUI-64 descriptor
    // (NIDT 1, NIDL 8) comes first in the list, its identifier at 4.
    let from_ns = eui(0x00, 120)?;
    let list = eui(0x03, 0)?;
    ensure!(list[..2] == [1, 8], "no EUI-64 descriptor first: {list:?}");
    let from_list = eui(0x03, 4)?;
    Ok((from_ns, from_list))
}

#[test]
fn opi_namespaces_are_dpu_v1_namespaces_on_volumes() -> Result<()> {
    let mut svc = Service::start()?;
    // The volume pydpu's namespaces are made on, through dpu.v1.
    with_storage(&svc, |mut c| async move {
        c.create_volume(pb::CreateVolumeRequest {
            volume_id: "Malloc1".into(),
            volume: Some(pb::Volume {
                backend: Some(pb::volume::Backend::Ram(pb::RamBackend {
                    size_bytes: 16 << 20,
                })),
                ..Default::default()
            }),
        })
        .await?;
        Ok(())
    })?;
    let out = opi_client(&svc, &["--namespaces"])?;
    ensure!(out.contains("namespace sequence OK"), "{out}");

    // A subsystem for H1 with a controller, and a namespace on Malloc1 by
    // its OPI name; a second namespace on the volume is refused.
    let port = free_port();
    const NQN: &str = "nqn.2022-09.io.spdk:opi-io";
    const NAME: &str = "nvmeSubsystems/opi-io/nvmeNamespaces/opi-ns";
    let made = with_client(&svc, |mut c| async move {
        c.create_nvme_subsystem(opi::CreateNvmeSubsystemRequest {
            nvme_subsystem_id: "opi-io".into(),
            nvme_subsystem: Some(opi::NvmeSubsystem {
                spec: Some(opi::NvmeSubsystemSpec {
                    nqn: NQN.into(),
                    hostnqn: H1.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await?;
        c.create_nvme_controller(opi::CreateNvmeControllerRequest {
            parent: "nvmeSubsystems/opi-io".into(),
            nvme_controller_id: "tcp0".into(),
            nvme_controller: Some(opi::NvmeController {
                spec: Some(opi::NvmeControllerSpec {
                    endpoint: Some(opi::nvme_controller_spec::Endpoint::FabricsId(
                        opi::FabricsEndpoint {
                            traddr: "127.0.0.1".into(),
                            trsvcid: port.to_string(),
                            ..Default::default()
                        },
                    )),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await?;
        let made = c
            .create_nvme_namespace(opi_create_namespace(
                "nvmeSubsystems/opi-io",
                "opi-ns",
                "mallocVolumes/Malloc1",
            ))
            .await?
            .into_inner();
        let e = c
            .create_nvme_namespace(opi_create_namespace(
                "nvmeSubsystems/opi-io",
                "opi-ns2",
                "Malloc1",
            ))
            .await
            .expect_err("a second namespace on Malloc1");
        ensure!(
            e.code() == tonic::Code::FailedPrecondition
                && e.message().contains("nvme_namespace.spec.volume_name_ref"),
            "{e:?}"
        );
        anyhow::Ok(made)
    })?;
    ensure!(made.name == NAME, "{made:?}");
    let spec = made.spec.clone().context("no spec")?;
    ensure!(
        spec.host_nsid == 1 && spec.eui64 == EUI64 && spec.volume_name_ref == "Malloc1",
        "{spec:?}"
    );

    // dpu.v1 sees it: its volume, ID and EUI-64.
    let ours = dpu_namespace(&svc, "subsystems/opi-io/namespaces/1")?;
    ensure!(
        ours.backend == Some(pb::namespace::Backend::Volume("Malloc1".into()))
            && ours.namespace_id == "opi-ns"
            && ours.eui64 == format!("{EUI64:016x}")
            && ours.state == pb::NamespaceState::Serving as i32,
        "{ours:?}"
    );

    // One made through dpu.v1 shows through OPI by its NSID.
    with_storage(&svc, |mut c| async move {
        c.create_namespace(pb::CreateNamespaceRequest {
            parent: "subsystems/opi-io".into(),
            namespace: Some(pb::Namespace {
                backend: Some(pb::namespace::Backend::Ram(pb::RamBackend {
                    size_bytes: 1 << 20,
                })),
                ..Default::default()
            }),
        })
        .await?;
        Ok(())
    })?;
    let second = opi_namespace(&svc, "nvmeSubsystems/opi-io/nvmeNamespaces/2")?;
    let s2 = second.spec.context("no spec")?;
    ensure!(
        s2.host_nsid == 2 && s2.volume_name_ref.is_empty() && s2.eui64 == 0,
        "{s2:?}"
    );
    let listed = with_client(&svc, |mut c| async move {
        let r = c
            .list_nvme_namespaces(opi::ListNvmeNamespacesRequest {
                parent: "nvmeSubsystems/opi-io".into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        anyhow::Ok(
            r.nvme_namespaces
                .into_iter()
                .map(|n| n.name)
                .collect::<Vec<_>>(),
        )
    })?;
    ensure!(
        listed == [NAME, "nvmeSubsystems/opi-io/nvmeNamespaces/2"],
        "{listed:?}"
    );

    // A host does I/O on the namespace OPI made and reads its EUI-64.
    let (from_ns, from_list) = host_io(port, NQN)?;
    ensure!(
        from_ns == EUI64.to_be_bytes() && from_list == EUI64.to_be_bytes(),
        "the host reads EUI-64 {from_ns:02x?} and {from_list:02x?}"
    );
    let stats = with_client(&svc, |mut c| async move {
        c.stats_nvme_namespace(opi::StatsNvmeNamespaceRequest { name: NAME.into() })
            .await?
            .into_inner()
            .stats
            .context("no stats")
    })?;
    ensure!(
        stats.write_ops_count >= 1 && stats.read_ops_count >= 1,
        "{stats:?}"
    );

    // Stored once: after a restart both APIs still have it, and the
    // target serves it with its EUI-64 again.
    svc.restart()?;
    ensure!(
        opi_namespace(&svc, NAME)?.spec == Some(spec),
        "after restart"
    );
    let ours = dpu_namespace(&svc, "subsystems/opi-io/namespaces/1")?;
    ensure!(
        ours.namespace_id == "opi-ns" && ours.eui64 == format!("{EUI64:016x}"),
        "after restart: {ours:?}"
    );
    let (from_ns, _) = host_io(port, NQN)?;
    ensure!(
        from_ns == EUI64.to_be_bytes(),
        "after restart: {from_ns:02x?}"
    );
    Ok(())
}
