//! Storage-side validation: NVMe subsystems (NQNs, serial and model
//! numbers, host allow lists), namespaces (backends, block sizes, UUIDs) and
//! listeners.

use std::net::IpAddr;

use dpu_proto::v1 as pb;

use super::{child_name, id, qos, rbd_name, remote};
use crate::error::{ControlError, Result};
use crate::model::{
    dh_group_by_name, hash_by_name, AuthRequirement, Backend, HostAuth, Listener, Namespace,
    PskText, SecretText, SecureChannel, TlsDerivation, TlsRequirement, Transport, Volume,
};

/// Longest NQN, in bytes (NVMe base specification).
pub const MAX_NQN_LEN: usize = 223;
/// Most namespaces per subsystem.
pub const MAX_NAMESPACES: u32 = 1_024;
/// Default largest NSID of a subsystem.
pub const DEFAULT_MAX_NAMESPACES: u32 = 32;
/// Most allowed host NQNs per subsystem.
pub const MAX_HOSTS_PER_SUBSYSTEM: usize = 1_024;
/// The well-known NQN of the discovery subsystem, which cannot be created.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Default NVMe/TCP port (IANA).
pub const DEFAULT_NVME_TCP_PORT: u16 = 4420;

/// Checks the DH-HMAC-CHAP settings of a SetHostAuth request (`field` is
/// the message's field name) and answers the host NQN and the settings to
/// store. Errors name the field and never quote a secret.
pub fn host_auth(field: &str, a: &pb::HostAuth) -> Result<(String, HostAuth)> {
    nqn(&format!("{field}.host_nqn"), &a.host_nqn)?;
    let secret_field = format!("{field}.dhchap_secret");
    if a.dhchap_secret.is_empty() {
        return Err(ControlError::invalid(secret_field, "required"));
    }
    let (secret, parsed) = SecretText::parse(&a.dhchap_secret)
        .map_err(|e| ControlError::invalid(&secret_field, e.to_string()))?;
    let ctrl_secret = if a.dhchap_ctrl_secret.is_empty() {
        None
    } else {
        let ctrl_field = format!("{field}.dhchap_ctrl_secret");
        let (text, ctrl) = SecretText::parse(&a.dhchap_ctrl_secret)
            .map_err(|e| ControlError::invalid(&ctrl_field, e.to_string()))?;
        // The same key both ways would let a controller's challenge be
        // answered by reflecting it (Linux refuses this too).
        if ctrl.same_as(&parsed) {
            return Err(ControlError::invalid(
                ctrl_field,
                "must differ from the host secret",
            ));
        }
        Some(text)
    };
    let names = |sub: &str, list: &[String], known: &dyn Fn(&str) -> bool, all: &str| {
        let mut out: Vec<String> = Vec::with_capacity(list.len());
        for (i, n) in list.iter().enumerate() {
            let f = format!("{field}.{sub}[{i}]");
            if !known(n) {
                return Err(ControlError::invalid(
                    f,
                    format!(
                        "{:?} is not one of {all}",
                        n.chars().take(32).collect::<String>()
                    ),
                ));
            }
            if out.contains(n) {
                return Err(ControlError::invalid(f, format!("{n} is listed twice")));
            }
            out.push(n.clone());
        }
        Ok(out)
    };
    let hashes = names(
        "hashes",
        &a.hashes,
        &|n| hash_by_name(n).is_some(),
        "sha256, sha384, sha512",
    )?;
    let dh_groups = names(
        "dh_groups",
        &a.dh_groups,
        &|n| dh_group_by_name(n).is_some(),
        "null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192",
    )?;
    Ok((
        a.host_nqn.clone(),
        HostAuth {
            secret,
            ctrl_secret,
            hashes,
            dh_groups,
        },
    ))
}

/// The authentication requirement a request's enum value stands for.
pub fn auth_requirement(field: &str, v: i32) -> Result<AuthRequirement> {
    match pb::AuthRequirement::try_from(v) {
        Ok(pb::AuthRequirement::Unspecified) => Ok(AuthRequirement::HostsWithSecret),
        Ok(pb::AuthRequirement::Required) => Ok(AuthRequirement::Required),
        Ok(pb::AuthRequirement::Disabled) => Ok(AuthRequirement::Disabled),
        Err(_) => Err(ControlError::invalid(
            field,
            format!("unknown authentication requirement {v}"),
        )),
    }
}

/// Checks the TLS key of a SetHostTlsKey request (`field` is the
/// message's field name) and answers the host NQN and the key to store.
/// Errors name the field and never quote the key.
pub fn host_tls(field: &str, t: &pb::HostTls) -> Result<(String, PskText)> {
    nqn(&format!("{field}.host_nqn"), &t.host_nqn)?;
    let psk_field = format!("{field}.psk");
    if t.psk.is_empty() {
        return Err(ControlError::invalid(psk_field, "required"));
    }
    let (psk, _) =
        PskText::parse(&t.psk).map_err(|e| ControlError::invalid(&psk_field, e.to_string()))?;
    let v0 = tls_derivation(&format!("{field}.v0_derivation"), t.v0_derivation)?;
    Ok((t.host_nqn.clone(), psk.with_v0_derivation(v0)))
}

