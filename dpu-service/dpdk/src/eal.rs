//! The Environment Abstraction Layer: started once per process.

use std::ffi::{c_char, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use crate::error::DpdkError;

/// Settings for `rte_eal_init`, turned into its argument vector by
/// [`EalConfig::args`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EalConfig {
    /// Cores to run on (`-l`), e.g. "0-3"; `None` lets EAL use all.
    pub lcores: Option<String>,
    /// Main lcore (`--main-lcore`).
    pub main_lcore: Option<u32>,
    /// Virtual devices (`--vdev`), e.g. "net_ring0", "net_tap0,iface=pf0vf0".
    pub vdevs: Vec<String>,
    /// PCI (or other bus) devices to use (`-a`), e.g. "0000:03:00.0,dv_flow_en=1".
    pub allow: Vec<String>,
    /// Do not scan the PCI bus (`--no-pci`).
    pub no_pci: bool,
    /// Use anonymous memory instead of hugepages (`--no-huge`).
    pub no_huge: bool,
    /// Memory to reserve in MiB (`-m`).
    pub memory_mb: Option<u32>,
    /// Prefix of EAL's runtime files, so several instances can coexist (`--file-prefix`).
    pub file_prefix: Option<String>,
    /// Extra PMD plugins or plugin directories (`-d`).
    pub pmd_paths: Vec<PathBuf>,
    /// EAL log level (`--log-level`), e.g. "lib.eal:notice" or "5".
    pub log_level: Option<String>,
    /// Anything else, passed through as is.
    pub extra: Vec<String>,
}

impl EalConfig {
    /// The argument vector for `rte_eal_init`, program name first.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec!["dpu-service".to_string()];
        let mut push = |k: &str, v: &str| {
            a.push(k.to_string());
            a.push(v.to_string());
        };
        if let Some(l) = &self.lcores {
            push("-l", l);
        }
        if let Some(m) = self.main_lcore {
            push("--main-lcore", &m.to_string());
        }
        for v in &self.vdevs {
            push("--vdev", v);
        }
        for d in &self.allow {
            push("-a", d);
        }
        if let Some(m) = self.memory_mb {
            push("-m", &m.to_string());
        }
        if let Some(p) = &self.file_prefix {
            push("--file-prefix", p);
        }
        for d in &self.pmd_paths {
            push("-d", &d.display().to_string());
        }
        if let Some(l) = &self.log_level {
            push("--log-level", l);
        }
        if self.no_pci {
            a.push("--no-pci".into());
        }
        if self.no_huge {
            a.push("--no-huge".into());
        }
        a.extend(self.extra.iter().cloned());
        a
    }
}

enum State {
    Uninit,
    Running {
        inner: Weak<EalInner>,
        args: Vec<String>,
    },
    Gone,
}

static STATE: Mutex<State> = Mutex::new(State::Uninit);

#[derive(Debug)]
struct EalInner;

impl Drop for EalInner {
    fn drop(&mut self) {
        // SAFETY: the last handle is gone, so no mempool, port or queue
        // (each holds an Eal) is alive; EAL was initialised (this value is
        // only created after rte_eal_init succeeded) and is cleaned up once.
        unsafe { dpdk_sys::rte_eal_cleanup() };
        if let Ok(mut s) = STATE.lock() {
            *s = State::Gone;
        }
    }
}

/// A handle on the initialised EAL. Clones share it; EAL is cleaned up
/// when the last handle (including those inside mempools and ports) drops.
#[derive(Debug, Clone)]
pub struct Eal {
    _inner: Arc<EalInner>,
}

