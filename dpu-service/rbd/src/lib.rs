//! Safe layer over `rbd-sys`: a connection to a Ceph cluster
//! ([`Cluster`]), its pools ([`Pool`]) and RBD images ([`Image`]) with
//! asynchronous I/O.
//!
//! Each I/O call takes an owned buffer and a completion closure; the
//! buffer lives in the operation until librbd calls back (on one of
//! librados' own threads, never the caller's), and the closure gets it
//! back with the result. There is no thread per I/O: a cluster connection
//! has librados' fixed set of threads, shared by every image opened
//! through it. Every operation is bounded in time by the connection's
//! [`ClusterConfig::op_timeout`]: an OSD that does not answer makes the
//! operation fail with `ETIMEDOUT` ([`Error::is_timeout`]), never hang.
//!
//! Handles close in order: an image before its pool, a pool before its
//! cluster (each holds the one below it). Closing an image waits for its
//! operations in flight, which the timeouts bound.

use std::ffi::{c_int, c_void, CString};
use std::fmt;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rbd_sys as sys;

/// A failed librados or librbd call: what was asked and the errno the
/// library answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {}", io::Error::from_raw_os_error(*.errno))]
pub struct Error {
    /// The call and its object, e.g. `open image rbd/vol1`.
    pub what: String,
    /// The positive errno.
    pub errno: i32,
}

impl Error {
    fn new(what: impl Into<String>, rc: i64) -> Self {
        Self {
            what: what.into(),
            errno: i32::try_from(rc.unsigned_abs()).unwrap_or(i32::MAX),
        }
    }

    /// The cluster did not answer within the connection's timeouts.
    pub fn is_timeout(&self) -> bool {
        self.kind() == io::ErrorKind::TimedOut
    }

    /// The pool or image does not exist.
    pub fn is_not_found(&self) -> bool {
        self.kind() == io::ErrorKind::NotFound
    }

    /// The I/O error kind of the errno.
    pub fn kind(&self) -> io::ErrorKind {
        io::Error::from_raw_os_error(self.errno).kind()
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        io::Error::new(e.kind(), e)
    }
}

/// Result of this crate's calls.
pub type Result<T> = std::result::Result<T, Error>;

/// How to reach a cluster and as whom.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Monitor addresses as Ceph's `mon_host` takes them, e.g.
    /// `10.0.0.1:6789,10.0.0.2:6789` or `[v2:10.0.0.1:3300,v1:10.0.0.1:6789]`.
    pub mon_host: String,
    /// The cephx user, without its `client.` prefix (e.g. `dpu`).
    pub user: String,
    /// The user's cephx key (base64); `None` for a cluster without cephx.
    pub key: Option<String>,
    /// Bound on each operation on an OSD: one that does not answer fails
    /// the operation with `ETIMEDOUT` after this.
    pub op_timeout: Duration,
    /// Bound on connecting and on each operation on a monitor.
    pub connect_timeout: Duration,
}

impl fmt::Debug for ClusterConfig {
    /// The key is never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("mon_host", &self.mon_host)
            .field("user", &self.user)
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// Whole seconds, at least one, as Ceph's duration options take them.
fn seconds(d: Duration) -> String {
    d.as_secs().max(1).to_string()
}

/// A C string, or an `EINVAL` error naming `what` when `s` holds a NUL.
fn c_string(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(format!("{what}: contains a NUL byte"), 22))
}

/// A connected `rados_t`.
#[derive(Debug)]
struct ClusterHandle(sys::rados_t);

// SAFETY: librados cluster handles are thread-safe (the library serializes
// its own state); the handle is only destroyed in Drop, once.
unsafe impl Send for ClusterHandle {}
// SAFETY: as above; every call taking `&self` is one librados documents
// as safe to make from several threads.
unsafe impl Sync for ClusterHandle {}

impl Drop for ClusterHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from rados_create2 and is shut down once;
        // every pool and image holds an Arc of it, so none is left.
        unsafe { sys::rados_shutdown(self.0) };
    }
}

/// A connection to a Ceph cluster, shared by every pool and image opened
/// through it (cheap to clone).
#[derive(Debug, Clone)]
pub struct Cluster {
    handle: Arc<ClusterHandle>,
    mon_host: Arc<str>,
}

