//! [`RemoteBackend`]: a namespace of another NVMe/TCP controller, reached
//! through the [host](crate::host) side of the protocol.
//!
//! Each remote namespace has one initiator thread ([`link`]) that brings
//! up the connection to the remote controller: its admin queue (Keep
//! Alive, and Identify Namespace to follow the size) and one I/O queue of
//! the configured depth. The I/O queue is shared under one lock
//! ([`engine`]): a poll group makes an operation's commands and sends
//! them itself ([`Backend::start`]). The first poll group to do so
//! watches the queue's socket from its own epoll ([`super::watch`]):
//! when completions arrive it reads them and hands them back through
//! their [`IoDone`], its own on its own thread, other groups' through
//! their wake-ups. The initiator thread reads them only while no poll
//! group watches (operations started elsewhere), and as a fallback on
//! its deadline sweeps. Nothing on a poll group waits on the network.
//!
//! Faults are answers: a command the remote does not complete within the
//! I/O timeout, or a connection that breaks, takes the connection down;
//! every operation on it fails as unavailable (the host sees Namespace
//! Not Ready and retries). The thread connects again with backoff, trying
//! the other paths first; while it serves on a later path it tries the
//! earlier ones every few seconds, and the first that answers takes over
//! once what is in flight has completed. Operations started while no
//! connection is up wait for one, until the outage has lasted the I/O
//! timeout (connection attempts run on a thread of their own meanwhile),
//! then fail as unavailable too, and so do those started later until a
//! connection is up: an outage shorter than the timeout is a pause to the
//! hosts, a longer one an error they retry, never a hang. What waits is
//! bounded as what is in flight is ([`Backend::has_room`]).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{epoll, eventfd, EventfdFlags};

use super::watch::{self, Ready};
use super::{check, lock, Backend, Io, IoDone, OutOfRange};
use crate::target::RemoteNamespace;

mod engine;
mod link;
mod ops;

/// Most bytes of reads and writes in flight to one remote namespace: also
/// the most memory its data holds at once.
pub const MAX_IN_FLIGHT_BYTES: u64 = 64 << 20;

/// The next remote backend's [`Ready::watch_id`].
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Initiator threads still running (their backends may be gone).
static LINKS: AtomicUsize = AtomicUsize::new(0);

