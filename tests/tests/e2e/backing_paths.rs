//! Where namespaces' files and block devices may live: beneath
//! `storage.file_dirs` (by default `<state.dir>/volumes`), reached without
//! symbolic links, never the state directory; devices only as
//! `storage.block_devices` allows. A refused path is answered with the
//! field and the rule, and nothing is created or stored.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use anyhow::Result;
use dpu_e2e::{binary, Service};

const CONFIG: &str = r#"
[log]
level = "info,dpu_control=debug"

[storage]
ram_limit = "64MiB"
"#;

/// `dpuctl`'s exit code and error output.
fn code(svc: &Service, args: &[&str]) -> (i32, String) {
    let out = svc.dpuctl(args).expect("dpuctl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `dpuctl namespace create vol --file PATH --size SIZE`.
fn create_file(svc: &Service, path: &Path, size: &str) -> (i32, String) {
    let p = path.display().to_string();
    code(
        svc,
        &["namespace", "create", "vol", "--file", &p, "--size", size],
    )
}

/// Exit codes of dpuctl: 4 ALREADY_EXISTS, 5 INVALID_ARGUMENT,
/// 9 PERMISSION_DENIED.
const EXISTS: i32 = 4;
const INVALID: i32 = 5;
const DENIED: i32 = 9;

#[test]
fn backing_files_stay_in_their_directories() -> Result<()> {
    let svc = Service::start_config(CONFIG, &[])?;
    svc.dpuctl_json(&[
        "subsystem",
        "create",
        "vol",
        "--nqn",
        "nqn.2024-01.io.example:vol",
    ])?;
    let volumes = svc.state_dir.join("volumes");
    let mode = std::fs::metadata(&volumes)?.permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "created at start, for root only");

    // Absolute paths outside the directory: system files, the service's
    // own state, anywhere else.
    let elsewhere = tempfile::tempdir()?;
    for outside in [
        Path::new("/etc/shadow"),
        Path::new("/etc/cron.d/dpu"),
        &svc.state_dir.join("state.json"),
        &elsewhere.path().join("disk.img"),
    ] {
        let (c, err) = create_file(&svc, outside, "1M");
        assert_eq!(c, DENIED, "{}: {err}", outside.display());
        assert!(
            err.contains("namespace.file.path") && err.contains("storage.file_dirs"),
            "{}: {err}",
            outside.display()
        );
    }
    assert!(!Path::new("/etc/cron.d/dpu").exists());
    assert!(!elsewhere.path().join("disk.img").exists());

    // `..` out of the directory.
    let (c, err) = create_file(&svc, &volumes.join("../state.json"), "1M");
    assert_eq!(c, INVALID, "{err}");
    assert!(err.contains("namespace.file.path"), "{err}");

    // A symbolic link inside it, to a file outside or to a directory.
    std::os::unix::fs::symlink("/etc/passwd", volumes.join("passwd.img"))?;
    std::os::unix::fs::symlink("/etc", volumes.join("etc"))?;
    for link in [volumes.join("passwd.img"), volumes.join("etc/shadow")] {
        let (c, err) = create_file(&svc, &link, "1M");
        assert_eq!(c, DENIED, "{}: {err}", link.display());
        assert!(
            err.contains("namespace.file.path") && err.contains("symbolic link"),
            "{err}"
        );
    }
    let passwd = std::fs::metadata("/etc/passwd")?;
    assert_ne!(passwd.len(), 4 << 20, "untouched");

    // No device without storage.block_devices.
    let (c, err) = code(
        &svc,
        &["namespace", "create", "vol", "--block-device", "/dev/sda"],
    );
    assert_eq!(c, DENIED, "{err}");
    assert!(
        err.contains("namespace.block_device.path") && err.contains("storage.block_devices"),
        "{err}"
    );

    // Nothing refused was stored.
    let listed = svc.dpuctl_json(&["namespace", "list", "vol"])?;
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{listed}");

    // A file inside: created with its size, served.
    let disk = volumes.join("disk.img");
    svc.dpuctl_json(&[
        "namespace",
        "create",
        "vol",
        "--file",
        &disk.display().to_string(),
        "--size",
        "4M",
    ])?;
    let meta = std::fs::metadata(&disk)?;
    assert_eq!(meta.len(), 4 << 20);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    // The same file under another spelling backs no second namespace.
    let again = format!("{}//disk.img", volumes.display());
    let (c, err) = create_file(&svc, Path::new(&again), "4M");
    assert_eq!(c, EXISTS, "{err}");
    assert!(err.contains("subsystems/vol/namespaces/1"), "{err}");

    // An existing file is taken at its size and never truncated.
    let found = volumes.join("found.img");
    std::fs::write(&found, vec![7u8; 1 << 20])?;
    let (c, err) = create_file(&svc, &found, "512K");
    assert_eq!(c, INVALID, "{err}");
    assert!(err.contains("namespace.file.size_bytes"), "{err}");
    let p = found.display().to_string();
    let ns = svc.dpuctl_json(&["namespace", "create", "vol", "--file", &p])?;
    let nsid = ns["nsid"].as_u64().unwrap_or_default().to_string();
    let (c, err) = code(&svc, &["namespace", "resize", "vol", &nsid, "512K"]);
    assert_eq!(c, 6, "FAILED_PRECONDITION: {err}");
    // Another change to the state leaves it whole.
    svc.dpuctl_json(&["namespace", "create", "vol", "--ram", "1M"])?;
    assert_eq!(std::fs::read(&found)?, vec![7u8; 1 << 20]);
    Ok(())
}

#[test]
fn the_state_directory_cannot_be_a_file_directory() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[storage]\nfile_dirs = [\"/srv\", \"{}\"]\n",
            state.display()
        ),
    )?;
    let out = Command::new(binary("dpu-service")?)
        .arg("--config")
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .arg("--check-config")
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("storage.file_dirs[1]") && err.contains("state directory"),
        "{err}"
    );
    Ok(())
}
