//! The data plane inside the daemon: the ports the configuration declares
//! (DPDK ports under EAL, or Linux interfaces through the kernel driver),
//! worker threads running the per-tenant switch, the feed from the control
//! plane's state into the switch, and the port counters for gRPC telemetry
//! and `/metrics`.
//!
//! The feed follows the store ([`Feed::follow`]) and reports each
//! generation once every worker has taken it, or the switch's refusal of
//! it, so that a tenant, rule or attachment call returns only once every
//! worker switches by its change ([`dpu_control::apply`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use dpu_control::apply::{self, Applied};
use dpu_control::model::{Action, Attachment, IpPrefix, Rule, SourceGuard, State, Timestamp};
use dpu_control::store::StateHandle;
use dpu_control::telemetry::{CounterSource, Counters, PortStatus};
use dpu_dataplane::classify::AclRule;
use dpu_dataplane::io::kernel::KernelDriver;
use dpu_dataplane::io::{Driver, Packet};
use dpu_dataplane::switch::{
    Attach, ConfigError, Endpoint, Guard, RateLimit, SwitchConfig, SwitchHandle, SwitchPipeline,
    SwitchRule, TenantConfig, Vtep,
};
use dpu_dataplane::worker::{
    self, CounterReader, Egress, Idle, Pipeline, Verdict, WorkerConfig, Workers,
};
use dpu_proto::v1 as pb;

use crate::config::{Config, IdleMode, PortConfig};
use crate::endpoint_stacks::{InlineEndpoints, InlineSlot};
use crate::offload::Offload;

/// Ethernet header bytes in front of an endpoint's IP packets.
const ETHERNET_HEADER: usize = 14;

/// The running data plane.
pub struct Dataplane {
    workers: Workers,
    switch: SwitchHandle,
    counters: Arc<dyn CounterSource>,
    driver: &'static str,
    /// Port IDs by driver index.
    ids: Arc<Vec<String>>,
    base: SwitchConfig,
    /// What idle workers do.
    idle: Idle,
    /// Where the first worker takes the storage endpoints' stacks from
    /// when it runs them.
    inline: Arc<InlineSlot>,
    /// Where the switch's tables are kept across a restart.
    state_dir: Option<std::path::PathBuf>,
    /// Flow offload, when it is on.
    offload: Option<Arc<Offload>>,
}

/// Starts EAL with the DPDK ports and opens them, in order.
#[cfg(feature = "dpdk")]
fn open_dpdk(
    config: &Config,
    ports: &[&PortConfig],
) -> Result<dpu_dataplane::io::dpdk::DpdkDriver> {
    use dpu_dataplane::io::dpdk::{DpdkDriver, DpdkPort};
    let d = &config.dataplane;
    let base = dpdk::EalConfig {
        lcores: d.lcores.clone(),
        no_huge: d.no_huge,
        memory_mb: d.memory_mb,
        file_prefix: Some(d.file_prefix.clone()),
        extra: d.eal_args.clone(),
        log_level: Some("lib.eal:notice".into()),
        ..Default::default()
    };
    let ports: Vec<DpdkPort> = ports
        .iter()
        .map(|p| DpdkPort {
            id: p.id.clone(),
            devargs: p.device.clone(),
            name: p.dpdk_name.clone(),
            mtu: p.mtu,
        })
        .collect();
    let eal_cfg = DpdkDriver::eal_config(&base, &ports);
    tracing::info!(args = ?eal_cfg.args(), "starting DPDK EAL");
    Ok(DpdkDriver::open(&eal_cfg, &ports, d.workers, d.mbufs)?)
}

impl Dataplane {
    /// Opens the configured ports with their driver, compiles `state` into
    /// the switch and starts the workers.
    ///
    /// # Errors
    /// If EAL, a port, the pool or a worker cannot start, naming which.
    pub fn start(config: &Config, state: &State) -> Result<Dataplane> {
        let d = &config.dataplane;
        let driver = config
            .dataplane_driver()
            .context("no port has a data-plane driver")?;
        let ports: Vec<&PortConfig> = config.ports.iter().filter(|p| p.driver == driver).collect();
        let ids: Arc<Vec<String>> = Arc::new(ports.iter().map(|p| p.id.clone()).collect());
        let base = config.switch_base(ids.len());
        let inline = Arc::new(InlineSlot::default());
        let start = Start {
            config,
            ports: &ports,
            ids: &ids,
            base,
            state,
            inline: &inline,
            flow_ports: None,
        };
        let Started {
            workers,
            counters,
            switch,
            base,
            offload,
        } = match driver {
            #[cfg(feature = "dpdk")]
            "dpdk" => {
                let drv = open_dpdk(config, &ports)?;
                let flow_ports = Some(drv.flow_ports(&ids));
                Start {
                    flow_ports,
                    ..start
                }
                .run(drv)?
            }
            _ => {
                let ifaces: Vec<String> = ports.iter().map(|p| p.device.clone()).collect();
                let buffers = usize::try_from(d.mbufs).unwrap_or(usize::MAX);
                let k = KernelDriver::open(&ifaces, d.workers, buffers)
                    .context("opening the kernel driver's ports")?;
                start.run(k)?
            }
        };
        tracing::info!(
            driver,
            workers = d.workers,
            ports = ids.len(),
            "data plane running"
        );
        Ok(Dataplane {
            workers,
            switch,
            counters,
            driver,
            ids,
            base,
            idle: idle_mode(d.idle),
            inline,
            state_dir: config.state.dir.clone(),
            offload,
        })
    }

    /// Where the storage endpoints' stacks go to run in the first worker
    /// (`storage.endpoint_placement = "worker"`).
    pub fn inline_slot(&self) -> &Arc<InlineSlot> {
        &self.inline
    }

