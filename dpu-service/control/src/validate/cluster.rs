//! Storage-cluster validation: monitor addresses, cephx users and keys,
//! timeouts, and the pool and image names of RBD namespaces.
//!
//! Syntax only: whether the monitors answer and the key is accepted is
//! for the service's [`crate::service::StoreProbe`] to find out. No error
//! quotes a key.

use std::net::{Ipv4Addr, Ipv6Addr};

use dpu_proto::v1 as pb;

use super::{id, name};
use crate::error::{ControlError, Result};
use crate::model::{CephKey, Cluster, Timestamp};

/// Most storage clusters the state holds.
pub const MAX_CLUSTERS: usize = 64;
/// Longest `mon_host`, in bytes.
pub const MAX_MON_HOST_LEN: usize = 1024;
/// Most monitor entries in `mon_host`.
pub const MAX_MONITORS: usize = 32;
/// Longest cephx user name, in bytes.
pub const MAX_USER_LEN: usize = 64;
/// Longest pool or image name, in bytes.
pub const MAX_RBD_NAME_LEN: usize = 255;
/// The I/O bound of a cluster created without one, seconds.
pub const DEFAULT_OP_TIMEOUT_SECS: u32 = 20;
/// The connect bound of a cluster created without one, seconds.
pub const DEFAULT_CONNECT_TIMEOUT_SECS: u32 = 10;
/// Largest I/O or connect bound, seconds.
pub const MAX_TIMEOUT_SECS: u32 = 300;

/// Bytes of a cephx key once decoded: type (2), creation time (8),
/// secret length (2), the AES-128 secret (16).
const CEPHX_KEY_BYTES: usize = 28;
/// Ceph's `CEPH_CRYPTO_AES`.
const CEPHX_AES: u16 = 1;

/// Parses a cluster name `clusters/{cluster}`.
pub fn cluster_name<'a>(field: &str, n: &'a str) -> Result<&'a str> {
    name(field, n, "clusters")
}

/// Converts a cluster to create (`field` is the message's field name)
/// with ID `cluster_id`; timeouts of 0 take their defaults.
pub fn cluster(field: &str, cluster_id: &str, c: &pb::Cluster) -> Result<Cluster> {
    let f = |s: &str| format!("{field}.{s}");
    id("cluster_id", cluster_id)?;
    mon_host(&f("mon_host"), &c.mon_host)?;
    ceph_user(&f("user"), &c.user)?;
    Ok(Cluster {
        id: cluster_id.to_string(),
        mon_host: c.mon_host.trim().to_string(),
        user: c.user.clone(),
        key: cephx_key(&f("key"), &c.key)?,
        op_timeout_secs: timeout(&f("op_timeout_secs"), c.op_timeout_secs)?
            .unwrap_or(DEFAULT_OP_TIMEOUT_SECS),
        connect_timeout_secs: timeout(&f("connect_timeout_secs"), c.connect_timeout_secs)?
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT_SECS),
        create_time: Timestamp::now(),
    })
}

/// Checks a timeout in seconds: `None` for 0 (the default), else
/// 1..=[`MAX_TIMEOUT_SECS`].
pub fn timeout(field: &str, secs: u32) -> Result<Option<u32>> {
    match secs {
        0 => Ok(None),
        1..=MAX_TIMEOUT_SECS => Ok(Some(secs)),
        _ => Err(ControlError::invalid(
            field,
            format!("{secs} seconds is out of range (1 to {MAX_TIMEOUT_SECS})"),
        )),
    }
}

/// Checks a cephx user name: 1..=64 characters of letters, digits, '_',
/// '-' and '.', without the `client.` prefix.
pub fn ceph_user(field: &str, user: &str) -> Result<()> {
    if let Some(bare) = user.strip_prefix("client.") {
        return Err(ControlError::invalid(
            field,
            format!("give the user without its \"client.\" prefix: {bare:?}"),
        ));
    }
    let ok = !user.is_empty()
        && user.len() <= MAX_USER_LEN
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ControlError::invalid(
            field,
            format!(
                "{:?} is not a cephx user: use 1 to {MAX_USER_LEN} letters, digits, '_', '-' and '.'",
                user.chars().take(80).collect::<String>()
            ),
        ))
    }
}

