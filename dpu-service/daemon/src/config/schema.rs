//! The TOML schema of the configuration file: one type per table, with
//! its defaults. Unknown keys are errors, so a misspelt setting is
//! reported instead of silently ignored.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use dpu_control::model::{PortRole, SecureChannel};
use serde::Deserialize;

use super::LogFormat;

/// The configuration file.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// gRPC server.
    pub grpc: GrpcConfig,
    /// Prometheus endpoint.
    pub metrics: MetricsConfig,
    /// Persisted state.
    pub state: StateConfig,
    /// Logging.
    pub log: LogConfig,
    /// Storage limits.
    pub storage: StorageConfig,
    /// Data-plane engine (EAL, workers).
    pub dataplane: DataplaneConfig,
    /// Data-plane ports.
    pub ports: Vec<PortConfig>,
    /// Tenants created at startup when the state has none with their ID
    /// (`[[tenants]]`). Once created they live in the state like any
    /// other: the stored one is kept at later starts, and changes made over
    /// gRPC survive restarts.
    pub tenants: Vec<SeedTenant>,
    /// Caps on what the state may hold (`[limits]`).
    pub limits: super::LimitsConfig,
}

/// `[dataplane]`: the worker threads, their packet buffers and, for the
/// DPDK driver, EAL. Used when at least one port has a data-plane driver
/// (`"dpdk"` or `"kernel"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataplaneConfig {
    /// Worker threads; worker `i` polls RX/TX queue `i` of every port.
    pub workers: u16,
    /// The CPU each worker is pinned to, one per worker (worker `i` to
    /// `worker_cpus[i]`); empty leaves them unpinned.
    pub worker_cpus: Vec<usize>,
    /// "busy" (a dedicated core per worker, as on a DPU) or "backoff"
    /// (sleep when idle: laptops, CI).
    pub idle: IdleMode,
    /// EAL cores (`-l`), e.g. "0-3"; unset lets EAL take every core.
    pub lcores: Option<String>,
    /// Run without hugepages (`--no-huge`).
    pub no_huge: bool,
    /// Memory EAL reserves, MiB (`-m`).
    pub memory_mb: Option<u32>,
    /// Prefix of EAL's runtime files (`--file-prefix`), unique per instance.
    pub file_prefix: String,
    /// Packet buffers in the pool (DPDK mbufs, or the kernel driver's
    /// buffers).
    pub mbufs: u32,
    /// Most MAC addresses each worker learns.
    pub mac_table_size: usize,
    /// Seconds before an unseen learned MAC address is forgotten.
    pub mac_ageing_secs: u64,
    /// Most MAC addresses each worker learns for one tenant; frames from
    /// a new source address beyond it are dropped as `mac_limit`.
    pub mac_per_tenant: usize,
    /// Most MAC addresses each worker learns on one attachment (port
    /// security); beyond it, as for `mac_per_tenant`.
    pub mac_per_attachment: usize,
    /// Entries of each worker's MAC table kept for each tenant, that no
    /// other tenant's addresses can take (at most `mac_table_size` over
    /// the number of tenants); the rest is shared.
    pub mac_reserved_per_tenant: usize,
    /// Most connections tracked for stateful rules, all workers together
    /// (each worker gets an even share, allocated at start).
    pub conntrack_max: usize,
    /// Most connections one tenant may have tracked, all workers together;
    /// past it the tenant's new connections are dropped as `table_full`.
    pub conntrack_per_tenant: usize,
    /// Connections kept for each tenant with stateful rules, all workers
    /// together, that no other tenant's connections can take (an even
    /// split of `conntrack_max` if it cannot keep that many for every
    /// such tenant; never more than `conntrack_per_tenant`, so a small
    /// cap needs no smaller reserve); the rest of the table is a pool
    /// shared up to `conntrack_per_tenant`.
    pub conntrack_reserved_per_tenant: usize,
    /// Most fragmented datagrams tracked (those whose first fragment
    /// passed, so that their later fragments may), all workers together.
    pub fragments_max: usize,
    /// Most fragmented datagrams of one tenant tracked; past it (or past
    /// its reserve with the pool used up) first fragments are dropped as
    /// `fragment_table_full`.
    pub fragments_per_tenant: usize,
    /// Fragmented datagrams kept for each tenant (as
    /// `conntrack_reserved_per_tenant`).
    pub fragments_reserved_per_tenant: usize,
    /// Seconds after its first fragment that a datagram's later fragments
    /// may pass.
    pub fragment_timeout_secs: u64,
    /// Entries of each worker's flow cache in front of the classifier of
    /// tenants with 64 rules or more (32 bytes each; the default 262,144
    /// is 8 MiB a worker and serves up to about 130,000 flows a worker);
    /// 0 leaves it off.
    pub flow_cache_entries: usize,
    /// Further EAL arguments, passed as they are (e.g. "-d", a PMD path).
    pub eal_args: Vec<String>,
    /// Flow offload to the switch in front of the cores
    /// (`[dataplane.offload]`).
    pub offload: OffloadSettings,
}

/// Which flow hardware established connections are offloaded to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OffloadProvider {
    /// None: every packet is switched on the cores.
    #[default]
    None,
    /// The in-process model of a NIC with limits (tests, and machines
    /// without an eSwitch): it carries its flows' packets before the
    /// switch sees them.
    Model,
    /// The NIC behind the DPDK ports, through `rte_flow`: transfer rules
    /// of its embedded switch (a BlueField's eSwitch), or drop rules of
    /// ports without one. Needs the DPDK driver.
    RteFlow,
}

