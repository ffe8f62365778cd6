//! A worker's memory of how it last switched each link-layer header.
//!
//! A tenant that does not look past the link layer (no rules, default
//! allow, no address guard: its IP frames are switched unparsed) decides
//! a frame from its input port, its first 18 bytes (addresses, 802.1Q
//! tag, EtherType) and the worker's MAC table. The same header on the
//! same port, while the MAC table is unchanged and within the same
//! second, is decided the same way: the worker remembers the last such
//! decision per slot, and a frame with a remembered header costs one
//! comparison instead of its parse, its tenant lookup and its MAC table
//! lookup and learning. The caller remembers only decisions that did not
//! change the table (so that repeating them would not either).

use crate::worker::VlanOp;

/// Slots, direct-mapped: a handful of headers per attachment are what
/// a port's traffic mostly carries (a VM and the peers it talks to).
const SLOTS: usize = 64;

/// A frame's link-layer header and input port, as compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// Bytes 0-15: destination and source MAC, then the EtherType or the
    /// 802.1Q tag (TPID and TCI); for an untagged frame, bytes 0-13 and
    /// zeros.
    head: u128,
    /// The inner EtherType of a tagged frame (0 for an untagged one), and
    /// the input port above it.
    tail: u64,
}

impl Header {
    /// The header of `frame` received on `port`; `None` for a frame too
    /// short to hold a tagged header (it takes the full path).
    #[inline(always)]
    pub(crate) fn of(port: usize, frame: &[u8]) -> Option<Header> {
        let b: &[u8; 18] = frame.get(..18)?.try_into().ok()?;
        let mut head = [0u8; 16];
        head.copy_from_slice(&b[..16]);
        let head = u128::from_le_bytes(head);
        let port = (port as u64) << 16;
        Some(if b[12..14] == [0x81, 0x00] {
            Header {
                head,
                tail: u64::from(u16::from_le_bytes([b[16], b[17]])) | port,
            }
        } else {
            Header {
                head: head & ((1u128 << 112) - 1),
                tail: port,
            }
        })
    }

    fn slot(&self) -> usize {
        let x = (self.head as u64) ^ ((self.head >> 64) as u64) ^ self.tail;
        (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % SLOTS
    }
}

/// A remembered decision: forward the frame of `tenant` out of `port`
/// with tag operation `vlan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decision {
    pub(crate) tenant: u32,
    pub(crate) port: u32,
    pub(crate) vlan: VlanOp,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    header: Header,
    /// The MAC table's version it was decided at (0: empty).
    version: u64,
    /// The second it was decided in.
    now: u64,
    decision: Decision,
}

const EMPTY: Slot = Slot {
    header: Header { head: 0, tail: 0 },
    version: 0,
    now: 0,
    decision: Decision {
        tenant: 0,
        port: 0,
        vlan: VlanOp::Keep,
    },
};

/// The memory of one worker.
#[derive(Debug)]
pub(crate) struct L2Memo {
    slots: Box<[Slot; SLOTS]>,
    /// Decisions recalled, for tests to see that they were.
    #[cfg(test)]
    pub(crate) hits: std::cell::Cell<u64>,
}

impl L2Memo {
    /// An empty memory.
    pub(crate) fn new() -> L2Memo {
        L2Memo {
            slots: Box::new([EMPTY; SLOTS]),
            #[cfg(test)]
            hits: std::cell::Cell::new(0),
        }
    }

    /// The decision remembered for `header` with the MAC table at
    /// `version` (never 0) in second `now`.
    #[inline(always)]
    pub(crate) fn recall(&self, header: &Header, version: u64, now: u64) -> Option<Decision> {
        let s = &self.slots[header.slot()];
        let hit = s.version == version && s.now == now && s.header == *header;
        #[cfg(test)]
        self.hits.set(self.hits.get() + u64::from(hit));
        hit.then_some(s.decision)
    }

