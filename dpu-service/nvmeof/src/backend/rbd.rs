//! [`RbdBackend`]: an image of a Ceph cluster, through librbd's
//! asynchronous I/O ([`dpu_rbd`]), and [`Clusters`], the target's
//! connections to clusters: one per cluster, shared by its images.
//!
//! Operations start on the transport's thread and complete on one of
//! librados' threads; nothing waits on the cluster but the blocking
//! methods of [`Backend`] (used where no transport thread is at stake) and
//! the background threads here: one that follows resizes made by other
//! clients, and one per image being closed. Every operation is bounded by
//! its cluster's operation timeout.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use dpu_rbd::{Cluster, ClusterConfig, Image};

use super::{check, is_unavailable, lock, Backend, Io, IoDone};
use crate::target::RbdCluster;

/// Most operations in flight on one cluster connection, all its images
/// together. librados blocks the caller of a submission past its own
/// throttle (`objecter_inflight_ops`, 1024 operations on OSDs, and an
/// operation of librbd may take two when it crosses an object's end):
/// ours holds requests back in their connections well before that, so
/// that no poll group ever waits in librados.
pub const MAX_IN_FLIGHT_OPS: usize = 400;

/// Most bytes of reads and writes in flight on one cluster connection, for
/// the same reason (`objecter_inflight_op_bytes`, 100 MiB); also the most
/// memory the data of a cluster's I/O holds at once.
pub const MAX_IN_FLIGHT_BYTES: u64 = 64 << 20;

/// What is in flight on one cluster connection.
#[derive(Debug, Default)]
struct InFlight {
    ops: AtomicUsize,
    bytes: AtomicU64,
}

/// A connection to a cluster, with the count of what its images have in
/// flight (cheap to clone).
#[derive(Debug, Clone)]
pub struct Link {
    cluster: Cluster,
    in_flight: Arc<InFlight>,
}

impl Link {
    /// A link over `cluster`, nothing in flight yet.
    pub fn new(cluster: Cluster) -> Self {
        Self {
            cluster,
            in_flight: Arc::default(),
        }
    }
}

/// The target's connections to clusters, by cluster name.
#[derive(Debug, Default)]
pub struct Clusters {
    by_name: Mutex<HashMap<String, (RbdCluster, Link)>>,
}

impl Clusters {
    /// The connection to `c`: the one open, if made with the same settings
    /// (a changed key or monitor list makes a new one; images already open
    /// keep the old until they close), else a new one.
    ///
    /// # Errors
    /// The cluster refused or did not answer within its connect timeout.
    pub fn connect(&self, c: &RbdCluster) -> io::Result<Link> {
        if let Some((cfg, link)) = lock(&self.by_name).get(&c.name) {
            if cfg == c {
                return Ok(link.clone());
            }
        }
        // Connecting may take the whole timeout: not under the lock.
        let link = Link::new(Cluster::connect(&config(c)).map_err(|e| named(&c.name, e))?);
        lock(&self.by_name).insert(c.name.clone(), (c.clone(), link.clone()));
        Ok(link)
    }

    /// Forgets the connections to clusters not in `used` (their images
    /// hold what they still need).
    pub fn retain(&self, used: &[&str]) {
        lock(&self.by_name).retain(|name, _| used.contains(&name.as_str()));
    }
}

/// `dpu_rbd`'s settings for `c`.
fn config(c: &RbdCluster) -> ClusterConfig {
    ClusterConfig {
        mon_host: c.mon_host.clone(),
        user: c.user.clone(),
        key: c.key.clone(),
        op_timeout: c.op_timeout,
        connect_timeout: c.connect_timeout,
    }
}

/// `e` as an I/O error naming cluster `name`.
fn named(name: &str, e: dpu_rbd::Error) -> io::Error {
    io::Error::new(e.kind(), format!("cluster {name}: {e}"))
}

