//! What a [`TcpTransport`](super::TcpTransport) is configured with: where
//! its poll groups run and how many connections it admits.

use std::io;

/// How a [`TcpTransport`](super::TcpTransport) places its poll groups on
/// CPUs, and how many connections it admits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// The CPUs of the I/O poll groups: one group per entry, pinned to it.
    /// Each must be among the CPUs the process may use, once, and none in
    /// `avoid_cpus`. Empty (the default): [`TcpConfig::poll_groups`]
    /// groups, unpinned.
    pub io_cpus: Vec<usize>,
    /// CPUs other work of the process holds, such as the data plane's
    /// poll-mode workers: no thread of the transport runs there. The
    /// listeners, the admin group, and the I/O groups when `io_cpus` is
    /// empty keep to the allowed CPUs less `io_cpus` and these (anywhere,
    /// when that leaves none). None of them may be in `io_cpus`; CPUs
    /// outside the allowed set are ignored.
    pub avoid_cpus: Vec<usize>,
    /// I/O poll groups when `io_cpus` is empty; 0 (the default): one per
    /// CPU the groups may run on. Ignored when `io_cpus` is set.
    pub poll_groups: usize,
    /// Most connections open at once, handshaking or connected; the
    /// listeners close connections beyond it at once.
    pub max_connections: usize,
    /// Most connections open at once from one source address.
    pub max_connections_per_address: usize,
    /// How long a host may take no byte of the target's output before its
    /// connection is closed ([`WRITE_TIMEOUT`](super::WRITE_TIMEOUT) by
    /// default).
    pub write_timeout: std::time::Duration,
    /// Threads that run the Diffie-Hellman work of DH-HMAC-CHAP, off the
    /// poll groups (1 to [`MAX_THREADS`](crate::auth::pool::MAX_THREADS),
    /// default [`DEFAULT_THREADS`](crate::auth::pool::DEFAULT_THREADS)).
    /// They run where the listeners and the admin group do.
    pub auth_threads: usize,
    /// DH jobs that may wait for those threads (1 to
    /// [`MAX_QUEUE`](crate::auth::pool::MAX_QUEUE), default
    /// [`DEFAULT_QUEUE`](crate::auth::pool::DEFAULT_QUEUE)); an
    /// authentication that finds the queue full is refused.
    pub auth_queue: usize,
}

/// Default of [`TcpConfig::max_connections`]: dozens of hosts with a
/// controller of up to 128 queues each, or many more with fewer.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Default of [`TcpConfig::max_connections_per_address`]: a host with
/// several controllers of 128 queues each.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 512;

/// Most I/O poll groups [`TcpConfig::poll_groups`] may ask for.
pub const MAX_POLL_GROUPS: usize = 256;

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            io_cpus: Vec::new(),
            avoid_cpus: Vec::new(),
            poll_groups: 0,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            write_timeout: super::WRITE_TIMEOUT,
            auth_threads: crate::auth::pool::DEFAULT_THREADS,
            auth_queue: crate::auth::pool::DEFAULT_QUEUE,
        }
    }
}

/// Why a [`TcpConfig`] was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcpConfigError {
    /// A CPU of `io_cpus` is also in `avoid_cpus`.
    #[error("io_cpus[{index}]: CPU {cpu} is one the transport must keep off (held by other work)")]
    AvoidedCpu {
        /// Position in `io_cpus`.
        index: usize,
        /// The CPU.
        cpu: usize,
    },
    /// A CPU is listed twice in `io_cpus`.
    #[error("io_cpus[{index}]: CPU {cpu} is listed twice")]
    DuplicateCpu {
        /// Position of the second mention.
        index: usize,
        /// The CPU.
        cpu: usize,
    },
    /// A CPU of `io_cpus` is outside the set this process may run on
    /// (`sched_getaffinity`: the machine's CPUs, a container's cpuset,
    /// `taskset`).
    #[error("io_cpus[{index}]: CPU {cpu} is not among the CPUs this process may use ({allowed})")]
    CpuNotAllowed {
        /// Position in `io_cpus`.
        index: usize,
        /// The CPU.
        cpu: usize,
        /// The CPUs the process may use, as a list such as "0-3,6".
        allowed: String,
    },
    /// A limit is out of its range.
    #[error("{field}: {value} is out of range ({range})")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// Its value.
        value: usize,
        /// The values it may take.
        range: &'static str,
    },
    /// The CPUs this process may use could not be read.
    #[error("reading the CPUs this process may use: {0}")]
    Affinity(#[source] io::Error),
}