/// `[dataplane.offload]`: established TCP connections handed to flow
/// hardware after their handshake, and flows of stateless verdicts
/// (drops, and forwards without connection tracking) after a few
/// packets, each tenant within its share of the hardware table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OffloadSettings {
    /// `"none"` (default), `"rte_flow"` or `"model"`.
    pub provider: OffloadProvider,
    /// Flows in hardware at most (default 65,536; at most 1,048,576).
    pub table_size: usize,
    /// Flows one tenant may hold in hardware (default 16,384).
    pub per_tenant: usize,
    /// Flows kept for each tenant that no other tenant's can take (less
    /// when the table cannot keep that many for every tenant; default
    /// 1,024).
    pub reserved_per_tenant: usize,
    /// Insertions a second at most; offers past it stay in software
    /// (default 20,000).
    pub insert_rate: u32,
    /// Seconds an offloaded flow may go without a packet in hardware
    /// before it ages out (default 300; at most the established TCP
    /// timeout, 7,440).
    pub idle_secs: u64,
    /// Offers one worker may have queued (default 1,024).
    pub queue: usize,
    /// Packets of one flow with a stateless verdict (denied, or allowed
    /// without connection tracking or rate limit) after which the flow
    /// goes to hardware, dropped or forwarded (default 8; 0: such flows
    /// stay on the cores; at most 1,000).
    pub stateless_after: u16,
    /// The model provider's limits (`[dataplane.offload.model]`).
    pub model: ModelOffloadSettings,
}

impl Default for OffloadSettings {
    fn default() -> Self {
        Self {
            provider: OffloadProvider::None,
            table_size: 65_536,
            per_tenant: 16_384,
            reserved_per_tenant: 1_024,
            insert_rate: 20_000,
            idle_secs: 300,
            queue: 1_024,
            stateless_after: 8,
            model: ModelOffloadSettings::default(),
        }
    }
}

/// `[dataplane.offload.model]`: what the model NIC refuses, as hardware
/// without those items and actions would.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelOffloadSettings {
    /// Items and actions it refuses: `"ipv6"`, `"vlan_push"`,
    /// `"vxlan_encap"`, `"vxlan_decap"`.
    pub refuse: Vec<String>,
    /// Every this many insertions, one fails (0: none).
    pub fail_every: u32,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        Self {
            workers: 1,
            worker_cpus: Vec::new(),
            idle: IdleMode::Busy,
            lcores: None,
            no_huge: false,
            memory_mb: None,
            file_prefix: "dpu-service".into(),
            mbufs: 16_383,
            mac_table_size: 16_384,
            mac_ageing_secs: 300,
            mac_per_tenant: 4096,
            mac_per_attachment: 1024,
            mac_reserved_per_tenant: 256,
            conntrack_max: 262_144,
            conntrack_per_tenant: 65_536,
            conntrack_reserved_per_tenant: 1_024,
            fragments_max: 65_536,
            fragments_per_tenant: 16_384,
            fragments_reserved_per_tenant: 256,
            fragment_timeout_secs: 10,
            flow_cache_entries: 262_144,
            eal_args: Vec::new(),
            offload: OffloadSettings::default(),
        }
    }
}

/// What an idle worker does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdleMode {
    /// Keep polling.
    Busy,
    /// Sleep between polls when there is no traffic.
    Backoff,
}

/// Where the storage endpoints' stacks run (`storage.endpoint_placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum EndpointPlacement {
    /// A thread of their own, `storage-endpoints`.
    #[default]
    Thread,
    /// In the first worker, once a turn.
    Worker,
}

/// `[grpc]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Allow plain text on a non-loopback address.
    pub allow_insecure_remote: bool,
    /// PEM server certificate (enables TLS).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key.
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle for client certificates (enables mTLS).
    pub tls_client_ca: Option<PathBuf>,
    /// A second, plain-text listener that serves only `grpc.health.v1`
    /// (the same statuses as the main listener), for probes that cannot
    /// speak TLS, such as the kubelet's gRPC probes. `None`: no such listener.
    pub health_listen: Option<SocketAddr>,
    /// The API's clients, known by their certificates' names (mTLS), and
    /// their roles. A client certificate that names none of them may call
    /// nothing.
    pub clients: Vec<ClientConfig>,
    /// The role of callers without a client certificate (plain text, or
    /// TLS without `tls_client_ca`); with mTLS there are none.
    pub anonymous_role: AnonymousRole,
    /// Most connections open at once to the API listener (and, apart, to
    /// the health listener); past it a new one is closed at once, counted
    /// on `/metrics` (default 256).
    pub max_connections: usize,
    /// Most connections open at once from one source address (default 64).
    pub max_connections_per_source: usize,
    /// Seconds a new connection has to finish its TLS handshake and send
    /// its first call (default 10).
    pub handshake_timeout_secs: u64,
    /// Seconds a connection may stay without a call open before it is
    /// closed; clients connect again when they next call (default 300; 0:
    /// never).
    pub idle_timeout_secs: u64,
    /// Seconds between HTTP/2 pings on a connection; one unanswered for
    /// `keepalive_timeout_secs` closes it (default 30; 0: no pings).
    pub keepalive_secs: u64,
    /// Seconds a ping may go unanswered (default 10).
    pub keepalive_timeout_secs: u64,
    /// Most calls open at once on one connection (HTTP/2 streams; default
    /// 64).
    pub max_streams_per_connection: u32,
    /// Most streaming watch calls (`WatchCounters`) open at once, all
    /// connections together (default 64).
    pub max_watches: usize,
    /// Most streaming watch calls open at once on one connection
    /// (default 4).
    pub max_watches_per_connection: usize,
}

