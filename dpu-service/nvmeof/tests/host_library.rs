//! The host library against our own target, in-process over loopback
//! TCP: a controller brought up with its admin queue and two I/O queues,
//! the namespace's size from Identify, 64 writes and then 64 reads in
//! flight at once across both queues (4 KiB in the capsule, 128 KiB
//! through R2T), driven from one poll loop and completed in whatever
//! order the target finishes them, the data read back as written; a
//! failed command that leaves its queue usable; the discovery log; then
//! Disconnect and shutdown. Once without digests, once with header and
//! data digests; DH-HMAC-CHAP on the admin and I/O queues (and its
//! refusals); then the same against SPDK's nvmf_tgt (a malloc bdev),
//! whose tree `tests/spdk.sh` gives (`SPDK_DIR`, or the shared build
//! tool's cached tree): that test fails when there is no SPDK.

mod spdk;

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use dpu_nvmeof::auth::{HostKeys, Secret};
use dpu_nvmeof::host::{
    self, Controller, ControllerOptions, HostAuthError, HostIdentity, Queue, QueueOptions, Transfer,
};
use dpu_nvmeof::pdu::Digests;
use dpu_nvmeof::spec::Status;
use dpu_nvmeof::{BackendSpec, NamespaceConfig, SubsystemConfig, Target, TargetConfig};
use dpu_nvmeof::{TcpConfig, TcpTransport};
use dpu_rand::Rng;

const NQN: &str = "nqn.2024-01.io.example:host-library";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0000-host-library";
const SIZE: u64 = 32 << 20;
const BLOCK: u64 = 512;
/// Commands in flight on each I/O queue.
const PER_QUEUE: u16 = 32;

/// A transport serving one RAM namespace on a loopback port of its own.
fn serve() -> (TcpTransport, SocketAddr) {
    serve_target(&Target::new())
}

/// As [`serve`], for `target`.
fn serve_target(target: &Target) -> (TcpTransport, SocketAddr) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut cfg = TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            serial: "SN-HOST".into(),
            model: "host library test".into(),
            allow_any_host: true,
            allowed_hosts: BTreeSet::new(),
            max_namespaces: 32,
            namespaces: vec![NamespaceConfig {
                eui64: None,
                nsid: 1,
                block_size: BLOCK as u32,
                uuid: [1; 16],
                nguid: [2; 16],
                backend: BackendSpec::Ram { size: SIZE },
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
            poll_groups: 2,
            ..TcpConfig::default()
        },
    )
    .unwrap();
    let failed = transport.set_listeners(&cfg.listen_addrs());
    assert!(failed.is_empty(), "{failed:?}");
    let bound = transport.bound()[&any];
    cfg.subsystems[0].listeners = vec![bound];
    assert!(target.apply(&cfg).is_empty());
    (transport, bound)
}

fn options(digests: Digests) -> ControllerOptions {
    ControllerOptions {
        kato: Duration::from_secs(10),
        queue: QueueOptions {
            digests,
            timeout: Some(Duration::from_secs(20)),
            ..QueueOptions::default()
        },
    }
}

/// Command `i` of 64: its queue (alternating), CID, size (4 KiB and
/// 128 KiB alternating per queue) and first block (each its own 128 KiB
/// stretch).
fn layout(i: u16) -> (usize, u16, usize, u64) {
    let q = usize::from(i % 2);
    let cid = i / 2;
    let len = if cid.is_multiple_of(2) {
        4096
    } else {
        128 << 10
    };
    (q, cid, len, u64::from(i) * (128 << 10) / BLOCK)
}

/// Drives both queues from one loop, without blocking, until `n`
/// commands completed; the completions in the order they came.
fn complete_all(queues: &mut [Queue<TcpStream>], n: usize) -> Vec<(usize, host::Completion)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut done = Vec::new();
    while done.len() < n {
        assert!(Instant::now() < deadline, "{} of {n} completed", done.len());
        for (i, q) in queues.iter_mut().enumerate() {
            q.send_some().unwrap();
            q.read_some().unwrap();
            while let Some(c) = q.poll_completion().unwrap() {
                done.push((i, c));
            }
        }
    }
    done
}

