//! Hostile and numerous NVMe/TCP peers against the real binary. Each
//! attack runs while a well-behaved host keeps its Keep Alive going and a
//! well-behaved `nvmf-perf` job (4 KiB random reads, QD 4) runs before and
//! during the attack; each asserts that the daemon stays up, its memory
//! and threads stay within a bound, the job is still served, and the
//! refusal is counted on `/metrics`:
//! - a flood of connections (refused past the per-address limit), and one
//!   of 10,000 sockets (refused past the total limit);
//! - a thousand connected, idle hosts (no thread each, little memory);
//! - a host announcing a thousand 512 KiB writes by R2T without sending
//!   their data (to the discovery controller, where no allow list applies);
//! - sockets that never send ICReq, stop halfway through it, or stop
//!   halfway through a command capsule;
//! - a host that stops reading its socket;
//! - an I/O queue Connect naming another host's controller;
//! - a host revoked over the API while connected.
//!
//! How much of its IOPS the job keeps is a measurement, not a test: each
//! test prints a `hostile:` line with both figures, and
//! `tests/bench/nvme-hostile.sh` runs the tests alone, with longer jobs,
//! and tabulates them (docs/benchmarks/nvme-hostile.md). The tests of this
//! file run one at a time, so that those figures are each attack's own.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use dpu_e2e::net::metric;
use dpu_e2e::{free_port, nvmf_perf_iops, Service};
use dpu_nvmeof::host;
use dpu_nvmeof::pdu::{self, ControllerPdu, Digests, Limits};
use dpu_nvmeof::spec::{admin, nvm, DISCOVERY_NQN};

const NQN: &str = "nqn.2024-01.io.dpu-service.test:hostile";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:e2e-hostile-friend";
/// A second allowed host, the attacker where one must be allowed.
const HOST2: &str = "nqn.2014-08.org.nvmexpress:uuid:e2e-hostile-other";
/// The host NQN `nvmf-perf` connects with.
const PERF_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000001";

/// The tests of this file one at a time, and apart from the other floods:
/// each attack's figures are its own.
fn serial() -> MutexGuard<'static, ()> {
    crate::floods()
}

/// Seconds each `nvmf-perf` job runs: `DPU_HOSTILE_PERF_SECS` (the
/// benchmark sets it), else half a second: long enough to show the host
/// is served.
fn perf_secs() -> String {
    std::env::var("DPU_HOSTILE_PERF_SECS").unwrap_or_else(|_| "0.5".into())
}

/// IOPS of a well-behaved `nvmf-perf` job (4 KiB random reads, QD 4, one
/// I/O queue, [`perf_secs`]) against the subsystem on `port`.
fn perf(port: u16) -> Result<f64> {
    nvmf_perf_iops(
        port,
        NQN,
        &["--time", &perf_secs(), "--job", "randread:4k:4"],
    )
}

/// The well-behaved job is still served while an attack that stays in
/// place (sockets held open) goes on.
fn keeps_its_iops(port: u16, before: f64, attack: &str) -> Result<()> {
    kept_its_iops(before, perf(port)?, attack);
    Ok(())
}

/// The well-behaved job did I/O during an attack; both figures go to the
/// benchmark's `hostile:` line.
fn kept_its_iops(before: f64, during: f64, attack: &str) {
    eprintln!("hostile: {attack}\t{before:.0}\t{during:.0}");
    assert!(
        during > 0.0,
        "{attack}: the well-behaved job did no I/O ({before:.0} IOPS before)"
    );
}

/// The value of a `/metrics` sample.
fn metric_of(svc: &Service, sample: &str) -> Result<u64> {
    Ok(metric(&svc.http_get("/metrics")?.1, sample))
}

