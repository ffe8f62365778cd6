//! The Prometheus endpoint: `GET /metrics` over plain HTTP/1.1.
//!
//! A deliberately small server: one request per connection, bounded
//! request size and time, no keep-alive, and connections bounded in all
//! and per source ([`Gate`]). Scrapers need nothing more.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dpu_control::service::Control;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::listen::{Event, Gate};

const MAX_REQUEST: usize = 8 * 1024;
/// Of a scrape's time, what its request may take to arrive.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves metrics on `listener` until `shutdown` turns true, to the
/// connections `gate` admits; each has `gate`'s idle timeout for the
/// whole exchange.
pub async fn serve(
    listener: TcpListener,
    gate: Arc<Gate>,
    ctl: Arc<Control>,
    mut shutdown: watch::Receiver<bool>,
) {
    let limit = gate.limits().idle_timeout.unwrap_or(REQUEST_TIMEOUT);
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Refused: dropped, so closed at once.
                    let Some(slot) = gate.admit(peer) else { continue };
                    let ctl = ctl.clone();
                    tokio::spawn(async move {
                        let served = tokio::time::timeout(limit, handle(stream, &ctl, limit));
                        tokio::select! {
                            r = served => match r {
                                Ok(Ok(())) => {}
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "metrics request failed");
                                }
                                Err(_) => slot.gate().note(Event::IdleTimeout, Some(peer)),
                            },
                            // Counted where it was displaced.
                            () = slot.until_displaced() => {}
                        }
                        drop(slot);
                    });
                }
                Err(_) => {
                    gate.note(Event::AcceptError, None);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

async fn handle(mut stream: TcpStream, ctl: &Control, limit: Duration) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(512);
    let head = tokio::time::timeout(REQUEST_TIMEOUT.min(limit), async {
        let mut chunk = [0u8; 1024];
        loop {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(true);
            }
            if buf.len() > MAX_REQUEST {
                return Ok(false);
            }
        }
    })
    .await
    .unwrap_or(Ok(false))?;
    let (status, ctype, body) = if !head {
        ("400 Bad Request", "text/plain", "bad request\n".to_string())
    } else {
        respond(&buf, ctl)
    };
    let is_head = buf.starts_with(b"HEAD ");
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(resp.as_bytes()).await?;
    if !is_head {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

fn respond(req: &[u8], ctl: &Control) -> (&'static str, &'static str, String) {
    let line = req.split(|b| *b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" && method != "HEAD" {
        return (
            "405 Method Not Allowed",
            "text/plain",
            "only GET and HEAD\n".into(),
        );
    }
    match target.split('?').next().unwrap_or("") {
        "/metrics" => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            ctl.telemetry
                .render_prometheus(&ctl.state.snapshot(), &ctl.ports),
        ),
        "/" => (
            "200 OK",
            "text/plain",
            "dpu-service metrics: GET /metrics\n".into(),
        ),
        _ => (
            "404 Not Found",
            "text/plain",
            "not found; try /metrics\n".into(),
        ),
    }
}

/// Binds the metrics listener.
///
/// # Errors
/// If the address cannot be bound.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
