//! The NVMe/TCP secure channel (TLS 1.3 with pre-shared keys) through the
//! real binary: a listener and a host's key declared in the configuration
//! file, `nvmf-perf` over TLS doing I/O, the refusals (clear text on a
//! listener that requires TLS, a wrong key, a host without one), a key
//! set and cleared with `dpuctl` on a listener that allows clear text,
//! `openssl s_client` as a second client with the derived PSK, the
//! discovery log's TREQ/TSAS, and the counts on `/metrics`.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use anyhow::{ensure, Context, Result};
use dpu_e2e::net::metric;
use dpu_e2e::{binary, free_port, nvmf_perf_iops, Service};

const NQN: &str = "nqn.2024-01.io.dpu-service:tls";
/// The host NQN `nvmf-perf` presents unless told another.
const PERF_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000001";
const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000002";
/// The specification's example key.
const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
const WRONG_KEY: &str = "NVMeTLSkey-1:01:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:";

/// Subsystem "tls" allowing both hosts, PERF_HOST with the key in
/// `key_file`, on a listener at `port` whose channel is `channel`.
fn config(port: u16, channel: &str, key_file: &str) -> String {
    format!(
        r#"
[storage]
ram_limit = "64MiB"

[[storage.subsystems]]
id = "tls"
nqn = "{NQN}"
allowed_hosts = ["{PERF_HOST}", "{OTHER_HOST}"]
host_tls = {{ "{PERF_HOST}" = {{ psk_file = "{key_file}" }} }}

[[storage.subsystems.namespaces]]
ram = "32MiB"
block_size = 512

[[storage.subsystems.listeners]]
address = "127.0.0.1"
port = {port}
secure_channel = "{channel}"
"#
    )
}

fn tls_metric(svc: &Service, name: &str) -> Result<u64> {
    Ok(metric(&svc.http_get("/metrics")?.1, name))
}

/// `nvmf-perf` with `args` against the subsystem; its output.
fn perf(port: u16, args: &[&str]) -> Result<std::process::Output> {
    Ok(Command::new(binary("nvmf-perf")?)
        .args(["--addr", &format!("127.0.0.1:{port}"), "--nqn", NQN])
        .args(args)
        .output()?)
}

fn write_key(dir: &std::path::Path, name: &str, key: &str) -> Result<String> {
    let p = dir.join(name);
    std::fs::write(&p, key)?;
    Ok(p.to_str().context("a UTF-8 path")?.to_string())
}

