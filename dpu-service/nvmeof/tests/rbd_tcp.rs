//! An RBD namespace served over NVMe/TCP from a real single-node Ceph
//! cluster: I/O starts on the poll group and completes from librados'
//! threads, many at once and out of order; the data is the cluster's (read
//! back with `rbd export`); an OSD that stops answering turns into
//! Namespace Not Ready within the cluster's operation timeout while a RAM
//! namespace on the same poll group keeps answering at once; I/O resumes
//! when the OSD does.

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use dpu_nvmeof::pdu::{self, ControllerPdu, Digests, Limits};
use dpu_nvmeof::spec::{nvm, sgl, Sqe, Status};
use dpu_nvmeof::{host, BackendSpec, NamespaceConfig, RbdCluster, SubsystemConfig, Target};
use dpu_nvmeof::{TargetConfig, TcpConfig, TcpTransport};
use dpu_rbd::testing::TestCluster;

const NQN: &str = "nqn.2024-01.io.example:rbd";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0000-rbd";
const MIB: u64 = 1 << 20;
/// Namespace 1: the RBD image; namespace 2: RAM.
const RBD_NS: u32 = 1;
const RAM_NS: u32 = 2;

/// A queue of a controller, as a host drives it.
struct Queue {
    s: TcpStream,
    buf: Vec<u8>,
    /// Data of reads, by command ID, as it arrives.
    data: HashMap<u16, Vec<u8>>,
}

/// A completion: command ID, status field (phase bit clear), data read.
type Done = (u16, u16, Vec<u8>);

impl Queue {
    fn open(addr: SocketAddr, qid: u16, cntlid: u16) -> (Self, u16) {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut q = Queue {
            s,
            buf: Vec::new(),
            data: HashMap::new(),
        };
        let mut b = Vec::new();
        host::ic_req(&mut b, Digests::default());
        let data = host::connect_data([7; 16], cntlid, NQN, HOST);
        pdu::encode_capsule_cmd(
            &mut b,
            Digests::default(),
            &host::connect(1, qid, 128, 0),
            &data,
        );
        if qid == 0 {
            pdu::encode_capsule_cmd(&mut b, Digests::default(), &host::enable(2), &[]);
        }
        q.s.write_all(&b).unwrap();
        let (_, status, dw0) = q.next_full();
        assert_eq!(status, 0, "Connect of queue {qid}");
        if qid == 0 {
            assert_eq!(q.next_full().1, 0, "CC.EN");
        }
        (q, dw0 as u16)
    }

