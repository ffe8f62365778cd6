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

use std::ops::Range;

use crate::spec::{Cqe, Sqe, CQE_LEN, SQE_LEN};

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

// ---------------------------------------------------------------------------
// Decoding

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// How a PDU type is laid out, for the checks of its common header.
#[derive(Clone, Copy)]
enum Shape {
    /// ICReq / ICResp: exactly 128 bytes, never digests.
    Ic,
    /// Termination request: 24-byte header and the echoed header, no digests.
    Term,
    /// Header only, with a header digest when negotiated (CapsuleResp, R2T).
    Header(usize),
    /// Header and optional data, both digests (CapsuleCmd, H2CData, C2HData).
    Data(usize),
}

/// Where the parts of a PDU are, from its common header.
struct Frame {
    hlen: usize,
    hdgst: bool,
    ddgst: bool,
    data: Range<usize>,
    plen: usize,
}

/// Checks the common header (the first 8 bytes of `buf`) against `shape`
/// and `limits`.
fn frame(buf: &[u8], limits: &Limits, shape: Shape) -> Result<Frame, PduError> {
    let fl = buf[1];
    let hlen = usize::from(buf[2]);
    let pdo = usize::from(buf[3]);
    // Lossless: usize is at least 32 bits on every target this builds for.
    let plen = le32(buf, 4) as usize;
    let field = |fei, what| PduError::field(fei, what, buf);

    let expected = match shape {
        Shape::Ic => IC_LEN,
        Shape::Term => TERM_HLEN,
        Shape::Header(h) | Shape::Data(h) => h,
    };
    if hlen != expected {
        return Err(field(2, "HLEN is wrong for the PDU type"));
    }
    let no_digests = |data: Range<usize>| Frame {
        hlen,
        hdgst: false,
        ddgst: false,
        data,
        plen,
    };
    match shape {
        Shape::Ic => {
            if plen != IC_LEN {
                return Err(field(4, "PLEN of ICReq/ICResp is not 128"));
            }
            Ok(no_digests(hlen..hlen))
        }
        Shape::Term => {
            if !(TERM_HLEN..=MAX_TERM_PLEN).contains(&plen) {
                return Err(field(4, "PLEN of a termination request out of range"));
            }
            Ok(no_digests(hlen..plen))
        }
        Shape::Header(_) => {
            let hdgst = fl & flags::HDGSTF != 0;
            if hdgst != limits.digests.header {
                return Err(field(
                    1,
                    "HDGSTF does not match the negotiated header digest",
                ));
            }
            let end = hlen + if hdgst { DIGEST_LEN } else { 0 };
            if plen != end {
                return Err(field(4, "PLEN is wrong for a PDU without data"));
            }
            Ok(Frame {
                hlen,
                hdgst,
                ddgst: false,
                data: end..end,
                plen,
            })
        }
        Shape::Data(_) => {
            let hdgst = fl & flags::HDGSTF != 0;
            if hdgst != limits.digests.header {
                return Err(field(
                    1,
                    "HDGSTF does not match the negotiated header digest",
                ));
            }
            let ddgst = fl & flags::DDGSTF != 0;
            if ddgst && !limits.digests.data {
                return Err(field(1, "DDGSTF set but no data digest was negotiated"));
            }
            let hdr_end = hlen + if hdgst { DIGEST_LEN } else { 0 };
            let dd = if ddgst { DIGEST_LEN } else { 0 };
            if plen < hdr_end + dd {
                return Err(field(4, "PLEN shorter than the header and digests"));
            }
            if plen == hdr_end {
                // No data at all: PDO is 0 or points at the (empty) data.
                if pdo != 0 && pdo != hdr_end {
                    return Err(field(3, "PDO out of range"));
                }
                return Ok(Frame {
                    hlen,
                    hdgst,
                    ddgst,
                    data: hdr_end..hdr_end,
                    plen,
                });
            }
            if pdo < hdr_end || pdo > plen - dd {
                return Err(field(3, "PDO out of range"));
            }
            if limits.digests.data && !ddgst {
                return Err(field(1, "data without the negotiated data digest"));
            }
            let data = pdo..plen - dd;
            if data.len() > limits.max_data as usize {
                return Err(PduError::new(
                    Fes::DataLimitExceeded,
                    0,
                    "PDU data longer than the limit",
                    buf,
                ));
            }
            Ok(Frame {
                hlen,
                hdgst,
                ddgst,
                data,
                plen,
            })
        }
    }
}

/// A complete, framed PDU: its bytes, where its parts are and whether its
/// data digest matched.
struct Complete<'a> {
    pdu: &'a [u8],
    f: Frame,
    data_digest_ok: bool,
}

impl<'a> Complete<'a> {
    fn data(&self) -> &'a [u8] {
        &self.pdu[self.f.data.clone()]
    }

    fn flag(&self, bit: u8) -> bool {
        self.pdu[1] & bit != 0
    }

    /// Checks DATAL (offset 16) of an H2CData/C2HData against the data.
    fn check_datal(&self) -> Result<(), PduError> {
        let datal = le32(self.pdu, 16) as usize;
        if datal == 0 || datal != self.f.data.len() {
            return Err(PduError::field(
                16,
                "DATAL is zero or not the length of the PDU data",
                self.pdu,
            ));
        }
        Ok(())
    }
}

/// Frames the PDU at the front of `buf` (`buf` holds at least the CH):
/// `None` until all PLEN bytes are in; checks the header digest and computes
/// whether the data digest matches.
fn complete<'a>(
    buf: &'a [u8],
    limits: &Limits,
    shape: Shape,
) -> Result<Option<Complete<'a>>, PduError> {
    let f = frame(buf, limits, shape)?;
    let Some(pdu) = buf.get(..f.plen) else {
        return Ok(None);
    };
    if f.hdgst {
        let got = le32(pdu, f.hlen);
        if crc32c::crc32c(&pdu[..f.hlen]) != got {
            return Err(PduError::new(
                Fes::HeaderDigest,
                0,
                "header digest mismatch",
                pdu,
            ));
        }
    }
    let data_digest_ok =
        !f.ddgst || crc32c::crc32c(&pdu[f.data.clone()]) == le32(pdu, f.plen - DIGEST_LEN);
    Ok(Some(Complete {
        pdu,
        f,
        data_digest_ok,
    }))
}

fn bad_type(buf: &[u8], dir: &'static str) -> PduError {
    PduError::field(0, dir, buf)
}

const NOT_HOST: &str = "PDU type unknown or not sent by a host";
const NOT_CONTROLLER: &str = "PDU type unknown or not sent by a controller";

