//! End-to-end test harness: starts the real `dpu-service` binary and drives
//! it the way users do, through `dpuctl`, the client library, HTTP and
//! foreign gRPC clients.
//!
//! The binaries must be built before the tests run (`cargo build --bins`;
//! the README's test command does it). Each [`Service`] gets its own state
//! directory and free loopback ports, so tests run in parallel.

#![forbid(unsafe_code)]

pub mod guest;
pub mod net;
pub mod pki;
pub mod tools;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

/// Directory holding the workspace's built binaries (`target/debug`).
pub fn bin_dir() -> PathBuf {
    // Test executables live in target/<profile>/deps/, the soak driver
    // beside the binaries it runs.
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().unwrap_or(Path::new(""));
    match dir.file_name() {
        Some(d) if d == "deps" => dir.parent().unwrap_or(dir).to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

/// Path of a workspace binary; fails with a hint if it was not built.
pub fn binary(name: &str) -> Result<PathBuf> {
    let p = bin_dir().join(name);
    if !p.exists() {
        bail!(
            "{} does not exist: run `cargo build --bins` before the end-to-end tests",
            p.display()
        );
    }
    Ok(p)
}

/// A process's stdout then stderr, as text: what a failed check shows.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Peak and current resident memory of process `pid`, KiB.
pub fn rss_kib(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("{name} in /proc/{pid}/status"))
    };
    Ok((field("VmHWM:")?, field("VmRSS:")?))
}

/// Runs `fut` to its end on a runtime of its own, for a test that calls
/// the service with async gRPC clients from synchronous code.
///
/// # Errors
/// If the runtime cannot be made, or as `fut`.
pub fn block_on<T>(fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(fut)
}

/// Checks that a call failed with `code` and a message containing
/// `text`.
///
/// # Errors
/// Saying what was wanted and what came, if it did not.
pub fn refused<T: std::fmt::Debug>(
    r: std::result::Result<T, tonic::Status>,
    code: tonic::Code,
    text: &str,
) -> Result<()> {
    match r {
        Err(e) if e.code() == code && e.message().contains(text) => Ok(()),
        other => bail!("wanted {code:?} naming {text:?}, got {other:?}"),
    }
}

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// A running `dpu-service` process.
pub struct Service {
    child: Option<Child>,
    /// gRPC address.
    pub grpc: SocketAddr,
    /// Metrics address.
    pub metrics: SocketAddr,
    /// State directory (kept across restarts of the same `Service`).
    pub state_dir: PathBuf,
    /// Extra command-line arguments, reused on restart.
    pub args: Vec<String>,
    log: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

/// What the service logs once both listeners are bound.
const READY_LINE: &str = "gRPC listening";

/// The ports a test service uses, as `dpu-service` config.
pub const TEST_CONFIG: &str = r#"
[log]
level = "info,dpu_control=debug"

[storage]
ram_limit = "256MiB"

[[ports]]
id = "p0"
role = "uplink"

[[ports]]
id = "pf0vf0"
role = "vf"

[[ports]]
id = "pf0vf1"
role = "vf"
"#;

impl Service {
    /// Starts a service with a fresh state directory and [`TEST_CONFIG`].
    pub fn start() -> Result<Self> {
        Self::start_with(&[])
    }

    /// Starts a service with extra arguments.
    pub fn start_with(args: &[&str]) -> Result<Self> {
        Self::start_config(TEST_CONFIG, args)
    }

    /// Starts a service with the configuration `config` (TOML text) and
    /// extra arguments.
    pub fn start_config(config_text: &str, args: &[&str]) -> Result<Self> {
        let tmp = tempfile::tempdir()?;
        let config = tmp.path().join("config.toml");
        std::fs::write(&config, config_text)?;
        let mut all = vec!["--config".to_string(), config.display().to_string()];
        all.extend(args.iter().map(|s| s.to_string()));
        let mut s = Self {
            child: None,
            grpc: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics: SocketAddr::from(([127, 0, 0, 1], 0)),
            state_dir: tmp.path().join("state"),
            args: all,
            log: tmp.path().join("service.log"),
            _tmp: Some(tmp),
        };
        s.spawn()?;
        Ok(s)
    }

