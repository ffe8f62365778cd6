//! A poll group: one thread serving many connections from one epoll event
//! loop.
//!
//! Every socket is non-blocking and registered edge-triggered: for input
//! while its connection takes commands, for output while it has bytes the
//! socket did not take. A socket that reports input is read once per turn
//! into the group's receive buffer, whose whole PDUs the connection
//! consumes where they lie; only the start of a PDU not yet whole is kept
//! by the connection's slot. A read that fills the buffer may have left
//! bytes behind, so the slot goes on the group's ready list and is read
//! again next turn. Edge triggering serves connections in the order their
//! bytes arrived: level-triggered, a socket served early in a long turn
//! and readable again by its end would stay at the head of epoll's ready
//! list, ahead of sockets that had waited the whole turn, and with many
//! queues of depth 1 those waits are the latency's tail.
//!
//! Output is sent as the socket accepts it and
//! otherwise stays queued in the connection, which stops running block
//! requests past [`OUTPUT_BUDGET`](crate::conn::OUTPUT_BUDGET); while it is over that budget the socket
//! is not read either, so a host that does not read cannot make the target
//! queue without bound. A socket that takes no byte for the write timeout
//! ([`WRITE_TIMEOUT`](super::WRITE_TIMEOUT) by default) closes.
//!
//! After activity the group polls (`epoll_wait` without a timeout) for
//! [`POLL`] before it sleeps until the next event or tick: the group busy
//! polls, not each socket. Not while a connection waits for an
//! asynchronous backend that another thread completes: the group then
//! sleeps until the completion wakes it, leaving the core to that thread
//! (it does poll when it watches a backend, below, whose completions it
//! reads itself). Every [`TICK`] it ticks each connection
//! (handshake, PDU and keep-alive timers, asynchronous events).
//!
//! A connection whose block requests a QoS limit holds back
//! ([`Connection::throttled_until`]) is on the group's timer heap, not on
//! its ready list: the group sleeps until the earliest such time.
//!
//! While another connection of the group has sent bytes within
//! [`CONTENDED`], a connection runs at most [`TURN`] block requests per
//! turn and the others are served between its turns: a host at QD 128
//! beside one at QD 1 left the latter's p99 at 1.8x its p99 alone, where
//! whole batches left it at 5x. A connection alone runs whole batches.
//!
//! The admin group also takes every new connection: once a connection's
//! Fabrics Connect names an I/O queue it leaves for the least-loaded I/O
//! group, with whatever it has buffered (not while a DH job of its
//! authentication is out: the result comes back to the group that sent
//! it).
//!
//! An asynchronous backend that answers on a socket (a remote target's
//! I/O queue) is watched from the group's epoll once the group starts an
//! operation on it, if the backend lends it ([`crate::backend::watch`]):
//! when its completions arrive the group reads them itself and serves its
//! connections in the same turn, with no other thread and no wake-up in
//! between.
//!
//! DH jobs go to the transport's [`DhPool`]; a job's result comes back
//! through the group's inbox, tagged with the slot's token, and wakes the
//! group, which hands it to the connection if the slot still holds it (a
//! closed connection's result is dropped, and its jobs still waiting are
//! never run). A job the pool's full queue refuses completes at once as
//! [`DhError::Busy`].

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustix::buffer::spare_capacity;
use rustix::event::{epoll, eventfd, EventfdFlags, Timespec};

use crate::auth::dh::DhError;
use crate::auth::pool::{DhPool, DhResult};
use crate::backend::watch::{self, Ready};
use crate::conn::{BlockCompletion, Completer, Connection, TURN};
use crate::target::Target;

use super::admit::Admission;
use super::link::Link;

/// How often every connection of a group is ticked.
pub(super) const TICK: Duration = Duration::from_millis(100);

/// How long a group keeps polling after its last event before it sleeps
/// in the kernel. Waking a sleeping thread costs tens of microseconds
/// (more in a VM), which at low queue depth is most of a command's
/// latency; a short poll keeps the next command's bytes on a running
/// thread, the way a poll-mode target does, without holding the core once
/// the group's hosts have gone quiet.
pub(super) const POLL: Duration = Duration::from_micros(50);

/// The group's receive buffer: room for the largest PDU several times.
#[cfg(not(test))]
const RX_BUF: usize =
    4 * (crate::conn::MAX_H2C_DATA as usize + crate::conn::IN_CAPSULE_DATA as usize);
/// In unit tests, a buffer smaller than most PDUs: nearly every read
/// fills it, and the bytes it leaves behind are found only by the group's
/// own note that the socket may hold more.
#[cfg(test)]
const RX_BUF: usize = 61;

/// Most slices one vectored write takes (well under the kernel's IOV_MAX).
const IOV: usize = 64;

/// Most events one `epoll_wait` returns.
const EVENTS: usize = 256;

