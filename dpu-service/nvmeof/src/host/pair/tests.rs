//! The queue pair against canned controller bytes: completions in any
//! order with their data, R2Ts answered in MAXH2CDATA pieces, and every
//! kind of bad controller input an error, never a panic.

use super::*;
use crate::pdu::{decode_host, pdu_type, Fes, HostPdu, PduError};
use crate::spec::{nvm, Status, FABRICS};
use dpu_rand::Rng;

const NONE: Digests = Digests {
    header: false,
    data: false,
};
const BOTH: Digests = Digests {
    header: true,
    data: true,
};

fn opts(digests: Digests) -> QueueOptions {
    QueueOptions {
        digests,
        max_data: 64 << 10,
        entries: 8,
        timeout: None,
    }
}

fn ic_resp(digests: Digests, maxh2cdata: u32) -> Vec<u8> {
    let mut b = Vec::new();
    pdu::encode_ic_resp(
        &mut b,
        &IcResp {
            pfv: 0,
            cpda: 0,
            digests,
            maxh2cdata,
        },
    );
    b
}

/// Feeds `bytes` to `q` as if read from the stream.
fn feed(q: &mut QueuePair, bytes: &[u8]) {
    let mut rest = bytes;
    while !rest.is_empty() {
        let buf = q.receive_buffer();
        let n = buf.len().min(rest.len());
        buf[..n].copy_from_slice(&rest[..n]);
        q.received(n);
        rest = &rest[n..];
    }
}

/// Takes everything `q` would send.
fn drain(q: &mut QueuePair) -> Vec<u8> {
    let out = q.output().to_vec();
    q.sent(out.len());
    out
}

/// A queue past its ICReq/ICResp exchange with `digests`.
fn ready(digests: Digests, maxh2cdata: u32) -> QueuePair {
    let mut q = QueuePair::new(&opts(digests));
    let icreq = drain(&mut q);
    assert_eq!((icreq.len(), icreq[0]), (128, pdu_type::IC_REQ));
    feed(&mut q, &ic_resp(digests, maxh2cdata));
    assert!(q.poll_completion().unwrap().is_none());
    assert!(q.is_ready());
    assert_eq!(q.digests(), digests);
    q
}

fn resp(d: Digests, cid: u16, status: Status) -> Vec<u8> {
    let mut b = Vec::new();
    pdu::encode_capsule_resp(&mut b, d, &Cqe::new(cid, status));
    b
}

fn c2h(d: Digests, cid: u16, datao: u32, data: &[u8], success: bool) -> Vec<u8> {
    let mut b = Vec::new();
    pdu::encode_c2h_data(&mut b, d, cid, datao, data, success, success);
    b
}

fn r2t(d: Digests, cid: u16, ttag: u16, r2to: u32, r2tl: u32) -> Vec<u8> {
    let mut b = Vec::new();
    pdu::encode_r2t(&mut b, d, cid, ttag, r2to, r2tl);
    b
}

/// The host PDUs in `bytes`, decoded as the controller would: (type, CID
/// or CCCID, data offset, data, flags-last).
fn host_pdus(bytes: &[u8], d: Digests) -> Vec<(u8, u16, u32, Vec<u8>, bool)> {
    let limits = Limits {
        digests: d,
        max_data: 1 << 20,
    };
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let (p, n) = decode_host(&bytes[at..], &limits).unwrap().unwrap();
        out.push(match p {
            HostPdu::CapsuleCmd {
                sqe,
                data,
                data_digest_ok,
            } => {
                assert!(data_digest_ok);
                (pdu_type::CAPSULE_CMD, sqe.cid(), 0, data.to_vec(), false)
            }
            HostPdu::H2CData {
                cccid,
                datao,
                data,
                last,
                data_digest_ok,
                ..
            } => {
                assert!(data_digest_ok);
                (pdu_type::H2C_DATA, cccid, datao, data.to_vec(), last)
            }
            other => panic!("{other:?}"),
        });
        at += n;
    }
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn reads_complete_in_any_order_with_their_data() {
    for d in [NONE, BOTH] {
        let mut q = ready(d, 8192);
        for cid in 0..3u16 {
            let sqe = crate::host::read(1, u64::from(cid), 7);
            q.submit(cid, sqe, Transfer::Read(vec![0; 4096])).unwrap();
        }
        let sent = host_pdus(&drain(&mut q), d);
        assert_eq!(sent.len(), 3);
        for (i, (_, cid, ..)) in sent.iter().enumerate() {
            assert_eq!(usize::from(*cid), i);
        }
        let (a, b, c) = (pattern(4096, 1), pattern(4096, 2), pattern(4096, 3));
        // Command 2 first and whole, with SUCCESS; then 0 in two pieces
        // and a CapsuleResp; 1 last, its pieces out of order.
        let mut wire = c2h(d, 2, 0, &c, true);
        wire.extend(c2h(d, 0, 0, &a[..1000], false));
        wire.extend(c2h(d, 1, 2048, &b[2048..], false));
        wire.extend(c2h(d, 0, 1000, &a[1000..], false));
        wire.extend(resp(d, 0, Status::SUCCESS));
        wire.extend(c2h(d, 1, 0, &b[..2048], false));
        wire.extend(resp(d, 1, Status::SUCCESS));
        // Byte by byte: framing never depends on how the stream is cut.
        let mut done = Vec::new();
        for byte in wire.chunks(1) {
            feed(&mut q, byte);
            while let Some(c) = q.poll_completion().unwrap() {
                done.push(c);
            }
        }
        let got: Vec<_> = done.iter().map(|c| (c.cid(), c.is_success())).collect();
        assert_eq!(got, [(2, true), (0, true), (1, true)]);
        assert_eq!((&done[0].data, &done[1].data, &done[2].data), (&c, &a, &b));
        assert_eq!(q.in_flight(), 0);
        // The CIDs are free again.
        q.submit(2, crate::host::keep_alive(), Transfer::None)
            .unwrap();
    }
}

