//! Remote namespaces ([`BackendSpec::Remote`]) against a target we did
//! not write: SPDK's nvmf_tgt serving malloc bdevs (512-byte and
//! 4096-byte blocks). Our target runs in-process and serves them; the
//! host library is the initiator, both through our target and directly
//! against SPDK, so every byte read through us is checked against what
//! SPDK itself holds.
//!
//! - Data: a pattern of mixed sizes (4 KiB to 1 MiB, a 1 MiB piece going
//!   as two commands at our target's 512 KiB MDTS) with many more
//!   commands in flight than the remote queue depth, read back through
//!   our target and directly from SPDK; Write Zeroes and Dataset
//!   Management (deallocate) through our target read back as zeros from
//!   SPDK.
//! - Faults: SPDK frozen (SIGSTOP) while commands are in flight: within
//!   twice the remote's I/O timeout (one to find the hang, one the
//!   outage may last while commands wait for a connection), a connection
//!   attempt and a margin, our target answers them Namespace Not Ready,
//!   and new commands at once past that; after SIGCONT I/O
//!   through our target resumes by itself and the data is intact.
//! - Configuration: a 4096-byte remote under 512-byte blocks is refused
//!   by [`Target::apply`] with an error naming both sizes.
//!
//! SPDK's tree is `SPDK_DIR`, else the one `tests/spdk.sh` gives (the
//! shared build tool's cached tree, built once per machine), as in
//! `tests/host_library.rs`: the tests fail when there is no SPDK. They
//! reserve hugepages when too few are free (as root). nvmf_tgt's reactor
//! spins on its core, so the tests take turns; each test's nvmf_tgt is
//! killed when it ends (and, through its parent-death signal, when the
//! test's thread dies without unwinding).

mod spdk;

use std::collections::{BTreeSet, HashMap};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dpu_nvmeof::host::{
    self, Completion, Controller, ControllerInfo, ControllerOptions, HostIdentity, Queue,
    QueueOptions, Transfer,
};
use dpu_nvmeof::spec::{nvm, Sqe, Status};
use dpu_nvmeof::target::RemoteNamespace;
use dpu_nvmeof::{BackendSpec, NamespaceConfig, SubsystemConfig, Target, TargetConfig};
use dpu_nvmeof::{TcpConfig, TcpTransport};
use dpu_rand::Rng;
use rustix::event::{poll, PollFd, PollFlags, Timespec};

/// The subsystem SPDK serves.
const REMOTE_NQN: &str = "nqn.2024-01.io.spdk:remote-backend";
/// The subsystem our target serves on top of it.
const FRONT_NQN: &str = "nqn.2024-01.io.example:remote-front";
/// The host NQN our target connects to SPDK with.
const TARGET_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:5d1f0e2a-0000-4000-8000-00000000a001";
/// The host NQN of the host library (to our target and to SPDK).
const ME: &str = "nqn.2014-08.org.nvmexpress:uuid:5d1f0e2a-0000-4000-8000-00000000a002";
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Commands our target keeps in flight to SPDK per namespace; the tests
/// put several times as many in flight through our target.
const REMOTE_DEPTH: u16 = 8;
/// The remote's I/O timeout in the freeze test.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// What the answers to frozen commands may take beyond the I/O timeout:
/// the link's 50 ms sweep, then two threads and two TCP hops, on a
/// machine of two cores with nvmf_tgt spinning on one.
const MARGIN: Duration = Duration::from_secs(2);
/// The remote's connect timeout in the freeze test.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The latest answer to a command in flight when the remote freezes: the
/// I/O timeout finds the hang, operations then wait for a connection
/// until the outage has lasted the I/O timeout too, plus a connection
/// attempt under way and the margin.
const ANSWER_BOUND: Duration = Duration::from_secs(7);
/// Entries of the host library's I/O queues (63 commands in flight).
const HOST_ENTRIES: u16 = 64;
/// Sizes of the mixed pattern's pieces, in turn.
const SIZES: [u64; 12] = [
    4 * KIB,
    MIB,
    8 * KIB,
    512 * KIB,
    16 * KIB,
    128 * KIB,
    64 * KIB,
    256 * KIB,
    12 * KIB,
    MIB,
    32 * KIB,
    192 * KIB,
];

/// nvmf_tgt's reactor spins on its core: the tests take turns, so that
/// one at a time runs on these machines' two cores.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------- SPDK

