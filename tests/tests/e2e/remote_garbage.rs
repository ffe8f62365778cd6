//! A remote target that speaks garbage in the middle of I/O, through the
//! real binary. The service serves a namespace of another NVMe/TCP
//! target (a RAM namespace of its own, on another port) through a proxy
//! that forwards the remote's PDUs whole and, when told, puts bytes of
//! its choosing before the next PDU the remote sends on the I/O queue:
//! an unknown PDU type, a C2HData header claiming 4 GiB, a completion of
//! no command in flight, and a C2HTermReq. After those bytes the proxy
//! forwards nothing more on that connection and keeps it open, so only
//! the service can end it.
//!
//! Meanwhile a host keeps 16 writes in flight through the service,
//! retrying each that fails with the same data. Each time, the service
//! drops the connection at once, answers what was in flight with
//! Namespace Not Ready (what a host's multipath retries), says why in its
//! log, connects again and carries on; no command waits long, nothing
//! is allocated for the 4 GiB, and the data read back through the
//! service and straight from the remote is the data last written.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dpu_e2e::{free_port, Service};
use dpu_nvmeof::host::{
    self, Controller, ControllerOptions, HostIdentity, Queue, QueueOptions, Transfer,
};
use dpu_rand::Rng;

const BACK_NQN: &str = "nqn.2024-01.io.dpu-service.test:garbage-back";
const FRONT_NQN: &str = "nqn.2024-01.io.dpu-service.test:garbage-front";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-0000000000f7";
/// Bytes a write moves, and the size of each slot of the pattern.
const SLOT: usize = 4096;
/// Slots the host writes to.
const SLOTS: usize = 512;
/// Writes the host keeps in flight.
const DEPTH: usize = 16;

/// What the proxy is told to inject, and what became of it.
#[derive(Default)]
struct Faults {
    /// Bytes to put before the next PDU the remote sends on an I/O queue.
    next: Mutex<Option<Vec<u8>>>,
    /// When they went out.
    sent: Mutex<Option<Instant>>,
    /// When the service ended the connection they went out on.
    closed: Mutex<Option<Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One whole PDU from `r`, by its common header's PLEN; `None` at the
/// end of the stream.
fn read_pdu(r: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut pdu = vec![0; 8];
    match r.read_exact(&mut pdu) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let plen = u32::from_le_bytes(pdu[4..8].try_into().expect("4 bytes")) as usize;
    if !(8..=(8 << 20)).contains(&plen) {
        return Err(io::Error::other(format!("PLEN {plen}")));
    }
    pdu.resize(plen, 0);
    r.read_exact(&mut pdu[8..])?;
    Ok(Some(pdu))
}

/// A proxy on a loopback port in front of the target on `back`; see the
/// module's comment.
fn proxy(back: u16, faults: Arc<Faults>) -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    std::thread::spawn(move || {
        for service in l.incoming().flatten() {
            let Ok(remote) = TcpStream::connect(("127.0.0.1", back)) else {
                continue;
            };
            let _ = service.set_nodelay(true);
            let _ = remote.set_nodelay(true);
            let (Ok(service_w), Ok(remote_r)) = (service.try_clone(), remote.try_clone()) else {
                continue;
            };
            // The queue's ID, from the Fabrics Connect the service sends.
            let qid = Arc::new(AtomicU32::new(u32::MAX));
            let poisoned = Arc::new(AtomicBool::new(false));
            let (q, p, f) = (qid.clone(), poisoned.clone(), faults.clone());
            std::thread::spawn(move || to_remote(service, remote, &q, &p, &f));
            let f = faults.clone();
            std::thread::spawn(move || to_service(remote_r, service_w, &qid, &poisoned, &f));
        }
    });
    Ok(port)
}

