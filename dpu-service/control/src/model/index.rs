//! [`Index`]: what the checks of a change need to know about the rest of
//! the state, kept up to date by every transition, so that checking a
//! change costs what the change costs (times a logarithm of the state),
//! not a walk over every tenant and subsystem.
//!
//! It holds who claims which traffic on each port (for the attachment
//! overlap check), running totals for the caps of [`crate::state::Limits`] and
//! the RAM limit, the NQNs, UUIDs, NGUIDs, backing paths, RBD images and
//! remote namespaces that must be unique across subsystems and volumes,
//! which namespaces use each storage cluster, and which namespace is made
//! on each volume. It is derived data: never stored, rebuilt from the
//! tenants, subsystems and volumes when a state is read back
//! ([`State::reindex`]), and updated by the transitions in `network` and
//! `storage`, each of which removes what it changes from the index and
//! adds it back as it is afterwards. [`State::index_drift`] compares it
//! with one built from scratch; the tests run it after random sequences
//! of changes.

use super::{
    namespace_name, volume_name, Attachment, Backend, Map, Namespace, Set, State, Subsystem,
    Tenant, Volume,
};

/// Who claims what on one port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PortClaims {
    /// The tenant holding the whole port (VLAN 0), which overlaps
    /// everything on it.
    whole: Option<String>,
    /// Attachments on the port by tenant, which a new whole-port
    /// attachment overlaps.
    holders: Map<String, usize>,
    /// VLAN attachments: VLAN ID to tenant.
    vlans: Map<u16, String>,
    /// VXLAN attachments: VNI to tenant.
    vnis: Map<u32, String>,
}

/// Derived facts about a [`State`] that its checks look up; see the
/// module documentation. Its maps are persistent ([`Map`]), as the
/// state's are, so a copy of the state copies none of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Index {
    ports: Map<String, PortClaims>,
    /// Tenants' network VLAN IDs ([`Tenant::vlan_id`]) to their tenant.
    vlan_ids: Map<u16, String>,
    attachments: usize,
    rules: usize,
    nqns: Map<String, String>,
    namespaces: usize,
    hosts: usize,
    listeners: usize,
    ram_bytes: u64,
    uuids: Map<[u8; 16], usize>,
    nguids: Map<[u8; 16], usize>,
    /// Backing path and the resource name of the namespace or volume
    /// it backs.
    paths: Set<(String, String)>,
    /// Volumes.
    volumes: usize,
    /// Volume ID to the resource name of the namespace made on it.
    volume_users: Map<String, String>,
    /// RBD images backing namespaces: cluster, pool, image, subsystem
    /// ID, NSID (ordered by cluster, so the users of a cluster are one
    /// range).
    images: Set<(String, String, String, String, u32)>,
    /// Remote namespaces backing namespaces: remote subsystem NQN, remote
    /// NSID, subsystem ID, NSID.
    remotes: Set<(String, u32, String, u32)>,
}

/// The [`Index::remotes`] entry of namespace `nsid` of `sid`, if a remote
/// namespace backs it.
fn remote_of(sid: &str, ns: &Namespace) -> Option<(String, u32, String, u32)> {
    match &ns.backend {
        Backend::Remote(r) => Some((r.subnqn.clone(), r.nsid, sid.to_string(), ns.nsid)),
        _ => None,
    }
}

/// The [`Index::images`] entry of namespace `nsid` of `sid`, if an RBD
/// image backs it.
fn image_of(sid: &str, ns: &Namespace) -> Option<(String, String, String, String, u32)> {
    match &ns.backend {
        Backend::Rbd {
            cluster,
            pool,
            image,
        } => Some((
            cluster.clone(),
            pool.clone(),
            image.clone(),
            sid.to_string(),
            ns.nsid,
        )),
        _ => None,
    }
}

fn backing_path(b: &Backend) -> Option<&str> {
    match b {
        Backend::File { path, .. } | Backend::BlockDevice { path } => Some(path),
        Backend::Ram { .. }
        | Backend::Rbd { .. }
        | Backend::Remote(_)
        | Backend::Null { .. }
        | Backend::Volume { .. } => None,
    }
}

fn ram_of(b: &Backend) -> u64 {
    match b {
        Backend::Ram { size_bytes } => *size_bytes,
        _ => 0,
    }
}

fn bump<K: Ord + Clone>(m: &mut Map<K, usize>, k: K) {
    *m.entry(k).or_insert(0) += 1;
}

fn drop_one<K: Ord + Clone>(m: &mut Map<K, usize>, k: &K) {
    if let Some(n) = m.get_mut(k) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            m.remove(k);
        }
    }
}

