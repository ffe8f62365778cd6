//! Block requests: the I/O a connection hands its transport to run against a
//! namespace's backend ([`BlockRequest`]), and their results
//! ([`BlockCompletion`]).

use std::io;
use std::sync::Arc;

use crate::target::Namespace;

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
        })
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

/// Makes `buf` exactly `len` bytes long, zeroing only bytes it never held.
pub(crate) fn sized(buf: &mut Vec<u8>, len: usize) {
    if buf.len() >= len {
        buf.truncate(len);
    } else {
        buf.resize(len, 0);
    }
}
