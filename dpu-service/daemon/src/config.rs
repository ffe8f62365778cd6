//! Service configuration: a TOML file, overridden by flags and environment.
//!
//! Unknown keys are errors, so a misspelt setting is reported instead of
//! silently ignored. Relative paths are taken relative to the working
//! directory.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use dpu_control::model::{PortRole, PortSpec};
use dpu_control::validate;
use dpu_control::ControlError;
use dpu_proto::text;
use dpu_proto::v1 as pb;
use serde::Deserialize;

/// Command line of `dpu-service`. Every flag also reads an environment
/// variable and overrides the configuration file.
#[derive(Debug, Parser)]
#[command(
    name = "dpu-service",
    version,
    about = "Per-tenant switching and an NVMe/TCP target for DPUs, driven over gRPC."
)]
pub struct Cli {
    /// TOML configuration file.
    #[arg(long, short, env = "DPU_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC listen address (overrides grpc.listen).
    #[arg(long, env = "DPU_GRPC_LISTEN")]
    pub grpc_listen: Option<SocketAddr>,
    /// Plain-text gRPC health-only listen address (overrides grpc.health_listen); "off" disables it.
    #[arg(long, env = "DPU_HEALTH_LISTEN")]
    pub health_listen: Option<String>,
    /// Prometheus metrics listen address (overrides metrics.listen); "off" disables it.
    #[arg(long, env = "DPU_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Directory of the persisted state (overrides state.dir).
    #[arg(long, env = "DPU_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Log format (overrides log.format).
    #[arg(long, env = "DPU_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Log filter, e.g. "info" or "dpu_control=debug" (overrides log.level).
    #[arg(long, env = "DPU_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// PEM server certificate; enables TLS (overrides grpc.tls_cert).
    #[arg(long, env = "DPU_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the server certificate (overrides grpc.tls_key).
    #[arg(long, env = "DPU_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle; clients must present a certificate it signed (mTLS).
    #[arg(long, env = "DPU_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Allow plain-text gRPC on a non-loopback address.
    #[arg(long, env = "DPU_ALLOW_INSECURE_REMOTE")]
    pub allow_insecure_remote: bool,
    /// Run without the data plane: every port is for the API only (driver
    /// "none"), whatever the configuration says. For machines where the
    /// ports' devices cannot be opened, e.g. TAP ports without root.
    #[arg(long, env = "DPU_NO_DATAPLANE")]
    pub no_dataplane: bool,
    /// Check the configuration and the state file, then exit.
    #[arg(long)]
    pub check_config: bool,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

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
    /// Most connections tracked for stateful rules, all workers together
    /// (each worker gets an even share, allocated at start).
    pub conntrack_max: usize,
    /// Most connections one tenant may have tracked, all workers together;
    /// past it the tenant's new connections are dropped as `table_full`.
    pub conntrack_per_tenant: usize,
    /// Entries of each worker's flow cache in front of the classifier of
    /// tenants with 64 rules or more (32 bytes each; the default 262,144
    /// is 8 MiB a worker and serves up to about 130,000 flows a worker);
    /// 0 leaves it off.
    pub flow_cache_entries: usize,
    /// Further EAL arguments, passed as they are (e.g. "-d", a PMD path).
    pub eal_args: Vec<String>,
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
            conntrack_max: 262_144,
            conntrack_per_tenant: 65_536,
            flow_cache_entries: 262_144,
            eal_args: Vec::new(),
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
        }
    }
}

/// `[metrics]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Listen address; `None` disables the endpoint.
    pub listen: Option<SocketAddr>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
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
    /// The CPUs the NVMe/TCP target's I/O queues run on, e.g. `[5, 6, 7]`:
    /// I/O queue `qid` of every controller pins its thread to
    /// `io_cpus[(qid - 1) % len]` once it is connected, so a host's queues
    /// spread over them; listeners, admin and discovery queues run on the
    /// process's other CPUs, off the data-plane workers' too (anywhere if
    /// that leaves none), and so do the control plane's threads. Each must
    /// be a CPU the process may use, listed once, and no data-plane
    /// worker's (`dataplane.worker_cpus`). Empty (the default): NVMe/TCP
    /// threads run where the scheduler puts them, off the workers' CPUs.
    pub io_cpus: Vec<usize>,
    /// Subsystems created at startup when the state has none with their ID
    /// (`[[storage.subsystems]]`). Once created they live in the state like
    /// any other: the stored one is kept at later starts, and changes made
    /// over gRPC survive restarts.
    pub subsystems: Vec<SeedSubsystem>,
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
}

/// `[[storage.subsystems.namespaces]]`: a namespace of a declared
/// subsystem, backed by exactly one of `ram`, `file`, `block_device`.
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
}

/// Transport of a declared listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SeedTransport {
    /// NVMe/TCP.
    #[default]
    Tcp,
}

impl SeedSubsystem {
    /// The subsystem as a `CreateSubsystem` request carries it.
    pub fn to_proto(&self) -> pb::Subsystem {
        pb::Subsystem {
            nqn: self.nqn.clone(),
            serial_number: self.serial_number.clone().unwrap_or_default(),
            model_number: self.model_number.clone().unwrap_or_default(),
            allow_any_host: self.allow_any_host,
            allowed_hosts: self.allowed_hosts.clone(),
            max_namespaces: self.max_namespaces.unwrap_or(0),
            ..Default::default()
        }
    }
}

impl SeedNamespace {
    /// The namespace as a `CreateNamespace` request carries it.
    ///
    /// # Errors
    /// If not exactly one backend is given, or a size does not parse.
    pub fn to_proto(&self) -> Result<pb::Namespace> {
        let size = |key: &str, v: &str| parse_size(v).with_context(|| key.to_string());
        let backend = match (&self.ram, &self.file, &self.block_device) {
            (Some(r), None, None) => pb::namespace::Backend::Ram(pb::RamBackend {
                size_bytes: size("ram", r)?,
            }),
            (None, Some(f), None) => pb::namespace::Backend::File(pb::FileBackend {
                path: f.clone(),
                size_bytes: match &self.size {
                    Some(v) => size("size", v)?,
                    None => 0,
                },
            }),
            (None, None, Some(b)) => {
                pb::namespace::Backend::BlockDevice(pb::BlockDeviceBackend { path: b.clone() })
            }
            _ => bail!("give exactly one of ram, file, block_device"),
        };
        Ok(pb::Namespace {
            nsid: self.nsid.unwrap_or(0),
            backend: Some(backend),
            block_size: self.block_size.unwrap_or(0),
            uuid: self.uuid.clone().unwrap_or_default(),
            nguid: self.nguid.clone().unwrap_or_default(),
            ..Default::default()
        })
    }
}

impl SeedListener {
    /// The listener as a `CreateListener` request carries it.
    pub fn to_proto(&self) -> pb::Listener {
        pb::Listener {
            transport: match self.transport {
                SeedTransport::Tcp => pb::Transport::Tcp,
            } as i32,
            address: self.address.to_string(),
            port: u32::from(self.port),
            ..Default::default()
        }
    }
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

impl SeedAction {
    /// The action as a rule carries it.
    pub fn rule_action(self) -> pb::RuleAction {
        match self {
            Self::Allow => pb::RuleAction::Allow,
            Self::Deny => pb::RuleAction::Deny,
        }
    }

