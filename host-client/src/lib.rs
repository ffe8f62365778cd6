//! `dpu_client`: the host-side client of the dpu-service gRPC API (`dpu.v1`).
//!
//! A thin, typed, async layer over the generated stubs: one method per RPC,
//! taking the request message and returning the response message. It adds
//! what every caller needs and nothing else:
//!
//! - plain or TLS/mTLS connections ([`ClientConfig`], [`TlsConfig`]);
//! - a deadline on every call (sent as `grpc-timeout` and enforced locally);
//! - retries with backoff on `UNAVAILABLE`, for idempotent calls only (reads);
//!   a mutation is never sent twice;
//! - errors that carry the server's status code and message ([`ClientError`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), dpu_client::ClientError> {
//! use dpu_client::{pb, ClientConfig, DpuClient};
//! let client = DpuClient::connect(ClientConfig::default()).await?;
//! let tenants = client.list_tenants(pb::ListTenantsRequest::default()).await?;
//! println!("{} tenants", tenants.tenants.len());
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

use std::future::Future;
use std::time::Duration;

use dpu_proto::v1::filter_service_client::FilterServiceClient;
use dpu_proto::v1::info_service_client::InfoServiceClient;
use dpu_proto::v1::port_service_client::PortServiceClient;
use dpu_proto::v1::storage_service_client::StorageServiceClient;
use dpu_proto::v1::telemetry_service_client::TelemetryServiceClient;
use dpu_proto::v1::tenant_service_client::TenantServiceClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Response, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// The `dpu.v1` messages and enums.
pub use dpu_proto::v1 as pb;

/// What `grpc.health.v1` says of a service: `Serving`, `NotServing`, ...
pub use tonic_health::pb::health_check_response::ServingStatus;

/// Largest message sent or accepted (a 64K-rule `ReplaceRules` fits).
const MAX_MESSAGE: usize = 64 << 20;

/// TLS settings of a connection.
#[derive(Debug, Clone, Default)]
pub struct TlsConfig {
    /// PEM CA bundle that signed the server's certificate (required: this
    /// build trusts no system roots).
    pub ca_cert_pem: Vec<u8>,
    /// PEM client certificate, for mutual TLS.
    pub client_cert_pem: Option<Vec<u8>>,
    /// PEM private key of the client certificate.
    pub client_key_pem: Option<Vec<u8>>,
    /// Name to verify the server certificate against, if not the endpoint's host.
    pub server_name: Option<String>,
}

/// How to reach the service.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Endpoint URL: `http://host:port`, or `https://host:port` with `tls`.
    pub endpoint: String,
    /// TLS settings; required for `https` endpoints.
    pub tls: Option<TlsConfig>,
    /// Deadline of each call.
    pub timeout: Duration,
    /// Deadline of establishing the connection.
    pub connect_timeout: Duration,
    /// Extra attempts of an idempotent call that failed with `UNAVAILABLE`.
    pub retries: u32,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            endpoint: "http://127.0.0.1:50051".into(),
            tls: None,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            retries: 3,
        }
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The configuration cannot work (bad URL, key without certificate).
    #[error("invalid client configuration: {0}")]
    InvalidConfig(String),
    /// The service could not be reached, or the connection to it failed
    /// (TLS refused, connection lost) before it answered.
    #[error("cannot connect to {endpoint}: {reason}")]
    Connect {
        /// The endpoint tried.
        endpoint: String,
        /// What the transport reported.
        reason: String,
    },
    /// The service answered with an error status.
    #[error("{}: {message}", code_name(*.code))]
    Status {
        /// gRPC status code.
        code: Code,
        /// The server's message.
        message: String,
    },
    /// The call did not complete within its deadline.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

impl ClientError {
    /// The gRPC status code, for errors the service (or transport) returned.
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Status { code, .. } => Some(*code),
            Self::Connect { .. } => Some(Code::Unavailable),
            Self::Timeout(_) => Some(Code::DeadlineExceeded),
            Self::InvalidConfig(_) => None,
        }
    }
}

