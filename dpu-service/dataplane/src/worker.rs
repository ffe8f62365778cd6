//! Poll-mode, run-to-completion workers.
//!
//! A worker owns its RX queues and one TX queue per port, all opened on its
//! own thread. Each turn it receives a burst from every RX queue, runs the
//! pipeline on each packet, queues forwarded packets per output port and
//! transmits them; what a full TX queue refuses is dropped and counted.
//! A packet forwarded to a storage endpoint's virtual port is copied into
//! the endpoint's queue instead ([`crate::endpoint_queues`]), and each turn the
//! worker also takes up to a burst of each endpoint's own frames and runs
//! them through the pipeline as received on its virtual port.
//! Buffers are reserved once before the loop: the packet path allocates
//! nothing, takes no lock and makes no syscall (an idle worker may sleep).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::endpoint_queues::EndpointTable;
use crate::io::{Driver, IoError, Packet, RxQueue, TxQueue};
use crate::wire::{apply_tunnel, apply_vlan};

/// Packets per receive burst.
pub const BURST: usize = 32;

/// Why the data plane dropped a packet (the reasons of `dpu.v1.DropReason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The packet's input matches no tenant attachment.
    NoTenant,
    /// Source MAC or IP not allowed on the attachment.
    Spoofed,
    /// A deny rule or the default policy.
    AclDeny,
    /// Connection tracking found it invalid.
    ConntrackInvalid,
    /// The tenant's connection table was full.
    TableFull,
    /// A rule's rate limit.
    RateLimited,
    /// The packet could not be parsed.
    Malformed,
    /// The output could not take it: its TX queue was full, or the
    /// pipeline named a port the driver does not have.
    TxFull,
    /// A fragment that could hide its transport header from the filter:
    /// a tiny first fragment, or one overlapping the transport header
    /// (RFC 1858, RFC 3128).
    FragmentInvalid,
    /// A later fragment of a datagram whose first fragment did not pass
    /// (dropped, not seen yet, or too long ago).
    FragmentUnknown,
    /// A first fragment the tenant's share of the fragment table had no
    /// room for (its later fragments could not have passed).
    FragmentTableFull,
    /// VXLAN from an underlay address that is none of the attachment's
    /// remote VTEPs nor in its underlay ranges (or an ARP reply to the
    /// VTEP from such an address).
    UnknownVtep,
    /// A new source MAC address beyond its tenant's or attachment's
    /// limit of learned addresses.
    MacLimit,
    /// On an attachment with an address guard: a frame whose network
    /// layer is behind a tag or encapsulation the guard cannot look
    /// through (a second 802.1Q tag, QinQ, MPLS, PPPoE).
    Encapsulated,
    /// A frame for a storage endpoint that its queue could not take (full,
    /// or the frame longer than its buffers), or a frame the endpoint sent
    /// that no packet buffer was free for.
    EndpointFull,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 15] = [
        Self::NoTenant,
        Self::Spoofed,
        Self::AclDeny,
        Self::ConntrackInvalid,
        Self::TableFull,
        Self::RateLimited,
        Self::Malformed,
        Self::TxFull,
        Self::FragmentInvalid,
        Self::FragmentUnknown,
        Self::FragmentTableFull,
        Self::UnknownVtep,
        Self::MacLimit,
        Self::Encapsulated,
        Self::EndpointFull,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// What happens to a packet's outer 802.1Q tag on the way out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VlanOp {
    /// Leave the frame as it is.
    #[default]
    Keep,
    /// Remove the outer tag.
    Strip,
    /// Add an outer tag with this VLAN ID (priority 0).
    Push(u16),
    /// Change the outer tag's VLAN ID, keeping its priority bits.
    Set(u16),
}

/// One way out for a packet: a port and what to do with its headers, in
/// this order: remove `decap` bytes from the front (a tunnel's outer
/// headers), apply the tag operation, then put the frame in `tunnel`.
/// The bytes are written by [`crate::wire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Egress {
    /// Output port index.
    pub port: usize,
    /// Tag operation for this output.
    pub vlan: VlanOp,
    /// Bytes of outer headers to remove first (0: none).
    pub decap: u16,
    /// A VXLAN tunnel to send the frame through, if any.
    pub tunnel: Option<Tunnel>,
}

impl Egress {
    /// Out of `port`, unchanged.
    pub fn to(port: usize) -> Egress {
        Egress {
            port,
            vlan: VlanOp::Keep,
            decap: 0,
            tunnel: None,
        }
    }
}

