//! The declarations of the configuration (`[[storage.clusters]]`,
//! `[[storage.volumes]]`, `[[storage.subsystems]]`, `[[tenants]]` and
//! their rules) as the API's
//! messages, and the configuration key of a field the API names in an
//! error.

use anyhow::{bail, Context, Result};
use dpu_control::model::{SecureChannel, TlsDerivation};
use dpu_proto::text;
use dpu_proto::v1 as pb;

use super::{
    parse_size, SeedAction, SeedCluster, SeedHostTls, SeedListener, SeedNamespace, SeedQos,
    SeedRemote, SeedRule, SeedSubsystem, SeedTenant, SeedTlsRequirement, SeedTransport, SeedVolume,
    TextOrNumber,
};

/// Longest keyring file read: one holding many users' keys is a few KiB.
const MAX_KEYRING_FILE: u64 = 64 << 10;
/// Longest DH-HMAC-CHAP secret file read: a secret is at most about 100
/// characters.
const MAX_SECRET_FILE: u64 = 4096;

/// The text of `path`, at most `max` bytes of it (`what` says what it
/// should hold); never quoted in an error.
fn read_small(path: &std::path::Path, max: u64, what: &str) -> Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_string(&mut text))
        .with_context(|| path.display().to_string())?;
    if text.len() as u64 > max {
        bail!("{}: longer than {max} bytes; not {what}", path.display());
    }
    Ok(text)
}

impl SeedCluster {
    /// The cluster as a `CreateCluster` request carries it, with the key
    /// of `client.{user}` read from `keyring_file`.
    ///
    /// # Errors
    /// If the keyring file cannot be read or holds no key for the user
    /// (naming the file, never quoting it).
    pub fn to_proto(&self) -> Result<pb::Cluster> {
        let key = match &self.keyring_file {
            Some(path) => {
                let read = || -> std::io::Result<String> {
                    use std::io::Read;
                    let mut text = String::new();
                    std::fs::File::open(path)?
                        .take(MAX_KEYRING_FILE + 1)
                        .read_to_string(&mut text)?;
                    Ok(text)
                };
                let at = || format!("keyring_file {}", path.display());
                let text = read().with_context(at)?;
                if text.len() as u64 > MAX_KEYRING_FILE {
                    bail!(
                        "{}: longer than {MAX_KEYRING_FILE} bytes; not a keyring",
                        at()
                    );
                }
                text::cephx_key(&text, &self.user).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?
            }
            None => String::new(),
        };
        Ok(pb::Cluster {
            mon_host: self.mon_host.clone(),
            user: self.user.clone(),
            key,
            op_timeout_secs: self.op_timeout_secs.unwrap_or(0),
            connect_timeout_secs: self.connect_timeout_secs.unwrap_or(0),
            ..Default::default()
        })
    }
}

impl SeedSubsystem {
    /// The subsystem as a `CreateSubsystem` request carries it.
    pub fn to_proto(&self) -> pb::Subsystem {
        pb::Subsystem {
            nqn: self.nqn.clone(),
            serial_number: self.serial_number.clone().unwrap_or_default(),
            model_number: self.model_number.clone().unwrap_or_default(),
            allow_any_host: self.allow_any_host,
            allowed_hosts: self.allowed_hosts.clone(),
            max_namespaces: self.max_namespaces.unwrap_or(0),
            tls_requirement: match self.tls_requirement {
                SeedTlsRequirement::Default => pb::TlsRequirement::Unspecified,
                SeedTlsRequirement::Required => pb::TlsRequirement::Required,
                SeedTlsRequirement::Disabled => pb::TlsRequirement::Disabled,
            } as i32,
            ..Default::default()
        }
    }
}

impl SeedHostTls {
    /// The key of `host` as a `SetHostTlsKey` request carries it, read
    /// from `psk_file` (trimmed) and checked.
    ///
    /// # Errors
    /// If the file cannot be read or holds no key in the interchange
    /// format (naming `psk_file` and the file, never quoting it).
    pub fn to_proto(&self, host: &str) -> Result<pb::HostTls> {
        let at = || format!("psk_file: {}", self.psk_file.display());
        let psk = read_small(&self.psk_file, MAX_SECRET_FILE, "a TLS PSK")
            .context("psk_file")?
            .trim()
            .to_string();
        dpu_nvmeof::dpu_tls::ConfiguredPsk::parse(&psk)
            .map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
        Ok(pb::HostTls {
            host_nqn: host.to_string(),
            psk,
            psk_hash: 0,
            v0_derivation: match self.v0_derivation {
                TlsDerivation::Spec => pb::TlsDerivation::Spec,
                TlsDerivation::Compat => pb::TlsDerivation::Compat,
            } as i32,
        })
    }
}

