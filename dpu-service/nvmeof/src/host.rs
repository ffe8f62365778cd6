//! Host-side command capsules: what an initiator sends to open and enable
//! a queue. The load generator (`nvmf-perf`), the protocol tests and the
//! fuzz targets build their commands here, so the Connect layout is written
//! once.

use zeroize::Zeroizing;

use crate::auth::dh::DhGroup;
use crate::auth::msg::{self, explanation, Message, Negotiate, Reply};
use crate::auth::{augmented_challenge, response, HashId, Role, Secret, Transaction};
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

/// Why the host side of DH-HMAC-CHAP stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostAuthError {
    /// The controller's message did not decode or was not the one
    /// expected.
    #[error("unexpected or malformed message from the controller")]
    Unexpected,
    /// The controller sent AUTH_Failure1.
    #[error("the controller refused: reason {reason:#04x}, explanation {explanation:#04x}")]
    Refused {
        /// Reason code.
        reason: u8,
        /// Reason code explanation.
        explanation: u8,
    },
    /// The challenge names a hash or group not offered, or has the wrong
    /// sizes, or a DH value out of range.
    #[error("unusable challenge")]
    Challenge,
    /// The controller's response was wrong (send [`DhchapHost::failure2`]).
    #[error("the controller's response is wrong")]
    ControllerResponse,
    /// The OS random number generator failed.
    #[error("the OS random number generator failed")]
    Random,
}

/// The host's side of DH-HMAC-CHAP: what the Linux initiator computes,
/// for the protocol tests and load generators.
pub struct DhchapHost {
    hostnqn: String,
    subnqn: String,
    secret: Secret,
    ctrl_secret: Option<Secret>,
    t_id: u16,
    /// Hash functions offered.
    pub hashes: Vec<HashId>,
    /// DH groups offered.
    pub dh_groups: Vec<DhGroup>,
    /// What the controller's response must be, once the reply is out.
    expect: Option<Zeroizing<Vec<u8>>>,
}

impl DhchapHost {
    /// The host `hostnqn` with `secret` authenticating to `subnqn`,
    /// bidirectionally when `ctrl_secret` is given; it offers every hash
    /// and DH group, as Linux does.
    pub fn new(
        hostnqn: &str,
        subnqn: &str,
        secret: Secret,
        ctrl_secret: Option<Secret>,
        t_id: u16,
    ) -> Self {
        Self {
            hostnqn: hostnqn.to_owned(),
            subnqn: subnqn.to_owned(),
            secret,
            ctrl_secret,
            t_id,
            hashes: HashId::ALL.to_vec(),
            dh_groups: DhGroup::ALL.to_vec(),
            expect: None,
        }
    }

    /// The AUTH_Negotiate message.
    pub fn negotiate(&self) -> Vec<u8> {
        Message::Negotiate(Negotiate {
            t_id: self.t_id,
            sc_c: 0,
            hashes: self.hashes.iter().map(|h| h.id()).collect(),
            dh_groups: self.dh_groups.iter().map(|g| g.id()).collect(),
            dhchap: true,
        })
        .to_bytes()
    }

