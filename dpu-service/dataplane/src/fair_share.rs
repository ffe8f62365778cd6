//! Fair shares of a bounded table among tenants: a reserved minimum per
//! tenant plus a shared pool.
//!
//! A table of `max` entries shared by `n` tenants keeps `reserve` entries
//! for each tenant (the configured reserve, or `max / n` if the table
//! cannot give every tenant that much); the rest, `max - n * reserve`, is
//! a pool any tenant may draw from up to its cap. A tenant below its
//! reserve always gets an entry, whatever the others do: the entries
//! held are at most `n * reserve` (each tenant's up to its reserve) plus
//! the pool, which is `max`. A flood from any number of tenants takes
//! the pool and their own reserves, never another tenant's reserve.
//!
//! Counts are kept by tenant ID (see the switch's stable IDs); the counts
//! array is sized off the packet path ([`Shares::reserve_tenants`]), so
//! taking and giving back never allocate.

/// Why a tenant may not take another entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The tenant holds as many entries as one tenant may.
    Tenant,
    /// The tenant is past its reserve and the shared pool is used up.
    Pool,
}

/// The limits of a table's shares, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareLimits {
    /// Entries in the table.
    pub max: usize,
    /// Most entries one tenant may hold.
    pub per_tenant: usize,
    /// Entries kept for each tenant, whatever the others hold (less if
    /// the table cannot keep that much for every tenant).
    pub reserved: usize,
}