#[test]
fn a_host_with_its_key_does_io_over_tls_and_the_rest_are_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let key = write_key(dir.path(), "key", KEY)?;
    let wrong = write_key(dir.path(), "wrong", WRONG_KEY)?;
    let port = free_port();
    let svc = Service::start_config(&config(port, "required", &key), &[])?;

    // The host with its key: writes verified by reading back, then reads,
    // in both identity versions.
    for version in ["1", "0"] {
        let iops = nvmf_perf_iops(
            port,
            NQN,
            &[
                "--tls-key",
                &key,
                "--tls-identity",
                version,
                "--job",
                "randwrite:4k:16",
                "--job",
                "read:128k:4",
                "--time",
                "1",
            ],
        )?;
        ensure!(iops > 100.0, "{iops:.0} IOPS over TLS (identity {version})");
    }
    let handshakes = tls_metric(&svc, "dpu_nvmf_tls_handshakes_total")?;
    ensure!(handshakes >= 6, "{handshakes} handshakes counted");

    // Clear text on a listener that requires TLS: closed, counted.
    let out = perf(port, &["--job", "randread:4k:1", "--time", "1"])?;
    ensure!(!out.status.success(), "clear text got in");
    // A wrong key: the handshake fails.
    let out = perf(
        port,
        &["--tls-key", &wrong, "--tls-identity", "0", "--time", "1"],
    )?;
    ensure!(!out.status.success(), "a wrong key got in");
    // Another host with the right key has none here.
    let out = perf(
        port,
        &["--hostnqn", OTHER_HOST, "--tls-key", &key, "--time", "1"],
    )?;
    ensure!(!out.status.success(), "a host without a key got in");
    let m = svc.http_get("/metrics")?.1;
    for (name, at_least) in [
        ("dpu_nvmf_tls_refused_total{reason=\"clear_text\"}", 1),
        ("dpu_nvmf_tls_refused_total{reason=\"failed\"}", 1),
        ("dpu_nvmf_tls_refused_total{reason=\"unknown_key\"}", 1),
    ] {
        let n = metric(&m, name);
        ensure!(n >= at_least, "{name} = {n}");
    }
    // The service says why, once per kind, and never the key.
    let log = svc.log_text();
    ensure!(
        log.contains("clear-text connection on a listener that requires TLS"),
        "{log}"
    );
    ensure!(log.contains("no TLS key for host"), "{log}");
    ensure!(!log.contains("VRLbtnN9"), "the key is in the log");

    // `openssl s_client`, a client not built from this project, with the
    // TLS PSK derived as the specification says (version 0: the identity
    // is the HKDF context), sends an ICReq and gets the ICResp.
    let k = dpu_nvmeof::dpu_tls::ConfiguredPsk::parse(KEY)?;
    let (identity, psk) = k.tls_psk(0, PERF_HOST, NQN);
    let hex: String = psk.key.iter().map(|b| format!("{b:02x}")).collect();
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"])
        .args(["-psk", &hex, "-psk_identity", &identity, "-quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("openssl, from Debian's openssl package")?;
    let mut icreq = [0u8; 128];
    icreq[..8].copy_from_slice(&[0, 0, 128, 0, 128, 0, 0, 0]);
    icreq[10..12].copy_from_slice(&[0, 0]); // HPDA, DGST
    icreq[12..16].copy_from_slice(&[0, 0, 0, 0]); // MAXR2T
    let mut stdin = child.stdin.take().context("stdin")?;
    stdin.write_all(&icreq)?;
    let mut resp = [0u8; 128];
    child
        .stdout
        .take()
        .context("stdout")?
        .read_exact(&mut resp)?;
    ensure!(
        resp[0] == 1 && resp[2] == 128,
        "an ICResp over openssl's TLS: {:?}",
        &resp[..8]
    );
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    Ok(())
}

#[test]
fn keys_set_with_dpuctl_on_an_allowing_listener_and_the_discovery_log() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let key = write_key(dir.path(), "key", KEY)?;
    let other_key = write_key(
        dir.path(),
        "other",
        "NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ==:",
    )?;
    let port = free_port();
    let svc = Service::start_config(&config(port, "allowed", &key), &[])?;

    // OTHER_HOST reads for a second in clear text, and gets through.
    let clear_reads = |when: &str| -> Result<()> {
        let args = [
            "--hostnqn",
            OTHER_HOST,
            "--job",
            "randread:4k:8",
            "--time",
            "1",
        ];
        let iops = nvmf_perf_iops(port, NQN, &args)?;
        ensure!(iops > 100.0, "{iops:.0} IOPS in clear text {when}");
        Ok(())
    };
    // A host without a key comes in clear text.
    clear_reads("without a key")?;
    // PERF_HOST has a key: in clear text its Connect is refused.
    let out = perf(port, &["--job", "randread:4k:1", "--time", "1"])?;
    ensure!(
        !out.status.success(),
        "a host with a key got in in clear text"
    );
    ensure!(
        tls_metric(
            &svc,
            "dpu_nvmf_tls_connects_refused_total{reason=\"without_tls\"}"
        )? >= 1,
        "not counted"
    );

    // OTHER_HOST gets a key (SHA-384) with dpuctl: from its next
    // handshake on, over TLS only; the key is never shown back.
    let shown = svc.dpuctl_ok(&[
        "subsystem",
        "set-tls-key",
        "tls",
        OTHER_HOST,
        "--psk-file",
        &other_key,
    ])?;
    ensure!(!shown.contains("VRLb"), "the key is shown: {shown}");
    let got = svc.dpuctl_ok(&["subsystem", "get", "tls"])?;
    ensure!(got.contains("psk:02") && !got.contains("VRLb"), "{got}");
    let iops = nvmf_perf_iops(
        port,
        NQN,
        &[
            "--hostnqn",
            OTHER_HOST,
            "--tls-key",
            &other_key,
            "--job",
            "randread:4k:8",
            "--time",
            "1",
        ],
    )?;
    ensure!(
        iops > 100.0,
        "{iops:.0} IOPS over TLS with the SHA-384 suite"
    );
    let out = perf(port, &["--hostnqn", OTHER_HOST, "--time", "1"])?;
    ensure!(!out.status.success(), "clear text after the key was set");

    // Cleared: clear text again.
    svc.dpuctl_ok(&["subsystem", "clear-tls-key", "tls", OTHER_HOST])?;
    clear_reads("after the key went")?;

    // A bad key is refused by reason and loses nothing.
    let bad = write_key(dir.path(), "bad", &KEY.replace("VRLb", "VRLc"))?;
    let out = svc.dpuctl(&[
        "subsystem",
        "set-tls-key",
        "tls",
        OTHER_HOST,
        "--psk-file",
        &bad,
    ])?;
    ensure!(!out.status.success(), "a key with a bad CRC was taken");
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(err.contains("CRC") && !err.contains("VRL"), "{err}");

    // The discovery log says the port speaks TLS (TREQ not required,
    // TSAS SECTYPE TLS 1.3); nvmf-perf prints the entry.
    let out = perf(port, &["--hostnqn", OTHER_HOST, "--discover"])?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        text.trim() == format!("127.0.0.1 {port} {NQN} tls=allowed"),
        "{text}"
    );
    Ok(())
}

