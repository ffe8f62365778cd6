//! `dpu.v1.FilterService`.

use std::collections::HashSet;

use dpu_proto::v1 as pb;
use dpu_proto::v1::filter_service_server::FilterService;
use tonic::{Request, Response, Status};

use super::{caller, num_key, paginate, required, Api, PageLimits};
use crate::convert;
use crate::error::ControlError;
use crate::validate;

const RULE_PAGES: PageLimits = PageLimits {
    default: 1000,
    max: 10_000,
};

#[tonic::async_trait]
impl FilterService for Api {
    async fn add_rule(
        &self,
        req: Request<pb::AddRuleRequest>,
    ) -> Result<Response<pb::AddRuleResponse>, Status> {
        const METHOD: &str = "/dpu.v1.FilterService/AddRule";
        self.write(METHOD, async {
            let who = caller(&req);
            let req = req.into_inner();
            let tid = validate::name("parent", &req.parent, "tenants")?.to_string();
            self.may_change_tenant(who.as_deref(), METHOD, &tid)?;
            if !req.rule_id.is_empty() {
                validate::id("rule_id", &req.rule_id)?;
            }
            let pbr = required("rule", req.rule)?;
            let rule = validate::rule("rule", &req.rule_id, &pbr)?;
            let expected = req.expected_version;
            let limits = self.ctl.limits;
            let (rule, version) = self
                .change_tenant(move |s| {
                    let mut rule = rule;
                    if rule.id.is_empty() {
                        let taken: HashSet<String> = s
                            .tenant(&tid)?
                            .rules
                            .rules
                            .iter()
                            .map(|r| r.id.clone())
                            .collect();
                        rule.id = s.next_id("rule", |c| taken.contains(c));
                    }
                    let v = s.add_rule(limits, &tid, rule.clone(), expected)?;
                    Ok(((convert::rule(&tid, &rule), v), tid))
                })
                .await?;
            Ok(pb::AddRuleResponse {
                rule: Some(rule),
                rule_set_version: version,
            })
        })
        .await
    }

    async fn get_rule(
        &self,
        req: Request<pb::GetRuleRequest>,
    ) -> Result<Response<pb::FilterRule>, Status> {
        self.read("/dpu.v1.FilterService/GetRule", async {
            let (tid, rid) = validate::rule_name("name", &req.get_ref().name)?;
            let state = self.ctl.state.snapshot();
            let t = state.tenant(tid)?;
            let r = t
                .rules
                .rules
                .iter()
                .find(|r| r.id == rid)
                .ok_or_else(|| ControlError::NotFound(format!("tenants/{tid}/rules/{rid}")))?;
            Ok(convert::rule(tid, r))
        })
        .await
    }

    async fn delete_rule(
        &self,
        req: Request<pb::DeleteRuleRequest>,
    ) -> Result<Response<pb::DeleteRuleResponse>, Status> {
        const METHOD: &str = "/dpu.v1.FilterService/DeleteRule";
        self.write(METHOD, async {
            let who = caller(&req);
            let req = req.into_inner();
            let (tid, rid) = validate::rule_name("name", &req.name)?;
            self.may_change_tenant(who.as_deref(), METHOD, tid)?;
            let (tid, rid) = (tid.to_string(), rid.to_string());
            let v = self
                .change_tenant(move |s| {
                    let v = s.delete_rule(&tid, &rid, req.expected_version)?;
                    Ok((v, tid))
                })
                .await?;
            Ok(pb::DeleteRuleResponse {
                rule_set_version: v,
            })
        })
        .await
    }

    async fn list_rules(
        &self,
        req: Request<pb::ListRulesRequest>,
    ) -> Result<Response<pb::ListRulesResponse>, Status> {
        self.read("/dpu.v1.FilterService/ListRules", async {
            let req = req.into_inner();
            let tid = validate::name("parent", &req.parent, "tenants")?;
            let state = self.ctl.state.snapshot();
            let t = state.tenant(tid)?;
            let items = t.rules.rules.iter().map(|r| (num_key(r.priority), r));
            let (rules, next_page_token) =
                paginate(items, req.page_size, &req.page_token, RULE_PAGES, |r| {
                    convert::rule(tid, r)
                })?;
            Ok(pb::ListRulesResponse {
                rules,
                next_page_token,
                rule_set_version: t.rules.version,
            })
        })
        .await
    }

    async fn replace_rules(
        &self,
        req: Request<pb::ReplaceRulesRequest>,
    ) -> Result<Response<pb::ReplaceRulesResponse>, Status> {
        const METHOD: &str = "/dpu.v1.FilterService/ReplaceRules";
        self.write(METHOD, async {
            let who = caller(&req);
            let req = req.into_inner();
            // The tenant first: a writer of another tenant learns nothing
            // from how its rules validate.
            let tid = validate::name("parent", &req.parent, "tenants")?;
            self.may_change_tenant(who.as_deref(), METHOD, tid)?;
            let limits = self.ctl.limits;
            // Before converting anything: the state checks the same cap,
            // with the tenant's own count, once the rules are converted.
            if req.rules.len() > limits.rules_per_tenant {
                return Err(ControlError::exhausted(
                    "limits.max_rules_per_tenant",
                    limits.rules_per_tenant,
                    format!("{} rules in {}", req.rules.len(), req.parent),
                ));
            }
            let (tid, rules) = validate::replace_rules(&req)?;
            let count = u32::try_from(rules.len()).unwrap_or(u32::MAX);
            let v = self
                .change_tenant(move |s| {
                    let v = s.replace_rules(limits, &tid, rules, req.expected_version)?;
                    Ok((v, tid))
                })
                .await?;
            Ok(pb::ReplaceRulesResponse {
                rule_set_version: v,
                rule_count: count,
            })
        })
        .await
    }
}
