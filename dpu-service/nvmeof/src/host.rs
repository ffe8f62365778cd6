//! Host-side command capsules: what an initiator sends to open and enable
//! a queue. The load generator (`nvmf-perf`), the protocol tests and the
//! fuzz targets build their commands here, so the Connect layout is written
//! once.

use crate::pdu::{self, Digests, IcReq};
use crate::spec::{fctype, prop, sgl, Sqe, FABRICS, SQE_LEN};

/// CC value that enables a controller with 64-byte SQEs and 16-byte CQEs.
pub const CC_ENABLE: u32 = 1 | 6 << 16 | 4 << 20;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
