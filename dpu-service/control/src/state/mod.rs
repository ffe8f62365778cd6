//! State transitions: each accepted request is one method on [`State`].
//!
//! Methods check the request against the whole state (references exist,
//! claims do not collide, versions match) and either change the state or
//! return an error having changed nothing. What the checks need to know
//! about the rest of the state they look up in its [`Index`], which each
//! method keeps up to date, so a check costs what the change costs (times
//! a logarithm of the state), not a walk over every tenant. They do no I/O; [`crate::store`]
//! runs them on a copy and persists the result before it becomes visible.
//!
//! What every part shares lives here: the machine's [`Limits`], the
//! [`Part`]s a call changes, service-assigned IDs and [`State::revert`],
//! which hands each part to its side. The network side (tenants,
//! attachments, rules) is in `network`, the storage side (subsystems,
//! hosts, namespaces, listeners) in `storage`, the storage clusters in
//! `cluster`, the checks of remote namespaces in `remote`, the QoS limits
//! of namespaces and hosts in `qos`, the hosts' TLS keys and the
//! listeners' secure channels in `tls`, volumes in `volume`.

mod cluster;
mod endpoint;
mod network;
mod qos;
mod remote;
mod storage;
mod tls;
mod volume;

pub use crate::model::Index;
pub use cluster::ClusterUpdate;
pub use endpoint::Endpoint;
pub use network::{PortRegistry, TenantUpdate};
pub use storage::SubsystemUpdate;

use crate::error::{ControlError, Result};
use crate::model::State;
use crate::model::{listener_name, namespace_name};
use crate::validate::{MAX_ATTACHMENTS_PER_TENANT, MAX_RULES_PER_TENANT};

/// Limits that depend on the machine and the configuration, not on the
/// request: how much RAM namespaces may take, and how many of each object
/// the state may hold. A change past a cap is refused with
/// [`ControlError::ResourceExhausted`] naming the configuration key; the
/// counts are running totals kept in the state's [`Index`], so checking
/// a cap costs the same in a state of ten tenants as in one of ten
/// thousand.
///
/// Undoing a tenant's change ([`State::revert`]) puts it back as it was
/// without these checks: the state may then exceed a cap by what that one
/// change had freed, until later changes bring it down. Namespaces and
/// listeners are put back through the checks of the calls that create
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes all RAM-backed namespaces together may use.
    pub ram_bytes: u64,
    /// Most tenants (`limits.max_tenants`).
    pub tenants: usize,
    /// Most attachments of one tenant (`limits.max_attachments_per_tenant`).
    pub attachments_per_tenant: usize,
    /// Most attachments of all tenants together (`limits.max_attachments`).
    pub attachments: usize,
    /// Most rules of one tenant (`limits.max_rules_per_tenant`).
    pub rules_per_tenant: usize,
    /// Most rules of all tenants together (`limits.max_rules`).
    pub rules: usize,
    /// Most subsystems (`limits.max_subsystems`).
    pub subsystems: usize,
    /// Most namespaces of all subsystems together (`limits.max_namespaces`).
    pub namespaces: usize,
    /// Most allowed-host entries of all subsystems together (`limits.max_hosts`).
    pub hosts: usize,
    /// Most listeners of all subsystems together (`limits.max_listeners`).
    pub listeners: usize,
    /// Most volumes (`limits.max_volumes`).
    pub volumes: usize,
}

impl Limits {
    /// The default caps, with `ram_bytes` of RAM namespaces.
    pub const fn with_ram(ram_bytes: u64) -> Limits {
        Limits {
            ram_bytes,
            tenants: 1_024,
            attachments_per_tenant: MAX_ATTACHMENTS_PER_TENANT,
            attachments: 16_384,
            rules_per_tenant: MAX_RULES_PER_TENANT,
            rules: 1_048_576,
            subsystems: 1_024,
            namespaces: 16_384,
            hosts: 65_536,
            listeners: 1_024,
            volumes: 16_384,
        }
    }
}

/// Refuses `count` objects where `max` are allowed.
fn cap(limit: &'static str, max: usize, count: usize, what: impl FnOnce() -> String) -> Result<()> {
    if count > max {
        Err(ControlError::exhausted(limit, max, what()))
    } else {
        Ok(())
    }
}

/// The refusal of a change that would take RAM namespaces and volumes
/// to `total` bytes.
fn ram_refusal(total: u64, limits: Limits) -> ControlError {
    ControlError::FailedPrecondition(format!(
        "RAM namespaces and volumes would use {total} bytes; the service allows {} (storage.ram_limit)",
        limits.ram_bytes
    ))
}

/// One part of the state that a single call changes, and that undoing the
/// call puts back: what [`State::revert`] works on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// A tenant, with its attachments and rules.
    Tenant(String),
    /// Several tenants changed together (one call attaching a port to
    /// the networks of several tenants): undoing the call puts back each.
    Tenants(Vec<String>),
    /// A namespace of a subsystem.
    Namespace {
        /// The subsystem's ID.
        subsystem: String,
        /// The namespace's ID.
        nsid: u32,
    },
    /// A listener of a subsystem.
    Listener {
        /// The subsystem's ID.
        subsystem: String,
        /// The listener's ID.
        id: String,
    },
}

