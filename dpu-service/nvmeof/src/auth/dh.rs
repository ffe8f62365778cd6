//! Finite-field Diffie-Hellman over the RFC 7919 groups (generator 2), with
//! `crypto-bigint`'s constant-time Montgomery exponentiation.
//!
//! Public values and the shared secret are big-endian and as wide as the
//! group's prime (256 bytes for ffdhe2048), as Linux and SPDK send and
//! derive them. A peer's public value must lie in 2..=p-2. Private
//! exponents are drawn from the OS CSPRNG with twice the group's security
//! strength in bits (RFC 7919 section 5.2 asks for at least 225 to 400).

use std::sync::{Arc, OnceLock};

use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::BoxedUint;
use zeroize::{Zeroize, Zeroizing};

/// A DH group of DH-HMAC-CHAP, by its identifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DhGroup {
    /// No Diffie-Hellman exchange (00h).
    Null = 0,
    /// ffdhe2048 (01h).
    Ffdhe2048 = 1,
    /// ffdhe3072 (02h).
    Ffdhe3072 = 2,
    /// ffdhe4096 (03h).
    Ffdhe4096 = 3,
    /// ffdhe6144 (04h).
    Ffdhe6144 = 4,
    /// ffdhe8192 (05h).
    Ffdhe8192 = 5,
}

/// Why a DH computation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DhError {
    /// The null group has no exchange.
    #[error("the null DH group has no key exchange")]
    NullGroup,
    /// The peer's public value is not as wide as the prime.
    #[error("DH public value of {got} bytes, {want} expected")]
    Length {
        /// Bytes received.
        got: usize,
        /// Bytes of the prime.
        want: usize,
    },
    /// The peer's public value is 0, 1, p-1 or not below p.
    #[error("DH public value out of range")]
    Range,
    /// The OS random number generator failed.
    #[error("the OS random number generator failed")]
    Random,
    /// The computation was never run: the DH pool's queue was full
    /// ([`super::pool::DhPool::submit`]).
    #[error("the DH pool is busy")]
    Busy,
}

impl DhGroup {
    /// Every group.
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    /// The group with identifier `id`, if known.
    pub fn from_id(id: u8) -> Option<Self> {
        Self::ALL.get(usize::from(id)).copied()
    }

    /// Its identifier on the wire.
    pub fn id(self) -> u8 {
        self as u8
    }

    /// Its name, as `nvme` tools spell it.
    pub fn name(self) -> &'static str {
        [
            "null",
            "ffdhe2048",
            "ffdhe3072",
            "ffdhe4096",
            "ffdhe6144",
            "ffdhe8192",
        ][self as usize]
    }

    /// Bits of the prime (0 for the null group).
    pub fn bits(self) -> u32 {
        [0, 2048, 3072, 4096, 6144, 8192][self as usize]
    }

    /// Bytes of a public value (0 for the null group).
    pub fn value_len(self) -> usize {
        self.bits() as usize / 8
    }

    /// Bits of a private exponent.
    fn exponent_bits(self) -> u32 {
        [0, 256, 320, 384, 448, 512][self as usize]
    }

    /// The prime, big endian hex (`None` for the null group).
    pub fn prime_hex(self) -> Option<&'static str> {
        match self {
            Self::Null => None,
            Self::Ffdhe2048 => Some(FFDHE2048),
            Self::Ffdhe3072 => Some(FFDHE3072),
            Self::Ffdhe4096 => Some(FFDHE4096),
            Self::Ffdhe6144 => Some(FFDHE6144),
            Self::Ffdhe8192 => Some(FFDHE8192),
        }
    }

    /// The prime, big endian, as wide as a public value.
    pub fn prime(self) -> Option<&'static [u8]> {
        self.group().map(|g| &g.prime[..])
    }

    fn group(self) -> Option<&'static Group> {
        static GROUPS: [OnceLock<Group>; 6] = [const { OnceLock::new() }; 6];
        let hex = self.prime_hex()?;
        Some(GROUPS[self as usize].get_or_init(|| Group::new(hex, self.bits())))
    }

    /// Draws a private exponent and computes the public value `2^x mod p`.
    pub fn generate(self) -> Result<KeyPair, DhError> {
        let mut x = Zeroizing::new(vec![0u8; self.exponent_bits() as usize / 8]);
        super::random(&mut x).map_err(|_| DhError::Random)?;
        self.key_pair(&x)
    }

    /// The key pair of private exponent `x` (big endian, at most the
    /// group's exponent size; tests use it for fixed vectors).
    pub fn key_pair(self, x: &[u8]) -> Result<KeyPair, DhError> {
        let g = self.group().ok_or(DhError::NullGroup)?;
        let exp_bits = self.exponent_bits();
        if x.len() > exp_bits as usize / 8 {
            return Err(DhError::Range);
        }
        let exponent = BoxedUint::from_be_slice(x, self.bits()).map_err(|_| DhError::Range)?;
        let two = BoxedMontyForm::new_with_arc(
            BoxedUint::from_be_slice(&[2], self.bits()).map_err(|_| DhError::Range)?,
            g.params.clone(),
        );
        let public = two.pow_bounded_exp(&exponent, exp_bits).retrieve();
        Ok(KeyPair {
            group: self,
            exponent,
            public: public.to_be_bytes().into_vec(),
        })
    }
}

