//! The NVMe/TCP target, fed from the control plane's state: every accepted
//! change to subsystems, namespaces, hosts and listeners is applied to the
//! running target, and its counters flow into telemetry.
//!
//! The target follows the store ([`Storage::follow`]) and reports each
//! generation it applied, with what it could not serve, so that a storage
//! call returns only once the target serves its change
//! ([`dpu_control::apply`]).
//!
//! A subsystem that listens in a tenant's network (a storage endpoint) is
//! served by a target of that tenant's own, not by the one behind the
//! kernel sockets: its discovery controller lists that tenant's
//! subsystems alone, and a host of another tenant whose addresses happen
//! to be the same reaches none of them. Such a subsystem is served in
//! that one place: a kernel listener or another tenant's listener on it
//! is refused as a problem of the change (the call fails and is undone).
//! What the endpoints serve is handed to the thread running their stacks
//! through an [`EndpointPlan`].

mod tls;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::TargetLimits;
use dpu_control::apply::{self, Applied, Problem};
use dpu_control::convert::{listener_name, namespace_name};
use dpu_control::model::{volume_name, Backend, Cluster, State, Transport};
use dpu_control::service::ServedNamespaces;
use dpu_control::store::StateHandle;
use dpu_control::telemetry::{CounterSource, Counters, QosCounters, QosScope};
use dpu_nvmeof::{
    BackendSpec, HeldStore, NamespaceConfig, RbdCluster, SubsystemConfig, TargetConfig, TcpConfig,
    TcpConfigError,
};
use dpu_os::backing::BackingPolicy;

/// The running target and its transport.
pub struct Storage {
    target: dpu_nvmeof::Target,
    transport: dpu_nvmeof::TcpTransport,
    discovery: Option<SocketAddr>,
    /// What [`Storage::apply_auth`] gave the target last, to take back
    /// what the next state no longer has.
    auth_applied: Mutex<AuthApplied>,
    /// What [`Storage::apply_tls`] gave the targets last.
    tls_applied: Mutex<tls::TlsApplied>,
    /// Made like `target`, for the tenants' targets.
    limits: TargetLimits,
    backing: BackingPolicy,
    /// The target of each tenant with storage endpoints.
    tenant_targets: Mutex<BTreeMap<String, dpu_nvmeof::Target>>,
    /// The memory of the RAM volumes, by volume ID, with the UUID of the
    /// volume it is for ([`Storage::held_volumes`]).
    held: Mutex<BTreeMap<String, ([u8; 16], HeldStore)>>,
    /// What the storage endpoints serve, for their thread.
    plan: Arc<EndpointPlan>,
}

/// A storage endpoint as the state has it: where it is and what it serves.
#[derive(Debug, Clone)]
pub struct EndpointSpec {
    /// The tenant whose network it is in.
    pub tenant: String,
    /// Its IPv4 or IPv6 address there.
    pub address: IpAddr,
    /// Its MAC.
    pub mac: [u8; 6],
    /// The TCP ports it listens on.
    pub ports: BTreeSet<u16>,
    /// The tenant's target: the subsystems listening in the tenant's
    /// network, and their discovery controller.
    pub target: dpu_nvmeof::Target,
}

/// The storage endpoints the last applied state has, published for the
/// thread that runs their stacks.
#[derive(Debug)]
pub struct EndpointPlan {
    specs: Mutex<Arc<Vec<EndpointSpec>>>,
    generation: AtomicU64,
    /// The socket buffer memory all endpoints' stacks share.
    pool: Arc<dpu_endpoint::BufferPool>,
    /// Connections the endpoints' stacks hold, as their thread last
    /// counted.
    open: std::sync::atomic::AtomicUsize,
}

