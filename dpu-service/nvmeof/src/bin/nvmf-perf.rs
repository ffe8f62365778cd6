//! `nvmf-perf`: an NVMe/TCP load generator in userspace, for benchmarks of
//! any NVMe/TCP target (ours, SPDK's nvmf_tgt, Linux nvmet).
//!
//! It connects an admin queue and one I/O queue per job, keeps `qd`
//! commands in flight on that queue for a fixed time, and prints IOPS,
//! bandwidth and latency percentiles (send of the command capsule to
//! receipt of its completion).
//!
//! ```text
//! nvmf-perf --addr 127.0.0.1:4420 --nqn nqn.2024-01.io.dpu-service:dev \
//!     --job randread:4k:1 --job randread:4k:32 --job randwrite:4k:32 --time 5
//! ```

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use dpu_nvmeof::host;
use dpu_nvmeof::pdu::{self, ControllerPdu, Digests, Limits};
use dpu_nvmeof::spec::{admin, nvm, sgl, Cqe, Sqe};

type Error = Box<dyn std::error::Error>;

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000001";

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

/// A queue: one TCP connection speaking NVMe/TCP as a host.
struct Queue {
    sock: TcpStream,
    limits: Limits,
    inbox: Vec<u8>,
    /// Unread bytes are `inbox[start..filled]`.
    start: usize,
    filled: usize,
    out: Vec<u8>,
    /// Copy C2HData payloads out (setup); the measured I/O drops them.
    keep_data: bool,
}

