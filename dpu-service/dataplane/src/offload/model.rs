//! A model of flow hardware: a provider that behaves like a NIC with
//! limits, and carries the traffic of its flows in-process.
//!
//! The NIC is one table of [`ModelLimits::table`] rules, with the items
//! and actions it refuses ([`Refuse`]) and, if asked, an insertion that
//! fails every so often. Where it sits is split by the worker that offered
//! each flow: with a symmetric RSS key both directions of a flow arrive at
//! that worker's queues, so each worker holds a [`ModelLane`], the part of
//! the table its queues see, and runs it on every packet before its
//! pipeline, as a NIC would before the packet reached the queue. A lane
//! takes the provider's changes between bursts, through a bounded queue,
//! and only the worker writes its flows' counters.
//!
//! [`ModelNic::commit`] waits (bounded) until every lane with changes has
//! taken them: once it returns, no packet matches a removed flow.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use hashbrown::HashMap;

use super::TCP_SOFTWARE_FLAGS;
use super::{lane_of, FlowAction, FlowCounts, FlowId, FlowMatch, FlowRule, Provider, Refusal};
use crate::wire::{self, L3};
use crate::worker::VlanOp;

/// Changes a lane's queue holds before the provider waits for it.
const LANE_QUEUE: usize = 4096;

/// How long [`ModelNic::commit`] waits for a lane to take its changes
/// before it reports the removals as failed.
pub const COMMIT_WAIT: Duration = Duration::from_secs(2);

/// Items and actions the model refuses, as a NIC without them would.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Refuse {
    /// IPv6 matches.
    pub ipv6: bool,
    /// A VXLAN VNI in the match (decapsulation).
    pub vxlan_decap: bool,
    /// VXLAN encapsulation on the way out.
    pub vxlan_encap: bool,
    /// Pushing or rewriting a VLAN tag.
    pub vlan_push: bool,
}

/// The model NIC's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLimits {
    /// Rules its table holds.
    pub table: usize,
    /// What it refuses.
    pub refuse: Refuse,
    /// Every this many insertions, one fails (0: none fails).
    pub fail_every: u32,
}

impl Default for ModelLimits {
    fn default() -> ModelLimits {
        ModelLimits {
            table: 65_536,
            refuse: Refuse::default(),
            fail_every: 0,
        }
    }
}

/// One flow's counter cells: written by its lane's worker only, read by
/// the provider.
#[derive(Debug, Default)]
struct Cells {
    packets: AtomicU64,
    bytes: AtomicU64,
    /// Nanoseconds from the model's start to its last packet, plus one;
    /// 0 while it has had none.
    last: AtomicU64,
}

/// What the provider and the lanes share.
#[derive(Debug)]
struct Shared {
    /// One cell per table entry, by slot.
    cells: Box<[Cells]>,
    /// Changes for each lane.
    queues: Box<[ArrayQueue<Change>]>,
    /// Changes each lane has taken, for the provider's waits.
    taken: Box<[AtomicU64]>,
    start: Instant,
}

impl Shared {
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX)
    }
}

#[derive(Debug, Clone, Copy)]
enum Change {
    Insert {
        matches: FlowMatch,
        slot: u32,
        action: FlowAction,
    },
    Remove {
        matches: FlowMatch,
    },
}

/// An installed flow, as the provider keeps it.
#[derive(Debug, Clone, Copy)]
struct Installed {
    slot: u32,
    matches: FlowMatch,
    idle: Duration,
    at: Instant,
}

/// The model NIC: a [`Provider`] for the offload thread.
#[derive(Debug)]
pub struct ModelNic {
    limits: ModelLimits,
    shared: Arc<Shared>,
    flows: HashMap<FlowId, Installed>,
    free: Vec<u32>,
    /// Changes sent to each lane.
    sent: Vec<u64>,
    /// Changes that found their lane's queue full, in order, per lane.
    backlog: Vec<Vec<Change>>,
    inserts: u64,
}

/// The lanes of a model NIC, in worker order.
pub type ModelLanes = Vec<ModelLane>;

/// A worker's part of the model NIC: the flows its queues see.
#[derive(Debug)]
pub struct ModelLane {
    lane: usize,
    shared: Arc<Shared>,
    flows: HashMap<FlowMatch, (u32, FlowAction)>,
}

