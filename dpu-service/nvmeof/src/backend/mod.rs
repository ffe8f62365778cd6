//! Block backends: where a namespace's blocks live.
//!
//! The target's poll groups serve many queues of many hosts at once, each
//! on its own thread, so every backend is `Send + Sync` and takes `&self`. The
//! caller checks LBA ranges against [`Backend::len`] first, but a backend
//! still answers an error (never a panic) for a range past the end, which
//! also keeps I/O racing a [`Backend::resize`] clean.
//!
//! - [`RamBackend`]: memory, allocated lazily a segment at a time.
//! - [`FileBackend`]: a regular file or a block device, with `O_DIRECT` where
//!   the filesystem allows it.
//! - [`NullBackend`]: reads zeros and forgets writes, for benchmarks.
//! - `RbdBackend` (feature `rbd`): an image of a Ceph cluster, through
//!   librbd; [asynchronous](Backend::asynchronous).
//! - [`RemoteBackend`]: a namespace of another NVMe/TCP controller, through
//!   the [host](crate::host) side of the protocol; asynchronous.
//!
//! A backend in memory or on a local disk answers on the calling thread.
//! One whose I/O waits on the network is asynchronous: a transport starts
//! its operations with [`Backend::start`] and goes on serving while they
//! run, the completion arriving later from another thread.

use std::io;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};

mod file;
mod null;
mod ram;
#[cfg(feature = "rbd")]
pub mod rbd;
mod remote;
pub mod spares;
#[cfg(test)]
mod suite;
pub(crate) mod watch;

pub use file::FileBackend;
pub use null::NullBackend;
pub use ram::RamBackend;
pub use remote::RemoteBackend;

/// Waits until every backend dropped so far has let go of its store
/// (RBD images close on threads of their own, remote namespaces end their
/// initiator threads), for at most `limit`;
/// answers whether they all did. A program calls it last, after
/// dropping its target, so that its images release their locks before
/// the process ends.
pub fn wait_closed(limit: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    let remote = remote::wait_closed(limit);
    #[cfg(feature = "rbd")]
    return remote && rbd::wait_closed(limit.saturating_sub(start.elapsed()));
    #[cfg(not(feature = "rbd"))]
    {
        let _ = start;
        remote
    }
}

