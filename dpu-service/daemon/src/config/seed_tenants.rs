//! Tenants declared in the configuration (`[[tenants]]`), created at
//! startup through the same `TenantService` and `FilterService` calls a
//! gRPC client makes (`CreateTenant`, then `AddRule` for each rule and
//! `SetTenantStorageQos` for its storage limits), so every validation, ID
//! assignment and persistence rule applies.
//!
//! A declared tenant whose ID is already in the state is left as stored:
//! once created, the state is the source of truth and changes made over
//! gRPC (rules added or deleted, attachments moved) survive restarts.

use anyhow::{anyhow, Result};
use dpu_control::service::Api;
use dpu_proto::v1 as pb;
use dpu_proto::v1::filter_service_server::FilterService;
use dpu_proto::v1::tenant_service_server::TenantService;
use tonic::{Code, Request, Status};

use crate::config::seed::{already_stored, fill_or_undo};
use crate::config::{seed_key, SeedTenant};

/// Creates the declared tenants the state does not have yet, each with its
/// rules, in declaration order.
///
/// # Errors
/// The first refusal, naming the configuration entry and the API's message.
/// A tenant created before one of its rules was refused is deleted again,
/// so a corrected configuration applies at the next start; tenants
/// completed before it are kept.
pub async fn seed_tenants(api: &Api, tenants: &[SeedTenant]) -> Result<()> {
    for (i, t) in tenants.iter().enumerate() {
        let at = format!("tenants[{i}]");
        let name = format!("tenants/{}", t.id);
        let stored = api.get_tenant(Request::new(pb::GetTenantRequest { name: name.clone() }));
        if already_stored(&at, "tenant", &t.id, stored.await)? {
            continue;
        }
        api.create_tenant(Request::new(pb::CreateTenantRequest {
            tenant_id: t.id.clone(),
            tenant: Some(t.to_proto(&at)?),
        }))
        .await
        .map_err(|e| refusal(&at, &t.id, "tenant", &e))?;
        let fill = async {
            add_rules(api, &at, &name, t).await?;
            set_storage_qos(api, &at, &name, t).await
        };
        fill_or_undo("tenant", &t.id, fill, || {
            api.delete_tenant(Request::new(pb::DeleteTenantRequest {
                name: name.clone(),
                force: true,
            }))
        })
        .await?;
        tracing::info!(
            tenant = %t.id,
            attachments = t.attachments.len(),
            rules = t.rules.len(),
            "tenant created from the configuration"
        );
    }
    Ok(())
}

/// Adds the declared rules of the just created tenant `name`, declared at
/// `at`: those with an ID first, so an ID the service assigns to another
/// rule cannot take one the configuration names.
async fn add_rules(api: &Api, at: &str, name: &str, t: &SeedTenant) -> Result<()> {
    let (named, unnamed): (Vec<_>, Vec<_>) = t
        .rules
        .iter()
        .enumerate()
        .partition(|(_, r)| r.id.is_some());
    for (j, r) in named.into_iter().chain(unnamed) {
        let at = format!("{at}.rules[{j}]");
        api.add_rule(Request::new(pb::AddRuleRequest {
            parent: name.to_string(),
            rule_id: r.id.clone().unwrap_or_default(),
            rule: Some(r.to_proto(&at)?),
            ..Default::default()
        }))
        .await
        .map_err(|e| refusal(&at, "", "rule", &e))?;
    }
    Ok(())
}

/// Sets the declared storage limits of the just created tenant `name`,
/// declared at `at`, if it has any.
async fn set_storage_qos(api: &Api, at: &str, name: &str, t: &SeedTenant) -> Result<()> {
    let Some(q) = &t.storage_qos else {
        return Ok(());
    };
    let qos = q
        .to_proto("storage_qos")
        .map_err(|e| anyhow!("{at}: {e:#}"))?;
    api.set_tenant_storage_qos(Request::new(pb::SetTenantStorageQosRequest {
        tenant: name.to_string(),
        qos: Some(qos),
    }))
    .await
    .map_err(|e| refusal(&format!("{at}.storage_qos"), "", "qos", &e))?;
    Ok(())
}

