//! What the target serves: its subsystems and their namespaces, each an
//! immutable snapshot, and the answer to I/O for a namespace taken out of
//! service.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};

use dpu_os::backing::Identity;

use crate::backend::Backend;
use crate::qos::Limiter;

use super::{BackendSpec, Target};

/// The answer to I/O for a namespace taken out of service after the
/// command was accepted but before its I/O ran, carried inside an
/// [`io::Error`] (kind [`io::ErrorKind::NotFound`]); a connection completes
/// such a command with Invalid Namespace or Format, as it does commands that
/// arrive later. See [`is_namespace_removed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("namespace {nsid} was removed")]
pub struct NamespaceRemoved {
    /// The namespace.
    pub nsid: u32,
}

impl From<NamespaceRemoved> for io::Error {
    fn from(e: NamespaceRemoved) -> Self {
        io::Error::new(io::ErrorKind::NotFound, e)
    }
}

/// True when `e` is a [`NamespaceRemoved`] answer.
pub fn is_namespace_removed(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.is::<NamespaceRemoved>())
}

/// A namespace being served.
///
/// A snapshot: a resize or a new block size makes a new `Namespace` that
/// shares the backend (and its [`Namespace::run`] gate) with the old one, so
/// I/O accepted before the change goes on. When the backend leaves service
/// (the namespace or its subsystem is deleted, its store replaced, or its
/// NSID given to a namespace with another UUID or NGUID),
/// [`Target::apply`] waits for the I/O running on it and fails the I/O that
/// had not started yet: once `apply` returns, nothing touches that backend.
#[derive(Debug)]
pub struct Namespace {
    /// Namespace ID.
    pub nsid: u32,
    /// log2 of the logical block size.
    pub lba_shift: u8,
    /// Namespace UUID.
    pub uuid: [u8; 16],
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// IEEE Extended Unique Identifier, if it has one.
    pub eui64: Option<[u8; 8]>,
    /// The backend.
    pub backend: Arc<dyn Backend>,
    pub(super) spec: BackendSpec,
    /// The file or device behind the backend, if any.
    pub(super) identity: Option<Identity>,
    /// True once the backend left service. I/O holds it for reading while
    /// it runs; taking it out of service holds it for writing.
    pub(super) removed: Arc<RwLock<bool>>,
    /// The namespace's QoS limiter (the same one for every namespace
    /// under its NSID on the subsystem, across configuration changes).
    pub qos: Arc<Limiter>,
}

impl Namespace {
    /// Size in logical blocks (follows the backend while it is resized).
    pub fn blocks(&self) -> u64 {
        self.backend.len() >> self.lba_shift
    }

    /// Runs `io` on the backend unless the namespace has left service.
    ///
    /// # Errors
    ///
    /// [`NamespaceRemoved`] when it has, else whatever `io` answers.
    pub fn run<T>(&self, io: impl FnOnce(&dyn Backend) -> io::Result<T>) -> io::Result<T> {
        let removed = self.removed.read().unwrap_or_else(PoisonError::into_inner);
        if *removed {
            return Err(NamespaceRemoved { nsid: self.nsid }.into());
        }
        io(&*self.backend)
    }

    /// True once the namespace's backend has left service.
    pub fn is_removed(&self) -> bool {
        *self.removed.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the backend out of service: waits for the I/O running in
    /// [`Namespace::run`], and makes every later `run` fail.
    pub(super) fn retire(&self) {
        *self.removed.write().unwrap_or_else(PoisonError::into_inner) = true;
    }
}

/// A subsystem being served: an immutable snapshot, replaced as a whole.
#[derive(Debug)]
pub struct Subsystem {
    /// NVMe Qualified Name.
    pub nqn: String,
    /// Serial number.
    pub serial: String,
    /// Model number.
    pub model: String,
    /// Any host may connect.
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect.
    pub allowed_hosts: BTreeSet<String>,
    /// Largest namespace ID.
    pub max_namespaces: u32,
    /// Namespaces by NSID.
    pub namespaces: BTreeMap<u32, Arc<Namespace>>,
    /// Transport addresses.
    pub listeners: Vec<SocketAddr>,
}

impl Subsystem {
    /// True if `host_nqn` may connect.
    pub fn allows_host(&self, host_nqn: &str) -> bool {
        self.allow_any_host || self.allowed_hosts.contains(host_nqn)
    }

    /// True if the subsystem is exported on the listener at `local` (a
    /// listener on a wildcard address matches any local address).
    pub fn exported_on(&self, local: SocketAddr) -> bool {
        self.listeners
            .iter()
            .any(|l| l.port() == local.port() && (l.ip().is_unspecified() || l.ip() == local.ip()))
    }
}

impl Target {
    /// The subsystem with `nqn`, if served.
    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.inner
            .subsystems
            .read()
            .expect("subsystems lock")
            .get(nqn)
            .cloned()
    }

    /// Every subsystem served, sorted by NQN.
    pub fn subsystems(&self) -> Vec<Arc<Subsystem>> {
        let mut v: Vec<_> = self
            .inner
            .subsystems
            .read()
            .expect("subsystems lock")
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.nqn.cmp(&b.nqn));
        v
    }
}