    /// The driver the ports run on ("dpdk" or "kernel").
    pub fn driver(&self) -> &'static str {
        self.driver
    }

    /// What turns new states into switch configurations.
    pub fn feed(&self) -> Feed {
        Feed {
            switch: self.switch.clone(),
            ids: self.ids.clone(),
            base: self.base.clone(),
            rules: Default::default(),
            offload: self.offload.clone(),
            last: Default::default(),
        }
    }

    /// The switch the workers run.
    pub fn switch(&self) -> SwitchHandle {
        self.switch.clone()
    }

    /// How the storage endpoints' stacks are made and run: the IP MTU the
    /// ports allow (their smallest), the kernel transport's connection
    /// limits and write timeout for each endpoint, and the workers' idle
    /// behaviour for their thread.
    pub fn endpoint_settings(
        &self,
        tcp: &dpu_nvmeof::TcpConfig,
    ) -> crate::endpoint_stacks::StackSettings {
        crate::endpoint_stacks::StackSettings {
            mtu: self.base.endpoint_frame_max.saturating_sub(ETHERNET_HEADER),
            max_connections: tcp.max_connections,
            max_connections_per_address: tcp.max_connections_per_address,
            write_timeout: tcp.write_timeout,
            idle: self.idle,
            auth_threads: tcp.auth_threads,
            auth_queue: tcp.auth_queue,
        }
    }

    /// The counters the data plane contributes to telemetry.
    pub fn counters(&self) -> Arc<dyn CounterSource> {
        self.counters.clone()
    }

    /// Stops the workers (each at the end of a turn) and saves what
    /// their connection and fragment tables hold for the next process;
    /// ports (and EAL) close when the last handle drops.
    pub fn stop(mut self) {
        // Hardware must not go on forwarding for a switch that stopped:
        // the flows leave it while the workers still take the changes.
        if let Some(o) = &self.offload {
            o.stop();
        }
        self.workers.stop();
        tracing::info!("data plane stopped");
        crate::switch_tables::save(&self.switch, self.state_dir.as_deref());
    }
}

/// What [`Start::run`] started.
struct Started {
    workers: Workers,
    counters: Arc<dyn CounterSource>,
    switch: SwitchHandle,
    /// The base configuration, with the VTEPs.
    base: SwitchConfig,
    offload: Option<Arc<Offload>>,
}

/// What starting the switch on a driver needs.
struct Start<'a> {
    config: &'a Config,
    ports: &'a [&'a PortConfig],
    ids: &'a Arc<Vec<String>>,
    /// The switch configuration but for tenants and VTEPs.
    base: SwitchConfig,
    state: &'a State,
    /// Handed to the first worker's pipeline.
    inline: &'a Arc<InlineSlot>,
    /// The ports as the `rte_flow` provider needs them (DPDK only).
    flow_ports: Option<Vec<dpu_dataplane::offload::FlowPort>>,
}

impl Start<'_> {
    /// Compiles the switch for `driver`'s ports (VTEPs take their port's
    /// MAC address) and starts one worker per queue running it; returns
    /// the base configuration with the VTEPs.
    fn run<D: Driver>(self, driver: D) -> Result<Started> {
        let Start {
            config,
            ports,
            ids,
            mut base,
            state,
            inline,
            flow_ports,
        } = self;
        base.vteps = vec![None; ids.len()];
        for (i, id) in ids.iter().enumerate() {
            let Some(l) = driver.link(i) else { continue };
            tracing::info!(port = %id, mac = %fmt_mac(l.mac), up = l.up, mtu = l.mtu, "port started");
            if let Some(ip) = ports[i].vtep_address {
                base.vteps[i] = Some(Vtep {
                    ip: u32::from(ip),
                    mac: l.mac,
                });
                tracing::info!(port = %id, address = %ip, "VXLAN tunnel endpoint");
            }
        }
        // Storage endpoints take frames the smallest port MTU allows
        // (1500 where no driver says).
        let mtu = (0..ids.len())
            .filter_map(|i| driver.link(i).map(|l| l.mtu as usize))
            .filter(|&m| m > 0)
            .min()
            .unwrap_or(1500);
        base.endpoint_frame_max = mtu + ETHERNET_HEADER;
        if let Some(i) =
            (0..ids.len()).find(|&i| ports[i].vtep_address.is_some() && base.vteps[i].is_none())
        {
            anyhow::bail!(
                "port {}: its driver reports no MAC address for the VTEP",
                ids[i]
            );
        }
        let first = switch_config(&base, ids, state);
        let switch = SwitchHandle::new(&first).context("compiling the switch configuration")?;
        // Before the workers start: their tables adopt what it carries.
        crate::switch_tables::restore(
            &switch,
            config.state.dir.as_deref(),
            usize::from(config.dataplane.workers),
        );
        // Before the workers start: their pipelines take their links.
        let workers_n = usize::from(config.dataplane.workers);
        let offload = Offload::start(
            &config.dataplane.offload,
            workers_n,
            &switch,
            &first,
            flow_ports,
        )?;
        let (workers, counters) = run(driver, config, ids, &switch, inline, offload.clone())?;
        Ok(Started {
            workers,
            counters,
            switch,
            base,
            offload,
        })
    }
}

/// What the workers (and the storage endpoints' thread) do when idle.
fn idle_mode(mode: IdleMode) -> Idle {
    match mode {
        IdleMode::Busy => Idle::BusyPoll,
        IdleMode::Backoff => Idle::Backoff {
            spins: 1000,
            max: Duration::from_micros(200),
        },
    }
}

