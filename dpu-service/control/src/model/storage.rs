//! Storage-side domain types: NVM subsystems, their namespaces with
//! backends, and their listeners.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};

use super::{MacAddr, Timestamp};

/// Where a namespace's blocks live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Backend {
    /// Memory of the given size.
    Ram {
        /// Size in bytes.
        size_bytes: u64,
    },
    /// A regular file beneath a directory of `storage.file_dirs`.
    File {
        /// Absolute path.
        path: String,
        /// Size in bytes; 0 takes the size of the existing file.
        size_bytes: u64,
        /// The file did not exist and the service creates it, with
        /// `size_bytes`. Only such a file may be made smaller: one that
        /// existed (and a state written before this flag, which reads as
        /// false) is never truncated.
        #[serde(default)]
        created: bool,
    },
    /// A block device, size taken from the device.
    BlockDevice {
        /// Absolute path.
        path: String,
    },
}

/// A namespace of a subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    /// Namespace ID, 1..=max_namespaces.
    pub nsid: u32,
    /// Backend.
    pub backend: Backend,
    /// Logical block size, 512 or 4096.
    pub block_size: u32,
    /// Namespace UUID.
    pub uuid: [u8; 16],
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
}

/// NVMe-oF transport of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// NVMe/TCP.
    Tcp,
}

/// A transport address a subsystem accepts connections on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listener {
    /// Listener ID, unique within the subsystem.
    pub id: String,
    /// Transport.
    pub transport: Transport,
    /// Address to listen on.
    pub address: IpAddr,
    /// TCP port.
    pub port: u16,
    /// The tenant whose network this listener is a storage endpoint in;
    /// `None` for a listener on the service's own kernel sockets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The endpoint's MAC address, assigned by the state when the listener
    /// is created (shared by every listener of the same tenant and
    /// address); `None` without a tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
}

impl Listener {
    /// The storage endpoint this listener is on, as (tenant, IPv4
    /// address), or `None` for a kernel-socket listener.
    pub fn endpoint(&self) -> Option<(&str, Ipv4Addr)> {
        match (&self.tenant, self.address) {
            (Some(t), IpAddr::V4(a)) => Some((t, a)),
            _ => None,
        }
    }
}

/// An NVM subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subsystem {
    /// Subsystem ID.
    pub id: String,
    /// NVMe Qualified Name, unique across subsystems.
    pub nqn: String,
    /// Serial number, 1..=20 printable ASCII characters.
    pub serial_number: String,
    /// Model number, 1..=40 printable ASCII characters.
    pub model_number: String,
    /// Any host may connect.
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect.
    pub allowed_hosts: BTreeSet<String>,
    /// Largest namespace ID accepted.
    pub max_namespaces: u32,
    /// When the subsystem was created.
    pub create_time: Timestamp,
    /// Namespaces by NSID.
    pub namespaces: BTreeMap<u32, Namespace>,
    /// Listeners by ID.
    pub listeners: BTreeMap<String, Listener>,
}

impl Subsystem {
    /// True if `host_nqn` may connect to this subsystem.
    pub fn allows_host(&self, host_nqn: &str) -> bool {
        self.allow_any_host || self.allowed_hosts.contains(host_nqn)
    }
}
