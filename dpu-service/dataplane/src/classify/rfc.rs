//! Recursive Flow Classification (Gupta and McKeown, 1999) for IPv4 keys:
//! a lookup of a fixed, short sequence of table reads with no compare and
//! no branch on the key, for rule sets whose tables fit a memory budget.
//!
//! Each address goes through a trie of four one-byte levels to its
//! equivalence class: addresses matched by exactly the same rules share
//! a class. The protocol and each port map to theirs through one table
//! each (phase 0). Phase 1 joins protocol, source port and destination
//! port into one class; phase 2 joins two of the three fields so found
//! (source, destination, ports), and phase 3 the third, into the first
//! matching rule. Every table is indexed by the classes before it, so a
//! lookup is a fixed number of loads, at most six in a chain, whatever
//! the number of rules; batches run step by step, so the loads of
//! different keys overlap.
//!
//! The tries store each distinct node once, and a node whose addresses
//! all have one class as one entry, so scattered host addresses cost a
//! few nodes each; the classic cut of an address into two 16-bit chunks
//! joined by a cross product costs the product of both halves' class
//! counts instead (5,000 hosts spread over the space: 25 million entries
//! against 5,000 classes), and takes only prefixes.
//!
//! The price is memory: the tables of later phases are cross products of
//! class counts, which grow with how the rules overlap. [`Rfc::build`]
//! computes each class count before it allocates the table it sizes, and
//! gives up (the classifier then walks its trees) once the tables would
//! pass a budget, as soon as a join finds more classes than the next
//! table could afford. Which two fields phase 2 joins first is chosen
//! for the smallest tables.

use hashbrown::HashMap;

use super::rule::{AclRule, Family};

/// Most keys [`Rfc::lookup_many`] takes at once.
pub(crate) const BATCH: usize = 32;

/// A rule position meaning "no rule matches".
const NONE: u16 = u16::MAX;

/// A position from the last phase's table as lookups give it: `u32::MAX`
/// for [`NONE`].
#[inline(always)]
fn position(p: u16) -> u32 {
    if p == NONE {
        u32::MAX
    } else {
        u32::from(p)
    }
}

/// Table entries (`u16`) a build may allocate beyond phase 0: a base,
/// and so many per rule, up to [`BUDGET_MAX`]. ClassBench acl1 takes
/// about 310 a rule at 1K rules and 530 at 10K (10.4 MB).
const BUDGET_BASE: usize = 1 << 20;
/// See [`BUDGET_BASE`].
const BUDGET_PER_RULE: usize = 768;
/// The most table entries of one rule set: 32 MB. Past that the trees
/// answer, in a few megabytes whatever the rules.
const BUDGET_MAX: usize = 16 << 20;

/// Tables of no rules, never read: what fills unused places of an
/// array of tables.
pub(crate) static EMPTY: Rfc = {
    const NO_CHUNK: Chunk = Chunk {
        top: [0; BLOCKS],
        blocks: Vec::new(),
    };
    const NO_JOIN: Join = Join {
        table: Vec::new(),
        width: 0,
    };
    const NO_TRIE: Trie = Trie {
        inner: [Vec::new(), Vec::new(), Vec::new()],
        leaves: Vec::new(),
        root: 0,
    };
    Rfc {
        chunks: [NO_CHUNK; 3],
        src: NO_TRIE,
        dst: NO_TRIE,
        proto_sport: NO_JOIN,
        ports: NO_JOIN,
        order: [0, 1, 2],
        pair: NO_JOIN,
        first: NO_JOIN,
    }
};

/// Values per block of a chunk's table, and blocks per chunk.
const BLOCK: usize = 256;
/// See [`BLOCK`].
const BLOCKS: usize = 256;

/// One chunk of the key: the class of each of its values, in blocks of
/// [`BLOCK`] consecutive values stored once however many times they
/// recur. Rules' ranges are mostly aligned runs of whole blocks, so most
/// blocks hold one class throughout and a table of 65,536 values takes a
/// few kilobytes of cache instead of 128.
#[derive(Debug)]
struct Chunk {
    /// Per high byte of a value, where its block starts in `blocks`.
    top: [u32; BLOCKS],
    blocks: Vec<u16>,
}

impl Chunk {
    #[inline(always)]
    fn class(&self, v: u32) -> usize {
        let at = self.top[(v as usize >> 8) % BLOCKS] as usize + v as usize % BLOCK;
        usize::from(self.blocks[at])
    }
}