/// The whole exchange with the controller of `NQN` at `addr`, whose
/// namespace 1 is `SIZE` bytes in `BLOCK`-byte blocks.
fn round(addr: SocketAddr, digests: Digests) {
    let me = HostIdentity::new(HOST, [5; 16]);
    let opts = options(digests);
    let mut c = Controller::connect(TcpStream::connect(addr).unwrap(), &me, NQN, &opts).unwrap();
    let info = c.info().clone();
    assert_eq!(info.subnqn, NQN);
    assert!(info.in_capsule >= 4096, "{info:?}");
    assert!(info.max_transfer.unwrap() >= 128 << 10, "{info:?}");
    assert!(c.set_io_queues(2).unwrap() >= 2);
    let ns = c.identify_namespace(1).unwrap();
    assert_eq!((ns.blocks, u64::from(ns.block_size)), (SIZE / BLOCK, BLOCK));
    // No namespace 7: zeroes (ours) or Invalid Namespace (SPDK).
    match c.identify_namespace(7) {
        Err(host::Error::InactiveNamespace { nsid: 7 } | host::Error::Status { .. }) => {}
        other => panic!("{other:?}"),
    }

    let entries = PER_QUEUE + 1;
    let mut queues: Vec<_> = (1..=2)
        .map(|qid| {
            c.io_queue(TcpStream::connect(addr).unwrap(), qid, entries)
                .unwrap()
        })
        .collect();
    for q in &mut queues {
        assert_eq!(q.pair().digests(), digests);
        q.set_nonblocking(true).unwrap();
    }

    // 64 writes in flight at once.
    let mut rng = Rng::new(0x4057);
    let mut written = Vec::new();
    for i in 0..2 * PER_QUEUE {
        let (q, cid, len, slba) = layout(i);
        let mut data = vec![0; len];
        rng.fill(&mut data);
        let nlb = (len as u64 / BLOCK - 1) as u16;
        queues[q]
            .submit(
                cid,
                host::write(1, slba, nlb),
                Transfer::Write(data.clone()),
            )
            .unwrap();
        written.push(data);
    }
    assert_eq!(
        queues[0].pair().in_flight() + queues[1].pair().in_flight(),
        64
    );
    for (q, done) in complete_all(&mut queues, 64) {
        assert!(done.is_success(), "{:?}", done.status());
        let i = done.cid() * 2 + q as u16;
        // The write's own buffer comes back.
        assert_eq!(done.data, written[usize::from(i)]);
    }

    // 64 reads in flight at once, the data as written.
    for i in 0..2 * PER_QUEUE {
        let (q, cid, len, slba) = layout(i);
        let nlb = (len as u64 / BLOCK - 1) as u16;
        queues[q]
            .submit(cid, host::read(1, slba, nlb), Transfer::Read(vec![0; len]))
            .unwrap();
    }
    let done = complete_all(&mut queues, 64);
    let mut seen = BTreeSet::new();
    for (q, d) in &done {
        assert!(d.is_success(), "{:?}", d.status());
        let i = d.cid() * 2 + *q as u16;
        assert!(seen.insert(i));
        assert!(d.data == written[usize::from(i)], "read {i} differs");
    }

    // A read past the end fails alone; the queue goes on.
    let q = &mut queues[0];
    q.set_nonblocking(false).unwrap();
    let past = host::read(1, SIZE / BLOCK, 0);
    match q.call(past, Transfer::Read(vec![0; 512])) {
        // Do Not Retry: ours sets it, SPDK does not.
        Err(host::Error::Status { status, .. }) => {
            let want = Status::LBA_OUT_OF_RANGE;
            assert_eq!((status.sct, status.sc), (want.sct, want.sc));
        }
        other => panic!("{other:?}"),
    }
    let back = q
        .call(host::read(1, 0, 7), Transfer::Read(vec![0; 4096]))
        .unwrap();
    assert_eq!(back.data, written[0]);
    c.keep_alive().unwrap();

    // The discovery log names the subsystem on its port.
    let mut d = Controller::discovery(TcpStream::connect(addr).unwrap(), &me, &opts).unwrap();
    let log = d.discovery_log().unwrap();
    let port = addr.port().to_string();
    assert!(
        log.iter()
            .any(|e| e.subnqn == NQN && e.traddr == "127.0.0.1" && e.trsvcid == port),
        "{log:?}"
    );
    d.shutdown().unwrap();

    for q in queues {
        let mut q = q;
        q.set_nonblocking(false).unwrap();
        q.disconnect().unwrap();
    }
    c.shutdown().unwrap();
}

const DIGESTS: Digests = Digests {
    header: true,
    data: true,
};

#[test]
fn our_target_without_digests() {
    let (_transport, addr) = serve();
    round(addr, Digests::default());
}

/// One command at a time (`Queue::call`, what the admin path and the
/// remote namespaces' slow paths use): a write larger than the in-capsule
/// size goes out as the controller asks for it (R2T, H2CData) before the
/// call waits for its completion, then reads back.
#[test]
fn one_call_writes_more_than_fits_in_the_capsule() {
    let (_transport, addr) = serve();
    let me = HostIdentity::new(HOST, [6; 16]);
    let c = Controller::connect(
        TcpStream::connect(addr).unwrap(),
        &me,
        NQN,
        &options(Digests::default()),
    )
    .unwrap();
    let mut q = c.io_queue(TcpStream::connect(addr).unwrap(), 1, 8).unwrap();
    for blocks in [64u16, 256] {
        let data: Vec<u8> = (0..usize::from(blocks) * 512)
            .map(|i| (i % 251) as u8)
            .collect();
        q.call(host::write(1, 8, blocks - 1), Transfer::Write(data.clone()))
            .unwrap();
        let back = q
            .call(
                host::read(1, 8, blocks - 1),
                Transfer::Read(vec![0; data.len()]),
            )
            .unwrap();
        assert!(back.data == data, "{blocks} blocks read back differently");
    }
    q.disconnect().unwrap();
    c.shutdown().unwrap();
}

