//! `nvmf-perf`: an NVMe/TCP load generator in userspace, for benchmarks of
//! any NVMe/TCP target (ours, SPDK's nvmf_tgt, Linux nvmet).
//!
//! For each job it connects a controller and `--conns` I/O queues (one by
//! default; a controller per 64 queues beyond), keeps `qd` commands in
//! flight on each queue for a fixed time, all from one thread, and prints
//! IOPS, bandwidth and latency percentiles (send of the command capsule
//! to receipt of its completion) over all of them. Many queues are served
//! from one busy-polled epoll set (as `spdk_nvme_perf -P` drives its queue
//! pairs from one sock group), so that the generator reads only sockets
//! with something to read and, at many queues of depth 1, has cycles to
//! spare while the target under test is the bound.
//!
//! ```text
//! nvmf-perf --addr 127.0.0.1:4420 --nqn nqn.2024-01.io.dpu-service:dev \
//!     --job randread:4k:1 --job randread:4k:32 --job randwrite:4k:32 --time 5
//! nvmf-perf --conns 64 --job randread:4k:1     # 64 queues x QD 1
//! nvmf-perf --addr 10.1.0.250:4420 --discover  # the discovery log
//! ```
//!
//! `--memif SOCKET` (built with the feature `memif`) connects through a
//! TCP/IP stack of nvmf-perf's own (smoltcp) on a DPDK `net_memif` client
//! port of the server at SOCKET, as the host `--ip` (10.79.0.5/24) with
//! MAC `--mac`: a target behind a DPDK port, such as the service's storage
//! endpoint in a tenant's network, measured with no kernel network stack
//! on either side. One thread drives that stack; `--auth-flood` is refused.
//!
//! `--discover` runs no job: it asks the discovery controller at `--addr`
//! for its log and prints one line per entry, `TRADDR TRSVCID SUBNQN`.
//!
//! `--auth-flood SECS` runs no job either: it plays a peer that knows an
//! allowed host NQN and tries to authenticate over and over, from
//! `--conns` threads at once, each attempt on a new connection (Connect of
//! an admin queue, AUTH_Negotiate, the Challenge, a Reply made with
//! `--dhchap-secret`, Success1), for SECS seconds or `--flood-attempts`
//! attempts, whichever ends first, then prints what became of them:
//!
//! ```text
//! nvmf-perf --nqn NQN --hostnqn HOST --dhchap-secret WRONG --dh-group ffdhe8192 \
//!     --auth-flood 5 --conns 8
//! auth-flood attempts 812 authenticated 0 refused_at_challenge 805 refused_at_success1 7 abandoned 0 errors 0 secs 5.01
//! ```
//!
//! A refusal at the Challenge came before any DH work (the target's
//! per-address rate, or its DH queue full); one at Success1 came after
//! the target's key pair (the secret judged, or the shared secret's job
//! refused by a full queue). `--dh-group` (repeated, or comma-separated)
//! limits the groups any authentication offers. With `--flood-abandon`
//! each attempt closes its connection right after asking for the
//! Challenge, without waiting for it (counted as `abandoned`): the
//! target's DH work for it finds no one to answer.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};

use rustix::buffer::spare_capacity;
use rustix::event::{epoll, Timespec};
use std::time::{Duration, Instant};

#[cfg(feature = "memif")]
mod memif;

use std::sync::OnceLock;

use dpu_nvmeof::auth::{DhGroup, Secret};
use dpu_nvmeof::host::{self, DhchapHost, HostAuthError};
use dpu_nvmeof::pdu::{self, ControllerPdu, Digests, Limits};
use dpu_nvmeof::spec::{admin, nvm, sgl, Cqe, Sqe};
use dpu_rand::Rng;

type Error = Box<dyn std::error::Error>;

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000001";

/// The host NQN (`--hostnqn`) and DH-HMAC-CHAP secrets (`--dhchap-secret`,
/// `--dhchap-ctrl-secret`), set once from the command line.
struct Identity {
    hostnqn: String,
    secret: Option<Secret>,
    ctrl_secret: Option<Secret>,
    /// DH groups offered (`--dh-group`); empty: all.
    dh_groups: Vec<DhGroup>,
}

static IDENTITY: OnceLock<Identity> = OnceLock::new();

fn hostnqn() -> &'static str {
    IDENTITY.get().map_or(HOSTNQN, |i| i.hostnqn.as_str())
}

