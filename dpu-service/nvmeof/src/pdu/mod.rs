//! NVMe/TCP PDU framing (NVMe/TCP Transport Specification 1.0), both
//! directions, sans-IO: decoders that take the bytes received so far and
//! either need more, return one complete PDU borrowing from the buffer, or
//! report a fatal framing error; encoders that append one whole PDU to a
//! `Vec<u8>`.
//!
//! Every PDU starts with the 8-byte common header (CH): PDU type, flags,
//! header length (HLEN), PDU data offset (PDO) and total PDU length (PLEN,
//! little endian). After the HLEN header come, in order: the header digest
//! (CRC32C of the HLEN header bytes, when negotiated), padding up to PDO, the
//! data and the data digest (CRC32C of the data, when negotiated and the PDU
//! has data). ICReq, ICResp and the termination requests never carry digests.
//!
//! # Validation and the errors it reports
//!
//! The decoders check everything the common header says as soon as its 8
//! bytes are in, so that an oversized PDU is refused before it is buffered;
//! the rest (header digest, DATAL, C2HData SUCCESS) once the whole PDU is in.
//! A failure is a [`PduError`] carrying the fatal error status (FES) and
//! fatal error information (FEI) of the termination request to send:
//!
//! | condition | FES | FEI |
//! |---|---|---|
//! | unknown PDU type, or one that does not travel in this direction | [`Fes::InvalidHeaderField`] | 0 |
//! | HDGSTF differs from the negotiated header digest; DDGSTF set without a negotiated data digest; data without DDGSTF although a data digest was negotiated; C2HData SUCCESS without LAST_PDU | [`Fes::InvalidHeaderField`] | 1 |
//! | HLEN wrong for the type | [`Fes::InvalidHeaderField`] | 2 |
//! | PDO outside `hlen + hdgst ..= plen - ddgst` for a PDU with data (0 or `hlen + hdgst` for a command capsule without data) | [`Fes::InvalidHeaderField`] | 3 |
//! | PLEN too small for the header and digests, or not the fixed size of a type without data (termination requests: 24 ..= 152) | [`Fes::InvalidHeaderField`] | 4 |
//! | DATAL of H2CData/C2HData zero or not the length of the data the PDU carries | [`Fes::InvalidHeaderField`] | 16 |
//! | the data of a CapsuleCmd, H2CData or C2HData is longer than [`Limits::max_data`] | [`Fes::DataLimitExceeded`] | 0 |
//! | header digest mismatch | [`Fes::HeaderDigest`] | 0 |
//!
//! A data digest mismatch is not fatal: the PDU is returned with
//! `data_digest_ok: false` and the command fails with a transient transport
//! error. Flags and PDO of PDU types that do not define them (ICReq, ICResp,
//! termination requests; DDGSTF and PDO of CapsuleResp and R2T) are reserved
//! and ignored. Whether a PDU is allowed at this point of the connection
//! (PDU sequence), the ICReq PFV and HPDA, transfer tags and data offsets are
//! the connection's business.

use crate::spec::{Cqe, Sqe, CQE_LEN, SQE_LEN};

mod decode;
mod encode;
#[cfg(test)]
mod tests;

pub use decode::{decode_controller, decode_host};
pub use encode::{
    data_digest, encode_c2h_data, encode_c2h_data_header, encode_c2h_term_req, encode_capsule_cmd,
    encode_capsule_resp, encode_h2c_data, encode_h2c_term_req, encode_ic_req, encode_ic_resp,
    encode_r2t,
};

/// Length of the common header (CH) that starts every PDU.
pub const CH_LEN: usize = 8;
/// Length of a header or data digest (a CRC32C, little endian).
pub const DIGEST_LEN: usize = 4;
/// HLEN (and PLEN) of ICReq and ICResp.
pub const IC_LEN: usize = 128;
/// HLEN of a CapsuleCmd: the CH and a 64-byte SQE.
pub const CAPSULE_CMD_HLEN: usize = CH_LEN + SQE_LEN;
/// HLEN of a CapsuleResp: the CH and a 16-byte CQE.
pub const CAPSULE_RESP_HLEN: usize = CH_LEN + CQE_LEN;
/// HLEN of H2CData and C2HData.
pub const DATA_HLEN: usize = 24;
/// HLEN of R2T.
pub const R2T_HLEN: usize = 24;
/// HLEN of H2CTermReq and C2HTermReq.
pub const TERM_HLEN: usize = 24;
/// Largest PLEN of a termination request (header and echoed PDU header).
pub const MAX_TERM_PLEN: usize = 152;
/// Most bytes of the offending PDU header a termination request echoes.
pub const MAX_TERM_DATA: usize = MAX_TERM_PLEN - TERM_HLEN;