/// The outer headers of a VXLAN frame (RFC 7348) over IPv4 and UDP: from
/// the local VTEP (`src_mac`, `src_ip`) to a remote one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunnel {
    /// The local VTEP's MAC address (the uplink's).
    pub src_mac: [u8; 6],
    /// The next hop's MAC address toward the remote VTEP.
    pub dst_mac: [u8; 6],
    /// The local VTEP's IPv4 address.
    pub src_ip: u32,
    /// The remote VTEP's IPv4 address.
    pub dst_ip: u32,
    /// VXLAN network identifier (24 bits).
    pub vni: u32,
    /// The remote VTEP's MAC address is not known yet: instead of the
    /// frame, send an ARP request for `dst_ip` (the frame is lost, as
    /// while a kernel resolves a neighbour with a full queue).
    pub resolve: bool,
}

/// What to do with one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send it out one way.
    Forward(Egress),
    /// Send a copy out of every egress the pipeline listed (a port may be
    /// listed more than once, e.g. with different VLAN tags); none listed
    /// drops it uncounted.
    Flood,
    /// Drop it, counting the reason.
    Drop(DropReason),
}

/// Per-packet processing: a function of the input port and the packet's
/// bytes (which it may rewrite in place) to a verdict.
pub trait Pipeline: Send + 'static {
    /// Decides the packet's fate. For [`Verdict::Flood`] it first pushes
    /// the outputs onto `flood`, after whatever `flood` held on entry
    /// (which it leaves as it is).
    fn process(&mut self, in_port: usize, packet: &mut [u8], flood: &mut Vec<Egress>) -> Verdict;

    /// Decides the fate of a burst of packets received together on
    /// `in_port`, taking them all out of `burst`: hands each packet, in
    /// order, to `sink` with its verdict and, for a flood, its outputs.
    /// `flood` is scratch space for those. The decisions are those of
    /// [`Pipeline::process`] on each packet in turn, which is what this
    /// does unless a pipeline can do better with the whole burst at hand.
    fn process_burst<P: Packet>(
        &mut self,
        in_port: usize,
        burst: &mut Vec<P>,
        flood: &mut Vec<Egress>,
        mut sink: impl FnMut(P, &Verdict, &[Egress]),
    ) {
        for mut pkt in burst.drain(..) {
            flood.clear();
            let v = self.process(in_port, pkt.data_mut(), flood);
            sink(pkt, &v, flood);
        }
    }

    /// Called at the start of every turn, between bursts: the place to
    /// pick up new configuration or read the clock once per burst.
    fn turn(&mut self) {}

    /// The storage endpoints' queues of the configuration this pipeline
    /// decides by, from its last [`Pipeline::turn`]: where the worker
    /// hands frames forwarded to a virtual port (beyond the driver's
    /// ports), and where it takes the frames the endpoints send. `None`
    /// (the default) when there are none.
    fn endpoints(&self) -> Option<&Arc<EndpointTable>> {
        None
    }

    /// Work of the pipeline's own beside the packets, run once a turn
    /// after the ports' bursts (whose frames for storage endpoints are in
    /// their queues by then) and before the worker takes the frames the
    /// endpoints sent: where a worker runs the endpoints' stacks itself
    /// when they share its core. Returns how much it did; 0 (the
    /// default: nothing) lets an idle worker nap.
    fn between_bursts(&mut self) -> usize {
        0
    }

    /// Called once when the worker stops, after its last turn: the place
    /// to hand over state that should outlive the worker (the switch's
    /// connection and fragment tables across a restart). Does nothing by
    /// default.
    fn stopped(&mut self) {}
}

/// The empty pipeline: each input port is wired to one output port (like a
/// patch panel, or testpmd's io forwarding).
#[derive(Debug, Clone)]
pub struct CrossConnect {
    out: Vec<Option<usize>>,
}

impl CrossConnect {
    /// Wires each `(in, out)` pair; unwired inputs drop as NoTenant.
    pub fn new(pairs: &[(usize, usize)]) -> Self {
        let n = pairs.iter().map(|(i, _)| i + 1).max().unwrap_or(0);
        let mut out = vec![None; n];
        for &(i, o) in pairs {
            out[i] = Some(o);
        }
        Self { out }
    }
}

impl Pipeline for CrossConnect {
    fn process(&mut self, in_port: usize, _packet: &mut [u8], _flood: &mut Vec<Egress>) -> Verdict {
        match self.out.get(in_port).copied().flatten() {
            Some(o) => Verdict::Forward(Egress::to(o)),
            None => Verdict::Drop(DropReason::NoTenant),
        }
    }
}

/// What a worker does when a turn found no packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Keep polling (a dedicated core, as on a DPU).
    BusyPoll,
    /// After `spins` empty turns, sleep between polls, doubling up to `max`
    /// (laptops and CI); the first packet resets it.
    Backoff {
        /// Empty turns before sleeping.
        spins: u32,
        /// Longest sleep.
        max: Duration,
    },
}

