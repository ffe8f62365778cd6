//! NVMe wire structures shared by every part of the target: the 64-byte
//! submission queue entry, the 16-byte completion queue entry, opcodes and
//! status codes (NVMe Base Specification 2.0, NVMe over Fabrics 1.1).

use std::fmt;

/// Size of a submission queue entry (a command capsule's SQE).
pub const SQE_LEN: usize = 64;
/// Size of a completion queue entry (a response capsule's CQE).
pub const CQE_LEN: usize = 16;

/// The NQN of the discovery controller.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Admin command opcodes.
pub mod admin {
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0a;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT: u8 = 0x0c;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// NVM command set opcodes.
pub mod nvm {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DSM: u8 = 0x09;
}

/// The Fabrics command opcode (both queues); the command type is in byte 4.
pub const FABRICS: u8 = 0x7f;

/// Fabrics command types (FCTYPE).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Disconnect.
    pub const DISCONNECT: u8 = 0x08;
    /// Authentication Send (host-to-controller data).
    pub const AUTH_SEND: u8 = 0x05;
    /// Authentication Receive (controller-to-host data).
    pub const AUTH_RECEIVE: u8 = 0x06;
}

/// Controller property offsets (the fabrics form of the register map).
pub mod prop {
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version (4 bytes).
    pub const VS: u32 = 0x08;
    /// Controller Configuration (4 bytes).
    pub const CC: u32 = 0x14;
    /// Controller Status (4 bytes).
    pub const CSTS: u32 = 0x1c;
    /// NVM Subsystem Reset (4 bytes).
    pub const NSSR: u32 = 0x20;
}

/// SGL descriptor identifiers (byte 15 of a descriptor) used by NVMe/TCP.
pub mod sgl {
    /// Data Block descriptor, Offset subtype: in-capsule data.
    pub const IN_CAPSULE: u8 = 0x01;
    /// Transport Data Block descriptor, transport-specific subtype: data moved
    /// by H2CData / C2HData PDUs.
    pub const TRANSPORT: u8 = 0x5a;
}

/// A completion status: status code type, status code and Do Not Retry.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status {
    /// Status Code Type (3 bits).
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// Do Not Retry.
    pub dnr: bool,
}

impl Status {
    const fn generic(sc: u8, dnr: bool) -> Self {
        Self { sct: 0, sc, dnr }
    }
    const fn specific(sc: u8) -> Self {
        Self {
            sct: 1,
            sc,
            dnr: true,
        }
    }

    /// Successful completion.
    pub const SUCCESS: Self = Self::generic(0x00, false);
    /// Invalid Command Opcode.
    pub const INVALID_OPCODE: Self = Self::generic(0x01, true);
    /// Invalid Field in Command.
    pub const INVALID_FIELD: Self = Self::generic(0x02, true);
    /// Command ID Conflict.
    pub const CID_CONFLICT: Self = Self::generic(0x03, true);
    /// Data Transfer Error.
    pub const DATA_TRANSFER_ERROR: Self = Self::generic(0x04, false);
    /// Internal Error.
    pub const INTERNAL: Self = Self::generic(0x06, false);
    /// Command Abort Requested.
    pub const ABORT_REQUESTED: Self = Self::generic(0x07, false);
    /// Invalid Namespace or Format.
    pub const INVALID_NS: Self = Self::generic(0x0b, true);
    /// Command Sequence Error.
    pub const COMMAND_SEQUENCE: Self = Self::generic(0x0c, true);
    /// Data SGL Length Invalid.
    pub const SGL_LENGTH_INVALID: Self = Self::generic(0x0f, true);
    /// SGL Descriptor Type Invalid.
    pub const SGL_TYPE_INVALID: Self = Self::generic(0x11, true);
    /// Transient Transport Error.
    pub const TRANSIENT_TRANSPORT: Self = Self::generic(0x22, false);
    /// LBA Out of Range.
    pub const LBA_OUT_OF_RANGE: Self = Self::generic(0x80, true);
    /// Capacity Exceeded.
    pub const CAPACITY_EXCEEDED: Self = Self::generic(0x81, true);
    /// Namespace Not Ready.
    pub const NS_NOT_READY: Self = Self::generic(0x82, false);