/// The TLS PSK derivation a request's enum value stands for.
pub fn tls_derivation(field: &str, v: i32) -> Result<TlsDerivation> {
    match pb::TlsDerivation::try_from(v) {
        Ok(pb::TlsDerivation::Unspecified | pb::TlsDerivation::Spec) => Ok(TlsDerivation::Spec),
        Ok(pb::TlsDerivation::Compat) => Ok(TlsDerivation::Compat),
        Err(_) => Err(ControlError::invalid(
            field,
            format!("unknown TLS PSK derivation {v}"),
        )),
    }
}

/// The TLS requirement a request's enum value stands for.
pub fn tls_requirement(field: &str, v: i32) -> Result<TlsRequirement> {
    match pb::TlsRequirement::try_from(v) {
        Ok(pb::TlsRequirement::Unspecified) => Ok(TlsRequirement::HostsWithKey),
        Ok(pb::TlsRequirement::Required) => Ok(TlsRequirement::Required),
        Ok(pb::TlsRequirement::Disabled) => Ok(TlsRequirement::Disabled),
        Err(_) => Err(ControlError::invalid(
            field,
            format!("unknown TLS requirement {v}"),
        )),
    }
}

/// The secure channel a request's enum value stands for.
pub fn secure_channel(field: &str, v: i32) -> Result<SecureChannel> {
    match pb::SecureChannel::try_from(v) {
        Ok(pb::SecureChannel::Unspecified | pb::SecureChannel::None) => Ok(SecureChannel::None),
        Ok(pb::SecureChannel::Allowed) => Ok(SecureChannel::Allowed),
        Ok(pb::SecureChannel::Required) => Ok(SecureChannel::Required),
        Err(_) => Err(ControlError::invalid(
            field,
            format!("unknown secure channel {v}"),
        )),
    }
}

/// Parses a namespace name `subsystems/{subsystem}/namespaces/{nsid}`.
pub fn namespace_name<'a>(field: &str, n: &'a str) -> Result<(&'a str, u32)> {
    let (s, ns) = child_name(field, n, "subsystems", "namespaces")?;
    id(field, s)?;
    let nsid = ns
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_NAMESPACES).contains(n) && !ns.starts_with(['+', '0']))
        .ok_or_else(|| {
            ControlError::invalid(
                field,
                format!("namespace ID {ns:?} is not in 1..={MAX_NAMESPACES}"),
            )
        })?;
    Ok((s, nsid))
}

/// Checks a namespace ID that names an existing namespace: 1..=1024.
pub fn nsid(field: &str, v: u32) -> Result<u32> {
    if (1..=MAX_NAMESPACES).contains(&v) {
        Ok(v)
    } else {
        Err(ControlError::invalid(
            field,
            format!("namespace ID {v} is not in 1..={MAX_NAMESPACES}"),
        ))
    }
}

/// Parses a listener name `subsystems/{subsystem}/listeners/{listener}`.
pub fn listener_name<'a>(field: &str, n: &'a str) -> Result<(&'a str, &'a str)> {
    let (s, l) = child_name(field, n, "subsystems", "listeners")?;
    id(field, s)?;
    id(field, l)?;
    Ok((s, l))
}

/// Checks an NVMe Qualified Name (NVMe base spec, "NVMe Qualified Names"):
/// `nqn.yyyy-mm.reverse.domain[:anything]`, or the UUID form
/// `nqn.2014-08.org.nvmexpress:uuid:<uuid>`; at most 223 bytes, printable ASCII.
pub fn nqn(field: &str, s: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(ControlError::invalid(
            field,
            format!("{s:?} is not a valid NQN: {why}"),
        ))
    };
    if s.is_empty() {
        return bad("empty");
    }
    if s.len() > MAX_NQN_LEN {
        return bad("longer than 223 bytes");
    }
    if !s.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return bad("only printable ASCII without spaces is allowed");
    }
    let Some(rest) = s.strip_prefix("nqn.") else {
        return bad("must start with \"nqn.\"");
    };
    let date = rest.get(..7).unwrap_or("");
    let db = date.as_bytes();
    let date_ok = db.len() == 7
        && db[..4].iter().all(u8::is_ascii_digit)
        && db[4] == b'-'
        && db[5..].iter().all(u8::is_ascii_digit)
        && matches!(
            &date[5..],
            "01" | "02" | "03" | "04" | "05" | "06" | "07" | "08" | "09" | "10" | "11" | "12"
        );
    if !date_ok {
        return bad("expected a yyyy-mm date after \"nqn.\"");
    }
    let after = &rest[7..];
    let Some(domain_and_more) = after.strip_prefix('.') else {
        return bad("expected '.' and a reverse domain name after the date");
    };
    let domain = domain_and_more.split(':').next().unwrap_or("");
    if domain.is_empty()
        || !domain
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    {
        return bad("the reverse domain name may hold only letters, digits, '.' and '-'");
    }
    Ok(())
}

/// Checks an ASCII identity string of 1..=`max` printable characters.
pub fn ascii_id(field: &str, s: &str, max: usize) -> Result<()> {
    if s.is_empty() || s.len() > max || !s.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(ControlError::invalid(
            field,
            format!("{s:?} must be 1 to {max} printable ASCII characters"),
        ));
    }
    Ok(())
}

/// Converts the `max_namespaces` field; 0 means the default.
pub fn max_namespaces(field: &str, v: u32) -> Result<u32> {
    match v {
        0 => Ok(DEFAULT_MAX_NAMESPACES),
        1..=MAX_NAMESPACES => Ok(v),
        _ => Err(ControlError::invalid(
            field,
            format!("{v} is not in 1..={MAX_NAMESPACES}"),
        )),
    }
}

