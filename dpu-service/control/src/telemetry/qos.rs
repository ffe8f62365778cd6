//! The QoS limiters' figures on `/metrics`: the limits in force and what
//! they held back, by subsystem and namespace or host, and by tenant for
//! the limits on all of a tenant's storage.

use std::collections::BTreeMap;
use std::time::Duration;

use dpu_nvmeof::qos::{QosScope, QosStat};

use super::Metrics;
use crate::model::QosLimits;

/// What one QoS limiter of a subsystem reports: the limits in force and
/// the commands they held back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosCounters {
    /// The limits in force (none, for one whose limits were cleared but
    /// that held commands back before).
    pub limits: QosLimits,
    /// Commands that waited for the limiter.
    pub throttled_commands: u64,
    /// The time they waited, in all.
    pub throttled_time: Duration,
}

impl From<&QosStat> for QosCounters {
    fn from(s: &QosStat) -> Self {
        QosCounters {
            limits: s.limits,
            throttled_commands: s.throttled_commands,
            throttled_time: s.throttled_time,
        }
    }
}

impl QosCounters {
    /// Adds what another target's limiter of the same scope counted (a
    /// subsystem that moved between targets): its waits add up, and its
    /// limits count if these have none.
    pub fn add(&mut self, other: &QosCounters) {
        if self.limits.is_none() {
            self.limits = other.limits;
        }
        self.throttled_commands = self
            .throttled_commands
            .saturating_add(other.throttled_commands);
        self.throttled_time = self.throttled_time.saturating_add(other.throttled_time);
    }
}

/// The limiters by ID and scope: a subsystem's ID with
/// [`QosScope::Namespace`] and [`QosScope::Host`], a tenant's ID with
/// [`QosScope::Target`] (the limits on all of its storage endpoints).
pub type QosByScope = BTreeMap<(String, QosScope), QosCounters>;

/// The labels naming a limiter: `subsystem` and `nsid` for a namespace,
/// `subsystem` and `host` for a host, `tenant` alone for a tenant's
/// storage.
fn scope_labels(id: &str, scope: &QosScope) -> Vec<(&'static str, String)> {
    match scope {
        QosScope::Namespace(nsid) => {
            vec![("subsystem", id.to_string()), ("nsid", nsid.to_string())]
        }
        QosScope::Host(host) => vec![("subsystem", id.to_string()), ("host", host.clone())],
        QosScope::Target => vec![("tenant", id.to_string())],
    }
}

/// `labels` and `more` as [`Metrics::sample`] takes them.
fn with<'a>(
    labels: &'a [(&'static str, String)],
    more: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    labels
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .chain(more.iter().copied())
        .collect()
}

/// Renders the limits set (one sample per limit that is not 0) and the
/// commands held back and their waits, of every limiter in `qos`.
pub(super) fn render(m: &mut Metrics, qos: &QosByScope) {
    let name = "dpu_nvmf_qos_limit";
    m.family(
        name,
        "gauge",
        "QoS limit in force on a namespace (all hosts together), on a host (all its controllers and namespaces of the subsystem together) or on a tenant's storage (label tenant: everything its storage endpoints serve together), per second: commands for the iops limits, bytes for the bandwidth limits. Limits not set have no sample.",
    );
    for ((id, scope), c) in qos {
        let labels = scope_labels(id, scope);
        let q = c.limits;
        for (limit, v) in [
            ("iops", q.iops),
            ("read_iops", q.read_iops),
            ("write_iops", q.write_iops),
            ("bandwidth", q.bandwidth),
            ("read_bandwidth", q.read_bandwidth),
            ("write_bandwidth", q.write_bandwidth),
        ] {
            if v > 0 {
                m.sample(name, &with(&labels, &[("limit", limit)]), v);
            }
        }
    }
    let name = "dpu_nvmf_qos_throttled_commands_total";
    m.family(
        name,
        "counter",
        "I/O commands a QoS limit of the namespace, host or tenant's storage held back before they started.",
    );
    for ((id, scope), c) in qos {
        let labels = scope_labels(id, scope);
        m.sample(name, &with(&labels, &[]), c.throttled_commands);
    }
    let name = "dpu_nvmf_qos_throttled_seconds_total";
    m.family(
        name,
        "counter",
        "Time the commands a QoS limit of the namespace, host or tenant's storage held back waited, in all.",
    );
    for ((id, scope), c) in qos {
        let labels = scope_labels(id, scope);
        m.sample(name, &with(&labels, &[]), c.throttled_time.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_waits_by_scope() {
        let mut qos = QosByScope::new();
        qos.insert(
            ("vol".into(), QosScope::Namespace(1)),
            QosCounters {
                limits: QosLimits {
                    iops: 1_000,
                    read_bandwidth: 1 << 20,
                    ..QosLimits::default()
                },
                throttled_commands: 7,
                throttled_time: Duration::from_millis(1_500),
            },
        );
        let mut host = QosCounters {
            throttled_commands: 2,
            throttled_time: Duration::from_millis(250),
            ..QosCounters::default()
        };
        host.add(&QosCounters {
            limits: QosLimits {
                write_iops: 10,
                ..QosLimits::default()
            },
            throttled_commands: 1,
            throttled_time: Duration::from_millis(250),
        });
        qos.insert(("vol".into(), QosScope::Host("nqn.h\"1".into())), host);
        qos.insert(
            ("red".into(), QosScope::Target),
            QosCounters {
                limits: QosLimits {
                    bandwidth: 100 << 20,
                    ..QosLimits::default()
                },
                throttled_commands: 9,
                throttled_time: Duration::from_millis(2_000),
            },
        );
        let mut m = Metrics::default();
        render(&mut m, &qos);
        let want = "\
dpu_nvmf_qos_limit{tenant=\"red\",limit=\"bandwidth\"} 104857600
dpu_nvmf_qos_limit{subsystem=\"vol\",nsid=\"1\",limit=\"iops\"} 1000
dpu_nvmf_qos_limit{subsystem=\"vol\",nsid=\"1\",limit=\"read_bandwidth\"} 1048576
dpu_nvmf_qos_limit{subsystem=\"vol\",host=\"nqn.h\\\"1\",limit=\"write_iops\"} 10
# HELP dpu_nvmf_qos_throttled_commands_total I/O commands a QoS limit of the namespace, host or tenant's storage held back before they started.
# TYPE dpu_nvmf_qos_throttled_commands_total counter
dpu_nvmf_qos_throttled_commands_total{tenant=\"red\"} 9
dpu_nvmf_qos_throttled_commands_total{subsystem=\"vol\",nsid=\"1\"} 7
dpu_nvmf_qos_throttled_commands_total{subsystem=\"vol\",host=\"nqn.h\\\"1\"} 3
# HELP dpu_nvmf_qos_throttled_seconds_total Time the commands a QoS limit of the namespace, host or tenant's storage held back waited, in all.
# TYPE dpu_nvmf_qos_throttled_seconds_total counter
dpu_nvmf_qos_throttled_seconds_total{tenant=\"red\"} 2
dpu_nvmf_qos_throttled_seconds_total{subsystem=\"vol\",nsid=\"1\"} 1.5
dpu_nvmf_qos_throttled_seconds_total{subsystem=\"vol\",host=\"nqn.h\\\"1\"} 0.5
";
        assert!(m.out.ends_with(want), "{}", m.out);
        assert!(m.out.starts_with("# HELP dpu_nvmf_qos_limit "), "{}", m.out);
    }
}
