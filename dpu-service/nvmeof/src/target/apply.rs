//! A new configuration replacing the old: backends kept, resized, opened
//! or retired, and the controllers told (or ended) accordingly.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use dpu_os::backing::{BackingPolicy, Identity};

use super::config::Clusters;
use super::controller::{Controller, ControllerKind};
use super::{Namespace, NamespaceConfig, Subsystem, SubsystemConfig, Target, TargetConfig};
use crate::qos::{Limiter, QosScope};

/// Why a configuration could not be applied in full.
#[derive(Debug, thiserror::Error)]
#[error("subsystem {nqn} namespace {nsid}: {source}")]
pub struct ApplyError {
    /// Subsystem.
    pub nqn: String,
    /// Namespace.
    pub nsid: u32,
    /// What went wrong opening or resizing its backend.
    #[source]
    pub source: io::Error,
}

/// A namespace [`Target::apply`] is about to serve.
struct Built {
    ns: Arc<Namespace>,
    /// Hosts must be told: new, resized or reformatted.
    differs: bool,
    /// Its backend was opened by this apply.
    opened: bool,
}

impl Built {
    /// `p`, served on as it is.
    fn kept(p: &Arc<Namespace>) -> Self {
        Self {
            ns: p.clone(),
            differs: false,
            opened: false,
        }
    }
}

/// Leaves out every namespace whose backend this apply opened on a file
/// or device that another namespace of `built` serves (one served
/// before, or one listed earlier), reporting it and keeping what
/// `current` served under its NSID: two namespaces on one store would
/// each cache and write it unaware of the other.
fn one_store_each(
    current: &HashMap<String, Arc<Subsystem>>,
    built: &mut [(&SubsystemConfig, BTreeMap<u32, Built>)],
    errors: &mut Vec<ApplyError>,
) {
    let mut owner: HashMap<Identity, (String, u32)> = HashMap::new();
    for (sc, nss) in built.iter() {
        for (nsid, b) in nss.iter().filter(|(_, b)| !b.opened) {
            if let Some(id) = b.ns.identity {
                owner.insert(id, (sc.nqn.clone(), *nsid));
            }
        }
    }
    for (sc, nss) in built.iter_mut() {
        let prev = |nsid: &u32| current.get(&sc.nqn)?.namespaces.get(nsid).cloned();
        let mut refused = Vec::new();
        for (nsid, b) in nss.iter().filter(|(_, b)| b.opened) {
            let Some(id) = b.ns.identity else { continue };
            match owner.get(&id) {
                Some((nqn, other)) => refused.push((
                    *nsid,
                    format!(
                        "the same file or device already backs subsystem {nqn} namespace {other}"
                    ),
                )),
                None => {
                    owner.insert(id, (sc.nqn.clone(), *nsid));
                }
            }
        }
        for (nsid, why) in refused {
            nss.remove(&nsid);
            if let Some(p) = prev(&nsid) {
                nss.insert(nsid, Built::kept(&p));
            }
            errors.push(ApplyError {
                nqn: sc.nqn.clone(),
                nsid,
                source: io::Error::new(io::ErrorKind::AlreadyExists, why),
            });
        }
    }
}

