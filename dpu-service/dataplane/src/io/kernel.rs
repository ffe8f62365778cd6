//! The kernel driver: ports are Linux interfaces (a VF representor, a
//! veth, a TAP) reached through `AF_PACKET` sockets, for machines without
//! DPDK. Bursts move with one `recvmmsg`/`sendmmsg` per queue and turn.
//!
//! - Each port has one socket per queue; with several queues the sockets
//!   share a kernel fanout group that hashes flows symmetrically, so both
//!   directions of a connection meet on one worker.
//! - Packets live in buffers from a pool sized at start: nothing is
//!   allocated on the packet path, and a drained pool stalls reception
//!   (the kernel counts what it then drops as `rx_missed`).
//! - VLAN tags the interface stripped on receive are put back into the
//!   frame, so the switch sees the frame as it was on the wire.
//! - Frames longer than a buffer (an interface with GRO or LRO on, or an
//!   MTU above the buffer size) are dropped and counted as `rx_errors`;
//!   turn offloads off on such interfaces (`ethtool -K IF gro off`).
//!
//! Frames the kernel refuses to send (too big for the interface, the
//! interface down) are dropped by the driver and counted as `tx_errors`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use dpu_os::packet::{PacketSocket, RxMeta, MAX_BURST};

use super::{claim, Driver, IoError, LinkState, Packet, PortStats, RxQueue, TxQueue};

/// Free bytes kept in front of a received frame, for tags pushed later.
pub const HEADROOM: usize = 128;
/// The smallest data room of a buffer (a standard frame with two tags fits).
const MIN_DATA_ROOM: usize = 2048;
/// Ethernet header, two VLAN tags and the FCS-less trailer room.
const L2_OVERHEAD: usize = 14 + 8;

/// Why the kernel driver could not start.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The configuration cannot work (no port, no queue, too few buffers).
    #[error("kernel driver: {0}")]
    Config(String),
    /// A socket on an interface could not be set up.
    #[error("interface {iface}: {source}")]
    Socket {
        /// The interface name.
        iface: String,
        /// What the kernel said.
        source: std::io::Error,
    },
}

/// Packet buffers shared by every queue of a driver.
#[derive(Debug)]
struct BufPool {
    free: ArrayQueue<Box<[u8]>>,
}

impl BufPool {
    fn new(count: usize, size: usize) -> Arc<BufPool> {
        let free = ArrayQueue::new(count);
        for _ in 0..count {
            // Cannot fail: the queue holds exactly `count`.
            let _ = free.push(vec![0u8; size].into_boxed_slice());
        }
        Arc::new(BufPool { free })
    }

    /// An empty packet with the whole data room as its bytes, or `None`
    /// when every buffer is in use.
    fn take(self: &Arc<Self>) -> Option<KernelPacket> {
        let buf = self.free.pop()?;
        let len = buf.len() - HEADROOM;
        Some(KernelPacket {
            buf: Some(buf),
            start: HEADROOM,
            len,
            pool: self.clone(),
        })
    }
}

/// A packet of the kernel driver: a pool buffer and the frame's place in
/// it. Dropping it returns the buffer to the pool.
#[derive(Debug)]
pub struct KernelPacket {
    /// Always `Some` until drop.
    buf: Option<Box<[u8]>>,
    start: usize,
    len: usize,
    pool: Arc<BufPool>,
}

impl KernelPacket {
    fn bytes(&self) -> &[u8] {
        self.buf.as_deref().unwrap_or(&[])
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().unwrap_or(&mut [])
    }

    /// Puts back a VLAN tag the interface stripped: after the MAC
    /// addresses, before the EtherType. False if there is no headroom or
    /// the frame is shorter than an Ethernet header.
    fn insert_vlan(&mut self, tpid: u16, tci: u16) -> bool {
        if self.len < 14 || !self.prepend(4) {
            return false;
        }
        let d = self.data_mut();
        d.copy_within(4..16, 0);
        d[12..14].copy_from_slice(&tpid.to_be_bytes());
        d[14..16].copy_from_slice(&tci.to_be_bytes());
        true
    }
}

impl Drop for KernelPacket {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            // Cannot be full: every buffer came from this pool.
            let _ = self.pool.free.push(b);
        }
    }
}

impl AsMut<[u8]> for KernelPacket {
    fn as_mut(&mut self) -> &mut [u8] {
        self.data_mut()
    }
}

impl AsRef<[u8]> for KernelPacket {
    fn as_ref(&self) -> &[u8] {
        self.data()
    }
}

