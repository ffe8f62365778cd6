//! Errors of the safe DPDK layer.

/// What went wrong in a DPDK call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DpdkError {
    /// `rte_eal_init` failed.
    #[error("EAL initialisation failed ({code}: {message}); arguments: {args}")]
    EalInit {
        /// rte_errno.
        code: i32,
        /// DPDK's message.
        message: String,
        /// The arguments EAL was given.
        args: String,
    },
    /// EAL was already initialised in this process with other arguments.
    #[error("EAL is already initialised in this process")]
    AlreadyInitialised,
    /// EAL was initialised and then cleaned up; DPDK cannot start it twice.
    #[error("EAL was already cleaned up in this process and cannot start again")]
    EalGone,
    /// An argument cannot be passed to DPDK (e.g. contains NUL).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Creating a mempool failed.
    #[error("creating mempool {name} failed ({code}: {message})")]
    Mempool {
        /// Pool name.
        name: String,
        /// rte_errno.
        code: i32,
        /// DPDK's message.
        message: String,
    },
    /// The pool had no free buffer.
    #[error("mempool exhausted")]
    NoBuffers,
    /// No ethdev port has this name.
    #[error("no DPDK port named {0:?} (is its vdev/devargs in the EAL arguments?)")]
    NoSuchPort(String),
    /// An ethdev operation failed.
    #[error("port {port}: {op} failed ({code}: {message})")]
    Port {
        /// Port name.
        port: String,
        /// The operation.
        op: &'static str,
        /// Error code DPDK returned.
        code: i32,
        /// DPDK's message.
        message: String,
    },
    /// Appending or prepending data would overflow the buffer.
    #[error("{len} bytes do not fit in the {room} bytes free in the mbuf")]
    NoRoom {
        /// Bytes requested.
        len: usize,
        /// Bytes available.
        room: usize,
    },
}
