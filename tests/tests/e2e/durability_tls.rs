//! Durability under `kill -9` while changes are in flight, and mutual TLS.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::sync::{Arc, Mutex};

use anyhow::{ensure, Context, Result};
use dpu_e2e::pki::make_test_pki;
use dpu_e2e::{binary, free_port, Service, TEST_CONFIG};

/// Writers create tenants as fast as they can; the service is killed with
/// SIGKILL in the middle. Every creation `dpuctl` saw acknowledged must be
/// there after the restart.
#[test]
fn kill_9_loses_no_acknowledged_change() -> Result<()> {
    let mut svc = Service::start()?;
    let endpoint = svc.endpoint();
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let dpuctl = binary("dpuctl")?;
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (acked, endpoint, dpuctl) = (acked.clone(), endpoint.clone(), dpuctl.clone());
            std::thread::spawn(move || {
                for i in 0..200 {
                    let id = format!("w{w}-t{i}");
                    let out = Command::new(&dpuctl)
                        .args([
                            "--endpoint",
                            &endpoint,
                            "--timeout",
                            "5",
                            "tenant",
                            "create",
                            &id,
                        ])
                        .output();
                    match out {
                        Ok(o) if o.status.success() => acked.lock().unwrap().push(id),
                        // Unreachable after the kill: stop writing.
                        Ok(o) if o.status.code() == Some(7) => break,
                        _ => {}
                    }
                }
            })
        })
        .collect();
    // Let some changes land, then kill without warning.
    let start = std::time::Instant::now();
    while acked.lock().unwrap().len() < 20 && start.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    svc.signal("KILL")?;
    for w in writers {
        let _ = w.join();
    }
    let acked = acked.lock().unwrap().clone();
    ensure!(
        acked.len() >= 20,
        "only {} changes were acknowledged before the kill",
        acked.len()
    );

    svc.start_again()?;
    let listed = svc.dpuctl_json(&["tenant", "list"])?;
    let names: Vec<&str> = listed
        .as_array()
        .context("list")?
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for id in &acked {
        let name = format!("tenants/{id}");
        ensure!(
            names.contains(&name.as_str()),
            "acknowledged {name} lost after kill -9"
        );
    }
    Ok(())
}