impl Packet for KernelPacket {
    fn len(&self) -> usize {
        self.len
    }
    fn data(&self) -> &[u8] {
        let (s, l) = (self.start, self.len);
        self.bytes().get(s..s + l).unwrap_or(&[])
    }
    fn data_mut(&mut self) -> &mut [u8] {
        let (s, l) = (self.start, self.len);
        self.bytes_mut().get_mut(s..s + l).unwrap_or(&mut [])
    }
    fn prepend(&mut self, len: usize) -> bool {
        if len > self.start {
            return false;
        }
        self.start -= len;
        self.len += len;
        true
    }
    fn trim_front(&mut self, len: usize) -> bool {
        if len > self.len {
            return false;
        }
        self.start += len;
        self.len -= len;
        true
    }
    fn try_clone(&self) -> Option<Self> {
        let mut copy = self.pool.take()?;
        copy.start = self.start;
        copy.len = self.len;
        copy.data_mut().copy_from_slice(self.data());
        Some(copy)
    }
}

/// Counters one queue handle writes (single writer: relaxed load + store).
#[derive(Debug, Default)]
struct Counters {
    packets: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

#[derive(Debug)]
struct Queue {
    sock: PacketSocket,
    rx_taken: AtomicBool,
    tx_taken: AtomicBool,
    rx: Counters,
    tx: Counters,
}

#[derive(Debug)]
struct Port {
    iface: String,
    queues: Vec<Queue>,
    /// Kernel drops read so far (the kernel resets its count on read).
    missed: AtomicU64,
}

/// Linux interfaces as ports, each with the same number of queues.
#[derive(Debug, Clone)]
pub struct KernelDriver {
    ports: Arc<Vec<Port>>,
    pool: Arc<BufPool>,
}

impl KernelDriver {
    /// Opens `queues` sockets on each interface of `ifaces` (in that order
    /// they become ports 0, 1, ...), in promiscuous mode, and a pool of
    /// `buffers` packet buffers sized for the largest MTU among them.
    /// Needs `CAP_NET_RAW` (and `CAP_NET_ADMIN` for promiscuous mode).
    ///
    /// # Errors
    /// [`KernelError`] naming the interface and the step that failed.
    pub fn open(ifaces: &[String], queues: u16, buffers: usize) -> Result<Self, KernelError> {
        if ifaces.is_empty() || queues == 0 {
            return Err(KernelError::Config(
                "needs at least one interface and one queue".into(),
            ));
        }
        let mut ports = Vec::with_capacity(ifaces.len());
        let mut mtu = 0u32;
        for iface in ifaces {
            let err = |source| KernelError::Socket {
                iface: iface.clone(),
                source,
            };
            let mut qs = Vec::with_capacity(usize::from(queues));
            let mut group = None;
            for _ in 0..queues {
                let sock = PacketSocket::open(iface, true).map_err(err)?;
                if queues > 1 {
                    group = Some(sock.join_fanout(group).map_err(err)?);
                }
                qs.push(Queue {
                    sock,
                    rx_taken: AtomicBool::new(false),
                    tx_taken: AtomicBool::new(false),
                    rx: Counters::default(),
                    tx: Counters::default(),
                });
            }
            if let Some(q) = qs.first() {
                mtu = mtu.max(q.sock.link().map_err(err)?.mtu);
            }
            ports.push(Port {
                iface: iface.clone(),
                queues: qs,
                missed: AtomicU64::new(0),
            });
        }
        // Every queue may hold a full burst in flight on every port.
        let least = ports.len() * usize::from(queues) * MAX_BURST * 2;
        if buffers < least {
            return Err(KernelError::Config(format!(
                "{buffers} packet buffers are too few for {} ports x {queues} queues (at least {least})",
                ports.len()
            )));
        }
        let room = MIN_DATA_ROOM.max(mtu as usize + L2_OVERHEAD);
        Ok(KernelDriver {
            ports: Arc::new(ports),
            pool: BufPool::new(buffers, HEADROOM + room),
        })
    }

    /// The interface behind port `port`.
    pub fn iface(&self, port: usize) -> Option<&str> {
        self.ports.get(port).map(|p| p.iface.as_str())
    }

    /// Packet buffers not in use (all of them once the workers stopped and
    /// every packet was dropped).
    pub fn free_buffers(&self) -> usize {
        self.pool.free.len()
    }

    /// Packet buffers in all.
    pub fn buffers(&self) -> usize {
        self.pool.free.capacity()
    }

