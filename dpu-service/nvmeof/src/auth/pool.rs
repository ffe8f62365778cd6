//! The finite-field Diffie-Hellman work of DH-HMAC-CHAP, as jobs, and a
//! small pool of threads of its own that runs them off the poll groups.
//! Work of the same kind from elsewhere (a storage endpoint's TLS
//! handshakes, [`DhPool::run_for`]) shares the threads and the bound.
//!
//! One ffdhe8192 exponentiation takes tens of milliseconds (see the cost
//! table in docs/benchmarks/nvme-auth.md, `cargo bench -p dpu-nvmeof --bench auth`):
//! run on a poll group's thread it would stall every other connection the
//! group serves, and anyone who knows an allowed host NQN can make the
//! target do it. A [`DhPool`] runs the jobs on `threads` threads behind a
//! queue of at most `queue` jobs; a job that finds the queue full is handed
//! back at once ([`DhPool::submit`]), never waited for, so the caller fails
//! that authentication instead of blocking. So at most `threads + queue`
//! jobs are ever in flight, whatever the peers do.
//!
//! A job's result goes to the callback it was submitted with, on the
//! pool's thread. The callback must be short (hand the result over and
//! wake its owner): the pool does not look at what it does. A job
//! submitted for an owner ([`DhPool::submit_for`]) that is gone by the
//! job's turn (the connection closed while it waited) is dropped without
//! running: a peer that asks for a Challenge and hangs up costs no DH
//! work unless its job had already started.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use zeroize::Zeroizing;

use super::dh::{DhError, DhGroup, KeyPair};

/// Default of [`DhPool::new`]'s `threads`: one thread, so that DH work
/// takes at most one core from the I/O however many peers authenticate.
pub const DEFAULT_THREADS: usize = 1;
/// Default of [`DhPool::new`]'s `queue`: enough for a host connecting
/// many queues at once (Linux authenticates its queues one after another)
/// and several hosts reconnecting together.
pub const DEFAULT_QUEUE: usize = 32;
/// Most threads a pool may have.
pub const MAX_THREADS: usize = 64;
/// Most jobs a pool's queue may hold.
pub const MAX_QUEUE: usize = 65_536;

/// The Diffie-Hellman step an authentication waits for.
pub enum DhJob {
    /// Draw a private exponent and compute the public value (the
    /// controller's side of the Challenge).
    Generate(DhGroup),
    /// Compute the shared secret with the host's public value (the Reply).
    Shared {
        /// The controller's key pair, from [`DhJob::Generate`].
        key_pair: KeyPair,
        /// The host's public value, as received (checked by the job).
        peer: Vec<u8>,
    },
}

impl std::fmt::Debug for DhJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Generate(g) => write!(f, "Generate({})", g.name()),
            Self::Shared { key_pair, .. } => write!(f, "Shared({})", key_pair.group().name()),
        }
    }
}

/// What a [`DhJob`] produced.
pub enum DhOutput {
    /// The key pair of a [`DhJob::Generate`].
    KeyPair(KeyPair),
    /// The shared secret of a [`DhJob::Shared`], wiped on drop.
    Shared(Zeroizing<Vec<u8>>),
}

impl std::fmt::Debug for DhOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::KeyPair(k) => write!(f, "KeyPair({})", k.group().name()),
            Self::Shared(s) => write!(f, "Shared({} bytes)", s.len()),
        }
    }
}

/// The result of a [`DhJob`]: [`DhError::Busy`] when it was never run.
pub type DhResult = Result<DhOutput, DhError>;

impl DhJob {
    /// Runs the job on the calling thread.
    pub fn run(self) -> DhResult {
        match self {
            Self::Generate(g) => g.generate().map(DhOutput::KeyPair),
            Self::Shared { key_pair, peer } => key_pair.shared_secret(&peer).map(DhOutput::Shared),
        }
    }
}

/// What a task does.
enum Work {
    /// A job and where its result goes.
    Dh {
        job: DhJob,
        done: Box<dyn FnOnce(DhResult) + Send>,
    },
    /// Other work of the same kind (a TLS handshake's key exchange), which
    /// hands its result over itself; dropped unrun when the pool stops.
    Other(Box<dyn FnOnce() + Send>),
}

/// Work and whom it is for.
struct Task {
    work: Work,
    /// Run only while this upgrades, when set.
    owner: Option<Weak<()>>,
}

