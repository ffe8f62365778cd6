//! How big a request each service takes, and the repeated fields counted
//! before a request is decoded.
//!
//! Decoding costs more memory than the wire: an empty `FilterRule` is 2
//! bytes on the wire and about 190 once decoded, so a size limit
//! alone lets a 64 MiB `ReplaceRules` become gigabytes. Two bounds close
//! that:
//!
//! - each service's largest message ([`request_bytes`]) is what its
//!   largest valid request needs under the configured [`Limits`] (tonic's
//!   `max_decoding_message_size`), and
//! - [`Bounded`] wraps a service and, for the methods whose requests carry
//!   lists (`ReplaceRules`, `CreateTenant`, `UpdateTenant`,
//!   `CreateSubsystem`, `UpdateSubsystem`, `UpdateCluster`, `SetHostAuth`: rules,
//!   attachments and their guard, VTEP and underlay entries, allowed hosts,
//!   update-mask paths, the DH-HMAC-CHAP lists and the output-only
//!   `host_auth`, `host_qos` and `host_tls`), reads the request (within that size) and counts every
//!   list's entries on the wire ([`count`], no allocation) before tonic
//!   decodes it; a request with more than the caps allow is refused, with
//!   `RESOURCE_EXHAUSTED` naming the configuration key for a configured
//!   cap and `INVALID_ARGUMENT` naming the field for a fixed one of the
//!   lists that the checks after decoding answer so (allowed hosts, mask
//!   paths), and nothing of it is decoded.
//!
//! What is decoded is then at most the caps' number of entries plus the
//! bytes of the message itself; and since [`Bounded`] serves at most
//! [`LARGE_REQUESTS_AT_ONCE`] requests larger than [`SMALL_REQUEST`] of
//! its service at a time (the others wait, within
//! [`REQUEST_READ_TIMEOUT`]), many clients sending large requests at once
//! do not multiply it.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use prost::bytes::{Buf, BytesMut};
use prost::encoding::{decode_key, decode_varint, WireType};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::codegen::{http, BoxFuture, Bytes, Service};
use tonic::server::NamedService;
use tonic::Status;

use dpu_nvmeof::auth::{DhGroup, HashId};

use crate::error::ControlError;
use crate::state::Limits;
use crate::telemetry::Telemetry;
use crate::validate::{MAX_GUARD_ENTRIES, MAX_HOSTS_PER_SUBSYSTEM, MAX_REMOTE_VTEPS};

/// Largest request of a service whose requests hold no long lists
/// (`InfoService`, `PortService`, `TelemetryService`), and the room every
/// other service has besides its lists.
pub const SMALL_REQUEST: usize = 64 << 10;

/// Wire bytes one valid `FilterRule` takes at most, with its tag and
/// length in a list: the longest name (141 bytes), two IPv6 prefixes,
/// port ranges, ICMP fields, a 256-byte description and a rate limit come
/// to about 600; the rest is room for fields added later.
pub const RULE_BYTES: usize = 1024;

/// Wire bytes one valid `Attachment` takes at most, with its tag and
/// length in a list: a port attachment with 64 MAC addresses and 64 IPv6
/// prefixes comes to about 4,400; the rest is room for fields added later.
pub const ATTACHMENT_BYTES: usize = 8 << 10;

/// Wire bytes one allowed host NQN takes at most (223 bytes, tag, length).
const HOST_BYTES: usize = 256;

/// The largest message the service called `service` (as in
/// `dpu.v1.FilterService`) accepts under `limits`: what its largest valid
/// request needs.
pub fn request_bytes(service: &str, limits: &Limits) -> usize {
    let lists = match service {
        "dpu.v1.FilterService" => limits.rules_per_tenant.saturating_mul(RULE_BYTES),
        "dpu.v1.TenantService" => limits
            .attachments_per_tenant
            .saturating_mul(ATTACHMENT_BYTES),
        "dpu.v1.StorageService" => MAX_HOSTS_PER_SUBSYSTEM * HOST_BYTES,
        _ => 0,
    };
    SMALL_REQUEST.saturating_add(lists)
}

/// A repeated field of one method's request, counted before decoding.
struct Counted {
    /// The method's path, `/dpu.v1.FilterService/ReplaceRules`.
    method: &'static str,
    /// Field numbers from the request down to the repeated field; every
    /// occurrence of the last one, in every message the others lead to,
    /// counts.
    path: &'static [u32],
    /// The field, as an error names it.
    field: &'static str,
    /// The most entries allowed.
    max: fn(&Limits) -> Cap,
}

/// How many entries a counted field may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cap {
    /// At most this many, by the configuration key named: more is
    /// `RESOURCE_EXHAUSTED`.
    Limit(usize, &'static str),
    /// At most this many, fixed by the API: more is `INVALID_ARGUMENT`.
    Fixed(usize),
}