    fn queue(&self, port: usize, queue: u16) -> Result<&Queue, IoError> {
        let p = self.ports.get(port).ok_or(IoError::NoSuchPort(port))?;
        p.queues.get(usize::from(queue)).ok_or(IoError::Queue {
            port,
            reason: format!("{}: no queue {queue}", p.iface),
        })
    }
}

/// A receive queue of the kernel driver; the thread that opened it polls it.
#[derive(Debug)]
pub struct KernelRx {
    ports: Arc<Vec<Port>>,
    pool: Arc<BufPool>,
    /// Empty buffers this queue holds for its next burst (at most
    /// [`MAX_BURST`]); they go back to the pool with the queue.
    spare: Vec<KernelPacket>,
    port: usize,
    queue: usize,
    /// Queue handles stay on the thread that opened them.
    _not_send: std::marker::PhantomData<*const ()>,
}

/// A transmit queue of the kernel driver.
#[derive(Debug)]
pub struct KernelTx {
    ports: Arc<Vec<Port>>,
    port: usize,
    queue: usize,
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Queue `queue` of port `port`. A free function, not a method, so a
/// caller can hold it while changing its own other fields.
fn queue_of(ports: &[Port], port: usize, queue: usize) -> Option<&Queue> {
    ports.get(port)?.queues.get(queue)
}

impl KernelRx {
    fn q(&self) -> Option<&Queue> {
        queue_of(&self.ports, self.port, self.queue)
    }
}

impl KernelTx {
    fn q(&self) -> Option<&Queue> {
        queue_of(&self.ports, self.port, self.queue)
    }
}

impl Drop for KernelRx {
    fn drop(&mut self) {
        if let Some(q) = self.q() {
            q.rx_taken.store(false, Ordering::Release);
        }
    }
}

impl Drop for KernelTx {
    fn drop(&mut self) {
        if let Some(q) = self.q() {
            q.tx_taken.store(false, Ordering::Release);
        }
    }
}

impl RxQueue for KernelRx {
    type Packet = KernelPacket;

    fn recv(&mut self, out: &mut Vec<KernelPacket>, max: usize) -> usize {
        let Some(q) = queue_of(&self.ports, self.port, self.queue) else {
            return 0;
        };
        let base = out.len();
        let want = max.min(out.capacity() - base).min(MAX_BURST);
        // Buffers come from this queue's spares, topped up from the shared
        // pool only when short: an empty poll touches no shared state.
        while self.spare.len() < want {
            match self.pool.take() {
                Some(p) => self.spare.push(p),
                None => break,
            }
        }
        let lent = want.min(self.spare.len());
        out.extend(self.spare.drain(self.spare.len() - lent..));
        if lent == 0 {
            return 0;
        }
        let mut meta = [RxMeta::default(); MAX_BURST];
        let got = match q.sock.recv_burst(&mut out[base..], &mut meta[..lent]) {
            Ok(n) => n,
            Err(_) => {
                bump(&q.rx.errors, 1);
                0
            }
        };
        // Unused buffers stay with this queue for the next burst.
        self.spare.extend(out.drain(base + got..));
        let (mut i, mut bytes, mut bad) = (base, 0u64, 0u64);
        for m in &meta[..got] {
            let ok = match out.get_mut(i) {
                Some(p) if !m.truncated => {
                    p.len = m.len;
                    m.vlan.is_none_or(|(tpid, tci)| p.insert_vlan(tpid, tci))
                }
                _ => false,
            };
            if ok {
                bytes += out.get(i).map_or(0, |p| p.len as u64);
                i += 1;
            } else {
                // Rare (offloads left on): dropping here keeps order.
                out.remove(i);
                bad += 1;
            }
        }
        let n = out.len() - base;
        bump(&q.rx.packets, n as u64);
        bump(&q.rx.bytes, bytes);
        if bad > 0 {
            bump(&q.rx.errors, bad);
        }
        n
    }
}

impl TxQueue for KernelTx {
    type Packet = KernelPacket;

    fn send(&mut self, pkts: &mut Vec<KernelPacket>) -> usize {
        let Some(q) = self.q() else {
            return 0;
        };
        let (mut sent, mut bytes, mut refused) = (0usize, 0u64, 0u64);
        while !pkts.is_empty() {
            match q.sock.send_burst(pkts) {
                Ok(0) => break,
                Ok(n) => {
                    bytes += pkts[..n].iter().map(|p| p.len as u64).sum::<u64>();
                    pkts.drain(..n);
                    sent += n;
                }
                Err(_) => {
                    // The kernel refused the first frame for good.
                    pkts.remove(0);
                    refused += 1;
                }
            }
        }
        bump(&q.tx.packets, sent as u64);
        bump(&q.tx.bytes, bytes);
        if refused > 0 {
            bump(&q.tx.errors, refused);
        }
        sent
    }
}

impl Driver for KernelDriver {
    type Packet = KernelPacket;
    type Rx = KernelRx;
    type Tx = KernelTx;

    fn port_count(&self) -> usize {
        self.ports.len()
    }

