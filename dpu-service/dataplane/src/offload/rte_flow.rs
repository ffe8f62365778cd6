//! The `rte_flow` provider: flow rules in the NIC behind the DPDK ports.
//!
//! - **On an embedded switch** (every port in one switch domain, as a
//!   BlueField's uplink and representors are with the mlx5 driver), a
//!   rule is a *transfer* rule created on the switch's transfer proxy:
//!   it matches packets from one represented port (`represented_port`
//!   item), the outer tag or VXLAN VNI, the MAC addresses and the
//!   5-tuple (TCP rules only segments without SYN, FIN or RST, and only
//!   untagged frames when the flow is untagged), and carries out the
//!   flow's way out: VXLAN decapsulation, tag pop, push or change, VXLAN
//!   encapsulation, then `represented_port`; or drop. Every rule has a
//!   `count` and an `age` action, and aged rules come back through
//!   `rte_flow_get_aged_flows`. This is what the mlx5 driver documents
//!   for transfer rules in DPDK 22.11 (group 0 of the FDB, which the
//!   driver moves to its first non-root table).
//! - **On ports without a shared switch** (`net_tap`, or NICs without
//!   representors), a rule is an *ingress* rule of its input port and can
//!   only drop. Counters and ages are asked for where the port validates
//!   them; without counters a rule lasts its idle age and is then
//!   removed (software sees the flow again and decides anew).
//!
//! Every rule is validated (`rte_flow_validate`) before it is created. A
//! shape (the kinds of items and actions a rule has) the driver refused
//! as unsupported is refused at once afterwards, without asking the
//! driver again.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use dpdk::flow::{
    self, Flow, FlowAttach, FlowEncap, FlowError, FlowFate, FlowSpec, FlowVlan, FlowVlanOp,
};

use super::{
    FlowAction, FlowCounts, FlowId, FlowPort, FlowRule, Provider, Refusal, TCP_SOFTWARE_FLAGS,
};
use crate::wire::proto;
use crate::worker::VlanOp;

/// Shapes remembered as unsupported, at most.
const SHAPES_MAX: usize = 256;

/// Where the provider's rules go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowMode {
    /// Transfer rules of one embedded switch, created on its proxy port.
    Transfer {
        /// The DPDK port transfer rules are created on.
        proxy: u16,
    },
    /// Ingress rules of each input port: drop rules only.
    Ingress,
}

/// What a port validated at start, in ingress mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Caps {
    count: bool,
    age: bool,
    untagged: bool,
    tcp_flags: bool,
}

/// What the provider knows of an installed rule besides its handle.
#[derive(Debug, Clone, Copy)]
struct Installed {
    /// The rule's idle age.
    idle: Duration,
    /// Hardware reports its age.
    hw_age: bool,
    /// It has a counter.
    counted: bool,
    /// The counter at its last change, and when that was seen.
    last: FlowCounts,
    changed: Instant,
}

/// The `rte_flow` provider.
pub struct RteFlowNic {
    ports: Vec<FlowPort>,
    mode: FlowMode,
    caps: Vec<Caps>,
    capacity: usize,
    flows: HashMap<FlowId, (Flow, Installed)>,
    /// Shapes the driver refused as unsupported, with its reason.
    refused: HashMap<u64, String>,
    aged_scratch: Vec<u64>,
}

impl std::fmt::Debug for RteFlowNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RteFlowNic")
            .field("mode", &self.mode)
            .field("ports", &self.ports)
            .field("flows", &self.flows.len())
            .finish_non_exhaustive()
    }
}

impl RteFlowNic {
    /// A provider for the data plane's `ports` (in port-index order)
    /// holding at most `capacity` rules: transfer rules when every port
    /// is in one switch domain, else ingress drop rules.
    ///
    /// # Errors
    /// No ports, or the switch has no transfer proxy.
    pub fn new(ports: Vec<FlowPort>, capacity: usize) -> Result<RteFlowNic, String> {
        let first = ports
            .first()
            .ok_or("flow offload through rte_flow needs at least one DPDK port")?;
        let one_switch = first.switch_domain.is_some()
            && ports.iter().all(|p| p.switch_domain == first.switch_domain);
        if one_switch {
            let proxy = flow::transfer_proxy(first.id)
                .map_err(|e| format!("port {}: no transfer proxy: {e}", first.name))?;
            return Ok(RteFlowNic::transfer(ports, proxy, capacity));
        }
        let caps = ports.iter().map(|p| probe(p.id)).collect();
        Ok(RteFlowNic::with(ports, FlowMode::Ingress, caps, capacity))
    }

