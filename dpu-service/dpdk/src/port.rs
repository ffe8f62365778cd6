//! Ethdev ports and their queues.

use std::ffi::{CStr, CString};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use dpdk_sys as sys;

use crate::eal::Eal;
use crate::error::DpdkError;
use crate::mbuf::{Mbuf, MbufBatch};
use crate::mempool::Mempool;

/// A symmetric Toeplitz key: the hash of (a, b) equals the hash of (b, a),
/// so both directions of a flow land on the same RX queue (and worker).
pub const SYMMETRIC_RSS_KEY: [u8; 40] = symmetric_key();

const fn symmetric_key() -> [u8; 40] {
    let mut k = [0u8; 40];
    let mut i = 0;
    while i < 40 {
        k[i] = if i % 2 == 0 { 0x6d } else { 0x5a };
        i += 1;
    }
    k
}

/// How to set up a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// RX queues (one per worker that polls the port).
    pub rx_queues: u16,
    /// TX queues (one per worker that sends on the port).
    pub tx_queues: u16,
    /// Descriptors per RX queue.
    pub rx_descriptors: u16,
    /// Descriptors per TX queue.
    pub tx_descriptors: u16,
    /// MTU to set, if any.
    pub mtu: Option<u16>,
    /// Receive every frame, whatever its destination MAC.
    pub promiscuous: bool,
}

impl Default for PortConfig {
    fn default() -> Self {
        Self {
            rx_queues: 1,
            tx_queues: 1,
            rx_descriptors: 1024,
            tx_descriptors: 1024,
            mtu: None,
            promiscuous: true,
        }
    }
}

/// Port counters from `rte_eth_stats_get`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets dropped by the hardware/driver (RX queue full).
    pub rx_missed: u64,
    /// Erroneous received packets.
    pub rx_errors: u64,
    /// Failed transmissions.
    pub tx_errors: u64,
    /// RX mbuf allocation failures.
    pub rx_nombuf: u64,
}

/// Link state from `rte_eth_link_get_nowait`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStatus {
    /// Link is up.
    pub up: bool,
    /// Speed in Mbit/s (0 if unknown).
    pub speed_mbps: u32,
    /// Full duplex.
    pub full_duplex: bool,
}

#[derive(Debug)]
struct PortInner {
    id: u16,
    name: String,
    driver: String,
    switch_domain: Option<u16>,
    rx_taken: Mutex<Vec<bool>>,
    tx_taken: Mutex<Vec<bool>>,
    /// The pool the port's RX queues receive into.
    pool: Arc<Mempool>,
    _eal: Eal,
}

impl Drop for PortInner {
    fn drop(&mut self) {
        // SAFETY: the last Port handle and every queue handle are gone (they
        // hold this Arc), so no thread polls the port; stop and close run once.
        unsafe {
            sys::rte_eth_dev_stop(self.id);
            sys::rte_eth_dev_close(self.id);
        }
    }
}

/// A started ethdev port. Clones share it; it is stopped and closed when
/// the last handle and the last queue handle drop.
#[derive(Debug, Clone)]
pub struct Port {
    inner: Arc<PortInner>,
}

fn check(port: &str, op: &'static str, rc: i32) -> Result<(), DpdkError> {
    if rc < 0 {
        return Err(DpdkError::Port {
            port: port.to_string(),
            op,
            code: rc,
            message: crate::strerror(rc),
        });
    }
    Ok(())
}

impl Port {
    /// The pool the port's RX queues receive into: where packets that
    /// join its traffic from software are allocated.
    pub fn pool(&self) -> &Mempool {
        &self.inner.pool
    }