/// Counters of one worker. Only the worker writes them (relaxed load and
/// store, no read-modify-write); readers sum all workers' counters.
#[derive(Debug)]
pub struct WorkerCounters {
    rx_packets: Vec<AtomicU64>,
    rx_bytes: Vec<AtomicU64>,
    tx_packets: Vec<AtomicU64>,
    tx_bytes: Vec<AtomicU64>,
    drops: [AtomicU64; DropReason::ALL.len()],
    turns: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

fn zeros(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

impl WorkerCounters {
    fn new(ports: usize) -> Self {
        Self {
            rx_packets: zeros(ports),
            rx_bytes: zeros(ports),
            tx_packets: zeros(ports),
            tx_bytes: zeros(ports),
            drops: Default::default(),
            turns: AtomicU64::new(0),
        }
    }
}

/// Counters summed over workers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    /// Packets received, per port.
    pub rx_packets: Vec<u64>,
    /// Bytes received, per port.
    pub rx_bytes: Vec<u64>,
    /// Packets transmitted, per port.
    pub tx_packets: Vec<u64>,
    /// Bytes transmitted, per port.
    pub tx_bytes: Vec<u64>,
    /// Drops, indexed like [`DropReason::ALL`].
    pub drops: [u64; DropReason::ALL.len()],
    /// Loop turns of all workers.
    pub turns: u64,
}

impl Totals {
    /// Packets dropped for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()]
    }
}

/// What one worker polls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// `(port, queue)` pairs this worker receives from.
    pub rx: Vec<(usize, u16)>,
    /// The TX queue this worker uses on every port (one per worker).
    pub tx_queue: u16,
    /// The CPU the worker thread is pinned to before it opens its queues;
    /// `None` leaves it wherever the scheduler puts it.
    pub cpu: Option<usize>,
    /// Idle behaviour.
    pub idle: Idle,
}

struct Loop<D: Driver, P: Pipeline> {
    rx: Vec<(usize, D::Rx)>,
    tx: Vec<D::Tx>,
    pipeline: P,
    counters: Arc<WorkerCounters>,
    /// Makes packets of the frames storage endpoints send.
    driver: D,
    /// This worker's index: its lane in every endpoint's queues.
    worker: usize,
}

/// Where one worker's decided packets go: per-port output queues, and
/// the storage endpoints' queues for virtual ports.
struct Outputs<'a, P> {
    out: &'a mut [Vec<P>],
    out_bytes: &'a mut [u64],
    c: &'a WorkerCounters,
    endpoints: Option<&'a EndpointTable>,
    worker: usize,
}

impl<P: Packet> Outputs<'_, P> {
    /// Queues `pkt` as `verdict` says, or counts its drop.
    #[inline(always)]
    fn take(&mut self, pkt: P, verdict: &Verdict, flood: &[Egress]) {
        match verdict {
            Verdict::Forward(e) => self.emit(pkt, e),
            Verdict::Flood => {
                let Some((last, copies)) = flood.split_last() else {
                    return;
                };
                for e in copies {
                    match pkt.try_clone() {
                        Some(copy) => self.emit(copy, e),
                        None => bump(&self.c.drops[DropReason::TxFull.index()], 1),
                    }
                }
                self.emit(pkt, last);
            }
            Verdict::Drop(r) => bump(&self.c.drops[r.index()], 1),
        }
    }

    /// Queues `pkt` for output `e` after its tag operation, or counts the
    /// drop.
    #[inline(always)]
    fn emit(&mut self, pkt: P, e: &Egress) {
        // The frame as it came, to a port that exists: queued in place.
        if let (0, VlanOp::Keep, None, Some(q)) =
            (e.decap, e.vlan, &e.tunnel, self.out.get_mut(e.port))
        {
            self.out_bytes[e.port] += pkt.len() as u64;
            q.push(pkt);
            return;
        }
        self.emit_rewritten(pkt, e);
    }

    /// [`Outputs::emit`] of a frame to rewrite first (decapsulated,
    /// tagged, untagged or tunnelled), or for a storage endpoint.
    #[inline(never)]
    fn emit_rewritten(&mut self, mut pkt: P, e: &Egress) {
        let c = self.c;
        let endpoint = match self.endpoints {
            Some(t) if e.port >= self.out.len() => t.get(e.port),
            _ => None,
        };
        if (e.port >= self.out.len() && endpoint.is_none())
            || (e.decap > 0 && !pkt.trim_front(usize::from(e.decap)))
            || !apply_vlan(&mut pkt, e.vlan)
            || e.tunnel
                .as_ref()
                .is_some_and(|t| !apply_tunnel(&mut pkt, t))
        {
            bump(&c.drops[DropReason::TxFull.index()], 1);
            return;
        }
        if let Some(q) = endpoint {
            // Copied into the endpoint's lane; the packet goes back to
            // its pool here.
            if !q.deliver(self.worker, pkt.data()) {
                bump(&c.drops[DropReason::EndpointFull.index()], 1);
            }
            return;
        }
        self.out_bytes[e.port] += pkt.len() as u64;
        self.out[e.port].push(pkt);
    }
}

