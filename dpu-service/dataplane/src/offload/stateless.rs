//! Flows of stateless verdicts counted toward a rule in hardware, one
//! table per worker.
//!
//! A flow the tenant's rules deny (a deny rule, or the tenant's default
//! deny), or allow without connection tracking (a stateless allow rule
//! without a rate limit, or the default allow), is offered to flow
//! hardware, as a drop or a forward, once [`Stateless::count`] has
//! counted `after` of its packets under that verdict: its later packets
//! then stop reaching the cores. The table is direct-mapped and allocated
//! once ([`SLOTS`] slots, each a flow of either direction of one
//! conversation): a flow that finds its slot taken replaces the one
//! there, which is only forgotten, never wrongly offered. So a tenant
//! sending more flows than the table holds costs the cores what it would
//! without offload, and the offload thread at most the insertion rate.
//!
//! A connection a stateful rule opens takes precedence over an earlier
//! stateless verdict of its 5-tuple in either direction:
//! [`Stateless::opened`] says when a rule for it is in hardware, to be
//! withdrawn.

use std::hash::BuildHasher;

use crate::wire::FlowKey;

/// Slots of the table.
pub const SLOTS: usize = 1024;

/// Seconds after which a flow whose rule was refused (no room, past the
/// rate, decided under an older configuration) may be offered again.
pub const RETRY_SECS: u64 = 10;

/// A stateless verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verdict {
    /// Denied: a drop rule.
    #[default]
    Deny,
    /// Allowed without connection tracking: a forwarding rule.
    Allow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    #[default]
    Empty,
    /// Packets counted so far.
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
    verdict: Verdict,
    state: State,
}

/// The table of one worker.
#[derive(Debug)]
pub struct Stateless {
    slots: Box<[Slot]>,
    after: u16,
    hasher: hashbrown::DefaultHashBuilder,
}

impl Stateless {
    /// A table offering a flow after `after` packets (at least 1).
    pub fn new(after: u16) -> Stateless {
        Stateless {
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

    /// A packet of (`tenant`, `key`) got `verdict` at second `now`: true
    /// if its flow is to be offered now (then say whether it was, with
    /// [`Stateless::offered`]). A verdict other than the one counted so
    /// far starts the count afresh.
    pub fn count(&mut self, tenant: u32, key: &FlowKey, verdict: Verdict, now: u64) -> bool {
        let after = self.after;
        let i = self.index(tenant, key);
        let s = &mut self.slots[i];
        if s.state == State::Empty || s.tenant != tenant || s.key != *key || s.verdict != verdict {
            *s = Slot {
                tenant,
                key: *key,
                verdict,
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

    /// The offer [`Stateless::count`] asked for was queued (`true`) or
    /// found no room (it is asked for again at the flow's next packet).
    pub fn offered(&mut self, tenant: u32, key: &FlowKey, queued: bool) {
        let i = self.index(tenant, key);
        let s = &mut self.slots[i];
        if queued && s.tenant == tenant && s.key == *key {
            s.state = State::Offered;
        }
    }

    /// A flow of (`tenant`, `key`) came back from hardware at second
    /// `now` (`refused`: it never got there): true if it is one this
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

    /// A connection of (`tenant`, `key`) opened: true if a rule for
    /// either of its directions is in hardware, to be withdrawn. The
    /// table forgets it either way.
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

    const D: Verdict = Verdict::Deny;
    const A: Verdict = Verdict::Allow;

    #[test]
    fn a_flow_is_offered_after_its_count_once_until_it_comes_back() {
        let mut d = Stateless::new(3);
        let k = key(1000);
        assert!(!d.count(1, &k, D, 0));
        assert!(!d.count(1, &k, D, 0));
        assert!(d.count(1, &k, D, 0), "the third packet offers it");
        d.offered(1, &k, true);
        assert!(!d.count(1, &k, D, 0), "offered: not again");
        // Aged out: counted afresh.
        assert!(d.returned(1, &k, false, 5));
        assert!(!d.count(1, &k, D, 5) && !d.count(1, &k, D, 5) && d.count(1, &k, D, 5));
        // Another tenant's same 5-tuple is another flow.
        assert!(!d.returned(2, &k, false, 5));
    }

    #[test]
    fn another_verdict_for_the_flow_counts_afresh() {
        let mut d = Stateless::new(2);
        let k = key(1003);
        assert!(!d.count(1, &k, D, 0));
        assert!(!d.count(1, &k, A, 0), "the rules changed: a new count");
        assert!(d.count(1, &k, A, 0));
    }

    #[test]
    fn an_offer_without_room_is_asked_for_again_and_a_refused_one_rests() {
        let mut d = Stateless::new(1);
        let k = key(1001);
        assert!(d.count(1, &k, D, 0));
        d.offered(1, &k, false);
        assert!(d.count(1, &k, D, 0), "the lane was full: asked again");
        d.offered(1, &k, true);
        assert!(d.returned(1, &k, true, 100));
        assert!(!d.count(1, &k, D, 100 + RETRY_SECS - 1), "refused: rests");
        assert!(d.count(1, &k, D, 100 + RETRY_SECS), "then is offered again");
    }

    #[test]
    fn a_connection_opening_withdraws_a_rule_of_either_direction() {
        let mut d = Stateless::new(1);
        let k = key(1002);
        assert!(d.count(1, &k, D, 0));
        d.offered(1, &k, true);
        assert!(
            d.opened(1, &k.reversed()),
            "the reply direction's connection"
        );
        assert!(!d.opened(1, &k), "forgotten");
        assert!(
            !d.returned(1, &k, false, 1),
            "its return is not the table's any more"
        );
        // Counting, not offered: nothing to withdraw.
        let mut d = Stateless::new(5);
        assert!(!d.count(1, &k, A, 0));
        assert!(!d.opened(1, &k));
    }

    #[test]
    fn more_flows_than_slots_stay_bounded() {
        let mut d = Stateless::new(2);
        let mut offered = 0;
        for round in 0..2 {
            for p in 0..(4 * SLOTS) as u16 {
                if d.count(1, &key(p), D, round) {
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
