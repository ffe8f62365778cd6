//! The authentication messages carried by Authentication Send and Receive
//! (NVMe Base Specification 2.0 section 8.13.5; Linux's
//! `struct nvmf_auth_dhchap_*_data`).
//!
//! Every message starts with AUTH_Type, AUTH_Id, two reserved bytes and
//! the little-endian transaction identifier T_ID. [`decode`] checks every
//! length field against the bytes received before it reads what the field
//! describes, never panics and copies at most the input's length; bytes
//! past the end of a message are ignored (as Linux's target does).
//! [`Message::encode`] writes what [`decode`] reads back.

/// AUTH_Type of common messages (AUTH_Negotiate, the Failure messages).
pub const TYPE_COMMON: u8 = 0x00;
/// AUTH_Type of DH-HMAC-CHAP messages.
pub const TYPE_DHCHAP: u8 = 0x01;

/// AUTH_Id values.
pub mod id {
    /// AUTH_Negotiate.
    pub const NEGOTIATE: u8 = 0x00;
    /// DH-HMAC-CHAP_Challenge.
    pub const CHALLENGE: u8 = 0x01;
    /// DH-HMAC-CHAP_Reply.
    pub const REPLY: u8 = 0x02;
    /// DH-HMAC-CHAP_Success1.
    pub const SUCCESS1: u8 = 0x03;
    /// DH-HMAC-CHAP_Success2.
    pub const SUCCESS2: u8 = 0x04;
    /// AUTH_Failure2 (host to controller).
    pub const FAILURE2: u8 = 0xf0;
    /// AUTH_Failure1 (controller to host).
    pub const FAILURE1: u8 = 0xf1;
}

/// AUTH_ID of the DH-HMAC-CHAP protocol descriptor.
pub const AUTH_ID_DHCHAP: u8 = 0x01;
/// Length of one AUTH_Negotiate protocol descriptor.
pub const DESCRIPTOR_LEN: usize = 64;
/// Most hash or DH group identifiers one descriptor lists.
pub const MAX_IDS: usize = 30;
/// Length of the common header and of the fixed part of every message
/// but the Failures.
pub const HEADER_LEN: usize = 16;
/// Length of a Failure message.
pub const FAILURE_LEN: usize = 8;

/// Reason code of the Failure messages: authentication failed.
pub const REASON_FAILED: u8 = 0x01;

/// Reason code explanations of the Failure messages.
pub mod explanation {
    /// Authentication failed (a wrong response).
    pub const FAILED: u8 = 0x01;
    /// The protocol or parameters are not usable.
    pub const NOT_USABLE: u8 = 0x02;
    /// Secure channel concatenation mismatch.
    pub const CONCAT_MISMATCH: u8 = 0x03;
    /// No hash function in common.
    pub const HASH_UNUSABLE: u8 = 0x04;
    /// No DH group in common.
    pub const DHGROUP_UNUSABLE: u8 = 0x05;
    /// A malformed message.
    pub const INCORRECT_PAYLOAD: u8 = 0x06;
    /// A message out of sequence.
    pub const INCORRECT_MESSAGE: u8 = 0x07;
}

/// Why bytes are not an authentication message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the message's fields say.
    #[error("message truncated: {need} bytes needed, {got} received")]
    Truncated {
        /// Bytes the fields require.
        need: usize,
        /// Bytes received.
        got: usize,
    },
    /// An unknown AUTH_Type / AUTH_Id pair.
    #[error("unknown message type {auth_type:#04x} id {auth_id:#04x}")]
    Unknown {
        /// AUTH_Type.
        auth_type: u8,
        /// AUTH_Id.
        auth_id: u8,
    },
    /// A field out of its range (a count past its list, a zero length).
    #[error("field {0} out of range")]
    Field(&'static str),
}

/// AUTH_Negotiate: what the host offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiate {
    /// Transaction identifier.
    pub t_id: u16,
    /// Secure channel concatenation (SC_C).
    pub sc_c: u8,
    /// The DH-HMAC-CHAP descriptor's hash identifiers, as sent (unknown
    /// ones included), at most [`MAX_IDS`]; empty if the host offered no
    /// DH-HMAC-CHAP descriptor.
    pub hashes: Vec<u8>,
    /// The descriptor's DH group identifiers, at most [`MAX_IDS`].
    pub dh_groups: Vec<u8>,
    /// Whether a DH-HMAC-CHAP descriptor was among the descriptors.
    pub dhchap: bool,
}

/// DH-HMAC-CHAP_Challenge: controller to host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// Transaction identifier.
    pub t_id: u16,
    /// Hash identifier (HASHID).
    pub hash: u8,
    /// DH group identifier (DHGID).
    pub dh_group: u8,
    /// Sequence number S1.
    pub seqnum: u32,
    /// The challenge C1 (HL bytes).
    pub c1: Vec<u8>,
    /// The controller's DH public value (DHVLEN bytes; empty for the null
    /// group).
    pub dh_value: Vec<u8>,
}

