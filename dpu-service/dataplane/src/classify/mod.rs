//! Packet classification: first matching rule of an ordered list, found
//! with decision trees instead of a scan.
//!
//! Rules are grouped by shape first (EffiCuts-style): per dimension a rule
//! is "large" if it covers a big share of the field; the rules of the
//! largest shape group get one tree and all others a second, so a lookup
//! walks at most two trees per address family. Within a group, wide rules
//! rarely have to be copied into many narrow slices, which is what makes
//! a single cut tree blow up.
//!
//! Each tree cuts the 5-dimensional key space (source address, destination
//! address, source port, destination port, protocol) into aligned
//! power-of-two slices, one dimension per node, HiCuts-style: a node tries
//! the dimensions in which its rules differ most, with as many cuts as
//! keep rule replication within a budget, and takes the first cut that
//! separates rules (every slice gets fewer) or zooms in (all rules lie in
//! one slice, whose smaller box is cut next); otherwise it is a leaf
//! listing its rules in order. Before cutting, a node skips, per
//! dimension, the high bits that all its rules not spanning the node
//! share (Patricia-style; see `Builder::zoom`), so rules clustered under
//! one prefix cost no levels on the way down. Because boxes are aligned,
//! a child is found by a shift and a mask. Rules behind one that covers a
//! whole box are cut from that box, so a catch-all rule costs nothing
//! below it. Node budgets per rule and a depth limit bound build time,
//! memory and lookup time whatever the rules look like.
//!
//! IPv4 lookups, the ones that matter on this switch, run on a compact
//! form of the trees (`Flat4`): a node is one `u64` in one flat array,
//! so each level is one load; a leaf's first two rules sit in one cache
//! line as packed `u128` bounds that one branch-free test checks against
//! all five fields; and leaves step to themselves, so every walk of a
//! tree has the same length and branches on nothing the key decides.
//! [`Classifier::lookup_batch`] walks up to [`BATCH`] keys side by side,
//! as rte_acl does with its multi-flow loops, so their cache misses
//! overlap. IPv6 keys walk the trees as built, with 128-bit bounds.
//!
//! IPv4 rule sets whose tables fit a memory budget are also compiled to
//! Recursive Flow Classification tables (`rfc`): a fixed sequence
//! of table reads, no compare, no walk. IPv4 lookups read those first;
//! the trees answer when a set has no tables (rules that are neither
//! prefixes nor fit the budget), and for the keys whose answer was
//! removed since the build ([`Classifier::with_changes`]).
//!
//! A lookup walks the trees in order of their first rule and stops as soon
//! as no later tree can hold an earlier match. IPv4 and IPv6 have separate
//! trees; a rule without addresses is in both.
//!
//! Changes: [`Classifier::with_changes`] removes rules by marking them in a
//! bit set and puts added rules in a small second set of trees, so one
//! insert or delete costs a rebuild of at most [`OVERLAY_MAX`] rules,
//! never of the whole set. Past that size, or when a removed rule hid
//! others from the trees, the caller builds from scratch
//! ([`ChangeError::needs_rebuild`]).

use std::collections::HashMap;
use std::sync::Arc;

use dpdk::hint::prefetch;

use crate::parse::FlowKey;
use rfc::Rfc;

mod rfc;

/// Rules a leaf holds before the builder tries to cut it: two fit the
/// one cache line an IPv4 lookup reads per leaf (`Pair`).
const LEAF_RULES: usize = 2;
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
/// Trees per address family (rule groups by shape): each costs every
/// lookup that reaches it a walk.
const MAX_TREES: usize = 2;
/// Added rules kept in the overlay tree before a full rebuild is needed.
pub const OVERLAY_MAX: usize = 256;

/// Address family a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// IPv4 and IPv6 (a rule without addresses).
    Any,
    /// IPv4 only.
    V4,
    /// IPv6 only.
    V6,
}

/// One classification rule: inclusive ranges per dimension.
///
/// For IPv4 the address ranges lie within `0..=u32::MAX`. ICMP type and
/// code use the port ranges (see [`FlowKey`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AclRule {
    /// Evaluation order: the smallest matching `order` wins. Unique.
    pub order: u32,
    /// The caller's handle for the rule, returned by lookups.
    pub tag: u32,
    /// Address family.
    pub family: Family,
    /// Source address range.
    pub src: (u128, u128),
    /// Destination address range.
    pub dst: (u128, u128),
    /// Source port range.
    pub src_port: (u16, u16),
    /// Destination port range.
    pub dst_port: (u16, u16),
    /// Protocol range: one value, or `(0, 255)` for any.
    pub proto: (u8, u8),
}

impl AclRule {
    /// A rule matching every packet of `family`.
    pub fn any(order: u32, tag: u32, family: Family) -> AclRule {
        let top = if family == Family::V6 {
            u128::MAX
        } else {
            u128::from(u32::MAX)
        };
        AclRule {
            order,
            tag,
            family,
            src: (0, top),
            dst: (0, top),
            src_port: (0, u16::MAX),
            dst_port: (0, u16::MAX),
            proto: (0, u8::MAX),
        }
    }

    /// The range of `prefix/len` in a field `width` bits wide.
    pub fn prefix_range(addr: u128, len: u8, width: u32) -> (u128, u128) {
        let host_bits = width.saturating_sub(u32::from(len));
        let host = if host_bits >= 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        (addr & !host, addr | host)
    }

    /// True if the rule matches `key` (the reference semantics).
    pub fn matches(&self, key: &FlowKey) -> bool {
        let fam = match self.family {
            Family::Any => true,
            Family::V4 => !key.v6,
            Family::V6 => key.v6,
        };
        fam && self.dims_match(key)
    }

    fn dims_match(&self, key: &FlowKey) -> bool {
        let (src, dst) = if self.family == Family::Any {
            // A family-less rule has no addresses: any address matches.
            ((0, u128::MAX), (0, u128::MAX))
        } else {
            (self.src, self.dst)
        };
        src.0 <= key.src
            && key.src <= src.1
            && dst.0 <= key.dst
            && key.dst <= dst.1
            && self.src_port.0 <= key.src_port
            && key.src_port <= self.src_port.1
            && self.dst_port.0 <= key.dst_port
            && key.dst_port <= self.dst_port.1
            && self.proto.0 <= key.proto
            && key.proto <= self.proto.1
    }

