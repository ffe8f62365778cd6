//! The isolation property of the switch, as a model shared by the
//! property test (`tests/isolation/main.rs`) and the `isolation` fuzz
//! target: a random multi-tenant configuration, compiled once, and a
//! stream of random frames pushed through it, each checked against what
//! the configuration allows.
//!
//! A configuration has a VTEP on port 0 and two to five tenants with
//! port, VLAN and VXLAN attachments. Every tenant uses the same station
//! addresses (overlapping IPv4 space), remote VTEPs are shared between
//! tenants, about half the plain attachments have anti-spoofing guards,
//! and each tenant has a few random stateless and stateful rules. Tenant
//! 0 is *quiet*: its stations only ever use their own addresses, and its
//! learned stations are the state another tenant must never evict. The
//! others are *noisy*: random source MACs (MAC floods), other tenants'
//! MACs, spoofed addresses, stacked tags (802.1Q in 802.1Q, QinQ, MPLS,
//! PPPoE), IPv4 and IPv6 fragments in any order, VXLAN from configured
//! and unconfigured underlay sources, for their own VNIs and others'.
//!
//! After each frame the oracle checks:
//! - every output is an attachment of one tenant, and that tenant owns
//!   where the frame came in (its port and outer tag, or its VNI *and* a
//!   remote VTEP or underlay range of that VNI as outer source); never the
//!   attachment it came from; no output twice;
//! - tunnelled outputs go only to remote VTEPs the destination
//!   attachment names or accepts;
//! - a frame entering a guarded attachment leaves only if its source MAC
//!   and every IPv4/IPv6/ARP source address inside it, whatever the tags
//!   or encapsulation in front, is one the guard allows;
//! - a quiet tenant's learned station stays learned: a unicast frame to
//!   it from another of the tenant's stations is never flooded, whatever
//!   the noisy tenants sent in between.

#![allow(dead_code)]

use std::collections::HashMap;

use dpu_dataplane::classify::{AclRule, Family};
use dpu_dataplane::switch::{
    Attach, Guard, SwitchConfig, SwitchPipeline, SwitchRule, TenantConfig, Vtep,
};
use dpu_dataplane::wire::{
    self, proto, vtep_frame, VtepFrame, ETH_ARP, ETH_IPV4, ETH_IPV6, VXLAN_UDP_PORT,
};
use dpu_dataplane::worker::{Egress, Pipeline, Verdict, VlanOp};
pub use dpu_rand::Rng;

/// The uplink with the VTEP.
pub const VTEP_PORT: usize = 0;
/// The VTEP's address (192.0.2.1) and MAC address.
pub const VTEP_IP: u32 = 0xc000_0201;
pub const VTEP_MAC: [u8; 6] = [2, 0xee, 0, 0, 0, 1];
/// Remote VTEPs attachments may name: 192.0.2.10 .. 192.0.2.17.
pub const REMOTE_POOL: u32 = 0xc000_020a;
pub const REMOTES: u32 = 8;
/// Underlay sources no attachment names as a remote VTEP (192.0.2.100 ..
/// 192.0.2.103); some attachments accept the first two as a range.
pub const STRANGERS: u32 = 0xc000_0264;
/// Frames of each stream before the quiet tenant's stations speak.
pub const FLOOD_FIRST: u64 = 1000;
/// VLANs attachments may use, and VNIs.
const VLANS: [u16; 4] = [10, 20, 30, 40];
const VNIS: [u32; 5] = [100, 200, 300, 400, 500];

/// A source of randomness: a seeded generator for the property test, the
/// fuzzer's bytes for the fuzz target.
pub trait Source {
    /// The next 64 random bits; `None` once the source is used up.
    fn next(&mut self) -> Option<u64>;
}

/// The property test's source: the workspace's seeded generator, which
/// never runs dry.
impl Source for Rng {
    fn next(&mut self) -> Option<u64> {
        Some(self.next_u64())
    }
}

/// The fuzzer's input, eight bytes at a time (the last word zero-padded).
pub struct Bytes<'a>(pub &'a [u8]);

impl Source for Bytes<'_> {
    fn next(&mut self) -> Option<u64> {
        if self.0.is_empty() {
            return None;
        }
        let n = self.0.len().min(8);
        let mut w = [0u8; 8];
        w[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Some(u64::from_le_bytes(w))
    }
}

/// Draws from a [`Source`], with the helpers the generators need.
pub struct Draw<'s, S: Source> {
    src: &'s mut S,
    word: u64,
    bits: u32,
    /// The source ran dry.
    pub done: bool,
}

impl<'s, S: Source> Draw<'s, S> {
    pub fn new(src: &'s mut S) -> Self {
        Draw {
            src,
            word: 0,
            bits: 0,
            done: false,
        }
    }

    /// A number in `0..n` (n ≤ 2^16).
    pub fn below(&mut self, n: u32) -> u32 {
        if self.bits < 16 {
            match self.src.next() {
                Some(w) => self.word = w,
                None => {
                    self.done = true;
                    self.word = 0;
                }
            }
            self.bits = 64;
        }
        let v = (self.word & 0xffff) as u32;
        self.word >>= 16;
        self.bits -= 16;
        v % n.max(1)
    }

