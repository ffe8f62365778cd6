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
//! - [`target`]: what is served and to whom: its configuration, the
//!   subsystems and namespaces, applying a new configuration, admission
//!   (per-host limits, authentication settings), the live controllers
//!   ([`target::controller`]) and the discovery log.
//! - [`conn`]: one connection (queue): fabrics, admin and NVM commands,
//!   write data asked for through R2T within its budgets, in-band
//!   authentication and the PDUs it sends, a file each; its block requests
//!   and timers.
//! - [`tcp`]: the kernel TCP transport: listeners, connection limits and
//!   poll groups; the only code of the target that touches sockets.
//! - [`host`]: the host (initiator) side: command capsules, a queue pair
//!   (sans-IO, and over a byte stream), a controller brought up, its I/O
//!   queues and the discovery log; nvmf-perf and the tests use it.
//! - [`auth`]: in-band authentication (DH-HMAC-CHAP): secrets, DH,
//!   messages and the controller's state machine. Its crates are named in
//!   its module doc.
//!
//! It knows nothing of gRPC or the control plane: the daemon configures a
//! [`target::Target`] from control's state. Besides the platform crate
//! `dpu-os` (thread placement, huge-page memory) it depends on no crate of
//! the project.

#![forbid(unsafe_code)]

pub mod auth;
pub mod backend;
pub mod conn;
pub mod host;
pub mod identify;
pub mod pdu;
pub mod qos;
pub mod spec;
pub mod target;
pub mod tcp;

pub use conn::{BlockCompletion, BlockOp, BlockRequest, Connection};
/// The firmware revision Identify Controller reports ("dpu" and the
/// crate's major and minor version), for APIs that show it.
pub const FIRMWARE_REVISION: &str = conn::admin::FIRMWARE;
/// The secure channel's keys and sessions.
pub use dpu_tls;
pub use target::{
    BackendSpec, HeldStore, NamespaceConfig, RbdCluster, SecureChannel, SubsystemConfig, Target,
    TargetConfig,
};
pub use tcp::{TcpConfig, TcpConfigError, TcpTransport};
