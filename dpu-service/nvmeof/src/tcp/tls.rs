//! The secure channel's handshakes, on a thread of their own
//! (`nvmf-tls`), never on a poll group.
//!
//! A connection accepted on a listener that speaks TLS comes here first.
//! Its first byte says what the host speaks: a TLS record (0x16, a
//! ClientHello) starts a handshake; anything else is clear text, handed
//! to the admin group as it is where the listener allows it and closed
//! (counted) where it requires TLS. Handshakes run non-blocking from one
//! epoll loop, each bounded by [`HANDSHAKE_TIMEOUT`]; at most
//! [`MAX_HANDSHAKES`] are under way, and at most
//! [`MAX_HANDSHAKES_PER_ADDRESS`] from one address, so a flood of slow
//! or half-sent hellos holds a bounded place and never delays a queue's
//! I/O. A completed session goes to the admin group with the identity it
//! was accepted under, which the queue's Connect must match.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dpu_tls::{Handshake, HandshakeError, Step};
use rustix::buffer::spare_capacity;
use rustix::event::{epoll, eventfd, EventfdFlags, Timespec};

use crate::conn::Connection;
use crate::target::{SecureChannel, Target, TlsStats};

use super::admit::Admission;
use super::group::{GroupHandle, Slot};
use super::link::Link;

/// Longest a host may take from its connection to a completed handshake
/// (the clear-text ICReq has as long).
pub(super) const HANDSHAKE_TIMEOUT: Duration = crate::conn::ICREQ_TIMEOUT;

/// Most handshakes under way at once.
pub(super) const MAX_HANDSHAKES: usize = 1024;

/// Most handshakes under way from one source address.
pub(super) const MAX_HANDSHAKES_PER_ADDRESS: usize = 64;

/// How often refusals of one kind are logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A connection not yet handed to a poll group.
struct Pending {
    state: State,
    local: SocketAddr,
    peer: SocketAddr,
    channel: SecureChannel,
    admission: Admission,
    deadline: Instant,
}

enum State {
    /// Waiting for the host's first byte.
    Sniff(TcpStream),
    /// The handshake, waiting for the socket.
    Shake(Box<Handshake>),
}

impl State {
    fn socket(&self) -> &TcpStream {
        match self {
            Self::Sniff(s) => s,
            Self::Shake(h) => h.get_ref(),
        }
    }
}

/// What the listeners hold of the handshake thread.
#[derive(Debug)]
pub(super) struct Handshakes {
    inbox: Mutex<Vec<Pending>>,
    wake: std::os::fd::OwnedFd,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Handshakes {
    /// Starts the thread; it serves until `stop`.
    pub(super) fn start(
        target: Target,
        admin: Arc<GroupHandle>,
        stop: Arc<AtomicBool>,
        place: impl FnOnce() + Send + 'static,
    ) -> io::Result<(Arc<Self>, JoinHandle<()>)> {
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let me = Arc::new(Self {
            inbox: Mutex::new(Vec::new()),
            wake,
        });
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &epoll,
            &me.wake,
            epoll::EventData::new_u64(WAKE),
            epoll::EventFlags::IN,
        )?;
        let mut l = Loop {
            me: me.clone(),
            target,
            admin,
            stop,
            epoll,
            pending: HashMap::new(),
            per_address: HashMap::new(),
            next: 0,
            logged: HashMap::new(),
        };
        let thread = std::thread::Builder::new()
            .name("nvmf-tls".into())
            .spawn(move || {
                place();
                l.run();
            })?;
        Ok((me, thread))
    }

    /// Hands the thread a connection accepted on a TLS listener.
    pub(super) fn hand(
        &self,
        stream: TcpStream,
        local: SocketAddr,
        peer: SocketAddr,
        channel: SecureChannel,
        admission: Admission,
    ) {
        self.inbox.lock().expect("inbox lock").push(Pending {
            state: State::Sniff(stream),
            local,
            peer,
            channel,
            admission,
            deadline: Instant::now() + HANDSHAKE_TIMEOUT,
        });
        self.wake();
    }

