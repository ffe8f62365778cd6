//! Pre-shared keys of the NVMe/TCP secure channel (NVMe TCP Transport
//! Specification 1.0, 3.6.1): the interchange format a configured PSK is
//! given in, the retained PSK derived from it, and the TLS PSK identity and
//! TLS PSK a host and a subsystem derive from that, as `nvme gen-tls-key`,
//! libnvme and the Linux target do.
//!
//! - The configured PSK `NVMeTLSkey-1:HH:<base64(key || crc32)>:` names
//!   the hash (`01` SHA-256, `02` SHA-384, `00` none: the key is used as
//!   the retained PSK) that turns it into the retained PSK:
//!   `HKDF-Expand-Label(HKDF-Extract(0, key), "HostNQN", NQNh, len)`.
//! - The identity is `NVMe0R0H NQNh NQNs` (version 0) or `NVMe1R0H NQNh
//!   NQNs digest` (version 1), `H` the hash of the cipher suite and the
//!   digest `base64(HMAC(retained, NQNh " " NQNs " NVMe-over-Fabrics"))`.
//! - The TLS PSK is `HKDF-Expand-Label(HKDF-Extract(0, retained),
//!   "nvme-tls-psk", context, len)`, the context being the identity
//!   (version 0) or `"0H digest"` (version 1).

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Sha256, Sha384};
use zeroize::Zeroizing;

/// The hash of a PSK: of its transformation and of the TLS 1.3 cipher
/// suite it is used with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PskHash {
    /// SHA-256: 32-byte keys, `TLS_AES_128_GCM_SHA256`.
    Sha256,
    /// SHA-384: 48-byte keys, `TLS_AES_256_GCM_SHA384`.
    Sha384,
}

impl PskHash {
    /// The two-digit code of the interchange format and the identity.
    pub fn code(self) -> u8 {
        match self {
            Self::Sha256 => 1,
            Self::Sha384 => 2,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Sha256),
            2 => Some(Self::Sha384),
            _ => None,
        }
    }

    /// Output length of the hash, and length of its keys, in bytes.
    pub fn key_len(self) -> usize {
        match self {
            Self::Sha256 => 32,
            Self::Sha384 => 48,
        }
    }

    /// The TLS 1.3 cipher suite a PSK of this hash is used with.
    pub fn cipher_suite(self) -> &'static str {
        match self {
            Self::Sha256 => "TLS_AES_128_GCM_SHA256",
            Self::Sha384 => "TLS_AES_256_GCM_SHA384",
        }
    }

    fn for_len(len: usize) -> Option<Self> {
        match len {
            32 => Some(Self::Sha256),
            48 => Some(Self::Sha384),
            _ => None,
        }
    }
}

/// Why a PSK or an identity was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PskError {
    /// Not `NVMeTLSkey-1:HH:<base64>:`.
    #[error("not a TLS PSK in the interchange format (NVMeTLSkey-1:01:<base64>:)")]
    Format,
    /// A hash code other than 00, 01 or 02.
    #[error("unknown PSK hash {0:02} (00, 01 or 02)")]
    Hash(u8),
    /// The key is neither 32 nor 48 bytes, or not the length its hash takes.
    #[error("a PSK of {len} bytes cannot be used with hash {hash:02} (01: 32 bytes, 02: 48 bytes, 00: either)")]
    Length {
        /// The key's length.
        len: usize,
        /// The hash code.
        hash: u8,
    },
    /// The CRC-32 does not match the key.
    #[error("the PSK's CRC-32 does not match: the key was mistyped or cut")]
    Crc,
    /// Not an NVMe TLS PSK identity.
    #[error("not an NVMe TLS PSK identity (NVMe0R01 <hostnqn> <subnqn>)")]
    Identity,
}

/// How the retained PSK and the TLS PSK are derived from a key: HKDF's
/// info as the specification has it, or as Linux hosts' libnvme long did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Derivation {
    /// RFC 8446's `HkdfLabel` (its length big-endian, label and context
    /// each after a length byte), as TP 8011 says: libnvme's default since
    /// it was corrected, SPDK.
    #[default]
    Spec,
    /// The info as libnvme built it before (and still does with nvme-cli's
    /// `--compat`): the length little-endian, then "tls13 " and the label
    /// and the context with no length bytes. Debian 13's nvme-cli 2.13
    /// derives this way.
    Compat,
}

