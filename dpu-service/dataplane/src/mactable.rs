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

/// How many addresses a tenant, and one attachment, may have in the
/// table (port security): a new address beyond them is refused.
///
/// Every tenant is guaranteed `reserved` entries that no other tenant's
/// addresses can take; the rest of the table (its capacity less
/// `reserved` for each of `tenants`) is a pool shared by all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MacLimits {
    /// Most addresses of one tenant.
    pub(crate) per_tenant: u32,
    /// Most addresses of one attachment.
    pub(crate) per_attachment: u32,
    /// Entries kept for each tenant (at most the table's capacity over
    /// `tenants`).
    pub(crate) reserved: u32,
    /// The tenants the reserve is kept for.
    pub(crate) tenants: u32,
}

impl MacLimits {
    /// No limit but the table's capacity, no reserve.
    pub(crate) const NONE: MacLimits = MacLimits {
        per_tenant: u32::MAX,
        per_attachment: u32::MAX,
        reserved: 0,
        tenants: 0,
    };
}

/// The MAC table of one worker: bounded, never allocating once created.
#[derive(Debug)]
pub(crate) struct MacTable {
    map: hashbrown::HashMap<(u32, [u8; 6]), Learned>,
    capacity: usize,
    limits: MacLimits,
    /// Addresses by tenant (tenants with none have no entry).
    per_tenant: hashbrown::HashMap<u32, u32>,
    /// Addresses by (tenant, attachment) (none: no entry).
    per_attachment: hashbrown::HashMap<(u32, u32), u32>,
    /// The entries held in tenants' reserves: the sum over tenants of
    /// their addresses, each tenant's counted up to `limits.reserved`.
    in_reserve: usize,
    /// Bumped by every write to `map`: remembered answers of an older
    /// version are stale.
    version: u64,
    learned: [LearnMemo; MEMO_SLOTS],
    looked: [LookMemo; MEMO_SLOTS],
    /// Addresses that moved to another attachment since the last
    /// [`MacTable::take_moves`], when moves are kept
    /// ([`MacTable::keep_moves`]); at most [`MOVES_KEPT`], past which
    /// `moves_lost` says some were not kept.
    moves: Vec<(u32, [u8; 6])>,
    moves_lost: bool,
    keep_moves: bool,
}

/// Moves a table keeps between two [`MacTable::take_moves`].
pub(crate) const MOVES_KEPT: usize = 256;

impl MacTable {
    /// An empty table of at most `capacity` addresses.
    pub(crate) fn new(capacity: usize) -> MacTable {
        MacTable {
            map: hashbrown::HashMap::with_capacity(capacity),
            capacity,
            limits: MacLimits::NONE,
            per_tenant: hashbrown::HashMap::with_capacity(capacity),
            per_attachment: hashbrown::HashMap::with_capacity(capacity),
            in_reserve: 0,
            version: 1,
            learned: [LearnMemo::default(); MEMO_SLOTS],
            looked: [LookMemo::default(); MEMO_SLOTS],
            moves: Vec::new(),
            moves_lost: false,
            keep_moves: false,
        }
    }

    /// Keeps the addresses that move from now on, for
    /// [`MacTable::take_moves`] (what flow offload needs: a flow to a
    /// station that moved forwards to its old port).
    pub(crate) fn keep_moves(&mut self) {
        self.keep_moves = true;
        self.moves = Vec::with_capacity(MOVES_KEPT);
    }

    /// Hands `f` the (tenant, address) pairs that moved, oldest first,
    /// until it refuses one (returns false): that one and the later ones
    /// are kept for the next call. Returns whether more moved than were
    /// kept since the last call, and clears that.
    pub(crate) fn take_moves(&mut self, mut f: impl FnMut(u32, [u8; 6]) -> bool) -> bool {
        let taken = self
            .moves
            .iter()
            .position(|&(t, m)| !f(t, m))
            .unwrap_or(self.moves.len());
        self.moves.drain(..taken);
        std::mem::take(&mut self.moves_lost)
    }

    /// Whether any address moved since the last [`MacTable::take_moves`].
    pub(crate) fn moved(&self) -> bool {
        !self.moves.is_empty() || self.moves_lost
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
        self.per_tenant.clear();
        self.per_attachment.clear();
        self.in_reserve = 0;
        self.version += 1;
    }

    /// Forgets every address and applies `limits` from now on (the
    /// reserve clamped to the table's capacity over the tenants).
    pub(crate) fn reset(&mut self, limits: MacLimits) {
        self.clear();
        let fair = self.capacity / (limits.tenants.max(1) as usize);
        self.limits = MacLimits {
            reserved: limits.reserved.min(fair.try_into().unwrap_or(u32::MAX)),
            ..limits
        };
    }

    /// Addresses of `tenant`.
    #[cfg(test)]
    pub(crate) fn tenant_len(&self, tenant: u32) -> usize {
        self.per_tenant.get(&tenant).map_or(0, |&n| n as usize)
    }

