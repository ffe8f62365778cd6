//! A namespace of another NVMe/TCP target through the real binary,
//! judged by the real Linux initiator, on a target we did not write: the
//! kernel-nvme guest runs the Linux kernel's nvmet-tcp target (a brd
//! namespace, `--kernel-target`) and, as a host, the kernel's initiator.
//! The service serves that namespace as one of its own subsystem's,
//! through its initiator; the guest runs fio with crc32c verification
//! through the service, then reads the namespace through the service and
//! the brd device under the kernel target directly: the same bytes. Then
//! the kernel target is stopped mid-I/O (its port unlinked, which drops
//! the service's connection and refuses new ones) and restarted 6 s later:
//! fio pauses, sees no error and finishes verified; meanwhile `dpuctl`
//! and `/metrics` show the namespace out of reach, the log says so once,
//! and serving again after. Last, with the remote stopped again, deleting
//! the namespace returns at once.

use std::time::{Duration, Instant};

use anyhow::Result;
use dpu_e2e::guest::Guest;
use dpu_e2e::{free_port, Service};

const NQN: &str = "nqn.2024-01.io.dpu-service.test:remote";
/// The kernel target's subsystem (`shared/tools/kernel-nvme`).
const KERNEL_NQN: &str = "nqn.2024-01.test.kernel-nvme:target";

/// The subsystem's `dpu_nvmf_namespaces_unreachable` gauge.
fn unreachable(svc: &Service) -> Result<u64> {
    let (_, body) = svc.http_get("/metrics")?;
    Ok(dpu_e2e::net::metric(
        &body,
        "dpu_nvmf_namespaces_unreachable{subsystem=\"remote\"} ",
    ))
}

#[test]
fn kernel_initiator_on_a_namespace_of_the_kernel_target_through_its_restart() -> Result<()> {
    let io_port = free_port();
    let kernel_port = free_port();
    let work = tempfile::tempdir()?;
    let svc = Service::start_config("[log]\nlevel = \"info\"\n", &[])?;
    svc.dpuctl_ok(&[
        "subsystem",
        "create",
        "remote",
        "--nqn",
        NQN,
        "--allow-any-host",
    ])?;

    let script = format!(
        r#"
p=/sys/kernel/config/nvmet/ports/1
s=/sys/kernel/config/nvmet/subsystems/$KERNEL_TARGET_NQN
echo REMOTE-UP
for i in $(seq 120); do
    nvme discover -t tcp -a $TARGET_ADDR -s {io_port} 2>/dev/null | grep -q {NQN} && break
    sleep 1
done
nvme connect -t tcp -a $TARGET_ADDR -s {io_port} -n {NQN} -i 2
ns=$(nvme-wait-ns {NQN})
nvme id-ns $ns | tee /tmp/idns
grep -q "nsze *: 0x10000" /tmp/idns
fio --name=remote --filename=$ns --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
    --iodepth=16 --size=100% --verify=crc32c --verify_fatal=1 --eta=never
ours=$(dd if=$ns bs=1M iflag=direct status=none | md5sum | cut -d' ' -f1)
theirs=$(dd if=/dev/ram0 bs=1M status=none | md5sum | cut -d' ' -f1)
echo "OURS $ours THEIRS $theirs"
[ "$ours" = "$theirs" ]
( sleep 3; rm $p/subsystems/$KERNEL_TARGET_NQN; echo REMOTE-STOPPED
  sleep 6; ln -s $s $p/subsystems/$KERNEL_TARGET_NQN; echo REMOTE-BACK ) &
fio --name=outage --filename=$ns --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
    --iodepth=8 --size=8M --verify=crc32c --verify_fatal=1 --eta=never \
    --rate_iops=300 --output=/tmp/fio.out
wait
cat /tmp/fio.out
grep -q "err= 0" /tmp/fio.out
nvme disconnect -n {NQN}
rm $p/subsystems/$KERNEL_TARGET_NQN
echo STOPPED-AGAIN
sleep 20
"#
    );
    let kernel = kernel_port.to_string();
    let mut guest = Guest::start_with(
        work.path(),
        "remote",
        &[io_port],
        &script,
        &["--kernel-target", &kernel, "--ns-size", "32"],
    )?;
    guest.wait_for("REMOTE-UP", Duration::from_secs(600))?;

    let remote = format!("127.0.0.1:{kernel_port}");
    svc.dpuctl_ok(&[
        "namespace",
        "create",
        "remote",
        "--remote",
        &remote,
        "--remote-nqn",
        KERNEL_NQN,
        "--remote-nsid",
        "1",
    ])?;
    let listed = svc.dpuctl_ok(&["namespace", "list", "remote"])?;
    assert!(
        listed.contains("serving") && listed.contains(&format!("remote {remote}")),
        "{listed}"
    );
    let port = io_port.to_string();
    svc.dpuctl_ok(&[
        "listener",
        "create",
        "remote",
        "--address",
        "127.0.0.1",
        "--port",
        &port,
    ])?;

    // Past the connection's loss, the outage shows in the API and metrics.
    guest.wait_for("REMOTE-STOPPED", Duration::from_secs(600))?;
    let stopped = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let during = svc.dpuctl_ok(&["namespace", "list", "remote"])?;
    assert!(during.contains("unreachable"), "{during}");
    assert_eq!(unreachable(&svc)?, 1);
    guest
        .wait_for("REMOTE-BACK", Duration::from_secs(60))
        .map_err(|e| e.context(format!("service log:\n{}", svc.log_text())))?;
    assert!(stopped.elapsed() < Duration::from_secs(10));
    let back = Instant::now();
    loop {
        let listed = svc.dpuctl_ok(&["namespace", "list", "remote"])?;
        if listed.contains("serving") {
            break;
        }
        assert!(back.elapsed() < Duration::from_secs(15), "{listed}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(unreachable(&svc)?, 0);
    let log = svc.log_text();
    assert_eq!(
        log.matches("remote namespace out of reach").count(),
        1,
        "the outage is logged once:\n{log}"
    );
    assert!(log.contains("remote namespace reachable again"), "{log}");

    // Stopped again for good: deleting the namespace returns at once.
    guest.wait_for("STOPPED-AGAIN", Duration::from_secs(120))?;
    let t = Instant::now();
    svc.dpuctl_ok(&["namespace", "delete", "remote", "1"])?;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

    let console = guest.finish(&svc)?;
    assert!(console.contains("err= 0"), "{console}");
    Ok(())
}
