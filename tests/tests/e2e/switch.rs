//! The per-tenant switch through the real binary: network namespaces play
//! tenant hosts, each joined by a veth pair to a DPDK `net_af_packet` port
//! the service opens from its configuration. Tenants and rules are made
//! with dpuctl; ping shows what crosses the switch, and the counters move
//! in gRPC telemetry and on `/metrics`. Needs root (namespaces, raw
//! sockets); everything created is removed on exit.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dpu_e2e::net::{config, eventually, ip, metric, Host, Reaped};
use dpu_e2e::{rss_kib, Service};
use dpu_rand::Rng;

/// Held by each test while its service runs: DPDK 22.11's net_af_packet
/// derives its PACKET_FANOUT group from the process ID and interface
/// index, and two services started side by side can draw the same group,
/// which the kernel refuses (EINVAL) for the second.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The last CPU this process may run on (`Cpus_allowed_list` of
/// /proc/self/status, e.g. "0-1" or "0,2-3").
fn last_allowed_cpu() -> Result<usize> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .ok_or_else(|| anyhow::anyhow!("no Cpus_allowed_list in /proc/self/status"))?;
    let last = list.trim().rsplit([',', '-']).next().unwrap_or("0");
    Ok(last.parse()?)
}

/// The CPUs thread `name` of process `pid` may run on, as the kernel
/// lists them.
fn thread_cpus(pid: u32, name: &str) -> Result<String> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let dir = task?.path();
        if std::fs::read_to_string(dir.join("comm"))?.trim() == name {
            let status = std::fs::read_to_string(dir.join("status"))?;
            return status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|l| l.trim().to_string())
                .ok_or_else(|| anyhow::anyhow!("no Cpus_allowed_list for {name}"));
        }
    }
    bail!("process {pid} has no thread {name}")
}

/// Without DPDK: the same switch on the kernel driver (packet sockets on
/// the veth ends), its worker pinned to a CPU. Runs beside the DPDK tests:
/// its fanout groups get kernel-chosen IDs, so nothing collides.
#[test]
fn the_kernel_driver_switches_tenants_with_a_pinned_worker() -> Result<()> {
    let a1 = Host::new("k", "10.232.0.1/24")?;
    let a2 = Host::new("l", "10.232.0.2/24")?;
    let b1 = Host::new("m", "10.232.0.3/24")?;
    let cpu = last_allowed_cpu()?;
    let mut config = format!(
        "[dataplane]\nworkers = 1\nworker_cpus = [{cpu}]\nidle = \"backoff\"\nmbufs = 4096\n"
    );
    for (id, h) in [("pf0vf0", &a1), ("pf0vf1", &a2), ("pf0vf2", &b1)] {
        config += &format!(
            "\n[[ports]]\nid = \"{id}\"\nrole = \"vf\"\ndriver = \"kernel\"\ndevice = \"{}\"\n",
            h.port_if
        );
    }
    let svc = Service::start_config(&config, &[])?;
    let info = svc.dpuctl_json(&["info"])?;
    assert_eq!(info["dataplaneDriver"], "kernel", "{info}");
    let pid = svc.pid().ok_or_else(|| anyhow::anyhow!("no pid"))?;
    assert_eq!(thread_cpus(pid, "dp-worker-0")?, cpu.to_string());

    assert!(!a1.ping("10.232.0.2"), "crossed without a tenant");
    for (tenant, ports) in [
        ("red", &["pf0vf0", "pf0vf1"][..]),
        ("blue", &["pf0vf2"][..]),
    ] {
        let mut args = vec!["tenant", "create", tenant, "--default-policy", "allow"];
        for p in ports {
            args.extend(["--port", p]);
        }
        svc.dpuctl_json(&args)?;
    }
    eventually("red hosts to reach each other", || a1.ping("10.232.0.2"))?;
    assert!(a2.ping("10.232.0.1"));
    assert!(!a1.ping("10.232.0.3"), "red reached blue");
    assert!(!b1.ping("10.232.0.2"), "blue reached red");

    port_counters_moved(&svc, 4)?;
    let ports = svc.dpuctl_json(&["port", "list"])?.to_string();
    let mac = host_mac_outside(&a1)?;
    assert!(ports.contains(&mac), "port list lacks {mac}: {ports}");
    Ok(())
}

/// VXLAN through the real binary on the kernel driver: the uplink's VTEP
/// (192.0.2.1) faces a namespace whose Linux `vxlan` device (VNI 100,
/// 192.0.2.2) plays a remote hypervisor. Red's VF host and the remote
/// host reach each other through VNI 100 (ARP for both VTEPs resolved on
/// the way); blue's host, in the same subnet but on VNI 200, which the
/// remote does not serve, reaches nothing.
#[test]
fn vxlan_networks_reach_remote_vteps_of_their_tenant_only() -> Result<()> {
    let remote = Host::new("x", "192.0.2.2/24")?;
    let a = Host::new("y", "10.233.0.1/24")?;
    let b = Host::new("z", "10.233.0.3/24")?;
    let peer = format!("{}p", remote.port_if);
    for cmd in [
        &[
            "ip",
            "link",
            "add",
            "vx100",
            "type",
            "vxlan",
            "id",
            "100",
            "local",
            "192.0.2.2",
            "remote",
            "192.0.2.1",
            "dstport",
            "4789",
            "dev",
            &peer,
        ][..],
        &["ip", "addr", "add", "10.233.0.2/24", "dev", "vx100"],
        &["ip", "link", "set", "vx100", "up"],
    ] {
        let out = remote.ns.exec(cmd)?;
        if !out.status.success() {
            bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let mut config = "[dataplane]\nworkers = 1\nidle = \"backoff\"\nmbufs = 4096\n".to_string();
    for (id, h, vtep) in [
        ("p0", &remote, "\nvtep_address = \"192.0.2.1\""),
        ("pf0vf0", &a, ""),
        ("pf0vf1", &b, ""),
    ] {
        config += &format!(
            "\n[[ports]]\nid = \"{id}\"\ndriver = \"kernel\"\ndevice = \"{}\"{vtep}\n",
            h.port_if
        );
    }
    let svc = Service::start_config(&config, &[])?;
    for (tenant, port, vxlan) in [
        ("red", "pf0vf0", "p0:100:192.0.2.2"),
        ("blue", "pf0vf1", "p0:200:192.0.2.2"),
    ] {
        svc.dpuctl_json(&[
            "tenant",
            "create",
            tenant,
            "--default-policy",
            "allow",
            "--port",
            port,
            "--vxlan",
            vxlan,
        ])?;
    }
    let red = svc.dpuctl_json(&["tenant", "get", "red"])?.to_string();
    assert!(red.contains("192.0.2.2"), "remote VTEP not kept: {red}");
    eventually("red's host to reach the remote host over VNI 100", || {
        a.ping("10.233.0.2")
    })?;
    assert!(
        remote.ns.ping("10.233.0.1"),
        "the remote host did not reach red's"
    );
    assert!(!b.ping("10.233.0.2"), "blue reached red's remote host");
    assert!(!b.ping("10.233.0.1"), "blue reached red's host");
    // What crossed the uplink was VXLAN: the remote kernel's device counted it.
    let stats = remote.ns.exec(&["ip", "-s", "link", "show", "vx100"])?;
    let text = String::from_utf8_lossy(&stats.stdout).to_string();
    let rx_packets: u64 = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("RX:"))
        .nth(1)
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        rx_packets >= 4,
        "vx100 received {rx_packets} packets: {text}"
    );
    Ok(())
}

