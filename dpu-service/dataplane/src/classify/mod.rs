//! Packet classification: first matching rule of an ordered list, found
//! with decision trees instead of a scan.
//!
//! Rules are grouped by shape first (EffiCuts-style): per dimension a rule
//! is "large" if it covers a big share of the field (for addresses, of
//! the part below the prefix all the set's addresses share); each large
//! shape group gets a tree of its own, up to eight per address family,
//! and the rest share one. A key walks its trees side by side. Within a
//! group, wide rules rarely have to be copied into many narrow slices,
//! which is what makes a single cut tree blow up. Groups whose rules
//! cut apart cleanly are then joined: two trees become one when the
//! tree of both has no more leaf entries than the two apart and is no
//! deeper, since every key walks every tree.
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
//! overlap. IPv6 keys, when their set has no RFC tables, walk the same
//! kind of flat nodes (`Flat6`) over their fields as 32-bit words, each
//! key's trees side by side, and test the leaves' rules with 128-bit
//! bounds.
//!
//! Rule sets whose tables fit a memory budget are also compiled to
//! Recursive Flow Classification tables (`rfc`), per family: a fixed
//! sequence of table reads, no compare, no walk (IPv6 addresses walk
//! only the bytes where the rules' addresses differ). Lookups read
//! those first; the trees answer when a set has no tables (rules whose
//! tables would not fit the budget), and for the keys whose answer was
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
//!
//! The code is in files by concern, each using only those listed before
//! it: `rule` (the rules, their fields, the reference match), `leafidx`
//! (indexes of leaves of a thousand rules or more, which nested or
//! staggered ranges leave, so lookups there search rather than scan), `tree`
//! (building the decision trees), `rfc` (Recursive Flow Classification
//! tables), `flat4` (the trees' compact IPv4 form and its walks, with
//! the tables in front), `flat6` (their IPv6 form), `set` (the
//! [`Classifier`]: per family a rule set with its trees and tables,
//! changes, and single, batched and multi-classifier lookups). `tests`
//! holds test support that other modules' tests share.

mod flat4;
mod flat6;
mod leafidx;
mod rfc;
mod rule;
mod set;
#[cfg(test)]
pub(crate) mod tests;
mod tree;

pub use flat4::{BATCH, MULTI};
pub use rule::{AclRule, Family};
pub use set::{ChangeError, Classifier, OVERLAY_MAX};
