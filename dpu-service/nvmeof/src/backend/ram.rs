//! [`RamBackend`]: a namespace in memory, allocated lazily a segment (one
//! huge page) at a time, from segments faulted in ahead ([`super::spares`])
//! where one is ready.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use dpu_os::cache::prefetch;
use dpu_os::hugemem::{HugeMem, HUGE_PAGE};

use super::{check, read, write, Backend, OutOfRange};

/// Bytes per RAM segment: one huge page.
const SEGMENT: u64 = HUGE_PAGE as u64;

/// [`SEGMENT`] as a length (the size of [`super::spares::global`]'s).
const SEGMENT_BYTES: usize = HUGE_PAGE;

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
    /// Where fresh segments come from first: faulted in already, so that
    /// a first write does not wait for the kernel's page faults.
    spares: super::spares::User,
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
            spares: super::spares::global().user(),
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
                // A spare faulted in already; else one in small pages,
                // whose first touches cost microseconds each rather than a
                // huge page's milliseconds at once on this thread, advised
                // to become huge pages in the background once written.
                let fresh = self
                    .spares
                    .take()
                    .map_or_else(|| HugeMem::zeroed_small(SEGMENT_BYTES), Ok);
                match fresh {
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
                d.advise_huge();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::is_out_of_range;
    use crate::backend::suite::*;
    // Named, so that it wins over the lock helper `read` that `super::*`
    // brings.
    use crate::backend::suite::read;

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
}
