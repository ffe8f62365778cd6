//! Storage endpoints: listeners bound to a tenant's network.
//!
//! A listener with a tenant is a station of that tenant: an IPv4 or IPv6
//! address with a MAC of its own, which the switch delivers frames to. Listeners of
//! one tenant on one address (of any subsystem, on any port) are one
//! endpoint and share its MAC; the MAC is assigned when the first of them
//! is created and kept in each listener, so it survives restarts and
//! comes back with a listener that a failed change puts back.
//!
//! Invariants the checks here keep: the tenant exists; the address is no
//! host's (no anti-spoofing prefix of the tenant's attachments contains
//! it); an endpoint's MAC is unique among endpoints and among the MACs the
//! tenants' attachments allow; a tenant with endpoints is not deleted
//! ([`State::endpoint_of_tenant`] answers the first).

use std::net::IpAddr;

use crate::error::{ControlError, Result};
use crate::model::{Attachment, Listener, MacAddr, State};

/// First octet of generated endpoint MACs: locally administered, unicast.
const ENDPOINT_OUI: [u8; 2] = [0x02, 0xd5];

/// One storage endpoint of the state: a tenant's address with its MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The endpoint's IPv4 or IPv6 address in the tenant's network.
    pub address: IpAddr,
    /// The endpoint's MAC.
    pub mac: MacAddr,
}

