//! The host (initiator) side of NVMe/TCP: what a host sends, how it reads
//! what a controller answers, and the steps that bring up a controller.
//! The load generator (`nvmf-perf`), the protocol tests and the fuzz
//! targets build their commands here, so each layout is written once; a
//! namespace served from another NVMe/TCP controller reaches it through
//! the same queue and controller types.
//!
//! - This file: command capsules (Connect, Property Get and Set, enable
//!   and shutdown, Identify, Get Log Page, Set Features, Read, Write,
//!   Disconnect, Authentication Send and Receive) and [`HostIdentity`].
//! - [`pair`]: one queue pair as a sans-IO state machine: bytes from the
//!   controller in, completions (with their data) and bytes to send out;
//!   several commands in flight, completed in any order; R2Ts answered.
//! - [`queue`]: a queue pair over a byte stream ([`Wire`]: a kernel TCP
//!   socket or any other), blocking with timeouts, or driven by the
//!   caller's poll loop.
//! - [`controller`]: a controller: admin queue Connect, authentication,
//!   enable, Identify, Set Features (queues), I/O queues, the discovery
//!   log, Keep Alive and shutdown.
//! - [`auth`]: DH-HMAC-CHAP, host side.
//! - [`error`]: [`Error`], one enum for all of it.
//!
//! # What a controller cannot do to the host
//!
//! Nothing a controller sends makes this code panic or allocate without
//! bound. A PDU whose data is longer than [`QueueOptions::max_data`] is
//! refused from its first 8 bytes; C2HData must fall inside the buffer of
//! a command in flight; R2Ts may ask for no more than the command's data,
//! so what the host queues to send stays within the data of the writes in
//! flight; every blocking wait ends after [`QueueOptions::timeout`]. Each
//! such breach is an [`Error`], after which the queue is dropped.

use crate::auth::dh::DhGroup;
use crate::auth::Secret;
use crate::pdu::{self, Digests, IcReq};
use crate::spec::{admin, fctype, nvm, prop, sgl, Sqe, FABRICS, SQE_LEN};

pub mod auth;
pub mod controller;
pub mod error;
pub mod pair;
pub mod queue;

pub use auth::{authenticate, DhchapHost};
pub use controller::{
    Controller, ControllerInfo, ControllerOptions, DiscoveryEntry, NamespaceSize,
};
pub use error::{Error, HostAuthError};
pub use pair::{Completion, QueueOptions, QueuePair, Transfer};
pub use queue::{Queue, Wire};

/// Who the host is: the NQN and host identifier it connects with, and
/// its DH-HMAC-CHAP secrets for controllers that require authentication.
#[derive(Debug, Clone)]
pub struct HostIdentity {
    /// Host NQN.
    pub nqn: String,
    /// Host identifier (Connect data bytes 0..16).
    pub id: [u8; 16],
    /// The host's DH-HMAC-CHAP secret; without it a controller that
    /// requires authentication is refused ([`Error::AuthRequired`]).
    pub secret: Option<Secret>,
    /// The controller's secret, for bidirectional authentication.
    pub ctrl_secret: Option<Secret>,
    /// DH groups offered; empty: all of them.
    pub dh_groups: Vec<DhGroup>,
}

impl HostIdentity {
    /// The host `nqn` with identifier `id`, without secrets.
    pub fn new(nqn: &str, id: [u8; 16]) -> Self {
        Self {
            nqn: nqn.to_owned(),
            id,
            secret: None,
            ctrl_secret: None,
            dh_groups: Vec::new(),
        }
    }
}

/// CC value that enables a controller with 64-byte SQEs and 16-byte CQEs.
pub const CC_ENABLE: u32 = 1 | 6 << 16 | 4 << 20;
/// CC value of an enabled controller asked for a normal shutdown
/// (CC.SHN = 01b).
pub const CC_SHUTDOWN: u32 = CC_ENABLE | 1 << 14;
/// Size of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;

