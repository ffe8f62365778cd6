//! TLS 1.3 with external pre-shared keys, the secure channel of NVMe/TCP
//! (NVMe TP 8011), over OpenSSL.
//!
//! - [`psk`]: the configured PSK's interchange format and what a host and
//!   a subsystem derive from it: the retained PSK, the PSK identity and
//!   the TLS PSK.
//! - [`Acceptor`]: the subsystem's side. A host's ClientHello names an
//!   identity (`NVMe0R01 <hostnqn> <subnqn>`); the acceptor asks its
//!   [`KeyLookup`] for that host's configured PSK on that subsystem,
//!   derives the TLS PSK and offers it with the cipher suite of its hash
//!   (`TLS_AES_128_GCM_SHA256` or `TLS_AES_256_GCM_SHA384`). TLS 1.3 only,
//!   no certificates, no session tickets, no early data (the
//!   specification forbids 0-RTT).
//! - [`Connector`]: the host's side, for the traffic generator and tests.
//! - [`Session`]: an established session on a socket, blocking or not,
//!   whose writes are gathered into records of up to [`RECORD`] bytes.
//! - [`Detached`]: sessions and handshakes whose caller moves the
//!   ciphertext itself, for a TCP/IP stack of its own (a storage endpoint
//!   on smoltcp): it [feeds](Session::feed) what it received and sends
//!   what [`Session::output`] holds.
//!
//! OpenSSL's TLS 1.3 external-PSK callbacks (`SSL_CTX_set_psk_find_session_callback`
//! and its client twin) have no safe binding; they live in `ffi`, the one
//! module with `unsafe` code.

mod ffi;
pub mod psk;

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use openssl::error::ErrorStack;
use openssl::ssl::{
    ErrorCode, Ssl, SslContext, SslContextBuilder, SslMethod, SslMode, SslOptions, SslStream,
    SslVersion,
};

pub use psk::{ConfiguredPsk, Derivation, Identity, PskError, PskHash, TlsPsk};

/// Most plaintext bytes a write gathers into one record (TLS's largest).
pub const RECORD: usize = 16 * 1024;

/// Longest a host's handshake ([`Connector::connect`]) waits for one read
/// or write of its socket.
pub const HANDSHAKE_STEP: std::time::Duration = std::time::Duration::from_secs(10);

/// Finds the configured PSK of host `hostnqn` (second argument) on
/// subsystem `subnqn` (first), if it has one.
pub type KeyLookup = dyn Fn(&str, &str) -> Option<ConfiguredPsk> + Send + Sync;

/// Why a handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The host named no key this side has: its identity was NVMe's, for
    /// a host and subsystem without one.
    #[error("{0}")]
    UnknownKey(String),
    /// The host offered an identity this side cannot use: not NVMe's, or
    /// not made by the key of its host (another hash, another digest).
    #[error("{0}")]
    Refused(String),
    /// TLS failed (wrong key, protocol error, the peer closed).
    #[error("TLS handshake failed: {0}")]
    Tls(String),
    /// The socket failed.
    #[error("TLS handshake: {0}")]
    Io(#[from] io::Error),
}

impl HandshakeError {
    /// A short reason for counters and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UnknownKey(_) => "unknown_key",
            Self::Refused(_) => "bad_identity",
            Self::Tls(_) => "handshake_failed",
            Self::Io(_) => "io",
        }
    }
}

fn tls13(builder: &mut SslContextBuilder) -> Result<(), ErrorStack> {
    builder.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    builder.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    builder.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384")?;
    builder.set_options(SslOptions::NO_TICKET);
    builder.set_num_tickets(0)?;
    builder.set_mode(SslMode::ACCEPT_MOVING_WRITE_BUFFER | SslMode::ENABLE_PARTIAL_WRITE);
    Ok(())
}

