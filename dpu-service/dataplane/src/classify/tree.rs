//! The decision trees: a [`Tree`] over one group of a family's rules,
//! cut HiCuts-style into aligned boxes ([`Region`]) by the [`Builder`]
//! within node, space and depth budgets. Lookups walk the trees'
//! compact forms (`flat4`, `flat6`); the walk here checks the trees
//! themselves in tests.

use std::collections::HashMap;

use super::leafidx::{LeafIndex, INDEX_MIN};
#[cfg(test)]
use super::rule::key_value;
use super::rule::{AclRule, DIMS};
#[cfg(test)]
use crate::wire::FlowKey;

/// Rules a leaf holds before the builder tries to cut it: two fit the
/// one cache line an IPv4 lookup reads per leaf (`Pair`).
pub(super) const LEAF_RULES: usize = 2;
/// Rules a node must hold before a cut that leaves them all in one slice
/// counts as progress (zooming adds a level without separating rules;
/// with leaves of at most [`LEAF_RULES`], every node that is cut may zoom).
const ZOOM_RULES: usize = 2;
/// Most cut bits (2^n children) at one node.
const MAX_CUT_BITS: u32 = 8;
/// Child-list entries a cut may create per rule of the node (space
/// budget), and the depth beyond which the builder makes a leaf whatever
/// its size: for a tree of up to [`SMALL_TREE`] rules, then for larger
/// ones. IPv4 walks take the tree's depth in steps, whatever leaf they
/// reach, so a few long leaves scanned cost less than every walk being
/// deeper; small trees stay in cache even with more space and depth,
/// large ones are faster kept small. Measured on ClassBench acl1 at 1K
/// and 10K rules, alone and spread over 4 tenants through the switch:
/// there every tenant's trees and rule counters share the caches, and
/// trees of over 1,024 rules at factor 2 took acl1_10k from about 6.3 to
/// 7.7 Mpps with the single-set lookup rate unchanged.
const SPACE_FACTOR: [usize; 2] = [4, 2];
/// See [`SPACE_FACTOR`].
const MAX_DEPTH: [usize; 2] = [7, 6];
/// Rules of a tree up to which it gets the first budget of [`SPACE_FACTOR`].
const SMALL_TREE: usize = 1024;
/// Nodes a tree may have per rule before the builder stops cutting.
const NODES_PER_RULE: usize = 8;

/// A node: a cut (`bits` > 0) or a leaf.
#[derive(Debug, Clone, Copy)]
pub(super) struct Node {
    /// Cut dimension.
    pub(super) dim: u8,
    /// Right shift that brings the cut bits down.
    pub(super) shift: u8,
    /// Number of cut bits; 0 for a leaf.
    pub(super) bits: u8,
    /// Cut: first child in `children`. Leaf: first rule in `leaf_rules`.
    pub(super) first: u32,
    /// Leaf: number of rules.
    pub(super) len: u32,
}

pub(super) const LEAF: Node = Node {
    dim: 0,
    shift: 0,
    bits: 0,
    first: 0,
    len: 0,
};

/// An aligned box: per dimension, its lowest value and its width in bits.
#[derive(Debug, Clone, Copy)]
pub(super) struct Region {
    lo: [u128; DIMS],
    bits: [u32; DIMS],
}

impl Region {
    pub(super) fn whole(addr_bits: u32) -> Region {
        Region {
            lo: [0; DIMS],
            bits: [addr_bits, addr_bits, 16, 16, 8],
        }
    }

    fn hi(&self, d: usize) -> u128 {
        if self.bits[d] >= 128 {
            u128::MAX
        } else {
            self.lo[d] + ((1u128 << self.bits[d]) - 1)
        }
    }

    pub(super) fn covered_by(&self, r: &AclRule) -> bool {
        (0..DIMS).all(|d| {
            let (a, b) = r.range(d);
            a <= self.lo[d] && self.hi(d) <= b
        })
    }
}