/// A configured PSK, as read from the interchange format. The key is
/// wiped when dropped and never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfiguredPsk {
    /// The hash that makes the retained PSK; `None`: the key is the
    /// retained PSK.
    transform: Option<PskHash>,
    key: Zeroizing<Vec<u8>>,
    /// How a version 0 identity's PSK is derived (version 1's digest tells
    /// which derivation the host used).
    v0: Derivation,
}

impl fmt::Debug for ConfiguredPsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfiguredPsk")
            .field("transform", &self.transform)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl ConfiguredPsk {
    /// Reads `NVMeTLSkey-1:HH:<base64 of key and CRC-32>:`, checking the
    /// CRC-32 as the specification requires.
    ///
    /// # Errors
    /// The text is not in the format, its hash is unknown, its key has a
    /// length the hash does not take, or its CRC-32 does not match.
    pub fn parse(text: &str) -> Result<Self, PskError> {
        let rest = text
            .trim()
            .strip_prefix("NVMeTLSkey-1:")
            .ok_or(PskError::Format)?;
        let (code, rest) = rest.split_once(':').ok_or(PskError::Format)?;
        let b64 = rest.strip_suffix(':').ok_or(PskError::Format)?;
        if code.len() != 2 || !code.bytes().all(|b| b.is_ascii_digit()) || b64.contains(':') {
            return Err(PskError::Format);
        }
        let code: u8 = code.parse().map_err(|_| PskError::Format)?;
        let raw = Zeroizing::new(STANDARD.decode(b64).map_err(|_| PskError::Format)?);
        if raw.len() < 4 {
            return Err(PskError::Format);
        }
        let (key, crc) = raw.split_at(raw.len() - 4);
        let transform = match code {
            0 => None,
            c => Some(PskHash::from_code(c).ok_or(PskError::Hash(c))?),
        };
        let fits = match transform {
            None => PskHash::for_len(key.len()).is_some(),
            Some(h) => h.key_len() == key.len(),
        };
        if !fits {
            return Err(PskError::Length {
                len: key.len(),
                hash: code,
            });
        }
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(PskError::Crc);
        }
        Ok(Self {
            transform,
            key: Zeroizing::new(key.to_vec()),
            v0: Derivation::Spec,
        })
    }

    /// This key, deriving the TLS PSK of version 0 identities (which carry
    /// no digest to tell) as `d` says.
    pub fn with_v0_derivation(mut self, d: Derivation) -> Self {
        self.v0 = d;
        self
    }

    /// How this key derives version 0 identities' TLS PSKs.
    pub fn v0_derivation(&self) -> Derivation {
        self.v0
    }

    /// A configured PSK of `key` (32 or 48 bytes) made into the retained
    /// PSK with `transform` (or used as it is).
    ///
    /// # Errors
    /// The key's length does not fit the hash.
    pub fn new(key: &[u8], transform: Option<PskHash>) -> Result<Self, PskError> {
        let fits = match transform {
            None => PskHash::for_len(key.len()).is_some(),
            Some(h) => h.key_len() == key.len(),
        };
        if !fits {
            return Err(PskError::Length {
                len: key.len(),
                hash: transform.map_or(0, PskHash::code),
            });
        }
        Ok(Self {
            transform,
            key: Zeroizing::new(key.to_vec()),
            v0: Derivation::Spec,
        })
    }

    /// The key in the interchange format (a secret: for key files, never
    /// for logs).
    pub fn to_interchange(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(self.key.to_vec());
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        Zeroizing::new(format!(
            "NVMeTLSkey-1:{:02}:{}:",
            self.transform.map_or(0, PskHash::code),
            STANDARD.encode(&*raw)
        ))
    }

    /// The hash of the cipher suite this key is used with.
    pub fn hash(&self) -> PskHash {
        self.transform
            .or_else(|| PskHash::for_len(self.key.len()))
            .expect("checked when made")
    }

    /// The retained PSK of this key for host `hostnqn`.
    pub fn retained(&self, hostnqn: &str, d: Derivation) -> Zeroizing<Vec<u8>> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => expand_label(
                h,
                d,
                &self.key,
                b"HostNQN",
                hostnqn.as_bytes(),
                self.key.len(),
            ),
        }
    }

    /// The identity and TLS PSK a host presents (and a subsystem expects)
    /// with this key, in identity `version` 0 or 1, derived as the
    /// specification says.
    pub fn tls_psk(&self, version: u8, hostnqn: &str, subnqn: &str) -> (String, TlsPsk) {
        self.tls_psk_with(version, hostnqn, subnqn, Derivation::Spec)
    }

    /// As [`ConfiguredPsk::tls_psk`], derived as `d` says.
    pub fn tls_psk_with(
        &self,
        version: u8,
        hostnqn: &str,
        subnqn: &str,
        d: Derivation,
    ) -> (String, TlsPsk) {
        let hash = self.hash();
        let retained = self.retained(hostnqn, d);
        let (identity, context) = if version == 0 {
            let id = format!("NVMe0R{:02} {hostnqn} {subnqn}", hash.code());
            (id.clone(), id)
        } else {
            let digest = digest(hash, &retained, hostnqn, subnqn);
            (
                format!("NVMe1R{:02} {hostnqn} {subnqn} {digest}", hash.code()),
                format!("{:02} {digest}", hash.code()),
            )
        };
        let key = expand_label(
            hash,
            d,
            &retained,
            b"nvme-tls-psk",
            context.as_bytes(),
            hash.key_len(),
        );
        (identity, TlsPsk { hash, key })
    }
}