/// `[[grpc.clients]]`: one client of the API and its role.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    /// A name its certificate carries: `cn:NAME` (subject common name),
    /// `dns:NAME` (DNS subject alternative name), `uri:URI` (URI subject
    /// alternative name) or a bare SPIFFE ID `spiffe://TRUST-DOMAIN/PATH`.
    pub identity: String,
    /// Its role.
    pub role: RoleName,
    /// The tenants a `tenant-writer` may change (IDs); empty for the
    /// other roles.
    #[serde(default)]
    pub tenants: Vec<String>,
}

/// A role of `[[grpc.clients]]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RoleName {
    /// Every method.
    Admin,
    /// Gets, lists, watches, counters, service info, health and reflection.
    Reader,
    /// What a reader may, and changes to the rules and attachments (and
    /// default policy and display name) of the tenants it names.
    TenantWriter,
}

/// `grpc.anonymous_role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum AnonymousRole {
    /// Every method: the loopback quick-start (and, with
    /// `allow_insecure_remote`, anyone who reaches the listener).
    #[default]
    Admin,
    /// Read methods only.
    Reader,
    /// Nothing.
    None,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            allow_insecure_remote: false,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            health_listen: None,
            clients: Vec::new(),
            anonymous_role: AnonymousRole::Admin,
            max_connections: 256,
            max_connections_per_source: 64,
            handshake_timeout_secs: 10,
            idle_timeout_secs: 300,
            keepalive_secs: 30,
            keepalive_timeout_secs: 10,
            max_streams_per_connection: 64,
            max_watches: 64,
            max_watches_per_connection: 4,
        }
    }
}

/// `[metrics]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Listen address; `None` disables the endpoint.
    pub listen: Option<SocketAddr>,
    /// Most scrapes served at once; past it a new connection is closed at
    /// once, counted (default 32).
    pub max_connections: usize,
    /// Most scrapes served at once to one source address (default 8).
    pub max_connections_per_source: usize,
    /// Seconds a scrape may take, from its connection to the last byte of
    /// the answer (default 10).
    pub request_timeout_secs: u64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
            max_connections: 32,
            max_connections_per_source: 8,
            request_timeout_secs: 10,
        }
    }
}

/// `[state]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    /// Directory of the state file; `None` keeps state in memory only.
    pub dir: Option<PathBuf>,
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            dir: Some(PathBuf::from("/var/lib/dpu-service")),
        }
    }
}

/// `[log]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Output format.
    pub format: LogFormat,
    /// Filter directives (tracing-subscriber EnvFilter syntax).
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Human,
            level: "info".into(),
        }
    }
}

