//! A connection's byte stream: a plain socket, or a TLS session on one.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};

use dpu_tls::Session;

/// What a poll group reads and writes a connection through.
#[derive(Debug)]
pub(super) enum Link {
    /// Clear text.
    Plain(TcpStream),
    /// The secure channel.
    Tls(Box<Session>),
}

impl Link {
    /// The socket, for epoll.
    pub(super) fn socket(&self) -> &TcpStream {
        match self {
            Self::Plain(s) => s,
            Self::Tls(s) => s.get_ref(),
        }
    }

    /// Reads into `buf`; also says whether more may be there with no new
    /// edge from epoll (the buffer filled, or TLS holds decrypted bytes).
    pub(super) fn read(&mut self, buf: &mut [u8]) -> io::Result<(usize, bool)> {
        match self {
            Self::Plain(s) => {
                let n = s.read(buf)?;
                Ok((n, n == buf.len()))
            }
            Self::Tls(s) => {
                // Until the socket has no more: epoll's edge comes only
                // for bytes that arrive after this.
                let mut filled = 0;
                while filled < buf.len() {
                    match s.read_available(&mut buf[filled..]) {
                        Ok(0) if filled == 0 => return Ok((0, false)),
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock && filled > 0 => break,
                        Err(e) => return Err(e),
                    }
                }
                Ok((filled, filled == buf.len() || s.buffered()))
            }
        }
    }

    /// Writes as much of `iov` as the socket (or the TLS record) takes.
    pub(super) fn write_vectored(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Self::Plain(s) => (&*s).write_vectored(iov),
            Self::Tls(s) => s.write_vectored(iov),
        }
    }

    /// Sends what an earlier write left inside the link (a TLS record
    /// the socket did not take whole); `Ok(true)` when nothing is left.
    pub(super) fn flush_pending(&mut self) -> io::Result<bool> {
        match self {
            Self::Plain(_) => Ok(true),
            Self::Tls(s) => s.flush_pending(),
        }
    }

    /// Whether the link holds bytes the socket has not taken.
    pub(super) fn has_pending(&self) -> bool {
        match self {
            Self::Plain(_) => false,
            Self::Tls(s) => s.has_pending(),
        }
    }

    /// Gives back buffers that hold nothing: the group calls it for
    /// connections quiet for a tick.
    pub(super) fn release_idle_buffers(&mut self) {
        if let Self::Tls(s) = self {
            s.release_idle_buffers();
        }
    }

    /// Ends the stream: TLS's close_notify where the socket takes it,
    /// then the socket both ways.
    pub(super) fn shutdown(&mut self) {
        if let Self::Tls(s) = self {
            s.shutdown();
        }
        let _ = self.socket().shutdown(Shutdown::Both);
    }
}

impl AsFd for Link {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket().as_fd()
    }
}
