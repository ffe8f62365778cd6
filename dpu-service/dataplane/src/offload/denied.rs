//! Denied flows counted toward a drop rule in hardware, one table per
//! worker.
//!
//! A flow a tenant's rules deny (a stateless deny rule, or the tenant's
//! default deny) is offered to flow hardware as a drop rule once
//! [`Denied::deny`] has counted `after` of its packets: a flood of denied
//! packets then stops reaching the cores. The table is direct-mapped and
//! allocated once ([`SLOTS`] slots, each a flow of either direction of
//! one conversation): a flow that finds its slot taken replaces the one
//! there, which is only forgotten, never wrongly offered. So a tenant
//! sending more denied flows than the table holds costs the cores what
//! it would without offload, and the offload thread at most the
//! insertion rate.
//!
//! A connection a stateful rule opens takes precedence over an earlier
//! deny of its 5-tuple in either direction: [`Denied::opened`] says when
//! a drop of it is in hardware, to be withdrawn.

use std::hash::BuildHasher;

use crate::wire::FlowKey;

/// Slots of the table.
pub const SLOTS: usize = 1024;

/// Seconds after which a flow whose drop rule was refused (no room, past
/// the rate, decided under an older configuration) may be offered again.
pub const RETRY_SECS: u64 = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    #[default]
    Empty,
    /// Denied packets counted so far.
    Counting(u16),
    /// Offered: in hardware, or on its way.
    Offered,
    /// Refused at this second; offered again after [`RETRY_SECS`].
    Refused(u64),
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    tenant: u32,
    key: FlowKey,
    state: State,
}

/// The table of one worker.
#[derive(Debug)]
pub struct Denied {
    slots: Box<[Slot]>,
    after: u16,
    hasher: hashbrown::DefaultHashBuilder,
}

impl Denied {
    /// A table offering a flow after `after` denied packets (at least 1).
    pub fn new(after: u16) -> Denied {
        Denied {
            slots: vec![Slot::default(); SLOTS].into_boxed_slice(),
            after: after.max(1),
            hasher: hashbrown::DefaultHashBuilder::default(),
        }
    }

    /// The slot of (`tenant`, `key`), the same for both directions.
    fn index(&self, tenant: u32, key: &FlowKey) -> usize {
        let k = if (key.src, key.src_port) <= (key.dst, key.dst_port) {
            *key
        } else {
            key.reversed()
        };
        let h = self.hasher.hash_one((tenant, k));
        (h as usize) & (SLOTS - 1)
    }

    /// A packet of (`tenant`, `key`) was denied at second `now`: true if
    /// its flow is to be offered as a drop rule now (then say whether it
    /// was, with [`Denied::offered`]).
    pub fn deny(&mut self, tenant: u32, key: &FlowKey, now: u64) -> bool {
        let after = self.after;
        let i = self.index(tenant, key);
        let s = &mut self.slots[i];
        if s.state == State::Empty || s.tenant != tenant || s.key != *key {
            *s = Slot {
                tenant,
                key: *key,
                state: State::Counting(0),
            };
        }
        match s.state {
            State::Counting(n) => {
                let n = n.saturating_add(1);
                s.state = State::Counting(n);
                n >= after
            }
            State::Refused(at) if now.saturating_sub(at) >= RETRY_SECS => {
                s.state = State::Counting(1);
                after <= 1
            }
            _ => false,
        }
    }

    /// The offer [`Denied::deny`] asked for was queued (`true`) or found
    /// no room (it is asked for again at the next denied packet).
    pub fn offered(&mut self, tenant: u32, key: &FlowKey, queued: bool) {
        let i = self.index(tenant, key);
        let s = &mut self.slots[i];
        if queued && s.tenant == tenant && s.key == *key {
            s.state = State::Offered;
        }
    }