impl SeedNamespace {
    /// The namespace as a `CreateNamespace` request carries it.
    ///
    /// # Errors
    /// If not exactly one backend is given, or a size does not parse.
    pub fn to_proto(&self) -> Result<pb::Namespace> {
        let size = |key: &str, v: &str| parse_size(v).with_context(|| key.to_string());
        if self.cluster.is_some() && self.rbd.is_none() {
            bail!("cluster goes with rbd = \"POOL/IMAGE\"");
        }
        const ONE_OF: &str =
            "give exactly one of ram, file, block_device, rbd, remote, null, volume";
        let others = [self.null.is_some(), self.volume.is_some()];
        let given = (&self.ram, &self.file, &self.block_device, &self.rbd);
        if others.iter().any(|o| *o) {
            let all = [
                self.ram.is_some(),
                self.file.is_some(),
                self.block_device.is_some(),
                self.rbd.is_some(),
                self.remote.is_some(),
            ];
            if all.iter().chain(&others).filter(|g| **g).count() != 1 {
                bail!("{ONE_OF}");
            }
            if self.size.is_some() {
                bail!("size goes with file");
            }
        }
        let backend = match (given, &self.remote) {
            _ if self.volume.is_some() => {
                pb::namespace::Backend::Volume(self.volume.clone().unwrap_or_default())
            }
            _ if self.null.is_some() => pb::namespace::Backend::Null(pb::NullBackend {
                size_bytes: size("null", self.null.as_deref().unwrap_or_default())?,
            }),
            ((None, None, None, None), Some(r)) => {
                pb::namespace::Backend::Remote(r.to_proto().context("remote")?)
            }
            (_, Some(_)) => bail!("{ONE_OF}"),
            ((Some(r), None, None, None), None) => pb::namespace::Backend::Ram(pb::RamBackend {
                size_bytes: size("ram", r)?,
            }),
            ((None, Some(f), None, None), None) => pb::namespace::Backend::File(pb::FileBackend {
                path: f.clone(),
                size_bytes: match &self.size {
                    Some(v) => size("size", v)?,
                    None => 0,
                },
            }),
            ((None, None, Some(b), None), None) => {
                pb::namespace::Backend::BlockDevice(pb::BlockDeviceBackend { path: b.clone() })
            }
            ((None, None, None, Some(r)), None) => {
                let (pool, image) = text::rbd_image(r)
                    .map_err(|e| anyhow::anyhow!(e))
                    .context("rbd")?;
                let Some(cluster) = &self.cluster else {
                    bail!("rbd needs cluster = \"ID\", a storage cluster's ID");
                };
                pb::namespace::Backend::Rbd(pb::RbdBackend {
                    cluster_id: cluster.clone(),
                    pool,
                    image,
                })
            }
            _ => bail!("{ONE_OF}"),
        };
        Ok(pb::Namespace {
            nsid: self.nsid.unwrap_or(0),
            backend: Some(backend),
            block_size: self.block_size.unwrap_or(0),
            uuid: self.uuid.clone().unwrap_or_default(),
            nguid: self.nguid.clone().unwrap_or_default(),
            qos: self.qos.as_ref().map(|q| q.to_proto("qos")).transpose()?,
            ..Default::default()
        })
    }
}