/// A cross product of two class tables: the class of each pair.
#[derive(Debug)]
struct Join {
    table: Vec<u16>,
    /// Classes of the second operand (the row length).
    width: usize,
}

impl Join {
    #[inline(always)]
    fn get(&self, a: usize, b: usize) -> usize {
        usize::from(self.table[a * self.width + b])
    }
}

/// The tables of one IPv4 rule set; see the module documentation.
#[derive(Debug)]
pub(crate) struct Rfc {
    /// Protocol, source port, destination port.
    chunks: [Chunk; 3],
    /// Phases 0 and 1 of the addresses: each address's class.
    src: Trie,
    dst: Trie,
    /// Phase 1 of the rest: protocol, source port and destination port
    /// joined in two steps (protocol with source port, then with
    /// destination port).
    proto_sport: Join,
    ports: Join,
    /// Which of the three fields (0 source, 1 destination, 2 ports)
    /// phase 2 joins, in order, and which phase 3 adds.
    order: [u8; 3],
    /// Phase 2: the first two fields' classes.
    pair: Join,
    /// Phase 3: the first matching rule's position, or [`NONE`].
    first: Join,
}

/// A set of rule positions, sorted.
type Class = Vec<u32>;

/// Classes found so far, each with its number.
struct Interner {
    ids: HashMap<Class, u16>,
    classes: Vec<Class>,
}

impl Interner {
    fn new() -> Interner {
        Interner {
            ids: HashMap::new(),
            classes: Vec::new(),
        }
    }

    /// The number of `class`, new or not; `None` past `u16` numbers.
    fn intern(&mut self, class: &[u32]) -> Option<u16> {
        if let Some(&id) = self.ids.get(class) {
            return Some(id);
        }
        let id = u16::try_from(self.classes.len()).ok()?;
        self.ids.insert(class.to_vec(), id);
        self.classes.push(class.to_vec());
        Some(id)
    }
}

/// A run of values of one class: its first value and the class.
type Segment = (u64, u16);

/// The classes of the values `0..end` where rules match the inclusive
/// value ranges `ranges` (one per rule, by position): values matched by
/// the same rules share a class. Returns the classes and, in order, each
/// value where the class changes with the class from there on (the
/// first at 0); `None` past `u16` classes.
fn segments(ranges: &[(u32, u32)], end: u64) -> Option<(Vec<Segment>, Vec<Class>)> {
    // Every value where some rule's range starts or stops.
    let mut starts: Vec<(u64, u32)> = Vec::with_capacity(2 * ranges.len());
    for (r, &(lo, hi)) in ranges.iter().enumerate() {
        starts.push((u64::from(lo), r as u32));
        if u64::from(hi) + 1 < end {
            starts.push((u64::from(hi) + 1, r as u32));
        }
    }
    starts.sort_unstable();
    let mut active = vec![0u64; ranges.len().div_ceil(64)];
    let mut interner = Interner::new();
    let mut segments: Vec<Segment> = Vec::with_capacity(starts.len() + 1);
    let mut events = starts.iter().peekable();
    let mut class = Vec::new();
    let mut at = 0u64;
    loop {
        while let Some(&(_, r)) = events.next_if(|&&(v, _)| v == at) {
            // A rule's range starts at its low end and stops one past
            // its high end, which is never its low end.
            let w = &mut active[r as usize / 64];
            if u64::from(ranges[r as usize].0) == at {
                *w |= 1 << (r % 64);
            } else {
                *w &= !(1 << (r % 64));
            }
        }
        class.clear();
        for (w, &bits) in active.iter().enumerate() {
            let mut b = bits;
            while b != 0 {
                class.push(w as u32 * 64 + b.trailing_zeros());
                b &= b - 1;
            }
        }
        let id = interner.intern(&class)?;
        if segments.last().is_none_or(|&(_, c)| c != id) {
            segments.push((at, id));
        }
        match events.peek() {
            Some(&&(v, _)) => at = v,
            None => break,
        }
    }
    Some((segments, interner.classes))
}

