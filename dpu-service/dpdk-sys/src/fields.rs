//! Fields whose place in the bindings depends on the DPDK release.
//!
//! DPDK 24.07 moved fields of `struct rte_mbuf` (in place of its zero-length
//! `RTE_MARKER`s) and of `struct rte_eth_link` (beside a `uint64_t` for
//! atomic reads) into anonymous unions. C code reads them as before; bindgen
//! nests them under `__bindgen_anon_N` members. These accessors read them on
//! every release: `build.rs` sets `dpdk_anon_unions` from the version
//! pkg-config reports. Each is a plain load, as a direct field read is: no
//! call into the C shim on the data path.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs, clippy::all)]

use crate::{rte_eth_link, rte_mbuf};

/// `(*$p).$old` before DPDK 24.07, `(*$p).$new...` from 24.07 on.
#[cfg(not(dpdk_anon_unions))]
macro_rules! field {
    ($p:expr, $old:ident, $($new:ident).+) => {
        (*$p).$old
    };
}
#[cfg(dpdk_anon_unions)]
macro_rules! field {
    ($p:expr, $old:ident, $($new:ident).+) => {
        (*$p).$($new).+
    };
}

macro_rules! mbuf_field {
    ($(#[$doc:meta])* $name:ident -> $ty:ty = $old:ident, $($new:ident).+) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `m` must point to a valid, initialised `struct rte_mbuf`.
        #[inline(always)]
        pub unsafe fn $name(m: *const rte_mbuf) -> $ty {
            // SAFETY: the caller passes a valid mbuf. From 24.07 on the field
            // lies in an anonymous union whose members all overlay plain
            // integers, so reading this member is valid for any contents.
            unsafe { field!(m, $old, $($new).+) }
        }
    };
}

mbuf_field!(
    /// `m->data_off`: where the first segment's data starts in its buffer.
    mbuf_data_off -> u16 = data_off, __bindgen_anon_1.__bindgen_anon_1.data_off
);
mbuf_field!(
    /// `m->data_len`: bytes of data in the first segment.
    mbuf_data_len -> u16 = data_len, __bindgen_anon_2.__bindgen_anon_1.data_len
);
mbuf_field!(
    /// `m->pkt_len`: bytes of data in all segments.
    mbuf_pkt_len -> u32 = pkt_len, __bindgen_anon_2.__bindgen_anon_1.pkt_len
);
mbuf_field!(
    /// `m->nb_segs`: number of segments.
    mbuf_nb_segs -> u16 = nb_segs, __bindgen_anon_1.__bindgen_anon_1.nb_segs
);
mbuf_field!(
    /// `m->port`: the input port.
    mbuf_port -> u16 = port, __bindgen_anon_1.__bindgen_anon_1.port
);

/// The struct that holds `rte_eth_link`'s fields: the link itself before
/// 24.07, the struct in its anonymous union from 24.07 on.
#[cfg(not(dpdk_anon_unions))]
#[inline]
fn link_fields(l: &rte_eth_link) -> &rte_eth_link {
    l
}
#[cfg(dpdk_anon_unions)]
#[inline]
fn link_fields(l: &rte_eth_link) -> &crate::rte_eth_link__bindgen_ty_1__bindgen_ty_1 {
    // SAFETY: l is a valid reference; the union's members are a uint64_t
    // and this struct of integers, which is valid for any contents.
    unsafe { &l.__bindgen_anon_1.__bindgen_anon_1 }
}

/// `l->link_speed` in Mb/s (`RTE_ETH_SPEED_NUM_*`).
#[inline]
pub fn eth_link_speed(l: &rte_eth_link) -> u32 {
    link_fields(l).link_speed
}

/// `l->link_status == RTE_ETH_LINK_UP`.
#[inline]
pub fn eth_link_up(l: &rte_eth_link) -> bool {
    u32::from(link_fields(l).link_status()) == crate::RTE_ETH_LINK_UP
}

/// `l->link_duplex == RTE_ETH_LINK_FULL_DUPLEX`.
#[inline]
pub fn eth_link_full_duplex(l: &rte_eth_link) -> bool {
    u32::from(link_fields(l).link_duplex()) == crate::RTE_ETH_LINK_FULL_DUPLEX
}
