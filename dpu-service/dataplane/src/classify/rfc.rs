//! Recursive Flow Classification (Gupta and McKeown, 1999) for IPv4 and
//! IPv6 keys: a lookup of a fixed, short sequence of table reads with no
//! compare and no branch on the key, for rule sets whose tables fit a
//! memory budget.
//!
//! Each address goes through a trie of one-byte levels (four for IPv4,
//! sixteen for IPv6) to its equivalence class: addresses matched by
//! exactly the same rules share a class. The protocol and each port map to theirs through one table
//! each (phase 0). Phase 1 joins protocol, source port and destination
//! port into one class; phase 2 joins two of the three fields so found
//! (source, destination, ports), and phase 3 the third, into the first
//! matching rule. Every table is indexed by the classes before it, so a
//! lookup is a fixed number of loads, at most six in a chain for IPv4
//! (eighteen for IPv6), whatever the number of rules; batches run step by step, so the loads of
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
//! for the smallest tables. The work of finding the classes, and the
//! rule lists it keeps, are bounded too ([`EFFORT`]): rules that overlap
//! in nested ranges make few tables but long lists.

use hashbrown::HashMap;

use super::rule::{AclRule, Family};
use crate::wire::FlowKey;

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

/// Work a build may do on the rule lists behind its classes: a step for
/// each rule position hashed or walked, [`KEPT`] for each one kept. The
/// tables' budget bounds what a build keeps; this bounds what it takes
/// to get there: 128 million, a few tenths of a second of a core and at
/// most 128 MB of lists, however many rules. Rules in nested or staggered
/// ranges give classes of thousands of rules each, with tables that may
/// still be small: 20,000 nested source ranges made 40,000 classes of
/// 10,000 rules on average, 2 GB of lists and six seconds of work, and
/// 30,000 nested destination-port ranges 11 GB and 81 seconds (a tenant
/// may have 65,536 rules). Of ClassBench's sets
/// whose tables fit, acl1_10k takes the most, 54 million; random sets of
/// a few hundred rules over six nested prefixes (the classifier's tests)
/// up to 82 million. The 10K sets whose tables do not fit spent up to
/// 290 million before they gave up.
const EFFORT: usize = 128 << 20;

/// Effort a rule position kept in a list costs: its bytes, so that the
/// lists a build keeps take at most its effort in bytes.
const KEPT: usize = 4;

/// What is left of a build's effort (see [`EFFORT`]).
struct Effort(usize);

impl Effort {
    /// Takes `n` steps; `None` once the effort is spent.
    #[inline]
    fn spend(&mut self, n: usize) -> Option<()> {
        self.0 = self.0.checked_sub(n)?;
        Some(())
    }
}

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
        inner: Vec::new(),
        leaves: Vec::new(),
        root: 0,
        skip: 0,
        levels: 4,
        block: 0,
        outside: [0; 2],
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

/// The tables of one rule set of one address family; see the module
/// documentation.
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

    /// The number of `class`, new or not; `None` past `u16` numbers or
    /// once `effort` is spent (a step a position to hash the class, and
    /// [`KEPT`] for each of the two copies a new one keeps).
    fn intern(&mut self, class: &[u32], effort: &mut Effort) -> Option<u16> {
        effort.spend(class.len())?;
        if let Some(&id) = self.ids.get(class) {
            return Some(id);
        }
        let id = u16::try_from(self.classes.len()).ok()?;
        effort.spend(2 * KEPT * class.len())?;
        self.ids.insert(class.to_vec(), id);
        self.classes.push(class.to_vec());
        Some(id)
    }
}

/// A run of values of one class: its first value and the class.
type Segment = (u128, u16);