/// Threads that run [`DhJob`]s, behind a bounded queue. Dropping the pool
/// finishes the jobs running, hands the queued ones [`DhError::Busy`]
/// without running them, and joins the threads.
pub struct DhPool {
    tx: Option<SyncSender<Task>>,
    stopping: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for DhPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DhPool")
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

/// Why a [`DhPool`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// `threads` or `queue` out of range.
    #[error("{field}: {value} is out of range (1 to {max})")]
    OutOfRange {
        /// The parameter.
        field: &'static str,
        /// Its value.
        value: usize,
        /// Its largest value.
        max: usize,
    },
    /// A thread could not be started.
    #[error("starting a DH thread: {0}")]
    Spawn(#[source] std::io::Error),
}

impl DhPool {
    /// A pool of `threads` threads (1 to [`MAX_THREADS`]) with room for
    /// `queue` jobs waiting (1 to [`MAX_QUEUE`]).
    ///
    /// # Errors
    /// A count out of range, or a thread that would not start.
    pub fn new(threads: usize, queue: usize) -> Result<Self, PoolError> {
        Self::with_placement(threads, queue, || {})
    }

    /// As [`new`](Self::new), each thread first running `place` (to pin
    /// itself, say).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_placement(
        threads: usize,
        queue: usize,
        place: impl Fn() + Send + Sync + 'static,
    ) -> Result<Self, PoolError> {
        let place = Arc::new(place);
        for (field, value, max) in [
            ("threads", threads, MAX_THREADS),
            ("queue", queue, MAX_QUEUE),
        ] {
            if value == 0 || value > max {
                return Err(PoolError::OutOfRange { field, value, max });
            }
        }
        let (tx, rx) = mpsc::sync_channel::<Task>(queue);
        let rx = Arc::new(Mutex::new(rx));
        let stopping = Arc::new(AtomicBool::new(false));
        let mut pool = Self {
            tx: Some(tx),
            stopping: stopping.clone(),
            threads: Vec::with_capacity(threads),
        };
        for i in 0..threads {
            let (rx, place, stopping) = (rx.clone(), place.clone(), stopping.clone());
            let t = std::thread::Builder::new()
                .name(format!("nvmf-dh-{i}"))
                .spawn(move || {
                    place();
                    worker(&rx, &stopping)
                })
                .map_err(PoolError::Spawn)?;
            pool.threads.push(t);
        }
        Ok(pool)
    }

    /// Queues `job`; `done` gets its result on a pool thread. A full
    /// queue hands the job back at once.
    ///
    /// # Errors
    /// The job, when the queue is full (or the pool is stopping).
    pub fn submit(
        &self,
        job: DhJob,
        done: impl FnOnce(DhResult) + Send + 'static,
    ) -> Result<(), DhJob> {
        self.queue(job, done, None)
    }

    /// As [`submit`](Self::submit), for `owner`: if `owner` is gone
    /// (no [`Arc`] left) when the job's turn comes, the job is dropped
    /// unrun and `done` is never called.
    ///
    /// # Errors
    /// As [`submit`](Self::submit).
    pub fn submit_for(
        &self,
        owner: Weak<()>,
        job: DhJob,
        done: impl FnOnce(DhResult) + Send + 'static,
    ) -> Result<(), DhJob> {
        self.queue(job, done, Some(owner))
    }

    /// Queues `work` for `owner`, behind the same bound as the DH jobs: a
    /// TLS handshake's steps (its ECDHE and HKDF work), which hand their
    /// result over themselves. Dropped unrun if `owner` is gone by its
    /// turn or the pool stops first.
    ///
    /// # Errors
    /// [`DhError::Busy`] when the queue is full (or the pool is
    /// stopping); `work` is dropped unrun.
    pub fn run_for<F: FnOnce() + Send + 'static>(
        &self,
        owner: Weak<()>,
        work: F,
    ) -> Result<(), DhError> {
        let task = Task {
            work: Work::Other(Box::new(work)),
            owner: Some(owner),
        };
        self.send(task).map_err(|_| DhError::Busy)
    }

    fn queue(
        &self,
        job: DhJob,
        done: impl FnOnce(DhResult) + Send + 'static,
        owner: Option<Weak<()>>,
    ) -> Result<(), DhJob> {
        let task = Task {
            work: Work::Dh {
                job,
                done: Box::new(done),
            },
            owner,
        };
        match self.send(task) {
            Ok(()) => Ok(()),
            Err(Work::Dh { job, .. }) => Err(job),
            // Not what was sent: nothing to hand back.
            Err(Work::Other(_)) => Ok(()),
        }
    }

    fn send(&self, task: Task) -> Result<(), Work> {
        let Some(tx) = &self.tx else {
            return Err(task.work);
        };
        tx.try_send(task).map_err(|e| match e {
            TrySendError::Full(t) | TrySendError::Disconnected(t) => t.work,
        })
    }
}

