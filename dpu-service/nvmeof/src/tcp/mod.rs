//! The kernel TCP transport: listeners, and poll groups that serve many
//! connections each from one event loop, each connection driving a
//! sans-IO [`Connection`].
//!
//! A listener thread accepts connections under the connection limits
//! ([`TcpConfig::max_connections`], in total and per source address) and
//! hands each to the admin group. The admin group serves the handshake,
//! the admin and discovery queues; once a connection's Fabrics Connect
//! names an I/O queue it moves, with whatever it has buffered, to the I/O
//! poll group serving the fewest I/O queues (ties go to group
//! `(qid - 1) % groups`, so one controller's queues spread over the
//! groups in order). See `group.rs` for the event loop: non-blocking
//! sockets, output queued per connection and bounded, timers.
//!
//! Placement ([`TcpConfig`]): with I/O CPUs configured there is one I/O
//! group per CPU, pinned to it; the listeners and the admin group run on
//! the process's other CPUs (all of them when the I/O CPUs take every
//! one). Without them, [`TcpConfig::poll_groups`] groups (default: one per
//! CPU the transport may use) run unpinned, off
//! [`TcpConfig::avoid_cpus`]. The threads are named `nvmf-admin`,
//! `nvmf-pg0`, `nvmf-pg1`, ... and `nvmf-listen-PORT`, as `top -H` and
//! `/proc/PID/task/*/comm` show them.
//!
//! The Diffie-Hellman work of DH-HMAC-CHAP never runs on a poll group: the
//! groups hand it to a [`DhPool`] of [`TcpConfig::auth_threads`] threads
//! (`nvmf-dh-0`, ..., placed as the admin group) behind a queue of
//! [`TcpConfig::auth_queue`] jobs, and go on serving their other
//! connections; the authentication command completes when its job has.

mod admit;
mod config;
mod group;
mod link;
mod tls;

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::pool::DhPool;
use crate::conn::Connection;
use crate::target::{SecureChannel, Target};

use admit::Admissions;
use config::{cpu_list, Placement};
pub use config::{
    TcpConfig, TcpConfigError, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    MAX_POLL_GROUPS,
};
use group::{Group, GroupHandle, Slot};
use link::Link;
use tls::Handshakes;

/// How long the host may take no byte of what the target has to send, by
/// default ([`TcpConfig::write_timeout`]): a host that stops reading its
/// socket loses the connection after it.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Listening {
    bound: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// NVMe/TCP over kernel sockets for a [`Target`].
#[derive(Debug)]
pub struct TcpTransport {
    target: Target,
    listeners: Mutex<HashMap<SocketAddr, Listening>>,
    stop: Arc<AtomicBool>,
    placement: Arc<Placement>,
    admissions: Arc<Admissions>,
    /// The admin group: handshakes, admin and discovery queues.
    admin: Arc<GroupHandle>,
    /// The I/O poll groups.
    io: Vec<Arc<GroupHandle>>,
    /// Every poll group's thread, until joined.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The DH threads, shared by every group; stopped once the groups
    /// are.
    dh: Mutex<Option<Arc<DhPool>>>,
    /// The secure channel's handshake thread.
    tls: Arc<Handshakes>,
}

impl TcpTransport {
    /// A transport with no listeners yet, its threads unpinned.
    pub fn new(target: Target) -> Self {
        Self::with_config(target, &TcpConfig::default())
            .expect("the default transport configuration is valid")
    }