fn block_size(field: &str, v: u32) -> Result<u32> {
    match v {
        0 => Ok(512),
        512 | 4096 => Ok(v),
        _ => Err(ControlError::invalid(
            field,
            format!("{v} is not 512 or 4096"),
        )),
    }
}

fn size(field: &str, size: u64, block: u32) -> Result<()> {
    if size == 0 || !size.is_multiple_of(u64::from(block)) {
        return Err(ControlError::invalid(
            field,
            format!("{size} is not a non-zero multiple of the block size {block}"),
        ));
    }
    Ok(())
}

fn abs_path(field: &str, p: &str) -> Result<()> {
    if !p.starts_with('/') || p.contains('\0') || p.len() > 4096 {
        return Err(ControlError::invalid(
            field,
            format!("{p:?} is not an absolute path"),
        ));
    }
    Ok(())
}

/// Parses a UUID in RFC 4122 text form.
pub fn uuid(field: &str, s: &str) -> Result<[u8; 16]> {
    let groups: Vec<&str> = s.split('-').collect();
    let shape_ok = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]);
    let hex: String = groups.concat();
    if !shape_ok {
        return Err(ControlError::invalid(
            field,
            format!("{s:?} is not a UUID (8-4-4-4-12 hex digits)"),
        ));
    }
    hex16(field, &hex)
}

/// Parses an EUI-64: 16 hex digits, not all zero (which NVMe reads as
/// none).
pub fn eui64(field: &str, s: &str) -> Result<[u8; 8]> {
    if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ControlError::invalid(
            field,
            format!("{s:?} is not 16 hex digits"),
        ));
    }
    let out = u64::from_str_radix(s, 16)
        .map_err(|_| ControlError::invalid(field, format!("{s:?} is not 16 hex digits")))?
        .to_be_bytes();
    if out == [0; 8] {
        return Err(ControlError::invalid(
            field,
            "all zeros means none: leave it empty",
        ));
    }
    Ok(out)
}

/// Parses 32 hex digits into 16 bytes.
pub fn hex16(field: &str, s: &str) -> Result<[u8; 16]> {
    let bytes = s.as_bytes();
    let mut out = [0u8; 16];
    if bytes.len() != 32 {
        return Err(ControlError::invalid(
            field,
            format!("{s:?} is not 32 hex digits"),
        ));
    }
    // `from_str_radix` takes a sign: "+f" would read as one digit.
    if !bytes.iter().all(u8::is_ascii_hexdigit) {
        return Err(ControlError::invalid(
            field,
            format!("{s:?} is not hexadecimal"),
        ));
    }
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let digits = std::str::from_utf8(pair).ok();
        out[i] = digits
            .and_then(|d| u8::from_str_radix(d, 16).ok())
            .ok_or_else(|| ControlError::invalid(field, format!("{s:?} is not hexadecimal")))?;
    }
    Ok(out)
}

/// The store of a namespace or volume (`field` names it in the request)
/// in blocks of `block_size` bytes. A remote backend without a host NQN
/// takes `default_host_nqn`, the service's.
fn store(
    field: &str,
    b: Option<&pb::namespace::Backend>,
    block_size: u32,
    default_host_nqn: &str,
) -> Result<Backend> {
    let f = |s: &str| format!("{field}.{s}");
    Ok(match b {
        Some(pb::namespace::Backend::Ram(r)) => {
            size(&f("ram.size_bytes"), r.size_bytes, block_size)?;
            Backend::Ram {
                size_bytes: r.size_bytes,
            }
        }
        Some(pb::namespace::Backend::Null(r)) => {
            size(&f("null.size_bytes"), r.size_bytes, block_size)?;
            Backend::Null {
                size_bytes: r.size_bytes,
            }
        }
        Some(pb::namespace::Backend::File(fb)) => {
            abs_path(&f("file.path"), &fb.path)?;
            if fb.size_bytes != 0 {
                size(&f("file.size_bytes"), fb.size_bytes, block_size)?;
            }
            Backend::File {
                path: fb.path.clone(),
                size_bytes: fb.size_bytes,
                // Decided by `validate::backing`, which looks.
                created: false,
            }
        }
        Some(pb::namespace::Backend::BlockDevice(b)) => {
            abs_path(&f("block_device.path"), &b.path)?;
            Backend::BlockDevice {
                path: b.path.clone(),
            }
        }
        Some(pb::namespace::Backend::Rbd(r)) => {
            id(&f("rbd.cluster_id"), &r.cluster_id)?;
            rbd_name(&f("rbd.pool"), "pool", &r.pool)?;
            rbd_name(&f("rbd.image"), "image", &r.image)?;
            Backend::Rbd {
                cluster: r.cluster_id.clone(),
                pool: r.pool.clone(),
                image: r.image.clone(),
            }
        }
        Some(pb::namespace::Backend::Remote(r)) => {
            Backend::Remote(remote(&f("remote"), r, default_host_nqn)?)
        }
        Some(pb::namespace::Backend::Volume(v)) => Backend::Volume {
            id: volume_ref(&f("volume"), v)?,
        },
        None => {
            return Err(ControlError::invalid(
                f("backend"),
                "one of ram, file, block_device, rbd, remote, null, volume is required",
            ))
        }
    })
}

