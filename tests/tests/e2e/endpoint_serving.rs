//! Storage endpoints serving through the real binary: hosts in network
//! namespaces, each behind a veth pair that is one of the service's
//! switch ports (kernel driver), reach NVMe/TCP at their tenant's
//! endpoint address with the project's own host (`nvmf-perf`): ping,
//! discovery listing only their tenant's subsystems, Connect and I/O.
//! A rule of the tenant denying TCP 4420 from the host refuses it (and
//! the switch counts the drops); removing the rule restores it. A host of
//! another tenant with the same addresses reaches its own tenant's
//! endpoint, never the first one's; after a restart the endpoint serves
//! again with its MAC. IPv6 endpoints likewise, with neighbour discovery.
//! A tenant's storage QoS holds its endpoints' I/O and not another
//! tenant's. Needs root; everything made is removed on exit.

use std::process::{Command, Output};

use anyhow::{bail, ensure, Context, Result};
use dpu_e2e::net::{eventually, ip, metric, Netns};
use dpu_e2e::{binary, output_text as text, perf_iops, Service};

const BLUE_NQN: &str = "nqn.2024-01.io.dpu-service.test:ep-blue";
const RED_NQN: &str = "nqn.2024-01.io.dpu-service.test:ep-red";
/// Every endpoint's address, in both tenants.
pub(crate) const EP: &str = "10.77.0.250";
/// Every host's address, in both tenants.
pub(crate) const HOST: &str = "10.77.0.5/24";

/// A namespace holding one end of a veth pair; the other end, `port_if`,
/// stays in the root namespace as a port of the service. Removed on drop.
pub(crate) struct Host {
    port_if: String,
    pub(crate) ns: Netns,
}

impl Host {
    pub(crate) fn new(tag: &str, addr: &str) -> Result<Host> {
        let id = std::process::id();
        let port_if = format!("ep{tag}{id}");
        let peer = format!("{port_if}p");
        let ns = Netns::new(format!("ep{tag}{id}"))?;
        ip(&[
            "link", "add", &port_if, "type", "veth", "peer", "name", &peer,
        ])?;
        let mut h = Host { port_if, ns };
        // No IPv6 chatter (router and neighbour solicitations) to count
        // among a default-deny tenant's drops, unless the host is an
        // IPv6 one; never from the service's end of the pair.
        let v6 = addr.contains(':');
        let mut keys = vec![(None, format!("net.ipv6.conf.{}.disable_ipv6=1", h.port_if))];
        if !v6 {
            keys.push((
                Some(&h.ns),
                "net.ipv6.conf.default.disable_ipv6=1".to_string(),
            ));
            keys.push((Some(&h.ns), "net.ipv6.conf.all.disable_ipv6=1".to_string()));
        }
        for (ns, key) in keys {
            let out = match ns {
                Some(ns) => ns.exec(&["sysctl", "-qw", &key])?,
                None => Command::new("sysctl").args(["-qw", &key]).output()?,
            };
            if !out.status.success() {
                bail!("sysctl {key}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        ip(&["link", "set", &h.port_if, "up"])?;
        if v6 {
            // Usable at once: no duplicate address detection to wait for.
            h.ns.take(&peer, &[])?;
            let out =
                h.ns.exec(&["ip", "addr", "add", addr, "dev", &peer, "nodad"])?;
            ensure!(out.status.success(), "ip addr add {addr}: {}", text(&out));
        } else {
            h.ns.take(&peer, &[addr])?;
        }
        // The kernel would leave TCP checksums to the veth and hand out
        // 64 KiB segments.
        dpu_e2e::net::offloads_off(&h.ns, &peer, &h.port_if)?;
        Ok(h)
    }

    /// Adds `addr` (with its prefix) to the host's interface.
    pub(crate) fn add_address(&self, addr: &str) -> Result<()> {
        let dev = format!("{}p", self.port_if);
        let out = self.ns.exec(&["ip", "addr", "add", addr, "dev", &dev])?;
        ensure!(out.status.success(), "ip addr add {addr}: {}", text(&out));
        Ok(())
    }

    /// `nvmf-perf args..` in the namespace.
    pub(crate) fn perf(&self, args: &[&str]) -> Result<Output> {
        let perf = binary("nvmf-perf")?;
        let perf = perf.to_string_lossy();
        let mut all = vec!["timeout", "20", perf.as_ref()];
        all.extend_from_slice(args);
        self.ns.exec(&all)
    }

    /// The discovery log at the endpoint, one `TRADDR TRSVCID SUBNQN`
    /// line per entry.
    fn discover(&self) -> Result<Output> {
        self.discover_at(&format!("{EP}:4420"))
    }

    /// The discovery log at `addr`.
    fn discover_at(&self, addr: &str) -> Result<Output> {
        self.perf(&["--addr", addr, "--discover"])
    }

    /// Writes then reads 4 KiB blocks of `nqn` at the endpoint.
    fn io(&self, nqn: &str) -> Result<Output> {
        self.io_at(&format!("{EP}:4420"), nqn)
    }

    /// Writes then reads 4 KiB blocks of `nqn` at `addr`.
    fn io_at(&self, addr: &str, nqn: &str) -> Result<Output> {
        self.io_with(addr, nqn, &[])
    }

    /// [`Host::io_at`] with more `nvmf-perf` arguments (a key, a host NQN).
    pub(crate) fn io_with(&self, addr: &str, nqn: &str, more: &[&str]) -> Result<Output> {
        let mut args = vec!["--addr", addr, "--nqn", nqn];
        args.extend_from_slice(more);
        args.extend_from_slice(&[
            "--time",
            "0.5",
            "--job",
            "randwrite:4k:8",
            "--job",
            "randread:4k:8",
        ]);
        self.perf(&args)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.port_if])
            .output();
    }
}

/// The I/O ran: exit 0 and a positive IOPS figure on both jobs' lines.
pub(crate) fn did_io(what: &str, out: &Output) -> Result<()> {
    let t = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{what}: nvmf-perf failed: {}",
        text(out)
    );
    let iops: Vec<f64> = t
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("job"))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.parse().ok()))
        .collect();
    ensure!(
        iops.len() == 2 && iops.iter().all(|&x| x > 0.0),
        "{what}: no I/O in {t}"
    );
    // Shown with --nocapture.
    println!("{what}:\n{t}");
    Ok(())
}

