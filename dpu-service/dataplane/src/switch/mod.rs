//! The per-tenant switch: the pipeline that maps every packet to its
//! tenant, filters it by the tenant's rules and forwards it only to that
//! tenant's attachments.
//!
//! A frame belongs to the tenant attached to its input port and outer VLAN
//! (a VLAN attachment), else to the tenant owning the whole port (VLAN 0,
//! where tags pass through untouched), else to nobody and is dropped as
//! `NoTenant`. Whatever the frame says, it can only leave through an
//! attachment of the same tenant: MAC tables are per tenant, floods list
//! only the tenant's attachments, and the ingress attachment is never an
//! output. Tags are pushed, popped or rewritten per output attachment.
//!
//! IP packets go through the tenant's [`Classifier`] (first matching rule
//! wins; no match takes the default policy), with a per-worker
//! [`FlowCache`] in front for tenants with many rules. ARP passes; other EtherTypes
//! take the default policy. Source MACs are learned only from frames that
//! pass, so a denied frame cannot move a learned address.
//!
//! A packet a *stateful* allow rule lets through opens a connection in the
//! worker's [`ConnTable`]; for a tenant with stateful rules, packets of
//! known connections (both directions) pass on the connection's state
//! before any rule is looked at, and packets that do not fit it are
//! dropped as `ConntrackInvalid` (a lone ACK or RST opens nothing). When
//! the configuration changes, a connection is kept only while the packet
//! that opened it would still open it under the new rules: it is checked
//! again when its next packet comes.
//!
//! Configuration is compiled off the packet path into an immutable
//! [`Compiled`] snapshot and published through a [`SwitchHandle`]; each
//! worker picks up a new snapshot between bursts (one atomic load per
//! turn) and starts it with an empty MAC table, so no verdict or learned
//! port of an older configuration survives the switch. A worker that takes
//! a new snapshot stores its generation (one more atomic store, only
//! then), so the handle can tell when every worker has taken one
//! ([`SwitchHandle::taken`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::classify::{AclRule, Classifier};
use crate::conntrack::{ConnKey, ConnTable, Refused, Timeouts};
use crate::flowcache::{FlowCache, FlowCacheStats};
use crate::io::Packet;
use crate::l2memo::{Decision, Header, L2Memo};
use crate::mactable::MacTable;
use crate::parse::{
    is_multicast, network_layer, parse_l2, vtep_frame, FlowKey, VtepFrame, ETH_HLEN, ETH_IPV4,
    ETH_IPV6, L3,
};
use crate::worker::{DropReason, Egress, Pipeline, Tunnel, Verdict, VlanOp, BURST};
use dpdk::hint::prefetch;

/// No tenant: the marker in the attachment tables.
const NONE: u32 = u32::MAX;

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

/// Token units per packet, or per bit: tokens accrue at the limit's
/// `per_second` units per microsecond.
const UNITS: u64 = 1_000_000;

/// One worker's share of a [`RateLimit`], in token units.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Units per microsecond.
    rate: u64,
    /// Depth in units.
    cap: u64,
    bits: bool,
}

impl Bucket {
    /// The share of `l` each of `workers` workers enforces: an even part
    /// of rate and depth, but room for at least one packet.
    fn share(l: &RateLimit, workers: usize) -> Bucket {
        let w = workers.max(1) as u64;
        let (depth, one) = if l.bits {
            (l.burst.saturating_mul(8), 1514 * 8)
        } else {
            (l.burst, 1)
        };
        Bucket {
            rate: (l.per_second / w).max(1),
            cap: (depth / w).max(one).saturating_mul(UNITS),
            bits: l.bits,
        }
    }

    /// Takes a `len`-byte packet's tokens from `cells` at `now_us`, after
    /// refilling; false (nothing taken) if there are not enough.
    #[inline]
    fn take(&self, cells: &RuleCells, now_us: u64, len: u64) -> bool {
        let mut tokens = cells.tokens.load(Ordering::Relaxed);
        let last = cells.stamp.load(Ordering::Relaxed);
        if last == 0 {
            // First use in this snapshot: a full bucket.
            tokens = self.cap;
            cells.stamp.store(now_us.max(1), Ordering::Relaxed);
        } else if now_us > last {
            let add = u128::from(now_us - last) * u128::from(self.rate);
            tokens = (u128::from(tokens) + add).min(u128::from(self.cap)) as u64;
            cells.stamp.store(now_us, Ordering::Relaxed);
        }
        let cost = if self.bits {
            len.saturating_mul(8 * UNITS)
        } else {
            UNITS
        };
        let ok = tokens >= cost;
        if ok {
            tokens -= cost;
        }
        cells.tokens.store(tokens, Ordering::Relaxed);
        ok
    }
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

    /// True if a frame from `src_mac` with network layer `l3` may enter.
    /// Once any prefix is listed, IP of a family without one is refused;
    /// an ARP probe (sender address 0.0.0.0) passes the address check.
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
    /// Verdict for IP packets no rule matches, and for non-IP, non-ARP frames.
    pub default_allow: bool,
    /// Filter rules.
    pub rules: Vec<SwitchRule>,
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
    /// Worker threads: one shard of tenant and rule counters each.
    pub workers: usize,
    /// Most tracked connections, all tenants and workers together (each
    /// worker gets an even share: symmetric RSS spreads flows evenly).
    pub conntrack_max: usize,
    /// Most tracked connections of one tenant, all workers together.
    pub conntrack_per_tenant: usize,
    /// How long idle connections live.
    pub conntrack_timeouts: Timeouts,
    /// Entries of each worker's flow cache (classifications of IPv4 keys
    /// of tenants with at least [`FLOW_CACHE_MIN_RULES`] rules), 32 bytes
    /// each; 0, the default here, turns it off. It pays while a worker's
    /// flows fit in about half its entries (see the README's switch
    /// benchmarks).
    pub flow_cache_entries: usize,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        Self {
            ports: 0,
            vteps: Vec::new(),
            tenants: Vec::new(),
            mac_table_size: 16_384,
            mac_ageing: Duration::from_secs(300),
            workers: 1,
            conntrack_max: 262_144,
            conntrack_per_tenant: 65_536,
            conntrack_timeouts: Timeouts::default(),
            flow_cache_entries: 0,
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
    /// Two rules of a tenant have the same order.
    #[error("tenant {tenant}: two rules have order {order}")]
    DuplicateOrder {
        /// Tenant name.
        tenant: String,
        /// The order.
        order: u32,
    },
}

/// One tenant's counters in one worker's shard.
#[derive(Debug, Default)]
struct TenantCells {
    rx_packets: AtomicU64,
    rx_bytes: AtomicU64,
    forwarded: AtomicU64,
    dropped: AtomicU64,
    /// Tracked connections now (a gauge the worker stores).
    conntrack: AtomicU64,
}

/// One rule's counters in one worker's shard, on a cache line of its
/// own: at 40 bytes, one rule in four had the counters a match bumps
/// split over two lines, of which only the first was prefetched.
#[derive(Debug, Default)]
#[repr(align(64))]
struct RuleCells {
    packets: AtomicU64,
    bytes: AtomicU64,
    /// Unix seconds of the last match; 0: never.
    last_hit: AtomicU64,
    /// Rate limit: tokens left, and when they were last refilled (the
    /// worker clock, microseconds).
    tokens: AtomicU64,
    stamp: AtomicU64,
}

/// Adds `n` to a cell only its own worker writes: a plain load and store,
/// no locked read-modify-write on the packet path.
#[inline]
fn bump(cell: &AtomicU64, n: u64) {
    cell.store(
        cell.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

/// One worker's tenant and rule counters for one snapshot, on cache lines
/// of its own.
#[derive(Debug)]
#[repr(align(128))]
struct Shard {
    tenants: Box<[TenantCells]>,
    /// Per tenant, per rule tag.
    rules: Box<[Box<[RuleCells]>]>,
}

/// Traffic counters of one tenant, summed over workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantTraffic {
    /// Packets received on the tenant's attachments.
    pub rx_packets: u64,
    /// Bytes received on the tenant's attachments.
    pub rx_bytes: u64,
    /// Packets the filter let through (forwarded or flooded).
    pub forwarded_packets: u64,
    /// Packets the filter or the default policy dropped.
    pub dropped_packets: u64,
    /// Connections tracked now (a gauge, not a count).
    pub conntrack_entries: u64,
}

/// Counters of one rule, summed over workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleTraffic {
    /// Packets the rule matched (first match).
    pub packets: u64,
    /// Bytes of those packets.
    pub bytes: u64,
    /// Unix seconds of the last match; 0 if never.
    pub last_hit: u64,
}

/// Tenant and rule counters of the switch, by tenant name and (tenant,
/// rule ID), kept across configuration changes for tenants and rules that
/// stay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Traffic {
    /// By tenant name.
    pub tenants: std::collections::BTreeMap<String, TenantTraffic>,
    /// By (tenant name, rule ID).
    pub rules: std::collections::BTreeMap<(String, String), RuleTraffic>,
}

impl Traffic {
    fn add_tenant(&mut self, name: &str, t: TenantTraffic) {
        let e = self.tenants.entry(name.to_string()).or_default();
        e.rx_packets += t.rx_packets;
        e.rx_bytes += t.rx_bytes;
        e.forwarded_packets += t.forwarded_packets;
        e.dropped_packets += t.dropped_packets;
        e.conntrack_entries += t.conntrack_entries;
    }

    fn add_rule(&mut self, tenant: &str, rule: &str, r: RuleTraffic) {
        let e = self
            .rules
            .entry((tenant.to_string(), rule.to_string()))
            .or_default();
        e.packets += r.packets;
        e.bytes += r.bytes;
        e.last_hit = e.last_hit.max(r.last_hit);
    }

    fn merge(&mut self, other: &Traffic) {
        for (n, t) in &other.tenants {
            self.add_tenant(n, *t);
        }
        for ((t, r), c) in &other.rules {
            self.add_rule(t, r, *c);
        }
    }
}

#[derive(Debug)]
struct CompiledTenant {
    name: String,
    /// Per attachment: its anti-spoofing, if it has any.
    guards: Vec<Option<Guard>>,
    /// IP frames are switched at L2, their network layer unparsed, as
    /// nothing would look at it (no rules, allow by default, no address
    /// guard on any attachment).
    opaque_ip: bool,
    /// Stable across configurations while the name stays (connection keys).
    uid: u32,
    /// Has stateful rules: look packets up in the connection table.
    tracks: bool,
    /// Enough rules to look classifications up in the flow cache first.
    cached: bool,
    /// What each rule does, by rule tag: [`ALLOWS`], [`OPENS`] and
    /// [`LIMITED`] bits (a byte a rule, so a big tenant's stay in cache).
    actions: Vec<u8>,
    /// Rate limit (this worker's share) by rule tag.
    limits: Vec<Option<Bucket>>,
    /// The rules by tag (`matches.tag` is the slot's index); `None`: a
    /// slot whose rule was removed by an incremental change.
    slots: Arc<Vec<Option<Slot>>>,
    /// The tags of the configuration's rules, in the configuration's order.
    order: Arc<Vec<u32>>,
    attachments: Vec<Attach>,
    /// Remote VTEPs per attachment (empty but for VXLAN attachments).
    remotes: Vec<Vec<u32>>,
    default_allow: bool,
    classifier: Classifier,
}

/// An allow rule (else deny).
const ALLOWS: u8 = 1;
/// An allow rule that opens connections (stateful).
const OPENS: u8 = 2;
/// An allow rule with a rate limit.
const LIMITED: u8 = 4;

/// A compiled rule: what the packet path and the counters need of a
/// [`SwitchRule`], cheap to copy into the next snapshot.
#[derive(Debug, Clone)]
struct Slot {
    id: Arc<str>,
    /// `tag` is the slot's index.
    matches: AclRule,
    allow: bool,
    stateful: bool,
    rate_limit: Option<RateLimit>,
}

impl Slot {
    fn new(r: &SwitchRule, tag: u32) -> Slot {
        Slot {
            id: r.id.as_str().into(),
            matches: AclRule { tag, ..r.matches },
            allow: r.allow,
            stateful: r.stateful,
            rate_limit: r.rate_limit,
        }
    }

    /// The same rule as `r`, whatever the tags: a patch may keep it.
    fn same(&self, r: &SwitchRule) -> bool {
        AclRule {
            tag: 0,
            ..self.matches
        } == AclRule {
            tag: 0,
            ..r.matches
        } && self.allow == r.allow
            && self.stateful == r.stateful
            && self.rate_limit == r.rate_limit
            && *self.id == *r.id
    }
}

/// Most rules an incremental change may remove and add together; more,
/// and the tenant's classifier is built from scratch.
const PATCH_MAX: usize = crate::classify::OVERLAY_MAX;

/// A tenant's compiled rules.
struct Rules {
    /// See [`CompiledTenant::slots`].
    slots: Arc<Vec<Option<Slot>>>,
    /// See [`CompiledTenant::order`].
    order: Arc<Vec<u32>>,
    classifier: Classifier,
}

/// A tenant's rule slots and classifier: `rules` in tags that are their
/// index, classified from scratch.
fn build_rules(rules: &[SwitchRule]) -> Rules {
    let slots: Vec<Option<Slot>> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| Some(Slot::new(r, i as u32)))
        .collect();
    let acl: Vec<AclRule> = slots.iter().flatten().map(|r| r.matches).collect();
    Rules {
        classifier: Classifier::build(&acl),
        slots: Arc::new(slots),
        order: Arc::new((0..rules.len() as u32).collect()),
    }
}

/// `prev`'s rule slots and classifier changed into `rules` without a
/// full build: the rules both lists share at their head and tail keep
/// their tags, those between are removed from and added to the
/// classifier ([`Classifier::with_changes`]), and added rules take new
/// tags; with it, whether anything changed. `None` when that would not
/// pay or not work (a large change, many dead slots, a rule the
/// classifier cannot remove alone, a duplicate order): the caller builds
/// from scratch, which also reports errors.
fn patch_rules(prev: &CompiledTenant, rules: &[SwitchRule]) -> Option<(Rules, bool)> {
    let old = &prev.order;
    let kept = |i: usize, r: &SwitchRule| {
        prev.slots[old[i] as usize]
            .as_ref()
            .is_some_and(|o| o.same(r))
    };
    let mut head = 0;
    while head < old.len() && head < rules.len() && kept(head, &rules[head]) {
        head += 1;
    }
    let mut tail = 0;
    while tail < old.len() - head
        && tail < rules.len() - head
        && kept(old.len() - 1 - tail, &rules[rules.len() - 1 - tail])
    {
        tail += 1;
    }
    let gone = &old[head..old.len() - tail];
    let new = &rules[head..rules.len() - tail];
    if gone.is_empty() && new.is_empty() {
        let same = Rules {
            slots: prev.slots.clone(),
            order: prev.order.clone(),
            classifier: prev.classifier.clone(),
        };
        return Some((same, false));
    }
    let live = rules.len();
    let dead = prev.slots.len() + new.len() - live;
    if gone.len() + new.len() > PATCH_MAX || dead > live / 4 + PATCH_MAX {
        return None;
    }
    let mut slots = (*prev.slots).clone();
    let remove: Vec<u32> = gone
        .iter()
        .filter_map(|&s| slots[s as usize].take().map(|r| r.matches.order))
        .collect();
    let mut order = Vec::with_capacity(live);
    order.extend_from_slice(&old[..head]);
    let mut add = Vec::with_capacity(new.len());
    for r in new {
        let tag = slots.len() as u32;
        let r = Slot::new(r, tag);
        add.push(r.matches);
        order.push(tag);
        slots.push(Some(r));
    }
    order.extend_from_slice(&old[old.len() - tail..]);
    let classifier = prev.classifier.with_changes(&remove, &add).ok()?;
    let patched = Rules {
        slots: Arc::new(slots),
        order: Arc::new(order),
        classifier,
    };
    Some((patched, true))
}

/// How [`SwitchHandle::publish`] compiled the tenants' rule sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Published {
    /// The generation the configuration was published as.
    pub generation: u64,
    /// Tenants whose classifier was built from scratch (new tenants,
    /// large changes).
    pub built: usize,
    /// Tenants whose classifier was patched ([`Classifier::with_changes`]).
    pub patched: usize,
    /// Tenants whose rules did not change (classifier shared).
    pub unchanged: usize,
}

/// An immutable, compiled switch configuration.
#[derive(Debug)]
pub struct Compiled {
    /// Per port: the tenant owning the whole port, and its attachment index.
    whole: Vec<(u32, u32)>,
    /// Per port: 4096 entries (tenant, attachment) by VLAN ID, or empty
    /// if the port has no VLAN attachment.
    vlans: Vec<Vec<(u32, u32)>>,
    /// Per port: its VTEP.
    vteps: Vec<Option<Vtep>>,
    /// (tenant, attachment) by (port, VNI).
    vxlan: hashbrown::HashMap<(u32, u32), (u32, u32)>,
    tenants: Vec<CompiledTenant>,
    mac_table_size: usize,
    mac_ageing: Duration,
    /// Per worker: connection table size and per-tenant limit.
    conntrack: (usize, usize),
    conntrack_timeouts: Timeouts,
    flow_cache_entries: usize,
    /// Tenant IDs in use (below `uids`) that track connections.
    tracking: Vec<bool>,
    /// Whether any tenant switches IP unparsed ([`CompiledTenant`]'s
    /// `opaque_ip`): whether workers remember decisions by link-layer
    /// header ([`L2Memo`]).
    l2_memo: bool,
    shards: Box<[Shard]>,
    /// How the tenants were compiled.
    stats: Published,
}

/// Tenant IDs by name: stable for the life of a [`SwitchHandle`].
type TenantIds = std::collections::HashMap<String, u32>;

