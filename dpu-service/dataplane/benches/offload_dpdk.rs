//! Flow offload against none through DPDK, one worker, side by side in
//! one run.
//!
//! A "NIC" thread plays the embedded switch in front of the worker: it
//! receives from a DPDK `net_pcap` port, lets the model NIC (the same
//! code the daemon runs with `provider = "model"`) carry the frames of
//! offloaded flows straight to a `net_null` port, and hands the others to
//! the worker through a bounded queue (a representor's receive ring).
//! The worker is the daemon's own worker loop (`Workers` over a driver
//! whose receive queues are those rings and whose transmit queues are
//! DPDK's) running the per-tenant switch. So what the worker spends is
//! what a BlueField's Arm cores would: nothing for the packets the
//! eSwitch carries.
//!
//! One tenant, two stations on VLANs 10 and 20 of port 0, `--flows` TCP
//! connections from the first to the second's port 80, allowed by a
//! stateful rule. Two phases per mode (no offload, then the model):
//! - **setup**: `--setup` connections' handshakes and first segments
//!   each way (SYN, SYN+ACK, ACK, ACK back; blocks of 64 connections),
//!   read from a pcap and queued whole before the worker may take any:
//!   connections a second through the worker, offers to the offload
//!   thread included;
//! - **steady**: data segments of the first `--flows` connections both
//!   ways, replayed from a pcap for `--secs`: the worker's CPU time (its
//!   thread's, from /proc) per delivered packet (sent by the worker or
//!   carried by the NIC).
//!
//! ```text
//! cargo bench -p dpu-dataplane --bench offload_dpdk -- --setup 32768 --flows 4096 --secs 5 --runs 3
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use dpu_dataplane::io::dpdk::{DpdkDriver, DpdkTx};
use dpu_dataplane::io::{Driver, IoError, LinkState, PortStats, RxQueue};
use dpu_dataplane::offload::model::{ModelLane, ModelLimits, ModelNic};
use dpu_dataplane::offload::{FlowAction, OffloadConfig, OffloadLink, Offloader};
use dpu_dataplane::switch::{Attach, SwitchHandle};
use dpu_dataplane::worker::{Idle, VlanOp, WorkerConfig, Workers};

#[path = "common/web.rs"]
mod web;
use web::{tcp_frame, web_switch, ACK, PSH_ACK, SYN, SYN_ACK};

/// Connections per block of the setup capture.
const BLOCK: usize = 64;
/// Frames the representor ring holds.
const RING: usize = 1024;
/// The worker's CPU; the NIC and offload threads share CPU 0, as they
/// would not share the worker's core on a DPU.
const WORKER_CPU: usize = 1;

struct Args {
    flows: usize,
    setup: usize,
    secs: u64,
    runs: usize,
    dir: PathBuf,
}

fn args() -> Args {
    let mut a = Args {
        flows: 4096,
        setup: 32_768,
        secs: 5,
        runs: 3,
        dir: std::env::temp_dir().join(format!("offload-dpdk-{}", std::process::id())),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--flows" => a.flows = v().parse().expect("--flows N"),
            "--setup" => a.setup = v().parse().expect("--setup N"),
            "--secs" => a.secs = v().parse().expect("--secs N"),
            "--runs" => a.runs = v().parse().expect("--runs N"),
            "--dir" => a.dir = PathBuf::from(v()),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// A 68-byte tagged TCP/IPv4 frame of connection `flow`: from the
/// client (VLAN 10, MAC :01, 10.0.0.1) to the server (VLAN 20, MAC :02,
/// 10.0.0.2:80), or back.
fn frame(flow: usize, back: bool, flags: u8) -> Vec<u8> {
    tcp_frame(0x0a00_0001, flow as u32, back, flags, Some((10, 20)))
}

/// Writes `frames` as a classic pcap capture (Ethernet).
fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut f = Vec::new();
    f.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&65535u32.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes());
    for p in frames {
        let len = u32::try_from(p.len()).unwrap();
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&len.to_le_bytes());
        f.extend_from_slice(&len.to_le_bytes());
        f.extend_from_slice(p);
    }
    std::fs::write(path, f).expect("writing a capture");
}