/// Starts one worker per queue on `driver`'s ports, running the switch.
fn run<D: Driver>(
    driver: D,
    config: &Config,
    ids: &Arc<Vec<String>>,
    switch: &SwitchHandle,
    inline: &Arc<InlineSlot>,
    offload: Option<Arc<Offload>>,
) -> Result<(Workers, Arc<dyn CounterSource>)> {
    let d = &config.dataplane;
    let idle = idle_mode(d.idle);
    let configs = (0..d.workers)
        .map(|q| WorkerConfig {
            rx: (0..ids.len()).map(|p| (p, q)).collect(),
            tx_queue: q,
            cpu: d.worker_cpus.get(usize::from(q)).copied(),
            idle,
        })
        .collect();
    let workers = Workers::start(&driver, configs, |i| WorkerPipeline {
        switch: switch.pipeline_for(i),
        slot: (i == 0).then(|| inline.clone()),
        endpoints: None,
    })
    .context("starting the workers")?;
    if let Some(o) = &offload {
        o.watch_links(driver.clone(), ids.clone())?;
    }
    let counters = Arc::new(PortSource {
        driver,
        ids: ids.clone(),
        reader: workers.reader(),
        switch: switch.clone(),
        offload,
    });
    Ok((workers, counters))
}

/// A worker's pipeline: the switch, and in the first worker the storage
/// endpoints' stacks once [`crate::endpoint_stacks::Endpoints::start`] has put
/// them in its slot (`storage.endpoint_placement = "worker"`), run as its
/// side work once a turn.
struct WorkerPipeline {
    switch: SwitchPipeline,
    slot: Option<Arc<InlineSlot>>,
    endpoints: Option<InlineEndpoints>,
}

impl Pipeline for WorkerPipeline {
    fn process(&mut self, in_port: usize, packet: &mut [u8], flood: &mut Vec<Egress>) -> Verdict {
        self.switch.process(in_port, packet, flood)
    }

    fn process_burst<P: Packet>(
        &mut self,
        in_port: usize,
        burst: &mut Vec<P>,
        flood: &mut Vec<Egress>,
        sink: impl FnMut(P, &Verdict, &[Egress]),
    ) {
        self.switch.process_burst(in_port, burst, flood, sink);
    }

    fn turn(&mut self) {
        self.switch.turn();
        if self.endpoints.is_none() {
            if let Some(e) = self.slot.as_deref().and_then(InlineSlot::take) {
                self.endpoints = Some(e);
            }
        }
    }

    fn endpoints(&self) -> Option<&Arc<dpu_dataplane::endpoint_queues::EndpointTable>> {
        self.switch.endpoints()
    }

    fn between_bursts(&mut self) -> usize {
        self.endpoints.as_mut().map_or(0, InlineEndpoints::turn)
    }

    fn stopped(&mut self) {
        self.switch.stopped();
    }
}

/// Publishes control-plane states to the running switch.
pub struct Feed {
    switch: SwitchHandle,
    ids: Arc<Vec<String>>,
    base: SwitchConfig,
    /// The switch rules of the last state published.
    rules: std::sync::Mutex<RuleCache>,
    /// Flow offload, when it is on.
    offload: Option<Arc<Offload>>,
    /// The configuration last published, until offload has compared it
    /// with the one before.
    last: std::sync::Mutex<Option<SwitchConfig>>,
}

/// How long the feed waits on a blocking thread for the workers to take a
/// configuration before it looks whether a newer state has come.
const TAKE_SLICE: Duration = Duration::from_millis(50);

impl Feed {
    /// Compiles `state` into the switch and publishes it to the workers;
    /// answers the switch's generation for it, which each worker takes at
    /// its next turn.
    ///
    /// # Errors
    /// The switch's refusal; it keeps the previous configuration.
    pub fn apply(&self, state: &State) -> Result<u64, ConfigError> {
        let start = std::time::Instant::now();
        let cfg = {
            let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
            let cfg = switch_config_with(&self.base, &self.ids, state, &mut rules);
            rules.keep_only(state);
            cfg
        };
        let t = std::time::Instant::now();
        let published = self.switch.publish(&cfg);
        if published.is_ok() && self.offload.is_some() {
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(cfg.clone());
        }
        match published {
            Ok(p) => {
                tracing::info!(
                    generation = p.generation,
                    tenants = cfg.tenants.len(),
                    tenants_rebuilt = p.built,
                    tenants_patched = p.patched,
                    compile_ms = t.elapsed().as_secs_f64() * 1e3,
                    apply_ms = start.elapsed().as_secs_f64() * 1e3,
                    "switch configuration published"
                );
                Ok(p.generation)
            }
            // The control plane validated the state; reaching this is a bug
            // worth a loud log, and the previous configuration stays.
            Err(e) => {
                tracing::error!("switch configuration refused, previous one kept: {e}");
                Err(e)
            }
        }
    }

    /// Publishes every state `state` publishes from now on (the newest,
    /// when several arrived while one was being published), having
    /// published generation `applied` already, and reports each
    /// generation once every worker has taken it, or the switch's refusal
    /// naming the tenants at fault, through the answered [`Applied`], for
    /// tenant calls to wait on. A worker slow to take a configuration
    /// holds up its report, never the next state, whose report covers it.
    ///
    /// Compiling runs on a blocking thread (large rule sets take a
    /// while). Should it panic, following stops: the task ends, and
    /// waiting calls fail rather than hang.
    pub fn follow(
        self,
        state: &StateHandle,
        applied: u64,
    ) -> (tokio::task::JoinHandle<()>, Applied) {
        let (reporter, waiters) = apply::follow("the switch", applied);
        let mut rx = state.subscribe();
        let feed = Arc::new(self);
        let task = tokio::spawn(async move {
            'states: while rx.changed().await.is_ok() {
                let p = rx.borrow_and_update().clone();
                let f = feed.clone();
                let published = tokio::task::spawn_blocking(move || {
                    let g = f.apply(&p.state)?;
                    Ok::<_, ConfigError>((g, f.switch.wait_taken(g, TAKE_SLICE)))
                })
                .await;
                let (g, mut taken) = match published {
                    Ok(Ok(v)) => v,
                    Ok(Err(e)) => {
                        reporter.refuse(p.generation, e.to_string(), at_fault(&e));
                        continue;
                    }
                    Err(e) => {
                        tracing::error!(generation = p.generation, error = %e, "publishing to the switch failed; the switch no longer follows changes");
                        break;
                    }
                };
                while !taken {
                    if rx.has_changed().unwrap_or(true) {
                        continue 'states;
                    }
                    let s = feed.switch.clone();
                    taken = tokio::task::spawn_blocking(move || s.wait_taken(g, TAKE_SLICE))
                        .await
                        .unwrap_or(false);
                }
                // Every worker switches by the change: the flows it
                // covers leave hardware before it is acknowledged.
                let f = feed.clone();
                let invalidated = tokio::task::spawn_blocking(move || f.invalidate(g))
                    .await
                    .unwrap_or_else(|e| Err(anyhow::anyhow!("{e}")));
                if let Err(e) = invalidated {
                    tracing::error!(generation = g, error = %e, "offloaded flows of a change were not all removed");
                    reporter.refuse(
                        p.generation,
                        format!("the switch took the change, but its offloaded flows were not all removed: {e:#}"),
                        Vec::new(),
                    );
                    continue;
                }
                reporter.report(p.generation, Vec::new());
            }
        });
        (task, waiters)
    }
}