    /// True with probability `p` percent.
    pub fn pct(&mut self, p: u32) -> bool {
        self.below(100) < p
    }

    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u32) as usize]
    }

    pub fn u16(&mut self) -> u16 {
        self.below(1 << 16) as u16
    }
}

/// One station of an attachment: its MAC and IPv4 address (the same
/// addresses in every tenant) and IPv6 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Station {
    pub mac: [u8; 6],
    pub v4: u32,
    pub v6: u128,
}

/// Station `k` (0 or 1) of attachment `a` of tenant `t`.
pub fn station(t: usize, a: usize, k: usize) -> Station {
    let host = (a * 4 + k + 1) as u32;
    Station {
        mac: [2, 0x10 + t as u8, a as u8, 0, 0, k as u8 + 1],
        v4: 0x0a00_0000 | host,
        v6: (0xfd00_u128 << 112) | u128::from(host),
    }
}

/// A random multi-tenant configuration and what the oracle keeps across
/// frames.
pub struct World {
    pub cfg: SwitchConfig,
    /// Tenants whose stations keep to their own addresses (tenant 0).
    pub quiet: Vec<bool>,
    /// Learned stations of quiet tenants: (tenant, attachment) of each
    /// anchor MAC seen entering (and not dropped).
    learned: HashMap<(usize, [u8; 6]), usize>,
    /// What the stream did, for the report.
    pub stats: Stats,
    /// The first violations found (all are counted in `stats`).
    pub violations: Vec<String>,
}

/// Counts of what a run did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub frames: u64,
    pub forwarded: u64,
    pub flooded: u64,
    pub dropped: u64,
    pub vxlan: u64,
    pub stacked: u64,
    pub fragments: u64,
    pub probes: u64,
    pub violations: u64,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Stats) {
        self.frames += o.frames;
        self.forwarded += o.forwarded;
        self.flooded += o.flooded;
        self.dropped += o.dropped;
        self.vxlan += o.vxlan;
        self.stacked += o.stacked;
        self.fragments += o.fragments;
        self.probes += o.probes;
        self.violations += o.violations;
    }
}

/// What the generator put in a frame, for the oracle.
#[derive(Debug, Clone, Default)]
pub struct Meta {
    /// The (tenant, attachment) the frame belongs to by configuration, if
    /// any: the owner of its port and outer tag, or of its VNI when a
    /// configured remote VTEP of that VNI sent it.
    pub owner: Option<(usize, usize)>,
    /// It came in VXLAN, from an outer source not configured for its VNI
    /// (or for a VNI nobody has): it must not be switched.
    pub rogue_vxlan: bool,
    /// It is addressed to the VTEP itself (ARP for its address).
    pub to_vtep: bool,
    /// Source MAC of the (inner) frame.
    pub src_mac: [u8; 6],
    /// Every network-layer source inside, wherever it sits: IPv4 (also
    /// ARP's sender) and IPv6.
    pub v4_src: Option<u32>,
    pub v6_src: Option<u128>,
    pub arp_sender_mac: Option<[u8; 6]>,
    /// A unicast probe of a quiet tenant's learned station: the
    /// attachment the destination was learned on.
    pub probe_to: Option<usize>,
    /// An anchor announcing itself: (tenant, attachment, MAC).
    pub anchor: Option<(usize, usize, [u8; 6])>,
}

/// Tags and encapsulations in front of the network layer.
#[derive(Debug, Clone, Copy)]
enum Outer {
    None,
    Dot1q(u16),
    QinQ(u16),
}

#[derive(Debug, Clone, Copy)]
enum Inner {
    None,
    Dot1q(u16),
    Mpls,
    Pppoe,
}

/// The network layer of a frame.
#[derive(Debug, Clone, Copy)]
enum Payload {
    V4 {
        src: u32,
        dst: u32,
        proto: u8,
        /// Fragment offset in 8-byte units, and more-fragments.
        offset: u16,
        more: bool,
        id: u16,
        /// Bytes of layer-4 data after the IP header.
        l4_len: usize,
    },
    V6 {
        src: u128,
        dst: u128,
        proto: u8,
        /// A fragment header: offset, more-fragments.
        frag: Option<(u16, bool)>,
    },
    Arp {
        op: u16,
        sender_mac: [u8; 6],
        sender_ip: u32,
        target_ip: u32,
    },
    Other,
}