/// The setup capture (`setup` connections' handshakes) and the steady
/// one (the first `flows` connections' data).
fn captures(dir: &Path, setup_flows: usize, flows: usize) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).expect("capture folder");
    let mut setup = Vec::with_capacity(setup_flows * 4);
    for start in (0..setup_flows).step_by(BLOCK) {
        let block = start..(start + BLOCK).min(setup_flows);
        for (back, flags) in [(false, SYN), (true, SYN_ACK), (false, ACK), (true, ACK)] {
            setup.extend(block.clone().map(|i| frame(i, back, flags)));
        }
    }
    let steady: Vec<Vec<u8>> = (0..flows)
        .flat_map(|i| [frame(i, false, PSH_ACK), frame(i, true, ACK)])
        .collect();
    let (s, d) = (dir.join("setup.pcap"), dir.join("steady.pcap"));
    write_pcap(&s, &setup);
    write_pcap(&d, &steady);
    (s, d)
}

fn handle(flows: usize) -> SwitchHandle {
    web_switch(1, vec![Attach::port(0, 10), Attach::port(0, 20)], flows)
}

/// The worker's driver: its one port receives from the representor ring
/// the NIC thread fills and sends through DPDK transmit queue 0 of a
/// `net_null` port (the NIC thread has queue 1).
#[derive(Clone)]
struct Front {
    inner: DpdkDriver,
    ring: Arc<ArrayQueue<dpdk::Mbuf>>,
    /// The ring delivers only once set (the setup phase fills it first).
    open: Arc<AtomicBool>,
}

struct FrontRx(Arc<ArrayQueue<dpdk::Mbuf>>, Arc<AtomicBool>);

impl RxQueue for FrontRx {
    type Packet = dpdk::Mbuf;
    fn recv(&mut self, out: &mut Vec<dpdk::Mbuf>, max: usize) -> usize {
        if !self.1.load(Ordering::Acquire) {
            return 0;
        }
        let mut n = 0;
        while n < max && out.len() < out.capacity() {
            let Some(m) = self.0.pop() else { break };
            out.push(m);
            n += 1;
        }
        n
    }
}

impl Driver for Front {
    type Packet = dpdk::Mbuf;
    type Rx = FrontRx;
    type Tx = DpdkTx;
    type ThreadGuard = <DpdkDriver as Driver>::ThreadGuard;

    fn port_count(&self) -> usize {
        1
    }
    fn rx_queue(&self, _port: usize, _queue: u16) -> Result<FrontRx, IoError> {
        Ok(FrontRx(self.ring.clone(), self.open.clone()))
    }
    fn tx_queue(&self, port: usize, queue: u16) -> Result<DpdkTx, IoError> {
        self.inner.tx_queue(port, queue)
    }
    fn stats(&self, port: usize) -> PortStats {
        self.inner.stats(port)
    }
    fn packet_from(&self, frame: &[u8]) -> Option<dpdk::Mbuf> {
        self.inner.packet_from(frame)
    }
    fn link(&self, port: usize) -> Option<LinkState> {
        self.inner.link(port)
    }
    fn enter_worker(&self) -> Result<Self::ThreadGuard, IoError> {
        self.inner.enter_worker()
    }
}

/// What the NIC thread shares with the bench.
#[derive(Default)]
struct Nic {
    stop: AtomicBool,
    /// The port it receives from now, and whether its frames may be
    /// dropped when the ring is full (the steady phase) or must wait.
    input: Mutex<Option<(dpdk::Port, bool)>>,
    /// Bumped at each change of `input`.
    changes: AtomicU64,
    /// Frames it read.
    read: AtomicU64,
    /// Frames the model carried (sent, or dropped by a drop rule).
    carried: AtomicU64,
    /// Frames the full ring dropped.
    overflow: AtomicU64,
}

impl Nic {
    /// Makes the NIC thread receive from `input` (`None`: nothing).
    fn set(&self, input: Option<(dpdk::Port, bool)>) {
        *self.input.lock().unwrap() = input;
        self.changes.fetch_add(1, Ordering::Release);
    }
}

