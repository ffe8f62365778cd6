//! The storage endpoints' thread: one TCP/IP stack
//! ([`dpu_endpoint::Endpoint`]) per (tenant, address) of the state,
//! serving NVMe/TCP to the tenant's hosts through the switch.
//!
//! Why a thread of its own rather than the workers or the NVMe/TCP poll
//! groups: the workers must never wait for storage (a busy endpoint
//! would stall the forwarding of every other tenant), and the poll groups
//! are built around kernel sockets and their readiness. The thread takes
//! the frames the workers copied into each endpoint's queues
//! ([`EndpointQueues`]), hands them to its stack, runs the stack (its
//! block requests included) and queues the stack's frames back, each to
//! the worker that brought the connection's frames in, so that the
//! worker that tracks a connection sees both of its directions.
//!
//! It follows two things: the storage state ([`EndpointPlan`], published
//! by [`crate::storage::Storage`] with every applied change: endpoints
//! appear, go, and change ports and subsystems) and the switch's
//! configuration (where each endpoint's queues are). An endpoint keeps
//! its stack, and its connections, for as long as the state has it.
//!
//! With `storage.endpoint_placement = "worker"` the same loop runs in
//! the first worker instead ([`InlineEndpoints`], taken from an
//! [`InlineSlot`]), once a turn between the worker's bursts: no thread,
//! no hand-over between cores, at the price of the worker's forwarding
//! waiting for the stacks' turn.
//!
//! Idle, the thread follows the workers ([`Idle`]): with `BusyPoll` (a DPU's
//! dedicated cores) it keeps polling; with `Backoff` it sleeps after an
//! empty turn, doubling from 1 µs up to the workers' longest sleep: a
//! frame waits at most that long for the thread to wake (bounded
//! latency), and an idle service costs a few thousand wake-ups a second.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dpu_dataplane::endpoint_queues::EndpointQueues;
use dpu_dataplane::switch::SwitchHandle;
use dpu_dataplane::wire::{self, L3};
use dpu_dataplane::worker::Idle;
use dpu_endpoint::{BufferPool, Endpoint, EndpointConfig};
use dpu_nvmeof::auth::pool::DhPool;

use crate::storage::{EndpointPlan, EndpointSpec};

/// Frames taken from one lane of one endpoint before its stack runs:
/// many connections' segments per poll, and no lane starves the others.
const RECEIVE_BATCH: usize = 64;

/// Prefix length an IPv4 endpoint's address is configured with. The
/// state has no tenant network prefix and the endpoint has no router:
/// every host in the half of the address space the endpoint's address is
/// in is reached directly (the tenant's hosts share its network).
const PREFIX_LEN: u8 = 1;

/// Prefix length an IPv6 endpoint's address is configured with: every
/// host is on-link, resolved by neighbour discovery.
const PREFIX_LEN_V6: u8 = 0;

/// Frames one poll of a stack may send at most: its egress burst, the
/// replies it queued while receiving, and a margin for the last pass
/// over its sockets. A stack is polled for output only when every lane
/// has room for them, so its frames wait in its socket buffers instead of
/// being dropped at a full queue.
const POLL_FRAMES: usize =
    dpu_endpoint::endpoint::EGRESS_BURST as usize + dpu_endpoint::device::PENDING_FRAMES + 64;

/// Frames a lane may still hold from the last poll when the stack is
/// polled for output again: two of the worker's bursts, so the worker
/// never runs dry while the stack catches up. Polling whenever the lane
/// merely had room let 700 and more frames queue ahead of the worker,
/// milliseconds of data at a slow port: its ACKs came back later than
/// smoltcp's 10 ms shortest retransmission timeout, which (smoltcp 0.12
/// does not restart the timer on an ACK of part of the data in flight)
/// then sent the whole flight again. Data waiting in the socket's buffer
/// instead is neither timed nor resent.
const DRAINED: usize = 2 * dpu_dataplane::worker::BURST;

/// Most connections' worker lanes remembered per endpoint; beyond it the
/// memory is cleared (replies then take lane 0 until the next frame in).
const LANES_MAX: usize = 4096;

