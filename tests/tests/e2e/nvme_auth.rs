//! NVMe in-band authentication (DH-HMAC-CHAP) through the real binary:
//! secrets set with `dpuctl` (from files), the project's own host
//! (`nvmf-perf`) authenticating to the daemon one way and both ways and
//! doing I/O, a wrong host secret, a wrong controller secret and a
//! missing secret where one is required refused and counted on `/metrics`,
//! secrets never in a response, the log or `/metrics`, kept in the state
//! files (mode 0600) and applied again after a restart. Then the Linux
//! initiator (Debian 13's 6.12, in the `kernel-nvme` tool's guest)
//! authenticates through the daemon with SHA-256/ffdhe2048 one way and
//! both ways, and with SHA-512/ffdhe4096 and SHA-512/null both ways, and is
//! refused with a wrong host or controller secret or none.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

use anyhow::{bail, ensure, Context, Result};
use dpu_e2e::{binary, free_port, Service};

const NQN: &str = "nqn.2024-01.io.dpu-service.test:auth";
/// The host NQNs `nvmf-perf` connects with.
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:e2e-auth-host";
const HOST2: &str = "nqn.2014-08.org.nvmexpress:uuid:e2e-auth-other";

/// Keys of one repeated byte, in `DHHC-1` form (as `nvme gen-dhchap-key`
/// writes them): a host secret used as it is, one transformed with
/// SHA-256, and a controller secret.
const SECRET: &str = "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:";
const SECRET_SHA256: &str = "DHHC-1:01:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgJvwX3v:";
const CTRL_SECRET: &str =
    "DHHC-1:02:AwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDe+w+Zg==:";
const WRONG_SECRET: &str =
    "DHHC-1:00:BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUF5lUjlA==:";
const WRONG_CTRL: &str = "DHHC-1:03:BAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBBND/Fc=:";

/// The key part of every secret above: what must never leave the service.
fn key_parts() -> Vec<&'static str> {
    [SECRET, SECRET_SHA256, CTRL_SECRET]
        .iter()
        .map(|s| &s[10..s.len() - 1])
        .collect()
}

/// Fails if `text` (what `what` is) holds any key.
fn holds_no_key(what: &str, text: &str) {
    for k in key_parts() {
        assert!(!text.contains(k), "{what} holds a secret: {text}");
    }
}

/// `nvmf-perf` as `host`, with the secrets given, writing then reading
/// 4 KiB blocks for 0.3 s each on one I/O queue.
fn perf(port: u16, host: &str, secret: Option<&str>, ctrl: Option<&str>) -> Result<Output> {
    let mut c = Command::new(binary("nvmf-perf")?);
    c.args(["--addr", &format!("127.0.0.1:{port}"), "--nqn", NQN])
        .args(["--hostnqn", host, "--time", "0.3"])
        .args(["--job", "randwrite:4k:4", "--job", "randread:4k:4"]);
    if let Some(s) = secret {
        c.args(["--dhchap-secret", s]);
    }
    if let Some(s) = ctrl {
        c.args(["--dhchap-ctrl-secret", s]);
    }
    Ok(c.output()?)
}

/// The job ran: exit 0 and a positive IOPS figure on each job's line.
fn did_io(what: &str, out: &Output) -> Result<()> {
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{what}: nvmf-perf failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let iops: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("job"))
        .filter_map(|l| l.split_whitespace().find_map(|t| t.parse().ok()))
        .collect();
    ensure!(
        iops.len() == 2 && iops.iter().all(|&x| x > 0.0),
        "{what}: no I/O in {text}"
    );
    Ok(())
}

