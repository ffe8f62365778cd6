//! Test support for the classifier's tests and other modules': random
//! rules shaped like ClassBench ACLs, and random keys aimed at them, drawn
//! from a seeded [`Rng`] so that failures reproduce.

use dpu_rand::Rng;

use super::rule::{AclRule, Family};
use crate::wire::FlowKey;

/// Rules shaped like ClassBench ACLs: a few address pools, prefixes of
/// varied length, exact or ranged ports, TCP/UDP/any.
pub(super) fn random_rules(rng: &mut Rng, n: usize, v6_share: u64) -> Vec<AclRule> {
    let pools: Vec<u128> = (0..6).map(|_| u128::from(rng.next_u32())).collect();
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
                    let base = *rng.pick(&pools);
                    let base = if width == 128 { base << 96 } else { base };
                    let len = *rng.pick(&[0u8, 8, 16, 24, 28, 32]);
                    let len = if width == 128 { len * 4 } else { len };
                    AclRule::prefix_range(base, len, width)
                };
                r.src = pick(rng);
                r.dst = pick(rng);
            }
            let ports = |rng: &mut Rng| match rng.below(4) {
                0 => (0, u16::MAX),
                1 => {
                    let p = *rng.pick(&[22u16, 53, 80, 443, 8080]);
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
        src: u128::from(rng.next_u32()),
        dst: u128::from(rng.next_u32()),
        src_port: rng.next_u32() as u16,
        dst_port: rng.next_u32() as u16,
        proto: *rng.pick(&[6u8, 17, 1, 47]),
        v6,
    };
    if v6 {
        k.src = (k.src << 96) | u128::from(rng.next_u64());
        k.dst = (k.dst << 96) | u128::from(rng.next_u64());
    }
    if rng.below(2) == 0 && !rules.is_empty() {
        let r = *rng.pick(rules);
        if (r.family == Family::V6) == v6 || r.family == Family::Any {
            let pick = |rng: &mut Rng, (a, b): (u128, u128)| match (b - a).checked_add(1) {
                Some(n) => a + rng.next_u128() % n,
                None => rng.next_u128(),
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