impl Feed {
    /// Takes out of hardware the offloaded flows of the tenants the
    /// configuration published as `generation` changed (a no-op without
    /// offload).
    fn invalidate(&self, generation: u64) -> Result<usize> {
        let Some(o) = &self.offload else {
            return Ok(0);
        };
        let Some(cfg) = self.last.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(0);
        };
        o.invalidate(&self.switch, cfg, generation)
    }
}

/// The tenants a refusal of the switch concerns, named as the API does.
fn at_fault(e: &ConfigError) -> Vec<String> {
    let (tenant, other) = match e {
        ConfigError::NoSuchPort { tenant, .. }
        | ConfigError::BadVlan { tenant, .. }
        | ConfigError::NoVtep { tenant, .. }
        | ConfigError::BadVni { tenant, .. }
        | ConfigError::BadVtepPrefix { tenant, .. }
        | ConfigError::DuplicateOrder { tenant, .. }
        | ConfigError::BadEndpoint { tenant, .. } => (tenant, None),
        ConfigError::Overlap { tenant, other, .. }
        | ConfigError::VniOverlap { tenant, other, .. } => (tenant, Some(other)),
        // The configuration's checks refuse sizes out of bounds before
        // the switch starts: no tenant is at fault.
        ConfigError::Size(_) => return Vec::new(),
    };
    std::iter::once(tenant)
        .chain(other)
        .map(|t| format!("tenants/{t}"))
        .collect()
}

fn fmt_mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Each tenant's rules as the switch takes them, kept from one publish to
/// the next. A tenant whose rule list is the same allocation as at the
/// last publish (the state shares it until the rules change) gets the
/// same converted list, which the switch in turn recognizes as the list
/// its compiled rules came from: a publish costs nothing per rule of a
/// tenant whose rules did not change. Both lists are held here, so an
/// allocation is never freed and reused for other rules while it serves
/// as an identity.
#[derive(Debug, Default)]
pub struct RuleCache(std::collections::HashMap<String, Converted>);

/// A tenant's rule list and its switch rules.
type Converted = (Arc<Vec<Rule>>, Arc<Vec<SwitchRule>>);

impl RuleCache {
    /// The switch rules of tenant `id`, whose rule list is `rules`.
    fn rules(&mut self, id: &str, rules: &Arc<Vec<Rule>>) -> Arc<Vec<SwitchRule>> {
        if let Some((from, to)) = self.0.get(id) {
            if Arc::ptr_eq(from, rules) {
                return to.clone();
            }
        }
        let to = Arc::new(rules.iter().map(switch_rule).collect::<Vec<_>>());
        self.0.insert(id.to_string(), (rules.clone(), to.clone()));
        to
    }

    /// Forgets the tenants `state` does not hold.
    fn keep_only(&mut self, state: &State) {
        self.0.retain(|id, _| state.tenants.contains_key(id));
    }
}

/// The switch configuration for `state` on the ports `ids`. Attachments
/// on ports without a data-plane driver are left out (the state keeps
/// them; they apply once the port is configured).
pub fn switch_config(base: &SwitchConfig, ids: &[String], state: &State) -> SwitchConfig {
    switch_config_with(base, ids, state, &mut RuleCache::default())
}

/// [`switch_config`] taking the tenants' rules from `rules` where their
/// lists did not change since it converted them.
fn switch_config_with(
    base: &SwitchConfig,
    ids: &[String],
    state: &State,
    rules: &mut RuleCache,
) -> SwitchConfig {
    let index: BTreeMap<&str, usize> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let mut endpoints: BTreeMap<&str, Vec<Endpoint>> = BTreeMap::new();
    for e in state.endpoints() {
        endpoints.entry(e.tenant).or_default().push(Endpoint {
            mac: e.mac.0,
            ip: e.address,
        });
    }
    let tenants = state
        .tenants
        .values()
        .map(|t| {
            let mut out = TenantConfig {
                name: t.id.clone(),
                default_allow: t.default_policy == Action::Allow,
                no_offload: t.no_offload,
                rules: rules.rules(&t.id, &t.rules.rules),
                endpoints: endpoints.remove(t.id.as_str()).unwrap_or_default(),
                ..TenantConfig::default()
            };
            for a in &t.attachments {
                let Some(&port) = index.get(a.port()) else {
                    tracing::warn!(tenant = %t.id, attachment = %a, "port has no data-plane driver; attachment kept, not forwarded");
                    continue;
                };
                let (attach, guard, remotes, ranges) = match a {
                    Attachment::Port { vlan, guard, .. } => (
                        Attach::port(port, *vlan),
                        switch_guard(guard),
                        Vec::new(),
                        Vec::new(),
                    ),
                    Attachment::Vxlan {
                        vni,
                        remote_vteps,
                        underlay_prefixes,
                        ..
                    } => {
                        if base.vteps.get(port).copied().flatten().is_none() {
                            tracing::warn!(tenant = %t.id, attachment = %a, "port has no vtep_address; VXLAN attachment kept, not forwarded");
                            continue;
                        }
                        let remotes = remote_vteps.iter().map(|&ip| u32::from(ip)).collect();
                        let ranges = underlay_prefixes
                            .iter()
                            .filter(|p| p.is_ipv4())
                            .map(|p| {
                                let (lo, hi) = prefix_range(Some(p), 32);
                                (lo as u32, hi as u32)
                            })
                            .collect();
                        (Attach { port, vlan: 0, vni: *vni }, Guard::default(), remotes, ranges)
                    }
                };
                out.attachments.push(attach);
                out.guards.push(guard);
                out.remote_vteps.push(remotes);
                out.vtep_prefixes.push(ranges);
            }
            out
        })
        .collect();
    SwitchConfig {
        tenants,
        ..base.clone()
    }
}