/// What the backend, its resize follower and its closer share.
struct Shared {
    image: Image,
    /// Size in bytes, as last read from the image.
    len: AtomicU64,
    /// Held by our own resize from the call to the new `len`, and by the
    /// follower from reading the size to comparing it: so the follower
    /// never takes our own resize, whose notice may come before the call
    /// returns, for another client's.
    sizing: Mutex<()>,
    /// Called after the size changed by another client's hand.
    on_resize: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
    /// Whether the cluster answers.
    reach: Arc<Reach>,
    /// What is in flight on the image's cluster connection.
    in_flight: Arc<InFlight>,
    /// Counts the image out of [`CLOSING`] once it has closed: after
    /// `image`, so it drops after it, on whichever thread held the last
    /// handle (the closer's, or the resize follower's if it was reading
    /// the size just then).
    closed: ClosedMark,
}

/// Takes one from [`CLOSING`] when dropped, once armed: an image whose
/// backend was dropped counts as closing until its [`Shared`] is gone.
#[derive(Debug, Default)]
struct ClosedMark(AtomicBool);

impl Drop for ClosedMark {
    fn drop(&mut self) {
        if *self.0.get_mut() {
            CLOSING.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Whether an image's cluster answers, as its operations found it. Held
/// apart from [`Shared`] so that a completion never holds the image: the
/// last handle to an image must not drop on librados' thread.
///
/// A failure counts only if the operation was started after the cluster
/// last answered: an operation sent into an outage can time out after the
/// cluster is back (librados' timeout runs from when it was sent), and
/// that says nothing about now.
#[derive(Debug)]
struct Reach {
    /// The last operation that counted found the cluster out of reach.
    unreachable: AtomicBool,
    /// Operations started, numbering them from 1.
    started: AtomicU64,
    /// The number of the last operation started before the latest answer:
    /// failures of it and of those before it are stale.
    answered_through: AtomicU64,
    /// `cluster:pool/image`.
    what: String,
}

impl Reach {
    fn new(what: String) -> Reach {
        Reach {
            unreachable: AtomicBool::new(false),
            started: AtomicU64::new(0),
            answered_through: AtomicU64::new(0),
            what,
        }
    }

    /// Numbers an operation being started.
    fn start(&self) -> u64 {
        self.started.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Notes whether operation `op` found the cluster reachable (`r`);
    /// logs the changes.
    fn note<T>(&self, op: u64, r: &Result<T, dpu_rbd::Error>) {
        let lost = match r {
            Err(e) => is_unavailable(&io::Error::from(e.clone())),
            Ok(_) => false,
        };
        if lost {
            if op <= self.answered_through.load(Ordering::Acquire) {
                return;
            }
        } else {
            self.answered_through
                .fetch_max(self.started.load(Ordering::Acquire), Ordering::AcqRel);
        }
        if self.unreachable.swap(lost, Ordering::AcqRel) != lost {
            match r {
                Err(e) => {
                    tracing::warn!(image = %self.what, error = %e, "RBD image out of reach; its I/O fails with Namespace Not Ready until it answers")
                }
                Ok(_) => tracing::info!(image = %self.what, "RBD image reachable again"),
            }
        }
    }
}

/// An RBD image.
pub struct RbdBackend {
    /// Taken by Drop, which closes the image off the dropping thread.
    shared: Option<Arc<Shared>>,
    /// `cluster:pool/image`, for errors and logs.
    what: String,
}

impl std::fmt::Debug for RbdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdBackend")
            .field("image", &self.what)
            .finish()
    }
}

impl RbdBackend {
    /// Opens `pool/image` on `cluster` (named `cluster_name` in errors),
    /// and follows its size from then on.
    ///
    /// # Errors
    /// The pool or image does not exist, or the cluster did not answer.
    pub fn open(link: &Link, cluster_name: &str, pool: &str, image: &str) -> io::Result<Self> {
        let what = format!("{cluster_name}:{pool}/{image}");
        let named = |e| named(cluster_name, e);
        let img = link
            .cluster
            .pool(pool, None)
            .map_err(named)?
            .open(image)
            .map_err(named)?;
        let len = img.size().map_err(named)?;
        let shared = Arc::new(Shared {
            image: img,
            len: AtomicU64::new(len),
            sizing: Mutex::new(()),
            on_resize: Mutex::new(None),
            reach: Arc::new(Reach::new(what.clone())),
            in_flight: link.in_flight.clone(),
            closed: ClosedMark::default(),
        });
        let weak = Arc::downgrade(&shared);
        shared
            .image
            .watch(move || follow(weak.clone()))
            .map_err(named)?;
        Ok(Self {
            shared: Some(shared),
            what,
        })
    }

    fn shared(&self) -> &Shared {
        self.shared.as_ref().expect("present until dropped")
    }

    /// Runs `io` and waits for it (bounded by the cluster's timeout).
    fn wait(&self, io: Io) -> io::Result<Vec<u8>> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.start(
            io,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv()
            .unwrap_or_else(|_| Err(io::Error::other("librbd dropped an operation")))
    }
}

/// Asks the resize follower to read the size of the image behind `weak`.
fn follow(weak: Weak<Shared>) {
    static FOLLOWER: OnceLock<Mutex<mpsc::Sender<Weak<Shared>>>> = OnceLock::new();
    let tx = FOLLOWER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Weak<Shared>>();
        let spawned = std::thread::Builder::new()
            .name("rbd-resize".into())
            .spawn(move || {
                for w in rx {
                    let Some(s) = w.upgrade() else { continue };
                    let read = {
                        let _sizing = lock(&s.sizing);
                        s.image
                            .size()
                            .map(|len| (len, len != s.len.swap(len, Ordering::AcqRel)))
                    };
                    match read {
                        Ok((len, true)) => {
                            tracing::info!(image = %s.image.name(), len, "RBD image resized");
                            if let Some(f) = &*lock(&s.on_resize) {
                                f();
                            }
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "cannot read an RBD image's new size"),
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the RBD resize follower; resizes by other clients go unseen");
        }
        Mutex::new(tx)
    });
    let _ = tx.lock().unwrap_or_else(PoisonError::into_inner).send(weak);
}

/// Images being closed by their closer threads.
static CLOSING: AtomicUsize = AtomicUsize::new(0);

/// Waits until every image dropped so far has closed, for at most
/// `limit`; answers whether they all did. A program calls it last, after
/// dropping its target, so that its images release their locks before
/// the process ends.
pub fn wait_closed(limit: Duration) -> bool {
    let t = Instant::now();
    while CLOSING.load(Ordering::Acquire) > 0 {
        if t.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

impl Drop for RbdBackend {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        // Closing waits for the operations in flight (up to the cluster's
        // timeout): never on the thread that dropped the last handle,
        // which may serve other connections. The image counts as closing
        // until the last handle to it is gone, wherever that happens.
        CLOSING.fetch_add(1, Ordering::AcqRel);
        shared.closed.0.store(true, Ordering::Release);
        let what = self.what.clone();
        let closer = std::thread::Builder::new()
            .name("rbd-close".into())
            .spawn(move || {
                drop(shared);
                tracing::debug!(image = %what, "RBD image released by its closer");
            });
        if let Err(e) = closer {
            // The closure (and the image in it) dropped with the error.
            tracing::warn!(image = %self.what, error = %e, "closed an RBD image inline");
        }
    }
}

impl Backend for RbdBackend {
    fn len(&self) -> u64 {
        self.shared().len.load(Ordering::Acquire)
    }

    fn kind(&self) -> &'static str {
        "rbd"
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let data = self.wait(Io::Read {
            offset,
            buf: vec![0; buf.len()],
        })?;
        buf.copy_from_slice(&data);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.wait(Io::Write {
            offset,
            data: data.to_vec(),
            fua,
        })
        .map(drop)
    }

    fn flush(&self) -> io::Result<()> {
        self.wait(Io::Flush).map(drop)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.wait(Io::WriteZeroes { offset, len }).map(drop)
    }

    fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.wait(Io::Deallocate { offset, len }).map(drop)
    }

    fn resize(&self, new_len: u64) -> io::Result<()> {
        let s = self.shared();
        let _sizing = lock(&s.sizing);
        s.image.resize(new_len)?;
        s.len.store(new_len, Ordering::Release);
        Ok(())
    }

    fn volatile_write_cache(&self) -> bool {
        // Every write the cluster acknowledged is durable (no client cache).
        false
    }

    fn asynchronous(&self) -> bool {
        true
    }

    fn has_room(&self, ops: usize, bytes: u64) -> bool {
        let f = &self.shared().in_flight;
        let (o, b) = (
            f.ops.load(Ordering::Acquire),
            f.bytes.load(Ordering::Acquire),
        );
        // An idle connection takes anything, so no request waits forever.
        o == 0 || (o + ops <= MAX_IN_FLIGHT_OPS && b + bytes <= MAX_IN_FLIGHT_BYTES)
    }

    fn reachable(&self) -> bool {
        !self.shared().reach.unreachable.load(Ordering::Acquire)
    }

    fn on_resize(&self, notify: Box<dyn Fn() + Send + Sync>) {
        *lock(&self.shared().on_resize) = Some(notify);
    }

    fn start(&self, io: Io, done: IoDone) {
        let s = self.shared();
        let len = s.len.load(Ordering::Acquire);
        let range = match &io {
            Io::Read { offset, buf } => Some((*offset, buf.len() as u64)),
            Io::Write { offset, data, .. } => Some((*offset, data.len() as u64)),
            Io::WriteZeroes { offset, len } | Io::Deallocate { offset, len } => {
                Some((*offset, *len))
            }
            Io::Flush => None,
        };
        if let Some((offset, n)) = range {
            if let Err(e) = check(len, offset, n) {
                done(Err(e));
                return;
            }
        }
        let reach = s.reach.clone();
        let bytes = match &io {
            Io::Read { buf, .. } => buf.len() as u64,
            Io::Write { data, .. } => data.len() as u64,
            _ => 0,
        };
        let in_flight = s.in_flight.clone();
        let op = reach.start();
        in_flight.ops.fetch_add(1, Ordering::AcqRel);
        in_flight.bytes.fetch_add(bytes, Ordering::AcqRel);
        let done: dpu_rbd::Done = Box::new(move |r| {
            in_flight.ops.fetch_sub(1, Ordering::AcqRel);
            in_flight.bytes.fetch_sub(bytes, Ordering::AcqRel);
            reach.note(op, &r);
            done(r.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", reach.what))))
        });
        match io {
            Io::Read { offset, buf } => s.image.read(offset, buf, done),
            Io::Write { offset, data, fua } => s.image.write(offset, data, fua, done),
            Io::Flush => s.image.flush(done),
            Io::WriteZeroes { offset, len } => s.image.write_zeroes(offset, len, done),
            Io::Deallocate { offset, len } => s.image.discard(offset, len, done),
        }
    }
}

#[cfg(test)]
mod tests {
    use dpu_rbd::testing::TestCluster;

    use super::*;
    use crate::backend::suite::{self, eventually, MIB};

    #[test]
    fn a_timeout_of_an_operation_sent_before_the_cluster_answered_is_stale() {
        let reach = Reach::new("c:p/i".into());
        let timed_out = || -> Result<(), dpu_rbd::Error> {
            Err(dpu_rbd::Error {
                what: "rbd write".into(),
                errno: 110,
            })
        };
        // Sent into an outage: the first timeout counts.
        let (a, b) = (reach.start(), reach.start());
        reach.note(a, &timed_out());
        assert!(reach.unreachable.load(Ordering::Acquire));
        // Back: one started later answers.
        let c = reach.start();
        reach.note(c, &Ok(()));
        assert!(!reach.unreachable.load(Ordering::Acquire));
        // An operation sent before that answer times out late: stale.
        reach.note(b, &timed_out());
        assert!(!reach.unreachable.load(Ordering::Acquire));
        // One sent after the answer that times out counts again.
        let d = reach.start();
        reach.note(d, &timed_out());
        assert!(reach.unreachable.load(Ordering::Acquire));
    }

    #[test]
    fn rbd_suite() {
        let c = TestCluster::start(false);
        let conn = Link::new(Cluster::connect(&c.config(Duration::from_secs(20))).unwrap());
        let pool = conn.cluster.pool("rbd", None).unwrap();
        let n = AtomicUsize::new(0);
        suite::suite(&|len| {
            let name = format!("suite{}", n.fetch_add(1, Ordering::Relaxed));
            pool.create_image(&name, len).unwrap();
            let b = RbdBackend::open(&conn, "test", "rbd", &name).unwrap();
            assert_eq!((b.kind(), b.len()), ("rbd", len));
            assert!(b.asynchronous() && !b.volatile_write_cache() && b.reachable());
            Box::new(b)
        });
    }

    #[test]
    fn clusters_share_a_connection_and_name_the_one_that_is_down() {
        let c = TestCluster::start(false);
        let spec = RbdCluster {
            name: "ceph1".into(),
            mon_host: c.mon_host.clone(),
            user: "admin".into(),
            key: Some(c.admin_key.clone()),
            op_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
        };
        let clusters = Clusters::default();
        let a = clusters.connect(&spec).unwrap();
        a.cluster
            .pool("rbd", None)
            .unwrap()
            .create_image("v", MIB)
            .unwrap();
        let b = clusters.connect(&spec).unwrap();
        // The same connection: an image opened through one is the other's.
        RbdBackend::open(&b, "ceph1", "rbd", "v").unwrap();
        let e = RbdBackend::open(&b, "ceph1", "rbd", "missing").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(
            e.to_string().contains("ceph1") && e.to_string().contains("rbd/missing"),
            "{e}"
        );
        clusters.retain(&[]);

        let down = RbdCluster {
            name: "ceph2".into(),
            mon_host: "127.0.0.1:9".into(),
            connect_timeout: Duration::from_secs(2),
            ..spec
        };
        let t = Instant::now();
        let e = clusters.connect(&down).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert!(
            e.to_string().contains("ceph2") && e.to_string().contains("127.0.0.1:9"),
            "{e}"
        );
    }

    #[test]
    fn another_clients_resize_is_followed_and_announced() {
        let c = TestCluster::start(false);
        let conn = Link::new(Cluster::connect(&c.config(Duration::from_secs(10))).unwrap());
        conn.cluster
            .pool("rbd", None)
            .unwrap()
            .create_image("grow", 4 * MIB)
            .unwrap();
        let b = RbdBackend::open(&conn, "test", "rbd", "grow").unwrap();
        let told = Arc::new(AtomicUsize::new(0));
        let t = told.clone();
        b.on_resize(Box::new(move || {
            t.fetch_add(1, Ordering::Relaxed);
        }));
        c.rbd(&["resize", "rbd/grow", "--size", "8M"]);
        eventually("the new size", || b.len() == 8 * MIB);
        eventually("the announcement", || told.load(Ordering::Relaxed) == 1);
        // I/O reaches the new space.
        b.write_at(7 * MIB, &[1, 2, 3], false).unwrap();
        assert_eq!(suite::read(&b, 7 * MIB, 3), [1, 2, 3]);
        // Our own resize is no news.
        b.resize(6 * MIB).unwrap();
        assert_eq!(b.len(), 6 * MIB);
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(told.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn an_osd_that_stops_answering_makes_io_unavailable_for_a_while() {
        let c = TestCluster::start(false);
        let conn = Link::new(Cluster::connect(&c.config(Duration::from_secs(2))).unwrap());
        conn.cluster
            .pool("rbd", None)
            .unwrap()
            .create_image("v", 4 * MIB)
            .unwrap();
        let b = RbdBackend::open(&conn, "test", "rbd", "v").unwrap();
        b.write_at(0, &[7; 4096], false).unwrap();
        c.freeze_osd();
        // Operations pile up to the bound on what is in flight, no further.
        let (tx, rx) = mpsc::channel();
        assert!(b.has_room(MAX_IN_FLIGHT_OPS, 4096));
        for _ in 0..MAX_IN_FLIGHT_OPS {
            let tx = tx.clone();
            let buf = vec![0; 4096];
            b.start(
                Io::Read { offset: 0, buf },
                Box::new(move |r| {
                    let _ = tx.send(r.map(drop));
                }),
            );
        }
        assert!(
            !b.has_room(1, 0),
            "no room past {MAX_IN_FLIGHT_OPS} operations"
        );
        let t = Instant::now();
        let e = b.read_at(0, &mut [0; 4096]).unwrap_err();
        c.thaw_osd();
        for _ in 0..MAX_IN_FLIGHT_OPS {
            let r = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("every operation ends");
            assert!(r.as_ref().is_ok_and(|()| true) || r.is_err_and(|e| is_unavailable(&e)));
        }
        assert!(
            b.has_room(MAX_IN_FLIGHT_OPS, MAX_IN_FLIGHT_BYTES),
            "all room back"
        );
        assert!(is_unavailable(&e), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert!(!b.reachable());
        eventually("I/O again", || b.read_at(0, &mut [0; 4096]).is_ok());
        assert!(b.reachable());
        assert_eq!(suite::read(&b, 0, 4096), [7; 4096]);
    }
}
