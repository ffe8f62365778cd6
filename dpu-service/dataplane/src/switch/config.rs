//! The switch's configuration as the control plane gives it: tenants,
//! their attachments, address guards and rules, the VTEPs, table sizes;
//! and [`ConfigError`], why a configuration is refused.

use std::sync::Arc;
use std::time::Duration;

use crate::classify::AclRule;
use crate::conntrack::Timeouts;
use crate::wire::{hides_network_layer, L3};
use crate::worker::DropReason;

/// One way a tenant is reached: a port, and a VLAN on it (0: the whole
/// port), or a VXLAN network on the port's VTEP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attach {
    /// Port index (the driver's).
    pub port: usize,
    /// VLAN ID 1..=4094, or 0 for the whole port (or with `vni`: the
    /// inner frames' tags pass untouched).
    pub vlan: u16,
    /// VXLAN network identifier 1..=16777215 on the port's [`Vtep`], or
    /// 0 for a port or VLAN attachment.
    pub vni: u32,
}

impl Attach {
    /// A port attachment (`vlan` 0) or VLAN attachment.
    pub fn port(port: usize, vlan: u16) -> Attach {
        Attach { port, vlan, vni: 0 }
    }
}

/// A VXLAN tunnel endpoint on an uplink port: it answers ARP for its
/// address, decapsulates the VXLAN frames sent to it into the tenant of
/// their VNI and encapsulates that tenant's frames toward remote VTEPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vtep {
    /// IPv4 address.
    pub ip: u32,
    /// MAC address (the port's).
    pub mac: [u8; 6],
}

/// A filter rule: what it matches and whether it lets the packet through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchRule {
    /// The rule's ID within its tenant: its counters follow it across
    /// configuration changes.
    pub id: String,
    /// The match; `order` sets precedence (smallest first), `tag` is ignored.
    pub matches: AclRule,
    /// Allow (true) or deny.
    pub allow: bool,
    /// For an allow rule: track the connections it lets through, so their
    /// replies pass without a rule. Ignored on deny rules.
    pub stateful: bool,
    /// For an allow rule: the most traffic it lets through, all workers
    /// together; the rest is dropped as `RateLimited`.
    pub rate_limit: Option<RateLimit>,
}

/// A token bucket on a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Packets, or bits, per second.
    pub per_second: u64,
    /// `per_second` counts bits of whole frames, not packets.
    pub bits: bool,
    /// Bucket depth: packets, or bytes with `bits`.
    pub burst: u64,
}

/// Anti-spoofing of one attachment: the sources frames entering through
/// it may have. An empty list allows any source of its kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Guard {
    /// Allowed source MAC addresses (and ARP sender addresses).
    pub macs: Vec<[u8; 6]>,
    /// Allowed IPv4 source ranges (inclusive); also ARP's sender address.
    pub v4: Vec<(u32, u32)>,
    /// Allowed IPv6 source ranges (inclusive).
    pub v6: Vec<(u128, u128)>,
}

impl Guard {
    /// True if the guard allows every source.
    pub fn is_open(&self) -> bool {
        self.macs.is_empty() && self.v4.is_empty() && self.v6.is_empty()
    }

    /// Whether a frame from `src_mac` with network layer `l3` may enter:
    /// `Spoofed` if a source is not allowed, `Encapsulated` if the guard
    /// lists anything and its network layer is behind a header the parser
    /// stops at ([`hides_network_layer`]: a second tag, QinQ, MPLS,
    /// PPPoE), where the guard cannot check it. Once any prefix is
    /// listed, IP of a family without one is refused; an ARP probe
    /// (sender address 0.0.0.0) passes the address check.
    pub(super) fn check(&self, src_mac: &[u8; 6], l3: &L3) -> Result<(), DropReason> {
        if let L3::Other(ethertype) = *l3 {
            if !self.is_open() && hides_network_layer(ethertype) {
                return Err(DropReason::Encapsulated);
            }
        }
        if self.allows(src_mac, l3) {
            Ok(())
        } else {
            Err(DropReason::Spoofed)
        }
    }

    /// True if the sources of a frame from `src_mac` with network layer
    /// `l3` are allowed (see [`Guard::check`]).
    fn allows(&self, src_mac: &[u8; 6], l3: &L3) -> bool {
        let mac_ok = |m: &[u8; 6]| self.macs.is_empty() || self.macs.contains(m);
        let prefixes = !self.v4.is_empty() || !self.v6.is_empty();
        let v4_ok = |a: u32| self.v4.iter().any(|&(lo, hi)| lo <= a && a <= hi);
        mac_ok(src_mac)
            && match l3 {
                L3::Ip { key, .. } if prefixes => {
                    if key.v6 {
                        self.v6
                            .iter()
                            .any(|&(lo, hi)| lo <= key.src && key.src <= hi)
                    } else {
                        v4_ok(key.src as u32)
                    }
                }
                L3::Arp {
                    sender_mac,
                    sender_ip,
                    ..
                } => mac_ok(sender_mac) && (!prefixes || *sender_ip == 0 || v4_ok(*sender_ip)),
                _ => true,
            }
    }
}

