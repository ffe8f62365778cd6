//! Packet buffers: one owned [`Mbuf`], or a burst in an [`MbufBatch`].

use std::ptr::NonNull;

use dpdk_sys as sys;

use crate::error::DpdkError;
use crate::mempool::Mempool;

/// One packet buffer, owned: freed back to its pool on drop.
///
/// Only the first segment's bytes are exposed; the ports here are set up
/// without scatter-gather, so received packets have one segment.
#[derive(Debug)]
#[repr(transparent)]
pub struct Mbuf {
    ptr: NonNull<sys::rte_mbuf>,
}

// SAFETY: an mbuf is plain memory owned by exactly one Mbuf; moving that
// ownership to another thread is sound, and freeing from any thread is
// safe for the MP/MC pools this crate creates.
unsafe impl Send for Mbuf {}

impl Mbuf {
    /// Takes one buffer from `pool`.
    ///
    /// # Errors
    /// [`DpdkError::NoBuffers`] if the pool is empty.
    pub fn alloc(pool: &Mempool) -> Result<Mbuf, DpdkError> {
        // SAFETY: the pool pointer is valid while `pool` is borrowed.
        let p = unsafe { sys::dpdk_shim_rte_pktmbuf_alloc(pool.as_ptr()) };
        NonNull::new(p)
            .map(|ptr| Mbuf { ptr })
            .ok_or(DpdkError::NoBuffers)
    }

    /// Wraps a raw mbuf.
    ///
    /// # Safety
    /// `p` must be a valid mbuf that nothing else owns or frees.
    pub(crate) unsafe fn from_raw(p: NonNull<sys::rte_mbuf>) -> Mbuf {
        Mbuf { ptr: p }
    }

    /// Gives up ownership without freeing.
    pub(crate) fn into_raw(self) -> *mut sys::rte_mbuf {
        let p = self.ptr.as_ptr();
        std::mem::forget(self);
        p
    }

    /// Start of the first segment's data: `rte_pktmbuf_mtod`, as a field
    /// read (buf_addr + data_off) rather than a call into the shim.
    fn data_ptr(&self) -> *mut u8 {
        // SAFETY: the mbuf is valid and owned by self; buf_addr and data_off
        // are fields of struct rte_mbuf whose offsets bindgen's layout
        // assertions check at compile time against the headers in use; the
        // sum stays inside the mbuf's buffer by DPDK's own invariant.
        unsafe {
            let m = self.ptr.as_ptr();
            (*m).buf_addr
                .cast::<u8>()
                .add(usize::from(sys::fields::mbuf_data_off(m)))
        }
    }

    /// Length of the first segment's data (`rte_pktmbuf_data_len`).
    pub fn data_len(&self) -> usize {
        // SAFETY: valid, owned mbuf; data_len is a layout-checked field.
        usize::from(unsafe { sys::fields::mbuf_data_len(self.ptr.as_ptr()) })
    }

    /// The packet bytes of the first segment.
    pub fn data(&self) -> &[u8] {
        // SAFETY: data_ptr points at data_len initialised bytes inside the
        // mbuf's buffer, which live as long as the borrow of self.
        unsafe { std::slice::from_raw_parts(self.data_ptr(), self.data_len()) }
    }

