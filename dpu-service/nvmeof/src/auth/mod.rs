//! NVMe in-band authentication: DH-HMAC-CHAP (NVMe Base Specification 2.0
//! section 8.13, from TP 8006), the controller's side as a sans-IO state
//! machine and the computations both sides share.
//!
//! - [`secret`]: `DHHC-1:<hh>:<base64>:` secrets and the key transformation.
//! - [`dh`]: finite-field Diffie-Hellman over the RFC 7919 groups.
//! - [`msg`]: the authentication messages (AUTH_Negotiate, Challenge,
//!   Reply, Success1, Success2, Failure1, Failure2), parsed from untrusted
//!   bytes without panics and without allocating past the message.
//! - [`controller`]: one queue's authentication transaction, controller side.
//! - [`pool`]: the DH computations as jobs, and threads of their own that
//!   run them off the poll groups.
//! - [`limit`]: authentication attempts per source address.
//!
//! The host's computations live in [`crate::host::DhchapHost`], so tests run
//! whole exchanges.
//!
//! What was checked against the Linux implementation
//! (`drivers/nvme/common/auth.c`, `drivers/nvme/target/auth.c`,
//! `fabrics-cmd-auth.c`) and SPDK's `lib/nvmf/auth.c`: the response input
//! order (challenge, SEQNUM LE32, T_ID LE16, SC_C, "HostHost" or
//! "Controller", one NQN, a zero byte, the other NQN), the HMAC key being the
//! transformed secret, the augmented challenge `HMAC(H(session key), C)`, a
//! shared secret as wide as the group's prime, Failure messages typed as
//! common messages, and the Connect response's ATR bit.
//!
//! Crates: `sha2` and `hmac` (RustCrypto, the hashes and HMAC),
//! `crypto-bigint` (RustCrypto, constant-time Montgomery modular
//! exponentiation on heap-sized integers for 2048- to 8192-bit groups; the
//! crate RustCrypto's `rsa` and `dsa` build on, audited by NCC Group),
//! `subtle` (constant-time comparison of responses), `getrandom` (the OS
//! CSPRNG for challenges and private exponents), `zeroize` (secrets and
//! session keys wiped on drop), `base64` and `crc32fast` (the secret
//! encoding and its CRC-32).

pub mod controller;
pub mod dh;
pub mod limit;
pub mod msg;
pub mod pool;
pub mod secret;

use hmac::{Hmac, Mac};
use sha2::{Sha256, Sha384, Sha512};
use zeroize::Zeroize;

pub use controller::{Authenticator, HostKeys, Outcome as AuthOutcome};
pub use dh::DhGroup;
pub use secret::{Secret, SecretError};

/// Security Protocol (SECP) of NVMe in-band authentication.
pub const SECP: u8 = 0xe9;
/// SPSP0 and SPSP1 of DH-HMAC-CHAP.
pub const SPSP: u8 = 0x01;
/// Largest digest (SHA-512).
pub const MAX_DIGEST: usize = 64;

/// A hash function of DH-HMAC-CHAP, by its identifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashId {
    /// SHA-256 (01h).
    Sha256 = 1,
    /// SHA-384 (02h).
    Sha384 = 2,
    /// SHA-512 (03h).
    Sha512 = 3,
}

impl HashId {
    /// Every hash function, strongest last.
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    /// The hash function with identifier `id`, if known.
    pub fn from_id(id: u8) -> Option<Self> {
        match id {
            1 => Some(Self::Sha256),
            2 => Some(Self::Sha384),
            3 => Some(Self::Sha512),
            _ => None,
        }
    }

    /// Its identifier on the wire.
    pub fn id(self) -> u8 {
        self as u8
    }

