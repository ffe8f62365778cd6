//! Secure-channel transitions: the TLS PSKs of a subsystem's hosts, and
//! the check that listeners on one address and port agree on whether
//! they speak TLS. Keys need nothing of the rest of the state but their
//! subsystem and host, as QoS limits do (`qos`): a subsystem holds keys
//! for at most [`MAX_HOSTS_PER_SUBSYSTEM`] hosts, each one it allows
//! ([`Subsystem::allows_host`]).

use crate::error::{ControlError, Result};
use crate::model::{Listener, PskText, State, Subsystem};
use crate::validate::MAX_HOSTS_PER_SUBSYSTEM;

impl State {
    /// Sets the TLS PSK of `host` on subsystem `id`, replacing the one it
    /// had, and returns the subsystem.
    ///
    /// # Errors
    /// NOT_FOUND for a subsystem that does not exist; FAILED_PRECONDITION
    /// for a host the subsystem does not allow (neither listed nor let in
    /// by `allow_any_host`), or a new host's key when
    /// [`MAX_HOSTS_PER_SUBSYSTEM`] hosts of the subsystem have keys
    /// already.
    pub fn set_host_tls_key(&mut self, id: &str, host: &str, psk: PskText) -> Result<&Subsystem> {
        let s = self
            .subsystems
            .get_mut(id)
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}")))?;
        if !s.allows_host(host) {
            return Err(ControlError::FailedPrecondition(format!(
                "host {host} is not allowed on subsystems/{id}: add it to the allow list \
                 (or set allow_any_host) before giving it a TLS key"
            )));
        }
        if !s.host_tls.contains_key(host) && s.host_tls.len() >= MAX_HOSTS_PER_SUBSYSTEM {
            return Err(ControlError::FailedPrecondition(format!(
                "subsystems/{id} already has TLS keys for the maximum of \
                 {MAX_HOSTS_PER_SUBSYSTEM} hosts; clear some first"
            )));
        }
        s.host_tls.insert(host.to_string(), psk);
        Ok(s)
    }

    /// Removes the TLS PSK of `host` on subsystem `id`.
    ///
    /// # Errors
    /// NOT_FOUND for a subsystem that does not exist, or a host without a
    /// key.
    pub fn clear_host_tls_key(&mut self, id: &str, host: &str) -> Result<&Subsystem> {
        let s = self
            .subsystems
            .get_mut(id)
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}")))?;
        if s.host_tls.remove(host).is_none() {
            return Err(ControlError::NotFound(format!(
                "TLS key of host {host} on subsystems/{id}"
            )));
        }
        Ok(s)
    }

    /// Why listener `l` cannot be created beside the state's listeners,
    /// as to its secure channel, or `None` if it can: listeners on one
    /// address and port (one socket: the service's own, or one
    /// endpoint's) agree on it.
    pub(super) fn secure_channel_conflict(&self, l: &Listener) -> Option<String> {
        self.subsystems.values().find_map(|s| {
            let o = s.listeners.values().find(|o| {
                o.transport == l.transport
                    && o.address == l.address
                    && o.port == l.port
                    && o.tenant == l.tenant
                    && o.secure_channel != l.secure_channel
            })?;
            Some(format!(
                "subsystems/{}/listeners/{} listens on {}:{} with secure channel {}; \
                 listeners on one address and port agree on it (not {})",
                s.id,
                o.id,
                o.address,
                o.port,
                o.secure_channel.as_str(),
                l.secure_channel.as_str()
            ))
        })
    }
}

