//! QoS limits through the real binary: limits declared in the
//! configuration file and changed with `dpuctl` while a host runs I/O
//! (`nvmf-perf` over loopback TCP). A host held to N IOPS measures within
//! 10% of N; a raised limit shows in the host's rate within a second; a
//! namespace's limit holds its hosts together and each gets a share;
//! limits that name nothing or pass the bounds are refused and lose
//! nothing; `/metrics` shows the limits and what they held back.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dpu_e2e::net::metric;
use dpu_e2e::{binary, free_port, nvmf_perf_iops, perf_iops, Service};

const NQN: &str = "nqn.2024-01.io.dpu-service:qos";
/// The host NQN `nvmf-perf` presents unless told another.
const PERF_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000001";
const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000002";

/// Subsystem "qos" allowing both hosts, one RAM namespace limited to
/// `ns_iops`, listening on `port`, with `host_qos` (a TOML inline table,
/// or empty) for its hosts.
fn config(port: u16, ns_iops: u64, host_qos: &str) -> String {
    format!(
        r#"
[storage]
ram_limit = "64MiB"

[[storage.subsystems]]
id = "qos"
nqn = "{NQN}"
allowed_hosts = ["{PERF_HOST}", "{OTHER_HOST}"]
{host_qos}

[[storage.subsystems.namespaces]]
ram = "32MiB"
block_size = 512
qos = {{ iops = {ns_iops} }}

[[storage.subsystems.listeners]]
address = "127.0.0.1"
port = {port}
"#
    )
}

fn read_ops(svc: &Service) -> Result<u64> {
    Ok(metric(
        &svc.http_get("/metrics")?.1,
        "dpu_nvmf_read_ops_total{subsystem=\"qos\"}",
    ))
}

/// The CPU time process `pid` has used, in seconds.
fn cpu_secs(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command's closing parenthesis: utime and stime
    // are the 12th and 13th.
    let rest = stat.rsplit_once(')').context("a stat line")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    Ok(ticks as f64 / 100.0)
}

