//! Where the kernel TCP transport runs its poll groups and which group
//! serves which queue: hosts connect over loopback TCP, and the kernel's
//! view of each thread (`/proc/self/task/*/status`) shows each I/O poll
//! group pinned to its I/O CPU, and the admin group and listeners kept off
//! the I/O CPUs (and CPUs held by other work).
//!
//! One test in this binary: it finds threads by name, and two transports
//! alive at once would both have an `nvmf-pg0`.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use dpu_nvmeof::pdu::{self, ControllerPdu, Digests, Limits};
use dpu_nvmeof::{host, BackendSpec, NamespaceConfig, SubsystemConfig, Target, TargetConfig};
use dpu_nvmeof::{TcpConfig, TcpTransport};

const NQN: &str = "nqn.2024-01.io.example:placement";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0000-placement";

/// A transport serving one RAM namespace on a loopback port of its own.
fn serve(
    io_cpus: &[usize],
    avoid_cpus: &[usize],
    poll_groups: usize,
) -> (TcpTransport, SocketAddr) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let target = Target::new();
    let cfg = TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            serial: "SN1".into(),
            model: "test".into(),
            allow_any_host: true,
            allowed_hosts: BTreeSet::new(),
            max_namespaces: 32,
            namespaces: vec![NamespaceConfig {
                eui64: None,
                nsid: 1,
                block_size: 512,
                uuid: [1; 16],
                nguid: [2; 16],
                backend: BackendSpec::Ram { size: 1 << 20 },
                qos: Default::default(),
            }],
            listeners: vec![any],
            host_qos: Default::default(),
        }],
        discovery: None,
    };
    let transport = TcpTransport::with_config(
        target.clone(),
        &TcpConfig {
            io_cpus: io_cpus.to_vec(),
            avoid_cpus: avoid_cpus.to_vec(),
            poll_groups,
            ..TcpConfig::default()
        },
    )
    .unwrap();
    let failed = transport.set_listeners(&cfg.listen_addrs());
    assert!(failed.is_empty(), "{failed:?}");
    let bound = transport.bound()[&any];
    // The subsystem is exported on the port the kernel chose.
    let mut cfg = cfg;
    cfg.subsystems[0].listeners = vec![bound];
    assert!(target.apply(&cfg).is_empty());
    (transport, bound)
}

