//! The API's and the metrics' listeners under floods, through the real
//! binary: ten thousand connections to the gRPC port that send nothing
//! or half an HTTP/2 preface, from forty source addresses and from the
//! one `dpuctl` uses, and two thousand to the metrics port. While they
//! stay, a host's NVMe/TCP I/O goes on, `dpuctl` and `/metrics` answer,
//! and the daemon's descriptors and memory stay within the listeners'
//! bounds; once the handshake timeout passes, the flood holds nothing.
//! With mutual TLS the same flood sends half a TLS handshake. Streaming
//! watch calls are bounded per connection.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dpu_client::{ClientConfig, ClientError, DpuClient, TlsConfig};
use dpu_e2e::net::metric;
use dpu_e2e::pki::make_test_pki;
use dpu_e2e::{free_port, nvmf_perf_iops, Service, TEST_CONFIG};
use dpu_proto::v1 as pb;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

const NQN: &str = "nqn.2024-01.io.dpu-service:api-flood";
/// The host NQN `nvmf-perf` presents.
const PERF_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000001";

/// The listeners' bounds of these tests: the defaults but for a short
/// handshake timeout, so the flood's end shows within the test.
const BOUNDS: &str = "
[grpc]
handshake_timeout_secs = 3
max_watches_per_connection = 2

[metrics]
request_timeout_secs = 3
";

fn metric_of(svc: &Service, sample: &str) -> Result<u64> {
    Ok(metric(&svc.http_get("/metrics")?.1, sample))
}

/// The daemon's open descriptors and resident memory (KiB).
pub(crate) fn fds_and_rss(svc: &Service) -> Result<(usize, u64)> {
    let pid = svc.pid().context("the service runs")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    Ok((fds, dpu_e2e::rss_kib(pid)?.1))
}

/// `count` connections to `to` from `from`, each sending `first` (maybe
/// nothing) and then nothing more; those that could not connect are
/// counted, not failed on (the listen backlog may overflow).
pub(crate) async fn flood(
    to: SocketAddr,
    from: Ipv4Addr,
    count: usize,
    first: &'static [u8],
) -> (Vec<TcpStream>, usize) {
    let mut held = Vec::with_capacity(count);
    let mut failed = 0;
    for _ in 0..count {
        let s = async {
            let sock = TcpSocket::new_v4()?;
            sock.bind(SocketAddr::from((from, 0)))?;
            let mut s = sock.connect(to).await?;
            if !first.is_empty() {
                s.write_all(first).await?;
            }
            Ok::<_, std::io::Error>(s)
        };
        match tokio::time::timeout(Duration::from_secs(2), s).await {
            Ok(Ok(s)) => held.push(s),
            _ => failed += 1,
        }
    }
    (held, failed)
}

/// An NVMe/TCP job of 0.5 s (4 KiB random reads, QD 4): its IOPS.
fn perf(port: u16) -> Result<f64> {
    nvmf_perf_iops(port, NQN, &["--time", "0.5", "--job", "randread:4k:4"])
}

