//! The IPv4 lookup form of a family's trees, [`Flat4`]: every node one
//! `u64` ([`Entry`]) in one flat array, a leaf's first two rules in one
//! cache line ([`Pair`] of [`Rec`], packed bounds that one branch-free
//! test checks against a packed key, [`Key4`]); its walks for one key,
//! a batch of keys, and keys of many sets side by side, with the RFC
//! tables read in front of them when the set has some.

use std::collections::HashMap;

use dpu_os::cache::prefetch;

use super::leafidx::{LeafIndex, INDEX_MIN};
use super::rfc::Rfc;
use super::rule::{AclRule, DIMS};
use super::tree::{Node, Tree};
use crate::wire::FlowKey;

/// An IPv4 key, in the two forms a lookup needs: the five dimensions as
/// `u32` indexed by dimension for the tree walk (the padding lets a
/// node's 3-bit dimension index it without a bounds check), and all five
/// packed into one `u128` with guard bits for the leaf records (see
/// [`Rec`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Key4 {
    dims: [u32; 8],
    packed: u128,
}

/// Where each dimension lies in a packed key or record: (shift, width).
/// Each field has a guard bit just above it, so one 128-bit subtraction
/// works on all five fields without a borrow crossing from one to the next.
const PACK: [(u32, u32); DIMS] = [(76, 32), (43, 32), (26, 16), (9, 16), (0, 8)];

/// The guard bits of [`PACK`].
const GUARDS: u128 = {
    let mut g = 0;
    let mut d = 0;
    while d < DIMS {
        g |= 1 << (PACK[d].0 + PACK[d].1);
        d += 1;
    }
    g
};

/// Where a record keeps its rule's position: above the fields and guards.
const POS_SHIFT: u32 = 109;
/// The low 19 bits of a position (kept in `lo`; the rest in `span`).
const POS_LOW: u128 = (1 << 19) - 1;

/// Packs one `u32` per dimension (each within its width) as [`PACK`] says.
fn pack(v: [u32; DIMS]) -> u128 {
    (0..DIMS).fold(0, |p, d| p | u128::from(v[d]) << PACK[d].0)
}

impl Key4 {
    /// A placeholder for a batch's unused slots.
    pub(super) const NONE: Key4 = Key4 {
        dims: [0; 8],
        packed: 0,
    };

    /// An IPv4 key's five fields in dimension order.
    #[inline(always)]
    pub(super) fn fields(key: &FlowKey) -> [u32; DIMS] {
        [
            key.src as u32,
            key.dst as u32,
            u32::from(key.src_port),
            u32::from(key.dst_port),
            u32::from(key.proto),
        ]
    }

    #[inline]
    pub(super) fn new(key: &FlowKey) -> Key4 {
        let v = Key4::fields(key);
        Key4 {
            dims: [v[0], v[1], v[2], v[3], v[4], 0, 0, 0],
            packed: pack(v) | GUARDS,
        }
    }
}

/// One rule in an IPv4 leaf: all five low ends in one `u128`, all five
/// spans (high - low) with guard bits set in another, as [`PACK`] lays
/// them out. A key (guards set) minus `lo` keeps a field's guard bit iff
/// the field is at least its low end; `span` minus that difference keeps
/// it iff the field is at most its high end. Two subtractions and a mask
/// test all ten bounds, without a branch. The bits above the fields hold
/// the rule's position in its `Set` (19 in each half): they take no
/// part in the test, and the position comes with the record's cache line.
/// 32 bytes, two to a cache line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Rec {
    lo: u128,
    span: u128,
}

impl Rec {
    /// Matches everything, position `u32::MAX`: closes every leaf's run.
    const SENTINEL: Rec = Rec {
        lo: u128::MAX << POS_SHIFT,
        span: u128::MAX,
    };

    fn new(r: &AclRule, pos: u32) -> Rec {
        // IPv4 ranges lie within 32 bits (the family's trees are built
        // from rules clipped to them).
        let lo: [u32; DIMS] = std::array::from_fn(|d| r.range(d).0 as u32);
        let hi: [u32; DIMS] = std::array::from_fn(|d| r.range(d).1 as u32);
        let pos = u128::from(pos);
        Rec {
            lo: pack(lo) | (pos & POS_LOW) << POS_SHIFT,
            span: pack(std::array::from_fn(|d| hi[d] - lo[d])) | GUARDS | (pos >> 19) << POS_SHIFT,
        }
    }

