//! Forwarding rate of the data-plane worker on one core: packets replayed
//! forever from a pcap by DPDK's net_pcap (`infinite_rx=1`), forwarded by
//! one worker with the empty pipeline (cross-connect) into net_null.
//! The same setup as `dpdk-testpmd --forward-mode=io` in ../shared/bench,
//! so the two can be compared side by side in one sitting.
//!
//! With `--rules DIR/rules.json` (from ../shared/bench/gen_data.py) the
//! worker runs the per-tenant switch instead, loaded with that set's
//! tenants (VLAN attachments on both ports) and rules: the setup the
//! bench harness gives Open vSwitch. Packets processed (forwarded or
//! dropped) per second is then the figure; `--flow-cache N` puts an
//! N-entry flow cache in front of the classifier (32 bytes an entry; it
//! serves tenants of 1,024 rules or more).
//!
//! ```text
//! cargo bench -p dpu-dataplane --bench forward --no-run
//! flock /tmp/bench.lock taskset -c 1 target/release/deps/forward-* \
//!     --pcap /tmp/vswitch-bench/data/plain/traffic.pcap --secs 10 --runs 3
//! D=/tmp/vswitch-bench/data/acl1_10k
//! flock /tmp/bench.lock taskset -c 1 target/release/deps/forward-* \
//!     --pcap $D/traffic.pcap --rules $D/rules.json --secs 10 --runs 3
//! ```
//! Prints one line per run and the median, in Mpps. `--cpu N` pins the
//! worker to CPU N (as `dataplane.worker_cpus` does in the daemon).
//! `bench/compare-testpmd.py` runs it interleaved with `dpdk-testpmd` io
//! forwarding on the same vdevs and prints the ratio.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dpu_dataplane::io::dpdk::DpdkDriver;
use dpu_dataplane::switch::SwitchHandle;
use dpu_dataplane::worker::{CrossConnect, Idle, WorkerConfig, Workers};

#[path = "common/rules.rs"]
mod rules;
use rules::switch_config;

struct Args {
    pcap: String,
    secs: f64,
    warmup: f64,
    runs: usize,
    huge: bool,
    rules: Option<String>,
    flow_cache: usize,
    cpu: Option<usize>,
}

fn args() -> Args {
    let mut a = Args {
        pcap: "/tmp/vswitch-bench/data/plain/traffic.pcap".into(),
        secs: 10.0,
        warmup: 2.0,
        runs: 3,
        huge: false,
        rules: None,
        flow_cache: 0,
        cpu: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--pcap" => a.pcap = val(),
            "--secs" => a.secs = val().parse().expect("--secs"),
            "--warmup" => a.warmup = val().parse().expect("--warmup"),
            "--runs" => a.runs = val().parse().expect("--runs"),
            "--huge" => a.huge = true,
            "--rules" => a.rules = Some(val()),
            "--flow-cache" => a.flow_cache = val().parse().expect("--flow-cache entries"),
            "--cpu" => a.cpu = Some(val().parse().expect("--cpu")),
            // cargo bench passes --bench; nothing else is expected.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// `a.b.c.d/len` as an inclusive IPv4 range.
fn main() {
    let a = args();
    let switch = a.rules.as_ref().map(|path| {
        let t = Instant::now();
        let cfg = switch_config(path, a.flow_cache);
        let rules: usize = cfg.tenants.iter().map(|t| t.rules.len()).sum();
        let h = SwitchHandle::new(&cfg).expect("switch configuration");
        println!(
            "switch: {} tenants, {rules} rules, compiled in {:.1} ms, flow cache {}",
            cfg.tenants.len(),
            t.elapsed().as_secs_f64() * 1e3,
            match a.flow_cache {
                0 => "off".to_string(),
                n => format!("{n} entries"),
            }
        );
        h
    });
    assert!(
        std::path::Path::new(&a.pcap).exists(),
        "{} is missing: run ../shared/bench/gen_data.py",
        a.pcap
    );
    let eal = dpdk::Eal::init(&dpdk::EalConfig {
        no_huge: !a.huge,
        no_pci: true,
        memory_mb: if a.huge { None } else { Some(1024) },
        extra: if a.huge {
            vec!["--in-memory".into()]
        } else {
            vec![]
        },
        file_prefix: Some(format!("dp-bench-{}", std::process::id())),
        vdevs: vec![
            format!("net_pcap0,rx_pcap={},infinite_rx=1", a.pcap),
            "net_null0".into(),
        ],
        log_level: Some("lib.eal:error".into()),
        ..Default::default()
    })
    .expect("EAL");
    // net_pcap's infinite_rx holds the whole capture in mbufs.
    let pool = Arc::new(dpdk::Mempool::new(&eal, "bench", 131_071, 256, 2176).expect("mempool"));
    let cfg = dpdk::PortConfig::default();
    let ports = vec![
        dpdk::Port::open(&eal, "net_pcap0", &cfg, pool.clone()).expect("net_pcap0"),
        dpdk::Port::open(&eal, "net_null0", &cfg, pool.clone()).expect("net_null0"),
    ];
    let driver = DpdkDriver::new(&eal, ports);
    let mut rates = Vec::new();
    for run in 1..=a.runs {
        let worker = WorkerConfig {
            rx: vec![(0, 0)],
            tx_queue: 0,
            cpu: a.cpu,
            idle: Idle::BusyPoll,
        };
        let mut w = match &switch {
            Some(h) => Workers::start(&driver, vec![worker], |i| h.pipeline_for(i)),
            None => Workers::start(&driver, vec![worker], |_| CrossConnect::new(&[(0, 1)])),
        }
        .expect("worker");
        std::thread::sleep(Duration::from_secs_f64(a.warmup));
        let (t0, c0) = (Instant::now(), w.totals());
        std::thread::sleep(Duration::from_secs_f64(a.secs));
        let (t1, c1) = (Instant::now(), w.totals());
        w.stop();
        let secs = (t1 - t0).as_secs_f64();
        let rx = (c1.rx_packets[0] - c0.rx_packets[0]) as f64 / secs / 1e6;
        let tx = (c1.tx_packets[1] - c0.tx_packets[1]) as f64 / secs / 1e6;
        println!("run {run}: rx {rx:.2} Mpps, forwarded {tx:.2} Mpps");
        // With rules, dropping is as much the work as forwarding.
        rates.push(if switch.is_some() { rx } else { tx });
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "median {}: {:.2} Mpps ({} runs of {} s)",
        if switch.is_some() {
            "processed (forwarded or dropped)"
        } else {
            "forwarded"
        },
        rates[rates.len() / 2],
        a.runs,
        a.secs
    );
}