/// `[storage]`
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Most memory all RAM namespaces may use, e.g. "4GiB"; default half
    /// of the machine's memory.
    pub ram_limit: Option<String>,
    /// Address of the NVMe/TCP discovery controller's own listener, e.g.
    /// "127.0.0.1:8009". The discovery controller is also reachable on
    /// every subsystem (I/O) listener; unset, only there.
    pub discovery_listen: Option<SocketAddr>,
    /// The CPUs of the NVMe/TCP target's I/O poll groups, e.g. `[5, 6, 7]`:
    /// one group pinned to each, serving the I/O queues placed on it (a
    /// new I/O queue goes to the group with the fewest); listeners, the
    /// admin group (handshakes, admin and discovery queues) run on the
    /// process's other CPUs, off the data-plane workers' too (anywhere if
    /// that leaves none), and so do the control plane's threads. Each must
    /// be a CPU the process may use, listed once, and no data-plane
    /// worker's (`dataplane.worker_cpus`). Empty (the default):
    /// `poll_groups` groups run where the scheduler puts them, off the
    /// workers' CPUs.
    pub io_cpus: Vec<usize>,
    /// I/O poll groups when `io_cpus` is empty, 1..=256; unset or 0: one
    /// per CPU the target may use.
    pub poll_groups: usize,
    /// Most NVMe/TCP connections open at once (default 4096); the
    /// listeners close connections beyond it at once, counted on
    /// `/metrics`.
    pub max_connections: Option<usize>,
    /// Most NVMe/TCP connections open at once from one source address
    /// (default 512).
    pub max_connections_per_address: Option<usize>,
    /// Most NVMe/TCP queues (connections past Fabrics Connect) of one host
    /// NQN, over all its controllers (default 512).
    pub max_connections_per_host: Option<usize>,
    /// Seconds a new connection may take to send its ICReq (default 10).
    pub handshake_timeout_secs: Option<u64>,
    /// Seconds a PDU may take from its first byte to its last (default 10).
    pub pdu_timeout_secs: Option<u64>,
    /// Seconds a host may take no byte of the target's output before its
    /// connection is closed (default 10).
    pub write_timeout_secs: Option<u64>,
    /// Seconds a controller whose host disabled Keep Alive (KATO 0, every
    /// non-persistent discovery controller) may go without a command on
    /// any of its queues (default 120).
    pub idle_timeout_secs: Option<u64>,
    /// Threads that run the Diffie-Hellman work of DH-HMAC-CHAP, off the
    /// NVMe/TCP poll groups, 1..=64 (default 1).
    pub auth_threads: Option<usize>,
    /// DH jobs that may wait for those threads, 1..=65536 (default 32); an
    /// authentication that finds the queue full is refused (counted as
    /// `busy`).
    pub auth_queue: Option<usize>,
    /// Authentication attempts (AUTH_Negotiate) a second that one source
    /// address (an IPv6 /64) regains, above 0 and at most 1000 (default
    /// 2); attempts that succeed give theirs back.
    pub auth_attempts_per_sec: Option<f64>,
    /// Authentication attempts one source address may make at once,
    /// 1..=65536 (default 16).
    pub auth_attempts_burst: Option<u32>,
    /// Source addresses whose attempts are tracked at once, 1..=1048576
    /// (default 4096); a new one beyond it evicts the oldest.
    pub auth_sources: Option<usize>,
    /// Write data, e.g. "256MiB", that all NVMe/TCP connections together
    /// may have asked hosts for through R2T and not yet written; later
    /// writes wait for their R2T (default 256 MiB).
    pub write_buffer_budget: Option<String>,
    /// Data of reads and writes, e.g. "1GiB", that may be in flight on
    /// asynchronous backends (RBD images, remote namespaces) all together;
    /// later requests wait in their connections (default 1 GiB).
    pub backend_in_flight_budget: Option<String>,
    /// Socket buffer memory, e.g. "512MiB", that all storage endpoints'
    /// TCP connections together may hold beyond each endpoint's reserve
    /// (its listening sockets and two connections); a SYN past it is
    /// reset (default 512 MiB).
    pub endpoint_buffer_memory: Option<String>,
    /// Where the storage endpoints' TCP/IP stacks run: `"thread"` (the
    /// default), a thread of their own, so a busy endpoint never holds up
    /// forwarding; or `"worker"`, in the first data-plane worker between
    /// its bursts, which saves a core and the hand-over between two
    /// threads (for a DPU with few cores to spare, or RAM namespaces: a
    /// file or device namespace's reads then hold up that worker's
    /// forwarding for as long as the device takes).
    pub endpoint_placement: EndpointPlacement,
    /// Directories whose files may back namespaces, e.g.
    /// `["/srv/volumes"]`: a file backend's path must lie beneath one, and
    /// is resolved there without following symbolic links. Absolute, and
    /// never the state directory or one holding it: only its `volumes`
    /// subdirectory. Unset: `<state.dir>/volumes`, created at start with
    /// mode 0700 (none without a state directory).
    pub file_dirs: Option<Vec<PathBuf>>,
    /// Block devices that may back namespaces: absolute paths or globs,
    /// `*` and `?` matching within one path component, e.g.
    /// `["/dev/nvme*n1", "/dev/disk/by-id/nvme-*"]`. A device must also be
    /// a block device and not mounted. Default: none.
    pub block_devices: Vec<String>,
    /// The host NQN the service connects to remote NVMe/TCP targets with,
    /// for remote namespaces created without one of their own, e.g.
    /// "nqn.2014-08.org.nvmexpress:uuid:...". A namespace keeps the one
    /// it was created with. Unset:
    /// `nqn.2014-08.org.nvmexpress:uuid:<UUID>`, the UUID being the
    /// 32 hex digits of /etc/machine-id, or where there is none one kept
    /// in `<state.dir>/host-id` (made at the first start).
    pub host_nqn: Option<String>,
    /// Storage clusters (Ceph) registered at startup when the state has
    /// none with their ID (`[[storage.clusters]]`), before the subsystems,
    /// whose RBD namespaces name them. Once registered they live in the
    /// state: the stored one is kept at later starts.
    pub clusters: Vec<SeedCluster>,
    /// Volumes created at startup when the state has none with their ID
    /// (`[[storage.volumes]]`), after the clusters and before the
    /// subsystems, whose namespaces name them (`volume = "ID"`). Once
    /// created they live in the state: the stored one is kept at later
    /// starts.
    pub volumes: Vec<SeedVolume>,
    /// Subsystems created at startup when the state has none with their ID
    /// (`[[storage.subsystems]]`). Once created they live in the state like
    /// any other: the stored one is kept at later starts, and changes made
    /// over gRPC survive restarts.
    pub subsystems: Vec<SeedSubsystem>,
}

/// `[[storage.clusters]]`: a storage cluster (Ceph) to register at
/// startup. Its key is read from `keyring_file`, never written here.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedCluster {
    /// Cluster ID, as in the resource name "clusters/{id}".
    pub id: String,
    /// Monitor addresses as Ceph's `mon_host` takes them, e.g.
    /// "10.0.0.1:6789,10.0.0.2:6789".
    pub mon_host: String,
    /// The cephx user, without "client." (e.g. "dpu").
    pub user: String,
    /// The user's keyring (`[client.USER]` with `key = ...`, as `ceph auth
    /// get` writes it) or a file holding only the key (as `ceph auth
    /// get-key` writes it); unset: a cluster without cephx.
    #[serde(default)]
    pub keyring_file: Option<PathBuf>,
    /// Bound on each I/O to the cluster, seconds, 1..=300 (20 if unset).
    #[serde(default)]
    pub op_timeout_secs: Option<u32>,
    /// Bound on connecting and on each request to a monitor, seconds,
    /// 1..=300 (10 if unset).
    #[serde(default)]
    pub connect_timeout_secs: Option<u32>,
}

