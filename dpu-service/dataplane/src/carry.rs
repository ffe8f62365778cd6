//! Table entries carried over from a previous process: what the
//! connection and fragment tables held when it stopped, aged by the time
//! that passed, read-only and shared by the new process's workers.
//!
//! Which worker a flow comes to depends on the NIC's RSS and on how many
//! workers there are, neither of which the previous process could know.
//! So carried entries are not spread among the workers' tables up front:
//! each worker adopts an entry into its own table when a packet of it
//! misses there ([`CarriedView::take`]), at most once (a connection that
//! closed after the restart must not come back from the carried copy when
//! its 5-tuple is used again). The map is dropped once its last entry
//! would have expired.
//!
//! The file these entries come from, its checks and what restoring them
//! counts are the switch's ([`crate::switch::SavedTables`]).

use std::hash::Hash;
use std::sync::Arc;

/// Carried entries by key, each with its index (for the workers' taken
/// bits), its expiry in seconds after the map was made, and its value.
///
/// Hashed with std's SipHash, not the tables' hasher: a second use of
/// the tables' key hashing with the same hasher type made the compiler
/// stop inlining it on the packet path (a stateful hit took 147 ns
/// instead of 118 in `benches/switch.rs`).
#[derive(Debug)]
pub(crate) struct Carried<K, V> {
    map: hashbrown::HashMap<K, (u32, u32, V), std::hash::RandomState>,
    /// The latest expiry of any entry.
    horizon: u32,
}

impl<K: Hash + Eq, V: Copy> Carried<K, V> {
    /// An empty map with room for `n` entries.
    pub(crate) fn with_capacity(n: usize) -> Carried<K, V> {
        Carried {
            map: hashbrown::HashMap::with_capacity_and_hasher(n, Default::default()),
            horizon: 0,
        }
    }

    /// Adds `value` under `key`, expiring `expires` seconds after the map
    /// was made. False (and nothing changes) if `key` is there already.
    pub(crate) fn insert(&mut self, key: K, expires: u32, value: V) -> bool {
        let index = self.map.len() as u32;
        match self.map.entry(key) {
            hashbrown::hash_map::Entry::Occupied(_) => false,
            hashbrown::hash_map::Entry::Vacant(v) => {
                v.insert((index, expires, value));
                self.horizon = self.horizon.max(expires);
                true
            }
        }
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

/// One worker's view of a carried map: the map, how many seconds after
/// it was made the worker's clock started, and which entries the worker
/// has adopted.
#[derive(Debug)]
pub(crate) struct CarriedView<K, V> {
    carried: Arc<Carried<K, V>>,
    offset: u64,
    taken: Vec<u64>,
}

impl<K: Hash + Eq, V: Copy> CarriedView<K, V> {
    /// A view of `carried` for a worker whose clock started `offset`
    /// seconds after the map was made.
    pub(crate) fn new(carried: Arc<Carried<K, V>>, offset: u64) -> CarriedView<K, V> {
        let words = carried.len().div_ceil(64);
        CarriedView {
            carried,
            offset,
            taken: vec![0; words],
        }
    }

    /// The entry under `key`, if it is live at `now` on the worker's clock
    /// and this worker has not taken it before: its expiry on the
    /// worker's clock and its value. Taken once.
    pub(crate) fn take(&mut self, key: &K, now: u64) -> Option<(u64, V)> {
        let &(index, expires, value) = self.carried.map.get(key)?;
        let expires = u64::from(expires).checked_sub(self.offset)?;
        let (word, bit) = (index as usize / 64, 1u64 << (index % 64));
        if expires <= now || self.taken[word] & bit != 0 {
            return None;
        }
        self.taken[word] |= bit;
        Some((expires, value))
    }

    /// True once every entry has expired at `now` on the worker's clock:
    /// the view can go.
    pub(crate) fn spent(&self, now: u64) -> bool {
        u64::from(self.carried.horizon) <= now.saturating_add(self.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_taken_once_while_live_on_the_workers_clock() {
        let mut c = Carried::with_capacity(4);
        assert!(c.insert(1u32, 100, 'a'));
        assert!(c.insert(2u32, 10, 'b'));
        assert!(!c.insert(1u32, 50, 'c'), "a key is carried once");
        let c = Arc::new(c);
        // This worker's clock started 5 s after the map was made.
        let mut v = CarriedView::new(c.clone(), 5);
        assert_eq!(v.take(&3, 0), None);
        assert_eq!(v.take(&2, 5), None, "expired at 10 s, 5 s on this clock");
        assert_eq!(v.take(&1, 20), Some((95, 'a')));
        assert_eq!(v.take(&1, 20), None, "taken already");
        // Another worker takes it for itself.
        let mut w = CarriedView::new(c, 0);
        assert_eq!(w.take(&1, 0), Some((100, 'a')));
        assert_eq!(w.take(&2, 9), Some((10, 'b')));
        assert!(!v.spent(94) && v.spent(95) && w.spent(100));
    }

    #[test]
    fn a_view_of_a_map_older_than_its_entries_takes_nothing() {
        let mut c = Carried::with_capacity(1);
        c.insert(7u8, 3, ());
        let mut v = CarriedView::new(Arc::new(c), 60);
        assert_eq!(v.take(&7, 0), None);
        assert!(v.spent(0));
    }
}
