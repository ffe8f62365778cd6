//! An endpoint: one smoltcp interface with its own MAC and IPv4 address,
//! its listening ports and its connections.
//!
//! Call order, as the switch's worker drives it: [`Endpoint::receive`] for
//! each frame delivered to the endpoint, then [`Endpoint::poll`] to serve
//! the connections and take the frames to send, and again no later than
//! [`Endpoint::poll_at`] says. `now` is the caller's clock and must not go
//! backwards.
//!
//! Listening: each port keeps up to [`EndpointConfig::backlog`] sockets in
//! LISTEN. A socket that takes a SYN becomes a connection (its NVMe/TCP
//! [`Connection`] made for the port's [`Target`]) and a new one is armed in
//! its place, before the next SYN to the port is taken in, as long as the connections, the listening sockets and the
//! closing ones together stay within [`EndpointConfig::max_connections`]
//! and their buffers within [`EndpointConfig::buffer_budget`]. At the cap
//! no socket listens, and the stack answers a SYN with a RST. There is no
//! SYN cookie: at most [`EndpointConfig::max_handshakes`] connections may
//! wait for the host's final ACK, one more drops the oldest of them, and
//! none waits longer than [`SYN_TIMEOUT`], so SYNs from forged addresses
//! hold a few sockets for a moment while a real host's handshake, done in
//! a round trip, gets through.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use dpu_nvmeof::auth::dh::DhError;
use dpu_nvmeof::auth::pool::{DhPool, DhResult};
use dpu_nvmeof::conn::{Completer, ICREQ_TIMEOUT};
use dpu_nvmeof::dpu_tls::{Detached, Handshake, HandshakeError, Step};
use dpu_nvmeof::{BlockCompletion, Connection, SecureChannel, Target};
use smoltcp::iface::{Config, Interface, PollResult, SocketHandle, SocketSet};
use smoltcp::socket::tcp::{self, CongestionControl, State};
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpListenEndpoint};

use crate::config::{ConfigError, EndpointConfig, ETHERNET_HEADER};
use crate::device::{FrameDevice, Pending, Sink};
use crate::pool::{BufferPool, Share};
use crate::session::{Channel, Fate, Session};

/// How often every connection is ticked (handshake, PDU, keep-alive and
/// idle timers; the write timeout), as the kernel transport's groups do.
pub const TICK: Duration = Duration::from_millis(100);

/// Frames one [`Endpoint::poll`] sends at most (a few more when the last
/// pass over the sockets crosses it): a busy endpoint gives its worker
/// back after about 0.7 ms of 9000-byte frames (0.12 ms of 1500-byte
/// ones) at 25 Gbit/s, and
/// [`Endpoint::poll_at`] asks for the next poll at once.
pub const EGRESS_BURST: u64 = 256;

/// How long a connection may stay in SYN-RECEIVED (its SYN-ACK
/// unanswered) before it is reset and its socket freed.
pub const SYN_TIMEOUT: Duration = Duration::from_secs(3);

/// Connections an endpoint can always serve, beside its listening
/// sockets, whatever other endpoints hold of a shared [`BufferPool`]: its
/// reserve there is `(backlog + RESERVED_CONNECTIONS)` sockets' buffers.
pub const RESERVED_CONNECTIONS: usize = 2;

/// How often an endpoint with Diffie-Hellman work out on its pool asks
/// to be polled, to pick up the results.
pub const DH_POLL: Duration = Duration::from_millis(1);

/// Longest a host on a listener that speaks TLS may take from its
/// connection to a completed handshake (the clear-text ICReq has as
/// long, counted once the handshake is done).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = ICREQ_TIMEOUT;

/// How often refusals of the secure channel of one kind are logged at
/// most.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// How long a closed connection's socket may take to finish its FIN
/// exchange before it is reset and freed.
pub const CLOSE_LINGER: Duration = Duration::from_secs(2);

/// Why an endpoint could not be made or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The port already listens.
    #[error("port {0} already listens")]
    PortInUse(u16),
    /// Port 0 cannot listen.
    #[error("port 0 cannot listen")]
    PortZero,
    /// The OS random number generator failed (the TCP initial sequence
    /// numbers are seeded from it).
    #[error("the OS random number generator failed: {0}")]
    Random(getrandom::Error),
}

