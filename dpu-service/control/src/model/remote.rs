//! Remote namespaces: namespaces backed by a namespace of another NVMe/TCP
//! target ([`super::Backend::Remote`]), which the NVMe-oF target reaches as
//! a host.
//!
//! What is stored is what the target connects with: every default is
//! resolved when the namespace is created (the host NQN too, so the
//! identity the remote's allow list names does not change under it when
//! the service's default does). The DH-HMAC-CHAP secret is kept as a
//! host's is ([`SecretText`]): in the state file only.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::SecretText;

/// A namespace of a remote NVMe/TCP subsystem, and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteNamespace {
    /// Transport addresses of the remote subsystem, in order of
    /// preference (1 ..= [`dpu_nvmeof::target::MAX_REMOTE_PATHS`], none
    /// twice).
    pub paths: Vec<SocketAddr>,
    /// The remote subsystem's NQN.
    pub subnqn: String,
    /// The namespace's ID there.
    pub nsid: u32,
    /// The host NQN the target connects with.
    pub host_nqn: String,
    /// The DH-HMAC-CHAP secret, for a remote that requires
    /// authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_secret: Option<SecretText>,
    /// Bound on each command to the remote, milliseconds.
    pub io_timeout_ms: u32,
    /// Bound on bringing up a connection on one path, milliseconds.
    pub connect_timeout_ms: u32,
    /// Most commands in flight to the remote at once.
    pub queue_depth: u16,
}

impl RemoteNamespace {
    /// The remote namespace as the NVMe-oF target opens it (the secret
    /// in its text form: the target authenticates with it).
    pub fn spec(&self) -> dpu_nvmeof::target::RemoteNamespace {
        let mut r = dpu_nvmeof::target::RemoteNamespace::new(
            self.paths.clone(),
            &self.subnqn,
            self.nsid,
            &self.host_nqn,
        );
        r.dhchap_secret = self.dhchap_secret.as_ref().map(|s| s.expose().to_string());
        r.io_timeout = Duration::from_millis(u64::from(self.io_timeout_ms));
        r.connect_timeout = Duration::from_millis(u64::from(self.connect_timeout_ms));
        r.queue_depth = self.queue_depth;
        r
    }

    /// Its paths as text, "ADDR:PORT" each ("\[ADDR\]:PORT" for IPv6),
    /// joined by ", ": how errors name the remote.
    pub fn addresses(&self) -> String {
        self.paths
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// How long bringing the namespace up may take at most: a connection
    /// on each path in turn, then a command or two on the one that
    /// answered.
    pub fn open_bound(&self) -> Duration {
        let paths = u32::try_from(self.paths.len()).unwrap_or(u32::MAX);
        Duration::from_millis(u64::from(self.connect_timeout_ms)) * paths
            + Duration::from_millis(u64::from(self.io_timeout_ms)) * 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:";

    fn remote() -> RemoteNamespace {
        RemoteNamespace {
            paths: vec![
                "10.0.0.1:4420".parse().unwrap(),
                "[fd00::1]:4421".parse().unwrap(),
            ],
            subnqn: "nqn.2024-01.io.example:remote".into(),
            nsid: 3,
            host_nqn: "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6".into(),
            dhchap_secret: Some(SecretText::parse(SECRET).unwrap().0),
            io_timeout_ms: 2_500,
            connect_timeout_ms: 750,
            queue_depth: 64,
        }
    }

    /// Every stored field reaches what the target opens; the host ID is
    /// the host NQN's UUID.
    #[test]
    fn the_target_gets_every_field() {
        let r = remote();
        let s = r.spec();
        assert_eq!(s.paths, r.paths);
        assert_eq!(s.subnqn, r.subnqn);
        assert_eq!(s.nsid, 3);
        assert_eq!(s.host_nqn, r.host_nqn);
        assert_eq!(&s.host_id[..4], &[0xf8, 0x1d, 0x4f, 0xae]);
        assert_eq!(s.dhchap_secret.as_deref(), Some(SECRET));
        assert_eq!(s.io_timeout, Duration::from_millis(2_500));
        assert_eq!(s.connect_timeout, Duration::from_millis(750));
        assert_eq!(s.queue_depth, 64);
        s.validate().unwrap();
        assert_eq!(r.addresses(), "10.0.0.1:4420, [fd00::1]:4421");
        assert_eq!(r.open_bound(), Duration::from_millis(2 * 750 + 2 * 2_500));
    }

    /// The state file keeps the secret and reads back as it was; `Debug`
    /// shows no key.
    #[test]
    fn the_secret_is_stored_and_never_shown() {
        let r = remote();
        let dbg = format!("{r:?}");
        assert!(!dbg.contains(&SECRET[10..40]), "{dbg}");
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(SECRET), "the state file keeps the secret");
        assert!(json.contains("\"[fd00::1]:4421\""), "{json}");
        let back: RemoteNamespace = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        let none = RemoteNamespace {
            dhchap_secret: None,
            ..r
        };
        let json = serde_json::to_string(&none).unwrap();
        assert!(!json.contains("dhchap_secret"), "{json}");
        assert_eq!(
            serde_json::from_str::<RemoteNamespace>(&json).unwrap(),
            none
        );
    }
}
