//! The target's protocol state machine driven byte for byte by a small
//! host written with the crate's own host-side PDU codec: no sockets, no
//! threads, every step checked on the wire bytes.

mod harness;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dpu_nvmeof::pdu::{self, Digests};
use dpu_nvmeof::spec::{self, admin, nvm, sgl, Cqe, Status};
use dpu_nvmeof::{host, identify};
use dpu_nvmeof::{BackendSpec, Connection, Target, TargetConfig};
use dpu_rand::Rng;

use harness::*;

#[test]
fn identify_write_read_round_trip_with_and_without_digests() {
    let t = target(&[]);
    let (mut a, cntlid) = Host::admin(&t, NQN, 0);
    let id = a.identify(1, 0);
    assert_eq!(status(id.cqe.as_ref().unwrap()), 0);
    assert_eq!(id.data.len(), 4096);
    assert_eq!(&id.data[768..768 + NQN.len()], NQN.as_bytes());
    assert_eq!(u16::from_le_bytes([id.data[78], id.data[79]]), cntlid);
    let ns = a.identify(0, 1);
    assert_eq!(
        u64::from_le_bytes(ns.data[0..8].try_into().unwrap()),
        2048,
        "1 MiB of 512-byte blocks"
    );
    let list = a.identify(2, 0);
    assert_eq!(&list.data[0..8], &[1, 0, 0, 0, 0, 0, 0, 0]);

    for digests in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        let mut q = Host::io_queue(&t, cntlid, digests);
        // In-capsule write, then a large write through R2T/H2CData.
        let small: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        assert_eq!(q.rw(nvm::WRITE, 8, 8, &small).cqe.unwrap().status, 0);
        let big: Vec<u8> = (0..300 * 1024u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(q.rw(nvm::WRITE, 100, 600, &big).cqe.unwrap().status, 0);
        let r = q.rw(nvm::READ, 8, 8, &[]);
        assert_eq!(r.cqe.unwrap().status, 0);
        assert_eq!(r.data, small);
        let r = q.rw(nvm::READ, 100, 600, &[]);
        assert_eq!(r.data, big);
        // Unwritten blocks read as zeros.
        assert!(q.rw(nvm::READ, 1500, 8, &[]).data.iter().all(|&b| b == 0));
        q.conn.close("test done");
    }
}

