//! SPDK's own NVMe/TCP initiator against the daemon and the bare target:
//! `spdk_nvme_identify` reads the controller and namespace, and
//! `spdk_nvme_perf` runs I/O through to the end of its time and detaches
//! (the detach reuses the CIDs of its Asynchronous Event Requests, which
//! once ended the connection and left perf spinning). `spdk_nvme_perf -S
//! ssl` also runs over TLS 1.3 against a listener that requires it.
//!
//! SPDK is `SPDK_DIR` when set, else the tree the shared
//! `tools/spdk/build.sh` builds or has built ([`dpu_e2e::tools::spdk_dir`]);
//! a test fails when neither gives SPDK's initiator. SPDK's tools want hugepages: the tests
//! reserve 1024 of 2 MiB (as root) when fewer are free, and mount
//! hugetlbfs at /dev/hugepages when nothing is mounted there.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use dpu_e2e::net::metric;
use dpu_e2e::{bin_dir, free_port, Service};

const NQN: &str = "nqn.2024-01.io.dpu-service.test:spdk";

/// Makes sure SPDK's tools find hugepages.
fn hugepages() -> Result<()> {
    let free = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if free < 256 {
        let total: u64 = std::fs::read_to_string("/proc/sys/vm/nr_hugepages")?
            .trim()
            .parse()?;
        std::fs::write(
            "/proc/sys/vm/nr_hugepages",
            (total + 512).max(1024).to_string(),
        )
        .context("reserving hugepages for SPDK (run as root)")?;
    }
    let mounted = std::fs::read_to_string("/proc/mounts")?
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("hugetlbfs"));
    if !mounted {
        std::fs::create_dir_all("/dev/hugepages")?;
        let st = Command::new("mount")
            .args(["-t", "hugetlbfs", "nodev", "/dev/hugepages"])
            .status()?;
        if !st.success() {
            bail!("cannot mount hugetlbfs at /dev/hugepages");
        }
    }
    Ok(())
}

