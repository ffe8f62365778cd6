//! Storage-side transitions: NVM subsystems, their allowed hosts,
//! namespaces (with the RAM limit) and listeners.

use std::collections::BTreeSet;

use super::{cap, Limits, Reverted};
use crate::error::{ControlError, Result};
use crate::model::{
    AuthRequirement, Backend, HostAuth, Listener, Namespace, State, Subsystem, TlsRequirement,
};
use crate::validate::MAX_HOSTS_PER_SUBSYSTEM;

/// Changes to a subsystem; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct SubsystemUpdate {
    /// New allow-any-host flag.
    pub allow_any_host: Option<bool>,
    /// New allow list (replaces the old one).
    pub allowed_hosts: Option<BTreeSet<String>>,
    /// New model number.
    pub model_number: Option<String>,
    /// New authentication requirement.
    pub auth_requirement: Option<AuthRequirement>,
    /// New TLS requirement.
    pub tls_requirement: Option<TlsRequirement>,
}

impl State {
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

    /// Allowed-host entries of all subsystems but `except`.
    fn hosts_but(&self, except: &str) -> usize {
        let held = self
            .subsystems
            .get(except)
            .map_or(0, |s| s.allowed_hosts.len());
        self.index.hosts().saturating_sub(held)
    }

    /// Checks that subsystem `id` may allow `hosts` hosts, given what the
    /// other subsystems allow.
    fn check_hosts(&self, limits: Limits, id: &str, hosts: usize) -> Result<()> {
        let all = self.hosts_but(id).saturating_add(hosts);
        cap("limits.max_hosts", limits.hosts, all, || {
            format!("{all} allowed hosts in all subsystems")
        })
    }

    /// Creates a subsystem. Its listeners must all be where it is served
    /// ([`Subsystem::misplaced_listener`](crate::model::Subsystem::misplaced_listener)):
    /// FAILED_PRECONDITION otherwise.
    pub fn create_subsystem(&mut self, limits: Limits, s: Subsystem) -> Result<()> {
        if self.subsystems.contains_key(&s.id) {
            return Err(ControlError::AlreadyExists(format!(
                "subsystems/{} already exists",
                s.id
            )));
        }
        let n = self.subsystems.len() + 1;
        cap("limits.max_subsystems", limits.subsystems, n, || {
            format!("{n} subsystems")
        })?;
        self.check_hosts(limits, &s.id, s.allowed_hosts.len())?;
        let (ns, ls) = (
            self.index.namespaces().saturating_add(s.namespaces.len()),
            self.index.listeners().saturating_add(s.listeners.len()),
        );
        cap("limits.max_namespaces", limits.namespaces, ns, || {
            format!("{ns} namespaces in all subsystems")
        })?;
        cap("limits.max_listeners", limits.listeners, ls, || {
            format!("{ls} listeners in all subsystems")
        })?;
        if let Some(o) = self.index.nqn_holder(&s.nqn) {
            return Err(ControlError::AlreadyExists(format!(
                "NQN {} is already used by subsystems/{o}",
                s.nqn
            )));
        }
        if let Some((l, why)) = s.misplaced_listener() {
            return Err(ControlError::FailedPrecondition(format!(
                "subsystems/{}/listeners/{}: {why}",
                s.id, l.id
            )));
        }
        self.insert_subsystem(s)
    }

    /// Inserts subsystem `s`, placing each of its listeners that names a
    /// tenant ([`State::place_endpoint`]); on an error nothing changed.
    fn insert_subsystem(&mut self, mut s: Subsystem) -> Result<()> {
        let (id, seq) = (s.id.clone(), self.id_seq);
        let listeners = std::mem::take(&mut s.listeners);
        self.subsystems.insert(id.clone(), s);
        for (lid, mut l) in listeners {
            if let Err(e) = self.place_endpoint(&mut l) {
                self.subsystems.remove(&id);
                self.id_seq = seq;
                return Err(e);
            }
            if let Some(s) = self.subsystems.get_mut(&id) {
                s.listeners.insert(lid, l);
            }
        }
        let State {
            subsystems, index, ..
        } = self;
        if let Some(s) = subsystems.get(&id) {
            index.add_subsystem(s);
        }
        Ok(())
    }

