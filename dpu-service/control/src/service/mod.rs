//! The `dpu.v1` gRPC services: thin adapters from requests to
//! [`crate::validate`] and [`crate::state`], and from domain values back to
//! messages through [`crate::convert`].
//!
//! One [`Api`] value implements every service trait; the binary wraps it in
//! each generated server type.

pub mod authz;
mod bounds;
mod cluster;
mod filter;
mod info;
pub mod opi;
pub mod opi_bridge;
pub mod opi_namespace;
pub mod opi_remote;
pub mod opi_volume;
mod port;
mod remote;
mod storage;
mod telemetry;
mod tenant;
mod volume;

pub use bounds::{
    count, request_bytes, Bounded, Malformed, ATTACHMENT_BYTES, RULE_BYTES, SMALL_REQUEST,
};
pub use cluster::{
    RemoteNamespaceInfo, ServedNamespaces, StoreProbe, MAX_LISTED_REMOTE_NAMESPACES,
};

use std::future::Future;
use std::sync::Arc;

use tonic::{Code, Request, Response, Status};

use dpu_os::backing::BackingPolicy;

use crate::apply::{Applied, Unapplied};
use crate::error::{ControlError, Result};
use crate::model::{State, Timestamp};
use crate::state::{Limits, Part, PortRegistry, Reverted};
use crate::store::{Committed, StateHandle};
use crate::telemetry::Telemetry;

/// Static facts about the running service, for `GetServiceInfo`.
#[derive(Debug, Clone)]
pub struct ServiceFacts {
    /// Version of the service.
    pub version: String,
    /// Target triple of the build.
    pub target_triple: String,
    /// DPDK version, empty without DPDK.
    pub dpdk_version: String,
    /// Data-plane driver name.
    pub dataplane_driver: String,
    /// Capability names.
    pub capabilities: Vec<String>,
    /// Process start time.
    pub start_time: Timestamp,
    /// Host name.
    pub hostname: String,
}

impl Default for ServiceFacts {
    /// Nothing known but the start time, now (a service under test).
    fn default() -> Self {
        ServiceFacts {
            version: String::new(),
            target_triple: String::new(),
            dpdk_version: String::new(),
            dataplane_driver: String::new(),
            capabilities: Vec::new(),
            start_time: Timestamp::now(),
            hostname: String::new(),
        }
    }
}

/// Everything the services share.
#[derive(Debug)]
pub struct Control {
    /// The persisted state.
    pub state: StateHandle,
    /// Configured ports.
    pub ports: PortRegistry,
    /// Counter sources and request counters.
    pub telemetry: Arc<Telemetry>,
    /// Machine-dependent limits.
    pub limits: Limits,
    /// Where namespaces' files and block devices may live
    /// (`storage.file_dirs`, `storage.block_devices`).
    pub backing: Arc<BackingPolicy>,
    /// Facts for `GetServiceInfo`.
    pub facts: ServiceFacts,
    /// How far the NVMe-oF target has applied the state: a storage call
    /// returns once the target serves its change, and a change the target
    /// cannot apply is undone. `None` when nothing serves storage (then
    /// the call returns once the change is stored).
    pub storage_applied: Option<Applied>,
    /// How far the switch's workers have taken the state: a tenant, rule
    /// or attachment call returns once every worker switches by its
    /// change, and a change the switch refuses is undone. `None` without
    /// a data plane (then the call returns once the change is stored).
    pub switch_applied: Option<Applied>,
    /// Connects to storage clusters and remote targets, so that a
    /// cluster, a change to one, an RBD namespace and a remote namespace
    /// are stored only once they work. `None`: nothing is probed (the
    /// configuration's check, tests).
    pub store_probe: Option<Arc<dyn StoreProbe>>,
    /// The sizes of block devices, RBD images and remote namespaces,
    /// which only the target knows, and whether their stores answer.
    /// `None`: they are 0.
    pub served: Option<Arc<dyn ServedNamespaces>>,
    /// The host NQN a remote namespace created without one connects with
    /// (the configuration's `storage.host_nqn`, or one derived from the
    /// machine's ID); the namespace keeps it.
    pub host_nqn: String,
}