/// `nvmf-perf` reading at QD `qd` for `secs` as `host`, started now.
fn perf(port: u16, host: &str, qd: u32, secs: u32) -> Result<std::process::Child> {
    Ok(Command::new(binary("nvmf-perf")?)
        .args(["--addr", &format!("127.0.0.1:{port}"), "--nqn", NQN])
        .args(["--hostnqn", host, "--sleep"])
        .args([
            "--job",
            &format!("randread:4k:{qd}"),
            "--time",
            &secs.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?)
}

/// The IOPS a finished `nvmf-perf` reported.
fn iops_of(child: std::process::Child) -> Result<f64> {
    perf_iops(&child.wait_with_output()?)
}

#[test]
fn a_hosts_limit_holds_and_a_raised_one_is_felt_within_a_second() -> Result<()> {
    let port = free_port();
    let host_qos = format!("host_qos = {{ \"{PERF_HOST}\" = {{ iops = 1500 }} }}");
    let svc = Service::start_config(&config(port, 3000, &host_qos), &[])?;

    // The host's 1,500 is the tighter of its two limits. Its commands
    // wait without the service polling for them: a poll group that spun
    // would take a whole core for the three seconds.
    let pid = svc.pid().context("the service runs")?;
    let cpu0 = cpu_secs(pid)?;
    let iops = nvmf_perf_iops(
        port,
        NQN,
        &["--job", "randread:4k:32", "--time", "3", "--sleep"],
    )?;
    let cpu = cpu_secs(pid)? - cpu0;
    ensure!(
        (1350.0..=1650.0).contains(&iops),
        "{iops:.0} IOPS under a limit of 1500"
    );
    println!("limited to 1500: {iops:.0} IOPS, {cpu:.2} s of the service's CPU in 3 s");
    ensure!(cpu < 1.5, "the service took {cpu:.2} s of CPU in 3 s");
    let shown = svc.dpuctl_ok(&["subsystem", "get", "qos"])?;
    ensure!(shown.contains("iops=1500"), "{shown}");

    // Raised to 2,500 while the host reads: its rate follows within a
    // second of dpuctl's answer.
    let child = perf(port, PERF_HOST, 32, 5)?;
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut changed = None;
    while start.elapsed() < Duration::from_millis(4500) {
        samples.push((Instant::now(), read_ops(&svc)?));
        if changed.is_none() && start.elapsed() >= Duration::from_millis(2000) {
            svc.dpuctl_ok(&[
                "subsystem",
                "set-host-qos",
                "qos",
                PERF_HOST,
                "--iops",
                "2500",
            ])?;
            changed = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let total = iops_of(child)?;
    let changed = changed.context("the limit was changed")?;
    // The rate over each quarter second from a sample on.
    let rate_from = |i: usize| -> Option<(Instant, f64)> {
        let (t0, n0) = samples[i];
        let (t1, n1) = samples[i..]
            .iter()
            .find(|(t, _)| t.duration_since(t0) >= Duration::from_millis(250))?;
        Some((t0, (n1 - n0) as f64 / t1.duration_since(t0).as_secs_f64()))
    };
    let rates: Vec<(Instant, f64)> = (0..samples.len()).filter_map(rate_from).collect();
    let before: Vec<f64> = rates
        .iter()
        .filter(|(t, _)| {
            *t > start + Duration::from_millis(500) && *t + Duration::from_millis(300) < changed
        })
        .map(|r| r.1)
        .collect();
    ensure!(
        before.iter().all(|r| *r < 1500.0 * 1.25),
        "over the old limit before the change: {before:?}"
    );
    let felt = rates
        .iter()
        .find(|(t, r)| *t >= changed && *r > 2000.0)
        .map(|(t, _)| t.duration_since(changed))
        .with_context(|| format!("the new limit never showed: {rates:?}"))?;
    println!("raised to 2500: felt after {felt:?}; {total:.0} IOPS over the run");
    ensure!(felt < Duration::from_secs(1), "felt after {felt:?}");
    ensure!(total > 1500.0, "{total:.0} IOPS over the run");

    let m = svc.http_get("/metrics")?.1;
    let host = format!("subsystem=\"qos\",host=\"{PERF_HOST}\"");
    ensure!(
        metric(&m, &format!("dpu_nvmf_qos_limit{{{host},limit=\"iops\"}}")) == 2500,
        "{m}"
    );
    ensure!(
        metric(
            &m,
            &format!("dpu_nvmf_qos_throttled_commands_total{{{host}}}")
        ) > 1000,
        "{m}"
    );
    ensure!(
        metric(
            &m,
            "dpu_nvmf_qos_limit{subsystem=\"qos\",nsid=\"1\",limit=\"iops\"}"
        ) == 3000,
        "{m}"
    );
    Ok(())
}

#[test]
fn a_namespace_limit_is_shared_and_bad_limits_lose_nothing() -> Result<()> {
    let port = free_port();
    let svc = Service::start_config(&config(port, 2000, ""), &[])?;

    // Two hosts at once, one deep and one shallow: 2,000 IOPS between
    // them, and neither starved.
    let deep = perf(port, PERF_HOST, 32, 3)?;
    let shallow = perf(port, OTHER_HOST, 4, 3)?;
    let (deep, shallow) = (iops_of(deep)?, iops_of(shallow)?);
    let sum = deep + shallow;
    ensure!(
        (1800.0..=2200.0).contains(&sum),
        "{deep:.0} + {shallow:.0} IOPS under a limit of 2000"
    );
    println!("namespace limited to 2000: QD 32 host {deep:.0}, QD 4 host {shallow:.0} IOPS");
    ensure!(
        shallow > sum / 8.0,
        "the shallow host got {shallow:.0} of {sum:.0}"
    );

    // Refused, each with its reason, and the limits stay as they were.
    for (args, why) in [
        (
            &["namespace", "set-qos", "qos", "9", "--iops", "5"][..],
            "no namespace 9",
        ),
        (
            &["namespace", "set-qos", "qos", "1", "--iops", "2000000000"][..],
            "over the bound",
        ),
        (
            &[
                "subsystem",
                "set-host-qos",
                "qos",
                "nqn.2014-08.org.nvmexpress:uuid:not-allowed",
                "--iops",
                "5",
            ][..],
            "a host the subsystem does not allow",
        ),
        (
            &["namespace", "set-qos", "qos", "1", "--bandwidth", "lots"][..],
            "not a size",
        ),
    ] {
        let out = svc.dpuctl(args)?;
        ensure!(!out.status.success(), "{why}: accepted");
        ensure!(!out.stderr.is_empty(), "{why}: refused without a word");
    }
    let shown = svc.dpuctl_ok(&["namespace", "get", "qos", "1"])?;
    ensure!(shown.contains("iops=2000"), "{shown}");

    // Cleared: the host runs free.
    svc.dpuctl_ok(&["namespace", "set-qos", "qos", "1"])?;
    let iops = nvmf_perf_iops(
        port,
        NQN,
        &["--job", "randread:4k:8", "--time", "1", "--sleep"],
    )?;
    ensure!(iops > 3000.0, "{iops:.0} IOPS with no limit");
    Ok(())
}
