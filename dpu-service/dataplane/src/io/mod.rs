//! The packet-I/O seam: drivers, their queues and their packets.
//!
//! Drivers: [`dpdk`] (any DPDK PMD; feature `dpdk`), [`kernel`] (Linux
//! interfaces through packet sockets, for machines without DPDK) and
//! [`memory`] (byte vectors, for tests).

pub mod kernel;
pub mod memory;

/// Smallest IP MTU a port may be given (IPv4's minimum).
pub const MIN_MTU: u16 = 68;
/// Largest IP MTU a port may be given: jumbo frames of 9000 with room,
/// within what BlueField's ports take.
pub const MAX_MTU: u16 = 9600;

#[cfg(feature = "dpdk")]
pub mod dpdk;

/// A packet buffer owned by a driver. Dropping it returns it to its pool.
pub trait Packet: Send {
    /// The packet's length in bytes (cheaper than `data().len()` for some drivers).
    fn len(&self) -> usize {
        self.data().len()
    }
    /// True for an empty packet.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The packet's bytes.
    fn data(&self) -> &[u8];
    /// The packet's bytes, writable in place.
    fn data_mut(&mut self) -> &mut [u8];
    /// Grows the packet by `len` bytes at the front (they come first in
    /// [`Packet::data_mut`], contents unspecified). False, and nothing
    /// changed, if the buffer has no room.
    fn prepend(&mut self, len: usize) -> bool;
    /// Removes `len` bytes from the front. False, and nothing changed, if
    /// the packet is shorter.
    fn trim_front(&mut self, len: usize) -> bool;
    /// A copy in a new buffer (for flooding); `None` if none is free.
    fn try_clone(&self) -> Option<Self>
    where
        Self: Sized;
}

/// A receive queue, polled by the thread that opened it.
pub trait RxQueue {
    /// The driver's packet type.
    type Packet: Packet;
    /// Appends at most `max` received packets to `out` (never beyond its
    /// spare capacity, so nothing allocates); returns how many.
    fn recv(&mut self, out: &mut Vec<Self::Packet>, max: usize) -> usize;
}

/// A transmit queue, used by the thread that opened it.
pub trait TxQueue {
    /// The driver's packet type.
    type Packet: Packet;
    /// Sends from the front of `pkts`, removing what was sent; what the
    /// queue did not take stays, in order. Returns how many were sent.
    fn send(&mut self, pkts: &mut Vec<Self::Packet>) -> usize;
}

/// Counters a driver keeps for one port.
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
    /// Packets the device dropped on receive.
    pub rx_missed: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Transmit errors.
    pub tx_errors: u64,
}

/// A port's link as its driver reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkState {
    /// Link up.
    pub up: bool,
    /// Speed in Mbit/s, 0 if unknown.
    pub speed_mbps: u32,
    /// The port's MAC address.
    pub mac: [u8; 6],
    /// MTU in bytes, 0 if unknown.
    pub mtu: u32,
}

/// Why a driver could not hand out a queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IoError {
    /// The port index is not one of the driver's ports.
    #[error("no port {0}")]
    NoSuchPort(usize),
    /// The worker thread could not be prepared (pinned, registered).
    #[error("worker thread: {0}")]
    Thread(String),
    /// The queue does not exist or is already taken.
    #[error("port {port}: {reason}")]
    Queue {
        /// Port index.
        port: usize,
        /// What is wrong.
        reason: String,
    },
}

/// Marks a queue taken through its `flag`; an error naming `what` if it
/// already was.
pub(crate) fn claim(
    flag: &std::sync::atomic::AtomicBool,
    port: usize,
    what: &str,
) -> Result<(), IoError> {
    if flag.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return Err(IoError::Queue {
            port,
            reason: format!("{what} is already taken"),
        });
    }
    Ok(())
}

/// A set of ports with their queues. Cloned into every worker thread,
/// which opens the queues it polls on that thread.
pub trait Driver: Clone + Send + Sync + 'static {
    /// The packet type of every queue.
    type Packet: Packet;
    /// Receive queue handle.
    type Rx: RxQueue<Packet = Self::Packet>;
    /// Transmit queue handle.
    type Tx: TxQueue<Packet = Self::Packet>;

    /// Number of ports; ports are indexed 0..port_count().
    fn port_count(&self) -> usize;
    /// Opens RX queue `queue` of `port` for the calling thread.
    ///
    /// # Errors
    /// If the port or queue does not exist or the queue is taken.
    fn rx_queue(&self, port: usize, queue: u16) -> Result<Self::Rx, IoError>;
    /// Opens TX queue `queue` of `port` for the calling thread.
    ///
    /// # Errors
    /// If the port or queue does not exist or the queue is taken.
    fn tx_queue(&self, port: usize, queue: u16) -> Result<Self::Tx, IoError>;
    /// The port's driver-level counters.
    fn stats(&self, port: usize) -> PortStats;
    /// A packet holding a copy of `frame`, in a buffer of the driver's
    /// own (the pool its ports receive into): for frames that enter the
    /// switch from the service itself, such as a storage endpoint's.
    /// `None` if no buffer is free or `frame` does not fit one.
    fn packet_from(&self, frame: &[u8]) -> Option<Self::Packet>;
    /// The port's link, address and MTU; `None` if the driver has no such
    /// notion (in-memory ports) or the port does not exist.
    fn link(&self, _port: usize) -> Option<LinkState> {
        None
    }

    /// Per-thread state a worker holds while it runs (e.g. its EAL lcore
    /// registration); made on the worker's thread before it opens queues.
    type ThreadGuard;

    /// Prepares the calling worker thread.
    ///
    /// # Errors
    /// If the thread cannot be prepared.
    fn enter_worker(&self) -> Result<Self::ThreadGuard, IoError>;
}
