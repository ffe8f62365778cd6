//! Authorization over mutual TLS, through the real binary and `dpuctl`:
//! client certificates' names (common name, DNS and SPIFFE URI subject
//! alternative names) map to the roles of `[[grpc.clients]]`; refusals are
//! `PERMISSION_DENIED` (`dpuctl` exit code 9), name the client and the
//! method, and are counted on `/metrics`.

use std::path::Path;
use std::process::{Command, Output};

use anyhow::{ensure, Context, Result};
use dpu_e2e::pki::{issue, make_server_pki};
use dpu_e2e::{binary, Service, TEST_CONFIG};

/// A CA; a server certificate for localhost; clients: `admin` (by common
/// name), `reader` (by DNS name), `red` (by SPIFFE ID) and `stranger`
/// (signed by the CA, but named in no `[[grpc.clients]]`).
fn make_pki(dir: &Path) -> Result<()> {
    make_server_pki(dir, "dpu-authz-ca")?;
    let client = "extendedKeyUsage=clientAuth\n";
    issue(dir, "admin", "/O=ops/CN=ops-admin", client)?;
    issue(
        dir,
        "reader",
        "/CN=grafana",
        &format!("subjectAltName=DNS:monitor.dpu.test\n{client}"),
    )?;
    issue(
        dir,
        "red",
        "/CN=red-team",
        &format!("subjectAltName=URI:spiffe://dpu.test/ns/red/sa/writer\n{client}"),
    )?;
    issue(dir, "stranger", "/CN=stranger", client)?;
    Ok(())
}

const CLIENTS: &str = r#"
[[grpc.clients]]
identity = "cn:ops-admin"
role = "admin"

[[grpc.clients]]
identity = "dns:monitor.dpu.test"
role = "reader"

[[grpc.clients]]
identity = "spiffe://dpu.test/ns/red/sa/writer"
role = "tenant-writer"
tenants = ["red"]
"#;

struct Mtls {
    svc: Service,
    pki: tempfile::TempDir,
}

impl Mtls {
    fn start() -> Result<Mtls> {
        let pki = tempfile::tempdir()?;
        make_pki(pki.path())?;
        let p = |f: &str| pki.path().join(f).display().to_string();
        let svc = Service::start_config(
            &format!("{TEST_CONFIG}{CLIENTS}"),
            &[
                "--tls-cert",
                &p("server.crt"),
                "--tls-key",
                &p("server.key"),
                "--tls-client-ca",
                &p("ca.crt"),
            ],
        )?;
        Ok(Mtls { svc, pki })
    }

    /// Runs `dpuctl` as client `who` (the name of its certificate).
    fn dpuctl(&self, who: &str, args: &[&str]) -> Result<Output> {
        let p = |f: &str| self.pki.path().join(f).display().to_string();
        Command::new(binary("dpuctl")?)
            .args([
                "--endpoint",
                &format!("https://localhost:{}", self.svc.grpc.port()),
                "--timeout",
                "10",
                "--ca-cert",
                &p("ca.crt"),
                "--cert",
                &p(&format!("{who}.crt")),
                "--key",
                &p(&format!("{who}.key")),
            ])
            .args(args)
            .output()
            .context("running dpuctl")
    }

