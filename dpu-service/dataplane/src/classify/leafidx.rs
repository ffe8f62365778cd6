//! An index over the rules of one long leaf, so a lookup there does not
//! compare the key with every rule: per field, the leaf's rules cut the
//! field's values into segments, and each segment keeps the rules that
//! cover it as runs of consecutive rules (in the leaf's order). A key's
//! first matching rule is the first rule in the runs of all its
//! segments, found by stepping through the runs together (a leapfrog
//! join). Rules whose ranges nest or stagger, which leave a tree one long
//! leaf, give each segment a run or two, so a lookup takes a few binary
//! searches and steps instead of thousands of compares.

use std::collections::BTreeMap;

use super::rule::{AclRule, DIMS};

/// Leaves shorter than this are scanned: on ClassBench sets, whose
/// rules in a leaf seldom form runs, leaves of 64 to a few hundred rules
/// indexed took lookups to 0.5-0.8× of their scans.
pub(super) const INDEX_MIN: usize = 1024;
/// Runs an index may keep per rule of its leaf, all fields together; a
/// leaf whose rules would need more keeps to its scan.
const RUNS_PER_RULE: usize = 12;

/// Leaf entries a rule set may index: [`INDEXED_BASE`] and this many per
/// rule. Trees copy rules into many leaves, and an index costs tens of
/// bytes an entry; past the budget, leaves keep to their scans.
const INDEXED_PER_RULE: usize = 4;
/// See [`INDEXED_PER_RULE`].
const INDEXED_BASE: usize = 1 << 16;

/// The leaf entries a set of `rules` rules may index.
pub(super) fn indexed_budget(rules: usize) -> usize {
    INDEXED_BASE + INDEXED_PER_RULE * rules
}

/// One field's segments.
#[derive(Debug, Default)]
struct Field {
    /// The first value of each segment, ascending; the first is 0.
    starts: Vec<u128>,
    /// Per segment, where its runs start in [`LeafIndex::runs`]; one
    /// more entry closes the last segment's.
    at: Vec<u32>,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct LeafIndex {
    /// The fields some rule of the leaf does not cover whole; the others
    /// constrain nothing.
    fields: Vec<(u8, Field)>,
    /// Runs of leaf-local rule numbers, `[first, last]`.
    runs: Vec<(u32, u32)>,
    /// Leaf-local number to rule position.
    pos: Vec<u32>,
}

impl LeafIndex {
    /// The index of the leaf holding the rules at `ids` (positions in
    /// `rules`, ascending), whose fields span `whole` (per field, its
    /// largest value); `None` if it would pass its bound on runs.
    pub(super) fn build(rules: &[AclRule], ids: &[u32], whole: [u128; DIMS]) -> Option<LeafIndex> {
        LeafIndex::build_within(rules, ids, whole, RUNS_PER_RULE * ids.len())
    }

    /// [`LeafIndex::build`] with a bound of `budget` runs.
    fn build_within(
        rules: &[AclRule],
        ids: &[u32],
        whole: [u128; DIMS],
        mut budget: usize,
    ) -> Option<LeafIndex> {
        let m = ids.len();
        let mut x = LeafIndex {
            pos: ids.to_vec(),
            ..LeafIndex::default()
        };
        for (d, &top) in whole.iter().enumerate() {
            let ranges: Vec<(u128, u128)> = ids
                .iter()
                .map(|&i| {
                    let (lo, hi) = rules[i as usize].range(d);
                    (lo, hi.min(top))
                })
                .collect();
            if ranges.iter().all(|&(lo, hi)| lo == 0 && hi == top) {
                continue;
            }
            // Sweep the field's values: at each segment start, rules
            // enter and leave the set of covering rules, kept as runs.
            let mut events: Vec<(u128, bool, u32)> = Vec::with_capacity(2 * m);
            for (j, &(lo, hi)) in ranges.iter().enumerate() {
                events.push((lo, true, j as u32));
                if hi < top {
                    events.push((hi + 1, false, j as u32));
                }
            }
            events.sort_unstable();
            let mut live: BTreeMap<u32, u32> = BTreeMap::new();
            let mut field = Field::default();
            let mut e = 0;
            let mut start = 0u128;
            loop {
                while let Some(&(v, enters, j)) = events.get(e) {
                    if v != start {
                        break;
                    }
                    if enters {
                        insert(&mut live, j);
                    } else {
                        remove(&mut live, j);
                    }
                    e += 1;
                }
                if live.len() > budget {
                    return None;
                }
                budget -= live.len();
                field.starts.push(start);
                field.at.push(x.runs.len() as u32);
                x.runs.extend(live.iter().map(|(&a, &b)| (a, b)));
                match events.get(e) {
                    Some(&(v, _, _)) => start = v,
                    None => break,
                }
            }
            field.at.push(x.runs.len() as u32);
            x.fields.push((d as u8, field));
        }
        Some(x)
    }