/// Checks a cephx key, the base64 text `ceph auth get-key` prints
/// (surrounding white space ignored); empty for none. Errors never quote
/// the key.
pub fn cephx_key(field: &str, key: &str) -> Result<Option<CephKey>> {
    let key = key.trim();
    if key.is_empty() {
        return Ok(None);
    }
    let bad = |why: String| {
        Err(ControlError::invalid(
            field,
            format!("not a cephx key: {why}"),
        ))
    };
    let Some(bytes) = base64_decode(key) else {
        return bad(format!(
            "{} characters that are not padded base64 (a key is 40, as `ceph auth get-key` prints it)",
            key.len()
        ));
    };
    if bytes.len() != CEPHX_KEY_BYTES {
        return bad(format!(
            "it decodes to {} bytes; a cephx key is {CEPHX_KEY_BYTES} (40 base64 characters, as \
             `ceph auth get-key` prints it)",
            bytes.len()
        ));
    }
    let kind = u16::from_le_bytes([bytes[0], bytes[1]]);
    let len = u16::from_le_bytes([bytes[10], bytes[11]]);
    if kind != CEPHX_AES || len != 16 {
        return bad(format!(
            "type {kind} with a {len}-byte secret; cephx keys are AES (type 1) with 16"
        ));
    }
    Ok(Some(CephKey::new(key)))
}

/// Decodes padded standard base64; `None` for anything else.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if b.is_empty() || !b.len().is_multiple_of(4) {
        return None;
    }
    let groups = b.len() / 4;
    let mut out = Vec::with_capacity(groups * 3);
    for (i, chunk) in b.chunks_exact(4).enumerate() {
        let mut v = 0u32;
        let mut pad = 0usize;
        for (j, &c) in chunk.iter().enumerate() {
            let d = match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'+' => 62,
                b'/' => 63,
                // Padding: only the last one or two of the last group.
                b'=' if i + 1 == groups && j >= 2 => {
                    pad += 1;
                    0
                }
                _ => return None,
            };
            if pad > 0 && c != b'=' {
                return None;
            }
            v = (v << 6) | u32::from(d);
        }
        out.extend_from_slice(&v.to_be_bytes()[1..4 - pad]);
    }
    Some(out)
}

/// Checks monitor addresses in Ceph's `mon_host` syntax: entries
/// separated by ',', ';' or spaces, each `HOST[:PORT]` (an IPv4 address,
/// an IPv6 address, in brackets when a port follows, or a DNS name),
/// optionally prefixed `v1:` or `v2:` and followed by `/NONCE`, or an
/// address vector `[v2:HOST:PORT,v1:HOST:PORT]`.
pub fn mon_host(field: &str, s: &str) -> Result<()> {
    let bad = |why: String| Err(ControlError::invalid(field, why));
    if s.trim().is_empty() {
        return bad("empty: give at least one monitor address, e.g. 10.0.0.1:6789".into());
    }
    if s.len() > MAX_MON_HOST_LEN {
        return bad(format!(
            "{} bytes, at most {MAX_MON_HOST_LEN} allowed",
            s.len()
        ));
    }
    if !s.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return bad("only printable ASCII is allowed".into());
    }
    let entries = split_outside_brackets(s, |c| matches!(c, ',' | ';' | ' '))
        .map_err(|why| ControlError::invalid(field, why))?;
    if entries.is_empty() {
        return bad("empty: give at least one monitor address, e.g. 10.0.0.1:6789".into());
    }
    if entries.len() > MAX_MONITORS {
        return bad(format!(
            "{} monitors, at most {MAX_MONITORS}",
            entries.len()
        ));
    }
    for e in entries {
        let checked = match e.strip_prefix('[') {
            Some(inner) if inner.starts_with("v1:") || inner.starts_with("v2:") => {
                address_vector(e)
            }
            _ => monitor(e),
        };
        checked.map_err(|why| ControlError::invalid(field, format!("{e:?}: {why}")))?;
    }
    Ok(())
}

/// The non-empty parts of `s` between separators that are not inside
/// brackets.
fn split_outside_brackets(s: &str, sep: impl Fn(char) -> bool) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0u32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '[' if depth >= 2 => return Err("brackets nested too deep".into()),
            '[' => depth += 1,
            ']' if depth == 0 => return Err(format!("']' without '[' at byte {i}")),
            ']' => depth -= 1,
            c if depth == 0 && sep(c) => {
                if start < i {
                    parts.push(&s[start..i]);
                }
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("'[' without ']'".into());
    }
    if start < s.len() {
        parts.push(&s[start..]);
    }
    Ok(parts)
}

/// `[v2:HOST:PORT,v1:HOST:PORT]`: each address of the vector with its
/// protocol.
fn address_vector(e: &str) -> Result<(), String> {
    let inner = e
        .strip_prefix('[')
        .and_then(|e| e.strip_suffix(']'))
        .ok_or("an address vector is [v2:HOST:PORT,v1:HOST:PORT]")?;
    let addrs = split_outside_brackets(inner, |c| c == ',')?;
    if addrs.is_empty() {
        return Err("an empty address vector".into());
    }
    for a in addrs {
        if !(a.starts_with("v1:") || a.starts_with("v2:")) {
            return Err(format!(
                "{a:?}: each address of a vector starts with v1: or v2:"
            ));
        }
        monitor(a)?;
    }
    Ok(())
}