    /// Wakes the thread.
    pub(super) fn wake(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

const WAKE: u64 = u64::MAX;

struct Loop {
    me: Arc<Handshakes>,
    target: Target,
    admin: Arc<GroupHandle>,
    stop: Arc<AtomicBool>,
    epoll: std::os::fd::OwnedFd,
    pending: HashMap<u64, Pending>,
    per_address: HashMap<IpAddr, usize>,
    next: u64,
    /// When each kind of refusal was last logged, and how many since.
    logged: HashMap<&'static str, (Option<Instant>, u64)>,
}

impl Loop {
    fn run(&mut self) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            let next = self
                .pending
                .values()
                .map(|p| p.deadline)
                .min()
                .map_or(Duration::from_millis(100), |d| {
                    d.saturating_duration_since(now)
                })
                .min(Duration::from_millis(100));
            let ts = Timespec {
                tv_sec: next.as_secs() as i64,
                tv_nsec: i64::from(next.subsec_nanos()),
            };
            events.clear();
            if let Err(e) = epoll::wait(&self.epoll, spare_capacity(&mut events), Some(&ts)) {
                if e != rustix::io::Errno::INTR {
                    tracing::error!(error = %e, "TLS handshake thread: epoll failed");
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
            let tokens: Vec<u64> = events.iter().map(|e| e.data.u64()).collect();
            for token in tokens {
                if token == WAKE {
                    self.take_inbox();
                } else {
                    self.step(token);
                }
            }
            self.expire(Instant::now());
        }
        for (_, p) in self.pending.drain() {
            let _ = p.state.socket().shutdown(Shutdown::Both);
        }
    }

    fn take_inbox(&mut self) {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(&self.me.wake, &mut counter);
        let new = std::mem::take(&mut *self.me.inbox.lock().expect("inbox lock"));
        for p in new {
            let from = self.per_address.get(&p.peer.ip()).copied().unwrap_or(0);
            if self.pending.len() >= MAX_HANDSHAKES || from >= MAX_HANDSHAKES_PER_ADDRESS {
                TlsStats::count(&self.target.stats().tls.busy);
                self.log(
                    "busy",
                    p.peer,
                    "too many TLS handshakes under way; closing the connection",
                );
                let _ = p.state.socket().shutdown(Shutdown::Both);
                continue;
            }
            let token = self.next;
            self.next += 1;
            if let Err(e) = epoll::add(
                &self.epoll,
                p.state.socket(),
                epoll::EventData::new_u64(token),
                epoll::EventFlags::IN | epoll::EventFlags::ET,
            ) {
                tracing::warn!(peer = %p.peer, error = %e, "cannot watch a connection's socket; closing it");
                continue;
            }
            *self.per_address.entry(p.peer.ip()).or_default() += 1;
            self.pending.insert(token, p);
            // Bytes may be there already.
            self.step(token);
        }
    }

    /// Drives the connection `token` names as far as its socket allows.
    fn step(&mut self, token: u64) {
        let Some(mut p) = self.pending.remove(&token) else {
            return;
        };
        loop {
            match p.state {
                State::Sniff(stream) => {
                    let mut first = [0u8; 1];
                    match stream.peek(&mut first) {
                        Ok(0) => return self.end(p.peer, &stream),
                        Ok(_) if first[0] == 0x16 => match self.target.tls_acceptor() {
                            Ok(acceptor) => match acceptor.start(stream) {
                                Ok(h) => p.state = State::Shake(Box::new(h)),
                                Err(e) => {
                                    // The socket closed with the session.
                                    tracing::error!(error = %e, "cannot start a TLS session");
                                    return self.left(p.peer);
                                }
                            },
                            Err(e) => {
                                tracing::error!(error = %e, "no TLS: closing the connection");
                                return self.end(p.peer, &stream);
                            }
                        },
                        Ok(_) if p.channel == SecureChannel::Required => {
                            TlsStats::count(&self.target.stats().tls.clear_text_refused);
                            self.log(
                                "clear_text",
                                p.peer,
                                "a clear-text connection on a listener that requires TLS; closing it",
                            );
                            return self.end(p.peer, &stream);
                        }
                        Ok(_) => {
                            let (local, peer) = (p.local, p.peer);
                            self.unwatch(&stream, peer);
                            let conn = self.connection(local, peer);
                            self.admin.hand(Slot::new(
                                Link::Plain(stream),
                                conn,
                                peer,
                                p.admission,
                            ));
                            return;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            p.state = State::Sniff(stream);
                            self.pending.insert(token, p);
                            return;
                        }
                        Err(_) => return self.end(p.peer, &stream),
                    }
                }
                State::Shake(mut h) => match h.step() {
                    Ok(Step::Done) => {
                        let session = h.finish();
                        TlsStats::count(&self.target.stats().tls.handshakes);
                        let (local, peer) = (p.local, p.peer);
                        self.unwatch(session.get_ref(), peer);
                        let mut conn = self.connection(local, peer);
                        let Some(identity) = session.identity().cloned() else {
                            // A session without the callback's identity
                            // cannot happen: no certificate, no other way in.
                            return;
                        };
                        tracing::debug!(%peer, %identity, cipher = session.cipher(), "TLS session established");
                        conn.set_tls(identity);
                        self.admin.hand(Slot::new(
                            Link::Tls(Box::new(session)),
                            conn,
                            peer,
                            p.admission,
                        ));
                        return;
                    }
                    Ok(want) => {
                        let flags = match want {
                            Step::Write => epoll::EventFlags::OUT,
                            _ => epoll::EventFlags::IN,
                        } | epoll::EventFlags::ET;
                        let _ = epoll::modify(
                            &self.epoll,
                            h.get_ref(),
                            epoll::EventData::new_u64(token),
                            flags,
                        );
                        p.state = State::Shake(h);
                        self.pending.insert(token, p);
                        return;
                    }
                    Err(e) => {
                        let stats = &self.target.stats().tls;
                        let kind = match &e {
                            HandshakeError::Refused(_) | HandshakeError::UnknownKey(_) => {
                                TlsStats::count(&stats.refused_unknown_key);
                                "unknown_key"
                            }
                            _ => {
                                TlsStats::count(&stats.failed);
                                "failed"
                            }
                        };
                        self.log(kind, p.peer, &format!("TLS handshake refused: {e}"));
                        return self.end(p.peer, h.get_ref());
                    }
                },
            }
        }
    }

    /// Closes handshakes past their deadline.
    fn expire(&mut self, now: Instant) {
        let late: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(&t, _)| t)
            .collect();
        for token in late {
            if let Some(p) = self.pending.remove(&token) {
                TlsStats::count(&self.target.stats().tls.timeouts);
                self.log(
                    "timeout",
                    p.peer,
                    "no TLS handshake within the handshake timeout; closing the connection",
                );
                let s = p.state.socket();
                let _ = epoll::delete(&self.epoll, s);
                let _ = s.shutdown(Shutdown::Both);
                self.left(p.peer);
            }
        }
    }

    fn connection(&self, local: SocketAddr, peer: SocketAddr) -> Connection {
        let mut conn = Connection::new(self.target.clone(), local, peer);
        conn.set_dh_offload(true);
        conn
    }

    /// Stops watching a socket that leaves for a poll group.
    fn unwatch(&mut self, s: &TcpStream, peer: SocketAddr) {
        let _ = epoll::delete(&self.epoll, s);
        self.left(peer);
    }

    /// Closes a connection that will not be served.
    fn end(&mut self, peer: SocketAddr, s: &TcpStream) {
        self.unwatch(s, peer);
        let _ = s.shutdown(Shutdown::Both);
    }

    fn left(&mut self, peer: SocketAddr) {
        if let Some(n) = self.per_address.get_mut(&peer.ip()) {
            *n -= 1;
            if *n == 0 {
                self.per_address.remove(&peer.ip());
            }
        }
    }

    /// Logs a refusal of `kind`, at most once per [`LOG_EVERY`], with the
    /// count since the last line.
    fn log(&mut self, kind: &'static str, peer: SocketAddr, what: &str) {
        let now = Instant::now();
        let e = self.logged.entry(kind).or_insert((None, 0));
        e.1 += 1;
        if e.0.is_none_or(|t| now.duration_since(t) >= LOG_EVERY) {
            tracing::warn!(%peer, since_last = e.1, "{what}");
            *e = (Some(now), 0);
        }
    }
}