    /// Finds the port DPDK registered under `name` (a vdev name such as
    /// "net_ring0", or a PCI address), configures it and starts it.
    ///
    /// # Errors
    /// [`DpdkError::NoSuchPort`] or the [`DpdkError::Port`] of the failing step.
    pub fn open(
        eal: &Eal,
        name: &str,
        cfg: &PortConfig,
        pool: Arc<Mempool>,
    ) -> Result<Port, DpdkError> {
        let c_name = CString::new(name)
            .map_err(|_| DpdkError::InvalidArgument(format!("port name {name:?}")))?;
        let mut id = 0u16;
        // SAFETY: EAL is up; the name is a valid C string; id is a valid out pointer.
        let rc = unsafe { sys::rte_eth_dev_get_port_by_name(c_name.as_ptr(), &mut id) };
        if rc != 0 {
            return Err(DpdkError::NoSuchPort(name.to_string()));
        }
        let mut info = sys::rte_eth_dev_info::default();
        // SAFETY: id names an existing port; info is a valid out pointer.
        check(name, "dev_info_get", unsafe {
            sys::rte_eth_dev_info_get(id, &mut info)
        })?;
        let rxq = cfg.rx_queues.max(1);
        let txq = cfg.tx_queues.max(1);
        if rxq > info.max_rx_queues || txq > info.max_tx_queues {
            return Err(DpdkError::Port {
                port: name.to_string(),
                op: "configure",
                code: -22,
                message: format!(
                    "{rxq} RX / {txq} TX queues asked, the device has at most {} / {}",
                    info.max_rx_queues, info.max_tx_queues
                ),
            });
        }
        let mut key = SYMMETRIC_RSS_KEY;
        let mut conf = sys::rte_eth_conf::default();
        if rxq > 1 {
            // SAFETY: the flag getters are pure functions returning constants.
            let wanted = unsafe {
                sys::dpdk_shim_RTE_ETH_RSS_IP()
                    | sys::dpdk_shim_RTE_ETH_RSS_TCP()
                    | sys::dpdk_shim_RTE_ETH_RSS_UDP()
            };
            conf.rxmode.mq_mode = sys::RTE_ETH_MQ_RX_RSS;
            conf.rx_adv_conf.rss_conf.rss_key = key.as_mut_ptr();
            conf.rx_adv_conf.rss_conf.rss_key_len = 40;
            conf.rx_adv_conf.rss_conf.rss_hf = wanted & info.flow_type_rss_offloads;
        }
        // SAFETY: id is valid; conf (and the key it points to) outlive the call.
        check(name, "configure", unsafe {
            sys::rte_eth_dev_configure(id, rxq, txq, &conf)
        })?;
        // SAFETY: id is a configured port.
        let socket = u32::try_from(unsafe { sys::rte_eth_dev_socket_id(id) }).unwrap_or(0);
        for q in 0..rxq {
            // SAFETY: q < rxq configured queues; the pool outlives the port
            // (PortInner holds it); a null rxconf means driver defaults.
            check(name, "rx_queue_setup", unsafe {
                sys::rte_eth_rx_queue_setup(
                    id,
                    q,
                    cfg.rx_descriptors,
                    socket,
                    std::ptr::null(),
                    pool.as_ptr(),
                )
            })?;
        }
        for q in 0..txq {
            // SAFETY: q < txq configured queues; null txconf means defaults.
            check(name, "tx_queue_setup", unsafe {
                sys::rte_eth_tx_queue_setup(id, q, cfg.tx_descriptors, socket, std::ptr::null())
            })?;
        }
        if let Some(mtu) = cfg.mtu {
            let mut current = 0u16;
            // SAFETY: id is a configured port; current is a valid out pointer.
            let known = unsafe { sys::rte_eth_dev_get_mtu(id, &mut current) } == 0;
            // Drivers without an MTU of their own to set (memif, ring)
            // refuse even their current one: only a change is asked for.
            if !known || current != mtu {
                // SAFETY: id is a configured, not yet started port.
                check(name, "set_mtu", unsafe {
                    sys::rte_eth_dev_set_mtu(id, mtu)
                })?;
            }
        }
        let driver = if info.driver_name.is_null() {
            String::new()
        } else {
            // SAFETY: dev_info_get filled driver_name with a pointer to the
            // driver's static NUL-terminated name.
            unsafe { CStr::from_ptr(info.driver_name) }
                .to_string_lossy()
                .into_owned()
        };
        let domain = info.switch_info.domain_id;
        let inner = Arc::new(PortInner {
            id,
            name: name.to_string(),
            driver,
            switch_domain: (domain != sys::RTE_ETH_DEV_SWITCH_DOMAIN_ID_INVALID as u16)
                .then_some(domain),
            rx_taken: Mutex::new(vec![false; usize::from(rxq)]),
            tx_taken: Mutex::new(vec![false; usize::from(txq)]),
            pool,
            _eal: eal.clone(),
        });
        // SAFETY: the port is configured with all its queues set up.
        check(name, "start", unsafe { sys::rte_eth_dev_start(id) })?;
        if cfg.promiscuous {
            // SAFETY: the port is started. Some virtual PMDs do not support
            // promiscuous mode; that is not an error for them.
            let _ = unsafe { sys::rte_eth_promiscuous_enable(id) };
        }
        Ok(Port { inner })
    }

    /// DPDK port ID.
    pub fn id(&self) -> u16 {
        self.inner.id
    }

    /// Name the port was opened by.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The name of the driver behind the port (`net_mlx5`, `net_tap`).
    pub fn driver(&self) -> &str {
        &self.inner.driver
    }

