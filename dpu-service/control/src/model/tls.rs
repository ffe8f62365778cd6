//! The secure channel (NVMe/TCP TLS 1.3 with pre-shared keys, NVMe TP
//! 8011) in the domain model: whether a listener speaks it, whether a
//! subsystem's hosts must use it, and the hosts' configured PSKs.
//!
//! A PSK is kept as the interchange text it was given in, checked by
//! [`ConfiguredPsk::parse`] before it is stored, like the DH-HMAC-CHAP
//! secrets ([`super::SecretText`]): only the state file (mode 0600)
//! holds it, never a response, the log, a metric or `Debug` output.

use dpu_nvmeof::dpu_tls::{ConfiguredPsk, Derivation, PskError};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

/// Whether a listener speaks TLS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecureChannel {
    /// Clear text only.
    #[default]
    None,
    /// TLS or clear text, as each host chooses.
    Allowed,
    /// TLS only.
    Required,
}

impl SecureChannel {
    /// True for [`SecureChannel::None`], which the state file leaves out.
    pub fn is_none(&self) -> bool {
        *self == Self::None
    }

    /// What [`dpu_nvmeof::Target::set_secure_channel`] takes for it.
    pub fn target(self) -> dpu_nvmeof::SecureChannel {
        match self {
            Self::None => dpu_nvmeof::SecureChannel::None,
            Self::Allowed => dpu_nvmeof::SecureChannel::Allowed,
            Self::Required => dpu_nvmeof::SecureChannel::Required,
        }
    }

    /// The name configuration and messages use: "none", "allowed",
    /// "required".
    pub fn as_str(self) -> &'static str {
        self.target().as_str()
    }
}

/// Whether hosts must connect to a subsystem over TLS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TlsRequirement {
    /// A host with a key must use TLS; one without need not.
    #[default]
    HostsWithKey,
    /// Every host must use TLS.
    Required,
    /// No host must.
    Disabled,
}

impl TlsRequirement {
    /// What [`dpu_nvmeof::Target::set_tls_required`] takes for it.
    pub fn target_policy(self) -> Option<bool> {
        match self {
            Self::HostsWithKey => None,
            Self::Required => Some(true),
            Self::Disabled => Some(false),
        }
    }
}

/// How a host whose TLS identity is version 0 (no digest to tell)
/// derives the TLS PSK from its configured PSK.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TlsDerivation {
    /// As the NVMe specification says.
    #[default]
    Spec,
    /// As libnvme long did (Debian 13's nvme-cli 2.13).
    Compat,
}

impl TlsDerivation {
    /// True for [`TlsDerivation::Spec`], which the state file leaves out.
    pub fn is_spec(&self) -> bool {
        *self == Self::Spec
    }

    /// What [`ConfiguredPsk::with_v0_derivation`] takes for it.
    pub fn target(self) -> Derivation {
        match self {
            Self::Spec => Derivation::Spec,
            Self::Compat => Derivation::Compat,
        }
    }

    /// The name configuration, the CLI and messages use: "spec",
    /// "compat".
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Spec => "spec",
            Self::Compat => "compat",
        }
    }

    /// The derivation named `name` ("spec" or "compat"), or `None`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "spec" => Some(Self::Spec),
            "compat" => Some(Self::Compat),
            _ => None,
        }
    }
}

/// A configured TLS PSK in its `NVMeTLSkey-1:` interchange form, with how
/// version 0 identities derive from it. Its `Debug` shows no key, and the
/// text is wiped when dropped.
///
/// The state file holds a spec key as the bare text (as before the
/// derivation was a setting, so older state files load as spec), a compat
/// one as `{"psk": "...", "v0_derivation": "compat"}`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StoredPsk", into = "StoredPsk")]
pub struct PskText {
    text: Zeroizing<String>,
    v0: TlsDerivation,
}

/// [`PskText`] as the state file spells it.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum StoredPsk {
    Spec(Zeroizing<String>),
    Derived {
        psk: Zeroizing<String>,
        #[serde(default)]
        v0_derivation: TlsDerivation,
    },
}

impl From<StoredPsk> for PskText {
    fn from(s: StoredPsk) -> Self {
        match s {
            StoredPsk::Spec(text) => Self {
                text,
                v0: TlsDerivation::Spec,
            },
            StoredPsk::Derived { psk, v0_derivation } => Self {
                text: psk,
                v0: v0_derivation,
            },
        }
    }
}

impl From<PskText> for StoredPsk {
    fn from(k: PskText) -> Self {
        if k.v0.is_spec() {
            Self::Spec(k.text)
        } else {
            Self::Derived {
                psk: k.text,
                v0_derivation: k.v0,
            }
        }
    }
}