impl SeedVolume {
    /// The volume as a `CreateVolume` request carries it.
    ///
    /// # Errors
    /// If not exactly one store is given, or a size does not parse.
    pub fn to_proto(&self) -> Result<pb::Volume> {
        let size = |key: &str, v: &str| parse_size(v).with_context(|| key.to_string());
        if self.size.is_some() && self.file.is_none() {
            bail!("size goes with file");
        }
        let backend = match (&self.ram, &self.file, &self.block_device, &self.null) {
            (Some(r), None, None, None) => pb::volume::Backend::Ram(pb::RamBackend {
                size_bytes: size("ram", r)?,
            }),
            (None, Some(f), None, None) => pb::volume::Backend::File(pb::FileBackend {
                path: f.clone(),
                size_bytes: match &self.size {
                    Some(v) => size("size", v)?,
                    None => 0,
                },
            }),
            (None, None, Some(b), None) => {
                pb::volume::Backend::BlockDevice(pb::BlockDeviceBackend { path: b.clone() })
            }
            (None, None, None, Some(n)) => pb::volume::Backend::Null(pb::NullBackend {
                size_bytes: size("null", n)?,
            }),
            _ => bail!("give exactly one of ram, file, block_device, null"),
        };
        Ok(pb::Volume {
            backend: Some(backend),
            block_size: self.block_size.unwrap_or(0),
            uuid: self.uuid.clone().unwrap_or_default(),
            ..Default::default()
        })
    }
}

impl SeedQos {
    /// The limits as a request carries them; `at` (the key of this
    /// table) names a limit in errors. Unset limits are 0, none; the
    /// API checks each against its bound.
    ///
    /// # Errors
    /// A bandwidth that is neither a number of bytes nor a size.
    pub fn to_proto(&self, at: &str) -> Result<pb::QosLimits> {
        let bytes = |key: &str, v: &Option<TextOrNumber>| -> Result<u64> {
            let why = match v {
                None => return Ok(0),
                Some(TextOrNumber::Number(n)) => match u64::try_from(*n) {
                    Ok(b) => return Ok(b),
                    Err(_) => format!("{n} is not a number of bytes"),
                },
                Some(TextOrNumber::Text(t)) => match parse_size(t) {
                    Ok(b) => return Ok(b),
                    Err(e) => e.to_string(),
                },
            };
            bail!("{at}.{key}: {why} (bytes a second: a number, or a size such as \"200M\")")
        };
        Ok(pb::QosLimits {
            iops: self.iops.unwrap_or(0),
            read_iops: self.read_iops.unwrap_or(0),
            write_iops: self.write_iops.unwrap_or(0),
            bandwidth: bytes("bandwidth", &self.bandwidth)?,
            read_bandwidth: bytes("read_bandwidth", &self.read_bandwidth)?,
            write_bandwidth: bytes("write_bandwidth", &self.write_bandwidth)?,
        })
    }
}

impl SeedRemote {
    /// The remote backend as a `CreateNamespace` request carries it, with
    /// the DH-HMAC-CHAP secret read from `dhchap_secret_file` (trimmed).
    ///
    /// # Errors
    /// If the secret file cannot be read or is too long for a secret
    /// (naming the file, never quoting it).
    pub fn to_proto(&self) -> Result<pb::RemoteBackend> {
        let dhchap_secret = match &self.dhchap_secret_file {
            Some(path) => read_small(path, MAX_SECRET_FILE, "a secret")
                .context("dhchap_secret_file")?
                .trim()
                .to_string(),
            None => String::new(),
        };
        Ok(pb::RemoteBackend {
            paths: self.paths.clone(),
            subnqn: self.nqn.clone(),
            nsid: self.nsid,
            host_nqn: self.host_nqn.clone().unwrap_or_default(),
            dhchap_secret,
            dhchap_secret_set: false,
            io_timeout_ms: self.io_timeout_ms.unwrap_or(0),
            connect_timeout_ms: self.connect_timeout_ms.unwrap_or(0),
            queue_depth: self.queue_depth.unwrap_or(0),
        })
    }
}

impl SeedListener {
    /// The listener as a `CreateListener` request carries it.
    pub fn to_proto(&self) -> pb::Listener {
        pb::Listener {
            transport: match self.transport {
                SeedTransport::Tcp => pb::Transport::Tcp,
            } as i32,
            address: self.address.to_string(),
            port: u32::from(self.port),
            tenant: self.tenant.clone().unwrap_or_default(),
            secure_channel: match self.secure_channel {
                SecureChannel::None => pb::SecureChannel::Unspecified,
                SecureChannel::Allowed => pb::SecureChannel::Allowed,
                SecureChannel::Required => pb::SecureChannel::Required,
            } as i32,
            ..Default::default()
        }
    }
}

