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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use dpu_os::backing::{BackingPolicy, Identity, OpenHow};

use crate::auth::controller::HostKeys;
use crate::auth::limit::{AuthLimiter, AuthRate};
use crate::backend::{Backend, FileBackend, NullBackend, RamBackend};
use crate::budget::SharedBudget;
use crate::controller::{Controller, ControllerKind, Health};
use crate::timeouts::Timeouts;

/// Where a namespace's blocks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSpec {
    /// Memory of `size` bytes (allocated as written).
    Ram {
        /// Size in bytes.
        size: u64,
    },
    /// A regular file beneath a directory the target's
    /// [`BackingPolicy`] allows.
    File {
        /// Path of the file.
        path: PathBuf,
        /// Size in bytes; 0 takes the file's own size. A smaller file is
        /// grown to it.
        size: u64,
        /// The service creates the file (it is created with `size`
        /// bytes if missing) and may make it smaller. Without it, the
        /// file must exist and is never made smaller: its size is at
        /// least `size`.
        created: bool,
    },
    /// A block device the target's [`BackingPolicy`] allows, opened
    /// exclusively; its size is the device's.
    BlockDevice {
        /// Path of the device node.
        path: PathBuf,
    },
    /// Reads return zeros, writes vanish (benchmarks).
    Null {
        /// Size in bytes.
        size: u64,
    },
}

impl BackendSpec {
    /// True if `other` names the same backing store (possibly resized).
    fn same_store(&self, other: &BackendSpec) -> bool {
        match (self, other) {
            (Self::Ram { .. }, Self::Ram { .. }) | (Self::Null { .. }, Self::Null { .. }) => true,
            (Self::File { path: a, .. }, Self::File { path: b, .. }) => a == b,
            (Self::BlockDevice { path: a }, Self::BlockDevice { path: b }) => a == b,
            _ => false,
        }
    }

    /// The size a backend of `cur` bytes must be resized to, if any: a
    /// file the service did not create, or one configured with size 0,
    /// is never made smaller.
    fn resize_to(&self, cur: u64) -> Option<u64> {
        match *self {
            Self::Ram { size } | Self::Null { size } => Some(size),
            Self::File { size, created, .. } if size != 0 && (created || size > cur) => Some(size),
            Self::File { .. } | Self::BlockDevice { .. } => None,
        }
        .filter(|s| *s != cur)
    }

    /// Opens the store, a file or device through `policy`; answers the
    /// file or device opened, if any.
    fn open(&self, policy: &BackingPolicy) -> io::Result<(Arc<dyn Backend>, Option<Identity>)> {
        let file = |b: FileBackend| {
            let id = b.identity();
            (Arc::new(b) as Arc<dyn Backend>, Some(id))
        };
        Ok(match self {
            Self::Ram { size } => (Arc::new(RamBackend::new(*size)), None),
            Self::File {
                path,
                size,
                created,
            } => {
                let open = |direct| {
                    let how = OpenHow {
                        create: *created,
                        direct,
                    };
                    Ok(policy.open_file(path, how)?)
                };
                let grow = (*size != 0).then_some(*size);
                file(FileBackend::open_by(path, &open, grow, *created)?)
            }
            Self::BlockDevice { path } => {
                let open = |direct| Ok(policy.open_block_device(path, direct)?);
                file(FileBackend::open_by(path, &open, None, false)?)
            }
            Self::Null { size } => (Arc::new(NullBackend::new(*size)), None),
        })
    }
}

/// A namespace as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceConfig {
    /// Namespace ID (1-based).
    pub nsid: u32,
    /// Logical block size: 512 or 4096.
    pub block_size: u32,
    /// Namespace UUID.
    pub uuid: [u8; 16],
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// Backing store.
    pub backend: BackendSpec,
}

/// A subsystem as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemConfig {
    /// NVMe Qualified Name.
    pub nqn: String,
    /// Serial number (up to 20 ASCII characters).
    pub serial: String,
    /// Model number (up to 40 ASCII characters).
    pub model: String,
    /// Any host may connect.
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect.
    pub allowed_hosts: BTreeSet<String>,
    /// Largest namespace ID.
    pub max_namespaces: u32,
    /// Namespaces.
    pub namespaces: Vec<NamespaceConfig>,
    /// Transport addresses the subsystem is exported on.
    pub listeners: Vec<SocketAddr>,
}