    /// The rule's position (`u32::MAX` for the sentinel).
    #[inline(always)]
    fn pos(&self) -> u32 {
        ((self.lo >> POS_SHIFT) | (self.span >> POS_SHIFT) << 19) as u32
    }

    #[inline(always)]
    fn matches(&self, k: &Key4) -> bool {
        let above = k.packed.wrapping_sub(self.lo);
        let below = self.span.wrapping_sub(above & !GUARDS);
        above & below & GUARDS == GUARDS
    }
}

/// A tree node as one `u64`, so a walk is one load per level: bits 0..32
/// the first child entry, 32..37 the shift, 37..40 the dimension, bit 40
/// set for a leaf, bit 41 for a leaf of more than two rules, 48..64 the
/// mask of the cut bits.
///
/// A leaf's entry has mask 0 and points at a slot holding itself, so
/// stepping from a leaf stays there: every walk of a tree takes the same
/// number of steps (the tree's depth), with no branch on the key. Leaf
/// slots come after all cut blocks, one per distinct leaf, and the n-th
/// one's first two records are the n-th [`Pair`]: no load between the
/// walk and the records.
pub(super) type Entry = u64;

const LEAF_FLAG: Entry = 1 << 40;
const LONG_FLAG: Entry = 1 << 41;
/// Long leaves of this many rules or more are scanned with early exits.
const LONG_MAX: usize = 63;
/// Every IPv4 field's largest value.
pub(super) const WHOLE: [u128; DIMS] = [u32::MAX as u128, u32::MAX as u128, 65_535, 65_535, 255];

/// A cut's entry for a key of `N` words (a power of two): its first
/// child's slot, the key word it reads, the shift and number of bits.
/// (`Flat6`'s entries are these with 16 words.)
pub(super) const fn cut_entry<const N: usize>(
    first: u32,
    word: u32,
    shift: u32,
    bits: u32,
) -> Entry {
    first as u64
        | (shift as u64 & 31) << 32
        | (word as u64 & (N as u64 - 1)) << 37
        | ((1u64 << bits) - 1) << 48
}

/// One step down from `e` for a key of `N` 32-bit words (a power of two,
/// so the entry's word number indexes it without a bounds check); a
/// leaf stays where it is.
#[inline(always)]
pub(super) fn step<const N: usize>(nodes: &[Entry], k: &[u32; N], e: Entry) -> Entry {
    let shift = (e >> 32) as u32 & 31;
    let word = (e >> 37) as usize & (N - 1);
    let mask = (e >> 48) as u32;
    // Shifts are below 32: a cut takes at least one bit of a word.
    let slot = (k[word] >> shift) & mask;
    nodes[(e as u32).wrapping_add(slot) as usize]
}

/// The first two records of a leaf, in one cache line: `[rule, rule]`,
/// `[rule, sentinel]` or `[sentinel, sentinel]`. A leaf of up to two
/// rules is decided by its pair alone (neither matching means no match);
/// a longer one is flagged in its entry and has its whole run, closed by
/// a sentinel, in [`Flat4::runs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(align(64))]
struct Pair([Rec; 2]);

impl Pair {
    /// The position of the first of the two records that matches `k`,
    /// `u32::MAX` if neither does; no branch.
    #[inline(always)]
    fn first_match(&self, k: &Key4) -> u32 {
        let [a, b] = &self.0;
        let ma = u32::from(a.matches(k)).wrapping_neg();
        let mb = u32::from(b.matches(k)).wrapping_neg();
        (a.pos() & ma) | (!ma & (b.pos() | !mb))
    }
}

