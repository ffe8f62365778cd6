//! A flood of DH-HMAC-CHAP attempts through the real binary: a peer that
//! knows an allowed host NQN but not its secret (`nvmf-perf
//! --auth-flood`) authenticates with ffdhe8192 over and over, from six
//! connections at a time, while a legitimate host of another subsystem
//! connects and does I/O again and again from another host NQN. The
//! Diffie-Hellman work runs on the DH thread, not on the poll groups, so
//! the legitimate host's connections (set up on the admin group, the one
//! the flood's queues live on) and its I/O keep completing in bounded
//! time; attempts beyond the per-address rate are refused before any DH
//! work and counted as `rate_limited` on `/metrics`, the refusals are
//! logged a bounded number of times, and afterwards the host with the
//! right secret authenticates. A second flood, with no rate to speak of
//! and room for one waiting DH job, is refused at once as `busy`; a third
//! closes each connection right after asking for the Challenge, so DH
//! jobs finish for connections already gone.
//!
//! In a debug build one ffdhe8192 authentication costs the target about
//! a second of CPU (two exponentiations), so if the DH work ran on the
//! poll group each admitted attempt would stall that group for about a
//! second, and six at a time for six.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dpu_e2e::{binary, free_port, Service, TEST_CONFIG};

const NQN: &str = "nqn.2024-01.io.dpu-service.test:flood";
const PLAIN_NQN: &str = "nqn.2024-01.io.dpu-service.test:plain";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:e2e-flood-host";
const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:e2e-flood-other";
const SECRET: &str = "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:";
const WRONG_SECRET: &str =
    "DHHC-1:00:BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUF5lUjlA==:";

/// Attempts one address regains a second, and may make at once.
const PER_SEC: f64 = 0.5;
const BURST: u64 = 3;
/// How long the flood runs, and from how many connections at a time.
const FLOOD_SECS: u64 = 8;
const FLOOD_CONNS: u64 = 6;
/// Longest a legitimate `nvmf-perf` run (connection setup, 0.5 s of I/O,
/// teardown) may take during the flood, and longest any one of its I/Os.
/// A run takes about 0.55 s on a quiet target; were the DH work done on
/// the admin group, the flood's first admitted attempts alone (the burst
/// of 3, then one every 2 s, each about 1.1 s of DH in a debug build)
/// would hold each of the run's setup commands for up to seconds.
const RUN_BOUND: Duration = Duration::from_millis(2500);
const IO_BOUND_US: f64 = 500_000.0;

/// `dpu_nvmf_auth_total` of subsystem `id` for `result`.
fn auth_total(svc: &Service, id: &str, result: &str) -> Result<u64> {
    let (_, body) = svc.http_get("/metrics")?;
    let series = format!("dpu_nvmf_auth_total{{subsystem=\"{id}\",result=\"{result}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no {series} in /metrics"))
}

/// The `max us` column of a job line of `nvmf-perf`, after checking the
/// job did I/O.
fn max_latency_us(what: &str, out: &Output) -> Result<f64> {
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{what}: nvmf-perf failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("randread"))
        .with_context(|| format!("{what}: no job line in {text}"))?;
    let cols: Vec<f64> = line
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    // randread 4k QD1: IOPS, MB/s, p50, p99, p99.9, max.
    ensure!(cols.len() >= 6 && cols[0] > 0.0, "{what}: no I/O in {line}");
    Ok(cols[cols.len() - 1])
}

/// One field `name N` of the flood's summary line.
fn field(line: &str, name: &str) -> Result<u64> {
    let mut it = line.split_whitespace();
    while let Some(t) = it.next() {
        if t == name {
            return Ok(it.next().context("value")?.parse()?);
        }
    }
    anyhow::bail!("no {name} in {line}")
}

/// Gives `HOST` of subsystem `flood` its secret (from a file, as an
/// operator would) and allows it ffdhe8192 alone.
fn ffdhe8192_only(svc: &Service) -> Result<()> {
    let secret_file = tempfile::NamedTempFile::new()?;
    std::fs::write(secret_file.path(), format!("{SECRET}\n"))?;
    let secret_path = secret_file.path().display().to_string();
    svc.dpuctl_ok(&[
        "subsystem",
        "set-auth",
        "flood",
        HOST,
        "--dhchap-secret-file",
        &secret_path,
        "--dh-group",
        "ffdhe8192",
    ])?;
    Ok(())
}