    /// The position of the first rule of the leaf whose fields hold
    /// `values` (the key's, in [`AclRule::range`]'s order), whose position
    /// is below `bound`, and for which `alive` holds; `u32::MAX` if none.
    pub(super) fn first(
        &self,
        values: &[u128; DIMS],
        bound: u32,
        alive: impl Fn(u32) -> bool,
    ) -> u32 {
        let mut lists: [&[(u32, u32)]; DIMS] = [&[]; DIMS];
        for ((d, f), l) in self.fields.iter().zip(&mut lists) {
            let v = values[usize::from(*d)];
            // The last segment starting at or below `v` (the first starts at 0).
            let s = f.starts.partition_point(|&s| s <= v) - 1;
            *l = &self.runs[f.at[s] as usize..f.at[s + 1] as usize];
        }
        let lists = &mut lists[..self.fields.len()];
        let mut cand = 0u32;
        loop {
            let mut moved = false;
            for l in lists.iter_mut() {
                // Runs before the candidate are behind every later one too.
                let skip = l.partition_point(|&(_, b)| b < cand);
                *l = &l[skip..];
                let Some(&(a, _)) = l.first() else {
                    return u32::MAX;
                };
                if a > cand {
                    cand = a;
                    moved = true;
                }
            }
            let Some(&p) = self.pos.get(cand as usize) else {
                return u32::MAX;
            };
            if p >= bound {
                return u32::MAX;
            }
            if !moved {
                if alive(p) {
                    return p;
                }
                cand += 1;
            }
        }
    }

    /// Bytes of the index.
    pub(super) fn memory(&self) -> usize {
        self.fields
            .iter()
            .map(|(_, f)| f.starts.len() * 16 + f.at.len() * 4)
            .sum::<usize>()
            + self.runs.len() * 8
            + self.pos.len() * 4
    }
}

/// Adds `j` to the runs `live` (first to last), merging neighbours.
fn insert(live: &mut BTreeMap<u32, u32>, j: u32) {
    let before = live.range(..j).next_back().map(|(&a, &b)| (a, b));
    let after = live.get(&(j + 1)).copied();
    match (before.filter(|&(_, b)| b + 1 == j), after) {
        (Some((a, _)), Some(b)) => {
            live.remove(&(j + 1));
            live.insert(a, b);
        }
        (Some((a, _)), None) => {
            live.insert(a, j);
        }
        (None, Some(b)) => {
            live.remove(&(j + 1));
            live.insert(j, b);
        }
        (None, None) => {
            live.insert(j, j);
        }
    }
}

/// Removes `j` (which is in a run) from the runs `live`.
fn remove(live: &mut BTreeMap<u32, u32>, j: u32) {
    let Some((&a, &b)) = live.range(..=j).next_back() else {
        return;
    };
    if b < j {
        return;
    }
    live.remove(&a);
    if a < j {
        live.insert(a, j - 1);
    }
    if j < b {
        live.insert(j + 1, b);
    }
}

#[cfg(test)]
mod tests {
    use dpu_rand::Rng;