/// `[[storage.volumes]]`: a volume to create at startup, a store that a
/// namespace is made on by naming it. Exactly one of `ram`, `file`,
/// `block_device`, `null`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedVolume {
    /// Volume ID, as in the resource name "volumes/{id}" (upper case,
    /// `_` and `.` allowed: "Malloc0").
    pub id: String,
    /// RAM of this size, e.g. "1GiB": kept from one namespace made on the
    /// volume to the next.
    #[serde(default)]
    pub ram: Option<String>,
    /// A file at this absolute path beneath `storage.file_dirs`, created
    /// with `size` if missing.
    #[serde(default)]
    pub file: Option<String>,
    /// Size of a `file` volume (the existing file's if unset).
    #[serde(default)]
    pub size: Option<String>,
    /// A block device at this path matching `storage.block_devices`.
    #[serde(default)]
    pub block_device: Option<String>,
    /// A null store of this size: reads return zeros, writes are dropped.
    #[serde(default)]
    pub null: Option<String>,
    /// Logical block size, 512 or 4096 (512 if unset); a namespace made
    /// on the volume has it.
    #[serde(default)]
    pub block_size: Option<u32>,
    /// Volume UUID in RFC 4122 text form (generated if unset).
    #[serde(default)]
    pub uuid: Option<String>,
}

/// `[[storage.subsystems]]`: a subsystem to create at startup, with its
/// namespaces and listeners.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedSubsystem {
    /// Subsystem ID, as in the resource name "subsystems/{id}".
    pub id: String,
    /// NVMe Qualified Name, unique across subsystems.
    pub nqn: String,
    /// Serial number, 1..20 printable ASCII characters (derived from the
    /// NQN if unset).
    #[serde(default)]
    pub serial_number: Option<String>,
    /// Model number, 1..40 printable ASCII characters ("dpu-service" if
    /// unset).
    #[serde(default)]
    pub model_number: Option<String>,
    /// Any host may connect, whatever `allowed_hosts` says.
    #[serde(default)]
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Largest namespace ID, 1..=1024 (32 if unset).
    #[serde(default)]
    pub max_namespaces: Option<u32>,
    /// `[[storage.subsystems.namespaces]]`.
    #[serde(default)]
    pub namespaces: Vec<SeedNamespace>,
    /// `[[storage.subsystems.listeners]]`.
    #[serde(default)]
    pub listeners: Vec<SeedListener>,
    /// QoS limits of hosts by host NQN, each a host the subsystem allows
    /// (listed in `allowed_hosts`, or any with `allow_any_host`):
    /// `host_qos = { "nqn.2014-08.org.nvmexpress:uuid:..." = { iops =
    /// 1000 } }`.
    #[serde(default)]
    pub host_qos: BTreeMap<String, SeedQos>,
    /// Which hosts must connect over the secure channel (TLS): "default"
    /// (each host with a key), "required" (every host), "disabled" (none).
    #[serde(default)]
    pub tls_requirement: SeedTlsRequirement,
    /// TLS pre-shared keys of hosts by host NQN, each a host the
    /// subsystem allows: `host_tls = { "nqn.2014-08.org.nvmexpress:uuid:..."
    /// = { psk_file = "/etc/dpu-service/h1.psk" } }`, with
    /// `v0_derivation = "compat"` for a host that derives as libnvme did.
    #[serde(default)]
    pub host_tls: BTreeMap<String, SeedHostTls>,
}

/// Which hosts of a declared subsystem must use TLS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SeedTlsRequirement {
    /// Each host with a TLS key.
    #[default]
    Default,
    /// Every host.
    Required,
    /// None.
    Disabled,
}

/// The TLS key of a host of a declared subsystem. The key is read from
/// `psk_file`, never written here.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedHostTls {
    /// A file holding the configured PSK in the interchange format
    /// (`NVMeTLSkey-1:01:...:`, as `nvme gen-tls-key` prints it).
    pub psk_file: PathBuf,
    /// How the host derives the TLS PSK when its identity is version 0
    /// ("NVMe0R01 ...", no digest to tell): "spec" (the default, as the
    /// specification says) or "compat" (libnvme's earlier HKDF info, as
    /// Debian 13's nvme-cli 2.13 derives).
    #[serde(default)]
    pub v0_derivation: dpu_control::model::TlsDerivation,
}