/// The phase-0 classes of a chunk `bits` wide whose rules match the
/// inclusive value ranges `ranges` (one per rule, by position).
fn chunk(ranges: &[(u32, u32)], bits: u32) -> Option<(Chunk, Vec<Class>)> {
    let end = 1u64 << bits;
    let (segments, classes) = segments(ranges, end)?;
    let mut table = vec![0u16; end as usize];
    for (i, &(at, id)) in segments.iter().enumerate() {
        let next = segments.get(i + 1).map_or(end, |s| s.0);
        table[at as usize..next as usize].fill(id);
    }
    let mut top = [0u32; BLOCKS];
    let mut blocks = Vec::new();
    let mut seen: HashMap<&[u16], u32> = HashMap::new();
    for (t, block) in top.iter_mut().zip(table.chunks(BLOCK)) {
        *t = *seen.entry(block).or_insert_with(|| {
            blocks.extend_from_slice(block);
            (blocks.len() - block.len()) as u32
        });
    }
    // An 8-bit chunk has one block, which its other places never reach.
    Some((Chunk { top, blocks }, classes))
}

/// Per rule position, the classes (numbers) of `classes` holding it.
fn holders(classes: &[Class], rules: usize) -> Vec<Vec<u32>> {
    let mut of = vec![Vec::new(); rules];
    for (c, class) in classes.iter().enumerate() {
        for &r in class {
            of[r as usize].push(c as u32);
        }
    }
    of
}

/// A class's key in [`join`], borrowed: looked up without a copy.
#[derive(Hash)]
struct Split<'a>(u16, &'a [u32]);

impl hashbrown::Equivalent<(u16, Class)> for Split<'_> {
    fn equivalent(&self, key: &(u16, Class)) -> bool {
        self.0 == key.0 && self.1 == key.1.as_slice()
    }
}

/// Levels of an address [`Trie`], one byte of the address each.
const LEVELS: usize = 4;
/// An entry of a [`Trie`]'s inner level whose child is one entry for
/// every byte value (a uniform node) rather than 256.
const UNIFORM: u32 = 1 << 31;

/// The class of each IPv4 address, as a trie of four levels of one byte
/// each, nodes of equal content stored once, and a node whose addresses
/// are all of one class stored as one entry (its children are found
/// with the byte masked to 0, so a lookup is four loads and no branch).
#[derive(Debug)]
struct Trie {
    /// Levels 0 to 2: per entry, where the child node starts in the next
    /// level, with [`UNIFORM`] set if that node is one entry.
    inner: [Vec<u32>; LEVELS - 1],
    /// Level 3: the class of each address.
    leaves: Vec<u16>,
    /// The entry of the level-0 node.
    root: u32,
}

impl Trie {
    /// Where in the level below `e` the entry for the byte `b` is.
    #[inline(always)]
    fn at(e: u32, b: u32) -> usize {
        // All ones, or zero for a uniform node.
        let mask = (e >> 31).wrapping_sub(1) & 0xff;
        ((e & !UNIFORM) + (b & mask)) as usize
    }

    #[inline(always)]
    fn class(&self, a: u32) -> usize {
        let e = self.inner[0][Trie::at(self.root, a >> 24)];
        let e = self.inner[1][Trie::at(e, (a >> 16) & 0xff)];
        let e = self.inner[2][Trie::at(e, (a >> 8) & 0xff)];
        usize::from(self.leaves[Trie::at(e, a & 0xff)])
    }

    /// The classes of the inclusive address ranges `ranges` (one per rule,
    /// by position) and the trie giving each address its class, or `None`
    /// past `u16` classes or past `budget` entries (taken from it).
    fn build(ranges: &[(u32, u32)], budget: &mut usize) -> Option<(Trie, Vec<Class>)> {
        let (segments, classes) = segments(ranges, 1 << 32)?;
        let mut b = TrieBuilder {
            trie: Trie {
                inner: [Vec::new(), Vec::new(), Vec::new()],
                leaves: Vec::new(),
                root: 0,
            },
            nodes: Default::default(),
            uniform: Default::default(),
            budget: *budget,
        };
        let root = b.node(0, 0, &segments)?;
        *budget = b.budget;
        b.trie.root = root;
        Some((b.trie, classes))
    }

    /// Table entries.
    fn len(&self) -> usize {
        self.inner.iter().map(Vec::len).sum::<usize>() + self.leaves.len()
    }
}

