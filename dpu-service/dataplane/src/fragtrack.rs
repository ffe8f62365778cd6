//! Fragment tracking: which fragmented datagrams' first fragments passed
//! the filter, so that their later fragments, which carry no transport
//! header to filter on, pass too, and no other later fragment does.
//!
//! A datagram is known by its tenant, source, destination, protocol (as
//! every fragment of it names it, see [`Fragment::proto`]) and
//! identification. When its first fragment passes, the tenant's rules or
//! connection tracking having let it through, the switch records it here
//! ([`FragTable::admit`]); a later fragment passes only while its
//! datagram is recorded ([`FragTable::passes`]). Fragments are not
//! reassembled or held: a later fragment that arrives before its first
//! is dropped, as one whose first was dropped is.
//!
//! Entries live for a fixed time from the last fragment of their first
//! (Linux keeps a datagram's fragments 30 seconds for reassembly); they
//! go when a fragment meets them expired or when [`FragTable::sweep`]
//! passes by. Each tenant keeps a reserved share of the table that no
//! other tenant's fragments can take ([`Shares`]). The table belongs to
//! one worker and is allocated in full when the worker starts; the packet
//! path never allocates.

use std::sync::Arc;

use crate::carry::{Carried, CarriedView};
use crate::fair_share::{Full, ShareLimits, Shares};
use crate::linear_probe::{self, Probed};
use crate::wire::{FlowKey, Fragment};

/// The key of a fragmented datagram, hashed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragKey {
    id: Id,
    hash: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct Id {
    src: u128,
    dst: u128,
    tenant: u32,
    ident: u32,
    proto: u8,
    v6: bool,
}

fn id_hash(id: &Id) -> u32 {
    use std::hash::BuildHasher;
    static HASHER: std::sync::OnceLock<hashbrown::DefaultHashBuilder> = std::sync::OnceLock::new();
    HASHER.get_or_init(Default::default).hash_one(id) as u32
}

impl FragKey {
    /// The datagram of fragment `f`, of a packet of tenant `tenant` (a
    /// stable tenant ID) with classification key `key`.
    pub fn of(tenant: u32, key: &FlowKey, f: &Fragment) -> FragKey {
        let id = Id {
            src: key.src,
            dst: key.dst,
            tenant,
            ident: f.id,
            proto: f.proto,
            v6: key.v6,
        };
        FragKey {
            id,
            hash: id_hash(&id),
        }
    }
}

/// A datagram as it is carried across a restart ([`FragTable::export`]):
/// its key, with the tenant's ID in the process that saved it, and the
/// seconds its entry had left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SavedFrag {
    /// The tenant's ID.
    pub tenant: u32,
    /// Source address.
    pub src: u128,
    /// Destination address.
    pub dst: u128,
    /// Identification (16 bits for IPv4, 32 for IPv6).
    pub ident: u32,
    /// The protocol its fragments name.
    pub proto: u8,
    /// IPv6.
    pub v6: bool,
    /// Seconds the entry had left.
    pub ttl: u32,
}

impl SavedFrag {
    /// True if a table could have held this datagram: IPv4 addresses
    /// within 32 bits and an IPv4 identification within 16.
    pub fn is_sound(&self) -> bool {
        self.v6 || (self.src >> 32 == 0 && self.dst >> 32 == 0 && self.ident >> 16 == 0)
    }
}

/// Datagrams carried over from a previous process, by key.
pub(crate) type CarriedFrags = Carried<Id, ()>;

impl CarriedFrags {
    /// Adds datagram `f` as tenant `tenant` of this process, expiring
    /// `expires` seconds after the map was made. False if it is there
    /// already.
    pub(crate) fn add(&mut self, tenant: u32, f: &SavedFrag, expires: u32) -> bool {
        let id = Id {
            src: f.src,
            dst: f.dst,
            tenant,
            ident: f.ident,
            proto: f.proto,
            v6: f.v6,
        };
        self.insert(id, expires, ())
    }
}