    /// The action as a tenant's default policy.
    pub fn policy(self) -> pb::DefaultPolicy {
        match self {
            Self::Allow => pb::DefaultPolicy::Allow,
            Self::Deny => pb::DefaultPolicy::Deny,
        }
    }
}

/// Parses an attachment in dpuctl's `--port` syntax:
/// `PORT[.VLAN][,mac=MAC][,ip=PREFIX]...` ([`dpu_proto::text`]).
///
/// # Errors
/// If the text is not of that form (the port ID, the VLAN's range and the
/// anti-spoofing entries are the API's to check).
pub fn parse_attachment(s: &str) -> Result<pb::Attachment> {
    text::port_attachment(s).map_err(|e| anyhow::anyhow!(e))
}

/// Parses an IP protocol: a name dpuctl's `--proto` takes, or a number.
fn parse_protocol(v: &TextOrNumber) -> Result<u32> {
    Ok(match v {
        TextOrNumber::Number(n) => {
            u32::try_from(*n).with_context(|| format!("{n} is not in 0..=255"))?
        }
        TextOrNumber::Text(t) => text::protocol(t).map_err(|e| anyhow::anyhow!(e))?,
    })
}

/// Parses a port range: a number, or text "PORT" or "FIRST-LAST" (the
/// range itself is the API's to check).
fn parse_ports(v: &TextOrNumber) -> Result<pb::PortRange> {
    match v {
        TextOrNumber::Number(n) => {
            let p = u32::try_from(*n).with_context(|| format!("{n} is not in 0..=65535"))?;
            Ok(pb::PortRange { first: p, last: p })
        }
        TextOrNumber::Text(t) => text::port_range(t).map_err(|e| anyhow::anyhow!(e)),
    }
}

/// The configuration key of a field the API names in a tenant or rule,
/// relative to the `[[tenants]]` or `[[tenants.rules]]` entry: the API's
/// `dst_prefix` is the configuration's `dst`, `dst_ports.first` its
/// `dport`, `attachments[1].port.vlan_id` its `attachments[1]`.
pub fn seed_key(api_field: &str) -> String {
    let (head, _) = api_field.split_once('.').unwrap_or((api_field, ""));
    match head {
        "src_prefix" => "src".into(),
        "dst_prefix" => "dst".into(),
        "src_ports" => "sport".into(),
        "dst_ports" => "dport".into(),
        "ip_protocol" => "proto".into(),
        h => h.into(),
    }
}

/// `{at}.{key}: {reason}` for an error of the API's checks, whose field
/// path starts with `api_head` (e.g. "rule"); `{at}: {e}` for others.
fn keyed(at: &str, api_head: &str, e: ControlError) -> anyhow::Error {
    match e {
        ControlError::InvalidArgument { field, reason } => {
            let rel = field
                .strip_prefix(api_head)
                .and_then(|f| f.strip_prefix('.'))
                .unwrap_or(&field);
            anyhow::anyhow!("{at}.{}: {reason}", seed_key(rel))
        }
        e => anyhow::anyhow!("{at}: {e}"),
    }
}

impl SeedTenant {
    /// The tenant as a `CreateTenant` request carries it; `at` names the
    /// entry in errors.
    ///
    /// # Errors
    /// If an attachment is not "PORT" or "PORT.VLAN".
    pub fn to_proto(&self, at: &str) -> Result<pb::Tenant> {
        let attachments = self
            .attachments
            .iter()
            .enumerate()
            .map(|(k, a)| parse_attachment(a).with_context(|| format!("{at}.attachments[{k}]")))
            .collect::<Result<_>>()?;
        Ok(pb::Tenant {
            display_name: self.display_name.clone().unwrap_or_default(),
            attachments,
            default_policy: self
                .default_policy
                .map_or(pb::DefaultPolicy::Unspecified, SeedAction::policy)
                as i32,
            ..Default::default()
        })
    }
}

impl SeedRule {
    /// The rule as an `AddRule` request carries it; `at` names the entry
    /// in errors.
    ///
    /// # Errors
    /// If `proto`, `sport` or `dport` does not parse.
    pub fn to_proto(&self, at: &str) -> Result<pb::FilterRule> {
        Ok(pb::FilterRule {
            priority: self.priority,
            src_prefix: self.src.clone().unwrap_or_default(),
            dst_prefix: self.dst.clone().unwrap_or_default(),
            src_ports: self
                .sport
                .as_ref()
                .map(parse_ports)
                .transpose()
                .with_context(|| format!("{at}.sport"))?,
            dst_ports: self
                .dport
                .as_ref()
                .map(parse_ports)
                .transpose()
                .with_context(|| format!("{at}.dport"))?,
            ip_protocol: self
                .proto
                .as_ref()
                .map(parse_protocol)
                .transpose()
                .with_context(|| format!("{at}.proto"))?,
            icmp_type: self.icmp_type,
            icmp_code: self.icmp_code,
            action: self.action.rule_action() as i32,
            stateful: self.stateful,
            description: self.description.clone().unwrap_or_default(),
            rate_limit: match (&self.rate_limit, self.burst) {
                (Some(r), burst) => Some(pb::RateLimit {
                    burst: burst.unwrap_or(0),
                    ..text::rate_limit(r)
                        .map_err(|e| anyhow::anyhow!(e))
                        .with_context(|| format!("{at}.rate_limit"))?
                }),
                (None, Some(_)) => bail!("{at}.burst: needs rate_limit"),
                (None, None) => None,
            },
            name: String::new(),
        })
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
}

/// A listener override: a socket address, or "off" for none.
fn address_or_off(flag: &str, value: &str) -> Result<Option<SocketAddr>> {
    if value == "off" {
        return Ok(None);
    }
    value
        .parse()
        .map(Some)
        .with_context(|| format!("{flag} {value:?} is not an address or \"off\""))
}

fn default_driver() -> String {
    "none".into()
}

impl Config {
    /// Reads a configuration file.
    ///
    /// # Errors
    /// If the file cannot be read or is not valid configuration.
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        toml::from_str(&text)
            .with_context(|| format!("{} is not a valid configuration", path.display()))
    }

    /// Applies command-line and environment overrides.
    ///
    /// # Errors
    /// If an override is malformed.
    pub fn apply(&mut self, cli: &Cli) -> Result<()> {
        if let Some(a) = cli.grpc_listen {
            self.grpc.listen = a;
        }
        if let Some(m) = &cli.metrics_listen {
            self.metrics.listen = address_or_off("--metrics-listen", m)?;
        }
        if let Some(h) = &cli.health_listen {
            self.grpc.health_listen = address_or_off("--health-listen", h)?;
        }
        if let Some(d) = &cli.state_dir {
            self.state.dir = Some(d.clone());
        }
        if let Some(f) = cli.log_format {
            self.log.format = f;
        }
        if let Some(l) = &cli.log_level {
            self.log.level.clone_from(l);
        }
        if cli.tls_cert.is_some() {
            self.grpc.tls_cert.clone_from(&cli.tls_cert);
        }
        if cli.tls_key.is_some() {
            self.grpc.tls_key.clone_from(&cli.tls_key);
        }
        if cli.tls_client_ca.is_some() {
            self.grpc.tls_client_ca.clone_from(&cli.tls_client_ca);
        }
        self.grpc.allow_insecure_remote |= cli.allow_insecure_remote;
        if cli.no_dataplane {
            for p in &mut self.ports {
                p.driver = default_driver();
                p.device.clear();
                p.dpdk_name = None;
                // No data plane, no tunnel endpoint.
                p.vtep_address = None;
            }
        }
        Ok(())
    }