impl From<Status> for ClientError {
    fn from(s: Status) -> Self {
        let mut message = s.message().to_string();
        // A status made up locally (not sent by the service) says why in
        // its source.
        if let Some(src) = std::error::Error::source(&s) {
            let chain = error_chain(src);
            message = if chain.starts_with(&message) {
                chain
            } else {
                format!("{message}: {chain}")
            };
        }
        Self::Status {
            code: s.code(),
            message,
        }
    }
}

/// The canonical upper-case name of a status code, e.g. `NOT_FOUND`.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Process exit code for an error, as `dpuctl` documents it: 1 other, 3
/// NOT_FOUND, 4 ALREADY_EXISTS, 5 INVALID_ARGUMENT, 6 FAILED_PRECONDITION
/// or ABORTED, 7 unreachable, 8 timeout, 9 UNAUTHENTICATED or PERMISSION_DENIED,
/// 10 RESOURCE_EXHAUSTED (a configured cap, named in the message).
pub fn exit_code(err: &ClientError) -> u8 {
    match err.code() {
        Some(Code::NotFound) => 3,
        Some(Code::AlreadyExists) => 4,
        Some(Code::InvalidArgument | Code::OutOfRange) => 5,
        Some(Code::FailedPrecondition | Code::Aborted) => 6,
        Some(Code::Unavailable) => 7,
        Some(Code::DeadlineExceeded) => 8,
        Some(Code::Unauthenticated | Code::PermissionDenied) => 9,
        Some(Code::ResourceExhausted) => 10,
        _ => 1,
    }
}

/// True for failures worth another attempt of an idempotent call: the
/// service is unavailable, or the connection to it failed.
fn retryable(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Status {
            code: Code::Unavailable,
            ..
        } | ClientError::Connect { .. }
    )
}

/// A connection to dpu-service. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct DpuClient {
    channel: Channel,
    endpoint: String,
    timeout: Duration,
    retries: u32,
}

