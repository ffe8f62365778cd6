//! Tests across both directions (encode, then decode: round trips, streams,
//! partial and mutated input), and the helpers the tests of [`super::decode`]
//! and [`super::encode`] share.

use dpu_rand::Rng;

use super::*;

/// Bitwise CRC32C (Castagnoli, reflected), independent of the crate.
pub(super) fn crc_ref(data: &[u8]) -> u32 {
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

pub(super) const ALL: [Digests; 4] = [
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

pub(super) const NONE: Digests = Digests {
    header: false,
    data: false,
};
pub(super) const BOTH: Digests = Digests {
    header: true,
    data: true,
};

pub(super) fn lim(digests: Digests) -> Limits {
    Limits {
        digests,
        max_data: 1 << 20,
    }
}

pub(super) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub(super) fn sqe(cid: u16) -> Sqe {
    let mut b = [0u8; SQE_LEN];
    for (i, x) in b.iter_mut().enumerate() {
        *x = i as u8 ^ 0xa5;
    }
    b[0] = crate::spec::nvm::WRITE;
    b[2..4].copy_from_slice(&cid.to_le_bytes());
    Sqe(b)
}

pub(super) fn host<'a>(buf: &'a [u8], l: &Limits) -> HostPdu<'a> {
    let (p, n) = decode_host(buf, l).expect("decodes").expect("complete");
    assert_eq!(n, buf.len());
    p
}

pub(super) fn ctrl<'a>(buf: &'a [u8], l: &Limits) -> ControllerPdu<'a> {
    let (p, n) = decode_controller(buf, l)
        .expect("decodes")
        .expect("complete");
    assert_eq!(n, buf.len());
    p
}

pub(super) fn host_err(buf: &[u8], l: &Limits) -> (Fes, u32) {
    let e = decode_host(buf, l).expect_err("must fail");
    assert!(e.header_len <= buf.len());
    (e.fes, e.fei)
}

pub(super) fn ctrl_err(buf: &[u8], l: &Limits) -> (Fes, u32) {
    let e = decode_controller(buf, l).expect_err("must fail");
    assert!(e.header_len <= buf.len());
    (e.fes, e.fei)
}

/// Recomputes the header digest of a single PDU built with `HDGSTF`.
pub(super) fn fix_hdgst(buf: &mut [u8]) {
    let hlen = usize::from(buf[2]);
    let crc = crc_ref(&buf[..hlen]);
    buf[hlen..hlen + 4].copy_from_slice(&crc.to_le_bytes());
}

pub(super) fn set_plen(buf: &mut [u8], plen: u32) {
    buf[4..8].copy_from_slice(&plen.to_le_bytes());
}

pub(super) const IHF: Fes = Fes::InvalidHeaderField;

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

/// Host PDUs of every kind, each encoded with `d`.
pub(super) fn host_samples(d: Digests) -> Vec<Vec<u8>> {
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
pub(super) fn controller_samples(d: Digests) -> Vec<Vec<u8>> {
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
fn reencode_controller<'a>(p: ControllerPdu<'a>, d: Digests, b: &mut Vec<u8>) -> ControllerPdu<'a> {
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
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
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
            digests: *rng.pick(&ALL),
            max_data: *rng.pick(&[0, 64, 4096]),
        };
        let buf: Vec<u8> = match i % 4 {
            // Pure noise.
            0 => {
                let mut b = vec![0; rng.below(300) as usize];
                rng.fill(&mut b);
                b
            }
            // Noise behind a plausible common header.
            1 => {
                let len = 8 + rng.below(300);
                let mut b = vec![0; len as usize];
                rng.fill(&mut b);
                b[0] = rng.below(11) as u8;
                b[1] &= 0x0f;
                b[2] = *rng.pick(&[24u8, 72, 128]);
                let plen = rng.below(len + 8) as u32;
                set_plen(&mut b, plen);
                b
            }
            // Valid PDUs (mostly decoded with their own digests) with a
            // few bytes changed, sometimes cut short, and streams of them.
            _ => {
                let (d, first) = rng.pick(&seeds);
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
                        let next = *rng.pick(&same);
                        b.extend_from_slice(next);
                    }
                }
                for _ in 0..rng.below(4) {
                    let at = rng.index(b.len());
                    match rng.below(3) {
                        0 => b[at] ^= 1 << rng.below(8),
                        1 => b[at] = rng.next_u32() as u8,
                        _ => b[at.min(7)] = rng.next_u32() as u8,
                    }
                }
                if rng.below(2) == 0 {
                    let keep = b.len() - rng.index(b.len() / 4 + 1);
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