/// One tenant's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantConfig {
    /// Name, for errors and logs.
    pub name: String,
    /// Where the tenant's traffic enters and leaves.
    pub attachments: Vec<Attach>,
    /// Anti-spoofing per attachment, by index into `attachments`; an
    /// attachment without an entry allows any source.
    pub guards: Vec<Guard>,
    /// Per VXLAN attachment, by index into `attachments`: the remote
    /// VTEPs (IPv4) that get a copy of its broadcast, multicast and
    /// unknown-unicast frames (head-end replication). Known unicast goes
    /// to the VTEP its destination was learned from.
    pub remote_vteps: Vec<Vec<u32>>,
    /// Per VXLAN attachment, by index into `attachments`: underlay
    /// address ranges (IPv4, inclusive) whose VTEPs may also send into
    /// it, besides its `remote_vteps`. VXLAN from any other source is
    /// dropped as [`DropReason::UnknownVtep`].
    ///
    /// [`DropReason::UnknownVtep`]: crate::worker::DropReason::UnknownVtep
    pub vtep_prefixes: Vec<Vec<(u32, u32)>>,
    /// Verdict for IP packets no rule matches, and for non-IP, non-ARP frames.
    pub default_allow: bool,
    /// Filter rules. Shared: a publish whose tenant holds the very list
    /// (the same allocation) the running configuration's tenant of that
    /// name was compiled from keeps its compiled rules without comparing
    /// them, so an unchanged tenant costs a publish nothing per rule.
    pub rules: Arc<Vec<SwitchRule>>,
    /// Storage endpoints: stations of the tenant the service serves
    /// itself, each compiled into an attachment on a virtual port (see
    /// [`Endpoint`](super::Endpoint)).
    pub endpoints: Vec<super::Endpoint>,
    /// The tenant's flows stay on the cores: none is offered to flow
    /// hardware ([`crate::offload`]).
    pub no_offload: bool,
}

/// The whole switch configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchConfig {
    /// Number of ports of the driver.
    pub ports: usize,
    /// The VTEP of each port that has one, by port index.
    pub vteps: Vec<Option<Vtep>>,
    /// The tenants.
    pub tenants: Vec<TenantConfig>,
    /// Most MAC addresses a worker learns (all tenants together).
    pub mac_table_size: usize,
    /// A learned address not seen for this long is forgotten.
    pub mac_ageing: Duration,
    /// Most MAC addresses a worker learns for one tenant; a frame from
    /// a new address beyond it is dropped as [`DropReason::MacLimit`].
    ///
    /// [`DropReason::MacLimit`]: crate::worker::DropReason::MacLimit
    pub mac_per_tenant: usize,
    /// Most MAC addresses a worker learns on one attachment (port
    /// security); beyond it, as for `mac_per_tenant`.
    pub mac_per_attachment: usize,
    /// Entries of each worker's MAC table kept for each tenant, that no
    /// other tenant's addresses can take (at most `mac_table_size` over
    /// the number of tenants); the rest is shared.
    pub mac_reserved_per_tenant: usize,
    /// Worker threads: one shard of tenant and rule counters each.
    pub workers: usize,
    /// Most tracked connections, all tenants and workers together (each
    /// worker gets an even share: symmetric RSS spreads flows evenly).
    pub conntrack_max: usize,
    /// Most tracked connections of one tenant, all workers together.
    pub conntrack_per_tenant: usize,
    /// Connections kept for each tenant that tracks connections, all
    /// workers together, that no other tenant can take (see
    /// [`Shares`]): less if `conntrack_max` cannot keep that many for
    /// every such tenant, then an even split.
    ///
    /// [`Shares`]: crate::fair_share::Shares
    pub conntrack_reserved_per_tenant: usize,
    /// Most fragmented datagrams tracked (whose first fragment passed),
    /// all tenants and workers together.
    pub fragments_max: usize,
    /// Most fragmented datagrams of one tenant tracked, all workers
    /// together.
    pub fragments_per_tenant: usize,
    /// Fragmented datagrams kept for each tenant, all workers together
    /// (as `conntrack_reserved_per_tenant`).
    pub fragments_reserved_per_tenant: usize,
    /// How long after its first fragment a datagram's later fragments
    /// may pass.
    pub fragment_timeout: Duration,
    /// How long idle connections live.
    pub conntrack_timeouts: Timeouts,
    /// Entries of each worker's flow cache (classifications of IPv4 keys
    /// of tenants with at least [`FLOW_CACHE_MIN_RULES`] rules), 32 bytes
    /// each; 0, the default here, turns it off. It pays while a worker's
    /// flows fit in about half its entries (see the switch benchmarks,
    /// docs/benchmarks/switch-pipeline.md and switch-dpdk-vs-ovs.md).
    ///
    /// [`FLOW_CACHE_MIN_RULES`]: super::FLOW_CACHE_MIN_RULES
    pub flow_cache_entries: usize,
    /// Frames each way between one worker and one storage endpoint that
    /// may wait for the other side ([`crate::endpoint_queues::EndpointQueues`]);
    /// a frame for an endpoint beyond them is dropped as `EndpointFull`.
    pub endpoint_queue_depth: usize,
    /// The longest frame (untagged, without FCS) a storage endpoint
    /// takes: its IP MTU plus 14 bytes. Longer ones are dropped as
    /// `EndpointFull`.
    pub endpoint_frame_max: usize,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        Self {
            ports: 0,
            vteps: Vec::new(),
            tenants: Vec::new(),
            mac_table_size: 16_384,
            mac_ageing: Duration::from_secs(300),
            mac_per_tenant: 4096,
            mac_per_attachment: 1024,
            mac_reserved_per_tenant: 256,
            workers: 1,
            conntrack_max: 262_144,
            conntrack_per_tenant: 65_536,
            conntrack_reserved_per_tenant: 1_024,
            fragments_max: 65_536,
            fragments_per_tenant: 16_384,
            fragments_reserved_per_tenant: 256,
            fragment_timeout: Duration::from_secs(10),
            conntrack_timeouts: Timeouts::default(),
            flow_cache_entries: 0,
            endpoint_queue_depth: 1024,
            endpoint_frame_max: 1514,
        }
    }
}

