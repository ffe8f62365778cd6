//! The NVMe/TCP secure channel at a storage endpoint, through the real
//! binary: a tenant's host in a network namespace, behind a switch port
//! (kernel driver), reaches its endpoint over TLS 1.3 with its key
//! (`nvmf-perf --tls-key`, and `openssl s_client` with the derived PSK,
//! 40 of them at once against a DH pool with room for one step queued:
//! each waits its turn, none is refused); clear text and a wrong key are
//! refused and counted; 48 queues of one host over TLS do I/O at once;
//! 100 connections
//! from a second address of the host that send the first bytes of a
//! hello and stall hold at most the address's share of the endpoint
//! until the handshake timeout, while the host's TLS I/O goes on; on a
//! listener that allows clear text, the discovery log says so, a host
//! without a key comes in clear text and the host with a key must use
//! TLS. Needs root; everything made is removed on exit.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dpu_e2e::net::{eventually, metric};
use dpu_e2e::{output_text as text, Service};

use crate::endpoint_serving::{allow_tenant, config, did_io, Host, EP, HOST};

const NQN: &str = "nqn.2024-01.io.dpu-service.test:ep-tls";
/// The host NQN `nvmf-perf` presents unless told another.
const PERF_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000001";
const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000002";
/// The specification's example key.
const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
const WRONG_KEY: &str = "NVMeTLSkey-1:01:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:";
/// The host's second address, the stalled hellos' source.
const FLOOD_SRC: &str = "10.77.0.6";
/// Connections the stalled hellos open.
const FLOOD: usize = 100;
/// The endpoint's connections per address.
const PER_ADDRESS: usize = 64;
/// `openssl s_client`s that handshake at once.
const BURST: usize = 40;
/// I/O queues of one host over TLS at once.
const QUEUES: usize = 48;

/// Opens `n` connections from `src` to `dst:4420`, sends each the first
/// three bytes of a TLS record and holds them for `hold` seconds.
const STALL: &str = r#"
import socket, sys, time
src, dst, n, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
held = []
for _ in range(n):
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(2)
    try:
        s.connect((dst, 4420))
        s.send(b"\x16\x03\x01")
    except OSError:
        pass
    held.append(s)
print("opened", len(held), flush=True)
time.sleep(hold)
"#;

fn tls_metric(svc: &Service, reason: &str) -> Result<u64> {
    Ok(metric(
        &svc.http_get("/metrics")?.1,
        &format!("dpu_nvmf_tls_refused_total{{reason=\"{reason}\"}}"),
    ))
}

/// Writes then reads 4 KiB blocks at the endpoint over TLS with the key
/// in `key`, in identity `version`.
fn tls_io(host: &Host, key: &str, version: &str) -> Result<std::process::Output> {
    let at = format!("{EP}:4420");
    host.io_with(&at, NQN, &["--tls-key", key, "--tls-identity", version])
}

/// [`tls_io`] without a key (clear text), as `hostnqn`.
fn clear_io(host: &Host, hostnqn: &str) -> Result<std::process::Output> {
    host.io_with(&format!("{EP}:4420"), NQN, &["--hostnqn", hostnqn])
}

