//! An exact-match flow cache in front of the classifier, one per worker.
//!
//! It remembers, per tenant and IPv4 5-tuple, which rule the classifier
//! found (or that none matched), stamped with the configuration generation
//! the answer came from. A lookup only answers for the generation the
//! worker runs now, so no verdict of an older rule set is ever served: a
//! new configuration makes every entry a miss at once, without a flush.
//!
//! Four-way set associative: an entry is 32 bytes, a set of four is two
//! cache lines, allocated in full when the worker starts. A set first
//! reuses an entry of an older generation, else replaces its ways in turn.
//! Hashes are keyed per cache. IPv6 keys are not cached: they would
//! double every entry for the few flows that have them.
//!
//! A cache that keeps missing (far more flows than entries, or a flood of
//! new ones) costs every lookup a hash, a probe and a write for nothing.
//! So it watches its hit rate over windows of [`WINDOW`] lookups: below
//! one in [`MIN_HIT_SHARE`], it rests for the next [`REST`] lookups,
//! which [`FlowCache::admit`] sends straight to the classifier, then
//! tries again with what it still holds. Its users count what it
//! answered ([`FlowCache::tally`]), a burst at a time.

use std::hash::BuildHasher;

use dpu_os::cache::prefetch;

use crate::wire::FlowKey;

/// A cached classification: the matching rule's tag, or `NO_RULE`.
const NO_RULE: u32 = u32::MAX;

/// Ways per set.
const WAYS: usize = 4;

/// Lookups over which the hit rate is judged.
pub const WINDOW: u32 = 4096;
/// A window with fewer hits than one lookup in this many sends the
/// cache to rest.
pub const MIN_HIT_SHARE: u32 = 4;
/// Lookups a resting cache lets pass: sixteen windows, so a cache that
/// never hits is used for one lookup in seventeen.
pub const REST: u32 = 16 * WINDOW;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(32))]
struct Entry {
    /// Source address above, destination below.
    addrs: u64,
    /// 0: empty (generations start at 1).
    generation: u64,
    /// Source port above, destination port below.
    ports: u32,
    tenant: u32,
    tag: u32,
    proto: u8,
}

const EMPTY: Entry = Entry {
    addrs: 0,
    generation: 0,
    ports: 0,
    tenant: 0,
    tag: NO_RULE,
    proto: 0,
};

/// One set: its ways on two cache lines of their own.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(128))]
struct Set([Entry; WAYS]);

/// The fields of an IPv4 key as the cache stores them; `None` for a key
/// it does not hold.
#[inline]
fn packed(key: &FlowKey) -> Option<(u64, u32, u8)> {
    let (src, dst) = (u32::try_from(key.src).ok()?, u32::try_from(key.dst).ok()?);
    (!key.v6).then_some((
        u64::from(src) << 32 | u64::from(dst),
        u32::from(key.src_port) << 16 | u32::from(key.dst_port),
        key.proto,
    ))
}

/// What a flow cache did: lookups it was admitted for, how many it
/// answered, and how often it went to rest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowCacheStats {
    /// Lookups made in the cache.
    pub lookups: u64,
    /// Lookups it answered.
    pub hits: u64,
    /// Windows after which it rested for missing too often.
    pub rests: u64,
}

impl FlowCacheStats {
    /// Adds `other` into these.
    pub fn add(&mut self, other: FlowCacheStats) {
        self.lookups += other.lookups;
        self.hits += other.hits;
        self.rests += other.rests;
    }
}

/// One worker's flow cache.
#[derive(Debug)]
pub struct FlowCache {
    sets: Box<[Set]>,
    /// Sets - 1 (a power of two).
    mask: usize,
    hasher: hashbrown::DefaultHashBuilder,
    /// Which way of a full set to replace next.
    victim: usize,
    /// Lookups still to let pass while resting; 0: in use.
    resting: u32,
    /// Since the cache was made.
    stats: FlowCacheStats,
    /// `stats` when the current window began.
    window: FlowCacheStats,
}

impl FlowCache {
    /// A cache of `entries` entries (rounded up to a power of two, at
    /// least one set of four), allocated now.
    pub fn new(entries: usize) -> FlowCache {
        let n = (entries.next_power_of_two() / WAYS).max(1);
        FlowCache {
            sets: vec![Set([EMPTY; WAYS]); n].into_boxed_slice(),
            mask: n - 1,
            hasher: hashbrown::DefaultHashBuilder::default(),
            victim: 0,
            resting: 0,
            stats: FlowCacheStats::default(),
            window: FlowCacheStats::default(),
        }
    }

    /// Whether the next `n` lookups should go through the cache: false
    /// while it rests after a window of too few hits (the lookups are
    /// then counted off its rest).
    #[inline]
    pub fn admit(&mut self, n: usize) -> bool {
        if self.resting == 0 {
            return true;
        }
        self.resting = self
            .resting
            .saturating_sub(u32::try_from(n).unwrap_or(u32::MAX));
        false
    }

    /// What the cache did since it was made.
    pub fn stats(&self) -> FlowCacheStats {
        self.stats
    }

