//! Quality of service: limits on the I/O rate and bandwidth of a namespace
//! or of one host on a subsystem, enforced where block requests start.
//!
//! Each limit is a rate (commands or bytes per second) kept by the generic
//! cell rate algorithm, a token bucket held as one time per limit: the
//! theoretical arrival time (TAT) of the next unit. A command may start
//! when, for every limit it counts against, the TAT is at most [`BURST`]
//! ahead of now; starting it moves each TAT on by the command's cost
//! (one command, or its bytes, at the limit's rate). A command larger
//! than the burst still starts, and the limit then holds the next ones
//! back for as long as it overdrew: over time the rate holds exactly.
//!
//! A command that may not start yet is not refused: it waits, first in
//! its connection's queue, and [`admit`] says until when. The connection
//! tells its transport ([`crate::conn::Connection::throttled_until`]),
//! which sleeps until then instead of polling.
//!
//! Reads count against `iops`, `read_iops`, `bandwidth` and
//! `read_bandwidth`; writes against `iops`, `write_iops`, `bandwidth` and
//! `write_bandwidth`; every other I/O command (Flush, Write Zeroes,
//! Dataset Management) against `iops` alone, as SPDK's target counts them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How far ahead of now a limit's TAT may be for a command to start: the
/// burst a limit lets through after an idle spell (5 ms of its rate), and
/// how late a transport may wake without the rate falling short.
pub const BURST: Duration = Duration::from_millis(5);

/// Limits on I/O, per second; 0 is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct QosLimits {
    /// Commands of every kind.
    pub iops: u64,
    /// Read commands.
    pub read_iops: u64,
    /// Write commands.
    pub write_iops: u64,
    /// Bytes read and written.
    pub bandwidth: u64,
    /// Bytes read.
    pub read_bandwidth: u64,
    /// Bytes written.
    pub write_bandwidth: u64,
}

impl QosLimits {
    /// True when no limit is set.
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }

    /// The limits in the order of [`Dim`].
    fn rates(&self) -> [u64; DIMS] {
        [
            self.iops,
            self.read_iops,
            self.write_iops,
            self.bandwidth,
            self.read_bandwidth,
            self.write_bandwidth,
        ]
    }
}

impl std::fmt::Display for QosLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_none() {
            return f.write_str("none");
        }
        let names = [
            "iops",
            "read_iops",
            "write_iops",
            "bandwidth",
            "read_bandwidth",
            "write_bandwidth",
        ];
        let mut first = true;
        for (name, rate) in names.iter().zip(self.rates()) {
            if rate > 0 {
                if !first {
                    f.write_str(" ")?;
                }
                write!(f, "{name}={rate}")?;
                first = false;
            }
        }
        Ok(())
    }
}

/// Whose I/O a [`Limiter`] holds, within one subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QosScope {
    /// One namespace, by NSID: every host's commands to it.
    Namespace(u32),
    /// One host, by host NQN: its commands to every namespace of the
    /// subsystem, on all its controllers.
    Host(String),
    /// Everything the target serves, every subsystem and host together
    /// (for a tenant's target, the tenant's storage endpoints); its
    /// [`QosStat::subnqn`] is empty.
    Target,
}

/// A limiter's limits and what it held back, for metrics and the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosStat {
    /// The subsystem.
    pub subnqn: String,
    /// Whose I/O.
    pub scope: QosScope,
    /// The limits in force.
    pub limits: QosLimits,
    /// Commands that waited for it.
    pub throttled_commands: u64,
    /// The time they waited first in their connections' lines, in all
    /// ([`Limiter::throttled_time`]).
    pub throttled_time: Duration,
}

/// The number of limits in [`QosLimits`].
const DIMS: usize = 6;

/// What a command costs, per limit: its count and its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cost {
    /// A read of this many bytes.
    Read(u64),
    /// A write of this many bytes.
    Write(u64),
    /// Any other command.
    Other,
}

impl Cost {
    /// Units of each limit the command takes (commands or bytes), in the
    /// order of [`QosLimits::rates`]; 0 where it does not count.
    fn units(self) -> [u64; DIMS] {
        match self {
            Cost::Read(b) => [1, 1, 0, b, b, 0],
            Cost::Write(b) => [1, 0, 1, b, 0, b],
            Cost::Other => [1, 0, 0, 0, 0, 0],
        }
    }
}

/// One scope's limits and their buckets, shared by every connection the
/// scope's commands arrive on, whatever thread serves them.
#[derive(Debug)]
pub struct Limiter {
    /// Some limit is set: when not, [`admit`] takes no lock and reads no
    /// clock for it.
    active: AtomicBool,
    state: Mutex<Buckets>,
    /// Commands that waited for this limiter.
    throttled: AtomicU64,
    /// Nanoseconds they waited first in their connections' lines (the
    /// commands behind one wait with it, uncounted): how long the limiter
    /// held connections back.
    throttled_ns: AtomicU64,
}

