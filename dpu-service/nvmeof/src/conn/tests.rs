//! Write data that comes through R2T: checked before it is asked for, and
//! asked for within the memory budgets. A host built from the crate's own
//! host-side codec drives connections byte for byte; the budgets are read
//! from the connection and the target, never inferred from timing.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Connection, Pending, MAX_TRANSFER, R2T_BUDGET};
use crate::host;
use crate::pdu::{self, ControllerPdu, Digests, Limits};
use crate::spec::{admin, nvm, Sqe, Status, DISCOVERY_NQN};
use crate::target::{ram_subsystem, Target, TargetConfig};

const NQN: &str = "nqn.2024-01.io.example:budget";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0000-budget";
/// The largest write, in 512-byte blocks.
const BIG_BLOCKS: u32 = MAX_TRANSFER / 512;
const DG: Digests = Digests {
    header: false,
    data: false,
};

fn target() -> Target {
    let t = Target::new();
    let errors = t.apply(&TargetConfig {
        subsystems: vec![ram_subsystem(NQN, 16 << 20, vec![listen()])],
        discovery: None,
    });
    assert!(errors.is_empty(), "{errors:?}");
    t
}

fn listen() -> SocketAddr {
    "127.0.0.1:4420".parse().expect("address")
}

/// What the target sent, owned.
#[derive(Debug, PartialEq, Eq)]
enum Got {
    R2T { cid: u16, off: u32, len: u32 },
    Resp { cid: u16, status: u16 },
    Data { cid: u16, data: Vec<u8> },
    Other,
}

/// One connection and the bytes it sent that the test has not read yet.
struct Queue {
    conn: Connection,
    inbox: Vec<u8>,
}

impl Queue {
    /// A connection past its ICReq.
    fn open(t: &Target) -> Queue {
        let peer = "127.0.0.1:50000".parse().expect("address");
        let mut q = Queue {
            conn: Connection::new(t.clone(), listen(), peer),
            inbox: Vec::new(),
        };
        let mut b = Vec::new();
        host::ic_req(&mut b, DG);
        q.send(&b);
        q.inbox.clear();
        q
    }

    /// A queue connected to `subnqn` (an admin queue, enabled, when
    /// `cntlid` is 0xFFFF) with room for `entries` commands.
    fn connect(t: &Target, qid: u16, cntlid: u16, subnqn: &str, entries: u16) -> Queue {
        let mut q = Queue::open(t);
        let data = host::connect_data([0; 16], cntlid, subnqn, HOST);
        q.capsule(&host::connect(0xfff0, qid, entries, 0), &data);
        if qid == 0 {
            q.capsule(&host::enable(0xfff1), &[]);
        }
        for g in q.got() {
            assert!(matches!(g, Got::Resp { status: 0, .. }), "{g:?}");
        }
        q
    }

    /// Hands `bytes` to the connection, runs its block requests and keeps
    /// its output.
    fn send(&mut self, bytes: &[u8]) {
        assert_eq!(self.conn.receive(bytes, Instant::now()), bytes.len());
        while let Some(r) = self.conn.next_request() {
            let done = r.execute();
            self.conn.complete(done);
        }
        self.inbox.extend(self.conn.take_output());
    }

    /// Sends a command capsule with `data` in it.
    fn capsule(&mut self, sqe: &Sqe, data: &[u8]) {
        let mut b = Vec::new();
        pdu::encode_capsule_cmd(&mut b, DG, sqe, data);
        self.send(&b);
    }

    /// Sends the data an R2T asked for, from the command's whole `data`.
    fn h2c(&mut self, cid: u16, off: u32, len: u32, data: &[u8]) {
        let mut b = Vec::new();
        let part = &data[off as usize..(off + len) as usize];
        pdu::encode_h2c_data(&mut b, DG, cid, cid, off, part, true);
        self.send(&b);
    }

