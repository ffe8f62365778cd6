//! The kernel TCP transport: listeners and one thread per connection (one
//! per NVMe queue), each driving a sans-IO [`Connection`].
//!
//! A connection thread reads what the socket has, lets the connection
//! consume every whole PDU in it, runs the block requests that produced,
//! and writes all the responses back in one go (a vectored write: large
//! read data goes from its read buffer to the socket, never copied behind
//! its PDU header); a read timeout wakes it for keep-alive checks and
//! asynchronous events. A write that moves no byte for [`WRITE_TIMEOUT`]
//! (a host that stopped reading its socket) ends the connection, so no
//! thread waits on a peer without bound.
//!
//! Placement ([`TcpConfig::io_cpus`]): with I/O CPUs configured, a
//! connection's thread pins itself to one of them once its Fabrics Connect
//! names an I/O queue, `io_cpus[(qid - 1) % len]`, so the queues of one
//! controller spread over the cores the way the Linux host spreads them
//! over its CPUs. The listeners, the admin and discovery queues, and
//! connections not yet connected run on the process's other CPUs (all of
//! them when the I/O CPUs take every one). Without I/O CPUs nothing is
//! pinned. Once connected, a thread is named after its queue
//! (`nvme-io-q3`, `nvme-admin`, `nvme-disc`), as `top -H` and
//! `/proc/PID/task/*/comm` show it.

use std::collections::{BTreeSet, HashMap};
use std::ffi::CString;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::conn::{Connection, IN_CAPSULE_DATA, MAX_H2C_DATA};
use crate::controller::ControllerKind;
use crate::target::Target;

/// How often an idle connection wakes up.
const TICK: Duration = Duration::from_millis(100);
/// How long a queue's thread keeps polling its socket when no bytes are
/// waiting before it sleeps in the kernel. Waking a sleeping thread costs
/// tens of microseconds (more in a VM), which at low queue depth is most of
/// a command's latency; a short poll keeps the next command's bytes on a
/// running thread, the way a poll-mode target does, without holding the
/// core when the host has gone quiet.
const POLL: Duration = Duration::from_micros(50);
/// Receive buffer: room for the largest PDU plus what follows it.
const RX_BUF: usize = 4 * (MAX_H2C_DATA as usize + IN_CAPSULE_DATA as usize);
/// Most slices one vectored write takes (well under the kernel's IOV_MAX).
const IOV: usize = 64;
/// How long the host may take no byte of what the target has to send: a
/// host that stops reading its socket loses the connection after it,
/// instead of holding its thread in a write forever.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The socket's send timeout: one write call waits at most this long for
/// room, and [`send_output`] counts the calls that moved nothing against
/// [`WRITE_TIMEOUT`]. (A call that moves a few bytes returns only when its
/// own timeout is up, so the socket timeout alone would let a host stall
/// the thread for up to twice as long.)
const WRITE_WAIT: Duration = Duration::from_secs(1);

/// How a [`TcpTransport`] places its threads on CPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TcpConfig {
    /// The CPUs the I/O queues run on: I/O queue `qid` pins its thread to
    /// `io_cpus[(qid - 1) % io_cpus.len()]` ([`TcpConfig::io_cpu`]) once
    /// its Connect arrives. Listeners, admin and discovery queues stay on
    /// the process's other CPUs, or anywhere when these are all of them.
    /// Each must be among the CPUs the process may use, once. Empty (the
    /// default): no thread is pinned.
    pub io_cpus: Vec<usize>,
    /// CPUs other work of the process holds, such as the data plane's
    /// poll-mode workers: no thread of the transport runs there. Listeners,
    /// admin and discovery queues, and I/O queues when `io_cpus` is empty,
    /// keep to the allowed CPUs less `io_cpus` and these (anywhere, when
    /// that leaves none). None of them may be in `io_cpus`; CPUs outside
    /// the allowed set are ignored.
    pub avoid_cpus: Vec<usize>,
}