    /// Updates a subsystem and returns it.
    pub fn update_subsystem(
        &mut self,
        limits: Limits,
        id: &str,
        u: SubsystemUpdate,
    ) -> Result<&Subsystem> {
        self.subsystem(id)?;
        if let Some(h) = &u.allowed_hosts {
            self.check_hosts(limits, id, h.len())?;
        }
        if let Some(h) = &u.allowed_hosts {
            let old = self.subsystem(id)?.allowed_hosts.len();
            self.index.hosts_changed(old, h.len());
        }
        let s = self.subsystem_mut(id)?;
        if let Some(a) = u.allow_any_host {
            s.allow_any_host = a;
        }
        if let Some(h) = u.allowed_hosts {
            s.host_auth.retain(|host, _| h.contains(host));
            // As RemoveHost: a host taken off the list loses its limits.
            for host in s.allowed_hosts.difference(&h) {
                s.host_qos.remove(host);
                s.host_tls.remove(host);
            }
            s.allowed_hosts = h;
        }
        s.keep_qos_of_allowed_hosts();
        s.keep_tls_of_allowed_hosts();
        if let Some(r) = u.auth_requirement {
            s.auth_requirement = r;
        }
        if let Some(r) = u.tls_requirement {
            s.tls_requirement = r;
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
        if let Some(s) = self.subsystems.remove(id) {
            self.index.remove_subsystem(&s);
        }
        Ok(())
    }

    /// Adds `host` to the allow list of subsystem `id`.
    pub fn add_host(&mut self, limits: Limits, id: &str, host: &str) -> Result<&Subsystem> {
        let n = self.subsystem(id)?.allowed_hosts.len();
        self.check_hosts(limits, id, n + 1)?;
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
        self.index.hosts_changed(0, 1);
        self.subsystem(id)
    }

    /// Removes `host` from the allow list of subsystem `id`, with its
    /// DH-HMAC-CHAP settings, its TLS key and its QoS limits.
    pub fn remove_host(&mut self, id: &str, host: &str) -> Result<&Subsystem> {
        let s = self.subsystem_mut(id)?;
        if !s.allowed_hosts.remove(host) {
            return Err(ControlError::NotFound(format!(
                "host {host} on subsystems/{id}"
            )));
        }
        s.host_auth.remove(host);
        s.host_qos.remove(host);
        s.host_tls.remove(host);
        self.index.hosts_changed(1, 0);
        self.subsystem(id)
    }

    /// Sets the DH-HMAC-CHAP settings of `host`, which must be on the
    /// allow list of subsystem `id` (at most one entry per allowed host,
    /// so their number is bounded by the hosts' caps).
    pub fn set_host_auth(&mut self, id: &str, host: &str, auth: HostAuth) -> Result<&Subsystem> {
        let s = self.subsystem_mut(id)?;
        if !s.allowed_hosts.contains(host) {
            return Err(ControlError::NotFound(format!(
                "host {host} on subsystems/{id}: add it to the allow list first"
            )));
        }
        s.host_auth.insert(host.to_string(), auth);
        Ok(s)
    }

    /// Removes the DH-HMAC-CHAP settings of `host` on subsystem `id`.
    pub fn clear_host_auth(&mut self, id: &str, host: &str) -> Result<&Subsystem> {
        let s = self.subsystem_mut(id)?;
        if s.host_auth.remove(host).is_none() {
            return Err(ControlError::NotFound(format!(
                "DH-HMAC-CHAP settings of host {host} on subsystems/{id}"
            )));
        }
        Ok(s)
    }

    /// Bytes of RAM namespaces, but namespace `except`.
    fn ram_in_use(&self, except: Option<(&str, u32)>) -> u64 {
        let held = except
            .and_then(|(sid, nsid)| self.namespace_at(sid, nsid))
            .map_or(0, |n| match n.backend {
                Backend::Ram { size_bytes } => size_bytes,
                _ => 0,
            });
        self.index.ram_bytes().saturating_sub(held)
    }

    pub(super) fn check_ram(
        &self,
        limits: Limits,
        except: Option<(&str, u32)>,
        extra: u64,
    ) -> Result<()> {
        let total = self.ram_in_use(except).saturating_add(extra);
        if total > limits.ram_bytes {
            return Err(super::ram_refusal(total, limits));
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
        let n = self.index.namespaces() + 1;
        cap("limits.max_namespaces", limits.namespaces, n, || {
            format!("{n} namespaces in all subsystems")
        })?;
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
        if !ns.namespace_id.is_empty() {
            if let Some(other) = s
                .namespaces
                .values()
                .find(|n| n.namespace_id == ns.namespace_id)
            {
                return Err(ControlError::AlreadyExists(format!(
                    "namespace.namespace_id: subsystems/{id}/namespaces/{} has ID {:?} already",
                    other.nsid, ns.namespace_id
                )));
            }
        }
        if let Backend::Ram { size_bytes } = ns.backend {
            self.check_ram(limits, None, size_bytes)?;
        }
        self.check_volume(&mut ns)?;
        if given_uuid && self.index.uuid_taken(&ns.uuid) {
            return Err(ControlError::AlreadyExists(
                "namespace.uuid is used by another namespace".into(),
            ));
        }
        if given_nguid && self.index.nguid_taken(&ns.nguid) {
            return Err(ControlError::AlreadyExists(
                "namespace.nguid is used by another namespace".into(),
            ));
        }
        if let Backend::File { path, .. } | Backend::BlockDevice { path } = &ns.backend {
            if let Some(user) = self.index.path_user(path) {
                return Err(ControlError::AlreadyExists(format!(
                    "{path} already backs {user}"
                )));
            }
        }
        if let Backend::Rbd { .. } = &ns.backend {
            self.check_image(&ns.backend)?;
        }
        self.check_remote(id, &ns.backend)?;
        if !given_uuid {
            ns.uuid = random_uuid();
        }
        if !given_nguid {
            ns.nguid = random_bytes();
        }
        let nsid = ns.nsid;
        self.index.add_namespace(id, &ns);
        let s = self.subsystem_mut(id)?;
        Ok(s.namespaces.entry(nsid).or_insert(ns))
    }

    /// Resizes a RAM- or file-backed namespace; a file the service did
    /// not create is never made smaller (than the size the state knows:
    /// the caller checks the file's own, [`crate::validate::backing_resize`]).
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
            Backend::File {
                ref path,
                size_bytes,
                created: false,
            } if size < size_bytes => {
                return Err(ControlError::FailedPrecondition(format!(
                    "size_bytes: the service did not create {path}; it never makes it smaller than {size_bytes} bytes"
                )))
            }
            Backend::File { .. } => {}
            Backend::BlockDevice { .. } => {
                return Err(ControlError::FailedPrecondition(
                    "a block-device namespace takes its size from the device".into(),
                ))
            }
            Backend::Rbd { .. } => {
                return Err(ControlError::FailedPrecondition(
                    "an RBD namespace takes its size from the image: resize the image (rbd resize)"
                        .into(),
                ))
            }
            Backend::Remote(_) => {
                return Err(ControlError::FailedPrecondition(
                    "a remote namespace takes its size from the remote namespace: resize it there"
                        .into(),
                ))
            }
            Backend::Null { .. } => {}
            Backend::Volume { ref id } => {
                return Err(ControlError::FailedPrecondition(format!(
                    "the namespace takes its size from volumes/{id}: resize the volume (ResizeVolume)"
                )))
            }
        }
        let mut ns = ns.clone();
        match &mut ns.backend {
            Backend::Ram { size_bytes }
            | Backend::File { size_bytes, .. }
            | Backend::Null { size_bytes } => *size_bytes = size,
            Backend::BlockDevice { .. }
            | Backend::Rbd { .. }
            | Backend::Remote(_)
            | Backend::Volume { .. } => {}
        }
        self.put_namespace(id, ns)
    }

