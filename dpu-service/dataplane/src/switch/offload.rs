//! The switch's side of flow offload ([`crate::offload`]): which
//! connections it offers to flow hardware, when it withdraws them, what
//! it does with the flows hardware hands back, and the model NIC run in
//! front of the pipeline.
//!
//! A direction of a TCP connection is offered once the connection is
//! established (both FINs unseen) and a segment without SYN, FIN or RST
//! of that direction has passed here on the connection's state, to a
//! single, plain way out (a learned destination or the tenant's only
//! other attachment, neither in a VXLAN tunnel): the rule is what this
//! packet was given. Its connection then does not expire here while a
//! direction is in hardware. A FIN or RST seen here (hardware does not
//! match them) withdraws the connection's flows; a flow hardware hands
//! back (aged, or removed by a configuration change) is taken back by its
//! connection, which may offer it again at its next packet; one that was
//! refused (no room, past the rate) is not offered again.
//!
//! A flow the tenant's rules deny, or allow without connection tracking
//! and rate limit, is offered (as a drop, or to its single plain way
//! out) once `stateless_after` of its packets got that verdict here, if
//! it is not tunnelled and not a fragment (see
//! [`crate::offload::stateless`]); a connection a stateful rule opens
//! withdraws such a rule of its 5-tuple.

use std::time::Duration;

use crate::conntrack::{offload_bit, ConnKey, ConnState, ConnTable, Dir, TcpState, FIN, RST};
use crate::io::Packet;
use crate::offload::stateless::Verdict as Stateless;
use crate::offload::{FlowAction, FlowMatch, FlowRule, OffloadLink, ReturnReason};
use crate::wire::{proto, FlowKey, L3};
use crate::worker::{Egress, Verdict};

use super::state::SwitchPipeline;

/// Flows handed back that one turn takes, at most.
const RETURNED_PER_TURN: usize = 256;

/// Where a packet came from, as a rule for its flow matches it.
#[derive(Clone, Copy)]
pub(super) struct Arrival {
    /// Its tenant's stable ID.
    pub(super) tenant: u32,
    /// The port it came in on.
    pub(super) port: usize,
    /// Its attachment's VLAN ID (0: the whole port).
    pub(super) vlan: u16,
    pub(super) src_mac: [u8; 6],
    pub(super) dst_mac: [u8; 6],
}

impl Arrival {
    /// The rule for the flow `key` of packets arriving so, doing
    /// `action` as (stateless) rule `rule` says; `None` for a port
    /// hardware cannot name.
    fn rule(
        &self,
        key: FlowKey,
        action: FlowAction,
        idle: Duration,
        rule: Option<u32>,
    ) -> Option<FlowRule> {
        Some(FlowRule {
            tenant: self.tenant,
            matches: FlowMatch {
                in_port: u16::try_from(self.port).ok()?,
                vni: None,
                vlan: (self.vlan != 0).then_some(self.vlan),
                src_mac: self.src_mac,
                dst_mac: self.dst_mac,
                key,
            },
            action,
            idle,
            rule,
        })
    }
}

/// A packet that passed on a connection's state, as offload needs it.
pub(super) struct Passed {
    pub(super) at: Arrival,
    pub(super) l3: L3,
    /// Its connection's slot.
    pub(super) slot: u32,
    /// Its direction in the connection.
    pub(super) dir: Dir,
}

/// Offers `p`'s direction to flow hardware through `link` with `egress`
/// as its way out (decided under configuration `generation`), or
/// withdraws its connection on a FIN or RST.
#[inline(never)]
pub(super) fn offload_step(
    link: &mut OffloadLink,
    conns: &mut ConnTable,
    generation: u64,
    p: &Passed,
    egress: Option<Egress>,
) {
    let L3::Ip { key, tcp_flags, .. } = p.l3 else {
        return;
    };
    let bits = conns.offloaded(p.slot);
    if key.proto != proto::TCP {
        return;
    }
    if tcp_flags & (FIN | RST) != 0 {
        if bits != 0 && link.lane.withdraw(p.at.tenant, &key).is_ok() {
            conns.set_offloaded(p.slot, 0);
        }
        return;
    }
    let bit = offload_bit(p.dir);
    let established = conns.state(p.slot) == ConnState::Tcp(TcpState::Established, 0);
    let refused = conns.offload_refused(p.slot);
    let (Some(e), true, 0, false) = (egress, established, bits & bit, refused) else {
        return;
    };
    // Established packets count as no rule's matches.
    let Some(rule) = p.at.rule(key, FlowAction::Forward(e), link.idle, None) else {
        return;
    };
    if link.lane.offer(rule, generation).is_some() {
        conns.set_offloaded(p.slot, bits | bit);
    }
}

/// A packet of a stateless verdict, as a rule for its flow needs it.
pub(super) struct StatelessPacket {
    pub(super) at: Arrival,
    pub(super) key: FlowKey,
    /// The stable ID of the rule whose verdict it got (none: the
    /// tenant's default).
    pub(super) rule: Option<u32>,
}