/// Builds a [`Trie`] from its addresses' classes, each node of the same
/// content once.
struct TrieBuilder {
    trie: Trie,
    /// Per level, where each node content already stored starts.
    nodes: [HashMap<Vec<u32>, u32>; LEVELS],
    /// Per level, the uniform node of each class.
    uniform: [HashMap<u16, u32>; LEVELS],
    budget: usize,
}

impl TrieBuilder {
    /// Stores `entries` (a node of `level`, leaves' entries are classes)
    /// once; its entry in the level above.
    fn store(&mut self, level: usize, entries: Vec<u32>) -> Option<u32> {
        let flag = if entries.len() == 1 { UNIFORM } else { 0 };
        if let Some(&at) = self.nodes[level].get(&entries) {
            return Some(at | flag);
        }
        self.budget = self.budget.checked_sub(entries.len())?;
        let at = if level == LEVELS - 1 {
            let at = self.trie.leaves.len();
            self.trie.leaves.extend(entries.iter().map(|&c| c as u16));
            at
        } else {
            let at = self.trie.inner[level].len();
            self.trie.inner[level].extend_from_slice(&entries);
            at
        };
        let at = u32::try_from(at).ok().filter(|&a| a < UNIFORM)?;
        self.nodes[level].insert(entries, at);
        Some(at | flag)
    }

    /// The entry of a node of `level` whose addresses are all `class`.
    fn uniform(&mut self, level: usize, class: u16) -> Option<u32> {
        if let Some(&e) = self.uniform[level].get(&class) {
            return Some(e);
        }
        let entry = if level == LEVELS - 1 {
            u32::from(class)
        } else {
            self.uniform(level + 1, class)?
        };
        let e = self.store(level, vec![entry])?;
        self.uniform[level].insert(class, e);
        Some(e)
    }

    /// The entry of the node of `level` over the addresses from `lo`, of
    /// which `segments` (each a first address and its class, the first
    /// starting at or before `lo`) are the ones it overlaps.
    fn node(&mut self, level: usize, lo: u64, segments: &[Segment]) -> Option<u32> {
        if let [(_, class)] = segments {
            return self.uniform(level, *class);
        }
        let span = 1u64 << (8 * (LEVELS - 1 - level));
        let mut entries = Vec::with_capacity(256);
        let mut i = 0;
        for k in 0..256u64 {
            let (from, to) = (lo + k * span, lo + (k + 1) * span - 1);
            while i + 1 < segments.len() && segments[i + 1].0 <= from {
                i += 1;
            }
            let mut j = i;
            while j + 1 < segments.len() && segments[j + 1].0 <= to {
                j += 1;
            }
            entries.push(if level == LEVELS - 1 {
                u32::from(segments[i].1)
            } else {
                self.node(level + 1, from, &segments[i..=j])?
            });
        }
        self.store(level, entries)
    }
}

/// The cross product of two class lists: the class of `a[i] ∩ b[j]` at
/// `i * b.len() + j`. Work is in proportion to the table and to the
/// intersections' sizes (each rule of `a[i]` visits the classes of `b`
/// holding it), not to the pairs times the classes' sizes. Rules in
/// every class of `b` (a field's wildcards) visit none: they are in
/// every cell of `a[i]`'s row, and a class is found by that common part
/// and the rest. `None` past `most` classes (the join is given up as
/// soon as it finds one more), so a join whose classes would make the
/// next table too large costs only the work up to that point.
fn join(
    a: &[Class],
    b: &[Class],
    rules: usize,
    budget: &mut usize,
    most: usize,
) -> Option<(Join, Vec<Class>)> {
    let size = a.len().checked_mul(b.len())?;
    *budget = budget.checked_sub(size)?;
    let of = holders(b, rules);
    let everywhere: Vec<bool> = of.iter().map(|h| h.len() == b.len()).collect();
    // Classes by (number of their part in every cell, the rest).
    let mut commons = Interner::new();
    let mut ids: HashMap<(u16, Class), u16> = HashMap::new();
    let mut classes: Vec<Class> = Vec::new();
    let mut intern = |common: u16, part: &[u32], rest: &[u32]| -> Option<u16> {
        if let Some(&id) = ids.get(&Split(common, rest)) {
            return Some(id);
        }
        if classes.len() >= most {
            return None;
        }
        let id = u16::try_from(classes.len()).ok()?;
        let mut class: Class = part.iter().chain(rest).copied().collect();
        class.sort_unstable();
        ids.insert((common, rest.to_vec()), id);
        classes.push(class);
        Some(id)
    };
    let mut table = vec![0u16; size];
    let mut meet: Vec<Class> = vec![Vec::new(); b.len()];
    let mut touched = Vec::new();
    let mut part = Vec::new();
    for (i, ca) in a.iter().enumerate() {
        part.clear();
        for &r in ca {
            if everywhere[r as usize] {
                part.push(r);
                continue;
            }
            for &j in &of[r as usize] {
                let m = &mut meet[j as usize];
                if m.is_empty() {
                    touched.push(j);
                }
                m.push(r);
            }
        }
        let common = commons.intern(&part)?;
        let row = &mut table[i * b.len()..(i + 1) * b.len()];
        if touched.len() < b.len() {
            row.fill(intern(common, &part, &[])?);
        }
        for &j in &touched {
            let m = &mut meet[j as usize];
            row[j as usize] = intern(common, &part, m)?;
            m.clear();
        }
        touched.clear();
    }
    Some((
        Join {
            table,
            width: b.len(),
        },
        classes,
    ))
}