impl TcpConfig {
    /// Checks `io_cpus` against the CPUs this process may use (those of
    /// the calling thread, which are the process's until something pins
    /// it). Makes no system call when `io_cpus` and `avoid_cpus` are empty.
    ///
    /// # Errors
    /// A CPU listed twice, outside the allowed set or in `avoid_cpus`,
    /// naming it; or the allowed set could not be read.
    pub fn validate(&self) -> Result<(), TcpConfigError> {
        self.placement().map(drop)
    }

    /// Checks the counts: at least one connection in each limit, at most
    /// [`MAX_POLL_GROUPS`] poll groups.
    fn check_counts(&self) -> Result<(), TcpConfigError> {
        let out = |field, value, range| {
            Err(TcpConfigError::OutOfRange {
                field,
                value,
                range,
            })
        };
        if self.max_connections == 0 {
            return out("max_connections", 0, "at least 1");
        }
        if self.max_connections_per_address == 0 {
            return out("max_connections_per_address", 0, "at least 1");
        }
        if self.write_timeout.is_zero() {
            return out("write_timeout", 0, "at least 1 s");
        }
        if self.poll_groups > MAX_POLL_GROUPS {
            return out("poll_groups", self.poll_groups, "0 to 256");
        }
        if self.auth_threads == 0 || self.auth_threads > crate::auth::pool::MAX_THREADS {
            return out("auth_threads", self.auth_threads, "1 to 64");
        }
        if self.auth_queue == 0 || self.auth_queue > crate::auth::pool::MAX_QUEUE {
            return out("auth_queue", self.auth_queue, "1 to 65536");
        }
        Ok(())
    }

    /// The placement of the threads, checked against the allowed CPUs.
    pub(super) fn placement(&self) -> Result<Placement, TcpConfigError> {
        self.check_counts()?;
        if self.io_cpus.is_empty() && self.avoid_cpus.is_empty() {
            return Ok(Placement {
                config: self.clone(),
                others: Vec::new(),
            });
        }
        let allowed = dpu_os::affinity::current_thread_cpus().map_err(TcpConfigError::Affinity)?;
        self.check(&allowed)?;
        let others: Vec<usize> = allowed
            .iter()
            .copied()
            .filter(|c| !self.io_cpus.contains(c) && !self.avoid_cpus.contains(c))
            .collect();
        Ok(Placement {
            config: self.clone(),
            others,
        })
    }

    /// Checks `io_cpus` against `allowed`.
    fn check(&self, allowed: &[usize]) -> Result<(), TcpConfigError> {
        for (index, &cpu) in self.io_cpus.iter().enumerate() {
            if self.io_cpus[..index].contains(&cpu) {
                return Err(TcpConfigError::DuplicateCpu { index, cpu });
            }
            if self.avoid_cpus.contains(&cpu) {
                return Err(TcpConfigError::AvoidedCpu { index, cpu });
            }
            if !allowed.contains(&cpu) {
                return Err(TcpConfigError::CpuNotAllowed {
                    index,
                    cpu,
                    allowed: cpu_list(allowed),
                });
            }
        }
        Ok(())
    }
}

/// CPUs as Linux lists them: ascending, runs as ranges ("0-3,6").
pub(super) fn cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while let Some(&first) = sorted.get(i) {
        let mut last = first;
        while sorted.get(i + 1) == Some(&(last + 1)) {
            last += 1;
            i += 1;
        }
        i += 1;
        if !out.is_empty() {
            out.push(',');
        }
        if last == first {
            out.push_str(&first.to_string());
        } else {
            out.push_str(&format!("{first}-{last}"));
        }
    }
    out
}

/// Where threads run, resolved once when the transport starts.
#[derive(Debug, Default)]
pub(super) struct Placement {
    pub(super) config: TcpConfig,
    /// The allowed CPUs that are neither I/O CPUs nor avoided: the
    /// listeners' and (by inheritance) every connection's unless it is
    /// pinned as an I/O queue. Empty: leave those threads where they are.
    pub(super) others: Vec<usize>,
}

impl Placement {
    /// How many I/O poll groups run: one per I/O CPU, else as configured,
    /// else one per CPU the groups may use.
    pub(super) fn io_groups(&self) -> usize {
        let c = &self.config;
        if !c.io_cpus.is_empty() {
            return c.io_cpus.len();
        }
        if c.poll_groups > 0 {
            return c.poll_groups;
        }
        if !self.others.is_empty() {
            return self.others.len();
        }
        dpu_os::affinity::current_thread_cpus()
            .map(|a| a.len())
            .unwrap_or(1)
            .max(1)
    }

    /// Restricts the calling thread (a listener or the admin group) to
    /// the CPUs neither for I/O nor avoided.
    pub(super) fn keep_to_others(&self, what: &str) {
        if self.others.is_empty() {
            return;
        }
        if let Err(e) = dpu_os::affinity::set_current_thread_cpus(&self.others) {
            tracing::warn!(thread = what, error = %e, "cannot keep the thread off the NVMe/TCP I/O CPUs");
        }
    }

