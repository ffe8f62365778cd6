//! QoS transitions: the limits of a namespace, of a host on a subsystem,
//! and of a tenant's storage. Limits need nothing of the rest of the state
//! but their namespace, host or tenant, so they are set without caps of
//! [`super::Limits`];
//! a subsystem holds limits for at most [`MAX_HOSTS_PER_SUBSYSTEM`]
//! hosts, each one it allows ([`Subsystem::allows_host`]).

use crate::error::{ControlError, Result};
use crate::model::{Namespace, QosLimits, State, Subsystem, Tenant};
use crate::validate::MAX_HOSTS_PER_SUBSYSTEM;

impl State {
    /// Sets the limits of namespace `nsid` of subsystem `id` (all zero:
    /// none) and returns the namespace.
    ///
    /// # Errors
    /// NOT_FOUND for a subsystem or namespace that does not exist.
    pub fn set_namespace_qos(&mut self, id: &str, nsid: u32, qos: QosLimits) -> Result<&Namespace> {
        let s = self
            .subsystems
            .get_mut(id)
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}")))?;
        let ns = s
            .namespaces
            .get_mut(&nsid)
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}/namespaces/{nsid}")))?;
        ns.qos = qos;
        Ok(ns)
    }

    /// Sets the limits of `host` on subsystem `id` (all zero: removes
    /// them) and returns the subsystem.
    ///
    /// # Errors
    /// NOT_FOUND for a subsystem that does not exist; FAILED_PRECONDITION
    /// for a host the subsystem does not allow (neither listed nor let in
    /// by `allow_any_host`), or a new host's limits when the subsystem has
    /// limits for [`MAX_HOSTS_PER_SUBSYSTEM`] hosts already.
    pub fn set_host_qos(&mut self, id: &str, host: &str, qos: QosLimits) -> Result<&Subsystem> {
        let s = self
            .subsystems
            .get_mut(id)
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}")))?;
        if qos.is_none() {
            s.host_qos.remove(host);
            return Ok(s);
        }
        if !s.allows_host(host) {
            return Err(ControlError::FailedPrecondition(format!(
                "host {host} is not allowed on subsystems/{id}: add it to the allow list \
                 (or set allow_any_host) before giving it QoS limits"
            )));
        }
        if !s.host_qos.contains_key(host) && s.host_qos.len() >= MAX_HOSTS_PER_SUBSYSTEM {
            return Err(ControlError::FailedPrecondition(format!(
                "subsystems/{id} already has QoS limits for the maximum of \
                 {MAX_HOSTS_PER_SUBSYSTEM} hosts; clear some first"
            )));
        }
        s.host_qos.insert(host.to_string(), qos);
        Ok(s)
    }
}

impl State {
    /// Sets the limits on all the storage I/O of tenant `id`'s storage
    /// endpoints together (all zero: none) and returns the tenant. They
    /// hold whether or not the tenant has endpoints yet, and go with it.
    ///
    /// # Errors
    /// NOT_FOUND for a tenant that does not exist.
    pub fn set_tenant_storage_qos(&mut self, id: &str, qos: QosLimits) -> Result<&Tenant> {
        let t = self
            .tenants
            .get_mut(id)
            .ok_or_else(|| ControlError::NotFound(format!("tenants/{id}")))?;
        t.storage_qos = qos;
        Ok(t)
    }
}

