//! The soak (`tests/soak.sh [SECONDS]`): one service under everything at
//! once for a bounded time (default 300 s), through the real binaries.
//!
//! - NVMe/TCP I/O from three hosts (the crate's host library), each
//!   writing 4 KiB blocks of its own pattern to its own part of a file
//!   namespace and reading every one back, reconnecting when the service
//!   goes away; a write that got no answer may have landed or not, and
//!   either is accepted once.
//! - TCP across the switch in two tenants (network namespaces on veth
//!   pairs, DPDK `net_af_packet` ports), each a default-deny tenant whose
//!   only rule is a stateful allow: long-lived connections echo verified
//!   bytes, and reconnect when one stalls.
//! - API churn through `dpuctl`: tenants with rules, and RAM namespaces
//!   with QoS limits, created and deleted at a steady rate; every call the
//!   service answered with success is remembered.
//! - Floods from another source address: idle connections to the gRPC
//!   port and to the NVMe/TCP port, twice, each for a tenth of the run.
//! - A graceful restart (SIGTERM) at 35% of the run and a `kill -9` with
//!   a restart at 75%.
//!
//! At the end, with the load stopped: no verified byte was wrong; every
//! acknowledged change of the API is in the state; no switch connection
//! broke across the graceful restart (they all break across the kill,
//! whose tables are lost); the tenants' counters add up; and the last
//! process's RSS, file descriptors and threads are within the stated
//! bounds of the first's when it was idle before the load. It prints one
//! line of figures and exits non-zero naming what failed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use dpu_e2e::net::{config, metric, Host, Reaped, ECHO_SERVER};
use dpu_e2e::{binary, free_port, rss_kib, Service};
use dpu_nvmeof::host::{self, Controller, ControllerOptions, HostIdentity, QueueOptions, Transfer};

const NQN: &str = "nqn.2024-01.io.dpu-service.test:soak";
/// Block size of the file namespace, and bytes per verified write.
const BLOCK: u64 = 512;
const CHUNK: u64 = 4096;
/// 4 KiB slots each NVMe host writes and reads.
const SLOTS: u64 = 1024;
const NVME_HOSTS: u64 = 3;
/// Connections per tenant across the switch.
const CONNS: usize = 8;
/// RSS the last process may hold beyond the first's, idle: the tables
/// and buffers a loaded process keeps (the connection tables are
/// allocated in full at start, so they are not among them).
const RSS_SLACK_KIB: u64 = 64 * 1024;

/// Threads the last process may have beyond the first's, idle: the
/// blocking pool's threads still waiting out their 10 s after the load.
const THREAD_SLACK: usize = 4;

/// Until the Unix time DEADLINE: N connections to ADDR PORT, in turn
/// each sends 1..4096 random bytes and waits for them back (4 s at
/// most: a stall is a break, and the connection is made again). Prints
/// `bytes BAD_BYTES break_time...` at the end.
const TRAFFIC: &str = r#"
import os, random, socket, sys, time
addr, port, n, deadline = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
def connect():
    while time.time() < deadline:
        try:
            c = socket.create_connection((addr, port), timeout=2)
            c.settimeout(4)
            return c
        except OSError:
            time.sleep(0.5)
    return None
conns = [connect() for _ in range(n)]
good = bad = 0
breaks = []
while time.time() < deadline:
    for i in range(n):
        if conns[i] is None:
            conns[i] = connect()
            continue
        out = os.urandom(random.randint(1, 4096))
        got = b""
        try:
            conns[i].sendall(out)
            while len(got) < len(out):
                d = conns[i].recv(len(out) - len(got))
                if not d:
                    raise OSError("closed")
                got += d
        except OSError:
            breaks.append(time.time())
            conns[i].close()
            conns[i] = None
            continue
        if got == out:
            good += len(out)
        else:
            bad += sum(1 for a, b in zip(got, out) if a != b)
    time.sleep(0.01)
print(good, bad, *["%.3f" % t for t in breaks], flush=True)
"#;

/// Opens COUNT connections from SOURCE to ADDR PORT that send nothing,
/// holds them for SECS seconds and closes them; prints how many opened.
const FLOOD: &str = r#"
import resource, socket, sys, time
addr, port, count, secs, source = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
t0 = time.time()
for _ in range(count):
    s = socket.socket()
    s.settimeout(1)
    try:
        s.bind((source, 0))
        s.connect((addr, port))
        held.append(s)
    except OSError:
        s.close()
