//! The switch's connection table across a restart, through the real
//! binary: established TCP connections between two stations of a
//! default-deny tenant, let through by a stateful rule, keep working
//! through SIGTERM and a start on the same state directory, and are lost
//! (as documented) through `kill -9`.

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use dpu_e2e::net::{eventually, metric};
use dpu_e2e::Service;

use dpu_e2e::net::{config, Host, Reaped, ECHO_SERVER};

use super::switch::one_at_a_time;

/// Opens N connections to ADDR PORT, prints "open"; then for each line
/// read (a time limit in seconds) sends a byte on every connection and
/// prints how many echoed it within the limit and the slowest echo's
/// seconds ("-1" if none).
const CLIENTS: &str = r#"
import select, socket, sys, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conns = [socket.create_connection((addr, port), timeout=5) for _ in range(n)]
for c in conns:
    c.setblocking(False)
print("open", flush=True)
for line in sys.stdin:
    limit = float(line)
    t0 = time.time()
    for c in conns:
        try:
            c.send(b"x")
        except OSError:
            pass
    pending, got = set(conns), []
    while pending and time.time() - t0 < limit:
        ready, _, _ = select.select(list(pending), [], [], 0.05)
        for c in ready:
            try:
                d = c.recv(16)
            except OSError:
                d = b""
            if d:
                got.append(time.time() - t0)
            pending.discard(c)
    print(len(got), "%.3f" % (max(got) if got else -1), flush=True)
"#;

/// The clients' process: asks for a round and reads its answer.
struct Clients {
    _child: Reaped,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Clients {
    fn start(h: &Host, to: &str, port: &str, n: usize) -> Result<Clients> {
        let mut child = Command::new("ip")
            .args([
                "netns", "exec", &h.ns.name, "python3", "-c", CLIENTS, to, port,
            ])
            .arg(n.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let input = child.stdin.take().context("stdin")?;
        let mut output = BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        output.read_line(&mut line)?;
        ensure!(
            line.trim() == "open",
            "the clients did not connect: {line:?}"
        );
        Ok(Clients {
            _child: Reaped(child),
            input,
            output,
        })
    }

    /// One round with `limit` seconds: how many connections echoed, and
    /// the slowest echo's seconds.
    fn round(&mut self, limit: f64) -> Result<(usize, f64)> {
        writeln!(self.input, "{limit}")?;
        self.input.flush()?;
        let mut line = String::new();
        self.output.read_line(&mut line)?;
        let mut it = line.split_whitespace();
        let ok = it.next().context("no answer")?.parse()?;
        let slowest = it.next().context("no time")?.parse()?;
        Ok((ok, slowest))
    }
}

#[test]
fn tracked_connections_survive_a_graceful_restart_and_not_a_kill() -> Result<()> {
    const N: usize = 40;
    let _serial = one_at_a_time();
    let client = Host::new("ra", "10.232.0.1/24")?;
    let server = Host::new("rb", "10.232.0.2/24")?;
    let mut svc = Service::start_config(
        &config("rs", &[("pf0vf0", &client), ("pf0vf1", &server)]),
        &[],
    )?;
    // Default deny; only the client may open TCP to port 8080, stateful:
    // without its connection, neither side's next segment passes.
    svc.stateful_web_tenant("green", &["pf0vf0", "pf0vf1"], "10.232.0.1/32")?;
    let _echo = Reaped(server.spawn_python(ECHO_SERVER, &["10.232.0.2", "8080"])?);
    let mut clients = None;
    eventually("the clients' connections", || {
        clients = Clients::start(&client, "10.232.0.2", "8080", N).ok();
        clients.is_some()
    })?;
    let mut clients = clients.context("clients")?;
    let (ok, _) = clients.round(5.0)?;
    ensure!(ok == N, "{ok} of {N} connections echoed before the restart");

    // SIGTERM and a start on the same state: every connection goes on,
    // its first segment after the start passing.
    let term = Instant::now();
    svc.restart()?;
    let up = term.elapsed();
    let (ok, slowest) = clients.round(10.0)?;
    let resumed = term.elapsed();
    ensure!(
        ok == N,
        "{ok} of {N} connections echoed after a graceful restart; log:\n{}",
        svc.log_text()
    );
    ensure!(
        slowest < 2.0,
        "the first echo after the restart took {slowest} s"
    );
    let log = svc.log_text();
    ensure!(log.contains("switch tables saved"), "{log}");
    ensure!(log.contains("switch tables restored"), "{log}");
    let (_, body) = svc.http_get("/metrics")?;
    let restored = metric(
        &body,
        "dpu_switch_restored_entries_total{table=\"conntrack\",outcome=\"restored\"}",
    );
    ensure!(restored >= N as u64, "{restored} connections restored");
    eprintln!(
        "graceful restart: {N} of {N} connections kept; SIGTERM to ready {:.0} ms, \
         to every connection echoing {:.0} ms (slowest echo {:.0} ms)",
        up.as_secs_f64() * 1e3,
        resumed.as_secs_f64() * 1e3,
        slowest * 1e3
    );

    // kill -9: nothing is saved, the tables are lost, and so are the
    // connections (their segments are refused as invalid).
    svc.crash_and_restart()?;
    let (ok, _) = clients.round(3.0)?;
    ensure!(ok == 0, "{ok} connections echoed after kill -9");
    let (_, body) = svc.http_get("/metrics")?;
    let invalid = metric(
        &body,
        "dpu_dropped_packets_total{reason=\"conntrack_invalid\"}",
    );
    ensure!(invalid >= N as u64, "{invalid} segments refused as invalid");
    eprintln!("kill -9: 0 of {N} connections kept");
    Ok(())
}
