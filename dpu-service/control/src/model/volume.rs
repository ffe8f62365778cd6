//! Volumes: named stores that namespaces are made on by naming them, so
//! a store can be made, kept and deleted apart from the namespaces that
//! serve it (one at a time), as OPI's storage API models it.

use serde::{Deserialize, Serialize};

use super::Backend;

/// A volume: a store and the block size a namespace made on it has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    /// Volume ID.
    pub id: String,
    /// The store: RAM, a file, a block device or a null store (never a
    /// volume, an RBD image or a remote namespace).
    pub backend: Backend,
    /// Logical block size, 512 or 4096.
    pub block_size: u32,
    /// Volume UUID.
    pub uuid: [u8; 16],
}

impl Volume {
    /// Its size as the state knows it: configured for RAM, null and
    /// file volumes, `None` for a block device (its size is the
    /// device's).
    pub fn configured_size(&self) -> Option<u64> {
        match &self.backend {
            Backend::Ram { size_bytes }
            | Backend::Null { size_bytes }
            | Backend::File { size_bytes, .. } => Some(*size_bytes),
            _ => None,
        }
    }
}

/// The resource name of volume `id`.
pub fn volume_name(id: &str) -> String {
    format!("volumes/{id}")
}
