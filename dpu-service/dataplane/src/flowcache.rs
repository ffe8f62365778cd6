//! An exact-match flow cache in front of the classifier, one per worker.
//!
//! It remembers, per tenant and 5-tuple, which rule the classifier found
//! (or that none matched), stamped with the configuration generation the
//! answer came from. A lookup only answers for the generation the worker
//! runs now, so no verdict of an older rule set is ever served: a new
//! configuration makes every entry a miss at once, without a flush.
//!
//! Two-way set associative, one 64-byte line per entry, allocated in full
//! when the worker starts; a full set replaces its older entry. Hashes are
//! keyed per cache.

use std::hash::BuildHasher;

use crate::parse::FlowKey;

/// A cached classification: the matching rule's tag, or `NO_RULE`.
const NO_RULE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Entry {
    key: FlowKey,
    tenant: u32,
    tag: u32,
    /// 0: empty (generations start at 1).
    generation: u64,
}

const EMPTY: Entry = Entry {
    key: FlowKey {
        src: 0,
        dst: 0,
        src_port: 0,
        dst_port: 0,
        proto: 0,
        v6: false,
    },
    tenant: 0,
    tag: NO_RULE,
    generation: 0,
};

/// One worker's flow cache.
#[derive(Debug)]
pub struct FlowCache {
    entries: Box<[Entry]>,
    /// Mask of a set's first index (even).
    mask: usize,
    hasher: hashbrown::DefaultHashBuilder,
    /// Which way of a full set to replace next.
    victim: usize,
}

impl FlowCache {
    /// A cache of `entries` entries (rounded up to a power of two, at
    /// least 2), allocated now.
    pub fn new(entries: usize) -> FlowCache {
        let n = entries.next_power_of_two().max(2);
        FlowCache {
            entries: vec![EMPTY; n].into_boxed_slice(),
            mask: (n - 1) & !1,
            hasher: hashbrown::DefaultHashBuilder::default(),
            victim: 0,
        }
    }

    fn set(&self, tenant: u32, key: &FlowKey) -> usize {
        self.hasher.hash_one((tenant, key)) as usize & self.mask
    }

    /// The cached classification of `key` for `tenant` under configuration
    /// `generation`: `Some(Some(tag))` for a rule, `Some(None)` for no
    /// rule, `None` if the cache does not know.
    #[inline]
    pub fn get(&self, tenant: u32, key: &FlowKey, generation: u64) -> Option<Option<u32>> {
        let i = self.set(tenant, key);
        self.entries[i..i + 2]
            .iter()
            .find(|e| e.generation == generation && e.tenant == tenant && e.key == *key)
            .map(|e| (e.tag != NO_RULE).then_some(e.tag))
    }

    /// Remembers that `key` of `tenant` classifies as `tag` under
    /// `generation`.
    #[inline]
    pub fn put(&mut self, tenant: u32, key: &FlowKey, generation: u64, tag: Option<u32>) {
        let i = self.set(tenant, key);
        let way = if self.entries[i].generation != generation {
            0
        } else if self.entries[i + 1].generation != generation {
            1
        } else {
            self.victim ^= 1;
            self.victim
        };
        self.entries[i + way] = Entry {
            key: *key,
            tenant,
            tag: tag.unwrap_or(NO_RULE),
            generation,
        };
    }

    /// Entries the cache holds room for.
    pub fn capacity(&self) -> usize {
        self.entries.len()
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
}
