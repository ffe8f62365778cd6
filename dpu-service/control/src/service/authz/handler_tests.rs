//! The tenant-scoped methods' handlers refuse a tenant writer every
//! tenant but its own, before changing anything.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;

use dpu_proto::v1 as pb;
use dpu_proto::v1::filter_service_server::FilterService;
use dpu_proto::v1::port_service_server::PortService;
use dpu_proto::v1::tenant_service_server::TenantService;
use tonic::{Code, Request, Status};

use super::{Caller, Permission, Role, METHODS};
use crate::model::{PortRole, PortSpec};
use crate::service::testing::LIMITS;
use crate::service::Api;
use crate::state::PortRegistry;
use crate::store::StateHandle;

fn ports() -> PortRegistry {
    let p = PortSpec {
        id: "p0".into(),
        driver: "none".into(),
        device: String::new(),
        role: PortRole::Software,
        vtep_address: None,
    };
    [("p0".to_string(), p)].into()
}

fn tenant(id: &str, vlan: u32) -> pb::CreateTenantRequest {
    pb::CreateTenantRequest {
        tenant_id: id.into(),
        tenant: Some(pb::Tenant {
            attachments: vec![pb::Attachment {
                kind: Some(pb::attachment::Kind::Port(pb::PortAttachment {
                    port: "ports/p0".into(),
                    vlan_id: vlan,
                    ..Default::default()
                })),
            }],
            ..Default::default()
        }),
    }
}

fn rule(priority: u32) -> pb::FilterRule {
    pb::FilterRule {
        priority,
        action: pb::RuleAction::Deny as i32,
        ..Default::default()
    }
}

/// `msg` as sent by `caller`.
fn by<T>(caller: &Caller, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.extensions_mut()
        .insert(std::sync::Arc::new(caller.clone()));
    r
}

type Call<'a> = Pin<Box<dyn Future<Output = Result<(), Status>> + 'a>>;

/// Calls tenant-scoped method `method` on tenant `t` (whose attachment is
/// VLAN `vlan` of p0 and which holds rule `r1`) as `c`.
fn call<'a>(api: &'a Api, c: &Caller, method: &str, t: &str, vlan: u32) -> Call<'a> {
    let parent = format!("tenants/{t}");
    match method {
        "/dpu.v1.FilterService/AddRule" => {
            let r = by(
                c,
                pb::AddRuleRequest {
                    parent,
                    rule: Some(rule(20)),
                    ..Default::default()
                },
            );
            Box::pin(async move { api.add_rule(r).await.map(drop) })
        }
        "/dpu.v1.FilterService/DeleteRule" => {
            let r = by(
                c,
                pb::DeleteRuleRequest {
                    name: format!("{parent}/rules/r1"),
                    expected_version: None,
                },
            );
            Box::pin(async move { api.delete_rule(r).await.map(drop) })
        }
        "/dpu.v1.FilterService/ReplaceRules" => {
            let r = by(
                c,
                pb::ReplaceRulesRequest {
                    parent,
                    rules: vec![rule(5)],
                    expected_version: None,
                },
            );
            Box::pin(async move { api.replace_rules(r).await.map(drop) })
        }
        "/dpu.v1.TenantService/UpdateTenant" => {
            let r = by(
                c,
                pb::UpdateTenantRequest {
                    tenant: Some(pb::Tenant {
                        name: parent,
                        display_name: "renamed".into(),
                        ..Default::default()
                    }),
                    update_mask: Some(dpu_proto::pbjson_types::FieldMask {
                        paths: vec!["display_name".into()],
                    }),
                },
            );
            Box::pin(async move { api.update_tenant(r).await.map(drop) })
        }
        "/dpu.v1.PortService/AttachPort" => {
            let r = by(
                c,
                pb::AttachPortRequest {
                    port: "ports/p0".into(),
                    vlan_id: vlan + 100,
                    tenant: parent,
                },
            );
            Box::pin(async move { api.attach_port(r).await.map(drop) })
        }
        "/dpu.v1.PortService/DetachPort" => {
            let r = by(
                c,
                pb::DetachPortRequest {
                    port: "ports/p0".into(),
                    vlan_id: vlan,
                },
            );
            Box::pin(async move { api.detach_port(r).await.map(drop) })
        }
        other => panic!("no test call for tenant-scoped method {other}"),
    }
}

const TESTED: &[&str] = &[
    "/dpu.v1.FilterService/AddRule",
    "/dpu.v1.FilterService/DeleteRule",
    "/dpu.v1.FilterService/ReplaceRules",
    "/dpu.v1.TenantService/UpdateTenant",
    "/dpu.v1.PortService/AttachPort",
    "/dpu.v1.PortService/DetachPort",
];

/// Every tenant-scoped method is tested below.
#[test]
fn every_tenant_scoped_method_is_tested() {
    let scoped: BTreeSet<&str> = METHODS
        .iter()
        .filter(|(_, p)| *p == Permission::TenantWrite)
        .map(|(m, _)| *m)
        .collect();
    assert_eq!(scoped, TESTED.iter().copied().collect());
}

/// A writer of red is refused each tenant-scoped change to blue, which
/// stays as it was, and the refusal is counted; the same change to red
/// passes. A reader is refused both.
#[tokio::test]
async fn tenant_writers_change_only_their_tenants() {
    let state = StateHandle::open(None).unwrap();
    let api = Api::for_tests(state.clone(), ports(), LIMITS, None, None);
    for (t, vlan) in [("red", 10), ("blue", 20)] {
        api.create_tenant(Request::new(tenant(t, vlan)))
            .await
            .unwrap();
        api.add_rule(Request::new(pb::AddRuleRequest {
            parent: format!("tenants/{t}"),
            rule_id: "r1".into(),
            rule: Some(rule(10)),
            ..Default::default()
        }))
        .await
        .unwrap();
    }
    let writer = Caller {
        label: "cn:red-ops".into(),
        names: "cn:red-ops".into(),
        role: Some(Role::TenantWriter(["red".to_string()].into())),
    };
    let reader = Caller {
        label: "cn:mon".into(),
        names: "cn:mon".into(),
        role: Some(Role::Reader),
    };
    for method in TESTED {
        let before = state.snapshot().tenants.get("blue").cloned();
        for c in [&writer, &reader] {
            let e = call(&api, c, method, "blue", 20).await.unwrap_err();
            assert_eq!(e.code(), Code::PermissionDenied, "{method}: {e:?}");
            assert!(
                e.message().contains(&c.label) && e.message().contains(method),
                "{}",
                e.message()
            );
            assert_eq!(
                state.snapshot().tenants.get("blue").cloned(),
                before,
                "{method} changed blue"
            );
        }
        let e = call(&api, &reader, method, "red", 10).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{method}: {e:?}");
        call(&api, &writer, method, "red", 10)
            .await
            .unwrap_or_else(|e| panic!("{method} on the writer's tenant: {e:?}"));
    }
    let text = api
        .ctl
        .telemetry
        .render_prometheus(&state.snapshot(), &ports());
    assert!(
        text.contains(
            "dpu_grpc_denied_total{method=\"/dpu.v1.FilterService/AddRule\",client=\"cn:red-ops\"} 1\n"
        ),
        "{text}"
    );
}
