//! The classifier alone on ClassBench rules and a 5-tuple trace: build
//! time, table memory, lookups per second on one core (one key per call,
//! and in bursts of 32 through `lookup_batch`, as a worker's receive
//! burst and as `dpdk-test-acl` calls `rte_acl_classify`), and the cost
//! of a single-rule insert and delete; then, where the set has its
//! `rules.json` and `expected.csv`, the same trace spread over the
//! tenants as the switch sees it: one classifier per tenant, each key
//! looked up in its packet's tenant's, bursts of 32 through
//! `Classifier::lookup_multi`. Reads the `dpdk-test-acl` files that
//! ../shared/bench/gen_data.py writes, so `dpdk-test-acl` can run on the
//! same rules and trace side by side. Every lookup, single and batched,
//! is first checked against a plain first-match scan of the rules.
//! `--trees` builds the classifiers without their RFC tables
//! (`Classifier::build_trees`), for the trees alone. IPv6 rules and
//! traces (`dpdk-test-acl --ipv6`'s format, as `bench/ipv6-sets.py`
//! writes them from a set's IPv4 files into `<set>_v6`) are read too.
//!
//! A set named `SHAPE:N` is made here instead, `N` rules of a shape a
//! hostile or careless API client may write, with keys at and beside
//! every rule's range ends (see [`synthetic`]). Each set also reports
//! how much a build raised the process's peak memory.
//!
//! ```text
//! cargo bench -p dpu-dataplane --bench classify --no-run
//! flock /tmp/bench.lock taskset -c 1 chrt -f 10 target/release/deps/classify-* \
//!     --data /tmp/vswitch-bench/data --sets acl1_1k,acl1_10k --runs 3 --secs 5
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use dpu_dataplane::classify::{AclRule, Classifier, Family};
use dpu_dataplane::wire::FlowKey;
use dpu_rand::Rng;

#[path = "common/rules.rs"]
mod rules;

/// An IPv4 or IPv6 prefix: its address, length and address width.
fn ip(s: &str) -> (u128, u8, u32) {
    let (a, len) = s.split_once('/').expect("prefix");
    let len = len.parse().expect("length");
    match a.parse::<std::net::IpAddr>().expect("address") {
        std::net::IpAddr::V4(a) => (u128::from(u32::from(a)), len, 32),
        std::net::IpAddr::V6(a) => (u128::from(a), len, 128),
    }
}

/// A trace's address: an IPv4 address as a number, or IPv6 text
/// (`dpdk-test-acl --ipv6`); true for IPv6.
fn key_address(s: &str) -> (u128, bool) {
    match s.parse::<u32>() {
        Ok(a) => (u128::from(a), false),
        Err(_) => (
            u128::from(s.parse::<std::net::Ipv6Addr>().expect("trace address")),
            true,
        ),
    }
}

fn range(s: &str) -> (u16, u16) {
    let (a, b) = s.split_once(':').expect("range");
    (
        a.trim().parse().expect("port"),
        b.trim().parse().expect("port"),
    )
}

/// `@src/len <tab> dst/len <tab> lo : hi <tab> lo : hi <tab> proto/mask`,
/// IPv4 or IPv6 (`dpdk-test-acl --ipv6`; see `bench/ipv6-sets.py`).
fn load_rules(path: &str) -> Vec<AclRule> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{path}: {e} (run ../shared/bench/gen_data.py)"));
    text.lines()
        .filter(|l| l.starts_with('@'))
        .enumerate()
        .map(|(i, l)| {
            let f: Vec<&str> = l[1..].split('\t').collect();
            let (s, sl, width) = ip(f[0]);
            let (d, dl, _) = ip(f[1]);
            let (p, m) = f[4].split_once('/').expect("proto");
            let p = u8::from_str_radix(p.trim_start_matches("0x"), 16).expect("proto");
            let m = u8::from_str_radix(m.trim_start_matches("0x"), 16).expect("mask");
            AclRule {
                // Even orders leave room to insert between two rules.
                order: 2 * i as u32,
                tag: i as u32,
                family: if width == 32 { Family::V4 } else { Family::V6 },
                src: AclRule::prefix_range(s, sl, width),
                dst: AclRule::prefix_range(d, dl, width),
                src_port: range(f[2]),
                dst_port: range(f[3]),
                proto: if m == 0 { (0, 255) } else { (p, p) },
            }
        })
        .collect()
}

