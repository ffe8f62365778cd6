//! The `dpu_client` library against the real service.

use anyhow::Result;
use dpu_client::{pb, tenant_name, ClientConfig, ClientError, DpuClient};
use dpu_e2e::Service;
use tonic::Code;

fn client_config(svc: &Service) -> ClientConfig {
    ClientConfig {
        endpoint: svc.endpoint(),
        ..ClientConfig::default()
    }
}

#[tokio::test]
async fn typed_calls_statuses_and_streams() -> Result<()> {
    let svc = Service::start()?;
    let c = DpuClient::connect(client_config(&svc)).await?;

    let t = c
        .create_tenant(pb::CreateTenantRequest {
            tenant_id: "lib".into(),
            tenant: Some(pb::Tenant {
                display_name: "from the library".into(),
                ..Default::default()
            }),
        })
        .await?;
    assert_eq!(t.name, "tenants/lib");
    assert_eq!(
        t.default_policy,
        pb::DefaultPolicy::Deny as i32,
        "UNSPECIFIED means deny"
    );

    let added = c
        .add_rule(pb::AddRuleRequest {
            parent: tenant_name("lib"),
            rule: Some(pb::FilterRule {
                priority: 5,
                ip_protocol: Some(17),
                dst_ports: Some(pb::PortRange {
                    first: 53,
                    last: 53,
                }),
                action: pb::RuleAction::Allow as i32,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?;
    assert_eq!(added.rule_set_version, 1);
    let rule = added.rule.expect("rule");
    assert!(
        rule.name.starts_with("tenants/lib/rules/rule-"),
        "{}",
        rule.name
    );

    // Errors carry the server's code and message.
    let err = c
        .get_tenant(pb::GetTenantRequest {
            name: "tenants/ghost".into(),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Status { code: Code::NotFound, message } if message.contains("tenants/ghost")),
        "{err}"
    );
    let err = c
        .replace_rules(pb::ReplaceRulesRequest {
            parent: tenant_name("lib"),
            rules: vec![],
            expected_version: Some(0),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::FailedPrecondition));

    // Paging: small pages cover everything exactly once.
    for i in 0..7 {
        c.create_tenant(pb::CreateTenantRequest {
            tenant_id: format!("page-{i}"),
            tenant: Some(Default::default()),
        })
        .await?;
    }
    let mut names = vec![];
    let mut token = String::new();
    loop {
        let r = c
            .list_tenants(pb::ListTenantsRequest {
                page_size: 3,
                page_token: token,
            })
            .await?;
        assert!(r.tenants.len() <= 3);
        names.extend(r.tenants.into_iter().map(|t| t.name));
        if r.next_page_token.is_empty() {
            break;
        }
        token = r.next_page_token;
    }
    assert_eq!(names.len(), 8);
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);

    let mut stream = c
        .watch_counters(pb::WatchCountersRequest {
            tenant: tenant_name("lib"),
            interval_ms: 100,
        })
        .await?;
    for _ in 0..2 {
        let snap = stream.message().await?.expect("a snapshot");
        assert_eq!(snap.tenants.len(), 1);
        assert_eq!(snap.rules.len(), 1);
    }
    Ok(())
}

#[tokio::test]
async fn connect_failures_are_reported() {
    let cfg = ClientConfig {
        endpoint: format!("http://127.0.0.1:{}", dpu_e2e::free_port()),
        connect_timeout: std::time::Duration::from_secs(2),
        ..ClientConfig::default()
    };
    let err = DpuClient::connect(cfg).await.unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err}");
    let bad = ClientConfig {
        endpoint: "not a url".into(),
        ..ClientConfig::default()
    };
    assert!(matches!(
        DpuClient::connect(bad).await.unwrap_err(),
        ClientError::InvalidConfig(_)
    ));
}
