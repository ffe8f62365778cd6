//! The classifier, [`Classifier`]: per address family a rule set
//! ([`Set`]) with its trees, grouped by rule shape, and RFC tables; the
//! changes made since its build ([`Classifier::with_changes`]: removed
//! rules marked dead, added rules in a small overlay set); lookups of one
//! key, of a batch of keys, and of keys of many classifiers at once
//! ([`Classifier::lookup_multi`]).

use std::sync::Arc;

use super::flat4::{is_set, Flat4, Key4, BATCH, LOCKSTEP, MULTI, WHOLE as WHOLE4};
use super::flat6::{Flat6, WHOLE as WHOLE6};
use super::leafidx::indexed_budget;
use super::rfc::{self, lanes4, lanes6, Rfc};
use super::rule::{AclRule, Family, DIMS};
use super::tree::{Builder, Region, Tree, LEAF_RULES};
use crate::wire::FlowKey;

/// Trees per rule set (rule groups by shape): each costs every lookup
/// that reaches it a walk, and each shape group left without a tree of
/// its own joins a mixed tree, where its wide fields are copied into
/// many narrow slices (long leaves). A key walks all its trees side by
/// side (IPv4 in `flat4`, one key or a burst; IPv6 in
/// [`Set::lookup_trees`]), so more trees cost little. Measured on the
/// ClassBench acl2, fw2, fw3 and ipc1 sets at 10K rules, interleaved
/// with two trees: for IPv4 up to eight took bursts of 32 1.3-2.8×
/// faster on acl2, fw2 and fw3 (ipc1 level), single keys 1.4-4.8×, a set
/// over 4 tenants 1.0-2.4× (ipc1 0.6-0.9×), memory to 0.4-0.7×; for
/// their IPv6 forms (with shapes judged within the addresses' common
/// prefix, [`common_bits`]) bursts 1.3-4.0× on acl2, fw2 and fw3, ipc1
/// 1.0-1.3×, memory 0.7-0.9×. Yet each tree is a walk more for every
/// key: groups that need no tree of their own are joined after
/// ([`merge_trees`]).
const MAX_TREES: usize = 8;
/// A shape group gets a tree of its own (within [`MAX_TREES`]) if it
/// holds at least this fraction (1/n) of the family's rules.
const GROUP_SHARE: usize = 64;
const _: () = assert!(MAX_TREES <= LOCKSTEP);

/// Added rules kept in the overlay tree before a full rebuild is needed.
pub const OVERLAY_MAX: usize = 256;

/// Which dimensions of a rule are "large" (cover a big share of the
/// field): rules large in the same dimensions go to the same tree, so a
/// tree rarely has to copy a wide rule into many narrow slices. An
/// address field's share is of the `addr_bits` below the `common` top
/// bits that every rule's addresses share (see [`common_bits`]).
fn large_mask(r: &AclRule, addr_bits: u32, common: u32) -> usize {
    let field = addr_bits - common;
    let full = [field, field, 16, 16, 8];
    (0..DIMS)
        .filter(|&d| {
            let (a, b) = r.range(d);
            // Addresses: a /8 or shorter prefix. Ports, protocol: half the field.
            let share = if d < 2 { 8 } else { 1 };
            b - a >= (1u128 << full[d].saturating_sub(share)) - 1
        })
        .fold(0, |m, d| m | 1 << d)
}

/// The top bits of an `addr_bits`-bit address that every address range of
/// `rules` other than the whole space lies within: IPv6 rule sets sit in
/// a few /32s, or a tenant's /48, where a /40 or a /56 is wide; IPv4's
/// mostly share none.
fn common_bits(rules: &[AclRule], addr_bits: u32) -> u32 {
    let whole = (0, u128::MAX >> (128 - addr_bits));
    let mut ranges = rules
        .iter()
        .flat_map(|r| [r.src, r.dst])
        .filter(|&r| r != whole);
    let Some((first, last)) = ranges.next() else {
        return 0;
    };
    let differ = ranges.fold(first ^ last, |d, (a, b)| d | (a ^ first) | (b ^ first));
    // Leave a field at least a byte wide to cut.
    (differ.leading_zeros() - (128 - addr_bits)).min(addr_bits - 8)
}