/// Authenticates queue `qid` with DH-HMAC-CHAP, as the controller asked in
/// its Connect response.
fn authenticate(q: &mut Queue, qid: u16, nqn: &str) -> Result<(), Error> {
    let id = IDENTITY.get().ok_or("no identity")?;
    let secret = id
        .secret
        .clone()
        .ok_or("the controller requires authentication: give --dhchap-secret")?;
    let mut dh = DhchapHost::new(hostnqn(), nqn, secret, id.ctrl_secret.clone(), qid);
    if !id.dh_groups.is_empty() {
        dh.dh_groups.clone_from(&id.dh_groups);
    }
    let send = |q: &mut Queue, m: &[u8]| q.call(&host::auth_send(0, m.len() as u32), m).map(|_| ());
    let receive = |q: &mut Queue| q.call(&host::auth_receive(0, 4096), &[]).map(|(_, d)| d);
    send(q, &dh.negotiate())?;
    let challenge = receive(q)?;
    let reply = dh.reply(&challenge)?;
    send(q, &reply)?;
    let success1 = receive(q)?;
    match dh.success1(&success1) {
        Ok(Some(s2)) => send(q, &s2),
        Ok(None) => Ok(()),
        Err(e) => {
            if e == HostAuthError::ControllerResponse {
                send(q, &dh.failure2())?;
            }
            Err(format!("queue {qid}: {e}").into())
        }
    }
}

/// What became of the attempts of an `--auth-flood`.
#[derive(Debug, Default, Clone, Copy)]
struct Flood {
    attempts: u64,
    authenticated: u64,
    /// An AUTH_Failure1 instead of the Challenge: refused before DH.
    at_challenge: u64,
    /// An AUTH_Failure1 instead of Success1: the secret was judged (or
    /// the shared secret's job refused).
    at_success1: u64,
    /// Closed after asking for the Challenge (`--flood-abandon`).
    abandoned: u64,
    /// Anything else: a connection refused or closed, a timeout, a
    /// Connect that asked for no authentication.
    errors: u64,
}

/// How long one flood attempt may wait for the target at any step.
const FLOOD_STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// One authentication attempt on a new connection.
fn flood_attempt(addr: &str, nqn: &str, abandon: bool, f: &mut Flood) {
    f.attempts += 1;
    let mut attempt = || -> Result<(), Error> {
        let mut q = Queue::open(addr)?;
        q.sock.set_read_timeout(Some(FLOOD_STEP_TIMEOUT))?;
        let s = host::connect(0, 0, 32, 30_000);
        let d = host::connect_data(*b"nvmf-perf-hostid", 0xffff, nqn, hostnqn());
        let (c, _) = q.call(&s, &d)?;
        if c.dw0 & 1 << 17 == 0 {
            return Err("the Connect asked for no authentication".into());
        }
        let id = IDENTITY.get().ok_or("no identity")?;
        let secret = id
            .secret
            .clone()
            .ok_or("--auth-flood needs --dhchap-secret")?;
        let mut dh = DhchapHost::new(hostnqn(), nqn, secret, None, 1);
        if !id.dh_groups.is_empty() {
            dh.dh_groups.clone_from(&id.dh_groups);
        }
        let negotiate = dh.negotiate();
        q.call(&host::auth_send(0, negotiate.len() as u32), &negotiate)?;
        if abandon {
            let r = host::auth_receive(0, 4096);
            pdu::encode_capsule_cmd(&mut q.out, q.limits.digests, &r, &[]);
            q.flush()?;
            f.abandoned += 1;
            return Ok(());
        }
        let (_, challenge) = q.call(&host::auth_receive(0, 4096), &[])?;
        let reply = match dh.reply(&challenge) {
            Ok(r) => r,
            Err(HostAuthError::Refused { .. }) => {
                f.at_challenge += 1;
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        q.call(&host::auth_send(0, reply.len() as u32), &reply)?;
        let (_, s1) = q.call(&host::auth_receive(0, 4096), &[])?;
        match dh.success1(&s1) {
            Ok(_) => f.authenticated += 1,
            Err(HostAuthError::Refused { .. }) => f.at_success1 += 1,
            Err(e) => return Err(e.into()),
        }
        Ok(())
    };
    if attempt().is_err() {
        f.errors += 1;
    }
}

/// `--auth-flood`: `threads` threads of attempts for `time` or `max`
/// attempts in all.
fn flood(
    addr: &str,
    nqn: &str,
    threads: usize,
    time: Duration,
    max: u64,
    abandon: bool,
) -> (Flood, f64) {
    let start = Instant::now();
    let left = std::sync::atomic::AtomicU64::new(max);
    let take = || {
        left.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |n| n.checked_sub(1),
        )
        .is_ok()
    };
    let total = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut f = Flood::default();
                    while start.elapsed() < time && take() {
                        flood_attempt(addr, nqn, abandon, &mut f);
                    }
                    f
                })
            })
            .collect();
        workers
            .into_iter()
            .filter_map(|w| w.join().ok())
            .fold(Flood::default(), |a, f| Flood {
                attempts: a.attempts + f.attempts,
                authenticated: a.authenticated + f.authenticated,
                at_challenge: a.at_challenge + f.at_challenge,
                at_success1: a.at_success1 + f.at_success1,
                abandoned: a.abandoned + f.abandoned,
                errors: a.errors + f.errors,
            })
    });
    (total, start.elapsed().as_secs_f64())
}