#[test]
fn bad_commands_get_the_right_status_and_the_queue_goes_on() {
    let t = target(&[]);
    let (mut a, cntlid) = Host::admin(&t, NQN, 0);
    let mut q = Host::io_queue(&t, cntlid, Digests::default());
    let r = q.rw(nvm::READ, 2047, 2, &[]);
    assert_eq!(r.cqe.unwrap().status, Status::LBA_OUT_OF_RANGE.to_field());
    let mut sqe = q.sqe(nvm::READ);
    sqe.0[4..8].copy_from_slice(&9u32.to_le_bytes());
    let r = q.command(sqe, &[], 512);
    assert_eq!(r.cqe.unwrap().status, Status::INVALID_NS.to_field());
    let sqe = q.sqe(0x7e);
    assert_eq!(
        q.command(sqe, &[], 0).cqe.unwrap().status,
        Status::INVALID_OPCODE.to_field()
    );
    // SGL length that does not match the blocks.
    let mut sqe = q.sqe(nvm::READ);
    sqe.0[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(
        q.command(sqe, &[], 4096).cqe.unwrap().status,
        Status::SGL_LENGTH_INVALID.to_field()
    );
    // Still serving.
    assert_eq!(q.rw(nvm::READ, 0, 1, &[]).cqe.unwrap().status, 0);
    // The failures are in the error log, newest first.
    let log = a.log_page(identify::LID_ERROR, 64 * 4);
    let count = u64::from_le_bytes(log.data[0..8].try_into().unwrap());
    assert_eq!(count, 4);
    assert!(!q.conn.is_closed());
}

#[test]
fn connect_refusals() {
    let t = target(&["nqn.2014-08.org.nvmexpress:uuid:other"]);
    let mut h = Host::new(&t, Digests::default());
    let c = h.connect(0, 0xffff, NQN, HOST, 0);
    assert_eq!(c.status, Status::CONNECT_INVALID_HOST.to_field());
    let mut h = Host::new(&t, Digests::default());
    let c = h.connect(0, 0xffff, "nqn.2024-01.io.example:nothing", HOST, 0);
    assert_eq!(c.status, Status::CONNECT_INVALID_PARAMETERS.to_field());
    assert_eq!(c.dw0, 1 | 256 << 16, "names SUBNQN in the data");
    // An I/O queue for a controller that does not exist.
    let mut h = Host::new(&t, Digests::default());
    let c = h.connect(1, 77, NQN, HOST, 0);
    assert_eq!(c.status, Status::CONNECT_INVALID_PARAMETERS.to_field());
    assert_eq!(t.controller_count(), 0);
}

#[test]
fn keep_alive_timeout_ends_the_controller_and_its_queues() {
    let t = target(&[]);
    let (mut a, cntlid) = Host::admin(&t, NQN, 500);
    let mut q = Host::io_queue(&t, cntlid, Digests::default());
    let later = Instant::now() + Duration::from_millis(300);
    a.conn.tick(later);
    assert!(!a.conn.is_closed(), "inside the timeout");
    let sqe = a.sqe(admin::KEEP_ALIVE);
    assert_eq!(a.command(sqe, &[], 0).cqe.unwrap().status, 0);
    a.conn.tick(Instant::now() + Duration::from_secs(5));
    assert!(a.conn.is_closed());
    q.conn.tick(Instant::now());
    assert!(q.conn.is_closed(), "I/O queue follows its controller");
    assert_eq!(t.controller_count(), 0);
    assert_eq!(
        t.stats()
            .keep_alive_timeouts
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn namespace_added_at_run_time_raises_an_event() {
    let t = target(&[]);
    let (mut a, _) = Host::admin(&t, NQN, 0);
    // Enable namespace attribute notices, park an AER.
    let mut sqe = a.sqe(admin::SET_FEATURES);
    sqe.0[40] = identify::feature::ASYNC_EVENT;
    sqe.0[44..48].copy_from_slice(&(1u32 << 8).to_le_bytes());
    sqe.0[39] = 0;
    assert_eq!(a.command(sqe, &[], 0).cqe.unwrap().status, 0);
    let mut aer = a.sqe(admin::ASYNC_EVENT);
    aer.0[39] = 0;
    let aer_cid = aer.cid();
    let mut b = Vec::new();
    pdu::encode_capsule_cmd(&mut b, Digests::default(), &aer, &[]);
    a.send(&b);
    assert!(a.next_pdu().is_none(), "AER stays outstanding");

    let mut cfg = config(&[]);
    cfg.subsystems[0].namespaces.push(namespace(2, 1 << 20));
    assert!(t.apply(&cfg).is_empty());
    a.conn.tick(Instant::now() + Duration::from_millis(200));
    a.inbox.extend(a.conn.take_output());
    match a.next_pdu() {
        Some(Owned::Resp(c)) => {
            assert_eq!(c.cid, aer_cid);
            assert_eq!(c.dw0, identify::AEN_NS_ATTR_CHANGED);
        }
        other => panic!("expected the AER completion, got {other:?}"),
    }
    let log = a.log_page(identify::LID_CHANGED_NS, 4096);
    assert_eq!(&log.data[0..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
    let list = a.identify(2, 0);
    assert_eq!(&list.data[0..8], &[1, 0, 0, 0, 2, 0, 0, 0]);
    // RAM contents of namespace 1 survive the change (same backend).
}

#[test]
fn ram_data_survives_unrelated_configuration_changes() {
    let t = target(&[]);
    let (_a, cntlid) = Host::admin(&t, NQN, 0);
    let mut q = Host::io_queue(&t, cntlid, Digests::default());
    assert_eq!(q.rw(nvm::WRITE, 0, 1, &[0xab; 512]).cqe.unwrap().status, 0);
    let mut cfg = config(&[]);
    cfg.subsystems[0].allow_any_host = false;
    cfg.subsystems[0].allowed_hosts.insert(HOST.into());
    cfg.subsystems[0].namespaces[0].backend = BackendSpec::Ram { size: 2 << 20 };
    assert!(t.apply(&cfg).is_empty());
    assert_eq!(q.rw(nvm::READ, 0, 1, &[]).data, vec![0xab; 512]);
    assert_eq!(
        q.rw(nvm::READ, 4000, 1, &[]).cqe.unwrap().status,
        0,
        "grown"
    );
}

#[test]
fn discovery_log_lists_what_the_host_may_use() {
    let t = target(&[]);
    let (mut a, _) = Host::admin(&t, spec::DISCOVERY_NQN, 0);
    let id = a.identify(1, 0);
    assert_eq!(id.data[111], 2, "discovery controller");
    let log = a.log_page(identify::LID_DISCOVERY, 2048);
    assert_eq!(
        u64::from_le_bytes(log.data[8..16].try_into().unwrap()),
        1,
        "one record"
    );
    let e = &log.data[1024..2048];
    assert_eq!(e[0], 3, "TCP");
    assert_eq!(&e[256..256 + NQN.len()], NQN.as_bytes());
    assert_eq!(&e[512..521], b"127.0.0.1");
    assert_eq!(&e[32..36], b"4420");
    // A host not on the allow list sees nothing.
    let t = target(&["nqn.2014-08.org.nvmexpress:uuid:other"]);
    let (mut a, _) = Host::admin(&t, spec::DISCOVERY_NQN, 0);
    let log = a.log_page(identify::LID_DISCOVERY, 1024);
    assert_eq!(u64::from_le_bytes(log.data[8..16].try_into().unwrap()), 0);
}

#[test]
fn malformed_pdus_terminate_only_their_connection() {
    let t = target(&[]);
    let (_a, cntlid) = Host::admin(&t, NQN, 0);
    let mut good = Host::io_queue(&t, cntlid, Digests::default());
    let mut bad = Host::new(&t, Digests::default());
    // A PDU type that never travels host to controller.
    let mut junk = vec![pdu::pdu_type::C2H_DATA, 0, 24, 24, 24, 0, 0, 0];
    junk.resize(24, 0);
    bad.send(&junk);
    match bad.next_pdu() {
        Some(Owned::Term { fes, .. }) => assert_eq!(fes, 1),
        other => panic!("expected C2HTermReq, got {other:?}"),
    }
    assert!(bad.conn.is_closed());
    // A command before ICReq on a fresh connection.
    let peer: SocketAddr = "127.0.0.1:50001".parse().unwrap();
    let mut c = Connection::new(t.clone(), listen(), peer);
    let mut b = Vec::new();
    let sqe = good.sqe(nvm::READ);
    pdu::encode_capsule_cmd(&mut b, Digests::default(), &sqe, &[]);
    c.receive(&b, Instant::now());
    assert!(c.is_closed());
    // The other queue is untouched.
    assert_eq!(good.rw(nvm::WRITE, 0, 1, &[1; 512]).cqe.unwrap().status, 0);
}

/// A socket that never sends its ICReq, or stops halfway through a PDU,
/// is closed once its time is up; a PDU that arrives whole in time, in
/// pieces, is served. Time is passed in, so the test waits for nothing.
#[test]
fn silent_and_stalled_sockets_are_closed_on_time() {
    use dpu_nvmeof::conn::{ICREQ_TIMEOUT, PDU_TIMEOUT};
    let t = target(&[]);
    let stats = |t: &Target| {
        let s = t.stats();
        (
            s.handshake_timeouts.load(Ordering::Relaxed),
            s.pdu_timeouts.load(Ordering::Relaxed),
        )
    };
    let t0 = Instant::now();
    let peer: SocketAddr = "127.0.0.1:50002".parse().unwrap();

    // No ICReq: open until the timeout, closed at it.
    let mut mute = Connection::new(t.clone(), listen(), peer);
    mute.tick(t0);
    mute.tick(t0 + ICREQ_TIMEOUT - Duration::from_millis(1));
    assert!(!mute.is_closed());
    mute.tick(t0 + ICREQ_TIMEOUT);
    assert!(mute.is_closed());
    assert_eq!(mute.close_reason(), Some("no ICReq in time"));
    assert_eq!(stats(&t), (1, 0));

    // Half an ICReq counts the same.
    let mut half = Connection::new(t.clone(), listen(), peer);
    let mut ic = Vec::new();
    host::ic_req(&mut ic, Digests::default());
    assert_eq!(half.receive(&ic[..20], t0), 0);
    half.tick(t0 + ICREQ_TIMEOUT);
    assert!(half.is_closed());
    assert_eq!(stats(&t), (2, 0));

    // After the handshake, a capsule stopped after 4 bytes.
    let (_a, cntlid) = Host::admin(&t, NQN, 0);
    let mut q = Host::io_queue(&t, cntlid, Digests::default());
    let mut b = Vec::new();
    let sqe = q.sqe(nvm::READ);
    pdu::encode_capsule_cmd(&mut b, Digests::default(), &sqe, &[]);
    let t1 = t0 + Duration::from_secs(100);
    assert_eq!(q.conn.receive(&b[..4], t1), 0);
    // Offered again with no more bytes: the clock runs from the first.
    assert_eq!(q.conn.receive(&b[..4], t1 + Duration::from_secs(5)), 0);
    q.conn.tick(t1 + PDU_TIMEOUT - Duration::from_millis(1));
    assert!(!q.conn.is_closed());
    // The rest in time: served, and the clock stops.
    assert_eq!(
        q.conn
            .receive(&b, t1 + PDU_TIMEOUT - Duration::from_millis(1)),
        b.len()
    );
    q.conn.tick(t1 + PDU_TIMEOUT * 5);
    assert!(!q.conn.is_closed());
    // Stalled again, for good this time.
    let t2 = t1 + PDU_TIMEOUT * 6;
    assert_eq!(q.conn.receive(&b[..b.len() - 1], t2), 0);
    q.conn.tick(t2 + PDU_TIMEOUT);
    assert!(q.conn.is_closed());
    assert_eq!(q.conn.close_reason(), Some("PDU incomplete in time"));
    assert_eq!(stats(&t), (2, 1));
}

#[test]
fn data_digest_error_fails_the_command_not_the_connection() {
    let t = target(&[]);
    let (_a, cntlid) = Host::admin(&t, NQN, 0);
    let d = Digests {
        header: true,
        data: true,
    };
    let mut q = Host::io_queue(&t, cntlid, d);
    let mut sqe = q.sqe(nvm::WRITE);
    sqe.0[4..8].copy_from_slice(&1u32.to_le_bytes());
    sqe.0[39] = sgl::IN_CAPSULE;
    sqe.0[32..36].copy_from_slice(&512u32.to_le_bytes());
    let mut b = Vec::new();
    pdu::encode_capsule_cmd(&mut b, d, &sqe, &[7; 512]);
    let n = b.len();
    b[n - 1] ^= 0xff; // corrupt the data digest
    q.send(&b);
    match q.next_pdu() {
        Some(Owned::Resp(c)) => assert_eq!(c.status, Status::TRANSIENT_TRANSPORT.to_field()),
        other => panic!("expected a failed completion, got {other:?}"),
    }
    assert!(!q.conn.is_closed());
    assert_eq!(q.rw(nvm::WRITE, 0, 1, &[1; 512]).cqe.unwrap().status, 0);
}

#[test]
fn deallocate_and_write_zeroes_read_back_zeros() {
    let t = target(&[]);
    let (_a, cntlid) = Host::admin(&t, NQN, 0);
    let mut q = Host::io_queue(&t, cntlid, Digests::default());
    assert_eq!(q.rw(nvm::WRITE, 0, 16, &[9; 8192]).cqe.unwrap().status, 0);
    // Write Zeroes of blocks 0..4.
    let mut sqe = q.sqe(nvm::WRITE_ZEROES);
    sqe.0[4..8].copy_from_slice(&1u32.to_le_bytes());
    sqe.0[48..50].copy_from_slice(&3u16.to_le_bytes());
    sqe.0[39] = 0;
    assert_eq!(q.command(sqe, &[], 0).cqe.unwrap().status, 0);
    // Deallocate blocks 8..16.
    let mut sqe = q.sqe(nvm::DSM);
    sqe.0[4..8].copy_from_slice(&1u32.to_le_bytes());
    sqe.0[44] = 1 << 2;
    let mut range = [0u8; 16];
    range[4..8].copy_from_slice(&8u32.to_le_bytes());
    range[8..16].copy_from_slice(&8u64.to_le_bytes());
    assert_eq!(q.command(sqe, &range, 0).cqe.unwrap().status, 0);
    let r = q.rw(nvm::READ, 0, 16, &[]).data;
    assert!(r[..2048].iter().all(|&b| b == 0));
    assert!(r[2048..4096].iter().all(|&b| b == 9));
    assert!(r[4096..].iter().all(|&b| b == 0));
}

/// A deep batch of reads lets the transport send after the first
/// `FIRST_SEND` answers, then after twice as many in all, and so on; the
/// answers come in order and the last ones wait in the output.
#[test]
fn a_deep_batch_is_sent_in_growing_parts() {
    let t = target(&[]);
    let (_a, cntlid) = Host::admin(&t, NQN, 0);
    let mut q = Host::io_queue(&t, cntlid, Digests::default());
    // Within the queue's 32 entries: sends after 8 and 16 answers.
    let f = dpu_nvmeof::conn::FIRST_SEND;
    let n = 3 * f + f / 2;
    let cids: Vec<u16> = (0..n as u64)
        .map(|i| {
            let sqe = q.rw_sqe(1, nvm::READ, i, 1);
            q.submit(&sqe);
            sqe.cid()
        })
        .collect();
    let mut parts = Vec::new();
    let ran = q.conn.execute_requests(|c| parts.push(c.take_output()));
    parts.push(q.conn.take_output());
    assert_eq!(ran, n);
    let mut answered = Vec::new();
    let mut sizes = Vec::new();
    for part in parts {
        q.inbox.extend(part);
        let before = answered.len();
        while let Some(p) = q.next_pdu() {
            match p {
                Owned::Data { data, .. } => assert_eq!(data.len(), 512),
                Owned::Resp(c) => {
                    assert_eq!(c.status, 0);
                    answered.push(c.cid);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        sizes.push(answered.len() - before);
    }
    assert_eq!(sizes, [f, f, n - 2 * f]);
    assert_eq!(answered, cids);
}

/// Random and mutated command streams on a live controller's queues: the
/// target answers or terminates, never panics, and the target stays usable.
#[test]
fn hostile_byte_streams_never_panic() {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let t = target(&[]);
    let (_a, cntlid) = Host::admin(&t, NQN, 0);
    for round in 0..3000 {
        let mut q = if round % 3 == 0 {
            Host::new(&t, Digests::default())
        } else {
            Host::io_queue(
                &t,
                cntlid,
                Digests {
                    header: round % 2 == 0,
                    data: round % 5 == 0,
                },
            )
        };
        // A well-formed write or read, then mutated.
        let mut sqe = q.sqe(if rng.bool() { nvm::WRITE } else { nvm::READ });
        sqe.0[4..8].copy_from_slice(&1u32.to_le_bytes());
        sqe.0[48] = rng.below(16) as u8;
        let mut b = Vec::new();
        let data = vec![0x5a; rng.below(9000) as usize];
        pdu::encode_capsule_cmd(&mut b, q.digests, &sqe, &data);
        for _ in 0..rng.below(6) {
            let i = rng.index(b.len());
            b[i] = rng.next_u32() as u8;
        }
        if rng.chance(1, 4) {
            b.truncate(rng.index(b.len()));
        }
        if rng.chance(1, 4) {
            let mut junk = vec![0; rng.below(200) as usize];
            rng.fill(&mut junk);
            b.extend_from_slice(&junk);
        }
        let mut pending = Vec::new();
        let step = 1 + rng.below(300) as usize;
        for chunk in b.chunks(step) {
            if q.conn.is_closed() {
                break;
            }
            pending.extend_from_slice(chunk);
            let used = q.conn.receive(&pending, Instant::now());
            assert!(used <= pending.len());
            pending.drain(..used);
            while let Some(r) = q.conn.next_request() {
                let done = r.execute();
                q.conn.complete(done);
            }
            let _ = q.conn.take_output();
        }
        q.conn.tick(Instant::now());
        q.conn.close("round over");
    }
    // Still serving.
    let mut q = Host::io_queue(&t, cntlid, Digests::default());
    assert_eq!(q.rw(nvm::WRITE, 0, 1, &[3; 512]).cqe.unwrap().status, 0);
}

#[test]
fn data_digest_error_in_h2c_data_fails_the_write_once_its_data_is_in() {
    let t = target(&[]);
    let (_a, cntlid) = Host::admin(&t, NQN, 0);
    let d = Digests {
        header: true,
        data: true,
    };
    let mut q = Host::io_queue(&t, cntlid, d);
    let mut sqe = q.sqe(nvm::WRITE);
    sqe.0[4..8].copy_from_slice(&1u32.to_le_bytes());
    sqe.0[32..36].copy_from_slice(&16384u32.to_le_bytes());
    sqe.0[48..50].copy_from_slice(&31u16.to_le_bytes());
    let cid = sqe.cid();
    let mut b = Vec::new();
    pdu::encode_capsule_cmd(&mut b, d, &sqe, &[]);
    q.send(&b);
    match q.next_pdu() {
        Some(Owned::R2T {
            cccid,
            ttag,
            r2to: 0,
            r2tl: 16384,
        }) => {
            assert_eq!(cccid, cid);
            let mut b = Vec::new();
            pdu::encode_h2c_data(&mut b, d, cid, ttag, 0, &[1; 8192], false);
            let n = b.len();
            b[n - 1] ^= 0x55; // corrupt the first PDU's data digest
            pdu::encode_h2c_data(&mut b, d, cid, ttag, 8192, &[2; 8192], true);
            q.send(&b);
        }
        other => panic!("expected an R2T, got {other:?}"),
    }
    match q.next_pdu() {
        Some(Owned::Resp(c)) => assert_eq!(c.status, Status::TRANSIENT_TRANSPORT.to_field()),
        other => panic!("expected a failed completion, got {other:?}"),
    }
    assert!(!q.conn.is_closed(), "the stream stayed in step");
    // Nothing of the corrupt write reached the namespace.
    assert!(q.rw(nvm::READ, 0, 32, &[]).data.iter().all(|&b| b == 0));
}

/// Data buffers are reused across commands: a read carries only the
/// namespace's bytes, never those of an earlier, larger or smaller transfer.
#[test]
fn reused_buffers_never_carry_earlier_data() {
    // 4 MiB: the RAM backend's lazily allocated 1 MiB segments 1-3 are
    // never written, so their reads come from the backend's zero path.
    let mut cfg = config(&[]);
    cfg.subsystems[0].namespaces = vec![namespace(1, 4 << 20)];
    let t = Target::new();
    assert!(t.apply(&cfg).is_empty());
    let (_a, cntlid) = Host::admin(&t, NQN, 0);
    let mut q = Host::io_queue(&t, cntlid, Digests::default());
    // 64 KiB through R2T/H2CData (more than in-capsule data), read back.
    let big = vec![0x5a; 65536];
    assert_eq!(q.rw(nvm::WRITE, 0, 128, &big).cqe.unwrap().status, 0);
    assert_eq!(q.rw(nvm::READ, 0, 128, &[]).data, big);
    for round in 0..3 {
        // Smaller, then larger reads of never-written blocks: zeros only.
        let r = q.rw(nvm::READ, 4096, 16, &[]).data;
        assert_eq!(r.len(), 8192);
        assert!(r.iter().all(|&b| b == 0), "round {round}: small read");
        let r = q.rw(nvm::READ, 6144, 256, &[]).data;
        assert_eq!(r.len(), 131072);
        assert!(r.iter().all(|&b| b == 0), "round {round}: large read");
        let r = q.rw(nvm::READ, 64, 64, &[]).data;
        assert!(
            r.iter().all(|&b| b == 0x5a),
            "round {round}: written blocks"
        );
    }
}

/// Enables namespace attribute notices on an admin queue and parks an
/// Asynchronous Event Request; returns its command identifier.
fn park_aer(a: &mut Host, enable: bool) -> u16 {
    if enable {
        let mut sqe = a.sqe(admin::SET_FEATURES);
        sqe.0[40] = identify::feature::ASYNC_EVENT;
        sqe.0[44..48].copy_from_slice(&(1u32 << 8).to_le_bytes());
        assert_eq!(a.command(sqe, &[], 0).cqe.unwrap().status, 0);
    }
    let aer = a.sqe(admin::ASYNC_EVENT);
    let cid = aer.cid();
    let mut b = Vec::new();
    pdu::encode_capsule_cmd(&mut b, Digests::default(), &aer, &[]);
    a.send(&b);
    assert!(a.next_pdu().is_none(), "AER stays outstanding");
    cid
}

/// The admin queue got the namespace attribute notice on `aer`, and the
/// changed namespace list names exactly `nsids` (read, so it clears).
fn expect_ns_notice(a: &mut Host, aer: u16, nsids: &[u32]) {
    a.conn.tick(Instant::now() + Duration::from_millis(200));
    a.inbox.extend(a.conn.take_output());
    match a.next_pdu() {
        Some(Owned::Resp(c)) => {
            assert_eq!(c.cid, aer);
            assert_eq!(c.dw0, identify::AEN_NS_ATTR_CHANGED);
        }
        other => panic!("expected the AER completion, got {other:?}"),
    }
    let log = a.log_page(identify::LID_CHANGED_NS, 4096).data;
    let mut want: Vec<u8> = nsids.iter().flat_map(|n| n.to_le_bytes()).collect();
    want.resize(4096, 0);
    assert_eq!(log, want);
}

/// Number of logical blocks Identify Namespace reports (NSZE, NCAP, NUSE).
fn nsze(a: &mut Host, nsid: u32) -> [u64; 3] {
    let d = a.identify(0, nsid).data;
    let q = |at: usize| u64::from_le_bytes(d[at..at + 8].try_into().unwrap());
    [q(0), q(8), q(16)]
}

fn resized(t: &Target, nsid: u32, size: u64) {
    let mut cfg = config(&[]);
    cfg.subsystems[0].namespaces = vec![namespace(1, 1 << 20), namespace(2, 1 << 20)];
    for n in &mut cfg.subsystems[0].namespaces {
        if n.nsid == nsid {
            n.backend = BackendSpec::Ram { size };
        }
    }
    assert!(t.apply(&cfg).is_empty());
}

/// Two 1 MiB namespaces, an admin queue with an AER parked and an I/O queue.
fn two_namespaces() -> (Target, Host, u16, Host) {
    let t = target(&[]);
    resized(&t, 1, 1 << 20);
    let (mut a, cntlid) = Host::admin(&t, NQN, 0);
    let aer = park_aer(&mut a, true);
    let q = Host::io_queue(&t, cntlid, Digests::default());
    (t, a, aer, q)
}

#[test]
fn resize_is_seen_by_identify_new_commands_and_an_event() {
    let (t, mut a, aer, mut q) = two_namespaces();
    assert_eq!(nsze(&mut a, 1), [2048; 3]);
    assert_eq!(
        q.rw(nvm::WRITE, 1000, 1, &[0x5a; 512]).cqe.unwrap().status,
        0
    );
    let oor = Status::LBA_OUT_OF_RANGE.to_field();
    assert_eq!(
        q.rw(nvm::WRITE, 3000, 1, &[1; 512]).cqe.unwrap().status,
        oor
    );

    // Grow: new blocks usable at once, reported by Identify and an event.
    resized(&t, 1, 4 << 20);
    expect_ns_notice(&mut a, aer, &[1]);
    assert_eq!(nsze(&mut a, 1), [8192; 3]);
    assert_eq!(
        nsze(&mut a, 2),
        [2048; 3],
        "the other namespace is untouched"
    );
    assert_eq!(q.rw(nvm::WRITE, 8191, 1, &[7; 512]).cqe.unwrap().status, 0);
    assert_eq!(q.rw(nvm::READ, 8191, 1, &[]).data, vec![7; 512]);
    assert_eq!(q.rw(nvm::READ, 1000, 1, &[]).data, vec![0x5a; 512]);

    // Shrink: the range check follows; what is left keeps its data.
    assert_eq!(
        q.rw(nvm::WRITE, 1500, 1, &[0x77; 512]).cqe.unwrap().status,
        0
    );
    let aer = park_aer(&mut a, false);
    resized(&t, 1, 512 << 10);
    expect_ns_notice(&mut a, aer, &[1]);
    assert_eq!(nsze(&mut a, 1), [1024; 3]);
    let r = q.rw(nvm::WRITE, 1500, 1, &[1; 512]);
    assert_eq!(r.cqe.unwrap().status, oor);
    let r = q.rw(nvm::WRITE, 1020, 8, &[1; 4096]);
    assert_eq!(r.cqe.unwrap().status, oor, "a write straddling the end");
    assert_eq!(q.rw(nvm::READ, 1023, 2, &[]).cqe.unwrap().status, oor);
    assert_eq!(q.rw(nvm::READ, 1023, 1, &[]).cqe.unwrap().status, 0);
    // Grown back, the cut-off range reads zeros: nothing written past the
    // end landed; what was within keeps its data.
    resized(&t, 1, 4 << 20);
    assert_eq!(q.rw(nvm::READ, 1500, 1, &[]).data, vec![0; 512]);
    assert_eq!(q.rw(nvm::READ, 8191, 1, &[]).data, vec![0; 512]);
    assert_eq!(q.rw(nvm::READ, 1000, 1, &[]).data, vec![0x5a; 512]);
    assert_eq!(t.health(NQN).media_errors.load(Ordering::Relaxed), 0);
}

#[test]
fn shrink_under_an_accepted_command_answers_lba_out_of_range() {
    let (t, _a, _aer, mut q) = two_namespaces();
    // Accepted (range checked against 1 MiB), then the namespace shrinks
    // before the I/O runs: a read and a write (data in through R2T).
    let read = q.rw_sqe(1, nvm::READ, 2000, 8);
    q.submit(&read);
    let write = q.rw_sqe(1, nvm::WRITE, 1500, 32);
    q.submit(&write);
    let Some(Owned::R2T { r2tl, .. }) = q.next_pdu() else {
        panic!("expected an R2T");
    };
    assert_eq!(r2tl, 16384);
    resized(&t, 1, 512 << 10);
    q.run_requests();
    q.expect_completion(read.cid(), Status::LBA_OUT_OF_RANGE.to_field(), "read");
    // The write's data arrives after the shrink: checked at its dispatch.
    q.send_last_data(write.cid(), &[3; 16384]);
    q.expect_completion(write.cid(), Status::LBA_OUT_OF_RANGE.to_field(), "write");
    // A write range-checked before the shrink and run after it.
    let mut w = q.rw_sqe(1, nvm::WRITE, 1000, 1);
    w.0[39] = sgl::IN_CAPSULE;
    w.0[32..36].copy_from_slice(&512u32.to_le_bytes());
    let mut b = Vec::new();
    pdu::encode_capsule_cmd(&mut b, q.digests, &w, &[9; 512]);
    resized(&t, 1, 1 << 20);
    assert_eq!(q.conn.receive(&b, Instant::now()), b.len());
    resized(&t, 1, 256 << 10);
    q.run_requests();
    match q.next_pdu() {
        Some(Owned::Resp(c)) => assert_eq!(c.status, Status::LBA_OUT_OF_RANGE.to_field()),
        other => panic!("expected the write's completion, got {other:?}"),
    }
    assert!(q.next_pdu().is_none());
    // Not a media error; the queue goes on.
    assert_eq!(t.health(NQN).media_errors.load(Ordering::Relaxed), 0);
    assert_eq!(q.rw(nvm::READ, 0, 8, &[]).data, vec![0; 4096]);
    assert!(!q.conn.is_closed());
}

#[test]
fn namespace_deleted_under_io_fails_its_commands_and_spares_the_rest() {
    let (t, mut a, aer, mut q) = two_namespaces();
    assert_eq!(
        q.rw_ns(2, nvm::WRITE, 0, 8, &[2; 4096]).cqe.unwrap().status,
        0
    );
    let old = t.subsystem(NQN).unwrap().namespaces[&2].clone();
    // A write waiting for its data, and a read accepted but not yet run.
    let write = q.rw_sqe(2, nvm::WRITE, 0, 16);
    q.submit(&write);
    assert!(matches!(q.next_pdu(), Some(Owned::R2T { .. })));
    let read = q.rw_sqe(2, nvm::READ, 0, 8);
    q.submit(&read);

    let mut cfg = config(&[]);
    cfg.subsystems[0].namespaces = vec![namespace(1, 1 << 20)];
    assert!(t.apply(&cfg).is_empty());
    assert!(old.is_removed());

    let inv = Status::INVALID_NS.to_field();
    q.run_requests();
    q.expect_completion(read.cid(), inv, "read");
    q.send_last_data(write.cid(), &[5; 8192]);
    q.expect_completion(write.cid(), inv, "write");
    // Later commands too; the other namespace and the queue go on.
    assert_eq!(q.rw_ns(2, nvm::READ, 0, 1, &[]).cqe.unwrap().status, inv);
    assert_eq!(q.rw(nvm::WRITE, 0, 1, &[1; 512]).cqe.unwrap().status, 0);
    assert!(!q.conn.is_closed());
    // The host is told, and Identify shows it inactive.
    expect_ns_notice(&mut a, aer, &[2]);
    assert_eq!(a.identify(0, 2).data, vec![0; 4096]);
    let list = a.identify(2, 0).data;
    assert_eq!(&list[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(t.health(NQN).media_errors.load(Ordering::Relaxed), 0);

    // Created again under the same ID: a new, empty namespace.
    resized(&t, 2, 1 << 20);
    assert_eq!(q.rw_ns(2, nvm::READ, 0, 8, &[]).data, vec![0; 4096]);
}

/// A write whose data is still arriving when its namespace is deleted and
/// created again under the same ID fails with Invalid Namespace once its
/// data is in; the new namespace never sees that data. A write for an ID
/// no namespace has is refused at once, its data never asked for.
#[test]
fn write_data_arriving_after_its_namespace_is_recreated_goes_nowhere() {
    let (t, _a, _aer, mut q) = two_namespaces();
    let inv = Status::INVALID_NS.to_field();
    // 256 KiB: two R2Ts, the deletion comes between them.
    let write = q.rw_sqe(2, nvm::WRITE, 0, 512);
    q.submit(&write);
    let Some(Owned::R2T { r2tl, .. }) = q.next_pdu() else {
        panic!("expected an R2T");
    };
    assert_eq!(r2tl, 128 << 10);
    let mut b = Vec::new();
    pdu::encode_h2c_data(
        &mut b,
        q.digests,
        write.cid(),
        write.cid(),
        0,
        &[7; 128 << 10],
        true,
    );
    q.send(&b);
    let Some(Owned::R2T { r2to, r2tl, .. }) = q.next_pdu() else {
        panic!("expected the second R2T");
    };
    assert_eq!((r2to, r2tl), (128 << 10, 128 << 10));
    // A write for an ID not served yet is refused before its data is
    // asked for.
    let early = q.rw_sqe(3, nvm::WRITE, 0, 16);
    q.submit(&early);
    q.expect_completion(early.cid(), inv, "write to an unknown NSID");

    let mut cfg = config(&[]);
    cfg.subsystems[0].namespaces = vec![namespace(1, 1 << 20)];
    assert!(t.apply(&cfg).is_empty());
    cfg.subsystems[0].namespaces = vec![
        namespace(1, 1 << 20),
        namespace(2, 1 << 20),
        namespace(3, 1 << 20),
    ];
    assert!(t.apply(&cfg).is_empty());

    let mut b = Vec::new();
    pdu::encode_h2c_data(
        &mut b,
        q.digests,
        write.cid(),
        write.cid(),
        128 << 10,
        &[7; 128 << 10],
        true,
    );
    q.send(&b);
    q.expect_completion(write.cid(), inv, "write to the deleted namespace");
    assert!(q.next_pdu().is_none());
    // The namespaces created since are empty, and serve new commands.
    assert_eq!(q.rw_ns(2, nvm::READ, 0, 512, &[]).data, vec![0; 256 << 10]);
    assert_eq!(q.rw_ns(3, nvm::READ, 0, 16, &[]).data, vec![0; 8192]);
    assert_eq!(
        q.rw_ns(2, nvm::WRITE, 0, 1, &[1; 512]).cqe.unwrap().status,
        0
    );
    assert!(!q.conn.is_closed());
    assert_eq!(t.health(NQN).media_errors.load(Ordering::Relaxed), 0);
}

/// A namespace deleted and created again under the same ID within one
/// configuration change (another UUID and NGUID on the same kind of
/// store) is a new namespace: empty, and the commands accepted against the
/// old one fail, including a write whose data arrives afterwards.
#[test]
fn namespace_replaced_within_one_apply_is_a_new_namespace() {
    let (t, mut a, aer, mut q) = two_namespaces();
    let inv = Status::INVALID_NS.to_field();
    assert_eq!(
        q.rw_ns(2, nvm::WRITE, 0, 8, &[2; 4096]).cqe.unwrap().status,
        0
    );
    let old = t.subsystem(NQN).unwrap().namespaces[&2].clone();
    let write = q.rw_sqe(2, nvm::WRITE, 0, 16);
    q.submit(&write);
    assert!(matches!(q.next_pdu(), Some(Owned::R2T { .. })));

    let mut cfg = config(&[]);
    let mut other = namespace(2, 1 << 20);
    other.uuid = [0xee; 16];
    other.nguid = [0xef; 16];
    cfg.subsystems[0].namespaces = vec![namespace(1, 1 << 20), other];
    assert!(t.apply(&cfg).is_empty());
    assert!(old.is_removed());

    q.send_last_data(write.cid(), &[5; 8192]);
    q.expect_completion(write.cid(), inv, "write to the replaced namespace");
    assert_eq!(q.rw_ns(2, nvm::READ, 0, 16, &[]).data, vec![0; 8192]);
    expect_ns_notice(&mut a, aer, &[2]);
    // The same identifiers again keep it, and its data.
    assert_eq!(
        q.rw_ns(2, nvm::WRITE, 0, 1, &[3; 512]).cqe.unwrap().status,
        0
    );
    let kept = t.subsystem(NQN).unwrap().namespaces[&2].clone();
    assert!(t.apply(&cfg).is_empty());
    assert!(!kept.is_removed());
    assert_eq!(q.rw_ns(2, nvm::READ, 0, 1, &[]).data, vec![3; 512]);
}

/// Deleting a namespace waits for the I/O running on it: once `apply`
/// returns, nothing touches the old backend.
#[test]
fn apply_waits_for_io_running_on_a_removed_namespace() {
    let t = target(&[]);
    let ns = t.subsystem(NQN).unwrap().namespaces[&1].clone();
    let done = std::sync::atomic::AtomicBool::new(false);
    let started = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            ns.run(|b| {
                started.wait();
                std::thread::sleep(Duration::from_millis(200));
                b.write_at(0, &[1; 512], false)?;
                done.store(true, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
        });
        started.wait();
        let mut cfg = config(&[]);
        cfg.subsystems[0].namespaces.clear();
        assert!(t.apply(&cfg).is_empty());
        assert!(
            done.load(Ordering::SeqCst),
            "apply returned before the I/O ended"
        );
    });
    let err = ns.run(|_| Ok(())).unwrap_err();
    assert!(dpu_nvmeof::target::is_namespace_removed(&err), "{err}");
    // Removing the whole subsystem retires its namespaces too.
    let t = target(&[]);
    let ns = t.subsystem(NQN).unwrap().namespaces[&1].clone();
    assert!(t.apply(&TargetConfig::default()).is_empty());
    assert!(ns.is_removed());
    // A resize keeps the namespace in service.
    let t = target(&[]);
    let ns = t.subsystem(NQN).unwrap().namespaces[&1].clone();
    resized(&t, 1, 2 << 20);
    assert!(!ns.is_removed());
    assert_eq!(ns.run(|b| Ok(b.len())).unwrap(), 2 << 20);
}

/// What a vectored-write transport sends, taking the lent slices a few at
/// a time and a few bytes at a time, is byte for byte what `take_output`
/// gives: large reads go from their own buffers, small ones are copied,
/// with and without digests; and the data is right.
#[test]
fn vectored_output_is_the_same_bytes_as_take_output() {
    use std::io::IoSlice;
    for digests in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        let t = target(&[]);
        resized(&t, 1, 4 << 20);
        let (_a1, c1) = Host::admin(&t, NQN, 0);
        let (_a2, c2) = Host::admin(&t, NQN, 0);
        let mut q1 = Host::io_queue(&t, c1, digests);
        let mut q2 = Host::io_queue(&t, c2, digests);
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8 ^ 0x5a).collect();
        // Written through another queue: q1 and q2 have the same history.
        let (_a0, c0) = Host::admin(&t, NQN, 0);
        let mut w = Host::io_queue(&t, c0, digests);
        for (k, chunk) in data.chunks(128 << 10).enumerate() {
            let r = w.rw(nvm::WRITE, k as u64 * 256, 256, chunk);
            assert_eq!(r.cqe.unwrap().status, 0);
        }
        // (first block, blocks): around the 16 KiB threshold, up to 128 KiB.
        let reads = [
            (0, 256),
            (8, 8),
            (100, 128),
            (300, 32),
            (400, 31),
            (1000, 33),
            (3, 1),
        ];
        let mut cids = Vec::new();
        for q in [&mut q1, &mut q2] {
            cids.clear();
            for &(slba, n) in &reads {
                let sqe = q.rw_sqe(1, nvm::READ, slba, n);
                cids.push(sqe.cid());
                q.submit(&sqe);
            }
            while let Some(r) = q.conn.next_request() {
                let done = r.execute();
                q.conn.complete(done);
            }
        }
        let whole = q1.conn.take_output();
        let mut lent = Vec::new();
        let mut step = 1usize;
        while q2.conn.has_output() {
            let mut iov = [IoSlice::new(&[]); 3];
            let n = q2.conn.output_slices(&mut iov);
            assert!(n > 0);
            let mut take = step;
            for s in &iov[..n] {
                let k = s.len().min(take);
                lent.extend_from_slice(&s[..k]);
                take -= k;
            }
            q2.conn.output_sent(step - take);
            step = step * 7 % 100_003 + 1;
        }
        let mut iov = [IoSlice::new(&[]); 3];
        assert_eq!(q2.conn.output_slices(&mut iov), 0);
        assert!(lent == whole, "digests {digests:?}: the bytes differ");
        // And it decodes to the data written.
        q1.inbox = whole;
        for (&(slba, n), &cid) in reads.iter().zip(&cids) {
            let at = slba as usize * 512;
            match q1.next_pdu() {
                Some(Owned::Data { cccid, data: d, .. }) => {
                    assert_eq!(cccid, cid);
                    assert_eq!(d, data[at..at + n as usize * 512]);
                }
                other => panic!("expected data, got {other:?}"),
            }
            assert!(matches!(q1.next_pdu(), Some(Owned::Resp(c)) if c.cid == cid && c.status == 0));
        }
        assert!(q1.next_pdu().is_none());
    }
}

/// SPDK's host, detaching, completes its own Asynchronous Event Requests
/// without telling the target and reuses their CIDs (the shutdown's
/// Property Get of CC takes the last AER's). The target drops the AER and
/// answers the new command; a CID held by any other command still
/// outstanding is answered with Command ID Conflict, and the connection
/// goes on either way. A shut-down controller completes no AER later.
#[test]
fn reused_cids_of_abandoned_aers_are_served_and_conflicts_answered() {
    let t = target(&[]);
    let (mut a, _) = Host::admin(&t, NQN, 0);
    let aers: Vec<u16> = (0..4).map(|i| park_aer(&mut a, i == 0)).collect();
    let reused = aers[3];
    let sqe = host::property_get(reused, spec::prop::CC, false);
    let c = a.command(sqe, &[], 0).cqe.expect("Property Get answered");
    assert_eq!(c.status, 0, "{c:?}");
    assert_eq!(c.dw0, host::CC_ENABLE, "the answer is the Property Get's");

    // An I/O command whose CID is still running elsewhere on the queue.
    let q = &mut Host::io_queue(&t, a.conn.controller_id().unwrap(), Digests::default());
    let w = q.rw_sqe(1, nvm::WRITE, 0, 8);
    q.submit(&w);
    assert!(
        matches!(q.next_pdu(), Some(Owned::R2T { .. })),
        "the write waits for its data"
    );
    let mut dup = q.rw_sqe(1, nvm::READ, 0, 1);
    dup.0[2..4].copy_from_slice(&w.cid().to_le_bytes());
    q.submit(&dup);
    q.expect_completion(w.cid(), Status::CID_CONFLICT.to_field(), "duplicate CID");
    q.send_last_data(w.cid(), &[7; 4096]);
    q.expect_completion(w.cid(), 0, "write");
    assert!(!q.conn.is_closed());

    // Shutdown: the AERs still parked are dropped, never completed.
    let before = a.conn.take_output().len();
    assert_eq!(before, 0);
    assert_eq!(a.prop_set_cc(host::CC_ENABLE | (1 << 14)).status, 0);
    let mut cfg = config(&[]);
    cfg.subsystems[0].namespaces.push(namespace(2, 1 << 20));
    assert!(t.apply(&cfg).is_empty());
    a.conn.tick(Instant::now() + Duration::from_millis(200));
    a.inbox.extend(a.conn.take_output());
    assert!(a.next_pdu().is_none(), "no AER completes after shutdown");
}

/// A host that sends commands without reading the answers: once the
/// unsent output reaches the budget the connection takes no more PDUs
/// (the transport keeps the rest), its PDU timer stands still, and it
/// takes them again once the output has gone out.
#[test]
fn output_over_its_budget_holds_back_input_without_timing_out() {
    use dpu_nvmeof::conn::{OUTPUT_BUDGET, PDU_TIMEOUT};
    let t = target(&[]);
    let (mut a, _) = Host::admin(&t, NQN, 0);
    let n = OUTPUT_BUDGET / 4096 + 64;
    let mut b = Vec::new();
    for i in 0..n {
        let mut id = host::command(admin::IDENTIFY, (i % 16) as u16 + 100);
        id.0[32..36].copy_from_slice(&4096u32.to_le_bytes());
        id.0[40] = 1;
        pdu::encode_capsule_cmd(&mut b, Digests::default(), &id, &[]);
    }
    let t0 = Instant::now();
    let used = a.conn.receive(&b, t0);
    assert!(used < b.len(), "all {n} commands taken");
    assert!(a.conn.held_back());
    let out = a.conn.output_len();
    assert!(
        (OUTPUT_BUDGET..OUTPUT_BUDGET + 8192).contains(&out),
        "{out} bytes held"
    );
    // Offered again while held back: nothing taken, and no timeout.
    assert_eq!(a.conn.receive(&b[used..], t0), 0);
    a.conn.tick(t0 + PDU_TIMEOUT * 2);
    assert!(!a.conn.is_closed(), "{:?}", a.conn.close_reason());
    // Drained: the rest goes in, every command answered.
    let mut answers = a.conn.take_output().len();
    assert!(!a.conn.held_back());
    assert_eq!(a.conn.receive(&b[used..], t0), b.len() - used);
    answers += a.conn.take_output().len();
    // Each answer: a C2HData PDU (24-byte header, 4 KiB) and a 24-byte
    // capsule response.
    assert_eq!(answers, n * (24 + 4096 + 24));
}

/// An I/O queue's Connect is checked against its controller and the
/// subsystem as they are now: another host ID, another listener, or a host
/// no longer allowed is refused.
#[test]
fn io_queue_connects_are_checked_against_the_controller_and_the_allow_list() {
    let t = target(&[HOST]);
    let (_a, cntlid) = Host::admin(&t, NQN, 0);
    let io_connect = |h: &mut Host, hostid: [u8; 16]| {
        let cid = h.cid();
        let sqe = host::connect(cid, 1, 32, 0);
        let data = host::connect_data(hostid, cntlid, NQN, HOST);
        h.command(sqe, &data, 0).cqe.expect("connect completes")
    };
    let invalid = Status::CONNECT_INVALID_PARAMETERS.to_field();
    let c = io_connect(&mut Host::new(&t, Digests::default()), [9; 16]);
    assert_eq!((c.status, c.dw0), (invalid, 1), "names HOSTID");
    // Another listener of the same subsystem.
    let mut cfg = config(&[HOST]);
    let other: SocketAddr = "127.0.0.1:4421".parse().unwrap();
    cfg.subsystems[0].listeners.push(other);
    assert!(t.apply(&cfg).is_empty());
    let c = io_connect(&mut Host::on(&t, Digests::default(), other), [0; 16]);
    assert_eq!((c.status, c.dw0), (invalid, 1 | 16 << 16), "names CNTLID");
    // The right one works.
    let c = io_connect(&mut Host::new(&t, Digests::default()), [0; 16]);
    assert_eq!(c.status, 0);
    let refused = t.stats().connects_refused.load(Ordering::Relaxed);
    assert_eq!(refused, 2);
}

/// Removing a host from the allow list, turning allow-any-host off, or
/// removing the listener a controller connected to ends that controller
/// and its queues (counted); other controllers go on.
#[test]
fn revoking_a_host_or_its_listener_disconnects_its_controller() {
    const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:0000-other";
    let closed_on_tick = |h: &mut Host| {
        h.conn.tick(Instant::now());
        h.conn.is_closed()
    };
    let revoked = |t: &Target| t.stats().controllers_revoked.load(Ordering::Relaxed);

    // Allow any host, then only another one.
    let t = target(&[]);
    let (mut a, cntlid) = Host::admin(&t, NQN, 0);
    let mut q = Host::io_queue(&t, cntlid, Digests::default());
    assert!(t.apply(&config(&[HOST, OTHER])).is_empty());
    assert!(!closed_on_tick(&mut a) && !closed_on_tick(&mut q));
    assert_eq!(revoked(&t), 0, "still allowed by name");
    assert!(t.apply(&config(&[OTHER])).is_empty());
    assert!(closed_on_tick(&mut a) && closed_on_tick(&mut q));
    assert_eq!(revoked(&t), 1);
    assert_eq!(t.controller_count(), 0);
    // A new admin queue is refused now.
    let mut h = Host::new(&t, Digests::default());
    assert_eq!(
        h.connect(0, 0xffff, NQN, HOST, 0).status,
        Status::CONNECT_INVALID_HOST.to_field()
    );

    // The listener removed: controllers that came through it end, those
    // of another listener stay.
    let t = target(&[]);
    let other: SocketAddr = "127.0.0.1:4421".parse().unwrap();
    let mut cfg = config(&[]);
    cfg.subsystems[0].listeners.push(other);
    assert!(t.apply(&cfg).is_empty());
    let (mut a, _) = Host::admin(&t, NQN, 0);
    let mut b = Host::on(&t, Digests::default(), other);
    assert_eq!(b.connect(0, 0xffff, NQN, HOST, 0).status, 0);
    cfg.subsystems[0].listeners = vec![listen()];
    assert!(t.apply(&cfg).is_empty());
    assert!(!closed_on_tick(&mut a));
    assert!(closed_on_tick(&mut b));
    assert_eq!(revoked(&t), 1);
}

/// A controller whose host disabled Keep Alive (KATO 0) still ends after
/// the idle timeout without a command on any of its queues; commands on
/// an I/O queue keep the whole controller alive, and with Keep Alive on
/// only its own timer counts.
#[test]
fn controllers_without_keep_alive_end_when_idle() {
    use dpu_nvmeof::conn::Timeouts;
    let t = target(&[]);
    let idle = Duration::from_secs(30);
    t.set_timeouts(Timeouts {
        idle,
        ..Timeouts::default()
    });
    let t0 = Instant::now();
    let (mut a, cntlid) = Host::admin(&t, NQN, 0);
    let mut q = Host::io_queue(&t, cntlid, Digests::default());
    // I/O at t0 + 20 s keeps the controller until t0 + 50 s.
    let mut b = Vec::new();
    let mut flush = host::command(nvm::FLUSH, 77);
    flush.0[4] = 1;
    pdu::encode_capsule_cmd(&mut b, Digests::default(), &flush, &[]);
    q.conn.receive(&b, t0 + Duration::from_secs(20));
    a.conn.tick(t0 + Duration::from_secs(40));
    assert!(!a.conn.is_closed(), "{:?}", a.conn.close_reason());
    a.conn.tick(t0 + Duration::from_secs(51));
    assert!(a.conn.is_closed());
    q.conn.tick(t0 + Duration::from_secs(51));
    assert!(q.conn.is_closed(), "its I/O queue goes with it");
    assert_eq!(t.stats().idle_timeouts.load(Ordering::Relaxed), 1);

    // With Keep Alive on (60 s here) the idle timeout does not apply.
    let (mut a, _) = Host::admin(&t, NQN, 60_000);
    let t1 = Instant::now();
    a.conn.tick(t1 + Duration::from_secs(45));
    assert!(!a.conn.is_closed());
    assert_eq!(t.stats().idle_timeouts.load(Ordering::Relaxed), 1);
}

/// A Write Zeroes over 32 MiB runs in chunks of `WORK_CHUNK`, one per call
/// of `execute_requests`, with a read that arrived after it answered in
/// between; the zeroes all land, and so do a Deallocate's over several
/// large ranges.
#[test]
fn zeroing_a_large_range_runs_in_chunks_with_other_commands_between() {
    use dpu_nvmeof::conn::WORK_CHUNK;
    let t = target(&[]);
    let mut cfg = config(&[]);
    cfg.subsystems[0].namespaces = vec![namespace(1, 64 << 20)];
    assert!(t.apply(&cfg).is_empty());
    let (_a, cntlid) = Host::admin(&t, NQN, 0);
    let mut q = Host::io_queue(&t, cntlid, Digests::default());
    let last = (64 << 20) / 512 - 8;
    assert_eq!(q.rw(nvm::WRITE, last, 8, &[9; 4096]).cqe.unwrap().status, 0);
    assert_eq!(q.rw(nvm::WRITE, 0, 8, &[9; 4096]).cqe.unwrap().status, 0);
    // Write Zeroes of blocks 0..65536 (32 MiB), then a read.
    let mut wz = q.sqe(nvm::WRITE_ZEROES);
    wz.0[4..8].copy_from_slice(&1u32.to_le_bytes());
    wz.0[48..50].copy_from_slice(&u16::MAX.to_le_bytes());
    wz.0[39] = 0;
    q.submit(&wz);
    let rd = q.rw_sqe(1, nvm::READ, last, 8);
    q.submit(&rd);
    let chunks = (32u64 << 20).div_ceil(WORK_CHUNK);
    let mut calls = 0;
    let mut order = Vec::new();
    while q.conn.has_requests() {
        q.conn.execute_requests(|_| {});
        calls += 1;
        q.inbox.extend(q.conn.take_output());
        while let Some(p) = q.next_pdu() {
            match p {
                Owned::Resp(c) => order.push(c.cid),
                Owned::Data { cccid, .. } => order.push(cccid),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!(calls, chunks, "one chunk per call");
    // The read's data (and its success) came before the zeroing ended.
    assert_eq!(order.first(), Some(&rd.cid()));
    assert_eq!(order.last(), Some(&wz.cid()));
    let r = q.rw(nvm::READ, 0, 8, &[]).data;
    assert!(r.iter().all(|&b| b == 0));
    let r = q.rw(nvm::READ, last, 8, &[]).data;
    assert!(r.iter().all(|&b| b == 9), "past the range: untouched");

    // Deallocate of 6 MiB at 32 MiB, 1 MiB at 40 MiB and 6 MiB at 48 MiB:
    // 13 MiB in four chunks, ranges split where a chunk ends.
    let mb = (1u64 << 20) / 512;
    for at in [32 * mb, 38 * mb - 8, 40 * mb, 54 * mb - 8, 54 * mb] {
        assert_eq!(q.rw(nvm::WRITE, at, 8, &[7; 4096]).cqe.unwrap().status, 0);
    }
    let mut dsm = q.sqe(nvm::DSM);
    dsm.0[4..8].copy_from_slice(&1u32.to_le_bytes());
    dsm.0[40] = 2; // three ranges
    dsm.0[44] = 1 << 2;
    let mut ranges = Vec::new();
    for (start, len) in [(32 * mb, 6 * mb), (40 * mb, mb), (48 * mb, 6 * mb)] {
        let mut r = [0u8; 16];
        r[4..8].copy_from_slice(&(len as u32).to_le_bytes());
        r[8..16].copy_from_slice(&start.to_le_bytes());
        ranges.extend_from_slice(&r);
    }
    let mut b = Vec::new();
    dsm.0[39] = sgl::IN_CAPSULE;
    dsm.0[32..36].copy_from_slice(&(ranges.len() as u32).to_le_bytes());
    pdu::encode_capsule_cmd(&mut b, Digests::default(), &dsm, &ranges);
    assert_eq!(q.conn.receive(&b, Instant::now()), b.len());
    let mut calls = 0;
    while q.conn.has_requests() {
        q.conn.execute_requests(|_| {});
        calls += 1;
    }
    assert_eq!(calls, 4);
    q.inbox.extend(q.conn.take_output());
    q.expect_completion(dsm.cid(), 0, "Deallocate");
    for (at, want) in [
        (32 * mb, 0),
        (38 * mb - 8, 0),
        (40 * mb, 0),
        (54 * mb - 8, 0),
        (54 * mb, 7),
    ] {
        let r = q.rw(nvm::READ, at, 8, &[]).data;
        assert!(r.iter().all(|&b| b == want), "block {at}: want {want}");
    }
}

/// The queues of one host NQN are limited across its controllers: the
/// Connect past the limit is refused with Controller Busy (counted), and
/// a queue that closes makes room again.
#[test]
fn queues_of_one_host_are_held_to_their_limit() {
    let t = target(&[]);
    t.set_max_connections_per_host(3);
    let (_a, cntlid) = Host::admin(&t, NQN, 0);
    let mut q1 = Host::io_queue(&t, cntlid, Digests::default());
    let _other_controller = Host::admin(&t, NQN, 0);
    let mut h = Host::new(&t, Digests::default());
    let c = h.connect(2, cntlid, NQN, HOST, 0);
    assert_eq!(c.status, Status::CONNECT_CONTROLLER_BUSY.to_field());
    assert_eq!(
        t.stats().connects_over_host_limit.load(Ordering::Relaxed),
        1
    );
    // Another host is not affected.
    let mut o = Host::new(&t, Digests::default());
    let c = o.connect(
        0,
        0xffff,
        NQN,
        "nqn.2014-08.org.nvmexpress:uuid:0000-other",
        0,
    );
    assert_eq!(c.status, 0);
    q1.conn.close("host went away");
    let mut h = Host::new(&t, Digests::default());
    assert_eq!(h.connect(2, cntlid, NQN, HOST, 0).status, 0);
}

mod auth {
    //! DH-HMAC-CHAP through whole connections: the Connect's AUTHREQ, the
    //! gate on an unauthenticated queue, Authentication Send/Receive on
    //! admin and I/O queues, refusals, counters.

    use super::*;
    use dpu_nvmeof::auth::dh::DhError;
    use dpu_nvmeof::auth::limit::AuthRate;
    use dpu_nvmeof::auth::pool::DhPool;
    use dpu_nvmeof::auth::{DhGroup, HashId, HostKeys, Secret};
    use dpu_nvmeof::host::{DhchapHost, HostAuthError};

    /// `vectors.py` in `src/auth` makes these: key 00..1f (SHA-256
    /// transformation) and key 64..93 (48 bytes, none).
    const SECRET: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    const CTRL_SECRET: &str =
        "DHHC-1:00:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOEhYaHiImKi4yNjo+QkZKTvGwQfg==:";
    /// Another 32-byte key (5a repeated), indicator 00.
    fn wrong() -> Secret {
        let key = [0x5au8; 32];
        let crc = {
            // CRC-32 (IEEE) computed bit by bit, independent of the crate's.
            let mut c = 0xffff_ffffu32;
            for b in key {
                c ^= u32::from(b);
                for _ in 0..8 {
                    c = if c & 1 != 0 {
                        c >> 1 ^ 0xedb8_8320
                    } else {
                        c >> 1
                    };
                }
            }
            !c
        };
        let mut raw = key.to_vec();
        raw.extend_from_slice(&crc.to_le_bytes());
        const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for c in raw.chunks(3) {
            let n = c
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
            for i in 0..=c.len() {
                s.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
            for _ in c.len()..3 {
                s.push('=');
            }
        }
        Secret::parse(&format!("DHHC-1:00:{s}:")).expect("valid")
    }

    fn secret(s: &str) -> Secret {
        Secret::parse(s).expect("valid secret")
    }

    fn auth_target(ctrl: bool, hashes: &[HashId], groups: &[DhGroup]) -> Target {
        let t = target(&[HOST]);
        let mut k = HostKeys::new(secret(SECRET), ctrl.then(|| secret(CTRL_SECRET)));
        k.hashes = hashes.to_vec();
        k.dh_groups = groups.to_vec();
        t.set_host_keys(NQN, HOST, Some(k));
        t
    }

    impl Host {
        fn auth_send(&mut self, msg: &[u8]) -> Cqe {
            let cid = self.cid();
            let sqe = host::auth_send(cid, msg.len() as u32);
            self.command(sqe, msg, 0).cqe.expect("auth send completes")
        }

        fn auth_receive(&mut self, al: u32) -> Reply {
            let cid = self.cid();
            let sqe = host::auth_receive(cid, al);
            self.command(sqe, &[], al)
        }

        /// Runs DH-HMAC-CHAP as the Linux host does.
        fn authenticate(&mut self, dh: &mut DhchapHost) -> Result<(), HostAuthError> {
            assert_eq!(self.auth_send(&dh.negotiate()).status, 0);
            let ch = self.auth_receive(4096);
            assert_eq!(ch.cqe.map(|c| c.status), Some(0));
            let reply = dh.reply(&ch.data)?;
            assert_eq!(self.auth_send(&reply).status, 0);
            let s1 = self.auth_receive(4096);
            match dh.success1(&s1.data) {
                Ok(Some(s2)) => {
                    assert_eq!(self.auth_send(&s2).status, 0);
                    Ok(())
                }
                Ok(None) => Ok(()),
                Err(HostAuthError::ControllerResponse) => {
                    self.auth_send(&dh.failure2());
                    Err(HostAuthError::ControllerResponse)
                }
                Err(e) => Err(e),
            }
        }
    }

    fn health(t: &Target) -> (u64, u64) {
        let h = t.health(NQN);
        (
            h.auth_succeeded.load(Ordering::Relaxed),
            h.auth_failed.load(Ordering::Relaxed),
        )
    }

    const ATR: u32 = 1 << 17;

    #[test]
    fn admin_and_io_queues_authenticate_before_anything_else() {
        let t = auth_target(true, &[HashId::Sha512], &[DhGroup::Ffdhe2048]);
        let mut a = Host::new(&t, Digests::default());
        let c = a.connect(0, 0xffff, NQN, HOST, 0);
        assert_eq!(c.status, 0);
        assert_eq!(c.dw0 & ATR, ATR, "AUTHREQ.ATR set");
        let cntlid = c.dw0 as u16;
        // Nothing but authentication before it completes.
        let required = Status::AUTH_REQUIRED.to_field();
        assert_eq!(a.prop_set_cc(host::CC_ENABLE).status, required);
        assert_eq!(a.prop_get(spec::prop::CSTS, false).status, required);
        let mut dh = DhchapHost::new(HOST, NQN, secret(SECRET), Some(secret(CTRL_SECRET)), 1);
        assert_eq!(a.authenticate(&mut dh), Ok(()));
        assert_eq!(a.prop_set_cc(host::CC_ENABLE).status, 0);
        assert_eq!(a.prop_get(spec::prop::CSTS, false).dw0 & 1, 1);
        // An I/O queue authenticates on its own.
        let mut q = Host::new(&t, Digests::default());
        let c = q.connect(1, cntlid, NQN, HOST, 0);
        assert_eq!((c.status, c.dw0 & ATR), (0, ATR));
        assert_eq!(
            q.rw(nvm::READ, 0, 1, &[]).cqe.map(|c| c.status),
            Some(required)
        );
        let mut dh = DhchapHost::new(HOST, NQN, secret(SECRET), None, 2);
        assert_eq!(q.authenticate(&mut dh), Ok(()));
        let w = q.rw(nvm::WRITE, 0, 1, &[0xab; 512]);
        assert_eq!(w.cqe.map(|c| c.status), Some(0));
        assert_eq!(q.rw(nvm::READ, 0, 1, &[]).data, vec![0xab; 512]);
        assert_eq!(health(&t), (2, 0));
    }

    #[test]
    fn every_hash_with_null_and_ffdhe_groups() {
        for hash in HashId::ALL {
            for group in [DhGroup::Null, DhGroup::Ffdhe2048, DhGroup::Ffdhe4096] {
                let t = auth_target(false, &[hash], &[group]);
                let mut a = Host::new(&t, Digests::default());
                assert_eq!(a.connect(0, 0xffff, NQN, HOST, 0).status, 0);
                let mut dh = DhchapHost::new(HOST, NQN, secret(SECRET), None, 7);
                assert_eq!(a.authenticate(&mut dh), Ok(()), "{hash:?} {group:?}");
                assert_eq!(a.prop_set_cc(host::CC_ENABLE).status, 0);
            }
        }
    }

    #[test]
    fn wrong_or_missing_secrets_are_refused_and_counted() {
        let t = auth_target(true, &HashId::ALL, &[DhGroup::Ffdhe2048]);
        // A wrong host secret: Failure1, then the connection closes.
        let mut a = Host::new(&t, Digests::default());
        assert_eq!(a.connect(0, 0xffff, NQN, HOST, 0).status, 0);
        let mut dh = DhchapHost::new(HOST, NQN, wrong(), None, 1);
        assert!(matches!(
            a.authenticate(&mut dh),
            Err(HostAuthError::Refused { explanation: 1, .. })
        ));
        assert!(a.conn.is_closed());
        assert_eq!(health(&t), (0, 1));
        // A wrong controller secret: the host sends Failure2.
        let mut a = Host::new(&t, Digests::default());
        assert_eq!(a.connect(0, 0xffff, NQN, HOST, 0).status, 0);
        let mut dh = DhchapHost::new(HOST, NQN, secret(SECRET), Some(wrong()), 1);
        assert_eq!(
            a.authenticate(&mut dh),
            Err(HostAuthError::ControllerResponse)
        );
        assert!(a.conn.is_closed());
        assert_eq!(health(&t), (0, 2));
        // Authentication required of every host, this one without a
        // secret: the Connect is refused.
        const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:0000-other";
        assert!(t.apply(&config(&[HOST, OTHER])).is_empty());
        t.set_auth_required(NQN, Some(true));
        let mut b = Host::new(&t, Digests::default());
        let c = b.connect(0, 0xffff, NQN, OTHER, 0);
        assert_eq!(
            (c.status, c.dw0),
            (Status::CONNECT_INVALID_HOST.to_field(), 1 | 512 << 16)
        );
        assert_eq!(health(&t), (0, 3));
        // A host with a secret that disconnects without authenticating
        // counts as a failure.
        t.set_auth_required(NQN, None);
        let mut d = Host::new(&t, Digests::default());
        assert_eq!(d.connect(0, 0xffff, NQN, HOST, 0).dw0 & ATR, ATR);
        d.conn.close("peer went away");
        assert_eq!(health(&t), (0, 4));
        // Not required: no ATR, commands go through.
        t.set_auth_required(NQN, Some(false));
        let (_, _) = Host::admin(&t, NQN, 0);
        // The secret removed: the default (required when a secret exists)
        // no longer asks.
        t.set_auth_required(NQN, None);
        t.set_host_keys(NQN, HOST, None);
        let mut c = Host::new(&t, Digests::default());
        assert_eq!(c.connect(0, 0xffff, NQN, HOST, 0).dw0 & ATR, 0);
    }

    #[test]
    fn authentication_commands_check_their_fields() {
        let t = auth_target(false, &HashId::ALL, &[DhGroup::Null]);
        // Before Connect: a command sequence error.
        let mut h = Host::new(&t, Digests::default());
        let n = DhchapHost::new(HOST, NQN, secret(SECRET), None, 1).negotiate();
        assert_eq!(h.auth_send(&n).status, Status::COMMAND_SEQUENCE.to_field());
        assert_eq!(h.connect(0, 0xffff, NQN, HOST, 0).status, 0);
        let invalid = Status::INVALID_FIELD.to_field();
        // Wrong SECP.
        let cid = h.cid();
        let mut sqe = host::auth_send(cid, n.len() as u32);
        sqe.0[43] = 0xea;
        assert_eq!(h.command(sqe, &n, 0).cqe.map(|c| c.status), Some(invalid));
        // TL not the data's length.
        let cid = h.cid();
        let mut sqe = host::auth_send(cid, n.len() as u32);
        sqe.0[44..48].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(h.command(sqe, &n, 0).cqe.map(|c| c.status), Some(invalid));
        // An allocation length too small for the challenge: refused, the
        // transaction goes on.
        assert_eq!(h.auth_send(&n).status, 0);
        assert_eq!(h.auth_receive(16).cqe.map(|c| c.status), Some(invalid));
        let mut dh = DhchapHost::new(HOST, NQN, secret(SECRET), None, 1);
        assert_eq!(h.authenticate(&mut dh), Ok(()));
        // Malformed messages: Failure1 with "incorrect payload", closed.
        let mut h = Host::new(&t, Digests::default());
        assert_eq!(h.connect(0, 0xffff, NQN, HOST, 0).status, 0);
        assert_eq!(h.auth_send(&[0, 0, 0, 0, 1, 0, 0, 9]).status, 0);
        let f = h.auth_receive(64);
        assert_eq!(&f.data[..8], &[0, 0xf1, 0, 0, 0, 0, 1, 6]);
        assert!(h.conn.is_closed());
    }

    #[test]
    fn a_changed_secret_takes_effect_on_the_next_authentication() {
        let t = auth_target(false, &HashId::ALL, &[DhGroup::Null]);
        let mut a = Host::new(&t, Digests::default());
        assert_eq!(a.connect(0, 0xffff, NQN, HOST, 0).status, 0);
        let mut dh = DhchapHost::new(HOST, NQN, secret(SECRET), None, 1);
        assert_eq!(a.authenticate(&mut dh), Ok(()));
        // The secret changes; the queue stays authenticated until the host
        // authenticates again, which the old secret no longer passes.
        t.set_host_keys(NQN, HOST, Some(HostKeys::new(wrong(), None)));
        assert_eq!(a.prop_set_cc(host::CC_ENABLE).status, 0);
        let mut dh = DhchapHost::new(HOST, NQN, secret(SECRET), None, 2);
        assert!(matches!(
            a.authenticate(&mut dh),
            Err(HostAuthError::Refused { .. })
        ));
        assert!(a.conn.is_closed());
        // A new queue with the new secret passes.
        let mut b = Host::new(&t, Digests::default());
        assert_eq!(b.connect(0, 0xffff, NQN, HOST, 0).status, 0);
        let mut dh = DhchapHost::new(HOST, NQN, wrong(), None, 1);
        assert_eq!(b.authenticate(&mut dh), Ok(()));
        assert_eq!(health(&t), (2, 1));
    }

    #[test]
    fn authentication_data_through_r2t_and_disconnect_before_it() {
        let t = auth_target(false, &HashId::ALL, &[DhGroup::Null]);
        let mut h = Host::new(&t, Digests::default());
        assert_eq!(h.connect(0, 0xffff, NQN, HOST, 0).status, 0);
        let mut dh = DhchapHost::new(HOST, NQN, secret(SECRET), None, 1);
        // The AUTH_Negotiate's data asked for with R2T, not in the capsule.
        let n = dh.negotiate();
        let cid = h.cid();
        let mut sqe = host::auth_send(cid, n.len() as u32);
        sqe.0[39] = sgl::TRANSPORT;
        h.submit(&sqe);
        match h.next_pdu() {
            Some(Owned::R2T {
                cccid, r2to, r2tl, ..
            }) => {
                assert_eq!((cccid, r2to, r2tl as usize), (cid, 0, n.len()));
            }
            other => panic!("expected an R2T, got {other:?}"),
        }
        h.send_last_data(cid, &n);
        h.expect_completion(cid, 0, "auth send");
        let ch = h.auth_receive(4096);
        let reply = dh.reply(&ch.data).expect("reply");
        assert_eq!(h.auth_send(&reply).status, 0);
        assert!(dh.success1(&h.auth_receive(4096).data).is_ok());
        assert_eq!(h.prop_set_cc(host::CC_ENABLE).status, 0);
        // More than any message: refused before its data is asked for.
        let cid = h.cid();
        let mut sqe = host::auth_send(cid, 9000);
        sqe.0[39] = sgl::TRANSPORT;
        h.submit(&sqe);
        h.expect_completion(cid, Status::INVALID_FIELD.to_field(), "oversized auth send");
        // A Disconnect is taken before authentication.
        let mut d = Host::new(&t, Digests::default());
        assert_eq!(d.connect(0, 0xffff, NQN, HOST, 0).status, 0);
        let cid = d.cid();
        let mut sqe = host::command(spec::FABRICS, cid);
        sqe.0[4] = spec::fctype::DISCONNECT;
        sqe.0[39] = 0;
        assert_eq!(d.command(sqe, &[], 0).cqe.map(|c| c.status), Some(0));
        assert!(d.conn.is_closed());
    }

    #[test]
    fn a_queue_that_does_not_authenticate_in_time_is_closed() {
        let t = auth_target(false, &HashId::ALL, &[DhGroup::Null]);
        let mut h = Host::new(&t, Digests::default());
        assert_eq!(h.connect(0, 0xffff, NQN, HOST, 0).status, 0);
        h.conn.tick(Instant::now() + Duration::from_secs(1));
        assert!(!h.conn.is_closed());
        h.conn.tick(Instant::now() + Duration::from_secs(31));
        assert!(h.conn.is_closed());
        assert_eq!(
            h.conn.close_reason(),
            Some("authentication not completed in time")
        );
        assert_eq!(health(&t), (0, 1));
    }

    /// Runs the connection's DH jobs on a real pool and hands each result
    /// back; returns how many ran.
    fn run_dh_jobs(h: &mut Host, pool: &DhPool) -> usize {
        let mut n = 0;
        while let Some((cid, job)) = h.conn.next_dh_job() {
            let (tx, rx) = std::sync::mpsc::channel();
            pool.submit(job, move |r| {
                let _ = tx.send(r);
            })
            .expect("room in the queue");
            let r = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("the job ran");
            h.conn.complete_dh(cid, r, Instant::now());
            h.inbox.extend(h.conn.take_output());
            n += 1;
        }
        n
    }

    fn refused(t: &Target) -> (u64, u64) {
        let h = t.health(NQN);
        (
            h.auth_rate_limited.load(Ordering::Relaxed),
            h.auth_busy.load(Ordering::Relaxed),
        )
    }

    /// Waits for the completion (and data) of the command just sent,
    /// after its DH job ran.
    fn answer(h: &mut Host) -> Reply {
        let mut reply = Reply::default();
        while let Some(p) = h.next_pdu() {
            match p {
                Owned::Data { data, success, .. } => {
                    reply.data.extend(data);
                    if success {
                        reply.cqe = Some(Cqe::new(0, Status::SUCCESS));
                    }
                }
                Owned::Resp(c) => reply.cqe = Some(c),
                other => panic!("unexpected {other:?}"),
            }
        }
        reply
    }

    #[test]
    fn dh_work_left_to_the_transport_completes_its_command_later() {
        let t = auth_target(false, &[HashId::Sha256], &[DhGroup::Ffdhe2048]);
        let pool = DhPool::new(1, 4).unwrap();
        let mut a = Host::new(&t, Digests::default());
        a.conn.set_dh_offload(true);
        assert_eq!(a.connect(0, 0xffff, NQN, HOST, 0).status, 0);
        let mut dh = DhchapHost::new(HOST, NQN, secret(SECRET), None, 1);
        assert_eq!(a.auth_send(&dh.negotiate()).status, 0);
        assert!(a.conn.next_dh_job().is_none(), "negotiation needs no DH");
        // The Receive that returns the Challenge waits for the key pair.
        let ch = a.auth_receive(4096);
        assert!(ch.cqe.is_none(), "answered before its DH job ran");
        assert!(a.conn.awaits_dh());
        // A second authentication command meanwhile is out of sequence.
        assert_eq!(
            a.auth_receive(4096).cqe.map(|c| c.status),
            Some(Status::COMMAND_SEQUENCE.to_field())
        );
        assert_eq!(run_dh_jobs(&mut a, &pool), 1);
        assert!(!a.conn.awaits_dh());
        let ch = answer(&mut a);
        assert_eq!(ch.cqe.map(|c| c.status), Some(0));
        // The Send carrying the Reply waits for the shared secret.
        let reply = dh.reply(&ch.data).expect("a challenge");
        let cid = a.cid();
        let sqe = host::auth_send(cid, reply.len() as u32);
        assert!(a.command(sqe, &reply, 0).cqe.is_none());
        assert_eq!(run_dh_jobs(&mut a, &pool), 1);
        let sent = answer(&mut a);
        assert_eq!(sent.cqe.map(|c| (c.cid, c.status)), Some((cid, 0)));
        let s1 = a.auth_receive(4096);
        assert_eq!(dh.success1(&s1.data), Ok(None));
        assert_eq!(a.prop_set_cc(host::CC_ENABLE).status, 0);
        assert_eq!(health(&t), (1, 0));
    }

    #[test]
    fn a_dh_job_the_pool_refuses_fails_the_authentication_cleanly() {
        let t = auth_target(false, &[HashId::Sha256], &[DhGroup::Ffdhe2048]);
        let mut a = Host::new(&t, Digests::default());
        a.conn.set_dh_offload(true);
        assert_eq!(a.connect(0, 0xffff, NQN, HOST, 0).status, 0);
        let mut dh = DhchapHost::new(HOST, NQN, secret(SECRET), None, 1);
        assert_eq!(a.auth_send(&dh.negotiate()).status, 0);
        assert!(a.auth_receive(4096).cqe.is_none());
        let (cid, job) = a.conn.next_dh_job().expect("a key pair to make");
        drop(job);
        a.conn.complete_dh(cid, Err(DhError::Busy), Instant::now());
        a.inbox.extend(a.conn.take_output());
        // The Receive completes with an AUTH_Failure1.
        let got = answer(&mut a);
        assert_eq!(got.cqe.map(|c| c.status), Some(0));
        assert!(matches!(
            dh.reply(&got.data),
            Err(HostAuthError::Refused { explanation: 1, .. })
        ));
        assert!(a.conn.is_closed());
        assert_eq!((health(&t), refused(&t)), ((0, 0), (0, 1)));
    }

    #[test]
    fn a_dh_result_for_a_closed_connection_is_dropped() {
        let t = auth_target(false, &[HashId::Sha256], &[DhGroup::Ffdhe2048]);
        let mut a = Host::new(&t, Digests::default());
        a.conn.set_dh_offload(true);
        assert_eq!(a.connect(0, 0xffff, NQN, HOST, 0).status, 0);
        let dh = DhchapHost::new(HOST, NQN, secret(SECRET), None, 1);
        assert_eq!(a.auth_send(&dh.negotiate()).status, 0);
        assert!(a.auth_receive(4096).cqe.is_none());
        let (cid, job) = a.conn.next_dh_job().expect("a key pair to make");
        a.conn.close("peer went away");
        assert!(!a.conn.awaits_dh());
        a.conn.complete_dh(cid, job.run(), Instant::now());
        // A result for a command that never existed changes nothing either.
        a.conn.complete_dh(999, Err(DhError::Busy), Instant::now());
        assert!(a.conn.take_output().is_empty());
        assert!(a.conn.is_closed());
        assert_eq!(health(&t), (0, 1), "abandoned, counted once");
    }

    #[test]
    fn attempts_over_the_rate_are_refused_before_any_dh_work() {
        let t = auth_target(false, &[HashId::Sha256], &[DhGroup::Ffdhe2048]);
        t.set_auth_rate(AuthRate {
            per_sec: 0.001,
            burst: 2,
            sources: 16,
        });
        // Two wrong attempts from one address use its burst.
        for _ in 0..2 {
            let mut a = Host::new(&t, Digests::default());
            assert_eq!(a.connect(0, 0xffff, NQN, HOST, 0).status, 0);
            let mut dh = DhchapHost::new(HOST, NQN, wrong(), None, 1);
            assert!(a.authenticate(&mut dh).is_err());
        }
        assert_eq!((health(&t), refused(&t)), ((0, 2), (0, 0)));
        // The third is refused with no DH job, even with the right secret.
        let mut a = Host::new(&t, Digests::default());
        a.conn.set_dh_offload(true);
        assert_eq!(a.connect(0, 0xffff, NQN, HOST, 0).status, 0);
        let mut dh = DhchapHost::new(HOST, NQN, secret(SECRET), None, 1);
        assert_eq!(a.auth_send(&dh.negotiate()).status, 0);
        let got = a.auth_receive(4096);
        assert!(a.conn.next_dh_job().is_none(), "no DH work for a refusal");
        assert!(matches!(
            dh.reply(&got.data),
            Err(HostAuthError::Refused { explanation: 1, .. })
        ));
        assert!(a.conn.is_closed());
        assert_eq!((health(&t), refused(&t)), ((0, 2), (1, 0)));
    }

    #[test]
    fn successful_attempts_give_their_token_back() {
        let t = auth_target(false, &[HashId::Sha256], &[DhGroup::Null]);
        t.set_auth_rate(AuthRate {
            per_sec: 0.001,
            burst: 1,
            sources: 16,
        });
        for i in 0..5 {
            let mut a = Host::new(&t, Digests::default());
            assert_eq!(a.connect(0, 0xffff, NQN, HOST, 0).status, 0);
            let mut dh = DhchapHost::new(HOST, NQN, secret(SECRET), None, i);
            assert_eq!(a.authenticate(&mut dh), Ok(()), "attempt {i}");
        }
        assert_eq!((health(&t), refused(&t)), ((5, 0), (0, 0)));
    }
}
