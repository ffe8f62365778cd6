//! `[limits]`: how many tenants, attachments, rules, subsystems,
//! namespaces, allowed hosts, listeners and volumes the state may hold. A change
//! past one is refused with `RESOURCE_EXHAUSTED` naming its key; the
//! per-tenant caps also size the largest gRPC message the tenant and
//! filter services take (see [`dpu_control::service::request_bytes`]).

use anyhow::{bail, Result};
use dpu_control::state::Limits;
use dpu_control::validate::{MAX_ATTACHMENTS_PER_TENANT, MAX_RULES_PER_TENANT};
use serde::Deserialize;

use super::Config;

/// `[limits]`
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Most tenants.
    pub max_tenants: usize,
    /// Most attachments of one tenant, 1..=4096.
    pub max_attachments_per_tenant: usize,
    /// Most attachments of all tenants together.
    pub max_attachments: usize,
    /// Most filter rules of one tenant, 1..=65536.
    pub max_rules_per_tenant: usize,
    /// Most filter rules of all tenants together.
    pub max_rules: usize,
    /// Most NVM subsystems.
    pub max_subsystems: usize,
    /// Most namespaces of all subsystems together.
    pub max_namespaces: usize,
    /// Most allowed-host entries of all subsystems together.
    pub max_hosts: usize,
    /// Most listeners of all subsystems together.
    pub max_listeners: usize,
    /// Most volumes.
    pub max_volumes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let l = Limits::with_ram(0);
        LimitsConfig {
            max_tenants: l.tenants,
            max_attachments_per_tenant: l.attachments_per_tenant,
            max_attachments: l.attachments,
            max_rules_per_tenant: l.rules_per_tenant,
            max_rules: l.rules,
            max_subsystems: l.subsystems,
            max_namespaces: l.namespaces,
            max_hosts: l.hosts,
            max_listeners: l.listeners,
            max_volumes: l.volumes,
        }
    }
}

impl LimitsConfig {
    /// Checks that every cap is at least 1 and the per-tenant ones at
    /// most what the API allows.
    ///
    /// # Errors
    /// Names the first key out of range.
    pub fn validate(&self) -> Result<()> {
        let l = self;
        for (key, v, max) in [
            ("max_tenants", l.max_tenants, usize::MAX),
            (
                "max_attachments_per_tenant",
                l.max_attachments_per_tenant,
                MAX_ATTACHMENTS_PER_TENANT,
            ),
            ("max_attachments", l.max_attachments, usize::MAX),
            (
                "max_rules_per_tenant",
                l.max_rules_per_tenant,
                MAX_RULES_PER_TENANT,
            ),
            ("max_rules", l.max_rules, usize::MAX),
            ("max_subsystems", l.max_subsystems, usize::MAX),
            ("max_namespaces", l.max_namespaces, usize::MAX),
            ("max_hosts", l.max_hosts, usize::MAX),
            ("max_listeners", l.max_listeners, usize::MAX),
            ("max_volumes", l.max_volumes, usize::MAX),
        ] {
            if v == 0 || v > max {
                if max == usize::MAX {
                    bail!("limits.{key}: 0 is not allowed; give at least 1");
                }
                bail!("limits.{key}: {v} is not in 1..={max}");
            }
        }
        Ok(())
    }
}

impl Config {
    /// The control plane's limits: `storage.ram_limit` and `[limits]`.
    pub fn limits(&self) -> Limits {
        let l = &self.limits;
        Limits {
            ram_bytes: self.ram_limit(),
            tenants: l.max_tenants,
            attachments_per_tenant: l.max_attachments_per_tenant,
            attachments: l.max_attachments,
            rules_per_tenant: l.max_rules_per_tenant,
            rules: l.max_rules,
            subsystems: l.max_subsystems,
            namespaces: l.max_namespaces,
            hosts: l.max_hosts,
            listeners: l.max_listeners,
            volumes: l.max_volumes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_default_and_are_checked() {
        let c: Config = toml::from_str("[limits]\nmax_tenants = 3\nmax_rules = 10\n").unwrap();
        c.limits.validate().unwrap();
        let l = c.limits();
        assert_eq!((l.tenants, l.rules), (3, 10));
        assert_eq!(l.rules_per_tenant, MAX_RULES_PER_TENANT);
        assert_eq!(l.listeners, Limits::with_ram(0).listeners);
        Config::default().limits.validate().unwrap();
        for (text, want) in [
            ("max_hosts = 0", "limits.max_hosts: 0 is not allowed"),
            (
                "max_rules_per_tenant = 65537",
                "limits.max_rules_per_tenant: 65537 is not in 1..=65536",
            ),
            (
                "max_attachments_per_tenant = 0",
                "limits.max_attachments_per_tenant: 0 is not in 1..=4096",
            ),
        ] {
            let c: Config = toml::from_str(&format!("[limits]\n{text}\n")).unwrap();
            let e = c.limits.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        assert!(toml::from_str::<Config>("[limits]\nmax_rule = 1\n").is_err());
    }
}