    /// The embedded switch the port belongs to (a switch domain shared
    /// by a NIC's physical port and its representors), if any: transfer
    /// flow rules forward between the ports of one domain.
    pub fn switch_domain(&self) -> Option<u16> {
        self.inner.switch_domain
    }

    /// Counters of the port.
    pub fn stats(&self) -> PortStats {
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: the port is open; s is a valid out pointer. Reading stats
        // concurrently with the data path is supported by ethdev.
        let rc = unsafe { sys::rte_eth_stats_get(self.inner.id, &mut s) };
        if rc != 0 {
            return PortStats::default();
        }
        PortStats {
            rx_packets: s.ipackets,
            rx_bytes: s.ibytes,
            tx_packets: s.opackets,
            tx_bytes: s.obytes,
            rx_missed: s.imissed,
            rx_errors: s.ierrors,
            tx_errors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        }
    }

    /// Link state, without waiting for autonegotiation.
    pub fn link(&self) -> LinkStatus {
        let mut l = sys::rte_eth_link::default();
        // SAFETY: the port is open; l is a valid out pointer.
        let rc = unsafe { sys::rte_eth_link_get_nowait(self.inner.id, &mut l) };
        if rc != 0 {
            return LinkStatus::default();
        }
        LinkStatus {
            up: sys::fields::eth_link_up(&l),
            speed_mbps: sys::fields::eth_link_speed(&l),
            full_duplex: sys::fields::eth_link_full_duplex(&l),
        }
    }

    /// MAC address of the port.
    pub fn mac(&self) -> [u8; 6] {
        let mut a = sys::rte_ether_addr::default();
        // SAFETY: the port is open; a is a valid out pointer.
        let _ = unsafe { sys::rte_eth_macaddr_get(self.inner.id, &mut a) };
        a.addr_bytes
    }

    /// MTU of the port.
    pub fn mtu(&self) -> u16 {
        let mut m = 0u16;
        // SAFETY: the port is open; m is a valid out pointer.
        let _ = unsafe { sys::rte_eth_dev_get_mtu(self.inner.id, &mut m) };
        m
    }

    /// Extended statistics: (name, value) pairs the driver offers.
    pub fn xstats(&self) -> Vec<(String, u64)> {
        // SAFETY: a null array asks for the count only.
        let n = unsafe { sys::rte_eth_xstats_get_names(self.inner.id, std::ptr::null_mut(), 0) };
        let Ok(n) = u32::try_from(n) else {
            return Vec::new();
        };
        let mut names = vec![sys::rte_eth_xstat_name::default(); n as usize];
        let mut vals = vec![sys::rte_eth_xstat::default(); n as usize];
        // SAFETY: both arrays hold n entries.
        let got_names =
            unsafe { sys::rte_eth_xstats_get_names(self.inner.id, names.as_mut_ptr(), n) };
        // SAFETY: as above.
        let got_vals = unsafe { sys::rte_eth_xstats_get(self.inner.id, vals.as_mut_ptr(), n) };
        if got_names < 0 || got_vals < 0 {
            return Vec::new();
        }
        vals.iter()
            .take(usize::try_from(got_vals).unwrap_or(0).min(names.len()))
            .filter_map(|v| {
                let name = names.get(usize::try_from(v.id).ok()?)?;
                // SAFETY: DPDK writes NUL-terminated names into the fixed array.
                let s = unsafe { CStr::from_ptr(name.name.as_ptr()) };
                Some((s.to_string_lossy().into_owned(), v.value))
            })
            .collect()
    }

    fn take(&self, which: &Mutex<Vec<bool>>, q: u16, kind: &'static str) -> Result<(), DpdkError> {
        let mut taken = which
            .lock()
            .map_err(|_| DpdkError::InvalidArgument("queue table poisoned".into()))?;
        match taken.get_mut(usize::from(q)) {
            Some(t) if !*t => {
                *t = true;
                Ok(())
            }
            Some(_) => Err(DpdkError::InvalidArgument(format!(
                "{kind} queue {q} of {} is already taken",
                self.name()
            ))),
            None => Err(DpdkError::InvalidArgument(format!(
                "{} has no {kind} queue {q}",
                self.name()
            ))),
        }
    }

    /// Takes RX queue `q` for the calling thread. Each queue can be held
    /// by one handle at a time.
    ///
    /// # Errors
    /// If the queue does not exist or is held elsewhere.
    pub fn rx_queue(&self, q: u16) -> Result<RxQueue, DpdkError> {
        self.take(&self.inner.rx_taken, q, "RX")?;
        Ok(RxQueue {
            port: self.inner.clone(),
            q,
            _not_send: PhantomData,
        })
    }

