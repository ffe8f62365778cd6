//! The initiator thread of one remote namespace: it brings up a
//! controller on one of the namespace's paths, serves the operations the
//! poll groups hand it over that controller's I/O queue, keeps the
//! controller alive, and when the connection fails, fails what was on it
//! and connects again.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use super::ops::{self, Dest, Geometry, Op, Todo};
use super::{out_of_range, Job, Shared};
use crate::auth::Secret;
use crate::host::{
    self, Completion, Controller, ControllerInfo, ControllerOptions, Error, HostIdentity,
    NamespaceSize, Queue, QueueOptions, Transfer,
};
use crate::spec::Status;
use crate::target::RemoteNamespace;

/// Keep-alive timeout asked of the remote controller.
const KATO: Duration = Duration::from_secs(15);
/// How often the admin queue sends Keep Alive and reads the namespace's
/// size again.
const TICK: Duration = Duration::from_secs(2);
/// How often commands are checked against their deadline.
const SWEEP: Duration = Duration::from_millis(50);
/// Largest transfer of one command (less where the remote's MDTS is).
const MAX_TRANSFER: u32 = 1 << 20;
/// Entries of the admin queue: Keep Alive and Identify at most.
const ADMIN_ENTRIES: u16 = 4;
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
    io: Queue<TcpStream>,
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
            io,
            addr,
            path,
            geometry,
        },
        size,
    ))
}

/// A command in flight on the I/O queue.
struct Cmd {
    /// Index of its operation.
    op: usize,
    into: Dest,
    /// Bytes a read brings.
    len: usize,
    deadline: Instant,
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
    /// Operations in flight, by index.
    ops: Vec<Option<Op>>,
    free: Vec<usize>,
    /// Commands of operations not yet submitted, in order.
    todo: VecDeque<Todo>,
    /// The I/O queue's commands in flight, by CID.
    cmds: Vec<Option<Cmd>>,
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
    /// The I/O and admin sockets may have bytes: `poll` said so, or the
    /// last read brought some. A socket is read only then, not on every
    /// turn.
    readable: [bool; 2],
}

impl Link {
    pub(super) fn new(s: Arc<Shared>) -> Self {
        let now = Instant::now();
        Self {
            s,
            ops: Vec::new(),
            free: Vec::new(),
            todo: VecDeque::new(),
            cmds: Vec::new(),
            admin: [None; 2],
            next_tick: now,
            last_sweep: now,
            path: 0,
            parked: VecDeque::new(),
            outage_end: None,
            readable: [true; 2],
        }
    }