/// The service's PDUs to the remote, noting the queue's ID; once the
/// connection is poisoned, nothing more goes through, and the service's
/// end of it is noted.
fn to_remote(
    mut service: TcpStream,
    mut remote: TcpStream,
    qid: &AtomicU32,
    poisoned: &AtomicBool,
    faults: &Faults,
) {
    loop {
        let pdu = read_pdu(&mut service);
        let Ok(Some(pdu)) = pdu else {
            if poisoned.load(Ordering::Acquire) {
                lock(&faults.closed).get_or_insert_with(Instant::now);
            }
            break;
        };
        // A CapsuleCmd holding a Fabrics Connect: QID is CDW10's high half.
        if pdu[0] == 0x04 && pdu.len() >= 72 && pdu[8] == 0x7f && pdu[12] == 0x01 {
            qid.store(
                u32::from(u16::from_le_bytes([pdu[50], pdu[51]])),
                Ordering::Release,
            );
        }
        if !poisoned.load(Ordering::Acquire) && remote.write_all(&pdu).is_err() {
            break;
        }
    }
    let _ = remote.shutdown(Shutdown::Both);
}

/// The remote's PDUs to the service, whole, with what `faults` holds put
/// before one of them on an I/O queue; after that, nothing.
fn to_service(
    mut remote: TcpStream,
    mut service: TcpStream,
    qid: &AtomicU32,
    poisoned: &AtomicBool,
    faults: &Faults,
) {
    while let Ok(Some(pdu)) = read_pdu(&mut remote) {
        let q = qid.load(Ordering::Acquire);
        if q != 0 && q != u32::MAX {
            if let Some(junk) = lock(&faults.next).take() {
                poisoned.store(true, Ordering::Release);
                let _ = service.write_all(&junk);
                *lock(&faults.sent) = Some(Instant::now());
                // The connection stays open: the service must end it.
                return;
            }
        }
        if service.write_all(&pdu).is_err() {
            return;
        }
    }
}

/// The injected faults: a name and the bytes.
fn junk() -> Vec<(&'static str, Vec<u8>)> {
    let header = |kind: u8, hlen: u8, pdo: u8, plen: u32| {
        let mut h = vec![kind, 0, hlen, pdo];
        h.extend_from_slice(&plen.to_le_bytes());
        h
    };
    // C2HData: CCCID 1, DATAO 0, DATAL what PLEN claims, 4 GiB.
    let mut huge = header(0x07, 24, 24, 0xffff_fff0);
    huge.extend_from_slice(&1u16.to_le_bytes());
    huge.extend_from_slice(&[0; 2]);
    huge.extend_from_slice(&0u32.to_le_bytes());
    huge.extend_from_slice(&(0xffff_fff0u32 - 24).to_le_bytes());
    huge.extend_from_slice(&[0; 4]);
    // CapsuleResp: a CQE for CID 0xfff0, success.
    let mut stray = header(0x05, 24, 0, 24);
    stray.extend_from_slice(&[0; 12]);
    stray.extend_from_slice(&0xfff0u16.to_le_bytes());
    stray.extend_from_slice(&[0; 2]);
    // C2HTermReq: FES 1 (invalid header field), FEI 0.
    let mut term = header(0x03, 24, 0, 24);
    term.extend_from_slice(&1u16.to_le_bytes());
    term.extend_from_slice(&[0; 14]);
    vec![
        ("an unknown PDU type", vec![0xff; 256]),
        ("a C2HData header claiming 4 GiB", huge),
        ("a completion of no command in flight", stray),
        ("a C2HTermReq", term),
    ]
}

/// A host with one I/O queue on subsystem `nqn` at `port`, and its
/// namespace's block size.
fn connect(port: u16, nqn: &str) -> Result<(Controller<TcpStream>, Queue<TcpStream>, u64)> {
    let opts = ControllerOptions {
        kato: Duration::from_secs(30),
        queue: QueueOptions {
            timeout: Some(Duration::from_secs(30)),
            ..QueueOptions::default()
        },
    };
    let me = HostIdentity::new(HOST, [0xf7; 16]);
    let addr = ("127.0.0.1", port);
    let mut ctrl = Controller::connect(TcpStream::connect(addr)?, &me, nqn, &opts)
        .with_context(|| format!("connecting to {nqn}"))?;
    ensure!(ctrl.set_io_queues(1)? >= 1, "{nqn}: no I/O queue");
    let q = ctrl.io_queue(TcpStream::connect(addr)?, 1, 32)?;
    let block = u64::from(ctrl.identify_namespace(1)?.block_size);
    Ok((ctrl, q, block))
}

