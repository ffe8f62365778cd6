//! The rules a classifier holds: [`AclRule`] and its [`Family`], their
//! constructors, the reference match (what every lookup form must
//! agree with), and the five dimensions rules and keys are read in.

use std::net::IpAddr;

use crate::wire::FlowKey;

/// Address family a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// IPv4 and IPv6 (a rule without addresses).
    Any,
    /// IPv4 only.
    V4,
    /// IPv6 only.
    V6,
}

/// One classification rule: inclusive ranges per dimension.
///
/// For IPv4 the address ranges lie within `0..=u32::MAX`. ICMP type and
/// code use the port ranges (see [`FlowKey`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AclRule {
    /// Evaluation order: the smallest matching `order` wins. Unique.
    pub order: u32,
    /// The caller's handle for the rule, returned by lookups.
    pub tag: u32,
    /// Address family.
    pub family: Family,
    /// Source address range.
    pub src: (u128, u128),
    /// Destination address range.
    pub dst: (u128, u128),
    /// Source port range.
    pub src_port: (u16, u16),
    /// Destination port range.
    pub dst_port: (u16, u16),
    /// Protocol range: one value, or `(0, 255)` for any.
    pub proto: (u8, u8),
}

impl AclRule {
    /// A rule matching every packet of `family`.
    pub fn any(order: u32, tag: u32, family: Family) -> AclRule {
        let top = if family == Family::V6 {
            u128::MAX
        } else {
            u128::from(u32::MAX)
        };
        AclRule {
            order,
            tag,
            family,
            src: (0, top),
            dst: (0, top),
            src_port: (0, u16::MAX),
            dst_port: (0, u16::MAX),
            proto: (0, u8::MAX),
        }
    }

    /// A rule for this address family, as [`AclRule::any`], narrowed by
    /// the `with_*` constructors below: how a configured filter rule
    /// becomes a classifier rule without its caller knowing the key's
    /// layout.
    ///
    /// The family follows the rule's addresses: IPv4 if a prefix given is
    /// IPv4, IPv6 if it is IPv6, either for a rule without addresses.
    pub fn for_addresses(order: u32, src: Option<IpAddr>, dst: Option<IpAddr>) -> AclRule {
        let family = match src.or(dst) {
            Some(IpAddr::V4(_)) => Family::V4,
            Some(IpAddr::V6(_)) => Family::V6,
            None => Family::Any,
        };
        AclRule::any(order, 0, family)
    }

    /// Only sources within `addr/len`.
    #[must_use]
    pub fn with_src_prefix(mut self, addr: IpAddr, len: u8) -> AclRule {
        self.src = self.ip_prefix_range(addr, len);
        self
    }

    /// Only destinations within `addr/len`.
    #[must_use]
    pub fn with_dst_prefix(mut self, addr: IpAddr, len: u8) -> AclRule {
        self.dst = self.ip_prefix_range(addr, len);
        self
    }

    /// Only source ports `first..=last`.
    #[must_use]
    pub fn with_src_ports(mut self, first: u16, last: u16) -> AclRule {
        self.src_port = (first, last);
        self
    }

    /// Only destination ports `first..=last`.
    #[must_use]
    pub fn with_dst_ports(mut self, first: u16, last: u16) -> AclRule {
        self.dst_port = (first, last);
        self
    }

    /// Only IP protocol (IPv6: next header) `proto`.
    #[must_use]
    pub fn with_protocol(mut self, proto: u8) -> AclRule {
        self.proto = (proto, proto);
        self
    }

    /// Only ICMP (or ICMPv6) messages of this type: the key carries it
    /// where TCP and UDP carry the source port (see [`FlowKey`]).
    #[must_use]
    pub fn with_icmp_type(mut self, icmp_type: u8) -> AclRule {
        self.src_port = (u16::from(icmp_type), u16::from(icmp_type));
        self
    }

    /// Only ICMP (or ICMPv6) messages with this code: the key carries it
    /// where TCP and UDP carry the destination port (see [`FlowKey`]).
    #[must_use]
    pub fn with_icmp_code(mut self, icmp_code: u8) -> AclRule {
        self.dst_port = (u16::from(icmp_code), u16::from(icmp_code));
        self
    }

    /// The range of an address prefix in this rule's address fields: 32
    /// bits wide unless the rule is IPv6.
    fn ip_prefix_range(&self, addr: IpAddr, len: u8) -> (u128, u128) {
        let width = if self.family == Family::V6 { 128 } else { 32 };
        let addr = match addr {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        };
        AclRule::prefix_range(addr, len, width)
    }

    /// The range of `prefix/len` in a field `width` bits wide.
    pub fn prefix_range(addr: u128, len: u8, width: u32) -> (u128, u128) {
        let host_bits = width.saturating_sub(u32::from(len));
        let host = if host_bits >= 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        (addr & !host, addr | host)
    }

    /// True if the rule matches `key` (the reference semantics).
    pub fn matches(&self, key: &FlowKey) -> bool {
        let fam = match self.family {
            Family::Any => true,
            Family::V4 => !key.v6,
            Family::V6 => key.v6,
        };
        fam && self.dims_match(key)
    }

    pub(super) fn dims_match(&self, key: &FlowKey) -> bool {
        let (src, dst) = if self.family == Family::Any {
            // A family-less rule has no addresses: any address matches.
            ((0, u128::MAX), (0, u128::MAX))
        } else {
            (self.src, self.dst)
        };
        src.0 <= key.src
            && key.src <= src.1
            && dst.0 <= key.dst
            && key.dst <= dst.1
            && self.src_port.0 <= key.src_port
            && key.src_port <= self.src_port.1
            && self.dst_port.0 <= key.dst_port
            && key.dst_port <= self.dst_port.1
            && self.proto.0 <= key.proto
            && key.proto <= self.proto.1
    }

    pub(super) fn range(&self, dim: usize) -> (u128, u128) {
        match dim {
            0 => self.src,
            1 => self.dst,
            2 => (u128::from(self.src_port.0), u128::from(self.src_port.1)),
            3 => (u128::from(self.dst_port.0), u128::from(self.dst_port.1)),
            _ => (u128::from(self.proto.0), u128::from(self.proto.1)),
        }
    }
}

/// Dimensions of a rule and of a key, in the order [`AclRule::range`]
/// and [`key_value`] number them: source address, destination address,
/// source port, destination port, protocol.
pub(super) const DIMS: usize = 5;

/// Dimension `dim` of `key`, as [`AclRule::range`] numbers them.
pub(super) fn key_value(key: &FlowKey, dim: usize) -> u128 {
    match dim {
        0 => key.src,
        1 => key.dst,
        2 => u128::from(key.src_port),
        3 => u128::from(key.dst_port),
        _ => u128::from(key.proto),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ranges() {
        assert_eq!(
            AclRule::prefix_range(0x0a00_0000, 8, 32),
            (0x0a00_0000, 0x0aff_ffff)
        );
        assert_eq!(AclRule::prefix_range(0, 0, 32), (0, 0xffff_ffff));
        assert_eq!(AclRule::prefix_range(7, 32, 32), (7, 7));
        assert_eq!(AclRule::prefix_range(0, 0, 128), (0, u128::MAX));
        assert_eq!(
            AclRule::prefix_range(1 << 127, 1, 128),
            (1 << 127, u128::MAX)
        );
    }
}
