//! Flow offload: the flows software has decided, handed to a switch in
//! front of the cores (a BlueField's eSwitch) so that their later packets
//! never reach a worker.
//!
//! - A [`FlowRule`] is what hardware can carry out on its own: an exact
//!   match on a flow's headers ([`FlowMatch`]: input port, VXLAN VNI,
//!   outer VLAN, MAC addresses, the 5-tuple), one action ([`FlowAction`]:
//!   forward out of a port with its tag and tunnel operations, or drop),
//!   a packet and byte counter, and an idle age.
//! - A [`Provider`] installs rules in one kind of hardware and reports
//!   what it refused, the counters and the flows that aged. It runs on
//!   the offload thread only: inserting into a NIC's table takes
//!   microseconds to milliseconds, which no worker may wait for.
//! - The [`Offloader`] owns that thread. Workers offer rules through
//!   their [`Lane`], a bounded queue that never blocks: what it cannot
//!   take stays in software. The thread holds each tenant to its share of
//!   the table (a reserve plus a shared pool, as the connection table
//!   does), limits insertions to a rate, removes flows before a change
//!   that covers them is acknowledged, folds the counters of offloaded
//!   flows back per tenant and reports aged flows to the worker that
//!   offered them.
//! - [`rte_flow::RteFlowNic`] installs rules through DPDK's `rte_flow`:
//!   transfer rules of an embedded switch (a BlueField's eSwitch), or
//!   drop rules of ports without one.
//! - [`model::ModelNic`] is a provider that behaves like a NIC with
//!   limits (a table size, shapes it refuses, insertions that fail) and
//!   carries the traffic of its flows in-process, for tests and for
//!   machines without an eSwitch.
//!
//! TCP flows forwarded in hardware are matched only for segments without
//! SYN, FIN or RST, as the hardware rule's flag mask says: the handshake
//! and the close always reach software, so connection tracking sees them
//! and withdraws the flow exactly when the connection ends. Drop rules
//! (of flows the tenant's rules deny) drop every segment.

mod engine;
pub mod model;
#[cfg(feature = "dpdk")]
pub mod rte_flow;
pub mod stateless;

pub use engine::{
    Lane, OffloadConfig, OffloadError, OffloadStatus, Offloader, ReturnReason, Returned,
    RuleOffload, TenantOffload, Withdraw,
};

use std::time::{Duration, Instant};

use crate::wire::FlowKey;
use crate::worker::Egress;

/// Identifies one offloaded flow: chosen by the worker that offered it
/// (its lane in the top 16 bits), unique for the offloader's life.
pub type FlowId = u64;

/// What one worker's switch holds of the offloader: its lane, the model
/// NIC's lane when the provider is the model, the age the flows it
/// offers get, and its count of flows of stateless verdicts when those
/// are offered.
#[derive(Debug)]
pub struct OffloadLink {
    /// The worker's lane to the offload thread.
    pub lane: Lane,
    /// The part of the model NIC in front of the worker's queues.
    pub model: Option<model::ModelLane>,
    /// How long an offered flow may go without a packet in hardware.
    pub idle: Duration,
    /// Flows of stateless verdicts counted toward a rule (`None`: they
    /// stay on the cores).
    pub stateless: Option<stateless::Stateless>,
}

impl OffloadLink {
    /// Each worker's link, in worker order: its lane, and its lane of the
    /// model NIC when there is one (`models`, in the same order); flows
    /// of stateless verdicts are offered after `stateless_after` packets
    /// (0: never).
    pub fn each(
        lanes: Vec<Lane>,
        models: Option<model::ModelLanes>,
        idle: Duration,
        stateless_after: u16,
    ) -> Vec<OffloadLink> {
        let mut models = models.map(Vec::into_iter);
        lanes
            .into_iter()
            .map(|lane| OffloadLink {
                lane,
                model: models.as_mut().and_then(Iterator::next),
                idle,
                stateless: (stateless_after > 0)
                    .then(|| stateless::Stateless::new(stateless_after)),
            })
            .collect()
    }
}

