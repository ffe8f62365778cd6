//! Network-side transitions: tenants, their attachments to ports and VXLAN
//! networks, and their filter rules.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{cap, Limits, Reverted};
use crate::error::{ControlError, Result};
use crate::model::{Action, Attachment, PortSpec, Rule, RuleSet, State, Tenant};

/// The ports the configuration declares, by ID.
pub type PortRegistry = BTreeMap<String, PortSpec>;

/// Changes to a tenant; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct TenantUpdate {
    /// New display name.
    pub display_name: Option<String>,
    /// New default policy.
    pub default_policy: Option<Action>,
    /// New attachment list (replaces the old one).
    pub attachments: Option<Vec<Attachment>>,
    /// New network VLAN ID (0: none).
    pub vlan_id: Option<u16>,
    /// Whether the tenant's flows stay on the cores.
    pub no_offload: Option<bool>,
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
        self.check_guards_spare_endpoints(owner, atts)?;
        self.check_claims(owner, atts)
    }

    /// Checks that `atts` collide with no attachment of a tenant other
    /// than `owner`: each is looked up in the state's [`Index`] of claims,
    /// so the check costs `O(n log m)` for `n` new and `m` held
    /// attachments.
    ///
    /// [`Index`]: super::Index
    fn check_claims(&self, owner: &str, atts: &[Attachment]) -> Result<()> {
        for a in atts {
            let Some(tid) = self.index.claimant(owner, a) else {
                continue;
            };
            // The claimant's own attachments are few (its cap): find the
            // one that overlaps, to name it.
            let held = self
                .tenants
                .get(tid)
                .and_then(|t| t.attachments.iter().find(|o| o.conflicts_with(a)));
            return Err(ControlError::AlreadyExists(match held {
                Some(o) => format!("{a} overlaps {o}, which belongs to tenants/{tid}"),
                None => format!("{a} overlaps an attachment of tenants/{tid}"),
            }));
        }
        Ok(())
    }

    /// Checks that tenant `id` may hold `atts` attachments and `rules`
    /// rules, given what the other tenants hold.
    fn check_tenant_caps(&self, limits: Limits, id: &str, atts: usize, rules: usize) -> Result<()> {
        cap(
            "limits.max_attachments_per_tenant",
            limits.attachments_per_tenant,
            atts,
            || format!("{atts} attachments in tenants/{id}"),
        )?;
        let (held_atts, held_rules) = self
            .tenants
            .get(id)
            .map_or((0, 0), |t| (t.attachments.len(), t.rules.rules.len()));
        let all = self
            .index
            .attachments()
            .saturating_sub(held_atts)
            .saturating_add(atts);
        cap("limits.max_attachments", limits.attachments, all, || {
            format!("{all} attachments in all tenants")
        })?;
        cap(
            "limits.max_rules_per_tenant",
            limits.rules_per_tenant,
            rules,
            || format!("{rules} rules in tenants/{id}"),
        )?;
        let all = self
            .index
            .rules()
            .saturating_sub(held_rules)
            .saturating_add(rules);
        cap("limits.max_rules", limits.rules, all, || {
            format!("{all} rules in all tenants")
        })
    }

    /// Creates a tenant.
    pub fn create_tenant(
        &mut self,
        limits: Limits,
        ports: &PortRegistry,
        tenant: Tenant,
    ) -> Result<()> {
        if self.tenants.contains_key(&tenant.id) {
            return Err(ControlError::AlreadyExists(format!(
                "tenants/{} already exists",
                tenant.id
            )));
        }
        let n = self.tenants.len() + 1;
        cap("limits.max_tenants", limits.tenants, n, || {
            format!("{n} tenants")
        })?;
        let (atts, rules) = (tenant.attachments.len(), tenant.rules.rules.len());
        self.check_tenant_caps(limits, &tenant.id, atts, rules)?;
        self.check_vlan_id(&tenant.id, tenant.vlan_id)?;
        self.check_attachments(ports, &tenant.id, &tenant.attachments)?;
        self.index.add_tenant(&tenant);
        self.tenants.insert(tenant.id.clone(), tenant);
        Ok(())
    }

    /// Updates a tenant and returns it.
    pub fn update_tenant(
        &mut self,
        limits: Limits,
        ports: &PortRegistry,
        id: &str,
        u: TenantUpdate,
    ) -> Result<&Tenant> {
        let t = self.tenant(id)?;
        if let Some(atts) = &u.attachments {
            self.check_tenant_caps(limits, id, atts.len(), t.rules.rules.len())?;
            self.check_attachments(ports, id, atts)?;
        }
        if let Some(v) = u.vlan_id {
            self.check_vlan_id(id, v)?;
            let was = self.tenant(id)?.vlan_id;
            self.index.vlan_ids_changed(was, v, id);
        }
        if let Some(a) = &u.attachments {
            let old = std::mem::take(&mut self.tenant_mut(id)?.attachments);
            self.index.remove_attachments(id, &old);
            self.index.add_attachments(id, a);
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
        if let Some(v) = u.vlan_id {
            t.vlan_id = v;
        }
        if let Some(n) = u.no_offload {
            t.no_offload = n;
        }
        Ok(t)
    }

    /// Refuses VLAN ID `v` for tenant `id` when another tenant's network
    /// has it (0, none, is never refused).
    fn check_vlan_id(&self, id: &str, v: u16) -> Result<()> {
        match self.index.vlan_id_holder(v) {
            Some(other) if v != 0 && other != id => Err(ControlError::AlreadyExists(format!(
                "tenant.vlan_id: VLAN {v} is the network of tenants/{other}"
            ))),
            _ => Ok(()),
        }
    }

    /// Deletes a tenant; without `force` it must hold no rules or
    /// attachments, and it never may while a listener is a storage endpoint
    /// in it (FAILED_PRECONDITION naming the listener).
    pub fn delete_tenant(&mut self, id: &str, force: bool) -> Result<()> {
        let t = self.tenant(id)?;
        if let Some(l) = self.endpoint_of_tenant(id) {
            return Err(ControlError::FailedPrecondition(format!(
                "tenants/{id} has a storage endpoint, {l}; delete its listeners first"
            )));
        }
        if !force && (!t.rules.rules.is_empty() || !t.attachments.is_empty()) {
            return Err(ControlError::FailedPrecondition(format!(
                "tenants/{id} still has {} rules and {} attachments; delete them first or set force",
                t.rules.rules.len(),
                t.attachments.len()
            )));
        }
        if let Some(t) = self.tenants.remove(id) {
            self.index.remove_tenant(&t);
        }
        Ok(())
    }

    /// Attaches `att` to tenant `id` and returns the tenant.
    pub fn attach(
        &mut self,
        limits: Limits,
        ports: &PortRegistry,
        id: &str,
        att: Attachment,
    ) -> Result<&Tenant> {
        let t = self.tenant(id)?;
        if let Some(o) = t.attachments.iter().find(|o| o.conflicts_with(&att)) {
            return Err(ControlError::AlreadyExists(format!(
                "{att} overlaps {o}, which tenants/{id} already holds"
            )));
        }
        self.check_tenant_caps(limits, id, t.attachments.len() + 1, t.rules.rules.len())?;
        self.check_attachments(ports, id, std::slice::from_ref(&att))?;
        self.index.add_attachments(id, std::slice::from_ref(&att));
        let t = self.tenant_mut(id)?;
        t.attachments.push(att);
        Ok(t)
    }

    /// Removes the port attachment (`port`, `vlan`) from whichever tenant
    /// holds it and returns that tenant.
    pub fn detach(&mut self, port: &str, vlan: u16) -> Result<&Tenant> {
        let want = Attachment::port_vlan(port, vlan);
        let owner = self
            .index
            .port_vlan_holder(port, vlan)
            .map(str::to_string)
            .ok_or_else(|| ControlError::NotFound(format!("attachment {want}")))?;
        let t = self.tenant_mut(&owner)?;
        let (gone, kept) = std::mem::take(&mut t.attachments)
            .into_iter()
            .partition(|a| a.is_port_vlan(port, vlan));
        t.attachments = kept;
        let gone: Vec<Attachment> = gone;
        self.index.remove_attachments(&owner, &gone);
        self.tenant(&owner)
    }

    /// Adds a rule to tenant `id`; returns the new rule-set version.
    pub fn add_rule(
        &mut self,
        limits: Limits,
        id: &str,
        rule: Rule,
        expected: Option<u64>,
    ) -> Result<u64> {
        let t = self.tenant(id)?;
        check_version(t, expected)?;
        let rules = &t.rules.rules;
        self.check_tenant_caps(limits, id, t.attachments.len(), rules.len() + 1)?;
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
        self.index.rules_changed(0, 1);
        let t = self.tenant_mut(id)?;
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
        let old = t.rules.rules.len();
        self.index.rules_changed(old, new.len());
        let t = self.tenant_mut(id)?;
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
        limits: Limits,
        id: &str,
        rules: Vec<(Option<String>, Rule)>,
        expected: Option<u64>,
    ) -> Result<u64> {
        let t = self.tenant(id)?;
        check_version(t, expected)?;
        self.check_tenant_caps(limits, id, t.attachments.len(), rules.len())?;
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
        let old = self.tenant(id)?.rules.rules.len();
        self.index.rules_changed(old, out.len());
        let t = self.tenant_mut(id)?;
        t.rules = RuleSet {
            version: t.rules.version + 1,
            rules: Arc::new(out),
        };
        Ok(t.rules.version)
    }

    /// [`State::revert`] for the tenant `id`.
    pub(super) fn revert_tenant(
        &mut self,
        id: &str,
        before: &State,
        after: &State,
    ) -> Result<Reverted> {
        let (was, made) = (before.tenants.get(id), after.tenants.get(id));
        if self.tenants.get(id) != made {
            return Ok(Reverted::Superseded);
        }
        match (was, made) {
            (None, None) => {}
            (None, Some(_)) => self.delete_tenant(id, true)?,
            (Some(was), made) => {
                // Attachments it gave up may have been taken since, and
                // its VLAN ID.
                self.check_claims(id, &was.attachments)?;
                self.check_vlan_id(id, was.vlan_id)?;
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
                if let Some(old) = self.tenants.remove(id) {
                    self.index.remove_tenant(&old);
                }
                self.index.add_tenant(&t);
                self.tenants.insert(id.to_string(), t);
            }
        }
        Ok(Reverted::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PortRole, Timestamp};
    use crate::state::tests::committed;
    use crate::state::{Limits, Part};

    const L: Limits = Limits::with_ram(0);

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
                        vtep_address: None,
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
            storage_qos: Default::default(),
            vlan_id: 0,
            no_offload: false,
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
        s.create_tenant(L, &p, tenant("a", vec![port("p0", 10)]))
            .unwrap();
        assert!(matches!(
            s.create_tenant(L, &p, tenant("b", vec![port("p0", 10)])),
            Err(ControlError::AlreadyExists(_))
        ));
        assert!(matches!(
            s.create_tenant(L, &p, tenant("b", vec![port("p0", 0)])),
            Err(ControlError::AlreadyExists(_))
        ));
        assert!(matches!(
            s.create_tenant(L, &p, tenant("b", vec![port("nope", 0)])),
            Err(ControlError::NotFound(_))
        ));
        s.create_tenant(L, &p, tenant("b", vec![port("p0", 20)]))
            .unwrap();
        assert!(matches!(
            s.attach(L, &p, "b", port("p0", 10)),
            Err(ControlError::AlreadyExists(_))
        ));
        assert!(matches!(
            s.attach(L, &p, "b", port("p0", 20)),
            Err(ControlError::AlreadyExists(_))
        ));
        s.attach(L, &p, "b", port("p1", 0)).unwrap();
        assert_eq!(s.detach("p0", 10).unwrap().id, "a");
        assert!(matches!(s.detach("p0", 10), Err(ControlError::NotFound(_))));
        s.attach(L, &p, "b", port("p0", 10)).unwrap();
        // An update may keep the tenant's own attachments.
        s.update_tenant(
            L,
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
        s.create_tenant(L, &ports(), tenant("a", vec![])).unwrap();
        assert_eq!(s.add_rule(L, "a", rule("r30", 30), Some(0)).unwrap(), 1);
        assert_eq!(s.add_rule(L, "a", rule("r10", 10), None).unwrap(), 2);
        assert_eq!(s.add_rule(L, "a", rule("r20", 20), Some(2)).unwrap(), 3);
        let order: Vec<u32> = s.tenants["a"]
            .rules
            .rules
            .iter()
            .map(|r| r.priority)
            .collect();
        assert_eq!(order, [10, 20, 30]);
        assert!(matches!(
            s.add_rule(L, "a", rule("x", 20), None),
            Err(ControlError::AlreadyExists(_))
        ));
        assert!(matches!(
            s.add_rule(L, "a", rule("r10", 99), None),
            Err(ControlError::AlreadyExists(_))
        ));
        assert!(matches!(
            s.add_rule(L, "a", rule("y", 5), Some(1)),
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
                L,
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
            s.replace_rules(L, "a", vec![(None, rule("", 1)), (None, rule("", 1))], None),
            Err(ControlError::InvalidArgument { field, .. }) if field == "rules[1].priority"
        ));
        assert_eq!(
            s.tenants["a"].rules.version, 5,
            "a refused replace changes nothing"
        );
        s.delete_tenant("a", true).unwrap();
        assert!(s.tenants.is_empty());
    }

    /// A tenant's network VLAN ID is its own: another tenant cannot take
    /// it, on create, on update or when a change is undone; deleting or
    /// changing it frees it.
    #[test]
    fn network_vlan_ids_are_unique() {
        let p = ports();
        let mut s = State::default();
        let with = |id: &str, v| Tenant {
            vlan_id: v,
            ..tenant(id, vec![])
        };
        s.create_tenant(L, &p, with("red", 10)).unwrap();
        let e = s.create_tenant(L, &p, with("blue", 10)).unwrap_err();
        assert!(
            e.to_string()
                .contains("VLAN 10 is the network of tenants/red"),
            "{e}"
        );
        s.create_tenant(L, &p, with("blue", 0)).unwrap();
        s.create_tenant(L, &p, with("green", 0)).unwrap();
        let to = |v| TenantUpdate {
            vlan_id: Some(v),
            ..Default::default()
        };
        assert!(s.update_tenant(L, &p, "blue", to(10)).is_err());
        // A tenant keeps its own on an update; red moves, freeing 10.
        s.update_tenant(L, &p, "red", to(10)).unwrap();
        s.update_tenant(L, &p, "red", to(11)).unwrap();
        s.update_tenant(L, &p, "blue", to(10)).unwrap();
        assert_eq!(s.index.vlan_id_holder(10), Some("blue"));
        // Red moves to 12 and green takes the 11 it left: undoing red's
        // move fails until green lets 11 go.
        let (before, after) = committed(&mut s, |s| {
            s.update_tenant(L, &p, "red", to(12)).unwrap();
        });
        s.update_tenant(L, &p, "green", to(11)).unwrap();
        let red = Part::Tenant("red".into());
        assert!(s.revert(L, &red, &before, &after).is_err());
        assert_eq!(s.tenants["red"].vlan_id, 12, "nothing changed");
        s.update_tenant(L, &p, "green", to(0)).unwrap();
        assert_eq!(
            s.revert(L, &red, &before, &after),
            Ok(crate::state::Reverted::Done)
        );
        assert_eq!(s.tenants["red"].vlan_id, 11);
        assert_eq!(s.index.vlan_id_holder(12), None);
        assert!(s.index_drift().is_none());
    }

    #[test]
    fn revert_tenants() {
        let p = ports();
        let lim = L;
        let red = Part::Tenant("red".into());
        assert_eq!(red.resource(), "tenants/red");
        let mut s = State::default();
        // A created tenant goes, with whatever it was created with.
        let (before, after) = committed(&mut s, |s| {
            s.create_tenant(L, &p, tenant("red", vec![port("p0", 10)]))
                .unwrap();
        });
        s.create_tenant(L, &p, tenant("blue", vec![])).unwrap();
        s.revert(lim, &red, &before, &after).unwrap();
        assert_eq!(s.tenants.keys().collect::<Vec<_>>(), ["blue"]);

        // Rules come back with a newer version.
        s.create_tenant(L, &p, tenant("red", vec![port("p0", 10)]))
            .unwrap();
        s.add_rule(L, "red", rule("r1", 1), None).unwrap();
        let (before, after) = committed(&mut s, |s| {
            s.replace_rules(L, "red", vec![(None, rule("", 5))], Some(1))
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
        other.attach(L, &p, "blue", port("p0", 0)).unwrap();
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
            s.add_rule(L, "red", rule("r2", 2), None).unwrap();
        });
        s.add_rule(L, "red", rule("r3", 3), None).unwrap();
        let now = s.clone();
        assert_eq!(
            s.revert(lim, &red, &before, &after).unwrap(),
            Reverted::Superseded
        );
        assert_eq!(s, now);
    }

    /// The configuration key a refusal names.
    fn limit_of<T: std::fmt::Debug>(r: Result<T>) -> &'static str {
        match r {
            Err(ControlError::ResourceExhausted { limit, .. }) => limit,
            other => panic!("expected RESOURCE_EXHAUSTED, got {other:?}"),
        }
    }

    #[test]
    fn caps_refuse_and_change_nothing() {
        let p = ports();
        let lim = Limits {
            tenants: 2,
            attachments_per_tenant: 2,
            attachments: 3,
            rules_per_tenant: 2,
            rules: 3,
            ..L
        };
        let mut s = State::default();
        s.create_tenant(lim, &p, tenant("a", vec![port("p0", 1), port("p0", 2)]))
            .unwrap();
        assert_eq!(
            limit_of(s.create_tenant(lim, &p, tenant("b", vec![port("p1", 1), port("p1", 2)]))),
            "limits.max_attachments"
        );
        s.create_tenant(lim, &p, tenant("b", vec![port("p1", 1)]))
            .unwrap();
        assert_eq!(
            limit_of(s.create_tenant(lim, &p, tenant("c", vec![]))),
            "limits.max_tenants"
        );
        assert_eq!(
            limit_of(s.attach(lim, &p, "a", port("p0", 3))),
            "limits.max_attachments_per_tenant"
        );
        assert_eq!(
            limit_of(s.attach(lim, &p, "b", port("p1", 2))),
            "limits.max_attachments"
        );
        let three = Some(vec![port("p1", 1), port("p1", 2), port("p1", 3)]);
        assert_eq!(
            limit_of(s.update_tenant(
                lim,
                &p,
                "b",
                TenantUpdate {
                    attachments: three,
                    ..Default::default()
                }
            )),
            "limits.max_attachments_per_tenant"
        );
        s.add_rule(lim, "a", rule("r1", 1), None).unwrap();
        s.add_rule(lim, "a", rule("r2", 2), None).unwrap();
        assert_eq!(
            limit_of(s.add_rule(lim, "a", rule("r3", 3), None)),
            "limits.max_rules_per_tenant"
        );
        s.add_rule(lim, "b", rule("r1", 1), None).unwrap();
        assert_eq!(
            limit_of(s.add_rule(lim, "b", rule("r2", 2), None)),
            "limits.max_rules"
        );
        let kept = s.clone();
        assert_eq!(
            limit_of(s.replace_rules(
                lim,
                "b",
                vec![(None, rule("", 1)), (None, rule("", 2))],
                None
            )),
            "limits.max_rules"
        );
        assert_eq!(s, kept, "refusals change nothing");
        // Replacing counts the tenant's new rules, not old plus new.
        s.replace_rules(
            lim,
            "a",
            vec![(None, rule("", 7)), (None, rule("", 8))],
            None,
        )
        .unwrap();
        let e = s.add_rule(lim, "b", rule("r2", 2), None).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            e.to_string(),
            "4 rules in all tenants: the limit is 3 (limits.max_rules)"
        );
    }

    /// Checking many attachments against many held ones is not quadratic:
    /// 4,096 new attachments against 16,384 held on the same port.
    #[test]
    fn attachment_checks_scale() {
        let p = ports();
        let lim = Limits {
            attachments: 1 << 20,
            attachments_per_tenant: 1 << 20,
            ..L
        };
        let mut s = State::default();
        for t in 0..4u16 {
            let atts = (1..=1024).map(|v| port("p0", t * 1024 + v)).collect();
            s.create_tenant(lim, &p, tenant(&format!("t{t}"), atts))
                .unwrap();
        }
        let vnis: Vec<Attachment> = (1..=4096)
            .map(|vni| Attachment::Vxlan {
                uplink: "p0".into(),
                vni,
                remote_vteps: vec![],
                underlay_prefixes: vec![],
            })
            .collect();
        let start = std::time::Instant::now();
        s.create_tenant(lim, &p, tenant("x", vnis)).unwrap();
        assert!(
            start.elapsed() < std::time::Duration::from_secs(1),
            "took {:?}",
            start.elapsed()
        );
        assert!(matches!(
            s.attach(lim, &p, "x", port("p0", 4000)),
            Err(ControlError::AlreadyExists(m)) if m.contains("tenants/t3")
        ));
    }
}