/// The job was refused: a non-zero exit.
fn refused(what: &str, out: &Output) {
    assert!(
        !out.status.success(),
        "{what}: nvmf-perf connected: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `dpu_nvmf_auth_total` of the subsystem for `result`.
fn auth_total(svc: &Service, result: &str) -> Result<u64> {
    let (_, body) = svc.http_get("/metrics")?;
    holds_no_key("/metrics", &body);
    let series = format!("dpu_nvmf_auth_total{{subsystem=\"auth\",result=\"{result}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no {series} in /metrics"))
}

#[test]
fn dhchap_through_the_daemon() -> Result<()> {
    let mut svc = Service::start()?;
    let port = free_port();
    let dir = tempfile::tempdir()?;
    let file = |name: &str, text: &str| -> Result<String> {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("{text}\n"))?;
        Ok(p.display().to_string())
    };
    let (secret_file, ctrl_file) = (file("host.key", SECRET)?, file("ctrl.key", CTRL_SECRET)?);

    svc.local_subsystem("auth", NQN, &[HOST, HOST2], "16M", port)?;
    // Before any secret, the host connects without authenticating.
    did_io("no secret set", &perf(port, HOST, None, None)?)?;

    // A bad secret is refused naming the field, without echoing it.
    let bad = svc.dpuctl(&[
        "subsystem",
        "set-auth",
        "auth",
        HOST,
        "--dhchap-secret",
        &SECRET.replace("AQEB", "AQEC"),
    ])?;
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(5), "{err}");
    assert!(
        err.contains("auth.dhchap_secret") && err.contains("CRC"),
        "{err}"
    );

    // One way, the secret from a file.
    let shown = svc.dpuctl_ok(&[
        "subsystem",
        "set-auth",
        "auth",
        HOST,
        "--dhchap-secret-file",
        &secret_file,
    ])?;
    assert!(shown.contains(&format!("{HOST}=secret:00")), "{shown}");
    holds_no_key("set-auth output", &shown);
    did_io("one way", &perf(port, HOST, Some(SECRET), None)?)?;
    let ok = auth_total(&svc, "succeeded")?;
    assert!(ok >= 2, "admin and I/O queue authenticated: {ok}");
    refused("wrong secret", &perf(port, HOST, Some(WRONG_SECRET), None)?);
    refused("no secret", &perf(port, HOST, None, None)?);
    let failed = auth_total(&svc, "failed")?;
    assert!(failed >= 1, "the wrong secret is counted: {failed}");

    // Both ways, with a SHA-256-transformed host secret, SHA-256 and
    // ffdhe2048 only; the change takes effect at the next connect.
    let sha_file = file("sha.key", SECRET_SHA256)?;
    svc.dpuctl_ok(&[
        "subsystem",
        "set-auth",
        "auth",
        HOST,
        "--dhchap-secret-file",
        &sha_file,
        "--dhchap-ctrl-secret-file",
        &ctrl_file,
        "--hash",
        "sha256",
        "--dh-group",
        "ffdhe2048",
    ])?;
    refused("the old secret", &perf(port, HOST, Some(SECRET), None)?);
    did_io(
        "both ways",
        &perf(port, HOST, Some(SECRET_SHA256), Some(CTRL_SECRET))?,
    )?;
    let before = auth_total(&svc, "failed")?;
    refused(
        "wrong controller secret",
        &perf(port, HOST, Some(SECRET_SHA256), Some(WRONG_CTRL))?,
    );
    assert!(
        auth_total(&svc, "failed")? > before,
        "a wrong controller secret is counted"
    );

    // Required for every host: the second one, without a secret, is
    // refused at Connect and counted.
    did_io("not required yet", &perf(port, HOST2, None, None)?)?;
    svc.dpuctl_ok(&["subsystem", "update", "auth", "--auth", "required"])?;
    let before = auth_total(&svc, "failed")?;
    refused("missing secret", &perf(port, HOST2, None, None)?);
    assert!(
        auth_total(&svc, "failed")? > before,
        "the refusal is counted"
    );

    // Get shows whether a secret is set and its hash, never the secret.
    let got = svc.dpuctl_json(&["subsystem", "get", "auth"])?;
    holds_no_key("GetSubsystem", &got.to_string());
    let a = &got["hostAuth"][0];
    assert_eq!(a["hostNqn"], HOST, "{got}");
    assert_eq!(a["secretSet"], true, "{got}");
    assert_eq!(a["secretHash"], 1, "{got}");
    assert_eq!(a["ctrlSecretSet"], true, "{got}");
    assert_eq!(a["ctrlSecretHash"], 2, "{got}");
    assert_eq!(got["authRequirement"], "AUTH_REQUIREMENT_REQUIRED", "{got}");
    let listed = svc.dpuctl_ok(&["--output", "json", "subsystem", "list"])?;
    holds_no_key("ListSubsystems", &listed);
    let counters = svc.dpuctl_ok(&["--output", "json", "counters"])?;
    holds_no_key("GetCounters", &counters);
    assert!(counters.contains("authSucceeded"), "{counters}");

    // Kept in the state files, which only the service's user can read,
    // and applied again at start.
    let mut holding = 0;
    for e in std::fs::read_dir(&svc.state_dir)? {
        let path = e?.path();
        if !path.is_file() {
            continue;
        }
        let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", path.display());
        let text = String::from_utf8_lossy(&std::fs::read(&path)?).into_owned();
        holding += usize::from(text.contains(&SECRET_SHA256[10..50]));
    }
    assert!(holding >= 1, "no state file holds the secret");
    svc.restart()?;
    did_io(
        "both ways after a restart",
        &perf(port, HOST, Some(SECRET_SHA256), Some(CTRL_SECRET))?,
    )?;
    refused(
        "wrong secret after a restart",
        &perf(port, HOST, Some(WRONG_SECRET), None)?,
    );
    refused(
        "missing secret after a restart",
        &perf(port, HOST2, None, None)?,
    );

    // Cleared, and no longer required: the host connects without.
    svc.dpuctl_ok(&["subsystem", "clear-auth", "auth", HOST])?;
    svc.dpuctl_ok(&["subsystem", "update", "auth", "--auth", "hosts-with-secret"])?;
    did_io("cleared", &perf(port, HOST, None, None)?)?;

    holds_no_key("the service's log", &svc.log_text());
    Ok(())
}

