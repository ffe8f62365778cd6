//! A graceful restart of the service (SIGTERM, then the same command
//! again, as a pod's restart or an upgrade does) under the Linux kernel
//! initiator's verified I/O on a file namespace: the initiator, connected
//! with the settings the docs recommend (`--reconnect-delay=1
//! --ctrl-loss-tmo=60`), reconnects by itself, its fio job finishes
//! without an error and reads back what it wrote, and the longest stretch
//! without a completed I/O is measured.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dpu_e2e::guest::Guest;
use dpu_e2e::{free_port, Service};

const NQN: &str = "nqn.2024-01.io.dpu-service:restart";

#[test]
fn the_linux_initiator_rides_through_a_graceful_restart() -> Result<()> {
    let io_port = free_port();
    let work = tempfile::tempdir()?;
    let mut svc = Service::start_config("[log]\nlevel = \"info\"\n", &[])?;
    let port = io_port.to_string();
    let file = svc.state_dir.join("volumes/restart.img");
    let file = file.display().to_string();
    svc.dpuctl_ok(&[
        "subsystem",
        "create",
        "restart",
        "--nqn",
        NQN,
        "--allow-any-host",
    ])?;
    svc.dpuctl_ok(&[
        "namespace",
        "create",
        "restart",
        "--file",
        &file,
        "--size",
        "16MiB",
    ])?;
    svc.dpuctl_ok(&[
        "listener",
        "create",
        "restart",
        "--address",
        "127.0.0.1",
        "--port",
        &port,
    ])?;

    // fio's IOPS log every 100 ms: the gap is the longest time between
    // two windows that completed I/O.
    let script = format!(
        r#"
for i in $(seq 120); do
    nvme discover -t tcp -a $TARGET_ADDR -s {io_port} 2>/dev/null | grep -q {NQN} && break
    sleep 1
done
nvme connect -t tcp -a $TARGET_ADDR -s {io_port} -n {NQN} -i 2 --reconnect-delay=1 --ctrl-loss-tmo=60
ns=$(nvme-wait-ns {NQN})
echo IO-START
fio --name=restart --filename=$ns --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
    --iodepth=8 --size=12M --verify=crc32c --verify_fatal=1 --eta=never \
    --rate_iops=300 --write_iops_log=/tmp/io --log_avg_msec=100 --output=/tmp/fio.out
echo "FIO-RC $?"
cat /tmp/fio.out
awk -F, '$2 > 0 {{ if (last != "" && $1 - last > gap) gap = $1 - last; last = $1 }}
    END {{ print "GAP-MS " gap + 0 }}' /tmp/io_iops.1.log
grep -q "err= 0" /tmp/fio.out && echo FIO-OK
nvme disconnect -n {NQN}
"#
    );
    let mut guest = Guest::start_with(work.path(), "restart", &[io_port], &script, &[])?;
    guest.wait_for("IO-START", Duration::from_secs(600))?;
    std::thread::sleep(Duration::from_secs(3));
    let t = Instant::now();
    let status = svc.restart()?;
    let back = t.elapsed();
    ensure!(status.success(), "the service's exit on SIGTERM: {status}");
    let console = guest.finish(&svc)?;
    let gap: u64 = console
        .lines()
        .find_map(|l| l.trim().strip_prefix("GAP-MS "))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no GAP-MS line:\n{console}"))?;
    eprintln!(
        "graceful restart: the service stopped and listened again within {back:?}; \
         the initiator's longest time without a completed I/O: {gap} ms"
    );
    ensure!(
        console.contains("FIO-OK"),
        "fio through the restart:\n{console}\nservice log:\n{}",
        svc.log_text()
    );
    // Stopped, started, reconnected after a 1 s delay, with room.
    ensure!(gap < 10_000, "{gap} ms without I/O");
    Ok(())
}
