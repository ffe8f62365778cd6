//! Block backends: where a namespace's blocks live.
//!
//! The target runs one OS thread per NVMe/TCP queue, and many queues of many
//! hosts at once, so every backend is `Send + Sync` and takes `&self`. The
//! caller checks LBA ranges against [`Backend::len`] first, but a backend
//! still answers an error (never a panic) for a range past the end, which
//! also keeps I/O racing a [`Backend::resize`] clean.
//!
//! - [`RamBackend`]: memory, allocated lazily a segment at a time.
//! - [`FileBackend`]: a regular file or a block device, with `O_DIRECT` where
//!   the filesystem allows it.
//! - [`NullBackend`]: reads zeros and forgets writes, for benchmarks.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};

use dpdk::hint::prefetch;
use dpdk::hugemem::{HugeMem, HUGE_PAGE};
use rustix::fs::{AtFlags, FallocateFlags, OFlags, StatxFlags};
use rustix::io::{Errno, ReadWriteFlags};

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

// ---------------------------------------------------------------------------
// RAM
// ---------------------------------------------------------------------------

/// Bytes per RAM segment: one huge page.
const SEGMENT: u64 = HUGE_PAGE as u64;

/// Most bytes [`RamBackend`]'s prefetch asks for (one 4 KiB page: the
/// hardware prefetcher does not cross pages, and within one it follows a
/// stream once started).
const PREFETCH_SPAN: u64 = 4096;

/// One RAM segment: `None` until written, and again once zeroed whole.
type Segment = RwLock<Option<HugeMem>>;

/// Memory, allocated a segment (2 MiB, one huge page) at a time as it is
/// written; segments never written, or zeroed or deallocated whole, read as
/// zeros and hold no memory. Each segment has its own lock, so I/O to
/// different segments runs in parallel; the segment table's lock is taken
/// for writing only by [`Backend::resize`].
///
/// Segments ask for transparent huge pages: random 4 KiB reads over a
/// large namespace then miss the TLB once per 2 MiB rather than on almost
/// every read, which roughly halves the cost of copying the data out.
#[derive(Debug)]
pub struct RamBackend {
    /// Size in bytes; changed only under the table's write lock.
    len: AtomicU64,
    /// Segments allocated, for [`RamBackend::allocated_bytes`].
    allocated: AtomicU64,
    /// One entry per started segment of `len`. Invariant: the bytes of the
    /// last segment past `len` are zeros, so that growing exposes zeros.
    segments: RwLock<Vec<Segment>>,
}

impl RamBackend {
    /// `len` bytes of zeros, holding no memory yet.
    pub fn new(len: u64) -> Self {
        let n = usize::try_from(len.div_ceil(SEGMENT)).unwrap_or(usize::MAX);
        let mut segments = Vec::new();
        segments.resize_with(n, || RwLock::new(None));
        Self {
            len: AtomicU64::new(len),
            allocated: AtomicU64::new(0),
            segments: RwLock::new(segments),
        }
    }

    /// Memory held for data, in bytes (a multiple of the 2 MiB segment).
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed) * SEGMENT
    }

    /// Runs `f(segment, offset in the segment, range of the caller's buffer,
    /// whether the piece reaches the end of the data in the segment)` over
    /// the segments of `offset..offset + n`, under the table's read lock.
    fn each(
        &self,
        offset: u64,
        n: u64,
        mut f: impl FnMut(&Segment, usize, std::ops::Range<usize>, bool),
    ) -> io::Result<()> {
        let segs = read(&self.segments);
        let len = self.len.load(Ordering::Acquire);
        check(len, offset, n)?;
        usize::try_from(n).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut done = 0u64;
        while done < n {
            let pos = offset + done;
            let at = pos % SEGMENT;
            let k = (SEGMENT - at).min(n - done);
            let seg = usize::try_from(pos / SEGMENT)
                .ok()
                .and_then(|i| segs.get(i))
                .ok_or(OutOfRange {
                    offset,
                    len: n,
                    size: len,
                })?;
            let to_end = at + k == SEGMENT || pos + k == len;
            // In range: `at < SEGMENT` and `done + k <= n`, which fits usize.
            f(seg, at as usize, done as usize..(done + k) as usize, to_end);
            done += k;
        }
        Ok(())
    }

    /// Zeroes a range, freeing the segments it covers whole.
    fn zero(&self, offset: u64, n: u64) -> io::Result<()> {
        self.each(offset, n, |seg, at, r, to_end| {
            let mut s = write(seg);
            if at == 0 && to_end {
                // The whole segment, or all of it that lies within `len`
                // (the rest is zeros by the invariant).
                if s.take().is_some() {
                    self.allocated.fetch_sub(1, Ordering::Relaxed);
                }
            } else if let Some(d) = s.as_mut() {
                d[at..at + r.len()].fill(0);
            }
        })
    }
}