/// Waits for one whole controller PDU and returns a capsule response's
/// status and DW0 (ICResp: 0, 0).
fn reply(s: &mut TcpStream, buf: &mut Vec<u8>) -> (u16, u32) {
    let limits = Limits {
        digests: Digests::default(),
        max_data: 1 << 20,
    };
    loop {
        if let Some((p, n)) = pdu::decode_controller(buf, &limits).unwrap() {
            let out = match p {
                ControllerPdu::IcResp(_) => (0, 0),
                ControllerPdu::CapsuleResp { cqe } => (cqe.status, cqe.dw0),
                other => panic!("unexpected PDU {other:?}"),
            };
            buf.drain(..n);
            return out;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "the target closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Opens queue `qid` of controller `cntlid` (0xFFFF: a new admin queue)
/// and, for an admin queue, enables its controller. Returns the socket
/// and the controller ID, once the target has answered every command.
fn queue(addr: SocketAddr, qid: u16, cntlid: u16) -> (TcpStream, u16) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = Vec::new();
    host::ic_req(&mut b, Digests::default());
    let data = host::connect_data([7; 16], cntlid, NQN, HOST);
    pdu::encode_capsule_cmd(
        &mut b,
        Digests::default(),
        &host::connect(1, qid, 32, 0),
        &data,
    );
    if qid == 0 {
        pdu::encode_capsule_cmd(&mut b, Digests::default(), &host::enable(2), &[]);
    }
    s.write_all(&b).unwrap();
    let mut buf = Vec::new();
    assert_eq!(reply(&mut s, &mut buf), (0, 0), "ICResp");
    let (status, dw0) = reply(&mut s, &mut buf);
    assert_eq!(status, 0, "Connect of queue {qid}");
    if qid == 0 {
        assert_eq!(reply(&mut s, &mut buf).0, 0, "Property Set CC.EN");
    }
    (s, dw0 as u16)
}

/// The CPUs each thread of this process named `name` may run on.
fn cpus_of(name: &str) -> Vec<Vec<usize>> {
    dpu_os::affinity::thread_cpus_by_name(name).expect("thread CPU lists")
}

/// The one thread named `name`'s CPUs. Every group's thread is named
/// and placed before the transport's start returns.
fn cpus_of_one(name: &str) -> Vec<usize> {
    let mut all = cpus_of(name);
    assert_eq!(all.len(), 1, "one thread named {name}: {all:?}");
    all.remove(0)
}

/// Stops `transport` and waits until the kernel has let go of its
/// threads (a joined thread's /proc entry can outlive the join by a little).
fn stop(transport: TcpTransport) {
    transport.shutdown();
    let start = std::time::Instant::now();
    while ["nvmf-admin", "nvmf-pg0", "nvmf-pg1", "nvmf-pg2"]
        .iter()
        .any(|n| !cpus_of(n).is_empty())
    {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "queue threads outlive shutdown"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until the I/O groups serve `want` queues each (a connection
/// moves to its group just after its Connect's answer).
fn loads(transport: &TcpTransport, want: &[usize]) {
    let start = std::time::Instant::now();
    while transport.poll_group_loads() != want {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "poll group loads {:?}, not {want:?}",
            transport.poll_group_loads()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn io_groups_pin_to_their_cpu_take_queues_in_turn_and_the_admin_group_stays_off_them() {
    let allowed = dpu_os::affinity::current_thread_cpus().unwrap();
    if allowed.len() < 2 {
        eprintln!("skipped: one CPU ({allowed:?}), nothing to place groups on");
        return;
    }
    let (first, last) = (allowed[0], allowed[allowed.len() - 1]);
    // The kernel keeps 15 bytes of a thread's name.
    let listener = |addr: SocketAddr| {
        let l = format!("nvmf-listen-{}", addr.port());
        l[..l.len().min(15)].to_string()
    };

    // One I/O CPU: one I/O group on it with both queues, everything else
    // off it.
    let (transport, addr) = serve(&[last], &[], 0);
    let others: Vec<usize> = allowed.iter().copied().filter(|&c| c != last).collect();
    let (_admin, cntlid) = queue(addr, 0, 0xffff);
    let (_q1, _) = queue(addr, 1, cntlid);
    let (_q2, _) = queue(addr, 2, cntlid);
    loads(&transport, &[2]);
    assert_eq!(cpus_of_one("nvmf-pg0"), [last]);
    assert!(cpus_of("nvmf-pg1").is_empty());
    assert_eq!(cpus_of_one("nvmf-admin"), others);
    assert_eq!(cpus_of_one(&listener(addr)), others);
    stop(transport);

    // Two I/O CPUs: a group on each, in the order listed; a controller's
    // queues take the groups in turn, and a second host's queue goes to
    // the group with fewer.
    let (transport, addr) = serve(&[last, first], &[], 0);
    let (_admin, cntlid) = queue(addr, 0, 0xffff);
    let _qs: Vec<_> = (1..=3).map(|q| queue(addr, q, cntlid)).collect();
    loads(&transport, &[2, 1]);
    let (_admin2, cntlid2) = queue(addr, 0, 0xffff);
    let _q = queue(addr, 1, cntlid2);
    loads(&transport, &[2, 2]);
    assert_eq!(cpus_of_one("nvmf-pg0"), [last]);
    assert_eq!(cpus_of_one("nvmf-pg1"), [first]);
    let admin = cpus_of_one("nvmf-admin");
    if allowed.len() > 2 {
        assert!(
            !admin.contains(&first) && !admin.contains(&last),
            "{admin:?}"
        );
    } else {
        // The I/O CPUs are all there is: the admin group may use them.
        assert_eq!(admin, allowed);
    }
    drop(_qs);
    loads(&transport, &[0, 1]);
    stop(transport);

    // No I/O CPUs: as many groups as asked, nothing pinned.
    let (transport, addr) = serve(&[], &[], 3);
    let (_admin, cntlid) = queue(addr, 0, 0xffff);
    let (_q1, _) = queue(addr, 1, cntlid);
    loads(&transport, &[1, 0, 0]);
    for g in ["nvmf-pg0", "nvmf-pg1", "nvmf-pg2", "nvmf-admin"] {
        assert_eq!(cpus_of_one(g), allowed, "{g}");
    }
    stop(transport);

    // A CPU held by other work (a data-plane worker): no thread of the
    // transport runs there, and the groups default to one per CPU left.
    let (transport, addr) = serve(&[], &[last], 0);
    assert_eq!(transport.poll_group_loads().len(), others.len());
    let (_admin, cntlid) = queue(addr, 0, 0xffff);
    let (_q1, _) = queue(addr, 1, cntlid);
    assert_eq!(cpus_of_one("nvmf-pg0"), others);
    assert_eq!(cpus_of_one("nvmf-admin"), others);
    assert_eq!(cpus_of_one(&listener(addr)), others);
    stop(transport);
}