impl EndpointPlan {
    /// No endpoints yet; their stacks will share `buffer_memory` bytes
    /// beyond their reserves.
    pub fn new(buffer_memory: usize) -> Self {
        Self {
            specs: Mutex::default(),
            generation: AtomicU64::new(0),
            pool: dpu_endpoint::BufferPool::new(buffer_memory),
            open: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Records how many connections the endpoints hold now.
    pub fn set_open_connections(&self, n: usize) {
        self.open.store(n, Ordering::Relaxed);
    }

    /// Connections the endpoints hold, handshaking, connected or closing.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// The socket buffer memory the endpoints' stacks share.
    pub fn pool(&self) -> Arc<dpu_endpoint::BufferPool> {
        self.pool.clone()
    }

    /// How many times the plan was replaced: a cheap test for a change.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The endpoints, ordered by tenant and address.
    pub fn specs(&self) -> Arc<Vec<EndpointSpec>> {
        self.specs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn publish(&self, specs: Vec<EndpointSpec>) {
        *self.specs.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(specs);
        self.generation.fetch_add(1, Ordering::Release);
    }
}

/// The DH-HMAC-CHAP settings the target was given.
#[derive(Default)]
struct AuthApplied {
    /// (subsystem NQN, host NQN) pairs with keys.
    keys: BTreeSet<(String, String)>,
    /// Subsystem NQNs with a requirement other than the default.
    required: BTreeSet<String>,
}

impl Storage {
    /// Starts serving `state`, with the discovery controller also on
    /// `discovery`, the transport's threads placed as `tcp` says, and
    /// file and block-device backends opened where `backing` allows.
    ///
    /// # Errors
    /// If `tcp` names a CPU twice or one the process may not use.
    pub fn start(
        state: &State,
        discovery: Option<SocketAddr>,
        tcp: &TcpConfig,
        limits: TargetLimits,
        backing: BackingPolicy,
    ) -> Result<Arc<Self>, TcpConfigError> {
        let target = new_target(&backing, limits);
        let s = Arc::new(Self {
            transport: dpu_nvmeof::TcpTransport::with_config(target.clone(), tcp)?,
            target,
            discovery,
            auth_applied: Mutex::default(),
            tls_applied: Mutex::default(),
            limits,
            backing,
            tenant_targets: Mutex::default(),
            held: Mutex::default(),
            plan: Arc::new(EndpointPlan::new(limits.endpoint_buffer_memory)),
        });
        s.apply(state);
        Ok(s)
    }

    /// Serves `state` from now on; once this returns, a deleted namespace
    /// takes no new command and the I/O that was running on it has ended.
    /// What cannot be applied (a backing file that cannot be opened, an
    /// address that cannot be bound) is logged as an error, answered by the
    /// resource names of the namespaces and listeners concerned, and
    /// retried at the next change.
    pub fn apply(&self, state: &State) -> Vec<Problem> {
        let held = self.held_volumes(state);
        let cfg = target_config(state, &held, self.discovery);
        let tenants = tenant_configs(state, &held);
        // The tenants' targets this state needs, made before the keys are
        // given out.
        let targets: Vec<(String, dpu_nvmeof::Target)> = {
            let mut all = self
                .tenant_targets
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for t in tenants.configs.keys() {
                all.entry(t.clone())
                    .or_insert_with(|| new_target(&self.backing, self.limits));
            }
            all.iter().map(|(t, x)| (t.clone(), x.clone())).collect()
        };
        // Keys first: a host allowed by this state authenticates from its
        // first connect.
        self.apply_auth(state, &targets);
        // Likewise TLS keys, and the listeners' secure channels before
        // the transport listens on them.
        self.apply_tls(state, &targets);
        let mut problems = tenants.problems;
        for p in &problems {
            tracing::error!(resource = %p.resource, reason = %p.reason, "listener not served");
        }
        for p in unservable(state, &held) {
            tracing::error!(resource = %p.resource, reason = %p.reason, "namespace not served");
            problems.push(p);
        }
        // The kernel sockets' target first: a subsystem moving into a
        // tenant's network lets go of its backends before the tenant's
        // target opens them.
        let mut errors = self.target.apply(&cfg);
        for (tenant, target) in &targets {
            let empty = dpu_nvmeof::TargetConfig::default();
            let c = tenants.configs.get(tenant).unwrap_or(&empty);
            errors.extend(target.apply(c));
            // The limits on all the tenant's storage I/O; none for a
            // tenant deleted (its target goes below).
            target.set_qos(
                state
                    .tenants
                    .get(tenant)
                    .map(|t| t.storage_qos)
                    .unwrap_or_default(),
            );
        }
        {
            let mut all = self
                .tenant_targets
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            all.retain(|t, _| tenants.configs.contains_key(t));
        }
        self.plan.publish(endpoint_specs(state, &targets));
        for e in errors {
            tracing::error!(subsystem = %e.nqn, nsid = e.nsid, error = %e.source, "namespace not served");
            problems.extend(
                state
                    .subsystems
                    .values()
                    .filter(|s| s.nqn == e.nqn)
                    .map(|s| Problem {
                        resource: namespace_name(&s.id, e.nsid),
                        reason: e.source.to_string(),
                    }),
            );
        }
        for (addr, e) in self.transport.set_listeners(&cfg.listen_addrs()) {
            tracing::error!(%addr, error = %e, "NVMe/TCP listener not started");
            for s in state.subsystems.values() {
                problems.extend(
                    s.listeners
                        .values()
                        .filter(|l| {
                            l.transport == Transport::Tcp
                                && SocketAddr::new(l.address, l.port) == addr
                        })
                        .map(|l| Problem {
                            resource: listener_name(&s.id, &l.id),
                            reason: format!("cannot listen on {addr}: {e}"),
                        }),
                );
            }
        }
        problems
    }

    /// Gives the target the DH-HMAC-CHAP keys and requirements of `state`
    /// and takes back those it no longer has. Each takes effect at the
    /// next authentication of a queue; queues authenticated already stay
    /// so (a host removed from the allow list is disconnected by the
    /// target). Never logs a secret.
    ///
    /// Keys that do not parse (only a state file edited by hand: requests
    /// are checked before they are stored) fail closed: the error is
    /// logged and the subsystem requires authentication of every host, so
    /// that host cannot connect.
    fn apply_auth(&self, state: &State, tenants: &[(String, dpu_nvmeof::Target)]) {
        let targets: Vec<&dpu_nvmeof::Target> = std::iter::once(&self.target)
            .chain(tenants.iter().map(|(_, t)| t))
            .collect();
        let mut now = AuthApplied::default();
        for s in state.subsystems.values() {
            let mut broken = false;
            for (host, a) in &s.host_auth {
                match a.host_keys() {
                    Ok(keys) => {
                        for t in &targets {
                            t.set_host_keys(&s.nqn, host, Some(keys.clone()));
                        }
                        now.keys.insert((s.nqn.clone(), host.clone()));
                    }
                    Err(e) => {
                        tracing::error!(subsystem = %s.id, host = %host, error = %e, "DH-HMAC-CHAP settings in the state do not parse; the subsystem requires authentication until they are set again");
                        broken = true;
                    }
                }
            }
            let required = if broken {
                Some(true)
            } else {
                s.auth_requirement.target_policy()
            };
            for t in &targets {
                t.set_auth_required(&s.nqn, required);
            }
            if required.is_some() {
                now.required.insert(s.nqn.clone());
            }
        }
        let mut last = self.auth_applied.lock().unwrap_or_else(|e| e.into_inner());
        for t in &targets {
            for (sub, host) in last.keys.difference(&now.keys) {
                t.set_host_keys(sub, host, None);
            }
            for sub in last.required.difference(&now.required) {
                t.set_auth_required(sub, None);
            }
        }
        *last = now;
    }

    /// Applies every state `state` publishes from now on (the newest,
    /// when several arrived while one was being applied), having applied
    /// generation `applied` already, and reports each generation applied
    /// through the answered [`Applied`], for storage calls to wait on.
    ///
    /// Applying runs on a blocking thread (it opens files and binds
    /// sockets). Should it panic, following stops: the task ends, and
    /// waiting storage calls fail rather than hang.
    pub fn follow(
        self: &Arc<Self>,
        state: &StateHandle,
        applied: u64,
    ) -> (tokio::task::JoinHandle<()>, Applied) {
        let (reporter, waiters) = apply::follow("the NVMe-oF target", applied);
        let mut rx = state.subscribe();
        let this = self.clone();
        let task = tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let p = rx.borrow_and_update().clone();
                let this = this.clone();
                match tokio::task::spawn_blocking(move || this.apply(&p.state)).await {
                    Ok(problems) => reporter.report(p.generation, problems),
                    Err(e) => {
                        tracing::error!(generation = p.generation, error = %e, "applying storage state failed; the target no longer follows changes");
                        break;
                    }
                }
            }
        });
        (task, waiters)
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

    /// The sizes the targets serve namespaces with: what Get and List
    /// answer for a block device or an RBD image, which only the target
    /// that opened it knows.
    pub fn served(self: &Arc<Self>) -> Arc<dyn ServedNamespaces> {
        Arc::new(TargetNamespaces(self.clone()))
    }

    /// What the storage endpoints serve, for the thread running them.
    pub fn endpoint_plan(&self) -> Arc<EndpointPlan> {
        self.plan.clone()
    }

    /// The target behind the kernel sockets and each tenant's.
    fn all_targets(&self) -> Vec<dpu_nvmeof::Target> {
        std::iter::once(self.target.clone())
            .chain(self.tenant_targets().into_iter().map(|(_, t)| t))
            .collect()
    }

    /// Each tenant's target, by tenant ID.
    fn tenant_targets(&self) -> Vec<(String, dpu_nvmeof::Target)> {
        let tenants = self
            .tenant_targets
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        tenants
            .iter()
            .map(|(id, t)| (id.clone(), t.clone()))
            .collect()
    }

    /// Closes every connection and listener, then every namespace's
    /// store.
    pub fn shutdown(&self) {
        self.transport.shutdown();
        // Every namespace lets go of its store before the process ends: an
        // RBD image releases its lock, so the next start (or another
        // client) takes it at once rather than after the cluster's timeout.
        for t in self.all_targets() {
            t.apply(&TargetConfig {
                subsystems: Vec::new(),
                discovery: None,
            });
        }
        if !dpu_nvmeof::backend::wait_closed(std::time::Duration::from_secs(30)) {
            tracing::warn!("some namespaces' stores did not close within 30 s");
        }
    }
}

/// [`Storage::served`].
struct TargetNamespaces(Arc<Storage>);

impl std::fmt::Debug for TargetNamespaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TargetNamespaces")
    }
}

impl ServedNamespaces for TargetNamespaces {
    fn namespace_size(&self, nqn: &str, nsid: u32) -> Option<u64> {
        // A subsystem is served by one target: the kernel sockets' or
        // its tenant's.
        self.0.all_targets().iter().find_map(|t| {
            let ns = t.subsystem(nqn)?.namespaces.get(&nsid)?.clone();
            Some(ns.blocks() << ns.lba_shift)
        })
    }

