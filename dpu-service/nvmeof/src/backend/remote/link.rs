//! The initiator thread of one remote namespace: it brings up a
//! controller on one of the namespace's paths and hands its I/O queue to
//! the [engine](super::engine), reads the completions while no poll group
//! watches its socket (and on its deadline sweeps when one does), sends
//! what poll groups left queued, times commands out, keeps the controller alive,
//! and when the connection fails, fails what was on it and connects
//! again; operations started meanwhile wait here for the next one.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use super::ops::Geometry;
use super::{lock, Job, Shared};
use crate::auth::Secret;
use crate::host::{
    self, Completion, Controller, ControllerInfo, ControllerOptions, Error, HostIdentity,
    NamespaceSize, Queue, QueueOptions, Transfer,
};
use crate::target::RemoteNamespace;

/// Keep-alive timeout asked of the remote controller.
const KATO: Duration = Duration::from_secs(15);
/// How often the admin queue sends Keep Alive and reads the namespace's
/// size again.
const TICK: Duration = Duration::from_secs(2);
/// How often commands are checked against their deadline.
const SWEEP: Duration = Duration::from_millis(50);
/// The longest the initiator thread sleeps: poll groups submit commands
/// without waking it, so this bounds how late a command found in flight
/// is first checked against its deadline.
const NAP: Duration = Duration::from_millis(250);
/// Largest transfer of one command (less where the remote's MDTS is).
const MAX_TRANSFER: u32 = 1 << 20;
/// Entries of the admin queue: Keep Alive and Identify at most.
const ADMIN_ENTRIES: u16 = 4;
/// While a namespace is served on a path other than its first, how often
/// the paths before it are tried: the first that answers takes over.
pub(super) const FAILBACK: Duration = Duration::from_secs(5);
/// First and longest wait between attempts to connect again.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Admin command identifiers.
const KEEP_ALIVE_CID: u16 = 0;
const IDENTIFY_CID: u16 = 1;
/// Bytes of Identify data.
const IDENTIFY_LEN: usize = 4096;

/// A controller of the remote subsystem with its I/O queue.
pub(super) struct Conn {
    ctrl: Controller<TcpStream>,
    /// The I/O queue, until it is handed to the engine.
    io: Option<Queue<TcpStream>>,
    /// The I/O queue's socket, for `poll` without the engine's lock.
    io_fd: OwnedFd,
    addr: SocketAddr,
    /// Index of its path.
    path: usize,
    geometry: Geometry,
}

impl Conn {
    /// What the controller said of itself.
    pub(super) fn info(&self) -> &ControllerInfo {
        self.ctrl.info()
    }

    /// The path it is on.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The index of its path.
    pub(super) fn path(&self) -> usize {
        self.path
    }
}

/// The [`io::ErrorKind`] that tells what kind of failure `e` is.
fn kind_of(e: &Error) -> io::ErrorKind {
    match e {
        Error::Io(e) => e.kind(),
        Error::Timeout => io::ErrorKind::TimedOut,
        Error::Closed => io::ErrorKind::ConnectionAborted,
        Error::AuthRequired { .. } | Error::Auth { .. } => io::ErrorKind::PermissionDenied,
        Error::InactiveNamespace { .. } => io::ErrorKind::NotFound,
        // Invalid Namespace or Format: no such namespace there.
        Error::Status { status, .. } if (status.sct, status.sc) == (0, 0x0b) => {
            io::ErrorKind::NotFound
        }
        Error::Status { .. } => io::ErrorKind::Other,
        _ => io::ErrorKind::InvalidData,
    }
}

