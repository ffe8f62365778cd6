//! Remote-namespace validation: the paths, NQNs, NSID, DH-HMAC-CHAP
//! secret, timeouts and queue depth of a namespace backed by a namespace
//! of a remote NVMe/TCP target.
//!
//! Syntax and ranges only: whether the remote answers, and with that
//! namespace, is for the service's [`crate::service::StoreProbe`] to find
//! out. The defaults are the target's own
//! ([`dpu_nvmeof::target::RemoteNamespace::new`]), so they live in one
//! place. No error quotes a secret.

use std::net::{IpAddr, SocketAddr};

use dpu_nvmeof::target::MAX_REMOTE_PATHS;
use dpu_proto::v1 as pb;

use super::{DISCOVERY_NQN, MAX_NQN_LEN};
use crate::error::{ControlError, Result};
use crate::model::{RemoteNamespace, SecretText};

/// Largest I/O or connect bound of a remote namespace, milliseconds.
pub const MAX_REMOTE_TIMEOUT_MS: u32 = 300_000;
/// Fewest commands in flight to a remote namespace (its I/O queue then
/// has three entries: one is always empty).
pub const MIN_REMOTE_QUEUE_DEPTH: u32 = 2;
/// Most commands in flight to a remote namespace.
pub const MAX_REMOTE_QUEUE_DEPTH: u32 = 1024;

/// Converts the remote backend of a namespace to create (`field` names
/// it in the request, e.g. `namespace.remote`); a host NQN left empty is
/// `default_host_nqn`, and other fields of 0 take the target's defaults.
///
/// # Errors
/// INVALID_ARGUMENT naming the field: no path or more than
/// [`MAX_REMOTE_PATHS`], one that is not `ADDR:PORT` or not an address
/// to connect to, one given twice; an NQN that is not one
/// ([`remote_nqn`]), or the discovery subsystem's; NSID 0 or 0xffffffff;
/// a secret that does not parse; a timeout or queue depth out of range.
pub fn remote(
    field: &str,
    r: &pb::RemoteBackend,
    default_host_nqn: &str,
) -> Result<RemoteNamespace> {
    let f = |s: &str| format!("{field}.{s}");
    let paths = paths(&f("paths"), &r.paths)?;
    remote_nqn(&f("subnqn"), &r.subnqn)?;
    if r.subnqn == DISCOVERY_NQN {
        return Err(ControlError::invalid(
            f("subnqn"),
            "the discovery subsystem has no namespaces",
        ));
    }
    if r.nsid == 0 || r.nsid == u32::MAX {
        return Err(ControlError::invalid(
            f("nsid"),
            format!("{} is not a namespace ID (1 to 4294967294)", r.nsid),
        ));
    }
    let host_nqn = if r.host_nqn.is_empty() {
        default_host_nqn
    } else {
        &r.host_nqn
    };
    remote_nqn(&f("host_nqn"), host_nqn)?;
    let dhchap_secret = if r.dhchap_secret.is_empty() {
        None
    } else {
        let (text, _) = SecretText::parse(&r.dhchap_secret)
            .map_err(|e| ControlError::invalid(f("dhchap_secret"), e.to_string()))?;
        Some(text)
    };
    let defaults =
        dpu_nvmeof::target::RemoteNamespace::new(paths.clone(), &r.subnqn, r.nsid, host_nqn);
    let ms = |d: std::time::Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
    let out = RemoteNamespace {
        paths,
        subnqn: r.subnqn.clone(),
        nsid: r.nsid,
        host_nqn: host_nqn.to_string(),
        dhchap_secret,
        io_timeout_ms: timeout_ms(&f("io_timeout_ms"), r.io_timeout_ms)?
            .unwrap_or(ms(defaults.io_timeout)),
        connect_timeout_ms: timeout_ms(&f("connect_timeout_ms"), r.connect_timeout_ms)?
            .unwrap_or(ms(defaults.connect_timeout)),
        queue_depth: match r.queue_depth {
            0 => defaults.queue_depth,
            q => u16::try_from(q)
                .ok()
                .filter(|q| (MIN_REMOTE_QUEUE_DEPTH..=MAX_REMOTE_QUEUE_DEPTH).contains(&u32::from(*q)))
                .ok_or_else(|| {
                    ControlError::invalid(
                        f("queue_depth"),
                        format!(
                            "{q} is out of range ({MIN_REMOTE_QUEUE_DEPTH} to {MAX_REMOTE_QUEUE_DEPTH})"
                        ),
                    )
                })?,
        },
    };
    // What the target itself requires of what it opens: the checks above
    // name the field, this one holds.
    out.spec()
        .validate()
        .map_err(|why| ControlError::invalid(field, why))?;
    Ok(out)
}

