//! Fuzzes the command decoder behind the framing: arbitrary bytes arrive on
//! an admin queue and an I/O queue of a live controller (after a valid
//! ICReq, Connect and enable), split into reads at arbitrary points. The
//! target must answer or terminate, never panic, and the other queue and
//! the target must stay usable. Run with `fuzz/run.sh connection` from
//! the repository root.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::time::Instant;

use dpu_nvmeof::host;
use dpu_nvmeof::pdu::{self, Digests};
use dpu_nvmeof::{BackendSpec, Connection, NamespaceConfig, SubsystemConfig, Target, TargetConfig};

const NQN: &str = "nqn.2024-01.io.example:fuzz";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz";

fn drive(c: &mut Connection, bytes: &[u8], pending: &mut Vec<u8>) {
    pending.extend_from_slice(bytes);
    let used = c.receive(pending, Instant::now());
    pending.drain(..used);
    while let Some(r) = c.next_request() {
        let done = r.execute();
        c.complete(done);
    }
    c.tick(Instant::now());
    // Drain the output as a vectored-write transport does, a part at a time.
    let mut step = bytes.len() % 997 + 1;
    while c.has_output() {
        let mut iov = [IoSlice::new(&[]); 2];
        let n = c.output_slices(&mut iov);
        assert!(n > 0, "output left but nothing lent");
        let lent: usize = iov[..n].iter().map(|s| s.len()).sum();
        c.output_sent(step.min(lent));
        step = step * 3 % 65_537 + 1;
    }
}

fn connect(t: &Target, qid: u16, cntlid: u16) -> Connection {
    let local: SocketAddr = "127.0.0.1:4420".parse().unwrap();
    let mut c = Connection::new(t.clone(), local, "127.0.0.1:1".parse().unwrap());
    let mut b = Vec::new();
    host::ic_req(&mut b, Digests::default());
    let sqe = host::connect(0, qid, 64, 0);
    let data = host::connect_data([0; 16], cntlid, NQN, HOST);
    pdu::encode_capsule_cmd(&mut b, Digests::default(), &sqe, &data);
    if qid == 0 {
        pdu::encode_capsule_cmd(&mut b, Digests::default(), &host::enable(1), &[]);
    }
    let mut p = Vec::new();
    drive(&mut c, &b, &mut p);
    c
}

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let t = Target::new();
    let errors = t.apply(&TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            serial: "fuzz".into(),
            model: "fuzz".into(),
            allow_any_host: true,
            allowed_hosts: Default::default(),
            max_namespaces: 4,
            namespaces: vec![NamespaceConfig {
                eui64: None,
                nsid: 1,
                block_size: 512,
                uuid: [1; 16],
                nguid: [2; 16],
                backend: BackendSpec::Ram { size: 1 << 20 },
                qos: Default::default(),
            }],
            listeners: vec!["127.0.0.1:4420".parse().unwrap()],
            host_qos: Default::default(),
        }],
        discovery: None,
    });
    assert!(errors.is_empty());
    let mut admin = connect(&t, 0, 0xffff);
    let cntlid = admin.controller_id().expect("admin queue connected");
    let mut io = connect(&t, 1, cntlid);
    assert!(io.queue_id() == Some(1));
    // First byte: where to split the input between reads; second: which
    // queue gets it.
    let (split, to_admin, rest) = match data {
        [a, b, rest @ ..] => (usize::from(*a).max(1), b & 1 == 1, rest),
        _ => return,
    };
    let (victim, other) = if to_admin {
        (&mut admin, &mut io)
    } else {
        (&mut io, &mut admin)
    };
    let mut pending = Vec::new();
    for chunk in rest.chunks(split) {
        drive(victim, chunk, &mut pending);
    }
    // The other queue answers a Keep Alive / Flush as long as the
    // controller lives.
    if !other.is_closed() && !victim.is_closed() {
        let mut b = Vec::new();
        // Flush of namespace 1 on the I/O queue, Keep Alive on the admin queue.
        let mut sqe = host::command(if to_admin { 0x00 } else { 0x18 }, 0xfff0);
        sqe.0[4] = 1;
        pdu::encode_capsule_cmd(&mut b, Digests::default(), &sqe, &[]);
        let mut p = Vec::new();
        drive(other, &b, &mut p);
    }
}