/// How recently another connection of the group must have sent bytes for
/// a connection to take turns of [`TURN`] requests: well above a loopback
/// round trip, so that a host at QD 1 counts as busy between its commands.
const CONTENDED: Duration = Duration::from_millis(1);

/// The token of the group's wake-up eventfd.
const WAKE: u64 = u64::MAX;

/// Tokens of watched backends: this in the upper half, the watch's index
/// in the lower (a slot's generation never has all 32 upper bits set).
const WATCH: u64 = 0xffff_ffff << 32;

/// Most backends one group watches; past it, the backends' own threads
/// read their completions.
const MAX_WATCHES: usize = 1 << 16;

thread_local! {
    /// The handle of the group this thread runs, if it runs one: a
    /// completion made on the group's own thread needs no wake-up.
    static ON_GROUP: std::cell::Cell<*const GroupHandle> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// A slot's receive buffer larger than this is given back once the
/// connection has been idle for a tick.
const RX_KEEP: usize = 0;

/// One connection served by a group.
#[derive(Debug)]
pub(super) struct Slot {
    stream: Link,
    conn: Connection,
    peer: SocketAddr,
    /// The start of a PDU not yet whole.
    rx: Vec<u8>,
    /// Counted among the group's connections that wait for completions
    /// of an asynchronous backend.
    awaits_io: bool,
    /// Since when output has waited for a socket that takes nothing.
    stalled_since: Option<Instant>,
    /// A write failed: nothing more is written.
    write_failed: bool,
    /// What the socket is registered for.
    interest: epoll::EventFlags,
    /// Bytes arrived since the last tick.
    active: bool,
    /// On the group's list of connections with block requests left to run
    /// or bytes left to read.
    ready: bool,
    /// The last read filled the receive buffer: the socket may hold more,
    /// and no new edge will say so.
    unread: bool,
    /// When the group's timers serve the connection again: the time its
    /// block requests held back by a QoS limit may start.
    wake_at: Option<Instant>,
    /// The connection's place under the transport's connection limits.
    _admission: Admission,
    /// The I/O group's count this connection is in, once placed on one.
    load: Option<LoadGuard>,
    /// Held while the slot lives: DH jobs of a connection gone by their
    /// turn are dropped unrun ([`DhPool::submit_for`]).
    alive: Arc<()>,
}

impl Slot {
    /// A new connection from `peer` on a non-blocking `stream`.
    pub(super) fn new(
        stream: Link,
        conn: Connection,
        peer: SocketAddr,
        admission: Admission,
    ) -> Self {
        Self {
            stream,
            conn,
            peer,
            rx: Vec::new(),
            awaits_io: false,
            stalled_since: None,
            write_failed: false,
            interest: epoll::EventFlags::empty(),
            active: false,
            ready: false,
            unread: false,
            wake_at: None,
            _admission: admission,
            load: None,
            alive: Arc::new(()),
        }
    }

    /// Takes `bytes` from the socket: the connection consumes whole PDUs,
    /// the start of the next stays in `rx`.
    fn feed(&mut self, bytes: &[u8], now: Instant) {
        self.active = true;
        if self.rx.is_empty() {
            let used = self.conn.receive(bytes, now);
            self.rx.extend_from_slice(&bytes[used..]);
        } else {
            self.rx.extend_from_slice(bytes);
            let used = self.conn.receive(&self.rx, now);
            self.rx.drain(..used);
        }
    }

    /// Runs the block requests waiting (as far as the output budget
    /// allows) and sends what the socket takes; once the output has
    /// drained, hands the connection the PDUs it left while held back.
    fn pump(&mut self, now: Instant) {
        let Self {
            stream,
            conn,
            stalled_since,
            write_failed,
            peer,
            rx,
            ..
        } = self;
        loop {
            conn.execute_requests(|c| send(stream, c, stalled_since, write_failed, *peer, now));
            send(stream, conn, stalled_since, write_failed, *peer, now);
            if rx.is_empty() || conn.held_back() || conn.is_closed() {
                return;
            }
            let used = conn.receive(rx, now);
            rx.drain(..used);
            if used == 0 {
                return;
            }
        }
    }

    /// What the socket should be registered for: input while the
    /// connection takes commands, output while bytes wait.
    fn wanted(&self) -> epoll::EventFlags {
        let mut f = epoll::EventFlags::ET;
        if !self.conn.held_back() {
            f |= epoll::EventFlags::IN;
        }
        if (self.conn.has_output() || self.stream.has_pending()) && !self.write_failed {
            f |= epoll::EventFlags::OUT;
        }
        f
    }
}

/// Sends what `conn` has as far as the socket takes it. A write that
/// would block leaves the rest queued and starts (or continues) the
/// stall; any progress ends it.
fn send(
    stream: &mut Link,
    conn: &mut Connection,
    stalled_since: &mut Option<Instant>,
    write_failed: &mut bool,
    peer: SocketAddr,
    now: Instant,
) {
    if *write_failed {
        return;
    }
    loop {
        let mut iov = [IoSlice::new(&[]); IOV];
        let n = conn.output_slices(&mut iov);
        if n == 0 {
            // What the link holds (a TLS record) goes before the stall ends.
            match stream.flush_pending() {
                Ok(true) => *stalled_since = None,
                Ok(false) => {
                    stalled_since.get_or_insert(now);
                }
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "write failed");
                    *write_failed = true;
                    conn.close(&format!("write failed: {e}"));
                }
            }
            return;
        }
        match stream.write_vectored(&iov[..n]) {
            Ok(0) => {
                *write_failed = true;
                conn.close("write failed: the socket took nothing");
                return;
            }
            Ok(k) => {
                conn.output_sent(k);
                *stalled_since = None;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                stalled_since.get_or_insert(now);
                return;
            }
            Err(e) => {
                tracing::debug!(%peer, error = %e, "write failed");
                *write_failed = true;
                conn.close(&format!("write failed: {e}"));
                return;
            }
        }
    }
}