/// The entries each tenant holds, against a table's [`ShareLimits`].
#[derive(Debug, Clone)]
pub struct Shares {
    held: Vec<u32>,
    max: u32,
    cap: u32,
    reserved: u32,
    /// The reserve in force: `reserved`, or less with many tenants.
    reserve: u32,
    /// Entries of the pool: `max - tenants * reserve`.
    pool: u32,
    /// Entries held beyond their tenant's reserve.
    pool_used: u32,
    len: u32,
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Shares {
    /// Shares of a table with `limits`, among one tenant until
    /// [`Shares::set_tenants`] says how many there are.
    pub fn new(limits: ShareLimits) -> Shares {
        let mut s = Shares {
            held: Vec::new(),
            max: to_u32(limits.max),
            cap: to_u32(limits.per_tenant),
            reserved: to_u32(limits.reserved),
            reserve: 0,
            pool: 0,
            pool_used: 0,
            len: 0,
        };
        s.set_tenants(1);
        s
    }

    /// Makes room for tenant IDs below `n` (off the packet path).
    pub fn reserve_tenants(&mut self, n: usize) {
        if self.held.len() < n {
            self.held.resize(n, 0);
        }
    }

    /// Divides the table among `tenants` tenants (off the packet path:
    /// walks every tenant ID's count). Tenants that held more than a
    /// smaller reserve keep their entries; the excess counts against the
    /// pool until it is given back.
    pub fn set_tenants(&mut self, tenants: usize) {
        let n = to_u32(tenants.max(1));
        self.reserve = self.reserved.min(self.cap).min(self.max / n);
        self.pool = self.max - self.reserve * n;
        let reserve = self.reserve;
        self.pool_used = self.held.iter().map(|&h| h.saturating_sub(reserve)).sum();
    }

    /// The reserve in force for each tenant.
    pub fn reserve(&self) -> u32 {
        self.reserve
    }

    /// Entries held, all tenants together.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True if no tenant holds an entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries tenant `tenant` holds.
    pub fn held(&self, tenant: u32) -> u32 {
        self.held.get(tenant as usize).copied().unwrap_or(0)
    }

    /// Whether tenant `tenant` may take another entry.
    ///
    /// # Errors
    /// [`Full`] says which limit it reached (an ID with no room made for
    /// it is [`Full::Tenant`]).
    pub fn check(&self, tenant: u32) -> Result<(), Full> {
        let Some(&h) = self.held.get(tenant as usize) else {
            return Err(Full::Tenant);
        };
        if h >= self.cap {
            return Err(Full::Tenant);
        }
        // Within the reserve: always, unless a reserve that shrank left
        // the pool overdrawn and the table full. Past it: from the pool.
        if self.len >= self.max || (h >= self.reserve && self.pool_used >= self.pool) {
            return Err(Full::Pool);
        }
        Ok(())
    }

    /// Tenant `tenant` takes an entry ([`Shares::check`] said it may).
    pub fn take(&mut self, tenant: u32) {
        if let Some(h) = self.held.get_mut(tenant as usize) {
            if *h >= self.reserve {
                self.pool_used += 1;
            }
            *h += 1;
            self.len += 1;
        }
    }

    /// Tenant `tenant` gives an entry back.
    pub fn give(&mut self, tenant: u32) {
        if let Some(h) = self.held.get_mut(tenant as usize) {
            if *h == 0 {
                return;
            }
            *h -= 1;
            if *h >= self.reserve {
                self.pool_used = self.pool_used.saturating_sub(1);
            }
            self.len -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(max: usize, per_tenant: usize, reserved: usize, tenants: usize) -> Shares {
        let mut s = Shares::new(ShareLimits {
            max,
            per_tenant,
            reserved,
        });
        s.reserve_tenants(tenants);
        s.set_tenants(tenants);
        s
    }

    /// Takes entries for `tenant` until refused; how many it got.
    fn fill(s: &mut Shares, tenant: u32) -> (u32, Full) {
        let mut n = 0;
        loop {
            match s.check(tenant) {
                Ok(()) => {
                    s.take(tenant);
                    n += 1;
                }
                Err(e) => return (n, e),
            }
        }
    }

    #[test]
    fn floods_take_the_pool_never_a_reserve() {
        // 100 entries, 4 tenants, 10 reserved each: a pool of 60.
        let mut s = shares(100, 50, 10, 4);
        assert_eq!((s.reserve(), s.pool), (10, 60));
        assert_eq!(fill(&mut s, 0), (50, Full::Tenant), "its cap");
        assert_eq!(fill(&mut s, 1), (30, Full::Pool), "reserve + the rest");
        assert_eq!(fill(&mut s, 2), (10, Full::Pool), "its reserve is left");
        assert_eq!(fill(&mut s, 3), (10, Full::Pool));
        assert_eq!(s.len(), 100);
        // One flooder lets go: the pool is there again, for anyone.
        for _ in 0..5 {
            s.give(0);
        }
        assert_eq!(fill(&mut s, 3), (5, Full::Pool));
    }

    #[test]
    fn a_reserve_too_big_for_the_tenants_shrinks_to_an_even_split() {
        let mut s = shares(100, 100, 40, 4);
        assert_eq!((s.reserve(), s.pool), (25, 0));
        for t in 0..4 {
            assert_eq!(fill(&mut s, t), (25, Full::Pool));
        }
        assert_eq!(s.len(), 100);
    }

    /// With tenants added, those holding more than the new reserve keep
    /// their entries; the newcomers' reserves fill as the others drain,
    /// and the table never overflows.
    #[test]
    fn more_tenants_shrink_the_reserve_without_overflowing() {
        let mut s = shares(100, 100, 50, 2);
        assert_eq!(fill(&mut s, 0), (50, Full::Pool));
        assert_eq!(fill(&mut s, 1), (50, Full::Pool));
        s.reserve_tenants(4);
        s.set_tenants(4);
        assert_eq!(s.reserve(), 25);
        assert_eq!(fill(&mut s, 2), (0, Full::Pool), "the table is full");
        s.give(0);
        assert_eq!(fill(&mut s, 2), (1, Full::Pool));
        assert!(s.len() <= 100);
    }

    /// Against a model that recounts everything: any sequence of takes
    /// and gives keeps the counts, the table's bound and every tenant's
    /// reserve.
    #[test]
    fn random_takes_and_gives_keep_every_reserve() {
        let mut rng = dpu_rand::Rng::new(0x5ba7e);
        for round in 0..50 {
            let tenants = 1 + rng.below(6) as usize;
            let max = 1 + rng.below(200) as usize;
            let per_tenant = 1 + rng.index(max);
            let reserved = rng.below(60) as usize;
            let mut s = shares(max, per_tenant, reserved, tenants);
            let mut held = vec![0u32; tenants];
            for _ in 0..2000 {
                let t = rng.below(tenants as u64) as u32;
                if rng.below(3) == 0 {
                    s.give(t);
                    held[t as usize] = held[t as usize].saturating_sub(1);
                    continue;
                }
                let total: u32 = held.iter().sum();
                let r = s.check(t);
                if held[t as usize] < s.reserve() && held[t as usize] < per_tenant as u32 {
                    assert_eq!(r, Ok(()), "round {round}: within the reserve");
                }
                if r.is_ok() {
                    s.take(t);
                    held[t as usize] += 1;
                    assert!(total < max as u32, "round {round}: past the table");
                    assert!(held[t as usize] <= per_tenant as u32);
                }
                let pool_used: u32 = held.iter().map(|h| h.saturating_sub(s.reserve())).sum();
                assert_eq!(s.pool_used, pool_used);
                assert_eq!(s.len(), held.iter().sum::<u32>());
            }
        }
    }
}
