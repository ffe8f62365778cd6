//! Fuzzes the handshake and what follows it with digests on: the ICReq's
//! fields (format version, alignment, digests, MAXR2T) and the Fabrics
//! Connect's (queue ID, SQSIZE, attributes, keep-alive, controller ID,
//! host ID, NQNs, the SGL describing its data) come from the input, for an
//! admin queue or an I/O queue of a live controller; the rest of the input
//! is PDUs (header and data digests made right or left wrong, as the input
//! says) split into reads at arbitrary points. The target must answer or
//! terminate, never panic, never hand out more than the budgets allow, and
//! the controller it already had must stay usable.
//! Run with `fuzz/run.sh handshake` from the repository root.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dpu_nvmeof::conn::R2T_BUDGET;
use dpu_nvmeof::host;
use dpu_nvmeof::pdu::{self, Digests, IcReq};
use dpu_nvmeof::{BackendSpec, Connection, NamespaceConfig, SubsystemConfig, Target, TargetConfig};

const NQN: &str = "nqn.2024-01.io.example:fuzz";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz";

/// Bytes taken from the front of the input, zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let n = N.min(self.0.len());
        b[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        b
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    /// An NQN: one of the known ones, or up to 255 fuzzed bytes.
    fn nqn(&mut self, known: &str) -> Vec<u8> {
        match self.u8() % 4 {
            0 | 1 => known.as_bytes().to_vec(),
            2 => dpu_nvmeof::spec::DISCOVERY_NQN.as_bytes().to_vec(),
            _ => {
                let n = usize::from(self.u8());
                let n = n.min(self.0.len());
                let v = self.0[..n].to_vec();
                self.0 = &self.0[n..];
                v
            }
        }
    }
}

/// Feeds `bytes` and runs what they started; output is taken as sent.
fn drive(c: &mut Connection, bytes: &[u8], pending: &mut Vec<u8>, now: Instant) {
    pending.extend_from_slice(bytes);
    let used = c.receive(pending, now);
    pending.drain(..used);
    c.execute_requests(|c| drop(c.take_output()));
    c.tick(now);
    drop(c.take_output());
    assert!(
        c.write_buffers_reserved() <= R2T_BUDGET,
        "a connection reserved past its budget"
    );
}

fn target() -> Target {
    let t = Target::new();
    let errors = t.apply(&TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            serial: "fuzz".into(),
            model: "fuzz".into(),
            allow_any_host: false,
            allowed_hosts: [HOST.to_string()].into_iter().collect(),
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
    t
}

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let t = target();
    let local: SocketAddr = "127.0.0.1:4420".parse().unwrap();
    let now = Instant::now();
    // A well-behaved controller, to check it outlives the fuzzed queue.
    let mut admin = Connection::new(t.clone(), local, "127.0.0.1:1".parse().unwrap());
    let mut b = Vec::new();
    host::ic_req(&mut b, Digests::default());
    let sqe = host::connect(0, 0, 32, 0);
    let d = host::connect_data([7; 16], 0xffff, NQN, HOST);
    pdu::encode_capsule_cmd(&mut b, Digests::default(), &sqe, &d);
    pdu::encode_capsule_cmd(&mut b, Digests::default(), &host::enable(1), &[]);
    drive(&mut admin, &b, &mut Vec::new(), now);
    let cntlid = admin.controller_id().expect("admin queue connected");

    let mut input = Input(data);
    let flags = input.u8();
    let digests = Digests {
        header: flags & 1 != 0,
        data: flags & 2 != 0,
    };
    let mut b = Vec::new();
    pdu::encode_ic_req(
        &mut b,
        &IcReq {
            pfv: if flags & 4 != 0 { input.u16() } else { 0 },
            hpda: if flags & 8 != 0 { input.u8() } else { 0 },
            digests,
            maxr2t: input.u32(),
        },
    );
    let qid = if flags & 16 != 0 { input.u16() } else { 1 };
    let entries = input.u16();
    let kato = input.u32();
    let mut sqe = host::connect(0, qid, entries, kato);
    sqe.0[46] = input.u8(); // CATTR
    if flags & 32 != 0 {
        // The SGL: length, type, address as the input says.
        sqe.0[32..36].copy_from_slice(&input.u32().to_le_bytes());
        sqe.0[39] = input.u8();
    }
    let cntl = if flags & 64 != 0 { input.u16() } else { cntlid };
    let hostid: [u8; 16] = if flags & 128 != 0 {
        input.bytes()
    } else {
        [7; 16]
    };
    let subnqn = input.nqn(NQN);
    let hostnqn = input.nqn(HOST);
    let mut d = host::connect_data(hostid, cntl, "", "");
    let n = subnqn.len().min(256);
    d[256..256 + n].copy_from_slice(&subnqn[..n]);
    let n = hostnqn.len().min(256);
    d[512..512 + n].copy_from_slice(&hostnqn[..n]);
    pdu::encode_capsule_cmd(&mut b, digests, &sqe, &d);

    let mut c = Connection::new(t.clone(), local, "127.0.0.1:2".parse().unwrap());
    let mut pending = Vec::new();
    drive(&mut c, &b, &mut pending, now);

    // The rest: PDUs, split into reads, with time moving on.
    let (split, rest) = match input.0 {
        [a, rest @ ..] => (usize::from(*a).max(1), rest),
        [] => (1, &[][..]),
    };
    for (i, chunk) in rest.chunks(split).enumerate() {
        let at = now + Duration::from_millis(i as u64 * 50);
        drive(&mut c, chunk, &mut pending, at);
    }
    drop(c);
    assert_eq!(
        t.write_buffers_reserved(),
        0,
        "reservations outlive their connection"
    );
    // The other controller still answers a Keep Alive.
    let mut b = Vec::new();
    pdu::encode_capsule_cmd(
        &mut b,
        Digests::default(),
        &host::command(dpu_nvmeof::spec::admin::KEEP_ALIVE, 9),
        &[],
    );
    admin.receive(&b, now);
    if t.controller_count() > 0 && !admin.is_closed() {
        let out = admin.take_output();
        assert!(!out.is_empty(), "the other controller stopped answering");
    }
}
