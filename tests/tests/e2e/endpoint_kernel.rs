//! The Linux kernel initiator as a tenant's host, reaching the tenant's
//! storage endpoint through the switch: `../shared/tools/kernel-nvme/run.sh
//! --bridge` puts the guest's second NIC on a bridge with one end of a
//! veth pair whose other end is a switch port of the service (kernel
//! driver). From there the guest runs `nvme discover` and `nvme connect`
//! at the endpoint's address, identifies the controller and namespace,
//! writes and verifies data with fio, and disconnects; then the same over
//! IPv6 at the tenant's IPv6 endpoint, through the tenant's rules for
//! neighbour discovery and storage. Needs root, the harness and its
//! cached kernel; everything made is removed on exit.

use std::process::Command;

use anyhow::{bail, Context, Result};
use dpu_e2e::net::ip;
use dpu_e2e::Service;

const NQN: &str = "nqn.2024-01.io.dpu-service.test:ep-kernel";
const EP: &str = "10.78.0.250";
/// A second subsystem, at the tenant's IPv6 endpoint.
const NQN6: &str = "nqn.2024-01.io.dpu-service.test:ep-kernel-v6";
const EP6: &str = "fd00:78::250";

/// A veth pair: `port` for the service, `bridged` for the guest's bridge.
/// Removed on drop.
pub(crate) struct Wire {
    pub(crate) port: String,
    pub(crate) bridged: String,
}

impl Wire {
    /// A pair named after the process and `tag` (tests running at once
    /// each take their own).
    pub(crate) fn new(tag: &str) -> Result<Wire> {
        let id = std::process::id();
        let w = Wire {
            port: format!("ek{tag}{id}"),
            bridged: format!("ek{tag}{id}g"),
        };
        ip(&[
            "link", "add", &w.port, "type", "veth", "peer", "name", &w.bridged,
        ])?;
        // The service reads frames as they are: no GRO on its side, and
        // the guest's large segments cut at the bridge's side.
        for dev in [&w.port, &w.bridged] {
            let out = Command::new("ethtool")
                .args([
                    "-K", dev, "tx", "off", "tso", "off", "gso", "off", "gro", "off",
                ])
                .output()?;
            if !out.status.success() {
                bail!("ethtool -K: {}", String::from_utf8_lossy(&out.stderr));
            }
            let key = format!("net.ipv6.conf.{dev}.disable_ipv6=1");
            Command::new("sysctl").args(["-qw", &key]).output()?;
            ip(&["link", "set", dev, "up"])?;
        }
        Ok(w)
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.port])
            .output();
    }
}

#[test]
fn the_kernel_initiator_uses_its_tenants_storage_endpoint() -> Result<()> {
    let run = dpu_e2e::tools::kernel_nvme_harness()?;
    let wire = Wire::new("")?;
    let config = format!(
        "[dataplane]\nworkers = 1\nidle = \"backoff\"\nmbufs = 4096\n\n[[ports]]\nid = \"pf0vf0\"\nrole = \"vf\"\ndriver = \"kernel\"\ndevice = \"{}\"\n",
        wire.port
    );
    let svc = Service::start_config(&config, &[])?;
    svc.endpoint_behind_rules("blue", "pf0vf0", EP, "vol", NQN, "64M")?;
    // IPv6: neighbour discovery (ICMPv6) and storage to the IPv6
    // endpoint, both allowed by rules of the default-deny tenant.
    for (id, prio, extra) in [
        ("nd", "20", &["--proto", "icmpv6"][..]),
        (
            "storage-6",
            "11",
            &[
                "--proto",
                "tcp",
                "--dst",
                "fd00:78::250/128",
                "--dport",
                "4420",
                "--stateful",
            ],
        ),
    ] {
        let mut args = vec![
            "rule",
            "add",
            "blue",
            "--id",
            id,
            "--priority",
            prio,
            "--action",
            "allow",
        ];
        args.extend_from_slice(extra);
        svc.dpuctl_json(&args)?;
    }
    svc.dpuctl_json(&[
        "subsystem",
        "create",
        "vol6",
        "--nqn",
        NQN6,
        "--allow-any-host",
    ])?;
    svc.dpuctl_json(&["namespace", "create", "vol6", "--ram", "16M"])?;
    svc.dpuctl_json(&[
        "listener",
        "create",
        "vol6",
        "--id",
        "ep6",
        "--tenant",
        "blue",
        "--address",
        EP6,
        "--port",
        "4420",
    ])?;
    let script = format!(
        r#"
nvme discover -t tcp -a {EP} -s 4420 | tee /tmp/log
grep -q "subnqn: *{NQN}" /tmp/log
# The tenant's two subsystems, each at its endpoint, in its family.
test "$(grep -c '^subnqn' /tmp/log)" = 2
grep -q "adrfam: *ipv6" /tmp/log
grep -q "traddr: *{EP6}" /tmp/log
nvme connect -t tcp -a {EP} -s 4420 -n {NQN}
ns=$(nvme-wait-ns {NQN})
nvme id-ctrl $ns | grep -E '^(mn|subnqn) '
nvme id-ns $ns | grep -E '^nsze '
fio --name=v --filename=$ns --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
    --iodepth=16 --size=32M --verify=crc32c --verify_fatal=1 --eta=never
fio --name=r --filename=$ns --direct=1 --ioengine=libaio --rw=read --bs=128k \
    --iodepth=8 --size=32M --eta=never
nvme disconnect -n {NQN}
# The harness leaves IPv6 off on the bridged NIC.
echo 0 > /proc/sys/net/ipv6/conf/$BRIDGE_DEV/disable_ipv6
echo 0 > /proc/sys/net/ipv6/conf/$BRIDGE_DEV/accept_dad
ip addr add fd00:78::5/64 dev $BRIDGE_DEV
nvme discover -t tcp -a {EP6} -s 4420 | tee /tmp/log6
grep -q "subnqn: *{NQN6}" /tmp/log6
grep -q "traddr: *{EP6}" /tmp/log6
test "$(grep -c '^subnqn' /tmp/log6)" = 2
nvme connect -t tcp -a {EP6} -s 4420 -n {NQN6}
ns6=$(nvme-wait-ns {NQN6})
fio --name=v6 --filename=$ns6 --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
    --iodepth=16 --size=8M --verify=crc32c --verify_fatal=1 --eta=never
nvme disconnect -n {NQN6}
"#
    );
    let out = Command::new(&run)
        .args(["--bridge", &wire.bridged, "--guest-ip", "10.78.0.5/24"])
        .args(["--timeout", "280", "--"])
        .arg(&script)
        .output()
        .context("running kernel-nvme")?;
    let console = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!(
            "guest failed ({}):\n{console}\n--- service log ---\n{}",
            out.status,
            svc.log_text()
        );
    }
    assert!(
        console.contains("err= 0"),
        "fio reported errors:\n{console}"
    );
    assert_eq!(
        console.matches("disconnected 1 controller").count(),
        2,
        "no disconnect over IPv4 and IPv6:\n{console}"
    );
    println!("{console}");
    Ok(())
}