/// `n` clients of `openssl s_client` at once in the host's namespace,
/// with the TLS PSK derived as the specification says (identity version
/// 0): each sends an ICReq and must get the ICResp.
fn openssl_icreqs(host: &Host, n: usize) -> Result<()> {
    let k = dpu_nvmeof::dpu_tls::ConfiguredPsk::parse(KEY)?;
    let (identity, psk) = k.tls_psk(0, PERF_HOST, NQN);
    let hex: String = psk.key.iter().map(|b| format!("{b:02x}")).collect();
    let mut icreq = [0u8; 128];
    icreq[..8].copy_from_slice(&[0, 0, 128, 0, 128, 0, 0, 0]);
    let mut children = Vec::new();
    for _ in 0..n {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &host.ns.name, "timeout", "20"])
            .args(["openssl", "s_client", "-connect", &format!("{EP}:4420")])
            .args(["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"])
            // -quiet would keep it running past its input's end.
            .args([
                "-psk",
                &hex,
                "-psk_identity",
                &identity,
                "-quiet",
                "-no_ign_eof",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("openssl, from Debian's openssl package")?;
        let mut stdin = child.stdin.take().context("stdin")?;
        stdin.write_all(&icreq)?;
        children.push((child, stdin));
    }
    let mut failed = Vec::new();
    for (i, (mut child, stdin)) in children.into_iter().enumerate() {
        let mut resp = [0u8; 128];
        let got = child.stdout.take().context("stdout")?.read_exact(&mut resp);
        // Its input's end ends it.
        drop(stdin);
        let out = child.wait_with_output()?;
        if got.is_err() || resp[0] != 1 || resp[2] != 128 {
            failed.push(format!("client {i}: {:?} {}", &resp[..8], text(&out)));
        }
    }
    ensure!(
        failed.is_empty(),
        "{} of {n} openssl clients got no ICResp: {}",
        failed.len(),
        failed.join("; ")
    );
    Ok(())
}