    /// Everything the target sent since the last call.
    fn got(&mut self) -> Vec<Got> {
        let limits = Limits {
            digests: DG,
            max_data: 1 << 20,
        };
        let mut all = Vec::new();
        let mut at = 0;
        while let Some((p, n)) =
            pdu::decode_controller(&self.inbox[at..], &limits).expect("valid controller PDU")
        {
            at += n;
            all.push(match p {
                ControllerPdu::R2T {
                    cccid, r2to, r2tl, ..
                } => Got::R2T {
                    cid: cccid,
                    off: r2to,
                    len: r2tl,
                },
                ControllerPdu::CapsuleResp { cqe } => Got::Resp {
                    cid: cqe.cid,
                    status: cqe.status,
                },
                ControllerPdu::C2HData { cccid, data, .. } => Got::Data {
                    cid: cccid,
                    data: data.to_vec(),
                },
                _ => Got::Other,
            });
        }
        assert_eq!(at, self.inbox.len(), "whole PDUs");
        self.inbox.clear();
        all
    }

    /// Bytes of data buffers the connection holds for writes still
    /// receiving data.
    fn receive_buffers(&self) -> usize {
        self.conn
            .pending
            .values()
            .map(|p| match p {
                Pending::Receiving { buf, .. } => buf.capacity(),
                _ => 0,
            })
            .sum()
    }
}

/// An enabled admin queue of the I/O subsystem, and an I/O queue `qid` of
/// its controller with room for `entries` commands.
fn io_queue(t: &Target, qid: u16, entries: u16) -> (Queue, Queue) {
    let a = Queue::connect(t, 0, 0xffff, NQN, 32);
    let cntlid = a.conn.controller_id().expect("connected");
    let q = Queue::connect(t, qid, cntlid, NQN, entries);
    (a, q)
}

/// A Read or Write of `blocks` blocks at `slba` of namespace `nsid`, its
/// data to come through R2T (a Write's) or in C2HData (a Read's).
fn rw(opcode: u8, cid: u16, nsid: u32, slba: u64, blocks: u32) -> Sqe {
    let mut sqe = host::command(opcode, cid);
    sqe.0[4..8].copy_from_slice(&nsid.to_le_bytes());
    sqe.0[40..48].copy_from_slice(&slba.to_le_bytes());
    sqe.0[48..50].copy_from_slice(&((blocks - 1) as u16).to_le_bytes());
    sqe.0[32..36].copy_from_slice(&(blocks * 512).to_le_bytes());
    sqe
}

/// Capsules of `cids` writes of the largest size, each at its own range
/// (modulo the namespace's 32).
fn big_writes(cids: std::ops::Range<u16>) -> Vec<u8> {
    let mut b = Vec::new();
    for cid in cids {
        let slba = u64::from(cid % 32) * u64::from(BIG_BLOCKS);
        let sqe = rw(nvm::WRITE, cid, 1, slba, BIG_BLOCKS);
        pdu::encode_capsule_cmd(&mut b, DG, &sqe, &[]);
    }
    b
}

/// The commands whose first R2T is in `got`, in order.
fn first_r2ts(got: &[Got]) -> Vec<u16> {
    got.iter()
        .filter_map(|g| match g {
            Got::R2T { cid, off: 0, .. } => Some(*cid),
            _ => None,
        })
        .collect()
}

fn waits(t: &Target) -> u64 {
    t.stats().write_buffer_waits.load(Ordering::Relaxed)
}

/// A host that announces a thousand of the largest writes on one queue
/// and sends no data holds the connection's budget in reservations and
/// no data buffer at all.
#[test]
fn announced_writes_without_data_hold_the_budget_not_memory() {
    let t = target();
    let (_a, mut q) = io_queue(&t, 1, 1024);
    q.send(&big_writes(0..1000));
    let fit = (R2T_BUDGET / u64::from(MAX_TRANSFER)) as u16;
    let got = q.got();
    assert_eq!(first_r2ts(&got), (0..fit).collect::<Vec<_>>());
    assert_eq!(got.len(), usize::from(fit), "R2Ts only: {:?}", &got[..12]);
    assert_eq!(q.conn.write_buffers_reserved(), R2T_BUDGET);
    assert_eq!(t.write_buffers_reserved(), R2T_BUDGET);
    assert_eq!(q.conn.budget.waiting(), 1000 - usize::from(fit));
    assert_eq!(waits(&t), 1000 - u64::from(fit));
    assert_eq!(q.conn.pending.len(), 1000);
    assert_eq!(q.receive_buffers(), 0, "no data, no buffer");

    // The first data of a write takes its buffer, and only its.
    let data = vec![9; MAX_TRANSFER as usize];
    q.h2c(0, 0, 128 << 10, &data);
    assert_eq!(q.receive_buffers(), MAX_TRANSFER as usize);

    q.conn.close("test");
    assert_eq!(q.conn.write_buffers_reserved(), 0);
    assert_eq!(t.write_buffers_reserved(), 0);
    assert_eq!(q.receive_buffers(), 0);
}

