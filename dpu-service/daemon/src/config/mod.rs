//! Service configuration: a TOML file, overridden by flags and environment.
//!
//! Unknown keys are errors, so a misspelt setting is reported instead of
//! silently ignored. Relative paths are taken relative to the working
//! directory.
//!
//! The rooms: `cli` the flags, `schema` the file's tables, `declared`
//! its declarations as API messages, `check` the checks of the whole,
//! `seed` and `seed_tenants` the creation of the declared storage and
//! tenants at startup.

mod check;
mod cli;
mod declared;
mod limits;
mod schema;
pub(crate) mod seed;
pub(crate) mod seed_tenants;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use dpu_control::model::PortSpec;
use dpu_dataplane::switch::SwitchConfig;
use dpu_nvmeof::conn::Timeouts;
use dpu_os::backing::{BackingPolicy, VOLUMES_DIR};

pub use cli::{Cli, LogFormat};
pub use declared::seed_key;
pub use limits::LimitsConfig;
pub use schema::*;

use dpu_control::service::authz::{Name, Policy, Role};

/// The most `[[grpc.clients]]` entries: each is a label value of the
/// refusal counters.
pub const MAX_CLIENTS: usize = 1024;

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

impl Config {
    /// The bounds of the API listener (and of its health listener).
    pub fn api_limits(&self) -> crate::listen::Limits {
        let g = &self.grpc;
        crate::listen::Limits {
            max_connections: g.max_connections,
            max_connections_per_source: g.max_connections_per_source,
            handshake_timeout: Duration::from_secs(g.handshake_timeout_secs),
            idle_timeout: (g.idle_timeout_secs > 0)
                .then(|| Duration::from_secs(g.idle_timeout_secs)),
            max_watches: g.max_watches,
            max_watches_per_connection: g.max_watches_per_connection,
        }
    }