/// The classes of the values `0..=top` where rules match the inclusive
/// value ranges `ranges` (one per rule, by position): values matched by
/// the same rules share a class. Returns the classes and, in order, each
/// value where the class changes with the class from there on (the
/// first at 0); `None` past `u16` classes or once `effort` is spent.
fn segments(
    ranges: &[(u128, u128)],
    top: u128,
    effort: &mut Effort,
) -> Option<(Vec<Segment>, Vec<Class>)> {
    // Every value where some rule's range starts or stops.
    let mut starts: Vec<(u128, u32)> = Vec::with_capacity(2 * ranges.len());
    for (r, &(lo, hi)) in ranges.iter().enumerate() {
        starts.push((lo, r as u32));
        if hi < top {
            starts.push((hi + 1, r as u32));
        }
    }
    starts.sort_unstable();
    let mut active = vec![0u64; ranges.len().div_ceil(64)];
    let mut interner = Interner::new();
    let mut segments: Vec<Segment> = Vec::with_capacity(starts.len() + 1);
    let mut events = starts.iter().peekable();
    let mut class = Vec::new();
    let mut at = 0u128;
    loop {
        while let Some(&(_, r)) = events.next_if(|&&(v, _)| v == at) {
            // A rule's range starts at its low end and stops one past
            // its high end, which is never its low end.
            let w = &mut active[r as usize / 64];
            if ranges[r as usize].0 == at {
                *w |= 1 << (r % 64);
            } else {
                *w &= !(1 << (r % 64));
            }
        }
        class.clear();
        effort.spend(active.len())?;
        for (w, &bits) in active.iter().enumerate() {
            let mut b = bits;
            while b != 0 {
                class.push(w as u32 * 64 + b.trailing_zeros());
                b &= b - 1;
            }
        }
        let id = interner.intern(&class, effort)?;
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
/// inclusive value ranges `ranges` (one per rule, by position), within
/// `effort`.
fn chunk(ranges: &[(u128, u128)], bits: u32, effort: &mut Effort) -> Option<(Chunk, Vec<Class>)> {
    let end = 1usize << bits;
    let (segments, classes) = segments(ranges, end as u128 - 1, effort)?;
    let mut table = vec![0u16; end];
    for (i, &(at, id)) in segments.iter().enumerate() {
        let next = segments.get(i + 1).map_or(end, |s| s.0 as usize);
        table[at as usize..next].fill(id);
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

/// Per rule position, the classes (numbers) of `classes` holding it;
/// `None` once `effort` is spent.
fn holders(classes: &[Class], rules: usize, effort: &mut Effort) -> Option<Vec<Vec<u32>>> {
    effort.spend(KEPT * classes.iter().map(Vec::len).sum::<usize>())?;
    let mut of = vec![Vec::new(); rules];
    for (c, class) in classes.iter().enumerate() {
        for &r in class {
            of[r as usize].push(c as u32);
        }
    }
    Some(of)
}

/// A class's key in [`join`], borrowed: looked up without a copy.
#[derive(Hash)]
struct Split<'a>(u16, &'a [u32]);

impl hashbrown::Equivalent<(u16, Class)> for Split<'_> {
    fn equivalent(&self, key: &(u16, Class)) -> bool {
        self.0 == key.0 && self.1 == key.1.as_slice()
    }
}

/// An address as a [`Trie`] reads it: one byte a level, from the top
/// of the bytes the trie walks.
pub(crate) trait Address: Copy {
    /// Bytes of the address.
    const BYTES: usize;
    /// Levels a walk takes in `t`: IPv4 always all four, IPv6 the bytes
    /// between those its rules all share and those none of them tests.
    fn levels(t: &Trie) -> usize;
    /// The address shifted past the bytes `t` skips.
    fn bits(self, t: &Trie) -> u128;
    /// The byte of `level` of the shifted address `bits`.
    fn byte(bits: u128, level: usize) -> u32;
    /// The class of the address, given the class `c` its walk found:
    /// `c`, unless the address lies outside the block the trie covers.
    fn class(self, t: &Trie, c: u16) -> u16;
}

impl Address for u32 {
    const BYTES: usize = 4;
    #[inline(always)]
    fn levels(_: &Trie) -> usize {
        4
    }
    #[inline(always)]
    fn bits(self, _: &Trie) -> u128 {
        u128::from(self)
    }
    #[inline(always)]
    fn byte(bits: u128, level: usize) -> u32 {
        (bits as u32 >> (8 * (3 - level))) & 0xff
    }
    #[inline(always)]
    fn class(self, _: &Trie, c: u16) -> u16 {
        c
    }
}

impl Address for u128 {
    const BYTES: usize = 16;
    #[inline(always)]
    fn levels(t: &Trie) -> usize {
        usize::from(t.levels)
    }
    #[inline(always)]
    fn bits(self, t: &Trie) -> u128 {
        self << (8 * u32::from(t.skip))
    }
    #[inline(always)]
    fn byte(bits: u128, level: usize) -> u32 {
        (bits >> (120 - 8 * level)) as u32 & 0xff
    }
    #[inline(always)]
    fn class(self, t: &Trie, c: u16) -> u16 {
        let skipped = !(u128::MAX >> (8 * u32::from(t.skip)));
        if self & skipped == t.block {
            c
        } else if self < t.block {
            t.outside[0]
        } else {
            t.outside[1]
        }
    }
}

/// An entry of a [`Trie`]'s inner level whose child is one entry for
/// every byte value (a uniform node) rather than 256.
const UNIFORM: u32 = 1 << 31;

/// The class of each address of a family, as a trie of one level per
/// byte, nodes of equal content stored once, and a node whose addresses
/// are all of one class stored as one entry (its children are found with
/// the byte masked to 0, so a lookup is a load a level and no branch).
///
/// An IPv4 trie walks all four bytes. An IPv6 trie walks only the bytes
/// where its rules' addresses differ: it skips the top bytes that every
/// address where a class starts or ends shares (a tenant's /48, say),
/// and stops above the bottom bytes that none of them sets (the
/// interface identifier of rules of /64 and shorter). An address outside
/// the skipped prefix is of the class below or above it, so an IPv6 set
/// within one /32 walks four levels, as IPv4 does.
#[derive(Debug)]
pub(crate) struct Trie {
    /// Every level but the last, one after another: per entry, where the
    /// child node starts (here, or in `leaves` below the last of these
    /// levels), with [`UNIFORM`] set if that node is one entry.
    inner: Vec<u32>,
    /// The last level: the class of each address.
    leaves: Vec<u16>,
    /// The entry of the level-0 node.
    root: u32,
    /// Top bytes skipped, and levels walked.
    skip: u8,
    levels: u8,
    /// The skipped bytes of the addresses the trie covers (the rest 0).
    block: u128,
    /// The classes of the addresses below and above that block.
    outside: [u16; 2],
}

/// Which bytes of a family's addresses a [`Trie`] walks.
#[derive(Debug, Clone, Copy)]
struct Span {
    /// Bytes of an address.
    bytes: usize,
    /// Top bytes skipped, and bytes walked.
    skip: usize,
    levels: usize,
    /// The first address of the block walked.
    block: u128,
}

impl Span {
    /// All bytes of an address of `bytes` bytes.
    fn whole(bytes: usize) -> Span {
        Span {
            bytes,
            skip: 0,
            levels: bytes,
            block: 0,
        }
    }

    /// The bytes where the addresses `starts` (first addresses of
    /// classes, the first one 0) differ: the smallest aligned block
    /// holding each start and the address before it, and, below it, no
    /// byte that some start sets.
    fn narrow(bytes: usize, starts: impl Iterator<Item = u128>) -> Span {
        let (mut lo, mut hi, mut zeros) = (u128::MAX, 0, 128);
        for x in starts.filter(|&x| x > 0) {
            lo = lo.min(x - 1);
            hi = hi.max(x);
            zeros = zeros.min(x.trailing_zeros());
        }
        if lo > hi {
            return Span::whole(bytes);
        }
        let skip = ((lo ^ hi).leading_zeros() / 8) as usize;
        // An address and the one before it differ in the lowest byte the
        // address sets, so at least one byte is walked.
        let levels = bytes - skip - (zeros / 8) as usize;
        let top = u128::MAX >> (8 * skip);
        Span {
            bytes,
            skip,
            levels,
            block: lo & !top,
        }
    }

    /// Bits of the addresses one entry of `level` covers.
    fn unit_bits(&self, level: usize) -> u32 {
        8 * (self.bytes - self.skip - 1 - level) as u32
    }
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
    fn class<A: Address>(&self, a: A) -> usize {
        let (bits, levels) = (a.bits(self), A::levels(self));
        let mut e = self.root;
        for level in 0..levels - 1 {
            e = self.inner[Trie::at(e, A::byte(bits, level))];
        }
        let c = self.leaves[Trie::at(e, A::byte(bits, levels - 1))];
        usize::from(a.class(self, c))
    }

    /// The trie over the bytes `span` says giving each address its class,
    /// from the addresses where classes start (`segments`), or `None`
    /// past `budget` entries (taken from it).
    fn build(segments: &[Segment], span: Span, budget: &mut usize) -> Option<Trie> {
        let mut b = TrieBuilder {
            trie: Trie {
                inner: Vec::new(),
                leaves: Vec::new(),
                root: 0,
                skip: span.skip as u8,
                levels: span.levels as u8,
                block: span.block,
                outside: [segments[0].1, segments[segments.len() - 1].1],
            },
            span,
            nodes: vec![HashMap::new(); span.levels],
            uniform: vec![HashMap::new(); span.levels],
            budget: *budget,
        };
        b.trie.root = b.node(0, span.block, segments)?;
        *budget = b.budget;
        Some(b.trie)
    }

    /// Table entries.
    fn len(&self) -> usize {
        self.inner.len() + self.leaves.len()
    }
}

/// Builds a [`Trie`] from its addresses' classes, each node of the same
/// content once.
struct TrieBuilder {
    trie: Trie,
    span: Span,
    /// Per level, where each node content already stored starts.
    nodes: Vec<HashMap<Vec<u32>, u32>>,
    /// Per level, the uniform node of each class.
    uniform: Vec<HashMap<u16, u32>>,
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
        let at = if level == self.span.levels - 1 {
            let at = self.trie.leaves.len();
            self.trie.leaves.extend(entries.iter().map(|&c| c as u16));
            at
        } else {
            let at = self.trie.inner.len();
            self.trie.inner.extend_from_slice(&entries);
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
        let entry = if level == self.span.levels - 1 {
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
    fn node(&mut self, level: usize, lo: u128, segments: &[Segment]) -> Option<u32> {
        if let [(_, class)] = segments {
            return self.uniform(level, *class);
        }
        let last = level == self.span.levels - 1;
        let unit = self.span.unit_bits(level);
        let mut entries = Vec::with_capacity(256);
        let mut i = 0;
        for k in 0..256u128 {
            let from = lo + (k << unit);
            let to = from + ((1u128 << unit) - 1);
            while i + 1 < segments.len() && segments[i + 1].0 <= from {
                i += 1;
            }
            let mut j = i;
            while j + 1 < segments.len() && segments[j + 1].0 <= to {
                j += 1;
            }
            entries.push(if last {
                // Classes start only at multiples of the last level's unit.
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
/// next table too large costs only the work up to that point; `None`
/// too once `effort` is spent.
fn join(
    a: &[Class],
    b: &[Class],
    rules: usize,
    budget: &mut usize,
    most: usize,
    effort: &mut Effort,
) -> Option<(Join, Vec<Class>)> {
    let size = a.len().checked_mul(b.len())?;
    *budget = budget.checked_sub(size)?;
    let of = holders(b, rules, effort)?;
    let everywhere: Vec<bool> = of.iter().map(|h| h.len() == b.len()).collect();
    // Classes by (number of their part in every cell, the rest).
    let mut commons = Interner::new();
    let mut ids: HashMap<(u16, Class), u16> = HashMap::new();
    let mut classes: Vec<Class> = Vec::new();
    let mut intern = |common: u16, part: &[u32], rest: &[u32], effort: &mut Effort| {
        if let Some(&id) = ids.get(&Split(common, rest)) {
            return Some(id);
        }
        if classes.len() >= most {
            return None;
        }
        let id = u16::try_from(classes.len()).ok()?;
        effort.spend(KEPT * (part.len() + 2 * rest.len()))?;
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
        // Each rule's visits, and the hashing of the cells they reach.
        effort.spend(ca.len())?;
        for &r in ca {
            if everywhere[r as usize] {
                part.push(r);
                continue;
            }
            effort.spend(2 * of[r as usize].len())?;
            for &j in &of[r as usize] {
                let m = &mut meet[j as usize];
                if m.is_empty() {
                    touched.push(j);
                }
                m.push(r);
            }
        }
        let common = commons.intern(&part, effort)?;
        let row = &mut table[i * b.len()..(i + 1) * b.len()];
        if touched.len() < b.len() {
            row.fill(intern(common, &part, &[], effort)?);
        }
        for &j in &touched {
            let m = &mut meet[j as usize];
            row[j as usize] = intern(common, &part, m, effort)?;
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

/// The last phase: the first rule of `a[i] ∩ b[j]` at `i * b.len() + j`;
/// `None` past `budget` or once `effort` is spent.
fn firsts(
    a: &[Class],
    b: &[Class],
    rules: usize,
    budget: &mut usize,
    effort: &mut Effort,
) -> Option<Join> {
    let size = a.len().checked_mul(b.len())?;
    *budget = budget.checked_sub(size)?;
    let of = holders(b, rules, effort)?;
    let mut table = vec![NONE; size];
    for (i, ca) in a.iter().enumerate() {
        let row = &mut table[i * b.len()..(i + 1) * b.len()];
        // Positions ascend, so the first rule to reach a cell is its first.
        let mut left = b.len();
        for &r in ca {
            effort.spend(1 + of[r as usize].len())?;
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

/// An IPv4 key's fields, the first five of `d` in the order
/// [`Rfc::lookup`] takes them, as [`Rfc::lookup_lanes`] takes them: the
/// addresses, then the rest.
#[inline(always)]
pub(crate) fn lanes4<const N: usize>(d: [u32; N]) -> ([u32; 2], [u32; 3]) {
    ([d[0], d[1]], [d[2], d[3], d[4]])
}

/// An IPv6 key's fields as [`Rfc::lookup_lanes`] takes them.
#[inline(always)]
pub(crate) fn lanes6(k: &FlowKey) -> ([u128; 2], [u32; 3]) {
    let rest = [k.src_port, k.dst_port, k.proto.into()].map(u32::from);
    ([k.src, k.dst], rest)
}

impl Rfc {
    /// The tables for `rules` (all of `family`, V4 or V6, in order: a
    /// lookup answers with a position in this slice), or `None` if there
    /// are 65,535 rules or more, or the tables would pass the memory
    /// budget.
    pub(crate) fn build(rules: &[AclRule], family: Family) -> Option<Rfc> {
        let budget = BUDGET_BASE + BUDGET_PER_RULE * rules.len();
        Rfc::build_within(rules, family, budget.min(BUDGET_MAX), EFFORT)
    }

    /// [`Rfc::build`] with a budget of `budget` table entries beyond
    /// phase 0 and `effort` steps on class lists.
    fn build_within(
        rules: &[AclRule],
        family: Family,
        mut budget: usize,
        effort: usize,
    ) -> Option<Rfc> {
        let effort = &mut Effort(effort);
        let bytes = match family {
            Family::V4 => <u32 as Address>::BYTES,
            Family::V6 => <u128 as Address>::BYTES,
            Family::Any => return None,
        };
        // Nothing behind a rule that matches every key is ever found.
        let whole = AclRule::any(0, 0, family);
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
        // The family's rules lie within its addresses (see `Trees::build`).
        if rules
            .iter()
            .any(|r| r.src.1 > whole.src.1 || r.dst.1 > whole.dst.1)
        {
            return None;
        }
        let field = |f: fn(&AclRule) -> (u128, u128)| -> Vec<(u128, u128)> {
            rules.iter().map(f).collect()
        };
        let src = field(|r| r.src);
        let dst = field(|r| r.dst);
        let proto = field(|r| (u128::from(r.proto.0), u128::from(r.proto.1)));
        let sport = field(|r| (u128::from(r.src_port.0), u128::from(r.src_port.1)));
        let dport = field(|r| (u128::from(r.dst_port.0), u128::from(r.dst_port.1)));
        let top = u128::MAX >> (128 - 8 * bytes);
        let (src, ks) = segments(&src, top, effort)?;
        let (dst, kd) = segments(&dst, top, effort)?;
        // Both tries walk the same bytes, so lookups walk them side by
        // side; IPv4's walk all four.
        let span = if family == Family::V4 {
            Span::whole(bytes)
        } else {
            Span::narrow(bytes, src.iter().chain(&dst).map(|s| s.0))
        };
        let src = Trie::build(&src, span, &mut budget)?;
        let dst = Trie::build(&dst, span, &mut budget)?;
        let (c4, k4) = chunk(&proto, 8, effort)?;
        let (c5, k5) = chunk(&sport, 16, effort)?;
        let (c6, k6) = chunk(&dport, 16, effort)?;
        let (proto_sport, kps) = join(&k4, &k5, n, &mut budget, usize::MAX, effort)?;
        let (ports, kp) = join(&kps, &k6, n, &mut budget, usize::MAX, effort)?;
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
            let Some((pair, kab)) = join(a, b, n, &mut left, most, effort) else {
                continue;
            };
            let total = pair.table.len() + kab.len() * c.len();
            if total <= budget && best.as_ref().is_none_or(|b| total < b.0) {
                best = Some((total, o, pair, kab));
            }
        }
        let (_, order, pair, kab) = best?;
        let mut left = budget - pair.table.len();
        let first = firsts(&kab, fields[usize::from(order[2])], n, &mut left, effort)?;
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

    /// The rule position phases 2 and 3 give for the address classes `s`
    /// and `d` and the key's source port, destination port and protocol.
    #[inline(always)]
    fn finish(&self, s: usize, d: usize, [sport, dport, proto]: [u32; 3]) -> u32 {
        let [pr, sp, dp] = &self.chunks;
        let ps = self.proto_sport.get(pr.class(proto), sp.class(sport));
        let p = self.ports.get(ps, dp.class(dport));
        let f = [s, d, p];
        let [a, b, c] = self.order.map(|i| f[usize::from(i) % 3]);
        position(self.first.table[self.pair.get(a, b) * self.first.width + c])
    }

    /// The position of the first rule matching the IPv4 key whose fields
    /// are `dims` (source, destination, source port, destination port,
    /// protocol), `u32::MAX` if none does.
    #[inline(always)]
    pub(crate) fn lookup(&self, dims: &[u32; 8]) -> u32 {
        let (s, d) = (self.src.class(dims[0]), self.dst.class(dims[1]));
        self.finish(s, d, [dims[2], dims[3], dims[4]])
    }

    /// [`Rfc::lookup`] for an IPv6 key, in tables built for IPv6.
    #[inline]
    pub(crate) fn lookup6(&self, key: &FlowKey) -> u32 {
        let ([src, dst], rest) = lanes6(key);
        let (s, d) = (self.src.class(src), self.dst.class(dst));
        self.finish(s, d, rest)
    }

    /// Levels an address walks in these tables' tries (both walk the
    /// same bytes): keys of tables with the same number may share one
    /// [`Rfc::lookup_lanes`] call.
    #[inline(always)]
    pub(crate) fn levels(&self) -> u8 {
        self.src.levels
    }

    /// [`Rfc::lookup`] for up to [`BATCH`] IPv4 keys (`dims` gives each
    /// key's fields) into `out`.
    #[inline]
    pub(crate) fn lookup_many<K>(
        &self,
        keys: &[K],
        dims: impl Fn(&K) -> [u32; 8],
        out: &mut [u32],
    ) {
        Rfc::lookup_lanes(keys.len(), |_| self, |i| lanes4(dims(&keys[i])), out);
    }

    /// The first matching rule for up to [`BATCH`] keys of one family,
    /// key `i` (of `n`) with the addresses and the rest of its fields
    /// `key(i)` (`([source, destination], [source port, destination
    /// port, protocol])`) in the tables `rfc(i)` (built for that family;
    /// for IPv6 tables whose tries walk the same number of levels,
    /// [`Rfc::levels`]), into `out`
    /// (`u32::MAX` for no match), phase by phase: each phase's loads for
    /// all the keys go out before any of them is needed, so their cache
    /// misses overlap where one key's chain of loads would wait on each.
    #[inline(always)]
    pub(crate) fn lookup_lanes<'r, A: Address>(
        n: usize,
        rfc: impl Fn(usize) -> &'r Rfc,
        key: impl Fn(usize) -> ([A; 2], [u32; 3]),
        out: &mut [u32],
    ) {
        let n = n.min(out.len()).min(BATCH);
        if n == 0 {
            return;
        }
        let levels = A::levels(&rfc(0).src);
        // The address tries level by level, the ports beside them.
        let mut f = [[0usize; 3]; BATCH];
        let mut e = [[0u32; 2]; BATCH];
        let mut bits = [[0u128; 2]; BATCH];
        for (i, ((f, e), b)) in f[..n].iter_mut().zip(&mut e).zip(&mut bits).enumerate() {
            let t = rfc(i);
            let [pr, sp, _] = &t.chunks;
            let ([s, d], [sport, _, proto]) = key(i);
            *b = [s.bits(&t.src), d.bits(&t.dst)];
            *e = [t.src.root, t.dst.root];
            f[2] = t.proto_sport.get(pr.class(proto), sp.class(sport));
        }
        for level in 0..levels - 1 {
            for (i, (e, b)) in e[..n].iter_mut().zip(&bits).enumerate() {
                let t = rfc(i);
                *e = [
                    t.src.inner[Trie::at(e[0], A::byte(b[0], level))],
                    t.dst.inner[Trie::at(e[1], A::byte(b[1], level))],
                ];
            }
        }
        for (i, ((f, e), b)) in f[..n].iter_mut().zip(&e).zip(&bits).enumerate() {
            let (t, ([s, d], [_, dport, _])) = (rfc(i), key(i));
            let cs = t.src.leaves[Trie::at(e[0], A::byte(b[0], levels - 1))];
            let cd = t.dst.leaves[Trie::at(e[1], A::byte(b[1], levels - 1))];
            f[0] = usize::from(s.class(&t.src, cs));
            f[1] = usize::from(d.class(&t.dst, cd));
            f[2] = t.ports.get(f[2], t.chunks[2].class(dport));
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
            + 2 * (self.src.inner.len() + self.dst.inner.len())
    }
}

#[cfg(test)]
mod tests {
    use dpu_rand::Rng;

    use super::*;

    fn rule(rng: &mut Rng, pos: u32, bases: &[u32]) -> AclRule {
        let prefix = |rng: &mut Rng| {
            let a = *rng.pick(bases) ^ (rng.next_u32() & 0xff);
            if rng.below(4) == 0 {
                // Any range, across blocks of 256 and 65,536 addresses.
                let span = 1 << (8 * rng.below(4));
                let end = a.saturating_add(rng.below(span) as u32);
                return (u128::from(a), u128::from(end));
            }
            let len = *rng.pick(&[0, 8, 12, 16, 20, 24, 28, 32]);
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
        let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
        for case in 0..40 {
            let bases: Vec<u32> = (0..4).map(|_| rng.next_u32()).collect();
            let n = 1 + rng.below(if case % 4 == 0 { 400 } else { 40 }) as u32;
            let rules: Vec<AclRule> = (0..n).map(|i| rule(&mut rng, i, &bases)).collect();
            let rfc =
                Rfc::build_within(&rules, Family::V4, 1 << 26, usize::MAX).expect("rules build");
            for _ in 0..2000 {
                // Keys near the rules' addresses and ports, so they match.
                let b = |rng: &mut Rng| *rng.pick(&bases) ^ (rng.next_u32() & 0x1ff);
                let k = FlowKey {
                    src: u128::from(b(&mut rng)),
                    dst: u128::from(b(&mut rng)),
                    src_port: rng.below(100) as u16,
                    dst_port: rng.below(100) as u16,
                    proto: *rng.pick(&[6, 17, 1]),
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

    /// IPv6 tables, sixteen trie levels: prefixes of every length up to
    /// /128 and ranges that are no prefix, around a few bases, checked
    /// against a scan on keys near them and at the top of the space.
    #[test]
    fn ipv6_agrees_with_a_scan_of_the_rules() {
        let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
        let wide = |rng: &mut Rng| rng.next_u128();
        let mut skipped = 0;
        for case in 0..24 {
            // Half the sets lie within one /48, whose bytes the tries skip.
            let within = case % 2 == 1;
            let top = wide(&mut rng) & !(u128::MAX >> 48);
            let mut bases: Vec<u128> = (0..4)
                .map(|_| match within {
                    true => top | wide(&mut rng) >> 48,
                    false => wide(&mut rng),
                })
                .collect();
            if !within {
                bases.push(u128::MAX);
            }
            let near = |rng: &mut Rng, bases: &[u128]| {
                let b = *rng.pick(bases);
                // Differ from a base only below some byte, so keys and
                // rules share the trie's upper levels.
                let low = 8 * rng.below(if within { 11 } else { 17 }) as u32;
                let mask = if low == 128 {
                    u128::MAX
                } else {
                    (1u128 << low) - 1
                };
                b ^ (wide(rng) & mask)
            };
            let n = 1 + rng.below(if case % 4 == 0 { 300 } else { 40 }) as u32;
            let rules: Vec<AclRule> = (0..n)
                .map(|i| {
                    let addr = |rng: &mut Rng| {
                        let a = near(rng, &bases);
                        // Everything below or above an address: the
                        // addresses outside a skipped prefix differ.
                        match rng.below(16) {
                            0 => return (0, a),
                            1 => return (a, u128::MAX),
                            _ => {}
                        }
                        if rng.below(4) == 0 {
                            let shift = 8 * rng.below(16) + 80 * u64::from(within);
                            let b = a.saturating_add(wide(rng) >> shift.min(127));
                            return (a, b);
                        }
                        let len = match within {
                            true => [0, 48 + rng.below(81) as u8][rng.below(2) as usize],
                            false => rng.below(129) as u8,
                        };
                        AclRule::prefix_range(a, len, 128)
                    };
                    AclRule {
                        src: addr(&mut rng),
                        dst: addr(&mut rng),
                        dst_port: match rng.below(2) {
                            0 => (0, u16::MAX),
                            _ => (80, 80),
                        },
                        ..AclRule::any(i, i, Family::V6)
                    }
                })
                .collect();
            let rfc =
                Rfc::build_within(&rules, Family::V6, 1 << 26, usize::MAX).expect("rules build");
            skipped += usize::from(rfc.src.skip > 0);
            // Keys near the rules, and some anywhere (outside a skipped
            // prefix, below and above it).
            let anywhere = |rng: &mut Rng| match rng.below(8) {
                0 => wide(rng),
                _ => near(rng, &bases),
            };
            for _ in 0..2000 {
                let k = FlowKey {
                    src: anywhere(&mut rng),
                    dst: anywhere(&mut rng),
                    src_port: rng.below(100) as u16,
                    dst_port: *rng.pick(&[80, 81]),
                    proto: 6,
                    v6: true,
                };
                let want = rules.iter().position(|r| r.matches(&k));
                let got = rfc.lookup6(&k);
                assert_eq!(
                    (got != u32::MAX).then_some(got as usize),
                    want,
                    "case {case}, key {k:?}"
                );
                let mut out = [0u32; 1];
                let key = |_| {
                    (
                        [k.src, k.dst],
                        [u32::from(k.src_port), k.dst_port.into(), 6],
                    )
                };
                Rfc::lookup_lanes(1, |_| &rfc, key, &mut out);
                assert_eq!(out[0], got);
            }
        }
        assert!(skipped >= 6, "{skipped} sets skipped top bytes");
        // An IPv4 set is refused tables of the other family's width.
        let v4 = AclRule::any(0, 0, Family::V4);
        assert!(Rfc::build(&[v4], Family::V6).is_some());
        let v6 = AclRule::any(0, 0, Family::V6);
        assert!(Rfc::build(&[v6], Family::V4).is_none());
    }

    /// An IPv6 set whose classes start in one byte only (a single /32,
    /// say) has tries of one level: the root points at the leaves. Keys
    /// at and past both ends of the prefix, and at the ends of the space.
    #[test]
    fn ipv6_tries_of_one_level() {
        let net = 0x2001_0db8u128 << 96;
        for len in [8, 16, 32, 120, 128] {
            let (lo, hi) = AclRule::prefix_range(net, len, 128);
            let rule = AclRule {
                dst: (lo, hi),
                ..AclRule::any(0, 0, Family::V6)
            };
            let rfc = Rfc::build(&[rule], Family::V6).expect("builds");
            // A host or a /120 is found on bytes the block's start and
            // the address before it do not share: many levels.
            assert_eq!(rfc.dst.levels == 1, len <= 32, "/{len}");
            for (dst, want) in [
                (lo, 0),
                (hi, 0),
                (lo - 1, u32::MAX),
                (hi + 1, u32::MAX),
                (0, u32::MAX),
                (u128::MAX, u32::MAX),
            ] {
                let k = FlowKey {
                    src: 7,
                    dst,
                    v6: true,
                    ..FlowKey::default()
                };
                assert_eq!(rfc.lookup6(&k), want, "/{len}, {dst:#x}");
                let mut out = [0u32; 3];
                let key = |_| ([k.src, k.dst], [0, 0, 0]);
                Rfc::lookup_lanes(3, |_| &rfc, key, &mut out);
                assert_eq!(out, [want; 3], "/{len}, {dst:#x}");
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
        let rfc = Rfc::build(&rules, Family::V4).expect("builds");
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
        let rfc = Rfc::build(&odd, Family::V4).expect("builds");
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

    /// Nested ranges, the narrowest first: each class of addresses holds
    /// a different run of rules, thousands long. Within the effort bound
    /// a small set builds and answers as a scan does; a set whose lists
    /// would pass it is declined, in bounded time and memory.
    #[test]
    fn nested_ranges_build_within_the_effort_or_are_declined() {
        let top = u128::from(u32::MAX);
        let nested = |n: u32| -> Vec<AclRule> {
            (0..n)
                .map(|i| AclRule {
                    src: (7 * u128::from(n - i), top - 7 * u128::from(n - i)),
                    proto: (6, 6),
                    ..AclRule::any(i, i, Family::V4)
                })
                .collect()
        };
        let rules = nested(1500);
        assert!(Rfc::build_within(&rules, Family::V4, 1 << 26, 1 << 20).is_none());
        let rfc = Rfc::build_within(&rules, Family::V4, 1 << 26, usize::MAX).expect("tables");
        for x in (0..12_000u128)
            .step_by(3)
            .chain((top - 12_000..=top).step_by(3))
        {
            let key = FlowKey {
                src: x,
                dst: 1,
                src_port: 1,
                dst_port: 2,
                proto: 6,
                v6: false,
            };
            let want = rules.iter().position(|r| r.matches(&key));
            assert_eq!(
                rfc.lookup(&dims(&key)),
                want.map_or(u32::MAX, |p| p as u32),
                "{x}"
            );
        }
        // 20,000 rules: 2 GB of lists unbounded.
        assert!(Rfc::build(&nested(20_000), Family::V4).is_none());
    }

    #[test]
    fn declines_what_it_cannot_cut_or_afford() {
        let any = AclRule::any(0, 0, Family::V4);
        assert!(Rfc::build(&[], Family::V4).is_none());
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
        assert!(Rfc::build(&rules, Family::V4).is_none());
    }
}