    /// A transport with no listeners yet, placing its threads as `config`
    /// says (see the [module](self) documentation).
    ///
    /// # Errors
    /// As [`TcpConfig::validate`].
    ///
    /// # Panics
    /// When the system cannot start a poll group's or DH thread, or a
    /// poll group's eventfd.
    pub fn with_config(target: Target, config: &TcpConfig) -> Result<Self, TcpConfigError> {
        let placement = Arc::new(config.placement()?);
        let placing = !config.io_cpus.is_empty() || !config.avoid_cpus.is_empty();
        if placing && placement.others.is_empty() {
            // Said once, here, not by every `validate`.
            tracing::warn!(
                io_cpus = %cpu_list(&config.io_cpus),
                avoid_cpus = %cpu_list(&config.avoid_cpus),
                "no CPU is left for the NVMe/TCP listeners and admin queues; they run anywhere"
            );
        }
        let p = placement.clone();
        let dh = DhPool::with_placement(config.auth_threads, config.auth_queue, move || {
            p.keep_to_others("DH thread")
        })
        .map_err(|e| match e {
            crate::auth::pool::PoolError::Spawn(e) => {
                panic!("cannot start the DH threads: {e}")
            }
            crate::auth::pool::PoolError::OutOfRange { field, value, .. } => {
                TcpConfigError::OutOfRange {
                    field,
                    value,
                    range: "1 or more",
                }
            }
        })?;
        let dh = Arc::new(dh);
        let stop = Arc::new(AtomicBool::new(false));
        let groups = placement.io_groups();
        let mut threads = Vec::new();
        let io: Vec<Arc<GroupHandle>> = (0..groups)
            .map(|i| {
                let p = placement.clone();
                let (handle, thread) = start_group(
                    format!("nvmf-pg{i}"),
                    Vec::new(),
                    &stop,
                    &target,
                    &dh,
                    config.write_timeout,
                    move || p.place_io_group(i),
                );
                threads.push(thread);
                handle
            })
            .collect();
        let p = placement.clone();
        let (admin, thread) = start_group(
            "nvmf-admin".into(),
            io.clone(),
            &stop,
            &target,
            &dh,
            config.write_timeout,
            move || p.keep_to_others("admin group"),
        );
        threads.push(thread);
        let p = placement.clone();
        let (tls, thread) =
            Handshakes::start(target.clone(), admin.clone(), stop.clone(), move || {
                p.keep_to_others("TLS handshake thread")
            })
            .expect("the TLS handshake thread");
        threads.push(thread);
        tracing::info!(
            poll_groups = groups,
            io_cpus = ?config.io_cpus,
            other_cpus = %cpu_list(&placement.others),
            max_connections = config.max_connections,
            max_connections_per_address = config.max_connections_per_address,
            auth_threads = config.auth_threads,
            auth_queue = config.auth_queue,
            "NVMe/TCP transport started"
        );
        Ok(Self {
            admissions: Admissions::new(
                config.max_connections,
                config.max_connections_per_address,
                target.clone(),
            ),
            target,
            listeners: Mutex::new(HashMap::new()),
            stop,
            placement,
            admin,
            io,
            threads: Mutex::new(threads),
            dh: Mutex::new(Some(dh)),
            tls,
        })
    }

    /// Listens on exactly `addrs` from now on: binds the new ones, stops
    /// the ones no longer wanted (their open connections go on). Returns
    /// the addresses that could not be bound.
    pub fn set_listeners(&self, addrs: &BTreeSet<SocketAddr>) -> Vec<(SocketAddr, io::Error)> {
        let mut ls = self.listeners.lock().expect("listeners lock");
        let gone: Vec<SocketAddr> = ls.keys().filter(|a| !addrs.contains(a)).copied().collect();
        for a in gone {
            if let Some(l) = ls.remove(&a) {
                stop_listener(l);
                tracing::info!(addr = %a, "NVMe/TCP listener stopped");
            }
        }
        let mut failed = Vec::new();
        for &a in addrs {
            if ls.contains_key(&a) {
                continue;
            }
            match self.listen(a) {
                Ok(l) => {
                    tracing::info!(addr = %l.bound, "NVMe/TCP listening");
                    ls.insert(a, l);
                }
                Err(e) => {
                    tracing::error!(addr = %a, error = %e, "cannot listen for NVMe/TCP");
                    failed.push((a, e));
                }
            }
        }
        failed
    }

    /// The address each configured listener is bound to (differs from the
    /// configured one for port 0).
    pub fn bound(&self) -> HashMap<SocketAddr, SocketAddr> {
        self.listeners
            .lock()
            .expect("listeners lock")
            .iter()
            .map(|(a, l)| (*a, l.bound))
            .collect()
    }

    /// Connections open now, handshaking or connected.
    pub fn open_connections(&self) -> usize {
        self.admissions.open()
    }

    /// I/O queues each I/O poll group serves now, in group order.
    pub fn poll_group_loads(&self) -> Vec<usize> {
        self.io
            .iter()
            .map(|g| g.load.load(Ordering::Relaxed))
            .collect()
    }