    /// The bounds of the metrics listener: its connections; a scrape's
    /// whole time is bounded by `metrics.request_timeout_secs` instead.
    pub fn metrics_limits(&self) -> crate::listen::Limits {
        let m = &self.metrics;
        let t = Duration::from_secs(m.request_timeout_secs);
        crate::listen::Limits {
            max_connections: m.max_connections,
            max_connections_per_source: m.max_connections_per_source,
            handshake_timeout: t,
            idle_timeout: Some(t),
            max_watches: 0,
            max_watches_per_connection: 0,
        }
    }

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
                p.mtu = None;
                // No data plane, no tunnel endpoint.
                p.vtep_address = None;
            }
        }
        Ok(())
    }

    /// The data-plane driver the configuration's ports use, if any:
    /// `"dpdk"` or `"kernel"` (validation allows only one of them).
    pub fn dataplane_driver(&self) -> Option<&'static str> {
        self.ports.iter().find_map(|p| match p.driver.as_str() {
            "dpdk" => Some("dpdk"),
            "kernel" => Some("kernel"),
            _ => None,
        })
    }

    /// How the NVMe/TCP transport places its threads (I/O poll groups on
    /// `storage.io_cpus`, and, when a data plane runs, nothing on its
    /// workers' CPUs, `dataplane.worker_cpus`) and how many connections it
    /// admits.
    pub fn transport(&self) -> dpu_nvmeof::TcpConfig {
        let workers = if self.dataplane_driver().is_some() {
            self.dataplane.worker_cpus.clone()
        } else {
            Vec::new()
        };
        let d = dpu_nvmeof::TcpConfig::default();
        dpu_nvmeof::TcpConfig {
            io_cpus: self.storage.io_cpus.clone(),
            avoid_cpus: workers,
            poll_groups: self.storage.poll_groups,
            max_connections: self.storage.max_connections.unwrap_or(d.max_connections),
            max_connections_per_address: self
                .storage
                .max_connections_per_address
                .unwrap_or(d.max_connections_per_address),
            write_timeout: self
                .storage
                .write_timeout_secs
                .map_or(d.write_timeout, Duration::from_secs),
            auth_threads: self.storage.auth_threads.unwrap_or(d.auth_threads),
            auth_queue: self.storage.auth_queue.unwrap_or(d.auth_queue),
        }
    }

    /// The NVMe/TCP target's timers, write buffer budget and
    /// authentication rate (`storage.*_timeout_secs`,
    /// `storage.write_buffer_budget`, `storage.backend_in_flight_budget`,
    /// `storage.auth_attempts_*`,
    /// `storage.auth_sources`).
    pub fn target_limits(&self) -> TargetLimits {
        let d = Timeouts::default();
        let st = &self.storage;
        let secs = |v: Option<u64>, default| v.map_or(default, Duration::from_secs);
        TargetLimits {
            timeouts: Timeouts {
                handshake: secs(st.handshake_timeout_secs, d.handshake),
                pdu: secs(st.pdu_timeout_secs, d.pdu),
                idle: secs(st.idle_timeout_secs, d.idle),
            },
            max_connections_per_host: st
                .max_connections_per_host
                .unwrap_or(dpu_nvmeof::target::DEFAULT_MAX_CONNECTIONS_PER_HOST),
            write_buffer_budget: st
                .write_buffer_budget
                .as_deref()
                .and_then(|s| parse_size(s).ok())
                .unwrap_or(dpu_nvmeof::conn::DEFAULT_WRITE_BUFFER_BUDGET),
            backend_in_flight_budget: st
                .backend_in_flight_budget
                .as_deref()
                .and_then(|s| parse_size(s).ok())
                .unwrap_or(dpu_nvmeof::conn::DEFAULT_BACKEND_IN_FLIGHT),
            endpoint_buffer_memory: self.endpoint_buffer_memory(),
            auth_rate: {
                let d = dpu_nvmeof::auth::limit::AuthRate::default();
                dpu_nvmeof::auth::limit::AuthRate {
                    per_sec: st.auth_attempts_per_sec.unwrap_or(d.per_sec),
                    burst: st.auth_attempts_burst.unwrap_or(d.burst),
                    sources: st.auth_sources.unwrap_or(d.sources),
                }
            },
        }
    }

    /// The switch's configuration from `[dataplane]`, for `ports` ports
    /// and no tenants yet: its table sizes, worker count and timers. Its
    /// bounds are the switch's ([`SwitchConfig::check_sizes`]).
    pub fn switch_base(&self, ports: usize) -> SwitchConfig {
        let d = &self.dataplane;
        SwitchConfig {
            ports,
            workers: usize::from(d.workers),
            mac_table_size: d.mac_table_size,
            mac_ageing: Duration::from_secs(d.mac_ageing_secs),
            mac_per_tenant: d.mac_per_tenant,
            mac_per_attachment: d.mac_per_attachment,
            mac_reserved_per_tenant: d.mac_reserved_per_tenant,
            conntrack_max: d.conntrack_max,
            conntrack_per_tenant: d.conntrack_per_tenant,
            conntrack_reserved_per_tenant: d.conntrack_reserved_per_tenant,
            fragments_max: d.fragments_max,
            fragments_per_tenant: d.fragments_per_tenant,
            fragments_reserved_per_tenant: d.fragments_reserved_per_tenant,
            fragment_timeout: Duration::from_secs(d.fragment_timeout_secs),
            flow_cache_entries: d.flow_cache_entries,
            ..SwitchConfig::default()
        }
    }

    /// Socket buffer memory all storage endpoints share beyond their
    /// reserves (`storage.endpoint_buffer_memory`).
    pub fn endpoint_buffer_memory(&self) -> usize {
        self.storage
            .endpoint_buffer_memory
            .as_deref()
            .and_then(|s| parse_size(s).ok())
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(dpu_endpoint::BufferPool::DEFAULT_SIZE)
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
                vtep_address: p.vtep_address,
            })
            .collect()
    }

    /// The directories file backends may lie beneath: `storage.file_dirs`,
    /// or by default `<state.dir>/volumes` (none without a state
    /// directory).
    pub fn file_dirs(&self) -> Vec<PathBuf> {
        match &self.storage.file_dirs {
            Some(dirs) => dirs.clone(),
            None => self
                .state
                .dir
                .iter()
                .map(|d| std::path::absolute(d).unwrap_or_else(|_| d.clone()))
                .map(|d| d.join(VOLUMES_DIR))
                .collect(),
        }
    }

    /// Where namespaces' files and block devices may live.
    ///
    /// # Errors
    /// Naming the entry of `storage.file_dirs` or `storage.block_devices`
    /// that is not absolute, has a `.` or `..` component, or reaches the
    /// state directory.
    pub fn backing_policy(&self) -> Result<BackingPolicy> {
        let dirs = self.file_dirs();
        let n = dirs.len();
        BackingPolicy::new(
            dirs,
            self.storage.block_devices.clone(),
            self.state.dir.as_deref(),
        )
        .map_err(|(i, why)| match i.checked_sub(n) {
            None => anyhow::anyhow!("storage.file_dirs[{i}]: {why}"),
            Some(j) => anyhow::anyhow!("storage.block_devices[{j}]: {why}"),
        })
    }

    /// Who may call what on the API ([`dpu_control::service::authz`]):
    /// `grpc.clients` by their certificates' names, and callers without a
    /// certificate as `grpc.anonymous_role` says.
    ///
    /// # Errors
    /// Names the `grpc.clients` entry at fault.
    pub fn authz_policy(&self) -> Result<Policy> {
        let g = &self.grpc;
        if g.clients.len() > MAX_CLIENTS {
            anyhow::bail!(
                "grpc.clients: {} entries, more than the {MAX_CLIENTS} allowed",
                g.clients.len()
            );
        }
        let mut clients = Vec::with_capacity(g.clients.len());
        for (i, c) in g.clients.iter().enumerate() {
            let at = format!("grpc.clients[{i}]");
            let name =
                Name::parse(&c.identity).map_err(|e| anyhow::anyhow!("{at}.identity: {e}"))?;
            let role = match c.role {
                RoleName::TenantWriter => {
                    if c.tenants.is_empty() {
                        anyhow::bail!("{at}: role \"tenant-writer\" needs tenants = [\"ID\", ...]");
                    }
                    for (k, t) in c.tenants.iter().enumerate() {
                        dpu_control::validate::id(&format!("{at}.tenants[{k}]"), t)
                            .map_err(|e| anyhow::anyhow!("{e}"))?;
                    }
                    Role::TenantWriter(c.tenants.iter().cloned().collect())
                }
                r if !c.tenants.is_empty() => anyhow::bail!(
                    "{at}: tenants applies to role \"tenant-writer\" only, not {:?}",
                    r
                ),
                RoleName::Admin => Role::Admin,
                RoleName::Reader => Role::Reader,
            };
            clients.push((name, role));
        }
        let anonymous = match g.anonymous_role {
            AnonymousRole::Admin => Some(Role::Admin),
            AnonymousRole::Reader => Some(Role::Reader),
            AnonymousRole::None => None,
        };
        Policy::new(clients, anonymous).map_err(|e| anyhow::anyhow!("grpc.clients: {e}"))
    }

    /// Creates the default file directory, `<state.dir>/volumes`, with mode
    /// 0700 when it is missing (the state directory exists by now); a
    /// configured one is the operator's to create, and is only looked for.
    ///
    /// # Errors
    /// If the default directory cannot be created.
    pub fn prepare_file_dirs(&self) -> Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        for d in self.file_dirs() {
            if self.storage.file_dirs.is_none() {
                match std::fs::DirBuilder::new().mode(0o700).create(&d) {
                    Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                        return Err(e).with_context(|| format!("creating {}", d.display()))
                    }
                    _ => {}
                }
            } else if !d.is_dir() {
                tracing::warn!(dir = %d.display(), "storage.file_dirs names a directory that does not exist; no file backend can open there");
            }
        }
        Ok(())
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