/// Everything the target serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetConfig {
    /// Subsystems.
    pub subsystems: Vec<SubsystemConfig>,
    /// The discovery controller's own listener (it also answers on every
    /// subsystem listener).
    pub discovery: Option<SocketAddr>,
}

impl TargetConfig {
    /// Every address the transport must listen on.
    pub fn listen_addrs(&self) -> BTreeSet<SocketAddr> {
        self.subsystems
            .iter()
            .flat_map(|s| s.listeners.iter().copied())
            .chain(self.discovery)
            .collect()
    }
}

/// The answer to I/O for a namespace taken out of service after the
/// command was accepted but before its I/O ran, carried inside an
/// [`io::Error`] (kind [`io::ErrorKind::NotFound`]); a connection completes
/// such a command with Invalid Namespace or Format, as it does commands that
/// arrive later. See [`is_namespace_removed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("namespace {nsid} was removed")]
pub struct NamespaceRemoved {
    /// The namespace.
    pub nsid: u32,
}

impl From<NamespaceRemoved> for io::Error {
    fn from(e: NamespaceRemoved) -> Self {
        io::Error::new(io::ErrorKind::NotFound, e)
    }
}

/// True when `e` is a [`NamespaceRemoved`] answer.
pub fn is_namespace_removed(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.is::<NamespaceRemoved>())
}

/// A namespace being served.
///
/// A snapshot: a resize or a new block size makes a new `Namespace` that
/// shares the backend (and its [`Namespace::run`] gate) with the old one, so
/// I/O accepted before the change goes on. When the backend leaves service
/// (the namespace or its subsystem is deleted, its store replaced, or its
/// NSID given to a namespace with another UUID or NGUID),
/// [`Target::apply`] waits for the I/O running on it and fails the I/O that
/// had not started yet: once `apply` returns, nothing touches that backend.
#[derive(Debug)]
pub struct Namespace {
    /// Namespace ID.
    pub nsid: u32,
    /// log2 of the logical block size.
    pub lba_shift: u8,
    /// Namespace UUID.
    pub uuid: [u8; 16],
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// The backend.
    pub backend: Arc<dyn Backend>,
    spec: BackendSpec,
    /// The file or device behind the backend, if any.
    identity: Option<Identity>,
    /// True once the backend left service. I/O holds it for reading while
    /// it runs; taking it out of service holds it for writing.
    removed: Arc<RwLock<bool>>,
}

impl Namespace {
    /// Size in logical blocks (follows the backend while it is resized).
    pub fn blocks(&self) -> u64 {
        self.backend.len() >> self.lba_shift
    }

    /// Runs `io` on the backend unless the namespace has left service.
    ///
    /// # Errors
    ///
    /// [`NamespaceRemoved`] when it has, else whatever `io` answers.
    pub fn run<T>(&self, io: impl FnOnce(&dyn Backend) -> io::Result<T>) -> io::Result<T> {
        let removed = self.removed.read().unwrap_or_else(PoisonError::into_inner);
        if *removed {
            return Err(NamespaceRemoved { nsid: self.nsid }.into());
        }
        io(&*self.backend)
    }

    /// True once the namespace's backend has left service.
    pub fn is_removed(&self) -> bool {
        *self.removed.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the backend out of service: waits for the I/O running in
    /// [`Namespace::run`], and makes every later `run` fail.
    fn retire(&self) {
        *self.removed.write().unwrap_or_else(PoisonError::into_inner) = true;
    }
}

/// A subsystem being served: an immutable snapshot, replaced as a whole.
#[derive(Debug)]
pub struct Subsystem {
    /// NVMe Qualified Name.
    pub nqn: String,
    /// Serial number.
    pub serial: String,
    /// Model number.
    pub model: String,
    /// Any host may connect.
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect.
    pub allowed_hosts: BTreeSet<String>,
    /// Largest namespace ID.
    pub max_namespaces: u32,
    /// Namespaces by NSID.
    pub namespaces: BTreeMap<u32, Arc<Namespace>>,
    /// Transport addresses.
    pub listeners: Vec<SocketAddr>,
}

impl Subsystem {
    /// True if `host_nqn` may connect.
    pub fn allows_host(&self, host_nqn: &str) -> bool {
        self.allow_any_host || self.allowed_hosts.contains(host_nqn)
    }

