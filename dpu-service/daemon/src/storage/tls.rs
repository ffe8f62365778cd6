//! The secure channel, applied to the targets: the hosts' TLS PSKs and
//! the subsystems' TLS requirements on the daemon's target and the
//! tenants' (as [`Storage::apply_auth`] gives out DH-HMAC-CHAP keys), and
//! whether each listener address speaks TLS: the kernel listeners' on the
//! daemon's target, each storage endpoint's on its tenant's. Never logs a
//! key.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use dpu_control::model::{SecureChannel, State, Transport};

use super::Storage;

/// What [`Storage::apply_tls`] gave the targets last, to take back what
/// the next state no longer has.
#[derive(Debug, Default)]
pub(super) struct TlsApplied {
    /// (subsystem NQN, host NQN) pairs with keys.
    keys: BTreeSet<(String, String)>,
    /// Subsystem NQNs with a requirement other than the default.
    required: BTreeSet<String>,
    /// Kernel listener addresses that speak TLS.
    channels: BTreeSet<SocketAddr>,
    /// Storage endpoint addresses that speak TLS, with their tenant.
    endpoint_channels: BTreeSet<(String, SocketAddr)>,
}

/// The secure channel of each kernel listener address of `state` that
/// speaks TLS. Listeners on one address agree on it (the state refuses
/// one that does not); of a state file edited to disagree, the strictest
/// wins.
pub(super) fn kernel_channels(state: &State) -> BTreeMap<SocketAddr, SecureChannel> {
    channels(state)
        .into_iter()
        .filter_map(|((tenant, addr), c)| tenant.is_none().then_some((addr, c)))
        .collect()
}

/// As [`kernel_channels`], for the storage endpoints: by tenant and
/// address.
pub(super) fn endpoint_channels(state: &State) -> BTreeMap<(String, SocketAddr), SecureChannel> {
    channels(state)
        .into_iter()
        .filter_map(|((tenant, addr), c)| Some(((tenant?, addr), c)))
        .collect()
}

/// The secure channel of every listener address that speaks TLS, by
/// tenant (`None`: the service's own sockets) and address.
fn channels(state: &State) -> BTreeMap<(Option<String>, SocketAddr), SecureChannel> {
    let mut out = BTreeMap::new();
    for l in state.subsystems.values().flat_map(|s| s.listeners.values()) {
        if l.transport != Transport::Tcp || l.secure_channel.is_none() {
            continue;
        }
        let c = out
            .entry((l.tenant.clone(), SocketAddr::new(l.address, l.port)))
            .or_insert(l.secure_channel);
        if l.secure_channel == SecureChannel::Required {
            *c = SecureChannel::Required;
        }
    }
    out
}

