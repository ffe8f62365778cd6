//! Client identities: the names a client certificate carries.
//!
//! A client is known by its certificate's subject common name(s), its DNS
//! subject alternative names and its URI subject alternative names
//! (SPIFFE IDs, `spiffe://trust-domain/path`, are URI SANs). The
//! configuration names clients the same way ([`Name::parse`]); a client
//! matches an entry when its certificate carries that exact name.

use std::fmt;

use x509_cert::der::asn1::ObjectIdentifier;
use x509_cert::der::oid::AssociatedOid;
use x509_cert::der::{Decode, Tag, Tagged};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::Certificate;

/// The most names taken from one certificate; the rest are ignored.
pub const MAX_NAMES: usize = 64;
/// The longest name taken from a certificate, in bytes; longer ones are
/// ignored (they could not match a configured name, which is as bounded).
pub const MAX_NAME_LEN: usize = 1024;

/// `id-at-commonName`.
const COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");

/// One name of a client.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Name {
    /// A subject common name (`cn:…`).
    Cn(String),
    /// A DNS subject alternative name (`dns:…`).
    Dns(String),
    /// A URI subject alternative name, such as a SPIFFE ID (`uri:…`, or
    /// the bare `spiffe://…`).
    Uri(String),
}

impl Name {
    /// Parses a configured name: `cn:NAME`, `dns:NAME`, `uri:URI`, or a
    /// bare `spiffe://trust-domain/path`.
    ///
    /// # Errors
    /// Says which forms are understood, or why the value is unusable.
    pub fn parse(s: &str) -> Result<Name, String> {
        let (kind, value): (fn(String) -> Name, &str) = if let Some(v) = s.strip_prefix("cn:") {
            (Name::Cn, v)
        } else if let Some(v) = s.strip_prefix("dns:") {
            (Name::Dns, v)
        } else if let Some(v) = s.strip_prefix("uri:") {
            (Name::Uri, v)
        } else if s.starts_with("spiffe://") {
            (Name::Uri, s)
        } else {
            return Err(format!(
                "{s:?} is not a client identity: write cn:NAME, dns:NAME, uri:URI or spiffe://TRUST-DOMAIN/PATH"
            ));
        };
        if value.is_empty() {
            return Err(format!("{s:?} names nothing after its prefix"));
        }
        if value.len() > MAX_NAME_LEN {
            return Err(format!("{s:?} is longer than {MAX_NAME_LEN} bytes"));
        }
        if value.chars().any(char::is_control) {
            return Err(format!("{s:?} holds a control character"));
        }
        if let Some(rest) = value.strip_prefix("spiffe://") {
            let domain = rest.split('/').next().unwrap_or("");
            if domain.is_empty() {
                return Err(format!("{s:?}: a SPIFFE ID needs a trust domain"));
            }
        }
        Ok(kind(value.to_string()))
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Name::Cn(v) => write!(f, "cn:{v}"),
            Name::Dns(v) => write!(f, "dns:{v}"),
            Name::Uri(v) => write!(f, "uri:{v}"),
        }
    }
}

/// Why a certificate's names could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The certificate is not valid DER X.509.
    #[error("the client certificate cannot be parsed: {0}")]
    Certificate(String),
    /// Its subject alternative name extension is malformed.
    #[error("the client certificate's subjectAltName cannot be parsed: {0}")]
    SubjectAltName(String),
}

/// The names of the DER certificate `der`: subject common names, then
/// DNS and URI subject alternative names, in the certificate's order; at
/// most [`MAX_NAMES`], each at most [`MAX_NAME_LEN`] bytes of text. A
/// common name in an encoding other than UTF8String, PrintableString or
/// IA5String is skipped.
///
/// # Errors
/// When the certificate or its subjectAltName extension is malformed.
pub fn names(der: &[u8]) -> Result<Vec<Name>, IdentityError> {
    let cert = Certificate::from_der(der).map_err(|e| IdentityError::Certificate(e.to_string()))?;
    let tbs = &cert.tbs_certificate;
    let mut out = Vec::new();
    let mut push = |n: Name, text_len: usize| {
        if out.len() < MAX_NAMES && text_len <= MAX_NAME_LEN {
            out.push(n);
        }
    };
    for rdn in &tbs.subject.0 {
        for atv in rdn.0.iter() {
            if atv.oid != COMMON_NAME {
                continue;
            }
            if !matches!(
                atv.value.tag(),
                Tag::Utf8String | Tag::PrintableString | Tag::Ia5String
            ) {
                continue;
            }
            if let Ok(s) = std::str::from_utf8(atv.value.value()) {
                push(Name::Cn(s.to_string()), s.len());
            }
        }
    }
    for ext in tbs.extensions.iter().flatten() {
        if ext.extn_id != SubjectAltName::OID {
            continue;
        }
        let san = SubjectAltName::from_der(ext.extn_value.as_bytes())
            .map_err(|e| IdentityError::SubjectAltName(e.to_string()))?;
        for gn in san.0 {
            match gn {
                GeneralName::DnsName(s) => {
                    let s = s.to_string();
                    let len = s.len();
                    push(Name::Dns(s), len);
                }
                GeneralName::UniformResourceIdentifier(s) => {
                    let s = s.to_string();
                    let len = s.len();
                    push(Name::Uri(s), len);
                }
                _ => {}
            }
        }
    }
    Ok(out)
}