/// Writes beyond the budget get their R2Ts in order as earlier writes
/// complete, and every byte lands where it was written.
#[test]
fn writes_beyond_the_budget_wait_their_turn_and_land_intact() {
    let t = target();
    let (_a, mut q) = io_queue(&t, 1, 64);
    let n: u16 = 12;
    let fit = (R2T_BUDGET / u64::from(MAX_TRANSFER)) as u16;
    let pattern = |cid: u16| -> Vec<u8> {
        (0..MAX_TRANSFER)
            .map(|i| (i.wrapping_mul(31) ^ (u32::from(cid) * 17)) as u8)
            .collect()
    };
    q.send(&big_writes(0..n));
    let mut todo: VecDeque<Got> = q.got().into();
    assert_eq!(
        first_r2ts(todo.make_contiguous()),
        (0..fit).collect::<Vec<_>>()
    );
    let (mut asked, mut done) = (Vec::new(), Vec::new());
    while let Some(g) = todo.pop_front() {
        match g {
            Got::R2T { cid, off, len } => {
                if off == 0 {
                    // A waiting write is asked for its data only once
                    // enough earlier writes completed.
                    assert!(
                        done.len() + usize::from(fit) > usize::from(cid),
                        "write {cid} asked for after {} completions",
                        done.len()
                    );
                    asked.push(cid);
                }
                assert!(q.conn.write_buffers_reserved() <= R2T_BUDGET);
                q.h2c(cid, off, len, &pattern(cid));
                todo.extend(q.got());
            }
            Got::Resp { cid, status } => {
                assert_eq!(status, 0, "write {cid}");
                done.push(cid);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(asked, (0..n).collect::<Vec<_>>(), "in arrival order");
    assert_eq!(done.len(), usize::from(n));
    assert_eq!(t.write_buffers_reserved(), 0);
    assert_eq!(waits(&t), u64::from(n - fit));

    for cid in 0..n {
        let slba = u64::from(cid) * u64::from(BIG_BLOCKS);
        q.capsule(&rw(nvm::READ, 100 + cid, 1, slba, BIG_BLOCKS), &[]);
        let mut data = Vec::new();
        for g in q.got() {
            match g {
                Got::Data { data: d, .. } => data.extend(d),
                Got::Resp { status, .. } => assert_eq!(status, 0),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(data == pattern(cid), "write {cid} read back");
    }
}

/// All connections of a target share its budget: one connection's
/// completions let another's waiting writes go on, and a connection gives
/// its reservations back when it closes or is dropped.
#[test]
fn connections_share_the_target_budget_and_give_it_back() {
    let t = target();
    let big = u64::from(MAX_TRANSFER);
    t.set_write_buffer_budget(R2T_BUDGET + 4 * big);
    assert_eq!(t.write_buffer_budget(), R2T_BUDGET + 4 * big);
    let (a, mut q1) = io_queue(&t, 1, 64);
    let cntlid = a.conn.controller_id().expect("connected");
    let mut q2 = Queue::connect(&t, 2, cntlid, NQN, 64);

    q1.send(&big_writes(0..8));
    assert_eq!(first_r2ts(&q1.got()), (0..8).collect::<Vec<_>>());
    q2.send(&big_writes(8..16));
    assert_eq!(first_r2ts(&q2.got()), (8..12).collect::<Vec<_>>());
    assert_eq!(q2.conn.write_buffers_reserved(), 4 * big);
    assert_eq!(t.write_buffers_reserved(), R2T_BUDGET + 4 * big);

    // The first queue's writes complete; the second's waiting writes are
    // asked for at its next turn (bytes or a tick).
    let data = vec![1; MAX_TRANSFER as usize];
    for cid in 0..8 {
        for off in (0..MAX_TRANSFER).step_by(128 << 10) {
            q1.h2c(cid, off, 128 << 10, &data);
        }
    }
    assert_eq!(q1.conn.write_buffers_reserved(), 0);
    assert!(first_r2ts(&q2.got()).is_empty());
    q2.conn.tick(Instant::now());
    q2.send(&[]);
    assert_eq!(first_r2ts(&q2.got()), (12..16).collect::<Vec<_>>());
    assert_eq!(t.write_buffers_reserved(), 8 * big);

    // Closing gives the budget back; so does dropping without a close.
    q1.send(&big_writes(20..26));
    assert_eq!(first_r2ts(&q1.got()), (20..24).collect::<Vec<_>>());
    assert_eq!(t.write_buffers_reserved(), 12 * big, "the budget is full");
    q1.conn.close("test");
    drop(q1);
    assert_eq!(t.write_buffers_reserved(), 8 * big);
    drop(q2);
    assert_eq!(t.write_buffers_reserved(), 0);
}

/// A write that would fail once its data is in fails before: its status
/// without an R2T, and nothing reserved.
#[test]
fn doomed_writes_are_answered_without_r2t() {
    let t = target();
    let (_a, mut q) = io_queue(&t, 1, 64);
    let blocks = (16u64 << 20) / 512;
    let mut sgl_short = rw(nvm::WRITE, 4, 1, 0, 16);
    sgl_short.0[32..36].copy_from_slice(&4096u32.to_le_bytes());
    let compare = rw(0x05, 5, 1, 0, 16);
    let mut dsm = host::command(nvm::DSM, 6);
    dsm.0[4] = 1;
    dsm.0[40] = 2; // three ranges: 48 bytes
    dsm.0[32..36].copy_from_slice(&32u32.to_le_bytes());
    let cases = [
        (rw(nvm::WRITE, 1, 9, 0, 16), Status::INVALID_NS),
        (
            rw(nvm::WRITE, 2, 1, blocks - 8, 16),
            Status::LBA_OUT_OF_RANGE,
        ),
        (
            rw(nvm::WRITE, 3, 1, u64::MAX - 4, 16),
            Status::LBA_OUT_OF_RANGE,
        ),
        (sgl_short, Status::SGL_LENGTH_INVALID),
        (compare, Status::INVALID_OPCODE),
        (dsm, Status::SGL_LENGTH_INVALID),
    ];
    for (sqe, st) in cases {
        q.capsule(&sqe, &[]);
        assert_eq!(
            q.got(),
            [Got::Resp {
                cid: sqe.cid(),
                status: st.to_field()
            }]
        );
    }
    assert_eq!((t.write_buffers_reserved(), waits(&t)), (0, 0));
    assert!(q.conn.pending.is_empty());
}

/// The discovery controller and admin queues read no host data, and a
/// queue takes none before its Connect: such commands get their answer
/// without an R2T. A Connect's own data may still come through one.
#[test]
fn commands_that_read_no_data_are_answered_without_r2t() {
    let t = target();
    let mut d = Queue::connect(&t, 0, 0xffff, DISCOVERY_NQN, 32);
    let mut set_kato = host::command(admin::SET_FEATURES, 1);
    set_kato.0[40] = 0x0f;
    set_kato.0[32..36].copy_from_slice(&4096u32.to_le_bytes());
    let mut ns_mgmt = host::command(0x0d, 2);
    ns_mgmt.0[32..36].copy_from_slice(&MAX_TRANSFER.to_le_bytes());
    for (sqe, st) in [
        (set_kato, Status::SUCCESS),
        (ns_mgmt, Status::INVALID_OPCODE),
    ] {
        d.capsule(&sqe, &[]);
        assert_eq!(
            d.got(),
            [Got::Resp {
                cid: sqe.cid(),
                status: st.to_field()
            }]
        );
    }
    let (mut a, _) = io_queue(&t, 1, 8);
    a.capsule(&rw(nvm::WRITE, 3, 1, 0, 16), &[]);
    assert_eq!(
        a.got(),
        [Got::Resp {
            cid: 3,
            status: Status::INVALID_OPCODE.to_field()
        }],
        "Create I/O Submission Queue has the Write's opcode"
    );

    let mut fresh = Queue::open(&t);
    fresh.capsule(&rw(nvm::WRITE, 4, 1, 0, 16), &[]);
    assert_eq!(
        fresh.got(),
        [Got::Resp {
            cid: 4,
            status: Status::COMMAND_SEQUENCE.to_field()
        }]
    );
    let mut connect = host::connect(5, 0, 32, 0);
    connect.0[39] = crate::spec::sgl::TRANSPORT;
    fresh.capsule(&connect, &[]);
    assert_eq!(
        fresh.got(),
        [Got::R2T {
            cid: 5,
            off: 0,
            len: host::CONNECT_DATA_LEN as u32
        }]
    );
    let data = host::connect_data([0; 16], 0xffff, NQN, HOST);
    fresh.h2c(5, 0, data.len() as u32, &data);
    assert!(matches!(fresh.got()[..], [Got::Resp { cid: 5, status: 0 }]));
    assert!(fresh.conn.controller_id().is_some());
    assert_eq!((t.write_buffers_reserved(), waits(&t)), (0, 0));
}

/// Reads over their namespace's QoS limit wait in the connection, which
/// says until when (and claims no work before then); writes over their
/// host's limit likewise; when the time comes they run, and the limiters
/// count the wait.
#[test]
fn requests_over_a_qos_limit_wait_and_say_until_when() {
    use crate::qos::QosLimits;
    use crate::qos::QosScope;

    let t = Target::new();
    let mut sc = ram_subsystem(NQN, 16 << 20, vec![listen()]);
    sc.namespaces[0].qos = QosLimits {
        read_iops: 100,
        ..QosLimits::default()
    };
    sc.host_qos.insert(
        HOST.into(),
        QosLimits {
            write_iops: 50,
            ..QosLimits::default()
        },
    );
    let errors = t.apply(&TargetConfig {
        subsystems: vec![sc],
        discovery: None,
    });
    assert!(errors.is_empty(), "{errors:?}");
    let (_a, mut q) = io_queue(&t, 1, 32);

    // Ten reads at once: at 100 a second the first starts, the rest wait
    // 10 ms apart.
    let mut b = Vec::new();
    for cid in 0..10u16 {
        pdu::encode_capsule_cmd(&mut b, DG, &rw(nvm::READ, cid, 1, u64::from(cid), 1), &[]);
    }
    let start = Instant::now();
    assert_eq!(q.conn.receive(&b, start), b.len());
    let mut ran = 0;
    while ran < 10 {
        ran += q.conn.execute_requests(|_| {});
        if ran < 10 {
            let until = q.conn.throttled_until().expect("held back by the limit");
            assert!(!q.conn.has_requests(), "no work before the limit allows it");
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
        }
    }
    let took = start.elapsed();
    assert!(took >= std::time::Duration::from_millis(85), "{took:?}");
    assert_eq!(q.conn.throttled_until(), None);
    q.inbox.extend(q.conn.take_output());
    let answered: std::collections::BTreeSet<u16> = q
        .got()
        .iter()
        .filter_map(|g| match g {
            Got::Data { cid, .. } | Got::Resp { cid, status: 0 } => Some(*cid),
            _ => None,
        })
        .collect();
    assert_eq!(answered.len(), 10);

    // Writes of 512 bytes in the capsule: the host's limit holds them.
    let mut b = Vec::new();
    for cid in 20..24u16 {
        let mut sqe = rw(nvm::WRITE, cid, 1, u64::from(cid), 1);
        sqe.0[39] = crate::spec::sgl::IN_CAPSULE;
        pdu::encode_capsule_cmd(&mut b, DG, &sqe, &[7u8; 512]);
    }
    assert_eq!(q.conn.receive(&b, Instant::now()), b.len());
    let before = Instant::now();
    assert_eq!(q.conn.execute_requests(|_| {}), 1);
    let until = q.conn.throttled_until().expect("the host's limit");
    // 20 ms a write at 50 a second, less the 5 ms burst.
    let wait = until.saturating_duration_since(before);
    assert!(wait >= std::time::Duration::from_millis(14), "{wait:?}");

    let stats = t.qos_stats();
    let ns = stats
        .iter()
        .find(|s| s.scope == QosScope::Namespace(1))
        .expect("the namespace's limiter");
    // Nine waited, unless a late wake let the next through at once.
    assert!((1..=9).contains(&ns.throttled_commands), "{ns:?}");
    // Counted first in line: the time the limit held the queue back.
    assert!(ns.throttled_time >= std::time::Duration::from_millis(80));
    let host = stats
        .iter()
        .find(|s| s.scope == QosScope::Host(HOST.into()))
        .expect("the host's limiter");
    assert_eq!(host.limits.write_iops, 50);
}

/// A turn set by the transport bounds the requests one call runs; the
/// rest wait for the next call, in order.
#[test]
fn a_turn_bounds_the_requests_of_one_call() {
    let t = target();
    let (_a, mut q) = io_queue(&t, 1, 32);
    let mut b = Vec::new();
    for cid in 0..10u16 {
        pdu::encode_capsule_cmd(&mut b, DG, &rw(nvm::READ, cid, 1, u64::from(cid), 1), &[]);
    }
    assert_eq!(q.conn.receive(&b, Instant::now()), b.len());
    q.conn.set_turn(4);
    assert_eq!(q.conn.execute_requests(|_| {}), 4);
    assert!(q.conn.has_requests());
    assert_eq!(q.conn.execute_requests(|_| {}), 4);
    q.conn.set_turn(usize::MAX);
    assert_eq!(q.conn.execute_requests(|_| {}), 2);
    assert!(!q.conn.has_requests());
    q.inbox.extend(q.conn.take_output());
    let order: Vec<u16> = q
        .got()
        .iter()
        .filter_map(|g| match g {
            Got::Data { cid, .. } => Some(*cid),
            _ => None,
        })
        .collect();
    assert_eq!(order, (0..10).collect::<Vec<_>>());
}

/// The target's own limit holds every namespace and host together, and
/// is reported with an empty subsystem NQN.
#[test]
fn the_targets_limit_holds_everything_it_serves() {
    use crate::qos::{QosLimits, QosScope};

    let t = target();
    t.set_qos(QosLimits {
        iops: 100,
        ..QosLimits::default()
    });
    assert_eq!(t.qos().iops, 100);
    let (_a, mut q) = io_queue(&t, 1, 32);
    let mut b = Vec::new();
    for cid in 0..3u16 {
        pdu::encode_capsule_cmd(&mut b, DG, &rw(nvm::READ, cid, 1, u64::from(cid), 1), &[]);
    }
    assert_eq!(q.conn.receive(&b, Instant::now()), b.len());
    assert_eq!(q.conn.execute_requests(|_| {}), 1);
    assert!(q.conn.throttled_until().is_some());
    // A new configuration leaves the target's limit as it is.
    let errors = t.apply(&TargetConfig {
        subsystems: vec![ram_subsystem(NQN, 16 << 20, vec![listen()])],
        discovery: None,
    });
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(t.qos().iops, 100);
    let stats = t.qos_stats();
    let all = stats
        .iter()
        .find(|s| s.scope == QosScope::Target)
        .expect("the target's limiter");
    assert_eq!((all.subnqn.as_str(), all.limits.iops), ("", 100));
    t.set_qos(QosLimits::default());
    assert_eq!(q.conn.execute_requests(|_| {}), 2);
}
