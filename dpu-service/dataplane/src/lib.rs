//! Data plane of dpu-service: packet I/O, the workers that move packets,
//! and the per-tenant switch they run.
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
//! - [`wire`]: the wire format, both ways: the headers a decision needs,
//!   read in place, bounds-checked, and the ones written on the way out
//!   (802.1Q tags pushed, stripped or set; VXLAN encapsulation, and the
//!   ARP request for a VTEP not yet resolved).
//! - [`classify`]: first-match packet classification with a decision tree
//!   and incremental changes.
//!   Rule sets that fit its memory budget are also compiled to the tables
//!   of Recursive Flow Classification (`classify::rfc`), which IPv4
//!   lookups read.
//! - [`conntrack`]: connection tracking for stateful rules, per worker.
//! - [`flowcache`]: an exact-match cache of classifications, per worker.
//! - [`fragtrack`]: the fragmented datagrams whose first fragment passed,
//!   per worker, so that their later fragments pass and no others do.
//! - [`fair_share`]: fair shares of a bounded table among tenants (reserved
//!   minimum plus a shared pool), for the connection and fragment tables.
//! - `l2memo`: decisions remembered by link-layer header, per worker,
//!   for tenants that switch without looking past it.
//! - `carry`: connection and fragment entries carried over from a
//!   previous process, adopted by each worker on a miss.
//! - [`offload`]: flows handed to the switch in front of the cores (an
//!   eSwitch), through a provider and an offload thread, with a model
//!   provider that carries their traffic in-process.
//! - [`switch`]: the per-tenant switch pipeline: tenant by port and VLAN,
//!   filtering, MAC learning and flooding only within the tenant.

//!
//! It knows nothing of gRPC or the control plane: the daemon hands it a
//! [`switch::SwitchConfig`] built from control's state. Its only
//! dependencies of the project are the platform crates (`dpu-os`, and
//! `dpdk` for its DPDK driver).

#![forbid(unsafe_code)]

mod carry;
pub mod classify;
pub mod conntrack;
pub mod endpoint_queues;
pub mod fair_share;
pub mod flowcache;
pub mod fragtrack;
pub mod io;
mod l2memo;
mod linear_probe;
mod mactable;
pub mod offload;
pub mod switch;
pub mod wire;
pub mod worker;