impl<D: Driver, P: Pipeline> Loop<D, P> {
    /// Runs the frames the storage endpoints of `table` sent through this
    /// worker's lanes (at most a burst per endpoint and turn, so a busy
    /// endpoint cannot starve the ports) through the pipeline as received
    /// on each endpoint's virtual port. Returns how many there were.
    fn endpoint_input(
        &mut self,
        table: &EndpointTable,
        burst: &mut Vec<D::Packet>,
        flood: &mut Vec<Egress>,
        outs: &mut Outputs<'_, D::Packet>,
    ) -> usize {
        let mut got = 0;
        for (port, q) in table.iter() {
            while burst.len() < BURST {
                let driver = &self.driver;
                let Some(made) = q.take_sent_with(self.worker, |f| driver.packet_from(f)) else {
                    break;
                };
                match made {
                    Some(p) => burst.push(p),
                    None => bump(&outs.c.drops[DropReason::EndpointFull.index()], 1),
                }
            }
            if burst.is_empty() {
                continue;
            }
            got += burst.len();
            self.pipeline
                .process_burst(port, burst, flood, |pkt, verdict, flood| {
                    outs.take(pkt, verdict, flood);
                });
        }
        got
    }

    fn run(mut self, stop: &AtomicBool, idle: Idle) {
        let ports = self.tx.len();
        let mut burst: Vec<D::Packet> = Vec::with_capacity(BURST);
        // Every RX queue (and the endpoints, together) may forward a
        // whole burst to one port in a turn.
        let per_port = BURST * (self.rx.len() + 1);
        let mut out: Vec<Vec<D::Packet>> =
            (0..ports).map(|_| Vec::with_capacity(per_port)).collect();
        let mut out_bytes = vec![0u64; ports];
        let mut flood: Vec<Egress> = Vec::with_capacity(ports);
        let c = self.counters.clone();
        let mut empty_turns = 0u32;
        let mut nap = Duration::from_micros(1);
        // The endpoints' queues of the pipeline's configuration, kept
        // here so that a turn borrows them while the pipeline decides.
        let mut endpoints: Option<Arc<EndpointTable>> = None;
        while !stop.load(Ordering::Relaxed) {
            self.pipeline.turn();
            match (self.pipeline.endpoints(), &endpoints) {
                (None, None) => {}
                (Some(a), Some(b)) if Arc::ptr_eq(a, b) => {}
                (now, _) => endpoints = now.cloned(),
            }
            let mut got = 0;
            let mut outs = Outputs {
                out: &mut out,
                out_bytes: &mut out_bytes,
                c: &c,
                endpoints: endpoints.as_deref(),
                worker: self.worker,
            };
            for (port, rx) in &mut self.rx {
                let n = rx.recv(&mut burst, BURST);
                if n == 0 {
                    continue;
                }
                got += n;
                let mut bytes = 0u64;
                self.pipeline.process_burst(
                    *port,
                    &mut burst,
                    &mut flood,
                    |pkt, verdict, flood| {
                        bytes += pkt.len() as u64;
                        outs.take(pkt, verdict, flood);
                    },
                );
                bump(&c.rx_packets[*port], n as u64);
                bump(&c.rx_bytes[*port], bytes);
            }
            got += self.pipeline.between_bursts();
            if let Some(table) = endpoints.as_deref() {
                got += self.endpoint_input(table, &mut burst, &mut flood, &mut outs);
            }
            for (o, pkts) in out.iter_mut().enumerate() {
                if pkts.is_empty() {
                    continue;
                }
                let sent = self.tx[o].send(pkts);
                let mut sent_bytes = std::mem::take(&mut out_bytes[o]);
                if !pkts.is_empty() {
                    // Rare: the queue was full. Only then walk the leftovers.
                    sent_bytes -= pkts.iter().map(|p| p.len() as u64).sum::<u64>();
                    bump(&c.drops[DropReason::TxFull.index()], pkts.len() as u64);
                    pkts.clear();
                }
                bump(&c.tx_packets[o], sent as u64);
                bump(&c.tx_bytes[o], sent_bytes);
            }
            bump(&c.turns, 1);
            match idle {
                Idle::BusyPoll => {}
                Idle::Backoff { spins, max } => {
                    if got > 0 {
                        empty_turns = 0;
                        nap = Duration::from_micros(1);
                    } else {
                        empty_turns = empty_turns.saturating_add(1);
                        if empty_turns > spins {
                            std::thread::sleep(nap);
                            nap = (nap * 2).min(max);
                        }
                    }
                }
            }
        }
        // Between turns: no burst is half done.
        self.pipeline.stopped();
    }
}

