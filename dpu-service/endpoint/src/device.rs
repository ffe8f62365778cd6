//! The smoltcp [`Device`] of an endpoint: frames handed in by the caller,
//! frames handed out to it.
//!
//! Receiving copies nothing: the frame the switch delivers is lent to the
//! stack where it lies ([`Endpoint::receive`](crate::Endpoint::receive)
//! processes exactly one). Replies the stack makes while it handles a
//! frame (an ARP reply, an ACK, a RST) wait in a bounded queue of reused
//! buffers until the next [`Endpoint::poll`](crate::Endpoint::poll), which
//! hands them out first; everything else is built in one scratch buffer
//! and lent to the caller's `emit` as it is made. So one copy remains on
//! the way out, the caller's (into its mbuf), besides smoltcp's own copy
//! from a socket's send buffer into the frame.

use std::collections::VecDeque;

use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::time::Instant;

/// Most frames made while handling input that may wait for the next poll;
/// input arriving while they are full is dropped (counted) as a full
/// transmit ring would drop it.
pub const PENDING_FRAMES: usize = 256;

/// Frames made while handling input, waiting for the next poll.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    frames: VecDeque<Vec<u8>>,
    /// Buffers of frames already handed out, for reuse.
    spare: Vec<Vec<u8>>,
}

impl Pending {
    /// True when no more frames may wait.
    pub(crate) fn is_full(&self) -> bool {
        self.frames.len() >= PENDING_FRAMES
    }

    /// True when a frame waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Hands every waiting frame to `emit`, in order; returns how many.
    pub(crate) fn flush(&mut self, emit: &mut impl FnMut(&[u8])) -> u64 {
        let mut n = 0;
        while let Some(f) = self.frames.pop_front() {
            emit(&f);
            n += 1;
            if self.spare.len() < PENDING_FRAMES {
                self.spare.push(f);
            }
        }
        n
    }
}

/// Where the frames the stack makes go.
pub(crate) enum Sink<'a, E> {
    /// Into the pending queue (while handling input).
    Queue(&'a mut Pending),
    /// Built in `scratch`, then lent to `emit`.
    Emit {
        /// The buffer frames are built in.
        scratch: &'a mut Vec<u8>,
        /// The caller's.
        emit: &'a mut E,
    },
}

/// A device over at most one received frame and a sink for sent ones.
pub(crate) struct FrameDevice<'a, E> {
    /// The frame to hand the stack, until it takes it.
    pub(crate) rx: Option<&'a [u8]>,
    /// Where frames go.
    pub(crate) sink: Sink<'a, E>,
    /// Frame size: the IP MTU plus the Ethernet header.
    pub(crate) frame_mtu: usize,
    /// Frames made.
    pub(crate) sent: u64,
}

impl<'a, E: FnMut(&[u8])> Device for FrameDevice<'a, E> {
    type RxToken<'b>
        = RxToken<'b>
    where
        Self: 'b;
    type TxToken<'b>
        = TxToken<'b, 'a, E>
    where
        Self: 'b;

    fn receive(&mut self, _now: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        if let Sink::Queue(q) = &self.sink {
            if q.is_full() {
                return None;
            }
        }
        let frame = self.rx.take()?;
        Some((
            RxToken(frame),
            TxToken {
                sink: &mut self.sink,
                sent: &mut self.sent,
            },
        ))
    }

    fn transmit(&mut self, _now: Instant) -> Option<Self::TxToken<'_>> {
        if let Sink::Queue(q) = &self.sink {
            if q.is_full() {
                return None;
            }
        }
        Some(TxToken {
            sink: &mut self.sink,
            sent: &mut self.sent,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.frame_mtu;
        // Frames are handled one at a time; TCP sends as the window
        // allows.
        caps.max_burst_size = None;
        caps
    }
}

/// Lends the received frame.
pub(crate) struct RxToken<'a>(&'a [u8]);

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        f(self.0)
    }
}

/// Builds one frame into the sink.
pub(crate) struct TxToken<'b, 'a, E> {
    sink: &'b mut Sink<'a, E>,
    sent: &'b mut u64,
}

impl<E: FnMut(&[u8])> phy::TxToken for TxToken<'_, '_, E> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        *self.sent += 1;
        match self.sink {
            Sink::Queue(q) => {
                let mut buf = q.spare.pop().unwrap_or_default();
                fit(&mut buf, len);
                let r = f(&mut buf);
                q.frames.push_back(buf);
                r
            }
            Sink::Emit { scratch, emit } => {
                fit(scratch, len);
                let r = f(scratch);
                emit(scratch);
                r
            }
        }
    }
}

/// Makes `buf` `len` bytes long, zeroing only bytes it never had: the
/// stack writes every byte of a frame, so a reused buffer's old bytes
/// need no clearing (that memset was 3% of a 4 KiB read's cycles).
fn fit(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0);
    } else {
        buf.truncate(len);
    }
}