/// `[v1:|v2:]HOST[:PORT][/NONCE]`.
fn monitor(a: &str) -> Result<(), String> {
    let a = a
        .strip_prefix("v1:")
        .or_else(|| a.strip_prefix("v2:"))
        .unwrap_or(a);
    let a = match a.rsplit_once('/') {
        Some((a, nonce)) if !nonce.is_empty() && nonce.bytes().all(|b| b.is_ascii_digit()) => a,
        Some(_) => return Err("a '/' is followed by a nonce, digits".into()),
        None => a,
    };
    let port = |p: &str| match p.parse::<u16>() {
        Ok(n) if n != 0 && !p.starts_with('+') => Ok(()),
        _ => Err(format!("port {p:?} is not in 1..=65535")),
    };
    if let Some(rest) = a.strip_prefix('[') {
        let (ip, after) = rest.split_once(']').ok_or("'[' without ']'")?;
        ip.parse::<Ipv6Addr>()
            .map_err(|_| format!("{ip:?} is not an IPv6 address"))?;
        return match after {
            "" => Ok(()),
            p => port(p.strip_prefix(':').ok_or("expected :PORT after ']'")?),
        };
    }
    if a.parse::<Ipv6Addr>().is_ok() {
        return Ok(());
    }
    let host = match a.split_once(':') {
        Some((h, p)) => {
            port(p)?;
            h
        }
        None => a,
    };
    if host.parse::<Ipv4Addr>().is_ok() || dns_name(host) {
        Ok(())
    } else {
        Err(format!(
            "{host:?} is not an IPv4 address, an IPv6 address in brackets or a DNS name"
        ))
    }
}