#[test]
fn writes_go_in_the_capsule_or_answer_r2ts_in_maxh2cdata_pieces() {
    for d in [NONE, BOTH] {
        let mut q = ready(d, 4096);
        q.set_in_capsule(4096);
        let small = pattern(4096, 7);
        let big = pattern(10_000, 9);
        q.submit(
            0,
            crate::host::write(1, 0, 7),
            Transfer::Write(small.clone()),
        )
        .unwrap();
        let shared: Arc<[u8]> = big.clone().into();
        q.submit(
            5,
            crate::host::write(1, 8, 19),
            Transfer::WriteShared(shared),
        )
        .unwrap();
        let sent = host_pdus(&drain(&mut q), d);
        assert_eq!(sent[0].3, small, "in the capsule");
        assert!(sent[1].3.is_empty(), "waits for R2T");
        // Two R2Ts for the big one: 0..6000 and 6000..10000.
        feed(&mut q, &r2t(d, 5, 0x77, 0, 6000));
        assert!(q.poll_completion().unwrap().is_none());
        let first = host_pdus(&drain(&mut q), d);
        let shape: Vec<_> = first
            .iter()
            .map(|(t, cid, o, data, last)| (*t, *cid, *o, data.len(), *last))
            .collect();
        assert_eq!(
            shape,
            [
                (pdu_type::H2C_DATA, 5, 0, 4096, false),
                (pdu_type::H2C_DATA, 5, 4096, 1904, true)
            ]
        );
        feed(&mut q, &r2t(d, 5, 0x78, 6000, 4000));
        assert!(q.poll_completion().unwrap().is_none());
        let second = host_pdus(&drain(&mut q), d);
        assert_eq!((second.len(), second[0].2, second[0].4), (1, 6000, true));
        let all: Vec<u8> = first
            .iter()
            .chain(&second)
            .flat_map(|p| p.3.clone())
            .collect();
        assert_eq!(all, big);
        // A third R2T would ask for more than the command has.
        feed(&mut q, &r2t(d, 5, 0x79, 0, 1));
        assert!(matches!(
            q.poll_completion(),
            Err(Error::DataOutOfRange { cid: 5, .. })
        ));
    }
    // The owned buffer comes back with the completion.
    let mut q = ready(NONE, 4096);
    q.submit(
        1,
        crate::host::write(1, 0, 0),
        Transfer::Write(vec![3; 512]),
    )
    .unwrap();
    feed(&mut q, &resp(NONE, 1, Status::SUCCESS));
    let c = q.poll_completion().unwrap().unwrap();
    assert_eq!(c.data, vec![3; 512]);
}