/// Why a [`TcpConfig`] was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcpConfigError {
    /// A CPU of `io_cpus` is also in `avoid_cpus`.
    #[error("io_cpus[{index}]: CPU {cpu} is one the transport must keep off (held by other work)")]
    AvoidedCpu {
        /// Position in `io_cpus`.
        index: usize,
        /// The CPU.
        cpu: usize,
    },
    /// A CPU is listed twice in `io_cpus`.
    #[error("io_cpus[{index}]: CPU {cpu} is listed twice")]
    DuplicateCpu {
        /// Position of the second mention.
        index: usize,
        /// The CPU.
        cpu: usize,
    },
    /// A CPU of `io_cpus` is outside the set this process may run on
    /// (`sched_getaffinity`: the machine's CPUs, a container's cpuset,
    /// `taskset`).
    #[error("io_cpus[{index}]: CPU {cpu} is not among the CPUs this process may use ({allowed})")]
    CpuNotAllowed {
        /// Position in `io_cpus`.
        index: usize,
        /// The CPU.
        cpu: usize,
        /// The CPUs the process may use, as a list such as "0-3,6".
        allowed: String,
    },
    /// The CPUs this process may use could not be read.
    #[error("reading the CPUs this process may use: {0}")]
    Affinity(#[source] io::Error),
}

impl TcpConfig {
    /// The CPU I/O queue `qid` runs on: `None` for the admin queue (0) or
    /// when no I/O CPUs are configured.
    pub fn io_cpu(&self, qid: u16) -> Option<usize> {
        let n = self.io_cpus.len();
        if qid == 0 || n == 0 {
            return None;
        }
        self.io_cpus.get(usize::from(qid - 1) % n).copied()
    }

    /// Checks `io_cpus` against the CPUs this process may use (those of
    /// the calling thread, which are the process's until something pins
    /// it). Makes no system call when `io_cpus` and `avoid_cpus` are empty.
    ///
    /// # Errors
    /// A CPU listed twice, outside the allowed set or in `avoid_cpus`,
    /// naming it; or the allowed set could not be read.
    pub fn validate(&self) -> Result<(), TcpConfigError> {
        self.placement().map(drop)
    }

    /// The placement of the threads, checked against the allowed CPUs.
    fn placement(&self) -> Result<Placement, TcpConfigError> {
        if self.io_cpus.is_empty() && self.avoid_cpus.is_empty() {
            return Ok(Placement::default());
        }
        let allowed = dpu_os::affinity::current_thread_cpus().map_err(TcpConfigError::Affinity)?;
        self.check(&allowed)?;
        let others: Vec<usize> = allowed
            .iter()
            .copied()
            .filter(|c| !self.io_cpus.contains(c) && !self.avoid_cpus.contains(c))
            .collect();
        Ok(Placement {
            config: self.clone(),
            others,
        })
    }

    /// Checks `io_cpus` against `allowed`.
    fn check(&self, allowed: &[usize]) -> Result<(), TcpConfigError> {
        for (index, &cpu) in self.io_cpus.iter().enumerate() {
            if self.io_cpus[..index].contains(&cpu) {
                return Err(TcpConfigError::DuplicateCpu { index, cpu });
            }
            if self.avoid_cpus.contains(&cpu) {
                return Err(TcpConfigError::AvoidedCpu { index, cpu });
            }
            if !allowed.contains(&cpu) {
                return Err(TcpConfigError::CpuNotAllowed {
                    index,
                    cpu,
                    allowed: cpu_list(allowed),
                });
            }
        }
        Ok(())
    }
}

/// CPUs as Linux lists them: ascending, runs as ranges ("0-3,6").
fn cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while let Some(&first) = sorted.get(i) {
        let mut last = first;
        while sorted.get(i + 1) == Some(&(last + 1)) {
            last += 1;
            i += 1;
        }
        i += 1;
        if !out.is_empty() {
            out.push(',');
        }
        if last == first {
            out.push_str(&first.to_string());
        } else {
            out.push_str(&format!("{first}-{last}"));
        }
    }
    out
}

/// Where threads run, resolved once when the transport starts.
#[derive(Debug, Default)]
struct Placement {
    config: TcpConfig,
    /// The allowed CPUs that are neither I/O CPUs nor avoided: the
    /// listeners' and (by inheritance) every connection's unless it is
    /// pinned as an I/O queue. Empty: leave those threads where they are.
    others: Vec<usize>,
}