/// Brings up a controller on `spec`'s paths, trying them in order from
/// index `first`: the first that answers, with its namespace's size.
///
/// # Errors
/// None answered: an error naming each path and what it answered, of the
/// kind of the last answer.
pub(super) fn connect_any(
    spec: &RemoteNamespace,
    first: usize,
) -> io::Result<(Conn, NamespaceSize)> {
    let n = spec.paths.len();
    let mut why = Vec::with_capacity(n);
    let mut kind = io::ErrorKind::NotConnected;
    for k in 0..n {
        let path = (first + k) % n;
        match connect(spec, path) {
            Ok(c) => return Ok(c),
            Err(e) => {
                kind = kind_of(&e);
                why.push(format!("{}: {e}", spec.paths[path]));
            }
        }
    }
    Err(io::Error::new(
        kind,
        format!("no path answered ({})", why.join("; ")),
    ))
}

/// Brings up a controller on path `path`: admin queue, one I/O queue, the
/// namespace identified.
fn connect(spec: &RemoteNamespace, path: usize) -> Result<(Conn, NamespaceSize), Error> {
    let addr = spec.paths[path];
    let stream = |addr| -> Result<TcpStream, Error> {
        let s = TcpStream::connect_timeout(&addr, spec.connect_timeout)?;
        s.set_nodelay(true)?;
        Ok(s)
    };
    let mut host = HostIdentity::new(&spec.host_nqn, spec.host_id);
    host.secret = spec
        .dhchap_secret
        .as_deref()
        .and_then(|s| Secret::parse(s).ok());
    let opts = ControllerOptions {
        kato: KATO,
        queue: QueueOptions {
            max_data: MAX_TRANSFER,
            entries: ADMIN_ENTRIES,
            timeout: Some(spec.connect_timeout),
            ..QueueOptions::default()
        },
    };
    let mut ctrl = Controller::connect(stream(addr)?, &host, &spec.subnqn, &opts)?;
    ctrl.set_io_queues(1)?;
    let size = ctrl.identify_namespace(spec.nsid)?;
    let info = ctrl.info().clone();
    let entries = (u32::from(spec.queue_depth) + 1).min(info.max_queue_entries.max(2));
    let mut io = ctrl.io_queue(stream(addr)?, 1, entries as u16)?;
    let io_fd = OwnedFd::from(io.wire().try_clone()?);
    ctrl.admin().set_nonblocking(true)?;
    io.set_nonblocking(true)?;
    let block_shift = size.block_size.trailing_zeros();
    let max_transfer = info.max_transfer.unwrap_or(MAX_TRANSFER).min(MAX_TRANSFER);
    let max_blocks = u64::from((max_transfer >> block_shift).max(1));
    let geometry = Geometry {
        nsid: spec.nsid,
        block_shift,
        max_blocks,
        // ONCS bit 3: Write Zeroes.
        write_zeroes: info.oncs & 1 << 3 != 0,
        zeros: Arc::from(vec![0u8; (max_blocks << block_shift) as usize]),
    };
    Ok((
        Conn {
            ctrl,
            io: Some(io),
            io_fd,
            addr,
            path,
            geometry,
        },
        size,
    ))
}

/// Why [`Link::serve`] returned.
enum Ended {
    /// The backend was dropped.
    Stopped,
    /// The connection failed.
    Lost(Error),
}

impl From<Error> for Ended {
    fn from(e: Error) -> Self {
        Self::Lost(e)
    }
}

/// The initiator thread's state.
pub(super) struct Link {
    s: Arc<Shared>,
    /// Deadlines of the admin commands in flight.
    admin: [Option<Instant>; 2],
    next_tick: Instant,
    last_sweep: Instant,
    /// Index of the path last used.
    path: usize,
    /// Operations handed over while no connection was up, oldest first.
    parked: VecDeque<Job>,
    /// While no connection is up: when the outage has lasted the I/O
    /// timeout, after which nothing waits for a connection any more.
    outage_end: Option<Instant>,
    /// The admin socket may have bytes: `poll` said so, or the last read
    /// brought some. It is read only then, not on every turn.
    admin_readable: bool,
    /// A connection attempt to the paths before the one serving, under
    /// way on a thread of its own.
    probe: Option<mpsc::Receiver<Option<Conn>>>,
    /// When to try the paths before the one serving next.
    next_probe: Instant,
    /// A connection on a preferred path, waiting for what is in flight on
    /// the one serving to complete before it takes over.
    preferred: Option<Conn>,
}

