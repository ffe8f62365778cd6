//! Flow offload in the daemon (`[dataplane.offload]`): the provider and
//! offload thread it configures, the workers' links to it, invalidation
//! when the switch's configuration changes, and its counters.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use dpu_control::telemetry::Counters;
use dpu_dataplane::io::Driver;
use dpu_dataplane::offload::model::{ModelLimits, ModelNic, Refuse};
use dpu_dataplane::offload::{
    FlowPort, Lane, OffloadConfig, OffloadLink, OffloadStatus, Offloader,
};
use dpu_dataplane::switch::{SwitchConfig, SwitchHandle, TenantConfig};
use dpu_proto::v1 as pb;

use crate::config::{OffloadProvider, OffloadSettings};

/// Tenants changed in one publish past which every flow is invalidated
/// at once rather than tenant by tenant.
const INVALIDATE_EACH_MAX: usize = 64;

/// The running offloader, and what the switch's configuration was when
/// its flows were last invalidated.
pub struct Offload {
    offloader: Offloader,
    /// The tenants as last published, by name.
    last: Mutex<BTreeMap<String, TenantConfig>>,
    /// The thread watching the ports' links, and what stops it.
    links: Mutex<Option<std::thread::JoinHandle<()>>>,
    stop: Arc<AtomicBool>,
}

/// How often the ports' links are looked at.
const LINK_POLL: Duration = Duration::from_millis(500);

impl Offload {
    /// Starts the provider `s` names for `workers` workers and gives their
    /// pipelines, made after this, their links (through `switch`).
    /// `None` when offload is off.
    ///
    /// # Errors
    /// The offload thread could not start.
    pub fn start(
        s: &OffloadSettings,
        workers: usize,
        switch: &SwitchHandle,
        first: &SwitchConfig,
        flow_ports: Option<Vec<FlowPort>>,
    ) -> Result<Option<Arc<Offload>>> {
        let cfg = OffloadConfig {
            table: s.table_size,
            per_tenant: s.per_tenant,
            reserved: s.reserved_per_tenant.min(s.per_tenant),
            insert_rate: s.insert_rate,
            lane_queue: s.queue,
            poll: Duration::from_millis(500),
        };
        let idle = Duration::from_secs(s.idle_secs);
        let (offloader, links) = match s.provider {
            OffloadProvider::None => return Ok(None),
            OffloadProvider::Model => {
                let has = |r: &str| s.model.refuse.iter().any(|x| x == r);
                let limits = ModelLimits {
                    table: s.table_size,
                    refuse: Refuse {
                        ipv6: has("ipv6"),
                        vlan_push: has("vlan_push"),
                        vxlan_encap: has("vxlan_encap"),
                        vxlan_decap: has("vxlan_decap"),
                    },
                    fail_every: s.model.fail_every,
                };
                let (nic, models) = ModelNic::new(limits, workers);
                let (o, lanes) =
                    Offloader::start(nic, cfg, workers).context("starting the offload thread")?;
                (
                    o,
                    OffloadLink::each(lanes, Some(models), idle, s.stateless_after),
                )
            }
            OffloadProvider::RteFlow => {
                let ports = flow_ports.context(
                    "dataplane.offload.provider = \"rte_flow\" needs the data plane's ports on the dpdk driver",
                )?;
                let (o, lanes) = start_rte_flow(ports, s.table_size, cfg, workers)?;
                (o, OffloadLink::each(lanes, None, idle, s.stateless_after))
            }
        };
        switch.attach_offload(links);
        let offload = Offload {
            offloader,
            last: Mutex::new(by_name(first.clone())),
            links: Mutex::new(None),
            stop: Arc::new(AtomicBool::new(false)),
        };
        offload.set_tenants(first.tenants.len());
        tracing::info!(
            provider = ?s.provider,
            table = s.table_size,
            per_tenant = s.per_tenant,
            insert_rate = s.insert_rate,
            "flow offload on"
        );
        Ok(Some(Arc::new(offload)))
    }

