//! A namespace on a Ceph cluster through the real binary, judged by the
//! real Linux initiator: a single-node cluster (`shared/tools/ceph`), the
//! cluster and an RBD namespace made with dpuctl, fio with crc32c
//! verification from the kernel-nvme guest, the namespace's bytes read
//! back from the cluster with `rbd export` and compared with what the
//! guest reads, and the OSD frozen mid-I/O: fio pauses, never sees an
//! error past its retries, never hangs, and finishes with its data
//! verified once the OSD answers again; meanwhile `dpuctl` and `/metrics`
//! show the namespace out of reach, and serving again after. Then the
//! OSD (bluestore, so its data outlives it) is killed mid-I/O and started
//! again 5 s later: fio again pauses and finishes verified.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dpu_e2e::guest::Guest;
use dpu_e2e::{free_port, Service};
use dpu_rbd::testing::TestCluster;

const NQN: &str = "nqn.2024-01.io.dpu-service.test:rbd";

/// The subsystem's `dpu_nvmf_namespaces_unreachable` gauge.
fn unreachable(svc: &Service) -> Result<u64> {
    let (_, body) = svc.http_get("/metrics")?;
    Ok(dpu_e2e::net::metric(
        &body,
        "dpu_nvmf_namespaces_unreachable{subsystem=\"rbd\"} ",
    ))
}