fn load_trace(path: &str) -> Vec<FlowKey> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (src, v6) = key_address(f[0]);
            let (dst, _) = key_address(f[1]);
            let n = |s: &str| s.parse::<u32>().expect("trace field");
            FlowKey {
                src,
                dst,
                src_port: n(f[2]) as u16,
                dst_port: n(f[3]) as u16,
                proto: n(f[4]) as u8,
                v6,
            }
        })
        .collect()
}

/// The rules of the shape `shape` (`n` of them) and keys aimed at their
/// ends: rules that each span most of the space, which make classes and
/// tree nodes of thousands of rules each unless the builds prune them.
///
/// - `nested`: source ranges, each inside the next, the narrowest first
///   (so no rule hides the rules behind it everywhere).
/// - `staggered`: source ranges of equal width, each starting a little
///   after the one before.
/// - `nested-ports`: TCP destination-port ranges nested as above, within
///   one source /8 (a tenant's API allows port ranges, not address
///   ranges, so this is the nesting a client can write).
/// - `nested-2d`: destination ranges nested within a /8 and staggered
///   source-port ranges: no rule covers a cut of either dimension.
fn synthetic(shape: &str, n: u32) -> (Vec<AclRule>, Vec<FlowKey>) {
    let top = u128::from(u32::MAX);
    let net = 10u128 << 24;
    let rules: Vec<AclRule> = (0..n)
        .map(|i| {
            let mut r = AclRule::any(2 * i, i, Family::V4);
            let (i, k) = (u128::from(i), u128::from(n - 1 - i));
            let width = 7 * u128::from(n) / 2;
            match shape {
                "nested" => r.src = (7 * k, top - 7 * k),
                "staggered" => r.src = (7 * i, 7 * i + width),
                "nested-ports" => {
                    let k = (k % 32_767) as u16;
                    r.src = (net, net + (1 << 24) - 1);
                    r.proto = (6, 6);
                    r.dst_port = (k + 1, 65_534 - k);
                }
                "nested-2d" => {
                    r.dst = (net + 5 * k, net + (1 << 24) - 1 - 5 * k);
                    r.src_port = (i as u16, (i as u16).saturating_add(20_000));
                }
                other => panic!("unknown shape {other}"),
            }
            r
        })
        .collect();
    // Per key, one rule's end in each of its ranged fields, or beside it.
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let keys = (0..16_384)
        .map(|_| {
            let r = rng.pick(&rules);
            let (high, offset) = (rng.bool(), u128::from(rng.below(3)));
            let end = |(lo, hi): (u128, u128), field_top: u128| {
                let v = if high { hi } else { lo };
                (v + offset).saturating_sub(1).min(field_top)
            };
            FlowKey {
                src: end(r.src, top),
                dst: end(r.dst, top),
                src_port: end((r.src_port.0.into(), r.src_port.1.into()), 0xffff) as u16,
                dst_port: end((r.dst_port.0.into(), r.dst_port.1.into()), 0xffff) as u16,
                proto: if rng.bool() { 6 } else { 17 },
                v6: false,
            }
        })
        .collect();
    (rules, keys)
}

/// Resets the process's peak resident memory to its current size
/// (`/proc/self/clear_refs`), and returns that size in bytes.
fn reset_peak() -> f64 {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    status_kib("VmRSS:") * 1024.0
}