impl Backend for RamBackend {
    fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    fn kind(&self) -> &'static str {
        "ram"
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.each(offset, buf.len() as u64, |seg, at, r, _| {
            match read(seg).as_deref() {
                Some(d) => buf[r.clone()].copy_from_slice(&d[at..at + r.len()]),
                None => buf[r].fill(0),
            }
        })
    }

    fn prefetch(&self, offset: u64, len: u64) {
        // Only what the hardware prefetcher does not run ahead to on its
        // own: the lines of the first page. Never waits for a lock.
        let Ok(segs) = self.segments.try_read() else {
            return;
        };
        let at = (offset % SEGMENT) as usize;
        let Some(Ok(seg)) = usize::try_from(offset / SEGMENT)
            .ok()
            .and_then(|i| segs.get(i))
            .map(RwLock::try_read)
        else {
            return;
        };
        if let Some(d) = seg.as_deref() {
            let n = len.min(PREFETCH_SPAN) as usize;
            for line in d.get(at..at + n).unwrap_or_default().chunks(64) {
                prefetch(line);
            }
        }
    }

    fn write_at(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        let mut failed = None;
        self.each(offset, data.len() as u64, |seg, at, r, _| {
            let mut s = write(seg);
            if s.is_none() {
                match HugeMem::zeroed(SEGMENT as usize) {
                    Ok(m) => {
                        self.allocated.fetch_add(1, Ordering::Relaxed);
                        *s = Some(m);
                    }
                    Err(e) => {
                        failed.get_or_insert(e);
                        return;
                    }
                }
            }
            if let Some(d) = s.as_mut() {
                d[at..at + r.len()].copy_from_slice(&data[r]);
            }
        })?;
        failed.map_or(Ok(()), Err)
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero(offset, len)
    }

    fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero(offset, len)
    }

    fn resize(&self, new_len: u64) -> io::Result<()> {
        let n = usize::try_from(new_len.div_ceil(SEGMENT))
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too large"))?;
        let mut segs = write(&self.segments);
        let old = self.len.load(Ordering::Acquire);
        if new_len < old {
            let keep = n.min(segs.len());
            let dropped = segs.drain(keep..).filter(|s| read(s).is_some()).count() as u64;
            self.allocated.fetch_sub(dropped, Ordering::Relaxed);
            // Keep the invariant: the last segment's tail past `len` is zeros.
            let at = (new_len % SEGMENT) as usize;
            if at != 0 {
                if let Some(d) = segs
                    .last()
                    .map(write)
                    .as_deref_mut()
                    .and_then(Option::as_mut)
                {
                    d[at..].fill(0);
                }
            }
        } else {
            segs.resize_with(n, || RwLock::new(None));
        }
        self.len.store(new_len, Ordering::Release);
        Ok(())
    }

    fn volatile_write_cache(&self) -> bool {
        false
    }
}

// ---------------------------------------------------------------------------
// File or block device
// ---------------------------------------------------------------------------

/// Alignment rules for `O_DIRECT` on one file.
#[derive(Debug)]
struct Direct {
    /// Offsets and lengths must be multiples of this (a power of two).
    offset_align: u64,
    /// Buffer addresses must be multiples of this (a power of two).
    mem_align: usize,
    /// Serializes the read-modify-write of partial blocks against other
    /// writes to the same blocks.
    locks: RangeLocks,
}

/// A regular file or a block device, read and written with positional I/O.
///
/// `O_DIRECT` is tried first (bypassing the page cache); where the
/// filesystem refuses it (tmpfs on older kernels, some FUSE filesystems) the
/// file is used through the page cache. Under `O_DIRECT`, I/O whose offset,
/// length or buffer is not aligned goes through an aligned bounce buffer,
/// with a read-modify-write of partial blocks.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    /// Size in bytes. I/O holds it for reading throughout, so that
    /// [`Backend::resize`] (which holds it for writing) never races a write
    /// that would grow the file again.
    len: RwLock<u64>,
    block: bool,
    direct: Option<Direct>,
}

impl FileBackend {
    /// Opens `path`: a block device, or a regular file. A missing regular
    /// file is created with `create_len` bytes (and is an error when
    /// `create_len` is `None`); an existing file smaller than `create_len`
    /// is grown to it, a larger one keeps its size. A block device's size is
    /// the device's, whatever `create_len` says.
    pub fn open(path: &Path, create_len: Option<u64>) -> io::Result<Self> {
        Self::open_with(path, create_len, true)
    }