/// The pattern of slot `slot` at generation `generation`.
fn pattern(slot: usize, generation: u32) -> Vec<u8> {
    let word = (slot as u64) << 32 | u64::from(generation);
    word.to_le_bytes().repeat(SLOT / 8)
}

/// What a stretch of the load saw.
#[derive(Debug, Default)]
struct Seen {
    ok: u64,
    /// Failed writes, all of them with Namespace Not Ready.
    not_ready: u64,
    /// Successes since the fault went out.
    ok_after: u64,
    /// The longest any write took.
    longest: Duration,
}

/// The host's writes: each slot has at most one in flight, and a write
/// that fails goes again with the same data.
struct Load {
    q: Queue<TcpStream>,
    block: u64,
    rng: Rng,
    /// Generation each slot last had written successfully.
    written: Vec<u32>,
    /// CID to slot, generation and start.
    in_flight: HashMap<u16, (usize, u32, Instant)>,
    next_gen: u32,
}

impl Load {
    fn submit(&mut self, slot: usize, generation: u32) -> Result<()> {
        let cid = self.q.pair().free_cid().context("no free CID")?;
        let blocks = SLOT as u64 / self.block;
        let sqe = host::write(1, slot as u64 * blocks, (blocks - 1) as u16);
        self.q
            .submit(cid, sqe, Transfer::Write(pattern(slot, generation)))?;
        self.in_flight
            .insert(cid, (slot, generation, Instant::now()));
        Ok(())
    }

    /// A slot with nothing in flight.
    fn free_slot(&mut self) -> usize {
        loop {
            let s = self.rng.index(SLOTS);
            if !self.in_flight.values().any(|(o, _, _)| *o == s) {
                return s;
            }
        }
    }

    /// Runs until `done` says so, at most `limit`.
    fn run(
        &mut self,
        faults: &Faults,
        limit: Duration,
        done: impl Fn(&Seen, &Faults) -> bool,
    ) -> Result<Seen> {
        let start = Instant::now();
        let mut seen = Seen::default();
        while !done(&seen, faults) {
            ensure!(
                start.elapsed() < limit,
                "still not done after {limit:?}: {seen:?}"
            );
            while self.in_flight.len() < DEPTH {
                let slot = self.free_slot();
                self.next_gen += 1;
                self.submit(slot, self.next_gen)?;
            }
            self.q.flush()?;
            let c = self.q.wait().context("waiting for a write")?;
            let (slot, generation, t) = self
                .in_flight
                .remove(&c.cid())
                .with_context(|| format!("a completion for CID {}", c.cid()))?;
            seen.longest = seen.longest.max(t.elapsed());
            if c.is_success() {
                self.written[slot] = generation;
                seen.ok += 1;
                if lock(&faults.sent).is_some() {
                    seen.ok_after += 1;
                }
            } else {
                let st = c.status();
                ensure!(
                    (st.sct, st.sc) == (0, 0x82),
                    "a write failed with {st:?}, not Namespace Not Ready"
                );
                seen.not_ready += 1;
                self.submit(slot, generation)?;
            }
        }
        Ok(seen)
    }

    /// Waits for every write in flight, retrying those that fail.
    fn drain(&mut self) -> Result<()> {
        while !self.in_flight.is_empty() {
            self.q.flush()?;
            let c = self.q.wait()?;
            let (slot, generation, _) = self.in_flight.remove(&c.cid()).context("stray CID")?;
            if c.is_success() {
                self.written[slot] = generation;
            } else {
                self.submit(slot, generation)?;
            }
        }
        Ok(())
    }
}

/// Reads every slot through `q` and fails unless each holds what was
/// last written to it (zeros where nothing was).
fn verify(q: &mut Queue<TcpStream>, block: u64, written: &[u32], what: &str) -> Result<()> {
    let blocks = SLOT as u64 / block;
    for (slot, &generation) in written.iter().enumerate() {
        let c = q.call(
            host::read(1, slot as u64 * blocks, (blocks - 1) as u16),
            Transfer::Read(vec![0; SLOT]),
        )?;
        let want = if generation == 0 {
            vec![0; SLOT]
        } else {
            pattern(slot, generation)
        };
        ensure!(
            c.data == want,
            "{what}: slot {slot} does not hold generation {generation}"
        );
    }
    Ok(())
}