    /// True if the subsystem is exported on the listener at `local` (a
    /// listener on a wildcard address matches any local address).
    pub fn exported_on(&self, local: SocketAddr) -> bool {
        self.listeners
            .iter()
            .any(|l| l.port() == local.port() && (l.ip().is_unspecified() || l.ip() == local.ip()))
    }
}

/// Why a configuration could not be applied in full.
#[derive(Debug, thiserror::Error)]
#[error("subsystem {nqn} namespace {nsid}: {source}")]
pub struct ApplyError {
    /// Subsystem.
    pub nqn: String,
    /// Namespace.
    pub nsid: u32,
    /// What went wrong opening or resizing its backend.
    #[source]
    pub source: io::Error,
}

/// A namespace [`Target::apply`] is about to serve.
struct Built {
    ns: Arc<Namespace>,
    /// Hosts must be told: new, resized or reformatted.
    differs: bool,
    /// Its backend was opened by this apply.
    opened: bool,
}

impl Built {
    /// `p`, served on as it is.
    fn kept(p: &Arc<Namespace>) -> Self {
        Self {
            ns: p.clone(),
            differs: false,
            opened: false,
        }
    }
}

/// Leaves out every namespace whose backend this apply opened on a file
/// or device that another namespace of `built` serves (one served
/// before, or one listed earlier), reporting it and keeping what
/// `current` served under its NSID: two namespaces on one store would
/// each cache and write it unaware of the other.
fn one_store_each(
    current: &HashMap<String, Arc<Subsystem>>,
    built: &mut [(&SubsystemConfig, BTreeMap<u32, Built>)],
    errors: &mut Vec<ApplyError>,
) {
    let mut owner: HashMap<Identity, (String, u32)> = HashMap::new();
    for (sc, nss) in built.iter() {
        for (nsid, b) in nss.iter().filter(|(_, b)| !b.opened) {
            if let Some(id) = b.ns.identity {
                owner.insert(id, (sc.nqn.clone(), *nsid));
            }
        }
    }
    for (sc, nss) in built.iter_mut() {
        let prev = |nsid: &u32| current.get(&sc.nqn)?.namespaces.get(nsid).cloned();
        let mut refused = Vec::new();
        for (nsid, b) in nss.iter().filter(|(_, b)| b.opened) {
            let Some(id) = b.ns.identity else { continue };
            match owner.get(&id) {
                Some((nqn, other)) => refused.push((
                    *nsid,
                    format!(
                        "the same file or device already backs subsystem {nqn} namespace {other}"
                    ),
                )),
                None => {
                    owner.insert(id, (sc.nqn.clone(), *nsid));
                }
            }
        }
        for (nsid, why) in refused {
            nss.remove(&nsid);
            if let Some(p) = prev(&nsid) {
                nss.insert(nsid, Built::kept(&p));
            }
            errors.push(ApplyError {
                nqn: sc.nqn.clone(),
                nsid,
                source: io::Error::new(io::ErrorKind::AlreadyExists, why),
            });
        }
    }
}

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
    controllers: Mutex<Controllers>,
    discovery_genctr: AtomicU64,
    stats: TargetStats,
    health: Mutex<HashMap<String, Arc<Health>>>,
    write_budget: SharedBudget,
    timeouts: RwLock<Timeouts>,
    hosts: Mutex<HostConnections>,
    auth: RwLock<AuthConfig>,
    auth_limiter: AuthLimiter,
}

/// In-band authentication settings, per subsystem and host.
#[derive(Debug, Default)]
struct AuthConfig {
    /// Keys by (subsystem NQN, host NQN).
    keys: HashMap<(String, String), Arc<HostKeys>>,
    /// Whether a subsystem requires authentication, where set; by default
    /// it does for each host that has a secret.
    required: HashMap<String, bool>,
}