/// Why a configuration cannot be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An attachment names a port the driver does not have.
    #[error("tenant {tenant}: port {port} does not exist")]
    NoSuchPort {
        /// Tenant name.
        tenant: String,
        /// Port index.
        port: usize,
    },
    /// A VLAN ID outside 0..=4094.
    #[error("tenant {tenant}: VLAN {vlan} is not in 0..=4094")]
    BadVlan {
        /// Tenant name.
        tenant: String,
        /// The VLAN ID.
        vlan: u16,
    },
    /// Two tenants claim the same port and VLAN, or a whole port and a
    /// VLAN on it.
    #[error("tenant {tenant}: port {port} VLAN {vlan} is already attached to tenant {other}")]
    Overlap {
        /// Tenant name.
        tenant: String,
        /// Port index.
        port: usize,
        /// VLAN ID.
        vlan: u16,
        /// The tenant that has it.
        other: String,
    },
    /// A VXLAN attachment on a port without a VTEP.
    #[error("tenant {tenant}: port {port} has no VTEP for VXLAN network {vni}")]
    NoVtep {
        /// Tenant name.
        tenant: String,
        /// Port index.
        port: usize,
        /// The VNI.
        vni: u32,
    },
    /// A VNI outside 1..=16777215, or a VXLAN attachment with a VLAN.
    #[error("tenant {tenant}: VXLAN network {vni} VLAN {vlan} is not a VNI in 1..=16777215 without a VLAN")]
    BadVni {
        /// Tenant name.
        tenant: String,
        /// The VNI.
        vni: u32,
        /// The VLAN ID given with it.
        vlan: u16,
    },
    /// Two tenants claim the same VXLAN network of a port.
    #[error(
        "tenant {tenant}: port {port} VXLAN network {vni} is already attached to tenant {other}"
    )]
    VniOverlap {
        /// Tenant name.
        tenant: String,
        /// Port index.
        port: usize,
        /// The VNI.
        vni: u32,
        /// The tenant that has it.
        other: String,
    },
    /// An underlay range of a VXLAN attachment whose start is past its end.
    #[error("tenant {tenant}: VXLAN network {vni} has an empty underlay range")]
    BadVtepPrefix {
        /// Tenant name.
        tenant: String,
        /// The VNI.
        vni: u32,
    },
    /// Two rules of a tenant have the same order.
    #[error("tenant {tenant}: two rules have order {order}")]
    DuplicateOrder {
        /// Tenant name.
        tenant: String,
        /// The order.
        order: u32,
    },
    /// A table size or the worker count out of its bounds
    /// ([`SwitchConfig::check_sizes`]).
    #[error("{0}")]
    Size(#[from] super::SizeError),
    /// A storage endpoint with a MAC that is not unicast or is another
    /// endpoint's, an address that is no host's, or an address twice in
    /// one tenant.
    #[error("tenant {tenant}: endpoint {reason}")]
    BadEndpoint {
        /// Tenant name.
        tenant: String,
        /// What is wrong.
        reason: String,
    },
}