impl Compiled {
    /// This snapshot's counters, summed over its shards. The `current`
    /// snapshot's include the connection gauges and every rule; a retired
    /// one's only the rules that counted something, since carrying the
    /// others over would add nothing but a publish's worth of work for
    /// every idle rule of a large set.
    fn traffic(&self, current: bool) -> Traffic {
        let mut out = Traffic::default();
        for (ti, t) in self.tenants.iter().enumerate() {
            let mut sum = TenantTraffic::default();
            for sh in self.shards.iter() {
                let c = &sh.tenants[ti];
                sum.rx_packets += c.rx_packets.load(Ordering::Relaxed);
                sum.rx_bytes += c.rx_bytes.load(Ordering::Relaxed);
                sum.forwarded_packets += c.forwarded.load(Ordering::Relaxed);
                sum.dropped_packets += c.dropped.load(Ordering::Relaxed);
                if current {
                    sum.conntrack_entries += c.conntrack.load(Ordering::Relaxed);
                }
            }
            out.add_tenant(&t.name, sum);
            for (ri, id) in t
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, r)| Some((i, &r.as_ref()?.id)))
            {
                let mut r = RuleTraffic::default();
                for sh in self.shards.iter() {
                    let c = &sh.rules[ti][ri];
                    r.packets += c.packets.load(Ordering::Relaxed);
                    r.bytes += c.bytes.load(Ordering::Relaxed);
                    r.last_hit = r.last_hit.max(c.last_hit.load(Ordering::Relaxed));
                }
                if current || r != RuleTraffic::default() {
                    out.add_rule(&t.name, id, r);
                }
            }
        }
        out
    }

    /// Checks and compiles `config` (classifiers included).
    ///
    /// # Errors
    /// [`ConfigError`] naming the first problem.
    pub fn new(config: &SwitchConfig) -> Result<Compiled, ConfigError> {
        Compiled::compile(config, &mut TenantIds::new(), None)
    }

    /// Compiles `config`; tenants of `prev` (the configuration it
    /// replaces) whose rules changed little get their classifier patched
    /// instead of built.
    fn compile(
        config: &SwitchConfig,
        ids: &mut TenantIds,
        prev: Option<&Compiled>,
    ) -> Result<Compiled, ConfigError> {
        let workers = config.workers.max(1);
        let prev_tenants: std::collections::HashMap<&str, &CompiledTenant> = prev
            .map(|p| p.tenants.iter().map(|t| (t.name.as_str(), t)).collect())
            .unwrap_or_default();
        let mut c = Compiled {
            whole: vec![(NONE, NONE); config.ports],
            vlans: vec![Vec::new(); config.ports],
            vteps: (0..config.ports)
                .map(|p| config.vteps.get(p).copied().flatten())
                .collect(),
            vxlan: hashbrown::HashMap::new(),
            tenants: Vec::with_capacity(config.tenants.len()),
            mac_table_size: config.mac_table_size,
            mac_ageing: config.mac_ageing,
            conntrack: (
                config.conntrack_max.div_ceil(workers),
                config.conntrack_per_tenant.div_ceil(workers),
            ),
            conntrack_timeouts: config.conntrack_timeouts,
            flow_cache_entries: config.flow_cache_entries,
            tracking: Vec::new(),
            l2_memo: false,
            shards: Box::default(),
            stats: Published::default(),
        };
        for (ti, t) in config.tenants.iter().enumerate() {
            for (ai, a) in t.attachments.iter().enumerate() {
                let err_overlap = |other: u32| ConfigError::Overlap {
                    tenant: t.name.clone(),
                    port: a.port,
                    vlan: a.vlan,
                    other: config.tenants[other as usize].name.clone(),
                };
                if a.port >= config.ports {
                    return Err(ConfigError::NoSuchPort {
                        tenant: t.name.clone(),
                        port: a.port,
                    });
                }
                if a.vlan > 4094 {
                    return Err(ConfigError::BadVlan {
                        tenant: t.name.clone(),
                        vlan: a.vlan,
                    });
                }
                if a.vni != 0 {
                    if a.vni > 0x00ff_ffff || a.vlan != 0 {
                        return Err(ConfigError::BadVni {
                            tenant: t.name.clone(),
                            vni: a.vni,
                            vlan: a.vlan,
                        });
                    }
                    if c.vteps[a.port].is_none() {
                        return Err(ConfigError::NoVtep {
                            tenant: t.name.clone(),
                            port: a.port,
                            vni: a.vni,
                        });
                    }
                    let key = (a.port as u32, a.vni);
                    if let Some(&(other, _)) = c.vxlan.get(&key) {
                        return Err(ConfigError::VniOverlap {
                            tenant: t.name.clone(),
                            port: a.port,
                            vni: a.vni,
                            other: config.tenants[other as usize].name.clone(),
                        });
                    }
                    c.vxlan.insert(key, (ti as u32, ai as u32));
                    continue;
                }
                let whole = c.whole[a.port].0;
                if whole != NONE {
                    return Err(err_overlap(whole));
                }
                let vl = &mut c.vlans[a.port];
                if a.vlan == 0 {
                    if let Some(&(other, _)) = vl.iter().find(|(t, _)| *t != NONE) {
                        return Err(err_overlap(other));
                    }
                    c.whole[a.port] = (ti as u32, ai as u32);
                } else {
                    if vl.is_empty() {
                        vl.resize(4096, (NONE, NONE));
                    }
                    let other = vl[usize::from(a.vlan)].0;
                    if other != NONE {
                        return Err(err_overlap(other));
                    }
                    vl[usize::from(a.vlan)] = (ti as u32, ai as u32);
                }
            }
            let patched = prev_tenants
                .get(t.name.as_str())
                .and_then(|p| patch_rules(p, &t.rules));
            let Rules {
                slots,
                order,
                classifier,
            } = match patched {
                Some((p, changed)) => {
                    if changed {
                        c.stats.patched += 1;
                    } else {
                        c.stats.unchanged += 1;
                    }
                    p
                }
                None => {
                    c.stats.built += 1;
                    let mut orders: Vec<u32> = t.rules.iter().map(|r| r.matches.order).collect();
                    orders.sort_unstable();
                    if let Some(w) = orders.windows(2).find(|w| w[0] == w[1]) {
                        return Err(ConfigError::DuplicateOrder {
                            tenant: t.name.clone(),
                            order: w[0],
                        });
                    }
                    build_rules(&t.rules)
                }
            };
            let next = ids.len() as u32;
            let uid = *ids.entry(t.name.clone()).or_insert(next);
            let actions: Vec<u8> = slots
                .iter()
                .map(|r| match r {
                    Some(r) if r.allow => {
                        ALLOWS
                            | if r.stateful { OPENS } else { 0 }
                            | if r.rate_limit.is_some() { LIMITED } else { 0 }
                    }
                    _ => 0,
                })
                .collect();
            let tracks = actions.iter().any(|a| a & OPENS != 0);
            if c.tracking.len() <= uid as usize {
                c.tracking.resize(uid as usize + 1, false);
            }
            c.tracking[uid as usize] = tracks;
            let guards: Vec<Option<Guard>> = (0..t.attachments.len())
                .map(|i| t.guards.get(i).filter(|g| !g.is_open()).cloned())
                .collect();
            let opaque_ip = order.is_empty()
                && t.default_allow
                && guards
                    .iter()
                    .flatten()
                    .all(|g| g.v4.is_empty() && g.v6.is_empty());
            c.tenants.push(CompiledTenant {
                limits: slots
                    .iter()
                    .map(|r| {
                        r.as_ref()
                            .filter(|r| r.allow)
                            .and_then(|r| r.rate_limit)
                            .map(|l| Bucket::share(&l, workers))
                    })
                    .collect(),
                name: t.name.clone(),
                guards,
                opaque_ip,
                uid,
                tracks,
                cached: config.flow_cache_entries > 0 && t.rules.len() >= FLOW_CACHE_MIN_RULES,
                actions,
                slots,
                order,
                attachments: t.attachments.clone(),
                remotes: (0..t.attachments.len())
                    .map(|i| match t.attachments[i].vni {
                        0 => Vec::new(),
                        _ => t.remote_vteps.get(i).cloned().unwrap_or_default(),
                    })
                    .collect(),
                default_allow: t.default_allow,
                classifier,
            });
        }
        c.l2_memo = c.tenants.iter().any(|t| t.opaque_ip);
        c.shards = (0..workers)
            .map(|_| Shard {
                tenants: c.tenants.iter().map(|_| TenantCells::default()).collect(),
                rules: c
                    .tenants
                    .iter()
                    .map(|t| t.slots.iter().map(|_| RuleCells::default()).collect())
                    .collect(),
            })
            .collect();
        Ok(c)
    }

    /// The tenant and attachment a frame on `port` with outer VLAN `vlan`
    /// belongs to.
    #[inline]
    fn tenant_of(&self, port: usize, vlan: Option<u16>) -> Option<(usize, usize)> {
        if let Some(v) = vlan {
            if let Some(&(t, a)) = self
                .vlans
                .get(port)
                .and_then(|vl| vl.get(usize::from(v & 0x0fff)))
            {
                if t != NONE {
                    return Some((t as usize, a as usize));
                }
            }
        }
        match self.whole.get(port) {
            Some(&(t, a)) if t != NONE => Some((t as usize, a as usize)),
            _ => None,
        }
    }
}

struct Shared {
    generation: AtomicU64,
    /// Tenant IDs by name, kept across configurations.
    ids: Mutex<TenantIds>,
    current: Mutex<Arc<Compiled>>,
    /// Replaced snapshots and the counts of those no worker holds any more.
    history: Mutex<History>,
    /// What each pipeline publishes of itself, and what dropped ones
    /// left behind.
    pipelines: Mutex<Pipelines>,
}

/// The pipelines a handle made.
#[derive(Default)]
struct Pipelines {
    live: Vec<Weak<PipelineCells>>,
    /// The flow-cache counts of dropped pipelines.
    gone: FlowCacheStats,
}

/// What a pipeline publishes of itself.
#[derive(Default)]
struct PipelineCells {
    /// The generation it has taken, for [`SwitchHandle::taken`].
    taken: AtomicU64,
    /// Its flow cache's counts, stored once a second.
    cache_lookups: AtomicU64,
    cache_hits: AtomicU64,
    cache_rests: AtomicU64,
}

impl PipelineCells {
    fn cache(&self) -> FlowCacheStats {
        FlowCacheStats {
            lookups: self.cache_lookups.load(Ordering::Relaxed),
            hits: self.cache_hits.load(Ordering::Relaxed),
            rests: self.cache_rests.load(Ordering::Relaxed),
        }
    }

    fn store_cache(&self, s: FlowCacheStats) {
        self.cache_lookups.store(s.lookups, Ordering::Relaxed);
        self.cache_hits.store(s.hits, Ordering::Relaxed);
        self.cache_rests.store(s.rests, Ordering::Relaxed);
    }
}

/// Counters of snapshots that are no longer current.
#[derive(Default)]
struct History {
    /// Replaced snapshots some worker may still be counting into.
    retired: Vec<Arc<Compiled>>,
    /// The totals of retired snapshots every worker has let go of.
    carried: Traffic,
}

impl History {
    /// A retired snapshot only the history holds gets no more counts:
    /// folds its totals into the carried ones and lets it go.
    fn fold_released(&mut self) {
        let mut i = 0;
        while i < self.retired.len() {
            if Arc::strong_count(&self.retired[i]) == 1 {
                let done = self.retired.swap_remove(i).traffic(false);
                self.carried.merge(&done);
            } else {
                i += 1;
            }
        }
    }
}

/// Publishes switch configurations to the workers' pipelines.
#[derive(Clone)]
pub struct SwitchHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SwitchHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwitchHandle")
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl SwitchHandle {
    /// A handle publishing `config` first.
    ///
    /// # Errors
    /// [`ConfigError`] if `config` does not compile.
    pub fn new(config: &SwitchConfig) -> Result<SwitchHandle, ConfigError> {
        let mut ids = TenantIds::new();
        let first = Compiled::compile(config, &mut ids, None)?;
        Ok(SwitchHandle {
            shared: Arc::new(Shared {
                generation: AtomicU64::new(1),
                ids: Mutex::new(ids),
                current: Mutex::new(Arc::new(first)),
                history: Mutex::new(History::default()),
                pipelines: Mutex::new(Pipelines::default()),
            }),
        })
    }

    /// Compiles `config` on the calling thread and publishes it; workers
    /// switch to it at their next turn. On error nothing changes.
    ///
    /// A tenant whose rules differ from the current configuration's by a
    /// few removed, added or edited rules (at most [`OVERLAY_MAX`] in
    /// all) keeps its classifier with those changes applied
    /// ([`Classifier::with_changes`]), so a single-rule change costs
    /// microseconds, not a build; a tenant whose rules are the same
    /// shares its classifier.
    ///
    /// [`OVERLAY_MAX`]: crate::classify::OVERLAY_MAX
    ///
    /// # Errors
    /// [`ConfigError`] if `config` does not compile.
    pub fn publish(&self, config: &SwitchConfig) -> Result<Published, ConfigError> {
        let compiled = {
            let mut ids = self.shared.ids.lock().unwrap_or_else(|e| e.into_inner());
            // Publishers take turns here, so the snapshot patched is the
            // current one.
            let (_, prev) = self.load();
            // On error the new names stay known: harmless, IDs are only keys.
            Arc::new(Compiled::compile(config, &mut ids, Some(&prev))?)
        };
        let mut cur = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut stats = compiled.stats;
        let old = std::mem::replace(&mut *cur, compiled);
        stats.generation = self.shared.generation.fetch_add(1, Ordering::Release) + 1;
        drop(cur);
        let mut h = self
            .shared
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Whether or not anybody reads counters, a replaced snapshot (and
        // its classifiers) is let go once every worker has.
        h.fold_released();
        h.retired.push(old);
        Ok(stats)
    }

    /// Tenant and rule counters: the current snapshot's, plus those of
    /// replaced snapshots for the tenants and rules the current
    /// configuration still has (by name and rule ID). Counts of a deleted
    /// rule or tenant are forgotten once no worker uses its last snapshot.
    pub fn traffic(&self) -> Traffic {
        let (_, current) = self.load();
        let mut h = self
            .shared
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        h.fold_released();
        // Sets, not scans: a tenant may have 65,536 rules.
        let tenants: std::collections::HashSet<&str> =
            current.tenants.iter().map(|c| c.name.as_str()).collect();
        let rules: std::collections::HashSet<(&str, &str)> = current
            .tenants
            .iter()
            .flat_map(|c| c.slots.iter().flatten().map(|r| (c.name.as_str(), &*r.id)))
            .collect();
        let live = |t: &str| tenants.contains(t);
        let live_rule = |t: &str, r: &str| rules.contains(&(t, r));
        h.carried.tenants.retain(|t, _| live(t));
        h.carried.rules.retain(|(t, r), _| live_rule(t, r));
        let mut out = h.carried.clone();
        for r in &h.retired {
            out.merge(&r.traffic(false));
        }
        drop(h);
        out.merge(&current.traffic(true));
        out.tenants.retain(|t, _| live(t));
        out.rules.retain(|(t, r), _| live_rule(t, r));
        out
    }

    /// How many configurations have been published.
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    /// True once every pipeline still alive has taken configuration
    /// `generation` (or a later one) at a turn; true without pipelines.
    pub fn taken(&self, generation: u64) -> bool {
        self.live_pipelines().live.iter().all(|p| {
            p.upgrade()
                .is_none_or(|c| c.taken.load(Ordering::Acquire) >= generation)
        })
    }

    /// The flow caches' counts, summed over the pipelines, as each last
    /// stored them (once a second), dropped ones included.
    pub fn flow_cache(&self) -> FlowCacheStats {
        let p = self.live_pipelines();
        let mut sum = p.gone;
        for c in p.live.iter().filter_map(Weak::upgrade) {
            sum.add(c.cache());
        }
        sum
    }

    /// Waits until [`SwitchHandle::taken`] holds for `generation`,
    /// polling, for at most `limit`; answers whether it does.
    pub fn wait_taken(&self, generation: u64, limit: Duration) -> bool {
        let start = Instant::now();
        let mut nap = Duration::from_micros(10);
        while !self.taken(generation) {
            if start.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(1));
        }
        true
    }

    /// The pipelines, dropped ones forgotten.
    fn live_pipelines(&self) -> std::sync::MutexGuard<'_, Pipelines> {
        let mut all = self
            .shared
            .pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        all.live.retain(|p| p.strong_count() > 0);
        all
    }

    /// A pipeline for worker 0.
    pub fn pipeline(&self) -> SwitchPipeline {
        self.pipeline_for(0)
    }

    /// A pipeline for worker `worker`, counting into that worker's shard
    /// (workers beyond [`SwitchConfig::workers`] share shards, and may
    /// then undercount).
    pub fn pipeline_for(&self, worker: usize) -> SwitchPipeline {
        let (generation, compiled) = self.load();
        let macs = MacTable::new(compiled.mac_table_size);
        let (max, per_tenant) = compiled.conntrack;
        let mut conns = ConnTable::new(max, per_tenant, compiled.conntrack_timeouts);
        conns.reserve_tenants(compiled.tracking.len());
        let cells = Arc::new(PipelineCells {
            taken: AtomicU64::new(generation),
            ..PipelineCells::default()
        });
        self.live_pipelines().live.push(Arc::downgrade(&cells));
        SwitchPipeline {
            conns,
            cache: FlowCache::new(compiled.flow_cache_entries),
            shared: self.shared.clone(),
            generation,
            shard: worker % compiled.shards.len().max(1),
            compiled,
            worker,
            cells,
            unix_now: 0,
            macs,
            memo: L2Memo::new(),
            neighbours: hashbrown::HashMap::with_capacity(NEIGHBOURS_MAX),
            now: 0,
            now_us: 0,
            epoch: Instant::now(),
            last_sweep: 0,
            stage: Vec::with_capacity(BURST),
            conn_keys: [None; BURST],
        }
    }

    fn load(&self) -> (u64, Arc<Compiled>) {
        let cur = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Read under the lock: the generation matches the snapshot.
        (self.shared.generation.load(Ordering::Acquire), cur.clone())
    }
}

/// Most remote VTEPs (and next hops) a worker knows the MAC address of.
const NEIGHBOURS_MAX: usize = 4096;