    /// The Reply to the controller's Challenge `data`.
    pub fn reply(&mut self, data: &[u8]) -> Result<Vec<u8>, HostAuthError> {
        let c = match msg::decode(data) {
            Ok(Message::Challenge(c)) if c.t_id == self.t_id => c,
            Ok(Message::Failure {
                reason,
                explanation,
                second: false,
                ..
            }) => {
                return Err(HostAuthError::Refused {
                    reason,
                    explanation,
                })
            }
            _ => return Err(HostAuthError::Unexpected),
        };
        let hash = HashId::from_id(c.hash)
            .filter(|h| self.hashes.contains(h) && h.digest_len() == c.c1.len())
            .ok_or(HostAuthError::Challenge)?;
        let group = DhGroup::from_id(c.dh_group)
            .filter(|g| self.dh_groups.contains(g) && g.value_len() == c.dh_value.len())
            .ok_or(HostAuthError::Challenge)?;
        let (dh_value, session_key) = match group {
            DhGroup::Null => (Vec::new(), None),
            g => {
                let kp = g.generate().map_err(|_| HostAuthError::Random)?;
                let k = kp
                    .shared_secret(&c.dh_value)
                    .map_err(|_| HostAuthError::Challenge)?;
                (kp.public().to_vec(), Some(k))
            }
        };
        let challenge = |ch: &[u8]| match &session_key {
            Some(k) => augmented_challenge(hash, k, ch).as_bytes().to_vec(),
            None => ch.to_vec(),
        };
        let t = Transaction {
            seqnum: c.seqnum,
            t_id: self.t_id,
            sc_c: 0,
            hostnqn: &self.hostnqn,
            subnqn: &self.subnqn,
        };
        let key = self.secret.transform(&self.hostnqn);
        let r = response(hash, Role::Host, key.as_bytes(), &challenge(&c.c1), &t);
        let (c2, s2) = match &self.ctrl_secret {
            None => (None, 0),
            Some(cs) => {
                let mut c2 = vec![0u8; hash.digest_len()];
                let mut s2 = [0u8; 4];
                crate::auth::random(&mut c2).map_err(|_| HostAuthError::Random)?;
                crate::auth::random(&mut s2).map_err(|_| HostAuthError::Random)?;
                let s2 = u32::from_le_bytes(s2).max(1);
                let key = cs.transform(&self.subnqn);
                let want = response(
                    hash,
                    Role::Controller,
                    key.as_bytes(),
                    &challenge(&c2),
                    &Transaction { seqnum: s2, ..t },
                );
                self.expect = Some(Zeroizing::new(want.as_bytes().to_vec()));
                (Some(c2), s2)
            }
        };
        Ok(Message::Reply(Reply {
            t_id: self.t_id,
            response: r.as_bytes().to_vec(),
            c2,
            seqnum: s2,
            dh_value,
        })
        .to_bytes())
    }

    /// Checks the controller's Success1 `data`: `Ok(Some(Success2))` to
    /// send when the controller proved its secret, `Ok(None)` when done
    /// (unidirectional).
    pub fn success1(&mut self, data: &[u8]) -> Result<Option<Vec<u8>>, HostAuthError> {
        let response = match msg::decode(data) {
            Ok(Message::Success1 { t_id, response, .. }) if t_id == self.t_id => response,
            Ok(Message::Failure {
                reason,
                explanation,
                second: false,
                ..
            }) => {
                return Err(HostAuthError::Refused {
                    reason,
                    explanation,
                })
            }
            _ => return Err(HostAuthError::Unexpected),
        };
        match (self.expect.take(), response) {
            (None, _) => Ok(None),
            (Some(want), Some(got)) => {
                use subtle::ConstantTimeEq;
                if bool::from(want.as_slice().ct_eq(&got)) {
                    Ok(Some(Message::Success2 { t_id: self.t_id }.to_bytes()))
                } else {
                    Err(HostAuthError::ControllerResponse)
                }
            }
            (Some(_), None) => Err(HostAuthError::ControllerResponse),
        }
    }

    /// The AUTH_Failure2 that rejects the controller's response.
    pub fn failure2(&self) -> Vec<u8> {
        Message::Failure {
            t_id: self.t_id,
            second: true,
            reason: msg::REASON_FAILED,
            explanation: explanation::FAILED,
        }
        .to_bytes()
    }
}

impl std::fmt::Debug for DhchapHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DhchapHost")
            .field("hostnqn", &self.hostnqn)
            .field("subnqn", &self.subnqn)
            .field("secret", &self.secret)
            .field("bidirectional", &self.ctrl_secret.is_some())
            .finish_non_exhaustive()
    }
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