/// Waits up to `limit` for `sample` to reach `at_least`.
fn metric_reaches(svc: &Service, sample: &str, at_least: u64, limit: Duration) -> Result<u64> {
    let start = Instant::now();
    loop {
        let v = metric_of(svc, sample)?;
        if v >= at_least {
            return Ok(v);
        }
        if start.elapsed() > limit {
            bail!("{sample} is {v} after {limit:?}, expected at least {at_least}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether the target closed `s` (a read ends, or the socket was reset),
/// waiting up to `limit`.
fn closed_by_target(s: &mut TcpStream, limit: Duration) -> bool {
    let start = Instant::now();
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let mut b = [0u8; 256];
    while start.elapsed() < limit {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => {}
        }
    }
    false
}

/// A field of the daemon's `/proc/PID/status` (`VmRSS` in KiB, `Threads`).
fn status(svc: &Service, field: &str) -> Result<u64> {
    let pid = svc.pid().context("daemon pid")?;
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("{field} in /proc/{pid}/status"))
}

/// Reads controller PDUs until a capsule response (its status) or a
/// close (`None`); R2Ts and data are skipped and counted in `r2ts`.
fn response(s: &mut TcpStream, buf: &mut Vec<u8>, r2ts: &mut usize) -> Result<Option<u16>> {
    Ok(completion(s, buf, r2ts)?.map(|c| c.status))
}

/// As [`response`], the whole completion.
fn completion(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    r2ts: &mut usize,
) -> Result<Option<dpu_nvmeof::spec::Cqe>> {
    let limits = Limits {
        digests: Digests::default(),
        max_data: 1 << 20,
    };
    loop {
        while let Some((p, n)) = pdu::decode_controller(buf, &limits)? {
            let out = match p {
                ControllerPdu::CapsuleResp { cqe } => Some(cqe),
                ControllerPdu::R2T { .. } => {
                    *r2ts += 1;
                    None
                }
                ControllerPdu::TermReq { fes, .. } => bail!("C2HTermReq FES {fes}"),
                _ => None,
            };
            buf.drain(..n);
            if out.is_some() {
                return Ok(out);
            }
        }
        let mut chunk = [0u8; 8192];
        match s.read(&mut chunk) {
            Ok(0) => return Ok(None),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

/// A host: an admin queue to `subnqn`, connected and enabled, with an
/// admin queue of `entries`.
struct Friend {
    s: TcpStream,
    buf: Vec<u8>,
    /// The controller ID the target gave.
    cntlid: u16,
}

impl Friend {
    fn connect(port: u16, subnqn: &str, entries: u16) -> Result<Friend> {
        let (mut f, cqe) = Friend::open(port, subnqn, HOST, [5; 16], 0, 0xffff, entries)?;
        if cqe.status != 0 {
            bail!("Connect: status {:#x}", cqe.status);
        }
        if f.call(&host::enable(1))? != Some(0) {
            bail!("enable failed");
        }
        Ok(f)
    }

    /// ICReq and a Fabrics Connect of queue `qid` to controller `cntlid`
    /// (0xffff: a new one) as `hostnqn`; the Connect's completion, whatever
    /// its status.
    fn open(
        port: u16,
        subnqn: &str,
        hostnqn: &str,
        hostid: [u8; 16],
        qid: u16,
        cntlid: u16,
        entries: u16,
    ) -> Result<(Friend, dpu_nvmeof::spec::Cqe)> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        let mut b = Vec::new();
        host::ic_req(&mut b, Digests::default());
        let connect = host::connect(0, qid, entries, 0);
        let data = host::connect_data(hostid, cntlid, subnqn, hostnqn);
        pdu::encode_capsule_cmd(&mut b, Digests::default(), &connect, &data);
        s.write_all(&b)?;
        let mut f = Friend {
            s,
            buf: Vec::new(),
            cntlid: 0,
        };
        // ICResp has no capsule response: read it as a PDU first.
        let limits = Limits {
            digests: Digests::default(),
            max_data: 1 << 20,
        };
        loop {
            if let Some((ControllerPdu::IcResp(_), n)) = pdu::decode_controller(&f.buf, &limits)? {
                f.buf.drain(..n);
                break;
            }
            let mut chunk = [0u8; 512];
            let n = f.s.read(&mut chunk)?;
            if n == 0 {
                bail!("closed before ICResp");
            }
            f.buf.extend_from_slice(&chunk[..n]);
        }
        let cqe =
            completion(&mut f.s, &mut f.buf, &mut 0)?.context("closed before Connect's answer")?;
        f.cntlid = cqe.dw0 as u16;
        Ok((f, cqe))
    }

    fn call_raw(&mut self, sqe: Option<&dpu_nvmeof::spec::Sqe>) -> Result<Option<u16>> {
        if let Some(sqe) = sqe {
            let mut b = Vec::new();
            pdu::encode_capsule_cmd(&mut b, Digests::default(), sqe, &[]);
            self.s.write_all(&b)?;
        }
        let mut r2ts = 0;
        response(&mut self.s, &mut self.buf, &mut r2ts)
    }

    /// Sends `sqe` and returns its status (`None`: the target closed).
    fn call(&mut self, sqe: &dpu_nvmeof::spec::Sqe) -> Result<Option<u16>> {
        self.call_raw(Some(sqe))
    }

    /// A Keep Alive round trip; its status.
    fn keep_alive(&mut self) -> Result<Option<u16>> {
        self.call(&host::command(admin::KEEP_ALIVE, 9))
    }
}

fn service(extra_storage: &str) -> Result<(Service, u16)> {
    let port = free_port();
    let config = format!(
        r#"
[storage]
ram_limit = "64MiB"
{extra_storage}
[[storage.subsystems]]
id = "hostile"
nqn = "{NQN}"
allowed_hosts = ["{HOST}", "{HOST2}", "{PERF_HOST}"]
[[storage.subsystems.namespaces]]
ram = "4MiB"
[[storage.subsystems.listeners]]
address = "127.0.0.1"
port = {port}
"#
    );
    Ok((Service::start_config(&config, &[])?, port))
}

/// 600 sockets from one address against a limit of 200 per address:
/// the rest are closed at once and counted, the daemon starts no thread
/// for any of them and grows by well under 64 MiB, and the hosts already
/// connected keep being served throughout.
#[test]
fn a_connection_flood_is_held_to_its_limits_without_a_thread_each() -> Result<()> {
    let _one = serial();
    let (svc, port) = service("max_connections_per_address = 200")?;
    let mut friend = Friend::connect(port, NQN, 32)?;
    let before = perf(port)?;
    let (rss0, threads0) = (status(&svc, "VmRSS")?, status(&svc, "Threads")?);
    let mut flood = Vec::new();
    for _ in 0..600 {
        flood.push(TcpStream::connect(("127.0.0.1", port))?);
    }
    // The friend's Keep Alive goes through while they sit there.
    assert_eq!(friend.keep_alive()?, Some(0));
    // The refused ones are closed by the target: a read ends at once.
    let mut closed = 0;
    for s in &mut flood {
        s.set_read_timeout(Some(Duration::from_millis(50)))?;
        let mut b = [0u8; 8];
        match s.read(&mut b) {
            Ok(0) => closed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => closed += 1,
            _ => {}
        }
    }
    // 200 per address, the friend's one among them. (A few more may be
    // reset by the kernel when the flood overflows the listen backlog.)
    let open = flood.len() - closed;
    assert!((100..=199).contains(&open), "{open} flood sockets admitted");
    let (rss1, threads1) = (status(&svc, "VmRSS")?, status(&svc, "Threads")?);
    assert!(
        threads1 <= threads0,
        "threads {threads0} -> {threads1} for 199 idle connections"
    );
    assert!(
        rss1.saturating_sub(rss0) < 64 << 10,
        "RSS {rss0} KiB -> {rss1} KiB"
    );
    // The admitted flood sockets hold the address's whole quota: the job
    // must wait for them (the handshake timeout) or come from elsewhere,
    // so the job runs after they leave, below.
    let log = svc.log_text();
    assert!(log.contains("max_connections_per_address"), "{log}");
    assert_eq!(
        log.matches("the address holds its most connections")
            .count(),
        1,
        "logged once per address"
    );
    assert!(
        metric_of(
            &svc,
            "dpu_nvmf_connections_refused_total{reason=\"max_connections_per_address\"}"
        )? >= 300
    );
    // Gone: new connections are admitted again, and the friend goes on.
    drop(flood);
    let start = Instant::now();
    loop {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut b = [0u8; 8];
        let refused = matches!(s.read(&mut b), Ok(0));
        if !refused {
            break;
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("still refusing after the flood left");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(friend.keep_alive()?, Some(0));
    keeps_its_iops(port, before, "after a per-address flood")?;
    Ok(())
}

/// 10,000 sockets against the total limit of 4,096 connections (from one
/// address allowed them all): past the limit they are closed at once and
/// counted, the admitted ones cost no thread and little memory and leave
/// at the handshake timeout, and the connected hosts keep their I/O
/// while the flood sits there.
#[test]
fn ten_thousand_sockets_are_held_to_the_total_limit() -> Result<()> {
    let _one = serial();
    let (svc, port) = service(
        "max_connections = 4096\nmax_connections_per_address = 20000\nhandshake_timeout_secs = 60",
    )?;
    // This process holds the 10,000 client ends.
    dpu_os::limits::raise_open_files()?;
    let mut friend = Friend::connect(port, NQN, 32)?;
    let before = perf(port)?;
    let (rss0, threads0) = (status(&svc, "VmRSS")?, status(&svc, "Threads")?);
    // The flood starts while the job runs.
    let job = std::thread::spawn(move || perf(port));
    let mut flood = Vec::with_capacity(10_000);
    let mut failed = 0;
    for _ in 0..10_000 {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => flood.push(s),
            // The listen backlog overflowing, or this process out of
            // descriptors under a low limit: the rest still count.
            Err(_) => failed += 1,
        }
    }
    let during = job.join().expect("the job's thread")?;
    assert!(
        flood.len() >= 5_000,
        "{} sockets connected, {failed} failed",
        flood.len()
    );
    assert_eq!(friend.keep_alive()?, Some(0));
    let refused = metric_reaches(
        &svc,
        "dpu_nvmf_connections_refused_total{reason=\"max_connections\"}",
        flood.len() as u64 - 4096,
        Duration::from_secs(20),
    )?;
    let (rss1, threads1) = (status(&svc, "VmRSS")?, status(&svc, "Threads")?);
    eprintln!(
        "10,000 sockets: {} connected, {refused} refused at the limit, RSS {rss0} -> {rss1} KiB, threads {threads0} -> {threads1}",
        flood.len()
    );
    assert!(threads1 <= threads0, "threads {threads0} -> {threads1}");
    assert!(
        rss1.saturating_sub(rss0) < 64 << 10,
        "RSS {rss0} KiB -> {rss1} KiB for 4,096 handshaking sockets"
    );
    kept_its_iops(before, during, "10,000 sockets");
    // Once they leave, so do their connections, and the friend goes on.
    drop(flood);
    let start = Instant::now();
    while metric_of(&svc, "dpu_nvmf_open_connections")? > 1 {
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "connections still open after the flood left"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(friend.keep_alive()?, Some(0));
    Ok(())
}

/// A thousand hosts connected to their admin queues (Keep Alive off) and
/// idle: no thread each and under 64 MiB together, and a job beside them
/// keeps its IOPS.
#[test]
fn a_thousand_idle_hosts_cost_no_thread_and_little_memory() -> Result<()> {
    let _one = serial();
    let (svc, port) =
        service("max_connections_per_host = 2000\nmax_connections_per_address = 2000")?;
    let before = perf(port)?;
    let (rss0, threads0) = (status(&svc, "VmRSS")?, status(&svc, "Threads")?);
    let mut idle = Vec::with_capacity(1000);
    for i in 0..1000u32 {
        let mut id = [7u8; 16];
        id[..4].copy_from_slice(&i.to_le_bytes());
        let (mut f, cqe) = Friend::open(port, NQN, HOST2, id, 0, 0xffff, 32)?;
        ensure!(
            cqe.status == 0,
            "host {i}: Connect status {:#x}",
            cqe.status
        );
        ensure!(
            f.call(&host::enable(1))? == Some(0),
            "host {i}: enable failed"
        );
        idle.push(f);
    }
    keeps_its_iops(port, before, "1,000 idle hosts")?;
    let (rss1, threads1) = (status(&svc, "VmRSS")?, status(&svc, "Threads")?);
    eprintln!("1,000 idle hosts: RSS {rss0} -> {rss1} KiB, threads {threads0} -> {threads1}");
    assert!(threads1 <= threads0, "threads {threads0} -> {threads1}");
    assert!(
        rss1.saturating_sub(rss0) < 64 << 10,
        "RSS {rss0} KiB -> {rss1} KiB for 1,000 idle controllers"
    );
    // Every one of them is still served.
    for (i, f) in idle.iter_mut().enumerate() {
        assert_eq!(f.keep_alive()?, Some(0), "idle host {i}");
    }
    Ok(())
}

/// Sockets that never send ICReq, stop halfway through it, or stop
/// halfway through a command capsule after connecting: closed at their
/// timeouts and counted, while a job beside them keeps its IOPS.
#[test]
fn stalled_handshakes_and_pdus_are_closed_at_their_timeouts() -> Result<()> {
    let _one = serial();
    let (svc, port) = service("handshake_timeout_secs = 5\npdu_timeout_secs = 5")?;
    let mut friend = Friend::connect(port, NQN, 32)?;
    let before = perf(port)?;
    let mut silent = Vec::new();
    let mut half_icreq = Vec::new();
    let mut half_capsule = Vec::new();
    let mut ic = Vec::new();
    host::ic_req(&mut ic, Digests::default());
    for _ in 0..50 {
        silent.push(TcpStream::connect(("127.0.0.1", port))?);
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.write_all(&ic[..ic.len() / 2])?;
        half_icreq.push(s);
    }
    let mut capsule = Vec::new();
    pdu::encode_capsule_cmd(
        &mut capsule,
        Digests::default(),
        &host::command(admin::KEEP_ALIVE, 3),
        &[],
    );
    for i in 0..20u8 {
        let mut f = Friend::open(port, NQN, HOST2, [i; 16], 0, 0xffff, 32)?.0;
        f.s.write_all(&capsule[..10])?;
        half_capsule.push(f.s);
    }
    // The stalled sockets sit there for the first runs of the job.
    keeps_its_iops(port, before, "stalled handshakes and PDUs")?;
    for s in silent
        .iter_mut()
        .chain(&mut half_icreq)
        .chain(&mut half_capsule)
    {
        assert!(
            closed_by_target(s, Duration::from_secs(10)),
            "a stalled socket stays open"
        );
    }
    let handshakes = metric_of(
        &svc,
        "dpu_nvmf_connections_closed_total{reason=\"handshake_timeout\"}",
    )?;
    let pdus = metric_of(
        &svc,
        "dpu_nvmf_connections_closed_total{reason=\"pdu_timeout\"}",
    )?;
    assert!(handshakes >= 100, "handshake timeouts: {handshakes}");
    assert!(pdus >= 20, "PDU timeouts: {pdus}");
    assert_eq!(friend.keep_alive()?, Some(0));
    Ok(())
}

/// A host that fills its I/O queue with 128 KiB reads and never reads its
/// socket: the target queues at most its output budget for it, then
/// closes it at the write timeout (counted), and a job beside it keeps
/// its IOPS.
#[test]
fn a_host_that_stops_reading_is_disconnected() -> Result<()> {
    let _one = serial();
    let (svc, port) = service("write_timeout_secs = 2")?;
    let before = perf(port)?;
    let rss0 = status(&svc, "VmRSS")?;
    let admin_q = Friend::connect(port, NQN, 32)?;
    let (mut io, cqe) = Friend::open(port, NQN, HOST, [5; 16], 1, admin_q.cntlid, 128)?;
    ensure!(cqe.status == 0, "I/O queue Connect: {:#x}", cqe.status);
    let mut b = Vec::new();
    for cid in 0..127u16 {
        // 256 blocks of 512 bytes from block 0.
        let mut r = host::command(nvm::READ, cid);
        r.0[4..8].copy_from_slice(&1u32.to_le_bytes());
        r.0[48..50].copy_from_slice(&255u16.to_le_bytes());
        r.0[32..36].copy_from_slice(&(128u32 << 10).to_le_bytes());
        pdu::encode_capsule_cmd(&mut b, Digests::default(), &r, &[]);
    }
    io.s.write_all(&b)?;
    let during = perf(port)?;
    metric_reaches(
        &svc,
        "dpu_nvmf_connections_closed_total{reason=\"write_timeout\"}",
        1,
        Duration::from_secs(20),
    )?;
    let rss1 = status(&svc, "VmRSS")?;
    assert!(
        rss1.saturating_sub(rss0) < 32 << 10,
        "RSS {rss0} KiB -> {rss1} KiB for 16 MiB of reads nobody takes"
    );
    kept_its_iops(before, during, "a host that stops reading");
    Ok(())
}

/// An allowed host's I/O queue Connect naming another host's controller
/// ID (or the right host NQN with another host ID) is refused, and the
/// controller's owner is unaffected.
#[test]
fn an_io_queue_cannot_join_another_hosts_controller() -> Result<()> {
    let _one = serial();
    let (svc, port) = service("")?;
    let mut friend = Friend::connect(port, NQN, 32)?;
    let before = perf(port)?;
    let refused0 = metric_of(&svc, "dpu_nvmf_connects_refused_total")?;
    let (_, other) = Friend::open(port, NQN, HOST2, [9; 16], 1, friend.cntlid, 32)?;
    assert_ne!(
        other.status, 0,
        "another host joined the friend's controller"
    );
    let (_, other_id) = Friend::open(port, NQN, HOST, [9; 16], 1, friend.cntlid, 32)?;
    assert_ne!(
        other_id.status, 0,
        "another host ID joined the friend's controller"
    );
    let (_, own) = Friend::open(port, NQN, HOST, [5; 16], 1, friend.cntlid, 32)?;
    assert_eq!(own.status, 0, "the owner's own I/O queue");
    assert!(metric_of(&svc, "dpu_nvmf_connects_refused_total")? >= refused0 + 2);
    assert_eq!(friend.keep_alive()?, Some(0));
    keeps_its_iops(port, before, "foreign I/O queue Connects")?;
    Ok(())
}

/// A host on the discovery controller asks for a 1,024-entry admin queue
/// and announces 1,000 writes of 512 KiB each, whose data would come by
/// R2T, then sends none: the discovery controller takes no host data, so
/// every one is answered with an error and no R2T, and the daemon's memory
/// stays put; a second host is served throughout. (On an I/O queue the
/// same writes get R2Ts for 4 MiB and wait: the unit tests of `conn`.)
#[test]
fn announced_writes_without_data_cost_no_memory() -> Result<()> {
    let _one = serial();
    let (svc, port) = service("")?;
    let mut friend = Friend::connect(port, NQN, 32)?;
    let before = perf(port)?;
    let rss0 = status(&svc, "VmRSS")?;

    let hog = |subnqn: &str| -> Result<(TcpStream, usize, usize)> {
        let mut s = Friend::connect(port, subnqn, 1024)?.s;
        let mut b = Vec::new();
        for cid in 100..1100u16 {
            let mut w = host::command(nvm::WRITE, cid);
            w.0[4..8].copy_from_slice(&1u32.to_le_bytes());
            w.0[32..36].copy_from_slice(&(512u32 << 10).to_le_bytes());
            w.0[48..50].copy_from_slice(&1023u16.to_le_bytes());
            pdu::encode_capsule_cmd(&mut b, Digests::default(), &w, &[]);
        }
        s.write_all(&b)?;
        let (mut buf, mut r2ts, mut answers) = (Vec::new(), 0, 0);
        s.set_read_timeout(Some(Duration::from_millis(500)))?;
        while let Ok(Some(_)) = response(&mut s, &mut buf, &mut r2ts) {
            answers += 1;
        }
        Ok((s, r2ts, answers))
    };
    let (_disc, r2ts, answers) = hog(DISCOVERY_NQN)?;
    assert_eq!((r2ts, answers), (0, 1000), "discovery: no R2T, all refused");
    assert_eq!(friend.keep_alive()?, Some(0));
    keeps_its_iops(port, before, "announced writes without data")?;
    let rss1 = status(&svc, "VmRSS")?;
    assert!(
        rss1.saturating_sub(rss0) < 16 << 10,
        "RSS {rss0} KiB -> {rss1} KiB"
    );
    Ok(())
}

/// A connected host removed from the allow list over the API loses its
/// controller at once (not at its next reconnect), is counted, and cannot
/// connect again; a job of another host goes on.
#[test]
fn a_revoked_host_is_disconnected() -> Result<()> {
    let _one = serial();
    let (svc, port) = service("")?;
    let mut friend = Friend::connect(port, NQN, 32)?;
    assert_eq!(friend.keep_alive()?, Some(0));
    let before = perf(port)?;
    let out = svc.dpuctl(&["subsystem", "remove-host", "hostile", HOST])?;
    assert!(out.status.success(), "{out:?}");
    let start = Instant::now();
    let closed = friend.call_raw(None)?;
    assert_eq!(closed, None, "the target closed the revoked host's queue");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(
        svc.log_text().contains("host no longer allowed"),
        "{}",
        svc.log_text()
    );
    assert!(metric_of(&svc, "dpu_nvmf_controllers_revoked_total")? >= 1);
    assert!(Friend::connect(port, NQN, 32).is_err(), "connects again");
    keeps_its_iops(port, before, "a revoked host")?;
    Ok(())
}
