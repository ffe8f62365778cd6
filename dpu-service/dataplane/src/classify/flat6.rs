//! The IPv6 lookup form of a family's trees, [`Flat6`]: every node one
//! `u64` in one flat array, as IPv4's `Flat4`, over a key of 32-bit
//! words, so a level of a walk is one load and a 32-bit shift and mask
//! where the trees as built take two loads (the node's child list, then
//! the child) and a 128-bit shift.
//!
//! A cut whose bits cross a 32-bit boundary of an address becomes two
//! levels: the bits above the boundary, then below it. Leaves keep their
//! rules as positions in the set, as the trees do: an IPv6 rule's bounds
//! take 80 bytes, and keeping them inline in the leaves measured no
//! faster through the switch for 1.7-3.7× the memory.

use std::collections::HashMap;

use dpu_os::cache::prefetch;

use super::flat4::{cut_entry, is_set, step, Entry, LOCKSTEP};
use super::leafidx::{LeafIndex, INDEX_MIN};
use super::rule::{key_value, AclRule, DIMS};
use super::tree::{Node, Tree};
use crate::wire::FlowKey;

/// An IPv6 key as 32-bit words indexed by a node's word number: source
/// address words 0..4 (word `w` holds bits `32w..32w + 32`), destination
/// address 4..8, source port 8, destination port 9, protocol 10; the
/// padding lets a node's 4-bit word number index it without a bounds
/// check.
#[derive(Debug, Clone, Copy)]
pub(super) struct Key6 {
    words: [u32; 16],
}

impl Key6 {
    #[inline]
    pub(super) fn new(key: &FlowKey) -> Key6 {
        let mut words = [0u32; 16];
        for w in 0..4 {
            words[w] = (key.src >> (32 * w)) as u32;
            words[4 + w] = (key.dst >> (32 * w)) as u32;
        }
        words[8] = u32::from(key.src_port);
        words[9] = u32::from(key.dst_port);
        words[10] = u32::from(key.proto);
        Key6 { words }
    }
}

/// A node's entry has `Flat4`'s layout with 16 key words: bits 0..32
/// the first child entry, 32..37 the shift within the word, 37..41 the
/// key word ([`Key6`]), 48..64 the mask of the cut bits, and this bit set
/// for a leaf. A leaf has mask 0 and points at its own slot, so stepping
/// from a leaf stays there and every walk of a tree takes the tree's
/// depth in steps. Leaf slots come after all cut blocks, one per distinct
/// leaf, in the order of [`Flat6::leaves`].
const LEAF_FLAG: Entry = 1 << 41;
/// Every IPv6 field's largest value.
pub(super) const WHOLE: [u128; DIMS] = [u128::MAX, u128::MAX, 65_535, 65_535, 255];

/// How a tree node's cut reads a [`Key6`]: (word, shift, bits) per
/// level, the bits above a word boundary first; a cut within one word
/// takes one level (the second has no bits).
fn levels(n: &Node) -> [(u32, u32, u32); 2] {
    let (dim, shift, bits) = (u32::from(n.dim), u32::from(n.shift), u32::from(n.bits));
    if dim >= 2 {
        return [(8 + dim - 2, shift, bits), (0, 0, 0)];
    }
    let (lo, hi) = (shift / 32, (shift + bits - 1) / 32);
    if lo == hi {
        return [(4 * dim + lo, shift % 32, bits), (0, 0, 0)];
    }
    let below = 32 * hi - shift;
    [
        (4 * dim + hi, 0, bits - below),
        (4 * dim + lo, shift % 32, below),
    ]
}

