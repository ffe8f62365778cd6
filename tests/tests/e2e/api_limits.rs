//! The API's caps and message bounds through the real binary: a
//! `ReplaceRules` of the largest size the service takes, full of 2-byte
//! empty rules, is refused naming the limit without the service's memory
//! growing by more than the message; configured caps refuse with
//! `RESOURCE_EXHAUSTED` naming their key; a `CreateSubsystem` with more
//! allowed hosts than a subsystem takes is refused before decoding too.

use anyhow::{Context, Result};
use dpu_client::{pb, tenant_name, ClientConfig, ClientError, DpuClient};
use dpu_e2e::{rss_kib, Service, TEST_CONFIG};
use prost::bytes::{Buf, BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Code;

/// Sends pre-encoded request messages and ignores what comes back, so a
/// test can send a request no prost struct in this process ever holds.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = ();
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = ();
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        let n = src.remaining();
        src.advance(n);
        Ok(Some(()))
    }
}

/// Calls `method` with the encoded request `msg`.
async fn raw_call(svc: &Service, method: &'static str, msg: Bytes) -> Result<tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(svc.endpoint())?
        .connect()
        .await?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(method);
    match grpc
        .unary::<Bytes, (), _>(tonic::Request::new(msg), path, RawCodec)
        .await
    {
        Ok(_) => anyhow::bail!("{method} was accepted"),
        Err(s) => Ok(s),
    }
}

/// `ReplaceRulesRequest { parent: "tenants/big", rules: [{}; n] }`, with
/// `n` as large as fits in `bytes` bytes.
fn empty_rules(bytes: usize) -> (Bytes, usize) {
    let parent = b"tenants/big";
    let mut m = Vec::with_capacity(bytes);
    m.push(0x0a);
    m.push(u8::try_from(parent.len()).unwrap_or(0));
    m.extend_from_slice(parent);
    let n = (bytes - m.len()) / 2;
    for _ in 0..n {
        m.extend_from_slice(&[0x12, 0x00]);
    }
    (Bytes::from(m), n)
}

async fn client(svc: &Service) -> Result<DpuClient> {
    Ok(DpuClient::connect(ClientConfig {
        endpoint: svc.endpoint(),
        ..ClientConfig::default()
    })
    .await?)
}

/// The largest `ReplaceRules` the service takes (65,536 rules of 1 KiB and
/// 64 KiB more: 64.06 MiB), holding 33.5 million empty rules, is refused
/// naming `limits.max_rules_per_tenant`, and the service's peak memory
/// grows by a few times the message, not by the gigabytes decoding those
/// rules would take. One byte more is refused for its size.
#[tokio::test]
async fn a_maximal_replace_rules_is_refused_without_decoding_it() -> Result<()> {
    let svc = Service::start()?;
    let c = client(&svc).await?;
    c.create_tenant(pb::CreateTenantRequest {
        tenant_id: "big".into(),
        tenant: Some(pb::Tenant::default()),
    })
    .await?;
    let pid = svc.pid().context("the service's pid")?;
    let (peak_before, _) = rss_kib(pid)?;

    let max = 64 * 1024 + 65_536 * 1024;
    let (msg, n) = empty_rules(max);
    assert!(n > 33_000_000, "{n} rules");
    let s = raw_call(&svc, "/dpu.v1.FilterService/ReplaceRules", msg).await?;
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert!(
        s.message().contains(&format!("{n} entries in rules"))
            && s.message().contains("limits.max_rules_per_tenant"),
        "{}",
        s.message()
    );
    let (peak_after, now) = rss_kib(pid)?;
    let grown_mib = (peak_after.saturating_sub(peak_before)) / 1024;
    eprintln!(
        "peak RSS {} MiB before, {} MiB after ({grown_mib} MiB more), now {} MiB",
        peak_before / 1024,
        peak_after / 1024,
        now / 1024
    );
    // The message is 64 MiB; held once by the transport and once for the
    // count. Decoding 33 million rules would take several GiB.
    assert!(grown_mib < 512, "peak RSS grew by {grown_mib} MiB");

    let (msg, _) = empty_rules(max + 1);
    let s = raw_call(&svc, "/dpu.v1.FilterService/ReplaceRules", msg).await?;
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert!(
        s.message().contains(&format!("{max} bytes")),
        "{}",
        s.message()
    );

    // Both refusals are counted.
    let (_, metrics) = svc.http_get("/metrics")?;
    let line = "dpu_grpc_requests_total{method=\"/dpu.v1.FilterService/ReplaceRules\",\
                code=\"ResourceExhausted\"} 2";
    assert!(metrics.contains(line), "{metrics}");

    // The service is unharmed and the tenant's rules untouched.
    let t = c
        .list_rules(pb::ListRulesRequest {
            parent: tenant_name("big"),
            ..Default::default()
        })
        .await?;
    assert_eq!((t.rules.len(), t.rule_set_version), (0, 0));
    Ok(())
}

/// Asserts that `r` was refused with `RESOURCE_EXHAUSTED` naming `key`.
fn exhausted<T: std::fmt::Debug>(r: Result<T, ClientError>, key: &str) {
    let e = r.expect_err("refused");
    assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
    assert!(e.to_string().contains(key), "{e}");
}

