//! Storage endpoints: a TCP/IP stack with an IPv4 address and a MAC of its
//! own, placed in one tenant's network, serving NVMe/TCP.
//!
//! The crate is sans-IO and frame-based. The switch hands an [`Endpoint`]
//! the Ethernet frames addressed to it ([`Endpoint::receive`]: unicast to
//! its MAC, broadcasts such as ARP requests) and takes the frames it sends
//! ([`Endpoint::poll`]) as from a station of the tenant; the caller passes
//! the time in and asks [`Endpoint::poll_at`] when to call again. Nothing
//! here owns a socket, a thread or the clock.
//!
//! - [`config`]: the endpoint's addresses, MTU, TCP buffer sizes and
//!   budget, connection limits and write timeout, validated once.
//! - [`device`]: the smoltcp `phy::Device` over the frames handed in and
//!   out.
//! - [`endpoint`]: the interface (ARP for its own address only, IPv4,
//!   TCP), the listening ports, each bound to an NVMe-oF
//!   [`Target`](dpu_nvmeof::Target) (its I/O subsystems and discovery
//!   service, as a kernel listener serves them), and the connections.
//! - [`pool`]: socket buffer memory shared by all endpoints of a
//!   service, with a reserve for each.
//! - `session`: one TCP connection driving one sans-IO
//!   [`Connection`](dpu_nvmeof::Connection) the way the kernel transport
//!   drives it: bytes from the socket's receive buffer in, block requests
//!   run on the calling thread, output into the socket's send buffer as
//!   far as it has room, and no more reading while the output is over
//!   its budget.
//!
//! Invariants: every buffer is bounded (socket buffers by
//! [`EndpointConfig::buffer_budget`], the connection caps and, across
//! endpoints, a [`BufferPool`]; a
//! connection's partial PDU by the largest PDU, frames waiting to go out
//! by [`device::PENDING_FRAMES`]); no input frame, however malformed,
//! panics; a closed or reset connection frees its socket and its NVMe-oF
//! state. It does not depend on the data plane: the switch decides which
//! frames reach it.

#![forbid(unsafe_code)]

pub mod config;
pub mod device;
pub mod endpoint;
pub mod pool;
mod session;

pub use config::{ConfigError, EndpointConfig};
pub use endpoint::{Endpoint, EndpointError, EndpointStats};
pub use pool::BufferPool;

#[cfg(test)]
extern crate self as dpu_endpoint;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_tls;