/// Waits until every initiator thread has ended, for at most `limit`;
/// answers whether they all did.
pub(super) fn wait_closed(limit: Duration) -> bool {
    let t = Instant::now();
    while LINKS.load(Ordering::Acquire) > 0 {
        if t.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// An operation handed to the initiator thread.
struct Job {
    io: Io,
    done: IoDone,
    /// Bytes of data it counts in flight.
    bytes: u64,
    /// When it was started: it waits for a connection at most the I/O
    /// timeout from then.
    since: Instant,
}

/// What the backend and its initiator thread share.
struct Shared {
    spec: RemoteNamespace,
    /// `NQN nsid N`, for logs and errors.
    what: String,
    /// The remote namespace's LBA size; fixed for the backend's life.
    block_size: u32,
    /// Size in bytes, as last identified.
    len: AtomicU64,
    /// The remote's volatile write cache, as last identified.
    volatile_cache: AtomicBool,
    /// A connection is up.
    reachable: AtomicBool,
    /// Index of the path of the connection up, or of the last one.
    path: AtomicUsize,
    /// The backend was dropped: the thread ends.
    stop: AtomicBool,
    /// The I/O queue and what is in flight on it; poll groups start
    /// operations here while a connection is up.
    engine: Mutex<engine::Engine>,
    /// Operations started while no connection was up, for the initiator
    /// thread.
    inbox: Mutex<Vec<Job>>,
    /// Wakes the thread.
    wake: OwnedFd,
    /// Its [`Ready::watch_id`].
    id: u64,
    /// An epoll holding the socket of the I/O queue up (none while
    /// down): what poll groups watch, stable across connections.
    poller: OwnedFd,
    /// Poll groups watching [`Self::poller`] (0 or 1): while one does,
    /// the initiator thread leaves reading completions to it.
    watchers: AtomicUsize,
    /// Operations and bytes in flight (started, not yet completed).
    ops: AtomicUsize,
    bytes: AtomicU64,
    on_resize: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

impl Shared {
    /// The error of an operation the remote cannot take now.
    fn unreachable(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::NotConnected,
            format!("remote namespace {} is out of reach", self.what),
        )
    }

    fn wake(&self) {
        // A full counter (never reached) already means "wake up".
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// Completes `job` with `r`, counting it out of what is in flight.
    fn finish(&self, done: IoDone, bytes: u64, r: io::Result<Vec<u8>>) {
        self.ops.fetch_sub(1, Ordering::AcqRel);
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
        done(r);
    }

    /// Notes a new size; tells the target when it changed.
    fn set_len(&self, len: u64) {
        if self.len.swap(len, Ordering::AcqRel) != len {
            tracing::info!(namespace = %self.what, bytes = len, "remote namespace resized");
            if let Some(f) = lock(&self.on_resize).as_ref() {
                f();
            }
        }
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteBackend")
            .field("what", &self.what)
            .field("len", &self.len)
            .field("reachable", &self.reachable)
            .finish_non_exhaustive()
    }
}

/// A namespace of another NVMe/TCP controller.
#[derive(Debug)]
pub struct RemoteBackend {
    shared: Arc<Shared>,
}

impl RemoteBackend {
    /// Connects to `spec`'s remote namespace on the first of its paths
    /// that answers, and starts its initiator thread.
    ///
    /// # Errors
    /// The specification is invalid ([`io::ErrorKind::InvalidInput`]), or
    /// no path answered: an error naming each path and what it answered.
    pub fn open(spec: &RemoteNamespace) -> io::Result<Self> {
        spec.validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let what = format!("{} nsid {}", spec.subnqn, spec.nsid);
        let (conn, size) = link::connect_any(spec, 0)
            .map_err(|e| io::Error::new(e.kind(), format!("remote namespace {what}: {e}")))?;
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let poller = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let shared = Arc::new(Shared {
            spec: spec.clone(),
            what,
            block_size: size.block_size,
            len: AtomicU64::new(size.bytes()),
            volatile_cache: AtomicBool::new(conn.info().volatile_write_cache),
            reachable: AtomicBool::new(true),
            path: AtomicUsize::new(conn.path()),
            stop: AtomicBool::new(false),
            engine: Mutex::default(),
            inbox: Mutex::new(Vec::new()),
            wake,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            poller,
            watchers: AtomicUsize::new(0),
            ops: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
            on_resize: Mutex::new(None),
        });
        tracing::info!(
            namespace = %shared.what,
            path = %conn.addr(),
            bytes = size.bytes(),
            block_size = size.block_size,
            "remote namespace connected"
        );
        LINKS.fetch_add(1, Ordering::AcqRel);
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("nvmf-remote".into())
            .spawn(move || {
                link::Link::new(s).run(conn);
                LINKS.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            LINKS.fetch_sub(1, Ordering::AcqRel);
            return Err(e);
        }
        Ok(Self { shared })
    }

    /// Runs `io` and waits for it, within the I/O timeout and the time to
    /// connect again.
    fn call(&self, io: Io) -> io::Result<Vec<u8>> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.start(
            io,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        let s = &self.shared.spec;
        let limit = s.io_timeout + s.connect_timeout + Duration::from_secs(1);
        rx.recv_timeout(limit).unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("remote namespace {}: no answer in time", self.shared.what),
            ))
        })
    }
}

impl Drop for RemoteBackend {
    /// Tells the initiator thread to end: it fails what is in flight and
    /// closes the connection, without the dropping thread waiting.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
    }
}

/// Bytes of data `io` moves.
fn data_bytes(io: &Io) -> u64 {
    match io {
        Io::Read { buf, .. } => buf.len() as u64,
        Io::Write { data, .. } => data.len() as u64,
        _ => 0,
    }
}

impl Backend for RemoteBackend {
    fn len(&self) -> u64 {
        self.shared.len.load(Ordering::Acquire)
    }