/// How each endpoint's stack is made.
#[derive(Debug, Clone)]
pub struct StackSettings {
    /// IP MTU: the smallest of the data-plane ports'.
    pub mtu: usize,
    /// Most connections of one endpoint.
    pub max_connections: usize,
    /// Most connections of one endpoint from one host address.
    pub max_connections_per_address: usize,
    /// How long a host may take no byte of output.
    pub write_timeout: Duration,
    /// What the thread does when no frame moved.
    pub idle: Idle,
    /// Threads that run the endpoints' DH-HMAC-CHAP Diffie-Hellman work
    /// (`storage.auth_threads`), and the jobs that may wait for them
    /// (`storage.auth_queue`): a pool of their own beside the kernel
    /// transport's.
    pub auth_threads: usize,
    /// See `auth_threads`.
    pub auth_queue: usize,
}

impl StackSettings {
    fn config(&self, spec: &EndpointSpec) -> EndpointConfig {
        let prefix = if spec.address.is_ipv4() {
            PREFIX_LEN
        } else {
            PREFIX_LEN_V6
        };
        // An IPv6 endpoint behind ports of an MTU below 1280 is refused
        // (logged, not started) rather than sent frames the ports drop.
        let mut c = EndpointConfig::new(spec.mac, spec.address, prefix);
        c.mtu = self
            .mtu
            .clamp(dpu_endpoint::config::MIN_MTU, dpu_endpoint::config::MAX_MTU);
        c.max_connections = self.max_connections.clamp(1, 65_535);
        c.max_connections_per_address = self.max_connections_per_address.clamp(1, 65_535);
        c.write_timeout = self.write_timeout;
        c
    }
}

