//! OPI's NVMe front end (`opi_api.storage.v1.FrontendNvmeService`) through
//! the real binary, driven by pydpu from PyPI (`tests/python/opi_client.py`:
//! a client generated from OPI's protos, not ours): pydpu's own CLI
//! sequence, create/get/list with paging/stats/update/delete, the
//! refusals naming OPI's fields, an NVMe/TCP controller that a host then
//! discovers and does I/O through (counted in OPI's stats). What OPI made is a `dpu.v1` subsystem
//! that `dpuctl` shows and changes, and OPI sees the change; it survives
//! a restart; a caller with the reader role reads through OPI and is
//! refused every change, as through `dpu.v1`; many callers at once and
//! oversized requests are held to the service's limits.

use std::process::Command;

use anyhow::{ensure, Context, Result};
use dpu_e2e::{binary, free_port, nvmf_perf_iops, Service, TEST_CONFIG};
use dpu_proto::opi::storage::v1 as opi;

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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async { call(Client::connect(svc.endpoint()).await?).await })
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
    let port = free_port();
    let out = opi_client(&svc, &["--keep", "opi-kept", "--port", &port.to_string()])?;
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
