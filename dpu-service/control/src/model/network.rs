//! Network-side domain types: IP prefixes, MAC addresses, tenants with
//! their attachments and filter rules, and the data-plane ports the
//! configuration declares.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::qos::{self, QosLimits};
use super::Timestamp;

/// An IPv4 or IPv6 prefix whose host bits are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IpPrefix {
    addr: IpAddr,
    len: u8,
}

/// Why a string is not a valid [`IpPrefix`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// The address part is not an IPv4 or IPv6 literal.
    #[error("'{0}' is not an IP address")]
    BadAddress(String),
    /// The length part is not a number within the family's range.
    #[error("prefix length '{0}' is not in 0..={1}")]
    BadLength(String, u8),
    /// Bits beyond the prefix length are set.
    #[error("host bits are set in {given} (did you mean {masked}?)")]
    HostBits {
        /// The prefix as given.
        given: String,
        /// The prefix with its host bits cleared.
        masked: String,
    },
}

impl IpPrefix {
    /// Builds a prefix, refusing a length beyond the family's width or set host bits.
    pub fn new(addr: IpAddr, len: u8) -> Result<Self, PrefixError> {
        let width = if addr.is_ipv4() { 32 } else { 128 };
        if len > width {
            return Err(PrefixError::BadLength(len.to_string(), width));
        }
        let p = Self { addr, len };
        let masked = p.masked();
        if masked.addr != addr {
            return Err(PrefixError::HostBits {
                given: p.to_string(),
                masked: masked.to_string(),
            });
        }
        Ok(p)
    }

    fn masked(self) -> Self {
        let addr = match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.len))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
        };
        Self {
            addr,
            len: self.len,
        }
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length in bits.
    pub fn len(&self) -> u8 {
        self.len
    }

    /// True for the zero-length prefix, which matches every address of its family.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True if the prefix is IPv4.
    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// True if `ip` lies within the prefix (always false across families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                Self {
                    addr: ip,
                    len: self.len,
                }
                .masked()
                .addr
                    == self.addr
            }
            _ => false,
        }
    }
}

impl FromStr for IpPrefix {
    type Err = PrefixError;

    /// Parses "addr/len"; a bare address is a host prefix (/32 or /128).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .parse()
            .map_err(|_| PrefixError::BadAddress(a.to_string()))?;
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            None => width,
            Some(l) => match l.parse::<u8>() {
                Ok(n) if n <= width && !l.starts_with('+') => n,
                _ => return Err(PrefixError::BadLength(l.to_string(), width)),
            },
        };
        Self::new(addr, len)
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl TryFrom<String> for IpPrefix {
    type Error = PrefixError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<IpPrefix> for String {
    fn from(p: IpPrefix) -> String {
        p.to_string()
    }
}

/// An inclusive range of transport-layer ports, `first <= last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PortRange {
    /// First port of the range.
    pub first: u16,
    /// Last port of the range.
    pub last: u16,
}

impl PortRange {
    /// True if `port` lies within the range.
    pub fn contains(&self, port: u16) -> bool {
        self.first <= port && port <= self.last
    }
}

/// Verdict of a filter rule or a default policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Forward the packet.
    Allow,
    /// Drop the packet.
    Deny,
}

/// One filter rule of a tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rule {
    /// Rule ID, unique within the tenant.
    pub id: String,
    /// Evaluation order, lower first; unique within the tenant.
    pub priority: u32,
    /// Source prefix; `None` matches any source.
    pub src: Option<IpPrefix>,
    /// Destination prefix; `None` matches any destination.
    pub dst: Option<IpPrefix>,
    /// Source port range (TCP/UDP/SCTP only); `None` matches any.
    pub src_ports: Option<PortRange>,
    /// Destination port range (TCP/UDP/SCTP only); `None` matches any.
    pub dst_ports: Option<PortRange>,
    /// IP protocol number; `None` matches any.
    pub protocol: Option<u8>,
    /// ICMP/ICMPv6 type; `None` matches any.
    pub icmp_type: Option<u8>,
    /// ICMP/ICMPv6 code; `None` matches any.
    pub icmp_code: Option<u8>,
    /// What a match does.
    pub action: Action,
    /// Track connections this rule allows, so replies pass.
    pub stateful: bool,
    /// Free-form description.
    pub description: String,
    /// The most traffic the rule lets through (allow rules only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
}