impl SeedAction {
    /// The action as a rule carries it.
    pub fn rule_action(self) -> pb::RuleAction {
        match self {
            Self::Allow => pb::RuleAction::Allow,
            Self::Deny => pb::RuleAction::Deny,
        }
    }

    /// The action as a tenant's default policy.
    pub fn policy(self) -> pb::DefaultPolicy {
        match self {
            Self::Allow => pb::DefaultPolicy::Allow,
            Self::Deny => pb::DefaultPolicy::Deny,
        }
    }
}

/// Parses an attachment in dpuctl's `--port` syntax:
/// `PORT[.VLAN][,mac=MAC][,ip=PREFIX]...` ([`dpu_proto::text`]).
///
/// # Errors
/// If the text is not of that form (the port ID, the VLAN's range and the
/// anti-spoofing entries are the API's to check).
pub fn parse_attachment(s: &str) -> Result<pb::Attachment> {
    text::port_attachment(s).map_err(|e| anyhow::anyhow!(e))
}

/// Parses an IP protocol: a name dpuctl's `--proto` takes, or a number.
fn parse_protocol(v: &TextOrNumber) -> Result<u32> {
    Ok(match v {
        TextOrNumber::Number(n) => {
            u32::try_from(*n).with_context(|| format!("{n} is not in 0..=255"))?
        }
        TextOrNumber::Text(t) => text::protocol(t).map_err(|e| anyhow::anyhow!(e))?,
    })
}

/// Parses a port range: a number, or text "PORT" or "FIRST-LAST" (the
/// range itself is the API's to check).
fn parse_ports(v: &TextOrNumber) -> Result<pb::PortRange> {
    match v {
        TextOrNumber::Number(n) => {
            let p = u32::try_from(*n).with_context(|| format!("{n} is not in 0..=65535"))?;
            Ok(pb::PortRange { first: p, last: p })
        }
        TextOrNumber::Text(t) => text::port_range(t).map_err(|e| anyhow::anyhow!(e)),
    }
}

/// The configuration key of a field the API names in a tenant or rule,
/// relative to the `[[tenants]]` or `[[tenants.rules]]` entry: the API's
/// `dst_prefix` is the configuration's `dst`, `dst_ports.first` its
/// `dport`, `attachments[1].port.vlan_id` its `attachments[1]`.
pub fn seed_key(api_field: &str) -> String {
    let (head, _) = api_field.split_once('.').unwrap_or((api_field, ""));
    match head {
        "src_prefix" => "src".into(),
        "dst_prefix" => "dst".into(),
        "src_ports" => "sport".into(),
        "dst_ports" => "dport".into(),
        "ip_protocol" => "proto".into(),
        h => h.into(),
    }
}

impl SeedTenant {
    /// The tenant as a `CreateTenant` request carries it; `at` names the
    /// entry in errors.
    ///
    /// # Errors
    /// If an attachment is not "PORT" or "PORT.VLAN".
    pub fn to_proto(&self, at: &str) -> Result<pb::Tenant> {
        let attachments = self
            .attachments
            .iter()
            .enumerate()
            .map(|(k, a)| parse_attachment(a).with_context(|| format!("{at}.attachments[{k}]")))
            .collect::<Result<_>>()?;
        Ok(pb::Tenant {
            display_name: self.display_name.clone().unwrap_or_default(),
            attachments,
            default_policy: self
                .default_policy
                .map_or(pb::DefaultPolicy::Unspecified, SeedAction::policy)
                as i32,
            no_offload: !self.offload,
            ..Default::default()
        })
    }
}