/// One decision tree over a subset of a family's rules. Leaves hold
/// positions in the family's rule list, ascending (so in rule order).
#[derive(Debug, Default)]
pub(super) struct Tree {
    /// Smallest rule position in the tree.
    pub(super) min_pos: u32,
    pub(super) nodes: Vec<Node>,
    pub(super) children: Vec<u32>,
    pub(super) leaf_rules: Vec<u32>,
    /// Indexes of the leaves of [`INDEX_MIN`] rules or more, by their
    /// first entry in `leaf_rules` ([`Tree::index_leaves`]).
    indexes: HashMap<u32, LeafIndex>,
}

impl Tree {
    /// Cuts on the longest way from the root to a leaf.
    pub(super) fn depth(&self) -> u32 {
        let mut deepest = 0;
        let mut stack = vec![(0u32, 0u32)];
        while let Some((at, d)) = stack.pop() {
            let n = self.nodes[at as usize];
            if n.bits == 0 {
                deepest = deepest.max(d);
                continue;
            }
            let kids = &self.children[n.first as usize..n.first as usize + (1 << n.bits)];
            // Slices that share a child list it once in a row.
            let mut last = u32::MAX;
            for &c in kids {
                if c != last {
                    stack.push((c, d + 1));
                    last = c;
                }
            }
        }
        deepest
    }

    /// Leaves with an index.
    pub(super) fn indexed(&self) -> usize {
        self.indexes.len()
    }

    /// Every leaf index, by the leaf's first entry in `leaf_rules`; the
    /// tree keeps none after.
    pub(super) fn take_indexes(&mut self) -> HashMap<u32, LeafIndex> {
        std::mem::take(&mut self.indexes)
    }

    /// One step down from the cut `n` (not a leaf) for `key`.
    #[cfg(test)]
    #[inline(always)]
    pub(super) fn step(&self, key: &FlowKey, n: Node) -> Node {
        let v = key_value(key, usize::from(n.dim));
        let c = ((v >> n.shift) as usize) & ((1usize << n.bits) - 1);
        self.nodes[self.children[n.first as usize + c] as usize]
    }

    /// Indexes the leaves of [`INDEX_MIN`] rules or more whose fields
    /// span `whole` (per field, its largest value), where the index
    /// keeps within its bound and the leaf within the `indexed` entries
    /// left to index (less what it takes): lookups there search instead
    /// of scanning.
    pub(super) fn index_leaves(
        &mut self,
        rules: &[AclRule],
        whole: [u128; DIMS],
        indexed: &mut usize,
    ) {
        for n in &self.nodes {
            let len = n.len as usize;
            if n.bits > 0
                || len < INDEX_MIN
                || len > *indexed
                || self.indexes.contains_key(&n.first)
            {
                continue;
            }
            let ids = &self.leaf_rules[n.first as usize..(n.first + n.len) as usize];
            if let Some(x) = LeafIndex::build(rules, ids, whole) {
                self.indexes.insert(n.first, x);
                *indexed -= len;
            }
        }
    }

    /// The first live rule position below `bound` in the leaf `n` that
    /// matches `key`.
    #[cfg(test)]
    #[inline]
    pub(super) fn leaf_match(
        &self,
        rules: &[AclRule],
        n: Node,
        key: &FlowKey,
        dead: Option<&[u64]>,
        bound: usize,
    ) -> Option<usize> {
        if n.len as usize >= INDEX_MIN {
            if let Some(x) = self.indexes.get(&n.first) {
                let values = std::array::from_fn(|d| key_value(key, d));
                let bound = u32::try_from(bound).unwrap_or(u32::MAX);
                let alive = |p: u32| {
                    let p = p as usize;
                    dead.is_none_or(|d| d[p / 64] & (1 << (p % 64)) == 0)
                };
                let p = x.first(&values, bound, alive);
                return (p != u32::MAX).then_some(p as usize);
            }
        }
        let ids = &self.leaf_rules[n.first as usize..(n.first + n.len) as usize];
        ids.iter()
            .map(|&i| i as usize)
            .take_while(|&i| i < bound)
            .find(|&i| {
                let alive = dead.is_none_or(|d| d[i / 64] & (1 << (i % 64)) == 0);
                alive && rules[i].dims_match(key)
            })
    }