/// One measurement: pattern, block size, queue depth.
#[derive(Debug, Clone, Copy)]
struct Job {
    write: bool,
    random: bool,
    bs: u32,
    qd: u16,
}

impl std::str::FromStr for Job {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let [rw, bs, qd] = parts[..] else {
            return Err(format!(
                "job {s:?}: want PATTERN:BS:QD, e.g. randread:4k:32"
            ));
        };
        let (write, random) = match rw {
            "randread" => (false, true),
            "randwrite" => (true, true),
            "read" => (false, false),
            "write" => (true, false),
            _ => {
                return Err(format!(
                    "job {s:?}: pattern is randread, randwrite, read or write"
                ))
            }
        };
        let bs = match bs.strip_suffix(['k', 'K']) {
            Some(k) => k.parse::<u32>().map(|k| k * 1024),
            None => bs.parse(),
        }
        .map_err(|e| format!("job {s:?}: block size: {e}"))?;
        let qd = qd
            .parse()
            .map_err(|e| format!("job {s:?}: queue depth: {e}"))?;
        if bs == 0 || bs % 512 != 0 || qd == 0 {
            return Err(format!(
                "job {s:?}: block size a multiple of 512, queue depth > 0"
            ));
        }
        Ok(Job {
            write,
            random,
            bs,
            qd,
        })
    }
}

impl std::fmt::Display for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = match (self.random, self.write) {
            (true, false) => "randread",
            (true, true) => "randwrite",
            (false, false) => "read",
            (false, true) => "write",
        };
        write!(f, "{p} {}k QD{}", self.bs / 1024, self.qd)
    }
}

/// A byte stream to a target: a kernel TCP socket, or (with `--memif`) a
/// TCP connection of nvmf-perf's own stack over a DPDK port.
trait Wire: Read + Write {
    /// Reads and writes answer `WouldBlock` instead of waiting.
    fn set_nonblocking(&mut self, on: bool) -> std::io::Result<()>;
    /// A blocking read waits at most this long.
    fn set_read_timeout(&mut self, t: Option<Duration>) -> std::io::Result<()>;
    /// The kernel socket under the stream, if it is one: a job of many
    /// queues waits on those with `epoll` instead of reading each in turn.
    fn fd(&self) -> Option<BorrowedFd<'_>>;
}

impl Wire for TcpStream {
    fn set_nonblocking(&mut self, on: bool) -> std::io::Result<()> {
        TcpStream::set_nonblocking(self, on)
    }
    fn set_read_timeout(&mut self, t: Option<Duration>) -> std::io::Result<()> {
        TcpStream::set_read_timeout(self, t)
    }
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.as_fd())
    }
}

/// Opens a byte stream to `addr`: through the DPDK port's stack when
/// `--memif` set one up, else a kernel TCP socket.
fn dial(addr: &str) -> Result<Box<dyn Wire>, Error> {
    #[cfg(feature = "memif")]
    if let Some(w) = memif::dial(addr)? {
        return Ok(Box::new(w));
    }
    let sock = TcpStream::connect(addr)?;
    sock.set_nodelay(true)?;
    Ok(Box::new(sock))
}