/// The key a TLS 1.3 handshake uses, and the hash of its cipher suite.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsPsk {
    /// Hash of the cipher suite.
    pub hash: PskHash,
    /// The key (wiped when dropped).
    pub key: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for TlsPsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsPsk")
            .field("hash", &self.hash)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// A TLS PSK identity a host presented, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// 0 or 1.
    pub version: u8,
    /// Hash of the cipher suite.
    pub hash: PskHash,
    /// The host's NQN.
    pub hostnqn: String,
    /// The subsystem's NQN.
    pub subnqn: String,
    /// Version 1: the PSK digest.
    pub digest: Option<String>,
}

impl Identity {
    /// Reads `NVMe0R0H NQNh NQNs` or `NVMe1R0H NQNh NQNs digest`. Only
    /// retained PSKs (`R`) are taken: generated ones (`G`, from an
    /// authentication's secure channel concatenation) are not offered.
    ///
    /// # Errors
    /// Anything else.
    pub fn parse(id: &[u8]) -> Result<Self, PskError> {
        // Two NQNs of at most 223 bytes, a digest of at most 64.
        if id.len() > 8 + 2 * 224 + 65 {
            return Err(PskError::Identity);
        }
        let id = std::str::from_utf8(id).map_err(|_| PskError::Identity)?;
        let mut parts = id.split(' ');
        let head = parts.next().ok_or(PskError::Identity)?.as_bytes();
        let [b'N', b'V', b'M', b'e', v @ (b'0' | b'1'), b'R', b'0', h] = *head else {
            return Err(PskError::Identity);
        };
        let hash = PskHash::from_code(h.wrapping_sub(b'0')).ok_or(PskError::Identity)?;
        let version = v - b'0';
        let hostnqn = parts.next().ok_or(PskError::Identity)?;
        let subnqn = parts.next().ok_or(PskError::Identity)?;
        let digest = if version == 1 {
            Some(parts.next().ok_or(PskError::Identity)?.to_string())
        } else {
            None
        };
        // NQNs are 1..=223 printable bytes; a digest is base64 of a hash.
        let nqn_ok =
            |n: &str| (1..=223).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_graphic());
        let digest_ok = digest.as_deref().is_none_or(|d| {
            (1..=64).contains(&d.len())
                && d.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
        });
        if parts.next().is_some() || !nqn_ok(hostnqn) || !nqn_ok(subnqn) || !digest_ok {
            return Err(PskError::Identity);
        }
        Ok(Self {
            version,
            hash,
            hostnqn: hostnqn.into(),
            subnqn: subnqn.into(),
            digest,
        })
    }

    /// The TLS PSK of this identity under `key`, the configured PSK of its
    /// host on its subsystem; `None` if the key does not make this
    /// identity (another hash, or a digest that does not match).
    ///
    /// A version 1 identity's digest also tells how the host derived its
    /// keys ([`Derivation`]): both are tried. A version 0 identity gets
    /// the key's [`ConfiguredPsk::v0_derivation`].
    pub fn tls_psk(&self, key: &ConfiguredPsk) -> Option<TlsPsk> {
        if key.hash() != self.hash {
            return None;
        }
        let tried: &[Derivation] = if self.version == 0 {
            &[key.v0]
        } else {
            &[Derivation::Spec, Derivation::Compat]
        };
        let expected = self.to_string();
        for &d in tried {
            let (id, psk) = key.tls_psk_with(self.version, &self.hostnqn, &self.subnqn, d);
            // The digest is a function of the key: compare in constant time.
            let same = id.len() == expected.len()
                && id
                    .bytes()
                    .zip(expected.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0;
            if same {
                return Some(psk);
            }
        }
        None
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NVMe{}R{:02} {} {}",
            self.version,
            self.hash.code(),
            self.hostnqn,
            self.subnqn
        )?;
        if let Some(d) = &self.digest {
            write!(f, " {d}")?;
        }
        Ok(())
    }
}

