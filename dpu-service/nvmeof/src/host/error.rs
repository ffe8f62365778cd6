//! What can go wrong on the host side, split by fault as h2 and rustls do:
//! the byte stream ([`Error::Io`], [`Error::Timeout`], [`Error::Closed`]),
//! a controller that broke the protocol (framing, a PDU out of place, data
//! outside a command's buffer), a command the controller failed
//! ([`Error::Status`]), and the caller's own mistakes (a CID in use).
//!
//! Every error the controller can cause is fatal for the queue: after one,
//! drop the queue (its connection) and open a new one. A command that
//! failed ([`Error::Status`]) and the caller's mistakes leave the queue
//! usable.

use std::io;

use crate::pdu::PduError;
use crate::spec::Status;

/// Why a host queue or controller operation stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The byte stream failed.
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    /// The controller did not answer within the queue's timeout.
    #[error("the controller did not answer in time")]
    Timeout,
    /// The controller closed the connection.
    #[error("the controller closed the connection")]
    Closed,
    /// A PDU from the controller did not decode (framing, header digest,
    /// a PDU longer than the queue accepts); the connection is unusable.
    #[error("bad PDU from the controller: {0}")]
    Pdu(#[from] PduError),
    /// The controller ended the connection with a C2HTermReq.
    #[error("the controller terminated the connection: FES {fes:#x}, FEI {fei:#x}")]
    Terminated {
        /// Fatal error status.
        fes: u16,
        /// Fatal error information.
        fei: u32,
    },
    /// The ICResp asks for something this host does not do.
    #[error("unusable ICResp: {0}")]
    IcResp(&'static str),
    /// A PDU arrived that the controller may not send at this point
    /// (anything before the ICResp, a second ICResp).
    #[error("unexpected {pdu} from the controller")]
    UnexpectedPdu {
        /// The PDU type, for humans.
        pdu: &'static str,
    },
    /// A CapsuleResp, C2HData or R2T names a command that is not in flight.
    #[error("{pdu} for command {cid}, which is not in flight")]
    UnknownCommand {
        /// The CID the controller named.
        cid: u16,
        /// The PDU type, for humans.
        pdu: &'static str,
    },
    /// C2HData for a command that reads nothing, or R2T for one that has
    /// no data to send or sent it in the capsule.
    #[error("{pdu} for command {cid}, which moves no data that way")]
    WrongDirection {
        /// The command.
        cid: u16,
        /// The PDU type, for humans.
        pdu: &'static str,
    },
    /// C2HData or R2T outside the command's data, or R2Ts asking for more
    /// data in all than the command has.
    #[error("{pdu} for command {cid}: {len} bytes at offset {offset}, outside its {size} bytes")]
    DataOutOfRange {
        /// The command.
        cid: u16,
        /// The PDU type, for humans.
        pdu: &'static str,
        /// Offset the controller named.
        offset: u32,
        /// Length the controller named.
        len: u32,
        /// Bytes the command moves.
        size: u32,
    },
    /// The receive buffer is full without a whole PDU in it (cannot happen
    /// with the buffer sized from [`QueueOptions::max_data`](super::QueueOptions)).
    #[error("receive buffer full without a whole PDU")]
    ReceiveBufferFull,
    /// A command failed with this status.
    #[error("command {opcode:#04x} failed: {status:?}")]
    Status {
        /// The command's opcode.
        opcode: u8,
        /// The status the controller returned.
        status: Status,
    },
    /// The controller's data (Identify, a log page, a property) is not
    /// what the specification says it must be.
    #[error("malformed answer from the controller: {0}")]
    Malformed(&'static str),
    /// The controller reported a fatal status (CSTS.CFS).
    #[error("the controller reported a fatal status (CSTS.CFS)")]
    ControllerFatal,
    /// The namespace is not active on the controller (Identify returned
    /// zeroes).
    #[error("namespace {nsid} is not active")]
    InactiveNamespace {
        /// The namespace ID asked for.
        nsid: u32,
    },
    /// The controller requires DH-HMAC-CHAP and the host has no secret.
    #[error("queue {qid}: the controller requires authentication and the host has no secret")]
    AuthRequired {
        /// The queue being connected.
        qid: u16,
    },
    /// DH-HMAC-CHAP failed.
    #[error("queue {qid}: authentication failed: {source}")]
    Auth {
        /// The queue being authenticated.
        qid: u16,
        /// What went wrong.
        source: HostAuthError,
    },
    /// A command was submitted before the ICResp arrived.
    #[error("the queue is not connected yet (no ICResp)")]
    NotReady,
    /// The CID is not below the queue's number of entries.
    #[error("CID {cid} is not below the queue's {entries} entries")]
    CidOutOfRange {
        /// The CID asked for.
        cid: u16,
        /// The queue's entries.
        entries: u16,
    },
    /// The CID is already in flight.
    #[error("CID {cid} is already in flight")]
    CidBusy {
        /// The CID asked for.
        cid: u16,
    },
    /// As many commands are in flight as the queue holds (its entries
    /// less one).
    #[error("the queue is full")]
    QueueFull,
    /// A transfer longer than a command can describe (4 GiB or more).
    #[error("a transfer of {0} bytes is longer than a command can move")]
    TransferTooLong(usize),
}

/// Why the host side of DH-HMAC-CHAP stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostAuthError {
    /// The controller's message did not decode or was not the one
    /// expected.
    #[error("unexpected or malformed message from the controller")]
    Unexpected,
    /// The controller sent AUTH_Failure1.
    #[error("the controller refused: reason {reason:#04x}, explanation {explanation:#04x}")]
    Refused {
        /// Reason code.
        reason: u8,
        /// Reason code explanation.
        explanation: u8,
    },
    /// The challenge names a hash or group not offered, or has the wrong
    /// sizes, or a DH value out of range.
    #[error("unusable challenge")]
    Challenge,
    /// The controller's response was wrong (send
    /// [`DhchapHost::failure2`](super::DhchapHost::failure2)).
    #[error("the controller's response is wrong")]
    ControllerResponse,
    /// The OS random number generator failed.
    #[error("the OS random number generator failed")]
    Random,
}
