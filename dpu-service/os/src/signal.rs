//! Waiting for SIGTERM or SIGINT on one thread, for programs without an
//! async runtime (the benchmark target): they end by returning from
//! `main`, so that what they hold closes cleanly (an RBD image releases
//! its lock; a cluster sees its client leave).

use std::io;

/// SIGTERM and SIGINT, blocked in the calling thread and every thread it
/// starts afterwards, so that [`Termination::wait`] takes them instead of
/// the default action (ending the process at once).
#[derive(Debug)]
pub struct Termination {
    set: libc::sigset_t,
}

impl Termination {
    /// Blocks SIGTERM and SIGINT. Call it first in `main`, before any
    /// thread starts: threads inherit the mask, and a thread that does not
    /// block them could take one and end the process.
    pub fn block() -> io::Result<Self> {
        // SAFETY: a zeroed sigset_t is a valid argument to sigemptyset,
        // which initialises it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, exclusively borrowed sigset_t; the
        // signal numbers are valid.
        let rc = unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(Self { set })
    }

    /// Waits until SIGTERM or SIGINT arrives; answers which.
    pub fn wait(&self) -> io::Result<i32> {
        let mut sig = 0;
        // SAFETY: `self.set` was initialised in `block`; `sig` is a valid
        // out pointer.
        let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(sig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_sigterm_is_taken_by_wait() {
        let t = Termination::block().unwrap();
        // SAFETY: sends SIGTERM to this thread, which blocks it.
        let rc = unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGTERM) };
        assert_eq!(rc, 0);
        assert_eq!(t.wait().unwrap(), libc::SIGTERM);
    }
}
