//! The harness of the protocol tests: a host on one connection to a
//! [`Target`], written with the crate's own host-side PDU codec, that
//! sends commands and reads back what the controller sent, byte for byte;
//! and the configurations the tests start from.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Instant;

use dpu_nvmeof::host;
use dpu_nvmeof::pdu::{self, ControllerPdu, Digests, Limits};
use dpu_nvmeof::spec::{self, admin, sgl, Cqe, Sqe, Status};
use dpu_nvmeof::{BackendSpec, Connection, NamespaceConfig, SubsystemConfig, Target, TargetConfig};

pub const NQN: &str = "nqn.2024-01.io.example:vol";
pub const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0000-host";

pub fn listen() -> SocketAddr {
    "127.0.0.1:4420".parse().unwrap()
}

pub fn namespace(nsid: u32, size: u64) -> NamespaceConfig {
    NamespaceConfig {
        eui64: None,
        nsid,
        block_size: 512,
        uuid: [nsid as u8; 16],
        nguid: [0x40 + nsid as u8; 16],
        backend: BackendSpec::Ram { size },
        qos: Default::default(),
    }
}

pub fn config(hosts: &[&str]) -> TargetConfig {
    TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            serial: "SN1".into(),
            model: "test".into(),
            allow_any_host: hosts.is_empty(),
            allowed_hosts: hosts.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(),
            max_namespaces: 32,
            namespaces: vec![namespace(1, 1 << 20)],
            listeners: vec![listen()],
            host_qos: Default::default(),
        }],
        discovery: None,
    }
}

/// What the controller sent back for one command.
#[derive(Debug, Default)]
pub struct Reply {
    pub cqe: Option<Cqe>,
    pub data: Vec<u8>,
}

/// A host on one connection.
pub struct Host {
    pub conn: Connection,
    pub digests: Digests,
    pub next_cid: u16,
    pub inbox: Vec<u8>,
}

impl Host {
    pub fn new(target: &Target, digests: Digests) -> Host {
        Host::on(target, digests, listen())
    }

    /// A host connected to the listener at `local`.
    pub fn on(target: &Target, digests: Digests, local: SocketAddr) -> Host {
        let peer: SocketAddr = "127.0.0.1:50000".parse().unwrap();
        let mut h = Host {
            conn: Connection::new(target.clone(), local, peer),
            digests,
            next_cid: 1,
            inbox: Vec::new(),
        };
        let mut b = Vec::new();
        host::ic_req(&mut b, digests);
        h.send(&b);
        match h.next_pdu() {
            Some(Owned::IcResp(r)) => {
                assert_eq!(r.digests, digests);
                assert_eq!(r.cpda, 0);
            }
            other => panic!("expected ICResp, got {other:?}"),
        }
        h
    }

    pub fn send(&mut self, bytes: &[u8]) {
        let used = self.conn.receive(bytes, Instant::now());
        assert_eq!(used, bytes.len(), "whole PDUs are consumed");
        while let Some(r) = self.conn.next_request() {
            let done = r.execute();
            self.conn.complete(done);
        }
        self.inbox.extend(self.conn.take_output());
    }

