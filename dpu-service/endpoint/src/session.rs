//! One TCP connection of an endpoint and the NVMe/TCP
//! [`Connection`] it drives, as the kernel transport's poll group drives
//! one over a socket.
//!
//! Input: the socket's receive buffer is offered to the connection where
//! it lies; whole PDUs are consumed there, and only the start of a PDU not
//! yet whole (it may straddle the ring's end) is copied aside, as the
//! kernel transport keeps it. While the connection is held back (its
//! output over [`OUTPUT_BUDGET`](dpu_nvmeof::conn::OUTPUT_BUDGET)) the
//! socket is not read: its window closes and the host stops sending.
//! Output: block requests run on the calling thread
//! ([`Connection::execute_requests`]); what they produce is copied into the
//! socket's send buffer as far as it has room, the rest stays in the
//! connection. A connection whose host took nothing for the write timeout
//! is reset.
//!
//! The secure channel: on a listener that speaks TLS, the host's first
//! byte tells a ClientHello from clear text (refused where TLS is
//! required). The handshake is [`Detached`]: the session feeds it what
//! the socket received and sends what it made, and its steps run where
//! the endpoint puts them ([`Session::take_step`], on the DH pool). Once
//! it is done the session opens records into the same aside buffer the
//! clear-text path keeps partial PDUs in, and seals output no faster
//! than the socket's send buffer has room for, so the session holds
//! about one send buffer of ciphertext at most.

use std::io::{self, IoSlice, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use dpu_nvmeof::dpu_tls::{Detached, Handshake, HandshakeError, Session as TlsSession, Step};
use dpu_nvmeof::{Connection, Target};
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp::{self, State};

/// Most bytes taken from the socket per read while a partial PDU is kept
/// aside: a read never copies more than this beyond the PDU.
const RX_CHUNK: usize = 64 << 10;

/// Most slices of output handed to the socket per write.
const IOV: usize = 32;

/// The first byte of a TLS handshake record (a ClientHello).
const TLS_HANDSHAKE: u8 = 0x16;

/// The secure channel of a connection.
pub(crate) enum Channel {
    /// Clear text.
    Clear,
    /// On a listener that speaks TLS, before the host's first byte.
    Sniff {
        /// Clear text is refused.
        required: bool,
    },
    /// The TLS handshake; `None` while a step of it runs elsewhere.
    Shake(Option<Box<Handshake<Detached>>>),
    /// The TLS session.
    Tls(Box<TlsSession<Detached>>),
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Clear => "Clear",
            Self::Sniff { .. } => "Sniff",
            Self::Shake(_) => "Shake",
            Self::Tls(_) => "Tls",
        })
    }
}

/// A refusal of the secure channel to log: its kind and what to say.
pub(crate) type Refusal = (&'static str, String);

fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// What became of a session after [`Session::pump`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// It goes on.
    Open,
    /// The NVMe/TCP connection is over: close the socket gracefully.
    Close,
    /// The socket is gone (reset by the host, or closed on both sides):
    /// free it.
    Gone,
}

/// One connection.
#[derive(Debug)]
pub(crate) struct Session {
    /// Its socket.
    pub(crate) handle: SocketHandle,
    /// The host's address and port.
    pub(crate) peer: SocketAddr,
    /// The NVMe/TCP connection.
    pub(crate) conn: Connection,
    /// Its target, for counters.
    pub(crate) target: Target,
    /// The start of a PDU not yet whole.
    rx: Vec<u8>,
    /// Since when output has waited for a send buffer with no room.
    pub(crate) stalled_since: Option<Instant>,
    /// When its SYN arrived.
    pub(crate) opened: Instant,
    /// Its number among the endpoint's sessions, never reused: DH results
    /// find their session by it.
    pub(crate) id: u64,
    /// Alive as long as the session: a DH job whose session is gone by its
    /// turn is dropped unrun.
    pub(crate) alive: std::sync::Arc<()>,
    /// The secure channel.
    pub(crate) channel: Channel,
    /// The handshake was fed since its last step: it needs another.
    fed: bool,
    /// A refusal for the endpoint to log.
    pub(crate) refusal: Option<Refusal>,
    /// Over TLS: plaintext opened and not yet handed on.
    plain: Vec<u8>,
}