impl Part {
    /// The resource names of the part, as the API spells them: one, or
    /// each tenant of [`Part::Tenants`].
    pub fn resources(&self) -> Vec<String> {
        match self {
            Part::Tenants(ids) => ids.iter().map(|id| format!("tenants/{id}")).collect(),
            other => vec![other.resource()],
        }
    }

    /// The part's resource name, as the API spells it (the names of
    /// [`Part::Tenants`]' tenants, joined by ", ").
    pub fn resource(&self) -> String {
        match self {
            Part::Tenant(id) => format!("tenants/{id}"),
            Part::Tenants(ids) => ids
                .iter()
                .map(|id| format!("tenants/{id}"))
                .collect::<Vec<_>>()
                .join(", "),
            Part::Namespace { subsystem, nsid } => namespace_name(subsystem, *nsid),
            Part::Listener { subsystem, id } => listener_name(subsystem, id),
        }
    }
}

/// What [`State::revert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reverted {
    /// The part is as it was before the change.
    Done,
    /// A later change to the part came first: it stands, and nothing
    /// was changed.
    Superseded,
}

impl State {
    /// Returns a fresh service-assigned ID `"{prefix}-{n}"` that `taken` rejects.
    pub fn next_id(&mut self, prefix: &str, taken: impl Fn(&str) -> bool) -> String {
        loop {
            self.id_seq += 1;
            let id = format!("{prefix}-{}", self.id_seq);
            if !taken(&id) {
                return id;
            }
        }
    }

    /// Undoes what one committed change, from `before` to `after`, did to
    /// `part`: puts the part back as it was in `before`, through the same
    /// checks as the calls that create, change or delete it, provided it
    /// is still as `after` left it. Every other part, and every change
    /// made since, stays as it is. A tenant's rule-set version goes on
    /// growing when its rules are put back.
    ///
    /// # Errors
    /// As the call that puts the part back, when what it held before (an
    /// attachment, a backing file, an address, RAM) has been taken since;
    /// then nothing changes.
    pub fn revert(
        &mut self,
        limits: Limits,
        part: &Part,
        before: &State,
        after: &State,
    ) -> Result<Reverted> {
        match part {
            Part::Tenant(id) => self.revert_tenant(id, before, after),
            Part::Tenants(ids) => {
                // All or none: a tenant changed since stands, and so do
                // the others.
                if ids
                    .iter()
                    .any(|id| self.tenants.get(id) != after.tenants.get(id))
                {
                    return Ok(Reverted::Superseded);
                }
                // One tenant's attachments may be free only once another
                // has given them back: put back those that can be, until
                // all are, or none of the rest can be (its error; the
                // store then keeps nothing of this).
                let mut rest: Vec<&String> = ids.iter().collect();
                while !rest.is_empty() {
                    let mut failed = None;
                    let mut kept = Vec::new();
                    for id in rest.iter().copied() {
                        if let Err(e) = self.revert_tenant(id, before, after) {
                            failed = Some(e);
                            kept.push(id);
                        }
                    }
                    if kept.len() == rest.len() {
                        return Err(failed.unwrap_or_else(|| {
                            ControlError::FailedPrecondition("nothing to put back".into())
                        }));
                    }
                    rest = kept;
                }
                Ok(Reverted::Done)
            }
            Part::Namespace {
                subsystem: id,
                nsid,
            } => self.revert_namespace(limits, id, *nsid, before, after),
            Part::Listener {
                subsystem: id,
                id: lid,
            } => self.revert_listener(limits, id, lid, before, after),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A subsystem `id` (`nqn`) with nothing in it: no namespaces,
    /// listeners, allowed hosts, secrets or limits; the fixture of every
    /// state module's tests, and of the conversions'.
    pub(crate) fn subsystem(
        id: &str,
        nqn: &str,
        allow_any_host: bool,
        max_namespaces: u32,
    ) -> crate::model::Subsystem {
        crate::model::Subsystem {
            id: id.into(),
            nqn: nqn.into(),
            serial_number: "s".into(),
            model_number: "m".into(),
            allow_any_host,
            allowed_hosts: Default::default(),
            max_namespaces,
            create_time: crate::model::Timestamp::now(),
            namespaces: Default::default(),
            listeners: Default::default(),
            auth_requirement: Default::default(),
            host_auth: Default::default(),
            host_qos: Default::default(),
            tls_requirement: Default::default(),
            host_tls: Default::default(),
        }
    }

    /// Runs `change` on `s`, answering the states before and after it.
    pub(super) fn committed(s: &mut State, change: impl FnOnce(&mut State)) -> (State, State) {
        let before = s.clone();
        change(s);
        (before, s.clone())
    }
}
