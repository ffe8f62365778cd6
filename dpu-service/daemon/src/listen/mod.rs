//! Bounds on the service's own TCP listeners: the gRPC API's, its
//! plain-text health listener's and the metrics'.
//!
//! A [`Gate`] per listener admits each accepted connection or closes it
//! at once: past the listener's most connections, or past its most from
//! one source address. At either bound a newcomer first displaces the
//! oldest connection (of that source, at its bound) that has not made a
//! call yet: a flood of silent connections then holds no place for long,
//! and a client that connects and calls at once gets in through it,
//! while connections that made calls keep theirs. An admitted connection
//! holds a [`Slot`] until it closes. The API's connections ([`incoming`]) must also finish their
//! TLS handshake and send a first call within the handshake timeout, and
//! are closed after the idle timeout without a call open; [`layer`]
//! counts their calls and bounds the streaming watch calls, per
//! connection and in all. Refusals and closings are counted
//! ([`CounterSource`], on `/metrics`) and logged at most once per
//! [`LOG_INTERVAL`] for each kind, so a flood cannot flood the log.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use dpu_control::telemetry::{CounterSource, Counters, ListenerCounters};

pub mod incoming;
pub mod layer;

/// Each kind of refusal or closing is logged at most once per interval.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What a listener admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most connections open at once from one source address.
    pub max_connections_per_source: usize,
    /// Time a connection has to finish its TLS handshake and send its
    /// first call.
    pub handshake_timeout: Duration,
    /// Time a connection may stay without a call open; `None`: forever.
    pub idle_timeout: Option<Duration>,
    /// Most streaming watch calls open at once.
    pub max_watches: usize,
    /// Most streaming watch calls open at once on one connection.
    pub max_watches_per_connection: usize,
}

/// A kind of refusal or closing, as counted and logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// The listener had its most connections.
    MaxConnections,
    /// The source address had its most connections.
    MaxPerSource,
    /// No first call within the handshake timeout.
    HandshakeTimeout,
    /// No call open for the idle timeout.
    IdleTimeout,
    /// Displaced, before its first call, by a newer connection.
    Displaced,
    /// A watch call past its bounds.
    MaxWatches,
    /// An accept failed.
    AcceptError,
}

impl Event {
    fn what(self) -> &'static str {
        match self {
            Self::MaxConnections => "connection refused: the listener has its most connections",
            Self::MaxPerSource => "connection refused: its source has its most connections",
            Self::HandshakeTimeout => {
                "connection closed: no TLS handshake and first call within the handshake timeout"
            }
            Self::IdleTimeout => "connection closed: idle past the idle timeout",
            Self::Displaced => {
                "connection closed: displaced, before its first call, by a newer one at a bound"
            }
            Self::MaxWatches => "watch call refused: the connection or listener has its most",
            Self::AcceptError => "accept failed",
        }
    }
}

/// Connections open, by source and by peer address. Displaced ones count
/// apart until they have closed.
#[derive(Debug, Default)]
struct Table {
    live: usize,
    closing: usize,
    per_source: HashMap<IpAddr, usize>,
    conns: HashMap<SocketAddr, Arc<ConnState>>,
}

/// Counts of refusals and closings.
#[derive(Debug, Default)]
struct Tally {
    max_connections: AtomicU64,
    max_per_source: AtomicU64,
    handshake_timeout: AtomicU64,
    idle_timeout: AtomicU64,
    displaced: AtomicU64,
    max_watches: AtomicU64,
    accept_error: AtomicU64,
}

impl Tally {
    fn of(&self, e: Event) -> &AtomicU64 {
        match e {
            Event::MaxConnections => &self.max_connections,
            Event::MaxPerSource => &self.max_per_source,
            Event::HandshakeTimeout => &self.handshake_timeout,
            Event::IdleTimeout => &self.idle_timeout,
            Event::Displaced => &self.displaced,
            Event::MaxWatches => &self.max_watches,
            Event::AcceptError => &self.accept_error,
        }
    }
}

/// The admission of one listener (see the module documentation).
#[derive(Debug)]
pub struct Gate {
    listener: &'static str,
    limits: Limits,
    table: Mutex<Table>,
    watches: AtomicUsize,
    tally: Tally,
    /// When each kind was last logged.
    logged: Mutex<HashMap<Event, Instant>>,
}