/// Implements every `dpu.v1` service over one [`Control`].
#[derive(Debug, Clone)]
pub struct Api {
    ctl: Arc<Control>,
    /// Permits for probes of storage clusters running at once (shared by
    /// the clones): a probe holds a thread and a cluster client for up to
    /// the cluster's timeouts.
    probes: Arc<tokio::sync::Semaphore>,
}

impl Api {
    /// Wraps the shared control state.
    pub fn new(ctl: Arc<Control>) -> Self {
        Self {
            ctl,
            probes: Arc::new(tokio::sync::Semaphore::new(cluster::PROBES_AT_ONCE)),
        }
    }

    /// Runs `change`, which answers the part of the state it changed, if
    /// any, and, when `consumer` follows the state, waits until the
    /// consumer has applied it. A change the consumer tried and could not
    /// apply is undone ([`State::revert`]) and the consumer waited for
    /// again, so that when the call returns neither the store nor the
    /// consumer holds it.
    ///
    /// # Errors
    /// The change's own error (nothing changed);
    /// [`ControlError::CannotApply`] or, when the consumer refused the
    /// whole state, [`ControlError::Rejected`] (the change was undone);
    /// [`ControlError::NotApplied`] (the change stays stored: the consumer
    /// has not reported on it, or it could not be undone).
    async fn change_served<T, F>(&self, consumer: Option<&Applied>, change: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut State) -> Result<(T, Option<Part>)> + Send + 'static,
    {
        let ((out, part), committed) = self.ctl.state.mutate_committed(change).await?;
        let Some(consumer) = consumer else {
            return Ok(out);
        };
        let names = part.as_ref().map(Part::resources).unwrap_or_default();
        let resources: Vec<&str> = names.iter().map(String::as_str).collect();
        let (why, undone): (_, fn(String) -> ControlError) =
            match consumer.wait(committed.generation, &resources).await {
                Ok(()) => return Ok(out),
                Err(Unapplied::Pending(why)) => return Err(ControlError::NotApplied(why)),
                Err(Unapplied::Problems(why)) => (why, ControlError::CannotApply),
                Err(Unapplied::Refused(why)) => (why, ControlError::Rejected),
            };
        Err(match part {
            Some(part) => self.undo(consumer, part, committed, why, undone).await,
            None => ControlError::NotApplied(why),
        })
    }

    /// Runs a change to the tenant whose ID `change` answers and, when the
    /// switch follows the state, waits until every worker has taken it; a
    /// change the switch refuses is undone.
    ///
    /// # Errors
    /// As [`Api::change_served`].
    async fn change_tenant<T, F>(&self, change: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut State) -> Result<(T, String)> + Send + 'static,
    {
        self.change_served(self.ctl.switch_applied.as_ref(), move |s| {
            change(s).map(|(out, id)| (out, Some(Part::Tenant(id))))
        })
        .await
    }

    /// Undoes what `committed` did to `part`, which `consumer` could not
    /// apply for `why`, and waits until the consumer has applied the state
    /// without it; answers the call's error, made by `undone` if the
    /// change was undone.
    async fn undo(
        &self,
        consumer: &Applied,
        part: Part,
        committed: Committed,
        why: String,
        undone: fn(String) -> ControlError,
    ) -> ControlError {
        let limits = self.ctl.limits;
        let resource = part.resource();
        let names = part.resources();
        let reverted = self
            .ctl
            .state
            .mutate_committed(move |s| s.revert(limits, &part, &committed.before, &committed.after))
            .await;
        match reverted {
            Ok((Reverted::Done, c)) => {
                // Naming the part, so that a consumer which still cannot
                // apply it (or refuses the state for it) answers at once.
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                if let Err(e) = consumer.wait(c.generation, &names).await {
                    tracing::warn!(%resource, error = %e, "the state without an undone change is not applied");
                }
                undone(format!("{why}; the change was undone"))
            }
            Ok((Reverted::Superseded, _)) => ControlError::NotApplied(format!(
                "{why}; a later change to it stands, so it was not undone"
            )),
            Err(e) => ControlError::NotApplied(format!("{why}; undoing it failed: {e}")),
        }
    }

