//! Removal from an open-addressed table with linear probing, shared by
//! the connection table and the fragment table: backward-shift deletion,
//! which keeps every probe chain unbroken without tombstones.

/// A bucket of such a table: whether it holds an entry, and that entry's
/// hash (its home bucket is `hash & mask`).
pub(crate) trait Probed: Copy {
    /// True if the bucket holds an entry.
    fn used(&self) -> bool;
    /// Marks the bucket empty.
    fn clear(&mut self);
    /// The entry's hash.
    fn hash(&self) -> u32;
}

/// Empties bucket `slot` of `buckets` (a power-of-two table, `mask` its
/// size less one) and moves later entries of its probe chain back into
/// the gap, so that every entry stays reachable from its home bucket.
/// Slot numbers taken before are stale after.
pub(crate) fn remove<B: Probed>(buckets: &mut [B], mask: usize, slot: usize) {
    let mut i = slot;
    if !buckets[i].used() {
        return;
    }
    buckets[i].clear();
    let mut j = i;
    loop {
        j = (j + 1) & mask;
        if !buckets[j].used() {
            return;
        }
        let home = buckets[j].hash() as usize & mask;
        // An entry stays if its home lies cyclically in (i, j].
        let stays = if i <= j {
            i < home && home <= j
        } else {
            i < home || home <= j
        };
        if !stays {
            buckets[i] = buckets[j];
            buckets[j].clear();
            i = j;
        }
    }
}
