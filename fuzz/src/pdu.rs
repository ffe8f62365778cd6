//! Fuzzes the NVMe/TCP PDU decoders: the first input byte picks the
//! negotiated digests and the data limit, the rest is decoded as a stream of
//! host PDUs and as a stream of controller PDUs. Every PDU that decodes must
//! consume between 1 byte and what was left, and must decode the same after
//! being encoded again. Run with `fuzz/run.sh pdu` from the repository
//! root.

use dpu_nvmeof::pdu::{self, ControllerPdu, Digests, HostPdu, Limits};

/// Encodes a decoded host PDU again; returns the PDU the encoding must decode
/// to (the same, with the data digest verdict reset).
fn reencode_host<'a>(p: HostPdu<'a>, d: Digests, b: &mut Vec<u8>) -> HostPdu<'a> {
    match p {
        HostPdu::IcReq(r) => pdu::encode_ic_req(b, &r),
        HostPdu::CapsuleCmd { sqe, data, .. } => pdu::encode_capsule_cmd(b, d, &sqe, data),
        HostPdu::H2CData {
            cccid,
            ttag,
            datao,
            data,
            last,
            ..
        } => pdu::encode_h2c_data(b, d, cccid, ttag, datao, data, last),
        HostPdu::TermReq { fes, fei } => pdu::encode_h2c_term_req(b, fes, fei, &[]),
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

/// Like [`reencode_host`] for controller PDUs.
fn reencode_controller<'a>(p: ControllerPdu<'a>, d: Digests, b: &mut Vec<u8>) -> ControllerPdu<'a> {
    match p {
        ControllerPdu::IcResp(r) => pdu::encode_ic_resp(b, &r),
        ControllerPdu::CapsuleResp { cqe } => pdu::encode_capsule_resp(b, d, &cqe),
        ControllerPdu::C2HData {
            cccid,
            datao,
            data,
            last,
            success,
            ..
        } => pdu::encode_c2h_data(b, d, cccid, datao, data, last, success),
        ControllerPdu::R2T {
            cccid,
            ttag,
            r2to,
            r2tl,
        } => pdu::encode_r2t(b, d, cccid, ttag, r2to, r2tl),
        ControllerPdu::TermReq { fes, fei } => pdu::encode_c2h_term_req(b, fes, fei, &[]),
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

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let Some((&sel, input)) = data.split_first() else {
        return;
    };
    let limits = Limits {
        digests: Digests {
            header: sel & 1 != 0,
            data: sel & 2 != 0,
        },
        max_data: [0, 64, 4096, 128 * 1024][usize::from((sel >> 2) & 3)],
    };

    let mut rest = input;
    loop {
        match pdu::decode_host(rest, &limits) {
            Ok(Some((p, n))) => {
                assert!(n > 0 && n <= rest.len(), "consumed {n} of {}", rest.len());
                let mut b = Vec::new();
                let want = reencode_host(p, limits.digests, &mut b);
                let again = pdu::decode_host(&b, &limits).expect("re-encoded PDU decodes");
                assert_eq!(again, Some((want, b.len())));
                rest = &rest[n..];
            }
            Ok(None) => break,
            Err(e) => {
                assert!(e.header_len <= rest.len());
                break;
            }
        }
    }

    let mut rest = input;
    loop {
        match pdu::decode_controller(rest, &limits) {
            Ok(Some((p, n))) => {
                assert!(n > 0 && n <= rest.len(), "consumed {n} of {}", rest.len());
                let mut b = Vec::new();
                let want = reencode_controller(p, limits.digests, &mut b);
                let again = pdu::decode_controller(&b, &limits).expect("re-encoded PDU decodes");
                assert_eq!(again, Some((want, b.len())));
                rest = &rest[n..];
            }
            Ok(None) => break,
            Err(e) => {
                assert!(e.header_len <= rest.len());
                break;
            }
        }
    }
}