impl Session {
    /// Session `id` on `handle` from `peer`, serving `conn` over
    /// `channel`, its SYN taken at `now`.
    pub(crate) fn new(
        handle: SocketHandle,
        peer: SocketAddr,
        conn: Connection,
        target: Target,
        now: Instant,
        id: u64,
        channel: Channel,
    ) -> Self {
        Self {
            handle,
            peer,
            conn,
            target,
            rx: Vec::new(),
            stalled_since: None,
            opened: now,
            id,
            alive: std::sync::Arc::new(()),
            channel,
            fed: false,
            refusal: None,
            plain: Vec::new(),
        }
    }

    /// True until the connection's bytes flow: the host's first byte, or
    /// its TLS handshake, are still to come.
    pub(crate) fn securing(&self) -> bool {
        matches!(self.channel, Channel::Sniff { .. } | Channel::Shake(_))
    }

    /// True while a step of the handshake runs elsewhere.
    pub(crate) fn stepping(&self) -> bool {
        matches!(self.channel, Channel::Shake(None))
    }

    /// True when TLS holds input not yet handed to the connection.
    pub(crate) fn has_input(&self) -> bool {
        match &self.channel {
            Channel::Tls(t) => t.unread() > 0 || t.buffered(),
            _ => false,
        }
    }

    /// The handshake, when it was fed since its last step: the caller
    /// runs [`Handshake::step`] and hands the result to
    /// [`Session::stepped`].
    pub(crate) fn take_step(&mut self) -> Option<Box<Handshake<Detached>>> {
        if !self.fed {
            return None;
        }
        let Channel::Shake(h) = &mut self.channel else {
            return None;
        };
        self.fed = false;
        h.take()
    }

    /// A step of the handshake ended with `r`: the session goes on with
    /// TLS, waits for more of the handshake, or closes (counted, and a
    /// refusal left to log).
    pub(crate) fn stepped(&mut self, h: Box<Handshake<Detached>>, r: Result<Step, HandshakeError>) {
        let stats = &self.target.stats().tls;
        match r {
            Ok(Step::Done) => {
                let session = h.finish();
                count(&stats.handshakes);
                if let Some(identity) = session.identity().cloned() {
                    tracing::debug!(peer = %self.peer, %identity, cipher = session.cipher(), "TLS session established on a storage endpoint");
                    self.conn.set_tls(identity);
                }
                self.channel = Channel::Tls(Box::new(session));
            }
            Ok(_) => {
                // What came meanwhile is fed at the next pump.
                self.channel = Channel::Shake(Some(h));
            }
            Err(e) => {
                let kind = match &e {
                    HandshakeError::Refused(_) | HandshakeError::UnknownKey(_) => {
                        count(&stats.refused_unknown_key);
                        "unknown_key"
                    }
                    _ => {
                        count(&stats.failed);
                        "failed"
                    }
                };
                self.refusal = Some((kind, format!("TLS handshake refused: {e}")));
                self.conn.close("TLS handshake refused");
                // Its alert, if it made one, goes out with the close.
                self.channel = Channel::Shake(Some(h));
            }
        }
    }

    /// Over TLS, with nothing waiting either way: gives back the
    /// session's buffers (the next read or write makes them again), so a
    /// quiet connection holds no more than OpenSSL's own state beside its
    /// socket's.
    pub(crate) fn release_idle_buffers(&mut self) {
        if let Channel::Tls(t) = &mut self.channel {
            if t.output().is_empty() && t.unread() == 0 && !t.buffered() {
                t.release_idle_buffers();
                if self.rx.is_empty() {
                    self.plain = Vec::new();
                }
            }
        }
    }

    /// Bytes the TLS session's own buffers hold allocated.
    pub(crate) fn tls_buffer_bytes(&self) -> usize {
        match &self.channel {
            Channel::Tls(t) => t.buffer_capacity() + self.plain.capacity(),
            _ => 0,
        }
    }