    /// [`FileBackend::open`], trying `O_DIRECT` only when `try_direct`.
    fn open_with(path: &Path, create_len: Option<u64>, try_direct: bool) -> io::Result<Self> {
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true)
                .write(true)
                .create(create_len.is_some())
                .truncate(false);
            if direct {
                o.custom_flags(OFlags::DIRECT.bits() as i32);
            }
            o.open(path)
        };
        let (mut file, mut direct) = match open(try_direct) {
            Ok(f) if !try_direct => (f, false),
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => {
                (open(false)?, false)
            }
            Err(e) => return Err(e),
        };
        let ft = file.metadata()?.file_type();
        let block = ft.is_block_device();
        if !block && !ft.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: neither a regular file nor a block device",
                    path.display()
                ),
            ));
        }
        let len = if block {
            file.seek(SeekFrom::End(0))?
        } else {
            let cur = file.metadata()?.len();
            match create_len {
                Some(want) if want > cur => {
                    file.set_len(want)?;
                    want
                }
                _ => cur,
            }
        };
        let mut rules = None;
        if direct {
            rules = direct_rules(&file, block);
            if rules.is_none() {
                file = open(false)?;
                direct = false;
            }
        }
        debug_assert_eq!(direct, rules.is_some());
        tracing::debug!(
            path = %path.display(),
            len,
            block,
            direct = ?rules.as_ref().map(|d| (d.offset_align, d.mem_align)),
            "backend opened"
        );
        Ok(Self {
            file,
            len: RwLock::new(len),
            block,
            direct: rules,
        })
    }

    /// True when I/O bypasses the page cache (`O_DIRECT`).
    pub fn direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Reads `buf.len()` bytes at `offset` (within `len`).
    fn read_in(&self, len: u64, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let Some(d) = &self.direct else {
            return self.file.read_exact_at(buf, offset);
        };
        if buf.is_empty() {
            return Ok(());
        }
        if d.aligned(offset, buf.len() as u64, buf.as_ptr()) {
            return self.read_direct(d, buf, offset, len);
        }
        let (start, end) = d.span(offset, buf.len() as u64);
        let mut bounce = AlignedBuf::new((end - start) as usize, d.mem_align);
        self.read_direct(d, bounce.as_mut(), start, len)?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&bounce.as_mut()[at..at + buf.len()]);
        Ok(())
    }

    /// Fills the aligned `buf` from the aligned `offset`; bytes at or past
    /// the end of the file (only possible in the last block, when `len` is
    /// not aligned) read as zeros.
    fn read_direct(&self, d: &Direct, buf: &mut [u8], offset: u64, len: u64) -> io::Result<()> {
        let valid = (len.saturating_sub(offset)).min(buf.len() as u64) as usize;
        let mut got = 0;
        while got < valid {
            match self.file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            // A direct read stops short only at the end of the file; going
            // on from an unaligned position would fail with EINVAL.
            if !(offset + got as u64).is_multiple_of(d.offset_align) {
                break;
            }
        }
        if got < valid {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file is shorter than the backend",
            ));
        }
        buf[got..].fill(0);
        Ok(())
    }

    /// Writes `data` at `offset` (within `len`).
    fn write_in(&self, len: u64, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let Some(d) = &self.direct else {
            return self.pwrite(data, offset, fua);
        };
        if data.is_empty() {
            return Ok(());
        }
        let n = data.len() as u64;
        if d.aligned(offset, n, data.as_ptr()) {
            let _g = d.locks.lock(d.blocks(offset, n), [None, None]);
            return self.pwrite(data, offset, fua);
        }
        let (start, end) = d.span(offset, n);
        let a = d.offset_align;
        let head = (!offset.is_multiple_of(a)).then_some(start / a);
        let tail = (!(offset + n).is_multiple_of(a)).then_some(end / a - 1);
        let _g = d.locks.lock(d.blocks(offset, n), [head, tail]);
        let mut bounce = AlignedBuf::new((end - start) as usize, d.mem_align);
        let b = bounce.as_mut();
        let blk = a as usize;
        if head.is_some() {
            self.read_direct(d, &mut b[..blk], start, len)?;
        }
        if tail.is_some() && (head != tail) {
            let at = b.len() - blk;
            self.read_direct(d, &mut b[at..], end - a, len)?;
        }
        let at = (offset - start) as usize;
        b[at..at + data.len()].copy_from_slice(data);
        self.pwrite(b, start, fua)?;
        if end > len && !self.block {
            // The last block of a file whose size is not aligned: the write
            // grew the file, cut it back (we hold that block's lock).
            self.file.set_len(len)?;
            if fua {
                self.file.sync_data()?;
            }
        }
        Ok(())
    }

    /// `pwrite` all of `data`; with `fua`, durable when this returns
    /// (`RWF_DSYNC`: a FUA write or a cache flush of just this write, not
    /// of the whole file).
    fn pwrite(&self, mut data: &[u8], mut offset: u64, fua: bool) -> io::Result<()> {
        if !fua {
            return self.file.write_all_at(data, offset);
        }
        while !data.is_empty() {
            match rustix::io::pwritev2(
                &self.file,
                &[IoSlice::new(data)],
                offset,
                ReadWriteFlags::DSYNC,
            ) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    data = &data[n..];
                    offset += n as u64;
                }
                Err(Errno::INTR) => {}
                Err(Errno::OPNOTSUPP | Errno::NOSYS) => {
                    self.file.write_all_at(data, offset)?;
                    return self.file.sync_data();
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// `fallocate` over a range within `len`; `Ok(false)` when the
    /// filesystem or device does not support `mode` (or this range).
    fn fallocate(&self, mode: FallocateFlags, offset: u64, n: u64) -> io::Result<bool> {
        let _g = self
            .direct
            .as_ref()
            .map(|d| d.locks.lock(d.blocks(offset, n), [None, None]));
        match rustix::fs::fallocate(&self.file, mode | FallocateFlags::KEEP_SIZE, offset, n) {
            Ok(()) => Ok(true),
            Err(Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL | Errno::NODEV) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Zeroes a range within `len`.
    fn zero_in(&self, len: u64, offset: u64, n: u64) -> io::Result<()> {
        if n == 0 || self.fallocate(FallocateFlags::ZERO_RANGE, offset, n)? {
            return Ok(());
        }
        let align = self.direct.as_ref().map_or(1, |d| d.mem_align);
        let mut zeros = AlignedBuf::new(n.min(ZERO_CHUNK) as usize, align);
        let zeros = zeros.as_mut();
        let end = offset + n;
        let mut pos = offset;
        while pos < end {
            // Chunks end on ZERO_CHUNK boundaries, so only the first and the
            // last can be unaligned.
            let k = (ZERO_CHUNK - pos % ZERO_CHUNK)
                .min(end - pos)
                .min(zeros.len() as u64);
            self.write_in(len, pos, &zeros[..k as usize], false)?;
            pos += k;
        }
        Ok(())
    }
}

/// The `O_DIRECT` rules for `file`, `None` when direct I/O does not work on
/// it after all (the open succeeded but I/O would fail).
fn direct_rules(file: &File, block: bool) -> Option<Direct> {
    let ok = |v: u64| v.is_power_of_two() && v <= 1 << 16;
    let from_statx = rustix::fs::statx(file, c"", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN)
        .ok()
        .filter(|s| StatxFlags::from_bits_retain(s.stx_mask).contains(StatxFlags::DIOALIGN))
        .map(|s| {
            (
                u64::from(s.stx_dio_offset_align),
                u64::from(s.stx_dio_mem_align),
            )
        });
    let (offset_align, mem_align) = match from_statx {
        // The kernel says this file does not do direct I/O.
        Some((0, _)) | Some((_, 0)) => return None,
        Some((o, m)) if ok(o) && ok(m) => (o, m),
        Some(_) => return None,
        // Older kernels: a block device wants its logical block size; a
        // file, the page size at worst.
        None if block => {
            let b = rustix::fs::ioctl_blksszget(file).map_or(512, u64::from);
            if !ok(b) {
                return None;
            }
            (b, b)
        }
        None => (4096, 4096),
    };
    let d = Direct {
        offset_align,
        mem_align: mem_align as usize,
        locks: RangeLocks::default(),
    };
    // Probe: some filesystems accept O_DIRECT at open and refuse the I/O.
    let mut probe = AlignedBuf::new(offset_align as usize, d.mem_align);
    match file.read_at(probe.as_mut(), 0) {
        Err(e) if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => None,
        _ => Some(d),
    }
}

impl Direct {
    /// True when I/O at `offset` of `n` bytes from `ptr` needs no bounce.
    fn aligned(&self, offset: u64, n: u64, ptr: *const u8) -> bool {
        (offset | n).is_multiple_of(self.offset_align)
            && (ptr as usize).is_multiple_of(self.mem_align)
    }

    /// `offset..offset + n` widened to aligned bounds.
    fn span(&self, offset: u64, n: u64) -> (u64, u64) {
        let a = self.offset_align;
        (offset / a * a, (offset + n).div_ceil(a) * a)
    }

    /// The blocks (first, last) of a nonempty range.
    fn blocks(&self, offset: u64, n: u64) -> (u64, u64) {
        let a = self.offset_align;
        (offset / a, (offset + n.max(1) - 1) / a)
    }
}

impl Backend for FileBackend {
    fn len(&self) -> u64 {
        *read(&self.len)
    }

    fn kind(&self) -> &'static str {
        if self.block {
            "block"
        } else {
            "file"
        }
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let len = read(&self.len);
        check(*len, offset, buf.len() as u64)?;
        self.read_in(*len, offset, buf)
    }

    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let len = read(&self.len);
        check(*len, offset, data.len() as u64)?;
        self.write_in(*len, offset, data, fua)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn write_zeroes(&self, offset: u64, n: u64) -> io::Result<()> {
        let len = read(&self.len);
        check(*len, offset, n)?;
        self.zero_in(*len, offset, n)
    }

    fn deallocate(&self, offset: u64, n: u64) -> io::Result<()> {
        let len = read(&self.len);
        check(*len, offset, n)?;
        // On a block device, PUNCH_HOLE is a zero-out that unmaps (and
        // reads as zeros, unlike a plain discard) or is refused.
        if n == 0 || self.fallocate(FallocateFlags::PUNCH_HOLE, offset, n)? {
            return Ok(());
        }
        self.zero_in(*len, offset, n)
    }

    fn resize(&self, new_len: u64) -> io::Result<()> {
        if self.block {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a block device has the size of the device",
            ));
        }
        let mut len = write(&self.len);
        self.file.set_len(new_len)?;
        *len = new_len;
        Ok(())
    }

    fn volatile_write_cache(&self) -> bool {
        // Even with O_DIRECT, writes may sit in the device's cache, and a
        // sparse file's block allocations in the filesystem's journal.
        true
    }
}

