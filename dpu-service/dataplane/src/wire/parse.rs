//! Packet parsing: the headers the switch decides on, read in place.
//!
//! [`parse`] walks Ethernet, one optional 802.1Q tag, then IPv4 (options
//! skipped), IPv6 (extension headers skipped, bounded) or ARP, then the
//! TCP/UDP/SCTP ports or the ICMP type and code. It never reads out of
//! bounds and never panics: any length or field that does not add up is a
//! [`ParseError`], and the packet is dropped as malformed. Nothing is
//! copied but the fields themselves; the frame is not modified.
//! [`parse_l2`] stops after the Ethernet and 802.1Q headers, and
//! [`network_layer`] finishes the job, for a switch that looks into the
//! network layer only where a policy needs it.
//!
//! The classification key puts ICMP's type and code where TCP/UDP keep
//! their ports (source and destination), so one classifier serves both.
//!
//! A fragment says which datagram it belongs to ([`Fragment`]); only a
//! first fragment has a transport header, and one that cannot show all
//! of it, or a later one that would overlap it, is a
//! [`ParseError::Fragment`] (RFC 1858, RFC 3128, RFC 7112).

/// EtherType of IPv4.
pub const ETH_IPV4: u16 = 0x0800;
/// EtherType of ARP.
pub const ETH_ARP: u16 = 0x0806;
/// EtherType of an 802.1Q VLAN tag.
pub const ETH_VLAN: u16 = 0x8100;
/// EtherType of IPv6.
pub const ETH_IPV6: u16 = 0x86dd;

/// IP protocol numbers the parser knows.
pub mod proto {
    /// ICMP.
    pub const ICMP: u8 = 1;
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// ICMPv6.
    pub const ICMPV6: u8 = 58;
    /// SCTP.
    pub const SCTP: u8 = 132;
}

/// EtherType of an 802.1ad service tag (QinQ).
pub const ETH_QINQ: u16 = 0x88a8;
/// EtherType of MPLS unicast.
pub const ETH_MPLS: u16 = 0x8847;
/// EtherType of MPLS multicast.
pub const ETH_MPLS_MC: u16 = 0x8848;
/// EtherType of a PPPoE session.
pub const ETH_PPPOE: u16 = 0x8864;

/// True for an EtherType that puts another header (a tag, a label, a
/// session header, a whole Ethernet frame) between the frame's link
/// layer and a network layer a receiver may still find behind it:
/// 802.1Q and 802.1ad tags, the pre-standard QinQ tags 0x9100, 0x9200
/// and 0x9300, MPLS, PPPoE sessions and transparent Ethernet bridging
/// (0x6558). [`parse`] reads one outer 802.1Q tag; behind it, or
/// instead of it, these are where it stops.
pub fn hides_network_layer(ethertype: u16) -> bool {
    matches!(
        ethertype,
        ETH_VLAN
            | ETH_QINQ
            | 0x9100
            | 0x9200
            | 0x9300
            | ETH_MPLS
            | ETH_MPLS_MC
            | ETH_PPPOE
            | 0x6558
    )
}

/// Length of an Ethernet header without tags.
pub const ETH_HLEN: usize = 14;
/// Length of an 802.1Q tag.
pub const VLAN_HLEN: usize = 4;

/// The 5-tuple a filter rule matches, for IPv4 or IPv6.
///
/// IPv4 addresses sit in the low 32 bits. For ICMP and ICMPv6, `src_port`
/// holds the type and `dst_port` the code; for other protocols without
/// ports, and for non-first fragments, both are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    /// Source address.
    pub src: u128,
    /// Destination address.
    pub dst: u128,
    /// Source port (ICMP type).
    pub src_port: u16,
    /// Destination port (ICMP code).
    pub dst_port: u16,
    /// IP protocol (the upper-layer protocol for IPv6).
    pub proto: u8,
    /// True for IPv6.
    pub v6: bool,
}

impl FlowKey {
    /// The key of the opposite direction of the same flow.
    pub fn reversed(&self) -> FlowKey {
        FlowKey {
            src: self.dst,
            dst: self.src,
            src_port: self.dst_port,
            dst_port: self.src_port,
            ..*self
        }
    }
}

/// The network layer of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3 {
    /// IPv4 or IPv6, with its classification key.
    Ip {
        /// The 5-tuple.
        key: FlowKey,
        /// TCP flags (0 for other protocols).
        tcp_flags: u8,
        /// A fragment other than the first: no transport header.
        later_fragment: bool,
        /// Where the packet sits in its datagram, if it is a fragment.
        fragment: Option<Fragment>,
        /// The identifier of an ICMP or ICMPv6 echo request or reply
        /// (connection tracking tells pings apart by it); 0 otherwise.
        echo_id: u16,
    },
    /// An ARP packet for IPv4 over Ethernet.
    Arp {
        /// 1 request, 2 reply.
        op: u16,
        /// Sender hardware address.
        sender_mac: [u8; 6],
        /// Sender protocol address.
        sender_ip: u32,
        /// Target protocol address.
        target_ip: u32,
    },
    /// An EtherType carried as opaque L2: one the parser does not know,
    /// or any, as [`parse_l2`] leaves it.
    Other(u16),
}

