//! The kernel TCP transport: listeners and one thread per connection (one
//! per NVMe queue), each driving a sans-IO [`Connection`].
//!
//! A connection thread reads what the socket has, lets the connection
//! consume every whole PDU in it, runs the block requests that produced,
//! and writes all the responses back in one go (a vectored write: large
//! read data goes from its read buffer to the socket, never copied behind
//! its PDU header); a read timeout wakes it for keep-alive checks and
//! asynchronous events.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::conn::{Connection, IN_CAPSULE_DATA, MAX_H2C_DATA};
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
}

impl TcpTransport {
    /// A transport with no listeners yet.
    pub fn new(target: Target) -> Self {
        Self {
            target,
            listeners: Mutex::new(HashMap::new()),
            stop: Arc::new(AtomicBool::new(false)),
            conns: Arc::new(Mutex::new(Vec::new())),
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
        let (target, conns, stop_l, stop_all) = (
            self.target.clone(),
            self.conns.clone(),
            stop.clone(),
            self.stop.clone(),
        );
        let thread = std::thread::Builder::new()
            .name(format!("nvmf-listen-{}", bound.port()))
            .spawn(move || {
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
                    let (t, stop) = (target.clone(), stop_all.clone());
                    let spawned = std::thread::Builder::new()
                        .name("nvmf-queue".into())
                        .spawn(move || serve(t, stream, &stop));
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

/// Writes everything `conn` has to send, in vectored writes.
fn send_output(stream: &mut TcpStream, conn: &mut Connection) -> io::Result<()> {
    loop {
        let mut iov = [IoSlice::new(&[]); IOV];
        let n = conn.output_slices(&mut iov);
        if n == 0 {
            return Ok(());
        }
        match stream.write_vectored(&iov[..n]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => conn.output_sent(k),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Drives one connection until it closes or the transport stops.
fn serve(target: Target, mut stream: TcpStream, stop: &AtomicBool) {
    let (local, peer) = match (stream.local_addr(), stream.peer_addr()) {
        (Ok(l), Ok(p)) => (l, p),
        _ => return,
    };
    let _ = stream.set_nodelay(true);
    if let Err(e) = stream.set_read_timeout(Some(TICK)) {
        tracing::warn!(%peer, error = %e, "cannot set a read timeout");
        return;
    }
    tracing::debug!(%peer, %local, "NVMe/TCP connection");
    let mut conn = Connection::new(target, local, peer);
    let mut buf = vec![0u8; RX_BUF];
    let mut filled = 0;
    let mut last_tick = Instant::now();
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
        let used = conn.receive(&buf[..filled]);
        buf.copy_within(used..filled, 0);
        filled -= used;
        while let Some(r) = conn.next_request() {
            conn.complete(r.execute());
        }
        let now = Instant::now();
        if now.duration_since(last_tick) >= TICK {
            last_tick = now;
            conn.tick(now);
        }
        if stop.load(Ordering::Acquire) {
            conn.close("service stopping");
        }
        if let Err(e) = send_output(&mut stream, &mut conn) {
            conn.close(&format!("write failed: {e}"));
        }
        if conn.is_closed() {
            break;
        }
    }
    tracing::debug!(%peer, reason = conn.close_reason().unwrap_or(""), "NVMe/TCP connection closed");
    let _ = stream.shutdown(Shutdown::Both);
}
