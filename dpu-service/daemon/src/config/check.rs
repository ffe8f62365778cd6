//! The checks of a configuration as a whole, naming the offending key.
//!
//! What is the daemon's alone (listeners, TLS, ports, the data plane, CPU
//! placement) is checked here; the declared subsystems and tenants are
//! checked by creating them through the control plane's API over a
//! scratch in-memory state ([`Config::dry_run`]), so each of the API's
//! rules lives in one place, the control plane.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use dpu_control::service::{Api, Control, ServiceFacts};
use dpu_control::store::StateHandle;
use dpu_control::telemetry::Telemetry;
use dpu_control::{validate, ControlError};
use dpu_dataplane::io::{MAX_MTU, MIN_MTU};

use super::{parse_size, seed, seed_tenants, Config};

/// The host NQN of remote namespaces declared without one, in a check.
const CHECK_HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000000";

impl Config {
    /// Checks the bounds of the API's and the metrics' listeners: each at
    /// least 1 (and a watch at most as many as calls on a connection).
    fn check_listener_bounds(&self) -> Result<()> {
        let (g, m) = (&self.grpc, &self.metrics);
        let positive: [(&str, u64); 9] = [
            ("grpc.max_connections", g.max_connections as u64),
            (
                "grpc.max_connections_per_source",
                g.max_connections_per_source as u64,
            ),
            ("grpc.handshake_timeout_secs", g.handshake_timeout_secs),
            ("grpc.keepalive_timeout_secs", g.keepalive_timeout_secs),
            (
                "grpc.max_streams_per_connection",
                u64::from(g.max_streams_per_connection),
            ),
            (
                "grpc.max_watches_per_connection",
                g.max_watches_per_connection as u64,
            ),
            ("metrics.max_connections", m.max_connections as u64),
            (
                "metrics.max_connections_per_source",
                m.max_connections_per_source as u64,
            ),
            ("metrics.request_timeout_secs", m.request_timeout_secs),
        ];
        for (name, v) in positive {
            if v == 0 {
                bail!("{name}: 0 is out of range (at least 1)");
            }
        }
        if g.max_watches_per_connection > g.max_streams_per_connection as usize {
            bail!(
                "grpc.max_watches_per_connection {} is above grpc.max_streams_per_connection {}: \
                 a watch is a call",
                g.max_watches_per_connection,
                g.max_streams_per_connection
            );
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
        if g.tls_cert.is_some()
            && g.tls_client_ca.is_none()
            && !g.listen.ip().is_loopback()
            && !g.allow_insecure_remote
        {
            bail!(
                "refusing TLS without client certificates on non-loopback address {}: anyone who \
                 reaches it would be an anonymous caller; configure grpc.tls_client_ca (mTLS) and \
                 grpc.clients, or set grpc.allow_insecure_remote / --allow-insecure-remote",
                g.listen
            );
        }
        if !g.clients.is_empty() && g.tls_client_ca.is_none() {
            bail!(
                "grpc.clients needs grpc.tls_client_ca: clients are known by their certificates \
                 (mutual TLS)"
            );
        }
        self.authz_policy()?;
        self.check_listener_bounds()?;
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
            if let Some(mtu) = p.mtu {
                if p.driver != "dpdk" {
                    bail!(
                        "ports[{i}] ({}): mtu is set on DPDK ports; a kernel port follows its \
                         interface's MTU (ip link set dev IF mtu {mtu}), a port without a driver has none",
                        p.id
                    );
                }
                if !(MIN_MTU..=MAX_MTU).contains(&mtu) {
                    bail!(
                        "ports[{i}] ({}): mtu {mtu} is outside {MIN_MTU}..={MAX_MTU}",
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
        // The switch's own bounds, reported under their keys here.
        if let Err(e) = self.switch_base(0).check_sizes() {
            let key = match e.field {
                "fragment_timeout" => "fragment_timeout_secs",
                field => field,
            };
            bail!("dataplane.{key} {}", e.rule);
        }
        self.dataplane.offload.check()?;
        if d.offload.provider == super::OffloadProvider::RteFlow {
            match dataplane_driver {
                Some((_, "dpdk")) => {}
                Some((i, other)) => bail!(
                    "dataplane.offload.provider = \"rte_flow\" needs the dpdk driver; ports[{i}] uses {other:?}"
                ),
                None => bail!(
                    "dataplane.offload.provider = \"rte_flow\" needs ports with the dpdk driver"
                ),
            }
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
        if d.file_prefix.is_empty() || d.file_prefix.contains('/') {
            bail!(
                "dataplane.file_prefix {:?} must be a non-empty name without '/'",
                d.file_prefix
            );
        }
        if let Some(r) = &self.storage.ram_limit {
            parse_size(r).with_context(|| format!("storage.ram_limit {r:?}"))?;
        }
        if let Some(n) = &self.storage.host_nqn {
            validate::remote_nqn("storage.host_nqn", n).map_err(|e| anyhow!("{e}"))?;
        }
        if let Some(b) = &self.storage.write_buffer_budget {
            let n = parse_size(b).with_context(|| format!("storage.write_buffer_budget {b:?}"))?;
            if n < 1 << 20 {
                bail!("storage.write_buffer_budget {b:?}: at least 1 MiB");
            }
        }
        if let Some(b) = &self.storage.backend_in_flight_budget {
            let n =
                parse_size(b).with_context(|| format!("storage.backend_in_flight_budget {b:?}"))?;
            if n < 1 << 20 {
                bail!("storage.backend_in_flight_budget {b:?}: at least 1 MiB");
            }
        }
        if let Some(b) = &self.storage.endpoint_buffer_memory {
            let n =
                parse_size(b).with_context(|| format!("storage.endpoint_buffer_memory {b:?}"))?;
            if n < 1 << 20 {
                bail!("storage.endpoint_buffer_memory {b:?}: at least 1 MiB");
            }
        }
        if self.storage.max_connections_per_host == Some(0) {
            bail!("storage.max_connections_per_host: 0 is out of range (at least 1)");
        }
        if let Some(r) = self
            .storage
            .auth_attempts_per_sec
            .filter(|r| !(r.is_finite() && *r > 0.0 && *r <= 1000.0))
        {
            bail!("storage.auth_attempts_per_sec: {r} is out of range (above 0, at most 1000)");
        }
        if let Some(b) = self
            .storage
            .auth_attempts_burst
            .filter(|b| !(1..=65_536).contains(b))
        {
            bail!("storage.auth_attempts_burst: {b} is out of range (1 to 65536)");
        }
        if let Some(n) = self
            .storage
            .auth_sources
            .filter(|n| !(1..=1 << 20).contains(n))
        {
            bail!("storage.auth_sources: {n} is out of range (1 to 1048576)");
        }
        for (key, v) in [
            (
                "handshake_timeout_secs",
                self.storage.handshake_timeout_secs,
            ),
            ("pdu_timeout_secs", self.storage.pdu_timeout_secs),
            ("write_timeout_secs", self.storage.write_timeout_secs),
            ("idle_timeout_secs", self.storage.idle_timeout_secs),
        ] {
            if let Some(v) = v.filter(|v| !(1..=86_400).contains(v)) {
                bail!("storage.{key}: {v} is out of range (1 to 86400 seconds)");
            }
        }
        self.limits.validate()?;
        self.validate_storage()?;
        self.backing_policy()?;
        self.validate_declared_ids()?;
        self.validate_explicit_values()?;
        self.dry_run()
    }

    /// Checks `[storage]`'s placement: the I/O CPUs against the data
    /// plane's and the CPUs this process may use. (The declared
    /// subsystems are the API's to check, in [`Config::dry_run`].)
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
            .map_err(|e| anyhow::anyhow!("storage.{e}"))
    }

    /// Checks that no subsystem and no tenant is declared twice. The API
    /// would not refuse the second: startup keeps a declared object the
    /// state has already, so the dry run would take the second
    /// declaration for the first one stored and skip it.
    fn validate_declared_ids(&self) -> Result<()> {
        let mut ids = BTreeSet::new();
        for (i, c) in self.storage.clusters.iter().enumerate() {
            if !ids.insert(c.id.as_str()) {
                bail!(
                    "storage.clusters[{i}].id: storage cluster {:?} is declared twice",
                    c.id
                );
            }
        }
        let mut ids = BTreeSet::new();
        for (i, v) in self.storage.volumes.iter().enumerate() {
            if !ids.insert(v.id.as_str()) {
                bail!(
                    "storage.volumes[{i}].id: volume {:?} is declared twice",
                    v.id
                );
            }
        }
        let mut ids = BTreeSet::new();
        for (i, s) in self.storage.subsystems.iter().enumerate() {
            if !ids.insert(s.id.as_str()) {
                bail!(
                    "storage.subsystems[{i}].id: subsystem {:?} is declared twice",
                    s.id
                );
            }
        }
        let mut ids = BTreeSet::new();
        for (i, t) in self.tenants.iter().enumerate() {
            if !ids.insert(t.id.as_str()) {
                bail!("tenants[{i}].id: tenant {:?} is declared twice", t.id);
            }
        }
        Ok(())
    }

    /// Checks the declared values the API would read as unset: a request
    /// carries an unset text as "" and an unset number as 0, so an
    /// explicit `serial_number = ""` or `nsid = 0` would reach the API as
    /// "pick the default" and the dry run could not refuse it. Where the
    /// API has the rule, its own check (of [`validate`]) words the error.
    fn validate_explicit_values(&self) -> Result<()> {
        let text =
            |key: &str, v: &Option<String>, check: &dyn Fn(&str, &str) -> Result<(), _>| match v {
                Some(v) if v.is_empty() => check(key, v).map_err(|e: ControlError| anyhow!("{e}")),
                _ => Ok(()),
            };
        for (i, c) in self.storage.clusters.iter().enumerate() {
            for (key, v) in [
                ("op_timeout_secs", c.op_timeout_secs),
                ("connect_timeout_secs", c.connect_timeout_secs),
            ] {
                if v == Some(0) {
                    bail!(
                        "storage.clusters[{i}].{key}: 0 seconds is out of range (1 to {})",
                        validate::MAX_TIMEOUT_SECS
                    );
                }
            }
        }
        for (i, v) in self.storage.volumes.iter().enumerate() {
            let at = format!("storage.volumes[{i}]");
            // An empty ID would reach the API as "assign one".
            validate::volume_id(&format!("{at}.id"), &v.id).map_err(|e| anyhow!("{e}"))?;
            if v.block_size == Some(0) {
                bail!("{at}.block_size: 0 is not 512 or 4096");
            }
            if let Some(size) = &v.size {
                if parse_size(size).is_ok_and(|b| b == 0) {
                    bail!("{at}.size: {size} is not a non-zero multiple of the block size");
                }
            }
            text(&format!("{at}.uuid"), &v.uuid, &|k, v| {
                validate::uuid(k, v).map(drop)
            })?;
        }
        for (i, s) in self.storage.subsystems.iter().enumerate() {
            let at = format!("storage.subsystems[{i}]");
            text(&format!("{at}.serial_number"), &s.serial_number, &|k, v| {
                validate::ascii_id(k, v, 20)
            })?;
            text(&format!("{at}.model_number"), &s.model_number, &|k, v| {
                validate::ascii_id(k, v, 40)
            })?;
            let max = match s.max_namespaces {
                None => validate::DEFAULT_MAX_NAMESPACES,
                Some(0) => bail!(
                    "{at}.max_namespaces: 0 is not in 1..={}",
                    validate::MAX_NAMESPACES
                ),
                Some(m) => m,
            };
            for (j, n) in s.namespaces.iter().enumerate() {
                let at = format!("{at}.namespaces[{j}]");
                if n.size.is_some() && n.file.is_none() {
                    bail!("{at}: size goes with file (a RAM namespace's size is the value of ram)");
                }
                if n.nsid == Some(0) {
                    bail!("{at}.nsid: 0 is not in 1..={max} (the subsystem's max_namespaces)");
                }
                if n.block_size == Some(0) {
                    bail!("{at}.block_size: 0 is not 512 or 4096");
                }
                if let Some(v) = &n.size {
                    if parse_size(v).is_ok_and(|b| b == 0) {
                        bail!("{at}.size: {v} is not a non-zero multiple of the block size");
                    }
                }
                text(&format!("{at}.uuid"), &n.uuid, &|k, v| {
                    validate::uuid(k, v).map(drop)
                })?;
                text(&format!("{at}.nguid"), &n.nguid, &|k, v| {
                    validate::hex16(k, v).map(drop)
                })?;
                if let Some(r) = &n.remote {
                    let at = format!("{at}.remote");
                    text(&format!("{at}.host_nqn"), &r.host_nqn, &|k, v| {
                        validate::remote_nqn(k, v)
                    })?;
                    let timeout = (1, validate::MAX_REMOTE_TIMEOUT_MS);
                    let depth = (
                        validate::MIN_REMOTE_QUEUE_DEPTH,
                        validate::MAX_REMOTE_QUEUE_DEPTH,
                    );
                    for (key, v, (min, max)) in [
                        ("io_timeout_ms", r.io_timeout_ms, timeout),
                        ("connect_timeout_ms", r.connect_timeout_ms, timeout),
                        ("queue_depth", r.queue_depth, depth),
                    ] {
                        if v == Some(0) {
                            bail!("{at}.{key}: 0 is out of range ({min} to {max})");
                        }
                    }
                }
            }
            for (j, l) in s.listeners.iter().enumerate() {
                let at = format!("{at}.listeners[{j}]");
                text(&format!("{at}.id"), &l.id, &|k, v| validate::id(k, v))?;
                if l.port == 0 {
                    bail!("{at}.port: 0 is not in 1..=65535");
                }
            }
        }
        for (i, t) in self.tenants.iter().enumerate() {
            for (j, r) in t.rules.iter().enumerate() {
                let key = format!("tenants[{i}].rules[{j}].id");
                text(&key, &r.id, &|k, v| validate::id(k, v))?;
            }
        }
        Ok(())
    }

    /// Checks the declared storage clusters (their keyring files read,
    /// not connected to), subsystems (with their namespaces and
    /// listeners) and tenants (with their rules) by creating them, as
    /// startup does ([`seed_tenants::seed_tenants`], then [`seed::seed_storage`]),
    /// through the API over a fresh in-memory state with the declared
    /// ports, RAM limit and backing policy (whose checks look at the
    /// files and devices named): every rule of the API's (IDs, NQNs, block
    /// sizes, namespace IDs, the RAM total, attachments, rule fields and
    /// priorities) is checked where it lives, in the control plane, and
    /// the error names the configuration entry.
    ///
    /// Runs on a thread of its own with its own runtime, so it can be
    /// called from inside a runtime too.
    fn dry_run(&self) -> Result<()> {
        if self.storage.subsystems.is_empty()
            && self.storage.clusters.is_empty()
            && self.storage.volumes.is_empty()
            && self.tenants.is_empty()
        {
            return Ok(());
        }
        let ctl = Control {
            state: StateHandle::open(None).context("opening an in-memory state")?,
            ports: self
                .port_specs()
                .into_iter()
                .map(|p| (p.id.clone(), p))
                .collect(),
            telemetry: Arc::new(Telemetry::default()),
            limits: self.limits(),
            backing: Arc::new(self.backing_policy()?),
            facts: ServiceFacts::default(),
            storage_applied: None,
            switch_applied: None,
            // Declared clusters and remote namespaces are connected to
            // when startup first creates them; a check connects to
            // nothing.
            store_probe: crate::rbd::offline_probe(),
            served: None,
            // Nor does it look for the machine's ID or write the state
            // directory's: any valid NQN checks a declaration.
            host_nqn: self
                .storage
                .host_nqn
                .clone()
                .unwrap_or_else(|| CHECK_HOST_NQN.into()),
        };
        let api = Api::new(Arc::new(ctl));
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .context("starting a runtime to check the declarations")?
                        .block_on(async {
                            seed_tenants::seed_tenants(&api, &self.tenants).await?;
                            seed::seed_storage(&api, &self.storage).await
                        })
                })
                .join()
                .unwrap_or_else(|_| bail!("checking the declarations panicked"))
        })
        // What the scratch state undid is no news to the reader of a check.
        .map_err(|e| anyhow!("{}", seed::without_undo_note(&format!("{e:#}"))))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{declared, tenant};
    use super::super::*;

    #[test]
    fn backing_files_and_devices_stay_out_of_the_state_directory() {
        let check = |storage: &str| {
            let c: Config = toml::from_str(&format!(
                "[state]\ndir = \"/var/lib/dpu\"\n[storage]\n{storage}"
            ))
            .unwrap();
            c.validate().map(|()| c)
        };
        let c = check("").unwrap();
        assert_eq!(
            c.file_dirs(),
            [std::path::Path::new("/var/lib/dpu/volumes")]
        );
        assert!(c.backing_policy().unwrap().block_devices().is_empty());
        check("file_dirs = [\"/var/lib/dpu/volumes/fast\", \"/srv\"]").unwrap();
        for (storage, error) in [
            (
                "file_dirs = [\"/srv\", \"/var/lib/dpu\"]",
                "storage.file_dirs[1]: /var/lib/dpu reaches the state directory",
            ),
            (
                "file_dirs = [\"/var/lib/dpu/state\"]",
                "storage.file_dirs[0]: /var/lib/dpu/state reaches the state directory",
            ),
            (
                "file_dirs = [\"/var\"]",
                "storage.file_dirs[0]: /var reaches the state directory",
            ),
            (
                "file_dirs = [\"srv\"]",
                "storage.file_dirs[0]: \"srv\" is not an absolute path",
            ),
            (
                "file_dirs = [\"/srv/../var/lib/dpu\"]",
                "storage.file_dirs[0]: /srv/../var/lib/dpu has a '.' or '..' component",
            ),
            (
                "block_devices = [\"/dev/sd?\", \"nvme0n1\"]",
                "storage.block_devices[1]: \"nvme0n1\" is not an absolute path",
            ),
        ] {
            let err = check(storage).unwrap_err().to_string();
            assert!(err.starts_with(error), "{storage}: {err}");
        }
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
        // Server-only TLS: anyone who reaches it is anonymous.
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("refusing TLS without client certificates"),
            "{err}"
        );
        c.grpc.allow_insecure_remote = true;
        c.validate().unwrap();
        c.grpc.allow_insecure_remote = false;
        c.grpc.tls_client_ca = Some("ca.pem".into());
        c.validate().unwrap();
        // On loopback server-only TLS needs no consent.
        c.grpc.tls_client_ca = None;
        c.grpc.listen = "127.0.0.1:50051".parse().unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn clients_and_their_roles() {
        let mtls = "[grpc]\nlisten = \"0.0.0.0:50051\"\ntls_cert = \"c\"\ntls_key = \"k\"\ntls_client_ca = \"ca\"\n";
        let load = |clients: &str| -> Result<Config> {
            let c: Config = toml::from_str(&format!("{mtls}{clients}"))?;
            c.validate()?;
            Ok(c)
        };
        let c = load(
            "[[grpc.clients]]\nidentity = \"cn:ops\"\nrole = \"admin\"\n\
             [[grpc.clients]]\nidentity = \"dns:mon.example.org\"\nrole = \"reader\"\n\
             [[grpc.clients]]\nidentity = \"spiffe://example.org/red\"\nrole = \"tenant-writer\"\ntenants = [\"red\", \"blue\"]\n",
        )
        .unwrap();
        let p = c.authz_policy().unwrap();
        let red = p.caller(Some(&[Name::Uri("spiffe://example.org/red".into())]));
        assert_eq!(
            red.role,
            Some(Role::TenantWriter(
                ["blue".to_string(), "red".to_string()].into()
            ))
        );
        assert_eq!(red.label, "uri:spiffe://example.org/red");
        assert_eq!(
            p.caller(Some(&[Name::Cn("ops".into())])).role,
            Some(Role::Admin)
        );
        // With mTLS there are no anonymous callers; the default role stays admin.
        assert_eq!(p.caller(None).role, Some(Role::Admin));
        for (clients, error) in [
            (
                "[[grpc.clients]]\nidentity = \"ops\"\nrole = \"admin\"\n",
                "grpc.clients[0].identity: \"ops\" is not a client identity",
            ),
            (
                "[[grpc.clients]]\nidentity = \"cn:w\"\nrole = \"tenant-writer\"\n",
                "grpc.clients[0]: role \"tenant-writer\" needs tenants",
            ),
            (
                "[[grpc.clients]]\nidentity = \"cn:w\"\nrole = \"reader\"\ntenants = [\"red\"]\n",
                "grpc.clients[0]: tenants applies to role \"tenant-writer\" only",
            ),
            (
                "[[grpc.clients]]\nidentity = \"cn:w\"\nrole = \"tenant-writer\"\ntenants = [\"Red Team\"]\n",
                "grpc.clients[0].tenants[0]",
            ),
            (
                "[[grpc.clients]]\nidentity = \"cn:a\"\nrole = \"admin\"\n\
                 [[grpc.clients]]\nidentity = \"cn:a\"\nrole = \"reader\"\n",
                "grpc.clients: client cn:a is named twice",
            ),
        ] {
            let err = load(clients).unwrap_err().to_string();
            assert!(err.starts_with(error), "{clients}: {err}");
        }
        assert!(load("[[grpc.clients]]\nidentity = \"cn:a\"\nrole = \"owner\"\n").is_err());
        // Clients are known by certificates: they need mTLS.
        let c: Config =
            toml::from_str("[[grpc.clients]]\nidentity = \"cn:ops\"\nrole = \"admin\"\n").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("grpc.clients needs grpc.tls_client_ca"),
            "{err}"
        );
        // Callers without a certificate: as grpc.anonymous_role says.
        let c: Config = toml::from_str("[grpc]\nanonymous_role = \"reader\"\n").unwrap();
        c.validate().unwrap();
        assert_eq!(
            c.authz_policy().unwrap().caller(None).role,
            Some(Role::Reader)
        );
        let c: Config = toml::from_str("[grpc]\nanonymous_role = \"none\"\n").unwrap();
        assert_eq!(c.authz_policy().unwrap().caller(None).role, None);
        assert_eq!(
            Config::default().authz_policy().unwrap().caller(None).role,
            Some(Role::Admin),
            "the loopback quick-start keeps working"
        );
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

    /// The bounds of the API's and the metrics' listeners: defaults, set
    /// values, and the values refused.
    #[test]
    fn listener_bounds_load_and_are_checked() {
        use std::time::Duration;

        use crate::listen::Limits;

        let load = |text: &str| {
            toml::from_str::<Config>(text)
                .map_err(|e| e.to_string())
                .and_then(|c| c.validate().map(|()| c).map_err(|e| e.to_string()))
        };
        let secs = Duration::from_secs;
        // Defaults.
        let c = load("").unwrap();
        let g = &c.grpc;
        assert_eq!(
            (
                g.max_connections,
                g.max_connections_per_source,
                g.handshake_timeout_secs,
                g.idle_timeout_secs,
                g.keepalive_secs,
                g.keepalive_timeout_secs,
                g.max_streams_per_connection,
                g.max_watches,
                g.max_watches_per_connection,
            ),
            (256, 64, 10, 300, 30, 10, 64, 64, 4)
        );
        let m = &c.metrics;
        assert_eq!(
            (
                m.max_connections,
                m.max_connections_per_source,
                m.request_timeout_secs
            ),
            (32, 8, 10)
        );
        assert_eq!(
            c.api_limits(),
            Limits {
                max_connections: 256,
                max_connections_per_source: 64,
                handshake_timeout: secs(10),
                idle_timeout: Some(secs(300)),
                max_watches: 64,
                max_watches_per_connection: 4,
            }
        );
        assert_eq!(
            c.metrics_limits(),
            Limits {
                max_connections: 32,
                max_connections_per_source: 8,
                handshake_timeout: secs(10),
                idle_timeout: Some(secs(10)),
                max_watches: 0,
                max_watches_per_connection: 0,
            }
        );
        // All set.
        let c = load(
            "[grpc]\nmax_connections = 100\nmax_connections_per_source = 5\n\
             handshake_timeout_secs = 3\nidle_timeout_secs = 0\nkeepalive_secs = 0\n\
             keepalive_timeout_secs = 7\nmax_streams_per_connection = 16\nmax_watches = 0\n\
             max_watches_per_connection = 16\n\
             [metrics]\nmax_connections = 4\nmax_connections_per_source = 2\n\
             request_timeout_secs = 20\n",
        )
        .unwrap();
        let g = &c.grpc;
        assert_eq!(
            (
                g.keepalive_secs,
                g.keepalive_timeout_secs,
                g.max_streams_per_connection
            ),
            (0, 7, 16)
        );
        assert_eq!(
            c.api_limits(),
            Limits {
                max_connections: 100,
                max_connections_per_source: 5,
                handshake_timeout: secs(3),
                idle_timeout: None,
                max_watches: 0,
                max_watches_per_connection: 16,
            }
        );
        assert_eq!(
            c.metrics_limits(),
            Limits {
                max_connections: 4,
                max_connections_per_source: 2,
                handshake_timeout: secs(20),
                idle_timeout: Some(secs(20)),
                max_watches: 0,
                max_watches_per_connection: 0,
            }
        );
        assert_eq!(
            load("[grpc]\nidle_timeout_secs = 60\n")
                .unwrap()
                .api_limits()
                .idle_timeout,
            Some(secs(60))
        );
        // Zeros that would shut a listener or its calls out.
        for (section, key) in [
            ("grpc", "max_connections"),
            ("grpc", "max_connections_per_source"),
            ("grpc", "handshake_timeout_secs"),
            ("grpc", "keepalive_timeout_secs"),
            ("grpc", "max_streams_per_connection"),
            ("grpc", "max_watches_per_connection"),
            ("metrics", "max_connections"),
            ("metrics", "max_connections_per_source"),
            ("metrics", "request_timeout_secs"),
        ] {
            let text = format!("[{section}]\n{key} = 0\n");
            let want = format!("{section}.{key}: 0 is out of range (at least 1)");
            let e = load(&text).unwrap_err();
            assert!(e.starts_with(&want), "{text}\nwant: {want}\ngot:  {e}");
        }
        // A watch is a call: no more of them than calls on a connection.
        let e = load("[grpc]\nmax_streams_per_connection = 8\nmax_watches_per_connection = 9\n")
            .unwrap_err();
        assert!(
            e.starts_with(
                "grpc.max_watches_per_connection 9 is above grpc.max_streams_per_connection 8"
            ),
            "{e}"
        );
        load("[grpc]\nmax_streams_per_connection = 8\nmax_watches_per_connection = 8\n").unwrap();
        // Unknown keys are still refused.
        for (text, field) in [
            ("[grpc]\nmax_connection = 10\n", "max_connection"),
            (
                "[grpc]\nmax_watches_per_source = 1\n",
                "max_watches_per_source",
            ),
            ("[metrics]\nidle_timeout_secs = 5\n", "idle_timeout_secs"),
        ] {
            let e = load(text).unwrap_err();
            assert!(
                e.contains(&format!("unknown field `{field}`")),
                "{text}: {e}"
            );
        }
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
    fn a_port_mtu_is_for_dpdk_ports_and_in_range() {
        let check = |driver: &str, device: &str, mtu: u32| {
            let text = format!(
                "[[ports]]\nid = \"p0\"\ndriver = \"{driver}\"\ndevice = \"{device}\"\nmtu = {mtu}\n"
            );
            match toml::from_str::<Config>(&text) {
                Ok(c) => c.validate().map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        };
        if cfg!(feature = "dpdk") {
            check("dpdk", "net_null0", 9000).unwrap();
            check("dpdk", "net_null0", 68).unwrap();
            for bad in [67, 9601] {
                let err = check("dpdk", "net_null0", bad).unwrap_err();
                assert!(err.contains("outside 68..=9600"), "{err}");
            }
        }
        let err = check("kernel", "veth0", 9000).unwrap_err();
        assert!(err.contains("ip link set dev IF mtu 9000"), "{err}");
        let err = check("none", "", 9000).unwrap_err();
        assert!(err.contains("mtu is set on DPDK ports"), "{err}");
        // Not a u16: refused when the file is read.
        assert!(check("dpdk", "net_null0", 70000).is_err());
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
            "[dataplane]\nfragments_max = 0\n",
            "dataplane.fragments_max",
        );
        bad(
            "[dataplane]\nfragments_max = 10\nfragments_per_tenant = 11\n",
            "dataplane.fragments_per_tenant",
        );
        bad(
            "[dataplane]\nfragment_timeout_secs = 0\n",
            "dataplane.fragment_timeout_secs",
        );
        for (text, want) in [
            ("provider = \"asic\"", "unknown variant"),
            ("table_size = 0", "dataplane.offload.table_size"),
            ("table_size = 2000000", "dataplane.offload.table_size"),
            (
                "table_size = 10\nper_tenant = 11",
                "dataplane.offload.per_tenant",
            ),
            ("per_tenant = 0", "dataplane.offload.per_tenant"),
            ("insert_rate = 0", "dataplane.offload.insert_rate"),
            ("idle_secs = 0", "dataplane.offload.idle_secs"),
            ("idle_secs = 7441", "dataplane.offload.idle_secs"),
            ("queue = 0", "dataplane.offload.queue"),
            ("queue = 100000", "dataplane.offload.queue"),
            ("stateless_after = 1001", "dataplane.offload.stateless_after"),
            (
                "provider = \"rte_flow\"\n[[ports]]\nid = \"p0\"\ndriver = \"kernel\"\ndevice = \"eth0\"",
                "needs the dpdk driver; ports[0] uses \"kernel\"",
            ),
            (
                "provider = \"rte_flow\"",
                "needs ports with the dpdk driver",
            ),
            (
                "[dataplane.offload.model]\nrefuse = [\"mpls\"]",
                "dataplane.offload.model.refuse",
            ),
        ] {
            let text = format!("[dataplane.offload]\n{text}\n");
            match toml::from_str::<Config>(&text) {
                Ok(c) => {
                    let err = c.validate().unwrap_err().to_string();
                    assert!(err.contains(want), "{text}: {err}");
                }
                Err(e) => assert!(e.to_string().contains(want), "{text}: {e}"),
            }
        }
        let model: Config = toml::from_str(
            "[dataplane.offload]\nprovider = \"model\"\ntable_size = 64\nper_tenant = 32\n[dataplane.offload.model]\nrefuse = [\"ipv6\", \"vlan_push\"]\n",
        )
        .unwrap();
        assert!(model.validate().is_ok(), "{:?}", model.validate());
        // A reserve above the cap is cut to it, not refused: a small cap
        // needs no reserve of its own.
        let small: Config = toml::from_str(
            "[dataplane]\nconntrack_max = 10\nconntrack_per_tenant = 5\nfragments_max = 10\nfragments_per_tenant = 5\n",
        )
        .unwrap();
        assert!(small.validate().is_ok(), "{:?}", small.validate());
        bad(
            "[dataplane]\nmac_table_size = 0\n",
            "dataplane.mac_table_size",
        );
        bad(
            "[dataplane]\nmac_table_size = 100\nmac_per_tenant = 101\n",
            "dataplane.mac_per_tenant",
        );
        bad(
            "[dataplane]\nmac_per_tenant = 10\nmac_per_attachment = 11\n",
            "dataplane.mac_per_attachment",
        );
        bad(
            "[dataplane]\nmac_per_attachment = 0\n",
            "dataplane.mac_per_attachment",
        );
        bad(
            "[dataplane]\nmac_per_tenant = 10\nmac_per_attachment = 10\nmac_reserved_per_tenant = 11\n",
            "dataplane.mac_reserved_per_tenant",
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

    /// Declared storage clusters and RBD namespaces go through the API's
    /// checks; their keyring files are read, no cluster is connected to,
    /// and no error quotes a key.
    #[test]
    fn storage_clusters_are_checked() {
        const KEY: &str = "AQCAmWZmQOIBABAAEBESExQVFhcYGRobHB0eHw==";
        let dir = tempfile::tempdir().unwrap();
        let keyring = dir.path().join("ceph.client.dpu.keyring");
        std::fs::write(&keyring, format!("[client.dpu]\n\tkey = {KEY}\n")).unwrap();
        let cluster = |extra: &str| {
            format!(
                "[[storage.clusters]]\nid = \"ceph1\"\nmon_host = \"10.0.0.1:6789\"\nuser = \"dpu\"\n\
                 keyring_file = \"{}\"\n{extra}\n",
                keyring.display()
            )
        };
        let ns = "[[storage.subsystems.namespaces]]";
        let rbd = format!("{ns}\nrbd = \"rbd/vol1\"\ncluster = \"ceph1\"\n");
        let config = |text: &str| -> Config {
            toml::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
        };
        let good = format!("{}{}", cluster(""), declared("", &rbd));
        if cfg!(feature = "rbd") {
            config(&good).validate().unwrap();
        } else {
            let e = format!("{:#}", config(&good).validate().unwrap_err());
            assert!(
                e.starts_with("storage.clusters[0] (\"ceph1\"): clusters/ceph1: this build has no RBD support"),
                "{e}"
            );
        }
        let missing = dir.path().join("missing.keyring");
        for (text, want) in [
            (
                format!("{}{}", cluster(""), cluster("")),
                "storage.clusters[1].id: storage cluster \"ceph1\" is declared twice".to_string(),
            ),
            (
                cluster("op_timeout_secs = 0"),
                "storage.clusters[0].op_timeout_secs: 0 seconds is out of range (1 to 300)".into(),
            ),
            (
                cluster("connect_timeout_secs = 301"),
                "storage.clusters[0] (\"ceph1\"): cluster.connect_timeout_secs: 301 seconds".into(),
            ),
            (
                cluster("").replace("10.0.0.1:6789", ""),
                "storage.clusters[0] (\"ceph1\"): cluster.mon_host: empty".into(),
            ),
            (
                cluster("").replace("\"dpu\"", "\"rbd\""),
                format!(
                    "storage.clusters[0] (\"ceph1\"): keyring_file {}: no [client.rbd] section",
                    keyring.display()
                ),
            ),
            (
                cluster("").replace(&keyring.display().to_string(), &missing.display().to_string()),
                format!(
                    "storage.clusters[0] (\"ceph1\"): keyring_file {}: No such file",
                    missing.display()
                ),
            ),
            (
                declared("", &rbd),
                "storage.subsystems[0].namespaces[0]: clusters/ceph1 not found".into(),
            ),
            (
                format!("{}{}", cluster(""), declared("", &format!("{ns}\nrbd = \"vol1\"\ncluster = \"ceph1\"\n"))),
                "storage.subsystems[0].namespaces[0]: rbd: \"vol1\" is not POOL/IMAGE".into(),
            ),
            (
                declared("", &format!("{ns}\nrbd = \"rbd/vol1\"\n")),
                "storage.subsystems[0].namespaces[0]: rbd needs cluster".into(),
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\ncluster = \"ceph1\"\n")),
                "storage.subsystems[0].namespaces[0]: cluster goes with rbd".into(),
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nrbd = \"rbd/vol1\"\ncluster = \"ceph1\"\n")),
                "storage.subsystems[0].namespaces[0]: give exactly one of ram, file, block_device, rbd".into(),
            ),
            (
                format!("{}{}", cluster(""), declared("", &format!("{ns}\nrbd = \"rbd/a@b\"\ncluster = \"ceph1\"\n"))),
                "storage.subsystems[0].namespaces[0]: namespace.rbd.image".into(),
            ),
        ] {
            let e = format!("{:#}", config(&text).validate().unwrap_err());
            assert!(!e.contains(&KEY[..20]), "a key in {e}");
            // Past a valid cluster, a build without RBD refuses it first.
            if !cfg!(feature = "rbd") && e.contains("no RBD support") {
                continue;
            }
            assert!(e.starts_with(&want), "{text}\nwant: {want}\ngot:  {e}");
        }
        // A key is never written in the configuration.
        let inline = cluster(&format!("key = \"{KEY}\""));
        let e = toml::from_str::<Config>(&inline).unwrap_err().to_string();
        assert!(e.contains("unknown field `key`"), "{e}");
    }