/// A token bucket on a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RateLimit {
    /// Packets, or bits, per second.
    pub per_second: u64,
    /// `per_second` counts bits (of whole frames) rather than packets.
    pub bits: bool,
    /// Bucket depth: packets, or bytes with `bits`.
    pub burst: u64,
}

/// A tenant's rule set: rules sorted by ascending priority, and a version
/// that grows with every change.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RuleSet {
    /// Version of the rule set; 0 for a new tenant.
    pub version: u64,
    /// Rules in evaluation order. Shared, so snapshots of the state are cheap.
    pub rules: Arc<Vec<Rule>>,
}

/// A unicast MAC address, written `02:00:00:00:00:01`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MacAddr(pub [u8; 6]);

impl FromStr for MacAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut out {
            let p = parts.next().unwrap_or("");
            if p.len() != 2 {
                return Err(format!("'{s}' is not a MAC address (aa:bb:cc:dd:ee:ff)"));
            }
            *b = u8::from_str_radix(p, 16)
                .map_err(|_| format!("'{s}' is not a MAC address (aa:bb:cc:dd:ee:ff)"))?;
        }
        if parts.next().is_some() {
            return Err(format!("'{s}' is not a MAC address (aa:bb:cc:dd:ee:ff)"));
        }
        if out[0] & 1 != 0 {
            return Err(format!("{s} is a multicast address, not a host's"));
        }
        if out == [0; 6] {
            return Err("00:00:00:00:00:00 is not a host's address".into());
        }
        Ok(MacAddr(out))
    }
}

impl TryFrom<String> for MacAddr {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<MacAddr> for String {
    fn from(m: MacAddr) -> String {
        m.to_string()
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// Anti-spoofing of one attachment: the sources it may send from. An
/// empty list allows any source of its kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SourceGuard {
    /// Allowed source MAC addresses (also ARP's sender address).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub macs: Vec<MacAddr>,
    /// Prefixes IP sources (and ARP's sender address) must lie in; once
    /// any is listed, a family without one is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<IpPrefix>,
}

impl SourceGuard {
    /// True if the guard allows every source.
    pub fn is_open(&self) -> bool {
        self.macs.is_empty() && self.prefixes.is_empty()
    }
}

/// A source of tenant traffic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Attachment {
    /// A whole port (`vlan` 0) or one VLAN of it.
    Port {
        /// Port ID.
        port: String,
        /// VLAN ID, 0 for the whole port.
        vlan: u16,
        /// Sources frames entering here may have.
        #[serde(default, skip_serializing_if = "SourceGuard::is_open")]
        guard: SourceGuard,
    },
    /// One VXLAN network on an uplink.
    Vxlan {
        /// Uplink port ID.
        uplink: String,
        /// VXLAN network identifier.
        vni: u32,
        /// Remote VTEPs that get the network's flooded frames.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        remote_vteps: Vec<std::net::Ipv4Addr>,
        /// IPv4 underlay prefixes whose VTEPs may send into the network
        /// besides `remote_vteps`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        underlay_prefixes: Vec<IpPrefix>,
    },
}

impl Attachment {
    /// A port attachment without anti-spoofing.
    pub fn port_vlan(port: &str, vlan: u16) -> Attachment {
        Attachment::Port {
            port: port.to_string(),
            vlan,
            guard: SourceGuard::default(),
        }
    }