    /// Puts `ns` in the place of the namespace of subsystem `id` with its
    /// NSID, which exists, keeping the index up to date.
    fn put_namespace(&mut self, id: &str, ns: Namespace) -> Result<&Namespace> {
        let nsid = ns.nsid;
        let slot = self
            .subsystem_mut(id)?
            .namespaces
            .get_mut(&nsid)
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}/namespaces/{nsid}")))?;
        let old = std::mem::replace(slot, ns);
        self.index.remove_namespace(id, &old);
        let State {
            subsystems, index, ..
        } = self;
        let ns = subsystems
            .get(id)
            .and_then(|s| s.namespaces.get(&nsid))
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}/namespaces/{nsid}")))?;
        index.add_namespace(id, ns);
        Ok(ns)
    }

    /// Deletes a namespace.
    pub fn delete_namespace(&mut self, id: &str, nsid: u32) -> Result<()> {
        let ns = self
            .subsystem_mut(id)?
            .namespaces
            .remove(&nsid)
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}/namespaces/{nsid}")))?;
        self.index.remove_namespace(id, &ns);
        Ok(())
    }

    /// Creates a listener in subsystem `id`.
    /// A listener that names a tenant is a storage endpoint of it
    /// (`State::place_endpoint`): the tenant must exist, the address
    /// be none of its hosts', and the listener gets its endpoint's MAC.
    /// A subsystem is served in one place
    /// ([`Subsystem::serving_conflict`](crate::model::Subsystem::serving_conflict)):
    /// FAILED_PRECONDITION for a listener elsewhere, and for one whose
    /// secure channel differs from another listener's on its address and
    /// port, or that asks for one on a storage endpoint.
    pub fn create_listener(
        &mut self,
        limits: Limits,
        id: &str,
        mut l: Listener,
    ) -> Result<&Listener> {
        self.subsystem(id)?;
        let n = self.index.listeners() + 1;
        cap("limits.max_listeners", limits.listeners, n, || {
            format!("{n} listeners in all subsystems")
        })?;
        let s = self.subsystem(id)?;
        if s.listeners.contains_key(&l.id) {
            return Err(ControlError::AlreadyExists(format!(
                "subsystems/{id}/listeners/{} already exists",
                l.id
            )));
        }
        if let Some(o) = s.listeners.values().find(|o| {
            o.transport == l.transport
                && o.address == l.address
                && o.port == l.port
                && o.tenant == l.tenant
        }) {
            let within = l
                .tenant
                .as_ref()
                .map(|t| format!(" in tenants/{t}"))
                .unwrap_or_default();
            return Err(ControlError::AlreadyExists(format!(
                "subsystems/{id}/listeners/{} already listens on {}:{}{within}",
                o.id, l.address, l.port
            )));
        }
        if let Some(why) = self.secure_channel_conflict(&l) {
            return Err(ControlError::FailedPrecondition(format!(
                "subsystems/{id}/listeners/{}: {why}",
                l.id
            )));
        }
        // The listener itself first (its tenant exists, its address is
        // no host's), then where it would be served.
        let seq = self.id_seq;
        self.place_endpoint(&mut l)?;
        if let Some(why) = self
            .subsystem(id)?
            .serving_conflict(l.tenant.as_deref(), l.address)
        {
            self.id_seq = seq;
            return Err(ControlError::FailedPrecondition(format!(
                "subsystems/{id}/listeners/{}: {why}",
                l.id
            )));
        }
        let s = self.subsystem_mut(id)?;
        let lid = l.id.clone();
        s.listeners.insert(lid.clone(), l);
        self.index.listeners_changed(0, 1);
        self.listener_at(id, &lid)
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}/listeners/{lid}")))
    }

    /// Deletes a listener.
    pub fn delete_listener(&mut self, id: &str, lid: &str) -> Result<()> {
        self.subsystem_mut(id)?
            .listeners
            .remove(lid)
            .ok_or_else(|| ControlError::NotFound(format!("subsystems/{id}/listeners/{lid}")))?;
        self.index.listeners_changed(1, 0);
        Ok(())
    }

    fn namespace_at(&self, id: &str, nsid: u32) -> Option<&Namespace> {
        self.subsystems.get(id)?.namespaces.get(&nsid)
    }

    fn listener_at(&self, id: &str, lid: &str) -> Option<&Listener> {
        self.subsystems.get(id)?.listeners.get(lid)
    }

    /// [`State::revert`] for namespace `nsid` of subsystem `id`.
    pub(super) fn revert_namespace(
        &mut self,
        limits: Limits,
        id: &str,
        nsid: u32,
        before: &State,
        after: &State,
    ) -> Result<Reverted> {
        let (was, made) = (before.namespace_at(id, nsid), after.namespace_at(id, nsid));
        if self.namespace_at(id, nsid) != made {
            return Ok(Reverted::Superseded);
        }
        match (was, made) {
            (None, None) => {}
            (None, Some(_)) => self.delete_namespace(id, nsid)?,
            (Some(was), None) => {
                self.create_namespace(limits, id, was.clone(), true, true)?;
            }
            (Some(was), Some(_)) => {
                if let Backend::Ram { size_bytes } = was.backend {
                    self.check_ram(limits, Some((id, nsid)), size_bytes)?;
                }
                self.put_namespace(id, was.clone())?;
            }
        }
        Ok(Reverted::Done)
    }

    /// [`State::revert`] for listener `lid` of subsystem `id`.
    pub(super) fn revert_listener(
        &mut self,
        limits: Limits,
        id: &str,
        lid: &str,
        before: &State,
        after: &State,
    ) -> Result<Reverted> {
        let (was, made) = (before.listener_at(id, lid), after.listener_at(id, lid));
        if self.listener_at(id, lid) != made {
            return Ok(Reverted::Superseded);
        }
        match (was, made) {
            (None, None) => {}
            (None, Some(_)) => self.delete_listener(id, lid)?,
            (Some(was), None) => {
                self.create_listener(limits, id, was.clone())?;
            }
            (Some(was), Some(made)) => {
                let made = made.clone();
                self.delete_listener(id, lid)?;
                if let Err(e) = self.create_listener(limits, id, was.clone()) {
                    self.subsystem_mut(id)?
                        .listeners
                        .insert(lid.to_string(), made);
                    self.index.listeners_changed(0, 1);
                    return Err(e);
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
pub(super) fn random_uuid() -> [u8; 16] {
    let mut b = random_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Transport;
    use crate::state::tests::committed;
    use crate::state::Part;

    fn subsystem(id: &str, nqn: &str) -> Subsystem {
        crate::state::tests::subsystem(id, nqn, false, 2)
    }

    fn ram(size: u64) -> Namespace {
        Namespace {
            nsid: 0,
            backend: Backend::Ram { size_bytes: size },
            block_size: 512,
            uuid: [0; 16],
            nguid: [0; 16],
            namespace_id: String::new(),
            eui64: None,
            qos: Default::default(),
        }
    }

    #[test]
    fn a_namespace_id_is_unique_within_its_subsystem() {
        let lim = Limits::with_ram(1 << 20);
        let mut s = State::default();
        for (id, nqn) in [
            ("a", "nqn.2024-01.io.example:a"),
            ("b", "nqn.2024-01.io.example:b"),
        ] {
            s.create_subsystem(Limits::with_ram(0), subsystem(id, nqn))
                .unwrap();
        }
        let named = |id: &str| Namespace {
            namespace_id: id.into(),
            eui64: Some([1, 2, 3, 4, 5, 6, 7, 8]),
            ..ram(4096)
        };
        let n = s
            .create_namespace(lim, "a", named("ns1"), false, false)
            .unwrap();
        assert_eq!((n.nsid, n.namespace_id.as_str()), (1, "ns1"));
        assert_eq!(n.eui64, Some([1, 2, 3, 4, 5, 6, 7, 8]));
        let taken = s.create_namespace(lim, "a", named("ns1"), false, false);
        assert!(
            matches!(&taken, Err(ControlError::AlreadyExists(m)) if m.starts_with("namespace.namespace_id")),
            "{taken:?}"
        );
        // Another subsystem may use it; none is no ID, so not unique.
        s.create_namespace(lim, "b", named("ns1"), false, false)
            .unwrap();
        s.create_namespace(lim, "a", ram(4096), false, false)
            .unwrap();
        s.delete_namespace("b", 1).unwrap();
        s.create_namespace(lim, "b", ram(4096), false, false)
            .unwrap();
        s.create_namespace(lim, "b", ram(4096), false, false)
            .unwrap();
        assert_eq!(s.subsystems["b"].namespaces[&2].namespace_id, "");
    }

    #[test]
    fn storage_objects() {
        let lim = Limits::with_ram(1 << 20);
        let mut s = State::default();
        s.create_subsystem(
            Limits::with_ram(0),
            subsystem("a", "nqn.2024-01.io.example:a"),
        )
        .unwrap();
        assert!(matches!(
            s.create_subsystem(
                Limits::with_ram(0),
                subsystem("b", "nqn.2024-01.io.example:a")
            ),
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
        s.add_host(Limits::with_ram(0), "a", "nqn.2024-01.io.example:host1")
            .unwrap();
        assert!(s.subsystems["a"].allows_host("nqn.2024-01.io.example:host1"));
        assert!(!s.subsystems["a"].allows_host("nqn.2024-01.io.example:host2"));
        assert!(matches!(
            s.add_host(Limits::with_ram(0), "a", "nqn.2024-01.io.example:host1"),
            Err(ControlError::AlreadyExists(_))
        ));
        s.remove_host("a", "nqn.2024-01.io.example:host1").unwrap();
        let l = Listener {
            id: "l".into(),
            transport: Transport::Tcp,
            address: "127.0.0.1".parse().unwrap(),
            port: 4420,
            tenant: None,
            mac: None,
            secure_channel: Default::default(),
        };
        s.create_listener(Limits::with_ram(0), "a", l.clone())
            .unwrap();
        let dup = Listener {
            id: "other".into(),
            ..l
        };
        assert!(matches!(
            s.create_listener(Limits::with_ram(0), "a", dup),
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
                created: true,
            },
            ..ram(0)
        }
    }

    #[test]
    fn a_file_the_service_did_not_create_is_not_made_smaller() {
        let lim = Limits::with_ram(0);
        let mut s = State::default();
        s.create_subsystem(
            Limits::with_ram(0),
            subsystem("a", "nqn.2024-01.io.example:a"),
        )
        .unwrap();
        let found = Namespace {
            backend: Backend::File {
                path: "/v/found.img".into(),
                size_bytes: 8192,
                created: false,
            },
            ..ram(0)
        };
        s.create_namespace(lim, "a", found, false, false).unwrap();
        s.create_namespace(lim, "a", file("/v/made.img", 8192), false, false)
            .unwrap();
        assert!(matches!(
            s.resize_namespace(lim, "a", 1, 4096),
            Err(ControlError::FailedPrecondition(_))
        ));
        s.resize_namespace(lim, "a", 1, 16384).unwrap();
        s.resize_namespace(lim, "a", 2, 4096).unwrap();
    }

    fn listener(id: &str, port: u16) -> Listener {
        Listener {
            id: id.into(),
            transport: Transport::Tcp,
            address: "127.0.0.1".parse().unwrap(),
            port,
            tenant: None,
            mac: None,
            secure_channel: Default::default(),
        }
    }

    fn ns_part(nsid: u32) -> Part {
        Part::Namespace {
            subsystem: "a".into(),
            nsid,
        }
    }

    #[test]
    fn revert_undoes_one_change_and_keeps_later_ones() {
        let lim = Limits::with_ram(1 << 20);
        let mut s = State::default();
        s.create_subsystem(
            Limits::with_ram(0),
            subsystem("a", "nqn.2024-01.io.example:a"),
        )
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
        let lim = Limits::with_ram(0);
        s.create_subsystem(
            Limits::with_ram(0),
            subsystem("a", "nqn.2024-01.io.example:a"),
        )
        .unwrap();
        let part = Part::Listener {
            subsystem: "a".into(),
            id: "l".into(),
        };
        assert_eq!(part.resource(), "subsystems/a/listeners/l");
        let (before, after) = committed(&mut s, |s| {
            s.create_listener(Limits::with_ram(0), "a", listener("l", 4420))
                .unwrap();
        });
        s.create_listener(Limits::with_ram(0), "a", listener("m", 4421))
            .unwrap();
        s.revert(lim, &part, &before, &after).unwrap();
        assert_eq!(
            s.subsystems["a"].listeners.keys().collect::<Vec<_>>(),
            ["m"]
        );
        // A deleted listener comes back unless its address was taken since.
        let (before, after) = committed(&mut s, |s| s.delete_listener("a", "m").unwrap());
        let mut other = s.clone();
        other
            .create_listener(Limits::with_ram(0), "a", listener("n", 4421))
            .unwrap();
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
    fn storage_caps() {
        let lim = Limits {
            subsystems: 1,
            namespaces: 1,
            hosts: 1,
            listeners: 1,
            ..Limits::with_ram(1 << 20)
        };
        let exhausted = |r: Result<()>| match r {
            Err(ControlError::ResourceExhausted { limit, .. }) => limit,
            other => panic!("expected RESOURCE_EXHAUSTED, got {other:?}"),
        };
        let mut s = State::default();
        let mut two_hosts = subsystem("a", "nqn.2024-01.io.example:a");
        two_hosts.allowed_hosts = ["nqn.2024-01.io.example:h1", "nqn.2024-01.io.example:h2"]
            .map(String::from)
            .into();
        assert_eq!(
            exhausted(s.create_subsystem(lim, two_hosts)),
            "limits.max_hosts"
        );
        s.create_subsystem(lim, subsystem("a", "nqn.2024-01.io.example:a"))
            .unwrap();
        assert_eq!(
            exhausted(s.create_subsystem(lim, subsystem("b", "nqn.2024-01.io.example:b"))),
            "limits.max_subsystems"
        );
        s.add_host(lim, "a", "nqn.2024-01.io.example:h1").unwrap();
        assert_eq!(
            exhausted(
                s.add_host(lim, "a", "nqn.2024-01.io.example:h2")
                    .map(|_| ())
            ),
            "limits.max_hosts"
        );
        let u = SubsystemUpdate {
            allowed_hosts: Some(
                ["nqn.2024-01.io.example:h3", "nqn.2024-01.io.example:h4"]
                    .map(String::from)
                    .into(),
            ),
            ..Default::default()
        };
        assert_eq!(
            exhausted(s.update_subsystem(lim, "a", u).map(|_| ())),
            "limits.max_hosts"
        );
        s.create_namespace(lim, "a", ram(4096), false, false)
            .unwrap();
        assert_eq!(
            exhausted(
                s.create_namespace(lim, "a", ram(4096), false, false)
                    .map(|_| ())
            ),
            "limits.max_namespaces"
        );
        s.create_listener(lim, "a", listener("l", 4420)).unwrap();
        assert_eq!(
            exhausted(s.create_listener(lim, "a", listener("m", 4421)).map(|_| ())),
            "limits.max_listeners"
        );
    }

    /// DH-HMAC-CHAP settings belong to an allowed host: they need one,
    /// and go with it when it leaves the allow list.
    #[test]
    fn host_auth_follows_the_allow_list() {
        use crate::model::{AuthRequirement, SecretText};
        let lim = Limits::with_ram(0);
        let (h1, h2) = ("nqn.2024-01.io.example:h1", "nqn.2024-01.io.example:h2");
        let auth = || HostAuth {
            secret: SecretText::parse(
                "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:",
            )
            .unwrap()
            .0,
            ctrl_secret: None,
            hashes: vec![],
            dh_groups: vec![],
        };
        let mut s = State::default();
        s.create_subsystem(lim, subsystem("a", "nqn.2024-01.io.example:a"))
            .unwrap();
        assert!(matches!(
            s.set_host_auth("a", h1, auth()),
            Err(ControlError::NotFound(_))
        ));
        s.add_host(lim, "a", h1).unwrap();
        s.add_host(lim, "a", h2).unwrap();
        s.set_host_auth("a", h1, auth()).unwrap();
        s.set_host_auth("a", h2, auth()).unwrap();
        s.remove_host("a", h1).unwrap();
        assert_eq!(s.subsystems["a"].host_auth.keys().collect::<Vec<_>>(), [h2]);
        let u = SubsystemUpdate {
            allowed_hosts: Some([h1.to_string()].into()),
            auth_requirement: Some(AuthRequirement::Required),
            ..Default::default()
        };
        s.update_subsystem(lim, "a", u).unwrap();
        assert!(s.subsystems["a"].host_auth.is_empty());
        assert_eq!(
            s.subsystems["a"].auth_requirement,
            AuthRequirement::Required
        );
        assert!(matches!(
            s.clear_host_auth("a", h1),
            Err(ControlError::NotFound(_))
        ));
        s.set_host_auth("a", h1, auth()).unwrap();
        s.clear_host_auth("a", h1).unwrap();
        assert!(s.subsystems["a"].host_auth.is_empty());
    }
}
