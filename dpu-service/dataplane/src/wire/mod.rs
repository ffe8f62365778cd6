//! The wire format: the headers the data plane reads and the ones it
//! writes, side by side (in the spirit of smoltcp's `wire` modules).
//!
//! - Reading (`parse.rs`): [`parse`] walks Ethernet, one optional 802.1Q
//!   tag, IPv4, IPv6 or ARP and the transport header into [`Headers`];
//!   [`parse_l2`] stops after the link layer and [`network_layer`]
//!   finishes the job where a policy needs it; [`vtep_frame`] tells what
//!   a frame received on a VTEP's uplink is to that VTEP.
//! - Writing, by header: `vlan.rs` pushes, strips or sets a frame's outer
//!   802.1Q tag; `vxlan.rs` puts a frame into a VXLAN tunnel (behind
//!   [`VXLAN_OVERHEAD`] bytes of outer headers) or, while the remote
//!   VTEP is not resolved, turns it into an ARP request for it. What to
//!   write is the pipeline's verdict ([`VlanOp`](crate::worker::VlanOp),
//!   [`Tunnel`](crate::worker::Tunnel)), carried out on the way out.
//!
//! The contract:
//! - Reads never go out of bounds and never panic: a length or field
//!   that does not add up is a [`ParseError`] (the packet is dropped as
//!   malformed), or [`VtepFrame::Invalid`]. Nothing is copied but the
//!   fields themselves, and reading never modifies the frame.
//! - Writes happen in place, in the driver's buffer, growing or
//!   shrinking the frame at its front only (the buffer's headroom). A
//!   write that does not fit (no tag to strip or set, no room to push)
//!   reports false instead of panicking, and the frame may then only be
//!   dropped.
//! - Numbers in headers are big-endian on the wire and plain integers
//!   here. The classification key, [`FlowKey`], holds both address
//!   families in `u128`s (IPv4 in the low 32 bits, `v6` telling them
//!   apart) and puts ICMP's type and code where TCP, UDP and SCTP keep
//!   their source and destination ports, so one classifier serves both;
//!   protocols without ports, and fragments other than the first, have
//!   zero there.

mod parse;
mod vlan;
mod vxlan;

#[cfg(test)]
pub(crate) use self::parse::tests;
pub use self::parse::{
    hides_network_layer, ip_checksum, is_echo, is_multicast, network_layer, parse, parse_l2, proto,
    vtep_frame, FlowKey, Fragment, Headers, ParseError, VtepFrame, ETH_ARP, ETH_HLEN, ETH_IPV4,
    ETH_IPV6, ETH_MPLS, ETH_MPLS_MC, ETH_PPPOE, ETH_QINQ, ETH_VLAN, L3, VLAN_HLEN, VXLAN_UDP_PORT,
};
pub(crate) use self::vlan::apply_vlan;
pub(crate) use self::vxlan::apply_tunnel;
pub use self::vxlan::VXLAN_OVERHEAD;
