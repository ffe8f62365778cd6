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
grep -q "nsze *: 0x8000" /tmp/idns
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
sleep 5
"#
    );
    let kernel = kernel_port.to_string();
    let mut guest = Guest::start_with(
        work.path(),
        "remote",
        &[io_port],
        &script,
        &["--kernel-target", &kernel, "--ns-size", "16"],
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

/// `nvmf-perf` against the subsystem `nqn` on `port`: `conns` connections
/// of one queue each, the job `job` for `secs`; its IOPS, failing on any
/// failed command.
fn perf(port: u16, nqn: &str, conns: usize, job: &str, secs: &str) -> Result<f64> {
    let conns = conns.to_string();
    dpu_e2e::nvmf_perf_iops(
        port,
        nqn,
        &["--conns", &conns, "--time", secs, "--job", job],
    )
}

/// A peer on a loopback port that accepts connections and, for each,
/// sends `junk` (nothing if empty) and then holds it open without
/// reading, as a remote target that hangs or speaks garbage would.
fn hostile_remote(junk: &'static [u8]) -> Result<u16> {
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut s in l.incoming().flatten() {
            let _ = s.write_all(junk);
            held.push(s);
        }
    });
    Ok(port)
}

/// Hundreds of hosts on one remote namespace: 300 connections of
/// `nvmf-perf`, each with a command in flight, all through one initiator
/// of queue depth 32 to a RAM namespace of the same daemon. Every command
/// completes (the rest wait in their connections), and the daemon's
/// memory stays bounded. Remotes that hang or answer garbage are refused
/// at creation within their connect timeout, naming their address, while
/// the served namespace keeps serving.
#[test]
fn hundreds_of_hosts_share_a_remote_namespace_and_hostile_remotes_are_refused() -> Result<()> {
    const BACK: &str = "nqn.2024-01.io.dpu-service.test:remote-back";
    let svc = Service::start_config("[log]\nlevel = \"info\"\n", &[])?;
    let (back, front) = (free_port(), free_port());
    svc.local_subsystem("back", BACK, &[], "64M", back)?;
    svc.dpuctl_ok(&[
        "subsystem",
        "create",
        "remote",
        "--nqn",
        NQN,
        "--allow-any-host",
    ])?;
    let back_addr = format!("127.0.0.1:{back}");
    svc.dpuctl_ok(&[
        "namespace",
        "create",
        "remote",
        "--remote",
        &back_addr,
        "--remote-nqn",
        BACK,
        "--remote-nsid",
        "1",
        "--queue-depth",
        "32",
    ])?;
    let port = front.to_string();
    svc.dpuctl_ok(&[
        "listener",
        "create",
        "remote",
        "--address",
        "127.0.0.1",
        "--port",
        &port,
    ])?;

    let pid = anyhow::Context::context(svc.pid(), "the service has exited")?;
    let (_, rss0) = dpu_e2e::rss_kib(pid)?;
    let iops = perf(front, NQN, 300, "randwrite:4k:1", "3")?;
    assert!(iops > 0.0);
    let (_, rss1) = dpu_e2e::rss_kib(pid)?;
    eprintln!("remote scale: 300 connections, {iops:.0} IOPS, RSS {rss0} -> {rss1} KiB");
    assert!(
        rss1.saturating_sub(rss0) < 256 << 10,
        "RSS grew from {rss0} to {rss1} KiB"
    );

    for (what, junk) in [("hangs", &b""[..]), ("garbage", &[0xffu8; 4096][..])] {
        let bad = hostile_remote(junk)?;
        let addr = format!("127.0.0.1:{bad}");
        let t = Instant::now();
        let out = svc.dpuctl(&[
            "namespace",
            "create",
            "remote",
            "--remote",
            &addr,
            "--remote-nqn",
            "nqn.2024-01.io.dpu-service.test:nowhere",
            "--remote-nsid",
            "1",
            "--connect-timeout-ms",
            "1000",
        ])?;
        let took = t.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a remote that {what} was taken");
        assert!(err.contains(&addr), "{what}: {err}");
        assert!(took < Duration::from_secs(10), "{what}: {took:?}");
        // The namespace served meanwhile still serves.
        assert!(perf(front, NQN, 1, "randread:4k:4", "0.5")? > 0.0);
    }
    let listed = svc.dpuctl_ok(&["namespace", "list", "remote"])?;
    assert_eq!(listed.matches("remote 127.0.0.1").count(), 1, "{listed}");
    Ok(())
}