    /// Counts `looked` lookups the cache was admitted for, `hits` of
    /// which it answered; judges each full window.
    #[inline]
    pub fn tally(&mut self, looked: usize, hits: usize) {
        self.stats.lookups += looked as u64;
        self.stats.hits += hits as u64;
        if self.stats.lookups - self.window.lookups >= u64::from(WINDOW) {
            self.judge();
        }
    }

    /// Ends a window: to rest if it hit too rarely.
    #[cold]
    #[inline(never)]
    fn judge(&mut self) {
        if self.stats.hits - self.window.hits < u64::from(WINDOW / MIN_HIT_SHARE) {
            self.resting = REST;
            self.stats.rests += 1;
        }
        self.window = self.stats;
    }

    /// The set `key` of `tenant` lives in, for [`FlowCache::get_in`] and
    /// [`FlowCache::put_in`]; `None` for a key the cache does not hold
    /// (IPv6).
    #[inline]
    pub fn set(&self, tenant: u32, key: &FlowKey) -> Option<usize> {
        let (addrs, ports, proto) = packed(key)?;
        let h = self
            .hasher
            .hash_one((addrs, u64::from(ports) << 32 | u64::from(tenant), proto));
        Some(h as usize & self.mask)
    }

    /// Starts loading set `set`, so that the lookups of a burst's keys
    /// wait for their cache misses together, not one after another.
    #[inline]
    pub fn prefetch(&self, set: usize) {
        if let Some(s) = self.sets.get(set) {
            prefetch(&s.0[0]);
            prefetch(&s.0[WAYS / 2]);
        }
    }

    /// The cached classification of `key` for `tenant` under configuration
    /// `generation`: `Some(Some(tag))` for a rule, `Some(None)` for no
    /// rule, `None` if the cache does not know.
    #[inline]
    pub fn get(&self, tenant: u32, key: &FlowKey, generation: u64) -> Option<Option<u32>> {
        self.get_in(self.set(tenant, key)?, tenant, key, generation)
    }

    /// [`FlowCache::get`] in set `set`, [`FlowCache::set`]'s answer for
    /// `tenant` and `key` (in another set it finds nothing, or this very
    /// key's entry: never a wrong answer).
    #[inline]
    pub fn get_in(
        &self,
        set: usize,
        tenant: u32,
        key: &FlowKey,
        generation: u64,
    ) -> Option<Option<u32>> {
        let (addrs, ports, proto) = packed(key)?;
        self.sets[set & self.mask]
            .0
            .iter()
            .find(|e| {
                e.generation == generation
                    && e.addrs == addrs
                    && e.ports == ports
                    && e.tenant == tenant
                    && e.proto == proto
            })
            .map(|e| (e.tag != NO_RULE).then_some(e.tag))
    }

    /// Remembers that `key` of `tenant` classifies as `tag` under
    /// `generation` (nothing for a key the cache does not hold).
    #[inline]
    pub fn put(&mut self, tenant: u32, key: &FlowKey, generation: u64, tag: Option<u32>) {
        if let Some(set) = self.set(tenant, key) {
            self.put_in(set, tenant, key, generation, tag);
        }
    }

    /// [`FlowCache::put`] in set `set`, [`FlowCache::set`]'s answer for
    /// `tenant` and `key`.
    #[inline]
    pub fn put_in(
        &mut self,
        set: usize,
        tenant: u32,
        key: &FlowKey,
        generation: u64,
        tag: Option<u32>,
    ) {
        let Some((addrs, ports, proto)) = packed(key) else {
            return;
        };
        let entry = Entry {
            addrs,
            generation,
            ports,
            tenant,
            tag: tag.unwrap_or(NO_RULE),
            proto,
        };
        let ways = &mut self.sets[set & self.mask].0;
        // The key's own entry (two frames of a flow in one burst both
        // missed), else a stale or empty way, else the next in turn.
        let same = |e: &Entry| {
            e.addrs == addrs && e.ports == ports && e.tenant == tenant && e.proto == proto
        };
        let way = match ways.iter().position(same) {
            Some(w) => w,
            None => match ways.iter().position(|e| e.generation != generation) {
                Some(w) => w,
                None => {
                    self.victim = (self.victim + 1) % WAYS;
                    self.victim
                }
            },
        };
        ways[way] = entry;
    }

