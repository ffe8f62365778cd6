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
}

/// `[dataplane]`: DPDK's EAL and the worker threads. Used when at least
/// one port has `driver = "dpdk"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataplaneConfig {
    /// Worker threads; worker `i` polls RX/TX queue `i` of every port.
    pub workers: u16,
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
    /// Packet buffers in the pool.
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
    /// Further EAL arguments, passed as they are (e.g. "-d", a PMD path).
    pub eal_args: Vec<String>,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        Self {
            workers: 1,
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
    /// a bus device ("0000:03:00.0,representor=vf[0-3]").
    #[serde(default)]
    pub device: String,
    /// DPDK's name of the port, if it is not the device's first field
    /// (e.g. an mlx5 representor).
    #[serde(default)]
    pub dpdk_name: Option<String>,
    /// What the port is connected to.
    #[serde(default)]
    pub role: PortRole,
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
        for (i, p) in self.ports.iter().enumerate() {
            dpu_control::validate::id(&format!("ports[{i}].id"), &p.id)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            if !seen.insert(&p.id) {
                bail!("ports[{i}].id: port {:?} is declared twice", p.id);
            }
            match p.driver.as_str() {
                "none" => {}
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
                    "ports[{i}] ({}): unknown driver {d:?} (use \"dpdk\" or \"none\")",
                    p.id
                ),
            }
        }
        let d = &self.dataplane;
        if d.workers == 0 || d.workers > 64 {
            bail!("dataplane.workers must be in 1..=64, not {}", d.workers);
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
        Ok(())
    }

    /// Checks `[storage]`'s declared subsystems, namespaces and listeners
    /// with the rules the API applies to them, naming the offending key.
    fn validate_storage(&self) -> Result<()> {
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
            "[dataplane]\nconntrack_max = 10\nconntrack_per_tenant = 11\n",
            "dataplane.conntrack_per_tenant",
        );
        assert!(toml::from_str::<Config>("[dataplane]\nidle = \"sometimes\"\n").is_err());
        let c: Config = toml::from_str(
            "[dataplane]\nidle = \"backoff\"\nno_huge = true\n[[ports]]\nid = \"p0\"\ndriver = \"dpdk\"\ndevice = \"net_tap0,iface=p0\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.dataplane.idle, IdleMode::Backoff);
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

    #[test]
    fn shipped_configs_are_valid() {
        let load = |f: &str| {
            let c = Config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join(f)).unwrap();
            c.validate().unwrap();
            c
        };
        let dev = load("config/dev.toml").storage;
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