/// Checks an NQN a remote target uses or allows: 1 to 223 printable
/// ASCII characters without spaces. Not the NQN format that subsystems
/// of this service must have ([`super::nqn`]): a remote's subsystems and
/// allow lists are its own (Linux's target takes any name, `testnqn`
/// too), and must be named as the remote knows them.
pub fn remote_nqn(field: &str, s: &str) -> Result<()> {
    if s.is_empty() || s.len() > MAX_NQN_LEN || !s.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(ControlError::invalid(
            field,
            format!(
                "{:?} is not an NQN: 1 to {MAX_NQN_LEN} printable ASCII characters without spaces",
                s.chars().take(64).collect::<String>()
            ),
        ));
    }
    Ok(())
}

/// Parses the paths of a remote namespace (`field` names the list).
fn paths(field: &str, given: &[String]) -> Result<Vec<SocketAddr>> {
    if given.is_empty() {
        return Err(ControlError::invalid(
            field,
            format!("give 1 to {MAX_REMOTE_PATHS} addresses ADDR:PORT"),
        ));
    }
    if given.len() > MAX_REMOTE_PATHS {
        return Err(ControlError::invalid(
            field,
            format!(
                "{} addresses, at most {MAX_REMOTE_PATHS} allowed",
                given.len()
            ),
        ));
    }
    let mut out: Vec<SocketAddr> = Vec::with_capacity(given.len());
    for (i, p) in given.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let a: SocketAddr = p.trim().parse().map_err(|_| {
            ControlError::invalid(
                &at,
                format!(
                    "{:?} is not ADDR:PORT (an IPv6 address in brackets: [ADDR]:PORT)",
                    p.chars().take(64).collect::<String>()
                ),
            )
        })?;
        let broadcast = matches!(a.ip(), IpAddr::V4(v4) if v4.is_broadcast());
        if a.port() == 0 || a.ip().is_unspecified() || a.ip().is_multicast() || broadcast {
            return Err(ControlError::invalid(
                at,
                format!("{a} is not an address to connect to"),
            ));
        }
        if out.contains(&a) {
            return Err(ControlError::invalid(at, format!("{a} is given twice")));
        }
        out.push(a);
    }
    Ok(out)
}

