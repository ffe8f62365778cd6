//! Packet-buffer pools.

use std::ffi::CString;
use std::ptr::NonNull;

use dpdk_sys as sys;

use crate::eal::Eal;
use crate::error::DpdkError;

/// A pool of packet buffers (`rte_pktmbuf_pool_create`).
#[derive(Debug)]
pub struct Mempool {
    ptr: NonNull<sys::rte_mempool>,
    name: String,
    _eal: Eal,
}

// SAFETY: a pktmbuf pool created with the default ring_mp_mc ops is safe
// for concurrent get/put from any thread, and &self methods only call
// DPDK's thread-safe counters. The pointer is owned by this value alone.
unsafe impl Send for Mempool {}
// SAFETY: as above; no method mutates the pool through &self except the
// MP/MC-safe allocation path.
unsafe impl Sync for Mempool {}

impl Mempool {
    /// Creates a pool of `count` buffers with `data_room` bytes each
    /// (headroom included; `RTE_MBUF_DEFAULT_BUF_SIZE` for standard frames)
    /// and a per-lcore cache of `cache` buffers.
    ///
    /// # Errors
    /// [`DpdkError::Mempool`] if DPDK cannot allocate the pool (e.g. the
    /// name is taken or memory is short).
    pub fn new(
        eal: &Eal,
        name: &str,
        count: u32,
        cache: u32,
        data_room: u16,
    ) -> Result<Mempool, DpdkError> {
        let c_name = CString::new(name)
            .map_err(|_| DpdkError::InvalidArgument(format!("pool name {name:?}")))?;
        // SAFETY: EAL is initialised (we hold an Eal); the name is a valid
        // C string DPDK copies; SOCKET_ID_ANY lets DPDK pick the memory.
        let p = unsafe {
            sys::rte_pktmbuf_pool_create(
                c_name.as_ptr(),
                count,
                cache,
                0,
                data_room,
                sys::SOCKET_ID_ANY,
            )
        };
        let ptr = NonNull::new(p).ok_or_else(|| {
            let (code, message) = crate::last_error();
            DpdkError::Mempool {
                name: name.to_string(),
                code,
                message,
            }
        })?;
        Ok(Mempool {
            ptr,
            name: name.to_string(),
            _eal: eal.clone(),
        })
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Buffers currently allocated from the pool (0 when nothing leaked).
    pub fn in_use(&self) -> u32 {
        // SAFETY: the pool pointer is valid for the life of self.
        unsafe { sys::rte_mempool_in_use_count(self.ptr.as_ptr()) }
    }

    /// Buffers currently free in the pool.
    pub fn available(&self) -> u32 {
        // SAFETY: the pool pointer is valid for the life of self.
        unsafe { sys::rte_mempool_avail_count(self.ptr.as_ptr()) }
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::rte_mempool {
        self.ptr.as_ptr()
    }
}

impl Drop for Mempool {
    fn drop(&mut self) {
        // A buffer still out (held by an Mbuf that outlives its pool, or by
        // a port) would be returned into freed memory: leak the pool instead.
        if self.in_use() == 0 {
            // SAFETY: no buffer of the pool is outstanding and no port holds
            // it (ports keep an Arc<Mempool>), so nothing refers to it.
            unsafe { sys::rte_mempool_free(self.ptr.as_ptr()) };
        }
    }
}