    /// The next completion (ICResp skipped): (cid, status, dw0).
    fn next_full(&mut self) -> (u16, u16, u32) {
        loop {
            let limits = Limits {
                digests: Digests::default(),
                max_data: 4 << 20,
            };
            if let Some((p, n)) = pdu::decode_controller(&self.buf, &limits).unwrap() {
                let out = match p {
                    ControllerPdu::IcResp(_) => None,
                    ControllerPdu::CapsuleResp { cqe } => Some((cqe.cid, cqe.status & !1, cqe.dw0)),
                    ControllerPdu::C2HData {
                        cccid,
                        datao,
                        data,
                        success,
                        ..
                    } => {
                        let d = self.data.entry(cccid).or_default();
                        assert_eq!(d.len(), datao as usize, "data in order");
                        d.extend_from_slice(data);
                        success.then_some((cccid, 0, 0))
                    }
                    other => panic!("unexpected PDU {other:?}"),
                };
                self.buf.drain(..n);
                if let Some(o) = out {
                    return o;
                }
                continue;
            }
            let mut chunk = [0u8; 65536];
            let n = self.s.read(&mut chunk).expect("a PDU within 60 s");
            assert!(n > 0, "the target closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The next completion with the data it read.
    fn next(&mut self) -> Done {
        let (cid, status, _) = self.next_full();
        (cid, status, self.data.remove(&cid).unwrap_or_default())
    }

    /// Sends a read or write of `blocks` 512-byte blocks at `slba` of
    /// namespace `nsid` (a write carries `data` in its capsule).
    fn rw(&mut self, nsid: u32, write: bool, cid: u16, slba: u64, blocks: u32, data: &[u8]) {
        let mut s: Sqe = host::command(if write { nvm::WRITE } else { nvm::READ }, cid);
        s.0[4..8].copy_from_slice(&nsid.to_le_bytes());
        s.0[32..36].copy_from_slice(&(blocks * 512).to_le_bytes());
        s.0[40..48].copy_from_slice(&slba.to_le_bytes());
        s.0[48..50].copy_from_slice(&((blocks - 1) as u16).to_le_bytes());
        let mut b = Vec::new();
        if write {
            s.0[39] = sgl::IN_CAPSULE;
            pdu::encode_capsule_cmd(&mut b, Digests::default(), &s, data);
        } else {
            pdu::encode_capsule_cmd(&mut b, Digests::default(), &s, &[]);
        }
        self.s.write_all(&b).unwrap();
    }
}

fn pattern(i: u64) -> Vec<u8> {
    (0..4096u64).map(|j| (i * 7 + j * 13) as u8 | 1).collect()
}

/// A transport with one poll group serving the RBD image `rbd/vol` and a
/// RAM namespace in one subsystem.
/// Ends a test's target while its cluster still runs: the transport
/// stopped, the target dropped and its images closed (on their own
/// threads), so that no librados thread is at work when the cluster stops
/// or the test binary exits.
fn close(transport: TcpTransport, target: Target) {
    transport.shutdown();
    drop(target);
    assert!(
        dpu_nvmeof::backend::wait_closed(Duration::from_secs(60)),
        "the images close"
    );
}

fn serve(c: &TestCluster, op_timeout: Duration) -> (TcpTransport, SocketAddr, Target) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let target = Target::new();
    let cluster = RbdCluster {
        name: "ceph1".into(),
        mon_host: c.mon_host.clone(),
        user: "admin".into(),
        key: Some(c.admin_key.clone()),
        op_timeout,
        connect_timeout: Duration::from_secs(5),
    };
    let ns = |nsid: u32, backend| NamespaceConfig {
        eui64: None,
        nsid,
        block_size: 512,
        uuid: [nsid as u8; 16],
        nguid: [nsid as u8 + 1; 16],
        backend,
        qos: Default::default(),
    };
    let mut cfg = TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            serial: "SN1".into(),
            model: "test".into(),
            allow_any_host: true,
            allowed_hosts: BTreeSet::new(),
            max_namespaces: 8,
            namespaces: vec![
                ns(
                    RBD_NS,
                    BackendSpec::Rbd {
                        cluster,
                        pool: "rbd".into(),
                        image: "vol".into(),
                    },
                ),
                ns(RAM_NS, BackendSpec::Ram { size: 4 * MIB }),
            ],
            listeners: vec![any],
            host_qos: Default::default(),
        }],
        discovery: None,
    };
    let transport = TcpTransport::with_config(
        target.clone(),
        &TcpConfig {
            poll_groups: 1,
            ..TcpConfig::default()
        },
    )
    .unwrap();
    assert!(transport.set_listeners(&cfg.listen_addrs()).is_empty());
    let bound = transport.bound()[&any];
    cfg.subsystems[0].listeners = vec![bound];
    let errors = target.apply(&cfg);
    assert!(errors.is_empty(), "{errors:?}");
    (transport, bound, target)
}