    /// Takes TX queue `q` for the calling thread.
    ///
    /// # Errors
    /// If the queue does not exist or is held elsewhere.
    pub fn tx_queue(&self, q: u16) -> Result<TxQueue, DpdkError> {
        self.take(&self.inner.tx_taken, q, "TX")?;
        Ok(TxQueue {
            port: self.inner.clone(),
            q,
            _not_send: PhantomData,
        })
    }
}

fn release(which: &Mutex<Vec<bool>>, q: u16) {
    if let Ok(mut t) = which.lock() {
        if let Some(t) = t.get_mut(usize::from(q)) {
            *t = false;
        }
    }
}

/// An RX queue, polled by the thread that took it (`!Send`).
#[derive(Debug)]
pub struct RxQueue {
    port: Arc<PortInner>,
    q: u16,
    _not_send: PhantomData<*const ()>,
}

impl RxQueue {
    /// Receives up to the batch's free room; returns how many arrived.
    pub fn recv(&mut self, batch: &mut MbufBatch) -> usize {
        let (ptr, room) = batch.spare();
        if room == 0 {
            return 0;
        }
        // SAFETY: this handle is the only user of (port, queue) (taken under
        // a lock, and !Send); ptr points at `room` writable slots in the batch.
        let n = unsafe { sys::dpdk_shim_rte_eth_rx_burst(self.port.id, self.q, ptr, room) };
        batch.filled(n);
        usize::from(n)
    }
}

impl RxQueue {
    /// Receives up to `max` packets (at most the vector's spare capacity)
    /// and appends them to `out`; returns how many arrived. Allocates
    /// nothing: reserve the capacity once, outside the packet loop.
    pub fn recv_into(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let room = (out.capacity() - out.len()).min(max);
        let Ok(room) = u16::try_from(room) else {
            return 0;
        };
        if room == 0 {
            return 0;
        }
        let len = out.len();
        // SAFETY: Mbuf is repr(transparent) over NonNull<rte_mbuf>, so the
        // spare capacity is an array of `room` writable pointer slots; this
        // handle is the only user of (port, queue). rx_burst writes exactly
        // `n` valid, non-null mbufs that nobody else owns into the first
        // `n` slots, which set_len then hands to the vector.
        unsafe {
            let slots = out.as_mut_ptr().add(len).cast::<*mut sys::rte_mbuf>();
            let n = sys::dpdk_shim_rte_eth_rx_burst(self.port.id, self.q, slots, room);
            out.set_len(len + usize::from(n));
            usize::from(n)
        }
    }
}

impl Drop for RxQueue {
    fn drop(&mut self) {
        release(&self.port.rx_taken, self.q);
    }
}

/// A TX queue, used by the thread that took it (`!Send`).
#[derive(Debug)]
pub struct TxQueue {
    port: Arc<PortInner>,
    q: u16,
    _not_send: PhantomData<*const ()>,
}

impl TxQueue {
    /// Sends as much of the batch as the queue takes; what was not sent
    /// stays in the batch (to retry, or to free by dropping it). Returns the
    /// number sent.
    pub fn send(&mut self, batch: &mut MbufBatch) -> usize {
        let (ptr, n) = batch.owned();
        if n == 0 {
            return 0;
        }
        // SAFETY: this handle is the only user of (port, queue); ptr holds n
        // owned mbufs; those the driver accepts become its own, which
        // `consumed` records so the batch never frees them.
        let sent = unsafe { sys::dpdk_shim_rte_eth_tx_burst(self.port.id, self.q, ptr, n) };
        batch.consumed(sent);
        usize::from(sent)
    }
}

impl TxQueue {
    /// Sends from the front of `pkts`; the packets the driver took are
    /// removed, the rest stay in order (to retry, or to free by dropping
    /// them). Returns the number sent.
    pub fn send_from(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let n = u16::try_from(pkts.len()).unwrap_or(u16::MAX);
        if n == 0 {
            return 0;
        }
        // SAFETY: Mbuf is repr(transparent) over NonNull<rte_mbuf>, so the
        // vector's buffer is an array of n valid mbuf pointers. The driver
        // takes ownership of the first `sent`; they are moved out of the
        // vector without running Drop (set_len(0), then the unsent tail is
        // copied to the front), so none is freed twice or leaked.
        unsafe {
            let base = pkts.as_mut_ptr();
            let sent = usize::from(sys::dpdk_shim_rte_eth_tx_burst(
                self.port.id,
                self.q,
                base.cast(),
                n,
            ));
            let total = pkts.len();
            pkts.set_len(0);
            std::ptr::copy(base.add(sent), base, total - sent);
            pkts.set_len(total - sent);
            sent
        }
    }
}

impl Drop for TxQueue {
    fn drop(&mut self) {
        release(&self.port.tx_taken, self.q);
    }
}