/// Counts `p` toward a rule for its flow, and offers the rule (decided
/// under configuration `generation`, at second `now`) when its count is
/// reached: a drop, or a forward out of `egress` (allowed flows without
/// a single plain way out are not counted).
#[inline(never)]
pub(super) fn stateless_step(
    link: &mut OffloadLink,
    generation: u64,
    now: u64,
    p: &StatelessPacket,
    egress: Option<Option<Egress>>,
) {
    let Some(d) = link.stateless.as_mut() else {
        return;
    };
    let (verdict, action) = match egress {
        None => (Stateless::Deny, FlowAction::Drop),
        Some(Some(e)) => (Stateless::Allow, FlowAction::Forward(e)),
        Some(None) => return,
    };
    let tenant = p.at.tenant;
    if !d.count(tenant, &p.key, verdict, now) {
        return;
    }
    let Some(rule) = p.at.rule(p.key, action, link.idle, p.rule) else {
        return;
    };
    let queued = link.lane.offer(rule, generation).is_some();
    d.offered(tenant, &p.key, queued);
}

/// A connection of (`tenant`, `key`) was opened: a stateless rule of its
/// 5-tuple in hardware, in either direction, is withdrawn (one the lane
/// has no room for stays until it ages).
pub(super) fn opened(link: &mut OffloadLink, tenant: u32, key: &FlowKey) {
    if let Some(d) = link.stateless.as_mut() {
        if d.opened(tenant, key) {
            let _ = link.lane.withdraw(tenant, key);
        }
    }
}

impl SwitchPipeline {
    /// Between bursts: the model NIC takes its changes, and connections
    /// take back (a bounded number of) the flows hardware handed back.
    pub(super) fn offload_turn(&mut self) {
        let Some(link) = self.offload.as_deref_mut() else {
            return;
        };
        // Stations that moved: the flows to and from them forward by
        // their old place.
        if self.macs.moved() {
            let tenants = &self.compiled.tenants;
            let lane = &mut link.lane;
            // What the lane has no room for waits for the next turn.
            let lost = self.macs.take_moves(|ti, mac| {
                tenants
                    .get(ti as usize)
                    .is_none_or(|t| lane.withdraw_mac(t.uid, mac).is_ok())
            });
            if lost {
                // More moved than could be kept: every flow of the lane
                // goes, asked for until there is room.
                self.withdraw_all_pending = true;
            }
        }
        if self.withdraw_all_pending && link.lane.withdraw_all().is_ok() {
            self.withdraw_all_pending = false;
        }
        // What the last turn's bursts offered and withdrew.
        link.lane.flush();
        if let Some(m) = &mut link.model {
            m.turn();
        }
        for _ in 0..RETURNED_PER_TURN {
            let Some(r) = link.lane.returned() else {
                break;
            };
            let refused = r.reason == ReturnReason::Refused;
            if let Some(d) = link.stateless.as_mut() {
                if d.returned(r.tenant, &r.key, refused, self.now) {
                    continue; // a stateless verdict's
                }
            }
            let Some(ck) = ConnKey::of(r.tenant, &r.key, 0) else {
                continue;
            };
            if let Some((slot, dir)) = self.conns.find(&ck, self.now) {
                let bits = self.conns.offloaded(slot) & !offload_bit(dir);
                self.conns.set_offloaded(slot, bits);
                // Its last packet went by in hardware: as long ago as the
                // flow's age when it aged, maybe just now otherwise.
                let ago = match r.reason {
                    ReturnReason::Aged => link.idle.as_secs(),
                    _ => 0,
                };
                self.conns.seen_in_hardware(slot, self.now, ago);
                if r.reason == ReturnReason::Refused {
                    // Not offered again: a tenant past its share would
                    // otherwise offer at every packet.
                    self.conns.set_offload_refused(slot);
                }
            }
        }
    }

    /// Hands each packet of `burst` (received on `in_port`) that the model
    /// NIC carries to `sink` with its verdict, leaving the rest in order.
    #[inline]
    pub(super) fn model_carry<P: Packet>(
        &mut self,
        in_port: usize,
        burst: &mut Vec<P>,
        sink: &mut impl FnMut(P, &Verdict, &[crate::worker::Egress]),
    ) {
        let Some(model) = self
            .offload
            .as_deref()
            .and_then(|l| l.model.as_ref())
            .filter(|m| !m.is_empty())
        else {
            return;
        };
        let now = self.epoch + Duration::from_micros(self.now_us);
        let mut i = 0;
        while i < burst.len() {
            match model.carry(in_port, burst[i].data(), now) {
                Some(action) => {
                    let pkt = burst.remove(i);
                    let v = match action {
                        FlowAction::Forward(e) => Verdict::Forward(e),
                        FlowAction::Drop => Verdict::Drop(crate::worker::DropReason::AclDeny),
                    };
                    sink(pkt, &v, &[]);
                }
                None => i += 1,
            }
        }
    }
}