    /// Checks that the caller of a `method` request may change tenant
    /// `tenant` ([`authz::Caller::may_change_tenant`]); counts a refusal.
    /// `caller` is what [`caller`] took from the request.
    ///
    /// # Errors
    /// [`ControlError::PermissionDenied`] naming the caller, the method and
    /// the tenant.
    fn may_change_tenant(
        &self,
        caller: Option<&authz::Caller>,
        method: &'static str,
        tenant: &str,
    ) -> Result<()> {
        may_change_tenant(&self.ctl.telemetry, caller, method, tenant)
    }

    /// Runs a read-only request: counts it and maps its error.
    async fn read<T>(
        &self,
        method: &'static str,
        f: impl Future<Output = Result<T>>,
    ) -> Result<Response<T>, Status> {
        let r = f.await;
        self.finish(method, r, false)
    }

    /// Runs a mutating request: counts it, logs its outcome and maps its error.
    async fn write<T>(
        &self,
        method: &'static str,
        f: impl Future<Output = Result<T>>,
    ) -> Result<Response<T>, Status> {
        let r = f.await;
        self.finish(method, r, true)
    }

    fn finish<T>(
        &self,
        method: &'static str,
        r: Result<T>,
        mutating: bool,
    ) -> Result<Response<T>, Status> {
        let code = r.as_ref().map_or_else(ControlError::code, |_| Code::Ok);
        self.ctl.telemetry.observe_request(method, code);
        match &r {
            Ok(_) if mutating => tracing::info!(method, "applied"),
            Ok(_) => {}
            Err(ControlError::Storage(e)) => {
                tracing::error!(method, error = %e, "refused: state not persisted")
            }
            Err(ControlError::NotApplied(e)) => {
                tracing::error!(method, error = %e, "stored but not applied")
            }
            Err(ControlError::CannotApply(e)) => {
                tracing::warn!(method, error = %e, "not applied; undone")
            }
            Err(ControlError::Rejected(e)) => {
                tracing::error!(method, error = %e, "rejected by the data plane; undone")
            }
            Err(e) => tracing::debug!(method, error = %e, "refused"),
        }
        r.map(Response::new).map_err(Status::from)
    }
}

#[cfg(test)]
impl Api {
    /// An API over `state` with `ports` and `limits`, its storage calls
    /// waiting for `storage_applied` and its tenant calls for
    /// `switch_applied`.
    pub(crate) fn for_tests(
        state: StateHandle,
        ports: PortRegistry,
        limits: Limits,
        storage_applied: Option<Applied>,
        switch_applied: Option<Applied>,
    ) -> Api {
        Api::new(Arc::new(Control {
            state,
            ports,
            telemetry: Arc::new(Telemetry::default()),
            limits,
            backing: Arc::new(testing::backing()),
            facts: ServiceFacts::default(),
            storage_applied,
            switch_applied,
            store_probe: None,
            served: None,
            host_nqn: testing::HOST_NQN.into(),
        }))
    }

    /// An API over `state` with the test limits, whose storage is checked
    /// against `probe` (a stand-in for clusters and remote targets) and
    /// whose namespaces' serving state is `served`'s.
    pub(crate) fn with_probe_for_tests(
        state: StateHandle,
        probe: Arc<dyn StoreProbe>,
        served: Option<Arc<dyn ServedNamespaces>>,
    ) -> Api {
        Api::new(Arc::new(Control {
            state,
            ports: Default::default(),
            telemetry: Arc::new(Telemetry::default()),
            limits: testing::LIMITS,
            backing: Arc::new(testing::backing()),
            facts: ServiceFacts::default(),
            storage_applied: None,
            switch_applied: None,
            store_probe: Some(probe),
            served,
            host_nqn: testing::HOST_NQN.into(),
        }))
    }
}