    /// Forgets the addresses not seen for `ageing` seconds at `now`.
    pub(crate) fn age(&mut self, now: u64, ageing: u64) {
        let (per_tenant, per_attachment) = (&mut self.per_tenant, &mut self.per_attachment);
        let (reserved, in_reserve) = (self.limits.reserved, &mut self.in_reserve);
        self.map.retain(|&(t, _), e| {
            let keep = now.saturating_sub(e.seen) < ageing;
            if !keep {
                uncount(
                    per_tenant,
                    per_attachment,
                    in_reserve,
                    reserved,
                    t,
                    e.attachment,
                );
            }
            keep
        });
        self.version += 1;
    }

    /// Whether a frame from `mac` on `attachment` of `tenant` may be
    /// learned: known there already, or within the limits.
    #[inline(always)]
    pub(crate) fn admits(&self, tenant: u32, mac: [u8; 6], attachment: u32) -> bool {
        let m = &self.learned[slot(tenant, attachment)];
        if m.version == self.version
            && m.mac == mac
            && m.tenant == tenant
            && m.attachment == attachment
        {
            return true;
        }
        self.admits_in_map(tenant, mac, attachment)
    }

    /// [`MacTable::admits`] past its memo.
    #[inline(never)]
    fn admits_in_map(&self, tenant: u32, mac: [u8; 6], attachment: u32) -> bool {
        match self.map.get(&(tenant, mac)) {
            Some(e) if e.attachment == attachment => true,
            Some(_) => self.room_on(tenant, attachment),
            None => self.room_for(tenant, attachment),
        }
    }

    /// Whether `attachment` of `tenant` may take another address.
    fn room_on(&self, tenant: u32, attachment: u32) -> bool {
        self.per_attachment
            .get(&(tenant, attachment))
            .is_none_or(|&n| n < self.limits.per_attachment)
    }

    /// Whether a new address of `tenant` on `attachment` fits: within
    /// both limits, and in the tenant's reserve or the shared pool.
    fn room_for(&self, tenant: u32, attachment: u32) -> bool {
        let held = self.per_tenant.get(&tenant).copied().unwrap_or(0);
        if held >= self.limits.per_tenant
            || !self.room_on(tenant, attachment)
            || self.map.len() >= self.capacity
        {
            return false;
        }
        if held < self.limits.reserved {
            return true;
        }
        let reserve = self.limits.reserved as usize * self.limits.tenants as usize;
        let pool = self.capacity.saturating_sub(reserve);
        self.map.len() - self.in_reserve < pool
    }