impl ModelNic {
    /// A model NIC with `limits`, seen by `lanes` workers (the lanes, in
    /// worker order, go to the workers).
    pub fn new(limits: ModelLimits, lanes: usize) -> (ModelNic, ModelLanes) {
        let table = limits.table.min(u32::MAX as usize);
        let shared = Arc::new(Shared {
            cells: (0..table).map(|_| Cells::default()).collect(),
            queues: (0..lanes).map(|_| ArrayQueue::new(LANE_QUEUE)).collect(),
            taken: (0..lanes).map(|_| AtomicU64::new(0)).collect(),
            start: Instant::now(),
        });
        let nic = ModelNic {
            limits,
            shared: shared.clone(),
            flows: HashMap::with_capacity(table),
            free: (0..table as u32).rev().collect(),
            sent: vec![0; lanes],
            backlog: vec![Vec::new(); lanes],
            inserts: 0,
        };
        let lanes = (0..lanes)
            .map(|lane| ModelLane {
                lane,
                shared: shared.clone(),
                flows: HashMap::with_capacity(table.min(1 << 16)),
            })
            .collect();
        (nic, lanes)
    }

    fn unsupported(&self, rule: &FlowRule) -> Option<&'static str> {
        let r = self.limits.refuse;
        if r.ipv6 && rule.matches.key.v6 {
            return Some("IPv6 match");
        }
        if r.vxlan_decap && rule.matches.vni.is_some() {
            return Some("VXLAN match");
        }
        if let FlowAction::Forward(e) = rule.action {
            if r.vxlan_encap && e.tunnel.is_some() {
                return Some("VXLAN encapsulation");
            }
            if r.vlan_push && matches!(e.vlan, VlanOp::Push(_) | VlanOp::Set(_)) {
                return Some("VLAN push");
            }
        }
        None
    }

    fn send(&mut self, lane: usize, change: Change) {
        let Some(q) = self.shared.queues.get(lane) else {
            return;
        };
        self.sent[lane] += 1;
        if !self.backlog[lane].is_empty() {
            self.backlog[lane].push(change);
            return;
        }
        if let Err(c) = q.push(change) {
            self.backlog[lane].push(c);
        }
    }

    /// Moves backlogged changes into their lanes' queues as room allows.
    fn flush(&mut self) {
        for (lane, backlog) in self.backlog.iter_mut().enumerate() {
            let q = &self.shared.queues[lane];
            let mut moved = 0;
            for c in backlog.iter() {
                if q.push(*c).is_err() {
                    break;
                }
                moved += 1;
            }
            backlog.drain(..moved);
        }
    }

    /// Whether every lane has taken every change sent to it.
    fn settled(&self) -> bool {
        self.sent
            .iter()
            .zip(self.shared.taken.iter())
            .all(|(&sent, taken)| taken.load(Ordering::Acquire) >= sent)
    }
}

