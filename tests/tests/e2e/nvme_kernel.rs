//! The NVMe/TCP target through the real binary, judged by the real Linux
//! initiator: `../shared/tools/kernel-nvme/run.sh` boots a small Linux
//! guest whose kernel NVMe/TCP driver, nvme-cli and fio reach the service on
//! this host's loopback. Storage objects are made with dpuctl; the guest
//! discovers (on the I/O port and on the discovery port), connects with and
//! without digests and with several I/O queues, runs fio with crc32c
//! verification over a whole namespace and a verify-only pass (and 128 KiB
//! reads) after reconnecting with digests, sees a namespace added at run
//! time, is refused by a subsystem that does not allow it, and finds
//! file-backed data intact after a restart of the service. A second guest
//! sees, while fio writes and verifies one namespace, that namespace grown
//! and another one it holds open deleted over gRPC, then a shrink refuse
//! writes past the new end.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use dpu_e2e::guest::Guest;
use dpu_e2e::{free_port, Service};

const NQN_OPEN: &str = "nqn.2024-01.io.dpu-service.test:open";
const NQN_LOCKED: &str = "nqn.2024-01.io.dpu-service.test:locked";
const NQN_DISK: &str = "nqn.2024-01.io.dpu-service.test:disk";
const NQN_LIVE: &str = "nqn.2024-01.io.dpu-service.test:live";

