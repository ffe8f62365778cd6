//! What a durable single-rule change costs: one rule added to a tenant
//! among 16 tenants of 10,000 rules each, timed from the call until the
//! store answers (the change fsynced, as the API acknowledges it), with
//! the journal ([`Persistence::Journal`]) and with the whole-file rewrite
//! of format 1 ([`Persistence::Rewrite`]) side by side: two stores, one
//! per way, in the same directory, take turns, so both see the same disk
//! at the same time. Prints p50, p99 and the largest latency, the bytes
//! each way wrote per change, and the ratios.
//!
//! ```text
//! cargo bench -p dpu-control --bench persist -- --changes 200 [--dir DIR]
//! ```
//!
//! `--dir` should be on the disk the service would use (the default is
//! Cargo's target temporary directory, not `/tmp`, which may be memory).

use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dpu_control::model::{Action, IpPrefix, PortRange, Rule, RuleSet, Tenant, Timestamp};
use dpu_control::state::Limits;
use dpu_control::store::{Persistence, StateHandle, JOURNAL_FILE, STATE_FILE};

const TENANTS: u32 = 16;
const RULES: u32 = 10_000;
/// The default caps: 16 tenants of 10,000 rules and the changes fit.
const LIMITS: Limits = Limits::with_ram(0);

fn rule(tenant: u32, priority: u32) -> Rule {
    let net = |a: u32, len: u8| {
        let mask = u32::MAX << (32 - u32::from(len));
        let ip = Ipv4Addr::from((0x0a00_0000 | (tenant << 16) | (a & 0xffff)) & mask);
        Some(IpPrefix::new(IpAddr::V4(ip), len).expect("prefix"))
    };
    Rule {
        id: String::new(),
        priority,
        src: net(priority.wrapping_mul(7919), 32),
        dst: net(priority << 8, 24),
        src_ports: None,
        dst_ports: Some(PortRange {
            first: 1024 + (priority % 1000) as u16,
            last: 1024 + (priority % 1000) as u16 + 10,
        }),
        protocol: Some(if priority.is_multiple_of(2) { 6 } else { 17 }),
        icmp_type: None,
        icmp_code: None,
        action: if priority.is_multiple_of(5) {
            Action::Deny
        } else {
            Action::Allow
        },
        stateful: priority.is_multiple_of(3),
        description: format!("rule {priority} of tenant {tenant}"),
        rate_limit: None,
    }
}

fn fill(h: &StateHandle) {
    for t in 0..TENANTS {
        let id = format!("tenant-{t}");
        let tenant = Tenant {
            id: id.clone(),
            display_name: id.clone(),
            attachments: vec![],
            default_policy: Action::Deny,
            create_time: Timestamp::now(),
            rules: RuleSet::default(),
            storage_qos: Default::default(),
            vlan_id: 0,
            no_offload: false,
        };
        h.mutate_blocking(|s| s.create_tenant(LIMITS, &Default::default(), tenant))
            .expect("tenant");
        let rules = (0..RULES).map(|p| (None, rule(t, p * 2))).collect();
        h.mutate_blocking(|s| s.replace_rules(LIMITS, &id, rules, None))
            .expect("rules");
    }
}

/// The snapshot's inode and size, and the journal's size.
fn files(dir: &Path) -> (u64, u64, u64) {
    let meta = |f| std::fs::metadata(dir.join(f)).ok();
    let snap = meta(STATE_FILE);
    (
        snap.as_ref().map_or(0, |m| m.ino()),
        snap.as_ref().map_or(0, |m| m.len()),
        meta(JOURNAL_FILE).map_or(0, |m| m.len()),
    )
}

struct Way {
    name: &'static str,
    dir: PathBuf,
    handle: StateHandle,
    times: Vec<Duration>,
    written: u64,
}

impl Way {
    fn new(name: &'static str, base: &Path, mode: Persistence) -> Self {
        let dir = base.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        let handle = StateHandle::open_with(Some(&dir), mode).expect("open");
        fill(&handle);
        Self {
            name,
            dir,
            handle,
            times: Vec::new(),
            written: 0,
        }
    }

    fn add(&mut self, n: u32) {
        let t = n % TENANTS;
        // An odd priority, between two of the tenant's rules.
        let priority = ((n / TENANTS) * 7_919 % RULES) * 2 + 1;
        let r = Rule {
            id: format!("bench-{n}"),
            ..rule(t, priority)
        };
        let before = files(&self.dir);
        let start = Instant::now();
        self.handle
            .mutate_blocking(|s| s.add_rule(LIMITS, &format!("tenant-{t}"), r, None))
            .expect("add rule");
        self.times.push(start.elapsed());
        // A new snapshot is a new file, written whole; a record adds to
        // the journal.
        let after = files(&self.dir);
        self.written += if after.0 == before.0 {
            after.2.saturating_sub(before.2)
        } else {
            after.1 + after.2
        };
    }

    fn quantile(&self, q: f64) -> Duration {
        let mut t = self.times.clone();
        t.sort();
        let i = ((t.len() as f64 - 1.0) * q).round() as usize;
        t[i]
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut changes = 200u32;
    let mut base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("persist-bench");
    while let Some(a) = args.next() {
        match a.as_str() {
            "--changes" => {
                changes = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--changes N")
            }
            "--dir" => base = PathBuf::from(args.next().expect("--dir DIR")),
            // What `cargo bench` passes to every bench.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    std::fs::create_dir_all(&base).expect("bench directory");
    eprintln!(
        "filling two stores with {TENANTS} tenants of {RULES} rules in {}",
        base.display()
    );
    let mut ways = [
        Way::new("rewrite", &base, Persistence::Rewrite),
        Way::new("journal", &base, Persistence::Journal),
    ];
    eprintln!(
        "state file {} bytes; {changes} single-rule changes each",
        std::fs::metadata(ways[0].dir.join(STATE_FILE)).map_or(0, |m| m.len())
    );
    for n in 0..changes {
        for w in &mut ways {
            w.add(n);
        }
    }
    // Both ways hold the same rules, and their states load back.
    let rules = |h: &StateHandle| {
        let s = h.snapshot();
        s.tenants
            .values()
            .map(|t| t.rules.clone())
            .collect::<Vec<_>>()
    };
    for w in &ways {
        let reopened = StateHandle::open(Some(&w.dir)).expect("reopen");
        assert_eq!(*reopened.snapshot(), *w.handle.snapshot(), "{}", w.name);
        assert_eq!(rules(&w.handle), rules(&ways[1].handle), "{}", w.name);
    }
    println!("| way | p50 | p99 | max | bytes written per change |");
    println!("|---|---|---|---|---|");
    for w in &ways {
        println!(
            "| {} | {:.3} ms | {:.3} ms | {:.3} ms | {} |",
            w.name,
            w.quantile(0.5).as_secs_f64() * 1e3,
            w.quantile(0.99).as_secs_f64() * 1e3,
            w.quantile(1.0).as_secs_f64() * 1e3,
            w.written / u64::from(changes.max(1)),
        );
    }
    let ratio = |q| ways[0].quantile(q).as_secs_f64() / ways[1].quantile(q).as_secs_f64();
    println!(
        "rewrite / journal: p50 {:.1}x, p99 {:.1}x",
        ratio(0.5),
        ratio(0.99)
    );
    for w in &ways {
        let _ = std::fs::remove_dir_all(&w.dir);
    }
}