    /// Remembers `decision` for `header`, made with the MAC table at
    /// `version` in second `now` and leaving it there.
    pub(crate) fn remember(&mut self, header: Header, version: u64, now: u64, decision: Decision) {
        self.slots[header.slot()] = Slot {
            header,
            version,
            now,
            decision,
        };
    }

    /// Forgets every decision.
    pub(crate) fn clear(&mut self) {
        self.slots.fill(EMPTY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(dst: u8, src: u8, vlan: Option<u16>, ethertype: u16, tail: u8) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, dst, 2, 0, 0, 0, 0, src];
        if let Some(v) = vlan {
            f.extend([0x81, 0x00]);
            f.extend(v.to_be_bytes());
        }
        f.extend(ethertype.to_be_bytes());
        f.extend([0x45, tail, 0, 60, 1, 2, 3, 4]);
        f
    }

    const D: Decision = Decision {
        tenant: 3,
        port: 1,
        vlan: VlanOp::Keep,
    };

    /// The header is what the link layer says and nothing more: the
    /// bytes past it do not matter, each address, the tag, the
    /// EtherType and the port do.
    #[test]
    fn the_header_is_the_link_layer_and_the_port() {
        for vlan in [None, Some(101)] {
            let h = |f: &[u8], port| Header::of(port, f).unwrap();
            let base = h(&frame(1, 2, vlan, 0x0800, 0), 0);
            assert_eq!(base, h(&frame(1, 2, vlan, 0x0800, 9), 0));
            assert_ne!(base, h(&frame(3, 2, vlan, 0x0800, 0), 0));
            assert_ne!(base, h(&frame(1, 3, vlan, 0x0800, 0), 0));
            assert_ne!(base, h(&frame(1, 2, vlan, 0x86dd, 0), 0));
            assert_ne!(base, h(&frame(1, 2, vlan, 0x0800, 0), 1));
        }
        assert_ne!(
            Header::of(0, &frame(1, 2, Some(101), 0x0800, 0)),
            Header::of(0, &frame(1, 2, Some(102), 0x0800, 0))
        );
        assert_ne!(
            Header::of(0, &frame(1, 2, None, 0x0800, 0)),
            Header::of(0, &frame(1, 2, Some(0x800), 0x0800, 0))
        );
        assert_eq!(Header::of(0, &frame(1, 2, None, 0x0800, 0)[..17]), None);
    }

    /// A decision is recalled for its header only, and only at the
    /// version and second it was made in; a colliding header replaces it.
    #[test]
    fn a_decision_holds_for_its_header_version_and_second() {
        let mut m = L2Memo::new();
        let h = Header::of(0, &frame(1, 2, Some(101), 0x0800, 0)).unwrap();
        let other = Header::of(0, &frame(1, 2, Some(102), 0x0800, 0)).unwrap();
        assert_eq!(m.recall(&h, 1, 0), None, "nothing remembered");
        m.remember(h, 5, 7, D);
        assert_eq!(m.recall(&h, 5, 7), Some(D));
        assert_eq!(m.recall(&h, 6, 7), None, "the table changed");
        assert_eq!(m.recall(&h, 5, 8), None, "a second passed");
        if h.slot() != other.slot() {
            assert_eq!(m.recall(&other, 5, 7), None);
        }
        let colliding = (0..=255u8)
            .flat_map(|a| (0..=255u8).map(move |b| (a, b)))
            .map(|(a, b)| Header::of(0, &frame(a, b, Some(101), 0x0800, 0)).unwrap())
            .find(|c| c.slot() == h.slot() && *c != h)
            .expect("a header in the same slot");
        assert_eq!(m.recall(&colliding, 5, 7), None);
        m.remember(colliding, 5, 7, Decision { port: 2, ..D });
        assert_eq!(m.recall(&h, 5, 7), None, "replaced");
        m.clear();
        assert_eq!(m.recall(&colliding, 5, 7), None, "cleared");
    }
}
