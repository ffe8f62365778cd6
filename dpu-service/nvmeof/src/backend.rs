//! Block backends: where a namespace's blocks live. Connections on many
//! threads call them at once, so every backend takes `&self`.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

/// A namespace's backing store.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Size in bytes.
    fn len(&self) -> u64;
    /// True when the size is zero.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// What this is, for logs: "ram", "file", "block", "null".
    fn kind(&self) -> &'static str;
    /// Fills `buf` from `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `data` at `offset`; with `fua`, durable when this returns.
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Zeroes `len` bytes at `offset`.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Deallocates a range; it reads as zeros afterwards.
    fn deallocate(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Grows or shrinks to `new_len` bytes.
    fn resize(&self, new_len: u64) -> io::Result<()>;
    /// True when writes may sit in a volatile cache until `flush`.
    fn volatile_write_cache(&self) -> bool;
}

fn check(len: u64, offset: u64, n: u64) -> io::Result<()> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("range {offset}+{n} beyond the end ({len} bytes)"),
        )),
    }
}

/// Bytes per RAM segment.
const SEGMENT: u64 = 1 << 20;

/// One RAM segment: `None` until written.
type Segment = RwLock<Option<Box<[u8]>>>;

/// Memory, allocated a segment at a time as it is written; segments never
/// written (or deallocated) read as zeros and hold no memory.
#[derive(Debug)]
pub struct RamBackend {
    len: AtomicU64,
    segments: RwLock<Vec<Segment>>,
}

impl RamBackend {
    /// `len` bytes of zeros.
    pub fn new(len: u64) -> Self {
        let n = len.div_ceil(SEGMENT) as usize;
        Self {
            len: AtomicU64::new(len),
            segments: RwLock::new((0..n).map(|_| RwLock::new(None)).collect()),
        }
    }

    /// Memory in use, bytes.
    pub fn allocated_bytes(&self) -> u64 {
        let segs = self.segments.read().expect("segments lock");
        segs.iter()
            .filter(|s| s.read().expect("segment lock").is_some())
            .count() as u64
            * SEGMENT
    }

    /// Runs `f(segment, offset in segment, range in the caller's buffer)`
    /// over the segments of a byte range.
    fn each(
        &self,
        offset: u64,
        n: u64,
        mut f: impl FnMut(&Segment, usize, std::ops::Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        let segs = self.segments.read().expect("segments lock");
        check(self.len.load(Ordering::Acquire), offset, n)?;
        let mut done = 0u64;
        while done < n {
            let pos = offset + done;
            let (i, at) = ((pos / SEGMENT) as usize, pos % SEGMENT);
            let k = (SEGMENT - at).min(n - done);
            let seg = segs
                .get(i)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "beyond the end"))?;
            f(seg, at as usize, done as usize..(done + k) as usize)?;
            done += k;
        }
        Ok(())
    }

    fn zero(&self, offset: u64, n: u64) -> io::Result<()> {
        self.each(offset, n, |seg, at, r| {
            let mut s = seg.write().expect("segment lock");
            if r.len() as u64 == SEGMENT {
                *s = None;
            } else if let Some(buf) = s.as_mut() {
                buf[at..at + r.len()].fill(0);
            }
            Ok(())
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
        self.each(offset, buf.len() as u64, |seg, at, r| {
            let s = seg.read().expect("segment lock");
            match s.as_ref() {
                Some(d) => buf[r.clone()].copy_from_slice(&d[at..at + r.len()]),
                None => buf[r].fill(0),
            }
            Ok(())
        })
    }
    fn write_at(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        self.each(offset, data.len() as u64, |seg, at, r| {
            let mut s = seg.write().expect("segment lock");
            let d = s.get_or_insert_with(|| vec![0u8; SEGMENT as usize].into_boxed_slice());
            d[at..at + r.len()].copy_from_slice(&data[r]);
            Ok(())
        })
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
        let mut segs = self.segments.write().expect("segments lock");
        let old = self.len.load(Ordering::Acquire);
        let n = new_len.div_ceil(SEGMENT) as usize;
        if new_len < old {
            // The tail of the last kept segment must read zeros if regrown.
            let at = (new_len % SEGMENT) as usize;
            if at != 0 {
                if let Some(Some(d)) = segs
                    .get(n - 1)
                    .map(|s| s.write().expect("segment lock"))
                    .as_deref_mut()
                {
                    d[at..].fill(0);
                }
            }
        }
        segs.resize_with(n, || RwLock::new(None));
        self.len.store(new_len, Ordering::Release);
        Ok(())
    }
    fn volatile_write_cache(&self) -> bool {
        false
    }
}

/// A regular file or a block device, through the page cache.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    len: AtomicU64,
    block: bool,
}

impl FileBackend {
    /// Opens `path`; a missing regular file is created with `create_len`
    /// bytes (and is an error when `create_len` is `None`). An existing
    /// file smaller than `create_len` is grown to it.
    pub fn open(path: &Path, create_len: Option<u64>) -> io::Result<Self> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create_len.is_some())
            .truncate(false)
            .open(path)?;
        let block = file.metadata()?.file_type().is_block_device();
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
        Ok(Self {
            file,
            len: AtomicU64::new(len),
            block,
        })
    }

    fn zeros(&self, offset: u64, len: u64) -> io::Result<()> {
        check(self.len(), offset, len)?;
        let chunk = vec![0u8; (len.min(1 << 20)) as usize];
        let mut done = 0;
        while done < len {
            let k = (len - done).min(chunk.len() as u64) as usize;
            self.file.write_all_at(&chunk[..k], offset + done)?;
            done += k as u64;
        }
        Ok(())
    }
}

impl Backend for FileBackend {
    fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }
    fn kind(&self) -> &'static str {
        if self.block {
            "block"
        } else {
            "file"
        }
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check(self.len(), offset, buf.len() as u64)?;
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        check(self.len(), offset, data.len() as u64)?;
        self.file.write_all_at(data, offset)?;
        if fua {
            self.file.sync_data()?;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zeros(offset, len)
    }
    fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zeros(offset, len)
    }
    fn resize(&self, new_len: u64) -> io::Result<()> {
        if self.block {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a block device has the size of the device",
            ));
        }
        self.file.set_len(new_len)?;
        self.len.store(new_len, Ordering::Release);
        Ok(())
    }
    fn volatile_write_cache(&self) -> bool {
        true
    }
}

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