fn rules(l: &Limits) -> Cap {
    Cap::Limit(l.rules_per_tenant, "limits.max_rules_per_tenant")
}

fn attachments(l: &Limits) -> Cap {
    Cap::Limit(
        l.attachments_per_tenant,
        "limits.max_attachments_per_tenant",
    )
}

/// Guard, VTEP or underlay entries of all attachments of a tenant.
fn attachment_entries(l: &Limits) -> Cap {
    let per = MAX_GUARD_ENTRIES.max(MAX_REMOTE_VTEPS);
    Cap::Limit(
        l.attachments_per_tenant.saturating_mul(per),
        "limits.max_attachments_per_tenant",
    )
}

/// Allowed hosts of one subsystem.
fn hosts(_: &Limits) -> Cap {
    Cap::Fixed(MAX_HOSTS_PER_SUBSYSTEM)
}

/// Most paths an update mask may name: each update names a few fields
/// (three at most today), repeats are harmless, thousands are not.
pub const MAX_MASK_PATHS: usize = 16;

fn mask_paths(_: &Limits) -> Cap {
    Cap::Fixed(MAX_MASK_PATHS)
}

/// `CreateTenantRequest.tenant` is 2, `UpdateTenantRequest.tenant` 1;
/// `Tenant.attachments` 3; `Attachment.port` 1 with `allowed_macs` 3 and
/// `allowed_source_prefixes` 4; `Attachment.vxlan` 2 with `remote_vteps`
/// 3 and `underlay_prefixes` 4; `ReplaceRulesRequest.rules` 2;
/// `CreateSubsystemRequest.subsystem` 2, `UpdateSubsystemRequest.subsystem`
/// 1, `Subsystem.allowed_hosts` 6; `update_mask` 2 of both update
/// requests, `FieldMask.paths` 1. The tests check these against prost.
const COUNTED: &[Counted] = &[
    Counted {
        method: "/dpu.v1.FilterService/ReplaceRules",
        path: &[2],
        field: "rules",
        max: rules,
    },
    Counted {
        method: "/dpu.v1.TenantService/CreateTenant",
        path: &[2, 3],
        field: "tenant.attachments",
        max: attachments,
    },
    Counted {
        method: "/dpu.v1.TenantService/CreateTenant",
        path: &[2, 3, 1, 3],
        field: "tenant.attachments[].port.allowed_macs",
        max: attachment_entries,
    },
    Counted {
        method: "/dpu.v1.TenantService/CreateTenant",
        path: &[2, 3, 1, 4],
        field: "tenant.attachments[].port.allowed_source_prefixes",
        max: attachment_entries,
    },
    Counted {
        method: "/dpu.v1.TenantService/CreateTenant",
        path: &[2, 3, 2, 3],
        field: "tenant.attachments[].vxlan.remote_vteps",
        max: attachment_entries,
    },
    Counted {
        method: "/dpu.v1.TenantService/CreateTenant",
        path: &[2, 3, 2, 4],
        field: "tenant.attachments[].vxlan.underlay_prefixes",
        max: attachment_entries,
    },
    Counted {
        method: "/dpu.v1.TenantService/UpdateTenant",
        path: &[1, 3],
        field: "tenant.attachments",
        max: attachments,
    },
    Counted {
        method: "/dpu.v1.TenantService/UpdateTenant",
        path: &[1, 3, 1, 3],
        field: "tenant.attachments[].port.allowed_macs",
        max: attachment_entries,
    },
    Counted {
        method: "/dpu.v1.TenantService/UpdateTenant",
        path: &[1, 3, 1, 4],
        field: "tenant.attachments[].port.allowed_source_prefixes",
        max: attachment_entries,
    },
    Counted {
        method: "/dpu.v1.TenantService/UpdateTenant",
        path: &[1, 3, 2, 3],
        field: "tenant.attachments[].vxlan.remote_vteps",
        max: attachment_entries,
    },
    Counted {
        method: "/dpu.v1.TenantService/UpdateTenant",
        path: &[1, 3, 2, 4],
        field: "tenant.attachments[].vxlan.underlay_prefixes",
        max: attachment_entries,
    },
    Counted {
        method: "/dpu.v1.TenantService/UpdateTenant",
        path: &[2, 1],
        field: "update_mask.paths",
        max: mask_paths,
    },
    Counted {
        method: "/dpu.v1.StorageService/CreateSubsystem",
        path: &[2, 6],
        field: "subsystem.allowed_hosts",
        max: hosts,
    },
    Counted {
        method: "/dpu.v1.StorageService/UpdateSubsystem",
        path: &[1, 6],
        field: "subsystem.allowed_hosts",
        max: hosts,
    },
    Counted {
        method: "/dpu.v1.StorageService/UpdateSubsystem",
        path: &[2, 1],
        field: "update_mask.paths",
        max: mask_paths,
    },
    Counted {
        method: "/dpu.v1.StorageService/CreateSubsystem",
        path: &[2, 12],
        field: "subsystem.host_auth",
        max: host_auth,
    },
    Counted {
        method: "/dpu.v1.StorageService/UpdateSubsystem",
        path: &[1, 12],
        field: "subsystem.host_auth",
        max: host_auth,
    },
    Counted {
        method: "/dpu.v1.StorageService/CreateSubsystem",
        path: &[2, 13],
        field: "subsystem.host_qos",
        max: host_auth,
    },
    Counted {
        method: "/dpu.v1.StorageService/UpdateSubsystem",
        path: &[1, 13],
        field: "subsystem.host_qos",
        max: host_auth,
    },
    Counted {
        method: "/dpu.v1.StorageService/CreateSubsystem",
        path: &[2, 15],
        field: "subsystem.host_tls",
        max: host_auth,
    },
    Counted {
        method: "/dpu.v1.StorageService/UpdateSubsystem",
        path: &[1, 15],
        field: "subsystem.host_tls",
        max: host_auth,
    },
    Counted {
        method: "/dpu.v1.StorageService/UpdateCluster",
        path: &[2, 1],
        field: "update_mask.paths",
        max: mask_paths,
    },
    Counted {
        method: "/dpu.v1.StorageService/SetHostAuth",
        path: &[2, 4],
        field: "auth.hashes",
        max: auth_hashes,
    },
    Counted {
        method: "/dpu.v1.StorageService/SetHostAuth",
        path: &[2, 5],
        field: "auth.dh_groups",
        max: auth_dh_groups,
    },
];

