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
//!
//! The files, by concern:
//! - `config`: the configuration types and [`ConfigError`];
//! - `compile`: a configuration checked and compiled into a snapshot;
//! - `epoch`: what the handle and its pipelines share (publication);
//! - `handle`: [`SwitchHandle`];
//! - `endpoint_ports`: storage endpoints, compiled into attachments on
//!   virtual ports;
//! - `police`: rate limits;
//! - `counters`: the per-worker counter cells; `traffic`: what they sum to;
//! - `state`: [`SwitchPipeline`], one worker's state; `frame`: what a
//!   frame carries from stage to stage;
//! - `pipeline`: the worker's turn and the burst loop;
//! - `inspect`, `recall`, `filter`, `decide`: the stages of a frame;
//! - `offload`: connections offered to flow hardware, and the model NIC
//!   in front of the pipeline;
//! - `saved`: the connection and fragment tables across a restart, and
//!   their file; `restart`: saving and restoring them.
//!
//! [`Classifier`]: crate::classify::Classifier
//! [`FlowCache`]: crate::flowcache::FlowCache
//! [`ConnTable`]: crate::conntrack::ConnTable

mod compile;
mod config;
mod counters;
mod decide;
mod endpoint_ports;
#[cfg(test)]
mod endpoint_ports_tests;
mod epoch;
mod filter;
#[cfg(test)]
mod fragment_tests;
mod frame;
mod handle;
mod inspect;
mod offload;
#[cfg(test)]
mod offload_tests;
mod pipeline;
mod police;
mod recall;
mod restart;
mod saved;
mod sizes;
mod state;
#[cfg(test)]
mod testing;
mod traffic;

pub use compile::FLOW_CACHE_MIN_RULES;
pub use compile::{Compiled, Published};
pub use config::{
    Attach, ConfigError, Guard, RateLimit, SwitchConfig, SwitchRule, TenantConfig, Vtep,
};
pub use endpoint_ports::{Endpoint, EndpointLink, EndpointPort};
pub use handle::SwitchHandle;
pub use saved::{RestoreReport, Restored, SavedError, SavedTables};
pub use sizes::{
    SizeError, MAX_CONNTRACK, MAX_FLOW_CACHE, MAX_FRAGMENTS, MAX_FRAGMENT_TIMEOUT, MAX_MAC_TABLE,
    MAX_WORKERS,
};
pub use state::SwitchPipeline;
pub use traffic::{RuleTraffic, TenantTraffic, Traffic};
