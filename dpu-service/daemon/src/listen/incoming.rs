//! The API listener's accepted connections, through its [`Gate`]: a
//! stream for tonic's server of [`Conn`]s, each closed (its reads fail)
//! when it misses the handshake timeout or stays idle past the idle
//! timeout.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::{Event, Gate, Slot};

/// How long the accept loop rests after a failed accept (such as no file
/// descriptor left), instead of spinning on it.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The admitted connections of a listener, as tonic's server takes them.
pub struct Incoming {
    listener: TcpListener,
    gate: Arc<Gate>,
    rest: Option<Pin<Box<Sleep>>>,
}

impl Incoming {
    /// The connections of `listener` that `gate` admits.
    pub fn new(listener: TcpListener, gate: Arc<Gate>) -> Self {
        Self {
            listener,
            gate,
            rest: None,
        }
    }
}

impl Stream for Incoming {
    type Item = io::Result<Conn>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(rest) = this.rest.as_mut() {
                if rest.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.rest = None;
            }
            match this.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => {
                    this.gate.note(Event::AcceptError, None);
                    this.rest = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
                }
                Poll::Ready(Ok((stream, peer))) => {
                    // Refused: dropped, so closed at once.
                    let Some(slot) = this.gate.admit(peer) else {
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    return Poll::Ready(Some(Ok(Conn::new(stream, peer, slot))));
                }
            }
        }
    }
}

/// An admitted connection of the API listener.
pub struct Conn {
    // Dropped before the socket closes, so that no new connection of the
    // same addresses meets this one's place.
    slot: Slot,
    io: TcpStream,
    peer: SocketAddr,
    timer: Pin<Box<Sleep>>,
}

impl Conn {
    fn new(io: TcpStream, peer: SocketAddr, slot: Slot) -> Self {
        let first = Instant::now() + slot.gate.limits.handshake_timeout;
        Self {
            slot,
            io,
            peer,
            timer: Box::pin(tokio::time::sleep_until(first.into())),
        }
    }

    /// Fails when the connection is past its handshake or idle timeout;
    /// otherwise arms the timer for the next look.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.slot.state.displaced(cx) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                Event::Displaced.what(),
            ));
        }
        while self.timer.as_mut().poll(cx).is_ready() {
            let gate = &self.slot.gate;
            match self.slot.state.deadline(&gate.limits, Instant::now()) {
                Ok(next) => self.timer.as_mut().reset(next.into()),
                Err(e) => {
                    gate.note(e, Some(self.peer));
                    return Err(io::Error::new(io::ErrorKind::TimedOut, e.what()));
                }
            }
        }
        Ok(())
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.io.local_addr().ok(),
            remote_addr: Some(self.peer),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