/// Reads the summed counters of a set of workers; cheap to clone, usable
/// from any thread while the workers run.
#[derive(Debug, Clone)]
pub struct CounterReader {
    counters: Arc<Vec<Arc<WorkerCounters>>>,
    ports: usize,
}

/// Running workers: stop them with [`Workers::stop`] (also on drop).
#[derive(Debug)]
pub struct Workers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    counters: Vec<Arc<WorkerCounters>>,
    ports: usize,
}

/// Why workers could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A worker could not open a queue.
    #[error("worker {worker}: {source}")]
    Queue {
        /// Worker index.
        worker: usize,
        /// The driver's error.
        source: IoError,
    },
    /// The OS refused to start a thread.
    #[error("starting worker {worker}: {source}")]
    Thread {
        /// Worker index.
        worker: usize,
        /// The OS error.
        source: std::io::Error,
    },
}

impl Workers {
    /// Starts one thread per config, in order. Each opens its queues on its
    /// own thread; if one cannot, the workers already running are stopped
    /// and the error returned.
    ///
    /// # Errors
    /// [`StartError`] naming the worker that failed.
    pub fn start<D: Driver, P: Pipeline>(
        driver: &D,
        configs: Vec<WorkerConfig>,
        mut pipeline: impl FnMut(usize) -> P,
    ) -> Result<Workers, StartError> {
        let ports = driver.port_count();
        let stop = Arc::new(AtomicBool::new(false));
        let mut w = Workers {
            stop: stop.clone(),
            threads: Vec::new(),
            counters: Vec::new(),
            ports,
        };
        for (i, cfg) in configs.into_iter().enumerate() {
            let counters = Arc::new(WorkerCounters::new(ports));
            let (tx_ready, rx_ready) = std::sync::mpsc::channel::<Result<(), IoError>>();
            let (d, p, c, s) = (driver.clone(), pipeline(i), counters.clone(), stop.clone());
            let t = std::thread::Builder::new()
                .name(format!("dp-worker-{i}"))
                .spawn(move || {
                    let opened = (|| -> Result<(D::ThreadGuard, Loop<D, P>), IoError> {
                        // Pinned first: EAL takes a registered thread's
                        // lcore CPU set from its affinity.
                        if let Some(cpu) = cfg.cpu {
                            dpu_os::affinity::pin_current_thread(cpu)
                                .map_err(|e| IoError::Thread(e.to_string()))?;
                        }
                        let guard = d.enter_worker()?;
                        let rx = cfg
                            .rx
                            .iter()
                            .map(|&(port, q)| d.rx_queue(port, q).map(|h| (port, h)))
                            .collect::<Result<_, _>>()?;
                        let tx = (0..d.port_count())
                            .map(|port| d.tx_queue(port, cfg.tx_queue))
                            .collect::<Result<_, _>>()?;
                        let l = Loop {
                            rx,
                            tx,
                            pipeline: p,
                            counters: c,
                            driver: d.clone(),
                            worker: i,
                        };
                        Ok((guard, l))
                    })();
                    match opened {
                        // The guard (EAL registration) outlives the queues.
                        Ok((guard, l)) => {
                            let _ = tx_ready.send(Ok(()));
                            l.run(&s, cfg.idle);
                            drop(guard);
                        }
                        Err(e) => {
                            let _ = tx_ready.send(Err(e));
                        }
                    }
                })
                .map_err(|source| StartError::Thread { worker: i, source })?;
            w.threads.push(t);
            w.counters.push(counters);
            // One at a time: a failure names the worker that hit it, and
            // dropping `w` stops the ones already running.
            match rx_ready.recv() {
                Ok(Ok(())) => {}
                Ok(Err(source)) => return Err(StartError::Queue { worker: i, source }),
                Err(_) => {
                    return Err(StartError::Queue {
                        worker: i,
                        source: IoError::Queue {
                            port: 0,
                            reason: "worker thread ended during start".into(),
                        },
                    })
                }
            }
        }
        Ok(w)
    }

    /// Counters summed over all workers.
    pub fn totals(&self) -> Totals {
        self.reader().totals()
    }

    /// A reader of the workers' counters for other threads.
    pub fn reader(&self) -> CounterReader {
        CounterReader {
            counters: Arc::new(self.counters.clone()),
            ports: self.ports,
        }
    }