#[test]
fn a_tenants_host_uses_tls_at_its_storage_endpoint() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("key");
    std::fs::write(&key, KEY)?;
    let key = key.to_str().context("a UTF-8 path")?.to_string();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, WRONG_KEY)?;
    let wrong = wrong.to_str().context("a UTF-8 path")?.to_string();

    let blue = Host::new("t", HOST)?;
    blue.add_address(&format!("{FLOOD_SRC}/24"))?;
    let storage =
        format!("max_connections_per_address = {PER_ADDRESS}\nauth_threads = 1\nauth_queue = 1\n");
    let svc = Service::start_config(&config(1, &storage, &[("pf0vf0", &blue)]), &[])?;
    allow_tenant(&svc, "blue", "pf0vf0")?;
    svc.dpuctl_json(&[
        "subsystem",
        "create",
        "tls",
        "--nqn",
        NQN,
        "--allow-any-host",
    ])?;
    svc.dpuctl_json(&["namespace", "create", "tls", "--ram", "16M"])?;
    svc.dpuctl_ok(&[
        "subsystem",
        "set-tls-key",
        "tls",
        PERF_HOST,
        "--psk-file",
        &key,
    ])?;
    let listener = |channel: &str| {
        svc.dpuctl_json(&[
            "listener",
            "create",
            "tls",
            "--id",
            "ep",
            "--tenant",
            "blue",
            "--address",
            EP,
            "--port",
            "4420",
            "--secure-channel",
            channel,
        ])
    };
    listener("required")?;
    eventually("the host to ping its endpoint", || blue.ns.ping(EP))?;

    // The host with its key, in both identity versions.
    for version in ["1", "0"] {
        did_io(
            &format!("over TLS, identity version {version}"),
            &tls_io(&blue, &key, version)?,
        )?;
    }
    // A burst of clients at once, with room for one handshake step
    // queued on the pool: each waits its turn, none is refused.
    openssl_icreqs(&blue, 1)?;
    openssl_icreqs(&blue, BURST)?;
    ensure!(tls_metric(&svc, "busy")? == 0, "handshakes refused busy");
    // Many queues of one host, each its own TLS session.
    let out = blue.perf(&[
        "--addr",
        &format!("{EP}:4420"),
        "--nqn",
        NQN,
        "--tls-key",
        &key,
        "--conns",
        &QUEUES.to_string(),
        "--time",
        "1",
        "--job",
        "randread:4k:1",
    ])?;
    let perf_out = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && perf_out.contains(&format!("{QUEUES} I/O queue(s)")),
        "{QUEUES} queues over TLS: {}",
        text(&out)
    );

    // Clear text, and a wrong key: refused, counted, logged once a kind.
    let out = clear_io(&blue, OTHER_HOST)?;
    ensure!(!out.status.success(), "clear text got in: {}", text(&out));
    let out = tls_io(&blue, &wrong, "0")?;
    ensure!(!out.status.success(), "a wrong key got in: {}", text(&out));
    ensure!(tls_metric(&svc, "clear_text")? >= 1);
    ensure!(tls_metric(&svc, "failed")? >= 1);
    let handshakes = metric(
        &svc.http_get("/metrics")?.1,
        "dpu_nvmf_tls_handshakes_total",
    );
    ensure!(handshakes >= 5, "{handshakes} handshakes counted");

    // Stalled hellos from the host's second address: the address holds
    // at most its share, the host's TLS I/O goes on meanwhile, and the
    // handshake timeout frees what was held.
    let mut stall = Command::new("ip")
        .args(["netns", "exec", &blue.ns.name, "python3", "-c", STALL])
        .args([FLOOD_SRC, EP, &FLOOD.to_string(), "14"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let started = Instant::now();
    let mut line = String::new();
    let mut out = stall.stdout.take().context("stdout")?;
    let mut byte = [0u8; 1];
    while !line.ends_with('\n') && out.read(&mut byte)? == 1 {
        line.push(byte[0] as char);
    }
    ensure!(line.starts_with("opened"), "the stalled hellos: {line}");
    did_io("over TLS beside stalled hellos", &tls_io(&blue, &key, "1")?)?;
    eventually("the stalled hellos to time out", || {
        tls_metric(&svc, "timeout").is_ok_and(|n| n >= PER_ADDRESS as u64 / 2)
    })?;
    let timeouts = tls_metric(&svc, "timeout")?;
    let took = started.elapsed();
    ensure!(
        timeouts <= PER_ADDRESS as u64,
        "{timeouts} handshakes held past the address's {PER_ADDRESS}"
    );
    ensure!(
        took >= Duration::from_secs(9),
        "timed out after {took:?}, before the handshake timeout"
    );
    let _ = stall.kill();
    let _ = stall.wait();
    did_io(
        "over TLS after the stalled hellos",
        &tls_io(&blue, &key, "1")?,
    )?;

    let log = svc.log_text();
    ensure!(
        log.contains("clear-text connection on a listener that requires TLS"),
        "{log}"
    );
    ensure!(log.contains("no TLS handshake within"), "{log}");
    ensure!(!log.contains("VRLbtnN9"), "the key is in the log");

    // Allowed: the discovery log says so, a host without a key comes in
    // clear text, the host with one must use TLS.
    svc.dpuctl_json(&["listener", "delete", "tls", "ep"])?;
    listener("allowed")?;
    // A new endpoint, with a new MAC: the host forgets the old one.
    blue.ns.exec(&["ip", "neigh", "flush", "all"])?;
    eventually("the host to ping the new endpoint", || blue.ns.ping(EP))?;
    let out = blue.perf(&["--addr", &format!("{EP}:4420"), "--discover"])?;
    ensure!(out.status.success(), "discovery: {}", text(&out));
    let log = String::from_utf8_lossy(&out.stdout);
    ensure!(
        log.trim() == format!("{EP} 4420 {NQN} tls=allowed"),
        "discovery: {log}"
    );
    did_io("in clear text without a key", &clear_io(&blue, OTHER_HOST)?)?;
    let out = clear_io(&blue, PERF_HOST)?;
    ensure!(
        !out.status.success(),
        "the host with a key got in without TLS: {}",
        text(&out)
    );
    did_io(
        "over TLS where clear text is allowed",
        &tls_io(&blue, &key, "1")?,
    )?;
    Ok(())
}

/// Linux 6.12's initiator over TLS at its tenant's storage endpoint: a
/// kernel-nvme guest on a bridge with one end of a veth pair, the other a
/// switch port of the service (kernel driver), carries Debian 13's
/// `tlshd` and nvme-cli (`tests/kernel-tls-share.sh`), inserts the host's
/// key, is refused in clear text, connects with `--tls` and runs fio with
/// verification. The endpoint's listener requires TLS.
#[test]
fn the_linux_initiator_uses_tls_at_its_tenants_storage_endpoint() -> Result<()> {
    const KNQN: &str = "nqn.2024-01.io.dpu-service.test:ep-ktls";
    const KHOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6b746c73-0000-4000-8000-0000000000e1";
    const KEP: &str = "10.78.1.250";
    let share = crate::nvme_tls::tls_guest_share(KEY)?;
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("key");
    std::fs::write(&key, KEY)?;
    let key = key.to_str().context("a UTF-8 path")?.to_string();

    let wire = crate::endpoint_kernel::Wire::new("t")?;
    let config = format!(
        "[dataplane]\nworkers = 1\nidle = \"backoff\"\nmbufs = 4096\n\n[[ports]]\nid = \"pf0vf0\"\nrole = \"vf\"\ndriver = \"kernel\"\ndevice = \"{}\"\n",
        wire.port
    );
    let svc = Service::start_config(&config, &[])?;
    allow_tenant(&svc, "blue", "pf0vf0")?;
    svc.dpuctl_json(&[
        "subsystem",
        "create",
        "ktls",
        "--nqn",
        KNQN,
        "--host",
        KHOST,
    ])?;
    svc.dpuctl_json(&["namespace", "create", "ktls", "--ram", "32M"])?;
    svc.dpuctl_ok(&[
        "subsystem",
        "set-tls-key",
        "ktls",
        KHOST,
        "--psk-file",
        &key,
        "--v0-derivation",
        "compat",
    ])?;
    svc.dpuctl_json(&[
        "listener",
        "create",
        "ktls",
        "--id",
        "ep",
        "--tenant",
        "blue",
        "--address",
        KEP,
        "--port",
        "4420",
        "--secure-channel",
        "required",
    ])?;
    let guest = format!(
        "set -e\n\
         /mnt/host/setup\n\
         out=$(/mnt/host/run /mnt/host/root/usr/sbin/nvme check-tls-key --keydata=\"$(cat /mnt/host/psk)\" \
             --hostnqn={KHOST} --subsysnqn={KNQN} --identity=1 --insert)\n\
         echo \"$out\"\n\
         serial=$(echo \"$out\" | awk '{{print $NF}}')\n\
         if nvme connect -t tcp -a {KEP} -s 4420 -n {KNQN} --hostnqn {KHOST}; then \
             echo 'UNEXPECTED: clear text connected'; exit 1; fi\n\
         echo 'REFUSED: clear text'\n\
         /mnt/host/run /mnt/host/root/usr/sbin/nvme connect -t tcp -a {KEP} -s 4420 -n {KNQN} \
             --hostnqn {KHOST} --tls --tls_key=$((0x$serial))\n\
         ns=$(nvme-wait-ns {KNQN} 1 30)\n\
         fio --name=v --filename=$ns --direct=1 --ioengine=libaio --rw=randwrite --bs=16k --iodepth=8 \
             --size=16M --verify=crc32c --verify_fatal=1 --eta=never\n\
         echo 'CONNECTED: tls'\n\
         /mnt/host/run /mnt/host/root/usr/sbin/nvme disconnect -n {KNQN}\n"
    );
    crate::nvme_tls::run_tls_guest(
        &svc,
        &share,
        &guest,
        &[
            "--hostnqn",
            KHOST,
            "--bridge",
            &wire.bridged,
            "--guest-ip",
            "10.78.1.5/24",
        ],
    )?;
    let handshakes = metric(
        &svc.http_get("/metrics")?.1,
        "dpu_nvmf_tls_handshakes_total",
    );
    ensure!(handshakes >= 2, "{handshakes} handshakes");
    ensure!(tls_metric(&svc, "clear_text")? >= 1);
    Ok(())
}