fn drops(svc: &Service, reason: &str) -> Result<u64> {
    let (_, body) = svc.http_get("/metrics")?;
    Ok(metric(
        &body,
        &format!("dpu_dropped_packets_total{{reason=\"{reason}\"}}"),
    ))
}

/// The service's configuration: `workers` workers that back off when
/// idle, `storage` (lines of its `[storage]` table, if any), and each
/// host's outer veth end as the VF port named beside it.
pub(crate) fn config(workers: u32, storage: &str, ports: &[(&str, &Host)]) -> String {
    let mut c = format!("[dataplane]\nworkers = {workers}\nidle = \"backoff\"\nmbufs = 4096\n");
    if !storage.is_empty() {
        c += &format!("\n[storage]\n{storage}");
    }
    for (id, h) in ports {
        c += &format!(
            "\n[[ports]]\nid = \"{id}\"\nrole = \"vf\"\ndriver = \"kernel\"\ndevice = \"{}\"\n",
            h.port_if
        );
    }
    c
}

/// A default-allow tenant on `port`, with subsystem `sub` (`nqn`, any
/// host, a 16 MiB RAM namespace) listening at its endpoint `EP:4420`.
fn tenant_with_endpoint(
    svc: &Service,
    tenant: &str,
    port: &str,
    sub: &str,
    nqn: &str,
) -> Result<()> {
    allow_tenant(svc, tenant, port)?;
    endpoint_subsystem(svc, tenant, sub, nqn)
}

/// A default-allow tenant attached to the whole of `port`.
pub(crate) fn allow_tenant(svc: &Service, tenant: &str, port: &str) -> Result<()> {
    svc.dpuctl_json(&[
        "tenant",
        "create",
        tenant,
        "--default-policy",
        "allow",
        "--port",
        port,
    ])?;
    Ok(())
}

/// Subsystem `sub` (`nqn`, any host, a 16 MiB RAM namespace) listening
/// at `tenant`'s endpoint `EP:4420`.
fn endpoint_subsystem(svc: &Service, tenant: &str, sub: &str, nqn: &str) -> Result<()> {
    endpoint_subsystem_at(svc, tenant, sub, nqn, EP)
}

/// [`endpoint_subsystem`] at endpoint address `ep`.
fn endpoint_subsystem_at(
    svc: &Service,
    tenant: &str,
    sub: &str,
    nqn: &str,
    ep: &str,
) -> Result<()> {
    svc.dpuctl_json(&["subsystem", "create", sub, "--nqn", nqn, "--allow-any-host"])?;
    svc.dpuctl_json(&["namespace", "create", sub, "--ram", "16M"])?;
    svc.dpuctl_json(&[
        "listener",
        "create",
        sub,
        "--id",
        "ep",
        "--tenant",
        tenant,
        "--address",
        ep,
        "--port",
        "4420",
    ])?;
    Ok(())
}

