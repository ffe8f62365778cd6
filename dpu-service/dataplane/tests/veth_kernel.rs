//! Kernel traffic through the kernel driver (packet sockets, no DPDK): two
//! network namespaces, each joined by a veth pair to a port of the
//! driver; workers wire the two ports together, and ping must cross them
//! both ways with one queue and with two queues per port (a fanout
//! group), and a VLAN-tagged frame must arrive with its tag. Needs root (it creates namespaces);
//! everything it creates is removed on exit.

mod host;

use std::process::{Command, Stdio};
use std::time::Duration;

use dpu_dataplane::io::kernel::KernelDriver;
use dpu_dataplane::io::Driver;
use dpu_dataplane::worker::{CrossConnect, Idle, WorkerConfig, Workers};
use host::Host;

fn workers(driver: &KernelDriver, queues: u16) -> Workers {
    let configs = (0..queues)
        .map(|q| WorkerConfig {
            rx: (0..driver.port_count()).map(|p| (p, q)).collect(),
            tx_queue: q,
            cpu: None,
            idle: Idle::Backoff {
                spins: 1000,
                max: Duration::from_micros(200),
            },
        })
        .collect();
    Workers::start(driver, configs, |_| CrossConnect::new(&[(0, 1), (1, 0)]))
        .expect("workers start")
}

/// Python run in a namespace: `send` sends one frame tagged with VLAN 100
/// out of the namespace's veth end; `recv` waits up to 5 s for it and
/// prints the tag it arrived with ("vlan N", or "untagged").
const RAW_FRAME: &str = r#"
import socket, struct, sys
mode, ifname = sys.argv[1], sys.argv[2]
ETH_P_ALL, SOL_PACKET, PACKET_AUXDATA = 3, 263, 8
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
s.bind((ifname, 0))
payload = b"dpu-vlan-check"
if mode == "send":
    frame = b"\xff" * 6 + b"\x02\x00\x00\x00\x00\x0a" + struct.pack("!HHH", 0x8100, 100, 0x88B5) + payload
    s.send(frame.ljust(60, b"\x00"))
    sys.exit(0)
s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
s.settimeout(5)
print("ready", flush=True)
while True:
    data, anc, _, _ = s.recvmsg(2048, 256)
    if payload not in data:
        continue
    tag = "untagged"
    for level, kind, blob in anc:
        if level == SOL_PACKET and kind == PACKET_AUXDATA:
            status, _, _, _, _, tci, _ = struct.unpack("IIIHHHH", blob[:20])
            if status & 0x10:
                tag = "vlan %d" % (tci & 0xFFF)
    if data[12:14] == b"\x81\x00":
        tag = "vlan %d" % (struct.unpack("!H", data[14:16])[0] & 0xFFF)
    print(tag, flush=True)
    break
"#;

fn raw_frame(h: &Host, mode: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &h.ns, "python3", "-c", RAW_FRAME, mode])
        .arg(format!("{}p", h.host_if));
    c
}

/// Sends a VLAN 100 frame from `a` and says how it reached `b`.
fn tagged_frame_crosses(a: &Host, b: &Host) -> String {
    use std::io::{BufRead, BufReader};
    let mut rx = raw_frame(b, "recv")
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 in the namespace");
    let mut lines = BufReader::new(rx.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
    let sent = raw_frame(a, "send")
        .status()
        .expect("python3 in the namespace");
    assert!(sent.success());
    let got = lines.next().and_then(Result::ok).unwrap_or_default();
    let _ = rx.wait();
    got
}

fn crossing(tag: &str, subnet: u8, queues: u16) {
    let a = Host::new(&format!("{tag}a"), &format!("10.{subnet}.0.1/24"));
    let b = Host::new(&format!("{tag}b"), &format!("10.{subnet}.0.2/24"));
    let driver = KernelDriver::open(&[a.host_if.clone(), b.host_if.clone()], queues, 4096)
        .expect("kernel driver");
    let mut w = workers(&driver, queues);

    assert!(a.ping(&format!("10.{subnet}.0.2")), "a cannot ping b");
    assert!(b.ping(&format!("10.{subnet}.0.1")), "b cannot ping a");
    // The receiving kernel strips a tag into metadata before packet
    // sockets see the frame; the driver must put it back on the wire.
    assert_eq!(tagged_frame_crosses(&a, &b), "vlan 100", "tag lost");
    let link = driver.link(0).expect("link of port 0");
    assert!(link.up && link.mtu == 1500, "{link:?}");
    w.stop();
    let t = w.totals();
    // At least what the exchanges above must send: from a, the ARP
    // request, 3 echo requests, 3 echo replies and the tagged frame; from
    // b, the ARP reply and 3 replies and 3 requests (b learned a's address
    // from its ARP request). IPv6 autoconfiguration may add more.
    assert!(t.rx_packets[0] >= 8 && t.rx_packets[1] >= 7, "{t:?}");
    // Nothing the driver sent came back to it: what crossed equals what
    // the workers received on the other side.
    let (s0, s1) = (driver.stats(0), driver.stats(1));
    assert_eq!(s0.rx_packets, t.rx_packets[0], "{s0:?}");
    assert_eq!(s1.tx_packets, t.tx_packets[1], "{s1:?}");
    assert_eq!(
        s0.rx_errors + s1.rx_errors + s0.tx_errors + s1.tx_errors,
        0,
        "port 0 {s0:?}, port 1 {s1:?}"
    );

    // Stopped workers forward nothing.
    assert!(
        !a.ping(&format!("10.{subnet}.0.2")),
        "traffic crossed with the workers stopped"
    );
    drop(w);
    assert_eq!(
        driver.free_buffers(),
        driver.buffers(),
        "every buffer went back to the pool"
    );
}

#[test]
fn ping_crosses_the_kernel_driver_untagged_and_on_a_vlan() {
    crossing("k", 202, 1);
}

#[test]
fn two_queues_per_port_share_the_traffic_through_a_fanout_group() {
    crossing("f", 203, 2);
}