/// Checks a volume ID: 1..=63 characters of `[A-Za-z0-9_.-]`, starting
/// with a letter. Wider than other IDs (upper case, `_`, `.`): volumes
/// carry the names storage stacks give their block devices, such as
/// SPDK's `Malloc0`, which OPI's clients name volumes by.
pub fn volume_id(field: &str, v: &str) -> Result<()> {
    let ok = !v.is_empty()
        && v.len() <= 63
        && v.starts_with(|c: char| c.is_ascii_alphabetic())
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ControlError::invalid(
            field,
            format!(
                "{v:?} is not a valid volume ID: use 1 to 63 characters of A-Z, a-z, 0-9, \
                 '-', '_' and '.', starting with a letter"
            ),
        ))
    }
}

/// The ID of the volume that resource name `name` (`volumes/{id}`) names.
pub fn volume_name<'a>(field: &str, name: &'a str) -> Result<&'a str> {
    match name.strip_prefix("volumes/") {
        Some(v) => {
            volume_id(field, v)?;
            Ok(v)
        }
        None => Err(ControlError::invalid(
            field,
            format!("expected \"volumes/{{id}}\", got {name:?}"),
        )),
    }
}

/// The ID of the volume `s` names: its ID (`v1`) or its resource name
/// (`volumes/v1`).
pub fn volume_ref(field: &str, s: &str) -> Result<String> {
    let id_str = s.strip_prefix("volumes/").unwrap_or(s);
    volume_id(field, id_str)?;
    Ok(id_str.to_string())
}

/// Converts a volume to create, with the ID given (checked) or, when
/// empty, `None` for the service to assign. Its UUID comes back as given,
/// or with `false` when the caller left it empty (the state generates
/// it).
pub fn volume(field: &str, volume_id: &str, v: &pb::Volume) -> Result<(Volume, bool)> {
    let f = |s: &str| format!("{field}.{s}");
    if !volume_id.is_empty() {
        self::volume_id("volume_id", volume_id)?;
    }
    let block_size = block_size(&f("block_size"), v.block_size)?;
    let b = v.backend.as_ref().map(|b| match b {
        pb::volume::Backend::Ram(r) => pb::namespace::Backend::Ram(*r),
        pb::volume::Backend::File(fb) => pb::namespace::Backend::File(fb.clone()),
        pb::volume::Backend::BlockDevice(d) => pb::namespace::Backend::BlockDevice(d.clone()),
        pb::volume::Backend::Null(n) => pb::namespace::Backend::Null(*n),
    });
    if b.is_none() {
        return Err(ControlError::invalid(
            f("backend"),
            "one of ram, file, block_device, null is required",
        ));
    }
    let backend = store(field, b.as_ref(), block_size, "")?;
    let (uuid, has_uuid) = if v.uuid.is_empty() {
        ([0; 16], false)
    } else {
        (uuid(&f("uuid"), &v.uuid)?, true)
    };
    Ok((
        Volume {
            id: volume_id.to_string(),
            backend,
            block_size,
            uuid,
        },
        has_uuid,
    ))
}

/// Converts a namespace to create. `uuid`/`nguid` come back as given or
/// `None` when the caller left them empty (the state generates them). A
/// remote backend without a host NQN takes `default_host_nqn`, the
/// service's.
pub fn namespace(
    field: &str,
    n: &pb::Namespace,
    default_host_nqn: &str,
) -> Result<(Namespace, bool, bool)> {
    let f = |s: &str| format!("{field}.{s}");
    let volume = match &n.backend {
        Some(pb::namespace::Backend::Volume(v)) => Some(volume_ref(&f("volume"), v)?),
        _ => None,
    };
    let (block_size, backend) = match volume {
        // The state gives a namespace on a volume the volume's block
        // size when it asks for none.
        Some(id) => match n.block_size {
            0 => (0, Backend::Volume { id }),
            b => (block_size(&f("block_size"), b)?, Backend::Volume { id }),
        },
        None => {
            let block_size = block_size(&f("block_size"), n.block_size)?;
            let backend = store(field, n.backend.as_ref(), block_size, default_host_nqn)?;
            (block_size, backend)
        }
    };
    if n.nsid > MAX_NAMESPACES {
        return Err(ControlError::invalid(
            f("nsid"),
            format!("{} is not in 0..={MAX_NAMESPACES}", n.nsid),
        ));
    }
    let (uuid, has_uuid) = if n.uuid.is_empty() {
        ([0; 16], false)
    } else {
        (uuid(&f("uuid"), &n.uuid)?, true)
    };
    let (nguid, has_nguid) = if n.nguid.is_empty() {
        ([0; 16], false)
    } else {
        (hex16(&f("nguid"), &n.nguid)?, true)
    };
    let qos = qos(&f("qos"), n.qos.as_ref())?;
    if !n.namespace_id.is_empty() {
        super::id(&f("namespace_id"), &n.namespace_id)?;
    }
    let eui64 = if n.eui64.is_empty() {
        None
    } else {
        Some(eui64(&f("eui64"), &n.eui64)?)
    };
    Ok((
        Namespace {
            nsid: n.nsid,
            backend,
            block_size,
            uuid,
            nguid,
            namespace_id: n.namespace_id.clone(),
            eui64,
            qos,
        },
        has_uuid,
        has_nguid,
    ))
}