impl Index {
    /// The index of `s`, built from scratch.
    pub fn build(s: &State) -> Index {
        let mut ix = Index::default();
        for t in s.tenants.values() {
            ix.add_tenant(t);
        }
        for sub in s.subsystems.values() {
            ix.add_subsystem(sub);
        }
        for v in s.volumes.values() {
            ix.add_volume(v);
        }
        ix
    }

    /// The tenant, other than `owner`, holding an attachment that
    /// overlaps `a`: the same answer as comparing `a` with every
    /// attachment of every other tenant by [`Attachment::conflicts_with`].
    pub fn claimant(&self, owner: &str, a: &Attachment) -> Option<&str> {
        let p = self.ports.get(a.port())?;
        let other = |t: &&String| t.as_str() != owner;
        if let Some(w) = p.whole.as_ref().filter(other) {
            return Some(w);
        }
        match a {
            // At most two steps: the owner's own entry, then another's.
            Attachment::Port { vlan: 0, .. } => p.holders.keys().find(other),
            Attachment::Port { vlan, .. } => p.vlans.get(vlan).filter(other),
            Attachment::Vxlan { vni, .. } => p.vnis.get(vni).filter(other),
        }
        .map(String::as_str)
    }

    /// The tenant holding the port attachment (`port`, `vlan`).
    pub fn port_vlan_holder(&self, port: &str, vlan: u16) -> Option<&str> {
        let p = self.ports.get(port)?;
        match vlan {
            0 => p.whole.as_deref(),
            v => p.vlans.get(&v).map(String::as_str),
        }
    }

    /// Attachments of all tenants.
    pub fn attachments(&self) -> usize {
        self.attachments
    }

    /// Rules of all tenants.
    pub fn rules(&self) -> usize {
        self.rules
    }

    /// The tenant whose network's VLAN ID is `vlan` ([`Tenant::vlan_id`]).
    pub fn vlan_id_holder(&self, vlan: u16) -> Option<&str> {
        self.vlan_ids.get(&vlan).map(String::as_str)
    }

    /// The subsystem using `nqn`.
    pub fn nqn_holder(&self, nqn: &str) -> Option<&str> {
        self.nqns.get(nqn).map(String::as_str)
    }

    /// Namespaces of all subsystems.
    pub fn namespaces(&self) -> usize {
        self.namespaces
    }

    /// Allowed-host entries of all subsystems.
    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// Listeners of all subsystems.
    pub fn listeners(&self) -> usize {
        self.listeners
    }

    /// Bytes of all RAM-backed namespaces and RAM volumes.
    pub fn ram_bytes(&self) -> u64 {
        self.ram_bytes
    }

    /// True if a namespace has this UUID.
    pub fn uuid_taken(&self, uuid: &[u8; 16]) -> bool {
        self.uuids.contains_key(uuid)
    }

    /// True if a namespace has this NGUID.
    pub fn nguid_taken(&self, nguid: &[u8; 16]) -> bool {
        self.nguids.contains_key(nguid)
    }

    /// The resource name of the namespace or volume backed by `path`.
    pub fn path_user(&self, path: &str) -> Option<&str> {
        self.paths
            .range((path.to_string(), String::new())..)
            .next()
            .filter(|(p, _)| p == path)
            .map(|(_, owner)| owner.as_str())
    }

    /// Volumes.
    pub fn volumes(&self) -> usize {
        self.volumes
    }

    /// The resource name of the namespace made on volume `id`.
    pub fn volume_user(&self, id: &str) -> Option<&str> {
        self.volume_users.get(id).map(String::as_str)
    }

    /// Adds a volume.
    pub fn add_volume(&mut self, v: &Volume) {
        self.volumes += 1;
        self.ram_bytes = self.ram_bytes.saturating_add(ram_of(&v.backend));
        if let Some(p) = backing_path(&v.backend) {
            self.paths.insert((p.to_string(), volume_name(&v.id)));
        }
    }

    /// Removes a volume.
    pub fn remove_volume(&mut self, v: &Volume) {
        self.volumes = self.volumes.saturating_sub(1);
        self.ram_bytes = self.ram_bytes.saturating_sub(ram_of(&v.backend));
        if let Some(p) = backing_path(&v.backend) {
            self.paths.remove(&(p.to_string(), volume_name(&v.id)));
        }
    }