impl Storage {
    /// Gives the targets the TLS keys and requirements of `state` and
    /// takes back those it no longer has; each takes effect at the next
    /// handshake or Connect, sessions established stay. Sets the secure
    /// channel of every listener address (a storage endpoint's on its
    /// tenant's target), and resets those no longer listened on with TLS
    /// to none.
    ///
    /// Every key of `state` is given again, with how it derives version 0
    /// identities' PSKs: a key set again with only that changed reaches
    /// the targets too.
    ///
    /// A key that does not parse (only a state file edited by hand:
    /// requests are checked before they are stored) fails closed: the
    /// error is logged, without the key, and the subsystem requires TLS
    /// of every host, so that host cannot connect.
    pub(super) fn apply_tls(&self, state: &State, tenants: &[(String, dpu_nvmeof::Target)]) {
        let targets: Vec<&dpu_nvmeof::Target> = std::iter::once(&self.target)
            .chain(tenants.iter().map(|(_, t)| t))
            .collect();
        let mut now = TlsApplied::default();
        for s in state.subsystems.values() {
            let mut broken = false;
            for (host, k) in &s.host_tls {
                // `psk()` carries the key's version 0 derivation.
                match k.psk() {
                    Ok(psk) => {
                        for t in &targets {
                            t.set_tls_key(&s.nqn, host, Some(psk.clone()));
                        }
                        now.keys.insert((s.nqn.clone(), host.clone()));
                    }
                    Err(e) => {
                        tracing::error!(subsystem = %s.id, host = %host, error = %e, "a TLS key in the state does not parse; the subsystem requires TLS of every host until it is set again");
                        broken = true;
                    }
                }
            }
            let required = if broken {
                Some(true)
            } else {
                s.tls_requirement.target_policy()
            };
            for t in &targets {
                t.set_tls_required(&s.nqn, required);
            }
            if required.is_some() {
                now.required.insert(s.nqn.clone());
            }
        }
        for (addr, c) in kernel_channels(state) {
            self.target.set_secure_channel(addr, c.target());
            now.channels.insert(addr);
        }
        let tenant = |name: &str| tenants.iter().find(|(t, _)| t == name).map(|(_, t)| t);
        for ((name, addr), c) in endpoint_channels(state) {
            if let Some(t) = tenant(&name) {
                t.set_secure_channel(addr, c.target());
                now.endpoint_channels.insert((name, addr));
            }
        }
        let mut last = self.tls_applied.lock().unwrap_or_else(|e| e.into_inner());
        for t in &targets {
            for (sub, host) in last.keys.difference(&now.keys) {
                t.set_tls_key(sub, host, None);
            }
            for sub in last.required.difference(&now.required) {
                t.set_tls_required(sub, None);
            }
        }
        for addr in last.channels.difference(&now.channels) {
            self.target
                .set_secure_channel(*addr, dpu_nvmeof::SecureChannel::None);
        }
        for (name, addr) in last.endpoint_channels.difference(&now.endpoint_channels) {
            if let Some(t) = tenant(name) {
                t.set_secure_channel(*addr, dpu_nvmeof::SecureChannel::None);
            }
        }
        *last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpu_control::model::{Listener, Subsystem, Timestamp};

    fn listener(id: &str, port: u16, tenant: Option<&str>, c: SecureChannel) -> Listener {
        Listener {
            id: id.into(),
            transport: Transport::Tcp,
            address: "10.0.0.1".parse().unwrap(),
            port,
            tenant: tenant.map(String::from),
            mac: None,
            secure_channel: c,
        }
    }

    /// Listeners that speak TLS, by address: the kernel's apart from the
    /// storage endpoints' (by tenant); listeners without TLS are left
    /// out, and of listeners a state file was edited to make disagree,
    /// the strictest wins.
    #[test]
    fn kernel_channels_by_address() {
        let mut state = State::default();
        for (sid, ls) in [
            (
                "a",
                vec![
                    listener("l1", 4420, None, SecureChannel::Allowed),
                    listener("l2", 4421, None, SecureChannel::None),
                    listener("l3", 4422, Some("t"), SecureChannel::Required),
                ],
            ),
            (
                "b",
                vec![listener("l1", 4420, None, SecureChannel::Required)],
            ),
        ] {
            state.subsystems.insert(
                sid.into(),
                Subsystem {
                    id: sid.into(),
                    nqn: format!("nqn.2024-01.io.example:{sid}"),
                    serial_number: "s".into(),
                    model_number: "m".into(),
                    allow_any_host: true,
                    allowed_hosts: Default::default(),
                    max_namespaces: 1,
                    create_time: Timestamp::default(),
                    namespaces: Default::default(),
                    listeners: ls.into_iter().map(|l| (l.id.clone(), l)).collect(),
                    auth_requirement: Default::default(),
                    host_auth: Default::default(),
                    host_qos: Default::default(),
                    tls_requirement: Default::default(),
                    host_tls: Default::default(),
                },
            );
        }
        assert_eq!(
            kernel_channels(&state).into_iter().collect::<Vec<_>>(),
            [(
                SocketAddr::from(([10, 0, 0, 1], 4420)),
                SecureChannel::Required
            )]
        );
        assert_eq!(
            endpoint_channels(&state).into_iter().collect::<Vec<_>>(),
            [(
                ("t".to_string(), SocketAddr::from(([10, 0, 0, 1], 4422))),
                SecureChannel::Required
            )]
        );
    }
}