/// The running endpoint thread: stopped by [`Endpoints::stop`] or on drop.
pub struct Endpoints {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Endpoints {
    /// Starts the thread serving the endpoints of `plan`, with their
    /// frames in `switch`'s queues; with `inline`, hands the stacks to
    /// the worker that takes that slot instead, and starts no thread.
    ///
    /// # Errors
    /// If the OS refuses the thread.
    pub fn start(
        plan: Arc<EndpointPlan>,
        switch: SwitchHandle,
        settings: StackSettings,
        inline: Option<&Arc<InlineSlot>>,
    ) -> std::io::Result<Endpoints> {
        let dh = Arc::new(
            DhPool::new(settings.auth_threads, settings.auth_queue)
                .map_err(std::io::Error::other)?,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let l = Loop {
            pool: plan.pool(),
            dh,
            plan,
            switch,
            settings,
            stacks: BTreeMap::new(),
            plan_generation: u64::MAX,
            switch_generation: u64::MAX,
        };
        if let Some(slot) = inline {
            slot.put(InlineEndpoints {
                l,
                stop: stop.clone(),
                done: false,
            });
            tracing::info!("storage endpoints run in the first data-plane worker");
            return Ok(Endpoints { stop, thread: None });
        }
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("storage-endpoints".into())
            .spawn(move || {
                let mut l = l;
                l.run(&s);
            })?;
        Ok(Endpoints {
            stop,
            thread: Some(thread),
        })
    }

    /// Ends every endpoint's connections and stops the thread (or, run by
    /// a worker, has the worker end them at its next turn).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Endpoints {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where [`Endpoints::start`] leaves the stacks for a worker to run
/// (`storage.endpoint_placement = "worker"`): the worker looks at the
/// slot once a turn, at the cost of one atomic load, until it has taken
/// them.
#[derive(Default)]
pub struct InlineSlot {
    ready: AtomicBool,
    stacks: std::sync::Mutex<Option<InlineEndpoints>>,
}

impl InlineSlot {
    fn put(&self, e: InlineEndpoints) {
        *self.stacks.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        self.ready.store(true, Ordering::Release);
    }

    /// The stacks, once, if they have been put here.
    pub fn take(&self) -> Option<InlineEndpoints> {
        if !self.ready.load(Ordering::Acquire) {
            return None;
        }
        self.ready.store(false, Ordering::Relaxed);
        self.stacks.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The storage endpoints' stacks as a worker runs them: one
/// [`InlineEndpoints::turn`] per worker turn, the worker's idle
/// behaviour instead of the thread's naps.
pub struct InlineEndpoints {
    l: Loop,
    stop: Arc<AtomicBool>,
    done: bool,
}

impl InlineEndpoints {
    /// Follows the plan and the switch, moves the frames the workers
    /// delivered into the stacks and runs them, and queues their frames
    /// for the workers. Returns how many frames moved, plus one if a
    /// stack wants to run again at once (so the worker does not nap).
    pub fn turn(&mut self) -> usize {
        if self.done {
            return 0;
        }
        if self.stop.load(Ordering::Relaxed) {
            self.done = true;
            self.l.shutdown();
            return 0;
        }
        let now = Instant::now();
        let (moved, next) = self.l.turn(now);
        moved + usize::from(next <= now)
    }
}

impl Drop for InlineEndpoints {
    /// The worker stopping ends the connections.
    fn drop(&mut self) {
        if !self.done {
            self.l.shutdown();
        }
    }
}

/// One endpoint's stack and where its frames are.
struct Stack {
    ep: Endpoint,
    mac: [u8; 6],
    ports: std::collections::BTreeSet<u16>,
    target: dpu_nvmeof::Target,
    queues: Option<Arc<EndpointQueues>>,
    lanes: Lanes,
    /// The last turn did not poll the stack: the workers had not taken
    /// enough of its frames yet. Its own next poll time (now, as long as
    /// data waits in a socket) is then no reason to spin: the workers
    /// need the core to drain the lane, and the thread naps as after an
    /// empty turn.
    held: bool,
    /// When the stack wants its next poll, as it said after its last
    /// poll if that one sent nothing; `None`: at once (it sent frames, or
    /// is new, changed or shutting down). A turn that brings no frame
    /// polls a quiet stack only from then on, so an idle stack costs a
    /// turn (a worker's, with the stacks in the worker) a look at its
    /// queues, while a busy one is polled every turn as its output
    /// drains.
    due: Option<Instant>,
    /// When the stack wants its next poll, as it said after its last one.
    next: Instant,
}

struct Loop {
    plan: Arc<EndpointPlan>,
    switch: SwitchHandle,
    settings: StackSettings,
    /// The socket buffer memory every endpoint's stack takes from.
    pool: Arc<BufferPool>,
    /// Where every endpoint's DH work runs.
    dh: Arc<DhPool>,
    stacks: BTreeMap<(String, IpAddr), Stack>,
    plan_generation: u64,
    switch_generation: u64,
}

impl Loop {
    fn run(&mut self, stop: &AtomicBool) {
        // An empty turn polls every stack, heavier than a worker's empty
        // poll of its queues: with backoff the thread sleeps at its first
        // one (spinning as the workers do cost the 4 KiB QD 1 latency
        // tenfold on a machine with fewer cores than busy threads).
        let (busy, max_nap) = match self.settings.idle {
            Idle::BusyPoll => (true, Duration::ZERO),
            Idle::Backoff { max, .. } => (false, max),
        };
        let mut nap = Duration::from_micros(1);
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let (moved, next) = self.turn(now);
            if moved > 0 {
                nap = Duration::from_micros(1);
                continue;
            }
            let until = next
                .min(now + max_nap)
                .saturating_duration_since(Instant::now());
            if busy || until.is_zero() {
                std::hint::spin_loop();
                continue;
            }
            std::thread::sleep(nap.min(until));
            nap = (nap * 2).min(max_nap);
        }
        self.shutdown();
    }

    /// One turn: takes up changes, then moves every stack's frames and
    /// runs it. Returns the frames moved and when a stack that is not
    /// waiting for the workers next wants a poll (far ahead if none).
    fn turn(&mut self, now: Instant) -> (usize, Instant) {
        self.follow();
        let mut moved = 0;
        let mut next = now + Duration::from_secs(3600);
        let mut open = 0;
        for s in self.stacks.values_mut() {
            moved += s.turn(now);
            if !s.held {
                next = next.min(s.next);
            }
            open += s.ep.open_connections();
        }
        self.plan.set_open_connections(open);
        (moved, next)
    }

    /// Ends every endpoint's connections, sending what that takes.
    fn shutdown(&mut self) {
        for s in self.stacks.values_mut() {
            s.ep.shutdown();
            s.due = None;
            s.turn(Instant::now());
        }
    }

    /// Takes up the plan's and the switch's changes.
    fn follow(&mut self) {
        let g = self.plan.generation();
        if g != self.plan_generation {
            self.plan_generation = g;
            self.reconcile(&self.plan.specs());
            // New stacks need their queues.
            self.switch_generation = u64::MAX;
        }
        let g = self.switch.generation();
        if g != self.switch_generation {
            self.switch_generation = g;
            let links = self.switch.endpoint_links();
            for ((tenant, address), s) in &mut self.stacks {
                let queues = links
                    .iter()
                    .find(|l| {
                        &l.tenant == tenant && l.endpoint.ip == *address && l.endpoint.mac == s.mac
                    })
                    .map(|l| l.queues.clone());
                if queues.as_ref().map(Arc::as_ptr) != s.queues.as_ref().map(Arc::as_ptr) {
                    s.lanes.clear();
                    s.due = None;
                }
                s.queues = queues;
            }
        }
    }

    /// Makes the stacks `specs` asks for, changes their ports, and shuts
    /// down those it no longer has.
    fn reconcile(&mut self, specs: &[EndpointSpec]) {
        let now = Instant::now();
        let wanted: std::collections::BTreeSet<(String, IpAddr)> = specs
            .iter()
            .map(|s| (s.tenant.clone(), s.address))
            .collect();
        self.stacks.retain(|(tenant, address), s| {
            let keep = wanted.contains(&(tenant.clone(), *address));
            if !keep {
                tracing::info!(%tenant, %address, "storage endpoint removed");
                s.ep.shutdown();
                s.due = None;
                s.turn(now);
            }
            keep
        });
        for spec in specs {
            let key = (spec.tenant.clone(), spec.address);
            let stale = self
                .stacks
                .get(&key)
                .is_some_and(|s| s.mac != spec.mac || !s.target.is_same(&spec.target));
            if stale {
                if let Some(mut s) = self.stacks.remove(&key) {
                    s.ep.shutdown();
                    s.due = None;
                    s.turn(now);
                }
            }
            if !self.stacks.contains_key(&key) {
                match Endpoint::with_pool(self.settings.config(spec), now, &self.pool) {
                    Ok(mut ep) => {
                        ep.set_dh_pool(self.dh.clone());
                        tracing::info!(tenant = %spec.tenant, address = %spec.address, mtu = ep.config().mtu, "storage endpoint serving");
                        self.stacks.insert(
                            key.clone(),
                            Stack {
                                ep,
                                mac: spec.mac,
                                ports: Default::default(),
                                target: spec.target.clone(),
                                queues: None,
                                lanes: Lanes::default(),
                                held: false,
                                due: None,
                                next: now,
                            },
                        );
                    }
                    Err(e) => {
                        tracing::error!(tenant = %spec.tenant, address = %spec.address, error = %e, "storage endpoint not started");
                        continue;
                    }
                }
            }
            let Some(s) = self.stacks.get_mut(&key) else {
                continue;
            };
            for &p in s.ports.difference(&spec.ports) {
                s.ep.unlisten(p);
            }
            for &p in spec.ports.difference(&s.ports) {
                if let Err(e) = s.ep.listen(p, spec.target.clone()) {
                    tracing::error!(tenant = %spec.tenant, address = %spec.address, port = p, error = %e, "storage endpoint cannot listen");
                }
            }
            if s.ports != spec.ports {
                s.due = None;
            }
            s.ports = spec.ports.clone();
        }
    }
}

impl Stack {
    /// Moves frames from the queues into the stack, runs it, and queues
    /// its frames back. Returns how many frames moved.
    fn turn(&mut self, now: Instant) -> usize {
        let mut moved = 0;
        if let Some(q) = &self.queues {
            // With one worker every reply goes back through it: nothing to
            // learn (two map inserts a frame).
            let learn = q.workers() > 1;
            for lane in 0..q.workers() {
                for _ in 0..RECEIVE_BATCH {
                    let Some(frame) = q.receive(lane) else {
                        break;
                    };
                    if learn {
                        self.lanes.learn(&frame, lane);
                    }
                    self.ep.receive(&frame, now);
                    q.recycle(lane, frame);
                    moved += 1;
                }
            }
        }
        if moved == 0 && self.due.is_some_and(|d| now < d) {
            // Nothing came and nothing is due.
            self.held = false;
            return 0;
        }
        let (queues, lanes) = (&self.queues, &self.lanes);
        if let Some(q) = queues {
            let depth = q.depth();
            if (0..q.workers()).any(|lane| {
                let room = q.send_room(lane);
                room < POLL_FRAMES || depth.saturating_sub(room) > DRAINED
            }) {
                // The workers have not taken the last poll's frames yet.
                self.held = true;
                return moved;
            }
        }
        self.held = false;
        let mut sent = 0;
        self.ep.poll(now, &mut |frame: &[u8]| {
            // Without queues (the switch has not taken the endpoint yet)
            // the frame is lost; TCP sends it again.
            let Some(q) = queues else {
                return;
            };
            let lane = if q.workers() > 1 {
                lanes.pick(frame)
            } else {
                0
            };
            let mut b = q.send_buffer(lane);
            b.extend_from_slice(frame);
            // A full queue loses the frame, as a full link would.
            let _ = q.send(lane, b);
            sent += 1;
        });
        moved += sent;
        let at = self.ep.poll_at(now);
        self.due = (sent == 0).then_some(at);
        self.next = at;
        moved
    }
}

/// Which worker brought each peer's frames in: a connection's replies go
/// back through the worker that tracks it (symmetric RSS sends both
/// directions of a flow to one worker).
#[derive(Default)]
struct Lanes {
    /// (peer address, IPv4 ones mapped into IPv6; peer TCP port or 0) to
    /// lane.
    by_peer: HashMap<(u128, u16), usize>,
}

impl Lanes {
    fn clear(&mut self) {
        self.by_peer.clear();
    }

    /// Remembers the lane `frame` (to the endpoint) came through.
    fn learn(&mut self, frame: &[u8], lane: usize) {
        let Some((ip, port)) = peer(frame, true) else {
            return;
        };
        if self.by_peer.len() >= LANES_MAX && !self.by_peer.contains_key(&(ip, port)) {
            self.by_peer.clear();
        }
        self.by_peer.insert((ip, port), lane);
        if port != 0 {
            self.by_peer.insert((ip, 0), lane);
        }
    }

    /// The lane for `frame` (from the endpoint): its connection's, else
    /// its peer's last, else 0.
    fn pick(&self, frame: &[u8]) -> usize {
        let Some((ip, port)) = peer(frame, false) else {
            return 0;
        };
        self.by_peer
            .get(&(ip, port))
            .or_else(|| self.by_peer.get(&(ip, 0)))
            .copied()
            .unwrap_or(0)
    }
}

/// The peer of an untagged Ethernet frame to (`inbound`) or from the
/// endpoint, read with the data plane's parser: its address (IPv4 mapped
/// into IPv6) and, for TCP, its port (0 otherwise). `None` for a frame
/// that is neither ARP nor IP, or does not parse.
fn peer(frame: &[u8], inbound: bool) -> Option<(u128, u16)> {
    let mapped = |a: u32| u128::from(std::net::Ipv4Addr::from(a).to_ipv6_mapped());
    match wire::parse(frame).ok()?.l3 {
        // ARP: the sender of a frame in, the target of a frame out.
        L3::Arp {
            sender_ip,
            target_ip,
            ..
        } => Some((mapped(if inbound { sender_ip } else { target_ip }), 0)),
        L3::Ip { key, .. } => {
            let (ip, port) = if inbound {
                (key.src, key.src_port)
            } else {
                (key.dst, key.dst_port)
            };
            // IPv4 addresses sit in the key's low 32 bits.
            let ip = if key.v6 { ip } else { mapped(ip as u32) };
            Some((
                ip,
                if key.proto == wire::proto::TCP {
                    port
                } else {
                    0
                },
            ))
        }
        L3::Other(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp_frame(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 54];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&40u16.to_be_bytes());
        f[22] = 64;
        f[23] = 6;
        f[46] = 0x50;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    #[test]
    fn replies_go_back_through_the_lane_their_connection_came_in() {
        let host = [10, 1, 0, 5];
        let ep = [10, 1, 0, 250];
        let mut l = Lanes::default();
        l.learn(&tcp_frame(host, ep, 40000, 4420), 3);
        l.learn(&tcp_frame(host, ep, 40001, 4420), 1);
        assert_eq!(l.pick(&tcp_frame(ep, host, 4420, 40000)), 3);
        assert_eq!(l.pick(&tcp_frame(ep, host, 4420, 40001)), 1);
        // A connection not seen yet: the host's last lane.
        assert_eq!(l.pick(&tcp_frame(ep, host, 4420, 40002)), 1);
        // ARP to an unknown host, garbage: lane 0.
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        arp[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        arp[38..42].copy_from_slice(&[10, 1, 0, 9]);
        assert_eq!(l.pick(&arp), 0);
        assert_eq!(l.pick(&[1, 2, 3]), 0);
        // ARP to a known host: its lane.
        arp[38..42].copy_from_slice(&host);
        assert_eq!(l.pick(&arp), 1);
    }

    /// An IPv6 frame with next header `next` (TCP ports when 6).
    fn ipv6_frame(src: u128, dst: u128, next: u8, sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 74];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        f[14] = 0x60;
        f[18..20].copy_from_slice(&20u16.to_be_bytes());
        f[20] = next;
        f[21] = 64;
        f[66] = 0x50;
        f[22..38].copy_from_slice(&src.to_be_bytes());
        f[38..54].copy_from_slice(&dst.to_be_bytes());
        f[54..56].copy_from_slice(&sport.to_be_bytes());
        f[56..58].copy_from_slice(&dport.to_be_bytes());
        f
    }

    #[test]
    fn ipv6_replies_go_back_through_their_connections_lane() {
        let host: u128 = 0xfd00_0001 << 96 | 5;
        let ep: u128 = 0xfd00_0001 << 96 | 0x250;
        let mut l = Lanes::default();
        l.learn(&ipv6_frame(host, ep, 6, 40000, 4420), 2);
        l.learn(&ipv6_frame(host, ep, 6, 40001, 4420), 1);
        assert_eq!(l.pick(&ipv6_frame(ep, host, 6, 4420, 40000)), 2);
        assert_eq!(l.pick(&ipv6_frame(ep, host, 6, 4420, 40001)), 1);
        // Neighbour discovery (ICMPv6) to the host: its last lane; to
        // another host, lane 0.
        assert_eq!(l.pick(&ipv6_frame(ep, host, 58, 0, 0)), 1);
        assert_eq!(l.pick(&ipv6_frame(ep, host + 1, 58, 0, 0)), 0);
        // An IPv4 host whose address is the IPv6 one's low bits is
        // another peer.
        assert_eq!(
            l.pick(&tcp_frame([0, 0, 0, 5], [10, 1, 0, 250], 4420, 40000)),
            0
        );
        assert_eq!(l.pick(&ipv6_frame(ep, host, 6, 4420, 40000)[..55]), 0);
    }

    #[test]
    fn the_lane_memory_is_bounded() {
        let mut l = Lanes::default();
        for i in 0..(LANES_MAX as u32 * 2) {
            l.learn(&tcp_frame(i.to_be_bytes(), [10, 0, 0, 1], 1, 4420), 2);
            assert!(l.by_peer.len() <= LANES_MAX + 1);
        }
    }
}