    fn range(&self, dim: usize) -> (u128, u128) {
        match dim {
            0 => self.src,
            1 => self.dst,
            2 => (u128::from(self.src_port.0), u128::from(self.src_port.1)),
            3 => (u128::from(self.dst_port.0), u128::from(self.dst_port.1)),
            _ => (u128::from(self.proto.0), u128::from(self.proto.1)),
        }
    }
}

const DIMS: usize = 5;

fn key_value(key: &FlowKey, dim: usize) -> u128 {
    match dim {
        0 => key.src,
        1 => key.dst,
        2 => u128::from(key.src_port),
        3 => u128::from(key.dst_port),
        _ => u128::from(key.proto),
    }
}

/// A node: a cut (`bits` > 0) or a leaf.
#[derive(Debug, Clone, Copy)]
struct Node {
    /// Cut dimension.
    dim: u8,
    /// Right shift that brings the cut bits down.
    shift: u8,
    /// Number of cut bits; 0 for a leaf.
    bits: u8,
    /// Cut: first child in `children`. Leaf: first rule in `leaf_rules`.
    first: u32,
    /// Leaf: number of rules.
    len: u32,
}

const LEAF: Node = Node {
    dim: 0,
    shift: 0,
    bits: 0,
    first: 0,
    len: 0,
};

/// An aligned box: per dimension, its lowest value and its width in bits.
#[derive(Debug, Clone, Copy)]
struct Region {
    lo: [u128; DIMS],
    bits: [u32; DIMS],
}