impl Subsystem {
    /// Drops the TLS keys of the hosts the subsystem no longer allows,
    /// after its allow list or `allow_any_host` changed.
    pub(super) fn keep_tls_of_allowed_hosts(&mut self) {
        let Subsystem {
            host_tls,
            allow_any_host,
            allowed_hosts,
            ..
        } = self;
        if !*allow_any_host {
            host_tls.retain(|h, _| allowed_hosts.contains(h));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{SecureChannel, Transport};
    use crate::state::{Limits, SubsystemUpdate};

    const H1: &str = "nqn.2024-01.io.example:h1";
    const H2: &str = "nqn.2024-01.io.example:h2";
    const PSK: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";

    fn state() -> State {
        let mut s = State::default();
        for id in ["a", "b"] {
            s.create_subsystem(
                Limits::with_ram(1 << 20),
                crate::state::tests::subsystem(
                    id,
                    &format!("nqn.2024-01.io.example:{id}"),
                    false,
                    0,
                ),
            )
            .unwrap();
        }
        s
    }

    fn psk() -> PskText {
        PskText::parse(PSK).unwrap().0
    }

    fn listener(id: &str, port: u16, channel: SecureChannel) -> Listener {
        Listener {
            id: id.into(),
            transport: Transport::Tcp,
            address: "10.0.0.1".parse().unwrap(),
            port,
            tenant: None,
            mac: None,
            secure_channel: channel,
        }
    }

    #[test]
    fn keys_are_for_allowed_hosts_and_follow_the_allow_list() {
        let lim = Limits::with_ram(1 << 20);
        let mut s = state();
        assert!(matches!(
            s.set_host_tls_key("a", H1, psk()),
            Err(ControlError::FailedPrecondition(m)) if m.contains("not allowed")
        ));
        assert!(matches!(
            s.set_host_tls_key("x", H1, psk()),
            Err(ControlError::NotFound(_))
        ));
        s.add_host(lim, "a", H1).unwrap();
        s.add_host(lim, "a", H2).unwrap();
        s.set_host_tls_key("a", H1, psk()).unwrap();
        s.set_host_tls_key("a", H2, psk()).unwrap();
        // The same key again with another derivation replaces it.
        let compat = psk().with_v0_derivation(crate::model::TlsDerivation::Compat);
        s.set_host_tls_key("a", H2, compat.clone()).unwrap();
        assert_eq!(s.subsystems["a"].host_tls[H2], compat);
        s.remove_host("a", H1).unwrap();
        assert_eq!(s.subsystems["a"].host_tls.keys().collect::<Vec<_>>(), [H2]);
        s.update_subsystem(
            lim,
            "a",
            SubsystemUpdate {
                allowed_hosts: Some(Default::default()),
                tls_requirement: Some(crate::model::TlsRequirement::Required),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(s.subsystems["a"].host_tls.is_empty());
        assert_eq!(
            s.subsystems["a"].tls_requirement,
            crate::model::TlsRequirement::Required
        );
        assert!(matches!(
            s.clear_host_tls_key("a", H1),
            Err(ControlError::NotFound(_))
        ));

        // With any host allowed, any host may have a key, until that ends.
        let any = |a| SubsystemUpdate {
            allow_any_host: Some(a),
            ..Default::default()
        };
        s.update_subsystem(lim, "a", any(true)).unwrap();
        s.set_host_tls_key("a", H1, psk()).unwrap();
        s.clear_host_tls_key("a", H1).unwrap();
        s.set_host_tls_key("a", H1, psk()).unwrap();
        s.update_subsystem(lim, "a", any(false)).unwrap();
        assert!(s.subsystems["a"].host_tls.is_empty());
    }

    #[test]
    fn keys_are_capped_per_subsystem() {
        let lim = Limits::with_ram(1 << 20);
        let mut s = state();
        s.update_subsystem(
            lim,
            "a",
            SubsystemUpdate {
                allow_any_host: Some(true),
                ..Default::default()
            },
        )
        .unwrap();
        for i in 0..MAX_HOSTS_PER_SUBSYSTEM {
            s.set_host_tls_key("a", &format!("nqn.2024-01.io.example:h{i}"), psk())
                .unwrap();
        }
        assert!(matches!(
            s.set_host_tls_key("a", "nqn.2024-01.io.example:over", psk()),
            Err(ControlError::FailedPrecondition(m)) if m.contains("maximum")
        ));
        // Replacing a key is no new host.
        s.set_host_tls_key("a", "nqn.2024-01.io.example:h0", psk())
            .unwrap();
    }

    #[test]
    fn listeners_on_one_address_and_port_agree_on_the_secure_channel() {
        let lim = Limits::with_ram(1 << 20);
        let mut s = state();
        s.create_listener(lim, "a", listener("l1", 4420, SecureChannel::Required))
            .unwrap();
        let e = s
            .create_listener(lim, "b", listener("l2", 4420, SecureChannel::None))
            .unwrap_err();
        assert!(
            matches!(&e, ControlError::FailedPrecondition(m)
                if m.contains("subsystems/a/listeners/l1") && m.contains("required")),
            "{e:?}"
        );
        s.create_listener(lim, "b", listener("l2", 4420, SecureChannel::Required))
            .unwrap();
        s.create_listener(lim, "b", listener("l3", 4421, SecureChannel::Allowed))
            .unwrap();

        // A storage endpoint's listener speaks TLS too; one in a tenant's
        // network is another socket than the service's own on the same
        // address and port.
        let mut l = listener("l4", 4420, SecureChannel::Allowed);
        l.tenant = Some("t".into());
        assert_eq!(s.secure_channel_conflict(&l), None);
    }
}