/// One operation of [`Backend::start`].
#[derive(Debug)]
pub enum Io {
    /// Read `buf.len()` bytes at `offset` into `buf` (every byte of it).
    Read {
        /// Byte offset.
        offset: u64,
        /// Where the data goes; handed back filled.
        buf: Vec<u8>,
    },
    /// Write `data` at `offset`, durable on completion with `fua`.
    Write {
        /// Byte offset.
        offset: u64,
        /// The data; handed back for reuse.
        data: Vec<u8>,
        /// Force unit access.
        fua: bool,
    },
    /// Make every completed write durable.
    Flush,
    /// Zero `len` bytes at `offset`.
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Deallocate `len` bytes at `offset` (they then read as zeros).
    Deallocate {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

/// Called once with the result of a [`Backend::start`]: the buffer (the
/// data read, the data written, or empty), or the failure. It may run on
/// any thread, also before `start` returns, and must only hand the result
/// on.
pub type IoDone = Box<dyn FnOnce(io::Result<Vec<u8>>) + Send>;

/// A namespace's backing store.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Size in bytes.
    fn len(&self) -> u64;
    /// True when the size is zero.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// What this is, for logs and the API: "ram", "file", "block", "null".
    fn kind(&self) -> &'static str;
    /// Fills `buf` from `offset`: every byte of it, or fails. Read buffers
    /// are reused across commands, so a byte left untouched would send
    /// an earlier command's data.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Hints that `len` bytes at `offset` are read soon, so that a backend
    /// in memory starts bringing them into the cache while the caller does
    /// other work. Changes nothing but speed; by default does nothing.
    fn prefetch(&self, offset: u64, len: u64) {
        let _ = (offset, len);
    }
    /// Writes `data` at `offset`; with `fua`, the data is durable when this
    /// returns.
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Zeroes `len` bytes at `offset`.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Deallocates (TRIM) `len` bytes at `offset`; afterwards the range reads
    /// as zeros, for every backend here.
    fn deallocate(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Grows or shrinks to `new_len` bytes (RAM and file; a block device
    /// answers an [`io::ErrorKind::Unsupported`] error). Safe while other
    /// threads do I/O: I/O past the new end fails cleanly.
    fn resize(&self, new_len: u64) -> io::Result<()>;
    /// True when writes may sit in a volatile cache until [`Backend::flush`],
    /// i.e. the controller should report a volatile write cache.
    fn volatile_write_cache(&self) -> bool;
    /// True when I/O waits on the network: a transport should then
    /// [`Backend::start`] operations rather than call the blocking methods
    /// from a thread that serves other connections.
    fn asynchronous(&self) -> bool {
        false
    }
    /// Whether `ops` more operations of `bytes` in all may start now on an
    /// [asynchronous](Backend::asynchronous) backend without passing its
    /// bound on what is in flight; a caller that is told no keeps the
    /// request and asks again later (a completion makes room). By default
    /// there is always room.
    fn has_room(&self, ops: usize, bytes: u64) -> bool {
        let _ = (ops, bytes);
        true
    }
    /// Asks to have `notify` called whenever the size changes by a hand
    /// other than [`Backend::resize`] (another client of a shared store).
    /// By default sizes only change through `resize`: nothing to call.
    fn on_resize(&self, notify: Box<dyn Fn() + Send + Sync>) {
        let _ = notify;
    }
    /// False while the store is out of reach (its last I/O found it so,
    /// see [`is_unavailable`]); a local store always answers true.
    fn reachable(&self) -> bool {
        true
    }
    /// The block size the store itself addresses, where it has one (a
    /// remote namespace's LBA size): a namespace on it must use a multiple
    /// of it. By default any block size will do.
    fn store_block_size(&self) -> Option<u32> {
        None
    }
    /// Starts `io`; `done` gets its result. By default runs it on the
    /// calling thread through the blocking methods, before returning.
    fn start(&self, io: Io, done: IoDone) {
        done(run_blocking(self, io));
    }
}

/// Runs `io` through `b`'s blocking methods.
fn run_blocking<B: Backend + ?Sized>(b: &B, io: Io) -> io::Result<Vec<u8>> {
    match io {
        Io::Read { offset, mut buf } => b.read_at(offset, &mut buf).map(|()| buf),
        Io::Write { offset, data, fua } => b.write_at(offset, &data, fua).map(|()| data),
        Io::Flush => b.flush().map(|()| Vec::new()),
        Io::WriteZeroes { offset, len } => b.write_zeroes(offset, len).map(|()| Vec::new()),
        Io::Deallocate { offset, len } => b.deallocate(offset, len).map(|()| Vec::new()),
    }
}

/// A range that does not lie within the backend, carried inside the
/// [`io::Error`] (kind [`io::ErrorKind::InvalidInput`]) that every backend
/// answers for it. The size may have changed since the caller checked it
/// (a resize racing the I/O), so callers tell this apart from a media error
/// with [`is_out_of_range`] and answer LBA Out of Range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("range {offset}+{len} beyond the end ({size} bytes)")]
pub struct OutOfRange {
    /// Byte offset asked for.
    pub offset: u64,
    /// Bytes asked for.
    pub len: u64,
    /// The backend's size at the time.
    pub size: u64,
}

impl From<OutOfRange> for io::Error {
    fn from(e: OutOfRange) -> Self {
        io::Error::new(io::ErrorKind::InvalidInput, e)
    }
}

/// True when `e` is a backend's [`OutOfRange`] answer.
pub fn is_out_of_range(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<OutOfRange>())
}

/// True when `e` says the store is out of reach rather than broken: a
/// store on the network that did not answer in time, or whose connection
/// is gone. The I/O may succeed later; a host should retry it, or try
/// another path.
pub fn is_unavailable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut
            | io::ErrorKind::NotConnected
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable
    )
}

/// Checks that `offset..offset + n` lies within `len` bytes.
fn check(len: u64, offset: u64, n: u64) -> io::Result<()> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(OutOfRange {
            offset,
            len: n,
            size: len,
        }
        .into()),
    }
}

/// Read-locks, ignoring poison: the data behind these locks is plain bytes
/// with no invariant a panicking holder could have broken.
fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks, ignoring poison (see [`read`]).
fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// Locks, ignoring poison (see [`read`]).
fn lock<T>(l: &Mutex<T>) -> MutexGuard<'_, T> {
    l.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Bytes in the largest chunk of zeros written at once, and so the most
/// memory a zeroing fallback allocates.
const ZERO_CHUNK: u64 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_range_errors_are_out_of_range() {
        assert!(!is_out_of_range(&io::Error::other("disk on fire")));
        assert!(!is_out_of_range(&io::Error::from(
            io::ErrorKind::InvalidInput
        )));
        assert!(!is_out_of_range(&io::Error::new(
            io::ErrorKind::InvalidInput,
            "beyond the end"
        )));
        let e: io::Error = OutOfRange {
            offset: 1,
            len: 2,
            size: 0,
        }
        .into();
        assert!(is_out_of_range(&e));
        assert_eq!(e.to_string(), "range 1+2 beyond the end (0 bytes)");
    }
}
