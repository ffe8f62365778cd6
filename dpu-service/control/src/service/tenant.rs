//! `dpu.v1.TenantService`.

use dpu_proto::v1 as pb;
use dpu_proto::v1::tenant_service_server::TenantService;
use tonic::{Request, Response, Status};

use super::{caller, mask_paths, paginate, required, Api, PAGES};
use crate::convert;
use crate::error::ControlError;
use crate::model::{RuleSet, Tenant, Timestamp};
use crate::state::TenantUpdate;
use crate::validate;

#[tonic::async_trait]
impl TenantService for Api {
    async fn create_tenant(
        &self,
        req: Request<pb::CreateTenantRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        self.write("/dpu.v1.TenantService/CreateTenant", async {
            let req = req.into_inner();
            validate::id("tenant_id", &req.tenant_id)?;
            let t = required("tenant", req.tenant)?;
            validate::text("tenant.display_name", &t.display_name)?;
            if t.storage_qos.is_some() {
                return Err(ControlError::invalid(
                    "tenant.storage_qos",
                    "output only: set the tenant's storage limits with SetTenantStorageQos \
                     once it is created",
                ));
            }
            let tenant = Tenant {
                id: req.tenant_id.clone(),
                display_name: t.display_name,
                attachments: validate::attachments("tenant.attachments", &t.attachments)?,
                default_policy: validate::default_policy(
                    "tenant.default_policy",
                    t.default_policy,
                )?,
                create_time: Timestamp::now(),
                rules: RuleSet::default(),
                storage_qos: Default::default(),
                vlan_id: validate::vlan("tenant.vlan_id", t.vlan_id)?,
                no_offload: t.no_offload,
            };
            let ctl = self.ctl.clone();
            let out = convert::tenant(&tenant);
            self.change_tenant(move |s| {
                let id = tenant.id.clone();
                s.create_tenant(ctl.limits, &ctl.ports, tenant)
                    .map(|()| ((), id))
            })
            .await?;
            Ok(out)
        })
        .await
    }

    async fn get_tenant(
        &self,
        req: Request<pb::GetTenantRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        self.read("/dpu.v1.TenantService/GetTenant", async {
            let id = validate::name("name", &req.get_ref().name, "tenants")?;
            Ok(convert::tenant(self.ctl.state.snapshot().tenant(id)?))
        })
        .await
    }

    async fn list_tenants(
        &self,
        req: Request<pb::ListTenantsRequest>,
    ) -> Result<Response<pb::ListTenantsResponse>, Status> {
        self.read("/dpu.v1.TenantService/ListTenants", async {
            let req = req.into_inner();
            let state = self.ctl.state.snapshot();
            let items = state.tenants.iter().map(|(k, t)| (k.as_str(), t));
            let (tenants, next_page_token) = paginate(
                items,
                req.page_size,
                &req.page_token,
                PAGES,
                convert::tenant,
            )?;
            Ok(pb::ListTenantsResponse {
                tenants,
                next_page_token,
            })
        })
        .await
    }

    async fn update_tenant(
        &self,
        req: Request<pb::UpdateTenantRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        const METHOD: &str = "/dpu.v1.TenantService/UpdateTenant";
        self.write(METHOD, async {
            let who = caller(&req);
            let req = req.into_inner();
            let t = required("tenant", req.tenant)?;
            let id = validate::name("tenant.name", &t.name, "tenants")?.to_string();
            self.may_change_tenant(who.as_deref(), METHOD, &id)?;
            let paths = mask_paths(
                req.update_mask.as_ref(),
                &[
                    "display_name",
                    "default_policy",
                    "attachments",
                    "vlan_id",
                    "no_offload",
                ],
            )?;
            let mut u = TenantUpdate::default();
            for p in &paths {
                match p.as_str() {
                    "display_name" => {
                        validate::text("tenant.display_name", &t.display_name)?;
                        u.display_name = Some(t.display_name.clone());
                    }
                    "default_policy" => {
                        u.default_policy = Some(validate::default_policy(
                            "tenant.default_policy",
                            t.default_policy,
                        )?);
                    }
                    "vlan_id" => u.vlan_id = Some(validate::vlan("tenant.vlan_id", t.vlan_id)?),
                    "no_offload" => u.no_offload = Some(t.no_offload),
                    _ => {
                        u.attachments =
                            Some(validate::attachments("tenant.attachments", &t.attachments)?)
                    }
                }
            }
            let ctl = self.ctl.clone();
            let updated = self
                .change_tenant(move |s| {
                    let t = convert::tenant(s.update_tenant(ctl.limits, &ctl.ports, &id, u)?);
                    Ok((t, id))
                })
                .await?;
            Ok(updated)
        })
        .await
    }

