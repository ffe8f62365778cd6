//! A storage endpoint on the DPDK data plane, through the real binary:
//! the service's switch port is a DPDK `net_memif` server, and the host is
//! `nvmf-perf` built with its `memif` feature (`nvmf-perf-memif`, which
//! `tests/run.sh` builds): a memif client with a TCP/IP stack of its own,
//! a station of the tenant. Discovery lists the tenant's subsystem, I/O
//! runs, a second host process on the same port (a new memif connection)
//! is served too, the tenant's counters count the frames, and a deny rule
//! of the tenant on TCP 4420 refuses the connection. A port MTU its
//! driver cannot take stops the start with the port and the reason named.

use std::process::Output;

use anyhow::{ensure, Result};
use dpu_e2e::net::metric;
use dpu_e2e::{binary, output_text as text, Service};

const NQN: &str = "nqn.2024-01.io.dpu-service.test:memif";

/// The service with one DPDK memif server port at `socket`.
fn config(socket: &str) -> String {
    config_mtu("io", socket, None)
}

/// The service with one DPDK memif server port at `socket`, given `mtu`;
/// `tag` keeps EAL files of services running side by side apart.
fn config_mtu(tag: &str, socket: &str, mtu: Option<u16>) -> String {
    config_with(tag, socket, mtu, "thread")
}

/// [`config_mtu`] with the storage endpoints' stacks placed by
/// `placement` (`storage.endpoint_placement`).
fn config_with(tag: &str, socket: &str, mtu: Option<u16>, placement: &str) -> String {
    let mtu = mtu.map_or(String::new(), |m| format!("mtu = {m}\n"));
    format!(
        r#"
[log]
level = "info"

[storage]
endpoint_placement = "{placement}"

[dataplane]
workers = 1
idle = "backoff"
lcores = "0"
no_huge = true
memory_mb = 256
mbufs = 4095
file_prefix = "e2e-memif-{tag}-{}"

[[ports]]
id = "pf0vf0"
role = "vf"
driver = "dpdk"
device = "net_memif0,role=server,socket={socket}"
{mtu}"#,
        std::process::id()
    )
}

/// `nvmf-perf-memif --memif SOCKET args..`, bounded in time.
fn perf(socket: &str, args: &[&str]) -> Result<Output> {
    let bin = binary("nvmf-perf-memif")?;
    Ok(std::process::Command::new("timeout")
        .arg("30")
        .arg(bin)
        .args(["--memif", socket, "--ip", "10.79.0.5/24"])
        .args(args)
        .output()?)
}

/// Writes then reads 4 KiB blocks at the endpoint; both jobs did I/O.
fn io(socket: &str) -> Result<()> {
    let out = perf(
        socket,
        &[
            "--addr",
            "10.79.0.250:4420",
            "--nqn",
            NQN,
            "--time",
            "0.5",
            "--job",
            "randwrite:4k:8",
            "--job",
            "randread:4k:8",
        ],
    )?;
    ensure!(out.status.success(), "nvmf-perf failed: {}", text(&out));
    let iops: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("job"))
        .filter_map(|l| l.split_whitespace().nth(3).and_then(|w| w.parse().ok()))
        .collect();
    ensure!(
        iops.len() == 2 && iops.iter().all(|&v| v > 0.0),
        "no I/O: {}",
        text(&out)
    );
    Ok(())
}

/// Discovery through the memif port lists blue's subsystem at its
/// endpoint.
fn discovers_blue(socket: &str) -> Result<()> {
    let out = perf(socket, &["--addr", "10.79.0.250:4420", "--discover"])?;
    ensure!(
        out.status.success() && text(&out).contains(&format!("10.79.0.250 4420 {NQN}")),
        "discovery through the memif port: {}",
        text(&out)
    );
    Ok(())
}