/// The NVMe/TCP target's limits that are not the transport's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TargetLimits {
    /// Handshake, PDU and idle timeouts.
    pub timeouts: Timeouts,
    /// Bytes of write data all connections may hold ([`dpu_nvmeof::Target::set_write_buffer_budget`]).
    pub write_buffer_budget: u64,
    /// Bytes of data in flight on RBD images and remote namespaces, all
    /// together ([`dpu_nvmeof::Target::set_backend_in_flight_budget`]).
    pub backend_in_flight_budget: u64,
    /// Most queues of one host NQN
    /// ([`dpu_nvmeof::Target::set_max_connections_per_host`]).
    pub max_connections_per_host: usize,
    /// Socket buffer bytes all storage endpoints share beyond their
    /// reserves ([`dpu_endpoint::BufferPool`]).
    pub endpoint_buffer_memory: usize,
    /// Authentication attempts per source address
    /// ([`dpu_nvmeof::Target::set_auth_rate`]).
    pub auth_rate: dpu_nvmeof::auth::limit::AuthRate,
}

/// Parses a size in the syntax `dpuctl` reads too
/// ([`dpu_proto::text::size`]: bytes, or K, M, G, T, KiB..TiB in any case).
///
/// # Errors
/// If the text is not such a size or overflows 64 bits.
pub fn parse_size(s: &str) -> Result<u64> {
    dpu_proto::text::size(s).map_err(anyhow::Error::msg)
}

/// Total memory of the machine, from /proc/meminfo.
fn mem_total() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
pub(crate) mod tests {
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
        // The same syntax as dpuctl's: units in any case.
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
    }

    /// A subsystem "a" with `sub` appended to its table, then `rest`.
    pub(crate) fn declared(sub: &str, rest: &str) -> String {
        format!(
            "[[storage.subsystems]]\nid = \"a\"\nnqn = \"nqn.2024-01.io.example:a\"\n{sub}\n{rest}\n"
        )
    }

    /// Ports p0, pf0vf0, pf0vf1 and a tenant "t" with `tenant` appended to
    /// its table, then `rest`.
    pub(crate) fn tenant(tenant: &str, rest: &str) -> String {
        format!(
            "[[ports]]\nid = \"p0\"\n[[ports]]\nid = \"pf0vf0\"\n[[ports]]\nid = \"pf0vf1\"\n\
             [[tenants]]\nid = \"t\"\n{tenant}\n{rest}\n"
        )
    }
}
