//! Data plane of dpu-service: packet I/O and the workers that move packets.
//!
//! - [`io`]: one seam for every packet source and sink. A [`io::Driver`]
//!   hands out per-queue [`io::RxQueue`]/[`io::TxQueue`] handles whose
//!   packets are the driver's own buffers (DPDK mbufs, or plain byte
//!   vectors for the in-memory driver), so the worker code is generic and
//!   monomorphised: no dynamic dispatch and no copy on the packet path.
//! - [`worker`]: a poll-mode, run-to-completion loop over bursts: receive,
//!   run the [`worker::Pipeline`] on each packet, queue it for its output
//!   port, transmit, count. No locks, no allocation, no syscalls on that
//!   path; counters are per worker, single-writer, summed on read.
//!
//! What it does not do yet: tenant lookup, ACLs, connection tracking and L2
//! forwarding are pipelines to come; this crate provides the engine they
//! plug into.

#![forbid(unsafe_code)]

pub mod io;
pub mod worker;