impl Placement {
    /// Restricts the calling (listener) thread to the CPUs neither for I/O
    /// queues nor avoided.
    fn keep_to_others(&self, what: &str) {
        if self.others.is_empty() {
            return;
        }
        if let Err(e) = dpu_os::affinity::set_current_thread_cpus(&self.others) {
            tracing::warn!(thread = what, error = %e, "cannot keep the thread off the NVMe/TCP I/O CPUs");
        }
    }

    /// Names the calling connection thread after its queue and, for an
    /// I/O queue, pins it to its CPU.
    fn place_queue(&self, qid: u16, discovery: bool, peer: SocketAddr) {
        let name = match qid {
            0 if discovery => "nvme-disc".to_string(),
            0 => "nvme-admin".to_string(),
            q => format!("nvme-io-q{q}"),
        };
        if let Ok(n) = CString::new(name) {
            // Only the kernel's name (what /proc and top show) changes.
            let _ = rustix::thread::set_name(&n);
        }
        if let Some(cpu) = self.config.io_cpu(qid) {
            match dpu_os::affinity::pin_current_thread(cpu) {
                Ok(()) => tracing::debug!(%peer, qid, cpu, "I/O queue pinned"),
                Err(e) => {
                    tracing::warn!(%peer, qid, cpu, error = %e, "cannot pin the I/O queue's thread; it runs where it was")
                }
            }
        }
    }
}

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
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    placement: Arc<Placement>,
}

impl TcpTransport {
    /// A transport with no listeners yet, its threads unpinned.
    pub fn new(target: Target) -> Self {
        Self::placed(target, Placement::default())
    }

    /// A transport with no listeners yet, placing its threads as `config`
    /// says (see the [module](self) documentation).
    ///
    /// # Errors
    /// As [`TcpConfig::validate`].
    pub fn with_config(target: Target, config: &TcpConfig) -> Result<Self, TcpConfigError> {
        let placement = config.placement()?;
        let placing = !config.io_cpus.is_empty() || !config.avoid_cpus.is_empty();
        if placing && placement.others.is_empty() {
            // Said once, here, not by every `validate`.
            tracing::warn!(
                io_cpus = %cpu_list(&config.io_cpus),
                avoid_cpus = %cpu_list(&config.avoid_cpus),
                "no CPU is left for the NVMe/TCP listeners and admin queues; they run anywhere"
            );
        }
        if !config.io_cpus.is_empty() {
            tracing::info!(
                io_cpus = ?config.io_cpus,
                other_cpus = %cpu_list(&placement.others),
                "NVMe/TCP I/O queues pinned to their CPUs"
            );
        }
        Ok(Self::placed(target, placement))
    }