    /// First live rule position below `bound` in the leaf `key` falls in.
    #[cfg(test)]
    #[inline]
    pub(super) fn lookup(
        &self,
        rules: &[AclRule],
        key: &FlowKey,
        dead: Option<&[u64]>,
        bound: usize,
    ) -> Option<usize> {
        let mut n = self.nodes[0];
        while n.bits > 0 {
            n = self.step(key, n);
        }
        self.leaf_match(rules, n, key, dead, bound)
    }
}

/// Builds one [`Tree`], HiCuts-style, within a node budget.
pub(super) struct Builder<'a> {
    rules: &'a [AclRule],
    tree: Tree,
    node_budget: usize,
    /// This tree's [`SPACE_FACTOR`] and [`MAX_DEPTH`].
    space: usize,
    max_depth: usize,
    /// Positions of rules that hid later rules from some region.
    pruners: &'a mut Vec<u64>,
    /// Leaf entries past which every node left is made a leaf: a tree
    /// tried for a join gives up once it is past the trees apart.
    leaf_cap: usize,
}

impl<'a> Builder<'a> {
    pub(super) fn build(
        rules: &'a [AclRule],
        ids: Vec<u32>,
        addr_bits: u32,
        pruners: &'a mut Vec<u64>,
    ) -> Tree {
        Builder::build_capped(rules, ids, addr_bits, pruners, usize::MAX, usize::MAX)
    }

    /// [`Builder::build`] no deeper than `depth` cuts, and giving up
    /// cutting past `leaf_cap` leaf entries (the tree is then of no use
    /// but to be measured).
    pub(super) fn build_capped(
        rules: &'a [AclRule],
        ids: Vec<u32>,
        addr_bits: u32,
        pruners: &'a mut Vec<u64>,
        leaf_cap: usize,
        depth: usize,
    ) -> Tree {
        let mut b = Builder {
            rules,
            pruners,
            tree: Tree {
                min_pos: ids.first().copied().unwrap_or(u32::MAX),
                nodes: vec![LEAF],
                ..Tree::default()
            },
            node_budget: NODES_PER_RULE * ids.len() + 256,
            space: SPACE_FACTOR[usize::from(ids.len() > SMALL_TREE)],
            max_depth: MAX_DEPTH[usize::from(ids.len() > SMALL_TREE)].min(depth),
            leaf_cap,
        };
        let root = Region::whole(addr_bits);
        let ids = b.prune(&root, ids);
        let all = ids.clone();
        b.grow(0, root, root, ids, 0);
        // Cuts that still leave leaves of thousands of rules copy those
        // rules into many of them (nested-2d, 30,000 rules: 995,180 leaf
        // entries): one indexed leaf of them all costs less, if it fits.
        let longest = b
            .tree
            .nodes
            .iter()
            .filter(|n| n.bits == 0)
            .map(|n| n.len as usize)
            .max();
        if longest.is_some_and(|l| l >= INDEX_MIN && l < all.len()) {
            let top = u128::MAX >> (128 - addr_bits.min(128));
            if let Some(x) = LeafIndex::build(rules, &all, [top, top, 65_535, 65_535, 255]) {
                let leaf = Node {
                    len: all.len() as u32,
                    ..LEAF
                };
                let mut t = Tree {
                    min_pos: b.tree.min_pos,
                    nodes: vec![leaf],
                    leaf_rules: all,
                    ..Tree::default()
                };
                t.indexes.insert(0, x);
                return t;
            }
        }
        b.tree
    }

    /// Drops the rules behind the first one that covers the whole region
    /// (and remembers that rule: removing it needs a rebuild).
    fn prune(&mut self, region: &Region, mut ids: Vec<u32>) -> Vec<u32> {
        if let Some(p) = ids
            .iter()
            .position(|&i| region.covered_by(&self.rules[i as usize]))
        {
            if p + 1 < ids.len() {
                let i = ids[p] as usize;
                self.pruners[i / 64] |= 1 << (i % 64);
            }
            ids.truncate(p + 1);
        }
        ids
    }