/// A field of `/proc/self/status` in KiB (0 if absent).
fn status_kib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0)
}

/// Keys per `lookup_batch` call in the burst measurement by default (a
/// worker's receive burst; `--burst N` for another).
const BURST: usize = 32;

/// Per tenant of `dir`'s `rules.json`, a classifier of its rules made by
/// `build`; per packet of `expected.csv` (the trace's order), its tenant.
/// `None` if the set has no such files.
fn tenants(
    dir: &str,
    build: fn(&[AclRule]) -> Classifier,
) -> Option<(Vec<Classifier>, Vec<usize>)> {
    let rules = format!("{dir}/rules.json");
    let expected = std::fs::read_to_string(format!("{dir}/expected.csv")).ok()?;
    std::fs::metadata(&rules).ok()?;
    let cfg = rules::switch_config(&rules, 0);
    let names: Vec<&str> = cfg.tenants.iter().map(|t| t.name.as_str()).collect();
    let of_packet = expected
        .lines()
        .skip(1)
        .map(|l| {
            let name = l.split(',').nth(1).expect("tenant column");
            names
                .iter()
                .position(|n| *n == name)
                .expect("a known tenant")
        })
        .collect();
    let classifiers = cfg
        .tenants
        .iter()
        .map(|t| {
            let acl: Vec<AclRule> = t
                .rules
                .iter()
                .enumerate()
                .map(|(i, r)| AclRule {
                    tag: i as u32,
                    ..r.matches
                })
                .collect();
            build(&acl)
        })
        .collect();
    Some((classifiers, of_packet))
}

/// Millions of lookups a second, one figure per run: `pass` (which looks
/// up `keys` keys) repeated for `secs` seconds, `runs` times.
fn timed(runs: usize, secs: f64, keys: usize, mut pass: impl FnMut()) -> Vec<f64> {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            let mut n = 0u64;
            while t.elapsed() < Duration::from_secs_f64(secs) {
                pass();
                n += keys as u64;
            }
            n as f64 / t.elapsed().as_secs_f64() / 1e6
        })
        .collect()
}

