//! What a rule change costs the switch: [`SwitchHandle::publish`] of a
//! configuration that differs from the current one by one inserted or
//! one deleted rule, against publishing every rule anew (a full build).
//!
//! With `--rules DIR/rules.json` (from ../shared/bench/gen_data.py) it
//! loads that set; `--one-tenant` puts all of its rules in one tenant, in
//! the ClassBench file's order (the set spreads them round-robin over
//! its tenants). Each change picks a random tenant and position: an
//! insert puts a copy of the rule there, with a new ID, just before it;
//! a delete removes the rule there. Changes alternate.
//!
//! ```text
//! cargo bench -p dpu-dataplane --bench publish --no-run
//! D=/tmp/vswitch-bench/data/acl1_10k
//! taskset -c 1 target/release/deps/publish-<hash> --rules $D/rules.json --one-tenant
//! ```
//! Prints the medians, 99th percentiles and maxima in microseconds, and
//! how many changes fell back to a build of the tenant.
//!
//! With `--tenants N` it measures instead what the number of tenants
//! costs a change: beside 10 and beside `N` tenants (each one VLAN
//! attachment on one port and one rule; `N` at most 4,000), one more
//! such tenant published and then deleted again, `--changes` times.
//!
//! ```text
//! taskset -c 1 target/release/deps/publish-<hash> --tenants 4000
//! ```

use std::time::Instant;

use dpu_dataplane::classify::{AclRule, Family};
use dpu_dataplane::switch::{Attach, SwitchConfig, SwitchHandle, SwitchRule, TenantConfig};
use dpu_rand::Rng;

#[path = "common/rules.rs"]
mod rules;

/// Orders are spread out so an insert finds a free one below any rule.
const SPREAD: u32 = 16;

fn one_tenant(mut cfg: SwitchConfig) -> SwitchConfig {
    let n = cfg.tenants.len();
    let mut all = Vec::new();
    let mut lists: Vec<_> = cfg
        .tenants
        .iter_mut()
        .map(|t| std::mem::take(std::sync::Arc::make_mut(&mut t.rules)).into_iter())
        .collect();
    // Round-robin back into file order.
    'outer: loop {
        for l in &mut lists {
            match l.next() {
                Some(r) => all.push(r),
                None => break 'outer,
            }
        }
    }
    for l in &mut lists {
        all.extend(l);
    }
    let mut t = TenantConfig {
        rules: all.into(),
        ..cfg.tenants[0].clone()
    };
    for (i, r) in std::sync::Arc::make_mut(&mut t.rules)
        .iter_mut()
        .enumerate()
    {
        r.id = format!("r{i}");
        r.matches.order = i as u32;
    }
    println!("{n} tenants merged into one");
    cfg.tenants = vec![t];
    cfg
}

fn stats(name: &str, mut us: Vec<f64>, rebuilt: usize) {
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{name}: {} changes, median {:.1} µs, p99 {:.1} µs, max {:.1} µs, {rebuilt} rebuilt the tenant",
        us.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    );
}

/// `n` tenants, each attached to VLAN `i + 1` of port 0 with one rule.
fn many(n: usize) -> SwitchConfig {
    let tenant = |i: usize| {
        let mut m = AclRule::any(0, 0, Family::V4);
        m.dst_port = (80, 80);
        m.proto = (6, 6);
        TenantConfig {
            name: format!("t{i}"),
            attachments: vec![Attach::port(0, i as u16 + 1)],
            rules: vec![SwitchRule {
                id: "web".into(),
                matches: m,
                allow: true,
                stateful: false,
                rate_limit: None,
            }]
            .into(),
            ..TenantConfig::default()
        }
    };
    SwitchConfig {
        ports: 1,
        tenants: (0..n).map(tenant).collect(),
        ..SwitchConfig::default()
    }
}

