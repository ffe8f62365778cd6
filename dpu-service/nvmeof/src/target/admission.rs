//! Who may connect, how often and with which keys: the per-host limit on
//! connected queues and each host's in-band authentication settings.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::auth::controller::HostKeys;
use crate::auth::limit::{AuthLimiter, AuthRate};

use super::Target;

/// In-band authentication settings, per subsystem and host.
#[derive(Debug, Default)]
pub(super) struct AuthConfig {
    /// Keys by (subsystem NQN, host NQN).
    keys: HashMap<(String, String), Arc<HostKeys>>,
    /// Whether a subsystem requires authentication, where set; by default
    /// it does for each host that has a secret.
    required: HashMap<String, bool>,
}

/// Connections per host NQN, against [`Target::set_max_connections_per_host`].
#[derive(Debug)]
pub(super) struct HostConnections {
    max: usize,
    open: HashMap<String, usize>,
    /// When a refusal was last logged, per host NQN (bounded).
    logged: HashMap<String, std::time::Instant>,
}

impl Default for HostConnections {
    fn default() -> Self {
        Self {
            max: DEFAULT_MAX_CONNECTIONS_PER_HOST,
            open: HashMap::new(),
            logged: HashMap::new(),
        }
    }
}

/// Default of [`Target::set_max_connections_per_host`]: several
/// controllers of 128 queues each.
pub const DEFAULT_MAX_CONNECTIONS_PER_HOST: usize = 512;

/// A connected queue's place under the per-host limit; given back when
/// dropped.
#[derive(Debug)]
pub(crate) struct HostAdmission {
    target: Target,
    host: String,
}

impl Drop for HostAdmission {
    fn drop(&mut self) {
        let mut h = self.target.inner.hosts.lock().expect("hosts lock");
        if let Some(n) = h.open.get_mut(&self.host) {
            *n -= 1;
            if *n == 0 {
                h.open.remove(&self.host);
            }
        }
    }
}

impl Target {
    /// Sets (`Some`) or removes (`None`) the DH-HMAC-CHAP secrets and
    /// allowed hashes and DH groups of host `hostnqn` on subsystem
    /// `subnqn`. Queues that connect from now on use them; queues already
    /// authenticated stay so.
    pub fn set_host_keys(&self, subnqn: &str, hostnqn: &str, keys: Option<HostKeys>) {
        let mut a = self.inner.auth.write().expect("auth lock");
        let k = (subnqn.to_owned(), hostnqn.to_owned());
        match keys {
            Some(keys) => {
                a.keys.insert(k, Arc::new(keys));
            }
            None => {
                a.keys.remove(&k);
            }
        }
    }

    /// The DH-HMAC-CHAP keys of `hostnqn` on `subnqn`, if set.
    pub fn host_keys(&self, subnqn: &str, hostnqn: &str) -> Option<Arc<HostKeys>> {
        self.inner
            .auth
            .read()
            .expect("auth lock")
            .keys
            .get(&(subnqn.to_owned(), hostnqn.to_owned()))
            .cloned()
    }

    /// Makes subsystem `subnqn` require authentication of every host
    /// (`Some(true)`), of none (`Some(false)`), or (`None`, the default)
    /// of each host that has a secret. A host without a secret where it
    /// is required cannot connect.
    pub fn set_auth_required(&self, subnqn: &str, required: Option<bool>) {
        let mut a = self.inner.auth.write().expect("auth lock");
        match required {
            Some(r) => {
                a.required.insert(subnqn.to_owned(), r);
            }
            None => {
                a.required.remove(subnqn);
            }
        }
    }

    /// Whether `hostnqn`'s queues on `subnqn` must authenticate, and with
    /// which keys.
    pub(crate) fn auth_policy(&self, subnqn: &str, hostnqn: &str) -> (bool, Option<Arc<HostKeys>>) {
        let a = self.inner.auth.read().expect("auth lock");
        let keys = a
            .keys
            .get(&(subnqn.to_owned(), hostnqn.to_owned()))
            .cloned();
        let required = a.required.get(subnqn).copied().unwrap_or(keys.is_some());
        (required, keys)
    }

    /// Authentication attempts per source address.
    pub fn auth_limiter(&self) -> &AuthLimiter {
        &self.inner.auth_limiter
    }

    /// Limits authentication attempts per source address (default
    /// [`AuthRate::default`]).
    pub fn set_auth_rate(&self, rate: AuthRate) {
        self.inner.auth_limiter.set_rate(rate);
    }

    /// Limits the queues (connections past Connect) of one host NQN, on
    /// all controllers together (default
    /// [`DEFAULT_MAX_CONNECTIONS_PER_HOST`]); a Connect beyond it is
    /// refused with Controller Busy and counted in
    /// [`TargetStats::connects_over_host_limit`]. Lowering it closes
    /// nothing.
    ///
    /// [`TargetStats::connects_over_host_limit`]: super::TargetStats::connects_over_host_limit
    pub fn set_max_connections_per_host(&self, max: usize) {
        self.inner.hosts.lock().expect("hosts lock").max = max.max(1);
    }

    /// Admits one more queue of `host`, or refuses it (counted, logged at
    /// most once a minute per host).
    pub(crate) fn admit_host(&self, host: &str) -> Option<HostAdmission> {
        let mut h = self.inner.hosts.lock().expect("hosts lock");
        let n = h.open.get(host).copied().unwrap_or(0);
        if n >= h.max {
            self.inner
                .stats
                .connects_over_host_limit
                .fetch_add(1, Ordering::Relaxed);
            let now = std::time::Instant::now();
            let due = h
                .logged
                .get(host)
                .is_none_or(|t| now.duration_since(*t) >= std::time::Duration::from_secs(60));
            if due {
                if h.logged.len() >= 4096 {
                    h.logged.clear();
                }
                h.logged.insert(host.to_string(), now);
                tracing::warn!(%host, max = h.max, "NVMe/TCP Connect refused: the host holds its most connections (max_connections_per_host)");
            }
            return None;
        }
        *h.open.entry(host.to_string()).or_default() += 1;
        Some(HostAdmission {
            target: self.clone(),
            host: host.to_string(),
        })
    }
}