/// The subsystem's side: accepts hosts whose identity names a key its
/// lookup knows.
#[derive(Clone)]
pub struct Acceptor {
    ctx: SslContext,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor").finish_non_exhaustive()
    }
}

impl Acceptor {
    /// An acceptor that finds keys with `lookup`.
    ///
    /// # Errors
    /// OpenSSL could not make the context (it lacks TLS 1.3 or the
    /// cipher suites).
    pub fn new(lookup: Arc<KeyLookup>) -> Result<Self, ErrorStack> {
        let mut b = SslContextBuilder::new(SslMethod::tls_server())?;
        tls13(&mut b)?;
        ffi::serve_psks(&mut b, lookup)?;
        Ok(Self { ctx: b.build() })
    }

    /// Starts the handshake of a host on `stream` (a socket, blocking or
    /// not, or [`Detached`]); [`Handshake::step`] drives it.
    ///
    /// # Errors
    /// OpenSSL could not make the session.
    pub fn start<S: Transport>(&self, stream: S) -> Result<Handshake<S>, ErrorStack> {
        let ssl = Ssl::new(&self.ctx)?;
        Ok(Handshake {
            stream: SslStream::new(ssl, Wire::new(stream))?,
            server: true,
        })
    }
}

/// The host's side: presents one identity and its TLS PSK.
#[derive(Clone)]
pub struct Connector {
    ctx: SslContext,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").finish_non_exhaustive()
    }
}

impl Connector {
    /// A connector presenting `identity` with `psk`.
    ///
    /// # Errors
    /// OpenSSL could not make the context.
    pub fn new(identity: String, psk: TlsPsk) -> Result<Self, ErrorStack> {
        let mut b = SslContextBuilder::new(SslMethod::tls_client())?;
        tls13(&mut b)?;
        b.set_ciphersuites(psk.hash.cipher_suite())?;
        ffi::present_psk(&mut b, identity, psk)?;
        Ok(Self { ctx: b.build() })
    }

    /// The connector a host `hostnqn` uses with its configured `key` to
    /// reach subsystem `subnqn`, in identity `version` 0 or 1.
    ///
    /// # Errors
    /// As [`Connector::new`].
    pub fn for_key(
        key: &ConfiguredPsk,
        version: u8,
        hostnqn: &str,
        subnqn: &str,
    ) -> Result<Self, ErrorStack> {
        let (identity, psk) = key.tls_psk(version, hostnqn, subnqn);
        Self::new(identity, psk)
    }

    /// Starts the handshake on `stream` (a non-blocking socket, or
    /// [`Detached`]); [`Handshake::step`] drives it.
    ///
    /// # Errors
    /// OpenSSL could not make the session.
    pub fn start<S: Transport>(&self, stream: S) -> Result<Handshake<S>, ErrorStack> {
        Ok(Handshake {
            stream: SslStream::new(Ssl::new(&self.ctx)?, Wire::new(stream))?,
            server: false,
        })
    }

    /// Makes the handshake on a blocking `stream`, each read and write of
    /// it within [`HANDSHAKE_STEP`] unless the stream has timeouts of its
    /// own (which it keeps).
    ///
    /// # Errors
    /// The handshake failed or the peer did not answer in time.
    pub fn connect(&self, stream: TcpStream) -> Result<Session, HandshakeError> {
        let timeouts = (stream.read_timeout()?, stream.write_timeout()?);
        stream.set_read_timeout(timeouts.0.or(Some(HANDSHAKE_STEP)))?;
        stream.set_write_timeout(timeouts.1.or(Some(HANDSHAKE_STEP)))?;
        let ssl = Ssl::new(&self.ctx).map_err(|e| HandshakeError::Tls(e.to_string()))?;
        let mut h = Handshake {
            stream: SslStream::new(ssl, Wire::new(stream))
                .map_err(|e| HandshakeError::Tls(e.to_string()))?,
            server: false,
        };
        // A blocking stream that wants more has timed out.
        match h.step()? {
            Step::Done => {
                h.get_ref().set_read_timeout(timeouts.0)?;
                h.get_ref().set_write_timeout(timeouts.1)?;
                Ok(h.finish())
            }
            Step::Read | Step::Write => Err(io::Error::from(io::ErrorKind::TimedOut).into()),
        }
    }
}