/// MD5 of `data`, as `md5sum` prints it.
fn md5(data: &[u8]) -> Result<String> {
    use std::io::Write;
    let mut child = std::process::Command::new("md5sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    child.stdin.take().context("stdin")?.write_all(data)?;
    let out = child.wait_with_output()?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

#[test]
fn kernel_initiator_on_an_rbd_namespace_through_an_osd_outage() -> Result<()> {
    let cluster = TestCluster::start(true);
    cluster.rbd(&["create", "rbd/vol", "--size", "16M"]);
    let io_port = free_port();
    let work = tempfile::tempdir()?;
    let svc = Service::start_config("[log]\nlevel = \"info\"\n", &[])?;

    let keyring = cluster.dir().join("keyring").display().to_string();
    svc.dpuctl_ok(&[
        "cluster",
        "create",
        "ceph1",
        "--mon",
        &cluster.mon_host,
        "--user",
        "admin",
        "--keyring-file",
        &keyring,
        "--op-timeout",
        "4",
    ])?;
    let shown = svc.dpuctl_ok(&["cluster", "get", "ceph1"])?;
    assert!(
        !shown.contains(&cluster.admin_key),
        "the key is never shown: {shown}"
    );
    svc.dpuctl_ok(&[
        "subsystem",
        "create",
        "rbd",
        "--nqn",
        NQN,
        "--allow-any-host",
    ])?;
    svc.dpuctl_ok(&[
        "namespace",
        "create",
        "rbd",
        "--rbd",
        "rbd/vol",
        "--cluster",
        "ceph1",
    ])?;
    let port = io_port.to_string();
    svc.dpuctl_ok(&[
        "listener",
        "create",
        "rbd",
        "--address",
        "127.0.0.1",
        "--port",
        &port,
    ])?;

    let script = format!(
        r#"
nvme connect -t tcp -a $TARGET_ADDR -s {io_port} -n {NQN} -i 2
ns=$(nvme-wait-ns {NQN})
nvme id-ns $ns | tee /tmp/idns
grep -q "nsze *: 0x8000" /tmp/idns
fio --name=rbd --filename=$ns --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
    --iodepth=16 --size=100% --verify=crc32c --verify_fatal=1 --eta=never
echo "MD5 $(dd if=$ns bs=1M iflag=direct status=none | md5sum | cut -d' ' -f1)"
echo OUTAGE-PLEASE
fio --name=outage --filename=$ns --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
    --iodepth=8 --size=8M --verify=crc32c --verify_fatal=1 --eta=never \
    --rate_iops=300 --output=/tmp/fio.out
cat /tmp/fio.out
grep -q "err= 0" /tmp/fio.out
echo CRASH-PLEASE
# A killed OSD is back when it has restarted, 7 s on an idle machine and
# over 20 s on a loaded one; each command answers Namespace Not Ready
# after the 4 s operation timeout, and the kernel retries a command 5
# times by default, about 24 s. A host that must ride out such outages
# allows more retries (or queues in dm-multipath).
echo 20 > /sys/module/nvme_core/parameters/max_retries
fio --name=crash --filename=$ns --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
    --iodepth=8 --size=8M --verify=crc32c --verify_fatal=1 --eta=never \
    --rate_iops=300 --output=/tmp/fio2.out
cat /tmp/fio2.out
grep -q "err= 0" /tmp/fio2.out
nvme disconnect -n {NQN}
"#
    );
    let mut guest = Guest::start(work.path(), "rbd", &[io_port], &script)?;
    guest.wait_for("OUTAGE-PLEASE", Duration::from_secs(600))?;

    // What the guest read is what the cluster holds.
    let exported = cluster.rbd(&["export", "rbd/vol", "-"]);
    let theirs = md5(&exported)?;
    let console = guest.console();
    let ours = console
        .lines()
        .find_map(|l| l.trim().strip_prefix("MD5 "))
        .context("the guest's checksum")?;
    assert_eq!(ours.trim(), theirs, "the guest's bytes are the cluster's");

    // Freeze the OSD for 6 s while fio writes: each command waits at most
    // the 4 s operation timeout, answers Namespace Not Ready, and the
    // initiator's retry goes through once the OSD answers again.
    std::thread::sleep(Duration::from_secs(3));
    cluster.freeze_osd();
    let frozen = Instant::now();
    // Past the operation timeout, the outage shows in the API and metrics.
    std::thread::sleep(Duration::from_secs(5));
    let during = svc.dpuctl_ok(&["namespace", "list", "rbd"]);
    let unreachable_gauge = unreachable(&svc);
    std::thread::sleep(Duration::from_secs(6).saturating_sub(frozen.elapsed()));
    cluster.thaw_osd();
    let during = during?;
    assert!(during.contains("unreachable"), "{during}");
    assert_eq!(unreachable_gauge?, 1);
    let resumed = frozen.elapsed();
    assert!(resumed < Duration::from_secs(10));

    // Killed and started again: the same pause, the data intact (fio
    // verifies what it wrote before the crash too).
    guest.wait_for("CRASH-PLEASE", Duration::from_secs(120))?;
    // Logged once per outage, not once per failed command (see
    // `outages`). The freeze is one outage; a loaded machine's OSD may
    // stall past the timeout again while it catches up, a second one.
    let log = svc.log_text();
    let frozen_outages = outages(&log);
    assert!((1..=3).contains(&frozen_outages), "{log}");
    std::thread::sleep(Duration::from_secs(2));
    cluster.kill_osd();
    std::thread::sleep(Duration::from_secs(5));
    cluster.start_osd();
    let console = guest.finish(&svc)?;
    for job in ["outage", "crash"] {
        let ok = format!("{job}: (groupid=0, jobs=1): err= 0");
        assert!(console.contains(&ok), "{console}");
    }
    let log = svc.log_text();
    assert!(
        log.contains("RBD image out of reach"),
        "the outage is logged:\n{log}"
    );
    assert!(log.contains("RBD image reachable again"), "{log}");
    let after = svc.dpuctl_ok(&["namespace", "list", "rbd"])?;
    assert!(after.contains("serving"), "{after}");
    assert_eq!(unreachable(&svc)?, 0);
    // The crash is at least one outage more, each logged once, all over.
    let all = outages(&log);
    assert!(
        all > frozen_outages && all - frozen_outages <= 3,
        "{frozen_outages} then {all} outages:\n{log}"
    );
    assert!(
        log.lines().rev().find_map(outage_event) == Some(false),
        "{log}"
    );
    Ok(())
}

/// Whether a log line says the image went out of reach (`true`) or came
/// back (`false`), if it says either.
fn outage_event(line: &str) -> Option<bool> {
    if line.contains("RBD image out of reach") {
        Some(true)
    } else if line.contains("RBD image reachable again") {
        Some(false)
    } else {
        None
    }
}

/// The outages `log` reports, each logged once: every "out of reach" is
/// followed by "reachable again" before the next, never a line per
/// failed command.
fn outages(log: &str) -> usize {
    let events: Vec<bool> = log.lines().filter_map(outage_event).collect();
    assert!(
        events.iter().step_by(2).all(|e| *e) && events.iter().skip(1).step_by(2).all(|e| !*e),
        "an outage logged more than once:\n{log}"
    );
    events.iter().filter(|e| **e).count()
}
