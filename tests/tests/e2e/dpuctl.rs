//! `dpuctl` against the real service: the objects a user creates come back,
//! bad requests get the documented exit codes, state survives restarts.

use anyhow::Result;
use dpu_e2e::{free_port, Service};
use serde_json::Value;

fn code(svc: &Service, args: &[&str]) -> (i32, String) {
    let out = svc.dpuctl(args).expect("dpuctl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Creates tenants, rules and storage objects; answers the port of the
/// NVMe/TCP listener (a free one: the listener call returns once the
/// service listens, and fails if it cannot).
fn populate(svc: &Service) -> Result<u16> {
    svc.dpuctl_json(&[
        "tenant",
        "create",
        "blue",
        "--display-name",
        "Blue team",
        "--default-policy",
        "deny",
        "--port",
        "pf0vf0",
        "--port",
        "p0.100",
    ])?;
    svc.dpuctl_json(&["tenant", "create", "green", "--vxlan", "p0:5001"])?;
    svc.dpuctl_json(&[
        "rule",
        "add",
        "blue",
        "--id",
        "web",
        "--priority",
        "10",
        "--action",
        "allow",
        "--proto",
        "tcp",
        "--dst",
        "10.1.0.0/16",
        "--dport",
        "80-443",
        "--stateful",
    ])?;
    svc.dpuctl_json(&[
        "rule",
        "add",
        "blue",
        "--priority",
        "20",
        "--action",
        "allow",
        "--proto",
        "icmp",
        "--icmp-type",
        "8",
    ])?;
    svc.dpuctl_json(&[
        "rule",
        "add",
        "blue",
        "--priority",
        "30",
        "--action",
        "deny",
        "--src",
        "2001:db8::/32",
    ])?;
    svc.dpuctl_json(&[
        "subsystem",
        "create",
        "vol",
        "--nqn",
        "nqn.2024-01.io.example:vol",
        "--host",
        "nqn.2024-01.io.example:host-a",
    ])?;
    svc.dpuctl_json(&["namespace", "create", "vol", "--ram", "64M"])?;
    svc.dpuctl_json(&[
        "namespace",
        "create",
        "vol",
        "--nsid",
        "5",
        "--ram",
        "1M",
        "--block-size",
        "4096",
    ])?;
    let port = free_port();
    svc.dpuctl_json(&[
        "listener",
        "create",
        "vol",
        "--address",
        "127.0.0.1",
        "--port",
        &port.to_string(),
    ])?;
    Ok(port)
}

/// Everything `dpuctl` can list, as one JSON value.
fn everything(svc: &Service) -> Result<Value> {
    Ok(serde_json::json!({
        "tenants": svc.dpuctl_json(&["tenant", "list"])?,
        "rules": svc.dpuctl_json(&["rule", "list", "blue"])?,
        "ports": svc.dpuctl_json(&["port", "list"])?,
        "subsystems": svc.dpuctl_json(&["subsystem", "list"])?,
        "namespaces": svc.dpuctl_json(&["namespace", "list", "vol"])?,
        "listeners": svc.dpuctl_json(&["listener", "list", "vol"])?,
    }))
}

#[test]
fn objects_created_with_dpuctl_come_back() -> Result<()> {
    let svc = Service::start()?;
    let port = populate(&svc)?;
    let all = everything(&svc)?;

    let tenants = all["tenants"].as_array().unwrap();
    assert_eq!(tenants.len(), 2);
    assert_eq!(tenants[0]["name"], "tenants/blue");
    assert_eq!(tenants[0]["displayName"], "Blue team");
    assert_eq!(tenants[0]["defaultPolicy"], "DEFAULT_POLICY_DENY");
    assert_eq!(tenants[0]["ruleCount"], 3);
    assert_eq!(tenants[1]["attachments"][0]["vxlan"]["vni"], 5001);

    let rules = all["rules"].as_array().unwrap();
    let prios: Vec<u64> = rules
        .iter()
        .map(|r| r["priority"].as_u64().unwrap())
        .collect();
    assert_eq!(prios, [10, 20, 30]);
    assert_eq!(rules[0]["name"], "tenants/blue/rules/web");
    assert_eq!(rules[0]["dstPorts"]["first"], 80);
    assert_eq!(rules[0]["dstPorts"]["last"], 443);
    assert_eq!(rules[0]["ipProtocol"], 6);
    assert_eq!(rules[0]["stateful"], true);
    assert_eq!(rules[1]["icmpType"], 8);
    assert_eq!(rules[2]["action"], "RULE_ACTION_DENY");

    let p0 = all["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "ports/p0")
        .unwrap()
        .clone();
    let bindings = p0["bindings"].as_array().unwrap();
    assert_eq!(bindings.len(), 2, "{p0}");

    let ss = &all["subsystems"][0];
    assert_eq!(ss["nqn"], "nqn.2024-01.io.example:vol");
    assert_eq!(ss["allowedHosts"][0], "nqn.2024-01.io.example:host-a");
    assert_eq!(ss["namespaceCount"], 2);
    let ns = all["namespaces"].as_array().unwrap();
    assert_eq!(ns[0]["nsid"], 1);
    assert_eq!(ns[0]["ram"]["sizeBytes"], (64u64 << 20).to_string());
    assert_eq!(ns[1]["nsid"], 5);
    assert_eq!(ns[1]["blockSize"], 4096);
    assert_eq!(all["listeners"][0]["port"], port);

    // Table output is for people: a header and one row per item.
    let out = svc.dpuctl(&["rule", "list", "blue"])?;
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout)?;
    assert!(text.lines().count() >= 4, "{text}");
    assert!(text.contains("10.1.0.0/16"), "{text}");
    Ok(())
}

#[test]
fn bad_requests_get_clear_errors_and_exit_codes() -> Result<()> {
    let svc = Service::start()?;
    populate(&svc)?;

    let (c, err) = code(&svc, &["tenant", "create", "Bad_ID"]);
    assert_eq!(c, 5, "{err}");
    assert!(err.contains("tenant_id"), "{err}");

    let (c, err) = code(&svc, &["tenant", "get", "nobody"]);
    assert_eq!(c, 3, "{err}");
    assert!(err.contains("tenants/nobody"), "{err}");

    let (c, err) = code(&svc, &["tenant", "create", "blue"]);
    assert_eq!(c, 4, "{err}");

    // Another tenant cannot take traffic that blue owns.
    let (c, err) = code(&svc, &["tenant", "create", "red", "--port", "pf0vf0"]);
    assert_eq!(c, 4, "{err}");
    let (c, err) = code(&svc, &["tenant", "create", "red", "--port", "nope"]);
    assert_eq!(c, 3, "{err}");

    let (c, err) = code(
        &svc,
        &[
            "rule",
            "add",
            "blue",
            "--priority",
            "40",
            "--action",
            "allow",
            "--dst",
            "10.0.0.1/8",
        ],
    );
    assert_eq!(c, 5, "{err}");
    assert!(
        err.contains("rule.dst_prefix") && err.contains("10.0.0.0/8"),
        "{err}"
    );

    let (c, err) = code(
        &svc,
        &[
            "rule",
            "add",
            "blue",
            "--priority",
            "41",
            "--action",
            "allow",
            "--dport",
            "80",
        ],
    );
    assert_eq!(c, 5, "{err}");
    assert!(err.contains("rule.dst_ports"), "{err}");

    let (c, err) = code(
        &svc,
        &[
            "rule",
            "add",
            "blue",
            "--priority",
            "10",
            "--action",
            "deny",
        ],
    );
    assert_eq!(c, 4, "{err}");
    assert!(err.contains("priority 10"), "{err}");

    // Optimistic concurrency: a stale version is refused and changes nothing.
    let (c, err) = code(
        &svc,
        &[
            "rule",
            "add",
            "blue",
            "--priority",
            "50",
            "--action",
            "deny",
            "--expect-version",
            "1",
        ],
    );
    assert_eq!(c, 6, "{err}");
    assert!(err.contains("version 3"), "{err}");
    assert_eq!(
        svc.dpuctl_json(&["rule", "list", "blue"])?
            .as_array()
            .unwrap()
            .len(),
        3
    );
    svc.dpuctl_json(&[
        "rule",
        "add",
        "blue",
        "--priority",
        "50",
        "--action",
        "deny",
        "--expect-version",
        "3",
    ])?;

    let (c, err) = code(&svc, &["tenant", "delete", "blue"]);
    assert_eq!(c, 6, "{err}");

    let (c, err) = code(&svc, &["subsystem", "create", "x", "--nqn", "not-an-nqn"]);
    assert_eq!(c, 5, "{err}");
    assert!(err.contains("subsystem.nqn"), "{err}");
    let (c, err) = code(&svc, &["namespace", "create", "vol", "--ram", "1000"]);
    assert_eq!(c, 5, "{err}");
    assert!(err.contains("namespace.ram.size_bytes"), "{err}");
    let (c, err) = code(&svc, &["namespace", "create", "vol", "--ram", "1G"]);
    assert_eq!(c, 6, "RAM beyond storage.ram_limit: {err}");

    // Usage errors are the CLI's own.
    let (c, _) = code(&svc, &["tenant", "frobnicate"]);
    assert_eq!(c, 2);

    // Nothing above changed what was there.
    assert_eq!(
        svc.dpuctl_json(&["tenant", "list"])?
            .as_array()
            .unwrap()
            .len(),
        2
    );
    Ok(())
}

#[test]
fn unreachable_service_is_exit_code_7() -> Result<()> {
    let out = std::process::Command::new(dpu_e2e::binary("dpuctl")?)
        .args([
            "--endpoint",
            &format!("http://127.0.0.1:{}", dpu_e2e::free_port()),
            "--timeout",
            "2",
            "tenant",
            "list",
        ])
        .output()?;
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn state_survives_restart_and_kill_9() -> Result<()> {
    let mut svc = Service::start()?;
    populate(&svc)?;
    let before = everything(&svc)?;

    let status = svc.restart()?;
    assert!(status.success(), "SIGTERM shutdown exits 0, got {status}");
    assert!(svc.log_text().contains("stopped"));
    assert_eq!(everything(&svc)?, before);

    svc.dpuctl_json(&["rule", "delete", "blue", "web"])?;
    svc.dpuctl_json(&[
        "subsystem",
        "add-host",
        "vol",
        "nqn.2024-01.io.example:host-b",
    ])?;
    let after_changes = everything(&svc)?;
    svc.crash_and_restart()?;
    assert_eq!(everything(&svc)?, after_changes);
    Ok(())
}

#[test]
fn replace_rules_from_a_file() -> Result<()> {
    let svc = Service::start()?;
    populate(&svc)?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("rules.json");
    let rules: Vec<Value> = (0..2000)
        .map(|i| {
            serde_json::json!({
                "priority": i,
                "srcPrefix": format!("10.{}.{}.0/24", i / 256, i % 256),
                "ipProtocol": 17,
                "dstPorts": {"first": 53, "last": 53},
                "action": "RULE_ACTION_ALLOW",
            })
        })
        .collect();
    std::fs::write(&file, serde_json::to_vec(&rules)?)?;
    let path = file.display().to_string();
    let (c, err) = code(
        &svc,
        &[
            "rule",
            "replace",
            "blue",
            "--file",
            &path,
            "--expect-version",
            "2",
        ],
    );
    assert_eq!(c, 6, "stale version refused: {err}");
    svc.dpuctl_json(&[
        "rule",
        "replace",
        "blue",
        "--file",
        &path,
        "--expect-version",
        "3",
    ])?;
    let listed = svc.dpuctl_json(&["rule", "list", "blue"])?;
    assert_eq!(
        listed.as_array().unwrap().len(),
        2000,
        "listing follows page tokens"
    );
    assert_eq!(listed[1999]["srcPrefix"], "10.7.207.0/24");
    let t = svc.dpuctl_json(&["tenant", "get", "blue"])?;
    assert_eq!(t["ruleSetVersion"], "4");
    Ok(())
}

#[test]
fn metrics_endpoint_reports_state_and_requests() -> Result<()> {
    let svc = Service::start()?;
    populate(&svc)?;
    let _ = svc.dpuctl(&["tenant", "get", "nobody"])?;
    let (status, body) = svc.http_get("/metrics")?;
    assert!(status.contains("200"), "{status}");
    assert!(body.contains("dpu_tenants 2\n"), "{body}");
    assert!(body.contains("dpu_rules 3\n"), "{body}");
    assert!(body.contains("dpu_namespaces 2\n"), "{body}");
    assert!(
        body.contains("dpu_port_rx_packets_total{port=\"p0\"} 0\n"),
        "{body}"
    );
    assert!(
        body.contains("dpu_rule_packets_total{tenant=\"blue\",rule=\"web\"} 0\n"),
        "{body}"
    );
    assert!(
        body.contains("dpu_dropped_packets_total{reason=\"acl_deny\"}"),
        "{body}"
    );
    assert!(
        body.contains("dpu_grpc_requests_total{method=\"/dpu.v1.TenantService/CreateTenant\",code=\"Ok\"} 2\n"),
        "{body}"
    );
    assert!(
        body.contains("dpu_grpc_requests_total{method=\"/dpu.v1.TenantService/GetTenant\",code=\"NotFound\"} 1\n"),
        "{body}"
    );
    let (status, _) = svc.http_get("/nope")?;
    assert!(status.contains("404"), "{status}");
    Ok(())
}

#[test]
fn counters_and_info() -> Result<()> {
    let svc = Service::start()?;
    populate(&svc)?;
    let info = svc.dpuctl_json(&["info"])?;
    assert_eq!(info["apiVersion"], "dpu.v1");
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    assert!(info["targetTriple"].as_str().unwrap().contains("linux"));
    let c = svc.dpuctl_json(&["counters", "--tenant", "blue"])?;
    assert_eq!(c["tenants"].as_array().unwrap().len(), 1);
    assert_eq!(c["rules"].as_array().unwrap().len(), 3);
    // One counter for every reason the contract names.
    let reasons = (1..)
        .take_while(|&r| dpu_proto::v1::DropReason::try_from(r).is_ok())
        .count();
    assert!(reasons >= 8, "{reasons} drop reasons");
    assert_eq!(c["drops"].as_array().unwrap().len(), reasons);
    assert_eq!(c["ports"].as_array().unwrap().len(), 3);
    let out = svc.dpuctl(&[
        "--output",
        "json",
        "watch",
        "--interval-ms",
        "100",
        "--count",
        "3",
    ])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(lines.len(), 3);
    assert_ne!(lines[0]["time"], lines[2]["time"]);
    Ok(())
}

#[test]
fn refuses_plain_text_on_a_remote_address() -> Result<()> {
    let out = std::process::Command::new(dpu_e2e::binary("dpu-service")?)
        .args([
            "--grpc-listen",
            "0.0.0.0:0",
            "--metrics-listen",
            "off",
            "--state-dir",
        ])
        .arg(tempfile::tempdir()?.path())
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing plain-text gRPC"), "{err}");
    Ok(())
}

/// The cells of each line of a table `dpuctl` printed, header first.
fn table(svc: &Service, args: &[&str]) -> Result<Vec<Vec<String>>> {
    let text = svc.dpuctl_ok(args)?;
    Ok(text
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect())
}

#[test]
fn volumes_carry_namespaces() -> Result<()> {
    let svc = Service::start()?;
    let uuid = "6f1c2a4e-8d3b-4c5a-9e7f-0a1b2c3d4e5f";
    let v1 = svc.dpuctl_json(&[
        "volume",
        "create",
        "v1",
        "--ram",
        "64M",
        "--block-size",
        "4096",
    ])?;
    assert_eq!(v1["name"], "volumes/v1");
    assert_eq!(v1["ram"]["sizeBytes"], (64u64 << 20).to_string());
    assert_eq!(v1["sizeBytes"], (64u64 << 20).to_string());
    assert_eq!(v1["blockSize"], 4096);
    assert!(!v1["uuid"].as_str().unwrap_or_default().is_empty(), "{v1}");
    // Named by its resource name, with a UUID of the caller's.
    let v2 = svc.dpuctl_json(&[
        "volume",
        "create",
        "volumes/v2",
        "--null",
        "16G",
        "--uuid",
        uuid,
    ])?;
    assert_eq!(v2["name"], "volumes/v2");
    assert_eq!(v2["null"]["sizeBytes"], (16u64 << 30).to_string());
    assert_eq!(v2["blockSize"], 512);
    assert_eq!(v2["uuid"], uuid);
    let (c, err) = code(&svc, &["volume", "create", "v2", "--ram", "1M"]);
    assert_eq!(c, 4, "{err}");
    assert!(err.contains("volumes/v2 already exists"), "{err}");

    let listed = svc.dpuctl_json(&["volume", "list", "--page-size", "1"])?;
    assert_eq!(
        listed,
        serde_json::json!([v1, v2]),
        "every page, in ID order"
    );
    assert_eq!(svc.dpuctl_json(&["volume", "get", "v1"])?, v1);
    assert_eq!(svc.dpuctl_json(&["volume", "get", "volumes/v2"])?, v2);
    let v1_uuid = v1["uuid"].as_str().unwrap_or_default();
    assert_eq!(
        table(&svc, &["volume", "list"])?,
        [
            vec!["VOLUME", "BACKEND", "SIZE", "BLOCK", "NAMESPACE", "UUID"],
            vec!["v1", "ram", "64", "MiB", "4096", "-", v1_uuid],
            vec!["v2", "null", "16", "GiB", "512", "-", uuid],
        ]
    );

    // A namespace made on v1 has its size and block size; v1 names it.
    svc.dpuctl_json(&[
        "subsystem",
        "create",
        "vol",
        "--nqn",
        "nqn.2024-01.io.example:vol",
    ])?;
    let ns = svc.dpuctl_json(&["namespace", "create", "vol", "--volume", "volumes/v1"])?;
    assert_eq!(ns["name"], "subsystems/vol/namespaces/1");
    assert_eq!(ns["volume"], "v1");
    assert_eq!(ns["blockSize"], 4096);
    assert_eq!(ns["sizeBytes"], (64u64 << 20).to_string());
    let ns2 = svc.dpuctl_json(&["namespace", "create", "vol", "--null", "1G"])?;
    assert_eq!(ns2["null"]["sizeBytes"], (1u64 << 30).to_string());
    let rows = table(&svc, &["namespace", "list", "vol"])?;
    let backends: Vec<&str> = rows[1..].iter().map(|r| r[1].as_str()).collect();
    assert_eq!(backends, ["volume:v1", "null"], "{rows:?}");
    let v1_used = svc.dpuctl_json(&["volume", "get", "v1"])?;
    assert_eq!(v1_used["namespace"], "subsystems/vol/namespaces/1");
    let rows = table(&svc, &["volume", "list"])?;
    assert_eq!(rows[1][5], "subsystems/vol/namespaces/1", "{rows:?}");
    assert_eq!(rows[2][5], "-", "{rows:?}");

    // One namespace per volume; none beyond it.
    let (c, err) = code(&svc, &["namespace", "create", "vol", "--volume", "v1"]);
    assert_eq!(c, 6, "{err}");
    assert!(err.contains("is made on volumes/v1 already"), "{err}");
    // The volume stays while the namespace is made on it.
    let (c, err) = code(&svc, &["volume", "delete", "v1"]);
    assert_eq!(c, 6, "{err}");
    assert!(
        err.starts_with("dpuctl: error: FAILED_PRECONDITION: ")
            && err.contains("subsystems/vol/namespaces/1 is made on volumes/v1"),
        "{err}"
    );

    // The namespace follows a resize of its volume.
    let resized = svc.dpuctl_json(&["volume", "resize", "v1", "128M"])?;
    assert_eq!(resized["sizeBytes"], (128u64 << 20).to_string());
    let ns = svc.dpuctl_json(&["namespace", "get", "vol", "1"])?;
    assert_eq!(ns["sizeBytes"], (128u64 << 20).to_string(), "{ns}");
    let out = svc.dpuctl_ok(&["volume", "resize", "volumes/v2", "32G"])?;
    assert!(
        out.lines().nth(1).unwrap_or_default().contains("32 GiB"),
        "{out}"
    );

    svc.dpuctl_json(&["namespace", "delete", "vol", "1"])?;
    let free = svc.dpuctl_json(&["volume", "get", "v1"])?;
    assert_eq!(free["namespace"].as_str(), Some(""), "free again: {free}");
    assert_eq!(
        svc.dpuctl_ok(&["volume", "delete", "v1"])?,
        "deleted volumes/v1\n"
    );
    let (c, err) = code(&svc, &["volume", "get", "v1"]);
    assert_eq!(c, 3, "{err}");
    assert!(err.contains("volumes/v1"), "{err}");
    let left = svc.dpuctl_json(&["volume", "list"])?;
    assert_eq!(left.as_array().map(Vec::len), Some(1), "{left}");
    assert_eq!(left[0]["name"], "volumes/v2");
    Ok(())
}

#[test]
fn bad_volumes_get_clear_errors() -> Result<()> {
    let svc = Service::start()?;
    svc.dpuctl_json(&[
        "subsystem",
        "create",
        "vol",
        "--nqn",
        "nqn.2024-01.io.example:vol",
    ])?;
    let (c, err) = code(&svc, &["volume", "create", "v1", "--ram", "0"]);
    assert_eq!(c, 5, "{err}");
    assert!(
        err.starts_with("dpuctl: error: INVALID_ARGUMENT: ")
            && err.contains("volume.ram.size_bytes"),
        "{err}"
    );
    let (c, err) = code(&svc, &["namespace", "create", "vol", "--volume", "nope"]);
    assert_eq!(c, 6, "{err}");
    assert!(err.contains("volumes/nope does not exist"), "{err}");
    // Refused by dpuctl itself: a block size the service has not, no
    // store, two stores.
    let (c, err) = code(
        &svc,
        &[
            "volume",
            "create",
            "v1",
            "--ram",
            "1M",
            "--block-size",
            "1024",
        ],
    );
    assert_eq!(c, 5, "{err}");
    assert!(err.contains("512 or 4096"), "{err}");
    let (c, err) = code(&svc, &["volume", "create", "v1"]);
    assert_eq!(c, 2, "{err}");
    assert!(err.contains("--null <SIZE>"), "{err}");
    let (c, err) = code(
        &svc,
        &[
            "namespace",
            "create",
            "vol",
            "--volume",
            "v1",
            "--ram",
            "1M",
        ],
    );
    assert_eq!(c, 2, "{err}");
    let (c, err) = code(&svc, &["volume", "resize", "v1", "1M"]);
    assert_eq!(c, 3, "{err}");
    // Nothing was made.
    assert_eq!(svc.dpuctl_json(&["volume", "list"])?, serde_json::json!([]));
    assert_eq!(
        svc.dpuctl_json(&["namespace", "list", "vol"])?,
        serde_json::json!([])
    );
    Ok(())
}

/// A tenant's network VLAN ID: set on create and by update, shown in the
/// table and JSON, one tenant's only (ALREADY_EXISTS, exit 4), freed by
/// setting it to 0.
#[test]
fn tenant_vlan_ids() -> Result<()> {
    let svc = Service::start()?;
    let t = svc.dpuctl_json(&["tenant", "create", "red", "--vlan-id", "10"])?;
    assert_eq!(t["vlanId"], 10, "{t}");
    let (c, err) = code(&svc, &["tenant", "create", "blue", "--vlan-id", "10"]);
    assert_eq!(c, 4, "{err}");
    assert!(
        err.contains("VLAN 10 is the network of tenants/red"),
        "{err}"
    );
    let rows = table(&svc, &["tenant", "list"])?;
    assert_eq!(rows[0][..3], ["TENANT", "POLICY", "VLAN"]);
    assert_eq!(rows[1][..3], ["red", "deny", "10"]);
    let (c, err) = code(&svc, &["tenant", "update", "red", "--vlan-id", "4095"]);
    assert_eq!(c, 5, "{err}");
    assert!(err.contains("tenant.vlan_id"), "{err}");
    svc.dpuctl_ok(&["tenant", "update", "red", "--vlan-id", "0"])?;
    let t = svc.dpuctl_json(&["tenant", "create", "blue", "--vlan-id", "10"])?;
    assert_eq!(t["vlanId"], 10, "{t}");
    let t = svc.dpuctl_json(&["tenant", "get", "red"])?;
    assert!(t.get("vlanId").is_none_or(|v| v == 0), "{t}");
    Ok(())
}