    /// Declared remote namespaces go through the API's checks, their
    /// secret files read, no remote connected to; unknown keys are
    /// refused, and no error quotes a secret.
    #[test]
    fn remote_namespaces_are_checked() {
        const SECRET: &str = "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:";
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("far.key");
        std::fs::write(&key, format!("{SECRET}\n")).unwrap();
        let bad_key = dir.path().join("bad.key");
        std::fs::write(&bad_key, SECRET.replace("HMnzFi", "AAAAAA")).unwrap();
        let ns = "[[storage.subsystems.namespaces]]";
        let remote = |fields: &str| {
            declared(
                "",
                &format!(
                    "{ns}\nremote = {{ paths = [\"127.0.0.1:4420\"], nqn = \"nqn.2024-01.io.example:far\", \
                     nsid = 1{fields} }}\n"
                ),
            )
        };
        let config = |text: &str| -> Result<Config, String> {
            toml::from_str(text).map_err(|e| e.to_string())
        };
        let good = remote(&format!(
            ", dhchap_secret_file = \"{}\", io_timeout_ms = 1000",
            key.display()
        ));
        config(&good).unwrap().validate().unwrap();
        config(&format!(
            "[storage]\nhost_nqn = \"nqn.2024-01.io.example:dpu\"\n{good}"
        ))
        .unwrap()
        .validate()
        .unwrap();
        let at = "storage.subsystems[0].namespaces[0]";
        for (text, want) in [
            (
                format!("[storage]\nhost_nqn = \"my host\"\n{good}"),
                "storage.host_nqn: \"my host\" is not an NQN".to_string(),
            ),
            (
                remote(", host_nqn = \"\""),
                format!("{at}.remote.host_nqn: \"\" is not an NQN"),
            ),
            (
                remote(", io_timeout_ms = 0"),
                format!("{at}.remote.io_timeout_ms: 0 is out of range (1 to 300000)"),
            ),
            (
                remote(", queue_depth = 0"),
                format!("{at}.remote.queue_depth: 0 is out of range (2 to 1024)"),
            ),
            (
                remote(", queue_depth = 2048"),
                format!("{at}: namespace.remote.queue_depth: 2048 is out of range"),
            ),
            (
                remote(", connect_timeout_ms = 300001"),
                format!("{at}: namespace.remote.connect_timeout_ms"),
            ),
            (
                remote("").replace("127.0.0.1:4420", "127.0.0.1"),
                format!("{at}: namespace.remote.paths[0]: \"127.0.0.1\" is not ADDR:PORT"),
            ),
            (
                remote("").replace("nsid = 1", "nsid = 0"),
                format!("{at}: namespace.remote.nsid: 0 is not a namespace ID"),
            ),
            (
                remote(&format!(", dhchap_secret_file = \"{}\"", bad_key.display())),
                format!("{at}: namespace.remote.dhchap_secret"),
            ),
            (
                remote(&format!(
                    ", dhchap_secret_file = \"{}\"",
                    dir.path().join("missing").display()
                )),
                format!(
                    "{at}: remote: dhchap_secret_file: {}: No such file",
                    dir.path().join("missing").display()
                ),
            ),
            (
                declared(
                    "",
                    &format!(
                        "{ns}\nram = \"1M\"\nremote = {{ paths = [\"127.0.0.1:4420\"], \
                         nqn = \"nqn.2024-01.io.example:far\", nsid = 1 }}\n"
                    ),
                ),
                format!("{at}: give exactly one of ram, file, block_device, rbd, remote"),
            ),
        ] {
            let e = format!("{:#}", config(&text).unwrap().validate().unwrap_err());
            assert!(!e.contains(&SECRET[10..40]), "a secret in {e}");
            assert!(e.starts_with(&want), "{text}\nwant: {want}\ngot:  {e}");
        }
        // Unknown keys are refused; a secret is never written in the
        // configuration.
        for (extra, field) in [
            (", dhchap_secret = \"x\"", "dhchap_secret"),
            (", subnqn = \"x\"", "subnqn"),
        ] {
            let e = config(&remote(extra)).unwrap_err();
            assert!(e.contains(&format!("unknown field `{field}`")), "{e}");
        }
    }