    /// A provider of transfer rules for an embedded switch made of
    /// `ports`, created on `proxy`.
    pub fn transfer(ports: Vec<FlowPort>, proxy: u16, capacity: usize) -> RteFlowNic {
        let all = Caps {
            count: true,
            age: true,
            untagged: true,
            tcp_flags: true,
        };
        let caps = vec![all; ports.len()];
        RteFlowNic::with(ports, FlowMode::Transfer { proxy }, caps, capacity)
    }

    fn with(ports: Vec<FlowPort>, mode: FlowMode, caps: Vec<Caps>, capacity: usize) -> Self {
        RteFlowNic {
            ports,
            mode,
            caps,
            capacity,
            flows: HashMap::new(),
            refused: HashMap::new(),
            aged_scratch: Vec::new(),
        }
    }

    /// Where its rules go.
    pub fn mode(&self) -> FlowMode {
        self.mode
    }

    /// What the ingress port at `index` validated at start: counters,
    /// ages, untagged-only matches, TCP flag matches (all true for
    /// transfer rules).
    pub fn port_caps(&self, index: usize) -> Option<[bool; 4]> {
        self.caps
            .get(index)
            .map(|c| [c.count, c.age, c.untagged, c.tcp_flags])
    }

    /// Rules installed now.
    pub fn installed(&self) -> usize {
        self.flows.len()
    }

    /// The rule `rule` becomes as flow `id`, and the port it is created
    /// on.
    ///
    /// # Errors
    /// [`Refusal::Unsupported`] for what this mode or port cannot express.
    pub fn spec(&self, id: FlowId, rule: &FlowRule) -> Result<(u16, FlowSpec), Refusal> {
        let m = &rule.matches;
        let in_port = self
            .ports
            .get(usize::from(m.in_port))
            .ok_or(Refusal::Unsupported(
                "an input port the provider does not have".into(),
            ))?;
        let key = &m.key;
        let (src_ip, dst_ip) = if key.v6 {
            (
                IpAddr::V6(Ipv6Addr::from(key.src)),
                IpAddr::V6(Ipv6Addr::from(key.dst)),
            )
        } else {
            (
                IpAddr::V4(Ipv4Addr::from(key.src as u32)),
                IpAddr::V4(Ipv4Addr::from(key.dst as u32)),
            )
        };
        let age = u32::try_from(rule.idle.as_secs().max(1)).unwrap_or(u32::MAX);
        let mut spec = FlowSpec {
            attach: FlowAttach::Ingress,
            vni: m.vni,
            vlan: match m.vlan {
                Some(v) => FlowVlan::Id(v),
                None => FlowVlan::None,
            },
            macs: Some((m.src_mac, m.dst_mac)),
            src_ip,
            dst_ip,
            proto: key.proto,
            src_port: key.src_port,
            dst_port: key.dst_port,
            // Forwarding rules leave TCP's handshake and close to
            // software; drop rules drop every segment.
            tcp_flags_clear: if key.proto == proto::TCP
                && matches!(rule.action, FlowAction::Forward(_))
            {
                TCP_SOFTWARE_FLAGS
            } else {
                0
            },
            decap: false,
            vlan_op: FlowVlanOp::Keep,
            encap: None,
            count: true,
            age: Some((age, id)),
            fate: FlowFate::Drop,
        };
        match self.mode {
            FlowMode::Transfer { proxy } => {
                spec.attach = FlowAttach::Transfer { from: in_port.id };
                if let FlowAction::Forward(e) = rule.action {
                    let out = self.ports.get(e.port).ok_or(Refusal::Unsupported(
                        "an output port the provider does not have".into(),
                    ))?;
                    spec.fate = FlowFate::Port(out.id);
                    if e.decap != 0 {
                        if m.vni.is_none() {
                            return Err(Refusal::Unsupported(
                                "decapsulation of a frame that is not in VXLAN".into(),
                            ));
                        }
                        spec.decap = true;
                    }
                    spec.vlan_op = match e.vlan {
                        VlanOp::Keep => FlowVlanOp::Keep,
                        VlanOp::Strip => FlowVlanOp::Pop,
                        VlanOp::Push(v) => FlowVlanOp::Push(v),
                        VlanOp::Set(v) => FlowVlanOp::Set(v),
                    };
                    if let Some(t) = e.tunnel {
                        if t.resolve {
                            return Err(Refusal::Unsupported(
                                "a tunnel whose next hop is not resolved".into(),
                            ));
                        }
                        spec.encap = Some(FlowEncap {
                            src_mac: t.src_mac,
                            dst_mac: t.dst_mac,
                            src_ip: Ipv4Addr::from(t.src_ip),
                            dst_ip: Ipv4Addr::from(t.dst_ip),
                            src_port: entropy_port(key),
                            vni: t.vni,
                        });
                    }
                }
                Ok((proxy, spec))
            }
            FlowMode::Ingress => {
                if matches!(rule.action, FlowAction::Forward(_)) {
                    return Err(Refusal::Unsupported(
                        "forwarding between ports that share no embedded switch".into(),
                    ));
                }
                let caps = self.caps[usize::from(m.in_port)];
                if m.vlan.is_none() && !caps.untagged {
                    return Err(Refusal::Unsupported(
                        "untagged frames only: the port cannot match the absence of a tag".into(),
                    ));
                }
                if spec.tcp_flags_clear != 0 && !caps.tcp_flags {
                    // A drop rule may match every segment of the flow.
                    spec.tcp_flags_clear = 0;
                }
                spec.count = caps.count;
                if !caps.age {
                    spec.age = None;
                }
                Ok((in_port.id, spec))
            }
        }
    }
}