    /// Checks the configuration as a whole.
    ///
    /// # Errors
    /// Names the first problem found.
    pub fn validate(&self) -> Result<()> {
        let g = &self.grpc;
        match (&g.tls_cert, &g.tls_key) {
            (Some(_), None) => bail!("grpc.tls_cert is set but grpc.tls_key is not"),
            (None, Some(_)) => bail!("grpc.tls_key is set but grpc.tls_cert is not"),
            _ => {}
        }
        if g.tls_client_ca.is_some() && g.tls_cert.is_none() {
            bail!("grpc.tls_client_ca needs grpc.tls_cert and grpc.tls_key (mTLS runs over TLS)");
        }
        if g.tls_cert.is_none() && !g.listen.ip().is_loopback() && !g.allow_insecure_remote {
            bail!(
                "refusing plain-text gRPC on non-loopback address {}: configure grpc.tls_cert/tls_key \
                 (and tls_client_ca for mTLS), or set grpc.allow_insecure_remote / --allow-insecure-remote",
                g.listen
            );
        }
        if let Some(h) = g.health_listen {
            if h == g.listen {
                bail!("grpc.health_listen {h} is also grpc.listen: give the health endpoint its own port");
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut bus_devices: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
        let mut dpdk_names: BTreeMap<String, usize> = BTreeMap::new();
        let mut ifaces: BTreeMap<&str, usize> = BTreeMap::new();
        let mut dataplane_driver: Option<(usize, &str)> = None;
        for (i, p) in self.ports.iter().enumerate() {
            dpu_control::validate::id(&format!("ports[{i}].id"), &p.id)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            if !seen.insert(&p.id) {
                bail!("ports[{i}].id: port {:?} is declared twice", p.id);
            }
            if let Some(a) = p.vtep_address {
                if p.driver == "none" {
                    bail!(
                        "ports[{i}] ({}): vtep_address needs a data-plane driver (\"dpdk\" or \"kernel\")",
                        p.id
                    );
                }
                if !dpu_control::validate::is_unicast_v4(a) {
                    bail!(
                        "ports[{i}] ({}): vtep_address {a} is not a unicast address",
                        p.id
                    );
                }
                if let Some(k) = self.ports[..i]
                    .iter()
                    .position(|o| o.vtep_address == Some(a))
                {
                    bail!(
                        "ports[{i}] ({}): vtep_address {a} is also ports[{k}]'s",
                        p.id
                    );
                }
            }
            match p.driver.as_str() {
                "none" => {}
                "dpdk" | "kernel" if dataplane_driver.is_some_and(|(_, d)| d != p.driver) => {
                    let (k, d) = dataplane_driver.unwrap_or_default();
                    bail!(
                        "ports[{i}] ({}): driver {:?} cannot be mixed with driver {d:?} of ports[{k}]; \
                         the data plane runs one driver for all its ports",
                        p.id,
                        p.driver
                    )
                }
                "kernel" => {
                    let dev = p.device.as_str();
                    if dev.is_empty()
                        || dev.len() > 15
                        || dev == "."
                        || dev == ".."
                        || dev.contains(|c: char| c == '/' || c == ':' || c.is_whitespace())
                    {
                        bail!(
                            "ports[{i}] ({}): driver \"kernel\" needs device = the name of a network \
                             interface (1 to 15 characters, no '/', ':' or spaces), not {dev:?}",
                            p.id
                        );
                    }
                    if let Some(k) = ifaces.insert(dev, i) {
                        bail!(
                            "ports[{i}] ({}): interface {dev:?} is also ports[{k}]",
                            p.id
                        );
                    }
                }
                "dpdk" if p.device.trim().is_empty() => {
                    bail!(
                        "ports[{i}] ({}): driver \"dpdk\" needs a device (devargs)",
                        p.id
                    )
                }
                "dpdk" => {
                    // EAL probes a bus device once, with one set of devargs;
                    // every port spawned from it (an mlx5 uplink and its
                    // representors) must name the same set.
                    let dev = p.device.trim();
                    let bus = dev.split(',').next().unwrap_or(dev);
                    if !(dev.starts_with("net_") || dev.starts_with("eth_")) {
                        if let Some(&(k, other)) = bus_devices.get(bus) {
                            if other != dev {
                                bail!(
                                    "ports[{i}] ({}): device {dev:?} probes {bus} with other devargs \
                                     than ports[{k}] ({other:?}); EAL probes a device once, so \
                                     every port of {bus} must give the same devargs",
                                    p.id
                                );
                            }
                        } else {
                            bus_devices.insert(bus, (i, dev));
                        }
                    }
                    let name = p.dpdk_name.clone().unwrap_or_else(|| bus.to_string());
                    if let Some(k) = dpdk_names.insert(name.clone(), i) {
                        bail!(
                            "ports[{i}] ({}): DPDK port {name:?} is also ports[{k}]; give each \
                             port spawned from one device its own dpdk_name",
                            p.id
                        );
                    }
                }
                d => bail!(
                    "ports[{i}] ({}): unknown driver {d:?} (use \"dpdk\", \"kernel\" or \"none\")",
                    p.id
                ),
            }
            if p.driver == "dpdk" && !cfg!(feature = "dpdk") {
                bail!(
                    "ports[{i}] ({}): this build of dpu-service has no DPDK support (built without \
                     the \"dpdk\" feature); use driver \"kernel\" or a build with DPDK",
                    p.id
                );
            }
            if p.driver != "none" && dataplane_driver.is_none() {
                dataplane_driver = Some((i, p.driver.as_str()));
            }
        }
        let d = &self.dataplane;
        if d.workers == 0 || d.workers > 64 {
            bail!("dataplane.workers must be in 1..=64, not {}", d.workers);
        }
        if !d.worker_cpus.is_empty() {
            if d.worker_cpus.len() != usize::from(d.workers) {
                bail!(
                    "dataplane.worker_cpus names {} CPUs for {} workers: give one per worker, or none",
                    d.worker_cpus.len(),
                    d.workers
                );
            }
            let mut cpus = std::collections::BTreeSet::new();
            for (w, c) in d.worker_cpus.iter().enumerate() {
                if !cpus.insert(c) {
                    bail!("dataplane.worker_cpus[{w}]: CPU {c} already runs another worker");
                }
            }
        }
        if d.mbufs < 1024 {
            bail!("dataplane.mbufs must be at least 1024, not {}", d.mbufs);
        }
        if d.conntrack_max == 0 || d.conntrack_max > 1 << 26 {
            bail!(
                "dataplane.conntrack_max must be in 1..={}, not {}",
                1 << 26,
                d.conntrack_max
            );
        }
        if d.conntrack_per_tenant == 0 || d.conntrack_per_tenant > d.conntrack_max {
            bail!(
                "dataplane.conntrack_per_tenant must be in 1..=conntrack_max ({}), not {}",
                d.conntrack_max,
                d.conntrack_per_tenant
            );
        }
        if d.flow_cache_entries > 1 << 24 {
            bail!(
                "dataplane.flow_cache_entries must be at most {}, not {}",
                1 << 24,
                d.flow_cache_entries
            );
        }
        if d.file_prefix.is_empty() || d.file_prefix.contains('/') {
            bail!(
                "dataplane.file_prefix {:?} must be a non-empty name without '/'",
                d.file_prefix
            );
        }
        if let Some(r) = &self.storage.ram_limit {
            parse_size(r).with_context(|| format!("storage.ram_limit {r:?}"))?;
        }
        self.validate_storage()?;
        self.validate_tenants()?;
        Ok(())
    }

    /// How the NVMe/TCP transport places its threads: I/O queues on
    /// `storage.io_cpus`, and, when a data plane runs, nothing on its
    /// workers' CPUs (`dataplane.worker_cpus`).
    pub fn transport(&self) -> dpu_nvmeof::TcpConfig {
        let workers = if crate::dataplane::wanted(self).is_some() {
            self.dataplane.worker_cpus.clone()
        } else {
            Vec::new()
        };
        dpu_nvmeof::TcpConfig {
            io_cpus: self.storage.io_cpus.clone(),
            avoid_cpus: workers,
        }
    }

    /// Checks `[storage]`: the I/O CPUs against the data plane's and the
    /// CPUs this process may use; the declared subsystems, namespaces and
    /// listeners with the rules the API applies to them. Names the
    /// offending key.
    fn validate_storage(&self) -> Result<()> {
        for (i, c) in self.storage.io_cpus.iter().enumerate() {
            if let Some(w) = self.dataplane.worker_cpus.iter().position(|w| w == c) {
                bail!(
                    "storage.io_cpus[{i}]: CPU {c} already runs data-plane worker {w} \
                     (dataplane.worker_cpus[{w}]); give the NVMe/TCP I/O queues CPUs of their own"
                );
            }
        }
        self.transport()
            .validate()
            .map_err(|e| anyhow::anyhow!("storage.{e}"))?;
        let mut ids = BTreeSet::new();
        let mut nqns = BTreeMap::new();
        let mut ram_total: u64 = 0;
        for (i, s) in self.storage.subsystems.iter().enumerate() {
            let at = format!("storage.subsystems[{i}]");
            validate::id(&format!("{at}.id"), &s.id)?;
            if !ids.insert(s.id.as_str()) {
                bail!("{at}.id: subsystem {:?} is declared twice", s.id);
            }
            validate::nqn(&format!("{at}.nqn"), &s.nqn)?;
            if s.nqn == validate::DISCOVERY_NQN {
                bail!("{at}.nqn: the discovery NQN is reserved for the discovery controller");
            }
            if let Some(k) = nqns.insert(s.nqn.as_str(), i) {
                bail!(
                    "{at}.nqn: {} is also the NQN of storage.subsystems[{k}]",
                    s.nqn
                );
            }
            if let Some(v) = &s.serial_number {
                validate::ascii_id(&format!("{at}.serial_number"), v, 20)?;
            }
            if let Some(v) = &s.model_number {
                validate::ascii_id(&format!("{at}.model_number"), v, 40)?;
            }
            let mut hosts = BTreeSet::new();
            for (k, h) in s.allowed_hosts.iter().enumerate() {
                validate::nqn(&format!("{at}.allowed_hosts[{k}]"), h)?;
                if !hosts.insert(h) {
                    bail!("{at}.allowed_hosts[{k}]: {h} is listed twice");
                }
            }
            if hosts.len() > validate::MAX_HOSTS_PER_SUBSYSTEM {
                bail!(
                    "{at}.allowed_hosts: at most {} hosts",
                    validate::MAX_HOSTS_PER_SUBSYSTEM
                );
            }
            let max = match s.max_namespaces {
                None => validate::DEFAULT_MAX_NAMESPACES,
                Some(m @ 1..=validate::MAX_NAMESPACES) => m,
                Some(m) => bail!(
                    "{at}.max_namespaces: {m} is not in 1..={}",
                    validate::MAX_NAMESPACES
                ),
            };
            if s.namespaces.len() > max as usize {
                bail!(
                    "{at}.namespaces: {} namespaces do not fit in max_namespaces {max}",
                    s.namespaces.len()
                );
            }
            let mut nsids = BTreeMap::new();
            for (j, n) in s.namespaces.iter().enumerate() {
                ram_total = ram_total.saturating_add(check_namespace(
                    &format!("{at}.namespaces[{j}]"),
                    j,
                    n,
                    max,
                    &mut nsids,
                )?);
            }
            let mut lids = BTreeSet::new();
            let mut addrs = BTreeMap::new();
            for (j, l) in s.listeners.iter().enumerate() {
                let at = format!("{at}.listeners[{j}]");
                if let Some(id) = &l.id {
                    validate::id(&format!("{at}.id"), id)?;
                    if !lids.insert(id) {
                        bail!("{at}.id: listener {id:?} is declared twice");
                    }
                }
                if l.port == 0 {
                    bail!("{at}.port: 0 is not in 1..=65535");
                }
                if let Some(k) = addrs.insert((l.transport, l.address, l.port), j) {
                    bail!(
                        "{at}: listeners[{k}] already listens on {}",
                        SocketAddr::new(l.address, l.port)
                    );
                }
            }
        }
        let limit = self.ram_limit();
        if ram_total > limit {
            bail!(
                "storage.subsystems: the RAM namespaces declared total {ram_total} bytes, \
                 more than storage.ram_limit ({limit} bytes)"
            );
        }
        Ok(())
    }

    /// Checks `[[tenants]]` with the rules the API applies to them (and,
    /// among the declared tenants, the conflicts the state would refuse),
    /// naming the offending key.
    fn validate_tenants(&self) -> Result<()> {
        let mut ids = BTreeSet::new();
        // Every declared attachment so far: (attachment, "tenants[i].attachments[k]").
        let mut claimed: Vec<(dpu_control::model::Attachment, String)> = Vec::new();
        for (i, t) in self.tenants.iter().enumerate() {
            let at = format!("tenants[{i}]");
            validate::id(&format!("{at}.id"), &t.id)?;
            if !ids.insert(t.id.as_str()) {
                bail!("{at}.id: tenant {:?} is declared twice", t.id);
            }
            let pbt = t.to_proto(&at)?;
            validate::text(&format!("{at}.display_name"), &pbt.display_name)?;
            if t.attachments.len() > validate::MAX_ATTACHMENTS_PER_TENANT {
                bail!(
                    "{at}.attachments: {} attachments, at most {}",
                    t.attachments.len(),
                    validate::MAX_ATTACHMENTS_PER_TENANT
                );
            }
            for (k, a) in pbt.attachments.iter().enumerate() {
                let key = format!("{at}.attachments[{k}]");
                // The key is the string itself: no sub-key.
                let att = validate::attachment("a", a).map_err(|e| match e {
                    ControlError::InvalidArgument { reason, .. } => {
                        anyhow::anyhow!("{key}: {reason}")
                    }
                    e => anyhow::anyhow!("{key}: {e}"),
                })?;
                if !self.ports.iter().any(|p| p.id == att.port()) {
                    bail!(
                        "{key}: port {:?} is not declared under [[ports]]",
                        att.port()
                    );
                }
                if let Some((o, other)) = claimed.iter().find(|(o, _)| o.conflicts_with(&att)) {
                    bail!("{key}: {att} overlaps {other} ({o})");
                }
                claimed.push((att, key));
            }
            if t.rules.len() > validate::MAX_RULES_PER_TENANT {
                bail!(
                    "{at}.rules: {} rules, at most {}",
                    t.rules.len(),
                    validate::MAX_RULES_PER_TENANT
                );
            }
            let mut rule_ids = BTreeMap::new();
            let mut priorities = BTreeMap::new();
            for (j, r) in t.rules.iter().enumerate() {
                let at = format!("{at}.rules[{j}]");
                if let Some(id) = &r.id {
                    validate::id(&format!("{at}.id"), id)?;
                    if let Some(k) = rule_ids.insert(id.as_str(), j) {
                        bail!("{at}.id: rule {id:?} is also rules[{k}]'s ID");
                    }
                }
                if let Some(k) = priorities.insert(r.priority, j) {
                    bail!(
                        "{at}.priority: {} is also the priority of rules[{k}]",
                        r.priority
                    );
                }
                let pbr = r.to_proto(&at)?;
                validate::rule("rule", r.id.as_deref().unwrap_or(""), &pbr)
                    .map_err(|e| keyed(&at, "rule", e))?;
            }
        }
        Ok(())
    }

    /// The declared ports as the control plane sees them.
    pub fn port_specs(&self) -> Vec<PortSpec> {
        self.ports
            .iter()
            .map(|p| PortSpec {
                id: p.id.clone(),
                driver: p.driver.clone(),
                device: p.device.clone(),
                role: p.role,
            })
            .collect()
    }

    /// Most bytes RAM namespaces may use.
    pub fn ram_limit(&self) -> u64 {
        self.storage
            .ram_limit
            .as_deref()
            .and_then(|s| parse_size(s).ok())
            .unwrap_or_else(|| mem_total().unwrap_or(1 << 30) / 2)
    }
}

/// Checks declared namespace `j` of a subsystem (`at` names it) whose
/// largest namespace ID is `max`; `nsids` maps the IDs taken so far to the
/// namespace taking it and whether its nsid was given. Returns the bytes of
/// memory it takes (0 unless RAM-backed).
fn check_namespace(
    at: &str,
    j: usize,
    n: &SeedNamespace,
    max: u32,
    nsids: &mut BTreeMap<u32, (usize, bool)>,
) -> Result<u64> {
    let given = [n.ram.is_some(), n.file.is_some(), n.block_device.is_some()];
    if given.iter().filter(|g| **g).count() != 1 {
        bail!("{at}: give exactly one of ram, file, block_device");
    }
    if n.size.is_some() && n.file.is_none() {
        bail!("{at}: size goes with file (a RAM namespace's size is the value of ram)");
    }
    let block = match n.block_size {
        None => 512,
        Some(b @ (512 | 4096)) => b,
        Some(b) => bail!("{at}.block_size: {b} is not 512 or 4096"),
    };
    let mut ram = 0;
    for (key, v) in [("ram", &n.ram), ("size", &n.size)] {
        let Some(v) = v else { continue };
        let bytes = parse_size(v).with_context(|| format!("{at}.{key}"))?;
        if bytes == 0 || bytes % u64::from(block) != 0 {
            bail!("{at}.{key}: {v} is not a non-zero multiple of the block size {block}");
        }
        if key == "ram" {
            ram = bytes;
        }
    }
    for (key, p) in [("file", &n.file), ("block_device", &n.block_device)] {
        let Some(p) = p else { continue };
        if !p.starts_with('/') || p.contains('\0') || p.len() > 4096 {
            bail!("{at}.{key}: {p:?} is not an absolute path");
        }
    }
    // The API gives a namespace without an nsid the lowest free one, in
    // declaration order: mirror that, so a clash shows up here.
    let id = match n.nsid {
        Some(id) if id == 0 || id > max => {
            bail!("{at}.nsid: {id} is not in 1..={max} (the subsystem's max_namespaces)")
        }
        Some(id) => id,
        None => (1..=max)
            .find(|id| !nsids.contains_key(id))
            .with_context(|| format!("{at}: no namespace ID is left (max_namespaces {max})"))?,
    };
    if let Some((k, explicit)) = nsids.insert(id, (j, n.nsid.is_some())) {
        let how = if explicit {
            ""
        } else {
            " (the lowest free one: it has no nsid)"
        };
        bail!("{at}.nsid: namespace {id} is already namespaces[{k}]'s{how}");
    }
    if let Some(u) = &n.uuid {
        validate::uuid(&format!("{at}.uuid"), u)?;
    }
    if let Some(g) = &n.nguid {
        validate::hex16(&format!("{at}.nguid"), g)?;
    }
    Ok(ram)
}

/// Parses a size: plain bytes, or a number with K/M/G/T (powers of 1024,
/// also written KiB, MiB, GiB, TiB).
///
/// # Errors
/// If the text is not such a size or overflows 64 bits.
pub fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .with_context(|| format!("{s:?} is not a size"))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        u => bail!("unknown size unit {u:?} (use K, M, G, T or KiB, MiB, GiB, TiB)"),
    };
    n.checked_mul(1u64 << shift)
        .with_context(|| format!("{s:?} is too large"))
}

/// Total memory of the machine, from /proc/meminfo.
fn mem_total() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("2 GiB").unwrap(), 2 << 30);
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err =
            toml::from_str::<Config>("[grpc]\nlisten = \"127.0.0.1:1\"\nlisen = 2\n").unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
        assert!(toml::from_str::<Config>("[[ports]]\nid = \"p0\"\nrole = \"router\"\n").is_err());
    }

    #[test]
    fn insecure_remote_needs_consent() {
        let mut c: Config = toml::from_str("[grpc]\nlisten = \"0.0.0.0:50051\"\n").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("refusing plain-text"), "{err}");
        c.grpc.allow_insecure_remote = true;
        c.validate().unwrap();
        c.grpc.allow_insecure_remote = false;
        c.grpc.tls_cert = Some("c.pem".into());
        assert!(c.validate().unwrap_err().to_string().contains("tls_key"));
        c.grpc.tls_key = Some("k.pem".into());
        c.validate().unwrap();
    }

    #[test]
    fn health_listener_has_its_own_port() {
        let mut c: Config = toml::from_str(
            "[grpc]\nlisten = \"127.0.0.1:50051\"\nhealth_listen = \"0.0.0.0:50052\"\n",
        )
        .unwrap();
        // Health only: plain text on any address needs no consent.
        c.validate().unwrap();
        c.grpc.health_listen = Some(c.grpc.listen);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("its own port"), "{err}");
    }

    #[test]
    #[cfg(feature = "dpdk")]
    fn ports_of_one_bus_device_share_its_devargs() {
        let port = |id: &str, dev: &str, name: Option<&str>| {
            let name = name.map_or(String::new(), |n| format!("dpdk_name = \"{n}\"\n"));
            format!("[[ports]]\nid = \"{id}\"\ndriver = \"dpdk\"\ndevice = \"{dev}\"\n{name}")
        };
        let dev = "0000:03:00.0,representor=vf[0-1]";
        let ok = port("p0", dev, None) + &port("pf0vf0", dev, Some("0000:03:00.0_representor_vf0"));
        toml::from_str::<Config>(&ok).unwrap().validate().unwrap();
        let other = ok.clone() + &port("pf0vf1", "0000:03:00.0,representor=vf[1]", Some("x"));
        let err = toml::from_str::<Config>(&other)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("same devargs"), "{err}");
        let twice = ok + &port("pf0vf1", dev, Some("0000:03:00.0_representor_vf0"));
        let err = toml::from_str::<Config>(&twice)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("own dpdk_name"), "{err}");
    }

    #[test]
    fn duplicate_or_bad_ports() {
        let c: Config = toml::from_str("[[ports]]\nid = \"p0\"\n[[ports]]\nid = \"p0\"\n").unwrap();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("declared twice"));
        let c: Config = toml::from_str("[[ports]]\nid = \"P0\"\n").unwrap();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("ports[0].id"));
    }

    #[test]
    fn data_plane_settings_are_checked() {
        let bad = |text: &str, want: &str| {
            let c: Config = toml::from_str(text).unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        };
        bad(
            "[[ports]]\nid = \"p0\"\ndriver = \"dpdk\"\n",
            "needs a device",
        );
        bad(
            "[[ports]]\nid = \"p0\"\ndriver = \"xdp\"\n",
            "unknown driver",
        );
        bad("[dataplane]\nworkers = 0\n", "dataplane.workers");
        bad("[dataplane]\nmbufs = 10\n", "dataplane.mbufs");
        bad("[dataplane]\nfile_prefix = \"a/b\"\n", "file_prefix");
        bad(
            "[dataplane]\nconntrack_max = 0\n",
            "dataplane.conntrack_max",
        );
        bad(
            "[dataplane]\nflow_cache_entries = 100000000\n",
            "dataplane.flow_cache_entries",
        );
        bad(
            "[dataplane]\nconntrack_max = 10\nconntrack_per_tenant = 11\n",
            "dataplane.conntrack_per_tenant",
        );
        bad(
            "[dataplane]\nworkers = 2\nworker_cpus = [1]\n",
            "dataplane.worker_cpus names 1 CPUs for 2 workers",
        );
        bad(
            "[dataplane]\nworkers = 2\nworker_cpus = [1, 1]\n",
            "dataplane.worker_cpus[1]: CPU 1",
        );
        assert!(toml::from_str::<Config>("[dataplane]\nidle = \"sometimes\"\n").is_err());
        // The CPUs of the data plane are the data plane's alone.
        bad(
            "[dataplane]\nworkers = 2\nworker_cpus = [1, 2]\n[storage]\nio_cpus = [3, 2]\n",
            "storage.io_cpus[1]: CPU 2 already runs data-plane worker 1 (dataplane.worker_cpus[1])",
        );
        let c: Config = toml::from_str(
            "[dataplane]\nidle = \"backoff\"\nno_huge = true\n[[ports]]\nid = \"p0\"\ndriver = \"kernel\"\ndevice = \"p0\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.dataplane.idle, IdleMode::Backoff);
    }

    #[test]
    fn vtep_addresses_are_unicast_distinct_and_on_data_plane_ports() {
        let port = |id: &str, driver: &str, vtep: &str| {
            format!(
                "[[ports]]\nid = \"{id}\"\ndriver = \"{driver}\"\ndevice = \"{id}\"\nvtep_address = \"{vtep}\"\n"
            )
        };
        let check = |text: &str| {
            toml::from_str::<Config>(text)
                .map_err(|e| e.to_string())?
                .validate()
                .map_err(|e| e.to_string())
        };
        let c: Config = toml::from_str(&port("p0", "kernel", "192.0.2.1")).unwrap();
        c.validate().unwrap();
        assert_eq!(c.ports[0].vtep_address, Some("192.0.2.1".parse().unwrap()));
        for (text, want) in [
            (
                port("p0", "none", "192.0.2.1"),
                "vtep_address needs a data-plane driver",
            ),
            (
                port("p0", "kernel", "224.0.0.5"),
                "224.0.0.5 is not a unicast address",
            ),
            (port("p0", "kernel", "0.0.0.0"), "is not a unicast address"),
            (
                port("p0", "kernel", "192.0.2.1") + &port("p1", "kernel", "192.0.2.1"),
                "ports[1] (p1): vtep_address 192.0.2.1 is also ports[0]'s",
            ),
            (port("p0", "kernel", "2001:db8::1"), "vtep_address"),
        ] {
            let err = check(&text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn kernel_ports_name_interfaces_and_do_not_mix_with_dpdk_ports() {
        let port = |id: &str, driver: &str, device: &str| {
            format!("[[ports]]\nid = \"{id}\"\ndriver = \"{driver}\"\ndevice = \"{device}\"\n")
        };
        let check = |text: &str| {
            toml::from_str::<Config>(text)
                .unwrap()
                .validate()
                .map_err(|e| e.to_string())
        };
        let two = port("p0", "kernel", "veth0") + &port("pf0vf0", "kernel", "pf0vf0");
        check(&two).unwrap();
        for dev in ["", "a/b", "sixteen-chars-ab", "..", "eth0:1", "a b"] {
            let err = check(&port("p0", "kernel", dev)).unwrap_err();
            assert!(
                err.contains("ports[0] (p0): driver \"kernel\" needs device"),
                "{dev:?}: {err}"
            );
        }
        let err =
            check(&(port("p0", "kernel", "veth0") + &port("p1", "kernel", "veth0"))).unwrap_err();
        assert!(
            err.contains("ports[1] (p1): interface \"veth0\" is also ports[0]"),
            "{err}"
        );
        let err =
            check(&(port("p0", "kernel", "veth0") + &port("p1", "dpdk", "net_tap0"))).unwrap_err();
        assert!(
            err.contains(
                "ports[1] (p1): driver \"dpdk\" cannot be mixed with driver \"kernel\" of ports[0]"
            ),
            "{err}"
        );
        // Ports for the API only mix with either.
        check(&(port("p0", "kernel", "veth0") + "[[ports]]\nid = \"p1\"\n")).unwrap();
        // A build without DPDK says so instead of failing at start.
        let dpdk = check(&port("p0", "dpdk", "net_tap0,iface=p0"));
        assert_eq!(dpdk.is_ok(), cfg!(feature = "dpdk"), "{dpdk:?}");
        if let Err(e) = dpdk {
            assert!(e.contains("no DPDK support"), "{e}");
        }
    }

    /// A subsystem "a" with `sub` appended to its table, then `rest`.
    fn declared(sub: &str, rest: &str) -> String {
        format!(
            "[[storage.subsystems]]\nid = \"a\"\nnqn = \"nqn.2024-01.io.example:a\"\n{sub}\n{rest}\n"
        )
    }

    #[test]
    fn storage_declarations_parse() {
        let c: Config = toml::from_str(
            r#"
[storage]
ram_limit = "1GiB"
discovery_listen = "127.0.0.1:8009"

[[storage.subsystems]]
id = "vol1"
nqn = "nqn.2024-01.io.example:vol1"
serial_number = "SN1"
model_number = "M1"
allowed_hosts = ["nqn.2014-08.org.nvmexpress:uuid:h"]
max_namespaces = 8

[[storage.subsystems.namespaces]]
nsid = 2
ram = "256MiB"
block_size = 4096
uuid = "123e4567-e89b-12d3-a456-426614174000"
nguid = "00112233445566778899aabbccddeeff"

[[storage.subsystems.namespaces]]
file = "/var/lib/disk.img"
size = "1GiB"

[[storage.subsystems.namespaces]]
block_device = "/dev/nvme0n1"

[[storage.subsystems.listeners]]
id = "data"
address = "192.0.2.10"
port = 4420
transport = "tcp"

[[storage.subsystems.listeners]]
address = "::1"
port = 4421

[[storage.subsystems]]
id = "vol2"
nqn = "nqn.2024-01.io.example:vol2"
allow_any_host = true
"#,
        )
        .unwrap();
        c.validate().unwrap();
        let st = &c.storage;
        assert_eq!(st.discovery_listen, Some("127.0.0.1:8009".parse().unwrap()));
        assert_eq!(st.subsystems.len(), 2);
        let v1 = &st.subsystems[0];
        assert!(!v1.allow_any_host, "no host unless allowed");
        assert_eq!(v1.max_namespaces, Some(8));
        let p = v1.to_proto();
        assert_eq!(
            (p.serial_number.as_str(), p.model_number.as_str()),
            ("SN1", "M1")
        );
        assert_eq!(p.allowed_hosts, ["nqn.2014-08.org.nvmexpress:uuid:h"]);
        let n = v1.namespaces[0].to_proto().unwrap();
        assert_eq!((n.nsid, n.block_size), (2, 4096));
        assert_eq!(
            n.backend,
            Some(pb::namespace::Backend::Ram(pb::RamBackend {
                size_bytes: 256 << 20
            }))
        );
        assert_eq!(n.uuid, "123e4567-e89b-12d3-a456-426614174000");
        assert_eq!(
            v1.namespaces[1].to_proto().unwrap().backend,
            Some(pb::namespace::Backend::File(pb::FileBackend {
                path: "/var/lib/disk.img".into(),
                size_bytes: 1 << 30
            }))
        );
        let n = v1.namespaces[2].to_proto().unwrap();
        assert_eq!((n.nsid, n.block_size), (0, 0), "left to the API's defaults");
        assert_eq!(v1.listeners[0].id.as_deref(), Some("data"));
        let l = v1.listeners[1].to_proto();
        assert_eq!(l.transport, pb::Transport::Tcp as i32, "tcp by default");
        assert_eq!((l.address.as_str(), l.port), ("::1", 4421));
        let v2 = &st.subsystems[1];
        assert!(v2.allow_any_host);
        assert!(v2.namespaces.is_empty() && v2.listeners.is_empty());
        let p = v2.to_proto();
        assert_eq!((p.serial_number.as_str(), p.max_namespaces), ("", 0));

        let empty: Config = toml::from_str("[storage]\n").unwrap();
        empty.validate().unwrap();
        assert!(empty.storage.discovery_listen.is_none());
        assert!(empty.storage.subsystems.is_empty());
    }

    #[test]
    fn storage_declarations_are_checked() {
        let ns = "[[storage.subsystems.namespaces]]";
        let ls = "[[storage.subsystems.listeners]]";
        let b = "[[storage.subsystems]]";
        for (text, want) in [
            (
                format!("{b}\nid = \"A\"\nnqn = \"nqn.2024-01.io.example:a\"\n"),
                "storage.subsystems[0].id: \"A\" is not a valid ID",
            ),
            (
                declared("", &format!("{b}\nid = \"a\"\nnqn = \"nqn.2024-01.io.example:b\"\n")),
                "storage.subsystems[1].id: subsystem \"a\" is declared twice",
            ),
            (
                format!("{b}\nid = \"a\"\nnqn = \"vol-a\"\n"),
                "storage.subsystems[0].nqn: \"vol-a\" is not a valid NQN",
            ),
            (
                format!("{b}\nid = \"a\"\nnqn = \"nqn.2014-08.org.nvmexpress.discovery\"\n"),
                "storage.subsystems[0].nqn: the discovery NQN is reserved",
            ),
            (
                declared("", &format!("{b}\nid = \"b\"\nnqn = \"nqn.2024-01.io.example:a\"\n")),
                "storage.subsystems[1].nqn: nqn.2024-01.io.example:a is also the NQN of storage.subsystems[0]",
            ),
            (
                declared("serial_number = \"\"", ""),
                "storage.subsystems[0].serial_number: \"\" must be 1 to 20",
            ),
            (
                declared(&format!("model_number = \"{}\"", "m".repeat(41)), ""),
                "storage.subsystems[0].model_number:",
            ),
            (
                declared("allowed_hosts = [\"host-1\"]", ""),
                "storage.subsystems[0].allowed_hosts[0]: \"host-1\" is not a valid NQN",
            ),
            (
                declared("allowed_hosts = [\"nqn.2024-01.io.example:h\", \"nqn.2024-01.io.example:h\"]", ""),
                "storage.subsystems[0].allowed_hosts[1]: nqn.2024-01.io.example:h is listed twice",
            ),
            (
                declared("max_namespaces = 0", ""),
                "storage.subsystems[0].max_namespaces: 0 is not in 1..=1024",
            ),
            (
                declared("max_namespaces = 1", &format!("{ns}\nram = \"1M\"\n{ns}\nram = \"1M\"\n")),
                "storage.subsystems[0].namespaces: 2 namespaces do not fit in max_namespaces 1",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nfile = \"/x\"\n")),
                "storage.subsystems[0].namespaces[0]: give exactly one of ram, file, block_device",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\n{ns}\nblock_size = 512\n")),
                "storage.subsystems[0].namespaces[1]: give exactly one of ram, file, block_device",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nsize = \"2M\"\n")),
                "storage.subsystems[0].namespaces[0]: size goes with file",
            ),
            (
                declared("", &format!("{ns}\nram = \"lots\"\n")),
                "storage.subsystems[0].namespaces[0].ram: \"lots\" is not a size",
            ),
            (
                declared("", &format!("{ns}\nfile = \"/x\"\nsize = \"1.5G\"\n")),
                "storage.subsystems[0].namespaces[0].size: unknown size unit \".5G\"",
            ),
            (
                declared("", &format!("{ns}\nram = \"0\"\n")),
                "storage.subsystems[0].namespaces[0].ram: 0 is not a non-zero multiple of the block size 512",
            ),
            (
                declared("", &format!("{ns}\nram = \"6K\"\nblock_size = 4096\n")),
                "storage.subsystems[0].namespaces[0].ram: 6K is not a non-zero multiple of the block size 4096",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nblock_size = 1024\n")),
                "storage.subsystems[0].namespaces[0].block_size: 1024 is not 512 or 4096",
            ),
            (
                declared("", &format!("{ns}\nfile = \"disk.img\"\n")),
                "storage.subsystems[0].namespaces[0].file: \"disk.img\" is not an absolute path",
            ),
            (
                declared("", &format!("{ns}\nblock_device = \"nvme0n1\"\n")),
                "storage.subsystems[0].namespaces[0].block_device: \"nvme0n1\" is not an absolute path",
            ),
            (
                declared("max_namespaces = 4", &format!("{ns}\nnsid = 5\nram = \"1M\"\n")),
                "storage.subsystems[0].namespaces[0].nsid: 5 is not in 1..=4",
            ),
            (
                declared("", &format!("{ns}\nnsid = 0\nram = \"1M\"\n")),
                "storage.subsystems[0].namespaces[0].nsid: 0 is not in 1..=32",
            ),
            (
                declared("", &format!("{ns}\nnsid = 2\nram = \"1M\"\n{ns}\nnsid = 2\nram = \"1M\"\n")),
                "storage.subsystems[0].namespaces[1].nsid: namespace 2 is already namespaces[0]'s",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\n{ns}\nnsid = 1\nram = \"1M\"\n")),
                "storage.subsystems[0].namespaces[1].nsid: namespace 1 is already namespaces[0]'s (the lowest free one",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nuuid = \"not-a-uuid\"\n")),
                "storage.subsystems[0].namespaces[0].uuid: \"not-a-uuid\" is not a UUID",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nnguid = \"00ff\"\n")),
                "storage.subsystems[0].namespaces[0].nguid: \"00ff\" is not 32 hex digits",
            ),
            (
                format!(
                    "[storage]\nram_limit = \"1M\"\n{}",
                    declared("", &format!("{ns}\nram = \"1M\"\n{ns}\nram = \"4K\"\n"))
                ),
                "storage.subsystems: the RAM namespaces declared total 1052672 bytes, more than storage.ram_limit (1048576 bytes)",
            ),
            (
                declared("", &format!("{ls}\nid = \"Data\"\naddress = \"127.0.0.1\"\nport = 4420\n")),
                "storage.subsystems[0].listeners[0].id: \"Data\" is not a valid ID",
            ),
            (
                declared("", &format!("{ls}\nid = \"d\"\naddress = \"127.0.0.1\"\nport = 4420\n{ls}\nid = \"d\"\naddress = \"127.0.0.1\"\nport = 4421\n")),
                "storage.subsystems[0].listeners[1].id: listener \"d\" is declared twice",
            ),
            (
                declared("", &format!("{ls}\naddress = \"127.0.0.1\"\nport = 0\n")),
                "storage.subsystems[0].listeners[0].port: 0 is not in 1..=65535",
            ),
            (
                declared("", &format!("{ls}\naddress = \"127.0.0.1\"\nport = 4420\n{ls}\nid = \"x\"\naddress = \"127.0.0.1\"\nport = 4420\n")),
                "storage.subsystems[0].listeners[1]: listeners[0] already listens on 127.0.0.1:4420",
            ),
        ] {
            let c: Config = toml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let e = format!("{:#}", c.validate().unwrap_err());
            assert!(e.starts_with(want), "{text}\nwant: {want}\ngot:  {e}");
        }
    }

    #[test]
    fn storage_io_cpus_parse_and_are_checked_against_this_process() {
        let load = |text: &str| {
            toml::from_str::<Config>(text)
                .map_err(|e| e.to_string())
                .and_then(|c| c.validate().map(|()| c).map_err(|e| e.to_string()))
        };
        // Unset: nothing pinned, nothing asked of the machine.
        let c = load("").unwrap();
        assert!(c.storage.io_cpus.is_empty());
        assert_eq!(c.transport(), dpu_nvmeof::TcpConfig::default());
        let allowed = dpu_os::affinity::current_thread_cpus().unwrap();
        let &cpu = allowed.last().unwrap();
        let c = load(&format!("[storage]\nio_cpus = [{cpu}]\n")).unwrap();
        assert_eq!(c.transport().io_cpus, [cpu]);
        assert_eq!(c.transport().io_cpu(7), Some(cpu));
        // The target's threads keep off the workers' CPUs when a data
        // plane runs them.
        let workers = format!("[dataplane]\nworker_cpus = [{cpu}]\n");
        let c = load(&workers).unwrap();
        assert!(
            c.transport().avoid_cpus.is_empty(),
            "no ports, no data plane"
        );
        let c = load(&format!(
            "[[ports]]\nid = \"p0\"\ndriver = \"kernel\"\ndevice = \"lo\"\n{workers}"
        ))
        .unwrap();
        assert_eq!(c.transport().avoid_cpus, [cpu]);
        for (text, want) in [
            (
                "[storage]\nio_cpus = [100000]\n".to_string(),
                "storage.io_cpus[0]: CPU 100000 is not among the CPUs this process may use (",
            ),
            (
                format!("[storage]\nio_cpus = [{cpu}, {cpu}]\n"),
                &*format!("storage.io_cpus[1]: CPU {cpu} is listed twice"),
            ),
            (
                format!("[dataplane]\nworker_cpus = [{cpu}]\n[storage]\nio_cpus = [{cpu}]\n"),
                &*format!("storage.io_cpus[0]: CPU {cpu} already runs data-plane worker 0"),
            ),
            ("[storage]\nio_cpus = [-1]\n".to_string(), "io_cpus"),
            ("[storage]\nio_cpus = \"2-3\"\n".to_string(), "io_cpus"),
        ] {
            let e = load(&text).unwrap_err();
            assert!(e.contains(want), "{text}\nwant: {want}\ngot:  {e}");
        }
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

    /// Ports p0, pf0vf0, pf0vf1 and a tenant "t" with `tenant` appended to
    /// its table, then `rest`.
    fn tenant(tenant: &str, rest: &str) -> String {
        format!(
            "[[ports]]\nid = \"p0\"\n[[ports]]\nid = \"pf0vf0\"\n[[ports]]\nid = \"pf0vf1\"\n\
             [[tenants]]\nid = \"t\"\n{tenant}\n{rest}\n"
        )
    }

    #[test]
    fn tenant_declarations_parse() {
        let c: Config = toml::from_str(&tenant(
            "display_name = \"T\"\ndefault_policy = \"allow\"\nattachments = [\"pf0vf0\", \"p0.100\", \"p0.200\"]",
            r#"
[[tenants.rules]]
id = "web"
priority = 10
action = "allow"
src = "10.0.0.0/8"
dst = "10.1.0.0/16"
proto = "tcp"
sport = 1024
dport = "80-443"
stateful = true
description = "web"

[[tenants.rules]]
priority = 20
action = "deny"
proto = 1
icmp_type = 8
icmp_code = 0

[[tenants]]
id = "u"
attachments = ["pf0vf1"]
"#,
        ))
        .unwrap();
        c.validate().unwrap();
        let [t, u] = &c.tenants[..] else {
            panic!("two tenants")
        };
        let p = t.to_proto("t").unwrap();
        assert_eq!(p.display_name, "T");
        assert_eq!(p.default_policy, pb::DefaultPolicy::Allow as i32);
        let atts: Vec<(String, u32)> = p
            .attachments
            .iter()
            .map(|a| match &a.kind {
                Some(pb::attachment::Kind::Port(p)) => (p.port.clone(), p.vlan_id),
                k => panic!("{k:?}"),
            })
            .collect();
        assert_eq!(
            atts,
            [
                ("ports/pf0vf0".to_string(), 0),
                ("ports/p0".to_string(), 100),
                ("ports/p0".to_string(), 200)
            ]
        );
        let web = t.rules[0].to_proto("r").unwrap();
        assert_eq!(web.priority, 10);
        assert_eq!(web.action, pb::RuleAction::Allow as i32);
        assert_eq!(
            (web.src_prefix.as_str(), web.dst_prefix.as_str()),
            ("10.0.0.0/8", "10.1.0.0/16")
        );
        assert_eq!(web.ip_protocol, Some(6));
        assert_eq!(
            web.src_ports,
            Some(pb::PortRange {
                first: 1024,
                last: 1024
            })
        );
        assert_eq!(
            web.dst_ports,
            Some(pb::PortRange {
                first: 80,
                last: 443
            })
        );
        assert!(web.stateful);
        assert_eq!(web.description, "web");
        let deny = t.rules[1].to_proto("r").unwrap();
        assert_eq!(deny.action, pb::RuleAction::Deny as i32);
        assert_eq!(
            (deny.ip_protocol, deny.icmp_type, deny.icmp_code),
            (Some(1), Some(8), Some(0))
        );
        assert_eq!((deny.src_prefix.as_str(), deny.src_ports), ("", None));
        assert!(!deny.stateful);
        let p = u.to_proto("u").unwrap();
        assert_eq!(
            p.default_policy,
            pb::DefaultPolicy::Unspecified as i32,
            "left to the API: deny"
        );
        assert!(u.rules.is_empty());
        for (name, n) in [
            ("udp", 17),
            ("ICMPv6", 58),
            ("ipv6-icmp", 58),
            ("sctp", 132),
            ("47", 47),
        ] {
            assert_eq!(parse_protocol(&TextOrNumber::Text(name.into())).unwrap(), n);
        }
        assert!(Config::default().tenants.is_empty());
    }

    #[test]
    fn tenant_declarations_are_checked() {
        let r = "[[tenants.rules]]";
        for (text, want) in [
            (
                tenant("", "[[tenants]]\nid = \"t\"\n"),
                "tenants[1].id: tenant \"t\" is declared twice",
            ),
            (
                "[[tenants]]\nid = \"Blue\"\n".to_string(),
                "tenants[0].id: \"Blue\" is not a valid ID",
            ),
            (
                tenant("display_name = \"a\\nb\"", ""),
                "tenants[0].display_name: control characters are not allowed",
            ),
            (
                tenant("attachments = [\"pf0vf0.x\"]", ""),
                "tenants[0].attachments[0]: VLAN \"x\" is not a number",
            ),
            (
                tenant("attachments = [\".5\"]", ""),
                "tenants[0].attachments[0]: \".5\": expected PORT[.VLAN]",
            ),
            (
                tenant("attachments = [\"p0.4095\"]", ""),
                "tenants[0].attachments[0]: 4095 is not in 0..=4094",
            ),
            (
                tenant("attachments = [\"PF0\"]", ""),
                "tenants[0].attachments[0]: ",
            ),
            (
                tenant("attachments = [\"pf0vf9\"]", ""),
                "tenants[0].attachments[0]: port \"pf0vf9\" is not declared under [[ports]]",
            ),
            (
                tenant("attachments = [\"p0.100\", \"p0\"]", ""),
                "tenants[0].attachments[1]: ",
            ),
            (
                tenant(
                    "attachments = [\"pf0vf0\"]",
                    "[[tenants]]\nid = \"u\"\nattachments = [\"pf0vf1\", \"pf0vf0\"]\n",
                ),
                "tenants[1].attachments[1]: ",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\ndst = \"10.0.0.1/8\"\n")),
                "tenants[0].rules[0].dst: host bits are set in 10.0.0.1/8 (did you mean 10.0.0.0/8?)",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\nsrc = \"10.0.0.0/33\"\n")),
                "tenants[0].rules[0].src: ",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\nsrc = \"10.0.0.0/8\"\ndst = \"::/0\"\n")),
                "tenants[0].rules[0].dst: ",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\ndport = 80\n")),
                "tenants[0].rules[0].dport: port ranges need ip_protocol",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\nproto = \"udp\"\nsport = \"90-80\"\n")),
                "tenants[0].rules[0].sport: first (90) is greater than last (80)",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\nproto = \"udp\"\nsport = 70000\n")),
                "tenants[0].rules[0].sport: 70000 is not in 0..=65535",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\nproto = \"udp\"\ndport = \"http\"\n")),
                "tenants[0].rules[0].dport: \"http\" is not a port (expected PORT or FIRST-LAST)",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\nrate_limit = \"fast\"\n")),
                "tenants[0].rules[0].rate_limit: \"fast\" is not a rate",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\nburst = 5\n")),
                "tenants[0].rules[0].burst: needs rate_limit",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\nproto = \"udp\"\ndport = -1\n")),
                "tenants[0].rules[0].dport: -1 is not in 0..=65535",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\nproto = \"gre\"\n")),
                "tenants[0].rules[0].proto: \"gre\" is not tcp, udp, icmp, icmpv6, sctp or a protocol number",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\nproto = 256\n")),
                "tenants[0].rules[0].proto: 256 is not in 0..=255",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\nicmp_type = 8\n")),
                "tenants[0].rules[0].icmp_type: needs ip_protocol 1 (ICMP) or 58 (ICMPv6)",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\nproto = \"icmp\"\nicmp_code = 0\n")),
                "tenants[0].rules[0].icmp_code: requires icmp_type",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"deny\"\nstateful = true\n")),
                "tenants[0].rules[0].stateful: only ALLOW rules can be stateful",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\ndescription = \"{}\"\n", "d".repeat(300))),
                "tenants[0].rules[0].description: ",
            ),
            (
                tenant("", &format!("{r}\nid = \"Web\"\npriority = 1\naction = \"allow\"\n")),
                "tenants[0].rules[0].id: \"Web\" is not a valid ID",
            ),
            (
                tenant("", &format!("{r}\nid = \"a\"\npriority = 1\naction = \"allow\"\n{r}\nid = \"a\"\npriority = 2\naction = \"allow\"\n")),
                "tenants[0].rules[1].id: rule \"a\" is also rules[0]'s ID",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\n{r}\npriority = 1\naction = \"deny\"\n")),
                "tenants[0].rules[1].priority: 1 is also the priority of rules[0]",
            ),
        ] {
            let c: Config = toml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let e = format!("{:#}", c.validate().unwrap_err());
            assert!(e.starts_with(want), "{text}\nwant: {want}\ngot:  {e}");
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

    /// The shipped configurations run their ports on DPDK.
    #[test]
    #[cfg(feature = "dpdk")]
    fn shipped_configs_are_valid() {
        let load = |f: &str| {
            let c = Config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join(f)).unwrap();
            c.validate().unwrap();
            c
        };
        let dev_config = load("config/dev.toml");
        // Four TAP ports named like a BlueField's, each its own interface.
        let ports: Vec<(&str, &str)> = dev_config
            .ports
            .iter()
            .map(|p| (p.id.as_str(), p.device.as_str()))
            .collect();
        assert_eq!(
            ports,
            [
                ("p0", "net_tap0,iface=p0"),
                ("pf0vf0", "net_tap1,iface=pf0vf0"),
                ("pf0vf1", "net_tap2,iface=pf0vf1"),
                ("pf0vf2", "net_tap3,iface=pf0vf2"),
            ]
        );
        assert!(dev_config.ports.iter().all(|p| p.driver == "dpdk"));
        assert_eq!(dev_config.ports[0].role, PortRole::Uplink);
        let d = &dev_config.dataplane;
        assert!(d.no_huge && d.memory_mb.is_some_and(|m| m <= 512));
        assert_eq!((d.idle, d.workers), (IdleMode::Backoff, 1));
        assert_ne!(d.file_prefix, DataplaneConfig::default().file_prefix);
        // One example tenant on two VFs, default deny, with rules that let
        // the README's ping across and show a deny.
        let [t] = &dev_config.tenants[..] else {
            panic!("dev.toml declares one tenant")
        };
        assert_eq!(t.id, "demo");
        assert_eq!(t.attachments, ["pf0vf0", "pf0vf1"]);
        assert_eq!(t.default_policy, Some(SeedAction::Deny));
        let rules: Vec<(&str, SeedAction, bool)> = t
            .rules
            .iter()
            .map(|r| (r.id.as_deref().unwrap_or(""), r.action, r.stateful))
            .collect();
        assert_eq!(
            rules,
            [
                ("quarantine", SeedAction::Deny, false),
                ("ping", SeedAction::Allow, true),
                ("web", SeedAction::Allow, true),
            ]
        );
        let dev = dev_config.storage;
        assert_eq!(
            dev.discovery_listen,
            Some("127.0.0.1:8009".parse().unwrap())
        );
        let [s] = &dev.subsystems[..] else {
            panic!("dev.toml declares one subsystem")
        };
        assert_eq!(
            (s.id.as_str(), s.nqn.as_str()),
            ("dev", "nqn.2024-01.io.dpu-service:dev")
        );
        assert!(s.allow_any_host);
        assert_eq!(s.namespaces[0].ram.as_deref(), Some("256MiB"));
        assert_eq!(s.namespaces[0].block_size, Some(512));
        assert_eq!(
            (s.listeners[0].address.to_string(), s.listeners[0].port),
            ("127.0.0.1".to_string(), 4420)
        );
        // Without the data plane, the same ports exist for the API only.
        let mut api_only = load("config/dev.toml");
        api_only
            .apply(&Cli::parse_from([
                "dpu-service",
                "--no-dataplane",
                "--config",
                "config/dev.toml",
            ]))
            .unwrap();
        api_only.validate().unwrap();
        assert!(api_only
            .ports
            .iter()
            .all(|p| p.driver == "none" && p.device.is_empty() && p.vtep_address.is_none()));
        assert_eq!(api_only.ports.len(), 4);
        assert_eq!(api_only.tenants.len(), 1, "the tenant is still seeded");
        let prod = load("config/production.toml");
        assert!(
            prod.storage.subsystems.is_empty(),
            "production declares no storage"
        );
        assert!(prod.storage.discovery_listen.is_none());
        assert!(prod.grpc.tls_client_ca.is_some(), "production uses mTLS");
        assert!(prod.grpc.health_listen.is_some());
        let ids: Vec<&str> = prod.ports.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["p0", "pf0hpf", "pf0vf0", "pf0vf1", "p1", "pf1hpf"]);
        assert!(prod.ports.iter().all(|p| p.driver == "dpdk"));
    }
}
