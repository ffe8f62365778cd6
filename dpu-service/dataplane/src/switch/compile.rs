//! Compilation: a [`SwitchConfig`] checked and turned into an immutable
//! [`Compiled`] snapshot, its tenants' classifiers built from scratch or
//! patched from the snapshot it replaces.

use std::sync::Arc;
use std::time::Duration;

use crate::classify::{AclRule, Classifier};
use crate::conntrack::ConnTable;
use crate::conntrack::Timeouts;
use crate::fair_share::ShareLimits;
use crate::fragtrack::{FragLimits, FragTable};

use super::config::{Attach, ConfigError, Guard, RateLimit, SwitchConfig, SwitchRule, Vtep};
use super::counters::{RuleCells, Shard, TenantCells};
use super::endpoint_ports::{
    endpoint_ports, endpoint_queues, with_endpoint_attachments, EndpointPort, Previous,
};
use super::police::Bucket;
use crate::endpoint_queues::EndpointTable;
use crate::mactable::MacLimits;

/// Inclusive ranges sorted and merged: disjoint, not adjacent, in order.
fn merged(mut ranges: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    ranges.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// `n`, or `u32::MAX` if larger.
fn clamp_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Tenants with at least this many rules have their classifications
/// cached. Below it the classifier's trees are shallow enough that a
/// cache hit saves little, while a miss still costs its hash, set and
/// insert. 65,536 flows through one tenant (`benches/switch.rs`, 262,144
/// entries): 1 rule 55.3 ns/packet without, 54.8 with; 64 rules 63.4
/// against 55.0; 1,000 rules 67.2 against 55.2. With four times more
/// flows than entries a miss costs 9-12 ns more than no cache.
pub const FLOW_CACHE_MIN_RULES: usize = 64;

/// No tenant: the marker in the attachment tables.
const NONE: u32 = u32::MAX;

#[derive(Debug)]
pub(super) struct CompiledTenant {
    pub(super) name: String,
    /// Per attachment: its anti-spoofing, if it has any.
    pub(super) guards: Vec<Option<Guard>>,
    /// IP frames are switched at L2, their network layer unparsed, as
    /// nothing would look at it (no rules, allow by default, no address
    /// guard on any attachment).
    pub(super) opaque_ip: bool,
    /// Stable across configurations while the name stays (connection keys).
    pub(super) uid: u32,
    /// Each rule's ID by tag, stable across configurations while the
    /// rule stays ([`NO_RULE_ID`] for a removed rule's slot).
    pub(super) rule_ids: Arc<[u32]>,
    /// Has stateful rules: look packets up in the connection table.
    pub(super) tracks: bool,
    /// Enough rules to look classifications up in the flow cache first.
    pub(super) cached: bool,
    /// What each rule does, by rule tag: [`ALLOWS`], [`OPENS`] and
    /// [`LIMITED`] bits (a byte a rule, so a big tenant's stay in cache).
    pub(super) actions: Arc<[u8]>,
    /// Rate limit (this worker's share) by rule tag.
    pub(super) limits: Arc<[Option<Bucket>]>,
    /// The rules by tag (`matches.tag` is the slot's index); `None`: a
    /// slot whose rule was removed by an incremental change.
    pub(super) slots: Arc<Vec<Option<Slot>>>,
    /// The tags of the configuration's rules, in the configuration's order.
    pub(super) order: Arc<Vec<u32>>,
    pub(super) attachments: Vec<Attach>,
    /// Remote VTEPs per attachment (empty but for VXLAN attachments).
    pub(super) remotes: Vec<Vec<u32>>,
    /// Underlay ranges per attachment whose VTEPs may send into it
    /// besides `remotes` (empty but for VXLAN attachments).
    pub(super) vtep_prefixes: Vec<Vec<(u32, u32)>>,
    pub(super) default_allow: bool,
    /// Its flows stay on the cores.
    pub(super) no_offload: bool,
    pub(super) classifier: Classifier,
    /// The rule list this was compiled from, held so that its allocation
    /// identifies it: a later configuration holding the same one has the
    /// same rules.
    pub(super) source: Arc<Vec<SwitchRule>>,
    /// The tenant's storage endpoints: (MAC, index of its attachment).
    /// Empty for most tenants, so their frames pay one length test.
    pub(super) endpoints: Box<[([u8; 6], u32)]>,
}

impl CompiledTenant {
    /// The attachment of the endpoint whose MAC is `mac`, if any. Inline,
    /// a tenant without endpoints pays a length test; the search is out
    /// of line, so that the frame's path stays as the compiler laid it
    /// out before endpoints existed (inlined, it kept `filter_ip` from
    /// being inlined into `decide`: 78 more instructions a packet).
    #[inline(always)]
    pub(super) fn endpoint(&self, mac: &[u8; 6]) -> Option<usize> {
        if self.endpoints.is_empty() {
            return None;
        }
        self.find_endpoint(mac)
    }

    #[inline(never)]
    fn find_endpoint(&self, mac: &[u8; 6]) -> Option<usize> {
        self.endpoints
            .iter()
            .find(|(m, _)| m == mac)
            .map(|&(_, a)| a as usize)
    }

    /// The stable ID of the rule of tag `tag`, if any.
    pub(super) fn rule_id(&self, tag: Option<u32>) -> Option<u32> {
        self.rule_ids.get(tag? as usize).copied()
    }

    /// Whether VXLAN attachment `ai` accepts frames from the remote VTEP
    /// `ip`: one it names, or in one of its underlay ranges.
    pub(super) fn accepts_vtep(&self, ai: usize, ip: u32) -> bool {
        self.remotes.get(ai).is_some_and(|r| r.contains(&ip))
            || self
                .vtep_prefixes
                .get(ai)
                .is_some_and(|r| r.iter().any(|&(lo, hi)| lo <= ip && ip <= hi))
    }
}

/// An allow rule (else deny).
pub(super) const ALLOWS: u8 = 1;

/// An allow rule that opens connections (stateful).
pub(super) const OPENS: u8 = 2;

/// An allow rule with a rate limit.
pub(super) const LIMITED: u8 = 4;

/// A compiled rule: what the packet path and the counters need of a
/// [`SwitchRule`], cheap to copy into the next snapshot.
#[derive(Debug, Clone)]
pub(super) struct Slot {
    pub(super) id: Arc<str>,
    /// `tag` is the slot's index.
    matches: AclRule,
    pub(super) allow: bool,
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
///
/// [`SwitchHandle::publish`]: super::SwitchHandle::publish
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

/// The remote VTEPs a port's VXLAN attachments name, and the underlay
/// ranges (inclusive) they accept.
pub(super) type VtepPeers = (hashbrown::HashSet<u32>, Vec<(u32, u32)>);

/// An immutable, compiled switch configuration.
#[derive(Debug)]
pub struct Compiled {
    /// Per port: the tenant owning the whole port, and its attachment index.
    whole: Vec<(u32, u32)>,
    /// Per port: 4096 entries (tenant, attachment) by VLAN ID, or empty
    /// if the port has no VLAN attachment.
    vlans: Vec<Vec<(u32, u32)>>,
    /// Per port: its VTEP.
    pub(super) vteps: Vec<Option<Vtep>>,
    /// (tenant, attachment) by (port, VNI).
    pub(super) vxlan: hashbrown::HashMap<(u32, u32), (u32, u32)>,
    pub(super) tenants: Vec<CompiledTenant>,
    pub(super) mac_table_size: usize,
    pub(super) mac_ageing: Duration,
    /// Per worker: the connection table's size and shares.
    pub(super) conntrack: ShareLimits,
    /// Per worker: the fragment table's size, shares and timeout.
    pub(super) fragments: FragLimits,
    pub(super) mac_limits: MacLimits,
    /// Per port: the remote VTEPs its VXLAN attachments name, and the
    /// underlay ranges they accept: the only neighbours its VTEP learns.
    pub(super) vtep_peers: Vec<VtepPeers>,
    pub(super) conntrack_timeouts: Timeouts,
    pub(super) flow_cache_entries: usize,
    /// Tenant IDs in use (below `uids`) that track connections.
    pub(super) tracking: Vec<bool>,
    /// Whether any tenant switches IP unparsed ([`CompiledTenant`]'s
    /// `opaque_ip`): whether workers remember decisions by link-layer
    /// header ([`L2Memo`]).
    ///
    /// [`L2Memo`]: crate::l2memo::L2Memo
    pub(super) l2_memo: bool,
    pub(super) shards: Box<[Shard]>,
    /// How the tenants were compiled.
    pub(super) stats: Published,
    /// The storage endpoints and their virtual ports, in port order.
    pub(super) endpoints: Vec<EndpointPort>,
    /// Their tenants' names, in the same order.
    pub(super) endpoint_tenants: Vec<String>,
    /// Their queues by virtual port; `None` without endpoints.
    pub(super) endpoint_queues: Option<Arc<EndpointTable>>,
}

/// Tenant IDs by name, and rule IDs by tenant and rule: stable for the
/// life of a [`SwitchHandle`] (a rule's while it stays configured; a
/// rule ID is never given twice).
///
/// [`SwitchHandle`]: super::SwitchHandle
#[derive(Debug, Default)]
pub(super) struct TenantIds {
    tenants: std::collections::HashMap<String, u32>,
    rules: std::collections::HashMap<(u32, Arc<str>), u32>,
    next_rule: u32,
}

impl TenantIds {
    /// The ID of tenant `name`, given now if it has none.
    fn tenant(&mut self, name: &str) -> u32 {
        let next = self.tenants.len() as u32;
        *self.tenants.entry(name.to_string()).or_insert(next)
    }

    /// The ID of tenant `name`, if it was ever configured.
    pub(super) fn tenant_id(&self, name: &str) -> Option<u32> {
        self.tenants.get(name).copied()
    }

    /// Every tenant ever configured, by ID.
    pub(super) fn tenant_names(&self) -> std::collections::HashMap<u32, String> {
        self.tenants
            .iter()
            .map(|(n, &id)| (id, n.clone()))
            .collect()
    }

    /// The rules configured now, by ID: (tenant ID, rule ID).
    pub(super) fn rule_names(&self) -> std::collections::HashMap<u32, (u32, Arc<str>)> {
        self.rules.iter().map(|(k, &id)| (id, k.clone())).collect()
    }

    /// Gives `c`'s rules their IDs, keeping those of rules configured
    /// before and forgetting the rules no longer configured.
    fn number_rules(&mut self, c: &mut Compiled) {
        let mut live = std::collections::HashMap::new();
        for t in &mut c.tenants {
            let uids: Arc<[u32]> = t
                .slots
                .iter()
                .map(|s| match s {
                    Some(s) => {
                        let k = (t.uid, s.id.clone());
                        let id = match self.rules.get(&k) {
                            Some(&id) => id,
                            None => {
                                self.next_rule = self.next_rule.wrapping_add(1);
                                self.next_rule
                            }
                        };
                        live.insert(k, id);
                        id
                    }
                    None => NO_RULE_ID,
                })
                .collect();
            t.rule_ids = uids;
        }
        self.rules = live;
    }
}

/// The rule ID of a slot whose rule was removed.
pub(super) const NO_RULE_ID: u32 = 0;

impl Compiled {
    /// Sizes a worker's connection and fragment tables' per-tenant counts
    /// for this configuration's tenant IDs, and divides them among its
    /// tenants (those that track connections, for the connection table).
    /// Off the packet path: walks every tenant ID.
    pub(super) fn share_tables(&self, conns: &mut ConnTable, frags: &mut FragTable) {
        let ids = self.tracking.len();
        conns.reserve_tenants(ids);
        conns.set_tenants(self.tracking.iter().filter(|&&t| t).count());
        frags.set_tenants(ids, self.tenants.len());
    }

    /// Checks and compiles `config` (classifiers included).
    ///
    /// # Errors
    /// [`ConfigError`] naming the first problem.
    pub fn new(config: &SwitchConfig) -> Result<Compiled, ConfigError> {
        Compiled::compile(config, &mut TenantIds::default(), None)
    }

    /// Compiles `config`; tenants of `prev` (the configuration it
    /// replaces) whose rules changed little get their classifier patched
    /// instead of built.
    pub(super) fn compile(
        config: &SwitchConfig,
        ids: &mut TenantIds,
        prev: Option<&Compiled>,
    ) -> Result<Compiled, ConfigError> {
        config.check_sizes()?;
        let workers = config.workers.max(1);
        // Endpoints are attachments on virtual ports: a configuration
        // without any is compiled as it is.
        let endpoints = endpoint_ports(config)?;
        let endpoint_tenants: Vec<String> = endpoints
            .iter()
            .map(|p| config.tenants[p.tenant].name.clone())
            .collect();
        let previous = prev.map(|c| Previous {
            ports: &c.endpoints,
            tenants: &c.endpoint_tenants,
            queues: c.endpoint_queues.as_deref(),
        });
        let endpoint_queues = endpoint_queues(config, &endpoints, &endpoint_tenants, previous);
        let expanded;
        let config = if endpoints.is_empty() {
            config
        } else {
            expanded = with_endpoint_attachments(config, &endpoints);
            &expanded
        };
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
            conntrack: ShareLimits {
                max: config.conntrack_max.div_ceil(workers),
                per_tenant: config.conntrack_per_tenant.div_ceil(workers),
                reserved: config.conntrack_reserved_per_tenant.div_ceil(workers),
            },
            fragments: FragLimits {
                shares: ShareLimits {
                    max: config.fragments_max.div_ceil(workers),
                    per_tenant: config.fragments_per_tenant.div_ceil(workers),
                    reserved: config.fragments_reserved_per_tenant.div_ceil(workers),
                },
                timeout: config.fragment_timeout.as_secs().max(1),
            },
            mac_limits: MacLimits {
                per_tenant: clamp_u32(config.mac_per_tenant),
                per_attachment: clamp_u32(config.mac_per_attachment),
                reserved: clamp_u32(config.mac_reserved_per_tenant),
                tenants: clamp_u32(config.tenants.len()),
            },
            vtep_peers: vec![Default::default(); config.ports],
            conntrack_timeouts: config.conntrack_timeouts,
            flow_cache_entries: config.flow_cache_entries,
            tracking: Vec::new(),
            l2_memo: false,
            shards: Box::default(),
            stats: Published::default(),
            endpoints,
            endpoint_tenants,
            endpoint_queues,
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
                    let peers = &mut c.vtep_peers[a.port];
                    if let Some(r) = t.remote_vteps.get(ai) {
                        peers.0.extend(r.iter().copied());
                    }
                    for &(lo, hi) in t.vtep_prefixes.get(ai).into_iter().flatten() {
                        if lo > hi {
                            return Err(ConfigError::BadVtepPrefix {
                                tenant: t.name.clone(),
                                vni: a.vni,
                            });
                        }
                        peers.1.push((lo, hi));
                    }
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
            let prev_tenant = prev_tenants.get(t.name.as_str());
            // The very list the previous configuration's tenant was
            // compiled from: its compiled rules are kept without a compare.
            let same_list = prev_tenant.filter(|p| Arc::ptr_eq(&p.source, &t.rules));
            let patched = match same_list {
                Some(p) => Some((
                    Rules {
                        slots: p.slots.clone(),
                        order: p.order.clone(),
                        classifier: p.classifier.clone(),
                    },
                    false,
                )),
                None => prev_tenant.and_then(|p| patch_rules(p, &t.rules)),
            };
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
            let uid = ids.tenant(&t.name);
            // What derives from the rules alone is kept too, where the
            // workers (who share the rate limits) are as many.
            let kept = same_list.filter(|_| prev.is_some_and(|c| c.shards.len() == workers));
            let (actions, limits, tracks) = match kept {
                Some(p) => (p.actions.clone(), p.limits.clone(), p.tracks),
                None => {
                    let actions: Arc<[u8]> = slots
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
                    let limits = slots
                        .iter()
                        .map(|r| {
                            r.as_ref()
                                .filter(|r| r.allow)
                                .and_then(|r| r.rate_limit)
                                .map(|l| Bucket::share(&l, workers))
                        })
                        .collect();
                    let tracks = actions.iter().any(|a| a & OPENS != 0);
                    (actions, limits, tracks)
                }
            };
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
                limits,
                name: t.name.clone(),
                guards,
                opaque_ip,
                uid,
                rule_ids: Arc::from(Vec::new()),
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
                vtep_prefixes: (0..t.attachments.len())
                    .map(|i| match t.attachments[i].vni {
                        0 => Vec::new(),
                        _ => t.vtep_prefixes.get(i).cloned().unwrap_or_default(),
                    })
                    .collect(),
                default_allow: t.default_allow,
                no_offload: t.no_offload,
                classifier,
                source: t.rules.clone(),
                endpoints: t
                    .endpoints
                    .iter()
                    .enumerate()
                    .map(|(j, e)| {
                        let first = t.attachments.len() - t.endpoints.len();
                        (e.mac, (first + j) as u32)
                    })
                    .collect(),
            });
        }
        for (_, ranges) in &mut c.vtep_peers {
            *ranges = merged(std::mem::take(ranges));
        }
        c.l2_memo = c.tenants.iter().any(|t| t.opaque_ip);
        // Last, once nothing can fail: a refused configuration numbers
        // no rules.
        ids.number_rules(&mut c);
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

    /// Whether the VTEP of `port` knows `ip` as a remote VTEP: named by
    /// one of the port's VXLAN attachments, or in a range one accepts (a
    /// hash lookup and a binary search, however many tenants share the
    /// port).
    pub(super) fn is_vtep_peer(&self, port: usize, ip: u32) -> bool {
        self.vtep_peers.get(port).is_some_and(|(ips, ranges)| {
            if ips.contains(&ip) {
                return true;
            }
            let i = ranges.partition_point(|&(_, hi)| hi < ip);
            ranges.get(i).is_some_and(|&(lo, _)| lo <= ip)
        })
    }

    /// The tenant and attachment a frame on `port` with outer VLAN `vlan`
    /// belongs to.
    #[inline]
    pub(super) fn tenant_of(&self, port: usize, vlan: Option<u16>) -> Option<(usize, usize)> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::testing::*;

    /// Single-rule inserts, deletes and edits published one after the
    /// other patch the previous classifier, and every snapshot classifies
    /// exactly as one compiled from scratch; big changes rebuild.
    #[test]
    fn small_rule_changes_patch_and_agree_with_a_full_build() {
        let mut rng = dpu_rand::Rng::new(0x5eed);
        let mut rnd = move |n: u64| rng.below(n);
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
            std::sync::Arc::make_mut(&mut t.rules).push(r);
        }
        let mut cfg = SwitchConfig {
            ports: 3,
            tenants: vec![t, tenant("other", &[(2, 0)], true)],
            ..SwitchConfig::default()
        };
        let h = SwitchHandle::new(&cfg).unwrap();
        let mut patched = 0;
        for step in 0..300 {
            let rules = std::sync::Arc::make_mut(&mut cfg.tenants[0].rules);
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
        for r in std::sync::Arc::make_mut(&mut cfg.tenants[0].rules).iter_mut() {
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
        std::sync::Arc::make_mut(&mut cfg.tenants[0].rules).push(r);
        assert_eq!(
            h.publish(&cfg),
            Err(ConfigError::DuplicateOrder {
                tenant: "t".into(),
                order: dup
            })
        );
    }

    /// A port's underlay ranges, merged, answer as the list they came
    /// from does, for addresses around every bound.
    #[test]
    fn merged_ranges_answer_as_the_list() {
        let mut rnd = dpu_rand::Rng::new(0x7e9);
        for _ in 0..300 {
            let n = rnd.below(12);
            let top = rnd.below(2) == 0;
            let list: Vec<(u32, u32)> = (0..n)
                .map(|_| {
                    let lo = rnd.below(200) as u32;
                    (lo, lo + rnd.below(30) as u32)
                })
                .chain(top.then_some((u32::MAX - 3, u32::MAX)))
                .collect();
            let m = merged(list.clone());
            assert!(
                m.windows(2).all(|w| w[0].1.saturating_add(1) < w[1].0),
                "{m:?}"
            );
            let mut t = tenant("t", &[], true);
            t.attachments.push(Attach {
                port: 0,
                vlan: 0,
                vni: 1,
            });
            t.vtep_prefixes = vec![list.clone()];
            let c = Compiled::new(&SwitchConfig {
                ports: 1,
                vteps: vtep_on_port_0(1, 0xc000_0201),
                tenants: vec![t],
                ..SwitchConfig::default()
            })
            .unwrap();
            let probes = list
                .iter()
                .flat_map(|&(lo, hi)| [lo.wrapping_sub(1), lo, hi, hi.wrapping_add(1)])
                .chain([0, 100, 250, u32::MAX]);
            for ip in probes {
                let want = list.iter().any(|&(lo, hi)| lo <= ip && ip <= hi);
                assert_eq!(c.is_vtep_peer(0, ip), want, "{ip} in {list:?}");
                assert_eq!(c.tenants[0].accepts_vtep(0, ip), want, "{ip} in {list:?}");
            }
        }
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
        t.rules = vec![r.clone(), r].into();
        assert!(matches!(
            err(cfg(vec![t])),
            ConfigError::DuplicateOrder { .. }
        ));
    }
}
