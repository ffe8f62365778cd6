//! QoS limits on the command line (`--iops`, `--read-bandwidth`, ...: the
//! flags of `namespace set-qos`, `namespace create`, `subsystem
//! set-host-qos` and `tenant set-storage-qos`) and in tables.

use clap::Args;
use dpu_client::{parse_size, pb};

/// The limits of a namespace, a host or a tenant's storage, per second. A flag not given is
/// no limit, so a command with none clears every limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct QosArgs {
    /// Most I/O commands of every kind a second.
    #[arg(long, value_name = "N")]
    pub iops: Option<u64>,
    /// Most read commands a second.
    #[arg(long, value_name = "N")]
    pub read_iops: Option<u64>,
    /// Most write commands a second.
    #[arg(long, value_name = "N")]
    pub write_iops: Option<u64>,
    /// Most bytes read and written a second (e.g. 200M; K, M, G, T are
    /// powers of 1024).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub bandwidth: Option<u64>,
    /// Most bytes read a second (e.g. 200M).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub read_bandwidth: Option<u64>,
    /// Most bytes written a second (e.g. 200M).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub write_bandwidth: Option<u64>,
}

impl QosArgs {
    /// The limits the flags give; those not given are 0, no limit.
    pub fn limits(&self) -> pb::QosLimits {
        pb::QosLimits {
            iops: self.iops.unwrap_or(0),
            read_iops: self.read_iops.unwrap_or(0),
            write_iops: self.write_iops.unwrap_or(0),
            bandwidth: self.bandwidth.unwrap_or(0),
            read_bandwidth: self.read_bandwidth.unwrap_or(0),
            write_bandwidth: self.write_bandwidth.unwrap_or(0),
        }
    }

    /// The limits to create a namespace with: `None` when no flag is
    /// given.
    pub fn on_create(&self) -> Option<pb::QosLimits> {
        (*self != QosArgs::default()).then(|| self.limits())
    }
}

/// A byte rate: a whole number of KiB, MiB, GiB or TiB when it is one
/// (`200MiB/s`), else bytes (`1000B/s`).
fn byte_rate(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut u) = (n, 0);
    while v >= 1024 && v.is_multiple_of(1024) && u + 1 < UNITS.len() {
        v /= 1024;
        u += 1;
    }
    format!("{v}{}/s", UNITS[u])
}

/// Limits as the flags that set them, `iops=1000,read-bandwidth=200MiB/s`;
/// `-` for none.
pub fn text(q: Option<&pb::QosLimits>) -> String {
    let Some(q) = q else {
        return "-".into();
    };
    let mut parts = Vec::new();
    for (name, v) in [
        ("iops", q.iops),
        ("read-iops", q.read_iops),
        ("write-iops", q.write_iops),
    ] {
        if v > 0 {
            parts.push(format!("{name}={v}"));
        }
    }
    for (name, v) in [
        ("bandwidth", q.bandwidth),
        ("read-bandwidth", q.read_bandwidth),
        ("write-bandwidth", q.write_bandwidth),
    ] {
        if v > 0 {
            parts.push(format!("{name}={}", byte_rate(v)));
        }
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(",")
    }
}

/// A subsystem's hosts with limits, `HOST[iops=1000] HOST[...]`; `-` for
/// none.
pub fn hosts_text(hosts: &[pb::HostQos]) -> String {
    if hosts.is_empty() {
        return "-".into();
    }
    hosts
        .iter()
        .map(|h| format!("{}[{}]", h.host_nqn, text(h.qos.as_ref())))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_not_given_are_no_limit() {
        let none = QosArgs::default();
        assert_eq!(none.limits(), pb::QosLimits::default());
        assert_eq!(none.on_create(), None);
        let some = QosArgs {
            iops: Some(1_000),
            write_bandwidth: Some(50 << 20),
            ..QosArgs::default()
        };
        let want = pb::QosLimits {
            iops: 1_000,
            write_bandwidth: 50 << 20,
            ..Default::default()
        };
        assert_eq!(some.limits(), want);
        assert_eq!(some.on_create(), Some(want));
    }

    #[test]
    fn limits_show_as_their_flags() {
        let q = pb::QosLimits {
            iops: 1_000,
            read_iops: 10,
            write_iops: 20,
            bandwidth: 1 << 30,
            read_bandwidth: 200 << 20,
            write_bandwidth: 1_000,
        };
        assert_eq!(
            text(Some(&q)),
            "iops=1000,read-iops=10,write-iops=20,bandwidth=1GiB/s,\
             read-bandwidth=200MiB/s,write-bandwidth=1000B/s"
        );
        assert_eq!(text(None), "-");
        assert_eq!(text(Some(&pb::QosLimits::default())), "-");
        let hosts = [
            pb::HostQos {
                host_nqn: "nqn.h1".into(),
                qos: Some(pb::QosLimits {
                    write_iops: 5,
                    ..Default::default()
                }),
            },
            pb::HostQos {
                host_nqn: "nqn.h2".into(),
                qos: Some(pb::QosLimits {
                    read_bandwidth: 4096,
                    ..Default::default()
                }),
            },
        ];
        assert_eq!(
            hosts_text(&hosts),
            "nqn.h1[write-iops=5] nqn.h2[read-bandwidth=4KiB/s]"
        );
        assert_eq!(hosts_text(&[]), "-");
    }
}
