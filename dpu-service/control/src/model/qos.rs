//! Quality of service: the limits of a namespace, of a host on a
//! subsystem and of a tenant's storage, as the state keeps them.
//!
//! The limits are the NVMe-oF target's own type,
//! [`dpu_nvmeof::qos::QosLimits`], so the state hands them to the target
//! as they are. That crate has no serde; the state file's form is defined
//! here, field by field, so that a limit the target adds is a compile
//! error here until it is given a name in the file, and a name in the file
//! never changes with the target's code. A limit of 0 is none and is left
//! out; a state written before QoS, or a limit it lacks, reads as none.

use std::collections::BTreeMap;

pub use dpu_nvmeof::qos::QosLimits;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// [`QosLimits`] as the state file writes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    #[serde(default, skip_serializing_if = "is_zero")]
    iops: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    read_iops: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    write_iops: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    bandwidth: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    read_bandwidth: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    write_bandwidth: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl From<QosLimits> for Stored {
    fn from(q: QosLimits) -> Self {
        // Destructured whole: a limit added to the target's type must be
        // named here.
        let QosLimits {
            iops,
            read_iops,
            write_iops,
            bandwidth,
            read_bandwidth,
            write_bandwidth,
        } = q;
        Stored {
            iops,
            read_iops,
            write_iops,
            bandwidth,
            read_bandwidth,
            write_bandwidth,
        }
    }
}

impl From<Stored> for QosLimits {
    fn from(s: Stored) -> Self {
        QosLimits {
            iops: s.iops,
            read_iops: s.read_iops,
            write_iops: s.write_iops,
            bandwidth: s.bandwidth,
            read_bandwidth: s.read_bandwidth,
            write_bandwidth: s.write_bandwidth,
        }
    }
}

/// `#[serde(with)]` for one set of [`QosLimits`]: a namespace's, a
/// tenant's storage's (and the journal's record of a change to it).
pub(crate) mod limits {
    use super::*;

    /// Writes `q` in the state file's form.
    pub fn serialize<S: Serializer>(q: &QosLimits, s: S) -> Result<S::Ok, S::Error> {
        Stored::from(*q).serialize(s)
    }

    /// Reads limits in the state file's form.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<QosLimits, D::Error> {
        Stored::deserialize(d).map(QosLimits::from)
    }
}

/// `#[serde(with)]` for a subsystem's [`QosLimits`] by host NQN.
pub(super) mod by_host {
    use super::*;

    /// Writes `m` in the state file's form.
    pub fn serialize<S: Serializer>(
        m: &BTreeMap<String, QosLimits>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_map(m.iter().map(|(h, q)| (h, Stored::from(*q))))
    }

    /// Reads limits by host NQN in the state file's form.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, QosLimits>, D::Error> {
        let m = BTreeMap::<String, Stored>::deserialize(d)?;
        Ok(m.into_iter().map(|(h, q)| (h, q.into())).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Holder {
        #[serde(default, skip_serializing_if = "QosLimits::is_none", with = "limits")]
        qos: QosLimits,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty", with = "by_host")]
        hosts: BTreeMap<String, QosLimits>,
    }

    /// Limits round-trip through the state file's JSON, zeros left out;
    /// a holder without limits writes none and reads back as none.
    #[test]
    fn limits_round_trip_and_none_is_left_out() {
        let q = QosLimits {
            iops: 1_000,
            write_bandwidth: 200 << 20,
            ..QosLimits::default()
        };
        let h = Holder {
            qos: q,
            hosts: [("nqn.2024-01.io.example:h".to_string(), q)].into(),
        };
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(
            json,
            r#"{"qos":{"iops":1000,"write_bandwidth":209715200},"hosts":{"nqn.2024-01.io.example:h":{"iops":1000,"write_bandwidth":209715200}}}"#
        );
        assert_eq!(serde_json::from_str::<Holder>(&json).unwrap(), h);
        let none = Holder {
            qos: QosLimits::default(),
            hosts: BTreeMap::new(),
        };
        assert_eq!(serde_json::to_string(&none).unwrap(), "{}");
        assert_eq!(serde_json::from_str::<Holder>("{}").unwrap(), none);
        assert!(serde_json::from_str::<Holder>(r#"{"qos":{"iosp":1}}"#).is_err());
    }
}
