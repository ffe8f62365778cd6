//! Operations in flight to a remote namespace, and the commands each is
//! cut into: a transfer longer than the remote takes in one command
//! (MDTS) goes as several, and a range to zero as one Write Zeroes per
//! 65,536 blocks (or as writes of zeros, for a remote without Write
//! Zeroes), made as the queue takes them so that a large range holds no
//! memory.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use crate::backend::{Io, IoDone};
use crate::host::{self, Transfer};
use crate::spec::Sqe;

/// Most blocks of one Write Zeroes (NLB is 16 bits, 0's based).
const MAX_ZERO_BLOCKS: u64 = 1 << 16;

/// How commands for one remote namespace are made.
#[derive(Debug, Clone)]
pub(super) struct Geometry {
    /// The remote namespace's ID.
    pub nsid: u32,
    /// log2 of its LBA size.
    pub block_shift: u32,
    /// Most blocks of one Read or Write.
    pub max_blocks: u64,
    /// The remote has Write Zeroes (ONCS bit 3).
    pub write_zeroes: bool,
    /// `max_blocks` of zeros, the data of emulated Write Zeroes.
    pub zeros: Arc<[u8]>,
}

/// Where a command's data goes when it completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dest {
    /// It is the operation's buffer (a read in one command, or a write's
    /// data handed back).
    Whole,
    /// Into the operation's buffer at this offset (part of a read).
    At(usize),
    /// Nowhere (part of a write, a command without data).
    Nowhere,
}

/// One command ready to submit.
pub(super) struct Command {
    pub sqe: Sqe,
    pub transfer: Transfer,
    pub into: Dest,
}

/// An operation in flight.
pub(super) struct Op {
    pub done: Option<IoDone>,
    /// Bytes counted in flight for it.
    pub bytes: u64,
    /// A read's buffer, filled by its commands; a write's data, handed
    /// back at the end.
    pub buf: Vec<u8>,
    /// Bytes a read must bring.
    pub read_len: Option<usize>,
    /// Commands submitted and not completed.
    pub outstanding: usize,
    /// Commands still to make.
    pub more: bool,
    /// The first failure of one of its commands.
    pub error: Option<io::Error>,
}

impl Op {
    /// True when nothing of it is left in flight or to send.
    pub fn is_over(&self) -> bool {
        self.outstanding == 0 && !self.more
    }

    /// The operation's result, once over.
    pub fn result(&mut self) -> io::Result<Vec<u8>> {
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(std::mem::take(&mut self.buf)),
        }
    }
}

/// The commands of one operation not yet submitted.
pub(super) struct Todo {
    /// The operation's index.
    pub op: usize,
    parts: Parts,
}

enum Parts {
    /// Made already.
    List(VecDeque<Command>),
    /// Blocks to zero, from `slba`, made a command at a time.
    Zeroes {
        slba: u64,
        blocks: u64,
        deallocate: bool,
    },
}

impl Todo {
    /// The next command, if any is left.
    pub fn next(&mut self, g: &Geometry) -> Option<Command> {
        match &mut self.parts {
            Parts::List(l) => l.pop_front(),
            Parts::Zeroes {
                slba,
                blocks,
                deallocate,
            } => {
                if *blocks == 0 {
                    return None;
                }
                let cmd = if g.write_zeroes {
                    let n = (*blocks).min(MAX_ZERO_BLOCKS);
                    let nlb = (n - 1) as u16;
                    (
                        n,
                        host::write_zeroes(g.nsid, *slba, nlb, *deallocate),
                        Transfer::None,
                    )
                } else {
                    let n = (*blocks).min(g.max_blocks);
                    let data = if n == g.max_blocks {
                        g.zeros.clone()
                    } else {
                        Arc::from(vec![0u8; (n << g.block_shift) as usize])
                    };
                    let nlb = (n - 1) as u16;
                    (
                        n,
                        host::write(g.nsid, *slba, nlb),
                        Transfer::WriteShared(data),
                    )
                };
                let (n, sqe, transfer) = cmd;
                *slba += n;
                *blocks -= n;
                Some(Command {
                    sqe,
                    transfer,
                    into: Dest::Nowhere,
                })
            }
        }
    }

    /// True when no command is left to make.
    pub fn is_empty(&self) -> bool {
        match &self.parts {
            Parts::List(l) => l.is_empty(),
            Parts::Zeroes { blocks, .. } => *blocks == 0,
        }
    }
}