impl Target {
    /// Serves `config` from now on. Namespaces whose backend cannot be
    /// opened or resized, or whose file or device another namespace
    /// serves already, are left out (or keep their old size) and
    /// reported; everything else is applied.
    ///
    /// Backends are opened and resized before the new configuration
    /// replaces the old, under no lock that I/O takes: a slow open (a
    /// device, a file on a slow filesystem) delays no command. Concurrent
    /// calls run one after the other.
    pub fn apply(&self, config: &TargetConfig) -> Vec<ApplyError> {
        let _one = self
            .inner
            .applying
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = self
            .inner
            .subsystems
            .read()
            .expect("subsystems lock")
            .clone();
        let mut errors = Vec::new();
        let mut built = Vec::with_capacity(config.subsystems.len());
        for sc in &config.subsystems {
            let old = current.get(&sc.nqn);
            let mut namespaces = BTreeMap::new();
            for nc in &sc.namespaces {
                let prev = old.and_then(|o| o.namespaces.get(&nc.nsid));
                let qos = self.limiter(&sc.nqn, QosScope::Namespace(nc.nsid));
                match Self::namespace(&self.inner.backing, &self.inner.clusters, prev, nc, qos) {
                    Ok(b) => {
                        namespaces.insert(nc.nsid, b);
                    }
                    Err(source) => {
                        errors.push(ApplyError {
                            nqn: sc.nqn.clone(),
                            nsid: nc.nsid,
                            source,
                        });
                        // Keep serving what was there.
                        if let Some(p) = prev {
                            namespaces.insert(nc.nsid, Built::kept(p));
                        }
                    }
                }
            }
            built.push((sc, namespaces));
        }
        one_store_each(&current, &mut built, &mut errors);
        // Limits take effect for the next command (those of namespaces
        // that failed to open too: they apply once one opens).
        self.inner.limiters.configure(config);
        for (_, nss) in &built {
            for b in nss.values().filter(|b| b.opened) {
                let target = Arc::downgrade(&self.inner);
                let store = Arc::as_ptr(&b.ns.removed) as usize;
                b.ns.backend.on_resize(Box::new(move || {
                    if let Some(inner) = target.upgrade() {
                        Target { inner }.store_resized(store);
                    }
                }));
            }
        }
        let used: Vec<&str> = built
            .iter()
            .flat_map(|(_, nss)| nss.values())
            .filter_map(|b| b.ns.spec.cluster().map(|c| c.name.as_str()))
            .collect();
        self.inner.clusters.retain(&used);

        let mut changed: Vec<(String, Vec<u32>)> = Vec::new();
        let mut gone: Vec<String> = Vec::new();
        let mut retired: Vec<Arc<Namespace>> = Vec::new();
        let mut discovery_changed = false;
        let mut next = HashMap::new();
        for (sc, built) in built {
            let old = current.get(&sc.nqn);
            let mut ns_changed: Vec<u32> = built
                .iter()
                .filter(|(_, b)| b.differs)
                .map(|(n, _)| *n)
                .collect();
            let namespaces: BTreeMap<u32, Arc<Namespace>> =
                built.into_iter().map(|(n, b)| (n, b.ns)).collect();
            if let Some(o) = old {
                ns_changed.extend(o.namespaces.keys().filter(|n| !namespaces.contains_key(n)));
                discovery_changed |= o.listeners != sc.listeners
                    || o.allow_any_host != sc.allow_any_host
                    || o.allowed_hosts != sc.allowed_hosts;
            } else {
                discovery_changed = true;
            }
            ns_changed.sort_unstable();
            if !ns_changed.is_empty() {
                changed.push((sc.nqn.clone(), ns_changed));
            }
            next.insert(
                sc.nqn.clone(),
                Arc::new(Subsystem {
                    nqn: sc.nqn.clone(),
                    serial: sc.serial.clone(),
                    model: sc.model.clone(),
                    allow_any_host: sc.allow_any_host,
                    allowed_hosts: sc.allowed_hosts.clone(),
                    max_namespaces: sc.max_namespaces,
                    namespaces,
                    listeners: sc.listeners.clone(),
                }),
            );
        }
        for nqn in current.keys() {
            if !next.contains_key(nqn) {
                gone.push(nqn.clone());
                discovery_changed = true;
            }
        }
        // Backends no longer served: deleted namespaces and
        // subsystems, replaced stores.
        for (nqn, old) in current.iter() {
            let kept = next.get(nqn);
            for ns in old.namespaces.values() {
                let serving = kept
                    .and_then(|k| k.namespaces.get(&ns.nsid))
                    .is_some_and(|n| Arc::ptr_eq(&n.removed, &ns.removed));
                if !serving {
                    retired.push(ns.clone());
                }
            }
        }
        *self.inner.subsystems.write().expect("subsystems lock") = next;
        // New commands no longer find them; wait for the I/O already on
        // them, and fail what was accepted but has not run.
        for ns in retired {
            ns.retire();
        }
        if discovery_changed {
            self.inner.discovery_genctr.fetch_add(1, Ordering::Relaxed);
        }
        let ctrls: Vec<Arc<Controller>> = self
            .inner
            .controllers
            .lock()
            .expect("controllers lock")
            .by_id
            .values()
            .cloned()
            .collect();
        let subs = self
            .inner
            .subsystems
            .read()
            .expect("subsystems lock")
            .clone();
        for c in ctrls {
            let revoked = match subs.get(&c.subnqn) {
                Some(s) if c.kind == ControllerKind::Io => {
                    if !s.allows_host(&c.hostnqn) {
                        Some("host no longer allowed")
                    } else if !s.exported_on(c.listener) {
                        Some("listener removed")
                    } else {
                        None
                    }
                }
                _ => None,
            };
            if gone.iter().any(|g| *g == c.subnqn) {
                tracing::info!(cntlid = c.cntlid, subnqn = %c.subnqn, "subsystem removed; ending its controller");
                c.kill();
            } else if let Some(why) = revoked {
                tracing::warn!(cntlid = c.cntlid, subnqn = %c.subnqn, hostnqn = %c.hostnqn, listener = %c.listener, "{why}; disconnecting the controller");
                self.inner
                    .stats
                    .controllers_revoked
                    .fetch_add(1, Ordering::Relaxed);
                c.kill();
            } else if let Some((_, nsids)) = changed.iter().find(|(n, _)| *n == c.subnqn) {
                c.namespaces_changed(nsids);
            } else if discovery_changed && c.kind == ControllerKind::Discovery {
                c.discovery_changed();
            }
        }
        errors
    }

