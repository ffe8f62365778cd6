//! Shared setup of the DPDK integration tests: EAL on `--no-huge` with the
//! given vdevs, one pool, every vdev opened as a port in order, and one
//! worker polling all ports.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dpu_dataplane::io::dpdk::DpdkDriver;
use dpu_dataplane::worker::{CrossConnect, Idle, WorkerConfig, Workers};

/// What a test holds while traffic flows.
pub struct Rig {
    /// The pool every port receives into; its in-use count shows leaks.
    pub pool: Arc<dpdk::Mempool>,
    /// The ports, in vdev order.
    pub driver: DpdkDriver,
}

/// Starts EAL with `vdevs` (devargs; the port name is the part before the
/// first comma) and opens each as a port.
pub fn rig(tag: &str, vdevs: Vec<String>) -> Rig {
    let eal = dpdk::Eal::init(&dpdk::EalConfig {
        lcores: Some("0".into()),
        no_huge: true,
        no_pci: true,
        memory_mb: Some(256),
        file_prefix: Some(format!("dp-{tag}-{}", std::process::id())),
        vdevs: vdevs.clone(),
        log_level: Some("lib.eal:error".into()),
        ..Default::default()
    })
    .expect("EAL");
    let pool = Arc::new(dpdk::Mempool::new(&eal, tag, 4095, 0, 2176).expect("pool"));
    let cfg = dpdk::PortConfig::default();
    let ports = vdevs
        .iter()
        .map(|v| {
            let name = v.split(',').next().unwrap_or(v);
            dpdk::Port::open(&eal, name, &cfg, pool.clone())
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        })
        .collect();
    Rig {
        pool,
        driver: DpdkDriver::new(&eal, ports),
    }
}

/// One worker polling queue 0 of every port, wired by `pairs`.
pub fn worker(rig: &Rig, pairs: &[(usize, usize)]) -> Workers {
    use dpu_dataplane::io::Driver;
    let cfg = WorkerConfig {
        rx: (0..rig.driver.port_count()).map(|p| (p, 0)).collect(),
        tx_queue: 0,
        cpu: None,
        idle: Idle::Backoff {
            spins: 1000,
            max: Duration::from_micros(200),
        },
    };
    Workers::start(&rig.driver, vec![cfg], |_| CrossConnect::new(pairs)).expect("worker starts")
}

/// Writes `packets` as a classic pcap capture (Ethernet link type), the
/// input format of net_pcap's `rx_pcap`.
#[allow(dead_code)] // not every test binary feeds captures
pub fn write_pcap(path: &Path, packets: &[Vec<u8>]) {
    let mut f = Vec::new();
    f.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&0i32.to_le_bytes());
    f.extend_from_slice(&0u32.to_le_bytes());
    f.extend_from_slice(&65535u32.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
    for (i, p) in packets.iter().enumerate() {
        let len = u32::try_from(p.len()).unwrap();
        f.extend_from_slice(&u32::try_from(i).unwrap().to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&len.to_le_bytes());
        f.extend_from_slice(&len.to_le_bytes());
        f.extend_from_slice(p);
    }
    std::fs::write(path, f).unwrap();
}