/// What is known of one admitted connection: whether it made a call yet,
/// the calls and watches open on it, and since when it has had none.
#[derive(Debug)]
pub struct ConnState {
    accepted: Instant,
    served: AtomicBool,
    calls: AtomicUsize,
    watches: AtomicUsize,
    idle_since: Mutex<Instant>,
    /// Displaced by a newer connection: it closes.
    displaced: AtomicBool,
    /// Wakes the connection's task when it is displaced.
    waker: Mutex<Option<Waker>>,
}

impl ConnState {
    fn new(now: Instant) -> Self {
        Self {
            accepted: now,
            served: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
            watches: AtomicUsize::new(0),
            idle_since: Mutex::new(now),
            displaced: AtomicBool::new(false),
            waker: Mutex::new(None),
        }
    }

    /// True once the connection is displaced; until it made a call (it
    /// cannot be displaced after), `cx` is woken when it is.
    pub fn displaced(&self, cx: &mut Context<'_>) -> bool {
        if self.served.load(Ordering::Acquire) {
            return false;
        }
        let mut w = lock(&self.waker);
        if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *w = Some(cx.waker().clone());
        }
        self.displaced.load(Ordering::Acquire)
    }

    /// When the connection must be closed unless something happens first
    /// (`Err`: now, for the reason given), or when to look again (`Ok`).
    fn deadline(&self, limits: &Limits, now: Instant) -> Result<Instant, Event> {
        if !self.served.load(Ordering::Acquire) {
            let end = self.accepted + limits.handshake_timeout;
            return if now >= end {
                Err(Event::HandshakeTimeout)
            } else {
                Ok(end)
            };
        }
        let Some(idle) = limits.idle_timeout else {
            return Ok(now + Duration::from_secs(3600));
        };
        if self.calls.load(Ordering::Acquire) > 0 {
            return Ok(now + idle);
        }
        let end = *lock(&self.idle_since) + idle;
        if now >= end {
            Err(Event::IdleTimeout)
        } else {
            Ok(end)
        }
    }

    /// Counts a call opened on the connection.
    fn begin_call(&self) {
        self.served.store(true, Ordering::Release);
        lock(&self.waker).take();
        self.calls.fetch_add(1, Ordering::AcqRel);
    }

    /// Counts a call of the connection ended.
    fn end_call(&self) {
        if self.calls.fetch_sub(1, Ordering::AcqRel) == 1 {
            *lock(&self.idle_since) = Instant::now();
        }
    }
}

/// A place in a [`Gate`], held for as long as its connection is open.
#[derive(Debug)]
pub struct Slot {
    gate: Arc<Gate>,
    peer: SocketAddr,
    state: Arc<ConnState>,
}

impl Slot {
    /// The listener's gate.
    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// Resolves when the connection is displaced by a newer one.
    pub async fn until_displaced(&self) {
        std::future::poll_fn(|cx| {
            if self.state.displaced(cx) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = lock(&self.gate.table);
        if self.state.displaced.load(Ordering::Acquire) {
            t.closing = t.closing.saturating_sub(1);
            return;
        }
        t.live = t.live.saturating_sub(1);
        t.leave(self.peer.ip());
        if t.conns
            .get(&self.peer)
            .is_some_and(|s| Arc::ptr_eq(s, &self.state))
        {
            t.conns.remove(&self.peer);
        }
    }
}

impl Table {
    /// One live connection fewer from `ip`.
    fn leave(&mut self, ip: IpAddr) {
        if let Some(n) = self.per_source.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&ip);
            }
        }
    }

    /// Displaces the oldest connection, of `ip` if given, that has made
    /// no call yet: false if there is none.
    fn displace(&mut self, ip: Option<IpAddr>) -> bool {
        let victim = self
            .conns
            .iter()
            .filter(|(p, c)| ip.is_none_or(|ip| p.ip() == ip) && !c.served.load(Ordering::Acquire))
            .min_by_key(|(_, c)| c.accepted)
            .map(|(p, _)| *p);
        let Some(peer) = victim else {
            return false;
        };
        let Some(c) = self.conns.remove(&peer) else {
            return false;
        };
        c.displaced.store(true, Ordering::Release);
        if let Some(w) = lock(&c.waker).take() {
            w.wake();
        }
        self.live -= 1;
        self.closing += 1;
        self.leave(peer.ip());
        true
    }
}