/// The IPv4 trees of a `Set` in their lookup form: every node of every
/// tree in one flat array of [`Entry`], every leaf a [`Pair`] of records,
/// so a lookup touches one cache line per level and one per tree's leaf,
/// branches on nothing but the tree's depth, and allocates nothing.
#[derive(Debug, Default)]
pub(super) struct Flat4 {
    /// Per tree, in order of their first rule: the root entry, the
    /// tree's depth (steps from the root to any leaf), its smallest
    /// rule position.
    pub(super) trees: Vec<(Entry, u32, u32)>,
    nodes: Vec<Entry>,
    /// The first leaf slot in `nodes`.
    leaf0: u32,
    /// Per leaf slot (from `leaf0`), its first two records.
    pairs: Vec<Pair>,
    /// Per leaf slot, where the rest of a long leaf's records start in
    /// `runs` (0 for others).
    run_at: Vec<u32>,
    /// The records of long leaves from their third on, each run closed by
    /// a sentinel.
    runs: Vec<Rec>,
    /// Per leaf slot, its index in `indexes` if it has one (`u32::MAX`
    /// if not): leaves of [`INDEX_MIN`] rules or more.
    index_at: Vec<u32>,
    indexes: Vec<LeafIndex>,
    /// The same rules as tables of Recursive Flow Classification, when
    /// they fit its budget: lookups read those instead of walking the
    /// trees, unless the rule they find was removed since.
    pub(super) rfc: Option<Box<Rfc>>,
}

/// Most keys [`Classifier::lookup_multi`](super::Classifier::lookup_multi) walks side by side.
pub const MULTI: usize = 32;

/// Most trees a single key walks side by side (a set with more walks
/// them one after another).
pub(super) const LOCKSTEP: usize = 8;

/// Keys [`Classifier::lookup_batch`](super::Classifier::lookup_batch) walks side by side (a power of two).
pub const BATCH: usize = 16;

impl Flat4 {
    /// No trees: every lookup misses.
    pub(super) const EMPTY: Flat4 = Flat4 {
        trees: Vec::new(),
        nodes: Vec::new(),
        leaf0: 0,
        pairs: Vec::new(),
        run_at: Vec::new(),
        runs: Vec::new(),
        index_at: Vec::new(),
        indexes: Vec::new(),
        rfc: None,
    };