/// Each run's figure, for the report.
fn list(rates: &[f64]) -> String {
    rates
        .iter()
        .map(|r| format!("{r:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut data = "/tmp/vswitch-bench/data".to_string();
    let mut sets = "acl1_1k,acl1_10k".to_string();
    let mut runs = 3usize;
    let mut secs = 3.0f64;
    let mut burst_len = BURST;
    let mut build: fn(&[AclRule]) -> Classifier = Classifier::build;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--data" => data = val(),
            "--sets" => sets = val(),
            "--runs" => runs = val().parse().expect("--runs"),
            "--secs" => secs = val().parse().expect("--secs"),
            "--burst" => burst_len = val().parse().expect("--burst"),
            "--trees" => build = Classifier::build_trees,
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    for set in sets.split(',') {
        let (rules, trace) = match set.split_once(':') {
            Some((shape, n)) => synthetic(shape, n.parse().expect("rules of a made set")),
            None => (
                load_rules(&format!("{data}/{set}/testacl.rules")),
                load_trace(&format!("{data}/{set}/testacl.trace")),
            ),
        };
        let before = reset_peak();
        drop(black_box(build(&rules)));
        let peak = status_kib("VmHWM:") * 1024.0 - before;
        let builds: Vec<f64> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                black_box(build(&rules));
                t.elapsed().as_secs_f64()
            })
            .collect();
        let c = build(&rules);
        println!("{set}: {}", c.shape());
        let mut out = vec![None; trace.len()];
        c.lookup_batch(&trace, &mut out);
        for (k, got) in trace.iter().zip(&out) {
            let want = rules.iter().find(|r| r.matches(k)).map(|r| r.tag);
            assert_eq!(c.lookup(k).map(|r| r.tag), want, "{set}: key {k:?}");
            assert_eq!(*got, want, "{set}: batch, key {k:?}");
        }
        let rates = timed(runs, secs, trace.len(), || {
            for k in &trace {
                black_box(c.lookup(black_box(k)));
            }
        });
        // The same in bursts, as a worker would (and as dpdk-test-acl
        // calls rte_acl_classify).
        let mut out = vec![None; burst_len];
        let batch_rates = timed(runs, secs, trace.len(), || {
            for burst in trace.chunks(burst_len) {
                c.lookup_batch(black_box(burst), &mut out);
                black_box(&out);
            }
        });
        // One rule in, one rule out, off a fresh build: what a single
        // gRPC rule change costs the control plane. The rule taken out
        // is the middle one, or the next that does not hide others (one
        // that does needs a rebuild, as the switch then does).
        let mid = rules[rules.len() / 2];
        let inserted = AclRule {
            order: mid.order + 1,
            tag: u32::MAX,
            ..mid
        };
        let half = rules.len() / 2;
        let removed = (half..rules.len())
            .chain(0..half)
            .map(|i| rules[i].order)
            .find(|&o| c.with_changes(&[o], &[]).is_ok())
            .expect("a rule that can be removed without a rebuild");
        // Each sample averages many changes: one takes about a microsecond,
        // near the clock's resolution.
        const CHANGES: u32 = 2000;
        let changes: Vec<f64> = (0..runs.max(5))
            .map(|_| {
                let t = Instant::now();
                for _ in 0..CHANGES {
                    black_box(c.with_changes(&[], &[inserted]).expect("insert"));
                    black_box(c.with_changes(&[removed], &[]).expect("delete"));
                }
                t.elapsed().as_secs_f64() / f64::from(2 * CHANGES)
            })
            .collect();
        println!(
            "{set}: {} rules, build {:.1} ms (peak memory +{:.0} MB), {:.2} MB, \
             lookups {:.2} M/s (runs: {}), in bursts of {burst_len} {:.2} M/s (runs: {}), \
             single-rule change {:.2} us",
            rules.len(),
            median(builds) * 1e3,
            peak / 1e6,
            c.memory_bytes() as f64 / 1e6,
            median(rates.clone()),
            list(&rates),
            median(batch_rates.clone()),
            list(&batch_rates),
            median(changes) * 1e6,
        );
        let Some((classifiers, of_packet)) = tenants(&format!("{data}/{set}"), build) else {
            continue;
        };
        assert_eq!(
            of_packet.len(),
            trace.len(),
            "{set}: expected.csv and trace"
        );
        let per_key: Vec<&Classifier> = of_packet.iter().map(|&t| &classifiers[t]).collect();
        // Checked against each tenant's own single lookups first.
        let mut out = vec![None; trace.len()];
        for ((cs, keys), out) in per_key
            .chunks(burst_len)
            .zip(trace.chunks(burst_len))
            .zip(out.chunks_mut(burst_len))
        {
            Classifier::lookup_multi(cs, keys, out);
        }
        for ((k, c), got) in trace.iter().zip(&per_key).zip(&out) {
            assert_eq!(
                *got,
                c.lookup(k).map(|r| r.tag),
                "{set}: tenants, key {k:?}"
            );
        }
        let mut out = vec![None; burst_len];
        let multi_rates = timed(runs, secs, trace.len(), || {
            for (cs, keys) in per_key.chunks(burst_len).zip(trace.chunks(burst_len)) {
                Classifier::lookup_multi(cs, black_box(keys), &mut out);
                black_box(&out);
            }
        });
        println!(
            "{set}: over {} tenants, {:.2} MB, in bursts of {burst_len} {:.2} M/s (runs: {})",
            classifiers.len(),
            classifiers
                .iter()
                .map(Classifier::memory_bytes)
                .sum::<usize>() as f64
                / 1e6,
            median(multi_rates.clone()),
            list(&multi_rates),
        );
    }
}
