//! [`SwitchPipeline`], one worker's switch: the state the burst loop
//! ([`pipeline`](super::pipeline)) and the stages of a frame
//! ([`inspect`](super::inspect), [`memo`](super::recall),
//! [`filter`](super::filter), [`decide`](super::decide)) work on, each
//! file adding its methods. Declared here, below all of them, so that the
//! stages and the loop need not import one another.

use std::sync::Arc;
use std::time::Instant;

use crate::conntrack::{ConnKey, ConnTable};
use crate::flowcache::{FlowCache, FlowCacheStats};
use crate::fragtrack::FragTable;
use crate::l2memo::L2Memo;
use crate::mactable::MacTable;
use crate::worker::BURST;

use super::compile::Compiled;
use super::epoch::{PipelineCells, Shared};
use super::frame::Inspected;

/// Most remote VTEPs (and next hops) a worker knows the MAC address of.
pub(super) const NEIGHBOURS_MAX: usize = 4096;

/// The switch pipeline of one worker: its snapshot, its MAC table, its
/// connection table.
pub struct SwitchPipeline {
    pub(super) conns: ConnTable,
    /// Fragmented datagrams whose first fragment passed.
    pub(super) frags: FragTable,
    pub(super) cache: FlowCache,
    pub(super) shared: Arc<Shared>,
    pub(super) generation: u64,
    /// What the handle sees of this pipeline: `generation` (stored when
    /// it changes), the flow cache's counts (once a second).
    pub(super) cells: Arc<PipelineCells>,
    pub(super) compiled: Arc<Compiled>,
    /// This worker's index.
    pub(super) worker: usize,
    /// Its counter shard in `compiled.shards` (the worker's index modulo
    /// their number, worked out once per snapshot: a division per packet
    /// costs more than the rest of the counting).
    pub(super) shard: usize,
    /// Unix seconds, read once per turn (rule last-hit times).
    pub(super) unix_now: u64,
    pub(super) macs: MacTable,
    /// Decisions by link-layer header, for tenants that switch unparsed.
    pub(super) memo: L2Memo,
    /// MAC addresses of remote VTEPs by (port, IPv4 address), and when
    /// they were last seen: learned from their ARP and VXLAN frames.
    pub(super) neighbours: hashbrown::HashMap<(u32, u32), ([u8; 6], u64)>,
    /// Coarse clock, read once per turn.
    pub(super) now: u64,
    /// The same clock in microseconds (rate limits).
    pub(super) now_us: u64,
    pub(super) epoch: Instant,
    pub(super) last_sweep: u64,
    /// The frames of a burst between its stages (kept for its memory).
    pub(super) stage: Vec<Inspected>,
    /// Their connection keys, when a tenant tracks connections: made
    /// (and hashed) once a frame.
    pub(super) conn_keys: [Option<ConnKey>; BURST],
    /// The link to the offloader, if flows are offloaded.
    pub(super) offload: Option<Box<crate::offload::OffloadLink>>,
    /// Every flow of the offloader's lane is to be withdrawn (moves of
    /// stations were more than could be named one by one).
    pub(super) withdraw_all_pending: bool,
}

impl Drop for SwitchPipeline {
    /// Leaves the flow cache's counts to the handle. Under the handle's
    /// lock, so that a reader sees them either here or there.
    fn drop(&mut self) {
        let mut p = self
            .shared
            .pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        p.gone.add(self.cache.stats());
        self.cells.store_cache(FlowCacheStats::default());
    }
}

impl std::fmt::Debug for SwitchPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwitchPipeline")
            .field("generation", &self.generation)
            .field("learned", &self.macs.len())
            .field("connections", &self.conns.len())
            .finish_non_exhaustive()
    }
}