impl Link {
    pub(super) fn new(s: Arc<Shared>) -> Self {
        let now = Instant::now();
        Self {
            s,
            admin: [None; 2],
            next_tick: now,
            last_sweep: now,
            path: 0,
            parked: VecDeque::new(),
            outage_end: None,
            admin_readable: true,
            probe: None,
            next_probe: now + FAILBACK,
            preferred: None,
        }
    }

    /// Serves over `conn` and its successors until the backend is dropped.
    pub(super) fn run(mut self, conn: Conn) {
        let mut conn = conn;
        loop {
            self.path = conn.path;
            let ended = self.serve(&mut conn);
            let addr = conn.addr;
            // A preferred path's connection waiting to take over goes
            // with the one that failed: reconnecting tries the paths anew.
            self.preferred = None;
            self.probe = None;
            // Closing the sockets ends the remote's side of the
            // controller: its Keep Alive stops with them.
            drop(conn);
            match ended {
                Ended::Stopped => {
                    let s = &self.s;
                    lock(&s.engine).take_down(s, &|| s.unreachable());
                    self.refuse_waiting();
                    return;
                }
                Ended::Lost(e) => self.lost(addr, &e),
            }
            match self.reconnect() {
                Some(c) => conn = c,
                None => return,
            }
        }
    }

    /// Serves operations over `c` until it fails or the backend is dropped.
    fn serve(&mut self, c: &mut Conn) -> Ended {
        self.begin(c);
        self.next_probe = Instant::now() + FAILBACK;
        loop {
            if c.path != 0 {
                self.fail_back(c);
            }
            match self.turn(c) {
                Ok(true) => {}
                Ok(false) => {
                    if let Err(e) = self.sleep(c) {
                        return Ended::Lost(e);
                    }
                }
                Err(e) => return e,
            }
        }
    }

    /// Starts serving over `c`: its I/O queue to the engine, with what
    /// waited for a connection.
    fn begin(&mut self, c: &mut Conn) {
        self.admin = [None; 2];
        let now = Instant::now();
        self.next_tick = now + TICK;
        self.last_sweep = now;
        self.admin_readable = true;
        if let Some(io) = c.io.take() {
            let mut e = lock(&self.s.engine);
            e.install(&self.s, io, c.geometry.clone());
            while let Some(job) = self.parked.pop_front() {
                e.accept(&self.s, job);
            }
        }
    }

