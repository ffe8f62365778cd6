//! The platform layer: the Linux calls the data plane and the NVMe/TCP
//! target make besides DPDK's, in one audited crate.
//!
//! - [`packet`]: packet sockets (`AF_PACKET`) for the kernel driver on
//!   machines without DPDK, and interface queries.
//! - [`affinity`]: CPU affinity for data-plane workers and NVMe/TCP queue
//!   threads.
//! - [`hugemem`]: anonymous memory in transparent huge pages (RAM
//!   namespaces).
//! - [`cache`]: hints to the CPU's caches (prefetch).
//! - [`backing`]: where namespaces' backing files and block devices may
//!   live, and opening them there without following links out.
//! - [`limits`]: the open-file limit, raised for many connections.
//! - [`signal`]: waiting for SIGTERM or SIGINT without an async runtime.
//!
//! With `dpdk-sys` and `dpdk`, this is one of the three crates allowed to
//! contain `unsafe` (the workspace forbids it everywhere else); every
//! block carries a `SAFETY:` comment. Nothing here needs DPDK.

pub mod affinity;
pub mod backing;
pub mod cache;
pub mod hugemem;
pub mod limits;
pub mod packet;
pub mod signal;

/// Small helpers shared by the system-call wrappers.
mod sys {
    use std::io;

    use libc::c_int;

    /// A libc return code as a `Result`: negative means `errno` holds the
    /// error.
    pub(crate) fn cvt(rc: c_int) -> io::Result<c_int> {
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    }

    /// An `InvalidInput` error with this message.
    pub(crate) fn invalid(msg: &str) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, msg.to_string())
    }
}