impl Cluster {
    /// Connects as `config.user`. Reads no configuration file and no
    /// environment: every option comes from `config`. Fails within
    /// [`ClusterConfig::connect_timeout`] when no monitor answers, with
    /// `EACCES`/`EPERM` when the key is refused.
    pub fn connect(config: &ClusterConfig) -> Result<Self> {
        let name = c_string("cephx user", &format!("client.{}", config.user))?;
        let mut h: sys::rados_t = ptr::null_mut();
        // SAFETY: the out pointer is valid; both names are NUL-terminated
        // and only read during the call.
        let rc = unsafe { sys::rados_create2(&mut h, c"ceph".as_ptr(), name.as_ptr(), 0) };
        if rc < 0 {
            return Err(Error::new("create a cluster handle", rc.into()));
        }
        let handle = ClusterHandle(h);
        let connect = seconds(config.connect_timeout);
        let op = seconds(config.op_timeout);
        let mut options: Vec<(&str, &str)> = vec![
            ("mon_host", &config.mon_host),
            ("client_mount_timeout", &connect),
            ("rados_mon_op_timeout", &connect),
            ("rados_osd_op_timeout", &op),
            // Every write the cluster acknowledged is durable: no client
            // cache to flush, so the namespace has no volatile write cache.
            ("rbd_cache", "false"),
            // A discard smaller than the cluster's granularity still
            // zeroes its range: deallocated blocks read as zeros.
            ("rbd_skip_partial_discard", "false"),
            ("log_to_stderr", "false"),
            ("err_to_stderr", "false"),
            ("log_file", ""),
            ("admin_socket", ""),
        ];
        match &config.key {
            Some(k) => options.push(("key", k)),
            None => options.push(("auth_client_required", "none")),
        }
        for (opt, value) in options {
            let o = c_string(opt, opt)?;
            let v = c_string(opt, value)?;
            // SAFETY: the handle is live and not yet connected; both strings
            // are NUL-terminated and copied by librados.
            let rc = unsafe { sys::rados_conf_set(handle.0, o.as_ptr(), v.as_ptr()) };
            if rc < 0 {
                return Err(Error::new(format!("set cluster option {opt}"), rc.into()));
            }
        }
        // SAFETY: the handle is live and configured; connecting blocks for
        // at most client_mount_timeout.
        let rc = unsafe { sys::rados_connect(handle.0) };
        if rc < 0 {
            return Err(Error::new(
                format!("connect to the monitors at {}", config.mon_host),
                rc.into(),
            ));
        }
        Ok(Self {
            handle: Arc::new(handle),
            mon_host: config.mon_host.as_str().into(),
        })
    }

    /// Opens `pool` (and within it the RADOS `namespace`, if any).
    pub fn pool(&self, pool: &str, namespace: Option<&str>) -> Result<Pool> {
        let what = || format!("open pool {pool} on {}", self.mon_host);
        let name = c_string("pool", pool)?;
        let mut io: sys::rados_ioctx_t = ptr::null_mut();
        // SAFETY: the cluster is connected; the name is NUL-terminated; the
        // out pointer is valid.
        let rc = unsafe { sys::rados_ioctx_create(self.handle.0, name.as_ptr(), &mut io) };
        if rc < 0 {
            return Err(Error::new(what(), rc.into()));
        }
        let ctx = IoCtx {
            handle: io,
            _cluster: self.handle.clone(),
        };
        if let Some(ns) = namespace {
            let ns = c_string("namespace", ns)?;
            // SAFETY: the context is live; librados copies the name.
            unsafe { sys::rados_ioctx_set_namespace(ctx.handle, ns.as_ptr()) };
        }
        Ok(Pool {
            ctx: Arc::new(ctx),
            name: pool.into(),
        })
    }
}

/// An open `rados_ioctx_t`, holding its cluster.
#[derive(Debug)]
struct IoCtx {
    handle: sys::rados_ioctx_t,
    _cluster: Arc<ClusterHandle>,
}

// SAFETY: librados I/O contexts may be used from several threads at once
// for the calls made here (image create, remove, open); destroyed once.
unsafe impl Send for IoCtx {}
// SAFETY: as above.
unsafe impl Sync for IoCtx {}

impl Drop for IoCtx {
    fn drop(&mut self) {
        // SAFETY: created by rados_ioctx_create, destroyed once; every image
        // holds an Arc of it, so none is open.
        unsafe { sys::rados_ioctx_destroy(self.handle) };
    }
}

/// A pool of a [`Cluster`], where images live (cheap to clone).
#[derive(Debug, Clone)]
pub struct Pool {
    ctx: Arc<IoCtx>,
    name: Arc<str>,
}

