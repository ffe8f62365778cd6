//! The development configuration (`config/dev.toml`) through the real
//! binary, as the README's run command starts it: four TAP ports named like
//! a BlueField's (DPDK `net_tap`) and the seeded tenant "demo" with its
//! rules. Two of the TAP interfaces move into network namespaces, as in
//! the walkthrough in docs/tour.md, and ping crosses the switch where the rules
//! allow it and not where they deny it; a host of the tenant reaches the
//! tenant's storage endpoint (ping, discovery, I/O with `nvmf-perf`).
//!
//! Only the names other tests (or a running development service) could
//! clash on are changed: ports, interface names, EAL's file prefix and the
//! state directory. Needs root (TAP interfaces, namespaces); skipped with a
//! message otherwise. Everything created is removed on exit.

use std::os::unix::fs::MetadataExt;

use anyhow::{ensure, Context, Result};
use dpu_e2e::net::{eventually, ip, Netns};
use dpu_e2e::{free_port, repo_root, Service};
use serde_json::Value;

/// Why this test cannot run here, if it cannot.
fn missing_privilege() -> Option<&'static str> {
    if std::fs::metadata("/proc/self").map(|m| m.uid()).ok() != Some(0) {
        return Some("not root");
    }
    // CAP_NET_ADMIN (12) for TAP interfaces, CAP_SYS_ADMIN (21) for
    // namespaces: root in a container may lack them.
    let caps = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok()
        })
        .unwrap_or(0);
    if caps & (1 << 12) == 0 || caps & (1 << 21) == 0 {
        return Some("root lacking CAP_NET_ADMIN or CAP_SYS_ADMIN");
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("no /dev/net/tun");
    }
    None
}

/// EAL's runtime directory of file prefix `prefix`, removed on drop (once
/// the service that used it has stopped).
struct EalFiles(std::path::PathBuf);

impl Drop for EalFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Replaces `from` with `to` in `text`, failing if `from` is absent: the
/// test follows dev.toml, and must notice when dev.toml changes shape.
fn swap(text: &str, from: &str, to: &str) -> Result<String> {
    ensure!(text.contains(from), "dev.toml no longer contains {from:?}");
    Ok(text.replace(from, to))
}

/// dev.toml with this run's interface names (`ifs`, for p0 and
/// pf0vf0..pf0vf2), EAL file prefix and NVMe/TCP ports, and a small RAM
/// disk; tenants, rules and everything else as shipped.
fn dev_config(ifs: &[String; 4]) -> Result<String> {
    let mut c = std::fs::read_to_string(repo_root().join("dpu-service/daemon/config/dev.toml"))
        .context("reading dev.toml")?;
    for (i, (port, name)) in ["p0", "pf0vf0", "pf0vf1", "pf0vf2"]
        .iter()
        .zip(ifs)
        .enumerate()
    {
        c = swap(
            &c,
            &format!("\"net_tap{i},iface={port}\""),
            &format!("\"net_tap{i},iface={name}\""),
        )?;
    }
    c = swap(
        &c,
        "file_prefix = \"dpu-service-dev\"",
        &format!("file_prefix = \"{}\"", eal_prefix()),
    )?;
    c = swap(
        &c,
        "discovery_listen = \"127.0.0.1:8009\"",
        &format!("discovery_listen = \"127.0.0.1:{}\"", free_port()),
    )?;
    // The service's own listener moves; the demo tenant's endpoint is
    // in namespaces of its own and keeps 4420.
    c = swap(
        &c,
        "address = \"127.0.0.1\"\nport = 4420",
        &format!("address = \"127.0.0.1\"\nport = {}", free_port()),
    )?;
    swap(&c, "ram = \"256MiB\"", "ram = \"16MiB\"")
}

/// This run's EAL file prefix.
fn eal_prefix() -> String {
    format!("e2e-dev-{}", std::process::id())
}

/// A uint64 of proto3 JSON (a string), or 0.
fn num(v: &Value) -> u64 {
    v.as_str()
        .and_then(|p| p.parse().ok())
        .or(v.as_u64())
        .unwrap_or(0)
}

/// The items of `v[list]`, or of `v` if it is an array (dpuctl prints a
/// list command's items, every page, as one array).
fn items<'a>(v: &'a Value, list: &str) -> impl Iterator<Item = &'a Value> {
    v.as_array()
        .or_else(|| v[list].as_array())
        .into_iter()
        .flatten()
}

/// The entry of `v[list]` (or of `v`) whose `key` is `name`, or null.
fn entry(v: &Value, list: &str, key: &str, name: &str) -> Value {
    items(v, list)
        .find(|e| e[key] == name)
        .cloned()
        .unwrap_or_default()
}