impl PskText {
    /// Parses `text` and keeps it (trimmed) with what it parsed to; the
    /// derivation is spec until [`PskText::with_v0_derivation`].
    ///
    /// # Errors
    /// As [`ConfiguredPsk::parse`]; the error never carries key bytes.
    pub fn parse(text: &str) -> Result<(Self, ConfiguredPsk), PskError> {
        let psk = ConfiguredPsk::parse(text)?;
        let k = Self {
            text: Zeroizing::new(text.trim().to_string()),
            v0: TlsDerivation::Spec,
        };
        Ok((k, psk))
    }

    /// This key, with version 0 identities deriving as `d` says.
    pub fn with_v0_derivation(mut self, d: TlsDerivation) -> Self {
        self.v0 = d;
        self
    }

    /// How version 0 identities derive from this key.
    pub fn v0_derivation(&self) -> TlsDerivation {
        self.v0
    }

    /// The parsed key, deriving version 0 identities as set.
    ///
    /// # Errors
    /// As [`ConfiguredPsk::parse`]: only for a state file edited by hand.
    pub fn psk(&self) -> Result<ConfiguredPsk, PskError> {
        Ok(ConfiguredPsk::parse(&self.text)?.with_v0_derivation(self.v0.target()))
    }

    /// The key's hash indicator: 0 (none), 1 (SHA-256), 2 (SHA-384); 0
    /// for one that does not parse.
    pub fn hash_code(&self) -> u8 {
        self.psk().map_or(0, |k| k.hash().code())
    }
}

impl std::fmt::Debug for PskText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PskText(<{} hidden bytes>, v0 {})",
            self.text.len(),
            self.v0.as_str()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SHA-256 PSK, as `nvme gen-tls-key` prints one.
    pub(crate) const PSK: &str =
        "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";

    /// A stored key shows in no `Debug` output, and reads back from the
    /// state file's JSON as it was.
    #[test]
    fn stored_keys_hide_from_debug_and_round_trip() {
        let (text, psk) = PskText::parse(&format!(" {PSK}\n")).unwrap();
        assert_eq!(psk.hash().code(), 1);
        assert_eq!(text.hash_code(), 1);
        for dbg in [format!("{text:?}"), format!("{psk:?}")] {
            assert!(!dbg.contains(&PSK[16..40]), "{dbg}");
        }
        let json = serde_json::to_string(&text).unwrap();
        assert_eq!(json, format!("\"{PSK}\""), "the state file keeps the key");
        let back: PskText = serde_json::from_str(&json).unwrap();
        assert_eq!(back, text);
        assert!(PskText::parse("NVMeTLSkey-1:01:AAAA:").is_err());
    }

    /// A compat key keeps its derivation through the state file and gives
    /// it to the target's key; a spec key is stored as before, and one
    /// stored before the setting existed loads as spec.
    #[test]
    fn derivation_round_trips_and_reaches_the_key() {
        let (spec, _) = PskText::parse(PSK).unwrap();
        assert_eq!(spec.v0_derivation(), TlsDerivation::Spec);
        assert_eq!(spec.psk().unwrap().v0_derivation(), Derivation::Spec);
        let compat = spec.clone().with_v0_derivation(TlsDerivation::Compat);
        assert_eq!(compat.psk().unwrap().v0_derivation(), Derivation::Compat);
        assert_ne!(compat, spec);
        assert!(!format!("{compat:?}").contains(&PSK[16..40]));
        let json = serde_json::to_string(&compat).unwrap();
        assert_eq!(
            json,
            format!("{{\"psk\":\"{PSK}\",\"v0_derivation\":\"compat\"}}")
        );
        let back: PskText = serde_json::from_str(&json).unwrap();
        assert_eq!(back, compat);
        let old: PskText = serde_json::from_str(&format!("\"{PSK}\"")).unwrap();
        assert_eq!(old, spec);
        assert!(serde_json::from_str::<PskText>(&format!(
            "{{\"psk\":\"{PSK}\",\"v0_derivation\":\"other\"}}"
        ))
        .is_err());
        assert_eq!(
            TlsDerivation::from_name("compat"),
            Some(TlsDerivation::Compat)
        );
        assert_eq!(TlsDerivation::from_name("Spec"), None);
        assert_eq!(TlsDerivation::Spec.as_str(), "spec");
    }

    /// The state file spells the settings in snake case, and a listener
    /// without a secure channel writes none.
    #[test]
    fn settings_map_to_the_target() {
        assert_eq!(
            serde_json::to_string(&SecureChannel::Allowed).unwrap(),
            "\"allowed\""
        );
        assert_eq!(SecureChannel::Required.as_str(), "required");
        assert_eq!(
            SecureChannel::Allowed.target(),
            dpu_nvmeof::SecureChannel::Allowed
        );
        assert!(SecureChannel::default().is_none());
        assert_eq!(TlsRequirement::HostsWithKey.target_policy(), None);
        assert_eq!(TlsRequirement::Required.target_policy(), Some(true));
        assert_eq!(TlsRequirement::Disabled.target_policy(), Some(false));
        assert_eq!(
            serde_json::to_string(&TlsRequirement::HostsWithKey).unwrap(),
            "\"hosts_with_key\""
        );
    }
}