/// The API's refusal of the entry at `at` (of ID `id`, if given): an
/// `INVALID_ARGUMENT` names the field by its configuration key
/// (`rule.dst_prefix: ...` becomes `{at}.dst: ...`), anything else is the
/// API's message after the entry.
fn refusal(at: &str, id: &str, api_head: &str, e: &Status) -> anyhow::Error {
    let id = if id.is_empty() {
        String::new()
    } else {
        format!(" ({id:?})")
    };
    if e.code() == Code::InvalidArgument {
        if let Some((field, reason)) = e.message().split_once(": ") {
            if let Some(rel) = field
                .strip_prefix(api_head)
                .and_then(|f| f.strip_prefix('.'))
            {
                return anyhow!("{at}.{}: {reason}", seed_key(rel));
            }
        }
    }
    anyhow!("{at}{id}: {}", e.message())
}

#[cfg(test)]
mod tests {
    use dpu_control::model::{Action, PortRole, PortSpec};
    use dpu_control::store::StateHandle;

    use super::*;
    use crate::config::Config;

    /// An API over a fresh in-memory state with ports p0, pf0vf0..pf0vf2.
    fn api() -> (Api, StateHandle) {
        let ports = ["p0", "pf0vf0", "pf0vf1", "pf0vf2"]
            .into_iter()
            .map(|id| {
                (
                    id.to_string(),
                    PortSpec {
                        id: id.to_string(),
                        driver: "none".into(),
                        device: String::new(),
                        role: if id == "p0" {
                            PortRole::Uplink
                        } else {
                            PortRole::Vf
                        },
                        vtep_address: None,
                    },
                )
            })
            .collect();
        crate::config::seed::tests::api_with(ports, 1 << 20)
    }

    /// The ports [`api`] knows, as configuration.
    const PORTS: &str = r#"
[[ports]]
id = "p0"
role = "uplink"
[[ports]]
id = "pf0vf0"
[[ports]]
id = "pf0vf1"
[[ports]]
id = "pf0vf2"
"#;

    /// A tenant "demo" on pf0vf0 and pf0vf1, default deny, with a stateful
    /// ICMP echo rule, a TCP rule and a deny rule.
    const DEMO: &str = r#"
[[tenants]]
id = "demo"
display_name = "Demo tenant"
default_policy = "deny"
attachments = ["pf0vf0", "pf0vf1", "p0.100"]

[[tenants.rules]]
id = "no-telnet"
priority = 5
action = "deny"
proto = "tcp"
dport = 23
description = "never telnet"

[[tenants.rules]]
priority = 10
action = "allow"
src = "10.20.0.0/24"
proto = "icmp"
icmp_type = 8
icmp_code = 0
stateful = true

[[tenants.rules]]
id = "web"
priority = 20
action = "allow"
dst = "10.20.0.0/24"
proto = 6
sport = "1024-65535"
dport = "80-443"
stateful = true
"#;

    /// `[[tenants]]` of a configuration that passes its checks.
    fn tenants(text: &str) -> Vec<SeedTenant> {
        let c: Config = toml::from_str(&format!("{PORTS}{text}")).expect("config parses");
        c.validate().expect("config is valid");
        c.tenants
    }

    /// `[[tenants]]` of a configuration, unchecked: what the API refuses.
    fn unchecked(text: &str) -> Vec<SeedTenant> {
        toml::from_str::<Config>(&format!("{PORTS}{text}"))
            .expect("config parses")
            .tenants
    }