impl World {
    /// A random configuration from `d`.
    pub fn random<S: Source>(d: &mut Draw<S>) -> World {
        let ports = 4 + d.below(4) as usize;
        let tenants = 2 + d.below(4) as usize;
        // Free (port, vlan) and VNI slots.
        let mut used_port: Vec<Option<bool>> = vec![None; ports]; // Some(true): whole port
        let mut used_vlan: Vec<Vec<u16>> = vec![Vec::new(); ports];
        let mut used_vni: Vec<u32> = Vec::new();
        let mut cfg_tenants = Vec::new();
        for t in 0..tenants {
            let mut tc = TenantConfig {
                name: format!("t{t}"),
                default_allow: d.pct(50),
                ..TenantConfig::default()
            };
            // The quiet tenant needs two plain attachments for its probes.
            let want = if t == 0 {
                2 + d.below(2)
            } else {
                1 + d.below(4)
            };
            let mut tries = 0;
            while tc.attachments.len() < want as usize && tries < 40 {
                tries += 1;
                let kind = d.below(10);
                if kind < 3 && t != 0 || (t == 0 && kind < 1) {
                    let vni = *d.pick(&VNIS);
                    if used_vni.contains(&vni) {
                        continue;
                    }
                    used_vni.push(vni);
                    tc.attachments.push(Attach {
                        port: VTEP_PORT,
                        vlan: 0,
                        vni,
                    });
                    let n = 1 + d.below(3);
                    let mut remotes: Vec<u32> = Vec::new();
                    for _ in 0..n {
                        let r = REMOTE_POOL + d.below(REMOTES);
                        if !remotes.contains(&r) {
                            remotes.push(r);
                        }
                    }
                    tc.remote_vteps.resize(tc.attachments.len() - 1, Vec::new());
                    tc.remote_vteps.push(remotes);
                    // Now and then an underlay range its VTEPs may also
                    // send from: half the stranger pool.
                    tc.vtep_prefixes
                        .resize(tc.attachments.len() - 1, Vec::new());
                    tc.vtep_prefixes.push(if d.pct(30) {
                        vec![(STRANGERS, STRANGERS + 1)]
                    } else {
                        Vec::new()
                    });
                    continue;
                }
                let port = d.below(ports as u32) as usize;
                let whole = port != VTEP_PORT && d.pct(40);
                if whole {
                    if used_port[port].is_some() {
                        continue;
                    }
                    used_port[port] = Some(true);
                    tc.attachments.push(Attach::port(port, 0));
                } else {
                    let vlan = *d.pick(&VLANS);
                    if used_port[port] == Some(true) || used_vlan[port].contains(&vlan) {
                        continue;
                    }
                    used_port[port] = Some(false);
                    used_vlan[port].push(vlan);
                    tc.attachments.push(Attach::port(port, vlan));
                }
            }
            if t == 0
                && tc.attachments.iter().filter(|a| a.vni == 0).count() < 2
                && !tc.attachments.is_empty()
            {
                // Not enough room for the quiet tenant: make a small world.
            }
            tc.remote_vteps.resize(tc.attachments.len(), Vec::new());
            tc.vtep_prefixes.resize(tc.attachments.len(), Vec::new());
            // Guards on about half the plain attachments.
            let mut guards = Vec::new();
            for (a, at) in tc.attachments.iter().enumerate() {
                if at.vni != 0 || !d.pct(50) {
                    guards.push(Guard::default());
                    continue;
                }
                let s = [station(t, a, 0), station(t, a, 1)];
                let mut g = Guard::default();
                if d.pct(80) {
                    g.macs = s.iter().map(|s| s.mac).collect();
                }
                if d.pct(80) {
                    g.v4 = vec![(s[0].v4, s[1].v4)];
                    if d.pct(50) {
                        g.v6 = vec![(s[0].v6, s[1].v6)];
                    }
                }
                guards.push(g);
            }
            tc.guards = guards;
            tc.rules = random_rules(d).into();
            cfg_tenants.push(tc);
        }
        let mut vteps = vec![None; ports];
        vteps[VTEP_PORT] = Some(Vtep {
            ip: VTEP_IP,
            mac: VTEP_MAC,
        });
        let quiet = (0..tenants)
            .map(|t| {
                t == 0
                    && cfg_tenants[0]
                        .attachments
                        .iter()
                        .filter(|a| a.vni == 0)
                        .count()
                        >= 2
            })
            .collect();
        let table = 16 + d.below(48) as usize;
        let cfg = SwitchConfig {
            ports,
            vteps,
            tenants: cfg_tenants,
            // A small table, a small reserve: the others' floods press
            // on the quiet tenant's stations.
            mac_table_size: table,
            mac_per_tenant: table,
            mac_per_attachment: table,
            mac_reserved_per_tenant: 4 + d.below(8) as usize,
            conntrack_max: 256,
            conntrack_per_tenant: 64,
            ..SwitchConfig::default()
        };
        World {
            cfg,
            quiet,
            learned: HashMap::new(),
            stats: Stats::default(),
            violations: Vec::new(),
        }
    }

    /// The (tenant, attachment) owning `port` with outer tag `vlan`.
    pub fn owner(&self, port: usize, vlan: Option<u16>) -> Option<(usize, usize)> {
        let find = |f: &dyn Fn(&Attach) -> bool| {
            self.cfg.tenants.iter().enumerate().find_map(|(ti, t)| {
                t.attachments
                    .iter()
                    .position(|a| a.port == port && f(a))
                    .map(|ai| (ti, ai))
            })
        };
        vlan.and_then(|v| find(&|a| a.vni == 0 && a.vlan != 0 && a.vlan == v))
            .or_else(|| find(&|a| a.vni == 0 && a.vlan == 0))
    }

    /// The (tenant, attachment) of VXLAN network `vni` on `port`.
    pub fn vxlan_owner(&self, port: usize, vni: u32) -> Option<(usize, usize)> {
        self.cfg.tenants.iter().enumerate().find_map(|(ti, t)| {
            t.attachments
                .iter()
                .position(|a| a.port == port && a.vni == vni)
                .map(|ai| (ti, ai))
        })
    }