/// Decodes one host PDU from the front of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed (a PDU whose common header
/// is already invalid or over the limits is refused as soon as its 8 bytes
/// are in), `Ok(Some((pdu, consumed)))` when one is complete. See the module
/// documentation for the checks and the errors they report.
pub fn decode_host<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(HostPdu<'a>, usize)>, PduError> {
    if buf.len() < CH_LEN {
        return Ok(None);
    }
    let ty = buf[0];
    let shape = match ty {
        pdu_type::IC_REQ => Shape::Ic,
        pdu_type::H2C_TERM_REQ => Shape::Term,
        pdu_type::CAPSULE_CMD => Shape::Data(CAPSULE_CMD_HLEN),
        pdu_type::H2C_DATA => Shape::Data(DATA_HLEN),
        _ => return Err(bad_type(buf, NOT_HOST)),
    };
    let Some(c) = complete(buf, limits, shape)? else {
        return Ok(None);
    };
    let p = c.pdu;
    let pdu = match ty {
        pdu_type::IC_REQ => HostPdu::IcReq(IcReq {
            pfv: le16(p, 8),
            hpda: p[10],
            digests: Digests::from_dgst(p[11]),
            maxr2t: le32(p, 12),
        }),
        pdu_type::H2C_TERM_REQ => HostPdu::TermReq {
            fes: le16(p, 8),
            fei: le32(p, 10),
        },
        pdu_type::CAPSULE_CMD => HostPdu::CapsuleCmd {
            sqe: Sqe(array(p, CH_LEN)),
            data: c.data(),
            data_digest_ok: c.data_digest_ok,
        },
        pdu_type::H2C_DATA => {
            c.check_datal()?;
            HostPdu::H2CData {
                cccid: le16(p, 8),
                ttag: le16(p, 10),
                datao: le32(p, 12),
                data: c.data(),
                last: c.flag(flags::LAST_PDU),
                data_digest_ok: c.data_digest_ok,
            }
        }
        _ => return Err(bad_type(buf, NOT_HOST)),
    };
    Ok(Some((pdu, c.f.plen)))
}

/// Decodes one controller PDU from the front of `buf`, like [`decode_host`]
/// in the other direction.
pub fn decode_controller<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(ControllerPdu<'a>, usize)>, PduError> {
    if buf.len() < CH_LEN {
        return Ok(None);
    }
    let ty = buf[0];
    let shape = match ty {
        pdu_type::IC_RESP => Shape::Ic,
        pdu_type::C2H_TERM_REQ => Shape::Term,
        pdu_type::CAPSULE_RESP => Shape::Header(CAPSULE_RESP_HLEN),
        pdu_type::R2T => Shape::Header(R2T_HLEN),
        pdu_type::C2H_DATA => Shape::Data(DATA_HLEN),
        _ => return Err(bad_type(buf, NOT_CONTROLLER)),
    };
    let Some(c) = complete(buf, limits, shape)? else {
        return Ok(None);
    };
    let p = c.pdu;
    let pdu = match ty {
        pdu_type::IC_RESP => ControllerPdu::IcResp(IcResp {
            pfv: le16(p, 8),
            cpda: p[10],
            digests: Digests::from_dgst(p[11]),
            maxh2cdata: le32(p, 12),
        }),
        pdu_type::C2H_TERM_REQ => ControllerPdu::TermReq {
            fes: le16(p, 8),
            fei: le32(p, 10),
        },
        pdu_type::CAPSULE_RESP => ControllerPdu::CapsuleResp {
            cqe: Cqe::from_bytes(&array(p, CH_LEN)),
        },
        pdu_type::R2T => ControllerPdu::R2T {
            cccid: le16(p, 8),
            ttag: le16(p, 10),
            r2to: le32(p, 12),
            r2tl: le32(p, 16),
        },
        pdu_type::C2H_DATA => {
            if c.flag(flags::SUCCESS) && !c.flag(flags::LAST_PDU) {
                return Err(PduError::field(1, "C2HData SUCCESS without LAST_PDU", p));
            }
            c.check_datal()?;
            ControllerPdu::C2HData {
                cccid: le16(p, 8),
                datao: le32(p, 12),
                data: c.data(),
                last: c.flag(flags::LAST_PDU),
                success: c.flag(flags::SUCCESS),
                data_digest_ok: c.data_digest_ok,
            }
        }
        _ => return Err(bad_type(buf, NOT_CONTROLLER)),
    };
    Ok(Some((pdu, c.f.plen)))
}

// ---------------------------------------------------------------------------
// Encoding

/// Appends a PDU: the CH, the PDU-specific header `psh`, the header digest
/// (when `d.header`), `data` at PDO = HLEN + header digest (no padding: the
/// peer's PDA is taken as 0) and its digest (when `d.data` and there is
/// data). Returns the offset of the PDU in `out`.
fn put_pdu(out: &mut Vec<u8>, ty: u8, fl: u8, d: Digests, psh: &[u8], data: &[u8]) -> usize {
    out.reserve(CH_LEN + psh.len() + 2 * DIGEST_LEN + data.len());
    let start = put_header(out, ty, fl, d, psh, data.len());
    out.extend_from_slice(data);
    if d.data && !data.is_empty() {
        out.extend_from_slice(&data_digest(data));
    }
    start
}

/// Appends what [`put_pdu`] puts before the data: the CH (PLEN and PDO
/// counting `data_len` bytes of data and their digest), `psh` and the header
/// digest. Returns the offset of the PDU in `out`.
fn put_header(out: &mut Vec<u8>, ty: u8, fl: u8, d: Digests, psh: &[u8], data_len: usize) -> usize {
    let hlen = CH_LEN + psh.len();
    let hd = if d.header { DIGEST_LEN } else { 0 };
    let dd = if d.data && data_len != 0 {
        DIGEST_LEN
    } else {
        0
    };
    let pdo = if data_len == 0 { 0 } else { hlen + hd };
    let plen = hlen + hd + data_len + dd;
    let plen = u32::try_from(plen).expect("PDU longer than 4 GiB");
    let mut fl = fl;
    if hd != 0 {
        fl |= flags::HDGSTF;
    }
    if dd != 0 {
        fl |= flags::DDGSTF;
    }
    let start = out.len();
    // HLEN is at most 128 and PDO at most 132 here.
    out.extend_from_slice(&[ty, fl, hlen as u8, pdo as u8]);
    out.extend_from_slice(&plen.to_le_bytes());
    out.extend_from_slice(psh);
    if hd != 0 {
        let crc = crc32c::crc32c(&out[start..start + hlen]);
        out.extend_from_slice(&crc.to_le_bytes());
    }
    start
}

/// The data digest of `data` as it goes on the wire: CRC32C, little-endian.
pub fn data_digest(data: &[u8]) -> [u8; 4] {
    crc32c::crc32c(data).to_le_bytes()
}

/// The PDU-specific header of H2CData, C2HData and R2T (16 bytes).
fn xfer_psh(cccid: u16, ttag: u16, offset: u32, len: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..2].copy_from_slice(&cccid.to_le_bytes());
    h[2..4].copy_from_slice(&ttag.to_le_bytes());
    h[4..8].copy_from_slice(&offset.to_le_bytes());
    h[8..12].copy_from_slice(&len.to_le_bytes());
    h
}

fn data_len(data: &[u8]) -> u32 {
    u32::try_from(data.len()).expect("PDU data longer than 4 GiB")
}

fn ic_psh(pfv: u16, pda: u8, d: Digests, max: u32) -> [u8; IC_LEN - CH_LEN] {
    let mut h = [0u8; IC_LEN - CH_LEN];
    h[0..2].copy_from_slice(&pfv.to_le_bytes());
    h[2] = pda;
    h[3] = d.to_dgst();
    h[4..8].copy_from_slice(&max.to_le_bytes());
    h
}