fn ok(svc: &Service, args: &[&str]) -> Result<()> {
    let out = svc.dpuctl(args)?;
    if !out.status.success() {
        bail!("dpuctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The value of the metric sample `name{subsystem="id"}`.
fn subsystem_metric(svc: &Service, name: &str, id: &str) -> Result<u64> {
    let (_, body) = svc.http_get("/metrics")?;
    let prefix = format!("{name}{{subsystem=\"{id}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .with_context(|| format!("no {prefix} in /metrics"))?
        .trim()
        .parse()
        .context("metric value")
}

#[test]
fn kernel_initiator_end_to_end() -> Result<()> {
    let io_port = free_port();
    let disc_port = free_port();
    let work = tempfile::tempdir()?;
    let disk = work.path().join("disk.img");
    let config = format!(
        r#"
[log]
level = "info"

[storage]
ram_limit = "512MiB"
discovery_listen = "127.0.0.1:{disc_port}"
file_dirs = ["{work}"]
"#,
        work = work.path().display()
    );
    let mut svc = Service::start_config(&config, &[])?;
    let port = io_port.to_string();
    let listen = ["--address", "127.0.0.1", "--port", &port];

    ok(
        &svc,
        &[
            "subsystem",
            "create",
            "open",
            "--nqn",
            NQN_OPEN,
            "--allow-any-host",
        ],
    )?;
    ok(&svc, &["namespace", "create", "open", "--ram", "32M"])?;
    ok(
        &svc,
        &[&["listener", "create", "open"][..], &listen].concat(),
    )?;
    ok(
        &svc,
        &["subsystem", "create", "locked", "--nqn", NQN_LOCKED],
    )?;
    ok(
        &svc,
        &[
            "subsystem",
            "add-host",
            "locked",
            "nqn.2014-08.org.nvmexpress:uuid:someone-else",
        ],
    )?;
    ok(&svc, &["namespace", "create", "locked", "--ram", "8M"])?;
    ok(
        &svc,
        &[&["listener", "create", "locked"][..], &listen].concat(),
    )?;
    ok(
        &svc,
        &[
            "subsystem",
            "create",
            "disk",
            "--nqn",
            NQN_DISK,
            "--allow-any-host",
        ],
    )?;
    let disk_s = disk.display().to_string();
    ok(
        &svc,
        &[
            "namespace",
            "create",
            "disk",
            "--file",
            &disk_s,
            "--size",
            "16M",
        ],
    )?;
    ok(
        &svc,
        &[&["listener", "create", "disk"][..], &listen].concat(),
    )?;

    let fio = |name: &str, size: &str, extra: &str| {
        format!(
            "fio --name={name} --filename=$ns --direct=1 --ioengine=libaio --rw=randwrite \
             --bs=4k --iodepth=16 --size={size} --verify=crc32c --verify_fatal=1 \
             --eta=never {extra}"
        )
    };
    let script = format!(
        r#"
P={io_port}; D={disc_port}
nvme discover -t tcp -a $TARGET_ADDR -s $P | tee /tmp/disc
grep -q "subnqn: *{NQN_OPEN}" /tmp/disc
grep -q "subnqn: *{NQN_DISK}" /tmp/disc
! grep -q "{NQN_LOCKED}" /tmp/disc
nvme discover -t tcp -a $TARGET_ADDR -s $D | grep -q "subnqn: *{NQN_OPEN}"

nvme connect -t tcp -a $TARGET_ADDR -s $P -n {NQN_OPEN} -i 2
ns=$(nvme-wait-ns {NQN_OPEN})
nvme list
ctrl=${{ns%n1}}
nvme id-ctrl $ctrl | tee /tmp/idctrl
grep -q "subnqn *: {NQN_OPEN}" /tmp/idctrl
nvme id-ns $ns | tee /tmp/idns
grep -q "nsze *: 0x10000" /tmp/idns
nvme list-subsys | tee /tmp/subsys
grep -q "{NQN_OPEN}" /tmp/subsys
{fio_full}
nvme smart-log $ctrl
nvme error-log $ctrl -e 4
echo NS2-PLEASE
ns2=$(nvme-wait-ns {NQN_OPEN} 2 120)
test -b $ns2
nvme disconnect -n {NQN_OPEN}

nvme connect -t tcp -a $TARGET_ADDR -s $P -n {NQN_OPEN} -i 2 --hdr-digest --data-digest
ns=$(nvme-wait-ns {NQN_OPEN})
{fio_verify}
dd if=$ns of=/dev/null bs=128k count=64 iflag=direct
dd if=/dev/zero of=$ns bs=64k count=16 oflag=direct
blkdiscard $ns
nvme flush $ns -n 1
nvme disconnect -n {NQN_OPEN}

if nvme connect -t tcp -a $TARGET_ADDR -s $P -n {NQN_LOCKED}; then echo "locked subsystem let us in"; exit 1; fi

nvme connect -t tcp -a $TARGET_ADDR -s $P -n {NQN_DISK}
ns=$(nvme-wait-ns {NQN_DISK})
{fio_disk}
nvme disconnect -n {NQN_DISK}
"#,
        fio_full = fio("full", "100%", ""),
        fio_verify = fio("full", "100%", "--verify_only"),
        fio_disk = fio("disk", "100%", "--do_verify=0"),
    );
    let mut guest = Guest::start(work.path(), "first", &[io_port, disc_port], &script)?;
    guest.wait_for("NS2-PLEASE", Duration::from_secs(600))?;
    ok(
        &svc,
        &["namespace", "create", "open", "--nsid", "2", "--ram", "4M"],
    )?;
    let console = guest.finish(&svc)?;
    assert!(console.contains("nvme nvme0: new ctrl"), "{console}");

    assert!(subsystem_metric(&svc, "dpu_nvmf_write_bytes_total", "open")? >= 32 << 20);
    assert!(subsystem_metric(&svc, "dpu_nvmf_read_bytes_total", "open")? >= 32 << 20);
    assert!(subsystem_metric(&svc, "dpu_nvmf_write_bytes_total", "disk")? >= 16 << 20);

    // The file-backed namespace keeps its data across a restart.
    svc.restart()?;
    let script = format!(
        r#"
nvme connect -t tcp -a $TARGET_ADDR -s {io_port} -n {NQN_DISK}
ns=$(nvme-wait-ns {NQN_DISK})
{}
nvme disconnect -n {NQN_DISK}
"#,
        fio("disk", "100%", "--verify_only")
    );
    let guest = Guest::start(work.path(), "second", &[io_port], &script)?;
    guest.finish(&svc)?;
    Ok(())
}

/// Resize and delete at run time under I/O: fio writes (then verifies) the
/// first 8 MiB of namespace 1 while the host grows it from 16 to 32 MiB and
/// deletes namespace 2, which the guest holds open and reads in a loop.
/// The guest learns both through the asynchronous event and its rescan
/// (the new size in sysfs and Identify, the block device gone), fio ends
/// without errors, the grown range takes verified writes, and after a
/// shrink a write past the new end gets LBA Out of Range.
#[test]
fn kernel_initiator_sees_resize_and_delete_under_io() -> Result<()> {
    let io_port = free_port();
    let work = tempfile::tempdir()?;
    let config = "[log]\nlevel = \"info\"\n\n[storage]\nram_limit = \"256MiB\"\n";
    let svc = Service::start_config(config, &[])?;
    let port = io_port.to_string();
    ok(
        &svc,
        &[
            "subsystem",
            "create",
            "live",
            "--nqn",
            NQN_LIVE,
            "--allow-any-host",
        ],
    )?;
    ok(&svc, &["namespace", "create", "live", "--ram", "16M"])?;
    ok(
        &svc,
        &["namespace", "create", "live", "--nsid", "2", "--ram", "8M"],
    )?;
    ok(
        &svc,
        &[
            "listener",
            "create",
            "live",
            "--address",
            "127.0.0.1",
            "--port",
            &port,
        ],
    )?;

    // fio's writes are held to 500 a second, so that they last 4 s or
    // more whatever the machine: the changes land while it runs.
    let script = format!(
        r#"
nvme connect -t tcp -a $TARGET_ADDR -s {io_port} -n {NQN_LIVE} -i 2
ns1=$(nvme-wait-ns {NQN_LIVE} 1); ns2=$(nvme-wait-ns {NQN_LIVE} 2)
b1=${{ns1#/dev/}}; b2=${{ns2#/dev/}}
test "$(cat /sys/block/$b1/size)" = 32768
exec 3<$ns2
(while dd if=$ns2 of=/dev/null bs=64k count=4 iflag=direct 2>/dev/null; do :; done) &
reader=$!
fio --name=live --filename=$ns1 --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
    --iodepth=16 --size=8M --rate_iops=500 --verify=crc32c --verify_fatal=1 --eta=never \
    --output=/tmp/fio.out &
fio=$!
sleep 1
echo CHANGE-PLEASE
for i in $(seq 300); do
  if test "$(cat /sys/block/$b1/size)" = 65536 && ! test -e /sys/block/$b2; then break; fi
  sleep 0.1
done
if kill -0 $fio; then echo "FIO-RUNNING-AT-CHANGE"; fi
test "$(cat /sys/block/$b1/size)" = 65536
! test -e /sys/block/$b2
! test -b $ns2
wait $reader
exec 3<&-
wait $fio
cat /tmp/fio.out
grep -q "err= 0" /tmp/fio.out
nvme id-ns $ns1 | tee /tmp/idns
grep -q "nsze *: 0x10000" /tmp/idns
nvme list-ns $ns1 | tee /tmp/listns
! grep -q ":0x2" /tmp/listns
fio --name=grown --filename=$ns1 --direct=1 --ioengine=libaio --rw=randwrite --bs=64k \
    --iodepth=8 --offset=16M --size=16M --verify=crc32c --verify_fatal=1 --eta=never
echo SHRINK-PLEASE
for i in $(seq 300); do
  if test "$(cat /sys/block/$b1/size)" = 16384; then break; fi
  sleep 0.1
done
test "$(cat /sys/block/$b1/size)" = 16384
if nvme write $ns1 --start-block=20000 --block-count=0 --data-size=512 --data=/dev/zero \
    > /tmp/write.out 2>&1; then cat /tmp/write.out; echo "a write past the end succeeded"; exit 1; fi
cat /tmp/write.out
grep -qi "lba.*range" /tmp/write.out
nvme disconnect -n {NQN_LIVE}
"#
    );
    let mut guest = Guest::start(work.path(), "live", &[io_port], &script)?;
    guest.wait_for("CHANGE-PLEASE", Duration::from_secs(300))?;
    ok(&svc, &["namespace", "resize", "live", "1", "32M"])?;
    ok(&svc, &["namespace", "delete", "live", "2"])?;
    guest.wait_for("SHRINK-PLEASE", Duration::from_secs(300))?;
    ok(&svc, &["namespace", "resize", "live", "1", "8M"])?;
    let console = guest.finish(&svc)?;
    assert!(
        console.lines().any(|l| l.trim() == "FIO-RUNNING-AT-CHANGE"),
        "fio had ended before the changes were seen:\n{console}"
    );

    // The service is healthy: it answers, lists what is left, and nothing
    // panicked or failed as a media error.
    let list = svc.dpuctl(&["namespace", "list", "live"])?;
    assert!(list.status.success());
    let text = String::from_utf8_lossy(&list.stdout);
    assert_eq!(
        text.lines().filter(|l| l.contains("ram")).count(),
        1,
        "{text}"
    );
    let log = svc.log_text();
    assert!(!log.contains("panicked"), "{log}");
    assert!(!log.contains("block I/O failed"), "{log}");
    assert!(subsystem_metric(&svc, "dpu_nvmf_write_bytes_total", "live")? >= 24 << 20);
    Ok(())
}