/// Connections per host NQN, against [`Target::set_max_connections_per_host`].
#[derive(Debug)]
struct HostConnections {
    max: usize,
    open: HashMap<String, usize>,
    /// When a refusal was last logged, per host NQN (bounded).
    logged: HashMap<String, std::time::Instant>,
}

impl Default for HostConnections {
    fn default() -> Self {
        Self {
            max: DEFAULT_MAX_CONNECTIONS_PER_HOST,
            open: HashMap::new(),
            logged: HashMap::new(),
        }
    }
}

/// Default of [`Target::set_max_connections_per_host`]: several
/// controllers of 128 queues each.
pub const DEFAULT_MAX_CONNECTIONS_PER_HOST: usize = 512;

/// A connected queue's place under the per-host limit; given back when
/// dropped.
#[derive(Debug)]
pub(crate) struct HostAdmission {
    target: Target,
    host: String,
}

impl Drop for HostAdmission {
    fn drop(&mut self) {
        let mut h = self.target.inner.hosts.lock().expect("hosts lock");
        if let Some(n) = h.open.get_mut(&self.host) {
            *n -= 1;
            if *n == 0 {
                h.open.remove(&self.host);
            }
        }
    }
}

#[derive(Debug, Default)]
struct Controllers {
    by_id: HashMap<u16, Arc<Controller>>,
    next: u16,
}

