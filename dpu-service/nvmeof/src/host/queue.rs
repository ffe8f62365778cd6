//! A [`QueuePair`] over a byte stream ([`Wire`]): a kernel TCP socket, or
//! any other stream (nvmf-perf's own TCP/IP stack on a DPDK port).
//!
//! Two ways to drive it:
//!
//! - blocking: [`Queue::call`] sends one command and waits for its
//!   completion; [`Queue::wait`] and [`Queue::wait_for`] wait for any or
//!   one command of several in flight. Every wait ends after the queue's
//!   timeout ([`QueueOptions::timeout`]) with [`Error::Timeout`].
//! - from the caller's loop: [`Queue::set_nonblocking`], then, whenever
//!   the stream may be readable ([`Wire::fd`] for epoll):
//!   [`Queue::read_some`], [`Queue::poll_completion`] until `None`,
//!   [`Queue::send_some`]. [`Queue::submit`] queues commands in between.
//!
//! Both may be mixed: completions a wait for one CID meets for others are
//! kept and returned first by the next [`Queue::poll_completion`] or
//! [`Queue::wait`].

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use crate::spec::Sqe;

use super::error::Error;
use super::pair::{Completion, QueueOptions, QueuePair, Transfer};

/// A byte stream to a controller.
pub trait Wire: Read + Write {
    /// Reads and writes answer `WouldBlock` instead of waiting.
    fn set_nonblocking(&mut self, on: bool) -> io::Result<()>;
    /// A blocking read waits at most this long (`None`: forever).
    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()>;
    /// A blocking write waits at most this long (`None`: forever).
    fn set_write_timeout(&mut self, t: Option<Duration>) -> io::Result<()>;
    /// The kernel socket under the stream, if it is one: a caller with
    /// many queues waits on those with `epoll` instead of reading each in
    /// turn.
    fn fd(&self) -> Option<BorrowedFd<'_>>;
}

impl Wire for TcpStream {
    fn set_nonblocking(&mut self, on: bool) -> io::Result<()> {
        TcpStream::set_nonblocking(self, on)
    }
    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, t)
    }
    fn set_write_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, t)
    }
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.as_fd())
    }
}

/// A host's queue over the secure channel.
impl Wire for dpu_tls::Session {
    fn set_nonblocking(&mut self, on: bool) -> io::Result<()> {
        self.get_ref().set_nonblocking(on)
    }
    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.get_ref().set_read_timeout(t)
    }
    fn set_write_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.get_ref().set_write_timeout(t)
    }
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.get_ref().as_fd())
    }
}

impl<W: Wire + ?Sized> Wire for Box<W> {
    fn set_nonblocking(&mut self, on: bool) -> io::Result<()> {
        (**self).set_nonblocking(on)
    }
    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        (**self).set_read_timeout(t)
    }
    fn set_write_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        (**self).set_write_timeout(t)
    }
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        (**self).fd()
    }
}

/// One NVMe/TCP queue of a host: a [`QueuePair`] and its byte stream.
pub struct Queue<W> {
    wire: W,
    pair: QueuePair,
    nonblocking: bool,
    timeout: Option<Duration>,
    /// Completions met while waiting for another command.
    early: VecDeque<Completion>,
}

impl<W> std::fmt::Debug for Queue<W> {
    /// The queue's state; not the stream, which need not be `Debug`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("pair", &self.pair)
            .field("nonblocking", &self.nonblocking)
            .field("timeout", &self.timeout)
            .field("early", &self.early.len())
            .finish_non_exhaustive()
    }
}

impl Queue<TcpStream> {
    /// Connects a kernel TCP socket to `addr` (within the queue's
    /// timeout), without Nagle's delay, and opens a queue on it.
    ///
    /// # Errors
    ///
    /// As [`Queue::open`], and the socket's.
    pub fn connect_tcp(addr: SocketAddr, opts: &QueueOptions) -> Result<Self, Error> {
        let sock = match opts.timeout {
            Some(t) => TcpStream::connect_timeout(&addr, t)?,
            None => TcpStream::connect(addr)?,
        };
        sock.set_nodelay(true)?;
        Self::open(sock, opts)
    }
}