/// `[[storage.subsystems.namespaces]]`: a namespace of a declared
/// subsystem, backed by exactly one of `ram`, `file`, `block_device`,
/// `rbd`, `remote`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedNamespace {
    /// Namespace ID, 1..=max_namespaces (the lowest free one if unset).
    #[serde(default)]
    pub nsid: Option<u32>,
    /// RAM-backed, of this size, e.g. "256MiB".
    #[serde(default)]
    pub ram: Option<String>,
    /// File-backed, at this absolute path (created if missing).
    #[serde(default)]
    pub file: Option<String>,
    /// Size of a `file` backend, e.g. "1GiB" (the existing file's if unset).
    #[serde(default)]
    pub size: Option<String>,
    /// Block-device-backed, at this absolute path, e.g. "/dev/nvme0n1".
    #[serde(default)]
    pub block_device: Option<String>,
    /// Backed by this RBD image, "POOL/IMAGE", of the storage cluster
    /// `cluster` names (its size is the image's).
    #[serde(default)]
    pub rbd: Option<String>,
    /// The storage cluster of an `rbd` image: a cluster's ID.
    #[serde(default)]
    pub cluster: Option<String>,
    /// Backed by a namespace of a remote NVMe/TCP target (its size is
    /// the remote namespace's): `remote = { paths = ["10.0.0.1:4420"],
    /// nqn = "...", nsid = 1 }`.
    #[serde(default)]
    pub remote: Option<SeedRemote>,
    /// A null store of this size: reads return zeros, writes are dropped.
    #[serde(default)]
    pub null: Option<String>,
    /// Made on this volume (its ID), which no other namespace is made on;
    /// the namespace has the volume's block size.
    #[serde(default)]
    pub volume: Option<String>,
    /// Logical block size, 512 or 4096 (512 if unset).
    #[serde(default)]
    pub block_size: Option<u32>,
    /// Namespace UUID in RFC 4122 text form (generated if unset).
    #[serde(default)]
    pub uuid: Option<String>,
    /// Namespace globally unique identifier, 32 hex digits (generated if
    /// unset).
    #[serde(default)]
    pub nguid: Option<String>,
    /// QoS limits on the namespace's I/O, all hosts together: `qos = {
    /// iops = 1000, read_bandwidth = "200M" }` (none if unset).
    #[serde(default)]
    pub qos: Option<SeedQos>,
}

/// The QoS limits of a declared namespace or host, per second; a limit
/// unset or 0 is none. The IOPS limits are numbers of commands; the
/// bandwidth limits bytes, a number or a size as `ram` takes it ("200M",
/// "1GiB": powers of 1024).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedQos {
    /// I/O commands of every kind a second.
    #[serde(default)]
    pub iops: Option<u64>,
    /// Read commands a second.
    #[serde(default)]
    pub read_iops: Option<u64>,
    /// Write commands a second.
    #[serde(default)]
    pub write_iops: Option<u64>,
    /// Bytes read and written a second.
    #[serde(default)]
    pub bandwidth: Option<TextOrNumber>,
    /// Bytes read a second.
    #[serde(default)]
    pub read_bandwidth: Option<TextOrNumber>,
    /// Bytes written a second.
    #[serde(default)]
    pub write_bandwidth: Option<TextOrNumber>,
}

/// The `remote` of a declared namespace: a namespace of a remote NVMe/TCP
/// target. Its DH-HMAC-CHAP secret is read from `dhchap_secret_file`,
/// never written here.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedRemote {
    /// Transport addresses of the remote subsystem, "ADDR:PORT" (IPv6 as
    /// "\[ADDR\]:PORT"), 1 to 4 in order of preference.
    pub paths: Vec<String>,
    /// The remote subsystem's NQN.
    pub nqn: String,
    /// The namespace's ID in the remote subsystem.
    pub nsid: u32,
    /// The host NQN to connect with (`storage.host_nqn`, or the one
    /// derived from the machine's ID, if unset).
    #[serde(default)]
    pub host_nqn: Option<String>,
    /// A file holding the DH-HMAC-CHAP secret (`DHHC-1:..`, as `nvme
    /// gen-dhchap-key` writes it) for a remote that requires
    /// authentication; unset: none.
    #[serde(default)]
    pub dhchap_secret_file: Option<PathBuf>,
    /// Bound on each command to the remote, milliseconds, 1..=300000
    /// (10000 if unset).
    #[serde(default)]
    pub io_timeout_ms: Option<u32>,
    /// Bound on bringing up a connection on one path, milliseconds,
    /// 1..=300000 (5000 if unset).
    #[serde(default)]
    pub connect_timeout_ms: Option<u32>,
    /// Most commands in flight to the remote, 2..=1024 (128 if unset).
    #[serde(default)]
    pub queue_depth: Option<u32>,
}

/// `[[storage.subsystems.listeners]]`: an address a declared subsystem
/// accepts connections on.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedListener {
    /// Listener ID (derived from transport, address and port if unset).
    #[serde(default)]
    pub id: Option<String>,
    /// IP address to listen on.
    pub address: IpAddr,
    /// TCP port.
    pub port: u16,
    /// Transport.
    #[serde(default)]
    pub transport: SeedTransport,
    /// A declared tenant whose network the listener is a storage
    /// endpoint in (`address` then an IPv4 address of that network);
    /// unset: a listener on the service's own sockets.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Whether the listener speaks TLS: "none" (the default), "allowed"
    /// or "required"; listeners on one address and port agree on it.
    #[serde(default)]
    pub secure_channel: SecureChannel,
}

/// Transport of a declared listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SeedTransport {
    /// NVMe/TCP.
    #[default]
    Tcp,
}