/// The NIC thread: the model (if any) carries what it can, the rest
/// goes to the worker's ring.
fn nic_thread(
    nic: Arc<Nic>,
    ring: Arc<ArrayQueue<dpdk::Mbuf>>,
    mut model: Option<ModelLane>,
    null: DpdkDriver,
) {
    let _eal = null.enter_worker().expect("an EAL thread");
    let mut tx = null
        .port(0)
        .expect("net_null0")
        .tx_queue(1)
        .expect("the NIC's transmit queue");
    let mut seen = u64::MAX;
    let mut current: Option<(dpdk::RxQueue, bool)> = None;
    let mut batch = dpdk::MbufBatch::new();
    let mut out = dpdk::MbufBatch::new();
    let mut empty = 0u32;
    while !nic.stop.load(Ordering::Relaxed) {
        if let Some(m) = &mut model {
            m.turn();
        }
        let changes = nic.changes.load(Ordering::Acquire);
        if changes != seen {
            seen = changes;
            current = None;
            if let Some((port, lossy)) = nic.input.lock().unwrap().as_ref() {
                current = Some((port.rx_queue(0).expect("rx queue"), *lossy));
            }
        }
        let Some((rx, lossy)) = current.as_mut() else {
            std::thread::sleep(Duration::from_micros(100));
            continue;
        };
        let lossy = *lossy;
        let n = rx.recv(&mut batch);
        if n == 0 {
            empty += 1;
            if empty > 1000 {
                std::thread::sleep(Duration::from_micros(50));
            }
            continue;
        }
        empty = 0;
        nic.read.fetch_add(n as u64, Ordering::Relaxed);
        let now = Instant::now();
        let mut carried = 0;
        for mut m in batch.drain() {
            match model.as_ref().and_then(|l| l.carry(0, m.data(), now)) {
                Some(FlowAction::Forward(e)) => {
                    carried += 1;
                    if let VlanOp::Set(v) = e.vlan {
                        let d = m.data_mut();
                        let tci = u16::from_be_bytes([d[14], d[15]]) & 0xf000 | v;
                        d[14..16].copy_from_slice(&tci.to_be_bytes());
                    }
                    let _ = out.push(m);
                }
                Some(FlowAction::Drop) => carried += 1,
                None => {
                    let mut m = m;
                    loop {
                        match ring.push(m) {
                            Ok(()) => break,
                            Err(back) if lossy => {
                                drop(back);
                                nic.overflow.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            Err(back) => {
                                m = back;
                                std::thread::yield_now();
                            }
                        }
                    }
                }
            }
        }
        nic.carried.fetch_add(carried, Ordering::Relaxed);
        while !out.is_empty() {
            tx.send(&mut out);
        }
    }
}

/// CPU seconds of this process's thread named `name`.
fn thread_cpu(name: &str) -> f64 {
    for t in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = t.expect("task").path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).expect("stat");
        // Fields after the command's closing parenthesis; utime and stime
        // are the 14th and 15th of the whole line.
        let rest = &stat[stat.rfind(')').expect("stat") + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        return ticks as f64 / 100.0;
    }
    panic!("no thread {name}")
}

#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    setup_per_sec: f64,
    delivered: u64,
    worker_cpu: f64,
    worker_rx: u64,
    overflow: u64,
    /// Offers installed, and refused (full lane and the like).
    offers: (u64, u64),
}

struct Ports {
    eal: dpdk::Eal,
    pool: Arc<dpdk::Mempool>,
    next: usize,
}

impl Ports {
    fn open(&mut self, cfg: &dpdk::PortConfig) -> dpdk::Port {
        let name = format!("net_pcap{}", self.next);
        self.next += 1;
        dpdk::Port::open(&self.eal, &name, cfg, self.pool.clone()).expect("a capture port")
    }
}