    /// Records that `mac` of `tenant` was seen at `now` on `attachment`
    /// (behind remote VTEP `vtep`, 0 for none). A new address, or a move
    /// to another attachment, is not learned unless
    /// [`MacTable::admits`] it.
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
        if let Some(e) = self.map.get(&key).copied() {
            if e != entry {
                if e.attachment != attachment {
                    if !self.room_on(tenant, attachment) {
                        return;
                    }
                    let from = (tenant, e.attachment);
                    if let Some(n) = self.per_attachment.get_mut(&from) {
                        *n -= 1;
                        if *n == 0 {
                            self.per_attachment.remove(&from);
                        }
                    }
                    *self.per_attachment.entry((tenant, attachment)).or_default() += 1;
                    if self.keep_moves {
                        if self.moves.len() < MOVES_KEPT {
                            self.moves.push((tenant, mac));
                        } else {
                            self.moves_lost = true;
                        }
                    }
                }
                self.map.insert(key, entry);
                self.version += 1;
            }
        } else if self.room_for(tenant, attachment) {
            // Within the reserved capacity: no allocation.
            self.map.insert(key, entry);
            let held = self.per_tenant.entry(tenant).or_default();
            if *held < self.limits.reserved {
                self.in_reserve += 1;
            }
            *held += 1;
            *self.per_attachment.entry((tenant, attachment)).or_default() += 1;
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

/// Takes an address of `tenant` on `attachment` off the counts.
fn uncount(
    per_tenant: &mut hashbrown::HashMap<u32, u32>,
    per_attachment: &mut hashbrown::HashMap<(u32, u32), u32>,
    in_reserve: &mut usize,
    reserved: u32,
    tenant: u32,
    attachment: u32,
) {
    if let Some(n) = per_tenant.get_mut(&tenant) {
        if *n <= reserved {
            *in_reserve -= 1;
        }
        *n -= 1;
        if *n == 0 {
            per_tenant.remove(&tenant);
        }
    }
    if let Some(n) = per_attachment.get_mut(&(tenant, attachment)) {
        *n -= 1;
        if *n == 0 {
            per_attachment.remove(&(tenant, attachment));
        }
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
        let mut rng = dpu_rand::Rng::new(0x2545_f491_4f6c_dd1d);
        let mut next = move |n: u64| rng.below(n);
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

    /// Moves are kept in order until taken; one refused stays, with those
    /// after it, for the next call; past the limit the loss is said.
    #[test]
    fn moves_wait_to_be_taken() {
        let mut t = MacTable::new(MOVES_KEPT * 2);
        t.keep_moves();
        let mac = |i: u8| [2, 0, 0, 0, 0, i];
        for i in 1..=3 {
            t.learn(1, mac(i), 0, 0, 1);
            t.learn(1, mac(i), 1, 0, 2);
        }
        let mut seen = Vec::new();
        let lost = t.take_moves(|_, m| {
            seen.push(m[5]);
            m[5] != 2
        });
        assert_eq!((seen, lost), (vec![1, 2], false));
        let mut seen = Vec::new();
        t.take_moves(|_, m| {
            seen.push(m[5]);
            true
        });
        assert_eq!(seen, vec![2, 3]);
        assert!(!t.moved());
        for i in 0..=MOVES_KEPT as u16 {
            let m = [2, 1, 0, 0, (i >> 8) as u8, i as u8];
            t.learn(2, m, 0, 0, 3);
            t.learn(2, m, 1, 0, 4);
        }
        assert!(t.take_moves(|_, _| true), "one more than kept");
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

    /// The limits against a model that counts from scratch: random
    /// learning, moves, ageing and resets over tenants and attachments
    /// with small limits. Every admission is the model's, no tenant or
    /// attachment ever holds more than its limit, and a tenant below its
    /// reserve always learns a new address its limits allow, however
    /// full the others have made the table.
    #[test]
    fn limits_and_reserves_hold_against_a_model() {
        let mut rng = dpu_rand::Rng::new(0x9e37_79b9_7f4a_7c15);
        let mut next = move |n: u64| rng.below(n);
        let (mut guaranteed, mut refused) = (0, 0);
        for round in 0..60 {
            let cap = 4 + next(40) as usize;
            let tenants = 1 + next(4) as u32;
            let limits = MacLimits {
                per_tenant: 1 + next(cap as u64) as u32,
                per_attachment: 1 + next(8) as u32,
                reserved: next(12) as u32,
                tenants,
            };
            let mut t = MacTable::new(cap);
            t.reset(limits);
            let reserved = t.limits.reserved;
            assert!(reserved as usize * tenants as usize <= cap);
            let mut model: std::collections::HashMap<(u32, [u8; 6]), (u32, u64)> =
                Default::default();
            let mut now = 0;
            for step in 0..3000 {
                let tenant = next(u64::from(tenants)) as u32;
                let a = next(3) as u32;
                let mac = [2, 0, 0, 0, next(4) as u8, next(32) as u8];
                let held = |m: &std::collections::HashMap<_, (u32, u64)>, tn: u32| {
                    m.keys().filter(|(x, _)| *x == tn).count() as u32
                };
                let on = |m: &std::collections::HashMap<(u32, [u8; 6]), (u32, u64)>, tn, at| {
                    m.iter()
                        .filter(|((x, _), (y, _))| *x == tn && *y == at)
                        .count() as u32
                };
                match next(50) {
                    0 => now += 1,
                    1 => {
                        t.age(now, 2);
                        model.retain(|_, (_, seen)| now.saturating_sub(*seen) < 2);
                    }
                    _ => {
                        let want = match model.get(&(tenant, mac)) {
                            Some(&(at, _)) if at == a => true,
                            Some(_) => on(&model, tenant, a) < limits.per_attachment,
                            None => {
                                let h = held(&model, tenant);
                                let in_reserve: usize = (0..tenants)
                                    .map(|x| held(&model, x).min(reserved) as usize)
                                    .sum();
                                let pool = cap - reserved as usize * tenants as usize;
                                h < limits.per_tenant
                                    && on(&model, tenant, a) < limits.per_attachment
                                    && model.len() < cap
                                    && (h < reserved || model.len() - in_reserve < pool)
                            }
                        };
                        let at = format!("round {round} step {step}");
                        assert_eq!(t.admits(tenant, mac, a), want, "{at}");
                        let new = !model.contains_key(&(tenant, mac));
                        if new
                            && held(&model, tenant) < reserved.min(limits.per_tenant)
                            && on(&model, tenant, a) < limits.per_attachment
                        {
                            assert!(want, "{at}: a tenant within its reserve is refused");
                            guaranteed += 1;
                        }
                        refused += usize::from(!want);
                        t.learn(tenant, mac, a, 0, now);
                        if want {
                            model.insert((tenant, mac), (a, now));
                        }
                        assert_eq!(
                            t.lookup(tenant, a, mac, now, u64::MAX).map(|(x, _)| x),
                            model.get(&(tenant, mac)).map(|&(x, _)| x),
                            "{at}"
                        );
                    }
                }
                assert_eq!(t.len(), model.len());
                for x in 0..tenants {
                    assert_eq!(t.tenant_len(x), held(&model, x) as usize);
                    assert!(held(&model, x) <= limits.per_tenant);
                    for y in 0..3 {
                        assert!(on(&model, x, y) <= limits.per_attachment);
                    }
                }
            }
        }
        assert!(
            guaranteed > 1000 && refused > 1000,
            "{guaranteed} {refused}"
        );
    }
}
