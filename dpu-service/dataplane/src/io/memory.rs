//! An in-memory driver for tests: packets are byte vectors, ports are
//! queues a test fills and drains.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::{claim, Driver, IoError, Packet, PortStats, RxQueue, TxQueue};

/// A packet of the in-memory driver.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemPacket(pub Vec<u8>);

impl Packet for MemPacket {
    fn data(&self) -> &[u8] {
        &self.0
    }
    fn data_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
    fn prepend(&mut self, len: usize) -> bool {
        // Test driver: growing a Vec at the front may allocate.
        self.0.splice(0..0, std::iter::repeat_n(0, len));
        true
    }
    fn trim_front(&mut self, len: usize) -> bool {
        if len > self.0.len() {
            return false;
        }
        self.0.drain(..len);
        true
    }
    fn try_clone(&self) -> Option<Self> {
        Some(self.clone())
    }
}

#[derive(Debug, Default)]
struct MemPort {
    inbox: Mutex<VecDeque<Vec<u8>>>,
    outbox: Mutex<Vec<Vec<u8>>>,
    tx_limit: Option<usize>,
    stats: Mutex<PortStats>,
    rx_taken: AtomicBool,
    tx_taken: AtomicBool,
}

/// Ports held in memory, one RX and one TX queue each.
#[derive(Debug, Clone)]
pub struct MemoryDriver {
    ports: Arc<Vec<MemPort>>,
}

impl MemoryDriver {
    /// `ports` ports with unbounded transmit queues.
    pub fn new(ports: usize) -> Self {
        Self::with_tx_limit(ports, None)
    }

    /// `ports` ports whose transmit side holds at most `limit` packets
    /// until [`MemoryDriver::take_sent`] drains it (to test a full TX queue).
    pub fn with_tx_limit(ports: usize, limit: Option<usize>) -> Self {
        let ports = (0..ports)
            .map(|_| MemPort {
                tx_limit: limit,
                ..MemPort::default()
            })
            .collect();
        Self {
            ports: Arc::new(ports),
        }
    }

    /// Queues a packet for reception on `port`.
    ///
    /// # Errors
    /// If the port does not exist.
    pub fn inject(&self, port: usize, bytes: Vec<u8>) -> Result<(), IoError> {
        let p = self.ports.get(port).ok_or(IoError::NoSuchPort(port))?;
        p.inbox.lock().map_err(|_| poisoned(port))?.push_back(bytes);
        Ok(())
    }

    /// Takes everything sent on `port` so far.
    pub fn take_sent(&self, port: usize) -> Vec<Vec<u8>> {
        self.ports
            .get(port)
            .and_then(|p| p.outbox.lock().ok().map(|mut o| std::mem::take(&mut *o)))
            .unwrap_or_default()
    }

    /// Packets still waiting to be received on `port`.
    pub fn pending(&self, port: usize) -> usize {
        self.ports
            .get(port)
            .and_then(|p| p.inbox.lock().ok().map(|i| i.len()))
            .unwrap_or(0)
    }
}

fn poisoned(port: usize) -> IoError {
    IoError::Queue {
        port,
        reason: "queue lock poisoned".into(),
    }
}

fn take(flag: &AtomicBool, port: usize, queue: u16, kind: &str) -> Result<(), IoError> {
    if queue != 0 {
        return Err(IoError::Queue {
            port,
            reason: format!("no {kind} queue {queue} (memory ports have one)"),
        });
    }
    claim(flag, port, &format!("{kind} queue 0"))
}

/// RX queue of a memory port.
#[derive(Debug)]
pub struct MemRx {
    ports: Arc<Vec<MemPort>>,
    port: usize,
}

/// TX queue of a memory port.
#[derive(Debug)]
pub struct MemTx {
    ports: Arc<Vec<MemPort>>,
    port: usize,
}

impl RxQueue for MemRx {
    type Packet = MemPacket;

