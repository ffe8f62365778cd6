//! Anonymous memory that the kernel may back with transparent huge pages:
//! for large buffers read at random (the NVMe target's RAM namespaces),
//! where 4 KiB pages would cost a TLB miss, and in a VM a two-level page
//! walk, on almost every access.
//!
//! Contract: a [`HugeMem`] owns a private anonymous mapping of its length,
//! starting on a [`HUGE_PAGE`] boundary, zero-filled, whose pages the
//! kernel supplies on first touch; it reads and writes like a `[u8]` and
//! is unmapped on drop. Huge pages are asked for (`MADV_HUGEPAGE`), never
//! required: where transparent huge pages are off, the same memory comes
//! in small pages. Like the rest of this crate, it needs no DPDK.

use std::io;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use libc::c_void;

/// The huge page size mappings are aligned to (2 MiB, x86-64's and
/// 4 KiB-granule arm64's).
pub const HUGE_PAGE: usize = 2 << 20;

/// Zero-filled anonymous memory, aligned for huge pages; see the module
/// documentation.
#[derive(Debug)]
pub struct HugeMem {
    /// Start of the mapping, `HUGE_PAGE`-aligned.
    ptr: NonNull<u8>,
    /// Bytes usable, as asked for.
    len: usize,
    /// Bytes mapped: `len` rounded up to the base page size.
    mapped: usize,
    /// Whether the kernel took the huge page advice.
    advised: bool,
    /// Whether it was given (once: a kernel without transparent huge
    /// pages refuses it every time).
    asked: bool,
}

// SAFETY: a HugeMem owns its mapping alone, as a Box<[u8]> owns its
// allocation; shared access is read-only through `&[u8]`.
unsafe impl Send for HugeMem {}
// SAFETY: as above; `&HugeMem` only lends `&[u8]`.
unsafe impl Sync for HugeMem {}

impl HugeMem {
    /// `len` bytes of zeros, holding no memory until written.
    ///
    /// # Errors
    /// If `len` is zero, or the kernel refuses the mapping (out of address
    /// space or over a memory limit).
    pub fn zeroed(len: usize) -> io::Result<HugeMem> {
        let mut m = Self::zeroed_small(len)?;
        m.advise_huge();
        Ok(m)
    }

    /// As [`HugeMem::zeroed`], without the huge page advice for now: the
    /// first write to each base page faults in that page alone (a few
    /// microseconds), where a huge page's first touch makes the kernel
    /// find and zero 2 MiB at once, compacting memory to find it if need
    /// be (milliseconds). [`HugeMem::advise_huge`] later lets the
    /// kernel's background thread (khugepaged) gather the pages into huge
    /// ones.
    ///
    /// # Errors
    /// As [`HugeMem::zeroed`].
    pub fn zeroed_small(len: usize) -> io::Result<HugeMem> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a mapping of 0 bytes",
            ));
        }
        let page = page_size();
        let too_large = || io::Error::new(io::ErrorKind::OutOfMemory, "mapping too large");
        let mapped = len.checked_next_multiple_of(page).ok_or_else(too_large)?;
        // Room to place `mapped` bytes on a huge page boundary inside.
        let span = mapped.checked_add(HUGE_PAGE).ok_or_else(too_large)?;
        // SAFETY: a fresh private anonymous mapping at an address of the
        // kernel's choosing; it aliases nothing.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE_PAGE);
        let (head, tail) = (aligned - start, span - (aligned - start) - mapped);
        // The head and tail are whole base pages (start, span and mapped
        // all are), outside the part kept.
        if head > 0 {
            // SAFETY: `start..aligned` lies in the mapping made above and
            // nothing refers to it.
            unsafe { libc::munmap(raw, head) };
        }
        if tail > 0 {
            // SAFETY: `aligned + mapped..start + span` lies in the mapping
            // made above and nothing refers to it.
            unsafe { libc::munmap((aligned + mapped) as *mut c_void, tail) };
        }
        let ptr = NonNull::new(aligned as *mut u8).ok_or_else(io::Error::last_os_error)?;
        Ok(HugeMem {
            ptr,
            len,
            mapped,
            advised: false,
            asked: false,
        })
    }

    /// Asks the kernel to back the memory with huge pages: at the first
    /// touch of a huge page's range where none of it is mapped yet, and
    /// in the background for ranges mapped in small pages already.
    pub fn advise_huge(&mut self) {
        if self.asked {
            return;
        }
        self.asked = true;
        // SAFETY: `ptr..ptr + mapped` is mapped and ours; the advice
        // changes how it is backed, not what it holds.
        self.advised =
            unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.mapped, libc::MADV_HUGEPAGE) }
                == 0;
    }

    /// Whether the kernel accepted the advice to back this memory with
    /// huge pages (it may still use small ones where none is free).
    pub fn advised(&self) -> bool {
        self.advised
    }
}