    /// The packet bytes of the first segment, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `data`, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.data_ptr(), self.data_len()) }
    }

    /// Grows the packet by `len` bytes at the end and returns them.
    ///
    /// # Errors
    /// [`DpdkError::NoRoom`] if the tailroom is smaller than `len`.
    pub fn append(&mut self, len: usize) -> Result<&mut [u8], DpdkError> {
        let tailroom = self.tailroom();
        let n = u16::try_from(len)
            .ok()
            .filter(|n| usize::from(*n) <= tailroom);
        let n = n.ok_or(DpdkError::NoRoom {
            len,
            room: tailroom,
        })?;
        // SAFETY: the mbuf is owned and valid; n fits the tailroom, so
        // append succeeds and returns a pointer to n writable bytes.
        unsafe {
            let p = sys::dpdk_shim_rte_pktmbuf_append(self.ptr.as_ptr(), n).cast::<u8>();
            if p.is_null() {
                return Err(DpdkError::NoRoom {
                    len,
                    room: tailroom,
                });
            }
            Ok(std::slice::from_raw_parts_mut(p, len))
        }
    }

    /// Grows the packet by `len` bytes at the front and returns the whole
    /// first segment, new bytes first.
    ///
    /// # Errors
    /// [`DpdkError::NoRoom`] if the headroom is smaller than `len`.
    pub fn prepend(&mut self, len: usize) -> Result<&mut [u8], DpdkError> {
        let headroom = self.headroom();
        let n = u16::try_from(len)
            .ok()
            .filter(|n| usize::from(*n) <= headroom);
        let n = n.ok_or(DpdkError::NoRoom {
            len,
            room: headroom,
        })?;
        // SAFETY: the mbuf is owned and valid; n fits the headroom, so
        // prepend only moves data_off back and grows the lengths.
        let p = unsafe { sys::dpdk_shim_rte_pktmbuf_prepend(self.ptr.as_ptr(), n) };
        if p.is_null() {
            return Err(DpdkError::NoRoom {
                len,
                room: headroom,
            });
        }
        Ok(self.data_mut())
    }

    /// Removes `len` bytes from the front of the packet. Returns false
    /// (and changes nothing) if the first segment is shorter.
    pub fn trim_front(&mut self, len: usize) -> bool {
        let Ok(n) = u16::try_from(len) else {
            return false;
        };
        if len > self.data_len() {
            return false;
        }
        // SAFETY: the mbuf is owned and valid and n is at most its first
        // segment's length, the precondition of rte_pktmbuf_adj.
        !unsafe { sys::dpdk_shim_rte_pktmbuf_adj(self.ptr.as_ptr(), n) }.is_null()
    }

    /// Bytes free in front of the data.
    pub fn headroom(&self) -> usize {
        // SAFETY: the mbuf is valid and owned by self.
        usize::from(unsafe { sys::dpdk_shim_rte_pktmbuf_headroom(self.ptr.as_ptr()) })
    }

    /// A copy of the whole packet in a new buffer of the same pool.
    ///
    /// # Errors
    /// [`DpdkError::NoBuffers`] if the pool is empty.
    pub fn try_clone(&self) -> Result<Mbuf, DpdkError> {
        // SAFETY: the mbuf is valid; rte_pktmbuf_copy only reads it and
        // returns a new mbuf (owned by the caller) or NULL.
        let p = unsafe { sys::dpdk_shim_rte_pktmbuf_copy(self.ptr.as_ptr()) };
        NonNull::new(p)
            .map(|ptr| Mbuf { ptr })
            .ok_or(DpdkError::NoBuffers)
    }

    /// Bytes that can still be appended.
    pub fn tailroom(&self) -> usize {
        // SAFETY: the mbuf is valid and owned by self.
        usize::from(unsafe { sys::dpdk_shim_rte_pktmbuf_tailroom(self.ptr.as_ptr()) })
    }

    /// Total packet length over all segments.
    pub fn pkt_len(&self) -> u32 {
        // SAFETY: valid, owned mbuf; pkt_len is a layout-checked field.
        unsafe { sys::fields::mbuf_pkt_len(self.ptr.as_ptr()) }
    }

    /// Number of segments.
    pub fn segments(&self) -> u16 {
        // SAFETY: valid, owned mbuf; nb_segs is a layout-checked field.
        unsafe { sys::fields::mbuf_nb_segs(self.ptr.as_ptr()) }
    }

    /// The input port the packet arrived on.
    pub fn port(&self) -> u16 {
        // SAFETY: valid, owned mbuf; port is a layout-checked field.
        unsafe { sys::fields::mbuf_port(self.ptr.as_ptr()) }
    }

    /// The RSS hash the NIC computed (0 if none).
    pub fn rss_hash(&self) -> u32 {
        // SAFETY: the mbuf is valid and owned by self.
        unsafe { sys::dpdk_shim_rte_mbuf_rss_hash(self.ptr.as_ptr()) }
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: self owns the mbuf and it is freed exactly once, here.
        unsafe { sys::dpdk_shim_rte_pktmbuf_free(self.ptr.as_ptr()) };
    }
}

/// A burst of owned mbufs (at most [`MbufBatch::CAPACITY`]); whatever is
/// still in the batch when it drops is freed in bulk.
#[derive(Debug)]
pub struct MbufBatch {
    ptrs: [*mut sys::rte_mbuf; MbufBatch::CAPACITY],
    len: usize,
}

// SAFETY: the batch owns its mbufs exclusively (see Mbuf's Send).
unsafe impl Send for MbufBatch {}

impl Default for MbufBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl MbufBatch {
    /// Largest burst a batch holds.
    pub const CAPACITY: usize = 64;

    /// An empty batch.
    pub fn new() -> Self {
        Self {
            ptrs: [std::ptr::null_mut(); Self::CAPACITY],
            len: 0,
        }
    }

    /// Mbufs in the batch.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the batch holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True if the batch cannot take more.
    pub fn is_full(&self) -> bool {
        self.len == Self::CAPACITY
    }

