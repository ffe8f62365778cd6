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
//! The protocol is the library's host side ([`dpu_nvmeof::host`]):
//! controllers and queues are brought up with it, and the measured loop
//! submits to and polls its queues; what stays here is the load: jobs,
//! the epoll set over the queues, latencies and the report.
//!
//! `--memif SOCKET` (built with the feature `memif`) connects through a
//! TCP/IP stack of nvmf-perf's own (smoltcp) on a DPDK `net_memif` client
//! port of the server at SOCKET, as the host `--ip` (10.79.0.5/24) with
//! MAC `--mac`: a target behind a DPDK port, such as the service's storage
//! endpoint in a tenant's network, measured with no kernel network stack
//! on either side. One thread drives that stack; `--auth-flood` is refused.
//!
//! `--sleep` waits in `epoll_wait` for the queues instead of busy
//! polling them, so that several generators (two hosts against one poll
//! group, say) can share a core without taking turns by time slice.
//!
//! `--tls-key FILE` makes every connection a TLS 1.3 session first (the
//! NVMe/TCP secure channel), with the host's configured PSK read from FILE
//! in the interchange format (`NVMeTLSkey-1:01:...:`), the identity of
//! `--tls-identity` version 0 or 1 (default 1) naming `--hostnqn` and the
//! subsystem.
//!
//! `--discover` runs no job: it asks the discovery controller at `--addr`
//! for its log and prints one line per entry, `TRADDR TRSVCID SUBNQN`,
//! followed by `tls=required` or `tls=allowed` for a port that speaks TLS.
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

use std::net::TcpStream;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rustix::buffer::spare_capacity;
use rustix::event::{epoll, Timespec};

#[cfg(feature = "memif")]
mod memif;

use dpu_nvmeof::auth::DhGroup;
use dpu_nvmeof::dpu_tls::{ConfiguredPsk, Connector};
use dpu_nvmeof::host::{
    self, Controller, ControllerOptions, DhchapHost, HostAuthError, HostIdentity, Queue,
    QueueOptions, Transfer, Wire,
};
use dpu_rand::Rng;

type Error = Box<dyn std::error::Error>;

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000001";
const HOSTID: [u8; 16] = *b"nvmf-perf-hostid";

/// The host: its NQN (`--hostnqn`), DH-HMAC-CHAP secrets
/// (`--dhchap-secret`, `--dhchap-ctrl-secret`) and DH groups
/// (`--dh-group`), set once from the command line.
static IDENTITY: OnceLock<HostIdentity> = OnceLock::new();

fn identity() -> Result<&'static HostIdentity, Error> {
    IDENTITY.get().ok_or_else(|| "no identity".into())
}

/// The host's TLS key and identity version (`--tls-key`,
/// `--tls-identity`), set once from the command line.
static TLS: OnceLock<Option<(ConfiguredPsk, u8)>> = OnceLock::new();

/// How every controller and queue is set up: PDUs of up to 4 MiB of data,
/// a 30-second keep-alive timeout on admin queues, 30 seconds for any
/// answer during setup.
fn options() -> ControllerOptions {
    ControllerOptions {
        queue: QueueOptions {
            max_data: 1 << 22,
            ..QueueOptions::default()
        },
        ..ControllerOptions::default()
    }
}

/// A queue on any byte stream [`dial`] opens.
type Q = Queue<Box<dyn Wire>>;