/// A prime and its Montgomery parameters.
struct Group {
    prime: Vec<u8>,
    params: Arc<BoxedMontyParams>,
}

impl Group {
    fn new(hex: &str, bits: u32) -> Self {
        let prime: Vec<u8> = hex
            .as_bytes()
            .chunks(2)
            .map(|c| {
                let h = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
                h(c[0]) << 4 | h(c[1])
            })
            .collect();
        // The constants are odd and of the stated width (checked by the
        // tests); the fallbacks are never taken.
        let p = BoxedUint::from_be_slice(&prime, bits)
            .unwrap_or_else(|_| BoxedUint::one_with_precision(bits));
        let odd = Option::from(p.to_odd()).unwrap_or_else(|| {
            Option::from(BoxedUint::one_with_precision(bits).to_odd())
                .unwrap_or_else(|| unreachable!("1 is odd"))
        });
        Self {
            prime,
            params: Arc::new(BoxedMontyParams::new(odd)),
        }
    }
}

/// A private exponent and its public value.
pub struct KeyPair {
    group: DhGroup,
    exponent: BoxedUint,
    public: Vec<u8>,
}

impl KeyPair {
    /// The group.
    pub fn group(&self) -> DhGroup {
        self.group
    }

    /// The public value, big endian, as wide as the prime.
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// The shared secret with the peer's public value `peer`: `peer^x mod
    /// p`, big endian, as wide as the prime.
    pub fn shared_secret(&self, peer: &[u8]) -> Result<Zeroizing<Vec<u8>>, DhError> {
        let g = self.group.group().ok_or(DhError::NullGroup)?;
        if peer.len() != g.prime.len() {
            return Err(DhError::Length {
                got: peer.len(),
                want: g.prime.len(),
            });
        }
        // Public values are not secret: plain comparisons. The prime ends
        // in 0xff, so p-1 differs from it in the last byte only.
        let mut p_minus_1 = g.prime.clone();
        if let Some(last) = p_minus_1.last_mut() {
            *last -= 1;
        }
        let is_small = peer[..peer.len() - 1].iter().all(|&b| b == 0) && peer[peer.len() - 1] <= 1;
        if is_small || peer >= &p_minus_1[..] {
            return Err(DhError::Range);
        }
        let y = BoxedUint::from_be_slice(peer, self.group.bits()).map_err(|_| DhError::Range)?;
        let y = BoxedMontyForm::new_with_arc(y, g.params.clone());
        let mut s = y
            .pow_bounded_exp(&self.exponent, self.group.exponent_bits())
            .retrieve();
        let out = Zeroizing::new(s.to_be_bytes().into_vec());
        s.zeroize();
        Ok(out)
    }
}

impl Drop for KeyPair {
    fn drop(&mut self) {
        self.exponent.zeroize();
    }
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyPair({})", self.group.name())
    }
}