/// An attachment's anti-spoofing lists as the switch checks them.
fn switch_guard(g: &SourceGuard) -> Guard {
    let mut out = Guard {
        macs: g.macs.iter().map(|m| m.0).collect(),
        ..Guard::default()
    };
    for p in &g.prefixes {
        if p.is_ipv4() {
            let (lo, hi) = prefix_range(Some(p), 32);
            out.v4.push((lo as u32, hi as u32));
        } else {
            out.v6.push(prefix_range(Some(p), 128));
        }
    }
    out
}

fn prefix_range(p: Option<&IpPrefix>, width: u32) -> (u128, u128) {
    match p {
        Some(p) => {
            let addr = match p.addr() {
                std::net::IpAddr::V4(a) => u128::from(u32::from(a)),
                std::net::IpAddr::V6(a) => u128::from(a),
            };
            AclRule::prefix_range(addr, p.len(), width)
        }
        None => AclRule::prefix_range(0, 0, width),
    }
}

/// A validated rule as the switch holds it.
pub fn switch_rule(r: &Rule) -> SwitchRule {
    let mut m =
        AclRule::for_addresses(r.priority, r.src.map(|p| p.addr()), r.dst.map(|p| p.addr()));
    if let Some(p) = r.src {
        m = m.with_src_prefix(p.addr(), p.len());
    }
    if let Some(p) = r.dst {
        m = m.with_dst_prefix(p.addr(), p.len());
    }
    if let Some(p) = r.protocol {
        m = m.with_protocol(p);
    }
    if r.icmp_type.is_some() || r.icmp_code.is_some() {
        // ICMP has no ports: its type and code take their place.
        if let Some(t) = r.icmp_type {
            m = m.with_icmp_type(t);
        }
        if let Some(c) = r.icmp_code {
            m = m.with_icmp_code(c);
        }
    } else {
        if let Some(p) = r.src_ports {
            m = m.with_src_ports(p.first, p.last);
        }
        if let Some(p) = r.dst_ports {
            m = m.with_dst_ports(p.first, p.last);
        }
    }
    SwitchRule {
        id: r.id.clone(),
        matches: m,
        allow: r.action == Action::Allow,
        stateful: r.stateful,
        rate_limit: r.rate_limit.map(|l| RateLimit {
            per_second: l.per_second,
            bits: l.bits,
            burst: l.burst,
        }),
    }
}

/// Port counters and status from the NIC, drops from the workers, tenant
/// and rule counters from the switch.
struct PortSource<D> {
    driver: D,
    ids: Arc<Vec<String>>,
    reader: CounterReader,
    switch: SwitchHandle,
    offload: Option<Arc<Offload>>,
}