#[test]
fn a_remote_speaking_garbage_mid_stream_is_a_fault_the_host_survives() -> Result<()> {
    let svc = Service::start_config("[log]\nlevel = \"info\"\n", &[])?;
    let (back, front) = (free_port(), free_port());
    let front_port = front.to_string();
    svc.local_subsystem("back", BACK_NQN, &[], "16M", back)?;
    let faults = Arc::new(Faults::default());
    let via = format!("127.0.0.1:{}", proxy(back, faults.clone())?);
    svc.dpuctl_ok(&[
        "subsystem",
        "create",
        "front",
        "--nqn",
        FRONT_NQN,
        "--allow-any-host",
    ])?;
    svc.dpuctl_ok(&[
        "namespace",
        "create",
        "front",
        "--remote",
        &via,
        "--remote-nqn",
        BACK_NQN,
        "--remote-nsid",
        "1",
        "--queue-depth",
        "32",
    ])?;
    svc.dpuctl_ok(&[
        "listener",
        "create",
        "front",
        "--address",
        "127.0.0.1",
        "--port",
        &front_port,
    ])?;
    let pid = svc.pid().context("the service has exited")?;
    let (_, rss0) = dpu_e2e::rss_kib(pid)?;

    let (_ctrl, q, block) = connect(front, FRONT_NQN)?;
    ensure!((SLOT as u64).is_multiple_of(block), "block size {block}");
    let mut load = Load {
        q,
        block,
        rng: Rng::new(0x9a5b),
        written: vec![0; SLOTS],
        in_flight: HashMap::new(),
        next_gen: 0,
    };
    let warm = load.run(&faults, Duration::from_secs(20), |s, _| s.ok >= 1000)?;
    eprintln!("remote garbage: before any fault {warm:?}");

    let kinds = junk();
    for (what, bytes) in &kinds {
        *lock(&faults.sent) = None;
        *lock(&faults.closed) = None;
        *lock(&faults.next) = Some(bytes.clone());
        let seen = load
            .run(&faults, Duration::from_secs(30), |s, f| {
                lock(&f.closed).is_some() && s.ok_after >= 500
            })
            .with_context(|| format!("after {what}\nservice log:\n{}", svc.log_text()))?;
        let sent = lock(&faults.sent).context("sent")?;
        let closed = lock(&faults.closed).context("closed")?;
        let took = closed.saturating_duration_since(sent);
        eprintln!("remote garbage: {what}: connection ended after {took:?}, {seen:?}");
        ensure!(
            took < Duration::from_secs(2),
            "{what}: the service held the connection {took:?}"
        );
        ensure!(
            seen.longest < Duration::from_secs(5),
            "{what}: a write took {:?}",
            seen.longest
        );
    }
    load.drain()?;

    let (_, rss1) = dpu_e2e::rss_kib(pid)?;
    eprintln!("remote garbage: RSS {rss0} -> {rss1} KiB");
    ensure!(
        rss1.saturating_sub(rss0) < 128 << 10,
        "RSS grew from {rss0} to {rss1} KiB"
    );
    let log = svc.log_text();
    for l in log.lines().filter(|l| l.contains("out of reach")) {
        eprintln!("remote garbage: logged {l}");
    }
    ensure!(
        log.matches("remote namespace out of reach").count() == kinds.len(),
        "each fault is logged once:\n{log}"
    );
    for why in [
        "bad PDU from the controller",
        "which is not in flight",
        "the controller terminated the connection",
    ] {
        ensure!(log.contains(why), "the log does not say {why:?}:\n{log}");
    }
    let listed = svc.dpuctl_ok(&["namespace", "list", "front"])?;
    ensure!(listed.contains("serving"), "{listed}");

    verify(&mut load.q, block, &load.written, "through the service")?;
    let (_back_ctrl, mut direct, back_block) = connect(back, BACK_NQN)?;
    verify(
        &mut direct,
        back_block,
        &load.written,
        "straight from the remote",
    )?;
    Ok(())
}