    fn rx_queue(&self, port: usize, queue: u16) -> Result<KernelRx, IoError> {
        claim(&self.queue(port, queue)?.rx_taken, port, "RX queue")?;
        Ok(KernelRx {
            ports: self.ports.clone(),
            pool: self.pool.clone(),
            spare: Vec::with_capacity(MAX_BURST),
            port,
            queue: usize::from(queue),
            _not_send: std::marker::PhantomData,
        })
    }

    fn tx_queue(&self, port: usize, queue: u16) -> Result<KernelTx, IoError> {
        claim(&self.queue(port, queue)?.tx_taken, port, "TX queue")?;
        Ok(KernelTx {
            ports: self.ports.clone(),
            port,
            queue: usize::from(queue),
            _not_send: std::marker::PhantomData,
        })
    }

    fn packet_from(&self, frame: &[u8]) -> Option<KernelPacket> {
        let mut p = self.pool.take()?;
        if frame.len() > p.len {
            return None;
        }
        p.len = frame.len();
        p.data_mut().copy_from_slice(frame);
        Some(p)
    }

    fn stats(&self, port: usize) -> PortStats {
        let Some(p) = self.ports.get(port) else {
            return PortStats::default();
        };
        let mut s = PortStats::default();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for q in &p.queues {
            s.rx_packets += get(&q.rx.packets);
            s.rx_bytes += get(&q.rx.bytes);
            s.rx_errors += get(&q.rx.errors);
            s.tx_packets += get(&q.tx.packets);
            s.tx_bytes += get(&q.tx.bytes);
            s.tx_errors += get(&q.tx.errors);
            if let Ok(d) = q.sock.take_drops() {
                p.missed.fetch_add(d, Ordering::Relaxed);
            }
        }
        s.rx_missed = p.missed.load(Ordering::Relaxed);
        s
    }

    fn link(&self, port: usize) -> Option<LinkState> {
        let p = self.ports.get(port)?;
        let l = p.queues.first()?.sock.link().ok()?;
        // The kernel knows the speed of real NICs only (-1 or absent else).
        let speed = std::fs::read_to_string(format!("/sys/class/net/{}/speed", p.iface))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(0);
        Some(LinkState {
            up: l.up,
            speed_mbps: speed,
            mac: l.mac,
            mtu: l.mtu,
        })
    }

    type ThreadGuard = ();

    fn enter_worker(&self) -> Result<(), IoError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Arc<BufPool> {
        BufPool::new(4, HEADROOM + 64)
    }

    #[test]
    fn packets_return_their_buffers_and_clones_copy() {
        let pool = pool();
        let mut a = pool.take().unwrap();
        assert_eq!(a.len(), 64);
        a.len = 20;
        a.data_mut().copy_from_slice(&[7u8; 20]);
        let b = a.try_clone().unwrap();
        assert_eq!(b.data(), a.data());
        assert_eq!(pool.free.len(), 2);
        drop(a);
        drop(b);
        assert_eq!(pool.free.len(), 4);
        let all: Vec<_> = (0..4).map(|_| pool.take().unwrap()).collect();
        assert!(pool.take().is_none());
        assert!(all[0].try_clone().is_none(), "an empty pool clones nothing");
    }

    #[test]
    fn headroom_bounds_prepend_and_trim_bounds_the_frame() {
        let pool = pool();
        let mut p = pool.take().unwrap();
        p.len = 10;
        assert!(!p.trim_front(11));
        assert!(p.trim_front(10));
        assert!(p.is_empty());
        assert!(p.prepend(HEADROOM + 10));
        assert!(!p.prepend(1));
        assert_eq!(p.len(), HEADROOM + 10);
    }

    #[test]
    fn a_stripped_vlan_tag_goes_back_after_the_addresses() {
        let pool = pool();
        let mut p = pool.take().unwrap();
        let frame: Vec<u8> = (0..20).collect();
        p.len = frame.len();
        p.data_mut().copy_from_slice(&frame);
        assert!(p.insert_vlan(0x8100, 0x2064));
        let d = p.data();
        assert_eq!(&d[..12], &frame[..12]);
        assert_eq!(&d[12..16], &[0x81, 0x00, 0x20, 0x64]);
        assert_eq!(&d[16..], &frame[12..]);
        let mut short = pool.take().unwrap();
        short.len = 13;
        assert!(!short.insert_vlan(0x8100, 1));
    }

    #[test]
    fn opening_checks_its_arguments_and_names_the_interface() {
        let e = KernelDriver::open(&[], 1, 1024).unwrap_err();
        assert!(matches!(e, KernelError::Config(_)), "{e}");
        let e = KernelDriver::open(&["no-such-if0".into()], 1, 1024).unwrap_err();
        assert!(e.to_string().contains("no-such-if0"), "{e}");
    }
}
