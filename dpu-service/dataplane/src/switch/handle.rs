//! [`SwitchHandle`]: publishes configurations, reads the counters, makes
//! the workers' pipelines and tells when they have all taken a
//! configuration.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::conntrack::ConnTable;
use crate::flowcache::{FlowCache, FlowCacheStats};
use crate::fragtrack::FragTable;
use crate::l2memo::L2Memo;
use crate::mactable::MacTable;
use crate::worker::BURST;

use super::compile::{Compiled, Published, TenantIds};
use super::config::{ConfigError, SwitchConfig};
use super::epoch::{PipelineCells, Pipelines, Shared};
use super::state::{SwitchPipeline, NEIGHBOURS_MAX};
use super::traffic::{History, Traffic};

/// Publishes switch configurations to the workers' pipelines.
#[derive(Clone)]
pub struct SwitchHandle {
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for SwitchHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwitchHandle")
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl SwitchHandle {
    /// A handle publishing `config` first.
    ///
    /// # Errors
    /// [`ConfigError`] if `config` does not compile.
    pub fn new(config: &SwitchConfig) -> Result<SwitchHandle, ConfigError> {
        let mut ids = TenantIds::default();
        let first = Compiled::compile(config, &mut ids, None)?;
        Ok(SwitchHandle {
            shared: Arc::new(Shared {
                generation: AtomicU64::new(1),
                ids: Mutex::new(ids),
                current: Mutex::new(Arc::new(first)),
                history: Mutex::new(History::default()),
                pipelines: Mutex::new(Pipelines::default()),
                offload: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The stable ID of the tenant named `name` (kept across
    /// configurations), if it was ever configured.
    pub fn tenant_id(&self, name: &str) -> Option<u32> {
        let ids = self.shared.ids.lock().unwrap_or_else(|e| e.into_inner());
        ids.tenant_id(name)
    }

    /// Every tenant ever configured, by stable ID.
    pub fn tenant_names(&self) -> std::collections::HashMap<u32, String> {
        let ids = self.shared.ids.lock().unwrap_or_else(|e| e.into_inner());
        ids.tenant_names()
    }

    /// Every rule configured now, by its stable ID: (tenant name, rule
    /// ID). Offloaded flows of stateless verdicts name their rule so.
    pub fn rule_names(&self) -> std::collections::HashMap<u32, (String, String)> {
        let ids = self.shared.ids.lock().unwrap_or_else(|e| e.into_inner());
        let tenants = ids.tenant_names();
        ids.rule_names()
            .into_iter()
            .filter_map(|(id, (t, r))| Some((id, (tenants.get(&t)?.clone(), r.to_string()))))
            .collect()
    }

    /// Gives each worker's pipeline, made from now on by
    /// [`SwitchHandle::pipeline_for`], its link to the offloader (in
    /// worker order): its switch then offers established connections to
    /// flow hardware and, with the model provider, runs the model in
    /// front of itself.
    pub fn attach_offload(&self, links: Vec<crate::offload::OffloadLink>) {
        let mut o = self
            .shared
            .offload
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *o = links.into_iter().map(Some).collect();
    }

    /// Compiles `config` on the calling thread and publishes it; workers
    /// switch to it at their next turn. On error nothing changes.
    ///
    /// A tenant whose rules differ from the current configuration's by a
    /// few removed, added or edited rules (at most [`OVERLAY_MAX`] in
    /// all) keeps its classifier with those changes applied
    /// ([`Classifier::with_changes`]), so a single-rule change costs
    /// microseconds, not a build; a tenant whose rules are the same
    /// shares its classifier.
    ///
    /// [`OVERLAY_MAX`]: crate::classify::OVERLAY_MAX
    /// [`Classifier::with_changes`]: crate::classify::Classifier::with_changes
    ///
    /// # Errors
    /// [`ConfigError`] if `config` does not compile.
    pub fn publish(&self, config: &SwitchConfig) -> Result<Published, ConfigError> {
        let compiled = {
            let mut ids = self.shared.ids.lock().unwrap_or_else(|e| e.into_inner());
            // Publishers take turns here, so the snapshot patched is the
            // current one.
            let (_, prev) = self.load();
            // On error the new names stay known: harmless, IDs are only keys.
            Arc::new(Compiled::compile(config, &mut ids, Some(&prev))?)
        };
        let mut cur = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut stats = compiled.stats;
        let old = std::mem::replace(&mut *cur, compiled);
        stats.generation = self.shared.generation.fetch_add(1, Ordering::Release) + 1;
        drop(cur);
        let mut h = self
            .shared
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Whether or not anybody reads counters, a replaced snapshot (and
        // its classifiers) is let go once every worker has.
        h.fold_released();
        h.retired.push(old);
        Ok(stats)
    }

    /// Tenant and rule counters: the current snapshot's, plus those of
    /// replaced snapshots for the tenants and rules the current
    /// configuration still has (by name and rule ID). Counts of a deleted
    /// rule or tenant are forgotten once no worker uses its last snapshot.
    pub fn traffic(&self) -> Traffic {
        let (_, current) = self.load();
        let mut h = self
            .shared
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        h.fold_released();
        // Sets, not scans: a tenant may have 65,536 rules.
        let tenants: std::collections::HashSet<&str> =
            current.tenants.iter().map(|c| c.name.as_str()).collect();
        let rules: std::collections::HashSet<(&str, &str)> = current
            .tenants
            .iter()
            .flat_map(|c| c.slots.iter().flatten().map(|r| (c.name.as_str(), &*r.id)))
            .collect();
        let live = |t: &str| tenants.contains(t);
        let live_rule = |t: &str, r: &str| rules.contains(&(t, r));
        h.carried.tenants.retain(|t, _| live(t));
        h.carried.rules.retain(|(t, r), _| live_rule(t, r));
        let mut out = h.carried.clone();
        for r in &h.retired {
            out.merge(&r.traffic(false));
        }
        drop(h);
        out.merge(&current.traffic(true));
        out.tenants.retain(|t, _| live(t));
        out.rules.retain(|(t, r), _| live_rule(t, r));
        out
    }

    /// The storage endpoints of the current configuration with their
    /// virtual ports: where a worker hands a frame forwarded to port
    /// `port` (beyond the driver's), and which port the endpoint's own
    /// frames enter through.
    pub fn endpoint_ports(&self) -> Vec<super::EndpointPort> {
        let (_, current) = self.load();
        current.endpoints.clone()
    }

    /// The storage endpoints of the current configuration with their
    /// queues, in port order.
    pub fn endpoint_links(&self) -> Vec<super::EndpointLink> {
        let (_, current) = self.load();
        let Some(table) = current.endpoint_queues.as_ref() else {
            return Vec::new();
        };
        current
            .endpoints
            .iter()
            .zip(&current.endpoint_tenants)
            .enumerate()
            .filter_map(|(i, (p, tenant))| {
                Some(super::EndpointLink {
                    tenant: tenant.clone(),
                    endpoint: p.endpoint,
                    port: p.port,
                    queues: table.get_arc(i)?,
                })
            })
            .collect()
    }

    /// How many configurations have been published.
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    /// True once every pipeline still alive has taken configuration
    /// `generation` (or a later one) at a turn; true without pipelines.
    pub fn taken(&self, generation: u64) -> bool {
        self.live_pipelines().live.iter().all(|p| {
            p.upgrade()
                .is_none_or(|c| c.taken.load(Ordering::Acquire) >= generation)
        })
    }

    /// The flow caches' counts, summed over the pipelines, as each last
    /// stored them (once a second), dropped ones included.
    pub fn flow_cache(&self) -> FlowCacheStats {
        let p = self.live_pipelines();
        let mut sum = p.gone;
        for c in p.live.iter().filter_map(Weak::upgrade) {
            sum.add(c.cache());
        }
        sum
    }

    /// Waits until [`SwitchHandle::taken`] holds for `generation`,
    /// polling, for at most `limit`; answers whether it does.
    pub fn wait_taken(&self, generation: u64, limit: Duration) -> bool {
        let start = Instant::now();
        let mut nap = Duration::from_micros(10);
        while !self.taken(generation) {
            if start.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(1));
        }
        true
    }

    /// The pipelines, dropped ones forgotten.
    fn live_pipelines(&self) -> std::sync::MutexGuard<'_, Pipelines> {
        let mut all = self
            .shared
            .pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        all.live.retain(|p| p.strong_count() > 0);
        all
    }

    /// A pipeline for worker 0.
    pub fn pipeline(&self) -> SwitchPipeline {
        self.pipeline_for(0)
    }

    /// A pipeline for worker `worker`, counting into that worker's shard
    /// (workers beyond [`SwitchConfig::workers`] share shards, and may
    /// then undercount).
    pub fn pipeline_for(&self, worker: usize) -> SwitchPipeline {
        let (generation, compiled) = self.load();
        let mut macs = MacTable::new(compiled.mac_table_size);
        macs.reset(compiled.mac_limits);
        let mut conns = ConnTable::with_shares(compiled.conntrack, compiled.conntrack_timeouts);
        let mut frags = FragTable::new(compiled.fragments);
        compiled.share_tables(&mut conns, &mut frags);
        let cells = Arc::new(PipelineCells {
            taken: AtomicU64::new(generation),
            ..PipelineCells::default()
        });
        let carried = {
            let mut p = self.live_pipelines();
            p.live.push(Arc::downgrade(&cells));
            p.carried.clone()
        };
        let mut pipeline = SwitchPipeline {
            conns,
            frags,
            cache: FlowCache::new(compiled.flow_cache_entries),
            shared: self.shared.clone(),
            generation,
            shard: worker % compiled.shards.len().max(1),
            compiled,
            worker,
            cells,
            unix_now: 0,
            macs,
            memo: L2Memo::new(),
            neighbours: hashbrown::HashMap::with_capacity(NEIGHBOURS_MAX),
            now: 0,
            now_us: 0,
            epoch: Instant::now(),
            last_sweep: 0,
            stage: Vec::with_capacity(BURST),
            conn_keys: [None; BURST],
            offload: self
                .shared
                .offload
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(worker)
                .and_then(Option::take)
                .map(Box::new),
            withdraw_all_pending: false,
        };
        if pipeline.offload.is_some() {
            pipeline.macs.keep_moves();
        }
        if let Some(set) = carried {
            pipeline.carry(&set);
        }
        pipeline
    }

    pub(super) fn load(&self) -> (u64, Arc<Compiled>) {
        let cur = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Read under the lock: the generation matches the snapshot.
        (self.shared.generation.load(Ordering::Acquire), cur.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::testing::*;

    #[test]
    fn a_new_configuration_applies_at_the_next_turn() {
        let (h, mut p) = switch(2, vec![tenant("t1", &[(0, 0), (1, 0)], true)]);
        run(&mut p, 1, udp(2, BCAST, None, 53));
        assert_eq!(
            run(&mut p, 0, udp(1, mac(2), None, 53)).0,
            Verdict::Forward(Egress::to(1))
        );
        h.publish(&SwitchConfig {
            ports: 2,
            tenants: vec![tenant("t1", &[(0, 0), (1, 0)], false)],
            ..SwitchConfig::default()
        })
        .unwrap();
        // Until the worker's next turn the old snapshot holds.
        assert_eq!(
            run(&mut p, 0, udp(1, mac(2), None, 53)).0,
            Verdict::Forward(Egress::to(1))
        );
        p.turn();
        assert_eq!(
            run(&mut p, 0, udp(1, mac(2), None, 53)).0,
            Verdict::Drop(DropReason::AclDeny)
        );
        // A bad configuration changes nothing.
        let bad = SwitchConfig {
            ports: 2,
            tenants: vec![tenant("a", &[(0, 0)], true), tenant("b", &[(0, 5)], true)],
            ..SwitchConfig::default()
        };
        assert!(matches!(h.publish(&bad), Err(ConfigError::Overlap { .. })));
        let g = h.generation();
        p.turn();
        assert_eq!(p.generation, g);
    }

    #[test]
    fn the_handle_waits_until_every_pipeline_took_a_configuration() {
        let (h, mut p) = switch(2, vec![tenant("t1", &[(0, 0), (1, 0)], true)]);
        let mut q = h.pipeline_for(1);
        let gone = h.pipeline_for(2);
        assert!(h.taken(h.generation()), "they start with the current one");
        let g = h
            .publish(&SwitchConfig {
                ports: 2,
                tenants: vec![tenant("t1", &[(0, 0), (1, 0)], false)],
                ..SwitchConfig::default()
            })
            .unwrap()
            .generation;
        drop(gone);
        let waiter = {
            let h = h.clone();
            std::thread::spawn(move || h.wait_taken(g, Duration::from_secs(30)))
        };
        assert!(!h.wait_taken(g, Duration::from_millis(20)));
        p.turn();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished(), "one pipeline has not turned");
        assert!(!h.taken(g));
        q.turn();
        assert!(waiter.join().unwrap());
        assert!(h.taken(g));
        // Once every pipeline is gone there is nobody to wait for.
        drop((p, q));
        let h2 = SwitchHandle::new(&SwitchConfig::default()).unwrap();
        let g2 = h2.publish(&SwitchConfig::default()).unwrap().generation;
        assert!(h2.wait_taken(g2, Duration::ZERO));
    }
}