/// The rules of `tenant`, by name.
fn rule_names(svc: &Service, tenant: &str) -> Result<BTreeSet<String>> {
    let v = svc.dpuctl_json(&["rule", "list", tenant])?;
    Ok(v.as_array()
        .or_else(|| v["rules"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str().map(str::to_string))
        .collect())
}

/// Writers add and delete rules as fast as they can, each change one
/// journal record; the service is killed with SIGKILL in the middle. After
/// the restart every acknowledged addition is there and every
/// acknowledged deletion is not. Then the journal's tail is torn by hand
/// (the service starts, with the same rules) and a byte in its first
/// record is flipped (the service refuses to start, naming the file and
/// the offset, and leaves the file as it was).
#[test]
fn kill_9_during_rule_changes_loses_none_and_corruption_stops_the_start() -> Result<()> {
    let mut svc = Service::start()?;
    for t in ["j0", "j1"] {
        svc.dpuctl_json(&["tenant", "create", t])?;
    }
    let endpoint = svc.endpoint();
    let added = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let deleted = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    // Deletions asked for, acknowledged or not: one in flight when the
    // service dies (or one whose answer was an error after it was stored)
    // may or may not have taken effect.
    let asked = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let dpuctl = binary("dpuctl")?;
    let writers: Vec<_> = (0..4u32)
        .map(|w| {
            let (added, deleted, asked) = (added.clone(), deleted.clone(), asked.clone());
            let (endpoint, dpuctl) = (endpoint.clone(), dpuctl.clone());
            std::thread::spawn(move || {
                let tenant = format!("j{}", w % 2);
                let run = |args: &[&str]| {
                    Command::new(&dpuctl)
                        .args(["--endpoint", &endpoint, "--timeout", "5"])
                        .args(args)
                        .output()
                };
                let mut mine = Vec::new();
                for i in 0..300u32 {
                    let id = format!("w{w}-r{i}");
                    let prio = (w * 1000 + i).to_string();
                    let out = if i % 3 == 2 && !mine.is_empty() {
                        // Delete one of this writer's acknowledged rules.
                        let victim: String = mine.remove(0);
                        asked.lock().unwrap().push((tenant.clone(), victim.clone()));
                        let o = run(&["rule", "delete", &tenant, &victim]);
                        if matches!(&o, Ok(o) if o.status.success()) {
                            deleted.lock().unwrap().push((tenant.clone(), victim));
                        }
                        o
                    } else {
                        let o = run(&[
                            "rule",
                            "add",
                            &tenant,
                            "--id",
                            &id,
                            "--priority",
                            &prio,
                            "--action",
                            "allow",
                            "--proto",
                            "tcp",
                            "--dport",
                            "443",
                        ]);
                        if matches!(&o, Ok(o) if o.status.success()) {
                            added.lock().unwrap().push((tenant.clone(), id.clone()));
                            mine.push(id);
                        }
                        o
                    };
                    // Unreachable after the kill: stop writing.
                    if matches!(&out, Ok(o) if o.status.code() == Some(7)) {
                        break;
                    }
                }
            })
        })
        .collect();
    let start = std::time::Instant::now();
    while (added.lock().unwrap().len() < 40 || deleted.lock().unwrap().len() < 10)
        && start.elapsed().as_secs() < 90
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    svc.signal("KILL")?;
    for w in writers {
        let _ = w.join();
    }
    let (added, deleted) = (
        added.lock().unwrap().clone(),
        deleted.lock().unwrap().clone(),
    );
    ensure!(
        added.len() >= 40 && deleted.len() >= 10,
        "only {} additions and {} deletions were acknowledged before the kill",
        added.len(),
        deleted.len()
    );

    svc.start_again()?;
    let mut rules = BTreeSet::new();
    for t in ["j0", "j1"] {
        rules.extend(rule_names(&svc, t)?);
    }
    let name = |(t, r): &(String, String)| format!("tenants/{t}/rules/{r}");
    for d in &deleted {
        ensure!(
            !rules.contains(&name(d)),
            "acknowledged deletion of {} lost",
            name(d)
        );
    }
    let asked = asked.lock().unwrap().clone();
    for a in added.iter().filter(|a| !asked.contains(a)) {
        ensure!(
            rules.contains(&name(a)),
            "acknowledged {} lost after kill -9",
            name(a)
        );
    }
    let journal = svc.state_dir.join("state.journal");
    for f in [&journal, &svc.state_dir.join("state.json")] {
        let mode = std::fs::metadata(f)?.permissions().mode();
        ensure!(
            mode & 0o777 == 0o600,
            "{}: mode {:o}",
            f.display(),
            mode & 0o777
        );
    }

    // A torn tail: half a header after the last record.
    svc.signal("KILL")?;
    let whole = std::fs::read(&journal)?;
    ensure!(whole.len() > 100, "the changes went to the journal");
    let mut torn = whole.clone();
    torn.extend_from_slice(&[0x55, 0x01, 0, 0, 0xaa, 0xbb]);
    std::fs::write(&journal, &torn)?;
    svc.start_again()?;
    let mut again = BTreeSet::new();
    for t in ["j0", "j1"] {
        again.extend(rule_names(&svc, t)?);
    }
    ensure!(again == rules, "a torn tail changed the rules");
    ensure!(
        svc.log_text().contains("torn last record"),
        "the torn tail is logged"
    );

    // Damage in the first record: no start, no silent loss.
    svc.signal("KILL")?;
    let mut bad = std::fs::read(&journal)?;
    bad[20] ^= 0x08;
    std::fs::write(&journal, &bad)?;
    let err = format!("{:#}", svc.start_again().unwrap_err());
    ensure!(
        err.contains("state.journal") && err.contains("offset 0"),
        "the refusal names the file and the offset: {err}"
    );
    ensure!(
        std::fs::read(&journal)? == bad,
        "the damaged journal is left as it was"
    );
    Ok(())
}

#[test]
fn mutual_tls() -> Result<()> {
    let pki = tempfile::tempdir()?;
    make_test_pki(pki.path())?;
    let p = |f: &str| pki.path().join(f).display().to_string();
    let health = format!("127.0.0.1:{}", free_port());
    // Every certificate the CA signs is authenticated; only a named one
    // may call anything.
    let config =
        format!("{TEST_CONFIG}\n[[grpc.clients]]\nidentity = \"cn:client\"\nrole = \"admin\"\n");
    let svc = Service::start_config(
        &config,
        &[
            "--tls-cert",
            &p("server.crt"),
            "--tls-key",
            &p("server.key"),
            "--tls-client-ca",
            &p("ca.crt"),
            "--health-listen",
            &health,
        ],
    )?;

    // Probes that cannot present a certificate use the plain-text,
    // health-only listener; it serves nothing else.
    let plain_health = |cmd: &[&str]| -> Result<std::process::Output> {
        Ok(Command::new(binary("dpuctl")?)
            .args(["--endpoint", &format!("http://{health}"), "--timeout", "5"])
            .args(cmd)
            .output()?)
    };
    let h = plain_health(&["health"])?;
    ensure!(
        h.status.success() && String::from_utf8_lossy(&h.stdout).trim() == "SERVING",
        "health over the health listener: {} {}",
        String::from_utf8_lossy(&h.stdout),
        String::from_utf8_lossy(&h.stderr)
    );
    let h = plain_health(&["health", "--service", "dpu.v1.StorageService"])?;
    ensure!(h.status.success(), "{}", String::from_utf8_lossy(&h.stderr));
    let api = plain_health(&["tenant", "list"])?;
    ensure!(
        !api.status.success() && String::from_utf8_lossy(&api.stderr).contains("UNIMPLEMENTED"),
        "the health listener served the API: {}",
        String::from_utf8_lossy(&api.stderr)
    );
    let endpoint = format!("https://localhost:{}", svc.grpc.port());
    let run = |extra: &[&str]| -> Result<std::process::Output> {
        Ok(Command::new(binary("dpuctl")?)
            .args(["--endpoint", &endpoint, "--timeout", "5"])
            .args(extra)
            .args(["tenant", "list"])
            .output()?)
    };
    let ok = run(&[
        "--ca-cert",
        &p("ca.crt"),
        "--cert",
        &p("client.crt"),
        "--key",
        &p("client.key"),
    ])?;
    ensure!(
        ok.status.success(),
        "with a client certificate: {}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let no_cert = run(&["--ca-cert", &p("ca.crt")])?;
    ensure!(
        !no_cert.status.success(),
        "a client without a certificate was let in"
    );

    let wrong_ca = run(&[
        "--ca-cert",
        &p("client.crt"),
        "--cert",
        &p("client.crt"),
        "--key",
        &p("client.key"),
    ])?;
    ensure!(
        !wrong_ca.status.success(),
        "a server certificate from an untrusted CA was accepted"
    );

    let plain = Command::new(binary("dpuctl")?)
        .args([
            "--endpoint",
            &format!("http://127.0.0.1:{}", svc.grpc.port()),
            "--timeout",
            "5",
            "tenant",
            "list",
        ])
        .output()?;
    ensure!(
        !plain.status.success(),
        "plain text was accepted by a TLS listener"
    );
    Ok(())
}

/// Python grpcio, grpcio-reflection and grpcio-health-checking from PyPI,
/// driving the service through reflection and the health service only.
#[test]
fn foreign_python_client() -> Result<()> {
    let svc = Service::start()?;
    let script = dpu_e2e::repo_root().join("tests/python/run.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["--target", &svc.grpc.to_string()])
        .output()
        .context("running tests/python/run.sh")?;
    ensure!(
        out.status.success(),
        "foreign client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