    /// Stops every worker after its current turn and waits for it.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl CounterReader {
    /// Counters summed over all workers.
    pub fn totals(&self) -> Totals {
        let mut t = Totals {
            rx_packets: vec![0; self.ports],
            rx_bytes: vec![0; self.ports],
            tx_packets: vec![0; self.ports],
            tx_bytes: vec![0; self.ports],
            ..Totals::default()
        };
        let add = |dst: &mut Vec<u64>, src: &[AtomicU64]| {
            for (d, s) in dst.iter_mut().zip(src) {
                *d += s.load(Ordering::Relaxed);
            }
        };
        for c in self.counters.iter() {
            add(&mut t.rx_packets, &c.rx_packets);
            add(&mut t.rx_bytes, &c.rx_bytes);
            add(&mut t.tx_packets, &c.tx_packets);
            add(&mut t.tx_bytes, &c.tx_bytes);
            for (d, s) in t.drops.iter_mut().zip(&c.drops) {
                *d += s.load(Ordering::Relaxed);
            }
            t.turns += c.turns.load(Ordering::Relaxed);
        }
        t
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::memory::MemoryDriver;

    fn wait_for(mut done: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    const BACKOFF: Idle = Idle::Backoff {
        spins: 100,
        max: Duration::from_millis(1),
    };

    /// Floods every packet: port 1 gets it tagged, port 2 untagged.
    struct Fan;
    impl Pipeline for Fan {
        fn process(&mut self, _in: usize, _p: &mut [u8], flood: &mut Vec<Egress>) -> Verdict {
            flood.push(Egress {
                vlan: VlanOp::Push(7),
                ..Egress::to(1)
            });
            flood.push(Egress {
                vlan: VlanOp::Strip,
                ..Egress::to(2)
            });
            Verdict::Flood
        }
    }

    #[test]
    fn floods_copies_with_their_own_tag_operations() {
        let d = MemoryDriver::new(3);
        let mut tagged = vec![0xff; 12];
        tagged.extend_from_slice(&[0x81, 0x00, 0x20, 0x05, 0x08, 0x00]);
        tagged.extend_from_slice(&[0xab; 46]);
        d.inject(0, tagged.clone()).unwrap();
        let cfg = WorkerConfig {
            rx: vec![(0, 0)],
            tx_queue: 0,
            cpu: None,
            idle: BACKOFF,
        };
        let mut w = Workers::start(&d, vec![cfg], |_| Fan).unwrap();
        wait_for(|| w.totals().tx_packets[1] == 1 && w.totals().tx_packets[2] == 1);
        w.stop();
        // Port 1: a second tag pushed in front of the first (QinQ).
        let one = d.take_sent(1).remove(0);
        assert_eq!(&one[12..18], &[0x81, 0x00, 0x00, 0x07, 0x81, 0x00]);
        assert_eq!(&one[..12], &tagged[..12]);
        assert_eq!(&one[16..], &tagged[12..]);
        // Port 2: the tag removed, the rest intact.
        let two = d.take_sent(2).remove(0);
        assert_eq!(&two[..12], &tagged[..12]);
        assert_eq!(&two[12..], &tagged[16..]);
        assert_eq!(w.totals().tx_bytes[2], tagged.len() as u64 - 4);
        assert_eq!(w.totals().drops, [0; DropReason::ALL.len()]);
    }

    #[test]
    fn cross_connect_forwards_in_order_and_counts() {
        let d = MemoryDriver::new(3);
        for i in 0..100u8 {
            d.inject(0, vec![i; 60]).unwrap();
            d.inject(2, vec![i; 10]).unwrap();
        }
        let cfg = WorkerConfig {
            rx: vec![(0, 0), (2, 0)],
            tx_queue: 0,
            cpu: None,
            idle: BACKOFF,
        };
        let mut w = Workers::start(&d, vec![cfg], |_| CrossConnect::new(&[(0, 1)])).unwrap();
        wait_for(|| w.totals().rx_packets[0] == 100 && w.totals().rx_packets[2] == 100);
        w.stop();
        let sent = d.take_sent(1);
        assert_eq!(sent.len(), 100);
        assert!(
            sent.iter()
                .enumerate()
                .all(|(i, p)| p[0] as usize == i && p.len() == 60),
            "order kept"
        );
        let t = w.totals();
        assert_eq!(t.tx_packets[1], 100);
        assert_eq!(t.tx_bytes[1], 6000);
        assert_eq!(t.rx_bytes[0], 6000);
        assert_eq!(t.dropped(DropReason::NoTenant), 100, "port 2 is not wired");
    }

    #[test]
    fn full_tx_queue_drops_and_counts() {
        let d = MemoryDriver::with_tx_limit(2, Some(10));
        for i in 0..50u8 {
            d.inject(0, vec![i]).unwrap();
        }
        let cfg = WorkerConfig {
            rx: vec![(0, 0)],
            tx_queue: 0,
            cpu: None,
            idle: BACKOFF,
        };
        let mut w = Workers::start(&d, vec![cfg], |_| CrossConnect::new(&[(0, 1)])).unwrap();
        wait_for(|| w.totals().rx_packets[0] == 50);
        w.stop();
        let t = w.totals();
        assert_eq!(t.tx_packets[1], 10);
        assert_eq!(t.dropped(DropReason::TxFull), 40);
        assert_eq!(d.take_sent(1).len(), 10);
    }

    #[test]
    fn a_worker_that_cannot_open_its_queues_fails_the_start() {
        let d = MemoryDriver::new(2);
        let a = WorkerConfig {
            rx: vec![(0, 0)],
            tx_queue: 0,
            cpu: None,
            idle: BACKOFF,
        };
        let clash = WorkerConfig {
            rx: vec![(0, 0)],
            tx_queue: 1,
            cpu: None,
            idle: BACKOFF,
        };
        let err = Workers::start(&d, vec![a.clone(), clash], |_| CrossConnect::new(&[(0, 1)]))
            .unwrap_err();
        assert!(matches!(err, StartError::Queue { worker: 1, .. }), "{err}");
        // The failed start stopped the first worker and released its queues.
        let mut w = Workers::start(&d, vec![a], |_| CrossConnect::new(&[(0, 1)])).unwrap();
        w.stop();
    }

    #[test]
    fn idle_workers_back_off_and_stop_promptly() {
        let d = MemoryDriver::new(2);
        let cfg = WorkerConfig {
            rx: vec![(0, 0)],
            tx_queue: 0,
            cpu: None,
            idle: Idle::Backoff {
                spins: 10,
                max: Duration::from_millis(5),
            },
        };
        let mut w = Workers::start(&d, vec![cfg], |_| CrossConnect::new(&[(0, 1)])).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let turns = w.totals().turns;
        assert!(turns < 1000, "{turns} turns in 100 ms: not backing off");
        let t0 = std::time::Instant::now();
        w.stop();
        assert!(t0.elapsed() < Duration::from_secs(2));
    }

    /// Port 0 to the endpoint on virtual port 2 (untagged), the
    /// endpoint's frames to port 1, anything for virtual port 3 (no
    /// endpoint there) to port 3.
    struct ToEndpoint(Arc<EndpointTable>);
    impl Pipeline for ToEndpoint {
        fn process(&mut self, in_port: usize, _p: &mut [u8], _f: &mut Vec<Egress>) -> Verdict {
            match in_port {
                0 => Verdict::Forward(Egress {
                    vlan: VlanOp::Strip,
                    ..Egress::to(2)
                }),
                2 => Verdict::Forward(Egress::to(1)),
                _ => Verdict::Forward(Egress::to(3)),
            }
        }
        fn endpoints(&self) -> Option<&Arc<EndpointTable>> {
            Some(&self.0)
        }
    }

    #[test]
    fn frames_reach_an_endpoint_untagged_and_its_frames_enter_the_switch() {
        use crate::endpoint_queues::EndpointQueues;
        let d = MemoryDriver::new(2);
        let q = Arc::new(EndpointQueues::new(1, 4, 64));
        let table = Arc::new(EndpointTable::new(2, vec![q.clone()]));
        let mut tagged = vec![0xff; 12];
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x07, 0x08, 0x00]);
        tagged.extend_from_slice(&[0xab; 46]);
        for _ in 0..6 {
            d.inject(0, tagged.clone()).unwrap();
        }
        // Too long for the endpoint's buffers (64 bytes): counted.
        let mut long = tagged.clone();
        long.resize(90, 0);
        d.inject(0, long).unwrap();
        // From port 1 to virtual port 3, where no endpoint is.
        d.inject(1, vec![1; 60]).unwrap();
        let cfg = WorkerConfig {
            rx: vec![(0, 0), (1, 0)],
            tx_queue: 0,
            cpu: None,
            idle: BACKOFF,
        };
        let t = table.clone();
        let mut w = Workers::start(&d, vec![cfg], move |_| ToEndpoint(t.clone())).unwrap();
        wait_for(|| w.totals().rx_packets[0] == 7 && w.totals().rx_packets[1] == 1);
        // The queue holds 4 frames: 2 more and the long one were dropped.
        let t = w.totals();
        assert_eq!(t.dropped(DropReason::EndpointFull), 3);
        assert_eq!(t.dropped(DropReason::TxFull), 1, "no endpoint on port 3");
        let mut got = Vec::new();
        while let Some(f) = q.receive(0) {
            got.push(f.clone());
            q.recycle(0, f);
        }
        assert_eq!(got.len(), 4);
        assert!(got
            .iter()
            .all(|f| f[..12] == tagged[..12] && f[12..] == tagged[16..]));
        // The endpoint answers: its frames go through the pipeline as
        // received on its virtual port, out of port 1.
        for i in 0..3u8 {
            let mut b = q.send_buffer(0);
            b.extend_from_slice(&[i; 60]);
            q.send(0, b).unwrap();
        }
        wait_for(|| w.totals().tx_packets[1] == 3);
        w.stop();
        let sent = d.take_sent(1);
        assert_eq!(sent, (0..3u8).map(|i| vec![i; 60]).collect::<Vec<_>>());
        assert_eq!(w.totals().dropped(DropReason::EndpointFull), 3);
    }