#[test]
fn an_authentication_flood_stalls_no_one_and_is_held_to_its_rate() -> Result<()> {
    let config = TEST_CONFIG.replace(
        "ram_limit = \"256MiB\"",
        &format!(
            "ram_limit = \"256MiB\"\npoll_groups = 1\nauth_threads = 1\nauth_queue = 8\n\
             auth_attempts_per_sec = {PER_SEC}\nauth_attempts_burst = {BURST}\n"
        ),
    );
    let svc = Service::start_config(&config, &[])?;
    let (port, plain_port) = (free_port(), free_port());
    svc.local_subsystem("flood", NQN, &[HOST], "16M", port)?;
    svc.local_subsystem("plain", PLAIN_NQN, &[OTHER], "16M", plain_port)?;
    ffdhe8192_only(&svc)?;
    let perf = binary("nvmf-perf")?;
    let legit = || -> Result<(Duration, f64)> {
        let t = Instant::now();
        let out = Command::new(&perf)
            .args(["--addr", &format!("127.0.0.1:{plain_port}")])
            .args(["--nqn", PLAIN_NQN, "--hostnqn", OTHER])
            .args(["--job", "randread:4k:1", "--time", "0.5"])
            .output()?;
        Ok((t.elapsed(), max_latency_us("legitimate host", &out)?))
    };
    let (quiet, quiet_max) = legit()?;
    eprintln!("before the flood: run {quiet:?}, max I/O latency {quiet_max} us");

    let flood = Command::new(&perf)
        .args(["--addr", &format!("127.0.0.1:{port}"), "--nqn", NQN])
        .args(["--hostnqn", HOST, "--dhchap-secret", WRONG_SECRET])
        .args(["--dh-group", "ffdhe8192"])
        .args(["--auth-flood", &FLOOD_SECS.to_string()])
        .args(["--conns", &FLOOD_CONNS.to_string()])
        .args(["--flood-attempts", "3000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut flood = Guard(Some(flood));
    let started = Instant::now();
    let mut runs = Vec::new();
    while flood.running()? {
        ensure!(
            started.elapsed() < Duration::from_secs(FLOOD_SECS + 60),
            "the flood did not stop by itself"
        );
        let (took, max_us) = legit()?;
        runs.push((took, max_us));
    }
    let out = flood.take()?.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "flood: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("auth-flood"))
        .context("no summary")?;
    eprintln!("{line}");
    eprintln!(
        "legitimate runs during the flood (wall time, max I/O latency us): {:?}",
        runs.iter()
            .map(|(d, m)| (d.as_millis(), *m))
            .collect::<Vec<_>>()
    );
    let attempts = field(line, "attempts")?;
    let at_challenge = field(line, "refused_at_challenge")?;
    let at_success1 = field(line, "refused_at_success1")?;
    let secs: f64 = line
        .rsplit(' ')
        .next()
        .context("secs")?
        .parse()
        .context("secs")?;

    // The legitimate host: connected and did I/O all along, in bounded
    // time.
    ensure!(runs.len() >= 3, "too few legitimate runs: {runs:?}");
    for (took, max_us) in &runs {
        ensure!(
            *took < RUN_BOUND,
            "a legitimate run took {took:?} during the flood: {runs:?}"
        );
        ensure!(
            *max_us < IO_BOUND_US,
            "a legitimate I/O took {max_us} us during the flood: {runs:?}"
        );
    }

    // The flood: every attempt refused, most before any DH work; those
    // that got DH work stay within the burst and the rate.
    ensure!(field(line, "authenticated")? == 0, "{line}");
    ensure!(field(line, "errors")? == 0, "{line}");
    ensure!(attempts == at_challenge + at_success1, "{line}");
    let allowed = BURST as f64 + PER_SEC * secs + 1.0;
    ensure!(
        (at_success1 as f64) <= allowed,
        "{at_success1} attempts got DH work, at most {allowed} allowed: {line}"
    );
    ensure!(at_success1 >= BURST, "the burst was admitted: {line}");
    ensure!(
        at_challenge > 10 * at_success1,
        "a flood, mostly refused: {line}"
    );
    // Counted as the host saw them.
    assert_eq!(auth_total(&svc, "flood", "rate_limited")?, at_challenge);
    assert_eq!(auth_total(&svc, "flood", "failed")?, at_success1);
    assert_eq!(auth_total(&svc, "flood", "busy")?, 0);
    assert_eq!(auth_total(&svc, "flood", "succeeded")?, 0);
    assert_eq!(auth_total(&svc, "plain", "rate_limited")?, 0);
    // Logged, not flooded: one line per 10 s at most.
    let log = svc.log_text();
    let logged = log
        .matches("authentication attempts over the per-address rate refused")
        .count();
    let most = (secs / 10.0).ceil() as usize + 1;
    ensure!(
        (1..=most).contains(&logged),
        "{logged} rate-limit log lines, at most {most}"
    );
    assert!(!log.contains(&SECRET[10..SECRET.len() - 1]));

    // The service is up, and the host with the right secret, once its
    // address has regained a token, authenticates and does I/O.
    std::thread::sleep(Duration::from_secs_f64(1.5 / PER_SEC));
    let out = Command::new(&perf)
        .args(["--addr", &format!("127.0.0.1:{port}"), "--nqn", NQN])
        .args(["--hostnqn", HOST, "--dhchap-secret", SECRET])
        .args(["--dh-group", "ffdhe8192"])
        .args(["--job", "randread:4k:1", "--time", "0.3"])
        .output()?;
    max_latency_us("the right secret after the flood", &out)?;
    // nvmf-perf's setup controller, then the job's admin and I/O queues.
    assert_eq!(auth_total(&svc, "flood", "succeeded")?, 3);
    assert_eq!(auth_total(&svc, "flood", "failed")?, at_success1);
    assert_eq!(auth_total(&svc, "flood", "rate_limited")?, at_challenge);
    Ok(())
}

#[test]
fn a_full_dh_queue_refuses_attempts_at_once_and_counts_them() -> Result<()> {
    // No rate to speak of: only the DH queue (one job waiting) bounds the
    // work.
    let config = TEST_CONFIG.replace(
        "ram_limit = \"256MiB\"",
        "ram_limit = \"256MiB\"\nauth_threads = 1\nauth_queue = 1\n\
         auth_attempts_per_sec = 1000\nauth_attempts_burst = 65536\n",
    );
    let svc = Service::start_config(&config, &[])?;
    let port = free_port();
    svc.local_subsystem("flood", NQN, &[HOST], "16M", port)?;
    ffdhe8192_only(&svc)?;
    let out = Command::new(binary("nvmf-perf")?)
        .args(["--addr", &format!("127.0.0.1:{port}"), "--nqn", NQN])
        .args(["--hostnqn", HOST, "--dhchap-secret", WRONG_SECRET])
        .args(["--dh-group", "ffdhe8192", "--auth-flood", "4"])
        .args(["--conns", &FLOOD_CONNS.to_string()])
        .args(["--flood-attempts", "3000"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "flood: {text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("auth-flood"))
        .context("no summary")?;
    eprintln!("{line}");
    let at_challenge = field(line, "refused_at_challenge")?;
    let at_success1 = field(line, "refused_at_success1")?;
    ensure!(field(line, "errors")? == 0, "{line}");
    ensure!(field(line, "authenticated")? == 0, "{line}");
    ensure!(
        field(line, "attempts")? == at_challenge + at_success1,
        "{line}"
    );
    // Six at a time against one thread and one place in the queue: some
    // are refused at once, as busy, and counted so (most at the Challenge;
    // one whose Reply's job finds the queue full, at Success1).
    let busy = auth_total(&svc, "flood", "busy")?;
    let failed = auth_total(&svc, "flood", "failed")?;
    let limited = auth_total(&svc, "flood", "rate_limited")?;
    ensure!(busy > 0, "no attempt found the queue full: {line}");
    ensure!(busy >= at_challenge - limited, "{busy} busy: {line}");
    assert_eq!(busy + limited + failed, at_challenge + at_success1);
    ensure!(failed <= at_success1, "{failed} failed: {line}");
    let logged = svc
        .log_text()
        .matches("authentication refused: the DH pool's queue is full")
        .count();
    ensure!(
        (1..=2).contains(&logged),
        "{logged} busy log lines in a 4 s flood"
    );
    // Peers that close right after asking for the Challenge: their DH
    // jobs (those the queue took) finish for connections already gone.
    // Each attempt is counted once, as busy or (abandoned) failed.
    let out = Command::new(binary("nvmf-perf")?)
        .args(["--addr", &format!("127.0.0.1:{port}"), "--nqn", NQN])
        .args(["--hostnqn", HOST, "--dhchap-secret", WRONG_SECRET])
        .args(["--dh-group", "ffdhe8192", "--auth-flood", "2"])
        .args(["--conns", "4", "--flood-attempts", "400", "--flood-abandon"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "abandoning flood: {text}");
    let line2 = text
        .lines()
        .find(|l| l.starts_with("auth-flood"))
        .context("no summary")?;
    eprintln!("{line2}");
    let abandoned = field(line2, "abandoned")?;
    ensure!(field(line2, "errors")? == 0, "{line2}");
    ensure!(abandoned == field(line2, "attempts")?, "{line2}");
    let want = at_challenge + at_success1 + abandoned;
    let deadline = Instant::now() + Duration::from_secs(20);
    let counted = loop {
        let n = auth_total(&svc, "flood", "busy")?
            + auth_total(&svc, "flood", "failed")?
            + auth_total(&svc, "flood", "rate_limited")?;
        if n >= want || Instant::now() > deadline {
            break n;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(counted, want, "every attempt counted once");
    ensure!(
        auth_total(&svc, "flood", "failed")? > failed,
        "an abandoned attempt whose job ran is counted as failed"
    );
    // Still serving: once the job that was running when its connection
    // went has finished (the ones still waiting are dropped unrun), the
    // right secret authenticates.
    std::thread::sleep(Duration::from_secs(3));
    let out = Command::new(binary("nvmf-perf")?)
        .args(["--addr", &format!("127.0.0.1:{port}"), "--nqn", NQN])
        .args(["--hostnqn", HOST, "--dhchap-secret", SECRET])
        .args(["--dh-group", "ffdhe8192"])
        .args(["--job", "randread:4k:1", "--time", "0.3"])
        .output()?;
    max_latency_us("the right secret after the flood", &out)?;
    Ok(())
}

/// Kills the flood if the test fails before it ends.
struct Guard(Option<std::process::Child>);

impl Guard {
    fn running(&mut self) -> Result<bool> {
        match self.0.as_mut() {
            Some(c) => Ok(c.try_wait()?.is_none()),
            None => Ok(false),
        }
    }

    fn take(&mut self) -> Result<std::process::Child> {
        self.0.take().context("the flood was taken already")
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