/// What an endpoint counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Frames handed to [`Endpoint::receive`].
    pub frames_in: u64,
    /// Frames dropped on arrival: the queue of replies waiting for the
    /// next poll was full.
    pub frames_dropped: u64,
    /// Frames handed out by [`Endpoint::poll`].
    pub frames_out: u64,
    /// Connections that reached SYN-RECEIVED on a listening socket.
    pub connections: u64,
    /// Connections reset at once: their host held its most connections.
    pub refused_per_address: u64,
    /// Connections reset because their host took nothing for the write
    /// timeout.
    pub write_timeouts: u64,
    /// Connections dropped with their TCP handshake not done: the oldest
    /// ones when more than [`EndpointConfig::max_handshakes`] were
    /// pending, and those pending for [`SYN_TIMEOUT`].
    pub handshakes_reset: u64,
    /// SYNs to a listening port that found no listening socket, answered
    /// with a reset: the endpoint's caps or budget, or the shared
    /// [`BufferPool`], were full.
    pub refused_no_room: u64,
}

/// A listening port.
#[derive(Debug)]
struct Port {
    port: u16,
    target: Target,
    /// Sockets in LISTEN.
    listening: Vec<SocketHandle>,
}

/// A socket whose connection is over, finishing its FIN exchange.
#[derive(Debug)]
struct Closing {
    handle: SocketHandle,
    until: Instant,
}