    /// Whether VXLAN attachment `(t, a)` accepts frames from underlay
    /// address `ip`: one of its remote VTEPs, or in one of its ranges.
    fn accepts(&self, (t, a): (usize, usize), ip: u32) -> bool {
        let t = &self.cfg.tenants[t];
        t.remote_vteps.get(a).is_some_and(|r| r.contains(&ip))
            || t.vtep_prefixes
                .get(a)
                .is_some_and(|r| r.iter().any(|&(lo, hi)| lo <= ip && ip <= hi))
    }

    /// Pushes `frames` random frames through `p`, checking each; stops
    /// early when `d` runs dry.
    pub fn run<S: Source>(&mut self, p: &mut SwitchPipeline, d: &mut Draw<S>, frames: u64) {
        self.stream(p, d, frames, false);
    }

    /// As [`World::run`], each frame a burst of one through
    /// `process_burst`, where flow hardware (the model NIC) in front of
    /// the switch decides the frames of the flows it holds.
    pub fn run_bursts<S: Source>(&mut self, p: &mut SwitchPipeline, d: &mut Draw<S>, frames: u64) {
        self.stream(p, d, frames, true);
    }

    fn stream<S: Source>(
        &mut self,
        p: &mut SwitchPipeline,
        d: &mut Draw<S>,
        frames: u64,
        bursts: bool,
    ) {
        let mut flood = Vec::new();
        let mut burst = Vec::with_capacity(1);
        let mut outs = Vec::new();
        for i in 0..frames {
            if i % 32 == 0 {
                p.turn();
            }
            let (port, mut frame, meta) = self.frame(d);
            if d.done {
                return;
            }
            flood.clear();
            let original = frame.clone();
            if !bursts {
                let v = p.process(port, &mut frame, &mut flood);
                self.check(port, &original, &meta, v, &flood);
                continue;
            }
            burst.push(dpu_dataplane::io::memory::MemPacket(frame));
            let mut verdict = None;
            p.process_burst(port, &mut burst, &mut flood, |_, v, f| {
                verdict = Some(*v);
                outs.clear();
                outs.extend_from_slice(f);
            });
            burst.clear();
            match verdict {
                Some(v) => self.check(port, &original, &meta, v, &outs),
                None => self.violation(format!("port {port} {meta:?}: no verdict")),
            }
        }
    }

    /// A random frame: its input port, bytes and what it carries.
    fn frame<S: Source>(&mut self, d: &mut Draw<S>) -> (usize, Vec<u8>, Meta) {
        self.stats.frames += 1;
        // The other tenants have the table to themselves for a while
        // first: the quiet tenant must still learn its stations.
        if self.stats.frames > FLOOD_FIRST && d.pct(15) {
            if let Some(f) = self.probe(d) {
                self.stats.probes += 1;
                return f;
            }
        }
        let port = d.below(self.cfg.ports as u32 + 1) as usize;
        if port == VTEP_PORT && d.pct(60) {
            return self.underlay(d);
        }
        let port = port.min(self.cfg.ports - 1);
        let outer = match d.below(10) {
            0..=3 => Outer::None,
            4..=8 => Outer::Dot1q(self.vlan(d)),
            _ => Outer::QinQ(self.vlan(d)),
        };
        let inner = match d.below(12) {
            0..=8 => Inner::None,
            9 => Inner::Dot1q(self.vlan(d)),
            10 => Inner::Mpls,
            _ => Inner::Pppoe,
        };
        // A lone 802.1Q tag is the outer tag.
        let (outer, inner) = match (outer, inner) {
            (Outer::None, Inner::Dot1q(v)) => (Outer::Dot1q(v), Inner::None),
            other => other,
        };
        let owner = match outer {
            Outer::None => self.owner(port, None),
            Outer::Dot1q(v) => self.owner(port, Some(v)),
            // Whether the parser reads an S-tag as the outer tag or not,
            // at most one attachment can own the frame (a whole port and a
            // VLAN of it are never both attached).
            Outer::QinQ(v) => self.owner(port, Some(v)).or(self.owner(port, None)),
        };
        if !matches!((outer, inner), (Outer::None | Outer::Dot1q(_), Inner::None)) {
            self.stats.stacked += 1;
        }
        let mut meta = Meta {
            owner,
            ..Meta::default()
        };
        let body = self.body(d, owner, &mut meta);
        let mut b = Vec::with_capacity(128);
        b.extend_from_slice(&meta_dst(d, self, owner));
        b.extend_from_slice(&meta.src_mac);
        push_outer(&mut b, outer);
        push_inner_and_payload(&mut b, inner, &body);
        (port, b, meta)
    }

    fn vlan<S: Source>(&self, d: &mut Draw<S>) -> u16 {
        if d.pct(90) {
            *d.pick(&VLANS)
        } else {
            d.below(4096) as u16
        }
    }