impl<D: Driver> CounterSource for PortSource<D> {
    fn collect(&self, out: &mut Counters) {
        for (i, id) in self.ids.iter().enumerate() {
            let s = self.driver.stats(i);
            out.ports.insert(
                id.clone(),
                pb::PortCounters {
                    rx_packets: s.rx_packets,
                    rx_bytes: s.rx_bytes,
                    tx_packets: s.tx_packets,
                    tx_bytes: s.tx_bytes,
                    rx_missed: s.rx_missed,
                    rx_errors: s.rx_errors,
                    tx_errors: s.tx_errors,
                },
            );
            if let Some(link) = self.driver.link(i) {
                out.port_status.insert(
                    id.clone(),
                    PortStatus {
                        link_up: Some(link.up),
                        speed_mbps: link.speed_mbps,
                        mac_address: fmt_mac(link.mac),
                        mtu: link.mtu,
                    },
                );
            }
        }
        let totals = self.reader.totals();
        for r in worker::DropReason::ALL {
            // The data plane's reasons and the contract's, named alike.
            let reason = match r {
                worker::DropReason::NoTenant => pb::DropReason::NoTenant,
                worker::DropReason::Spoofed => pb::DropReason::Spoofed,
                worker::DropReason::AclDeny => pb::DropReason::AclDeny,
                worker::DropReason::ConntrackInvalid => pb::DropReason::ConntrackInvalid,
                worker::DropReason::TableFull => pb::DropReason::TableFull,
                worker::DropReason::RateLimited => pb::DropReason::RateLimited,
                worker::DropReason::Malformed => pb::DropReason::Malformed,
                worker::DropReason::TxFull => pb::DropReason::TxFull,
                worker::DropReason::FragmentInvalid => pb::DropReason::FragmentInvalid,
                worker::DropReason::FragmentUnknown => pb::DropReason::FragmentUnknown,
                worker::DropReason::FragmentTableFull => pb::DropReason::FragmentTableFull,
                worker::DropReason::UnknownVtep => pb::DropReason::UnknownVtep,
                worker::DropReason::MacLimit => pb::DropReason::MacLimit,
                worker::DropReason::Encapsulated => pb::DropReason::Encapsulated,
                worker::DropReason::EndpointFull => pb::DropReason::EndpointFull,
            };
            *out.drops.entry(reason).or_default() += totals.dropped(r);
        }
        let r = self.switch.restored();
        for (table, t) in [("conntrack", r.conns), ("fragments", r.frags)] {
            for (outcome, n) in [
                ("restored", t.restored),
                ("expired", t.expired),
                ("no_tenant", t.no_tenant),
                ("invalid", t.invalid),
            ] {
                *out.restored.entries.entry((table, outcome)).or_default() += n;
            }
        }
        out.restored.refused_files += r.refused_files;
        let cache = self.switch.flow_cache();
        out.flow_cache.lookups += cache.lookups;
        out.flow_cache.hits += cache.hits;
        out.flow_cache.rests += cache.rests;
        let traffic = self.switch.traffic();
        for (name, t) in traffic.tenants {
            let c = out.tenants.entry(name).or_default();
            c.rx_packets += t.rx_packets;
            c.rx_bytes += t.rx_bytes;
            c.forwarded_packets += t.forwarded_packets;
            c.dropped_packets += t.dropped_packets;
            c.conntrack_entries += t.conntrack_entries;
        }
        if let Some(o) = &self.offload {
            o.collect(&self.switch, out);
        }
        for (key, r) in traffic.rules {
            let c = out.rules.entry(key).or_default();
            c.packets += r.packets;
            c.bytes += r.bytes;
            if r.last_hit > 0 {
                let hit = Timestamp {
                    secs: i64::try_from(r.last_hit).unwrap_or(i64::MAX),
                    nanos: 0,
                };
                c.last_hit = Some(c.last_hit.map_or(hit, |h| h.max(hit)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpu_control::model::{PortRange, RuleSet, Tenant, Timestamp};
    use dpu_dataplane::classify::Family;
    use dpu_dataplane::io::memory::MemoryDriver;
    use dpu_dataplane::worker::{DropReason, Pipeline, Verdict};
    use dpu_proto::v1 as pb;
    use dpu_proto::v1::filter_service_server::FilterService;
    use dpu_proto::v1::tenant_service_server::TenantService;
    use tonic::Request;

    /// A UDP/IPv4 frame from 10.0.0.1 to `dst`, to a MAC address nobody
    /// has shown yet (so it floods).
    fn udp_to(dst: [u8; 4]) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 9, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
        let mut ip = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1];
        ip.extend_from_slice(&dst);
        let sum = dpu_dataplane::wire::ip_checksum(&ip);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0x30, 0x39, 0, 53, 0, 8, 0, 0]);
        f.resize(60, 0);
        f
    }

    /// Polls `done` for up to 10 seconds.
    async fn eventually(mut done: impl FnMut() -> bool) -> bool {
        for _ in 0..1000 {
            if done() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// Tenant and rule calls return only once every worker has taken their
    /// change: a worker that has not turned since holds them up, and once
    /// one returns, the running worker's very next packet meets the new
    /// rule. Without workers nothing holds them up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tenant_calls_return_once_every_worker_took_their_change() {
        let mut config: Config = toml::from_str(
            "[[ports]]\nid = \"p0\"\ndriver = \"kernel\"\n\
             [[ports]]\nid = \"p1\"\ndriver = \"kernel\"\n",
        )
        .unwrap();
        config.dataplane.idle = IdleMode::Backoff;
        let ports: Vec<&PortConfig> = config.ports.iter().collect();
        let ids = Arc::new(vec!["p0".to_string(), "p1".to_string()]);
        let state = StateHandle::open(None).unwrap();
        let first = state.published();
        let driver = MemoryDriver::new(2);
        let start = Start {
            config: &config,
            ports: &ports,
            ids: &ids,
            base: SwitchConfig {
                ports: 2,
                ..SwitchConfig::default()
            },
            state: &first.state,
            inline: &Arc::new(InlineSlot::default()),
            flow_ports: None,
        };
        let Started {
            mut workers,
            switch,
            base,
            ..
        } = start.run(driver.clone()).unwrap();
        // A second worker, which turns only when the test says.
        let mut held = switch.pipeline_for(1);
        let feed = Feed {
            switch: switch.clone(),
            ids,
            base,
            rules: Default::default(),
            offload: None,
            last: Default::default(),
        };
        let (task, applied) = feed.follow(&state, first.generation);
        let registry = config
            .port_specs()
            .into_iter()
            .map(|p| (p.id.clone(), p))
            .collect();
        let api = crate::config::seed::tests::api_over(&state, registry, 0, None, Some(applied));

        let attach = |port: &str| pb::Attachment {
            kind: Some(pb::attachment::Kind::Port(pb::PortAttachment {
                port: format!("ports/{port}"),
                ..Default::default()
            })),
        };
        let create = tokio::spawn({
            let api = api.clone();
            let tenant = pb::Tenant {
                attachments: vec![attach("p0"), attach("p1")],
                default_policy: pb::DefaultPolicy::Allow as i32,
                ..Default::default()
            };
            async move {
                api.create_tenant(Request::new(pb::CreateTenantRequest {
                    tenant_id: "red".into(),
                    tenant: Some(tenant),
                }))
                .await
            }
        });
        let deny = |dst: &str, priority| pb::AddRuleRequest {
            parent: "tenants/red".into(),
            rule: Some(pb::FilterRule {
                priority,
                dst_prefix: dst.into(),
                action: pb::RuleAction::Deny as i32,
                ..Default::default()
            }),
            ..Default::default()
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !create.is_finished(),
            "returned before every worker took it"
        );
        held.turn();
        create.await.unwrap().unwrap();

        let add = tokio::spawn({
            let api = api.clone();
            async move { api.add_rule(Request::new(deny("10.0.0.2/32", 10))).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!add.is_finished(), "returned before every worker took it");
        held.turn();
        add.await.unwrap().unwrap();
        let mut frame = udp_to([10, 0, 0, 2]);
        let mut flood = Vec::new();
        assert_eq!(
            held.process(0, &mut frame, &mut flood),
            Verdict::Drop(DropReason::AclDeny)
        );
        driver.inject(0, udp_to([10, 0, 0, 2])).unwrap();
        assert!(
            eventually(|| workers.totals().dropped(DropReason::AclDeny) == 1).await,
            "the running worker dropped it"
        );
        assert!(driver.take_sent(1).is_empty());

        // Workers gone, nothing to wait for.
        drop(held);
        workers.stop();
        let rule = api.add_rule(Request::new(deny("10.0.0.3/32", 20)));
        tokio::time::timeout(Duration::from_secs(10), rule)
            .await
            .expect("returns without workers")
            .unwrap();
        task.abort();
    }

    fn rule(priority: u32) -> Rule {
        Rule {
            id: format!("r{priority}"),
            priority,
            src: None,
            dst: None,
            src_ports: None,
            dst_ports: None,
            protocol: None,
            icmp_type: None,
            icmp_code: None,
            action: Action::Deny,
            stateful: false,
            description: String::new(),
            rate_limit: None,
        }
    }

    #[test]
    fn rules_become_classifier_ranges() {
        let mut r = rule(7);
        r.src = Some("10.1.0.0/16".parse().unwrap());
        r.protocol = Some(6);
        r.dst_ports = Some(PortRange {
            first: 80,
            last: 443,
        });
        let s = switch_rule(&r);
        assert!(!s.allow);
        assert_eq!(s.matches.order, 7);
        assert_eq!(s.matches.family, Family::V4);
        assert_eq!(s.matches.src, (0x0a01_0000, 0x0a01_ffff));
        assert_eq!(s.matches.dst, (0, u128::from(u32::MAX)));
        assert_eq!(
            (s.matches.src_port, s.matches.dst_port),
            ((0, u16::MAX), (80, 443))
        );
        assert_eq!(s.matches.proto, (6, 6));

        let mut icmp = rule(1);
        icmp.dst = Some("2001:db8::/32".parse().unwrap());
        icmp.protocol = Some(58);
        icmp.icmp_type = Some(128);
        icmp.action = Action::Allow;
        let s = switch_rule(&icmp);
        assert!(s.allow);
        assert_eq!(s.matches.family, Family::V6);
        assert_eq!(s.matches.src, (0, u128::MAX));
        // Type where the source port is, any code.
        assert_eq!(
            (s.matches.src_port, s.matches.dst_port),
            ((128, 128), (0, u16::MAX))
        );
        assert_eq!(switch_rule(&rule(2)).matches.family, Family::Any);
    }

    /// A tenant whose rule list the state still shares is not converted
    /// again, and the switch keeps its compiled rules as they were; one
    /// whose rules changed gets a new list, and the switch patches it.
    #[test]
    fn unchanged_rule_lists_are_converted_once() {
        let mut state = State::default();
        for (i, id) in ["blue", "red"].into_iter().enumerate() {
            state.tenants.insert(
                id.into(),
                Tenant {
                    id: id.into(),
                    display_name: String::new(),
                    attachments: vec![Attachment::port_vlan("p0", 100 + i as u16)],
                    default_policy: Action::Deny,
                    create_time: Timestamp::now(),
                    rules: RuleSet {
                        version: 1,
                        rules: Arc::new(vec![rule(3), rule(9)]),
                    },
                    storage_qos: Default::default(),
                    vlan_id: 0,
                    no_offload: false,
                },
            );
        }
        let ids = vec!["p0".to_string()];
        let base = SwitchConfig {
            ports: 1,
            ..SwitchConfig::default()
        };
        let mut cache = RuleCache::default();
        let first = switch_config_with(&base, &ids, &state, &mut cache);
        let h = SwitchHandle::new(&first).unwrap();

        let mut next = state.clone();
        let red = next.tenants.get_mut("red").unwrap();
        red.rules = RuleSet {
            version: 2,
            rules: Arc::new(vec![rule(3), rule(5), rule(9)]),
        };
        let second = switch_config_with(&base, &ids, &next, &mut cache);
        assert!(Arc::ptr_eq(
            &first.tenants[0].rules,
            &second.tenants[0].rules
        ));
        assert!(!Arc::ptr_eq(
            &first.tenants[1].rules,
            &second.tenants[1].rules
        ));
        assert_eq!(
            second.tenants[1]
                .rules
                .iter()
                .map(|r| r.matches.order)
                .collect::<Vec<_>>(),
            [3, 5, 9]
        );
        let p = h.publish(&second).unwrap();
        assert_eq!((p.unchanged, p.patched, p.built), (1, 1, 0));

        // The same content in a new list is compared, and found unchanged.
        let mut again = next.clone();
        again.tenants.get_mut("blue").unwrap().rules.rules = Arc::new(vec![rule(3), rule(9)]);
        let third = switch_config_with(&base, &ids, &again, &mut cache);
        assert!(!Arc::ptr_eq(
            &second.tenants[0].rules,
            &third.tenants[0].rules
        ));
        let p = h.publish(&third).unwrap();
        assert_eq!((p.unchanged, p.patched, p.built), (2, 0, 0));

        again.tenants.remove("blue");
        cache.keep_only(&again);
        assert_eq!(cache.0.len(), 1);
    }

    #[test]
    fn only_ports_with_a_driver_are_attached() {
        let mut state = State::default();
        state.tenants.insert(
            "red".into(),
            Tenant {
                id: "red".into(),
                display_name: String::new(),
                attachments: vec![
                    Attachment::Port {
                        port: "pf0vf1".into(),
                        vlan: 0,
                        guard: SourceGuard {
                            macs: vec!["02:00:00:00:00:01".parse().unwrap()],
                            prefixes: vec![
                                "10.0.0.0/24".parse().unwrap(),
                                "2001:db8::/32".parse().unwrap(),
                            ],
                        },
                    },
                    Attachment::port_vlan("p0", 100),
                    Attachment::port_vlan("pf0vf9", 0),
                    Attachment::Vxlan {
                        uplink: "p0".into(),
                        vni: 5000,
                        remote_vteps: vec!["192.0.2.9".parse().unwrap()],
                        underlay_prefixes: vec!["198.51.100.0/24".parse().unwrap()],
                    },
                    Attachment::Vxlan {
                        uplink: "pf0vf1".into(),
                        vni: 6000,
                        remote_vteps: Vec::new(),
                        underlay_prefixes: Vec::new(),
                    },
                ],
                default_policy: Action::Allow,
                create_time: Timestamp::now(),
                rules: RuleSet {
                    version: 1,
                    rules: Arc::new(vec![rule(3)]),
                },
                storage_qos: Default::default(),
                vlan_id: 0,
                no_offload: false,
            },
        );
        let ids = vec!["p0".to_string(), "pf0vf1".to_string()];
        let base = SwitchConfig {
            ports: 2,
            vteps: vec![
                Some(Vtep {
                    ip: 0xc000_0201,
                    mac: [2, 0, 0, 0, 0, 0xaa],
                }),
                None,
            ],
            ..SwitchConfig::default()
        };
        let c = switch_config(&base, &ids, &state);
        assert_eq!(c.ports, 2);
        let t = &c.tenants[0];
        // The VXLAN network on the port without a VTEP is left out.
        assert_eq!(
            t.attachments,
            vec![
                Attach::port(1, 0),
                Attach::port(0, 100),
                Attach {
                    port: 0,
                    vlan: 0,
                    vni: 5000
                }
            ]
        );
        assert_eq!(t.remote_vteps, vec![vec![], vec![], vec![0xc000_0209]]);
        assert_eq!(
            t.vtep_prefixes,
            vec![vec![], vec![], vec![(0xc633_6400, 0xc633_64ff)]]
        );
        assert_eq!(
            t.guards,
            vec![
                Guard {
                    macs: vec![[2, 0, 0, 0, 0, 1]],
                    v4: vec![(0x0a00_0000, 0x0a00_00ff)],
                    v6: vec![(0x2001_0db8 << 96, (0x2001_0db8 << 96) | ((1u128 << 96) - 1))],
                },
                Guard::default(),
                Guard::default()
            ]
        );
        assert!(t.default_allow);
        assert_eq!(t.rules.len(), 1);
        dpu_dataplane::switch::Compiled::new(&c).unwrap();
    }

    #[test]
    fn endpoints_reach_the_switch_in_their_own_tenant() {
        use dpu_control::model::{Listener, Subsystem, Transport};
        let mut state = State::default();
        for id in ["blue", "red"] {
            state.tenants.insert(
                id.into(),
                Tenant {
                    id: id.into(),
                    display_name: String::new(),
                    attachments: vec![Attachment::port_vlan(
                        if id == "blue" { "p0" } else { "pf0vf1" },
                        10,
                    )],
                    default_policy: Action::Allow,
                    create_time: Timestamp::now(),
                    rules: RuleSet::default(),
                    storage_qos: Default::default(),
                    vlan_id: 0,
                    no_offload: false,
                },
            );
        }
        let listener = |id: &str, tenant: Option<&str>, mac: u8| Listener {
            id: id.into(),
            transport: Transport::Tcp,
            address: "10.1.0.250".parse().unwrap(),
            port: 4420,
            tenant: tenant.map(String::from),
            mac: tenant.map(|_| dpu_control::model::MacAddr([2, 0xd5, 0, 0, 0, mac])),
            secure_channel: Default::default(),
        };
        let mut sub = Subsystem {
            id: "vol".into(),
            nqn: "nqn.2024-01.io.example:vol".into(),
            serial_number: "s".into(),
            model_number: "m".into(),
            allow_any_host: true,
            allowed_hosts: Default::default(),
            max_namespaces: 1,
            create_time: Timestamp::now(),
            namespaces: BTreeMap::new(),
            listeners: BTreeMap::new(),
            auth_requirement: Default::default(),
            host_auth: BTreeMap::new(),
            host_qos: Default::default(),
            tls_requirement: Default::default(),
            host_tls: Default::default(),
        };
        for l in [
            listener("b", Some("blue"), 1),
            listener("b2", Some("blue"), 1),
            listener("r", Some("red"), 2),
            listener("k", None, 0),
        ] {
            sub.listeners.insert(l.id.clone(), l);
        }
        state.subsystems.insert("vol".into(), sub);
        let ids = vec!["p0".to_string(), "pf0vf1".to_string()];
        let base = SwitchConfig {
            ports: 2,
            ..SwitchConfig::default()
        };
        let c = switch_config(&base, &ids, &state);
        let ep = |mac: u8| Endpoint {
            mac: [2, 0xd5, 0, 0, 0, mac],
            ip: std::net::Ipv4Addr::new(10, 1, 0, 250).into(),
        };
        // One endpoint per (tenant, address), whatever its listeners.
        assert_eq!(c.tenants[0].endpoints, [ep(1)]);
        assert_eq!(c.tenants[1].endpoints, [ep(2)]);
        let h = SwitchHandle::new(&c).unwrap();
        let ports: Vec<(usize, usize)> = h
            .endpoint_ports()
            .iter()
            .map(|p| (p.tenant, p.port))
            .collect();
        assert_eq!(ports, [(0, 2), (1, 3)]);
    }
}