/// PDU types (byte 0 of the common header).
pub mod pdu_type {
    /// Initialize Connection Request (host to controller).
    pub const IC_REQ: u8 = 0x00;
    /// Initialize Connection Response (controller to host).
    pub const IC_RESP: u8 = 0x01;
    /// Host to Controller Terminate Connection Request.
    pub const H2C_TERM_REQ: u8 = 0x02;
    /// Controller to Host Terminate Connection Request.
    pub const C2H_TERM_REQ: u8 = 0x03;
    /// Command Capsule (host to controller).
    pub const CAPSULE_CMD: u8 = 0x04;
    /// Response Capsule (controller to host).
    pub const CAPSULE_RESP: u8 = 0x05;
    /// Host to Controller Data.
    pub const H2C_DATA: u8 = 0x06;
    /// Controller to Host Data.
    pub const C2H_DATA: u8 = 0x07;
    /// Ready to Transfer (controller to host).
    pub const R2T: u8 = 0x09;
}

/// Flag bits (byte 1 of the common header).
pub mod flags {
    /// A header digest follows the header.
    pub const HDGSTF: u8 = 1 << 0;
    /// A data digest follows the data.
    pub const DDGSTF: u8 = 1 << 1;
    /// H2CData/C2HData: the last data PDU of the command's transfer.
    pub const LAST_PDU: u8 = 1 << 2;
    /// C2HData: the command succeeded and no CapsuleResp follows (only with
    /// [`LAST_PDU`]).
    pub const SUCCESS: u8 = 1 << 3;
}

/// Bits of the DGST byte of ICReq and ICResp.
pub mod dgst {
    /// Header digests enabled.
    pub const HDGST_ENABLE: u8 = 1 << 0;
    /// Data digests enabled.
    pub const DDGST_ENABLE: u8 = 1 << 1;
}

/// Which digests a connection uses (or a side asks for).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    /// Header digests (CRC32C of each PDU header).
    pub header: bool,
    /// Data digests (CRC32C of each PDU's data).
    pub data: bool,
}

impl Digests {
    /// Decodes the DGST byte of an ICReq or ICResp (other bits ignored).
    pub fn from_dgst(b: u8) -> Self {
        Self {
            header: b & dgst::HDGST_ENABLE != 0,
            data: b & dgst::DDGST_ENABLE != 0,
        }
    }

    /// The DGST byte of an ICReq or ICResp.
    pub fn to_dgst(self) -> u8 {
        (if self.header { dgst::HDGST_ENABLE } else { 0 })
            | (if self.data { dgst::DDGST_ENABLE } else { 0 })
    }
}

/// Initialize Connection Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    /// PDU format version (0 for NVMe/TCP 1.0).
    pub pfv: u16,
    /// Host PDU data alignment: data in C2H PDUs starts at a multiple of
    /// `(hpda + 1) * 4` bytes (0..=31).
    pub hpda: u8,
    /// Digests the host asks for.
    pub digests: Digests,
    /// Maximum number of outstanding R2Ts per command (0's based).
    pub maxr2t: u32,
}

/// Initialize Connection Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    /// PDU format version (0 for NVMe/TCP 1.0).
    pub pfv: u16,
    /// Controller PDU data alignment: data in H2C PDUs starts at a multiple
    /// of `(cpda + 1) * 4` bytes.
    pub cpda: u8,
    /// Digests the connection uses.
    pub digests: Digests,
    /// Largest data part of an H2CData PDU the controller accepts.
    pub maxh2cdata: u32,
}

/// Fatal error status of a termination request (FES).
#[repr(u16)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fes {
    /// Invalid PDU Header Field; FEI is the byte offset of the field.
    InvalidHeaderField = 1,
    /// PDU Sequence Error.
    PduSequence = 2,
    /// Header Digest Error.
    HeaderDigest = 3,
    /// Data Transfer Out of Range.
    DataOutOfRange = 4,
    /// Data Transfer Limit Exceeded.
    DataLimitExceeded = 5,
    /// Unsupported Parameter; FEI is the byte offset of the parameter.
    UnsupportedParameter = 6,
}

impl Fes {
    /// The 16-bit wire value.
    pub fn code(self) -> u16 {
        self as u16
    }

