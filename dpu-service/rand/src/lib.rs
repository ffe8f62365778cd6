//! A small seeded pseudo-random generator for tests, benchmarks, fuzz
//! harnesses and load generators: [`Rng`], SplitMix64 (Steele, Lea and
//! Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014)
//! with the few helpers those callers need.
//!
//! What it promises:
//! - the same seed gives the same sequence, on every machine, in every
//!   build and in every version of this crate, so a failing case is
//!   reproduced from the seed its test printed (the sequence is pinned by
//!   this crate's tests);
//! - every seed, 0 included, starts a sequence of period 2^64, and nearby
//!   seeds (1, 2, 3, ...) give unrelated sequences: callers need not mix
//!   their seeds first;
//! - no dependencies, no `unsafe`, no global state, no clock.
//!
//! What it does not do: it is not cryptographic (its output predicts the
//! rest), and it takes no entropy from the system. Keys, nonces and
//! anything a peer must not guess come from `getrandom`.
//!
//! ```
//! use dpu_rand::Rng;
//!
//! let mut rng = Rng::new(7);
//! let port = rng.range(1024..65_536);
//! let mut payload = [0u8; 13];
//! rng.fill(&mut payload);
//! let proto = *rng.pick(&[6u8, 17]);
//! // The same seed, the same draws.
//! assert_eq!(Rng::new(7).range(1024..65_536), port);
//! assert!(proto == 6 || proto == 17);
//! ```

#![forbid(unsafe_code)]

use std::ops::Range;