    /// Entries the cache holds room for.
    pub fn capacity(&self) -> usize {
        self.sets.len() * WAYS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> FlowKey {
        FlowKey {
            src: u128::from(n),
            dst: 7,
            src_port: n as u16,
            dst_port: 53,
            proto: 17,
            v6: false,
        }
    }

    #[test]
    fn answers_only_for_its_generation_and_tenant() {
        let mut c = FlowCache::new(64);
        assert_eq!(c.get(1, &key(1), 1), None);
        c.put(1, &key(1), 1, Some(4));
        c.put(1, &key(2), 1, None);
        assert_eq!(c.get(1, &key(1), 1), Some(Some(4)));
        assert_eq!(c.get(1, &key(2), 1), Some(None), "no rule is an answer too");
        assert_eq!(c.get(2, &key(1), 1), None, "another tenant");
        assert_eq!(c.get(1, &key(1), 2), None, "a newer configuration");
        c.put(1, &key(1), 2, Some(9));
        assert_eq!(c.get(1, &key(1), 2), Some(Some(9)));
        assert_eq!(c.get(1, &key(1), 1), None, "the old answer is gone");
    }

    #[test]
    fn never_returns_a_wrong_answer_when_full() {
        // Far more flows than entries: whatever is found is right.
        let mut c = FlowCache::new(16);
        let tag = |n: u32| (!n.is_multiple_of(3)).then_some(n * 7);
        for round in 0..3 {
            for n in 0..1000 {
                if let Some(found) = c.get(0, &key(n), 1) {
                    assert_eq!(found, tag(n), "round {round}, flow {n}");
                }
                c.put(0, &key(n), 1, tag(n));
                assert_eq!(c.get(0, &key(n), 1), Some(tag(n)), "just put");
            }
        }
        assert_eq!(c.capacity(), 16);
    }

    #[test]
    fn four_flows_of_one_set_all_stay() {
        // One set: every key lands in it.
        let mut c = FlowCache::new(4);
        assert_eq!(c.capacity(), 4);
        c.put(0, &key(1), 1, Some(10));
        c.put(0, &key(1), 1, Some(11));
        for n in 2..=4 {
            c.put(0, &key(n), 1, Some(10 * n));
        }
        assert_eq!(
            c.get(0, &key(1), 1),
            Some(Some(11)),
            "one entry, the latest"
        );
        for n in 2..=4 {
            assert_eq!(c.get(0, &key(n), 1), Some(Some(10 * n)), "flow {n}");
        }
        c.put(0, &key(5), 1, None);
        assert_eq!(c.get(0, &key(5), 1), Some(None));
        let kept = (1..=4).filter(|&n| c.get(0, &key(n), 1).is_some()).count();
        assert_eq!(kept, 3, "a fifth flow replaces exactly one");
        // A new generation reuses stale ways before live ones.
        for n in 6..=9 {
            c.put(0, &key(n), 2, Some(n));
        }
        assert!((6..=9).all(|n| c.get(0, &key(n), 2) == Some(Some(n))));
    }

    #[test]
    fn ipv6_keys_are_not_cached() {
        let mut c = FlowCache::new(64);
        let mut k = key(1);
        k.v6 = true;
        assert_eq!(c.set(0, &k), None);
        c.put(0, &k, 1, Some(3));
        assert_eq!(c.get(0, &k, 1), None);
        let mut wide = key(1);
        wide.dst = 1 << 40;
        c.put(0, &wide, 1, Some(3));
        assert_eq!(c.get(0, &wide, 1), None, "no address bits are dropped");
        assert_eq!(c.get(0, &key(1), 1), None, "nor confused with a v4 key");
    }

    #[test]
    fn a_cache_that_keeps_missing_rests_then_tries_again() {
        let mut c = FlowCache::new(64);
        // Repeated flows hit: the cache stays in use.
        for n in 0..3 * WINDOW {
            assert!(c.admit(1), "lookup {n}");
            let k = key(n % 8);
            let hit = c.get(0, &k, 1).is_some();
            c.tally(1, usize::from(hit));
            if !hit {
                c.put(0, &k, 1, Some(1));
            }
        }
        assert_eq!(c.stats().rests, 0);
        // A flood of new flows: one window of misses, then it rests.
        let mut fresh = 1000;
        let mut miss = |c: &mut FlowCache| {
            fresh += 1;
            assert_eq!(c.get(0, &key(fresh), 1), None);
            c.tally(1, 0);
        };
        let mut looked = 0;
        while c.admit(1) {
            miss(&mut c);
            looked += 1;
            assert!(looked <= 2 * WINDOW, "never rests");
        }
        assert_eq!(c.stats().rests, 1);
        // The rest is counted in lookups, a burst at a time.
        let mut passed = 1;
        while !c.admit(32) {
            passed += 32;
            assert!(passed <= REST + 32, "rests for ever");
        }
        assert!(passed >= REST, "rested {passed} lookups");
        // Back in use; still missing, so back to rest after a window.
        for _ in 0..WINDOW {
            miss(&mut c);
        }
        assert!(!c.admit(1));
        assert_eq!(c.stats().rests, 2);
        // A quarter of hits keeps it in use.
        while !c.admit(1) {}
        c.put(0, &key(1), 1, Some(1));
        for n in 0..2 * WINDOW {
            if n % 4 == 0 {
                assert_eq!(c.get(0, &key(1), 1), Some(Some(1)), "still held");
                c.tally(1, 1);
            } else {
                miss(&mut c);
            }
        }
        assert!(c.admit(1));
        assert_eq!(c.stats().rests, 2);
    }

    #[test]
    fn entries_and_sets_keep_their_size() {
        assert_eq!(std::mem::size_of::<Entry>(), 32);
        assert_eq!(std::mem::size_of::<Set>(), 128);
    }
}