    fn namespace_reachable(&self, nqn: &str, nsid: u32) -> Option<bool> {
        self.0.all_targets().iter().find_map(|t| {
            let ns = t.subsystem(nqn)?.namespaces.get(&nsid)?.clone();
            Some(ns.backend.reachable())
        })
    }
}

struct StorageCounters {
    storage: Arc<Storage>,
    state: dpu_control::store::StateHandle,
}

impl CounterSource for StorageCounters {
    fn collect(&self, out: &mut Counters) {
        let s = self.state.snapshot();
        let targets = self.storage.all_targets();
        for sub in s.subsystems.values() {
            let c = out.subsystems.entry(sub.id.clone()).or_default();
            for target in &targets {
                let h = target.health(&sub.nqn);
                c.connections += h.connections.load(Ordering::Relaxed);
                c.read_ops += h.reads.load(Ordering::Relaxed);
                c.write_ops += h.writes.load(Ordering::Relaxed);
                c.read_bytes += h.bytes_read.load(Ordering::Relaxed);
                c.write_bytes += h.bytes_written.load(Ordering::Relaxed);
                c.errors += h.errors.load(Ordering::Relaxed);
                c.auth_succeeded += h.auth_succeeded.load(Ordering::Relaxed);
                c.auth_failed += h.auth_failed.load(Ordering::Relaxed);
                c.auth_rate_limited += h.auth_rate_limited.load(Ordering::Relaxed);
                c.auth_busy += h.auth_busy.load(Ordering::Relaxed);
                if let Some(served) = target.subsystem(&sub.nqn) {
                    c.namespaces_unreachable += served
                        .namespaces
                        .values()
                        .filter(|ns| !ns.backend.reachable())
                        .count() as u64;
                }
            }
        }
        // QoS limiters by subsystem ID: a subsystem is served by one
        // target, but one that moved may have left waits in another.
        let ids: BTreeMap<&str, &str> = s
            .subsystems
            .values()
            .map(|sub| (sub.nqn.as_str(), sub.id.as_str()))
            .collect();
        // The limits on a tenant's whole storage by tenant ID (the
        // limiter of its target as a whole, with no subsystem).
        for (tenant, target) in self.storage.tenant_targets() {
            for stat in target.qos_stats() {
                if stat.scope == QosScope::Target {
                    out.qos
                        .entry((tenant.clone(), QosScope::Target))
                        .or_default()
                        .add(&QosCounters::from(&stat));
                }
            }
        }
        for target in &targets {
            for stat in target.qos_stats() {
                if stat.scope == QosScope::Target {
                    continue;
                }
                let Some(id) = ids.get(stat.subnqn.as_str()) else {
                    continue;
                };
                out.qos
                    .entry((id.to_string(), stat.scope.clone()))
                    .or_default()
                    .add(&QosCounters::from(&stat));
            }
        }
        let t = &mut out.nvmf_target;
        for target in &targets {
            t.backend_in_flight_bytes += target.backend_in_flight();
            let st = target.stats();
            // Each field of the contract beside the target's counter that
            // fills it: a counter the target adds is one more pair.
            for (field, counted) in [
                (&mut t.connections_accepted, &st.connections),
                (&mut t.protocol_errors, &st.protocol_errors),
                (&mut t.connects_refused, &st.connects_refused),
                (&mut t.keep_alive_timeouts, &st.keep_alive_timeouts),
                (&mut t.handshake_timeouts, &st.handshake_timeouts),
                (&mut t.pdu_timeouts, &st.pdu_timeouts),
                (&mut t.write_timeouts, &st.write_timeouts),
                (&mut t.refused_max_connections, &st.connections_over_limit),
                (
                    &mut t.refused_max_connections_per_address,
                    &st.connections_over_address_limit,
                ),
                (&mut t.write_buffer_waits, &st.write_buffer_waits),
                (&mut t.controllers_revoked, &st.controllers_revoked),
                (&mut t.idle_timeouts, &st.idle_timeouts),
                (
                    &mut t.refused_max_connections_per_host,
                    &st.connects_over_host_limit,
                ),
                (&mut t.tls_handshakes, &st.tls.handshakes),
                (&mut t.tls_refused_unknown_key, &st.tls.refused_unknown_key),
                (&mut t.tls_failed, &st.tls.failed),
                (&mut t.tls_timeouts, &st.tls.timeouts),
                (&mut t.tls_busy, &st.tls.busy),
                (&mut t.tls_clear_text_refused, &st.tls.clear_text_refused),
                (&mut t.connects_without_tls, &st.tls.connects_without_tls),
                (
                    &mut t.connects_identity_mismatch,
                    &st.tls.connects_identity_mismatch,
                ),
            ] {
                *field += counted.load(Ordering::Relaxed);
            }
        }
        let transport = &self.storage.transport;
        t.open_connections += transport.open_connections() as u64;
        let plan = &self.storage.plan;
        t.open_connections += plan.open_connections() as u64;
        t.endpoint_buffer_reserved_bytes += plan.pool.reserved() as u64;
        t.endpoint_buffer_shared_bytes += plan.pool.shared_used() as u64;
        let loads = transport.poll_group_loads();
        if t.poll_group_queues.len() < loads.len() {
            t.poll_group_queues.resize(loads.len(), 0);
        }
        for (sum, queues) in t.poll_group_queues.iter_mut().zip(loads) {
            *sum += queues as u64;
        }
    }
}

/// A target made with the daemon's limits.
fn new_target(backing: &BackingPolicy, limits: TargetLimits) -> dpu_nvmeof::Target {
    let target = dpu_nvmeof::Target::with_backing(backing.clone());
    target.set_timeouts(limits.timeouts);
    target.set_write_buffer_budget(limits.write_buffer_budget);
    target.set_backend_in_flight_budget(limits.backend_in_flight_budget);
    target.set_max_connections_per_host(limits.max_connections_per_host);
    target.set_auth_rate(limits.auth_rate);
    target
}

/// The memory of the RAM volumes of a state, by volume ID: held by the
/// daemon, not by the namespaces made on them, so that a volume keeps
/// its contents from one namespace to the next.
pub type HeldVolumes = BTreeMap<String, HeldStore>;

impl Storage {
    /// The memory of `state`'s RAM volumes: kept for a volume the last
    /// state had (the same ID and UUID), made for a new one, let go for
    /// one deleted.
    fn held_volumes(&self, state: &State) -> HeldVolumes {
        let mut all = self.held.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|id, (uuid, _)| {
            state
                .volumes
                .get(id)
                .is_some_and(|v| v.uuid == *uuid && matches!(v.backend, Backend::Ram { .. }))
        });
        for v in state.volumes.values() {
            if let Backend::Ram { size_bytes } = v.backend {
                all.entry(v.id.clone())
                    .or_insert_with(|| (v.uuid, HeldStore::ram(volume_name(&v.id), size_bytes)));
            }
        }
        all.iter()
            .map(|(id, (_, store))| (id.clone(), store.clone()))
            .collect()
    }
}