    /// True if this is the port attachment (`port`, `vlan`), whatever its
    /// guard.
    pub fn is_port_vlan(&self, port: &str, vlan: u16) -> bool {
        matches!(self, Self::Port { port: p, vlan: v, .. } if p == port && *v == vlan)
    }

    /// The port this attachment lives on.
    pub fn port(&self) -> &str {
        match self {
            Self::Port { port, .. } => port,
            Self::Vxlan { uplink, .. } => uplink,
        }
    }

    /// True if `self` and `other` claim overlapping traffic.
    pub fn conflicts_with(&self, other: &Attachment) -> bool {
        if self.port() != other.port() {
            return false;
        }
        match (self, other) {
            (Self::Port { vlan: 0, .. }, _) | (_, Self::Port { vlan: 0, .. }) => true,
            (Self::Port { vlan: a, .. }, Self::Port { vlan: b, .. }) => a == b,
            (Self::Vxlan { vni: a, .. }, Self::Vxlan { vni: b, .. }) => a == b,
            _ => false,
        }
    }
}

impl fmt::Display for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Port { port, vlan: 0, .. } => write!(f, "ports/{port}"),
            Self::Port { port, vlan, .. } => write!(f, "ports/{port} vlan {vlan}"),
            Self::Vxlan { uplink, vni, .. } => write!(f, "ports/{uplink} vni {vni}"),
        }
    }
}

/// A tenant: an isolation domain of the virtual switch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    /// Tenant ID.
    pub id: String,
    /// Human-readable name.
    pub display_name: String,
    /// Traffic that belongs to the tenant.
    pub attachments: Vec<Attachment>,
    /// Verdict for packets no rule matches.
    pub default_policy: Action,
    /// When the tenant was created.
    pub create_time: Timestamp,
    /// The tenant's filter rules.
    pub rules: RuleSet,
    /// Limits on all the storage I/O of the tenant's storage endpoints
    /// together, on top of each namespace's and host's (none in a state
    /// written before them).
    #[serde(
        default,
        skip_serializing_if = "QosLimits::is_none",
        with = "qos::limits"
    )]
    pub storage_qos: QosLimits,
    /// The VLAN ID of the tenant's network on trunk ports (OPI's logical
    /// bridge), 1..=4094, unique among tenants; 0 for none (and in a
    /// state written before it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub vlan_id: u16,
    /// The tenant's flows stay on the cores: none is offloaded to flow
    /// hardware (false in a state written before it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_offload: bool,
}

/// Whether a VLAN ID is 0 (none), for `skip_serializing_if`.
fn is_zero(v: &u16) -> bool {
    *v == 0
}

/// What a data-plane port is connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PortRole {
    /// Not known.
    #[default]
    Unspecified,
    /// Physical uplink.
    Uplink,
    /// Host physical function representor.
    HostPf,
    /// Virtual function representor.
    Vf,
    /// Scalable function representor.
    Sf,
    /// Software port for development and tests.
    Software,
}