/// One storage endpoint.
pub struct Endpoint {
    config: EndpointConfig,
    iface: Interface,
    sockets: SocketSet<'static>,
    ports: Vec<Port>,
    sessions: Vec<Session>,
    closing: Vec<Closing>,
    pending: Pending,
    scratch: Vec<u8>,
    /// The instant smoltcp's clock counts from.
    epoch: Instant,
    last_tick: Instant,
    /// A frame arrived since the last poll.
    received: bool,
    stats: EndpointStats,
    /// Its share of the service's socket buffer memory, if it has one.
    share: Option<Share>,
    /// Where DH-HMAC-CHAP's Diffie-Hellman work runs, if not inline.
    dh: Option<DhLink>,
    /// Completions of block requests on asynchronous backends (a
    /// namespace on a storage cluster), by session number: they come
    /// from the backend's threads.
    io_tx: std::sync::mpsc::Sender<(u64, BlockCompletion)>,
    io_rx: std::sync::mpsc::Receiver<(u64, BlockCompletion)>,
    /// The next session's number.
    next_session: u64,
    /// When each kind of TLS refusal was last logged, and how many since.
    logged: Vec<(&'static str, Option<Instant>, u64)>,
}

/// A TLS handshake's step done on the pool: its session, the handshake
/// and what the step said.
type Stepped = (u64, Box<Handshake<Detached>>, Result<Step, HandshakeError>);

/// A [`DhPool`] and the way its results come back: (session, command ID,
/// result), taken at the next poll; and the TLS handshakes' steps.
struct DhLink {
    pool: std::sync::Arc<DhPool>,
    tx: std::sync::mpsc::Sender<(u64, u16, DhResult)>,
    rx: std::sync::mpsc::Receiver<(u64, u16, DhResult)>,
    tls_tx: std::sync::mpsc::Sender<Stepped>,
    tls_rx: std::sync::mpsc::Receiver<Stepped>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("config", &self.config)
            .field("ports", &self.ports)
            .field("sessions", &self.sessions.len())
            .field("closing", &self.closing.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// An endpoint listening on no port yet.
    ///
    /// # Errors
    /// The configuration is invalid, or the OS gave no random seed.
    pub fn new(config: EndpointConfig, now: Instant) -> Result<Self, EndpointError> {
        config.validate()?;
        let mut seed = [0u8; 8];
        getrandom::getrandom(&mut seed).map_err(EndpointError::Random)?;
        let mut ic = Config::new(HardwareAddress::Ethernet(EthernetAddress(config.mac)));
        ic.random_seed = u64::from_le_bytes(seed);
        let mut pending = Pending::default();
        let mut dev = FrameDevice::<fn(&[u8])> {
            rx: None,
            sink: Sink::Queue(&mut pending),
            frame_mtu: config.mtu + ETHERNET_HEADER,
            sent: 0,
        };
        let mut iface = Interface::new(ic, &mut dev, SmolInstant::ZERO);
        iface.update_ip_addrs(|a| {
            // One address on a fresh interface always fits.
            let _ = a.push(IpCidr::new(
                IpAddress::from(config.address),
                config.prefix_len,
            ));
        });
        let (io_tx, io_rx) = std::sync::mpsc::channel();
        Ok(Self {
            scratch: Vec::with_capacity(config.mtu + ETHERNET_HEADER),
            config,
            iface,
            sockets: SocketSet::new(Vec::new()),
            ports: Vec::new(),
            sessions: Vec::new(),
            closing: Vec::new(),
            pending,
            epoch: now,
            last_tick: now,
            received: false,
            stats: EndpointStats::default(),
            share: None,
            dh: None,
            io_tx,
            io_rx,
            next_session: 0,
            logged: Vec::new(),
        })
    }

    /// Runs the Diffie-Hellman work of its connections' authentications
    /// on `pool` instead of the calling thread: a host that starts
    /// authentications over and over (ffdhe8192 costs tens of
    /// milliseconds each) then holds up no other connection, endpoint or
    /// tenant served by that thread. A job the pool's full queue refuses
    /// fails its authentication at once, counted `busy`. The steps of
    /// the TLS handshakes (their key exchange) run there too, behind the
    /// same bound: one the full queue does not take waits for the next
    /// poll, within the handshake timeout.
    pub fn set_dh_pool(&mut self, pool: std::sync::Arc<DhPool>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let (tls_tx, tls_rx) = std::sync::mpsc::channel();
        self.dh = Some(DhLink {
            pool,
            tx,
            rx,
            tls_tx,
            tls_rx,
        });
        for s in &mut self.sessions {
            s.conn.set_dh_offload(true);
        }
    }

    /// [`Endpoint::new`], its sockets' buffers also taken from `pool`,
    /// with a reserve there of its listening sockets and
    /// [`RESERVED_CONNECTIONS`] connections.
    ///
    /// # Errors
    /// As [`Endpoint::new`].
    pub fn with_pool(
        config: EndpointConfig,
        now: Instant,
        pool: &std::sync::Arc<BufferPool>,
    ) -> Result<Self, EndpointError> {
        let reserve = (config.backlog + RESERVED_CONNECTIONS) * config.per_connection();
        let mut ep = Self::new(config, now)?;
        ep.share = Some(pool.share(reserve));
        Ok(ep)
    }

    /// The configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.config
    }

    /// What the endpoint counted so far.
    pub fn stats(&self) -> EndpointStats {
        self.stats
    }

    /// Bytes the connections' TLS sessions hold in buffers of their own
    /// (beside the sockets' and OpenSSL's): at most about a send buffer
    /// and a read's worth each while busy, none once quiet.
    pub fn tls_buffer_bytes(&self) -> usize {
        self.sessions.iter().map(Session::tls_buffer_bytes).sum()
    }

    /// Connections open: handshaking, connected or closing.
    pub fn open_connections(&self) -> usize {
        self.sessions.len() + self.closing.len()
    }

    /// Socket buffer bytes held now (listening, connected and closing
    /// sockets): at most [`EndpointConfig::buffer_budget`].
    pub fn buffer_bytes(&self) -> usize {
        self.sockets.iter().count() * self.config.per_connection()
    }

    /// Listens on `port` for NVMe/TCP, its connections served by
    /// `target` (I/O subsystems exported there, and the discovery
    /// service). Sockets are armed at the next poll.
    ///
    /// # Errors
    /// Port 0, or a port that already listens.
    pub fn listen(&mut self, port: u16, target: Target) -> Result<(), EndpointError> {
        if port == 0 {
            return Err(EndpointError::PortZero);
        }
        if self.ports.iter().any(|p| p.port == port) {
            return Err(EndpointError::PortInUse(port));
        }
        self.ports.push(Port {
            port,
            target,
            listening: Vec::new(),
        });
        Ok(())
    }