    /// Invalid Queue Identifier.
    pub const INVALID_QUEUE_ID: Self = Self::specific(0x01);
    /// Invalid Queue Size.
    pub const INVALID_QUEUE_SIZE: Self = Self::specific(0x02);
    /// Abort Command Limit Exceeded.
    pub const ABORT_LIMIT: Self = Self::specific(0x03);
    /// Asynchronous Event Request Limit Exceeded.
    pub const AER_LIMIT: Self = Self::specific(0x05);
    /// Invalid Log Page.
    pub const INVALID_LOG_PAGE: Self = Self::specific(0x09);
    /// Feature Identifier Not Saveable.
    pub const FEATURE_NOT_SAVEABLE: Self = Self::specific(0x0d);
    /// Feature Not Changeable.
    pub const FEATURE_NOT_CHANGEABLE: Self = Self::specific(0x0e);
    /// Connect: Incompatible Format.
    pub const CONNECT_INCOMPATIBLE_FORMAT: Self = Self::specific(0x80);
    /// Connect: Controller Busy.
    pub const CONNECT_CONTROLLER_BUSY: Self = Self::specific(0x81);
    /// Connect: Invalid Parameters.
    pub const CONNECT_INVALID_PARAMETERS: Self = Self::specific(0x82);
    /// Connect: Invalid Host.
    pub const CONNECT_INVALID_HOST: Self = Self::specific(0x84);
    /// Authentication Required: the queue has not completed in-band
    /// authentication (Fabrics command set specific status 91h).
    pub const AUTH_REQUIRED: Self = Self::specific(0x91);

    /// Media: Write Fault.
    pub const WRITE_FAULT: Self = Self {
        sct: 2,
        sc: 0x80,
        dnr: false,
    };
    /// Media: Unrecovered Read Error.
    pub const UNRECOVERED_READ: Self = Self {
        sct: 2,
        sc: 0x81,
        dnr: false,
    };

    /// True for a successful completion.
    pub fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// The 15-bit status field of a CQE (phase bit clear).
    pub fn to_field(self) -> u16 {
        (u16::from(self.sc) << 1) | (u16::from(self.sct & 7) << 9) | (u16::from(self.dnr) << 15)
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Status(sct={:#x}, sc={:#04x}{})",
            self.sct,
            self.sc,
            if self.dnr { ", dnr" } else { "" }
        )
    }
}

/// A submission queue entry, as received in a command capsule.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_LEN]);

impl Sqe {
    fn u16_at(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.0[at], self.0[at + 1]])
    }
    fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.0[at..at + 4].try_into().expect("4 bytes"))
    }
    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.0[at..at + 8].try_into().expect("8 bytes"))
    }

    /// Opcode.
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    /// Fused operation bits (0 = normal).
    pub fn fuse(&self) -> u8 {
        self.0[1] & 0x3
    }
    /// PRP or SGL for Data Transfer (fabrics require SGLs: 1 or 2).
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }
    /// Command identifier.
    pub fn cid(&self) -> u16 {
        self.u16_at(2)
    }
    /// Namespace ID.
    pub fn nsid(&self) -> u32 {
        self.u32_at(4)
    }
    /// Fabrics command type (meaningful when the opcode is [`FABRICS`]).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }
    /// SGL descriptor 1: address field.
    pub fn sgl_addr(&self) -> u64 {
        self.u64_at(24)
    }
    /// SGL descriptor 1: length field.
    pub fn sgl_len(&self) -> u32 {
        self.u32_at(32)
    }
    /// SGL descriptor 1: identifier (type in the high nibble, subtype low).
    pub fn sgl_id(&self) -> u8 {
        self.0[39]
    }
    /// Command dword `n` (10..=15).
    pub fn cdw(&self, n: usize) -> u32 {
        debug_assert!((2..=15).contains(&n));
        self.u32_at(n * 4)
    }
    /// The starting LBA of an NVM command (CDW10/11).
    pub fn slba(&self) -> u64 {
        self.u64_at(40)
    }
    /// Number of logical blocks of an NVM command, as a count (NLB + 1).
    pub fn nlb(&self) -> u32 {
        u32::from(self.u16_at(48)) + 1
    }
    /// Force Unit Access of a Read or Write.
    pub fn fua(&self) -> bool {
        self.cdw(12) & (1 << 30) != 0
    }
}