/// `Subsystem.host_auth` (12), `Subsystem.host_qos` (13) and
/// `Subsystem.host_tls` (15) are output only; what a request carries of them is refused by the service, and
/// counted here so that neither can decode to more entries than a
/// subsystem has hosts.
fn host_auth(_: &Limits) -> Cap {
    Cap::Limit(MAX_HOSTS_PER_SUBSYSTEM, "hosts per subsystem")
}

/// `HostAuth.hashes` (4): one entry per hash function.
fn auth_hashes(_: &Limits) -> Cap {
    Cap::Limit(HashId::ALL.len(), "DH-HMAC-CHAP hash functions")
}

/// `HostAuth.dh_groups` (5): one entry per DH group.
fn auth_dh_groups(_: &Limits) -> Cap {
    Cap::Limit(DhGroup::ALL.len(), "DH-HMAC-CHAP DH groups")
}

/// Why a message could not be walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// Counts, without decoding or allocating, the occurrences of the field
/// `path` leads to in the protobuf message `msg`: `path[0]` is a field of
/// `msg`, each further number a field of the message before it. Unknown
/// fields are skipped as a decoder would; a field that repeats a
/// non-repeated message merges into it, so its entries count too.
///
/// # Errors
/// [`Malformed`] if `msg` is not well-formed protobuf (a truncated
/// field, a group, a length past the end).
pub fn count(msg: &[u8], path: &[u32]) -> Result<u64, Malformed> {
    let Some((&first, rest)) = path.split_first() else {
        return Ok(0);
    };
    let mut buf = msg;
    let mut n = 0u64;
    while buf.has_remaining() {
        let (tag, wire) = decode_key(&mut buf).map_err(|_| Malformed)?;
        let hit = tag == first;
        match wire {
            WireType::Varint => {
                decode_varint(&mut buf).map_err(|_| Malformed)?;
                n += u64::from(hit && rest.is_empty());
            }
            WireType::SixtyFourBit | WireType::ThirtyTwoBit => {
                let len = if wire == WireType::SixtyFourBit { 8 } else { 4 };
                if buf.remaining() < len {
                    return Err(Malformed);
                }
                buf.advance(len);
                n += u64::from(hit && rest.is_empty());
            }
            WireType::LengthDelimited => {
                let len = decode_varint(&mut buf).map_err(|_| Malformed)?;
                let len = usize::try_from(len).map_err(|_| Malformed)?;
                if buf.len() < len {
                    return Err(Malformed);
                }
                let (field, tail) = buf.split_at(len);
                if hit {
                    n = n.saturating_add(if rest.is_empty() {
                        1
                    } else {
                        count(field, rest)?
                    });
                }
                buf = tail;
            }
            WireType::StartGroup | WireType::EndGroup => return Err(Malformed),
        }
    }
    Ok(n)
}

