//! Completions read where the work is. An asynchronous backend whose
//! answers arrive on a file descriptor (a remote target's socket) lends
//! that descriptor to a poll group that starts an operation on it (the
//! backend chooses which: a remote namespace, the first); the group
//! watches it in its own epoll and, when it is readable, reads and
//! completes what came on its own thread. The hand-over to another thread
//! that would read the completions and wake the group (an eventfd and two
//! context switches per batch) is gone from the I/O path.
//!
//! The seam is thread-local: a poll group's thread says it serves
//! ([`serve_here`]); a backend started on such a thread asks to be
//! watched ([`watch_here`], once per group and backend); the group takes
//! the new requests after each turn ([`take_new`]) and forgets a backend
//! once it is [gone](Ready::gone). On any other thread nothing is
//! watched and the backend reads its completions itself.

use std::cell::RefCell;
use std::collections::HashSet;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

/// A backend whose completions a poll group may read.
pub(crate) trait Ready: Send + Sync {
    /// Unique for the backend's life: a group watches each once.
    fn watch_id(&self) -> u64;
    /// Readable when completions may be waiting.
    fn ready_fd(&self) -> BorrowedFd<'_>;
    /// Reads and completes what is waiting, without blocking.
    fn on_ready(&self);
    /// True once the backend is gone: the group forgets it.
    fn gone(&self) -> bool;
    /// A group stopped watching it (it forgot it, ended, or could not
    /// add it to its epoll).
    fn unwatched(&self);
}

/// What the calling poll group's thread watches.
struct Here {
    known: HashSet<u64>,
    new: Vec<Arc<dyn Ready>>,
}

thread_local! {
    static HERE: RefCell<Option<Here>> = const { RefCell::new(None) };
}

/// The calling thread is a poll group: backends started here may ask to
/// be watched.
pub(crate) fn serve_here() {
    HERE.with(|h| {
        *h.borrow_mut() = Some(Here {
            known: HashSet::new(),
            new: Vec::new(),
        });
    });
}

/// True on a poll group's thread.
pub(crate) fn serving_here() -> bool {
    HERE.with(|h| h.borrow().is_some())
}

/// Asks the calling poll group to watch the backend `id`, made by `make`
/// the first time; false (and `make` not called) off a poll group or when
/// the group already watches it.
pub(crate) fn watch_here(id: u64, make: impl FnOnce() -> Arc<dyn Ready>) -> bool {
    HERE.with(|h| {
        let mut h = h.borrow_mut();
        let Some(here) = h.as_mut() else {
            return false;
        };
        if !here.known.insert(id) {
            return false;
        }
        here.new.push(make());
        true
    })
}

/// The backends asked to be watched since the last call.
pub(crate) fn take_new() -> Vec<Arc<dyn Ready>> {
    HERE.with(|h| {
        h.borrow_mut()
            .as_mut()
            .map(|here| std::mem::take(&mut here.new))
            .unwrap_or_default()
    })
}

/// The calling group no longer watches backend `id`.
pub(crate) fn forget_here(id: u64) {
    HERE.with(|h| {
        if let Some(here) = h.borrow_mut().as_mut() {
            here.known.remove(&id);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, OwnedFd};
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Fake {
        fd: OwnedFd,
        unwatched: AtomicUsize,
    }

    impl Ready for Fake {
        fn watch_id(&self) -> u64 {
            7
        }
        fn ready_fd(&self) -> BorrowedFd<'_> {
            self.fd.as_fd()
        }
        fn on_ready(&self) {}
        fn gone(&self) -> bool {
            false
        }
        fn unwatched(&self) {
            self.unwatched.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn fake() -> Arc<dyn Ready> {
        Arc::new(Fake {
            fd: rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap(),
            unwatched: AtomicUsize::new(0),
        })
    }

    #[test]
    fn only_a_poll_group_watches_and_each_backend_once_until_forgotten() {
        std::thread::spawn(|| {
            assert!(!serving_here());
            assert!(!watch_here(7, fake), "not a poll group");
            assert!(take_new().is_empty());
            serve_here();
            assert!(serving_here());
            assert!(watch_here(7, fake));
            assert!(!watch_here(7, || unreachable!("made twice")));
            assert!(watch_here(8, fake));
            assert_eq!(take_new().len(), 2);
            assert!(take_new().is_empty());
            forget_here(7);
            assert!(watch_here(7, fake));
            assert_eq!(take_new().len(), 1);
        })
        .join()
        .unwrap();
    }
}