    fn listen(&self, addr: SocketAddr) -> io::Result<Listening> {
        let sock = TcpListener::bind(addr)?;
        let bound = sock.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (target, stop_l, stop_all, placement, admissions, admin, tls) = (
            self.target.clone(),
            stop.clone(),
            self.stop.clone(),
            self.placement.clone(),
            self.admissions.clone(),
            self.admin.clone(),
            self.tls.clone(),
        );
        let thread = std::thread::Builder::new()
            .name(format!("nvmf-listen-{}", bound.port()))
            .spawn(move || {
                placement.keep_to_others("listener");
                let mut failures = AcceptFailures::default();
                for s in sock.incoming() {
                    if stop_l.load(Ordering::Acquire) || stop_all.load(Ordering::Acquire) {
                        break;
                    }
                    match s {
                        Ok(stream) => accept(stream, addr, &target, &admissions, &admin, &tls),
                        Err(e) => {
                            failures.note(bound, &e, Instant::now());
                            // Out of descriptors, the pending connection
                            // stays queued: wait instead of spinning on it.
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                }
            })?;
        Ok(Listening {
            bound,
            stop,
            thread,
        })
    }

    /// Stops every listener and connection and waits for their threads.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        self.target.shutdown();
        let ls: Vec<_> = self
            .listeners
            .lock()
            .expect("listeners lock")
            .drain()
            .map(|(_, l)| l)
            .collect();
        for l in ls {
            stop_listener(l);
        }
        for g in self.io.iter().chain(std::iter::once(&self.admin)) {
            g.wake();
        }
        self.tls.wake();
        let threads: Vec<_> = self
            .threads
            .lock()
            .expect("poll groups lock")
            .drain(..)
            .collect();
        for t in threads {
            let _ = t.join();
        }
        // The groups held the other references: the last one joins the
        // DH threads, whose results find no group.
        drop(self.dh.lock().expect("DH pool lock").take());
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts a poll group's thread, which first runs `place`.
fn start_group(
    name: String,
    io_groups: Vec<Arc<GroupHandle>>,
    stop: &Arc<AtomicBool>,
    target: &Target,
    dh: &Arc<DhPool>,
    write_timeout: Duration,
    place: impl FnOnce() + Send + 'static,
) -> (Arc<GroupHandle>, JoinHandle<()>) {
    let handle = GroupHandle::new().expect("an eventfd for a poll group");
    let group = Group {
        handle: handle.clone(),
        io_groups,
        stop: stop.clone(),
        target: target.clone(),
        dh: dh.clone(),
        write_timeout,
    };
    // The thread is placed before this returns, so that a started
    // transport's threads already run where they will (and a group that
    // never gets a connection is placed all the same).
    let (placed, wait) = std::sync::mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            place();
            let _ = placed.send(());
            group.run();
        })
        .expect("a poll group's thread");
    let _ = wait.recv();
    (handle, thread)
}

/// How often a listener that keeps failing to accept (out of file
/// descriptors, typically) says so.
const ACCEPT_FAILURE_LOG: Duration = Duration::from_secs(10);

/// Failed accepts of one listener, logged at most once per
/// [`ACCEPT_FAILURE_LOG`] with the count since the last log.
#[derive(Default)]
struct AcceptFailures {
    last_log: Option<Instant>,
    since: u64,
}

impl AcceptFailures {
    /// Records a failure at `now`; returns whether it was logged.
    fn note(&mut self, addr: SocketAddr, e: &io::Error, now: Instant) -> bool {
        self.since += 1;
        if self
            .last_log
            .is_some_and(|t| now.duration_since(t) < ACCEPT_FAILURE_LOG)
        {
            return false;
        }
        tracing::warn!(%addr, error = %e, failures = self.since, "accept failed");
        self.last_log = Some(now);
        self.since = 0;
        true
    }
}

/// Admits an accepted connection under the limits and hands it to the
/// admin group; closes it when over a limit.
/// Takes a connection accepted on the listener configured as `listener`:
/// to the TLS handshake thread where that listener speaks TLS, else
/// straight to the admin group.
fn accept(
    stream: TcpStream,
    listener: SocketAddr,
    target: &Target,
    admissions: &Arc<Admissions>,
    admin: &GroupHandle,
    tls: &Handshakes,
) {
    let (local, peer) = match (stream.local_addr(), stream.peer_addr()) {
        (Ok(l), Ok(p)) => (l, p),
        _ => return,
    };
    let Ok(admission) = admissions.admit(peer.ip()) else {
        return;
    };
    if let Err(e) = stream.set_nonblocking(true) {
        tracing::warn!(%peer, error = %e, "cannot make the socket non-blocking; closing it");
        return;
    }
    let _ = stream.set_nodelay(true);
    tracing::debug!(%peer, %local, "NVMe/TCP connection");
    let channel = target.secure_channel(listener);
    if channel != SecureChannel::None {
        return tls.hand(stream, local, peer, channel, admission);
    }
    let mut conn = Connection::new(target.clone(), local, peer);
    conn.set_dh_offload(true);
    admin.hand(Slot::new(Link::Plain(stream), conn, peer, admission));
}

fn stop_listener(l: Listening) {
    l.stop.store(true, Ordering::Release);
    // Wake the blocking accept with a connection of our own.
    let wake = if l.bound.ip().is_unspecified() {
        let lo: std::net::IpAddr = if l.bound.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        };
        SocketAddr::new(lo, l.bound.port())
    } else {
        l.bound
    };
    let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
    let _ = l.thread.join();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener out of descriptors fails every accept: one line per
    /// period says how many, not one per failure.
    #[test]
    fn accept_failures_are_logged_once_per_period() {
        let mut f = AcceptFailures::default();
        let addr: SocketAddr = "127.0.0.1:4420".parse().unwrap();
        let e = io::Error::from_raw_os_error(24); // EMFILE
        let t0 = Instant::now();
        assert!(f.note(addr, &e, t0));
        let logged = (1..=1000u64)
            .filter(|&i| f.note(addr, &e, t0 + Duration::from_millis(i)))
            .count();
        assert_eq!(logged, 0);
        assert_eq!(f.since, 1000);
        assert!(f.note(addr, &e, t0 + ACCEPT_FAILURE_LOG));
        assert_eq!(f.since, 0);
    }
}