impl Pool {
    /// Creates image `name` of `size` bytes with the cluster's default
    /// features; `EEXIST` when it exists.
    pub fn create_image(&self, name: &str, size: u64) -> Result<()> {
        let n = c_string("image", name)?;
        let mut order: c_int = 0;
        // SAFETY: the context is live; the name is NUL-terminated; order 0
        // asks for the default object size.
        let rc = unsafe { sys::rbd_create(self.ctx.handle, n.as_ptr(), size, &mut order) };
        if rc < 0 {
            return Err(Error::new(
                format!("create image {}/{name}", self.name),
                rc.into(),
            ));
        }
        Ok(())
    }

    /// Removes image `name`; `ENOENT` when there is none, `EBUSY` while a
    /// client has it open.
    pub fn remove_image(&self, name: &str) -> Result<()> {
        let n = c_string("image", name)?;
        // SAFETY: the context is live; the name is NUL-terminated.
        let rc = unsafe { sys::rbd_remove(self.ctx.handle, n.as_ptr()) };
        if rc < 0 {
            return Err(Error::new(
                format!("remove image {}/{name}", self.name),
                rc.into(),
            ));
        }
        Ok(())
    }

    /// Opens image `name` for reading and writing.
    pub fn open(&self, name: &str) -> Result<Image> {
        let n = c_string("image", name)?;
        let mut h: sys::rbd_image_t = ptr::null_mut();
        // SAFETY: the context is live; the name is NUL-terminated; no
        // snapshot (NULL); the out pointer is valid.
        let rc = unsafe { sys::rbd_open(self.ctx.handle, n.as_ptr(), &mut h, ptr::null()) };
        if rc < 0 {
            return Err(Error::new(
                format!("open image {}/{name}", self.name),
                rc.into(),
            ));
        }
        Ok(Image {
            handle: h,
            watches: Mutex::new(Vec::new()),
            name: format!("{}/{name}", self.name),
            _pool: self.ctx.clone(),
        })
    }
}

/// What an operation hands back: its buffer (the data read, the data
/// written, or empty), or the failure.
pub type Completion = Result<Vec<u8>>;

/// Called once when an operation ends, on one of librados' threads: it
/// should hand the result on and return at once.
pub type Done = Box<dyn FnOnce(Completion) + Send>;

/// Called when the image's header changes (a resize by anyone), on one of
/// librados' threads.
type UpdateFn = Box<dyn Fn() + Send + Sync>;

/// An operation in flight: owned by librbd from submission to callback.
struct Op {
    buf: Vec<u8>,
    /// A read, whose return value must be the buffer's length.
    read: bool,
    what: &'static str,
    done: Done,
}

impl Op {
    fn finish(self, rv: i64) {
        let Op {
            buf,
            read,
            what,
            done,
        } = self;
        let result = if rv < 0 {
            Err(Error::new(what, rv))
        } else if read && usize::try_from(rv).ok() != Some(buf.len()) {
            Err(Error::new(
                format!("{what}: {rv} of {} bytes", buf.len()),
                5,
            ))
        } else {
            Ok(buf)
        };
        // A panic must not unwind into librados' C++ frames.
        let _ = catch_unwind(AssertUnwindSafe(move || done(result)));
    }
}

/// librbd's completion callback: finishes the [`Op`] behind `arg`.
unsafe extern "C" fn op_complete(c: sys::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the Box<Op> leaked by Image::submit for this
    // completion; librbd calls back exactly once, so it is taken once.
    let op = unsafe { Box::from_raw(arg.cast::<Op>()) };
    // SAFETY: `c` is the live completion this callback belongs to.
    let rv = unsafe { sys::rbd_aio_get_return_value(c) };
    // SAFETY: released once, after its value was read and never used again
    // (librbd keeps its own reference until the callback returns).
    unsafe { sys::rbd_aio_release(c) };
    op.finish(rv as i64);
}

/// librbd's update-watch callback: calls the [`UpdateFn`] behind `arg`.
unsafe extern "C" fn update_notify(arg: *mut c_void) {
    // SAFETY: `arg` points to the UpdateFn boxed in Image::watch, which
    // stays alive until rbd_update_unwatch has returned (Image::drop).
    let f = unsafe { &*arg.cast::<UpdateFn>() };
    let _ = catch_unwind(AssertUnwindSafe(f));
}