/// Checks the gRPC frame `frame` of a call to `method` against the
/// counted fields of that method.
fn check(method: &str, frame: &[u8], limits: &Limits) -> Result<(), Status> {
    // A frame: compressed flag, 4-byte length, message. Compressed
    // messages are refused by tonic (this server accepts none); a frame
    // that does not parse is tonic's to refuse too.
    let Some((&0, rest)) = frame.split_first() else {
        return Ok(());
    };
    let Some((len, msg)) = rest.split_first_chunk::<4>() else {
        return Ok(());
    };
    let Some(msg) = usize::try_from(u32::from_be_bytes(*len))
        .ok()
        .and_then(|len| msg.get(..len))
    else {
        return Ok(());
    };
    for c in COUNTED.iter().filter(|c| c.method == method) {
        let n = count(msg, c.path).map_err(|Malformed| {
            Status::invalid_argument("the request is not a well-formed protobuf message")
        })?;
        let over = |max: usize| n > u64::try_from(max).unwrap_or(u64::MAX);
        match (c.max)(limits) {
            Cap::Limit(max, limit) if over(max) => {
                return Err(ControlError::exhausted(
                    limit,
                    max,
                    format!("{n} entries in {}", c.field),
                )
                .into())
            }
            Cap::Fixed(max) if over(max) => {
                return Err(
                    ControlError::invalid(c.field, format!("{n} entries; at most {max}")).into(),
                )
            }
            Cap::Limit(..) | Cap::Fixed(_) => {}
        }
    }
    Ok(())
}

/// How many requests of one service larger than [`SMALL_REQUEST`] are
/// read and served at once; the others wait. Each may hold its message
/// twice (read here, then decoded by tonic) and what it decodes to, so
/// this bounds what large requests can make the service allocate, however
/// many clients send them.
pub const LARGE_REQUESTS_AT_ONCE: usize = 2;

/// How long a request may take to arrive, waiting for its turn included;
/// a client that sends slower is refused, so it cannot hold a turn.
pub const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A gRPC service (a tonic server) whose requests are held to
/// [`request_bytes`], at most `LARGE_REQUESTS_AT_ONCE` of them larger
/// than [`SMALL_REQUEST`] at once, read within `REQUEST_READ_TIMEOUT`,
/// and, for the methods with counted lists, counted before the service
/// decodes them. Wrap the generated server built with the same
/// `max_decoding_message_size`. Refusals of the counted methods are
/// counted with the service's other requests
/// ([`Telemetry::observe_request`]).
#[derive(Debug, Clone)]
pub struct Bounded<S> {
    inner: S,
    limits: Limits,
    max_bytes: usize,
    large: Arc<Semaphore>,
    telemetry: Arc<Telemetry>,
}

impl<S: NamedService> Bounded<S> {
    /// Wraps `inner`, whose requests may be [`request_bytes`] long under
    /// `limits`, counting refusals in `telemetry`.
    pub fn new(inner: S, limits: Limits, telemetry: Arc<Telemetry>) -> Self {
        Bounded {
            inner,
            max_bytes: request_bytes(S::NAME, &limits),
            limits,
            large: Arc::new(Semaphore::new(LARGE_REQUESTS_AT_ONCE)),
            telemetry,
        }
    }
}

impl<S: NamedService> NamedService for Bounded<S> {
    const NAME: &'static str = S::NAME;
}

/// Why a request's body was not read.
enum Unread {
    /// It is longer than the service takes.
    TooLarge,
    /// The transport failed.
    Failed(String),
}

/// Reads a request's body, at most `max` bytes of it: the first
/// [`SMALL_REQUEST`] bytes at once, the rest once `large` grants a turn,
/// which is answered with the bytes and held until the request is served.
async fn read_body(
    mut body: Body,
    max: usize,
    large: &Arc<Semaphore>,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Unread> {
    let mut buf = BytesMut::new();
    let mut turn = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Unread::Failed(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let len = buf.len().saturating_add(data.len());
        if len > max {
            return Err(Unread::TooLarge);
        }
        if len > SMALL_REQUEST && turn.is_none() {
            // Never closed: the semaphore lives as long as the service.
            turn = Some(
                large
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|e| Unread::Failed(e.to_string()))?,
            );
        }
        buf.extend_from_slice(&data);
    }
    Ok((buf.freeze(), turn))
}

impl<S> Service<http::Request<Body>> for Bounded<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<http::Response<Body>, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // The readied service answers this call; the clone waits for the next.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let (limits, max_bytes) = (self.limits, self.max_bytes);
        let large = self.large.clone();
        let telemetry = self.telemetry.clone();
        let counted = COUNTED
            .iter()
            .map(|c| c.method)
            .find(|m| *m == req.uri().path());
        let refuse = move |status: Status| {
            if let Some(method) = counted {
                telemetry.observe_request(method, status.code());
            }
            tracing::debug!(method = ?counted, error = %status.message(), "refused before decoding");
            Ok(status.into_http())
        };
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            // The frame's 5-byte header on top of the message.
            let read = read_body(body, max_bytes.saturating_add(5), &large);
            let (frame, turn) = match tokio::time::timeout(REQUEST_READ_TIMEOUT, read).await {
                Ok(Ok(read)) => read,
                Ok(Err(Unread::TooLarge)) => {
                    return refuse(Status::resource_exhausted(format!(
                        "the request is larger than the {max_bytes} bytes this service takes \
                         (set by the limits.* caps)"
                    )))
                }
                Ok(Err(Unread::Failed(e))) => {
                    return refuse(Status::cancelled(format!("reading the request: {e}")))
                }
                Err(_) => {
                    return refuse(Status::deadline_exceeded(format!(
                        "the request did not arrive within {} s",
                        REQUEST_READ_TIMEOUT.as_secs()
                    )))
                }
            };
            if let Some(method) = counted {
                if let Err(status) = check(method, &frame, &limits) {
                    return refuse(status);
                }
            }
            let body = Body::new(Full::<Bytes>::new(frame));
            let response = inner.call(http::Request::from_parts(parts, body)).await;
            // What the request decoded to is gone: the next large one may come.
            drop(turn);
            response
        })
    }
}

