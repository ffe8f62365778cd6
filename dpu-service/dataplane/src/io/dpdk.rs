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

/// A port for [`DpdkDriver::open`] to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpdkPort {
    /// The caller's name of the port, for errors.
    pub id: String,
    /// The devargs EAL probes: of a virtual device
    /// ("net_tap0,iface=pf0vf0") or of a bus device
    /// ("0000:03:00.0,representor=vf[0-3]").
    pub devargs: String,
    /// DPDK's name of the port, if it is not the devargs' first field
    /// (e.g. an mlx5 representor).
    pub name: Option<String>,
    /// IP MTU to set on the port; `None` keeps the driver's.
    pub mtu: Option<u16>,
}

/// Room for headers around a port's IP MTU in a packet buffer: Ethernet
/// header, two VLAN tags, frame check sequence.
const L2_ROOM: usize = 14 + 2 * 4 + 4;

/// Headroom DPDK keeps at the front of every packet buffer
/// (`RTE_PKTMBUF_HEADROOM`).
const HEADROOM: usize = 128;

/// A packet buffer's data room (headroom included) for `ports`: a whole
/// standard frame, or the largest frame a port's MTU allows, in one
/// buffer (the data plane does not chain buffers), in whole KiB. `None` when that is
/// beyond what a buffer can hold.
pub fn data_room(ports: &[DpdkPort]) -> Option<u16> {
    let frame = ports
        .iter()
        .filter_map(|p| p.mtu)
        .map(|m| usize::from(m) + L2_ROOM)
        .max()
        .unwrap_or(0)
        .max(2048)
        // Whole KiB: drivers that receive into a ring of their own
        // frames (net_af_packet's `framesz`) want a buffer as large as
        // one, which is set in such steps.
        .next_multiple_of(1024);
    u16::try_from(HEADROOM + frame).ok()
}

impl DpdkPort {
    /// DPDK's name for the port: the given one, else the devargs' first
    /// field.
    pub fn dpdk_name(&self) -> &str {
        self.name
            .as_deref()
            .unwrap_or_else(|| self.devargs.split(',').next().unwrap_or(&self.devargs))
    }

    /// Virtual devices are named `net_*` (or `eth_*`); anything else is a
    /// bus device (PCI address, auxiliary device) for `-a`.
    pub fn is_vdev(&self) -> bool {
        self.devargs.starts_with("net_") || self.devargs.starts_with("eth_")
    }
}