/// Appends to `out` the ICReq that opens a connection: PDU format 0, no
/// header padding, at most one R2T outstanding, `digests` asked for.
pub fn ic_req(out: &mut Vec<u8>, digests: Digests) {
    pdu::encode_ic_req(
        out,
        &IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        },
    );
}

/// A command with `opcode` and `cid`, its data described by one transport
/// SGL descriptor of length 0 (set bytes 32..36 for a transfer).
pub fn command(opcode: u8, cid: u16) -> Sqe {
    let mut s = Sqe([0; SQE_LEN]);
    s.0[0] = opcode;
    s.0[1] = 0x40; // PSDT: SGL
    s.0[2..4].copy_from_slice(&cid.to_le_bytes());
    s.0[39] = sgl::TRANSPORT;
    s
}

/// A Connect for queue `qid` of `entries` entries (SQSIZE is one less) with
/// keep-alive timeout `kato_ms`, its 1024 data bytes in the capsule.
pub fn connect(cid: u16, qid: u16, entries: u16, kato_ms: u32) -> Sqe {
    let mut s = command(FABRICS, cid);
    s.0[4] = fctype::CONNECT;
    s.0[32..36].copy_from_slice(&(CONNECT_DATA_LEN as u32).to_le_bytes());
    s.0[39] = sgl::IN_CAPSULE;
    s.0[40..44].copy_from_slice(&(u32::from(qid) << 16).to_le_bytes());
    s.0[44..48].copy_from_slice(&u32::from(entries.saturating_sub(1)).to_le_bytes());
    s.0[48..52].copy_from_slice(&kato_ms.to_le_bytes());
    s
}

/// The Connect data: host identifier, controller ID (0xFFFF for a new
/// admin queue), subsystem and host NQNs (cut to 255 bytes).
pub fn connect_data(hostid: [u8; 16], cntlid: u16, subnqn: &str, hostnqn: &str) -> Vec<u8> {
    let mut d = vec![0u8; CONNECT_DATA_LEN];
    d[0..16].copy_from_slice(&hostid);
    d[16..18].copy_from_slice(&cntlid.to_le_bytes());
    for (at, s) in [(256, subnqn), (512, hostnqn)] {
        let n = s.len().min(255);
        d[at..at + n].copy_from_slice(&s.as_bytes()[..n]);
    }
    d
}

/// A Property Set of the 4-byte property at `offset` to `value`.
pub fn property_set(cid: u16, offset: u32, value: u32) -> Sqe {
    let mut s = command(FABRICS, cid);
    s.0[4] = fctype::PROPERTY_SET;
    s.0[39] = 0;
    s.0[44..48].copy_from_slice(&offset.to_le_bytes());
    s.0[48..52].copy_from_slice(&value.to_le_bytes());
    s
}

/// A Property Get of the property at `offset`, 8 bytes wide if `eight`.
pub fn property_get(cid: u16, offset: u32, eight: bool) -> Sqe {
    let mut s = command(FABRICS, cid);
    s.0[4] = fctype::PROPERTY_GET;
    s.0[39] = 0;
    s.0[40] = u8::from(eight);
    s.0[44..48].copy_from_slice(&offset.to_le_bytes());
    s
}

/// The Property Set that enables the controller (CC.EN).
pub fn enable(cid: u16) -> Sqe {
    property_set(cid, prop::CC, CC_ENABLE)
}

/// An Authentication Send (DH-HMAC-CHAP) of `len` bytes carried in the
/// capsule.
pub fn auth_send(cid: u16, len: u32) -> Sqe {
    let mut s = command(FABRICS, cid);
    s.0[4] = fctype::AUTH_SEND;
    s.0[32..36].copy_from_slice(&len.to_le_bytes());
    s.0[39] = sgl::IN_CAPSULE;
    s.0[41] = crate::auth::SPSP;
    s.0[42] = crate::auth::SPSP;
    s.0[43] = crate::auth::SECP;
    s.0[44..48].copy_from_slice(&len.to_le_bytes());
    s
}