impl<W: Wire> Queue<W> {
    /// Opens a queue on `wire`: makes it blocking with the queue's
    /// timeout, sends the ICReq and waits for the ICResp. The queue is
    /// ready for its Connect.
    ///
    /// # Errors
    ///
    /// The stream's, [`Error::Timeout`], an ICResp this host cannot use
    /// ([`Error::IcResp`]) or anything else in its place.
    pub fn open(mut wire: W, opts: &QueueOptions) -> Result<Self, Error> {
        wire.set_nonblocking(false)?;
        wire.set_read_timeout(opts.timeout)?;
        wire.set_write_timeout(opts.timeout)?;
        let mut q = Queue {
            wire,
            pair: QueuePair::new(opts),
            nonblocking: false,
            timeout: opts.timeout,
            early: VecDeque::new(),
        };
        let deadline = q.deadline();
        loop {
            q.flush()?;
            // No command is in flight: nothing completes.
            q.pair.poll_completion()?;
            if q.pair.is_ready() {
                return Ok(q);
            }
            expired(deadline)?;
            q.read_some()?;
        }
    }

    /// The byte stream. Reading or writing it directly breaks the
    /// queue's framing; it is here for `fd`, options and statistics.
    pub fn wire(&self) -> &W {
        &self.wire
    }

    /// The byte stream, mutable; see [`Queue::wire`].
    pub fn wire_mut(&mut self) -> &mut W {
        &mut self.wire
    }

    /// The queue pair's state: digests, in-capsule size, commands in
    /// flight.
    pub fn pair(&self) -> &QueuePair {
        &self.pair
    }

    /// The queue pair, mutable (to set its in-capsule size).
    pub fn pair_mut(&mut self) -> &mut QueuePair {
        &mut self.pair
    }

    /// Makes the stream non-blocking (for a caller's poll loop: reads and
    /// sends do what they can and return), or blocking again.
    ///
    /// # Errors
    ///
    /// The stream's.
    pub fn set_nonblocking(&mut self, on: bool) -> Result<(), Error> {
        self.wire.set_nonblocking(on)?;
        self.nonblocking = on;
        Ok(())
    }

    /// Queues command `sqe` as `cid` with its data; it goes out at the
    /// next [`Queue::send_some`] or wait. See [`QueuePair::submit`].
    ///
    /// # Errors
    ///
    /// As [`QueuePair::submit`]; nothing is queued then.
    pub fn submit(&mut self, cid: u16, sqe: Sqe, transfer: Transfer) -> Result<(), Error> {
        self.pair.submit(cid, sqe, transfer)
    }