    #[tokio::test]
    async fn creates_the_tenant_and_its_rules() {
        let (api, state) = api();
        seed_tenants(&api, &tenants(DEMO)).await.unwrap();
        let s = state.snapshot();
        assert_eq!(s.tenants.len(), 1);
        let t = &s.tenants["demo"];
        assert_eq!(t.display_name, "Demo tenant");
        assert_eq!(t.default_policy, Action::Deny);
        let atts: Vec<String> = t.attachments.iter().map(ToString::to_string).collect();
        assert_eq!(atts.len(), 3, "{atts:?}");
        assert!(t.attachments[0].is_port_vlan("pf0vf0", 0));
        assert!(t.attachments[1].is_port_vlan("pf0vf1", 0));
        assert!(t.attachments[2].is_port_vlan("p0", 100));
        let rules = &t.rules.rules;
        assert_eq!(t.rules.version, 3, "one AddRule per rule");
        let ids: Vec<&str> = rules.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["no-telnet", "rule-1", "web"], "in priority order");
        let deny = &rules[0];
        assert_eq!(deny.action, Action::Deny);
        assert_eq!(deny.protocol, Some(6));
        let d = deny.dst_ports.unwrap();
        assert_eq!((d.first, d.last), (23, 23));
        assert_eq!(deny.description, "never telnet");
        let echo = &rules[1];
        assert_eq!(echo.src.unwrap().to_string(), "10.20.0.0/24");
        assert!(echo.dst.is_none());
        assert_eq!(
            (echo.protocol, echo.icmp_type, echo.icmp_code),
            (Some(1), Some(8), Some(0))
        );
        assert!(echo.stateful);
        let web = &rules[2];
        assert_eq!(web.dst.unwrap().to_string(), "10.20.0.0/24");
        let (sp, dp) = (web.src_ports.unwrap(), web.dst_ports.unwrap());
        assert_eq!(
            (sp.first, sp.last, dp.first, dp.last),
            (1024, 65535, 80, 443)
        );
        assert!(web.stateful && web.action == Action::Allow);
    }

    /// `storage_qos` sets the tenant's storage limits; a bad one names
    /// its key, and the tenant is not created.
    #[tokio::test]
    async fn storage_qos_is_set_or_named_in_the_error() {
        let (api, state) = api();
        let text = "[[tenants]]\nid = \"blue\"\n\
                    storage_qos = { iops = 5000, bandwidth = \"1G\" }\n";
        seed_tenants(&api, &tenants(text)).await.unwrap();
        let q = state.snapshot().tenants["blue"].storage_qos;
        assert_eq!((q.iops, q.bandwidth, q.read_iops), (5000, 1 << 30, 0));

        for (qos, want) in [
            (
                "{ iops = 2000000000 }",
                "tenants[0].storage_qos.iops: 2000000000 is more than 1000000000 commands per second",
            ),
            (
                "{ write_bandwidth = \"lots\" }",
                "tenants[0]: storage_qos.write_bandwidth: \"lots\" is not a size",
            ),
        ] {
            let (api, state) = super::tests::api();
            let text = format!("[[tenants]]\nid = \"red\"\nstorage_qos = {qos}\n");
            let e = seed_tenants(&api, &unchecked(&text)).await.unwrap_err();
            assert!(format!("{e:#}").starts_with(want), "{e:#}");
            assert!(state.snapshot().tenants.is_empty(), "undone");
        }
        assert!(
            toml::from_str::<Config>("[[tenants]]\nid = \"x\"\nstorage_qos = { iosp = 1 }\n")
                .is_err()
        );
    }

    #[tokio::test]
    async fn defaults_are_the_apis() {
        let (api, state) = api();
        seed_tenants(&api, &tenants("[[tenants]]\nid = \"bare\"\n"))
            .await
            .unwrap();
        let s = state.snapshot();
        let t = &s.tenants["bare"];
        assert_eq!(t.display_name, "");
        assert_eq!(t.default_policy, Action::Deny, "unset means deny");
        assert!(t.attachments.is_empty() && t.rules.rules.is_empty());
        assert_eq!(t.rules.version, 0);
    }

    #[tokio::test]
    async fn seeding_again_keeps_the_stored_tenant() {
        let (api, state) = api();
        let cfg = tenants(DEMO);
        seed_tenants(&api, &cfg).await.unwrap();
        let created = state.snapshot().tenants["demo"].clone();

        // Seeding again (a restart) changes nothing.
        seed_tenants(&api, &cfg).await.unwrap();
        assert_eq!(state.snapshot().tenants["demo"], created);

        // Changed over gRPC, then seeded again: kept as stored, not
        // completed from the configuration.
        api.delete_rule(Request::new(pb::DeleteRuleRequest {
            name: "tenants/demo/rules/web".into(),
            ..Default::default()
        }))
        .await
        .unwrap();
        seed_tenants(&api, &cfg).await.unwrap();
        let s = state.snapshot();
        let t = &s.tenants["demo"];
        assert_eq!(t.rules.rules.len(), 2, "the deleted rule stays deleted");
        assert_eq!(t.rules.version, 4);
        assert_eq!(t.create_time, created.create_time);

        // Deleted over gRPC: the next start creates it again.
        api.delete_tenant(Request::new(pb::DeleteTenantRequest {
            name: "tenants/demo".into(),
            force: true,
        }))
        .await
        .unwrap();
        seed_tenants(&api, &cfg).await.unwrap();
        assert_eq!(state.snapshot().tenants["demo"].rules.rules.len(), 3);
    }

    #[tokio::test]
    async fn an_attachment_taken_in_the_state_is_an_error() {
        let (api, state) = api();
        seed_tenants(
            &api,
            &tenants("[[tenants]]\nid = \"other\"\nattachments = [\"pf0vf1\"]\n"),
        )
        .await
        .unwrap();
        let e = format!(
            "{:#}",
            seed_tenants(&api, &tenants(DEMO)).await.unwrap_err()
        );
        assert!(e.starts_with("tenants[0] (\"demo\"): "), "{e}");
        assert!(e.contains("tenants/other"), "{e}");
        let s = state.snapshot();
        assert_eq!(s.tenants.keys().collect::<Vec<_>>(), ["other"]);
    }

    #[tokio::test]
    async fn a_refused_rule_names_its_key_and_leaves_nothing_behind() {
        let (api, state) = api();
        // Host bits set: the configuration's checks refuse it too, but the
        // API's refusal names the same key.
        let cfg = unchecked(&DEMO.replace("dst = \"10.20.0.0/24\"", "dst = \"10.20.0.1/24\""));
        let e = format!("{:#}", seed_tenants(&api, &cfg).await.unwrap_err());
        assert!(
            e.starts_with("tenants[0].rules[2].dst: host bits are set in 10.20.0.1/24"),
            "{e}"
        );
        assert!(
            e.ends_with("(the partly created tenant \"demo\" was deleted again)"),
            "{e}"
        );
        assert!(state.snapshot().tenants.is_empty());
        // A corrected configuration applies next time.
        seed_tenants(&api, &tenants(DEMO)).await.unwrap();
        assert_eq!(state.snapshot().tenants["demo"].rules.rules.len(), 3);
    }

    #[tokio::test]
    async fn complete_tenants_before_a_failure_are_kept() {
        let (api, state) = api();
        let cfg = unchecked(&format!(
            "{DEMO}[[tenants]]\nid = \"blue\"\nattachments = [\"pf0vf2\"]\n\
             [[tenants.rules]]\npriority = 1\naction = \"deny\"\nstateful = true\n"
        ));
        let e = format!("{:#}", seed_tenants(&api, &cfg).await.unwrap_err());
        assert!(
            e.starts_with("tenants[1].rules[0].stateful: only ALLOW rules can be stateful"),
            "{e}"
        );
        let s = state.snapshot();
        assert_eq!(s.tenants.keys().collect::<Vec<_>>(), ["demo"]);
    }

    #[tokio::test]
    async fn nothing_declared_is_nothing_done() {
        let (api, state) = api();
        seed_tenants(&api, &[]).await.unwrap();
        assert!(state.snapshot().tenants.is_empty());
    }
}