    /// Endpoint URL for clients.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    fn spawn(&mut self) -> Result<()> {
        // Fresh ports on every start: a just-killed process may still hold the old ones.
        for _attempt in 0..5 {
            self.grpc.set_port(free_port());
            self.metrics.set_port(free_port());
            let log_start = self.log_text().len();
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)?;
            let child = Command::new(binary("dpu-service")?)
                .args(&self.args)
                .arg("--grpc-listen")
                .arg(self.grpc.to_string())
                .arg("--metrics-listen")
                .arg(self.metrics.to_string())
                .arg("--state-dir")
                .arg(&self.state_dir)
                .env("NO_COLOR", "1")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("spawning dpu-service")?;
            self.child = Some(child);
            match self.wait_ready(log_start, Duration::from_secs(20)) {
                Ok(()) => return Ok(()),
                // Another process took one of the ports between free_port() and bind.
                Err(_) if self.log_since(log_start).contains("Address already in use") => continue,
                Err(e) => return Err(e.context(format!("service log:\n{}", self.log_text()))),
            }
        }
        bail!("could not find free ports; log:\n{}", self.log_text())
    }

    /// Waits for this run's "gRPC listening" line: the service logs it only
    /// after both listeners are bound, so a port held by another process
    /// cannot pass for ours.
    fn wait_ready(&mut self, log_start: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("dpu-service exited during start: {status}");
            }
            if self.log_since(log_start).contains(READY_LINE) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("dpu-service did not listen within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_since(&self, start: usize) -> String {
        self.log_text().get(start..).unwrap_or_default().to_string()
    }

    /// Everything the service logged so far (all runs).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// PID of the running process.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The names of the service's threads (`/proc/PID/task/*/comm`, at
    /// most 15 bytes each).
    ///
    /// # Errors
    /// If the service has exited or `/proc` cannot be read.
    pub fn thread_names(&self) -> Result<Vec<String>> {
        let pid = self.pid().context("the service has exited")?;
        Ok(std::fs::read_dir(format!("/proc/{pid}/task"))?
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|n| n.trim().to_string())
            .collect())
    }

    /// Sends `signal` (e.g. "TERM", "KILL") and waits for the exit.
    pub fn signal(&mut self, signal: &str) -> Result<ExitStatus> {
        let mut child = self.child.take().context("service not running")?;
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()?
            .success();
        if !ok {
            bail!("kill -{signal} {} failed", child.id());
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(st) = child.try_wait()? {
                return Ok(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("dpu-service did not exit within 15 s of SIG{signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the service with SIGTERM and starts it again on the same state.
    pub fn restart(&mut self) -> Result<ExitStatus> {
        let st = self.signal("TERM")?;
        self.spawn()?;
        Ok(st)
    }

    /// Starts the service again after it was stopped with [`Service::signal`].
    pub fn start_again(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("service is still running");
        }
        self.spawn()
    }

    /// Kills the service with SIGKILL and starts it again on the same state.
    pub fn crash_and_restart(&mut self) -> Result<()> {
        self.signal("KILL")?;
        self.spawn()
    }

    /// Runs `dpuctl` against this service.
    pub fn dpuctl(&self, args: &[&str]) -> Result<Output> {
        Command::new(binary("dpuctl")?)
            .arg("--endpoint")
            .arg(self.endpoint())
            .args(args)
            .output()
            .context("running dpuctl")
    }

    /// Runs `dpuctl`, requires success and answers its standard output.
    pub fn dpuctl_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.dpuctl(args)?;
        if !out.status.success() {
            bail!(
                "dpuctl {args:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Creates subsystem `id` (`nqn`) allowing `hosts` (any host when
    /// none is named), with a RAM namespace of `ram` (a `dpuctl` size such
    /// as `16M`), listening on the kernel's 127.0.0.1:`port`.
    pub fn local_subsystem(
        &self,
        id: &str,
        nqn: &str,
        hosts: &[&str],
        ram: &str,
        port: u16,
    ) -> Result<()> {
        if hosts.is_empty() {
            self.dpuctl_ok(&["subsystem", "create", id, "--nqn", nqn, "--allow-any-host"])?;
        } else {
            self.dpuctl_ok(&["subsystem", "create", id, "--nqn", nqn])?;
        }
        for h in hosts {
            self.dpuctl_ok(&["subsystem", "add-host", id, h])?;
        }
        self.dpuctl_ok(&["namespace", "create", id, "--ram", ram])?;
        let p = port.to_string();
        self.dpuctl_ok(&[
            "listener",
            "create",
            id,
            "--address",
            "127.0.0.1",
            "--port",
            &p,
        ])?;
        Ok(())
    }

    /// Tenant `tenant` on port `port`, denying by default but for
    /// stateful TCP to its storage endpoint `endpoint` (IPv4) port 4420,
    /// and subsystem `id` (`nqn`, any host, a RAM namespace of `ram`)
    /// listening there: where the storage-endpoint tests start.
    pub fn endpoint_behind_rules(
        &self,
        tenant: &str,
        port: &str,
        endpoint: &str,
        id: &str,
        nqn: &str,
        ram: &str,
    ) -> Result<()> {
        self.dpuctl_json(&[
            "tenant",
            "create",
            tenant,
            "--default-policy",
            "deny",
            "--port",
            port,
        ])?;
        let dst = format!("{endpoint}/32");
        self.dpuctl_json(&[
            "rule",
            "add",
            tenant,
            "--id",
            "storage",
            "--priority",
            "10",
            "--action",
            "allow",
            "--proto",
            "tcp",
            "--dst",
            &dst,
            "--dport",
            "4420",
            "--stateful",
        ])?;
        self.dpuctl_json(&["subsystem", "create", id, "--nqn", nqn, "--allow-any-host"])?;
        self.dpuctl_json(&["namespace", "create", id, "--ram", ram])?;
        self.dpuctl_json(&[
            "listener",
            "create",
            id,
            "--id",
            "ep",
            "--tenant",
            tenant,
            "--address",
            endpoint,
            "--port",
            "4420",
        ])?;
        Ok(())
    }

    /// Creates tenant `tenant` (default deny) attached to `ports`, whose
    /// only rule, `web`, is a stateful allow of TCP from `src` (a prefix)
    /// to port 8080: without a tracked connection, neither side's next
    /// segment passes.
    pub fn stateful_web_tenant(&self, tenant: &str, ports: &[&str], src: &str) -> Result<()> {
        let mut args = vec!["tenant", "create", tenant];
        for p in ports {
            args.extend(["--port", p]);
        }
        self.dpuctl_json(&args)?;
        self.dpuctl_json(&[
            "rule",
            "add",
            tenant,
            "--id",
            "web",
            "--priority",
            "10",
            "--action",
            "allow",
            "--src",
            src,
            "--proto",
            "tcp",
            "--dport",
            "8080",
            "--stateful",
        ])?;
        Ok(())
    }

    /// Runs `dpuctl --output json`, requires success and parses the output.
    pub fn dpuctl_json(&self, args: &[&str]) -> Result<serde_json::Value> {
        let mut all = vec!["--output", "json"];
        all.extend_from_slice(args);
        let out = self.dpuctl(&all)?;
        if !out.status.success() {
            bail!(
                "dpuctl {args:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "dpuctl {args:?} printed no JSON: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Fetches a path from the metrics endpoint; returns (status line, body).
    pub fn http_get(&self, path: &str) -> Result<(String, String)> {
        let mut s = TcpStream::connect(self.metrics)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n")?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)?;
        let (head, body) = resp.split_once("\r\n\r\n").context("no HTTP header end")?;
        Ok((
            head.lines().next().unwrap_or("").to_string(),
            body.to_string(),
        ))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The IOPS of an `nvmf-perf` run against subsystem `nqn` on
/// 127.0.0.1:`port` with the further arguments `args` (job, time,
/// connections), failing with its output if it failed.
pub fn nvmf_perf_iops(port: u16, nqn: &str, args: &[&str]) -> Result<f64> {
    let out = Command::new(binary("nvmf-perf")?)
        .args(["--addr", &format!("127.0.0.1:{port}"), "--nqn", nqn])
        .args(args)
        .output()?;
    perf_iops(&out)
}

/// The IOPS of the first job a finished `nvmf-perf` reported, failing
/// with its output if it failed or reported none.
pub fn perf_iops(out: &Output) -> Result<f64> {
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "nvmf-perf: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find(|l| !l.starts_with('#') && !l.starts_with("job"))
        .and_then(|l| l.split_whitespace().find_map(|t| t.parse().ok()))
        .with_context(|| format!("no IOPS in {text} {}", String::from_utf8_lossy(&out.stderr)))
}