fn term_req(out: &mut Vec<u8>, ty: u8, fes: u16, fei: u32, offending_header: &[u8]) {
    let mut h = [0u8; TERM_HLEN - CH_LEN];
    h[0..2].copy_from_slice(&fes.to_le_bytes());
    h[2..6].copy_from_slice(&fei.to_le_bytes());
    let echo = &offending_header[..offending_header.len().min(MAX_TERM_DATA)];
    let start = put_pdu(out, ty, 0, Digests::default(), &h, echo);
    // PDO is reserved in termination requests.
    out[start + 3] = 0;
}

/// Appends an ICResp (never digests).
pub fn encode_ic_resp(out: &mut Vec<u8>, r: &IcResp) {
    let psh = ic_psh(r.pfv, r.cpda, r.digests, r.maxh2cdata);
    put_pdu(out, pdu_type::IC_RESP, 0, Digests::default(), &psh, &[]);
}

/// Appends a CapsuleResp carrying `cqe`.
pub fn encode_capsule_resp(out: &mut Vec<u8>, d: Digests, cqe: &Cqe) {
    put_pdu(out, pdu_type::CAPSULE_RESP, 0, d, &cqe.to_bytes(), &[]);
}

/// Appends a C2HData PDU with `data` (which must not be empty) at offset
/// `datao` of command `cccid`'s transfer. `success` (no CapsuleResp follows)
/// is only valid with `last`; it sets LAST_PDU too.
///
/// # Panics
///
/// When `data` is 4 GiB or longer.
pub fn encode_c2h_data(
    out: &mut Vec<u8>,
    d: Digests,
    cccid: u16,
    datao: u32,
    data: &[u8],
    last: bool,
    success: bool,
) {
    debug_assert!(!data.is_empty(), "C2HData without data");
    let psh = xfer_psh(cccid, 0, datao, data_len(data));
    put_pdu(
        out,
        pdu_type::C2H_DATA,
        c2h_flags(last, success),
        d,
        &psh,
        data,
    );
}

/// Appends the headers of a C2HData PDU (as [`encode_c2h_data`]) whose
/// `len` bytes of data (`len > 0`) the caller sends right after them from a
/// buffer of its own, e.g. in a vectored write, followed, when `d.data`, by
/// their [`data_digest`]. Headers, data and digest together are byte for
/// byte what [`encode_c2h_data`] appends.
pub fn encode_c2h_data_header(
    out: &mut Vec<u8>,
    d: Digests,
    cccid: u16,
    datao: u32,
    len: u32,
    last: bool,
    success: bool,
) {
    debug_assert!(len != 0, "C2HData without data");
    let psh = xfer_psh(cccid, 0, datao, len);
    put_header(
        out,
        pdu_type::C2H_DATA,
        c2h_flags(last, success),
        d,
        &psh,
        len as usize,
    );
}

/// The flags of a C2HData PDU.
fn c2h_flags(last: bool, success: bool) -> u8 {
    debug_assert!(last || !success, "C2HData SUCCESS without LAST_PDU");
    let mut fl = 0;
    if last || success {
        fl |= flags::LAST_PDU;
    }
    if success {
        fl |= flags::SUCCESS;
    }
    fl
}

/// Appends an R2T asking for `r2tl` bytes at offset `r2to` of command
/// `cccid`'s transfer, to be sent with transfer tag `ttag`.
pub fn encode_r2t(out: &mut Vec<u8>, d: Digests, cccid: u16, ttag: u16, r2to: u32, r2tl: u32) {
    let psh = xfer_psh(cccid, ttag, r2to, r2tl);
    put_pdu(out, pdu_type::R2T, 0, d, &psh, &[]);
}

/// Appends a C2HTermReq (never digests) echoing `offending_header`,
/// truncated to [`MAX_TERM_DATA`] bytes so that PLEN stays within
/// [`MAX_TERM_PLEN`].
pub fn encode_c2h_term_req(out: &mut Vec<u8>, fes: u16, fei: u32, offending_header: &[u8]) {
    term_req(out, pdu_type::C2H_TERM_REQ, fes, fei, offending_header);
}

/// Appends an ICReq (never digests).
pub fn encode_ic_req(out: &mut Vec<u8>, r: &IcReq) {
    let psh = ic_psh(r.pfv, r.hpda, r.digests, r.maxr2t);
    put_pdu(out, pdu_type::IC_REQ, 0, Digests::default(), &psh, &[]);
}

/// Appends a CapsuleCmd carrying `sqe` and `in_capsule_data` (may be empty:
/// then PDO is 0 and there is no data digest).
///
/// # Panics
///
/// When the data is 4 GiB or longer.
pub fn encode_capsule_cmd(out: &mut Vec<u8>, d: Digests, sqe: &Sqe, in_capsule_data: &[u8]) {
    put_pdu(out, pdu_type::CAPSULE_CMD, 0, d, &sqe.0, in_capsule_data);
}

/// Appends an H2CData PDU with `data` (which must not be empty) at offset
/// `datao` of command `cccid`'s transfer, answering the R2T with `ttag`.
///
/// # Panics
///
/// When `data` is 4 GiB or longer.
pub fn encode_h2c_data(
    out: &mut Vec<u8>,
    d: Digests,
    cccid: u16,
    ttag: u16,
    datao: u32,
    data: &[u8],
    last: bool,
) {
    debug_assert!(!data.is_empty(), "H2CData without data");
    let fl = if last { flags::LAST_PDU } else { 0 };
    let psh = xfer_psh(cccid, ttag, datao, data_len(data));
    put_pdu(out, pdu_type::H2C_DATA, fl, d, &psh, data);
}