impl Eal {
    /// Initialises EAL, or returns the running instance if it was started
    /// with the same arguments.
    ///
    /// EAL pins the thread that initialises it to the main lcore, so this
    /// runs `rte_eal_init` on a short-lived thread of its own: the caller's
    /// CPU affinity (and that of threads it spawns later) stays as it was.
    ///
    /// # Errors
    /// [`DpdkError::AlreadyInitialised`] if EAL runs with other arguments,
    /// [`DpdkError::EalGone`] after a cleanup, [`DpdkError::EalInit`] if
    /// DPDK refuses the arguments.
    pub fn init(config: &EalConfig) -> Result<Eal, DpdkError> {
        let args = config.args();
        let mut state = STATE.lock().map_err(|_| DpdkError::AlreadyInitialised)?;
        match &*state {
            State::Running {
                inner,
                args: running,
            } => {
                return match inner.upgrade() {
                    Some(inner) if *running == args => Ok(Eal { _inner: inner }),
                    Some(_) => Err(DpdkError::AlreadyInitialised),
                    None => Err(DpdkError::EalGone),
                }
            }
            State::Gone => return Err(DpdkError::EalGone),
            State::Uninit => {}
        }
        let c_args: Vec<CString> = args
            .iter()
            .map(|a| {
                CString::new(a.as_str())
                    .map_err(|_| DpdkError::InvalidArgument(format!("{a:?} contains NUL")))
            })
            .collect::<Result<_, _>>()?;
        let joined = args.join(" ");
        let rc = std::thread::spawn(move || {
            // EAL may keep pointers into argv: the strings live for the process.
            let leaked: &'static mut [CString] = Box::leak(c_args.into_boxed_slice());
            let mut argv: Vec<*mut c_char> =
                leaked.iter_mut().map(|c| c.as_ptr().cast_mut()).collect();
            let argc = i32::try_from(argv.len()).unwrap_or(i32::MAX);
            // SAFETY: argv holds argc valid NUL-terminated strings that live
            // for the rest of the process; EAL is not initialised yet (checked
            // under the STATE lock, which is held until this thread ends).
            let rc = unsafe { dpdk_sys::rte_eal_init(argc, argv.as_mut_ptr()) };
            let err = if rc < 0 {
                Some(crate::last_error())
            } else {
                None
            };
            std::mem::forget(argv);
            (rc, err)
        })
        .join()
        .map_err(|_| DpdkError::InvalidArgument("the EAL init thread panicked".into()))?;
        if let (_, Some((code, message))) = rc {
            *state = State::Gone;
            return Err(DpdkError::EalInit {
                code,
                message,
                args: joined,
            });
        }
        let inner = Arc::new(EalInner);
        *state = State::Running {
            inner: Arc::downgrade(&inner),
            args,
        };
        Ok(Eal { _inner: inner })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_are_built_in_order() {
        let c = EalConfig {
            lcores: Some("0-1".into()),
            vdevs: vec!["net_ring0".into(), "net_null0".into()],
            no_huge: true,
            no_pci: true,
            memory_mb: Some(256),
            file_prefix: Some("t".into()),
            ..Default::default()
        };
        assert_eq!(
            c.args(),
            [
                "dpu-service",
                "-l",
                "0-1",
                "--vdev",
                "net_ring0",
                "--vdev",
                "net_null0",
                "-m",
                "256",
                "--file-prefix",
                "t",
                "--no-pci",
                "--no-huge"
            ]
        );
    }
}

/// Registers the calling thread with EAL for as long as the guard lives,
/// giving it an lcore ID: mempool per-lcore caches then serve its buffer
/// allocations and frees instead of the shared ring.
#[derive(Debug)]
pub struct ThreadRegistration {
    _eal: Eal,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Eal {
    /// Registers the calling (non-EAL) thread; see [`ThreadRegistration`].
    ///
    /// # Errors
    /// [`DpdkError::EalInit`] if EAL has no free lcore ID left.
    pub fn register_thread(&self) -> Result<ThreadRegistration, DpdkError> {
        // SAFETY: EAL is initialised (self proves it); registering the
        // calling thread has no other precondition.
        let rc = unsafe { dpdk_sys::rte_thread_register() };
        if rc != 0 {
            let (code, message) = crate::last_error();
            return Err(DpdkError::EalInit {
                code,
                message,
                args: "rte_thread_register".into(),
            });
        }
        Ok(ThreadRegistration {
            _eal: self.clone(),
            _not_send: std::marker::PhantomData,
        })
    }
}

impl Drop for ThreadRegistration {
    fn drop(&mut self) {
        // SAFETY: this thread registered itself (the guard is !Send, so this
        // runs on the same thread) and unregisters once.
        unsafe { dpdk_sys::rte_thread_unregister() };
    }
}

/// The calling thread's lcore ID, or `None` for a thread EAL does not know.
pub fn lcore_id() -> Option<u32> {
    // SAFETY: rte_lcore_id reads a thread-local variable.
    let id = unsafe { dpdk_sys::dpdk_shim_rte_lcore_id() };
    (id != u32::MAX).then_some(id)
}