impl SeedRule {
    /// The rule as an `AddRule` request carries it; `at` names the entry
    /// in errors.
    ///
    /// # Errors
    /// If `proto`, `sport` or `dport` does not parse.
    pub fn to_proto(&self, at: &str) -> Result<pb::FilterRule> {
        Ok(pb::FilterRule {
            priority: self.priority,
            src_prefix: self.src.clone().unwrap_or_default(),
            dst_prefix: self.dst.clone().unwrap_or_default(),
            src_ports: self
                .sport
                .as_ref()
                .map(parse_ports)
                .transpose()
                .with_context(|| format!("{at}.sport"))?,
            dst_ports: self
                .dport
                .as_ref()
                .map(parse_ports)
                .transpose()
                .with_context(|| format!("{at}.dport"))?,
            ip_protocol: self
                .proto
                .as_ref()
                .map(parse_protocol)
                .transpose()
                .with_context(|| format!("{at}.proto"))?,
            icmp_type: self.icmp_type,
            icmp_code: self.icmp_code,
            action: self.action.rule_action() as i32,
            stateful: self.stateful,
            description: self.description.clone().unwrap_or_default(),
            rate_limit: match (&self.rate_limit, self.burst) {
                (Some(r), burst) => Some(pb::RateLimit {
                    burst: burst.unwrap_or(0),
                    ..text::rate_limit(r)
                        .map_err(|e| anyhow::anyhow!(e))
                        .with_context(|| format!("{at}.rate_limit"))?
                }),
                (None, Some(_)) => bail!("{at}.burst: needs rate_limit"),
                (None, None) => None,
            },
            name: String::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::tenant;
    use super::super::Config;
    use super::*;

    #[test]
    fn storage_declarations_parse() {
        let c: Config = toml::from_str(
            r#"
[storage]
ram_limit = "1GiB"
discovery_listen = "127.0.0.1:8009"
file_dirs = ["/srv/volumes"]
block_devices = ["/dev/nvme*n1"]

[[storage.subsystems]]
id = "vol1"
nqn = "nqn.2024-01.io.example:vol1"
serial_number = "SN1"
model_number = "M1"
allowed_hosts = ["nqn.2014-08.org.nvmexpress:uuid:h"]
max_namespaces = 8

[storage.subsystems.host_qos."nqn.2014-08.org.nvmexpress:uuid:h"]
read_iops = 100
bandwidth = 1048576

[[storage.subsystems.namespaces]]
nsid = 2
ram = "256MiB"
block_size = 4096
uuid = "123e4567-e89b-12d3-a456-426614174000"
nguid = "00112233445566778899aabbccddeeff"
qos = { iops = 1000, read_bandwidth = "200M" }

[[storage.subsystems.namespaces]]
file = "/srv/volumes/disk.img"
size = "1GiB"

[[storage.subsystems.namespaces]]
block_device = "/dev/nvme0n1"

[[storage.subsystems.listeners]]
id = "data"
address = "192.0.2.10"
port = 4420
transport = "tcp"

[[storage.subsystems.listeners]]
address = "::1"
port = 4421

[[storage.subsystems]]
id = "vol2"
nqn = "nqn.2024-01.io.example:vol2"
allow_any_host = true
"#,
        )
        .unwrap();
        c.validate().unwrap();
        let st = &c.storage;
        assert_eq!(st.discovery_listen, Some("127.0.0.1:8009".parse().unwrap()));
        assert_eq!(st.subsystems.len(), 2);
        let v1 = &st.subsystems[0];
        assert!(!v1.allow_any_host, "no host unless allowed");
        assert_eq!(v1.max_namespaces, Some(8));
        let p = v1.to_proto();
        assert_eq!(
            (p.serial_number.as_str(), p.model_number.as_str()),
            ("SN1", "M1")
        );
        assert_eq!(p.allowed_hosts, ["nqn.2014-08.org.nvmexpress:uuid:h"]);
        let n = v1.namespaces[0].to_proto().unwrap();
        assert_eq!((n.nsid, n.block_size), (2, 4096));
        assert_eq!(
            n.backend,
            Some(pb::namespace::Backend::Ram(pb::RamBackend {
                size_bytes: 256 << 20
            }))
        );
        assert_eq!(n.uuid, "123e4567-e89b-12d3-a456-426614174000");
        assert_eq!(
            n.qos,
            Some(pb::QosLimits {
                iops: 1_000,
                read_bandwidth: 200 << 20,
                ..Default::default()
            })
        );
        assert_eq!(v1.namespaces[1].to_proto().unwrap().qos, None);
        let host = &v1.host_qos["nqn.2014-08.org.nvmexpress:uuid:h"];
        assert_eq!(
            host.to_proto("qos").unwrap(),
            pb::QosLimits {
                read_iops: 100,
                bandwidth: 1 << 20,
                ..Default::default()
            }
        );
        assert_eq!(
            v1.namespaces[1].to_proto().unwrap().backend,
            Some(pb::namespace::Backend::File(pb::FileBackend {
                path: "/srv/volumes/disk.img".into(),
                size_bytes: 1 << 30
            }))
        );
        let n = v1.namespaces[2].to_proto().unwrap();
        assert_eq!((n.nsid, n.block_size), (0, 0), "left to the API's defaults");
        assert_eq!(v1.listeners[0].id.as_deref(), Some("data"));
        let l = v1.listeners[1].to_proto();
        assert_eq!(l.transport, pb::Transport::Tcp as i32, "tcp by default");
        assert_eq!((l.address.as_str(), l.port), ("::1", 4421));
        let v2 = &st.subsystems[1];
        assert!(v2.allow_any_host);
        assert!(v2.namespaces.is_empty() && v2.listeners.is_empty());
        let p = v2.to_proto();
        assert_eq!((p.serial_number.as_str(), p.max_namespaces), ("", 0));

        let empty: Config = toml::from_str("[storage]\n").unwrap();
        empty.validate().unwrap();
        assert!(empty.storage.discovery_listen.is_none());
        assert!(empty.storage.subsystems.is_empty());
    }

    #[test]
    fn tenant_declarations_parse() {
        let c: Config = toml::from_str(&tenant(
            "display_name = \"T\"\ndefault_policy = \"allow\"\nattachments = [\"pf0vf0\", \"p0.100\", \"p0.200\"]",
            r#"
[[tenants.rules]]
id = "web"
priority = 10
action = "allow"
src = "10.0.0.0/8"
dst = "10.1.0.0/16"
proto = "tcp"
sport = 1024
dport = "80-443"
stateful = true
description = "web"

[[tenants.rules]]
priority = 20
action = "deny"
proto = 1
icmp_type = 8
icmp_code = 0

[[tenants]]
id = "u"
attachments = ["pf0vf1"]
"#,
        ))
        .unwrap();
        c.validate().unwrap();
        let [t, u] = &c.tenants[..] else {
            panic!("two tenants")
        };
        let p = t.to_proto("t").unwrap();
        assert_eq!(p.display_name, "T");
        assert_eq!(p.default_policy, pb::DefaultPolicy::Allow as i32);
        let atts: Vec<(String, u32)> = p
            .attachments
            .iter()
            .map(|a| match &a.kind {
                Some(pb::attachment::Kind::Port(p)) => (p.port.clone(), p.vlan_id),
                k => panic!("{k:?}"),
            })
            .collect();
        assert_eq!(
            atts,
            [
                ("ports/pf0vf0".to_string(), 0),
                ("ports/p0".to_string(), 100),
                ("ports/p0".to_string(), 200)
            ]
        );
        let web = t.rules[0].to_proto("r").unwrap();
        assert_eq!(web.priority, 10);
        assert_eq!(web.action, pb::RuleAction::Allow as i32);
        assert_eq!(
            (web.src_prefix.as_str(), web.dst_prefix.as_str()),
            ("10.0.0.0/8", "10.1.0.0/16")
        );
        assert_eq!(web.ip_protocol, Some(6));
        assert_eq!(
            web.src_ports,
            Some(pb::PortRange {
                first: 1024,
                last: 1024
            })
        );
        assert_eq!(
            web.dst_ports,
            Some(pb::PortRange {
                first: 80,
                last: 443
            })
        );
        assert!(web.stateful);
        assert_eq!(web.description, "web");
        let deny = t.rules[1].to_proto("r").unwrap();
        assert_eq!(deny.action, pb::RuleAction::Deny as i32);
        assert_eq!(
            (deny.ip_protocol, deny.icmp_type, deny.icmp_code),
            (Some(1), Some(8), Some(0))
        );
        assert_eq!((deny.src_prefix.as_str(), deny.src_ports), ("", None));
        assert!(!deny.stateful);
        let p = u.to_proto("u").unwrap();
        assert_eq!(
            p.default_policy,
            pb::DefaultPolicy::Unspecified as i32,
            "left to the API: deny"
        );
        assert!(u.rules.is_empty());
        for (name, n) in [
            ("udp", 17),
            ("ICMPv6", 58),
            ("ipv6-icmp", 58),
            ("sctp", 132),
            ("47", 47),
        ] {
            assert_eq!(parse_protocol(&TextOrNumber::Text(name.into())).unwrap(), n);
        }
        assert!(Config::default().tenants.is_empty());
    }
}