#[test]
fn our_target_with_digests() {
    let (_transport, addr) = serve();
    round(addr, DIGESTS);
}

/// `src/auth/vectors.py`'s host key (SHA-256 transformation) and
/// controller key, and a wrong key of the right form.
const SECRET: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
const CTRL_SECRET: &str =
    "DHHC-1:00:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOEhYaHiImKi4yNjo+QkZKTvGwQfg==:";
const WRONG: &str = "DHHC-1:00:WlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWloj0TmR:";

#[test]
fn dh_hmac_chap_on_admin_and_io_queues() {
    let target = Target::new();
    let (_transport, addr) = serve_target(&target);
    let secret = |s: &str| Secret::parse(s).unwrap();
    target.set_host_keys(
        NQN,
        HOST,
        Some(HostKeys::new(secret(SECRET), Some(secret(CTRL_SECRET)))),
    );
    let opts = options(Digests::default());
    let connect =
        |me: &HostIdentity| Controller::connect(TcpStream::connect(addr).unwrap(), me, NQN, &opts);
    let mut me = HostIdentity::new(HOST, [5; 16]);
    // No secret.
    match connect(&me) {
        Err(host::Error::AuthRequired { qid: 0 }) => {}
        other => panic!("{other:?}"),
    }
    // A wrong host secret: the controller refuses.
    me.secret = Some(secret(WRONG));
    match connect(&me) {
        Err(host::Error::Auth {
            qid: 0,
            source: HostAuthError::Refused { .. },
        }) => {}
        other => panic!("{other:?}"),
    }
    // The right host secret, a wrong controller secret: the host refuses.
    me.secret = Some(secret(SECRET));
    me.ctrl_secret = Some(secret(WRONG));
    match connect(&me) {
        Err(host::Error::Auth {
            qid: 0,
            source: HostAuthError::ControllerResponse,
        }) => {}
        other => panic!("{other:?}"),
    }
    // Both right, unidirectional and bidirectional, one DH group and all:
    // the admin queue and an I/O queue authenticate, and I/O runs.
    for (ctrl, groups) in [
        (None, vec![]),
        (
            Some(secret(CTRL_SECRET)),
            vec![dpu_nvmeof::auth::DhGroup::Ffdhe2048],
        ),
    ] {
        me.ctrl_secret = ctrl;
        me.dh_groups = groups;
        let c = connect(&me).unwrap();
        let mut q = c.io_queue(TcpStream::connect(addr).unwrap(), 1, 8).unwrap();
        q.call(host::write(1, 0, 0), Transfer::Write(vec![7; 512]))
            .unwrap();
        let back = q
            .call(host::read(1, 0, 0), Transfer::Read(vec![0; 512]))
            .unwrap();
        assert_eq!(back.data, vec![7; 512]);
        q.disconnect().unwrap();
        c.shutdown().unwrap();
    }
}

/// SPDK's nvmf_tgt, killed and reaped when dropped.
struct Spdk {
    child: Child,
    _work: tempfile::TempDir,
}

impl Drop for Spdk {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts nvmf_tgt serving `NQN` (a malloc bdev of `SIZE` bytes) and the
/// discovery subsystem on a free loopback port.
fn spdk() -> (Spdk, SocketAddr) {
    let dir = spdk::spdk_dir();
    spdk::hugepages();
    let work = tempfile::tempdir().unwrap();
    let sock = work.path().join("spdk.sock");
    let log = std::fs::File::create(work.path().join("nvmf_tgt.log")).unwrap();
    let lib = ["build/lib", "isa-l/.libs", "isa-l-crypto/.libs"]
        .map(|p| dir.join(p).display().to_string())
        .join(":");
    let child = Command::new(dir.join("build/bin/nvmf_tgt"))
        .args(["-m", "0x1", "-u", "-r"])
        .arg(&sock)
        .env("LD_LIBRARY_PATH", lib)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting nvmf_tgt");
    let spdk = Spdk { child, _work: work };
    let started = Instant::now();
    while !sock.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "nvmf_tgt made no RPC socket"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let mb = (SIZE >> 20).to_string();
    let block = BLOCK.to_string();
    let discovery = dpu_nvmeof::spec::DISCOVERY_NQN;
    for args in [
        &["nvmf_create_transport", "-t", "TCP"][..],
        &["bdev_malloc_create", "-b", "Malloc0", &mb, &block],
        &["nvmf_create_subsystem", NQN, "-a", "-s", "SPDK0001"],
        &["nvmf_subsystem_add_ns", NQN, "Malloc0"],
        &[
            "nvmf_subsystem_add_listener",
            NQN,
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
        ],
        &[
            "nvmf_subsystem_add_listener",
            discovery,
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
        ],
    ] {
        let out = Command::new("python3")
            .arg(dir.join("scripts/rpc.py"))
            .arg("-s")
            .arg(&sock)
            .args(["-t", "30"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rpc {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (spdk, format!("127.0.0.1:{port}").parse().unwrap())
}

#[test]
fn spdk_nvmf_tgt_without_and_with_digests() {
    let (_spdk, addr) = spdk();
    round(addr, Digests::default());
    round(addr, DIGESTS);
}