/// The increment of SplitMix64's state, 2^64 divided by the golden ratio
/// (odd, so the state visits every value once per period).
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// A seeded generator: deterministic, small (one `u64`) and fast, for
/// picking test cases, benchmark keys, fuzzed worlds and I/O offsets.
///
/// Not `Copy`: a copy taken by accident would repeat the sequence. Clone
/// it where a repeat is what is wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`. Any seed is good, 0 included: the
    /// output is the state after a mixing function, never the state
    /// itself.
    pub const fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next 32 random bits (the high half of [`next_u64`](Self::next_u64)).
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// The next 128 random bits (two draws, the first in the high half),
    /// for IPv6 addresses and 128-bit keys.
    pub fn next_u128(&mut self) -> u128 {
        let high = self.next_u64();
        (u128::from(high) << 64) | u128::from(self.next_u64())
    }

    /// A number in `0..n`, from one draw.
    ///
    /// Lemire's multiply-shift, without the rejection step: each value
    /// comes up with probability `1/n` give or take `2^-64`, an error no
    /// test can observe, and every call takes exactly one draw (so the
    /// rest of a sequence does not depend on how often a rejection
    /// happened).
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0): the range 0..0 is empty");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// An index into a slice of `len` items: [`below`](Self::below) for
    /// `usize`.
    ///
    /// # Panics
    ///
    /// If `len` is 0.
    pub fn index(&mut self, len: usize) -> usize {
        assert!(len > 0, "Rng::index(0): there is no index into nothing");
        self.below(len as u64) as usize
    }

    /// A number in `range` (`lo..hi`, `hi` excluded), from one draw.
    ///
    /// # Panics
    ///
    /// If the range is empty.
    pub fn range(&mut self, range: Range<u64>) -> u64 {
        assert!(
            range.start < range.end,
            "Rng::range({range:?}): the range is empty"
        );
        range.start + self.below(range.end - range.start)
    }

    /// True with probability `n / of` (always when `n >= of`): a drop
    /// rate per thousand is `chance(rate, 1000)`.
    ///
    /// # Panics
    ///
    /// If `of` is 0.
    pub fn chance(&mut self, n: u64, of: u64) -> bool {
        self.below(of) < n
    }

    /// True or false, each with probability one half.
    pub fn bool(&mut self) -> bool {
        self.next_u64() >> 63 == 1
    }

    /// Fills `bytes` with random bytes, eight from each draw (the last
    /// draw's low bytes for a tail shorter than eight).
    pub fn fill(&mut self, bytes: &mut [u8]) {
        let mut words = bytes.chunks_exact_mut(8);
        for word in &mut words {
            word.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let tail = words.into_remainder();
        if !tail.is_empty() {
            let last = self.next_u64().to_le_bytes();
            tail.copy_from_slice(&last[..tail.len()]);
        }
    }

    /// One of `items`, each as likely.
    ///
    /// # Panics
    ///
    /// If `items` is empty.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }

    /// Puts `items` in a random order, each order as likely
    /// (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.index(i + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sequence is SplitMix64's: the reference implementation's first
    /// outputs for seed 0, and the published algorithm written out again
    /// for another seed. Seeds printed by failing tests and committed fuzz
    /// inputs rely on it.
    #[test]
    fn the_sequence_is_splitmix64() {
        let mut r = Rng::new(0);
        assert_eq!(
            [r.next_u64(), r.next_u64(), r.next_u64()],
            [
                0xe220_a839_7b1d_cdaf,
                0x6e78_9e6a_a1b9_65f4,
                0x06c4_5d18_8009_454f
            ]
        );
        let mut r = Rng::new(0x0123_4567_89ab_cdef);
        let mut model = 0x0123_4567_89ab_cdef_u64;
        for _ in 0..1000 {
            model = model.wrapping_add(GAMMA);
            let mut z = model;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            assert_eq!(r.next_u64(), z ^ (z >> 31));
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_sequence() {
        for seed in [0, 1, 2, 0x5eed, u64::MAX] {
            let (mut a, mut b) = (Rng::new(seed), Rng::new(seed));
            for _ in 0..1000 {
                assert_eq!(a.next_u64(), b.next_u64(), "seed {seed}");
            }
            let mut c = a.clone();
            assert_eq!(a.next_u128(), c.next_u128());
        }
    }

    /// Nearby seeds, 0 included, start unrelated sequences: no two of the
    /// first thousand seeds share any of their first sixteen outputs.
    #[test]
    fn nearby_seeds_give_unrelated_sequences() {
        let mut seen = std::collections::HashSet::new();
        for seed in 0..1000 {
            let mut r = Rng::new(seed);
            for _ in 0..16 {
                let v = r.next_u64();
                assert_ne!(v, 0, "seed {seed}");
                assert!(seen.insert(v), "seed {seed} repeats {v:#x}");
            }
        }
    }

    #[test]
    fn below_stays_below() {
        let mut r = Rng::new(7);
        for n in [1, 2, 3, 7, 10, 255, 1000, 1 << 32, (1 << 63) + 1, u64::MAX] {
            for _ in 0..1000 {
                assert!(r.below(n) < n, "below({n})");
            }
        }
        assert_eq!(r.below(1), 0);
        for len in [1usize, 2, 5, 100] {
            assert!(r.index(len) < len);
        }
    }

    #[test]
    #[should_panic(expected = "Rng::below(0)")]
    fn below_zero_panics() {
        Rng::new(1).below(0);
    }

    #[test]
    #[should_panic(expected = "is empty")]
    fn an_empty_range_panics() {
        Rng::new(1).range(5..5);
    }

    /// Ten buckets, 100,000 draws: Pearson's chi-square with nine degrees
    /// of freedom stays under 33.7 (p = 0.0001). A generator or a `below`
    /// with a real bias (a stuck bit, a modulo of too few bits) fails.
    #[test]
    fn below_is_uniform_enough() {
        for seed in [1, 2, 3] {
            let mut r = Rng::new(seed);
            let mut counts = [0u32; 10];
            let draws = 100_000;
            for _ in 0..draws {
                counts[r.below(10) as usize] += 1;
            }
            let expected = f64::from(draws) / 10.0;
            let chi2: f64 = counts
                .iter()
                .map(|&c| (f64::from(c) - expected).powi(2) / expected)
                .sum();
            assert!(chi2 < 33.7, "seed {seed}: chi-square {chi2:.1}, {counts:?}");
        }
    }

    /// Every bit of the output is set in about half the draws (within
    /// five standard deviations of 10,000 draws).
    #[test]
    fn every_bit_varies() {
        let mut r = Rng::new(0);
        let mut ones = [0u32; 64];
        for _ in 0..10_000 {
            let v = r.next_u64();
            for (bit, n) in ones.iter_mut().enumerate() {
                *n += (v >> bit & 1) as u32;
            }
        }
        for (bit, &n) in ones.iter().enumerate() {
            assert!((4750..=5250).contains(&n), "bit {bit} set {n} times");
        }
        let (mut r32, mut halves) = (Rng::new(9), 0);
        for _ in 0..10_000 {
            halves += r32.next_u32() >> 31;
        }
        assert!((4750..=5250).contains(&halves), "{halves}");
    }

    #[test]
    fn range_chance_and_bool_keep_their_bounds_and_rates() {
        let mut r = Rng::new(11);
        let (mut low, mut high) = (false, false);
        for _ in 0..10_000 {
            let v = r.range(10..13);
            assert!((10..13).contains(&v));
            low |= v == 10;
            high |= v == 12;
        }
        assert!(low && high, "both ends come up");
        assert_eq!(r.range(u64::MAX - 1..u64::MAX), u64::MAX - 1);

        let hits = (0..100_000).filter(|_| r.chance(250, 1000)).count();
        assert!((24_300..=25_700).contains(&hits), "{hits}");
        assert!((0..1000).all(|_| r.chance(5, 5) && !r.chance(0, 5)));
        let heads = (0..100_000).filter(|_| r.bool()).count();
        assert!((49_200..=50_800).contains(&heads), "{heads}");
    }

    /// `fill` writes every byte, the tail shorter than a word included:
    /// its bytes are the draws' little-endian bytes, in order.
    #[test]
    fn fill_covers_the_tail() {
        for len in 0..=25 {
            for junk in [0x00, 0xff, 0xa5] {
                let mut r = Rng::new(len as u64);
                let mut model = r.clone();
                let mut buf = vec![junk; len];
                r.fill(&mut buf);
                let want: Vec<u8> = (0..len.div_ceil(8))
                    .flat_map(|_| model.next_u64().to_le_bytes())
                    .take(len)
                    .collect();
                assert_eq!(buf, want, "length {len}");
                // One draw per word started: the generators agree after.
                assert_eq!(r, model, "length {len}");
            }
        }
        // Over a few fills, every byte of the tail takes many values.
        let mut r = Rng::new(3);
        let mut seen = [[false; 256]; 13];
        for _ in 0..2000 {
            let mut buf = [0u8; 13];
            r.fill(&mut buf);
            for (at, &b) in buf.iter().enumerate() {
                seen[at][usize::from(b)] = true;
            }
        }
        for (at, s) in seen.iter().enumerate() {
            let n = s.iter().filter(|&&x| x).count();
            assert!(n > 200, "byte {at} took {n} values");
        }
    }

    #[test]
    fn pick_and_shuffle_reach_every_outcome() {
        let mut r = Rng::new(5);
        let items = ["a", "b", "c", "d"];
        let mut picked = [0u32; 4];
        for _ in 0..4000 {
            let p = r.pick(&items);
            picked[items.iter().position(|i| i == p).unwrap()] += 1;
        }
        assert!(
            picked.iter().all(|&n| (850..=1150).contains(&n)),
            "{picked:?}"
        );

        // The six orders of three items, each about a sixth of the time.
        let mut orders = std::collections::HashMap::new();
        for _ in 0..6000 {
            let mut v = [0, 1, 2];
            r.shuffle(&mut v);
            *orders.entry(v).or_insert(0u32) += 1;
        }
        assert_eq!(orders.len(), 6, "{orders:?}");
        assert!(
            orders.values().all(|&n| (850..=1150).contains(&n)),
            "{orders:?}"
        );
        let mut none: [u8; 0] = [];
        r.shuffle(&mut none);
        let mut one = [9];
        r.shuffle(&mut one);
        assert_eq!(one, [9]);
    }
}