    fn recv(&mut self, out: &mut Vec<MemPacket>, max: usize) -> usize {
        let Some(p) = self.ports.get(self.port) else {
            return 0;
        };
        let Ok(mut inbox) = p.inbox.lock() else {
            return 0;
        };
        let n = max.min(out.capacity() - out.len()).min(inbox.len());
        let mut bytes = 0u64;
        for b in inbox.drain(..n) {
            bytes += b.len() as u64;
            out.push(MemPacket(b));
        }
        if let Ok(mut s) = p.stats.lock() {
            s.rx_packets += n as u64;
            s.rx_bytes += bytes;
        }
        n
    }
}

impl TxQueue for MemTx {
    type Packet = MemPacket;

    fn send(&mut self, pkts: &mut Vec<MemPacket>) -> usize {
        let Some(p) = self.ports.get(self.port) else {
            return 0;
        };
        let Ok(mut outbox) = p.outbox.lock() else {
            return 0;
        };
        let room = p
            .tx_limit
            .map_or(usize::MAX, |l| l.saturating_sub(outbox.len()));
        let n = pkts.len().min(room);
        let mut bytes = 0u64;
        for pkt in pkts.drain(..n) {
            bytes += pkt.0.len() as u64;
            outbox.push(pkt.0);
        }
        if let Ok(mut s) = p.stats.lock() {
            s.tx_packets += n as u64;
            s.tx_bytes += bytes;
        }
        n
    }
}

impl Drop for MemRx {
    fn drop(&mut self) {
        if let Some(p) = self.ports.get(self.port) {
            p.rx_taken.store(false, Ordering::Release);
        }
    }
}

impl Drop for MemTx {
    fn drop(&mut self) {
        if let Some(p) = self.ports.get(self.port) {
            p.tx_taken.store(false, Ordering::Release);
        }
    }
}

impl Driver for MemoryDriver {
    type Packet = MemPacket;
    type Rx = MemRx;
    type Tx = MemTx;

    fn port_count(&self) -> usize {
        self.ports.len()
    }

    fn rx_queue(&self, port: usize, queue: u16) -> Result<MemRx, IoError> {
        let p = self.ports.get(port).ok_or(IoError::NoSuchPort(port))?;
        take(&p.rx_taken, port, queue, "RX")?;
        Ok(MemRx {
            ports: self.ports.clone(),
            port,
        })
    }

    fn tx_queue(&self, port: usize, queue: u16) -> Result<MemTx, IoError> {
        let p = self.ports.get(port).ok_or(IoError::NoSuchPort(port))?;
        take(&p.tx_taken, port, queue, "TX")?;
        Ok(MemTx {
            ports: self.ports.clone(),
            port,
        })
    }

    fn packet_from(&self, frame: &[u8]) -> Option<MemPacket> {
        Some(MemPacket(frame.to_vec()))
    }

    fn stats(&self, port: usize) -> PortStats {
        self.ports
            .get(port)
            .and_then(|p| p.stats.lock().ok().map(|s| *s))
            .unwrap_or_default()
    }

    type ThreadGuard = ();

    fn enter_worker(&self) -> Result<(), IoError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_flow_and_respect_limits() {
        let d = MemoryDriver::with_tx_limit(2, Some(2));
        for i in 0..5u8 {
            d.inject(0, vec![i; 3]).unwrap();
        }
        let mut rx = d.rx_queue(0, 0).unwrap();
        assert!(d.rx_queue(0, 0).is_err(), "one handle per queue");
        assert!(d.rx_queue(0, 1).is_err());
        assert!(d.rx_queue(7, 0).is_err());
        let mut burst = Vec::with_capacity(4);
        assert_eq!(rx.recv(&mut burst, 10), 4, "bounded by capacity");
        let mut tx = d.tx_queue(1, 0).unwrap();
        assert_eq!(tx.send(&mut burst), 2, "bounded by the TX limit");
        assert_eq!(burst.len(), 2);
        assert_eq!(burst[0].0, vec![2; 3], "unsent packets keep their order");
        assert_eq!(d.take_sent(1), vec![vec![0; 3], vec![1; 3]]);
        assert_eq!(d.stats(0).rx_packets, 4);
        assert_eq!(d.stats(1).tx_packets, 2);
        assert_eq!(d.pending(0), 1);
        drop(rx);
        d.rx_queue(0, 0).expect("released on drop");
    }
}
