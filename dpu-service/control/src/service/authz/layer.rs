//! [`AuthzLayer`]: the tower layer that authorizes every call of the API
//! listener by its method's path, before any service decodes it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;
use tower_layer::Layer;
use tower_service::Service;

use super::{identity, permission, Caller, Name, Policy};
use crate::telemetry::Telemetry;

/// The most client certificates whose caller [`AuthzLayer`] remembers;
/// past it, it forgets them all and starts again.
pub const CACHED_CERTIFICATES: usize = 1024;

/// The callers of client certificates already seen, by their DER bytes:
/// reading a certificate's names takes microseconds, comparing its bytes
/// far less, and a connection sends many calls.
type Callers = HashMap<Vec<u8>, Arc<Caller>>;

/// Authorizes each call by [`Policy`] and [`super::METHODS`]; refusals
/// answer `PERMISSION_DENIED` and are counted in [`Telemetry`]. A call
/// let through carries its caller (`Arc<Caller>`) in its extensions.
#[derive(Debug, Clone)]
pub struct AuthzLayer {
    policy: Arc<Policy>,
    telemetry: Arc<Telemetry>,
    anonymous: Arc<Caller>,
    seen: Arc<Mutex<Callers>>,
}

impl AuthzLayer {
    /// A layer enforcing `policy`, counting refusals in `telemetry`.
    pub fn new(policy: Arc<Policy>, telemetry: Arc<Telemetry>) -> Self {
        Self {
            anonymous: Arc::new(policy.caller(None)),
            policy,
            telemetry,
            seen: Arc::default(),
        }
    }

    /// The caller of a request with `extensions`: its certificate's names,
    /// when it presented one over TLS, matched against the policy. A
    /// certificate whose names cannot be read is a caller with no names
    /// the policy knows.
    fn caller(&self, extensions: &http::Extensions) -> Arc<Caller> {
        let cert = extensions
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(TlsConnectInfo::peer_certs);
        let Some(first) = cert.as_ref().and_then(|c| c.first()) else {
            return self.anonymous.clone();
        };
        let der: &[u8] = first.as_ref();
        if let Some(c) = self.seen.lock().ok().and_then(|s| s.get(der).cloned()) {
            return c;
        }
        let caller = Arc::new(match identity::names(der) {
            Ok(names) => self.policy.caller(Some(&names)),
            Err(e) => {
                tracing::warn!(error = %e, "a client certificate's names cannot be read");
                self.policy.caller(Some(&[] as &[Name]))
            }
        });
        if let Ok(mut seen) = self.seen.lock() {
            if seen.len() >= CACHED_CERTIFICATES {
                seen.clear();
            }
            seen.insert(der.to_vec(), caller.clone());
        }
        caller
    }
}

impl<S> Layer<S> for AuthzLayer {
    type Service = Authz<S>;

    fn layer(&self, inner: S) -> Authz<S> {
        Authz {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`AuthzLayer`] wraps around the API's routes.
#[derive(Debug, Clone)]
pub struct Authz<S> {
    inner: S,
    layer: AuthzLayer,
}

impl<S, B, R> Service<http::Request<B>> for Authz<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let (needs, method) = permission(req.uri().path());
        let caller = self.layer.caller(req.extensions());
        if caller.allows(needs) {
            req.extensions_mut().insert(caller);
            return Box::pin(self.inner.call(req));
        }
        let path = req.uri().path();
        let shown = if method == super::OTHER_METHOD {
            // A path no service serves: show it, but only so much of it.
            let mut end = path.len().min(200);
            while !path.is_char_boundary(end) {
                end -= 1;
            }
            &path[..end]
        } else {
            method
        };
        let why = caller.refusal(shown);
        tracing::debug!(client = %caller.label, method, "refused: {why}");
        self.layer.telemetry.observe_denied(method, &caller.label);
        let response = Status::permission_denied(why).into_http();
        Box::pin(std::future::ready(Ok(response)))
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Mutex;

    use super::*;
    use crate::model::State;
    use crate::service::authz::{Role, ANONYMOUS, OTHER_METHOD};

    /// Answers 200 and keeps the caller each request carried.
    #[derive(Clone, Default)]
    struct Inner(Arc<Mutex<Vec<Option<Arc<Caller>>>>>);

    impl Service<http::Request<()>> for Inner {
        type Response = http::Response<String>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<()>) -> Self::Future {
            self.0
                .lock()
                .unwrap()
                .push(req.extensions().get::<Arc<Caller>>().cloned());
            std::future::ready(Ok(http::Response::new("served".into())))
        }
    }

    async fn send(svc: &mut Authz<Inner>, path: &str) -> http::Response<String> {
        let req = http::Request::builder().uri(path).body(()).unwrap();
        svc.call(req).await.unwrap()
    }

    fn grpc_status(r: &http::Response<String>) -> Option<&str> {
        r.headers().get("grpc-status").and_then(|v| v.to_str().ok())
    }

    /// Callers without a certificate get the anonymous role: what it
    /// allows reaches the service with its caller, the rest is refused
    /// with PERMISSION_DENIED before the service sees it, and counted.
    #[tokio::test]
    async fn the_layer_lets_through_what_the_role_allows() {
        let telemetry = Arc::new(Telemetry::default());
        let policy = Policy::new([], Some(Role::Reader)).unwrap();
        let inner = Inner::default();
        let mut svc = AuthzLayer::new(Arc::new(policy), telemetry.clone()).layer(inner.clone());

        let r = send(&mut svc, "/dpu.v1.TenantService/ListTenants").await;
        assert_eq!(r.body(), "served");
        let seen = inner.0.lock().unwrap().pop().unwrap().unwrap();
        assert_eq!(
            (seen.label.as_str(), seen.role.clone()),
            (ANONYMOUS, Some(Role::Reader))
        );
        let r = send(&mut svc, "/grpc.health.v1.Health/Check").await;
        assert_eq!(r.body(), "served");

        for path in [
            "/dpu.v1.TenantService/CreateTenant",
            "/dpu.v1.FilterService/AddRule",
            "/not.a.Service/Method",
        ] {
            let r = send(&mut svc, path).await;
            assert_eq!(grpc_status(&r), Some("7"), "{path}");
            let msg = r.headers().get("grpc-message").unwrap().to_str().unwrap();
            assert!(msg.contains("anonymous"), "{msg}");
        }
        assert_eq!(
            inner.0.lock().unwrap().len(),
            1,
            "refused calls reached the service"
        );
        let text = telemetry.render_prometheus(&State::default(), &Default::default());
        for (method, n) in [
            ("/dpu.v1.TenantService/CreateTenant", 1),
            ("/dpu.v1.FilterService/AddRule", 1),
            (OTHER_METHOD, 1),
        ] {
            let line =
                format!("dpu_grpc_denied_total{{method=\"{method}\",client=\"anonymous\"}} {n}\n");
            assert!(text.contains(&line), "{line} in {text}");
        }

        // With no anonymous role, nothing passes.
        let policy = Policy::new([], None).unwrap();
        let mut svc = AuthzLayer::new(Arc::new(policy), telemetry).layer(inner.clone());
        let r = send(&mut svc, "/dpu.v1.InfoService/GetServiceInfo").await;
        assert_eq!(grpc_status(&r), Some("7"));
        assert_eq!(inner.0.lock().unwrap().len(), 1);
    }
}
