//! The target: the subsystems it serves, their namespaces and backends, and
//! the live controllers. Shared by every connection of every transport.
//!
//! Configuration arrives as a whole ([`Target::apply`]): the target keeps the
//! backend of every namespace whose identity (UUID and NGUID) and backing
//! store did not change (so a RAM namespace keeps its data across unrelated
//! updates), resizes those whose size changed, opens new ones, and tells
//! the controllers of each changed subsystem through an asynchronous event. A resize is seen by the next
//! command's range check; a backend that leaves service (namespace or
//! subsystem deleted, store replaced) is retired before `apply` returns:
//! I/O running on it finishes, I/O accepted but not started fails with
//! Invalid Namespace, and nothing touches it afterwards.
//!
//! The files, by concern:
//! - this one: [`Target`], its counters and the settings its new
//!   connections take (timers, write buffer budget);
//! - `config`: what the target is told to serve ([`TargetConfig`]);
//! - `subsystems`: what it serves ([`Subsystem`], [`Namespace`]);
//! - `apply`: a new configuration replacing the old;
//! - `admission`: who may connect, and with which keys: the per-host
//!   limit on queues, the authentication settings;
//! - [`controller`]: a controller, and the live ones by controller ID;
//! - `discovery`: the discovery log and its generation counter;
//! - `qos`: the QoS limiters of namespaces and hosts.

mod admission;
mod apply;
mod config;
pub mod controller;
mod discovery;
mod qos;
mod subsystems;
mod tls;

pub(crate) use admission::HostAdmission;
pub use admission::DEFAULT_MAX_CONNECTIONS_PER_HOST;
pub use apply::ApplyError;
pub use config::{
    host_id_of, BackendSpec, HeldStore, NamespaceConfig, RbdCluster, RemoteNamespace,
    SubsystemConfig, TargetConfig, MAX_REMOTE_PATHS,
};
pub use subsystems::{is_namespace_removed, Namespace, NamespaceRemoved, Subsystem};
pub use tls::{SecureChannel, TlsStats};

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};

use dpu_os::backing::BackingPolicy;

use crate::auth::limit::AuthLimiter;
use crate::conn::budget::{BackendBudget, SharedBudget};
use crate::conn::timeouts::Timeouts;

use admission::{AuthConfig, HostConnections};
use controller::{Controllers, Health};

/// Target-wide counters, summed over all controllers.
#[derive(Debug, Default)]
pub struct TargetStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections closed with a termination request (protocol errors).
    pub protocol_errors: AtomicU64,
    /// Connect commands refused.
    pub connects_refused: AtomicU64,
    /// Controllers ended by keep-alive timeout.
    pub keep_alive_timeouts: AtomicU64,
    /// Connections closed for sending no ICReq in time
    /// ([`ICREQ_TIMEOUT`](crate::conn::ICREQ_TIMEOUT)); a transport
    /// that runs its own TCP (a storage endpoint) also counts here the
    /// connections it drops before their TCP handshake is done.
    pub handshake_timeouts: AtomicU64,
    /// Connections closed for leaving a PDU partial too long
    /// ([`PDU_TIMEOUT`](crate::conn::PDU_TIMEOUT)).
    pub pdu_timeouts: AtomicU64,
    /// Connections closed because the host took no byte of the target's
    /// output for [`WRITE_TIMEOUT`](crate::tcp::WRITE_TIMEOUT).
    pub write_timeouts: AtomicU64,
    /// Connections refused at accept: the transport held its most
    /// ([`TcpConfig::max_connections`](crate::tcp::TcpConfig)).
    pub connections_over_limit: AtomicU64,
    /// Connections refused at accept: their source address held its most
    /// ([`TcpConfig::max_connections_per_address`](crate::tcp::TcpConfig)).
    pub connections_over_address_limit: AtomicU64,
    /// Writes whose data, to come through R2T, had to wait before it was
    /// asked for: the connection's
    /// [`R2T_BUDGET`](crate::conn::R2T_BUDGET) or the target's
    /// [write buffer budget](Target::set_write_buffer_budget) was in use.
    pub write_buffer_waits: AtomicU64,
    /// Controllers ended because a configuration change revoked them: the
    /// host no longer allowed, or the listener it connected to removed.
    pub controllers_revoked: AtomicU64,
    /// Controllers ended for going [`Timeouts::idle`](crate::conn::Timeouts)
    /// without a command while their host had disabled Keep Alive.
    pub idle_timeouts: AtomicU64,
    /// Connects refused because the host NQN held its most connections
    /// ([`Target::set_max_connections_per_host`]).
    pub connects_over_host_limit: AtomicU64,
    /// The secure channel's handshakes and refusals.
    pub tls: TlsStats,
}