    /// Adds an mbuf; gives it back if the batch is full.
    ///
    /// # Errors
    /// The mbuf itself, when the batch is full.
    pub fn push(&mut self, m: Mbuf) -> Result<(), Mbuf> {
        if self.is_full() {
            return Err(m);
        }
        self.ptrs[self.len] = m.into_raw();
        self.len += 1;
        Ok(())
    }

    /// The mbufs, in order.
    pub fn as_slice(&self) -> &[Mbuf] {
        // SAFETY: Mbuf is repr(transparent) over NonNull<rte_mbuf>, which has
        // the layout of *mut rte_mbuf; entries 0..len are non-null mbufs
        // owned by the batch, borrowed for the life of &self.
        unsafe { std::slice::from_raw_parts(self.ptrs.as_ptr().cast::<Mbuf>(), self.len) }
    }

    /// The mbufs, in order, writable.
    pub fn as_mut_slice(&mut self) -> &mut [Mbuf] {
        // SAFETY: as in as_slice; &mut self makes the borrow exclusive, and
        // a caller cannot move an Mbuf out of a &mut slice without swapping
        // another valid Mbuf in.
        unsafe { std::slice::from_raw_parts_mut(self.ptrs.as_mut_ptr().cast::<Mbuf>(), self.len) }
    }

    /// Removes every mbuf, in order; those the iterator does not yield
    /// are freed when it drops.
    pub fn drain(&mut self) -> Drain<'_> {
        let end = std::mem::take(&mut self.len);
        Drain {
            ptrs: &mut self.ptrs[..end],
            pos: 0,
        }
    }

    /// Keeps the mbufs for which `keep` returns true (in order) and frees the others.
    pub fn retain(&mut self, mut keep: impl FnMut(&mut Mbuf) -> bool) {
        let mut kept = 0;
        for i in 0..self.len {
            let Some(p) = NonNull::new(self.ptrs[i]) else {
                continue;
            };
            // SAFETY: entry i is an owned mbuf; it is either moved to slot
            // `kept` (<= i) or freed when `m` drops, never both.
            let mut m = unsafe { Mbuf::from_raw(p) };
            if keep(&mut m) {
                self.ptrs[kept] = m.into_raw();
                kept += 1;
            }
        }
        self.len = kept;
    }

    /// Raw view of the free tail, for `rx_burst`.
    pub(crate) fn spare(&mut self) -> (*mut *mut sys::rte_mbuf, u16) {
        let free = u16::try_from(Self::CAPACITY - self.len).unwrap_or(0);
        // SAFETY: len <= CAPACITY, so the offset stays inside the array.
        (unsafe { self.ptrs.as_mut_ptr().add(self.len) }, free)
    }

    /// Records that `n` mbufs were written into the spare tail.
    pub(crate) fn filled(&mut self, n: u16) {
        self.len = (self.len + usize::from(n)).min(Self::CAPACITY);
    }

    /// Raw view of the owned entries, for `tx_burst`.
    pub(crate) fn owned(&mut self) -> (*mut *mut sys::rte_mbuf, u16) {
        (self.ptrs.as_mut_ptr(), u16::try_from(self.len).unwrap_or(0))
    }

    /// Forgets the first `n` entries (the driver took them) and moves the
    /// rest to the front.
    pub(crate) fn consumed(&mut self, n: u16) {
        let n = usize::from(n).min(self.len);
        self.ptrs.copy_within(n..self.len, 0);
        self.len -= n;
    }
}

impl Drop for MbufBatch {
    fn drop(&mut self) {
        if self.len > 0 {
            let n = u32::try_from(self.len).unwrap_or(0);
            // SAFETY: entries 0..len are owned, non-null mbufs, freed once here.
            unsafe { sys::rte_pktmbuf_free_bulk(self.ptrs.as_mut_ptr(), n) };
        }
    }
}

/// Iterator of [`MbufBatch::drain`].
#[derive(Debug)]
pub struct Drain<'a> {
    ptrs: &'a mut [*mut sys::rte_mbuf],
    pos: usize,
}

impl Iterator for Drain<'_> {
    type Item = Mbuf;

    fn next(&mut self) -> Option<Mbuf> {
        let p = NonNull::new(*self.ptrs.get(self.pos)?)?;
        self.pos += 1;
        // SAFETY: the batch gave up entries 0..end to this iterator (its
        // length is 0); each is handed out once, as pos only grows.
        Some(unsafe { Mbuf::from_raw(p) })
    }
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        let rest = &mut self.ptrs[self.pos..];
        if !rest.is_empty() {
            let n = u32::try_from(rest.len()).unwrap_or(0);
            // SAFETY: entries pos.. are owned and were not handed out.
            unsafe { sys::rte_pktmbuf_free_bulk(rest.as_mut_ptr(), n) };
        }
    }
}
