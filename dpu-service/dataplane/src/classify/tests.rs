//! Test support for the classifier's tests, and for other modules'
//! (`Rng`): a small deterministic generator, random rules shaped like
//! ClassBench ACLs, and random keys aimed at them.

use super::rule::{AclRule, Family};
use crate::wire::FlowKey;

/// A small deterministic generator (xorshift), so failures reproduce.
pub(crate) struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Rules shaped like ClassBench ACLs: a few address pools, prefixes of
/// varied length, exact or ranged ports, TCP/UDP/any.
pub(super) fn random_rules(rng: &mut Rng, n: usize, v6_share: u64) -> Vec<AclRule> {
    let pools: Vec<u128> = (0..6).map(|_| u128::from(rng.next() as u32)).collect();
    (0..n)
        .map(|i| {
            let v6 = rng.below(100) < v6_share;
            let family = match rng.below(10) {
                0 => Family::Any,
                _ if v6 => Family::V6,
                _ => Family::V4,
            };
            let mut r = AclRule::any(i as u32 * 3 + 1, i as u32, family);
            if family != Family::Any {
                let width = if family == Family::V6 { 128 } else { 32 };
                let pick = |rng: &mut Rng| {
                    let base = pools[rng.below(6) as usize];
                    let base = if width == 128 { base << 96 } else { base };
                    let len = [0u8, 8, 16, 24, 28, 32][rng.below(6) as usize];
                    let len = if width == 128 { len * 4 } else { len };
                    AclRule::prefix_range(base, len, width)
                };
                r.src = pick(rng);
                r.dst = pick(rng);
            }
            let ports = |rng: &mut Rng| match rng.below(4) {
                0 => (0, u16::MAX),
                1 => {
                    let p = [22u16, 53, 80, 443, 8080][rng.below(5) as usize];
                    (p, p)
                }
                2 => (1024, u16::MAX),
                _ => {
                    let a = rng.below(60000) as u16;
                    (a, a.saturating_add(rng.below(5000) as u16))
                }
            };
            r.src_port = ports(rng);
            r.dst_port = ports(rng);
            r.proto = match rng.below(4) {
                0 => (0, 255),
                1 => (17, 17),
                _ => (6, 6),
            };
            r
        })
        .collect()
}

pub(super) fn random_key(rng: &mut Rng, rules: &[AclRule]) -> FlowKey {
    // Half the keys aim inside a rule's box so matches are common.
    let v6 = rng.below(4) == 0;
    let mut k = FlowKey {
        src: u128::from(rng.next() as u32),
        dst: u128::from(rng.next() as u32),
        src_port: rng.next() as u16,
        dst_port: rng.next() as u16,
        proto: [6u8, 17, 1, 47][rng.below(4) as usize],
        v6,
    };
    if v6 {
        k.src = (k.src << 96) | u128::from(rng.next());
        k.dst = (k.dst << 96) | u128::from(rng.next());
    }
    if rng.below(2) == 0 && !rules.is_empty() {
        let r = rules[rng.below(rules.len() as u64) as usize];
        if (r.family == Family::V6) == v6 || r.family == Family::Any {
            let pick = |rng: &mut Rng, (a, b): (u128, u128)| match (b - a).checked_add(1) {
                Some(n) => a + (rng.next() as u128 % n),
                None => (u128::from(rng.next()) << 64) | u128::from(rng.next()),
            };
            if r.family != Family::Any {
                k.src = pick(rng, r.src);
                k.dst = pick(rng, r.dst);
            }
            k.src_port = pick(rng, (r.src_port.0.into(), r.src_port.1.into())) as u16;
            k.dst_port = pick(rng, (r.dst_port.0.into(), r.dst_port.1.into())) as u16;
            k.proto = pick(rng, (r.proto.0.into(), r.proto.1.into())) as u8;
        }
    }
    k
}
