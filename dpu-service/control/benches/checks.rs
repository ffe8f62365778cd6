//! What the checks of one change cost as the state grows: the same
//! changes made to a state of 10 tenants and to one of 10,000, each
//! tenant holding one VXLAN attachment on the same port and one rule, so
//! every new attachment is checked against all of them. A change cost
//! that stays flat from 10 to 10,000 tenants is one that grows with the
//! change, not with the state.
//!
//! Each round times, on [`State`] directly (the checks and the change,
//! no copy of the state and no disk):
//! - `create`: a tenant with one attachment and one rule created;
//! - `attach`: one attachment added to an existing tenant;
//! - `add_rule`: one rule added to an existing tenant;
//! - `delete`: the tenant of `create` deleted again;
//!
//! and through a store ([`StateHandle`]), `create` as the API makes it:
//! - `commit`: in memory, so the checks, the change and the store's copy
//!   of the state, which keeps the published state as it was until the
//!   change is durable;
//! - `journal`: on a state directory in memory (`/dev/shm` where there is
//!   one), so that also finding the change's journal record, writing it
//!   and folding the journal into a snapshot when it has grown, without a
//!   disk's fsync hiding that work.
//!
//! Prints p50 and p99 of each at both sizes, and their ratio.
//!
//! ```text
//! cargo bench -p dpu-control --bench checks -- --rounds 2000
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use dpu_control::model::{
    Action, Attachment, PortRole, PortSpec, Rule, RuleSet, State, Tenant, Timestamp,
};
use dpu_control::state::{Limits, PortRegistry};
use dpu_control::store::StateHandle;

const SMALL: u32 = 10;
const LARGE: u32 = 10_000;
const PORT: &str = "p0";

/// Room for 10,000 tenants and everything the rounds add.
const LIMITS: Limits = Limits {
    tenants: 1 << 20,
    attachments: 1 << 20,
    rules: 1 << 24,
    ..Limits::with_ram(0)
};

fn ports() -> PortRegistry {
    [(
        PORT.to_string(),
        PortSpec {
            id: PORT.into(),
            driver: "none".into(),
            device: String::new(),
            role: PortRole::Software,
            vtep_address: None,
        },
    )]
    .into_iter()
    .collect()
}

fn vxlan(vni: u32) -> Attachment {
    Attachment::Vxlan {
        uplink: PORT.into(),
        vni,
        remote_vteps: vec![],
        underlay_prefixes: vec![],
    }
}

fn rule(id: &str, priority: u32) -> Rule {
    Rule {
        id: id.into(),
        priority,
        src: None,
        dst: None,
        src_ports: None,
        dst_ports: None,
        protocol: Some(6),
        icmp_type: None,
        icmp_code: None,
        action: Action::Allow,
        stateful: false,
        description: String::new(),
        rate_limit: None,
    }
}

fn tenant(id: &str, vni: u32) -> Tenant {
    Tenant {
        id: id.into(),
        display_name: String::new(),
        attachments: vec![vxlan(vni)],
        default_policy: Action::Deny,
        create_time: Timestamp::now(),
        rules: RuleSet {
            version: 1,
            rules: std::sync::Arc::new(vec![rule("r0", 100)]),
        },
        storage_qos: Default::default(),
        vlan_id: 0,
        no_offload: false,
    }
}

/// `n` tenants, tenant `i` on VNI `i + 1` with one rule.
fn state(n: u32) -> State {
    let p = ports();
    let mut s = State::default();
    for i in 0..n {
        s.create_tenant(LIMITS, &p, tenant(&format!("t{i}"), i + 1))
            .expect("tenant");
    }
    s
}

#[derive(Default)]
struct Times(BTreeMap<&'static str, Vec<Duration>>);

impl Times {
    fn time<T>(&mut self, what: &'static str, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.0.entry(what).or_default().push(start.elapsed());
        out
    }

    fn quantile(&self, what: &str, q: f64) -> Duration {
        let mut t = self.0[what].clone();
        t.sort();
        let i = ((t.len() as f64 - 1.0) * q).round() as usize;
        t[i]
    }
}

/// `rounds` rounds of every change on a state of `n` tenants: first on
/// [`State`], then through a store, so that freeing the copies the store
/// makes does not land on the allocator while the checks are timed.
fn run(n: u32, rounds: u32) -> Times {
    let p = ports();
    let mut s = state(n);
    let mut times = Times::default();
    // VNIs above every held one; the attachment added to t0 each round
    // goes again at the end of the round.
    let fresh = n + 1;
    for r in 0..rounds {
        times
            .time("create", || {
                s.create_tenant(LIMITS, &p, tenant("new", fresh))
            })
            .expect("create");
        times
            .time("attach", || {
                s.attach(LIMITS, &p, "t0", vxlan(fresh + 1)).map(|_| ())
            })
            .expect("attach");
        let id = format!("x{r}");
        times
            .time("add_rule", || {
                s.add_rule(LIMITS, "t1", rule(&id, 1000 + r), None)
            })
            .expect("add rule");
        times
            .time("delete", || s.delete_tenant("new", true))
            .expect("delete");
        // Undone untimed: t0's new attachment and t1's new rule.
        let t0 = s.tenants["t0"].attachments[..1].to_vec();
        s.update_tenant(
            LIMITS,
            &p,
            "t0",
            dpu_control::state::TenantUpdate {
                attachments: Some(t0),
                ..Default::default()
            },
        )
        .expect("detach");
        s.delete_rule("t1", &id, None).expect("delete rule");
    }
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("state directory");
    for (what, handle) in [
        ("commit", StateHandle::open(None)),
        ("journal", StateHandle::open(Some(dir.path()))),
    ] {
        let handle = handle.expect("store");
        let whole = s.clone();
        handle
            .mutate_blocking(|h| {
                *h = whole;
                Ok(())
            })
            .expect("fill");
        for _ in 0..rounds {
            times
                .time(what, || {
                    handle.mutate_blocking(|h| h.create_tenant(LIMITS, &p, tenant("new", fresh)))
                })
                .expect("commit");
            handle
                .mutate_blocking(|h| h.delete_tenant("new", true))
                .expect("commit delete");
        }
    }
    times
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut rounds = 2_000u32;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--rounds N")
            }
            // What `cargo bench` passes to every bench.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    eprintln!(
        "{rounds} rounds on {SMALL} and on {LARGE} tenants, one VXLAN attachment each on {PORT}"
    );
    let small = run(SMALL, rounds);
    let large = run(LARGE, rounds);
    println!("| change | p50 {SMALL} | p50 {LARGE} | p50 ratio | p99 {SMALL} | p99 {LARGE} | p99 ratio |");
    println!("|---|---|---|---|---|---|---|");
    for what in [
        "create", "attach", "add_rule", "delete", "commit", "journal",
    ] {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let (s50, l50) = (small.quantile(what, 0.5), large.quantile(what, 0.5));
        let (s99, l99) = (small.quantile(what, 0.99), large.quantile(what, 0.99));
        println!(
            "| {what} | {:.2} µs | {:.2} µs | {:.2} | {:.2} µs | {:.2} µs | {:.2} |",
            us(s50),
            us(l50),
            us(l50) / us(s50),
            us(s99),
            us(l99),
            us(l99) / us(s99),
        );
    }
}
