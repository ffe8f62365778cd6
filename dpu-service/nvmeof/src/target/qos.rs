//! The target's QoS limiters ([`crate::qos`]): its own, and one per
//! subsystem and scope (a namespace, a host), kept across configuration
//! changes and controllers so that their buckets and counters carry on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::qos::{Limiter, QosLimits, QosScope, QosStat};

use super::{Target, TargetConfig};

/// The limiters by subsystem NQN and scope. Holds those configured and
/// those a live namespace or controller holds; the rest are dropped at
/// the next [`Target::apply`] or once the map has doubled since the last
/// pruning, so hosts that come and go do not grow it.
#[derive(Debug, Default)]
pub(super) struct Limiters {
    map: Mutex<LimiterMap>,
    /// The target's own limiter ([`QosScope::Target`]), set apart from
    /// the configuration ([`Target::set_qos`]).
    all: Arc<Limiter>,
}

#[derive(Debug, Default)]
struct LimiterMap {
    by_scope: HashMap<(String, QosScope), Arc<Limiter>>,
    /// Entries after the last pruning.
    pruned_at: usize,
}

impl LimiterMap {
    /// Drops the limiters no one holds and no configuration sets.
    fn prune(&mut self) {
        self.by_scope
            .retain(|_, l| Arc::strong_count(l) > 1 || l.is_active());
        self.pruned_at = self.by_scope.len();
    }
}

impl Limiters {
    /// The limiter of `scope` on `subnqn`, made without limits if none is
    /// (the target's own for [`QosScope::Target`], whatever `subnqn`).
    pub(super) fn get(&self, subnqn: &str, scope: QosScope) -> Arc<Limiter> {
        if scope == QosScope::Target {
            return self.all.clone();
        }
        let mut m = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if m.by_scope.len() >= 2 * m.pruned_at.max(64) {
            m.prune();
        }
        m.by_scope
            .entry((subnqn.to_string(), scope))
            .or_default()
            .clone()
    }

    /// Sets every limiter to what `config` says (no limits where it says
    /// none), then drops those no one holds.
    pub(super) fn configure(&self, config: &TargetConfig) {
        let mut want: HashMap<(String, QosScope), QosLimits> = HashMap::new();
        for sc in &config.subsystems {
            for nc in sc.namespaces.iter().filter(|n| !n.qos.is_none()) {
                want.insert((sc.nqn.clone(), QosScope::Namespace(nc.nsid)), nc.qos);
            }
            for (host, q) in sc.host_qos.iter().filter(|(_, q)| !q.is_none()) {
                want.insert((sc.nqn.clone(), QosScope::Host(host.clone())), *q);
            }
        }
        let mut m = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, l) in &m.by_scope {
            l.set(want.remove(key).unwrap_or_default());
        }
        for (key, q) in want {
            m.by_scope.insert(key, Arc::new(Limiter::new(q)));
        }
        m.prune();
    }

    /// Every limiter with limits or with commands held back, sorted.
    pub(super) fn stats(&self) -> Vec<QosStat> {
        let m = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let all = (String::new(), QosScope::Target);
        let mut v: Vec<QosStat> = m
            .by_scope
            .iter()
            .chain(std::iter::once((&all, &self.all)))
            .filter(|(_, l)| l.is_active() || l.throttled_commands() > 0)
            .map(|((subnqn, scope), l)| QosStat {
                subnqn: subnqn.clone(),
                scope: scope.clone(),
                limits: l.limits(),
                throttled_commands: l.throttled_commands(),
                throttled_time: l.throttled_time(),
            })
            .collect();
        v.sort_by(|a, b| (&a.subnqn, &a.scope).cmp(&(&b.subnqn, &b.scope)));
        v
    }
}

impl Target {
    /// The limiter of `scope` on the subsystem `subnqn` (one without
    /// limits when none are configured; configuring some later sets them
    /// on it).
    pub(crate) fn limiter(&self, subnqn: &str, scope: QosScope) -> Arc<Limiter> {
        self.inner.limiters.get(subnqn, scope)
    }

    /// The target's own limiter ([`Target::set_qos`]).
    pub(crate) fn qos_limiter(&self) -> &Limiter {
        &self.inner.limiters.all
    }

    /// Every QoS limiter with limits set or commands held back: its
    /// limits, and the commands that waited for it and for how long.
    pub fn qos_stats(&self) -> Vec<QosStat> {
        self.inner.limiters.stats()
    }

    /// Limits everything the target serves, all subsystems, namespaces
    /// and hosts together ([`QosScope::Target`]; for a tenant's target,
    /// the tenant's storage endpoints), from the next command on; none
    /// by default. [`Target::apply`] leaves them as they are.
    pub fn set_qos(&self, limits: QosLimits) {
        self.inner.limiters.all.set(limits);
    }

    /// The limits [`Target::set_qos`] set.
    pub fn qos(&self) -> QosLimits {
        self.inner.limiters.all.limits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hosts that connect under ever new NQNs (any host allowed) and go
    /// leave no more limiters behind than twice the live ones, or 128.
    #[test]
    fn limiters_of_hosts_gone_do_not_pile_up() {
        let l = Limiters::default();
        let live: Vec<Arc<Limiter>> = (0..10)
            .map(|i| l.get("nqn.a", QosScope::Host(format!("live-{i}"))))
            .collect();
        for i in 0..100_000 {
            drop(l.get("nqn.a", QosScope::Host(format!("gone-{i}"))));
            let n = l.map.lock().unwrap().by_scope.len();
            assert!(n <= 128, "{n} limiters after {i} hosts");
        }
        // Those still held are kept, with their place in the map.
        for (i, h) in live.iter().enumerate() {
            let again = l.get("nqn.a", QosScope::Host(format!("live-{i}")));
            assert!(Arc::ptr_eq(h, &again));
        }
    }
}