    /// While serving on a path other than the first: every [`FAILBACK`],
    /// tries the paths before it on a thread of its own (the attempt may
    /// take the connect timeout, which the I/O here must not wait for);
    /// when one answers, stops submitting on `c`, and once what is in
    /// flight on `c` has completed, the new connection takes over and `c`
    /// closes. Nothing in flight fails for the change.
    fn fail_back(&mut self, c: &mut Conn) {
        let now = Instant::now();
        if let Some(rx) = &self.probe {
            match rx.try_recv() {
                Ok(found) => {
                    self.probe = None;
                    self.next_probe = now + FAILBACK;
                    if let Some(p) = found {
                        lock(&self.s.engine).draining = true;
                        self.preferred = Some(p);
                    }
                }
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.probe = None;
                    self.next_probe = now + FAILBACK;
                }
            }
        }
        if self.preferred.is_some() {
            if lock(&self.s.engine).busy() {
                return;
            }
            let Some(p) = self.preferred.take() else {
                return;
            };
            let old = std::mem::replace(c, p);
            self.s
                .volatile_cache
                .store(c.info().volatile_write_cache, Ordering::Release);
            self.s.path.store(c.path, Ordering::Release);
            self.path = c.path;
            self.begin(c);
            tracing::info!(
                namespace = %self.s.what,
                path = %c.addr,
                from = %old.addr,
                "remote namespace back on a preferred path"
            );
            // Closing the sockets ends the old controller.
            drop(old);
            self.next_probe = now + FAILBACK;
            return;
        }
        if self.probe.is_none() && now >= self.next_probe {
            let (tx, rx) = mpsc::channel();
            let spec = self.s.spec.clone();
            let (before, block_size) = (c.path, self.s.block_size);
            let spawned = std::thread::Builder::new()
                .name("nvmf-remote-probe".into())
                .spawn(move || {
                    let found = (0..before).find_map(|path| match connect(&spec, path) {
                        Ok((c, size)) if size.block_size == block_size => Some(c),
                        _ => None,
                    });
                    let _ = tx.send(found);
                });
            match spawned {
                Ok(_) => self.probe = Some(rx),
                Err(_) => self.next_probe = now + FAILBACK,
            }
        }
    }

    /// One turn of the loop: true when something moved.
    fn turn(&mut self, c: &mut Conn) -> Result<bool, Ended> {
        if self.s.stop.load(Ordering::Acquire) {
            return Err(Ended::Stopped);
        }
        let mut moved = false;
        let jobs = std::mem::take(&mut *lock(&self.s.inbox));
        let now = Instant::now();
        {
            let s = &self.s;
            let mut e = lock(&s.engine);
            if let Some(failed) = e.failed.take() {
                return Err(Ended::Lost(failed));
            }
            for job in jobs {
                e.accept(s, job);
                moved = true;
            }
            moved |= e.submit(s)?;
            e.send()?;
            moved |= e.receive(s)?;
            if now.duration_since(self.last_sweep) >= SWEEP {
                self.last_sweep = now;
                let late = |d: &Option<Instant>| d.is_some_and(|d| d <= now);
                if e.late(now) || self.admin.iter().any(late) {
                    return Err(Ended::Lost(Error::Timeout));
                }
            }
        }
        c.ctrl.admin().send_some()?;
        if self.admin_readable {
            self.admin_readable = c.ctrl.admin().read_some()?;
            if self.admin_readable {
                moved = true;
                while let Some(done) = c.ctrl.admin().poll_completion()? {
                    self.admin_done(done)?;
                }
            }
        }
        let now = Instant::now();
        if now >= self.next_tick {
            self.tick(c, now)?;
            moved = true;
        }
        Ok(moved)
    }

    /// Waits until the wake-up eventfd or a socket has something, the
    /// next tick, or the next sweep while commands are in flight.
    fn sleep(&mut self, c: &mut Conn) -> Result<(), Error> {
        let now = Instant::now();
        let (busy, io_out) = {
            let e = lock(&self.s.engine);
            (e.busy(), e.has_output())
        };
        let busy = busy || self.admin.iter().any(Option::is_some);
        let mut wait = self.next_tick.saturating_duration_since(now).min(NAP);
        if self.probe.is_some() {
            // The attempt's answer is looked at on the next turn.
            wait = wait.min(SWEEP);
        }
        if busy {
            wait = wait.min(SWEEP);
        }
        let flags = |out: bool| {
            if out {
                PollFlags::IN | PollFlags::OUT
            } else {
                PollFlags::IN
            }
        };
        // While poll groups watch the I/O queue, they read its
        // completions: this thread wakes for it only to send, or when it
        // breaks (HUP and ERR always wake), and reads it on its sweeps.
        let watched = self.s.watchers.load(Ordering::Acquire) > 0;
        let io_flags = match (watched, io_out) {
            (false, out) => flags(out),
            (true, true) => PollFlags::OUT,
            (true, false) => PollFlags::empty(),
        };
        let admin_flags = flags(c.ctrl.admin().pair().has_output());
        let admin_fd = c.ctrl.admin().wire().as_fd();
        let mut fds = [
            PollFd::new(&self.s.wake, PollFlags::IN),
            PollFd::new(&c.io_fd, io_flags),
            PollFd::new(&admin_fd, admin_flags),
        ];
        let t = Timespec {
            tv_sec: wait.as_secs() as _,
            tv_nsec: wait.subsec_nanos() as _,
        };
        match poll(&mut fds, Some(&t)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(Error::Io(e.into())),
        }
        if fds[0].revents().contains(PollFlags::IN) {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&self.s.wake, &mut b);
        }
        // A closed or failed socket reads too: the read says how.
        let bytes = PollFlags::IN | PollFlags::HUP | PollFlags::ERR;
        let (io_ready, admin_ready) = (
            fds[1].revents().intersects(bytes),
            fds[2].revents().intersects(bytes),
        );
        self.admin_readable |= admin_ready;
        if io_ready || (watched && busy) {
            lock(&self.s.engine).readable = true;
        }
        Ok(())
    }

    /// Sends Keep Alive, and Identify to follow the namespace's size,
    /// unless the last ones are still out (the sweep times them out).
    fn tick(&mut self, c: &mut Conn, now: Instant) -> Result<(), Error> {
        self.next_tick = now + TICK;
        if self.admin.iter().any(Option::is_some) {
            return Ok(());
        }
        let deadline = now + self.s.spec.io_timeout;
        let admin = c.ctrl.admin();
        admin.submit(KEEP_ALIVE_CID, host::keep_alive(), Transfer::None)?;
        admin.submit(
            IDENTIFY_CID,
            host::identify(0, self.s.spec.nsid),
            Transfer::Read(vec![0; IDENTIFY_LEN]),
        )?;
        self.admin = [Some(deadline); 2];
        Ok(())
    }

    /// Takes an admin completion: a failed Keep Alive, or a namespace
    /// gone or of another block size, takes the connection down.
    fn admin_done(&mut self, done: Completion) -> Result<(), Error> {
        let cid = done.cid();
        if let Some(slot) = self.admin.get_mut(usize::from(cid)) {
            *slot = None;
        }
        if !done.is_success() {
            return Err(Error::Status {
                opcode: if cid == KEEP_ALIVE_CID { 0x18 } else { 0x06 },
                status: done.status(),
            });
        }
        if cid == IDENTIFY_CID {
            let size = NamespaceSize::parse(&done.data, self.s.spec.nsid)?;
            if size.block_size != self.s.block_size {
                return Err(Error::Malformed(
                    "the remote namespace's block size changed",
                ));
            }
            self.s.set_len(size.bytes());
        }
        Ok(())
    }

    /// Fails every operation waiting for a connection (the backend is
    /// gone).
    fn refuse_waiting(&mut self) {
        self.park_inbox();
        for job in std::mem::take(&mut self.parked) {
            self.s
                .finish(job.done, job.bytes, Err(self.s.unreachable()));
        }
    }

    /// Moves the operations handed over to those waiting for a
    /// connection.
    fn park_inbox(&mut self) {
        let jobs = std::mem::take(&mut *super::lock(&self.s.inbox));
        self.parked.extend(jobs);
    }

    /// Fails the waiting operations whose wait is over: each waits at
    /// most the I/O timeout, and none past the outage's first I/O timeout
    /// (so that what waits is answered at once, not in waves of what the
    /// namespace's bound lets in); answers when the next one's wait ends.
    fn expire_parked(&mut self, now: Instant) -> Option<Instant> {
        let limit = self.s.spec.io_timeout;
        let end = self.outage_end;
        let deadline = |j: &Job| end.map_or(j.since + limit, |e| e.min(j.since + limit));
        // Jobs are in the order they started: the front's deadline is the
        // earliest.
        while self.parked.front().is_some_and(|j| deadline(j) <= now) {
            if let Some(job) = self.parked.pop_front() {
                self.s
                    .finish(job.done, job.bytes, Err(self.s.unreachable()));
            }
        }
        self.parked.front().map(deadline)
    }

    /// The connection on `addr` failed with `e`: everything on it fails
    /// as unavailable; new operations wait for the next one.
    fn lost(&mut self, addr: SocketAddr, e: &Error) {
        self.s.reachable.store(false, Ordering::Release);
        self.outage_end = Some(Instant::now() + self.s.spec.io_timeout);
        let kind = match e {
            Error::Timeout => io::ErrorKind::TimedOut,
            _ => io::ErrorKind::NotConnected,
        };
        let what = self.s.what.clone();
        let msg = format!("remote namespace {what}: path {addr}: {e}");
        lock(&self.s.engine).take_down(&self.s, &|| io::Error::new(kind, msg.clone()));
        tracing::warn!(
            namespace = %what,
            path = %addr,
            error = %e,
            "remote namespace out of reach; its I/O waits for a path, at most the I/O timeout, then answers Namespace Not Ready"
        );
    }

    /// Connects again, with backoff, the path after the one that failed
    /// first; `None` when the backend was dropped meanwhile.
    fn reconnect(&mut self) -> Option<Conn> {
        let n = self.s.spec.paths.len();
        let first = (self.path + 1) % n;
        let mut backoff = BACKOFF_FIRST;
        loop {
            if self.s.stop.load(Ordering::Acquire) {
                self.refuse_waiting();
                return None;
            }
            self.park_inbox();
            self.expire_parked(Instant::now());
            let Some(attempt) = self.attempt(first) else {
                self.refuse_waiting();
                return None;
            };
            match attempt {
                Ok((c, size)) if size.block_size == self.s.block_size => {
                    self.s.set_len(size.bytes());
                    self.s
                        .volatile_cache
                        .store(c.info().volatile_write_cache, Ordering::Release);
                    self.s.path.store(c.path, Ordering::Release);
                    self.outage_end = None;
                    self.s.reachable.store(true, Ordering::Release);
                    tracing::info!(
                        namespace = %self.s.what,
                        path = %c.addr,
                        "remote namespace reachable again"
                    );
                    return Some(c);
                }
                Ok((c, size)) => tracing::debug!(
                    namespace = %self.s.what,
                    path = %c.addr,
                    block_size = size.block_size,
                    "the remote namespace's block size changed; not served"
                ),
                Err(e) => {
                    tracing::debug!(namespace = %self.s.what, error = %e, "remote namespace: connecting again failed")
                }
            }
            self.wait_wake(backoff);
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// One attempt at the paths from index `first`, made on a thread of
    /// its own (it may take a connect timeout per path) while this one
    /// keeps answering the operations whose wait ends; `None` when the
    /// backend was dropped meanwhile (the attempt ends by itself).
    fn attempt(&mut self, first: usize) -> Option<io::Result<(Conn, NamespaceSize)>> {
        let (tx, rx) = mpsc::channel();
        let spec = self.s.spec.clone();
        let spawned = std::thread::Builder::new()
            .name("nvmf-remote-probe".into())
            .spawn(move || {
                let _ = tx.send(connect_any(&spec, first));
            });
        if spawned.is_err() {
            return Some(connect_any(&self.s.spec, first));
        }
        loop {
            match rx.recv_timeout(SWEEP) {
                Ok(r) => return Some(r),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Some(Err(io::Error::other("the connection attempt ended")))
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if self.s.stop.load(Ordering::Acquire) {
                        return None;
                    }
                    self.park_inbox();
                    self.expire_parked(Instant::now());
                }
            }
        }
    }

    /// Waits `t`, failing waiting operations as their wait ends; returns
    /// early when the backend is dropped.
    fn wait_wake(&mut self, t: Duration) {
        let deadline = Instant::now() + t;
        loop {
            let now = Instant::now();
            self.park_inbox();
            let next = self
                .expire_parked(now)
                .map_or(deadline, |d| d.min(deadline));
            let left = next.saturating_duration_since(now);
            if deadline <= now || self.s.stop.load(Ordering::Acquire) {
                return;
            }
            let mut fds = [PollFd::new(&self.s.wake, PollFlags::IN)];
            let ts = Timespec {
                tv_sec: left.as_secs() as _,
                tv_nsec: left.subsec_nanos() as _,
            };
            let _ = poll(&mut fds, Some(&ts));
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&self.s.wake, &mut b);
        }
    }
}