/// What a Linux 6.12 guest needs to connect over TLS
/// (`tests/kernel-tls-share.sh`), with the host's key `key` as `psk`:
/// the folder to give the harness as `--share`.
pub(crate) fn tls_guest_share(key: &str) -> Result<std::path::PathBuf> {
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let share = target_dir.join("kernel-tls");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernel-tls-share.sh");
    let prep = Command::new("bash").arg(&script).arg(&share).output()?;
    ensure!(
        prep.status.success(),
        "{}: {}",
        script.display(),
        String::from_utf8_lossy(&prep.stderr)
    );
    std::fs::write(share.join("psk"), key)?;
    Ok(share)
}

/// Runs `guest` (a script) in a Linux 6.12 kernel-nvme guest with `share`
/// and the harness's `args`, one CPU; fails unless it succeeds, says
/// `CONNECTED: tls` and `REFUSED: clear text`, and fio found no error.
pub(crate) fn run_tls_guest(
    svc: &Service,
    share: &std::path::Path,
    guest: &str,
    args: &[&str],
) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let script_path = dir.path().join("guest.sh");
    std::fs::write(&script_path, guest)?;
    let out = Command::new(dpu_e2e::tools::kernel_nvme_harness()?)
        .args([
            "--kernel-suite",
            "trixie",
            "--cpus",
            "1",
            "--timeout",
            "300",
        ])
        .args(args)
        .arg("--share")
        .arg(share)
        .arg("--script")
        .arg(&script_path)
        .stdin(Stdio::null())
        .output()
        .context("starting kernel-nvme")?;
    let console = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success()
            && console.contains("CONNECTED: tls")
            && console.contains("REFUSED: clear text"),
        "guest failed ({}):\n{console}\n{}\n--- service log ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        svc.log_text()
    );
    ensure!(console.contains("err= 0"), "fio: {console}");
    Ok(console)
}