    fn leaf(&mut self, at: usize, ids: &[u32]) {
        let t = &mut self.tree;
        t.nodes[at] = Node {
            first: t.leaf_rules.len() as u32,
            len: ids.len() as u32,
            ..LEAF
        };
        t.leaf_rules.extend_from_slice(ids);
    }

    /// Number of distinct ranges the rules have in `dim`, clipped to `region`.
    fn distinct(&self, region: &Region, ids: &[u32], dim: usize) -> usize {
        let mut ranges: Vec<(u128, u128)> = ids
            .iter()
            .map(|&i| {
                let (a, b) = self.rules[i as usize].range(dim);
                (a.max(region.lo[dim]), b.min(region.hi(dim)))
            })
            .collect();
        ranges.sort_unstable();
        ranges.dedup();
        ranges.len()
    }

    /// Child index range `[first, last]` a rule covers when `dim` of
    /// `region` is cut into `2^k` slices.
    fn span(region: &Region, r: &AclRule, dim: usize, k: u32) -> (usize, usize) {
        let shift = region.bits[dim] - k;
        let (a, b) = r.range(dim);
        let a = a.max(region.lo[dim]) - region.lo[dim];
        let b = b.min(region.hi(dim)) - region.lo[dim];
        ((a >> shift) as usize, (b >> shift) as usize)
    }

    /// Cuts `dim` into as many slices as the space budget allows; `None`
    /// if the budget allows no cut or the cut separates nothing (more than
    /// one slice keeps every rule).
    ///
    /// The budget is first judged on every rule's slices, as if none were
    /// pruned: cheap, and what the ClassBench sets' shapes were measured
    /// with. Rules that each span most of the node (nested or staggered
    /// ranges) would then make it a leaf of all of them, scanned by every
    /// key that reaches it, though most slices keep a rule or two once
    /// the first rule covering a slice hides the rest there. Such a node
    /// is cut by the slices' rules after pruning ([`Builder::pruned`]),
    /// with room for one more entry per rule: nested ranges all reach
    /// both outer slices, so the first cut of them doubles every rule.
    fn cut(
        &mut self,
        region: &Region,
        cover: &Region,
        ids: &[u32],
        dim: usize,
    ) -> Option<(u32, Vec<Vec<u32>>)> {
        let budget = self.space * ids.len();
        let entries = |k: u32| -> usize {
            ids.iter()
                .map(|&i| {
                    let (a, b) = Self::span(region, &self.rules[i as usize], dim, k);
                    b - a + 1
                })
                .sum::<usize>()
                + (1 << k)
        };
        let max_k = region.bits[dim].min(MAX_CUT_BITS);
        let mut k = 0;
        while k < max_k && entries(k + 1) <= budget {
            k += 1;
        }
        if k < max_k {
            let room = if k == 0 { budget + ids.len() } else { budget };
            let wider = (k + 1..=max_k).rev().find_map(|k| {
                let (lists, pruners) = self.pruned(region, cover, ids, dim, k, room)?;
                // Progress: some slice lost rules. Slices that keep them
                // all are smaller boxes, which the next cut zooms into.
                let whole = lists.iter().filter(|l| l.len() == ids.len()).count();
                (whole < lists.len()).then_some((k, lists, pruners))
            });
            if let Some((k, lists, pruners)) = wider {
                for i in pruners {
                    self.pruners[i as usize / 64] |= 1 << (i % 64);
                }
                return Some((k, lists));
            }
        }
        if k == 0 {
            return None;
        }
        let shift = region.bits[dim] - k;
        let mut lists: Vec<Vec<u32>> = vec![Vec::new(); 1 << k];
        for &i in ids {
            let (a, b) = Self::span(region, &self.rules[i as usize], dim, k);
            for l in &mut lists[a..=b] {
                l.push(i);
            }
        }
        for (c, l) in lists.iter_mut().enumerate() {
            let child = Self::child_cover(region, cover, dim, shift, c);
            *l = self.prune(&child, std::mem::take(l));
        }
        // Progress: the rules split up, or they all lie in one slice, whose
        // smaller box the next cut can zoom into (rules that differ in
        // `dim` inside the region come apart within a few cuts).
        let whole = lists.iter().filter(|l| l.len() == ids.len()).count();
        let zoom = ids.len() > ZOOM_RULES;
        (whole == 0 || (zoom && whole == 1)).then_some((k, lists))
    }