/// `base64(HMAC(retained, NQNh " " NQNs " " "NVMe-over-Fabrics"))`.
fn digest(hash: PskHash, retained: &[u8], hostnqn: &str, subnqn: &str) -> String {
    let parts: [&[u8]; 5] = [
        hostnqn.as_bytes(),
        b" ",
        subnqn.as_bytes(),
        b" ",
        b"NVMe-over-Fabrics",
    ];
    match hash {
        PskHash::Sha256 => STANDARD.encode(hmac::<Hmac<Sha256>>(retained, &parts)),
        PskHash::Sha384 => STANDARD.encode(hmac::<Hmac<Sha384>>(retained, &parts)),
    }
}

fn hmac<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut m =
        <M as hmac::digest::KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().to_vec()
}

/// `HKDF-Expand-Label(HKDF-Extract(0, secret), label, context, len)`
/// (RFC 8446 7.1, with the "tls13 " prefix), for `len` at most the hash's
/// length (one block).
/// With [`Derivation::Compat`], the info is libnvme's old one: the
/// length little-endian, the label and the context without length bytes.
fn expand_label(
    hash: PskHash,
    d: Derivation,
    secret: &[u8],
    label: &[u8],
    context: &[u8],
    len: usize,
) -> Zeroizing<Vec<u8>> {
    debug_assert!(len <= hash.key_len());
    let full_label = [b"tls13 ".as_slice(), label].concat();
    let mut info = Vec::with_capacity(4 + full_label.len() + context.len());
    match d {
        Derivation::Spec => {
            info.extend_from_slice(&(len as u16).to_be_bytes());
            // Labels and contexts of a u8 length: NQNs and identities are
            // shorter.
            info.push(full_label.len() as u8);
            info.extend_from_slice(&full_label);
            info.push(context.len().min(255) as u8);
            info.extend_from_slice(&context[..context.len().min(255)]);
        }
        Derivation::Compat => {
            info.extend_from_slice(&(len as u16).to_le_bytes());
            info.extend_from_slice(&full_label);
            info.extend_from_slice(context);
        }
    }
    let zeros = vec![0u8; hash.key_len()];
    let (prk, t1) = match hash {
        PskHash::Sha256 => {
            let prk = Zeroizing::new(hmac::<Hmac<Sha256>>(&zeros, &[secret]));
            let t1 = hmac::<Hmac<Sha256>>(&prk, &[&info, &[1]]);
            (prk, t1)
        }
        PskHash::Sha384 => {
            let prk = Zeroizing::new(hmac::<Hmac<Sha384>>(&zeros, &[secret]));
            let t1 = hmac::<Hmac<Sha384>>(&prk, &[&info, &[1]]);
            (prk, t1)
        }
    };
    drop(prk);
    let mut t1 = Zeroizing::new(t1);
    t1.truncate(len);
    t1
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY32: [u8; 32] = [
        0x55, 0x12, 0xDB, 0xB6, 0x73, 0x7D, 0x01, 0x06, 0xF6, 0x59, 0x75, 0xB7, 0x73, 0xDF, 0xB0,
        0x11, 0xFF, 0xC3, 0x44, 0xBC, 0xF4, 0x42, 0xE2, 0xDD, 0x6D, 0x8B, 0xC4, 0x87, 0x0B, 0x5D,
        0x5B, 0x03,
    ];

    fn key48() -> Vec<u8> {
        [&KEY32[..], &KEY32[16..]].concat()
    }

    /// The specification's example and libnvme's test vectors.
    #[test]
    fn interchange_format_vectors() {
        let spec = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
        let k = ConfiguredPsk::parse(spec).unwrap();
        assert_eq!(
            (k.transform, &k.key[..]),
            (Some(PskHash::Sha256), &KEY32[..])
        );
        assert_eq!(*k.to_interchange(), spec);
        let none = "NVMeTLSkey-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
        let k = ConfiguredPsk::parse(none).unwrap();
        assert_eq!((k.transform, k.hash()), (None, PskHash::Sha256));
        let k48 = "NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ==:";
        let k = ConfiguredPsk::parse(k48).unwrap();
        assert_eq!(&k.key[..], &key48()[..]);
        assert_eq!(*k.to_interchange(), k48);
        assert!(!format!("{k:?}").contains("VRLb"));
    }

    #[test]
    fn bad_keys_are_refused_by_reason() {
        let good = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
        let cases = [
            (good.replace("-1:", "-2:"), PskError::Format),
            (good[..good.len() - 1].to_string(), PskError::Format),
            (format!("{good}:"), PskError::Format),
            ("NVMeTLSkey-1:01:!!!!:".into(), PskError::Format),
            ("NVMeTLSkey-1:01:AAAA:".into(), PskError::Format),
            (
                "NVMeTLSkey-1:01:AAAAAAAA:".into(),
                PskError::Length { len: 2, hash: 1 },
            ),
            (good.replace(":01:", ":03:"), PskError::Hash(3)),
            (good.replace(":01:", ":1:"), PskError::Format),
            (
                good.replace(":01:", ":02:"),
                PskError::Length { len: 32, hash: 2 },
            ),
            (good.replace("VRLb", "VRLc"), PskError::Crc),
            (String::new(), PskError::Format),
        ];
        for (text, want) in cases {
            assert_eq!(ConfiguredPsk::parse(&text), Err(want), "{text}");
        }
    }

    /// libnvme's `test/psk.c` identities (version 1, hashes 01 and 02).
    #[test]
    fn identity_vectors() {
        let (h, s) = ("nqn.psk-test-host", "nqn.psk-test-subsys");
        let k = ConfiguredPsk::new(&KEY32, Some(PskHash::Sha256)).unwrap();
        assert_eq!(
            k.tls_psk(1, h, s).0,
            "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys iSbjiStwJ/1TrTvDlt2fjFmzvsytOJelidNnA+X5lEU="
        );
        let k = ConfiguredPsk::new(&key48(), Some(PskHash::Sha384)).unwrap();
        assert_eq!(
            k.tls_psk(1, h, s).0,
            "NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys QhW2+Rp6RzHlNtCslyRxMnwJ11tKKhz8JCAQpQ+XUD8f9td1VeH5h53yz2wKJG1a"
        );
        assert_eq!(
            k.tls_psk(0, h, s).0,
            "NVMe0R02 nqn.psk-test-host nqn.psk-test-subsys"
        );
    }

    /// libnvme's compat identities (`test/psk.c`), and Debian 13's
    /// nvme-cli 2.13, which derives that way: its `check-tls-key
    /// --identity=1 --insert` named this identity for the example key.
    #[test]
    fn compat_identity_vectors() {
        let (h, s) = ("nqn.psk-test-host", "nqn.psk-test-subsys");
        let k = ConfiguredPsk::new(&KEY32, Some(PskHash::Sha256)).unwrap();
        let id = |k: &ConfiguredPsk, h, s| k.tls_psk_with(1, h, s, Derivation::Compat).0;
        assert_eq!(
            id(&k, h, s),
            "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys 66GuqV08TsAGII39teWUfwQwizjv06Jy8jOcX3NAAzM="
        );
        let k48 = ConfiguredPsk::new(&key48(), Some(PskHash::Sha384)).unwrap();
        assert_eq!(
            id(&k48, h, s),
            "NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys RsKmYJ3nAn1ApjjMloJFbAkLPivONDAX/xW327YBUsn2eGShXSjCZvBaOxscLqmz"
        );
        let trixie = id(
            &k,
            "nqn.2014-08.org.nvmexpress:uuid:f87887f3-9a71-4185-bf31-42e98df7cc53",
            "nqn.2024-01.io.dpu-service:tls",
        );
        assert!(
            trixie.ends_with(" mIkCJ72WkenXWrl3THIREoDipDS0/cXzBthuF+75CqY="),
            "{trixie}"
        );
        // The target takes either host's version 1 identity.
        for d in [Derivation::Spec, Derivation::Compat] {
            let (text, psk) = k.tls_psk_with(1, h, s, d);
            let parsed = Identity::parse(text.as_bytes()).unwrap();
            assert_eq!(parsed.tls_psk(&k), Some(psk));
        }
        // Version 0 carries no digest: the key says.
        let (text, psk) = k.tls_psk_with(0, h, s, Derivation::Compat);
        let parsed = Identity::parse(text.as_bytes()).unwrap();
        assert_ne!(parsed.tls_psk(&k).as_ref(), Some(&psk));
        let kc = k.clone().with_v0_derivation(Derivation::Compat);
        assert_eq!(parsed.tls_psk(&kc), Some(psk));
    }

    /// The TLS PSK against an independent HKDF (RFC 5869, written out
    /// from HMAC here) and the identity round trip.
    #[test]
    fn tls_psk_follows_hkdf_expand_label() {
        let k = ConfiguredPsk::new(&KEY32, Some(PskHash::Sha256)).unwrap();
        let retained = k.retained("nqn.h", Derivation::Spec);
        // HKDF-Extract with no salt is HMAC(zeros, IKM); one Expand block.
        let prk = hmac::<Hmac<Sha256>>(&[0; 32], &[&KEY32]);
        let mut info = vec![0, 32, 13];
        info.extend_from_slice(b"tls13 HostNQN");
        info.push(5);
        info.extend_from_slice(b"nqn.h");
        assert_eq!(
            &retained[..],
            &hmac::<Hmac<Sha256>>(&prk, &[&info, &[1]])[..]
        );

        for version in [0, 1] {
            let (id, psk) = k.tls_psk(version, "nqn.h", "nqn.s");
            let parsed = Identity::parse(id.as_bytes()).unwrap();
            assert_eq!(parsed.to_string(), id);
            assert_eq!(parsed.tls_psk(&k).as_ref(), Some(&psk));
            assert_eq!(psk.key.len(), 32);
            // Another key, or another host's identity, does not match.
            let other = ConfiguredPsk::new(&[7; 32], Some(PskHash::Sha256)).unwrap();
            if version == 1 {
                assert_eq!(parsed.tls_psk(&other), None);
            }
            let k384 = ConfiguredPsk::new(&key48(), None).unwrap();
            assert_eq!(parsed.tls_psk(&k384), None);
        }
    }

    #[test]
    fn identities_that_are_not_nvmes_are_refused() {
        for bad in [
            &b""[..],
            b"NVMe0R01",
            b"NVMe0R01 host",
            b"NVMe0R03 host sub",
            b"NVMe0G01 host sub",
            b"NVMe2R01 host sub",
            b"NVMe1R01 host sub",
            b"NVMe0R01 host sub extra",
            b"NVMe0R01  sub",
            b"NVMe0R01 ho\x01st sub",
            b"NVMe1R01 host sub !!!",
            b"\xff\xfe",
            &[b'a'; 1000],
        ] {
            assert_eq!(Identity::parse(bad), Err(PskError::Identity), "{bad:?}");
        }
    }
}