/// Small caps from `[limits]` refuse tenants, rules, attachments and
/// subsystems past them with `RESOURCE_EXHAUSTED` naming the key.
#[tokio::test]
async fn configured_caps_name_their_keys() -> Result<()> {
    let config = format!(
        "{TEST_CONFIG}\n[limits]\nmax_tenants = 2\nmax_rules_per_tenant = 3\nmax_rules = 4\n\
         max_attachments_per_tenant = 1\nmax_subsystems = 1\n"
    );
    let svc = Service::start_config(&config, &[])?;
    let c = client(&svc).await?;
    let port = |p: &str| pb::Attachment {
        kind: Some(pb::attachment::Kind::Port(pb::PortAttachment {
            port: format!("ports/{p}"),
            ..Default::default()
        })),
    };
    let create = |id: &str, atts: Vec<pb::Attachment>| pb::CreateTenantRequest {
        tenant_id: id.into(),
        tenant: Some(pb::Tenant {
            attachments: atts,
            ..Default::default()
        }),
    };
    exhausted(
        c.create_tenant(create("a", vec![port("pf0vf0"), port("pf0vf1")]))
            .await,
        "limits.max_attachments_per_tenant",
    );
    c.create_tenant(create("a", vec![port("pf0vf0")])).await?;
    c.create_tenant(create("b", vec![])).await?;
    exhausted(
        c.create_tenant(create("c", vec![])).await,
        "limits.max_tenants",
    );
    let rule = |p: u32| pb::FilterRule {
        priority: p,
        action: pb::RuleAction::Allow as i32,
        ..Default::default()
    };
    let replace = |t: &str, n: u32| pb::ReplaceRulesRequest {
        parent: tenant_name(t),
        rules: (1..=n).map(rule).collect(),
        expected_version: None,
    };
    exhausted(
        c.replace_rules(replace("a", 4)).await,
        "limits.max_rules_per_tenant",
    );
    c.replace_rules(replace("a", 3)).await?;
    c.replace_rules(replace("b", 1)).await?;
    exhausted(c.replace_rules(replace("b", 2)).await, "limits.max_rules");
    exhausted(
        c.add_rule(pb::AddRuleRequest {
            parent: tenant_name("b"),
            rule: Some(rule(9)),
            ..Default::default()
        })
        .await,
        "limits.max_rules",
    );
    let sub = |id: &str| pb::CreateSubsystemRequest {
        subsystem_id: id.into(),
        subsystem: Some(pb::Subsystem {
            nqn: format!("nqn.2024-01.io.example:{id}"),
            allow_any_host: true,
            ..Default::default()
        }),
    };
    c.create_subsystem(sub("s1")).await?;
    exhausted(c.create_subsystem(sub("s2")).await, "limits.max_subsystems");
    // The message bound follows the cap: 3 rules of 1 KiB and 64 KiB.
    let (msg, _) = empty_rules(64 * 1024 + 3 * 1024 + 1);
    let s = raw_call(&svc, "/dpu.v1.FilterService/ReplaceRules", msg).await?;
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    Ok(())
}

/// `CreateSubsystemRequest { subsystem_id: "many", subsystem: {
/// allowed_hosts: [""; n] } }`: 2 bytes a host.
fn empty_hosts(n: usize) -> Bytes {
    let mut sub = prost::Message::encode_to_vec(&pb::Subsystem {
        nqn: "nqn.2024-01.io.example:many".into(),
        allow_any_host: true,
        ..Default::default()
    });
    for _ in 0..n {
        sub.extend_from_slice(&[0x32, 0x00]);
    }
    let mut m = b"\x0a\x04many\x12".to_vec();
    prost::encoding::encode_varint(sub.len() as u64, &mut m);
    m.extend_from_slice(&sub);
    Bytes::from(m)
}

/// A `CreateSubsystem` of 150,000 empty host names (300 KB, within the
/// size the storage service takes) is refused with `INVALID_ARGUMENT`
/// naming `subsystem.allowed_hosts`, as its check after decoding would
/// refuse it, and creates nothing; so is an update mask of 17 paths.
#[tokio::test]
async fn too_many_hosts_are_refused_without_decoding_them() -> Result<()> {
    let svc = Service::start()?;
    let c = client(&svc).await?;
    let s = raw_call(
        &svc,
        "/dpu.v1.StorageService/CreateSubsystem",
        empty_hosts(150_000),
    )
    .await?;
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(
        s.message()
            .starts_with("subsystem.allowed_hosts: 150000 entries; at most 1024"),
        "{}",
        s.message()
    );
    let (_, metrics) = svc.http_get("/metrics")?;
    let line = "dpu_grpc_requests_total{method=\"/dpu.v1.StorageService/CreateSubsystem\",\
                code=\"InvalidArgument\"} 1";
    assert!(metrics.contains(line), "{metrics}");
    // UpdateSubsystemRequest { subsystem: {}, update_mask: { paths: [""; 17] } }
    let mut mask = vec![];
    for _ in 0..17 {
        mask.extend_from_slice(&[0x0a, 0x00]);
    }
    let mut m = vec![0x0a, 0x00, 0x12, u8::try_from(mask.len())?];
    m.extend_from_slice(&mask);
    let s = raw_call(
        &svc,
        "/dpu.v1.StorageService/UpdateSubsystem",
        Bytes::from(m),
    )
    .await?;
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(
        s.message().starts_with("update_mask.paths"),
        "{}",
        s.message()
    );
    let subs = c
        .list_subsystems(pb::ListSubsystemsRequest::default())
        .await?;
    assert!(subs.subsystems.is_empty(), "{subs:?}");
    Ok(())
}
