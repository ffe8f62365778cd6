//! Publication: what a [`SwitchHandle`] shares with the pipelines it made:
//! the current snapshot and its generation, and what each pipeline
//! publishes of itself (the generation it has taken, its flow cache's
//! counts).
//!
//! [`SwitchHandle`]: super::SwitchHandle

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::flowcache::FlowCacheStats;

use super::compile::{Compiled, TenantIds};
use super::traffic::History;

pub(super) struct Shared {
    pub(super) generation: AtomicU64,
    /// Tenant IDs by name, kept across configurations.
    pub(super) ids: Mutex<TenantIds>,
    pub(super) current: Mutex<Arc<Compiled>>,
    /// Replaced snapshots and the counts of those no worker holds any more.
    pub(super) history: Mutex<History>,
    /// What each pipeline publishes of itself, and what dropped ones
    /// left behind.
    pub(super) pipelines: Mutex<Pipelines>,
    /// Each worker's link to the offloader, until its pipeline is made.
    pub(super) offload: Mutex<Vec<Option<crate::offload::OffloadLink>>>,
}

/// The pipelines a handle made.
#[derive(Default)]
pub(super) struct Pipelines {
    pub(super) live: Vec<Weak<PipelineCells>>,
    /// The flow-cache counts of dropped pipelines.
    pub(super) gone: FlowCacheStats,
    /// What stopped pipelines left of their tables.
    pub(super) saved: super::saved::SavedTables,
    /// Entries carried over from a previous process, for the pipelines
    /// made from now on.
    pub(super) carried: Option<Arc<super::saved::CarriedSet>>,
    /// What restoring them did.
    pub(super) restored: super::saved::RestoreReport,
}

/// What a pipeline publishes of itself.
#[derive(Default)]
pub(super) struct PipelineCells {
    /// The generation it has taken, for [`SwitchHandle::taken`].
    ///
    /// [`SwitchHandle::taken`]: super::SwitchHandle::taken
    pub(super) taken: AtomicU64,
    /// Its flow cache's counts, stored once a second.
    pub(super) cache_lookups: AtomicU64,
    pub(super) cache_hits: AtomicU64,
    pub(super) cache_rests: AtomicU64,
}

impl PipelineCells {
    pub(super) fn cache(&self) -> FlowCacheStats {
        FlowCacheStats {
            lookups: self.cache_lookups.load(Ordering::Relaxed),
            hits: self.cache_hits.load(Ordering::Relaxed),
            rests: self.cache_rests.load(Ordering::Relaxed),
        }
    }

    pub(super) fn store_cache(&self, s: FlowCacheStats) {
        self.cache_lookups.store(s.lookups, Ordering::Relaxed);
        self.cache_hits.store(s.hits, Ordering::Relaxed);
        self.cache_rests.store(s.rests, Ordering::Relaxed);
    }
}