    /// Stops listening on `port`; its open connections go on. Returns
    /// whether it listened.
    pub fn unlisten(&mut self, port: u16) -> bool {
        let Some(i) = self.ports.iter().position(|p| p.port == port) else {
            return false;
        };
        let p = self.ports.swap_remove(i);
        for h in p.listening {
            self.sockets.remove(h);
        }
        true
    }

    /// Ends every connection (resetting its socket at the next poll) and
    /// stops listening: the endpoint is being removed.
    pub fn shutdown(&mut self) {
        for p in std::mem::take(&mut self.ports) {
            for h in p.listening {
                self.sockets.remove(h);
            }
        }
        for mut s in std::mem::take(&mut self.sessions) {
            s.conn.close("endpoint removed");
            self.sockets.get_mut::<tcp::Socket>(s.handle).abort();
            self.closing.push(Closing {
                handle: s.handle,
                until: self.epoch,
            });
        }
    }

    /// `now` on smoltcp's clock, which counts from the endpoint's creation.
    fn smol(&self, now: Instant) -> SmolInstant {
        let us = now.saturating_duration_since(self.epoch).as_micros();
        SmolInstant::from_micros(i64::try_from(us).unwrap_or(i64::MAX))
    }

    /// Handles one frame the switch delivered: its own frames are
    /// processed at once (without copying), replies wait for the next
    /// [`Endpoint::poll`]. Frames not for this endpoint (another MAC or
    /// IP address, bad checksums, truncated) are ignored.
    pub fn receive(&mut self, frame: &[u8], now: Instant) {
        self.stats.frames_in += 1;
        self.received = true;
        if self.pending.is_full() {
            self.stats.frames_dropped += 1;
            return;
        }
        if let Some(port) = syn_to(frame, self.config.address) {
            // Each SYN finds a listening socket while the caps allow one:
            // take those that got theirs (dropping the oldest handshakes
            // past the cap) and arm more, so a burst of SYNs between two
            // polls is not answered with resets.
            if let Some(i) = self.ports.iter().position(|p| p.port == port) {
                self.accept(now);
                self.arm();
                let sockets = &self.sockets;
                let p = &self.ports[i];
                if !p
                    .listening
                    .iter()
                    .any(|&h| sockets.get::<tcp::Socket>(h).state() == State::Listen)
                {
                    self.stats.refused_no_room += 1;
                    p.target
                        .stats()
                        .connections_over_limit
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        let t = self.smol(now);
        let mut dev = FrameDevice::<fn(&[u8])> {
            rx: Some(frame),
            sink: Sink::Queue(&mut self.pending),
            frame_mtu: self.config.mtu + ETHERNET_HEADER,
            sent: 0,
        };
        self.iface
            .poll_ingress_single(t, &mut dev, &mut self.sockets);
    }

    /// Serves the connections (accepts new ones, moves their bytes, runs
    /// their block requests, enforces their timers) and hands every frame
    /// to send to `emit`, in order.
    pub fn poll(&mut self, now: Instant, emit: &mut impl FnMut(&[u8])) {
        self.received = false;
        self.stats.frames_out += self.pending.flush(emit);
        self.accept(now);
        if now.saturating_duration_since(self.last_tick) >= TICK {
            self.last_tick = now;
            self.tick(now);
        }
        self.collect_dh(now);
        self.collect_tls();
        self.collect_io();
        self.serve(now);
        self.hand_out_dh(now);
        self.hand_out_tls();
        self.egress(now, emit);
        self.reap(now);
        self.arm();
        self.settle();
    }

    /// Gives back to the shared pool what freed sockets held.
    fn settle(&mut self) {
        if let Some(share) = &mut self.share {
            share.shrink_to(self.sockets.iter().count() * self.config.per_connection());
        }
    }

    /// When to call [`Endpoint::poll`] next at the latest: `now` when there
    /// is work already (frames received since the last poll, replies
    /// waiting, block requests left to run), else the next timer of the
    /// stack or the connections.
    pub fn poll_at(&mut self, now: Instant) -> Instant {
        if self.received
            || !self.pending.is_empty()
            || self
                .sessions
                .iter()
                .any(|s| (s.conn.has_requests() || s.has_input()) && !s.conn.held_back())
        {
            return now;
        }
        let mut at = if self.sessions.is_empty() && self.closing.is_empty() {
            now + Duration::from_secs(3600)
        } else {
            self.last_tick + TICK
        };
        if let Some(c) = self.closing.iter().map(|c| c.until).min() {
            at = at.min(c);
        }
        // Block requests a QoS limit holds back start when it says.
        if let Some(t) = self
            .sessions
            .iter()
            .filter_map(|s| s.conn.throttled_until())
            .min()
        {
            at = at.min(t);
        }
        if self
            .sessions
            .iter()
            .any(|s| s.conn.awaits_dh() || s.conn.awaits_io() || s.stepping() || s.wants_step())
        {
            // A DH result, a TLS handshake's step, or the completion of
            // I/O on a storage cluster, may come back at any moment.
            at = at.min(now + DH_POLL);
        }
        let t = self.smol(now);
        if let Some(s) = self.iface.poll_at(t, &self.sockets) {
            let us = u64::try_from(s.total_micros()).unwrap_or(0);
            at = at.min(self.epoch + Duration::from_micros(us));
        }
        at
    }

    fn egress(&mut self, now: Instant, emit: &mut impl FnMut(&[u8])) {
        let t = self.smol(now);
        let mut dev = FrameDevice {
            rx: None,
            sink: Sink::Emit {
                scratch: &mut self.scratch,
                emit,
            },
            frame_mtu: self.config.mtu + ETHERNET_HEADER,
            sent: 0,
        };
        // Each pass sends at most one segment per socket.
        while dev.sent < EGRESS_BURST
            && self.iface.poll_egress(t, &mut dev, &mut self.sockets)
                == PollResult::SocketStateChanged
        {}
        self.stats.frames_out += dev.sent;
    }

    /// Takes the listening sockets that got a SYN as connections.
    fn accept(&mut self, now: Instant) {
        let addr = self.config.address;
        for p in &mut self.ports {
            let mut i = 0;
            while i < p.listening.len() {
                let h = p.listening[i];
                let sock = self.sockets.get_mut::<tcp::Socket>(h);
                if sock.state() == State::Listen {
                    i += 1;
                    continue;
                }
                p.listening.swap_remove(i);
                let Some(remote) = sock.remote_endpoint() else {
                    self.sockets.remove(h);
                    continue;
                };
                let peer = SocketAddr::new(IpAddr::from(remote.addr), remote.port);
                self.stats.connections += 1;
                let from = self
                    .sessions
                    .iter()
                    .filter(|s| s.peer.ip() == peer.ip())
                    .count();
                if from >= self.config.max_connections_per_address {
                    self.stats.refused_per_address += 1;
                    p.target
                        .stats()
                        .connections_over_address_limit
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(%peer, max = self.config.max_connections_per_address, "NVMe/TCP connection to a storage endpoint refused: the address holds its most connections");
                    sock.abort();
                    self.closing.push(Closing {
                        handle: h,
                        until: now + CLOSE_LINGER,
                    });
                    continue;
                }
                let local = SocketAddr::new(addr, p.port);
                tracing::debug!(%peer, %local, "NVMe/TCP connection to a storage endpoint");
                let channel = match p.target.secure_channel(local) {
                    SecureChannel::None => Channel::Clear,
                    SecureChannel::Allowed => Channel::Sniff { required: false },
                    SecureChannel::Required => Channel::Sniff { required: true },
                };
                let mut conn = Connection::new(p.target.clone(), local, peer);
                conn.set_dh_offload(self.dh.is_some());
                self.next_session += 1;
                let (tx, id) = (self.io_tx.clone(), self.next_session);
                conn.set_completer(Some(Completer::new(move |c| {
                    // The endpoint may be gone: nothing to tell then.
                    let _ = tx.send((id, c));
                })));
                self.sessions.push(Session::new(
                    h,
                    peer,
                    conn,
                    p.target.clone(),
                    now,
                    self.next_session,
                    channel,
                ));
            }
        }
        self.bound_handshakes();
    }

    /// Resets the oldest connections still in SYN-RECEIVED until at most
    /// [`EndpointConfig::max_handshakes`] are.
    fn bound_handshakes(&mut self) {
        let sockets = &mut self.sockets;
        let mut pending: Vec<(Instant, usize)> = self
            .sessions
            .iter()
            .enumerate()
            .filter(|(_, s)| sockets.get::<tcp::Socket>(s.handle).state() == State::SynReceived)
            .map(|(i, s)| (s.opened, i))
            .collect();
        let Some(over) = pending.len().checked_sub(self.config.max_handshakes) else {
            return;
        };
        if over == 0 {
            return;
        }
        pending.sort_unstable();
        let mut oldest: Vec<usize> = pending[..over].iter().map(|&(_, i)| i).collect();
        self.drop_handshakes(&mut oldest);
        tracing::warn!(
            reset = over,
            max = self.config.max_handshakes,
            "storage endpoint {}: TCP handshakes past the cap; the oldest were dropped",
            self.config.address
        );
    }

    /// Drops the sessions at `which`, whose handshakes are not done, and
    /// frees their sockets at once: a forged peer gets nothing, and a real
    /// one that answers later finds no connection and is reset by the
    /// stack.
    fn drop_handshakes(&mut self, which: &mut [usize]) {
        // Highest first, so swap_remove leaves the others in place.
        which.sort_unstable_by(|a, b| b.cmp(a));
        for &i in which.iter() {
            let mut s = self.sessions.swap_remove(i);
            s.conn.close("TCP handshake not completed");
            s.target
                .stats()
                .handshake_timeouts
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.sockets.remove(s.handle);
            self.stats.handshakes_reset += 1;
        }
    }

    /// Arms listening sockets up to the backlog, within the caps.
    fn arm(&mut self) {
        self.settle();
        let c = &self.config;
        let per = c.per_connection();
        let ip = IpAddress::from(c.address);
        for i in 0..self.ports.len() {
            while self.ports[i].listening.len() < c.backlog {
                let sockets = self.sockets.iter().count();
                let open = sockets; // listening, connected and closing alike
                if open >= c.max_connections || (sockets + 1) * per > c.buffer_budget {
                    return;
                }
                if let Some(share) = &mut self.share {
                    if !share.grow(per) {
                        return;
                    }
                }
                let mut s = tcp::Socket::new(
                    tcp::SocketBuffer::new(vec![0u8; c.rx_buffer]),
                    tcp::SocketBuffer::new(vec![0u8; c.tx_buffer]),
                );
                s.set_nagle_enabled(false);
                s.set_ack_delay(None);
                s.set_congestion_control(CongestionControl::Reno);
                // A host that acknowledges nothing at all (gone) is reset
                // by the stack after twice the write timeout; one that
                // acknowledges but takes nothing, by the write timeout.
                s.set_timeout(Some(smoltcp::time::Duration::from_micros(
                    u64::try_from(c.write_timeout.as_micros().saturating_mul(2))
                        .unwrap_or(u64::MAX),
                )));
                let port = self.ports[i].port;
                if s.listen(IpListenEndpoint {
                    addr: Some(ip),
                    port,
                })
                .is_err()
                {
                    return;
                }
                let h = self.sockets.add(s);
                self.ports[i].listening.push(h);
            }
        }
    }

    /// Pumps every connection; hands over those that ended.
    fn serve(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.sessions.len() {
            let s = &mut self.sessions[i];
            let sock = self.sockets.get_mut::<tcp::Socket>(s.handle);
            let fate = s.pump(sock, now);
            if let Some((kind, what)) = s.refusal.take() {
                let peer = s.peer;
                self.log(kind, peer, &what, now);
            }
            match fate {
                Fate::Open => i += 1,
                Fate::Close => {
                    let s = self.sessions.swap_remove(i);
                    tracing::debug!(peer = %s.peer, reason = s.conn.close_reason().unwrap_or(""), "NVMe/TCP connection closed");
                    self.sockets.get_mut::<tcp::Socket>(s.handle).close();
                    self.closing.push(Closing {
                        handle: s.handle,
                        until: now + CLOSE_LINGER,
                    });
                }
                Fate::Gone => {
                    let s = self.sessions.swap_remove(i);
                    tracing::debug!(peer = %s.peer, "NVMe/TCP connection reset by the host");
                    self.sockets.remove(s.handle);
                }
            }
        }
    }

    /// Gives the TLS handshakes' steps that came back to their
    /// connections.
    fn collect_tls(&mut self) {
        let Some(dh) = &self.dh else {
            return;
        };
        while let Ok((id, h, r)) = dh.tls_rx.try_recv() {
            if let Some(s) = self.sessions.iter_mut().find(|s| s.id == id) {
                s.stepped(h, r);
            }
        }
    }

    /// Runs the steps the handshakes need: on the pool when there is
    /// one, else here. A step the pool's full queue does not take waits
    /// for the next poll (within [`DH_POLL`]); the handshake timeout
    /// bounds how long.
    fn hand_out_tls(&mut self) {
        for s in &mut self.sessions {
            let Some(mut h) = s.take_step() else {
                continue;
            };
            let Some(dh) = &self.dh else {
                let r = h.step();
                s.stepped(h, r);
                self.received = true;
                continue;
            };
            let (tx, id) = (dh.tls_tx.clone(), s.id);
            // Kept here too, so that a refused step's handshake comes back.
            let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(h)));
            let theirs = slot.clone();
            let work = move || {
                let Some(mut h) = theirs.lock().ok().and_then(|mut h| h.take()) else {
                    return;
                };
                let r = h.step();
                // The endpoint may be gone: nothing to tell then.
                let _ = tx.send((id, h, r));
            };
            if dh
                .pool
                .run_for(std::sync::Arc::downgrade(&s.alive), work)
                .is_err()
            {
                if let Some(h) = slot.lock().ok().and_then(|mut h| h.take()) {
                    s.step_later(h);
                }
            }
        }
    }

    /// Logs a refusal of the secure channel of `kind`, at most once per
    /// [`LOG_EVERY`], with the count since the last line.
    fn log(&mut self, kind: &'static str, peer: SocketAddr, what: &str, now: Instant) {
        let i = match self.logged.iter().position(|(k, ..)| *k == kind) {
            Some(i) => i,
            None => {
                self.logged.push((kind, None, 0));
                self.logged.len() - 1
            }
        };
        let (_, last, since) = &mut self.logged[i];
        *since += 1;
        if last.is_none_or(|t| now.saturating_duration_since(t) >= LOG_EVERY) {
            tracing::warn!(%peer, endpoint = %self.config.address, since_last = *since, "{what}");
            (*last, *since) = (Some(now), 0);
        }
    }

    /// Hands the completions of block requests on asynchronous backends
    /// to their connections (those still open).
    fn collect_io(&mut self) {
        while let Ok((id, c)) = self.io_rx.try_recv() {
            if let Some(s) = self.sessions.iter_mut().find(|s| s.id == id) {
                s.conn.complete(c);
            }
        }
    }

    fn collect_dh(&mut self, now: Instant) {
        let Some(dh) = &self.dh else {
            return;
        };
        while let Ok((id, cid, result)) = dh.rx.try_recv() {
            if let Some(s) = self.sessions.iter_mut().find(|s| s.id == id) {
                s.conn.complete_dh(cid, result, now);
            }
        }
    }

    /// Hands the connections' DH jobs to the pool. A job its full queue
    /// refuses completes as busy at once, and the next poll is asked for
    /// at once to send the answer.
    fn hand_out_dh(&mut self, now: Instant) {
        let Some(dh) = &self.dh else {
            return;
        };
        for s in &mut self.sessions {
            while let Some((cid, job)) = s.conn.next_dh_job() {
                let (tx, id) = (dh.tx.clone(), s.id);
                let done = move |r| {
                    // The endpoint may be gone: nothing to tell then.
                    let _ = tx.send((id, cid, r));
                };
                if dh
                    .pool
                    .submit_for(std::sync::Arc::downgrade(&s.alive), job, done)
                    .is_err()
                {
                    s.conn.complete_dh(cid, Err(DhError::Busy), now);
                    self.received = true;
                }
            }
        }
    }

    /// Frees the closing sockets that are done (closed with their RST,
    /// if any, sent; or in TIME-WAIT), and resets those out of time.
    fn reap(&mut self, now: Instant) {
        let sockets = &mut self.sockets;
        self.closing.retain(|c| {
            let sock = sockets.get_mut::<tcp::Socket>(c.handle);
            let done = match sock.state() {
                State::TimeWait => true,
                // No tuple left: nothing more to send.
                State::Closed => sock.remote_endpoint().is_none(),
                _ => false,
            };
            if done || now >= c.until + CLOSE_LINGER {
                sockets.remove(c.handle);
                return false;
            }
            if now >= c.until {
                // Its RST goes out with the next egress.
                sock.abort();
            }
            true
        });
    }

    /// Timers of every connection; resets those whose host took no byte
    /// for the write timeout.
    fn tick(&mut self, now: Instant) {
        let limit = self.config.write_timeout;
        let mut stale: Vec<usize> = (0..self.sessions.len())
            .filter(|&i| {
                let s = &self.sessions[i];
                now.saturating_duration_since(s.opened) >= SYN_TIMEOUT
                    && self.sockets.get::<tcp::Socket>(s.handle).state() == State::SynReceived
            })
            .collect();
        if !stale.is_empty() {
            self.drop_handshakes(&mut stale);
        }
        for s in &mut self.sessions {
            if s.securing() {
                // The connection's own timers start once its bytes flow.
                if now.saturating_duration_since(s.opened) >= TLS_HANDSHAKE_TIMEOUT
                    && !s.conn.is_closed()
                {
                    s.handshake_timed_out();
                    self.sockets.get_mut::<tcp::Socket>(s.handle).abort();
                }
                continue;
            }
            s.conn.tick(now);
            s.release_idle_buffers();
            if let Some(since) = s.stalled_since {
                if now.saturating_duration_since(since) >= limit {
                    tracing::warn!(peer = %s.peer, "the host read nothing for {limit:?}; resetting the connection");
                    self.stats.write_timeouts += 1;
                    s.target
                        .stats()
                        .write_timeouts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    s.conn.close("write timed out");
                    self.sockets.get_mut::<tcp::Socket>(s.handle).abort();
                }
            }
        }
    }
}

/// The destination port of `frame` if it is an untagged TCP SYN (without
/// ACK) to `address`: IPv4, or IPv6 with TCP as its first next header.
fn syn_to(frame: &[u8], address: IpAddr) -> Option<u16> {
    const TCP: u8 = 6;
    let ip = frame.get(ETHERNET_HEADER..)?;
    let tcp = match (frame.get(12..14)?, address) {
        ([0x08, 0x00], IpAddr::V4(a)) => {
            if ip.first()? >> 4 != 4 || *ip.get(9)? != TCP || ip.get(16..20)? != a.octets() {
                return None;
            }
            ip.get(usize::from(ip[0] & 0x0f) * 4..)?
        }
        ([0x86, 0xdd], IpAddr::V6(a)) => {
            if ip.first()? >> 4 != 6 || *ip.get(6)? != TCP || ip.get(24..40)? != a.octets() {
                return None;
            }
            ip.get(40..)?
        }
        _ => return None,
    };
    let flags = *tcp.get(13)?;
    (flags & 0x12 == 0x02).then(|| u16::from_be_bytes([tcp[2], tcp[3]]))
}

impl Drop for Endpoint {
    /// Connections dropped with the endpoint end their controllers.
    fn drop(&mut self) {
        for s in &mut self.sessions {
            s.conn.close("endpoint removed");
        }
    }
}