/// What an ingress port validates, found with a sample drop rule for a
/// flow no host has (TEST-NET-1): counters, ages, untagged-only matches
/// and TCP flag matches.
fn probe(port: u16) -> Caps {
    let base = FlowSpec {
        attach: FlowAttach::Ingress,
        vni: None,
        vlan: FlowVlan::Id(1),
        macs: Some(([0x02, 0, 0, 0, 0, 1], [0x02, 0, 0, 0, 0, 2])),
        src_ip: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
        dst_ip: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
        proto: proto::TCP,
        src_port: 9,
        dst_port: 9,
        tcp_flags_clear: 0,
        decap: false,
        vlan_op: FlowVlanOp::Keep,
        encap: None,
        count: false,
        age: None,
        fate: FlowFate::Drop,
    };
    let ok = |s: FlowSpec| flow::validate(port, &s).is_ok();
    Caps {
        count: ok(FlowSpec {
            count: true,
            ..base
        }),
        age: ok(FlowSpec {
            age: Some((10, 0)),
            ..base
        }),
        untagged: ok(FlowSpec {
            vlan: FlowVlan::None,
            ..base
        }),
        tcp_flags: ok(FlowSpec {
            tcp_flags_clear: TCP_SOFTWARE_FLAGS,
            ..base
        }),
    }
}

/// The outer UDP source port of a flow's VXLAN frames: a hash of its
/// 5-tuple in the dynamic range (RFC 7348 5).
fn entropy_port(key: &crate::wire::FlowKey) -> u16 {
    let mut h: u32 = 0x811c_9dc5;
    let mut mix = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
    };
    mix(&key.src.to_be_bytes());
    mix(&key.dst.to_be_bytes());
    mix(&key.src_port.to_be_bytes());
    mix(&key.dst_port.to_be_bytes());
    mix(&[key.proto]);
    0xc000 | (h as u16 & 0x3fff)
}