    /// A flow of (`tenant`, `key`) came back from hardware at second
    /// `now` (`refused`: it never got there): true if it is a drop this
    /// table offered, which is then counted afresh (or, refused, rests
    /// [`RETRY_SECS`]).
    pub fn returned(&mut self, tenant: u32, key: &FlowKey, refused: bool, now: u64) -> bool {
        let i = self.index(tenant, key);
        let s = &mut self.slots[i];
        if s.state != State::Offered || s.tenant != tenant || s.key != *key {
            return false;
        }
        s.state = if refused {
            State::Refused(now)
        } else {
            State::Counting(0)
        };
        true
    }

    /// A connection of (`tenant`, `key`) opened: true if a drop of either
    /// of its directions is in hardware, to be withdrawn. The table
    /// forgets it either way.
    pub fn opened(&mut self, tenant: u32, key: &FlowKey) -> bool {
        let i = self.index(tenant, key);
        let s = &mut self.slots[i];
        if s.state == State::Empty
            || s.tenant != tenant
            || (s.key != *key && s.key != key.reversed())
        {
            return false;
        }
        let offered = s.state == State::Offered;
        *s = Slot::default();
        offered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sport: u16) -> FlowKey {
        FlowKey {
            src: 0x0a00_0001,
            dst: 0x0a00_0002,
            src_port: sport,
            dst_port: 53,
            proto: 17,
            v6: false,
        }
    }

    #[test]
    fn a_flow_is_offered_after_its_count_once_until_it_comes_back() {
        let mut d = Denied::new(3);
        let k = key(1000);
        assert!(!d.deny(1, &k, 0));
        assert!(!d.deny(1, &k, 0));
        assert!(d.deny(1, &k, 0), "the third denied packet offers it");
        d.offered(1, &k, true);
        assert!(!d.deny(1, &k, 0), "offered: not again");
        // Aged out: counted afresh.
        assert!(d.returned(1, &k, false, 5));
        assert!(!d.deny(1, &k, 5) && !d.deny(1, &k, 5) && d.deny(1, &k, 5));
        // Another tenant's same 5-tuple is another flow.
        assert!(!d.returned(2, &k, false, 5));
    }

    #[test]
    fn an_offer_without_room_is_asked_for_again_and_a_refused_one_rests() {
        let mut d = Denied::new(1);
        let k = key(1001);
        assert!(d.deny(1, &k, 0));
        d.offered(1, &k, false);
        assert!(d.deny(1, &k, 0), "the lane was full: asked again");
        d.offered(1, &k, true);
        assert!(d.returned(1, &k, true, 100));
        assert!(!d.deny(1, &k, 100 + RETRY_SECS - 1), "refused: rests");
        assert!(d.deny(1, &k, 100 + RETRY_SECS), "then is offered again");
    }

    #[test]
    fn a_connection_opening_withdraws_a_drop_of_either_direction() {
        let mut d = Denied::new(1);
        let k = key(1002);
        assert!(d.deny(1, &k, 0));
        d.offered(1, &k, true);
        assert!(
            d.opened(1, &k.reversed()),
            "the reply direction's connection"
        );
        assert!(!d.opened(1, &k), "forgotten");
        assert!(
            !d.returned(1, &k, false, 1),
            "its return is not a drop's any more"
        );
        // Counting, not offered: nothing to withdraw.
        let mut d = Denied::new(5);
        assert!(!d.deny(1, &k, 0));
        assert!(!d.opened(1, &k));
    }

    #[test]
    fn more_denied_flows_than_slots_stay_bounded() {
        let mut d = Denied::new(2);
        let mut offered = 0;
        for round in 0..2 {
            for p in 0..(4 * SLOTS) as u16 {
                if d.deny(1, &key(p), round) {
                    d.offered(1, &key(p), true);
                    offered += 1;
                }
            }
        }
        // Each flow's second packet comes a whole table later: most
        // slots were taken by others in between.
        assert!(offered < SLOTS, "{offered}");
        assert_eq!(d.slots.len(), SLOTS);
    }
}
