//! The short text forms of a few `dpu.v1` messages and values (sizes,
//! RBD images, cephx keys in keyring files), shared by `dpuctl`'s flags
//! and the service's configuration file so both read the same syntax the
//! same way. They only split text: the service checks values (VLAN
//! ranges, MAC and prefix syntax, port IDs, pool and image names, the
//! key's encoding) as it checks any request.

use crate::v1 as pb;

/// `PORT[.VLAN][,mac=MAC][,ip=PREFIX]...`: a port attachment (`pf0vf0`,
/// `p0.100`, `ports/pf0vf0,mac=02:00:00:00:00:01,ip=10.0.0.1/32`), with
/// `mac=` and `ip=` repeatable for its anti-spoofing lists.
///
/// # Errors
/// A message naming what is not of that form.
pub fn port_attachment(s: &str) -> Result<pb::Attachment, String> {
    const FORM: &str = "expected PORT[.VLAN][,mac=MAC][,ip=PREFIX]";
    let mut parts = s.split(',');
    let head = parts.next().unwrap_or("");
    let (mut allowed_macs, mut allowed_source_prefixes) = (Vec::new(), Vec::new());
    for opt in parts {
        match opt.split_once('=') {
            Some(("mac", v)) => allowed_macs.push(v.to_string()),
            Some(("ip", v)) => allowed_source_prefixes.push(v.to_string()),
            _ => return Err(format!("{opt:?} is not mac=MAC or ip=PREFIX ({FORM})")),
        }
    }
    let (port, vlan_id) = match head.rsplit_once('.') {
        Some((port, v)) => (
            port,
            v.parse()
                .map_err(|_| format!("VLAN {v:?} is not a number (expected PORT[.VLAN])"))?,
        ),
        None => (head, 0),
    };
    if port.is_empty() || port == "ports/" {
        return Err(format!("{s:?}: expected PORT[.VLAN]"));
    }
    let port = if port.starts_with("ports/") {
        port.to_string()
    } else {
        format!("ports/{port}")
    };
    Ok(pb::Attachment {
        kind: Some(pb::attachment::Kind::Port(pb::PortAttachment {
            port,
            vlan_id,
            allowed_macs,
            allowed_source_prefixes,
        })),
    })
}

/// `PORT` or `FIRST-LAST`: an inclusive port range.
///
/// # Errors
/// If a bound is not a number.
pub fn port_range(s: &str) -> Result<pb::PortRange, String> {
    let num = |t: &str| {
        t.trim()
            .parse::<u32>()
            .map_err(|_| format!("{t:?} is not a port (expected PORT or FIRST-LAST)"))
    };
    let (first, last) = match s.split_once('-') {
        Some((a, b)) => (num(a)?, num(b)?),
        None => (num(s)?, num(s)?),
    };
    Ok(pb::PortRange { first, last })
}

/// An IP protocol: `tcp`, `udp`, `icmp`, `icmpv6` (or `ipv6-icmp`),
/// `sctp`, or a number.
///
/// # Errors
/// If it is neither a known name nor a number.
pub fn protocol(s: &str) -> Result<u32, String> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "icmp" => 1,
        "tcp" => 6,
        "udp" => 17,
        "icmpv6" | "ipv6-icmp" => 58,
        "sctp" => 132,
        n => n.parse().map_err(|_| {
            format!("{s:?} is not tcp, udp, icmp, icmpv6, sctp or a protocol number")
        })?,
    })
}

/// A rate: a number, an optional `k`/`M`/`G`/`T` prefix, then `pps`
/// (packets) or `bps` (bits) per second: `1000pps`, `2.5kpps`, `10Mbps`.
/// The burst is left 0 (the service's default).
///
/// # Errors
/// If it is not of that form, or less than one per second.
pub fn rate_limit(s: &str) -> Result<pb::RateLimit, String> {
    let bad = || format!("{s:?} is not a rate like 1000pps, 2.5kpps or 10Mbps");
    let (num, bits) = if let Some(n) = s.strip_suffix("pps") {
        (n, false)
    } else if let Some(n) = s.strip_suffix("bps") {
        (n, true)
    } else {
        return Err(bad());
    };
    let (num, scale) = match num.char_indices().last() {
        Some((i, 'k')) => (&num[..i], 1e3),
        Some((i, 'M')) => (&num[..i], 1e6),
        Some((i, 'G')) => (&num[..i], 1e9),
        Some((i, 'T')) => (&num[..i], 1e12),
        _ => (num, 1.0),
    };
    let v: f64 = num.parse().map_err(|_| bad())?;
    let v = v * scale;
    if !(1.0..1e15).contains(&v) {
        return Err(format!("{s:?}: the rate must be at least 1 per second"));
    }
    let v = v.round() as u64;
    Ok(if bits {
        pb::RateLimit {
            bits_per_second: v,
            ..Default::default()
        }
    } else {
        pb::RateLimit {
            packets_per_second: v,
            ..Default::default()
        }
    })
}