fn measure(
    ports: &mut Ports,
    null: &dpdk::Port,
    setup_flows: usize,
    secs: u64,
    model: bool,
) -> Figures {
    let h = handle(setup_flows);
    // Room for the whole setup capture: it is queued before the worker
    // may take any, so the worker's rate is what is timed.
    let ring = Arc::new(ArrayQueue::new(RING.max(setup_flows * 4)));
    let mut offloader = None;
    let mut offers = (0, 0);
    let mut lane = None;
    if model {
        let config = OffloadConfig {
            table: setup_flows * 4,
            per_tenant: setup_flows * 4,
            reserved: 0,
            insert_rate: u32::MAX,
            lane_queue: 65_536,
            poll: Duration::from_millis(200),
        };
        let limits = ModelLimits {
            table: setup_flows * 4,
            ..ModelLimits::default()
        };
        let (nic, mut models) = ModelNic::new(limits, 1);
        let (o, lanes) = Offloader::start(nic, config, 1).expect("offload thread");
        h.attach_offload(OffloadLink::each(lanes, None, Duration::from_secs(600), 0));
        lane = models.pop();
        offloader = Some(o);
    }
    let nic = Arc::new(Nic::default());
    let inner = DpdkDriver::new(&ports.eal, vec![null.clone()]);
    let nic_join = {
        let (nic, ring, null) = (nic.clone(), ring.clone(), inner.clone());
        std::thread::Builder::new()
            .name("nic".into())
            .spawn(move || nic_thread(nic, ring, lane, null))
            .expect("NIC thread")
    };
    let open = Arc::new(AtomicBool::new(false));
    let front = Front {
        inner,
        ring,
        open: open.clone(),
    };
    let cfg = WorkerConfig {
        rx: vec![(0, 0)],
        tx_queue: 0,
        cpu: Some(WORKER_CPU),
        idle: Idle::Backoff {
            spins: 1000,
            max: Duration::from_micros(200),
        },
    };
    let mut workers = Workers::start(&front, vec![cfg], |_| h.pipeline()).expect("worker");
    let rx = |w: &Workers| w.totals().rx_packets[0];
    let tx = |w: &Workers| w.totals().tx_packets[0];

    // Setup: the handshakes, once.
    let setup = ports.open(&dpdk::PortConfig {
        tx_queues: 1,
        ..dpdk::PortConfig::default()
    });
    nic.set(Some((setup.clone(), false)));
    let want = (setup_flows * 4) as u64;
    let t0 = Instant::now();
    while (front.ring.len() as u64) < want {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the capture stalled"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    let start = Instant::now();
    open.store(true, Ordering::Release);
    while rx(&workers) < want {
        assert!(start.elapsed() < Duration::from_secs(120), "setup stalled");
        std::thread::sleep(Duration::from_micros(200));
    }
    let setup_secs = start.elapsed().as_secs_f64();
    nic.set(None);
    drop(setup);
    if let Some(o) = &offloader {
        let t0 = Instant::now();
        // Every offer installed, or refused (a full lane: the worker
        // offered faster than the thread inserts; those stay in software).
        let settled = |s: &dpu_dataplane::offload::OffloadStatus| {
            s.offloaded
                + s.lane_full
                + s.over_quota
                + s.rate_limited
                + s.table_full
                + s.insert_failed
        };
        while settled(&o.status()) < (setup_flows * 2) as u64 {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "offers stalled: {:?}",
                o.status()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = o.status();
        offers = (s.offloaded, settled(&s) - s.offloaded);
    }

    // Steady: the data segments, replayed.
    let steady = ports.open(&dpdk::PortConfig {
        tx_queues: 1,
        ..dpdk::PortConfig::default()
    });
    nic.set(Some((steady.clone(), true)));
    std::thread::sleep(Duration::from_millis(500));
    let (cpu0, tx0, rx0) = (thread_cpu("dp-worker-0"), tx(&workers), rx(&workers));
    let (carried0, over0) = (
        nic.carried.load(Ordering::Relaxed),
        nic.overflow.load(Ordering::Relaxed),
    );
    std::thread::sleep(Duration::from_secs(secs));
    let cpu = thread_cpu("dp-worker-0") - cpu0;
    let delivered = tx(&workers) - tx0 + nic.carried.load(Ordering::Relaxed) - carried0;
    let f = Figures {
        setup_per_sec: setup_flows as f64 / setup_secs,
        delivered,
        worker_cpu: cpu,
        worker_rx: rx(&workers) - rx0,
        overflow: nic.overflow.load(Ordering::Relaxed) - over0,
        offers,
    };
    nic.set(None);
    nic.stop.store(true, Ordering::Relaxed);
    nic_join.join().expect("NIC thread");
    workers.stop();
    while let Some(m) = front.ring.pop() {
        drop(m);
    }
    drop(steady);
    if let Some(o) = offloader {
        o.stop();
    }
    f
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let a = args();
    // Threads started from here (the NIC's, the offload thread) inherit
    // CPU 0.
    dpu_os::affinity::pin_current_thread(0).expect("CPU 0");
    let setup_flows = a.setup.max(a.flows);
    let (setup, steady) = captures(&a.dir, setup_flows, a.flows);
    let mut vdevs = Vec::new();
    for _ in 0..a.runs * 2 {
        vdevs.push(format!(
            "net_pcap{},rx_pcap={}",
            vdevs.len(),
            setup.display()
        ));
        vdevs.push(format!(
            "net_pcap{},rx_pcap={},infinite_rx=1",
            vdevs.len(),
            steady.display()
        ));
    }
    vdevs.push("net_null0".into());
    let eal = dpdk::Eal::init(&dpdk::EalConfig {
        no_huge: true,
        no_pci: true,
        memory_mb: Some(1024),
        file_prefix: Some(format!("offload-dpdk-{}", std::process::id())),
        vdevs,
        log_level: Some("lib.eal:error".into()),
        ..Default::default()
    })
    .expect("EAL");
    // Room for the whole setup capture queued at once, the steady one
    // (loaded whole by net_pcap) and what is in flight; 68-byte frames.
    let count = u32::try_from(setup_flows * 4 + a.flows * 2 + 16_384).expect("pool size");
    let pool = Arc::new(dpdk::Mempool::new(&eal, "bench", count, 256, 384).expect("pool"));
    let null = dpdk::Port::open(
        &eal,
        "net_null0",
        &dpdk::PortConfig {
            tx_queues: 2,
            ..dpdk::PortConfig::default()
        },
        pool.clone(),
    )
    .expect("net_null0");
    let mut ports = Ports {
        eal: eal.clone(),
        pool,
        next: 0,
    };
    println!(
        "setup {setup_flows} connections; steady {} connections for {} s a run; {} runs; \
         worker ns = worker CPU time per delivered packet",
        a.flows, a.secs, a.runs
    );
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for run in 0..a.runs {
        for model in [false, true] {
            let f = measure(&mut ports, &null, setup_flows, a.secs, model);
            let ns = f.worker_cpu * 1e9 / f.delivered.max(1) as f64;
            println!(
                "run {run} {:<5} setup {:>9.0} conn/s | steady {:>9.0} pkt/s delivered, worker {:.2} s CPU, \
                 {:>8.1} ns/pkt, saw {} (ring overflow {}); offers {} installed, {} refused",
                if model { "model" } else { "off" },
                f.setup_per_sec,
                f.delivered as f64 / a.secs as f64,
                f.worker_cpu,
                ns,
                f.worker_rx,
                f.overflow,
                f.offers.0,
                f.offers.1
            );
            if model { &mut on } else { &mut off }.push((f.setup_per_sec, ns));
        }
    }
    let setup_off = median(off.iter().map(|x| x.0).collect());
    let setup_on = median(on.iter().map(|x| x.0).collect());
    let ns_off = median(off.iter().map(|x| x.1).collect());
    let ns_on = median(on.iter().map(|x| x.1).collect());
    println!(
        "median: setup {setup_off:.0} off, {setup_on:.0} model ({:.2}x); worker ns per delivered packet \
         {ns_off:.1} off, {ns_on:.2} model ({:.1}x fewer)",
        setup_on / setup_off,
        ns_off / ns_on.max(1e-3)
    );
    let _ = std::fs::remove_dir_all(&a.dir);
}
