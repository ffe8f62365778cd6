//! Segments for RAM namespaces, faulted in before their first write by a
//! thread of their own (`nvmf-ram-spares`).
//!
//! The first touch of a fresh 2 MiB segment makes the kernel find, zero
//! and map a huge page: 0.3 to 8.5 ms on the development VM (3.4 ms on
//! average over 64). Done on a poll group, at a namespace's first write
//! to the segment, it would stall every connection of the group that
//! long, whoever they belong to. A [`Spares`] pool keeps up to its
//! capacity of segments touched and zero: a write takes one without
//! waiting ([`Spares::take`]: `None` when none is ready, or while the
//! thread holds the pool for the moment of a push; the caller then maps
//! its own, as before), and the thread makes the next.
//!
//! The pool holds memory only while a RAM namespace exists ([`User`]):
//! with none, the thread gives the spares back. So the service holds at
//! most [`SPARES`] segments (16 MiB) beside its namespaces' data.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

use dpu_os::hugemem::{HugeMem, HUGE_PAGE};

/// Segments the process-wide pool keeps ready.
pub const SPARES: usize = 8;

/// How long the thread sleeps between looks when nothing wakes it, and
/// after a mapping the kernel refused.
const NAP: Duration = Duration::from_millis(500);

/// Ready segments, and whether anyone may take them.
#[derive(Debug)]
pub struct Spares {
    /// Bytes per segment.
    segment: usize,
    /// Most segments kept ready.
    capacity: usize,
    ready: Mutex<Vec<HugeMem>>,
    wake: Condvar,
    /// RAM namespaces alive ([`User`]s).
    users: AtomicUsize,
}

/// A RAM namespace's registration with a pool: while one exists, the pool
/// keeps segments ready.
#[derive(Debug)]
pub struct User(Arc<Spares>);

impl Drop for User {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, Ordering::AcqRel);
        self.0.wake.notify_one();
    }
}

impl User {
    /// A ready segment of the pool, if one is there now; never waits.
    pub fn take(&self) -> Option<HugeMem> {
        self.0.take()
    }
}

/// The process's pool of segments of one huge page (2 MiB), a RAM
/// namespace's.
pub fn global() -> &'static Arc<Spares> {
    static POOL: OnceLock<Arc<Spares>> = OnceLock::new();
    POOL.get_or_init(|| Spares::start(HUGE_PAGE, SPARES))
}

impl Spares {
    /// A pool of `capacity` segments of `segment` bytes and its thread,
    /// which ends once the pool is dropped. Where the thread cannot
    /// start, the pool stays empty and every write maps its own segment.
    pub fn start(segment: usize, capacity: usize) -> Arc<Spares> {
        let pool = Arc::new(Spares {
            segment,
            capacity,
            ready: Mutex::new(Vec::with_capacity(capacity)),
            wake: Condvar::new(),
            users: AtomicUsize::new(0),
        });
        let weak = Arc::downgrade(&pool);
        if let Err(e) = std::thread::Builder::new()
            .name("nvmf-ram-spares".into())
            .spawn(move || refill(&weak))
        {
            tracing::warn!(error = %e, "cannot start the RAM namespaces' spare segment thread; first writes map their segments themselves");
        }
        pool
    }

    /// Registers a RAM namespace: the pool fills while one is registered.
    pub fn user(self: &Arc<Self>) -> User {
        self.users.fetch_add(1, Ordering::AcqRel);
        self.wake.notify_one();
        User(self.clone())
    }

    /// A ready segment, if one is there now; never waits.
    pub fn take(&self) -> Option<HugeMem> {
        let m = self.ready.try_lock().ok()?.pop();
        if m.is_some() {
            self.wake.notify_one();
        }
        m
    }

    /// Segments ready now.
    pub fn ready(&self) -> usize {
        self.ready.lock().map_or(0, |r| r.len())
    }
}

/// The pool's thread: keeps it full while it has users and empty while it
/// has none, until it is dropped.
fn refill(pool: &Weak<Spares>) {
    loop {
        let Some(p) = pool.upgrade() else {
            return;
        };
        let want = if p.users.load(Ordering::Acquire) > 0 {
            p.capacity
        } else {
            0
        };
        let Ok(mut ready) = p.ready.lock() else {
            return;
        };
        if ready.len() > want {
            ready.truncate(want);
        }
        if ready.len() == want {
            // Woken by a take, a new user or one leaving; or the nap ends.
            drop(p.wake.wait_timeout(ready, NAP));
            continue;
        }
        drop(ready);
        match HugeMem::zeroed(p.segment) {
            Ok(mut m) => {
                // One write a base page faults every page in (a whole huge
                // page at the first where the kernel has one); zeros keep
                // the segment as fresh memory reads.
                for b in m.iter_mut().step_by(4096) {
                    *b = 0;
                }
                if let Ok(mut ready) = p.ready.lock() {
                    ready.push(m);
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "no spare segment for the RAM namespaces");
                drop(p);
                std::thread::sleep(NAP);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::suite::eventually;

    /// The pool fills to its capacity while a user exists, hands out zero
    /// segments without waiting, refills, and empties once no user is
    /// left; its thread ends with it.
    #[test]
    fn fills_while_used_and_empties_after() {
        const SEG: usize = 64 << 10;
        let pool = Spares::start(SEG, 3);
        assert_eq!(pool.ready(), 0, "nothing before a user");
        assert!(pool.take().is_none());
        let user = pool.user();
        eventually("filled", || pool.ready() == 3);
        let m = user.take().expect("a ready segment");
        assert_eq!(m.len(), SEG);
        assert!(m.iter().all(|&b| b == 0));
        eventually("refilled", || pool.ready() == 3);
        let second = pool.user();
        drop(user);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(pool.ready(), 3, "one user is left");
        drop(second);
        eventually("emptied", || pool.ready() == 0);
        let weak = Arc::downgrade(&pool);
        drop(pool);
        eventually("the thread let go", || weak.upgrade().is_none());
    }
}