/// Largest dynamic controller ID (0xFFF0.. are reserved).
const MAX_CNTLID: u16 = 0xffef;

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

    /// Sets (`Some`) or removes (`None`) the DH-HMAC-CHAP secrets and
    /// allowed hashes and DH groups of host `hostnqn` on subsystem
    /// `subnqn`. Queues that connect from now on use them; queues already
    /// authenticated stay so.
    pub fn set_host_keys(&self, subnqn: &str, hostnqn: &str, keys: Option<HostKeys>) {
        let mut a = self.inner.auth.write().expect("auth lock");
        let k = (subnqn.to_owned(), hostnqn.to_owned());
        match keys {
            Some(keys) => {
                a.keys.insert(k, Arc::new(keys));
            }
            None => {
                a.keys.remove(&k);
            }
        }
    }

    /// The DH-HMAC-CHAP keys of `hostnqn` on `subnqn`, if set.
    pub fn host_keys(&self, subnqn: &str, hostnqn: &str) -> Option<Arc<HostKeys>> {
        self.inner
            .auth
            .read()
            .expect("auth lock")
            .keys
            .get(&(subnqn.to_owned(), hostnqn.to_owned()))
            .cloned()
    }

    /// Makes subsystem `subnqn` require authentication of every host
    /// (`Some(true)`), of none (`Some(false)`), or (`None`, the default)
    /// of each host that has a secret. A host without a secret where it
    /// is required cannot connect.
    pub fn set_auth_required(&self, subnqn: &str, required: Option<bool>) {
        let mut a = self.inner.auth.write().expect("auth lock");
        match required {
            Some(r) => {
                a.required.insert(subnqn.to_owned(), r);
            }
            None => {
                a.required.remove(subnqn);
            }
        }
    }

    /// Whether `hostnqn`'s queues on `subnqn` must authenticate, and with
    /// which keys.
    pub(crate) fn auth_policy(&self, subnqn: &str, hostnqn: &str) -> (bool, Option<Arc<HostKeys>>) {
        let a = self.inner.auth.read().expect("auth lock");
        let keys = a
            .keys
            .get(&(subnqn.to_owned(), hostnqn.to_owned()))
            .cloned();
        let required = a.required.get(subnqn).copied().unwrap_or(keys.is_some());
        (required, keys)
    }

    /// Authentication attempts per source address.
    pub fn auth_limiter(&self) -> &AuthLimiter {
        &self.inner.auth_limiter
    }

    /// Limits authentication attempts per source address (default
    /// [`AuthRate::default`]).
    pub fn set_auth_rate(&self, rate: AuthRate) {
        self.inner.auth_limiter.set_rate(rate);
    }

    /// Counters.
    pub fn stats(&self) -> &TargetStats {
        &self.inner.stats
    }

    /// Limits the queues (connections past Connect) of one host NQN, on
    /// all controllers together (default
    /// [`DEFAULT_MAX_CONNECTIONS_PER_HOST`]); a Connect beyond it is
    /// refused with Controller Busy and counted in
    /// [`TargetStats::connects_over_host_limit`]. Lowering it closes
    /// nothing.
    pub fn set_max_connections_per_host(&self, max: usize) {
        self.inner.hosts.lock().expect("hosts lock").max = max.max(1);
    }

    /// Admits one more queue of `host`, or refuses it (counted, logged at
    /// most once a minute per host).
    pub(crate) fn admit_host(&self, host: &str) -> Option<HostAdmission> {
        let mut h = self.inner.hosts.lock().expect("hosts lock");
        let n = h.open.get(host).copied().unwrap_or(0);
        if n >= h.max {
            self.inner
                .stats
                .connects_over_host_limit
                .fetch_add(1, Ordering::Relaxed);
            let now = std::time::Instant::now();
            let due = h
                .logged
                .get(host)
                .is_none_or(|t| now.duration_since(*t) >= std::time::Duration::from_secs(60));
            if due {
                if h.logged.len() >= 4096 {
                    h.logged.clear();
                }
                h.logged.insert(host.to_string(), now);
                tracing::warn!(%host, max = h.max, "NVMe/TCP Connect refused: the host holds its most connections (max_connections_per_host)");
            }
            return None;
        }
        *h.open.entry(host.to_string()).or_default() += 1;
        Some(HostAdmission {
            target: self.clone(),
            host: host.to_string(),
        })
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

    /// The budget connections reserve R2T write data from.
    pub(crate) fn write_budget(&self) -> &SharedBudget {
        &self.inner.write_budget
    }

    /// The subsystem with `nqn`, if served.
    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.inner
            .subsystems
            .read()
            .expect("subsystems lock")
            .get(nqn)
            .cloned()
    }

    /// Every subsystem served, sorted by NQN.
    pub fn subsystems(&self) -> Vec<Arc<Subsystem>> {
        let mut v: Vec<_> = self
            .inner
            .subsystems
            .read()
            .expect("subsystems lock")
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.nqn.cmp(&b.nqn));
        v
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

    /// The discovery log's generation counter.
    pub fn discovery_genctr(&self) -> u64 {
        self.inner.discovery_genctr.load(Ordering::Relaxed)
    }

    /// Serves `config` from now on. Namespaces whose backend cannot be
    /// opened or resized, or whose file or device another namespace
    /// serves already, are left out (or keep their old size) and
    /// reported; everything else is applied.
    ///
    /// Backends are opened and resized before the new configuration
    /// replaces the old, under no lock that I/O takes: a slow open (a
    /// device, a file on a slow filesystem) delays no command. Concurrent
    /// calls run one after the other.
    pub fn apply(&self, config: &TargetConfig) -> Vec<ApplyError> {
        let _one = self
            .inner
            .applying
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = self
            .inner
            .subsystems
            .read()
            .expect("subsystems lock")
            .clone();
        let mut errors = Vec::new();
        let mut built = Vec::with_capacity(config.subsystems.len());
        for sc in &config.subsystems {
            let old = current.get(&sc.nqn);
            let mut namespaces = BTreeMap::new();
            for nc in &sc.namespaces {
                let prev = old.and_then(|o| o.namespaces.get(&nc.nsid));
                match Self::namespace(&self.inner.backing, prev, nc) {
                    Ok(b) => {
                        namespaces.insert(nc.nsid, b);
                    }
                    Err(source) => {
                        errors.push(ApplyError {
                            nqn: sc.nqn.clone(),
                            nsid: nc.nsid,
                            source,
                        });
                        // Keep serving what was there.
                        if let Some(p) = prev {
                            namespaces.insert(nc.nsid, Built::kept(p));
                        }
                    }
                }
            }
            built.push((sc, namespaces));
        }
        one_store_each(&current, &mut built, &mut errors);

        let mut changed: Vec<(String, Vec<u32>)> = Vec::new();
        let mut gone: Vec<String> = Vec::new();
        let mut retired: Vec<Arc<Namespace>> = Vec::new();
        let mut discovery_changed = false;
        let mut next = HashMap::new();
        for (sc, built) in built {
            let old = current.get(&sc.nqn);
            let mut ns_changed: Vec<u32> = built
                .iter()
                .filter(|(_, b)| b.differs)
                .map(|(n, _)| *n)
                .collect();
            let namespaces: BTreeMap<u32, Arc<Namespace>> =
                built.into_iter().map(|(n, b)| (n, b.ns)).collect();
            if let Some(o) = old {
                ns_changed.extend(o.namespaces.keys().filter(|n| !namespaces.contains_key(n)));
                discovery_changed |= o.listeners != sc.listeners
                    || o.allow_any_host != sc.allow_any_host
                    || o.allowed_hosts != sc.allowed_hosts;
            } else {
                discovery_changed = true;
            }
            ns_changed.sort_unstable();
            if !ns_changed.is_empty() {
                changed.push((sc.nqn.clone(), ns_changed));
            }
            next.insert(
                sc.nqn.clone(),
                Arc::new(Subsystem {
                    nqn: sc.nqn.clone(),
                    serial: sc.serial.clone(),
                    model: sc.model.clone(),
                    allow_any_host: sc.allow_any_host,
                    allowed_hosts: sc.allowed_hosts.clone(),
                    max_namespaces: sc.max_namespaces,
                    namespaces,
                    listeners: sc.listeners.clone(),
                }),
            );
        }
        for nqn in current.keys() {
            if !next.contains_key(nqn) {
                gone.push(nqn.clone());
                discovery_changed = true;
            }
        }
        // Backends no longer served: deleted namespaces and
        // subsystems, replaced stores.
        for (nqn, old) in current.iter() {
            let kept = next.get(nqn);
            for ns in old.namespaces.values() {
                let serving = kept
                    .and_then(|k| k.namespaces.get(&ns.nsid))
                    .is_some_and(|n| Arc::ptr_eq(&n.removed, &ns.removed));
                if !serving {
                    retired.push(ns.clone());
                }
            }
        }
        *self.inner.subsystems.write().expect("subsystems lock") = next;
        // New commands no longer find them; wait for the I/O already on
        // them, and fail what was accepted but has not run.
        for ns in retired {
            ns.retire();
        }
        if discovery_changed {
            self.inner.discovery_genctr.fetch_add(1, Ordering::Relaxed);
        }
        let ctrls: Vec<Arc<Controller>> = self
            .inner
            .controllers
            .lock()
            .expect("controllers lock")
            .by_id
            .values()
            .cloned()
            .collect();
        let subs = self
            .inner
            .subsystems
            .read()
            .expect("subsystems lock")
            .clone();
        for c in ctrls {
            let revoked = match subs.get(&c.subnqn) {
                Some(s) if c.kind == ControllerKind::Io => {
                    if !s.allows_host(&c.hostnqn) {
                        Some("host no longer allowed")
                    } else if !s.exported_on(c.listener) {
                        Some("listener removed")
                    } else {
                        None
                    }
                }
                _ => None,
            };
            if gone.iter().any(|g| *g == c.subnqn) {
                tracing::info!(cntlid = c.cntlid, subnqn = %c.subnqn, "subsystem removed; ending its controller");
                c.kill();
            } else if let Some(why) = revoked {
                tracing::warn!(cntlid = c.cntlid, subnqn = %c.subnqn, hostnqn = %c.hostnqn, listener = %c.listener, "{why}; disconnecting the controller");
                self.inner
                    .stats
                    .controllers_revoked
                    .fetch_add(1, Ordering::Relaxed);
                c.kill();
            } else if let Some((_, nsids)) = changed.iter().find(|(n, _)| *n == c.subnqn) {
                c.namespaces_changed(nsids);
            } else if discovery_changed && c.kind == ControllerKind::Discovery {
                c.discovery_changed();
            }
        }
        errors
    }

    /// The namespace for `nc`, reusing `prev`'s backend when it is the same
    /// namespace (same UUID and NGUID) on the same store; the flag says
    /// whether hosts must be told (new or resized).
    ///
    /// A namespace's UUID and NGUID stay fixed for its life (so the NVMe
    /// base specification has it), so other identifiers under the same NSID
    /// mean it was deleted and another created, even when one
    /// configuration carries both changes: the new one gets a backend of
    /// its own (empty, for RAM) and the old one is retired, failing the
    /// commands accepted against it.
    fn namespace(
        backing: &BackingPolicy,
        prev: Option<&Arc<Namespace>>,
        nc: &NamespaceConfig,
    ) -> io::Result<Built> {
        let lba_shift = nc.block_size.max(512).trailing_zeros() as u8;
        let same = |p: &&Arc<Namespace>| {
            p.uuid == nc.uuid && p.nguid == nc.nguid && p.spec.same_store(&nc.backend)
        };
        let (backend, identity, removed, differs, opened) = match prev.filter(same) {
            Some(p) => {
                let resized = match nc.backend.resize_to(p.backend.len()) {
                    Some(size) => {
                        p.backend.resize(size)?;
                        true
                    }
                    None => false,
                };
                let differs = resized || p.lba_shift != lba_shift;
                if !differs && p.spec == nc.backend {
                    return Ok(Built::kept(p));
                }
                let b = p.backend.clone();
                (b, p.identity, p.removed.clone(), differs, false)
            }
            None => {
                let (b, identity) = nc.backend.open(backing)?;
                (b, identity, Arc::default(), true, true)
            }
        };
        let ns = Namespace {
            nsid: nc.nsid,
            lba_shift,
            uuid: nc.uuid,
            nguid: nc.nguid,
            backend,
            spec: nc.backend.clone(),
            identity,
            removed,
        };
        Ok(Built {
            ns: Arc::new(ns),
            differs,
            opened,
        })
    }

    /// Registers a new controller with a fresh dynamic controller ID.
    pub(crate) fn add_controller(
        &self,
        make: impl FnOnce(u16) -> Controller,
    ) -> Option<Arc<Controller>> {
        let mut c = self.inner.controllers.lock().expect("controllers lock");
        for _ in 0..MAX_CNTLID {
            c.next = if c.next >= MAX_CNTLID { 1 } else { c.next + 1 };
            let id = c.next;
            if let std::collections::hash_map::Entry::Vacant(e) = c.by_id.entry(id) {
                return Some(e.insert(Arc::new(make(id))).clone());
            }
        }
        None
    }

    /// The live controller with `cntlid`.
    pub(crate) fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.inner
            .controllers
            .lock()
            .expect("controllers lock")
            .by_id
            .get(&cntlid)
            .cloned()
    }

    /// Forgets a controller (its admin queue went away).
    pub(crate) fn remove_controller(&self, cntlid: u16) {
        let c = self
            .inner
            .controllers
            .lock()
            .expect("controllers lock")
            .by_id
            .remove(&cntlid);
        if let Some(c) = c {
            c.kill();
        }
    }

    /// Number of live controllers.
    pub fn controller_count(&self) -> usize {
        self.inner
            .controllers
            .lock()
            .expect("controllers lock")
            .by_id
            .len()
    }

    /// Ends every controller (service shutdown): their connections close at
    /// their next tick.
    pub fn shutdown(&self) {
        let all: Vec<_> = self
            .inner
            .controllers
            .lock()
            .expect("controllers lock")
            .by_id
            .drain()
            .collect();
        for (_, c) in all {
            c.kill();
        }
    }
}