    /// The subsystem and NSID of a namespace backed by `image` of
    /// `pool` on `cluster`.
    pub fn image_user(&self, cluster: &str, pool: &str, image: &str) -> Option<(&str, u32)> {
        let from = (
            cluster.to_string(),
            pool.to_string(),
            image.to_string(),
            String::new(),
            0,
        );
        self.images
            .range(from..)
            .next()
            .filter(|(c, p, i, _, _)| c == cluster && p == pool && i == image)
            .map(|(_, _, _, sid, nsid)| (sid.as_str(), *nsid))
    }

    /// The subsystem and NSID of a namespace backed by namespace `nsid` of
    /// the remote subsystem `subnqn`.
    pub fn remote_user(&self, subnqn: &str, nsid: u32) -> Option<(&str, u32)> {
        self.remotes
            .range((subnqn.to_string(), nsid, String::new(), 0)..)
            .next()
            .filter(|(n, r, _, _)| n == subnqn && *r == nsid)
            .map(|(_, _, sid, nsid)| (sid.as_str(), *nsid))
    }

    /// The subsystem and NSID of a namespace backed by any namespace of
    /// the remote subsystem `subnqn` (the one of the lowest remote NSID).
    pub fn remote_subsystem_user(&self, subnqn: &str) -> Option<(&str, u32)> {
        self.remotes
            .range((subnqn.to_string(), 0, String::new(), 0)..)
            .next()
            .filter(|(n, _, _, _)| n == subnqn)
            .map(|(_, _, sid, nsid)| (sid.as_str(), *nsid))
    }

    /// The subsystem and NSID of a namespace backed by an image of
    /// `cluster` (the one of the first pool and image by name).
    pub fn cluster_user(&self, cluster: &str) -> Option<(&str, u32)> {
        self.cluster_images(cluster)
            .next()
            .map(|(_, _, _, sid, nsid)| (sid.as_str(), *nsid))
    }

    /// How many namespaces images of `cluster` back.
    pub fn cluster_users(&self, cluster: &str) -> usize {
        self.cluster_images(cluster).count()
    }

    fn cluster_images(
        &self,
        cluster: &str,
    ) -> impl Iterator<Item = &(String, String, String, String, u32)> {
        let cluster = cluster.to_string();
        let from = (
            cluster.clone(),
            String::new(),
            String::new(),
            String::new(),
            0,
        );
        self.images
            .range(from..)
            .take_while(move |(c, ..)| *c == cluster)
    }

    fn add_attachment(&mut self, tid: &str, a: &Attachment) {
        self.attachments += 1;
        let p = self.ports.entry(a.port().to_string()).or_default();
        bump(&mut p.holders, tid.to_string());
        match a {
            Attachment::Port { vlan: 0, .. } => p.whole = Some(tid.to_string()),
            Attachment::Port { vlan, .. } => {
                p.vlans.insert(*vlan, tid.to_string());
            }
            Attachment::Vxlan { vni, .. } => {
                p.vnis.insert(*vni, tid.to_string());
            }
        }
    }

    fn remove_attachment(&mut self, tid: &str, a: &Attachment) {
        self.attachments = self.attachments.saturating_sub(1);
        let Some(p) = self.ports.get_mut(a.port()) else {
            return;
        };
        drop_one(&mut p.holders, &tid.to_string());
        let mine = |t: &String| t == tid;
        match a {
            Attachment::Port { vlan: 0, .. } => {
                if p.whole.as_ref().is_some_and(mine) {
                    p.whole = None;
                }
            }
            Attachment::Port { vlan, .. } => {
                if p.vlans.get(vlan).is_some_and(mine) {
                    p.vlans.remove(vlan);
                }
            }
            Attachment::Vxlan { vni, .. } => {
                if p.vnis.get(vni).is_some_and(mine) {
                    p.vnis.remove(vni);
                }
            }
        }
        if p.holders.is_empty() {
            self.ports.remove(a.port());
        }
    }

    /// Adds `atts` of tenant `tid`.
    pub fn add_attachments(&mut self, tid: &str, atts: &[Attachment]) {
        for a in atts {
            self.add_attachment(tid, a);
        }
    }

    /// Removes `atts` of tenant `tid`.
    pub fn remove_attachments(&mut self, tid: &str, atts: &[Attachment]) {
        for a in atts {
            self.remove_attachment(tid, a);
        }
    }

    /// Adds a tenant, with its attachments and rules.
    pub fn add_tenant(&mut self, t: &Tenant) {
        if t.vlan_id != 0 {
            self.vlan_ids.insert(t.vlan_id, t.id.clone());
        }
        self.add_attachments(&t.id, &t.attachments);
        self.rules += t.rules.rules.len();
    }