#[cfg(test)]
mod tests {
    use dpu_proto::v1 as pb;
    use prost::Message;

    use super::*;

    const L: Limits = Limits::with_ram(0);

    fn frame(msg: &impl Message) -> Vec<u8> {
        let m = msg.encode_to_vec();
        let mut f = vec![0];
        f.extend_from_slice(&u32::try_from(m.len()).unwrap().to_be_bytes());
        f.extend_from_slice(&m);
        f
    }

    /// The largest rule a client may send: every field at its longest.
    fn biggest_rule(i: usize) -> pb::FilterRule {
        let long = "a".repeat(63);
        let v6 = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120".to_string();
        pb::FilterRule {
            name: format!("tenants/{long}/rules/{}", &format!("{long}{i}")[..63]),
            priority: u32::MAX - u32::try_from(i).unwrap(),
            src_prefix: v6.clone(),
            dst_prefix: v6,
            src_ports: Some(pb::PortRange {
                first: 65535,
                last: 65535,
            }),
            dst_ports: Some(pb::PortRange {
                first: 65535,
                last: 65535,
            }),
            ip_protocol: Some(255),
            icmp_type: Some(255),
            icmp_code: Some(255),
            action: 2,
            stateful: true,
            description: "d".repeat(256),
            rate_limit: Some(pb::RateLimit {
                packets_per_second: u64::MAX,
                bits_per_second: u64::MAX,
                burst: u64::MAX,
            }),
        }
    }

    fn biggest_attachment() -> pb::Attachment {
        pb::Attachment {
            kind: Some(pb::attachment::Kind::Port(pb::PortAttachment {
                port: format!("ports/{}", "p".repeat(63)),
                vlan_id: 4094,
                allowed_macs: vec!["aa:bb:cc:dd:ee:ff".into(); MAX_GUARD_ENTRIES],
                allowed_source_prefixes: vec![
                    "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128".into();
                    MAX_GUARD_ENTRIES
                ],
            })),
        }
    }

    #[test]
    fn largest_valid_requests_fit() {
        let rule = biggest_rule(0).encoded_len() + 3;
        assert!(rule <= RULE_BYTES, "a rule takes {rule} bytes");
        let att = biggest_attachment().encoded_len() + 3;
        assert!(att <= ATTACHMENT_BYTES, "an attachment takes {att} bytes");
        let req = pb::ReplaceRulesRequest {
            parent: format!("tenants/{}", "a".repeat(63)),
            rules: (0..L.rules_per_tenant).map(biggest_rule).collect(),
            expected_version: Some(u64::MAX),
        };
        let f = frame(&req);
        assert!(f.len() - 5 <= request_bytes("dpu.v1.FilterService", &L));
        check("/dpu.v1.FilterService/ReplaceRules", &f, &L).unwrap();
        let tenant = pb::Tenant {
            name: format!("tenants/{}", "a".repeat(63)),
            display_name: "n".repeat(256),
            attachments: vec![biggest_attachment(); L.attachments_per_tenant],
            ..Default::default()
        };
        let req = pb::UpdateTenantRequest {
            tenant: Some(tenant),
            update_mask: Some(dpu_proto::pbjson_types::FieldMask {
                paths: vec![
                    "display_name".into(),
                    "default_policy".into(),
                    "attachments".into(),
                ],
            }),
        };
        let f = frame(&req);
        assert!(f.len() - 5 <= request_bytes("dpu.v1.TenantService", &L));
        check("/dpu.v1.TenantService/UpdateTenant", &f, &L).unwrap();
    }

