//! DH-HMAC-CHAP, the host's side: [`DhchapHost`] computes the messages
//! (what the Linux initiator computes), [`authenticate`] runs the whole
//! transaction over a queue as the controller asked in its Connect
//! response (NVMe Base Specification 2.0, section 8.13).

use zeroize::Zeroizing;

use crate::auth::dh::DhGroup;
use crate::auth::msg::{self, explanation, Message, Negotiate, Reply};
use crate::auth::{augmented_challenge, response, HashId, Role, Secret, Transaction};

use super::error::{Error, HostAuthError};
use super::pair::Transfer;
use super::queue::{Queue, Wire};
use super::{auth_receive, auth_send, HostIdentity};

/// Most bytes an Authentication Receive asks for: the largest message,
/// a Challenge with an 8192-bit DH value, is about 1.1 KiB.
const RECEIVE_LEN: u32 = 4096;

/// Authenticates queue `qid` of a controller of `subnqn` with
/// DH-HMAC-CHAP as `host` (its secrets and DH groups): AUTH_Negotiate,
/// the Challenge, the Reply, Success1 and, when `host` has a controller
/// secret, Success2. Call it when the Connect response asks for
/// authentication (dword 0 bit 17, AUTHREQ.ATR).
///
/// # Errors
///
/// [`Error::AuthRequired`] when `host` has no secret, [`Error::Auth`] when
/// the transaction fails (after sending AUTH_Failure2 when the
/// controller's own response was wrong), or the queue's errors.
pub fn authenticate<W: Wire>(
    q: &mut Queue<W>,
    host: &HostIdentity,
    subnqn: &str,
    qid: u16,
) -> Result<(), Error> {
    let secret = host.secret.clone().ok_or(Error::AuthRequired { qid })?;
    let mut dh = DhchapHost::new(&host.nqn, subnqn, secret, host.ctrl_secret.clone(), qid);
    if !host.dh_groups.is_empty() {
        dh.dh_groups.clone_from(&host.dh_groups);
    }
    let failed = |source| Error::Auth { qid, source };
    send(q, &dh.negotiate())?;
    let challenge = receive(q)?;
    let reply = dh.reply(&challenge).map_err(failed)?;
    send(q, &reply)?;
    let success1 = receive(q)?;
    match dh.success1(&success1) {
        Ok(Some(s2)) => send(q, &s2),
        Ok(None) => Ok(()),
        Err(e) => {
            if e == HostAuthError::ControllerResponse {
                send(q, &dh.failure2())?;
            }
            Err(failed(e))
        }
    }
}

/// Sends one authentication message (Authentication Send, in the capsule).
pub fn send<W: Wire>(q: &mut Queue<W>, message: &[u8]) -> Result<(), Error> {
    let len = u32::try_from(message.len()).map_err(|_| Error::TransferTooLong(message.len()))?;
    q.call(auth_send(0, len), Transfer::Write(message.to_vec()))?;
    Ok(())
}

/// Receives one authentication message (Authentication Receive).
pub fn receive<W: Wire>(q: &mut Queue<W>) -> Result<Vec<u8>, Error> {
    let c = q.call(
        auth_receive(0, RECEIVE_LEN),
        Transfer::Read(vec![0; RECEIVE_LEN as usize]),
    )?;
    Ok(c.data)
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