/// `[[tenants]]`: a tenant to create at startup, with its filter rules.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedTenant {
    /// Tenant ID, as in the resource name "tenants/{id}".
    pub id: String,
    /// Human-readable name (empty if unset).
    #[serde(default)]
    pub display_name: Option<String>,
    /// Verdict for packets no rule matches ("deny" if unset).
    #[serde(default)]
    pub default_policy: Option<SeedAction>,
    /// Attachments in dpuctl's `--port` syntax: "PORT" for a whole port,
    /// "PORT.VLAN" for one VLAN of it, e.g. "pf0vf0" or "p0.100".
    #[serde(default)]
    pub attachments: Vec<String>,
    /// `[[tenants.rules]]`, in any order (priority orders them).
    #[serde(default)]
    pub rules: Vec<SeedRule>,
    /// Limits on all the storage I/O of the tenant's storage endpoints
    /// together: `storage_qos = { iops = 5000, bandwidth = "1G" }` (none
    /// if unset).
    #[serde(default)]
    pub storage_qos: Option<SeedQos>,
    /// Whether the tenant's established connections may be handed to
    /// flow hardware (`[dataplane.offload]`); `false` keeps every packet
    /// of the tenant on the cores (default `true`).
    #[serde(default = "yes")]
    pub offload: bool,
}

fn yes() -> bool {
    true
}

/// A verdict: a rule's action or a tenant's default policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SeedAction {
    /// Forward.
    Allow,
    /// Drop.
    Deny,
}

/// `[[tenants.rules]]`: a filter rule of a declared tenant, with the
/// fields of `dpuctl rule add`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedRule {
    /// Rule ID (assigned by the service if unset).
    #[serde(default)]
    pub id: Option<String>,
    /// Evaluation order, lower first; unique within the tenant.
    pub priority: u32,
    /// What a match does.
    pub action: SeedAction,
    /// Source prefix (CIDR); any source if unset.
    #[serde(default)]
    pub src: Option<String>,
    /// Destination prefix (CIDR); any destination if unset.
    #[serde(default)]
    pub dst: Option<String>,
    /// IP protocol: "tcp", "udp", "icmp", "icmpv6", "sctp" or a number;
    /// any protocol if unset.
    #[serde(default)]
    pub proto: Option<TextOrNumber>,
    /// Source ports: a port (80) or a range ("80-443"); TCP, UDP, SCTP.
    #[serde(default)]
    pub sport: Option<TextOrNumber>,
    /// Destination ports: a port (80) or a range ("80-443"); TCP, UDP, SCTP.
    #[serde(default)]
    pub dport: Option<TextOrNumber>,
    /// ICMP type (needs `proto` "icmp" or "icmpv6").
    #[serde(default)]
    pub icmp_type: Option<u32>,
    /// ICMP code (needs `icmp_type`).
    #[serde(default)]
    pub icmp_code: Option<u32>,
    /// Track connections so their replies pass (allow rules only).
    #[serde(default)]
    pub stateful: bool,
    /// Most traffic the rule lets through, dpuctl's `--rate-limit`
    /// syntax: "1000pps", "10Mbps" (allow rules only).
    #[serde(default)]
    pub rate_limit: Option<String>,
    /// Depth of the rate limit's bucket: packets, or bytes for a bps
    /// limit (a tenth of a second's worth if unset).
    #[serde(default)]
    pub burst: Option<u64>,
    /// Free-form description.
    #[serde(default)]
    pub description: Option<String>,
}

/// A value written as text or as a number: `proto = "tcp"` or `proto = 6`,
/// `dport = 80` or `dport = "80-443"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextOrNumber {
    /// A TOML integer.
    Number(i64),
    /// A TOML string.
    Text(String),
}