/// What a handshake waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Complete: [`Handshake::finish`].
    Done,
    /// The socket must become readable.
    Read,
    /// The socket must become writable.
    Write,
}

/// What carries a session's ciphertext: a socket the session reads and
/// writes itself, or [`Detached`].
pub trait Transport: Read + Write {
    /// False when the caller moves the ciphertext ([`Session::feed`],
    /// [`Session::output`]): the session never reads the transport.
    const SOCKET: bool = true;
}

impl Transport for TcpStream {}

/// No socket: the caller hands the session the ciphertext it received
/// ([`Session::feed`], [`Handshake::feed`]) and sends what the session
/// made ([`Session::output`], [`Session::sent`]). A session writes no
/// more records while earlier ones wait there, so what it holds is
/// bounded by what the caller lets through.
#[derive(Debug, Default, Clone, Copy)]
pub struct Detached;

impl Read for Detached {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        Err(io::ErrorKind::WouldBlock.into())
    }
}

impl Write for Detached {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::ErrorKind::WouldBlock.into())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Transport for Detached {
    const SOCKET: bool = false;
}

/// The transport under OpenSSL. Ciphertext is read from a socket in
/// pieces of up to [`RX_CHUNK`] and handed to OpenSSL as it asks (a
/// record's header, then its body: two reads of OpenSSL's, one of the
/// socket's for many records), and what OpenSSL writes is gathered to go
/// out in one write for several records. [`Detached`], it holds what the
/// caller fed and what it has yet to send.
#[derive(Debug)]
struct Wire<S> {
    sock: S,
    /// Ciphertext read and not yet taken: `rx[rx_at..rx_len]`.
    rx: Vec<u8>,
    rx_at: usize,
    rx_len: usize,
    /// Ciphertext to send: `tx[tx_at..]`.
    tx: Vec<u8>,
    tx_at: usize,
}

/// Most ciphertext one read of the socket takes.
const RX_CHUNK: usize = 256 * 1024;

/// Most plaintext one write gathers into records before the socket
/// takes them.
const TX_BATCH: usize = 32 * RECORD;

impl<S: Transport> Wire<S> {
    fn new(sock: S) -> Self {
        Self {
            sock,
            rx: Vec::new(),
            rx_at: 0,
            rx_len: 0,
            tx: Vec::new(),
            tx_at: 0,
        }
    }

    fn has_rx(&self) -> bool {
        self.rx_at < self.rx_len
    }

    fn has_tx(&self) -> bool {
        self.tx_at < self.tx.len()
    }

    /// Takes `bytes` of ciphertext received, after what is still unread.
    fn feed(&mut self, bytes: &[u8]) {
        if self.rx_at == self.rx_len {
            (self.rx_at, self.rx_len) = (0, 0);
        } else if self.rx_len + bytes.len() > self.rx.len() && self.rx_at > 0 {
            self.rx.copy_within(self.rx_at..self.rx_len, 0);
            self.rx_len -= self.rx_at;
            self.rx_at = 0;
        }
        let end = self.rx_len + bytes.len();
        if end > self.rx.len() {
            self.rx.resize(end, 0);
        }
        self.rx[self.rx_len..end].copy_from_slice(bytes);
        self.rx_len = end;
    }

    /// Ciphertext not yet sent.
    fn output(&self) -> &[u8] {
        &self.tx[self.tx_at..]
    }

    /// `n` bytes of [`Wire::output`] went out.
    fn sent(&mut self, n: usize) {
        self.tx_at = (self.tx_at + n).min(self.tx.len());
        if self.tx_at == self.tx.len() {
            self.tx.clear();
            self.tx_at = 0;
        }
    }

