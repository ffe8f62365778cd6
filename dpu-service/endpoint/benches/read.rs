//! Reads through a storage endpoint: 4 KiB random at queue depth 1 and
//! 32, 128 KiB sequential at queue depth 16 (the issue's jobs). An
//! NVMe/TCP host (the crate `dpu-nvmeof`'s host-side codec over a smoltcp
//! client socket) and the endpoint joined by an in-memory wire, one
//! thread, a RAM namespace, a simulated clock that advances 10 µs a
//! round or to the next timer when nothing moved. Both stacks run on the
//! same core, so two rates are given: IOPS of the whole loop, and IOPS
//! per core of the endpoint alone (I/Os over the time spent inside
//! `Endpoint::receive` and `Endpoint::poll`: its TCP/IP stack, the
//! NVMe/TCP connection and the RAM copy; not the host's stack, nor the
//! frame copies the wire makes on the host side).
//!
//! Then, per I/O, what happened on the wire, counts that do not depend on
//! the machine's noise: frames each way, the endpoint's data segments,
//! ACK-only segments each way, retransmissions, `Endpoint::poll` calls,
//! and the rounds (and simulated microseconds) spent waiting for a timer
//! with nothing in flight. The kernel's TCP at MTU 1500 needs, for one
//! 4 KiB read, one request segment in and three data segments out, an
//! ACK or two back.
//!
//! ```text
//! cargo bench -p dpu-endpoint --bench read -- --secs 5 --runs 3 [--mtu 9000]
//! ```

#[path = "../src/testing.rs"]
#[allow(dead_code)]
mod testing;

use std::time::{Duration, Instant};

use dpu_rand::Rng;
use testing::{config, target, NvmeHost, Owned, Pair, Tally};

/// Namespace size: 64 MiB of 4 KiB blocks read at random.
const NS: u64 = 64 << 20;

struct Args {
    secs: f64,
    runs: usize,
    mtu: usize,
}

fn args() -> Args {
    let mut a = Args {
        secs: 3.0,
        runs: 3,
        mtu: 1500,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || -> String { it.next().expect("a value after the option") };
        match k.as_str() {
            "--secs" => a.secs = v().parse().expect("seconds"),
            "--runs" => a.runs = v().parse().expect("a count"),
            "--mtu" => a.mtu = v().parse().expect("an MTU"),
            // cargo bench passes --bench.
            _ => {}
        }
    }
    a
}

/// One of the issue's jobs.
#[derive(Clone, Copy)]
struct Job {
    name: &'static str,
    /// Bytes per read.
    size: u64,
    qd: usize,
    /// Random offsets, else sequential.
    random: bool,
}

const JOBS: [Job; 3] = [
    Job {
        name: "randread 4 KiB QD 1",
        size: 4096,
        qd: 1,
        random: true,
    },
    Job {
        name: "randread 4 KiB QD 32",
        size: 4096,
        qd: 32,
        random: true,
    },
    Job {
        name: "read 128 KiB QD 16",
        size: 128 << 10,
        qd: 16,
        random: false,
    },
];

/// What one run measured.
struct Outcome {
    /// IOPS of the whole loop.
    loop_iops: f64,
    /// IOPS per core of the endpoint alone.
    ep_iops: f64,
    ios: u64,
    to_ep: Tally,
    to_host: Tally,
    polls: u64,
    timer_waits: u64,
    timer_wait: Duration,
    /// Simulated time of the measured part.
    sim: Duration,
}

