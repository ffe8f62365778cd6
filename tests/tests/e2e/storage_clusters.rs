//! Storage clusters through the real binary, without a Ceph cluster: what
//! the API refuses before anything is stored. A cluster whose monitors
//! do not answer is refused within its connect timeout, naming them (the
//! daemon's probe connects through librados); malformed monitors, users
//! and keyrings are refused naming the field or the file; an RBD
//! namespace needs a cluster that exists. No answer, error or log line
//! carries the key.

use std::time::{Duration, Instant};

use anyhow::Result;
use dpu_e2e::Service;

/// A cephx key as `ceph auth get-key` prints it.
const KEY: &str = "AQCAmWZmQOIBABAAEBESExQVFhcYGRobHB0eHw==";

/// Exit codes of dpuctl: 3 NOT_FOUND, 5 INVALID_ARGUMENT, 6
/// FAILED_PRECONDITION.
const NOT_FOUND: i32 = 3;
const INVALID: i32 = 5;
const PRECONDITION: i32 = 6;

/// `dpuctl`'s exit code and error output.
fn code(svc: &Service, args: &[&str]) -> (i32, String) {
    let out = svc.dpuctl(args).expect("dpuctl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn clusters_that_cannot_be_used_are_refused_and_nothing_is_stored() -> Result<()> {
    let svc = Service::start()?;
    let dir = tempfile::tempdir()?;
    let keyring = dir.path().join("ceph.client.dpu.keyring");
    std::fs::write(
        &keyring,
        format!("[client.dpu]\n\tkey = {KEY}\n\tcaps mon = \"profile rbd\"\n"),
    )?;
    let keyring = keyring.display().to_string();

    // Monitors that do not answer: a port nothing listens on.
    let mon = format!("127.0.0.1:{}", dpu_e2e::free_port());
    let t = Instant::now();
    let (c, err) = code(
        &svc,
        &[
            "--timeout",
            "30",
            "cluster",
            "create",
            "ceph1",
            "--mon",
            &mon,
            "--user",
            "dpu",
            "--keyring-file",
            &keyring,
            "--connect-timeout",
            "2",
        ],
    );
    let took = t.elapsed();
    assert_eq!(c, PRECONDITION, "{err}");
    assert!(
        err.contains("clusters/ceph1") && err.contains(&mon),
        "names the cluster and its monitors: {err}"
    );
    // Two seconds to connect, and what dpuctl and the service add; well
    // inside the call's bound on the probe, (2 + 20) * 2 + 5 s.
    assert!(took < Duration::from_secs(15), "{took:?}: {err}");
    let listed = svc.dpuctl_json(&["cluster", "list"])?;
    assert_eq!(listed, serde_json::json!([]), "nothing stored");

    // Malformed input: refused before anything is tried.
    for (args, field) in [
        (
            vec!["--mon", "10.0.0.1:99999", "--user", "dpu"],
            "cluster.mon_host",
        ),
        (vec!["--mon", &mon, "--user", "client.dpu"], "cluster.user"),
        (
            vec!["--mon", &mon, "--user", "dpu", "--op-timeout", "301"],
            "cluster.op_timeout_secs",
        ),
    ] {
        let mut all = vec!["cluster", "create", "ceph1"];
        all.extend(args);
        let (c, err) = code(&svc, &all);
        assert_eq!(c, INVALID, "{all:?}: {err}");
        assert!(err.contains(field), "{all:?}: {err}");
    }
    // A key that is not a cephx key is refused without being quoted.
    let bare = dir.path().join("key");
    std::fs::write(&bare, format!("{}\n", &KEY[..36]))?;
    let bare = bare.display().to_string();
    let (c, err) = code(
        &svc,
        &[
            "cluster",
            "create",
            "ceph1",
            "--mon",
            &mon,
            "--user",
            "dpu",
            "--keyring-file",
            &bare,
        ],
    );
    assert_eq!(c, INVALID, "{err}");
    assert!(err.contains("cluster.key: not a cephx key"), "{err}");
    assert!(!err.contains(&KEY[..20]), "{err}");
    // A keyring without the user's section names the file and its sections.
    let (c, err) = code(
        &svc,
        &[
            "cluster",
            "create",
            "ceph1",
            "--mon",
            &mon,
            "--user",
            "rbd",
            "--keyring-file",
            &keyring,
        ],
    );
    assert_eq!(c, INVALID, "{err}");
    assert!(
        err.contains(&keyring) && err.contains("no [client.rbd] section"),
        "{err}"
    );

    // An RBD namespace names a cluster that exists.
    svc.dpuctl_json(&[
        "subsystem",
        "create",
        "vol",
        "--nqn",
        "nqn.2024-01.io.example:vol",
    ])?;
    let (c, err) = code(
        &svc,
        &[
            "namespace",
            "create",
            "vol",
            "--rbd",
            "rbd/img1",
            "--cluster",
            "ceph1",
        ],
    );
    assert_eq!(c, NOT_FOUND, "{err}");
    assert!(err.contains("clusters/ceph1 not found"), "{err}");
    let (c, err) = code(
        &svc,
        &[
            "namespace",
            "create",
            "vol",
            "--rbd",
            "rbd/img@snap",
            "--cluster",
            "ceph1",
        ],
    );
    assert_eq!(c, INVALID, "{err}");
    assert!(err.contains("namespace.rbd.image"), "{err}");
    let (c, err) = code(&svc, &["cluster", "delete", "ceph1"]);
    assert_eq!(c, NOT_FOUND, "{err}");

    let log = svc.log_text();
    assert!(!log.contains(&KEY[..20]), "the key is in the log");
    Ok(())
}