    use super::*;
    use crate::classify::rule::Family;

    fn values(r: &[u128]) -> [u128; DIMS] {
        std::array::from_fn(|d| r[d])
    }

    /// Nested, staggered and random ranges: the index answers as a scan
    /// of the leaf's rules does, with and without removed rules and
    /// bounds.
    #[test]
    fn answers_as_a_scan_does() {
        let whole = [
            u128::from(u32::MAX),
            u128::from(u32::MAX),
            65_535,
            65_535,
            255,
        ];
        let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
        let mut rnd = move |n: u64| rng.below(n);
        for shape in 0..3 {
            let n = 500u32;
            let rules: Vec<AclRule> = (0..n)
                .map(|i| {
                    let mut r = AclRule::any(i, i, Family::V4);
                    let k = u16::try_from(n - 1 - i).unwrap();
                    match shape {
                        0 => {
                            r.src_port = (k + 1, 65_534 - k);
                            r.dst_port = (i as u16, i as u16 + 300);
                        }
                        1 => {
                            r.dst = (
                                (10 << 24) | (5 * u128::from(k)),
                                ((10 << 24) | 0xff_ffff) - 5 * u128::from(k),
                            );
                            r.src_port = (i as u16 * 3, i as u16 * 3 + 700);
                        }
                        _ => {
                            let a = rnd(1000) as u16;
                            r.src_port = (a, a + rnd(2000) as u16);
                            let b = rnd(1000) as u16;
                            r.dst_port = (b, b + rnd(300) as u16);
                            r.proto = if rnd(2) == 0 { (6, 6) } else { (0, 255) };
                        }
                    }
                    r
                })
                .collect();
            let ids: Vec<u32> = (0..n).collect();
            // Random ranges need more runs than a leaf may keep.
            let idx = match shape {
                2 => {
                    assert!(LeafIndex::build(&rules, &ids, whole).is_none());
                    LeafIndex::build_within(&rules, &ids, whole, usize::MAX)
                }
                _ => LeafIndex::build(&rules, &ids, whole),
            };
            let idx = idx.expect("within its bound");
            let dead = |p: u32| p % 7 == 3;
            for t in 0..20_000 {
                let v = values(&[
                    rnd(1 << 32) as u128,
                    (10 << 24 | rnd(1 << 24)) as u128,
                    rnd(3000) as u128,
                    rnd(2000) as u128,
                    [6, 17][rnd(2) as usize],
                ]);
                let bound = if t % 3 == 0 {
                    rnd(u64::from(n)) as u32
                } else {
                    u32::MAX
                };
                let removed = t % 2 == 0;
                let want = rules
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (i as u32, r))
                    .filter(|&(i, r)| {
                        i < bound
                            && !(removed && dead(i))
                            && (0..DIMS).all(|d| {
                                let (lo, hi) = r.range(d);
                                lo <= v[d] && v[d] <= hi
                            })
                    })
                    .map(|(i, _)| i)
                    .next()
                    .unwrap_or(u32::MAX);
                let got = idx.first(&v, bound, |p| !(removed && dead(p)));
                assert_eq!(got, want, "shape {shape}, key {v:?}, bound {bound}");
            }
        }
    }

    /// Runs are merged and split as rules enter and leave.
    #[test]
    fn runs_merge_and_split() {
        let mut live = BTreeMap::new();
        for j in [3, 5, 4, 9, 10, 8] {
            insert(&mut live, j);
        }
        assert_eq!(live.into_iter().collect::<Vec<_>>(), vec![(3, 5), (8, 10)]);
        let mut live = BTreeMap::from([(3, 10)]);
        remove(&mut live, 6);
        remove(&mut live, 3);
        remove(&mut live, 10);
        assert_eq!(live.into_iter().collect::<Vec<_>>(), vec![(4, 5), (7, 9)]);
    }
}