/// One run of `job`.
fn run(job: Job, secs: f64, mtu: usize) -> Outcome {
    let mut p = Pair::new(config(mtu), target(NS));
    let (_admin, cntlid) = NvmeHost::admin(&mut p, 40000);
    let mut io = NvmeHost::io(&mut p, 40001, cntlid);
    let blocks = NS / job.size;
    let per_io = u32::try_from(job.size / 512).expect("blocks per read");
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    let mut next = 0;
    let mut lba = || {
        let b = if job.random {
            rng.below(blocks)
        } else {
            next = (next + 1) % blocks;
            next
        };
        b * u64::from(per_io)
    };
    let mut outstanding = 0;
    for _ in 0..job.qd {
        io.submit_read(&mut p, lba(), per_io);
        outstanding += 1;
    }
    let (mut done, mut warm) = (0u64, true);
    let (mut start, mut busy0) = (Instant::now(), Duration::ZERO);
    let (mut in0, mut out0) = (Tally::default(), Tally::default());
    let (mut polls0, mut waits0, mut wait0, mut sim0) = (0, 0, Duration::ZERO, p.now);
    let limit = Duration::from_secs_f64(secs);
    let mut got = 0u64;
    loop {
        let Some(pdu) = io.next_pdu(&mut p) else {
            panic!("the connection ended");
        };
        let finished = match pdu {
            Owned::Data { success, data, .. } => {
                got += data.len() as u64;
                success
            }
            Owned::Resp(c) => {
                assert_eq!(c.status, 0);
                true
            }
            other => panic!("unexpected {other:?}"),
        };
        if !finished {
            continue;
        }
        assert_eq!(got, job.size, "bytes of one read");
        got = 0;
        outstanding -= 1;
        done += 1;
        if warm && done == 1000 {
            // Warmed up: count from here.
            warm = false;
            done = 0;
            start = Instant::now();
            busy0 = p.ep_busy;
            in0 = p.tally_to_ep.clone();
            out0 = p.tally_to_host.clone();
            (polls0, waits0, wait0, sim0) = (p.ep_polls, p.timer_waits, p.timer_wait_time, p.now);
        }
        if !warm && start.elapsed() >= limit {
            break;
        }
        while outstanding < job.qd {
            io.submit_read(&mut p, lba(), per_io);
            outstanding += 1;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let busy = (p.ep_busy - busy0).as_secs_f64();
    Outcome {
        loop_iops: done as f64 / wall,
        ep_iops: done as f64 / busy,
        ios: done,
        to_ep: p.tally_to_ep.since(&in0),
        to_host: p.tally_to_host.since(&out0),
        polls: p.ep_polls - polls0,
        timer_waits: p.timer_waits - waits0,
        timer_wait: p.timer_wait_time - wait0,
        sim: p.now - sim0,
    }
}

fn main() {
    let a = args();
    println!(
        "reads through the endpoint, MTU {}, {} s x {} runs (best of the runs by IOPS per endpoint core)",
        a.mtu, a.secs, a.runs
    );
    println!(
        "{:<22} {:>10} {:>12} {:>10}",
        "job", "loop IOPS", "IOPS/ep core", "ep MB/s"
    );
    let mut best = Vec::new();
    for job in JOBS {
        let mut b: Option<Outcome> = None;
        for _ in 0..a.runs {
            let r = run(job, a.secs, a.mtu);
            if b.as_ref().is_none_or(|b| r.ep_iops > b.ep_iops) {
                b = Some(r);
            }
        }
        let b = b.expect("at least one run");
        println!(
            "{:<22} {:>10.0} {:>12.0} {:>10.0}",
            job.name,
            b.loop_iops,
            b.ep_iops,
            b.ep_iops * job.size as f64 / 1e6
        );
        best.push((job, b));
    }
    println!();
    println!("per I/O on the wire (in: host to endpoint, out: endpoint to host)");
    println!(
        "{:<22} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>9}",
        "job",
        "frm in",
        "frm out",
        "data in",
        "dataout",
        "ack in",
        "ack out",
        "retx",
        "polls",
        "waits",
        "wait us",
        "sim us"
    );
    for (job, b) in &best {
        let n = b.ios.max(1) as f64;
        println!(
            "{:<22} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.3} {:>7.2} {:>7.3} {:>8.1} {:>9.1}",
            job.name,
            b.to_ep.frames as f64 / n,
            b.to_host.frames as f64 / n,
            b.to_ep.data as f64 / n,
            b.to_host.data as f64 / n,
            b.to_ep.ack_only as f64 / n,
            b.to_host.ack_only as f64 / n,
            (b.to_ep.retransmits + b.to_host.retransmits) as f64 / n,
            b.polls as f64 / n,
            b.timer_waits as f64 / n,
            b.timer_wait.as_secs_f64() * 1e6 / n,
            b.sim.as_secs_f64() * 1e6 / n,
        );
    }
}