/// How the target opens the store of backend `b` of a namespace in
/// `state`, with the RAM volumes' memory in `held`, or why it cannot.
fn backend_spec(state: &State, held: &HeldVolumes, b: &Backend) -> Result<BackendSpec, String> {
    Ok(match b {
        Backend::Null { size_bytes } => BackendSpec::Null { size: *size_bytes },
        Backend::Volume { id } => {
            // The state keeps a volume while a namespace is made on it;
            // only a state file edited by hand lacks it.
            let v = state
                .volumes
                .get(id)
                .ok_or_else(|| format!("{} is not in the state", volume_name(id)))?;
            match &v.backend {
                Backend::Ram { size_bytes } => BackendSpec::Held {
                    store: held
                        .get(id)
                        .cloned()
                        .ok_or_else(|| format!("{} holds no memory", volume_name(id)))?,
                    size: *size_bytes,
                },
                Backend::Volume { .. } => {
                    return Err(format!("{} names another volume", volume_name(id)))
                }
                other => backend_spec(state, held, other)?,
            }
        }
        Backend::Ram { size_bytes } => BackendSpec::Ram { size: *size_bytes },
        Backend::File {
            path,
            size_bytes,
            created,
        } => BackendSpec::File {
            path: PathBuf::from(path),
            size: *size_bytes,
            created: *created,
        },
        Backend::BlockDevice { path } => BackendSpec::BlockDevice {
            path: PathBuf::from(path),
        },
        Backend::Rbd {
            cluster,
            pool,
            image,
        } => {
            // The state keeps a cluster while a namespace uses it; only a
            // state file edited by hand lacks it.
            let c = state
                .clusters
                .get(cluster)
                .ok_or_else(|| format!("clusters/{cluster} is not in the state"))?;
            BackendSpec::Rbd {
                cluster: rbd_cluster(c),
                pool: pool.clone(),
                image: image.clone(),
            }
        }
        Backend::Remote(r) => BackendSpec::Remote(r.spec()),
    })
}

/// Storage cluster `c` as the target connects to it.
fn rbd_cluster(c: &Cluster) -> RbdCluster {
    RbdCluster {
        name: c.id.clone(),
        mon_host: c.mon_host.clone(),
        user: c.user.clone(),
        key: c.key.as_ref().map(|k| k.expose().to_string()),
        op_timeout: c.op_timeout(),
        connect_timeout: c.connect_timeout(),
    }
}

/// The namespaces of `state` the target cannot be told to serve (see
/// [`backend_spec`]), each with why.
fn unservable(state: &State, held: &HeldVolumes) -> Vec<Problem> {
    let mut out = Vec::new();
    for s in state.subsystems.values() {
        for n in s.namespaces.values() {
            if let Err(reason) = backend_spec(state, held, &n.backend) {
                out.push(Problem {
                    resource: namespace_name(&s.id, n.nsid),
                    reason,
                });
            }
        }
    }
    out
}

/// The subsystem as the target serves it, exported on `listeners`, with
/// the namespaces of it the target can be told to serve.
fn subsystem_config(
    state: &State,
    held: &HeldVolumes,
    s: &dpu_control::model::Subsystem,
    listeners: Vec<SocketAddr>,
) -> SubsystemConfig {
    SubsystemConfig {
        host_qos: s.host_qos.clone(),
        nqn: s.nqn.clone(),
        serial: s.serial_number.clone(),
        model: s.model_number.clone(),
        allow_any_host: s.allow_any_host,
        allowed_hosts: s.allowed_hosts.clone(),
        max_namespaces: s.max_namespaces,
        namespaces: s
            .namespaces
            .values()
            .filter_map(|n| {
                Some(NamespaceConfig {
                    qos: n.qos,
                    nsid: n.nsid,
                    block_size: n.block_size,
                    uuid: n.uuid,
                    nguid: n.nguid,
                    eui64: n.eui64,
                    backend: backend_spec(state, held, &n.backend).ok()?,
                })
            })
            .collect(),
        listeners,
    }
}

/// What the target behind the kernel sockets serves for `state`: every
/// subsystem but those served in a tenant's network.
pub fn target_config(
    state: &State,
    held: &HeldVolumes,
    discovery: Option<SocketAddr>,
) -> TargetConfig {
    let subsystems = state
        .subsystems
        .values()
        .filter(|s| s.serving_tenant().is_none())
        .map(|s| {
            let listeners = s
                .listeners
                .values()
                .filter(|l| l.transport == Transport::Tcp)
                .map(|l| SocketAddr::new(l.address, l.port))
                .collect();
            subsystem_config(state, held, s, listeners)
        })
        .collect();
    TargetConfig {
        subsystems,
        discovery,
    }
}

/// What each tenant's target serves, and the listeners that cannot be
/// served where they are.
#[derive(Debug, Default)]
pub struct TenantConfigs {
    /// By tenant: the subsystems listening in its network, exported on
    /// its endpoints' addresses; no discovery listener of its own (the
    /// discovery controller answers on each endpoint's ports).
    pub configs: BTreeMap<String, TargetConfig>,
    /// Listeners of a subsystem served in a tenant's network that are on
    /// the kernel sockets or in another tenant's network.
    pub problems: Vec<Problem>,
}

/// The tenants' targets for `state`.
pub fn tenant_configs(state: &State, held: &HeldVolumes) -> TenantConfigs {
    let mut out = TenantConfigs::default();
    for s in state.subsystems.values() {
        let Some(tenant) = s.serving_tenant() else {
            continue;
        };
        let mut listeners = Vec::new();
        // The state refuses listeners elsewhere; a state file from before
        // it did may still hold some.
        for l in s.listeners.values() {
            match s.listener_conflict(l) {
                None => listeners.push(SocketAddr::new(l.address, l.port)),
                Some(reason) => out.problems.push(Problem {
                    resource: listener_name(&s.id, &l.id),
                    reason,
                }),
            }
        }
        out.configs
            .entry(tenant.to_string())
            .or_default()
            .subsystems
            .push(subsystem_config(state, held, s, listeners));
    }
    out
}

