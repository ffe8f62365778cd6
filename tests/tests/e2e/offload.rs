//! Flow offload through the real binary, with the model provider in front
//! of the switch (`[dataplane.offload] provider = "model"`): network
//! namespaces play a tenant's stations on the kernel driver, TCP between
//! them is offloaded after its handshake, and `dpuctl offload status`,
//! `dpuctl counters` and `/metrics` show what the model carried.
//! Needs root (namespaces); everything created is removed on exit.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use dpu_e2e::net::{eventually, metric, Host, Reaped};
use dpu_e2e::Service;
use serde_json::Value;

/// ADDR PORT: answers each line received with as many bytes as the line
/// says (a number), on every connection, with `select`.
const SERVER: &str = r#"
import select, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(512)
conns = {}
while True:
    r, _, _ = select.select([s] + list(conns), [], [])
    for c in r:
        if c is s:
            n, _ = s.accept()
            conns[n] = b""
            continue
        try:
            b = c.recv(4096)
        except OSError:
            b = b""
        if not b:
            conns.pop(c)
            c.close()
            continue
        conns[c] += b
        while b"\n" in conns[c]:
            line, conns[c] = conns[c].split(b"\n", 1)
            c.setblocking(True)
            c.sendall(b"x" * max(1, int(line or b"1")))
            c.setblocking(False)
        c.setblocking(False)
"#;

/// ADDR PORT ROUNDS BYTES GAP PAUSE: one connection; ROUNDS times asks
/// for BYTES and reads them back, GAP seconds apart, sleeping PAUSE
/// seconds half way; prints "ok ROUNDS", or fails saying where it stopped
/// (1 s for each answer).
const CHAT: &str = r#"
import socket, sys, time
addr, port, rounds, size, gap, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
s = socket.create_connection((addr, port), timeout=3)
s.settimeout(1)
for i in range(rounds):
    if i == rounds // 2:
        time.sleep(pause)
    s.sendall(b"%d\n" % size)
    got = 0
    try:
        while got < size:
            b = s.recv(65536)
            if not b:
                break
            got += len(b)
    except OSError:
        pass
    if got < size:
        print("stopped at round %d" % i, flush=True)
        sys.exit(1)
    time.sleep(gap)
print("ok %d" % rounds, flush=True)
s.close()
"#;

/// ADDR PORT N HOLD: opens N connections as fast as it can, has each
/// answered once, holds them HOLD seconds; prints how many answered.
const FLOOD: &str = r#"
import socket, sys, time
addr, port, n, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
socks = []
for i in range(n):
    try:
        s = socket.create_connection((addr, port), timeout=2)
        s.sendall(b"1\n")
        socks.append(s)
    except OSError:
        pass
ok = 0
for s in socks:
    try:
        s.settimeout(2)
        if s.recv(1):
            ok += 1
    except OSError:
        pass
print(ok, flush=True)
time.sleep(hold)
"#;

/// A kernel-driver configuration with one port per host and the model
/// provider, with `offload` appended to `[dataplane.offload]`.
fn config(hosts: &[(&str, &Host)], offload: &str) -> String {
    let mut c = format!(
        "[log]\nlevel = \"info\"\n\n[dataplane]\nworkers = 1\nidle = \"backoff\"\nmbufs = 4096\n\n\
         [dataplane.offload]\nprovider = \"model\"\n{offload}\n"
    );
    for (id, h) in hosts {
        c += &format!(
            "\n[[ports]]\nid = \"{id}\"\nrole = \"vf\"\ndriver = \"kernel\"\ndevice = \"{}\"\n",
            h.port_if
        );
    }
    c
}

/// `dpuctl offload status` as JSON.
fn status(svc: &Service) -> Result<Value> {
    svc.dpuctl_json(&["offload", "status"])
}

fn num(v: &Value, key: &str) -> u64 {
    v[key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v[key].as_u64())
        .unwrap_or(0)
}