/// A timeout in milliseconds; 0 means the default (`None`).
fn timeout_ms(field: &str, ms: u32) -> Result<Option<u32>> {
    match ms {
        0 => Ok(None),
        1..=MAX_REMOTE_TIMEOUT_MS => Ok(Some(ms)),
        _ => Err(ControlError::invalid(
            field,
            format!("{ms} ms is out of range (1 to {MAX_REMOTE_TIMEOUT_MS})"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::tests::field_of;

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";
    const SECRET: &str = "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:";

    fn given() -> pb::RemoteBackend {
        pb::RemoteBackend {
            paths: vec!["10.0.0.1:4420".into(), "[fd00::2]:4421".into()],
            subnqn: "nqn.2024-01.io.example:far".into(),
            nsid: 7,
            ..Default::default()
        }
    }

    /// Zeros and empties take the defaults, the host NQN the service's;
    /// given values are kept.
    #[test]
    fn defaults_and_given_values() {
        let r = remote("namespace.remote", &given(), HOST).unwrap();
        assert_eq!(r.paths.len(), 2);
        assert_eq!(r.paths[1].to_string(), "[fd00::2]:4421");
        assert_eq!(
            (r.subnqn.as_str(), r.nsid),
            ("nqn.2024-01.io.example:far", 7)
        );
        assert_eq!(r.host_nqn, HOST);
        assert_eq!(r.dhchap_secret, None);
        assert_eq!(
            (r.io_timeout_ms, r.connect_timeout_ms, r.queue_depth),
            (10_000, 3_000, 128)
        );
        let r = remote(
            "namespace.remote",
            &pb::RemoteBackend {
                host_nqn: "nqn.2024-01.io.example:me".into(),
                dhchap_secret: format!(" {SECRET}\n"),
                io_timeout_ms: 300_000,
                connect_timeout_ms: 1,
                queue_depth: 2,
                ..given()
            },
            HOST,
        )
        .unwrap();
        assert_eq!(r.host_nqn, "nqn.2024-01.io.example:me");
        assert_eq!(r.dhchap_secret.unwrap().expose(), SECRET);
        assert_eq!(
            (r.io_timeout_ms, r.connect_timeout_ms, r.queue_depth),
            (300_000, 1, 2)
        );
        // The remote's names are its own: Linux's target takes any.
        let r = remote(
            "namespace.remote",
            &pb::RemoteBackend {
                subnqn: "testnqn".into(),
                host_nqn: "host1".into(),
                ..given()
            },
            HOST,
        )
        .unwrap();
        assert_eq!(
            (r.subnqn.as_str(), r.host_nqn.as_str()),
            ("testnqn", "host1")
        );
    }

    /// Each refusal names its field and never quotes the secret.
    #[test]
    fn each_refusal_names_its_field() {
        let refused = |r: pb::RemoteBackend| {
            let e = remote("namespace.remote", &r, HOST).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            let shown = e.to_string();
            assert!(!shown.contains(&SECRET[10..40]), "{shown}");
            (field_of(e), shown)
        };
        let paths = |p: &[&str]| pb::RemoteBackend {
            paths: p.iter().map(|s| s.to_string()).collect(),
            ..given()
        };
        for (r, field, why) in [
            (paths(&[]), "namespace.remote.paths", "give 1 to 4"),
            (
                paths(&[
                    "10.0.0.1:1",
                    "10.0.0.1:2",
                    "10.0.0.1:3",
                    "10.0.0.1:4",
                    "10.0.0.1:5",
                ]),
                "namespace.remote.paths",
                "5 addresses, at most 4",
            ),
            (
                paths(&["10.0.0.1"]),
                "namespace.remote.paths[0]",
                "not ADDR:PORT",
            ),
            (
                paths(&["fd00::1:4420"]),
                "namespace.remote.paths[0]",
                "in brackets",
            ),
            (
                paths(&["far.example:4420"]),
                "namespace.remote.paths[0]",
                "not ADDR:PORT",
            ),
            (
                paths(&["10.0.0.1:4420", "0.0.0.0:4420"]),
                "namespace.remote.paths[1]",
                "not an address to connect to",
            ),
            (
                paths(&["10.0.0.1:0"]),
                "namespace.remote.paths[0]",
                "not an address",
            ),
            (
                paths(&["[ff02::1]:4420"]),
                "namespace.remote.paths[0]",
                "not an address",
            ),
            (
                paths(&["10.0.0.1:4420", "10.0.0.2:4420", "10.0.0.1:4420"]),
                "namespace.remote.paths[2]",
                "10.0.0.1:4420 is given twice",
            ),
            (
                pb::RemoteBackend {
                    subnqn: String::new(),
                    ..given()
                },
                "namespace.remote.subnqn",
                "\"\" is not an NQN",
            ),
            (
                pb::RemoteBackend {
                    subnqn: "my target".into(),
                    ..given()
                },
                "namespace.remote.subnqn",
                "without spaces",
            ),
            (
                pb::RemoteBackend {
                    subnqn: "n".repeat(224),
                    ..given()
                },
                "namespace.remote.subnqn",
                "1 to 223",
            ),
            (
                pb::RemoteBackend {
                    subnqn: DISCOVERY_NQN.into(),
                    ..given()
                },
                "namespace.remote.subnqn",
                "discovery",
            ),
            (
                pb::RemoteBackend { nsid: 0, ..given() },
                "namespace.remote.nsid",
                "0 is not a namespace ID",
            ),
            (
                pb::RemoteBackend {
                    nsid: u32::MAX,
                    ..given()
                },
                "namespace.remote.nsid",
                "not a namespace ID",
            ),
            (
                pb::RemoteBackend {
                    host_nqn: "host 1".into(),
                    ..given()
                },
                "namespace.remote.host_nqn",
                "not an NQN",
            ),
            (
                pb::RemoteBackend {
                    dhchap_secret: SECRET.replace("HMnzFi", "AAAAAA"),
                    ..given()
                },
                "namespace.remote.dhchap_secret",
                "CRC",
            ),
            (
                pb::RemoteBackend {
                    dhchap_secret: "secret".into(),
                    ..given()
                },
                "namespace.remote.dhchap_secret",
                "",
            ),
            (
                pb::RemoteBackend {
                    io_timeout_ms: 300_001,
                    ..given()
                },
                "namespace.remote.io_timeout_ms",
                "out of range",
            ),
            (
                pb::RemoteBackend {
                    connect_timeout_ms: u32::MAX,
                    ..given()
                },
                "namespace.remote.connect_timeout_ms",
                "out of range",
            ),
            (
                pb::RemoteBackend {
                    queue_depth: 1,
                    ..given()
                },
                "namespace.remote.queue_depth",
                "1 is out of range (2 to 1024)",
            ),
            (
                pb::RemoteBackend {
                    queue_depth: 1025,
                    ..given()
                },
                "namespace.remote.queue_depth",
                "out of range",
            ),
            (
                pb::RemoteBackend {
                    queue_depth: 70_000,
                    ..given()
                },
                "namespace.remote.queue_depth",
                "out of range",
            ),
        ] {
            let (f, shown) = refused(r);
            assert_eq!(f, field, "{shown}");
            assert!(shown.contains(why), "{why}: {shown}");
        }
        // The service's default host NQN is checked like a given one.
        let e = remote("namespace.remote", &given(), "").unwrap_err();
        assert_eq!(field_of(e), "namespace.remote.host_nqn");
    }
}