/// One bucket: a whole cache line.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Bucket {
    id: Id,
    hash: u32,
    /// Expiry on the caller's clock, seconds.
    expires: u32,
    used: bool,
}

const EMPTY: Bucket = Bucket {
    id: Id {
        src: 0,
        dst: 0,
        tenant: 0,
        ident: 0,
        proto: 0,
        v6: false,
    },
    hash: 0,
    expires: 0,
    used: false,
};

impl Probed for Bucket {
    fn used(&self) -> bool {
        self.used
    }

    fn clear(&mut self) {
        self.used = false;
    }

    fn hash(&self) -> u32 {
        self.hash
    }
}

/// The limits of a worker's fragment table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragLimits {
    /// Datagrams tracked, and their shares among tenants.
    pub shares: ShareLimits,
    /// Seconds a datagram stays known after its first fragment.
    pub timeout: u64,
}

/// One worker's fragment table: open addressing with linear probing, at
/// most half full, removal by backward shift.
#[derive(Debug)]
pub struct FragTable {
    buckets: Box<[Bucket]>,
    mask: usize,
    shares: Shares,
    timeout: u64,
    cursor: usize,
    /// Datagrams carried over from a previous process, adopted on a miss
    /// until they would all have expired.
    carried: Option<CarriedView<Id, ()>>,
}

fn secs(t: u64) -> u32 {
    u32::try_from(t).unwrap_or(u32::MAX)
}

impl FragTable {
    /// A table with `limits`, allocated now (64 bytes per bucket, two
    /// buckets per datagram).
    pub fn new(limits: FragLimits) -> FragTable {
        let n = (2 * limits.shares.max).next_power_of_two().max(16);
        FragTable {
            buckets: vec![EMPTY; n].into_boxed_slice(),
            mask: n - 1,
            shares: Shares::new(limits.shares),
            timeout: limits.timeout,
            cursor: 0,
            carried: None,
        }
    }

    /// Lets this table adopt the datagrams of `carried`, whose clock
    /// started `offset` seconds before this table's.
    pub(crate) fn carry(&mut self, carried: Arc<CarriedFrags>, offset: u64) {
        self.carried = Some(CarriedView::new(carried, offset));
    }

    /// Forgets the carried datagrams once they would all have expired at
    /// `now`.
    pub(crate) fn forget_carried(&mut self, now: u64) {
        if self.carried.as_ref().is_some_and(|c| c.spent(now)) {
            self.carried = None;
        }
    }

    /// The seconds a datagram stays known after its first fragment.
    pub fn timeout(&self) -> u64 {
        self.timeout
    }

    /// Every live datagram at `now`, handed to `f` with the seconds it has
    /// left: what a restart carries over.
    pub fn export(&self, now: u64, mut f: impl FnMut(SavedFrag)) {
        for b in self.buckets.iter().filter(|b| b.used) {
            let Some(ttl) = b.expires.checked_sub(secs(now)).filter(|&t| t > 0) else {
                continue;
            };
            f(SavedFrag {
                tenant: b.id.tenant,
                src: b.id.src,
                dst: b.id.dst,
                ident: b.id.ident,
                proto: b.id.proto,
                v6: b.id.v6,
                ttl,
            });
        }
    }

    /// Makes room for tenant IDs below `ids`, and divides the table among
    /// `tenants` tenants (off the packet path).
    pub fn set_tenants(&mut self, ids: usize, tenants: usize) {
        self.shares.reserve_tenants(ids);
        self.shares.set_tenants(tenants);
    }

    /// Datagrams tracked.
    pub fn len(&self) -> usize {
        self.shares.len() as usize
    }

    /// True if no datagram is tracked.
    pub fn is_empty(&self) -> bool {
        self.shares.is_empty()
    }

    /// Datagrams tenant `tenant` has tracked.
    pub fn tenant_len(&self, tenant: u32) -> u32 {
        self.shares.held(tenant)
    }