    fn kind(&self) -> &'static str {
        "remote"
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let data = self.call(Io::Read {
            offset,
            buf: vec![0; buf.len()],
        })?;
        buf.copy_from_slice(&data);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.call(Io::Write {
            offset,
            data: data.to_vec(),
            fua,
        })
        .map(drop)
    }

    fn flush(&self) -> io::Result<()> {
        self.call(Io::Flush).map(drop)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.call(Io::WriteZeroes { offset, len }).map(drop)
    }

    fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.call(Io::Deallocate { offset, len }).map(drop)
    }

    fn resize(&self, _new_len: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a remote namespace's size is the remote's: resize it there",
        ))
    }

    fn volatile_write_cache(&self) -> bool {
        self.shared.volatile_cache.load(Ordering::Acquire)
    }

    fn asynchronous(&self) -> bool {
        true
    }

    fn has_room(&self, ops: usize, bytes: u64) -> bool {
        let s = &self.shared;
        let (o, b) = (
            s.ops.load(Ordering::Acquire),
            s.bytes.load(Ordering::Acquire),
        );
        // An idle namespace takes anything, so no request waits forever.
        o == 0 || (o + ops <= usize::from(s.spec.queue_depth) && b + bytes <= MAX_IN_FLIGHT_BYTES)
    }

    fn on_resize(&self, notify: Box<dyn Fn() + Send + Sync>) {
        *lock(&self.shared.on_resize) = Some(notify);
    }

    fn reachable(&self) -> bool {
        self.shared.reachable.load(Ordering::Acquire)
    }

    fn store_block_size(&self) -> Option<u32> {
        Some(self.shared.block_size)
    }

    fn start(&self, io: Io, done: IoDone) {
        let s = &self.shared;
        let bs = u64::from(s.block_size);
        let range = match &io {
            Io::Read { offset, buf } => Some((*offset, buf.len() as u64)),
            Io::Write { offset, data, .. } => Some((*offset, data.len() as u64)),
            Io::WriteZeroes { offset, len } | Io::Deallocate { offset, len } => {
                Some((*offset, *len))
            }
            Io::Flush => None,
        };
        if let Some((offset, n)) = range {
            if let Err(e) = check(self.len(), offset, n) {
                return done(Err(e));
            }
            if !offset.is_multiple_of(bs) || !n.is_multiple_of(bs) {
                return done(Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{offset}+{n} is not in whole blocks of {bs} bytes"),
                )));
            }
        }
        let bytes = data_bytes(&io);
        s.ops.fetch_add(1, Ordering::AcqRel);
        s.bytes.fetch_add(bytes, Ordering::AcqRel);
        let job = Job {
            io,
            done,
            bytes,
            since: Instant::now(),
        };
        // The first poll group to start an operation here reads the I/O
        // queue's completions from then on, for every group: one reader,
        // so that no group wakes for a batch another one has read. The
        // others are handed theirs as from any other thread.
        if s.watchers.load(Ordering::Acquire) == 0
            && watch::serving_here()
            && s.watchers
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            && !watch::watch_here(s.id, || s.clone())
        {
            s.watchers.fetch_sub(1, Ordering::AcqRel);
        }
        // While a connection is up, this thread makes and sends the
        // commands itself; otherwise the initiator thread takes the job.
        let job = {
            let mut e = lock(&s.engine);
            if e.is_up() {
                if e.start(s, job) {
                    drop(e);
                    s.wake();
                }
                return;
            }
            job
        };
        let first = {
            let mut q = lock(&s.inbox);
            q.push(job);
            q.len() == 1
        };
        if first {
            s.wake();
        }
    }
}

impl Ready for Shared {
    fn watch_id(&self) -> u64 {
        self.id
    }

    fn ready_fd(&self) -> BorrowedFd<'_> {
        self.poller.as_fd()
    }

    /// Reads the completions that came, then sends the commands that
    /// waited for them, as the initiator thread would.
    fn on_ready(&self) {
        let mut e = lock(&self.engine);
        if !e.is_up() {
            return;
        }
        e.readable = true;
        let r = e
            .receive(self)
            .and_then(|_| e.submit(self))
            .and_then(|_| e.send());
        let wake = match r {
            Ok(all_sent) => !all_sent,
            Err(err) => {
                e.fail(self, err);
                true
            }
        };
        drop(e);
        if wake {
            self.wake();
        }
    }

    fn gone(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn unwatched(&self) {
        self.watchers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An [`OutOfRange`] for a remote's LBA Out of Range answer.
fn out_of_range(offset: u64, len: u64, size: u64) -> io::Error {
    OutOfRange { offset, len, size }.into()
}

#[cfg(test)]
mod tests;
