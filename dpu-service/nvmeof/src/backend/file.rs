//! [`FileBackend`]: a regular file or a block device, with `O_DIRECT`
//! where the filesystem allows it (aligned bounce buffers and range locks
//! for the read-modify-write of partial blocks).

use std::fs::File;
use std::io::{self, IoSlice, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;
use std::sync::{Condvar, Mutex, PoisonError, RwLock};

use dpu_os::backing::Identity;
use rustix::fs::{AtFlags, FallocateFlags, StatxFlags};
use rustix::io::{Errno, ReadWriteFlags};

use super::{check, lock, read, write, Backend, ZERO_CHUNK};

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
    /// The service created the file: a resize may make it smaller.
    may_shrink: bool,
    identity: Identity,
    direct: Option<Direct>,
}

impl FileBackend {
    /// Opens a backing store through `open`, which answers it opened
    /// read-write, bypassing the page cache (`O_DIRECT`) when its argument
    /// is true; what may be opened, and whether a missing file is created,
    /// is `open`'s to decide (the target's [`BackingPolicy`]). `what`
    /// names the store in logs and errors.
    ///
    /// A regular file smaller than `grow_to` is grown to it, a larger one
    /// keeps its size; a block device's size is the device's. Unless
    /// `may_shrink` (a file the service created), [`Backend::resize`]
    /// never makes the file smaller.
    ///
    /// [`BackingPolicy`]: dpu_os::backing::BackingPolicy
    pub fn open_by(
        what: &Path,
        open: &dyn Fn(bool) -> io::Result<File>,
        grow_to: Option<u64>,
        may_shrink: bool,
    ) -> io::Result<Self> {
        Self::open_by_with(what, open, grow_to, may_shrink, true)
    }

    /// [`FileBackend::open_by`], trying `O_DIRECT` only when `try_direct`.
    fn open_by_with(
        path: &Path,
        open: &dyn Fn(bool) -> io::Result<File>,
        grow_to: Option<u64>,
        may_shrink: bool,
        try_direct: bool,
    ) -> io::Result<Self> {
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
            match grow_to {
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
                // Closed first: a block device is open exclusively.
                drop(file);
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
            identity: Identity::of(&file.metadata()?),
            file,
            len: RwLock::new(len),
            block,
            may_shrink,
            direct: rules,
        })
    }

    /// The file or device opened, whatever path reached it.
    pub fn identity(&self) -> Identity {
        self.identity
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
        if new_len < *len && !self.may_shrink {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "the service did not create this file; it is never made smaller than its {} bytes",
                    *len
                ),
            ));
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::suite::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    // Named, so that it wins over the lock helper `read` that `super::*`
    // brings.
    use crate::backend::suite::read;

    impl FileBackend {
        /// Opens `path`, created with `create_len` bytes if missing (an
        /// error if `create_len` is `None`), as the target opens a file
        /// the service created.
        pub(crate) fn open(path: &Path, create_len: Option<u64>) -> io::Result<Self> {
            Self::open_with(path, create_len, true)
        }

        /// [`FileBackend::open`], trying `O_DIRECT` only when `try_direct`.
        fn open_with(path: &Path, create_len: Option<u64>, try_direct: bool) -> io::Result<Self> {
            use std::os::unix::fs::OpenOptionsExt;
            let open = |direct: bool| {
                let mut o = std::fs::OpenOptions::new();
                o.read(true)
                    .write(true)
                    .create(create_len.is_some())
                    .truncate(false);
                if direct {
                    o.custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32);
                }
                o.open(path)
            };
            Self::open_by_with(path, &open, create_len, true, try_direct)
        }
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