/// A subsystem for unit tests: any host, one RAM namespace of `size`
/// bytes in 512-byte blocks, served on `listeners`.
#[cfg(test)]
pub(crate) fn ram_subsystem(nqn: &str, size: u64, listeners: Vec<SocketAddr>) -> SubsystemConfig {
    SubsystemConfig {
        nqn: nqn.into(),
        serial: "SN1".into(),
        model: "test".into(),
        allow_any_host: true,
        allowed_hosts: BTreeSet::new(),
        max_namespaces: 8,
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            block_size: 512,
            uuid: [1; 16],
            nguid: [2; 16],
            backend: BackendSpec::Ram { size },
        }],
        listeners,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subsystem(nqn: &str, namespaces: Vec<NamespaceConfig>) -> SubsystemConfig {
        SubsystemConfig {
            nqn: nqn.into(),
            serial: "s".into(),
            model: "m".into(),
            allow_any_host: true,
            allowed_hosts: BTreeSet::new(),
            max_namespaces: 8,
            namespaces,
            listeners: Vec::new(),
        }
    }

    fn file_ns(nsid: u32, path: &std::path::Path, size: u64, created: bool) -> NamespaceConfig {
        NamespaceConfig {
            nsid,
            block_size: 512,
            uuid: [nsid as u8; 16],
            nguid: [nsid as u8; 16],
            backend: BackendSpec::File {
                path: path.to_path_buf(),
                size,
                created,
            },
        }
    }

    fn config(subsystems: Vec<SubsystemConfig>) -> TargetConfig {
        TargetConfig {
            subsystems,
            discovery: None,
        }
    }

    fn served_len(t: &Target, nqn: &str, nsid: u32) -> Option<u64> {
        Some(t.subsystem(nqn)?.namespaces.get(&nsid)?.backend.len())
    }

    #[test]
    fn files_only_where_the_policy_allows() {
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join("a.img");
        let cfg = config(vec![subsystem(
            "nqn.a",
            vec![file_ns(1, &inside, 8192, true)],
        )]);
        let errors = Target::new().apply(&cfg);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].source.kind(), io::ErrorKind::PermissionDenied);
        assert!(!inside.exists(), "refused before anything was created");

        let policy = BackingPolicy::new(vec![dir.path().into()], vec![], None).unwrap();
        let t = Target::with_backing(policy);
        assert!(t.apply(&cfg).is_empty());
        assert_eq!(served_len(&t, "nqn.a", 1), Some(8192));
        let outside = config(vec![subsystem(
            "nqn.a",
            vec![
                file_ns(1, &inside, 8192, true),
                file_ns(2, std::path::Path::new("/etc/passwd"), 0, false),
            ],
        )]);
        let errors = t.apply(&outside);
        assert_eq!((errors.len(), errors[0].nsid), (1, 2), "{errors:?}");
        assert_eq!(errors[0].source.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(served_len(&t, "nqn.a", 2), None);
    }

    #[test]
    fn two_namespaces_never_share_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.img");
        let t = Target::with_backing(
            BackingPolicy::new(vec![dir.path().into()], vec![], None).unwrap(),
        );
        let one = subsystem("nqn.a", vec![file_ns(1, &path, 4096, true)]);
        assert!(t.apply(&config(vec![one.clone()])).is_empty());
        let twice = config(vec![
            one,
            subsystem("nqn.b", vec![file_ns(3, &path, 0, false)]),
        ]);
        let errors = t.apply(&twice);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!((errors[0].nqn.as_str(), errors[0].nsid), ("nqn.b", 3));
        assert_eq!(errors[0].source.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(served_len(&t, "nqn.a", 1), Some(4096), "the first keeps it");
        assert_eq!(served_len(&t, "nqn.b", 3), None);
    }

    #[test]
    fn a_file_the_service_did_not_create_is_never_made_smaller() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("existing.img");
        std::fs::write(&path, vec![7u8; 16384]).unwrap();
        let t = Target::with_backing(
            BackingPolicy::new(vec![dir.path().into()], vec![], None).unwrap(),
        );
        let with = |size| {
            config(vec![subsystem(
                "nqn.a",
                vec![file_ns(1, &path, size, false)],
            )])
        };
        // Size 0: the file's own, kept across later applies.
        assert!(t.apply(&with(0)).is_empty());
        assert_eq!(served_len(&t, "nqn.a", 1), Some(16384));
        assert!(t.apply(&with(0)).is_empty());
        // A smaller size is a floor, not a truncation; a larger one grows.
        assert!(t.apply(&with(4096)).is_empty());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 16384);
        assert!(t.apply(&with(32768)).is_empty());
        assert_eq!(served_len(&t, "nqn.a", 1), Some(32768));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 32768);
        let backend = t.subsystem("nqn.a").unwrap().namespaces[&1].backend.clone();
        let err = backend.resize(4096).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(std::fs::read(&path).unwrap()[..16384], [7u8; 16384]);
        // It must exist: a missing one is not created.
        let gone = dir.path().join("gone.img");
        let errors = t.apply(&config(vec![subsystem(
            "nqn.a",
            vec![file_ns(1, &gone, 4096, false)],
        )]));
        assert_eq!(errors[0].source.kind(), io::ErrorKind::NotFound);
        assert!(!gone.exists());
    }
}