/// `N[UNIT]`: a size in bytes, with an optional unit K, M, G or T (powers
/// of 1024, also written KiB, MiB, GiB, TiB; any case, spaces allowed
/// before the unit): `4096`, `64M`, `1GiB`, `2 t`. `KB` and decimals are
/// refused (`KB` could mean 1000).
///
/// # Errors
/// A message naming what is not a size, an unknown unit, or a size past
/// 64 bits.
pub fn size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size"))?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KIB" => 10,
        "M" | "MIB" => 20,
        "G" | "GIB" => 30,
        "T" | "TIB" => 40,
        u => {
            return Err(format!(
                "unknown size unit {u:?} in {s:?} (use K, M, G, T or KiB, MiB, GiB, TiB)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// `POOL/IMAGE`: an RBD image (`rbd/vol1`), as the pool and the image's
/// name.
///
/// # Errors
/// If it is not two non-empty parts around one '/'.
pub fn rbd_image(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((pool, image)) if !pool.is_empty() && !image.is_empty() && !image.contains('/') => {
            Ok((pool.to_string(), image.to_string()))
        }
        _ => Err(format!("{s:?} is not POOL/IMAGE")),
    }
}

/// The cephx key of `client.{user}` in `text`, the content of a Ceph
/// keyring file (`[client.dpu]` then `key = AQ...==`, as `ceph auth
/// get client.dpu` prints it), or of a file holding only the key (as
/// `ceph auth get-key client.dpu` prints it). Comments (`#`, `;`) and
/// other sections and settings are skipped.
///
/// The key is not checked (the service checks its encoding), and no
/// error quotes the text: it holds secrets.
///
/// # Errors
/// A keyring without a `[client.{user}]` section (naming the sections it
/// has) or whose section has no key, an empty file, or one that is
/// neither a keyring nor a single key.
pub fn cephx_key(text: &str, user: &str) -> Result<String, String> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .collect();
    fn section(l: &str) -> Option<&str> {
        l.strip_prefix('[')
            .and_then(|l| l.strip_suffix(']'))
            .map(str::trim)
    }
    let setting = |l: &str| -> Option<(String, String)> {
        let (k, v) = l.split_once('=')?;
        Some((k.trim().to_string(), v.trim().to_string()))
    };
    if !lines.iter().any(|l| section(l).is_some()) {
        return match lines.as_slice() {
            [] => Err("empty: expected a keyring or a cephx key".into()),
            [one] => {
                let key = match setting(one) {
                    Some((k, v)) if k == "key" => v,
                    _ => one.to_string(),
                };
                if key.is_empty() || key.contains(char::is_whitespace) {
                    Err("not a cephx key: expected the key alone (as `ceph auth get-key` prints it) or a keyring".into())
                } else {
                    Ok(key)
                }
            }
            more => Err(format!(
                "{} lines without a [client.USER] section: expected a keyring or the key alone",
                more.len()
            )),
        };
    }
    let wanted = format!("client.{user}");
    let mut sections = Vec::new();
    let mut current: Option<&str> = None;
    let mut found = false;
    for l in &lines {
        if let Some(name) = section(l) {
            current = Some(name);
            found |= name == wanted;
            sections.push(name);
            continue;
        }
        if current != Some(wanted.as_str()) {
            continue;
        }
        match setting(l) {
            Some((k, v)) if k == "key" && !v.is_empty() => return Ok(v),
            Some((k, _)) if k == "key" => return Err(format!("[{wanted}] has an empty key")),
            _ => {}
        }
    }
    if found {
        return Err(format!("[{wanted}] has no key"));
    }
    let has: Vec<String> = sections
        .iter()
        .take(8)
        .map(|s| format!("[{}]", s.chars().take(64).collect::<String>()))
        .collect();
    Err(format!(
        "no [{wanted}] section (the keyring has {}){}",
        has.join(", "),
        if sections.len() > has.len() {
            ", ..."
        } else {
            ""
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_alike_in_any_case() {
        assert_eq!(size("4096"), Ok(4096));
        assert_eq!(size("64M"), Ok(64 << 20));
        assert_eq!(size("1GiB"), Ok(1 << 30));
        assert_eq!(size("1g"), size("1G"));
        assert_eq!(size("2t"), Ok(2 << 40));
        assert_eq!(size("8 KiB"), Ok(8 << 10));
        assert_eq!(size("2 gib"), Ok(2 << 30));
        assert_eq!(size("0"), Ok(0));
        assert!(size("").is_err());
        assert!(size("M").is_err());
        assert!(size("-1").is_err());
        assert!(size("1KB").is_err(), "KB could mean 1000");
        assert!(size("1.5G").is_err());
        assert!(size("5X").unwrap_err().contains("\"X\""));
        assert!(size("99999999T").unwrap_err().contains("too large"));
    }

    fn port(a: pb::Attachment) -> pb::PortAttachment {
        match a.kind {
            Some(pb::attachment::Kind::Port(p)) => p,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn attachments() {
        let p = port(port_attachment("p0.100").unwrap());
        assert_eq!((p.port.as_str(), p.vlan_id), ("ports/p0", 100));
        let p = port(port_attachment("ports/pf0vf0").unwrap());
        assert_eq!((p.port.as_str(), p.vlan_id), ("ports/pf0vf0", 0));
        let p = port(
            port_attachment("pf0vf0.7,mac=02:00:00:00:00:01,ip=10.0.0.1/32,ip=fe80::/10").unwrap(),
        );
        assert_eq!(p.vlan_id, 7);
        assert_eq!(p.allowed_macs, ["02:00:00:00:00:01"]);
        assert_eq!(p.allowed_source_prefixes, ["10.0.0.1/32", "fe80::/10"]);
        assert!(port_attachment("p0.x").is_err());
        assert!(port_attachment(".5").is_err());
        assert!(port_attachment("").is_err());
        assert!(port_attachment("pf0vf0,ipv4=10.0.0.1/32")
            .unwrap_err()
            .contains("mac=MAC or ip=PREFIX"));
    }

    #[test]
    fn rbd_images() {
        assert_eq!(
            rbd_image("rbd/vol1"),
            Ok(("rbd".to_string(), "vol1".to_string()))
        );
        for bad in ["rbd", "/vol1", "rbd/", "rbd/a/b", ""] {
            assert!(rbd_image(bad).unwrap_err().contains("POOL/IMAGE"), "{bad}");
        }
    }

    const KEY: &str = "AQBd5mVm2Bj1LRAAeqNgcKmqeH3eIh4mJv6Ekw==";

    #[test]
    fn keyrings_give_their_users_key() {
        let keyring = format!(
            "# made by ceph auth get\n[client.admin]\n\tkey = AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==\n\
             \tcaps mon = \"allow *\"\n\n[client.dpu]\n\tkey = {KEY}\n\tcaps osd = \"profile rbd\"\n"
        );
        assert_eq!(cephx_key(&keyring, "dpu").as_deref(), Ok(KEY));
        assert_ne!(cephx_key(&keyring, "admin").as_deref(), Ok(KEY));
        // No spaces around '=', a section name padded.
        assert_eq!(
            cephx_key(&format!("[ client.dpu ]\nkey={KEY}\n"), "dpu").as_deref(),
            Ok(KEY)
        );
        // The file of `ceph auth get-key`, with or without its newline.
        assert_eq!(cephx_key(KEY, "dpu").as_deref(), Ok(KEY));
        assert_eq!(cephx_key(&format!("\n{KEY}\n"), "x").as_deref(), Ok(KEY));
        assert_eq!(
            cephx_key(&format!("key = {KEY}\n"), "x").as_deref(),
            Ok(KEY)
        );
    }

    #[test]
    fn keyrings_without_the_users_key_are_refused_without_quoting_it() {
        let admin = format!("[client.admin]\n\tkey = {KEY}\n");
        let e = cephx_key(&admin, "dpu").unwrap_err();
        assert!(
            e.contains("no [client.dpu] section") && e.contains("[client.admin]"),
            "{e}"
        );
        let e = cephx_key("[client.dpu]\n\tcaps mon = \"allow r\"\n", "dpu").unwrap_err();
        assert_eq!(e, "[client.dpu] has no key");
        let e = cephx_key("[client.dpu]\nkey =\n", "dpu").unwrap_err();
        assert_eq!(e, "[client.dpu] has an empty key");
        assert!(cephx_key("", "dpu").unwrap_err().starts_with("empty"));
        assert!(cephx_key("# nothing\n\n", "dpu")
            .unwrap_err()
            .starts_with("empty"));
        for bad in [format!("{KEY} {KEY}"), format!("{KEY}\n{KEY}\n")] {
            let e = cephx_key(&bad, "dpu").unwrap_err();
            assert!(!e.contains(&KEY[..20]), "{e}");
        }
    }

    #[test]
    fn ranges_protocols_rates() {
        assert_eq!(
            port_range("80").unwrap(),
            pb::PortRange {
                first: 80,
                last: 80
            }
        );
        assert_eq!(
            port_range("1024-65535").unwrap(),
            pb::PortRange {
                first: 1024,
                last: 65535
            }
        );
        assert!(port_range("x").is_err());
        assert!(port_range("1-").is_err());
        assert_eq!(protocol("TCP"), Ok(6));
        assert_eq!(protocol("47"), Ok(47));
        assert!(protocol("gre").is_err());
        assert_eq!(rate_limit("1000pps").unwrap().packets_per_second, 1000);
        assert_eq!(rate_limit("2.5kpps").unwrap().packets_per_second, 2500);
        assert_eq!(rate_limit("10Mbps").unwrap().bits_per_second, 10_000_000);
        assert_eq!(rate_limit("1Gbps").unwrap().packets_per_second, 0);
        for bad in ["10", "10Mbit", "fastpps", "0pps", "-5pps", "0.1pps", "pps"] {
            assert!(rate_limit(bad).is_err(), "{bad}");
        }
    }
}