#[test]
fn a_tenants_hosts_reach_its_storage_endpoint_and_no_other_tenant_does() -> Result<()> {
    let blue = Host::new("b", HOST)?;
    let red = Host::new("r", HOST)?;
    let config = config(1, "", &[("pf0vf0", &blue), ("pf0vf1", &red)]);
    let mut svc = Service::start_config(&config, &[])?;
    for (tenant, port) in [("blue", "pf0vf0"), ("red", "pf0vf1")] {
        allow_tenant(&svc, tenant, port)?;
    }
    // Blue has two subsystems on its endpoint, red one on its own, at
    // the same address.
    for (sub, nqn, tenant) in [
        ("blue-a", BLUE_NQN, "blue"),
        ("blue-b", &format!("{BLUE_NQN}-b"), "blue"),
        ("red-a", RED_NQN, "red"),
    ] {
        endpoint_subsystem(&svc, tenant, sub, nqn)?;
    }

    // The endpoint answers ARP and ping in its tenant.
    eventually("blue's host to ping its endpoint", || blue.ns.ping(EP))?;

    // Discovery lists blue's two subsystems, at the endpoint, and no more.
    let out = blue.discover()?;
    ensure!(out.status.success(), "discovery: {}", text(&out));
    let mut log: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    log.sort();
    assert_eq!(
        log,
        [
            format!("{EP} 4420 {BLUE_NQN}"),
            format!("{EP} 4420 {BLUE_NQN}-b")
        ],
        "{}",
        text(&out)
    );

    // Connect and I/O.
    did_io("blue", &blue.io(BLUE_NQN)?)?;
    // Red's subsystem is not served at blue's endpoint.
    let out = blue.io(RED_NQN)?;
    assert!(
        !out.status.success(),
        "blue reached red's subsystem: {}",
        text(&out)
    );

    // Red's host, with the same addresses, reaches red's endpoint alone.
    eventually("red's host to ping its endpoint", || red.ns.ping(EP))?;
    let out = red.discover()?;
    ensure!(out.status.success(), "red discovery: {}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{EP} 4420 {RED_NQN}")
    );
    did_io("red", &red.io(RED_NQN)?)?;
    let out = red.io(BLUE_NQN)?;
    assert!(
        !out.status.success(),
        "red reached blue's subsystem: {}",
        text(&out)
    );

    // Blue denies TCP 4420 from its host: refused, and counted.
    blue_denies_its_host(&svc, &blue, "10.77.0.5/32", &format!("{EP}:4420"))?;
    // Red's storage is not blue's rule's business.
    did_io("red while blue denies", &red.io(RED_NQN)?)?;
    // Allowed again, it works again.
    svc.dpuctl_json(&["rule", "delete", "blue", "no-storage"])?;
    did_io("blue after the rule went", &blue.io(BLUE_NQN)?)?;

    // Rebuilt from the state at start, with the same MAC.
    let mac = |svc: &Service| -> Result<String> {
        let l = svc.dpuctl_json(&["listener", "list", "blue-a"])?;
        Ok(l[0]["mac"].as_str().unwrap_or_default().to_string())
    };
    let before = mac(&svc)?;
    svc.restart()?;
    assert_eq!(mac(&svc)?, before);
    eventually("blue's endpoint after a restart", || blue.ns.ping(EP))?;
    did_io("blue after a restart", &blue.io(BLUE_NQN)?)?;

    // Its listeners gone, the endpoint stops answering.
    for sub in ["blue-a", "blue-b"] {
        svc.dpuctl_json(&["listener", "delete", sub, "ep"])?;
    }
    eventually("blue's endpoint to go", || !blue.ns.ping(EP))?;
    did_io("red after blue's endpoint went", &red.io(RED_NQN)?)?;
    Ok(())
}

/// The IOPS of one `randread:4k:QD` job of `secs` at the endpoint, as
/// `host` measured it.
fn endpoint_iops(host: &Host, nqn: &str, qd: u32, secs: &str) -> Result<f64> {
    let job = format!("randread:4k:{qd}");
    let addr = format!("{EP}:4420");
    perf_iops(&host.perf(&["--addr", &addr, "--nqn", nqn, "--time", secs, "--job", &job])?)
}