/// The library's error, naming the option that was missing.
fn hint(e: host::Error) -> Error {
    match e {
        host::Error::AuthRequired { .. } => format!("{e}: give --dhchap-secret").into(),
        e => e.into(),
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
        let id = identity()?;
        let opts = QueueOptions {
            timeout: Some(FLOOD_STEP_TIMEOUT),
            ..options().queue
        };
        let mut q: Q = Queue::open(dial(addr, nqn)?, &opts)?;
        let d = host::connect_data(HOSTID, 0xffff, nqn, &id.nqn);
        let c = q.call(host::connect(0, 0, 32, 30_000), Transfer::Write(d))?;
        if c.cqe.dw0 & 1 << 17 == 0 {
            return Err("the Connect asked for no authentication".into());
        }
        let secret = id
            .secret
            .clone()
            .ok_or("--auth-flood needs --dhchap-secret")?;
        let mut dh = DhchapHost::new(&id.nqn, nqn, secret, None, 1);
        if !id.dh_groups.is_empty() {
            dh.dh_groups.clone_from(&id.dh_groups);
        }
        host::auth::send(&mut q, &dh.negotiate())?;
        if abandon {
            let r = host::auth_receive(0, 4096);
            q.submit(0, r, Transfer::Read(vec![0; 4096]))?;
            q.flush()?;
            f.abandoned += 1;
            return Ok(());
        }
        let challenge = host::auth::receive(&mut q)?;
        let reply = match dh.reply(&challenge) {
            Ok(r) => r,
            Err(HostAuthError::Refused { .. }) => {
                f.at_challenge += 1;
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        host::auth::send(&mut q, &reply)?;
        let s1 = host::auth::receive(&mut q)?;
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

/// Opens a byte stream to `addr` for a queue of subsystem `subnqn`:
/// through the DPDK port's stack when `--memif` set one up, else a kernel
/// TCP socket, in a TLS session with `--tls-key`.
fn dial(addr: &str, subnqn: &str) -> Result<Box<dyn Wire>, Error> {
    #[cfg(feature = "memif")]
    if let Some(w) = memif::dial(addr)? {
        return Ok(Box::new(w));
    }
    let sock = TcpStream::connect(addr)?;
    sock.set_nodelay(true)?;
    if let Some(Some((key, version))) = TLS.get() {
        let c = Connector::for_key(key, *version, &identity()?.nqn, subnqn)?;
        return Ok(Box::new(c.connect(sock)?));
    }
    Ok(Box::new(sock))
}

struct Result_ {
    ios: u64,
    secs: f64,
    lat_ns: Vec<u32>,
}

/// One I/O queue of a job and what is in flight on it.
struct Stream {
    q: Q,
    sent_at: Vec<Instant>,
    /// Picks the random job's offsets: seeded with the stream's index,
    /// so a run repeats the same offsets.
    rng: Rng,
    seq: u64,
    outstanding: u16,
}

/// Where the job's queues go: the namespace's shape (the queues know
/// what the target accepts in a capsule).
#[derive(Clone, Copy)]
struct Namespace {
    blocks: u64,
    lba: u32,
}

/// Most I/O queues one controller of a job gets; more connections open
/// more controllers (as that many hosts would).
const QUEUES_PER_CONTROLLER: usize = 64;

/// Runs `job` on `conns` I/O queues from this one thread for `time`:
/// `conns` above [`QUEUES_PER_CONTROLLER`] open several controllers, each
/// over its own admin queue. With more than one queue the sockets are
/// polled without blocking, as `spdk_nvme_perf -P` drives its queues.
///
/// With `sleep` the thread sleeps in `epoll_wait` until a queue has
/// something, instead of busy polling: slower, but several generators
/// can then share a core (`--sleep`).
fn run(
    addr: &str,
    nqn: &str,
    job: Job,
    conns: usize,
    time: Duration,
    sleep: bool,
) -> Result<Result_, Error> {
    let id = identity()?;
    let opts = options();
    let mut admins = Vec::new();
    let mut streams = Vec::with_capacity(conns);
    let mut ns = None;
    while streams.len() < conns {
        let per = (conns - streams.len()).min(QUEUES_PER_CONTROLLER);
        let mut c = Controller::connect(dial(addr, nqn)?, id, nqn, &opts).map_err(hint)?;
        c.set_io_queues(per as u16)?;
        let size = c.identify_namespace(1)?;
        ns = Some(Namespace {
            blocks: size.blocks,
            lba: size.block_size,
        });
        for qid in 1..=per as u16 {
            let entries = job.qd.max(2).saturating_add(1);
            let q = c.io_queue(dial(addr, nqn)?, qid, entries).map_err(hint)?;
            let i = streams.len() as u64;
            streams.push(Stream {
                q,
                sent_at: vec![Instant::now(); usize::from(job.qd)],
                rng: Rng::new(i),
                seq: i * 7919,
                outstanding: job.qd,
            });
        }
        admins.push(c);
    }
    let ns = ns.ok_or("no connections")?;
    if streams.len() > 1 {
        for st in &mut streams {
            st.q.set_nonblocking(true)?;
        }
    }
    let per = u64::from(job.bs / ns.lba);
    let span = (ns.blocks / per).max(1);
    let nlb = (per - 1) as u16;
    // One pattern, shared by every write in flight.
    let data: Arc<[u8]> = vec![0xa5u8; job.bs as usize].into();
    let mut lat = Vec::with_capacity(1 << 20);
    let mut ios = 0u64;
    let issue = |st: &mut Stream, cid: u16| -> Result<(), Error> {
        let slot = if job.random {
            st.rng.below(span)
        } else {
            st.seq = (st.seq + 1) % span;
            st.seq
        };
        let (sqe, transfer) = if job.write {
            (
                host::write(1, slot * per, nlb),
                Transfer::WriteShared(data.clone()),
            )
        } else {
            (host::read(1, slot * per, nlb), Transfer::Discard(job.bs))
        };
        st.q.submit(cid, sqe, transfer)?;
        st.sent_at[usize::from(cid)] = Instant::now();
        Ok(())
    };
    let start = Instant::now();
    let end = start + time;
    for st in &mut streams {
        for cid in 0..job.qd {
            issue(st, cid)?;
        }
        st.q.send_some()?;
    }
    let active = std::cell::Cell::new(streams.len());
    // One queue's turn: what arrived, its completions (each reissued
    // until the time is up), then what the socket takes of the output.
    // True while output is left over.
    let mut serve = |st: &mut Stream| -> Result<bool, Error> {
        st.q.read_some()?;
        while let Some(c) = st.q.poll_completion()? {
            if !c.is_success() {
                return Err(format!("I/O failed: status {:#x}", c.cqe.status).into());
            }
            let cid = c.cid();
            let now = Instant::now();
            let Some(at) = st.sent_at.get(usize::from(cid)) else {
                return Err(format!("completion of unknown command {cid}").into());
            };
            lat.push(now.duration_since(*at).as_nanos().min(u128::from(u32::MAX)) as u32);
            ios += 1;
            if now < end {
                issue(st, cid)?;
            } else {
                st.outstanding -= 1;
                if st.outstanding == 0 {
                    active.set(active.get() - 1);
                }
            }
        }
        Ok(!st.q.send_some()?)
    };
    let fds: Option<Vec<BorrowedFd<'_>>> = if streams.len() > 1 || sleep {
        streams.iter().map(|st| st.q.wire().fd()).collect()
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
                // Sleeping, but not while output waits for room.
                let timeout = (!sleep || !waiting.is_empty()).then_some(&zero);
                match epoll::wait(&ep, spare_capacity(&mut events), timeout) {
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

/// Runs, and reports a failure as its message (the library's errors
/// say what went wrong in words; their `Debug` form does not).
fn main() -> std::process::ExitCode {
    match perf() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn perf() -> Result<(), Error> {
    let mut addr = "127.0.0.1:4420".to_string();
    let mut nqn = "nqn.2024-01.io.dpu-service:dev".to_string();
    let mut jobs: Vec<Job> = Vec::new();
    let mut time = Duration::from_secs(5);
    let mut conns = 1usize;
    let mut sleep = false;
    let mut discovery = false;
    let mut auth_flood: Option<Duration> = None;
    let mut flood_attempts = u64::MAX;
    let mut flood_abandon = false;
    let mut memif: Option<String> = None;
    let (mut host_ip, mut host_mac) = (None, None);
    let mut id = HostIdentity::new(HOSTNQN, HOSTID);
    let mut tls_key: Option<ConfiguredPsk> = None;
    let mut tls_version = 1u8;
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
            "--hostnqn" => id.nqn = val()?,
            "--dhchap-secret" => id.secret = Some(val()?.parse()?),
            "--dhchap-ctrl-secret" => id.ctrl_secret = Some(val()?.parse()?),
            "--tls-key" => {
                let path = val()?;
                let text =
                    std::fs::read_to_string(&path).map_err(|e| format!("--tls-key {path}: {e}"))?;
                tls_key = Some(
                    ConfiguredPsk::parse(&text).map_err(|e| format!("--tls-key {path}: {e}"))?,
                );
            }
            "--tls-identity" => {
                tls_version = match val()?.as_str() {
                    "0" => 0,
                    "1" => 1,
                    v => return Err(format!("--tls-identity {v}: 0 or 1").into()),
                }
            }
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
            "--sleep" => sleep = true,
            "--bench" => {}
            "--discover" => discovery = true,
            "-h" | "--help" => {
                println!("usage: nvmf-perf [--addr HOST:PORT] [--nqn NQN] [--time SECS] [--conns N] [--sleep] [--job PATTERN:BS:QD]... [--hostnqn NQN] [--dhchap-secret DHHC-1:..] [--dhchap-ctrl-secret DHHC-1:..] [--dh-group NAME[,NAME]..] [--tls-key FILE [--tls-identity 0|1]] [--discover] [--auth-flood SECS [--flood-attempts N] [--flood-abandon]] [--memif SOCKET [--ip A.B.C.D/LEN] [--mac MAC]]");
                return Ok(());
            }
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    if IDENTITY.set(id).is_err() {
        return Err("identity set twice".into());
    }
    if TLS.set(tls_key.map(|k| (k, tls_version))).is_err() {
        return Err("TLS key set twice".into());
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
        let mut c = Controller::discovery(
            dial(&addr, dpu_nvmeof::spec::DISCOVERY_NQN)?,
            identity()?,
            &options(),
        )
        .map_err(hint)?;
        for e in c.discovery_log()? {
            match e.tls() {
                None => println!("{} {} {}", e.traddr, e.trsvcid, e.subnqn),
                Some(true) => println!("{} {} {} tls=required", e.traddr, e.trsvcid, e.subnqn),
                Some(false) => println!("{} {} {} tls=allowed", e.traddr, e.trsvcid, e.subnqn),
            }
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
    // Held to the end, as a host keeps its controller.
    let mut admin =
        Controller::connect(dial(&addr, &nqn)?, identity()?, &nqn, &options()).map_err(hint)?;
    admin.set_io_queues(1)?;
    let size = admin.identify_namespace(1)?;
    let (blocks, lba) = (size.blocks, size.block_size);
    let in_capsule = admin.info().in_capsule;
    println!("# {addr} {nqn}: {blocks} blocks of {lba} bytes, in-capsule data up to {in_capsule} bytes, {time:?} per job, {conns} I/O queue(s) per job");
    println!(
        "{:<22} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "job", "IOPS", "MB/s", "p50 us", "p99 us", "p99.9 us", "max us"
    );
    for job in &jobs {
        let mut r = run(&addr, &nqn, *job, conns, time, sleep)?;
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