    /// The handshake's step found no room where steps run: it is taken
    /// again at the next poll.
    pub(crate) fn step_later(&mut self, h: Box<Handshake<Detached>>) {
        self.channel = Channel::Shake(Some(h));
        self.fed = true;
    }

    /// True when the handshake waits for a step to be taken.
    pub(crate) fn wants_step(&self) -> bool {
        self.fed && matches!(self.channel, Channel::Shake(Some(_)))
    }

    /// Ends a handshake past its time: counted.
    pub(crate) fn handshake_timed_out(&mut self) {
        count(&self.target.stats().tls.timeouts);
        self.refusal = Some((
            "timeout",
            "no TLS handshake within the handshake timeout; closing the connection".into(),
        ));
        self.conn.close("no TLS handshake in time");
    }

    /// Moves the secure channel on as far as the socket allows; true when
    /// the connection's bytes may flow.
    fn secure(&mut self, sock: &mut tcp::Socket<'_>) -> bool {
        if let Channel::Sniff { required } = self.channel {
            let first = match sock.peek(1) {
                Ok(b) => b.first().copied(),
                Err(_) => None,
            };
            match first {
                None => {
                    if !sock.may_recv() {
                        self.conn.close("host closed the connection");
                    }
                    return false;
                }
                Some(TLS_HANDSHAKE) => match self.target.tls_acceptor() {
                    Ok(a) => match a.start(Detached) {
                        Ok(h) => self.channel = Channel::Shake(Some(Box::new(h))),
                        Err(e) => {
                            tracing::error!(error = %e, "cannot start a TLS session");
                            self.conn.close("cannot start a TLS session");
                            return false;
                        }
                    },
                    Err(e) => {
                        tracing::error!(error = %e, "no TLS: closing the connection");
                        self.conn.close("no TLS");
                        return false;
                    }
                },
                Some(_) if required => {
                    count(&self.target.stats().tls.clear_text_refused);
                    self.refusal = Some((
                        "clear_text",
                        "a clear-text connection on a listener that requires TLS; closing it"
                            .into(),
                    ));
                    self.conn
                        .close("clear text on a listener that requires TLS");
                    return false;
                }
                Some(_) => self.channel = Channel::Clear,
            }
        }
        match &mut self.channel {
            Channel::Clear => true,
            Channel::Tls(t) => {
                let n = send_ciphertext(sock, t.output());
                t.sent(n);
                true
            }
            Channel::Sniff { .. } | Channel::Shake(None) => false,
            Channel::Shake(Some(h)) => {
                let n = send_ciphertext(sock, h.output());
                h.sent(n);
                let mut fed = false;
                while sock.can_recv() {
                    match sock.recv(|buf| {
                        h.feed(buf);
                        (buf.len(), buf.len())
                    }) {
                        Ok(n) if n > 0 => fed = true,
                        _ => break,
                    }
                }
                self.fed |= fed;
                if !fed && !sock.may_recv() {
                    self.conn
                        .close("host closed the connection during the TLS handshake");
                }
                false
            }
        }
    }

    /// Moves bytes between the socket and the connection and runs the
    /// block requests waiting, until no byte moves either way.
    pub(crate) fn pump(&mut self, sock: &mut tcp::Socket<'_>, now: Instant) -> Fate {
        match sock.state() {
            State::TimeWait => {
                self.conn.close("host closed the connection");
                return Fate::Gone;
            }
            State::Closed if sock.remote_endpoint().is_some() => {
                // Aborted here (write timeout): its RST is still to go.
                self.conn.close("connection reset");
                return Fate::Close;
            }
            State::Closed => {
                self.conn.close("the host reset the connection");
                return Fate::Gone;
            }
            State::Listen | State::SynSent | State::SynReceived => return Fate::Open,
            _ => {}
        }
        if !self.secure(sock) {
            return if self.conn.is_closed() {
                Fate::Close
            } else {
                Fate::Open
            };
        }
        loop {
            let mut moved = self.write(sock, now);
            moved |= self.read(sock, now);
            let Self {
                conn,
                stalled_since,
                channel,
                ..
            } = self;
            // Requests that ran are no reason for another round by
            // themselves: the rest of a long Write Zeroes runs one chunk
            // per poll, as in the kernel transport.
            conn.execute_requests(|c| {
                moved |= match channel {
                    Channel::Tls(t) => write_sealed(sock, c, t, stalled_since, now),
                    _ => write_out(sock, c, stalled_since, now),
                };
            });
            moved |= self.write(sock, now);
            if !moved || self.conn.is_closed() {
                break;
            }
        }
        if !self.conn.is_closed()
            && !sock.may_recv()
            && self.rx.is_empty()
            && !sock.can_recv()
            && !self.has_input()
        {
            // The host sent its FIN: nothing more will come.
            self.conn.close("host closed the connection");
        }
        if self.conn.is_closed() {
            self.write(sock, now);
            if let Channel::Tls(t) = &mut self.channel {
                t.shutdown();
                let n = send_ciphertext(sock, t.output());
                t.sent(n);
            }
            self.plain = Vec::new();
            return Fate::Close;
        }
        Fate::Open
    }