/// A heap buffer whose usable part starts at an aligned address.
struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes at an address that is a multiple of `align` (a power
    /// of two).
    fn new(len: usize, align: usize) -> Self {
        let raw = vec![0u8; len + align];
        let addr = raw.as_ptr() as usize;
        let start = addr.next_multiple_of(align) - addr;
        Self { raw, start, len }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// Locks on ranges of blocks, for the read-modify-write of partial blocks
/// under `O_DIRECT`: two holders conflict when one's partial (edge) block
/// lies in the other's range. Requests are served in arrival order among
/// those that conflict, so none starves.
#[derive(Debug, Default)]
struct RangeLocks {
    state: Mutex<RangeState>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct RangeState {
    next_id: u64,
    waiters: usize,
    /// Holders and waiters, oldest first.
    held: Vec<Held>,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    id: u64,
    first: u64,
    last: u64,
    /// Blocks written by read-modify-write.
    edges: [Option<u64>; 2],
}

impl Held {
    fn conflicts(&self, o: &Held) -> bool {
        let inside = |b: &u64, h: &Held| (h.first..=h.last).contains(b);
        self.edges.iter().flatten().any(|b| inside(b, o))
            || o.edges.iter().flatten().any(|b| inside(b, self))
    }
}

/// Releases a [`RangeLocks`] entry on drop.
struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    id: u64,
}

impl RangeLocks {
    /// Waits until no earlier entry conflicts with blocks `first..=last`
    /// whose `edges` are rewritten whole.
    fn lock(&self, (first, last): (u64, u64), edges: [Option<u64>; 2]) -> RangeGuard<'_> {
        let mut st = lock(&self.state);
        let id = st.next_id;
        st.next_id += 1;
        let me = Held {
            id,
            first,
            last,
            edges,
        };
        st.held.push(me);
        loop {
            let pos = st.held.iter().position(|h| h.id == id).unwrap_or(0);
            if !st.held[..pos].iter().any(|h| h.conflicts(&me)) {
                break;
            }
            st.waiters += 1;
            st = self.freed.wait(st).unwrap_or_else(PoisonError::into_inner);
            st.waiters -= 1;
        }
        RangeGuard { locks: self, id }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.locks.state);
        st.held.retain(|h| h.id != self.id);
        if st.waiters > 0 {
            self.locks.freed.notify_all();
        }
    }
}