/// The trees of the groups `lists` (positions in `rules`, each sorted),
/// with trees whose rules cost nothing to cut together joined: a key walks
/// every tree of its set, so a tree fewer is a walk fewer. The smallest
/// trees first, each tried with every other, smallest first, once: a
/// pair is joined when the tree of both rules has no more leaf entries
/// than the two apart (no rule is copied into more slices) and is no
/// deeper than the deeper of them. Groups of one shape that do not
/// overlap join (fw2_10k: from eight trees to five); groups whose wide
/// fields cross do not.
fn merge_trees(
    rules: &[AclRule],
    addr_bits: u32,
    lists: Vec<Vec<u32>>,
    pruners: &mut Vec<u64>,
) -> Vec<Tree> {
    // Per tree: its rules, the tree and its depth.
    let mut trees: Vec<(Vec<u32>, Tree, u32)> = lists
        .into_iter()
        .map(|ids| {
            let t = Builder::build(rules, ids.clone(), addr_bits, pruners);
            let depth = t.depth();
            (ids, t, depth)
        })
        .collect();
    let mut order: Vec<usize> = (0..trees.len()).collect();
    order.sort_by_key(|&i| trees[i].1.leaf_rules.len());
    let mut gone = vec![false; trees.len()];
    let mut joined = vec![false; trees.len()];
    for (k, &a) in order.iter().enumerate() {
        if gone[a] || joined[a] {
            continue;
        }
        for &b in &order[k + 1..] {
            if gone[b] || joined[b] {
                continue;
            }
            let ((ia, ta, da), (ib, tb, db)) = (&trees[a], &trees[b]);
            let mut ids = ia.clone();
            ids.extend_from_slice(ib);
            ids.sort_unstable();
            let apart = ta.leaf_rules.len() + tb.leaf_rules.len();
            let depth = *da.max(db);
            let t = Builder::build_capped(
                rules,
                ids.clone(),
                addr_bits,
                pruners,
                apart,
                depth as usize,
            );
            // A tree of one indexed leaf (what cuts that leave leaves of
            // thousands of rules become) searches where the two cut.
            let indexed = t.indexed() > ta.indexed() + tb.indexed();
            let d = t.depth();
            if t.leaf_rules.len() <= apart && d <= depth && !indexed {
                trees[b] = (ids, t, d);
                gone[a] = true;
                joined[b] = true;
                break;
            }
        }
    }
    trees
        .into_iter()
        .zip(gone)
        .filter(|(_, gone)| !gone)
        .map(|((_, t, _), _)| t)
        .collect()
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
    /// IPv4: the trees in their compact lookup form (and the RFC tables
    /// read in front of them, when the set has some).
    flat: Flat4,
    /// IPv6: the trees in their compact lookup form.
    flat6: Flat6,
    /// IPv6: the rules as RFC tables, when they fit their budget; read
    /// before the trees, which answer when a set has none and for keys
    /// whose rule was removed since the build.
    rfc: Option<Box<Rfc>>,
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
        let common = common_bits(&rules[..live], addr_bits);
        for (i, r) in rules[..live].iter().enumerate() {
            groups[large_mask(r, addr_bits, common)].push(i as u32);
        }
        let min_group = (live / GROUP_SHARE).max(4 * LEAF_RULES);
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
        for l in &mut lists {
            l.sort_unstable();
        }
        lists.retain(|l| !l.is_empty());
        let mut trees = merge_trees(&rules, addr_bits, lists, &mut pruners);
        trees.sort_by_key(|t| t.min_pos);
        let mut shapes: Vec<(usize, usize, u32)> = trees
            .iter()
            .map(|t| (t.nodes.len(), t.leaf_rules.len(), 0))
            .collect();
        let whole = if addr_bits == 32 { WHOLE4 } else { WHOLE6 };
        let mut indexed = indexed_budget(rules.len());
        for t in &mut trees {
            t.index_leaves(&rules, whole, &mut indexed);
        }
        let mut flat = Flat4::default();
        let mut flat6 = Flat6::default();
        let depths: Vec<u32> = if addr_bits == 32 {
            flat = Flat4::new(&rules, &mut trees);
            flat.trees.iter().map(|t| t.1).collect()
        } else {
            flat6 = Flat6::new(&mut trees);
            flat6.trees.iter().map(|t| t.1).collect()
        };
        for (s, d) in shapes.iter_mut().zip(depths) {
            s.2 = d;
        }
        Set {
            ids: rules.iter().map(|r| (r.order, r.tag)).collect(),
            rules,
            pruners,
            flat,
            flat6,
            rfc: None,
            shapes,
        }
    }

    /// Position of the first rule (in order) matching the IPv6 `key` and
    /// not in `dead`: from the RFC tables if the set has some and their
    /// rule was not removed, else from the trees.
    #[inline]
    fn lookup(&self, key: &FlowKey, dead: Option<&[u64]>) -> Option<usize> {
        if let Some(rfc) = &self.rfc {
            let p = rfc.lookup6(key);
            if dead.is_none_or(|d| !is_set(d, p)) {
                return (p != u32::MAX).then_some(p as usize);
            }
        }
        self.lookup_trees(key, dead)
    }

    /// [`Set::lookup`] by the trees.
    #[inline]
    fn lookup_trees(&self, key: &FlowKey, dead: Option<&[u64]>) -> Option<usize> {
        self.flat6.lookup(&self.rules, key, dead)
    }

    fn position(&self, order: u32) -> Option<usize> {
        self.rules.binary_search_by_key(&order, |r| r.order).ok()
    }

    fn memory(&self) -> usize {
        self.rules.len() * std::mem::size_of::<AclRule>()
            + self.flat6.memory()
            + self.flat.memory()
            + self.rfc.as_ref().map_or(0, |r| r.memory())
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

    /// [`Classifier::build`], with RFC tables per family if `rfc` and
    /// they fit.
    fn build_with(rules: &[AclRule], rfc: bool) -> Classifier {
        let mut main = Trees::build(rules);
        // Overlays, rebuilt on every change, keep to their trees.
        if rfc {
            main.v4.flat.rfc = Rfc::build(&main.v4.rules, Family::V4).map(Box::new);
            main.v6.rfc = Rfc::build(&main.v6.rules, Family::V6).map(Box::new);
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
    /// each key, but faster per key, because the table reads or tree
    /// walks of up to [`BATCH`] keys run interleaved and their cache
    /// misses overlap, and the answers come from a compact table of tags
    /// rather than from the rules (IPv6 keys of a set without RFC tables
    /// walk its trees one by one).
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
            let mut six = [0u8; BATCH];
            let mut n6 = 0;
            for (i, key) in keys.iter().enumerate() {
                if key.v6 {
                    six[n6] = i as u8;
                    n6 += 1;
                } else {
                    k4[n] = Key4::new(key);
                    slot[n] = i as u8;
                    n += 1;
                }
            }
            if n6 > 0 {
                self.lookup_batch6(keys, &six[..n6], out);
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

    /// [`Classifier::lookup_batch`] for the IPv6 keys `keys[i]`, `i` in
    /// `which`, into `out[i]`: side by side through the RFC tables when
    /// the set has some, else one by one through its trees (each key's
    /// walks of all its trees side by side), as also when rules were
    /// added since the build.
    fn lookup_batch6(&self, keys: &[FlowKey], which: &[u8], out: &mut [Option<u32>]) {
        if !self.overlay_rules.is_empty() {
            for &i in which {
                let i = usize::from(i);
                out[i] = self.lookup(&keys[i]).map(|r| r.tag);
            }
            return;
        }
        let main = &self.main.v6;
        let dead = (self.removed > 0).then_some(self.dead_v6.as_slice());
        let mut found = [u32::MAX; MULTI];
        match main.rfc.as_deref() {
            Some(rfc) => {
                Rfc::lookup_lanes(
                    which.len(),
                    |_| rfc,
                    |j| lanes6(&keys[usize::from(which[j])]),
                    &mut found,
                );
            }
            // Walked side by side, IPv6 keys' trees measured slower than
            // one key at a time, whose walks of all its trees overlap.
            None => {
                for (f, &i) in found.iter_mut().zip(which) {
                    let p = main.lookup_trees(&keys[usize::from(i)], dead);
                    *f = p.map_or(u32::MAX, |p| p as u32);
                }
            }
        }
        for (&i, &p) in which.iter().zip(&found) {
            let i = usize::from(i);
            out[i] = self.tag6(&keys[i], p);
        }
    }

    /// The tag of the IPv6 rule at position `p` of the main set (none for
    /// `u32::MAX`), found for `key`; if that rule was removed since the
    /// build, the trees answer.
    #[inline]
    fn tag6(&self, key: &FlowKey, p: u32) -> Option<u32> {
        if self.removed > 0 && is_set(&self.dead_v6, p) {
            self.lookup(key).map(|r| r.tag)
        } else {
            self.main.v6.ids.get(p as usize).map(|&(_, tag)| tag)
        }
    }

    /// The tag of the first rule matching each key, like
    /// [`Classifier::lookup_batch`], for keys of different classifiers:
    /// `out[i]` answers `keys[i]` in `classifiers[i]`. The keys of up to
    /// [`MULTI`] lookups read their RFC tables side by side whatever
    /// classifier they belong to (a burst spread over tenants has few keys
    /// per tenant), each family apart, and so do IPv4 keys' tree walks;
    /// IPv6 keys without tables walk their trees one key at a time, and
    /// keys of a classifier with rules added since its build go through
    /// [`Classifier::lookup`].
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
            // IPv6 keys: those with tables, those that walk trees.
            let mut tables6: [&Rfc; MULTI] = [&rfc::EMPTY; MULTI];
            let mut read6 = [0u8; MULTI];
            let mut m6 = 0;
            let mut walk6 = [0u8; MULTI];
            let mut n6 = 0;
            for (i, ((c, key), o)) in cs.iter().zip(keys).zip(out.iter_mut()).enumerate() {
                if !c.overlay_rules.is_empty() {
                    *o = c.lookup(key).map(|r| r.tag);
                } else if key.v6 {
                    if let Some(t) = &c.main.v6.rfc {
                        tables6[m6] = t;
                        read6[m6] = i as u8;
                        m6 += 1;
                    } else {
                        walk6[n6] = i as u8;
                        n6 += 1;
                    }
                } else if let Some(t) = &c.main.v4.flat.rfc {
                    tables[m] = t;
                    read[m] = i as u8;
                    m += 1;
                } else {
                    flats[n] = &c.main.v4.flat;
                    deads[n] = (c.removed > 0).then_some(c.dead_v4.as_slice());
                    k4[n] = Key4::new(key);
                    slot[n] = i as u8;
                    n += 1;
                }
            }
            let read = &read[..m];
            let mut found = [u32::MAX; MULTI];
            let dims = |j: usize| lanes4(Key4::fields(&keys[usize::from(read[j])]));
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
            Classifier::lookup_multi6(cs, keys, &tables6[..m6], &read6[..m6], &walk6[..n6], out);
        }
    }

    /// [`Classifier::lookup_multi`]'s IPv6 keys: `keys[read[j]]` in the
    /// RFC tables `tables[j]` of its classifier, `keys[walk[j]]` in its
    /// classifier's trees (no rule added since either build).
    fn lookup_multi6(
        cs: &[&Classifier],
        keys: &[FlowKey],
        tables: &[&Rfc],
        read: &[u8],
        walk: &[u8],
        out: &mut [Option<u32>],
    ) {
        // Tables whose tries walk as many levels read side by side: sort
        // the lanes by their levels and take each run in one call.
        let mut by_levels = [0u8; MULTI];
        for (j, o) in by_levels[..read.len()].iter_mut().enumerate() {
            *o = j as u8;
        }
        let by_levels = &mut by_levels[..read.len()];
        by_levels.sort_unstable_by_key(|&j| tables[usize::from(j)].levels());
        let mut found = [u32::MAX; MULTI];
        for run in by_levels
            .chunk_by(|&a, &b| tables[usize::from(a)].levels() == tables[usize::from(b)].levels())
        {
            let lane = |j: usize| usize::from(run[j]);
            let key = |j: usize| lanes6(&keys[usize::from(read[lane(j)])]);
            Rfc::lookup_lanes(run.len(), |j| tables[lane(j)], key, &mut found);
            for (&j, &p) in run.iter().zip(&found) {
                let i = usize::from(read[usize::from(j)]);
                out[i] = cs[i].tag6(&keys[i], p);
            }
        }
        for &i in walk {
            let (i, c) = (usize::from(i), cs[usize::from(i)]);
            let dead = (c.removed > 0).then_some(c.dead_v6.as_slice());
            let p = c.main.v6.lookup_trees(&keys[i], dead);
            out[i] = c.tag6(&keys[i], p.map_or(u32::MAX, |p| p as u32));
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
            let rfc = s.flat.rfc.as_ref().or(s.rfc.as_ref());
            let rfc = rfc.map_or(String::new(), |r| {
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
mod tests;
