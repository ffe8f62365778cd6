//! Decoding: the checks of the common header, framing of a complete PDU
//! (header digest checked, data digest verdict computed) and the decoders
//! of each direction, [`decode_host`] and [`decode_controller`]. The checks
//! and the errors they report are tabled in the [module documentation](super).

use std::ops::Range;

use super::{
    flags, pdu_type, ControllerPdu, Digests, Fes, HostPdu, IcReq, IcResp, Limits, PduError,
    CAPSULE_CMD_HLEN, CAPSULE_RESP_HLEN, CH_LEN, DATA_HLEN, DIGEST_LEN, IC_LEN, MAX_TERM_PLEN,
    R2T_HLEN, TERM_HLEN,
};
use crate::spec::{Cqe, Sqe};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::tests::*;
    use crate::pdu::*;

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
}