    /// Tells the controllers of every namespace served from the store
    /// behind `store` (the address of its namespaces' shared `removed`
    /// gate) that the namespace changed: another client resized it.
    fn store_resized(&self, store: usize) {
        let subs = self
            .inner
            .subsystems
            .read()
            .expect("subsystems lock")
            .clone();
        let changed: Vec<(String, u32)> = subs
            .values()
            .flat_map(|s| {
                s.namespaces
                    .values()
                    .filter(|ns| Arc::as_ptr(&ns.removed) as usize == store)
                    .map(|ns| (s.nqn.clone(), ns.nsid))
            })
            .collect();
        let ctrls: Vec<Arc<Controller>> = self
            .inner
            .controllers
            .lock()
            .expect("controllers lock")
            .by_id
            .values()
            .cloned()
            .collect();
        for c in ctrls {
            let nsids: Vec<u32> = changed
                .iter()
                .filter(|(nqn, _)| *nqn == c.subnqn)
                .map(|(_, n)| *n)
                .collect();
            if !nsids.is_empty() && c.kind == ControllerKind::Io {
                c.namespaces_changed(&nsids);
            }
        }
    }

    /// The namespace for `nc`, reusing `prev`'s backend when it is the same
    /// namespace (same UUID and NGUID) on the same store; the flag says
    /// whether hosts must be told (new or resized).
    ///
    /// A namespace's UUID and NGUID stay fixed for its life (so the NVMe
    /// base specification has it), so other identifiers under the same NSID
    /// mean it was deleted and another created, even when one
    /// configuration carries both changes: the new one gets a backend of
    /// its own (empty, for RAM) and the old one is retired, failing the
    /// commands accepted against it.
    fn namespace(
        backing: &BackingPolicy,
        clusters: &Clusters,
        prev: Option<&Arc<Namespace>>,
        nc: &NamespaceConfig,
        qos: Arc<Limiter>,
    ) -> io::Result<Built> {
        let lba_shift = nc.block_size.max(512).trailing_zeros() as u8;
        let same = |p: &&Arc<Namespace>| {
            p.uuid == nc.uuid && p.nguid == nc.nguid && p.spec.same_store(&nc.backend)
        };
        let (backend, identity, removed, differs, opened) = match prev.filter(same) {
            Some(p) => {
                let resized = match nc.backend.resize_to(p.backend.len()) {
                    Some(size) => {
                        p.backend.resize(size)?;
                        true
                    }
                    None => false,
                };
                let differs = resized || p.lba_shift != lba_shift;
                if !differs && p.spec == nc.backend && p.eui64 == nc.eui64 {
                    return Ok(Built::kept(p));
                }
                let b = p.backend.clone();
                (b, p.identity, p.removed.clone(), differs, false)
            }
            None => {
                let (b, identity) = nc.backend.open(backing, clusters)?;
                (b, identity, Arc::default(), true, true)
            }
        };
        if let Some(store) = backend.store_block_size() {
            let bs = 1u32 << lba_shift;
            if !bs.is_multiple_of(store) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "block size {bs} is not a multiple of the store's own block size ({store} bytes)"
                    ),
                ));
            }
        }
        let ns = Namespace {
            nsid: nc.nsid,
            lba_shift,
            uuid: nc.uuid,
            nguid: nc.nguid,
            eui64: nc.eui64,
            backend,
            spec: nc.backend.clone(),
            identity,
            removed,
            qos,
        };
        Ok(Built {
            ns: Arc::new(ns),
            differs,
            opened,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::target::BackendSpec;

    fn subsystem(nqn: &str, namespaces: Vec<NamespaceConfig>) -> SubsystemConfig {
        SubsystemConfig {
            nqn: nqn.into(),
            serial: "s".into(),
            model: "m".into(),
            allow_any_host: true,
            allowed_hosts: BTreeSet::new(),
            max_namespaces: 8,
            namespaces,
            listeners: Vec::new(),
            host_qos: Default::default(),
        }
    }

    fn file_ns(nsid: u32, path: &std::path::Path, size: u64, created: bool) -> NamespaceConfig {
        NamespaceConfig {
            nsid,
            block_size: 512,
            uuid: [nsid as u8; 16],
            nguid: [nsid as u8; 16],
            eui64: None,
            backend: BackendSpec::File {
                path: path.to_path_buf(),
                size,
                created,
            },
            qos: Default::default(),
        }
    }

    fn config(subsystems: Vec<SubsystemConfig>) -> TargetConfig {
        TargetConfig {
            subsystems,
            discovery: None,
        }
    }

    fn served_len(t: &Target, nqn: &str, nsid: u32) -> Option<u64> {
        Some(t.subsystem(nqn)?.namespaces.get(&nsid)?.backend.len())
    }

    #[test]
    fn files_only_where_the_policy_allows() {
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join("a.img");
        let cfg = config(vec![subsystem(
            "nqn.a",
            vec![file_ns(1, &inside, 8192, true)],
        )]);
        let errors = Target::new().apply(&cfg);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].source.kind(), io::ErrorKind::PermissionDenied);
        assert!(!inside.exists(), "refused before anything was created");

        let policy = BackingPolicy::new(vec![dir.path().into()], vec![], None).unwrap();
        let t = Target::with_backing(policy);
        assert!(t.apply(&cfg).is_empty());
        assert_eq!(served_len(&t, "nqn.a", 1), Some(8192));
        let outside = config(vec![subsystem(
            "nqn.a",
            vec![
                file_ns(1, &inside, 8192, true),
                file_ns(2, std::path::Path::new("/etc/passwd"), 0, false),
            ],
        )]);
        let errors = t.apply(&outside);
        assert_eq!((errors.len(), errors[0].nsid), (1, 2), "{errors:?}");
        assert_eq!(errors[0].source.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(served_len(&t, "nqn.a", 2), None);
    }

    #[test]
    fn a_held_store_outlives_the_namespaces_made_on_it() {
        let store = crate::target::HeldStore::ram("volumes/v1", 8192);
        let on = |nsid: u32, size| NamespaceConfig {
            nsid,
            block_size: 512,
            // Each namespace made on the store is another namespace.
            uuid: [nsid as u8; 16],
            nguid: [nsid as u8; 16],
            eui64: None,
            backend: BackendSpec::Held {
                store: store.clone(),
                size,
            },
            qos: Default::default(),
        };
        let t = Target::new();
        assert!(t
            .apply(&config(vec![subsystem("nqn.a", vec![on(1, 8192)])]))
            .is_empty());
        let served = t.subsystem("nqn.a").unwrap().namespaces[&1].backend.clone();
        served.write_at(4096, b"kept", false).unwrap();
        // The namespace goes; the memory stays with its holder.
        assert!(t
            .apply(&config(vec![subsystem("nqn.a", vec![])]))
            .is_empty());
        drop(served);
        assert_eq!(store.len(), 8192);
        // Another namespace, in another subsystem, finds what was written,
        // and a new size given with the store resizes it for its hosts.
        assert!(t
            .apply(&config(vec![subsystem("nqn.b", vec![on(2, 8192)])]))
            .is_empty());
        assert!(t
            .apply(&config(vec![subsystem("nqn.b", vec![on(2, 16384)])]))
            .is_empty());
        assert_eq!(served_len(&t, "nqn.b", 2), Some(16384));
        assert_eq!(store.len(), 16384);
        let mut back = [0u8; 4];
        let served = t.subsystem("nqn.b").unwrap().namespaces[&2].backend.clone();
        served.read_at(4096, &mut back).unwrap();
        assert_eq!(&back, b"kept");
        // Another store of the same size is not the same store.
        let other = crate::target::HeldStore::ram("volumes/v1", 16384);
        assert_ne!(other, store);
    }

    #[test]
    fn two_namespaces_never_share_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.img");
        let t = Target::with_backing(
            BackingPolicy::new(vec![dir.path().into()], vec![], None).unwrap(),
        );
        let one = subsystem("nqn.a", vec![file_ns(1, &path, 4096, true)]);
        assert!(t.apply(&config(vec![one.clone()])).is_empty());
        let twice = config(vec![
            one,
            subsystem("nqn.b", vec![file_ns(3, &path, 0, false)]),
        ]);
        let errors = t.apply(&twice);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!((errors[0].nqn.as_str(), errors[0].nsid), ("nqn.b", 3));
        assert_eq!(errors[0].source.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(served_len(&t, "nqn.a", 1), Some(4096), "the first keeps it");
        assert_eq!(served_len(&t, "nqn.b", 3), None);
    }

    #[test]
    fn a_file_the_service_did_not_create_is_never_made_smaller() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("existing.img");
        std::fs::write(&path, vec![7u8; 16384]).unwrap();
        let t = Target::with_backing(
            BackingPolicy::new(vec![dir.path().into()], vec![], None).unwrap(),
        );
        let with = |size| {
            config(vec![subsystem(
                "nqn.a",
                vec![file_ns(1, &path, size, false)],
            )])
        };
        // Size 0: the file's own, kept across later applies.
        assert!(t.apply(&with(0)).is_empty());
        assert_eq!(served_len(&t, "nqn.a", 1), Some(16384));
        assert!(t.apply(&with(0)).is_empty());
        // A smaller size is a floor, not a truncation; a larger one grows.
        assert!(t.apply(&with(4096)).is_empty());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 16384);
        assert!(t.apply(&with(32768)).is_empty());
        assert_eq!(served_len(&t, "nqn.a", 1), Some(32768));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 32768);
        let backend = t.subsystem("nqn.a").unwrap().namespaces[&1].backend.clone();
        let err = backend.resize(4096).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(std::fs::read(&path).unwrap()[..16384], [7u8; 16384]);
        // It must exist: a missing one is not created.
        let gone = dir.path().join("gone.img");
        let errors = t.apply(&config(vec![subsystem(
            "nqn.a",
            vec![file_ns(1, &gone, 4096, false)],
        )]));
        assert_eq!(errors[0].source.kind(), io::ErrorKind::NotFound);
        assert!(!gone.exists());
    }
}