/// Stand-ins for the consumers of the state, for the services' tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::{Arc, Mutex};

    use tokio::sync::watch;

    use crate::apply::{self, Applied, Problem};
    use crate::model::State;
    use crate::state::Limits;
    use crate::store::{Published, StateHandle};

    /// Limits for tests: 1 MiB of RAM namespaces.
    pub(crate) const LIMITS: Limits = Limits::with_ram(1 << 20);

    /// The service's host NQN in tests.
    pub(crate) const HOST_NQN: &str =
        "nqn.2014-08.org.nvmexpress:uuid:0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

    /// The backing policy of tests: files anywhere (without symbolic
    /// links), any device under `/dev`.
    pub(crate) fn backing() -> dpu_os::backing::BackingPolicy {
        dpu_os::backing::BackingPolicy::new(vec!["/".into()], vec!["/dev/*".into()], None)
            .expect("a valid policy")
    }

    /// A consumer called `name` following `state`, which applies nothing
    /// while `paused` holds true and then applies the newest state:
    /// `judge` answers what it cannot serve of it, or why it refuses it
    /// and the resources at fault. Answers its [`Applied`] and the newest
    /// state it applied.
    pub(crate) fn follower(
        name: &'static str,
        state: &StateHandle,
        judge: impl Fn(&State) -> Result<Vec<Problem>, (String, Vec<String>)> + Send + 'static,
        mut paused: watch::Receiver<bool>,
    ) -> (Applied, Arc<Mutex<Published>>) {
        let (reporter, applied) = apply::follow(name, state.published().generation);
        let seen = Arc::new(Mutex::new(state.published()));
        let mut rx = state.subscribe();
        let last = seen.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                if paused.wait_for(|p| !*p).await.is_err() {
                    return;
                }
                let p = rx.borrow_and_update().clone();
                match judge(&p.state) {
                    Ok(problems) => {
                        *last.lock().unwrap() = p.clone();
                        reporter.report(p.generation, problems);
                    }
                    Err((why, at_fault)) => reporter.refuse(p.generation, why, at_fault),
                }
            }
        });
        (applied, seen)
    }

    /// Waits until the store has published `generation`.
    pub(crate) async fn stored(state: &StateHandle, generation: u64) {
        let mut rx = state.subscribe();
        rx.wait_for(|p| p.generation >= generation).await.unwrap();
    }
}

/// The caller of `req`, as [`authz::AuthzLayer`] let it through; `None`
/// when the API is served without that layer (then every call is the
/// service's own, as in process tests).
fn caller<T>(req: &Request<T>) -> Option<Arc<authz::Caller>> {
    req.extensions().get::<Arc<authz::Caller>>().cloned()
}

/// [`Api::may_change_tenant`], for changes that learn their tenant from
/// the state (inside the change, before it changes anything).
fn may_change_tenant(
    telemetry: &Telemetry,
    caller: Option<&authz::Caller>,
    method: &'static str,
    tenant: &str,
) -> Result<()> {
    let Some(caller) = caller else {
        return Ok(());
    };
    caller.may_change_tenant(method, tenant).inspect_err(|e| {
        tracing::debug!(client = %caller.label, method, "refused: {e}");
        telemetry.observe_denied(method, &caller.label);
    })
}

/// Default and maximum page sizes of a list call.
#[derive(Debug, Clone, Copy)]
struct PageLimits {
    default: usize,
    max: usize,
}

const PAGES: PageLimits = PageLimits {
    default: 100,
    max: 1000,
};

