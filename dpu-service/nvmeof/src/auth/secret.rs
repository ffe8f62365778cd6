//! DH-HMAC-CHAP secrets in the `DHHC-1:<hh>:<base64 of key || CRC-32>:`
//! form that `nvme gen-dhchap-key` writes and Linux reads, and the key
//! transformation of the specification.
//!
//! `hh` is the hash indicator: `00` for a key used as it is, `01`, `02`,
//! `03` for a key transformed with SHA-256, SHA-384 or SHA-512, which must
//! then be 32, 48 or 64 bytes long. The key is 32, 48 or 64 bytes; the
//! CRC-32 (IEEE, as `crc32()` of zlib) of the key follows it, little endian.

use base64::Engine as _;
use zeroize::Zeroizing;

use super::{Digest, HashId};

/// Why a secret was refused. Never carries key bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Not of the form `DHHC-1:<hh>:<base64>:`.
    #[error("not a DH-HMAC-CHAP secret: expected DHHC-1:<hh>:<base64>:")]
    Format,
    /// The hash indicator is not 00 to 03.
    #[error("unknown hash indicator {0:?} (00 to 03)")]
    HashIndicator(String),
    /// The key part is not valid base64.
    #[error("the key is not valid base64")]
    Base64,
    /// The key is not 32, 48 or 64 bytes long.
    #[error("key of {0} bytes: 32, 48 or 64 expected")]
    Length(usize),
    /// The key's length does not suit the hash it is transformed with.
    #[error("a {len}-byte key with hash indicator {hash:02} ({} bytes expected)", HashId::from_id(*.hash).map_or(0, HashId::digest_len))]
    LengthForHash {
        /// Key length.
        len: usize,
        /// Hash indicator.
        hash: u8,
    },
    /// The CRC-32 after the key does not match it.
    #[error("CRC-32 mismatch: the secret is corrupt")]
    Crc,
}

/// A parsed DH-HMAC-CHAP secret. Debug output shows the hash and length,
/// never the key; the key is wiped on drop.
#[derive(Clone)]
pub struct Secret {
    key: Zeroizing<Vec<u8>>,
    hash: Option<HashId>,
}

impl Secret {
    /// Parses and checks a secret (format, hash indicator, base64, key
    /// length, length for the hash, CRC).
    pub fn parse(s: &str) -> Result<Self, SecretError> {
        let s = s.trim();
        // At most 64 key bytes and 4 CRC bytes: 92 base64 characters.
        if s.len() > 128 {
            return Err(SecretError::Format);
        }
        let rest = s.strip_prefix("DHHC-1:").ok_or(SecretError::Format)?;
        let (hh, rest) = rest.split_once(':').ok_or(SecretError::Format)?;
        let b64 = rest.strip_suffix(':').ok_or(SecretError::Format)?;
        if b64.contains(':') {
            return Err(SecretError::Format);
        }
        let hash = match hh {
            "00" => None,
            "01" | "02" | "03" => HashId::from_id(hh.as_bytes()[1] - b'0'),
            _ => return Err(SecretError::HashIndicator(hh.chars().take(4).collect())),
        };
        let raw = Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| SecretError::Base64)?,
        );
        let Some(len) = raw.len().checked_sub(4) else {
            return Err(SecretError::Length(0));
        };
        if ![32, 48, 64].contains(&len) {
            return Err(SecretError::Length(len));
        }
        if let Some(h) = hash {
            if h.digest_len() != len {
                return Err(SecretError::LengthForHash { len, hash: h.id() });
            }
        }
        let (key, crc) = raw.split_at(len);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(SecretError::Crc);
        }
        Ok(Self {
            key: Zeroizing::new(key.to_vec()),
            hash,
        })
    }

    /// The hash the key is transformed with (`None`: hash indicator 00).
    pub fn hash(&self) -> Option<HashId> {
        self.hash
    }

    /// The hash indicator (0 to 3).
    pub fn hash_indicator(&self) -> u8 {
        self.hash.map_or(0, HashId::id)
    }

    /// Key length in bytes.
    pub fn key_len(&self) -> usize {
        self.key.len()
    }

    /// The key transformed for `nqn` (the host NQN for a host secret, the
    /// subsystem NQN for a controller secret): `HMAC(key, nqn ||
    /// "NVMe-over-Fabrics")` with the indicated hash, or the key itself for
    /// indicator 00. This is the HMAC key of the responses.
    pub fn transform(&self, nqn: &str) -> TransformedKey {
        match self.hash {
            None => TransformedKey::Raw(self.key.clone()),
            Some(h) => {
                TransformedKey::Hashed(h.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]))
            }
        }
    }

    /// Whether both secrets hold the same key and hash indicator
    /// (constant time in the key bytes).
    pub fn same_as(&self, other: &Secret) -> bool {
        use subtle::ConstantTimeEq;
        self.hash == other.hash && bool::from(self.key.as_slice().ct_eq(other.key.as_slice()))
    }
}

impl std::str::FromStr for Secret {
    type Err = SecretError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Secret {{ hash: {:02}, len: {} }}",
            self.hash_indicator(),
            self.key.len()
        )
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DHHC-1:{:02}:<{} bytes hidden>:",
            self.hash_indicator(),
            self.key.len()
        )
    }
}

/// A transformed key: the HMAC key of a response. Wiped on drop.
pub enum TransformedKey {
    /// The key itself (hash indicator 00).
    Raw(Zeroizing<Vec<u8>>),
    /// The HMAC of the key over the NQN.
    Hashed(Digest),
}

impl TransformedKey {
    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Raw(k) => k,
            Self::Hashed(d) => d.as_bytes(),
        }
    }
}

impl std::fmt::Debug for TransformedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TransformedKey({} bytes)", self.as_bytes().len())
    }
}