    fn set_tenants(&self, n: usize) {
        if let Err(e) = self.offloader.set_tenants(n) {
            tracing::error!(error = %e, "flow offload: the table's shares were not updated");
        }
    }

    /// Takes out of hardware the flows of every tenant whose
    /// configuration differs between the last configuration and `now`
    /// (published as `generation`, which every worker has taken), before
    /// the change is acknowledged.
    ///
    /// # Errors
    /// The offloader's, naming how many flows may still be in hardware.
    pub fn invalidate(
        &self,
        switch: &SwitchHandle,
        now: SwitchConfig,
        generation: u64,
    ) -> Result<usize> {
        let now = by_name(now);
        let tenants = now.len();
        let changed: Vec<String> = {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            let mut changed: Vec<String> = last
                .iter()
                .filter(|(name, t)| now.get(*name) != Some(*t))
                .map(|(name, _)| name.clone())
                .collect();
            changed.extend(now.keys().filter(|n| !last.contains_key(*n)).cloned());
            *last = now;
            changed
        };
        if changed.is_empty() {
            return Ok(0);
        }
        self.set_tenants(tenants);
        let ids: Option<Vec<u32>> = changed.iter().map(|n| switch.tenant_id(n)).collect();
        let removed = match ids {
            Some(ids) if ids.len() <= INVALIDATE_EACH_MAX => {
                let mut n = 0;
                for id in ids {
                    n += self.offloader.invalidate(Some(id), generation)?;
                }
                n
            }
            _ => self.offloader.invalidate(None, generation)?,
        };
        // Removed rules' counts take no room (once their flows, whose
        // last counts are folded as they leave, are gone).
        if let Err(e) = self
            .offloader
            .keep_rules(switch.rule_names().into_keys().collect())
        {
            tracing::error!(error = %e, "flow offload: removed rules' counts were not forgotten");
        }
        if removed > 0 {
            tracing::info!(
                generation,
                removed,
                tenants = changed.len(),
                "offloaded flows of changed tenants removed"
            );
        }
        Ok(removed)
    }

    /// Watches the links of `driver`'s ports (`ids` by index): when one
    /// goes down, the flows in on or out of it leave hardware.
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn watch_links<D: Driver>(
        self: &Arc<Self>,
        driver: D,
        ids: Arc<Vec<String>>,
    ) -> Result<()> {
        let me = Arc::downgrade(self);
        let stop = self.stop.clone();
        let t = std::thread::Builder::new()
            .name("dpu-offload-links".into())
            .spawn(move || {
                let mut up: Vec<Option<bool>> = vec![None; ids.len()];
                while !stop.load(Ordering::Relaxed) {
                    for (i, was) in up.iter_mut().enumerate() {
                        let now = driver.link(i).map(|l| l.up);
                        if *was == Some(true) && now == Some(false) {
                            let Some(o) = me.upgrade() else { return };
                            match o.offloader.invalidate_port(i) {
                                Ok(n) => tracing::info!(port = %ids[i], removed = n, "link down: its offloaded flows removed"),
                                Err(e) => tracing::error!(port = %ids[i], error = %e, "link down: its offloaded flows were not all removed"),
                            }
                        }
                        *was = now;
                    }
                    std::thread::park_timeout(LINK_POLL);
                }
            })
            .context("starting the link watcher")?;
        *self.links.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        Ok(())
    }

