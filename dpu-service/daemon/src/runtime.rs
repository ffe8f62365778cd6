//! The control plane's async runtime, and where its threads run.
//!
//! The data plane's workers (`dataplane.worker_cpus`) and the NVMe/TCP
//! target's I/O queues (`storage.io_cpus`) have CPUs of their own. Every
//! thread of the runtime, worker or blocking (gRPC, metrics, applying
//! changes), and the main thread that drives it keep to the CPUs this
//! process may use less those, so that
//! serving a call never takes time from a packet or an I/O. When nothing
//! would be left, the threads run anywhere, and the log says so.
//!
//! Threads inherit the CPUs of the thread that starts them, and the data
//! plane (EAL, unpinned workers) and the NVMe/TCP transport (which checks
//! `io_cpus` against the CPUs it may use) take theirs from it; so they are
//! started from a thread of their own with every CPU of the process
//! ([`start_on`]).

use std::io;

use anyhow::{anyhow, Result};
use tokio::runtime::Runtime;

use crate::config::Config;

/// The CPUs the control plane's threads keep to: `all` (the CPUs this
/// process may use) less the NVMe/TCP I/O queues' and, with a data plane,
/// its workers'. `None` when there is nothing to keep off, or when nothing
/// would be left (logged).
pub fn control_cpus(all: &[usize], config: &Config) -> Option<Vec<usize>> {
    let workers: &[usize] = if config.dataplane_driver().is_some() {
        &config.dataplane.worker_cpus
    } else {
        &[]
    };
    let io = &config.storage.io_cpus;
    if io.is_empty() && workers.is_empty() {
        return None;
    }
    let left: Vec<usize> = all
        .iter()
        .copied()
        .filter(|c| !io.contains(c) && !workers.contains(c))
        .collect();
    if left.is_empty() {
        tracing::warn!(
            io_cpus = ?io,
            worker_cpus = ?workers,
            "the NVMe/TCP I/O queues and the data-plane workers take every CPU; the control plane's threads run anywhere"
        );
        return None;
    }
    tracing::info!(cpus = ?left, "control-plane threads keep off the I/O and worker CPUs");
    Some(left)
}

/// A multi-threaded runtime whose threads are named `name` and, with
/// `cpus`, each keep to those CPUs from their start.
///
/// # Errors
/// If the runtime cannot start its threads.
pub fn build(name: &str, cpus: Option<Vec<usize>>) -> io::Result<Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.enable_all().thread_name(name);
    if let Some(cpus) = cpus {
        b.on_thread_start(move || keep_to(&cpus));
    }
    b.build()
}

/// Keeps the calling thread, a control-plane one, to `cpus`; logs why
/// not if it cannot.
pub fn keep_to(cpus: &[usize]) {
    if let Err(e) = dpu_os::affinity::set_current_thread_cpus(cpus) {
        tracing::warn!(error = %e, "a control-plane thread cannot keep off the I/O and worker CPUs");
    }
}

/// Runs `f` on a thread of its own that may use `all` (the CPUs of the
/// process; `None` leaves it the caller's), for starting what takes its
/// threads' CPUs from the thread that starts it.
///
/// # Errors
/// If the thread cannot be started, or `f` panics.
pub async fn start_on<T: Send + 'static>(
    all: Option<Vec<usize>>,
    what: &'static str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("dpu-start".into())
        .spawn(move || {
            if let Some(all) = all {
                if let Err(e) = dpu_os::affinity::set_current_thread_cpus(&all) {
                    tracing::warn!(error = %e, "{what} starts on the control plane's CPUs");
                }
            }
            let _ = tx.send(f());
        })
        .map_err(|e| anyhow!("{what}: starting its thread: {e}"))?;
    rx.await
        .map_err(|_| anyhow!("{what}: the start thread failed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPUs each thread of this process named `name` may run on.
    fn cpus_of(name: &str) -> Vec<Vec<usize>> {
        dpu_os::affinity::thread_cpus_by_name(name).expect("thread CPU lists")
    }

    fn config(text: &str) -> Config {
        toml::from_str(text).expect("config parses")
    }

    /// Builds the runtime as the daemon does for `config`, makes it start
    /// worker and blocking threads, and answers the CPUs of each; also
    /// what a start thread it launches may use.
    fn placed(name: &'static str, all: &[usize], config: &Config) -> (Vec<Vec<usize>>, Vec<usize>) {
        let rt = build(name, control_cpus(all, config)).unwrap();
        let (seen, started) = rt.block_on(async {
            let all = all.to_vec();
            tokio::spawn(async move {
                tokio::task::spawn_blocking(|| ()).await.unwrap();
                let seen = cpus_of(name);
                let started = start_on(Some(all), "test", || {
                    dpu_os::affinity::current_thread_cpus().unwrap()
                });
                (seen, started.await.unwrap())
            })
            .await
            .unwrap()
        });
        rt.shutdown_background();
        (seen, started)
    }

    /// With I/O CPUs, or data-plane workers pinned, every thread of the
    /// runtime keeps to the other CPUs, while what starts the data plane
    /// and the target still gets them all; with nothing left, or nothing to
    /// keep off, the threads run anywhere.
    #[test]
    fn runtime_threads_keep_off_the_io_and_worker_cpus() {
        let all = dpu_os::affinity::current_thread_cpus().unwrap();
        let [first, .., last] = all[..] else {
            eprintln!("skipped: this process may use one CPU only");
            return;
        };
        let rest: Vec<usize> = all.iter().copied().filter(|&c| c != last).collect();
        let dataplane = "[[ports]]\nid = \"p0\"\ndriver = \"kernel\"\n";
        for (name, text, want) in [
            ("ctl-io", format!("[storage]\nio_cpus = [{last}]\n"), &rest),
            (
                "ctl-worker",
                format!("{dataplane}[dataplane]\nworker_cpus = [{last}]\n"),
                &rest,
            ),
            // Without a data plane its workers' CPUs are free.
            (
                "ctl-no-dp",
                format!("[dataplane]\nworker_cpus = [{last}]\n"),
                &all,
            ),
            ("ctl-free", String::new(), &all),
        ] {
            let (seen, started) = placed(name, &all, &config(&text));
            assert!(
                seen.len() >= 2,
                "{name}: worker and blocking threads: {seen:?}"
            );
            assert!(
                seen.iter().all(|c| c == want),
                "{name}: {seen:?}, want {want:?}"
            );
            assert_eq!(started, all, "{name}: the start thread may use every CPU");
        }
        if all.len() == 2 {
            let text = format!(
                "{dataplane}[dataplane]\nworker_cpus = [{first}]\n[storage]\nio_cpus = [{last}]\n"
            );
            let (seen, _) = placed("ctl-none-left", &all, &config(&text));
            assert!(seen.iter().all(|c| *c == all), "nothing left: {seen:?}");
        }
    }
}
