//! The transport's connection limits: in total and per source address,
//! checked when a connection is accepted.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::target::Target;

/// How often a refusal is logged for one source address.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Most addresses whose last logged refusal is remembered.
const LOGGED: usize = 4096;

/// The open connections, against their limits.
#[derive(Debug)]
pub(super) struct Admissions {
    max_total: usize,
    max_per_address: usize,
    target: Target,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
    /// When a refusal was last logged, per source address.
    logged: HashMap<IpAddr, Instant>,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The transport holds its most connections.
    Total,
    /// The source address holds its most connections.
    PerAddress,
}

/// A connection's place under the limits; given back when dropped.
#[derive(Debug)]
pub(super) struct Admission {
    admissions: Arc<Admissions>,
    addr: IpAddr,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut o = self.admissions.open.lock().expect("admissions lock");
        o.total -= 1;
        if let Some(n) = o.by_address.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                o.by_address.remove(&self.addr);
            }
        }
    }
}

impl Admissions {
    /// Limits of `max_total` connections, `max_per_address` from one
    /// source address; refusals are counted in `target`'s statistics.
    pub(super) fn new(max_total: usize, max_per_address: usize, target: Target) -> Arc<Self> {
        Arc::new(Self {
            max_total,
            max_per_address,
            target,
            open: Mutex::new(Open::default()),
        })
    }

    /// Admits a connection from `addr`, or refuses it (counted, and
    /// logged at most once a minute per address).
    pub(super) fn admit(self: &Arc<Self>, addr: IpAddr) -> Result<Admission, Refusal> {
        let mut o = self.open.lock().expect("admissions lock");
        let from = o.by_address.get(&addr).copied().unwrap_or(0);
        let refusal = if o.total >= self.max_total {
            Some(Refusal::Total)
        } else if from >= self.max_per_address {
            Some(Refusal::PerAddress)
        } else {
            None
        };
        if let Some(r) = refusal {
            let stats = self.target.stats();
            match r {
                Refusal::Total => &stats.connections_over_limit,
                Refusal::PerAddress => &stats.connections_over_address_limit,
            }
            .fetch_add(1, Ordering::Relaxed);
            let now = Instant::now();
            let due = o
                .logged
                .get(&addr)
                .is_none_or(|t| now.duration_since(*t) >= LOG_EVERY);
            if due {
                if o.logged.len() >= LOGGED {
                    o.logged.retain(|_, t| now.duration_since(*t) < LOG_EVERY);
                }
                if o.logged.len() < LOGGED {
                    o.logged.insert(addr, now);
                }
                match r {
                    Refusal::Total => {
                        tracing::warn!(peer = %addr, max = self.max_total, "NVMe/TCP connection refused: the target holds its most connections (max_connections)")
                    }
                    Refusal::PerAddress => {
                        tracing::warn!(peer = %addr, max = self.max_per_address, "NVMe/TCP connection refused: the address holds its most connections (max_connections_per_address)")
                    }
                }
            }
            return Err(r);
        }
        o.total += 1;
        *o.by_address.entry(addr).or_default() += 1;
        Ok(Admission {
            admissions: self.clone(),
            addr,
        })
    }

    /// Connections open now.
    pub(super) fn open(&self) -> usize {
        self.open.lock().expect("admissions lock").total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_hold_in_total_and_per_address_and_free_on_drop() {
        let t = Target::new();
        let a = Admissions::new(3, 2, t.clone());
        let (x, y): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let x1 = a.admit(x).unwrap();
        let _x2 = a.admit(x).unwrap();
        assert_eq!(a.admit(x).unwrap_err(), Refusal::PerAddress);
        let _y1 = a.admit(y).unwrap();
        assert_eq!(a.admit(y).unwrap_err(), Refusal::Total);
        assert_eq!(a.open(), 3);
        drop(x1);
        assert_eq!(a.open(), 2);
        let _y2 = a.admit(y).unwrap();
        let s = t.stats();
        assert_eq!(s.connections_over_address_limit.load(Ordering::Relaxed), 1);
        assert_eq!(s.connections_over_limit.load(Ordering::Relaxed), 1);
    }
}