/// One DPDK port of the data plane, as the provider needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowPort {
    /// The port's name in the configuration.
    pub name: String,
    /// Its DPDK port ID.
    pub id: u16,
    /// Its driver (`net_mlx5`, `net_tap`).
    pub driver: String,
    /// The embedded switch it belongs to, if any.
    pub switch_domain: Option<u16>,
}

/// The worker lane a flow ID came from.
pub fn lane_of(id: FlowId) -> usize {
    (id >> 48) as usize
}

/// The TCP flags whose segments a TCP flow's rule does not match.
pub const TCP_SOFTWARE_FLAGS: u8 = 0x01 | 0x02 | 0x04; // FIN | SYN | RST

/// The headers of one direction of a flow, matched exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowMatch {
    /// The port it arrives on (a represented port on an eSwitch).
    pub in_port: u16,
    /// The VXLAN network identifier it arrives in, if it is tunnelled
    /// (the outer headers are then the attachment's VTEP's).
    pub vni: Option<u32>,
    /// The VLAN ID of its outer 802.1Q tag, if it has one.
    pub vlan: Option<u16>,
    /// Source MAC address (of the inner frame, when tunnelled).
    pub src_mac: [u8; 6],
    /// Destination MAC address.
    pub dst_mac: [u8; 6],
    /// Addresses, protocol and ports.
    pub key: FlowKey,
}

/// What hardware does with a matched packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowAction {
    /// Out of one port, with its tag and tunnel operations.
    Forward(Egress),
    /// Dropped.
    Drop,
}

/// One flow rule: a match, an action, a counter (always) and an age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowRule {
    /// The tenant whose flow it is (its stable switch ID): whose share of
    /// the table it takes and whose counters it adds to.
    pub tenant: u32,
    /// What it matches.
    pub matches: FlowMatch,
    /// What it does.
    pub action: FlowAction,
    /// How long it may go without a packet before it ages out.
    pub idle: Duration,
    /// The stable ID of the tenant's rule whose stateless verdict this
    /// is ([`crate::switch::SwitchHandle::rule_names`]), if one: the
    /// packets it carries or drops count as the rule's matches.
    pub rule: Option<u32>,
}

/// A packet and byte count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowCounts {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Why a provider did not install a rule. The flow stays in software.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The hardware cannot express the rule (an item or action it does
    /// not support, named).
    #[error("unsupported: {0}")]
    Unsupported(std::borrow::Cow<'static, str>),
    /// The hardware table is full.
    #[error("table full")]
    TableFull,
    /// The insertion failed for another reason (the driver's message).
    #[error("insertion failed: {0}")]
    Failed(String),
}

/// One kind of flow hardware, driven from the offload thread only.
pub trait Provider: Send + 'static {
    /// Its name, as configuration and status say it.
    fn name(&self) -> &'static str;

    /// Rules the hardware table holds at most.
    fn capacity(&self) -> usize;

    /// Installs `rule` as flow `id` (an ID not installed).
    ///
    /// # Errors
    /// [`Refusal`] says why it is not installed.
    fn insert(&mut self, id: FlowId, rule: &FlowRule) -> Result<(), Refusal>;

    /// Removes flow `id`; an ID not installed is no error. Once the next
    /// [`Provider::commit`] returns, the hardware matches no more packets
    /// with it.
    ///
    /// # Errors
    /// The driver's message; the offloader then keeps the ID as held and
    /// counts the failure.
    fn remove(&mut self, id: FlowId) -> Result<(), String>;

    /// The packets and bytes flow `id` has carried since it was
    /// installed (`None` if it is not).
    fn counts(&mut self, id: FlowId) -> Option<FlowCounts>;

    /// Appends to `out` the installed flows that have gone longer than
    /// their age without a packet at `now`. They stay installed until
    /// removed.
    fn aged(&mut self, now: Instant, out: &mut Vec<FlowId>);

    /// Makes the insertions and removals so far take effect where they
    /// are batched or asynchronous (called after each round of changes of
    /// the offload thread, and before a removal is acknowledged).
    ///
    /// # Errors
    /// The changes have not all taken effect (the driver's message).
    fn commit(&mut self) -> Result<(), String> {
        Ok(())
    }
}
