//! A safe layer over DPDK (`dpdk-sys`). With `dpdk-sys` and `dpu-os` (the
//! Linux calls made besides DPDK), one of the three crates allowed to
//! contain `unsafe`.
//!
//! - [`Eal`]: the Environment Abstraction Layer, initialised once per
//!   process from an [`EalConfig`] and cleaned up when the last handle drops.
//! - [`Mempool`]: a packet-buffer pool; [`Mempool::in_use`] shows leaks.
//! - [`Mbuf`] owns one packet buffer and frees it on drop; [`MbufBatch`]
//!   owns a burst of them. Packet bytes are borrowed as slices.
//! - [`Port`]: an ethdev port configured with RX/TX queues (symmetric RSS
//!   when there are several), and its [`RxQueue`]/[`TxQueue`] handles.
//! - [`flow`]: flow rules in hardware (`rte_flow`), validated, created,
//!   counted, aged and destroyed.
//! - Without the `eal` feature (on by default) the crate is empty, so a
//!   workspace built without DPDK still resolves it.
//!
//! Invariants: every raw pointer handed out by DPDK is owned by exactly one
//! value here and released exactly once; errors from DPDK become
//! [`DpdkError`] at the boundary; queue handles are `!Send`, so a queue is
//! polled by the thread that took it.

#[cfg(feature = "eal")]
mod eal;
#[cfg(feature = "eal")]
mod error;
#[cfg(feature = "eal")]
pub mod flow;
#[cfg(feature = "eal")]
mod mbuf;
#[cfg(feature = "eal")]
mod mempool;
#[cfg(feature = "eal")]
mod port;

#[cfg(feature = "eal")]
pub use eal::{lcore_id, Eal, EalConfig, ThreadRegistration};
#[cfg(feature = "eal")]
pub use error::DpdkError;
#[cfg(feature = "eal")]
pub use mbuf::{Drain, Mbuf, MbufBatch};
#[cfg(feature = "eal")]
pub use mempool::Mempool;
#[cfg(feature = "eal")]
pub use port::{LinkStatus, Port, PortConfig, PortStats, RxQueue, TxQueue, SYMMETRIC_RSS_KEY};

#[cfg(feature = "eal")]
/// Version of the DPDK library in use, e.g. "DPDK 22.11.11".
pub fn version() -> String {
    // SAFETY: rte_version() returns a pointer to a static NUL-terminated
    // string and needs no initialisation.
    let p = unsafe { dpdk_sys::rte_version() };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null, static and NUL-terminated as documented above.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(feature = "eal")]
/// The last DPDK error of this thread (`rte_errno`) with its message.
pub(crate) fn last_error() -> (i32, String) {
    // SAFETY: rte_errno is a per-lcore (thread-local) integer; reading it
    // has no preconditions.
    let code = unsafe { dpdk_sys::dpdk_shim_rte_errno() };
    (code, strerror(code))
}

#[cfg(feature = "eal")]
/// DPDK's message for an error code (positive errno or RTE error).
pub(crate) fn strerror(code: i32) -> String {
    // SAFETY: rte_strerror accepts any integer and returns a pointer to a
    // static or thread-local NUL-terminated string.
    let p = unsafe { dpdk_sys::rte_strerror(code.abs()) };
    if p.is_null() {
        return format!("error {code}");
    }
    // SAFETY: non-null NUL-terminated string, copied before any other
    // DPDK call on this thread can overwrite it.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}