/// Tenant `blue` on the memif port, default allow, with subsystem `ep`
/// (64 MiB of RAM) at its endpoint 10.79.0.250:4420.
fn blue_with_endpoint(svc: &Service) -> Result<()> {
    svc.dpuctl_ok(&[
        "tenant",
        "create",
        "blue",
        "--default-policy",
        "allow",
        "--port",
        "pf0vf0",
    ])?;
    svc.dpuctl_ok(&[
        "subsystem",
        "create",
        "ep",
        "--nqn",
        NQN,
        "--allow-any-host",
    ])?;
    svc.dpuctl_ok(&["namespace", "create", "ep", "--ram", "64M"])?;
    svc.dpuctl_ok(&[
        "listener",
        "create",
        "ep",
        "--id",
        "ep",
        "--tenant",
        "blue",
        "--address",
        "10.79.0.250",
        "--port",
        "4420",
    ])?;
    Ok(())
}

#[test]
fn a_host_on_a_memif_port_reads_and_writes_through_its_tenants_endpoint() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("memif.sock").display().to_string();
    let svc = Service::start_config(&config(&socket), &[])?;
    blue_with_endpoint(&svc)?;

    discovers_blue(&socket)?;
    io(&socket)?;
    // Another host process: a new memif connection, new TCP connections.
    io(&socket)?;
    let (_, body) = svc.http_get("/metrics")?;
    let rx = metric(&body, "dpu_tenant_rx_packets_total{tenant=\"blue\"}");
    ensure!(rx > 100, "blue's frames were not counted: {rx}\n{body}");

    // The tenant's rules apply to its endpoint: TCP 4420 denied, no
    // connection; allowed again, served again.
    svc.dpuctl_ok(&[
        "rule",
        "add",
        "blue",
        "--id",
        "no-storage",
        "--priority",
        "5",
        "--action",
        "deny",
        "--proto",
        "tcp",
        "--dport",
        "4420",
    ])?;
    let out = perf(&socket, &["--addr", "10.79.0.250:4420", "--discover"])?;
    ensure!(
        !out.status.success() && text(&out).contains("timed out"),
        "a denied connection was made: {}",
        text(&out)
    );
    svc.dpuctl_ok(&["rule", "delete", "blue", "no-storage"])?;
    io(&socket)?;
    Ok(())
}

/// The endpoint's stack run by the DPDK worker itself
/// (`storage.endpoint_placement = "worker"`): discovery and I/O through
/// the switch, twice, with no endpoint thread in the service.
#[test]
fn an_endpoint_placed_in_the_dpdk_worker_serves_its_tenant() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("memif.sock").display().to_string();
    let svc = Service::start_config(&config_with("inline", &socket, None, "worker"), &[])?;
    blue_with_endpoint(&svc)?;
    discovers_blue(&socket)?;
    io(&socket)?;
    io(&socket)?;
    let names = svc.thread_names()?;
    ensure!(
        !names.iter().any(|n| n.starts_with("storage-endp")),
        "an endpoint thread runs: {names:?}"
    );
    Ok(())
}

/// `mtu` on a DPDK port: the memif driver has no MTU of its own to set,
/// so 9000 stops the start, naming the port and what the driver said;
/// its current 1500 asks for no change and the service runs.
#[test]
fn a_port_mtu_the_driver_cannot_take_stops_the_start_with_the_reason() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("memif.sock").display().to_string();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, config_mtu("mtu", &socket, Some(9000)))?;
    let out = std::process::Command::new("timeout")
        .arg("60")
        .arg(binary("dpu-service")?)
        .args(["--config", &config.display().to_string()])
        .args([
            "--state-dir",
            &dir.path().join("state").display().to_string(),
        ])
        .args([
            "--grpc-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .output()?;
    let err = text(&out);
    ensure!(
        !out.status.success()
            && err.contains("port pf0vf0 (net_memif0)")
            && err.contains("set_mtu failed"),
        "a 9000 MTU on memif: {err}"
    );
    let svc = Service::start_config(&config_mtu("mtu", &socket, Some(1500)), &[])?;
    let ports = svc.dpuctl_ok(&["port", "list"])?;
    ensure!(ports.contains("pf0vf0"), "{ports}");
    Ok(())
}