/// DH-HMAC-CHAP_Reply: host to controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Transaction identifier.
    pub t_id: u16,
    /// The host's response R1 (HL bytes).
    pub response: Vec<u8>,
    /// The challenge C2 when CVALID is set (bidirectional authentication).
    pub c2: Option<Vec<u8>>,
    /// Sequence number S2 (0 without bidirectional authentication).
    pub seqnum: u32,
    /// The host's DH public value.
    pub dh_value: Vec<u8>,
}

/// A DH-HMAC-CHAP message or a common message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// AUTH_Negotiate.
    Negotiate(Negotiate),
    /// DH-HMAC-CHAP_Challenge.
    Challenge(Challenge),
    /// DH-HMAC-CHAP_Reply.
    Reply(Reply),
    /// DH-HMAC-CHAP_Success1: the controller's response R2 when RVALID.
    Success1 {
        /// Transaction identifier.
        t_id: u16,
        /// Hash length (HL), which the RVAL field takes whether valid or
        /// not.
        hl: u8,
        /// The controller's response, when RVALID is set.
        response: Option<Vec<u8>>,
    },
    /// DH-HMAC-CHAP_Success2.
    Success2 {
        /// Transaction identifier.
        t_id: u16,
    },
    /// AUTH_Failure1 (`second` false) or AUTH_Failure2 (`second` true).
    Failure {
        /// Transaction identifier.
        t_id: u16,
        /// Failure2, from the host.
        second: bool,
        /// Reason code.
        reason: u8,
        /// Reason code explanation.
        explanation: u8,
    },
}