    fn probe(&self, key: &FragKey) -> (usize, bool) {
        let mut i = key.hash as usize & self.mask;
        loop {
            let b = &self.buckets[i];
            if !b.used {
                return (i, false);
            }
            if b.hash == key.hash && b.id == key.id {
                return (i, true);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Records that the first fragment of datagram `key` passed at `now`
    /// (again: its time starts over).
    ///
    /// # Errors
    /// [`Full`] if the tenant may track no more datagrams: the fragment
    /// must not pass, since none of its later ones would.
    pub fn admit(&mut self, key: &FragKey, now: u64) -> Result<(), Full> {
        let expires = secs(now + self.timeout);
        let (i, found) = self.probe(key);
        if found {
            self.buckets[i].expires = expires;
            return Ok(());
        }
        self.shares.check(key.id.tenant)?;
        self.shares.take(key.id.tenant);
        self.buckets[i] = Bucket {
            id: key.id,
            hash: key.hash,
            expires,
            used: true,
        };
        Ok(())
    }

    /// True if the first fragment of datagram `key` passed and its entry
    /// is live at `now`: a later fragment of it may pass. An expired
    /// entry is removed.
    ///
    /// A datagram carried over from a previous process (`FragTable::carry`)
    /// joins the table on its first miss here, if its tenant has room.
    pub fn passes(&mut self, key: &FragKey, now: u64) -> bool {
        let (i, found) = self.probe(key);
        if !found {
            return self.carried.is_some() && self.adopt(key, i, now);
        }
        if u64::from(self.buckets[i].expires) <= now {
            self.remove(i);
            return false;
        }
        true
    }

    /// Adopts the carried datagram `key` into empty bucket `i`, if there
    /// is one live and its tenant has room. Out of line: the miss path.
    #[cold]
    #[inline(never)]
    fn adopt(&mut self, key: &FragKey, i: usize, now: u64) -> bool {
        let Some((expires, ())) = self.carried.as_mut().and_then(|c| c.take(&key.id, now)) else {
            return false;
        };
        if self.shares.check(key.id.tenant).is_err() {
            return false;
        }
        self.shares.take(key.id.tenant);
        self.buckets[i] = Bucket {
            id: key.id,
            hash: key.hash,
            expires: secs(expires),
            used: true,
        };
        true
    }

    fn remove(&mut self, slot: usize) {
        if !self.buckets[slot].used {
            return;
        }
        self.shares.give(self.buckets[slot].id.tenant);
        linear_probe::remove(&mut self.buckets, self.mask, slot);
    }

    /// Moves past up to `budget` buckets from where the last sweep
    /// stopped, removing entries that expired or whose tenant `keep`
    /// refuses, at most `budget` of them. Returns how many went.
    pub fn sweep(&mut self, now: u64, budget: usize, keep: impl Fn(u32) -> bool) -> usize {
        let mut removed = 0;
        let mut passed = 0;
        while passed < budget && removed < budget {
            let b = &self.buckets[self.cursor];
            if b.used && (u64::from(b.expires) <= now || !keep(b.id.tenant)) {
                // Backward shift may move a later entry into this bucket:
                // look at it again.
                self.remove(self.cursor);
                removed += 1;
            } else {
                self.cursor = (self.cursor + 1) & self.mask;
                passed += 1;
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::proto;

    fn limits(max: usize, per_tenant: usize, reserved: usize) -> FragLimits {
        FragLimits {
            shares: ShareLimits {
                max,
                per_tenant,
                reserved,
            },
            timeout: 10,
        }
    }

    fn key(tenant: u32, src: u128, ident: u32) -> FragKey {
        let flow = FlowKey {
            src,
            dst: 2,
            proto: proto::UDP,
            ..FlowKey::default()
        };
        let f = Fragment {
            id: ident,
            proto: proto::UDP,
            offset: 0,
            more: true,
        };
        FragKey::of(tenant, &flow, &f)
    }

    #[test]
    fn later_fragments_pass_only_after_their_first_and_until_it_ages() {
        let mut t = FragTable::new(limits(64, 64, 0));
        t.set_tenants(2, 2);
        assert!(!t.passes(&key(0, 1, 7), 0), "nothing before the first");
        t.admit(&key(0, 1, 7), 0).unwrap();
        assert!(t.passes(&key(0, 1, 7), 9));
        // Another ID, source or tenant is another datagram.
        assert!(!t.passes(&key(0, 1, 8), 1));
        assert!(!t.passes(&key(0, 3, 7), 1));
        assert!(!t.passes(&key(1, 1, 7), 1));
        // The same datagram's key whatever the fragment's offset says.
        let later = Fragment {
            id: 7,
            proto: proto::UDP,
            offset: 100,
            more: false,
        };
        let flow = FlowKey {
            src: 1,
            dst: 2,
            proto: proto::UDP,
            ..FlowKey::default()
        };
        assert!(t.passes(&FragKey::of(0, &flow, &later), 5));
        // Aged out at 10: removed by the fragment that meets it.
        assert!(!t.passes(&key(0, 1, 7), 10));
        assert_eq!(t.len(), 0);
        // A first fragment again starts its time over.
        t.admit(&key(0, 1, 7), 20).unwrap();
        t.admit(&key(0, 1, 7), 25).unwrap();
        assert_eq!(t.len(), 1);
        assert!(t.passes(&key(0, 1, 7), 34));
    }

    #[test]
    fn the_table_is_bounded_and_shared_fairly() {
        // 32 datagrams, 2 tenants, 8 reserved each, 24 at most per tenant.
        let mut t = FragTable::new(limits(32, 24, 8));
        t.set_tenants(3, 2);
        for i in 0..24 {
            t.admit(&key(0, 1, i), 0).unwrap();
        }
        assert_eq!(t.admit(&key(0, 1, 99), 0), Err(Full::Tenant));
        // Tenant 1 still has its reserve: 8, and no more.
        for i in 0..8 {
            t.admit(&key(1, 1, i), 0).unwrap();
        }
        assert_eq!(t.admit(&key(1, 1, 99), 0), Err(Full::Pool));
        assert_eq!((t.len(), t.tenant_len(0), t.tenant_len(1)), (32, 24, 8));
        // The sweep frees the expired, and a removed tenant's entries.
        let mut turns = 0;
        while t.tenant_len(1) > 0 && turns < 1000 {
            t.sweep(1, 8, |tenant| tenant != 1);
            turns += 1;
        }
        assert_eq!((t.len(), t.tenant_len(0)), (24, 24));
        while !t.is_empty() && turns < 2000 {
            t.sweep(10, 8, |_| true);
            turns += 1;
        }
        assert!(t.is_empty());
    }

    /// Against a model: random admits, lookups and sweeps agree with a
    /// map of datagrams to expiry, through the backward shifts of a
    /// small, busy table.
    #[test]
    fn agrees_with_a_model() {
        let mut rng = dpu_rand::Rng::new(0xf4a6);
        let mut t = FragTable::new(limits(40, 40, 0));
        t.set_tenants(1, 1);
        let mut model = std::collections::HashMap::new();
        for now in 0..4000u64 {
            let now = now / 50;
            let k = key(0, u128::from(rng.below(8)), rng.below(16) as u32);
            match rng.below(4) {
                0 => {
                    model.retain(|_, e: &mut u64| *e > now);
                    let r = t.admit(&k, now);
                    if model.contains_key(&k.id) || model.len() < 40 {
                        // The table may still hold expired entries.
                        if r.is_ok() {
                            model.insert(k.id, now + 10);
                        }
                    } else {
                        assert!(r.is_err());
                    }
                }
                1 => {
                    t.sweep(now, 4, |_| true);
                }
                _ => {
                    let want = model.get(&k.id).is_some_and(|&e| e > now);
                    assert_eq!(t.passes(&k, now), want, "{k:?} at {now}");
                }
            }
            assert!(t.len() <= 40);
        }
    }
}