#[test]
fn dev_config_switches_between_tap_ports_in_namespaces() -> Result<()> {
    if let Some(why) = missing_privilege() {
        eprintln!("skipping dev_config: {why} (TAP interfaces and network namespaces need root)");
        return Ok(());
    }
    let id = std::process::id();
    let ifs = ["u", "v0", "v1", "v2"].map(|s| format!("dv{id}{s}"));
    // Declared before the service, so dropped after it: the TAP interfaces
    // go with the service's process, then EAL's files and the namespaces.
    let mut a = Netns::new(format!("dva{id}"))?;
    let mut b = Netns::new(format!("dvb{id}"))?;
    let _eal = EalFiles(std::path::Path::new("/var/run/dpdk").join(eal_prefix()));
    let svc = Service::start_config(&dev_config(&ifs)?, &[])?;

    let info = svc.dpuctl_json(&["info"])?;
    assert_eq!(info["dataplaneDriver"], "dpdk", "{info}");
    for dev in &ifs {
        ip(&["link", "show", "dev", dev]).with_context(|| {
            format!(
                "the TAP interface {dev} is missing; log:\n{}",
                svc.log_text()
            )
        })?;
    }

    // The seeded tenant and its rules, as dpuctl lists them.
    let tenants = svc.dpuctl_json(&["tenant", "list"])?;
    let demo = entry(&tenants, "tenants", "name", "tenants/demo");
    assert_eq!(demo["displayName"], "Demo tenant", "{tenants}");
    assert_eq!(demo["defaultPolicy"], "DEFAULT_POLICY_DENY", "{demo}");
    assert_eq!(demo["ruleCount"], 4, "{demo}");
    let ports: Vec<&str> = demo["attachments"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["port"]["port"].as_str())
        .collect();
    assert_eq!(ports, ["ports/pf0vf0", "ports/pf0vf1"], "{demo}");
    let rules = svc.dpuctl_json(&["rule", "list", "demo"])?;
    let names: Vec<&str> = items(&rules, "rules")
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "tenants/demo/rules/quarantine",
            "tenants/demo/rules/ping",
            "tenants/demo/rules/web",
            "tenants/demo/rules/storage"
        ],
        "{rules}"
    );
    let ping = entry(&rules, "rules", "name", "tenants/demo/rules/ping");
    assert_eq!(ping["srcPrefix"], "10.20.0.0/24", "{ping}");
    assert_eq!(ping["stateful"], true, "{ping}");
    assert_eq!(ping["action"], "RULE_ACTION_ALLOW", "{ping}");

    // The walkthrough in docs/tour.md: pf0vf0 and pf0vf1 into namespaces.
    a.take(&ifs[1], &["10.20.0.1/24"])?;
    b.take(&ifs[2], &["10.20.0.2/24", "10.20.0.130/24"])?;
    eventually("a ping across the switch", || a.ping("10.20.0.2"))?;
    assert!(b.ping("10.20.0.1"), "the ping rule allows either way");
    // 10.20.0.130 is in the quarantined 10.20.0.128/25.
    assert!(
        !a.ping("10.20.0.130"),
        "the quarantine rule let ICMP through"
    );

    // The demo tenant's storage endpoint, as docs/tour.md uses it:
    // ping, discovery and I/O with nvmf-perf from a host of the tenant.
    eventually("a ping to the storage endpoint", || a.ping("10.20.0.100"))?;
    let perf = dpu_e2e::binary("nvmf-perf")?;
    let perf = perf.to_string_lossy();
    let out = a.exec(&[&perf, "--addr", "10.20.0.100:4420", "--discover"])?;
    let log = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success()
            && log.trim() == "10.20.0.100 4420 nqn.2024-01.io.dpu-service:demo-vol",
        "discovery at the endpoint: {log} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = a.exec(&[
        &perf,
        "--addr",
        "10.20.0.100:4420",
        "--nqn",
        "nqn.2024-01.io.dpu-service:demo-vol",
        "--time",
        "0.5",
        "--job",
        "randwrite:4k:8",
        "--job",
        "randread:4k:8",
    ])?;
    ensure!(
        out.status.success(),
        "I/O at the endpoint: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let c = svc.dpuctl_json(&["counters", "--tenant", "demo"])?;
    let quarantine = entry(&c, "rules", "rule", "tenants/demo/rules/quarantine");
    assert!(num(&quarantine["packets"]) >= 2, "quarantine counters: {c}");
    let ping = entry(&c, "rules", "rule", "tenants/demo/rules/ping");
    // A connection's first packet hits the rule, the rest its tracked
    // connection: one hit per direction pinged.
    assert!(num(&ping["packets"]) >= 2, "ping counters: {c}");
    let tenant = entry(&c, "tenants", "tenant", "tenants/demo");
    assert!(
        num(&tenant["forwardedPackets"]) >= 8 && num(&tenant["droppedPackets"]) >= 2,
        "tenant counters: {c}"
    );
    let (status, body) = svc.http_get("/metrics")?;
    assert!(status.contains("200"), "{status}");
    assert!(
        body.lines().any(|l| l
            .starts_with("dpu_rule_packets_total{tenant=\"demo\",rule=\"quarantine\"}")
            && !l.ends_with(" 0")),
        "rule counter on /metrics:\n{body}"
    );
    assert!(
        body.contains("dpu_tenant_forwarded_packets_total{tenant=\"demo\"}"),
        "tenant counter on /metrics:\n{body}"
    );
    Ok(())
}