    fn placed(target: Target, placement: Placement) -> Self {
        Self {
            target,
            listeners: Mutex::new(HashMap::new()),
            stop: Arc::new(AtomicBool::new(false)),
            conns: Arc::new(Mutex::new(Vec::new())),
            placement: Arc::new(placement),
        }
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

    fn listen(&self, addr: SocketAddr) -> io::Result<Listening> {
        let sock = TcpListener::bind(addr)?;
        let bound = sock.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (target, conns, stop_l, stop_all, placement) = (
            self.target.clone(),
            self.conns.clone(),
            stop.clone(),
            self.stop.clone(),
            self.placement.clone(),
        );
        let thread = std::thread::Builder::new()
            .name(format!("nvmf-listen-{}", bound.port()))
            .spawn(move || {
                // Connection threads inherit this set until they know
                // their queue.
                placement.keep_to_others("listener");
                for s in sock.incoming() {
                    if stop_l.load(Ordering::Acquire) || stop_all.load(Ordering::Acquire) {
                        break;
                    }
                    let stream = match s {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!(addr = %bound, error = %e, "accept failed");
                            std::thread::sleep(Duration::from_millis(10));
                            continue;
                        }
                    };
                    let (t, stop, p) = (target.clone(), stop_all.clone(), placement.clone());
                    let spawned = std::thread::Builder::new()
                        .name("nvmf-queue".into())
                        .spawn(move || serve(t, stream, &stop, &p));
                    match spawned {
                        Ok(h) => {
                            let mut c = conns.lock().expect("connections lock");
                            c.retain(|h| !h.is_finished());
                            c.push(h);
                        }
                        Err(e) => tracing::error!(error = %e, "cannot start a connection thread"),
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
        let conns: Vec<_> = self
            .conns
            .lock()
            .expect("connections lock")
            .drain(..)
            .collect();
        for h in conns {
            let _ = h.join();
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
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

/// Reads what has arrived; if nothing has, polls for up to `poll` before
/// a blocking read (which the socket's read timeout bounds).
fn read_polling(stream: &mut TcpStream, buf: &mut [u8], poll: Duration) -> io::Result<usize> {
    let start = Instant::now();
    loop {
        match rustix::net::recv(&*stream, &mut *buf, rustix::net::RecvFlags::DONTWAIT) {
            Ok((n, _)) => return Ok(n),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        if start.elapsed() >= poll {
            return stream.read(buf);
        }
        std::hint::spin_loop();
    }
}

/// Writes everything `conn` has to send, in vectored writes. A write
/// waits at most [`WRITE_WAIT`] (the socket's send timeout) for room; the
/// host has [`WRITE_TIMEOUT`] without taking a byte before this gives up
/// with the timed-out error.
fn send_output(stream: &mut TcpStream, conn: &mut Connection) -> io::Result<()> {
    let mut progress = Instant::now();
    loop {
        let mut iov = [IoSlice::new(&[]); IOV];
        let n = conn.output_slices(&mut iov);
        if n == 0 {
            return Ok(());
        }
        match stream.write_vectored(&iov[..n]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => {
                conn.output_sent(k);
                progress = Instant::now();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if progress.elapsed() >= WRITE_TIMEOUT {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Ends `conn` after a failed write; a timed-out one (the host stopped
/// reading) is logged as such.
fn write_error(conn: &mut Connection, peer: SocketAddr, e: &io::Error) {
    if matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) {
        tracing::warn!(
            %peer,
            "the host read nothing for {WRITE_TIMEOUT:?}; closing the connection"
        );
        conn.close("write timed out");
    } else {
        conn.close(&format!("write failed: {e}"));
    }
}

/// Drives one connection until it closes or the transport stops.
fn serve(target: Target, mut stream: TcpStream, stop: &AtomicBool, placement: &Placement) {
    let (local, peer) = match (stream.local_addr(), stream.peer_addr()) {
        (Ok(l), Ok(p)) => (l, p),
        _ => return,
    };
    let _ = stream.set_nodelay(true);
    if let Err(e) = stream
        .set_read_timeout(Some(TICK))
        .and_then(|()| stream.set_write_timeout(Some(WRITE_WAIT)))
    {
        tracing::warn!(%peer, error = %e, "cannot set the socket's timeouts");
        return;
    }
    tracing::debug!(%peer, %local, "NVMe/TCP connection");
    let mut conn = Connection::new(target, local, peer);
    let mut buf = vec![0u8; RX_BUF];
    let mut filled = 0;
    let mut last_tick = Instant::now();
    let mut placed = false;
    // Once a write failed (or timed out), nothing more is written: a
    // second attempt would wait out the timeout again.
    let mut write_failed = false;
    loop {
        match read_polling(&mut stream, &mut buf[filled..], POLL) {
            Ok(0) => conn.close("host closed the connection"),
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => conn.close(&format!("read failed: {e}")),
        }
        let used = conn.receive(&buf[..filled], Instant::now());
        buf.copy_within(used..filled, 0);
        filled -= used;
        if !placed {
            // Before the Connect's response leaves: the host's first
            // command on the queue already finds the thread on its CPU.
            if let Some(qid) = conn.queue_id() {
                placed = true;
                let discovery = conn
                    .ctrl
                    .as_ref()
                    .is_some_and(|c| c.kind == ControllerKind::Discovery);
                placement.place_queue(qid, discovery, peer);
            }
        }
        conn.execute_requests(|conn| {
            if !write_failed {
                if let Err(e) = send_output(&mut stream, conn) {
                    write_failed = true;
                    write_error(&mut *conn, peer, &e);
                }
            }
        });
        let now = Instant::now();
        if now.duration_since(last_tick) >= TICK {
            last_tick = now;
            conn.tick(now);
        }
        if stop.load(Ordering::Acquire) {
            conn.close("service stopping");
        }
        if !write_failed {
            if let Err(e) = send_output(&mut stream, &mut conn) {
                write_failed = true;
                write_error(&mut conn, peer, &e);
            }
        }
        if conn.is_closed() {
            break;
        }
    }
    tracing::debug!(%peer, reason = conn.close_reason().unwrap_or(""), "NVMe/TCP connection closed");
    let _ = stream.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(io_cpus: &[usize]) -> TcpConfig {
        TcpConfig {
            io_cpus: io_cpus.to_vec(),
            avoid_cpus: Vec::new(),
        }
    }

    #[test]
    fn io_queues_spread_over_the_io_cpus_in_order() {
        let c = cfg(&[4, 2, 7]);
        assert_eq!(c.io_cpu(0), None, "the admin queue is no I/O queue");
        let got: Vec<_> = (1..=7).map(|q| c.io_cpu(q).unwrap()).collect();
        assert_eq!(got, [4, 2, 7, 4, 2, 7, 4]);
        assert_eq!(c.io_cpu(u16::MAX), Some([4, 2, 7][(65_534) % 3]));
        assert_eq!(cfg(&[]).io_cpu(1), None);
    }

    #[test]
    fn io_cpus_outside_the_allowed_set_or_listed_twice_are_refused_by_name() {
        let allowed = [0, 1, 2, 3, 6];
        assert!(cfg(&[3, 6]).check(&allowed).is_ok());
        assert!(cfg(&[]).check(&[]).is_ok());
        let e = cfg(&[1, 5]).check(&allowed).unwrap_err();
        assert_eq!(
            e.to_string(),
            "io_cpus[1]: CPU 5 is not among the CPUs this process may use (0-3,6)"
        );
        let e = cfg(&[2, 3, 2]).check(&allowed).unwrap_err();
        assert_eq!(e.to_string(), "io_cpus[2]: CPU 2 is listed twice");
        let avoiding = TcpConfig {
            avoid_cpus: vec![1, 9],
            ..cfg(&[2, 1])
        };
        assert_eq!(
            avoiding.check(&allowed).unwrap_err().to_string(),
            "io_cpus[1]: CPU 1 is one the transport must keep off (held by other work)"
        );
        // Against the real affinity: no machine has this CPU.
        let e = cfg(&[100_000]).validate().unwrap_err();
        assert!(
            matches!(e, TcpConfigError::CpuNotAllowed { cpu: 100_000, .. }),
            "{e}"
        );
        assert!(TcpTransport::with_config(Target::new(), &cfg(&[100_000])).is_err());
    }

    #[test]
    fn cpu_lists_read_like_linux_writes_them() {
        assert_eq!(cpu_list(&[]), "");
        assert_eq!(cpu_list(&[5]), "5");
        assert_eq!(cpu_list(&[3, 0, 1, 2, 6, 8, 9]), "0-3,6,8-9");
    }

    #[test]
    fn others_are_the_allowed_cpus_left_by_the_io_cpus() {
        let allowed = dpu_os::affinity::current_thread_cpus().unwrap();
        let &last = allowed.last().unwrap();
        let p = cfg(&[last]).placement().unwrap();
        assert_eq!(p.others, allowed[..allowed.len() - 1]);
        assert!(cfg(&[]).placement().unwrap().others.is_empty());
        // Avoided CPUs are left out too, with or without I/O CPUs; unknown
        // ones change nothing.
        let &first = allowed.first().unwrap();
        let avoid = |io: &[usize], avoid: &[usize]| {
            TcpConfig {
                avoid_cpus: avoid.to_vec(),
                ..cfg(io)
            }
            .placement()
            .unwrap()
            .others
        };
        let middle: Vec<usize> = allowed[1..allowed.len() - 1].to_vec();
        if allowed.len() > 1 {
            assert_eq!(avoid(&[last], &[first]), middle);
            assert_eq!(avoid(&[], &[first]), allowed[1..]);
        }
        assert_eq!(avoid(&[], &[100_000]), allowed);
        // Nothing left: threads stay where they are.
        assert!(avoid(&[], &allowed).is_empty());
    }
}