impl Drop for DhPool {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A pool thread: runs jobs until the pool is dropped.
fn worker(rx: &Mutex<Receiver<Task>>, stopping: &AtomicBool) {
    loop {
        // The lock is held only while waiting for the next job: the
        // threads take turns at the queue, never at the work.
        let task = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(Task { work, owner }) = task else {
            return;
        };
        if owner.is_some_and(|o| o.strong_count() == 0) {
            continue;
        }
        let stopping = stopping.load(Ordering::Acquire);
        match work {
            Work::Dh { job, done } if stopping => {
                drop(job);
                done(Err(DhError::Busy));
            }
            Work::Dh { job, done } => done(job.run()),
            Work::Other(_) if stopping => {}
            Work::Other(f) => f(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    /// Holds the pool's one thread in a job's callback until the
    /// returned sender sends (or is dropped).
    fn hold_the_thread(pool: &DhPool) -> std::sync::mpsc::Sender<()> {
        let (release_tx, release_rx) = channel::<()>();
        let (started_tx, started_rx) = channel::<()>();
        pool.submit(DhJob::Generate(DhGroup::Ffdhe2048), move |_| {
            let _ = started_tx.send(());
            let _ = release_rx.recv_timeout(Duration::from_secs(30));
        })
        .unwrap();
        started_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        release_tx
    }

    #[test]
    fn results_reach_the_callback_of_their_job() {
        let pool = DhPool::new(2, 8).unwrap();
        let (tx, rx) = channel();
        for (i, g) in [DhGroup::Ffdhe2048, DhGroup::Ffdhe3072, DhGroup::Ffdhe2048]
            .into_iter()
            .enumerate()
        {
            let tx = tx.clone();
            pool.submit(DhJob::Generate(g), move |r| {
                let _ = tx.send((i, g, r));
            })
            .unwrap();
        }
        let mut got: Vec<_> = (0..3)
            .map(|_| rx.recv_timeout(Duration::from_secs(30)).unwrap())
            .collect();
        got.sort_by_key(|(i, ..)| *i);
        for (i, g, r) in got {
            let Ok(DhOutput::KeyPair(kp)) = r else {
                panic!("job {i}: {r:?}");
            };
            assert_eq!(kp.group(), g, "job {i} got another job's result");
            assert_eq!(kp.public().len(), g.value_len());
        }
    }

    #[test]
    fn shared_secret_matches_the_peer_side() {
        let pool = DhPool::new(1, 4).unwrap();
        let host = DhGroup::Ffdhe2048.generate().unwrap();
        let ctrl = DhGroup::Ffdhe2048.generate().unwrap();
        let want = host.shared_secret(ctrl.public()).unwrap();
        let (tx, rx) = channel();
        pool.submit(
            DhJob::Shared {
                key_pair: ctrl,
                peer: host.public().to_vec(),
            },
            move |r| {
                let _ = tx.send(r);
            },
        )
        .unwrap();
        match rx.recv_timeout(Duration::from_secs(30)).unwrap() {
            Ok(DhOutput::Shared(s)) => assert_eq!(&s[..], &want[..]),
            other => panic!("{other:?}"),
        }
        // A bad peer value is the job's error, not a panic on the thread.
        let (tx, rx) = channel();
        pool.submit(
            DhJob::Shared {
                key_pair: DhGroup::Ffdhe2048.generate().unwrap(),
                peer: vec![0; 256],
            },
            move |r| {
                let _ = tx.send(r);
            },
        )
        .unwrap();
        assert!(matches!(
            rx.recv_timeout(Duration::from_secs(30)).unwrap(),
            Err(DhError::Range)
        ));
    }

    #[test]
    fn a_full_queue_hands_the_job_back_without_blocking() {
        let pool = DhPool::new(1, 1).unwrap();
        // Hold the only thread in a callback until released.
        let release_tx = hold_the_thread(&pool);
        // One job waits in the queue; the next finds it full.
        let (tx, rx) = channel();
        let t = tx.clone();
        pool.submit(DhJob::Generate(DhGroup::Ffdhe2048), move |r| {
            let _ = t.send(r.is_ok());
        })
        .unwrap();
        let back = pool
            .submit(DhJob::Generate(DhGroup::Ffdhe3072), move |_| {
                panic!("a refused job must not run")
            })
            .unwrap_err();
        assert!(matches!(back, DhJob::Generate(DhGroup::Ffdhe3072)));
        release_tx.send(()).unwrap();
        assert!(rx.recv_timeout(Duration::from_secs(30)).unwrap());
        // Room again once the queue drained.
        pool.submit(DhJob::Generate(DhGroup::Ffdhe2048), move |r| {
            let _ = tx.send(r.is_ok());
        })
        .unwrap();
        assert!(rx.recv_timeout(Duration::from_secs(30)).unwrap());
    }

    #[test]
    fn a_job_whose_owner_is_gone_is_harmless() {
        let pool = DhPool::new(1, 4).unwrap();
        // The receiving end (the connection) is dropped before the job
        // runs: the callback's send fails and the result is dropped.
        let (tx, rx) = channel::<DhResult>();
        drop(rx);
        pool.submit(DhJob::Generate(DhGroup::Ffdhe2048), move |r| {
            let _ = tx.send(r);
        })
        .unwrap();
        // The pool still serves others, and drops cleanly.
        let (tx, rx) = channel();
        pool.submit(DhJob::Generate(DhGroup::Ffdhe2048), move |r| {
            let _ = tx.send(r.is_ok());
        })
        .unwrap();
        assert!(rx.recv_timeout(Duration::from_secs(30)).unwrap());
        drop(pool);
    }

    #[test]
    fn a_job_whose_owner_left_before_its_turn_never_runs() {
        let pool = DhPool::new(1, 2).unwrap();
        let release_tx = hold_the_thread(&pool);
        // Two jobs wait: one whose owner leaves, one whose owner stays.
        let (gone, stays) = (Arc::new(()), Arc::new(()));
        let (gone_tx, gone_rx) = channel();
        pool.submit_for(
            Arc::downgrade(&gone),
            DhJob::Generate(DhGroup::Ffdhe2048),
            move |r| {
                let _ = gone_tx.send(r.is_ok());
            },
        )
        .unwrap();
        let (tx, rx) = channel();
        pool.submit_for(
            Arc::downgrade(&stays),
            DhJob::Generate(DhGroup::Ffdhe2048),
            move |r| {
                let _ = tx.send(r.is_ok());
            },
        )
        .unwrap();
        drop(gone);
        release_tx.send(()).unwrap();
        assert!(rx.recv_timeout(Duration::from_secs(30)).unwrap());
        // The first waiting job was dropped with its callback, uncalled.
        assert_eq!(
            gone_rx.recv_timeout(Duration::from_secs(1)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected)
        );
        drop(stays);
    }

    /// Other work shares the DH jobs' queue and its bound, and is dropped
    /// unrun when its owner left before its turn.
    #[test]
    fn other_work_runs_behind_the_same_bound() {
        let pool = DhPool::new(1, 1).unwrap();
        let (tx, rx) = channel();
        let owner = Arc::new(());
        let t = tx.clone();
        pool.run_for(Arc::downgrade(&owner), move || t.send(1).unwrap())
            .unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), 1);

        let release = hold_the_thread(&pool);
        let gone = Arc::new(());
        let t = tx.clone();
        pool.run_for(Arc::downgrade(&gone), move || t.send(2).unwrap())
            .unwrap();
        let t = tx.clone();
        let full = pool.run_for(Arc::downgrade(&owner), move || t.send(3).unwrap());
        assert!(matches!(full, Err(DhError::Busy)), "the queue holds one");
        drop(gone);
        drop(release);
        let t = tx.clone();
        // Queued once the held job and the dropped one are out of the way.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while pool
            .run_for(Arc::downgrade(&owner), {
                let t = t.clone();
                move || t.send(4).unwrap()
            })
            .is_err()
        {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), 4);
        assert!(rx.try_recv().is_err(), "work whose owner left ran");
    }

    #[test]
    fn counts_out_of_range_are_refused() {
        assert!(DhPool::new(0, 4).is_err());
        assert!(DhPool::new(1, 0).is_err());
        assert!(DhPool::new(MAX_THREADS + 1, 4).is_err());
    }
}