    /// Serves over `conn` and its successors until the backend is dropped.
    pub(super) fn run(mut self, conn: Conn) {
        let mut conn = conn;
        loop {
            self.path = conn.path;
            let ended = self.serve(&mut conn);
            let addr = conn.addr;
            // Closing the sockets ends the remote's side of the
            // controller: its Keep Alive stops with them.
            drop(conn);
            match ended {
                Ended::Stopped => {
                    let s = self.s.clone();
                    self.fail_all(&|| s.unreachable());
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
        let entries = usize::from(c.io.pair().entries());
        self.cmds = (0..entries).map(|_| None).collect();
        self.admin = [None; 2];
        let now = Instant::now();
        self.next_tick = now + TICK;
        self.last_sweep = now;
        self.readable = [true; 2];
        while let Some(job) = self.parked.pop_front() {
            self.accept(job, &c.geometry);
        }
        loop {
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

    /// One turn of the loop: true when something moved.
    fn turn(&mut self, c: &mut Conn) -> Result<bool, Ended> {
        if self.s.stop.load(Ordering::Acquire) {
            return Err(Ended::Stopped);
        }
        let mut moved = false;
        let jobs = std::mem::take(&mut *super::lock(&self.s.inbox));
        for job in jobs {
            self.accept(job, &c.geometry);
            moved = true;
        }
        moved |= self.submit(c)?;
        // While operations keep coming the loop does not sleep, so poll
        // never says the socket has bytes: look once a turn then.
        if moved && c.io.pair().in_flight() > 0 {
            self.readable[0] = true;
        }
        c.io.send_some()?;
        c.ctrl.admin().send_some()?;
        if self.readable[0] {
            self.readable[0] = c.io.read_some()?;
            if self.readable[0] {
                moved = true;
                while let Some(done) = c.io.poll_completion()? {
                    self.complete(done);
                }
            }
        }
        if self.readable[1] {
            self.readable[1] = c.ctrl.admin().read_some()?;
            if self.readable[1] {
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
        if now.duration_since(self.last_sweep) >= SWEEP {
            self.last_sweep = now;
            let late = |d: &Option<Instant>| d.is_some_and(|d| d <= now);
            if self
                .cmds
                .iter()
                .any(|c| late(&c.as_ref().map(|c| c.deadline)))
                || self.admin.iter().any(late)
            {
                return Err(Ended::Lost(Error::Timeout));
            }
        }
        Ok(moved)
    }

    /// Waits until the wake-up eventfd or a socket has something, the
    /// next tick, or the next sweep while commands are in flight.
    fn sleep(&mut self, c: &mut Conn) -> Result<(), Error> {
        let now = Instant::now();
        let busy = self.cmds.iter().any(Option::is_some) || self.admin.iter().any(Option::is_some);
        let mut wait = self.next_tick.saturating_duration_since(now);
        if busy {
            wait = wait.min(SWEEP);
        }
        let out = |q: &Queue<TcpStream>| {
            if q.pair().has_output() {
                PollFlags::IN | PollFlags::OUT
            } else {
                PollFlags::IN
            }
        };
        let (io_flags, admin_flags) = (out(&c.io), out(c.ctrl.admin()));
        let io_fd = c.io.wire().as_fd();
        let admin_fd = c.ctrl.admin().wire().as_fd();
        let mut fds = [
            PollFd::new(&self.s.wake, PollFlags::IN),
            PollFd::new(&io_fd, io_flags),
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
        for (r, fd) in self.readable.iter_mut().zip(&fds[1..]) {
            *r |= fd.revents().intersects(bytes);
        }
        Ok(())
    }

    /// Takes a job: its operation made, its commands queued.
    fn accept(&mut self, job: Job, g: &Geometry) {
        let idx = self.free.pop().unwrap_or_else(|| {
            self.ops.push(None);
            self.ops.len() - 1
        });
        let (op, todo) = ops::plan(job.io, job.done, job.bytes, idx, g);
        self.ops[idx] = Some(op);
        if todo.is_empty() {
            self.finish_if_over(idx);
        } else {
            self.todo.push_back(todo);
        }
    }

    /// Submits queued commands while the I/O queue has room: true when
    /// one went.
    fn submit(&mut self, c: &mut Conn) -> Result<bool, Error> {
        let mut any = false;
        let deadline = Instant::now() + self.s.spec.io_timeout;
        while let Some(t) = self.todo.front_mut() {
            let Some(cid) = c.io.pair().free_cid() else {
                break;
            };
            let idx = t.op;
            let Some(cmd) = t.next(&c.geometry) else {
                self.todo.pop_front();
                continue;
            };
            if t.is_empty() {
                self.todo.pop_front();
                if let Some(op) = self.ops[idx].as_mut() {
                    op.more = false;
                }
            }
            let len = match &cmd.transfer {
                Transfer::Read(b) => b.len(),
                _ => 0,
            };
            c.io.submit(cid, cmd.sqe, cmd.transfer)?;
            if let Some(op) = self.ops[idx].as_mut() {
                op.outstanding += 1;
            }
            self.cmds[usize::from(cid)] = Some(Cmd {
                op: idx,
                into: cmd.into,
                len,
                deadline,
            });
            any = true;
        }
        Ok(any)
    }

    /// Hands a completion of the I/O queue to its operation.
    fn complete(&mut self, done: Completion) {
        let Some(cmd) = self
            .cmds
            .get_mut(usize::from(done.cid()))
            .and_then(Option::take)
        else {
            tracing::error!(cid = done.cid(), "remote completion of no command of ours");
            return;
        };
        let Some(op) = self.ops[cmd.op].as_mut() else {
            return;
        };
        op.outstanding -= 1;
        if done.is_success() {
            match cmd.into {
                Dest::Whole => {
                    if op.read_len.is_some_and(|n| done.data.len() != n) {
                        op.error.get_or_insert_with(|| short(&self.s.what));
                    }
                    op.buf = done.data;
                }
                Dest::At(at) => {
                    let part = op.buf.get_mut(at..at + cmd.len);
                    match part {
                        Some(p) if done.data.len() == p.len() => p.copy_from_slice(&done.data),
                        _ => {
                            op.error.get_or_insert_with(|| short(&self.s.what));
                        }
                    }
                }
                Dest::Nowhere => {}
            }
        } else {
            let len = self.s.len.load(Ordering::Acquire);
            op.error
                .get_or_insert_with(|| status_error(&self.s.what, done.status(), len));
        }
        self.finish_if_over(cmd.op);
    }

    /// Completes operation `idx` if nothing of it is left.
    fn finish_if_over(&mut self, idx: usize) {
        if !self.ops[idx].as_ref().is_some_and(Op::is_over) {
            return;
        }
        let Some(mut op) = self.ops[idx].take() else {
            return;
        };
        self.free.push(idx);
        let r = op.result();
        if let Some(done) = op.done.take() {
            self.s.finish(done, op.bytes, r);
        }
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

    /// Fails every operation in flight or queued on the connection with
    /// `err()`.
    fn fail_all(&mut self, err: &dyn Fn() -> io::Error) {
        self.todo.clear();
        self.cmds.iter_mut().for_each(|c| *c = None);
        self.admin = [None; 2];
        for idx in 0..self.ops.len() {
            if let Some(mut op) = self.ops[idx].take() {
                self.free.push(idx);
                if let Some(done) = op.done.take() {
                    self.s.finish(done, op.bytes, Err(err()));
                }
            }
        }
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
        self.fail_all(&|| io::Error::new(kind, msg.clone()));
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
            match connect_any(&self.s.spec, first) {
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

/// The error of a read that brought less than asked.
fn short(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("remote namespace {what} sent less data than a read asked for"),
    )
}

/// The error for a remote's failed command, of a kind the target answers
/// alike: out of range, unavailable (for statuses a host retries or fails
/// over on) or a media error.
fn status_error(what: &str, st: Status, len: u64) -> io::Error {
    let retry = matches!((st.sct, st.sc), (0, 0x07 | 0x22 | 0x82)) || st.sct == 3;
    if (st.sct, st.sc) == (0, 0x80) {
        return out_of_range(0, 0, len);
    }
    let msg = format!(
        "remote namespace {what} answered status type {} code {:#04x}",
        st.sct, st.sc
    );
    if retry {
        io::Error::new(io::ErrorKind::NotConnected, msg)
    } else {
        io::Error::other(msg)
    }
}