/// The IPv6 trees of a `Set` in their lookup form.
#[derive(Debug, Default)]
pub(super) struct Flat6 {
    /// Per tree, in order of their first rule: the root entry, the
    /// tree's depth in steps, its smallest rule position.
    pub(super) trees: Vec<(Entry, u32, u32)>,
    nodes: Vec<Entry>,
    /// The first leaf slot in `nodes`.
    leaf0: u32,
    /// Per leaf slot (from `leaf0`): where its rules start in
    /// `leaf_rules`, how many, and its index in `indexes` (`u32::MAX` if
    /// it has none: leaves of fewer than [`INDEX_MIN`] rules, or whose
    /// index did not fit).
    leaves: Vec<(u32, u32, u32)>,
    /// Every leaf's rule positions, ascending within a leaf.
    leaf_rules: Vec<u32>,
    indexes: Vec<LeafIndex>,
}

impl Flat6 {
    /// The trees' lookup form; takes the trees' leaf indexes
    /// ([`Tree::index_leaves`]).
    pub(super) fn new(trees: &mut [Tree]) -> Flat6 {
        fn kids<'t>(t: &'t Tree, n: &Node) -> &'t [u32] {
            &t.children[n.first as usize..n.first as usize + (1 << n.bits)]
        }
        let mut f = Flat6::default();
        // Cut blocks first (slot 0 is spare), then one slot per leaf.
        let mut cuts = 0usize;
        for n in trees
            .iter()
            .flat_map(|t| t.nodes.iter().filter(|n| n.bits > 0))
        {
            cuts += 1 << n.bits;
            let [top, low] = levels(n);
            if low.2 > 0 {
                cuts += 1 << top.2;
            }
        }
        f.leaf0 = 1 + cuts as u32;
        f.nodes.resize(1 + cuts, 0);
        let mut next_cut = 1usize;
        let mut taken: Vec<HashMap<u32, LeafIndex>> =
            trees.iter_mut().map(Tree::take_indexes).collect();
        let trees: &[Tree] = trees;
        let mut leaves: HashMap<&[u32], Entry> = HashMap::new();
        for (t, taken) in trees.iter().zip(&mut taken) {
            let mut height = vec![0u32; t.nodes.len()];
            for (i, n) in t.nodes.iter().enumerate().rev() {
                if n.bits > 0 {
                    let split = u32::from(levels(n)[1].2 > 0);
                    height[i] = 1
                        + split
                        + kids(t, n)
                            .iter()
                            .map(|&c| height[c as usize])
                            .max()
                            .unwrap_or(0);
                }
            }
            // Per node: its entry, and for a cut the slot of its children.
            let mut entry = vec![0 as Entry; t.nodes.len()];
            let mut block = vec![0usize; t.nodes.len()];
            for i in 0..t.nodes.len() {
                let n = t.nodes[i];
                if n.bits > 0 {
                    let [top, low] = levels(&n);
                    if low.2 == 0 {
                        entry[i] = cut_entry::<16>(next_cut as u32, top.0, top.1, top.2);
                        block[i] = next_cut;
                        next_cut += 1 << n.bits;
                    } else {
                        // The upper bits pick one of 2^top blocks of the
                        // lower bits' children, laid out as the tree's.
                        let mid = next_cut;
                        next_cut += 1 << top.2;
                        let children = next_cut;
                        next_cut += 1 << n.bits;
                        for h in 0..1usize << top.2 {
                            f.nodes[mid + h] = cut_entry::<16>(
                                (children + (h << low.2)) as u32,
                                low.0,
                                low.1,
                                low.2,
                            );
                        }
                        entry[i] = cut_entry::<16>(mid as u32, top.0, top.1, top.2);
                        block[i] = children;
                    }
                    continue;
                }
                let ids = &t.leaf_rules[n.first as usize..(n.first + n.len) as usize];
                if let Some(&e) = leaves.get(ids) {
                    entry[i] = e;
                    continue;
                }
                let slot = f.nodes.len() as Entry;
                let e = LEAF_FLAG | slot;
                f.nodes.push(e);
                let index = if ids.len() >= INDEX_MIN {
                    taken.remove(&n.first)
                } else {
                    None
                };
                let index = index.map(|x| {
                    f.indexes.push(x);
                    f.indexes.len() as u32 - 1
                });
                f.leaves.push((
                    f.leaf_rules.len() as u32,
                    ids.len() as u32,
                    index.unwrap_or(u32::MAX),
                ));
                f.leaf_rules.extend_from_slice(ids);
                leaves.insert(ids, e);
                entry[i] = e;
            }
            for (i, n) in t.nodes.iter().enumerate() {
                if n.bits > 0 {
                    for (s, &c) in f.nodes[block[i]..].iter_mut().zip(kids(t, n)) {
                        *s = entry[c as usize];
                    }
                }
            }
            f.trees.push((entry[0], height[0], t.min_pos));
        }
        f
    }

    /// The first live rule position below `bound` in the leaf `e` whose
    /// rule matches `key` (`u32::MAX` if none).
    #[inline]
    fn leaf_match(
        &self,
        rules: &[AclRule],
        e: Entry,
        key: &FlowKey,
        dead: Option<&[u64]>,
        bound: u32,
    ) -> u32 {
        let leaf = (e as u32).wrapping_sub(self.leaf0) as usize;
        let Some(&(first, len, index)) = self.leaves.get(leaf) else {
            return u32::MAX;
        };
        if let Some(x) = self.indexes.get(index as usize) {
            let values = std::array::from_fn(|d| key_value(key, d));
            return x.first(&values, bound, |p| dead.is_none_or(|d| !is_set(d, p)));
        }
        let ids = &self.leaf_rules[first as usize..(first + len) as usize];
        ids.iter()
            .copied()
            .take_while(|&p| p < bound)
            .find(|&p| dead.is_none_or(|d| !is_set(d, p)) && rules[p as usize].dims_match(key))
            .unwrap_or(u32::MAX)
    }

    /// Starts loading where the leaf `e` lists its rules.
    #[inline(always)]
    fn prefetch_leaf(&self, e: Entry) {
        let leaf = (e as u32).wrapping_sub(self.leaf0) as usize;
        if let Some(l) = self.leaves.get(leaf) {
            prefetch(l);
        }
    }

    /// Position of the first rule (in order) of `rules`, the set's,
    /// matching `key` whose bit in `dead` is clear: up to [`LOCKSTEP`]
    /// trees' walks side by side, since one walk waits on a load per
    /// level; then the leaves in the trees' order, each read only if it
    /// can hold an earlier rule than those found.
    #[inline]
    pub(super) fn lookup(
        &self,
        rules: &[AclRule],
        key: &FlowKey,
        dead: Option<&[u64]>,
    ) -> Option<usize> {
        let k = Key6::new(key);
        let mut best = u32::MAX;
        for trees in self.trees.chunks(LOCKSTEP) {
            if trees[0].2 >= best {
                break;
            }
            let mut es = [0 as Entry; LOCKSTEP];
            let mut depth = 0;
            for (e, t) in es.iter_mut().zip(trees) {
                *e = t.0;
                depth = depth.max(t.1);
            }
            let es = &mut es[..trees.len()];
            for _ in 0..depth {
                for e in es.iter_mut() {
                    *e = step(&self.nodes, &k.words, *e);
                }
            }
            for &e in es.iter() {
                self.prefetch_leaf(e);
            }
            for (&e, t) in es.iter().zip(trees) {
                if t.2 >= best {
                    break;
                }
                best = best.min(self.leaf_match(rules, e, key, dead, best));
            }
        }
        (best != u32::MAX).then_some(best as usize)
    }

    /// Leaves with an index.
    #[cfg(test)]
    pub(super) fn indexed(&self) -> usize {
        self.indexes.len()
    }

    pub(super) fn memory(&self) -> usize {
        self.trees.len() * 16
            + self.nodes.len() * std::mem::size_of::<Entry>()
            + self.leaves.len() * 12
            + self.leaf_rules.len() * 4
            + self.indexes.iter().map(LeafIndex::memory).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use dpu_rand::Rng;

    use super::*;
    use crate::classify::rule::Family;
    use crate::classify::tree::Builder;

    /// Prefixes ending on both sides of the addresses' 32-bit word
    /// boundaries make cuts across them: the flat walk finds the first
    /// matching rule, as a scan does, on keys at and around every bound.
    #[test]
    fn walks_across_word_boundaries_find_the_first_match() {
        let mut rng = Rng::new(7);
        let lens = [
            0u32, 28, 30, 31, 33, 34, 36, 60, 63, 65, 66, 70, 94, 95, 97, 98, 100, 126, 127, 128,
        ];
        let base = 0x2001_0db8u128 << 96;
        let rules: Vec<AclRule> = (0..600u32)
            .map(|i| {
                let mut r = AclRule::any(i, i, Family::V6);
                let pick = |rng: &mut Rng| {
                    let len = *rng.pick(&lens);
                    let a = base | (u128::from(rng.next_u64()) << 32) | u128::from(rng.below(8));
                    AclRule::prefix_range(a, len as u8, 128)
                };
                r.src = pick(&mut rng);
                r.dst = pick(&mut rng);
                if rng.below(2) == 0 {
                    let p = rng.below(1000) as u16;
                    r.dst_port = (p, p + rng.below(50) as u16);
                }
                r
            })
            .collect();
        let mut pruners = vec![0u64; rules.len().div_ceil(64)];
        let tree = Builder::build(&rules, (0..rules.len() as u32).collect(), 128, &mut pruners);
        let split = tree
            .nodes
            .iter()
            .filter(|n| n.bits > 0 && levels(n)[1].2 > 0)
            .count();
        assert!(split > 0, "no cut crosses a word boundary");
        // Only the tree's rules count: pruned ones are hidden anyway.
        let mut trees = [tree];
        let flat = Flat6::new(&mut trees);
        let scan = |k: &FlowKey| rules.iter().position(|r| r.dims_match(k));
        let mut checked = 0;
        for r in &rules {
            for (s, d) in [
                (r.src.0, r.dst.0),
                (r.src.1, r.dst.1),
                (r.src.0.wrapping_sub(1), r.dst.1),
                (r.src.1.wrapping_add(1), r.dst.0.wrapping_sub(1)),
            ] {
                let key = FlowKey {
                    src: s,
                    dst: d,
                    src_port: r.src_port.0,
                    dst_port: r.dst_port.1,
                    proto: r.proto.0,
                    v6: true,
                };
                assert_eq!(flat.lookup(&rules, &key, None), scan(&key), "{key:?}");
                checked += usize::from(scan(&key).is_some());
            }
        }
        assert!(checked > rules.len(), "{checked} keys matched");
        // A removed rule's keys find the next one. Rules that hid others
        // from the tree are not removed this way (removing one rebuilds
        // the set: see `Builder::prune`).
        let mut dead = vec![0u64; rules.len().div_ceil(64)];
        let pruner = |p: usize| pruners[p / 64] & (1 << (p % 64)) != 0;
        for p in (0..rules.len()).step_by(3).filter(|&p| !pruner(p)) {
            dead[p / 64] |= 1 << (p % 64);
        }
        let alive = |p: usize| dead[p / 64] & (1 << (p % 64)) == 0;
        for r in &rules {
            let key = FlowKey {
                src: r.src.0,
                dst: r.dst.0,
                src_port: r.src_port.0,
                dst_port: r.dst_port.0,
                proto: r.proto.0,
                v6: true,
            };
            let want = rules
                .iter()
                .enumerate()
                .position(|(p, r)| alive(p) && r.dims_match(&key));
            assert_eq!(flat.lookup(&rules, &key, Some(&dead)), want, "{key:?}");
        }
    }
}