#[test]
fn an_rbd_namespace_serves_io_and_answers_when_its_cluster_does_not() {
    let c = TestCluster::start(false);
    c.rbd(&["create", "rbd/vol", "--size", "64M"]);
    let (transport, addr, target) = serve(&c, Duration::from_secs(3));
    let served = target.subsystem(NQN).unwrap();
    assert_eq!(served.namespaces[&RBD_NS].backend.len(), 64 * MIB);
    assert_eq!(served.namespaces[&RBD_NS].backend.kind(), "rbd");

    let (_admin, cntlid) = Queue::open(addr, 0, 0xffff);
    let (mut q, _) = Queue::open(addr, 1, cntlid);

    // 96 writes of 4 KiB in flight at once (more than librbd answers in
    // order), then read back 96 at once.
    for i in 0..96u16 {
        q.rw(
            RBD_NS,
            true,
            i,
            u64::from(i) * 16,
            8,
            &pattern(u64::from(i)),
        );
    }
    let mut seen = BTreeSet::new();
    for _ in 0..96 {
        let (cid, status, _) = q.next();
        assert_eq!(status, 0, "write {cid}");
        assert!(seen.insert(cid), "one completion per command");
    }
    for i in 0..96u16 {
        q.rw(RBD_NS, false, 200 + i, u64::from(i) * 16, 8, &[]);
    }
    for _ in 0..96 {
        let (cid, status, data) = q.next();
        assert_eq!(status, 0, "read {cid}");
        let i = u64::from(cid - 200);
        assert!(data == pattern(i), "read {cid}: the data written");
    }

    // Another client sees the same bytes.
    let exported = c.rbd(&["export", "rbd/vol", "-"]);
    for i in [0u64, 17, 95] {
        let off = (i * 16 * 512) as usize;
        assert!(
            exported[off..off + 4096] == pattern(i),
            "exported block {i}"
        );
    }

    // The OSD stops answering: RBD I/O ends in Namespace Not Ready within
    // the operation timeout; the RAM namespace on the same poll group
    // answers meanwhile.
    c.freeze_osd();
    let stopped = Instant::now();
    for i in 0..8u16 {
        q.rw(RBD_NS, false, 400 + i, u64::from(i) * 16, 8, &[]);
    }
    q.rw(RAM_NS, true, 500, 0, 8, &pattern(5));
    q.rw(RAM_NS, false, 501, 0, 8, &[]);
    let mut ram_done = None;
    let mut not_ready = 0;
    for _ in 0..10 {
        let (cid, status, data) = q.next();
        match cid {
            500 => assert_eq!(status, 0),
            501 => {
                assert_eq!(status, 0);
                assert!(data == pattern(5));
                ram_done = Some(stopped.elapsed());
            }
            _ => {
                assert_eq!(status, Status::NS_NOT_READY.to_field(), "read {cid}");
                not_ready += 1;
            }
        }
    }
    let took = stopped.elapsed();
    c.thaw_osd();
    assert_eq!(not_ready, 8);
    let ram = ram_done.expect("the RAM read");
    assert!(ram < Duration::from_secs(1), "RAM namespace waited {ram:?}");
    assert!(took < Duration::from_secs(15), "bounded: {took:?}");
    let ns = target.subsystem(NQN).unwrap().namespaces[&RBD_NS].clone();
    assert!(!ns.backend.reachable(), "the outage shows");

    // The OSD answers again: so does the namespace, on the same queue.
    let t = Instant::now();
    let mut cid = 600u16;
    loop {
        q.rw(RBD_NS, false, cid, 0, 8, &[]);
        let (_, status, data) = q.next();
        if status == 0 {
            assert!(data == pattern(0));
            break;
        }
        assert_eq!(status, Status::NS_NOT_READY.to_field());
        assert!(t.elapsed() < Duration::from_secs(60), "did not resume");
        cid += 1;
    }
    assert!(ns.backend.reachable());
    drop((ns, q));
    close(transport, target);
}