    /// Sends the ciphertext gathered as far as the socket takes it;
    /// `Ok(true)` when none is left.
    fn send(&mut self) -> io::Result<bool> {
        while self.tx_at < self.tx.len() {
            match self.sock.write(&self.tx[self.tx_at..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.tx_at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        self.tx.clear();
        self.tx_at = 0;
        Ok(true)
    }
}

impl<S: Transport> Read for Wire<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.rx_at == self.rx_len {
            // What OpenSSL wrote goes out before it waits for an answer.
            if !S::SOCKET || !self.send()? {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if self.rx.is_empty() {
                self.rx = vec![0; RX_CHUNK];
            }
            let n = self.sock.read(&mut self.rx)?;
            self.rx_at = 0;
            self.rx_len = n;
        }
        let n = buf.len().min(self.rx_len - self.rx_at);
        buf[..n].copy_from_slice(&self.rx[self.rx_at..self.rx_at + n]);
        self.rx_at += n;
        Ok(n)
    }
}

impl<S: Transport> Write for Wire<S> {
    /// Takes everything: the caller bounds what it writes before sending.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tx.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A handshake under way.
pub struct Handshake<S = TcpStream> {
    stream: SslStream<Wire<S>>,
    server: bool,
}

impl<S> std::fmt::Debug for Handshake<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl<S: Transport> Handshake<S> {
    /// Goes on as far as the socket allows ([`Detached`]: as far as what
    /// was fed allows; [`Step::Read`] and [`Step::Write`] then both mean
    /// that the caller sends [`Handshake::output`] and feeds what comes).
    ///
    /// # Errors
    /// The handshake failed: no key for the identity offered, wrong key,
    /// not TLS 1.3, the peer closed.
    pub fn step(&mut self) -> Result<Step, HandshakeError> {
        let r = if self.server {
            self.stream.accept()
        } else {
            self.stream.connect()
        };
        // What the step wrote goes out now; a done handshake's last
        // flight may wait in the session.
        let sent = self.stream.get_mut().send()?;
        match r {
            Ok(()) => Ok(Step::Done),
            Err(e) if !sent && e.code() == ErrorCode::WANT_READ => Ok(Step::Write),
            Err(e) if e.code() == ErrorCode::WANT_READ => Ok(Step::Read),
            Err(e) if e.code() == ErrorCode::WANT_WRITE => Ok(Step::Write),
            Err(e) => {
                if let Some(r) = ffi::refusal(self.stream.ssl()) {
                    return Err(if r.unknown_key {
                        HandshakeError::UnknownKey(r.why)
                    } else {
                        HandshakeError::Refused(r.why)
                    });
                }
                match e.into_io_error() {
                    Ok(io) => Err(HandshakeError::Io(io)),
                    Err(e) => Err(HandshakeError::Tls(match e.ssl_error() {
                        Some(stack) => stack.to_string(),
                        None => "the peer closed the connection".into(),
                    })),
                }
            }
        }
    }

    /// The socket under the handshake.
    pub fn get_ref(&self) -> &S {
        &self.stream.get_ref().sock
    }

    /// [`Detached`]: takes ciphertext received from the peer.
    pub fn feed(&mut self, ciphertext: &[u8]) {
        self.stream.get_mut().feed(ciphertext);
    }

    /// [`Detached`]: ciphertext the handshake made, to send.
    pub fn output(&self) -> &[u8] {
        self.stream.get_ref().output()
    }

    /// [`Detached`]: `n` bytes of [`Handshake::output`] were sent.
    pub fn sent(&mut self, n: usize) {
        self.stream.get_mut().sent(n);
    }

    /// The established session (once [`Handshake::step`] said
    /// [`Step::Done`]).
    pub fn finish(self) -> Session<S> {
        let identity = ffi::accepted(self.stream.ssl());
        Session {
            stream: self.stream,
            identity,
            out: Vec::new(),
        }
    }
}

/// An established TLS session on a socket, or [`Detached`].
pub struct Session<S = TcpStream> {
    stream: SslStream<Wire<S>>,
    identity: Option<Identity>,
    /// Plaintext taken by a write and not yet taken by OpenSSL: retried,
    /// unchanged, before anything else is written.
    out: Vec<u8>,
}

impl<S: Transport> std::fmt::Debug for Session<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("identity", &self.identity)
            .field("cipher", &self.cipher())
            .field("pending", &self.has_pending())
            .finish()
    }
}

impl<S: Transport> Session<S> {
    /// On the subsystem's side, the identity the host was accepted under.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// The cipher suite agreed.
    pub fn cipher(&self) -> &'static str {
        self.stream
            .ssl()
            .current_cipher()
            .map_or("none", |c| c.name())
    }