#[test]
fn the_queue_sets_cid_and_sgl() {
    let mut q = ready(NONE, 8192);
    let mut sqe = crate::host::read(1, 0, 0);
    // Junk where the queue writes.
    sqe.0[1] = 0;
    sqe.0[2..4].copy_from_slice(&[0xee, 0xee]);
    sqe.0[24..40].fill(0xee);
    q.submit(3, sqe, Transfer::Discard(512)).unwrap();
    let out = drain(&mut q);
    let limits = Limits {
        digests: NONE,
        max_data: 1 << 20,
    };
    let Some((HostPdu::CapsuleCmd { sqe, .. }, _)) = decode_host(&out, &limits).unwrap() else {
        panic!("no capsule");
    };
    assert_eq!((sqe.cid(), sqe.psdt(), sqe.opcode()), (3, 1, nvm::READ));
    assert_eq!(
        (sqe.sgl_addr(), sqe.sgl_len(), sqe.sgl_id()),
        (0, 512, sgl::TRANSPORT)
    );
    assert_eq!(&sqe.0[36..39], &[0, 0, 0]);
}

#[test]
fn submit_refuses_what_the_queue_cannot_take() {
    let mut q = QueuePair::new(&opts(NONE));
    let ka = crate::host::keep_alive;
    assert!(matches!(
        q.submit(0, ka(), Transfer::None),
        Err(Error::NotReady)
    ));
    feed(&mut q, &ic_resp(NONE, 8192));
    q.poll_completion().unwrap();
    drain(&mut q);
    assert!(matches!(
        q.submit(8, ka(), Transfer::None),
        Err(Error::CidOutOfRange { cid: 8, entries: 8 })
    ));
    q.submit(0, ka(), Transfer::None).unwrap();
    assert!(matches!(
        q.submit(0, ka(), Transfer::None),
        Err(Error::CidBusy { cid: 0 })
    ));
    for cid in 1..7 {
        q.submit(cid, ka(), Transfer::None).unwrap();
    }
    // Seven of eight entries in flight: full.
    assert_eq!((q.in_flight(), q.free_cid()), (7, None));
    assert!(matches!(
        q.submit(7, ka(), Transfer::None),
        Err(Error::QueueFull)
    ));
    // Nothing of the refused commands went out.
    assert_eq!(drain(&mut q).len(), 7 * 72);
}

/// Feeds `bytes` to a ready queue with a read (CID 1, 4 KiB), a write
/// waiting for R2T (CID 2, 8 KiB), a write sent in the capsule (CID 3)
/// and a command without data (CID 4) in flight; the error it reports.
fn fault(d: Digests, bytes: &[u8]) -> Error {
    let mut q = ready(d, 8192);
    q.set_in_capsule(4096);
    q.submit(1, crate::host::read(1, 0, 7), Transfer::Read(vec![0; 4096]))
        .unwrap();
    q.submit(
        2,
        crate::host::write(1, 0, 15),
        Transfer::Write(vec![1; 8192]),
    )
    .unwrap();
    q.submit(
        3,
        crate::host::write(1, 0, 0),
        Transfer::Write(vec![1; 512]),
    )
    .unwrap();
    q.submit(4, crate::host::keep_alive(), Transfer::None)
        .unwrap();
    drain(&mut q);
    feed(&mut q, bytes);
    let e = q.poll_completion().unwrap_err();
    // The offending PDU stays: the queue keeps saying so.
    let again = q.poll_completion().unwrap_err();
    assert_eq!(e.to_string(), again.to_string());
    e
}

fn pdu_fes(e: &Error) -> Fes {
    match e {
        Error::Pdu(PduError { fes, .. }) => *fes,
        e => panic!("not a PDU error: {e}"),
    }
}

#[test]
fn wrong_pdu_types_are_errors() {
    // Host PDUs (a command capsule, H2CData, an ICReq) and unknown types.
    let mut capsule = Vec::new();
    pdu::encode_capsule_cmd(&mut capsule, NONE, &crate::host::keep_alive(), &[]);
    let mut h2c = Vec::new();
    pdu::encode_h2c_data(&mut h2c, NONE, 1, 1, 0, &[1; 16], true);
    let mut icreq = Vec::new();
    crate::host::ic_req(&mut icreq, NONE);
    for bytes in [capsule, h2c, icreq, vec![0x7f; 8], vec![0x0a; 24]] {
        assert_eq!(pdu_fes(&fault(NONE, &bytes)), Fes::InvalidHeaderField);
    }
    // A second ICResp.
    assert!(matches!(
        fault(NONE, &ic_resp(NONE, 8192)),
        Error::UnexpectedPdu { pdu: "ICResp" }
    ));
    // Anything before the ICResp.
    let mut q = QueuePair::new(&opts(NONE));
    feed(&mut q, &resp(NONE, 0, Status::SUCCESS));
    assert!(matches!(
        q.poll_completion(),
        Err(Error::UnexpectedPdu { .. })
    ));
}