time.sleep(max(0, secs - (time.time() - t0)))
print(len(held), flush=True)
"#;

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What the threads share: the service's API address of the moment, and
/// when to stop.
struct Shared {
    endpoint: Mutex<String>,
    stop: AtomicBool,
}

/// What a slot of an NVMe host holds: a written sequence number (0:
/// never written, zeros), or either of two when a write got no answer.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Known(u64),
    Either(u64, u64),
}

/// The 4 KiB pattern of host `h`'s write number `seq` to slot `slot`
/// (zeros for 0).
fn pattern(h: u64, slot: u64, seq: u64) -> Vec<u8> {
    if seq == 0 {
        return vec![0; CHUNK as usize];
    }
    let mut word = [0u8; 16];
    word[..4].copy_from_slice(&(h as u32).to_le_bytes());
    word[4..8].copy_from_slice(&(slot as u32).to_le_bytes());
    word[8..].copy_from_slice(&seq.to_le_bytes());
    word.repeat(CHUNK as usize / 16)
}

/// An NVMe host's figures.
#[derive(Debug, Default)]
struct NvmeStats {
    writes: AtomicU64,
    reads: AtomicU64,
    bad: AtomicU64,
    reconnects: AtomicU64,
}

/// One NVMe host: writes and verifies its slots until told to stop.
fn nvme_host(addr: SocketAddr, h: u64, shared: &Shared, stats: &NvmeStats) {
    let me = HostIdentity::new(
        &format!("nqn.2014-08.org.nvmexpress:uuid:50a50a50-0000-4000-8000-00000000000{h}"),
        [h as u8; 16],
    );
    let opts = ControllerOptions {
        kato: Duration::from_secs(30),
        queue: QueueOptions {
            timeout: Some(Duration::from_secs(10)),
            ..QueueOptions::default()
        },
    };
    let mut rng = dpu_rand::Rng::new(0x50a4 + h);
    let mut slots = vec![Slot::Known(0); SLOTS as usize];
    let mut seq = 0u64;
    let first = h * SLOTS * (CHUNK / BLOCK);
    let nlb = (CHUNK / BLOCK - 1) as u16;
    while !shared.stop.load(Ordering::Relaxed) {
        let stream = || -> Result<TcpStream> {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            s.set_nodelay(true)?;
            Ok(s)
        };
        let connected = (|| -> Result<_> {
            let mut c = Controller::connect(stream()?, &me, NQN, &opts)?;
            ensure!(c.set_io_queues(1)? >= 1, "no I/O queue");
            let q = c.io_queue(stream()?, 1, 32)?;
            Ok((c, q))
        })();
        let Ok((_ctrl, mut q)) = connected else {
            stats.reconnects.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        while !shared.stop.load(Ordering::Relaxed) {
            let s = rng.below(SLOTS);
            let lba = first + s * (CHUNK / BLOCK);
            if rng.below(2) == 0 {
                seq += 1;
                let was = slots[s as usize];
                let w = q.call(
                    host::write(1, lba, nlb),
                    Transfer::Write(pattern(h, s, seq)),
                );
                if w.is_err() {
                    let old = match was {
                        Slot::Known(o) => o,
                        // Two unanswered writes in a row: the older
                        // guess goes (the read after the reconnect
                        // settles it before another write).
                        Slot::Either(_, n) => n,
                    };
                    slots[s as usize] = Slot::Either(old, seq);
                    break;
                }
                slots[s as usize] = Slot::Known(seq);
                stats.writes.fetch_add(1, Ordering::Relaxed);
            }
            let Ok(c) = q.call(
                host::read(1, lba, nlb),
                Transfer::Read(vec![0; CHUNK as usize]),
            ) else {
                break;
            };
            let ok = match slots[s as usize] {
                Slot::Known(n) => c.data == pattern(h, s, n),
                Slot::Either(a, b) => {
                    let hit = [a, b].into_iter().find(|&n| c.data == pattern(h, s, n));
                    if let Some(n) = hit {
                        slots[s as usize] = Slot::Known(n);
                    }
                    hit.is_some()
                }
            };
            if ok {
                stats.reads.fetch_add(1, Ordering::Relaxed);
            } else {
                stats.bad.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "soak: nvme host {h} slot {s}: read back {:?}",
                    &c.data[..16]
                );
            }
        }
        stats.reconnects.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the API churn expects of a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Present,
    Absent,
    /// A call whose answer never came, and the state could not be
    /// asked after it: either.
    Either,
}

/// API churn figures and expectations, by resource ("tenant/NAME",
/// "namespace/NSID").
#[derive(Debug, Default)]
struct Churn {
    ok: u64,
    unanswered: u64,
    refused: Vec<String>,
    expect: BTreeMap<String, Expect>,
}

/// Runs dpuctl against the service of the moment: Ok(true) on success,
/// Ok(false) when the service did not answer (restarting), Err on a
/// refusal.
fn dpuctl(shared: &Shared, args: &[&str]) -> Result<bool> {
    let endpoint = shared
        .endpoint
        .lock()
        .map(|e| e.clone())
        .unwrap_or_default();
    let out = Command::new(binary("dpuctl")?)
        .arg("--endpoint")
        .arg(&endpoint)
        .args(args)
        .output()?;
    if out.status.success() {
        return Ok(true);
    }
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    // Transport errors: the service was down or went down mid-call.
    if [
        "transport error",
        "Unavailable",
        "connect",
        "Connection",
        "broken pipe",
        "h2 protocol",
    ]
    .iter()
    .any(|m| err.contains(m))
    {
        return Ok(false);
    }
    bail!("dpuctl {args:?}: {err}")
}

/// Whether resource `key` is in the state now, asked until the service
/// answers (30 s at most): what settles a call whose answer never came.
fn present(shared: &Shared, key: &str) -> Option<bool> {
    let (kind, name) = key.split_once('/')?;
    let args: Vec<&str> = match kind {
        "tenant" => vec!["tenant", "get", name],
        "rule" => vec!["rule", "get", name, "r"],
        _ => vec!["--output", "json", "namespace", "list", "soak"],
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let endpoint = shared
            .endpoint
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default();
        let out = Command::new(binary("dpuctl").ok()?)
            .arg("--endpoint")
            .arg(&endpoint)
            .args(&args)
            .output()
            .ok()?;
        if kind == "namespace" && out.status.success() {
            let list = String::from_utf8_lossy(&out.stdout).replace([' ', '\n'], "");
            return Some(list.contains(&format!("\"nsid\":{name}")));
        }
        if out.status.success() {
            return Some(true);
        }
        if String::from_utf8_lossy(&out.stderr).contains("NOT_FOUND") {
            return Some(false);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// Creates and deletes tenants (with a rule) and RAM namespaces, ten
/// calls a second, until told to stop. A call whose answer never came
/// (the service restarting) is settled by asking the state once the
/// service answers again.
fn churn(shared: &Shared) -> Churn {
    let mut c = Churn::default();
    let mut round = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        let k = round % 6;
        let tenant = format!("churn-{k}");
        let nsid = (10 + k).to_string();
        let steps: Vec<(String, Vec<String>, Expect)> = match (round / 6) % 2 {
            0 => vec![
                (
                    format!("tenant/{tenant}"),
                    vec!["tenant".into(), "create".into(), tenant.clone()],
                    Expect::Present,
                ),
                (
                    format!("rule/{tenant}"),
                    [
                        "rule",
                        "add",
                        &tenant,
                        "--id",
                        "r",
                        "--priority",
                        "1",
                        "--action",
                        "allow",
                        "--proto",
                        "udp",
                        "--dport",
                        "53",
                    ]
                    .map(String::from)
                    .to_vec(),
                    Expect::Present,
                ),
                (
                    format!("namespace/{nsid}"),
                    [
                        "namespace",
                        "create",
                        "soak",
                        "--ram",
                        "1MiB",
                        "--nsid",
                        &nsid,
                        // Its QoS limiter comes and goes with it.
                        "--iops",
                        "5000",
                    ]
                    .map(String::from)
                    .to_vec(),
                    Expect::Present,
                ),
            ],
            _ => vec![
                (
                    format!("tenant/{tenant}"),
                    ["tenant", "delete", &tenant, "--force"]
                        .map(String::from)
                        .to_vec(),
                    Expect::Absent,
                ),
                (
                    format!("namespace/{nsid}"),
                    ["namespace", "delete", "soak", &nsid]
                        .map(String::from)
                        .to_vec(),
                    Expect::Absent,
                ),
            ],
        };
        for (key, args, want) in steps {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            // A tenant's deletion takes its rule along.
            let also = (key.starts_with("tenant/") && want == Expect::Absent)
                .then(|| key.replace("tenant/", "rule/"));
            match dpuctl(shared, &args) {
                Ok(true) => {
                    c.ok += 1;
                    c.expect.insert(key, want);
                    if let Some(rule) = also {
                        c.expect.insert(rule, Expect::Absent);
                    }
                }
                Ok(false) => {
                    c.unanswered += 1;
                    for k in std::iter::once(key).chain(also) {
                        let now = match present(shared, &k) {
                            Some(true) => Expect::Present,
                            Some(false) => Expect::Absent,
                            None => Expect::Either,
                        };
                        c.expect.insert(k, now);
                    }
                }
                // What the state already is, after a call whose answer
                // never came did not happen: a create finding it there,
                // a delete finding it gone.
                Err(e)
                    if c.expect.get(&key) == Some(&want)
                        && e.to_string().contains(match want {
                            Expect::Present => "ALREADY_EXISTS",
                            _ => "NOT_FOUND",
                        }) => {}
                // A rule of a tenant whose creation did not happen.
                Err(e)
                    if key.starts_with("rule/")
                        && c.expect.get(&key.replace("rule/", "tenant/"))
                            == Some(&Expect::Absent)
                        && e.to_string().contains("NOT_FOUND") => {}
                Err(e) => c.refused.push(e.to_string()),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        round += 1;
    }
    c
}

/// The file descriptors and threads of process `pid`.
fn fds_and_threads(pid: u32) -> Result<(usize, usize)> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))?.count();
    Ok((fds, threads))
}

/// The service's resident memory (KiB), file descriptors and threads.
fn footprint(svc: &Service) -> Result<(u64, usize, usize)> {
    let pid = svc.pid().context("the service is not running")?;
    let (rss, _) = rss_kib(pid)?;
    let (fds, threads) = fds_and_threads(pid)?;
    Ok((rss, fds, threads))
}

fn main() -> Result<()> {
    let secs: u64 = match std::env::args().nth(1) {
        Some(s) => s.parse().context("the soak's length in seconds")?,
        None => 300,
    };
    ensure!(secs >= 20, "a soak of at least 20 s");
    let at = |fraction: f64| Duration::from_secs_f64(secs as f64 * fraction);
    let _ = dpu_os::limits::raise_open_files();

    let stations = [
        Host::new("qa", "10.241.0.1/24")?,
        Host::new("qb", "10.241.0.2/24")?,
        Host::new("qc", "10.242.0.1/24")?,
        Host::new("qd", "10.242.0.2/24")?,
    ];
    let ports = ["pf0vf0", "pf0vf1", "pf0vf2", "pf0vf3"];
    let listed: Vec<(&str, &Host)> = ports.iter().copied().zip(stations.iter()).collect();
    let text = config("soak", &listed) + "\n[storage]\nram_limit = \"256MiB\"\n";
    let mut svc = Service::start_config(&text, &[])?;
    let nvme_port = free_port();
    let file = svc.state_dir.join("volumes/soak.img");
    let size = format!("{}MiB", (NVME_HOSTS * SLOTS * CHUNK) >> 20);
    for args in [
        vec![
            "subsystem",
            "create",
            "soak",
            "--nqn",
            NQN,
            "--allow-any-host",
        ],
        vec![
            "namespace",
            "create",
            "soak",
            "--nsid",
            "1",
            "--file",
            file.to_str().context("path")?,
            "--size",
            &size,
        ],
        vec![
            "listener",
            "create",
            "soak",
            "--address",
            "127.0.0.1",
            "--port",
            &nvme_port.to_string(),
        ],
    ] {
        svc.dpuctl_ok(&args)?;
    }
    for (tenant, (a, b), net) in [
        ("red", (ports[0], ports[1]), "10.241.0"),
        ("blue", (ports[2], ports[3]), "10.242.0"),
    ] {
        svc.stateful_web_tenant(tenant, &[a, b], &format!("{net}.1/32"))?;
    }
    std::thread::sleep(Duration::from_secs(2));
    let idle = footprint(&svc)?;

    let t0 = Instant::now();
    let deadline = unix_now() + secs as f64;
    let shared = Arc::new(Shared {
        endpoint: Mutex::new(svc.endpoint()),
        stop: AtomicBool::new(false),
    });
    let _servers: Vec<Reaped> = [&stations[1], &stations[3]]
        .iter()
        .zip(["10.241.0.2", "10.242.0.2"])
        .map(|(h, a)| h.spawn_python(ECHO_SERVER, &[a, "8080"]).map(Reaped))
        .collect::<Result<_>>()?;
    let traffic: Vec<Reaped> = [&stations[0], &stations[2]]
        .iter()
        .zip(["10.241.0.2", "10.242.0.2"])
        .map(|(h, a)| {
            h.spawn_python_out(
                TRAFFIC,
                &[a, "8080", &CONNS.to_string(), &format!("{deadline}")],
            )
            .map(Reaped)
        })
        .collect::<Result<_>>()?;
    let addr: SocketAddr = ([127, 0, 0, 1], nvme_port).into();
    let nvme: Vec<Arc<NvmeStats>> = (0..NVME_HOSTS).map(|_| Arc::default()).collect();
    let mut threads = Vec::new();
    for (h, stats) in nvme.iter().enumerate() {
        let (shared, stats) = (shared.clone(), stats.clone());
        threads.push(std::thread::spawn(move || {
            nvme_host(addr, h as u64, &shared, &stats)
        }));
    }
    let churned = {
        let shared = shared.clone();
        std::thread::spawn(move || churn(&shared))
    };

    let flood = |svc: &Service| -> Result<Vec<Reaped>> {
        let secs = format!("{:.1}", at(0.1).as_secs_f64());
        let grpc_port = svc.grpc.port().to_string();
        let nvme_port = nvme_port.to_string();
        [(grpc_port, "2000"), (nvme_port, "800")]
            .iter()
            .map(|(port, n)| {
                Command::new("python3")
                    .args(["-c", FLOOD, "127.0.0.1", port, n, &secs, "127.0.0.2"])
                    .stdout(Stdio::piped())
                    .spawn()
                    .map(Reaped)
                    .map_err(Into::into)
            })
            .collect()
    };
    let sleep_until = |d: Duration| {
        if let Some(left) = d.checked_sub(t0.elapsed()) {
            std::thread::sleep(left);
        }
    };

    sleep_until(at(0.1));
    let first_flood = flood(&svc)?;
    sleep_until(at(0.35));
    let graceful = unix_now();
    svc.restart()?;
    *shared.endpoint.lock().unwrap_or_else(|e| e.into_inner()) = svc.endpoint();
    sleep_until(at(0.55));
    let second_flood = flood(&svc)?;
    sleep_until(at(0.75));
    let killed = unix_now();
    svc.crash_and_restart()?;
    *shared.endpoint.lock().unwrap_or_else(|e| e.into_inner()) = svc.endpoint();
    sleep_until(at(1.0));

    shared.stop.store(true, Ordering::Relaxed);
    let mut failed = Vec::new();
    let mut flooded = Vec::new();
    for mut f in first_flood.into_iter().chain(second_flood) {
        let out = f.0.stdout.take();
        let mut line = String::new();
        if let Some(o) = out {
            BufReader::new(o).read_line(&mut line)?;
        }
        flooded.push(line.trim().to_string());
    }
    for t in threads {
        let _ = t.join();
    }
    let churn = churned
        .join()
        .map_err(|_| anyhow::anyhow!("the churn thread panicked"))?;
    let mut moved = 0u64;
    for (i, mut t) in traffic.into_iter().enumerate() {
        let mut line = String::new();
        if let Some(o) = t.0.stdout.take() {
            BufReader::new(o).read_line(&mut line)?;
        }
        let mut it = line.split_whitespace();
        let good: u64 = it.next().context("traffic figures")?.parse()?;
        let bad: u64 = it.next().context("traffic figures")?.parse()?;
        let breaks: Vec<f64> = it.filter_map(|t| t.parse().ok()).collect();
        moved += good;
        let tenant = ["red", "blue"][i];
        if good == 0 {
            failed.push(format!("{tenant}: no byte crossed the switch"));
        }
        if bad > 0 {
            failed.push(format!("{tenant}: {bad} bytes came back wrong"));
        }
        let across_restart = breaks
            .iter()
            .filter(|&&t| t >= graceful && t < killed)
            .count();
        if across_restart > 0 {
            failed.push(format!(
                "{tenant}: {across_restart} connections broke across the graceful restart"
            ));
        }
        let across_kill = breaks.iter().filter(|&&t| t >= killed).count();
        eprintln!(
            "soak: {tenant}: {good} bytes verified, {} breaks ({across_kill} after the kill -9)",
            breaks.len()
        );
    }
    let (mut writes, mut reads) = (0, 0);
    for (h, s) in nvme.iter().enumerate() {
        let (w, r, bad) = (
            s.writes.load(Ordering::Relaxed),
            s.reads.load(Ordering::Relaxed),
            s.bad.load(Ordering::Relaxed),
        );
        (writes, reads) = (writes + w, reads + r);
        if w == 0 || r == 0 {
            failed.push(format!("nvme host {h}: {w} writes, {r} reads"));
        }
        if bad > 0 {
            failed.push(format!("nvme host {h}: {bad} blocks read back wrong"));
        }
    }

    // Every acknowledged change is there.
    let tenants = svc.dpuctl_json(&["tenant", "list"])?.to_string();
    let namespaces = svc.dpuctl_json(&["namespace", "list", "soak"])?.to_string();
    for (key, want) in &churn.expect {
        let present = match key.split_once('/') {
            Some(("tenant", t)) => tenants.contains(&format!("\"tenants/{t}\"")),
            Some(("namespace", n)) => namespaces.contains(&format!("\"nsid\":{n}")),
            Some(("rule", t)) => {
                tenants.contains(&format!("\"tenants/{t}\""))
                    && svc
                        .dpuctl_json(&["rule", "list", t])
                        .is_ok_and(|r| r.to_string().contains("rules/r\""))
            }
            _ => bail!("unknown resource {key}"),
        };
        match want {
            Expect::Present if !present => failed.push(format!("{key}: acknowledged, missing")),
            Expect::Absent if present => failed.push(format!("{key}: deleted, still there")),
            _ => {}
        }
    }
    if !churn.refused.is_empty() {
        failed.push(format!(
            "{} API calls refused, the first: {:?}",
            churn.refused.len(),
            &churn.refused[..churn.refused.len().min(3)]
        ));
    }

    // The tenants' counters add up once the load has stopped.
    std::thread::sleep(Duration::from_secs(2));
    let (_, body) = svc.http_get("/metrics")?;
    for t in ["red", "blue"] {
        let m = |f: &str| metric(&body, &format!("dpu_tenant_{f}{{tenant=\"{t}\"}}"));
        let (rx, fwd, drop) = (
            m("rx_packets_total"),
            m("forwarded_packets_total"),
            m("dropped_packets_total"),
        );
        if rx == 0 || rx != fwd + drop {
            failed.push(format!(
                "{t}: received {rx}, forwarded {fwd}, dropped {drop}"
            ));
        }
    }

    // Connections the last checks made (dpuctl, the scrape) close within
    // moments; a leak stays.
    let settled = Instant::now() + Duration::from_secs(10);
    let mut end = footprint(&svc)?;
    while (end.1 > idle.1 || end.2 > idle.2 + THREAD_SLACK) && Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(500));
        end = footprint(&svc)?;
    }
    if end.0 > idle.0 + RSS_SLACK_KIB {
        failed.push(format!(
            "RSS {} KiB idle at the start, {} KiB at the end",
            idle.0, end.0
        ));
    }
    // Tokio's blocking pool keeps a thread for 10 s after its last job.
    if end.1 > idle.1 || end.2 > idle.2 + THREAD_SLACK {
        failed.push(format!(
            "file descriptors {} -> {}, threads {} -> {}",
            idle.1, end.1, idle.2, end.2
        ));
    }
    println!(
        "soak {secs} s: nvme {writes} writes, {reads} verified reads; switch {moved} bytes verified; \
         api {} calls acknowledged, {} unanswered; floods held {:?}; RSS {} -> {} KiB, fds {} -> {}, threads {} -> {}",
        churn.ok,
        churn.unanswered,
        flooded,
        idle.0,
        end.0,
        idle.1,
        end.1,
        idle.2,
        end.2
    );
    if !failed.is_empty() {
        bail!("soak failed:\n  {}", failed.join("\n  "));
    }
    Ok(())
}
