//! 4 KiB random reads through a storage endpoint, queue depth 1 and 32:
//! an NVMe/TCP host (the crate `dpu-nvmeof`'s host-side codec over a
//! smoltcp client socket) and the endpoint joined by an in-memory wire,
//! one thread, a RAM namespace. Both stacks run on the same core, so two
//! figures are given: IOPS of the whole loop, and IOPS per core of the
//! endpoint alone (I/Os over the time spent inside `Endpoint::receive`
//! and `Endpoint::poll`: its TCP/IP stack, the NVMe/TCP connection and
//! the RAM copy; not the host's stack, nor the frame copies the wire
//! makes on the host side).
//!
//! ```text
//! cargo bench -p dpu-endpoint --bench read -- --secs 5 --runs 3 [--mtu 9000]
//! ```

#[path = "../src/testing.rs"]
#[allow(dead_code)]
mod testing;

use std::time::{Duration, Instant};

use testing::{config, target, NvmeHost, Owned, Pair};

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

/// One run at queue depth `qd`: (IOPS of the loop, IOPS per endpoint core).
fn run(qd: usize, secs: f64, mtu: usize) -> (f64, f64) {
    let mut p = Pair::new(config(mtu), target(NS));
    let (_admin, cntlid) = NvmeHost::admin(&mut p, 40000);
    let mut io = NvmeHost::io(&mut p, 40001, cntlid);
    let blocks = NS / 4096;
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut lba = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % blocks) * 8
    };
    let mut outstanding = 0;
    let submit = |io: &mut NvmeHost, p: &mut Pair, slba| {
        io.submit_read(p, slba, 8);
    };
    for _ in 0..qd {
        submit(&mut io, &mut p, lba());
        outstanding += 1;
    }
    let (mut done, mut warm) = (0u64, true);
    let (mut start, mut busy0) = (Instant::now(), Duration::ZERO);
    let limit = Duration::from_secs_f64(secs);
    loop {
        let Some(pdu) = io.next_pdu(&mut p) else {
            panic!("the connection ended");
        };
        let finished = match pdu {
            Owned::Data { success, data, .. } => {
                assert_eq!(data.len(), 4096);
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
        outstanding -= 1;
        done += 1;
        if warm && done == 1000 {
            // Warmed up: count from here.
            warm = false;
            done = 0;
            start = Instant::now();
            busy0 = p.ep_busy;
        }
        if !warm && start.elapsed() >= limit {
            break;
        }
        while outstanding < qd {
            submit(&mut io, &mut p, lba());
            outstanding += 1;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let busy = (p.ep_busy - busy0).as_secs_f64();
    (done as f64 / wall, done as f64 / busy)
}

fn main() {
    let a = args();
    println!(
        "4 KiB random read through the endpoint, MTU {}, {} s x {} runs",
        a.mtu, a.secs, a.runs
    );
    println!(
        "{:>4} {:>14} {:>22}",
        "QD", "loop IOPS", "IOPS per endpoint core"
    );
    for qd in [1, 32] {
        let mut best = (0.0f64, 0.0f64);
        for _ in 0..a.runs {
            let r = run(qd, a.secs, a.mtu);
            if r.1 > best.1 {
                best = r;
            }
        }
        println!("{qd:>4} {:>14.0} {:>22.0}", best.0, best.1);
    }
}