macro_rules! rpcs {
    ($( $(#[$doc:meta])* $method:ident($client:ident, $req:ident) -> $resp:ident, $idem:expr; )*) => {
        $(
            $(#[$doc])*
            ///
            /// # Errors
            /// [`ClientError::Status`] with the service's code and message,
            /// [`ClientError::Timeout`] past the deadline.
            pub async fn $method(&self, req: pb::$req) -> Result<pb::$resp, ClientError> {
                self.call($idem, req, |ch, r| async move {
                    $client::new(ch)
                        .max_decoding_message_size(MAX_MESSAGE)
                        .max_encoding_message_size(MAX_MESSAGE)
                        .$method(r)
                        .await
                })
                .await
            }
        )*
    };
}

const READ: bool = true;
const WRITE: bool = false;

impl DpuClient {
    /// Connects to the service.
    ///
    /// # Errors
    /// [`ClientError::InvalidConfig`] for a malformed endpoint or TLS
    /// settings, [`ClientError::Connect`] if the service cannot be reached.
    pub async fn connect(config: ClientConfig) -> Result<DpuClient, ClientError> {
        let mut ep = Endpoint::from_shared(config.endpoint.clone())
            .map_err(|e| {
                ClientError::InvalidConfig(format!("endpoint {:?}: {e}", config.endpoint))
            })?
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true);
        let is_https = ep.uri().scheme_str() == Some("https");
        if let Some(tls) = &config.tls {
            if !is_https {
                // tonic would silently speak plain text to an http:// URL
                // even with TLS settings; refuse rather than leak.
                return Err(ClientError::InvalidConfig(format!(
                    "TLS settings need an https:// endpoint, not {:?}",
                    config.endpoint
                )));
            }
            if tls.ca_cert_pem.iter().all(u8::is_ascii_whitespace) {
                return Err(ClientError::InvalidConfig(
                    "TLS needs the CA certificate that signed the server's".into(),
                ));
            }
            let mut t =
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_cert_pem));
            match (&tls.client_cert_pem, &tls.client_key_pem) {
                (Some(c), Some(k)) => t = t.identity(Identity::from_pem(c, k)),
                (None, None) => {}
                _ => {
                    return Err(ClientError::InvalidConfig(
                        "a client certificate needs its key, and a key its certificate".into(),
                    ))
                }
            }
            if let Some(n) = &tls.server_name {
                t = t.domain_name(n.clone());
            }
            ep = ep
                .tls_config(t)
                .map_err(|e| ClientError::InvalidConfig(format!("TLS: {e}")))?;
        } else if is_https {
            return Err(ClientError::InvalidConfig(
                "an https endpoint needs TLS settings".into(),
            ));
        }
        let channel = ep.connect().await.map_err(|e| ClientError::Connect {
            endpoint: config.endpoint.clone(),
            reason: error_chain(&e),
        })?;
        Ok(DpuClient {
            channel,
            endpoint: config.endpoint,
            timeout: config.timeout,
            retries: config.retries,
        })
    }

    async fn call<Req, Resp, F, Fut>(
        &self,
        idempotent: bool,
        req: Req,
        f: F,
    ) -> Result<Resp, ClientError>
    where
        Req: Clone,
        F: Fn(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let mut attempt = 0u32;
        loop {
            let mut r = Request::new(req.clone());
            r.set_timeout(self.timeout);
            let outcome = match tokio::time::timeout(self.timeout, f(self.channel.clone(), r)).await
            {
                Err(_) => Err(ClientError::Timeout(self.timeout)),
                Ok(Ok(resp)) => return Ok(resp.into_inner()),
                Ok(Err(status)) => Err(self.failure(status)),
            };
            match outcome {
                Err(e) if idempotent && attempt < self.retries && retryable(&e) => {
                    tokio::time::sleep(Duration::from_millis(50) * 2u32.pow(attempt)).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    rpcs! {
        /// Version, build and capabilities of the service.
        get_service_info(InfoServiceClient, GetServiceInfoRequest) -> ServiceInfo, READ;
        /// Creates a tenant.
        create_tenant(TenantServiceClient, CreateTenantRequest) -> Tenant, WRITE;
        /// Returns one tenant.
        get_tenant(TenantServiceClient, GetTenantRequest) -> Tenant, READ;
        /// Lists one page of tenants.
        list_tenants(TenantServiceClient, ListTenantsRequest) -> ListTenantsResponse, READ;
        /// Updates the masked fields of a tenant.
        update_tenant(TenantServiceClient, UpdateTenantRequest) -> Tenant, WRITE;
        /// Deletes a tenant.
        delete_tenant(TenantServiceClient, DeleteTenantRequest) -> DeleteTenantResponse, WRITE;
        /// Sets the limits on all the storage I/O of a tenant's storage
        /// endpoints together (all zero clears them).
        set_tenant_storage_qos(TenantServiceClient, SetTenantStorageQosRequest) -> Tenant, WRITE;
        /// Lists one page of ports.
        list_ports(PortServiceClient, ListPortsRequest) -> ListPortsResponse, READ;
        /// Returns one port.
        get_port(PortServiceClient, GetPortRequest) -> Port, READ;
        /// Attaches a port (or VLAN) to a tenant.
        attach_port(PortServiceClient, AttachPortRequest) -> Tenant, WRITE;
        /// Detaches a port (or VLAN) from its tenant.
        detach_port(PortServiceClient, DetachPortRequest) -> Tenant, WRITE;
        /// Adds a filter rule.
        add_rule(FilterServiceClient, AddRuleRequest) -> AddRuleResponse, WRITE;
        /// Returns one filter rule.
        get_rule(FilterServiceClient, GetRuleRequest) -> FilterRule, READ;
        /// Deletes a filter rule.
        delete_rule(FilterServiceClient, DeleteRuleRequest) -> DeleteRuleResponse, WRITE;
        /// Lists one page of a tenant's rules.
        list_rules(FilterServiceClient, ListRulesRequest) -> ListRulesResponse, READ;
        /// Replaces a tenant's whole rule set.
        replace_rules(FilterServiceClient, ReplaceRulesRequest) -> ReplaceRulesResponse, WRITE;
        /// Creates a subsystem.
        create_subsystem(StorageServiceClient, CreateSubsystemRequest) -> Subsystem, WRITE;
        /// Returns one subsystem.
        get_subsystem(StorageServiceClient, GetSubsystemRequest) -> Subsystem, READ;
        /// Lists one page of subsystems.
        list_subsystems(StorageServiceClient, ListSubsystemsRequest) -> ListSubsystemsResponse, READ;
        /// Updates the masked fields of a subsystem.
        update_subsystem(StorageServiceClient, UpdateSubsystemRequest) -> Subsystem, WRITE;
        /// Deletes a subsystem.
        delete_subsystem(StorageServiceClient, DeleteSubsystemRequest) -> DeleteSubsystemResponse, WRITE;
        /// Allows a host NQN on a subsystem.
        add_host(StorageServiceClient, AddHostRequest) -> Subsystem, WRITE;
        /// Removes a host NQN from a subsystem's allow list.
        remove_host(StorageServiceClient, RemoveHostRequest) -> Subsystem, WRITE;
        /// Sets the DH-HMAC-CHAP secrets of an allowed host.
        set_host_auth(StorageServiceClient, SetHostAuthRequest) -> Subsystem, WRITE;
        /// Removes the DH-HMAC-CHAP secrets of a host.
        clear_host_auth(StorageServiceClient, ClearHostAuthRequest) -> Subsystem, WRITE;
        /// Sets the TLS pre-shared key of an allowed host.
        set_host_tls_key(StorageServiceClient, SetHostTlsKeyRequest) -> Subsystem, WRITE;
        /// Removes the TLS pre-shared key of a host.
        clear_host_tls_key(StorageServiceClient, ClearHostTlsKeyRequest) -> Subsystem, WRITE;
        /// Sets the QoS limits of a namespace (all zero clears them).
        set_namespace_qos(StorageServiceClient, SetNamespaceQosRequest) -> Namespace, WRITE;
        /// Sets the QoS limits of a host on a subsystem (all zero clears them).
        set_host_qos(StorageServiceClient, SetHostQosRequest) -> Subsystem, WRITE;
        /// Creates a namespace.
        create_namespace(StorageServiceClient, CreateNamespaceRequest) -> Namespace, WRITE;
        /// Returns one namespace.
        get_namespace(StorageServiceClient, GetNamespaceRequest) -> Namespace, READ;
        /// Lists one page of a subsystem's namespaces.
        list_namespaces(StorageServiceClient, ListNamespacesRequest) -> ListNamespacesResponse, READ;
        /// Resizes a namespace.
        resize_namespace(StorageServiceClient, ResizeNamespaceRequest) -> Namespace, WRITE;
        /// Deletes a namespace.
        delete_namespace(StorageServiceClient, DeleteNamespaceRequest) -> DeleteNamespaceResponse, WRITE;
        /// Creates a listener.
        create_listener(StorageServiceClient, CreateListenerRequest) -> Listener, WRITE;
        /// Lists one page of a subsystem's listeners.
        list_listeners(StorageServiceClient, ListListenersRequest) -> ListListenersResponse, READ;
        /// Deletes a listener.
        delete_listener(StorageServiceClient, DeleteListenerRequest) -> DeleteListenerResponse, WRITE;
        /// Registers a storage cluster.
        create_cluster(StorageServiceClient, CreateClusterRequest) -> Cluster, WRITE;
        /// Returns one storage cluster.
        get_cluster(StorageServiceClient, GetClusterRequest) -> Cluster, READ;
        /// Lists one page of storage clusters.
        list_clusters(StorageServiceClient, ListClustersRequest) -> ListClustersResponse, READ;
        /// Updates the masked fields of a storage cluster (its key, to rotate it).
        update_cluster(StorageServiceClient, UpdateClusterRequest) -> Cluster, WRITE;
        /// Deletes a storage cluster.
        delete_cluster(StorageServiceClient, DeleteClusterRequest) -> DeleteClusterResponse, WRITE;
        /// Creates a volume: a named store that a namespace is made on by
        /// naming it (`Namespace.backend = volume`).
        create_volume(StorageServiceClient, CreateVolumeRequest) -> Volume, WRITE;
        /// Returns one volume, with the namespace made on it if any.
        get_volume(StorageServiceClient, GetVolumeRequest) -> Volume, READ;
        /// Lists one page of volumes.
        list_volumes(StorageServiceClient, ListVolumesRequest) -> ListVolumesResponse, READ;
        /// Resizes a RAM, null or file volume; the namespace made on it follows.
        resize_volume(StorageServiceClient, ResizeVolumeRequest) -> Volume, WRITE;
        /// Deletes a volume no namespace is made on.
        delete_volume(StorageServiceClient, DeleteVolumeRequest) -> DeleteVolumeResponse, WRITE;
        /// A snapshot of all counters.
        get_counters(TelemetryServiceClient, GetCountersRequest) -> CounterSnapshot, READ;
    }

    /// Asks the standard health service (`grpc.health.v1.Health/Check`)
    /// how `service` is doing; `""` is the server as a whole. The service
    /// answers `NotServing` from the moment it starts shutting down.
    ///
    /// # Errors
    /// As for any call; `NOT_FOUND` for a service the server does not know.
    pub async fn health(&self, service: &str) -> Result<ServingStatus, ClientError> {
        let req = HealthCheckRequest {
            service: service.to_string(),
        };
        let resp = self
            .call(true, req, |ch, r| async move {
                HealthClient::new(ch).check(r).await
            })
            .await?;
        Ok(ServingStatus::try_from(resp.status).unwrap_or(ServingStatus::Unknown))
    }

    /// Streams counter snapshots until the stream is dropped. The deadline
    /// applies to opening the stream only.
    ///
    /// # Errors
    /// As for any call, when the stream cannot be opened.
    pub async fn watch_counters(
        &self,
        req: pb::WatchCountersRequest,
    ) -> Result<tonic::Streaming<pb::CounterSnapshot>, ClientError> {
        let mut client = TelemetryServiceClient::new(self.channel.clone());
        match tokio::time::timeout(self.timeout, client.watch_counters(Request::new(req))).await {
            Err(_) => Err(ClientError::Timeout(self.timeout)),
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(self.failure(status)),
        }
    }

    /// The error for a failed call: [`ClientError::Connect`] when the
    /// transport failed (the service sent nothing; e.g. the connection broke
    /// or TLS was refused), else the service's status.
    fn failure(&self, status: Status) -> ClientError {
        match std::error::Error::source(&status) {
            Some(src) if src.is::<tonic::transport::Error>() => ClientError::Connect {
                endpoint: self.endpoint.clone(),
                reason: error_chain(src),
            },
            _ => ClientError::from(status),
        }
    }
}

/// The transport error and its causes, on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

fn named(collection: &str, id: &str) -> String {
    if id.starts_with(&format!("{collection}/")) {
        id.to_string()
    } else {
        format!("{collection}/{id}")
    }
}

/// `"t1"` → `"tenants/t1"`; a full name passes through.
pub fn tenant_name(id: &str) -> String {
    named("tenants", id)
}

/// `"p0"` → `"ports/p0"`; a full name passes through.
pub fn port_name(id: &str) -> String {
    named("ports", id)
}

/// `"s1"` → `"subsystems/s1"`; a full name passes through.
pub fn subsystem_name(id: &str) -> String {
    named("subsystems", id)
}

/// `"ceph1"` → `"clusters/ceph1"`; a full name passes through.
pub fn cluster_name(id: &str) -> String {
    named("clusters", id)
}

/// `"v1"` → `"volumes/v1"`; a full name passes through.
pub fn volume_name(id: &str) -> String {
    named("volumes", id)
}

/// Rule `rule` of tenant `tenant`; a full rule name in `rule` passes through.
pub fn rule_name(tenant: &str, rule: &str) -> String {
    if rule.starts_with("tenants/") {
        rule.to_string()
    } else {
        format!("{}/rules/{rule}", tenant_name(tenant))
    }
}

/// Namespace `nsid` of subsystem `subsystem`.
pub fn namespace_name(subsystem: &str, nsid: u32) -> String {
    format!("{}/namespaces/{nsid}", subsystem_name(subsystem))
}

/// Listener `listener` of subsystem `subsystem`; a full name passes through.
pub fn listener_name(subsystem: &str, listener: &str) -> String {
    if listener.starts_with("subsystems/") {
        listener.to_string()
    } else {
        format!("{}/listeners/{listener}", subsystem_name(subsystem))
    }
}

/// Parses a size such as `64M` or `1GiB`: the syntax the service's
/// configuration file reads too ([`dpu_proto::text::size`]).
pub use dpu_proto::text::size as parse_size;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(tenant_name("t1"), "tenants/t1");
        assert_eq!(tenant_name("tenants/t1"), "tenants/t1");
        assert_eq!(rule_name("t1", "r"), "tenants/t1/rules/r");
        assert_eq!(rule_name("x", "tenants/t1/rules/r"), "tenants/t1/rules/r");
        assert_eq!(namespace_name("s", 3), "subsystems/s/namespaces/3");
        assert_eq!(
            listener_name("subsystems/s", "l"),
            "subsystems/s/listeners/l"
        );
        assert_eq!(port_name("p0"), "ports/p0");
        assert_eq!(volume_name("v1"), "volumes/v1");
        assert_eq!(volume_name("volumes/v1"), "volumes/v1");
    }

    #[test]
    fn exit_codes() {
        let st = |code| ClientError::Status {
            code,
            message: String::new(),
        };
        assert_eq!(exit_code(&st(Code::NotFound)), 3);
        assert_eq!(exit_code(&st(Code::AlreadyExists)), 4);
        assert_eq!(exit_code(&st(Code::InvalidArgument)), 5);
        assert_eq!(exit_code(&st(Code::FailedPrecondition)), 6);
        assert_eq!(exit_code(&st(Code::Unavailable)), 7);
        assert_eq!(
            exit_code(&ClientError::Connect {
                endpoint: String::new(),
                reason: String::new()
            }),
            7
        );
        assert_eq!(exit_code(&ClientError::Timeout(Duration::from_secs(1))), 8);
        assert_eq!(exit_code(&st(Code::PermissionDenied)), 9);
        assert_eq!(exit_code(&st(Code::ResourceExhausted)), 10);
        assert_eq!(exit_code(&st(Code::Internal)), 1);
        assert_eq!(exit_code(&ClientError::InvalidConfig(String::new())), 1);
    }

    /// A client whose channel is never used by the fake calls below.
    fn offline(timeout: Duration, retries: u32) -> DpuClient {
        DpuClient {
            channel: Endpoint::from_static("http://127.0.0.1:9").connect_lazy(),
            endpoint: "http://127.0.0.1:9".into(),
            timeout,
            retries,
        }
    }

    /// Runs `client.call` with a fake RPC that answers `answers` in turn
    /// (the last one repeating); returns the outcome and how many attempts
    /// were made.
    async fn attempts(
        client: &DpuClient,
        idempotent: bool,
        answers: &[Result<u32, Code>],
    ) -> (Result<u32, ClientError>, usize) {
        let n = std::sync::atomic::AtomicUsize::new(0);
        let r = client
            .call(idempotent, (), |_, req: Request<()>| {
                assert!(req.metadata().get("grpc-timeout").is_some());
                let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let a = answers[i.min(answers.len() - 1)];
                std::future::ready(a.map(Response::new).map_err(|c| Status::new(c, "fake")))
            })
            .await;
        (r, n.into_inner())
    }

    #[tokio::test]
    async fn retries_reads_on_unavailable_only() {
        let c = offline(Duration::from_secs(5), 3);
        let (r, n) = attempts(&c, READ, &[Err(Code::Unavailable)]).await;
        assert_eq!(r.unwrap_err().code(), Some(Code::Unavailable));
        assert_eq!(n, 4, "one attempt and three retries");

        let (r, n) = attempts(&c, READ, &[Err(Code::Unavailable), Ok(7)]).await;
        assert_eq!((r.ok(), n), (Some(7), 2));

        let (r, n) = attempts(&c, READ, &[Err(Code::NotFound)]).await;
        assert_eq!((r.unwrap_err().code(), n), (Some(Code::NotFound), 1));

        let (r, n) = attempts(&c, WRITE, &[Err(Code::Unavailable), Ok(7)]).await;
        assert_eq!((r.unwrap_err().code(), n), (Some(Code::Unavailable), 1));

        let none = offline(Duration::from_secs(5), 0);
        let (_, n) = attempts(&none, READ, &[Err(Code::Unavailable)]).await;
        assert_eq!(n, 1);
    }

    #[tokio::test]
    async fn service_statuses_stay_statuses() {
        let c = offline(Duration::from_secs(1), 0);
        let e = c.failure(Status::not_found("tenants/x not found"));
        assert!(
            matches!(&e, ClientError::Status { code: Code::NotFound, message } if message == "tenants/x not found"),
            "{e:?}"
        );
        // A local failure that is not the transport's keeps its code and
        // gains its cause.
        let io = std::io::Error::other("boom");
        let e = c.failure(Status::from_error(Box::new(io)));
        assert!(
            matches!(&e, ClientError::Status { code: Code::Unknown, message } if message.contains("boom")),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn deadline_is_enforced_locally() {
        let c = offline(Duration::from_millis(50), 3);
        let r: Result<(), _> = c
            .call(READ, (), |_, _: Request<()>| std::future::pending())
            .await;
        assert!(matches!(r, Err(ClientError::Timeout(_))), "{r:?}");
    }

    #[tokio::test]
    async fn tls_settings_are_checked_before_connecting() {
        let tls = TlsConfig {
            ca_cert_pem: b"-----BEGIN CERTIFICATE-----\n".to_vec(),
            ..TlsConfig::default()
        };
        let cfg = |endpoint: &str, tls: Option<TlsConfig>| ClientConfig {
            endpoint: endpoint.into(),
            tls,
            ..ClientConfig::default()
        };
        let invalid =
            |r: Result<DpuClient, ClientError>| matches!(r, Err(ClientError::InvalidConfig(_)));
        // TLS settings with http:// would silently send plain text.
        assert!(invalid(
            DpuClient::connect(cfg("http://127.0.0.1:9", Some(tls.clone()))).await
        ));
        assert!(invalid(
            DpuClient::connect(cfg("https://127.0.0.1:9", None)).await
        ));
        assert!(invalid(
            DpuClient::connect(cfg("https://127.0.0.1:9", Some(TlsConfig::default()))).await
        ));
        let half = TlsConfig {
            client_key_pem: Some(b"key".to_vec()),
            ..tls
        };
        assert!(invalid(
            DpuClient::connect(cfg("https://127.0.0.1:9", Some(half))).await
        ));
    }

    #[test]
    fn only_unavailable_is_retried() {
        let st = |code| ClientError::Status {
            code,
            message: String::new(),
        };
        assert!(retryable(&st(Code::Unavailable)));
        assert!(!retryable(&st(Code::InvalidArgument)));
        assert!(!retryable(&ClientError::Timeout(Duration::from_secs(1))));
        assert!(retryable(&ClientError::Connect {
            endpoint: String::new(),
            reason: String::new()
        }));
    }
}