/// The kinds of items and actions of a rule, without their values.
fn shape(port: u16, s: &FlowSpec) -> u64 {
    let attach = match s.attach {
        FlowAttach::Transfer { .. } => 1,
        FlowAttach::Ingress => 2,
    };
    let vlan = match s.vlan {
        FlowVlan::Any => 0,
        FlowVlan::None => 1,
        FlowVlan::Id(_) => 2,
    };
    let op = match s.vlan_op {
        FlowVlanOp::Keep => 0,
        FlowVlanOp::Pop => 1,
        FlowVlanOp::Push(_) => 2,
        FlowVlanOp::Set(_) => 3,
    };
    let bits = [
        s.vni.is_some(),
        s.macs.is_some(),
        s.src_ip.is_ipv6(),
        s.tcp_flags_clear != 0,
        s.decap,
        s.encap.is_some(),
        s.count,
        s.age.is_some(),
        matches!(s.fate, FlowFate::Drop),
    ]
    .iter()
    .enumerate()
    .fold(0u64, |acc, (i, &b)| acc | (u64::from(b) << i));
    u64::from(port) << 48 | u64::from(s.proto) << 32 | attach << 24 | vlan << 20 | op << 16 | bits
}

fn refusal(e: &FlowError) -> Refusal {
    if e.is_full() {
        Refusal::TableFull
    } else if e.is_unsupported() {
        Refusal::Unsupported(e.to_string().into())
    } else {
        Refusal::Failed(e.to_string())
    }
}

impl Provider for RteFlowNic {
    fn name(&self) -> &'static str {
        "rte_flow"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn insert(&mut self, id: FlowId, rule: &FlowRule) -> Result<(), Refusal> {
        if self.flows.len() >= self.capacity {
            return Err(Refusal::TableFull);
        }
        let (port, spec) = self.spec(id, rule)?;
        let shape = shape(port, &spec);
        if let Some(why) = self.refused.get(&shape) {
            return Err(Refusal::Unsupported(why.clone().into()));
        }
        let created = flow::validate(port, &spec).and_then(|()| flow::create(port, &spec));
        match created {
            Ok(flow) => {
                let now = Instant::now();
                self.flows.insert(
                    id,
                    (
                        flow,
                        Installed {
                            idle: rule.idle,
                            hw_age: spec.age.is_some(),
                            counted: spec.count,
                            last: FlowCounts::default(),
                            changed: now,
                        },
                    ),
                );
                Ok(())
            }
            Err(e) => {
                let r = refusal(&e);
                if let Refusal::Unsupported(why) = &r {
                    if self.refused.len() < SHAPES_MAX {
                        self.refused.insert(shape, why.to_string());
                    }
                }
                Err(r)
            }
        }
    }

    fn remove(&mut self, id: FlowId) -> Result<(), String> {
        let Some((flow, meta)) = self.flows.remove(&id) else {
            return Ok(());
        };
        flow.destroy().map_err(|(flow, e)| {
            // Maybe still in hardware: held, to be removed again.
            self.flows.insert(id, (flow, meta));
            e.to_string()
        })
    }

    fn counts(&mut self, id: FlowId) -> Option<FlowCounts> {
        let (flow, f) = self.flows.get_mut(&id)?;
        if !f.counted {
            return None;
        }
        let (packets, bytes) = flow.counts().ok()?;
        let now = FlowCounts { packets, bytes };
        if now != f.last {
            f.last = now;
            f.changed = Instant::now();
        }
        Some(now)
    }

    fn aged(&mut self, now: Instant, out: &mut Vec<FlowId>) {
        // Hardware ages: on the proxy, or on each port.
        let ports: Vec<u16> = match self.mode {
            FlowMode::Transfer { proxy } => vec![proxy],
            FlowMode::Ingress => self
                .ports
                .iter()
                .zip(&self.caps)
                .filter(|(_, c)| c.age)
                .map(|(p, _)| p.id)
                .collect(),
        };
        let mut contexts = std::mem::take(&mut self.aged_scratch);
        for port in ports {
            contexts.clear();
            if flow::aged(port, &mut contexts, 256).is_ok() {
                out.extend(contexts.iter().filter(|id| self.flows.contains_key(id)));
            }
        }
        self.aged_scratch = contexts;
        // Software ages where hardware has none: idle counters, or the
        // rule's whole age without counters.
        for (&id, (_, f)) in &self.flows {
            if !f.hw_age && now.saturating_duration_since(f.changed) >= f.idle {
                out.push(id);
            }
        }
    }
}
