//! Rate limits: the token bucket a rule's [`RateLimit`] becomes, one
//! share of it per worker.

use std::sync::atomic::Ordering;

use super::config::RateLimit;
use super::counters::RuleCells;

/// Token units per packet, or per bit: tokens accrue at the limit's
/// `per_second` units per microsecond.
const UNITS: u64 = 1_000_000;

/// One worker's share of a [`RateLimit`], in token units.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bucket {
    /// Units per microsecond.
    rate: u64,
    /// Depth in units.
    cap: u64,
    bits: bool,
}

impl Bucket {
    /// The share of `l` each of `workers` workers enforces: an even part
    /// of rate and depth, but room for at least one packet.
    pub(super) fn share(l: &RateLimit, workers: usize) -> Bucket {
        let w = workers.max(1) as u64;
        let (depth, one) = if l.bits {
            (l.burst.saturating_mul(8), 1514 * 8)
        } else {
            (l.burst, 1)
        };
        Bucket {
            rate: (l.per_second / w).max(1),
            cap: (depth / w).max(one).saturating_mul(UNITS),
            bits: l.bits,
        }
    }

    /// Takes a `len`-byte packet's tokens from `cells` at `now_us`, after
    /// refilling; false (nothing taken) if there are not enough.
    #[inline]
    pub(super) fn take(&self, cells: &RuleCells, now_us: u64, len: u64) -> bool {
        let mut tokens = cells.tokens.load(Ordering::Relaxed);
        let last = cells.stamp.load(Ordering::Relaxed);
        if last == 0 {
            // First use in this snapshot: a full bucket.
            tokens = self.cap;
            cells.stamp.store(now_us.max(1), Ordering::Relaxed);
        } else if now_us > last {
            let add = u128::from(now_us - last) * u128::from(self.rate);
            tokens = (u128::from(tokens) + add).min(u128::from(self.cap)) as u64;
            cells.stamp.store(now_us, Ordering::Relaxed);
        }
        let cost = if self.bits {
            len.saturating_mul(8 * UNITS)
        } else {
            UNITS
        };
        let ok = tokens >= cost;
        if ok {
            tokens -= cost;
        }
        cells.tokens.store(tokens, Ordering::Relaxed);
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::testing::*;

    /// Rate-limited rules pass their burst, then their rate; what exceeds
    /// it is dropped as `RateLimited` and still counted on the rule.
    #[test]
    fn rate_limits_pass_the_burst_then_the_rate() {
        let mut t = tenant("t", &[(0, 0), (1, 0)], false);
        let mut dns = AclRule::any(1, 0, Family::V4);
        dns.proto = (proto::UDP, proto::UDP);
        dns.dst_port = (53, 53);
        let mut ntp = dns;
        ntp.order = 2;
        ntp.dst_port = (123, 123);
        let limited = |id: &str, matches, l| SwitchRule {
            id: id.into(),
            matches,
            allow: true,
            stateful: false,
            rate_limit: Some(l),
        };
        t.rules = vec![
            limited(
                "dns",
                dns,
                RateLimit {
                    per_second: 10,
                    bits: false,
                    burst: 5,
                },
            ),
            // 1000 bytes/s, 2000 bytes deep.
            limited(
                "ntp",
                ntp,
                RateLimit {
                    per_second: 8_000,
                    bits: true,
                    burst: 2_000,
                },
            ),
        ]
        .into();
        let (h, mut p) = switch(2, vec![t]);
        let limited_drop = Verdict::Drop(DropReason::RateLimited);
        let burst = |p: &mut SwitchPipeline, dport: u16, n: usize| {
            (0..n)
                .filter(|_| run(p, 0, udp(1, mac(2), None, dport)).0 != limited_drop)
                .count()
        };
        assert_eq!(burst(&mut p, 53, 20), 5, "the burst");
        p.now_us += 1_000_000;
        assert_eq!(
            burst(&mut p, 53, 20),
            5,
            "a second refills no more than the depth"
        );
        p.now_us += 300_000;
        assert_eq!(burst(&mut p, 53, 20), 3, "0.3 s at 10 packets/s");
        let c = h.traffic().rules[&("t".to_string(), "dns".to_string())];
        assert_eq!(c.packets, 60, "drops count on the rule");

        let frame = udp(1, mac(2), None, 123).len() as u64;
        let fits = (2_000 / frame) as usize;
        assert_eq!(burst(&mut p, 123, 100), fits, "bytes of depth");
        p.now_us += 500_000;
        assert_eq!(
            burst(&mut p, 123, 100),
            (500 / frame) as usize,
            "500 bytes in 0.5 s"
        );
    }
}