/// The switch pipeline of one worker: its snapshot, its MAC table, its
/// connection table.
pub struct SwitchPipeline {
    conns: ConnTable,
    cache: FlowCache,
    shared: Arc<Shared>,
    generation: u64,
    /// What the handle sees of this pipeline: `generation` (stored when
    /// it changes), the flow cache's counts (once a second).
    cells: Arc<PipelineCells>,
    compiled: Arc<Compiled>,
    /// This worker's index.
    worker: usize,
    /// Its counter shard in `compiled.shards` (the worker's index modulo
    /// their number, worked out once per snapshot: a division per packet
    /// costs more than the rest of the counting).
    shard: usize,
    /// Unix seconds, read once per turn (rule last-hit times).
    unix_now: u64,
    macs: MacTable,
    /// Decisions by link-layer header, for tenants that switch unparsed.
    memo: L2Memo,
    /// MAC addresses of remote VTEPs by (port, IPv4 address), and when
    /// they were last seen: learned from their ARP and VXLAN frames.
    neighbours: hashbrown::HashMap<(u32, u32), ([u8; 6], u64)>,
    /// Coarse clock, read once per turn.
    now: u64,
    /// The same clock in microseconds (rate limits).
    now_us: u64,
    epoch: Instant,
    last_sweep: u64,
    /// The frames of a burst between its stages (kept for its memory).
    stage: Vec<Inspected>,
    /// Their connection keys, when a tenant tracks connections: made
    /// (and hashed) once a frame.
    conn_keys: [Option<ConnKey>; BURST],
}

impl Drop for SwitchPipeline {
    /// Leaves the flow cache's counts to the handle. Under the handle's
    /// lock, so that a reader sees them either here or there.
    fn drop(&mut self) {
        let mut p = self
            .shared
            .pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        p.gone.add(self.cache.stats());
        self.cells.store_cache(FlowCacheStats::default());
    }
}

impl std::fmt::Debug for SwitchPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwitchPipeline")
            .field("generation", &self.generation)
            .field("learned", &self.macs.len())
            .field("connections", &self.conns.len())
            .finish_non_exhaustive()
    }
}

/// The tag operation that turns a frame of attachment `from` into one of `to`.
fn vlan_op(from: Attach, to: Attach) -> VlanOp {
    match (from.vlan, to.vlan) {
        (a, b) if a == b => VlanOp::Keep,
        (_, 0) => VlanOp::Strip,
        (0, b) => VlanOp::Push(b),
        (_, b) => VlanOp::Set(b),
    }
}

/// The way out to attachment `to` (not VXLAN) for a frame of attachment
/// `from` with `decap` bytes of outer headers.
fn plain_egress(from: Attach, to: Attach, decap: u16) -> Egress {
    Egress {
        port: to.port,
        vlan: vlan_op(from, to),
        decap,
        tunnel: None,
    }
}

/// Connection slots a worker looks at per turn for expired connections.
const SWEEP_SLOTS: usize = 32;

/// Tenants with at least this many rules have their classifications
/// cached. Below it the classifier's trees are shallow enough that a
/// cache hit saves little, while a miss still costs its hash, set and
/// insert. 65,536 flows through one tenant (`benches/switch.rs`, 262,144
/// entries): 1 rule 55.3 ns/packet without, 54.8 with; 64 rules 63.4
/// against 55.0; 1,000 rules 67.2 against 55.2. With four times more
/// flows than entries a miss costs 9-12 ns more than no cache.
pub const FLOW_CACHE_MIN_RULES: usize = 64;

/// The tag of the first rule of tenant `t` matching `key`, through the
/// worker's flow cache if the tenant uses it and the cache is not resting.
#[inline]
fn classify(
    t: &CompiledTenant,
    cache: &mut FlowCache,
    key: &FlowKey,
    generation: u64,
) -> Option<u32> {
    // Hashed once, for the lookup and the fill; IPv6 keys have no set.
    let set = if t.cached {
        cache.set(t.uid, key)
    } else {
        None
    };
    let Some(set) = set.filter(|_| cache.admit(1)) else {
        return t.classifier.lookup(key).map(|r| r.tag);
    };
    let found = cache.get_in(set, t.uid, key, generation);
    cache.tally(1, usize::from(found.is_some()));
    if let Some(hit) = found {
        return hit;
    }
    let tag = t.classifier.lookup(key).map(|r| r.tag);
    cache.put_in(set, t.uid, key, generation, tag);
    tag
}

/// The worker's clocks, read once per turn, and its configuration
/// generation.
#[derive(Debug, Clone, Copy)]
struct Clock {
    secs: u64,
    micros: u64,
    generation: u64,
}

/// What the filter looks at in an IP packet.
#[derive(Debug, Clone, Copy)]
struct IpPacket<'k> {
    /// Its classification key.
    key: &'k FlowKey,
    /// The tag of the first rule matching `key`, if it was looked up
    /// ahead (`Some(None)`: no rule matches).
    tag: Option<Option<u32>>,
    /// Its connection key, if the tenant tracks connections and the
    /// packet can be tracked.
    conn: Option<ConnKey>,
    tcp_flags: u8,
    len: u64,
}

/// The filter's decision on IP packet `p` of tenant `t` at `clock`: the
/// tag of the rule that matched, if one was looked up and matched, and
/// whether the packet passes. A matching rule's rate limit is taken from
/// `rules` (the worker's cells of the tenant's rules).
fn filter_ip(
    t: &CompiledTenant,
    rules: &[RuleCells],
    conns: &mut ConnTable,
    cache: &mut FlowCache,
    clock: Clock,
    p: IpPacket<'_>,
) -> (Option<u32>, Result<(), DropReason>) {
    let Clock {
        secs: now,
        generation,
        ..
    } = clock;
    let IpPacket {
        key,
        conn,
        tcp_flags,
        len,
        ..
    } = p;
    let opens = |tag: u32| t.actions[tag as usize] & OPENS != 0;
    if let Some(ck) = conn {
        if let Some((slot, dir)) = conns.find(&ck, now) {
            let current = conns.checked_at(slot, generation)
                || classify(t, cache, &conns.orig(slot), generation).is_some_and(opens);
            if current {
                conns.set_generation(slot, generation);
                let fits = conns.track(slot, dir, tcp_flags, now);
                return (None, fits.then_some(()).ok_or(DropReason::ConntrackInvalid));
            }
            // The rules that let it open no longer do.
            conns.remove(slot);
        }
    }
    let found = match p.tag {
        Some(found) => found,
        None => classify(t, cache, key, generation),
    };
    let Some(tag) = found else {
        return (
            None,
            t.default_allow.then_some(()).ok_or(DropReason::AclDeny),
        );
    };
    let actions = t.actions[tag as usize];
    if actions & ALLOWS == 0 {
        return (Some(tag), Err(DropReason::AclDeny));
    }
    if actions & LIMITED != 0 {
        if let Some(b) = &t.limits[tag as usize] {
            if !b.take(&rules[tag as usize], clock.micros, len) {
                return (Some(tag), Err(DropReason::RateLimited));
            }
        }
    }
    let passed = match conn {
        Some(ck) if opens(tag) => match conns.open(ck, *key, tcp_flags, now, generation) {
            Ok(_) => Ok(()),
            Err(Refused::Invalid) => Err(DropReason::ConntrackInvalid),
            Err(Refused::TenantFull | Refused::TableFull) => Err(DropReason::TableFull),
        },
        _ => Ok(()),
    };
    (Some(tag), passed)
}

impl SwitchPipeline {
    /// Stores this worker's connection counts in its shard's gauges.
    fn store_gauges(&self) {
        let shard = &self.compiled.shards[self.shard];
        for (t, cells) in self.compiled.tenants.iter().zip(shard.tenants.iter()) {
            let n = u64::from(self.conns.tenant_len(t.uid));
            if cells.conntrack.load(Ordering::Relaxed) != n {
                cells.conntrack.store(n, Ordering::Relaxed);
            }
        }
    }

    #[inline(always)]
    fn learn(&mut self, tenant: usize, mac: [u8; 6], attachment: usize, vtep: u32) {
        self.macs
            .learn(tenant as u32, mac, attachment as u32, vtep, self.now);
    }

    /// Remembers that `ip` is at `mac` behind `port`.
    fn neighbour(&mut self, port: usize, ip: u32, mac: [u8; 6]) {
        if ip == 0 || is_multicast(&mac) {
            return;
        }
        let key = (port as u32, ip);
        if let Some(e) = self.neighbours.get_mut(&key) {
            *e = (mac, self.now);
        } else if self.neighbours.len() < NEIGHBOURS_MAX {
            self.neighbours.insert(key, (mac, self.now));
        }
    }

    /// The way out to attachment `to` of tenant `t` for a frame of
    /// attachment `from` with `decap` bytes of outer headers: for a VXLAN
    /// attachment, through the tunnel to `vtep` (a learned destination)
    /// or, with `vtep` 0, to each of the attachment's remote VTEPs.
    #[allow(clippy::too_many_arguments)]
    fn egress(
        &self,
        t: &CompiledTenant,
        from: Attach,
        to_index: usize,
        decap: u16,
        vtep: u32,
        out: &mut Vec<Egress>,
    ) {
        let to = t.attachments[to_index];
        let e = plain_egress(from, to, decap);
        if to.vni == 0 {
            out.push(e);
            return;
        }
        let Some(local) = self.compiled.vteps.get(to.port).copied().flatten() else {
            return;
        };
        let remotes = if vtep != 0 {
            std::slice::from_ref(&vtep)
        } else {
            &t.remotes[to_index][..]
        };
        for &ip in remotes {
            let known = self
                .neighbours
                .get(&(to.port as u32, ip))
                .filter(|(_, seen)| {
                    self.now.saturating_sub(*seen) < self.compiled.mac_ageing.as_secs()
                });
            out.push(Egress {
                tunnel: Some(Tunnel {
                    src_mac: local.mac,
                    dst_mac: known.map_or([0xff; 6], |(m, _)| *m),
                    src_ip: local.ip,
                    dst_ip: ip,
                    vni: to.vni,
                    resolve: known.is_none(),
                }),
                ..e
            });
        }
    }

    /// The first stage of a frame received on `port`: what it is and
    /// where it belongs, without touching the worker's state (the
    /// neighbour a frame to the port's VTEP reveals is returned to learn
    /// later). The VTEP answers ARP for its address in place.
    fn inspect(&self, port: usize, packet: &mut [u8]) -> Inspected {
        let done = |v, neighbour| Inspected {
            seen: Seen::Done(v),
            neighbour,
        };
        let mut vxlan = None;
        let mut neighbour = None;
        if let Some(v) = self.compiled.vteps.get(port).copied().flatten() {
            match vtep_frame(packet, v.ip) {
                VtepFrame::Other => {}
                VtepFrame::Invalid => return done(Verdict::Drop(DropReason::NoTenant), None),
                VtepFrame::ArpReply {
                    sender_mac,
                    sender_ip,
                } => {
                    // Consumed: an empty flood sends nothing and counts nothing.
                    return done(Verdict::Flood, Some((sender_ip, sender_mac)));
                }
                VtepFrame::ArpRequest {
                    sender_mac,
                    sender_ip,
                } => {
                    // The request becomes the reply, back where it came from.
                    let a = &mut packet[ETH_HLEN..];
                    a[6..8].copy_from_slice(&2u16.to_be_bytes());
                    a[18..24].copy_from_slice(&sender_mac);
                    a[24..28].copy_from_slice(&sender_ip.to_be_bytes());
                    a[8..14].copy_from_slice(&v.mac);
                    a[14..18].copy_from_slice(&v.ip.to_be_bytes());
                    packet[0..6].copy_from_slice(&sender_mac);
                    packet[6..12].copy_from_slice(&v.mac);
                    return done(
                        Verdict::Forward(Egress::to(port)),
                        Some((sender_ip, sender_mac)),
                    );
                }
                VtepFrame::Vxlan {
                    inner,
                    vni,
                    src_ip,
                    src_mac,
                } => {
                    neighbour = Some((src_ip, src_mac));
                    match self.compiled.vxlan.get(&(port as u32, vni)) {
                        Some(&(t, a)) => vxlan = Some((inner, t as usize, a as usize, src_ip)),
                        None => return done(Verdict::Drop(DropReason::NoTenant), neighbour),
                    }
                }
            }
        }
        let (decap, remote) = vxlan.map_or((0, 0), |(off, _, _, ip)| (off, ip));
        let frame = &packet[decap..];
        let Ok(mut h) = parse_l2(frame) else {
            return done(Verdict::Drop(DropReason::Malformed), neighbour);
        };
        let found = match vxlan {
            Some((_, t, a, _)) => Some((t, a)),
            None => self.compiled.tenant_of(port, h.vlan),
        };
        if let L3::Other(ethertype) = h.l3 {
            // The network layer, unless the frame's tenant would not look
            // at it: an IP frame of a tenant switched at L2.
            let opaque = matches!(ethertype, ETH_IPV4 | ETH_IPV6)
                && found.is_some_and(|(ti, _)| self.compiled.tenants[ti].opaque_ip);
            if !opaque {
                match network_layer(ethertype, &frame[h.l3_offset..]) {
                    Ok(l3) => h.l3 = l3,
                    Err(_) => return done(Verdict::Drop(DropReason::Malformed), neighbour),
                }
            }
        }
        let Some((ti, ai)) = found else {
            return done(Verdict::Drop(DropReason::NoTenant), neighbour);
        };
        if is_multicast(&h.src_mac) {
            return done(Verdict::Drop(DropReason::Malformed), neighbour);
        }
        Inspected {
            seen: Seen::Switch {
                ti: ti as u32,
                ai: ai as u32,
                decap: decap as u16,
                remote,
                len: (packet.len() - decap) as u32,
                src_mac: h.src_mac,
                dst_mac: h.dst_mac,
                l3: h.l3,
            },
            neighbour,
        }
    }

    /// The key of the connection frame `x` would be looked up under, if
    /// its tenant tracks connections.
    fn conn_key(&self, x: &Inspected) -> Option<ConnKey> {
        let Seen::Switch {
            ti,
            l3:
                L3::Ip {
                    ref key,
                    later_fragment: false,
                    echo_id,
                    ..
                },
            ..
        } = x.seen
        else {
            return None;
        };
        let t = self.compiled.tenants.get(ti as usize)?;
        if !t.tracks {
            return None;
        }
        ConnKey::of(t.uid, key, echo_id)
    }

    /// The decision remembered for `frame`, received on `port`, by its
    /// link-layer header, counted as [`SwitchPipeline::decide`] counts
    /// it: what `decide` would make of it now.
    #[inline(always)]
    fn recall(&self, port: usize, frame: &[u8]) -> Option<Verdict> {
        let d = self.remembered(port, frame)?;
        Some(self.forward_recalled(d, frame.len() as u64))
    }

    /// The decision remembered for `frame`'s header on `port` that holds
    /// with the MAC table as it is now.
    #[inline(always)]
    fn remembered(&self, port: usize, frame: &[u8]) -> Option<Decision> {
        let h = Header::of(port, frame)?;
        self.memo.recall(&h, self.macs.version(), self.now)
    }

    /// Counts a frame of `len` bytes forwarded as remembered decision `d`
    /// says, and says so.
    #[inline(always)]
    fn forward_recalled(&self, d: Decision, len: u64) -> Verdict {
        let cells = &self.compiled.shards[self.shard].tenants[d.tenant as usize];
        bump(&cells.rx_packets, 1);
        bump(&cells.rx_bytes, len);
        bump(&cells.forwarded, 1);
        Verdict::Forward(Egress {
            port: d.port as usize,
            vlan: d.vlan,
            decap: 0,
            tunnel: None,
        })
    }

    /// [`SwitchPipeline::inspect`], unless the frame's decision is
    /// remembered by its header: then [`Seen::Recalled`], to be checked
    /// still fresh at the frame's turn ([`SwitchPipeline::settle`]).
    #[inline]
    fn inspect_or_recall(&self, port: usize, packet: &mut [u8]) -> Inspected {
        if self.compiled.l2_memo {
            if let Some(decision) = self.remembered(port, packet) {
                return Inspected {
                    seen: Seen::Recalled {
                        decision,
                        version: self.macs.version(),
                        len: packet.len() as u32,
                    },
                    neighbour: None,
                };
            }
        }
        self.inspect(port, packet)
    }

    /// Decides frame `x` (bytes `packet`, received on `port`) at its turn
    /// in a burst, as [`SwitchPipeline::decide`] with `tag` and `conn`,
    /// and remembers the decision by header where that holds. A frame
    /// recalled from memory earlier in the burst is forwarded as
    /// remembered if the MAC table has not changed since; otherwise it is
    /// inspected and decided now.
    #[inline(always)]
    fn settle(
        &mut self,
        port: usize,
        packet: &mut [u8],
        x: &Inspected,
        tag: Option<Option<u32>>,
        conn: Option<ConnKey>,
        flood: &mut Vec<Egress>,
    ) -> Verdict {
        if let Seen::Recalled {
            decision,
            version,
            len,
        } = x.seen
        {
            if version == self.macs.version() {
                return self.forward_recalled(decision, u64::from(len));
            }
            return self.settle_stale(port, packet, flood);
        }
        if !self.compiled.l2_memo {
            return self.decide(port, x, tag, conn, flood);
        }
        self.decide_remembering(port, packet, x, tag, conn, flood)
    }

    /// [`SwitchPipeline::decide`], then [`SwitchPipeline::remember`].
    #[inline(always)]
    fn decide_remembering(
        &mut self,
        port: usize,
        packet: &[u8],
        x: &Inspected,
        tag: Option<Option<u32>>,
        conn: Option<ConnKey>,
        flood: &mut Vec<Egress>,
    ) -> Verdict {
        let version = self.macs.version();
        let v = self.decide(port, x, tag, conn, flood);
        self.remember(port, packet, x, &v, version);
        v
    }

    /// [`SwitchPipeline::settle`] for a frame recalled from memory whose
    /// MAC table changed before its turn: inspected and decided now. Only
    /// link-layer decisions are remembered, so it needs neither rules
    /// nor a connection.
    #[cold]
    #[inline(never)]
    fn settle_stale(&mut self, port: usize, packet: &mut [u8], flood: &mut Vec<Egress>) -> Verdict {
        let x = self.inspect(port, packet);
        self.decide_remembering(port, packet, &x, None, None, flood)
    }

