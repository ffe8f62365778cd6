//! Authentication attempts per source address: a token bucket for each,
//! in a table of bounded size.
//!
//! Every AUTH_Negotiate takes a token from its source's bucket before any
//! Diffie-Hellman work; an attempt that finds the bucket empty is refused
//! (the host gets an AUTH_Failure1). An attempt that succeeds gives its
//! token back, so a host that knows its secret is never slowed by its own
//! reconnects, however many queues it has; one that keeps failing (no
//! secret, a wrong one, or one that gives up half-way) is held to
//! [`AuthRate::per_sec`] attempts a second after a burst of
//! [`AuthRate::burst`].
//!
//! Sources are IPv4 addresses, and IPv6 addresses by their /64 prefix (one
//! host usually owns a whole /64). The table tracks at most
//! [`AuthRate::sources`] of them; a new one beyond that evicts the one
//! tracked longest. Refusals are logged at most once per [`LOG_EVERY`],
//! with the number left unlogged since.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often refusals are logged at most.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The limits of an [`AuthLimiter`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AuthRate {
    /// Attempts a second a source regains (0 < per_sec).
    pub per_sec: f64,
    /// Attempts a source may make at once (at least 1).
    pub burst: u32,
    /// Sources tracked at once (at least 1).
    pub sources: usize,
}

/// Default of [`AuthRate::per_sec`]: a failing source gets an attempt
/// every half second, about the DH work of one ffdhe8192 authentication
/// a second.
pub const DEFAULT_PER_SEC: f64 = 2.0;
/// Default of [`AuthRate::burst`].
pub const DEFAULT_BURST: u32 = 16;
/// Default of [`AuthRate::sources`]: 4096 entries of about 64 bytes.
pub const DEFAULT_SOURCES: usize = 4096;

impl Default for AuthRate {
    fn default() -> Self {
        Self {
            per_sec: DEFAULT_PER_SEC,
            burst: DEFAULT_BURST,
            sources: DEFAULT_SOURCES,
        }
    }
}

/// What [`AuthLimiter::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// The attempt may go on.
    Allowed,
    /// The attempt is refused. `log` is `Some(n)` when this refusal
    /// should be logged, `n` refusals having gone unlogged before it.
    Refused {
        /// Refusals not logged since the last one that was.
        log: Option<u64>,
    },
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Lets one log line through per [`LOG_EVERY`], counting the rest.
#[derive(Debug, Default)]
struct LogGate {
    last: Option<Instant>,
    unlogged: u64,
}