    /// The socket under the session.
    pub fn get_ref(&self) -> &S {
        &self.stream.get_ref().sock
    }

    /// [`Detached`]: takes ciphertext received from the peer, for
    /// [`Session::read_available`].
    pub fn feed(&mut self, ciphertext: &[u8]) {
        self.stream.get_mut().feed(ciphertext);
    }

    /// [`Detached`]: ciphertext fed and not yet opened.
    pub fn unread(&self) -> usize {
        let w = self.stream.get_ref();
        w.rx_len - w.rx_at
    }

    /// [`Detached`]: ciphertext made and not yet sent.
    pub fn output(&self) -> &[u8] {
        self.stream.get_ref().output()
    }

    /// [`Detached`]: `n` bytes of [`Session::output`] were sent.
    pub fn sent(&mut self, n: usize) {
        self.stream.get_mut().sent(n);
    }

    /// Bytes read from the socket and not yet read from the session: a
    /// reader that waits for socket events must read again before
    /// waiting.
    pub fn buffered(&self) -> bool {
        self.stream.ssl().pending() > 0 || self.stream.get_ref().has_rx()
    }

    /// Written bytes not yet taken by the socket: the writer must wait for
    /// the socket to take more and call [`Session::flush_pending`].
    pub fn has_pending(&self) -> bool {
        !self.out.is_empty() || self.stream.get_ref().has_tx()
    }

    /// Reads plaintext into `buf`: one record from the socket, and then
    /// whatever OpenSSL holds already, without waiting for more. `Ok(0)`:
    /// the peer closed. On a non-blocking socket `WouldBlock` when
    /// nothing was read; a caller that waits for edges reads again until
    /// it gets that.
    ///
    /// # Errors
    /// The socket's, or TLS's (a record that does not decrypt, ...).
    pub fn read_available(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() && (filled == 0 || self.buffered()) {
            match self.stream.ssl_read(&mut buf[filled..]) {
                Ok(n) => filled += n,
                Err(e) if e.code() == ErrorCode::ZERO_RETURN => break,
                Err(e) if matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE) => {
                    if filled == 0 {
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                    break;
                }
                Err(e) => {
                    if filled > 0 {
                        break;
                    }
                    return Err(tls_io_error(e));
                }
            }
        }
        Ok(filled)
    }

    /// Sends what an earlier write left, as far as the socket takes it.
    /// `Ok(true)`: nothing is left.
    ///
    /// # Errors
    /// The socket's, or TLS's.
    pub fn flush_pending(&mut self) -> io::Result<bool> {
        self.seal()?;
        self.stream.get_mut().send()
    }