    /// The DH-HMAC-CHAP lists and the output-only host lists are counted
    /// where prost decodes them, and a SetHostAuth with more hashes than
    /// exist is refused undecoded.
    #[test]
    fn host_auth_lists_are_counted() {
        let auth = pb::HostAuth {
            hashes: vec!["sha256".into(); 4],
            dh_groups: vec!["null".into(); 7],
            ..Default::default()
        };
        let sub = pb::Subsystem {
            host_auth: vec![auth.clone(); 5],
            host_qos: vec![pb::HostQos::default(); 3],
            host_tls: vec![pb::HostTls::default(); 2],
            ..Default::default()
        };
        let msgs = [
            (
                "SetHostAuth",
                pb::SetHostAuthRequest {
                    subsystem: "subsystems/a".into(),
                    auth: Some(auth),
                }
                .encode_to_vec(),
            ),
            (
                "CreateSubsystem",
                pb::CreateSubsystemRequest {
                    subsystem_id: "a".into(),
                    subsystem: Some(sub.clone()),
                }
                .encode_to_vec(),
            ),
            (
                "UpdateSubsystem",
                pb::UpdateSubsystemRequest {
                    subsystem: Some(sub),
                    update_mask: None,
                }
                .encode_to_vec(),
            ),
        ];
        let mut seen = 0;
        for c in COUNTED
            .iter()
            .filter(|c| c.method.contains("Subsystem") || c.method.contains("HostAuth"))
        {
            let (_, msg) = msgs
                .iter()
                .find(|(m, _)| c.method.ends_with(m))
                .expect("a message for each counted storage method");
            let want = match c.field {
                "subsystem.host_auth" => 5,
                "subsystem.host_qos" => 3,
                "subsystem.host_tls" => 2,
                "auth.hashes" => 4,
                "auth.dh_groups" => 7,
                // Counted in `counts_match_prost`.
                "subsystem.allowed_hosts" | "update_mask.paths" => continue,
                other => panic!("unexpected counted field {other}"),
            };
            assert_eq!(count(msg, c.path), Ok(want), "{} {}", c.method, c.field);
            seen += 1;
        }
        assert_eq!(seen, 8);
        let mut frame = vec![0u8];
        frame.extend_from_slice(&u32::try_from(msgs[0].1.len()).unwrap().to_be_bytes());
        frame.extend_from_slice(&msgs[0].1);
        let e = check(
            "/dpu.v1.StorageService/SetHostAuth",
            &frame,
            &Limits::with_ram(0),
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("auth.hashes"), "{}", e.message());
    }

