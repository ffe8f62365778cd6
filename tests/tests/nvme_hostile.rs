//! Hostile and numerous NVMe/TCP peers against the real binary, each
//! beside a well-behaved host that must keep being served: a flood of
//! connections (refused past the per-address limit, no thread each, the
//! memory bounded), a host announcing a thousand 512 KiB writes by R2T
//! without sending their data (to the discovery controller, where no allow
//! list applies), and a host revoked over the API while connected.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dpu_e2e::{free_port, Service};
use dpu_nvmeof::host;
use dpu_nvmeof::pdu::{self, ControllerPdu, Digests, Limits};
use dpu_nvmeof::spec::{admin, nvm, DISCOVERY_NQN};

const NQN: &str = "nqn.2024-01.io.dpu-service.test:hostile";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:e2e-hostile-friend";

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
    let limits = Limits {
        digests: Digests::default(),
        max_data: 1 << 20,
    };
    loop {
        while let Some((p, n)) = pdu::decode_controller(buf, &limits)? {
            let out = match p {
                ControllerPdu::CapsuleResp { cqe } => Some(cqe.status),
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
}

impl Friend {
    fn connect(port: u16, subnqn: &str, entries: u16) -> Result<Friend> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        let mut b = Vec::new();
        host::ic_req(&mut b, Digests::default());
        let connect = host::connect(0, 0, entries, 0);
        let data = host::connect_data([5; 16], 0xffff, subnqn, HOST);
        pdu::encode_capsule_cmd(&mut b, Digests::default(), &connect, &data);
        s.write_all(&b)?;
        let mut f = Friend { s, buf: Vec::new() };
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
        let st = f.call_raw(None)?;
        if st != Some(0) {
            bail!("Connect: {st:?}");
        }
        if f.call(&host::enable(1))? != Some(0) {
            bail!("enable failed");
        }
        Ok(f)
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
allowed_hosts = ["{HOST}"]
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
/// for any of them and grows by well under 64 MiB, and the host already
/// connected keeps being served throughout.
#[test]
fn a_connection_flood_is_held_to_its_limits_without_a_thread_each() -> Result<()> {
    let (svc, port) = service("max_connections_per_address = 200")?;
    let mut friend = Friend::connect(port, NQN, 32)?;
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
    let log = svc.log_text();
    assert!(log.contains("max_connections_per_address"), "{log}");
    assert_eq!(
        log.matches("the address holds its most connections")
            .count(),
        1,
        "logged once per address"
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
    let (svc, port) = service("")?;
    let mut friend = Friend::connect(port, NQN, 32)?;
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
    let rss1 = status(&svc, "VmRSS")?;
    assert!(
        rss1.saturating_sub(rss0) < 16 << 10,
        "RSS {rss0} KiB -> {rss1} KiB"
    );
    Ok(())
}

/// A connected host removed from the allow list over the API loses its
/// controller at once (not at its next reconnect), and cannot connect
/// again.
#[test]
fn a_revoked_host_is_disconnected() -> Result<()> {
    let (svc, port) = service("")?;
    let mut friend = Friend::connect(port, NQN, 32)?;
    assert_eq!(friend.keep_alive()?, Some(0));
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
    assert!(Friend::connect(port, NQN, 32).is_err(), "connects again");
    Ok(())
}
