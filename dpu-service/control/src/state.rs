//! State transitions: each accepted request is one method on [`State`].
//!
//! Methods check the request against the whole state (references exist,
//! claims do not collide, versions match) and either change the state or
//! return an error having changed nothing. They do no I/O; [`crate::store`]
//! runs them on a copy and persists the result before it becomes visible.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::convert::{listener_name, namespace_name};
use crate::error::{ControlError, Result};
use crate::model::{
    Action, Attachment, Backend, Listener, Namespace, PortSpec, Rule, RuleSet, State, Subsystem,
    Tenant,
};
use crate::validate::{MAX_HOSTS_PER_SUBSYSTEM, MAX_RULES_PER_TENANT};

/// The ports the configuration declares, by ID.
pub type PortRegistry = BTreeMap<String, PortSpec>;

/// Limits that depend on the machine, not on the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes all RAM-backed namespaces together may use.
    pub ram_bytes: u64,
}

/// Changes to a tenant; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct TenantUpdate {
    /// New display name.
    pub display_name: Option<String>,
    /// New default policy.
    pub default_policy: Option<Action>,
    /// New attachment list (replaces the old one).
    pub attachments: Option<Vec<Attachment>>,
}

/// Changes to a subsystem; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct SubsystemUpdate {
    /// New allow-any-host flag.
    pub allow_any_host: Option<bool>,
    /// New allow list (replaces the old one).
    pub allowed_hosts: Option<BTreeSet<String>>,
    /// New model number.
    pub model_number: Option<String>,
}