/// The MAC address of the host's veth end outside its namespace (the
/// service's port).
fn host_mac_outside(h: &Host) -> Result<String> {
    let mac = std::fs::read_to_string(format!("/sys/class/net/{}/address", h.port_if))?;
    Ok(mac.trim().to_string())
}

#[test]
fn tenants_reach_their_own_hosts_only_and_rules_apply_at_once() -> Result<()> {
    let _serial = one_at_a_time();
    let a1 = Host::new("a", "10.230.0.1/24")?;
    let a2 = Host::new("b", "10.230.0.2/24")?;
    let b1 = Host::new("c", "10.230.0.3/24")?;
    let svc = Service::start_config(
        &config("acl", &[("pf0vf0", &a1), ("pf0vf1", &a2), ("pf0vf2", &b1)]),
        &[],
    )?;

    let info = svc.dpuctl_json(&["info"])?;
    assert_eq!(info["dataplaneDriver"], "dpdk", "{info}");

    // No tenant yet: nothing crosses.
    assert!(!a1.ping("10.230.0.2"));

    allow_tenant(&svc, "red", &["pf0vf0", "pf0vf1"])?;
    allow_tenant(&svc, "blue", &["pf0vf2"])?;
    eventually("red hosts to reach each other", || a1.ping("10.230.0.2"))?;
    assert!(a2.ping("10.230.0.1"));
    // Same subnet, other tenant: unreachable both ways.
    assert!(!a1.ping("10.230.0.3"));
    assert!(!b1.ping("10.230.0.1"));

    // A deny rule takes effect at once, and its drops are counted.
    let before = svc.dpuctl_json(&["counters"])?;
    svc.dpuctl_json(&[
        "rule",
        "add",
        "red",
        "--id",
        "no-icmp",
        "--priority",
        "5",
        "--action",
        "deny",
        "--proto",
        "icmp",
    ])?;
    assert!(!a1.ping("10.230.0.2"), "the deny rule let ICMP through");
    let after = svc.dpuctl_json(&["counters"])?;
    let drops = |v: &serde_json::Value| -> u64 {
        v["drops"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["reason"] == "DROP_REASON_ACL_DENY")
            .filter_map(|d| {
                d["packets"]
                    .as_str()
                    .and_then(|p| p.parse().ok())
                    .or(d["packets"].as_u64())
            })
            .sum()
    };
    assert!(
        drops(&after) >= drops(&before) + 2,
        "ACL drops did not move: {after}"
    );
    // The rule's own counter and the tenant's moved too, in gRPC and /metrics.
    let num = |v: &serde_json::Value| -> u64 {
        v.as_str()
            .and_then(|p| p.parse().ok())
            .or(v.as_u64())
            .unwrap_or(0)
    };
    let red = svc.dpuctl_json(&["counters", "--tenant", "red"])?;
    // The entry of `list` whose `key` is `name`, or null.
    let entry = |list: &str, key: &str, name: &str| {
        red[list]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e[key] == name)
            .cloned()
            .unwrap_or_default()
    };
    let rule = entry("rules", "rule", "tenants/red/rules/no-icmp");
    assert!(
        num(&rule["packets"]) >= 2
            && num(&rule["bytes"]) >= 2 * 98
            && rule["lastHitTime"].is_string(),
        "rule counters: {red}"
    );
    let tenant = entry("tenants", "tenant", "tenants/red");
    assert!(
        num(&tenant["droppedPackets"]) >= 2
            && num(&tenant["forwardedPackets"]) >= 2
            && num(&tenant["rxPackets"])
                >= num(&tenant["droppedPackets"]) + num(&tenant["forwardedPackets"]),
        "tenant counters: {red}"
    );
    let (_, body) = svc.http_get("/metrics")?;
    assert!(
        metric(
            &body,
            "dpu_rule_packets_total{tenant=\"red\",rule=\"no-icmp\"}"
        ) >= 2,
        "rule counter on /metrics:\n{body}"
    );
    svc.dpuctl_json(&["rule", "delete", "red", "no-icmp"])?;
    eventually("ICMP to pass again", || a1.ping("10.230.0.2"))?;

    // 64 rules, none for ICMP: the worker looks red's flows up in its
    // flow cache, and the cache's counts reach /metrics.
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("rules.json");
    let rules: Vec<serde_json::Value> = (0..64)
        .map(|i| {
            serde_json::json!({
                "priority": 10 + i,
                "ipProtocol": 6,
                "dstPorts": {"first": 1000 + i, "last": 1000 + i},
                "action": "RULE_ACTION_DENY",
            })
        })
        .collect();
    std::fs::write(&file, serde_json::to_vec(&rules)?)?;
    let path = file.display().to_string();
    svc.dpuctl_json(&["rule", "replace", "red", "--file", &path])?;
    eventually("ICMP through 64 rules", || a1.ping("10.230.0.2"))?;
    for _ in 0..3 {
        assert!(a1.ping("10.230.0.2"), "ICMP through 64 rules");
    }
    eventually("flow-cache counts on /metrics", || {
        svc.http_get("/metrics").is_ok_and(|(_, body)| {
            metric(&body, "dpu_flow_cache_lookups_total") >= 6
                && metric(&body, "dpu_flow_cache_hits_total") >= 4
        })
    })?;
    // And in gRPC telemetry, at least as many as /metrics showed.
    let fc = svc.dpuctl_json(&["counters"])?["flowCache"].clone();
    assert!(
        num(&fc["lookups"]) >= 6 && num(&fc["hits"]) >= 4,
        "flow cache in gRPC telemetry: {fc}"
    );

    // Ports: status and counters through gRPC and /metrics.
    let ports = svc.dpuctl_json(&["port", "list"])?;
    let text = ports.to_string();
    assert!(text.contains("pf0vf0") && text.contains("pf0vf2"), "{text}");
    port_counters_moved(&svc, 6)
}

/// On `/metrics`: at least `least` packets received on pf0vf0 and sent on
/// pf0vf1, and every port's link up.
fn port_counters_moved(svc: &Service, least: u64) -> Result<()> {
    let (status, body) = svc.http_get("/metrics")?;
    assert!(status.contains("200"), "{status}");
    let rx = metric(&body, "dpu_port_rx_packets_total{port=\"pf0vf0\"}");
    let tx = metric(&body, "dpu_port_tx_packets_total{port=\"pf0vf1\"}");
    assert!(
        rx >= least && tx >= least,
        "port counters: rx {rx}, tx {tx}\n{body}"
    );
    for port in ["pf0vf0", "pf0vf1", "pf0vf2"] {
        let up = metric(&body, &format!("dpu_port_link_up{{port=\"{port}\"}}"));
        assert_eq!(up, 1, "{port} down:\n{body}");
    }
    Ok(())
}

/// Serves TCP on ADDR PORT: for each connection, reads a line, answers
/// with N bytes, closes. Runs until killed.
const SERVER: &str = r#"
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(8)
while True:
    c, _ = s.accept()
    c.settimeout(5)
    try:
        c.recv(100)
        c.sendall(b"x" * int(sys.argv[3]))
    except OSError:
        pass
    c.close()
"#;

/// Connects to ADDR PORT (3 s timeout), sends a line, prints how many
/// bytes came back before the server closed. Fails if it cannot connect.
const CLIENT: &str = r#"
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
s.sendall(b"hello\n")
n = 0
while True:
    b = s.recv(65536)
    if not b:
        break
    n += len(b)