impl LogGate {
    /// `Some(n)` when a line is due now, `n` having been held back since
    /// the last.
    fn due(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_none_or(|l| now.saturating_duration_since(l) >= LOG_EVERY)
        {
            self.last = Some(now);
            Some(std::mem::take(&mut self.unlogged))
        } else {
            self.unlogged += 1;
            None
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    buckets: HashMap<IpAddr, Bucket>,
    /// Sources in the order they were first tracked.
    order: VecDeque<IpAddr>,
    log: LogGate,
}

/// Authentication attempts per source address; shared by all the
/// connections of a target.
#[derive(Debug, Default)]
pub struct AuthLimiter {
    rate: Mutex<AuthRate>,
    table: Mutex<Table>,
    busy: Mutex<LogGate>,
}

/// The key of `ip`: IPv4 as it is (and IPv4-mapped IPv6 as IPv4), IPv6
/// by its /64 prefix.
fn source(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

impl AuthLimiter {
    /// A limiter with `rate`.
    pub fn new(rate: AuthRate) -> Self {
        Self {
            rate: Mutex::new(rate),
            table: Mutex::default(),
            busy: Mutex::default(),
        }
    }

    /// The limits.
    pub fn rate(&self) -> AuthRate {
        *self.rate.lock().expect("auth rate lock")
    }

    /// Changes the limits; sources tracked beyond the new table size are
    /// forgotten, oldest first.
    pub fn set_rate(&self, rate: AuthRate) {
        *self.rate.lock().expect("auth rate lock") = rate;
        let mut t = self.table.lock().expect("auth limiter lock");
        while t.order.len() > rate.sources.max(1) {
            if let Some(old) = t.order.pop_front() {
                t.buckets.remove(&old);
            }
        }
    }

    /// Sources tracked now.
    pub fn tracked(&self) -> usize {
        self.table.lock().expect("auth limiter lock").buckets.len()
    }

    /// An authentication attempt from `ip` at `now`: takes a token if
    /// there is one.
    pub fn admit(&self, ip: IpAddr, now: Instant) -> Admit {
        let rate = self.rate();
        let key = source(ip);
        let mut t = self.table.lock().expect("auth limiter lock");
        let burst = f64::from(rate.burst.max(1));
        if !t.buckets.contains_key(&key) {
            while t.order.len() >= rate.sources.max(1) {
                if let Some(old) = t.order.pop_front() {
                    t.buckets.remove(&old);
                }
            }
            t.order.push_back(key);
            t.buckets.insert(
                key,
                Bucket {
                    tokens: burst,
                    at: now,
                },
            );
        }
        let Some(b) = t.buckets.get_mut(&key) else {
            return Admit::Allowed;
        };
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * rate.per_sec).min(burst);
        b.at = now.max(b.at);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Admit::Allowed;
        }
        Admit::Refused {
            log: t.log.due(now),
        }
    }

    /// An authentication was refused for a full DH pool at `now`:
    /// `Some(n)` when that should be logged, `n` such refusals having gone
    /// unlogged before (at most one line per [`LOG_EVERY`]).
    pub fn busy_log(&self, now: Instant) -> Option<u64> {
        self.busy.lock().expect("auth limiter lock").due(now)
    }

    /// An attempt from `ip` succeeded: its token comes back.
    pub fn refund(&self, ip: IpAddr) {
        let burst = f64::from(self.rate().burst.max(1));
        let mut t = self.table.lock().expect("auth limiter lock");
        if let Some(b) = t.buckets.get_mut(&source(ip)) {
            b.tokens = (b.tokens + 1.0).min(burst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn limiter(per_sec: f64, burst: u32, sources: usize) -> AuthLimiter {
        AuthLimiter::new(AuthRate {
            per_sec,
            burst,
            sources,
        })
    }

    #[test]
    fn a_burst_then_the_rate() {
        let l = limiter(2.0, 3, 16);
        let t0 = Instant::now();
        let a = ip("10.0.0.1");
        for _ in 0..3 {
            assert_eq!(l.admit(a, t0), Admit::Allowed);
        }
        assert!(matches!(l.admit(a, t0), Admit::Refused { .. }));
        // Half a second brings one token back at 2 a second, not two.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(l.admit(a, t1), Admit::Allowed);
        assert!(matches!(l.admit(a, t1), Admit::Refused { .. }));
        // A long pause refills to the burst, no further.
        let t2 = t1 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert_eq!(l.admit(a, t2), Admit::Allowed);
        }
        assert!(matches!(l.admit(a, t2), Admit::Refused { .. }));
        // Another address has its own bucket.
        assert_eq!(l.admit(ip("10.0.0.2"), t2), Admit::Allowed);
    }

    #[test]
    fn success_gives_the_token_back() {
        let l = limiter(0.001, 2, 16);
        let t0 = Instant::now();
        let a = ip("192.0.2.7");
        for _ in 0..100 {
            assert_eq!(l.admit(a, t0), Admit::Allowed);
            l.refund(a);
        }
        assert_eq!(l.admit(a, t0), Admit::Allowed);
        assert_eq!(l.admit(a, t0), Admit::Allowed);
        assert!(matches!(l.admit(a, t0), Admit::Refused { .. }));
        // Never above the burst.
        for _ in 0..10 {
            l.refund(a);
        }
        assert_eq!(l.admit(a, t0), Admit::Allowed);
        assert_eq!(l.admit(a, t0), Admit::Allowed);
        assert!(matches!(l.admit(a, t0), Admit::Refused { .. }));
    }

    #[test]
    fn the_table_is_bounded_and_evicts_the_oldest() {
        let l = limiter(0.001, 1, 4);
        let t0 = Instant::now();
        for i in 0..4 {
            assert_eq!(l.admit(ip(&format!("10.0.1.{i}")), t0), Admit::Allowed);
        }
        assert_eq!(l.tracked(), 4);
        // The first is still tracked: refused.
        assert!(matches!(l.admit(ip("10.0.1.0"), t0), Admit::Refused { .. }));
        for i in 4..1000 {
            let _ = l.admit(ip(&format!("10.0.{}.{}", i / 256, i % 256)), t0);
            assert!(l.tracked() <= 4);
        }
        // 10.0.1.1 was evicted long ago: it starts again with a full bucket.
        assert_eq!(l.admit(ip("10.0.1.1"), t0), Admit::Allowed);
        // Shrinking the table forgets the oldest.
        l.set_rate(AuthRate {
            per_sec: 0.001,
            burst: 1,
            sources: 2,
        });
        assert_eq!(l.tracked(), 2);
    }

    #[test]
    fn ipv6_counts_by_its_64_prefix_and_mapped_ipv4_as_ipv4() {
        let l = limiter(0.001, 1, 16);
        let t0 = Instant::now();
        assert_eq!(l.admit(ip("2001:db8:1:2::1"), t0), Admit::Allowed);
        assert!(matches!(
            l.admit(ip("2001:db8:1:2:ffff::9"), t0),
            Admit::Refused { .. }
        ));
        assert_eq!(l.admit(ip("2001:db8:1:3::1"), t0), Admit::Allowed);
        assert_eq!(l.admit(ip("10.9.9.9"), t0), Admit::Allowed);
        assert!(matches!(
            l.admit(ip("::ffff:10.9.9.9"), t0),
            Admit::Refused { .. }
        ));
    }

    #[test]
    fn refusals_are_logged_at_most_once_per_period_with_the_count() {
        let l = limiter(0.001, 1, 16);
        let t0 = Instant::now();
        let a = ip("10.0.0.1");
        assert_eq!(l.admit(a, t0), Admit::Allowed);
        assert_eq!(l.admit(a, t0), Admit::Refused { log: Some(0) });
        for _ in 0..5 {
            assert_eq!(l.admit(a, t0), Admit::Refused { log: None });
        }
        assert_eq!(l.admit(a, t0 + LOG_EVERY), Admit::Refused { log: Some(5) });
    }
}
