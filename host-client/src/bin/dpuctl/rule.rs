//! `dpuctl rule`: its subcommands and flags, and their handler.

use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};
use dpu_client::{pb, rule_name, tenant_name, DpuClient};
use dpu_proto::text::{port_range, protocol, rate_limit};
use serde_json::Value;

use crate::common::{all_pages, json, read, Paging, Shown};
use crate::{render, Failure};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RuleAction {
    Allow,
    Deny,
}

#[derive(Debug, Subcommand)]
pub enum RuleCmd {
    /// Adds a rule.
    Add {
        /// Tenant ID.
        tenant: String,
        /// Rule ID (assigned by the service if absent).
        #[arg(long)]
        id: Option<String>,
        /// Evaluation order, lower first.
        #[arg(long)]
        priority: u32,
        /// What a match does.
        #[arg(long, value_enum)]
        action: RuleAction,
        /// Source prefix (CIDR).
        #[arg(long)]
        src: Option<String>,
        /// Destination prefix (CIDR).
        #[arg(long)]
        dst: Option<String>,
        /// Source ports: PORT or FIRST-LAST.
        #[arg(long, value_name = "A[-B]", value_parser = port_range)]
        sport: Option<pb::PortRange>,
        /// Destination ports: PORT or FIRST-LAST.
        #[arg(long, value_name = "A[-B]", value_parser = port_range)]
        dport: Option<pb::PortRange>,
        /// IP protocol: tcp, udp, icmp, icmpv6, sctp or a number.
        #[arg(long, value_parser = protocol)]
        proto: Option<u32>,
        /// ICMP type.
        #[arg(long)]
        icmp_type: Option<u32>,
        /// ICMP code.
        #[arg(long)]
        icmp_code: Option<u32>,
        /// Track connections so replies pass (allow rules only).
        #[arg(long)]
        stateful: bool,
        /// Most traffic the rule lets through (allow rules only): packets
        /// or bits per second with an optional k/M/G/T prefix, e.g.
        /// `1000pps`, `2.5kpps`, `10Mbps`.
        #[arg(long, value_name = "RATE", value_parser = rate_limit)]
        rate_limit: Option<pb::RateLimit>,
        /// Depth of the rate limit's bucket: packets for a pps limit, bytes
        /// for a bps one (default a tenth of a second's worth).
        #[arg(long, requires = "rate_limit")]
        burst: Option<u64>,
        /// Free-form description.
        #[arg(long, default_value = "")]
        description: String,
        /// Refuse unless the rule set is at this version.
        #[arg(long)]
        expect_version: Option<u64>,
    },
    /// Shows a rule.
    Get {
        /// Tenant ID.
        tenant: String,
        /// Rule ID.
        rule: String,
    },
    /// Deletes a rule.
    Delete {
        /// Tenant ID.
        tenant: String,
        /// Rule ID.
        rule: String,
        /// Refuse unless the rule set is at this version.
        #[arg(long)]
        expect_version: Option<u64>,
    },
    /// Lists a tenant's rules in evaluation order.
    List {
        /// Tenant ID.
        tenant: String,
        #[command(flatten)]
        paging: Paging,
    },
    /// Replaces a tenant's whole rule set from a JSON file.
    Replace {
        /// Tenant ID.
        tenant: String,
        /// JSON array of FilterRule objects (proto3 JSON); "-" reads stdin.
        #[arg(long)]
        file: PathBuf,
        /// Refuse unless the rule set is at this version.
        #[arg(long)]
        expect_version: Option<u64>,
    },
}

fn version_line(json: Value, text: String, version: u64) -> Shown {
    Shown {
        json,
        text: format!("{text}rule set version {version}\n"),
    }
}

/// `dpuctl rule ...`.
pub async fn execute(c: &DpuClient, cmd: &RuleCmd) -> Result<Shown, Failure> {
    Ok(match cmd {
        RuleCmd::Add {
            tenant,
            id,
            priority,
            action,
            src,
            dst,
            sport,
            dport,
            proto,
            icmp_type,
            icmp_code,
            stateful,
            rate_limit,
            burst,
            description,
            expect_version,
        } => {
            let rate_limit = rate_limit.map(|l| pb::RateLimit {
                burst: burst.unwrap_or(0),
                ..l
            });
            let rule = pb::FilterRule {
                priority: *priority,
                src_prefix: src.clone().unwrap_or_default(),
                dst_prefix: dst.clone().unwrap_or_default(),
                src_ports: *sport,
                dst_ports: *dport,
                ip_protocol: *proto,
                icmp_type: *icmp_type,
                icmp_code: *icmp_code,
                action: match action {
                    RuleAction::Allow => pb::RuleAction::Allow as i32,
                    RuleAction::Deny => pb::RuleAction::Deny as i32,
                },
                stateful: *stateful,
                description: description.clone(),
                rate_limit,
                ..Default::default()
            };
            let r = c
                .add_rule(pb::AddRuleRequest {
                    parent: tenant_name(tenant),
                    rule_id: id.clone().unwrap_or_default(),
                    rule: Some(rule),
                    expected_version: *expect_version,
                })
                .await?;
            let rules: Vec<pb::FilterRule> = r.rule.clone().into_iter().collect();
            version_line(json(&r), render::rules(&rules), r.rule_set_version)
        }
        RuleCmd::Get { tenant, rule } => {
            let r = c
                .get_rule(pb::GetRuleRequest {
                    name: rule_name(tenant, rule),
                })
                .await?;
            Shown {
                json: json(&r),
                text: render::rules(std::slice::from_ref(&r)),
            }
        }
        RuleCmd::Delete {
            tenant,
            rule,
            expect_version,
        } => {
            let r = c
                .delete_rule(pb::DeleteRuleRequest {
                    name: rule_name(tenant, rule),
                    expected_version: *expect_version,
                })
                .await?;
            version_line(
                json(&r),
                format!("deleted {}\n", rule_name(tenant, rule)),
                r.rule_set_version,
            )
        }
        RuleCmd::List { tenant, paging } => {
            let parent = tenant_name(tenant);
            let all = all_pages(|page_token| {
                let parent = parent.clone();
                async move {
                    let r = c
                        .list_rules(pb::ListRulesRequest {
                            parent,
                            page_size: paging.page_size,
                            page_token,
                        })
                        .await?;
                    Ok((r.rules, r.next_page_token))
                }
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::rules(&all),
            }
        }
        RuleCmd::Replace {
            tenant,
            file,
            expect_version,
        } => {
            let bytes = if file.as_os_str() == "-" {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
                    .map_err(|e| Failure::Other(format!("reading stdin: {e}")))?;
                b
            } else {
                read(file)?
            };
            let rules: Vec<pb::FilterRule> = serde_json::from_slice(&bytes).map_err(|e| {
                Failure::Input(format!(
                    "{}: not a JSON array of FilterRule: {e}",
                    file.display()
                ))
            })?;
            let r = c
                .replace_rules(pb::ReplaceRulesRequest {
                    parent: tenant_name(tenant),
                    rules,
                    expected_version: *expect_version,
                })
                .await?;
            version_line(
                json(&r),
                format!(
                    "replaced the rules of {}: {} rules\n",
                    tenant_name(tenant),
                    r.rule_count
                ),
                r.rule_set_version,
            )
        }
    })
}
