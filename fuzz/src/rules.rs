//! Fuzzes the rule compiler: a fuzzed list of classification rules (any
//! shape the classifier accepts: ordered ranges, IPv4 within 32 bits,
//! family-less rules without addresses) is built into a
//! [`Classifier`], and every lookup, for fuzzed keys and for keys on and
//! just beside the rules' edges, must return the rule a first-match scan
//! with [`AclRule::matches`] finds, looked up one by one or in batches
//! ([`Classifier::lookup_batch`]). Then rounds of incremental changes
//! (removals and additions through [`Classifier::with_changes`], or a
//! rebuild where it asks for one) must keep agreeing with the scan, and
//! invalid changes must be refused. Never a panic. Run with
//! `fuzz/run.sh rules` from the repository root.

use std::collections::BTreeSet;

use arbitrary::{Arbitrary, Unstructured};
use dpu_dataplane::classify::{AclRule, ChangeError, Classifier, Family};
use dpu_dataplane::wire::FlowKey;

/// Most rules in one input (the classifier's own budgets bound its work;
/// this keeps each run short).
const MAX_RULES: usize = 300;

/// One dimension's range: a prefix or two bounds (put in order). Values
/// are 32 bits, placed at the top of an IPv6 address (few bytes per rule,
/// so inputs hold many rules); `Wide` gives any 128-bit range.
#[derive(Debug, Arbitrary)]
enum Range {
    Any,
    Exact(u32),
    Prefix(u32, u8),
    Bounds(u32, u32),
    Wide(u128, u128),
}

impl Range {
    fn resolve(&self, width: u32) -> (u128, u128) {
        let max = if width >= 128 {
            u128::MAX
        } else {
            (1u128 << width) - 1
        };
        // A 32-bit value in a field `width` bits wide: the top bits of an
        // IPv6 address, the low bits of a port.
        let place = |v: u32| {
            if width > 32 {
                u128::from(v) << (width - 32)
            } else {
                u128::from(v) & max
            }
        };
        let low = if width > 32 {
            (1u128 << (width - 32)) - 1
        } else {
            0
        };
        match *self {
            Range::Any => (0, max),
            Range::Exact(v) => (place(v), place(v)),
            Range::Prefix(a, len) => {
                AclRule::prefix_range(place(a), len % (width as u8 + 1), width)
            }
            Range::Bounds(a, b) => {
                let (a, b) = (place(a), place(b));
                (a.min(b), a.max(b) | low)
            }
            Range::Wide(a, b) => {
                let (a, b) = (a & max, b & max);
                (a.min(b), a.max(b))
            }
        }
    }
}

/// A rule as the fuzzer describes it.
#[derive(Debug, Arbitrary)]
struct RuleSpec {
    order: u16,
    family: u8,
    src: Range,
    dst: Range,
    src_port: Range,
    dst_port: Range,
    /// `None`: any protocol.
    proto: Option<u8>,
}

impl RuleSpec {
    fn rule(&self, tag: u32) -> AclRule {
        let family = match self.family % 3 {
            0 => Family::Any,
            1 => Family::V4,
            _ => Family::V6,
        };
        let mut r = AclRule::any(u32::from(self.order), tag, family);
        // A family-less rule has no addresses (`AclRule::any`'s).
        if family != Family::Any {
            let width = if family == Family::V6 { 128 } else { 32 };
            r.src = self.src.resolve(width);
            r.dst = self.dst.resolve(width);
        }
        let port = |x: &Range| {
            let (a, b) = x.resolve(16);
            (a as u16, b as u16)
        };
        r.src_port = port(&self.src_port);
        r.dst_port = port(&self.dst_port);
        r.proto = self.proto.map_or((0, u8::MAX), |p| (p, p));
        r
    }
}

/// A key as the fuzzer describes it: per dimension, a corner of a rule's
/// box (low, high, one below, one above) or a fuzzed value.
#[derive(Debug, Arbitrary)]
struct KeySpec {
    rule: u16,
    v6: bool,
    pick: [u8; 5],
    /// Addresses (IPv6: in the top and the low 32 bits).
    raw: [u32; 2],
    raw_ports: [u16; 2],
    raw_proto: u8,
}

impl KeySpec {
    fn key(&self, rules: &[AclRule]) -> FlowKey {
        let addr = |a: u32| {
            let a = u128::from(a);
            if self.v6 {
                a << 96 | a
            } else {
                a
            }
        };
        let mut k = FlowKey {
            src: addr(self.raw[0]),
            dst: addr(self.raw[1]),
            src_port: self.raw_ports[0],
            dst_port: self.raw_ports[1],
            proto: self.raw_proto,
            v6: self.v6,
        };
        if let Some(r) = (!rules.is_empty()).then(|| &rules[usize::from(self.rule) % rules.len()]) {
            let near = |(a, b): (u128, u128), raw: u128, pick: u8| match pick % 5 {
                0 => a,
                1 => b,
                2 => a.wrapping_sub(1),
                3 => b.wrapping_add(1),
                _ => raw,
            };
            k.src = near(r.src, k.src, self.pick[0]);
            k.dst = near(r.dst, k.dst, self.pick[1]);
            let p = |(a, b): (u16, u16)| (u128::from(a), u128::from(b));
            k.src_port = near(p(r.src_port), k.src_port.into(), self.pick[2]) as u16;
            k.dst_port = near(p(r.dst_port), k.dst_port.into(), self.pick[3]) as u16;
            let pr = (u128::from(r.proto.0), u128::from(r.proto.1));
            k.proto = near(pr, k.proto.into(), self.pick[4]) as u8;
        }
        if !k.v6 {
            // An IPv4 key's addresses are 32 bits.
            k.src &= u128::from(u32::MAX);
            k.dst &= u128::from(u32::MAX);
        }
        k
    }
}