/// The last phase: the first rule of `a[i] ∩ b[j]` at `i * b.len() + j`.
fn firsts(a: &[Class], b: &[Class], rules: usize, budget: &mut usize) -> Option<Join> {
    let size = a.len().checked_mul(b.len())?;
    *budget = budget.checked_sub(size)?;
    let of = holders(b, rules);
    let mut table = vec![NONE; size];
    for (i, ca) in a.iter().enumerate() {
        let row = &mut table[i * b.len()..(i + 1) * b.len()];
        // Positions ascend, so the first rule to reach a cell is its first.
        let mut left = b.len();
        for &r in ca {
            for &j in &of[r as usize] {
                let cell = &mut row[j as usize];
                if *cell == NONE {
                    *cell = r as u16;
                    left -= 1;
                }
            }
            if left == 0 {
                break;
            }
        }
    }
    Some(Join {
        table,
        width: b.len(),
    })
}

impl Rfc {
    /// The tables for `rules` (IPv4, in order: a lookup answers with a
    /// position in this slice), or `None` if there are 65,535 rules or
    /// more, or the tables would pass the memory budget.
    pub(crate) fn build(rules: &[AclRule]) -> Option<Rfc> {
        let budget = BUDGET_BASE + BUDGET_PER_RULE * rules.len();
        Rfc::build_within(rules, budget.min(BUDGET_MAX))
    }