    /// Remembers verdict `v` on frame `x` (bytes `frame`, received on
    /// `port`) by its link-layer header, if that header alone decided it:
    /// forwarded unparsed past the link layer, not through a tunnel or a
    /// VTEP, and without changing the MAC table (still at `version`), so
    /// that the same header would be decided the same way until the table
    /// or the second changes.
    #[inline]
    fn remember(&mut self, port: usize, frame: &[u8], x: &Inspected, v: &Verdict, version: u64) {
        let (
            Seen::Switch {
                ti,
                decap: 0,
                l3: L3::Other(_),
                ..
            },
            Verdict::Forward(e),
        ) = (&x.seen, v)
        else {
            return;
        };
        if e.tunnel.is_some()
            || self.macs.version() != version
            || self.compiled.vteps.get(port).copied().flatten().is_some()
        {
            return;
        }
        if let Some(h) = Header::of(port, frame) {
            let d = Decision {
                tenant: *ti,
                port: e.port as u32,
                vlan: e.vlan,
            };
            self.memo.remember(h, version, self.now, d);
        }
    }

    /// What frame `x` needs before its turn: its tenant's rules for its
    /// key, unless the tenant has none or the connection table alone will
    /// decide it (a live connection checked against the current rules).
    /// `conn` is the frame's [`SwitchPipeline::conn_key`].
    fn need(&self, x: &Inspected, conn: Option<&ConnKey>) -> Need {
        let Seen::Switch {
            ti,
            l3: L3::Ip { .. },
            ..
        } = x.seen
        else {
            return Need::Ready(None);
        };
        let t = &self.compiled.tenants[ti as usize];
        if t.order.is_empty() {
            // No rules: no rule matches.
            return Need::Ready(Some(None));
        }
        if let Some(ck) = conn {
            if self.conns.is_current(ck, self.now, self.generation) {
                return Need::Ready(None);
            }
        }
        Need::Rules(ti)
    }

    /// Classifies, ahead of the frames' turns, the keys of the frames of
    /// `seen` that their tenants' rules must decide, listed in `todo` as
    /// (frame index, tenant): all of them at once, whatever their
    /// tenant, so that their tree walks overlap. `tags[i]` gets frame
    /// `i`'s answer.
    fn classify_ahead(
        &mut self,
        seen: &[Inspected],
        todo: &[(u8, u32)],
        tags: &mut [Option<Option<u32>>],
    ) {
        let compiled = &*self.compiled;
        let Some(&(_, first)) = todo.first() else {
            return;
        };
        let mut keys = [FlowKey::default(); BURST];
        let mut at = [(0u8, 0u32); BURST];
        let mut classifiers = [&compiled.tenants[first as usize].classifier; BURST];
        let mut found = [None; BURST];
        let mut k = 0;
        // Cached tenants' keys: their sets first, every miss started at
        // once; then the answers.
        let mut sets = [None; BURST];
        let cached = todo
            .iter()
            .any(|&(_, ti)| compiled.tenants[ti as usize].cached);
        // (A resting cache counts the burst's keys off its rest, cached
        // tenants' or not: close enough.)
        if cached && self.cache.admit(todo.len()) {
            for (s, &(i, ti)) in sets.iter_mut().zip(todo) {
                let t = &compiled.tenants[ti as usize];
                if let (
                    true,
                    Seen::Switch {
                        l3: L3::Ip { ref key, .. },
                        ..
                    },
                ) = (t.cached, &seen[usize::from(i)].seen)
                {
                    *s = self.cache.set(t.uid, key);
                    if let Some(s) = *s {
                        self.cache.prefetch(s);
                    }
                }
            }
        }
        let (mut probed, mut hits) = (0, 0);
        for (j, &(i, ti)) in todo.iter().enumerate() {
            let set = sets[j];
            let t = &compiled.tenants[ti as usize];
            let Seen::Switch {
                l3: L3::Ip { key, .. },
                ..
            } = seen[usize::from(i)].seen
            else {
                continue;
            };
            if let Some(set) = set {
                probed += 1;
                if let Some(hit) = self.cache.get_in(set, t.uid, &key, self.generation) {
                    hits += 1;
                    tags[usize::from(i)] = Some(hit);
                    // What the frame's turn reads next (as for the
                    // classifier's answers below).
                    let cells = compiled.shards[self.shard].rules.get(ti as usize);
                    if let (Some(tag), Some(c)) = (hit, cells) {
                        if let (Some(a), Some(c)) =
                            (t.actions.get(tag as usize), c.get(tag as usize))
                        {
                            prefetch(a);
                            prefetch(c);
                        }
                    }
                    continue;
                }
            }
            keys[k] = key;
            at[k] = (i, ti);
            classifiers[k] = &t.classifier;
            sets[k] = set;
            k += 1;
        }
        if probed > 0 {
            self.cache.tally(probed, hits);
        }
        // Every tenant's keys walk their trees together.
        Classifier::lookup_multi(&classifiers[..k], &keys[..k], &mut found[..k]);
        // What the frames' turns read next, by tag: its misses start now,
        // all together.
        let cells = &compiled.shards[self.shard].rules;
        for (&(_, ti), &tag) in at[..k].iter().zip(&found[..k]) {
            let ti = ti as usize;
            if let (Some(tag), Some(t), Some(c)) = (tag, compiled.tenants.get(ti), cells.get(ti)) {
                if let (Some(a), Some(c)) = (t.actions.get(tag as usize), c.get(tag as usize)) {
                    prefetch(a);
                    prefetch(c);
                }
            }
        }
        for (((key, &(i, ti)), &tag), &set) in
            keys[..k].iter().zip(&at[..k]).zip(&found[..k]).zip(&sets)
        {
            if let Some(set) = set {
                let uid = compiled.tenants[ti as usize].uid;
                self.cache.put_in(set, uid, key, self.generation, tag);
            }
            tags[usize::from(i)] = Some(tag);
        }
    }

    /// The second stage of a frame received on `port`, in arrival order:
    /// learns what it reveals and decides its fate, pushing a flood's
    /// outputs onto `flood`. `tag` is its classification if it was
    /// looked up ahead, `conn` its [`SwitchPipeline::conn_key`].
    fn decide(
        &mut self,
        port: usize,
        x: &Inspected,
        tag: Option<Option<u32>>,
        conn: Option<ConnKey>,
        flood: &mut Vec<Egress>,
    ) -> Verdict {
        if let Some((ip, mac)) = x.neighbour {
            self.neighbour(port, ip, mac);
        }
        let (ti, ai, decap, remote, len, src_mac, dst_mac, l3) = match x.seen {
            Seen::Done(v) => return v,
            // Fresh: `settle` decides stale ones itself.
            Seen::Recalled { decision, len, .. } => {
                return self.forward_recalled(decision, u64::from(len))
            }
            Seen::Switch {
                ti,
                ai,
                decap,
                remote,
                len,
                src_mac,
                dst_mac,
                ref l3,
            } => (
                ti as usize,
                ai as usize,
                decap,
                remote,
                u64::from(len),
                src_mac,
                dst_mac,
                l3,
            ),
        };
        let t = &self.compiled.tenants[ti];
        let shard = &self.compiled.shards[self.shard];
        let cells = &shard.tenants[ti];
        bump(&cells.rx_packets, 1);
        bump(&cells.rx_bytes, len);
        if let Some(g) = &t.guards[ai] {
            if !g.allows(&src_mac, l3) {
                bump(&cells.dropped, 1);
                return Verdict::Drop(DropReason::Spoofed);
            }
        }
        let passed = match *l3 {
            L3::Ip { key, tcp_flags, .. } => {
                let clock = Clock {
                    secs: self.now,
                    micros: self.now_us,
                    generation: self.generation,
                };
                let rules = &shard.rules[ti];
                let (rule, passed) = filter_ip(
                    t,
                    rules,
                    &mut self.conns,
                    &mut self.cache,
                    clock,
                    IpPacket {
                        key: &key,
                        tag,
                        conn,
                        tcp_flags,
                        len,
                    },
                );
                if let Some(tag) = rule {
                    let rc = &shard.rules[ti][tag as usize];
                    bump(&rc.packets, 1);
                    bump(&rc.bytes, len);
                    rc.last_hit.store(self.unix_now, Ordering::Relaxed);
                }
                passed
            }
            L3::Arp { .. } => Ok(()),
            L3::Other(_) if t.default_allow => Ok(()),
            L3::Other(_) => Err(DropReason::AclDeny),
        };
        if let Err(reason) = passed {
            bump(&cells.dropped, 1);
            return Verdict::Drop(reason);
        }
        bump(&cells.forwarded, 1);
        let from = t.attachments[ai];
        let to = if is_multicast(&dst_mac) {
            None
        } else {
            let ageing = self.compiled.mac_ageing.as_secs();
            self.macs
                .lookup(ti as u32, ai as u32, dst_mac, self.now, ageing)
                .map(|(a, vtep)| (a as usize, vtep))
        };
        let start = flood.len();
        match to {
            Some((o, _)) if o == ai => {} // same segment: filtered
            Some((o, _)) if t.attachments[o].vni == 0 => {
                // The common cases, built in place: a learned destination,
                // or a flood with one way out.
                let e = plain_egress(from, t.attachments[o], decap);
                self.learn(ti, src_mac, ai, remote);
                return Verdict::Forward(e);
            }
            None if t.attachments.len() == 2 && t.attachments[1 - ai].vni == 0 => {
                let e = plain_egress(from, t.attachments[1 - ai], decap);
                self.learn(ti, src_mac, ai, remote);
                return Verdict::Forward(e);
            }
            Some((o, vtep)) => self.egress(t, from, o, decap, vtep, flood),
            None => {
                for i in 0..t.attachments.len() {
                    if i != ai {
                        self.egress(t, from, i, decap, 0, flood);
                    }
                }
            }
        }
        // One way out is a forward: no copy.
        let verdict = match flood[start..] {
            [one] => {
                flood.truncate(start);
                Verdict::Forward(one)
            }
            _ => Verdict::Flood,
        };
        self.learn(ti, src_mac, ai, remote);
        verdict
    }
}

/// What a frame of a burst needs before its turn.
#[derive(Debug, Clone, Copy)]
enum Need {
    /// Its tenant's (index) rules, for its key.
    Rules(u32),
    /// Nothing more: what [`SwitchPipeline::decide`] takes as its
    /// classification.
    Ready(Option<Option<u32>>),
}

/// The frames of a burst held for their turn, by index in the burst's
/// stage, with what each needs.
struct Waiting<P> {
    held: [Option<P>; BURST],
    /// Classifications known already ([`Need::Ready`]).
    tags: [Option<Option<u32>>; BURST],
    /// Frames whose tenant's rules must classify them: (index, tenant).
    todo: [(u8, u32); BURST],
    /// Entries of `todo`.
    n: usize,
    /// Frames held.
    staged: usize,
}

impl<P> Waiting<P> {
    fn new() -> Waiting<P> {
        Waiting {
            held: std::array::from_fn(|_| None),
            tags: [None; BURST],
            todo: [(0, 0); BURST],
            n: 0,
            staged: 0,
        }
    }

    /// Holds `pkt`, frame `i` of the stage, with what it needs.
    #[inline(always)]
    fn hold(&mut self, i: usize, pkt: P, need: Need) {
        let i = i % BURST;
        match need {
            Need::Ready(tag) => self.tags[i] = tag,
            Need::Rules(ti) => {
                self.todo[self.n % BURST] = (i as u8, ti);
                self.n += 1;
            }
        }
        self.held[i] = Some(pkt);
        self.staged += 1;
    }
}

/// A frame between the stages of a burst.
struct Inspected {
    seen: Seen,
    /// A remote VTEP (IPv4 address, MAC address) the frame revealed.
    neighbour: Option<(u32, [u8; 6])>,
}

/// What the first stage of a burst made of a frame.
enum Seen {
    /// Decided already: consumed by the port's VTEP, or dropped before it
    /// reached a tenant.
    Done(Verdict),
    /// Decided from memory by its link-layer header ([`L2Memo`]): forward
    /// as `decision` says while the MAC table is still at `version`
    /// (see [`SwitchPipeline::settle`]); `len` bytes.
    Recalled {
        decision: Decision,
        version: u64,
        len: u32,
    },
    /// To switch in tenant `ti` from its attachment `ai` (the fields are
    /// small so that a burst's frames move without a `memcpy` call).
    Switch {
        ti: u32,
        ai: u32,
        /// Outer header bytes of a VXLAN frame, stripped on the way out.
        decap: u16,
        /// The remote VTEP a VXLAN frame came from; 0 for other frames.
        remote: u32,
        /// Length of the (inner) frame.
        len: u32,
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        l3: L3,
    },
}

impl Pipeline for SwitchPipeline {
    fn turn(&mut self) {
        let g = self.shared.generation.load(Ordering::Acquire);
        if g != self.generation {
            let cur = self
                .shared
                .current
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.compiled = cur.clone();
            self.generation = self.shared.generation.load(Ordering::Acquire);
            drop(cur);
            self.shard = self.worker % self.compiled.shards.len().max(1);
            // Attachment indices belong to the old snapshot.
            self.macs.clear();
            self.memo.clear();
            self.conns.reserve_tenants(self.compiled.tracking.len());
            self.store_gauges();
            self.cells.taken.store(self.generation, Ordering::Release);
        }
        let elapsed = self.epoch.elapsed();
        self.now_us = elapsed.as_micros() as u64;
        let now = elapsed.as_secs();
        let tick = now != self.now;
        self.now = now;
        if tick || self.unix_now == 0 {
            // Whole seconds are all a rule's last hit keeps: the wall
            // clock is read once a second, not on every turn.
            self.unix_now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
        }
        if self.now >= self.last_sweep + 10 {
            self.last_sweep = self.now;
            let (now, ageing) = (self.now, self.compiled.mac_ageing.as_secs());
            self.macs.age(now, ageing);
            self.neighbours
                .retain(|_, (_, seen)| now.saturating_sub(*seen) < ageing);
        }
        if !self.conns.is_empty() {
            let tracking = &self.compiled.tracking;
            self.conns.sweep(self.now, SWEEP_SLOTS, |uid| {
                tracking.get(uid as usize).copied().unwrap_or(false)
            });
        }
        if tick {
            self.store_gauges();
            self.cells.store_cache(self.cache.stats());
        }
    }

    fn process(&mut self, in_port: usize, packet: &mut [u8], flood: &mut Vec<Egress>) -> Verdict {
        let x = self.inspect(in_port, packet);
        let conn = self.conn_key(&x);
        self.decide(in_port, &x, None, conn, flood)
    }