impl Subsystem {
    /// Drops the QoS limits of the hosts the subsystem no longer allows,
    /// after its allow list or `allow_any_host` changed.
    pub(super) fn keep_qos_of_allowed_hosts(&mut self) {
        let Subsystem {
            host_qos,
            allow_any_host,
            allowed_hosts,
            ..
        } = self;
        if !*allow_any_host {
            host_qos.retain(|h, _| allowed_hosts.contains(h));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Backend, Timestamp};
    use crate::state::{Limits, SubsystemUpdate};

    const H1: &str = "nqn.2024-01.io.example:h1";
    const H2: &str = "nqn.2024-01.io.example:h2";

    fn state() -> State {
        let mut s = State::default();
        s.create_subsystem(
            Limits::with_ram(1 << 20),
            crate::state::tests::subsystem("a", "nqn.2024-01.io.example:a", false, 4),
        )
        .unwrap();
        s
    }

    fn iops(n: u64) -> QosLimits {
        QosLimits {
            iops: n,
            ..QosLimits::default()
        }
    }

    #[test]
    fn namespace_limits_are_set_cleared_and_go_with_the_namespace() {
        let lim = Limits::with_ram(1 << 20);
        let mut s = state();
        assert!(matches!(
            s.set_namespace_qos("a", 1, iops(10)),
            Err(ControlError::NotFound(m)) if m == "subsystems/a/namespaces/1"
        ));
        assert!(matches!(
            s.set_namespace_qos("b", 1, iops(10)),
            Err(ControlError::NotFound(m)) if m == "subsystems/b"
        ));
        let ns = Namespace {
            namespace_id: String::new(),
            eui64: None,
            nsid: 1,
            backend: Backend::Ram { size_bytes: 4096 },
            block_size: 512,
            uuid: [0; 16],
            nguid: [0; 16],
            qos: iops(5),
        };
        s.create_namespace(lim, "a", ns.clone(), false, false)
            .unwrap();
        assert_eq!(s.subsystems["a"].namespaces[&1].qos, iops(5));
        assert_eq!(s.set_namespace_qos("a", 1, iops(10)).unwrap().qos, iops(10));
        s.set_namespace_qos("a", 1, QosLimits::default()).unwrap();
        assert!(s.subsystems["a"].namespaces[&1].qos.is_none());
        s.set_namespace_qos("a", 1, iops(10)).unwrap();
        s.delete_namespace("a", 1).unwrap();
        let again = s
            .create_namespace(
                lim,
                "a",
                Namespace {
                    qos: QosLimits::default(),
                    ..ns
                },
                false,
                false,
            )
            .unwrap();
        assert!(
            again.qos.is_none(),
            "a new namespace starts without the old one's limits"
        );
    }

    #[test]
    fn host_limits_follow_what_the_subsystem_allows() {
        let lim = Limits::with_ram(0);
        let mut s = state();
        assert!(matches!(
            s.set_host_qos("a", H1, iops(10)),
            Err(ControlError::FailedPrecondition(m)) if m.contains("not allowed")
        ));
        // Clearing what is not set is no error.
        s.set_host_qos("a", H1, QosLimits::default()).unwrap();
        s.add_host(lim, "a", H1).unwrap();
        s.set_host_qos("a", H1, iops(10)).unwrap();
        assert_eq!(s.subsystems["a"].host_qos[H1], iops(10));
        // Removing the host drops its limits; adding it back does not
        // bring them back.
        s.remove_host("a", H1).unwrap();
        assert!(s.subsystems["a"].host_qos.is_empty());
        s.add_host(lim, "a", H1).unwrap();
        assert!(s.subsystems["a"].host_qos.is_empty());

        // Any host, listed or not, with allow_any_host; turning it off
        // keeps the listed host's limits only.
        let any = |on| SubsystemUpdate {
            allow_any_host: Some(on),
            ..Default::default()
        };
        s.update_subsystem(lim, "a", any(true)).unwrap();
        s.set_host_qos("a", H1, iops(1)).unwrap();
        s.set_host_qos("a", H2, iops(2)).unwrap();
        s.update_subsystem(lim, "a", any(false)).unwrap();
        assert_eq!(s.subsystems["a"].host_qos.keys().collect::<Vec<_>>(), [H1]);
        // A new allow list: a host taken off it loses its limits, as with
        // RemoveHost, even while allow_any_host lets it in; a host never
        // listed keeps them.
        let list = |hosts: &[&str]| SubsystemUpdate {
            allowed_hosts: Some(hosts.iter().map(|h| h.to_string()).collect()),
            ..Default::default()
        };
        s.update_subsystem(lim, "a", any(true)).unwrap();
        s.set_host_qos("a", H2, iops(2)).unwrap();
        s.update_subsystem(lim, "a", list(&[])).unwrap();
        assert_eq!(s.subsystems["a"].host_qos.keys().collect::<Vec<_>>(), [H2]);
        s.update_subsystem(lim, "a", list(&[H1, H2])).unwrap();
        s.set_host_qos("a", H1, iops(1)).unwrap();
        s.update_subsystem(lim, "a", any(false)).unwrap();
        s.update_subsystem(lim, "a", list(&[H2])).unwrap();
        assert_eq!(
            s.subsystems["a"].host_qos.keys().collect::<Vec<_>>(),
            [H2],
            "the host still listed keeps its limits"
        );
        s.set_host_qos("a", H2, QosLimits::default()).unwrap();
        assert!(s.subsystems["a"].host_qos.is_empty());
    }

    #[test]
    fn tenant_storage_limits_are_set_cleared_and_go_with_the_tenant() {
        use crate::model::{Action, RuleSet};
        let mut s = State::default();
        assert!(matches!(
            s.set_tenant_storage_qos("red", iops(10)),
            Err(ControlError::NotFound(m)) if m == "tenants/red"
        ));
        let red = Tenant {
            id: "red".into(),
            display_name: String::new(),
            attachments: Vec::new(),
            default_policy: Action::Deny,
            create_time: Timestamp::now(),
            rules: RuleSet::default(),
            storage_qos: QosLimits::default(),
            vlan_id: 0,
            no_offload: false,
        };
        s.tenants.insert("red".into(), red.clone());
        let t = s.set_tenant_storage_qos("red", iops(10)).unwrap();
        assert_eq!(t.storage_qos, iops(10));
        s.set_tenant_storage_qos("red", QosLimits::default())
            .unwrap();
        assert!(s.tenants["red"].storage_qos.is_none());
        s.set_tenant_storage_qos("red", iops(10)).unwrap();
        s.delete_tenant("red", false).unwrap();
        assert!(s.tenants.is_empty(), "the limits went with the tenant");
    }

    #[test]
    fn host_limits_per_subsystem_are_bounded() {
        let mut s = state();
        s.update_subsystem(
            Limits::with_ram(0),
            "a",
            SubsystemUpdate {
                allow_any_host: Some(true),
                ..Default::default()
            },
        )
        .unwrap();
        let host = |i: usize| format!("nqn.2024-01.io.example:h{i}");
        for i in 0..MAX_HOSTS_PER_SUBSYSTEM {
            s.set_host_qos("a", &host(i), iops(1)).unwrap();
        }
        let over = host(MAX_HOSTS_PER_SUBSYSTEM);
        assert!(matches!(
            s.set_host_qos("a", &over, iops(1)),
            Err(ControlError::FailedPrecondition(m)) if m.contains("maximum of 1024 hosts")
        ));
        // A host that has limits may change them.
        s.set_host_qos("a", &host(0), iops(2)).unwrap();
        s.set_host_qos("a", &host(0), QosLimits::default()).unwrap();
        s.set_host_qos("a", &over, iops(1)).unwrap();
    }
}
