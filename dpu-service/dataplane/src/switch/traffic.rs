//! What the counters sum to: [`Traffic`] by tenant and rule, read from a
//! snapshot's shards, and the totals of replaced snapshots kept for the
//! tenants and rules that stay.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::compile::Compiled;

/// Traffic counters of one tenant, summed over workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantTraffic {
    /// Packets received on the tenant's attachments.
    pub rx_packets: u64,
    /// Bytes received on the tenant's attachments.
    pub rx_bytes: u64,
    /// Packets the filter let through (forwarded or flooded).
    pub forwarded_packets: u64,
    /// Packets the filter or the default policy dropped.
    pub dropped_packets: u64,
    /// Connections tracked now (a gauge, not a count).
    pub conntrack_entries: u64,
}

/// Counters of one rule, summed over workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleTraffic {
    /// Packets the rule matched (first match).
    pub packets: u64,
    /// Bytes of those packets.
    pub bytes: u64,
    /// Unix seconds of the last match; 0 if never.
    pub last_hit: u64,
}

/// Tenant and rule counters of the switch, by tenant name and (tenant,
/// rule ID), kept across configuration changes for tenants and rules that
/// stay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Traffic {
    /// By tenant name.
    pub tenants: std::collections::BTreeMap<String, TenantTraffic>,
    /// By (tenant name, rule ID).
    pub rules: std::collections::BTreeMap<(String, String), RuleTraffic>,
}

impl Traffic {
    fn add_tenant(&mut self, name: &str, t: TenantTraffic) {
        let e = self.tenants.entry(name.to_string()).or_default();
        e.rx_packets += t.rx_packets;
        e.rx_bytes += t.rx_bytes;
        e.forwarded_packets += t.forwarded_packets;
        e.dropped_packets += t.dropped_packets;
        e.conntrack_entries += t.conntrack_entries;
    }

    fn add_rule(&mut self, tenant: &str, rule: &str, r: RuleTraffic) {
        let e = self
            .rules
            .entry((tenant.to_string(), rule.to_string()))
            .or_default();
        e.packets += r.packets;
        e.bytes += r.bytes;
        e.last_hit = e.last_hit.max(r.last_hit);
    }

    pub(super) fn merge(&mut self, other: &Traffic) {
        for (n, t) in &other.tenants {
            self.add_tenant(n, *t);
        }
        for ((t, r), c) in &other.rules {
            self.add_rule(t, r, *c);
        }
    }
}

impl Compiled {
    /// This snapshot's counters, summed over its shards. The `current`
    /// snapshot's include the connection gauges and every rule; a retired
    /// one's only the rules that counted something, since carrying the
    /// others over would add nothing but a publish's worth of work for
    /// every idle rule of a large set.
    pub(super) fn traffic(&self, current: bool) -> Traffic {
        let mut out = Traffic::default();
        for (ti, t) in self.tenants.iter().enumerate() {
            let mut sum = TenantTraffic::default();
            for sh in self.shards.iter() {
                let c = &sh.tenants[ti];
                sum.rx_packets += c.rx_packets.load(Ordering::Relaxed);
                sum.rx_bytes += c.rx_bytes.load(Ordering::Relaxed);
                sum.forwarded_packets += c.forwarded.load(Ordering::Relaxed);
                sum.dropped_packets += c.dropped.load(Ordering::Relaxed);
                if current {
                    sum.conntrack_entries += c.conntrack.load(Ordering::Relaxed);
                }
            }
            out.add_tenant(&t.name, sum);
            // The counters first: a retired snapshot's rules that counted
            // nothing (most, in a large rule set) are skipped without
            // reading their slots.
            for ri in 0..t.slots.len() {
                let mut r = RuleTraffic::default();
                for sh in self.shards.iter() {
                    let c = &sh.rules[ti][ri];
                    r.packets += c.packets.load(Ordering::Relaxed);
                    r.bytes += c.bytes.load(Ordering::Relaxed);
                    r.last_hit = r.last_hit.max(c.last_hit.load(Ordering::Relaxed));
                }
                if !current && r == RuleTraffic::default() {
                    continue;
                }
                if let Some(slot) = &t.slots[ri] {
                    out.add_rule(&t.name, &slot.id, r);
                }
            }
        }
        out
    }
}

