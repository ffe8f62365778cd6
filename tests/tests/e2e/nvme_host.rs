//! The NVMe/TCP target through the real binary, driven by a raw host built
//! on the crate's own PDU codec: a host that goes silent is cleaned up by
//! its keep-alive timeout, a socket that never starts the handshake or
//! stops halfway through a PDU is closed on its timeout, so is a host that
//! stops reading its socket, and a host sending
//! garbage gets a C2HTermReq and loses only its own connection.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dpu_e2e::{free_port, Service};
use dpu_nvmeof::host;
use dpu_nvmeof::pdu::{self, ControllerPdu, Digests, IcReq, Limits};
use dpu_nvmeof::spec::admin;

const NQN: &str = "nqn.2024-01.io.dpu-service.test:ka";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:e2e-raw-host";

/// Reads one whole controller PDU; `None` when the target closed.
fn read_pdu(s: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Option<(u8, u16)>> {
    let limits = Limits {
        digests: Digests::default(),
        max_data: 1 << 20,
    };
    loop {
        if let Some((p, n)) = pdu::decode_controller(buf, &limits)? {
            let out = match p {
                ControllerPdu::IcResp(_) => (pdu::pdu_type::IC_RESP, 0),
                ControllerPdu::CapsuleResp { cqe } => (pdu::pdu_type::CAPSULE_RESP, cqe.status),
                ControllerPdu::TermReq { fes, .. } => (pdu::pdu_type::C2H_TERM_REQ, fes),
                ControllerPdu::C2HData { .. } => (pdu::pdu_type::C2H_DATA, 0),
                ControllerPdu::R2T { .. } => (pdu::pdu_type::R2T, 0),
            };
            buf.drain(..n);
            return Ok(Some(out));
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// An admin queue connected and enabled with a keep-alive timeout.
fn admin_queue(port: u16, kato_ms: u32) -> Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut b = Vec::new();
    pdu::encode_ic_req(
        &mut b,
        &IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        },
    );
    let connect = host::connect(0, 0, 32, kato_ms);
    let data = host::connect_data([0; 16], 0xffff, NQN, HOST);
    pdu::encode_capsule_cmd(&mut b, Digests::default(), &connect, &data);
    pdu::encode_capsule_cmd(&mut b, Digests::default(), &host::enable(1), &[]);
    s.write_all(&b)?;
    let mut buf = Vec::new();
    for want in ["ICResp", "Connect", "Property Set"] {
        match read_pdu(&mut s, &mut buf)? {
            Some((_, 0)) => {}
            other => bail!("{want}: got {other:?}"),
        }
    }
    Ok(s)
}

/// The value of the sample `series` (name and labels, as printed) on
/// `/metrics`.
fn metric(svc: &Service, series: &str) -> Result<u64> {
    let (_, body) = svc.http_get("/metrics")?;
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .with_context(|| format!("no {series} on /metrics"))?
        .trim()
        .parse()
        .context("metric value")
}

/// Open connections of subsystem "ka", as `/metrics` counts them.
fn connections(svc: &Service) -> Result<u64> {
    metric(svc, "dpu_nvmf_connections{subsystem=\"ka\"}")
}

#[test]
fn silent_hosts_time_out_and_garbage_ends_only_its_connection() -> Result<()> {
    let port = free_port();
    let config = format!(
        r#"
[storage]
ram_limit = "64MiB"
[[storage.subsystems]]
id = "ka"
nqn = "{NQN}"
allow_any_host = true
[[storage.subsystems.namespaces]]
ram = "4MiB"
[[storage.subsystems.listeners]]
address = "127.0.0.1"
port = {port}
"#
    );
    let svc = Service::start_config(&config, &[])?;

    // A host that goes silent after connecting with a 1 s keep-alive.
    let mut silent = admin_queue(port, 1000)?;
    // Another one that stays: no keep-alive timeout.
    let mut steady = admin_queue(port, 0)?;
    assert_eq!(connections(&svc)?, 2);
    let t0 = Instant::now();
    let mut buf = Vec::new();
    let closed = read_pdu(&mut silent, &mut buf)?;
    assert_eq!(closed, None, "the target closes the silent host's queue");
    let waited = t0.elapsed();
    assert!(waited < Duration::from_secs(5), "closed after {waited:?}");
    assert!(
        svc.log_text().contains("keep-alive timeout"),
        "{}",
        svc.log_text()
    );
    assert_eq!(metric(&svc, "dpu_nvmf_keep_alive_timeouts_total")?, 1);

    // Garbage on a fresh connection: C2HTermReq, then close.
    let mut bad = TcpStream::connect(("127.0.0.1", port))?;
    bad.set_read_timeout(Some(Duration::from_secs(20)))?;
    bad.write_all(&[0x07, 0, 24, 24, 24, 0, 0, 0])?;
    bad.write_all(&[0; 16])?;
    let mut buf = Vec::new();
    assert_eq!(
        read_pdu(&mut bad, &mut buf)?,
        Some((pdu::pdu_type::C2H_TERM_REQ, 1))
    );
    assert_eq!(read_pdu(&mut bad, &mut buf)?, None);
    assert_eq!(metric(&svc, "dpu_nvmf_protocol_errors_total")?, 1);
    assert_eq!(metric(&svc, "dpu_nvmf_connections_accepted_total")?, 3);

    // The steady host is still served: a Keep Alive completes.
    let ka = host::command(admin::KEEP_ALIVE, 9);
    let mut b = Vec::new();
    pdu::encode_capsule_cmd(&mut b, Digests::default(), &ka, &[]);
    steady.write_all(&b)?;
    let mut buf = Vec::new();
    assert_eq!(
        read_pdu(&mut steady, &mut buf)?,
        Some((pdu::pdu_type::CAPSULE_RESP, 0))
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while connections(&svc)? != 1 {
        if Instant::now() > deadline {
            bail!("connections gauge stuck at {}", connections(&svc)?);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The service with subsystem "ka" (any host, no namespace) listening on
/// a free port of 127.0.0.1.
fn subsystem_without_namespaces() -> Result<(Service, u16)> {
    let port = free_port();
    let config = format!(
        r#"
[[storage.subsystems]]
id = "ka"
nqn = "{NQN}"
allow_any_host = true
[[storage.subsystems.listeners]]
address = "127.0.0.1"
port = {port}
"#
    );
    Ok((Service::start_config(&config, &[])?, port))
}

/// A socket that never sends its ICReq, and one that stops halfway
/// through a capsule after the handshake, are both closed once their
/// timeouts (10 s each) are up; neither holds the target longer.
#[test]
fn mute_and_stalled_sockets_are_closed_on_their_timeouts() -> Result<()> {
    use dpu_nvmeof::conn::{ICREQ_TIMEOUT, PDU_TIMEOUT};
    let (svc, port) = subsystem_without_namespaces()?;
    let t0 = Instant::now();
    let mut mute = TcpStream::connect(("127.0.0.1", port))?;
    let mut stalled = TcpStream::connect(("127.0.0.1", port))?;
    for s in [&mute, &stalled] {
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
    }
    let mut b = Vec::new();
    host::ic_req(&mut b, Digests::default());
    stalled.write_all(&b)?;
    let mut buf = Vec::new();
    assert_eq!(
        read_pdu(&mut stalled, &mut buf)?,
        Some((pdu::pdu_type::IC_RESP, 0))
    );
    // The first 8 bytes of a 72-byte capsule, and then nothing.
    stalled.write_all(&[0x04, 0, 72, 0, 72, 0, 0, 0])?;

    let mut buf = Vec::new();
    assert_eq!(
        read_pdu(&mut mute, &mut buf)?,
        None,
        "the mute socket is closed"
    );
    let waited = t0.elapsed();
    assert!(
        waited >= ICREQ_TIMEOUT && waited < ICREQ_TIMEOUT + Duration::from_secs(5),
        "mute socket closed after {waited:?}"
    );
    let closed = |reason: &str| {
        metric(
            &svc,
            &format!("dpu_nvmf_connections_closed_total{{reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(closed("handshake_timeout")?, 1);
    let mut buf = Vec::new();
    assert_eq!(
        read_pdu(&mut stalled, &mut buf)?,
        None,
        "the stalled socket is closed"
    );
    let waited = t0.elapsed();
    assert!(
        waited >= PDU_TIMEOUT && waited < PDU_TIMEOUT + Duration::from_secs(5),
        "stalled socket closed after {waited:?}"
    );
    assert_eq!(closed("handshake_timeout")?, 1);
    assert_eq!(closed("pdu_timeout")?, 1);
    assert_eq!(closed("write_timeout")?, 0);
    let log = svc.log_text();
    assert!(log.contains("no ICReq within"), "{log}");
    assert!(log.contains("a PDU incomplete for"), "{log}");
    Ok(())
}

/// A host that keeps sending Identify commands but never reads its socket
/// fills the target's send buffer; the write that finds no room for
/// WRITE_TIMEOUT (10 s) ends that connection, and the target's other
/// hosts are served meanwhile and after.
#[test]
fn a_host_that_stops_reading_loses_its_connection_on_the_write_timeout() -> Result<()> {
    use dpu_nvmeof::tcp::WRITE_TIMEOUT;
    let (svc, port) = subsystem_without_namespaces()?;
    let deaf = admin_queue(port, 0)?;
    let mut steady = admin_queue(port, 0)?;
    assert_eq!(connections(&svc)?, 2);
    assert_eq!(metric(&svc, "dpu_nvmf_open_connections")?, 2);
    // Admin queues are served apart from the I/O poll groups.
    assert_eq!(metric(&svc, "dpu_nvmf_poll_group_queues{group=\"0\"}")?, 0);
    let write_timeouts = "dpu_nvmf_connections_closed_total{reason=\"write_timeout\"}";
    assert_eq!(metric(&svc, write_timeouts)?, 0);
    // 20,000 Identify commands: 80 MB of answers, far past what the
    // sockets' buffers hold. Written from a thread, since the target stops
    // reading too once its writes block.
    let mut writer = deaf.try_clone()?;
    let t0 = Instant::now();
    let sender = std::thread::spawn(move || {
        let mut b = Vec::new();
        for cid in 0..20_000u16 {
            let mut id = host::command(admin::IDENTIFY, cid % 16 + 16);
            id.0[32..36].copy_from_slice(&4096u32.to_le_bytes());
            id.0[40] = 1;
            pdu::encode_capsule_cmd(&mut b, Digests::default(), &id, &[]);
        }
        // Ends with an error once the target closes; that is the point.
        let _ = writer.write_all(&b);
    });
    // Meanwhile the other host is served.
    let ka = host::command(admin::KEEP_ALIVE, 9);
    let mut b = Vec::new();
    pdu::encode_capsule_cmd(&mut b, Digests::default(), &ka, &[]);
    steady.write_all(&b)?;
    let mut buf = Vec::new();
    assert_eq!(
        read_pdu(&mut steady, &mut buf)?,
        Some((pdu::pdu_type::CAPSULE_RESP, 0))
    );
    // The target's send buffer grows to its limit (4 MiB here) for a
    // while before its writes stop moving anything; then WRITE_TIMEOUT.
    let deadline = t0 + WRITE_TIMEOUT + Duration::from_secs(40);
    while connections(&svc)? != 1 {
        if Instant::now() > deadline {
            bail!(
                "the deaf host's connection is still open: {}",
                svc.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let waited = t0.elapsed();
    assert!(
        waited >= WRITE_TIMEOUT,
        "closed after {waited:?}: {}",
        svc.log_text()
    );
    let log = svc.log_text();
    assert!(log.contains("the host read nothing for"), "{log}");
    assert_eq!(metric(&svc, write_timeouts)?, 1);
    drop(deaf);
    sender.join().expect("sender thread");
    // The steady host is still served.
    steady.write_all(&b)?;
    assert_eq!(
        read_pdu(&mut steady, &mut buf)?,
        Some((pdu::pdu_type::CAPSULE_RESP, 0))
    );
    Ok(())
}