    /// The rules of each of the `2^k` slices of `dim`, pruned as they are
    /// dealt (a slice takes no rule after the first that covers it), and
    /// the rules that hid later ones so; `None` once they pass `budget`
    /// entries with the slices. Work is in proportion to the entries and
    /// the rules: a slice is skipped once covered.
    ///
    /// Where `region` is zoomed (see [`Builder::zoom`]), keys from
    /// outside its block reach the slices too, and only the rules that
    /// reach outside the block can match them: a rule covering a slice's
    /// part of the block hides the later rules within the block, and
    /// those reaching outside it only if it covers all of the slice's
    /// keys.
    fn pruned(
        &self,
        region: &Region,
        cover: &Region,
        ids: &[u32],
        dim: usize,
        k: u32,
        budget: usize,
    ) -> Option<(Vec<Vec<u32>>, Vec<u32>)> {
        let slices = 1usize << k;
        let mut left = budget.checked_sub(slices)?;
        let shift = region.bits[dim] - k;
        let spans: Vec<(usize, usize)> = ids
            .iter()
            .map(|&i| Self::span(region, &self.rules[i as usize], dim, k))
            .collect();
        // The first slice at or after each slice not yet dealt with (the
        // last is a sentinel).
        fn next(skip: &mut [usize], mut c: usize) -> usize {
            while skip[c] != c {
                skip[c] = skip[skip[c]];
                c = skip[c];
            }
            c
        }
        // Keys from outside the region's block in a zoomed dimension
        // reach the node too; a rule within the block in every such
        // dimension matches none of them.
        let zoomed: Vec<usize> = (0..DIMS)
            .filter(|&d| region.bits[d] != cover.bits[d])
            .collect();
        let inside = |r: &AclRule| {
            zoomed.iter().all(|&d| {
                let (lo, hi) = r.range(d);
                region.lo[d] <= lo && hi <= region.hi(d)
            })
        };
        // A slice's keys within the block, and all the keys that reach it.
        let inner = |c: usize| {
            let mut inner = *region;
            inner.lo[dim] = region.lo[dim] + ((c as u128) << shift);
            inner.bits[dim] = shift;
            inner
        };
        let outer = |c: usize| Self::child_cover(region, cover, dim, shift, c);
        let mut lists: Vec<Vec<u32>> = vec![Vec::new(); slices];
        // Per slice, the place in `ids` of the first rule covering it.
        let mut closer = vec![usize::MAX; slices];
        // Slices open to rules within the block (a skip list), and
        // whether a slice is covered for every key that reaches it.
        let mut open: Vec<usize> = (0..=slices).collect();
        let mut shut = vec![false; slices];
        for (at, (&i, &(a, b))) in ids.iter().zip(&spans).enumerate() {
            let rule = &self.rules[i as usize];
            if !inside(rule) {
                for c in a..=b {
                    if shut[c] {
                        continue;
                    }
                    left = left.checked_sub(1)?;
                    lists[c].push(i);
                    shut[c] = outer(c).covered_by(rule);
                    if open[c] == c && inner(c).covered_by(rule) {
                        open[c] = c + 1;
                        closer[c] = at;
                    }
                }
                continue;
            }
            let mut c = next(&mut open, a);
            while c <= b {
                left = left.checked_sub(1)?;
                lists[c].push(i);
                if inner(c).covered_by(rule) {
                    open[c] = c + 1;
                    closer[c] = at;
                }
                c = next(&mut open, c + 1);
            }
        }
        // A cover hid a rule where a later rule reaches its slice: the
        // last rule reaching each slice, found from the back.
        let mut last = vec![0usize; slices];
        let mut unseen: Vec<usize> = (0..=slices).collect();
        for (at, &(a, b)) in spans.iter().enumerate().rev() {
            let mut c = next(&mut unseen, a);
            while c <= b {
                last[c] = at;
                unseen[c] = c + 1;
                c = next(&mut unseen, c + 1);
            }
        }
        let mut pruners: Vec<u32> = (0..slices)
            .filter(|&c| closer[c] < last[c])
            .map(|c| ids[closer[c]])
            .collect();
        pruners.sort_unstable();
        pruners.dedup();
        Some((lists, pruners))
    }