    /// [`Rfc::build`] with a budget of `budget` table entries beyond
    /// phase 0.
    fn build_within(rules: &[AclRule], mut budget: usize) -> Option<Rfc> {
        // Nothing behind a rule that matches every key is ever found.
        let whole = AclRule::any(0, 0, Family::V4);
        let covers = |r: &AclRule| {
            (r.src, r.dst, r.src_port, r.dst_port, r.proto)
                == (
                    whole.src,
                    whole.dst,
                    whole.src_port,
                    whole.dst_port,
                    whole.proto,
                )
        };
        let rules = match rules.iter().position(covers) {
            Some(p) => &rules[..=p],
            None => rules,
        };
        if rules.is_empty() || rules.len() >= usize::from(NONE) {
            return None;
        }
        let n = rules.len();
        let v4 = |(lo, hi): (u128, u128)| Some((u32::try_from(lo).ok()?, u32::try_from(hi).ok()?));
        let mut src = Vec::with_capacity(n);
        let mut dst = Vec::with_capacity(n);
        for r in rules {
            src.push(v4(r.src)?);
            dst.push(v4(r.dst)?);
        }
        let proto: Vec<(u32, u32)> = rules
            .iter()
            .map(|r| (u32::from(r.proto.0), u32::from(r.proto.1)))
            .collect();
        let sport: Vec<(u32, u32)> = rules
            .iter()
            .map(|r| (u32::from(r.src_port.0), u32::from(r.src_port.1)))
            .collect();
        let dport: Vec<(u32, u32)> = rules
            .iter()
            .map(|r| (u32::from(r.dst_port.0), u32::from(r.dst_port.1)))
            .collect();
        let (src, ks) = Trie::build(&src, &mut budget)?;
        let (dst, kd) = Trie::build(&dst, &mut budget)?;
        let (c4, k4) = chunk(&proto, 8)?;
        let (c5, k5) = chunk(&sport, 16)?;
        let (c6, k6) = chunk(&dport, 16)?;
        let (proto_sport, kps) = join(&k4, &k5, n, &mut budget, usize::MAX)?;
        let (ports, kp) = join(&kps, &k6, n, &mut budget, usize::MAX)?;
        let fields = [&ks, &kd, &kp];
        // Phase 2 joins the pair whose tables, with phase 3's, come out
        // smallest; the pair's class count is known only once it is
        // joined, so the cheapest-looking pairs are tried first.
        let mut orders = [[0u8, 1, 2], [0, 2, 1], [1, 2, 0]];
        orders.sort_by_key(|o| fields[o[0] as usize].len() * fields[o[1] as usize].len());
        let mut best: Option<(usize, [u8; 3], Join, Vec<Class>)> = None;
        for o in orders {
            let [a, b, c] = o.map(|f| fields[usize::from(f)]);
            // A join whose own table is past the best total so far is
            // given up as soon as its size is known.
            let mut left = best.as_ref().map_or(budget, |b| b.0.min(budget));
            // Phase 3's table is the pair's classes times the third
            // field's: what is left after the pair's own bounds them.
            let most = left
                .saturating_sub(a.len().saturating_mul(b.len()))
                .checked_div(c.len())
                .unwrap_or(0);
            let Some((pair, kab)) = join(a, b, n, &mut left, most) else {
                continue;
            };
            let total = pair.table.len() + kab.len() * c.len();
            if total <= budget && best.as_ref().is_none_or(|b| total < b.0) {
                best = Some((total, o, pair, kab));
            }
        }
        let (_, order, pair, kab) = best?;
        let mut left = budget - pair.table.len();
        let first = firsts(&kab, fields[usize::from(order[2])], n, &mut left)?;
        Some(Rfc {
            chunks: [c4, c5, c6],
            src,
            dst,
            proto_sport,
            ports,
            order,
            pair,
            first,
        })
    }

    /// The position of the first rule matching the key whose fields are
    /// `dims` (source, destination, source port, destination port,
    /// protocol), `u32::MAX` if none does.
    #[inline(always)]
    pub(crate) fn lookup(&self, dims: &[u32; 8]) -> u32 {
        let [pr, sp, dp] = &self.chunks;
        let s = self.src.class(dims[0]);
        let d = self.dst.class(dims[1]);
        let ps = self.proto_sport.get(pr.class(dims[4]), sp.class(dims[2]));
        let p = self.ports.get(ps, dp.class(dims[3]));
        let f = [s, d, p];
        let [a, b, c] = self.order.map(|i| f[usize::from(i) % 3]);
        position(self.first.table[self.pair.get(a, b) * self.first.width + c])
    }

    /// [`Rfc::lookup`] for up to [`BATCH`] keys (`dims` gives each key's
    /// fields) into `out`.
    #[inline]
    pub(crate) fn lookup_many<K>(
        &self,
        keys: &[K],
        dims: impl Fn(&K) -> [u32; 8],
        out: &mut [u32],
    ) {
        Rfc::lookup_lanes(keys.len(), |_| self, |i| dims(&keys[i]), out);
    }