/// ffdhe2048 (RFC 7919 appendix A), big endian hex.
const FFDHE2048: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B423861285C97FFFFFFFFFFFFFFFF",
);

/// ffdhe3072 (RFC 7919 appendix A), big endian hex.
const FFDHE3072: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B66C62E37FFFFFFFFFFFFFFFF",
);

/// ffdhe4096 (RFC 7919 appendix A), big endian hex.
const FFDHE4096: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A",
    "7135C886EFB4318AED6A1E012D9E6832A907600A918130C46DC778F971AD0038",
    "092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E655F6AFFFFFFFFFFFFFFFF",
);

/// ffdhe6144 (RFC 7919 appendix A), big endian hex.
const FFDHE6144: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A",
    "7135C886EFB4318AED6A1E012D9E6832A907600A918130C46DC778F971AD0038",
    "092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E0DD9020BFD64B645036C7A",
    "4E677D2C38532A3A23BA4442CAF53EA63BB454329B7624C8917BDD64B1C0FD4C",
    "B38E8C334C701C3ACDAD0657FCCFEC719B1F5C3E4E46041F388147FB4CFDB477",
    "A52471F7A9A96910B855322EDB6340D8A00EF092350511E30ABEC1FFF9E3A26E",
    "7FB29F8C183023C3587E38DA0077D9B4763E4E4B94B2BBC194C6651E77CAF992",
    "EEAAC0232A281BF6B3A739C1226116820AE8DB5847A67CBEF9C9091B462D538C",
    "D72B03746AE77F5E62292C311562A846505DC82DB854338AE49F5235C95B9117",
    "8CCF2DD5CACEF403EC9D1810C6272B045B3B71F9DC6B80D63FDD4A8E9ADB1E69",
    "62A69526D43161C1A41D570D7938DAD4A40E329CD0E40E65FFFFFFFFFFFFFFFF",
);

/// ffdhe8192 (RFC 7919 appendix A), big endian hex.
const FFDHE8192: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A",
    "7135C886EFB4318AED6A1E012D9E6832A907600A918130C46DC778F971AD0038",
    "092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E0DD9020BFD64B645036C7A",
    "4E677D2C38532A3A23BA4442CAF53EA63BB454329B7624C8917BDD64B1C0FD4C",
    "B38E8C334C701C3ACDAD0657FCCFEC719B1F5C3E4E46041F388147FB4CFDB477",
    "A52471F7A9A96910B855322EDB6340D8A00EF092350511E30ABEC1FFF9E3A26E",
    "7FB29F8C183023C3587E38DA0077D9B4763E4E4B94B2BBC194C6651E77CAF992",
    "EEAAC0232A281BF6B3A739C1226116820AE8DB5847A67CBEF9C9091B462D538C",
    "D72B03746AE77F5E62292C311562A846505DC82DB854338AE49F5235C95B9117",
    "8CCF2DD5CACEF403EC9D1810C6272B045B3B71F9DC6B80D63FDD4A8E9ADB1E69",
    "62A69526D43161C1A41D570D7938DAD4A40E329CCFF46AAA36AD004CF600C838",
    "1E425A31D951AE64FDB23FCEC9509D43687FEB69EDD1CC5E0B8CC3BDF64B10EF",
    "86B63142A3AB8829555B2F747C932665CB2C0F1CC01BD70229388839D2AF05E4",
    "54504AC78B7582822846C0BA35C35F5C59160CC046FD8251541FC68C9C86B022",
    "BB7099876A460E7451A8A93109703FEE1C217E6C3826E52C51AA691E0E423CFC",
    "99E9E31650C1217B624816CDAD9A95F9D5B8019488D9C0A0A1FE3075A577E231",
    "83F81D4A3F2FA4571EFC8CE0BA8A4FE8B6855DFE72B0A66EDED2FBABFBE58A30",
    "FAFABE1C5D71A87E2F741EF8C1FE86FEA6BBFDE530677F0D97D11D49F7A8443D",
    "0822E506A9F4614E011E2A94838FF88CD68C8BB7C5C6424CFFFFFFFFFFFFFFFF",
);
