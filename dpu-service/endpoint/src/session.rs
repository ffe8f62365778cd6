//! One TCP connection of an endpoint and the NVMe/TCP
//! [`Connection`] it drives, as the kernel transport's poll group drives
//! one over a socket.
//!
//! Input: the socket's receive buffer is offered to the connection where
//! it lies; whole PDUs are consumed there, and only the start of a PDU not
//! yet whole (it may straddle the ring's end) is copied aside, as the
//! kernel transport keeps it. While the connection is held back (its
//! output over [`OUTPUT_BUDGET`](dpu_nvmeof::conn::OUTPUT_BUDGET)) the
//! socket is not read: its window closes and the host stops sending.
//! Output: block requests run on the calling thread
//! ([`Connection::execute_requests`]); what they produce is copied into the
//! socket's send buffer as far as it has room, the rest stays in the
//! connection. A connection whose host took nothing for the write timeout
//! is reset.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::time::Instant;

use dpu_nvmeof::{Connection, Target};
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp::{self, State};

/// Most bytes taken from the socket per read while a partial PDU is kept
/// aside: a read never copies more than this beyond the PDU.
const RX_CHUNK: usize = 64 << 10;

/// Most slices of output handed to the socket per write.
const IOV: usize = 32;

/// What became of a session after [`Session::pump`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// It goes on.
    Open,
    /// The NVMe/TCP connection is over: close the socket gracefully.
    Close,
    /// The socket is gone (reset by the host, or closed on both sides):
    /// free it.
    Gone,
}

/// One connection.
#[derive(Debug)]
pub(crate) struct Session {
    /// Its socket.
    pub(crate) handle: SocketHandle,
    /// The host's address and port.
    pub(crate) peer: SocketAddr,
    /// The NVMe/TCP connection.
    pub(crate) conn: Connection,
    /// Its target, for counters.
    pub(crate) target: Target,
    /// The start of a PDU not yet whole.
    rx: Vec<u8>,
    /// Since when output has waited for a send buffer with no room.
    pub(crate) stalled_since: Option<Instant>,
    /// When its SYN arrived.
    pub(crate) opened: Instant,
    /// Its number among the endpoint's sessions, never reused: DH results
    /// find their session by it.
    pub(crate) id: u64,
    /// Alive as long as the session: a DH job whose session is gone by its
    /// turn is dropped unrun.
    pub(crate) alive: std::sync::Arc<()>,
}

impl Session {
    /// Session `id` on `handle` from `peer`, serving `conn`, its SYN
    /// taken at `now`.
    pub(crate) fn new(
        handle: SocketHandle,
        peer: SocketAddr,
        conn: Connection,
        target: Target,
        now: Instant,
        id: u64,
    ) -> Self {
        Self {
            handle,
            peer,
            conn,
            target,
            rx: Vec::new(),
            stalled_since: None,
            opened: now,
            id,
            alive: std::sync::Arc::new(()),
        }
    }

    /// Moves bytes between the socket and the connection and runs the
    /// block requests waiting, until no byte moves either way.
    pub(crate) fn pump(&mut self, sock: &mut tcp::Socket<'_>, now: Instant) -> Fate {
        match sock.state() {
            State::TimeWait => {
                self.conn.close("host closed the connection");
                return Fate::Gone;
            }
            State::Closed if sock.remote_endpoint().is_some() => {
                // Aborted here (write timeout): its RST is still to go.
                self.conn.close("connection reset");
                return Fate::Close;
            }
            State::Closed => {
                self.conn.close("the host reset the connection");
                return Fate::Gone;
            }
            State::Listen | State::SynSent | State::SynReceived => return Fate::Open,
            _ => {}
        }
        loop {
            let mut moved = self.write(sock, now);
            moved |= self.read(sock, now);
            let Self {
                conn,
                stalled_since,
                ..
            } = self;
            // Requests that ran are no reason for another round by
            // themselves: the rest of a long Write Zeroes runs one chunk
            // per poll, as in the kernel transport.
            conn.execute_requests(|c| {
                moved |= write_out(sock, c, stalled_since, now);
            });
            moved |= self.write(sock, now);
            if !moved || self.conn.is_closed() {
                break;
            }
        }
        if !self.conn.is_closed() && !sock.may_recv() && self.rx.is_empty() && !sock.can_recv() {
            // The host sent its FIN: nothing more will come.
            self.conn.close("host closed the connection");
        }
        if self.conn.is_closed() {
            self.write(sock, now);
            return Fate::Close;
        }
        Fate::Open
    }

    /// Writes output into the socket; true if it took any.
    fn write(&mut self, sock: &mut tcp::Socket<'_>, now: Instant) -> bool {
        write_out(sock, &mut self.conn, &mut self.stalled_since, now)
    }

    /// Offers the socket's bytes to the connection; true if any were
    /// taken from the socket.
    fn read(&mut self, sock: &mut tcp::Socket<'_>, now: Instant) -> bool {
        let mut moved = false;
        while !self.conn.held_back() && !self.conn.is_closed() && sock.can_recv() {
            let Self { conn, rx, .. } = self;
            let took = if rx.is_empty() {
                sock.recv(|buf| {
                    let used = conn.receive(buf, now);
                    if used < buf.len() && !conn.held_back() && !conn.is_closed() {
                        // A partial PDU: aside, so the next bytes (maybe
                        // at the ring's start) can join it.
                        rx.extend_from_slice(&buf[used..]);
                        (buf.len(), buf.len())
                    } else if conn.is_closed() {
                        (buf.len(), buf.len())
                    } else {
                        (used, used)
                    }
                })
            } else {
                sock.recv(|buf| {
                    let n = buf.len().min(RX_CHUNK);
                    rx.extend_from_slice(&buf[..n]);
                    (n, n)
                })
                .inspect(|_| {
                    let used = conn.receive(rx, now);
                    rx.drain(..used);
                })
            };
            match took {
                Ok(0) | Err(_) => break,
                Ok(_) => moved = true,
            }
        }
        if self.conn.is_closed() {
            self.rx = Vec::new();
        } else if !self.rx.is_empty() && !self.conn.held_back() {
            // Bytes kept aside may hold whole PDUs once output drained.
            let used = self.conn.receive(&self.rx, now);
            self.rx.drain(..used);
        }
        moved
    }
}

/// Copies what `conn` has to send into the socket's send buffer as far as
/// it has room; true if it took any. Output that finds no room starts (or
/// continues) the stall; any progress ends it.
fn write_out(
    sock: &mut tcp::Socket<'_>,
    conn: &mut Connection,
    stalled_since: &mut Option<Instant>,
    now: Instant,
) -> bool {
    let mut moved = false;
    loop {
        let mut iov = [IoSlice::new(&[]); IOV];
        let n = conn.output_slices(&mut iov);
        if n == 0 {
            *stalled_since = None;
            return moved;
        }
        let mut took = 0;
        let mut full = false;
        for s in &iov[..n] {
            match sock.send_slice(s) {
                Ok(k) => {
                    took += k;
                    if k < s.len() {
                        full = true;
                        break;
                    }
                }
                Err(_) => {
                    full = true;
                    break;
                }
            }
        }
        if took > 0 {
            conn.output_sent(took);
            *stalled_since = None;
            moved = true;
        }
        if full || took == 0 {
            if conn.has_output() && took == 0 {
                stalled_since.get_or_insert(now);
            }
            return moved;
        }
    }
}