/// Waits up to `limit` for `check` to hold.
fn within(limit: Duration, what: &str, mut check: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    loop {
        if check()? {
            return Ok(());
        }
        ensure!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn silent_and_half_preface_floods_leave_every_plane_answering() -> Result<()> {
    let _one = crate::floods();
    dpu_os::limits::raise_open_files()?;
    let svc = Service::start_config(&format!("{TEST_CONFIG}{BOUNDS}"), &[])?;
    let port = free_port();
    svc.local_subsystem("flood", NQN, &[PERF_HOST], "16MiB", port)?;
    let before = perf(port)?;
    let (fds0, rss0) = fds_and_rss(&svc)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (grpc, metrics) = (svc.grpc, svc.metrics);
    let (mut held, mut failed, mut at_metrics) = (Vec::new(), 0, 0);
    let flood_start = std::time::Instant::now();
    rt.block_on(async {
        // Forty sources of 200 silent connections and 50 half prefaces
        // each; 1,000 silent ones from dpuctl's own address; 2,000 at the
        // metrics port.
        for i in 1..=40u8 {
            let from = Ipv4Addr::new(127, 0, 1, i);
            for (n, first) in [(200, &b""[..]), (50, &b"PRI * HTTP/2"[..])] {
                let (h, f) = flood(grpc, from, n, first).await;
                held.extend(h);
                failed += f;
            }
        }
        let (h, f) = flood(grpc, Ipv4Addr::LOCALHOST, 1000, b"").await;
        held.extend(h);
        failed += f;
        let (h, f) = flood(metrics, Ipv4Addr::new(127, 0, 2, 1), 2000, b"").await;
        at_metrics = h.len();
        held.extend(h);
        failed += f;
    });
    ensure!(
        held.len() >= 10_000,
        "{} connections made, {failed} failed",
        held.len()
    );

    // While the flood stays: every plane answers.
    for _ in 0..3 {
        let out = svc.dpuctl_ok(&["subsystem", "list"])?;
        ensure!(out.contains("flood"), "dpuctl during the flood: {out}");
    }
    let during = perf(port)?;
    ensure!(
        during > 0.0,
        "NVMe/TCP I/O during the flood: {during} IOPS ({before:.0} before)"
    );
    let body = svc.http_get("/metrics")?.1;
    let open = metric(&body, "dpu_listener_connections{listener=\"grpc\"}");
    let displaced = metric(
        &body,
        "dpu_listener_closed_total{listener=\"grpc\",reason=\"displaced\"}",
    );
    // The metrics' flood took long enough for the first of it to reach
    // the scrape timeout.
    let metrics_displaced = ["displaced", "idle_timeout"]
        .map(|r| {
            metric(
                &body,
                &format!("dpu_listener_closed_total{{listener=\"metrics\",reason=\"{r}\"}}"),
            )
        })
        .iter()
        .sum::<u64>();
    ensure!(open <= 256, "{open} API connections open");
    ensure!(displaced >= 9_000, "{displaced} API connections displaced");
    let metrics_open = metric(&body, "dpu_listener_connections{listener=\"metrics\"}");
    ensure!(
        metrics_open <= 32 && metrics_displaced >= at_metrics as u64 / 2,
        "{metrics_open} metrics connections open, {metrics_displaced} of {at_metrics} \
         displaced or timed out"
    );
    let (fds1, rss1) = fds_and_rss(&svc)?;
    eprintln!(
        "api flood: {} connections ({failed} failed), {displaced} + {metrics_displaced} displaced, \
         {open} open; descriptors {fds0} -> {fds1}, RSS {rss0} -> {rss1} KiB; \
         NVMe/TCP {before:.0} -> {during:.0} IOPS",
        held.len()
    );
    // The API's and the metrics' places, and as many closing of each.
    ensure!(
        fds1 <= fds0 + 2 * (256 + 32) + 16,
        "descriptors {fds0} -> {fds1}"
    );
    ensure!(
        rss1.saturating_sub(rss0) < 64 << 10,
        "RSS {rss0} -> {rss1} KiB"
    );

    // Past the handshake timeout the flood holds no place, though its
    // sockets stay open on this side.
    within(Duration::from_secs(10), "the flood's places freed", || {
        let body = svc.http_get("/metrics")?.1;
        Ok(
            metric(&body, "dpu_listener_connections{listener=\"grpc\"}") == 0
                && metric(&body, "dpu_listener_connections{listener=\"metrics\"}") <= 1,
        )
    })?;
    ensure!(
        metric_of(
            &svc,
            "dpu_listener_closed_total{listener=\"grpc\",reason=\"handshake_timeout\"}"
        )? >= 200,
        "silent connections closed at the handshake timeout"
    );
    // Each listener logs its displacements at most once every 10 s, so
    // while the flood lasted at most 1 + secs/10 lines each (on a busy
    // machine the flood takes longer than the 10 s of one line).
    let most = 1 + flood_start.elapsed().as_secs() as usize / 10;
    let log = svc.log_text();
    for listener in ["grpc", "metrics"] {
        let lines = log
            .lines()
            .filter(|l| {
                l.contains("connection closed: displaced")
                    && l.contains(&format!("listener=\"{listener}\""))
            })
            .count();
        ensure!(
            lines <= most,
            "{listener}: {lines} displacement lines, over {most}, when they are logged at most every 10 s:\n{log}"
        );
    }
    drop(held);
    Ok(())
}

/// Half a TLS ClientHello: a handshake record's header announcing more
/// than follows.
const HALF_HELLO: &[u8] = &[
    0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
];

#[test]
fn a_half_handshake_flood_under_mutual_tls_leaves_the_api_answering() -> Result<()> {
    let _one = crate::floods();
    dpu_os::limits::raise_open_files()?;
    let pki = tempfile::tempdir()?;
    make_test_pki(pki.path())?;
    let p = |f: &str| pki.path().join(f).display().to_string();
    let config = format!(
        "{TEST_CONFIG}{BOUNDS}\n[[grpc.clients]]\nidentity = \"cn:client\"\nrole = \"admin\"\n"
    );
    let svc = Service::start_config(
        &config,
        &[
            "--tls-cert",
            &p("server.crt"),
            "--tls-key",
            &p("server.key"),
            "--tls-client-ca",
            &p("ca.crt"),
        ],
    )?;
    let grpc = svc.grpc;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let read = |f: &str| std::fs::read(pki.path().join(f));
    let cfg = ClientConfig {
        endpoint: format!("https://localhost:{}", grpc.port()),
        tls: Some(TlsConfig {
            ca_cert_pem: read("ca.crt")?,
            client_cert_pem: Some(read("client.crt")?),
            client_key_pem: Some(read("client.key")?),
            server_name: None,
        }),
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    let (held, answered) = rt.block_on(async {
        let mut held = Vec::new();
        for i in 1..=20u8 {
            let (h, _) = flood(grpc, Ipv4Addr::new(127, 0, 3, i), 100, HALF_HELLO).await;
            held.extend(h);
        }
        let (h, _) = flood(grpc, Ipv4Addr::LOCALHOST, 500, HALF_HELLO).await;
        held.extend(h);
        // A client that completes its handshake and calls gets in.
        let mut answered = 0;
        for _ in 0..3 {
            let c = DpuClient::connect(cfg.clone()).await?;
            c.list_tenants(pb::ListTenantsRequest::default()).await?;
            answered += 1;
        }
        // The clients' connections close once their tasks run.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok::<_, anyhow::Error>((held, answered))
    })?;
    ensure!(held.len() >= 2_000, "{} connections made", held.len());
    ensure!(answered == 3);
    let body = svc.http_get("/metrics")?.1;
    let open = metric(&body, "dpu_listener_connections{listener=\"grpc\"}");
    let displaced = metric(
        &body,
        "dpu_listener_closed_total{listener=\"grpc\",reason=\"displaced\"}",
    );
    eprintln!(
        "mTLS half-handshake flood: {} connections, {displaced} displaced, {open} open",
        held.len()
    );
    ensure!(
        open <= 256 && displaced >= 1_500,
        "{open} open, {displaced} displaced"
    );
    within(Duration::from_secs(10), "the flood's places freed", || {
        let body = svc.http_get("/metrics")?.1;
        eprintln!(
            "{}",
            body.lines()
                .filter(|l| l.starts_with("dpu_listener") && l.contains("\"grpc\""))
                .collect::<Vec<_>>()
                .join("\n")
        );
        Ok(metric(&body, "dpu_listener_connections{listener=\"grpc\"}") == 0)
    })
    .with_context(|| {
        let top = Command::new("top")
            .args(["-b", "-H", "-n1", "-p", &svc.pid().unwrap_or(0).to_string()])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string());
        format!(
            "fds {:?}; top {top:?}; log:\n{}",
            fds_and_rss(&svc),
            svc.log_text()
        )
    })?;
    drop(held);
    Ok(())
}

#[tokio::test]
async fn watch_calls_are_bounded_per_connection() -> Result<()> {
    let svc = Service::start_config(&format!("{TEST_CONFIG}{BOUNDS}"), &[])?;
    let cfg = ClientConfig {
        endpoint: svc.endpoint(),
        timeout: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    // Clones share one connection.
    let c = DpuClient::connect(cfg.clone()).await?;
    let watch = || pb::WatchCountersRequest {
        interval_ms: 100,
        ..Default::default()
    };
    let mut first = c.watch_counters(watch()).await?;
    let second = c.watch_counters(watch()).await?;
    let third = c.watch_counters(watch()).await;
    match third {
        Err(ClientError::Status {
            code: tonic::Code::ResourceExhausted,
            ..
        }) => {}
        other => anyhow::bail!("a third watch on one connection: {other:?}"),
    }
    ensure!(first.message().await?.is_some(), "the first watch streams");
    // Another connection has its own two.
    let other = DpuClient::connect(cfg).await?;
    let _third = other.watch_counters(watch()).await?;
    // One ends: its place comes back.
    drop(second);
    let mut again = None;
    for _ in 0..50 {
        if let Ok(w) = c.watch_counters(watch()).await {
            again = Some(w);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(again.is_some(), "no watch after one ended");
    let body = svc.http_get("/metrics")?.1;
    ensure!(
        metric(
            &body,
            "dpu_listener_refused_total{listener=\"grpc\",reason=\"max_watches\"}"
        ) >= 1,
        "{body}"
    );
    ensure!(metric(&body, "dpu_listener_watches{listener=\"grpc\"}") == 3);
    Ok(())
}
