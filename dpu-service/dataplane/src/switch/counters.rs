//! Tenant and rule counters as the packet path keeps them: per-worker
//! shards of cells, bumped without locked instructions. What they sum to
//! is in [`traffic`](super::traffic).

use std::sync::atomic::{AtomicU64, Ordering};

/// One tenant's counters in one worker's shard.
#[derive(Debug, Default)]
pub(super) struct TenantCells {
    pub(super) rx_packets: AtomicU64,
    pub(super) rx_bytes: AtomicU64,
    pub(super) forwarded: AtomicU64,
    pub(super) dropped: AtomicU64,
    /// Tracked connections now (a gauge the worker stores).
    pub(super) conntrack: AtomicU64,
}

/// One rule's counters in one worker's shard, on a cache line of its
/// own: at 40 bytes, one rule in four had the counters a match bumps
/// split over two lines, of which only the first was prefetched.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(super) struct RuleCells {
    pub(super) packets: AtomicU64,
    pub(super) bytes: AtomicU64,
    /// Unix seconds of the last match; 0: never.
    pub(super) last_hit: AtomicU64,
    /// Rate limit: tokens left, and when they were last refilled (the
    /// worker clock, microseconds).
    pub(super) tokens: AtomicU64,
    pub(super) stamp: AtomicU64,
}

/// Adds `n` to a cell only its own worker writes: a plain load and store,
/// no locked read-modify-write on the packet path.
#[inline]
pub(super) fn bump(cell: &AtomicU64, n: u64) {
    cell.store(
        cell.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

/// One worker's tenant and rule counters for one snapshot, on cache lines
/// of its own.
#[derive(Debug)]
#[repr(align(128))]
pub(super) struct Shard {
    pub(super) tenants: Box<[TenantCells]>,
    /// Per tenant, per rule tag.
    pub(super) rules: Box<[Box<[RuleCells]>]>,
}