    /// [`Rfc::lookup`] for up to [`BATCH`] keys, key `i` (of `n`) with
    /// the fields `dims(i)` (the first five of [`Rfc::lookup`]'s) in the
    /// tables `rfc(i)`, into `out` (`u32::MAX` for no match), phase by
    /// phase: each phase's loads for all the keys go out before any of
    /// them is needed, so their cache misses overlap where one key's
    /// chain of loads would wait on each.
    #[inline(always)]
    pub(crate) fn lookup_lanes<'r, const D: usize>(
        n: usize,
        rfc: impl Fn(usize) -> &'r Rfc,
        dims: impl Fn(usize) -> [u32; D],
        out: &mut [u32],
    ) {
        let n = n.min(out.len()).min(BATCH);
        // The address tries level by level, the ports beside them.
        let mut f = [[0usize; 3]; BATCH];
        let mut e = [[0u32; 2]; BATCH];
        for (i, (f, e)) in f[..n].iter_mut().zip(&mut e).enumerate() {
            let t = rfc(i);
            let [pr, sp, _] = &t.chunks;
            let d = dims(i);
            *e = [
                t.src.inner[0][Trie::at(t.src.root, d[0] >> 24)],
                t.dst.inner[0][Trie::at(t.dst.root, d[1] >> 24)],
            ];
            f[2] = t.proto_sport.get(pr.class(d[4]), sp.class(d[2]));
        }
        for level in 1..LEVELS - 1 {
            let shift = 8 * (LEVELS - 1 - level) as u32;
            for (i, e) in e[..n].iter_mut().enumerate() {
                let (t, d) = (rfc(i), dims(i));
                *e = [
                    t.src.inner[level][Trie::at(e[0], (d[0] >> shift) & 0xff)],
                    t.dst.inner[level][Trie::at(e[1], (d[1] >> shift) & 0xff)],
                ];
            }
        }
        for (i, (f, e)) in f[..n].iter_mut().zip(&e).enumerate() {
            let (t, d) = (rfc(i), dims(i));
            f[0] = usize::from(t.src.leaves[Trie::at(e[0], d[0] & 0xff)]);
            f[1] = usize::from(t.dst.leaves[Trie::at(e[1], d[1] & 0xff)]);
            f[2] = t.ports.get(f[2], t.chunks[2].class(d[3]));
        }
        let mut at = [0usize; BATCH];
        for (i, (at, f)) in at.iter_mut().zip(&f[..n]).enumerate() {
            let t = rfc(i);
            let [a, b, c] = t.order.map(|i| usize::from(i) % 3);
            *at = t.pair.get(f[a], f[b]) * t.first.width + f[c];
        }
        for (i, (o, &at)) in out[..n].iter_mut().zip(&at).enumerate() {
            let p = rfc(i).first.table[at];
            *o = position(p);
        }
    }

    /// Table entries beyond phase 0, as budgets count them.
    fn entries(&self) -> usize {
        let joins = [&self.proto_sport, &self.ports, &self.pair, &self.first];
        joins.iter().map(|j| j.table.len()).sum::<usize>() + self.src.len() + self.dst.len()
    }

    /// Bytes of table memory.
    pub(crate) fn memory(&self) -> usize {
        std::mem::size_of::<Rfc>()
            + 2 * (self.chunks.iter().map(|c| c.blocks.len()).sum::<usize>() + self.entries())
            + 2 * (self.src.inner.iter().chain(&self.dst.inner))
                .map(Vec::len)
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FlowKey;

    /// A small xorshift generator: reproducible cases without a crate.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn rule(rng: &mut Rng, pos: u32, bases: &[u32]) -> AclRule {
        let prefix = |rng: &mut Rng| {
            let a = bases[rng.below(bases.len() as u64) as usize] ^ (rng.next() as u32 & 0xff);
            if rng.below(4) == 0 {
                // Any range, across blocks of 256 and 65,536 addresses.
                let span = 1 << (8 * rng.below(4));
                let end = a.saturating_add(rng.below(span) as u32);
                return (u128::from(a), u128::from(end));
            }
            let len = [0, 8, 12, 16, 20, 24, 28, 32][rng.below(8) as usize];
            AclRule::prefix_range(u128::from(a), len, 32)
        };
        let ports = |rng: &mut Rng| match rng.below(3) {
            0 => (0, u16::MAX),
            1 => {
                let p = rng.below(64) as u16;
                (p, p)
            }
            _ => {
                let a = rng.below(64) as u16;
                (a, a + rng.below(32) as u16)
            }
        };
        AclRule {
            order: pos,
            tag: pos,
            family: Family::V4,
            src: prefix(rng),
            dst: prefix(rng),
            src_port: ports(rng),
            dst_port: ports(rng),
            proto: match rng.below(3) {
                0 => (0, 255),
                1 => (6, 6),
                _ => (17, 17),
            },
        }
    }

    fn dims(k: &FlowKey) -> [u32; 8] {
        [
            k.src as u32,
            k.dst as u32,
            u32::from(k.src_port),
            u32::from(k.dst_port),
            u32::from(k.proto),
            0,
            0,
            0,
        ]
    }

    #[test]
    fn agrees_with_a_scan_of_the_rules() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..40 {
            let bases: Vec<u32> = (0..4).map(|_| rng.next() as u32).collect();
            let n = 1 + rng.below(if case % 4 == 0 { 400 } else { 40 }) as u32;
            let rules: Vec<AclRule> = (0..n).map(|i| rule(&mut rng, i, &bases)).collect();
            let rfc = Rfc::build_within(&rules, 1 << 26).expect("rules build");
            for _ in 0..2000 {
                // Keys near the rules' addresses and ports, so they match.
                let b = |rng: &mut Rng| {
                    bases[rng.below(bases.len() as u64) as usize] ^ (rng.next() as u32 & 0x1ff)
                };
                let k = FlowKey {
                    src: u128::from(b(&mut rng)),
                    dst: u128::from(b(&mut rng)),
                    src_port: rng.below(100) as u16,
                    dst_port: rng.below(100) as u16,
                    proto: [6, 17, 1][rng.below(3) as usize],
                    v6: false,
                };
                let want = rules.iter().position(|r| r.matches(&k));
                let got = rfc.lookup(&dims(&k));
                assert_eq!(
                    (got != u32::MAX).then_some(got as usize),
                    want,
                    "case {case}, key {k:?}"
                );
            }
        }
    }

    #[test]
    fn edges_of_every_field() {
        // Ranges that start at 0 and end at the top of each field, and a
        // one-value range at the very top.
        let any = AclRule::any(0, 0, Family::V4);
        let rules = [
            AclRule {
                src: (u128::from(u32::MAX), u128::from(u32::MAX)),
                ..any
            },
            AclRule {
                src_port: (u16::MAX, u16::MAX),
                proto: (255, 255),
                ..any
            },
            AclRule {
                dst: (0, 0xffff),
                dst_port: (0, 0),
                ..any
            },
            any,
        ];
        let rfc = Rfc::build(&rules).expect("builds");
        let k = |src: u32, dst: u32, sp: u16, dp: u16, proto: u8| {
            dims(&FlowKey {
                src: u128::from(src),
                dst: u128::from(dst),
                src_port: sp,
                dst_port: dp,
                proto,
                v6: false,
            })
        };
        assert_eq!(rfc.lookup(&k(u32::MAX, 5, 1, 1, 6)), 0);
        assert_eq!(rfc.lookup(&k(u32::MAX - 1, 5, u16::MAX, 1, 255)), 1);
        assert_eq!(rfc.lookup(&k(7, 0xffff, 3, 0, 6)), 2);
        assert_eq!(rfc.lookup(&k(7, 0x1_0000, 3, 0, 6)), 3);
        // Address ranges that are no prefix, across 256- and
        // 65,536-address blocks, unaligned.
        let odd = [
            AclRule {
                src: (0x1_80ff, 0x2_7f00),
                ..any
            },
            AclRule {
                dst: (0xff, 0x100),
                ..any
            },
        ];
        let rfc = Rfc::build(&odd).expect("builds");
        for (a, want) in [
            (0x1_80fe, u32::MAX),
            (0x1_80ff, 0),
            (0x1_ffff, 0),
            (0x2_0000, 0),
            (0x2_7f00, 0),
            (0x2_7f01, u32::MAX),
        ] {
            assert_eq!(rfc.lookup(&k(a, 0, 1, 1, 6)), want, "source {a:#x}");
        }
        for (a, want) in [(0xfe, u32::MAX), (0xff, 1), (0x100, 1), (0x101, u32::MAX)] {
            assert_eq!(rfc.lookup(&k(0, a, 1, 1, 6)), want, "destination {a:#x}");
        }
    }

    #[test]
    fn declines_what_it_cannot_cut_or_afford() {
        let any = AclRule::any(0, 0, Family::V4);
        assert!(Rfc::build(&[]).is_none());
        // Rules that each split every field differently: their classes
        // multiply past the budget.
        let spread: Vec<AclRule> = (0..4000u32)
            .map(|i| AclRule {
                order: i,
                tag: i,
                src: AclRule::prefix_range(u128::from(i.wrapping_mul(0x9e37_79b9)), 32, 32),
                dst: AclRule::prefix_range(u128::from(i.wrapping_mul(0x85eb_ca6b)), 16, 32),
                src_port: (i as u16, i as u16),
                dst_port: ((i * 7) as u16, (i * 7) as u16),
                ..any
            })
            .collect();
        let wide = AclRule {
            order: 5000,
            tag: 5000,
            ..any
        };
        let mut rules = spread;
        rules.push(wide);
        assert!(Rfc::build(&rules).is_none());
    }
}
