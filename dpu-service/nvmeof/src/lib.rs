//! NVMe-over-Fabrics target of dpu-service.
//!
//! The protocol is a sans-IO state machine: a [`conn::Connection`] takes the
//! bytes a host sent and returns the bytes to send back plus the block
//! requests to run; a transport ([`tcp`]) moves the bytes over kernel TCP
//! sockets and runs the block requests against a [`backend::Backend`].
//!
//! - [`pdu`]: NVMe/TCP PDU framing, header and data digests.
//! - [`spec`]: submission/completion queue entries, opcodes, status codes.
//! - [`identify`]: Identify data structures and log pages.
//! - [`backend`]: block backends (RAM, file or block device, null).
//! - [`target`]: subsystems, namespaces and controllers being served.
//! - [`conn`]: one connection (queue): fabrics, admin and NVM commands.
//! - [`host`]: host-side command capsules (Connect, enable) for initiators.
//! - [`auth`]: in-band authentication (DH-HMAC-CHAP): secrets, DH,
//!   messages and the controller's state machine. Its crates are named in
//!   its module doc.

//!
//! It knows nothing of gRPC or the control plane: the daemon configures a
//! [`target::Target`] from control's state. Besides the platform crate
//! `dpu-os` (thread placement, huge-page memory) it depends on no crate of
//! the project.

#![forbid(unsafe_code)]

mod admin;
pub mod auth;
pub mod backend;
mod block;
mod budget;
mod command;
pub mod conn;
pub mod controller;
pub mod host;
pub mod identify;
pub mod pdu;
pub mod spec;
pub mod target;
pub mod tcp;
mod timeouts;

pub use conn::{BlockCompletion, BlockOp, BlockRequest, Connection};
pub use target::{BackendSpec, NamespaceConfig, SubsystemConfig, Target, TargetConfig};
pub use tcp::{TcpConfig, TcpConfigError, TcpTransport};