    /// [`ToEndpoint`] whose side work is the endpoint: it answers each
    /// frame it got with the frame's bytes reversed, counting its turns.
    struct EchoEndpoint(ToEndpoint, Arc<AtomicU64>);
    impl Pipeline for EchoEndpoint {
        fn process(&mut self, in_port: usize, p: &mut [u8], f: &mut Vec<Egress>) -> Verdict {
            self.0.process(in_port, p, f)
        }
        fn endpoints(&self) -> Option<&Arc<EndpointTable>> {
            self.0.endpoints()
        }
        fn between_bursts(&mut self) -> usize {
            self.1.fetch_add(1, Ordering::Relaxed);
            let q = self.0 .0.get(2).expect("the endpoint");
            let mut n = 0;
            while let Some(f) = q.receive(0) {
                let mut b = q.send_buffer(0);
                b.extend(f.iter().rev());
                q.recycle(0, f);
                q.send(0, b).expect("room for the answer");
                n += 1;
            }
            n
        }
    }

    #[test]
    fn side_work_runs_between_the_ports_and_the_endpoints_frames() {
        use crate::endpoint_queues::EndpointQueues;
        let d = MemoryDriver::new(2);
        let q = Arc::new(EndpointQueues::new(1, 8, 64));
        let table = Arc::new(EndpointTable::new(2, vec![q]));
        let turns = Arc::new(AtomicU64::new(0));
        let cfg = WorkerConfig {
            rx: vec![(0, 0), (1, 0)],
            tx_queue: 0,
            cpu: None,
            idle: BACKOFF,
        };
        let (t, n) = (table.clone(), turns.clone());
        let mut w = Workers::start(&d, vec![cfg], move |_| {
            EchoEndpoint(ToEndpoint(t.clone()), n.clone())
        })
        .unwrap();
        // Tagged frames: the endpoint gets them untagged.
        let frames: Vec<Vec<u8>> = (0..5u8)
            .map(|i| {
                let mut f: Vec<u8> = (i..i + 12).collect();
                f.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
                f.extend(i + 12..i + 60);
                f
            })
            .collect();
        for f in &frames {
            d.inject(0, f.clone()).unwrap();
        }
        wait_for(|| w.totals().tx_packets[1] == 5);
        w.stop();
        // Each answered by the side work, and sent on as the endpoint's.
        let want: Vec<Vec<u8>> = frames
            .iter()
            .map(|f| {
                let untagged: Vec<u8> = f[..12].iter().chain(&f[16..]).copied().collect();
                untagged.into_iter().rev().collect()
            })
            .collect();
        assert_eq!(d.take_sent(1), want);
        assert!(turns.load(Ordering::Relaxed) > 0);
        assert_eq!(w.totals().dropped(DropReason::EndpointFull), 0);
    }