    /// Places the calling thread as I/O poll group `index`: pinned to its
    /// I/O CPU, or kept to the CPUs neither for I/O nor avoided.
    pub(super) fn place_io_group(&self, index: usize) {
        let Some(&cpu) = self.config.io_cpus.get(index) else {
            self.keep_to_others("poll group");
            return;
        };
        match dpu_os::affinity::pin_current_thread(cpu) {
            Ok(()) => tracing::debug!(group = index, cpu, "poll group pinned"),
            Err(e) => {
                tracing::warn!(group = index, cpu, error = %e, "cannot pin the poll group; it runs where it was")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(io_cpus: &[usize]) -> TcpConfig {
        TcpConfig {
            io_cpus: io_cpus.to_vec(),
            ..TcpConfig::default()
        }
    }

    #[test]
    fn one_io_group_per_io_cpu_else_as_configured_else_per_cpu() {
        assert_eq!(
            Placement {
                config: cfg(&[4, 2, 7]),
                others: vec![0, 1],
            }
            .io_groups(),
            3
        );
        let counted = |poll_groups, others: &[usize]| {
            Placement {
                config: TcpConfig {
                    poll_groups,
                    ..cfg(&[])
                },
                others: others.to_vec(),
            }
            .io_groups()
        };
        assert_eq!(counted(5, &[0, 1]), 5);
        assert_eq!(counted(0, &[0, 1, 3]), 3);
        let allowed = dpu_os::affinity::current_thread_cpus().unwrap();
        assert_eq!(counted(0, &[]), allowed.len());
    }

    #[test]
    fn io_cpus_outside_the_allowed_set_or_listed_twice_are_refused_by_name() {
        let allowed = [0, 1, 2, 3, 6];
        assert!(cfg(&[3, 6]).check(&allowed).is_ok());
        assert!(cfg(&[]).check(&[]).is_ok());
        let e = cfg(&[1, 5]).check(&allowed).unwrap_err();
        assert_eq!(
            e.to_string(),
            "io_cpus[1]: CPU 5 is not among the CPUs this process may use (0-3,6)"
        );
        let e = cfg(&[2, 3, 2]).check(&allowed).unwrap_err();
        assert_eq!(e.to_string(), "io_cpus[2]: CPU 2 is listed twice");
        let avoiding = TcpConfig {
            avoid_cpus: vec![1, 9],
            ..cfg(&[2, 1])
        };
        assert_eq!(
            avoiding.check(&allowed).unwrap_err().to_string(),
            "io_cpus[1]: CPU 1 is one the transport must keep off (held by other work)"
        );
        // Against the real affinity: no machine has this CPU.
        let e = cfg(&[100_000]).validate().unwrap_err();
        assert!(
            matches!(e, TcpConfigError::CpuNotAllowed { cpu: 100_000, .. }),
            "{e}"
        );
        assert!(
            super::super::TcpTransport::with_config(crate::Target::new(), &cfg(&[100_000]))
                .is_err()
        );
    }

    #[test]
    fn cpu_lists_read_like_linux_writes_them() {
        assert_eq!(cpu_list(&[]), "");
        assert_eq!(cpu_list(&[5]), "5");
        assert_eq!(cpu_list(&[3, 0, 1, 2, 6, 8, 9]), "0-3,6,8-9");
    }

    #[test]
    fn others_are_the_allowed_cpus_left_by_the_io_cpus() {
        let allowed = dpu_os::affinity::current_thread_cpus().unwrap();
        let &last = allowed.last().unwrap();
        let p = cfg(&[last]).placement().unwrap();
        assert_eq!(p.others, allowed[..allowed.len() - 1]);
        assert!(cfg(&[]).placement().unwrap().others.is_empty());
        // Avoided CPUs are left out too, with or without I/O CPUs; unknown
        // ones change nothing.
        let &first = allowed.first().unwrap();
        let avoid = |io: &[usize], avoid: &[usize]| {
            TcpConfig {
                avoid_cpus: avoid.to_vec(),
                ..cfg(io)
            }
            .placement()
            .unwrap()
            .others
        };
        let middle: Vec<usize> = allowed[1..allowed.len() - 1].to_vec();
        if allowed.len() > 1 {
            assert_eq!(avoid(&[last], &[first]), middle);
            assert_eq!(avoid(&[], &[first]), allowed[1..]);
        }
        assert_eq!(avoid(&[], &[100_000]), allowed);
        // Nothing left: threads stay where they are.
        assert!(avoid(&[], &allowed).is_empty());
    }
}