    /// Moves tenant `id`'s network VLAN ID from `old` to `new` (0: none).
    pub fn vlan_ids_changed(&mut self, old: u16, new: u16, id: &str) {
        if old != 0 && self.vlan_ids.get(&old).map(String::as_str) == Some(id) {
            self.vlan_ids.remove(&old);
        }
        if new != 0 {
            self.vlan_ids.insert(new, id.to_string());
        }
    }

    /// Removes a tenant, with its attachments and rules.
    pub fn remove_tenant(&mut self, t: &Tenant) {
        if self.vlan_ids.get(&t.vlan_id) == Some(&t.id) {
            self.vlan_ids.remove(&t.vlan_id);
        }
        self.remove_attachments(&t.id, &t.attachments);
        self.rules = self.rules.saturating_sub(t.rules.rules.len());
    }

    /// Replaces a count of `old` rules of one tenant by `new`.
    pub fn rules_changed(&mut self, old: usize, new: usize) {
        self.rules = self.rules.saturating_sub(old) + new;
    }

    /// Replaces a count of `old` allowed hosts of one subsystem by `new`.
    pub fn hosts_changed(&mut self, old: usize, new: usize) {
        self.hosts = self.hosts.saturating_sub(old) + new;
    }

    /// Adds a namespace of subsystem `sid`.
    pub fn add_namespace(&mut self, sid: &str, ns: &Namespace) {
        self.namespaces += 1;
        self.ram_bytes = self.ram_bytes.saturating_add(ram_of(&ns.backend));
        bump(&mut self.uuids, ns.uuid);
        bump(&mut self.nguids, ns.nguid);
        if let Some(p) = backing_path(&ns.backend) {
            self.paths
                .insert((p.to_string(), namespace_name(sid, ns.nsid)));
        }
        if let Backend::Volume { id } = &ns.backend {
            self.volume_users
                .insert(id.clone(), namespace_name(sid, ns.nsid));
        }
        if let Some(i) = image_of(sid, ns) {
            self.images.insert(i);
        }
        if let Some(r) = remote_of(sid, ns) {
            self.remotes.insert(r);
        }
    }

    /// Removes a namespace of subsystem `sid`.
    pub fn remove_namespace(&mut self, sid: &str, ns: &Namespace) {
        self.namespaces = self.namespaces.saturating_sub(1);
        self.ram_bytes = self.ram_bytes.saturating_sub(ram_of(&ns.backend));
        drop_one(&mut self.uuids, &ns.uuid);
        drop_one(&mut self.nguids, &ns.nguid);
        if let Some(p) = backing_path(&ns.backend) {
            self.paths
                .remove(&(p.to_string(), namespace_name(sid, ns.nsid)));
        }
        if let Backend::Volume { id } = &ns.backend {
            if self.volume_users.get(id) == Some(&namespace_name(sid, ns.nsid)) {
                self.volume_users.remove(id);
            }
        }
        if let Some(i) = image_of(sid, ns) {
            self.images.remove(&i);
        }
        if let Some(r) = remote_of(sid, ns) {
            self.remotes.remove(&r);
        }
    }

    /// Replaces a count of `old` listeners of one subsystem by `new`.
    pub fn listeners_changed(&mut self, old: usize, new: usize) {
        self.listeners = self.listeners.saturating_sub(old) + new;
    }

    /// Adds a subsystem, with its hosts, namespaces and listeners.
    pub fn add_subsystem(&mut self, s: &Subsystem) {
        self.nqns.insert(s.nqn.clone(), s.id.clone());
        self.hosts += s.allowed_hosts.len();
        self.listeners += s.listeners.len();
        for ns in s.namespaces.values() {
            self.add_namespace(&s.id, ns);
        }
    }

    /// Removes a subsystem, with its hosts, namespaces and listeners.
    pub fn remove_subsystem(&mut self, s: &Subsystem) {
        if self.nqns.get(&s.nqn) == Some(&s.id) {
            self.nqns.remove(&s.nqn);
        }
        self.hosts = self.hosts.saturating_sub(s.allowed_hosts.len());
        self.listeners = self.listeners.saturating_sub(s.listeners.len());
        for ns in s.namespaces.values() {
            self.remove_namespace(&s.id, ns);
        }
    }
}

impl State {
    /// Rebuilds the index from the tenants and subsystems: for a state
    /// read back from disk, or whose maps were changed other than
    /// through its transitions (a journal replay).
    pub fn reindex(&mut self) {
        self.index = Index::build(self);
    }

    /// `None` if the index agrees with one built from scratch; otherwise
    /// both, for a test to show.
    pub fn index_drift(&self) -> Option<Box<(Index, Index)>> {
        let fresh = Index::build(self);
        (fresh != self.index).then(|| Box::new((self.index.clone(), fresh)))
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