    /// Digest length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Self::Sha256 => 32,
            Self::Sha384 => 48,
            Self::Sha512 => 64,
        }
    }

    /// Its name, as `nvme` tools spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha256 => "sha256",
            Self::Sha384 => "sha384",
            Self::Sha512 => "sha512",
        }
    }

    /// The digest of the concatenation of `parts`.
    pub fn digest(self, parts: &[&[u8]]) -> Digest {
        fn run<D: sha2::Digest>(parts: &[&[u8]], out: &mut Digest) {
            let mut d = D::new();
            for p in parts {
                d.update(p);
            }
            out.set(&d.finalize());
        }
        let mut out = Digest::empty();
        match self {
            Self::Sha256 => run::<Sha256>(parts, &mut out),
            Self::Sha384 => run::<Sha384>(parts, &mut out),
            Self::Sha512 => run::<Sha512>(parts, &mut out),
        }
        out
    }

    /// HMAC with this hash, keyed with `key`, over the concatenation of
    /// `parts`.
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Digest {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]], out: &mut Digest) {
            // HMAC takes keys of any length (longer ones are hashed first):
            // `new_from_slice` has no error to return for it.
            let mut m = <M as hmac::digest::KeyInit>::new_from_slice(key)
                .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
            for p in parts {
                m.update(p);
            }
            out.set(&m.finalize().into_bytes());
        }
        let mut out = Digest::empty();
        match self {
            Self::Sha256 => run::<Hmac<Sha256>>(key, parts, &mut out),
            Self::Sha384 => run::<Hmac<Sha384>>(key, parts, &mut out),
            Self::Sha512 => run::<Hmac<Sha512>>(key, parts, &mut out),
        }
        out
    }
}

/// A digest or HMAC value of up to 64 bytes, wiped on drop.
#[derive(Clone)]
pub struct Digest {
    buf: [u8; MAX_DIGEST],
    len: usize,
}

impl Digest {
    fn empty() -> Self {
        Self {
            buf: [0; MAX_DIGEST],
            len: 0,
        }
    }

    fn set(&mut self, b: &[u8]) {
        let n = b.len().min(MAX_DIGEST);
        self.buf[..n].copy_from_slice(&b[..n]);
        self.len = n;
    }

    /// The value's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Whether `other` holds the same bytes, compared in constant time.
    pub fn ct_eq(&self, other: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        self.as_bytes().ct_eq(other).into()
    }
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Digest({} bytes)", self.len)
    }
}

impl Drop for Digest {
    fn drop(&mut self) {
        self.buf.zeroize();
    }
}

/// Which side a response proves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The host's response to C1, keyed with the host secret.
    Host,
    /// The controller's response to C2, keyed with the controller secret.
    Controller,
}

/// What a DH-HMAC-CHAP response covers besides the key and challenge.
#[derive(Clone, Copy, Debug)]
pub struct Transaction<'a> {
    /// Sequence number (S1 for the host's response, S2 for the
    /// controller's).
    pub seqnum: u32,
    /// Transaction identifier.
    pub t_id: u16,
    /// Secure channel concatenation (SC_C); 0 without it.
    pub sc_c: u8,
    /// The host NQN.
    pub hostnqn: &'a str,
    /// The subsystem NQN.
    pub subnqn: &'a str,
}

/// The augmented challenge of a DH exchange: `HMAC(H(session key),
/// challenge)` with the negotiated hash.
pub fn augmented_challenge(hash: HashId, session_key: &[u8], challenge: &[u8]) -> Digest {
    let hashed = hash.digest(&[session_key]);
    hash.hmac(hashed.as_bytes(), &[challenge])
}

/// The response of `role`: HMAC keyed with the transformed secret
/// `key` over the challenge (augmented already when DH is in use), SEQNUM,
/// T_ID, SC_C, the role's label and the two NQNs (the prover's first).
pub fn response(
    hash: HashId,
    role: Role,
    key: &[u8],
    challenge: &[u8],
    t: &Transaction<'_>,
) -> Digest {
    let seq = t.seqnum.to_le_bytes();
    let tid = t.t_id.to_le_bytes();
    let scc = [t.sc_c];
    let (label, first, second): (&[u8], &str, &str) = match role {
        Role::Host => (b"HostHost", t.hostnqn, t.subnqn),
        Role::Controller => (b"Controller", t.subnqn, t.hostnqn),
    };
    hash.hmac(
        key,
        &[
            challenge,
            &seq,
            &tid,
            &scc,
            label,
            first.as_bytes(),
            &[0],
            second.as_bytes(),
        ],
    )
}

/// Fills `buf` from the operating system's CSPRNG.
pub(crate) fn random(buf: &mut [u8]) -> Result<(), getrandom::Error> {
    getrandom::getrandom(buf)
}

#[cfg(test)]
mod tests;