/// SPDK's nvmf_tgt serving [`REMOTE_NQN`], killed and reaped when
/// dropped (stopped or not).
struct Spdk {
    child: Child,
    dir: PathBuf,
    work: tempfile::TempDir,
    addr: SocketAddr,
}

impl Spdk {
    /// Starts nvmf_tgt with one malloc bdev per `(bytes, block size)` of
    /// `bdevs`, served as namespaces 1, 2, .. of [`REMOTE_NQN`] (any host
    /// allowed) on a free loopback port.
    fn start(bdevs: &[(u64, u32)]) -> Self {
        let dir = spdk::spdk_dir();
        spdk::hugepages();
        let work = tempfile::tempdir().unwrap();
        let sock = work.path().join("spdk.sock");
        let log = std::fs::File::create(work.path().join("nvmf_tgt.log")).unwrap();
        let lib = ["build/lib", "isa-l/.libs", "isa-l-crypto/.libs"]
            .map(|p| dir.join(p).display().to_string())
            .join(":");
        // setpriv execs nvmf_tgt with a parent-death signal: it dies with
        // the test's thread even when the test process is killed.
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(dir.join("build/bin/nvmf_tgt"))
            .args(["-m", "0x1", "-u", "--disable-cpumask-locks", "-r"])
            .arg(&sock)
            .env("LD_LIBRARY_PATH", lib)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting nvmf_tgt (under setpriv)");
        let mut spdk = Spdk {
            child,
            dir,
            work,
            addr: "127.0.0.1:0".parse().unwrap(),
        };
        let started = Instant::now();
        while !sock.exists() {
            if let Ok(Some(st)) = spdk.child.try_wait() {
                panic!(
                    "nvmf_tgt ended ({st}) before its RPC socket:\n{}",
                    spdk.log()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "nvmf_tgt made no RPC socket in 30 s:\n{}",
                spdk.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
            .to_string();
        spdk.rpc(&["nvmf_create_transport", "-t", "TCP"]);
        spdk.rpc(&[
            "nvmf_create_subsystem",
            REMOTE_NQN,
            "-a",
            "-s",
            "SPDKREMOTE01",
        ]);
        for (i, (bytes, block)) in bdevs.iter().enumerate() {
            let name = format!("Malloc{i}");
            let mb = (bytes / MIB).to_string();
            spdk.rpc(&["bdev_malloc_create", "-b", &name, &mb, &block.to_string()]);
            let nsid = (i + 1).to_string();
            spdk.rpc(&["nvmf_subsystem_add_ns", REMOTE_NQN, &name, "-n", &nsid]);
        }
        spdk.rpc(&[
            "nvmf_subsystem_add_listener",
            REMOTE_NQN,
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
        ]);
        spdk.addr = format!("127.0.0.1:{port}").parse().unwrap();
        spdk
    }

    /// Runs one RPC through SPDK's `scripts/rpc.py`.
    fn rpc(&self, args: &[&str]) {
        let out = Command::new("python3")
            .arg(self.dir.join("scripts/rpc.py"))
            .arg("-s")
            .arg(self.work.path().join("spdk.sock"))
            .args(["-t", "30"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rpc {args:?}: {}\n--- nvmf_tgt ---\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// Sends `signal` (`STOP`, `CONT`) to nvmf_tgt.
    fn signal(&self, signal: &str) {
        let st = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(st.success(), "kill -{signal} nvmf_tgt failed");
    }

    /// What nvmf_tgt logged so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.work.path().join("nvmf_tgt.log")).unwrap_or_default()
    }
}

impl Drop for Spdk {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- our target

/// Namespace `nsid` of SPDK's subsystem at `addr`, as our target reaches
/// it: [`REMOTE_DEPTH`] commands in flight, a 2-second I/O timeout and a
/// 1-second connect timeout.
fn remote(addr: SocketAddr, nsid: u32) -> RemoteNamespace {
    let mut r = RemoteNamespace::new(vec![addr], REMOTE_NQN, nsid, TARGET_HOST);
    r.queue_depth = REMOTE_DEPTH;
    r.io_timeout = IO_TIMEOUT;
    r.connect_timeout = CONNECT_TIMEOUT;
    r
}

/// Our namespace `nsid` of `block_size`-byte blocks on `remote`.
fn namespace(nsid: u32, block_size: u32, remote: RemoteNamespace) -> NamespaceConfig {
    NamespaceConfig {
        eui64: None,
        nsid,
        block_size,
        uuid: [nsid as u8; 16],
        nguid: [0x80 | nsid as u8; 16],
        backend: BackendSpec::Remote(remote),
        qos: Default::default(),
    }
}

/// Our target's configuration: [`FRONT_NQN`] with `namespaces`.
fn front_config(namespaces: Vec<NamespaceConfig>, listeners: Vec<SocketAddr>) -> TargetConfig {
    TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: FRONT_NQN.into(),
            serial: "SN-FRONT".into(),
            model: "remote front".into(),
            allow_any_host: true,
            allowed_hosts: BTreeSet::new(),
            max_namespaces: 8,
            namespaces,
            listeners,
            host_qos: Default::default(),
        }],
        discovery: None,
    }
}

/// Our target, in-process, serving [`FRONT_NQN`] on a loopback port.
struct Front {
    _target: Target,
    _transport: TcpTransport,
    addr: SocketAddr,
}

impl Front {
    fn serve(namespaces: Vec<NamespaceConfig>) -> Self {
        let target = Target::new();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let transport = TcpTransport::with_config(
            target.clone(),
            &TcpConfig {
                poll_groups: 2,
                ..TcpConfig::default()
            },
        )
        .unwrap();
        let failed = transport.set_listeners(&BTreeSet::from([any]));
        assert!(failed.is_empty(), "{failed:?}");
        let addr = transport.bound()[&any];
        let errors = target.apply(&front_config(namespaces, vec![addr]));
        assert!(
            errors.is_empty(),
            "our target refused the remote namespaces: {}",
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        );
        Self {
            _target: target,
            _transport: transport,
            addr,
        }
    }
}

// ---------------------------------------------------------------- the host library

/// A controller of the host library and its one I/O queue.
struct Host {
    ctrl: Controller<TcpStream>,
    q: Queue<TcpStream>,
    /// Largest transfer of one command: the controller's MDTS, at most
    /// 1 MiB (the queue's largest PDU).
    max: u64,
}

impl Host {
    /// Connects to `nqn` at `addr` with an I/O queue of up to
    /// [`HOST_ENTRIES`] entries.
    fn connect(addr: SocketAddr, nqn: &str) -> Self {
        let me = HostIdentity::new(ME, [0xa5; 16]);
        let opts = ControllerOptions {
            kato: Duration::from_secs(60),
            queue: QueueOptions {
                timeout: Some(Duration::from_secs(30)),
                ..QueueOptions::default()
            },
        };
        let stream = || {
            let s = TcpStream::connect(addr).unwrap();
            s.set_nodelay(true).unwrap();
            s
        };
        let mut ctrl = Controller::connect(stream(), &me, nqn, &opts)
            .unwrap_or_else(|e| panic!("connecting to {nqn} at {addr}: {e}"));
        assert!(ctrl.set_io_queues(1).unwrap() >= 1);
        let entries = u32::from(HOST_ENTRIES).min(ctrl.info().max_queue_entries);
        let q = ctrl
            .io_queue(stream(), 1, entries as u16)
            .unwrap_or_else(|e| panic!("I/O queue to {nqn} at {addr}: {e}"));
        let max = ctrl.info().max_transfer.map_or(MIB, u64::from).min(MIB);
        Self { ctrl, q, max }
    }

    fn info(&self) -> &ControllerInfo {
        self.ctrl.info()
    }

    /// Namespace `nsid`'s size in blocks and its block size.
    fn namespace(&mut self, nsid: u32) -> (u64, u64) {
        let ns = self.ctrl.identify_namespace(nsid).unwrap();
        (ns.blocks, u64::from(ns.block_size))
    }

    /// Runs `cmds`, as many in flight as the queue takes.
    fn run(&mut self, cmds: Vec<Cmd>, what: &str) -> Run {
        run_all(&mut self.q, cmds, what)
    }

    /// Runs `cmds` and fails unless each succeeds.
    fn run_ok(&mut self, cmds: Vec<Cmd>, what: &str) -> Run {
        let run = self.run(cmds, what);
        for (i, c) in run.done.iter().enumerate() {
            assert!(
                c.is_success(),
                "{what}: command {i} failed: {:?}",
                c.status()
            );
        }
        run
    }

    /// Reads `len` bytes at byte `offset` of namespace `nsid`, in
    /// commands of at most this controller's MDTS, all in flight at once.
    fn read(&mut self, nsid: u32, block: u64, offset: u64, len: u64, what: &str) -> Vec<u8> {
        let cmds = reads(nsid, block, offset, len, self.max);
        let run = self.run_ok(cmds, what);
        run.done.into_iter().flat_map(|c| c.data).collect()
    }

    fn shutdown(self) {
        let mut q = self.q;
        q.set_nonblocking(false).unwrap();
        q.disconnect().unwrap();
        self.ctrl.shutdown().unwrap();
    }
}

/// One I/O command with its data.
struct Cmd {
    sqe: Sqe,
    transfer: Transfer,
}

/// Writes of `data` at byte `offset` of namespace `nsid` (blocks of
/// `block` bytes), in commands of at most `max` bytes.
fn writes(nsid: u32, block: u64, offset: u64, data: &[u8], max: u64) -> Vec<Cmd> {
    data.chunks(max as usize)
        .enumerate()
        .map(|(i, d)| Cmd {
            sqe: host::write(
                nsid,
                (offset + i as u64 * max) / block,
                nlb(d.len() as u64, block),
            ),
            transfer: Transfer::Write(d.to_vec()),
        })
        .collect()
}

/// Reads of `len` bytes at byte `offset` of namespace `nsid`, in commands
/// of at most `max` bytes.
fn reads(nsid: u32, block: u64, offset: u64, len: u64, max: u64) -> Vec<Cmd> {
    (0..len)
        .step_by(max as usize)
        .map(|at| {
            let n = max.min(len - at);
            Cmd {
                sqe: host::read(nsid, (offset + at) / block, nlb(n, block)),
                transfer: Transfer::Read(vec![0; n as usize]),
            }
        })
        .collect()
}

/// The 0's based block count of `len` bytes.
fn nlb(len: u64, block: u64) -> u16 {
    assert!(
        len > 0 && len.is_multiple_of(block),
        "{len} bytes in {block}-byte blocks"
    );
    u16::try_from(len / block - 1).unwrap()
}

/// A Dataset Management command that deallocates `ranges` (first block,
/// blocks) of namespace `nsid`.
fn deallocate(nsid: u32, ranges: &[(u64, u32)]) -> Cmd {
    let mut sqe = host::command(nvm::DSM, 0);
    sqe.0[4..8].copy_from_slice(&nsid.to_le_bytes());
    let nr = u32::try_from(ranges.len() - 1).unwrap();
    sqe.0[40..44].copy_from_slice(&nr.to_le_bytes()); // CDW10: NR, 0's based
    sqe.0[44..48].copy_from_slice(&(1u32 << 2).to_le_bytes()); // CDW11: AD
    let mut data = Vec::with_capacity(16 * ranges.len());
    for (slba, blocks) in ranges {
        data.extend_from_slice(&0u32.to_le_bytes()); // context attributes
        data.extend_from_slice(&blocks.to_le_bytes());
        data.extend_from_slice(&slba.to_le_bytes());
    }
    Cmd {
        sqe,
        transfer: Transfer::Write(data),
    }
}

/// What [`run_all`] saw.
struct Run {
    /// Each command's completion, in the commands' order.
    done: Vec<Completion>,
    /// Most commands in flight at once.
    peak: usize,
}

/// Waits up to `ms` milliseconds for `q`'s socket (readable, or writable
/// when it has output).
fn wait_io(q: &Queue<TcpStream>, ms: i64) {
    let flags = if q.pair().has_output() {
        PollFlags::IN | PollFlags::OUT
    } else {
        PollFlags::IN
    };
    let mut fds = [PollFd::new(q.wire(), flags)];
    let t = Timespec {
        tv_sec: 0,
        tv_nsec: ms * 1_000_000,
    };
    let _ = poll(&mut fds, Some(&t));
}

/// Runs `cmds` on `q` from one loop, without blocking: as many in flight
/// as the queue takes, completed in whatever order the controller
/// answers; a command that gets no answer in 60 s fails the test.
fn run_all(q: &mut Queue<TcpStream>, cmds: Vec<Cmd>, what: &str) -> Run {
    q.set_nonblocking(true).unwrap();
    let n = cmds.len();
    let mut todo = cmds.into_iter().enumerate();
    let mut next = todo.next();
    let mut by_cid = HashMap::new();
    let mut done: Vec<Option<Completion>> = (0..n).map(|_| None).collect();
    let mut left = n;
    let mut peak = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while left > 0 {
        assert!(
            Instant::now() < deadline,
            "{what}: only {} of {n} commands answered in 60 s",
            n - left
        );
        while let Some((i, c)) = next.take() {
            let Some(cid) = q.pair().free_cid() else {
                next = Some((i, c));
                break;
            };
            q.submit(cid, c.sqe, c.transfer)
                .unwrap_or_else(|e| panic!("{what}: submitting command {i}: {e}"));
            by_cid.insert(cid, i);
            next = todo.next();
        }
        peak = peak.max(q.pair().in_flight());
        q.send_some()
            .unwrap_or_else(|e| panic!("{what}: sending: {e}"));
        let got = q
            .read_some()
            .unwrap_or_else(|e| panic!("{what}: receiving: {e}"));
        while let Some(c) = q
            .poll_completion()
            .unwrap_or_else(|e| panic!("{what}: {e}"))
        {
            let i = by_cid
                .remove(&c.cid())
                .unwrap_or_else(|| panic!("{what}: a completion for CID {}", c.cid()));
            done[i] = Some(c);
            left -= 1;
        }
        if !got {
            wait_io(q, 5);
        }
    }
    q.set_nonblocking(false).unwrap();
    let done = done.into_iter().map(Option::unwrap).collect();
    Run { done, peak }
}

/// Fails unless `got` is `want`, naming the first byte that differs.
fn same(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: byte {i} (of {}) is {:#04x}, not {:#04x}",
            want.len(),
            got[i],
            want[i]
        );
    }
}

/// A controller's limits, for the record.
fn describe(i: &ControllerInfo) -> String {
    format!(
        "MDTS {}, ONCS {:#06x} (DSM {}, Write Zeroes {}), MQES+1 {}, in-capsule data {} bytes, volatile write cache {}",
        i.max_transfer
            .map_or("none".to_string(), |m| format!("{} KiB", m / 1024)),
        i.oncs,
        i.oncs & 1 << 2 != 0,
        i.oncs & 1 << 3 != 0,
        i.max_queue_entries,
        i.in_capsule,
        i.volatile_write_cache
    )
}

/// A piece of the mixed pattern: byte offset and data.
type Piece = (u64, Vec<u8>);

/// Random pieces of [`SIZES`] in turn, `count` of them, back to back from
/// byte `start`.
fn pattern(seed: u64, start: u64, count: usize) -> Vec<Piece> {
    let mut rng = Rng::new(seed);
    let mut at = start;
    (0..count)
        .map(|i| {
            let mut d = vec![0; SIZES[i % SIZES.len()] as usize];
            rng.fill(&mut d);
            let p = (at, d);
            at += p.1.len() as u64;
            p
        })
        .collect()
}

/// How many of `times` fall in each half second, for messages.
fn timeline(times: impl IntoIterator<Item = Duration>) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for t in times {
        *counts.entry(t.as_millis() / 500).or_insert(0) += 1;
    }
    counts
        .iter()
        .map(|(k, n)| format!("{n} at {:.1} s", *k as f64 / 2.0))
        .collect::<Vec<_>>()
        .join(", ")
}

fn is_not_ready(s: Status) -> bool {
    (s.sct, s.sc, s.dnr) == (0, 0x82, false)
}

// ---------------------------------------------------------------- tests

#[test]
fn through_our_target_the_bytes_are_spdks() {
    let _turn = one_at_a_time();
    let t0 = Instant::now();
    let spdk = Spdk::start(&[(64 * MIB, 512), (32 * MIB, 4096)]);
    let front = Front::serve(vec![
        namespace(1, 512, remote(spdk.addr, 1)),
        namespace(2, 4096, remote(spdk.addr, 2)),
    ]);
    let mut ours = Host::connect(front.addr, FRONT_NQN);
    let mut theirs = Host::connect(spdk.addr, REMOTE_NQN);
    println!("SPDK nvmf_tgt: {}", describe(theirs.info()));
    println!("our target:    {}", describe(ours.info()));

    for (nsid, seed) in [(1u32, 0x5bd1u64), (2, 0x4096)] {
        let (blocks, block) = theirs.namespace(nsid);
        assert_eq!(
            ours.namespace(nsid),
            (blocks, block),
            "namespace {nsid}: our target reports SPDK's size"
        );
        let t = Instant::now();
        // 48 pieces (about 12.8 MiB) from block 3: no piece lies on
        // SPDK's 128 KiB MDTS boundaries.
        let pieces = pattern(seed, 3 * block, 48);
        let start = pieces[0].0;
        let mut want: Vec<u8> = pieces.iter().flat_map(|p| p.1.clone()).collect();
        let len = want.len() as u64;
        let max = ours.max;
        let cmds = pieces
            .iter()
            .flat_map(|(at, d)| writes(nsid, block, *at, d, max))
            .collect::<Vec<_>>();
        let n = cmds.len();
        let run = ours.run_ok(cmds, "writes through our target");
        assert!(
            run.peak > 4 * usize::from(REMOTE_DEPTH),
            "only {} commands were in flight at once",
            run.peak
        );
        // Read back through our target, in the same pieces.
        let cmds = pieces
            .iter()
            .flat_map(|(at, d)| reads(nsid, block, *at, d.len() as u64, max))
            .collect::<Vec<_>>();
        let back: Vec<u8> = ours
            .run_ok(cmds, "reads through our target")
            .done
            .into_iter()
            .flat_map(|c| c.data)
            .collect();
        same("read back through our target", &back, &want);
        // Read back from SPDK itself, in commands of its own MDTS.
        let direct = theirs.read(nsid, block, start, len, "reads from SPDK");
        same("read back directly from SPDK", &direct, &want);

        // Write Zeroes, and a deallocating Dataset Management of two
        // ranges, through our target: zeros at SPDK, the rest untouched.
        let (wz_at, wz_len) = (start + 5 * block, 300 * KIB);
        let wz = Cmd {
            sqe: host::write_zeroes(nsid, wz_at / block, nlb(wz_len, block), false),
            transfer: Transfer::None,
        };
        let ranges = [
            (start + 2 * MIB + block, MIB + 7 * block),
            (start + 9 * MIB, 64 * KIB),
        ];
        let dsm = deallocate(
            nsid,
            &ranges.map(|(at, n)| (at / block, u32::try_from(n / block).unwrap())),
        );
        ours.run_ok(vec![wz, dsm], "Write Zeroes and Dataset Management");
        for (at, n) in [(wz_at, wz_len)].into_iter().chain(ranges) {
            let i = (at - start) as usize;
            want[i..i + n as usize].fill(0);
        }
        let direct = theirs.read(nsid, block, start, len, "reads from SPDK");
        same("zeroed ranges read directly from SPDK", &direct, &want);
        let back = ours.read(nsid, block, start, len, "reads through our target");
        same("zeroed ranges read through our target", &back, &want);

        // The largest Write Zeroes (65,536 blocks, or the namespace),
        // over the whole pattern; then the whole namespace deallocated
        // in one range (for 512-byte blocks, two Write Zeroes at SPDK).
        let wz_blocks = blocks.min(1 << 16);
        let wz = Cmd {
            sqe: host::write_zeroes(nsid, 0, nlb(wz_blocks * block, block), false),
            transfer: Transfer::None,
        };
        ours.run_ok(vec![wz], "the largest Write Zeroes");
        let direct = theirs.read(nsid, block, start, len, "reads from SPDK");
        same(
            "the pattern after the largest Write Zeroes, at SPDK",
            &direct,
            &vec![0; len as usize],
        );
        let tail = blocks * block - MIB;
        let last = pattern(seed + 1, tail, 2);
        let last: Vec<u8> = last
            .into_iter()
            .flat_map(|p| p.1)
            .take(MIB as usize)
            .collect();
        ours.run_ok(writes(nsid, block, tail, &last, max), "the last MiB");
        same(
            "the last MiB at SPDK",
            &theirs.read(nsid, block, tail, MIB, "reads from SPDK"),
            &last,
        );
        let all = deallocate(nsid, &[(0, u32::try_from(blocks).unwrap())]);
        ours.run_ok(vec![all], "deallocating the whole namespace");
        same(
            "the last MiB after deallocating the namespace, at SPDK",
            &theirs.read(nsid, block, tail, MIB, "reads from SPDK"),
            &vec![0; MIB as usize],
        );
        println!(
            "namespace {nsid} ({block}-byte blocks): {n} write commands ({} MiB) with up to {} in flight (remote depth {REMOTE_DEPTH}), read back and zeroed in {:.1} s",
            len / MIB,
            run.peak,
            t.elapsed().as_secs_f64()
        );
    }
    ours.shutdown();
    theirs.shutdown();
    println!("test took {:.1} s", t0.elapsed().as_secs_f64());
}

#[test]
fn a_frozen_spdk_is_namespace_not_ready_in_time_then_serves_again() {
    let _turn = one_at_a_time();
    let t0 = Instant::now();
    let spdk = Spdk::start(&[(64 * MIB, 512)]);
    let front = Front::serve(vec![namespace(1, 512, remote(spdk.addr, 1))]);
    let mut ours = Host::connect(front.addr, FRONT_NQN);
    let mut theirs = Host::connect(spdk.addr, REMOTE_NQN);
    let block = 512;
    let max = ours.max;

    // The pattern: 8 MiB in pieces of up to our MDTS.
    let mut rng = Rng::new(0xf4ee);
    let mut data = vec![0u8; 8 * MIB as usize];
    rng.fill(&mut data);
    let pieces: Vec<(u64, u64)> = {
        let mut at = 0;
        let mut v = Vec::new();
        for s in SIZES.iter().cycle() {
            let n = (*s).min(max).min(data.len() as u64 - at);
            if n == 0 {
                break;
            }
            v.push((at, n));
            at += n;
        }
        v
    };
    let cmds = writes(1, block, 0, &data, max);
    ours.run_ok(cmds, "the pattern");

    // Keep the queue full of writes that write the pattern again (what
    // of them lands, and when, leaves the same bytes), then freeze SPDK.
    let q = &mut ours.q;
    q.set_nonblocking(true).unwrap();
    let mut flying: HashMap<u16, usize> = HashMap::new();
    let mut k = 0usize;
    let mut written_before = 0usize;
    let streaming = Instant::now();
    let mut stopped: Option<Instant> = None;
    let mut at_stop = 0usize;
    // Status and time since the freeze of each answer after it.
    let mut after: Vec<(Status, Duration)> = Vec::new();
    loop {
        if stopped.is_none() {
            if streaming.elapsed() >= Duration::from_millis(700) {
                spdk.signal("STOP");
                stopped = Some(Instant::now());
                at_stop = flying.len();
            } else {
                while let Some(cid) = q.pair().free_cid() {
                    let (at, n) = pieces[k % pieces.len()];
                    let d = data[at as usize..(at + n) as usize].to_vec();
                    q.submit(
                        cid,
                        host::write(1, at / block, nlb(n, block)),
                        Transfer::Write(d),
                    )
                    .unwrap();
                    flying.insert(cid, k);
                    k += 1;
                }
            }
        }
        q.send_some().unwrap();
        let got = q.read_some().expect("our target keeps the connection");
        while let Some(c) = q.poll_completion().unwrap() {
            let i = flying.remove(&c.cid()).unwrap();
            match stopped {
                None => {
                    assert!(
                        c.is_success(),
                        "write {i} before the freeze: {:?}",
                        c.status()
                    );
                    written_before += 1;
                }
                Some(t) => after.push((c.status(), t.elapsed())),
            }
        }
        if let Some(t) = stopped {
            if flying.is_empty() {
                break;
            }
            assert!(
                t.elapsed() < ANSWER_BOUND + Duration::from_secs(10),
                "our target answers too late: {} of {at_stop} commands in flight at the freeze are still unanswered {:?} after it (I/O timeout {IO_TIMEOUT:?}); answers so far, by time since the freeze: {}",
                flying.len(),
                t.elapsed(),
                timeline(after.iter().map(|a| a.1))
            );
        }
        if !got {
            wait_io(q, 2);
        }
    }
    let stopped = stopped.unwrap();
    let not_ready: Vec<Duration> = after
        .iter()
        .filter(|(s, _)| !s.is_success())
        .map(|(s, t)| {
            assert!(
                is_not_ready(*s),
                "a frozen remote's command answered {s:?}, not Namespace Not Ready (sct 0, sc 0x82, retryable)"
            );
            *t
        })
        .collect();
    let last = after.iter().map(|a| a.1).max().unwrap();
    let first = not_ready.iter().min().copied();
    let succeeded: Vec<Duration> = after
        .iter()
        .filter(|(s, _)| s.is_success())
        .map(|a| a.1)
        .collect();
    println!(
        "freeze: {written_before} writes before it; {at_stop} in flight at it: {} answered Namespace Not Ready from {first:?} to {last:?} after, {} succeeded (the last {:?} after)",
        not_ready.len(),
        succeeded.len(),
        succeeded.iter().max()
    );
    assert!(
        at_stop > 2 * usize::from(REMOTE_DEPTH),
        "only {at_stop} commands were in flight at the freeze"
    );
    // Only what SPDK answered before it froze can succeed, and those
    // answers were on their way already: none comes late.
    let late_success = succeeded
        .iter()
        .filter(|t| **t >= Duration::from_secs(1))
        .count();
    assert!(
        !not_ready.is_empty() && late_success == 0,
        "of {at_stop} commands in flight at the freeze, {} answered Namespace Not Ready and {late_success} succeeded a second or more after it",
        not_ready.len()
    );
    assert!(
        last <= ANSWER_BOUND,
        "the last answer came {last:?} after the freeze, past {ANSWER_BOUND:?} (twice the I/O timeout {IO_TIMEOUT:?}, a connection attempt and {MARGIN:?}); answers by time since the freeze: {}",
        timeline(after.iter().map(|a| a.1))
    );
    assert!(
        first.is_some_and(|f| f >= Duration::from_secs(1)),
        "the first Namespace Not Ready came {first:?} after the freeze: before the I/O timeout could have run out"
    );

    // While SPDK stays frozen, new commands (twice the remote depth, all
    // at once) are answered Namespace Not Ready too, within the I/O
    // timeout and the margin (which covers a connection attempt under
    // way).
    let t = Instant::now();
    let mut cmds = reads(1, block, 0, 256 * KIB, 32 * KIB);
    cmds.extend(writes(1, block, 0, &data[..256 * KIB as usize], 32 * KIB));
    let run = ours.run(cmds, "commands while SPDK is frozen");
    let took = t.elapsed();
    for c in &run.done {
        assert!(
            is_not_ready(c.status()),
            "a command while SPDK is frozen answered {:?}, not Namespace Not Ready",
            c.status()
        );
    }
    assert!(
        took <= IO_TIMEOUT + MARGIN,
        "{} new commands to a frozen remote took {took:?}, past the I/O timeout ({IO_TIMEOUT:?}) and {MARGIN:?}",
        run.done.len()
    );
    println!(
        "while frozen: {} new commands answered Namespace Not Ready in {took:?}",
        run.done.len()
    );

    // Frozen for 6 s in all: our target's attempts to connect again meet
    // a stopped SPDK (the kernel accepts, nobody answers the ICReq).
    std::thread::sleep(Duration::from_secs(6).saturating_sub(stopped.elapsed()));
    spdk.signal("CONT");
    let thawed = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        let run = ours.run(reads(1, block, 0, 4 * KIB, 4 * KIB), "a read after SIGCONT");
        let c = &run.done[0];
        if c.is_success() {
            same("the first read after SIGCONT", &c.data, &data[..4096]);
            break;
        }
        assert!(is_not_ready(c.status()), "after SIGCONT: {:?}", c.status());
        assert!(
            thawed.elapsed() < Duration::from_secs(15),
            "I/O through our target did not resume within 15 s of SIGCONT ({tries} reads)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let resumed = thawed.elapsed();
    println!(
        "I/O resumed {:.2} s after SIGCONT ({tries} reads)",
        resumed.as_secs_f64()
    );

    // The data is intact, through our target and at SPDK; writes go on.
    let len = data.len() as u64;
    let back = ours.read(
        1,
        block,
        0,
        len,
        "reads through our target after the freeze",
    );
    same(
        "the pattern through our target after the freeze",
        &back,
        &data,
    );
    let direct = theirs.read(1, block, 0, len, "reads from SPDK after the freeze");
    same("the pattern at SPDK after the freeze", &direct, &data);
    let mut fresh = vec![0u8; MIB as usize];
    rng.fill(&mut fresh);
    ours.run_ok(
        writes(1, block, 16 * MIB, &fresh, max),
        "writes after the freeze",
    );
    let direct = theirs.read(1, block, 16 * MIB, MIB, "reads from SPDK");
    same("a write after the freeze, at SPDK", &direct, &fresh);

    ours.shutdown();
    theirs.shutdown();
    println!("test took {:.1} s", t0.elapsed().as_secs_f64());
}

#[test]
fn a_4096_byte_remote_under_512_byte_blocks_is_refused() {
    let _turn = one_at_a_time();
    let spdk = Spdk::start(&[(16 * MIB, 4096), (16 * MIB, 512)]);
    let target = Target::new();
    let errors = target.apply(&front_config(
        vec![namespace(1, 512, remote(spdk.addr, 1))],
        Vec::new(),
    ));
    assert_eq!(errors.len(), 1, "{errors:?}");
    let msg = errors[0].to_string();
    println!("refused: {msg}");
    assert!(
        msg.contains("512") && msg.contains("4096"),
        "the error names both block sizes: {msg}"
    );
    // The other way round is whole remote blocks: served.
    let errors = target.apply(&front_config(
        vec![namespace(1, 4096, remote(spdk.addr, 2))],
        Vec::new(),
    ));
    assert!(errors.is_empty(), "4096-byte blocks over 512: {errors:?}");
}