/// One part of the state that a single call changes, and that undoing the
/// call puts back: what [`State::revert`] works on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// A tenant, with its attachments and rules.
    Tenant(String),
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
    /// The part's resource name, as the API spells it.
    pub fn resource(&self) -> String {
        match self {
            Part::Tenant(id) => format!("tenants/{id}"),
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

fn check_version(tenant: &Tenant, expected: Option<u64>) -> Result<()> {
    match expected {
        Some(v) if v != tenant.rules.version => Err(ControlError::FailedPrecondition(format!(
            "rule set of tenants/{} is at version {}, not {v}",
            tenant.id, tenant.rules.version
        ))),
        _ => Ok(()),
    }
}

impl State {
    /// The tenant with `id`, or NOT_FOUND.
    pub fn tenant(&self, id: &str) -> Result<&Tenant> {
        self.tenants
            .get(id)
            .ok_or_else(|| ControlError::NotFound(format!("tenants/{id}")))
    }

    fn tenant_mut(&mut self, id: &str) -> Result<&mut Tenant> {
        self.tenants
            .get_mut(id)
            .ok_or_else(|| ControlError::NotFound(format!("tenants/{id}")))
    }

    /// The subsystem with `id`, or NOT_FOUND.
    pub fn subsystem(&self, id: &str) -> Result<&Subsystem> {
        self.subsystems
            .get(id)
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}")))
    }

    fn subsystem_mut(&mut self, id: &str) -> Result<&mut Subsystem> {
        self.subsystems
            .get_mut(id)
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}")))
    }

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

    /// Checks that `atts` name existing ports and collide with no
    /// attachment of a tenant other than `owner`.
    fn check_attachments(
        &self,
        ports: &PortRegistry,
        owner: &str,
        atts: &[Attachment],
    ) -> Result<()> {
        if let Some(a) = atts.iter().find(|a| !ports.contains_key(a.port())) {
            return Err(ControlError::NotFound(format!("ports/{}", a.port())));
        }
        self.check_claims(owner, atts)
    }

    /// Checks that `atts` collide with no attachment of a tenant other
    /// than `owner`.
    fn check_claims(&self, owner: &str, atts: &[Attachment]) -> Result<()> {
        for a in atts {
            for t in self.tenants.values().filter(|t| t.id != owner) {
                if let Some(o) = t.attachments.iter().find(|o| o.conflicts_with(a)) {
                    return Err(ControlError::AlreadyExists(format!(
                        "{a} overlaps {o}, which belongs to tenants/{}",
                        t.id
                    )));
                }
            }
        }
        Ok(())
    }

    /// Creates a tenant.
    pub fn create_tenant(&mut self, ports: &PortRegistry, tenant: Tenant) -> Result<()> {
        if self.tenants.contains_key(&tenant.id) {
            return Err(ControlError::AlreadyExists(format!(
                "tenants/{} already exists",
                tenant.id
            )));
        }
        self.check_attachments(ports, &tenant.id, &tenant.attachments)?;
        self.tenants.insert(tenant.id.clone(), tenant);
        Ok(())
    }

    /// Updates a tenant and returns it.
    pub fn update_tenant(
        &mut self,
        ports: &PortRegistry,
        id: &str,
        u: TenantUpdate,
    ) -> Result<&Tenant> {
        self.tenant(id)?;
        if let Some(atts) = &u.attachments {
            self.check_attachments(ports, id, atts)?;
        }
        let t = self.tenant_mut(id)?;
        if let Some(d) = u.display_name {
            t.display_name = d;
        }
        if let Some(p) = u.default_policy {
            t.default_policy = p;
        }
        if let Some(a) = u.attachments {
            t.attachments = a;
        }
        Ok(t)
    }

    /// Deletes a tenant; without `force` it must hold no rules or attachments.
    pub fn delete_tenant(&mut self, id: &str, force: bool) -> Result<()> {
        let t = self.tenant(id)?;
        if !force && (!t.rules.rules.is_empty() || !t.attachments.is_empty()) {
            return Err(ControlError::FailedPrecondition(format!(
                "tenants/{id} still has {} rules and {} attachments; delete them first or set force",
                t.rules.rules.len(),
                t.attachments.len()
            )));
        }
        self.tenants.remove(id);
        Ok(())
    }

    /// Attaches `att` to tenant `id` and returns the tenant.
    pub fn attach(&mut self, ports: &PortRegistry, id: &str, att: Attachment) -> Result<&Tenant> {
        let t = self.tenant(id)?;
        if let Some(o) = t.attachments.iter().find(|o| o.conflicts_with(&att)) {
            return Err(ControlError::AlreadyExists(format!(
                "{att} overlaps {o}, which tenants/{id} already holds"
            )));
        }
        self.check_attachments(ports, id, std::slice::from_ref(&att))?;
        let t = self.tenant_mut(id)?;
        t.attachments.push(att);
        Ok(t)
    }

    /// Removes the port attachment (`port`, `vlan`) from whichever tenant
    /// holds it and returns that tenant.
    pub fn detach(&mut self, port: &str, vlan: u16) -> Result<&Tenant> {
        let want = Attachment::port_vlan(port, vlan);
        let owner = self
            .tenants
            .values()
            .find(|t| t.attachments.iter().any(|a| a.is_port_vlan(port, vlan)))
            .map(|t| t.id.clone())
            .ok_or_else(|| ControlError::NotFound(format!("attachment {want}")))?;
        let t = self.tenant_mut(&owner)?;
        t.attachments.retain(|a| !a.is_port_vlan(port, vlan));
        Ok(t)
    }

    /// Adds a rule to tenant `id`; returns the new rule-set version.
    pub fn add_rule(&mut self, id: &str, rule: Rule, expected: Option<u64>) -> Result<u64> {
        let t = self.tenant(id)?;
        check_version(t, expected)?;
        let rules = &t.rules.rules;
        if rules.len() >= MAX_RULES_PER_TENANT {
            return Err(ControlError::FailedPrecondition(format!(
                "tenants/{id} already holds the maximum of {MAX_RULES_PER_TENANT} rules"
            )));
        }
        if rules.iter().any(|r| r.id == rule.id) {
            return Err(ControlError::AlreadyExists(format!(
                "tenants/{id}/rules/{} already exists",
                rule.id
            )));
        }
        let pos = match rules.binary_search_by_key(&rule.priority, |r| r.priority) {
            Ok(i) => {
                return Err(ControlError::AlreadyExists(format!(
                    "priority {} is taken by tenants/{id}/rules/{}",
                    rule.priority, rules[i].id
                )))
            }
            Err(pos) => pos,
        };
        let t = self.tenant_mut(id)?;
        let mut new = Vec::with_capacity(t.rules.rules.len() + 1);
        new.extend_from_slice(&t.rules.rules[..pos]);
        new.push(rule);
        new.extend_from_slice(&t.rules.rules[pos..]);
        t.rules = RuleSet {
            version: t.rules.version + 1,
            rules: Arc::new(new),
        };
        Ok(t.rules.version)
    }

    /// Deletes rule `rule_id` of tenant `id`; returns the new version.
    pub fn delete_rule(&mut self, id: &str, rule_id: &str, expected: Option<u64>) -> Result<u64> {
        let t = self.tenant(id)?;
        check_version(t, expected)?;
        if !t.rules.rules.iter().any(|r| r.id == rule_id) {
            return Err(ControlError::NotFound(format!(
                "tenants/{id}/rules/{rule_id}"
            )));
        }
        let t = self.tenant_mut(id)?;
        let new: Vec<Rule> = t
            .rules
            .rules
            .iter()
            .filter(|r| r.id != rule_id)
            .cloned()
            .collect();
        t.rules = RuleSet {
            version: t.rules.version + 1,
            rules: Arc::new(new),
        };
        Ok(t.rules.version)
    }

    /// Replaces the whole rule set of tenant `id`. `rules` carry their IDs
    /// (`None` = assign one). Returns the new version.
    pub fn replace_rules(
        &mut self,
        id: &str,
        rules: Vec<(Option<String>, Rule)>,
        expected: Option<u64>,
    ) -> Result<u64> {
        let t = self.tenant(id)?;
        check_version(t, expected)?;
        if rules.len() > MAX_RULES_PER_TENANT {
            return Err(ControlError::invalid(
                "rules",
                format!(
                    "{} rules, at most {MAX_RULES_PER_TENANT} per tenant",
                    rules.len()
                ),
            ));
        }
        let mut by_priority: BTreeMap<u32, usize> = BTreeMap::new();
        let mut ids: BTreeMap<String, usize> = BTreeMap::new();
        for (i, (rid, r)) in rules.iter().enumerate() {
            if let Some(j) = by_priority.insert(r.priority, i) {
                return Err(ControlError::invalid(
                    format!("rules[{i}].priority"),
                    format!("{} is also the priority of rules[{j}]", r.priority),
                ));
            }
            if let Some(rid) = rid {
                if let Some(j) = ids.insert(rid.clone(), i) {
                    return Err(ControlError::invalid(
                        format!("rules[{i}].name"),
                        format!("rule ID {rid} is also used by rules[{j}]"),
                    ));
                }
            }
        }
        let mut out = Vec::with_capacity(rules.len());
        for (rid, mut r) in rules {
            r.id = match rid {
                Some(rid) => rid,
                None => self.next_id("rule", |c| ids.contains_key(c)),
            };
            out.push(r);
        }
        out.sort_by_key(|r| r.priority);
        let t = self.tenant_mut(id)?;
        t.rules = RuleSet {
            version: t.rules.version + 1,
            rules: Arc::new(out),
        };
        Ok(t.rules.version)
    }

    /// Creates a subsystem.
    pub fn create_subsystem(&mut self, s: Subsystem) -> Result<()> {
        if self.subsystems.contains_key(&s.id) {
            return Err(ControlError::AlreadyExists(format!(
                "subsystems/{} already exists",
                s.id
            )));
        }
        if let Some(o) = self.subsystems.values().find(|o| o.nqn == s.nqn) {
            return Err(ControlError::AlreadyExists(format!(
                "NQN {} is already used by subsystems/{}",
                s.nqn, o.id
            )));
        }
        self.subsystems.insert(s.id.clone(), s);
        Ok(())
    }

    /// Updates a subsystem and returns it.
    pub fn update_subsystem(&mut self, id: &str, u: SubsystemUpdate) -> Result<&Subsystem> {
        let s = self.subsystem_mut(id)?;
        if let Some(a) = u.allow_any_host {
            s.allow_any_host = a;
        }
        if let Some(h) = u.allowed_hosts {
            s.allowed_hosts = h;
        }
        if let Some(m) = u.model_number {
            s.model_number = m;
        }
        Ok(s)
    }

    /// Deletes a subsystem; without `force` it must hold no namespaces or listeners.
    pub fn delete_subsystem(&mut self, id: &str, force: bool) -> Result<()> {
        let s = self.subsystem(id)?;
        if !force && (!s.namespaces.is_empty() || !s.listeners.is_empty()) {
            return Err(ControlError::FailedPrecondition(format!(
                "subsystems/{id} still has {} namespaces and {} listeners; delete them first or set force",
                s.namespaces.len(),
                s.listeners.len()
            )));
        }
        self.subsystems.remove(id);
        Ok(())
    }

    /// Adds `host` to the allow list of subsystem `id`.
    pub fn add_host(&mut self, id: &str, host: &str) -> Result<&Subsystem> {
        let s = self.subsystem_mut(id)?;
        if s.allowed_hosts.contains(host) {
            return Err(ControlError::AlreadyExists(format!(
                "host {host} is already allowed on subsystems/{id}"
            )));
        }
        if s.allowed_hosts.len() >= MAX_HOSTS_PER_SUBSYSTEM {
            return Err(ControlError::FailedPrecondition(format!(
                "subsystems/{id} already allows the maximum of {MAX_HOSTS_PER_SUBSYSTEM} hosts"
            )));
        }
        s.allowed_hosts.insert(host.to_string());
        Ok(s)
    }

    /// Removes `host` from the allow list of subsystem `id`.
    pub fn remove_host(&mut self, id: &str, host: &str) -> Result<&Subsystem> {
        let s = self.subsystem_mut(id)?;
        if !s.allowed_hosts.remove(host) {
            return Err(ControlError::NotFound(format!(
                "host {host} on subsystems/{id}"
            )));
        }
        Ok(s)
    }

    fn ram_in_use(&self, except: Option<(&str, u32)>) -> u64 {
        self.subsystems
            .values()
            .flat_map(|s| s.namespaces.values().map(move |n| (s.id.as_str(), n)))
            .filter(|(sid, n)| except != Some((sid, n.nsid)))
            .map(|(_, n)| match n.backend {
                Backend::Ram { size_bytes } => size_bytes,
                _ => 0,
            })
            .fold(0u64, u64::saturating_add)
    }

    fn check_ram(&self, limits: Limits, except: Option<(&str, u32)>, extra: u64) -> Result<()> {
        let total = self.ram_in_use(except).saturating_add(extra);
        if total > limits.ram_bytes {
            return Err(ControlError::FailedPrecondition(format!(
                "RAM namespaces would use {total} bytes; the service allows {} (storage.ram_limit)",
                limits.ram_bytes
            )));
        }
        Ok(())
    }

    /// Creates a namespace in subsystem `id`; NSID 0 picks the lowest free
    /// one. `uuid`/`nguid` of `None` are generated. Returns the namespace.
    pub fn create_namespace(
        &mut self,
        limits: Limits,
        id: &str,
        mut ns: Namespace,
        given_uuid: bool,
        given_nguid: bool,
    ) -> Result<&Namespace> {
        let s = self.subsystem(id)?;
        if ns.nsid == 0 {
            ns.nsid = (1..=s.max_namespaces)
                .find(|n| !s.namespaces.contains_key(n))
                .ok_or_else(|| {
                    ControlError::FailedPrecondition(format!(
                        "subsystems/{id} has no free namespace ID (max_namespaces {})",
                        s.max_namespaces
                    ))
                })?;
        } else if ns.nsid > s.max_namespaces {
            return Err(ControlError::invalid(
                "namespace.nsid",
                format!(
                    "{} exceeds max_namespaces {} of subsystems/{id}",
                    ns.nsid, s.max_namespaces
                ),
            ));
        } else if s.namespaces.contains_key(&ns.nsid) {
            return Err(ControlError::AlreadyExists(format!(
                "subsystems/{id}/namespaces/{} already exists",
                ns.nsid
            )));
        }
        if let Backend::Ram { size_bytes } = ns.backend {
            self.check_ram(limits, None, size_bytes)?;
        }
        let all = || self.subsystems.values().flat_map(|s| s.namespaces.values());
        if given_uuid && all().any(|o| o.uuid == ns.uuid) {
            return Err(ControlError::AlreadyExists(
                "namespace.uuid is used by another namespace".into(),
            ));
        }
        if given_nguid && all().any(|o| o.nguid == ns.nguid) {
            return Err(ControlError::AlreadyExists(
                "namespace.nguid is used by another namespace".into(),
            ));
        }
        let path_of = |b: &Backend| match b {
            Backend::File { path, .. } | Backend::BlockDevice { path } => Some(path.clone()),
            Backend::Ram { .. } => None,
        };
        if let Some(p) = path_of(&ns.backend) {
            if let Some((sid, o)) = self
                .subsystems
                .values()
                .flat_map(|s| s.namespaces.values().map(move |n| (&s.id, n)))
                .find(|(_, o)| path_of(&o.backend).as_deref() == Some(p.as_str()))
            {
                return Err(ControlError::AlreadyExists(format!(
                    "{p} already backs subsystems/{sid}/namespaces/{}",
                    o.nsid
                )));
            }
        }
        if !given_uuid {
            ns.uuid = random_uuid();
        }
        if !given_nguid {
            ns.nguid = random_bytes();
        }
        let nsid = ns.nsid;
        let s = self.subsystem_mut(id)?;
        Ok(s.namespaces.entry(nsid).or_insert(ns))
    }

    /// Resizes a RAM- or file-backed namespace.
    pub fn resize_namespace(
        &mut self,
        limits: Limits,
        id: &str,
        nsid: u32,
        size: u64,
    ) -> Result<&Namespace> {
        let s = self.subsystem(id)?;
        let ns = s
            .namespaces
            .get(&nsid)
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}/namespaces/{nsid}")))?;
        if size == 0 || !size.is_multiple_of(u64::from(ns.block_size)) {
            return Err(ControlError::invalid(
                "size_bytes",
                format!(
                    "{size} is not a non-zero multiple of the block size {}",
                    ns.block_size
                ),
            ));
        }
        match ns.backend {
            Backend::Ram { .. } => self.check_ram(limits, Some((id, nsid)), size)?,
            Backend::File { .. } => {}
            Backend::BlockDevice { .. } => {
                return Err(ControlError::FailedPrecondition(
                    "a block-device namespace takes its size from the device".into(),
                ))
            }
        }
        let ns = self
            .subsystem_mut(id)?
            .namespaces
            .get_mut(&nsid)
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}/namespaces/{nsid}")))?;
        match &mut ns.backend {
            Backend::Ram { size_bytes } | Backend::File { size_bytes, .. } => *size_bytes = size,
            Backend::BlockDevice { .. } => {}
        }
        Ok(ns)
    }

    /// Deletes a namespace.
    pub fn delete_namespace(&mut self, id: &str, nsid: u32) -> Result<()> {
        self.subsystem_mut(id)?
            .namespaces
            .remove(&nsid)
            .map(|_| ())
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}/namespaces/{nsid}")))
    }

    /// Creates a listener in subsystem `id`.
    pub fn create_listener(&mut self, id: &str, l: Listener) -> Result<&Listener> {
        let s = self.subsystem_mut(id)?;
        if s.listeners.contains_key(&l.id) {
            return Err(ControlError::AlreadyExists(format!(
                "subsystems/{id}/listeners/{} already exists",
                l.id
            )));
        }
        if let Some(o) = s
            .listeners
            .values()
            .find(|o| o.transport == l.transport && o.address == l.address && o.port == l.port)
        {
            return Err(ControlError::AlreadyExists(format!(
                "subsystems/{id}/listeners/{} already listens on {}:{}",
                o.id, l.address, l.port
            )));
        }
        let lid = l.id.clone();
        Ok(s.listeners.entry(lid).or_insert(l))
    }

    /// Deletes a listener.
    pub fn delete_listener(&mut self, id: &str, lid: &str) -> Result<()> {
        self.subsystem_mut(id)?
            .listeners
            .remove(lid)
            .map(|_| ())
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}/listeners/{lid}")))
    }

    fn namespace_at(&self, id: &str, nsid: u32) -> Option<&Namespace> {
        self.subsystems.get(id)?.namespaces.get(&nsid)
    }

    fn listener_at(&self, id: &str, lid: &str) -> Option<&Listener> {
        self.subsystems.get(id)?.listeners.get(lid)
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
            Part::Tenant(id) => {
                let (was, made) = (before.tenants.get(id), after.tenants.get(id));
                if self.tenants.get(id) != made {
                    return Ok(Reverted::Superseded);
                }
                match (was, made) {
                    (None, None) => {}
                    (None, Some(_)) => self.delete_tenant(id, true)?,
                    (Some(was), made) => {
                        // Attachments it gave up may have been taken since.
                        self.check_claims(id, &was.attachments)?;
                        let mut t = was.clone();
                        // Undoing a rule change is a rule change: versions
                        // only grow, so no client takes the undone rules
                        // for the current ones.
                        if let Some(made) = made {
                            t.rules.version = if made.rules.rules == was.rules.rules {
                                made.rules.version
                            } else {
                                made.rules.version + 1
                            };
                        }
                        self.tenants.insert(id.clone(), t);
                    }
                }
            }
            Part::Namespace {
                subsystem: id,
                nsid,
            } => {
                let (was, made) = (
                    before.namespace_at(id, *nsid),
                    after.namespace_at(id, *nsid),
                );
                if self.namespace_at(id, *nsid) != made {
                    return Ok(Reverted::Superseded);
                }
                match (was, made) {
                    (None, None) => {}
                    (None, Some(_)) => self.delete_namespace(id, *nsid)?,
                    (Some(was), None) => {
                        self.create_namespace(limits, id, was.clone(), true, true)?;
                    }
                    (Some(was), Some(_)) => {
                        if let Backend::Ram { size_bytes } = was.backend {
                            self.check_ram(limits, Some((id, *nsid)), size_bytes)?;
                        }
                        if let Some(n) = self.subsystem_mut(id)?.namespaces.get_mut(nsid) {
                            *n = was.clone();
                        }
                    }
                }
            }
            Part::Listener {
                subsystem: id,
                id: lid,
            } => {
                let (was, made) = (before.listener_at(id, lid), after.listener_at(id, lid));
                if self.listener_at(id, lid) != made {
                    return Ok(Reverted::Superseded);
                }
                match (was, made) {
                    (None, None) => {}
                    (None, Some(_)) => self.delete_listener(id, lid)?,
                    (Some(was), None) => {
                        self.create_listener(id, was.clone())?;
                    }
                    (Some(was), Some(made)) => {
                        let made = made.clone();
                        self.delete_listener(id, lid)?;
                        if let Err(e) = self.create_listener(id, was.clone()) {
                            self.subsystem_mut(id)?.listeners.insert(lid.clone(), made);
                            return Err(e);
                        }
                    }
                }
            }
        }
        Ok(Reverted::Done)
    }
}

