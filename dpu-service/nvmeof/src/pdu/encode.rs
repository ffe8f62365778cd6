//! Encoding: one whole PDU appended to a `Vec<u8>`, with the digests
//! negotiated; the encoders of both directions and the data digest.

use super::{
    flags, pdu_type, Digests, IcReq, IcResp, CH_LEN, DIGEST_LEN, IC_LEN, MAX_TERM_DATA, TERM_HLEN,
};
use crate::spec::{Cqe, Sqe};

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
/// [`MAX_TERM_PLEN`](super::MAX_TERM_PLEN).
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
    use crate::pdu::tests::*;
    use crate::pdu::*;

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
}