/// A queue: one TCP connection speaking NVMe/TCP as a host.
struct Queue {
    sock: Box<dyn Wire>,
    limits: Limits,
    inbox: Vec<u8>,
    /// Unread bytes are `inbox[start..filled]`.
    start: usize,
    filled: usize,
    out: Vec<u8>,
    /// Bytes of `out` already sent (non-blocking sockets).
    out_sent: usize,
    /// Copy C2HData payloads out (setup); the measured I/O drops them.
    keep_data: bool,
}

impl Queue {
    fn open(addr: &str) -> Result<Queue, Error> {
        let sock = dial(addr)?;
        let mut q = Queue {
            sock,
            limits: Limits {
                digests: Digests::default(),
                max_data: 1 << 22,
            },
            inbox: vec![0; 8 << 20],
            start: 0,
            filled: 0,
            keep_data: true,
            out: Vec::with_capacity(1 << 20),
            out_sent: 0,
        };
        host::ic_req(&mut q.out, Digests::default());
        q.flush()?;
        match q.next()? {
            Owned::IcResp => Ok(q),
            _ => Err("no ICResp".into()),
        }
    }

    fn flush(&mut self) -> Result<(), Error> {
        self.sock.write_all(&self.out)?;
        self.out.clear();
        Ok(())
    }