/// Cuts one page out of `items`, which must come in ascending key order,
/// and converts the page's items with `convert` (only those: the items
/// before the page are skipped by key, so paging through a long list
/// converts each item once). The page token is the hex-encoded key of the
/// last item returned, so a listing stays correct while items are added
/// or removed between pages.
fn paginate<K: AsRef<str>, T, U>(
    items: impl Iterator<Item = (K, T)>,
    page_size: i32,
    token: &str,
    limits: PageLimits,
    mut convert: impl FnMut(T) -> U,
) -> Result<(Vec<U>, String)> {
    let size = match usize::try_from(page_size) {
        Err(_) => return Err(ControlError::invalid("page_size", "must not be negative")),
        Ok(0) => limits.default,
        Ok(n) => n.min(limits.max),
    };
    let after = if token.is_empty() {
        None
    } else {
        Some(decode_token(token).ok_or_else(|| {
            ControlError::invalid("page_token", "not a token this service issued")
        })?)
    };
    let mut out = Vec::new();
    let mut last = String::new();
    let mut more = false;
    for (key, item) in items {
        let key = key.as_ref();
        if after.as_ref().is_some_and(|a| key <= a.as_str()) {
            continue;
        }
        if out.len() == size {
            more = true;
            break;
        }
        key.clone_into(&mut last);
        out.push(convert(item));
    }
    let next = if more {
        encode_token(&last)
    } else {
        String::new()
    };
    Ok((out, next))
}

fn encode_token(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_token(t: &str) -> Option<String> {
    if !t.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..t.len())
        .step_by(2)
        .map(|i| t.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    String::from_utf8(bytes?).ok()
}

/// A sort key for numbers that orders like the numbers themselves.
fn num_key(n: u32) -> String {
    format!("{n:010}")
}

/// Checks an update mask against the allowed paths and returns the paths.
fn mask_paths(
    mask: Option<&dpu_proto::pbjson_types::FieldMask>,
    allowed: &[&str],
) -> Result<Vec<String>> {
    let paths = mask.map(|m| m.paths.clone()).unwrap_or_default();
    if paths.is_empty() {
        return Err(ControlError::invalid(
            "update_mask",
            format!("name at least one field to update: {}", allowed.join(", ")),
        ));
    }
    for p in &paths {
        if !allowed.contains(&p.as_str()) {
            return Err(ControlError::invalid(
                "update_mask",
                format!(
                    "{p:?} cannot be updated; updatable fields: {}",
                    allowed.join(", ")
                ),
            ));
        }
    }
    Ok(paths)
}

/// Takes a required sub-message out of a request.
fn required<T>(field: &str, v: Option<T>) -> Result<T> {
    v.ok_or_else(|| ControlError::invalid(field, "is required"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: u32) -> impl Iterator<Item = (String, u32)> {
        (1..=n).map(|i| (num_key(i), i))
    }

    #[test]
    fn pages_cover_everything_once() {
        let mut token = String::new();
        let mut seen = vec![];
        loop {
            let (page, next) = paginate(keys(25), 10, &token, PAGES, |i| i).unwrap();
            assert!(page.len() <= 10);
            seen.extend(page);
            if next.is_empty() {
                break;
            }
            token = next;
        }
        assert_eq!(seen, (1..=25).collect::<Vec<_>>());
    }

    #[test]
    fn exact_multiple_has_no_empty_trailing_page() {
        let (page, next) = paginate(keys(10), 10, "", PAGES, |i| i).unwrap();
        assert_eq!(page.len(), 10);
        assert!(next.is_empty());
    }

    #[test]
    fn bad_page_arguments() {
        assert!(paginate(keys(1), -1, "", PAGES, |i| i).is_err());
        assert!(paginate(keys(1), 0, "zz", PAGES, |i| i).is_err());
        assert!(paginate(keys(1), 0, "abc", PAGES, |i| i).is_err());
        let (page, _) = paginate(keys(5000), 100_000, "", PAGES, |i| i).unwrap();
        assert_eq!(page.len(), PAGES.max);
    }

    /// Paging through a list converts each item once, not every item
    /// before each page again.
    #[test]
    fn only_the_page_is_converted() {
        let mut converted = 0;
        let mut token = String::new();
        loop {
            let (_, next) = paginate(keys(5000), 100, &token, PAGES, |i| {
                converted += 1;
                i
            })
            .unwrap();
            if next.is_empty() {
                break;
            }
            token = next;
        }
        assert_eq!(converted, 5000);
    }
}