/// The storage endpoints of `state` with what they serve, each with its
/// tenant's target from `targets`.
fn endpoint_specs(state: &State, targets: &[(String, dpu_nvmeof::Target)]) -> Vec<EndpointSpec> {
    let mut out: Vec<EndpointSpec> = Vec::new();
    for e in state.endpoints() {
        let Some((_, target)) = targets.iter().find(|(t, _)| t == e.tenant) else {
            continue;
        };
        let ports = state
            .subsystems
            .values()
            .filter(|s| s.serving_tenant() == Some(e.tenant))
            .flat_map(|s| s.listeners.values())
            .filter(|l| l.endpoint() == Some((e.tenant, e.address)))
            .map(|l| l.port)
            .collect();
        out.push(EndpointSpec {
            tenant: e.tenant.to_string(),
            address: e.address,
            mac: e.mac.0,
            ports,
            target: target.clone(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use dpu_proto::v1 as pb;
    use dpu_proto::v1::storage_service_server::StorageService;
    use tonic::{Code, Request};

    use super::*;

    const NQN: &str = "nqn.2024-01.io.example:vol";

    /// Subsystem `id` with listeners (id, tenant, port), each tenant's at
    /// 10.1.0.250, the others on 127.0.0.1.
    fn subsystem(
        id: &str,
        listeners: &[(&str, Option<&str>, u16)],
    ) -> dpu_control::model::Subsystem {
        use dpu_control::model::{Listener, MacAddr, Subsystem, Timestamp};
        Subsystem {
            id: id.into(),
            nqn: format!("nqn.2024-01.io.example:{id}"),
            serial_number: "s".into(),
            model_number: "m".into(),
            allow_any_host: true,
            allowed_hosts: Default::default(),
            max_namespaces: 1,
            create_time: Timestamp::now(),
            namespaces: Default::default(),
            listeners: listeners
                .iter()
                .map(|&(lid, tenant, port)| {
                    let l = Listener {
                        id: lid.into(),
                        transport: Transport::Tcp,
                        address: if tenant.is_some() {
                            "10.1.0.250"
                        } else {
                            "127.0.0.1"
                        }
                        .parse()
                        .unwrap(),
                        port,
                        tenant: tenant.map(String::from),
                        mac: tenant.map(|t| MacAddr([2, 0xd5, 0, 0, 0, t.len() as u8])),
                        secure_channel: Default::default(),
                    };
                    (l.id.clone(), l)
                })
                .collect(),
            auth_requirement: Default::default(),
            host_auth: Default::default(),
            host_qos: Default::default(),
            tls_requirement: Default::default(),
            host_tls: Default::default(),
        }
    }

    #[test]
    fn each_subsystem_is_served_in_one_place() {
        let mut state = State::default();
        for s in [
            subsystem("kernel", &[("k", None, 4420)]),
            subsystem("blue1", &[("e", Some("blue"), 4420)]),
            subsystem("blue2", &[("e", Some("blue"), 4421)]),
            subsystem("red1", &[("e", Some("red"), 4420)]),
            // Blue's (the first tenant by name), with listeners it
            // cannot also have.
            subsystem(
                "mixed",
                &[
                    ("k", None, 4430),
                    ("r", Some("red"), 4420),
                    ("z", Some("blue"), 4420),
                ],
            ),
        ] {
            state.subsystems.insert(s.id.clone(), s);
        }
        let kernel = target_config(&state, &HeldVolumes::new(), None);
        assert_eq!(
            kernel
                .subsystems
                .iter()
                .map(|s| s.nqn.as_str())
                .collect::<Vec<_>>(),
            ["nqn.2024-01.io.example:kernel"]
        );
        let t = tenant_configs(&state, &HeldVolumes::new());
        let nqns = |tenant: &str| -> Vec<(String, Vec<SocketAddr>)> {
            t.configs[tenant]
                .subsystems
                .iter()
                .map(|s| {
                    (
                        s.nqn.rsplit(':').next().unwrap().to_string(),
                        s.listeners.clone(),
                    )
                })
                .collect()
        };
        let ep = |port| vec![SocketAddr::from(([10, 1, 0, 250], port))];
        assert_eq!(
            nqns("blue"),
            [
                ("blue1".to_string(), ep(4420)),
                ("blue2".to_string(), ep(4421)),
                ("mixed".to_string(), ep(4420))
            ]
        );
        assert_eq!(nqns("red"), [("red1".to_string(), ep(4420))]);
        assert!(t.configs.values().all(|c| c.discovery.is_none()));
        let mut refused: Vec<&str> = t.problems.iter().map(|p| p.resource.as_str()).collect();
        refused.sort_unstable();
        assert_eq!(
            refused,
            [
                "subsystems/mixed/listeners/k",
                "subsystems/mixed/listeners/r"
            ]
        );
        assert!(t
            .problems
            .iter()
            .all(|p| p.reason.contains("tenant blue's network")));
    }

    /// A remote namespace reaches the target with every setting, its
    /// secret too (the target authenticates with it).
    #[test]
    fn remote_namespaces_reach_the_target_with_their_settings() {
        use dpu_control::model::{Namespace, RemoteNamespace, SecretText};
        const SECRET: &str = "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:";
        let mut state = State::default();
        let mut s = subsystem("vol", &[("k", None, 4420)]);
        let r = RemoteNamespace {
            paths: vec![
                "10.0.0.1:4420".parse().unwrap(),
                "10.0.0.2:4420".parse().unwrap(),
            ],
            subnqn: "nqn.2024-01.io.example:far".into(),
            nsid: 9,
            host_nqn: "nqn.2024-01.io.example:me".into(),
            dhchap_secret: Some(SecretText::parse(SECRET).unwrap().0),
            io_timeout_ms: 1_500,
            connect_timeout_ms: 500,
            queue_depth: 16,
        };
        s.namespaces.insert(
            1,
            Namespace {
                namespace_id: "far".into(),
                eui64: Some([9, 8, 7, 6, 5, 4, 3, 2]),
                nsid: 1,
                backend: Backend::Remote(r.clone()),
                block_size: 4096,
                uuid: [1; 16],
                nguid: [1; 16],
                qos: Default::default(),
            },
        );
        state.subsystems.insert(s.id.clone(), s);
        let cfg = target_config(&state, &HeldVolumes::new(), None);
        let namespaces = &cfg.subsystems[0].namespaces;
        assert_eq!(namespaces[0].block_size, 4096);
        // The EUI-64 goes to the target, for Identify to report.
        assert_eq!(namespaces[0].eui64, Some([9, 8, 7, 6, 5, 4, 3, 2]));
        let BackendSpec::Remote(spec) = &namespaces[0].backend else {
            panic!("{:?}", namespaces[0].backend)
        };
        assert_eq!(*spec, r.spec());
        assert_eq!(spec.paths, r.paths);
        assert_eq!(spec.dhchap_secret.as_deref(), Some(SECRET));
        assert_eq!(spec.io_timeout, std::time::Duration::from_millis(1_500));
        assert_eq!(spec.queue_depth, 16);
        assert!(!format!("{cfg:?}").contains(&SECRET[10..40]));
        assert!(unservable(&state, &HeldVolumes::new()).is_empty());
    }

    /// An RBD namespace reaches the target with its cluster's settings
    /// (the key too: the target connects with it); one whose cluster the
    /// state lacks (a state file edited by hand) is not served, and is
    /// reported.
    #[test]
    fn rbd_namespaces_reach_the_target_with_their_cluster() {
        use dpu_control::model::{Namespace, Timestamp};
        const KEY: &str = "AQCAmWZmQOIBABAAEBESExQVFhcYGRobHB0eHw==";
        let mut state = State::default();
        let mut s = subsystem("vol", &[("k", None, 4420)]);
        s.max_namespaces = 2;
        for (nsid, cluster) in [(1, "ceph1"), (2, "gone")] {
            s.namespaces.insert(
                nsid,
                Namespace {
                    namespace_id: String::new(),
                    eui64: None,
                    nsid,
                    backend: Backend::Rbd {
                        cluster: cluster.into(),
                        pool: "rbd".into(),
                        image: "vol1".into(),
                    },
                    block_size: 512,
                    uuid: [nsid as u8; 16],
                    nguid: [nsid as u8; 16],
                    qos: Default::default(),
                },
            );
        }
        state.subsystems.insert(s.id.clone(), s);
        state.clusters.insert(
            "ceph1".into(),
            Cluster {
                id: "ceph1".into(),
                mon_host: "10.0.0.1:6789".into(),
                user: "dpu".into(),
                key: dpu_control::validate::cephx_key("key", KEY).unwrap(),
                op_timeout_secs: 20,
                connect_timeout_secs: 10,
                create_time: Timestamp::now(),
            },
        );
        let cfg = target_config(&state, &HeldVolumes::new(), None);
        let namespaces = &cfg.subsystems[0].namespaces;
        assert_eq!(
            namespaces.len(),
            1,
            "the one whose cluster is gone is not served"
        );
        let BackendSpec::Rbd {
            cluster,
            pool,
            image,
        } = &namespaces[0].backend
        else {
            panic!("{:?}", namespaces[0].backend)
        };
        assert_eq!((pool.as_str(), image.as_str()), ("rbd", "vol1"));
        assert_eq!(
            (
                cluster.name.as_str(),
                cluster.mon_host.as_str(),
                cluster.user.as_str()
            ),
            ("ceph1", "10.0.0.1:6789", "dpu")
        );
        assert_eq!(cluster.key.as_deref(), Some(KEY));
        assert_eq!(
            (cluster.op_timeout, cluster.connect_timeout),
            (Duration::from_secs(20), Duration::from_secs(10))
        );
        assert!(!format!("{cfg:?}").contains(&KEY[..20]), "no key in Debug");
        assert_eq!(
            unservable(&state, &HeldVolumes::new()),
            [Problem {
                resource: "subsystems/vol/namespaces/2".into(),
                reason: "clusters/gone is not in the state".into(),
            }]
        );
    }

    #[test]
    fn endpoints_get_their_ports_and_their_tenants_target() {
        let mut state = State::default();
        for s in [
            subsystem("blue1", &[("e", Some("blue"), 4420)]),
            subsystem("blue2", &[("e", Some("blue"), 4421)]),
            subsystem("red1", &[("e", Some("red"), 4420)]),
        ] {
            state.subsystems.insert(s.id.clone(), s);
        }
        let targets = vec![
            ("blue".to_string(), dpu_nvmeof::Target::new()),
            ("red".to_string(), dpu_nvmeof::Target::new()),
        ];
        let specs = endpoint_specs(&state, &targets);
        assert_eq!(specs.len(), 2);
        assert_eq!(
            (
                specs[0].tenant.as_str(),
                specs[0].address,
                specs[0].ports.iter().copied().collect::<Vec<_>>()
            ),
            (
                "blue",
                std::net::Ipv4Addr::new(10, 1, 0, 250).into(),
                vec![4420, 4421]
            )
        );
        assert!(specs[0].target.is_same(&targets[0].1));
        assert!(specs[1].target.is_same(&targets[1].1));
        assert_eq!(specs[1].ports.iter().copied().collect::<Vec<_>>(), [4420]);
    }

    /// A target following a fresh in-memory state, and an API whose
    /// storage calls wait for it.
    fn served() -> (Arc<Storage>, dpu_control::service::Api, StateHandle) {
        served_in(None, &TcpConfig::default())
    }

    /// [`served`] with the state kept in `dir` and the transport
    /// configured by `tcp`.
    fn served_in(
        dir: Option<&std::path::Path>,
        tcp: &TcpConfig,
    ) -> (Arc<Storage>, dpu_control::service::Api, StateHandle) {
        let state = StateHandle::open(dir).expect("state");
        let first = state.published();
        let backing = crate::config::seed::tests::backing();
        let storage = Storage::start(
            &first.state,
            None,
            tcp,
            crate::config::Config::default().target_limits(),
            backing,
        )
        .expect("no CPUs named: nothing to refuse");
        let (_task, applied) = storage.follow(&state, first.generation);
        let api = crate::config::seed::tests::api_over(
            &state,
            Default::default(),
            64 << 20,
            Some(applied),
            None,
        );
        (storage, api, state)
    }

    fn ram_namespace(size_bytes: u64) -> pb::Namespace {
        pb::Namespace {
            backend: Some(pb::namespace::Backend::Ram(pb::RamBackend { size_bytes })),
            block_size: 512,
            ..Default::default()
        }
    }

    async fn create_namespace(
        api: &dpu_control::service::Api,
        ns: pb::Namespace,
    ) -> Result<pb::Namespace, tonic::Status> {
        api.create_namespace(Request::new(pb::CreateNamespaceRequest {
            parent: "subsystems/vol".into(),
            namespace: Some(ns),
        }))
        .await
        .map(tonic::Response::into_inner)
    }

    /// Creates subsystem "vol" (NQN [`NQN`], any host).
    async fn create_vol(api: &dpu_control::service::Api) {
        api.create_subsystem(Request::new(pb::CreateSubsystemRequest {
            subsystem_id: "vol".into(),
            subsystem: Some(pb::Subsystem {
                nqn: NQN.into(),
                allow_any_host: true,
                ..Default::default()
            }),
        }))
        .await
        .unwrap();
    }

    /// Creates a TCP listener on 127.0.0.1 for subsystem "vol" and answers
    /// its port.
    async fn listen_vol(api: &dpu_control::service::Api) -> u16 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        api.create_listener(Request::new(pb::CreateListenerRequest {
            parent: "subsystems/vol".into(),
            listener_id: "l".into(),
            listener: Some(pb::Listener {
                transport: pb::Transport::Tcp as i32,
                address: "127.0.0.1".into(),
                port: u32::from(port),
                ..Default::default()
            }),
        }))
        .await
        .unwrap();
        port
    }

    /// DH-HMAC-CHAP settings reach the target when SetHostAuth returns,
    /// and leave it with the host, with ClearHostAuth and with the
    /// subsystem.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn host_auth_follows_the_state() {
        const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:h1";
        let (storage, api, _state) = served();
        create_vol(&api).await;
        let add = || {
            api.add_host(Request::new(pb::AddHostRequest {
                subsystem: "subsystems/vol".into(),
                host_nqn: HOST.into(),
            }))
        };
        let set = || {
            api.set_host_auth(Request::new(pb::SetHostAuthRequest {
                subsystem: "subsystems/vol".into(),
                auth: Some(pb::HostAuth {
                    host_nqn: HOST.into(),
                    dhchap_secret: "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:"
                        .into(),
                    dh_groups: vec!["ffdhe3072".into()],
                    ..Default::default()
                }),
            }))
        };
        let keys = || storage.target.host_keys(NQN, HOST);
        add().await.unwrap();
        assert!(keys().is_none());
        let shown = set().await.unwrap().into_inner();
        assert!(shown.host_auth[0].dhchap_secret.is_empty() && shown.host_auth[0].secret_set);
        let k = keys().expect("applied once SetHostAuth returned");
        assert_eq!(k.dh_groups, [dpu_nvmeof::auth::DhGroup::Ffdhe3072]);
        api.clear_host_auth(Request::new(pb::ClearHostAuthRequest {
            subsystem: "subsystems/vol".into(),
            host_nqn: HOST.into(),
        }))
        .await
        .unwrap();
        assert!(keys().is_none(), "cleared");
        set().await.unwrap();
        api.remove_host(Request::new(pb::RemoveHostRequest {
            subsystem: "subsystems/vol".into(),
            host_nqn: HOST.into(),
        }))
        .await
        .unwrap();
        assert!(keys().is_none(), "gone with the host");
        add().await.unwrap();
        set().await.unwrap();
        api.delete_subsystem(Request::new(pb::DeleteSubsystemRequest {
            name: "subsystems/vol".into(),
            force: true,
        }))
        .await
        .unwrap();
        assert!(keys().is_none(), "gone with the subsystem");
        storage.shutdown();
    }

    /// A listener's secure channel reaches the target when CreateListener
    /// returns and leaves it with the listener; hosts' TLS keys are taken
    /// and shown without the key, and go with the host.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn secure_channel_follows_the_state() {
        const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:h1";
        const PSK: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
        let (storage, api, state) = served();
        create_vol(&api).await;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let shown = api
            .create_listener(Request::new(pb::CreateListenerRequest {
                parent: "subsystems/vol".into(),
                listener_id: "l".into(),
                listener: Some(pb::Listener {
                    address: "127.0.0.1".into(),
                    port: u32::from(port),
                    secure_channel: pb::SecureChannel::Required as i32,
                    ..Default::default()
                }),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(shown.secure_channel, pb::SecureChannel::Required as i32);
        assert_eq!(
            storage.target.secure_channel(addr),
            dpu_nvmeof::SecureChannel::Required
        );
        let shown = api
            .set_host_tls_key(Request::new(pb::SetHostTlsKeyRequest {
                subsystem: "subsystems/vol".into(),
                tls: Some(pb::HostTls {
                    host_nqn: HOST.into(),
                    psk: PSK.into(),
                    psk_hash: 0,
                    v0_derivation: pb::TlsDerivation::Compat as i32,
                }),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            shown.host_tls,
            [pb::HostTls {
                host_nqn: HOST.into(),
                psk: String::new(),
                psk_hash: 1,
                v0_derivation: pb::TlsDerivation::Compat as i32,
            }]
        );
        assert!(!format!("{shown:?}").contains(&PSK[16..40]));
        api.clear_host_tls_key(Request::new(pb::ClearHostTlsKeyRequest {
            subsystem: "subsystems/vol".into(),
            host_nqn: HOST.into(),
        }))
        .await
        .unwrap();
        assert!(state.snapshot().subsystems["vol"].host_tls.is_empty());
        api.delete_listener(Request::new(pb::DeleteListenerRequest {
            name: "subsystems/vol/listeners/l".into(),
        }))
        .await
        .unwrap();
        assert_eq!(
            storage.target.secure_channel(addr),
            dpu_nvmeof::SecureChannel::None,
            "reset with the listener"
        );
        storage.shutdown();
    }

    /// QoS limits reach the target when the call that sets them returns
    /// (a namespace's on its limiter, a host's among the target's
    /// limiters), leave it when cleared and with the host, and reach
    /// telemetry by subsystem ID.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn qos_follows_the_state() {
        use dpu_nvmeof::qos::{QosLimits, QosScope};
        const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:h1";
        let (storage, api, state) = served();
        create_vol(&api).await;
        let ns = create_namespace(
            &api,
            pb::Namespace {
                qos: Some(pb::QosLimits {
                    iops: 1_000,
                    ..Default::default()
                }),
                ..ram_namespace(1 << 20)
            },
        )
        .await
        .unwrap();
        let ns_limits = || {
            let s = storage.target.subsystem(NQN).expect("served");
            s.namespaces[&ns.nsid].qos.limits()
        };
        assert_eq!(
            ns_limits(),
            QosLimits {
                iops: 1_000,
                ..QosLimits::default()
            },
            "applied once CreateNamespace returned"
        );
        let set_ns = |qos| {
            api.set_namespace_qos(Request::new(pb::SetNamespaceQosRequest {
                subsystem: "subsystems/vol".into(),
                nsid: ns.nsid,
                qos,
            }))
        };
        let shown = set_ns(Some(pb::QosLimits {
            read_bandwidth: 200 << 20,
            write_iops: 300,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
        assert_eq!(shown.qos.map(|q| q.write_iops), Some(300));
        let read_and_write = QosLimits {
            read_bandwidth: 200 << 20,
            write_iops: 300,
            ..QosLimits::default()
        };
        assert_eq!(
            ns_limits(),
            read_and_write,
            "applied once SetNamespaceQos returned"
        );

        let set_host = |qos| {
            api.set_host_qos(Request::new(pb::SetHostQosRequest {
                subsystem: "subsystems/vol".into(),
                host_nqn: HOST.into(),
                qos,
            }))
        };
        let host_limits = || {
            storage
                .target
                .qos_stats()
                .into_iter()
                .find(|q| q.subnqn == NQN && q.scope == QosScope::Host(HOST.into()))
                .map(|q| q.limits)
        };
        assert_eq!(host_limits(), None);
        // Any host may connect to "vol", so any host may have limits.
        let write = pb::QosLimits {
            write_bandwidth: 10 << 20,
            ..Default::default()
        };
        set_host(Some(write)).await.unwrap();
        let host_write = QosLimits {
            write_bandwidth: 10 << 20,
            ..QosLimits::default()
        };
        assert_eq!(
            host_limits(),
            Some(host_write),
            "applied once SetHostQos returned"
        );

        let source = storage.counters(state.clone());
        let mut c = Counters::default();
        source.collect(&mut c);
        let by_scope: Vec<(&str, &QosScope, QosLimits)> = c
            .qos
            .iter()
            .map(|((id, scope), q)| (id.as_str(), scope, q.limits))
            .collect();
        assert_eq!(
            by_scope,
            [
                ("vol", &QosScope::Namespace(ns.nsid), read_and_write),
                ("vol", &QosScope::Host(HOST.into()), host_write),
            ]
        );

        set_ns(None).await.unwrap();
        assert!(ns_limits().is_none(), "cleared");
        set_host(None).await.unwrap();
        assert_eq!(host_limits(), None, "cleared");
        // An unlisted host's limits go when any host may no longer connect.
        set_host(Some(write)).await.unwrap();
        api.update_subsystem(Request::new(pb::UpdateSubsystemRequest {
            subsystem: Some(pb::Subsystem {
                name: "subsystems/vol".into(),
                allow_any_host: false,
                ..Default::default()
            }),
            update_mask: Some(dpu_proto::pbjson_types::FieldMask {
                paths: vec!["allow_any_host".into()],
            }),
        }))
        .await
        .unwrap();
        assert_eq!(host_limits(), None, "gone with the host's access");
        assert!(state.snapshot().subsystems["vol"].host_qos.is_empty());
        storage.shutdown();
    }

    /// A tenant's storage limits reach its target when
    /// SetTenantStorageQos returns, though nothing else changed; they leave
    /// it when cleared, and reach telemetry by tenant ID.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tenant_storage_qos_follows_the_state() {
        use dpu_control::model::{Action, RuleSet, Tenant, Timestamp};
        use dpu_nvmeof::qos::QosLimits;
        use dpu_proto::v1::tenant_service_server::TenantService;
        let (storage, api, state) = served();
        // Blue, with a storage endpoint: a subsystem listening in its
        // network, so it has a target of its own.
        state
            .mutate(|s| {
                s.tenants.insert(
                    "blue".into(),
                    Tenant {
                        id: "blue".into(),
                        display_name: String::new(),
                        attachments: Vec::new(),
                        default_policy: Action::Deny,
                        create_time: Timestamp::now(),
                        rules: RuleSet::default(),
                        storage_qos: Default::default(),
                        vlan_id: 0,
                        no_offload: false,
                    },
                );
                let sub = subsystem("blue1", &[("e", Some("blue"), 4420)]);
                s.subsystems.insert(sub.id.clone(), sub);
                Ok(())
            })
            .await
            .unwrap();
        let set = |qos| {
            api.set_tenant_storage_qos(Request::new(pb::SetTenantStorageQosRequest {
                tenant: "tenants/blue".into(),
                qos,
            }))
        };
        let limits = pb::QosLimits {
            iops: 5_000,
            write_bandwidth: 100 << 20,
            ..Default::default()
        };
        let shown = set(Some(limits)).await.unwrap().into_inner();
        assert_eq!(shown.storage_qos, Some(limits));
        let blue = || {
            storage
                .tenant_targets()
                .into_iter()
                .find(|(t, _)| t == "blue")
                .map(|(_, target)| target)
                .expect("blue has a target")
        };
        let want = QosLimits {
            iops: 5_000,
            write_bandwidth: 100 << 20,
            ..QosLimits::default()
        };
        assert_eq!(
            blue().qos(),
            want,
            "applied once SetTenantStorageQos returned"
        );
        assert!(
            storage.target.qos().is_none(),
            "the kernel sockets' target is no tenant's"
        );

        let source = storage.counters(state.clone());
        let mut c = Counters::default();
        source.collect(&mut c);
        assert_eq!(
            c.qos
                .get(&("blue".to_string(), QosScope::Target))
                .map(|q| q.limits),
            Some(want)
        );

        set(None).await.unwrap();
        assert!(blue().qos().is_none(), "cleared");
        let e = api
            .set_tenant_storage_qos(Request::new(pb::SetTenantStorageQosRequest {
                tenant: "tenants/red".into(),
                qos: Some(limits),
            }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        storage.shutdown();
    }

    /// The target's own counters reach telemetry each from its own source:
    /// connections accepted and open, the poll groups' queues, and the
    /// refusals at accept by the limit that refused them.
    #[tokio::test]
    async fn target_counters_reach_telemetry() {
        let tcp = TcpConfig {
            poll_groups: 2,
            max_connections: 2,
            max_connections_per_address: 1,
            ..TcpConfig::default()
        };
        let (storage, api, state) = served_in(None, &tcp);
        create_vol(&api).await;
        let port = listen_vol(&api).await;
        let source = storage.counters(state);
        let collect = || {
            let mut c = Counters::default();
            source.collect(&mut c);
            c.nvmf_target
        };
        // Accepted one at a time, in this order: the second from
        // 127.0.0.1 is over the per-address limit, the one from
        // 127.0.0.3 over the total.
        let mut held = Vec::new();
        for from in ["127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.3"] {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
            held.push(sock.connect(([127, 0, 0, 1], port).into()).await.unwrap());
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut t = collect();
        while t.connections_accepted
            + t.refused_max_connections
            + t.refused_max_connections_per_address
            < 4
        {
            assert!(std::time::Instant::now() < deadline, "{t:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
            t = collect();
        }
        assert_eq!(
            t,
            pb::NvmfTargetCounters {
                connections_accepted: 2,
                open_connections: 2,
                refused_max_connections: 1,
                refused_max_connections_per_address: 1,
                poll_group_queues: vec![0, 0],
                ..Default::default()
            }
        );
        storage.shutdown();
    }

    /// When DeleteNamespace returns, the target no longer serves the
    /// namespace and the I/O that was running on it has ended; when
    /// CreateNamespace and ResizeNamespace return, the target serves the
    /// namespace at its new size.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn storage_calls_return_once_the_target_serves_their_change() {
        let (storage, api, _state) = served();
        create_vol(&api).await;
        let ns = create_namespace(&api, ram_namespace(1 << 20))
            .await
            .unwrap();
        let live = |nsid| {
            storage
                .target
                .subsystem(NQN)
                .and_then(|s| s.namespaces.get(&nsid).cloned())
        };
        let served = live(ns.nsid).expect("served once CreateNamespace returned");
        api.resize_namespace(Request::new(pb::ResizeNamespaceRequest {
            name: ns.name.clone(),
            size_bytes: 2 << 20,
        }))
        .await
        .unwrap();
        assert_eq!(
            served.blocks(),
            4096,
            "resized once ResizeNamespace returned"
        );

        // I/O running on the namespace while it is deleted.
        let done = Arc::new(AtomicBool::new(false));
        let (started_tx, started) = std::sync::mpsc::channel();
        let io = {
            let (ns, done) = (served.clone(), done.clone());
            std::thread::spawn(move || {
                ns.run(|b| {
                    started_tx.send(()).expect("test waits");
                    std::thread::sleep(Duration::from_millis(300));
                    b.write_at(0, &[1; 512], false)?;
                    done.store(true, Ordering::SeqCst);
                    Ok(())
                })
            })
        };
        started.recv().unwrap();
        api.delete_namespace(Request::new(pb::DeleteNamespaceRequest {
            name: ns.name.clone(),
        }))
        .await
        .unwrap();
        assert!(
            done.load(Ordering::SeqCst),
            "DeleteNamespace returned while I/O ran on the namespace"
        );
        assert!(live(ns.nsid).is_none(), "deleted namespace still served");
        assert!(served.is_removed());
        io.join().unwrap().unwrap();
        storage.shutdown();
    }

    /// A change the target cannot apply is undone, in the state file too,
    /// and the call fails naming what and why; once the cause is gone,
    /// the same call succeeds and the target serves it.
    #[tokio::test]
    async fn a_change_the_target_cannot_apply_is_undone_and_can_be_retried() {
        let state_dir = tempfile::tempdir().unwrap();
        let (storage, api, state) = served_in(Some(state_dir.path()), &TcpConfig::default());
        create_vol(&api).await;
        let stored_namespaces = || {
            let on_disk = StateHandle::open(Some(state_dir.path())).expect("state file");
            let n = on_disk.snapshot().subsystems["vol"].namespaces.len();
            (state.snapshot().subsystems["vol"].namespaces.len(), n)
        };
        let dir = tempfile::tempdir().unwrap();
        let parent = dir.path().join("no-such-dir");
        let file = || pb::Namespace {
            backend: Some(pb::namespace::Backend::File(pb::FileBackend {
                path: parent.join("disk.img").display().to_string(),
                size_bytes: 1 << 20,
            })),
            block_size: 512,
            ..Default::default()
        };
        let err = create_namespace(&api, file()).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        let msg = err.message();
        assert!(
            msg.starts_with("the NVMe-oF target could not apply it (subsystems/vol/namespaces/1: ")
                && msg.ends_with("; the change was undone"),
            "{msg}"
        );
        assert_eq!(stored_namespaces(), (0, 0), "neither stored nor persisted");

        std::fs::create_dir(&parent).unwrap();
        let ns = create_namespace(&api, file()).await.unwrap();
        assert_eq!(ns.name, "subsystems/vol/namespaces/1");
        assert!(storage
            .target
            .subsystem(NQN)
            .is_some_and(|s| s.namespaces.contains_key(&1)));
        assert_eq!(stored_namespaces(), (1, 1));

        // A listener on a port another socket holds.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let create_listener = || {
            api.create_listener(Request::new(pb::CreateListenerRequest {
                parent: "subsystems/vol".into(),
                listener_id: "l".into(),
                listener: Some(pb::Listener {
                    transport: pb::Transport::Tcp as i32,
                    address: "127.0.0.1".into(),
                    port: u32::from(port),
                    ..Default::default()
                }),
            }))
        };
        let err = create_listener().await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(
            err.message().contains(&format!(
                "subsystems/vol/listeners/l: cannot listen on 127.0.0.1:{port}"
            )) && err.message().ends_with("; the change was undone"),
            "{}",
            err.message()
        );
        assert!(state.snapshot().subsystems["vol"].listeners.is_empty());
        drop(taken);
        create_listener().await.unwrap();
        std::net::TcpStream::connect(("127.0.0.1", port)).expect("the target listens");
        storage.shutdown();
    }
}
