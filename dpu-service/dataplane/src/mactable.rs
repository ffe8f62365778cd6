//! A worker's MAC learning table: where each tenant's MAC addresses were
//! last seen, and when.
//!
//! Most frames of an attachment come from the same source MAC and go to
//! the same destination as the frame before them (a VM behind a VF
//! representor talking to its peer or gateway). The table remembers, for
//! each attachment, the source it last learned and the destination it
//! last looked up, so that such a frame costs a few comparisons instead
//! of two hash lookups. A remembered answer is used only while the table
//! has not been written since it was given and within the same second
//! (learned entries carry their second; ageing is in seconds), so it is
//! always the answer the table itself would give.

/// One learned address: where it was seen and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Learned {
    attachment: u32,
    /// For a VXLAN attachment: the remote VTEP it was seen behind.
    vtep: u32,
    seen: u64,
}

/// Attachments whose last answers are remembered (direct-mapped).
const MEMO_SLOTS: usize = 64;

/// The last source learned on an attachment.
#[derive(Debug, Clone, Copy, Default)]
struct LearnMemo {
    /// The table's version when it was learned (0: empty).
    version: u64,
    tenant: u32,
    attachment: u32,
    mac: [u8; 6],
    vtep: u32,
    seen: u64,
}

/// The last destination looked up from an attachment.
#[derive(Debug, Clone, Copy, Default)]
struct LookMemo {
    /// The table's version when it was looked up (0: empty).
    version: u64,
    now: u64,
    tenant: u32,
    from: u32,
    mac: [u8; 6],
    found: Option<(u32, u32)>,
}

fn slot(tenant: u32, attachment: u32) -> usize {
    (tenant.wrapping_mul(0x9e37_79b9) ^ attachment) as usize % MEMO_SLOTS
}

/// The MAC table of one worker: bounded, never allocating once created.
#[derive(Debug)]
pub(crate) struct MacTable {
    map: hashbrown::HashMap<(u32, [u8; 6]), Learned>,
    capacity: usize,
    /// Bumped by every write to `map`: remembered answers of an older
    /// version are stale.
    version: u64,
    learned: [LearnMemo; MEMO_SLOTS],
    looked: [LookMemo; MEMO_SLOTS],
}

impl MacTable {
    /// An empty table of at most `capacity` addresses.
    pub(crate) fn new(capacity: usize) -> MacTable {
        MacTable {
            map: hashbrown::HashMap::with_capacity(capacity),
            capacity,
            version: 1,
            learned: [LearnMemo::default(); MEMO_SLOTS],
            looked: [LookMemo::default(); MEMO_SLOTS],
        }
    }