/// 16 random bytes from the OS, or from std's randomly keyed hasher if
/// `/dev/urandom` cannot be read.
fn random_bytes() -> [u8; 16] {
    use std::io::Read;
    let mut b = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok();
    if !ok {
        use std::hash::{BuildHasher, Hasher};
        for half in b.chunks_exact_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0),
            );
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    b
}

/// A random (version 4, RFC 4122 variant) UUID.
fn random_uuid() -> [u8; 16] {
    let mut b = random_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PortRole, Timestamp, Transport};

    fn ports() -> PortRegistry {
        ["p0", "p1", "pf0vf0"]
            .into_iter()
            .map(|id| {
                (
                    id.to_string(),
                    PortSpec {
                        id: id.into(),
                        driver: "none".into(),
                        device: String::new(),
                        role: PortRole::Software,
                    },
                )
            })
            .collect()
    }

    fn tenant(id: &str, atts: Vec<Attachment>) -> Tenant {
        Tenant {
            id: id.into(),
            display_name: String::new(),
            attachments: atts,
            default_policy: Action::Deny,
            create_time: Timestamp::now(),
            rules: RuleSet::default(),
        }
    }

    fn port(p: &str, vlan: u16) -> Attachment {
        Attachment::port_vlan(p, vlan)
    }

    fn rule(id: &str, prio: u32) -> Rule {
        Rule {
            id: id.into(),
            priority: prio,
            src: None,
            dst: None,
            src_ports: None,
            dst_ports: None,
            protocol: None,
            icmp_type: None,
            icmp_code: None,
            action: Action::Allow,
            stateful: false,
            description: String::new(),
            rate_limit: None,
        }
    }

    #[test]
    fn tenants_cannot_share_traffic() {
        let mut s = State::default();
        let p = ports();
        s.create_tenant(&p, tenant("a", vec![port("p0", 10)]))
            .unwrap();
        assert!(matches!(
            s.create_tenant(&p, tenant("b", vec![port("p0", 10)])),
            Err(ControlError::AlreadyExists(_))
        ));
        assert!(matches!(
            s.create_tenant(&p, tenant("b", vec![port("p0", 0)])),
            Err(ControlError::AlreadyExists(_))
        ));
        assert!(matches!(
            s.create_tenant(&p, tenant("b", vec![port("nope", 0)])),
            Err(ControlError::NotFound(_))
        ));
        s.create_tenant(&p, tenant("b", vec![port("p0", 20)]))
            .unwrap();
        assert!(matches!(
            s.attach(&p, "b", port("p0", 10)),
            Err(ControlError::AlreadyExists(_))
        ));
        assert!(matches!(
            s.attach(&p, "b", port("p0", 20)),
            Err(ControlError::AlreadyExists(_))
        ));
        s.attach(&p, "b", port("p1", 0)).unwrap();
        assert_eq!(s.detach("p0", 10).unwrap().id, "a");
        assert!(matches!(s.detach("p0", 10), Err(ControlError::NotFound(_))));
        s.attach(&p, "b", port("p0", 10)).unwrap();
        // An update may keep the tenant's own attachments.
        s.update_tenant(
            &p,
            "b",
            TenantUpdate {
                attachments: Some(vec![port("p0", 10)]),
                ..Default::default()
            },
        )
        .unwrap();
    }

    #[test]
    fn rules_stay_sorted_and_versioned() {
        let mut s = State::default();
        s.create_tenant(&ports(), tenant("a", vec![])).unwrap();
        assert_eq!(s.add_rule("a", rule("r30", 30), Some(0)).unwrap(), 1);
        assert_eq!(s.add_rule("a", rule("r10", 10), None).unwrap(), 2);
        assert_eq!(s.add_rule("a", rule("r20", 20), Some(2)).unwrap(), 3);
        let order: Vec<u32> = s.tenants["a"]
            .rules
            .rules
            .iter()
            .map(|r| r.priority)
            .collect();
        assert_eq!(order, [10, 20, 30]);
        assert!(matches!(
            s.add_rule("a", rule("x", 20), None),
            Err(ControlError::AlreadyExists(_))
        ));
        assert!(matches!(
            s.add_rule("a", rule("r10", 99), None),
            Err(ControlError::AlreadyExists(_))
        ));
        assert!(matches!(
            s.add_rule("a", rule("y", 5), Some(1)),
            Err(ControlError::FailedPrecondition(_))
        ));
        assert_eq!(s.delete_rule("a", "r20", Some(3)).unwrap(), 4);
        assert!(matches!(
            s.delete_rule("a", "r20", None),
            Err(ControlError::NotFound(_))
        ));
        assert!(matches!(
            s.delete_tenant("a", false),
            Err(ControlError::FailedPrecondition(_))
        ));
        let v = s
            .replace_rules(
                "a",
                vec![(None, rule("", 2)), (Some("keep".into()), rule("", 1))],
                Some(4),
            )
            .unwrap();
        assert_eq!(v, 5);
        let rs = &s.tenants["a"].rules.rules;
        assert_eq!(rs[0].id, "keep");
        assert!(rs[1].id.starts_with("rule-"));
        assert!(matches!(
            s.replace_rules("a", vec![(None, rule("", 1)), (None, rule("", 1))], None),
            Err(ControlError::InvalidArgument { field, .. }) if field == "rules[1].priority"
        ));
        assert_eq!(
            s.tenants["a"].rules.version, 5,
            "a refused replace changes nothing"
        );
        s.delete_tenant("a", true).unwrap();
        assert!(s.tenants.is_empty());
    }

    fn subsystem(id: &str, nqn: &str) -> Subsystem {
        Subsystem {
            id: id.into(),
            nqn: nqn.into(),
            serial_number: "s".into(),
            model_number: "m".into(),
            allow_any_host: false,
            allowed_hosts: BTreeSet::new(),
            max_namespaces: 2,
            create_time: Timestamp::now(),
            namespaces: BTreeMap::new(),
            listeners: BTreeMap::new(),
        }
    }

    fn ram(size: u64) -> Namespace {
        Namespace {
            nsid: 0,
            backend: Backend::Ram { size_bytes: size },
            block_size: 512,
            uuid: [0; 16],
            nguid: [0; 16],
        }
    }

    #[test]
    fn storage_objects() {
        let lim = Limits { ram_bytes: 1 << 20 };
        let mut s = State::default();
        s.create_subsystem(subsystem("a", "nqn.2024-01.io.example:a"))
            .unwrap();
        assert!(matches!(
            s.create_subsystem(subsystem("b", "nqn.2024-01.io.example:a")),
            Err(ControlError::AlreadyExists(_))
        ));
        let n1 = s
            .create_namespace(lim, "a", ram(4096), false, false)
            .unwrap()
            .clone();
        assert_eq!(n1.nsid, 1);
        assert_eq!(n1.uuid[6] >> 4, 4, "version 4 UUID");
        assert_ne!(n1.uuid, n1.nguid);
        assert!(matches!(
            s.create_namespace(lim, "a", ram(1 << 20), false, false),
            Err(ControlError::FailedPrecondition(_))
        ));
        assert_eq!(
            s.create_namespace(lim, "a", ram(4096), false, false)
                .unwrap()
                .nsid,
            2
        );
        assert!(matches!(
            s.create_namespace(lim, "a", ram(4096), false, false),
            Err(ControlError::FailedPrecondition(_))
        ));
        s.resize_namespace(lim, "a", 1, 8192).unwrap();
        assert!(matches!(
            s.resize_namespace(lim, "a", 1, 8193),
            Err(ControlError::InvalidArgument { .. })
        ));
        assert!(matches!(
            s.delete_subsystem("a", false),
            Err(ControlError::FailedPrecondition(_))
        ));
        s.add_host("a", "nqn.2024-01.io.example:host1").unwrap();
        assert!(s.subsystems["a"].allows_host("nqn.2024-01.io.example:host1"));
        assert!(!s.subsystems["a"].allows_host("nqn.2024-01.io.example:host2"));
        assert!(matches!(
            s.add_host("a", "nqn.2024-01.io.example:host1"),
            Err(ControlError::AlreadyExists(_))
        ));
        s.remove_host("a", "nqn.2024-01.io.example:host1").unwrap();
        let l = Listener {
            id: "l".into(),
            transport: Transport::Tcp,
            address: "127.0.0.1".parse().unwrap(),
            port: 4420,
        };
        s.create_listener("a", l.clone()).unwrap();
        let dup = Listener {
            id: "other".into(),
            ..l
        };
        assert!(matches!(
            s.create_listener("a", dup),
            Err(ControlError::AlreadyExists(_))
        ));
        s.delete_namespace("a", 2).unwrap();
        assert!(matches!(
            s.delete_namespace("a", 2),
            Err(ControlError::NotFound(_))
        ));
        s.delete_subsystem("a", true).unwrap();
    }

    fn file(path: &str, size: u64) -> Namespace {
        Namespace {
            backend: Backend::File {
                path: path.into(),
                size_bytes: size,
            },
            ..ram(0)
        }
    }

    fn listener(id: &str, port: u16) -> Listener {
        Listener {
            id: id.into(),
            transport: Transport::Tcp,
            address: "127.0.0.1".parse().unwrap(),
            port,
        }
    }

    fn ns_part(nsid: u32) -> Part {
        Part::Namespace {
            subsystem: "a".into(),
            nsid,
        }
    }

    /// Runs `change` on `s`, answering the states before and after it.
    fn committed(s: &mut State, change: impl FnOnce(&mut State)) -> (State, State) {
        let before = s.clone();
        change(s);
        (before, s.clone())
    }

    #[test]
    fn revert_undoes_one_change_and_keeps_later_ones() {
        let lim = Limits { ram_bytes: 1 << 20 };
        let mut s = State::default();
        s.create_subsystem(subsystem("a", "nqn.2024-01.io.example:a"))
            .unwrap();
        s.subsystems.get_mut("a").unwrap().max_namespaces = 8;

        // A created namespace is deleted again; one created since stays.
        let (before, after) = committed(&mut s, |s| {
            s.create_namespace(lim, "a", file("/x/1.img", 4096), false, false)
                .unwrap();
        });
        s.create_namespace(lim, "a", ram(4096), false, false)
            .unwrap();
        let seq = s.id_seq;
        assert_eq!(
            s.revert(lim, &ns_part(1), &before, &after).unwrap(),
            Reverted::Done
        );
        assert!(!s.subsystems["a"].namespaces.contains_key(&1));
        assert!(s.subsystems["a"].namespaces.contains_key(&2));
        assert_eq!(s.id_seq, seq, "service-assigned IDs are never reused");
        assert_eq!(
            Part::Namespace {
                subsystem: "a".into(),
                nsid: 1
            }
            .resource(),
            "subsystems/a/namespaces/1"
        );

        // A resize goes back to the old size.
        let (before, after) = committed(&mut s, |s| {
            s.resize_namespace(lim, "a", 2, 8192).unwrap();
        });
        s.revert(lim, &ns_part(2), &before, &after).unwrap();
        assert_eq!(
            s.subsystems["a"].namespaces[&2].backend,
            Backend::Ram { size_bytes: 4096 }
        );

        // A part changed again since is left alone.
        let (before, after) = committed(&mut s, |s| {
            s.resize_namespace(lim, "a", 2, 8192).unwrap();
        });
        s.resize_namespace(lim, "a", 2, 16384).unwrap();
        assert_eq!(
            s.revert(lim, &ns_part(2), &before, &after).unwrap(),
            Reverted::Superseded
        );
        assert_eq!(
            s.subsystems["a"].namespaces[&2].backend,
            Backend::Ram { size_bytes: 16384 }
        );

        // A deleted namespace comes back, through create's checks: not
        // once its file backs another namespace.
        let ns3 = s
            .create_namespace(lim, "a", file("/x/3.img", 4096), false, false)
            .unwrap()
            .clone();
        let (before, after) = committed(&mut s, |s| s.delete_namespace("a", ns3.nsid).unwrap());
        let part = ns_part(ns3.nsid);
        let mut other = s.clone();
        let elsewhere = Namespace {
            nsid: 5,
            ..file("/x/3.img", 4096)
        };
        other
            .create_namespace(lim, "a", elsewhere, false, false)
            .unwrap();
        let kept = other.clone();
        assert!(matches!(
            other.revert(lim, &part, &before, &after),
            Err(ControlError::AlreadyExists(_))
        ));
        assert_eq!(other, kept, "a refused revert changes nothing");
        s.revert(lim, &part, &before, &after).unwrap();
        assert_eq!(s.subsystems["a"].namespaces[&ns3.nsid], ns3);
    }

    #[test]
    fn revert_listeners() {
        let mut s = State::default();
        let lim = Limits { ram_bytes: 0 };
        s.create_subsystem(subsystem("a", "nqn.2024-01.io.example:a"))
            .unwrap();
        let part = Part::Listener {
            subsystem: "a".into(),
            id: "l".into(),
        };
        assert_eq!(part.resource(), "subsystems/a/listeners/l");
        let (before, after) = committed(&mut s, |s| {
            s.create_listener("a", listener("l", 4420)).unwrap();
        });
        s.create_listener("a", listener("m", 4421)).unwrap();
        s.revert(lim, &part, &before, &after).unwrap();
        assert_eq!(
            s.subsystems["a"].listeners.keys().collect::<Vec<_>>(),
            ["m"]
        );
        // A deleted listener comes back unless its address was taken since.
        let (before, after) = committed(&mut s, |s| s.delete_listener("a", "m").unwrap());
        let mut other = s.clone();
        other.create_listener("a", listener("n", 4421)).unwrap();
        let kept = other.clone();
        let m = Part::Listener {
            subsystem: "a".into(),
            id: "m".into(),
        };
        assert!(matches!(
            other.revert(lim, &m, &before, &after),
            Err(ControlError::AlreadyExists(_))
        ));
        assert_eq!(other, kept);
        s.revert(lim, &m, &before, &after).unwrap();
        assert_eq!(s.subsystems["a"].listeners["m"], listener("m", 4421));
    }

    #[test]
    fn revert_tenants() {
        let p = ports();
        let lim = Limits { ram_bytes: 0 };
        let red = Part::Tenant("red".into());
        assert_eq!(red.resource(), "tenants/red");
        let mut s = State::default();
        // A created tenant goes, with whatever it was created with.
        let (before, after) = committed(&mut s, |s| {
            s.create_tenant(&p, tenant("red", vec![port("p0", 10)]))
                .unwrap();
        });
        s.create_tenant(&p, tenant("blue", vec![])).unwrap();
        s.revert(lim, &red, &before, &after).unwrap();
        assert_eq!(s.tenants.keys().collect::<Vec<_>>(), ["blue"]);

        // Rules come back with a newer version.
        s.create_tenant(&p, tenant("red", vec![port("p0", 10)]))
            .unwrap();
        s.add_rule("red", rule("r1", 1), None).unwrap();
        let (before, after) = committed(&mut s, |s| {
            s.replace_rules("red", vec![(None, rule("", 5))], Some(1))
                .unwrap();
        });
        s.revert(lim, &red, &before, &after).unwrap();
        let rs = &s.tenants["red"].rules;
        assert_eq!(
            (rs.version, rs.rules.as_slice()),
            (3, [rule("r1", 1)].as_slice())
        );
        // A change that left the rules alone leaves the version alone.
        let (before, after) = committed(&mut s, |s| {
            s.detach("p0", 10).unwrap();
        });
        let mut other = s.clone();
        s.revert(lim, &red, &before, &after).unwrap();
        assert_eq!(s.tenants["red"], before.tenants["red"]);
        // Not if the attachment it gave up was taken since.
        other.attach(&p, "blue", port("p0", 0)).unwrap();
        let kept = other.clone();
        assert!(matches!(
            other.revert(lim, &red, &before, &after),
            Err(ControlError::AlreadyExists(_))
        ));
        assert_eq!(other, kept);

        // A deleted tenant comes back; a tenant changed since stays.
        let (before, after) = committed(&mut s, |s| s.delete_tenant("red", true).unwrap());
        s.revert(lim, &red, &before, &after).unwrap();
        assert_eq!(s.tenants["red"], before.tenants["red"]);
        let (before, after) = committed(&mut s, |s| {
            s.add_rule("red", rule("r2", 2), None).unwrap();
        });
        s.add_rule("red", rule("r3", 3), None).unwrap();
        let now = s.clone();
        assert_eq!(
            s.revert(lim, &red, &before, &after).unwrap(),
            Reverted::Superseded
        );
        assert_eq!(s, now);
    }
}
