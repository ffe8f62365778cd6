//! The outside tools some end-to-end tests need, found or built the same
//! way in every test: the kernel NVMe/TCP initiator's guest harness and
//! SPDK's initiator. A test that needs one fails when it cannot be had; it
//! never skips.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};

use crate::{output_text, repo_root};

/// A tool of the shared tool folder (`tools/<rel>`), beside the
/// repository or at its usual place; `env` overrides it.
fn shared_tool(env: &str, rel: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    [
        repo_root().join("../shared/tools").join(rel),
        PathBuf::from("/work/shared/tools").join(rel),
    ]
    .into_iter()
    .find(|p| p.exists())
    .with_context(|| format!("shared tool tools/{rel} not found: set {env} to it"))
}

/// The kernel-nvme harness (`run.sh`): `$KERNEL_NVME_RUN`, else the shared
/// tools beside the repository.
pub fn kernel_nvme_harness() -> Result<PathBuf> {
    shared_tool("KERNEL_NVME_RUN", "kernel-nvme/run.sh")
}

/// SPDK's tree with its initiator tools (`build/bin/spdk_nvme_perf`,
/// `build/bin/spdk_nvme_identify`), as `tests/spdk.sh` gives it:
/// `$SPDK_DIR` when set, else the tree the shared `tools/spdk/build.sh`
/// builds (once per machine, 4-7 minutes on 2 cores) or has built, under
/// a lock that `tests/run.sh`'s background build holds too. Asked once per
/// test process.
pub fn spdk_dir() -> Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| find_or_build_spdk().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!("SPDK's initiator is not available: {e}"))
}

fn find_or_build_spdk() -> Result<PathBuf> {
    let script = repo_root().join("tests/spdk.sh");
    let out = Command::new(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}):\n{}",
            script.display(),
            out.status,
            output_text(&out)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
    for tool in ["spdk_nvme_perf", "spdk_nvme_identify"] {
        let p = dir.join("build/bin").join(tool);
        if !p.exists() {
            bail!(
                "{} is missing: not an SPDK tree built with its TCP transport",
                p.display()
            );
        }
    }
    Ok(dir)
}