/// One round of incremental changes.
#[derive(Debug, Arbitrary)]
struct Change {
    /// Live rules to remove, by index into the live list.
    remove: Vec<u16>,
    add: Vec<RuleSpec>,
}

/// The whole input: the rules to build, the keys to look up after the
/// build and after each round of changes, the rounds (at most four).
#[derive(Debug, Arbitrary)]
struct Input {
    rules: Vec<RuleSpec>,
    keys: Vec<KeySpec>,
    changes: Vec<Change>,
}

/// The first rule (smallest order) matching `key`: the reference.
fn scan(rules: &[AclRule], key: &FlowKey) -> Option<(u32, u32)> {
    rules
        .iter()
        .filter(|r| r.matches(key))
        .min_by_key(|r| r.order)
        .map(|r| (r.order, r.tag))
}

/// The same key in the other address family.
fn other_family(mut k: FlowKey) -> FlowKey {
    k.v6 = !k.v6;
    if !k.v6 {
        k.src &= u128::from(u32::MAX);
        k.dst &= u128::from(u32::MAX);
    }
    k
}

fn agree(c: &Classifier, rules: &[AclRule], keys: &[KeySpec], what: &str) {
    assert_eq!(c.len(), rules.len(), "{what}: live rules");
    assert_eq!(c.is_empty(), rules.is_empty(), "{what}");
    let mut all = Vec::new();
    for ks in keys {
        let k = ks.key(rules);
        for key in [k, other_family(k)] {
            let got = c.lookup(&key).map(|r| (r.order, r.tag));
            assert_eq!(got, scan(rules, &key), "{what}: key {key:?}");
            all.push(key);
        }
    }
    // The same keys in one batch (families mixed, bursts of any length)
    // get the same answers.
    let mut out = vec![None; all.len()];
    c.lookup_batch(&all, &mut out);
    for (key, &got) in all.iter().zip(&out) {
        let want = scan(rules, key).map(|(_, tag)| tag);
        assert_eq!(got, want, "{what}: batch, key {key:?}");
    }
}

/// Runs the target on one input: builds an `Input` from the bytes as
/// libFuzzer's `fuzz_target!(|input: Input| ...)` (libfuzzer-sys 0.4)
/// does, and checks it. As there, an input shorter than the least an
/// `Input` takes, or one that does not build, is skipped.
pub fn run(data: &[u8]) {
    if data.len() < <Input as Arbitrary>::size_hint(0).0 {
        return;
    }
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    check(input);
}

/// The target proper: what `fuzz_target!` ran on a built [`Input`].
fn check(input: Input) {
    let mut orders = BTreeSet::new();
    let mut next_tag = 0u32;
    let mut rules: Vec<AclRule> = Vec::new();
    for s in input.rules.iter().take(MAX_RULES) {
        // Orders are unique: later duplicates are dropped.
        if orders.insert(s.order) {
            rules.push(s.rule(next_tag));
            next_tag += 1;
        }
    }
    let mut c = Classifier::build(&rules);
    agree(&c, &rules, &input.keys, "build");

    for (round, ch) in input.changes.iter().take(4).enumerate() {
        let mut remove = Vec::new();
        for &i in &ch.remove {
            if rules.is_empty() {
                break;
            }
            let r = rules.swap_remove(usize::from(i) % rules.len());
            remove.push(r.order);
        }
        for o in &remove {
            orders.remove(&(*o as u16));
        }
        let mut add = Vec::new();
        for s in ch.add.iter().take(MAX_RULES) {
            if orders.insert(s.order) {
                add.push(s.rule(next_tag));
                next_tag += 1;
            }
        }
        // Changes that are wrong must be refused, and change nothing.
        let missing =
            (0..=u16::MAX).find(|o| !orders.contains(o) && !remove.contains(&u32::from(*o)));
        if let Some(o) = missing {
            assert_eq!(
                c.with_changes(&[u32::from(o)], &[]).map(|_| ()),
                Err(ChangeError::NoSuchRule(u32::from(o))),
            );
        }
        if let Some(r) = rules.first() {
            let dup = AclRule {
                tag: u32::MAX,
                ..*r
            };
            assert_eq!(
                c.with_changes(&[], &[dup]).map(|_| ()),
                Err(ChangeError::DuplicateOrder(r.order)),
            );
        }
        rules.extend_from_slice(&add);
        let what = format!("round {round}: -{remove:?} +{}", add.len());
        c = match c.with_changes(&remove, &add) {
            Ok(next) => next,
            Err(e) if e.needs_rebuild() => Classifier::build(&rules),
            Err(e) => panic!("{what}: valid change refused: {e}"),
        };
        agree(&c, &rules, &input.keys, &what);
    }
}