/// A fragment of an IP datagram: what ties it to its datagram's other
/// fragments, and where in the datagram it goes.
///
/// An IPv6 atomic fragment (offset 0, no more fragments; RFC 6946) is a
/// whole datagram and has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment {
    /// The datagram's identification (IPv4's 16 bits, IPv6's 32).
    pub id: u32,
    /// The protocol every fragment of the datagram names: IPv4's protocol
    /// field, or the Next Header of IPv6's Fragment header (an extension
    /// header's type if the chain goes on past it).
    pub proto: u8,
    /// Offset of the fragment's data in the datagram, in 8-byte units;
    /// 0 for the first fragment.
    pub offset: u16,
    /// More fragments follow (IPv4 MF, IPv6 M).
    pub more: bool,
}

/// The parsed headers of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headers {
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// VLAN ID of the outer 802.1Q tag, if the frame has one.
    pub vlan: Option<u16>,
    /// Offset of the network-layer header.
    pub l3_offset: usize,
    /// The network layer.
    pub l3: L3,
}

/// Why a frame could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The frame ends inside the named header.
    #[error("truncated {0} header")]
    Truncated(&'static str),
    /// A header field is impossible (version, header length, total length).
    #[error("invalid {0} header")]
    Invalid(&'static str),
    /// A fragment that could hide its transport header from a filter
    /// (RFC 1858, RFC 3128): a first fragment too short to hold the
    /// whole transport header, or a later one whose data would overlap
    /// it.
    #[error("{0}")]
    Fragment(&'static str),
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 4)?;
    Some(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

fn mac(b: &[u8], at: usize) -> [u8; 6] {
    let mut m = [0u8; 6];
    if let Some(s) = b.get(at..at + 6) {
        m.copy_from_slice(s);
    }
    m
}

/// True for a multicast (or broadcast) MAC address.
pub fn is_multicast(mac: &[u8; 6]) -> bool {
    mac[0] & 1 == 1
}

/// What a frame received on a VTEP's uplink is to that VTEP (see
/// [`vtep_frame`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VtepFrame {
    /// Not addressed to the VTEP: switched like any frame of the port.
    Other,
    /// An ARP request for the VTEP's address.
    ArpRequest {
        /// Sender hardware address.
        sender_mac: [u8; 6],
        /// Sender protocol address.
        sender_ip: u32,
    },
    /// An ARP reply to the VTEP (the answer to its own request).
    ArpReply {
        /// Sender hardware address.
        sender_mac: [u8; 6],
        /// Sender protocol address.
        sender_ip: u32,
    },
    /// A VXLAN frame for the VTEP.
    Vxlan {
        /// Offset of the inner Ethernet frame.
        inner: usize,
        /// VXLAN network identifier.
        vni: u32,
        /// Outer source address: the remote VTEP.
        src_ip: u32,
        /// Outer source MAC: the next hop toward the remote VTEP.
        src_mac: [u8; 6],
    },
    /// Addressed to the VTEP's IPv4 address but not valid VXLAN (another
    /// protocol or port, a bad header checksum, a fragment, a truncated
    /// header): nothing else may have it.
    Invalid,
}

/// Classifies an untagged frame received on the uplink of the VTEP with
/// IPv4 address `vtep_ip`: ARP for that address, VXLAN (RFC 7348, IPv4,
/// UDP port 4789, the I flag set) to it, anything else to it, or not
/// addressed to it.
pub fn vtep_frame(frame: &[u8], vtep_ip: u32) -> VtepFrame {
    match be16(frame, 12) {
        Some(ETH_ARP) => {
            let a = &frame[ETH_HLEN..];
            // Ethernet/IPv4 ARP, addressed to the VTEP.
            if a.len() < 28 || a[0..6] != [0, 1, 8, 0, 6, 4] || be32(a, 24) != Some(vtep_ip) {
                return VtepFrame::Other;
            }
            let (sender_mac, sender_ip) = (mac(a, 8), be32(a, 14).unwrap_or(0));
            match be16(a, 6) {
                Some(1) => VtepFrame::ArpRequest {
                    sender_mac,
                    sender_ip,
                },
                Some(2) => VtepFrame::ArpReply {
                    sender_mac,
                    sender_ip,
                },
                _ => VtepFrame::Invalid,
            }
        }
        Some(ETH_IPV4) => {
            let ip = &frame[ETH_HLEN..];
            if be32(ip, 16) != Some(vtep_ip) {
                return VtepFrame::Other;
            }
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let total = usize::from(be16(ip, 2).unwrap_or(0));
            let fragment = be16(ip, 6).is_some_and(|f| f & 0x3fff != 0);
            let ok = ip[0] >> 4 == 4
                && ihl >= 20
                && total >= ihl + 16 + ETH_HLEN
                && total <= ip.len()
                && !fragment
                && ip[9] == proto::UDP
                && ip_checksum(&ip[..ihl]) == 0;
            if !ok {
                return VtepFrame::Invalid;
            }
            let udp = &ip[ihl..total];
            let vx = &udp[8..];
            let udp_len = usize::from(be16(udp, 4).unwrap_or(0));
            if be16(udp, 2) != Some(VXLAN_UDP_PORT)
                || udp_len < 16 + ETH_HLEN
                || udp_len > udp.len()
                || vx[0] & 0x08 == 0
            {
                return VtepFrame::Invalid;
            }
            VtepFrame::Vxlan {
                inner: ETH_HLEN + ihl + 16,
                vni: be32(vx, 4).unwrap_or(0) >> 8,
                src_ip: be32(ip, 12).unwrap_or(0),
                src_mac: mac(frame, 6),
            }
        }
        _ => VtepFrame::Other,
    }
}

/// The IANA UDP port of VXLAN.
pub const VXLAN_UDP_PORT: u16 = 4789;

/// The Internet checksum (RFC 1071) of `bytes` (even length): the value
/// to store in a header whose checksum field is zero, and 0 over a
/// header whose checksum is right.
pub fn ip_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Parses a frame's headers.
///
/// # Errors
/// [`ParseError`] if a header is truncated or inconsistent.
#[inline]
pub fn parse(frame: &[u8]) -> Result<Headers, ParseError> {
    let mut h = parse_l2(frame)?;
    if let L3::Other(ethertype) = h.l3 {
        h.l3 = network_layer(ethertype, &frame[h.l3_offset..])?;
    }
    Ok(h)
}

/// Parses a frame's Ethernet header and optional 802.1Q tag only: its
/// network layer is left as [`L3::Other`] of its EtherType, at
/// `l3_offset`, for [`network_layer`] to parse if it is needed.
///
/// # Errors
/// [`ParseError`] if the Ethernet header or the tag is truncated.
#[inline]
pub fn parse_l2(frame: &[u8]) -> Result<Headers, ParseError> {
    if frame.len() < ETH_HLEN {
        return Err(ParseError::Truncated("Ethernet"));
    }
    let dst_mac = mac(frame, 0);
    let src_mac = mac(frame, 6);
    let mut ethertype = be16(frame, 12).ok_or(ParseError::Truncated("Ethernet"))?;
    let mut off = ETH_HLEN;
    let mut vlan = None;
    if ethertype == ETH_VLAN {
        let tci = be16(frame, off).ok_or(ParseError::Truncated("802.1Q"))?;
        ethertype = be16(frame, off + 2).ok_or(ParseError::Truncated("802.1Q"))?;
        vlan = Some(tci & 0x0fff);
        off += VLAN_HLEN;
    }
    Ok(Headers {
        dst_mac,
        src_mac,
        vlan,
        l3_offset: off,
        l3: L3::Other(ethertype),
    })
}

/// Parses the network layer `b` of EtherType `ethertype` (what follows
/// the headers [`parse_l2`] read): IPv4, IPv6 or ARP and their
/// transport ports; another EtherType is [`L3::Other`].
///
/// # Errors
/// [`ParseError`] if a header is truncated or inconsistent.
#[inline]
pub fn network_layer(ethertype: u16, b: &[u8]) -> Result<L3, ParseError> {
    match ethertype {
        ETH_IPV4 => parse_ipv4(b),
        ETH_IPV6 => parse_ipv6(b),
        ETH_ARP => parse_arp(b),
        other => Ok(L3::Other(other)),
    }
}

fn parse_arp(b: &[u8]) -> Result<L3, ParseError> {
    const T: ParseError = ParseError::Truncated("ARP");
    if b.len() < 28 {
        return Err(T);
    }
    // Ethernet hardware (1), IPv4 protocol, address lengths 6 and 4.
    if be16(b, 0) != Some(1) || be16(b, 2) != Some(ETH_IPV4) || b[4] != 6 || b[5] != 4 {
        return Err(ParseError::Invalid("ARP"));
    }
    Ok(L3::Arp {
        op: be16(b, 6).ok_or(T)?,
        sender_mac: mac(b, 8),
        sender_ip: be32(b, 14).ok_or(T)?,
        target_ip: be32(b, 24).ok_or(T)?,
    })
}

#[inline]
fn parse_ipv4(b: &[u8]) -> Result<L3, ParseError> {
    if b.len() < 20 {
        return Err(ParseError::Truncated("IPv4"));
    }
    if b[0] >> 4 != 4 {
        return Err(ParseError::Invalid("IPv4"));
    }
    let ihl = usize::from(b[0] & 0x0f) * 4;
    let total = usize::from(be16(b, 2).ok_or(ParseError::Truncated("IPv4"))?);
    // Ethernet padding may follow the datagram; a datagram longer than the
    // frame may not.
    if ihl < 20 || total < ihl || total > b.len() {
        return Err(ParseError::Invalid("IPv4"));
    }
    let frag = be16(b, 6).ok_or(ParseError::Truncated("IPv4"))?;
    // Offset and MF; the reserved bit and DF say nothing of where it goes.
    let fragment = (frag & 0x3fff != 0).then(|| Fragment {
        id: u32::from(be16(b, 4).unwrap_or(0)),
        proto: b[9],
        offset: frag & 0x1fff,
        more: frag & 0x2000 != 0,
    });
    let src = be32(b, 12).ok_or(ParseError::Truncated("IPv4"))?;
    let dst = be32(b, 16).ok_or(ParseError::Truncated("IPv4"))?;
    ip(
        u128::from(src),
        u128::from(dst),
        b[9],
        false,
        &b[ihl..total],
        fragment,
    )
}

/// Extension headers walked before giving up on an IPv6 packet.
const MAX_V6_EXTENSIONS: usize = 8;

fn parse_ipv6(b: &[u8]) -> Result<L3, ParseError> {
    const T: ParseError = ParseError::Truncated("IPv6");
    if b.len() < 40 {
        return Err(T);
    }
    if b[0] >> 4 != 6 {
        return Err(ParseError::Invalid("IPv6"));
    }
    let payload = usize::from(be16(b, 4).ok_or(T)?);
    if 40 + payload > b.len() {
        return Err(ParseError::Invalid("IPv6"));
    }
    let addr = |at: usize| -> u128 {
        let mut a = [0u8; 16];
        a.copy_from_slice(&b[at..at + 16]);
        u128::from_be_bytes(a)
    };
    let (src, dst) = (addr(8), addr(24));
    let end = 40 + payload;
    let mut next = b[6];
    let mut off = 40;
    let mut fragment = None;
    for _ in 0..MAX_V6_EXTENSIONS {
        if fragment.is_some_and(|f: Fragment| f.offset != 0) {
            // What follows a later fragment's Fragment header is data of
            // the middle of the datagram, not a header.
            break;
        }
        match next {
            // Hop-by-hop, routing, destination options: (len + 1) * 8 bytes.
            0 | 43 | 60 => {
                let h = b.get(off..off + 2).filter(|_| off + 2 <= end).ok_or(T)?;
                next = h[0];
                off += (usize::from(h[1]) + 1) * 8;
            }
            // Fragment: 8 bytes; offset in the upper 13 bits of bytes 2..4.
            44 => {
                let h = b.get(off..off + 8).filter(|_| off + 8 <= end).ok_or(T)?;
                if fragment.is_some() {
                    return Err(ParseError::Invalid("IPv6 Fragment header repeated"));
                }
                next = h[0];
                let field = u16::from_be_bytes([h[2], h[3]]);
                let f = Fragment {
                    id: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
                    proto: next,
                    offset: field >> 3,
                    more: field & 1 != 0,
                };
                // An atomic fragment is a whole datagram (RFC 6946).
                fragment = (f.offset != 0 || f.more).then_some(f);
                off += 8;
            }
            // Authentication header: (len + 2) * 4 bytes.
            51 => {
                let h = b.get(off..off + 2).filter(|_| off + 2 <= end).ok_or(T)?;
                next = h[0];
                off += (usize::from(h[1]) + 2) * 4;
            }
            _ => break,
        }
        if off > end {
            return Err(ParseError::Invalid("IPv6 extension header"));
        }
    }
    let later = fragment.is_some_and(|f| f.offset != 0);
    if !later && matches!(next, 0 | 43 | 44 | 51 | 60) {
        return Err(ParseError::Invalid("IPv6 extension header chain"));
    }
    ip(src, dst, next, true, &b[off..end], fragment)
}

/// The fewest bytes of a `proto` header a filter needs to see whole in
/// a datagram's first fragment: the ports, TCP's flags, ICMP's type, code
/// and echo identifier (RFC 1858, RFC 3128; RFC 7112 for IPv6). 0 for
/// protocols the filter reads nothing of.
fn min_transport(proto: u8) -> usize {
    match proto {
        proto::TCP => 20,
        proto::UDP | proto::ICMP | proto::ICMPV6 => 8,
        proto::SCTP => 12,
        _ => 0,
    }
}

/// Refuses fragment `f` of a `proto` datagram if it could hide the
/// transport header from the filter: a first fragment that does not hold
/// all of it (`l4` is what the fragment carries after the network-layer
/// headers), or a later one that would overlap it.
fn check_fragment(f: &Fragment, proto: u8, l4: &[u8]) -> Result<(), ParseError> {
    let need = min_transport(proto);
    if f.offset == 0 {
        let whole = match proto {
            proto::TCP => l4.len() >= 20 && usize::from(l4[12] >> 4) * 4 <= l4.len(),
            _ => l4.len() >= need,
        };
        if !whole {
            return Err(ParseError::Fragment("tiny first fragment"));
        }
    } else if usize::from(f.offset) * 8 < need {
        return Err(ParseError::Fragment(
            "fragment overlapping the transport header",
        ));
    }
    Ok(())
}

/// What the transport header adds to a key: the ports (ICMP type and
/// code), the TCP flags and the echo identifier.
#[derive(Default)]
struct Transport {
    src_port: u16,
    dst_port: u16,
    tcp_flags: u8,
    echo_id: u16,
}

/// The transport fields of `l4`, a `proto` header (none for a later
/// fragment or a protocol without ports).
#[inline(always)]
fn transport(proto: u8, l4: &[u8], later_fragment: bool) -> Result<Transport, ParseError> {
    let mut t = Transport::default();
    if later_fragment {
        return Ok(t);
    }
    match proto {
        proto::TCP => {
            if l4.len() < 20 {
                return Err(ParseError::Truncated("TCP"));
            }
            if usize::from(l4[12] >> 4) * 4 < 20 || usize::from(l4[12] >> 4) * 4 > l4.len() {
                return Err(ParseError::Invalid("TCP"));
            }
            t.src_port = u16::from_be_bytes([l4[0], l4[1]]);
            t.dst_port = u16::from_be_bytes([l4[2], l4[3]]);
            t.tcp_flags = l4[13];
        }
        proto::UDP | proto::SCTP => {
            let need = if proto == proto::UDP { 8 } else { 12 };
            if l4.len() < need {
                return Err(ParseError::Truncated(if proto == proto::UDP {
                    "UDP"
                } else {
                    "SCTP"
                }));
            }
            t.src_port = u16::from_be_bytes([l4[0], l4[1]]);
            t.dst_port = u16::from_be_bytes([l4[2], l4[3]]);
        }
        proto::ICMP | proto::ICMPV6 => {
            if l4.len() < 4 {
                return Err(ParseError::Truncated("ICMP"));
            }
            t.src_port = u16::from(l4[0]);
            t.dst_port = u16::from(l4[1]);
            if is_echo(proto, l4[0]).is_some() && l4.len() >= 6 {
                t.echo_id = u16::from_be_bytes([l4[4], l4[5]]);
            }
        }
        _ => {}
    }
    Ok(t)
}

/// The network layer of an IP packet from `src` to `dst` whose `proto`
/// header is `l4`: the key built once, in place.
#[inline(always)]
fn ip(
    src: u128,
    dst: u128,
    proto: u8,
    v6: bool,
    l4: &[u8],
    fragment: Option<Fragment>,
) -> Result<L3, ParseError> {
    let later_fragment = match &fragment {
        Some(f) => {
            check_fragment(f, proto, l4)?;
            f.offset != 0
        }
        None => false,
    };
    let t = transport(proto, l4, later_fragment)?;
    Ok(L3::Ip {
        key: FlowKey {
            src,
            dst,
            src_port: t.src_port,
            dst_port: t.dst_port,
            proto,
            v6,
        },
        tcp_flags: t.tcp_flags,
        later_fragment,
        fragment,
        echo_id: t.echo_id,
    })
}

/// For an ICMP (`proto` 1) or ICMPv6 (58) message of type `icmp_type`:
/// `Some(true)` for an echo request, `Some(false)` for an echo reply,
/// `None` for any other message or protocol.
pub fn is_echo(proto: u8, icmp_type: u8) -> Option<bool> {
    match (proto, icmp_type) {
        (proto::ICMP, 8) | (proto::ICMPV6, 128) => Some(true),
        (proto::ICMP, 0) | (proto::ICMPV6, 129) => Some(false),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builders for test frames (valid lengths; checksums are not checked).
    pub(crate) mod build {
        use super::super::*;

        /// Ethernet header, optionally 802.1Q-tagged.
        pub fn eth(dst: [u8; 6], src: [u8; 6], vlan: Option<u16>, ethertype: u16) -> Vec<u8> {
            let mut f = Vec::new();
            f.extend_from_slice(&dst);
            f.extend_from_slice(&src);
            if let Some(v) = vlan {
                f.extend_from_slice(&ETH_VLAN.to_be_bytes());
                f.extend_from_slice(&v.to_be_bytes());
            }
            f.extend_from_slice(&ethertype.to_be_bytes());
            f
        }

        /// An IPv4 packet with the given transport header bytes.
        pub fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
            let total = (20 + l4.len()) as u16;
            let mut p = vec![0x45, 0, 0, 0, 0, 1, 0, 0, 64, proto, 0, 0];
            p[2..4].copy_from_slice(&total.to_be_bytes());
            p.extend_from_slice(&src);
            p.extend_from_slice(&dst);
            p.extend_from_slice(l4);
            p
        }

        /// A TCP header.
        pub fn tcp(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
            let mut t = vec![0u8; 20];
            t[0..2].copy_from_slice(&sport.to_be_bytes());
            t[2..4].copy_from_slice(&dport.to_be_bytes());
            t[12] = 5 << 4;
            t[13] = flags;
            t
        }

        /// A UDP header with `payload` bytes after it.
        pub fn udp(sport: u16, dport: u16, payload: usize) -> Vec<u8> {
            let mut u = vec![0u8; 8 + payload];
            u[0..2].copy_from_slice(&sport.to_be_bytes());
            u[2..4].copy_from_slice(&dport.to_be_bytes());
            u[4..6].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
            u
        }

        /// A whole Ethernet/IPv4/UDP frame.
        pub fn udp4(
            src_mac: [u8; 6],
            dst_mac: [u8; 6],
            vlan: Option<u16>,
            src: [u8; 4],
            dst: [u8; 4],
            sport: u16,
            dport: u16,
        ) -> Vec<u8> {
            let mut f = eth(dst_mac, src_mac, vlan, ETH_IPV4);
            f.extend(ipv4(src, dst, proto::UDP, &udp(sport, dport, 18)));
            f
        }

        /// An ARP frame.
        pub fn arp(
            src_mac: [u8; 6],
            dst_mac: [u8; 6],
            vlan: Option<u16>,
            op: u16,
            sender_ip: [u8; 4],
            target_ip: [u8; 4],
        ) -> Vec<u8> {
            let mut f = eth(dst_mac, src_mac, vlan, ETH_ARP);
            f.extend_from_slice(&[0, 1, 8, 0, 6, 4]);
            f.extend_from_slice(&op.to_be_bytes());
            f.extend_from_slice(&src_mac);
            f.extend_from_slice(&sender_ip);
            f.extend_from_slice(&[0; 6]);
            f.extend_from_slice(&target_ip);
            f
        }

        /// An IPv6 packet with the given next header and payload.
        pub fn ipv6(src: u128, dst: u128, next: u8, payload: &[u8]) -> Vec<u8> {
            let mut p = vec![0x60, 0, 0, 0];
            p.extend_from_slice(&(payload.len() as u16).to_be_bytes());
            p.push(next);
            p.push(64);
            p.extend_from_slice(&src.to_be_bytes());
            p.extend_from_slice(&dst.to_be_bytes());
            p.extend_from_slice(payload);
            p
        }

        /// IPv4 packet `ip` (from [`ipv4`]) made a fragment of datagram
        /// `id` at `offset` (8-byte units), with more to come if `more`.
        pub fn frag4(mut ip: Vec<u8>, id: u16, offset: u16, more: bool) -> Vec<u8> {
            ip[4..6].copy_from_slice(&id.to_be_bytes());
            let field = offset | if more { 0x2000 } else { 0 };
            ip[6..8].copy_from_slice(&field.to_be_bytes());
            ip
        }

        /// An IPv6 packet whose Fragment header (datagram `id`, `offset`
        /// in 8-byte units, `more`) names `next` and carries `data`.
        pub fn frag6(
            src: u128,
            dst: u128,
            next: u8,
            id: u32,
            offset: u16,
            more: bool,
            data: &[u8],
        ) -> Vec<u8> {
            let field = offset << 3 | u16::from(more);
            let mut payload = vec![next, 0];
            payload.extend_from_slice(&field.to_be_bytes());
            payload.extend_from_slice(&id.to_be_bytes());
            payload.extend_from_slice(data);
            ipv6(src, dst, 44, &payload)
        }
    }

    use build::*;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    #[test]
    fn tagged_udp_over_ipv4() {
        let f = udp4(A, B, Some(101), [10, 0, 0, 1], [10, 0, 0, 2], 1234, 53);
        let h = parse(&f).unwrap();
        assert_eq!(h.src_mac, A);
        assert_eq!(h.dst_mac, B);
        assert_eq!(h.vlan, Some(101));
        assert_eq!(h.l3_offset, 18);
        let L3::Ip { key, .. } = h.l3 else {
            panic!("{h:?}")
        };
        assert_eq!(key.src, 0x0a00_0001);
        assert_eq!(key.dst, 0x0a00_0002);
        assert_eq!((key.src_port, key.dst_port, key.proto), (1234, 53, 17));
        assert!(!key.v6);
        assert_eq!(key.reversed().reversed(), key);
    }

    #[test]
    fn tcp_flags_and_icmp_type_code() {
        let mut f = eth(B, A, None, ETH_IPV4);
        f.extend(ipv4(
            [1, 1, 1, 1],
            [2, 2, 2, 2],
            proto::TCP,
            &tcp(80, 443, 0x12),
        ));
        let L3::Ip { key, tcp_flags, .. } = parse(&f).unwrap().l3 else {
            panic!()
        };
        assert_eq!((key.src_port, key.dst_port, tcp_flags), (80, 443, 0x12));

        let mut f = eth(B, A, None, ETH_IPV4);
        f.extend(ipv4(
            [1, 1, 1, 1],
            [2, 2, 2, 2],
            proto::ICMP,
            &[8, 0, 0, 0, 0x12, 0x34, 0, 1],
        ));
        let L3::Ip { key, echo_id, .. } = parse(&f).unwrap().l3 else {
            panic!()
        };
        assert_eq!((key.src_port, key.dst_port), (8, 0), "type and code");
        assert_eq!(echo_id, 0x1234, "echo identifier");

        // Not an echo: no identifier, whatever the bytes say.
        let mut f = eth(B, A, None, ETH_IPV4);
        f.extend(ipv4(
            [1, 1, 1, 1],
            [2, 2, 2, 2],
            proto::ICMP,
            &[3, 3, 0, 0, 0x12, 0x34, 0, 1],
        ));
        let L3::Ip { echo_id, .. } = parse(&f).unwrap().l3 else {
            panic!()
        };
        assert_eq!(echo_id, 0);
    }

    #[test]
    fn ipv6_with_extension_headers() {
        let mut payload = vec![proto::TCP, 0, 0, 0, 0, 0, 0, 0]; // hop-by-hop, 8 bytes
        payload.extend(tcp(5000, 22, 0x02));
        let mut f = eth(B, A, None, ETH_IPV6);
        f.extend(ipv6(1, 2, 0, &payload));
        let L3::Ip { key, tcp_flags, .. } = parse(&f).unwrap().l3 else {
            panic!()
        };
        assert!(key.v6);
        assert_eq!((key.src, key.dst, key.proto), (1, 2, proto::TCP));
        assert_eq!((key.src_port, key.dst_port, tcp_flags), (5000, 22, 0x02));

        // A later fragment has no ports.
        let mut payload = vec![proto::UDP, 0, 0, 8, 0, 0, 0, 1];
        payload.extend([0u8; 16]);
        let mut f = eth(B, A, None, ETH_IPV6);
        f.extend(ipv6(1, 2, 44, &payload));
        let L3::Ip {
            key,
            later_fragment,
            ..
        } = parse(&f).unwrap().l3
        else {
            panic!()
        };
        assert!(later_fragment);
        assert_eq!((key.proto, key.src_port, key.dst_port), (proto::UDP, 0, 0));
    }

    #[test]
    fn arp_and_other_ethertypes() {
        let f = arp(A, [0xff; 6], Some(7), 1, [10, 0, 0, 1], [10, 0, 0, 9]);
        let h = parse(&f).unwrap();
        assert_eq!(
            h.l3,
            L3::Arp {
                op: 1,
                sender_mac: A,
                sender_ip: 0x0a00_0001,
                target_ip: 0x0a00_0009
            }
        );
        let mut lldp = eth([0x01, 0x80, 0xc2, 0, 0, 0x0e], A, None, 0x88cc);
        lldp.extend([0u8; 46]);
        assert_eq!(parse(&lldp).unwrap().l3, L3::Other(0x88cc));
        assert!(is_multicast(&[0x01, 0x80, 0xc2, 0, 0, 0x0e]));
        assert!(!is_multicast(&A));
    }

    #[test]
    fn ethernet_padding_is_allowed_but_short_datagrams_are_not() {
        let mut f = eth(B, A, None, ETH_IPV4);
        f.extend(ipv4([1, 1, 1, 1], [2, 2, 2, 2], proto::UDP, &udp(1, 2, 0)));
        f.extend([0u8; 18]); // padding to 60 bytes
        assert!(parse(&f).is_ok());

        let mut bad = f.clone();
        bad[16..18].copy_from_slice(&200u16.to_be_bytes()); // total length > frame
        assert_eq!(parse(&bad), Err(ParseError::Invalid("IPv4")));
        let mut bad = f.clone();
        bad[14] = 0x44; // IHL 4
        assert_eq!(parse(&bad), Err(ParseError::Invalid("IPv4")));
        let mut bad = f.clone();
        bad[14] = 0x65; // version 6 under EtherType IPv4
        assert_eq!(parse(&bad), Err(ParseError::Invalid("IPv4")));
    }

    #[test]
    fn every_truncation_is_an_error_never_a_panic() {
        let mut frames = vec![udp4(A, B, Some(5), [1, 2, 3, 4], [5, 6, 7, 8], 9, 10)];
        let mut t = eth(B, A, None, ETH_IPV4);
        t.extend(ipv4([1, 1, 1, 1], [2, 2, 2, 2], proto::TCP, &tcp(1, 2, 0)));
        frames.push(t);
        let mut t = eth(B, A, None, ETH_IPV6);
        let mut payload = vec![proto::TCP, 0, 0, 0, 0, 0, 0, 0];
        payload.extend(tcp(5000, 22, 0x02));
        t.extend(ipv6(1, 2, 0, &payload));
        frames.push(t);
        frames.push(arp(A, B, None, 2, [1, 1, 1, 1], [2, 2, 2, 2]));
        for f in frames {
            assert!(parse(&f).is_ok());
            for cut in 0..f.len() {
                // Shorter frames either fail cleanly or (for a cut in the
                // payload only) parse; none panic.
                let _ = parse(&f[..cut]);
            }
            assert!(parse(&f[..cut_into_headers(&f)]).is_err());
        }
    }

    fn cut_into_headers(f: &[u8]) -> usize {
        f.len().min(20)
    }

    #[test]
    fn hostile_ipv6_extension_chains_are_refused() {
        // Nine hop-by-hop headers: more than the parser walks.
        let mut payload = Vec::new();
        for _ in 0..9 {
            payload.extend([0u8, 0, 0, 0, 0, 0, 0, 0]);
        }
        payload.extend(udp(1, 2, 0));
        let mut f = eth(B, A, None, ETH_IPV6);
        f.extend(ipv6(1, 2, 0, &payload));
        assert!(parse(&f).is_err());
        // An extension header claiming more than the payload.
        let mut f = eth(B, A, None, ETH_IPV6);
        f.extend(ipv6(1, 2, 60, &[proto::UDP, 200, 0, 0, 0, 0, 0, 0]));
        assert!(parse(&f).is_err());
    }

    /// The fragment of `f`'s IP packet, or the parse error.
    fn fragment_of(f: &[u8]) -> Result<(Option<Fragment>, FlowKey), ParseError> {
        match parse(f)?.l3 {
            L3::Ip { fragment, key, .. } => Ok((fragment, key)),
            l3 => panic!("{l3:?}"),
        }
    }

    #[test]
    fn ipv4_fragments_carry_their_datagram() {
        let v4 = |ip: Vec<u8>| {
            let mut f = eth(B, A, None, ETH_IPV4);
            f.extend(ip);
            f
        };
        let first = frag4(
            ipv4([1, 1, 1, 1], [2, 2, 2, 2], proto::UDP, &udp(7, 53, 8)),
            0xbeef,
            0,
            true,
        );
        let (frag, key) = fragment_of(&v4(first)).unwrap();
        assert_eq!(
            frag,
            Some(Fragment {
                id: 0xbeef,
                proto: proto::UDP,
                offset: 0,
                more: true
            })
        );
        assert_eq!((key.src_port, key.dst_port), (7, 53), "the first has ports");
        // A later one: no ports, whatever its bytes look like.
        let later = frag4(
            ipv4([1, 1, 1, 1], [2, 2, 2, 2], proto::UDP, &udp(9, 9, 8)),
            0xbeef,
            185,
            false,
        );
        let (frag, key) = fragment_of(&v4(later)).unwrap();
        assert_eq!(frag.map(|f| (f.offset, f.more)), Some((185, false)));
        assert_eq!((key.src_port, key.dst_port), (0, 0));
        // DF alone, or nothing: not a fragment.
        let mut df = ipv4([1, 1, 1, 1], [2, 2, 2, 2], proto::UDP, &udp(7, 53, 8));
        df[6] = 0x40;
        assert_eq!(fragment_of(&v4(df)).unwrap().0, None);
        // Later fragments of ICMP are not echo replies of type 0.
        let icmp = frag4(
            ipv4([1, 1, 1, 1], [2, 2, 2, 2], proto::ICMP, &[0; 16]),
            3,
            4,
            true,
        );
        let L3::Ip {
            echo_id,
            later_fragment,
            ..
        } = parse(&v4(icmp)).unwrap().l3
        else {
            panic!()
        };
        assert!(later_fragment);
        assert_eq!(echo_id, 0);
    }

    /// RFC 1858 and RFC 3128: a first fragment that cuts the transport
    /// header short, and a later one that would write over it, are
    /// refused; the same lengths unfragmented are merely truncated.
    #[test]
    fn tiny_and_overlapping_fragments_are_refused() {
        let v4 = |ip: Vec<u8>| {
            let mut f = eth(B, A, None, ETH_IPV4);
            f.extend(ip);
            f
        };
        let tiny = ParseError::Fragment("tiny first fragment");
        let overlap = ParseError::Fragment("fragment overlapping the transport header");
        // TCP cut after the ports (8 bytes): the flags are in the next one.
        let syn = tcp(40000, 80, 0x02);
        for (proto, l4) in [
            (proto::TCP, &syn[..8]),
            (proto::TCP, &syn[..16]),
            (proto::UDP, &udp(1, 2, 0)[..4]),
            (proto::ICMP, &[8u8, 0, 0, 0][..]),
            (proto::SCTP, &[0u8; 8][..]),
        ] {
            let first = frag4(ipv4([1, 1, 1, 1], [2, 2, 2, 2], proto, l4), 1, 0, true);
            assert_eq!(fragment_of(&v4(first)), Err(tiny), "{proto}");
        }
        // A TCP header whose data offset reaches past the fragment.
        let mut long = syn.clone();
        long[12] = 0xf0;
        let first = frag4(
            ipv4([1, 1, 1, 1], [2, 2, 2, 2], proto::TCP, &long),
            1,
            0,
            true,
        );
        assert_eq!(fragment_of(&v4(first)), Err(tiny));
        // Offsets 1 and 2 reach into TCP's 20 bytes; 3 does not.
        for (offset, want) in [(1, Err(overlap)), (2, Err(overlap)), (3, Ok(()))] {
            let later = frag4(
                ipv4([1, 1, 1, 1], [2, 2, 2, 2], proto::TCP, &[0; 8]),
                1,
                offset,
                true,
            );
            assert_eq!(fragment_of(&v4(later)).map(|_| ()), want, "offset {offset}");
        }
        // UDP's header is 8 bytes: offset 1 is clear of it.
        let later = frag4(
            ipv4([1, 1, 1, 1], [2, 2, 2, 2], proto::UDP, &[0; 8]),
            1,
            1,
            true,
        );
        assert!(fragment_of(&v4(later)).is_ok());
        // A protocol the filter reads nothing of has no tiny fragments.
        let first = frag4(ipv4([1, 1, 1, 1], [2, 2, 2, 2], 47, &[0; 2]), 1, 0, true);
        assert!(fragment_of(&v4(first)).is_ok());
        // IPv6, alike.
        let mut f = eth(B, A, None, ETH_IPV6);
        f.extend(frag6(1, 2, proto::TCP, 9, 0, true, &syn[..12]));
        assert_eq!(fragment_of(&f), Err(tiny));
        let mut f = eth(B, A, None, ETH_IPV6);
        f.extend(frag6(1, 2, proto::TCP, 9, 1, true, &[0; 8]));
        assert_eq!(fragment_of(&f), Err(overlap));
    }

    #[test]
    fn ipv6_fragments_and_atomic_fragments() {
        let v6 = |p: Vec<u8>| {
            let mut f = eth(B, A, None, ETH_IPV6);
            f.extend(p);
            f
        };
        let (frag, key) = fragment_of(&v6(frag6(
            1,
            2,
            proto::UDP,
            0xdead_beef,
            0,
            true,
            &udp(7, 53, 8),
        )))
        .unwrap();
        assert_eq!(
            frag,
            Some(Fragment {
                id: 0xdead_beef,
                proto: proto::UDP,
                offset: 0,
                more: true
            })
        );
        assert_eq!((key.proto, key.src_port, key.dst_port), (proto::UDP, 7, 53));
        // An atomic fragment is a whole datagram (RFC 6946).
        let (frag, key) =
            fragment_of(&v6(frag6(1, 2, proto::UDP, 5, 0, false, &udp(7, 53, 8)))).unwrap();
        assert_eq!((frag, key.dst_port), (None, 53));
        // A later fragment: the bytes after its Fragment header are data,
        // even where the header names another extension header.
        let (frag, key) = fragment_of(&v6(frag6(1, 2, 60, 5, 100, false, &[0xff; 16]))).unwrap();
        assert_eq!(frag.map(|f| (f.proto, f.offset)), Some((60, 100)));
        assert_eq!((key.proto, key.src_port, key.dst_port), (60, 0, 0));
        // Two Fragment headers in one chain.
        let inner = frag6(1, 2, proto::UDP, 5, 0, true, &udp(7, 53, 8));
        let twice = frag6(1, 2, 44, 5, 0, true, &inner[40..]);
        assert!(matches!(parse(&v6(twice)), Err(ParseError::Invalid(_))));
    }
}