print(n)
"#;

/// Sends one bare TCP segment with FLAGS (an int) from SRC:SPORT to
/// DST:DPORT through a raw socket, checksummed.
const RAW_TCP: &str = r#"
import socket, struct, sys
src, sport, dst, dport, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
hdr = struct.pack("!HHIIBBHHH", sport, dport, 1000, 0, 5 << 4, flags, 65535, 0, 0)
pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 6, len(hdr))
data = pseudo + hdr
total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
while total >> 16:
    total = (total & 0xffff) + (total >> 16)
hdr = hdr[:16] + struct.pack("!H", ~total & 0xffff) + hdr[18:]
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
s.sendto(hdr, (dst, 0))
"#;

#[test]
fn a_stateful_allow_lets_replies_back_and_nothing_else() -> Result<()> {
    let _serial = one_at_a_time();
    let client = Host::new("d", "10.231.0.1/24")?;
    let server = Host::new("e", "10.231.0.2/24")?;
    let svc = Service::start_config(
        &config("ct", &[("pf0vf0", &client), ("pf0vf1", &server)]),
        &[],
    )?;
    // Default deny; the client may open TCP to port 8080 and ping, both
    // stateful. Nothing allows the server to start anything.
    svc.dpuctl_json(&[
        "tenant", "create", "green", "--port", "pf0vf0", "--port", "pf0vf1",
    ])?;
    for (id, prio, more) in [
        ("web", "10", &["--proto", "tcp", "--dport", "8080"][..]),
        ("ping", "20", &["--proto", "icmp", "--icmp-type", "8"][..]),
    ] {
        let mut args = vec![
            "rule",
            "add",
            "green",
            "--id",
            id,
            "--priority",
            prio,
            "--action",
            "allow",
            "--src",
            "10.231.0.1/32",
            "--stateful",
        ];
        args.extend_from_slice(more);
        svc.dpuctl_json(&args)?;
    }

    // Ping one way only: the echo reply rides the client's connection.
    eventually("the client's ping to be answered", || {
        client.ping("10.231.0.2")
    })?;
    assert!(!server.ping("10.231.0.1"), "the server's ping got through");

    // TCP from the client: handshake, a megabyte back, close.
    let _web = Reaped(server.spawn_python(SERVER, &["10.231.0.2", "8080", "1000000"])?);
    let _back = Reaped(client.spawn_python(SERVER, &["10.231.0.1", "9090", "10"])?);
    let mut fetched = String::new();
    eventually("a TCP exchange from the client", || {
        let out = client.python(CLIENT, &["10.231.0.2", "8080"]);
        fetched = String::from_utf8_lossy(&out.stdout).trim().to_string();
        out.status.success()
    })?;
    assert_eq!(fetched, "1000000", "bytes the client got back");
    // The server cannot open a connection to the client.
    let out = server.python(CLIENT, &["10.231.0.1", "9090"]);
    assert!(
        !out.status.success(),
        "the server connected to the client: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Lone ACKs and RSTs toward the allowed port open nothing: they are
    // counted as invalid, and a server-side ACK is denied.
    let drops = |reason: &str| -> Result<u64> {
        let (_, body) = svc.http_get("/metrics")?;
        Ok(metric(
            &body,
            &format!("dpu_dropped_packets_total{{reason=\"{reason}\"}}"),
        ))
    };
    let (invalid0, denied0) = (drops("conntrack_invalid")?, drops("acl_deny")?);
    for flags in ["16", "4"] {
        let out = client.python(
            RAW_TCP,
            &["10.231.0.1", "41000", "10.231.0.2", "8080", flags],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = server.python(
        RAW_TCP,
        &["10.231.0.2", "8080", "10.231.0.1", "41001", "16"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually("the bare segments to be counted", || {
        drops("conntrack_invalid").unwrap_or(0) >= invalid0 + 2
            && drops("acl_deny").unwrap_or(0) > denied0
    })?;

    // The tenant's tracked connections show as a gauge (the closed TCP
    // connection and the pings linger until they time out).
    eventually("the conntrack gauge", || {
        svc.http_get("/metrics").is_ok_and(|(_, body)| {
            metric(&body, "dpu_tenant_conntrack_entries{tenant=\"green\"}") >= 1
        })
    })?;
    let rules = svc
        .dpuctl_json(&["counters", "--tenant", "green"])?
        .to_string();
    assert!(rules.contains("tenants/green/rules/web"), "{rules}");

    // Removing the rule ends its connections: the client cannot fetch.
    svc.dpuctl_json(&["rule", "delete", "green", "web"])?;
    let out = client.python(CLIENT, &["10.231.0.2", "8080"]);
    assert!(!out.status.success(), "TCP passed without its rule");
    Ok(())
}

/// Creates tenant `name`, default allow, attached to `ports` (dpuctl's
/// `--port` values); returns what dpuctl printed.
fn allow_tenant(svc: &Service, name: &str, ports: &[&str]) -> Result<serde_json::Value> {
    let mut args = vec!["tenant", "create", name, "--default-policy", "allow"];
    for p in ports {
        args.extend(["--port", p]);
    }
    svc.dpuctl_json(&args)
}

/// The MAC address of the host's interface in its namespace.
pub(crate) fn host_mac(h: &Host) -> Result<String> {
    let out = Command::new("ip")
        .args([
            "-n",
            &h.ns.name,
            "-o",
            "link",
            "show",
            "dev",
            &format!("{}p", h.port_if),
        ])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("no MAC in {text:?}"))
}

#[test]
fn anti_spoofing_drops_forged_sources() -> Result<()> {
    let _serial = one_at_a_time();
    let vm = Host::new("f", "10.232.0.1/24")?;
    let peer = Host::new("g", "10.232.0.2/24")?;
    let svc = Service::start_config(&config("spoof", &[("pf0vf0", &vm), ("pf0vf1", &peer)]), &[])?;
    let mac = host_mac(&vm)?;
    let guarded = format!("pf0vf0,mac={mac},ip=10.232.0.1/32");
    let t = allow_tenant(&svc, "violet", &[&guarded, "pf0vf1"])?;
    let port = &t["attachments"][0]["port"];
    assert_eq!(port["allowedMacs"][0], mac.as_str(), "{t}");
    assert_eq!(port["allowedSourcePrefixes"][0], "10.232.0.1/32", "{t}");
    eventually("the guarded host to reach its peer", || {
        vm.ping("10.232.0.2")
    })?;

    let spoofed = || -> u64 {
        svc.http_get("/metrics").map_or(0, |(_, body)| {
            metric(&body, "dpu_dropped_packets_total{reason=\"spoofed\"}")
        })
    };
    let before = spoofed();
    // Another source address on the same interface: refused.
    ip(&[
        "-n",
        &vm.ns.name,
        "addr",
        "add",
        "10.232.0.9/24",
        "dev",
        &format!("{}p", vm.port_if),
    ])?;
    let forged_ip = Command::new("ip")
        .args([
            "netns",
            "exec",
            &vm.ns.name,
            "ping",
            "-c",
            "2",
            "-i",
            "0.2",
            "-W",
            "1",
            "-I",
            "10.232.0.9",
            "10.232.0.2",
        ])
        .output()?;
    assert!(
        !forged_ip.status.success(),
        "a forged source IP got through"
    );
    // Another MAC: refused, even from the allowed address.
    ip(&[
        "-n",
        &vm.ns.name,
        "link",
        "set",
        "dev",
        &format!("{}p", vm.port_if),
        "address",
        "02:00:00:00:99:01",
    ])?;
    assert!(!vm.ping("10.232.0.2"), "a forged source MAC got through");
    eventually("spoofed drops to be counted", || spoofed() >= before + 4)?;

    // Dropping the guard (the attachment without lists) lets it through.
    svc.dpuctl_json(&[
        "tenant", "update", "violet", "--port", "pf0vf0", "--port", "pf0vf1",
    ])?;
    eventually("the unguarded host to reach its peer", || {
        vm.ping("10.232.0.2")
    })?;
    Ok(())
}

#[test]
fn a_rate_limited_rule_passes_its_rate_and_drops_the_rest() -> Result<()> {
    let _serial = one_at_a_time();
    let a = Host::new("h", "10.233.0.1/24")?;
    let b = Host::new("i", "10.233.0.2/24")?;
    let svc = Service::start_config(&config("rate", &[("pf0vf0", &a), ("pf0vf1", &b)]), &[])?;
    svc.dpuctl_json(&[
        "tenant", "create", "amber", "--port", "pf0vf0", "--port", "pf0vf1",
    ])?;
    // ICMP both ways, at most 5 packets a second with a bucket of 5.
    svc.dpuctl_json(&[
        "rule",
        "add",
        "amber",
        "--id",
        "icmp",
        "--priority",
        "10",
        "--action",
        "allow",
        "--proto",
        "icmp",
        "--rate-limit",
        "5pps",
        "--burst",
        "5",
    ])?;
    eventually("ping to cross", || a.ping("10.233.0.2"))?;
    let limited = || -> u64 {
        svc.http_get("/metrics").map_or(0, |(_, body)| {
            metric(&body, "dpu_dropped_packets_total{reason=\"rate_limited\"}")
        })
    };
    let before = limited();
    std::thread::sleep(Duration::from_secs(2)); // a full bucket
                                                // 100 echo requests in about a second: the bucket's 5 and about 5
                                                // more pass (requests and replies alike), the rest is dropped.
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &a.ns.name,
            "ping",
            "-q",
            "-c",
            "100",
            "-i",
            "0.01",
            "-W",
            "1",
            "10.233.0.2",
        ])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let received: u64 = text
        .split(", ")
        .find_map(|p| p.strip_suffix(" received").and_then(|n| n.parse().ok()))
        .ok_or_else(|| anyhow::anyhow!("no summary in {text}"))?;
    assert!(
        (1..=20).contains(&received),
        "{received} replies came back:\n{text}"
    );
    eventually("rate-limited drops to be counted", || {
        limited() >= before + 80
    })?;
    Ok(())
}

/// Waits up to 4 s for one UDP datagram on ADDR PORT; prints its length,
/// or nothing if none came.
const UDP_RECV: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
s.settimeout(4)
try:
    print(len(s.recv(65536)))
except socket.timeout:
    pass
"#;

/// Sends a UDP datagram of N bytes to ADDR PORT (fragmented by the
/// kernel past the MTU) five times, half a second apart, so that a
/// receiver still starting gets one.
const UDP_SEND: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(5):
    s.sendto(b"f" * int(sys.argv[3]), (sys.argv[1], int(sys.argv[2])))
    time.sleep(0.5)
"#;

/// Item 4 through the real binary: a 3000-byte ping, fragmented both
/// ways, crosses a default-deny tenant whose only rule is a stateful
/// ICMP echo allow (the reply's later fragments pass with its first);
/// on a default-allow tenant, a port deny is not bypassed by a
/// fragmented datagram, whose later fragments are counted.
///
/// On the kernel driver: DPDK's `net_af_packet` joins its sockets to a
/// fanout group with `PACKET_FANOUT_FLAG_DEFRAG`, so the kernel hands it
/// datagrams reassembled (and cut to its 2048-byte frames), never the
/// fragments a NIC's PMD would see.
#[test]
fn fragments_pass_with_their_first_fragment_only() -> Result<()> {
    let client = Host::new("fa", "10.236.0.1/24")?;
    let server = Host::new("fb", "10.236.0.2/24")?;
    let sender = Host::new("fc", "10.236.1.1/24")?;
    let receiver = Host::new("fd", "10.236.1.2/24")?;
    let mut config = "[dataplane]\nworkers = 1\nidle = \"backoff\"\nmbufs = 4096\n".to_string();
    for (id, h) in [
        ("pf0vf0", &client),
        ("pf0vf1", &server),
        ("pf0vf2", &sender),
        ("pf0vf3", &receiver),
    ] {
        config += &format!(
            "\n[[ports]]\nid = \"{id}\"\nrole = \"vf\"\ndriver = \"kernel\"\ndevice = \"{}\"\n",
            h.port_if
        );
    }
    let svc = Service::start_config(&config, &[])?;
    svc.dpuctl_json(&[
        "tenant", "create", "green", "--port", "pf0vf0", "--port", "pf0vf1",
    ])?;
    svc.dpuctl_json(&[
        "rule",
        "add",
        "green",
        "--id",
        "ping",
        "--priority",
        "10",
        "--action",
        "allow",
        "--src",
        "10.236.0.1/32",
        "--proto",
        "icmp",
        "--icmp-type",
        "8",
        "--stateful",
    ])?;
    allow_tenant(&svc, "amber", &["pf0vf2", "pf0vf3"])?;
    svc.dpuctl_json(&[
        "rule",
        "add",
        "amber",
        "--id",
        "no-9999",
        "--priority",
        "10",
        "--action",
        "deny",
        "--proto",
        "udp",
        "--dport",
        "9999",
    ])?;
    let big_ping = |from: &Host, to: &str| {
        from.ns
            .exec(&["ping", "-c", "2", "-W", "2", "-s", "3000", to])
            .is_ok_and(|o| o.status.success())
    };
    eventually("a small ping across green", || client.ping("10.236.0.2"))?;
    assert!(big_ping(&client, "10.236.0.2"), "a 3000-byte ping failed");
    assert!(
        !big_ping(&server, "10.236.0.1"),
        "the server's fragmented ping got through"
    );

    let drops = |reason: &str| -> u64 {
        svc.http_get("/metrics").map_or(0, |(_, body)| {
            metric(
                &body,
                &format!("dpu_dropped_packets_total{{reason=\"{reason}\"}}"),
            )
        })
    };
    let unknown0 = drops("fragment_unknown");
    eventually("amber's hosts to reach each other", || {
        sender.ping("10.236.1.2")
    })?;
    // 4000 bytes: three fragments. To the denied port, none arrives; to
    // another, all of it.
    for (port, want) in [("9999", ""), ("9998", "4000")] {
        let listen = receiver.spawn_python_out(UDP_RECV, &["10.236.1.2", port])?;
        let out = sender.python(UDP_SEND, &["10.236.1.2", port, "4000"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = listen.wait_with_output()?;
        assert_eq!(
            String::from_utf8_lossy(&got.stdout).trim(),
            want,
            "to port {port}"
        );
    }
    eventually(
        "the denied datagram's later fragments to be counted",
        || drops("fragment_unknown") >= unknown0 + 10,
    )?;
    Ok(())
}

/// Sends COUNT TCP SYNs from SRC to DST:DPORT through a raw socket, from
/// source ports 20000 on, checksummed: a bounded SYN flood.
const SYN_FLOOD: &str = r#"
import socket, struct, sys
src, dst, dport, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
for sport in range(20000, 20000 + count):
    hdr = struct.pack("!HHIIBBHHH", sport, dport, 1000, 0, 5 << 4, 2, 65535, 0, 0)
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 6, len(hdr))
    data = pseudo + hdr
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while total >> 16:
        total = (total & 0xffff) + (total >> 16)
    s.sendto(hdr[:16] + struct.pack("!H", ~total & 0xffff) + hdr[18:], (dst, 0))
"#;

/// Item 5 through the real binary: with a 64-connection table, 16 kept
/// for each of three tenants with stateful rules, two tenants flood SYNs
/// (500 each) and get the pool and their own reserves; the third still
/// opens TCP connections and fetches over them.
#[test]
fn a_syn_flood_from_other_tenants_leaves_a_tenant_its_connections() -> Result<()> {
    let _serial = one_at_a_time();
    let flood1 = Host::new("na", "10.237.0.1/24")?;
    let flood2 = Host::new("nb", "10.237.1.1/24")?;
    let client = Host::new("nc", "10.237.2.1/24")?;
    let server = Host::new("nd", "10.237.2.2/24")?;
    let cfg = config(
        "flood",
        &[
            ("pf0vf0", &flood1),
            ("pf0vf1", &flood2),
            ("pf0vf2", &client),
            ("pf0vf3", &server),
        ],
    )
    .replacen(
        "[dataplane]\n",
        "[dataplane]\nconntrack_max = 64\nconntrack_per_tenant = 64\nconntrack_reserved_per_tenant = 16\n",
        1,
    );
    let svc = Service::start_config(&cfg, &[])?;
    for (tenant, ports, src) in [
        ("flood1", &["pf0vf0"][..], "10.237.0.1/32"),
        ("flood2", &["pf0vf1"][..], "10.237.1.1/32"),
        ("victim", &["pf0vf2", "pf0vf3"][..], "10.237.2.1/32"),
    ] {
        svc.stateful_web_tenant(tenant, ports, src)?;
    }
    // The flooders' targets answer nothing: a static neighbour lets the
    // SYNs out.
    for (h, target) in [(&flood1, "10.237.0.99"), (&flood2, "10.237.1.99")] {
        let peer = format!("{}p", h.port_if);
        let out = h.ns.exec(&[
            "ip",
            "neigh",
            "replace",
            target,
            "lladdr",
            "02:00:00:00:00:99",
            "dev",
            &peer,
        ])?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (f1, f2) = (
        flood1.spawn_python(SYN_FLOOD, &["10.237.0.1", "10.237.0.99", "8080", "500"])?,
        flood2.spawn_python(SYN_FLOOD, &["10.237.1.1", "10.237.1.99", "8080", "500"])?,
    );
    let (mut f1, mut f2) = (Reaped(f1), Reaped(f2));
    f1.0.wait()?;
    f2.0.wait()?;
    let gauge = |tenant: &str| -> u64 {
        svc.http_get("/metrics").map_or(0, |(_, body)| {
            metric(
                &body,
                &format!("dpu_tenant_conntrack_entries{{tenant=\"{tenant}\"}}"),
            )
        })
    };
    eventually("the flood to fill the pool", || {
        gauge("flood1") + gauge("flood2") >= 48
    })?;
    let full = svc.http_get("/metrics").map_or(0, |(_, body)| {
        metric(&body, "dpu_dropped_packets_total{reason=\"table_full\"}")
    });
    assert!(full >= 900, "only {full} SYNs refused");

    let _web = Reaped(server.spawn_python(SERVER, &["10.237.2.2", "8080", "1000"])?);
    for i in 0..5 {
        let mut fetched = String::new();
        eventually(&format!("TCP fetch {i} from the victim's client"), || {
            let out = client.python(CLIENT, &["10.237.2.2", "8080"]);
            fetched = String::from_utf8_lossy(&out.stdout).trim().to_string();
            out.status.success()
        })?;
        assert_eq!(fetched, "1000");
    }
    eventually("the victim's connections in its gauge", || {
        gauge("victim") >= 5
    })?;
    Ok(())
}

/// Sends raw frames on an interface: `iface count hex..`, each frame
/// `count` times.
const SEND_FRAMES: &str = r#"
import binascii, socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
for h in sys.argv[3:]:
    f = binascii.unhexlify(h)
    for _ in range(int(sys.argv[2])):
        s.send(f)
"#;

/// Counts the frames received on an interface that hold a marker, for a
/// while: `iface seconds hex-marker`; prints the count (frames the
/// namespace sends, such as ICMP errors quoting one, are not counted).
const COUNT_FRAMES: &str = r#"
import binascii, socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind((sys.argv[1], 0))
s.settimeout(0.2)
marker = binascii.unhexlify(sys.argv[3])
end = time.time() + float(sys.argv[2])
n = 0
print("ready", flush=True)
while time.time() < end:
    try:
        f, addr = s.recvfrom(65535)
    except socket.timeout:
        continue
    if addr[2] != socket.PACKET_OUTGOING and marker in f:
        n += 1
print(n, flush=True)
"#;

/// A listener of [`COUNT_FRAMES`] in a host's namespace.
struct Counting(Child);

impl Counting {
    /// Starts counting the frames with `marker` that reach `h` for
    /// `secs` seconds; returns once the socket is open.
    fn start(h: &Host, marker: &[u8], secs: u32) -> Result<Counting> {
        use std::io::BufRead;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &h.ns.name, "python3", "-c", COUNT_FRAMES])
            .arg(format!("{}p", h.port_if))
            .arg(secs.to_string())
            .arg(hex(marker))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut line = String::new();
        let out = child.stdout.as_mut().expect("piped");
        std::io::BufReader::new(out).read_line(&mut line)?;
        if line.trim() != "ready" {
            let _ = child.kill();
            let _ = child.wait();
            bail!("listener did not start: {line:?}");
        }
        Ok(Counting(child))
    }

    /// The count, once the listener's time is up.
    fn count(self) -> Result<u64> {
        let out = self.0.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("listener said {text:?}"))
    }
}

/// Sends each frame of `frames` `count` times from `h`'s interface.
fn send_frames(h: &Host, count: usize, frames: &[Vec<u8>]) -> Result<()> {
    let hexes: Vec<String> = frames.iter().map(|f| hex(f)).collect();
    let iface = format!("{}p", h.port_if);
    let count = count.to_string();
    let mut args = vec![iface.as_str(), count.as_str()];
    args.extend(hexes.iter().map(String::as_str));
    let out = h.python(SEND_FRAMES, &args);
    if !out.status.success() {
        bail!("sending frames: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_mac(s: &str) -> [u8; 6] {
    let mut m = [0; 6];
    for (o, p) in m.iter_mut().zip(s.split(':')) {
        *o = u8::from_str_radix(p, 16).expect("a MAC address");
    }
    m
}

/// An Ethernet header; `tags` are (TPID, VLAN ID) pairs, outermost first.
fn eth_header(dst: [u8; 6], src: [u8; 6], tags: &[(u16, u16)], ethertype: u16) -> Vec<u8> {
    let mut f = [dst, src].concat();
    for &(tpid, vid) in tags {
        f.extend_from_slice(&tpid.to_be_bytes());
        f.extend_from_slice(&vid.to_be_bytes());
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// An IPv4 header (checksummed) and a UDP header (no checksum) around
/// `payload`.
fn ipv4_udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let total = (28 + payload.len()) as u16;
    let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0];
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let mut sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    ip.extend_from_slice(&sport.to_be_bytes());
    ip.extend_from_slice(&dport.to_be_bytes());
    ip.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0]);
    ip.extend_from_slice(payload);
    ip
}

/// A drop counter of the service's `/metrics`.
fn dropped(svc: &Service, reason: &str) -> u64 {
    svc.http_get("/metrics").map_or(0, |(_, body)| {
        metric(
            &body,
            &format!("dpu_dropped_packets_total{{reason=\"{reason}\"}}"),
        )
    })
}

/// VXLAN is accepted from the remote VTEPs an attachment names, and its
/// underlay prefixes, only: an underlay host that knows red's VNI,
/// sending from another address (192.0.2.3) on the same underlay,
/// reaches none of red's hosts and is counted as `unknown_vtep`, while
/// the same frames from the configured remote VTEP (192.0.2.2) or from
/// red's underlay prefix (198.51.100.0/24) reach red's host.
#[test]
fn vxlan_from_an_unknown_vtep_is_dropped_and_counted() -> Result<()> {
    let remote = Host::new("u1", "192.0.2.2/24")?;
    let a = Host::new("u2", "10.235.0.1/24")?;
    let mut config = "[dataplane]\nworkers = 1\nidle = \"backoff\"\nmbufs = 4096\n".to_string();
    for (id, h, vtep) in [
        ("p0", &remote, "\nvtep_address = \"192.0.2.1\""),
        ("pf0vf0", &a, ""),
    ] {
        config += &format!(
            "\n[[ports]]\nid = \"{id}\"\ndriver = \"kernel\"\ndevice = \"{}\"{vtep}\n",
            h.port_if
        );
    }
    let svc = Service::start_config(&config, &[])?;
    svc.dpuctl_json(&[
        "tenant",
        "create",
        "red",
        "--default-policy",
        "allow",
        "--port",
        "pf0vf0",
        "--vxlan",
        "p0:100:192.0.2.2,198.51.100.0/24",
    ])?;
    let red = svc.dpuctl_json(&["tenant", "get", "red"])?;
    assert_eq!(
        red["attachments"][1]["vxlan"]["underlayPrefixes"][0], "198.51.100.0/24",
        "{red}"
    );
    let vtep_mac = parse_mac(&host_mac_outside(&remote)?);
    let remote_mac = parse_mac(&host_mac(&remote)?);
    let marker = *b"vxlan-mac-unknown-vtep";
    // A broadcast on VNI 100 from outer source `from`, claiming red's
    // host's address and a MAC of its own.
    let vxlan_from = |from: [u8; 4]| {
        let mut inner = eth_header([0xff; 6], [2, 0, 0, 0, 0x66, 0x66], &[], 0x0800);
        inner.extend(ipv4_udp(
            [10, 235, 0, 9],
            [10, 235, 0, 1],
            9999,
            9999,
            &marker,
        ));
        let mut vx = vec![0x08, 0, 0, 0, 0, 0, 100, 0];
        vx.extend(inner);
        let mut f = eth_header(vtep_mac, remote_mac, &[], 0x0800);
        f.extend(ipv4_udp(from, [192, 0, 2, 1], 40000, 4789, &vx));
        f
    };
    // Wait for the tenant to be in the data plane: the remote's frames
    // get through.
    eventually("the configured remote VTEP to reach red's host", || {
        let Ok(l) = Counting::start(&a, &marker, 1) else {
            return false;
        };
        send_frames(&remote, 5, &[vxlan_from([192, 0, 2, 2])]).is_ok()
            && l.count().is_ok_and(|n| n == 5)
    })?;
    let before = dropped(&svc, "unknown_vtep");
    let l = Counting::start(&a, &marker, 2)?;
    send_frames(&remote, 20, &[vxlan_from([192, 0, 2, 3])])?;
    assert_eq!(l.count()?, 0, "a stranger's VXLAN reached red's host");
    eventually("unknown_vtep drops to be counted", || {
        dropped(&svc, "unknown_vtep") >= before + 20
    })?;
    // The configured remote still gets through, and so does a VTEP of
    // the underlay prefix.
    let l = Counting::start(&a, &marker, 2)?;
    send_frames(
        &remote,
        10,
        &[vxlan_from([192, 0, 2, 2]), vxlan_from([198, 51, 100, 5])],
    )?;
    assert_eq!(l.count()?, 20);
    Ok(())
}

/// A MAC flood from one tenant's VM leaves another tenant's stations
/// learned: red sends from 1,000 random source MACs into a table of 256
/// entries; past red's limit its frames are dropped as `mac_limit`, and
/// blue, whose hosts start talking after the flood, still gets its
/// unicast to the one station it is for, not flooded to its third host.
#[test]
fn a_mac_flood_leaves_another_tenants_unicast_unflooded() -> Result<()> {
    let r1 = Host::new("m1", "10.236.0.1/24")?;
    let r2 = Host::new("m2", "10.236.0.2/24")?;
    let b1 = Host::new("m3", "10.236.1.1/24")?;
    let b2 = Host::new("m4", "10.236.1.2/24")?;
    let b3 = Host::new("m5", "10.236.1.3/24")?;
    let mut config = "[dataplane]\nworkers = 1\nidle = \"backoff\"\nmbufs = 4096\n\
                      mac_table_size = 256\nmac_per_tenant = 128\n\
                      mac_per_attachment = 128\nmac_reserved_per_tenant = 64\n"
        .to_string();
    for (id, h) in [
        ("pf0vf0", &r1),
        ("pf0vf1", &r2),
        ("pf0vf2", &b1),
        ("pf0vf3", &b2),
        ("pf0vf4", &b3),
    ] {
        config += &format!(
            "\n[[ports]]\nid = \"{id}\"\nrole = \"vf\"\ndriver = \"kernel\"\ndevice = \"{}\"\n",
            h.port_if
        );
    }
    let svc = Service::start_config(&config, &[])?;
    for (tenant, ports) in [
        ("red", &["pf0vf0", "pf0vf1"][..]),
        ("blue", &["pf0vf2", "pf0vf3", "pf0vf4"][..]),
    ] {
        let mut args = vec!["tenant", "create", tenant, "--default-policy", "allow"];
        for p in ports {
            args.extend(["--port", p]);
        }
        svc.dpuctl_json(&args)?;
    }
    eventually("red's hosts to reach each other", || r1.ping("10.236.0.2"))?;
    // The flood: 1,000 source MACs, broadcast, an experimental EtherType.
    // Random bytes, then the frame's number: no two MACs are the same.
    let mut rng = Rng::new(0x9e37_79b9);
    let flood: Vec<Vec<u8>> = (0..1000u16)
        .map(|i| {
            let [a, b] = (rng.next_u32() as u16).to_be_bytes();
            let [c, d] = i.to_be_bytes();
            let mut f = eth_header([0xff; 6], [2, 0x77, a, b, c, d], &[], 0x88b5);
            f.extend_from_slice(&[0; 46]);
            f
        })
        .collect();
    // Sent in slices of 100 (a burst of 1,000 overflows the packet
    // socket of a loaded kernel port), and sent again, up to five times,
    // until the drops are counted: a frame the kernel loses is sent again;
    // past red's 128 addresses every one is refused each time.
    let before = dropped(&svc, "mac_limit");
    let cut = || dropped(&svc, "mac_limit") >= before + 1000 - 128;
    for _ in 0..5 {
        for slice in flood.chunks(100) {
            send_frames(&r1, 1, slice)?;
        }
        if cut() {
            break;
        }
    }
    eventually("red's flood to be cut at its limit", cut).with_context(|| {
        format!(
            "{} of red's frames refused, at least {} expected",
            dropped(&svc, "mac_limit").saturating_sub(before),
            1000 - 128
        )
    })?;
    // Blue's hosts talk after the flood: learned from blue's reserve.
    eventually("blue's hosts to reach each other", || b1.ping("10.236.1.2"))?;
    let b2_mac = parse_mac(&host_mac(&b2)?);
    let b1_mac = parse_mac(&host_mac(&b1)?);
    let marker = *b"vxlan-mac-blue-unicast";
    let mut unicast = eth_header(b2_mac, b1_mac, &[], 0x0800);
    unicast.extend(ipv4_udp(
        [10, 236, 1, 1],
        [10, 236, 1, 2],
        9999,
        9999,
        &marker,
    ));
    let at_b2 = Counting::start(&b2, &marker, 2)?;
    let at_b3 = Counting::start(&b3, &marker, 2)?;
    send_frames(&b1, 20, &[unicast])?;
    // (All 20, but for what a loaded kernel may lose on the way.)
    let arrived = at_b2.count()?;
    assert!(
        arrived >= 15,
        "blue's unicast did not arrive: {arrived} of 20"
    );
    assert_eq!(at_b3.count()?, 0, "blue's unicast was flooded");
    // Red's own known hosts still talk.
    assert!(r1.ping("10.236.0.2"));
    Ok(())
}

/// On a guarded attachment (source MAC and IP), frames whose IPv4 is
/// behind stacked tags (QinQ 0x88a8 over 802.1Q, two 802.1Q tags) carry
/// a spoofed source the guard cannot see: they are dropped as
/// `encapsulated`; once the guard is removed the same frames pass.
#[test]
fn stacked_tags_with_a_spoofed_source_are_dropped_on_a_guarded_attachment() -> Result<()> {
    let vm = Host::new("q1", "10.237.0.1/24")?;
    let peer = Host::new("q2", "10.237.0.2/24")?;
    let mut config = "[dataplane]\nworkers = 1\nidle = \"backoff\"\nmbufs = 4096\n".to_string();
    for (id, h) in [("pf0vf0", &vm), ("pf0vf1", &peer)] {
        config += &format!(
            "\n[[ports]]\nid = \"{id}\"\nrole = \"vf\"\ndriver = \"kernel\"\ndevice = \"{}\"\n",
            h.port_if
        );
    }
    let svc = Service::start_config(&config, &[])?;
    let mac = host_mac(&vm)?;
    let guarded = format!("pf0vf0,mac={mac},ip=10.237.0.1/32");
    allow_tenant(&svc, "violet", &[&guarded, "pf0vf1"])?;
    eventually("the guarded host to reach its peer", || {
        vm.ping("10.237.0.2")
    })?;
    let vm_mac = parse_mac(&mac);
    let peer_mac = parse_mac(&host_mac(&peer)?);
    let marker = *b"vxlan-mac-stacked-tags";
    let spoofed = ipv4_udp([10, 237, 0, 66], [10, 237, 0, 2], 9999, 9999, &marker);
    let frames: Vec<Vec<u8>> = [
        &[(0x88a8, 5), (0x8100, 6)][..],
        &[(0x8100, 5), (0x8100, 6)][..],
    ]
    .iter()
    .map(|tags| {
        let mut f = eth_header(peer_mac, vm_mac, tags, 0x0800);
        f.extend_from_slice(&spoofed);
        f
    })
    .collect();
    let before = dropped(&svc, "encapsulated");
    let l = Counting::start(&peer, &marker, 2)?;
    send_frames(&vm, 10, &frames)?;
    assert_eq!(
        l.count()?,
        0,
        "a spoofed source behind stacked tags got through"
    );
    eventually("encapsulated drops to be counted", || {
        dropped(&svc, "encapsulated") >= before + 20
    })?;
    // Without the guard, the switch passes them as it did: the frames
    // themselves were deliverable.
    svc.dpuctl_json(&[
        "tenant", "update", "violet", "--port", "pf0vf0", "--port", "pf0vf1",
    ])?;
    eventually("the unguarded attachment to pass stacked tags", || {
        let Ok(l) = Counting::start(&peer, &marker, 1) else {
            return false;
        };
        send_frames(&vm, 5, &frames).is_ok() && l.count().is_ok_and(|n| n == 10)
    })?;
    Ok(())
}

/// Binds UDP ADDR to each port of the comma-separated PORTS and prints,
/// after 4 s, the ports that received a datagram.
const UDP_RECV_MANY: &str = r#"
import select, socket, sys, time
socks = {}
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
for p in sys.argv[2].split(","):
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.bind((sys.argv[1], int(p)))
    socks[s] = int(p)
print("ready", flush=True)
got = set()
end = time.time() + 4
while time.time() < end:
    r, _, _ = select.select(list(socks), [], [], 0.2)
    for s in r:
        s.recv(2048)
        got.add(socks[s])
print(",".join(str(p) for p in sorted(got)), flush=True)
"#;

/// Sends a datagram to ADDR on each port of PORTS, five rounds half a
/// second apart.
const UDP_SEND_MANY: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(5):
    for p in sys.argv[2].split(","):
        s.sendto(b"n", (sys.argv[1], int(p)))
    time.sleep(0.5)
"#;

/// A tenant's API client may write the rule set that is hardest to
/// compile: 30,000 rules in nested destination-port ranges, the narrowest
/// first, so that each port's rules differ from its neighbours' and
/// classes of ports hold thousands of rules each. Compiled without
/// bounds, that took 81 s and 11 GB; the service takes it with its peak
/// memory grown by less than 512 MiB, and filters by it: each datagram
/// gets the verdict of the first rule covering its port. Then rules
/// nested in one field and staggered in another, over IPv4 and IPv6.
#[test]
fn nested_port_ranges_compile_within_bounds_and_filter_right() -> Result<()> {
    let _serial = one_at_a_time();
    let a = Host::new("n", "10.238.0.1/24")?;
    let b = Host::new("o", "10.238.0.2/24")?;
    let svc = Service::start_config(&config("nest", &[("pf0vf0", &a), ("pf0vf1", &b)]), &[])?;
    allow_tenant(&svc, "teal", &["pf0vf0", "pf0vf1"])?;
    eventually("ping to cross", || a.ping("10.238.0.2"))?;
    let pid = svc.pid().ok_or_else(|| anyhow::anyhow!("no service pid"))?;
    let (before, _) = rss_kib(pid)?;

    // Rule p covers ports n - p ..= 35,535 + p; even rules allow, odd
    // ones deny.
    let n: u32 = 30_000;
    let rules: Vec<serde_json::Value> = (0..n)
        .map(|p| {
            serde_json::json!({
                "priority": p,
                "srcPrefix": "10.238.0.0/24",
                "ipProtocol": 17,
                "dstPorts": {"first": n - p, "last": 35_535 + p},
                "action": if p.is_multiple_of(2) { "RULE_ACTION_ALLOW" } else { "RULE_ACTION_DENY" },
            })
        })
        .collect();
    let dir = tempfile::tempdir()?;
    replace_rules(&svc, dir.path(), &rules, "nested", pid, before)?;

    // The first rule covering port x is the least p with n - p <= x and
    // x <= 35,535 + p; past the last rule, the default allows.
    let allowed = |x: u32| {
        let p = (n.saturating_sub(x)).max(x.saturating_sub(35_535));
        p >= n || p.is_multiple_of(2)
    };
    let ports: Vec<u32> = vec![
        1, 2, 3, 999, 1000, 12_345, 12_346, 29_999, 30_000, 30_001, 33_000, 35_535, 35_536, 35_537,
        50_000, 50_001, 65_534, 65_535,
    ];
    let list = ports
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let got = udp_deliveries(&a, &b, UDP_SEND_MANY, &list, &list)?;
    let want: Vec<u32> = ports.iter().copied().filter(|&x| allowed(x)).collect();
    assert!(want.len() > 4 && want.len() < ports.len() - 4, "{want:?}");
    assert_eq!(got, want, "ports that received a datagram");

    // Then as many rules nested in one field and staggered in another:
    // rule p covers source ports n - p ..= 35,535 + p and destination
    // ports p + 1 ..= p + 20,000. No rule covers a slice of either
    // field, so the trees keep leaves of thousands of rules, which the
    // classifier indexes instead of scanning on the worker.
    let wide: u32 = 20_000;
    let rules = nested_and_staggered(n, wide, |_| "10.238.0.0/24".to_string());
    replace_rules(
        &svc,
        dir.path(),
        &rules,
        "nested and staggered",
        pid,
        before,
    )?;
    // The first rule covering (s, d): the least p that both bounds allow.
    let allowed = |s: u32, d: u32| {
        let p = (n.saturating_sub(s))
            .max(s.saturating_sub(35_535))
            .max(d.saturating_sub(wide));
        p >= n || p >= d || p.is_multiple_of(2)
    };
    let pairs: Vec<(u32, u32)> = vec![
        (29_000, 2_000),
        (29_001, 2_001),
        (12_345, 21_000),
        (12_346, 21_001),
        (35_535, 40),
        (40_000, 4_500),
        (40_001, 4_501),
        (50_000, 30_000),
        (50_001, 30_001),
        (65_000, 45_000),
        (1_000, 5_000),
        (64_000, 49_000),
        (30_000, 1),
        (30_001, 20_001),
    ];
    let list = pairs
        .iter()
        .map(|(s, d)| format!("{s}:{d}"))
        .collect::<Vec<_>>()
        .join(",");
    let dsts = pairs
        .iter()
        .map(|(_, d)| d.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let got = udp_deliveries(&a, &b, UDP_SEND_FROM, &list, &dsts)?;
    let mut want: Vec<u32> = pairs
        .iter()
        .filter(|&&(s, d)| allowed(s, d))
        .map(|&(_, d)| d)
        .collect();
    want.sort_unstable();
    assert!(want.len() > 3 && want.len() < pairs.len() - 3, "{want:?}");
    assert_eq!(got, want, "destination ports that received a datagram");

    // The same shape over IPv6, each rule's source prefix one of 64
    // lengths (/64 to /127, all holding host a's address), so IPv6 keys
    // walk trees cut across the address's 32-bit words down to leaves of
    // thousands of rules.
    for (h, addr) in [(&a, "fd00:238::1/64"), (&b, "fd00:238::2/64")] {
        let dev = h.ns.exec(&["ip", "-o", "link", "show", "type", "veth"])?;
        let dev = String::from_utf8_lossy(&dev.stdout)
            .split(':')
            .nth(1)
            .map(|d| d.trim().split('@').next().unwrap_or_default().to_string())
            .context("the host's veth")?;
        let out =
            h.ns.exec(&["ip", "addr", "add", addr, "dev", &dev, "nodad"])?;
        ensure!(out.status.success(), "ip addr add {addr}: {out:?}");
    }
    let rules = nested_and_staggered(n, wide, |p| format!("fd00:238::/{}", 64 + p % 64));
    replace_rules(
        &svc,
        dir.path(),
        &rules,
        "IPv6 nested and staggered",
        pid,
        before,
    )?;
    eventually("IPv6 ping to cross", || a.ping("fd00:238::2"))?;
    let got = udp_deliveries_to(&a, &b, "fd00:238::2", UDP_SEND_FROM, &list, &dsts)?;
    assert_eq!(
        got, want,
        "destination ports that received an IPv6 datagram"
    );
    Ok(())
}

/// `n` UDP rules, rule p from source prefix `src(p)`, covering source
/// ports n - p ..= 35,535 + p and destination ports p + 1 ..= p + `wide`;
/// even rules allow, odd ones deny.
fn nested_and_staggered(n: u32, wide: u32, src: impl Fn(u32) -> String) -> Vec<serde_json::Value> {
    (0..n)
        .map(|p| {
            serde_json::json!({
                "priority": p,
                "srcPrefix": src(p),
                "ipProtocol": 17,
                "srcPorts": {"first": n - p, "last": 35_535 + p},
                "dstPorts": {"first": p + 1, "last": p + wide},
                "action": if p.is_multiple_of(2) { "RULE_ACTION_ALLOW" } else { "RULE_ACTION_DENY" },
            })
        })
        .collect()
}

/// Replaces tenant `teal`'s rules with `rules` through `dpuctl`, and
/// checks that the service's peak memory (`pid`, `before` KiB at the
/// start) grew by less than 512 MiB.
fn replace_rules(
    svc: &Service,
    dir: &std::path::Path,
    rules: &[serde_json::Value],
    what: &str,
    pid: u32,
    before: u64,
) -> Result<()> {
    let file = dir.join("rules.json");
    std::fs::write(&file, serde_json::to_vec(rules)?)?;
    let started = std::time::Instant::now();
    svc.dpuctl_json(&[
        "rule",
        "replace",
        "teal",
        "--file",
        &file.display().to_string(),
    ])?;
    let grown = rss_kib(pid)?.0.saturating_sub(before) / 1024;
    eprintln!(
        "{} {what} rules applied in {:?}, peak RSS {grown} MiB more",
        rules.len(),
        started.elapsed()
    );
    assert!(grown < 512, "peak RSS grew by {grown} MiB");
    Ok(())
}

/// Runs `send` on `a` with `list` while `b` listens on the ports `dsts`
/// at 10.238.0.2: the ports that received a datagram, ascending.
fn udp_deliveries(a: &Host, b: &Host, send: &str, list: &str, dsts: &str) -> Result<Vec<u32>> {
    udp_deliveries_to(a, b, "10.238.0.2", send, list, dsts)
}

/// [`udp_deliveries`] to `b`'s address `to` (IPv4 or IPv6).
fn udp_deliveries_to(
    a: &Host,
    b: &Host,
    to: &str,
    send: &str,
    list: &str,
    dsts: &str,
) -> Result<Vec<u32>> {
    let mut listen = b.spawn_python_out(UDP_RECV_MANY, &[to, dsts])?;
    let mut out = std::io::BufReader::new(listen.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line)?;
    assert_eq!(line.trim(), "ready");
    let sent = a.python(send, &[to, list]);
    assert!(sent.status.success(), "{sent:?}");
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line)?;
    let _ = listen.wait();
    Ok(line
        .trim()
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| p.parse())
        .collect::<Result<_, _>>()?)
}

/// Sends a datagram from each source port to each destination port of
/// PAIRS (`src:dst,...`) at ADDR, five rounds half a second apart.
const UDP_SEND_FROM: &str = r#"
import socket, sys, time
socks = []
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
for pair in sys.argv[2].split(","):
    src, dst = (int(x) for x in pair.split(":"))
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", src))
    socks.append((s, dst))
for _ in range(5):
    for s, dst in socks:
        s.sendto(b"n", (sys.argv[1], dst))
    time.sleep(0.5)
"#;