/// A tenant's storage QoS holds the I/O of its endpoints, all its hosts
/// and subsystems together, and no other tenant's; changed and cleared
/// live with `dpuctl`, shown on `/metrics`.
#[test]
fn a_tenants_storage_qos_holds_its_endpoints_alone() -> Result<()> {
    let blue = Host::new("qb", HOST)?;
    let red = Host::new("qr", HOST)?;
    let config = config(1, "", &[("pf0vf0", &blue), ("pf0vf1", &red)]);
    let svc = Service::start_config(&config, &[])?;
    tenant_with_endpoint(&svc, "blue", "pf0vf0", "blue-a", BLUE_NQN)?;
    tenant_with_endpoint(&svc, "red", "pf0vf1", "red-a", RED_NQN)?;
    eventually("blue's host to ping its endpoint", || blue.ns.ping(EP))?;
    eventually("red's host to ping its endpoint", || red.ns.ping(EP))?;

    svc.dpuctl_ok(&["tenant", "set-storage-qos", "blue", "--iops", "800"])?;
    let shown = svc.dpuctl_ok(&["tenant", "get", "blue"])?;
    ensure!(shown.contains("iops=800"), "{shown}");
    let held = endpoint_iops(&blue, BLUE_NQN, 16, "3")?;
    let free = endpoint_iops(&red, RED_NQN, 16, "1")?;
    println!("blue limited to 800: {held:.0} IOPS; red, no limit: {free:.0} IOPS");
    ensure!((720.0..=880.0).contains(&held), "blue: {held:.0} IOPS");
    ensure!(free > 1200.0, "red held by blue's limit: {free:.0} IOPS");

    let m = svc.http_get("/metrics")?.1;
    ensure!(
        metric(&m, "dpu_nvmf_qos_limit{tenant=\"blue\",limit=\"iops\"}") == 800,
        "{m}"
    );
    ensure!(
        metric(&m, "dpu_nvmf_qos_throttled_commands_total{tenant=\"blue\"}") > 0,
        "{m}"
    );
    ensure!(
        !m.contains("dpu_nvmf_qos_limit{tenant=\"red\""),
        "red has no limits: {m}"
    );

    // Cleared, blue runs free.
    svc.dpuctl_ok(&["tenant", "set-storage-qos", "blue"])?;
    let cleared = endpoint_iops(&blue, BLUE_NQN, 16, "1")?;
    ensure!(cleared > 1200.0, "blue after clearing: {cleared:.0} IOPS");
    Ok(())
}

/// Adds blue's rule `no-storage` denying TCP 4420 from `src`: `host`'s
/// I/O at `at` is refused, and the switch counts `acl_deny` drops.
fn blue_denies_its_host(svc: &Service, host: &Host, src: &str, at: &str) -> Result<()> {
    let denied = drops(svc, "acl_deny")?;
    svc.dpuctl_json(&[
        "rule",
        "add",
        "blue",
        "--id",
        "no-storage",
        "--priority",
        "5",
        "--action",
        "deny",
        "--proto",
        "tcp",
        "--src",
        src,
        "--dport",
        "4420",
    ])?;
    let out = host.perf(&[
        "--addr",
        at,
        "--nqn",
        BLUE_NQN,
        "--time",
        "0.2",
        "--job",
        "randread:4k:1",
    ]);
    ensure!(
        out.map_or(true, |o| !o.status.success()),
        "the deny rule let the host connect"
    );
    ensure!(drops(svc, "acl_deny")? > denied, "no acl_deny drop counted");
    Ok(())
}