    /// Addresses learned.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The table's version: it changes with every write, so that an
    /// answer derived from the table holds while it has not changed.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// Forgets every address.
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.version += 1;
    }

    /// Forgets the addresses not seen for `ageing` seconds at `now`.
    pub(crate) fn age(&mut self, now: u64, ageing: u64) {
        self.map.retain(|_, e| now.saturating_sub(e.seen) < ageing);
        self.version += 1;
    }

    /// Records that `mac` of `tenant` was seen at `now` on `attachment`
    /// (behind remote VTEP `vtep`, 0 for none). A new address is not
    /// learned while the table is full.
    #[inline(always)]
    pub(crate) fn learn(
        &mut self,
        tenant: u32,
        mac: [u8; 6],
        attachment: u32,
        vtep: u32,
        now: u64,
    ) {
        let s = slot(tenant, attachment);
        let m = &self.learned[s];
        if m.version == self.version
            && m.seen == now
            && m.mac == mac
            && m.tenant == tenant
            && m.attachment == attachment
            && m.vtep == vtep
        {
            // The table holds exactly this already.
            return;
        }
        self.learn_in_map(s, tenant, mac, attachment, vtep, now);
    }

    /// [`MacTable::learn`] past its memo: the table itself.
    #[inline(never)]
    fn learn_in_map(
        &mut self,
        s: usize,
        tenant: u32,
        mac: [u8; 6],
        attachment: u32,
        vtep: u32,
        now: u64,
    ) {
        let entry = Learned {
            attachment,
            vtep,
            seen: now,
        };
        let key = (tenant, mac);
        if let Some(e) = self.map.get_mut(&key) {
            if *e != entry {
                *e = entry;
                self.version += 1;
            }
        } else if self.map.len() < self.capacity {
            // Within the reserved capacity: no allocation.
            self.map.insert(key, entry);
            self.version += 1;
        } else {
            return;
        }
        self.learned[s] = LearnMemo {
            version: self.version,
            tenant,
            attachment,
            mac,
            vtep,
            seen: now,
        };
    }

    /// The attachment `mac` of `tenant` was learned on and its remote
    /// VTEP, unless not seen for `ageing` seconds at `now`; `from` is the
    /// attachment asking.
    #[inline(always)]
    pub(crate) fn lookup(
        &mut self,
        tenant: u32,
        from: u32,
        mac: [u8; 6],
        now: u64,
        ageing: u64,
    ) -> Option<(u32, u32)> {
        let s = slot(tenant, from);
        let m = &self.looked[s];
        if m.version == self.version
            && m.now == now
            && m.mac == mac
            && m.tenant == tenant
            && m.from == from
        {
            return m.found;
        }
        self.lookup_in_map(s, tenant, from, mac, now, ageing)
    }

    /// [`MacTable::lookup`] past its memo: the table itself.
    #[inline(never)]
    fn lookup_in_map(
        &mut self,
        s: usize,
        tenant: u32,
        from: u32,
        mac: [u8; 6],
        now: u64,
        ageing: u64,
    ) -> Option<(u32, u32)> {
        let found = self
            .map
            .get(&(tenant, mac))
            .filter(|e| now.saturating_sub(e.seen) < ageing)
            .map(|e| (e.attachment, e.vtep));
        self.looked[s] = LookMemo {
            version: self.version,
            now,
            tenant,
            from,
            mac,
            found,
        };
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table without its memory of recent answers.
    #[derive(Default)]
    struct Plain {
        map: std::collections::HashMap<(u32, [u8; 6]), Learned>,
    }

    impl Plain {
        fn learn(&mut self, cap: usize, t: u32, mac: [u8; 6], a: u32, vtep: u32, now: u64) {
            let e = Learned {
                attachment: a,
                vtep,
                seen: now,
            };
            if let Some(old) = self.map.get_mut(&(t, mac)) {
                *old = e;
            } else if self.map.len() < cap {
                self.map.insert((t, mac), e);
            }
        }

        fn lookup(&self, t: u32, mac: [u8; 6], now: u64, ageing: u64) -> Option<(u32, u32)> {
            self.map
                .get(&(t, mac))
                .filter(|e| now.saturating_sub(e.seen) < ageing)
                .map(|e| (e.attachment, e.vtep))
        }
    }

    /// Random learning, lookups, moves, ageing and clearing over few
    /// tenants, attachments and addresses: every answer is the table's.
    #[test]
    fn remembered_answers_are_the_tables() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for round in 0..50 {
            let cap = 1 + next(12) as usize;
            let ageing = next(4);
            let mut t = MacTable::new(cap);
            let mut p = Plain::default();
            let mut now = 0;
            for step in 0..4000 {
                let tenant = next(3) as u32;
                let a = next(3) as u32;
                let mac = [2, 0, 0, 0, 0, next(5) as u8];
                match next(100) {
                    0 => now += 1,
                    1 if next(4) == 0 => {
                        t.clear();
                        p.map.clear();
                    }
                    2 => {
                        t.age(now, ageing);
                        p.map.retain(|_, e| now.saturating_sub(e.seen) < ageing);
                    }
                    3..=50 => {
                        let vtep = next(2) as u32;
                        t.learn(tenant, mac, a, vtep, now);
                        p.learn(cap, tenant, mac, a, vtep, now);
                    }
                    _ => assert_eq!(
                        t.lookup(tenant, a, mac, now, ageing),
                        p.lookup(tenant, mac, now, ageing),
                        "round {round} step {step}"
                    ),
                }
                assert_eq!(t.len(), p.map.len(), "round {round} step {step}");
            }
        }
    }

    #[test]
    fn relearning_the_same_source_writes_nothing() {
        let mut t = MacTable::new(4);
        let mac = [2, 0, 0, 0, 0, 1];
        t.learn(1, mac, 0, 0, 5);
        let v = t.version;
        t.learn(1, mac, 0, 0, 5);
        assert_eq!(t.version, v, "the same fact again");
        assert_eq!(t.lookup(1, 1, mac, 5, 300), Some((0, 0)));
        // Moved to another attachment: written, and the old answer is gone.
        t.learn(1, mac, 1, 0, 5);
        assert!(t.version > v);
        assert_eq!(t.lookup(1, 1, mac, 5, 300), Some((1, 0)));
        // A new second is written (the entry's age).
        let v = t.version;
        t.learn(1, mac, 1, 0, 6);
        assert!(t.version > v);
    }

    #[test]
    fn a_full_table_learns_nothing_new() {
        let mut t = MacTable::new(1);
        t.learn(0, [2, 0, 0, 0, 0, 1], 0, 0, 0);
        t.learn(0, [2, 0, 0, 0, 0, 2], 1, 0, 0);
        t.learn(0, [2, 0, 0, 0, 0, 2], 1, 0, 0);
        assert_eq!(t.len(), 1);
        assert_eq!(t.lookup(0, 0, [2, 0, 0, 0, 0, 2], 0, 300), None);
    }
}