    /// Writes output into the socket; true if it took any.
    fn write(&mut self, sock: &mut tcp::Socket<'_>, now: Instant) -> bool {
        let Self {
            conn,
            stalled_since,
            channel,
            ..
        } = self;
        match channel {
            Channel::Tls(t) => write_sealed(sock, conn, t, stalled_since, now),
            _ => write_out(sock, conn, stalled_since, now),
        }
    }

    /// Offers the socket's bytes to the connection; true if any were
    /// taken from the socket.
    fn read(&mut self, sock: &mut tcp::Socket<'_>, now: Instant) -> bool {
        if matches!(self.channel, Channel::Tls(_)) {
            return self.read_sealed(sock, now);
        }
        let mut moved = false;
        while !self.conn.held_back() && !self.conn.is_closed() && sock.can_recv() {
            let Self { conn, rx, .. } = self;
            let took = if rx.is_empty() {
                sock.recv(|buf| {
                    let used = conn.receive(buf, now);
                    if used < buf.len() && !conn.held_back() && !conn.is_closed() {
                        // A partial PDU: aside, so the next bytes (maybe
                        // at the ring's start) can join it.
                        rx.extend_from_slice(&buf[used..]);
                        (buf.len(), buf.len())
                    } else if conn.is_closed() {
                        (buf.len(), buf.len())
                    } else {
                        (used, used)
                    }
                })
            } else {
                sock.recv(|buf| {
                    let n = buf.len().min(RX_CHUNK);
                    rx.extend_from_slice(&buf[..n]);
                    (n, n)
                })
                .inspect(|_| {
                    let used = conn.receive(rx, now);
                    rx.drain(..used);
                })
            };
            match took {
                Ok(0) | Err(_) => break,
                Ok(_) => moved = true,
            }
        }
        if self.conn.is_closed() {
            self.rx = Vec::new();
        } else if !self.rx.is_empty() && !self.conn.held_back() {
            // Bytes kept aside may hold whole PDUs once output drained.
            let used = self.conn.receive(&self.rx, now);
            self.rx.drain(..used);
        }
        moved
    }
}

impl Session {
    /// As [`Session::read`], through the TLS session: ciphertext is fed
    /// while little of it waits unopened, records are opened into
    /// [`Session::plain`] and whole PDUs handed to the connection, the
    /// start of one not yet whole kept aside.
    fn read_sealed(&mut self, sock: &mut tcp::Socket<'_>, now: Instant) -> bool {
        let Self {
            conn,
            rx,
            plain,
            channel,
            ..
        } = self;
        let Channel::Tls(t) = channel else {
            return false;
        };
        if plain.is_empty() {
            *plain = vec![0; PLAIN_CHUNK];
        }
        let mut moved = false;
        while !conn.held_back() && !conn.is_closed() {
            let mut progress = false;
            if t.unread() < RX_CHUNK && sock.can_recv() {
                if let Ok(n) = sock.recv(|buf| {
                    let n = buf.len().min(RX_CHUNK);
                    t.feed(&buf[..n]);
                    (n, n)
                }) {
                    moved |= n > 0;
                    progress |= n > 0;
                }
            }
            let n = match t.read_available(plain) {
                Ok(0) => {
                    conn.close("host closed the TLS session");
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) => {
                    conn.close(&format!("TLS: {e}"));
                    break;
                }
            };
            progress |= n > 0;
            if rx.is_empty() {
                let used = conn.receive(&plain[..n], now);
                rx.extend_from_slice(&plain[used..n]);
            } else {
                rx.extend_from_slice(&plain[..n]);
                let used = conn.receive(rx, now);
                rx.drain(..used);
            }
            if !progress {
                break;
            }
        }
        if conn.is_closed() {
            *rx = Vec::new();
        }
        moved
    }
}