// ---------------------------------------------------------------------------
// Null
// ---------------------------------------------------------------------------

/// Reads zeros, forgets writes: for benchmarks of the protocol alone.
#[derive(Debug)]
pub struct NullBackend {
    len: AtomicU64,
}

impl NullBackend {
    /// A null device of `len` bytes.
    pub fn new(len: u64) -> Self {
        Self {
            len: AtomicU64::new(len),
        }
    }
}

impl Backend for NullBackend {
    fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    fn kind(&self) -> &'static str {
        "null"
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check(self.len(), offset, buf.len() as u64)?;
        buf.fill(0);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        check(self.len(), offset, data.len() as u64)
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check(self.len(), offset, len)
    }

    fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        check(self.len(), offset, len)
    }

    fn resize(&self, new_len: u64) -> io::Result<()> {
        self.len.store(new_len, Ordering::Release);
        Ok(())
    }

    fn volatile_write_cache(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Bytes that differ at every position and between seeds.
    fn pattern(seed: u8, n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
            .map(|b| b | 1)
            .collect()
    }

    fn read(b: &dyn Backend, offset: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0xEEu8; n];
        b.read_at(offset, &mut v).expect("read");
        v
    }

    fn is_zero(v: &[u8]) -> bool {
        v.iter().all(|&x| x == 0)
    }

    /// Round trips at unaligned offsets and lengths across segment
    /// boundaries; never-written space reads zeros. Wants `len >= 4 MiB`.
    fn round_trip(b: &dyn Backend) {
        assert!(is_zero(&read(b, 0, 4 * MIB as usize)));
        let off = MIB - 1003;
        let data = pattern(1, 2 * MIB as usize + 777);
        b.write_at(off, &data, false).unwrap();
        assert_eq!(read(b, off, data.len()), data);
        // Sub-ranges at other odd offsets, and the zeros around.
        assert_eq!(read(b, off + 5, 4099), data[5..5 + 4099]);
        let around = read(b, off - 17, data.len() + 34);
        assert!(is_zero(&around[..17]) && is_zero(&around[17 + data.len()..]));
        assert_eq!(around[17..17 + data.len()], data);
        // Tiny writes, FUA, and an empty one.
        b.write_at(3, &[9, 8, 7], true).unwrap();
        b.write_at(4 * MIB - 1, &[5], false).unwrap();
        b.write_at(7, &[], false).unwrap();
        b.flush().unwrap();
        assert_eq!(read(b, 2, 5), [0, 9, 8, 7, 0]);
        assert_eq!(read(b, 4 * MIB - 2, 2), [0, 5]);
        let mut empty = [];
        b.read_at(b.len(), &mut empty).unwrap();
    }

    /// True when `r` failed with the backend's typed out-of-range error.
    fn oor(r: io::Result<()>) -> bool {
        r.as_ref().is_err_and(is_out_of_range)
    }

    /// Out-of-range I/O is an [`OutOfRange`] error, not a panic.
    fn out_of_range(b: &dyn Backend) {
        let len = b.len();
        let mut buf = [0u8; 20];
        assert!(oor(b.read_at(len - 10, &mut buf)));
        assert!(oor(b.read_at(len + 1, &mut buf[..0])));
        assert!(oor(b.read_at(u64::MAX - 5, &mut buf)));
        assert!(oor(b.write_at(len - 10, &buf, false)));
        assert!(oor(b.write_at(u64::MAX, &buf, true)));
        assert!(oor(b.write_zeroes(len - 10, 11)));
        assert!(oor(b.deallocate(len, 1)));
        assert!(oor(b.deallocate(1, u64::MAX)));
        let e = b.read_at(len - 10, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            e.get_ref().and_then(|i| i.downcast_ref::<OutOfRange>()),
            Some(&OutOfRange {
                offset: len - 10,
                len: 20,
                size: len
            })
        );
        // What was in range is untouched.
        assert!(is_zero(&read(b, len - 10, 10)));
    }

    /// write_zeroes and deallocate leave zeros, at odd bounds and whole
    /// segments. Wants `len >= 4 MiB`.
    fn zeroing(b: &dyn Backend) {
        let data = pattern(2, 4 * MIB as usize);
        b.write_at(0, &data, false).unwrap();
        let check_zeroed = |zeroed: &[(u64, u64)]| {
            let got = read(b, 0, data.len());
            for (i, (&g, &d)) in got.iter().zip(&data).enumerate() {
                let z = zeroed
                    .iter()
                    .any(|&(o, n)| (o..o + n).contains(&(i as u64)));
                assert_eq!(g, if z { 0 } else { d }, "byte {i}");
            }
        };
        b.write_zeroes(1000, 333).unwrap();
        b.write_zeroes(5, 0).unwrap();
        check_zeroed(&[(1000, 333)]);
        b.deallocate(MIB - 100, 2 * MIB + 200).unwrap();
        check_zeroed(&[(1000, 333), (MIB - 100, 2 * MIB + 200)]);
        b.write_zeroes(4 * MIB - 4096 - 7, 4096).unwrap();
        b.deallocate(512, 512).unwrap();
        b.deallocate(7, 0).unwrap();
        check_zeroed(&[
            (1000, 333),
            (MIB - 100, 2 * MIB + 200),
            (4 * MIB - 4096 - 7, 4096),
            (512, 512),
        ]);
    }

    /// Grows and shrinks; I/O past the new end fails; grown space reads
    /// zeros. Wants `len == 4 MiB`.
    fn resize(b: &dyn Backend) {
        let data = pattern(3, 100_000);
        b.write_at(4 * MIB - 100_000, &data, false).unwrap();
        let cut = 4 * MIB - 50_001;
        b.resize(cut).unwrap();
        assert_eq!(b.len(), cut);
        assert!(oor(b.read_at(cut - 10, &mut [0u8; 11])));
        assert!(oor(b.write_at(cut, &[1], false)));
        assert_eq!(read(b, 4 * MIB - 100_000, 49_999), data[..49_999]);
        b.resize(6 * MIB + 3).unwrap();
        assert_eq!(b.len(), 6 * MIB + 3);
        assert_eq!(read(b, 4 * MIB - 100_000, 49_999), data[..49_999]);
        assert!(is_zero(&read(b, cut, (6 * MIB + 3 - cut) as usize)));
        b.write_at(6 * MIB, &[1, 2, 3], false).unwrap();
        assert_eq!(read(b, 6 * MIB - 1, 4), [0, 1, 2, 3]);
        b.resize(3 * MIB).unwrap();
        b.resize(4 * MIB).unwrap();
        assert!(is_zero(&read(b, 3 * MIB, MIB as usize)));
    }

    /// Four threads write interleaved 1000-byte stripes (so neighbours share
    /// blocks and segments), then everything is verified. Wants `len >=
    /// 2 MiB`.
    fn concurrent(b: &dyn Backend) {
        const STRIPE: usize = 1000;
        let stripes = 2 * MIB as usize / STRIPE;
        std::thread::scope(|s| {
            for t in 0..4u8 {
                s.spawn(move || {
                    for i in (t as usize..stripes).step_by(4) {
                        let data = pattern(t.wrapping_mul(31) ^ i as u8, STRIPE);
                        b.write_at((i * STRIPE) as u64, &data, i % 7 == 0).unwrap();
                    }
                });
            }
        });
        let got = read(b, 0, stripes * STRIPE);
        for i in 0..stripes {
            let t = (i % 4) as u8;
            let want = pattern(t.wrapping_mul(31) ^ i as u8, STRIPE);
            assert_eq!(got[i * STRIPE..(i + 1) * STRIPE], want, "stripe {i}");
        }
    }

    /// Every generic check, each on a fresh backend from `make(4 MiB)`.
    /// Prefetch hints anywhere, in range or not, change no byte.
    fn prefetch_changes_nothing(b: &dyn Backend) {
        let len = b.len();
        let data = pattern(3, 3 * 4096);
        b.write_at(len / 2 - 4096, &data, false).unwrap();
        for (offset, n) in [
            (0, 4096),
            (len / 2 - 4096, 3 * 4096),
            (len / 2 - 1, 1 << 20),
            (len - 100, 4096),
            (len, 1),
            (len + 4096, 0),
            (u64::MAX - 5, u64::MAX),
        ] {
            b.prefetch(offset, n);
        }
        assert_eq!(read(b, len / 2 - 4096, data.len()), data);
        assert!(is_zero(&read(b, 0, 4096)));
        assert!(is_zero(&read(b, len - 100, 100)));
    }

    fn suite(make: &dyn Fn(u64) -> Box<dyn Backend>) {
        prefetch_changes_nothing(&*make(4 * MIB + 100));
        round_trip(&*make(4 * MIB));
        out_of_range(&*make(4 * MIB));
        zeroing(&*make(4 * MIB));
        resize(&*make(4 * MIB));
        concurrent(&*make(4 * MIB));
    }

    #[test]
    fn ram_suite() {
        suite(&|len| Box::new(RamBackend::new(len)));
    }

    #[test]
    fn ram_memory_is_lazy_and_freed() {
        const SEG: u64 = SEGMENT;
        let b = RamBackend::new(8 * SEG + 5);
        assert_eq!(
            (b.kind(), b.len(), b.allocated_bytes()),
            ("ram", 8 * SEG + 5, 0)
        );
        assert!(!b.volatile_write_cache());
        assert!(is_zero(&read(&b, 0, b.len() as usize)));
        assert_eq!(b.allocated_bytes(), 0);
        b.write_at(SEG - 1, &[1, 2], false).unwrap();
        assert_eq!(b.allocated_bytes(), 2 * SEG);
        b.write_at(8 * SEG, &[7; 5], false).unwrap();
        assert_eq!(b.allocated_bytes(), 3 * SEG);
        // Partial zeroing keeps a segment, whole-segment zeroing frees it.
        b.write_zeroes(0, SEG - 1).unwrap();
        b.deallocate(SEG + 1, SEG - 1).unwrap();
        assert_eq!(b.allocated_bytes(), 3 * SEG);
        assert_eq!(read(&b, SEG - 2, 4), [0, 1, 2, 0]);
        b.deallocate(0, 2 * SEG).unwrap();
        assert_eq!(b.allocated_bytes(), SEG);
        // The last, partial segment counts as whole when zeroed to the end.
        b.write_zeroes(8 * SEG, 5).unwrap();
        assert_eq!(b.allocated_bytes(), 0);
        b.write_at(3 * SEG, &[1], false).unwrap();
        b.write_at(7 * SEG, &[1], false).unwrap();
        b.resize(5 * SEG).unwrap();
        assert_eq!(b.allocated_bytes(), SEG);
        b.resize(0).unwrap();
        assert_eq!((b.len(), b.allocated_bytes()), (0, 0));
        assert!(b.is_empty());
    }

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

    /// I/O racing resizes of a RAM namespace either succeeds, with the
    /// data it wrote intact, or fails with [`OutOfRange`]; nothing panics.
    #[test]
    fn ram_io_racing_resizes() {
        let b = RamBackend::new(4 * MIB);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..3u8 {
                let (b, stop) = (&b, &stop);
                s.spawn(move || {
                    let data = pattern(t, 128 * 1024);
                    let mut back = vec![0u8; data.len()];
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        // Offsets straddling every size the resizer picks.
                        let off = (i * 77 * 1024 + u64::from(t) * 4096) % (6 * MIB);
                        i += 1;
                        match b.write_at(off, &data, false) {
                            Ok(()) => {}
                            Err(e) => {
                                assert!(is_out_of_range(&e), "{e}");
                                continue;
                            }
                        }
                        match b.read_at(off, &mut back) {
                            // Another thread may have overwritten or a
                            // shrink zeroed part of it: only check lengths.
                            Ok(()) => assert_eq!(back.len(), data.len()),
                            Err(e) => assert!(is_out_of_range(&e), "{e}"),
                        }
                    }
                });
            }
            for k in 0..200u64 {
                let size = [MIB, 6 * MIB, 3 * MIB + 4096, 5 * MIB - 512][(k % 4) as usize];
                b.resize(size).unwrap();
                std::thread::yield_now();
            }
            stop.store(true, Ordering::Relaxed);
        });
        b.resize(6 * MIB).unwrap();
        let data = pattern(9, 4096);
        b.write_at(6 * MIB - 4096, &data, true).unwrap();
        assert_eq!(read(&b, 6 * MIB - 4096, 4096), data);
    }

    #[test]
    fn null_backend() {
        let b = NullBackend::new(4096);
        assert_eq!((b.kind(), b.len()), ("null", 4096));
        b.write_at(0, &[1; 4096], true).unwrap();
        assert!(is_zero(&read(&b, 0, 4096)));
        assert!(b.write_at(1, &[1; 4096], false).is_err());
        assert!(b.read_at(4096, &mut [0]).is_err());
        b.write_zeroes(0, 4096).unwrap();
        b.deallocate(0, 10).unwrap();
        assert!(b.deallocate(4000, 100).is_err());
        b.flush().unwrap();
        b.resize(8192).unwrap();
        assert_eq!(b.len(), 8192);
        assert!(!b.volatile_write_cache());
    }

    /// A scratch directory on the real disk (under `target/`), where
    /// `O_DIRECT` usually works, unlike on tmpfs.
    fn disk_dir() -> tempfile::TempDir {
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
        tempfile::tempdir_in(&base).unwrap_or_else(|_| tempfile::tempdir().unwrap())
    }

    /// The suite on files in `dir`, opened with or without `O_DIRECT`;
    /// answers whether direct I/O was on.
    fn file_suite(dir: &Path, try_direct: bool) -> bool {
        let dir = tempfile::tempdir_in(dir).unwrap();
        let dir = dir.path();
        let n = AtomicU64::new(0);
        let direct = AtomicU64::new(0);
        suite(&|len| {
            let p = dir.join(format!("f{}", n.fetch_add(1, Ordering::Relaxed)));
            let b = FileBackend::open_with(&p, Some(len), try_direct).unwrap();
            assert_eq!((b.kind(), b.len()), ("file", len));
            assert!(b.volatile_write_cache());
            direct.fetch_add(u64::from(b.direct()), Ordering::Relaxed);
            Box::new(b)
        });
        let d = direct.load(Ordering::Relaxed);
        assert!(d == 0 || d == n.load(Ordering::Relaxed));
        d > 0
    }

    #[test]
    fn file_suite_buffered() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!file_suite(dir.path(), false));
    }

    #[test]
    fn file_suite_tmp() {
        let dir = tempfile::tempdir().unwrap();
        let direct = file_suite(dir.path(), true);
        eprintln!("{}: O_DIRECT {direct}", dir.path().display());
    }

    #[test]
    fn file_suite_disk() {
        let dir = disk_dir();
        let direct = file_suite(dir.path(), true);
        eprintln!("{}: O_DIRECT {direct}", dir.path().display());
    }

    #[test]
    fn file_suite_shm() {
        // tmpfs: O_DIRECT refused on older kernels; no ZERO_RANGE.
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            return;
        };
        let direct = file_suite(dir.path(), true);
        eprintln!("{}: O_DIRECT {direct}", dir.path().display());
        assert!(!file_suite(dir.path(), false));
    }

    #[test]
    fn file_direct_aligned_buffers() {
        for dir in [tempfile::tempdir().unwrap(), disk_dir()] {
            let b = FileBackend::open(&dir.path().join("a"), Some(4 * MIB)).unwrap();
            let Some(d) = &b.direct else {
                eprintln!("{}: no O_DIRECT, skipped", dir.path().display());
                continue;
            };
            let (a, m) = (d.offset_align as usize, d.mem_align);
            eprintln!(
                "{}: O_DIRECT, offset align {a}, memory align {m}",
                dir.path().display()
            );
            let data = pattern(6, 64 * a);
            let mut buf = AlignedBuf::new(data.len(), m.max(4096));
            buf.as_mut().copy_from_slice(&data);
            assert!(d.aligned(3 * a as u64, data.len() as u64, buf.as_mut().as_ptr()));
            b.write_at(3 * a as u64, buf.as_mut(), false).unwrap();
            b.write_at(MIB, buf.as_mut(), true).unwrap();
            let mut back = AlignedBuf::new(data.len() + 2 * a, m.max(4096));
            b.read_at(2 * a as u64, back.as_mut()).unwrap();
            assert!(is_zero(&back.as_mut()[..a]));
            assert_eq!(back.as_mut()[a..a + data.len()], data);
            assert!(is_zero(&back.as_mut()[a + data.len()..]));
            assert_eq!(read(&b, MIB + 1, data.len() - 1), data[1..]);
            // A buffer that is aligned in the file but not in memory.
            b.write_at(2 * MIB, &buf.as_mut()[1..=a], false).unwrap();
            assert_eq!(read(&b, 2 * MIB, a), data[1..=a]);
        }
    }

    #[test]
    fn file_survives_reopen_and_must_exist() {
        for dir in [tempfile::tempdir().unwrap(), disk_dir()] {
            let p = dir.path().join("ns");
            let missing = FileBackend::open(&p, None).unwrap_err();
            assert_eq!(missing.kind(), io::ErrorKind::NotFound);
            let data = pattern(4, 10_000);
            {
                let b = FileBackend::open(&p, Some(MIB)).unwrap();
                b.write_at(12_345, &data, false).unwrap();
                b.flush().unwrap();
            }
            let b = FileBackend::open(&p, None).unwrap();
            assert_eq!(b.len(), MIB);
            assert_eq!(read(&b, 12_345, data.len()), data);
            drop(b);
            // A larger create_len grows the file, a smaller one keeps it.
            assert_eq!(FileBackend::open(&p, Some(2 * MIB)).unwrap().len(), 2 * MIB);
            let b = FileBackend::open(&p, Some(4096)).unwrap();
            assert_eq!(b.len(), 2 * MIB);
            assert_eq!(read(&b, 12_345, data.len()), data);
            assert!(FileBackend::open(dir.path(), Some(1)).is_err());
        }
    }

    #[test]
    fn file_unaligned_size_keeps_its_size() {
        for dir in [tempfile::tempdir().unwrap(), disk_dir()] {
            let p = dir.path().join("odd");
            let len = MIB + 1000;
            let b = FileBackend::open(&p, Some(len)).unwrap();
            b.write_at(len - 10, &[7; 10], true).unwrap();
            b.write_at(len - 5000, &pattern(5, 4990), false).unwrap();
            b.write_zeroes(len - 3, 3).unwrap();
            assert_eq!(std::fs::metadata(&p).unwrap().len(), len);
            assert_eq!(read(&b, len - 10, 10), [7, 7, 7, 7, 7, 7, 7, 0, 0, 0]);
            assert_eq!(read(&b, len - 5000, 4990), pattern(5, 4990));
            b.resize(len + 77).unwrap();
            assert!(is_zero(&read(&b, len, 77)));
            b.write_at(len + 70, &[1; 7], false).unwrap();
            assert_eq!(std::fs::metadata(&p).unwrap().len(), len + 77);
            drop(b);
            let b = FileBackend::open(&p, None).unwrap();
            assert_eq!(b.len(), len + 77);
            assert_eq!(read(&b, len - 10, 10), [7, 7, 7, 7, 7, 7, 7, 0, 0, 0]);
        }
    }

    /// A scratch block device named by `DPU_NVMEOF_TEST_BLOCK_DEVICE` (its
    /// contents are destroyed), e.g. a loop device.
    #[test]
    #[ignore = "needs a scratch block device in DPU_NVMEOF_TEST_BLOCK_DEVICE"]
    fn block_device() {
        let Some(p) = std::env::var_os("DPU_NVMEOF_TEST_BLOCK_DEVICE") else {
            return;
        };
        let b = FileBackend::open(Path::new(&p), None).unwrap();
        let align = b.direct.as_ref().map(|d| (d.offset_align, d.mem_align));
        eprintln!("{p:?}: {} bytes, O_DIRECT alignment {align:?}", b.len());
        assert_eq!(b.kind(), "block");
        assert!(b.len() >= 4 * MIB);
        assert_eq!(
            b.resize(MIB).unwrap_err().kind(),
            io::ErrorKind::Unsupported
        );
        b.write_zeroes(0, 4 * MIB).unwrap();
        round_trip(&b);
        zeroing(&b);
        b.write_zeroes(0, 4 * MIB).unwrap();
        concurrent(&b);
        let len = b.len();
        assert!(b.read_at(len - 1, &mut [0, 0]).is_err());
        b.write_at(len - 3, &[1, 2, 3], true).unwrap();
        assert_eq!(read(&b, len - 4, 4)[1..], [1, 2, 3]);
        b.deallocate(len - 4096, 4096).unwrap();
        assert!(is_zero(&read(&b, len - 4096, 4096)));
    }
}