    /// The keys that reach slice `c` of a cut: the slice, in a dimension
    /// the walk has not skipped bits of; else the whole covered range
    /// (see [`Builder::zoom`]).
    fn child_cover(region: &Region, cover: &Region, dim: usize, shift: u32, c: usize) -> Region {
        let mut child = *cover;
        if cover.bits[dim] == region.bits[dim] {
            child.bits[dim] = shift;
            child.lo[dim] = region.lo[dim] + ((c as u128) << shift);
        }
        child
    }

    /// Narrows `region`, in each dimension, to the smallest aligned block
    /// holding every rule that does not span the whole region there:
    /// cuts then start at the bits where those rules differ, not at the
    /// top of the field, and the bits above (the same for all of them)
    /// cost no node and no step. A key outside the block walks on as if
    /// it were inside: only rules spanning the region can match it, and
    /// those are in every slice; the leaf's records check the rest. The
    /// keys that reach a node are then those of `cover` (where pruning
    /// must look), not of `region`.
    fn zoom(&self, region: &mut Region, ids: &[u32]) {
        for d in 0..DIMS {
            let (mut lo, mut hi) = (u128::MAX, 0);
            for &i in ids {
                let (a, b) = self.rules[i as usize].range(d);
                let (a, b) = (a.max(region.lo[d]), b.min(region.hi(d)));
                if a > region.lo[d] || b < region.hi(d) {
                    lo = lo.min(a);
                    hi = hi.max(b);
                }
            }
            if lo > hi {
                continue;
            }
            let bits = 128 - (lo ^ hi).leading_zeros();
            if bits < region.bits[d] {
                region.lo[d] = lo & !((1u128 << bits) - 1);
                region.bits[d] = bits;
            }
        }
    }