    /// Makes records of the plaintext taken ([`Session::out`]); the wire
    /// takes them all.
    fn seal(&mut self) -> io::Result<()> {
        while !self.out.is_empty() {
            match self.stream.ssl_write(&self.out) {
                Ok(n) => {
                    self.out.drain(..n);
                }
                // A post-handshake message to read first (a KeyUpdate):
                // the plaintext waits for the next call.
                Err(e) if matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE) => {
                    return Ok(());
                }
                Err(e) => return Err(tls_io_error(e)),
            }
        }
        Ok(())
    }

    /// Gives back the session's buffers that hold nothing (the
    /// ciphertext read and to send, the plaintext gathered): a connection
    /// that went quiet keeps no more than OpenSSL's own state. The next
    /// read or write makes them again.
    pub fn release_idle_buffers(&mut self) {
        let w = self.stream.get_mut();
        if !w.has_rx() {
            w.rx = Vec::new();
            (w.rx_at, w.rx_len) = (0, 0);
        }
        if !w.has_tx() {
            w.tx = Vec::new();
            w.tx_at = 0;
        }
        if self.out.is_empty() {
            self.out = Vec::new();
        }
    }

    /// Bytes the session's own buffers hold allocated (not OpenSSL's).
    pub fn buffer_capacity(&self) -> usize {
        let w = self.stream.get_ref();
        w.rx.capacity() + w.tx.capacity() + self.out.capacity()
    }

    /// Sends a TLS close_notify (best effort: a socket that does not take
    /// it is closed anyway).
    pub fn shutdown(&mut self) {
        let _ = self.stream.shutdown();
        let _ = self.stream.get_mut().send();
    }
}

fn tls_io_error(e: openssl::ssl::Error) -> io::Error {
    match e.into_io_error() {
        Ok(io) => io,
        Err(e) => io::Error::other(format!("TLS: {e}")),
    }
}

impl<S: Transport> Read for Session<S> {
    /// Sends what an earlier write left first (a reader that polls need
    /// not flush), then reads as [`Session::read_available`] does.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.flush_pending()?;
        self.read_available(buf)
    }
}

impl<S: Transport> Write for Session<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// Takes up to `TX_BATCH` bytes of `bufs` into records of up to
    /// [`RECORD`] bytes and sends what the socket takes; what it does not
    /// take is sent first by the next write or [`Session::flush_pending`].
    /// `WouldBlock` only while earlier records are still waiting.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if !self.flush_pending()? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut taken = 0;
        let mut slices = bufs.iter().map(|b| &b[..]).filter(|b| !b.is_empty());
        let mut cur: &[u8] = slices.next().unwrap_or(&[]);
        while taken < TX_BATCH && !cur.is_empty() {
            // A whole record's worth in one slice is sealed where it lies.
            if self.out.is_empty() && cur.len() >= RECORD && taken + RECORD <= TX_BATCH {
                match self.stream.ssl_write(&cur[..RECORD]) {
                    Ok(n) => {
                        taken += n;
                        cur = &cur[n..];
                        if cur.is_empty() {
                            cur = slices.next().unwrap_or(&[]);
                        }
                        continue;
                    }
                    Err(e) if matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE) => {
                        break;
                    }
                    Err(e) => return Err(tls_io_error(e)),
                }
            }
            // One record gathered from the slices, at most RECORD bytes.
            while self.out.len() < RECORD && !cur.is_empty() {
                let n = (RECORD - self.out.len())
                    .min(cur.len())
                    .min(TX_BATCH - taken);
                if n == 0 {
                    break;
                }
                self.out.extend_from_slice(&cur[..n]);
                taken += n;
                cur = &cur[n..];
                if cur.is_empty() {
                    cur = slices.next().unwrap_or(&[]);
                }
            }
            self.seal()?;
            if !self.out.is_empty() {
                break;
            }
        }
        self.stream.get_mut().send()?;
        Ok(taken)
    }

    /// Sends what an earlier write left; `WouldBlock` if the socket does
    /// not take it all.
    fn flush(&mut self) -> io::Result<()> {
        if self.flush_pending()? {
            Ok(())
        } else {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }
}

#[cfg(test)]
mod tests;