impl State {
    /// Every storage endpoint, each once, ordered by tenant and address.
    pub fn endpoints(&self) -> Vec<Endpoint<'_>> {
        let mut out: Vec<Endpoint<'_>> = self
            .subsystems
            .values()
            .flat_map(|s| s.listeners.values())
            .filter_map(|l| {
                let (tenant, address) = l.endpoint()?;
                Some(Endpoint {
                    tenant,
                    address,
                    mac: l.mac?,
                })
            })
            .collect();
        out.sort_unstable();
        out.dedup_by(|a, b| a.tenant == b.tenant && a.address == b.address);
        out
    }

    /// The resource name of a listener that is an endpoint in tenant `id`,
    /// if any.
    pub fn endpoint_of_tenant(&self, id: &str) -> Option<String> {
        self.subsystems.values().find_map(|s| {
            s.listeners
                .values()
                .find(|l| l.tenant.as_deref() == Some(id))
                .map(|l| crate::model::listener_name(&s.id, &l.id))
        })
    }

    /// Checks listener `l` if it names a tenant and gives it the MAC of its
    /// endpoint: that of the listeners already on the same tenant and
    /// address, else the one it carries (put back after a failed change),
    /// else a fresh one.
    ///
    /// # Errors
    /// NOT_FOUND if the tenant does not exist; INVALID_ARGUMENT if the
    /// address is not a host's (see [`not_an_endpoint_address`]) or lies
    /// in an anti-spoofing prefix of one of the tenant's attachments.
    pub(super) fn place_endpoint(&mut self, l: &mut Listener) -> Result<()> {
        let Some(tenant) = l.tenant.clone() else {
            l.mac = None;
            return Ok(());
        };
        let t = self.tenant(&tenant)?;
        let a = l.address;
        if let Some(why) = not_an_endpoint_address(a) {
            return Err(ControlError::invalid(
                "listener.address",
                format!("{a} is not an endpoint's address: {why}"),
            ));
        }
        for att in &t.attachments {
            if let Attachment::Port { guard, .. } = att {
                if let Some(p) = guard.prefixes.iter().find(|p| p.contains(l.address)) {
                    return Err(ControlError::invalid(
                        "listener.address",
                        format!(
                            "{a} lies in {p}, which {att} of tenants/{tenant} gives to its hosts"
                        ),
                    ));
                }
            }
        }
        let shared = self
            .subsystems
            .values()
            .flat_map(|s| s.listeners.values())
            .find(|o| o.endpoint() == Some((tenant.as_str(), a)))
            .and_then(|o| o.mac);
        l.mac = match (shared, l.mac) {
            (Some(m), _) => Some(m),
            (None, Some(m)) if !self.mac_taken(m) => Some(m),
            (None, _) => Some(self.fresh_endpoint_mac()),
        };
        Ok(())
    }

    /// Checks that no anti-spoofing prefix of `atts`, attachments of tenant
    /// `owner`, gives a host the address of one of its endpoints.
    ///
    /// # Errors
    /// FAILED_PRECONDITION naming the attachment, the prefix and a listener.
    pub(super) fn check_guards_spare_endpoints(
        &self,
        owner: &str,
        atts: &[Attachment],
    ) -> Result<()> {
        for s in self.subsystems.values() {
            for l in s.listeners.values() {
                if l.tenant.as_deref() != Some(owner) {
                    continue;
                }
                for att in atts {
                    let Attachment::Port { guard, .. } = att else {
                        continue;
                    };
                    if let Some(p) = guard.prefixes.iter().find(|p| p.contains(l.address)) {
                        return Err(ControlError::FailedPrecondition(format!(
                            "{att} would give {p} to hosts, but {} of {} is a storage endpoint of tenants/{owner}",
                            l.address,
                            crate::model::listener_name(&s.id, &l.id)
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// True if `m` is some endpoint's MAC or one an attachment's guard allows.
    fn mac_taken(&self, m: MacAddr) -> bool {
        let endpoint = self
            .subsystems
            .values()
            .flat_map(|s| s.listeners.values())
            .any(|l| l.mac == Some(m));
        endpoint
            || self.tenants.values().any(|t| {
                t.attachments.iter().any(|a| match a {
                    Attachment::Port { guard, .. } => guard.macs.contains(&m),
                    Attachment::Vxlan { .. } => false,
                })
            })
    }

    /// A MAC no endpoint or guard has, `02:d5` and the next value of the
    /// service's ID sequence (never reused, persisted with the state).
    fn fresh_endpoint_mac(&mut self) -> MacAddr {
        loop {
            self.id_seq += 1;
            let n = self.id_seq.to_be_bytes();
            let m = MacAddr([ENDPOINT_OUI[0], ENDPOINT_OUI[1], n[4], n[5], n[6], n[7]]);
            if !self.mac_taken(m) {
                return m;
            }
        }
    }
}

/// Why `a` cannot be a storage endpoint's address, if it cannot: it must
/// be unicast and routable in the tenant's network (not unspecified,
/// loopback, multicast or broadcast; for IPv6 also not link-local, which
/// the endpoint's stack does not use, nor IPv4-mapped).
pub fn not_an_endpoint_address(a: IpAddr) -> Option<&'static str> {
    match a {
        IpAddr::V4(v) if v.is_unspecified() || v.is_loopback() => Some("unspecified or loopback"),
        IpAddr::V4(v) if v.is_multicast() || v.is_broadcast() => Some("not unicast"),
        IpAddr::V6(v) if v.is_unspecified() || v.is_loopback() => Some("unspecified or loopback"),
        IpAddr::V6(v) if v.is_multicast() => Some("not unicast"),
        IpAddr::V6(v) if v.is_unicast_link_local() => {
            Some("link-local (an endpoint has a unique-local or global IPv6 address)")
        }
        IpAddr::V6(v) if v.to_ipv4_mapped().is_some() => {
            Some("IPv4-mapped (give the IPv4 address itself)")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::model::{
        Action, PortRole, PortSpec, RuleSet, SourceGuard, Subsystem, Tenant, Timestamp, Transport,
    };
    use crate::state::{Limits, PortRegistry};

    fn ports() -> PortRegistry {
        ["p0", "p1"]
            .into_iter()
            .map(|id| {
                let spec = PortSpec {
                    id: id.into(),
                    driver: "none".into(),
                    device: String::new(),
                    role: PortRole::Software,
                    vtep_address: None,
                };
                (id.to_string(), spec)
            })
            .collect()
    }

    fn guarded(port: &str, prefix: &str, mac: &str) -> Attachment {
        Attachment::Port {
            port: port.into(),
            vlan: 10,
            guard: SourceGuard {
                macs: vec![mac.parse().unwrap()],
                prefixes: vec![prefix.parse().unwrap()],
            },
        }
    }

    fn tenant(id: &str, atts: Vec<Attachment>) -> Tenant {
        Tenant {
            id: id.into(),
            display_name: String::new(),
            attachments: atts,
            default_policy: Action::Deny,
            create_time: Timestamp::now(),
            rules: RuleSet::default(),
            storage_qos: Default::default(),
            vlan_id: 0,
            no_offload: false,
        }
    }

    fn subsystem(id: &str) -> Subsystem {
        crate::state::tests::subsystem(id, &format!("nqn.2024-01.io.example:{id}"), true, 2)
    }

    fn listener(id: &str, tenant: Option<&str>, address: &str, port: u16) -> Listener {
        Listener {
            id: id.into(),
            transport: Transport::Tcp,
            address: address.parse().unwrap(),
            port,
            tenant: tenant.map(String::from),
            mac: None,
            secure_channel: Default::default(),
        }
    }

    /// Tenants blue and red, each with a guarded attachment giving
    /// 10.1.0.0/25 to its hosts, and subsystems vol1 and vol2.
    fn state() -> State {
        let mut s = State::default();
        let lim = Limits::with_ram(0);
        let blue = tenant(
            "blue",
            vec![guarded("p0", "10.1.0.0/25", "02:00:00:00:00:01")],
        );
        let red = tenant(
            "red",
            vec![guarded("p1", "10.1.0.0/25", "02:00:00:00:00:02")],
        );
        s.create_tenant(lim, &ports(), blue).unwrap();
        s.create_tenant(lim, &ports(), red).unwrap();
        s.create_subsystem(lim, subsystem("vol1")).unwrap();
        s.create_subsystem(lim, subsystem("vol2")).unwrap();
        s
    }

    fn create(s: &mut State, sid: &str, l: Listener) -> Result<Listener> {
        s.create_listener(Limits::with_ram(0), sid, l).cloned()
    }

    #[test]
    fn an_endpoint_gets_a_local_unicast_mac_shared_by_its_listeners() {
        let mut s = state();
        let a = create(
            &mut s,
            "vol1",
            listener("a", Some("blue"), "10.1.0.250", 4420),
        )
        .unwrap();
        let mac = a.mac.expect("an endpoint has a MAC");
        assert_eq!(mac.0[0] & 0b11, 0b10, "locally administered unicast");
        // Another subsystem, and another port, on the same address: one endpoint.
        let b = create(
            &mut s,
            "vol2",
            listener("b", Some("blue"), "10.1.0.250", 4420),
        )
        .unwrap();
        let c = create(
            &mut s,
            "vol1",
            listener("c", Some("blue"), "10.1.0.250", 8009),
        )
        .unwrap();
        assert_eq!((b.mac, c.mac), (Some(mac), Some(mac)));
        // Another address, and the same address in another tenant: new MACs.
        let d = create(
            &mut s,
            "vol1",
            listener("d", Some("blue"), "10.1.0.251", 4420),
        )
        .unwrap();
        s.create_subsystem(Limits::with_ram(0), subsystem("vol3"))
            .unwrap();
        let e = create(
            &mut s,
            "vol3",
            listener("e", Some("red"), "10.1.0.250", 4420),
        )
        .unwrap();
        let macs: BTreeSet<_> = [mac, d.mac.unwrap(), e.mac.unwrap()].into();
        assert_eq!(macs.len(), 3, "{macs:?}");
        assert_eq!(s.endpoints().len(), 3);
        assert_eq!(
            s.endpoints()[0],
            Endpoint {
                tenant: "blue",
                address: "10.1.0.250".parse().unwrap(),
                mac
            }
        );
        // A kernel listener has neither tenant nor MAC.
        s.create_subsystem(Limits::with_ram(0), subsystem("vol4"))
            .unwrap();
        let k = create(&mut s, "vol4", listener("k", None, "127.0.0.1", 4420)).unwrap();
        assert_eq!(k.mac, None);
        assert_eq!(s.endpoints().len(), 3);
    }

    #[test]
    fn a_subsystem_is_served_in_one_place() {
        let mut s = state();
        create(
            &mut s,
            "vol1",
            listener("a", Some("blue"), "10.1.0.250", 4420),
        )
        .unwrap();
        create(&mut s, "vol2", listener("k", None, "127.0.0.1", 4420)).unwrap();
        let before = s.clone();
        let refused = |s: &mut State, sid: &str, l: Listener, want: &str| match create(s, sid, l) {
            Err(ControlError::FailedPrecondition(m)) => assert!(m.contains(want), "{m}"),
            other => panic!("{other:?}"),
        };
        // vol1 is served in blue's network: not also in red's, nor on the
        // service's own sockets.
        refused(
            &mut s,
            "vol1",
            listener("x", Some("red"), "10.1.0.251", 4420),
            "subsystems/vol1/listeners/x: subsystem vol1 is served in tenant blue's \
             network; it cannot also listen in tenant red's",
        );
        refused(
            &mut s,
            "vol1",
            listener("x", None, "127.0.0.1", 4421),
            "cannot also listen on the service's own address 127.0.0.1",
        );
        // vol2 is served on the service's sockets: not also in a tenant.
        refused(
            &mut s,
            "vol2",
            listener("x", Some("blue"), "10.1.0.251", 4420),
            "subsystem vol2 is served on the service's own addresses; it cannot also \
             listen in tenant blue's",
        );
        // Nor a new subsystem whose listeners are in two places.
        let mut sub = subsystem("vol9");
        for l in [
            listener("a", Some("blue"), "10.1.0.250", 4420),
            listener("b", None, "127.0.0.1", 4422),
        ] {
            sub.listeners.insert(l.id.clone(), l);
        }
        match s.create_subsystem(Limits::with_ram(0), sub) {
            Err(ControlError::FailedPrecondition(m)) => assert!(
                m.contains(
                    "subsystems/vol9/listeners/b: subsystem vol9 is served in tenant blue's"
                ),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(s, before, "nothing changed");
        assert_eq!(s.subsystems["vol1"].serving_tenant(), Some("blue"));
        assert_eq!(s.subsystems["vol2"].serving_tenant(), None);
        // More listeners where each is served are fine.
        create(
            &mut s,
            "vol1",
            listener("b", Some("blue"), "10.1.0.251", 4420),
        )
        .unwrap();
        create(&mut s, "vol2", listener("k2", None, "127.0.0.1", 4421)).unwrap();
    }

    #[test]
    fn an_endpoint_is_refused_what_the_tenant_or_its_hosts_hold() {
        let mut s = state();
        let seq = s.id_seq;
        let e = create(
            &mut s,
            "vol1",
            listener("a", Some("green"), "10.1.0.250", 4420),
        );
        assert!(
            matches!(&e, Err(ControlError::NotFound(m)) if m == "tenants/green"),
            "{e:?}"
        );
        let e = create(
            &mut s,
            "vol1",
            listener("a", Some("blue"), "10.1.0.7", 4420),
        );
        assert!(
            matches!(&e, Err(ControlError::InvalidArgument { field, reason })
                if field == "listener.address" && reason.contains("10.1.0.0/25")),
            "{e:?}"
        );
        for bad in [
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "127.0.0.1",
            "::",
            "::1",
            "ff02::1",
            "fe80::1",
            "::ffff:10.1.0.250",
        ] {
            let e = create(&mut s, "vol1", listener("a", Some("blue"), bad, 4420));
            assert!(
                matches!(&e, Err(ControlError::InvalidArgument { field, .. }) if field == "listener.address"),
                "{bad}: {e:?}"
            );
        }
        create(
            &mut s,
            "vol1",
            listener("a", Some("blue"), "10.1.0.250", 4420),
        )
        .unwrap();
        let seq_after = s.id_seq;
        assert!(seq_after > seq);
        // The same tenant, address and port twice in one subsystem.
        let e = create(
            &mut s,
            "vol1",
            listener("b", Some("blue"), "10.1.0.250", 4420),
        );
        assert!(
            matches!(&e, Err(ControlError::AlreadyExists(m)) if m.contains("tenants/blue")),
            "{e:?}"
        );
        assert_eq!(s.id_seq, seq_after, "a refused listener takes no MAC");
        // The same address and port as a kernel listener is another listener.
        create(&mut s, "vol2", listener("k", None, "10.1.0.250", 4420)).unwrap();
        // An IPv6 address is another endpoint of the tenant, with a MAC of
        // its own.
        create(
            &mut s,
            "vol1",
            listener("v6", Some("blue"), "fd00:1::250", 4420),
        )
        .unwrap();
        let eps = s.endpoints();
        assert_eq!(eps.len(), 2, "{eps:?}");
        assert_ne!(eps[0].mac, eps[1].mac);
        assert_eq!(eps[1].address, "fd00:1::250".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn a_tenant_with_endpoints_is_not_deleted_and_hosts_do_not_take_their_address() {
        let mut s = state();
        create(
            &mut s,
            "vol1",
            listener("a", Some("blue"), "10.1.0.250", 4420),
        )
        .unwrap();
        for force in [false, true] {
            let e = s.delete_tenant("blue", force);
            assert!(
                matches!(&e, Err(ControlError::FailedPrecondition(m)) if m.contains("subsystems/vol1/listeners/a")),
                "{e:?}"
            );
        }
        let wide = guarded("p0", "10.1.0.0/24", "02:00:00:00:00:01");
        let u = crate::state::TenantUpdate {
            attachments: Some(vec![wide.clone()]),
            ..Default::default()
        };
        let e = s.update_tenant(Limits::with_ram(0), &ports(), "blue", u);
        assert!(
            matches!(&e, Err(ControlError::FailedPrecondition(m)) if m.contains("10.1.0.250")),
            "{e:?}"
        );
        // Red's hosts may have that address: endpoints are per tenant.
        let u = crate::state::TenantUpdate {
            attachments: Some(vec![guarded("p1", "10.1.0.0/24", "02:00:00:00:00:02")]),
            ..Default::default()
        };
        s.update_tenant(Limits::with_ram(0), &ports(), "red", u)
            .unwrap();
        s.delete_listener("vol1", "a").unwrap();
        s.delete_tenant("blue", true).unwrap();
    }

    #[test]
    fn a_listener_put_back_keeps_its_mac_unless_taken() {
        let mut s = state();
        let a = create(
            &mut s,
            "vol1",
            listener("a", Some("blue"), "10.1.0.250", 4420),
        )
        .unwrap();
        s.delete_listener("vol1", "a").unwrap();
        assert_eq!(create(&mut s, "vol1", a.clone()).unwrap().mac, a.mac);
        // A subsystem put back with its listeners places them too.
        let mut sub = s.subsystems["vol1"].clone();
        s.delete_listener("vol1", "a").unwrap();
        s.delete_subsystem("vol1", true).unwrap();
        s.create_subsystem(Limits::with_ram(0), sub.clone())
            .unwrap();
        assert_eq!(s.subsystems["vol1"].listeners["a"].mac, a.mac);
        // ... and refuses one whose tenant is gone, changing nothing.
        s.delete_subsystem("vol1", true).unwrap();
        sub.listeners.get_mut("a").unwrap().tenant = Some("green".into());
        let before = s.clone();
        assert!(s.create_subsystem(Limits::with_ram(0), sub).is_err());
        assert_eq!(s, before);
    }

    #[test]
    fn a_listener_round_trips_through_the_state_file_format() {
        let mut s = state();
        create(
            &mut s,
            "vol1",
            listener("a", Some("blue"), "10.1.0.250", 4420),
        )
        .unwrap();
        create(&mut s, "vol2", listener("k", None, "127.0.0.1", 4420)).unwrap();
        let text = serde_json::to_string(&s).unwrap();
        let back: State = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
        // A listener written before endpoints existed reads as a kernel one.
        let old = r#"{"id":"k","transport":"tcp","address":"127.0.0.1","port":4420}"#;
        let l: Listener = serde_json::from_str(old).unwrap();
        assert_eq!((l.tenant, l.mac), (None, None));
    }
}