    /// The network layer of a frame entering `owner`, and its source MAC
    /// (set in `meta`). Quiet tenants' frames keep to their stations.
    fn body<S: Source>(
        &mut self,
        d: &mut Draw<S>,
        owner: Option<(usize, usize)>,
        meta: &mut Meta,
    ) -> Payload {
        let quiet = owner.is_some_and(|(t, _)| self.quiet[t]);
        let legit = owner.map(|(t, a)| station(t, a, d.below(2) as usize));
        let src = match (quiet, legit) {
            (true, Some(s)) => s,
            (_, Some(s)) if d.pct(40) => s,
            _ => {
                // Someone else's station, or a random one (a MAC flood).
                let t = d.below(self.cfg.tenants.len() as u32) as usize;
                let mut s = station(t, d.below(4) as usize, d.below(2) as usize);
                if d.pct(50) {
                    let r = [d.u16(), d.u16(), d.u16()];
                    s.mac = [
                        2,
                        0x80 | (r[0] as u8 & 0x3f),
                        (r[1] >> 8) as u8,
                        r[1] as u8,
                        (r[2] >> 8) as u8,
                        r[2] as u8,
                    ];
                }
                if d.pct(30) {
                    s.v4 = 0x0a00_0000 | d.below(256);
                }
                s
            }
        };
        meta.src_mac = src.mac;
        let dst = station(
            owner.map_or(0, |o| o.0),
            d.below(4) as usize,
            d.below(2) as usize,
        );
        let payload = match d.below(10) {
            0..=4 => {
                let frag = d.below(10);
                let (offset, more) = match frag {
                    0..=5 => (0, false),
                    6..=7 => (0, true),
                    _ => (1 + d.below(200) as u16, d.pct(50)),
                };
                if frag >= 6 {
                    self.stats.fragments += 1;
                }
                let proto = *d.pick(&[proto::UDP, proto::TCP, proto::ICMP]);
                Payload::V4 {
                    src: src.v4,
                    dst: dst.v4,
                    proto,
                    offset,
                    more,
                    id: d.below(4) as u16,
                    l4_len: if d.pct(10) { d.below(20) as usize } else { 20 },
                }
            }
            5..=6 => Payload::Arp {
                op: 1 + d.below(2) as u16,
                sender_mac: if d.pct(80) {
                    src.mac
                } else {
                    station(0, 0, 0).mac
                },
                sender_ip: src.v4,
                target_ip: dst.v4,
            },
            7..=8 => {
                let frag = if d.pct(30) {
                    self.stats.fragments += 1;
                    Some((d.below(3) as u16 * 100, d.pct(50)))
                } else {
                    None
                };
                Payload::V6 {
                    src: src.v6,
                    dst: dst.v6,
                    proto: *d.pick(&[proto::UDP, proto::TCP, proto::ICMPV6]),
                    frag,
                }
            }
            _ => Payload::Other,
        };
        note_sources(meta, &payload);
        payload
    }