#[derive(Debug)]
struct Buckets {
    limits: QosLimits,
    /// Where the TATs count from.
    epoch: Instant,
    /// Per limit: the TAT, in nanoseconds since `epoch`.
    tat: [u64; DIMS],
}

impl Default for Limiter {
    fn default() -> Self {
        Self::new(QosLimits::default())
    }
}

impl Limiter {
    /// A limiter with `limits`.
    pub fn new(limits: QosLimits) -> Self {
        Self {
            active: AtomicBool::new(!limits.is_none()),
            state: Mutex::new(Buckets {
                limits,
                epoch: Instant::now(),
                tat: [0; DIMS],
            }),
            throttled: AtomicU64::new(0),
            throttled_ns: AtomicU64::new(0),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> QosLimits {
        self.lock().limits
    }

    /// Replaces the limits, taking effect for the next command: what the
    /// old limits held back is forgiven, so a raised limit is felt at once.
    pub fn set(&self, limits: QosLimits) {
        let mut b = self.lock();
        if b.limits == limits {
            return;
        }
        let now = ns_since(b.epoch, Instant::now());
        for t in &mut b.tat {
            *t = (*t).min(now);
        }
        b.limits = limits;
        self.active.store(!limits.is_none(), Ordering::Release);
    }

    /// True when some limit is set.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Commands that had to wait for this limiter.
    pub fn throttled_commands(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// The time they waited first in their connections' lines, in all:
    /// how long the limiter held connections back.
    pub fn throttled_time(&self) -> Duration {
        Duration::from_nanos(self.throttled_ns.load(Ordering::Relaxed))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buckets> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes that a command waited `waited` for this limiter.
    fn note_wait(&self, waited: Duration) {
        self.throttled.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.throttled_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Buckets {
    /// When the command of `units` may start, if not now (`None`).
    fn wait(&self, units: &[u64; DIMS], now: u64) -> Option<u64> {
        let burst = BURST.as_nanos() as u64;
        let mut until = None::<u64>;
        for ((&rate, &u), &tat) in self.limits.rates().iter().zip(units).zip(&self.tat) {
            if rate == 0 || u == 0 {
                continue;
            }
            let earliest = tat.saturating_sub(burst);
            if earliest > now {
                until = Some(until.map_or(earliest, |t| t.max(earliest)));
            }
        }
        until
    }

    /// Charges the command of `units`, started at `now`.
    fn charge(&mut self, units: &[u64; DIMS], now: u64) {
        let rates = self.limits.rates();
        for ((&rate, &u), tat) in rates.iter().zip(units).zip(&mut self.tat) {
            if rate == 0 || u == 0 {
                continue;
            }
            // The cost in nanoseconds of `u` units at `rate` per second.
            let cost = (u128::from(u) * 1_000_000_000).div_ceil(u128::from(rate));
            let cost = u64::try_from(cost).unwrap_or(u64::MAX);
            *tat = (*tat).max(now).saturating_add(cost);
        }
    }
}

/// Nanoseconds from `epoch` to `now` (0 before it).
fn ns_since(epoch: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

/// A command's place under its limiters while it waits to start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Throttle {
    /// When it was first held back, and by which of its limiters (bit
    /// `i` for the `i`-th given to [`admit`]).
    pub since: Option<(Instant, u8)>,
}

/// Most limiters one command counts against.
pub const MAX_LIMITERS: usize = 4;

/// Asks every limiter in `limiters` (at most [`MAX_LIMITERS`], always in
/// the same order, so that two threads never take their locks in opposite
/// orders) whether a command of `cost` may start at `now`. If it may,
/// charges it to all of them, notes how long it waited if it did, and
/// answers `Ok`; else answers when to ask again, and notes in `throttle`
/// that it waits. Allocates nothing; takes no lock and reads no clock of
/// a limiter without limits.
///
/// # Errors
/// The time before which the command may not start.
pub fn admit(
    limiters: &[&Limiter],
    cost: Cost,
    throttle: &mut Throttle,
    now: Instant,
) -> Result<(), Instant> {
    let limiters = &limiters[..limiters.len().min(MAX_LIMITERS)];
    if !limiters.iter().any(|l| l.is_active()) {
        finish(limiters, throttle, now);
        return Ok(());
    }
    let units = cost.units();
    let mut guards: [Option<std::sync::MutexGuard<'_, Buckets>>; MAX_LIMITERS] = Default::default();
    let mut until: Option<Instant> = None;
    let mut holding = 0u8;
    for (i, l) in limiters.iter().enumerate() {
        if !l.is_active() {
            continue;
        }
        let g = l.lock();
        if let Some(t) = g.wait(&units, ns_since(g.epoch, now)) {
            let at = g.epoch + Duration::from_nanos(t);
            until = Some(until.map_or(at, |u| u.max(at)));
            holding |= 1 << i;
        }
        guards[i] = Some(g);
    }
    if let Some(at) = until {
        drop(guards);
        if throttle.since.is_none() {
            throttle.since = Some((now, holding));
        }
        return Err(at);
    }
    for g in guards.iter_mut().flatten() {
        let n = ns_since(g.epoch, now);
        g.charge(&units, n);
    }
    drop(guards);
    finish(limiters, throttle, now);
    Ok(())
}

/// Notes the wait of a command that starts now, if it waited.
fn finish(limiters: &[&Limiter], throttle: &mut Throttle, now: Instant) {
    if let Some((since, holding)) = throttle.since.take() {
        let waited = now.saturating_duration_since(since);
        for (i, l) in limiters.iter().enumerate() {
            if holding & (1 << i) != 0 {
                l.note_wait(waited);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs commands of `cost` through `limiters` as fast as they are let
    /// through, on a simulated clock, for `secs` seconds (each command
    /// takes 10 µs to submit); answers how many started.
    fn started(limiters: &[&Limiter], cost: Cost, clock: &mut Instant, secs: u64) -> u64 {
        let end = *clock + Duration::from_secs(secs);
        let now = clock;
        let mut n = 0;
        let mut throttle = Throttle::default();
        while *now < end {
            match admit(limiters, cost, &mut throttle, *now) {
                Ok(()) => {
                    n += 1;
                    *now += Duration::from_micros(10);
                }
                // A transport wakes a little late.
                Err(at) => *now = at + Duration::from_micros(300),
            }
        }
        n
    }

    #[test]
    fn a_rate_holds_over_time() {
        let mut clock = Instant::now();
        let l = Limiter::new(QosLimits {
            iops: 1000,
            ..QosLimits::default()
        });
        let n = started(&[&l], Cost::Read(4096), &mut clock, 10);
        // 10 s at 1000/s, plus the first burst.
        assert!((10_000..=10_010).contains(&n), "{n}");
        assert!(l.throttled_commands() > 9000);
    }

    #[test]
    fn bandwidth_counts_bytes_and_large_commands_overdraw() {
        let mut clock = Instant::now();
        let l = Limiter::new(QosLimits {
            read_bandwidth: 1 << 20,
            ..QosLimits::default()
        });
        // 128 KiB commands at 1 MiB/s: 8 a second, each far over the burst.
        let n = started(&[&l], Cost::Read(128 << 10), &mut clock, 10);
        assert!((80..=81).contains(&n), "{n}");
        // Writes do not count against a read limit.
        let n = started(&[&l], Cost::Write(128 << 10), &mut clock, 1);
        assert_eq!(n, 100_000);
    }

    #[test]
    fn the_tightest_of_several_limiters_wins() {
        let mut clock = Instant::now();
        let ns = Limiter::new(QosLimits {
            iops: 5000,
            ..QosLimits::default()
        });
        let host = Limiter::new(QosLimits {
            write_iops: 200,
            ..QosLimits::default()
        });
        let n = started(&[&ns, &host], Cost::Write(512), &mut clock, 5);
        assert!((1000..=1002).contains(&n), "{n}");
        assert_eq!(ns.throttled_commands(), 0, "the host's limit held them");
        assert!(host.throttled_commands() > 900);
        // Reads pass the host, and only the namespace holds them.
        let n = started(&[&ns, &host], Cost::Read(512), &mut clock, 1);
        assert!((5000..=5030).contains(&n), "{n}");
        assert!(ns.throttled_commands() > 0);
    }

    #[test]
    fn no_limit_takes_nothing_and_admits_all() {
        let l = Limiter::default();
        assert!(!l.is_active());
        let mut t = Throttle::default();
        for _ in 0..1000 {
            assert_eq!(admit(&[&l], Cost::Other, &mut t, Instant::now()), Ok(()));
        }
        assert_eq!(l.throttled_commands(), 0);
    }

    #[test]
    fn a_changed_limit_is_felt_at_once() {
        let l = Limiter::new(QosLimits {
            iops: 1,
            ..QosLimits::default()
        });
        let now = Instant::now();
        let mut t = Throttle::default();
        assert_eq!(admit(&[&l], Cost::Other, &mut t, now), Ok(()));
        let at = admit(&[&l], Cost::Other, &mut t, now).unwrap_err();
        assert!(at >= now + Duration::from_millis(990), "{:?}", at - now);
        l.set(QosLimits {
            iops: 1000,
            ..QosLimits::default()
        });
        assert_eq!(admit(&[&l], Cost::Other, &mut t, now), Ok(()));
        assert_eq!(l.throttled_commands(), 1);
        l.set(QosLimits::default());
        assert!(!l.is_active());
    }

    #[test]
    fn limits_print_what_is_set() {
        assert_eq!(QosLimits::default().to_string(), "none");
        let l = QosLimits {
            iops: 10,
            write_bandwidth: 5,
            ..QosLimits::default()
        };
        assert_eq!(l.to_string(), "iops=10 write_bandwidth=5");
    }
}
