//! The NVMe/TCP target, fed from the control plane's state: every accepted
//! change to subsystems, namespaces, hosts and listeners is applied to the
//! running target, and its counters flow into telemetry.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use dpu_control::model::{Backend, State, Transport};
use dpu_control::telemetry::{CounterSource, Counters};
use dpu_nvmeof::{
    BackendSpec, NamespaceConfig, SubsystemConfig, TargetConfig, TcpConfig, TcpConfigError,
};

/// The running target and its transport.
pub struct Storage {
    target: dpu_nvmeof::Target,
    transport: dpu_nvmeof::TcpTransport,
    discovery: Option<SocketAddr>,
}

impl Storage {
    /// Starts serving `state`, with the discovery controller also on
    /// `discovery` and the transport's threads placed as `tcp` says.
    ///
    /// # Errors
    /// If `tcp` names a CPU twice or one the process may not use.
    pub fn start(
        state: &State,
        discovery: Option<SocketAddr>,
        tcp: &TcpConfig,
    ) -> Result<Arc<Self>, TcpConfigError> {
        let target = dpu_nvmeof::Target::new();
        let s = Arc::new(Self {
            transport: dpu_nvmeof::TcpTransport::with_config(target.clone(), tcp)?,
            target,
            discovery,
        });
        s.apply(state);
        Ok(s)
    }

    /// Serves `state` from now on. What cannot be applied (a backing file
    /// that cannot be opened, an address that cannot be bound) is logged as
    /// an error and retried at the next change.
    pub fn apply(&self, state: &State) {
        let cfg = target_config(state, self.discovery);
        for e in self.target.apply(&cfg) {
            tracing::error!(subsystem = %e.nqn, nsid = e.nsid, error = %e.source, "namespace not served");
        }
        for (addr, e) in self.transport.set_listeners(&cfg.listen_addrs()) {
            tracing::error!(%addr, error = %e, "NVMe/TCP listener not started");
        }
    }

    /// A counter source for telemetry, keyed by subsystem ID.
    pub fn counters(
        self: &Arc<Self>,
        state: dpu_control::store::StateHandle,
    ) -> Arc<dyn CounterSource> {
        Arc::new(StorageCounters {
            storage: self.clone(),
            state,
        })
    }

    /// Closes every connection and listener.
    pub fn shutdown(&self) {
        self.transport.shutdown();
    }
}

struct StorageCounters {
    storage: Arc<Storage>,
    state: dpu_control::store::StateHandle,
}

impl CounterSource for StorageCounters {
    fn collect(&self, out: &mut Counters) {
        let s = self.state.snapshot();
        for sub in s.subsystems.values() {
            let h = self.storage.target.health(&sub.nqn);
            let c = out.subsystems.entry(sub.id.clone()).or_default();
            c.connections += h.connections.load(Ordering::Relaxed);
            c.read_ops += h.reads.load(Ordering::Relaxed);
            c.write_ops += h.writes.load(Ordering::Relaxed);
            c.read_bytes += h.bytes_read.load(Ordering::Relaxed);
            c.write_bytes += h.bytes_written.load(Ordering::Relaxed);
            c.errors += h.errors.load(Ordering::Relaxed);
        }
    }
}

/// What the target serves for `state`.
pub fn target_config(state: &State, discovery: Option<SocketAddr>) -> TargetConfig {
    let subsystems = state
        .subsystems
        .values()
        .map(|s| SubsystemConfig {
            nqn: s.nqn.clone(),
            serial: s.serial_number.clone(),
            model: s.model_number.clone(),
            allow_any_host: s.allow_any_host,
            allowed_hosts: s.allowed_hosts.clone(),
            max_namespaces: s.max_namespaces,
            namespaces: s
                .namespaces
                .values()
                .map(|n| NamespaceConfig {
                    nsid: n.nsid,
                    block_size: n.block_size,
                    uuid: n.uuid,
                    nguid: n.nguid,
                    backend: match &n.backend {
                        Backend::Ram { size_bytes } => BackendSpec::Ram { size: *size_bytes },
                        Backend::File { path, size_bytes } => BackendSpec::File {
                            path: PathBuf::from(path),
                            size: *size_bytes,
                        },
                        Backend::BlockDevice { path } => BackendSpec::BlockDevice {
                            path: PathBuf::from(path),
                        },
                    },
                })
                .collect(),
            listeners: s
                .listeners
                .values()
                .filter(|l| l.transport == Transport::Tcp)
                .map(|l| SocketAddr::new(l.address, l.port))
                .collect(),
        })
        .collect();
    TargetConfig {
        subsystems,
        discovery,
    }
}