    #[test]
    fn counts_match_prost() {
        let req = pb::ReplaceRulesRequest {
            parent: "tenants/a".into(),
            rules: vec![pb::FilterRule::default(); 1000],
            expected_version: None,
        };
        assert_eq!(count(&req.encode_to_vec(), &[2]), Ok(1000));
        let att = biggest_attachment();
        let vx = pb::Attachment {
            kind: Some(pb::attachment::Kind::Vxlan(pb::VxlanAttachment {
                remote_vteps: vec!["192.0.2.1".into(); 7],
                underlay_prefixes: vec!["192.0.2.0/24".into(); 5],
                ..Default::default()
            })),
        };
        let tenant = pb::Tenant {
            attachments: vec![att.clone(), vx.clone(), vx],
            ..Default::default()
        };
        let create = pb::CreateTenantRequest {
            tenant_id: "a".into(),
            tenant: Some(tenant.clone()),
        }
        .encode_to_vec();
        let update = pb::UpdateTenantRequest {
            tenant: Some(tenant),
            update_mask: Some(dpu_proto::pbjson_types::FieldMask {
                paths: vec!["attachments".into(); 9],
            }),
        }
        .encode_to_vec();
        for c in COUNTED.iter().filter(|c| c.method.contains("Tenant")) {
            let msg = if c.method.ends_with("CreateTenant") {
                &create
            } else {
                &update
            };
            let want = match c.field {
                "tenant.attachments" => 3,
                "tenant.attachments[].vxlan.remote_vteps" => 14,
                "tenant.attachments[].vxlan.underlay_prefixes" => 10,
                "update_mask.paths" => 9,
                _ => MAX_GUARD_ENTRIES as u64,
            };
            assert_eq!(count(msg, c.path), Ok(want), "{} {}", c.method, c.field);
        }
        let sub = pb::Subsystem {
            allowed_hosts: vec!["nqn.2024-01.io.example:h".into(); 11],
            ..Default::default()
        };
        let create = pb::CreateSubsystemRequest {
            subsystem_id: "s".into(),
            subsystem: Some(sub.clone()),
        }
        .encode_to_vec();
        let update = pb::UpdateSubsystemRequest {
            subsystem: Some(sub),
            update_mask: Some(dpu_proto::pbjson_types::FieldMask {
                paths: vec!["allowed_hosts".into(); 4],
            }),
        }
        .encode_to_vec();
        for c in COUNTED.iter().filter(|c| {
            c.method.contains("Subsystem")
                && ![
                    "subsystem.host_auth",
                    "subsystem.host_qos",
                    "subsystem.host_tls",
                ]
                .contains(&c.field)
        }) {
            let msg = if c.method.ends_with("CreateSubsystem") {
                &create
            } else {
                &update
            };
            let want = if c.field == "update_mask.paths" {
                4
            } else {
                11
            };
            assert_eq!(count(msg, c.path), Ok(want), "{} {}", c.method, c.field);
        }
        // A non-repeated message sent twice merges: both halves count.
        let mut twice = pb::CreateTenantRequest {
            tenant_id: "a".into(),
            tenant: Some(pb::Tenant {
                attachments: vec![att.clone()],
                ..Default::default()
            }),
        }
        .encode_to_vec();
        twice.extend_from_slice(&twice.clone());
        assert_eq!(count(&twice, &[2, 3]), Ok(2));
        assert_eq!(
            pb::CreateTenantRequest::decode(twice.as_slice())
                .unwrap()
                .tenant
                .unwrap()
                .attachments
                .len(),
            2
        );
        // Truncated input is malformed, not miscounted.
        let bytes = pb::ReplaceRulesRequest {
            parent: "tenants/a".into(),
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(count(&bytes[..bytes.len() - 1], &[2]), Err(Malformed));
    }

    #[test]
    fn too_many_entries_are_refused_before_decoding() {
        // 2 bytes an empty rule: a million of them in 2 MB.
        let mut msg = b"\x0a\x09tenants/a".to_vec();
        for _ in 0..1_000_000 {
            msg.extend_from_slice(&[0x12, 0x00]);
        }
        let mut f = vec![0];
        f.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
        f.extend_from_slice(&msg);
        let e = check("/dpu.v1.FilterService/ReplaceRules", &f, &L).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(
            e.message().contains("1000000 entries in rules")
                && e.message().contains("limits.max_rules_per_tenant"),
            "{}",
            e.message()
        );
        // Other methods are not counted.
        check("/dpu.v1.FilterService/AddRule", &f, &L).unwrap();
        let att = pb::Attachment {
            kind: Some(pb::attachment::Kind::Port(pb::PortAttachment {
                allowed_macs: vec![String::new(); 64 * L.attachments_per_tenant + 1],
                ..Default::default()
            })),
        };
        let req = pb::CreateTenantRequest {
            tenant_id: "a".into(),
            tenant: Some(pb::Tenant {
                attachments: vec![att],
                ..Default::default()
            }),
        };
        let e = check("/dpu.v1.TenantService/CreateTenant", &frame(&req), &L).unwrap_err();
        assert!(e.message().contains("allowed_macs"), "{}", e.message());
    }

    /// The largest valid subsystem requests pass; one host or mask path
    /// more is refused as the checks after decoding would refuse it.
    #[test]
    fn storage_lists_are_counted() {
        let long = |i: usize| format!("nqn.2024-01.io.example:{}{i:05}", "h".repeat(190));
        let sub = |n: usize| pb::Subsystem {
            nqn: long(0),
            serial_number: "s".repeat(20),
            model_number: "m".repeat(40),
            allowed_hosts: (0..n).map(long).collect(),
            ..Default::default()
        };
        let create = |n| pb::CreateSubsystemRequest {
            subsystem_id: "a".repeat(63),
            subsystem: Some(sub(n)),
        };
        let mask = |n| {
            Some(dpu_proto::pbjson_types::FieldMask {
                paths: vec!["allowed_hosts".into(); n],
            })
        };
        let update = |n, m| pb::UpdateSubsystemRequest {
            subsystem: Some(sub(n)),
            update_mask: mask(m),
        };
        const CREATE: &str = "/dpu.v1.StorageService/CreateSubsystem";
        const UPDATE: &str = "/dpu.v1.StorageService/UpdateSubsystem";
        let most = frame(&create(MAX_HOSTS_PER_SUBSYSTEM));
        assert!(most.len() - 5 <= request_bytes("dpu.v1.StorageService", &L));
        check(CREATE, &most, &L).unwrap();
        check(UPDATE, &frame(&update(MAX_HOSTS_PER_SUBSYSTEM, 3)), &L).unwrap();
        for (method, f, field) in [
            (
                CREATE,
                frame(&create(MAX_HOSTS_PER_SUBSYSTEM + 1)),
                "subsystem.allowed_hosts",
            ),
            (
                UPDATE,
                frame(&update(MAX_HOSTS_PER_SUBSYSTEM + 1, 1)),
                "subsystem.allowed_hosts",
            ),
            (
                UPDATE,
                frame(&update(0, MAX_MASK_PATHS + 1)),
                "update_mask.paths",
            ),
        ] {
            let e = check(method, &f, &L).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{method}");
            assert!(e.message().starts_with(field), "{}", e.message());
        }
        let e = check(
            "/dpu.v1.TenantService/UpdateTenant",
            &frame(&pb::UpdateTenantRequest {
                tenant: None,
                update_mask: mask(MAX_MASK_PATHS + 1),
            }),
            &L,
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    /// An inner service that holds every call until released, counting
    /// how many it holds.
    #[derive(Clone)]
    struct Held {
        inside: Arc<std::sync::atomic::AtomicUsize>,
        most: Arc<std::sync::atomic::AtomicUsize>,
        release: Arc<tokio::sync::Semaphore>,
    }

    impl NamedService for Held {
        const NAME: &'static str = "dpu.v1.FilterService";
    }

    impl Service<http::Request<Body>> for Held {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = BoxFuture<http::Response<Body>, Infallible>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<Body>) -> Self::Future {
            use std::sync::atomic::Ordering::SeqCst;
            let h = self.clone();
            Box::pin(async move {
                let n = h.inside.fetch_add(1, SeqCst) + 1;
                h.most.fetch_max(n, SeqCst);
                h.release.acquire().await.unwrap().forget();
                h.inside.fetch_sub(1, SeqCst);
                Ok(http::Response::new(Body::empty()))
            })
        }
    }

    fn request(path: &'static str, frame: Vec<u8>) -> http::Request<Body> {
        let mut req = http::Request::new(Body::new(Full::new(Bytes::from(frame))));
        *req.uri_mut() = http::Uri::from_static(path);
        req
    }

    /// Five large requests at once: two are served, the rest wait their
    /// turn; small ones do not wait; too large ones are refused.
    #[tokio::test]
    async fn large_requests_take_turns() {
        use std::sync::atomic::Ordering::SeqCst;
        let held = Held {
            inside: Default::default(),
            most: Default::default(),
            release: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        let svc = Bounded::new(held.clone(), L, Arc::new(Telemetry::default()));
        let big = pb::AddRuleRequest {
            parent: "tenants/a".into(),
            rule: Some(pb::FilterRule {
                description: "d".repeat(1 << 20),
                ..Default::default()
            }),
            ..Default::default()
        };
        let calls: Vec<_> = (0..5)
            .map(|_| {
                let mut s = svc.clone();
                let req = request("/dpu.v1.FilterService/AddRule", frame(&big));
                tokio::spawn(async move { s.call(req).await })
            })
            .collect();
        let settle = || tokio::time::sleep(Duration::from_millis(200));
        settle().await;
        assert_eq!(held.inside.load(SeqCst), LARGE_REQUESTS_AT_ONCE);
        // A small request is served beside them.
        let mut s = svc.clone();
        let small = tokio::spawn(async move {
            s.call(request(
                "/dpu.v1.FilterService/GetRule",
                frame(&pb::GetRuleRequest::default()),
            ))
            .await
        });
        settle().await;
        assert_eq!(held.inside.load(SeqCst), LARGE_REQUESTS_AT_ONCE + 1);
        held.release.add_permits(6);
        small.await.unwrap().unwrap();
        for c in calls {
            c.await.unwrap().unwrap();
        }
        assert_eq!(held.most.load(SeqCst), LARGE_REQUESTS_AT_ONCE + 1);
        // Longer than the service takes: refused, never served.
        let huge = request(
            "/dpu.v1.FilterService/AddRule",
            vec![0; request_bytes("dpu.v1.FilterService", &L) + 6],
        );
        let r = svc.clone().call(huge).await.unwrap();
        assert_eq!(
            r.headers().get("grpc-status").map(|v| v.as_bytes()),
            Some(b"8".as_slice()),
            "RESOURCE_EXHAUSTED"
        );
        assert_eq!(held.inside.load(SeqCst), 0);
    }

    /// Through [`Bounded`]: a `CreateSubsystem` of 150,000
    /// 2-byte empty host names, within the service's size, is refused and
    /// never reaches the service that would decode it.
    #[tokio::test]
    async fn too_many_hosts_never_reach_the_service() {
        let held = Held {
            inside: Default::default(),
            most: Default::default(),
            release: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        let telemetry = Arc::new(Telemetry::default());
        let svc = Bounded::new(held.clone(), L, telemetry);
        // CreateSubsystemRequest { subsystem_id: "s", subsystem: { allowed_hosts: [""; n] } }
        let n = 150_000usize;
        let mut sub = Vec::new();
        for _ in 0..n {
            sub.extend_from_slice(&[0x32, 0x00]);
        }
        let mut msg = b"\x0a\x01s\x12".to_vec();
        prost::encoding::encode_varint(sub.len() as u64, &mut msg);
        msg.extend_from_slice(&sub);
        let mut f = vec![0];
        f.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
        f.extend_from_slice(&msg);
        assert!(msg.len() <= request_bytes("dpu.v1.StorageService", &L));
        let r = svc
            .clone()
            .call(request("/dpu.v1.StorageService/CreateSubsystem", f))
            .await
            .unwrap();
        assert_eq!(
            r.headers().get("grpc-status").map(|v| v.as_bytes()),
            Some(b"3".as_slice()),
            "INVALID_ARGUMENT"
        );
        let message = r.headers().get("grpc-message").unwrap().to_str().unwrap();
        assert!(message.contains("150000"), "{message}");
        assert_eq!(held.most.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
}