/// An IPv6 endpoint, the same address in two tenants: neighbour
/// discovery, ping, discovery and I/O over IPv6 from each tenant's host
/// reach its own tenant's endpoint alone; a deny rule of the tenant on
/// TCP 4420 from its host's IPv6 address refuses it, counted, until the
/// rule goes.
#[test]
fn ipv6_hosts_reach_their_tenants_ipv6_endpoint_alone() -> Result<()> {
    const EP6: &str = "fd00:77::250";
    let at = format!("[{EP6}]:4420");
    let blue = Host::new("6b", "fd00:77::5/64")?;
    let red = Host::new("6r", "fd00:77::5/64")?;
    let config = config(1, "", &[("pf0vf0", &blue), ("pf0vf1", &red)]);
    let svc = Service::start_config(&config, &[])?;
    for (tenant, port, sub, nqn) in [
        ("blue", "pf0vf0", "blue-6", BLUE_NQN),
        ("red", "pf0vf1", "red-6", RED_NQN),
    ] {
        allow_tenant(&svc, tenant, port)?;
        endpoint_subsystem_at(&svc, tenant, sub, nqn, EP6)?;
    }
    let listed = svc.dpuctl_json(&["listener", "list", "blue-6"])?;
    ensure!(
        listed[0]["address"] == EP6 && listed[0]["mac"].as_str().is_some_and(|m| m.len() == 17),
        "{listed}"
    );

    for (who, host, mine, theirs) in [
        ("blue", &blue, BLUE_NQN, RED_NQN),
        ("red", &red, RED_NQN, BLUE_NQN),
    ] {
        eventually(&format!("{who}'s host to ping its IPv6 endpoint"), || {
            host.ns.ping(EP6)
        })?;
        let out = host.discover_at(&at)?;
        ensure!(out.status.success(), "{who} discovery: {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{EP6} 4420 {mine}"),
            "{who}"
        );
        did_io(&format!("{who} over IPv6"), &host.io_at(&at, mine)?)?;
        let out = host.io_at(&at, theirs)?;
        assert!(
            !out.status.success(),
            "{who} reached the other tenant's subsystem: {}",
            text(&out)
        );
    }

    // Blue denies TCP 4420 from its host's IPv6 address: refused, counted.
    blue_denies_its_host(&svc, &blue, "fd00:77::5/128", &at)?;
    did_io("red while blue denies", &red.io_at(&at, RED_NQN)?)?;
    svc.dpuctl_json(&["rule", "delete", "blue", "no-storage"])?;
    did_io("blue after the rule went", &blue.io_at(&at, BLUE_NQN)?)?;
    Ok(())
}

/// With two workers and a tenant that denies by default and allows
/// storage statefully, several connections (spread over both workers by
/// the kernel's symmetric fanout) all work: each connection's replies
/// leave through the worker that tracks it, and nothing is dropped as
/// denied or invalid on the way back.
#[test]
fn replies_meet_their_connection_on_its_worker() -> Result<()> {
    stateful_storage_over_two_workers("w", "")?;
    Ok(())
}

/// The same with the endpoints' stacks run by the first worker
/// (`storage.endpoint_placement = "worker"`): frames the second worker
/// brings reach them through its lanes, replies go back through it, and
/// the service has no endpoint thread.
#[test]
fn endpoints_placed_in_a_worker_serve_both_workers_connections() -> Result<()> {
    let svc = stateful_storage_over_two_workers("wi", "endpoint_placement = \"worker\"\n")?;
    let names = svc.thread_names()?;
    ensure!(
        names.iter().any(|n| n == "dp-worker-0")
            && !names.iter().any(|n| n.starts_with("storage-endp")),
        "threads: {names:?}"
    );
    Ok(())
}

/// A default-deny tenant allowing storage statefully, its endpoint served
/// over two workers with `storage` lines of configuration: 8 connections
/// do I/O, and no reply is denied or invalid on the way back. Returns the
/// running service.
fn stateful_storage_over_two_workers(tag: &str, storage: &str) -> Result<Service> {
    let blue = Host::new(tag, HOST)?;
    let config = config(2, storage, &[("pf0vf0", &blue)]);
    let svc = Service::start_config(&config, &[])?;
    svc.endpoint_behind_rules("blue", "pf0vf0", EP, "vol", BLUE_NQN, "16M")?;
    let (denied, invalid) = (drops(&svc, "acl_deny")?, drops(&svc, "conntrack_invalid")?);
    let run = || {
        blue.perf(&[
            "--addr",
            &format!("{EP}:4420"),
            "--nqn",
            BLUE_NQN,
            "--conns",
            "8",
            "--time",
            "0.5",
            "--job",
            "randwrite:4k:4",
            "--job",
            "randread:4k:4",
        ])
    };
    // The first try may meet ARP still resolving.
    let mut out = run()?;
    if !out.status.success() {
        out = run()?;
    }
    did_io("8 connections over 2 workers", &out)?;
    assert_eq!(
        drops(&svc, "acl_deny")?,
        denied,
        "replies denied on the way back"
    );
    assert_eq!(drops(&svc, "conntrack_invalid")?, invalid);
    Ok(svc)
}