/// Linux 6.12's initiator over TLS through the daemon: the guest carries
/// Debian 13's `tlshd` (which makes the kernel's handshakes) and
/// nvme-cli 2.13 (`tests/kernel-tls-share.sh`), inserts the host's key
/// into its `.nvme` keyring as a version 1 identity, connects with
/// `--tls` and runs fio with verification; in clear text it is refused.
/// nvme-cli 2.13 derives keys as libnvme long did (`Derivation::Compat`),
/// which a version 1 identity's digest tells the target; then as a
/// version 0 identity (`nvme connect --tls`'s default lookup), which
/// carries no digest: the key's `v0_derivation = "compat"` says.
#[test]
fn the_linux_initiator_connects_over_tls_through_the_daemon() -> Result<()> {
    const KNQN: &str = "nqn.2024-01.io.dpu-service.test:ktls";
    const KHOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6b746c73-0000-4000-8000-000000000001";
    let share = tls_guest_share(KEY)?;

    let dir = tempfile::tempdir()?;
    let key = write_key(dir.path(), "key", KEY)?;
    let port = free_port();
    let svc = Service::start_config(
        &format!(
            r#"
[storage]
ram_limit = "64MiB"

[[storage.subsystems]]
id = "ktls"
nqn = "{KNQN}"
allowed_hosts = ["{KHOST}"]
host_tls = {{ "{KHOST}" = {{ psk_file = "{key}", v0_derivation = "compat" }} }}

[[storage.subsystems.namespaces]]
ram = "32MiB"
block_size = 512

[[storage.subsystems.listeners]]
address = "127.0.0.1"
port = {port}
secure_channel = "required"
"#
        ),
        &[],
    )?;
    let guest = format!(
        "set -e\n\
         /mnt/host/setup\n\
         out=$(/mnt/host/run /mnt/host/root/usr/sbin/nvme check-tls-key --keydata=\"$(cat /mnt/host/psk)\" \
             --hostnqn={KHOST} --subsysnqn={KNQN} --identity=1 --insert)\n\
         echo \"$out\"\n\
         serial=$(echo \"$out\" | awk '{{print $NF}}')\n\
         if nvme connect -t tcp -a $TARGET_ADDR -s $TARGET_PORT -n {KNQN} --hostnqn {KHOST}; then \
             echo 'UNEXPECTED: clear text connected'; exit 1; fi\n\
         echo 'REFUSED: clear text'\n\
         /mnt/host/run /mnt/host/root/usr/sbin/nvme connect -t tcp -a $TARGET_ADDR -s $TARGET_PORT -n {KNQN} \
             --hostnqn {KHOST} --tls --tls_key=$((0x$serial))\n\
         ns=$(nvme-wait-ns {KNQN} 1 30)\n\
         fio --name=v --filename=$ns --direct=1 --ioengine=libaio --rw=randwrite --bs=16k --iodepth=8 \
             --size=8M --verify=crc32c --verify_fatal=1 --eta=never\n\
         echo 'CONNECTED: tls'\n\
         /mnt/host/run /mnt/host/root/usr/sbin/nvme disconnect -n {KNQN}\n\
         /mnt/host/run /mnt/host/root/usr/sbin/nvme check-tls-key --keydata=\"$(cat /mnt/host/psk)\" \
             --hostnqn={KHOST} --subsysnqn={KNQN} --identity=0 --insert\n\
         /mnt/host/run /mnt/host/root/usr/sbin/nvme connect -t tcp -a $TARGET_ADDR -s $TARGET_PORT -n {KNQN} \
             --hostnqn {KHOST} --tls\n\
         ns=$(nvme-wait-ns {KNQN} 1 30)\n\
         dd if=/dev/urandom of=/tmp/w bs=4096 count=64\n\
         dd if=/tmp/w of=$ns bs=4096 count=64 oflag=direct\n\
         dd if=$ns of=/tmp/r bs=4096 count=64 iflag=direct\n\
         cmp /tmp/w /tmp/r\n\
         echo 'CONNECTED: tls identity 0'\n\
         /mnt/host/run /mnt/host/root/usr/sbin/nvme disconnect -n {KNQN}\n"
    );
    run_tls_guest(
        &svc,
        &share,
        &guest,
        &["--hostnqn", KHOST, "--target", &format!("127.0.0.1:{port}")],
    )?;
    // Twice the admin queue and its I/O queue (one per guest CPU), each
    // its own handshake.
    let n = tls_metric(&svc, "dpu_nvmf_tls_handshakes_total")?;
    ensure!(n >= 4, "{n} handshakes");
    let n = tls_metric(&svc, "dpu_nvmf_tls_refused_total{reason=\"clear_text\"}")?;
    ensure!(n >= 1, "{n} clear-text refusals");
    Ok(())
}