    async fn delete_tenant(
        &self,
        req: Request<pb::DeleteTenantRequest>,
    ) -> Result<Response<pb::DeleteTenantResponse>, Status> {
        self.write("/dpu.v1.TenantService/DeleteTenant", async {
            let req = req.into_inner();
            let id = validate::name("name", &req.name, "tenants")?.to_string();
            self.change_tenant(move |s| s.delete_tenant(&id, req.force).map(|()| ((), id)))
                .await?;
            Ok(pb::DeleteTenantResponse {})
        })
        .await
    }

    async fn set_tenant_storage_qos(
        &self,
        req: Request<pb::SetTenantStorageQosRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        self.write("/dpu.v1.TenantService/SetTenantStorageQos", async {
            let req = req.into_inner();
            let id = validate::name("tenant", &req.tenant, "tenants")?.to_string();
            let qos = validate::qos("qos", req.qos.as_ref())?;
            // A storage change: it returns once the tenant's target (if
            // it has storage endpoints) holds the limits. Setting limits
            // cannot fail there, so there is nothing to undo.
            self.change_storage(move |s| {
                Ok((convert::tenant(s.set_tenant_storage_qos(&id, qos)?), None))
            })
            .await
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use dpu_proto::v1::filter_service_server::FilterService;
    use tokio::sync::watch;
    use tonic::Code;

    use super::*;
    use crate::apply::Problem;
    use crate::model::{PortRole, PortSpec, State};
    use crate::service::testing::{follower, stored, LIMITS};
    use crate::state::PortRegistry;
    use crate::store::StateHandle;

    /// A stand-in for the switch: it refuses a state in which a rule's
    /// description is "refuse me", naming that rule's tenant.
    fn judge(s: &State) -> Result<Vec<Problem>, (String, Vec<String>)> {
        for t in s.tenants.values() {
            if let Some(r) = t.rules.rules.iter().find(|r| r.description == "refuse me") {
                return Err((
                    format!("tenant {}: rule {} does not compile", t.id, r.id),
                    vec![format!("tenants/{}", t.id)],
                ));
            }
        }
        Ok(Vec::new())
    }

    fn p0() -> PortRegistry {
        let p = PortSpec {
            id: "p0".into(),
            driver: "none".into(),
            device: String::new(),
            role: PortRole::Software,
            vtep_address: None,
        };
        [("p0".to_string(), p)].into()
    }

    fn create(id: &str, vlan: u32) -> Request<pb::CreateTenantRequest> {
        Request::new(pb::CreateTenantRequest {
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
        })
    }

    fn add_rule(id: &str, description: &str) -> Request<pb::AddRuleRequest> {
        Request::new(pb::AddRuleRequest {
            parent: "tenants/red".into(),
            rule_id: id.into(),
            rule: Some(pb::FilterRule {
                priority: 10,
                action: pb::RuleAction::Deny as i32,
                description: description.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// A tenant call returns once the switch has taken its change; one
    /// the switch refuses is undone (in the state file too) and fails
    /// naming why, while a change published between it and the refusal
    /// waits for the state without it, and stays.
    #[tokio::test]
    async fn a_change_the_switch_refuses_is_undone_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateHandle::open(Some(dir.path())).unwrap();
        let (pause, paused) = watch::channel(false);
        let (applied, seen) = follower("the switch", &state, judge, paused);
        let api = Api::for_tests(state.clone(), p0(), LIMITS, None, Some(applied));
        api.create_tenant(create("red", 10)).await.unwrap();
        let g = state.published().generation;

        pause.send_replace(true);
        let refused = tokio::spawn({
            let api = api.clone();
            async move { api.add_rule(add_rule("bad", "refuse me")).await }
        });
        stored(&state, g + 1).await;
        let blue = tokio::spawn({
            let api = api.clone();
            async move { api.create_tenant(create("blue", 20)).await }
        });
        stored(&state, g + 2).await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(
            !refused.is_finished() && !blue.is_finished(),
            "no call returns before the switch has taken its change"
        );
        pause.send_replace(false);

        blue.await.unwrap().unwrap();
        let err = refused.await.unwrap().unwrap_err();
        assert_eq!(err.code(), Code::Internal, "{err:?}");
        assert_eq!(
            err.message(),
            "the switch refused the state holding the change \
             (tenant red: rule bad does not compile); the change was undone"
        );
        let now = state.published();
        assert_eq!(now.generation, g + 3, "the undo is a change of its own");
        assert!(now.state.tenants.contains_key("blue"));
        let red = &now.state.tenants["red"].rules;
        assert!(red.rules.is_empty());
        assert_eq!(red.version, 2, "the undo is a new version");
        assert_eq!(
            *seen.lock().unwrap().state,
            *now.state,
            "the switch took it"
        );
        drop(state);
        let reopened = StateHandle::open(Some(dir.path())).unwrap();
        assert_eq!(*reopened.snapshot(), *now.state, "the undo is persisted");

        let added = api.add_rule(add_rule("good", "")).await.unwrap();
        assert_eq!(added.into_inner().rule_set_version, 3);
    }

    /// SetTenantStorageQos names the field it refuses, NOT_FOUND an
    /// unknown tenant; what it sets is in Get and List, all zero clears
    /// it, and CreateTenant takes none.
    #[tokio::test]
    async fn storage_qos_is_set_shown_and_cleared() {
        let state = StateHandle::open(None).unwrap();
        let api = Api::for_tests(state.clone(), p0(), LIMITS, None, None);
        api.create_tenant(create("red", 10)).await.unwrap();
        let set = |tenant: &str, qos| {
            api.set_tenant_storage_qos(Request::new(pb::SetTenantStorageQosRequest {
                tenant: tenant.into(),
                qos,
            }))
        };
        let limits = pb::QosLimits {
            read_iops: 100,
            bandwidth: 1 << 30,
            ..Default::default()
        };
        let got = set("tenants/red", Some(limits)).await.unwrap().into_inner();
        assert_eq!(got.storage_qos, Some(limits));
        let listed = api
            .list_tenants(Request::new(pb::ListTenantsRequest::default()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.tenants[0].storage_qos, Some(limits));
        assert_eq!(state.snapshot().tenants["red"].storage_qos.read_iops, 100);
        let zero = set("tenants/red", Some(pb::QosLimits::default()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(zero.storage_qos, None);
        let got = api
            .get_tenant(Request::new(pb::GetTenantRequest {
                name: "tenants/red".into(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.storage_qos, None, "cleared");
        let e = set("tenants/blue", None).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        let e = set("red", None).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let over = pb::QosLimits {
            write_iops: validate::MAX_QOS_IOPS + 1,
            ..Default::default()
        };
        let e = set("tenants/red", Some(over)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().starts_with("qos.write_iops: "), "{e:?}");

        let mut req = create("blue", 20);
        req.get_mut().tenant.as_mut().unwrap().storage_qos = Some(limits);
        let e = api.create_tenant(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().starts_with("tenant.storage_qos: "), "{e:?}");
    }
}
