//! Service configuration: a TOML file, overridden by flags and environment.
//!
//! Unknown keys are errors, so a misspelt setting is reported instead of
//! silently ignored. Relative paths are taken relative to the working
//! directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use dpu_control::model::{PortRole, PortSpec};
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
}

impl Default for GrpcConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            allow_insecure_remote: false,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
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
    /// "127.0.0.1:8009". The discovery controller also answers on every
    /// subsystem listener; unset, only there.
    pub discovery_listen: Option<SocketAddr>,
    /// Subsystems created at startup when the state has none with their ID
    /// (`[[storage.subsystems]]`). Once created they live in the state like
    /// any other: changes made over gRPC survive restarts.
    pub subsystems: Vec<SeedSubsystem>,
}

/// `[[storage.subsystems]]`: a subsystem to create at startup.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedSubsystem {
    /// Subsystem ID.
    pub id: String,
    /// NVMe Qualified Name.
    pub nqn: String,
    /// Serial number (derived from the NQN if unset).
    #[serde(default)]
    pub serial_number: String,
    /// Model number ("dpu-service" if unset).
    #[serde(default)]
    pub model_number: String,
    /// Any host may connect.
    #[serde(default)]
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Largest namespace ID (32 if unset).
    #[serde(default)]
    pub max_namespaces: u32,
    /// `[[storage.subsystems.namespaces]]`.
    #[serde(default)]
    pub namespaces: Vec<SeedNamespace>,
    /// `[[storage.subsystems.listeners]]`.
    #[serde(default)]
    pub listeners: Vec<SeedListener>,
}

/// `[[storage.subsystems.namespaces]]`: exactly one of `ram`, `file`,
/// `block_device`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedNamespace {
    /// Namespace ID (lowest free if unset).
    #[serde(default)]
    pub nsid: u32,
    /// RAM-backed, of this size ("256MiB").
    pub ram: Option<String>,
    /// File-backed, at this absolute path.
    pub file: Option<String>,
    /// Size of a file backend (the existing file's if unset).
    pub size: Option<String>,
    /// Block-device-backed, at this path.
    pub block_device: Option<String>,
    /// Logical block size, 512 or 4096 (512 if unset).
    #[serde(default)]
    pub block_size: u32,
}

/// `[[storage.subsystems.listeners]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedListener {
    /// Listener ID (derived from the address if unset).
    #[serde(default)]
    pub id: String,
    /// IP address.
    pub address: std::net::IpAddr,
    /// TCP port.
    pub port: u16,
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
            self.metrics.listen = if m == "off" {
                None
            } else {
                Some(m.parse().with_context(|| {
                    format!("--metrics-listen {m:?} is not an address or \"off\"")
                })?)
            };
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
        let mut seen = std::collections::BTreeSet::new();
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
                "dpdk" => {}
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
        if d.file_prefix.is_empty() || d.file_prefix.contains('/') {
            bail!(
                "dataplane.file_prefix {:?} must be a non-empty name without '/'",
                d.file_prefix
            );
        }
        if let Some(r) = &self.storage.ram_limit {
            parse_size(r).with_context(|| format!("storage.ram_limit {r:?}"))?;
        }
        for (i, s) in self.storage.subsystems.iter().enumerate() {
            for (j, n) in s.namespaces.iter().enumerate() {
                let at = format!("storage.subsystems[{i}].namespaces[{j}]");
                let given = [n.ram.is_some(), n.file.is_some(), n.block_device.is_some()];
                if given.iter().filter(|g| **g).count() != 1 {
                    bail!("{at}: give exactly one of ram, file, block_device");
                }
                if n.size.is_some() && n.file.is_none() {
                    bail!("{at}: size goes with file");
                }
                for v in [&n.ram, &n.size].into_iter().flatten() {
                    parse_size(v).with_context(|| format!("{at}: size {v:?}"))?;
                }
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
        assert!(toml::from_str::<Config>("[dataplane]\nidle = \"sometimes\"\n").is_err());
        let c: Config = toml::from_str(
            "[dataplane]\nidle = \"backoff\"\nno_huge = true\n[[ports]]\nid = \"p0\"\ndriver = \"dpdk\"\ndevice = \"net_tap0,iface=p0\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.dataplane.idle, IdleMode::Backoff);
    }

    #[test]
    fn shipped_configs_are_valid() {
        for f in ["config/dev.toml", "config/production.toml"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(f);
            Config::load(&path).unwrap().validate().unwrap();
        }
    }
}
