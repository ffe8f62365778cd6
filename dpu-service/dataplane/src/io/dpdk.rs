//! The DPDK driver: any PMD EAL can open (mlx5 on a BlueField; net_tap,
//! net_af_packet, net_pcap, net_ring, net_memif, net_null in development).

use std::sync::Arc;

use super::{Driver, IoError, LinkState, Packet, PortStats, RxQueue, TxQueue};

impl Packet for dpdk::Mbuf {
    fn len(&self) -> usize {
        self.data_len()
    }
    fn data(&self) -> &[u8] {
        dpdk::Mbuf::data(self)
    }
    fn data_mut(&mut self) -> &mut [u8] {
        dpdk::Mbuf::data_mut(self)
    }
    fn prepend(&mut self, len: usize) -> bool {
        dpdk::Mbuf::prepend(self, len).is_ok()
    }
    fn trim_front(&mut self, len: usize) -> bool {
        dpdk::Mbuf::trim_front(self, len)
    }
    fn try_clone(&self) -> Option<Self> {
        dpdk::Mbuf::try_clone(self).ok()
    }
}

/// A DPDK RX queue.
#[derive(Debug)]
pub struct DpdkRx(dpdk::RxQueue);

/// A DPDK TX queue.
#[derive(Debug)]
pub struct DpdkTx(dpdk::TxQueue);

impl RxQueue for DpdkRx {
    type Packet = dpdk::Mbuf;
    fn recv(&mut self, out: &mut Vec<dpdk::Mbuf>, max: usize) -> usize {
        self.0.recv_into(out, max)
    }
}

impl TxQueue for DpdkTx {
    type Packet = dpdk::Mbuf;
    fn send(&mut self, pkts: &mut Vec<dpdk::Mbuf>) -> usize {
        self.0.send_from(pkts)
    }
}

/// Started DPDK ports, indexed in the order given.
#[derive(Debug, Clone)]
pub struct DpdkDriver {
    eal: dpdk::Eal,
    ports: Arc<Vec<dpdk::Port>>,
}

impl DpdkDriver {
    /// A driver over already opened ports.
    pub fn new(eal: &dpdk::Eal, ports: Vec<dpdk::Port>) -> Self {
        Self {
            eal: eal.clone(),
            ports: Arc::new(ports),
        }
    }

    /// The DPDK port at `index`.
    pub fn port(&self, index: usize) -> Option<&dpdk::Port> {
        self.ports.get(index)
    }
}

fn queue_err(port: usize, e: dpdk::DpdkError) -> IoError {
    IoError::Queue {
        port,
        reason: e.to_string(),
    }
}

impl Driver for DpdkDriver {
    type Packet = dpdk::Mbuf;
    type Rx = DpdkRx;
    type Tx = DpdkTx;

    fn port_count(&self) -> usize {
        self.ports.len()
    }

    fn rx_queue(&self, port: usize, queue: u16) -> Result<DpdkRx, IoError> {
        let p = self.ports.get(port).ok_or(IoError::NoSuchPort(port))?;
        p.rx_queue(queue)
            .map(DpdkRx)
            .map_err(|e| queue_err(port, e))
    }

    fn tx_queue(&self, port: usize, queue: u16) -> Result<DpdkTx, IoError> {
        let p = self.ports.get(port).ok_or(IoError::NoSuchPort(port))?;
        p.tx_queue(queue)
            .map(DpdkTx)
            .map_err(|e| queue_err(port, e))
    }

    fn stats(&self, port: usize) -> PortStats {
        let Some(p) = self.ports.get(port) else {
            return PortStats::default();
        };
        let s = p.stats();
        PortStats {
            rx_packets: s.rx_packets,
            rx_bytes: s.rx_bytes,
            tx_packets: s.tx_packets,
            tx_bytes: s.tx_bytes,
            rx_missed: s.rx_missed,
            rx_errors: s.rx_errors,
            tx_errors: s.tx_errors,
        }
    }

    fn link(&self, port: usize) -> Option<LinkState> {
        let p = self.ports.get(port)?;
        let link = p.link();
        Some(LinkState {
            up: link.up,
            speed_mbps: link.speed_mbps,
            mac: p.mac(),
            mtu: u32::from(p.mtu()),
        })
    }

    type ThreadGuard = dpdk::ThreadRegistration;

    /// Registers the worker thread with EAL, so mempool caches serve it.
    fn enter_worker(&self) -> Result<dpdk::ThreadRegistration, IoError> {
        self.eal
            .register_thread()
            .map_err(|e| IoError::Thread(format!("registering the worker with EAL: {e}")))
    }
}