impl Provider for ModelNic {
    fn name(&self) -> &'static str {
        "model"
    }

    fn capacity(&self) -> usize {
        self.shared.cells.len()
    }

    fn insert(&mut self, id: FlowId, rule: &FlowRule) -> Result<(), Refusal> {
        if let Some(what) = self.unsupported(rule) {
            return Err(Refusal::Unsupported(what.into()));
        }
        if lane_of(id) >= self.sent.len() {
            return Err(Refusal::Failed(format!("no lane {}", lane_of(id))));
        }
        if self.flows.contains_key(&id) {
            return Err(Refusal::Failed(format!("flow {id:#x} is installed")));
        }
        self.inserts += 1;
        if self.limits.fail_every > 0
            && self
                .inserts
                .is_multiple_of(u64::from(self.limits.fail_every))
        {
            return Err(Refusal::Failed("the model's injected failure".into()));
        }
        let slot = self.free.pop().ok_or(Refusal::TableFull)?;
        let cells = &self.shared.cells[slot as usize];
        cells.packets.store(0, Ordering::Relaxed);
        cells.bytes.store(0, Ordering::Relaxed);
        cells.last.store(0, Ordering::Relaxed);
        self.flows.insert(
            id,
            Installed {
                slot,
                matches: rule.matches,
                idle: rule.idle,
                at: Instant::now(),
            },
        );
        self.send(
            lane_of(id),
            Change::Insert {
                matches: rule.matches,
                slot,
                action: rule.action,
            },
        );
        Ok(())
    }

    fn remove(&mut self, id: FlowId) -> Result<(), String> {
        if let Some(f) = self.flows.remove(&id) {
            self.send(lane_of(id), Change::Remove { matches: f.matches });
            self.free.push(f.slot);
        }
        Ok(())
    }

    fn counts(&mut self, id: FlowId) -> Option<FlowCounts> {
        let f = self.flows.get(&id)?;
        let c = &self.shared.cells[f.slot as usize];
        Some(FlowCounts {
            packets: c.packets.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
        })
    }

    fn aged(&mut self, now: Instant, out: &mut Vec<FlowId>) {
        let shared = &self.shared;
        for (&id, f) in &self.flows {
            let last = shared.cells[f.slot as usize].last.load(Ordering::Relaxed);
            let since = if last == 0 {
                now.saturating_duration_since(f.at)
            } else {
                Duration::from_nanos(shared.nanos(now).saturating_sub(last - 1))
            };
            if since > f.idle {
                out.push(id);
            }
        }
    }

    /// Waits, at most [`COMMIT_WAIT`], until every lane has taken the
    /// changes sent to it. A lane that does not (its worker stopped or
    /// stuck) keeps them queued, and the commit fails.
    fn commit(&mut self) -> Result<(), String> {
        let until = Instant::now() + COMMIT_WAIT;
        loop {
            self.flush();
            if self.settled() {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(format!(
                    "a worker did not take the model's changes within {COMMIT_WAIT:?}"
                ));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

impl ModelLane {
    /// Takes the provider's changes (between bursts). Returns how many.
    pub fn turn(&mut self) -> usize {
        let Some(q) = self.shared.queues.get(self.lane) else {
            return 0;
        };
        let mut n = 0;
        while let Some(c) = q.pop() {
            match c {
                Change::Insert {
                    matches,
                    slot,
                    action,
                } => {
                    self.flows.insert(matches, (slot, action));
                }
                Change::Remove { matches } => {
                    self.flows.remove(&matches);
                }
            }
            n += 1;
        }
        if n > 0 {
            self.shared.taken[self.lane].fetch_add(n as u64, Ordering::Release);
        }
        n
    }

    /// Flows this lane holds.
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// True if it holds none.
    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    /// What the NIC does with `frame`, arriving on `in_port` (untunnelled)
    /// at `now`: the action of the flow it matches, counted, or `None`
    /// for software.
    pub fn carry(&self, in_port: usize, frame: &[u8], now: Instant) -> Option<FlowAction> {
        if self.flows.is_empty() {
            return None;
        }
        let h = wire::parse(frame).ok()?;
        let L3::Ip {
            key,
            tcp_flags,
            fragment: None,
            ..
        } = h.l3
        else {
            return None;
        };
        let m = FlowMatch {
            in_port: u16::try_from(in_port).ok()?,
            vni: None,
            vlan: h.vlan,
            src_mac: h.src_mac,
            dst_mac: h.dst_mac,
            key,
        };
        let &(slot, action) = self.flows.get(&m)?;
        // A forwarding rule leaves TCP's handshake and close to software;
        // a drop rule drops every segment.
        let forward = matches!(action, FlowAction::Forward(_));
        if forward && key.proto == wire::proto::TCP && tcp_flags & TCP_SOFTWARE_FLAGS != 0 {
            return None;
        }
        let c = &self.shared.cells[slot as usize];
        // Only this lane's worker writes its flows' cells.
        c.packets
            .store(c.packets.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        c.bytes.store(
            c.bytes.load(Ordering::Relaxed) + frame.len() as u64,
            Ordering::Relaxed,
        );
        c.last
            .store(self.shared.nanos(now).saturating_add(1), Ordering::Relaxed);
        Some(action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::build;
    use crate::wire::FlowKey;
    use crate::worker::Egress;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    fn frame(flags: u8) -> Vec<u8> {
        let l4 = build::tcp(40000, 80, flags);
        let mut f = build::eth(B, A, None, wire::ETH_IPV4);
        f.extend(build::ipv4(
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            wire::proto::TCP,
            &l4,
        ));
        f
    }

    fn rule() -> FlowRule {
        FlowRule {
            tenant: 1,
            matches: FlowMatch {
                in_port: 0,
                vni: None,
                vlan: None,
                src_mac: A,
                dst_mac: B,
                key: FlowKey {
                    src: 0x0a00_0001,
                    dst: 0x0a00_0002,
                    src_port: 40000,
                    dst_port: 80,
                    proto: wire::proto::TCP,
                    v6: false,
                },
            },
            action: FlowAction::Forward(Egress::to(1)),
            idle: Duration::from_secs(10),
            rule: None,
        }
    }

    #[test]
    fn a_flow_carries_its_packets_and_counts_them_until_removed() {
        let (mut nic, mut lanes) = ModelNic::new(ModelLimits::default(), 2);
        let id = 1 << 48 | 7;
        nic.insert(id, &rule()).unwrap();
        nic.flush();
        assert_eq!(lanes[0].turn(), 0, "lane 1's flow is not lane 0's");
        assert_eq!(lanes[1].turn(), 1);
        nic.commit().unwrap();
        let ack = frame(0x10);
        let now = Instant::now();
        assert_eq!(lanes[0].carry(0, &ack, now), None);
        assert_eq!(
            lanes[1].carry(0, &ack, now),
            Some(FlowAction::Forward(Egress::to(1)))
        );
        assert_eq!(lanes[1].carry(1, &ack, now), None, "another input port");
        for flags in [0x02, 0x01 | 0x10, 0x04] {
            assert_eq!(lanes[1].carry(0, &frame(flags), now), None, "{flags:#x}");
        }
        assert_eq!(
            nic.counts(id),
            Some(FlowCounts {
                packets: 1,
                bytes: ack.len() as u64
            })
        );
        nic.remove(id).unwrap();
        nic.flush();
        lanes[1].turn();
        nic.commit().unwrap();
        assert_eq!(lanes[1].carry(0, &ack, now), None);
        assert_eq!(nic.counts(id), None);
    }

    #[test]
    fn the_table_fills_refuses_and_fails_as_configured() {
        let limits = ModelLimits {
            table: 2,
            refuse: Refuse {
                ipv6: true,
                vlan_push: true,
                ..Refuse::default()
            },
            fail_every: 3,
        };
        let (mut nic, _lanes) = ModelNic::new(limits, 1);
        let mut v6 = rule();
        v6.matches.key.v6 = true;
        assert_eq!(
            nic.insert(10, &v6),
            Err(Refusal::Unsupported("IPv6 match".into()))
        );
        let mut push = rule();
        push.action = FlowAction::Forward(Egress {
            vlan: VlanOp::Push(5),
            ..Egress::to(1)
        });
        assert_eq!(
            nic.insert(11, &push),
            Err(Refusal::Unsupported("VLAN push".into()))
        );
        nic.insert(1, &rule()).unwrap();
        nic.insert(2, &rule()).unwrap();
        assert!(matches!(nic.insert(3, &rule()), Err(Refusal::Failed(_))));
        assert_eq!(nic.insert(4, &rule()), Err(Refusal::TableFull));
        nic.remove(1).unwrap();
        nic.insert(4, &rule()).unwrap();
        assert!(matches!(nic.insert(4, &rule()), Err(Refusal::Failed(_))));
        assert!(matches!(
            nic.insert(9 << 48, &rule()),
            Err(Refusal::Failed(_))
        ));
    }

    #[test]
    fn flows_age_by_their_last_packet() {
        let (mut nic, mut lanes) = ModelNic::new(ModelLimits::default(), 1);
        nic.insert(1, &rule()).unwrap();
        let mut quiet = rule();
        quiet.matches.key.src_port = 1;
        nic.insert(2, &quiet).unwrap();
        lanes[0].turn();
        nic.commit().unwrap();
        let t0 = Instant::now();
        let mut out = Vec::new();
        nic.aged(t0 + Duration::from_secs(5), &mut out);
        assert!(out.is_empty());
        lanes[0].carry(0, &frame(0x10), t0 + Duration::from_secs(8));
        nic.aged(t0 + Duration::from_secs(15), &mut out);
        assert_eq!(out, vec![2], "the quiet one ages; the busy one does not");
        out.clear();
        nic.aged(t0 + Duration::from_secs(19), &mut out);
        out.sort_unstable();
        assert_eq!(out, vec![1, 2]);
    }

    #[test]
    fn changes_past_a_lanes_queue_wait_their_turn_in_order() {
        let limits = ModelLimits {
            table: LANE_QUEUE * 2,
            ..ModelLimits::default()
        };
        let (mut nic, mut lanes) = ModelNic::new(limits, 1);
        for i in 0..(LANE_QUEUE as u64 + 10) {
            let mut r = rule();
            r.matches.key.src_port = i as u16;
            nic.insert(i, &r).unwrap();
        }
        nic.remove(0).unwrap();
        assert!(!nic.settled());
        assert_eq!(lanes[0].turn(), LANE_QUEUE);
        nic.flush();
        assert_eq!(lanes[0].turn(), 11);
        assert!(nic.settled());
        assert_eq!(lanes[0].len(), LANE_QUEUE + 9);
    }
}