/// The NVMe-oF target. Cheap to clone; every clone is the same target.
#[derive(Debug, Clone, Default)]
pub struct Target {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Taken by I/O (a connection looks up its subsystem); held for
    /// writing only to swap in a new map, never while a backend opens.
    subsystems: RwLock<HashMap<String, Arc<Subsystem>>>,
    /// One [`Target::apply`] at a time.
    applying: Mutex<()>,
    /// Where file and block-device backends may be opened.
    backing: BackingPolicy,
    /// Connections to the storage clusters namespaces live on.
    clusters: config::Clusters,
    controllers: Mutex<Controllers>,
    discovery_genctr: AtomicU64,
    stats: TargetStats,
    health: Mutex<HashMap<String, Arc<Health>>>,
    write_budget: SharedBudget,
    /// The data of operations in flight on asynchronous backends.
    backend_budget: BackendBudget,
    timeouts: RwLock<Timeouts>,
    hosts: Mutex<HostConnections>,
    auth: RwLock<AuthConfig>,
    auth_limiter: AuthLimiter,
    /// QoS limiters by subsystem and scope.
    limiters: qos::Limiters,
    /// The secure channel's listeners, keys and requirements.
    tls: RwLock<tls::TlsConfig>,
}

impl Target {
    /// True if `other` is a clone of this target (the same target), not
    /// another one.
    pub fn is_same(&self, other: &Target) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// An empty target that opens no file or block-device backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty target that opens file and block-device backends where
    /// `backing` allows them.
    pub fn with_backing(backing: BackingPolicy) -> Self {
        Self {
            inner: Arc::new(Inner {
                backing,
                ..Inner::default()
            }),
        }
    }

    /// Counters.
    pub fn stats(&self) -> &TargetStats {
        &self.inner.stats
    }

    /// Sets the timers of connections made from now on (those open keep
    /// theirs).
    pub fn set_timeouts(&self, timeouts: Timeouts) {
        *self.inner.timeouts.write().expect("timeouts lock") = timeouts;
    }

    /// The timers connections made now enforce ([`Timeouts::default`]
    /// until [`Target::set_timeouts`]).
    pub fn timeouts(&self) -> Timeouts {
        *self.inner.timeouts.read().expect("timeouts lock")
    }

    /// Limits the write data that all connections together may ask hosts
    /// for through R2T and not yet have written (default
    /// [`DEFAULT_WRITE_BUFFER_BUDGET`](crate::conn::DEFAULT_WRITE_BUFFER_BUDGET)).
    /// A write that would pass it waits (counted in
    /// [`TargetStats::write_buffer_waits`]) until earlier writes complete;
    /// while nothing is reserved one write always proceeds, so a budget
    /// below one command's length serves one at a time. Lowering it
    /// below what is reserved now takes nothing back.
    pub fn set_write_buffer_budget(&self, bytes: u64) {
        self.inner.write_budget.set_limit(bytes);
    }

    /// The budget [`Target::set_write_buffer_budget`] set, in bytes.
    pub fn write_buffer_budget(&self) -> u64 {
        self.inner.write_budget.limit()
    }

    /// Bytes of write data all connections have reserved now against the
    /// [write buffer budget](Target::set_write_buffer_budget).
    pub fn write_buffers_reserved(&self) -> u64 {
        self.inner.write_budget.reserved()
    }

    /// Limits the data of reads and writes in flight on asynchronous
    /// backends (RBD images, remote namespaces), all namespaces together
    /// (default [`DEFAULT_BACKEND_IN_FLIGHT`](crate::conn::DEFAULT_BACKEND_IN_FLIGHT)):
    /// beside each store's own bound, the most memory their data holds at
    /// once. A request that would pass it waits in its connection until
    /// earlier ones complete; while nothing is in flight one always
    /// starts.
    pub fn set_backend_in_flight_budget(&self, bytes: u64) {
        self.inner.backend_budget.0.set_limit(bytes);
    }

    /// The budget [`Target::set_backend_in_flight_budget`] set, in bytes.
    pub fn backend_in_flight_budget(&self) -> u64 {
        self.inner.backend_budget.0.limit()
    }

    /// Bytes of data in flight on asynchronous backends now.
    pub fn backend_in_flight(&self) -> u64 {
        self.inner.backend_budget.0.reserved()
    }

    /// The budget requests on asynchronous backends reserve their data from.
    pub(crate) fn backend_budget(&self) -> &Arc<SharedBudget> {
        &self.inner.backend_budget.0
    }

    /// The budget connections reserve R2T write data from.
    pub(crate) fn write_budget(&self) -> &SharedBudget {
        &self.inner.write_budget
    }

    /// The counters of the subsystem `nqn` (kept while the target lives,
    /// across controllers and configuration changes).
    pub fn health(&self, nqn: &str) -> Arc<Health> {
        self.inner
            .health
            .lock()
            .expect("health lock")
            .entry(nqn.to_string())
            .or_default()
            .clone()
    }
}

#[cfg(test)]
pub(crate) use config::ram_subsystem;
