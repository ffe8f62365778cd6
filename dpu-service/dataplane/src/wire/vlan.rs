//! 802.1Q tags written on the way out: the outer tag of a frame pushed,
//! stripped or given another VLAN ID, in place in the driver's buffer.
//! The reading side is [`parse_l2`](super::parse_l2).

use crate::io::Packet;
use crate::worker::VlanOp;

/// Applies `op` to the frame in `pkt`; false if it cannot (no tag to
/// strip or set, no room to push), in which case the frame may only be
/// dropped.
pub(crate) fn apply_vlan<P: Packet>(pkt: &mut P, op: VlanOp) -> bool {
    const TPID: [u8; 2] = [0x81, 0x00];
    let tagged = |d: &[u8]| d.len() >= 18 && d[12..14] == TPID;
    match op {
        VlanOp::Keep => true,
        VlanOp::Set(vid) => {
            let d = pkt.data_mut();
            if !tagged(d) {
                return false;
            }
            let tci = (u16::from_be_bytes([d[14], d[15]]) & 0xf000) | (vid & 0x0fff);
            d[14..16].copy_from_slice(&tci.to_be_bytes());
            true
        }
        VlanOp::Strip => {
            let d = pkt.data_mut();
            if !tagged(d) {
                return false;
            }
            d.copy_within(0..12, 4);
            pkt.trim_front(4)
        }
        VlanOp::Push(vid) => {
            if pkt.len() < 14 || !pkt.prepend(4) {
                return false;
            }
            let d = pkt.data_mut();
            d.copy_within(4..16, 0);
            d[12..14].copy_from_slice(&TPID);
            d[14..16].copy_from_slice(&(vid & 0x0fff).to_be_bytes());
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_operations_refuse_frames_they_do_not_fit() {
        use crate::io::memory::MemPacket;
        let mut short = MemPacket(vec![0; 10]);
        assert!(!apply_vlan(&mut short, VlanOp::Push(1)));
        let mut untagged = MemPacket(vec![0; 60]);
        assert!(!apply_vlan(&mut untagged, VlanOp::Strip));
        assert!(!apply_vlan(&mut untagged, VlanOp::Set(3)));
        assert!(apply_vlan(&mut untagged, VlanOp::Push(4095)));
        assert_eq!(&untagged.0[12..16], &[0x81, 0x00, 0x0f, 0xff]);
        assert!(apply_vlan(&mut untagged, VlanOp::Set(5)));
        assert_eq!(&untagged.0[12..16], &[0x81, 0x00, 0x00, 0x05]);
        assert!(apply_vlan(&mut untagged, VlanOp::Strip));
        assert_eq!(untagged.0, vec![0; 60]);
    }
}