    /// The trees' lookup form; takes the trees' leaf indexes
    /// ([`Tree::index_leaves`]).
    pub(super) fn new(rules: &[AclRule], trees: &mut [Tree]) -> Flat4 {
        fn kids<'t>(t: &'t Tree, n: &Node) -> &'t [u32] {
            &t.children[n.first as usize..n.first as usize + (1 << n.bits)]
        }
        // Cut blocks first (slot 0 is spare), then one slot per leaf.
        let mut f = Flat4::default();
        let cuts: usize = trees
            .iter()
            .flat_map(|t| t.nodes.iter().filter(|n| n.bits > 0))
            .map(|n| 1usize << n.bits)
            .sum();
        f.leaf0 = 1 + cuts as u32;
        f.nodes.resize(1 + cuts, 0);
        let mut next_cut = 1usize;
        let mut taken: Vec<HashMap<u32, LeafIndex>> =
            trees.iter_mut().map(Tree::take_indexes).collect();
        let trees: &[Tree] = trees;
        let mut leaves: HashMap<&[u32], Entry> = HashMap::new();
        for (t, taken) in trees.iter().zip(&mut taken) {
            // Children come after their parent (shared ones too), so one
            // backward pass gives each node its height.
            let mut height = vec![0u32; t.nodes.len()];
            for (i, n) in t.nodes.iter().enumerate().rev() {
                if n.bits > 0 {
                    height[i] = 1 + kids(t, n)
                        .iter()
                        .map(|&c| height[c as usize])
                        .max()
                        .unwrap_or(0);
                }
            }
            let mut entry = vec![0 as Entry; t.nodes.len()];
            for (i, n) in t.nodes.iter().enumerate() {
                if n.bits > 0 {
                    entry[i] = cut_entry::<8>(
                        next_cut as u32,
                        n.dim.into(),
                        n.shift.into(),
                        n.bits.into(),
                    );
                    next_cut += 1 << n.bits;
                    continue;
                }
                let ids = &t.leaf_rules[n.first as usize..(n.first + n.len) as usize];
                entry[i] = *leaves.entry(ids).or_insert_with(|| {
                    let slot = f.nodes.len() as Entry;
                    let long = if ids.len() > 2 { LONG_FLAG } else { 0 };
                    // Long leaves carry their length (up to 63) for a scan
                    // without an early exit.
                    let len = (ids.len().min(LONG_MAX) as Entry) << 42;
                    let e = LEAF_FLAG | long | len | slot;
                    f.nodes.push(e);
                    let rec = |j: usize| {
                        ids.get(j)
                            .map_or(Rec::SENTINEL, |&p| Rec::new(&rules[p as usize], p))
                    };
                    f.pairs.push(Pair([rec(0), rec(1)]));
                    if ids.len() > 2 {
                        f.run_at.push(f.runs.len() as u32);
                        f.runs.extend((2..=ids.len()).map(rec));
                    } else {
                        f.run_at.push(0);
                    }
                    let index = if ids.len() >= INDEX_MIN {
                        taken.remove(&n.first)
                    } else {
                        None
                    };
                    f.index_at.push(match index {
                        Some(x) => {
                            f.indexes.push(x);
                            f.indexes.len() as u32 - 1
                        }
                        None => u32::MAX,
                    });
                    e
                });
            }
            for (i, n) in t.nodes.iter().enumerate() {
                if n.bits > 0 {
                    let first = entry[i] as u32 as usize;
                    for (s, &c) in f.nodes[first..].iter_mut().zip(kids(t, n)) {
                        *s = entry[c as usize];
                    }
                }
            }
            f.trees.push((entry[0], height[0], t.min_pos));
        }
        if f.indexes.is_empty() {
            f.index_at = Vec::new();
        }
        f
    }

    /// Walks one tree for `k`: the entry of its leaf.
    #[inline(always)]
    fn walk(&self, (root, depth, _): (Entry, u32, u32), k: &Key4) -> Entry {
        let mut e = root;
        for _ in 0..depth {
            e = step(&self.nodes, &k.dims, e);
        }
        e
    }

    /// The position of the first rule of the leaf `e` matching `k` and
    /// not dead (`u32::MAX` if none): from its pair if that decides,
    /// else from its whole run.
    #[inline(always)]
    fn leaf_match(&self, e: Entry, k: &Key4, dead: Option<&[u64]>) -> u32 {
        let leaf = (e as u32).wrapping_sub(self.leaf0) as usize;
        let pair = &self.pairs[leaf];
        let long = e & LONG_FLAG != 0;
        let len = (e >> 42) as usize & 63;
        if dead.is_none() && long && len < LONG_MAX {
            // Every record, without an early exit: the length is known
            // before any record is read, so the loop's branch is too.
            let at = self.run_at[leaf] as usize;
            if let Some(rest) = self.runs.get(at..at + len - 2) {
                return rest.iter().fold(pair.first_match(k), |p, r| {
                    p.min(r.pos() | !u32::from(r.matches(k)).wrapping_neg())
                });
            }
        }
        let p = pair.first_match(k);
        if !long && dead.is_none_or(|d| !is_set(d, p)) {
            return p;
        }
        self.leaf_match_slow(leaf, long, k, dead)
    }

    /// [`Flat4::leaf_match`] record by record: for long leaves, and
    /// when the pair's answer was removed.
    #[cold]
    fn leaf_match_slow(&self, leaf: usize, long: bool, k: &Key4, dead: Option<&[u64]>) -> u32 {
        let index = self
            .index_at
            .get(leaf)
            .and_then(|&i| self.indexes.get(i as usize));
        if let Some(x) = index.filter(|_| long) {
            let values = std::array::from_fn(|d| u128::from(k.dims[d]));
            return x.first(&values, u32::MAX, |p| dead.is_none_or(|d| !is_set(d, p)));
        }
        let alive = |r: &Rec| r.matches(k) && dead.is_none_or(|d| !is_set(d, r.pos()));
        let pair = &self.pairs[leaf].0;
        if let Some(r) = pair.iter().find(|r| alive(r)) {
            return r.pos();
        }
        if !long {
            return u32::MAX;
        }
        let mut at = self.run_at[leaf] as usize;
        // Every run ends in a sentinel, which matches and is never dead.
        while let Some(r) = self.runs.get(at) {
            if alive(r) {
                return r.pos();
            }
            at += 1;
        }
        u32::MAX
    }

    /// Starts loading the records of the leaf `e`.
    #[inline(always)]
    fn prefetch_leaf(&self, e: Entry) {
        let leaf = (e as u32).wrapping_sub(self.leaf0) as usize;
        if let Some(p) = self.pairs.get(leaf) {
            prefetch(p);
        }
    }

    /// The position the RFC tables give for `k`, when there are tables
    /// and their answer stands: `Some(u32::MAX)` for no match, `None` if
    /// the trees must answer (no tables, or the rule found was removed).
    #[inline(always)]
    fn rfc_lookup(&self, k: &Key4, dead: Option<&[u64]>) -> Option<u32> {
        let p = self.rfc.as_ref()?.lookup(&k.dims);
        dead.is_none_or(|d| !is_set(d, p)).then_some(p)
    }

    /// Position of the first rule (in order) matching `k` whose bit in
    /// `dead` is clear.
    #[inline]
    pub(super) fn lookup(&self, k: &Key4, dead: Option<&[u64]>) -> Option<usize> {
        match self.rfc_lookup(k, dead) {
            Some(p) => (p != u32::MAX).then_some(p as usize),
            None => self.lookup_trees(k, dead),
        }
    }

    /// [`Flat4::lookup`] by the trees.
    #[inline]
    fn lookup_trees(&self, k: &Key4, dead: Option<&[u64]>) -> Option<usize> {
        if self.trees.len() <= LOCKSTEP {
            let trees = &self.trees[..];
            // Every walk side by side, since a single key's walk waits on
            // one load per level; then the leaves in the trees' order (of
            // their first rules), each read only if it can hold an earlier
            // rule than those found.
            let mut es = [0 as Entry; LOCKSTEP];
            let mut depth = 0;
            for (e, t) in es.iter_mut().zip(trees) {
                *e = t.0;
                depth = depth.max(t.1);
            }
            let es = &mut es[..trees.len()];
            for _ in 0..depth {
                for e in es.iter_mut() {
                    *e = step(&self.nodes, &k.dims, *e);
                }
            }
            let mut best = u32::MAX;
            for (&e, t) in es.iter().zip(trees) {
                if t.2 >= best {
                    break;
                }
                best = best.min(self.leaf_match(e, k, dead));
            }
            return (best != u32::MAX).then_some(best as usize);
        }
        let mut best = u32::MAX;
        for &t in &self.trees {
            if t.2 >= best {
                break;
            }
            let e = self.walk(t, k);
            best = best.min(self.leaf_match(e, k, dead));
        }
        (best != u32::MAX).then_some(best as usize)
    }

    /// [`Flat4::lookup`] for up to [`BATCH`] keys at once: per tree, the
    /// walks of the keys that tree can still improve on run side by side,
    /// so the loads of different keys overlap. `best` gets each key's
    /// rule position, or `u32::MAX`.
    #[inline]
    pub(super) fn lookup_many(&self, keys: &[Key4], dead: Option<&[u64]>, best: &mut [u32]) {
        let n = keys.len().min(best.len()).min(BATCH);
        let (keys, best) = (&keys[..n], &mut best[..n]);
        if let Some(rfc) = &self.rfc {
            rfc.lookup_many(keys, |k| k.dims, best);
            if let Some(dead) = dead {
                for (b, k) in best.iter_mut().zip(keys) {
                    if is_set(dead, *b) {
                        *b = self
                            .lookup_trees(k, Some(dead))
                            .map_or(u32::MAX, |p| p as u32);
                    }
                }
            }
            return;
        }
        let mut trees = self.trees.iter();
        let Some(&(root, depth, _)) = trees.next() else {
            best.fill(u32::MAX);
            return;
        };
        // The first tree: every key (a whole batch in a loop the compiler
        // can unroll).
        let mut es = [root; BATCH];
        if let Ok(full) = <&[Key4; BATCH]>::try_from(keys) {
            for _ in 0..depth {
                for (e, k) in es.iter_mut().zip(full) {
                    *e = step(&self.nodes, &k.dims, *e);
                }
            }
        } else {
            for _ in 0..depth {
                for (e, k) in es.iter_mut().zip(keys) {
                    *e = step(&self.nodes, &k.dims, *e);
                }
            }
        }
        for &e in &es[..n] {
            self.prefetch_leaf(e);
        }
        for ((b, &e), k) in best.iter_mut().zip(&es).zip(keys) {
            *b = self.leaf_match(e, k, dead);
        }
        let mut lane = [0u8; BATCH];
        let mut dims = [[0u32; 8]; BATCH];
        for &(root, depth, min_pos) in trees {
            // The keys whose best rule so far comes after this tree's
            // first, their fields side by side.
            let mut lanes = 0;
            for (i, (&b, k)) in best.iter().zip(keys).enumerate() {
                lane[lanes & (BATCH - 1)] = i as u8;
                dims[lanes & (BATCH - 1)] = k.dims;
                lanes += usize::from(min_pos < b);
            }
            if lanes == 0 {
                break;
            }
            let es = &mut es[..lanes];
            es.fill(root);
            for _ in 0..depth {
                for (e, k) in es.iter_mut().zip(&dims) {
                    *e = step(&self.nodes, k, *e);
                }
            }
            for &e in es.iter() {
                self.prefetch_leaf(e);
            }
            for (&e, &i) in es.iter().zip(&lane) {
                let i = usize::from(i);
                best[i] = best[i].min(self.leaf_match(e, &keys[i], dead));
            }
        }
    }

    /// [`Flat4::lookup_many`] for keys of different sets: lane `i` looks
    /// `keys[i]` up in `flats[i]` (with `deads[i]`), and every lane's walk
    /// of its set's first tree, then of its second, and so on, runs side
    /// by side with the others', so a burst spread over many tenants
    /// overlaps as many loads as one tenant's would. Lanes whose set has
    /// no tree at that index, or whose best rule so far comes before the
    /// tree's first, sit the walk out; a lane at its leaf stays there.
    #[inline]
    pub(super) fn lookup_lanes(
        flats: &[&Flat4],
        deads: &[Option<&[u64]>],
        keys: &[Key4],
        best: &mut [u32],
    ) {
        let n = keys
            .len()
            .min(best.len())
            .min(flats.len())
            .min(deads.len())
            .min(MULTI);
        best[..n].fill(u32::MAX);
        let mut lane = [0u8; MULTI];
        let mut es = [0 as Entry; MULTI];
        // Each walking lane's nodes and key fields, side by side.
        let mut nodes: [&[Entry]; MULTI] = [&[]; MULTI];
        let mut dims = [[0u32; 8]; MULTI];
        for t in 0.. {
            let (mut lanes, mut depth) = (0, 0);
            for i in 0..n {
                if let Some(&(root, d, min_pos)) = flats[i].trees.get(t) {
                    if min_pos < best[i] {
                        lane[lanes] = i as u8;
                        es[lanes] = root;
                        nodes[lanes] = &flats[i].nodes;
                        dims[lanes] = keys[i].dims;
                        lanes += 1;
                        depth = depth.max(d);
                    }
                }
            }
            if lanes == 0 {
                break;
            }
            walk_lanes(&mut es, &nodes, &dims, lanes, depth);
            // Every lane's leaf is known: start all their misses before
            // the matches, whose branches would hold later lanes' loads.
            for (&e, &i) in es[..lanes].iter().zip(&lane) {
                flats[usize::from(i)].prefetch_leaf(e);
            }
            for (&e, &i) in es[..lanes].iter().zip(&lane) {
                let i = usize::from(i);
                best[i] = best[i].min(flats[i].leaf_match(e, &keys[i], deads[i]));
            }
        }
    }

    /// Leaves with an index.
    #[cfg(test)]
    pub(super) fn indexed(&self) -> usize {
        self.indexes.len()
    }

    pub(super) fn memory(&self) -> usize {
        self.trees.len() * 16
            + self.nodes.len() * std::mem::size_of::<Entry>()
            + self.pairs.len() * std::mem::size_of::<Pair>()
            + self.run_at.len() * 4
            + self.runs.len() * std::mem::size_of::<Rec>()
            + self.index_at.len() * 4
            + self.indexes.iter().map(LeafIndex::memory).sum::<usize>()
            + self.rfc.as_ref().map_or(0, |r| r.memory())
    }
}