    /// A frame from the underlay into the VTEP's port: VXLAN from a
    /// configured or unconfigured remote, for a VNI of anyone or nobody,
    /// or ARP for the VTEP's address.
    fn underlay<S: Source>(&mut self, d: &mut Draw<S>) -> (usize, Vec<u8>, Meta) {
        let outer_src = if d.pct(70) {
            REMOTE_POOL + d.below(REMOTES)
        } else {
            STRANGERS + d.below(4)
        };
        let outer_mac = [2, 0xdd, 0, 0, 0, (outer_src & 0xff) as u8];
        if d.pct(10) {
            let mut b = Vec::new();
            b.extend_from_slice(&[0xff; 6]);
            b.extend_from_slice(&outer_mac);
            b.extend_from_slice(&ETH_ARP.to_be_bytes());
            push_arp(&mut b, 1 + d.below(2) as u16, outer_mac, outer_src, VTEP_IP);
            let meta = Meta {
                to_vtep: true,
                ..Meta::default()
            };
            return (VTEP_PORT, b, meta);
        }
        self.stats.vxlan += 1;
        let vni = if d.pct(90) { *d.pick(&VNIS) } else { 777 };
        let network = self.vxlan_owner(VTEP_PORT, vni);
        let configured = network.is_some_and(|o| self.accepts(o, outer_src));
        let owner = network.filter(|_| configured);
        let mut meta = Meta {
            owner,
            rogue_vxlan: !configured,
            ..Meta::default()
        };
        let body = self.body(d, network, &mut meta);
        let mut inner = Vec::new();
        inner.extend_from_slice(&meta_dst(d, self, network));
        inner.extend_from_slice(&meta.src_mac);
        let tag = if d.pct(20) {
            Outer::Dot1q(self.vlan(d))
        } else {
            Outer::None
        };
        push_outer(&mut inner, tag);
        push_inner_and_payload(&mut inner, Inner::None, &body);
        let mut b = Vec::with_capacity(inner.len() + 50);
        b.extend_from_slice(&VTEP_MAC);
        b.extend_from_slice(&outer_mac);
        b.extend_from_slice(&ETH_IPV4.to_be_bytes());
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((36 + inner.len()) as u16).to_be_bytes());
        ip[8] = 64;
        ip[9] = proto::UDP;
        ip[12..16].copy_from_slice(&outer_src.to_be_bytes());
        ip[16..20].copy_from_slice(&VTEP_IP.to_be_bytes());
        let sum = wire::ip_checksum(&ip);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        b.extend_from_slice(&ip);
        b.extend_from_slice(&(49152 + d.below(1000) as u16).to_be_bytes());
        b.extend_from_slice(&VXLAN_UDP_PORT.to_be_bytes());
        b.extend_from_slice(&((16 + inner.len()) as u16).to_be_bytes());
        b.extend_from_slice(&[0, 0, 0x08, 0, 0, 0]);
        b.extend_from_slice(&(vni << 8).to_be_bytes());
        b.extend_from_slice(&inner);
        (VTEP_PORT, b, meta)
    }

    /// A quiet tenant's anchor announcing itself (broadcast ARP), or, once
    /// one is learned, another of its stations sending it unicast.
    fn probe<S: Source>(&mut self, d: &mut Draw<S>) -> Option<(usize, Vec<u8>, Meta)> {
        let t = self.quiet.iter().position(|&q| q)?;
        let plain: Vec<usize> = self.cfg.tenants[t]
            .attachments
            .iter()
            .enumerate()
            .filter(|(_, a)| a.vni == 0)
            .map(|(i, _)| i)
            .collect();
        let a = *d.pick(&plain);
        let at = self.cfg.tenants[t].attachments[a];
        let tag = (at.vlan != 0).then_some(at.vlan);
        let me = station(t, a, 0);
        let learned: Vec<([u8; 6], usize)> = self
            .learned
            .iter()
            .filter(|(&(lt, _), &la)| lt == t && la != a)
            .map(|(&(_, m), &la)| (m, la))
            .collect();
        let mut b = Vec::new();
        let mut meta = Meta {
            owner: Some((t, a)),
            src_mac: me.mac,
            v4_src: Some(me.v4),
            arp_sender_mac: Some(me.mac),
            ..Meta::default()
        };
        if learned.is_empty() || d.pct(30) {
            b.extend_from_slice(&[0xff; 6]);
            b.extend_from_slice(&me.mac);
            push_outer(&mut b, tag.map_or(Outer::None, Outer::Dot1q));
            b.extend_from_slice(&ETH_ARP.to_be_bytes());
            push_arp(&mut b, 1, me.mac, me.v4, station(t, 0, 1).v4);
            meta.anchor = Some((t, a, me.mac));
        } else {
            let (to, la) = *d.pick(&learned);
            b.extend_from_slice(&to);
            b.extend_from_slice(&me.mac);
            push_outer(&mut b, tag.map_or(Outer::None, Outer::Dot1q));
            b.extend_from_slice(&ETH_ARP.to_be_bytes());
            push_arp(&mut b, 2, me.mac, me.v4, station(t, la, 0).v4);
            meta.probe_to = Some(la);
            meta.anchor = Some((t, a, me.mac));
        }
        Some((at.port, b, meta))
    }

    fn violation(&mut self, what: String) {
        self.stats.violations += 1;
        if self.violations.len() < 20 {
            self.violations.push(what);
        }
    }

    /// Checks the switch's decision `v` (with `flood`) for `frame`.
    fn check(&mut self, port: usize, frame: &[u8], meta: &Meta, v: Verdict, flood: &[Egress]) {
        let outs: Vec<Egress> = match v {
            Verdict::Forward(e) => vec![e],
            Verdict::Flood => flood.to_vec(),
            Verdict::Drop(_) => Vec::new(),
        };
        match v {
            Verdict::Forward(_) => self.stats.forwarded += 1,
            Verdict::Flood => self.stats.flooded += 1,
            Verdict::Drop(_) => self.stats.dropped += 1,
        }
        let describe = |w: &World| {
            format!(
                "port {port} {meta:?} -> {v:?} {flood:?} (config {} tenants, {} ports)",
                w.cfg.tenants.len(),
                w.cfg.ports
            )
        };
        if meta.to_vtep {
            let ok = match vtep_frame(frame, VTEP_IP) {
                VtepFrame::ArpRequest { .. } => {
                    outs.len() <= 1 && outs.iter().all(|e| e.port == port && e.tunnel.is_none())
                }
                _ => outs.is_empty(),
            };
            if !ok {
                self.violation(format!("VTEP frame switched: {}", describe(self)));
            }
            return;
        }
        if let Some((t, a, mac)) = meta.anchor {
            if !matches!(v, Verdict::Drop(_)) {
                self.learned.insert((t, mac), a);
            }
        }
        if outs.is_empty() {
            return;
        }
        if meta.rogue_vxlan {
            self.violation(format!(
                "VXLAN from an unconfigured source switched: {}",
                describe(self)
            ));
            return;
        }
        let Some((ti, ai)) = meta.owner else {
            self.violation(format!("a frame nobody owns switched: {}", describe(self)));
            return;
        };
        let parsed_tag = wire::parse_l2(frame).ok().and_then(|h| h.vlan);
        for (i, e) in outs.iter().enumerate() {
            if outs[..i].contains(e) {
                self.violation(format!("output twice: {}", describe(self)));
            }
            let to = match e.tunnel {
                Some(tun) => {
                    let o = self.vxlan_owner(e.port, tun.vni);
                    if let Some(o) = o {
                        if !self.accepts(o, tun.dst_ip) {
                            self.violation(format!(
                                "tunnelled to unconfigured VTEP {:#x}: {}",
                                tun.dst_ip,
                                describe(self)
                            ));
                        }
                    }
                    o
                }
                None => {
                    let tag = match e.vlan {
                        VlanOp::Keep => {
                            if e.decap != 0 {
                                wire::parse_l2(&frame[usize::from(e.decap)..])
                                    .ok()
                                    .and_then(|h| h.vlan)
                            } else {
                                parsed_tag
                            }
                        }
                        VlanOp::Strip => None,
                        VlanOp::Push(v) | VlanOp::Set(v) => Some(v),
                    };
                    self.owner(e.port, tag)
                }
            };
            match to {
                None => self.violation(format!("output {e:?} reaches nobody: {}", describe(self))),
                Some((tt, ta)) if tt != ti => self.violation(format!(
                    "LEAK from tenant {ti} to tenant {tt} attachment {ta}: {}",
                    describe(self)
                )),
                Some((_, ta)) if ta == ai => {
                    self.violation(format!("sent back where it came from: {}", describe(self)))
                }
                Some(_) => {}
            }
        }
        // Anti-spoofing: whatever left a guarded attachment has its sources.
        if let Some(g) = self.cfg.tenants[ti].guards.get(ai) {
            let mac_ok = |m: &[u8; 6]| g.macs.is_empty() || g.macs.contains(m);
            let prefixes = !g.v4.is_empty() || !g.v6.is_empty();
            let v4_ok = |a: u32| g.v4.iter().any(|&(lo, hi)| lo <= a && a <= hi);
            let v6_ok = |a: u128| g.v6.iter().any(|&(lo, hi)| lo <= a && a <= hi);
            let spoofed = !mac_ok(&meta.src_mac)
                || meta.arp_sender_mac.is_some_and(|m| !mac_ok(&m))
                || prefixes
                    && (meta.v4_src.is_some_and(|a| a != 0 && !v4_ok(a))
                        || meta.v6_src.is_some_and(|a| !v6_ok(a)));
            if spoofed {
                self.violation(format!(
                    "spoofed source left guarded attachment {ai} of tenant {ti} ({g:?}): {}",
                    describe(self)
                ));
            }
        }
        // A quiet tenant's learned station is never forgotten because of
        // what other tenants sent.
        if let Some(la) = meta.probe_to {
            let e = outs[0];
            let fine = matches!(v, Verdict::Forward(_))
                && self.cfg.tenants[ti].attachments[la].port == e.port;
            if !fine {
                self.violation(format!(
                    "learned station of quiet tenant {ti} on attachment {la} forgotten: {}",
                    describe(self)
                ));
            }
        }
    }
}

