//! What the connection ([`crate::conn`]) and the admin command set share, so
//! that the connection uses the admin command set and not the other way
//! round: the [`Outcome`] of a command, the limits this target advertises
//! and the command sets it serves.

use super::block::BlockRequest;
use crate::spec::{admin, nvm, Cqe, Sqe, Status};

/// Largest data part of an H2CData PDU we accept (MAXH2CDATA).
pub const MAX_H2C_DATA: u32 = 128 * 1024;
/// Largest in-capsule data of a command capsule.
pub const IN_CAPSULE_DATA: u32 = 8192;
/// Maximum Data Transfer Size as a power of two of 4 KiB pages.
pub const MDTS: u8 = 7;
/// Largest transfer of one command, bytes.
pub const MAX_TRANSFER: u32 = 4096 << MDTS;
/// Version reported in VS and Identify (1.3).
pub const VERSION: u32 = 0x0001_0300;

/// What handling a command produced.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Complete now, with this data for the host (if any).
    Done(Cqe, Option<Vec<u8>>),
    /// Run this block request, complete when it is back.
    Block(BlockRequest, u64),
    /// Completes later (Asynchronous Event Request).
    Parked,
    /// Complete, then close the connection (Disconnect).
    DoneAndClose(Cqe),
}

impl Outcome {
    pub(crate) fn status(sqe: &Sqe, st: Status) -> Self {
        Self::Done(Cqe::new(sqe.cid(), st), None)
    }
    pub(crate) fn ok(sqe: &Sqe) -> Self {
        Self::status(sqe, Status::SUCCESS)
    }
    pub(crate) fn dw0(sqe: &Sqe, dw0: u32) -> Self {
        let mut c = Cqe::new(sqe.cid(), Status::SUCCESS);
        c.dw0 = dw0;
        Self::Done(c, None)
    }
    pub(crate) fn data(sqe: &Sqe, data: Vec<u8>) -> Self {
        Self::Done(Cqe::new(sqe.cid(), Status::SUCCESS), Some(data))
    }
}

/// Admin opcodes of an I/O controller.
pub(crate) const IO_CTRL_ADMIN: &[u8] = &[
    admin::GET_LOG_PAGE,
    admin::IDENTIFY,
    admin::ABORT,
    admin::SET_FEATURES,
    admin::GET_FEATURES,
    admin::ASYNC_EVENT,
    admin::KEEP_ALIVE,
];
/// NVM opcodes served.
pub(crate) const IO_CMDS: &[u8] = &[
    nvm::FLUSH,
    nvm::WRITE,
    nvm::READ,
    nvm::WRITE_ZEROES,
    nvm::DSM,
];
/// NVM opcodes that change logical block content.
pub(crate) const IO_WRITES: &[u8] = &[nvm::WRITE, nvm::WRITE_ZEROES, nvm::DSM];
