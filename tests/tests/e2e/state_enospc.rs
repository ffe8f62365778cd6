//! The state store on a full disk, through the real binary: the state
//! directory is a 64 KiB tmpfs; once it is full a change is refused with
//! `UNAVAILABLE`, no temporary file is left behind to keep it full, and
//! a restart finds every acknowledged change. Needs root (mount); without
//! it the test says so and checks nothing (the store's unit tests inject
//! the failure instead).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Result};
use dpu_client::{pb, ClientConfig, DpuClient};
use dpu_e2e::Service;
use tonic::Code;

/// A tmpfs mounted over a directory; unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` over `dir`, keeping what `dir` held.
    fn over(dir: &Path, size: &str) -> Result<Option<Tmpfs>> {
        let keep = tempfile::tempdir()?;
        let cp = |from: &Path, to: &Path| -> Result<()> {
            let st = Command::new("cp")
                .arg("-a")
                .arg(from.join("."))
                .arg(to)
                .status()?;
            if !st.success() {
                bail!("cp -a {} {}", from.display(), to.display());
            }
            Ok(())
        };
        cp(dir, keep.path())?;
        let mounted = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .status()?
            .success();
        if !mounted {
            return Ok(None);
        }
        let t = Tmpfs(dir.to_path_buf());
        cp(keep.path(), dir)?;
        Ok(Some(t))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

async fn tenants(c: &DpuClient) -> Result<Vec<String>> {
    let mut names: Vec<String> = c
        .list_tenants(pb::ListTenantsRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await?
        .tenants
        .into_iter()
        .map(|t| t.name)
        .collect();
    names.sort();
    Ok(names)
}

#[tokio::test]
async fn a_full_disk_refuses_changes_and_leaves_no_temporary_file() -> Result<()> {
    if !is_root() {
        eprintln!("not root: cannot mount a tmpfs; skipped");
        return Ok(());
    }
    let mut svc = Service::start()?;
    svc.signal("TERM")?;
    let Some(_fs) = Tmpfs::over(&svc.state_dir, "64k")? else {
        bail!("mounting a tmpfs over {} failed", svc.state_dir.display());
    };
    svc.start_again()?;
    let connect = |svc: &Service| {
        DpuClient::connect(ClientConfig {
            endpoint: svc.endpoint(),
            ..ClientConfig::default()
        })
    };
    let c = connect(&svc).await?;
    let mut acked = 0;
    let refused = loop {
        if acked == 2000 {
            bail!("2000 tenants fit in 64 KiB");
        }
        let r = c
            .create_tenant(pb::CreateTenantRequest {
                tenant_id: format!("t{acked}"),
                tenant: Some(pb::Tenant {
                    display_name: "x".repeat(256),
                    ..Default::default()
                }),
            })
            .await;
        match r {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(refused.code(), Some(Code::Unavailable), "{refused}");
    assert!(acked > 10, "only {acked} tenants fit");
    let leftovers: Vec<String> = std::fs::read_dir(&svc.state_dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    assert!(
        !leftovers.iter().any(|n| n.ends_with(".tmp")),
        "{leftovers:?}"
    );
    let before = tenants(&c).await?;
    assert_eq!(before.len(), acked);
    svc.restart()?;
    let c = connect(&svc).await?;
    assert_eq!(
        tenants(&c).await?,
        before,
        "every acknowledged change is kept"
    );
    svc.signal("TERM")?;
    Ok(())
}