/// A DNS name: labels of letters, digits and '-' (not at either end),
/// 1..=63 bytes each, 253 in all, not all digits.
fn dns_name(h: &str) -> bool {
    let h = h.strip_suffix('.').unwrap_or(h);
    !h.is_empty()
        && h.len() <= 253
        && !h.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Checks the name of an RBD pool or image (`what`): 1..=255 bytes, none
/// of '/', '@' (they separate pool, image and snapshot in Ceph's own
/// syntax), NUL or other control characters.
pub fn rbd_name(field: &str, what: &str, s: &str) -> Result<()> {
    let bad = |why: String| Err(ControlError::invalid(field, why));
    if s.is_empty() {
        return bad(format!("an {what} name is required"));
    }
    if s.len() > MAX_RBD_NAME_LEN {
        return bad(format!(
            "{} bytes, at most {MAX_RBD_NAME_LEN} allowed",
            s.len()
        ));
    }
    if let Some(c) = s.chars().find(|c| matches!(c, '/' | '@') || c.is_control()) {
        return bad(format!(
            "{:?}: an {what} name may not hold {c:?}",
            s.chars().take(80).collect::<String>()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::tests::field_of;

    /// A cephx key as `ceph auth get-key` prints it.
    pub(crate) const KEY: &str = "AQCAmWZmQOIBABAAEBESExQVFhcYGRobHB0eHw==";

    fn message(mon_host: &str, user: &str, key: &str) -> pb::Cluster {
        pb::Cluster {
            mon_host: mon_host.into(),
            user: user.into(),
            key: key.into(),
            ..Default::default()
        }
    }

    #[test]
    fn clusters_take_their_defaults() {
        let c = cluster("cluster", "ceph1", &message(" 10.0.0.1:6789 ", "dpu", KEY)).unwrap();
        assert_eq!(c.mon_host, "10.0.0.1:6789");
        assert_eq!(c.key.as_ref().unwrap().expose(), KEY);
        assert_eq!((c.op_timeout_secs, c.connect_timeout_secs), (20, 10));
        let none = cluster("cluster", "ceph1", &message("mon1", "dpu", "")).unwrap();
        assert!(none.key.is_none(), "a cluster without cephx");
        assert_eq!(
            field_of(cluster("cluster", "Ceph", &message("mon1", "dpu", "")).unwrap_err()),
            "cluster_id"
        );
    }

    #[test]
    fn monitor_addresses() {
        for good in [
            "10.0.0.1:6789",
            "10.0.0.1:6789,10.0.0.2:6789",
            "10.0.0.1, 10.0.0.2 ;10.0.0.3",
            "[v2:10.0.0.1:3300,v1:10.0.0.1:6789]",
            "[v2:10.0.0.1:3300,v1:10.0.0.1:6789],[v2:10.0.0.2:3300/0,v1:10.0.0.2:6789/0]",
            "v2:10.0.0.1:3300",
            "[::1]:6789",
            "::1",
            "[v2:[fd00::1]:3300,v1:[fd00::1]:6789]",
            "mon1.example.org",
            "mon-a:6789",
        ] {
            mon_host("m", good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for (bad, why) in [
            ("", "empty"),
            (" , ", "empty"),
            ("10.0.0.1:0", "port \"0\""),
            ("10.0.0.1:99999", "port \"99999\""),
            ("10.0.0.1:x", "port \"x\""),
            ("[v2:10.0.0.1:3300", "without"),
            ("10.0.0.1]", "without"),
            ("[v2:10.0.0.1:3300,10.0.0.1:6789]", "v1: or v2:"),
            ("[fe80::zz]:6789", "IPv6"),
            ("mon_1", "DNS name"),
            ("-mon", "DNS name"),
            ("999.1.1.1", "DNS name"),
            ("10.0.0.1/x", "nonce"),
            ("mon\t1", "printable"),
        ] {
            let e = mon_host("cluster.mon_host", bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad:?}: {e}");
            assert_eq!(field_of(e), "cluster.mon_host");
        }
        let many = vec!["10.0.0.1"; MAX_MONITORS + 1].join(",");
        assert!(mon_host("m", &many)
            .unwrap_err()
            .to_string()
            .contains("33 monitors"));
        let long = format!("{}.example.org", "a".repeat(MAX_MON_HOST_LEN));
        assert!(mon_host("m", &long).is_err());
    }

    #[test]
    fn users() {
        for good in ["dpu", "admin", "rbd-user.1", "A_b"] {
            ceph_user("u", good).unwrap();
        }
        let e = ceph_user("cluster.user", "client.dpu").unwrap_err();
        assert!(
            e.to_string().contains("without its \"client.\" prefix"),
            "{e}"
        );
        for bad in ["", "dpu user", "dpu/x", "dpü", &"u".repeat(65)] {
            assert_eq!(
                field_of(ceph_user("cluster.user", bad).unwrap_err()),
                "cluster.user"
            );
        }
    }

    /// Keys are checked for what cephx takes, and no refusal quotes one.
    #[test]
    fn keys() {
        assert_eq!(
            cephx_key("k", &format!("{KEY}\n"))
                .unwrap()
                .unwrap()
                .expose(),
            KEY
        );
        assert!(cephx_key("k", "  ").unwrap().is_none());
        let refused = |k: &str| {
            let e = cephx_key("cluster.key", k).unwrap_err().to_string();
            assert!(e.starts_with("cluster.key: not a cephx key"), "{e}");
            assert!(!e.contains(&KEY[..12]), "the key is quoted: {e}");
            e
        };
        assert!(refused(&KEY[..39]).contains("base64"));
        assert!(refused(&KEY.replace('=', "A")).contains("decodes to 30 bytes"));
        assert!(refused(&format!("{}!", &KEY[..39])).contains("base64"));
        assert!(refused(&KEY.replacen('Q', "=", 1)).contains("base64"));
        // 28 bytes of another type, or another secret length.
        assert!(refused("AgCAmWZmQOIBABAAEBESExQVFhcYGRobHB0eHw==").contains("type 2"));
        assert!(refused("AQCAmWZmQOIBACAAEBESExQVFhcYGRobHB0eHw==").contains("32-byte secret"));
        assert_eq!(base64_decode("AAEC"), Some(vec![0, 1, 2]));
        assert_eq!(base64_decode("AAE="), Some(vec![0, 1]));
        assert_eq!(base64_decode("AA=="), Some(vec![0]));
        for bad in ["", "A", "A===", "AA=A", "AA==AAAA", "AA A"] {
            assert_eq!(base64_decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn timeouts() {
        assert_eq!(timeout("t", 0).unwrap(), None);
        assert_eq!(timeout("t", 300).unwrap(), Some(300));
        let e = timeout("cluster.op_timeout_secs", 301).unwrap_err();
        assert!(e.to_string().contains("1 to 300"), "{e}");
        assert_eq!(field_of(e), "cluster.op_timeout_secs");
        let mut m = message("mon1", "dpu", KEY);
        m.connect_timeout_secs = 1000;
        assert_eq!(
            field_of(cluster("cluster", "c", &m).unwrap_err()),
            "cluster.connect_timeout_secs"
        );
    }

    #[test]
    fn pool_and_image_names() {
        for good in ["rbd", "my pool", "vol.1_a-b", "ünïcode", &"i".repeat(255)] {
            rbd_name("n", "image", good).unwrap();
        }
        for bad in ["", "a/b", "img@snap", "a\0b", "a\nb", &"i".repeat(256)] {
            assert_eq!(
                field_of(rbd_name("namespace.rbd.image", "image", bad).unwrap_err()),
                "namespace.rbd.image"
            );
        }
    }
}