/// Tenant `name`'s entry of the status: flows, packets, bytes.
fn tenant_of(s: &Value, name: &str) -> (u64, u64, u64) {
    let want = format!("tenants/{name}");
    s["tenants"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["tenant"] == want.as_str()))
        .map_or((0, 0, 0), |t| {
            (num(t, "flows"), num(t, "packets"), num(t, "bytes"))
        })
}

/// Waits (bounded) until `f` holds of the offload status; returns it.
fn status_until(svc: &Service, what: &str, f: impl Fn(&Value) -> bool) -> Result<Value> {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let s = status(svc)?;
        if f(&s) {
            return Ok(s);
        }
        if Instant::now() > end {
            bail!("waiting for {what}: {s}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_established_stream_goes_by_in_the_model_until_a_rule_change_stops_it() -> Result<()> {
    let client = Host::new("oa", "10.234.0.1/24")?;
    let server = Host::new("ob", "10.234.0.2/24")?;
    let svc = Service::start_config(
        &config(
            &[("pf0vf0", &client), ("pf0vf1", &server)],
            "idle_secs = 60",
        ),
        &[],
    )?;
    svc.stateful_web_tenant("green", &["pf0vf0", "pf0vf1"], "10.234.0.1/32")?;
    let _server = Reaped(server.spawn_python(SERVER, &["10.234.0.2", "8080"])?);

    // A megabyte back over one connection, in 20 answers 10 ms apart (a
    // busy machine takes a few milliseconds to put a flow in hardware):
    // after the handshake both directions go by in the model; the
    // server's close (a FIN, which hardware leaves to software) withdraws
    // them.
    let mut out = String::new();
    eventually("a megabyte from the server", || {
        let o = client.python(CHAT, &["10.234.0.2", "8080", "20", "50000", "0.01", "0"]);
        out = String::from_utf8_lossy(&o.stdout).to_string();
        o.status.success()
    })?;
    ensure!(out.contains("ok 20"), "{out}");
    let s = status_until(&svc, "the stream's packets to be counted", |s| {
        tenant_of(s, "green").1 > 500 && num(s, "withdrawn") >= 2
    })?;
    let (_, carried, bytes) = tenant_of(&s, "green");
    ensure!(num(&s, "offloaded") >= 2, "{s}");
    ensure!(bytes > 800_000, "the model carried {bytes} bytes: {s}");
    // What the switch itself saw of the tenant: the handshakes, the
    // first segment of each direction, the closes.
    let counters = svc.dpuctl_json(&["counters", "--tenant", "green"])?;
    let t = &counters["tenants"][0];
    let (rx, offloaded) = (num(t, "rxPackets"), num(t, "offloadedPackets"));
    ensure!(offloaded >= carried, "{counters}");
    ensure!(
        rx >= offloaded && rx - offloaded < 200,
        "the switch saw {} of the stream's {rx} packets: {counters}",
        rx - offloaded
    );
    let (_, body) = svc.http_get("/metrics")?;
    ensure!(
        metric(&body, "dpu_offload_tenant_packets_total{tenant=\"green\"}") >= carried,
        "{body}"
    );
    ensure!(metric(&body, "dpu_offload_flows_total{event=\"withdrawn\"}") >= 2);

    // A tenant that opts out keeps every packet on the cores.
    let t = svc.dpuctl_json(&["tenant", "update", "green", "--offload", "off"])?;
    ensure!(t["noOffload"] == true, "{t}");
    let before = num(&status(&svc)?, "offloaded");
    let o = client.python(CHAT, &["10.234.0.2", "8080", "20", "100", "0.01", "0"]);
    ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    std::thread::sleep(Duration::from_millis(600));
    let s = status(&svc)?;
    ensure!(
        num(&s, "offloaded") == before,
        "offloaded while opted out: {s}"
    );
    svc.dpuctl_json(&["tenant", "update", "green", "--offload", "on"])?;

    // A conversation that stays open: offloaded, then the rule goes. The
    // call returns once its flows are out of hardware, and the next
    // exchange is dropped.
    let before = num(&status(&svc)?, "offloaded");
    // Each script ends by itself (its socket timeouts, its rounds).
    let chat = client.spawn_python_out(CHAT, &["10.234.0.2", "8080", "400", "100", "0.05", "0"])?;
    if let Err(e) = status_until(&svc, "the conversation to be offloaded", |s| {
        num(s, "offloaded") >= before + 2 && tenant_of(s, "green").0 == 2
    }) {
        let out = chat.wait_with_output()?;
        bail!(
            "{e:#}\nchat: {} {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            svc.log_text()
        );
    }
    svc.dpuctl_json(&["rule", "delete", "green", "web"])?;
    let s = status(&svc)?;
    ensure!(
        num(&s, "inUse") == 0 && num(&s, "invalidated") >= 2,
        "flows left in hardware after the change was acknowledged: {s}"
    );
    let done = chat.wait_with_output().context("the conversation")?;
    let said = String::from_utf8_lossy(&done.stdout);
    ensure!(
        !done.status.success() && said.contains("stopped at round"),
        "the conversation went on past the rule's removal: {said}"
    );
    Ok(())
}

/// Two stateful web tenants on one service: green (hosts `g1` and `g2`
/// on `10.NET.0.0/24`) and red (`r1`, `r2` on `10.NET.1.0/24`), each with
/// a server on its second host answering; the host namespaces are
/// tagged `tags`, the offload table set as `offload` says.
struct TwoTenants {
    svc: Service,
    g1: Host,
    g2: Host,
    r1: Host,
    r2: Host,
    /// The two servers, stopped when dropped.
    servers: [Reaped; 2],
}

impl TwoTenants {
    fn start(tags: [&str; 4], net: u8, offload: &str) -> Result<Self> {
        let addr = |side: u8, host: u8| format!("10.{net}.{side}.{host}");
        let g1 = Host::new(tags[0], &format!("{}/24", addr(0, 1)))?;
        let g2 = Host::new(tags[1], &format!("{}/24", addr(0, 2)))?;
        let r1 = Host::new(tags[2], &format!("{}/24", addr(1, 1)))?;
        let r2 = Host::new(tags[3], &format!("{}/24", addr(1, 2)))?;
        let svc = Service::start_config(
            &config(
                &[
                    ("pf0vf0", &g1),
                    ("pf0vf1", &g2),
                    ("pf0vf2", &r1),
                    ("pf0vf3", &r2),
                ],
                offload,
            ),
            &[],
        )?;
        svc.stateful_web_tenant(
            "green",
            &["pf0vf0", "pf0vf1"],
            &format!("{}/32", addr(0, 1)),
        )?;
        svc.stateful_web_tenant("red", &["pf0vf2", "pf0vf3"], &format!("{}/32", addr(1, 1)))?;
        let servers = [
            Reaped(g2.spawn_python(SERVER, &[&addr(0, 2), "8080"])?),
            Reaped(r2.spawn_python(SERVER, &[&addr(1, 2), "8080"])?),
        ];
        for (h, to) in [(&g1, addr(0, 2)), (&r1, addr(1, 2))] {
            eventually("the server to answer", || {
                h.python(CHAT, &[&to, "8080", "1", "10", "0", "0"])
                    .status
                    .success()
            })?;
        }
        Ok(Self {
            svc,
            g1,
            g2,
            r1,
            r2,
            servers,
        })
    }
}

#[test]
fn a_tenants_flood_keeps_to_its_share_and_idle_flows_age() -> Result<()> {
    // 64 flows: 16 kept for each of the two tenants, the 32 others
    // shared, at most 40 for one tenant; flows age after 2 s idle.
    let TwoTenants {
        svc,
        g1,
        g2,
        r1,
        r2: _r2,
        servers: _servers,
    } = TwoTenants::start(
        ["oc", "od", "oe", "of"],
        235,
        "table_size = 64\nper_tenant = 40\nreserved_per_tenant = 16\nidle_secs = 2",
    )?;

    // Green talks for about 30 s with a 5 s silence half way.
    let chat = g1.spawn_python_out(CHAT, &["10.235.0.2", "8080", "300", "100", "0.05", "5"])?;
    status_until(&svc, "green's conversation in hardware", |s| {
        tenant_of(s, "green").0 == 2
    })?;
    // Red opens 300 connections at once and holds them.
    let flood = r1.spawn_python_out(FLOOD, &["10.235.1.2", "8080", "300", "8"])?;
    let s = status_until(&svc, "red's flood to reach its share", |s| {
        num(s, "overQuota") > 0
    })?;
    let (red, _, _) = tenant_of(&s, "red");
    ensure!(red <= 40, "red holds {red} flows, past its 40: {s}");
    let (green, green_pkts, _) = tenant_of(&s, "green");
    ensure!(green == 2, "green lost flows to red's flood: {s}");
    ensure!(num(&s, "inUse") <= 64);
    // Green's flows still carry its packets.
    status_until(&svc, "green's packets to go on in hardware", |s| {
        tenant_of(s, "green").1 > green_pkts + 20
    })?;
    let answered: u64 = String::from_utf8_lossy(&flood.wait_with_output()?.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    ensure!(
        answered >= 290,
        "red's own connections were served: {answered} of 300"
    );

    // Green's silence outlasts the flows' age: they leave hardware, and
    // the conversation goes on (offered again) when it speaks.
    let s = status_until(&svc, "green's flows to age", |s| {
        tenant_of(s, "green").0 == 0 && num(s, "aged") >= 2
    })?;
    let offloaded = num(&s, "offloaded");
    let done = chat.wait_with_output()?;
    let said = String::from_utf8_lossy(&done.stdout);
    ensure!(done.status.success() && said.contains("ok 300"), "{said}");
    let s = status(&svc)?;
    ensure!(num(&s, "offloaded") > offloaded, "not offloaded again: {s}");

    // A port whose link goes down takes the flows through it out.
    let invalidated = num(&s, "invalidated");
    let _chat = Reaped(g1.spawn_python(CHAT, &["10.235.0.2", "8080", "100", "100", "0.05", "0"])?);
    status_until(&svc, "a conversation in hardware", |s| {
        tenant_of(s, "green").0 == 2
    })?;
    dpu_e2e::net::ip(&["link", "set", &g2.port_if, "down"])?;
    let s = status_until(&svc, "the down port's flows to leave", |s| {
        tenant_of(s, "green").0 == 0
    })?;
    ensure!(num(&s, "invalidated") >= invalidated + 2, "{s}");
    Ok(())
}

/// `provider = "rte_flow"` on DPDK ports that share no embedded switch
/// (`net_af_packet`, which has no flow rules at all): the service starts,
/// offers an established connection, is refused, says why in `dpuctl
/// offload status`, and keeps switching the conversation on the cores
/// without offering that connection again.
#[test]
fn rte_flow_without_an_embedded_switch_refuses_and_says_why() -> Result<()> {
    let _one = crate::switch::one_at_a_time();
    let client = Host::new("rfa", "10.236.0.1/24")?;
    let server = Host::new("rfb", "10.236.0.2/24")?;
    let mut c = dpu_e2e::net::config("rteflow", &[("pf0vf0", &client), ("pf0vf1", &server)]);
    c += "\n[dataplane.offload]\nprovider = \"rte_flow\"\n";
    let svc = Service::start_config(&c, &[])?;
    svc.stateful_web_tenant("teal", &["pf0vf0", "pf0vf1"], "10.236.0.1/32")?;
    let _server = Reaped(server.spawn_python(SERVER, &["10.236.0.2", "8080"])?);
    let mut out = String::new();
    eventually("a conversation through the switch", || {
        let o = client.python(CHAT, &["10.236.0.2", "8080", "30", "2000", "0.01", "0"]);
        out = String::from_utf8_lossy(&o.stdout).to_string();
        o.status.success()
    })?;
    ensure!(out.contains("ok 30"), "{out}");
    let s = status_until(&svc, "the offer to be refused", |s| {
        num(s, "unsupported") >= 1
    })?;
    ensure!(s["provider"] == "rte_flow", "{s}");
    ensure!(num(&s, "inUse") == 0 && num(&s, "offloaded") == 0, "{s}");
    let why = s["lastUnsupported"].as_str().unwrap_or_default();
    ensure!(why.contains("no embedded switch"), "{s}");
    // Each direction of each connection was offered once at most.
    ensure!(num(&s, "unsupported") <= 4, "offered again and again: {s}");
    let text = svc.dpuctl_ok(&["offload", "status"])?;
    ensure!(text.contains("last unsupported: "), "{text}");
    Ok(())
}

/// ADDR PORT N: sends N datagrams to ADDR:PORT from one socket, ten at
/// a time, 10 ms apart.
const DATAGRAMS: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[3])):
    s.sendto(b"x" * 32, (sys.argv[1], int(sys.argv[2])))
    if i % 10 == 9:
        time.sleep(0.01)
"#;

/// A flow the tenant's rules deny is dropped in the model after
/// `stateless_after` packets: the switch sees only those, the tenant's
/// counters still count every datagram as received and dropped, and the
/// status and `/metrics` say the model dropped the rest.
#[test]
fn a_denied_flood_is_dropped_in_the_model_after_a_few_packets() -> Result<()> {
    let client = Host::new("og", "10.237.0.1/24")?;
    let server = Host::new("oh", "10.237.0.2/24")?;
    let svc = Service::start_config(
        &config(
            &[("pf0vf0", &client), ("pf0vf1", &server)],
            "stateless_after = 4\nidle_secs = 60",
        ),
        &[],
    )?;
    svc.stateful_web_tenant("plum", &["pf0vf0", "pf0vf1"], "10.237.0.1/32")?;
    svc.dpuctl_json(&[
        "rule",
        "add",
        "plum",
        "--id",
        "sink",
        "--priority",
        "20",
        "--action",
        "deny",
        "--proto",
        "udp",
        "--dport",
        "9",
    ])?;
    // The server's MAC must be known to the client: one allowed
    // exchange first (ARP passes).
    let _server = Reaped(server.spawn_python(SERVER, &["10.237.0.2", "8080"])?);
    eventually("a conversation through the switch", || {
        client
            .python(CHAT, &["10.237.0.2", "8080", "1", "10", "0", "0"])
            .status
            .success()
    })?;
    let before = svc.dpuctl_json(&["counters", "--tenant", "plum"])?;
    let dropped_before = num(&before["tenants"][0], "droppedPackets");
    let o = client.python(DATAGRAMS, &["10.237.0.2", "9", "400"]);
    ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = status_until(&svc, "the model's drops to be counted", |s| {
        s["tenants"].as_array().is_some_and(|a| {
            a.iter()
                .any(|t| t["tenant"] == "tenants/plum" && num(t, "droppedPackets") >= 360)
        })
    })?;
    ensure!(num(&s, "offloaded") >= 1, "{s}");
    let counters = svc.dpuctl_json(&["counters", "--tenant", "plum"])?;
    let t = &counters["tenants"][0];
    let dropped = num(t, "droppedPackets") - dropped_before;
    ensure!(
        dropped >= 400,
        "every datagram counts as dropped, in hardware or not: {counters}"
    );
    // And as a match of the rule that denied it.
    let sink = counters["rules"]
        .as_array()
        .and_then(|a| a.iter().find(|r| r["rule"] == "tenants/plum/rules/sink"))
        .map(|r| num(r, "packets"))
        .unwrap_or(0);
    ensure!(sink >= 400, "rule sink matched {sink}: {counters}");
    let (_, body) = svc.http_get("/metrics")?;
    ensure!(
        metric(
            &body,
            "dpu_offload_tenant_dropped_packets_total{tenant=\"plum\"}"
        ) >= 360,
        "{body}"
    );
    let text = svc.dpuctl_ok(&["offload", "status"])?;
    ensure!(text.contains("DROPPED"), "{text}");
    Ok(())
}

/// ADDR BASE N K: sends K datagrams to each of ports BASE..BASE+N of
/// ADDR, from one socket (N flows), a port's K together.
const SPRAY: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
addr, base, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for p in range(n):
    for _ in range(k):
        s.sendto(b"x" * 32, (addr, base + p))
    if p % 20 == 19:
        time.sleep(0.002)
"#;

/// A tenant sending denied datagrams to thousands of ports (a flood of
/// short flows, each past `stateless_after`) holds no more of the table
/// than its share, leaves another tenant's flows in hardware, and does
/// not hold up a rule change; what it sent is still counted, in
/// hardware or not.
#[test]
fn a_flood_of_denied_flows_keeps_to_its_share() -> Result<()> {
    let TwoTenants {
        svc,
        g1,
        g2: _g2,
        r1,
        r2: _r2,
        servers: _servers,
    } = TwoTenants::start(
        ["oi", "oj", "ok", "ol"],
        239,
        "table_size = 64\nper_tenant = 40\nreserved_per_tenant = 16\nidle_secs = 60\n\
         stateless_after = 2",
    )?;
    // Green's conversation goes to hardware.
    let chat = g1.spawn_python_out(CHAT, &["10.239.0.2", "8080", "200", "100", "0.05", "0"])?;
    status_until(&svc, "green's conversation in hardware", |s| {
        tenant_of(s, "green").0 >= 2
    })?;
    let before = svc.dpuctl_json(&["counters", "--tenant", "red"])?;
    let red_dropped = num(&before["tenants"][0], "droppedPackets");
    // Red sprays 3,000 denied flows, 3 datagrams each.
    let spray = red_spray(&r1)?;
    // A rule change meanwhile is answered at once.
    let t0 = Instant::now();
    svc.dpuctl_json(&[
        "rule",
        "add",
        "green",
        "--id",
        "dns",
        "--priority",
        "20",
        "--action",
        "allow",
        "--proto",
        "udp",
        "--dport",
        "53",
    ])?;
    let took = t0.elapsed();
    ensure!(
        took < Duration::from_secs(5),
        "a rule change took {took:?} during the flood"
    );
    let sprayed = spray.wait_with_output()?;
    ensure!(
        sprayed.status.success(),
        "{}",
        String::from_utf8_lossy(&sprayed.stderr)
    );
    let s = status(&svc)?;
    let (red, _, _) = tenant_of(&s, "red");
    ensure!(red <= 40, "red holds {red} flows, past its 40: {s}");
    ensure!(num(&s, "inUse") <= 64, "{s}");
    ensure!(num(&s, "overQuota") > 0, "red's share never filled: {s}");
    // Green's change took its flows out; its conversation goes back to
    // hardware beside red's share and goes on there (green may hold drops
    // of its own too: late segments of its closed first connection).
    let (_, green_pkts, _) = status_until(&svc, "green's conversation in hardware again", |s| {
        tenant_of(s, "green").0 >= 2
    })
    .map(|s| tenant_of(&s, "green"))?;
    status_until(&svc, "green's packets to go on in hardware", |s| {
        tenant_of(s, "green").1 > green_pkts + 20
    })?;
    let done = chat.wait_with_output()?;
    let said = String::from_utf8_lossy(&done.stdout);
    ensure!(done.status.success() && said.contains("ok 200"), "{said}");
    // Every datagram red sent counts as received and dropped, but those
    // its port's socket had no room for (a busy machine's).
    let after = svc.dpuctl_json(&["counters", "--tenant", "red"])?;
    let dropped = num(&after["tenants"][0], "droppedPackets") - red_dropped;
    let missed = after["ports"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["port"] == "ports/pf0vf2"))
        .map_or(0, |p| num(&p["counters"], "rxMissed"));
    ensure!(
        dropped + missed >= 8_900,
        "red's 9,000 datagrams: {dropped} dropped, {missed} missed: {after}"
    );
    Ok(())
}

fn red_spray(r1: &Host) -> Result<std::process::Child> {
    r1.spawn_python_out(SPRAY, &["10.239.1.2", "20000", "3000", "3"])
}
