//! Block requests: the I/O a connection hands its transport to run against a
//! namespace's backend ([`BlockRequest`]), and their results
//! ([`BlockCompletion`]).

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use super::budget::SharedBudget;
use crate::backend::{Io, IoDone};
use crate::qos::{Cost, Throttle};
use crate::target::{Namespace, NamespaceRemoved};

/// Where the completions of block requests started on an
/// [asynchronous](crate::backend::Backend::asynchronous) backend go: the
/// transport's way back to the connection, callable from any thread
/// ([`crate::Connection::set_completer`]).
#[derive(Clone)]
pub struct Completer(Arc<dyn Fn(BlockCompletion) + Send + Sync>);

impl Completer {
    /// A completer that calls `f` with each completion.
    pub fn new(f: impl Fn(BlockCompletion) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Hands `c` on.
    pub fn complete(&self, c: BlockCompletion) {
        (self.0)(c)
    }
}

impl std::fmt::Debug for Completer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Completer")
    }
}

/// A block operation a transport must run for a connection.
#[derive(Debug)]
pub struct BlockRequest {
    /// Identifies the command; hand it back in the completion.
    pub cid: u16,
    /// The namespace; the I/O runs through [`Namespace::run`], so it fails
    /// cleanly once the namespace has left service.
    pub namespace: Arc<Namespace>,
    /// What to do.
    pub op: BlockOp,
    /// Its wait under the QoS limiters, until they let it start.
    pub(crate) throttle: Throttle,
    /// The QoS limiters have let it start (the rest of a command that
    /// runs in chunks is not charged again).
    pub(crate) admitted: bool,
}

/// The operations of [`BlockRequest`].
#[derive(Debug)]
pub enum BlockOp {
    /// Read `len` bytes at `offset` into `buf`.
    Read {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: usize,
        /// A buffer to read into, reused from an earlier command (its
        /// contents are overwritten, its allocation kept).
        buf: Vec<u8>,
    },
    /// Write `data` at `offset`, durable on return with `fua`.
    Write {
        /// Byte offset.
        offset: u64,
        /// The data.
        data: Vec<u8>,
        /// Force unit access.
        fua: bool,
    },
    /// Make completed writes durable.
    Flush,
    /// Zero `len` bytes at `offset`; also deallocate with `deallocate`.
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Deallocate the range as well.
        deallocate: bool,
    },
    /// Deallocate (offset, len) byte ranges.
    Deallocate {
        /// The ranges.
        ranges: Vec<(u64, u64)>,
    },
}

/// The result of a [`BlockRequest`].
#[derive(Debug)]
pub struct BlockCompletion {
    /// The request's command identifier.
    pub cid: u16,
    /// The data read, or for a write the buffer written (returned for
    /// reuse; empty for other operations), or the failure.
    pub result: io::Result<Vec<u8>>,
}

impl BlockRequest {
    /// Takes the first `max` bytes of a zeroing or deallocation longer than
    /// that as a request of their own, leaving the rest in `self`; `None`
    /// for other operations and short ones. Lets a transport run a command
    /// over a whole namespace in parts, with other commands between them.
    pub fn take_chunk(&mut self, max: u64) -> Option<BlockRequest> {
        let op = match &mut self.op {
            BlockOp::WriteZeroes {
                offset,
                len,
                deallocate,
            } if *len > max => {
                let first = BlockOp::WriteZeroes {
                    offset: *offset,
                    len: max,
                    deallocate: *deallocate,
                };
                *offset += max;
                *len -= max;
                first
            }
            BlockOp::Deallocate { ranges } if ranges.iter().map(|r| r.1).sum::<u64>() > max => {
                let mut taken = Vec::new();
                let mut room = max;
                while room > 0 {
                    let Some((o, l)) = ranges.first_mut() else {
                        break;
                    };
                    let n = (*l).min(room);
                    taken.push((*o, n));
                    *o += n;
                    *l -= n;
                    room -= n;
                    if *l == 0 {
                        ranges.remove(0);
                    }
                }
                BlockOp::Deallocate { ranges: taken }
            }
            _ => return None,
        };
        Some(BlockRequest {
            cid: self.cid,
            namespace: self.namespace.clone(),
            op,
            throttle: Throttle::default(),
            admitted: true,
        })
    }

    /// What the request counts for under QoS limits.
    pub fn qos_cost(&self) -> Cost {
        match &self.op {
            BlockOp::Read { len, .. } => Cost::Read(*len as u64),
            BlockOp::Write { data, .. } => Cost::Write(data.len() as u64),
            _ => Cost::Other,
        }
    }