    /// Hosts' TLS keys are read from their files and checked, errors
    /// naming the configuration entry and the file, never the key; a
    /// listener's secure channel is one of three words, offered on no
    /// storage endpoint yet, and the same on one address and port.
    #[test]
    fn tls_declarations_are_checked() {
        const PSK: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
        const H: &str = "nqn.2024-01.io.example:h";
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("h.psk");
        std::fs::write(&key, format!("{PSK}\n")).unwrap();
        let bad_key = dir.path().join("bad.psk");
        std::fs::write(&bad_key, PSK.replace("9LrZ", "9LrY")).unwrap();
        let missing = dir.path().join("missing");
        let host_tls = |file: &std::path::Path| {
            format!(
                "host_tls = {{ \"{H}\" = {{ psk_file = \"{}\" }} }}",
                file.display()
            )
        };
        let ls = "[[storage.subsystems.listeners]]";
        let good = declared(
            &format!(
                "allowed_hosts = [\"{H}\"]\ntls_requirement = \"required\"\n{}",
                host_tls(&key)
            ),
            &format!("{ls}\naddress = \"127.0.0.1\"\nport = 4420\nsecure_channel = \"required\"\n"),
        );
        let c: Config = toml::from_str(&good).unwrap();
        c.validate().unwrap();
        let at = format!("storage.subsystems[0].host_tls.\"{H}\"");
        for (text, want) in [
            (
                declared(&format!("allowed_hosts = [\"{H}\"]\n{}", host_tls(&bad_key)), ""),
                format!("{at}: psk_file: {}: the PSK's CRC-32 does not match", bad_key.display()),
            ),
            (
                declared(&format!("allowed_hosts = [\"{H}\"]\n{}", host_tls(&missing)), ""),
                format!("{at}: psk_file: {}: No such file", missing.display()),
            ),
            (
                declared(&host_tls(&key), ""),
                format!("{at}: host {H} is not allowed on subsystems/a"),
            ),
            (
                // Two subsystems' listeners on one address and port.
                declared(
                    "",
                    &format!(
                        "{ls}\naddress = \"127.0.0.1\"\nport = 4420\nsecure_channel = \"allowed\"\n\
                         [[storage.subsystems]]\nid = \"b\"\nnqn = \"nqn.2024-01.io.example:b\"\n\
                         {ls}\naddress = \"127.0.0.1\"\nport = 4420\n"
                    ),
                ),
                "storage.subsystems[1].listeners[0]: subsystems/b/listeners/tcp-127-0-0-1-4420: \
                 subsystems/a/listeners/tcp-127-0-0-1-4420 listens on 127.0.0.1:4420 with secure channel allowed"
                    .to_string(),
            ),
        ] {
            let c: Config = toml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let e = format!("{:#}", c.validate().unwrap_err());
            assert!(!e.contains(&PSK[16..40]), "a key in {e}");
            assert!(e.starts_with(&want), "{text}\nwant: {want}\ngot:  {e}");
        }
        for (text, field) in [
            (
                declared("tls_requirement = \"always\"", ""),
                "unknown variant `always`",
            ),
            (
                declared(
                    "",
                    &format!(
                        "{ls}\naddress = \"127.0.0.1\"\nport = 4420\nsecure_channel = \"tls\"\n"
                    ),
                ),
                "unknown variant `tls`",
            ),
            // A key is never written in the configuration.
            (
                declared(&format!("host_tls = {{ \"{H}\" = {{ psk = \"x\" }} }}"), ""),
                "unknown field `psk`",
            ),
            (
                declared(
                    &format!(
                        "allowed_hosts = [\"{H}\"]\nhost_tls = {{ \"{H}\" = {{ psk_file = \"{}\", \
                         v0_derivation = \"legacy\" }} }}",
                        key.display()
                    ),
                    "",
                ),
                "unknown variant `legacy`, expected `spec` or `compat`",
            ),
        ] {
            let e = toml::from_str::<Config>(&text).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
            if field.contains("legacy") {
                assert!(e.contains("v0_derivation"), "names the key: {e}");
            }
        }
        // The derivation reaches the request; left out, it is spec.
        let with = |d: &str| {
            let text = declared(
                &format!(
                    "allowed_hosts = [\"{H}\"]\nhost_tls = {{ \"{H}\" = {{ psk_file = \"{}\"{d} }} }}",
                    key.display()
                ),
                "",
            );
            let c: Config = toml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            c.validate().unwrap();
            let s = &c.storage.subsystems[0];
            s.host_tls[H].to_proto(H).unwrap().v0_derivation
        };
        assert_eq!(with(""), dpu_proto::v1::TlsDerivation::Spec as i32);
        assert_eq!(
            with(", v0_derivation = \"compat\""),
            dpu_proto::v1::TlsDerivation::Compat as i32
        );
        assert_eq!(
            with(", v0_derivation = \"spec\""),
            dpu_proto::v1::TlsDerivation::Spec as i32
        );
    }

