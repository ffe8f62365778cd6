//! A remote namespace (`BackendSpec::Remote`) on a target we did not
//! write: the Linux kernel's nvmet-tcp, in the kernel-nvme guest
//! (`run.sh --kernel-target PORT`: a brd namespace that allows any host,
//! forwarded to this host's 127.0.0.1:PORT). An in-process target of
//! ours serves it (the daemon's control plane for remote namespaces is
//! not there yet); the host library writes a pattern of mixed sizes
//! through our target with more commands in flight than the remote queue
//! depth, reads it back through our target and directly from the kernel
//! target, and Write Zeroes and a deallocating Dataset Management through
//! our target read back as zeros from the kernel target.
//!
//! The guest stays up while the host side runs: its `--host-cmd` waits
//! for a file this test writes when done (or when it fails), and the
//! guest's run is bounded by `--timeout`.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use dpu_e2e::free_port;
use dpu_nvmeof::host::{
    self, Completion, Controller, ControllerInfo, ControllerOptions, HostIdentity, Queue,
    QueueOptions, Transfer,
};
use dpu_nvmeof::spec::{nvm, Sqe};
use dpu_nvmeof::target::RemoteNamespace;
use dpu_nvmeof::{BackendSpec, NamespaceConfig, SubsystemConfig, Target, TargetConfig};
use dpu_nvmeof::{TcpConfig, TcpTransport};
use dpu_rand::Rng;

/// The subsystem our target serves on top of the kernel's.
const FRONT_NQN: &str = "nqn.2024-01.io.dpu-service.test:remote-kernel";
/// The host NQN our target connects to the kernel target with.
const TARGET_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:5d1f0e2a-0000-4000-8000-00000000b001";
/// The host NQN of the host library (to our target and to the kernel's).
const ME: &str = "nqn.2014-08.org.nvmexpress:uuid:5d1f0e2a-0000-4000-8000-00000000b002";
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Commands our target keeps in flight to the kernel target.
const REMOTE_DEPTH: u16 = 16;
/// Entries of the host library's I/O queues (63 commands in flight).
const HOST_ENTRIES: u16 = 64;
/// Sizes of the pattern's pieces, in turn.
const SIZES: [u64; 8] = [
    4 * KIB,
    MIB,
    8 * KIB,
    512 * KIB,
    16 * KIB,
    128 * KIB,
    64 * KIB,
    256 * KIB,
];
/// Bound on the guest's whole run (boot, our I/O, power-off).
const GUEST_TIMEOUT_S: u32 = 240;

/// The kernel-nvme guest with its kernel target up, waiting for this
/// test's host side to end.
struct KernelTarget {
    child: Child,
    log: PathBuf,
    /// Written with the host side's exit status when it is done.
    done: PathBuf,
    port: u16,
}