/// Walks lanes `0..lanes` of `es` `depth` steps down their trees (lane
/// `i` in `nodes[i]` with the key fields `dims[i]`). The first half of
/// the steps take every lane; the second only the lanes not at a leaf by
/// then. ClassBench acl1 walks end at half the tree's depth on average,
/// and a step from a leaf stays there, so steps for every lane to the
/// end would spend a third of the walk on leaves. Listing the lanes left
/// at every level instead makes each level wait for the last lane's load
/// of the one before.
#[inline(always)]
fn walk_lanes(
    es: &mut [Entry; MULTI],
    nodes: &[&[Entry]; MULTI],
    dims: &[[u32; 8]; MULTI],
    lanes: usize,
    depth: u32,
) {
    let lanes = lanes.min(MULTI);
    let half = depth.div_ceil(2);
    for _ in 0..half {
        for ((e, nodes), k) in es[..lanes].iter_mut().zip(nodes).zip(dims) {
            *e = step(nodes, k, *e);
        }
    }
    let mut walking = [0u8; MULTI];
    let mut left = 0;
    for (i, &e) in es[..lanes].iter().enumerate() {
        walking[left] = i as u8;
        left += usize::from(e & LEAF_FLAG == 0);
    }
    for _ in half..depth {
        for &i in &walking[..left] {
            let i = usize::from(i) & (MULTI - 1);
            es[i] = step(nodes[i], &dims[i], es[i]);
        }
    }
}

