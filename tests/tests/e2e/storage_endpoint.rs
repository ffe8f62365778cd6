//! Storage endpoints through the real binary: a listener bound to a
//! tenant's network gets a MAC, is refused what the tenant's hosts hold,
//! survives restarts with the same MAC, and keeps its tenant from being
//! deleted.

use anyhow::Result;
use dpu_e2e::Service;
use serde_json::Value;

fn code(svc: &Service, args: &[&str]) -> (i32, String) {
    let out = svc.dpuctl(args).expect("dpuctl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn listeners(svc: &Service, sub: &str) -> Result<Vec<Value>> {
    let v = svc.dpuctl_json(&["listener", "list", sub])?;
    Ok(v.as_array().cloned().unwrap_or_default())
}

#[test]
fn endpoints_are_created_listed_kept_and_deleted() -> Result<()> {
    let mut svc = Service::start()?;
    for t in [
        &[
            "tenant",
            "create",
            "blue",
            "--port",
            "pf0vf0,mac=02:00:00:00:00:01,ip=10.1.0.0/25",
        ][..],
        &["tenant", "create", "red", "--port", "pf0vf1,ip=10.1.0.0/25"][..],
    ] {
        svc.dpuctl_json(t)?;
    }
    for s in ["vol1", "vol2", "vol3"] {
        let nqn = format!("nqn.2024-01.io.example:{s}");
        svc.dpuctl_json(&["subsystem", "create", s, "--nqn", &nqn])?;
    }
    let create = |sub: &str, id: &str, tenant: &str, address: &str| {
        svc.dpuctl_json(&[
            "listener",
            "create",
            sub,
            "--id",
            id,
            "--tenant",
            tenant,
            "--address",
            address,
            "--port",
            "4420",
        ])
    };
    let a = create("vol1", "ep", "blue", "10.1.0.250")?;
    assert_eq!(a["tenant"], "blue", "{a}");
    let mac = a["mac"].as_str().unwrap_or_default().to_string();
    assert!(mac.starts_with("02:"), "{a}");
    // Another subsystem on the same endpoint shares its MAC; red's endpoint
    // on the same address is another station.
    let b = create("vol2", "ep", "blue", "10.1.0.250")?;
    assert_eq!(b["mac"], mac.as_str(), "{b}");
    let r = create("vol3", "red-ep", "red", "10.1.0.250")?;
    assert_ne!(r["mac"], mac.as_str(), "{r}");
    // A subsystem is served in one place: blue's vol1 cannot also listen
    // in red's network, nor on the service's own sockets.
    let (c, err) = code(
        &svc,
        &[
            "listener",
            "create",
            "vol1",
            "--id",
            "x",
            "--tenant",
            "red",
            "--address",
            "10.1.0.251",
            "--port",
            "4420",
        ],
    );
    assert_ne!(c, 0, "{err}");
    assert!(err.contains("served in tenant blue's network"), "{err}");
    let port = dpu_e2e::free_port().to_string();
    let (c, err) = code(
        &svc,
        &[
            "listener",
            "create",
            "vol1",
            "--id",
            "x",
            "--address",
            "127.0.0.1",
            "--port",
            &port,
        ],
    );
    assert_ne!(c, 0, "{err}");
    assert!(err.contains("served in tenant blue's network"), "{err}");
    assert_eq!(
        listeners(&svc, "vol1")?.len(),
        1,
        "the refused listeners are undone"
    );

    // Refusals, each with its code and what it is about.
    let bad = |id: &str, tenant: &str, address: &str| {
        code(
            &svc,
            &[
                "listener",
                "create",
                "vol1",
                "--id",
                id,
                "--tenant",
                tenant,
                "--address",
                address,
            ],
        )
    };
    let (c, err) = bad("x", "green", "10.1.0.250");
    assert_eq!(c, 3, "{err}");
    assert!(err.contains("tenants/green"), "{err}");
    let (c, err) = bad("x", "blue", "10.1.0.9");
    assert_eq!(c, 5, "{err}");
    assert!(
        err.contains("listener.address") && err.contains("10.1.0.0/25"),
        "{err}"
    );
    let (c, err) = bad("x", "blue", "fe80::1");
    assert_eq!(c, 5, "{err}");
    assert!(
        err.contains("listener.address") && err.contains("link-local"),
        "{err}"
    );
    let (c, err) = bad("x", "Bad_Tenant", "10.1.0.250");
    assert_eq!(c, 5, "{err}");
    assert!(err.contains("listener.tenant"), "{err}");
    let (c, err) = bad("again", "blue", "10.1.0.250");
    assert_eq!(c, 4, "{err}");

    // The tenant stays while it has an endpoint, even with --force.
    for args in [
        &["tenant", "delete", "blue"][..],
        &["tenant", "delete", "blue", "--force"],
    ] {
        let (c, err) = code(&svc, args);
        assert_eq!(c, 6, "{err}");
        assert!(err.contains("subsystems/vol1/listeners/ep"), "{err}");
    }

    // The endpoints and their MACs survive a restart and a kill -9.
    let all = |svc: &Service| -> Result<Vec<Vec<Value>>> {
        ["vol1", "vol2", "vol3"]
            .iter()
            .map(|s| listeners(svc, s))
            .collect()
    };
    let before = all(&svc)?;
    assert_eq!(before.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 1]);
    svc.restart()?;
    assert_eq!(all(&svc)?, before);
    svc.crash_and_restart()?;
    assert_eq!(all(&svc)?, before);

    // Table output shows the tenant and the MAC.
    let out = svc.dpuctl(&["listener", "list", "vol2"])?;
    let text = String::from_utf8(out.stdout)?;
    assert!(text.contains("TENANT") && text.contains(&mac), "{text}");

    for (sub, id) in [("vol1", "ep"), ("vol2", "ep")] {
        svc.dpuctl_json(&["listener", "delete", sub, id])?;
    }
    svc.dpuctl_json(&["tenant", "delete", "blue", "--force"])?;
    let (c, err) = code(&svc, &["tenant", "delete", "red", "--force"]);
    assert_eq!(c, 6, "{err}");
    assert!(err.contains("subsystems/vol3/listeners/red-ep"), "{err}");
    Ok(())
}