/// An Authentication Receive (DH-HMAC-CHAP) of allocation length `al`.
pub fn auth_receive(cid: u16, al: u32) -> Sqe {
    let mut s = command(FABRICS, cid);
    s.0[4] = fctype::AUTH_RECEIVE;
    s.0[32..36].copy_from_slice(&al.to_le_bytes());
    s.0[41] = crate::auth::SPSP;
    s.0[42] = crate::auth::SPSP;
    s.0[43] = crate::auth::SECP;
    s.0[44..48].copy_from_slice(&al.to_le_bytes());
    s
}

/// A Disconnect of the I/O queue it is sent on (NVMe-oF 1.1, 3.5).
pub fn disconnect(cid: u16) -> Sqe {
    let mut s = command(FABRICS, cid);
    s.0[4] = fctype::DISCONNECT;
    s.0[39] = 0;
    s
}

// The builders below leave CID 0 and the data's SGL descriptor to
// [`QueuePair::submit`], which fills both in.

/// An Identify of `cns` (0: namespace, 1: controller) for namespace
/// `nsid`; 4096 bytes of data.
pub fn identify(cns: u8, nsid: u32) -> Sqe {
    let mut s = command(admin::IDENTIFY, 0);
    s.0[4..8].copy_from_slice(&nsid.to_le_bytes());
    s.0[40] = cns;
    s
}

/// A Get Log Page of log `lid`, `len` bytes (a multiple of 4, at least 4)
/// from offset 0.
pub fn get_log_page(lid: u8, len: u32) -> Sqe {
    let mut s = command(admin::GET_LOG_PAGE, 0);
    let numd = (len / 4).saturating_sub(1);
    s.0[40..44].copy_from_slice(&(u32::from(lid) | (numd & 0xffff) << 16).to_le_bytes());
    s.0[44..48].copy_from_slice(&(numd >> 16).to_le_bytes());
    s
}

/// A Set Features of Number of Queues asking for `n` I/O submission and
/// `n` completion queues (at least 1).
pub fn set_queue_count(n: u16) -> Sqe {
    let mut s = command(admin::SET_FEATURES, 0);
    s.0[39] = 0;
    s.0[40] = 0x07;
    let n = u32::from(n.max(1) - 1);
    s.0[44..48].copy_from_slice(&(n | n << 16).to_le_bytes());
    s
}

/// A Keep Alive.
pub fn keep_alive() -> Sqe {
    let mut s = command(admin::KEEP_ALIVE, 0);
    s.0[39] = 0;
    s
}

/// A Read of `nlb` + 1 blocks (NLB is 0's based) at `slba` of namespace
/// `nsid`.
pub fn read(nsid: u32, slba: u64, nlb: u16) -> Sqe {
    rw(nvm::READ, nsid, slba, nlb)
}

/// A Write of `nlb` + 1 blocks (NLB is 0's based) at `slba` of namespace
/// `nsid`.
pub fn write(nsid: u32, slba: u64, nlb: u16) -> Sqe {
    rw(nvm::WRITE, nsid, slba, nlb)
}

/// A Write as [`write()`], durable on completion when `fua` (Force Unit
/// Access).
pub fn write_fua(nsid: u32, slba: u64, nlb: u16, fua: bool) -> Sqe {
    let mut s = rw(nvm::WRITE, nsid, slba, nlb);
    if fua {
        s.0[51] |= 0x40; // CDW12 bit 30
    }
    s
}

/// A Flush of namespace `nsid`.
pub fn flush(nsid: u32) -> Sqe {
    let mut s = command(nvm::FLUSH, 0);
    s.0[39] = 0;
    s.0[4..8].copy_from_slice(&nsid.to_le_bytes());
    s
}