/// Bytes of one opening of records (at least one whole record's).
const PLAIN_CHUNK: usize = 32 << 10;

/// Bytes a TLS 1.3 record adds to its plaintext: header, content type
/// and AEAD tag.
const RECORD_OVERHEAD: usize = 5 + 1 + 16;

/// Sends as much of `out` (ciphertext) as the socket takes; how much.
fn send_ciphertext(sock: &mut tcp::Socket<'_>, out: &[u8]) -> usize {
    if out.is_empty() {
        return 0;
    }
    sock.send_slice(out).unwrap_or(0)
}

/// As [`write_out`], sealing the output into records first: no more than
/// the socket's send buffer has room for, so that the session holds
/// little ciphertext the socket did not take.
fn write_sealed(
    sock: &mut tcp::Socket<'_>,
    conn: &mut Connection,
    t: &mut TlsSession<Detached>,
    stalled_since: &mut Option<Instant>,
    now: Instant,
) -> bool {
    let mut moved = false;
    loop {
        let sent = send_ciphertext(sock, t.output());
        t.sent(sent);
        if sent > 0 {
            moved = true;
            *stalled_since = None;
        }
        if !t.output().is_empty() {
            stalled_since.get_or_insert(now);
            return moved;
        }
        let room = sock.send_capacity().saturating_sub(sock.send_queue());
        let mut budget =
            room.saturating_sub(RECORD_OVERHEAD * (room / dpu_nvmeof::dpu_tls::RECORD + 1));
        let taken = {
            let mut iov = [IoSlice::new(&[]); IOV];
            let n = conn.output_slices(&mut iov);
            if n == 0 {
                *stalled_since = None;
                return moved;
            }
            if budget == 0 {
                stalled_since.get_or_insert(now);
                return moved;
            }
            let mut cut = [IoSlice::new(&[]); IOV];
            let mut k = 0;
            while k < n && budget > 0 {
                let len = iov[k].len().min(budget);
                cut[k] = IoSlice::new(&iov[k][..len]);
                budget -= len;
                k += 1;
            }
            t.write_vectored(&cut[..k])
        };
        match taken {
            Ok(0) => return moved,
            Ok(n) => {
                conn.output_sent(n);
                moved = true;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return moved,
            Err(e) => {
                conn.close(&format!("TLS: {e}"));
                return moved;
            }
        }
    }
}

/// Copies what `conn` has to send into the socket's send buffer as far as
/// it has room; true if it took any. Output that finds no room starts (or
/// continues) the stall; any progress ends it.
fn write_out(
    sock: &mut tcp::Socket<'_>,
    conn: &mut Connection,
    stalled_since: &mut Option<Instant>,
    now: Instant,
) -> bool {
    let mut moved = false;
    loop {
        let mut iov = [IoSlice::new(&[]); IOV];
        let n = conn.output_slices(&mut iov);
        if n == 0 {
            *stalled_since = None;
            return moved;
        }
        let mut took = 0;
        let mut full = false;
        for s in &iov[..n] {
            match sock.send_slice(s) {
                Ok(k) => {
                    took += k;
                    if k < s.len() {
                        full = true;
                        break;
                    }
                }
                Err(_) => {
                    full = true;
                    break;
                }
            }
        }
        if took > 0 {
            conn.output_sent(took);
            *stalled_since = None;
            moved = true;
        }
        if full || took == 0 {
            if conn.has_output() && took == 0 {
                stalled_since.get_or_insert(now);
            }
            return moved;
        }
    }
}