#[test]
fn oversized_pdus_are_refused_from_their_header() {
    // C2HData claiming 1 MiB of data, above the queue's 64 KiB: refused
    // with only its 8-byte common header in.
    let mut b = c2h(NONE, 1, 0, &[0; 16], false);
    let plen = 24 + (1u32 << 20);
    b[4..8].copy_from_slice(&plen.to_le_bytes());
    b[20..24].copy_from_slice(&(1u32 << 20).to_le_bytes());
    assert_eq!(pdu_fes(&fault(NONE, &b[..8])), Fes::DataLimitExceeded);
    // A PLEN of 4 GiB - 1 on a CapsuleResp.
    let mut r = resp(NONE, 1, Status::SUCCESS);
    r[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(pdu_fes(&fault(NONE, &r[..8])), Fes::InvalidHeaderField);
}

#[test]
fn digest_mismatches() {
    // Header digest: fatal.
    let mut r = resp(BOTH, 1, Status::SUCCESS);
    let last = r.len() - 1;
    r[last] ^= 1;
    assert_eq!(pdu_fes(&fault(BOTH, &r)), Fes::HeaderDigest);
    // Digests the connection did not negotiate.
    assert_eq!(
        pdu_fes(&fault(NONE, &resp(BOTH, 1, Status::SUCCESS))),
        Fes::InvalidHeaderField
    );
    // Data digest: the command fails with Data Transfer Error, even
    // though the controller said success; the queue goes on.
    let mut q = ready(BOTH, 8192);
    q.submit(1, crate::host::read(1, 0, 7), Transfer::Read(vec![0; 4096]))
        .unwrap();
    let mut bad = c2h(BOTH, 1, 0, &[5; 4096], true);
    let last = bad.len() - 1;
    bad[last] ^= 0x80;
    feed(&mut q, &bad);
    let c = q.poll_completion().unwrap().unwrap();
    assert!(!c.is_success());
    assert_eq!(c.status(), Status::DATA_TRANSFER_ERROR);
    q.submit(1, crate::host::keep_alive(), Transfer::None)
        .unwrap();
    feed(&mut q, &resp(BOTH, 1, Status::SUCCESS));
    assert!(q.poll_completion().unwrap().unwrap().is_success());
}

#[test]
fn pdus_for_the_wrong_command_are_errors() {
    let unknown = |e: Error, want: u16| match e {
        Error::UnknownCommand { cid, .. } => assert_eq!(cid, want),
        e => panic!("{e}"),
    };
    // R2T, C2HData and CapsuleResp for CIDs not in flight (one beyond
    // the table).
    unknown(fault(NONE, &r2t(NONE, 0, 1, 0, 512)), 0);
    unknown(fault(NONE, &r2t(NONE, 0xffff, 1, 0, 512)), 0xffff);
    unknown(fault(NONE, &c2h(NONE, 6, 0, &[1; 8], true)), 6);
    unknown(fault(NONE, &resp(NONE, 9, Status::SUCCESS)), 9);
    // R2T for a read, for a write sent in the capsule, for a command
    // without data; C2HData for a write.
    for bytes in [
        r2t(NONE, 1, 1, 0, 512),
        r2t(NONE, 3, 1, 0, 512),
        r2t(NONE, 4, 1, 0, 512),
        c2h(NONE, 2, 0, &[1; 8], false),
        c2h(NONE, 4, 0, &[1; 8], false),
    ] {
        assert!(matches!(fault(NONE, &bytes), Error::WrongDirection { .. }));
    }
    // Outside the command's data: past the end, wrapping u32, empty.
    for bytes in [
        r2t(NONE, 2, 1, 4096, 4097),
        r2t(NONE, 2, 1, u32::MAX, 2),
        r2t(NONE, 2, 1, 0, 0),
        c2h(NONE, 1, 4000, &[1; 97], false),
        c2h(NONE, 1, u32::MAX - 3, &[1; 8], false),
    ] {
        assert!(matches!(fault(NONE, &bytes), Error::DataOutOfRange { .. }));
    }
}

#[test]
fn termination_and_unusable_ic_resps() {
    let mut t = Vec::new();
    pdu::encode_c2h_term_req(&mut t, Fes::PduSequence.code(), 0, &[1; 8]);
    assert!(matches!(
        fault(NONE, &t),
        Error::Terminated { fes: 2, fei: 0 }
    ));
    let icresp = |pfv, cpda, digests, maxh2cdata| {
        let mut b = Vec::new();
        pdu::encode_ic_resp(
            &mut b,
            &IcResp {
                pfv,
                cpda,
                digests,
                maxh2cdata,
            },
        );
        b
    };
    for (asked, bytes) in [
        (NONE, icresp(1, 0, NONE, 8192)),
        (NONE, icresp(0, 0, NONE, 1024)),
        (NONE, icresp(0, 0, BOTH, 8192)),
        // 8-byte alignment with a header digest: data at 76.
        (BOTH, icresp(0, 1, BOTH, 8192)),
        (NONE, icresp(0, 31, NONE, 8192)),
    ] {
        let mut q = QueuePair::new(&opts(asked));
        feed(&mut q, &bytes);
        assert!(matches!(q.poll_completion(), Err(Error::IcResp(_))));
        assert!(!q.is_ready());
    }
    // 8-byte alignment without digests is met.
    let mut q = QueuePair::new(&opts(NONE));
    feed(&mut q, &icresp(0, 1, NONE, 8192));
    q.poll_completion().unwrap();
    assert!(q.is_ready());
}

#[test]
fn output_is_sent_in_pieces() {
    let mut q = ready(NONE, 8192);
    q.submit(0, crate::host::keep_alive(), Transfer::None)
        .unwrap();
    q.submit(1, crate::host::keep_alive(), Transfer::None)
        .unwrap();
    let all = q.output().to_vec();
    assert_eq!(all.len(), 144);
    q.sent(100);
    assert_eq!(q.output(), &all[100..]);
    assert!(q.has_output());
    q.sent(1000);
    assert!(!q.has_output());
    assert!(q.output().is_empty());
}

/// Random bytes after the ICResp, with commands in flight, and random
/// corruptions of valid controller PDUs: errors or completions, never a
/// panic, and never more output than the writes' data.
#[test]
fn arbitrary_controller_bytes_never_panic() {
    let mut rng = Rng::new(0x5eed);
    for round in 0..2000u32 {
        let d = if round % 2 == 0 { NONE } else { BOTH };
        let mut q = ready(d, 4096);
        q.set_in_capsule(0);
        q.submit(1, crate::host::read(1, 0, 7), Transfer::Read(vec![0; 4096]))
            .unwrap();
        q.submit(
            2,
            crate::host::write(1, 0, 15),
            Transfer::Write(vec![1; 8192]),
        )
        .unwrap();
        q.submit(3, crate::host::read(1, 0, 7), Transfer::Discard(4096))
            .unwrap();
        drain(&mut q);
        let mut bytes = match round % 4 {
            0 => (0..rng.below(300)).map(|_| rng.below(256) as u8).collect(),
            _ => {
                let mut b = Vec::new();
                for _ in 0..4 {
                    let cid = rng.below(5) as u16;
                    let off = rng.below(9000) as u32;
                    match rng.below(3) {
                        0 => b.extend(r2t(d, cid, 1, off, rng.below(9000) as u32)),
                        1 => b.extend(c2h(d, cid, off, &[2; 64], rng.below(2) == 0)),
                        _ => b.extend(resp(d, cid, Status::SUCCESS)),
                    }
                }
                b
            }
        };
        if round % 4 == 3 && !bytes.is_empty() {
            let i = rng.below(bytes.len() as u64) as usize;
            bytes[i] ^= 1 << rng.below(8);
        }
        feed(&mut q, &bytes);
        let mut sent = 0;
        for _ in 0..10 {
            match q.poll_completion() {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
            sent += drain(&mut q).len();
        }
        sent += drain(&mut q).len();
        assert!(sent <= 8192 + 8 * 32, "round {round}: {sent} bytes out");
    }
}

#[test]
fn fabrics_connect_goes_in_the_capsule_before_identify() {
    // A fresh queue sends the 1024-byte Connect data in the capsule
    // (8 KiB, the admin and fabrics minimum), whatever the I/O size is.
    let mut q = ready(NONE, 8192);
    let data = crate::host::connect_data([0; 16], 0xffff, "nqn.a", "nqn.b");
    q.submit(0, crate::host::connect(0, 0, 32, 0), Transfer::Write(data))
        .unwrap();
    let out = drain(&mut q);
    let limits = Limits {
        digests: NONE,
        max_data: 1 << 20,
    };
    let Some((HostPdu::CapsuleCmd { sqe, data, .. }, _)) = decode_host(&out, &limits).unwrap()
    else {
        panic!("no capsule")
    };
    assert_eq!(
        (sqe.opcode(), sqe.sgl_id(), data.len()),
        (FABRICS, sgl::IN_CAPSULE, 1024)
    );
}