/// Converts a listener to create, deriving its ID when `listener_id` is
/// empty. A listener naming a tenant is a storage endpoint at its IPv4 or
/// IPv6 address; the state checks that address and assigns its MAC.
pub fn listener(field: &str, listener_id: &str, l: &pb::Listener) -> Result<Listener> {
    let f = |s: &str| format!("{field}.{s}");
    let transport = match pb::Transport::try_from(l.transport) {
        Ok(pb::Transport::Unspecified | pb::Transport::Tcp) => Transport::Tcp,
        Err(_) => {
            return Err(ControlError::invalid(
                f("transport"),
                format!("unknown transport value {}", l.transport),
            ))
        }
    };
    let address: IpAddr = l.address.parse().map_err(|_| {
        ControlError::invalid(
            f("address"),
            format!("{:?} is not an IP address", l.address),
        )
    })?;
    let port = match l.port {
        0 => DEFAULT_NVME_TCP_PORT,
        p => u16::try_from(p)
            .map_err(|_| ControlError::invalid(f("port"), format!("{p} is not in 1..=65535")))?,
    };
    let id_str = if listener_id.is_empty() {
        let addr: String = address
            .to_string()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let derived = format!("tcp-{addr}-{port}").replace("--", "-");
        derived.trim_end_matches('-').to_string()
    } else {
        id("listener_id", listener_id)?;
        listener_id.to_string()
    };
    let tenant = if l.tenant.is_empty() {
        None
    } else {
        id(&f("tenant"), &l.tenant)?;
        Some(l.tenant.clone())
    };
    let secure_channel = secure_channel(&f("secure_channel"), l.secure_channel)?;
    Ok(Listener {
        id: id_str,
        transport,
        address,
        port,
        tenant,
        mac: None,
        secure_channel,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::tests::field_of;

    #[test]
    fn nqns() {
        for good in [
            "nqn.2024-01.io.example:vol1",
            "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
            "nqn.2016-06.io.spdk:cnode1",
            "nqn.2024-12.com.example",
        ] {
            nqn("nqn", good).unwrap();
        }
        for bad in [
            "",
            "iqn.2024-01.io.example",
            "nqn.2024-13.io.example",
            "nqn.24-01.io.example",
            "nqn.2024-01",
            "nqn.2024-01.:x",
            "nqn.2024-01.io example",
            &format!("nqn.2024-01.io.example:{}", "x".repeat(220)),
        ] {
            assert!(nqn("nqn", bad).is_err(), "{bad:?} accepted");
        }
    }

    /// The service's default host NQN, in tests.
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";

    #[test]
    fn namespaces() {
        let mut n = pb::Namespace {
            backend: Some(pb::namespace::Backend::Ram(pb::RamBackend {
                size_bytes: 1 << 20,
            })),
            ..Default::default()
        };
        let (ns, has_uuid, _) = namespace("namespace", &n, HOST).unwrap();
        assert_eq!(ns.block_size, 512);
        assert!(!has_uuid);
        n.block_size = 4096;
        n.backend = Some(pb::namespace::Backend::Ram(pb::RamBackend {
            size_bytes: 512,
        }));
        assert_eq!(
            field_of(namespace("namespace", &n, HOST).unwrap_err()),
            "namespace.ram.size_bytes"
        );
        n.backend = Some(pb::namespace::Backend::File(pb::FileBackend {
            path: "rel".into(),
            size_bytes: 0,
        }));
        assert_eq!(
            field_of(namespace("namespace", &n, HOST).unwrap_err()),
            "namespace.file.path"
        );
        n.backend = None;
        assert_eq!(
            field_of(namespace("namespace", &n, HOST).unwrap_err()),
            "namespace.backend"
        );
        let rbd = |cluster: &str, pool: &str, image: &str| {
            Some(pb::namespace::Backend::Rbd(pb::RbdBackend {
                cluster_id: cluster.into(),
                pool: pool.into(),
                image: image.into(),
            }))
        };
        n.backend = rbd("ceph1", "rbd", "vol1");
        assert_eq!(
            namespace("namespace", &n, HOST).unwrap().0.backend,
            Backend::Rbd {
                cluster: "ceph1".into(),
                pool: "rbd".into(),
                image: "vol1".into()
            }
        );
        for (backend, field) in [
            (rbd("", "rbd", "vol1"), "namespace.rbd.cluster_id"),
            (
                rbd("clusters/ceph1", "rbd", "vol1"),
                "namespace.rbd.cluster_id",
            ),
            (rbd("ceph1", "", "vol1"), "namespace.rbd.pool"),
            (rbd("ceph1", "rbd", "vol@snap"), "namespace.rbd.image"),
            (rbd("ceph1", "rbd/x", "vol1"), "namespace.rbd.pool"),
        ] {
            n.backend = backend;
            assert_eq!(
                field_of(namespace("namespace", &n, HOST).unwrap_err()),
                field
            );
        }
        // A remote namespace takes the service's host NQN unless it names
        // one; its fields are checked under `remote`.
        let far = |nsid: u32| {
            Some(pb::namespace::Backend::Remote(pb::RemoteBackend {
                paths: vec!["10.0.0.1:4420".into()],
                subnqn: "nqn.2024-01.io.example:far".into(),
                nsid,
                ..Default::default()
            }))
        };
        n.backend = far(1);
        let Backend::Remote(r) = namespace("namespace", &n, HOST).unwrap().0.backend else {
            panic!("not remote")
        };
        assert_eq!((r.nsid, r.host_nqn.as_str()), (1, HOST));
        n.backend = far(0);
        assert_eq!(
            field_of(namespace("namespace", &n, HOST).unwrap_err()),
            "namespace.remote.nsid"
        );
        n.backend = Some(pb::namespace::Backend::Ram(pb::RamBackend {
            size_bytes: 4096,
        }));
        n.uuid = "f81d4fae-7dec-11d0-a765-00a0c91e6bf6".into();
        let (ns, has_uuid, _) = namespace("namespace", &n, HOST).unwrap();
        assert!(has_uuid);
        assert_eq!(ns.uuid[0], 0xf8);
        n.uuid = "f81d4fae7dec11d0a76500a0c91e6bf6".into();
        assert_eq!(
            field_of(namespace("namespace", &n, HOST).unwrap_err()),
            "namespace.uuid"
        );
        n.uuid.clear();
        n.qos = Some(pb::QosLimits {
            iops: 5_000,
            read_bandwidth: 100 << 20,
            ..Default::default()
        });
        let (ns, ..) = namespace("namespace", &n, HOST).unwrap();
        assert_eq!((ns.qos.iops, ns.qos.read_bandwidth), (5_000, 100 << 20));
        n.qos = Some(pb::QosLimits {
            iops: crate::validate::MAX_QOS_IOPS + 1,
            ..Default::default()
        });
        assert_eq!(
            field_of(namespace("namespace", &n, HOST).unwrap_err()),
            "namespace.qos.iops"
        );
        n.qos = None;
        n.block_size = 1024;
        assert_eq!(
            field_of(namespace("namespace", &n, HOST).unwrap_err()),
            "namespace.block_size"
        );
    }

    #[test]
    fn a_namespace_id_and_eui64_are_checked_and_kept() {
        let mut n = pb::Namespace {
            backend: Some(pb::namespace::Backend::Ram(pb::RamBackend {
                size_bytes: 4096,
            })),
            ..Default::default()
        };
        let (ns, ..) = namespace("namespace", &n, HOST).unwrap();
        assert_eq!((ns.namespace_id.as_str(), ns.eui64), ("", None));
        n.namespace_id = "opi-1b4e28ba-2fa1-11d2-883f-b9a761bde3fb".into();
        n.eui64 = "1B4E28BA2FA111D2".into();
        let (ns, ..) = namespace("namespace", &n, HOST).unwrap();
        assert_eq!(ns.namespace_id, n.namespace_id);
        assert_eq!(
            ns.eui64,
            Some([0x1b, 0x4e, 0x28, 0xba, 0x2f, 0xa1, 0x11, 0xd2])
        );
        for (id, eui, field) in [
            ("3", "", "namespace.namespace_id"),
            ("Ns", "", "namespace.namespace_id"),
            ("ns-", "", "namespace.namespace_id"),
            ("ns", "1b4e28ba2fa111d", "namespace.eui64"),
            ("ns", "1b4e28ba2fa111d2ff", "namespace.eui64"),
            ("ns", "1b4e28ba2fa111zz", "namespace.eui64"),
            ("ns", "0000000000000000", "namespace.eui64"),
        ] {
            n.namespace_id = id.into();
            n.eui64 = eui.into();
            assert_eq!(
                field_of(namespace("namespace", &n, HOST).unwrap_err()),
                field,
                "{id:?} {eui:?}"
            );
        }
    }

    #[test]
    fn listeners() {
        let l = listener(
            "listener",
            "",
            &pb::Listener {
                address: "127.0.0.1".into(),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(l.port, 4420);
        assert_eq!(l.id, "tcp-127-0-0-1-4420");
        id("x", &l.id).unwrap();
        let l6 = listener(
            "listener",
            "",
            &pb::Listener {
                address: "::1".into(),
                port: 4421,
                ..Default::default()
            },
        )
        .unwrap();
        id("x", &l6.id).unwrap();
        assert!(listener(
            "listener",
            "",
            &pb::Listener {
                address: "localhost".into(),
                ..Default::default()
            }
        )
        .is_err());
        assert!(listener(
            "listener",
            "",
            &pb::Listener {
                address: "::1".into(),
                port: 70000,
                ..Default::default()
            }
        )
        .is_err());
    }

    /// Test secrets: a key of one repeated byte, as `DHHC-1` text.
    const RAW32: &str = "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:";
    const SHA256: &str = "DHHC-1:01:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgJvwX3v:";
    const RAW48: &str =
        "DHHC-1:00:BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUF5lUjlA==:";

    fn auth(secret: &str, ctrl: &str) -> pb::HostAuth {
        pb::HostAuth {
            host_nqn: "nqn.2024-01.io.example:h1".into(),
            dhchap_secret: secret.into(),
            dhchap_ctrl_secret: ctrl.into(),
            ..Default::default()
        }
    }

    /// What each refusal names, and that no message quotes key material.
    #[test]
    fn host_auth_is_checked_field_by_field() {
        let (host, a) = host_auth("auth", &auth(RAW32, SHA256)).unwrap();
        assert_eq!(host, "nqn.2024-01.io.example:h1");
        assert_eq!(a.secret.hash_indicator(), 0);
        assert_eq!(a.ctrl_secret.as_ref().unwrap().hash_indicator(), 1);
        assert!(a.hashes.is_empty() && a.dh_groups.is_empty());
        let keys = a.host_keys().unwrap();
        assert_eq!(keys.hashes.len(), 3);
        assert_eq!(keys.dh_groups.len(), 6);

        let refused = |x: pb::HostAuth| {
            let e = host_auth("auth", &x).unwrap_err();
            let shown = e.to_string();
            for b64 in [&RAW32[10..50], &SHA256[10..50]] {
                assert!(!shown.contains(b64), "{shown}");
            }
            (field_of(e), shown)
        };
        assert_eq!(refused(auth("", "")).0, "auth.dhchap_secret");
        assert_eq!(refused(auth("secret", "")).0, "auth.dhchap_secret");
        let crc = "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEAAAAA:";
        let (f, why) = refused(auth(crc, ""));
        assert_eq!(f, "auth.dhchap_secret");
        assert!(why.contains("CRC"), "{why}");
        // A 48-byte key cannot be transformed with SHA-256.
        let (f, why) = refused(auth(&RAW48.replacen(":00:", ":01:", 1), ""));
        assert_eq!(f, "auth.dhchap_secret");
        assert!(why.contains("48-byte key"), "{why}");
        assert_eq!(
            refused(auth(RAW32, &crc.replace("DHHC-1", "DHHC-2"))).0,
            "auth.dhchap_ctrl_secret"
        );
        let (f, why) = refused(auth(SHA256, SHA256));
        assert_eq!(f, "auth.dhchap_ctrl_secret");
        assert!(why.contains("differ"), "{why}");
        let mut x = auth(RAW32, "");
        x.host_nqn = "host".into();
        assert_eq!(refused(x).0, "auth.host_nqn");
        let mut x = auth(RAW32, "");
        x.hashes = vec!["sha256".into(), "md5".into()];
        assert_eq!(refused(x).0, "auth.hashes[1]");
        let mut x = auth(RAW32, "");
        x.dh_groups = vec!["ffdhe2048".into(), "ffdhe2048".into()];
        assert_eq!(refused(x).0, "auth.dh_groups[1]");
        let mut x = auth(RAW32, "");
        x.hashes = vec!["sha512".into()];
        x.dh_groups = vec!["null".into(), "ffdhe4096".into()];
        let keys = host_auth("auth", &x).unwrap().1.host_keys().unwrap();
        assert_eq!(keys.hashes, [dpu_nvmeof::auth::HashId::Sha512]);
        assert_eq!(
            keys.dh_groups,
            [
                dpu_nvmeof::auth::DhGroup::Null,
                dpu_nvmeof::auth::DhGroup::Ffdhe4096
            ]
        );
        assert_eq!(
            field_of(auth_requirement("subsystem.auth_requirement", 7).unwrap_err()),
            "subsystem.auth_requirement"
        );
    }

    const PSK: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";

    fn tls(psk: &str) -> pb::HostTls {
        pb::HostTls {
            host_nqn: "nqn.2024-01.io.example:h1".into(),
            psk: psk.into(),
            psk_hash: 0,
            v0_derivation: 0,
        }
    }

    /// What each refusal names, with the parse error and never the key.
    #[test]
    fn host_tls_is_checked_field_by_field() {
        let (host, k) = host_tls("tls", &tls(PSK)).unwrap();
        assert_eq!(host, "nqn.2024-01.io.example:h1");
        assert_eq!(k.hash_code(), 1);
        let refused = |x: pb::HostTls| {
            let e = host_tls("tls", &x).unwrap_err();
            let shown = e.to_string();
            assert!(!shown.contains(&PSK[16..40]), "{shown}");
            (field_of(e), shown)
        };
        assert_eq!(refused(tls("")).0, "tls.psk");
        let (f, why) = refused(tls("key"));
        assert_eq!(f, "tls.psk");
        assert!(why.contains("interchange format"), "{why}");
        // The last base64 character changed: the CRC-32 no longer matches.
        let (f, why) = refused(tls(&PSK.replace("9LrZ:", "9LrY:")));
        assert_eq!(f, "tls.psk");
        assert!(why.contains("CRC-32"), "{why}");
        let (f, why) = refused(tls(&PSK.replace(":01:", ":07:")));
        assert_eq!(f, "tls.psk");
        assert!(why.contains("hash"), "{why}");
        let mut x = tls(PSK);
        x.host_nqn = "host".into();
        assert_eq!(refused(x).0, "tls.host_nqn");
        assert_eq!(k.v0_derivation(), TlsDerivation::Spec);
        let mut x = tls(PSK);
        x.v0_derivation = pb::TlsDerivation::Compat as i32;
        let (_, k) = host_tls("tls", &x).unwrap();
        assert_eq!(k.v0_derivation(), TlsDerivation::Compat);
        x.v0_derivation = pb::TlsDerivation::Spec as i32;
        assert_eq!(
            host_tls("tls", &x).unwrap().1.v0_derivation(),
            TlsDerivation::Spec
        );
        x.v0_derivation = 7;
        let (f, why) = refused(x);
        assert_eq!(f, "tls.v0_derivation");
        assert!(why.contains("unknown TLS PSK derivation 7"), "{why}");
        assert_eq!(
            field_of(tls_requirement("subsystem.tls_requirement", 9).unwrap_err()),
            "subsystem.tls_requirement"
        );
        assert_eq!(
            tls_requirement("f", pb::TlsRequirement::Disabled as i32).unwrap(),
            TlsRequirement::Disabled
        );
    }

    /// A listener's secure channel: unspecified is none; storage
    /// endpoints offer it as the service's own listeners do.
    #[test]
    fn listener_secure_channel() {
        let mut l = pb::Listener {
            address: "10.0.0.1".into(),
            secure_channel: pb::SecureChannel::Required as i32,
            ..Default::default()
        };
        let got = listener("listener", "", &l).unwrap();
        assert_eq!(got.secure_channel, SecureChannel::Required);
        l.secure_channel = pb::SecureChannel::Unspecified as i32;
        assert!(listener("listener", "", &l)
            .unwrap()
            .secure_channel
            .is_none());
        l.secure_channel = 9;
        assert_eq!(
            field_of(listener("listener", "", &l).unwrap_err()),
            "listener.secure_channel"
        );
        l.secure_channel = pb::SecureChannel::Allowed as i32;
        l.tenant = "t".into();
        assert_eq!(
            listener("listener", "", &l).unwrap().secure_channel,
            SecureChannel::Allowed
        );
    }

    /// A stored secret shows in no `Debug` output, and reads back from
    /// the state file's JSON as it was.
    #[test]
    fn stored_secrets_hide_from_debug_and_round_trip() {
        let (_, a) = host_auth("auth", &auth(RAW32, SHA256)).unwrap();
        let dbg = format!("{a:?}");
        assert!(
            !dbg.contains(&RAW32[10..40]) && !dbg.contains(&SHA256[10..40]),
            "{dbg}"
        );
        let json = serde_json::to_string(&a).unwrap();
        assert!(json.contains(RAW32), "the state file keeps the secret");
        let back: HostAuth = serde_json::from_str(&json).unwrap();
        assert_eq!(back, a);
    }

    /// Volumes take the names storage stacks give block devices; a
    /// volume's store is one of four kinds, sized in its blocks.
    #[test]
    fn volumes_are_checked_field_by_field() {
        for ok in ["Malloc0", "v1", "aio.disk_2", "Z"] {
            assert!(volume_id("volume_id", ok).is_ok(), "{ok}");
        }
        for bad in ["", "0v", "-v", "a/b", "a b", &"v".repeat(64)] {
            assert_eq!(
                field_of(volume_id("volume_id", bad).unwrap_err()),
                "volume_id"
            );
        }
        assert_eq!(volume_ref("volume", "volumes/Malloc1").unwrap(), "Malloc1");
        assert_eq!(volume_ref("volume", "Malloc1").unwrap(), "Malloc1");
        assert_eq!(volume_name("name", "volumes/Malloc1").unwrap(), "Malloc1");
        assert_eq!(
            field_of(volume_name("name", "Malloc1").unwrap_err()),
            "name"
        );

        let ram = |size_bytes| pb::Volume {
            backend: Some(pb::volume::Backend::Ram(pb::RamBackend { size_bytes })),
            ..Default::default()
        };
        let (v, given) = volume("volume", "Malloc1", &ram(8192)).unwrap();
        assert_eq!(
            (v.id.as_str(), v.block_size, given),
            ("Malloc1", 512, false)
        );
        assert_eq!(v.backend, Backend::Ram { size_bytes: 8192 });
        assert_eq!(
            field_of(volume("volume", "", &ram(1000)).unwrap_err()),
            "volume.ram.size_bytes"
        );
        let mut big = ram(8192);
        big.block_size = 4096;
        big.uuid = "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb".into();
        let (v, given) = volume("volume", "", &big).unwrap();
        assert!(given && v.id.is_empty() && v.block_size == 4096);
        big.block_size = 1024;
        assert_eq!(
            field_of(volume("volume", "", &big).unwrap_err()),
            "volume.block_size"
        );
        let none = pb::Volume::default();
        assert_eq!(
            field_of(volume("volume", "", &none).unwrap_err()),
            "volume.backend"
        );
        let rel = pb::Volume {
            backend: Some(pb::volume::Backend::File(pb::FileBackend {
                path: "rel.img".into(),
                size_bytes: 0,
            })),
            ..Default::default()
        };
        assert_eq!(
            field_of(volume("volume", "", &rel).unwrap_err()),
            "volume.file.path"
        );
        let null = pb::Volume {
            backend: Some(pb::volume::Backend::Null(pb::NullBackend {
                size_bytes: 512,
            })),
            ..Default::default()
        };
        assert_eq!(
            volume("volume", "n", &null).unwrap().0.backend,
            Backend::Null { size_bytes: 512 }
        );

        // A namespace on a volume keeps a block size of 0 for the state
        // to fill from the volume.
        let on = pb::Namespace {
            backend: Some(pb::namespace::Backend::Volume("volumes/Malloc1".into())),
            ..Default::default()
        };
        let (ns, _, _) = namespace("namespace", &on, "nqn.h").unwrap();
        assert_eq!(
            ns.backend,
            Backend::Volume {
                id: "Malloc1".into()
            }
        );
        assert_eq!(ns.block_size, 0);
        let bad = pb::Namespace {
            backend: Some(pb::namespace::Backend::Volume("volumes/a/b".into())),
            ..Default::default()
        };
        assert_eq!(
            field_of(namespace("namespace", &bad, "nqn.h").unwrap_err()),
            "namespace.volume"
        );
    }

    /// A sign is not a hex digit: `from_str_radix` alone would take "+f".
    #[test]
    fn hex_takes_digits_only() {
        let ok = "0123456789abcdefABCDEF0123456789";
        assert_eq!(hex16("nguid", ok).unwrap()[..2], [0x01, 0x23]);
        for bad in [
            "+f23456789abcdef0123456789abcdef",
            "-123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(field_of(hex16("nguid", bad).unwrap_err()), "nguid", "{bad}");
        }
        assert!(uuid("uuid", "+b4e28ba-2fa1-11d2-883f-b9a761bde3fb").is_err());
    }
}