/// More commands than the cluster connection may have in flight, while
/// the OSD is frozen: those past the bound wait in their connections
/// (librados never blocks a poll group), start as room frees, and every
/// command is answered: none lost, none twice.
#[test]
fn commands_past_the_in_flight_bound_wait_and_are_all_answered() {
    use dpu_nvmeof::backend::rbd::MAX_IN_FLIGHT_OPS;
    let c = TestCluster::start(false);
    c.rbd(&["create", "rbd/vol", "--size", "16M"]);
    let (transport, addr, target) = serve(&c, Duration::from_secs(2));
    let (_admin, cntlid) = Queue::open(addr, 0, 0xffff);
    let per_queue = 120u16;
    let queues = (MAX_IN_FLIGHT_OPS / usize::from(per_queue)) as u16 + 1;
    let mut qs: Vec<Queue> = (1..=queues)
        .map(|q| Queue::open(addr, q, cntlid).0)
        .collect();
    c.freeze_osd();
    for q in &mut qs {
        for cid in 0..per_queue {
            q.rw(RBD_NS, false, cid, u64::from(cid) * 8, 8, &[]);
        }
    }
    std::thread::sleep(Duration::from_secs(3));
    c.thaw_osd();
    let t = Instant::now();
    for q in &mut qs {
        let mut seen = BTreeSet::new();
        for _ in 0..per_queue {
            let (cid, status, _) = q.next();
            assert!(
                status == 0 || status == Status::NS_NOT_READY.to_field(),
                "read {cid}: status {status:#x}"
            );
            assert!(seen.insert(cid), "cid {cid} answered twice");
        }
    }
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    close(transport, target);
}

/// Deleting an RBD namespace whose cluster does not answer returns at
/// once, with I/O in flight on it; its image closes once the cluster
/// answers again.
#[test]
fn deleting_a_namespace_whose_cluster_hangs_returns() {
    let c = TestCluster::start(false);
    c.rbd(&["create", "rbd/vol", "--size", "16M"]);
    let (transport, addr, target) = serve(&c, Duration::from_secs(20));
    let (_admin, cntlid) = Queue::open(addr, 0, 0xffff);
    let (mut q, _) = Queue::open(addr, 1, cntlid);
    c.freeze_osd();
    for cid in 0..16u16 {
        q.rw(RBD_NS, false, cid, u64::from(cid) * 8, 8, &[]);
    }
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let errors = target.apply(&TargetConfig {
        subsystems: Vec::new(),
        discovery: None,
    });
    let took = t.elapsed();
    assert!(errors.is_empty(), "{errors:?}");
    assert!(took < Duration::from_secs(2), "the delete waited {took:?}");
    assert!(target.subsystem(NQN).is_none());
    c.thaw_osd();
    transport.shutdown();
    drop((q, target));
    assert!(
        dpu_nvmeof::backend::wait_closed(Duration::from_secs(30)),
        "the image closes once the cluster answers"
    );
}

/// The OSD crashes (SIGKILL) under reads and comes back (bluestore, so
/// with its data): the reads in flight end in Namespace Not Ready within
/// the operation timeout, and the namespace serves the same bytes again
/// once the OSD is up, on the same connection.
#[test]
fn an_osd_that_crashes_and_restarts_is_served_again() {
    let c = TestCluster::start(true);
    c.rbd(&["create", "rbd/vol", "--size", "16M"]);
    let (transport, addr, target) = serve(&c, Duration::from_secs(3));
    let (_admin, cntlid) = Queue::open(addr, 0, 0xffff);
    let (mut q, _) = Queue::open(addr, 1, cntlid);
    for i in 0..16u16 {
        q.rw(RBD_NS, true, i, u64::from(i) * 8, 8, &pattern(u64::from(i)));
    }
    for _ in 0..16 {
        assert_eq!(q.next().1, 0, "write");
    }
    c.kill_osd();
    let t = Instant::now();
    for i in 0..16u16 {
        q.rw(RBD_NS, false, 100 + i, u64::from(i) * 8, 8, &[]);
    }
    for _ in 0..16 {
        let (cid, status, _) = q.next();
        assert_eq!(status, Status::NS_NOT_READY.to_field(), "read {cid}");
    }
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    c.start_osd();
    let t = Instant::now();
    let mut cid = 200u16;
    loop {
        q.rw(RBD_NS, false, cid, 5 * 8, 8, &[]);
        let (_, status, data) = q.next();
        if status == 0 {
            assert!(data == pattern(5), "the data survived the crash");
            break;
        }
        assert_eq!(status, Status::NS_NOT_READY.to_field());
        assert!(t.elapsed() < Duration::from_secs(90), "not served again");
        cid += 1;
    }
    println!("served again {:?} after the OSD's restart", t.elapsed());
    close(transport, target);
}