/// Cuts `io` into commands: the operation (at index `op`) and what is
/// left to submit. Ranges are whole blocks (checked by the caller).
pub(super) fn plan(io: Io, done: IoDone, bytes: u64, op: usize, g: &Geometry) -> (Op, Todo) {
    let mut new = Op {
        done: Some(done),
        bytes,
        buf: Vec::new(),
        read_len: None,
        outstanding: 0,
        more: true,
        error: None,
    };
    let lba = |offset: u64| offset >> g.block_shift;
    let chunk = (g.max_blocks << g.block_shift) as usize;
    let mut list = VecDeque::new();
    let parts = match io {
        // Nothing to move: done at once.
        Io::Read { buf, .. } if buf.is_empty() => {
            new.buf = buf;
            Parts::List(list)
        }
        Io::Write { data, .. } if data.is_empty() => {
            new.buf = data;
            Parts::List(list)
        }
        Io::Read { offset, buf } => {
            new.read_len = Some(buf.len());
            if buf.len() <= chunk {
                let nlb = ((buf.len() >> g.block_shift) - 1) as u16;
                list.push_back(Command {
                    sqe: host::read(g.nsid, lba(offset), nlb),
                    transfer: Transfer::Read(buf),
                    into: Dest::Whole,
                });
            } else {
                for at in (0..buf.len()).step_by(chunk) {
                    let n = chunk.min(buf.len() - at);
                    let nlb = ((n >> g.block_shift) - 1) as u16;
                    list.push_back(Command {
                        sqe: host::read(g.nsid, lba(offset + at as u64), nlb),
                        transfer: Transfer::Read(vec![0; n]),
                        into: Dest::At(at),
                    });
                }
                new.buf = buf;
            }
            Parts::List(list)
        }
        Io::Write { offset, data, fua } => {
            if data.len() <= chunk {
                let nlb = ((data.len() >> g.block_shift) - 1) as u16;
                list.push_back(Command {
                    sqe: host::write_fua(g.nsid, lba(offset), nlb, fua),
                    transfer: Transfer::Write(data),
                    into: Dest::Whole,
                });
            } else {
                for at in (0..data.len()).step_by(chunk) {
                    let n = chunk.min(data.len() - at);
                    let nlb = ((n >> g.block_shift) - 1) as u16;
                    list.push_back(Command {
                        sqe: host::write_fua(g.nsid, lba(offset + at as u64), nlb, fua),
                        transfer: Transfer::Write(data[at..at + n].to_vec()),
                        into: Dest::Nowhere,
                    });
                }
                new.buf = data;
            }
            Parts::List(list)
        }
        Io::Flush => {
            list.push_back(Command {
                sqe: host::flush(g.nsid),
                transfer: Transfer::None,
                into: Dest::Nowhere,
            });
            Parts::List(list)
        }
        Io::WriteZeroes { offset, len } => Parts::Zeroes {
            slba: lba(offset),
            blocks: len >> g.block_shift,
            deallocate: false,
        },
        // Write Zeroes with DEAC: the remote may deallocate, and the
        // blocks read as zeros whatever its DLFEAT says, as this
        // backend promises.
        Io::Deallocate { offset, len } => Parts::Zeroes {
            slba: lba(offset),
            blocks: len >> g.block_shift,
            deallocate: true,
        },
    };
    let todo = Todo { op, parts };
    new.more = !todo.is_empty();
    (new, todo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::nvm;

    fn geometry(write_zeroes: bool) -> Geometry {
        Geometry {
            nsid: 1,
            block_shift: 9,
            max_blocks: 8,
            write_zeroes,
            zeros: Arc::from(vec![0u8; 8 * 512]),
        }
    }

    fn all(todo: &mut Todo, g: &Geometry) -> Vec<Command> {
        std::iter::from_fn(|| todo.next(g)).collect()
    }

    #[test]
    fn long_transfers_are_cut_at_the_remote_mdts() {
        let g = geometry(true);
        let io = Io::Read {
            offset: 512,
            buf: vec![0; 20 * 512],
        };
        let (op, mut todo) = plan(io, Box::new(|_| {}), 0, 0, &g);
        assert!(op.more && op.buf.len() == 20 * 512);
        let cmds = all(&mut todo, &g);
        let got: Vec<_> = cmds
            .iter()
            .map(|c| (c.sqe.cdw(10), c.sqe.cdw(12) + 1, c.into))
            .collect();
        assert_eq!(
            got,
            [
                (1, 8, Dest::At(0)),
                (9, 8, Dest::At(4096)),
                (17, 4, Dest::At(8192))
            ]
        );
        assert!(todo.is_empty());

        let io = Io::Write {
            offset: 0,
            data: vec![7; 8 * 512],
            fua: true,
        };
        let (op, mut todo) = plan(io, Box::new(|_| {}), 0, 0, &g);
        assert!(op.buf.is_empty(), "one command: the data travels with it");
        let cmds = all(&mut todo, &g);
        assert_eq!(cmds.len(), 1);
        assert_eq!(
            (cmds[0].sqe.cdw(12), cmds[0].into),
            (7 | 1 << 30, Dest::Whole)
        );
    }

    #[test]
    fn zero_ranges_are_made_as_the_queue_takes_them() {
        let g = geometry(true);
        let blocks = 3 * MAX_ZERO_BLOCKS + 5;
        let io = Io::Deallocate {
            offset: 0,
            len: blocks * 512,
        };
        let (_, mut todo) = plan(io, Box::new(|_| {}), 0, 0, &g);
        let cmds = all(&mut todo, &g);
        assert_eq!(cmds.len(), 4);
        assert!(cmds
            .iter()
            .all(|c| c.sqe.opcode() == nvm::WRITE_ZEROES && c.sqe.cdw(12) & 1 << 25 != 0));
        assert_eq!(cmds[3].sqe.cdw(12) & 0xffff, 4);

        // Without Write Zeroes: writes of shared zeros, a short tail.
        let g = geometry(false);
        let io = Io::WriteZeroes {
            offset: 512,
            len: 10 * 512,
        };
        let (_, mut todo) = plan(io, Box::new(|_| {}), 0, 0, &g);
        let cmds = all(&mut todo, &g);
        let lens: Vec<_> = cmds
            .iter()
            .map(|c| match &c.transfer {
                Transfer::WriteShared(d) => d.len(),
                _ => 0,
            })
            .collect();
        assert_eq!(lens, [4096, 1024]);
        assert!(cmds.iter().all(|c| c.sqe.opcode() == nvm::WRITE));
    }
}
