//! What the first stage of a burst ([`inspect`](super::inspect)) made of
//! a frame, carried to the stages after it.

use crate::l2memo::Decision;
use crate::wire::L3;
use crate::worker::Verdict;

/// A frame between the stages of a burst.
pub(super) struct Inspected {
    pub(super) seen: Seen,
    /// A remote VTEP (IPv4 address, MAC address) the frame revealed.
    pub(super) neighbour: Option<(u32, [u8; 6])>,
}

/// What the first stage of a burst made of a frame.
pub(super) enum Seen {
    /// Decided already: consumed by the port's VTEP, or dropped before it
    /// reached a tenant.
    Done(Verdict),
    /// Decided from memory by its link-layer header ([`L2Memo`]): forward
    /// as `decision` says while the MAC table is still at `version`
    /// (see [`SwitchPipeline::settle`]); `len` bytes.
    ///
    /// [`L2Memo`]: crate::l2memo::L2Memo
    Recalled {
        decision: Decision,
        version: u64,
        len: u32,
    },
    /// To switch in tenant `ti` from its attachment `ai` (the fields are
    /// small so that a burst's frames move without a `memcpy` call).
    Switch {
        ti: u32,
        ai: u32,
        /// Outer header bytes of a VXLAN frame, stripped on the way out.
        decap: u16,
        /// The remote VTEP a VXLAN frame came from; 0 for other frames.
        remote: u32,
        /// Length of the (inner) frame.
        len: u32,
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        l3: L3,
    },
}
