//! [`CallLayer`]: the tower layer that tells each API connection's
//! [`ConnState`] when its calls start and end (for the handshake and idle
//! timeouts), and bounds streaming watch calls per connection and in all.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tonic::body::Body as TonicBody;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;
use tower_layer::Layer;
use tower_service::Service;

use super::{ConnState, Event, Gate};

/// The streaming calls bounded by [`super::Limits::max_watches`].
pub const WATCH_METHODS: [&str; 1] = ["/dpu.v1.TelemetryService/WatchCounters"];

/// Counts calls on their connections and bounds watch calls (see the
/// module documentation).
#[derive(Debug, Clone)]
pub struct CallLayer {
    gate: Arc<Gate>,
}

impl CallLayer {
    /// A layer for the calls of connections admitted by `gate`.
    pub fn new(gate: Arc<Gate>) -> Self {
        Self { gate }
    }
}

impl<S> Layer<S> for CallLayer {
    type Service = Calls<S>;

    fn layer(&self, inner: S) -> Calls<S> {
        Calls {
            inner,
            gate: self.gate.clone(),
        }
    }
}

/// The service [`CallLayer`] wraps around the API's routes.
#[derive(Debug, Clone)]
pub struct Calls<S> {
    inner: S,
    gate: Arc<Gate>,
}

/// A call open on a connection: ends it (and its watch slot) when the
/// response's body is done or dropped.
struct Open {
    gate: Arc<Gate>,
    conn: Arc<ConnState>,
    watch: bool,
}

impl Drop for Open {
    fn drop(&mut self) {
        if self.watch {
            self.gate.end_watch(&self.conn);
        }
        self.conn.end_call();
    }
}

/// A response body holding its call open.
struct Held<B> {
    inner: B,
    _open: Option<Open>,
}

impl<B> Body for Held<B>
where
    B: Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The peer address of a request's connection, over TLS or not.
fn peer(ext: &http::Extensions) -> Option<std::net::SocketAddr> {
    ext.get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            ext.get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|i| i.get_ref().remote_addr())
        })
}

impl<S, B> Service<http::Request<B>> for Calls<S>
where
    S: Service<http::Request<B>, Response = http::Response<TonicBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<TonicBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let conn = peer(req.extensions()).and_then(|p| self.gate.conn(p));
        let Some(conn) = conn else {
            // Not a connection of this gate's listener (none should be).
            return Box::pin(self.inner.call(req));
        };
        let watch = WATCH_METHODS.contains(&req.uri().path());
        if watch && !self.gate.begin_watch(&conn) {
            self.gate.note(Event::MaxWatches, peer(req.extensions()));
            let l = self.gate.limits();
            let response = Status::resource_exhausted(format!(
                "too many watch calls open: at most {} per connection and {} in all",
                l.max_watches_per_connection, l.max_watches
            ))
            .into_http();
            return Box::pin(std::future::ready(Ok(response)));
        }
        conn.begin_call();
        let open = Open {
            gate: self.gate.clone(),
            conn,
            watch,
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await?;
            Ok(r.map(|inner| {
                TonicBody::new(Held {
                    inner,
                    _open: Some(open),
                })
            }))
        })
    }
}