impl Region {
    fn whole(addr_bits: u32) -> Region {
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

    fn covered_by(&self, r: &AclRule) -> bool {
        (0..DIMS).all(|d| {
            let (a, b) = r.range(d);
            a <= self.lo[d] && self.hi(d) <= b
        })
    }
}

/// One decision tree over a subset of a family's rules. Leaves hold
/// positions in the family's rule list, ascending (so in rule order).
#[derive(Debug, Default)]
struct Tree {
    /// Smallest rule position in the tree.
    min_pos: u32,
    nodes: Vec<Node>,
    children: Vec<u32>,
    leaf_rules: Vec<u32>,
}

impl Tree {
    /// First live rule position below `bound` in the leaf `key` falls in.
    #[inline]
    fn lookup(
        &self,
        rules: &[AclRule],
        key: &FlowKey,
        dead: Option<&[u64]>,
        bound: usize,
    ) -> Option<usize> {
        let mut n = self.nodes[0];
        while n.bits > 0 {
            let v = key_value(key, usize::from(n.dim));
            let c = ((v >> n.shift) as usize) & ((1usize << n.bits) - 1);
            n = self.nodes[self.children[n.first as usize + c] as usize];
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

    fn memory(&self) -> usize {
        self.nodes.len() * std::mem::size_of::<Node>()
            + (self.children.len() + self.leaf_rules.len()) * 4
    }
}

/// An IPv4 key, in the two forms a lookup needs: the five dimensions as
/// `u32` indexed by dimension for the tree walk (the padding lets a
/// node's 3-bit dimension index it without a bounds check), and all five
/// packed into one `u128` with guard bits for the leaf records (see
/// [`Rec`]).
#[derive(Debug, Clone, Copy)]
struct Key4 {
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
    const NONE: Key4 = Key4 {
        dims: [0; 8],
        packed: 0,
    };

    /// An IPv4 key's five fields in dimension order.
    #[inline(always)]
    fn fields(key: &FlowKey) -> [u32; DIMS] {
        [
            key.src as u32,
            key.dst as u32,
            u32::from(key.src_port),
            u32::from(key.dst_port),
            u32::from(key.proto),
        ]
    }

    #[inline]
    fn new(key: &FlowKey) -> Key4 {
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
/// the rule's position in its [`Set`] (19 in each half): they take no
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
type Entry = u64;

const LEAF_FLAG: Entry = 1 << 40;
const LONG_FLAG: Entry = 1 << 41;
/// Long leaves of this many rules or more are scanned with early exits.
const LONG_MAX: usize = 63;

const fn cut_entry(first: u32, dim: u8, shift: u8, bits: u8) -> Entry {
    first as u64 | (shift as u64 & 31) << 32 | (dim as u64 & 7) << 37 | ((1u64 << bits) - 1) << 48
}

/// One step down from `e` (a leaf stays where it is).
#[inline(always)]
fn step(nodes: &[Entry], k: &[u32; 8], e: Entry) -> Entry {
    let shift = (e >> 32) as u32 & 31;
    let dim = (e >> 37) as usize & 7;
    let mask = (e >> 48) as u32;
    // Shifts are below 32: a cut takes at least one bit of a field.
    let slot = (k[dim] >> shift) & mask;
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

/// The IPv4 trees of a [`Set`] in their lookup form: every node of every
/// tree in one flat array of [`Entry`], every leaf a [`Pair`] of records,
/// so a lookup touches one cache line per level and one per tree's leaf,
/// branches on nothing but the tree's depth, and allocates nothing.
#[derive(Debug, Default)]
struct Flat4 {
    /// Per tree, in order of their first rule: the root entry, the
    /// tree's depth (steps from the root to any leaf), its smallest
    /// rule position.
    trees: Vec<(Entry, u32, u32)>,
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
    /// The same rules as tables of Recursive Flow Classification, when
    /// they fit its budget: lookups read those instead of walking the
    /// trees, unless the rule they find was removed since.
    rfc: Option<Box<Rfc>>,
}

/// Most keys [`Classifier::lookup_multi`] walks side by side.
pub const MULTI: usize = 32;

/// Keys [`Classifier::lookup_batch`] walks side by side (a power of two).
pub const BATCH: usize = 16;

impl Flat4 {
    /// No trees: every lookup misses.
    const EMPTY: Flat4 = Flat4 {
        trees: Vec::new(),
        nodes: Vec::new(),
        leaf0: 0,
        pairs: Vec::new(),
        run_at: Vec::new(),
        runs: Vec::new(),
        rfc: None,
    };

    fn new(rules: &[AclRule], trees: &[Tree]) -> Flat4 {
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
        let mut leaves: HashMap<&[u32], Entry> = HashMap::new();
        for t in trees {
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
                    entry[i] = cut_entry(next_cut as u32, n.dim, n.shift, n.bits);
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
    fn lookup(&self, k: &Key4, dead: Option<&[u64]>) -> Option<usize> {
        match self.rfc_lookup(k, dead) {
            Some(p) => (p != u32::MAX).then_some(p as usize),
            None => self.lookup_trees(k, dead),
        }
    }

    /// [`Flat4::lookup`] by the trees.
    #[inline]
    fn lookup_trees(&self, k: &Key4, dead: Option<&[u64]>) -> Option<usize> {
        if let [a, b] = self.trees[..] {
            // Two trees (the usual case): both walks side by side, since a
            // single key's walk waits on one load per level; the second
            // tree's leaf is read only if it can hold an earlier rule.
            let (mut ea, mut eb) = (a.0, b.0);
            for _ in 0..a.1.max(b.1) {
                ea = step(&self.nodes, &k.dims, ea);
                eb = step(&self.nodes, &k.dims, eb);
            }
            let mut best = self.leaf_match(ea, k, dead);
            if b.2 < best {
                best = best.min(self.leaf_match(eb, k, dead));
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
    fn lookup_many(&self, keys: &[Key4], dead: Option<&[u64]>, best: &mut [u32]) {
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
    fn lookup_lanes(flats: &[&Flat4], deads: &[Option<&[u64]>], keys: &[Key4], best: &mut [u32]) {
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

    fn memory(&self) -> usize {
        self.trees.len() * 16
            + self.nodes.len() * std::mem::size_of::<Entry>()
            + self.pairs.len() * std::mem::size_of::<Pair>()
            + self.run_at.len() * 4
            + self.runs.len() * std::mem::size_of::<Rec>()
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
fn is_set(bits: &[u64], p: u32) -> bool {
    let p = p as usize;
    bits.get(p / 64).is_some_and(|w| w & (1 << (p % 64)) != 0)
}

/// Builds one [`Tree`], HiCuts-style, within a node budget.
struct Builder<'a> {
    rules: &'a [AclRule],
    tree: Tree,
    node_budget: usize,
    /// This tree's [`SPACE_FACTOR`] and [`MAX_DEPTH`].
    space: usize,
    max_depth: usize,
    /// Positions of rules that hid later rules from some region.
    pruners: &'a mut Vec<u64>,
}

impl<'a> Builder<'a> {
    fn build(
        rules: &'a [AclRule],
        ids: Vec<u32>,
        addr_bits: u32,
        pruners: &'a mut Vec<u64>,
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
            max_depth: MAX_DEPTH[usize::from(ids.len() > SMALL_TREE)],
        };
        let root = Region::whole(addr_bits);
        let ids = b.prune(&root, ids);
        b.grow(0, root, root, ids, 0);
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

/// Which dimensions of a rule are "large" (cover a big share of the
/// field): rules large in the same dimensions go to the same tree, so a
/// tree rarely has to copy a wide rule into many narrow slices.
fn large_mask(r: &AclRule, addr_bits: u32) -> usize {
    let full = [addr_bits, addr_bits, 16, 16, 8];
    (0..DIMS)
        .filter(|&d| {
            let (a, b) = r.range(d);
            // Addresses: a /8 or shorter prefix. Ports, protocol: half the field.
            let share = if d < 2 { 8 } else { 1 };
            b - a >= (1u128 << (full[d] - share)) - 1
        })
        .fold(0, |m, d| m | 1 << d)
}

/// One address family's rules (sorted by order) and the trees over them.
#[derive(Debug, Default)]
struct Set {
    rules: Vec<AclRule>,
    /// `(order, tag)` of each rule of `rules`, in a table an eighth of its
    /// size: what batched lookups read.
    ids: Vec<(u32, u32)>,
    /// Bit per position: the rule hides later rules somewhere, so
    /// removing it incrementally would expose nothing behind it.
    pruners: Vec<u64>,
    /// Sorted by their first rule, so a lookup can stop early. Empty
    /// for IPv4, whose trees are in `flat`.
    trees: Vec<Tree>,
    /// IPv4: the trees in their compact lookup form.
    flat: Flat4,
    /// Per tree: nodes, leaf entries and (IPv4) depth, for
    /// [`Classifier::shape`].
    shapes: Vec<(usize, usize, u32)>,
}

impl Set {
    fn build(mut rules: Vec<AclRule>, addr_bits: u32) -> Set {
        if rules.is_empty() {
            // Common for an overlay, which a single-rule change rebuilds.
            return Set::default();
        }
        rules.sort_by_key(|r| r.order);
        let mut pruners = vec![0u64; rules.len().div_ceil(64)];
        // Nothing behind a rule that matches everything is ever reached.
        let whole = Region::whole(addr_bits);
        let live = match rules.iter().position(|r| whole.covered_by(r)) {
            Some(p) if p + 1 < rules.len() => {
                pruners[p / 64] |= 1 << (p % 64);
                p + 1
            }
            _ => rules.len(),
        };
        // Group rules by large-dimension mask; small groups join the
        // kept group whose mask adds the fewest large dimensions to
        // theirs, or a last mixed tree.
        let mut groups: Vec<Vec<u32>> = vec![Vec::new(); 1 << DIMS];
        for (i, r) in rules[..live].iter().enumerate() {
            groups[large_mask(r, addr_bits)].push(i as u32);
        }
        let min_group = (live / 32).max(4 * LEAF_RULES);
        let mut by_size: Vec<usize> = (0..groups.len())
            .filter(|&m| !groups[m].is_empty())
            .collect();
        by_size.sort_by_key(|&m| std::cmp::Reverse(groups[m].len()));
        let kept: Vec<usize> = by_size
            .iter()
            .copied()
            .filter(|&m| groups[m].len() >= min_group)
            .take(MAX_TREES - 1)
            .collect();
        let mut rest = Vec::new();
        for &m in &by_size {
            if kept.contains(&m) {
                continue;
            }
            let home = kept
                .iter()
                .copied()
                .filter(|&k| k & m == m)
                .min_by_key(|&k| (k & !m).count_ones());
            let moved = std::mem::take(&mut groups[m]);
            match home {
                Some(k) => groups[k].extend(moved),
                None => rest.extend(moved),
            }
        }
        let mut lists: Vec<Vec<u32>> = kept
            .into_iter()
            .map(|m| std::mem::take(&mut groups[m]))
            .collect();
        lists.push(rest);
        let mut trees: Vec<Tree> = lists
            .into_iter()
            .filter(|l| !l.is_empty())
            .map(|mut l| {
                l.sort_unstable();
                Builder::build(&rules, l, addr_bits, &mut pruners)
            })
            .collect();
        trees.sort_by_key(|t| t.min_pos);
        let mut shapes: Vec<(usize, usize, u32)> = trees
            .iter()
            .map(|t| (t.nodes.len(), t.leaf_rules.len(), 0))
            .collect();
        let mut flat = Flat4::default();
        if addr_bits == 32 {
            flat = Flat4::new(&rules, &trees);
            trees.clear();
            for (s, t) in shapes.iter_mut().zip(&flat.trees) {
                s.2 = t.1;
            }
        }
        Set {
            ids: rules.iter().map(|r| (r.order, r.tag)).collect(),
            rules,
            pruners,
            trees,
            flat,
            shapes,
        }
    }

    /// Position of the first rule (in order) matching `key` and not in `dead`.
    #[inline]
    fn lookup(&self, key: &FlowKey, dead: Option<&[u64]>) -> Option<usize> {
        let mut best = usize::MAX;
        for t in &self.trees {
            if t.min_pos as usize >= best {
                break;
            }
            if let Some(i) = t.lookup(&self.rules, key, dead, best) {
                best = i;
            }
        }
        (best != usize::MAX).then_some(best)
    }

    fn position(&self, order: u32) -> Option<usize> {
        self.rules.binary_search_by_key(&order, |r| r.order).ok()
    }

    fn memory(&self) -> usize {
        self.rules.len() * std::mem::size_of::<AclRule>()
            + self.trees.iter().map(Tree::memory).sum::<usize>()
            + self.flat.memory()
    }
}

/// Both families' rule sets.
#[derive(Debug, Default)]
struct Trees {
    v4: Set,
    v6: Set,
}

impl Trees {
    fn build(rules: &[AclRule]) -> Trees {
        // A family-less rule has no addresses (see `matches`): whatever
        // its address fields say, it covers the whole space of each family.
        let v4 = rules
            .iter()
            .filter(|r| r.family != Family::V6)
            .map(|r| {
                let mut r = *r;
                if r.family == Family::Any {
                    r.src = (0, u128::from(u32::MAX));
                    r.dst = (0, u128::from(u32::MAX));
                }
                r
            })
            .collect();
        let v6 = rules
            .iter()
            .filter(|r| r.family != Family::V4)
            .map(|r| {
                let mut r = *r;
                if r.family == Family::Any {
                    r.src = (0, u128::MAX);
                    r.dst = (0, u128::MAX);
                }
                r
            })
            .collect();
        Trees {
            v4: Set::build(v4, 32),
            v6: Set::build(v6, 128),
        }
    }
}

/// Why a change could not be applied incrementally.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChangeError {
    /// A removed rule is not in the classifier.
    #[error("no rule with order {0}")]
    NoSuchRule(u32),
    /// An added rule's order is already taken.
    #[error("order {0} is already used")]
    DuplicateOrder(u32),
    /// The overlay would exceed [`OVERLAY_MAX`]; rebuild instead.
    #[error("too many added rules for an incremental change")]
    OverlayFull,
    /// The removed rule covers a whole region of the tree, which holds
    /// nothing behind it there; rebuild instead.
    #[error("rule {0} shadows others; removing it needs a rebuild")]
    Shadows(u32),
}

impl ChangeError {
    /// True if the change is valid but must be made by a full build.
    pub fn needs_rebuild(&self) -> bool {
        matches!(self, ChangeError::OverlayFull | ChangeError::Shadows(_))
    }
}

/// An immutable classifier: build it off the packet path, share it (it is
/// `Send + Sync`), look up from any number of threads.
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    main: Arc<Trees>,
    /// Per family, main-tree positions removed since the build.
    dead_v4: Arc<Vec<u64>>,
    dead_v6: Arc<Vec<u64>>,
    removed: usize,
    overlay: Arc<Trees>,
    overlay_rules: Arc<Vec<AclRule>>,
}

impl Classifier {
    /// Builds a classifier for `rules` (any order; `order` decides).
    pub fn build(rules: &[AclRule]) -> Classifier {
        Classifier::build_with(rules, true)
    }

    /// [`Classifier::build`] without RFC tables: every lookup walks the
    /// trees. A fifth of the memory at 10,000 ClassBench rules (2 MB
    /// against 12.5), and a twentieth of the build time, for lookups
    /// about 0.6× as fast in bursts; what the benchmarks compare against.
    pub fn build_trees(rules: &[AclRule]) -> Classifier {
        Classifier::build_with(rules, false)
    }

    /// [`Classifier::build`], with RFC tables for IPv4 if `rfc` and they
    /// fit.
    fn build_with(rules: &[AclRule], rfc: bool) -> Classifier {
        let mut main = Trees::build(rules);
        // Overlays, rebuilt on every change, keep to their trees.
        if rfc {
            main.v4.flat.rfc = Rfc::build(&main.v4.rules).map(Box::new);
        }
        Classifier {
            dead_v4: Arc::new(vec![0; main.v4.rules.len().div_ceil(64)]),
            dead_v6: Arc::new(vec![0; main.v6.rules.len().div_ceil(64)]),
            main: Arc::new(main),
            ..Classifier::default()
        }
    }

    /// The first rule (smallest order) matching `key`, if any.
    #[inline]
    pub fn lookup(&self, key: &FlowKey) -> Option<&AclRule> {
        if !key.v6 {
            return self.lookup_v4(&Key4::new(key));
        }
        let main = &self.main.v6;
        let dead = (self.removed > 0).then_some(self.dead_v6.as_slice());
        let a = main.lookup(key, dead).map(|i| &main.rules[i]);
        if self.overlay_rules.is_empty() {
            return a;
        }
        let o = &self.overlay.v6;
        let b = o.lookup(key, None).map(|i| &o.rules[i]);
        match (a, b) {
            (Some(a), Some(b)) => Some(if a.order <= b.order { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    #[inline]
    fn lookup_v4(&self, k: &Key4) -> Option<&AclRule> {
        let main = &self.main.v4;
        let dead = (self.removed > 0).then_some(self.dead_v4.as_slice());
        let a = main.flat.lookup(k, dead).map(|i| &main.rules[i]);
        if self.overlay_rules.is_empty() {
            return a;
        }
        let o = &self.overlay.v4;
        let b = o.flat.lookup(k, None).map(|i| &o.rules[i]);
        match (a, b) {
            (Some(a), Some(b)) => Some(if a.order <= b.order { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    /// The tag of the first rule matching each key of `keys`, into the
    /// same place of `out`: the same answers as [`Classifier::lookup`] on
    /// each key, but faster per key, because the tree walks of up to
    /// [`BATCH`] IPv4 keys run interleaved and their cache misses overlap,
    /// and the answers come from a compact table of tags rather than from
    /// the rules (IPv6 keys are looked up one by one).
    ///
    /// # Panics
    /// If `out` is shorter than `keys`.
    pub fn lookup_batch(&self, keys: &[FlowKey], out: &mut [Option<u32>]) {
        assert!(
            out.len() >= keys.len(),
            "lookup_batch: out shorter than keys"
        );
        for (keys, out) in keys.chunks(BATCH).zip(out.chunks_mut(BATCH)) {
            let mut k4 = [Key4::NONE; BATCH];
            let mut slot = [0u8; BATCH];
            let mut n = 0;
            for (i, (key, o)) in keys.iter().zip(out.iter_mut()).enumerate() {
                if key.v6 {
                    *o = self.lookup(key).map(|r| r.tag);
                } else {
                    k4[n] = Key4::new(key);
                    slot[n] = i as u8;
                    n += 1;
                }
            }
            let main = &self.main.v4;
            let dead = (self.removed > 0).then_some(self.dead_v4.as_slice());
            let mut best = [u32::MAX; BATCH];
            main.flat.lookup_many(&k4[..n], dead, &mut best);
            let mut order = [u32::MAX; BATCH];
            for ((&i, &p), o) in slot[..n].iter().zip(&best).zip(&mut order) {
                let id = main.ids.get(p as usize);
                out[usize::from(i)] = id.map(|&(_, tag)| tag);
                *o = id.map_or(u32::MAX, |&(order, _)| order);
            }
            if self.overlay_rules.is_empty() {
                continue;
            }
            let o = &self.overlay.v4;
            o.flat.lookup_many(&k4[..n], None, &mut best);
            for ((&i, &p), &first) in slot[..n].iter().zip(&best).zip(&order) {
                if let Some(&(order, tag)) = o.ids.get(p as usize) {
                    if order < first {
                        out[usize::from(i)] = Some(tag);
                    }
                }
            }
        }
    }

    /// The tag of the first rule matching each key, like
    /// [`Classifier::lookup_batch`], for keys of different classifiers:
    /// `out[i]` answers `keys[i]` in `classifiers[i]`. The IPv4 keys of up
    /// to [`MULTI`] lookups walk their trees side by side whatever
    /// classifier they belong to (a burst spread over tenants has few keys
    /// per tenant); IPv6 keys, and keys of a classifier with rules added
    /// since its build, go through [`Classifier::lookup`].
    ///
    /// # Panics
    /// If `classifiers` or `out` is shorter than `keys`.
    pub fn lookup_multi(classifiers: &[&Classifier], keys: &[FlowKey], out: &mut [Option<u32>]) {
        assert!(
            classifiers.len() >= keys.len() && out.len() >= keys.len(),
            "lookup_multi: classifiers or out shorter than keys"
        );
        for ((cs, keys), out) in classifiers
            .chunks(MULTI)
            .zip(keys.chunks(MULTI))
            .zip(out.chunks_mut(MULTI))
        {
            let empty = Flat4::EMPTY;
            let mut flats: [&Flat4; MULTI] = [&empty; MULTI];
            let mut deads: [Option<&[u64]>; MULTI] = [None; MULTI];
            let mut k4 = [Key4::NONE; MULTI];
            let mut slot = [0u8; MULTI];
            let mut n = 0;
            // Keys whose classifier has RFC tables read them, side by side.
            let mut tables: [&Rfc; MULTI] = [&rfc::EMPTY; MULTI];
            let mut read = [0u8; MULTI];
            let mut m = 0;
            for (i, ((c, key), o)) in cs.iter().zip(keys).zip(out.iter_mut()).enumerate() {
                if key.v6 || !c.overlay_rules.is_empty() {
                    *o = c.lookup(key).map(|r| r.tag);
                    continue;
                }
                if let Some(t) = &c.main.v4.flat.rfc {
                    tables[m] = t;
                    read[m] = i as u8;
                    m += 1;
                    continue;
                }
                flats[n] = &c.main.v4.flat;
                deads[n] = (c.removed > 0).then_some(c.dead_v4.as_slice());
                k4[n] = Key4::new(key);
                slot[n] = i as u8;
                n += 1;
            }
            let read = &read[..m];
            let mut found = [u32::MAX; MULTI];
            let dims = |j: usize| Key4::fields(&keys[usize::from(read[j])]);
            // A burst of one tenant's keys (one VF's, say) reads one set of
            // tables, whose addresses and sizes then stay in registers.
            let one = tables[..m].iter().all(|&t| std::ptr::eq(t, tables[0]));
            if one {
                Rfc::lookup_lanes(m, |_| tables[0], dims, &mut found);
            } else {
                Rfc::lookup_lanes(m, |j| tables[j], dims, &mut found);
            }
            for (&i, &p) in read.iter().zip(&found) {
                let (i, c) = (usize::from(i), cs[usize::from(i)]);
                // A rule removed since the build: the trees answer.
                out[i] = if c.removed > 0 && is_set(&c.dead_v4, p) {
                    c.lookup(&keys[i]).map(|r| r.tag)
                } else {
                    c.main.v4.ids.get(p as usize).map(|&(_, tag)| tag)
                };
            }
            let mut best = [u32::MAX; MULTI];
            Flat4::lookup_lanes(&flats[..n], &deads[..n], &k4[..n], &mut best);
            for (&i, &p) in slot[..n].iter().zip(&best) {
                let i = usize::from(i);
                out[i] = cs[i].main.v4.ids.get(p as usize).map(|&(_, tag)| tag);
            }
        }
    }

    /// Number of live rules.
    pub fn len(&self) -> usize {
        self.live_main() + self.overlay_rules.len()
    }

    /// True if no rule is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn live_main(&self) -> usize {
        let any = self
            .main
            .v4
            .rules
            .iter()
            .filter(|r| r.family == Family::Any)
            .count();
        self.main.v4.rules.len() + self.main.v6.rules.len() - any - self.removed
    }

    /// Bytes of tables (rules, nodes, child and leaf lists).
    pub fn memory_bytes(&self) -> usize {
        self.main.v4.memory()
            + self.main.v6.memory()
            + self.overlay.v4.memory()
            + self.overlay.v6.memory()
    }

    /// A classifier that no longer has the rules whose order is in `remove`
    /// and has the rules in `add`, sharing this one's main trees: the cost
    /// is a bit set copy and a rebuild of the small overlay.
    ///
    /// # Errors
    /// [`ChangeError`] if a removed rule is missing, an added order is
    /// taken, or the overlay would grow past [`OVERLAY_MAX`] (the caller
    /// then builds from scratch).
    pub fn with_changes(&self, remove: &[u32], add: &[AclRule]) -> Result<Classifier, ChangeError> {
        let mut dead_v4 = (*self.dead_v4).clone();
        let mut dead_v6 = (*self.dead_v6).clone();
        let mut overlay: Vec<AclRule> = (*self.overlay_rules).clone();
        let mut removed = self.removed;
        for &order in remove {
            if let Some(p) = overlay.iter().position(|r| r.order == order) {
                overlay.swap_remove(p);
                continue;
            }
            let mut found = false;
            for (set, dead) in [(&self.main.v4, &mut dead_v4), (&self.main.v6, &mut dead_v6)] {
                if let Some(i) = set.position(order) {
                    if set.pruners[i / 64] & (1 << (i % 64)) != 0 {
                        return Err(ChangeError::Shadows(order));
                    }
                    if dead[i / 64] & (1 << (i % 64)) == 0 {
                        dead[i / 64] |= 1 << (i % 64);
                        found = true;
                    }
                }
            }
            if !found {
                return Err(ChangeError::NoSuchRule(order));
            }
            removed += 1;
        }
        for r in add {
            let taken_main = [(&self.main.v4, &dead_v4), (&self.main.v6, &dead_v6)]
                .iter()
                .any(|(t, d)| {
                    t.position(r.order)
                        .is_some_and(|i| d[i / 64] & (1 << (i % 64)) == 0)
                });
            if taken_main || overlay.iter().any(|o| o.order == r.order) {
                return Err(ChangeError::DuplicateOrder(r.order));
            }
            overlay.push(*r);
        }
        if overlay.len() > OVERLAY_MAX {
            return Err(ChangeError::OverlayFull);
        }
        Ok(Classifier {
            main: self.main.clone(),
            dead_v4: Arc::new(dead_v4),
            dead_v6: Arc::new(dead_v6),
            removed,
            overlay: Arc::new(Trees::build(&overlay)),
            overlay_rules: Arc::new(overlay),
        })
    }

    /// A one-line description of the main tables (trees, nodes, leaf
    /// entries per family), for logs and benchmarks.
    pub fn shape(&self) -> String {
        let fam = |s: &Set| {
            let trees: Vec<String> = s
                .shapes
                .iter()
                .map(|(n, l, d)| format!("{n}n/{l}l/{d}d"))
                .collect();
            let rfc = s.flat.rfc.as_ref().map_or(String::new(), |r| {
                format!(", RFC tables {:.2} MB", r.memory() as f64 / 1e6)
            });
            format!(
                "{} rules in {} trees [{}]{rfc}",
                s.rules.len(),
                s.shapes.len(),
                trees.join(" ")
            )
        };
        format!("v4: {}; v6: {}", fam(&self.main.v4), fam(&self.main.v6))
    }

    /// Rules added since the last full build.
    pub fn overlay_len(&self) -> usize {
        self.overlay_rules.len()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

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

    fn reference<'a>(rules: &'a [AclRule], key: &FlowKey) -> Option<&'a AclRule> {
        rules
            .iter()
            .filter(|r| r.matches(key))
            .min_by_key(|r| r.order)
    }

    /// Rules shaped like ClassBench ACLs: a few address pools, prefixes of
    /// varied length, exact or ranged ports, TCP/UDP/any.
    fn random_rules(rng: &mut Rng, n: usize, v6_share: u64) -> Vec<AclRule> {
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

    fn random_key(rng: &mut Rng, rules: &[AclRule]) -> FlowKey {
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

    /// A family-less rule ignores its address fields, whatever they hold
    /// (the reference semantics), in the main trees and the overlay.
    #[test]
    fn family_less_rules_ignore_their_address_fields() {
        let mut any = AclRule::any(1, 7, Family::Any);
        any.src = (5, 9);
        any.dst = (1 << 40, 1 << 41);
        any.dst_port = (53, 53);
        let key = |src: u128, v6: bool| FlowKey {
            src,
            dst: 0x0a00_0001,
            src_port: 1000,
            dst_port: 53,
            proto: 17,
            v6,
        };
        let c = Classifier::build(&[any]);
        let added = Classifier::build(&[]).with_changes(&[], &[any]).unwrap();
        for k in [key(0x0a00_0002, false), key(1 << 100, true), key(6, false)] {
            assert!(any.matches(&k));
            assert_eq!(c.lookup(&k).map(|r| r.tag), Some(7), "{k:?}");
            assert_eq!(added.lookup(&k).map(|r| r.tag), Some(7), "overlay {k:?}");
        }
    }

    /// Both lookup forms of IPv4 rules: the trees alone, and RFC tables
    /// in front of them. Every random set below fits the tables' budget.
    const FORMS: [bool; 2] = [false, true];

    #[test]
    fn agrees_with_the_reference_on_random_rules_and_keys() {
        for (seed, rfc) in (1..=20u64).flat_map(|s| FORMS.map(|f| (s, f))) {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let n = [0usize, 1, 5, 50, 500, 3000][seed as usize % 6];
            let rules = random_rules(&mut rng, n, 30);
            let c = Classifier::build_with(&rules, rfc);
            assert_eq!(
                c.main.v4.flat.rfc.is_some(),
                rfc && !c.main.v4.rules.is_empty()
            );
            assert_eq!(c.len(), n);
            for _ in 0..3000 {
                let k = random_key(&mut rng, &rules);
                assert_eq!(
                    c.lookup(&k).map(|r| r.tag),
                    reference(&rules, &k).map(|r| r.tag),
                    "seed {seed}, {n} rules, RFC {rfc}, key {k:?}"
                );
            }
        }
    }

    #[test]
    fn incremental_changes_agree_with_a_rebuild() {
        for rfc in FORMS {
            incremental_changes_agree_with_a_rebuild_in(rfc);
        }
    }

    fn incremental_changes_agree_with_a_rebuild_in(rfc: bool) {
        let mut rng = Rng(77);
        let mut rules = random_rules(&mut rng, 2000, 20);
        let mut c = Classifier::build_with(&rules, rfc);
        let mut next_order = 1_000_000;
        for step in 0..60 {
            // Remove one or two, add one or two (some at the front).
            let mut remove = Vec::new();
            for _ in 0..=rng.below(2) {
                let i = rng.below(rules.len() as u64) as usize;
                remove.push(rules.swap_remove(i).order);
            }
            let k = 1 + rng.below(2) as usize;
            let mut add = random_rules(&mut rng, k, 20);
            for a in &mut add {
                a.order = if rng.below(2) == 0 { 0 } else { next_order };
                a.order += step * 10 + rng.below(3) as u32;
                a.tag = next_order + step;
                next_order += 100;
            }
            add.dedup_by_key(|a| a.order);
            add.retain(|a| rules.iter().all(|r| r.order != a.order));
            let changed = c.with_changes(&remove, &add);
            rules.extend_from_slice(&add);
            c = match changed {
                Ok(c) => c,
                Err(e) if e.needs_rebuild() => Classifier::build_with(&rules, rfc),
                Err(e) => panic!("{e}"),
            };
            assert_eq!(c.len(), rules.len(), "step {step}");
            for _ in 0..500 {
                let k = random_key(&mut rng, &rules);
                assert_eq!(
                    c.lookup(&k).map(|r| r.order),
                    reference(&rules, &k).map(|r| r.order),
                    "step {step}, RFC {rfc}, key {k:?}"
                );
            }
        }
        assert!(c.with_changes(&[u32::MAX - 1], &[]).is_err());
    }

    #[test]
    fn a_catch_all_rule_prunes_what_follows_it() {
        let mut rules = vec![AclRule::any(0, 0, Family::Any)];
        let mut rng = Rng(5);
        rules.extend(random_rules(&mut rng, 5000, 0).into_iter().map(|mut r| {
            r.order += 10;
            r
        }));
        let c = Classifier::build(&rules);
        let nodes: usize = c.main.v4.shapes.iter().map(|s| s.0).sum();
        assert!(
            nodes <= c.main.v4.shapes.len(),
            "one leaf per tree: {nodes}"
        );
        let k = random_key(&mut rng, &rules);
        assert_eq!(c.lookup(&k).map(|r| r.tag), Some(0));
        // The catch-all hides every other rule: dropping it must rebuild.
        let err = c.with_changes(&[0], &[]).unwrap_err();
        assert_eq!(err, ChangeError::Shadows(0));
        assert!(err.needs_rebuild());
    }

    /// Looks `keys` up in bursts of every size from 1 to past [`BATCH`]
    /// and checks each answer against single lookups and the reference.
    fn check_batches(c: &Classifier, rules: &[AclRule], keys: &[FlowKey], what: &str) {
        let mut out = vec![None; keys.len()];
        let mut at = 0;
        let mut size = 1;
        while at < keys.len() {
            let end = (at + size).min(keys.len());
            c.lookup_batch(&keys[at..end], &mut out[at..end]);
            at = end;
            size = size % (2 * BATCH + 3) + 1;
        }
        for (k, &got) in keys.iter().zip(&out) {
            assert_eq!(got, c.lookup(k).map(|r| r.tag), "{what}: single, key {k:?}");
            assert_eq!(got, reference(rules, k).map(|r| r.tag), "{what}: key {k:?}");
        }
    }

    #[test]
    fn batch_lookups_agree_with_single_lookups_across_families_and_changes() {
        for (seed, rfc) in (1..=8u64).flat_map(|s| FORMS.map(|f| (s, f))) {
            let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
            let n = [0usize, 3, 40, 400, 2500][seed as usize % 5];
            let mut rules = random_rules(&mut rng, n, 30);
            let mut c = Classifier::build_with(&rules, rfc);
            let keys: Vec<FlowKey> = (0..2000).map(|_| random_key(&mut rng, &rules)).collect();
            check_batches(&c, &rules, &keys, &format!("seed {seed}, RFC {rfc}, build"));
            // Removals (dead rules in the main trees) and additions (the
            // overlay), then the same keys again.
            let mut next = 10_000_000;
            for step in 0..4 {
                let mut remove = Vec::new();
                for _ in 0..rules.len().min(3) {
                    let i = rng.below(rules.len() as u64) as usize;
                    remove.push(rules.swap_remove(i).order);
                }
                let mut add = random_rules(&mut rng, 3, 30);
                for a in &mut add {
                    // Some between existing rules, some after all of them.
                    a.order = if rng.below(2) == 0 {
                        3 * rng.below(rules.len() as u64 + 1) as u32 + 2
                    } else {
                        next
                    };
                    next += 1;
                }
                add.sort_by_key(|a| a.order);
                add.dedup_by_key(|a| a.order);
                add.retain(|a| rules.iter().all(|r| r.order != a.order));
                rules.extend_from_slice(&add);
                c = match c.with_changes(&remove, &add) {
                    Ok(c) => c,
                    Err(e) if e.needs_rebuild() => Classifier::build_with(&rules, rfc),
                    Err(e) => panic!("{e}"),
                };
                let keys: Vec<FlowKey> = (0..1000).map(|_| random_key(&mut rng, &rules)).collect();
                let what = format!("seed {seed}, RFC {rfc}, change {step}");
                check_batches(&c, &rules, &keys, &what);
            }
        }
    }

    /// Keys spread over several classifiers (fresh, changed, empty),
    /// looked up together in bursts of every size up to past [`MULTI`],
    /// get each classifier's own answer.
    #[test]
    fn multi_classifier_lookups_agree_with_each_classifier() {
        let mut rng = Rng(0x5eed);
        // The trees alone and RFC tables side by side in one burst.
        let mut sets: Vec<(Classifier, Vec<AclRule>)> = [0usize, 5, 60, 700, 3000]
            .iter()
            .flat_map(|&n| FORMS.map(|rfc| (n, rfc)))
            .map(|(n, rfc)| {
                let rules = random_rules(&mut rng, n, 20);
                (Classifier::build_with(&rules, rfc), rules)
            })
            .collect();
        // One with removals and additions (dead rules and an overlay), one
        // with removals only.
        for (which, add) in [(6usize, 4usize), (7, 4), (8, 0), (9, 0)] {
            let (c, rules) = &mut sets[which];
            let remove: Vec<u32> = (0..5).map(|_| rules.swap_remove(0).order).collect();
            let mut added = random_rules(&mut rng, add, 20);
            for (j, a) in added.iter_mut().enumerate() {
                a.order = 50_000_000 + j as u32;
            }
            rules.extend_from_slice(&added);
            *c = c.with_changes(&remove, &added).expect("a small change");
        }
        let mut picks = Vec::new();
        let mut keys = Vec::new();
        for _ in 0..3000 {
            let s = rng.below(sets.len() as u64) as usize;
            picks.push(s);
            keys.push(random_key(&mut rng, &sets[s].1));
        }
        let cs: Vec<&Classifier> = picks.iter().map(|&s| &sets[s].0).collect();
        let mut out = vec![Some(u32::MAX); keys.len()];
        let (mut at, mut size) = (0, 1);
        while at < keys.len() {
            let end = (at + size).min(keys.len());
            Classifier::lookup_multi(&cs[at..end], &keys[at..end], &mut out[at..end]);
            at = end;
            size = size % (MULTI + 9) + 1;
        }
        for ((k, &s), &got) in keys.iter().zip(&picks).zip(&out) {
            let (c, rules) = &sets[s];
            assert_eq!(got, c.lookup(k).map(|r| r.tag), "set {s}, key {k:?}");
            assert_eq!(
                got,
                reference(rules, k).map(|r| r.tag),
                "set {s}, key {k:?}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "out shorter than keys")]
    fn a_batch_needs_room_for_every_answer() {
        let c = Classifier::build(&[AclRule::any(1, 1, Family::Any)]);
        c.lookup_batch(&[FlowKey::default(); 3], &mut [None; 2]);
    }

    /// A leaf record's packed test is the rule's range test, on the
    /// bounds and one past them in every field.
    #[test]
    fn leaf_records_test_every_bound_like_the_rule() {
        let mut rng = Rng(99);
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

    /// Many rules under one long prefix, behind and in front of wide ones:
    /// the trees skip the shared prefix bits, and keys outside the prefix
    /// (which walk as if inside) still find the wide rules, while a rule
    /// that covers the cluster's box never hides a later one from them.
    #[test]
    fn skipped_prefix_bits_lose_no_match() {
        let mut rng = Rng(4242);
        let mut rules = Vec::new();
        let base = 0xb013_b400u128;
        for i in 0..400u32 {
            let mut r = AclRule::any(2 * i + 10, i, Family::V4);
            let len = [32u8, 31, 30, 28, 24, 23][rng.below(6) as usize];
            r.src = AclRule::prefix_range(base | u128::from(rng.below(0x400) as u32), len, 32);
            r.dst = AclRule::prefix_range(
                u128::from(rng.next() as u32),
                [32u8, 24, 16, 1][rng.below(4) as usize],
                32,
            );
            r.proto = [(6, 6), (17, 17), (0, 255)][rng.below(3) as usize];
            if rng.below(8) == 0 {
                r.src = (0, u128::from(u32::MAX));
            }
            rules.push(r);
        }
        // A rule covering the whole cluster, early: below the skipped
        // bits it covers every box, yet keys outside the cluster must
        // still reach the rules behind it.
        let mut cover = AclRule::any(1, 9999, Family::V4);
        cover.src = AclRule::prefix_range(base, 22, 32);
        rules.push(cover);
        // The walk is what skips bits: the trees alone.
        let c = Classifier::build_with(&rules, false);
        let keys: Vec<FlowKey> = (0..20_000)
            .map(|_| {
                let mut k = random_key(&mut rng, &rules);
                k.v6 = false;
                k.src &= u128::from(u32::MAX);
                k.dst &= u128::from(u32::MAX);
                if rng.below(2) == 0 {
                    // Same low bits as the cluster, another prefix.
                    k.src = (k.src & 0x3ff) | (u128::from(rng.next() as u32) & !0x3ff);
                }
                k
            })
            .collect();
        check_batches(&c, &rules, &keys, "clustered");
    }

    #[test]
    fn prefix_ranges() {
        assert_eq!(
            AclRule::prefix_range(0x0a00_0000, 8, 32),
            (0x0a00_0000, 0x0aff_ffff)
        );
        assert_eq!(AclRule::prefix_range(0, 0, 32), (0, 0xffff_ffff));
        assert_eq!(AclRule::prefix_range(7, 32, 32), (7, 7));
        assert_eq!(AclRule::prefix_range(0, 0, 128), (0, u128::MAX));
        assert_eq!(
            AclRule::prefix_range(1 << 127, 1, 128),
            (1 << 127, u128::MAX)
        );
    }
}