/// A data-plane port as the configuration declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortSpec {
    /// Port ID, e.g. "p0", "pf0vf1".
    pub id: String,
    /// Packet-I/O driver name.
    pub driver: String,
    /// Device the driver opens (devargs or interface name).
    pub device: String,
    /// What the port is connected to.
    pub role: PortRole,
    /// The IPv4 address of the VXLAN tunnel endpoint the port serves
    /// (`vtep_address` of the port's configuration), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vtep_address: Option<std::net::Ipv4Addr>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_parse_and_display() {
        let p: IpPrefix = "10.1.0.0/16".parse().unwrap();
        assert_eq!(p.to_string(), "10.1.0.0/16");
        assert!(p.contains("10.1.255.3".parse().unwrap()));
        assert!(!p.contains("10.2.0.1".parse().unwrap()));
        assert!(!p.contains("::1".parse().unwrap()));
        let h: IpPrefix = "192.0.2.7".parse().unwrap();
        assert_eq!(h.len(), 32);
        let v6: IpPrefix = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains("2001:db8:1::5".parse().unwrap()));
        let any: IpPrefix = "0.0.0.0/0".parse().unwrap();
        assert!(any.contains("255.255.255.255".parse().unwrap()));
    }

    #[test]
    fn prefix_rejects_bad_input() {
        assert!(matches!(
            "10.0.0.1/8".parse::<IpPrefix>(),
            Err(PrefixError::HostBits { masked, .. }) if masked == "10.0.0.0/8"
        ));
        assert!(matches!(
            "10.0.0.0/33".parse::<IpPrefix>(),
            Err(PrefixError::BadLength(..))
        ));
        assert!(matches!(
            "10.0.0.0/+8".parse::<IpPrefix>(),
            Err(PrefixError::BadLength(..))
        ));
        assert!(matches!(
            "::/129".parse::<IpPrefix>(),
            Err(PrefixError::BadLength(..))
        ));
        assert!(matches!(
            "nope/8".parse::<IpPrefix>(),
            Err(PrefixError::BadAddress(..))
        ));
        assert!(matches!(
            "".parse::<IpPrefix>(),
            Err(PrefixError::BadAddress(..))
        ));
    }

    #[test]
    fn mac_addresses() {
        let m: MacAddr = "02:00:0a:FF:00:01".parse().unwrap();
        assert_eq!(m.0, [2, 0, 10, 255, 0, 1]);
        assert_eq!(m.to_string(), "02:00:0a:ff:00:01");
        for bad in [
            "",
            "02:00:00:00:00",
            "02:00:00:00:00:01:02",
            "2:0:0:0:0:1",
            "zz:00:00:00:00:01",
        ] {
            assert!(
                bad.parse::<MacAddr>()
                    .unwrap_err()
                    .contains("not a MAC address"),
                "{bad}"
            );
        }
        assert!("01:00:5e:00:00:01"
            .parse::<MacAddr>()
            .unwrap_err()
            .contains("multicast"));
        assert!("00:00:00:00:00:00".parse::<MacAddr>().is_err());
        let guard = SourceGuard {
            macs: vec![m],
            prefixes: vec!["10.0.0.0/24".parse().unwrap()],
        };
        let a = Attachment::Port {
            port: "p0".into(),
            vlan: 0,
            guard,
        };
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"port","port":"p0","vlan":0,"guard":{"macs":["02:00:0a:ff:00:01"],"prefixes":["10.0.0.0/24"]}}"#
        );
        assert_eq!(serde_json::from_str::<Attachment>(&json).unwrap(), a);
        // State files from before guards existed read back as open.
        let old: Attachment =
            serde_json::from_str(r#"{"kind":"port","port":"p0","vlan":5}"#).unwrap();
        assert_eq!(old, Attachment::port_vlan("p0", 5));
        assert_eq!(
            serde_json::to_string(&old).unwrap(),
            r#"{"kind":"port","port":"p0","vlan":5}"#
        );
    }

    #[test]
    fn attachment_conflicts() {
        let whole = Attachment::port_vlan("p0", 0);
        let v10 = Attachment::port_vlan("p0", 10);
        let v20 = Attachment::port_vlan("p0", 20);
        let other = Attachment::port_vlan("p1", 0);
        let vx = Attachment::Vxlan {
            uplink: "p0".into(),
            vni: 10,
            remote_vteps: Vec::new(),
            underlay_prefixes: Vec::new(),
        };
        assert!(whole.conflicts_with(&v10));
        assert!(v10.conflicts_with(&whole));
        assert!(!v10.conflicts_with(&v20));
        assert!(v10.conflicts_with(&v10.clone()));
        assert!(!whole.conflicts_with(&other));
        assert!(whole.conflicts_with(&vx));
        assert!(
            !v10.conflicts_with(&vx),
            "VLAN 10 and VNI 10 are different traffic"
        );
    }
}