    /// Records the CPUs its thread may run on at each turn.
    struct WhereAmI(Arc<std::sync::Mutex<Vec<usize>>>);
    impl Pipeline for WhereAmI {
        fn process(&mut self, _in: usize, _p: &mut [u8], _f: &mut Vec<Egress>) -> Verdict {
            Verdict::Drop(DropReason::NoTenant)
        }
        fn turn(&mut self) {
            if let (Ok(cpus), Ok(mut seen)) =
                (dpu_os::affinity::current_thread_cpus(), self.0.lock())
            {
                *seen = cpus;
            }
        }
    }

    #[test]
    fn workers_are_pinned_to_their_cpu_or_fail_to_start() {
        let d = MemoryDriver::new(1);
        let &cpu = dpu_os::affinity::current_thread_cpus()
            .unwrap()
            .last()
            .unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let cfg = WorkerConfig {
            rx: vec![(0, 0)],
            tx_queue: 0,
            cpu: Some(cpu),
            idle: BACKOFF,
        };
        let mut w = Workers::start(&d, vec![cfg.clone()], |_| WhereAmI(seen.clone())).unwrap();
        wait_for(|| seen.lock().unwrap().len() == 1);
        w.stop();
        assert_eq!(*seen.lock().unwrap(), vec![cpu]);

        let bad = WorkerConfig {
            cpu: Some(100_000),
            ..cfg
        };
        let err = Workers::start(&d, vec![bad], |_| WhereAmI(seen.clone())).unwrap_err();
        assert!(
            matches!(&err, StartError::Queue { worker: 0, source: IoError::Thread(m) } if m.contains("100000")),
            "{err}"
        );
    }
}