/// Forged SYNs at `EP:4420` from random addresses of the host's /24
/// (not the host's own): `rate` a second for `secs` seconds, by a raw
/// socket in the namespace. Prints how many were sent.
const SYN_FLOOD: &str = r#"
import random, socket, struct, sys, time
ep, rate, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
dst = socket.inet_aton(ep)
sent, start = 0, time.monotonic()
while time.monotonic() - start < secs:
    for _ in range(rate // 100):
        src = socket.inet_aton("10.77.0.%d" % random.randint(20, 240))
        sport = random.randint(1024, 65535)
        tcp = struct.pack("!HHIIBBHHH", sport, 4420, random.getrandbits(32), 0, 5 << 4, 0x02, 64240, 0, 0)
        c = csum(src + dst + struct.pack("!BBH", 0, 6, len(tcp)) + tcp)
        tcp = tcp[:16] + struct.pack("!H", c) + tcp[18:]
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0, src, dst)
        s.sendto(ip + tcp, (ep, 0))
        sent += 1
    time.sleep(0.01)
print(sent)
"#;

/// A host's `count` plain TCP connections to `EP:4420` held open for
/// `hold` seconds; prints how many were accepted and how many refused.
const MANY_CONNECTIONS: &str = r#"
import socket, sys, time
ep, count, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
held, refused = [], 0
for _ in range(count):
    c = socket.socket()
    c.settimeout(5)
    try:
        c.connect((ep, 4420))
        held.append(c)
    except OSError:
        refused += 1
        c.close()
time.sleep(hold)
# Still open: a refused connection is reset at once, not later.
alive = 0
for c in held:
    c.setblocking(False)
    try:
        alive += c.recv(1) != b""
    except BlockingIOError:
        alive += 1
    except OSError:
        pass
print(len(held), refused, alive)
"#;