impl Gate {
    /// The gate of the listener named `listener` (as counters label it).
    pub fn new(listener: &'static str, limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            listener,
            limits,
            table: Mutex::default(),
            watches: AtomicUsize::new(0),
            tally: Tally::default(),
            logged: Mutex::default(),
        })
    }

    /// The listener's bounds.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Admits a connection from `peer`, displacing an older one that made
    /// no call at a bound, or counts and logs its refusal (`None`: the
    /// caller closes it). Displaced connections still closing are bounded
    /// too, by `max_connections`.
    pub fn admit(self: &Arc<Self>, peer: SocketAddr) -> Option<Slot> {
        let state = Arc::new(ConnState::new(Instant::now()));
        let l = &self.limits;
        let mut displaced = 0;
        let refused = {
            let mut t = lock(&self.table);
            let from = |t: &Table| t.per_source.get(&peer.ip()).copied().unwrap_or(0);
            let mut refused = None;
            if from(&t) >= l.max_connections_per_source {
                if t.closing < l.max_connections && t.displace(Some(peer.ip())) {
                    displaced += 1;
                } else {
                    refused = Some(Event::MaxPerSource);
                }
            }
            if refused.is_none() && t.live >= l.max_connections {
                if t.closing < l.max_connections && t.displace(None) {
                    displaced += 1;
                } else {
                    refused = Some(Event::MaxConnections);
                }
            }
            if refused.is_none() {
                t.live += 1;
                *t.per_source.entry(peer.ip()).or_default() += 1;
                t.conns.insert(peer, state.clone());
            }
            refused
        };
        for _ in 0..displaced {
            self.note(Event::Displaced, None);
        }
        if let Some(e) = refused {
            self.note(e, Some(peer));
            return None;
        }
        Some(Slot {
            gate: self.clone(),
            peer,
            state,
        })
    }

    /// The state of the open connection from `peer`.
    pub fn conn(&self, peer: SocketAddr) -> Option<Arc<ConnState>> {
        lock(&self.table).conns.get(&peer).cloned()
    }

    /// Counts `e` and logs it, unless it was logged less than
    /// [`LOG_INTERVAL`] ago.
    pub fn note(&self, e: Event, peer: Option<SocketAddr>) {
        let n = self.tally.of(e).fetch_add(1, Ordering::Relaxed) + 1;
        let now = Instant::now();
        let due = {
            let mut logged = lock(&self.logged);
            let due = logged
                .get(&e)
                .is_none_or(|t| now.duration_since(*t) >= LOG_INTERVAL);
            if due {
                logged.insert(e, now);
            }
            due
        };
        if due {
            tracing::warn!(
                listener = self.listener,
                peer = ?peer,
                so_far = n,
                limits = ?self.limits,
                "{} (logged at most every {} s)",
                e.what(),
                LOG_INTERVAL.as_secs()
            );
        }
    }

    /// Takes a watch slot for a call on `conn`: false (counted) past the
    /// listener's or the connection's most.
    fn begin_watch(&self, conn: &ConnState) -> bool {
        let ok = self
            .watches
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limits.max_watches).then_some(n + 1)
            })
            .is_ok();
        if !ok {
            return false;
        }
        let ok = conn
            .watches
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limits.max_watches_per_connection).then_some(n + 1)
            })
            .is_ok();
        if !ok {
            self.watches.fetch_sub(1, Ordering::AcqRel);
        }
        ok
    }

    fn end_watch(&self, conn: &ConnState) {
        self.watches.fetch_sub(1, Ordering::AcqRel);
        conn.watches.fetch_sub(1, Ordering::AcqRel);
    }
}

impl CounterSource for Gate {
    fn collect(&self, out: &mut Counters) {
        let open = lock(&self.table).live as u64;
        let t = &self.tally;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.listeners.insert(
            self.listener.to_string(),
            ListenerCounters {
                connections: open,
                refused_max_connections: get(&t.max_connections),
                refused_max_connections_per_source: get(&t.max_per_source),
                closed_handshake_timeout: get(&t.handshake_timeout),
                closed_idle_timeout: get(&t.idle_timeout),
                closed_displaced: get(&t.displaced),
                accept_errors: get(&t.accept_error),
                watches: self.watches.load(Ordering::Relaxed) as u64,
                refused_watches: get(&t.max_watches),
            },
        );
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