impl fmt::Debug for Sqe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sqe")
            .field("opcode", &format_args!("{:#04x}", self.opcode()))
            .field("cid", &self.cid())
            .field("nsid", &self.nsid())
            .field("cdw10", &format_args!("{:#x}", self.cdw(10)))
            .finish()
    }
}

/// A completion queue entry, sent back in a response capsule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    /// Command-specific dword 0.
    pub dw0: u32,
    /// Command-specific dword 1.
    pub dw1: u32,
    /// Submission queue head pointer.
    pub sqhd: u16,
    /// Submission queue the command came from.
    pub sqid: u16,
    /// Command identifier.
    pub cid: u16,
    /// Completion status.
    pub status: u16,
}

impl Cqe {
    /// A completion of command `cid` with `status`.
    pub fn new(cid: u16, status: Status) -> Self {
        Self {
            cid,
            status: status.to_field(),
            ..Self::default()
        }
    }

    /// The 16 wire bytes.
    pub fn to_bytes(&self) -> [u8; CQE_LEN] {
        let mut b = [0u8; CQE_LEN];
        b[0..4].copy_from_slice(&self.dw0.to_le_bytes());
        b[4..8].copy_from_slice(&self.dw1.to_le_bytes());
        b[8..10].copy_from_slice(&self.sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&self.sqid.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&self.status.to_le_bytes());
        b
    }

    /// Parses 16 wire bytes.
    pub fn from_bytes(b: &[u8; CQE_LEN]) -> Self {
        Self {
            dw0: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            dw1: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            sqhd: u16::from_le_bytes([b[8], b[9]]),
            sqid: u16::from_le_bytes([b[10], b[11]]),
            cid: u16::from_le_bytes([b[12], b[13]]),
            status: u16::from_le_bytes([b[14], b[15]]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_field_layout() {
        assert_eq!(Status::SUCCESS.to_field(), 0);
        // SCT 1, SC 0x84, DNR: 0x84<<1 | 1<<9 | 1<<15.
        assert_eq!(
            Status::CONNECT_INVALID_HOST.to_field(),
            0x108 | 0x200 | 0x8000
        );
        assert_eq!(Status::LBA_OUT_OF_RANGE.to_field(), (0x80 << 1) | 0x8000);
    }

    #[test]
    fn sqe_fields() {
        let mut b = [0u8; SQE_LEN];
        b[0] = nvm::WRITE;
        b[1] = 0x40;
        b[2..4].copy_from_slice(&0x1234u16.to_le_bytes());
        b[4..8].copy_from_slice(&7u32.to_le_bytes());
        b[32..36].copy_from_slice(&4096u32.to_le_bytes());
        b[39] = sgl::IN_CAPSULE;
        b[40..48].copy_from_slice(&0x1_0000_0002u64.to_le_bytes());
        b[48..50].copy_from_slice(&7u16.to_le_bytes());
        b[48..52].copy_from_slice(&(7u32 | 1 << 30).to_le_bytes());
        let s = Sqe(b);
        assert_eq!(
            (s.opcode(), s.psdt(), s.cid(), s.nsid()),
            (nvm::WRITE, 1, 0x1234, 7)
        );
        assert_eq!((s.sgl_len(), s.sgl_id()), (4096, sgl::IN_CAPSULE));
        assert_eq!((s.slba(), s.nlb(), s.fua()), (0x1_0000_0002, 8, true));
    }

    #[test]
    fn cqe_round_trip() {
        let c = Cqe {
            dw0: 1,
            dw1: 2,
            sqhd: 3,
            sqid: 4,
            cid: 5,
            status: Status::INVALID_FIELD.to_field(),
        };
        assert_eq!(Cqe::from_bytes(&c.to_bytes()), c);
    }
}