/// A destination MAC: broadcast, a station of the owner's tenant, or
/// anyone's.
fn meta_dst<S: Source>(d: &mut Draw<S>, w: &World, owner: Option<(usize, usize)>) -> [u8; 6] {
    match d.below(4) {
        0 => [0xff; 6],
        1 | 2 => {
            station(
                owner.map_or(0, |o| o.0),
                d.below(4) as usize,
                d.below(2) as usize,
            )
            .mac
        }
        _ => {
            station(
                d.below(w.cfg.tenants.len() as u32) as usize,
                d.below(4) as usize,
                d.below(2) as usize,
            )
            .mac
        }
    }
}

fn note_sources(meta: &mut Meta, p: &Payload) {
    match *p {
        Payload::V4 { src, .. } => meta.v4_src = Some(src),
        Payload::V6 { src, .. } => meta.v6_src = Some(src),
        Payload::Arp {
            sender_mac,
            sender_ip,
            ..
        } => {
            meta.v4_src = Some(sender_ip);
            meta.arp_sender_mac = Some(sender_mac);
        }
        Payload::Other => {}
    }
}

fn push_outer(b: &mut Vec<u8>, outer: Outer) {
    match outer {
        Outer::None => {}
        Outer::Dot1q(v) => {
            b.extend_from_slice(&0x8100u16.to_be_bytes());
            b.extend_from_slice(&v.to_be_bytes());
        }
        Outer::QinQ(v) => {
            b.extend_from_slice(&0x88a8u16.to_be_bytes());
            b.extend_from_slice(&v.to_be_bytes());
        }
    }
}

/// The inner tag or encapsulation, the EtherType and the network layer.
fn push_inner_and_payload(b: &mut Vec<u8>, inner: Inner, p: &Payload) {
    let ethertype = match p {
        Payload::V4 { .. } => ETH_IPV4,
        Payload::V6 { .. } => ETH_IPV6,
        Payload::Arp { .. } => ETH_ARP,
        Payload::Other => 0x88b5,
    };
    let mut l3 = Vec::with_capacity(96);
    push_payload(&mut l3, p);
    match inner {
        Inner::None => {
            b.extend_from_slice(&ethertype.to_be_bytes());
        }
        Inner::Dot1q(v) => {
            b.extend_from_slice(&0x8100u16.to_be_bytes());
            b.extend_from_slice(&v.to_be_bytes());
            b.extend_from_slice(&ethertype.to_be_bytes());
        }
        Inner::Mpls => {
            // One label, bottom of stack, then the IP packet.
            b.extend_from_slice(&0x8847u16.to_be_bytes());
            b.extend_from_slice(&[0x00, 0x10, 0x01, 64]);
        }
        Inner::Pppoe => {
            b.extend_from_slice(&0x8864u16.to_be_bytes());
            b.extend_from_slice(&[0x11, 0x00, 0x12, 0x34]);
            b.extend_from_slice(&((l3.len() + 2) as u16).to_be_bytes());
            let ppp: u16 = match p {
                Payload::V6 { .. } => 0x0057,
                _ => 0x0021,
            };
            b.extend_from_slice(&ppp.to_be_bytes());
        }
    }
    b.extend_from_slice(&l3);
    while b.len() < 60 {
        b.push(0);
    }
}