/// A flood of SYNs from forged addresses at an endpoint neither stops a
/// connected host's storage nor holds more than a few sockets, and the
/// endpoint takes new connections again once it ends (during it, with
/// no anti-spoofing on the port, a new handshake competes with the
/// forged ones for the 32 places); a host opening
/// hundreds of connections gets its per-address share, the rest are
/// refused and counted, and the service serves on.
#[test]
fn an_endpoint_weathers_a_syn_flood_and_hundreds_of_connections() -> Result<()> {
    let blue = Host::new("f", HOST)?;
    let config = config(
        1,
        "max_connections_per_address = 100\n",
        &[("pf0vf0", &blue)],
    );
    let svc = Service::start_config(&config, &[])?;
    tenant_with_endpoint(&svc, "blue", "pf0vf0", "vol", BLUE_NQN)?;
    eventually("the host to ping its endpoint", || blue.ns.ping(EP))?;
    let closed = |svc: &Service| -> Result<u64> {
        let (_, body) = svc.http_get("/metrics")?;
        Ok(metric(
            &body,
            "dpu_nvmf_connections_closed_total{reason=\"handshake_timeout\"}",
        ))
    };
    let before = closed(&svc)?;

    // The host connects, then 3,000 forged SYNs a second for 3 s arrive
    // while its I/O runs.
    let perf = binary("nvmf-perf")?;
    let io = Command::new("ip")
        .args(["netns", "exec", &blue.ns.name, "timeout", "20"])
        .arg(&perf)
        .args(["--addr", &format!("{EP}:4420"), "--nqn", BLUE_NQN])
        .args(["--time", "4", "--job", "randread:4k:8"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    std::thread::sleep(std::time::Duration::from_millis(700));
    let flood = syn_flood(&blue)?;
    let during = io.wait_with_output()?;
    let sent = flooded(flood)?;
    let t = String::from_utf8_lossy(&during.stdout);
    ensure!(
        during.status.success()
            && t.lines().filter(|l| l.starts_with("randread")).any(|l| l
                .split_whitespace()
                .nth(3)
                .and_then(|w| w.parse::<f64>().ok())
                > Some(0.0)),
        "the host's I/O during the flood: {}",
        text(&during)
    );
    println!("I/O during a SYN flood:\n{t}");
    // The handshakes left waiting go within 3 s.
    eventually("the forged handshakes to be dropped", || {
        closed(&svc).is_ok_and(|n| n >= before + 100)
    })?;
    let dropped = closed(&svc)? - before;
    println!("{sent} forged SYNs sent, {dropped} handshakes dropped");
    let (_, body) = svc.http_get("/metrics")?;
    assert!(
        metric(&body, "dpu_nvmf_open_connections") <= 40,
        "sockets held after the flood: {}",
        metric(&body, "dpu_nvmf_open_connections")
    );

    // 300 connections from one address: 100 held, the rest refused.
    let out = blue
        .ns
        .exec(&["python3", "-c", MANY_CONNECTIONS, EP, "300", "1"])?;
    ensure!(out.status.success(), "connections: {}", text(&out));
    let n: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(n, [100, 200, 100], "held, refused, still open");
    let (_, body) = svc.http_get("/metrics")?;
    assert!(
        metric(
            &body,
            "dpu_nvmf_connections_refused_total{reason=\"max_connections_per_address\"}"
        ) >= 200
    );
    // They closed: the host's storage works again.
    did_io("I/O after 300 connections", &blue.io(BLUE_NQN)?)?;

    // With the port's sources limited to the host's address, the switch
    // drops the forged SYNs (counted) and new connections work during a
    // flood.
    svc.dpuctl_json(&[
        "tenant",
        "update",
        "blue",
        "--clear-attachments",
        "--port",
        "pf0vf0,ip=10.77.0.5/32",
    ])?;
    let spoofed = drops(&svc, "spoofed")?;
    let flood = syn_flood(&blue)?;
    std::thread::sleep(std::time::Duration::from_millis(500));
    let during = blue.io(BLUE_NQN);
    let sent = flooded(flood)?;
    did_io(
        "new connections during a flood, with anti-spoofing",
        &during?,
    )?;
    let dropped = drops(&svc, "spoofed")? - spoofed;
    assert!(
        dropped >= sent * 9 / 10,
        "{dropped} of {sent} forged SYNs dropped as spoofed"
    );
    Ok(())
}

/// Starts [`SYN_FLOOD`] from `host`'s namespace: 3,000 SYNs a second for
/// 3 s.
fn syn_flood(host: &Host) -> Result<std::process::Child> {
    Ok(Command::new("ip")
        .args(["netns", "exec", &host.ns.name, "python3", "-c", SYN_FLOOD])
        .args([EP, "3000", "3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?)
}

/// Waits for a flood to end; the SYNs it sent.
fn flooded(flood: std::process::Child) -> Result<u64> {
    let out = flood.wait_with_output()?;
    ensure!(out.status.success(), "flood: {}", text(&out));
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// Endpoints share one pool of socket buffer memory, each with a reserve:
/// with a pool smaller than the reserves, one tenant's host opening many
/// connections gets its endpoint's reserve (four sockets) and no more,
/// the rest are refused and counted, and another tenant's host does its
/// storage meanwhile.
#[test]
fn one_tenants_connections_do_not_starve_anothers_endpoint() -> Result<()> {
    let blue = Host::new("pb", HOST)?;
    let red = Host::new("pr", HOST)?;
    let config = config(
        1,
        "endpoint_buffer_memory = \"1MiB\"\n",
        &[("pf0vf0", &blue), ("pf0vf1", &red)],
    );
    let svc = Service::start_config(&config, &[])?;
    tenant_with_endpoint(&svc, "blue", "pf0vf0", "blue-a", BLUE_NQN)?;
    tenant_with_endpoint(&svc, "red", "pf0vf1", "red-a", RED_NQN)?;
    eventually("blue's host to ping its endpoint", || blue.ns.ping(EP))?;
    eventually("red's host to ping its endpoint", || red.ns.ping(EP))?;

    let many = Command::new("ip")
        .args([
            "netns",
            "exec",
            &blue.ns.name,
            "python3",
            "-c",
            MANY_CONNECTIONS,
        ])
        .args([EP, "10", "3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let during = red.io(RED_NQN);
    let many = many.wait_with_output()?;
    ensure!(many.status.success(), "connections: {}", text(&many));
    let n: Vec<u64> = String::from_utf8_lossy(&many.stdout)
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(n, [4, 6, 4], "held, refused, still open");
    did_io("red while blue holds its endpoint's share", &during?)?;
    let (_, body) = svc.http_get("/metrics")?;
    // Two reserves of two listening sockets and two connections, 768
    // KiB each; nothing beyond them fits a 1 MiB pool.
    assert_eq!(
        metric(&body, "dpu_endpoint_buffer_reserved_bytes"),
        2 * 4 * (768 << 10)
    );
    assert_eq!(metric(&body, "dpu_endpoint_buffer_shared_bytes"), 0);
    assert!(
        metric(
            &body,
            "dpu_nvmf_connections_refused_total{reason=\"max_connections\"}"
        ) >= 6
    );
    // Blue's connections gone, its share is its own again.
    did_io("blue after its connections closed", &blue.io(BLUE_NQN)?)?;
    Ok(())
}

/// A host that knows an allowed host NQN but not its secret starts
/// ffdhe8192 authentications over and over at its tenant's endpoint. The
/// Diffie-Hellman work runs on the endpoints' DH thread, not on the
/// thread that runs every tenant's endpoint stack, so another tenant's
/// storage I/O through its own endpoint keeps its latency bounded
/// meanwhile (in a debug build one ffdhe8192 authentication is about a
/// second of CPU: done inline, each would hold every endpoint for that
/// long). Afterwards the right secret authenticates through the endpoint.
#[test]
fn an_authentication_flood_at_one_endpoint_stalls_no_other() -> Result<()> {
    const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:e2e-ep-auth-host";
    const SECRET: &str = "DHHC-1:00:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQHMnzFi:";
    const WRONG: &str =
        "DHHC-1:00:BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUF5lUjlA==:";
    let blue = Host::new("ab", HOST)?;
    let red = Host::new("ar", HOST)?;
    let config = config(1, "auth_threads = 1\nauth_queue = 4\nauth_attempts_per_sec = 100\nauth_attempts_burst = 100\n", &[("pf0vf0", &blue), ("pf0vf1", &red)]);
    let svc = Service::start_config(&config, &[])?;
    tenant_with_endpoint(&svc, "blue", "pf0vf0", "blue-a", BLUE_NQN)?;
    tenant_with_endpoint(&svc, "red", "pf0vf1", "red-a", RED_NQN)?;
    svc.dpuctl_json(&["subsystem", "update", "blue-a", "--host", HOSTNQN])?;
    svc.dpuctl_json(&["subsystem", "update", "blue-a", "--allow-any-host", "false"])?;
    let out = svc.dpuctl(&[
        "subsystem",
        "set-auth",
        "blue-a",
        HOSTNQN,
        "--dhchap-secret",
        SECRET,
        "--dh-group",
        "ffdhe8192",
    ])?;
    ensure!(out.status.success(), "set-auth: {}", text(&out));
    eventually("blue's host to ping its endpoint", || blue.ns.ping(EP))?;
    eventually("red's host to ping its endpoint", || red.ns.ping(EP))?;

    let perf = binary("nvmf-perf")?;
    let flood = Command::new("ip")
        .args(["netns", "exec", &blue.ns.name, "timeout", "60"])
        .arg(&perf)
        .args(["--addr", &format!("{EP}:4420"), "--nqn", BLUE_NQN])
        .args(["--hostnqn", HOSTNQN, "--dhchap-secret", WRONG])
        .args(["--dh-group", "ffdhe8192", "--auth-flood", "6"])
        .args(["--conns", "4", "--flood-attempts", "2000"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let started = std::time::Instant::now();
    let mut worst = 0f64;
    let mut runs = 0;
    while started.elapsed() < std::time::Duration::from_secs(5) {
        let out = red.perf(&[
            "--addr",
            &format!("{EP}:4420"),
            "--nqn",
            RED_NQN,
            "--time",
            "0.5",
            "--job",
            "randread:4k:1",
        ])?;
        ensure!(out.status.success(), "red's I/O: {}", text(&out));
        let t = String::from_utf8_lossy(&out.stdout);
        let max_us = t
            .lines()
            .find(|l| l.starts_with("randread"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|w| w.parse::<f64>().ok())
            .with_context(|| format!("no I/O line in {t}"))?;
        worst = worst.max(max_us);
        runs += 1;
    }
    let flood = flood.wait_with_output()?;
    let summary = String::from_utf8_lossy(&flood.stdout);
    ensure!(flood.status.success(), "flood: {}", text(&flood));
    println!("{summary}red: {runs} runs during the flood, slowest I/O {worst} us");
    ensure!(runs >= 3, "red ran {runs} times in 5 s");
    ensure!(
        worst < 500_000.0,
        "red's slowest I/O took {worst} us during blue's authentication flood"
    );
    let (_, body) = svc.http_get("/metrics")?;
    let dh_work = metric(
        &body,
        "dpu_nvmf_auth_total{subsystem=\"blue-a\",result=\"failed\"}",
    );
    ensure!(dh_work >= 2, "the flood got DH work {dh_work} times");
    // The right secret authenticates through the endpoint.
    let out = blue.perf(&[
        "--addr",
        &format!("{EP}:4420"),
        "--nqn",
        BLUE_NQN,
        "--hostnqn",
        HOSTNQN,
        "--dhchap-secret",
        SECRET,
        "--dh-group",
        "ffdhe8192",
        "--time",
        "0.3",
        "--job",
        "randread:4k:1",
    ])?;
    ensure!(out.status.success(), "blue with its secret: {}", text(&out));
    Ok(())
}
