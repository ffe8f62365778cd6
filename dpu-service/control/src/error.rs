//! The control plane's error type and its mapping onto gRPC status codes.

use tonic::{Code, Status};

/// Why a control-plane request was refused or failed.
///
/// Each variant maps onto exactly one gRPC status code, so clients (and
/// `dpuctl`'s exit codes) can tell a bad request from a conflict from a
/// fault of the service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// A request field is malformed or out of range (`INVALID_ARGUMENT`).
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// Path of the offending field, e.g. `tenant.attachments[0].port.vlan_id`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A request field names something the service's configuration does
    /// not allow it to touch, e.g. a backing file outside
    /// `storage.file_dirs` (`PERMISSION_DENIED`).
    #[error("{field}: {reason}")]
    PermissionDenied {
        /// Path of the offending field, e.g. `namespace.file.path`.
        field: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// A named resource does not exist (`NOT_FOUND`).
    #[error("{0} not found")]
    NotFound(String),
    /// The resource, or something it claims, is already taken (`ALREADY_EXISTS`).
    #[error("{0}")]
    AlreadyExists(String),
    /// The request conflicts with the current state, e.g. a stale rule-set
    /// version or a non-empty parent (`FAILED_PRECONDITION`).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The accepted change could not be persisted; nothing was applied (`UNAVAILABLE`).
    #[error("state store: {0}")]
    Storage(String),
    /// The change is persisted, but what serves it has not applied it
    /// (it stopped, it is late, or the change could not be undone); it
    /// stays stored and is applied again with later changes (`INTERNAL`).
    #[error("stored, but {0}")]
    NotApplied(String),
    /// What serves the change could not apply it with what it runs on (a
    /// backing file whose directory is missing, a port another socket
    /// holds), so the change was undone: the state is as before the call,
    /// and the same call succeeds once the cause is gone (`FAILED_PRECONDITION`).
    #[error("{0}")]
    CannotApply(String),
    /// What serves the change refused the state holding it, which the
    /// control plane had accepted: a fault of the service, not of the
    /// request. The change was undone: the state is as before the call
    /// (`INTERNAL`).
    #[error("{0}")]
    Rejected(String),
    /// The change would take the state, or the request itself, past a
    /// configured cap (`RESOURCE_EXHAUSTED`); nothing changed.
    #[error("{what}: the limit is {max} ({limit})")]
    ResourceExhausted {
        /// The configuration key of the cap, e.g. `limits.max_tenants`.
        limit: &'static str,
        /// The cap's value.
        max: u64,
        /// What would exceed it, e.g. `70000 rules in tenants/red`.
        what: String,
    },
}

impl ControlError {
    /// Builds an [`ControlError::InvalidArgument`] for `field`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Builds a [`ControlError::PermissionDenied`] for `field`.
    pub fn denied(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::PermissionDenied {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Builds a [`ControlError::ResourceExhausted`]: `what` would exceed
    /// the cap `max` set by the configuration key `limit`.
    pub fn exhausted(limit: &'static str, max: usize, what: impl Into<String>) -> Self {
        Self::ResourceExhausted {
            limit,
            max: u64::try_from(max).unwrap_or(u64::MAX),
            what: what.into(),
        }
    }

    /// The gRPC status code this error maps onto.
    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument { .. } => Code::InvalidArgument,
            Self::PermissionDenied { .. } => Code::PermissionDenied,
            Self::NotFound(_) => Code::NotFound,
            Self::AlreadyExists(_) => Code::AlreadyExists,
            Self::FailedPrecondition(_) => Code::FailedPrecondition,
            Self::Storage(_) => Code::Unavailable,
            Self::NotApplied(_) => Code::Internal,
            Self::CannotApply(_) => Code::FailedPrecondition,
            Self::Rejected(_) => Code::Internal,
            Self::ResourceExhausted { .. } => Code::ResourceExhausted,
        }
    }
}

impl From<ControlError> for Status {
    fn from(e: ControlError) -> Self {
        Status::new(e.code(), e.to_string())
    }
}

/// Result type of the control plane.
pub type Result<T, E = ControlError> = std::result::Result<T, E>;