fn push_arp(b: &mut Vec<u8>, op: u16, sender_mac: [u8; 6], sender_ip: u32, target_ip: u32) {
    b.extend_from_slice(&[0, 1, 8, 0, 6, 4]);
    b.extend_from_slice(&op.to_be_bytes());
    b.extend_from_slice(&sender_mac);
    b.extend_from_slice(&sender_ip.to_be_bytes());
    b.extend_from_slice(&[0; 6]);
    b.extend_from_slice(&target_ip.to_be_bytes());
}

fn l4(proto: u8, len: usize) -> Vec<u8> {
    let mut l = vec![0u8; len.max(8)];
    match proto {
        proto::TCP | proto::UDP => {
            l[0..2].copy_from_slice(&40000u16.to_be_bytes());
            l[2..4].copy_from_slice(&[0, 80]);
            if proto == proto::TCP && l.len() >= 14 {
                l[12] = 5 << 4;
                l[13] = 0x02;
            }
            if proto == proto::UDP {
                l[4..6].copy_from_slice(&(len.max(8) as u16).to_be_bytes());
            }
        }
        _ => {
            l[0] = if proto == proto::ICMP { 8 } else { 128 };
        }
    }
    l.truncate(len.max(if proto == proto::TCP { 1 } else { 8 }));
    l
}

fn push_payload(b: &mut Vec<u8>, p: &Payload) {
    match *p {
        Payload::V4 {
            src,
            dst,
            proto,
            offset,
            more,
            id,
            l4_len,
        } => {
            let l4 = l4(proto, l4_len);
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&id.to_be_bytes());
            let frag = offset | if more { 0x2000 } else { 0 };
            ip[6..8].copy_from_slice(&frag.to_be_bytes());
            ip[8] = 64;
            ip[9] = proto;
            ip[12..16].copy_from_slice(&src.to_be_bytes());
            ip[16..20].copy_from_slice(&dst.to_be_bytes());
            let sum = wire::ip_checksum(&ip);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            b.extend_from_slice(&ip);
            b.extend_from_slice(&l4);
        }
        Payload::V6 {
            src,
            dst,
            proto,
            frag,
        } => {
            let l4 = l4(proto, 20);
            let (next, ext) = match frag {
                Some((offset, more)) => {
                    let mut f = vec![proto, 0];
                    f.extend_from_slice(&((offset << 3) | u16::from(more)).to_be_bytes());
                    f.extend_from_slice(&0x1234_5678u32.to_be_bytes());
                    (44, f)
                }
                None => (proto, Vec::new()),
            };
            b.extend_from_slice(&[0x60, 0, 0, 0]);
            b.extend_from_slice(&((ext.len() + l4.len()) as u16).to_be_bytes());
            b.extend_from_slice(&[next, 64]);
            b.extend_from_slice(&src.to_be_bytes());
            b.extend_from_slice(&dst.to_be_bytes());
            b.extend_from_slice(&ext);
            b.extend_from_slice(&l4);
        }
        Payload::Arp {
            op,
            sender_mac,
            sender_ip,
            target_ip,
        } => push_arp(b, op, sender_mac, sender_ip, target_ip),
        Payload::Other => b.extend_from_slice(&[0; 46]),
    }
}

/// Random rules: protocol, destination port range, source prefix,
/// allow or deny, stateful or not.
fn random_rules<S: Source>(d: &mut Draw<S>) -> Vec<SwitchRule> {
    let n = d.below(7);
    (0..n)
        .map(|i| {
            let family = *d.pick(&[Family::V4, Family::V4, Family::V6, Family::Any]);
            let mut m = AclRule::any(i * 10 + 1, 0, family);
            match d.below(4) {
                0 => m.proto = (proto::UDP, proto::UDP),
                1 => m.proto = (proto::TCP, proto::TCP),
                2 if family == Family::V4 => m.proto = (proto::ICMP, proto::ICMP),
                _ => {}
            }
            if d.pct(40) && matches!(m.proto.0, proto::UDP | proto::TCP) {
                let lo = *d.pick(&[0u16, 53, 80, 1024]);
                m.dst_port = (lo, lo + d.below(100) as u16);
            }
            if d.pct(30) && family == Family::V4 {
                m.src = AclRule::prefix_range(0x0a00_0000 | u128::from(d.below(16)), 30, 32);
            }
            let allow = d.pct(60);
            SwitchRule {
                id: format!("r{i}"),
                matches: m,
                allow,
                stateful: allow && d.pct(40),
                rate_limit: None,
            }
        })
        .collect()
}