    fn process_burst<P: Packet>(
        &mut self,
        in_port: usize,
        burst: &mut Vec<P>,
        flood: &mut Vec<Egress>,
        mut sink: impl FnMut(P, &Verdict, &[Egress]),
    ) {
        // Frames are decided at once while none waits for the rules;
        // from the first that needs them on, they wait, and are decided
        // in order once their keys have been classified together.
        let mut seen = std::mem::take(&mut self.stage);
        let tracks = self.compiled.tracking.contains(&true);
        while !burst.is_empty() {
            let k = burst.len().min(BURST);
            seen.clear();
            let mut w = Waiting::new();
            if tracks {
                // Connections to look up: the whole burst is inspected
                // first, so that their table misses start together.
                for pkt in burst[..k].iter_mut() {
                    seen.push(self.inspect_or_recall(in_port, pkt.data_mut()));
                }
                for (i, x) in seen.iter().enumerate() {
                    let ck = self.conn_key(x);
                    if let Some(ck) = &ck {
                        self.conns.prefetch(ck);
                    }
                    self.conn_keys[i] = ck;
                }
                for (i, mut pkt) in burst.drain(..k).enumerate() {
                    let (x, ck) = (&seen[i], self.conn_keys[i]);
                    match self.need(x, ck.as_ref()) {
                        Need::Ready(tag) if w.staged == 0 => {
                            flood.clear();
                            let v = self.settle(in_port, pkt.data_mut(), x, tag, ck, flood);
                            sink(pkt, &v, flood);
                        }
                        need => w.hold(i, pkt, need),
                    }
                }
            } else {
                let memo = self.compiled.l2_memo;
                for mut pkt in burst.drain(..k) {
                    let x = if !memo {
                        self.inspect(in_port, pkt.data_mut())
                    } else if w.staged == 0 {
                        // A remembered decision holds now: taken at once.
                        if let Some(v) = self.recall(in_port, pkt.data()) {
                            sink(pkt, &v, &[]);
                            continue;
                        }
                        self.inspect(in_port, pkt.data_mut())
                    } else {
                        // Held: the decision must still hold at its turn.
                        self.inspect_or_recall(in_port, pkt.data_mut())
                    };
                    // No tenant tracks connections: no frame has a key.
                    match self.need(&x, None) {
                        Need::Ready(tag) if w.staged == 0 => {
                            flood.clear();
                            let v = self.settle(in_port, pkt.data_mut(), &x, tag, None, flood);
                            sink(pkt, &v, flood);
                        }
                        need => {
                            w.hold(seen.len(), pkt, need);
                            seen.push(x);
                        }
                    }
                }
            }
            if w.staged == 0 {
                continue;
            }
            self.classify_ahead(&seen, &w.todo[..w.n], &mut w.tags);
            for (i, ((x, &tag), pkt)) in seen.iter().zip(&w.tags).zip(&mut w.held).enumerate() {
                if let Some(mut pkt) = pkt.take() {
                    flood.clear();
                    let ck = if tracks { self.conn_keys[i] } else { None };
                    let v = self.settle(in_port, pkt.data_mut(), x, tag, ck, flood);
                    sink(pkt, &v, flood);
                }
            }
        }
        self.stage = seen;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Family;
    use crate::parse::proto;
    use crate::parse::tests::build;
    use crate::worker::VXLAN_OVERHEAD;

    const BCAST: [u8; 6] = [0xff; 6];

    fn mac(n: u8) -> [u8; 6] {
        [2, 0, 0, 0, 0, n]
    }

    fn tenant(name: &str, attachments: &[(usize, u16)], default_allow: bool) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            attachments: attachments
                .iter()
                .map(|&(port, vlan)| Attach::port(port, vlan))
                .collect(),
            default_allow,
            ..TenantConfig::default()
        }
    }

    /// Rate-limited rules pass their burst, then their rate; what exceeds
    /// it is dropped as `RateLimited` and still counted on the rule.
    #[test]
    fn rate_limits_pass_the_burst_then_the_rate() {
        let mut t = tenant("t", &[(0, 0), (1, 0)], false);
        let mut dns = AclRule::any(1, 0, Family::V4);
        dns.proto = (proto::UDP, proto::UDP);
        dns.dst_port = (53, 53);
        let mut ntp = dns;
        ntp.order = 2;
        ntp.dst_port = (123, 123);
        let limited = |id: &str, matches, l| SwitchRule {
            id: id.into(),
            matches,
            allow: true,
            stateful: false,
            rate_limit: Some(l),
        };
        t.rules = vec![
            limited(
                "dns",
                dns,
                RateLimit {
                    per_second: 10,
                    bits: false,
                    burst: 5,
                },
            ),
            // 1000 bytes/s, 2000 bytes deep.
            limited(
                "ntp",
                ntp,
                RateLimit {
                    per_second: 8_000,
                    bits: true,
                    burst: 2_000,
                },
            ),
        ];
        let (h, mut p) = switch(2, vec![t]);
        let limited_drop = Verdict::Drop(DropReason::RateLimited);
        let burst = |p: &mut SwitchPipeline, dport: u16, n: usize| {
            (0..n)
                .filter(|_| run(p, 0, udp(1, mac(2), None, dport)).0 != limited_drop)
                .count()
        };
        assert_eq!(burst(&mut p, 53, 20), 5, "the burst");
        p.now_us += 1_000_000;
        assert_eq!(
            burst(&mut p, 53, 20),
            5,
            "a second refills no more than the depth"
        );
        p.now_us += 300_000;
        assert_eq!(burst(&mut p, 53, 20), 3, "0.3 s at 10 packets/s");
        let c = h.traffic().rules[&("t".to_string(), "dns".to_string())];
        assert_eq!(c.packets, 60, "drops count on the rule");

        let frame = udp(1, mac(2), None, 123).len() as u64;
        let fits = (2_000 / frame) as usize;
        assert_eq!(burst(&mut p, 123, 100), fits, "bytes of depth");
        p.now_us += 500_000;
        assert_eq!(
            burst(&mut p, 123, 100),
            (500 / frame) as usize,
            "500 bytes in 0.5 s"
        );
    }

    /// Enough random rules for the flow cache: UDP to one of ports
    /// 50-57, from one of 10.0.0.0-7 or anywhere, allow or deny.
    fn cacheable_rules(rng: &mut crate::classify::tests::Rng) -> Vec<SwitchRule> {
        (0..FLOW_CACHE_MIN_RULES as u32 + 4)
            .map(|i| {
                let mut m = AclRule::any(i, 0, Family::V4);
                m.proto = (proto::UDP, proto::UDP);
                let d = 50 + rng.below(8) as u16;
                m.dst_port = (d, d);
                if rng.below(2) == 0 {
                    m.src = AclRule::prefix_range(0x0a00_0000 | rng.below(8) as u128, 32, 32);
                }
                SwitchRule {
                    id: format!("r{i}"),
                    matches: m,
                    allow: rng.below(2) == 0,
                    stateful: false,
                    rate_limit: None,
                }
            })
            .collect()
    }

    /// A tenant with enough rules to use the flow cache: every verdict
    /// agrees with a first-match scan of the rules in force, through many
    /// rule changes, while the same 64 flows keep coming back.
    #[test]
    fn cached_verdicts_follow_every_rule_change() {
        let mut rng = crate::classify::tests::Rng(0xcac4e);
        let mut t = tenant("t", &[(0, 0), (1, 0)], false);
        let config = |t: &TenantConfig| SwitchConfig {
            ports: 2,
            tenants: vec![t.clone()],
            flow_cache_entries: 4096,
            ..SwitchConfig::default()
        };
        let h = SwitchHandle::new(&config(&t)).unwrap();
        let mut p = h.pipeline();
        for round in 0..40 {
            t.rules = cacheable_rules(&mut rng);

            h.publish(&config(&t)).unwrap();
            p.turn();
            assert!(p.compiled.tenants[0].cached);
            for _ in 0..300 {
                let (src, dport) = (rng.below(8) as u8, 50 + rng.below(8) as u16);
                let key = FlowKey {
                    src: 0x0a00_0000 | u128::from(src),
                    dst: 0x0a00_0063,
                    src_port: 5000,
                    dst_port: dport,
                    proto: proto::UDP,
                    v6: false,
                };
                let want = t
                    .rules
                    .iter()
                    .find(|r| r.matches.matches(&key))
                    .is_some_and(|r| r.allow);
                let frame = build::udp4(
                    mac(1),
                    mac(2),
                    None,
                    [10, 0, 0, src],
                    [10, 0, 0, 99],
                    5000,
                    dport,
                );
                let got = !matches!(run(&mut p, 0, frame).0, Verdict::Drop(_));
                assert_eq!(got, want, "round {round}: {key:?}");
            }
        }
    }

    /// A flow cache far too small for its flows goes to rest and comes
    /// back, one by one and in bursts, and no verdict changes on the way.
    #[test]
    fn a_thrashed_flow_cache_rests_without_changing_a_verdict() {
        use crate::flowcache::{REST, WINDOW};
        use crate::io::memory::MemPacket;
        let mut rng = crate::classify::tests::Rng(0x7e57);
        let mut t = tenant("t", &[(0, 0), (1, 0)], false);
        t.rules = cacheable_rules(&mut rng);
        let h = SwitchHandle::new(&SwitchConfig {
            ports: 2,
            tenants: vec![t.clone()],
            flow_cache_entries: 4,
            ..SwitchConfig::default()
        })
        .unwrap();
        let mut p = h.pipeline();
        p.turn();
        assert!(p.compiled.tenants[0].cached);
        // Flow `n`: new source ports while `n` grows; 4 flows repeat.
        let frame = |n: u32| {
            let (src, dport) = (n % 8, 50 + (n / 8 % 8) as u16);
            let key = FlowKey {
                src: 0x0a00_0000 | u128::from(src),
                dst: 0x0a00_0063,
                src_port: 1024 + (n / 64) as u16,
                dst_port: dport,
                proto: proto::UDP,
                v6: false,
            };
            let f = build::udp4(
                mac(1),
                mac(2),
                None,
                [10, 0, 0, src as u8],
                [10, 0, 0, 99],
                key.src_port,
                dport,
            );
            let want = t
                .rules
                .iter()
                .find(|r| r.matches.matches(&key))
                .is_some_and(|r| r.allow);
            (f, want)
        };
        let passes = |v: &Verdict| !matches!(v, Verdict::Drop(_));
        // One by one: every frame a new flow, until well past a rest.
        let total = 2 * WINDOW + REST;
        for n in 0..total {
            let (f, want) = frame(n);
            assert_eq!(passes(&run(&mut p, 0, f).0), want, "frame {n}");
        }
        assert!(
            p.cache.stats().rests >= 2,
            "rested {} times",
            p.cache.stats().rests
        );
        // In bursts: new flows still, then the same four (one set).
        let rests = p.cache.stats().rests;
        for (phase, flows) in [(0, total), (1, 4)] {
            for b in 0..(2 * WINDOW + REST) / BURST as u32 {
                let ns: Vec<u32> = (0..BURST as u32)
                    .map(|i| match phase {
                        0 => total + b * BURST as u32 + i,
                        _ => i % flows,
                    })
                    .collect();
                let mut burst: Vec<MemPacket> = ns.iter().map(|&n| MemPacket(frame(n).0)).collect();
                let mut got = Vec::new();
                p.process_burst(0, &mut burst, &mut Vec::new(), |_, v, _| {
                    got.push(passes(v))
                });
                let want: Vec<bool> = ns.iter().map(|&n| frame(n).1).collect();
                assert_eq!(got, want, "phase {phase} burst {b}");
            }
            if phase == 0 {
                assert!(p.cache.stats().rests > rests, "rests in bursts too");
            }
        }
        let settled = p.cache.stats().rests;
        for _ in 0..4 * WINDOW {
            let (f, want) = frame(3);
            assert_eq!(passes(&run(&mut p, 0, f).0), want);
        }
        assert_eq!(
            p.cache.stats().rests,
            settled,
            "a cache that hits stays in use"
        );
        // The handle sees the counts a second later, and keeps them once
        // the pipeline is gone.
        let seen = p.cache.stats();
        assert!(seen.hits >= 4 * WINDOW as u64 && seen.lookups > seen.hits);
        assert_eq!(
            h.flow_cache(),
            FlowCacheStats::default(),
            "not a second yet"
        );
        p.epoch -= Duration::from_secs(1);
        p.turn();
        assert_eq!(h.flow_cache(), seen);
        let mut q = h.pipeline();
        q.turn();
        drop(p);
        assert_eq!(h.flow_cache(), seen, "kept when it is dropped");
    }

    /// A tenant with no rules that allows everything switches IP at L2:
    /// a frame whose IPv4 header is broken passes where nothing looks
    /// at it, and is dropped as malformed in a tenant with a rule, a
    /// default deny or an address guard on any attachment.
    #[test]
    fn only_what_needs_the_network_layer_parses_it() {
        let mut broken = udp(1, mac(2), None, 53);
        broken[14] = 0x43; // IHL 3: shorter than an IPv4 header
        let mut ruled = tenant("ruled", &[(2, 0), (3, 0)], true);
        ruled.rules = dns_and_deny_7();
        // One attachment guarded by source MAC only, the other open.
        let mut by_mac = tenant("by_mac", &[(4, 0), (9, 0)], true);
        by_mac.guards = vec![Guard {
            macs: vec![mac(1)],
            ..Guard::default()
        }];
        // A source prefix on one attachment: the whole tenant parses.
        let mut by_ip = tenant("by_ip", &[(5, 0), (6, 0)], true);
        by_ip.guards = vec![
            Guard::default(),
            Guard {
                v4: vec![(0x0a00_0000, 0x0a00_00ff)],
                ..Guard::default()
            },
        ];
        let (h, mut p) = switch(
            10,
            vec![
                tenant("open", &[(0, 0), (1, 0)], true),
                ruled,
                by_mac,
                by_ip,
                tenant("closed", &[(7, 0), (8, 0)], false),
            ],
        );
        let malformed = Verdict::Drop(DropReason::Malformed);
        let forwarded = |v: &Verdict| matches!(v, Verdict::Forward(_) | Verdict::Flood);
        assert!(forwarded(&run(&mut p, 0, broken.clone()).0), "no rules");
        assert!(forwarded(&run(&mut p, 4, broken.clone()).0), "MAC guard");
        for (port, what) in [(2, "rules"), (5, "address guard"), (7, "default deny")] {
            assert_eq!(run(&mut p, port, broken.clone()).0, malformed, "{what}");
        }
        // Unattached, it is malformed before it is nobody's.
        assert_eq!(
            SwitchHandle::new(&SwitchConfig {
                ports: 1,
                ..SwitchConfig::default()
            })
            .map(|h| run(&mut h.pipeline(), 0, broken.clone()).0)
            .unwrap(),
            malformed
        );
        // A broken ARP body and a truncated tag stay malformed everywhere.
        let mut arp = build::arp(mac(1), BCAST, None, 1, [10, 0, 0, 1], [10, 0, 0, 2]);
        arp.truncate(20);
        assert_eq!(run(&mut p, 0, arp).0, malformed);
        let mut tagged = udp(1, mac(2), Some(5), 53);
        tagged.truncate(16);
        assert_eq!(run(&mut p, 0, tagged).0, malformed);
        // A good frame passes the open tenant as before, and the rules
        // still see theirs.
        assert!(forwarded(&run(&mut p, 0, udp(1, mac(2), None, 53)).0));
        assert!(forwarded(&run(&mut p, 2, udp(1, mac(2), None, 53)).0));
        assert_eq!(
            run(&mut p, 2, udp(7, mac(2), None, 53)).0,
            Verdict::Drop(DropReason::AclDeny)
        );
        assert_eq!(h.traffic().tenants["open"].forwarded_packets, 2);
    }

    /// A link-layer tenant's frames are decided from memory while their
    /// header repeats, and as the MAC table and the rules say the moment
    /// either changes: a host that moves within a burst (also while the
    /// frames wait behind one that needs rules, and when a tenant tracks
    /// connections, so that a burst is inspected whole before any frame
    /// of it is decided), a rule published for the tenant.
    #[test]
    fn headers_decided_from_memory_follow_the_table_and_the_rules() {
        for stateful in [false, true] {
            let ruled = |stateful| {
                let mut s = tenant("s", &[(0, 30), (3, 0)], false);
                s.rules = dns_and_deny_7();
                s.rules[0].stateful = stateful;
                s
            };
            let plain = || tenant("t", &[(0, 10), (1, 0), (2, 0)], true);
            let (h, mut p) = switch(4, vec![plain(), ruled(stateful)]);
            assert_eq!(p.compiled.tracking.contains(&true), stateful);
            let burst = |p: &mut SwitchPipeline, port: usize, frames: &[Vec<u8>]| {
                let mut b: Vec<_> = frames
                    .iter()
                    .map(|f| crate::io::memory::MemPacket(f.clone()))
                    .collect();
                let mut got = Vec::new();
                p.process_burst(port, &mut b, &mut Vec::new(), |_, v, fl| {
                    got.push((*v, fl.to_vec()))
                });
                got
            };
            let out = |port| {
                Verdict::Forward(Egress {
                    vlan: VlanOp::Strip,
                    ..Egress::to(port)
                })
            };
            let at = format!("stateful {stateful}");
            // Host 2 is behind port 1; host 1 on port 0 sends to it.
            assert_eq!(run(&mut p, 1, udp(2, mac(1), None, 53)).0, Verdict::Flood);
            let to_2 = udp(1, mac(2), Some(10), 53);
            // A burst inspected whole before it is decided finds nothing
            // remembered yet; the next one does.
            for _ in 0..2 {
                let got = burst(&mut p, 0, &vec![to_2.clone(); 20]);
                assert!(
                    got.iter().all(|(v, fl)| *v == out(1) && fl.is_empty()),
                    "{at}"
                );
            }
            assert!(
                p.memo.hits.get() >= 20,
                "{at}: {} from memory",
                p.memo.hits.get()
            );
            // Behind a frame of the ruled tenant, host 2 moves to port 0:
            // host 1's frame to it before the move goes to port 1, the
            // one after stays on its segment, and so does an IPv6 frame
            // with the same addresses, decided on its own.
            let hits = p.memo.hits.get();
            let moved = udp(2, mac(9), Some(10), 53);
            let mut v6 = build::eth(mac(2), mac(1), Some(10), crate::parse::ETH_IPV6);
            v6.extend(build::ipv6(1, 2, proto::UDP, &build::udp(5000, 53, 8)));
            let ruled_frame = udp(5, mac(6), Some(30), 53);
            let got = burst(
                &mut p,
                0,
                &[ruled_frame, to_2.clone(), moved, to_2.clone(), v6.clone()],
            );
            assert!(
                matches!(got[0].0, Verdict::Forward(e) if e.port == 3),
                "{at}"
            );
            assert_eq!(got[1].0, out(1), "{at}");
            assert_eq!(got[2].0, Verdict::Flood, "{at}");
            assert_eq!(got[3], (Verdict::Flood, Vec::new()), "{at}: filtered");
            assert_eq!(got[4], (Verdict::Flood, Vec::new()), "{at}: filtered");
            assert_eq!(
                p.memo.hits.get(),
                hits + 2,
                "{at}: both recalled, one stale"
            );
            // Back behind port 2.
            run(&mut p, 2, udp(2, mac(1), None, 53));
            let got = burst(&mut p, 0, &vec![to_2.clone(); 4]);
            assert!(got.iter().all(|(v, _)| *v == out(2)), "{at}: {got:?}");
            // Counted as decided: all of them passed the filter.
            let traffic = h.traffic().tenants["t"];
            assert_eq!(traffic.rx_packets, 50, "{at}");
            assert_eq!(traffic.forwarded_packets, 50, "{at}");
            assert_eq!(
                traffic.rx_bytes,
                // 47 tagged frames on port 0, 2 untagged on ports 1 and 2.
                47 * to_2.len() as u64 + 2 * (to_2.len() as u64 - 4) + v6.len() as u64,
                "{at}"
            );
            // A rule for the tenant: the same header is filtered at once.
            let mut t = plain();
            t.rules = dns_and_deny_7();
            t.rules[0].allow = false;
            h.publish(&SwitchConfig {
                ports: 4,
                tenants: vec![t, ruled(stateful)],
                ..SwitchConfig::default()
            })
            .unwrap();
            p.turn();
            let got = burst(&mut p, 0, &vec![to_2.clone(); 3]);
            assert!(
                got.iter()
                    .all(|(v, _)| *v == Verdict::Drop(DropReason::AclDeny)),
                "{at}"
            );
            v6[18] = 0; // now parsed: malformed
            assert_eq!(
                burst(&mut p, 0, &[v6])[0].0,
                Verdict::Drop(DropReason::Malformed),
                "{at}"
            );
        }
    }

    /// Port 0 may send only from MAC 1 and 10.0.0.1; port 1 is open.
    #[test]
    fn spoofed_sources_are_dropped_on_guarded_attachments() {
        let mut t = tenant("t", &[(0, 0), (1, 0)], true);
        t.guards = vec![Guard {
            macs: vec![mac(1)],
            v4: vec![(0x0a00_0001, 0x0a00_0001)],
            v6: Vec::new(),
        }];
        let (h, mut p) = switch(2, vec![t]);
        let spoofed = Verdict::Drop(DropReason::Spoofed);
        let passed = |p: u16| {
            Verdict::Forward(Egress {
                vlan: VlanOp::Keep,
                ..Egress::to(usize::from(p))
            })
        };
        let udp_from =
            |m: u8, ip: u8| build::udp4(mac(m), BCAST, None, [10, 0, 0, ip], [10, 0, 0, 2], 1, 2);
        assert_eq!(run(&mut p, 0, udp_from(1, 1)).0, passed(1));
        assert_eq!(run(&mut p, 0, udp_from(5, 1)).0, spoofed, "MAC");
        assert_eq!(run(&mut p, 0, udp_from(1, 7)).0, spoofed, "IPv4 source");
        // No IPv6 prefix listed: IPv6 is refused once prefixes are.
        let mut v6 = build::eth(BCAST, mac(1), None, crate::parse::ETH_IPV6);
        v6.extend(build::ipv6(1, 2, proto::UDP, &build::udp(1, 2, 4)));
        assert_eq!(run(&mut p, 0, v6.clone()).0, spoofed, "IPv6");
        // ARP: sender MAC and address are checked; a probe (0.0.0.0) passes.
        let arp = |ip: [u8; 4]| build::arp(mac(1), BCAST, None, 1, ip, [10, 0, 0, 2]);
        assert_eq!(run(&mut p, 0, arp([10, 0, 0, 1])).0, passed(1));
        assert_eq!(run(&mut p, 0, arp([0, 0, 0, 0])).0, passed(1));
        assert_eq!(
            run(&mut p, 0, arp([10, 0, 0, 9])).0,
            spoofed,
            "ARP sender IP"
        );
        let mut forged = arp([10, 0, 0, 1]);
        forged[14 + 8 + 5] = 5; // the sender MAC inside the ARP body
        assert_eq!(run(&mut p, 0, forged).0, spoofed, "ARP sender MAC");
        // The open attachment takes anything.
        assert_eq!(run(&mut p, 1, udp_from(5, 7)).0, passed(0));
        assert_eq!(run(&mut p, 1, v6).0, passed(0));
        let c = h.traffic().tenants["t"];
        assert_eq!((c.rx_packets, c.dropped_packets), (10, 5));
    }

    fn switch(ports: usize, tenants: Vec<TenantConfig>) -> (SwitchHandle, SwitchPipeline) {
        let h = SwitchHandle::new(&SwitchConfig {
            ports,
            tenants,
            ..SwitchConfig::default()
        })
        .unwrap();
        let mut p = h.pipeline();
        p.turn();
        (h, p)
    }

    fn run(p: &mut SwitchPipeline, port: usize, mut frame: Vec<u8>) -> (Verdict, Vec<Egress>) {
        let mut flood = Vec::new();
        let v = p.process(port, &mut frame, &mut flood);
        (v, flood)
    }

    fn udp(src: u8, dst: [u8; 6], vlan: Option<u16>, dport: u16) -> Vec<u8> {
        build::udp4(
            mac(src),
            dst,
            vlan,
            [10, 0, 0, src],
            [10, 0, 0, 99],
            5000,
            dport,
        )
    }

    #[test]
    fn floods_within_the_tenant_then_learns() {
        // t1: ports 0 and 1 whole, VLAN 10 on uplink 3; t2: port 2, VLAN 20 on 3.
        let (_h, mut p) = switch(
            4,
            vec![
                tenant("t1", &[(0, 0), (1, 0), (3, 10)], true),
                tenant("t2", &[(2, 0), (3, 20)], true),
            ],
        );
        let (v, flood) = run(&mut p, 0, udp(1, BCAST, None, 53));
        assert_eq!(v, Verdict::Flood);
        assert_eq!(
            flood,
            vec![
                Egress {
                    vlan: VlanOp::Keep,
                    ..Egress::to(1)
                },
                Egress {
                    vlan: VlanOp::Push(10),
                    ..Egress::to(3)
                }
            ]
        );
        // The reply from the uplink, tagged 10, goes straight back, untagged.
        let (v, _) = run(&mut p, 3, udp(9, mac(1), Some(10), 53));
        assert_eq!(
            v,
            Verdict::Forward(Egress {
                vlan: VlanOp::Strip,
                ..Egress::to(0)
            })
        );
        // The same MAC in t2 is a different station: unknown there, and
        // flooded to t2's one other attachment (a forward, no copy).
        let (v, flood) = run(&mut p, 3, udp(9, mac(1), Some(20), 53));
        assert_eq!(
            v,
            Verdict::Forward(Egress {
                vlan: VlanOp::Strip,
                ..Egress::to(2)
            })
        );
        assert!(flood.is_empty());
        // Unattached VLAN: nobody's.
        assert_eq!(
            run(&mut p, 3, udp(9, mac(1), Some(30), 53)).0,
            Verdict::Drop(DropReason::NoTenant)
        );
        assert_eq!(
            run(&mut p, 3, udp(9, mac(1), None, 53)).0,
            Verdict::Drop(DropReason::NoTenant)
        );
        // Garbage and a multicast source.
        assert_eq!(
            run(&mut p, 0, vec![1, 2, 3]).0,
            Verdict::Drop(DropReason::Malformed)
        );
        let mut f = udp(1, mac(2), None, 53);
        f[6] = 1;
        assert_eq!(run(&mut p, 0, f).0, Verdict::Drop(DropReason::Malformed));
    }

    /// Order 10 "dns" allows UDP to port 53; order 5 "deny7" denies
    /// everything from 10.0.0.7 (and so comes first).
    fn dns_and_deny_7() -> Vec<SwitchRule> {
        let mut dns = AclRule::any(10, 0, Family::V4);
        dns.proto = (proto::UDP, proto::UDP);
        dns.dst_port = (53, 53);
        let mut deny = AclRule::any(5, 0, Family::V4);
        deny.src = AclRule::prefix_range(0x0a00_0007, 32, 32);
        vec![
            SwitchRule {
                id: "dns".into(),
                matches: dns,
                allow: true,
                stateful: false,
                rate_limit: None,
            },
            SwitchRule {
                id: "deny7".into(),
                matches: deny,
                allow: false,
                stateful: false,
                rate_limit: None,
            },
        ]
    }

    /// VXLAN: the uplink's VTEP answers ARP for its address; a tenant's
    /// flood reaches its remote VTEPs (an ARP request first while a
    /// VTEP's MAC is unknown); frames from a VNI are decapsulated into
    /// that VNI's tenant only, and replies to a learned station go back
    /// through the tunnel it came from.
    #[test]
    fn vxlan_networks_switch_within_their_tenant() {
        use crate::io::memory::MemPacket;
        use crate::worker::apply_tunnel;
        const LOCAL: u32 = 0xc000_0201; // 192.0.2.1
        const REMOTE: u32 = 0xc000_0202;
        let up_mac = [2, 0, 0, 0, 0, 0xaa];
        let remote_mac = [2, 0, 0, 0, 0, 0xbb];
        let mut t = tenant("t", &[(0, 0)], true);
        t.attachments.push(Attach {
            port: 1,
            vlan: 0,
            vni: 100,
        });
        t.remote_vteps = vec![vec![], vec![REMOTE]];
        let mut u = tenant("u", &[(2, 0)], true);
        u.attachments.push(Attach {
            port: 1,
            vlan: 0,
            vni: 200,
        });
        let mut cfg = SwitchConfig {
            ports: 3,
            vteps: vec![
                None,
                Some(Vtep {
                    ip: LOCAL,
                    mac: up_mac,
                }),
            ],
            tenants: vec![t, u],
            ..SwitchConfig::default()
        };
        let h = SwitchHandle::new(&cfg).unwrap();
        let mut p = h.pipeline();
        p.turn();
        let from_remote = |vni: u32, inner: Vec<u8>| {
            let mut f = MemPacket(inner);
            assert!(apply_tunnel(
                &mut f,
                &Tunnel {
                    src_mac: remote_mac,
                    dst_mac: up_mac,
                    src_ip: REMOTE,
                    dst_ip: LOCAL,
                    vni,
                    resolve: false,
                }
            ));
            f.0
        };
        let tunnel = |dst_mac: [u8; 6], resolve: bool| Tunnel {
            src_mac: up_mac,
            dst_mac,
            src_ip: LOCAL,
            dst_ip: REMOTE,
            vni: 100,
            resolve,
        };
        // A broadcast before the remote VTEP is known: resolve it.
        let (v, _) = run(&mut p, 0, udp(1, BCAST, None, 53));
        let want = |t: Tunnel| Egress {
            vlan: VlanOp::Keep,
            tunnel: Some(t),
            ..Egress::to(1)
        };
        assert_eq!(v, Verdict::Forward(want(tunnel(BCAST, true))));
        // The remote VTEP asks for ours: answered in place, and learnt.
        let mut arp = vec![0xff; 6];
        arp.extend_from_slice(&remote_mac);
        arp.extend_from_slice(&[8, 6, 0, 1, 8, 0, 6, 4, 0, 1]);
        arp.extend_from_slice(&remote_mac);
        arp.extend_from_slice(&REMOTE.to_be_bytes());
        arp.extend_from_slice(&[0; 6]);
        arp.extend_from_slice(&LOCAL.to_be_bytes());
        let mut reply = arp.clone();
        let mut flood = Vec::new();
        assert_eq!(
            p.process(1, &mut reply, &mut flood),
            Verdict::Forward(Egress::to(1))
        );
        assert_eq!(&reply[0..12], &[remote_mac, up_mac].concat()[..]);
        assert_eq!(&reply[20..22], &[0, 2]);
        assert_eq!(
            &reply[22..32],
            &[&up_mac[..], &LOCAL.to_be_bytes()].concat()[..]
        );
        assert_eq!(&reply[32..42], &arp[22..32]);
        // Now the flood goes through the tunnel.
        let (v, _) = run(&mut p, 0, udp(1, BCAST, None, 53));
        assert_eq!(v, Verdict::Forward(want(tunnel(remote_mac, false))));
        // VNI 100 from the remote: decapsulated to t's port, and mac(9)
        // learnt behind the remote VTEP.
        let inner = udp(9, mac(1), None, 53);
        let (v, _) = run(&mut p, 1, from_remote(100, inner.clone()));
        assert_eq!(
            v,
            Verdict::Forward(Egress {
                decap: VXLAN_OVERHEAD as u16,
                ..Egress::to(0)
            })
        );
        let (v, _) = run(&mut p, 0, udp(1, mac(9), None, 53));
        assert_eq!(v, Verdict::Forward(want(tunnel(remote_mac, false))));
        // VNI 200 is u's: mac(1) is unknown there, it goes to u's port only.
        let (v, _) = run(&mut p, 1, from_remote(200, inner.clone()));
        assert_eq!(
            v,
            Verdict::Forward(Egress {
                decap: VXLAN_OVERHEAD as u16,
                ..Egress::to(2)
            })
        );
        // An unknown VNI, a bad outer checksum, another port: nobody's.
        let (v, _) = run(&mut p, 1, from_remote(300, inner.clone()));
        assert_eq!(v, Verdict::Drop(DropReason::NoTenant));
        let mut bad = from_remote(100, inner.clone());
        bad[24] ^= 1;
        assert_eq!(run(&mut p, 1, bad).0, Verdict::Drop(DropReason::NoTenant));
        let mut other_port = from_remote(100, inner.clone());
        other_port[36..38].copy_from_slice(&4790u16.to_be_bytes());
        let sum = crate::parse::ip_checksum(&other_port[14..34]);
        assert_eq!(sum, 0, "only the UDP port changed");
        assert_eq!(
            run(&mut p, 1, other_port).0,
            Verdict::Drop(DropReason::NoTenant)
        );
        // Frames on the uplink not for the VTEP: no tenant owns the port.
        assert_eq!(
            run(&mut p, 1, inner.clone()).0,
            Verdict::Drop(DropReason::NoTenant)
        );
        // Configuration errors.
        cfg.tenants[1].attachments[1].vni = 100;
        assert!(matches!(
            SwitchHandle::new(&cfg),
            Err(ConfigError::VniOverlap { vni: 100, .. })
        ));
        cfg.tenants[1].attachments[1] = Attach {
            port: 2,
            vlan: 0,
            vni: 7,
        };
        assert!(matches!(
            SwitchHandle::new(&cfg),
            Err(ConfigError::NoVtep {
                port: 2,
                vni: 7,
                ..
            })
        ));
        cfg.tenants[1].attachments[1] = Attach {
            port: 1,
            vlan: 0,
            vni: 1 << 24,
        };
        assert!(matches!(
            SwitchHandle::new(&cfg),
            Err(ConfigError::BadVni { .. })
        ));
    }

    /// The verdict of tenant `ti` of `c` for `key`: the matching rule's ID
    /// and action.
    fn verdict(c: &Compiled, ti: usize, key: &FlowKey) -> Option<(String, bool)> {
        let t = &c.tenants[ti];
        let tag = t.classifier.lookup(key)?.tag as usize;
        let r = t.slots[tag].as_ref().expect("a live slot");
        assert_eq!(t.actions[tag] & ALLOWS != 0, r.allow);
        Some((r.id.to_string(), r.allow))
    }

    /// Single-rule inserts, deletes and edits published one after the
    /// other patch the previous classifier, and every snapshot classifies
    /// exactly as one compiled from scratch; big changes rebuild.
    #[test]
    fn small_rule_changes_patch_and_agree_with_a_full_build() {
        let mut seed = 0x5eed_u64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut next_id = 0u32;
        let mut rule = |rnd: &mut dyn FnMut(u64) -> u64| {
            next_id += 1;
            let mut m = AclRule::any(0, 0, Family::V4);
            // Few, short prefixes of 10.0.0.0/8, so rules overlap.
            let pick = |rnd: &mut dyn FnMut(u64) -> u64| {
                let len = 8 + rnd(17) as u8;
                AclRule::prefix_range(0x0a00_0000 | rnd(1 << 24) as u128, len, 32)
            };
            if rnd(2) == 0 {
                m.src = pick(rnd);
            }
            if rnd(2) == 0 {
                m.dst = pick(rnd);
            }
            if rnd(2) == 0 {
                let lo = rnd(1024) as u16;
                m.dst_port = (lo, lo + rnd(64) as u16);
            }
            if rnd(3) == 0 {
                m.proto = (proto::TCP, proto::TCP);
            }
            SwitchRule {
                id: format!("r{next_id}"),
                matches: m,
                allow: rnd(2) == 0,
                stateful: false,
                rate_limit: None,
            }
        };
        let mut t = tenant("t", &[(0, 0), (1, 0)], false);
        for i in 0..400 {
            let mut r = rule(&mut rnd);
            r.matches.order = i * 16;
            t.rules.push(r);
        }
        let mut cfg = SwitchConfig {
            ports: 3,
            tenants: vec![t, tenant("other", &[(2, 0)], true)],
            ..SwitchConfig::default()
        };
        let h = SwitchHandle::new(&cfg).unwrap();
        let mut patched = 0;
        for step in 0..300 {
            let rules = &mut cfg.tenants[0].rules;
            let at = rnd(rules.len() as u64) as usize;
            match step % 4 {
                0 => {
                    let mut r = rule(&mut rnd);
                    r.matches.order = rules[at].matches.order + 1 + rnd(14) as u32;
                    r.matches.order = r.matches.order.min(rules[at].matches.order + 15);
                    if rules.iter().all(|o| o.matches.order != r.matches.order) {
                        rules.insert(at, r);
                    }
                }
                1 => {
                    rules.remove(at);
                }
                2 => rules[at].allow = !rules[at].allow,
                _ => {
                    let order = rules[at].matches.order;
                    let id = rules[at].id.clone();
                    rules[at] = rule(&mut rnd);
                    rules[at].matches.order = order;
                    rules[at].id = id;
                }
            }
            let stats = h.publish(&cfg).unwrap();
            assert_eq!(stats.built + stats.patched + stats.unchanged, 2);
            assert!(stats.unchanged >= 1, "the other tenant: {stats:?}");
            patched += stats.patched;
            let (_, cur) = h.load();
            let fresh = Compiled::new(&cfg).unwrap();
            for _ in 0..200 {
                let key = FlowKey {
                    src: 0x0a00_0000 | u128::from(rnd(1 << 24) as u32),
                    dst: 0x0a00_0000 | u128::from(rnd(1 << 24) as u32),
                    src_port: rnd(2048) as u16,
                    dst_port: rnd(1100) as u16,
                    proto: if rnd(2) == 0 { proto::TCP } else { proto::UDP },
                    v6: false,
                };
                assert_eq!(
                    verdict(&cur, 0, &key),
                    verdict(&fresh, 0, &key),
                    "step {step}"
                );
            }
            let live = cur.tenants[0].slots.iter().flatten().count();
            assert_eq!(live, cfg.tenants[0].rules.len());
            assert_eq!(cur.tenants[0].order.len(), live);
        }
        assert!(patched > 200, "only {patched} of 300 changes were patched");
        // Replacing every rule is no patch: a full build.
        for r in &mut cfg.tenants[0].rules {
            r.id.push('x');
        }
        assert_eq!(h.publish(&cfg).unwrap().built, 1);
        let (_, cur) = h.load();
        assert_eq!(cur.tenants[0].classifier.overlay_len(), 0);
        assert_eq!(cur.tenants[0].slots.len(), cfg.tenants[0].rules.len());
        // A duplicate order is refused, patch or not.
        let dup = cfg.tenants[0].rules[3].matches.order;
        let mut r = cfg.tenants[0].rules[0].clone();
        r.id = "dup".into();
        r.matches.order = dup;
        cfg.tenants[0].rules.push(r);
        assert_eq!(
            h.publish(&cfg),
            Err(ConfigError::DuplicateOrder {
                tenant: "t".into(),
                order: dup
            })
        );
    }

    /// Tenant and rule counters count what the filter decided, and keep
    /// counting across configuration changes for the rules that stay.
    #[test]
    fn tenant_and_rule_counters_follow_their_ids() {
        let mut t = tenant("t1", &[(0, 0), (1, 0)], false);
        t.rules = dns_and_deny_7();
        let (h, mut p) = switch(2, vec![t.clone()]);
        p.turn();
        let a = udp(1, mac(2), None, 53);
        let (len_a, len_b) = (a.len() as u64, udp(7, mac(2), None, 53).len() as u64);
        run(&mut p, 0, a); // allowed by "dns"
        run(&mut p, 0, udp(7, mac(2), None, 53)); // denied by "deny7"
        run(&mut p, 0, udp(1, mac(2), None, 80)); // default deny
        let c = h.traffic();
        let tc = c.tenants["t1"];
        assert_eq!(
            (tc.rx_packets, tc.forwarded_packets, tc.dropped_packets),
            (3, 1, 2)
        );
        let dns_c = c.rules[&("t1".to_string(), "dns".to_string())];
        assert_eq!((dns_c.packets, dns_c.bytes), (1, len_a));
        assert!(dns_c.last_hit > 1_600_000_000, "last hit is a Unix time");
        let deny_c = c.rules[&("t1".to_string(), "deny7".to_string())];
        assert_eq!((deny_c.packets, deny_c.bytes), (1, len_b));

        // Drop "deny7", keep "dns" (now at another index): "dns" goes on
        // from its count, "deny7" is gone once no worker holds the old
        // snapshot.
        let mut t2 = t.clone();
        t2.rules.remove(1);
        t2.rules.insert(
            0,
            SwitchRule {
                id: "x".into(),
                matches: AclRule::any(1, 0, Family::V6),
                allow: true,
                stateful: false,
                rate_limit: None,
            },
        );
        h.publish(&SwitchConfig {
            ports: 2,
            tenants: vec![t2],
            ..SwitchConfig::default()
        })
        .unwrap();
        p.turn();
        run(&mut p, 0, udp(1, mac(2), None, 53));
        let c = h.traffic();
        assert_eq!(c.rules[&("t1".to_string(), "dns".to_string())].packets, 2);
        assert!(!c
            .rules
            .contains_key(&("t1".to_string(), "deny7".to_string())));
        assert_eq!(c.rules[&("t1".to_string(), "x".to_string())].packets, 0);
        assert_eq!(c.tenants["t1"].rx_packets, 4);
        // Replaced snapshots are let go at the next publish even when
        // nobody reads counters.
        for _ in 0..5 {
            h.publish(&SwitchConfig {
                ports: 2,
                tenants: vec![t.clone()],
                ..SwitchConfig::default()
            })
            .unwrap();
            p.turn();
        }
        let retired = h.shared.history.lock().unwrap().retired.len();
        assert!(retired <= 1, "{retired} replaced snapshots kept");
        // A deleted tenant's counts go with it.
        h.publish(&SwitchConfig {
            ports: 2,
            ..SwitchConfig::default()
        })
        .unwrap();
        p.turn();
        assert!(h.traffic().tenants.is_empty());
    }

    #[test]
    fn rules_first_match_then_default() {
        let mut t = tenant("t1", &[(0, 0), (1, 0)], false);
        t.rules = dns_and_deny_7();
        let (_h, mut p) = switch(2, vec![t]);
        let to_1 = Verdict::Forward(Egress {
            vlan: VlanOp::Keep,
            ..Egress::to(1)
        });
        assert_eq!(run(&mut p, 0, udp(1, mac(2), None, 53)).0, to_1);
        assert_eq!(
            run(&mut p, 0, udp(1, mac(2), None, 80)).0,
            Verdict::Drop(DropReason::AclDeny)
        );
        // Order 5 (deny 10.0.0.7) comes before order 10 (allow DNS).
        assert_eq!(
            run(&mut p, 0, udp(7, mac(2), None, 53)).0,
            Verdict::Drop(DropReason::AclDeny)
        );
        // ARP passes a default-deny tenant; other EtherTypes do not.
        let arp = build::arp(mac(1), BCAST, None, 1, [10, 0, 0, 1], [10, 0, 0, 2]);
        assert_eq!(run(&mut p, 0, arp).0, to_1);
        let mut other = build::eth(BCAST, mac(1), None, 0x88b5);
        other.extend_from_slice(&[0; 46]);
        assert_eq!(run(&mut p, 0, other).0, Verdict::Drop(DropReason::AclDeny));
        // A denied frame teaches nothing: mac(7) stays unknown.
        let now = p.now;
        assert_eq!(p.macs.lookup(0, 1, mac(7), now, u64::MAX), None);
        assert_eq!(
            p.macs.lookup(0, 1, mac(1), now, u64::MAX),
            Some((0, 0)),
            "an allowed one does"
        );
    }

    #[test]
    fn a_new_configuration_applies_at_the_next_turn() {
        let (h, mut p) = switch(2, vec![tenant("t1", &[(0, 0), (1, 0)], true)]);
        run(&mut p, 1, udp(2, BCAST, None, 53));
        assert_eq!(
            run(&mut p, 0, udp(1, mac(2), None, 53)).0,
            Verdict::Forward(Egress::to(1))
        );
        h.publish(&SwitchConfig {
            ports: 2,
            tenants: vec![tenant("t1", &[(0, 0), (1, 0)], false)],
            ..SwitchConfig::default()
        })
        .unwrap();
        // Until the worker's next turn the old snapshot holds.
        assert_eq!(
            run(&mut p, 0, udp(1, mac(2), None, 53)).0,
            Verdict::Forward(Egress::to(1))
        );
        p.turn();
        assert_eq!(
            run(&mut p, 0, udp(1, mac(2), None, 53)).0,
            Verdict::Drop(DropReason::AclDeny)
        );
        // A bad configuration changes nothing.
        let bad = SwitchConfig {
            ports: 2,
            tenants: vec![tenant("a", &[(0, 0)], true), tenant("b", &[(0, 5)], true)],
            ..SwitchConfig::default()
        };
        assert!(matches!(h.publish(&bad), Err(ConfigError::Overlap { .. })));
        let g = h.generation();
        p.turn();
        assert_eq!(p.generation, g);
    }

    #[test]
    fn the_handle_waits_until_every_pipeline_took_a_configuration() {
        let (h, mut p) = switch(2, vec![tenant("t1", &[(0, 0), (1, 0)], true)]);
        let mut q = h.pipeline_for(1);
        let gone = h.pipeline_for(2);
        assert!(h.taken(h.generation()), "they start with the current one");
        let g = h
            .publish(&SwitchConfig {
                ports: 2,
                tenants: vec![tenant("t1", &[(0, 0), (1, 0)], false)],
                ..SwitchConfig::default()
            })
            .unwrap()
            .generation;
        drop(gone);
        let waiter = {
            let h = h.clone();
            std::thread::spawn(move || h.wait_taken(g, Duration::from_secs(30)))
        };
        assert!(!h.wait_taken(g, Duration::from_millis(20)));
        p.turn();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished(), "one pipeline has not turned");
        assert!(!h.taken(g));
        q.turn();
        assert!(waiter.join().unwrap());
        assert!(h.taken(g));
        // Once every pipeline is gone there is nobody to wait for.
        drop((p, q));
        let h2 = SwitchHandle::new(&SwitchConfig::default()).unwrap();
        let g2 = h2.publish(&SwitchConfig::default()).unwrap().generation;
        assert!(h2.wait_taken(g2, Duration::ZERO));
    }

    #[test]
    fn bad_configurations_are_refused() {
        let cfg = |tenants| SwitchConfig {
            ports: 2,
            tenants,
            ..SwitchConfig::default()
        };
        let err = |c| Compiled::new(&c).unwrap_err();
        assert!(matches!(
            err(cfg(vec![tenant("a", &[(2, 0)], true)])),
            ConfigError::NoSuchPort { .. }
        ));
        assert!(matches!(
            err(cfg(vec![tenant("a", &[(0, 4095)], true)])),
            ConfigError::BadVlan { .. }
        ));
        assert!(matches!(
            err(cfg(vec![
                tenant("a", &[(0, 7)], true),
                tenant("b", &[(0, 7)], true)
            ])),
            ConfigError::Overlap { .. }
        ));
        assert!(matches!(
            err(cfg(vec![
                tenant("a", &[(0, 7)], true),
                tenant("b", &[(0, 0)], true)
            ])),
            ConfigError::Overlap { .. }
        ));
        let mut t = tenant("a", &[(0, 0)], true);
        let r = SwitchRule {
            id: "r".into(),
            matches: AclRule::any(1, 0, Family::Any),
            allow: true,
            stateful: false,
            rate_limit: None,
        };
        t.rules = vec![r.clone(), r];
        assert!(matches!(
            err(cfg(vec![t])),
            ConfigError::DuplicateOrder { .. }
        ));
    }

    /// Random tenants on random ports, VLANs and VXLAN networks, random
    /// frames from anywhere (forged tags, spoofed and broadcast MACs,
    /// VXLAN on any VNI from any remote VTEP): every output is an
    /// attachment of the input's tenant, never the input itself.
    #[test]
    fn random_traffic_never_leaves_its_tenant() {
        const VTEP: u32 = 0xc000_0201;
        const REMOTES: [u32; 2] = [0xc000_0202, 0xc000_0203];
        // Outputs into a tunnel, and out of one: both must be exercised.
        let (mut encapsulated, mut decapsulated) = (0, 0);
        let mut rng = crate::classify::tests::Rng(0x5eed);
        for round in 0..200 {
            let ports = 1 + rng.below(5) as usize;
            let mut used = std::collections::HashSet::new();
            let mut tenants = Vec::new();
            for t in 0..1 + rng.below(4) {
                let mut att = Vec::new();
                for _ in 0..1 + rng.below(4) {
                    let port = rng.below(ports as u64) as usize;
                    let vlan = [0u16, 10, 20, 30][rng.below(4) as usize];
                    let whole_taken = used.contains(&(port, 0));
                    let any_vlan = (1..4095).any(|v| used.contains(&(port, v)));
                    let ok =
                        !used.contains(&(port, vlan)) && !whole_taken && (vlan != 0 || !any_vlan);
                    if ok {
                        used.insert((port, vlan));
                        att.push((port, vlan));
                    }
                }
                let mut t = tenant(&format!("t{t}"), &att, rng.below(2) == 0);
                // VXLAN networks on port 0's VTEP, flooding to some of
                // two remote VTEPs.
                t.remote_vteps = vec![Vec::new(); t.attachments.len()];
                let vni = [100, 200, 300][rng.below(3) as usize];
                if rng.below(2) == 0 && used.insert((0, 5000 + vni as u16)) {
                    t.attachments.push(Attach {
                        port: 0,
                        vlan: 0,
                        vni,
                    });
                    let remotes = [REMOTES[0], REMOTES[1]];
                    let n = rng.below(3) as usize;
                    t.remote_vteps.push(remotes[..n].to_vec());
                }
                if rng.below(2) == 0 {
                    // Stateful DNS: replies pass only for the tenant that asked.
                    let mut dns = AclRule::any(1, 0, Family::V4);
                    dns.proto = (proto::UDP, proto::UDP);
                    dns.dst_port = (53, 53);
                    t.rules.push(SwitchRule {
                        id: "dns".into(),
                        matches: dns,
                        allow: true,
                        stateful: true,
                        rate_limit: None,
                    });
                }
                tenants.push(t);
            }
            let vteps = vtep_on_port_0(ports, VTEP);
            let h = SwitchHandle::new(&SwitchConfig {
                ports,
                vteps,
                tenants: tenants.clone(),
                ..SwitchConfig::default()
            })
            .unwrap();
            let mut p = h.pipeline();
            p.turn();
            // (tenant, client host) pairs that have asked 10.0.0.99.
            let mut asked = std::collections::HashSet::new();
            let vxlan_owner = |port: usize, vni: u32| -> Option<(usize, Attach)> {
                tenants.iter().enumerate().find_map(|(ti, t)| {
                    t.attachments
                        .iter()
                        .find(|a| a.port == port && a.vni == vni)
                        .map(|a| (ti, *a))
                })
            };
            let owner = |port: usize, vlan: Option<u16>| -> Option<(usize, Attach)> {
                tenants
                    .iter()
                    .enumerate()
                    .find_map(|(ti, t)| {
                        let a = t.attachments.iter().find(|a| {
                            a.port == port
                                && a.vni == 0
                                && vlan.is_some_and(|v| v == a.vlan && a.vlan != 0)
                        });
                        a.map(|a| (ti, *a))
                    })
                    .or_else(|| {
                        tenants.iter().enumerate().find_map(|(ti, t)| {
                            t.attachments
                                .iter()
                                .find(|a| a.port == port && a.vlan == 0 && a.vni == 0)
                                .map(|a| (ti, *a))
                        })
                    })
            };
            for _ in 0..200 {
                let port = rng.below(ports as u64) as usize;
                let vlan = [None, Some(10), Some(20), Some(30), Some(40)][rng.below(5) as usize];
                let dst = if rng.below(3) == 0 {
                    BCAST
                } else {
                    mac(rng.below(6) as u8)
                };
                let src = rng.below(6) as u8;
                // A question from host `src`, or an answer to host `peer`.
                let peer = rng.below(6) as u8;
                let answer = rng.below(2) == 0;
                let frame = if answer {
                    build::udp4(
                        mac(src),
                        dst,
                        vlan,
                        [10, 0, 0, 99],
                        [10, 0, 0, peer],
                        53,
                        5000,
                    )
                } else {
                    udp(src, dst, vlan, 53)
                };
                // Some frames come through port 0's VTEP, from a remote
                // VTEP, on a VNI that may be nobody's.
                let vni = [0, 0, 100, 200, 300, 400][rng.below(6) as usize];
                let (port, frame) = if vni == 0 {
                    (port, frame)
                } else {
                    let mut f = crate::io::memory::MemPacket(frame);
                    let t = Tunnel {
                        src_mac: mac(0xbb),
                        dst_mac: mac(0xaa),
                        src_ip: REMOTES[rng.below(2) as usize],
                        dst_ip: VTEP,
                        vni,
                        resolve: false,
                    };
                    assert!(crate::worker::apply_tunnel(&mut f, &t));
                    (0, f.0)
                };
                let ingress = if vni == 0 {
                    owner(port, vlan)
                } else {
                    vxlan_owner(0, vni)
                };
                let (v, flood) = run(&mut p, port, frame);
                if let Some((ti, _)) = ingress {
                    let t = &tenants[ti];
                    if !t.default_allow && !t.rules.is_empty() {
                        let passed = !matches!(v, Verdict::Drop(_));
                        if answer {
                            assert_eq!(
                                passed,
                                asked.contains(&(ti, peer)),
                                "round {round}: tenant {ti}'s answer to {peer}"
                            );
                        } else {
                            assert!(passed, "round {round}: tenant {ti}'s question");
                            asked.insert((ti, src));
                        }
                    }
                }
                let outs = match v {
                    Verdict::Forward(e) => vec![e],
                    Verdict::Flood => flood,
                    Verdict::Drop(_) => continue,
                };
                let (ti, from) = ingress
                    .unwrap_or_else(|| panic!("round {round}: forwarded from nobody's port"));
                for e in outs {
                    let out_tag = match e.vlan {
                        VlanOp::Keep => vlan,
                        VlanOp::Strip => None,
                        VlanOp::Push(v) | VlanOp::Set(v) => Some(v),
                    };
                    assert_eq!(e.decap > 0, vni != 0, "round {round}: {e:?}");
                    encapsulated += usize::from(e.tunnel.is_some());
                    decapsulated += usize::from(e.decap > 0);
                    let (to, at) = match e.tunnel {
                        Some(t) => {
                            assert!(REMOTES.contains(&t.dst_ip), "round {round}: {t:?}");
                            vxlan_owner(e.port, t.vni)
                        }
                        None => owner(e.port, out_tag),
                    }
                    .expect("output attached to nobody");
                    assert_eq!(to, ti, "round {round}: tenant {ti} leaked to tenant {to}");
                    assert_ne!(at, from, "round {round}: sent back where it came from");
                }
            }
        }
        assert!(
            encapsulated > 100 && decapsulated > 100,
            "{encapsulated} {decapsulated}"
        );
    }

    /// Per port of `ports`: a VTEP with address `ip` (MAC 0xaa) on port 0.
    fn vtep_on_port_0(ports: usize, ip: u32) -> Vec<Option<Vtep>> {
        let mut vteps = vec![None; ports];
        vteps[0] = Some(Vtep { ip, mac: mac(0xaa) });
        vteps
    }

    /// A pipeline given whole bursts decides exactly what it decides
    /// frame by frame: verdicts, outputs, rewritten bytes and tenant
    /// counters, with connections opened, closed and refused inside a
    /// burst, MAC learning, VTEP neighbours, flow-cached tenants, tenants
    /// switched at the link layer (decided by header from memory) and
    /// bursts longer than [`BURST`].
    #[test]
    fn bursts_decide_like_frames_one_by_one() {
        use crate::conntrack::{ACK, FIN, RST, SYN};
        use crate::parse::tests::build::{arp, eth, ipv4, tcp};
        use crate::parse::ETH_IPV4;
        const VTEP: u32 = 0xc000_0201;
        const REMOTE: u32 = 0xc000_0202;
        let mut rng = crate::classify::tests::Rng(0xb0b5);
        let mut seen = std::collections::HashMap::<String, usize>::new();
        let mut recalled = [0; 2];
        for round in 0..60 {
            let ports = 4;
            // Some rounds: tenant 0 switches at the link layer; in half of
            // them no tenant tracks connections.
            let plain = round % 3 == 2;
            let stateless = round % 6 == 2;
            let mut tenants = Vec::new();
            for (ti, att) in [
                vec![(0, 10), (1, 0), (3, 10)],
                vec![(0, 20), (2, 0), (3, 20)],
            ]
            .into_iter()
            .enumerate()
            {
                let mut t = tenant(&format!("t{ti}"), &att, rng.below(3) == 0);
                t.attachments.push(Attach {
                    port: 0,
                    vlan: 0,
                    vni: 100 + ti as u32,
                });
                t.remote_vteps = vec![Vec::new(), Vec::new(), Vec::new(), vec![REMOTE]];
                let mut web = AclRule::any(10, 0, Family::V4);
                web.proto = (proto::TCP, proto::TCP);
                web.dst_port = (80, 80);
                web.src = AclRule::prefix_range(0x0a00_0000, 29, 32);
                let mut seven = AclRule::any(20, 0, Family::V4);
                seven.proto = (proto::UDP, proto::UDP);
                seven.dst_port = (7, 7);
                let mut dns = AclRule::any(30, 0, Family::V4);
                dns.proto = (proto::UDP, proto::UDP);
                dns.dst_port = (53, 53);
                let mut echo = AclRule::any(40, 0, Family::V4);
                echo.proto = (proto::ICMP, proto::ICMP);
                echo.src_port = (8, 8);
                for (id, m, allow, stateful) in [
                    ("web", web, true, rng.below(4) != 0),
                    ("seven", seven, false, false),
                    ("dns", dns, true, rng.below(2) == 0),
                    ("echo", echo, true, true),
                ] {
                    t.rules.push(SwitchRule {
                        id: id.into(),
                        matches: m,
                        allow,
                        stateful,
                        rate_limit: None,
                    });
                }
                // Enough rules for the flow cache, in some rounds.
                if ti == 1 && round % 2 == 0 {
                    for i in 0..FLOW_CACHE_MIN_RULES as u32 {
                        let mut m = AclRule::any(100 + i, 0, Family::V4);
                        m.src = AclRule::prefix_range(u128::from(0xc0a8_0000 | i), 32, 32);
                        t.rules.push(SwitchRule {
                            id: format!("f{i}"),
                            matches: m,
                            allow: false,
                            stateful: false,
                            rate_limit: None,
                        });
                    }
                }
                if plain && ti == 0 {
                    t.rules.clear();
                    t.default_allow = true;
                }
                if stateless {
                    t.rules.iter_mut().for_each(|r| r.stateful = false);
                }
                tenants.push(t);
            }
            let vteps = vtep_on_port_0(ports, VTEP);
            let config = SwitchConfig {
                ports,
                vteps,
                tenants,
                flow_cache_entries: 4096,
                ..SwitchConfig::default()
            };
            let (ha, hb) = (
                SwitchHandle::new(&config).unwrap(),
                SwitchHandle::new(&config).unwrap(),
            );
            let (mut one, mut burst) = (ha.pipeline(), hb.pipeline());
            one.turn();
            burst.turn();
            for turn in 0..40 {
                let port = rng.below(ports as u64) as usize;
                let n = 1 + rng.below(2 * BURST as u64 + 8) as usize;
                let frames: Vec<Vec<u8>> = (0..n)
                    .map(|_| {
                        let (a, z) = if plain && port % 2 == 1 && rng.below(4) != 0 {
                            // Two hosts of the link-layer tenant talking
                            // to two behind port 0: headers that repeat.
                            (11 + rng.below(2) as u8, 1 + rng.below(2) as u8)
                        } else {
                            (1 + rng.below(6) as u8, 1 + rng.below(6) as u8)
                        };
                        let ip = |h: u8| [10, 0, 0, h];
                        let dst = if rng.below(4) == 0 { BCAST } else { mac(z) };
                        let vlan = match port {
                            0 => [None, Some(10), Some(20)][rng.below(3) as usize],
                            3 => [Some(10), Some(10), Some(20)][rng.below(3) as usize],
                            _ => None,
                        };
                        let (sp, dp) = if rng.below(2) == 0 {
                            (40000, [80, 53, 7][rng.below(3) as usize])
                        } else {
                            ([80, 53, 7][rng.below(3) as usize], 40000)
                        };
                        let mut f = match rng.below(9) {
                            0..=3 => {
                                let flags =
                                    [SYN, SYN | ACK, ACK, RST, FIN | ACK][rng.below(5) as usize];
                                let mut f = eth(dst, mac(a), vlan, ETH_IPV4);
                                f.extend(ipv4(ip(a), ip(z), proto::TCP, &tcp(sp, dp, flags)));
                                f
                            }
                            4 | 5 => build::udp4(mac(a), dst, vlan, ip(a), ip(z), sp, dp),
                            6 => {
                                let ty = [8, 0][rng.below(2) as usize];
                                let mut f = eth(dst, mac(a), vlan, ETH_IPV4);
                                f.extend(ipv4(
                                    ip(a),
                                    ip(z),
                                    proto::ICMP,
                                    &[ty, 0, 0, 0, 0, 7, 0, 1],
                                ));
                                f
                            }
                            7 => arp(
                                mac(a),
                                BCAST,
                                None,
                                1 + rng.below(2) as u16,
                                ip(a),
                                [192, 0, 2, 1],
                            ),
                            _ => {
                                let mut f = build::udp4(mac(a), dst, vlan, ip(a), ip(z), sp, dp);
                                f.truncate(rng.below(40) as usize);
                                f
                            }
                        };
                        if port == 0 && rng.below(3) == 0 {
                            let mut p = crate::io::memory::MemPacket(f);
                            let t = Tunnel {
                                src_mac: mac(0xbb),
                                dst_mac: mac(0xaa),
                                src_ip: REMOTE,
                                dst_ip: VTEP,
                                vni: [100, 101, 102][rng.below(3) as usize],
                                resolve: false,
                            };
                            assert!(crate::worker::apply_tunnel(&mut p, &t));
                            f = p.0;
                        }
                        f
                    })
                    .collect();
                let mut a = frames.clone();
                let expected: Vec<(Verdict, Vec<Egress>)> = a
                    .iter_mut()
                    .map(|f| {
                        let mut flood = Vec::new();
                        (one.process(port, f, &mut flood), flood)
                    })
                    .collect();
                let mut b: Vec<_> = frames
                    .iter()
                    .map(|f| crate::io::memory::MemPacket(f.clone()))
                    .collect();
                let mut flood = Vec::new();
                let mut got = Vec::new();
                burst.process_burst(port, &mut b, &mut flood, |pkt, v, flood| {
                    got.push((pkt.0, *v, flood.to_vec()));
                });
                assert!(b.is_empty());
                assert_eq!(got.len(), n);
                for (i, ((v, flood), (bytes, bv, bflood))) in expected.iter().zip(&got).enumerate()
                {
                    let at = format!("round {round} burst {turn} frame {i}/{n}");
                    assert_eq!((bv, bflood), (v, flood), "{at}");
                    assert_eq!(&a[i], bytes, "{at}: bytes");
                    *seen
                        .entry(format!("{v:?}").chars().take(20).collect())
                        .or_default() += 1;
                }
            }
            assert_eq!(
                ha.traffic().tenants,
                hb.traffic().tenants,
                "round {round}: counters"
            );
            recalled[usize::from(stateless)] += burst.memo.hits.get();
        }
        // Through both ways a burst goes, many times.
        assert!(
            recalled.iter().all(|&n| n > 100),
            "decided from memory: {recalled:?}"
        );
        // Every kind of decision was compared, many times.
        for kind in [
            "Forward",
            "Flood",
            "Drop(AclDeny)",
            "Drop(ConntrackInva",
            "Drop(NoTenant)",
            "Drop(Malformed)",
        ] {
            let n = seen
                .iter()
                .filter(|(k, _)| k.starts_with(kind))
                .map(|(_, n)| n)
                .sum::<usize>();
            assert!(n > 50, "{kind}: {n} in {seen:?}");
        }
    }

    mod stateful {
        use super::*;
        use crate::conntrack::{ACK, FIN, RST, SYN};
        use crate::parse::tests::build::{eth, ipv4, tcp};
        use crate::parse::ETH_IPV4;

        /// Client 10.0.0.1 (MAC 1) and server 10.0.0.2 (MAC 2).
        const CLIENT: [u8; 4] = [10, 0, 0, 1];
        const SERVER: [u8; 4] = [10, 0, 0, 2];

        fn tcp4(from: u8, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
            let (src, dst) = if from == 1 {
                (CLIENT, SERVER)
            } else {
                (SERVER, CLIENT)
            };
            let mut f = eth(mac(3 - from), mac(from), None, ETH_IPV4);
            f.extend(ipv4(src, dst, proto::TCP, &tcp(sport, dport, flags)));
            f
        }

        fn udp4(from: u8, sport: u16, dport: u16) -> Vec<u8> {
            let (src, dst) = if from == 1 {
                (CLIENT, SERVER)
            } else {
                (SERVER, CLIENT)
            };
            build::udp4(mac(from), mac(3 - from), None, src, dst, sport, dport)
        }

        fn ping(from: u8, request: bool, id: u16) -> Vec<u8> {
            let (src, dst) = if from == 1 {
                (CLIENT, SERVER)
            } else {
                (SERVER, CLIENT)
            };
            let [hi, lo] = id.to_be_bytes();
            let ty = if request { 8 } else { 0 };
            let mut f = eth(mac(3 - from), mac(from), None, ETH_IPV4);
            f.extend(ipv4(src, dst, proto::ICMP, &[ty, 0, 0, 0, hi, lo, 0, 1]));
            f
        }

        /// Stateful allows from the client (port 0) to the server (port
        /// 1): TCP to port 80, UDP to port 53, ICMP echo requests.
        fn rules() -> Vec<SwitchRule> {
            let client = AclRule::prefix_range(0x0a00_0001, 32, 32);
            let mut web = AclRule::any(10, 0, Family::V4);
            web.src = client;
            web.proto = (proto::TCP, proto::TCP);
            web.dst_port = (80, 80);
            let mut dns = AclRule::any(20, 0, Family::V4);
            dns.src = client;
            dns.proto = (proto::UDP, proto::UDP);
            dns.dst_port = (53, 53);
            let mut echo = AclRule::any(30, 0, Family::V4);
            echo.src = client;
            echo.proto = (proto::ICMP, proto::ICMP);
            echo.src_port = (8, 8);
            [("web", web), ("dns", dns), ("echo", echo)]
                .into_iter()
                .map(|(id, matches)| SwitchRule {
                    id: id.into(),
                    matches,
                    allow: true,
                    stateful: true,
                    rate_limit: None,
                })
                .collect()
        }

        fn config(tenants: Vec<TenantConfig>) -> SwitchConfig {
            SwitchConfig {
                ports: 4,
                tenants,
                ..SwitchConfig::default()
            }
        }

        /// Tenant "a" on ports 0 (client) and 1 (server), default deny;
        /// tenant "b" on ports 2 and 3 with the same addresses, no rules.
        fn setup() -> (SwitchHandle, SwitchPipeline, TenantConfig) {
            let mut a = tenant("a", &[(0, 0), (1, 0)], false);
            a.rules = rules();
            let b = tenant("b", &[(2, 0), (3, 0)], false);
            let (h, p) = switch(4, vec![a.clone(), b]);
            (h, p, a)
        }

        fn passes(p: &mut SwitchPipeline, port: usize, f: Vec<u8>) -> Result<(), DropReason> {
            match run(p, port, f).0 {
                Verdict::Drop(r) => Err(r),
                _ => Ok(()),
            }
        }

        #[test]
        fn replies_of_allowed_connections_pass_and_nothing_else() {
            let (h, mut p, _) = setup();
            use DropReason::{AclDeny, ConntrackInvalid};
            // Nothing from the server side opens anything.
            assert_eq!(
                passes(&mut p, 1, tcp4(2, 80, 40000, SYN | ACK)),
                Err(AclDeny)
            );
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, ACK)), Err(AclDeny));
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, RST)), Err(AclDeny));
            // A lone ACK or RST toward the allowed port opens nothing either.
            assert_eq!(
                passes(&mut p, 0, tcp4(1, 40000, 80, ACK)),
                Err(ConntrackInvalid)
            );
            assert_eq!(
                passes(&mut p, 0, tcp4(1, 40000, 80, RST)),
                Err(ConntrackInvalid)
            );
            assert_eq!(p.conns.len(), 0);

            // A handshake, data both ways, a close.
            assert_eq!(passes(&mut p, 0, tcp4(1, 40000, 80, SYN)), Ok(()));
            assert_eq!(
                passes(&mut p, 1, tcp4(2, 80, 40000, ACK)),
                Err(ConntrackInvalid)
            );
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, SYN | ACK)), Ok(()));
            assert_eq!(passes(&mut p, 0, tcp4(1, 40000, 80, ACK)), Ok(()));
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, ACK)), Ok(()));
            assert_eq!(passes(&mut p, 0, tcp4(1, 40000, 80, FIN | ACK)), Ok(()));
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, FIN | ACK)), Ok(()));
            assert_eq!(passes(&mut p, 0, tcp4(1, 40000, 80, ACK)), Ok(()));
            // Another port of the same hosts is not part of it.
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40001, ACK)), Err(AclDeny));
            assert_eq!(passes(&mut p, 1, tcp4(2, 22, 40000, ACK)), Err(AclDeny));

            // UDP: the reply passes, the server cannot start its own flow.
            assert_eq!(passes(&mut p, 0, udp4(1, 5353, 53)), Ok(()));
            assert_eq!(passes(&mut p, 1, udp4(2, 53, 5353)), Ok(()));
            assert_eq!(passes(&mut p, 1, udp4(2, 53, 5354)), Err(AclDeny));
            // ICMP echo: the reply with the request's identifier passes.
            assert_eq!(passes(&mut p, 0, ping(1, true, 7)), Ok(()));
            assert_eq!(passes(&mut p, 1, ping(2, false, 7)), Ok(()));
            assert_eq!(passes(&mut p, 1, ping(2, false, 8)), Err(AclDeny));
            assert_eq!(passes(&mut p, 1, ping(2, true, 7)), Err(AclDeny));

            // Tenant "b" has hosts with the same addresses: a's connections
            // do nothing for it.
            assert_eq!(passes(&mut p, 3, udp4(2, 53, 5353)), Err(AclDeny));
            assert_eq!(passes(&mut p, 3, ping(2, false, 7)), Err(AclDeny));

            p.store_gauges();
            let t = h.traffic();
            assert_eq!(t.tenants["a"].conntrack_entries, 3);
            assert_eq!(t.tenants["b"].conntrack_entries, 0);
            assert_eq!(t.rules[&("a".to_string(), "web".to_string())].packets, 3);
        }

        #[test]
        fn a_rule_change_keeps_only_connections_the_new_rules_open() {
            let (h, mut p, a) = setup();
            assert_eq!(passes(&mut p, 0, udp4(1, 5353, 53)), Ok(()));
            assert_eq!(passes(&mut p, 0, tcp4(1, 40000, 80, SYN)), Ok(()));
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, SYN | ACK)), Ok(()));
            assert_eq!(passes(&mut p, 0, tcp4(1, 40000, 80, ACK)), Ok(()));

            // A new rule in front that leaves both allowed: both stay.
            let mut a2 = a.clone();
            let mut ssh = AclRule::any(1, 0, Family::V4);
            ssh.proto = (proto::TCP, proto::TCP);
            ssh.dst_port = (22, 22);
            a2.rules.push(SwitchRule {
                id: "no-ssh".into(),
                matches: ssh,
                allow: false,
                stateful: false,
                rate_limit: None,
            });
            let b = tenant("b", &[(2, 0), (3, 0)], false);
            h.publish(&config(vec![a2.clone(), b.clone()])).unwrap();
            p.turn();
            assert_eq!(passes(&mut p, 1, udp4(2, 53, 5353)), Ok(()));
            assert_eq!(passes(&mut p, 1, tcp4(2, 80, 40000, ACK)), Ok(()));

            // "web" goes: its connection goes with it, mid-stream, both
            // ways; DNS stays.
            a2.rules.retain(|r| r.id != "web");
            h.publish(&config(vec![a2, b])).unwrap();
            p.turn();
            assert_eq!(
                passes(&mut p, 1, tcp4(2, 80, 40000, ACK)),
                Err(DropReason::AclDeny)
            );
            assert_eq!(
                passes(&mut p, 0, tcp4(1, 40000, 80, ACK)),
                Err(DropReason::AclDeny)
            );
            assert_eq!(passes(&mut p, 1, udp4(2, 53, 5353)), Ok(()));
            assert_eq!(p.conns.len(), 1);
        }

        #[test]
        fn a_full_tenant_table_refuses_only_that_tenant() {
            let mut a = tenant("a", &[(0, 0), (1, 0)], false);
            a.rules = rules();
            // The same rules, for a tenant on ports 2 and 3.
            let mut b = tenant("b", &[(2, 0), (3, 0)], false);
            b.rules = rules();
            let h = SwitchHandle::new(&SwitchConfig {
                conntrack_per_tenant: 3,
                conntrack_max: 100,
                ..config(vec![a, b])
            })
            .unwrap();
            let mut p = h.pipeline();
            p.turn();
            for port in 0..3 {
                assert_eq!(passes(&mut p, 0, udp4(1, 6000 + port, 53)), Ok(()));
            }
            assert_eq!(
                passes(&mut p, 0, udp4(1, 6003, 53)),
                Err(DropReason::TableFull)
            );
            // Its existing connections still work; tenant "b" still opens.
            assert_eq!(passes(&mut p, 1, udp4(2, 53, 6000)), Ok(()));
            assert_eq!(passes(&mut p, 2, udp4(1, 6003, 53)), Ok(()));
            assert_eq!(passes(&mut p, 3, udp4(2, 53, 6003)), Ok(()));
        }

        #[test]
        fn removed_tenants_and_rules_free_their_connections() {
            let (h, mut p, a) = setup();
            for port in 0..10 {
                assert_eq!(passes(&mut p, 0, udp4(1, 6000 + port, 53)), Ok(()));
            }
            assert_eq!(p.conns.len(), 10);
            // Same tenant, no stateful rule left: the sweep frees them.
            let mut a2 = a.clone();
            for r in &mut a2.rules {
                r.stateful = false;
            }
            h.publish(&config(vec![a2])).unwrap();
            // The sweep walks the table a few buckets per turn.
            let mut turns = 0;
            while !p.conns.is_empty() && turns < 100_000 {
                p.turn();
                turns += 1;
            }
            assert_eq!(p.conns.len(), 0);
            p.store_gauges();
            assert_eq!(h.traffic().tenants["a"].conntrack_entries, 0);
        }
    }
}