    /// The backend operations the request becomes and the bytes of data
    /// they carry, as [`crate::backend::Backend::has_room`] asks.
    pub fn load(&self) -> (usize, u64) {
        match &self.op {
            BlockOp::Read { len, .. } => (1, *len as u64),
            BlockOp::Write { data, .. } => (1, data.len() as u64),
            BlockOp::Flush | BlockOp::WriteZeroes { .. } => (1, 0),
            BlockOp::Deallocate { ranges } => (ranges.len().max(1), 0),
        }
    }

    /// Starts the request on its namespace's backend; `completer` gets
    /// the completion, from whichever thread finishes it (the calling one
    /// too, before this returns, for a backend that is not asynchronous or
    /// a namespace gone). A Dataset Management of several ranges starts
    /// them all and completes once, when the last ends.
    ///
    /// `reserved` is data reserved in a budget for it, given back when it
    /// completes.
    pub(crate) fn start(self, completer: &Completer, reserved: Option<(Arc<SharedBudget>, u64)>) {
        let cid = self.cid;
        let ios: Vec<Io> = match self.op {
            BlockOp::Read {
                offset,
                len,
                mut buf,
            } => {
                sized(&mut buf, len);
                vec![Io::Read { offset, buf }]
            }
            BlockOp::Write { offset, data, fua } => vec![Io::Write { offset, data, fua }],
            BlockOp::Flush => vec![Io::Flush],
            BlockOp::WriteZeroes {
                offset,
                len,
                deallocate: true,
            } => vec![Io::Deallocate { offset, len }],
            BlockOp::WriteZeroes { offset, len, .. } => vec![Io::WriteZeroes { offset, len }],
            BlockOp::Deallocate { ranges } => ranges
                .into_iter()
                .map(|(offset, len)| Io::Deallocate { offset, len })
                .collect(),
        };
        let done = joined(cid, ios.len(), completer.clone(), reserved);
        let mut pending: Vec<(Io, IoDone)> = ios.into_iter().zip(done).collect();
        let started = self.namespace.run(|b| {
            for (io, done) in pending.drain(..) {
                b.start(io, done);
            }
            Ok(())
        });
        if started.is_err() {
            // The namespace left service (run's only refusal): nothing
            // started; the joined completion answers it once.
            let nsid = self.namespace.nsid;
            for (_, done) in pending {
                done(Err(NamespaceRemoved { nsid }.into()));
            }
        }
    }

    /// Runs the request on the calling thread.
    pub fn execute(self) -> BlockCompletion {
        let result = self.namespace.run(|b| match self.op {
            BlockOp::Read {
                offset,
                len,
                mut buf,
            } => {
                sized(&mut buf, len);
                b.read_at(offset, &mut buf).map(|()| buf)
            }
            BlockOp::Write { offset, data, fua } => b.write_at(offset, &data, fua).map(|()| data),
            BlockOp::Flush => b.flush().map(|()| Vec::new()),
            BlockOp::WriteZeroes {
                offset,
                len,
                deallocate,
            } => if deallocate {
                b.deallocate(offset, len)
            } else {
                b.write_zeroes(offset, len)
            }
            .map(|()| Vec::new()),
            BlockOp::Deallocate { ranges } => ranges
                .iter()
                .try_for_each(|&(o, l)| b.deallocate(o, l))
                .map(|()| Vec::new()),
        });
        BlockCompletion {
            cid: self.cid,
            result,
        }
    }
}

/// `n` completion callbacks (at least one) that together complete
/// command `cid` once, when the last has run: with the first failure, or
/// with the buffer of the only operation.
fn joined(
    cid: u16,
    n: usize,
    completer: Completer,
    reserved: Option<(Arc<SharedBudget>, u64)>,
) -> Vec<IoDone> {
    let give_back = move || {
        if let Some((budget, bytes)) = &reserved {
            budget.release(*bytes);
        }
    };
    if n <= 1 {
        return vec![Box::new(move |result| {
            give_back();
            completer.complete(BlockCompletion { cid, result })
        })];
    }
    let give_back = Arc::new(give_back);
    let state = Arc::new(Mutex::new((n, None::<io::Error>)));
    (0..n)
        .map(|_| {
            let (state, completer, give_back) =
                (state.clone(), completer.clone(), give_back.clone());
            Box::new(move |r: io::Result<Vec<u8>>| {
                let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
                s.0 -= 1;
                if let Err(e) = r {
                    s.1.get_or_insert(e);
                }
                if s.0 == 0 {
                    let result = s.1.take().map_or(Ok(Vec::new()), Err);
                    drop(s);
                    give_back();
                    completer.complete(BlockCompletion { cid, result });
                }
            }) as IoDone
        })
        .collect()
}

/// Makes `buf` exactly `len` bytes long, zeroing only bytes it never held.
pub(crate) fn sized(buf: &mut Vec<u8>, len: usize) {
    if buf.len() >= len {
        buf.truncate(len);
    } else {
        buf.resize(len, 0);
    }
}
