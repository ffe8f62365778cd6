//! Memory for write data that the host sends only when asked (an SGL
//! transport data block): how much one connection, and all connections of
//! a target together, may ask for at once.
//!
//! A command reserves its data length before its first R2T goes out,
//! against the connection's [`R2T_BUDGET`] ([`ConnBudget`]) and the
//! target's budget ([`SharedBudget`], set with
//! [`Target::set_write_buffer_budget`](crate::target::Target::set_write_buffer_budget)).
//! A command that cannot reserve waits in the connection's FIFO, and gets
//! its R2T, oldest first, once earlier commands gave theirs back. No
//! command overtakes one that waits, so a large write is not starved by
//! small ones behind it.
//!
//! Invariants:
//! - a connection's reservations never exceed [`R2T_BUDGET`], except that
//!   its first reservation is always allowed (so a command larger than the
//!   budget still runs, alone);
//! - the target's reservations never exceed its budget, except that a
//!   reservation is always allowed while nothing is reserved (so a budget
//!   below one command's length serves one command at a time, never none);
//! - every byte reserved from the [`SharedBudget`] is given back exactly
//!   once: by [`ConnBudget::release`] when its command completes, or by
//!   [`ConnBudget::release_all`] when the connection closes or is dropped.
//!
//! This module only counts; the connection allocates the data buffer when
//! the first H2CData of a command arrives, so a host that announces writes
//! and never sends their data holds reservations, not memory.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

/// Most write data one connection asks for through R2T and has not yet
/// written: 8 commands of the largest transfer
/// ([`MAX_TRANSFER`](crate::conn::MAX_TRANSFER)), 32 of
/// 128 KiB. At 25 Gbit/s that is 1.3 ms of data, far more than an R2T's
/// round trip, so one queue's writes still stream; yet a host that
/// announces writes and sends no data holds at most this much per
/// connection in reservations, and no memory (buffers are taken as data
/// arrives).
pub const R2T_BUDGET: u64 = 4 << 20;

/// Default of the target-wide budget: room for 64 connections each using
/// its whole [`R2T_BUDGET`] at once.
pub const DEFAULT_WRITE_BUFFER_BUDGET: u64 = 256 << 20;

/// Default of the target-wide bound on the data of operations in flight
/// on asynchronous backends (a cluster, a remote target), all namespaces
/// together: 1 GiB, 16 times one RBD cluster's or one remote namespace's
/// own bound.
pub const DEFAULT_BACKEND_IN_FLIGHT: u64 = 1 << 30;

/// The target's bound on the data in flight on asynchronous backends,
/// shared with the completions that give it back (on any thread, whether
/// or not their connection is still open).
#[derive(Debug, Clone)]
pub(crate) struct BackendBudget(pub(crate) std::sync::Arc<SharedBudget>);

impl Default for BackendBudget {
    fn default() -> Self {
        Self(std::sync::Arc::new(SharedBudget::with_limit(
            DEFAULT_BACKEND_IN_FLIGHT,
        )))
    }
}

/// The budget all connections of a target share.
#[derive(Debug)]
pub(crate) struct SharedBudget {
    /// Most bytes reserved at once (see the module's invariants).
    limit: AtomicU64,
    /// Bytes reserved now.
    reserved: AtomicU64,
}

impl Default for SharedBudget {
    fn default() -> Self {
        Self {
            limit: AtomicU64::new(DEFAULT_WRITE_BUFFER_BUDGET),
            reserved: AtomicU64::new(0),
        }
    }
}

impl SharedBudget {
    /// A budget of `limit` bytes, nothing reserved.
    pub(crate) fn with_limit(limit: u64) -> Self {
        Self {
            limit: AtomicU64::new(limit),
            reserved: AtomicU64::new(0),
        }
    }

    /// Most bytes reserved at once from now on; reservations above it
    /// stay until released.
    pub(crate) fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// Most bytes reserved at once.
    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Bytes reserved now.
    pub(crate) fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Relaxed)
    }

    /// Reserves `n` bytes if the budget has room, or nothing is reserved.
    pub(crate) fn try_reserve(&self, n: u64) -> bool {
        let limit = self.limit();
        self.reserved
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                let after = r.saturating_add(n);
                (r == 0 || after <= limit).then_some(after)
            })
            .is_ok()
    }

    /// Gives back `n` bytes reserved earlier.
    pub(crate) fn release(&self, n: u64) {
        let before = self.reserved.fetch_sub(n, Ordering::Relaxed);
        debug_assert!(before >= n, "released {n} of {before} bytes reserved");
    }
}