    /// Reads once what the stream has (waits for something when it is
    /// blocking): true when bytes came, false when a non-blocking stream
    /// had none (or a signal interrupted the read).
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] at the end of the stream, [`Error::Timeout`] when
    /// a blocking read timed out, the stream's other errors.
    pub fn read_some(&mut self) -> Result<bool, Error> {
        let buf = self.pair.receive_buffer();
        if buf.is_empty() {
            return Err(Error::ReceiveBufferFull);
        }
        match self.wire.read(buf) {
            Ok(0) => Err(Error::Closed),
            Ok(n) => {
                self.pair.received(n);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.nonblocking => Ok(false),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(Error::Timeout)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The next completion among what was read, if any (see
    /// [`QueuePair::poll_completion`]); reads nothing itself.
    ///
    /// # Errors
    ///
    /// As [`QueuePair::poll_completion`]: fatal for the queue.
    pub fn poll_completion(&mut self) -> Result<Option<Completion>, Error> {
        if let Some(c) = self.early.pop_front() {
            return Ok(Some(c));
        }
        self.pair.poll_completion()
    }

    /// Sends what the stream takes of the output (all of it when it is
    /// blocking): true when nothing is left.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] when the stream takes nothing, [`Error::Timeout`]
    /// when a blocking write timed out, the stream's other errors.
    pub fn send_some(&mut self) -> Result<bool, Error> {
        while self.pair.has_output() {
            match self.wire.write(self.pair.output()) {
                Ok(0) => return Err(Error::Closed),
                Ok(n) => self.pair.sent(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.nonblocking => {
                    return Ok(false)
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(Error::Timeout)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(true)
    }

    /// Sends all the output, within the queue's timeout.
    ///
    /// # Errors
    ///
    /// As [`Queue::send_some`].
    pub fn flush(&mut self) -> Result<(), Error> {
        let deadline = self.deadline();
        while !self.send_some()? {
            expired(deadline)?;
        }
        self.wire.flush()?;
        Ok(())
    }

    /// Sends the output and waits for the next completion of any command
    /// in flight.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when none came within the queue's timeout, and
    /// the errors of reading and sending.
    pub fn wait(&mut self) -> Result<Completion, Error> {
        if let Some(c) = self.early.pop_front() {
            return Ok(c);
        }
        let deadline = self.deadline();
        loop {
            if let Some(c) = self.pair.poll_completion()? {
                return Ok(c);
            }
            // After the poll: what it read may have been R2Ts, whose
            // H2CData must go out before anything more can come in.
            self.flush()?;
            expired(deadline)?;
            self.read_some()?;
        }
    }

    /// Sends the output and waits for the completion of command `cid`;
    /// completions of others that come first are kept for
    /// [`Queue::poll_completion`] and [`Queue::wait`].
    ///
    /// # Errors
    ///
    /// [`Error::UnknownCommand`] when `cid` is not in flight, and as
    /// [`Queue::wait`].
    pub fn wait_for(&mut self, cid: u16) -> Result<Completion, Error> {
        if let Some(i) = self.early.iter().position(|c| c.cid() == cid) {
            if let Some(c) = self.early.remove(i) {
                return Ok(c);
            }
        }
        if !self.pair.is_busy(cid) {
            return Err(Error::UnknownCommand { cid, pdu: "wait" });
        }
        let deadline = self.deadline();
        loop {
            while let Some(c) = self.pair.poll_completion()? {
                if c.cid() == cid {
                    return Ok(c);
                }
                self.early.push_back(c);
            }
            // As in `wait`: answers to R2Ts out before reading on.
            self.flush()?;
            expired(deadline)?;
            self.read_some()?;
        }
    }

    /// Runs one command to its end: submits it under the lowest free CID
    /// and waits for its completion.
    ///
    /// # Errors
    ///
    /// [`Error::Status`] when the command failed, [`Error::QueueFull`],
    /// and as [`Queue::wait_for`].
    pub fn call(&mut self, sqe: Sqe, transfer: Transfer) -> Result<Completion, Error> {
        let cid = self.pair.free_cid().ok_or(Error::QueueFull)?;
        let opcode = sqe.opcode();
        self.submit(cid, sqe, transfer)?;
        let c = self.wait_for(cid)?;
        if c.is_success() {
            Ok(c)
        } else {
            Err(Error::Status {
                opcode,
                status: c.status(),
            })
        }
    }

    /// Deletes this I/O queue: a Disconnect, then the connection closed.
    /// A controller without Disconnect (NVMe-oF 1.1; SPDK 23.05 has none)
    /// fails the command, and the closed connection deletes the queue
    /// all the same: that failure is not an error.
    ///
    /// # Errors
    ///
    /// As [`Queue::call`], but for [`Error::Status`].
    pub fn disconnect(mut self) -> Result<(), Error> {
        match self.call(super::disconnect(0), Transfer::None) {
            Ok(_) | Err(Error::Status { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// When a wait that starts now must end.
    fn deadline(&self) -> Option<Instant> {
        self.timeout.map(|t| Instant::now() + t)
    }
}

/// [`Error::Timeout`] once `deadline` has passed.
fn expired(deadline: Option<Instant>) -> Result<(), Error> {
    match deadline {
        Some(d) if Instant::now() >= d => Err(Error::Timeout),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::{self, Digests, IcResp};
    use crate::spec::{Cqe, Status};

    /// A stream that hands out scripted bytes in chunks and records what
    /// is written; after the script, reads time out (or report the end).
    struct Script {
        input: VecDeque<Vec<u8>>,
        written: Vec<u8>,
        eof: bool,
        nonblocking: bool,
    }

    impl Script {
        fn new(chunks: Vec<Vec<u8>>) -> Self {
            Self {
                input: chunks.into(),
                written: Vec::new(),
                eof: false,
                nonblocking: false,
            }
        }
    }

    impl Read for Script {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let Some(mut chunk) = self.input.pop_front() else {
                if self.eof {
                    return Ok(0);
                }
                return Err(io::ErrorKind::WouldBlock.into());
            };
            let n = chunk.len().min(buf.len());
            buf[..n].copy_from_slice(&chunk[..n]);
            if n < chunk.len() {
                self.input.push_front(chunk.split_off(n));
            }
            Ok(n)
        }
    }

    impl Write for Script {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.written.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Wire for Script {
        fn set_nonblocking(&mut self, on: bool) -> io::Result<()> {
            self.nonblocking = on;
            Ok(())
        }
        fn set_read_timeout(&mut self, _: Option<Duration>) -> io::Result<()> {
            Ok(())
        }
        fn set_write_timeout(&mut self, _: Option<Duration>) -> io::Result<()> {
            Ok(())
        }
        fn fd(&self) -> Option<BorrowedFd<'_>> {
            None
        }
    }

    fn ic_resp() -> Vec<u8> {
        let mut b = Vec::new();
        pdu::encode_ic_resp(
            &mut b,
            &IcResp {
                pfv: 0,
                cpda: 0,
                digests: Digests::default(),
                maxh2cdata: 8192,
            },
        );
        b
    }

    fn resp(cid: u16, status: Status) -> Vec<u8> {
        let mut b = Vec::new();
        pdu::encode_capsule_resp(&mut b, Digests::default(), &Cqe::new(cid, status));
        b
    }

    fn opts() -> QueueOptions {
        QueueOptions {
            timeout: Some(Duration::from_millis(200)),
            ..QueueOptions::default()
        }
    }

    #[test]
    fn open_reads_the_ic_resp_in_pieces() {
        let ic = ic_resp();
        let chunks = ic.chunks(7).map(<[u8]>::to_vec).collect();
        let q = Queue::open(Script::new(chunks), &opts()).unwrap();
        assert!(q.pair().is_ready());
        // The ICReq went out.
        assert_eq!(q.wire().written.len(), 128);
        assert_eq!(q.wire().written[0], pdu::pdu_type::IC_REQ);
    }

    #[test]
    fn silence_is_a_timeout_and_the_end_is_closed() {
        let started = Instant::now();
        let e = Queue::open(Script::new(Vec::new()), &opts()).unwrap_err();
        assert!(matches!(e, Error::Timeout), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let mut s = Script::new(Vec::new());
        s.eof = true;
        let e = Queue::open(s, &opts()).unwrap_err();
        assert!(matches!(e, Error::Closed), "{e}");
        // A command that never completes times out too.
        let mut q = Queue::open(Script::new(vec![ic_resp()]), &opts()).unwrap();
        let e = q
            .call(super::super::keep_alive(), Transfer::None)
            .unwrap_err();
        assert!(matches!(e, Error::Timeout), "{e}");
    }

    #[test]
    fn failed_command_is_a_status_error_and_the_queue_goes_on() {
        let mut input = vec![ic_resp()];
        input.push(resp(0, Status::INVALID_FIELD));
        input.push(resp(0, Status::SUCCESS));
        let mut q = Queue::open(Script::new(input), &opts()).unwrap();
        let e = q
            .call(super::super::keep_alive(), Transfer::None)
            .unwrap_err();
        match e {
            Error::Status { opcode, status } => {
                assert_eq!((opcode, status), (0x18, Status::INVALID_FIELD));
            }
            e => panic!("{e}"),
        }
        let c = q.call(super::super::keep_alive(), Transfer::None).unwrap();
        assert!(c.is_success());
    }

    #[test]
    fn wait_for_keeps_other_completions() {
        let mut input = vec![ic_resp()];
        input.push([resp(2, Status::SUCCESS), resp(1, Status::SUCCESS)].concat());
        let mut q = Queue::open(Script::new(input), &opts()).unwrap();
        for cid in [1, 2] {
            q.submit(cid, super::super::keep_alive(), Transfer::None)
                .unwrap();
        }
        assert_eq!(q.wait_for(1).unwrap().cid(), 1);
        assert_eq!(q.poll_completion().unwrap().unwrap().cid(), 2);
        assert!(q.poll_completion().unwrap().is_none());
        assert!(matches!(
            q.wait_for(1),
            Err(Error::UnknownCommand { cid: 1, .. })
        ));
    }

    #[test]
    fn nonblocking_reads_report_nothing_instead_of_timing_out() {
        let mut q = Queue::open(Script::new(vec![ic_resp()]), &opts()).unwrap();
        q.set_nonblocking(true).unwrap();
        assert!(!q.read_some().unwrap());
        q.submit(0, super::super::keep_alive(), Transfer::None)
            .unwrap();
        assert!(q.send_some().unwrap());
        assert!(q.poll_completion().unwrap().is_none());
    }
}