    /// Stops the link watcher and the offload thread, which takes every
    /// flow out of hardware first (call it while the workers still run).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let t = self.links.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            t.thread().unpark();
            let _ = t.join();
        }
        self.offloader.stop();
    }

    /// Adds its counters to `out`: its own, and its tenants' offloaded
    /// packets into their tenant counters (named through `switch`).
    pub fn collect(&self, switch: &SwitchHandle, out: &mut Counters) {
        let s: OffloadStatus = self.offloader.status();
        let names = switch.tenant_names();
        // What rules' flows matched in hardware, as the switch counts
        // their matches on the cores.
        let rules = switch.rule_names();
        for r in &s.rules {
            if let Some(key) = rules.get(&r.rule) {
                let c = out.rules.entry(key.clone()).or_default();
                c.packets += r.matched.packets;
                c.bytes += r.matched.bytes;
            }
        }
        let mut tenants = Vec::new();
        for t in &s.tenants {
            let Some(name) = names.get(&t.tenant) else {
                continue;
            };
            let c = out.tenants.entry(name.clone()).or_default();
            c.rx_packets += t.carried.packets;
            c.rx_bytes += t.carried.bytes;
            c.forwarded_packets += t.carried.packets;
            c.offloaded_packets += t.carried.packets;
            c.offloaded_bytes += t.carried.bytes;
            // Dropped in hardware: received and dropped, as on the cores.
            c.rx_packets += t.dropped.packets;
            c.rx_bytes += t.dropped.bytes;
            c.dropped_packets += t.dropped.packets;
            c.offloaded_packets += t.dropped.packets;
            c.offloaded_bytes += t.dropped.bytes;
            tenants.push(pb::OffloadTenant {
                tenant: name.clone(),
                flows: t.flows,
                packets: t.carried.packets,
                bytes: t.carried.bytes,
                dropped_packets: t.dropped.packets,
                dropped_bytes: t.dropped.bytes,
            });
        }
        out.offload = Some(pb::OffloadCounters {
            provider: s.provider.to_string(),
            capacity: s.capacity as u64,
            in_use: s.in_use as u64,
            offloaded: s.offloaded,
            withdrawn: s.withdrawn,
            aged: s.aged,
            invalidated: s.invalidated,
            unsupported: s.unsupported,
            table_full: s.table_full,
            insert_failed: s.insert_failed,
            over_quota: s.over_quota,
            rate_limited: s.rate_limited,
            queue_full: s.lane_full,
            stale: s.stale,
            remove_failed: s.remove_failed,
            commit_failed: s.commit_failed,
            tenants,
            last_error: s.last_error.unwrap_or_default(),
            last_unsupported: s.last_unsupported.unwrap_or_default(),
        });
    }
}

/// The `rte_flow` provider over `ports` and its offload thread.
#[cfg(feature = "dpdk")]
fn start_rte_flow(
    ports: Vec<FlowPort>,
    table: usize,
    cfg: OffloadConfig,
    workers: usize,
) -> Result<(Offloader, Vec<Lane>)> {
    use dpu_dataplane::offload::rte_flow::{FlowMode, RteFlowNic};
    let nic = RteFlowNic::new(ports.clone(), table)
        .map_err(|e| anyhow::anyhow!("flow offload through rte_flow: {e}"))?;
    match nic.mode() {
        FlowMode::Transfer { proxy } => tracing::info!(
            proxy,
            "rte_flow: transfer rules on the ports' embedded switch"
        ),
        FlowMode::Ingress => {
            for (i, p) in ports.iter().enumerate() {
                let caps = nic.port_caps(i).unwrap_or_default();
                tracing::warn!(
                    port = %p.name,
                    driver = %p.driver,
                    counters = caps[0],
                    ages = caps[1],
                    untagged_match = caps[2],
                    tcp_flags = caps[3],
                    "rte_flow: the ports share no embedded switch; only drop rules go to hardware"
                );
            }
        }
    }
    Offloader::start(nic, cfg, workers).context("starting the offload thread")
}

#[cfg(not(feature = "dpdk"))]
fn start_rte_flow(
    _ports: Vec<FlowPort>,
    _table: usize,
    _cfg: OffloadConfig,
    _workers: usize,
) -> Result<(Offloader, Vec<Lane>)> {
    anyhow::bail!("dataplane.offload.provider = \"rte_flow\": this build has no DPDK")
}

fn by_name(c: SwitchConfig) -> BTreeMap<String, TenantConfig> {
    c.tenants.into_iter().map(|t| (t.name.clone(), t)).collect()
}
