//! `dpu.v1.TenantService`.

use dpu_proto::v1 as pb;
use dpu_proto::v1::tenant_service_server::TenantService;
use tonic::{Request, Response, Status};

use super::{mask_paths, paginate, required, Api, PAGES};
use crate::convert;
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
            };
            let ctl = self.ctl.clone();
            let out = convert::tenant(&tenant);
            self.ctl
                .state
                .mutate(move |s| s.create_tenant(&ctl.ports, tenant))
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
            let items = state
                .tenants
                .iter()
                .map(|(k, t)| (k.clone(), convert::tenant(t)));
            let (tenants, next_page_token) =
                paginate(items, req.page_size, &req.page_token, PAGES)?;
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
        self.write("/dpu.v1.TenantService/UpdateTenant", async {
            let req = req.into_inner();
            let t = required("tenant", req.tenant)?;
            let id = validate::name("tenant.name", &t.name, "tenants")?.to_string();
            let paths = mask_paths(
                req.update_mask.as_ref(),
                &["display_name", "default_policy", "attachments"],
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
                    _ => {
                        u.attachments =
                            Some(validate::attachments("tenant.attachments", &t.attachments)?)
                    }
                }
            }
            let ctl = self.ctl.clone();
            let updated = self
                .ctl
                .state
                .mutate(move |s| s.update_tenant(&ctl.ports, &id, u).map(convert::tenant))
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
            self.ctl
                .state
                .mutate(move |s| s.delete_tenant(&id, req.force))
                .await?;
            Ok(pb::DeleteTenantResponse {})
        })
        .await
    }
}