/// A Write Zeroes of `nlb` + 1 blocks at `slba` of namespace `nsid`; with
/// `deallocate` (DEAC) the controller may deallocate the blocks, which
/// still read as zeros.
pub fn write_zeroes(nsid: u32, slba: u64, nlb: u16, deallocate: bool) -> Sqe {
    let mut s = rw(nvm::WRITE_ZEROES, nsid, slba, nlb);
    s.0[39] = 0;
    if deallocate {
        s.0[51] |= 0x02; // CDW12 bit 25
    }
    s
}

fn rw(opcode: u8, nsid: u32, slba: u64, nlb: u16) -> Sqe {
    let mut s = command(opcode, 0);
    s.0[4..8].copy_from_slice(&nsid.to_le_bytes());
    s.0[40..48].copy_from_slice(&slba.to_le_bytes());
    s.0[48..50].copy_from_slice(&nlb.to_le_bytes());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvm_command_layouts() {
        let w = write_fua(3, 0x1122_3344_5566, 7, true);
        assert_eq!(
            (w.opcode(), w.nsid(), w.cdw(12)),
            (nvm::WRITE, 3, 7 | 1 << 30)
        );
        assert_eq!(write_fua(3, 0, 7, false).cdw(12), 7);
        let z = write_zeroes(2, 9, 0xffff, true);
        assert_eq!(
            (z.opcode(), z.cdw(10), z.cdw(12)),
            (nvm::WRITE_ZEROES, 9, 0xffff | 1 << 25)
        );
        assert_eq!(z.0[39], 0, "no data, no SGL descriptor");
        let f = flush(5);
        assert_eq!((f.opcode(), f.nsid()), (nvm::FLUSH, 5));
    }

    #[test]
    fn connect_layout() {
        let s = connect(7, 2, 128, 5000);
        assert_eq!(
            (s.opcode(), s.fctype(), s.cid()),
            (FABRICS, fctype::CONNECT, 7)
        );
        assert_eq!((s.sgl_id(), s.sgl_len()), (sgl::IN_CAPSULE, 1024));
        assert_eq!((s.cdw(10) >> 16, s.cdw(11), s.cdw(12)), (2, 127, 5000));
        let d = connect_data([9; 16], 0xffff, "nqn.a", "nqn.b");
        assert_eq!((&d[0..16], &d[16..18]), (&[9u8; 16][..], &[0xff, 0xff][..]));
        assert_eq!((&d[256..261], d[261]), (&b"nqn.a"[..], 0));
        assert_eq!(&d[512..517], b"nqn.b");
        let e = enable(1);
        assert_eq!(
            (e.fctype(), e.cdw(11), e.cdw(12)),
            (fctype::PROPERTY_SET, prop::CC, CC_ENABLE)
        );
    }

    #[test]
    fn io_and_admin_layouts() {
        let r = read(3, 0x1_0000_0002, 7);
        assert_eq!(
            (r.opcode(), r.nsid(), r.slba(), r.nlb()),
            (nvm::READ, 3, 0x1_0000_0002, 8)
        );
        let w = write(1, 5, 0);
        assert_eq!((w.opcode(), w.slba(), w.nlb()), (nvm::WRITE, 5, 1));
        let i = identify(1, 0);
        assert_eq!((i.opcode(), i.cdw(10)), (admin::IDENTIFY, 1));
        let l = get_log_page(0x70, 4096);
        assert_eq!((l.cdw(10), l.cdw(11)), (0x70 | 1023 << 16, 0));
        let big = get_log_page(0x70, 1 << 20);
        assert_eq!((big.cdw(10) >> 16, big.cdw(11)), (0xffff, 3));
        assert_eq!(set_queue_count(4).cdw(11), 3 | 3 << 16);
        assert_eq!(set_queue_count(0).cdw(11), 0);
        let d = disconnect(9);
        assert_eq!(
            (d.opcode(), d.fctype(), d.cid()),
            (FABRICS, fctype::DISCONNECT, 9)
        );
    }
}
