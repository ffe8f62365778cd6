//! The bounds of the switch's table sizes and worker count, and
//! [`SwitchConfig::check_sizes`], which holds a configuration to them
//! before anything is allocated: each table is preallocated per worker at
//! the size it is given, so a size past its bound is memory the service
//! would take at start, not a limit it would grow to.
//!
//! The configuration layers above (the daemon's `[dataplane]` keys) name
//! the fields their own way; a [`SizeError`] names the field of
//! [`SwitchConfig`] and the rule, for them to report under their key.

use std::time::Duration;

use super::SwitchConfig;

/// Most workers (threads polling the ports): 64.
pub const MAX_WORKERS: usize = 64;
/// Most tracked connections, all workers together.
pub const MAX_CONNTRACK: usize = 1 << 26;
/// Most tracked fragmented datagrams, all workers together.
pub const MAX_FRAGMENTS: usize = 1 << 24;
/// Longest a datagram's later fragments may follow its first.
pub const MAX_FRAGMENT_TIMEOUT: Duration = Duration::from_secs(120);
/// Most entries of one worker's flow cache.
pub const MAX_FLOW_CACHE: usize = 1 << 24;
/// Most entries of one worker's MAC table.
pub const MAX_MAC_TABLE: usize = 1 << 24;

/// A table size or count of a [`SwitchConfig`] out of its bounds, or out
/// of line with another it must not exceed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {rule}")]
pub struct SizeError {
    /// The field of [`SwitchConfig`], e.g. `conntrack_per_tenant`.
    pub field: &'static str,
    /// The rule it breaks, with its value: "must be in 1..=conntrack_max
    /// (10), not 11".
    pub rule: String,
}

/// `value` in `1..=max`, where `max` is a bound or another field.
fn within(field: &'static str, value: usize, max: usize, of: &str) -> Result<(), SizeError> {
    if (1..=max).contains(&value) {
        return Ok(());
    }
    Err(SizeError {
        field,
        rule: format!("must be in 1..={of}, not {value}"),
    })
}

impl SwitchConfig {
    /// Checks the worker count and the table sizes: each in its bound,
    /// and a tenant's share within the whole (`conntrack_per_tenant` at
    /// most `conntrack_max`, the MAC limits nested as table, tenant,
    /// attachment and reserve).
    ///
    /// # Errors
    /// The first [`SizeError`] found.
    pub fn check_sizes(&self) -> Result<(), SizeError> {
        within(
            "workers",
            self.workers,
            MAX_WORKERS,
            &MAX_WORKERS.to_string(),
        )?;
        within(
            "conntrack_max",
            self.conntrack_max,
            MAX_CONNTRACK,
            &MAX_CONNTRACK.to_string(),
        )?;
        within(
            "conntrack_per_tenant",
            self.conntrack_per_tenant,
            self.conntrack_max,
            &format!("conntrack_max ({})", self.conntrack_max),
        )?;
        within(
            "fragments_max",
            self.fragments_max,
            MAX_FRAGMENTS,
            &MAX_FRAGMENTS.to_string(),
        )?;
        within(
            "fragments_per_tenant",
            self.fragments_per_tenant,
            self.fragments_max,
            &format!("fragments_max ({})", self.fragments_max),
        )?;
        let timeout = self.fragment_timeout;
        if timeout < Duration::from_secs(1) || timeout > MAX_FRAGMENT_TIMEOUT {
            return Err(SizeError {
                field: "fragment_timeout",
                rule: format!(
                    "must be in 1..={} s, not {} s",
                    MAX_FRAGMENT_TIMEOUT.as_secs(),
                    timeout.as_secs_f64()
                ),
            });
        }
        if self.flow_cache_entries > MAX_FLOW_CACHE {
            return Err(SizeError {
                field: "flow_cache_entries",
                rule: format!(
                    "must be at most {MAX_FLOW_CACHE}, not {}",
                    self.flow_cache_entries
                ),
            });
        }
        within(
            "mac_table_size",
            self.mac_table_size,
            MAX_MAC_TABLE,
            &MAX_MAC_TABLE.to_string(),
        )?;
        within(
            "mac_per_tenant",
            self.mac_per_tenant,
            self.mac_table_size,
            &format!("mac_table_size ({})", self.mac_table_size),
        )?;
        within(
            "mac_per_attachment",
            self.mac_per_attachment,
            self.mac_per_tenant,
            &format!("mac_per_tenant ({})", self.mac_per_tenant),
        )?;
        if self.mac_reserved_per_tenant > self.mac_per_tenant {
            return Err(SizeError {
                field: "mac_reserved_per_tenant",
                rule: format!(
                    "must be at most mac_per_tenant ({}), not {}",
                    self.mac_per_tenant, self.mac_reserved_per_tenant
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_fit_and_each_bound_is_named() {
        assert_eq!(SwitchConfig::default().check_sizes(), Ok(()));
        let bad = |f: fn(&mut SwitchConfig), field: &str, rule: &str| {
            let mut c = SwitchConfig::default();
            f(&mut c);
            let e = c.check_sizes().unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.to_string().contains(rule), "{e}");
        };
        bad(|c| c.workers = 0, "workers", "must be in 1..=64, not 0");
        bad(|c| c.workers = 65, "workers", "not 65");
        bad(|c| c.conntrack_max = 0, "conntrack_max", "1..=67108864");
        bad(
            |c| c.conntrack_max = MAX_CONNTRACK + 1,
            "conntrack_max",
            "not 67108865",
        );
        bad(
            |c| {
                c.conntrack_max = 10;
                c.conntrack_per_tenant = 11;
            },
            "conntrack_per_tenant",
            "1..=conntrack_max (10), not 11",
        );
        bad(|c| c.fragments_max = 0, "fragments_max", "1..=16777216");
        bad(
            |c| {
                c.fragments_max = 10;
                c.fragments_per_tenant = 11;
            },
            "fragments_per_tenant",
            "fragments_max (10)",
        );
        bad(
            |c| c.fragment_timeout = Duration::ZERO,
            "fragment_timeout",
            "1..=120 s, not 0 s",
        );
        bad(
            |c| c.fragment_timeout = Duration::from_secs(121),
            "fragment_timeout",
            "not 121 s",
        );
        bad(
            |c| c.flow_cache_entries = MAX_FLOW_CACHE + 1,
            "flow_cache_entries",
            "at most 16777216",
        );
        bad(|c| c.mac_table_size = 0, "mac_table_size", "1..=16777216");
        bad(
            |c| {
                c.mac_table_size = 100;
                c.mac_per_tenant = 101;
            },
            "mac_per_tenant",
            "mac_table_size (100)",
        );
        bad(
            |c| c.mac_per_attachment = c.mac_per_tenant + 1,
            "mac_per_attachment",
            "1..=mac_per_tenant (4096)",
        );
        bad(
            |c| c.mac_reserved_per_tenant = c.mac_per_tenant + 1,
            "mac_reserved_per_tenant",
            "at most mac_per_tenant (4096)",
        );
        // The bounds themselves fit.
        let c = SwitchConfig {
            workers: MAX_WORKERS,
            fragment_timeout: MAX_FRAGMENT_TIMEOUT,
            flow_cache_entries: MAX_FLOW_CACHE,
            ..SwitchConfig::default()
        };
        assert_eq!(c.check_sizes(), Ok(()));
    }
}