/// One tenant added and deleted, `changes` times, beside 10 and beside
/// `n` others; prints each and the ratio of their medians.
fn tenant_changes(n: usize, changes: usize) {
    assert!((10..=4000).contains(&n), "--tenants takes 10 to 4000");
    let mut medians = Vec::new();
    for size in [10, n] {
        let mut cfg = many(size + 1);
        let extra = cfg.tenants.pop().expect("one more");
        let h = SwitchHandle::new(&cfg).expect("configuration");
        let (mut add, mut del) = (Vec::new(), Vec::new());
        for _ in 0..changes {
            cfg.tenants.push(extra.clone());
            let start = Instant::now();
            h.publish(&cfg).expect("publish");
            add.push(start.elapsed().as_secs_f64() * 1e6);
            cfg.tenants.pop();
            let start = Instant::now();
            h.publish(&cfg).expect("publish");
            del.push(start.elapsed().as_secs_f64() * 1e6);
        }
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        medians.push((median(&add), median(&del)));
        stats(&format!("{size} tenants, one added"), add, 0);
        stats(&format!("{size} tenants, one deleted"), del, 0);
    }
    println!(
        "{n} against 10 tenants: added {:.1}x, deleted {:.1}x",
        medians[1].0 / medians[0].0,
        medians[1].1 / medians[0].1
    );
}

fn main() {
    let mut path = None;
    let mut tenants = None;
    let mut one = false;
    let mut changes = 500usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rules" => path = args.next(),
            "--one-tenant" => one = true,
            "--tenants" => tenants = args.next().and_then(|v| v.parse().ok()),
            "--changes" => {
                changes = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--changes N")
            }
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    if let Some(n) = tenants {
        return tenant_changes(n, changes);
    }
    let path = path.unwrap_or_else(|| "/tmp/vswitch-bench/data/acl1_10k/rules.json".into());
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: run ../shared/bench/gen_data.py"
    );
    let mut cfg = rules::switch_config(&path, 0);
    if one {
        cfg = one_tenant(cfg);
    }
    for t in &mut cfg.tenants {
        for r in std::sync::Arc::make_mut(&mut t.rules).iter_mut() {
            r.matches.order *= SPREAD;
        }
    }
    let sizes: Vec<usize> = cfg.tenants.iter().map(|t| t.rules.len()).collect();
    println!("tenants' rules: {sizes:?}");
    let h = SwitchHandle::new(&cfg).expect("configuration");

    // Full builds: every rule gets a new ID, so nothing is kept.
    let mut full = Vec::new();
    for round in 0..5 {
        for t in &mut cfg.tenants {
            for r in std::sync::Arc::make_mut(&mut t.rules).iter_mut() {
                r.id = format!("{}.{round}", r.id.split('.').next().unwrap_or(""));
            }
        }
        let start = Instant::now();
        let p = h.publish(&cfg).expect("publish");
        full.push(start.elapsed().as_secs_f64() * 1e6);
        assert_eq!(p.built, cfg.tenants.len());
    }
    stats("publish, every rule new", full, cfg.tenants.len() * 5);

    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    let (mut ins, mut del) = (Vec::new(), Vec::new());
    let (mut ins_built, mut del_built) = (0, 0);
    for i in 0..changes {
        let ti = rng.index(cfg.tenants.len());
        let rules = std::sync::Arc::make_mut(&mut cfg.tenants[ti].rules);
        let at = rng.index(rules.len());
        let insert = i % 2 == 0;
        if insert {
            let mut r = rules[at].clone();
            r.id = format!("new{i}");
            if r.matches.order == 0 {
                continue;
            }
            r.matches.order -= 1;
            if at > 0 && rules[at - 1].matches.order == r.matches.order {
                continue;
            }
            rules.insert(at, r);
        } else {
            rules.remove(at);
        }
        let start = Instant::now();
        let p = h.publish(&cfg).expect("publish");
        let us = start.elapsed().as_secs_f64() * 1e6;
        if insert {
            ins.push(us);
            ins_built += p.built;
        } else {
            del.push(us);
            del_built += p.built;
        }
    }
    stats("publish, one rule inserted", ins, ins_built);
    stats("publish, one rule deleted", del, del_built);
}