impl KernelTarget {
    /// Boots the guest with its kernel target on a free host port.
    fn start(dir: &Path) -> Result<Self> {
        let port = free_port();
        let log = dir.join("guest.log");
        let done = dir.join("host-done");
        // The guest's commands: the target's settings, for the record.
        let script = dir.join("guest.sh");
        std::fs::write(
            &script,
            "s=/sys/kernel/config/nvmet/subsystems/$KERNEL_TARGET_NQN\n\
             p=/sys/kernel/config/nvmet/ports/1\n\
             echo \"nvmet: kernel $(uname -r), allow_any_host $(cat $s/attr_allow_any_host), \
             inline_data_size $(cat $p/param_inline_data_size 2>/dev/null || echo -), \
             ram0 $(cat /sys/block/ram0/size) sectors\"\n",
        )?;
        // The host command says the target is up, then waits (at most
        // three minutes) for this test to be done.
        let host_cmd = format!(
            "echo \"==> host side: $KERNEL_TARGET_NQN\"; n=0; \
             while [ ! -s {done} ] && [ $n -lt 1800 ]; do sleep 0.1; n=$((n + 1)); done; \
             exit \"$(cat {done} 2>/dev/null || echo 1)\"",
            done = done.display()
        );
        let child = Command::new(dpu_e2e::tools::kernel_nvme_harness()?)
            .arg("--kernel-target")
            .arg(port.to_string())
            .args(["--ns-size", "64", "--timeout"])
            .arg(GUEST_TIMEOUT_S.to_string())
            .arg("--script")
            .arg(&script)
            .arg("--host-cmd")
            .arg(&host_cmd)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::options().append(true).open(&log)?)
            .spawn()
            .context("starting kernel-nvme")?;
        Ok(Self {
            child,
            log,
            done,
            port,
        })
    }

    /// What the guest and its host command printed so far.
    fn console(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Waits until the kernel target is up and the guest waits for the
    /// host side: the target's NQN.
    fn wait_ready(&mut self, limit: Duration) -> Result<String> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            let nqn = self
                .console()
                .lines()
                .find_map(|l| l.trim().strip_prefix("==> host side: ").map(str::to_owned));
            if let Some(nqn) = nqn {
                return Ok(nqn);
            }
            if let Some(st) = self.child.try_wait()? {
                bail!(
                    "the guest ended ({st}) before its kernel target was up:\n{}",
                    self.console()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!(
            "the guest's kernel target was not up within {limit:?}:\n{}",
            self.console()
        )
    }

    /// Lets the guest power off; fails unless its run succeeded.
    fn finish(mut self) -> Result<String> {
        std::fs::write(&self.done, "0")?;
        let st = self.wait(Duration::from_secs(60))?;
        let console = self.console();
        match st {
            Some(st) if st.success() => Ok(console),
            Some(st) => bail!("the guest's run failed ({st}):\n{console}"),
            None => bail!("the guest did not power off within 60 s:\n{console}"),
        }
    }

    /// Waits up to `limit` for run.sh to end.
    fn wait(&mut self, limit: Duration) -> Result<Option<std::process::ExitStatus>> {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(Some(st));
            }
            if t0.elapsed() >= limit {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for KernelTarget {
    /// A test that failed lets the guest power off the way a finished
    /// one does (run.sh then quits QEMU); should that not happen in
    /// time, SIGTERM makes run.sh kill QEMU as it exits.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = std::fs::write(&self.done, "1");
        if matches!(self.wait(Duration::from_secs(30)), Ok(Some(_))) {
            return;
        }
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        if !matches!(self.wait(Duration::from_secs(15)), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Our target, in-process, serving [`FRONT_NQN`] on a loopback port with
/// one namespace on `remote`.
struct Front {
    _target: Target,
    _transport: TcpTransport,
    addr: SocketAddr,
}

impl Front {
    fn serve(remote: RemoteNamespace, block_size: u32) -> Result<Self> {
        let target = Target::new();
        let any: SocketAddr = "127.0.0.1:0".parse()?;
        let transport = TcpTransport::with_config(
            target.clone(),
            &TcpConfig {
                poll_groups: 2,
                ..TcpConfig::default()
            },
        )?;
        let failed = transport.set_listeners(&BTreeSet::from([any]));
        ensure!(failed.is_empty(), "listening: {failed:?}");
        let addr = transport.bound()[&any];
        let cfg = TargetConfig {
            subsystems: vec![SubsystemConfig {
                nqn: FRONT_NQN.into(),
                serial: "SN-KFRONT".into(),
                model: "remote front".into(),
                allow_any_host: true,
                allowed_hosts: BTreeSet::new(),
                max_namespaces: 4,
                namespaces: vec![NamespaceConfig {
                    eui64: None,
                    nsid: 1,
                    block_size,
                    uuid: [0x31; 16],
                    nguid: [0x32; 16],
                    backend: BackendSpec::Remote(remote),
                    qos: Default::default(),
                }],
                listeners: vec![addr],
                host_qos: Default::default(),
            }],
            discovery: None,
        };
        let errors = target.apply(&cfg);
        ensure!(
            errors.is_empty(),
            "our target refused the kernel target's namespace: {}",
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        );
        Ok(Self {
            _target: target,
            _transport: transport,
            addr,
        })
    }
}

/// A controller of the host library and its one I/O queue.
struct Host {
    ctrl: Controller<TcpStream>,
    q: Queue<TcpStream>,
    /// Largest transfer of one command (MDTS, at most 1 MiB).
    max: u64,
    what: String,
}

/// One I/O command with its data.
struct Cmd {
    sqe: Sqe,
    transfer: Transfer,
}

impl Host {
    fn connect(addr: SocketAddr, nqn: &str, what: &str) -> Result<Self> {
        let me = HostIdentity::new(ME, [0xb5; 16]);
        let opts = ControllerOptions {
            kato: Duration::from_secs(60),
            queue: QueueOptions {
                timeout: Some(Duration::from_secs(30)),
                ..QueueOptions::default()
            },
        };
        let stream = || -> Result<TcpStream> {
            let s = TcpStream::connect(addr)?;
            s.set_nodelay(true)?;
            Ok(s)
        };
        let mut ctrl = Controller::connect(stream()?, &me, nqn, &opts)
            .with_context(|| format!("connecting to {what} ({nqn} at {addr})"))?;
        ensure!(ctrl.set_io_queues(1)? >= 1, "{what}: no I/O queue");
        let entries = u32::from(HOST_ENTRIES).min(ctrl.info().max_queue_entries) as u16;
        let q = ctrl
            .io_queue(stream()?, 1, entries)
            .with_context(|| format!("{what}: I/O queue"))?;
        let max = ctrl.info().max_transfer.map_or(MIB, u64::from).min(MIB);
        Ok(Self {
            ctrl,
            q,
            max,
            what: what.into(),
        })
    }

    fn info(&self) -> &ControllerInfo {
        self.ctrl.info()
    }

    /// Namespace `nsid`'s size in blocks and its block size.
    fn namespace(&mut self, nsid: u32) -> Result<(u64, u64)> {
        let ns = self.ctrl.identify_namespace(nsid)?;
        Ok((ns.blocks, u64::from(ns.block_size)))
    }

    /// Runs `cmds` from one loop without blocking, as many in flight as
    /// the queue takes; fails unless each succeeds within 60 s. Each
    /// command's completion in order, and the most in flight at once.
    fn run_ok(&mut self, cmds: Vec<Cmd>, what: &str) -> Result<(Vec<Completion>, usize)> {
        let q = &mut self.q;
        let what = format!("{} ({what})", self.what);
        q.set_nonblocking(true)?;
        let n = cmds.len();
        let mut todo = cmds.into_iter().enumerate();
        let mut next = todo.next();
        let mut by_cid = HashMap::new();
        let mut done: Vec<Option<Completion>> = (0..n).map(|_| None).collect();
        let mut left = n;
        let mut peak = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while left > 0 {
            ensure!(
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
                    .with_context(|| format!("{what}: submitting command {i}"))?;
                by_cid.insert(cid, i);
                next = todo.next();
            }
            peak = peak.max(q.pair().in_flight());
            q.send_some().with_context(|| format!("{what}: sending"))?;
            let got = q
                .read_some()
                .with_context(|| format!("{what}: receiving"))?;
            while let Some(c) = q.poll_completion()? {
                let i = by_cid
                    .remove(&c.cid())
                    .with_context(|| format!("{what}: a completion for CID {}", c.cid()))?;
                ensure!(
                    c.is_success(),
                    "{what}: command {i} failed: {:?}",
                    c.status()
                );
                done[i] = Some(c);
                left -= 1;
            }
            if !got {
                std::thread::sleep(Duration::from_micros(500));
            }
        }
        q.set_nonblocking(false)?;
        Ok((done.into_iter().flatten().collect(), peak))
    }

    /// Reads `len` bytes at byte `offset` of namespace 1, in commands of
    /// at most this controller's MDTS.
    fn read(&mut self, block: u64, offset: u64, len: u64) -> Result<Vec<u8>> {
        let cmds = reads(block, offset, len, self.max);
        let (done, _) = self.run_ok(cmds, "reads")?;
        Ok(done.into_iter().flat_map(|c| c.data).collect())
    }

    fn shutdown(self) -> Result<()> {
        self.q.disconnect()?;
        self.ctrl.shutdown()?;
        Ok(())
    }
}

/// The 0's based block count of `len` bytes.
fn nlb(len: u64, block: u64) -> u16 {
    (len / block - 1) as u16
}

/// Writes of `data` at byte `offset` of namespace 1, in commands of at
/// most `max` bytes.
fn writes(block: u64, offset: u64, data: &[u8], max: u64) -> Vec<Cmd> {
    data.chunks(max as usize)
        .enumerate()
        .map(|(i, d)| Cmd {
            sqe: host::write(
                1,
                (offset + i as u64 * max) / block,
                nlb(d.len() as u64, block),
            ),
            transfer: Transfer::Write(d.to_vec()),
        })
        .collect()
}

/// Reads of `len` bytes at byte `offset` of namespace 1, in commands of
/// at most `max` bytes.
fn reads(block: u64, offset: u64, len: u64, max: u64) -> Vec<Cmd> {
    (0..len)
        .step_by(max as usize)
        .map(|at| {
            let n = max.min(len - at);
            Cmd {
                sqe: host::read(1, (offset + at) / block, nlb(n, block)),
                transfer: Transfer::Read(vec![0; n as usize]),
            }
        })
        .collect()
}

/// A Dataset Management command deallocating `ranges` (first block,
/// blocks) of namespace 1.
fn deallocate(ranges: &[(u64, u32)]) -> Cmd {
    let mut sqe = host::command(nvm::DSM, 0);
    sqe.0[4..8].copy_from_slice(&1u32.to_le_bytes());
    sqe.0[40..44].copy_from_slice(&(ranges.len() as u32 - 1).to_le_bytes()); // CDW10: NR
    sqe.0[44..48].copy_from_slice(&(1u32 << 2).to_le_bytes()); // CDW11: AD
    let mut data = Vec::new();
    for (slba, blocks) in ranges {
        data.extend_from_slice(&0u32.to_le_bytes());
        data.extend_from_slice(&blocks.to_le_bytes());
        data.extend_from_slice(&slba.to_le_bytes());
    }
    Cmd {
        sqe,
        transfer: Transfer::Write(data),
    }
}

/// Fails unless `got` is `want`, naming the first byte that differs.
fn same(what: &str, got: &[u8], want: &[u8]) -> Result<()> {
    ensure!(
        got.len() == want.len(),
        "{what}: {} bytes, not {}",
        got.len(),
        want.len()
    );
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        bail!(
            "{what}: byte {i} (of {}) is {:#04x}, not {:#04x}",
            want.len(),
            got[i],
            want[i]
        );
    }
    Ok(())
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

#[test]
fn our_target_serves_a_namespace_of_the_linux_kernel_target() -> Result<()> {
    let work = tempfile::tempdir()?;
    let t0 = Instant::now();
    let mut guest = KernelTarget::start(work.path())?;
    let nqn = guest.wait_ready(Duration::from_secs(150))?;
    let up = t0.elapsed();
    let kernel = SocketAddr::from(([127, 0, 0, 1], guest.port));

    let mut theirs = Host::connect(kernel, &nqn, "the kernel target")?;
    let (blocks, block) = theirs.namespace(1)?;
    // The guest runs under emulation and can stall: a generous timeout.
    let mut remote = RemoteNamespace::new(vec![kernel], &nqn, 1, TARGET_HOST);
    remote.queue_depth = REMOTE_DEPTH;
    remote.io_timeout = Duration::from_secs(15);
    let front = Front::serve(remote, block as u32)?;
    let mut ours = Host::connect(front.addr, FRONT_NQN, "our target")?;
    ensure!(
        ours.namespace(1)? == (blocks, block),
        "our target reports the kernel target's namespace size"
    );

    // 40 pieces of mixed sizes (about 10 MiB) from block 3, all in flight.
    let t = Instant::now();
    let mut rng = Rng::new(0x6e76_6d65);
    let start = 3 * block;
    let mut pieces = Vec::new();
    let mut at = start;
    for i in 0..40 {
        let mut d = vec![0u8; SIZES[i % SIZES.len()] as usize];
        rng.fill(&mut d);
        let n = d.len() as u64;
        pieces.push((at, d));
        at += n;
    }
    let mut want: Vec<u8> = pieces.iter().flat_map(|p| p.1.clone()).collect();
    let len = want.len() as u64;
    let max = ours.max;
    let cmds: Vec<Cmd> = pieces
        .iter()
        .flat_map(|(at, d)| writes(block, *at, d, max))
        .collect();
    let n = cmds.len();
    let (_, peak) = ours.run_ok(cmds, "writes")?;
    ensure!(
        peak > usize::from(REMOTE_DEPTH),
        "only {peak} commands were in flight at once"
    );
    let cmds: Vec<Cmd> = pieces
        .iter()
        .flat_map(|(at, d)| reads(block, *at, d.len() as u64, max))
        .collect();
    let (done, _) = ours.run_ok(cmds, "reads")?;
    let back: Vec<u8> = done.into_iter().flat_map(|c| c.data).collect();
    same("read back through our target", &back, &want)?;
    let direct = theirs.read(block, start, len)?;
    same("read back directly from the kernel target", &direct, &want)?;

    // Write Zeroes and a deallocating Dataset Management through our
    // target: zeros at the kernel target, the rest untouched.
    let (wz_at, wz_len) = (start + 5 * block, 300 * KIB);
    let wz = Cmd {
        sqe: host::write_zeroes(1, wz_at / block, nlb(wz_len, block), false),
        transfer: Transfer::None,
    };
    let ranges = [
        (start + 2 * MIB + block, MIB + 7 * block),
        (start + 9 * MIB, 64 * KIB),
    ];
    let dsm = deallocate(&ranges.map(|(at, n)| (at / block, (n / block) as u32)));
    ours.run_ok(vec![wz, dsm], "Write Zeroes and Dataset Management")?;
    for (at, n) in [(wz_at, wz_len)].into_iter().chain(ranges) {
        let i = (at - start) as usize;
        want[i..i + n as usize].fill(0);
    }
    let direct = theirs.read(block, start, len)?;
    same(
        "zeroed ranges read directly from the kernel target",
        &direct,
        &want,
    )?;
    let back = ours.read(block, start, len)?;
    same("zeroed ranges read through our target", &back, &want)?;
    let io = t.elapsed();

    let limits = format!(
        "Linux nvmet: {}\nour target:  {}",
        describe(theirs.info()),
        describe(ours.info())
    );
    ours.shutdown()?;
    theirs.shutdown()?;
    drop(front);
    let console = guest.finish()?;
    for l in console.lines().filter(|l| l.starts_with("nvmet:")) {
        println!("{l}");
    }
    println!("{limits}");
    println!(
        "kernel target up after {:.1} s; {n} write commands ({} MiB) with up to {peak} in flight (remote depth {REMOTE_DEPTH}), read back and zeroed in {:.1} s; {:.1} s in all",
        up.as_secs_f64(),
        len / MIB,
        io.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