/// An open RBD image. Every method takes `&self` and may be called from
/// many threads at once (librbd serializes what needs it).
pub struct Image {
    handle: sys::rbd_image_t,
    /// Update watches: librbd's handle and the callback it calls.
    watches: Mutex<Vec<(u64, *mut UpdateFn)>>,
    /// `pool/image`, for errors.
    name: String,
    _pool: Arc<IoCtx>,
}

impl fmt::Debug for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Image").field("name", &self.name).finish()
    }
}

// SAFETY: librbd image handles are thread-safe for the calls made here
// (asynchronous I/O, size, resize, watches); the watch callbacks are
// `Send + Sync` and only freed in Drop after librbd stopped calling them.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl Image {
    /// `pool/image`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The image's size in bytes. May ask the cluster (after a change to
    /// the header), so not for the I/O path: cache it and refresh it from
    /// a [`Image::watch`] callback's consequences.
    pub fn size(&self) -> Result<u64> {
        let mut size = 0u64;
        // SAFETY: the image is open; the out pointer is valid.
        let rc = unsafe { sys::rbd_get_size(self.handle, &mut size) };
        if rc < 0 {
            return Err(Error::new(
                format!("size of image {}", self.name),
                rc.into(),
            ));
        }
        Ok(size)
    }

    /// Grows or shrinks the image to `size` bytes.
    pub fn resize(&self, size: u64) -> Result<()> {
        // SAFETY: the image is open.
        let rc = unsafe { sys::rbd_resize(self.handle, size) };
        if rc < 0 {
            return Err(Error::new(format!("resize image {}", self.name), rc.into()));
        }
        Ok(())
    }

    /// Calls `f` whenever the image's header changes (a resize, by this
    /// client or another), until the image closes. `f` runs on one of
    /// librados' threads and must not call back into this image: it
    /// should note the change and return.
    pub fn watch(&self, f: impl Fn() + Send + Sync + 'static) -> Result<()> {
        let boxed: *mut UpdateFn = Box::into_raw(Box::new(Box::new(f) as UpdateFn));
        let mut handle = 0u64;
        // SAFETY: the image is open; `boxed` stays valid until unwatched in
        // Drop; update_notify only reads it.
        let rc = unsafe {
            sys::rbd_update_watch(self.handle, &mut handle, Some(update_notify), boxed.cast())
        };
        if rc < 0 {
            // SAFETY: not registered, so ours alone to free.
            drop(unsafe { Box::from_raw(boxed) });
            return Err(Error::new(format!("watch image {}", self.name), rc.into()));
        }
        self.watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((handle, boxed));
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset` into `buf`.
    pub fn read(&self, offset: u64, buf: Vec<u8>, done: Done) {
        self.submit(
            Op {
                buf,
                read: true,
                what: "rbd read",
                done,
            },
            |h, c, p, len| {
                // SAFETY: the image is open; `p..p+len` is the Op's buffer,
                // which librbd owns until the callback.
                unsafe { sys::rbd_aio_read(h, offset, len, p.cast(), c) }
            },
        );
    }

    /// Writes `data` at `offset`; the completion hands `data` back. Every
    /// acknowledged write is durable (no client cache), so `fua` only
    /// passes the hint on to the OSDs.
    pub fn write(&self, offset: u64, data: Vec<u8>, fua: bool, done: Done) {
        let flags = if fua { FADVISE_FUA } else { 0 };
        self.submit(
            Op {
                buf: data,
                read: false,
                what: "rbd write",
                done,
            },
            |h, c, p, len| {
                // SAFETY: as for read; librbd only reads the buffer.
                unsafe { sys::rbd_aio_write2(h, offset, len, p.cast_const().cast(), c, flags) }
            },
        );
    }

    /// Makes every acknowledged write durable (they already are: see
    /// [`Image::write`]; this also orders against writes in flight).
    pub fn flush(&self, done: Done) {
        self.submit(Self::empty("rbd flush", done), |h, c, _, _| {
            // SAFETY: the image is open.
            unsafe { sys::rbd_aio_flush(h, c) }
        });
    }

    /// Deallocates `len` bytes at `offset`; they then read as zeros.
    pub fn discard(&self, offset: u64, len: u64, done: Done) {
        self.submit(Self::empty("rbd discard", done), |h, c, _, _| {
            // SAFETY: the image is open.
            unsafe { sys::rbd_aio_discard(h, offset, len, c) }
        });
    }

    /// Writes `len` zero bytes at `offset` (the cluster may deallocate
    /// them; they read as zeros either way).
    pub fn write_zeroes(&self, offset: u64, len: u64, done: Done) {
        let Ok(n) = usize::try_from(len) else {
            done(Err(Error::new("rbd write zeroes: length", 22)));
            return;
        };
        self.submit(Self::empty("rbd write zeroes", done), |h, c, _, _| {
            // SAFETY: the image is open; no flags.
            unsafe { sys::rbd_aio_write_zeroes(h, offset, n, c, 0, 0) }
        });
    }

    fn empty(what: &'static str, done: Done) -> Op {
        Op {
            buf: Vec::new(),
            read: false,
            what,
            done,
        }
    }

    /// Hands `op` to librbd through `start` (image, completion, buffer,
    /// length), which answers librbd's return code. A negative code means
    /// the operation never started: it completes here, with that error.
    fn submit(
        &self,
        mut op: Op,
        start: impl FnOnce(sys::rbd_image_t, sys::rbd_completion_t, *mut u8, usize) -> c_int,
    ) {
        let (p, len) = (op.buf.as_mut_ptr(), op.buf.len());
        // The Vec's heap block does not move with the Box: `p` stays valid.
        let raw = Box::into_raw(Box::new(op));
        let mut c: sys::rbd_completion_t = ptr::null_mut();
        // SAFETY: `raw` is handed to librbd as the callback's argument and
        // reclaimed exactly once: by op_complete, or below if not started.
        let rc = unsafe { sys::rbd_aio_create_completion(raw.cast(), Some(op_complete), &mut c) };
        if rc < 0 {
            // SAFETY: no completion exists; `raw` is still ours.
            let op = unsafe { Box::from_raw(raw) };
            op.finish(rc.into());
            return;
        }
        let rc = start(self.handle, c, p, len);
        if rc < 0 {
            // SAFETY: librbd refused the operation before starting it: the
            // completion will never fire, so both are ours to free.
            unsafe { sys::rbd_aio_release(c) };
            // SAFETY: as above.
            let op = unsafe { Box::from_raw(raw) };
            op.finish(rc.into());
        }
    }
}

/// librados' `LIBRADOS_OP_FLAG_FADVISE_FUA`: the write should reach
/// stable storage before it is acknowledged.
const FADVISE_FUA: c_int = 0x80;

impl Drop for Image {
    fn drop(&mut self) {
        let watches = std::mem::take(
            self.watches
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for (handle, f) in watches {
            // SAFETY: registered by Image::watch; after unwatch returns
            // librbd no longer calls `f`, so it is freed once, here.
            unsafe {
                sys::rbd_update_unwatch(self.handle, handle);
                drop(Box::from_raw(f));
            }
        }
        // SAFETY: opened by rbd_open, closed once; rbd_close waits for the
        // operations in flight, whose callbacks own their buffers.
        unsafe { sys::rbd_close(self.handle) };
    }
}

/// The librbd version loaded, as `major.minor.extra`.
pub fn version() -> String {
    let (mut major, mut minor, mut extra) = (0, 0, 0);
    // SAFETY: writes three ints through valid pointers.
    unsafe { sys::rbd_version(&mut major, &mut minor, &mut extra) };
    format!("{major}.{minor}.{extra}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_and_why() {
        let e = Error::new("open image rbd/vol1", -2);
        assert!(e.is_not_found());
        assert!(e
            .to_string()
            .starts_with("open image rbd/vol1: No such file"));
        let t = Error::new("rbd read", -110);
        assert!(t.is_timeout() && !t.is_not_found());
        let io: io::Error = t.into();
        assert_eq!(io.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn the_key_is_never_printed() {
        let c = ClusterConfig {
            mon_host: "127.0.0.1:6789".into(),
            user: "dpu".into(),
            key: Some("AQBsecret==".into()),
            op_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
        };
        let s = format!("{c:?}");
        assert!(!s.contains("AQBsecret"), "{s}");
        assert!(s.contains("redacted"));
    }

    #[test]
    fn a_nul_in_a_name_is_refused_before_librados_sees_it() {
        let c = ClusterConfig {
            mon_host: "127.0.0.1:1".into(),
            user: "d\0pu".into(),
            key: None,
            op_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
        };
        let e = Cluster::connect(&c).unwrap_err();
        assert_eq!(e.errno, 22);
        assert!(e.what.contains("NUL"));
    }

    #[test]
    fn version_is_librbd_1() {
        assert!(version().starts_with("1."), "{}", version());
    }
}

#[cfg(feature = "testing")]
pub mod testing;
