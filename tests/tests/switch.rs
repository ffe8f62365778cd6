//! The per-tenant switch through the real binary: network namespaces play
//! tenant hosts, each joined by a veth pair to a DPDK `net_af_packet` port
//! the service opens from its configuration. Tenants and rules are made
//! with dpuctl; ping shows what crosses the switch, and the counters move
//! in gRPC telemetry and on `/metrics`. Needs root (namespaces, raw
//! sockets); everything created is removed on exit.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use dpu_e2e::Service;

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        bail!("ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// A namespace holding one end of a veth pair; the other end, `port_if`,
/// stays in the root namespace for the service. Removed on drop.
struct Host {
    ns: String,
    port_if: String,
}

impl Host {
    fn new(tag: &str, addr: &str) -> Result<Host> {
        let id = std::process::id();
        let h = Host {
            ns: format!("sw{tag}{id}"),
            port_if: format!("sw{tag}{id}"),
        };
        let peer = format!("{}p", h.port_if);
        ip(&["netns", "add", &h.ns])?;
        ip(&[
            "link", "add", &h.port_if, "type", "veth", "peer", "name", &peer,
        ])?;
        ip(&["link", "set", &peer, "netns", &h.ns])?;
        ip(&["link", "set", &h.port_if, "up"])?;
        ip(&["-n", &h.ns, "addr", "add", addr, "dev", &peer])?;
        ip(&["-n", &h.ns, "link", "set", &peer, "up"])?;
        ip(&["-n", &h.ns, "link", "set", "lo", "up"])?;
        Ok(h)
    }

    /// True if two pings to `to` both get replies.
    fn ping(&self, to: &str) -> bool {
        Command::new("ip")
            .args([
                "netns", "exec", &self.ns, "ping", "-c", "2", "-i", "0.2", "-W", "1", to,
            ])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.port_if])
            .output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

fn config(hosts: &[(&str, &Host)]) -> String {
    let mut c = format!(
        r#"
[log]
level = "info"

[dataplane]
workers = 1
idle = "backoff"
lcores = "0"
no_huge = true
memory_mb = 256
mbufs = 4095
file_prefix = "e2e-switch-{}"
"#,
        std::process::id()
    );
    for (i, (id, h)) in hosts.iter().enumerate() {
        c += &format!(
            "\n[[ports]]\nid = \"{id}\"\nrole = \"vf\"\ndriver = \"dpdk\"\ndevice = \"net_af_packet{i},iface={}\"\n",
            h.port_if
        );
    }
    c
}

/// Polls `check` for up to 10 s.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn metric(body: &str, name_and_labels: &str) -> u64 {
    body.lines()
        .find(|l| l.starts_with(name_and_labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn tenants_reach_their_own_hosts_only_and_rules_apply_at_once() -> Result<()> {
    let a1 = Host::new("a", "10.230.0.1/24")?;
    let a2 = Host::new("b", "10.230.0.2/24")?;
    let b1 = Host::new("c", "10.230.0.3/24")?;
    let svc = Service::start_config(
        &config(&[("pf0vf0", &a1), ("pf0vf1", &a2), ("pf0vf2", &b1)]),
        &[],
    )?;

    let info = svc.dpuctl_json(&["info"])?;
    assert_eq!(info["dataplaneDriver"], "dpdk", "{info}");

    // No tenant yet: nothing crosses.
    assert!(!a1.ping("10.230.0.2"));

    svc.dpuctl_json(&[
        "tenant",
        "create",
        "red",
        "--default-policy",
        "allow",
        "--port",
        "pf0vf0",
        "--port",
        "pf0vf1",
    ])?;
    svc.dpuctl_json(&[
        "tenant",
        "create",
        "blue",
        "--default-policy",
        "allow",
        "--port",
        "pf0vf2",
    ])?;
    eventually("red hosts to reach each other", || a1.ping("10.230.0.2"));
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
    eventually("ICMP to pass again", || a1.ping("10.230.0.2"));

    // Ports: status and counters through gRPC and /metrics.
    let ports = svc.dpuctl_json(&["port", "list"])?;
    let text = ports.to_string();
    assert!(text.contains("pf0vf0") && text.contains("pf0vf2"), "{text}");
    let (status, body) = svc.http_get("/metrics")?;
    assert!(status.contains("200"), "{status}");
    let rx = metric(&body, "dpu_port_rx_packets_total{port=\"pf0vf0\"}");
    let tx = metric(&body, "dpu_port_tx_packets_total{port=\"pf0vf1\"}");
    assert!(
        rx >= 6 && tx >= 6,
        "port counters: rx {rx}, tx {tx}\n{body}"
    );
    assert_eq!(
        metric(&body, "dpu_port_link_up{port=\"pf0vf0\"}"),
        1,
        "{body}"
    );
    Ok(())
}