    #[test]
    fn storage_declarations_are_checked() {
        let ns = "[[storage.subsystems.namespaces]]";
        let ls = "[[storage.subsystems.listeners]]";
        let b = "[[storage.subsystems]]";
        for (text, want) in [
            (
                format!("{b}\nid = \"A\"\nnqn = \"nqn.2024-01.io.example:a\"\n"),
                "storage.subsystems[0] (\"A\"): name: \"A\" is not a valid ID",
            ),
            (
                declared("", &format!("{b}\nid = \"a\"\nnqn = \"nqn.2024-01.io.example:b\"\n")),
                "storage.subsystems[1].id: subsystem \"a\" is declared twice",
            ),
            (
                format!("{b}\nid = \"a\"\nnqn = \"vol-a\"\n"),
                "storage.subsystems[0] (\"a\"): subsystem.nqn: \"vol-a\" is not a valid NQN",
            ),
            (
                format!("{b}\nid = \"a\"\nnqn = \"nqn.2014-08.org.nvmexpress.discovery\"\n"),
                "storage.subsystems[0] (\"a\"): subsystem.nqn: the discovery NQN is reserved for the discovery controller",
            ),
            (
                declared("", &format!("{b}\nid = \"b\"\nnqn = \"nqn.2024-01.io.example:a\"\n")),
                "storage.subsystems[1] (\"b\"): NQN nqn.2024-01.io.example:a is already used by subsystems/a",
            ),
            (
                declared("serial_number = \"\"", ""),
                "storage.subsystems[0].serial_number: \"\" must be 1 to 20",
            ),
            (
                declared(&format!("model_number = \"{}\"", "m".repeat(41)), ""),
                "storage.subsystems[0] (\"a\"): subsystem.model_number: \"mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm\" must be 1 to 40 printable ASCII characters",
            ),
            (
                declared("allowed_hosts = [\"host-1\"]", ""),
                "storage.subsystems[0] (\"a\"): subsystem.allowed_hosts[0]: \"host-1\" is not a valid NQN",
            ),
            (
                declared("allowed_hosts = [\"nqn.2024-01.io.example:h\", \"nqn.2024-01.io.example:h\"]", ""),
                "storage.subsystems[0] (\"a\"): subsystem.allowed_hosts[1]: nqn.2024-01.io.example:h is listed twice",
            ),
            (
                declared("max_namespaces = 0", ""),
                "storage.subsystems[0].max_namespaces: 0 is not in 1..=1024",
            ),
            (
                declared("max_namespaces = 1", &format!("{ns}\nram = \"1M\"\n{ns}\nram = \"1M\"\n")),
                "storage.subsystems[0].namespaces[1]: subsystems/a has no free namespace ID (max_namespaces 1)",
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
                "storage.subsystems[0].namespaces[0]: ram: \"lots\" is not a size",
            ),
            (
                declared("", &format!("{ns}\nfile = \"/x\"\nsize = \"1.5G\"\n")),
                "storage.subsystems[0].namespaces[0]: size: unknown size unit \".5G\" in \"1.5G\" (use K, M, G, T or KiB, MiB, GiB, TiB)",
            ),
            (
                declared("", &format!("{ns}\nram = \"0\"\n")),
                "storage.subsystems[0].namespaces[0]: namespace.ram.size_bytes: 0 is not a non-zero multiple of the block size 512",
            ),
            (
                declared("", &format!("{ns}\nram = \"6K\"\nblock_size = 4096\n")),
                "storage.subsystems[0].namespaces[0]: namespace.ram.size_bytes: 6144 is not a non-zero multiple of the block size 4096",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nblock_size = 1024\n")),
                "storage.subsystems[0].namespaces[0]: namespace.block_size: 1024 is not 512 or 4096",
            ),
            (
                declared("", &format!("{ns}\nfile = \"disk.img\"\n")),
                "storage.subsystems[0].namespaces[0]: namespace.file.path: \"disk.img\" is not an absolute path",
            ),
            (
                declared("", &format!("{ns}\nblock_device = \"nvme0n1\"\n")),
                "storage.subsystems[0].namespaces[0]: namespace.block_device.path: \"nvme0n1\" is not an absolute path",
            ),
            (
                declared("max_namespaces = 4", &format!("{ns}\nnsid = 5\nram = \"1M\"\n")),
                "storage.subsystems[0].namespaces[0]: namespace.nsid: 5 exceeds max_namespaces 4 of subsystems/a",
            ),
            (
                declared("", &format!("{ns}\nnsid = 0\nram = \"1M\"\n")),
                "storage.subsystems[0].namespaces[0].nsid: 0 is not in 1..=32",
            ),
            (
                declared("", &format!("{ns}\nnsid = 2\nram = \"1M\"\n{ns}\nnsid = 2\nram = \"1M\"\n")),
                "storage.subsystems[0].namespaces[1]: subsystems/a/namespaces/2 already exists",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\n{ns}\nnsid = 1\nram = \"1M\"\n")),
                "storage.subsystems[0].namespaces[1]: subsystems/a/namespaces/1 already exists",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nuuid = \"not-a-uuid\"\n")),
                "storage.subsystems[0].namespaces[0]: namespace.uuid: \"not-a-uuid\" is not a UUID",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nnguid = \"00ff\"\n")),
                "storage.subsystems[0].namespaces[0]: namespace.nguid: \"00ff\" is not 32 hex digits",
            ),
            (
                format!(
                    "[storage]\nram_limit = \"1M\"\n{}",
                    declared("", &format!("{ns}\nram = \"1M\"\n{ns}\nram = \"4K\"\n"))
                ),
                "storage.subsystems[0].namespaces[1]: RAM namespaces and volumes would use 1052672 bytes; the service allows 1048576 (storage.ram_limit)",
            ),
            (
                declared("", &format!("{ls}\nid = \"Data\"\naddress = \"127.0.0.1\"\nport = 4420\n")),
                "storage.subsystems[0].listeners[0]: listener_id: \"Data\" is not a valid ID",
            ),
            (
                declared("", &format!("{ls}\nid = \"d\"\naddress = \"127.0.0.1\"\nport = 4420\n{ls}\nid = \"d\"\naddress = \"127.0.0.1\"\nport = 4421\n")),
                "storage.subsystems[0].listeners[1]: subsystems/a/listeners/d already exists",
            ),
            (
                declared("", &format!("{ls}\naddress = \"127.0.0.1\"\nport = 0\n")),
                "storage.subsystems[0].listeners[0].port: 0 is not in 1..=65535",
            ),
            (
                declared("", &format!("{ls}\naddress = \"127.0.0.1\"\nport = 4420\n{ls}\nid = \"x\"\naddress = \"127.0.0.1\"\nport = 4420\n")),
                "storage.subsystems[0].listeners[1]: subsystems/a/listeners/tcp-127-0-0-1-4420 already listens on 127.0.0.1:4420",
            ),
            (
                declared("", &format!("{ls}\ntenant = \"green\"\naddress = \"10.0.0.9\"\nport = 4420\n")),
                "storage.subsystems[0].listeners[0]: tenants/green not found",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nqos = {{ iops = 2000000000 }}\n")),
                "storage.subsystems[0].namespaces[0]: namespace.qos.iops: 2000000000 is more than 1000000000 commands per second",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nqos = {{ read_bandwidth = \"lots\" }}\n")),
                "storage.subsystems[0].namespaces[0]: qos.read_bandwidth: \"lots\" is not a size",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nqos = {{ write_bandwidth = -1 }}\n")),
                "storage.subsystems[0].namespaces[0]: qos.write_bandwidth: -1 is not a number of bytes",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nqos = {{ bandwidth = \"2T\" }}\n")),
                "storage.subsystems[0].namespaces[0]: namespace.qos.bandwidth: 2199023255552 is more than 1000000000000 bytes per second",
            ),
            (
                declared("host_qos = { \"nqn.2024-01.io.example:h\" = { iops = 10 } }", ""),
                "storage.subsystems[0].host_qos.\"nqn.2024-01.io.example:h\": host nqn.2024-01.io.example:h is not allowed on subsystems/a",
            ),
            (
                declared("allow_any_host = true\nhost_qos = { \"h1\" = { iops = 10 } }", ""),
                "storage.subsystems[0].host_qos.\"h1\": host_nqn: \"h1\" is not a valid NQN",
            ),
            (
                declared(
                    "allow_any_host = true\nhost_qos = { \"nqn.2024-01.io.example:h\" = { read_bandwidth = \"1.5G\" } }",
                    "",
                ),
                "storage.subsystems[0].host_qos.\"nqn.2024-01.io.example:h\": qos.read_bandwidth: unknown size unit",
            ),
            // Values a request would carry as "unset": refused before the
            // dry run, which could not tell them from defaults.
            (
                declared("", &format!("{ns}\nram = \"1M\"\nuuid = \"\"\n")),
                "storage.subsystems[0].namespaces[0].uuid: \"\" is not a UUID",
            ),
            (
                declared("", &format!("{ns}\nram = \"1M\"\nblock_size = 0\n")),
                "storage.subsystems[0].namespaces[0].block_size: 0 is not 512 or 4096",
            ),
            (
                declared("", &format!("{ns}\nfile = \"/x\"\nsize = \"0\"\n")),
                "storage.subsystems[0].namespaces[0].size: 0 is not a non-zero multiple",
            ),
            (
                declared("", &format!("{ls}\nid = \"\"\naddress = \"127.0.0.1\"\nport = 4420\n")),
                "storage.subsystems[0].listeners[0].id: \"\" is not a valid ID",
            ),
            (
                declared("max_namespaces = 5000", ""),
                "storage.subsystems[0] (\"a\"): subsystem.max_namespaces:",
            ),
        ] {
            let c: Config = toml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let e = format!("{:#}", c.validate().unwrap_err());
            assert!(e.starts_with(want), "{text}\nwant: {want}\ngot:  {e}");
            assert!(!e.contains("partly created"), "a check undoes nothing: {e}");
        }
    }

    /// Declared volumes go through the API's checks, and namespaces made
    /// on them through the state's; what a request would read as unset
    /// is refused by key.
    #[test]
    fn declared_volumes_are_checked() {
        let vol = "[[storage.volumes]]";
        let ns = "[[storage.subsystems.namespaces]]";
        let ok = format!(
            "{vol}\nid = \"Malloc0\"\nram = \"1M\"\n{vol}\nid = \"n0\"\nnull = \"1G\"\nblock_size = 4096\n{}",
            declared("", &format!("{ns}\nvolume = \"Malloc0\"\n{ns}\nvolume = \"volumes/n0\"\n{ns}\nnull = \"16M\"\n"))
        );
        let c: Config = toml::from_str(&ok).unwrap();
        c.validate().unwrap_or_else(|e| panic!("{ok}\n{e:#}"));
        let v = &c.storage.volumes[1];
        assert_eq!(
            v.to_proto().unwrap().backend,
            Some(dpu_proto::v1::volume::Backend::Null(
                dpu_proto::v1::NullBackend {
                    size_bytes: 1 << 30
                }
            ))
        );
        for (text, want) in [
            (
                format!("{vol}\nid = \"v\"\nram = \"1M\"\n{vol}\nid = \"v\"\nnull = \"1M\"\n"),
                "storage.volumes[1].id: volume \"v\" is declared twice",
            ),
            (
                format!("{vol}\nid = \"\"\nram = \"1M\"\n"),
                "storage.volumes[0].id: \"\" is not a valid volume ID",
            ),
            (
                format!("{vol}\nid = \"v\"\nram = \"1M\"\nblock_size = 0\n"),
                "storage.volumes[0].block_size: 0 is not 512 or 4096",
            ),
            (
                format!("{vol}\nid = \"v\"\nram = \"1M\"\nnull = \"1M\"\n"),
                "storage.volumes[0] (\"v\"): give exactly one of ram, file, block_device, null",
            ),
            (
                format!("{vol}\nid = \"v\"\nram = \"1M\"\nsize = \"1M\"\n"),
                "storage.volumes[0] (\"v\"): size goes with file",
            ),
            (
                format!("{vol}\nid = \"v\"\nram = \"1000\"\n"),
                "storage.volumes[0] (\"v\"): volume.ram.size_bytes: 1000 is not a non-zero multiple",
            ),
            (
                format!("{vol}\nid = \"v\"\nfile = \"/etc/v.img\"\nsize = \"1M\"\n"),
                "storage.volumes[0] (\"v\"): volume.file.path: /etc/v.img is not beneath",
            ),
            (
                declared("", &format!("{ns}\nvolume = \"nope\"\n")),
                "storage.subsystems[0].namespaces[0]: namespace.volume: volumes/nope does not exist",
            ),
            (
                format!(
                    "{vol}\nid = \"v\"\nram = \"1M\"\n{}",
                    declared("", &format!("{ns}\nvolume = \"v\"\n{ns}\nvolume = \"v\"\n"))
                ),
                "storage.subsystems[0].namespaces[1]: namespace.volume: subsystems/a/namespaces/1 is made on volumes/v already",
            ),
            (
                declared("", &format!("{ns}\nvolume = \"v\"\nram = \"1M\"\n")),
                "storage.subsystems[0].namespaces[0]: give exactly one of ram, file, block_device, rbd, remote, null, volume",
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
        let c = load(
            "[storage]\npoll_groups = 3\nmax_connections = 100\nmax_connections_per_address = 10\n",
        )
        .unwrap();
        let t = c.transport();
        assert_eq!(
            (
                t.poll_groups,
                t.max_connections,
                t.max_connections_per_address
            ),
            (3, 100, 10)
        );
        let c = load(
            "[storage]\nhandshake_timeout_secs = 3\npdu_timeout_secs = 4\nwrite_timeout_secs = 5\n\
             idle_timeout_secs = 600\nwrite_buffer_budget = \"64MiB\"\n\
             backend_in_flight_budget = \"128MiB\"\n",
        )
        .unwrap();
        let secs = std::time::Duration::from_secs;
        assert_eq!(c.transport().write_timeout, secs(5));
        let l = c.target_limits();
        assert_eq!(
            (l.timeouts.handshake, l.timeouts.pdu, l.timeouts.idle),
            (secs(3), secs(4), secs(600))
        );
        assert_eq!(l.write_buffer_budget, 64 << 20);
        assert_eq!(l.backend_in_flight_budget, 128 << 20);
        let c = load(
            "[storage]\nauth_threads = 2\nauth_queue = 8\nauth_attempts_per_sec = 0.5\n\
             auth_attempts_burst = 4\nauth_sources = 100\n",
        )
        .unwrap();
        assert_eq!(
            (c.transport().auth_threads, c.transport().auth_queue),
            (2, 8)
        );
        assert_eq!(
            c.target_limits().auth_rate,
            dpu_nvmeof::auth::limit::AuthRate {
                per_sec: 0.5,
                burst: 4,
                sources: 100
            }
        );
        assert_eq!(
            load("").unwrap().target_limits().auth_rate,
            dpu_nvmeof::auth::limit::AuthRate::default()
        );
        assert_eq!(
            load("[storage]\nendpoint_buffer_memory = \"2GiB\"\n")
                .unwrap()
                .endpoint_buffer_memory(),
            2 << 30
        );
        assert_eq!(
            load("").unwrap().endpoint_buffer_memory(),
            dpu_endpoint::BufferPool::DEFAULT_SIZE
        );
        assert_eq!(
            load("").unwrap().storage.endpoint_placement,
            EndpointPlacement::Thread
        );
        assert_eq!(
            load("[storage]\nendpoint_placement = \"worker\"\n")
                .unwrap()
                .storage
                .endpoint_placement,
            EndpointPlacement::Worker
        );
        let e = format!(
            "{:#}",
            load("[storage]\nendpoint_placement = \"cores\"\n").unwrap_err()
        );
        assert!(
            e.contains("endpoint_placement") && e.contains("`thread` or `worker`"),
            "{e}"
        );
        assert_eq!(
            load("[storage]\nmax_connections_per_host = 7\n")
                .unwrap()
                .target_limits()
                .max_connections_per_host,
            7
        );
        assert_eq!(
            load("").unwrap().target_limits().timeouts,
            dpu_nvmeof::conn::Timeouts::default()
        );
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
            (
                "[storage]\nmax_connections = 0\n".to_string(),
                "storage.max_connections: 0 is out of range (at least 1)",
            ),
            (
                "[storage]\npoll_groups = 1000\n".to_string(),
                "storage.poll_groups: 1000 is out of range (0 to 256)",
            ),
            (
                "[storage]\nauth_threads = 0\n".to_string(),
                "storage.auth_threads: 0 is out of range (1 to 64)",
            ),
            (
                "[storage]\nauth_queue = 100000\n".to_string(),
                "storage.auth_queue: 100000 is out of range (1 to 65536)",
            ),
            (
                "[storage]\nauth_attempts_per_sec = 0.0\n".to_string(),
                "storage.auth_attempts_per_sec: 0 is out of range (above 0, at most 1000)",
            ),
            (
                "[storage]\nauth_attempts_burst = 0\n".to_string(),
                "storage.auth_attempts_burst: 0 is out of range (1 to 65536)",
            ),
            (
                "[storage]\nauth_sources = 0\n".to_string(),
                "storage.auth_sources: 0 is out of range (1 to 1048576)",
            ),
            (
                "[storage]\nidle_timeout_secs = 0\n".to_string(),
                "storage.idle_timeout_secs: 0 is out of range (1 to 86400 seconds)",
            ),
            (
                "[storage]\nwrite_buffer_budget = \"4KiB\"\n".to_string(),
                "storage.write_buffer_budget \"4KiB\": at least 1 MiB",
            ),
            (
                "[storage]\nbackend_in_flight_budget = \"1KiB\"\n".to_string(),
                "storage.backend_in_flight_budget \"1KiB\": at least 1 MiB",
            ),
            (
                "[storage]\nendpoint_buffer_memory = \"64KiB\"\n".to_string(),
                "storage.endpoint_buffer_memory \"64KiB\": at least 1 MiB",
            ),
            ("[storage]\nio_cpus = [-1]\n".to_string(), "io_cpus"),
            ("[storage]\nio_cpus = \"2-3\"\n".to_string(), "io_cpus"),
        ] {
            let e = load(&text).unwrap_err();
            assert!(e.contains(want), "{text}\nwant: {want}\ngot:  {e}");
        }
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
                "tenants[0] (\"Blue\"): name: \"Blue\" is not a valid ID",
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
                "tenants[0] (\"t\"): ports/pf0vf9 not found",
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
                "tenants[1] (\"u\"): ports/pf0vf0 overlaps ports/pf0vf0, which belongs to tenants/t",
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
                "tenants[0].rules[0]: rule_id: \"Web\" is not a valid ID",
            ),
            (
                tenant("", &format!("{r}\nid = \"a\"\npriority = 1\naction = \"allow\"\n{r}\nid = \"a\"\npriority = 2\naction = \"allow\"\n")),
                "tenants[0].rules[1]: tenants/t/rules/a already exists",
            ),
            (
                tenant("", &format!("{r}\npriority = 1\naction = \"allow\"\n{r}\npriority = 1\naction = \"deny\"\n")),
                "tenants[0].rules[1]: priority 1 is taken by tenants/t/rules/rule-1",
            ),
            (
                tenant("", &format!("{r}\nid = \"\"\npriority = 1\naction = \"allow\"\n")),
                "tenants[0].rules[0].id: \"\" is not a valid ID",
            ),
        ] {
            let c: Config = toml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let e = format!("{:#}", c.validate().unwrap_err());
            assert!(e.starts_with(want), "{text}\nwant: {want}\ngot:  {e}");
            assert!(!e.contains("partly created"), "a check undoes nothing: {e}");
        }
    }

    /// The shipped configurations run their ports on DPDK.
    #[test]
    #[cfg(feature = "dpdk")]
    fn shipped_configs_are_valid() {
        use std::path::Path;

        use clap::Parser;
        use dpu_control::model::PortRole;

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
                ("storage", SeedAction::Allow, true),
            ]
        );
        let dev = dev_config.storage;
        assert_eq!(
            dev.discovery_listen,
            Some("127.0.0.1:8009".parse().unwrap())
        );
        let [s, demo] = &dev.subsystems[..] else {
            panic!("dev.toml declares two subsystems")
        };
        // The demo tenant's storage endpoint.
        assert_eq!(demo.id, "demo-vol");
        let l = &demo.listeners[0];
        assert_eq!(
            (l.tenant.as_deref(), l.address.to_string(), l.port),
            (Some("demo"), "10.20.0.100".to_string(), 4420)
        );
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
        assert!(
            !prod.grpc.clients.is_empty(),
            "production names its clients"
        );
        assert!(prod.grpc.health_listen.is_some());
        let ids: Vec<&str> = prod.ports.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["p0", "pf0hpf", "pf0vf0", "pf0vf1", "p1", "pf1hpf"]);
        assert!(prod.ports.iter().all(|p| p.driver == "dpdk"));
    }
}