/// True if bit `p` of `bits` is set (`u32::MAX`, no rule, never is).
#[inline(always)]
pub(super) fn is_set(bits: &[u64], p: u32) -> bool {
    let p = p as usize;
    bits.get(p / 64).is_some_and(|w| w & (1 << (p % 64)) != 0)
}

#[cfg(test)]
mod tests {
    use dpu_rand::Rng;

    use super::*;
    use crate::classify::rule::Family;
    use crate::classify::tests::{random_key, random_rules};

    /// A leaf record's packed test is the rule's range test, on the
    /// bounds and one past them in every field.
    #[test]
    fn leaf_records_test_every_bound_like_the_rule() {
        let mut rng = Rng::new(99);
        let rules = random_rules(&mut rng, 300, 0);
        for (p, r) in rules.iter().enumerate() {
            let mut r = *r;
            if r.family == Family::Any {
                r.src = (0, u128::from(u32::MAX));
                r.dst = (0, u128::from(u32::MAX));
            }
            let rec = Rec::new(&r, p as u32);
            assert_eq!(rec.pos(), p as u32);
            for _ in 0..200 {
                let mut k = random_key(&mut rng, &rules);
                k.v6 = false;
                let edge =
                    |rng: &mut Rng, (a, b): (u128, u128), v: u128, top: u128| match rng.below(5) {
                        0 => a,
                        1 => b,
                        2 => a.wrapping_sub(1) & top,
                        3 => b.wrapping_add(1) & top,
                        _ => v & top,
                    };
                let m32 = u128::from(u32::MAX);
                k.src = edge(&mut rng, r.src, k.src, m32);
                k.dst = edge(&mut rng, r.dst, k.dst, m32);
                let ports = |x: (u16, u16)| (u128::from(x.0), u128::from(x.1));
                k.src_port = edge(&mut rng, ports(r.src_port), k.src_port.into(), 0xffff) as u16;
                k.dst_port = edge(&mut rng, ports(r.dst_port), k.dst_port.into(), 0xffff) as u16;
                let pr = (u128::from(r.proto.0), u128::from(r.proto.1));
                k.proto = edge(&mut rng, pr, k.proto.into(), 0xff) as u8;
                assert_eq!(rec.matches(&Key4::new(&k)), r.dims_match(&k), "{r:?} {k:?}");
            }
        }
        assert_eq!(Rec::SENTINEL.pos(), u32::MAX);
        let k = FlowKey {
            src: 1,
            dst: u128::from(u32::MAX),
            ..FlowKey::default()
        };
        assert!(Rec::SENTINEL.matches(&Key4::new(&k)));
    }
}