/// Appends an H2CTermReq (never digests) echoing `offending_header`,
/// truncated to [`MAX_TERM_DATA`] bytes.
pub fn encode_h2c_term_req(out: &mut Vec<u8>, fes: u16, fei: u32, offending_header: &[u8]) {
    term_req(out, pdu_type::H2C_TERM_REQ, fes, fei, offending_header);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bitwise CRC32C (Castagnoli, reflected), independent of the crate.
    fn crc_ref(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    const ALL: [Digests; 4] = [
        Digests {
            header: false,
            data: false,
        },
        Digests {
            header: true,
            data: false,
        },
        Digests {
            header: false,
            data: true,
        },
        Digests {
            header: true,
            data: true,
        },
    ];

    const NONE: Digests = Digests {
        header: false,
        data: false,
    };
    const BOTH: Digests = Digests {
        header: true,
        data: true,
    };

    fn lim(digests: Digests) -> Limits {
        Limits {
            digests,
            max_data: 1 << 20,
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn sqe(cid: u16) -> Sqe {
        let mut b = [0u8; SQE_LEN];
        for (i, x) in b.iter_mut().enumerate() {
            *x = i as u8 ^ 0xa5;
        }
        b[0] = crate::spec::nvm::WRITE;
        b[2..4].copy_from_slice(&cid.to_le_bytes());
        Sqe(b)
    }

    fn host<'a>(buf: &'a [u8], l: &Limits) -> HostPdu<'a> {
        let (p, n) = decode_host(buf, l).expect("decodes").expect("complete");
        assert_eq!(n, buf.len());
        p
    }

    fn ctrl<'a>(buf: &'a [u8], l: &Limits) -> ControllerPdu<'a> {
        let (p, n) = decode_controller(buf, l)
            .expect("decodes")
            .expect("complete");
        assert_eq!(n, buf.len());
        p
    }

    fn host_err(buf: &[u8], l: &Limits) -> (Fes, u32) {
        let e = decode_host(buf, l).expect_err("must fail");
        assert!(e.header_len <= buf.len());
        (e.fes, e.fei)
    }

    fn ctrl_err(buf: &[u8], l: &Limits) -> (Fes, u32) {
        let e = decode_controller(buf, l).expect_err("must fail");
        assert!(e.header_len <= buf.len());
        (e.fes, e.fei)
    }

    /// Recomputes the header digest of a single PDU built with `HDGSTF`.
    fn fix_hdgst(buf: &mut [u8]) {
        let hlen = usize::from(buf[2]);
        let crc = crc_ref(&buf[..hlen]);
        buf[hlen..hlen + 4].copy_from_slice(&crc.to_le_bytes());
    }

    fn set_plen(buf: &mut [u8], plen: u32) {
        buf[4..8].copy_from_slice(&plen.to_le_bytes());
    }

    const IHF: Fes = Fes::InvalidHeaderField;

    #[test]
    fn crc32c_known_vector() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc_ref(b"123456789"), 0xE306_9283);
        let v = pattern(1000, 7);
        assert_eq!(crc32c::crc32c(&v), crc_ref(&v));
    }

    #[test]
    fn fes_codes() {
        for c in 0..10u16 {
            if let Some(f) = Fes::from_code(c) {
                assert_eq!(f.code(), c);
            } else {
                assert!(c == 0 || c > 6);
            }
        }
        assert_eq!(Fes::DataLimitExceeded as u16, 5);
    }

    #[test]
    fn digests_dgst_byte() {
        for d in ALL {
            assert_eq!(Digests::from_dgst(d.to_dgst()), d);
        }
        assert_eq!(BOTH.to_dgst(), 3);
        assert_eq!(Digests::from_dgst(0xfc), NONE);
    }

    #[test]
    fn host_round_trips() {
        for d in ALL {
            let l = lim(d);
            let mut b = Vec::new();
            let r = IcReq {
                pfv: 0,
                hpda: 3,
                digests: d,
                maxr2t: 7,
            };
            encode_ic_req(&mut b, &r);
            assert_eq!(b.len(), IC_LEN);
            assert_eq!(host(&b, &l), HostPdu::IcReq(r));

            for len in [0usize, 1, 5, 4096] {
                let data = pattern(len, 1);
                let mut b = Vec::new();
                encode_capsule_cmd(&mut b, d, &sqe(9), &data);
                let hd = if d.header { 4 } else { 0 };
                let dd = if d.data && len > 0 { 4 } else { 0 };
                assert_eq!(b.len(), 72 + hd + len + dd);
                assert_eq!(
                    host(&b, &l),
                    HostPdu::CapsuleCmd {
                        sqe: sqe(9),
                        data: &data,
                        data_digest_ok: true
                    }
                );
            }

            for last in [false, true] {
                let data = pattern(512, 2);
                let mut b = Vec::new();
                encode_h2c_data(&mut b, d, 5, 6, 4096, &data, last);
                assert_eq!(
                    host(&b, &l),
                    HostPdu::H2CData {
                        cccid: 5,
                        ttag: 6,
                        datao: 4096,
                        data: &data,
                        last,
                        data_digest_ok: true
                    }
                );
            }

            let mut b = Vec::new();
            encode_h2c_term_req(&mut b, 3, 0x1234_5678, &pattern(72, 3));
            assert_eq!(b.len(), 24 + 72);
            assert_eq!(
                host(&b, &l),
                HostPdu::TermReq {
                    fes: 3,
                    fei: 0x1234_5678
                }
            );
        }
    }

    #[test]
    fn controller_round_trips() {
        for d in ALL {
            let l = lim(d);
            let mut b = Vec::new();
            let r = IcResp {
                pfv: 0,
                cpda: 0,
                digests: d,
                maxh2cdata: 131072,
            };
            encode_ic_resp(&mut b, &r);
            assert_eq!(ctrl(&b, &l), ControllerPdu::IcResp(r));

            let cqe = Cqe {
                dw0: 1,
                dw1: 2,
                sqhd: 3,
                sqid: 4,
                cid: 5,
                status: 6,
            };
            let mut b = Vec::new();
            encode_capsule_resp(&mut b, d, &cqe);
            assert_eq!(b.len(), 24 + if d.header { 4 } else { 0 });
            assert_eq!(ctrl(&b, &l), ControllerPdu::CapsuleResp { cqe });

            for (last, success) in [(false, false), (true, false), (true, true)] {
                let data = pattern(3000, 4);
                let mut b = Vec::new();
                encode_c2h_data(&mut b, d, 77, 8192, &data, last, success);
                assert_eq!(
                    ctrl(&b, &l),
                    ControllerPdu::C2HData {
                        cccid: 77,
                        datao: 8192,
                        data: &data,
                        last,
                        success,
                        data_digest_ok: true
                    }
                );
            }

            let mut b = Vec::new();
            encode_r2t(&mut b, d, 1, 2, 3, 4);
            assert_eq!(
                ctrl(&b, &l),
                ControllerPdu::R2T {
                    cccid: 1,
                    ttag: 2,
                    r2to: 3,
                    r2tl: 4
                }
            );

            let mut b = Vec::new();
            encode_c2h_term_req(&mut b, 1, 4, &pattern(28, 5));
            assert_eq!(ctrl(&b, &l), ControllerPdu::TermReq { fes: 1, fei: 4 });
        }
    }

    #[test]
    fn exact_ic_resp() {
        let mut b = Vec::new();
        encode_ic_resp(
            &mut b,
            &IcResp {
                pfv: 0,
                cpda: 0,
                digests: BOTH,
                maxh2cdata: 0x0002_0000,
            },
        );
        let mut want = vec![0u8; 128];
        want[..16].copy_from_slice(&[
            0x01, 0x00, 0x80, 0x00, 0x80, 0x00, 0x00, 0x00, // CH
            0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x02, 0x00, // pfv cpda dgst maxh2cdata
        ]);
        assert_eq!(b, want);
    }

    #[test]
    fn exact_ic_req() {
        let mut b = Vec::new();
        encode_ic_req(
            &mut b,
            &IcReq {
                pfv: 0,
                hpda: 0,
                digests: Digests {
                    header: true,
                    data: false,
                },
                maxr2t: 0,
            },
        );
        let mut want = vec![0u8; 128];
        want[..12].copy_from_slice(&[0, 0, 128, 0, 128, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(b, want);
    }

    #[test]
    fn exact_capsule_resp() {
        let cqe = Cqe {
            dw0: 0x0403_0201,
            dw1: 0,
            sqhd: 0x0605,
            sqid: 1,
            cid: 0xbeef,
            status: 0x8004,
        };
        let body = [
            0x01, 0x02, 0x03, 0x04, 0, 0, 0, 0, 0x05, 0x06, 0x01, 0x00, 0xef, 0xbe, 0x04, 0x80,
        ];
        let mut b = Vec::new();
        encode_capsule_resp(&mut b, NONE, &cqe);
        let mut want = vec![0x05, 0x00, 24, 0, 24, 0, 0, 0];
        want.extend_from_slice(&body);
        assert_eq!(b, want);

        let mut b = Vec::new();
        encode_capsule_resp(&mut b, BOTH, &cqe);
        let mut want = vec![0x05, 0x01, 24, 0, 28, 0, 0, 0];
        want.extend_from_slice(&body);
        let h = crc_ref(&want);
        want.extend_from_slice(&h.to_le_bytes());
        assert_eq!(b, want);
    }

    /// Headers, data and digest put side by side (a vectored write) are
    /// the PDU `encode_c2h_data` makes, for every digest setting and flag.
    #[test]
    fn c2h_data_header_then_data_is_the_whole_pdu() {
        let data: Vec<u8> = (0..70_001u32).map(|i| (i * 7 + 3) as u8).collect();
        for d in ALL {
            for (last, success) in [(false, false), (true, false), (true, true)] {
                let mut whole = vec![0xEE; 3];
                encode_c2h_data(&mut whole, d, 9, 4096, &data, last, success);
                let mut parts = vec![0xEE; 3];
                encode_c2h_data_header(&mut parts, d, 9, 4096, data.len() as u32, last, success);
                parts.extend_from_slice(&data);
                if d.data {
                    parts.extend_from_slice(&data_digest(&data));
                }
                assert_eq!(parts, whole, "{d:?} last {last} success {success}");
            }
        }
    }

    #[test]
    fn exact_c2h_data() {
        let mut b = Vec::new();
        encode_c2h_data(&mut b, BOTH, 0x1234, 0x10, b"123456789", true, true);
        let mut want = vec![
            0x07, 0x0f, 24, 28, 41, 0, 0,
            0, // CH: HDGSTF|DDGSTF|LAST|SUCCESS, pdo 28, plen 41
            0x34, 0x12, 0, 0, // cccid, ttag (reserved)
            0x10, 0, 0, 0, // datao
            9, 0, 0, 0, // datal
            0, 0, 0, 0, // reserved
        ];
        let h = crc_ref(&want);
        want.extend_from_slice(&h.to_le_bytes());
        want.extend_from_slice(b"123456789");
        want.extend_from_slice(&[0x83, 0x92, 0x06, 0xE3]);
        assert_eq!(b, want);

        let mut b = Vec::new();
        encode_c2h_data(&mut b, NONE, 1, 0, b"ab", false, false);
        assert_eq!(
            b,
            [
                7, 0, 24, 24, 26, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, b'a',
                b'b'
            ]
        );
    }

    #[test]
    fn exact_capsule_cmd_and_r2t() {
        let s = sqe(3);
        let mut b = Vec::new();
        encode_capsule_cmd(
            &mut b,
            Digests {
                header: false,
                data: true,
            },
            &s,
            b"123456789",
        );
        let mut want = vec![4, 0x02, 72, 72, 85, 0, 0, 0];
        want.extend_from_slice(&s.0);
        want.extend_from_slice(b"123456789");
        want.extend_from_slice(&0xE306_9283u32.to_le_bytes());
        assert_eq!(b, want);

        // Without data: PDO 0, no data digest even when negotiated.
        let mut b = Vec::new();
        encode_capsule_cmd(&mut b, BOTH, &s, &[]);
        let mut want = vec![4, 0x01, 72, 0, 76, 0, 0, 0];
        want.extend_from_slice(&s.0);
        let h = crc_ref(&want);
        want.extend_from_slice(&h.to_le_bytes());
        assert_eq!(b, want);

        let mut b = Vec::new();
        encode_r2t(&mut b, NONE, 0x0102, 0x0304, 0x1000, 0x2000);
        assert_eq!(
            b,
            [9, 0, 24, 0, 24, 0, 0, 0, 2, 1, 4, 3, 0, 0x10, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn term_req_truncates_and_has_no_digests() {
        let mut b = Vec::new();
        encode_c2h_term_req(&mut b, 1, 2, &[0xaa; 200]);
        assert_eq!(b.len(), MAX_TERM_PLEN);
        assert_eq!(&b[..8], &[3, 0, 24, 0, 152, 0, 0, 0]);
        assert_eq!(&b[8..14], &[1, 0, 2, 0, 0, 0]);
        assert!(b[24..].iter().all(|&x| x == 0xaa));
        // Termination requests never carry digests, whatever was negotiated.
        assert_eq!(
            ctrl(&b, &lim(BOTH)),
            ControllerPdu::TermReq { fes: 1, fei: 2 }
        );

        let mut b = Vec::new();
        encode_h2c_term_req(&mut b, 2, 0, &[]);
        assert_eq!(b.len(), 24);
        assert_eq!(host(&b, &lim(BOTH)), HostPdu::TermReq { fes: 2, fei: 0 });
    }

    /// Host PDUs of every kind, each encoded with `d`.
    fn host_samples(d: Digests) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        let mut b = Vec::new();
        encode_ic_req(
            &mut b,
            &IcReq {
                pfv: 0,
                hpda: 0,
                digests: d,
                maxr2t: 0,
            },
        );
        v.push(b);
        for len in [0, 100] {
            let mut b = Vec::new();
            encode_capsule_cmd(&mut b, d, &sqe(1), &pattern(len, 9));
            v.push(b);
        }
        let mut b = Vec::new();
        encode_h2c_data(&mut b, d, 1, 1, 0, &pattern(64, 8), true);
        v.push(b);
        let mut b = Vec::new();
        encode_h2c_term_req(&mut b, 1, 2, &pattern(30, 1));
        v.push(b);
        v
    }

    /// Controller PDUs of every kind, each encoded with `d`.
    fn controller_samples(d: Digests) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        let mut b = Vec::new();
        encode_ic_resp(
            &mut b,
            &IcResp {
                pfv: 0,
                cpda: 0,
                digests: d,
                maxh2cdata: 4096,
            },
        );
        v.push(b);
        let mut b = Vec::new();
        encode_capsule_resp(&mut b, d, &Cqe::default());
        v.push(b);
        let mut b = Vec::new();
        encode_c2h_data(&mut b, d, 1, 0, &pattern(77, 3), true, false);
        v.push(b);
        let mut b = Vec::new();
        encode_r2t(&mut b, d, 1, 2, 0, 4096);
        v.push(b);
        let mut b = Vec::new();
        encode_c2h_term_req(&mut b, 1, 2, &pattern(24, 2));
        v.push(b);
        v
    }

    #[test]
    fn partial_input_needs_more_at_every_split() {
        for d in ALL {
            let l = lim(d);
            for pdu in host_samples(d) {
                for k in 0..pdu.len() {
                    assert_eq!(decode_host(&pdu[..k], &l), Ok(None), "split {k}");
                }
                assert!(decode_host(&pdu, &l).expect("ok").is_some());
            }
            for pdu in controller_samples(d) {
                for k in 0..pdu.len() {
                    assert_eq!(decode_controller(&pdu[..k], &l), Ok(None), "split {k}");
                }
                assert!(decode_controller(&pdu, &l).expect("ok").is_some());
            }
        }
    }

    #[test]
    fn streams_of_pdus_decode_one_by_one() {
        for d in ALL {
            let l = lim(d);
            let samples = host_samples(d);
            let stream: Vec<u8> = samples.concat();
            let mut at = 0;
            for s in &samples {
                let (_, n) = decode_host(&stream[at..], &l).expect("ok").expect("some");
                assert_eq!(n, s.len());
                at += n;
            }
            assert_eq!(at, stream.len());

            let samples = controller_samples(d);
            let stream: Vec<u8> = samples.concat();
            let mut at = 0;
            for s in &samples {
                let (_, n) = decode_controller(&stream[at..], &l)
                    .expect("ok")
                    .expect("some");
                assert_eq!(n, s.len());
                at += n;
            }
            assert_eq!(at, stream.len());
        }
    }

    #[test]
    fn wrong_type_or_direction_is_offset_0() {
        let l = lim(NONE);
        let mut buf = vec![0u8; 200];
        for ty in [1u8, 3, 5, 7, 8, 9, 10, 0x7f, 0xff] {
            buf[0] = ty;
            assert_eq!(host_err(&buf, &l), (IHF, 0), "type {ty}");
            // Refused as soon as the CH is in.
            assert_eq!(host_err(&buf[..8], &l), (IHF, 0));
        }
        for ty in [0u8, 2, 4, 6, 8, 10, 0xff] {
            buf[0] = ty;
            assert_eq!(ctrl_err(&buf, &l), (IHF, 0), "type {ty}");
        }
        // Real PDUs sent the wrong way.
        for pdu in controller_samples(NONE) {
            assert_eq!(host_err(&pdu, &l), (IHF, 0));
        }
        for pdu in host_samples(NONE) {
            assert_eq!(ctrl_err(&pdu, &l), (IHF, 0));
        }
    }

    #[test]
    fn wrong_hlen_is_offset_2() {
        for d in ALL {
            let l = lim(d);
            for mut pdu in host_samples(d) {
                for h in [0u8, 8, pdu[2] - 1, pdu[2] + 1, 255] {
                    pdu[2] = h;
                    assert_eq!(host_err(&pdu[..8], &l), (IHF, 2));
                }
            }
            for mut pdu in controller_samples(d) {
                pdu[2] = pdu[2].wrapping_add(4);
                assert_eq!(ctrl_err(&pdu, &l), (IHF, 2));
            }
        }
    }

    #[test]
    fn digest_flags_must_match_negotiation() {
        let hd = Digests {
            header: true,
            data: false,
        };
        let dd = Digests {
            header: false,
            data: true,
        };
        let data = pattern(100, 0);
        // Header digest present but not negotiated, and the other way round.
        let mut b = Vec::new();
        encode_capsule_cmd(&mut b, hd, &sqe(1), &[]);
        assert_eq!(host_err(&b, &lim(NONE)), (IHF, 1));
        let mut b = Vec::new();
        encode_capsule_cmd(&mut b, NONE, &sqe(1), &[]);
        assert_eq!(host_err(&b, &lim(hd)), (IHF, 1));
        for p in controller_samples(hd).into_iter().skip(1).take(3) {
            assert_eq!(ctrl_err(&p[..8], &lim(NONE)), (IHF, 1));
        }
        for p in controller_samples(NONE).into_iter().skip(1).take(3) {
            assert_eq!(ctrl_err(&p, &lim(hd)), (IHF, 1));
        }
        // Data digest present but not negotiated.
        let mut b = Vec::new();
        encode_h2c_data(&mut b, dd, 1, 1, 0, &data, true);
        assert_eq!(host_err(&b, &lim(NONE)), (IHF, 1));
        let mut b = Vec::new();
        encode_c2h_data(&mut b, dd, 1, 0, &data, true, false);
        assert_eq!(ctrl_err(&b, &lim(NONE)), (IHF, 1));
        // Data without the negotiated data digest.
        let mut b = Vec::new();
        encode_capsule_cmd(&mut b, NONE, &sqe(1), &data);
        assert_eq!(host_err(&b[..8], &lim(dd)), (IHF, 1));
        // ... but a capsule without data needs none.
        let mut b = Vec::new();
        encode_capsule_cmd(&mut b, NONE, &sqe(1), &[]);
        assert!(matches!(host(&b, &lim(dd)), HostPdu::CapsuleCmd { .. }));
        // Digest flags are reserved in ICReq/ICResp/TermReq and CapsuleResp/R2T
        // have no data: flags there are ignored.
        for mut p in host_samples(NONE) {
            if p[0] == pdu_type::IC_REQ || p[0] == pdu_type::H2C_TERM_REQ {
                p[1] = 0xff;
                assert!(decode_host(&p, &lim(BOTH)).expect("ok").is_some());
            }
        }
        let mut b = Vec::new();
        encode_r2t(&mut b, NONE, 1, 1, 0, 1);
        b[1] |= flags::DDGSTF;
        assert!(decode_controller(&b, &lim(dd)).expect("ok").is_some());
    }

    #[test]
    fn success_without_last_is_offset_1() {
        let mut b = Vec::new();
        encode_c2h_data(&mut b, NONE, 1, 0, b"x", false, false);
        b[1] |= flags::SUCCESS;
        assert_eq!(ctrl_err(&b, &lim(NONE)), (IHF, 1));
    }

    #[test]
    fn bad_plen_is_offset_4() {
        let l = lim(NONE);
        let hl = lim(Digests {
            header: true,
            data: false,
        });
        // Fixed-size types.
        let mut b = host_samples(NONE).remove(0);
        for plen in [0, 127, 129, u32::MAX] {
            set_plen(&mut b, plen);
            assert_eq!(host_err(&b[..8], &l), (IHF, 4));
        }
        for (i, mut p) in controller_samples(NONE).into_iter().enumerate() {
            if i == 2 {
                continue; // C2HData has data
            }
            set_plen(&mut p, 10_000);
            assert_eq!(ctrl_err(&p[..8], &l), (IHF, 4), "sample {i}");
        }
        let mut b = Vec::new();
        encode_capsule_resp(&mut b, hl.digests, &Cqe::default());
        set_plen(&mut b, 24);
        assert_eq!(ctrl_err(&b, &hl), (IHF, 4));
        // Termination requests: 24 ..= 152.
        let mut b = Vec::new();
        encode_h2c_term_req(&mut b, 1, 0, &[0; 128]);
        assert!(decode_host(&b, &l).expect("ok").is_some());
        for plen in [23, 153, 1 << 30] {
            set_plen(&mut b, plen);
            assert_eq!(host_err(&b[..8], &l), (IHF, 4));
        }
        // Shorter than the header (plus digests).
        let mut b = Vec::new();
        encode_capsule_cmd(&mut b, NONE, &sqe(1), &[]);
        set_plen(&mut b, 71);
        assert_eq!(host_err(&b, &l), (IHF, 4));
        let mut b = Vec::new();
        encode_capsule_cmd(&mut b, hl.digests, &sqe(1), &[]);
        set_plen(&mut b, 72);
        assert_eq!(host_err(&b, &hl), (IHF, 4));
        let mut b = Vec::new();
        encode_h2c_data(&mut b, BOTH, 1, 1, 0, b"z", true);
        b[3] = 28;
        set_plen(&mut b, 24 + 4 + 3);
        assert_eq!(host_err(&b[..8], &lim(BOTH)), (IHF, 4));
    }

    #[test]
    fn data_over_limit_is_refused_from_the_common_header() {
        let l = Limits {
            digests: NONE,
            max_data: 4096,
        };
        // A 1 GiB H2CData is refused with only its CH in.
        let ch = [pdu_type::H2C_DATA, 0, 24, 24, 0, 0, 0, 0x40];
        let e = decode_host(&ch, &l).expect_err("refused");
        assert_eq!((e.fes, e.fei, e.header_len), (Fes::DataLimitExceeded, 0, 8));
        let ch = [pdu_type::C2H_DATA, 0, 24, 24, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(ctrl_err(&ch, &l), (Fes::DataLimitExceeded, 0));
        // The limit itself is fine, one byte more is not.
        for d in ALL {
            let l = Limits {
                digests: d,
                max_data: 4096,
            };
            let mut b = Vec::new();
            encode_capsule_cmd(&mut b, d, &sqe(1), &[7; 4096]);
            assert!(decode_host(&b, &l).expect("ok").is_some());
            let mut b = Vec::new();
            encode_capsule_cmd(&mut b, d, &sqe(1), &[7; 4097]);
            assert_eq!(host_err(&b[..8], &l), (Fes::DataLimitExceeded, 0));
            let mut b = Vec::new();
            encode_h2c_data(&mut b, d, 1, 1, 0, &[7; 4097], false);
            assert_eq!(host_err(&b[..8], &l), (Fes::DataLimitExceeded, 0));
            let mut b = Vec::new();
            encode_c2h_data(&mut b, d, 1, 0, &[7; 4097], false, false);
            assert_eq!(ctrl_err(&b[..8], &l), (Fes::DataLimitExceeded, 0));
        }
    }

    #[test]
    fn bad_pdo_is_offset_3() {
        let l = lim(NONE);
        let data = pattern(16, 1);
        let mut b = Vec::new();
        encode_capsule_cmd(&mut b, NONE, &sqe(1), &data);
        for pdo in [0u8, 8, 71, 89, 255] {
            b[3] = pdo;
            assert_eq!(host_err(&b[..8], &l), (IHF, 3), "pdo {pdo}");
        }
        // PDO may point anywhere from the end of the header to PLEN.
        b[3] = 88;
        assert!(matches!(
            host(&b, &l),
            HostPdu::CapsuleCmd { data: &[], .. }
        ));
        // With a data digest the data ends 4 bytes before PLEN.
        let dl = lim(Digests {
            header: false,
            data: true,
        });
        let mut b = Vec::new();
        encode_h2c_data(&mut b, dl.digests, 1, 1, 0, &data, true);
        b[3] = b.len() as u8 - 3;
        assert_eq!(host_err(&b, &dl), (IHF, 3));
        // With a header digest the data starts after it.
        let hl = lim(Digests {
            header: true,
            data: false,
        });
        let mut b = Vec::new();
        encode_c2h_data(&mut b, hl.digests, 1, 0, &data, true, false);
        b[3] = 24;
        assert_eq!(ctrl_err(&b, &hl), (IHF, 3));
        // A capsule without data: PDO 0 or the end of the header.
        let mut b = Vec::new();
        encode_capsule_cmd(&mut b, NONE, &sqe(1), &[]);
        b[3] = 72;
        assert!(decode_host(&b, &l).expect("ok").is_some());
        b[3] = 50;
        assert_eq!(host_err(&b, &l), (IHF, 3));
    }

    #[test]
    fn padded_data_is_found_at_pdo() {
        // CapsuleCmd with a header digest and data aligned to 16 bytes:
        // 72 + 4 = 76, padded to 80.
        let hl = lim(Digests {
            header: true,
            data: false,
        });
        let s = sqe(4);
        let mut b = vec![4, flags::HDGSTF, 72, 80, 0, 0, 0, 0];
        b.extend_from_slice(&s.0);
        let h = crc_ref(&b);
        b.extend_from_slice(&h.to_le_bytes());
        b.extend_from_slice(&[0xee; 4]);
        b.extend_from_slice(b"payload");
        let plen = b.len() as u32;
        set_plen(&mut b, plen);
        fix_hdgst(&mut b);
        assert_eq!(
            host(&b, &hl),
            HostPdu::CapsuleCmd {
                sqe: s,
                data: b"payload",
                data_digest_ok: true
            }
        );
    }

    #[test]
    fn header_digest_mismatch_is_fatal() {
        for d in [
            BOTH,
            Digests {
                header: true,
                data: false,
            },
        ] {
            let l = lim(d);
            for pdu in host_samples(d) {
                if pdu[1] & flags::HDGSTF == 0 {
                    continue;
                }
                let hlen = usize::from(pdu[2]);
                for at in [8, hlen - 1, hlen, hlen + 3] {
                    let mut p = pdu.clone();
                    p[at] ^= 0x10;
                    let e = decode_host(&p, &l).expect_err("digest");
                    assert_eq!((e.fes, e.fei, e.header_len), (Fes::HeaderDigest, 0, hlen));
                }
            }
            for pdu in controller_samples(d) {
                if pdu[1] & flags::HDGSTF == 0 {
                    continue;
                }
                let mut p = pdu.clone();
                p[10] ^= 1;
                assert_eq!(ctrl_err(&p, &l), (Fes::HeaderDigest, 0));
            }
        }
    }

    #[test]
    fn data_digest_mismatch_is_reported_not_fatal() {
        for d in [
            BOTH,
            Digests {
                header: false,
                data: true,
            },
        ] {
            let l = lim(d);
            let data = pattern(40, 6);
            let mut b = Vec::new();
            encode_capsule_cmd(&mut b, d, &sqe(2), &data);
            let n = b.len();
            b[n - 6] ^= 1;
            assert!(matches!(
                host(&b, &l),
                HostPdu::CapsuleCmd {
                    data_digest_ok: false,
                    ..
                }
            ));
            let mut b = Vec::new();
            encode_h2c_data(&mut b, d, 2, 2, 0, &data, true);
            let n = b.len();
            b[n - 1] ^= 1; // the digest itself
            assert!(matches!(
                host(&b, &l),
                HostPdu::H2CData {
                    data_digest_ok: false,
                    ..
                }
            ));
            let mut b = Vec::new();
            encode_c2h_data(&mut b, d, 2, 0, &data, true, false);
            let n = b.len();
            b[n - 5] ^= 0x80;
            assert!(matches!(
                ctrl(&b, &l),
                ControllerPdu::C2HData {
                    data_digest_ok: false,
                    ..
                }
            ));
        }
    }

    #[test]
    fn datal_must_match_the_data() {
        let l = lim(NONE);
        let mut b = Vec::new();
        encode_h2c_data(&mut b, NONE, 1, 1, 0, b"abcd", true);
        for datal in [0u32, 3, 5, u32::MAX] {
            b[16..20].copy_from_slice(&datal.to_le_bytes());
            assert_eq!(host_err(&b, &l), (IHF, 16));
        }
        let mut b = Vec::new();
        encode_c2h_data(&mut b, BOTH, 1, 0, b"abcd", true, false);
        b[16..20].copy_from_slice(&3u32.to_le_bytes());
        fix_hdgst(&mut b);
        assert_eq!(ctrl_err(&b, &lim(BOTH)), (IHF, 16));
        // An H2CData without data at all.
        let b = [
            6u8, 0, 24, 0, 24, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(host_err(&b, &l), (IHF, 16));
    }

    #[test]
    fn ic_req_fields_are_decoded_not_judged() {
        let mut b = Vec::new();
        encode_ic_req(
            &mut b,
            &IcReq {
                pfv: 1,
                hpda: 40,
                digests: BOTH,
                maxr2t: u32::MAX,
            },
        );
        assert_eq!(
            host(&b, &lim(NONE)),
            HostPdu::IcReq(IcReq {
                pfv: 1,
                hpda: 40,
                digests: BOTH,
                maxr2t: u32::MAX
            })
        );
    }

    #[test]
    fn error_echo_length() {
        let l = lim(NONE);
        let mut b = Vec::new();
        encode_capsule_cmd(&mut b, NONE, &sqe(1), &[]);
        b[3] = 9;
        let e = decode_host(&b, &l).expect_err("pdo");
        assert_eq!(e.header_len, 72);
        assert_eq!(e.offending(&b), &b[..72]);
        assert_eq!(decode_host(&b[..20], &l).expect_err("pdo").header_len, 20);
        let e = decode_host(&b[..8], &l).expect_err("pdo");
        assert_eq!(e.offending(&b[..8]).len(), 8);
        assert!(e.to_string().contains("PDO"));
        // An ICReq header is echoed only up to MAX_TERM_DATA bytes.
        let mut b = host_samples(NONE).remove(0);
        set_plen(&mut b, 1);
        assert_eq!(decode_host(&b, &l).expect_err("plen").header_len, 128);
        // A garbage HLEN never echoes past the buffer.
        let b = [4u8, 0, 255, 0, 0, 0, 0, 0, 1, 2];
        assert_eq!(decode_host(&b, &l).expect_err("hlen").header_len, 10);
    }

    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Encodes a decoded host PDU again (the digest verdict reset to ok).
    fn reencode_host<'a>(p: HostPdu<'a>, d: Digests, b: &mut Vec<u8>) -> HostPdu<'a> {
        match p {
            HostPdu::IcReq(r) => encode_ic_req(b, &r),
            HostPdu::CapsuleCmd { sqe, data, .. } => encode_capsule_cmd(b, d, &sqe, data),
            HostPdu::H2CData {
                cccid,
                ttag,
                datao,
                data,
                last,
                ..
            } => encode_h2c_data(b, d, cccid, ttag, datao, data, last),
            HostPdu::TermReq { fes, fei } => encode_h2c_term_req(b, fes, fei, &[]),
        }
        match p {
            HostPdu::CapsuleCmd { sqe, data, .. } => HostPdu::CapsuleCmd {
                sqe,
                data,
                data_digest_ok: true,
            },
            HostPdu::H2CData {
                cccid,
                ttag,
                datao,
                data,
                last,
                ..
            } => HostPdu::H2CData {
                cccid,
                ttag,
                datao,
                data,
                last,
                data_digest_ok: true,
            },
            other => other,
        }
    }

    /// Encodes a decoded controller PDU again (the digest verdict reset).
    fn reencode_controller<'a>(
        p: ControllerPdu<'a>,
        d: Digests,
        b: &mut Vec<u8>,
    ) -> ControllerPdu<'a> {
        match p {
            ControllerPdu::IcResp(r) => encode_ic_resp(b, &r),
            ControllerPdu::CapsuleResp { cqe } => encode_capsule_resp(b, d, &cqe),
            ControllerPdu::C2HData {
                cccid,
                datao,
                data,
                last,
                success,
                ..
            } => encode_c2h_data(b, d, cccid, datao, data, last, success),
            ControllerPdu::R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            } => encode_r2t(b, d, cccid, ttag, r2to, r2tl),
            ControllerPdu::TermReq { fes, fei } => encode_c2h_term_req(b, fes, fei, &[]),
        }
        match p {
            ControllerPdu::C2HData {
                cccid,
                datao,
                data,
                last,
                success,
                ..
            } => ControllerPdu::C2HData {
                cccid,
                datao,
                data,
                last,
                success,
                data_digest_ok: true,
            },
            other => other,
        }
    }

    /// Decodes `buf` as a stream until an error or incomplete PDU, checking
    /// the consumed counts and that what decodes encodes back to the same.
    fn drain(buf: &[u8], l: &Limits) -> usize {
        let mut decoded = 0;
        let mut rest = buf;
        while let Ok(Some((p, n))) = decode_host(rest, l) {
            assert!(n > 0 && n <= rest.len());
            let mut b = Vec::new();
            let want = reencode_host(p, l.digests, &mut b);
            assert_eq!(host(&b, l), want);
            decoded += 1;
            rest = &rest[n..];
        }
        let mut rest = buf;
        while let Ok(Some((p, n))) = decode_controller(rest, l) {
            assert!(n > 0 && n <= rest.len());
            let mut b = Vec::new();
            let want = reencode_controller(p, l.digests, &mut b);
            assert_eq!(ctrl(&b, l), want);
            decoded += 1;
            rest = &rest[n..];
        }
        if let Err(e) = decode_host(buf, l) {
            assert!(e.header_len <= buf.len());
        }
        if let Err(e) = decode_controller(buf, l) {
            assert!(e.header_len <= buf.len());
        }
        decoded
    }

    #[test]
    fn random_and_mutated_input_never_panics() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        // Valid PDUs of every kind, each with the digests it was built for.
        let mut seeds: Vec<(Digests, Vec<u8>)> = Vec::new();
        for d in ALL {
            for s in host_samples(d).into_iter().chain(controller_samples(d)) {
                seeds.push((d, s));
            }
        }
        let mut decoded = 0;
        for i in 0..20_000 {
            let mut l = Limits {
                digests: ALL[rng.below(4)],
                max_data: [0, 64, 4096][rng.below(3)],
            };
            let buf: Vec<u8> = match i % 4 {
                // Pure noise.
                0 => {
                    let len = rng.below(300);
                    (0..len).map(|_| rng.next() as u8).collect()
                }
                // Noise behind a plausible common header.
                1 => {
                    let len = 8 + rng.below(300);
                    let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                    b[0] = rng.below(11) as u8;
                    b[1] &= 0x0f;
                    b[2] = [24u8, 72, 128][rng.below(3)];
                    let plen = rng.below(len + 8) as u32;
                    set_plen(&mut b, plen);
                    b
                }
                // Valid PDUs (mostly decoded with their own digests) with a
                // few bytes changed, sometimes cut short, and streams of them.
                _ => {
                    let (d, first) = &seeds[rng.below(seeds.len())];
                    if rng.below(4) != 0 {
                        l.digests = *d;
                        l.max_data = 4096;
                    }
                    let mut b = first.clone();
                    if i % 4 == 3 {
                        for _ in 0..rng.below(4) {
                            let same: Vec<&Vec<u8>> = seeds
                                .iter()
                                .filter(|(sd, _)| sd == d)
                                .map(|(_, s)| s)
                                .collect();
                            b.extend_from_slice(same[rng.below(same.len())]);
                        }
                    }
                    for _ in 0..rng.below(4) {
                        let at = rng.below(b.len());
                        match rng.below(3) {
                            0 => b[at] ^= 1 << rng.below(8),
                            1 => b[at] = rng.next() as u8,
                            _ => b[at.min(7)] = rng.next() as u8,
                        }
                    }
                    if rng.below(2) == 0 {
                        let keep = b.len() - rng.below(b.len() / 4 + 1);
                        b.truncate(keep);
                    }
                    b
                }
            };
            decoded += drain(&buf, &l);
        }
        // The mutated PDUs must exercise the decoders, not just their checks.
        assert!(decoded > 2_000, "only {decoded} PDUs decoded");
    }
}