impl Deref for HugeMem {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` is mapped readable for as long as
        // `self` lives, and initialised (anonymous memory reads as zeros).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for HugeMem {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, mapped writable, and `&mut self` makes
        // this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HugeMem {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours alone and no borrow of it outlives
        // `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
    }
}

/// The base page size.
fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_starts_zeroed_on_a_huge_page_boundary_and_keeps_what_is_written() {
        for len in [1, 4096, HUGE_PAGE - 1, HUGE_PAGE, 3 * HUGE_PAGE + 17] {
            let mut m = HugeMem::zeroed(len).expect("map");
            assert_eq!(m.len(), len);
            assert_eq!(m.as_ptr() as usize % HUGE_PAGE, 0, "len {len}");
            assert!(m.iter().all(|&b| b == 0), "len {len}");
            let at = [0, len / 2, len - 1];
            for i in at {
                m[i] = (i % 251) as u8 + 1;
            }
            let again: &[u8] = &m;
            for i in at {
                assert_eq!(again[i], (i % 251) as u8 + 1, "len {len}");
            }
            assert_eq!(
                again.iter().filter(|&&b| b != 0).count(),
                3.min(len),
                "len {len}"
            );
        }
    }

    #[test]
    fn huge_pages_are_asked_for_where_the_kernel_has_them() {
        let m = HugeMem::zeroed(HUGE_PAGE).expect("map");
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        if thp.is_ok_and(|s| !s.contains("[never]")) {
            assert!(m.advised());
        }
    }

    /// Mapped without the advice, memory reads and writes alike, and
    /// takes the advice afterwards, contents kept.
    #[test]
    fn small_pages_first_advice_after() {
        let mut m = HugeMem::zeroed_small(HUGE_PAGE).expect("map");
        assert!(!m.advised());
        assert_eq!(m.as_ptr() as usize % HUGE_PAGE, 0);
        m[4096..8192].fill(7);
        m.advise_huge();
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        if thp.is_ok_and(|s| !s.contains("[never]")) {
            assert!(m.advised());
        }
        assert!(m[4096..8192].iter().all(|&b| b == 7));
        assert!(m[..4096].iter().chain(&m[8192..]).all(|&b| b == 0));
    }

    #[test]
    fn empty_or_impossible_mappings_are_refused() {
        assert_eq!(
            HugeMem::zeroed(0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert!(HugeMem::zeroed(usize::MAX - 10).is_err());
        assert!(HugeMem::zeroed(1 << 62).is_err());
    }

    #[test]
    fn many_mappings_come_and_go() {
        let maps: Vec<_> = (0..64)
            .map(|_| HugeMem::zeroed(HUGE_PAGE).unwrap())
            .collect();
        let mut starts: Vec<usize> = maps.iter().map(|m| m.as_ptr() as usize).collect();
        starts.sort_unstable();
        starts.dedup();
        assert_eq!(starts.len(), 64);
    }
}
