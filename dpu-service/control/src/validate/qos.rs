//! QoS limits of namespaces and hosts: each limit within its bound.

use dpu_proto::v1 as pb;

use crate::error::{ControlError, Result};
use crate::model::QosLimits;

/// Largest IOPS limit (`iops`, `read_iops`, `write_iops`): a billion
/// commands a second, beyond what any target serves.
pub const MAX_QOS_IOPS: u64 = 1_000_000_000;
/// Largest bandwidth limit in bytes per second (`bandwidth`,
/// `read_bandwidth`, `write_bandwidth`): a terabyte a second.
pub const MAX_QOS_BANDWIDTH: u64 = 1_000_000_000_000;

/// Converts the limits of a request (`field` is the message's field
/// name); unset is no limit. Each limit is checked against its bound,
/// and an error names the limit.
pub fn qos(field: &str, q: Option<&pb::QosLimits>) -> Result<QosLimits> {
    let Some(q) = q else {
        return Ok(QosLimits::default());
    };
    let limits = [
        ("iops", q.iops, MAX_QOS_IOPS, "commands"),
        ("read_iops", q.read_iops, MAX_QOS_IOPS, "commands"),
        ("write_iops", q.write_iops, MAX_QOS_IOPS, "commands"),
        ("bandwidth", q.bandwidth, MAX_QOS_BANDWIDTH, "bytes"),
        (
            "read_bandwidth",
            q.read_bandwidth,
            MAX_QOS_BANDWIDTH,
            "bytes",
        ),
        (
            "write_bandwidth",
            q.write_bandwidth,
            MAX_QOS_BANDWIDTH,
            "bytes",
        ),
    ];
    for (name, v, max, unit) in limits {
        if v > max {
            return Err(ControlError::invalid(
                format!("{field}.{name}"),
                format!("{v} is more than {max} {unit} per second (0 is no limit)"),
            ));
        }
    }
    Ok(QosLimits {
        iops: q.iops,
        read_iops: q.read_iops,
        write_iops: q.write_iops,
        bandwidth: q.bandwidth,
        read_bandwidth: q.read_bandwidth,
        write_bandwidth: q.write_bandwidth,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::tests::field_of;

    #[test]
    fn limits_are_bounded_and_named() {
        assert_eq!(qos("qos", None).unwrap(), QosLimits::default());
        let most = pb::QosLimits {
            iops: MAX_QOS_IOPS,
            read_iops: 1,
            write_iops: 2,
            bandwidth: MAX_QOS_BANDWIDTH,
            read_bandwidth: 3,
            write_bandwidth: 4,
        };
        assert_eq!(
            qos("qos", Some(&most)).unwrap(),
            QosLimits {
                iops: MAX_QOS_IOPS,
                read_iops: 1,
                write_iops: 2,
                bandwidth: MAX_QOS_BANDWIDTH,
                read_bandwidth: 3,
                write_bandwidth: 4,
            }
        );
        for (over, field) in [
            (
                pb::QosLimits {
                    write_iops: MAX_QOS_IOPS + 1,
                    ..Default::default()
                },
                "namespace.qos.write_iops",
            ),
            (
                pb::QosLimits {
                    read_bandwidth: u64::MAX,
                    ..Default::default()
                },
                "namespace.qos.read_bandwidth",
            ),
        ] {
            let e = qos("namespace.qos", Some(&over)).unwrap_err();
            assert!(e.to_string().contains("per second"), "{e}");
            assert_eq!(field_of(e), field);
        }
    }
}