/// One connection's reservations, and its commands waiting for one.
#[derive(Debug, Default)]
pub(crate) struct ConnBudget {
    /// Bytes reserved by this connection's commands (also counted in the
    /// [`SharedBudget`]).
    reserved: u64,
    /// What each command holding a reservation reserved, by command ID.
    held: HashMap<u16, u32>,
    /// Commands waiting for a reservation, oldest first, with their
    /// lengths.
    waiting: VecDeque<(u16, u32)>,
}

impl ConnBudget {
    /// Reserves `len` bytes for command `cid` and answers true; when
    /// earlier commands wait or either budget has no room, answers false
    /// and queues `cid`, which [`ConnBudget::grant`] hands out later.
    pub(crate) fn admit(&mut self, shared: &SharedBudget, cid: u16, len: u32) -> bool {
        if self.waiting.is_empty() && self.try_reserve(shared, cid, len) {
            return true;
        }
        self.waiting.push_back((cid, len));
        false
    }

    /// The oldest waiting command, once its reservation is made: it may
    /// ask for its data now. `None` while it still has to wait.
    pub(crate) fn grant(&mut self, shared: &SharedBudget) -> Option<u16> {
        let &(cid, len) = self.waiting.front()?;
        if !self.try_reserve(shared, cid, len) {
            return None;
        }
        self.waiting.pop_front();
        Some(cid)
    }

    fn try_reserve(&mut self, shared: &SharedBudget, cid: u16, len: u32) -> bool {
        let n = u64::from(len);
        let fits = self.reserved == 0 || self.reserved + n <= R2T_BUDGET;
        if !fits || !shared.try_reserve(n) {
            return false;
        }
        self.reserved += n;
        self.held.insert(cid, len);
        true
    }

    /// Gives back what command `cid` reserved, if anything; answers true
    /// when it did (waiting commands may fit now).
    pub(crate) fn release(&mut self, shared: &SharedBudget, cid: u16) -> bool {
        // Most completions (reads, in-capsule writes) hold nothing.
        if self.reserved == 0 {
            return false;
        }
        let Some(len) = self.held.remove(&cid) else {
            return false;
        };
        let n = u64::from(len);
        self.reserved -= n;
        shared.release(n);
        true
    }

    /// Gives back every reservation and forgets the waiting commands (the
    /// connection is over).
    pub(crate) fn release_all(&mut self, shared: &SharedBudget) {
        shared.release(std::mem::take(&mut self.reserved));
        self.held.clear();
        self.waiting.clear();
    }

    /// Bytes reserved by this connection.
    pub(crate) fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Commands waiting for a reservation.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: u32 = 512 << 10;

    #[test]
    fn a_connection_reserves_up_to_its_budget_then_queues_in_order() {
        let shared = SharedBudget::default();
        let mut c = ConnBudget::default();
        let fit = (R2T_BUDGET / u64::from(BIG)) as u16;
        for cid in 0..fit {
            assert!(c.admit(&shared, cid, BIG));
        }
        assert_eq!((c.reserved(), shared.reserved()), (R2T_BUDGET, R2T_BUDGET));
        // Neither a large nor, behind it, a small command fits now.
        assert!(!c.admit(&shared, 100, BIG));
        assert!(!c.admit(&shared, 101, 512));
        assert_eq!(c.grant(&shared), None);
        assert!(c.release(&shared, 0));
        assert!(!c.release(&shared, 0), "released once");
        assert_eq!(c.grant(&shared), Some(100));
        assert_eq!(c.grant(&shared), None, "the budget is full again");
        assert!(c.release(&shared, 1));
        assert_eq!(c.grant(&shared), Some(101));
        c.release_all(&shared);
        assert_eq!((c.reserved(), shared.reserved(), c.waiting()), (0, 0, 0));
    }

    #[test]
    fn the_shared_budget_binds_all_connections_but_never_blocks_everyone() {
        let shared = SharedBudget::default();
        shared.set_limit(u64::from(BIG) * 3 / 2);
        let (mut a, mut b) = (ConnBudget::default(), ConnBudget::default());
        assert!(a.admit(&shared, 1, BIG));
        assert!(!b.admit(&shared, 1, BIG), "would pass the target's budget");
        assert!(a.release(&shared, 1));
        assert_eq!(b.grant(&shared), Some(1));
        a.release_all(&shared);
        b.release_all(&shared);
        // A budget smaller than one command serves one command at a time.
        shared.set_limit(0);
        assert!(a.admit(&shared, 1, BIG));
        assert!(!b.admit(&shared, 1, 512));
        b.release_all(&shared);
        a.release_all(&shared);
        assert_eq!(shared.reserved(), 0);
    }
}
