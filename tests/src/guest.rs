//! A Linux guest whose kernel NVMe/TCP initiator, nvme-cli and fio reach
//! the service on this host's loopback (`shared/tools/kernel-nvme`), run
//! in the background with its console going to a file.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::Service;

/// A guest run in the background, its console going to a file.
pub struct Guest {
    child: Child,
    log: PathBuf,
}

impl Guest {
    /// Boots a guest that runs `script` (saved as `dir/name.sh`) with the
    /// service reachable on each of `targets` (loopback ports).
    pub fn start(
        dir: &std::path::Path,
        name: &str,
        targets: &[u16],
        script: &str,
    ) -> Result<Guest> {
        Self::start_with(dir, name, targets, script, &[])
    }

    /// As [`Guest::start`], with more of the harness's options (such as
    /// `--kernel-target PORT`).
    pub fn start_with(
        dir: &std::path::Path,
        name: &str,
        targets: &[u16],
        script: &str,
        options: &[&str],
    ) -> Result<Guest> {
        let script_path = dir.join(format!("{name}.sh"));
        std::fs::write(&script_path, script)?;
        let log = dir.join(format!("{name}.log"));
        let mut cmd = Command::new(crate::tools::kernel_nvme_harness()?);
        for p in targets {
            cmd.arg("--target").arg(format!("127.0.0.1:{p}"));
        }
        cmd.args(options)
            .arg("--timeout")
            .arg("900")
            .arg("--script")
            .arg(&script_path)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(Stdio::from(
                std::fs::File::options().append(true).open(&log)?,
            ));
        let child = cmd.spawn().context("starting kernel-nvme")?;
        Ok(Guest { child, log })
    }

    /// What the guest printed so far.
    pub fn console(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Waits until the console shows `marker`, or the guest ends.
    pub fn wait_for(&mut self, marker: &str, limit: Duration) -> Result<()> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if self.console().lines().any(|l| l.trim() == marker) {
                return Ok(());
            }
            if let Some(st) = self.child.try_wait()? {
                bail!("guest ended ({st}) before {marker}:\n{}", self.console());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("no {marker} within {limit:?}:\n{}", self.console())
    }

    /// Waits for the guest and fails unless its commands all succeeded.
    pub fn finish(mut self, svc: &Service) -> Result<String> {
        let st = self.child.wait()?;
        let console = self.console();
        if !st.success() {
            bail!(
                "guest failed ({st}):\n{console}\n--- service log ---\n{}",
                svc.log_text()
            );
        }
        // Shown with --nocapture (and by cargo when a later step fails).
        println!("{console}");
        Ok(console)
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