    pub fn next_pdu(&mut self) -> Option<Owned> {
        let limits = Limits {
            digests: self.digests,
            max_data: 1 << 20,
        };
        let (p, n) = pdu::decode_controller(&self.inbox, &limits).expect("valid controller PDU")?;
        let owned = match p {
            ControllerPdu::IcResp(r) => Owned::IcResp(r),
            ControllerPdu::CapsuleResp { cqe } => Owned::Resp(cqe),
            ControllerPdu::C2HData {
                cccid,
                datao,
                data,
                last,
                success,
                data_digest_ok,
            } => {
                assert!(data_digest_ok);
                {
                    assert!(last || !success);
                    Owned::Data {
                        cccid,
                        datao,
                        data: data.to_vec(),
                        success,
                    }
                }
            }
            ControllerPdu::R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            } => Owned::R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            },
            ControllerPdu::TermReq { fes, .. } => Owned::Term { fes },
        };
        self.inbox.drain(..n);
        Some(owned)
    }

    pub fn sqe(&mut self, opcode: u8) -> Sqe {
        self.next_cid += 1;
        host::command(opcode, self.next_cid - 1)
    }

    pub fn cid(&mut self) -> u16 {
        self.next_cid += 1;
        self.next_cid - 1
    }

    /// Sends `sqe` with `data` (in the capsule if small, else through
    /// R2T/H2CData) and collects the reply.
    pub fn command(&mut self, mut sqe: Sqe, data: &[u8], read_len: u32) -> Reply {
        let cid = sqe.cid();
        let mut b = Vec::new();
        if !data.is_empty() && data.len() <= 8192 {
            sqe.0[39] = sgl::IN_CAPSULE;
            sqe.0[32..36].copy_from_slice(&(data.len() as u32).to_le_bytes());
            pdu::encode_capsule_cmd(&mut b, self.digests, &sqe, data);
        } else {
            let len = if data.is_empty() {
                read_len
            } else {
                data.len() as u32
            };
            sqe.0[32..36].copy_from_slice(&len.to_le_bytes());
            pdu::encode_capsule_cmd(&mut b, self.digests, &sqe, &[]);
        }
        self.send(&b);
        let mut reply = Reply::default();
        while let Some(p) = self.next_pdu() {
            match p {
                Owned::R2T {
                    cccid,
                    ttag,
                    r2to,
                    r2tl,
                } => {
                    assert_eq!(cccid, cid);
                    let mut b = Vec::new();
                    let chunk = &data[r2to as usize..(r2to + r2tl) as usize];
                    // Two PDUs per R2T, the second one LAST.
                    let half = chunk.len() / 2;
                    pdu::encode_h2c_data(
                        &mut b,
                        self.digests,
                        cid,
                        ttag,
                        r2to,
                        &chunk[..half],
                        false,
                    );
                    pdu::encode_h2c_data(
                        &mut b,
                        self.digests,
                        cid,
                        ttag,
                        r2to + half as u32,
                        &chunk[half..],
                        true,
                    );
                    self.send(&b);
                }
                Owned::Data {
                    cccid,
                    datao,
                    data,
                    success,
                    ..
                } => {
                    assert_eq!(cccid, cid);
                    assert_eq!(datao as usize, reply.data.len());
                    reply.data.extend(data);
                    if success {
                        reply.cqe = Some(Cqe::new(cid, Status::SUCCESS));
                        return reply;
                    }
                }
                Owned::Resp(c) => {
                    assert_eq!(c.cid, cid);
                    reply.cqe = Some(c);
                    return reply;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        reply
    }

    pub fn connect(
        &mut self,
        qid: u16,
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
        kato_ms: u32,
    ) -> Cqe {
        let cid = self.cid();
        let sqe = host::connect(cid, qid, 32, kato_ms);
        let data = host::connect_data([0; 16], cntlid, subnqn, hostnqn);
        self.command(sqe, &data, 0).cqe.expect("connect completes")
    }

    pub fn prop_set_cc(&mut self, v: u32) -> Cqe {
        let cid = self.cid();
        let sqe = host::property_set(cid, spec::prop::CC, v);
        self.command(sqe, &[], 0).cqe.unwrap()
    }

    pub fn prop_get(&mut self, ofst: u32, eight: bool) -> Cqe {
        let cid = self.cid();
        let sqe = host::property_get(cid, ofst, eight);
        self.command(sqe, &[], 0).cqe.unwrap()
    }

    /// Admin queue connected and enabled; returns the controller ID.
    pub fn admin(target: &Target, subnqn: &str, kato_ms: u32) -> (Host, u16) {
        let mut h = Host::new(target, Digests::default());
        let c = h.connect(0, 0xffff, subnqn, HOST, kato_ms);
        assert_eq!(c.status, 0, "connect: {c:?}");
        let cntlid = c.dw0 as u16;
        assert_eq!(h.prop_set_cc(host::CC_ENABLE).status, 0);
        assert_eq!(h.prop_get(spec::prop::CSTS, false).dw0 & 1, 1, "ready");
        (h, cntlid)
    }

    pub fn io_queue(target: &Target, cntlid: u16, digests: Digests) -> Host {
        let mut h = Host::new(target, digests);
        let c = h.connect(1, cntlid, NQN, HOST, 0);
        assert_eq!(c.status, 0, "I/O connect: {c:?}");
        h
    }

    pub fn rw(&mut self, opcode: u8, slba: u64, blocks: u32, data: &[u8]) -> Reply {
        self.rw_ns(1, opcode, slba, blocks, data)
    }

    pub fn rw_ns(&mut self, nsid: u32, opcode: u8, slba: u64, blocks: u32, data: &[u8]) -> Reply {
        let sqe = self.rw_sqe(nsid, opcode, slba, blocks);
        self.command(sqe, data, blocks * 512)
    }

    /// A Read or Write of `blocks` 512-byte blocks, its data (if any) to go
    /// through R2T.
    pub fn rw_sqe(&mut self, nsid: u32, opcode: u8, slba: u64, blocks: u32) -> Sqe {
        let mut sqe = self.sqe(opcode);
        sqe.0[4..8].copy_from_slice(&nsid.to_le_bytes());
        sqe.0[40..48].copy_from_slice(&slba.to_le_bytes());
        sqe.0[48..50].copy_from_slice(&((blocks - 1) as u16).to_le_bytes());
        sqe.0[32..36].copy_from_slice(&(blocks * 512).to_le_bytes());
        sqe
    }

    /// Hands `sqe` (no in-capsule data) to the connection without running
    /// the block request it makes: the test decides when that happens.
    pub fn submit(&mut self, sqe: &Sqe) {
        let mut b = Vec::new();
        pdu::encode_capsule_cmd(&mut b, self.digests, sqe, &[]);
        assert_eq!(self.conn.receive(&b, Instant::now()), b.len());
        self.inbox.extend(self.conn.take_output());
    }

    /// Runs the block requests waiting and collects what they produced.
    /// Sends all of command `cid`'s write data at offset 0 in one
    /// H2CData PDU (its transfer tag is its CID, as this target assigns).
    pub fn send_last_data(&mut self, cid: u16, data: &[u8]) {
        let mut b = Vec::new();
        pdu::encode_h2c_data(&mut b, self.digests, cid, cid, 0, data, true);
        self.send(&b);
    }

    /// The next PDU must be the completion of `cid` (the `what`'s) with
    /// `status`.
    pub fn expect_completion(&mut self, cid: u16, status: u16, what: &str) {
        match self.next_pdu() {
            Some(Owned::Resp(c)) => assert_eq!((c.cid, c.status), (cid, status), "{what}"),
            other => panic!("expected the {what}'s completion, got {other:?}"),
        }
    }

    pub fn run_requests(&mut self) {
        while let Some(r) = self.conn.next_request() {
            let done = r.execute();
            self.conn.complete(done);
        }
        self.inbox.extend(self.conn.take_output());
    }

    pub fn identify(&mut self, cns: u8, nsid: u32) -> Reply {
        let mut sqe = self.sqe(admin::IDENTIFY);
        sqe.0[4..8].copy_from_slice(&nsid.to_le_bytes());
        sqe.0[40] = cns;
        self.command(sqe, &[], 4096)
    }

    pub fn log_page(&mut self, lid: u8, len: u32) -> Reply {
        let mut sqe = self.sqe(admin::GET_LOG_PAGE);
        let numd = len / 4 - 1;
        sqe.0[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        sqe.0[40..44].copy_from_slice(&(u32::from(lid) | (numd & 0xffff) << 16).to_le_bytes());
        self.command(sqe, &[], len)
    }
}

#[derive(Debug)]
pub enum Owned {
    IcResp(pdu::IcResp),
    Resp(Cqe),
    Data {
        cccid: u16,
        datao: u32,
        data: Vec<u8>,
        success: bool,
    },
    R2T {
        cccid: u16,
        ttag: u16,
        r2to: u32,
        r2tl: u32,
    },
    Term {
        fes: u16,
    },
}

pub fn status(c: &Cqe) -> u16 {
    c.status
}

pub fn target(hosts: &[&str]) -> Target {
    let t = Target::new();
    assert!(t.apply(&config(hosts)).is_empty());
    t
}