/// Runs an SPDK tool with a deadline; its output.
fn run_tool(spdk: &Path, tool: &str, args: &[&str], limit: Duration) -> Result<Output> {
    let lib = [
        spdk.join("build/lib"),
        spdk.join("isa-l/.libs"),
        spdk.join("isa-l-crypto/.libs"),
    ]
    .iter()
    .map(|p| p.display().to_string())
    .collect::<Vec<_>>()
    .join(":");
    let mut child = Command::new(spdk.join("build/bin").join(tool))
        .args(args)
        .env("LD_LIBRARY_PATH", lib)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {tool}"))?;
    let start = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            return Ok(child.wait_with_output()?);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            bail!(
                "{tool} still running after {limit:?} (killed):\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `spdk_nvme_identify` and two `spdk_nvme_perf` runs (QD 1, then QD 32
/// on 4 queues) against a target on `port`.
fn exercise(spdk: &Path, port: u16) -> Result<()> {
    let trid = format!("trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}");
    hugepages()?;
    let out = run_tool(
        spdk,
        "spdk_nvme_identify",
        &["-r", &trid, "-d", "256"],
        Duration::from_secs(60),
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains("Model Number") {
        bail!(
            "spdk_nvme_identify failed ({}):\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for extra in [&["-q", "1"][..], &["-q", "32", "-P", "4"][..]] {
        let mut args = vec!["-r", &trid, "-o", "4096", "-w", "randread", "-t", "2"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-s", "256"]);
        let out = run_tool(spdk, "spdk_nvme_perf", &args, Duration::from_secs(60))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let total = text
            .lines()
            .find(|l| l.trim_start().starts_with("Total"))
            .with_context(|| format!("no Total line:\n{text}"))?;
        let iops: f64 = total
            .split_whitespace()
            .nth(2)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("IOPS in {total:?}"))?;
        if !out.status.success() || iops < 100.0 {
            bail!(
                "spdk_nvme_perf {extra:?}: {} IOPS ({}):\n{text}\n{}",
                iops,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        eprintln!("spdk_nvme_perf {extra:?}: {total}");
    }
    Ok(())
}

/// The daemon's configuration: subsystem NQN with a 64 MiB RAM namespace
/// and a listener on `port`; `hosts` and `listener` are added to the
/// subsystem's and the listener's tables.
fn config(port: u16, hosts: &str, listener: &str) -> String {
    format!(
        r#"
[storage]
ram_limit = "128MiB"
[[storage.subsystems]]
id = "spdk"
nqn = "{NQN}"
{hosts}
[[storage.subsystems.namespaces]]
ram = "64MiB"
[[storage.subsystems.listeners]]
address = "127.0.0.1"
port = {port}
{listener}
"#
    )
}

#[test]
fn spdk_initiator_against_the_daemon() -> Result<()> {
    let spdk = dpu_e2e::tools::spdk_dir()?;
    let port = free_port();
    let svc = Service::start_config(&config(port, "allow_any_host = true", ""), &[])?;
    exercise(&spdk, port).with_context(|| svc.log_text())?;
    // It detached cleanly: no termination request, nothing left open.
    let log = svc.log_text();
    assert!(!log.contains("protocol error"), "{log}");
    Ok(())
}

/// SPDK's initiator over TLS 1.3: `spdk_nvme_perf -S ssl` with the
/// specification's example key, against a daemon whose listener requires
/// TLS. SPDK v23.05 knows version 0 identities only (`NVMe0R01 host sub`)
/// and derives their PSK as the specification says. The same tool without
/// TLS, and with a wrong key, gets no I/O done and is counted.
#[test]
fn spdk_initiator_over_tls_against_the_daemon() -> Result<()> {
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-0000000000b1";
    let spdk = dpu_e2e::tools::spdk_dir()?;
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("host.psk");
    std::fs::write(
        &key,
        "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
    )?;
    let wrong = dir.path().join("wrong.psk");
    std::fs::write(
        &wrong,
        "NVMeTLSkey-1:01:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:",
    )?;
    let port = free_port();
    let hosts = format!(
        "allowed_hosts = [\"{HOST}\"]\nhost_tls = {{ \"{HOST}\" = {{ psk_file = \"{}\" }} }}",
        key.display()
    );
    let svc = Service::start_config(&config(port, &hosts, "secure_channel = \"required\""), &[])?;
    hugepages()?;
    let trid = format!(
        "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN} hostnqn:{HOST}"
    );
    let perf = |tls: &[&str]| -> Result<(bool, f64, String)> {
        let mut args = vec![
            "-r", &trid, "-o", "4096", "-w", "randrw", "-M", "50", "-q", "32", "-P", "2", "-t",
            "2", "-s", "256",
        ];
        args.extend_from_slice(tls);
        let out = run_tool(&spdk, "spdk_nvme_perf", &args, Duration::from_secs(60))?;
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let iops = text
            .lines()
            .find(|l| l.trim_start().starts_with("Total"))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        Ok((out.status.success(), iops, text))
    };
    let key = key.to_str().context("a UTF-8 path")?;
    let (ok, iops, text) = perf(&["-S", "ssl", "--psk-path", key])?;
    ensure!(
        ok && iops > 100.0,
        "spdk_nvme_perf over TLS: {iops} IOPS:\n{text}\n{}",
        svc.log_text()
    );
    eprintln!("spdk_nvme_perf over TLS: {iops:.0} IOPS");
    let m = svc.http_get("/metrics")?.1;
    let handshakes = metric(&m, "dpu_nvmf_tls_handshakes_total");
    // The admin queue and two I/O queues.
    ensure!(handshakes >= 3, "{handshakes} handshakes counted");

    for (what, tls, reason) in [
        ("clear text", &[][..], "clear_text"),
        (
            "a wrong key",
            &[
                "-S",
                "ssl",
                "--psk-path",
                wrong.to_str().context("a UTF-8 path")?,
            ][..],
            "failed",
        ),
    ] {
        let (_, iops, text) = perf(tls)?;
        ensure!(iops == 0.0, "{what}: {iops} IOPS:\n{text}");
        let name = format!("dpu_nvmf_tls_refused_total{{reason=\"{reason}\"}}");
        let refused = metric(&svc.http_get("/metrics")?.1, &name);
        ensure!(refused >= 1, "{what}: {name} is {refused}");
    }
    Ok(())
}

/// Kills the bare target when the test ends.
struct Bare(Child);

impl Drop for Bare {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn spdk_initiator_against_the_bare_target() -> Result<()> {
    let spdk = dpu_e2e::tools::spdk_dir()?;
    let bin = bin_dir().join("examples/nvmf-target");
    if !bin.exists() {
        bail!("{} is not built (cargo test builds it)", bin.display());
    }
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _bare = Bare(
        Command::new(&bin)
            .args(["--listen", &listen, "--ram", "64M", "--nqn", NQN])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let start = Instant::now();
    while std::net::TcpStream::connect(&listen).is_err() {
        if start.elapsed() > Duration::from_secs(10) {
            bail!("the bare target does not listen on {listen}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    exercise(&spdk, port)
}
