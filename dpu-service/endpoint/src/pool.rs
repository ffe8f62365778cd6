//! Socket buffer memory shared by every endpoint of a service.
//!
//! Each endpoint's own budget ([`EndpointConfig::buffer_budget`]) bounds
//! one endpoint; a [`BufferPool`] bounds them all together, so that the
//! hosts of many tenants, each opening its endpoint's most connections,
//! cannot make the service hold more than the pool's size. Fairness as
//! the switch's connection table has it: each endpoint has a reserve no
//! other can take (enough to listen and serve a few connections), and
//! beyond it takes from a shared part, the pool's size less every
//! endpoint's reserve. The service may hold more than the pool's size
//! only when the reserves alone exceed it (endpoints × reserve).
//!
//! [`EndpointConfig::buffer_budget`]: crate::EndpointConfig::buffer_budget

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The memory all endpoints' socket buffers share.
#[derive(Debug)]
pub struct BufferPool {
    size: usize,
    /// Sum of the reserves of the endpoints that hold a [`Share`].
    reserved: AtomicUsize,
    /// Bytes taken beyond their reserves by all endpoints.
    shared_used: AtomicUsize,
}

impl BufferPool {
    /// The pool's size when its user names none: room for the most
    /// connections of a few busy endpoints (`storage.endpoint_buffer_memory`
    /// in the service's configuration).
    pub const DEFAULT_SIZE: usize = 512 << 20;

    /// A pool of `size` bytes.
    pub fn new(size: usize) -> Arc<Self> {
        Arc::new(Self {
            size,
            reserved: AtomicUsize::new(0),
            shared_used: AtomicUsize::new(0),
        })
    }

    /// The pool's size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes taken beyond their reserves by all endpoints now.
    pub fn shared_used(&self) -> usize {
        self.shared_used.load(Ordering::Relaxed)
    }

    /// Bytes the endpoints' reserves set aside now.
    pub fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    /// One endpoint's share, with `reserve` bytes of its own. The reserve
    /// is given back when the share is dropped.
    pub fn share(self: &Arc<Self>, reserve: usize) -> Share {
        self.reserved.fetch_add(reserve, Ordering::Relaxed);
        Share {
            pool: self.clone(),
            reserve,
            held: 0,
        }
    }

    /// Takes `bytes` from the shared part, if they fit.
    fn take(&self, bytes: usize) -> bool {
        let room = self
            .size
            .saturating_sub(self.reserved.load(Ordering::Relaxed));
        self.shared_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= room)
            })
            .is_ok()
    }

    fn give(&self, bytes: usize) {
        // Never below zero, whatever a caller does.
        let _ = self
            .shared_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }
}

/// What one endpoint holds of a [`BufferPool`].
#[derive(Debug)]
pub struct Share {
    pool: Arc<BufferPool>,
    reserve: usize,
    held: usize,
}

impl Share {
    /// Bytes this endpoint holds now.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Its reserve.
    pub fn reserve(&self) -> usize {
        self.reserve
    }

    /// Holds `bytes` more, from the reserve while it lasts and then from
    /// the shared part. Returns false, holding nothing more, when they do
    /// not fit.
    pub fn grow(&mut self, bytes: usize) -> bool {
        let Some(next) = self.held.checked_add(bytes) else {
            return false;
        };
        let extra = self.beyond(next) - self.beyond(self.held);
        if extra > 0 && !self.pool.take(extra) {
            return false;
        }
        self.held = next;
        true
    }

    /// Holds `bytes` now, giving back what it held beyond them; holding
    /// more than before is done with [`Share::grow`] alone.
    pub fn shrink_to(&mut self, bytes: usize) {
        if bytes < self.held {
            self.pool.give(self.beyond(self.held) - self.beyond(bytes));
            self.held = bytes;
        }
    }

    fn beyond(&self, held: usize) -> usize {
        held.saturating_sub(self.reserve)
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.shrink_to(0);
        let _ = self
            .pool
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_sub(self.reserve))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_are_kept_and_the_shared_part_is_bounded() {
        let pool = BufferPool::new(100);
        let mut a = pool.share(10);
        let mut b = pool.share(20);
        // Shared part: 100 - 30 = 70.
        assert!(a.grow(10), "a's reserve");
        assert!(a.grow(70), "all of the shared part");
        assert!(!a.grow(1), "nothing left");
        assert_eq!(pool.shared_used(), 70);
        // b's reserve is still b's.
        assert!(b.grow(20));
        assert!(!b.grow(1));
        // a gives back; b may take it.
        a.shrink_to(40);
        assert_eq!(pool.shared_used(), 30);
        assert!(b.grow(40));
        assert!(!b.grow(1));
        assert_eq!(a.held() + b.held(), 100);
        // A third endpoint's reserve shrinks the shared part; those over
        // it keep what they hold, but take no more.
        let mut c = pool.share(50);
        assert!(c.grow(50));
        assert!(!a.grow(1) && !b.grow(1));
        drop(b);
        assert_eq!(pool.reserved(), 60);
        assert_eq!(pool.shared_used(), 30);
        assert!(a.grow(10));
        drop((a, c));
        assert_eq!((pool.reserved(), pool.shared_used()), (0, 0));
    }

    #[test]
    fn reserves_beyond_the_size_hold_but_share_nothing() {
        let pool = BufferPool::new(10);
        let mut a = pool.share(8);
        let mut b = pool.share(8);
        assert!(a.grow(8) && b.grow(8));
        assert!(!a.grow(1));
        assert!(!b.grow(usize::MAX));
        a.shrink_to(100); // more than held: no change
        assert_eq!(a.held(), 8);
    }
}
