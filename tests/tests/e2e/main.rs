//! The end-to-end tests, one module a subject, in one test binary: each
//! starts the real `dpu-service` (and, where it needs them, `dpuctl`,
//! `nvmf-perf`, network namespaces, a kernel guest or SPDK's initiator)
//! and drives it the way users do. One binary links the workspace once;
//! the shared helpers live in the `dpu_e2e` library (`tests/src`).

mod api_flood;
mod api_limits;
mod authz;
mod backing_paths;
mod dev_config;
mod dpuctl;
mod dpuctl_escapes;
mod durability_tls;
mod endpoint_kernel;
mod endpoint_memif;
mod endpoint_serving;
mod endpoint_tls;
mod library;
mod nvme_auth;
mod nvme_auth_flood;
mod nvme_host;
mod nvme_hostile;
mod nvme_kernel;
mod nvme_qos;
mod nvme_rbd;
mod nvme_remote;
mod nvme_restart;
mod nvme_tls;
mod offload;
mod opi;
mod opi_bridge;
mod opi_kernel;
mod opi_remote;
mod opi_volume;
mod remote_garbage;
mod remote_kernel;
mod spdk_interop;
mod state_enospc;
mod storage_clusters;
mod storage_endpoint;
mod storage_seed;
mod switch;
mod switch_restart;
mod volumes;

/// Tests that hold thousands of sockets run one at a time: this process's
/// descriptors, and the machine's, are shared by the tests running at once.
pub(crate) fn floods() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}