/// One guest run of Linux 6.12 against subsystems whose host has a
/// secret and a controller secret: on the first, SHA-256 and ffdhe2048
/// only, it connects one way and both ways, then is refused with a wrong
/// host secret, a wrong controller secret and no secret; on the others
/// it connects both ways with SHA-512 and ffdhe4096, and with SHA-512 and
/// the null group. Each connect writes and reads back 256 KiB with `dd`;
/// successes and failures are counted per subsystem.
#[test]
fn kernel_initiator_authenticates_through_the_daemon() -> Result<()> {
    const KNQN: &str = "nqn.2024-01.io.dpu-service.test:kauth";
    /// Subsystem ID, NQN, hash and DH group of the subsystems connected
    /// both ways with SHA-512.
    const SHA512: [(&str, &str, &str, &str); 2] = [
        (
            "k4096",
            "nqn.2024-01.io.dpu-service.test:k4096",
            "sha512",
            "ffdhe4096",
        ),
        (
            "knull",
            "nqn.2024-01.io.dpu-service.test:knull",
            "sha512",
            "null",
        ),
    ];
    let svc = Service::start()?;
    let port = free_port();
    let dir = tempfile::tempdir()?;
    let write = |name: &str, text: &str| -> Result<String> {
        let path = dir.path().join(name);
        std::fs::write(&path, text)?;
        Ok(path.display().to_string())
    };
    let (sf, cf) = (write("h.key", SECRET_SHA256)?, write("c.key", CTRL_SECRET)?);
    svc.local_subsystem("auth", KNQN, &[HOST], "16M", port)?;
    svc.dpuctl_ok(&[
        "subsystem",
        "set-auth",
        "auth",
        HOST,
        "--dhchap-secret-file",
        &sf,
        "--dhchap-ctrl-secret-file",
        &cf,
        "--hash",
        "sha256",
        "--dh-group",
        "ffdhe2048",
    ])?;
    for (id, nqn, hash, group) in SHA512 {
        svc.local_subsystem(id, nqn, &[HOST], "8M", port)?;
        svc.dpuctl_ok(&[
            "subsystem",
            "set-auth",
            id,
            HOST,
            "--dhchap-secret-file",
            &sf,
            "--dhchap-ctrl-secret-file",
            &cf,
            "--hash",
            hash,
            "--dh-group",
            group,
        ])?;
    }
    // A 30 s keep-alive: the guest is emulated, and on a busy machine its
    // side of a 4096-bit DH exchange took longer than the default 5 s,
    // which the target's keep-alive timer counts from the Connect.
    let connect_to = |nqn: &str, extra: &str| {
        format!(
            "nvme connect -t tcp -a $TARGET_ADDR -s $TARGET_PORT -n {nqn} --hostnqn {HOST} \
             -i 1 -k 30 {extra}"
        )
    };
    let connect = |extra: &str| connect_to(KNQN, extra);
    let io_on = |nqn: &str| {
        format!(
            "dev=$(nvme-wait-ns {nqn} 1 20)\n\
             dd if=/dev/urandom of=/tmp/w bs=4096 count=64\n\
             dd if=/tmp/w of=$dev bs=4096 count=64 oflag=direct\n\
             dd if=$dev of=/tmp/r bs=4096 count=64 iflag=direct\n\
             cmp /tmp/w /tmp/r\n\
             nvme disconnect -n {nqn}\n"
        )
    };
    let io = io_on(KNQN);
    let refused = |case: &str, extra: &str| {
        format!(
            "if {}; then echo 'UNEXPECTED: {case} connected'; exit 1; fi\necho 'REFUSED: {case}'\n",
            connect(extra)
        )
    };
    let script = [
        "set -e\nmodprobe nvme-tcp\n".to_string(),
        connect(&format!("--dhchap-secret {SECRET_SHA256}")) + "\n",
        io.clone(),
        "echo 'CONNECTED: one way'\n".into(),
        connect(&format!(
            "--dhchap-secret {SECRET_SHA256} --dhchap-ctrl-secret {CTRL_SECRET}"
        )) + "\n",
        io,
        "echo 'CONNECTED: both ways'\n".into(),
        refused(
            "wrong host secret",
            &format!("--dhchap-secret {WRONG_SECRET}"),
        ),
        refused(
            "wrong controller secret",
            &format!("--dhchap-secret {SECRET_SHA256} --dhchap-ctrl-secret {WRONG_CTRL}"),
        ),
        refused("no secret", ""),
    ]
    .concat()
        + &SHA512
            .iter()
            .map(|(_, nqn, hash, group)| {
                let both =
                    format!("--dhchap-secret {SECRET_SHA256} --dhchap-ctrl-secret {CTRL_SECRET}");
                format!(
                    "{}\n{}echo 'CONNECTED: {hash}/{group}'\n",
                    connect_to(nqn, &both),
                    io_on(nqn)
                )
            })
            .collect::<String>();
    let script_path = write("guest.sh", &script)?;
    // Linux 6.12 under TCG sometimes dies at boot, patching its own text
    // across CPUs (an int3 Oops in an IPI handler, then "Kernel panic").
    // One CPU avoids the cross-CPU patching; a guest that still panics
    // before its script printed anything is booted again, at most twice.
    let mut attempt = 0;
    let (out, console) = loop {
        attempt += 1;
        let t0 = std::time::Instant::now();
        let out = Command::new(dpu_e2e::tools::kernel_nvme_harness()?)
            .args([
                "--kernel-suite",
                "trixie",
                "--cpus",
                "1",
                "--timeout",
                "300",
                "--hostnqn",
                HOST,
            ])
            .args([
                "--target",
                &format!("127.0.0.1:{port}"),
                "--script",
                &script_path,
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .context("starting kernel-nvme")?;
        let console = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("kernel guest ran {:.1?} (boot {attempt})", t0.elapsed());
        let died_booting = !out.status.success()
            && console.contains("Kernel panic - not syncing")
            && !console.contains("CONNECTED:")
            && !console.contains("REFUSED:");
        if died_booting && attempt < 3 {
            eprintln!("the guest kernel panicked before its script ran; booting it again");
            continue;
        }
        break (out, console);
    };
    if !out.status.success() {
        bail!(
            "guest failed ({}):\n{console}\n{}\n--- service log ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            svc.log_text()
        );
    }
    // Shown with --nocapture.
    println!("{console}");
    for line in [
        "CONNECTED: one way",
        "CONNECTED: both ways",
        "REFUSED: wrong host secret",
        "REFUSED: wrong controller secret",
        "REFUSED: no secret",
        "CONNECTED: sha512/ffdhe4096",
        "CONNECTED: sha512/null",
    ] {
        assert!(
            console.lines().any(|l| l.trim() == line),
            "no {line}:\n{console}"
        );
    }
    // What the kernel says it negotiated, and that it checked the
    // controller.
    for said in [
        "authenticated with hash hmac(sha256) dhgroup ffdhe2048",
        "authenticated with hash hmac(sha512) dhgroup ffdhe4096",
        "authenticated with hash hmac(sha512) dhgroup null",
        "controller authenticated",
    ] {
        assert!(
            console.contains(said),
            "the kernel never said {said:?}:\n{console}"
        );
    }
    // Two good connects of two queues each; three refusals.
    let ok = auth_total(&svc, "succeeded")?;
    let failed = auth_total(&svc, "failed")?;
    assert!(ok >= 4, "{ok} authentications succeeded");
    assert!(failed >= 3, "{failed} authentications failed");
    for (id, ..) in SHA512 {
        let (_, body) = svc.http_get("/metrics")?;
        let series = format!("dpu_nvmf_auth_total{{subsystem=\"{id}\",result=\"succeeded\"}} ");
        let n: u64 = body
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no {series}"))?;
        assert!(n >= 2, "{id}: {n} authentications succeeded");
    }
    holds_no_key("the service's log", &svc.log_text());
    Ok(())
}