    /// `who` may run `args`.
    fn allowed(&self, who: &str, args: &[&str]) -> Result<String> {
        let out = self.dpuctl(who, args)?;
        ensure!(
            out.status.success(),
            "{who} {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `who` is refused `args` with PERMISSION_DENIED (exit code 9), by a
    /// message naming `identity` and `method`; answers the message.
    fn refused(&self, who: &str, args: &[&str], identity: &str, method: &str) -> Result<String> {
        let out = self.dpuctl(who, args)?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.code() == Some(9),
            "{who} {args:?}: want exit code 9, got {}: {err}",
            out.status
        );
        ensure!(
            err.contains("PERMISSION_DENIED") && err.contains(identity) && err.contains(method),
            "{who} {args:?}: the refusal names neither {identity} nor {method}: {err}"
        );
        Ok(err.into_owned())
    }
}

#[test]
fn roles_decide_who_may_change_what() -> Result<()> {
    let m = Mtls::start()?;
    let admin = "cn:ops-admin";
    let reader = "dns:monitor.dpu.test";
    let red = "uri:spiffe://dpu.test/ns/red/sa/writer";

    // The admin may do everything: tenants, rules, storage.
    m.allowed("admin", &["tenant", "create", "red", "--port", "pf0vf0"])?;
    m.allowed("admin", &["tenant", "create", "blue", "--port", "pf0vf1"])?;
    for t in ["red", "blue"] {
        m.allowed(
            "admin",
            &[
                "rule",
                "add",
                t,
                "--id",
                "base",
                "--priority",
                "10",
                "--action",
                "deny",
            ],
        )?;
    }
    m.allowed(
        "admin",
        &[
            "subsystem",
            "create",
            "vol",
            "--nqn",
            "nqn.2024-01.io.example:vol",
        ],
    )?;
    let _ = admin;

    // The reader reads, and changes nothing.
    ensure!(m.allowed("reader", &["tenant", "list"])?.contains("blue"));
    ensure!(m
        .allowed("reader", &["rule", "list", "blue"])?
        .contains("base"));
    m.allowed("reader", &["subsystem", "list"])?;
    m.allowed("reader", &["counters"])?;
    m.allowed("reader", &["info"])?;
    m.allowed("reader", &["health"])?;
    m.refused(
        "reader",
        &[
            "rule",
            "add",
            "red",
            "--priority",
            "20",
            "--action",
            "allow",
        ],
        reader,
        "/dpu.v1.FilterService/AddRule",
    )?;
    m.refused(
        "reader",
        &["tenant", "create", "green"],
        reader,
        "/dpu.v1.TenantService/CreateTenant",
    )?;
    m.refused(
        "reader",
        &["subsystem", "delete", "vol"],
        reader,
        "/dpu.v1.StorageService/DeleteSubsystem",
    )?;

    // The writer of red (a SPIFFE ID) changes red's rules and attachments,
    // and nothing of blue's, nor tenants or storage.
    m.allowed(
        "red",
        &[
            "rule",
            "add",
            "red",
            "--id",
            "web",
            "--priority",
            "20",
            "--action",
            "allow",
        ],
    )?;
    m.allowed("red", &["rule", "delete", "red", "web"])?;
    m.allowed(
        "red",
        &["port", "attach", "p0", "--tenant", "red", "--vlan", "100"],
    )?;
    m.allowed("red", &["port", "detach", "p0", "--vlan", "100"])?;
    let rules = m.pki.path().join("rules.json");
    std::fs::write(
        &rules,
        r#"[{"priority": 5, "action": "RULE_ACTION_ALLOW"}]"#,
    )?;
    let rules = rules.display().to_string();
    m.allowed("red", &["rule", "replace", "red", "--file", &rules])?;
    m.refused(
        "red",
        &["rule", "replace", "blue", "--file", &rules],
        red,
        "/dpu.v1.FilterService/ReplaceRules",
    )?;
    let err = m.refused(
        "red",
        &[
            "rule",
            "add",
            "blue",
            "--priority",
            "20",
            "--action",
            "allow",
        ],
        red,
        "/dpu.v1.FilterService/AddRule",
    )?;
    let want = "tenant: client uri:spiffe://dpu.test/ns/red/sa/writer (cn:red-team, \
                uri:spiffe://dpu.test/ns/red/sa/writer) with role tenant-writer of red may \
                not call /dpu.v1.FilterService/AddRule on tenant \"blue\"";
    ensure!(err.contains(want), "{err}");
    m.refused(
        "red",
        &["rule", "delete", "blue", "base"],
        red,
        "/dpu.v1.FilterService/DeleteRule",
    )?;
    m.refused(
        "red",
        &["port", "attach", "p0", "--tenant", "blue", "--vlan", "200"],
        red,
        "/dpu.v1.PortService/AttachPort",
    )?;
    m.refused(
        "red",
        &["port", "detach", "pf0vf1"],
        red,
        "/dpu.v1.PortService/DetachPort",
    )?;
    m.refused(
        "red",
        &["tenant", "delete", "blue"],
        red,
        "/dpu.v1.TenantService/DeleteTenant",
    )?;
    m.refused(
        "red",
        &["tenant", "create", "green"],
        red,
        "/dpu.v1.TenantService/CreateTenant",
    )?;
    m.refused(
        "red",
        &[
            "subsystem",
            "create",
            "v2",
            "--nqn",
            "nqn.2024-01.io.example:v2",
        ],
        red,
        "/dpu.v1.StorageService/CreateSubsystem",
    )?;
    // ...but may read everything.
    ensure!(m
        .allowed("red", &["rule", "list", "blue"])?
        .contains("base"));

    // Blue is as the admin left it.
    let blue = m.allowed("admin", &["--output", "json", "tenant", "get", "blue"])?;
    ensure!(blue.contains("pf0vf1"), "blue lost its port: {blue}");
    let blue_rules = m.allowed("admin", &["--output", "json", "rule", "list", "blue"])?;
    let v: serde_json::Value = serde_json::from_str(&blue_rules)?;
    ensure!(
        v.to_string().matches("\"priority\"").count() == 1,
        "blue's rules changed: {v}"
    );

    // A certificate the CA signed that no client entry names may call nothing.
    m.refused(
        "stranger",
        &["tenant", "list"],
        "unknown client (cn:stranger)",
        "/dpu.v1.TenantService/ListTenants",
    )?;

    // Refusals are counted by method and client; unknown ones as one label.
    let (status, body) = m.svc.http_get("/metrics")?;
    ensure!(status.contains("200"), "{status}");
    for (method, client, n) in [
        ("/dpu.v1.FilterService/AddRule", reader, 1),
        ("/dpu.v1.FilterService/AddRule", red, 1),
        ("/dpu.v1.PortService/DetachPort", red, 1),
        ("/dpu.v1.TenantService/ListTenants", "unknown", 1),
    ] {
        let line =
            format!("dpu_grpc_denied_total{{method=\"{method}\",client=\"{client}\"}} {n}\n");
        ensure!(body.contains(&line), "no {line:?} in:\n{body}");
    }
    ensure!(
        !body.contains("stranger"),
        "an unknown identity became a label"
    );
    Ok(())
}

/// Server-only TLS on a non-loopback address lets anyone in as an
/// anonymous caller: refused at startup unless explicitly allowed, as
/// plain text is.
#[test]
fn server_only_tls_off_loopback_needs_consent() -> Result<()> {
    let pki = tempfile::tempdir()?;
    make_pki(pki.path())?;
    let p = |f: &str| pki.path().join(f).display().to_string();
    let check = |extra: &[&str]| -> Result<Output> {
        Command::new(binary("dpu-service")?)
            .args([
                "--check-config",
                "--state-dir",
                &p("state"),
                "--grpc-listen",
                "0.0.0.0:50051",
                "--tls-cert",
                &p("server.crt"),
                "--tls-key",
                &p("server.key"),
            ])
            .args(extra)
            .output()
            .context("running dpu-service")
    };
    let out = check(&[])?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(2) && err.contains("refusing TLS without client certificates"),
        "server-only TLS on 0.0.0.0 was not refused ({}): {err}",
        out.status
    );
    let out = check(&["--allow-insecure-remote"])?;
    ensure!(
        out.status.success(),
        "with consent: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = check(&["--tls-client-ca", &p("ca.crt")])?;
    ensure!(
        out.status.success(),
        "with mTLS: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