fn need(b: &[u8], n: usize) -> Result<(), DecodeError> {
    if b.len() < n {
        Err(DecodeError::Truncated {
            need: n,
            got: b.len(),
        })
    } else {
        Ok(())
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Decodes one message from `b`.
pub fn decode(b: &[u8]) -> Result<Message, DecodeError> {
    need(b, 8)?;
    let (auth_type, auth_id) = (b[0], b[1]);
    let t_id = le16(b, 4);
    match (auth_type, auth_id) {
        (TYPE_COMMON, id::NEGOTIATE) => {
            let napd = usize::from(b[7]);
            if napd == 0 {
                return Err(DecodeError::Field("NAPD"));
            }
            need(b, 8 + napd * DESCRIPTOR_LEN)?;
            let mut n = Negotiate {
                t_id,
                sc_c: b[6],
                hashes: Vec::new(),
                dh_groups: Vec::new(),
                dhchap: false,
            };
            for d in b[8..8 + napd * DESCRIPTOR_LEN].chunks_exact(DESCRIPTOR_LEN) {
                if d[0] != AUTH_ID_DHCHAP || n.dhchap {
                    continue;
                }
                let (halen, dhlen) = (usize::from(d[2]), usize::from(d[3]));
                if halen > MAX_IDS {
                    return Err(DecodeError::Field("HALEN"));
                }
                if dhlen > MAX_IDS {
                    return Err(DecodeError::Field("DHLEN"));
                }
                n.hashes = d[4..4 + halen].to_vec();
                n.dh_groups = d[34..34 + dhlen].to_vec();
                n.dhchap = true;
            }
            Ok(Message::Negotiate(n))
        }
        (TYPE_DHCHAP, id::CHALLENGE) => {
            need(b, HEADER_LEN)?;
            let hl = usize::from(b[6]);
            let dhvlen = usize::from(le16(b, 10));
            if hl == 0 {
                return Err(DecodeError::Field("HL"));
            }
            need(b, HEADER_LEN + hl + dhvlen)?;
            Ok(Message::Challenge(Challenge {
                t_id,
                hash: b[8],
                dh_group: b[9],
                seqnum: le32(b, 12),
                c1: b[HEADER_LEN..HEADER_LEN + hl].to_vec(),
                dh_value: b[HEADER_LEN + hl..HEADER_LEN + hl + dhvlen].to_vec(),
            }))
        }
        (TYPE_DHCHAP, id::REPLY) => {
            need(b, HEADER_LEN)?;
            let hl = usize::from(b[6]);
            let cvalid = b[8] != 0;
            let dhvlen = usize::from(le16(b, 10));
            if hl == 0 {
                return Err(DecodeError::Field("HL"));
            }
            need(b, HEADER_LEN + 2 * hl + dhvlen)?;
            let at = HEADER_LEN;
            Ok(Message::Reply(Reply {
                t_id,
                response: b[at..at + hl].to_vec(),
                c2: cvalid.then(|| b[at + hl..at + 2 * hl].to_vec()),
                seqnum: le32(b, 12),
                dh_value: b[at + 2 * hl..at + 2 * hl + dhvlen].to_vec(),
            }))
        }
        (TYPE_DHCHAP, id::SUCCESS1) => {
            need(b, HEADER_LEN)?;
            let hl = b[6];
            let rvalid = b[8] != 0;
            let response = if rvalid {
                if hl == 0 {
                    return Err(DecodeError::Field("HL"));
                }
                let end = HEADER_LEN + usize::from(hl);
                need(b, end)?;
                Some(b[HEADER_LEN..end].to_vec())
            } else {
                None
            };
            Ok(Message::Success1 { t_id, hl, response })
        }
        (TYPE_DHCHAP, id::SUCCESS2) => {
            need(b, HEADER_LEN)?;
            Ok(Message::Success2 { t_id })
        }
        (TYPE_COMMON, id::FAILURE1 | id::FAILURE2) => Ok(Message::Failure {
            t_id,
            second: auth_id == id::FAILURE2,
            reason: b[6],
            explanation: b[7],
        }),
        _ => Err(DecodeError::Unknown { auth_type, auth_id }),
    }
}

fn header(out: &mut Vec<u8>, auth_type: u8, auth_id: u8, t_id: u16) {
    out.extend_from_slice(&[auth_type, auth_id, 0, 0]);
    out.extend_from_slice(&t_id.to_le_bytes());
}

/// Clamps a length to a one-byte field (the encoder's callers never pass
/// more than a digest).
fn byte_len(v: &[u8]) -> u8 {
    u8::try_from(v.len()).unwrap_or(u8::MAX)
}

fn short_len(v: &[u8]) -> u16 {
    u16::try_from(v.len()).unwrap_or(u16::MAX)
}

impl Message {
    /// The message's transaction identifier.
    pub fn t_id(&self) -> u16 {
        match self {
            Self::Negotiate(n) => n.t_id,
            Self::Challenge(c) => c.t_id,
            Self::Reply(r) => r.t_id,
            Self::Success1 { t_id, .. } | Self::Success2 { t_id } | Self::Failure { t_id, .. } => {
                *t_id
            }
        }
    }

    /// Appends the message to `out`. Lists and values longer than their
    /// length fields allow are cut to fit, so that what is written always
    /// decodes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Negotiate(n) => {
                header(out, TYPE_COMMON, id::NEGOTIATE, n.t_id);
                out.extend_from_slice(&[n.sc_c, 1]);
                // Without DH-HMAC-CHAP, one descriptor of protocol 0 (none).
                let mut d = [0u8; DESCRIPTOR_LEN];
                d[0] = if n.dhchap { AUTH_ID_DHCHAP } else { 0 };
                let h = &n.hashes[..n.hashes.len().min(MAX_IDS)];
                let g = &n.dh_groups[..n.dh_groups.len().min(MAX_IDS)];
                d[2] = byte_len(h);
                d[3] = byte_len(g);
                d[4..4 + h.len()].copy_from_slice(h);
                d[34..34 + g.len()].copy_from_slice(g);
                out.extend_from_slice(&d);
            }
            Self::Challenge(c) => {
                let c1 = &c.c1[..c.c1.len().min(255)];
                let dh = &c.dh_value[..c.dh_value.len().min(usize::from(u16::MAX))];
                header(out, TYPE_DHCHAP, id::CHALLENGE, c.t_id);
                out.extend_from_slice(&[byte_len(c1), 0, c.hash, c.dh_group]);
                out.extend_from_slice(&short_len(dh).to_le_bytes());
                out.extend_from_slice(&c.seqnum.to_le_bytes());
                out.extend_from_slice(c1);
                out.extend_from_slice(dh);
            }
            Self::Reply(r) => {
                let rv = &r.response[..r.response.len().min(255)];
                let dh = &r.dh_value[..r.dh_value.len().min(usize::from(u16::MAX))];
                header(out, TYPE_DHCHAP, id::REPLY, r.t_id);
                out.extend_from_slice(&[byte_len(rv), 0, u8::from(r.c2.is_some()), 0]);
                out.extend_from_slice(&short_len(dh).to_le_bytes());
                out.extend_from_slice(&r.seqnum.to_le_bytes());
                out.extend_from_slice(rv);
                // C2 takes HL bytes whether valid or not.
                let mut c2 = r.c2.clone().unwrap_or_default();
                c2.resize(rv.len(), 0);
                out.extend_from_slice(&c2);
                out.extend_from_slice(dh);
            }
            Self::Success1 { t_id, hl, response } => {
                header(out, TYPE_DHCHAP, id::SUCCESS1, *t_id);
                let mut rval = response.clone().unwrap_or_default();
                let hl = if response.is_some() {
                    byte_len(&rval).max(1)
                } else {
                    *hl
                };
                rval.resize(usize::from(hl), 0);
                out.extend_from_slice(&[hl, 0, u8::from(response.is_some())]);
                out.extend_from_slice(&[0; 7]);
                out.extend_from_slice(&rval);
            }
            Self::Success2 { t_id } => {
                header(out, TYPE_DHCHAP, id::SUCCESS2, *t_id);
                out.extend_from_slice(&[0; 10]);
            }
            Self::Failure {
                t_id,
                second,
                reason,
                explanation,
            } => {
                let auth_id = if *second { id::FAILURE2 } else { id::FAILURE1 };
                header(out, TYPE_COMMON, auth_id, *t_id);
                out.extend_from_slice(&[*reason, *explanation]);
            }
        }
    }

    /// The encoded message.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }
}