/// Counters of snapshots that are no longer current.
#[derive(Default)]
pub(super) struct History {
    /// Replaced snapshots some worker may still be counting into.
    pub(super) retired: Vec<Arc<Compiled>>,
    /// The totals of retired snapshots every worker has let go of.
    pub(super) carried: Traffic,
}

impl History {
    /// A retired snapshot only the history holds gets no more counts:
    /// folds its totals into the carried ones and lets it go.
    pub(super) fn fold_released(&mut self) {
        let mut i = 0;
        while i < self.retired.len() {
            if Arc::strong_count(&self.retired[i]) == 1 {
                let done = self.retired.swap_remove(i).traffic(false);
                self.carried.merge(&done);
            } else {
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::switch::testing::*;

    /// Tenant and rule counters count what the filter decided, and keep
    /// counting across configuration changes for the rules that stay.
    #[test]
    fn tenant_and_rule_counters_follow_their_ids() {
        let mut t = tenant("t1", &[(0, 0), (1, 0)], false);
        t.rules = dns_and_deny_7().into();
        let (h, mut p) = switch(2, vec![t.clone()]);
        p.turn();
        let a = udp(1, mac(2), None, 53);
        let (len_a, len_b) = (a.len() as u64, udp(7, mac(2), None, 53).len() as u64);
        run(&mut p, 0, a); // allowed by "dns"
        run(&mut p, 0, udp(7, mac(2), None, 53)); // denied by "deny7"
        run(&mut p, 0, udp(1, mac(2), None, 80)); // default deny
        let c = h.traffic();
        let tc = c.tenants["t1"];
        assert_eq!(
            (tc.rx_packets, tc.forwarded_packets, tc.dropped_packets),
            (3, 1, 2)
        );
        let dns_c = c.rules[&("t1".to_string(), "dns".to_string())];
        assert_eq!((dns_c.packets, dns_c.bytes), (1, len_a));
        assert!(dns_c.last_hit > 1_600_000_000, "last hit is a Unix time");
        let deny_c = c.rules[&("t1".to_string(), "deny7".to_string())];
        assert_eq!((deny_c.packets, deny_c.bytes), (1, len_b));

        // Drop "deny7", keep "dns" (now at another index): "dns" goes on
        // from its count, "deny7" is gone once no worker holds the old
        // snapshot.
        let mut t2 = t.clone();
        std::sync::Arc::make_mut(&mut t2.rules).remove(1);
        std::sync::Arc::make_mut(&mut t2.rules).insert(
            0,
            SwitchRule {
                id: "x".into(),
                matches: AclRule::any(1, 0, Family::V6),
                allow: true,
                stateful: false,
                rate_limit: None,
            },
        );
        h.publish(&SwitchConfig {
            ports: 2,
            tenants: vec![t2],
            ..SwitchConfig::default()
        })
        .unwrap();
        p.turn();
        run(&mut p, 0, udp(1, mac(2), None, 53));
        let c = h.traffic();
        assert_eq!(c.rules[&("t1".to_string(), "dns".to_string())].packets, 2);
        assert!(!c
            .rules
            .contains_key(&("t1".to_string(), "deny7".to_string())));
        assert_eq!(c.rules[&("t1".to_string(), "x".to_string())].packets, 0);
        assert_eq!(c.tenants["t1"].rx_packets, 4);
        // Replaced snapshots are let go at the next publish even when
        // nobody reads counters.
        for _ in 0..5 {
            h.publish(&SwitchConfig {
                ports: 2,
                tenants: vec![t.clone()],
                ..SwitchConfig::default()
            })
            .unwrap();
            p.turn();
        }
        let retired = h.shared.history.lock().unwrap().retired.len();
        assert!(retired <= 1, "{retired} replaced snapshots kept");
        // A deleted tenant's counts go with it.
        h.publish(&SwitchConfig {
            ports: 2,
            ..SwitchConfig::default()
        })
        .unwrap();
        p.turn();
        assert!(h.traffic().tenants.is_empty());
    }
}