/// Counts a connection in an I/O group's load while it lives.
#[derive(Debug)]
struct LoadGuard(Arc<AtomicUsize>);

impl LoadGuard {
    fn new(load: &Arc<AtomicUsize>) -> Self {
        load.fetch_add(1, Ordering::Relaxed);
        Self(load.clone())
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the transport and the other groups hold of a group: its inbox
/// and the eventfd that wakes it.
#[derive(Debug)]
pub(super) struct GroupHandle {
    inbox: Mutex<Vec<Slot>>,
    /// Results of DH jobs: (slot token, command ID, result).
    dh_done: Mutex<Vec<(u64, u16, DhResult)>>,
    /// Completions of block requests on asynchronous backends: (slot
    /// token, completion).
    io_done: Mutex<Vec<(u64, BlockCompletion)>>,
    wake: OwnedFd,
    /// I/O queues placed on this group.
    pub(super) load: Arc<AtomicUsize>,
}

impl GroupHandle {
    /// A handle with an empty inbox.
    pub(super) fn new() -> io::Result<Arc<Self>> {
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Arc::new(Self {
            inbox: Mutex::new(Vec::new()),
            dh_done: Mutex::new(Vec::new()),
            io_done: Mutex::new(Vec::new()),
            wake,
            load: Arc::new(AtomicUsize::new(0)),
        }))
    }

    /// Hands a connection to the group.
    pub(super) fn hand(&self, slot: Slot) {
        self.inbox.lock().expect("inbox lock").push(slot);
        self.wake();
    }

    /// Hands the result of a DH job to the group.
    fn dh_result(&self, token: u64, cid: u16, result: DhResult) {
        self.dh_done
            .lock()
            .expect("DH results lock")
            .push((token, cid, result));
        self.wake();
    }

    /// Hands the completion of a block request to the group; wakes it
    /// when the list was empty (it takes the whole list once woken),
    /// unless this is the group's own thread, which looks at the list at
    /// the end of each turn.
    fn io_result(&self, token: u64, c: BlockCompletion) {
        let first = {
            let mut done = self.io_done.lock().unwrap_or_else(PoisonError::into_inner);
            done.push((token, c));
            done.len() == 1
        };
        if first && !ON_GROUP.with(|g| std::ptr::eq(g.get(), self)) {
            self.wake();
        }
    }

    /// True when completions wait in the list.
    fn has_io_results(&self) -> bool {
        !self
            .io_done
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// Wakes the group's thread.
    pub(super) fn wake(&self) {
        // A full counter (never reached) already means "wake up".
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

/// One poll group's thread.
#[derive(Debug)]
pub(super) struct Group {
    /// This group's handle.
    pub(super) handle: Arc<GroupHandle>,
    /// Where connections go once their Connect names an I/O queue; empty
    /// for an I/O group.
    pub(super) io_groups: Vec<Arc<GroupHandle>>,
    /// Set when the transport stops.
    pub(super) stop: Arc<AtomicBool>,
    /// The target, for counters.
    pub(super) target: Target,
    /// Where DH jobs run.
    pub(super) dh: Arc<DhPool>,
    /// How long a socket may take nothing before its connection closes.
    pub(super) write_timeout: Duration,
}

/// A slot and the generation its token carries: an event for a slot
/// since closed never reaches the one that took its place.
#[derive(Debug, Default)]
struct Entry {
    generation: u32,
    slot: Option<Slot>,
}

/// The event loop's state.
struct Loop {
    group: Group,
    epoll: OwnedFd,
    entries: Vec<Entry>,
    free: Vec<usize>,
    scratch: Vec<u8>,
    /// Tokens of connections with block requests left to run (the rest
    /// of a long Write Zeroes): served again next turn, without waiting
    /// for an event.
    ready: Vec<u64>,
    /// Connections waiting for completions of an asynchronous backend
    /// (a cluster, a remote target): while there are any and the group
    /// watches no backend, it does not busy poll, which would keep the
    /// thread that completes them (librbd's, on the same core) from
    /// running. A group that watches a backend reads its completions
    /// itself, and polls for them.
    awaiting: usize,
    /// When to serve connections whose block requests a QoS limit holds
    /// back, earliest first (an entry whose slot has since changed its
    /// time, or closed, is skipped).
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The last two connections that sent bytes, and when: a connection
    /// shares the group with a busy one when the other sent within
    /// [`CONTENDED`], and then takes turns of [`TURN`] requests.
    inputs: [(u64, Instant); 2],
    /// Backends whose completions this group reads, by the index in
    /// their token; `None` where one was forgotten.
    watches: Vec<Option<Arc<dyn Ready>>>,
    free_watches: Vec<usize>,
}

impl Group {
    /// Serves connections until the transport stops.
    pub(super) fn run(self) {
        let epoll = match epoll::create(epoll::CreateFlags::CLOEXEC) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "cannot create a poll group's epoll; it serves nothing");
                return;
            }
        };
        if let Err(e) = epoll::add(
            &epoll,
            &self.handle.wake,
            epoll::EventData::new_u64(WAKE),
            epoll::EventFlags::IN,
        ) {
            tracing::error!(error = %e, "cannot watch a poll group's eventfd; it serves nothing");
            return;
        }
        watch::serve_here();
        ON_GROUP.with(|g| g.set(Arc::as_ptr(&self.handle)));
        let mut l = Loop {
            group: self,
            epoll,
            entries: Vec::new(),
            free: Vec::new(),
            scratch: Vec::new(),
            ready: Vec::new(),
            awaiting: 0,
            timers: BinaryHeap::new(),
            inputs: [(WAKE, Instant::now()); 2],
            watches: Vec::new(),
            free_watches: Vec::new(),
        };
        l.run();
        for r in l.watches.drain(..).flatten() {
            r.unwatched();
        }
    }
}

impl Loop {
    fn run(&mut self) {
        let mut events = Vec::with_capacity(EVENTS);
        let start = Instant::now();
        let (mut last_busy, mut last_tick) = (start, start);
        loop {
            if self.group.stop.load(Ordering::Acquire) {
                self.close_all();
                return;
            }
            let now = Instant::now();
            // A group that reads its backends' completions itself polls
            // for them too; one that waits for another thread's does not.
            let polling = (self.awaiting == 0 || !self.watches.is_empty())
                && now.duration_since(last_busy) < POLL;
            let timeout = if !self.ready.is_empty() || polling {
                Duration::ZERO
            } else {
                let tick = TICK.saturating_sub(now.duration_since(last_tick));
                match self.timers.peek() {
                    Some(Reverse((at, _))) => tick.min(at.saturating_duration_since(now)),
                    None => tick,
                }
            };
            let ts = Timespec {
                tv_sec: timeout.as_secs() as _,
                tv_nsec: timeout.subsec_nanos().into(),
            };
            events.clear();
            match epoll::wait(&self.epoll, spare_capacity(&mut events), Some(&ts)) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "epoll_wait failed");
                    std::thread::sleep(TICK);
                    continue;
                }
            }
            let now = Instant::now();
            for ev in &events {
                let token = ev.data.u64();
                if token == WAKE {
                    self.take_inbox(now);
                    self.take_dh_results(now);
                    self.take_io_results(now);
                } else if token & WATCH == WATCH {
                    self.watched_ready(token);
                } else {
                    self.service(token, ev.flags, now);
                }
            }
            for token in std::mem::take(&mut self.ready) {
                let idx = (token & u64::from(u32::MAX)) as usize;
                let mut flags = epoll::EventFlags::empty();
                if let Some(slot) = self.entries.get_mut(idx).and_then(|e| e.slot.as_mut()) {
                    slot.ready = false;
                    if std::mem::take(&mut slot.unread) {
                        flags = epoll::EventFlags::IN;
                    }
                }
                self.service(token, flags, now);
            }
            self.run_timers(now);
            if now.duration_since(last_tick) >= TICK {
                last_tick = now;
                self.tick(now);
            }
            // Completions made on this thread this turn (by watched
            // backends, or at once by a backend that refused an
            // operation), then the backends that asked to be watched.
            if self.group.handle.has_io_results() {
                self.take_io_results(now);
                if self.group.handle.has_io_results() {
                    // More came while serving: next turn, without sleeping.
                    self.group.handle.wake();
                }
            }
            self.add_watches();
            if !events.is_empty() {
                // The busy-poll window runs from when the events were
                // served, not from before: a host at QD 1 sends its next
                // command one round trip after our answer, and serving a
                // TLS batch can take most of the window.
                last_busy = Instant::now();
            }
        }
    }

    /// A watched backend may have completions: it reads them here (they
    /// come back through the group's list); a backend gone is forgotten.
    fn watched_ready(&mut self, token: u64) {
        let idx = (token & u64::from(u32::MAX)) as usize;
        let Some(r) = self.watches.get(idx).and_then(Option::as_ref) else {
            return;
        };
        if r.gone() {
            self.forget_watch(idx);
        } else {
            r.on_ready();
        }
    }

    /// Watches the backends started on this thread since the last turn.
    fn add_watches(&mut self) {
        for r in watch::take_new() {
            if self.watches.len() >= MAX_WATCHES && self.free_watches.is_empty() {
                watch::forget_here(r.watch_id());
                r.unwatched();
                continue;
            }
            let idx = self.free_watches.pop().unwrap_or_else(|| {
                self.watches.push(None);
                self.watches.len() - 1
            });
            // Level-triggered: what one read leaves wakes the group again.
            // (EPOLLEXCLUSIVE, for several groups on one backend, lost
            // wake-ups on a nested epoll: a backend lends its poller to
            // one group at a time instead.)
            let added = epoll::add(
                &self.epoll,
                r.ready_fd(),
                epoll::EventData::new_u64(WATCH | idx as u64),
                epoll::EventFlags::IN,
            );
            if let Err(e) = added {
                tracing::warn!(error = %e, "cannot watch a backend from a poll group; its own thread reads it");
                watch::forget_here(r.watch_id());
                r.unwatched();
                self.free_watches.push(idx);
                continue;
            }
            self.watches[idx] = Some(r);
        }
    }

    /// Stops watching backend `idx`.
    fn forget_watch(&mut self, idx: usize) {
        if let Some(r) = self.watches.get_mut(idx).and_then(Option::take) {
            let _ = epoll::delete(&self.epoll, r.ready_fd());
            watch::forget_here(r.watch_id());
            r.unwatched();
            self.free_watches.push(idx);
        }
    }

    /// Serves the connections whose QoS wait is over.
    fn run_timers(&mut self, now: Instant) {
        while let Some(&Reverse((at, token))) = self.timers.peek() {
            if at > now {
                return;
            }
            self.timers.pop();
            let idx = (token & u64::from(u32::MAX)) as usize;
            let Some(e) = self.entries.get_mut(idx) else {
                continue;
            };
            let due = e.generation == (token >> 32) as u32
                && e.slot.as_mut().is_some_and(|s| {
                    let due = s.wake_at == Some(at);
                    if due {
                        s.wake_at = None;
                    }
                    due
                });
            if due {
                self.service(token, epoll::EventFlags::empty(), now);
            }
        }
    }

    /// Registers the connections handed to the group.
    fn take_inbox(&mut self, now: Instant) {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(&self.group.handle.wake, &mut counter);
        let slots = std::mem::take(&mut *self.group.handle.inbox.lock().expect("inbox lock"));
        for mut slot in slots {
            let idx = self.free.pop().unwrap_or_else(|| {
                self.entries.push(Entry::default());
                self.entries.len() - 1
            });
            let e = &mut self.entries[idx];
            // Never all ones: those tokens are the watches'.
            e.generation = e.generation.wrapping_add(1) % u32::MAX;
            let token = (u64::from(e.generation) << 32) | idx as u64;
            slot.interest = epoll::EventFlags::IN | epoll::EventFlags::ET;
            if let Err(err) = epoll::add(
                &self.epoll,
                slot.stream.socket(),
                epoll::EventData::new_u64(token),
                slot.interest,
            ) {
                tracing::warn!(peer = %slot.peer, error = %err, "cannot watch a connection's socket; closing it");
                slot.conn.close("cannot watch the socket");
                self.free.push(idx);
                continue;
            }
            let handle = self.group.handle.clone();
            slot.conn
                .set_completer(Some(Completer::new(move |c| handle.io_result(token, c))));
            e.slot = Some(slot);
            // Whatever arrived meanwhile, and output a moved connection
            // brought along.
            self.service(token, epoll::EventFlags::IN, now);
        }
    }

    /// Hands DH results to their connections; a slot closed (or reused)
    /// since drops its result.
    fn take_dh_results(&mut self, now: Instant) {
        let done = std::mem::take(&mut *self.group.handle.dh_done.lock().expect("DH results lock"));
        for (token, cid, result) in done {
            let idx = (token & u64::from(u32::MAX)) as usize;
            let generation = (token >> 32) as u32;
            let Some(slot) = self
                .entries
                .get_mut(idx)
                .filter(|e| e.generation == generation)
                .and_then(|e| e.slot.as_mut())
            else {
                continue;
            };
            slot.conn.complete_dh(cid, result, now);
            self.service(token, epoll::EventFlags::empty(), now);
        }
    }

    /// Hands the completions of block requests on asynchronous backends
    /// to their connections (those still here) and serves them.
    fn take_io_results(&mut self, now: Instant) {
        let done = std::mem::take(
            &mut *self
                .group
                .handle
                .io_done
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let mut served: Vec<u64> = Vec::new();
        for (token, c) in done {
            let idx = (token & u64::from(u32::MAX)) as usize;
            let generation = (token >> 32) as u32;
            let Some(slot) = self
                .entries
                .get_mut(idx)
                .filter(|e| e.generation == generation)
                .and_then(|e| e.slot.as_mut())
            else {
                continue;
            };
            slot.conn.complete(c);
            served.push(token);
        }
        served.sort_unstable();
        served.dedup();
        for token in served {
            self.service(token, epoll::EventFlags::empty(), now);
        }
    }

    /// Hands the slot's DH jobs to the pool; a job the full queue refuses
    /// completes as busy at once.
    fn submit_dh(&mut self, idx: usize, now: Instant) {
        let e = &mut self.entries[idx];
        let token = (u64::from(e.generation) << 32) | idx as u64;
        let Some(slot) = e.slot.as_mut() else {
            return;
        };
        let mut refused = false;
        while let Some((cid, job)) = slot.conn.next_dh_job() {
            let handle = self.group.handle.clone();
            if let Err(job) = self
                .group
                .dh
                .submit_for(Arc::downgrade(&slot.alive), job, move |r| {
                    handle.dh_result(token, cid, r)
                })
            {
                drop(job);
                slot.conn.complete_dh(cid, Err(DhError::Busy), now);
                refused = true;
            }
        }
        if refused {
            slot.pump(now);
        }
    }

    /// Handles an event of the slot `token` names.
    fn service(&mut self, token: u64, flags: epoll::EventFlags, now: Instant) {
        let idx = (token & u64::from(u32::MAX)) as usize;
        let generation = (token >> 32) as u32;
        let Some(e) = self.entries.get_mut(idx) else {
            return;
        };
        if e.generation != generation {
            return;
        }
        let Some(slot) = e.slot.as_mut() else {
            return;
        };
        let readable = epoll::EventFlags::IN | epoll::EventFlags::ERR | epoll::EventFlags::HUP;
        if flags.intersects(readable) && !slot.conn.is_closed() {
            if self.scratch.is_empty() {
                self.scratch = vec![0; RX_BUF];
            }
            slot.unread = false;
            match slot.stream.read(&mut self.scratch) {
                Ok((0, _)) => slot.conn.close("host closed the connection"),
                Ok((n, more)) => {
                    slot.unread = more;
                    slot.feed(&self.scratch[..n], now);
                    if self.inputs[0].0 != token {
                        self.inputs[1] = self.inputs[0];
                    }
                    self.inputs[0] = (token, now);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => slot.conn.close(&format!("read failed: {e}")),
            }
        }
        if !self.group.io_groups.is_empty()
            && slot.load.is_none()
            && slot.conn.queue_id().is_some_and(|q| q > 0)
            && !slot.conn.is_closed()
            && !slot.conn.awaits_dh()
        {
            return self.move_to_io_group(idx);
        }
        let contended = self.inputs.iter().any(|&(t, at)| {
            t != token && t != WAKE && now.saturating_duration_since(at) < CONTENDED
        });
        slot.conn
            .set_turn(if contended { TURN } else { usize::MAX });
        slot.pump(now);
        self.settle(idx);
    }

    /// After a slot's work: closes it once its connection is over, else
    /// registers its socket for what it now waits for.
    fn settle(&mut self, idx: usize) {
        self.submit_dh(idx, Instant::now());
        let e = &mut self.entries[idx];
        let token = (u64::from(e.generation) << 32) | idx as u64;
        let Some(slot) = e.slot.as_mut() else {
            return;
        };
        if slot.conn.is_closed() {
            return self.remove(idx);
        }
        let awaits = slot.conn.awaits_io();
        if awaits != slot.awaits_io {
            slot.awaits_io = awaits;
            if awaits {
                self.awaiting += 1;
            } else {
                self.awaiting -= 1;
            }
        }
        if (slot.conn.has_requests() || slot.unread) && !slot.conn.held_back() && !slot.ready {
            slot.ready = true;
            self.ready.push(token);
        }
        match slot.conn.throttled_until() {
            Some(at) if slot.wake_at != Some(at) => {
                slot.wake_at = Some(at);
                self.timers.push(Reverse((at, token)));
            }
            Some(_) => {}
            None => slot.wake_at = None,
        }
        let want = slot.wanted();
        if want != slot.interest {
            match epoll::modify(
                &self.epoll,
                slot.stream.socket(),
                epoll::EventData::new_u64(token),
                want,
            ) {
                Ok(()) => slot.interest = want,
                Err(e) => {
                    slot.conn.close(&format!("cannot watch the socket: {e}"));
                    self.remove(idx);
                }
            }
        }
    }

    /// Sends a connected I/O queue to the least-loaded I/O group; queues
    /// of one controller, placed one after another, spread over them.
    fn move_to_io_group(&mut self, idx: usize) {
        let Some(mut slot) = self.entries[idx].slot.take() else {
            return;
        };
        self.free.push(idx);
        if std::mem::take(&mut slot.awaits_io) {
            self.awaiting -= 1;
        }
        let _ = epoll::delete(&self.epoll, slot.stream.socket());
        let groups = &self.group.io_groups;
        let qid = slot.conn.queue_id().unwrap_or(1);
        let first = usize::from(qid.saturating_sub(1)) % groups.len();
        let g = (0..groups.len())
            .map(|i| &groups[(first + i) % groups.len()])
            .min_by_key(|g| g.load.load(Ordering::Relaxed))
            .expect("at least one I/O group");
        slot.load = Some(LoadGuard::new(&g.load));
        // Its place on this group's ready list, count and timers stay
        // behind.
        slot.ready = false;
        slot.wake_at = None;
        g.hand(slot);
    }

    /// Ends a slot: sends what output the socket takes at once (a
    /// C2HTermReq, a last response), then closes the socket.
    fn remove(&mut self, idx: usize) {
        let Some(mut slot) = self.entries[idx].slot.take() else {
            return;
        };
        self.free.push(idx);
        if slot.awaits_io {
            self.awaiting -= 1;
        }
        slot.pump(Instant::now());
        tracing::debug!(peer = %slot.peer, reason = slot.conn.close_reason().unwrap_or(""), "NVMe/TCP connection closed");
        let _ = epoll::delete(&self.epoll, slot.stream.socket());
        slot.stream.shutdown();
    }

    /// Timers of every connection; closes those whose host took no byte
    /// for the write timeout. Forgets the watched backends that are gone.
    fn tick(&mut self, now: Instant) {
        for idx in 0..self.watches.len() {
            if self.watches[idx].as_ref().is_some_and(|r| r.gone()) {
                self.forget_watch(idx);
            }
        }
        for idx in 0..self.entries.len() {
            let Some(slot) = self.entries[idx].slot.as_mut() else {
                continue;
            };
            slot.conn.tick(now);
            let limit = self.group.write_timeout;
            if let Some(since) = slot.stalled_since {
                if now.saturating_duration_since(since) >= limit {
                    tracing::warn!(
                        peer = %slot.peer,
                        "the host read nothing for {limit:?}; closing the connection"
                    );
                    self.group
                        .target
                        .stats()
                        .write_timeouts
                        .fetch_add(1, Ordering::Relaxed);
                    slot.write_failed = true;
                    slot.conn.close("write timed out");
                }
            }
            // A connection quiet for a tick keeps no buffer it does not
            // need: its partial PDU's, its TLS session's.
            if !std::mem::take(&mut slot.active) {
                if slot.rx.is_empty() && slot.rx.capacity() > RX_KEEP {
                    slot.rx = Vec::new();
                }
                slot.stream.release_idle_buffers();
            }
            slot.pump(now);
            self.settle(idx);
        }
    }

    /// Ends every connection: the service is stopping.
    fn close_all(&mut self) {
        for idx in 0..self.entries.len() {
            if let Some(slot) = self.entries[idx].slot.as_mut() {
                slot.conn.close("service stopping");
                self.remove(idx);
            }
        }
        let left = std::mem::take(&mut *self.group.handle.inbox.lock().expect("inbox lock"));
        for mut slot in left {
            slot.conn.close("service stopping");
            slot.stream.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    use crate::pdu::{self, ControllerPdu, Digests, Limits};
    use crate::spec::{nvm, sgl};
    use crate::target::ram_subsystem;
    use crate::{host, Target, TargetConfig};
    use crate::{TcpConfig, TcpTransport};

    const NQN: &str = "nqn.2024-01.io.example:group";

    /// The next whole controller PDU on `s`, as (CID, answer, data): a
    /// C2HData gives its bytes, a response its status and DW0 (truncated).
    fn next(s: &mut TcpStream, buf: &mut Vec<u8>) -> (u16, Option<(u16, u16)>, Vec<u8>) {
        let limits = Limits {
            digests: Digests::default(),
            max_data: 1 << 20,
        };
        loop {
            if let Some((p, n)) = pdu::decode_controller(buf, &limits).unwrap() {
                let out = match p {
                    ControllerPdu::IcResp(_) => (0, Some((0, 0)), Vec::new()),
                    ControllerPdu::CapsuleResp { cqe } => {
                        (cqe.cid, Some((cqe.status, cqe.dw0 as u16)), Vec::new())
                    }
                    ControllerPdu::C2HData { cccid, data, .. } => (cccid, None, data.to_vec()),
                    other => panic!("unexpected PDU {other:?}"),
                };
                buf.drain(..n);
                return out;
            }
            let mut chunk = [0u8; 8192];
            let n = s.read(&mut chunk).expect("the target answers within 10 s");
            assert!(n > 0, "the target closed the connection");
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Connects queue `qid` of controller `cntlid` and sends `then` behind
    /// the Connect (and, for an admin queue, the enable) in one write.
    fn open(addr: SocketAddr, qid: u16, cntlid: u16, then: &[u8]) -> TcpStream {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = Vec::new();
        host::ic_req(&mut b, Digests::default());
        let data = host::connect_data(
            [3; 16],
            cntlid,
            NQN,
            "nqn.2014-08.org.nvmexpress:uuid:group",
        );
        pdu::encode_capsule_cmd(
            &mut b,
            Digests::default(),
            &host::connect(1, qid, 64, 0),
            &data,
        );
        if qid == 0 {
            pdu::encode_capsule_cmd(&mut b, Digests::default(), &host::enable(2), &[]);
        }
        b.extend_from_slice(then);
        s.write_all(&b).unwrap();
        s
    }

    /// A host sends its handshake, Connect and a batch of writes and reads
    /// in one go, far more than one read of the group's buffer takes: the
    /// group reads on until the socket is empty, with no new edge from
    /// epoll, and every command is answered with the right data.
    #[test]
    fn a_read_that_fills_the_buffer_is_followed_by_another_without_an_event() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let target = Target::new();
        let mut cfg = TargetConfig {
            subsystems: vec![ram_subsystem(NQN, 1 << 20, vec![any])],
            discovery: None,
        };
        let transport = TcpTransport::with_config(target.clone(), &TcpConfig::default()).unwrap();
        assert!(transport.set_listeners(&cfg.listen_addrs()).is_empty());
        let addr = transport.bound()[&any];
        cfg.subsystems[0].listeners = vec![addr];
        assert!(target.apply(&cfg).is_empty());

        let mut admin = open(addr, 0, 0xffff, &[]);
        let mut abuf = Vec::new();
        assert_eq!(next(&mut admin, &mut abuf).1, Some((0, 0)), "ICResp");
        let (_, Some((0, cntlid)), _) = next(&mut admin, &mut abuf) else {
            panic!("admin Connect refused");
        };
        assert_eq!(next(&mut admin, &mut abuf).1.map(|a| a.0), Some(0), "CC.EN");

        // 16 writes of 4 KiB in their capsules, each block its own
        // pattern, then 16 reads of them: some 70 KiB in one write.
        let mut batch = Vec::new();
        let block = |i: u16| vec![i as u8 ^ 0x5a; 4096];
        for i in 0..32u16 {
            let mut c = host::command(if i < 16 { nvm::WRITE } else { nvm::READ }, 100 + i);
            let lba = u64::from(i % 16) * 8;
            c.0[4..8].copy_from_slice(&1u32.to_le_bytes());
            c.0[40..48].copy_from_slice(&lba.to_le_bytes());
            c.0[48..50].copy_from_slice(&7u16.to_le_bytes());
            c.0[32..36].copy_from_slice(&4096u32.to_le_bytes());
            if i < 16 {
                c.0[39] = sgl::IN_CAPSULE;
                pdu::encode_capsule_cmd(&mut batch, Digests::default(), &c, &block(i));
            } else {
                pdu::encode_capsule_cmd(&mut batch, Digests::default(), &c, &[]);
            }
        }
        let mut io = open(addr, 1, cntlid, &batch);
        let mut buf = Vec::new();
        assert_eq!(next(&mut io, &mut buf).1, Some((0, 0)), "ICResp");
        assert_eq!(
            next(&mut io, &mut buf).1.map(|a| a.0),
            Some(0),
            "I/O Connect"
        );
        let mut data = vec![Vec::new(); 16];
        let mut answered = BTreeSet::new();
        while answered.len() < 32 {
            match next(&mut io, &mut buf) {
                (cid, None, bytes) => data[usize::from(cid - 116)].extend_from_slice(&bytes),
                (cid, Some((status, _)), _) => {
                    assert_eq!(status >> 1, 0, "command {cid}");
                    assert!(answered.insert(cid), "command {cid} answered twice");
                }
            }
        }
        for (i, d) in data.iter().enumerate() {
            assert!(
                *d == block(i as u16),
                "read {i} returns what write {i} wrote"
            );
        }
        drop((admin, io));
        transport.shutdown();
    }
}