/// Hostile hosts through the real binary: 800 connections from two
/// addresses that start a TLS hello and stop (half a record header's
/// promise, then nothing). At most 64 a source address are held in
/// handshake, the rest closed at once and counted `busy`; a host with its
/// key keeps doing its I/O over TLS meanwhile; the service's descriptors
/// and memory grow by a bounded amount; the held ones are closed at the
/// handshake timeout.
#[test]
fn a_flood_of_stalled_hellos_leaves_a_host_its_tls_io() -> Result<()> {
    let _one = crate::floods();
    dpu_os::limits::raise_open_files()?;
    let dir = tempfile::tempdir()?;
    let key = write_key(dir.path(), "key", KEY)?;
    let port = free_port();
    let svc = Service::start_config(&config(port, "required", &key), &[])?;
    let tls_io = || {
        nvmf_perf_iops(
            port,
            NQN,
            &["--tls-key", &key, "--job", "randread:4k:4", "--time", "0.5"],
        )
    };
    let before = tls_io()?;
    let (fds0, rss0) = crate::api_flood::fds_and_rss(&svc)?;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let hello: &'static [u8] = &[0x16, 3, 1, 0, 200, 1];
    let held = rt.block_on(async {
        let mut held = Vec::new();
        for i in 1..=2u8 {
            let from = std::net::Ipv4Addr::new(127, 0, 3, i);
            held.extend(crate::api_flood::flood(addr, from, 400, hello).await.0);
        }
        held
    });
    ensure!(held.len() >= 700, "{} flood connections made", held.len());
    let busy = |svc: &Service| tls_metric(svc, "dpu_nvmf_tls_refused_total{reason=\"busy\"}");
    let t0 = std::time::Instant::now();
    while busy(&svc)? < 800 - 2 * 64 {
        ensure!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "{} refused as busy",
            busy(&svc)?
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let during = tls_io()?;
    let (fds1, rss1) = crate::api_flood::fds_and_rss(&svc)?;
    println!(
        "TLS hello flood: {} held by the flood, {} refused busy; TLS I/O {before:.0} -> {during:.0} IOPS; descriptors {fds0} -> {fds1}, RSS {rss0} -> {rss1} KiB",
        held.len(),
        busy(&svc)?
    );
    ensure!(during > 100.0, "{during:.0} IOPS over TLS during the flood");
    ensure!(fds1 <= fds0 + 2 * 64 + 16, "descriptors {fds0} -> {fds1}");
    ensure!(
        rss1.saturating_sub(rss0) < 32 << 10,
        "RSS {rss0} -> {rss1} KiB"
    );
    // The handshake timeout (10 s) closes the 128 held.
    let t0 = std::time::Instant::now();
    while tls_metric(&svc, "dpu_nvmf_tls_refused_total{reason=\"timeout\"}")? < 2 * 64 {
        ensure!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "held hellos not closed at the handshake timeout"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    drop(held);
    Ok(())
}
