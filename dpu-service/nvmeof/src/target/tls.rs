//! The secure channel (NVMe/TCP TLS 1.3 with pre-shared keys): which
//! listeners speak it, the keys of hosts per subsystem, which hosts must
//! use it, and the acceptor the transport makes its handshakes with.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use dpu_tls::{Acceptor, ConfiguredPsk};

use super::{Inner, Target};

/// Whether a listener speaks TLS (the discovery log's TREQ and TSAS say
/// so to hosts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SecureChannel {
    /// Clear text only.
    #[default]
    None,
    /// TLS or clear text, as each host chooses (by its first byte).
    Allowed,
    /// TLS only: a clear-text connection is closed, counted.
    Required,
}

impl SecureChannel {
    /// The name configuration uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Allowed => "allowed",
            Self::Required => "required",
        }
    }
}

impl fmt::Display for SecureChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SecureChannel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "allowed" => Ok(Self::Allowed),
            "required" => Ok(Self::Required),
            other => Err(format!(
                "unknown secure channel {other:?} (none, allowed or required)"
            )),
        }
    }
}

/// The secure channel's settings.
#[derive(Default)]
pub(super) struct TlsConfig {
    /// Listeners that speak TLS, by address.
    channels: HashMap<SocketAddr, SecureChannel>,
    /// Configured PSKs by (subsystem NQN, host NQN).
    keys: HashMap<(String, String), ConfiguredPsk>,
    /// Whether a subsystem requires TLS of every host, where set; by
    /// default it does of each host that has a key.
    required: HashMap<String, bool>,
    /// Made on first use.
    acceptor: Option<Acceptor>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("channels", &self.channels)
            .field("keys", &self.keys.len())
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

/// Counts of the secure channel, in [`TargetStats`](super::TargetStats).
#[derive(Debug, Default)]
pub struct TlsStats {
    /// Handshakes completed.
    pub handshakes: AtomicU64,
    /// Handshakes refused: the identity named no key this target has for
    /// that host and subsystem, or was not NVMe's.
    pub refused_unknown_key: AtomicU64,
    /// Handshakes that failed: a wrong key, a broken or non-TLS-1.3 hello,
    /// the host closing.
    pub failed: AtomicU64,
    /// Handshakes not done within the handshake timeout.
    pub timeouts: AtomicU64,
    /// Handshakes refused because too many were under way (from all
    /// hosts, or from the host's address).
    pub busy: AtomicU64,
    /// Clear-text connections closed on a listener that requires TLS.
    pub clear_text_refused: AtomicU64,
    /// Connects refused: a host the subsystem requires TLS of came in
    /// clear text.
    pub connects_without_tls: AtomicU64,
    /// Connects refused: over TLS, but naming another host or subsystem
    /// than the TLS identity.
    pub connects_identity_mismatch: AtomicU64,
}

impl TlsStats {
    pub(crate) fn count(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

impl Target {
    /// Makes the listener on `addr` speak TLS (`Allowed`, `Required`) or
    /// not (`None`, the default). Connections accepted from now on follow
    /// it.
    pub fn set_secure_channel(&self, addr: SocketAddr, channel: SecureChannel) {
        let mut t = self.inner.tls.write().expect("tls lock");
        match channel {
            SecureChannel::None => t.channels.remove(&addr),
            c => t.channels.insert(addr, c),
        };
    }

    /// Whether the listener on `addr` speaks TLS.
    pub fn secure_channel(&self, addr: SocketAddr) -> SecureChannel {
        self.inner
            .tls
            .read()
            .expect("tls lock")
            .channels
            .get(&addr)
            .copied()
            .unwrap_or_default()
    }

    /// Sets (`Some`) or removes (`None`) the TLS pre-shared key of host
    /// `hostnqn` on subsystem `subnqn`. Handshakes from now on use it;
    /// sessions established stay.
    pub fn set_tls_key(&self, subnqn: &str, hostnqn: &str, key: Option<ConfiguredPsk>) {
        let mut t = self.inner.tls.write().expect("tls lock");
        let k = (subnqn.to_owned(), hostnqn.to_owned());
        match key {
            Some(key) => t.keys.insert(k, key),
            None => t.keys.remove(&k),
        };
    }

    /// Makes subsystem `subnqn` require TLS of every host (`Some(true)`),
    /// of none (`Some(false)`), or (`None`, the default) of each host that
    /// has a key. A host required to use it whose queue comes in clear
    /// text is refused at Connect.
    pub fn set_tls_required(&self, subnqn: &str, required: Option<bool>) {
        let mut t = self.inner.tls.write().expect("tls lock");
        match required {
            Some(r) => t.required.insert(subnqn.to_owned(), r),
            None => t.required.remove(subnqn),
        };
    }

    /// Whether `hostnqn`'s queues on `subnqn` must come over TLS.
    pub fn tls_required(&self, subnqn: &str, hostnqn: &str) -> bool {
        let t = self.inner.tls.read().expect("tls lock");
        t.required.get(subnqn).copied().unwrap_or_else(|| {
            t.keys
                .contains_key(&(subnqn.to_owned(), hostnqn.to_owned()))
        })
    }

    /// The acceptor of the target's TLS handshakes: it finds each host's
    /// key among those set with [`Target::set_tls_key`] when the host
    /// names it.
    ///
    /// # Errors
    /// OpenSSL cannot make a TLS 1.3 context.
    pub fn tls_acceptor(&self) -> Result<Acceptor, String> {
        if let Some(a) = &self.inner.tls.read().expect("tls lock").acceptor {
            return Ok(a.clone());
        }
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let acceptor = Acceptor::new(Arc::new(move |sub: &str, host: &str| {
            let inner = weak.upgrade()?;
            let t = inner.tls.read().expect("tls lock");
            t.keys.get(&(sub.to_owned(), host.to_owned())).cloned()
        }))
        .map_err(|e| format!("cannot make a TLS 1.3 context: {e}"))?;
        self.inner.tls.write().expect("tls lock").acceptor = Some(acceptor.clone());
        Ok(acceptor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_with_a_key_must_use_tls_unless_the_subsystem_says_otherwise() {
        let t = Target::new();
        let key = ConfiguredPsk::new(&[1; 32], None).unwrap();
        assert!(!t.tls_required("nqn.s", "nqn.h"));
        t.set_tls_key("nqn.s", "nqn.h", Some(key));
        assert!(t.tls_required("nqn.s", "nqn.h"));
        assert!(!t.tls_required("nqn.s", "nqn.other"));
        assert!(!t.tls_required("nqn.other-s", "nqn.h"));
        t.set_tls_required("nqn.s", Some(true));
        assert!(t.tls_required("nqn.s", "nqn.other"));
        t.set_tls_required("nqn.s", Some(false));
        assert!(!t.tls_required("nqn.s", "nqn.h"));
        t.set_tls_required("nqn.s", None);
        t.set_tls_key("nqn.s", "nqn.h", None);
        assert!(!t.tls_required("nqn.s", "nqn.h"));
    }

    #[test]
    fn listeners_speak_clear_text_unless_set() {
        let t = Target::new();
        let a: SocketAddr = "127.0.0.1:4420".parse().unwrap();
        assert_eq!(t.secure_channel(a), SecureChannel::None);
        t.set_secure_channel(a, SecureChannel::Required);
        assert_eq!(t.secure_channel(a), SecureChannel::Required);
        t.set_secure_channel(a, SecureChannel::None);
        assert_eq!(t.secure_channel(a), SecureChannel::None);
        for s in ["none", "allowed", "required"] {
            assert_eq!(s.parse::<SecureChannel>().unwrap().as_str(), s);
        }
        assert!("tls"
            .parse::<SecureChannel>()
            .unwrap_err()
            .contains("none, allowed or required"));
    }
}