impl Queue {
    fn open(addr: &str) -> Result<Queue, Error> {
        let sock = TcpStream::connect(addr)?;
        sock.set_nodelay(true)?;
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

    /// The next controller PDU, reading as needed.
    fn next(&mut self) -> Result<Owned, Error> {
        loop {
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
                return Ok(o);
            }
            if self.filled == self.inbox.len() {
                self.inbox.copy_within(self.start..self.filled, 0);
                (self.start, self.filled) = (0, self.filled - self.start);
            }
            let n = self.sock.read(&mut self.inbox[self.filled..])?;
            if n == 0 {
                return Err("target closed the connection".into());
            }
            self.filled += n;
        }
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
    let d = host::connect_data(*b"nvmf-perf-hostid", cntlid, nqn, HOSTNQN);
    let (c, _) = q.call(&s, &d)?;
    Ok(c.dw0 as u16)
}

/// The namespace's size in blocks and its block size, and the in-capsule
/// data the I/O queues accept.
fn setup(admin_q: &mut Queue, nqn: &str) -> Result<(u16, u64, u32, u32), Error> {
    let cntlid = connect(admin_q, 0, 0xffff, nqn, 32)?;
    admin_q.call(&host::enable(1), &[])?;
    let mut s = host::command(admin::SET_FEATURES, 2);
    s.0[39] = 0;
    s.0[40] = 0x07;
    s.0[44..48].copy_from_slice(&(7u32 | 7 << 16).to_le_bytes());
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

struct Result_ {
    ios: u64,
    secs: f64,
    lat_ns: Vec<u32>,
}

#[allow(clippy::too_many_arguments)]
fn run(
    addr: &str,
    nqn: &str,
    cntlid: u16,
    qid: u16,
    blocks: u64,
    lba: u32,
    in_capsule: u32,
    job: Job,
    time: Duration,
) -> Result<Result_, Error> {
    let mut q = Queue::open(addr)?;
    connect(&mut q, qid, cntlid, nqn, job.qd.max(2) + 1)?;
    q.keep_data = false;
    let per = u64::from(job.bs / lba);
    let span = (blocks / per).max(1);
    let mut rng = 0x2545_f491_4f6c_dd1du64 ^ u64::from(qid);
    let mut seq = 0u64;
    let data = vec![0xa5u8; job.bs as usize];
    let mut sent_at = vec![Instant::now(); usize::from(job.qd)];
    let mut lat = Vec::with_capacity(1 << 20);
    let mut ios = 0u64;
    let issue = |q: &mut Queue, cid: u16, rng: &mut u64, seq: &mut u64| {
        let slot = if job.random {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            *rng % span
        } else {
            *seq = (*seq + 1) % span;
            *seq
        };
        let mut s = host::command(if job.write { nvm::WRITE } else { nvm::READ }, cid);
        s.0[4..8].copy_from_slice(&1u32.to_le_bytes());
        s.0[32..36].copy_from_slice(&job.bs.to_le_bytes());
        s.0[40..48].copy_from_slice(&(slot * per).to_le_bytes());
        s.0[48..50].copy_from_slice(&((per - 1) as u16).to_le_bytes());
        if job.write && job.bs <= in_capsule {
            s.0[39] = sgl::IN_CAPSULE;
            pdu::encode_capsule_cmd(&mut q.out, Digests::default(), &s, &data);
        } else {
            pdu::encode_capsule_cmd(&mut q.out, Digests::default(), &s, &[]);
        }
    };
    let start = Instant::now();
    let end = start + time;
    for cid in 0..job.qd {
        sent_at[usize::from(cid)] = Instant::now();
        issue(&mut q, cid, &mut rng, &mut seq);
    }
    q.flush()?;
    let mut outstanding = job.qd;
    while outstanding > 0 {
        let done = match q.next()? {
            Owned::Resp(c) => {
                if c.status >> 1 != 0 {
                    return Err(format!("I/O failed: status {:#x}", c.status).into());
                }
                Some(c.cid)
            }
            Owned::Data { cccid, success, .. } => success.then_some(cccid),
            Owned::R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            } => {
                let chunk = &data[r2to as usize..(r2to + r2tl) as usize];
                pdu::encode_h2c_data(
                    &mut q.out,
                    Digests::default(),
                    cccid,
                    ttag,
                    r2to,
                    chunk,
                    true,
                );
                q.flush()?;
                None
            }
            Owned::IcResp => return Err("unexpected ICResp".into()),
        };
        let Some(cid) = done else { continue };
        let now = Instant::now();
        let i = usize::from(cid);
        lat.push(
            now.duration_since(sent_at[i])
                .as_nanos()
                .min(u128::from(u32::MAX)) as u32,
        );
        ios += 1;
        if now < end {
            sent_at[i] = now;
            issue(&mut q, cid, &mut rng, &mut seq);
            // Send as soon as nothing more is already waiting to be read.
            if q.filled - q.start < pdu::CH_LEN {
                q.flush()?;
            }
        } else {
            outstanding -= 1;
        }
        if q.filled - q.start < pdu::CH_LEN && !q.out.is_empty() {
            q.flush()?;
        }
    }
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
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--addr" => addr = val()?,
            "--nqn" => nqn = val()?,
            "--job" => jobs.push(val()?.parse()?),
            "--time" => time = Duration::from_secs_f64(val()?.parse()?),
            "--bench" => {}
            "-h" | "--help" => {
                println!("usage: nvmf-perf [--addr HOST:PORT] [--nqn NQN] [--time SECS] [--job PATTERN:BS:QD]...");
                return Ok(());
            }
            _ => return Err(format!("unknown argument {a}").into()),
        }
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
    let (cntlid, blocks, lba, in_capsule) = setup(&mut admin_q, &nqn)?;
    println!("# {addr} {nqn}: {blocks} blocks of {lba} bytes, in-capsule data up to {in_capsule} bytes, {time:?} per job");
    println!(
        "{:<22} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "job", "IOPS", "MB/s", "p50 us", "p99 us", "p99.9 us", "max us"
    );
    for (i, job) in jobs.iter().enumerate() {
        let qid = (i % 8) as u16 + 1;
        let mut r = run(
            &addr, &nqn, cntlid, qid, blocks, lba, in_capsule, *job, time,
        )?;
        r.lat_ns.sort_unstable();
        let iops = r.ios as f64 / r.secs;
        println!(
            "{:<22} {:>10.0} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            job.to_string(),
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