    /// Sends what the socket takes of the output (all of it on a blocking
    /// socket); true when nothing is left.
    fn send_some(&mut self) -> Result<bool, Error> {
        while self.out_sent < self.out.len() {
            match self.sock.write(&self.out[self.out_sent..]) {
                Ok(0) => return Err("target closed the connection".into()),
                Ok(n) => self.out_sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.out.clear();
        self.out_sent = 0;
        Ok(true)
    }

    /// Reads what has arrived (waits for it on a blocking socket); false
    /// when a non-blocking socket had nothing.
    fn fill(&mut self) -> Result<bool, Error> {
        if self.start == self.filled {
            (self.start, self.filled) = (0, 0);
        } else if self.filled == self.inbox.len() {
            self.inbox.copy_within(self.start..self.filled, 0);
            (self.start, self.filled) = (0, self.filled - self.start);
        }
        match self.sock.read(&mut self.inbox[self.filled..]) {
            Ok(0) => Err("target closed the connection".into()),
            Ok(n) => {
                self.filled += n;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The next controller PDU, reading as needed.
    fn next(&mut self) -> Result<Owned, Error> {
        loop {
            if let Some(o) = self.try_next()? {
                return Ok(o);
            }
            self.fill()?;
        }
    }

    /// The next controller PDU already read, if a whole one is there.
    fn try_next(&mut self) -> Result<Option<Owned>, Error> {
        {
            let unread = &self.inbox[self.start..self.filled];
            if let Some((p, n)) = pdu::decode_controller(unread, &self.limits)? {
                let o = match p {
                    ControllerPdu::IcResp(_) => Owned::IcResp,
                    ControllerPdu::CapsuleResp { cqe } => Owned::Resp(cqe),
                    ControllerPdu::C2HData {
                        cccid,
                        data,
                        success,
                        ..
                    } => Owned::Data {
                        cccid,
                        // Only setup commands keep the data.
                        data: if self.keep_data {
                            data.to_vec()
                        } else {
                            Vec::new()
                        },
                        success,
                    },
                    ControllerPdu::R2T {
                        cccid,
                        ttag,
                        r2to,
                        r2tl,
                    } => Owned::R2T {
                        cccid,
                        ttag,
                        r2to,
                        r2tl,
                    },
                    ControllerPdu::TermReq { fes, .. } => {
                        return Err(format!("target terminated: FES {fes}").into())
                    }
                };
                self.start += n;
                if self.start == self.filled {
                    (self.start, self.filled) = (0, 0);
                }
                return Ok(Some(o));
            }
        }
        Ok(None)
    }

    /// Sends one command and waits for its completion (setup only).
    fn call(&mut self, sqe: &Sqe, data: &[u8]) -> Result<(Cqe, Vec<u8>), Error> {
        pdu::encode_capsule_cmd(&mut self.out, self.limits.digests, sqe, data);
        self.flush()?;
        let mut got = Vec::new();
        loop {
            match self.next()? {
                Owned::Resp(c) if c.status >> 1 != 0 => {
                    return Err(format!(
                        "command {:#x} failed: status {:#x}",
                        sqe.opcode(),
                        c.status
                    )
                    .into())
                }
                Owned::Resp(c) => return Ok((c, got)),
                Owned::Data {
                    data,
                    success,
                    cccid,
                } => {
                    got.extend(data);
                    if success {
                        return Ok((
                            Cqe {
                                cid: cccid,
                                ..Cqe::default()
                            },
                            got,
                        ));
                    }
                }
                _ => return Err("unexpected PDU during setup".into()),
            }
        }
    }
}

enum Owned {
    IcResp,
    Resp(Cqe),
    Data {
        cccid: u16,
        data: Vec<u8>,
        success: bool,
    },
    R2T {
        cccid: u16,
        ttag: u16,
        r2to: u32,
        r2tl: u32,
    },
}

fn connect(q: &mut Queue, qid: u16, cntlid: u16, nqn: &str, entries: u16) -> Result<u16, Error> {
    let kato_ms = if qid == 0 { 30_000 } else { 0 };
    let s = host::connect(0, qid, entries, kato_ms);
    let d = host::connect_data(*b"nvmf-perf-hostid", cntlid, nqn, hostnqn());
    let (c, _) = q.call(&s, &d)?;
    // AUTHREQ.ATR: authenticate before anything else.
    if c.dw0 & 1 << 17 != 0 {
        authenticate(q, qid, nqn)?;
    }
    Ok(c.dw0 as u16)
}

/// The namespace's size in blocks and its block size, and the in-capsule
/// data the I/O queues accept.
fn setup(admin_q: &mut Queue, nqn: &str, queues: u16) -> Result<(u16, u64, u32, u32), Error> {
    let cntlid = connect(admin_q, 0, 0xffff, nqn, 32)?;
    admin_q.call(&host::enable(1), &[])?;
    let mut s = host::command(admin::SET_FEATURES, 2);
    s.0[39] = 0;
    s.0[40] = 0x07;
    let n = u32::from(queues.max(1) - 1);
    s.0[44..48].copy_from_slice(&(n | n << 16).to_le_bytes());
    admin_q.call(&s, &[])?;
    let mut s = host::command(admin::IDENTIFY, 3);
    s.0[32..36].copy_from_slice(&4096u32.to_le_bytes());
    s.0[40] = 1;
    let (_, ctrl) = admin_q.call(&s, &[])?;
    let ioccsz = u32::from_le_bytes(ctrl[1792..1796].try_into()?);
    let in_capsule = (ioccsz * 16).saturating_sub(64);
    let mut s = host::command(admin::IDENTIFY, 4);
    s.0[4..8].copy_from_slice(&1u32.to_le_bytes());
    s.0[32..36].copy_from_slice(&4096u32.to_le_bytes());
    let (_, ns) = admin_q.call(&s, &[])?;
    let blocks = u64::from_le_bytes(ns[0..8].try_into()?);
    let flbas = usize::from(ns[26] & 0xf);
    let lbads = ns[128 + flbas * 4 + 2];
    Ok((cntlid, blocks, 1 << lbads, in_capsule))
}

/// Reads the discovery log of the discovery controller on `q`: one
/// (traddr, trsvcid, subnqn) per entry (NVMe-oF 1.1, 5.3).
fn discover(q: &mut Queue) -> Result<Vec<(String, String, String)>, Error> {
    connect(q, 0, 0xffff, dpu_nvmeof::spec::DISCOVERY_NQN, 32)?;
    q.call(&host::enable(1), &[])?;
    let get_log = |q: &mut Queue, cid: u16, len: u32| -> Result<Vec<u8>, Error> {
        let mut s = host::command(admin::GET_LOG_PAGE, cid);
        s.0[32..36].copy_from_slice(&len.to_le_bytes());
        let numdl = len / 4 - 1;
        s.0[40..44].copy_from_slice(&(0x70 | (numdl & 0xffff) << 16).to_le_bytes());
        s.0[44..48].copy_from_slice(&(numdl >> 16).to_le_bytes());
        Ok(q.call(&s, &[])?.1)
    };
    let head = get_log(q, 2, 1024)?;
    let numrec = u64::from_le_bytes(head.get(8..16).ok_or("short log")?.try_into()?);
    // At most 255 entries: a page of up to 256 KiB.
    let n = numrec.min(255) as u32;
    let log = get_log(q, 3, 1024 * (n + 1))?;
    let text = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .trim_end_matches(['\0', ' '])
            .to_string()
    };
    Ok(log
        .chunks_exact(1024)
        .skip(1)
        .take(n as usize)
        .map(|e| (text(&e[512..768]), text(&e[32..64]), text(&e[256..512])))
        .collect())
}

struct Result_ {
    ios: u64,
    secs: f64,
    lat_ns: Vec<u32>,
}

/// One I/O queue of a job and what is in flight on it.
struct Stream {
    q: Queue,
    sent_at: Vec<Instant>,
    /// Picks the random job's offsets: seeded with the stream's index,
    /// so a run repeats the same offsets.
    rng: Rng,
    seq: u64,
    outstanding: u16,
}

/// Where the job's queues go: the namespace's shape and what the
/// target accepts in a capsule.
#[derive(Clone, Copy)]
struct Namespace {
    blocks: u64,
    lba: u32,
    in_capsule: u32,
}

/// Most I/O queues one controller of a job gets; more connections open
/// more controllers (as that many hosts would).
const QUEUES_PER_CONTROLLER: usize = 64;

/// Runs `job` on `conns` I/O queues from this one thread for `time`:
/// `conns` above [`QUEUES_PER_CONTROLLER`] open several controllers, each
/// over its own admin queue. With more than one queue the sockets are
/// polled without blocking, as `spdk_nvme_perf -P` drives its queues.
fn run(addr: &str, nqn: &str, job: Job, conns: usize, time: Duration) -> Result<Result_, Error> {
    let mut admins = Vec::new();
    let mut streams = Vec::with_capacity(conns);
    let mut ns = None;
    while streams.len() < conns {
        let per = (conns - streams.len()).min(QUEUES_PER_CONTROLLER);
        let mut a = Queue::open(addr)?;
        let (cntlid, blocks, lba, in_capsule) = setup(&mut a, nqn, per as u16)?;
        ns = Some(Namespace {
            blocks,
            lba,
            in_capsule,
        });
        admins.push(a);
        for qid in 1..=per as u16 {
            let mut q = Queue::open(addr)?;
            connect(&mut q, qid, cntlid, nqn, job.qd.max(2) + 1)?;
            q.keep_data = false;
            let i = streams.len() as u64;
            streams.push(Stream {
                q,
                sent_at: vec![Instant::now(); usize::from(job.qd)],
                rng: Rng::new(i),
                seq: i * 7919,
                outstanding: job.qd,
            });
        }
    }
    let ns = ns.ok_or("no connections")?;
    if streams.len() > 1 {
        for st in &mut streams {
            st.q.sock.set_nonblocking(true)?;
        }
    }
    let per = u64::from(job.bs / ns.lba);
    let span = (ns.blocks / per).max(1);
    let data = vec![0xa5u8; job.bs as usize];
    let mut lat = Vec::with_capacity(1 << 20);
    let mut ios = 0u64;
    let issue = |st: &mut Stream, cid: u16| {
        let slot = if job.random {
            st.rng.below(span)
        } else {
            st.seq = (st.seq + 1) % span;
            st.seq
        };
        let mut s = host::command(if job.write { nvm::WRITE } else { nvm::READ }, cid);
        s.0[4..8].copy_from_slice(&1u32.to_le_bytes());
        s.0[32..36].copy_from_slice(&job.bs.to_le_bytes());
        s.0[40..48].copy_from_slice(&(slot * per).to_le_bytes());
        s.0[48..50].copy_from_slice(&((per - 1) as u16).to_le_bytes());
        if job.write && job.bs <= ns.in_capsule {
            s.0[39] = sgl::IN_CAPSULE;
            pdu::encode_capsule_cmd(&mut st.q.out, Digests::default(), &s, &data);
        } else {
            pdu::encode_capsule_cmd(&mut st.q.out, Digests::default(), &s, &[]);
        }
        st.sent_at[usize::from(cid)] = Instant::now();
    };
    let start = Instant::now();
    let end = start + time;
    for st in &mut streams {
        for cid in 0..job.qd {
            issue(st, cid);
        }
        st.q.send_some()?;
    }
    let active = std::cell::Cell::new(streams.len());
    // One queue's turn: what arrived, its completions (each reissued
    // until the time is up), then what the socket takes of the output.
    // True while output is left over.
    let mut serve = |st: &mut Stream| -> Result<bool, Error> {
        st.q.fill()?;
        while let Some(p) = st.q.try_next()? {
            let cid = match p {
                Owned::Resp(c) => {
                    if c.status >> 1 != 0 {
                        return Err(format!("I/O failed: status {:#x}", c.status).into());
                    }
                    c.cid
                }
                Owned::Data { cccid, success, .. } if success => cccid,
                Owned::Data { .. } => continue,
                Owned::R2T {
                    cccid,
                    ttag,
                    r2to,
                    r2tl,
                } => {
                    let chunk = &data[r2to as usize..(r2to + r2tl) as usize];
                    pdu::encode_h2c_data(
                        &mut st.q.out,
                        Digests::default(),
                        cccid,
                        ttag,
                        r2to,
                        chunk,
                        true,
                    );
                    continue;
                }
                Owned::IcResp => return Err("unexpected ICResp".into()),
            };
            let now = Instant::now();
            let Some(at) = st.sent_at.get(usize::from(cid)) else {
                return Err(format!("completion of unknown command {cid}").into());
            };
            lat.push(now.duration_since(*at).as_nanos().min(u128::from(u32::MAX)) as u32);
            ios += 1;
            if now < end {
                issue(st, cid);
            } else {
                st.outstanding -= 1;
                if st.outstanding == 0 {
                    active.set(active.get() - 1);
                }
            }
        }
        Ok(!st.q.send_some()?)
    };
    let fds: Option<Vec<BorrowedFd<'_>>> = if streams.len() > 1 {
        streams.iter().map(|st| st.q.sock.fd()).collect()
    } else {
        None
    };
    match fds {
        // Kernel sockets: busy-poll one epoll set and serve the queues it
        // names, as SPDK's perf drives its queue pairs from a sock group.
        // Reading every socket in turn would cost a system call per idle
        // queue and make the generator, not the target, the measure.
        Some(fds) => {
            let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
            for (i, fd) in fds.iter().enumerate() {
                epoll::add(
                    &ep,
                    fd,
                    epoll::EventData::new_u64(i as u64),
                    epoll::EventFlags::IN,
                )?;
            }
            drop(fds);
            let mut events = Vec::with_capacity(streams.len().min(1024));
            let mut waiting = Vec::new();
            let zero = Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            while active.get() > 0 {
                events.clear();
                match epoll::wait(&ep, spare_capacity(&mut events), Some(&zero)) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
                for ev in &events {
                    let st = &mut streams[ev.data.u64() as usize];
                    if st.outstanding > 0 && serve(st)? {
                        waiting.push(ev.data.u64() as usize);
                    }
                }
                // Output a full socket left: tried again each turn.
                let mut i = 0;
                while i < waiting.len() {
                    if streams[waiting[i]].q.send_some()? {
                        waiting.swap_remove(i);
                    } else {
                        i += 1;
                    }
                }
            }
        }
        None => {
            while active.get() > 0 {
                for st in streams.iter_mut().filter(|s| s.outstanding > 0) {
                    serve(st)?;
                }
            }
        }
    }
    drop(admins);
    Ok(Result_ {
        ios,
        secs: start.elapsed().as_secs_f64(),
        lat_ns: lat,
    })
}

fn pct(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

fn main() -> Result<(), Error> {
    let mut addr = "127.0.0.1:4420".to_string();
    let mut nqn = "nqn.2024-01.io.dpu-service:dev".to_string();
    let mut jobs: Vec<Job> = Vec::new();
    let mut time = Duration::from_secs(5);
    let mut conns = 1usize;
    let mut discovery = false;
    let mut auth_flood: Option<Duration> = None;
    let mut flood_attempts = u64::MAX;
    let mut flood_abandon = false;
    let mut memif: Option<String> = None;
    let (mut host_ip, mut host_mac) = (None, None);
    let mut id = Identity {
        hostnqn: HOSTNQN.to_string(),
        secret: None,
        ctrl_secret: None,
        dh_groups: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--addr" => addr = val()?,
            "--nqn" => nqn = val()?,
            "--job" => jobs.push(val()?.parse()?),
            "--time" => time = Duration::from_secs_f64(val()?.parse()?),
            "--conns" => {
                conns = val()?.parse()?;
                if conns == 0 {
                    return Err("--conns takes a count of at least 1".into());
                }
            }
            "--hostnqn" => id.hostnqn = val()?,
            "--dhchap-secret" => id.secret = Some(val()?.parse()?),
            "--dhchap-ctrl-secret" => id.ctrl_secret = Some(val()?.parse()?),
            "--dh-group" => {
                for name in val()?.split(',') {
                    let g = DhGroup::ALL
                        .into_iter()
                        .find(|g| g.name() == name)
                        .ok_or_else(|| {
                            format!("--dh-group {name:?}: null or ffdhe2048..ffdhe8192")
                        })?;
                    id.dh_groups.push(g);
                }
            }
            "--auth-flood" => {
                let secs: f64 = val()?.parse()?;
                if !(secs > 0.0 && secs <= 3600.0) {
                    return Err("--auth-flood takes seconds, above 0 and at most 3600".into());
                }
                auth_flood = Some(Duration::from_secs_f64(secs));
            }
            "--flood-attempts" => flood_attempts = val()?.parse()?,
            "--flood-abandon" => flood_abandon = true,
            "--memif" => memif = Some(val()?),
            "--ip" => host_ip = Some(val()?),
            "--mac" => host_mac = Some(val()?),
            "--bench" => {}
            "--discover" => discovery = true,
            "-h" | "--help" => {
                println!("usage: nvmf-perf [--addr HOST:PORT] [--nqn NQN] [--time SECS] [--conns N] [--job PATTERN:BS:QD]... [--hostnqn NQN] [--dhchap-secret DHHC-1:..] [--dhchap-ctrl-secret DHHC-1:..] [--dh-group NAME[,NAME]..] [--discover] [--auth-flood SECS [--flood-attempts N] [--flood-abandon]] [--memif SOCKET [--ip A.B.C.D/LEN] [--mac MAC]]");
                return Ok(());
            }
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    if IDENTITY.set(id).is_err() {
        return Err("identity set twice".into());
    }
    match memif {
        #[cfg(feature = "memif")]
        Some(socket) => {
            if auth_flood.is_some() {
                return Err("--auth-flood runs threads; --memif has one stack for one thread".into());
            }
            let mut s = memif::Settings::new(socket);
            if let Some(ip) = host_ip {
                s.set_ip(&ip)?;
            }
            if let Some(mac) = host_mac {
                s.set_mac(&mac)?;
            }
            memif::start(&s)?;
        }
        #[cfg(not(feature = "memif"))]
        Some(_) => return Err("--memif: this nvmf-perf was built without the memif feature (cargo build -p dpu-nvmeof --features memif)".into()),
        None if host_ip.is_some() || host_mac.is_some() => {
            return Err("--ip and --mac are the host's on the --memif port".into())
        }
        None => {}
    }
    if let Some(time) = auth_flood {
        let (f, secs) = flood(&addr, &nqn, conns, time, flood_attempts, flood_abandon);
        println!(
            "auth-flood attempts {} authenticated {} refused_at_challenge {} refused_at_success1 {} abandoned {} errors {} secs {secs:.2}",
            f.attempts, f.authenticated, f.at_challenge, f.at_success1, f.abandoned, f.errors
        );
        return Ok(());
    }
    if discovery {
        for (traddr, trsvcid, subnqn) in discover(&mut Queue::open(&addr)?)? {
            println!("{traddr} {trsvcid} {subnqn}");
        }
        return Ok(());
    }
    if jobs.is_empty() {
        jobs = [
            "randread:4k:1",
            "randread:4k:32",
            "randread:4k:128",
            "randwrite:4k:32",
            "read:128k:16",
        ]
        .iter()
        .map(|j| j.parse().expect("default jobs parse"))
        .collect();
    }
    let mut admin_q = Queue::open(&addr)?;
    let (_, blocks, lba, in_capsule) = setup(&mut admin_q, &nqn, 1)?;
    println!("# {addr} {nqn}: {blocks} blocks of {lba} bytes, in-capsule data up to {in_capsule} bytes, {time:?} per job, {conns} I/O queue(s) per job");
    println!(
        "{:<22} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "job", "IOPS", "MB/s", "p50 us", "p99 us", "p99.9 us", "max us"
    );
    for job in &jobs {
        let mut r = run(&addr, &nqn, *job, conns, time)?;
        r.lat_ns.sort_unstable();
        let iops = r.ios as f64 / r.secs;
        let name = if conns > 1 {
            format!("{job}x{conns}")
        } else {
            job.to_string()
        };
        println!(
            "{:<22} {:>10.0} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            name,
            iops,
            iops * f64::from(job.bs) / 1e6,
            pct(&r.lat_ns, 0.5),
            pct(&r.lat_ns, 0.99),
            pct(&r.lat_ns, 0.999),
            pct(&r.lat_ns, 1.0),
        );
    }
    Ok(())
}