/// Why [`DpdkDriver::open`] failed, naming the step.
#[derive(Debug, thiserror::Error)]
pub enum DpdkOpenError {
    /// EAL did not start.
    #[error("starting DPDK's EAL")]
    Eal(#[source] dpdk::DpdkError),
    /// The packet-buffer pool could not be created.
    #[error("creating the packet-buffer pool")]
    Pool(#[source] dpdk::DpdkError),
    /// A port could not be opened.
    #[error("opening port {id} ({name})")]
    Port {
        /// The caller's name of the port.
        id: String,
        /// DPDK's name of the port.
        name: String,
        /// What DPDK said.
        #[source]
        source: dpdk::DpdkError,
    },
}

impl DpdkDriver {
    /// `base` with the devices of `ports` for EAL to probe: each virtual
    /// device as a vdev, each bus device once in the allow list (one
    /// probe spawns all its ports), and no PCI scan unless a bus device
    /// is named (only named bus devices, never every device EAL can find).
    pub fn eal_config(base: &dpdk::EalConfig, ports: &[DpdkPort]) -> dpdk::EalConfig {
        let mut eal_cfg = base.clone();
        for p in ports {
            if p.is_vdev() {
                eal_cfg.vdevs.push(p.devargs.clone());
            } else if !eal_cfg.allow.contains(&p.devargs) {
                // One probe per bus device spawns all its ports.
                eal_cfg.allow.push(p.devargs.clone());
            }
        }
        // Only named bus devices, never every device EAL can find.
        eal_cfg.no_pci = eal_cfg.allow.is_empty();
        eal_cfg
    }

    /// Starts EAL with `eal_cfg` (from [`DpdkDriver::eal_config`]), a
    /// pool of `mbufs` packet buffers, and opens `ports` (in that order
    /// they become ports 0, 1, ...) with `queues` RX and TX queues each,
    /// in promiscuous mode.
    ///
    /// # Errors
    /// [`DpdkOpenError`] naming the step that failed (and the port).
    pub fn open(
        eal_cfg: &dpdk::EalConfig,
        ports: &[DpdkPort],
        queues: u16,
        mbufs: u32,
    ) -> Result<Self, DpdkOpenError> {
        let eal = dpdk::Eal::init(eal_cfg).map_err(DpdkOpenError::Eal)?;
        let room = data_room(ports).ok_or_else(|| {
            DpdkOpenError::Pool(dpdk::DpdkError::InvalidArgument(
                "a port's MTU needs packet buffers over 64 KiB".into(),
            ))
        })?;
        let pool = Arc::new(
            dpdk::Mempool::new(&eal, "dp-rx", mbufs, 256, room).map_err(DpdkOpenError::Pool)?,
        );
        let mut opened = Vec::with_capacity(ports.len());
        for p in ports {
            let name = p.dpdk_name();
            let port_cfg = dpdk::PortConfig {
                rx_queues: queues,
                tx_queues: queues,
                promiscuous: true,
                mtu: p.mtu,
                ..Default::default()
            };
            let port = dpdk::Port::open(&eal, name, &port_cfg, pool.clone()).map_err(|source| {
                DpdkOpenError::Port {
                    id: p.id.clone(),
                    name: name.to_string(),
                    source,
                }
            })?;
            opened.push(port);
        }
        Ok(Self::new(&eal, opened))
    }

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

    /// The ports as the `rte_flow` offload provider needs them, in
    /// port-index order, named by `names`.
    pub fn flow_ports(&self, names: &[String]) -> Vec<crate::offload::FlowPort> {
        self.ports
            .iter()
            .zip(names)
            .map(|(p, name)| crate::offload::FlowPort {
                name: name.clone(),
                id: p.id(),
                driver: p.driver().to_string(),
                switch_domain: p.switch_domain(),
            })
            .collect()
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

    /// From the pool of the first port (every port of a driver opened
    /// by [`DpdkDriver::open`] receives into the same pool).
    fn packet_from(&self, frame: &[u8]) -> Option<dpdk::Mbuf> {
        let pool = self.ports.first()?.pool();
        let mut m = dpdk::Mbuf::alloc(pool).ok()?;
        m.append(frame.len()).ok()?.copy_from_slice(frame);
        Some(m)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn port(id: &str, devargs: &str, name: Option<&str>) -> DpdkPort {
        DpdkPort {
            mtu: None,
            id: id.into(),
            devargs: devargs.into(),
            name: name.map(Into::into),
        }
    }

    #[test]
    fn buffers_hold_the_largest_ports_frame_in_one_piece() {
        let with = |mtus: &[Option<u16>]| {
            let ports: Vec<DpdkPort> = mtus
                .iter()
                .map(|&m| DpdkPort {
                    mtu: m,
                    ..port("p", "net_null0", None)
                })
                .collect();
            data_room(&ports)
        };
        // A standard frame's 2 KiB and the headroom, at the least.
        assert_eq!(with(&[]), Some(2176));
        assert_eq!(with(&[None, Some(1500)]), Some(2176));
        // A jumbo MTU: its frame with two VLAN tags and the FCS, in
        // whole KiB.
        assert_eq!(with(&[Some(1500), Some(9000), None]), Some(128 + 9216));
        assert_eq!(with(&[Some(9600)]), Some(128 + 10240));
        // Beyond one buffer's 64 KiB.
        assert_eq!(with(&[Some(65500)]), None);
    }

    #[test]
    fn eal_probes_each_device_once() {
        let vdevs = [
            port("p0", "net_tap0,iface=p0", None),
            port("p1", "eth_ring0", None),
        ];
        let c = DpdkDriver::eal_config(&dpdk::EalConfig::default(), &vdevs);
        assert_eq!(c.vdevs, ["net_tap0,iface=p0", "eth_ring0"]);
        assert!(c.allow.is_empty() && c.no_pci, "no bus device, no PCI scan");
        assert_eq!(vdevs[0].dpdk_name(), "net_tap0");

        let dev = "0000:03:00.0,representor=vf[0-1]";
        let bus = [
            port("p0", dev, None),
            port("pf0vf0", dev, Some("representor_vf0")),
        ];
        let c = DpdkDriver::eal_config(&dpdk::EalConfig::default(), &bus);
        assert!(c.vdevs.is_empty());
        assert_eq!(c.allow, [dev], "one probe spawns every port of a device");
        assert!(!c.no_pci);
        assert_eq!(bus[0].dpdk_name(), "0000:03:00.0");
        assert_eq!(bus[1].dpdk_name(), "representor_vf0");
    }
}