    /// Parses a wire value; `None` for reserved values.
    pub fn from_code(code: u16) -> Option<Self> {
        Some(match code {
            1 => Self::InvalidHeaderField,
            2 => Self::PduSequence,
            3 => Self::HeaderDigest,
            4 => Self::DataOutOfRange,
            5 => Self::DataLimitExceeded,
            6 => Self::UnsupportedParameter,
            _ => return None,
        })
    }
}

/// Why a byte stream cannot be decoded: fatal for the connection; carries
/// what the C2HTermReq/H2CTermReq needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what} (FES {fes:?}, FEI {fei})")]
pub struct PduError {
    /// Fatal error status.
    pub fes: Fes,
    /// Fatal error information: for [`Fes::InvalidHeaderField`] the byte
    /// offset of the bad field in the PDU, otherwise 0.
    pub fei: u32,
    /// What is wrong, for humans.
    pub what: &'static str,
    /// How many bytes from the front of the decoded buffer (the offending
    /// PDU header, as much of it as had arrived, at most [`MAX_TERM_DATA`])
    /// to echo in the termination request; never more than the buffer held.
    pub header_len: usize,
}

impl PduError {
    fn new(fes: Fes, fei: u32, what: &'static str, buf: &[u8]) -> Self {
        let hlen = buf.get(2).map_or(CH_LEN, |&h| usize::from(h)).max(CH_LEN);
        Self {
            fes,
            fei,
            what,
            header_len: hlen.min(buf.len()).min(MAX_TERM_DATA),
        }
    }

    fn field(fei: u32, what: &'static str, buf: &[u8]) -> Self {
        Self::new(Fes::InvalidHeaderField, fei, what, buf)
    }

    /// The bytes of `buf` (the buffer that was being decoded) to echo in the
    /// termination request.
    pub fn offending<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[..self.header_len.min(buf.len())]
    }
}

/// Limits and negotiated parameters of the receiving side.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Negotiated digests; before the ICReq/ICResp exchange: none.
    pub digests: Digests,
    /// Largest data part accepted in any PDU (in-capsule data or the data of
    /// an H2CData/C2HData PDU).
    pub max_data: u32,
}

/// A PDU a controller receives from a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPdu<'a> {
    /// Initialize Connection Request.
    IcReq(IcReq),
    /// Command capsule.
    CapsuleCmd {
        /// The command.
        sqe: Sqe,
        /// In-capsule data, may be empty.
        data: &'a [u8],
        /// False when the data digest did not match (true without one).
        data_digest_ok: bool,
    },
    /// Host to controller data.
    H2CData {
        /// Command identifier of the command the data belongs to.
        cccid: u16,
        /// Transfer tag of the R2T this answers.
        ttag: u16,
        /// Offset of the data in the command's transfer.
        datao: u32,
        /// The data (DATAL bytes, checked against PLEN).
        data: &'a [u8],
        /// LAST_PDU flag.
        last: bool,
        /// False when the data digest did not match (true without one).
        data_digest_ok: bool,
    },
    /// H2CTermReq: the host ends the connection.
    TermReq {
        /// Fatal error status.
        fes: u16,
        /// Fatal error information.
        fei: u32,
    },
}

/// A PDU a host receives from a controller (for our own initiator: tests and
/// a load generator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerPdu<'a> {
    /// Initialize Connection Response.
    IcResp(IcResp),
    /// Response capsule.
    CapsuleResp {
        /// The completion.
        cqe: Cqe,
    },
    /// Controller to host data.
    C2HData {
        /// Command identifier of the command the data belongs to.
        cccid: u16,
        /// Offset of the data in the command's transfer.
        datao: u32,
        /// The data (DATAL bytes, checked against PLEN).
        data: &'a [u8],
        /// LAST_PDU flag.
        last: bool,
        /// SUCCESS flag: the command succeeded and no CapsuleResp follows.
        success: bool,
        /// False when the data digest did not match (true without one).
        data_digest_ok: bool,
    },
    /// Ready to transfer: the controller asks for data of a command.
    R2T {
        /// Command identifier.
        cccid: u16,
        /// Transfer tag to put in the H2CData PDUs that answer.
        ttag: u16,
        /// Offset of the requested data in the command's transfer.
        r2to: u32,
        /// Length of the requested data.
        r2tl: u32,
    },
    /// C2HTermReq: the controller ends the connection.
    TermReq {
        /// Fatal error status.
        fes: u16,
        /// Fatal error information.
        fei: u32,
    },
}