    fn grow(&mut self, at: usize, mut region: Region, cover: Region, ids: Vec<u32>, depth: usize) {
        if ids.len() <= LEAF_RULES
            || depth >= self.max_depth
            || self.tree.nodes.len() >= self.node_budget
            || self.tree.leaf_rules.len() > self.leaf_cap
        {
            return self.leaf(at, &ids);
        }
        self.zoom(&mut region, &ids);
        // Try the dimensions in which the rules differ most first.
        let mut dims: Vec<(usize, usize)> = (0..DIMS)
            .filter(|&d| region.bits[d] > 0)
            .map(|d| (self.distinct(&region, &ids, d), d))
            .filter(|&(n, _)| n > 1)
            .collect();
        dims.sort_unstable_by_key(|&(n, _)| std::cmp::Reverse(n));
        let Some((dim, k, lists)) = dims
            .iter()
            .find_map(|&(_, d)| self.cut(&region, &cover, &ids, d).map(|(k, l)| (d, k, l)))
        else {
            return self.leaf(at, &ids);
        };
        let shift = region.bits[dim] - k;
        let first = self.tree.children.len();
        self.tree.children.resize(first + lists.len(), 0);
        self.tree.nodes[at] = Node {
            dim: dim as u8,
            shift: shift as u8,
            bits: k as u8,
            first: first as u32,
            len: 0,
        };
        // Siblings with the same rules, each covering the whole slice in
        // the cut dimension, are the same subtree: build it once.
        let mut shared: HashMap<Vec<u32>, u32> = HashMap::new();
        for (c, list) in lists.into_iter().enumerate() {
            let mut child = region;
            child.bits[dim] = shift;
            child.lo[dim] = region.lo[dim] + ((c as u128) << shift);
            let child_cover = Self::child_cover(&region, &cover, dim, shift, c);
            let spans_slice = list.iter().all(|&i| {
                let (a, b) = self.rules[i as usize].range(dim);
                a <= region.lo[dim] && region.hi(dim) <= b
            });
            if spans_slice {
                if let Some(&node) = shared.get(&list) {
                    self.tree.children[first + c] = node;
                    continue;
                }
            }
            let node = self.tree.nodes.len() as u32;
            self.tree.nodes.push(LEAF);
            self.tree.children[first + c] = node;
            if spans_slice {
                shared.insert(list.clone(), node);
            }
            self.grow(node as usize, child, child_cover, list, depth + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::rule::Family;

    fn longest_leaf(t: &Tree) -> u32 {
        let leaves = t.nodes.iter().filter(|n| n.bits == 0);
        leaves.map(|n| n.len).max().unwrap_or(0)
    }

    /// Rules whose ranges each span most of the node, so that a cut
    /// copies nearly every rule into nearly every slice, unless pruned:
    /// nested (each range inside the next, the narrowest first, so no
    /// rule hides all behind it) and staggered ranges, over the whole
    /// address space, and inside one /8 (a zoomed node), in addresses
    /// and in ports. Every key's first rule is found, and every leaf is
    /// short: without the pruned cut each of these trees was a leaf of
    /// all 3,000 rules, which every key scanned. (Rules nested in two
    /// dimensions at once still make such a leaf: no rule covers a
    /// slice in both.)
    #[test]
    fn nested_and_staggered_ranges_are_cut_into_short_leaves() {
        let n = 3000u32;
        let top = u128::from(u32::MAX);
        let net = 10u128 << 24;
        for shape in 0..4 {
            let rules: Vec<AclRule> = (0..n)
                .map(|i| {
                    let mut r = AclRule::any(i, i, Family::V4);
                    let (i, k) = (u128::from(i), u128::from(n - 1 - i));
                    let width = 7 * u128::from(n) / 2;
                    match shape {
                        0 => r.src = (7 * k, top - 7 * k),
                        1 => r.dst = (7 * i, 7 * i + width),
                        2 => r.src = (net + 7 * i, net + 7 * i + width),
                        _ => {
                            r.src = (net, net + (1 << 24) - 1);
                            r.proto = (6, 6);
                            r.dst_port = (k as u16 + 1, 65534 - k as u16);
                        }
                    }
                    r
                })
                .collect();
            let mut pruners = vec![0u64; (n as usize).div_ceil(64)];
            let tree = Builder::build(&rules, (0..n).collect(), 32, &mut pruners);
            assert!(
                longest_leaf(&tree) <= 64,
                "shape {shape}: a leaf of {} rules",
                longest_leaf(&tree)
            );
            assert!(tree.leaf_rules.len() <= 64 * n as usize, "shape {shape}");
            // Keys at and beside every range's ends, in every dimension,
            // and the same moved out of the /8 (keys that reach a zoomed
            // node from outside its block).
            let mut checked = 0;
            for r in &rules {
                for d in 0..DIMS {
                    let (lo, hi) = r.range(d);
                    let values = [
                        lo.wrapping_sub(1),
                        lo,
                        lo + 1,
                        hi.wrapping_sub(1),
                        hi,
                        hi + 1,
                    ];
                    for v in values {
                        for moved in [0u128, 1 << 25] {
                            let mut k = FlowKey {
                                src: net + 3,
                                dst: net + 5 * u128::from(n) + 9,
                                src_port: 20_001,
                                dst_port: 80,
                                proto: 6,
                                v6: false,
                            };
                            let top = [top, top, 0xffff, 0xffff, 0xff][d];
                            let v = v.min(top);
                            match d {
                                0 => k.src = (v + moved) & top,
                                1 => k.dst = (v + moved) & top,
                                2 => k.src_port = v as u16,
                                3 => k.dst_port = v as u16,
                                _ => k.proto = v as u8,
                            }
                            let want = rules.iter().position(|r| r.matches(&k));
                            let got = tree.lookup(&rules, &k, None, usize::MAX);
                            assert_eq!(got, want, "shape {shape}, key {k:?}");
                            checked += 1;
                        }
                    }
                }
            }
            assert!(checked > 100_000);
        }
    }
}