impl<'de> Deserialize<'de> for TextOrNumber {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = TextOrNumber;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number or a string")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<TextOrNumber, E> {
                Ok(TextOrNumber::Number(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<TextOrNumber, E> {
                i64::try_from(v)
                    .map(TextOrNumber::Number)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TextOrNumber, E> {
                Ok(TextOrNumber::Text(v.to_string()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl std::fmt::Display for TextOrNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Text(t) => write!(f, "{t:?}"),
        }
    }
}

/// `[[ports]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortConfig {
    /// Port ID, as used in resource names ("ports/{id}").
    pub id: String,
    /// Packet-I/O driver.
    #[serde(default = "default_driver")]
    pub driver: String,
    /// Device the driver opens. For "dpdk": the devargs of a virtual
    /// device ("net_tap0,iface=pf0vf0", "net_af_packet0,iface=veth0") or of
    /// a bus device ("0000:03:00.0,representor=vf[0-3]"). For "kernel":
    /// the name of a Linux interface ("pf0vf0", "veth0").
    #[serde(default)]
    pub device: String,
    /// DPDK's name of the port, if it is not the device's first field
    /// (e.g. an mlx5 representor).
    #[serde(default)]
    pub dpdk_name: Option<String>,
    /// What the port is connected to.
    #[serde(default)]
    pub role: PortRole,
    /// IPv4 address of a VXLAN tunnel endpoint on this port (an uplink):
    /// with it, the port answers ARP for the address and carries the VXLAN
    /// attachments of tenants (`vni` on `ports/{id}`), with the port's MAC
    /// address as the VTEP's.
    #[serde(default)]
    pub vtep_address: Option<std::net::Ipv4Addr>,
    /// IP MTU to set on a DPDK port (68 to 9600; jumbo frames with 9000):
    /// the data plane's packet buffers are sized for the largest port's
    /// frames. Unset, the port keeps the MTU its driver gives it. A kernel
    /// port follows its interface's MTU (`ip link set dev IF mtu N`).
    #[serde(default)]
    pub mtu: Option<u16>,
}

pub(crate) fn default_driver() -> String {
    "none".into()
}

/// The items and actions `[dataplane.offload.model]` may refuse.
pub const MODEL_REFUSALS: [&str; 4] = ["ipv6", "vlan_push", "vxlan_encap", "vxlan_decap"];

impl OffloadSettings {
    /// Checks the bounds, naming the key at fault.
    ///
    /// # Errors
    /// The first value out of its bounds.
    pub fn check(&self) -> anyhow::Result<()> {
        use anyhow::bail;
        if !(1..=1 << 20).contains(&self.table_size) {
            bail!("dataplane.offload.table_size must be 1 to 1048576");
        }
        if self.per_tenant == 0 || self.per_tenant > self.table_size {
            bail!("dataplane.offload.per_tenant must be 1 to table_size");
        }
        if self.insert_rate == 0 {
            bail!("dataplane.offload.insert_rate must be at least 1");
        }
        if !(1..=7_440).contains(&self.idle_secs) {
            bail!("dataplane.offload.idle_secs must be 1 to 7440 (the established TCP timeout)");
        }
        if !(1..=65_536).contains(&self.queue) {
            bail!("dataplane.offload.queue must be 1 to 65536");
        }
        if self.stateless_after > 1_000 {
            bail!("dataplane.offload.stateless_after must be 0 to 1000");
        }
        if let Some(r) = self
            .model
            .refuse
            .iter()
            .find(|r| !MODEL_REFUSALS.contains(&r.as_str()))
        {
            bail!(
                "dataplane.offload.model.refuse: unknown item {r:?} (use {})",
                MODEL_REFUSALS.join(", ")
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{declared, tenant};
    use super::super::Config;

    #[test]
    fn unknown_keys_are_errors() {
        let err =
            toml::from_str::<Config>("[grpc]\nlisten = \"127.0.0.1:1\"\nlisen = 2\n").unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
        assert!(toml::from_str::<Config>("[[ports]]\nid = \"p0\"\nrole = \"router\"\n").is_err());
    }

    #[test]
    fn storage_declarations_have_no_unknown_keys() {
        let ns = "[[storage.subsystems.namespaces]]";
        let ls = "[[storage.subsystems.listeners]]";
        for (text, want) in [
            (
                "[storage]\ndiscovery = \"127.0.0.1:8009\"\n".to_string(),
                "discovery",
            ),
            (
                "[storage]\ndiscovery_listen = \"8009\"\n".to_string(),
                "discovery_listen",
            ),
            (declared("colour = \"red\"", ""), "colour"),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nsize_bytes = 1\n")),
                "size_bytes",
            ),
            (declared("", &format!("{ns}\nram = 1048576\n")), "ram"),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nqos = {{ iosp = 1 }}\n")),
                "iosp",
            ),
            (
                declared(
                    "",
                    &format!("{ns}\nram = \"1M\"\nqos = {{ iops = \"1k\" }}\n"),
                ),
                "iops",
            ),
            (
                declared("host_qos = [\"nqn.2024-01.io.example:h\"]", ""),
                "host_qos",
            ),
            (
                declared(
                    "",
                    &format!("{ls}\naddress = \"127.0.0.1\"\nport = 4420\nhost = \"x\"\n"),
                ),
                "host",
            ),
            (
                declared(
                    "",
                    &format!("{ls}\naddress = \"127.0.0.1\"\nport = 4420\ntransport = \"rdma\"\n"),
                ),
                "rdma",
            ),
            (
                declared("", &format!("{ls}\naddress = \"localhost\"\nport = 4420\n")),
                "address",
            ),
            (
                declared("", &format!("{ls}\naddress = \"127.0.0.1\"\n")),
                "port",
            ),
            ("[[storage.subsystems]]\nid = \"a\"\n".to_string(), "nqn"),
        ] {
            let e = toml::from_str::<Config>(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}\nwant: {want}\ngot:  {e}");
        }
    }

    #[test]
    fn tenant_declarations_have_no_unknown_keys() {
        let r = "[[tenants.rules]]";
        for (text, want) in [
            (tenant("colour = \"red\"", ""), "colour"),
            (tenant("default_policy = \"drop\"", ""), "drop"),
            (tenant("attachments = \"pf0vf0\"", ""), "attachments"),
            ("[[tenants]]\ndisplay_name = \"x\"\n".to_string(), "id"),
            (
                tenant(
                    "",
                    &format!(
                        "{r}\npriority = 1\naction = \"allow\"\ndst_prefix = \"10.0.0.0/8\"\n"
                    ),
                ),
                "dst_prefix",
            ),
            (
                tenant("", &format!("{r}\naction = \"allow\"\n")),
                "priority",
            ),
            (tenant("", &format!("{r}\npriority = 1\n")), "action"),
            (
                tenant(
                    "",
                    &format!("{r}\npriority = 1\naction = \"allow\"\nproto = 1.5\n"),
                ),
                "expected a number or a string",
            ),
            (
                tenant(
                    "",
                    &format!(
                        "{r}\npriority = 1\naction = \"allow\"\nproto = \"udp\"\ndport = [80]\n"
                    ),
                ),
                "expected a number or a string",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"reject\"\n")),
                "reject",
            ),
        ] {
            let e = toml::from_str::<Config>(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}\nwant: {want}\ngot:  {e}");
        }
    }
}
